/* tests/test_guard.c — the reward-hacking guard (trainer/run/guard.h, media/video_stats.h): video statistics on synthetic
 * videos with known values (constant, checkerboard, two frames, noise; brightness and motion equal their scorers;
 * threads do not change a bit); the drift, its sd floor and when warnings repeat; the best link and the rolling limit
 * that never removes its target; the early stop's decision on synthetic eval sequences (trips, and does not trip
 * without a fall, without a rise, after a recovery, with patience 0); the state's JSON round trip; end to end on the
 * tiny model: gold/ metrics and best/ with total_limit 1, a resumed run equal to a straight one (rows, best link,
 * checkpoints), and the statistics never changing the training (rewards, loss, weights). The slow test (make
 * test-slow) runs recipes/tiny-cpu-hack.yaml (train brightness, gold color_match), which must trip the guard with
 * best/ on an earlier checkpoint, and recipes/tiny-cpu.yaml with the same guard, which must not. */
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/metrics.h"
#include "core/recipe.h"
#include "media/video_stats.h"
#include "reward/scorers.h"
#include "tests/metrics_rows.h"
#include "tests/test.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/run/guard.h"

/* ------------------------------------------------------------------------------------------------------------
 * video statistics */

static void fill_rgb(uint8_t *v, int64_t n_px, uint8_t r, uint8_t g, uint8_t b) {
    for (int64_t i = 0; i < n_px; i++) v[3 * i] = r, v[3 * i + 1] = g, v[3 * i + 2] = b;
}

TEST(guard_video_stats_known_values) {
    double s[MEDIA_VSTAT_COUNT];
    uint8_t *v = malloc(3 * 16 * 64 * 64);
    REQUIRE(v);
    /* constant (200, 100, 50), 2 frames of 4 x 6: L = 124200 */
    fill_rgb(v, 2 * 4 * 6, 200, 100, 50);
    REQUIRE_OK(media_video_stats(v, 2, 4, 6, s));
    CHECK(s[MEDIA_VSTAT_BRIGHTNESS] == 124200.0 / 255000.0);
    CHECK_NEAR(s[MEDIA_VSTAT_SATURATION], 0.75, 1e-15);
    CHECK(s[MEDIA_VSTAT_CONTRAST] == 0 && s[MEDIA_VSTAT_BLACK] == 0 && s[MEDIA_VSTAT_WHITE] == 0);
    CHECK(s[MEDIA_VSTAT_MOTION] == 0 && s[MEDIA_VSTAT_HF] == 0);
    /* black and white checkerboard, one 4 x 4 frame */
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++) {
            const uint8_t c = (x + y) % 2 ? 255 : 0;
            fill_rgb(v + 3 * (y * 4 + x), 1, c, c, c);
        }
    REQUIRE_OK(media_video_stats(v, 1, 4, 4, s));
    CHECK(s[MEDIA_VSTAT_BRIGHTNESS] == 0.5 && s[MEDIA_VSTAT_SATURATION] == 0);
    CHECK(s[MEDIA_VSTAT_CONTRAST] == 0.5 && s[MEDIA_VSTAT_BLACK] == 0.5 && s[MEDIA_VSTAT_WHITE] == 0.5);
    CHECK(s[MEDIA_VSTAT_MOTION] == 0);
    CHECK_NEAR(s[MEDIA_VSTAT_HF], 1.0, 1e-15);
    /* stripes (period 2 along x only) carry no checkerboard energy */
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++) fill_rgb(v + 3 * (y * 4 + x), 1, x % 2 ? 255 : 0, x % 2 ? 255 : 0, x % 2 ? 255 : 0);
    REQUIRE_OK(media_video_stats(v, 1, 4, 4, s));
    CHECK(s[MEDIA_VSTAT_HF] == 0 && s[MEDIA_VSTAT_CONTRAST] == 0.5);
    /* two grey frames differing by 50: motion 50 / 255, no contrast, no checkerboard */
    fill_rgb(v, 8 * 8, 100, 100, 100);
    fill_rgb(v + 3 * 64, 8 * 8, 150, 150, 150);
    REQUIRE_OK(media_video_stats(v, 2, 8, 8, s));
    CHECK_NEAR(s[MEDIA_VSTAT_MOTION], 50.0 / 255.0, 1e-15);
    CHECK_NEAR(s[MEDIA_VSTAT_BRIGHTNESS], 125.0 / 255.0, 1e-15);
    CHECK(s[MEDIA_VSTAT_CONTRAST] == 0 && s[MEDIA_VSTAT_HF] == 0 && s[MEDIA_VSTAT_SATURATION] == 0);
    /* near-black / near-white thresholds: y <= 0.05 and y >= 0.95 */
    fill_rgb(v, 1, 12, 12, 12);   /* L = 12000 */
    fill_rgb(v + 3, 1, 13, 13, 13); /* L = 13000 */
    fill_rgb(v + 6, 1, 243, 243, 243);
    fill_rgb(v + 9, 1, 242, 242, 242);
    REQUIRE_OK(media_video_stats(v, 1, 1, 4, s));
    CHECK(s[MEDIA_VSTAT_BLACK] == 0.25 && s[MEDIA_VSTAT_WHITE] == 0.25 && s[MEDIA_VSTAT_HF] == 0); /* 1 row: no window */
    /* noise: hf about 0.25; brightness and motion equal their scorers bit for bit */
    unsigned x = 12345;
    for (int i = 0; i < 3 * 16 * 64 * 64; i++) x = x * 1103515245u + 12345u, v[i] = (uint8_t)(x >> 16);
    REQUIRE_OK(media_video_stats(v, 16, 64, 64, s));
    CHECK_MSG(fabs(s[MEDIA_VSTAT_HF] - 0.25) < 0.02, "white noise hf_energy %g, expected about 0.25", s[MEDIA_VSTAT_HF]);
    const reward_video rv = {v, 16, 64, 64};
    double b, m;
    REQUIRE_OK(reward_brightness(&rv, NULL, NULL, &b));
    REQUIRE_OK(reward_motion(&rv, NULL, NULL, &m));
    CHECK(s[MEDIA_VSTAT_BRIGHTNESS] == b && s[MEDIA_VSTAT_MOTION] == m);
    /* one thread or three: the same bits (frames run in parallel here) */
    double s1[MEDIA_VSTAT_COUNT];
    const int th = omp_get_max_threads();
    omp_set_num_threads(1);
    REQUIRE_OK(media_video_stats(v, 16, 64, 64, s1));
    omp_set_num_threads(3);
    REQUIRE_OK(media_video_stats(v, 16, 64, 64, s));
    omp_set_num_threads(th);
    CHECK(!memcmp(s, s1, sizeof s));
    /* errors */
    CHECK(media_video_stats(NULL, 1, 1, 1, s) == -1);
    CHECK(media_video_stats(v, 0, 1, 1, s) == -1 && strstr(core_last_error(), "dim < 1"));
    free(v);
}

/* ------------------------------------------------------------------------------------------------------------
 * drift and warnings */

/* The tiny recipe with --set-style overrides. */
static void load_recipe(core_recipe *r, const char *const *sets, int n) {
    REQUIRE_OK(core_recipe_load(r, "recipes/tiny-cpu.yaml", sets, n));
}

/* n videos whose statistic i is vals[j] (every other statistic 0.2). */
static void synth(double *vs, int n, int stat, const double *vals) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < GUARD_NSTATS; i++) vs[j * GUARD_NSTATS + i] = i == stat ? vals[j] : 0.2;
}

TEST(guard_drift_and_warnings) {
    core_recipe r;
    load_recipe(&r, NULL, 0);
    trainer_guard G;
    REQUIRE_OK(trainer_guard_init(&G, &r, NULL));
    CHECK(G.stats_on && G.warn_sd == 4 && G.n_gold == 0 && trainer_guard_active(&G));
    const char *dir = test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    core_metrics *m;
    REQUIRE_OK(core_metrics_open(&m, path, 0));
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    REQUIRE(out);
    double vs[4 * GUARD_NSTATS];
    const double base[4] = {0.4, 0.5, 0.6, 0.5}, same[4] = {0.5, 0.5, 0.5, 0.5}, up[4] = {0.9, 0.9, 0.9, 0.9},
                 down[4] = {0.1, 0.1, 0.1, 0.1};
    const double sd0 = sqrt(0.02 / 4);
    int warned[40] = {0};
    for (int k = 0; k < 20; k++) {
        synth(vs, 4, MEDIA_VSTAT_BRIGHTNESS, k == 0 ? base : k == 1 || k == 13 ? same : k == 15 ? down : up);
        if (k == 1) vs[GUARD_NSTATS + MEDIA_VSTAT_MOTION] = 0.2004; /* a statistic with sd_0 = 0: floor 1e-3 */
        const long before = ftell(out);
        REQUIRE_OK(trainer_guard_step(&G, k, vs, 4, 0.1 * k, m, out));
        fflush(out);
        warned[k] = ftell(out) > before;
        REQUIRE_OK(core_metrics_write_row(m));
    }
    fclose(out);
    CHECK(G.st.have_base && G.st.base_mean[MEDIA_VSTAT_BRIGHTNESS] == 0.5);
    CHECK_NEAR(G.st.base_sd[MEDIA_VSTAT_BRIGHTNESS], sd0, 1e-15);
    CHECK(G.st.base_sd[MEDIA_VSTAT_MOTION] == 0);
    /* warned at the excursion's first step (2), every GUARD_WARN_EVERY steps of it (12), again after it ended (14) and
     * when the sign flipped (15, 16) */
    for (int k = 0; k < 20; k++) {
        const int want = k == 2 || k == 12 || k == 14 || k == 15 || k == 16;
        CHECK_MSG(warned[k] == want, "step %d: warned %d, expected %d", k, warned[k], want);
    }
    CHECK_MSG(strstr(buf, "guard: stats/brightness drifted +5.7 sd from step 0 at step 2 (mean 0.9000; step 0: "
                          "0.5000 +- 0.0707)"), "got: %s", buf);
    CHECK_MSG(strstr(buf, "at step 12 (mean 0.9000; step 0: 0.5000 +- 0.0707); past 4 sd since step 2"), "got: %s", buf);
    CHECK_MSG(strstr(buf, "drifted -5.7 sd from step 0 at step 15"), "got: %s", buf);
    CHECK(!strstr(buf, "stats/motion")); /* 0.5 floor-sd is within 4 */
    free(buf);
    /* the metrics rows: mean and drift per statistic; the floor for sd_0 = 0 */
    json_t *rows[20];
    REQUIRE(core_metrics_close(m) == 0);
    REQUIRE(read_rows(path, rows, 20, 0) == 20);
    CHECK(json_real_value(json_object_get(rows[0], "stats/brightness/drift_sd")) == 0);
    CHECK_NEAR(json_real_value(json_object_get(rows[2], "stats/brightness/drift_sd")), 0.4 / sd0, 1e-12);
    CHECK_NEAR(json_real_value(json_object_get(rows[2], "stats/brightness/mean")), 0.9, 1e-15);
    CHECK_NEAR(json_real_value(json_object_get(rows[1], "stats/motion/drift_sd")), 0.0001 / GUARD_SD_FLOOR, 1e-9);
    CHECK(json_object_get(rows[5], "stats/hf_energy/drift_sd") && json_object_size(rows[5]) == 2 * GUARD_NSTATS);
    for (int k = 0; k < 20; k++) json_decref(rows[k]);
    /* the training rewards went to the early stop's sums */
    CHECK(G.st.reward_n == 20);
    trainer_guard_free(&G);
    core_recipe_release(&r);
}

/* ------------------------------------------------------------------------------------------------------------
 * best link and the rolling limit */

static int exists(const char *dir, const char *name) {
    char p[700];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return !lstat(p, &sb);
}

TEST(guard_best_link_never_pruned) {
    const char *dir = test_tmpdir();
    char p[700];
    for (int s = 10; s <= 40; s += 10) {
        snprintf(p, sizeof p, "%s/checkpoint-%d", dir, s);
        REQUIRE(mkdir(p, 0777) == 0);
    }
    int64_t b = -1;
    CHECK(trainer_ckpt_get_best(dir, &b) == 0);
    REQUIRE_OK(trainer_ckpt_set_best(dir, 10));
    CHECK(trainer_ckpt_get_best(dir, &b) == 1 && b == 10);
    /* keep 2: best (10) kept beside the two newest */
    CHECK(trainer_ckpt_prune(dir, 2, 40) == 1);
    CHECK(exists(dir, "checkpoint-10") && !exists(dir, "checkpoint-20") && exists(dir, "checkpoint-30") &&
          exists(dir, "checkpoint-40"));
    /* keep 1: still never the target */
    CHECK(trainer_ckpt_prune(dir, 1, 40) == 1);
    CHECK(exists(dir, "checkpoint-10") && !exists(dir, "checkpoint-30") && exists(dir, "checkpoint-40"));
    /* the link moves atomically (a leftover .best.tmp is replaced), then the old target is an ordinary checkpoint */
    snprintf(p, sizeof p, "%s/.best.tmp", dir);
    REQUIRE(symlink("checkpoint-10", p) == 0);
    REQUIRE_OK(trainer_ckpt_set_best(dir, 40));
    CHECK(trainer_ckpt_get_best(dir, &b) == 1 && b == 40 && !exists(dir, ".best.tmp"));
    CHECK(trainer_ckpt_prune(dir, 1, -1) == 1); /* best is the newest now: it counts as one of them */
    CHECK(!exists(dir, "checkpoint-10") && exists(dir, "checkpoint-40") && exists(dir, "best"));
    /* a checkpoint folder opens through the link */
    snprintf(p, sizeof p, "%s/checkpoint-40/trainer_state.json", dir);
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fclose(f);
    char out[700], bestp[700];
    snprintf(bestp, sizeof bestp, "%s/best", dir);
    REQUIRE_OK(trainer_ckpt_resolve(bestp, out, sizeof out));
    CHECK(!strcmp(out, bestp));
    /* refusals: a missing checkpoint, a `best` that is not a link */
    CHECK(trainer_ckpt_set_best(dir, 99) == -1 && strstr(core_last_error(), "checkpoint-99"));
    REQUIRE_OK(trainer_ckpt_clear_best(dir));
    snprintf(p, sizeof p, "%s/best", dir);
    REQUIRE(mkdir(p, 0777) == 0);
    CHECK(trainer_ckpt_set_best(dir, 40) == -1 && strstr(core_last_error(), "not a symlink"));
    REQUIRE(rmdir(p) == 0);
    /* a fresh run's clean-up removes the link with the checkpoints */
    REQUIRE_OK(trainer_ckpt_set_best(dir, 40));
    CHECK(trainer_ckpt_remove_all(dir, NULL, 0) == 1);
    CHECK(!exists(dir, "best") && !exists(dir, "checkpoint-40"));
}

/* ------------------------------------------------------------------------------------------------------------
 * early stop */

static void gold_guard(trainer_guard *G, core_recipe *r, int patience, double se_k) {
    char pa[64], pk[64];
    snprintf(pa, sizeof pa, "guard.patience=%d", patience);
    snprintf(pk, sizeof pk, "guard.patience_se=%g", se_k);
    const char *sets[] = {"guard.gold_scorers=[color_match]", pa, pk, "guard.video_stats=false"};
    load_recipe(r, sets, 4);
    REQUIRE_OK(trainer_guard_init(G, r, NULL));
}

/* An eval every 10 steps: gold[e] (se 0.02) at step 10 e, then 10 steps with training reward rew[e] each (so the
 * eval right after a best compares rew[best] with itself: no rise). Returns the index of the eval that stopped the
 * run, or -1. best[e] receives the best step after eval e. */
static int run_seq(trainer_guard *G, const double *gold, const double *rew, int n_evals, int64_t *best) {
    for (int e = 0; e < n_evals; e++) {
        guard_verdict v;
        trainer_guard_judge(G, gold[e], 0.02, &v);
        CHECK_NEAR(v.lcb, gold[e] - 1.96 * 0.02, 1e-15);
        trainer_guard_commit(G, 10 * e, &v);
        best[e] = G->st.best_step;
        if (v.stop) return e;
        for (int k = 0; k < 10; k++) trainer_guard_reward(G, rew[e]);
    }
    return -1;
}

TEST(guard_early_stop_trips) {
    core_recipe r;
    trainer_guard G;
    int64_t best[8];
    gold_guard(&G, &r, 2, 2.0);
    /* gold rises to its best at eval 1 (step 10), then falls by 5 se of the difference while the training reward
     * keeps rising above step 10's: eval 2 (no rise yet: its steps are those of the best's weights), 3 and 4 fall,
     * 3 and 4 count: stops at eval 4 */
    const double gold[] = {0.30, 0.40, 0.25, 0.24, 0.23, 0.5}, rew[] = {0.25, 0.375, 0.5, 0.625, 0.75, 0.875};
    CHECK(run_seq(&G, gold, rew, 6, best) == 4);
    CHECK(best[0] == 0 && best[1] == 10 && best[4] == 10);
    CHECK(G.st.stopped && G.st.bad_evals == 2 && G.st.best_reward == 0.375); /* R_best: step 10's reward */
    /* the verdict's numbers: R_now the mean over the steps since the previous eval */
    trainer_guard_free(&G);
    core_recipe_release(&r);
    gold_guard(&G, &r, 1, 2.0);
    guard_verdict v;
    trainer_guard_judge(&G, 0.4, 0.02, &v);
    trainer_guard_commit(&G, 0, &v);
    for (int k = 0; k < 4; k++) trainer_guard_reward(&G, 0.1 * (k + 1));
    trainer_guard_judge(&G, 0.3, 0.02, &v);
    CHECK(v.fell && v.rose && v.stop && !v.new_best && v.r_best == 0.1);
    CHECK_NEAR(v.r_now, 0.25, 1e-15);
    trainer_guard_free(&G);
    core_recipe_release(&r);
}

TEST(guard_early_stop_does_not_trip) {
    core_recipe r;
    trainer_guard G;
    int64_t best[8];
    /* the gold falls but the training reward does not rise past the best eval's */
    const double gold[] = {0.40, 0.25, 0.24, 0.23, 0.22}, flat[] = {0.5, 0.5, 0.4375, 0.375, 0.25};
    gold_guard(&G, &r, 2, 2.0);
    CHECK(run_seq(&G, gold, flat, 5, best) == -1 && G.st.bad_evals == 0 && !G.st.stopped);
    trainer_guard_free(&G), core_recipe_release(&r);
    /* the training reward rises but the gold stays within 2 se of the difference (0.0566) of its best */
    const double near[] = {0.40, 0.36, 0.35, 0.36, 0.35}, up[] = {0.25, 0.375, 0.5, 0.625, 0.75};
    gold_guard(&G, &r, 2, 2.0);
    CHECK(run_seq(&G, near, up, 5, best) == -1 && G.st.bad_evals == 0);
    trainer_guard_free(&G), core_recipe_release(&r);
    /* a recovery in between resets the count */
    const double wobble[] = {0.40, 0.25, 0.38, 0.25, 0.38, 0.25};
    const double up6[] = {0.25, 0.375, 0.5, 0.625, 0.75, 0.875}; /* exact in binary: equal sums compare equal */
    gold_guard(&G, &r, 2, 2.0);
    CHECK(run_seq(&G, wobble, up6, 6, best) == -1 && G.st.bad_evals == 1);
    trainer_guard_free(&G), core_recipe_release(&r);
    /* a new best resets it too, and moves best */
    const double climb[] = {0.40, 0.25, 0.25, 0.50, 0.35, 0.35};
    gold_guard(&G, &r, 2, 2.0);
    CHECK(run_seq(&G, climb, up6, 6, best) == -1 && best[2] == 0 && best[3] == 30 && G.st.bad_evals == 1);
    trainer_guard_free(&G), core_recipe_release(&r);
    /* patience 0: the evals are counted, the run never stops */
    const double fall[] = {0.40, 0.25, 0.24, 0.23, 0.22};
    gold_guard(&G, &r, 0, 2.0);
    CHECK(run_seq(&G, fall, up, 5, best) == -1 && G.st.bad_evals == 3 && !G.st.stopped);
    trainer_guard_free(&G), core_recipe_release(&r);
}

TEST(guard_config_errors) {
    core_recipe r;
    trainer_guard G;
    const char *s1[] = {"guard.gold_scorers=[colour]"};
    load_recipe(&r, s1, 1);
    CHECK(trainer_guard_init(&G, &r, NULL) == -1 && strstr(core_last_error(), "guard.gold_scorers.0"));
    core_recipe_release(&r);
    /* gold color_match needs a colour in every eval prompt */
    const char *s2[] = {"guard.gold_scorers=[brightness, color_match]"};
    load_recipe(&r, s2, 1);
    const char *dir = test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/eval.txt", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f, "a red car\na house\n");
    fclose(f);
    core_prompts p;
    REQUIRE_OK(core_prompts_read(&p, path));
    CHECK(trainer_guard_init(&G, &r, &p) == -1 && strstr(core_last_error(), "eval.txt:2") &&
          strstr(core_last_error(), "color_match"));
    core_prompts_free(&p);
    core_recipe_release(&r);
}

TEST(guard_state_json_roundtrip) {
    guard_state s, t;
    memset(&s, 0, sizeof s);
    for (int i = 0; i < GUARD_NSTATS; i++)
        s.base_mean[i] = 1.0 / (3 + i), s.base_sd[i] = 0.1 * i, s.warn_from[i] = i == 2 ? 17 : -1,
        s.warn_sign[i] = i == 2 ? -1 : 0;
    s.have_base = 1, s.evals = 5, s.best_step = 30, s.best_lcb = -0.0, s.best_mean = 1e-300, s.best_se = 2.0 / 3;
    s.best_reward = 0.1, s.bad_evals = 2, s.reward_sum = 1.0 / 7, s.reward_n = 9;
    char *j = trainer_guard_state_json(&s);
    REQUIRE(j);
    REQUIRE_OK(trainer_guard_state_load(&t, j, "x"));
    CHECK(!memcmp(&s, &t, sizeof s)); /* every double bit for bit */
    free(j);
    CHECK(trainer_guard_state_load(&t, "{\"have_base\": true}", "st.json") == -1 &&
          strstr(core_last_error(), "st.json") && strstr(core_last_error(), "base_mean"));
    s.reward_sum = NAN;
    CHECK(trainer_guard_state_json(&s) == NULL);
}

/* ------------------------------------------------------------------------------------------------------------
 * end to end on the tiny model */

#define GUARD_SMALL                                                                                                \
    "--set rollout.num_steps=6 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 "              \
    "--set rollout.batch_size=3 --set algorithm.micro_batch_size=5 --set data.eval_samples_per_prompt=1 "         \
    "--set optim.total_steps=5"

static int run_tiny(const char *dir, const char *name, const char *extra, char *out, size_t cap) {
    return test_run(out, cap, "OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml --set model.path=%s/model "
                              "--set logging.run_dir=%s/%s " GUARD_SMALL " %s",
                    test_vgrpo_bin(), dir, dir, name, extra);
}

static double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static void make_model(const char *dir, int seed) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed %d", test_vgrpo_bin(), dir,
                     seed) == 0);
}

static int64_t best_of(const char *run) {
    int64_t b = -1;
    return trainer_ckpt_get_best(run, &b) == 1 ? b : -1;
}

TEST(guard_run_gold_metrics_and_best) {
    const char *dir = test_tmpdir();
    char out[32768], path[700];
    make_model(dir, 1);
    int rc = run_tiny(dir, "g", "--set logging.eval_every=1 --set checkpoint.every=2 --set checkpoint.total_limit=1 "
                                "--set \"guard.gold_scorers=[color_match, brightness]\" --set \"guard.gold_weights=[1, 0.5]\"",
                      out, sizeof out);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "exit %d: %s", rc, out), -1) : 0);
    CHECK_MSG(strstr(out, "gold @ step 0 (n=18): color_match ") && strstr(out, "best -> checkpoint-0"), "got: %s", out);
    json_t *rows[8];
    snprintf(path, sizeof path, "%s/g/metrics.jsonl", dir);
    REQUIRE(read_rows(path, rows, 8, 0) == 6); /* 5 steps + the final eval */
    int64_t best = -1;
    double best_lcb = -1e300;
    for (int i = 0; i < 6; i++) {
        const double m = num(rows[i], "gold/score/mean"), se = num(rows[i], "gold/score/se");
        CHECK(isfinite(num(rows[i], "gold/color_match/mean")) && isfinite(num(rows[i], "gold/brightness/se")));
        /* the gold score: 1 x color_match + 0.5 x brightness, per video, then mean */
        CHECK_NEAR(m, num(rows[i], "gold/color_match/mean") + 0.5 * num(rows[i], "gold/brightness/mean"), 1e-12);
        CHECK(num(rows[i], "gold/lcb") == m - 1.96 * se);
        /* gold and eval are apart: eval/ has the training scorer only */
        CHECK_NEAR(num(rows[i], "eval/color_match/mean"), num(rows[i], "gold/color_match/mean"), 1e-6);
        CHECK(!json_object_get(rows[i], "eval/brightness/mean") && !json_object_get(rows[i], "guard/stopped"));
        if (m - 1.96 * se > best_lcb) best_lcb = m - 1.96 * se, best = i;
        CHECK(num(rows[i], "gold/best_step") == best && num(rows[i], "gold/best_lcb") == best_lcb);
        if (i < 5) CHECK(isfinite(num(rows[i], "stats/hf_energy/mean")) && isfinite(num(rows[i], "stats/motion/drift_sd")));
    }
    for (int i = 0; i < 6; i++) json_decref(rows[i]);
    /* best/ -> checkpoint-<best>; total_limit 1 keeps the newest (5) and best's target */
    snprintf(path, sizeof path, "%s/g", dir);
    CHECK_MSG(best_of(path) == best, "best link %lld, metrics say %lld", (long long)best_of(path), (long long)best);
    int64_t *steps = NULL;
    const int n = trainer_ckpt_list(path, &steps);
    CHECK_MSG(n == (best == 5 ? 1 : 2) && steps[n - 1] == 5 && steps[0] == best, "%d checkpoints", n);
    free(steps);
    /* eval --checkpoint best opens it */
    CHECK(test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml --set model.path=%s/model %s --checkpoint %s/g/best "
                                    "--out %s/ev --workers 1", test_vgrpo_bin(), dir, GUARD_SMALL, dir, dir) == 0);
}

/* Rows of two runs equal (time/ aside); names the first difference. */
static void same_rows(const char *a, const char *b, int want) {
    json_t *ra[16], *rb[16];
    const int na = read_rows(a, ra, 16, 0), nb = read_rows(b, rb, 16, 0);
    CHECK_MSG(na == want && nb == want, "%d and %d rows, expected %d", na, nb, want);
    for (int i = 0; i < na && i < nb; i++) {
        if (!json_equal(ra[i], rb[i])) {
            char *x = json_dumps(ra[i], JSON_SORT_KEYS), *y = json_dumps(rb[i], JSON_SORT_KEYS);
            test_fail(__FILE__, __LINE__, "row %d differs:\n%s\n%s", i, x, y);
            free(x), free(y);
        }
    }
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
}

TEST(guard_resume_equals_straight) {
    const char *dir = test_tmpdir();
    char out[32768], a[700], b[700];
    make_model(dir, 1);
    /* gold brightness with patience 1 and k = 0: this model's gold eval falls at step 3 while the reward rose */
    const char *g = "--set logging.eval_every=1 --set checkpoint.every=1 --set checkpoint.total_limit=1 "
                    "--set guard.gold_scorers=[brightness] --set guard.patience=1 --set guard.patience_se=0";
    char extra[1024];
    REQUIRE(run_tiny(dir, "a", g, out, sizeof out) == 0);
    const int tripped = strstr(out, "guard: stopping after the eval at step") != NULL;
    snprintf(extra, sizeof extra, "%s --steps 2", g);
    REQUIRE(run_tiny(dir, "b", extra, out, sizeof out) == 0);
    snprintf(extra, sizeof extra, "%s --resume %s/b", g, dir);
    int rc = run_tiny(dir, "b", extra, out, sizeof out);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "exit %d: %s", rc, out), -1) : 0);
    CHECK_MSG(strstr(out, "resumed from") && strstr(out, "checkpoint-2"), "got: %s", out);
    CHECK(tripped == (strstr(out, "guard: stopping after the eval at step") != NULL));
    snprintf(a, sizeof a, "%s/a/metrics.jsonl", dir);
    snprintf(b, sizeof b, "%s/b/metrics.jsonl", dir);
    json_t *rows[16];
    const int n = read_rows(a, rows, 16, 0);
    REQUIRE(n >= 3);
    const int stopped_row = num(rows[n - 1], "guard/stopped") == 1;
    CHECK(stopped_row == tripped);
    for (int i = 0; i < n; i++) json_decref(rows[i]);
    same_rows(a, b, n);
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    CHECK(best_of(a) >= 0 && best_of(a) == best_of(b));
    int64_t *sa = NULL, *sb = NULL;
    const int na = trainer_ckpt_list(a, &sa), nb = trainer_ckpt_list(b, &sb);
    CHECK(na == nb && na > 0 && !memcmp(sa, sb, sizeof(int64_t) * (size_t)na));
    /* the last checkpoints hold the same guard state and weights */
    if (na == nb && na > 0)
        CHECK(test_run(out, sizeof out, "cmp %s/checkpoint-%lld/transformer/diffusion_pytorch_model.safetensors "
                                        "%s/checkpoint-%lld/transformer/diffusion_pytorch_model.safetensors && "
                                        "grep -o '\"guard\".*' %s/checkpoint-%lld/trainer_state.json > /dev/null",
                       a, (long long)sa[na - 1], b, (long long)sb[nb - 1], a, (long long)sa[na - 1]) == 0);
    free(sa), free(sb);
}

TEST(guard_stats_never_change_training) {
    const char *dir = test_tmpdir();
    char out[32768], p[700], q[700];
    make_model(dir, 2);
    REQUIRE(run_tiny(dir, "on", "--set logging.eval_every=2 --set checkpoint.every=5", out, sizeof out) == 0);
    REQUIRE(run_tiny(dir, "off", "--set logging.eval_every=2 --set checkpoint.every=5 --set guard.video_stats=false",
                     out, sizeof out) == 0);
    REQUIRE(run_tiny(dir, "gold", "--set logging.eval_every=2 --set checkpoint.every=5 "
                                  "--set guard.gold_scorers=[colorfulness]", out, sizeof out) == 0);
    /* rows equal once stats/ and gold/ fields are dropped; rewards.jsonl, weights and Adam state equal byte for byte */
    const char *runs[3] = {"on", "off", "gold"};
    json_t *rows[3][8];
    int n[3];
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/%s/metrics.jsonl", dir, runs[k]);
        n[k] = read_rows(p, rows[k], 8, 0);
        REQUIRE(n[k] == 6);
        for (int i = 0; i < 6; i++) {
            const char *key;
            json_t *v;
            void *tmp;
            int had = 0;
            json_object_foreach_safe(rows[k][i], tmp, key, v) {
                if (!strncmp(key, "stats/", 6) || !strncmp(key, "gold/", 5)) had = 1, json_object_del(rows[k][i], key);
            }
            if (i < 5 && k != 1) CHECK_MSG(had, "%s row %d has no stats/", runs[k], i);
        }
    }
    for (int i = 0; i < 6; i++) {
        CHECK_MSG(json_equal(rows[0][i], rows[1][i]) && json_equal(rows[0][i], rows[2][i]), "row %d differs", i);
        for (int k = 0; k < 3; k++) json_decref(rows[k][i]);
    }
    for (int k = 1; k < 3; k++) {
        snprintf(p, sizeof p, "%s/on", dir);
        snprintf(q, sizeof q, "%s/%s", dir, runs[k]);
        CHECK_MSG(test_run(out, sizeof out, "cmp %s/rewards.jsonl %s/rewards.jsonl && "
                                            "cmp %s/checkpoint-5/transformer/diffusion_pytorch_model.safetensors "
                                            "%s/checkpoint-5/transformer/diffusion_pytorch_model.safetensors && "
                                            "cmp %s/checkpoint-5/optimizer.safetensors %s/checkpoint-5/optimizer.safetensors",
                                   p, q, p, q, p, q) == 0, "%s: %s", runs[k], out);
    }
}

TEST(guard_colocated_equals_local) {
    const char *dir = test_tmpdir();
    char out[32768], a[700], b[700];
    make_model(dir, 3);
    /* the eval's and the training rollouts' videos come from the worker: the same gold/ and stats/ numbers, best */
    const char *g = "--set logging.eval_every=2 --set checkpoint.every=2 --set guard.gold_scorers=[color_match] "
                    "--set guard.patience=3 --steps 3";
    char extra[1024];
    REQUIRE(run_tiny(dir, "local", g, out, sizeof out) == 0);
    snprintf(extra, sizeof extra, "%s --set mode=colocated", g);
    int rc = run_tiny(dir, "col", extra, out, sizeof out);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "exit %d: %s", rc, out), -1) : 0);
    CHECK_MSG(strstr(out, "vgrpo run (colocated)") && strstr(out, "gold @ step 2"), "got: %s", out);
    snprintf(a, sizeof a, "%s/local/metrics.jsonl", dir);
    snprintf(b, sizeof b, "%s/col/metrics.jsonl", dir);
    json_t *ra[8], *rb[8];
    const int na = read_rows(a, ra, 8, 1), nb = read_rows(b, rb, 8, 1);
    CHECK_MSG(na == 4 && nb == 4, "%d and %d rows", na, nb);
    for (int i = 0; i < na && i < nb; i++) {
        CHECK_MSG(json_equal(ra[i], rb[i]), "row %d differs between local and colocated", i);
        if (i < 3) CHECK(isfinite(num(ra[i], "stats/saturation/mean")));
    }
    CHECK(na > 0 && isfinite(num(ra[0], "gold/color_match/se")) && num(ra[0], "guard/bad_evals") == 0);
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
    snprintf(a, sizeof a, "%s/local", dir);
    snprintf(b, sizeof b, "%s/col", dir);
    CHECK(best_of(a) >= 0 && best_of(a) == best_of(b));
}

/* ------------------------------------------------------------------------------------------------------------
 * slow: the hackable recipe trips the guard, the demo's does not */

/* Prints the lines of a run's output that start with one of the prefixes. */
static void show(const char *what, int rc, char *out) {
    fprintf(stderr, "  %s (exit %d):\n", what, rc);
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n"))
        if (!strncmp(l, "gold @", 6) || !strncmp(l, "guard: stop", 11) || !strncmp(l, "checkpoint ", 11))
            fprintf(stderr, "    %s\n", l);
}

TEST(guard_hack_recipe_trips_slow) {
    TEST_SLOW();
    const char *dir = test_tmpdir();
    char *out = malloc(1 << 20), path[700];
    REQUIRE(out);
    make_model(dir, 0);
    /* the demo recipe (a reward that does not hack) with the hack recipe's guard: never trips */
    int rc = test_run(out, 1 << 20, "%s run recipes/tiny-cpu.yaml --set model.path=%s/model --set logging.run_dir=%s/demo "
                                    "--set logging.eval_every=10 --set guard.gold_scorers=[color_match] "
                                    "--set guard.patience=2 --set guard.patience_se=2", test_vgrpo_bin(), dir, dir);
    show("demo recipe", rc, out);
    REQUIRE(rc == 0);
    json_t *rows[200];
    snprintf(path, sizeof path, "%s/demo/metrics.jsonl", dir);
    int n = read_rows(path, rows, 200, 0);
    REQUIRE(n == 151);
    for (int i = 0; i < n; i++) {
        CHECK_MSG(!(num(rows[i], "guard/stopped") == 1), "the demo run stopped at step %d", i);
        json_decref(rows[i]);
    }
    /* the hackable recipe from the demo's trained weights (its header's set-up) */
    REQUIRE(test_run(out, 1 << 20, "cp -r %s/model %s/trained && cp %s/demo/checkpoint-150/transformer/* "
                                    "%s/trained/transformer/", dir, dir, dir, dir) == 0);
    rc = test_run(out, 1 << 20, "%s run recipes/tiny-cpu-hack.yaml --set model.path=%s/trained "
                                "--set logging.run_dir=%s/hack", test_vgrpo_bin(), dir, dir);
    show("hack recipe", rc, out);
    REQUIRE(rc == 0);
    snprintf(path, sizeof path, "%s/hack/metrics.jsonl", dir);
    n = read_rows(path, rows, 200, 0);
    REQUIRE(n > 1);
    json_t *last = rows[n - 1];
    CHECK_MSG(num(last, "guard/stopped") == 1, "the hackable run was not stopped (last row: step %g)", num(last, "step"));
    const int64_t stop = (int64_t)num(last, "step"), best = (int64_t)num(last, "gold/best_step");
    CHECK(stop < 150 && n == stop + 1);
    /* the training reward rose while the gold eval fell from its best */
    CHECK(num(rows[stop - 1], "reward/mean") > num(rows[best], "reward/mean"));
    CHECK(num(last, "gold/score/mean") < num(rows[best], "gold/score/mean"));
    fprintf(stderr, "  hack: training reward %.4f (step %lld) -> %.4f (step %lld); gold color_match %.4f +- %.4f "
                    "(step %lld) -> %.4f +- %.4f (step %lld)\n", num(rows[best], "reward/mean"), (long long)best,
            num(rows[stop - 1], "reward/mean"), (long long)(stop - 1), num(rows[best], "gold/score/mean"),
            num(rows[best], "gold/score/se"), (long long)best, num(last, "gold/score/mean"), num(last, "gold/score/se"),
            (long long)stop);
    for (int i = 0; i < n; i++) json_decref(rows[i]);
    snprintf(path, sizeof path, "%s/hack", dir);
    CHECK_MSG(best_of(path) == best && best < stop, "best -> %lld, best gold eval at %lld, stopped at %lld",
              (long long)best_of(path), (long long)best, (long long)stop);
    snprintf(path, sizeof path, "%s/hack/checkpoint-%lld/trainer_state.json", dir, (long long)best);
    struct stat sb;
    CHECK_MSG(stat(path, &sb) == 0, "%s missing", path);
    fprintf(stderr, "  hack: stopped at step %lld, best -> checkpoint-%lld\n", (long long)stop, (long long)best);
    free(out);
}
