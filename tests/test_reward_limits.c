/* tests/test_reward_limits.c — the reward server's memory and connection bounds (reward/server_guard.h,
 * reward/PROTOCOL.md section 3) against raw ZMTP 3.0 peers: plain Unix sockets that do the NULL greeting and READY
 * by hand and then send what libzmq alone would buffer without limit.
 *
 *   1. Eight connections at once against --max-peers 4 (one already held by a DEALER): at most three are admitted,
 *      the others get a ZMTP ERROR at the handshake. The admitted ones declare a 1 GiB frame (over the default
 *      16 MiB frame limit) and try to send 64 MiB of it: each is dropped after at most a socket buffer.
 *   2. Three admitted connections each send 1 MiB frames with the MORE flag, never ending the message (libzmq keeps
 *      every frame until the last, with no limit): past the --max-memory-mb 96 budget the server drops them all.
 *   3. The server still scores a good request, and its stats line counts the refusals and drops.
 * The bound checked: the server's peak resident memory (VmHWM) stays under its size at start + 96 MiB + 48 MiB
 * (what arrives between two 10 ms checks, and libzmq's buffers). Before the bounds the first phase alone took
 * 8 x 64 MiB and the second 3 x 128 MiB (reward/examples/flood_memory.py measures the full-size experiment). */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tests/test.h"
#include "tests/zmq_test_util.h"

/* kB of a /proc/PID/status field (VmHWM, VmRSS), or -1. */
static long proc_kb(pid_t pid, const char *field) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    if (test_slurp(path, buf, sizeof buf) < 0) return -1;
    const char *p = strstr(buf, field);
    return p ? strtol(p + strlen(field) + 1, NULL, 10) : -1;
}

/* A connected Unix socket that has sent the ZMTP 3.0 NULL greeting and READY (as a DEALER); -1 on failure. */
static int raw_open(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    uint8_t g[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
    static const uint8_t ready[] = {0x04, 28, 5, 'R', 'E', 'A', 'D', 'Y', 11, 'S', 'o', 'c', 'k', 'e', 't', '-',
                                    'T', 'y', 'p', 'e', 0, 0, 0, 6, 'D', 'E', 'A', 'L', 'E', 'R'};
    if (send(fd, g, sizeof g, MSG_NOSIGNAL) != (ssize_t)sizeof g ||
        send(fd, ready, sizeof ready, MSG_NOSIGNAL) != (ssize_t)sizeof ready) {
        close(fd);
        return -1;
    }
    return fd;
}

static int recv_all(int fd, uint8_t *b, size_t n) {
    for (size_t k = 0; k < n;) {
        ssize_t r = recv(fd, b + k, n - k, 0);
        if (r <= 0) return -1;
        k += (size_t)r;
    }
    return 0;
}

/* Reads the server's greeting and first command: 1 READY (admitted), 0 ERROR or closed (refused). */
static int raw_admitted(int fd) {
    uint8_t b[300];
    if (recv_all(fd, b, 64) || recv_all(fd, b, 2)) return 0;
    if (b[0] != 0x04 || recv_all(fd, b + 2, b[1])) return 0;
    return b[2] == 5 && !memcmp(b + 3, "READY", 5);
}

/* Sends up to `total` bytes of frame body (after hdr) until the server stops taking them; returns bytes taken. */
static size_t raw_pour(int fd, const uint8_t *hdr, size_t hlen, size_t total, size_t chunk) {
    static uint8_t body[1 << 20];
    if (hlen && send(fd, hdr, hlen, MSG_NOSIGNAL) != (ssize_t)hlen) return 0;
    size_t taken = 0;
    while (taken < total) {
        ssize_t r = send(fd, body, chunk < sizeof body ? chunk : sizeof body, MSG_NOSIGNAL);
        if (r <= 0) break;
        taken += (size_t)r;
    }
    return taken;
}

static const char *REQ = "{\"v\":1,\"type\":\"score_request\",\"id\":\"after\",\"fps\":16,\"items\":[{\"prompt\":\"a\"}],"
                         "\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[1,1,2,2,3]}]}";

TEST(reward_server_memory_bound) {
    srv s;
    const char *dir = test_tmpdir();
    char path[200];
    snprintf(path, sizeof path, "%s/lim.sock", dir);
    snprintf(s.endpoint, sizeof s.endpoint, "ipc://%s", path);
    snprintf(s.log, sizeof s.log, "%s/server.log", dir);
    const char *argv[] = {test_vgrpo_bin(), "reward-server", "--bind", s.endpoint, "--scorers", "brightness",
                          "--max-peers", "4", "--max-memory-mb", "96", NULL};
    srv_spawn(&s, argv);
    send_frames(s.sock, "{\"v\":1,\"type\":\"hello\",\"id\":\"h\",\"client\":\"c\"}", NULL, 0, 0);
    char *r = recv_reply(s.sock);
    REQUIRE(r);
    free(r);
    long start_kb = proc_kb(s.pid, "VmRSS");
    REQUIRE(start_kb > 0);

    /* 1. Eight at once; one slot is the DEALER's. */
    int fd[8], admitted = 0, refused = 0;
    for (int i = 0; i < 8; i++) fd[i] = raw_open(path);
    for (int i = 0; i < 8; i++) {
        int ok = fd[i] >= 0 && raw_admitted(fd[i]);
        admitted += ok, refused += !ok;
        if (!ok && fd[i] >= 0) close(fd[i]), fd[i] = -1;
    }
    CHECK_MSG(admitted <= 3 && refused >= 5, "%d of 8 raw connections admitted with --max-peers 4 (one held)", admitted);
    const uint8_t huge[9] = {0x02, 0, 0, 0, 0x40, 0, 0, 0, 0}; /* a long frame of 1 GiB */
    for (int i = 0; i < 8; i++) {
        if (fd[i] < 0) continue;
        size_t t = raw_pour(fd[i], huge, sizeof huge, (size_t)64 << 20, 1 << 20);
        CHECK_MSG(t < ((size_t)4 << 20), "a connection declaring a 1 GiB frame got %zu MiB in", t >> 20);
        close(fd[i]);
    }
    long hwm1 = proc_kb(s.pid, "VmHWM");
    CHECK_MSG(hwm1 - start_kb < 48 * 1024, "declared 1 GiB frames: peak %ld MiB over the start %ld MiB", (hwm1 - start_kb) >> 10,
              start_kb >> 10);

    /* 2. Messages that never end: 1 MiB frames with MORE, three connections in turn, up to 128 MiB each. */
    usleep(200 * 1000); /* the server sees the phase-1 connections close */
    int n = 0;
    for (int i = 0; i < 3; i++) {
        int f = raw_open(path);
        if (f >= 0 && raw_admitted(f)) fd[n++] = f;
        else if (f >= 0) close(f);
    }
    CHECK_MSG(n == 3, "%d of 3 raw connections admitted", n);
    uint8_t part[9] = {0x03, 0, 0, 0, 0, 0, 0x10, 0, 0}; /* long frame, MORE, 1 MiB */
    size_t sent[8] = {0};
    int alive = n;
    while (alive > 0) {
        alive = 0;
        for (int i = 0; i < n; i++) {
            if (fd[i] < 0) continue;
            size_t t = raw_pour(fd[i], part, sizeof part, (size_t)1 << 20, 1 << 20);
            sent[i] += t;
            if (t < ((size_t)1 << 20) || sent[i] >= ((size_t)128 << 20)) close(fd[i]), fd[i] = -1;
            else alive++;
        }
    }
    for (int i = 0; i < n; i++) CHECK_MSG(sent[i] < ((size_t)128 << 20), "connection %d sent all %zu MiB", i, sent[i] >> 20);
    long hwm2 = proc_kb(s.pid, "VmHWM");
    CHECK_MSG(hwm2 - start_kb < (96 + 48) * 1024, "endless messages: peak %ld MiB over the start %ld MiB (budget 96)",
              (hwm2 - start_kb) >> 10, start_kb >> 10);
    printf("  peak resident memory over the start: %ld MiB after 1 GiB frames, %ld MiB after endless messages "
           "(start %ld MiB)\n", (hwm1 - start_kb) >> 10, (hwm2 - start_kb) >> 10, start_kb >> 10);

    /* 3. Still serving (the DEALER was dropped too: it reconnects; retried with the same id). */
    static const uint8_t px[12] = {255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255};
    int tmo = 1000;
    zmq_setsockopt(s.sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    r = NULL;
    for (int attempt = 0; attempt < 10 && !r; attempt++) {
        send_frames(s.sock, REQ, px, sizeof px, 1);
        r = recv_reply(s.sock);
    }
    REQUIRE(r);
    json_t *h = parse_reply(r, CORE_WIRE_SCORE_REPLY, "after");
    json_decref(h);
    free(r);
    while ((r = recv_reply(s.sock)) != NULL) free(r);
    CHECK(srv_stop(&s) == 0);
    char out[8192];
    test_run(out, sizeof out, "cat %s", s.log);
    const char *st = strstr(out, "reward-server: stats:");
    long long refd = -1, drop = -1;
    if (st) {
        const char *a = strstr(st, "refused "), *b = strstr(st, "dropped ");
        if (a) refd = strtoll(a + 8, NULL, 10);
        if (b) drop = strtoll(b + 8, NULL, 10);
    }
    CHECK_MSG(refd >= 5 && drop >= 3, "stats: refused %lld, dropped %lld (log: %s)", refd, drop, out);
}
