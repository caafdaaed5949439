/* tests/test_png_limits.c — media_png_read's bound on what libpng allocates (media/png.h MEDIA_PNG_MAX_CHUNK_BYTES): a
 * 54-byte PNG whose tEXt chunk declares 2 GiB - 1 bytes is refused naming the chunk and the limit, in a child process
 * whose address space is limited to 1 GiB over what it holds (before the bound, libpng allocated the whole chunk:
 * 2.1 GB resident, then "truncated"). A small image with an ordinary tEXt chunk still reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "media/png.h"
#include "tests/test.h"

static void be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* PNG's CRC-32 (ISO 3309, reflected 0xEDB88320) over the chunk type and data, bit by bit. */
static uint32_t png_crc(const char *type, const unsigned char *d, uint32_t n) {
    uint32_t c = 0xffffffffu;
    for (uint32_t i = 0; i < 4 + n; i++) {
        c ^= i < 4 ? (unsigned char)type[i] : d[i - 4];
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xffffffffu;
}

/* Appends a chunk of `n` data bytes that declares `declared` bytes (CRC over what is written). Returns the new end. */
static size_t put_chunk(unsigned char *b, size_t at, const char *type, const unsigned char *d, uint32_t n,
                        uint32_t declared, int crc) {
    be32(b + at, declared);
    memcpy(b + at + 4, type, 4);
    if (n) memcpy(b + at + 8, d, n);
    at += 8 + n;
    if (crc) {
        be32(b + at, png_crc(type, d, n));
        at += 4;
    }
    return at;
}

/* The 54-byte file: signature, IHDR (32 x 32 RGB), then a tEXt chunk declaring 0x7fffffff bytes of which 13 follow. */
static void write_bomb(const char *path) {
    unsigned char b[64], ihdr[13] = {0};
    memcpy(b, "\x89PNG\r\n\x1a\n", 8);
    be32(ihdr, 32), be32(ihdr + 4, 32), ihdr[8] = 8, ihdr[9] = 2;
    size_t n = put_chunk(b, 8, "IHDR", ihdr, 13, 13, 1);
    n = put_chunk(b, n, "tEXt", (const unsigned char *)"k\0xxxxxxxxxxx", 13, 0x7fffffffu, 0);
    REQUIRE(n == 54);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(b, 1, n, f) == n);
    fclose(f);
}

/* Virtual memory of this process, bytes (/proc/self/statm's first field). */
static unsigned long long vm_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (f) {
        if (fscanf(f, "%llu", &pages) != 1) pages = 0;
        fclose(f);
    }
    return pages * (unsigned long long)sysconf(_SC_PAGESIZE);
}

TEST(png_huge_text_chunk_refused_within_bound) {
    char path[4200], msg[1024] = "";
    snprintf(path, sizeof path, "%s/bomb.png", test_tmpdir());
    write_bomb(path);
    int fd[2];
    REQUIRE(pipe(fd) == 0);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) { /* the child reads the file under a limit: 1 GiB more than it holds now */
        close(fd[0]);
        const unsigned long long lim = vm_bytes() + (1ull << 30);
        struct rlimit rl = {lim, lim};
        if (setrlimit(RLIMIT_AS, &rl)) _exit(3);
        core_tensor t;
        const int rc = media_png_read(path, &t);
        const char *e = rc ? core_last_error() : "read succeeded";
        if (write(fd[1], e, strlen(e)) < 0) _exit(4);
        _exit(rc ? 0 : 1);
    }
    close(fd[1]);
    ssize_t got, n = 0;
    while ((got = read(fd[0], msg + n, sizeof msg - 1 - (size_t)n)) > 0) n += got;
    msg[n] = 0;
    close(fd[0]);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d: %s", st, msg);
    CHECK_MSG(strstr(msg, "bomb.png") && strstr(msg, "tEXt chunk asks for 2147483648 bytes") &&
                  strstr(msg, "limit of 8388608 bytes"), "error: %s", msg);
}

/* An ordinary tEXt chunk before the image data is read past; the pixels come back. */
TEST(png_small_text_chunk_still_reads) {
    char path[4200];
    snprintf(path, sizeof path, "%s/ok.png", test_tmpdir());
    uint8_t rgb[2 * 3 * 3];
    for (int k = 0; k < (int)sizeof rgb; k++) rgb[k] = (uint8_t)(k * 13);
    REQUIRE_OK(media_png_write(path, rgb, 2, 3));
    /* insert a tEXt chunk after IHDR (8 + 25 bytes) */
    unsigned char in[4096], out[4200];
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    const size_t n = fread(in, 1, sizeof in, f);
    fclose(f);
    REQUIRE(n > 33 && n < sizeof in);
    memcpy(out, in, 33);
    const size_t m = put_chunk(out, 33, "tEXt", (const unsigned char *)"Comment\0hello", 13, 13, 1);
    memcpy(out + m, in + 33, n - 33);
    f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(fwrite(out, 1, m + n - 33, f) == m + n - 33);
    fclose(f);
    core_tensor t;
    REQUIRE_OK(media_png_read(path, &t));
    CHECK(t.shape[0] == 2 && t.shape[1] == 3 && !memcmp(t.data, rgb, sizeof rgb));
    core_tensor_free(&t);
}
