/* cli/cmd_reward_server.c — `vgrpo reward-server`: serve the built-in scorers over ZeroMQ (reward/server.h,
 * reward/PROTOCOL.md) until SIGTERM/SIGINT or a `shutdown` message; prints one stats line at exit. With the run's
 * keys (--keys-fd from the job, --keys-file by hand; core/curve.h) the ROUTER is a CURVE server that admits only
 * the run's client key; without, plain ZeroMQ, said in the log. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "core/curve.h"
#include "core/error.h"
#include "core/log.h"
#include "reward/server.h"

static volatile sig_atomic_t stop_flag = 0;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

int cmd_reward_server(int argc, char **argv) {
    reward_server_config cfg;
    reward_server_config_default(&cfg);
    const char *scorers = NULL;
    int max_frame_mb = (int)(cfg.max_frame_bytes >> 20), max_memory_mb = 0, keys_fd = -1;
    const char *keys_file = NULL, *models = NULL, *frames = NULL;
    int video_frames = 81;
    const opts_spec opts[] = {
        {.name = "bind", .type = OPTS_STRING, .str = &cfg.endpoint, .required = 1, .meta = "ENDPOINT",
         .help = "ipc://PATH (PATH < 100 bytes) or tcp://HOST:PORT"},
        {.name = "scorers", .type = OPTS_STRING, .str = &scorers, .required = 1, .meta = "NAME:WEIGHT,...",
         .help = "scorers and weights, e.g. color_match:1,brightness:0.5 (weight default 1)"},
        {.name = "models", .type = OPTS_STRING, .str = &models, .meta = "NAME=DIR,...",
         .help = "model folders of the learned scorers (clip_score, pickscore, hpsv2, aesthetic: reward/learned.h), "
                 "loaded once at start, e.g. pickscore=/data/PickScore_v1"},
        {.name = "frames", .type = OPTS_STRING, .str = &frames, .meta = "first|all|K",
         .help = "frames a learned scorer scores: first, all, or K evenly spaced (default all); reward = their mean"},
        {.name = "video-frames", .type = OPTS_INT, .i = &video_frames, .min = 1, .max = 1 << 20, .meta = "F",
         .help = "frames of the videos to be scored: the learned models' memory estimate and the --frames K check "
                 "(default 81)"},
        {.name = "threads", .type = OPTS_INT, .i = &cfg.threads, .min = 1, .max = 256, .meta = "N",
         .help = "scoring threads (default 2)"},
        {.name = "queue", .type = OPTS_INT, .i = &cfg.queue, .min = 1, .max = 1 << 20, .meta = "N",
         .help = "requests waiting for a thread before `busy` errors (default 64)"},
        {.name = "max-frame-mb", .type = OPTS_INT, .i = &max_frame_mb, .min = 1, .max = 1 << 20, .meta = "MB",
         .help = "largest videos frame in MiB (a rollout request's videos: batch_size x frames x height x width x 3 "
                 "bytes); a bigger frame drops the connection (default 16)"},
        {.name = "max-peers", .type = OPTS_INT, .i = &cfg.max_peers, .min = 1, .max = 1 << 16, .meta = "N",
         .help = "connections at once; the handshake of one more is refused (default 16)"},
        {.name = "max-memory-mb", .type = OPTS_INT, .i = &max_memory_mb, .min = 1, .max = 1 << 24, .meta = "MB",
         .help = "memory growth past which every connection is dropped (default 4 x max-peers x (max-frame-mb + 1) "
                 "+ 128)"},
        {.name = "cache", .type = OPTS_INT, .i = &cfg.cache, .min = 1, .max = 1 << 24, .meta = "N",
         .help = "replies kept for idempotent repeats (default 4096)"},
        {.name = "keys-fd", .type = OPTS_INT, .i = &keys_fd, .min = 0, .max = 1 << 20, .meta = "N",
         .help = "read the run's keys (core/curve.h) from inherited descriptor N"},
        {.name = "keys-file", .type = OPTS_STRING, .str = &keys_file, .meta = "PATH",
         .help = "read the run's keys from a file of mode 0600\n(neither: plain ZeroMQ, any peer that reaches the "
                 "endpoint)"},
        {0}};
    const opts_cmd cmd = {.name = "reward-server", .opts = opts,
                          .epilog = "Protocol: reward/PROTOCOL.md. Stops on SIGTERM/SIGINT or a `shutdown` message."};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) return opts_exit_status(prc);
    cfg.max_frame_bytes = (size_t)max_frame_mb << 20;
    cfg.max_memory_bytes = (size_t)max_memory_mb << 20;
    if (reward_server_parse_scorers(&cfg, scorers) != 0)
        return opts_exit_status(opts_fail(&cmd, stderr, "%s", core_last_error()));
    if (reward_server_attach_models(&cfg, models, frames, video_frames) != 0) { /* before the keys: nothing to close */
        fprintf(stderr, "reward-server: %s\n", core_last_error());
        return 1;
    }
    core_curve_keys keys; /* read first: the descriptor is closed at once */
    int keyed = 0;
    if (core_curve_options(keys_fd, keys_file, &keys, &keyed) != 0) {
        fprintf(stderr, "reward-server: %s\n", core_last_error());
        reward_server_detach_models(&cfg);
        return 1;
    }
    cfg.keys = keyed ? &keys : NULL;
    if (!keyed) core_log_warn("reward-server: no keys (--keys-fd / --keys-file): the reward channel is not authenticated");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: the poll loop wakes and sees the flag */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr,
            "reward-server: serving on %s%s with %d scorer(s), %d thread(s); frames up to %d MiB, %d connections, "
            "memory budget %zu MiB\n",
            cfg.endpoint, keyed ? " (CURVE)" : "", cfg.n_scorers, cfg.threads, max_frame_mb, cfg.max_peers,
            reward_server_memory_budget(&cfg) >> 20);
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
            "undeliverable %lld, refused %lld, dropped %lld, %.1f s\n",
            st.received, st.replies, st.errors, st.repeats, st.videos, st.undeliverable, st.refused, st.dropped, secs);
    reward_server_detach_models(&cfg);
    return rc == 0 ? 0 : 1;
}
