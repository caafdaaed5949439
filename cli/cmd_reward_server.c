/* cli/cmd_reward_server.c — `vgrpo reward-server`: serve the built-in scorers over ZeroMQ (reward/server.h,
 * reward/PROTOCOL.md) until SIGTERM/SIGINT or a `shutdown` message; prints one stats line at exit. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "core/error.h"
#include "reward/server.h"

static volatile sig_atomic_t stop_flag = 0;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: vgrpo reward-server --bind ENDPOINT --scorers NAME:WEIGHT,... [--threads N] [--queue N]\n"
            "                           [--max-frame-mb MB] [--cache N]\n"
            "  --bind          ipc://PATH (PATH < 100 bytes) or tcp://HOST:PORT\n"
            "  --scorers       scorers and weights, e.g. color_match:1,brightness:0.5 (weight default 1)\n"
            "  --threads       scoring threads (default 2)\n"
            "  --queue         requests waiting for a thread before `busy` errors (default 64)\n"
            "  --max-frame-mb  largest videos frame in MiB; a bigger frame drops the connection (default 1024)\n"
            "  --cache         replies kept for idempotent repeats (default 4096)\n"
            "Protocol: reward/PROTOCOL.md. Stops on SIGTERM/SIGINT or a `shutdown` message.\n");
}

static int parse_pos(const char *flag, const char *v, long max, long *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < 1 || x > max) {
        fprintf(stderr, "reward-server: %s \"%s\" is not an integer in [1, %ld]\n", flag, v, max);
        return -1;
    }
    *out = x;
    return 0;
}

int cmd_reward_server(int argc, char **argv) {
    reward_server_config cfg;
    reward_server_config_default(&cfg);
    const char *scorers = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "reward-server: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        long x;
        if (!strcmp(a, "--bind")) cfg.endpoint = v;
        else if (!strcmp(a, "--scorers")) scorers = v;
        else if (!strcmp(a, "--threads")) {
            if (parse_pos(a, v, 256, &x)) return 2;
            cfg.threads = (int)x;
        } else if (!strcmp(a, "--queue")) {
            if (parse_pos(a, v, 1 << 20, &x)) return 2;
            cfg.queue = (int)x;
        } else if (!strcmp(a, "--cache")) {
            if (parse_pos(a, v, 1 << 24, &x)) return 2;
            cfg.cache = (int)x;
        } else if (!strcmp(a, "--max-frame-mb")) {
            if (parse_pos(a, v, 1 << 20, &x)) return 2;
            cfg.max_frame_bytes = (size_t)x << 20;
        } else {
            fprintf(stderr, "reward-server: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!cfg.endpoint || !scorers) {
        fprintf(stderr, "reward-server: --bind and --scorers are required\n");
        usage(stderr);
        return 2;
    }
    if (reward_server_parse_scorers(&cfg, scorers) != 0) {
        fprintf(stderr, "reward-server: %s\n", core_last_error());
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: the poll loop wakes and sees the flag */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "reward-server: serving on %s with %d scorer(s), %d thread(s)\n", cfg.endpoint, cfg.n_scorers,
            cfg.threads);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    reward_server_stats st;
    memset(&st, 0, sizeof st);
    int rc = reward_server_run(&cfg, &stop_flag, &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (rc != 0) fprintf(stderr, "reward-server: %s\n", core_last_error());
    fprintf(stderr,
            "reward-server: stats: received %lld, replies %lld, errors %lld, repeats %lld, videos %lld, "
            "undeliverable %lld, %.1f s\n",
            st.received, st.replies, st.errors, st.repeats, st.videos, st.undeliverable, secs);
    return rc == 0 ? 0 : 1;
}
