/* bench/bench_reward.c — `vgrpo bench reward`: reward-server throughput in videos/s, from a separate process.
 *
 *   vgrpo bench reward [--scorers LIST] [--videos N] [--threads T] [--batch B] [--inflight K]
 *
 * Starts `vgrpo reward-server --bind ipc://<tmp>/rs.sock --scorers LIST --threads T` (this binary, found through
 * /proc/self/exe), acts as its client and scores N deterministic 9-frame 64x64 videos four ways: B videos per request
 * with one request in flight (reward/client.h, as a rollout worker does) and with K in flight (a pipelining DEALER),
 * then one video per request, likewise. Every reply is checked against the scorers called in this process (same
 * values, bit for bit), so a fast wrong server does not pass. The first row is that in-process scoring on one thread:
 * the ceiling per scoring thread, with no transport. Ends with a `shutdown` message and prints the server's stats
 * line. Returns the exit status: 0, 1 on failure (server did not start, wrong or missing reply). The options are
 * parsed in cli/cmd_bench.c.
 * Learned scorers (--models NAME=DIR [--frames K], reward/learned.h): the server gets the same --models and --frames
 * (--video-frames 9), this process loads the models for its checks (and scores one video untimed before its row, as
 * the server's warm-up request does), and only the batched reward-client row runs
 * after the in-process row (a model forward takes seconds at real shapes; the model is serialised per process, so
 * more requests in flight add nothing; the in-process row is the unbatched figure). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bench/bench.h"
#include "core/error.h"
#include "core/wire.h"
#include "reward/client.h"
#include "reward/server.h"

#define BF 9
#define BH 64
#define BW 64
#define VB ((size_t)BF * BH * BW * 3)

typedef struct {
    reward_server_config cfg; /* the scorers and weights, to score in process */
    uint8_t *v;               /* videos [n, BF, BH, BW, 3] */
    double *total;            /* in-process totals, [n] */
    const char **prompts;
    char ep[160], log[160], dir[64];
} rb_state;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Deterministic videos with texture and motion, so every scorer does its full work. */
static void fill(uint8_t *v, int n) {
    uint64_t x = 0x2545F4914F6CDD1DULL;
    size_t k = 0;
    for (int i = 0; i < n; i++)
        for (int f = 0; f < BF; f++)
            for (int y = 0; y < BH; y++)
                for (int c = 0; c < BW; c++)
                    for (int ch = 0; ch < 3; ch++) {
                        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                        int val = ((c + 2 * f + i) * (ch + 1) * 4 + y * 3) % 256 + (int)(x & 31) - 16;
                        v[k++] = (uint8_t)(val < 0 ? 0 : val > 255 ? 255 : val);
                    }
}

/* In-process scoring of videos [i0, i1) on this thread; fills st->total. Returns 0 or -1 (core_error). */
static int score_direct(rb_state *st, int i0, int i1) {
    for (int i = i0; i < i1; i++) {
        reward_video vid = {st->v + (size_t)i * VB, BF, BH, BW};
        double t = 0;
        for (int s = 0; s < st->cfg.n_scorers; s++) {
            double r;
            if (reward_score_one(&st->cfg.scorers[s], &vid, st->prompts[i], NULL, &r) != 0) return -1;
            t += st->cfg.scorers[s].weight * r;
        }
        st->total[i] = t;
    }
    return 0;
}

static pid_t start_server(rb_state *st, const bench_reward_opts *o) {
    char exe[4096], threads[16];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "vgrpo bench reward: cannot read /proc/self/exe: %s\n", strerror(errno));
        return -1;
    }
    exe[n] = 0;
    snprintf(threads, sizeof threads, "%d", o->threads);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(st->log, "w", stderr);
        (void)f;
        char *argv[16] = {exe, "reward-server", "--bind", st->ep, "--scorers", (char *)o->scorers, "--threads", threads};
        int a = 8;
        if (o->models) argv[a++] = "--models", argv[a++] = (char *)o->models, argv[a++] = "--video-frames", argv[a++] = "9";
        if (o->frames) argv[a++] = "--frames", argv[a++] = (char *)o->frames;
        argv[a] = NULL;
        execv(exe, argv);
        _exit(127);
    }
    if (pid < 0) fprintf(stderr, "vgrpo bench reward: fork failed: %s\n", strerror(errno));
    return pid;
}

/* Checks a score_reply header for videos [i0, i0 + n) against the in-process totals. */
static int check_totals(const rb_state *st, const json_t *rewards, int i0, int n, const char *id) {
    if (json_array_size(rewards) != (size_t)n) {
        fprintf(stderr, "vgrpo bench reward: reply %s has %zu rewards, want %d\n", id, json_array_size(rewards), n);
        return -1;
    }
    for (int k = 0; k < n; k++) {
        double t = json_real_value(json_object_get(json_array_get(rewards, (size_t)k), "total"));
        if (t != st->total[i0 + k]) {
            fprintf(stderr, "vgrpo bench reward: reply %s video %d: total %.17g, in process %.17g\n", id, i0 + k, t,
                    st->total[i0 + k]);
            return -1;
        }
    }
    return 0;
}

/* One request in flight at a time through reward/client.h. Returns seconds, or -1. */
static double run_client(rb_state *st, int n, int batch, double timeout_s) {
    reward_client *c = reward_client_open(st->ep, "bench", timeout_s, 3);
    if (!c) {
        fprintf(stderr, "vgrpo bench reward: %s\n", core_last_error());
        return -1;
    }
    reward_result *out = calloc((size_t)batch, sizeof *out);
    int rc = out ? 0 : -1;
    double t0 = now_s();
    for (int i = 0; i < n && rc == 0; i += batch) {
        int b = n - i < batch ? n - i : batch;
        if (reward_client_score(c, st->v + (size_t)i * VB, b, BF, BH, BW, 16, st->prompts + i, NULL, out) != 0) {
            fprintf(stderr, "vgrpo bench reward: %s\n", core_last_error());
            rc = -1;
        }
        for (int k = 0; k < b && rc == 0; k++)
            if (out[k].total != st->total[i + k]) {
                fprintf(stderr, "vgrpo bench reward: video %d: total %.17g, in process %.17g\n", i + k, out[k].total,
                        st->total[i + k]);
                rc = -1;
            }
    }
    double dt = now_s() - t0;
    free(out);
    reward_client_close(c);
    return rc == 0 ? dt : -1;
}

/* K requests in flight on one DEALER (ids "p<first video>"). Returns seconds, or -1. */
static double run_pipelined(rb_state *st, int n, int batch, int inflight, double timeout_s) {
    void *ctx = zmq_ctx_new(), *d = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
    int linger = 0, rc = 0;
    if (!d || zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger) || zmq_connect(d, st->ep)) {
        fprintf(stderr, "vgrpo bench reward: cannot connect to %s\n", st->ep);
        if (d) zmq_close(d);
        if (ctx) zmq_ctx_term(ctx);
        return -1;
    }
    double t0 = now_s();
    int next = 0, done = 0, pending = 0;
    while (done < n && rc == 0) {
        while (next < n && pending < inflight && rc == 0) { /* send */
            int b = n - next < batch ? n - next : batch;
            json_t *items = json_array();
            for (int k = 0; k < b; k++) json_array_append_new(items, json_pack("{s:s}", "prompt", st->prompts[next + k]));
            json_t *f = json_pack("{s:i, s:o}", "fps", 16, "items", items);
            core_wire_tensor t = {.name = "videos", .dtype = CORE_U8, .ndim = 5, .shape = {b, BF, BH, BW, 3},
                                  .data = st->v + (size_t)next * VB, .nbytes = (size_t)b * VB};
            char id[32];
            snprintf(id, sizeof id, "p%d", next);
            core_wire_built m;
            if (!f || core_wire_build(CORE_WIRE_SCORE_REQUEST, id, f, &t, 1, &m) != 0) {
                fprintf(stderr, "vgrpo bench reward: %s\n", core_last_error());
                rc = -1;
            } else {
                if (zmq_send(d, m.frames[0].data, m.frames[0].len, ZMQ_SNDMORE) < 0 ||
                    zmq_send(d, m.frames[1].data, m.frames[1].len, 0) < 0)
                    rc = -1;
                core_wire_built_free(&m);
            }
            json_decref(f);
            next += b;
            pending++;
        }
        zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
        if (rc || zmq_poll(&it, 1, (long)(timeout_s * 1000)) <= 0) {
            if (!rc) fprintf(stderr, "vgrpo bench reward: no reply within %g s (%d of %d videos done)\n", timeout_s, done, n);
            rc = -1;
            break;
        }
        zmq_msg_t r;
        zmq_msg_init(&r);
        if (zmq_msg_recv(&r, d, 0) < 0) {
            zmq_msg_close(&r);
            rc = -1;
            break;
        }
        core_wire_frame fr = {zmq_msg_data(&r), zmq_msg_size(&r)};
        core_wire_msg msg;
        if (core_wire_parse(&fr, 1, NULL, &msg) != 0 || msg.type != CORE_WIRE_SCORE_REPLY || msg.id[0] != 'p') {
            fprintf(stderr, "vgrpo bench reward: unexpected reply: %.300s\n", (const char *)zmq_msg_data(&r));
            rc = -1;
        } else {
            int i0 = atoi(msg.id + 1), b = n - i0 < batch ? n - i0 : batch;
            if (check_totals(st, json_object_get(msg.header, "rewards"), i0, b, msg.id) != 0) rc = -1;
            done += b;
            pending--;
        }
        core_wire_msg_free(&msg);
        zmq_msg_close(&r);
    }
    double dt = now_s() - t0;
    zmq_close(d);
    zmq_ctx_term(ctx);
    return rc == 0 ? dt : -1;
}

/* Sends `shutdown` and waits for the server to exit (then SIGKILL after 15 s). Returns its exit status or -1. */
static int stop_server(rb_state *st, pid_t pid) {
    void *ctx = zmq_ctx_new(), *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, tmo = 5000;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_connect(d, st->ep);
    const char *h = "{\"v\":1,\"type\":\"shutdown\",\"id\":\"bench-stop\"}";
    zmq_send(d, h, strlen(h), 0);
    char buf[256];
    int got = zmq_recv(d, buf, sizeof buf, 0);
    zmq_close(d);
    zmq_ctx_term(ctx);
    if (got < 0) kill(pid, SIGTERM);
    for (int i = 0; i < 1500; i++) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void print_row(const char *mode, int batch, int inflight, int n, double dt) {
    int req = (n + batch - 1) / batch;
    printf("  %-34s %6d %9d %9d %8.3f %10.*f %10.2f\n", mode, batch, inflight, req, dt, n / dt >= 100 ? 1 : 3, n / dt,
           1e3 * dt / req);
}

int bench_reward(const bench_reward_opts *o) {
    rb_state st;
    memset(&st, 0, sizeof st);
    reward_server_config_default(&st.cfg);
    if (reward_server_parse_scorers(&st.cfg, o->scorers) != 0) {
        fprintf(stderr, "vgrpo bench reward: %s\n", core_last_error());
        return 1;
    }
    if (reward_server_attach_models(&st.cfg, o->models, o->frames, BF) != 0) {
        fprintf(stderr, "vgrpo bench reward: %s\n", core_last_error());
        return 1;
    }
    snprintf(st.dir, sizeof st.dir, "/tmp/vgrpo-bench-XXXXXX");
    if (!mkdtemp(st.dir)) {
        fprintf(stderr, "vgrpo bench reward: cannot make a directory under /tmp: %s\n", strerror(errno));
        return 1;
    }
    snprintf(st.ep, sizeof st.ep, "ipc://%s/rs.sock", st.dir);
    snprintf(st.log, sizeof st.log, "%s/server.log", st.dir);
    const int n = o->videos;
    st.v = malloc((size_t)n * VB);
    st.total = calloc((size_t)n, sizeof *st.total);
    st.prompts = calloc((size_t)n, sizeof *st.prompts);
    if (!st.v || !st.total || !st.prompts) {
        fprintf(stderr, "vgrpo bench reward: out of memory for %d videos\n", n);
        free(st.v), free(st.total), free(st.prompts);
        reward_server_detach_models(&st.cfg);
        rmdir(st.dir);
        return 1;
    }
    static const char *pr[4] = {"a red car on a road", "a blue bird in the sky", "a green field at noon",
                                "a white cat on a black sofa"};
    for (int i = 0; i < n; i++) st.prompts[i] = pr[i % 4];
    fill(st.v, n);
    int rc = 1;
    pid_t pid = start_server(&st, o);
    if (pid < 0) goto out;

    printf("vgrpo bench reward: %d videos of %d frames %dx%d (%zu bytes each), scorers %s;\n", n, BF, BH, BW, VB,
           o->scorers);
    if (o->models) printf("models %s, frames %s;\n", o->models, o->frames ? o->frames : "all");
    printf("server: %d scoring thread%s, ipc, a separate process; every reply checked against in-process scores\n\n",
           o->threads, o->threads == 1 ? "" : "s");
    printf("  %-34s %6s %9s %9s %8s %10s %10s\n", "mode", "batch", "in flight", "requests", "s", "videos/s", "ms/request");
    /* a learned model's first forward allocates its scratch: one untimed video first */
    if (o->models && score_direct(&st, 0, 1) != 0) {
        fprintf(stderr, "vgrpo bench reward: in-process scoring failed: %s\n", core_last_error());
        stop_server(&st, pid);
        goto out;
    }
    double t0 = now_s();
    if (score_direct(&st, 0, n) != 0) {
        fprintf(stderr, "vgrpo bench reward: in-process scoring failed: %s\n", core_last_error());
        stop_server(&st, pid);
        goto out;
    }
    print_row("in process, 1 thread (no server)", 1, 1, n, now_s() - t0);
    /* Warm-up (the server is starting; the client connects lazily): one small request, not timed. */
    const int warm = o->models ? 1 : o->batch < n ? o->batch : n; /* a learned model: one video */
    if (run_client(&st, warm, o->batch, o->models ? 600.0 : 30.0) < 0) {
        fprintf(stderr, "vgrpo bench reward: the server did not answer; its log %s:\n", st.log);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "cat %s >&2", st.log);
        if (system(cmd) != 0) fprintf(stderr, "(no log)\n");
        stop_server(&st, pid);
        goto out;
    }
    struct {
        const char *mode;
        int batch, inflight;
    } rows[4] = {{"batched, reward client", o->batch, 1},
                 {"batched, pipelined", o->batch, o->inflight},
                 {"unbatched, reward client", 1, 1},
                 {"unbatched, pipelined", 1, o->inflight}};
    int fail = 0;
    const double tmo = o->models ? 3600.0 : 60.0;
    for (int r = 0; r < (o->models ? 1 : 4) && !fail; r++) {
        double dt = rows[r].inflight == 1 ? run_client(&st, n, rows[r].batch, tmo)
                                          : run_pipelined(&st, n, rows[r].batch, rows[r].inflight, tmo);
        if (dt < 0) fail = 1;
        else print_row(rows[r].mode, rows[r].batch, rows[r].inflight, n, dt);
    }
    int st_rc = stop_server(&st, pid);
    FILE *lf = fopen(st.log, "r");
    char line[512];
    while (lf && fgets(line, sizeof line, lf))
        if (strstr(line, "stats:")) printf("\n%s", line);
    if (lf) fclose(lf);
    if (st_rc != 0) fprintf(stderr, "vgrpo bench reward: the server exited with status %d (log %s)\n", st_rc, st.log);
    rc = fail || st_rc != 0;
out:
    if (rc == 0) {
        unlink(st.log);
        unlink(st.ep + 6); /* the server removes its socket file; this is in case it could not */
        rmdir(st.dir);
    }
    free(st.v);
    free(st.total);
    free(st.prompts);
    reward_server_detach_models(&st.cfg);
    return rc;
}
