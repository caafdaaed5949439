/* tests/test_st_drop.c — st_drop_pages (core/safetensors.h): a converted tensor's file pages leave the resident set
 * (what model/clip/clip_load.c relies on to hold one copy of a checkpoint at a time), and its bytes read the same
 * after. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "tests/test.h"

/* RssFile of this process in KiB (/proc/self/status), or -1. */
static long rss_file_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "RssFile:", 8)) v = atol(line + 8);
    if (f) fclose(f);
    return v;
}

TEST(st_drop_pages_leaves_resident_set_keeps_bytes) {
    enum { N = 4 << 20 }; /* 16 MiB of F32 */
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    REQUIRE(x && y);
    for (int i = 0; i < N; i++) x[i] = (float)(i % 1000) * 0.5f - 7.0f;
    char path[4096];
    snprintf(path, sizeof path, "%s/drop.safetensors", test_tmpdir());
    st_writer *w = st_writer_new();
    const int64_t shape[1] = {N};
    REQUIRE(w);
    REQUIRE_OK(st_writer_add(w, "big", CORE_F32, 1, shape, x));
    REQUIRE_OK(st_writer_write(w, path));
    st_writer_free(w);
    st_file *f = st_open(path);
    REQUIRE(f);
    const long r0 = rss_file_kib();
    REQUIRE_OK(st_read_f32(f, "big", y, N)); /* faults the file's pages in */
    const long r1 = rss_file_kib();
    st_drop_pages(f, "big");
    const long r2 = rss_file_kib();
    printf("  RssFile: %ld KiB before the read, %ld after, %ld after st_drop_pages\n", r0, r1, r2);
    CHECK_MSG(r0 >= 0 && r1 - r0 > 12 * 1024 && r1 - r2 > 12 * 1024, "RssFile %ld, %ld, %ld KiB", r0, r1, r2);
    memset(y, 0, sizeof(float) * N);
    REQUIRE_OK(st_read_f32(f, "big", y, N)); /* the same bytes, faulted back in from the file */
    CHECK(memcmp(x, y, sizeof(float) * N) == 0);
    st_drop_pages(f, "no such tensor"); /* no effect */
    st_close(f);
    free(x), free(y);
}
