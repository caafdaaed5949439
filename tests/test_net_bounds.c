/* tests/test_net_bounds.c — what a network peer without the run's keys can make the run's servers hold, over TCP on
 * loopback (reward/PROTOCOL.md sections 3 and 8). Raw TCP clients speak just enough ZMTP 3.0 to reach the CURVE
 * handshake. Servers: the trainer's controller ROUTER (`vgrpo trainer`, rank 0 of a colocated or mpirun run, waiting
 * for its workers) and the reward server (`vgrpo reward-server`), both with keys; a rollout worker binds nothing
 * (it connects to the controller), so it is no server here (its socket is bounded too: rollout/worker.c).
 *   1. A frame of 8 GiB declared during the handshake, four connections at once, each trying to send 64 MiB of it:
 *      every connection is dropped after at most a socket buffer and the server's peak resident memory grows by
 *      less than 48 MiB (the controller's bound for the tiny recipe is 1 MiB: ctl_max_frame_bytes). Before
 *      ZMQ_MAXMSGSIZE on the controller it buffered all 4 x 64 MiB.
 *   2. Idle raw connections do not count against --max-peers: with --max-peers 2 and 4 of them open, 12 key holders
 *      in turn each get their request scored (before, the count of admitted peers stayed at 2 while the raw ones
 *      were open, and 10 of the 12 got no connection).
 *   3. Unauthenticated connections are bounded apart: of 40 raw connections opened at once (bound 2 x 2 + 8 = 12),
 *      at least 28 are dropped within half a second (before libzmq's 5 s handshake time-out), and a key holder is still served
 *      in the meantime; one left idle is closed after libzmq's handshake time-out (5 s).
 *   4. The bounds' arithmetic (core/wire_rollout.h) on Wan 2.1 T2V sizes. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/curve.h"
#include "core/error.h"
#include "core/recipe.h"
#include "core/wire_rollout.h"
#include "reward/client.h"
#include "tests/test.h"
#include "trainer/net/controller.h"

/* kB of a /proc/PID/status field (VmHWM, VmRSS), or -1. */
static long proc_kb(pid_t pid, const char *field) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    if (test_slurp(path, buf, sizeof buf) < 0) return -1;
    const char *p = strstr(buf, field);
    return p ? strtol(p + strlen(field) + 1, NULL, 10) : -1;
}

/* A loopback port nobody listens on now. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* A TCP connection to 127.0.0.1:port (time-outs of `ms` on send and receive), or -1. */
static int raw_connect(int port, int ms) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

/* Waits up to 10 s for a listener on port. */
static int wait_listening(int port) {
    for (int i = 0; i < 200; i++) {
        int fd = raw_connect(port, 100);
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        usleep(50 * 1000);
    }
    return -1;
}

/* The ZMTP 3.0 greeting of a CURVE client, then a command frame whose header declares 8 GiB (flags: long, command;
 * 8-byte big-endian size 2^33), then up to `total` bytes of its body; returns the bytes the server took. */
static size_t declare_8gib(int fd, size_t total) {
    uint8_t g[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0, 'C', 'U', 'R', 'V', 'E'};
    const uint8_t hdr[9] = {0x06, 0, 0, 0, 0x02, 0, 0, 0, 0};
    static uint8_t body[1 << 20];
    if (send(fd, g, sizeof g, MSG_NOSIGNAL) != (ssize_t)sizeof g || send(fd, hdr, sizeof hdr, MSG_NOSIGNAL) != (ssize_t)sizeof hdr)
        return 0;
    size_t taken = 0;
    while (taken < total) {
        ssize_t r = send(fd, body, sizeof body, MSG_NOSIGNAL);
        if (r <= 0) break;
        taken += (size_t)r;
    }
    return taken;
}

/* 1 when the server closed fd within `ms` (EOF or reset; whatever it sent before is read and skipped). */
static int closed_within(int fd, int ms) {
    uint8_t b[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        ssize_t r = recv(fd, b, sizeof b, 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 > ms) return 0;
    }
}

/* 1 when the server has closed fd by now (what it sent before is read and skipped). */
static int closed_now(int fd) {
    uint8_t b[256];
    for (;;) {
        ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (r > 0) continue;
        return r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
}

/* The attack of phase 1 against the server process pid on port: 4 connections at once. */
static void attack_8gib(pid_t pid, int port, const char *who) {
    const long start_kb = proc_kb(pid, "VmRSS");
    REQUIRE(start_kb > 0);
    int fd[4];
    for (int i = 0; i < 4; i++) REQUIRE((fd[i] = raw_connect(port, 2000)) >= 0);
    for (int i = 0; i < 4; i++) {
        const size_t t = declare_8gib(fd[i], (size_t)64 << 20);
        CHECK_MSG(t < ((size_t)8 << 20), "%s: a connection declaring an 8 GiB frame got %zu MiB in", who, t >> 20);
        CHECK_MSG(closed_within(fd[i], 2000), "%s: the connection declaring an 8 GiB frame was not dropped", who);
    }
    for (int i = 0; i < 4; i++) close(fd[i]);
    const long hwm = proc_kb(pid, "VmHWM");
    printf("  %s: peak resident memory %ld MiB over the start (%ld MiB) after 4 declared 8 GiB frames\n", who,
           (hwm - start_kb) >> 10, start_kb >> 10);
    CHECK_MSG(hwm - start_kb < 48 * 1024, "%s: peak %ld MiB over the start %ld MiB", who, (hwm - start_kb) >> 10,
              start_kb >> 10);
    CHECK_MSG(kill(pid, 0) == 0, "%s died", who);
}

static pid_t spawn(const char *log, char *const argv[]) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);
        f = f ? freopen("/dev/null", "w", stdout) : NULL;
        (void)f;
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static void stop(pid_t pid) {
    kill(pid, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        usleep(50 * 1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* The run's keys in dir/keys (mode 0600) and their client part. */
static void make_keys(const char *dir, char *path, size_t cap, core_curve_keys *client) {
    core_curve_keys all;
    REQUIRE_OK(core_curve_generate(&all));
    snprintf(path, cap, "%s/keys", dir);
    unlink(path);
    REQUIRE_OK(core_curve_write_file(path, &all));
    core_curve_subset(&all, CORE_CURVE_CLIENT, client);
}

static pid_t start_reward_server(const char *dir, int port, const char *keys, char *ep, size_t cap) {
    char log[700];
    snprintf(ep, cap, "tcp://127.0.0.1:%d", port);
    snprintf(log, sizeof log, "%s/reward.log", dir);
    char *argv[] = {(char *)test_vgrpo_bin(), "reward-server", "--bind", ep, "--scorers", "brightness", "--max-peers", "2",
                    "--keys-file", (char *)keys, NULL};
    pid_t pid = spawn(log, argv);
    REQUIRE(wait_listening(port) == 0);
    return pid;
}

/* One key holder: a fresh client scores one 2 x 2 white frame (brightness 1). 0 on success. */
static int key_holder_scores(const char *ep, const core_curve_keys *client, int k) {
    char id[32];
    snprintf(id, sizeof id, "holder-%d", k);
    reward_client *c = reward_client_open_keys(ep, id, 1.0, 2, client);
    if (!c) return -1;
    static const uint8_t px[12] = {255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255};
    const char *prompts[1] = {"a"};
    reward_result res;
    int rc = reward_client_score(c, px, 1, 1, 2, 2, 16.0, prompts, NULL, &res);
    if (rc == 0 && !(res.n_scores == 1 && res.scores[0].value == 1.0)) rc = -1;
    reward_client_close(c);
    return rc;
}

TEST(net_controller_refuses_8gib_frame) {
    const char *dir = test_tmpdir();
    char out[4096], keys[700], model[700], log[700], ep[64], mset[800];
    core_curve_keys client;
    make_keys(dir, keys, sizeof keys, &client);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", test_vgrpo_bin(),
                     dir) == 0);
    snprintf(model, sizeof model, "%s/model", dir);
    /* the bound for this recipe: the largest frame of a trajectory reply (here the 1 MiB header limit) */
    core_recipe r;
    char ms[760];
    snprintf(ms, sizeof ms, "model.path=%s", model);
    const char *sets[1] = {ms};
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", sets, 1));
    size_t bound = 0;
    REQUIRE_OK(ctl_max_frame_bytes(&r, &bound));
    core_recipe_release(&r);
    CHECK_MSG(bound == ((size_t)1 << 20), "tiny-cpu's controller bound %zu bytes", bound);
    const int port = free_port();
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    snprintf(log, sizeof log, "%s/trainer.log", dir);
    snprintf(mset, sizeof mset, "model.path=%s", model);
    char *argv[] = {(char *)test_vgrpo_bin(), "trainer", "recipes/tiny-cpu.yaml", "--set", mset, "--set",
                    "model.init_preset=", "--controller", ep, "--workers", "1", "--keys-file", keys, NULL};
    const pid_t pid = spawn(log, argv);
    if (wait_listening(port)) {
        test_run(out, sizeof out, "cat %s", log);
        stop(pid);
        test_fail(__FILE__, __LINE__, "the trainer did not listen on %s: %s", ep, out);
        return;
    }
    attack_8gib(pid, port, "trainer (controller)");
    stop(pid);
}

TEST(net_reward_server_refuses_8gib_frame) {
    const char *dir = test_tmpdir();
    char keys[700], ep[64];
    core_curve_keys client;
    make_keys(dir, keys, sizeof keys, &client);
    const pid_t pid = start_reward_server(dir, free_port(), keys, ep, sizeof ep);
    attack_8gib(pid, atoi(strrchr(ep, ':') + 1), "reward server");
    CHECK(key_holder_scores(ep, &client, 0) == 0);
    stop(pid);
}

TEST(net_reward_server_idle_raw_connections_do_not_count) {
    const char *dir = test_tmpdir();
    char keys[700], ep[64], out[8192];
    core_curve_keys client;
    make_keys(dir, keys, sizeof keys, &client);
    const int port = free_port();
    const pid_t pid = start_reward_server(dir, port, keys, ep, sizeof ep);
    /* 2. four idle raw connections, then 12 key holders in turn (well within the 5 s handshake time-out) */
    int raw[40];
    for (int i = 0; i < 4; i++) REQUIRE((raw[i] = raw_connect(port, 100)) >= 0);
    usleep(100 * 1000);
    int ok = 0;
    for (int k = 0; k < 12; k++) ok += key_holder_scores(ep, &client, k) == 0;
    CHECK_MSG(ok == 12, "%d of 12 key holders served with 4 idle raw connections open (--max-peers 2)", ok);
    for (int i = 0; i < 4; i++) close(raw[i]);
    /* 3. 40 at once: at most 12 unauthenticated stay open; a key holder still gets through */
    usleep(200 * 1000);
    for (int i = 0; i < 40; i++) REQUIRE((raw[i] = raw_connect(port, 100)) >= 0);
    usleep(300 * 1000);
    CHECK(key_holder_scores(ep, &client, 99) == 0);
    int dropped = 0;
    for (int i = 0; i < 40; i++) dropped += closed_now(raw[i]);
    for (int i = 0; i < 40; i++) close(raw[i]);
    CHECK_MSG(dropped >= 28, "%d of 40 idle raw connections dropped at once (at most 12 may stay)", dropped);
    /* and one that never finishes its handshake is closed after ZMQ_HANDSHAKE_IVL (5 s) */
    const int idle = raw_connect(port, 100);
    REQUIRE(idle >= 0);
    CHECK_MSG(!closed_within(idle, 3000) && closed_within(idle, 4000), "an idle raw connection was not aged out in 5 s");
    close(idle);
    stop(pid);
    test_run(out, sizeof out, "cat %s/reward.log", dir);
    CHECK_MSG(strstr(out, "dropped the oldest unauthenticated connection"), "log: %s", out);
}

TEST(net_rollout_frame_bounds) {
    /* Wan 2.1 T2V 832 x 480 x 81, 40 steps: latent 16 x 21 x 60 x 104 (131040 per channel), video 81 x 480 x 832 x 3 */
    const size_t lat = (size_t)41 * 16 * 131040 * 4, video = (size_t)81 * 480 * 832 * 3;
    CHECK(core_rollout_reply_max_frame(40, 16, 16, 21, 60, 104, 1, video) == lat);      /* j/latents */
    CHECK(core_rollout_reply_max_frame(40, 16, 16, 21, 60, 104, 4, video) == 4 * video); /* videos of a chunk */
    /* I2V-A14B (36 in, 16 out): concat [20, F, h, w] is smaller than the latents */
    CHECK(core_rollout_reply_max_frame(40, 36, 16, 21, 60, 104, 1, 0) == lat);
    CHECK(core_rollout_reply_max_frame(1, 1, 1, 1, 1, 1, 1, 1) == (size_t)1 << 20);     /* the header limit */
    CHECK(core_rollout_reply_max_frame(1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30, 1, 0) == SIZE_MAX);
    /* a worker: the 14B's largest tensor (ffn 13824 x 5120), or a condition [36, 21, 60, 104] */
    CHECK(core_rollout_worker_max_frame((int64_t)13824 * 5120, 36, 21, 60, 104) == (size_t)13824 * 5120 * 4);
    CHECK(core_rollout_worker_max_frame(10, 36, 21, 60, 104) == (size_t)36 * 131040 * 4);
}
