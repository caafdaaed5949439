/* tests/reward_thread_util.h — an in-process reward server (reward_server_run on a thread) for the tests of its
 * clients (tests/test_reward_client.c, tests/test_reward_fuzz.c), and direct scoring to compare replies against. */
#ifndef TESTS_REWARD_THREAD_UTIL_H
#define TESTS_REWARD_THREAD_UTIL_H

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "reward/server.h"
#include "tests/test.h"

typedef struct {
    reward_server_config cfg;
    char endpoint[160];
    volatile sig_atomic_t stop;
    reward_server_stats stats;
    int rc;
    char err[CORE_ERROR_MAX];
    pthread_t th;
} rsrv;

static void *rsrv_main(void *arg) {
    rsrv *s = arg;
    s->rc = reward_server_run(&s->cfg, &s->stop, &s->stats);
    if (s->rc) snprintf(s->err, sizeof s->err, "%s", core_last_error());
    return NULL;
}

/* Starts a server on endpoint with scorers ("NAME:WEIGHT,..."), `threads` scoring threads and a frame limit
 * (0: the default). It binds on its own thread; clients may connect before (libzmq reconnects). */
static inline void rsrv_start(rsrv *s, const char *endpoint, const char *scorers, int threads, size_t max_frame_bytes) {
    memset(s, 0, sizeof *s);
    reward_server_config_default(&s->cfg);
    snprintf(s->endpoint, sizeof s->endpoint, "%s", endpoint);
    s->cfg.endpoint = s->endpoint;
    s->cfg.threads = threads;
    if (max_frame_bytes) s->cfg.max_frame_bytes = max_frame_bytes;
    REQUIRE_OK(reward_server_parse_scorers(&s->cfg, scorers));
    REQUIRE(pthread_create(&s->th, NULL, rsrv_main, s) == 0);
}

/* Stops the server (as SIGTERM would) and returns reward_server_run's status; stats are in s->stats. */
static inline int rsrv_stop(rsrv *s) {
    s->stop = 1;
    pthread_join(s->th, NULL);
    if (s->rc) test_fail(__FILE__, __LINE__, "reward server on %s failed: %s", s->endpoint, s->err);
    return s->rc;
}

/* Deterministic videos: n x frames x h x w x 3 bytes from a seeded LCG, with some structure (a moving gradient
 * plus noise) so that every scorer gives a non-trivial value. */
static inline void rsrv_fill_videos(uint8_t *v, int n, int frames, int h, int w, unsigned long long seed) {
    unsigned long long x = seed * 0x9E3779B97F4A7C15ULL + 7;
    size_t k = 0;
    for (int i = 0; i < n; i++)
        for (int f = 0; f < frames; f++)
            for (int y = 0; y < h; y++)
                for (int xx = 0; xx < w; xx++)
                    for (int c = 0; c < 3; c++) {
                        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
                        int base = (c == i % 3 ? 160 : 40) + 3 * (xx + f * (i + 1)) % 64 + (y * 2) % 32;
                        int val = base + (int)((x >> 59) & 15) - 8;
                        v[k++] = (uint8_t)(val < 0 ? 0 : val > 255 ? 255 : val);
                    }
}

/* Scores one video with scorer `name` directly (no server). */
static inline double rsrv_direct(const char *name, const uint8_t *video, int frames, int h, int w, const char *prompt,
                                 const char *color /* metadata "color" or NULL */) {
    const reward_scorer *sc = reward_find(name);
    if (!sc) {
        test_fail(__FILE__, __LINE__, "no scorer %s", name);
        return NAN;
    }
    const char *keys[1] = {"color"}, *vals[1] = {color};
    reward_meta meta = {color ? 1 : 0, keys, vals};
    reward_video vid = {video, frames, h, w};
    double r = NAN;
    if (sc->fn(&vid, prompt, &meta, &r) != 0) test_fail(__FILE__, __LINE__, "scorer %s: %s", name, core_last_error());
    return r;
}

#endif
