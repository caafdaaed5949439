/* tests/test_sde_window.c — SDE windows, the cps step and GRPO-Guard end to end: the window schedules
 * (trainer/step/sde_window.h: Flow-GRPO-Fast's random start from Philox stream 7, MixGRPO's progressive window with clamp
 * and restart), the recipe refusals, `vgrpo parity` exactly 0 for every variant (sde/cps, exact/flow_grpo log-prob,
 * windows random/progressive, grpo/grpo_guard, CFG-free), also with 2 workers and 2 trainer ranks, and a resumed run
 * across window shifts equal to a straight one. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "core/recipe.h"
#include "tests/metrics_rows.h"
#include "tests/ckpt_cmp.h"
#include "tests/test.h"
#include "trainer/step/sde_window.h"

static void load(core_recipe *r, const char *const *sets, int n) {
    REQUIRE_OK(core_recipe_load(r, "recipes/tiny-cpu.yaml", sets, n));
}

TEST(sde_window_random_draws) {
    core_recipe r;
    const char *sets[] = {"rollout.num_steps=10", "rollout.sde_window.size=2", "data.seed=5"};
    load(&r, sets, 3);
    sde_window w;
    REQUIRE_OK(sde_window_from_recipe(&r, &w));
    CHECK(w.lo == 0 && w.hi == 9 && w.size == 2); /* default range [0, num_steps - 1] */
    int seen[10] = {0};
    for (int64_t k = 0; k < 400; k++) {
        int lo, hi, lo2, hi2;
        sde_window_of_round(&w, 10, k, &lo, &hi);
        sde_window_of_round(&w, 10, k, &lo2, &hi2);
        CHECK(lo == lo2 && hi == hi2 && hi == lo + 2 && lo >= 0 && hi <= 9);
        /* the start is Philox stream 7's uniform of (seed, slot 0, uid = round): the same on every process */
        double u;
        core_philox_uniform(&u, 1, 5, 0, (uint32_t)k, CORE_STREAM_SDE_WINDOW);
        CHECK(lo == (int)(u * 8));
        seen[lo]++;
    }
    for (int s = 0; s <= 7; s++) CHECK_MSG(seen[s] > 20, "start %d drawn %d times in 400", s, seen[s]);
    CHECK(seen[8] == 0 && seen[9] == 0);
    /* without a window: every step */
    core_recipe_release(&r);
    load(&r, sets, 1);
    REQUIRE_OK(sde_window_from_recipe(&r, &w));
    int lo, hi;
    sde_window_of_round(&w, 10, 3, &lo, &hi);
    CHECK(lo == 0 && hi == 10);
    core_recipe_release(&r);
}

TEST(sde_window_progressive_schedule) {
    core_recipe r;
    /* MixGRPO: window 2 over [0, 8), moving by 1 every 2 optimizer steps; 2 updates per round -> one move per round */
    const char *sets[] = {"rollout.num_steps=10", "rollout.sde_window.size=2", "rollout.sde_window.range=[0, 8]",
                          "rollout.sde_window.schedule=progressive", "rollout.sde_window.shift=1",
                          "rollout.sde_window.iters_per_window=2", "algorithm.optimizer_steps_per_rollout=2",
                          "rollout.sde_window.at_end=clamp"};
    load(&r, sets, 8);
    sde_window w;
    REQUIRE_OK(sde_window_from_recipe(&r, &w));
    const int clamp[10] = {0, 1, 2, 3, 4, 5, 6, 6, 6, 6};
    for (int k = 0; k < 10; k++) {
        int lo, hi;
        sde_window_of_round(&w, 10, k, &lo, &hi);
        CHECK_MSG(lo == clamp[k] && hi == lo + 2, "round %d: [%d, %d)", k, lo, hi);
    }
    w.restart = 1;
    const int restart[10] = {0, 1, 2, 3, 4, 5, 6, 0, 1, 2};
    for (int k = 0; k < 10; k++) {
        int lo, hi;
        sde_window_of_round(&w, 10, k, &lo, &hi);
        CHECK_MSG(lo == restart[k], "round %d: start %d, want %d", k, lo, restart[k]);
    }
    /* shift 0 = the window's size (MixGRPO without overlap), 3 iterations per position, 1 update per round */
    core_recipe_release(&r);
    const char *sets2[] = {"rollout.num_steps=10", "rollout.sde_window.size=3", "rollout.sde_window.schedule=progressive",
                           "rollout.sde_window.iters_per_window=3"};
    load(&r, sets2, 4);
    REQUIRE_OK(sde_window_from_recipe(&r, &w));
    const int want[12] = {0, 0, 0, 3, 3, 3, 6, 6, 6, 6, 6, 6}; /* range [0, 9): positions 0, 3, 6 */
    for (int k = 0; k < 12; k++) {
        int lo, hi;
        sde_window_of_round(&w, 10, k, &lo, &hi);
        CHECK_MSG(lo == want[k] && hi == lo + 3, "round %d: [%d, %d)", k, lo, hi);
    }
    core_recipe_release(&r);
}

/* What a recipe may not combine, refused at start-up (--dry-run) naming the key. */
TEST(sde_window_recipe_refusals) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[8192];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    struct {
        const char *sets, *want;
    } bad[] = {
        {"--set rollout.sde_window.size=2 --set 'algorithm.timestep_selection=first_fraction 0.5'",
         "algorithm.timestep_selection: \"first_fraction 0.5\" picks steps by index"},
        {"--set rollout.sde_window.size=2 --set 'algorithm.timestep_selection=random_k 3'", "random_k 3, but rollout.sde_window.size is 2"},
        {"--set rollout.sde_window.size=5 --set 'rollout.sde_window.range=[2, 6]'", "rollout.sde_window.size: 5 steps do not fit"},
        {"--set 'rollout.sde_window.range=[3, 3]'", "rollout.sde_window.range: [3, 3]"},
        {"--set 'rollout.sde_window.range=[0, 1, 2]'", "must be [lo, hi]"},
        {"--set rollout.sde_type=cps --set algorithm.loss=grpo_guard", "algorithm.loss: grpo_guard is defined for rollout.sde_type sde"},
        {"--set algorithm.cps_logprob=flow_grpo", "algorithm.cps_logprob: flow_grpo"},
        {"--set rollout.sde_type=cps --set rollout.eta=1.5", "rollout.eta: 1.5 with rollout.sde_type cps"},
        {"--set rollout.sde_type=ode", "rollout.sde_type"},
        /* cps: the last step has no noise (sigma_next 0), so a window of the last step alone trains nothing */
        {"--set rollout.sde_type=cps --set rollout.sde_window.size=1 --set 'rollout.sde_window.range=[3, 4]' --set rollout.num_steps=4",
         "rollout.sde_window: the window at steps 3..3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/model %s", bin,
                                dir, bad[i].sets);
        CHECK_MSG(st != 0 && strstr(out, bad[i].want), "%s: exit %d, want \"%s\", got: %s", bad[i].sets, st, bad[i].want,
                  out);
    }
    const int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/model --set "
                            "rollout.sde_window.size=2 --set 'algorithm.timestep_selection=random_k 1' --set "
                            "rollout.sde_type=cps --set algorithm.cps_logprob=flow_grpo", bin, dir);
    CHECK_MSG(st == 0, "a good windowed cps recipe: %s", out);
}

static void check_zero(const char *path, int want_steps) {
    json_t *j = json_load_file(path, 0, NULL);
    REQUIRE(j);
    CHECK(json_is_true(json_object_get(j, "pass")));
    CHECK(json_real_value(json_object_get(j, "max_abs_dlogp")) == 0.0 && json_real_value(json_object_get(j, "max_abs_dv")) == 0.0);
    CHECK_MSG((int)json_array_size(json_object_get(j, "steps")) == want_steps, "%s: %d steps, want %d", path,
              (int)json_array_size(json_object_get(j, "steps")), want_steps);
    json_decref(j);
}

/* Parity exactly 0 for every variant, with 1 worker / 1 rank and with 2 workers / 2 ranks (3 samples per rollout
 * forward, 5 transitions per training forward). Trained steps: a window's (2 of 5, or 3), cps has no log-prob at the
 * last step (sigma_next 0). */
TEST(sde_window_parity_variants) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2048], p[700];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    snprintf(base, sizeof base, "--set mode=colocated --set model.path=%s/model --set rollout.num_steps=5 --set "
             "rollout.prompts_per_step=2 --set rollout.samples_per_prompt=3", dir);
    struct {
        const char *name, *sets;
        int steps;
    } v[] = {
        {"cps", "--set rollout.sde_type=cps", 4},
        {"cps_fg", "--set rollout.sde_type=cps --set algorithm.cps_logprob=flow_grpo --set algorithm.beta=0.01", 4},
        {"win_rand", "--set rollout.sde_window.size=2", 2},
        {"win_prog", "--set rollout.sde_window.size=3 --set rollout.sde_window.schedule=progressive --set rollout.sde_type=cps", 3},
        {"guard", "--set algorithm.loss=grpo_guard --set algorithm.beta=0.01", 5},
        {"guard_win", "--set algorithm.loss=grpo_guard --set rollout.sde_window.size=2 --set 'algorithm.timestep_selection=random_k 1'", 2},
        {"cfg_free", "--set rollout.guidance_scale=1 --set rollout.sde_window.size=2", 2},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        for (int par = 0; par < 2; par++) {
            const char *more = par ? "--set parallel.rollout_workers=2 --set rollout.batch_size=3 --set "
                                     "parallel.trainer_ranks=2 --set algorithm.micro_batch_size=5"
                                   : "";
            const int st = test_run(out, sizeof out, "%s parity recipes/tiny-cpu.yaml %s %s %s --set logging.run_dir=%s/%s%d",
                                    bin, base, v[i].sets, more, dir, v[i].name, par);
            CHECK_MSG(st == 0 && strstr(out, "PASS"), "%s (%s): exit %d: %s", v[i].name, par ? "2 workers, 2 ranks" : "1, 1",
                      st, out);
            snprintf(p, sizeof p, "%s/%s%d/parity.json", dir, v[i].name, par);
            if (st == 0) check_zero(p, v[i].steps);
        }
}

/* MixGRPO's window moves every optimizer step (shift 1, iters 1, restart): 2 steps, a checkpoint, a resume for 2 more
 * equals 4 straight steps row for row and the checkpoint-4 files byte for byte, also under GRPO-Guard with cps off. */
TEST(sde_window_resume_across_shifts) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2048], a[700], b[700];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    snprintf(base, sizeof base,
             "%s run recipes/tiny-cpu.yaml --set model.path=%s/model --set rollout.num_steps=5 --set "
             "rollout.prompts_per_step=2 --set rollout.samples_per_prompt=3 --set data.eval_samples_per_prompt=1 --set "
             "optim.total_steps=4 --set checkpoint.every=2 --set rollout.sde_window.size=2 --set "
             "rollout.sde_window.schedule=progressive --set rollout.sde_window.shift=1 --set "
             "rollout.sde_window.at_end=restart --set 'rollout.sde_window.range=[0, 4]' --set algorithm.loss=grpo_guard "
             "--set algorithm.beta=0.01",
             bin, dir);
    REQUIRE_OK(test_run(out, sizeof out, "%s --set logging.run_dir=%s/a --steps 2", base, dir) ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    REQUIRE_OK(test_run(out, sizeof out, "%s --set logging.run_dir=%s/a --resume %s/a", base, dir, dir) ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    CHECK_MSG(strstr(out, "step 2 of 4") && !strstr(out, "step 1 of 4"), "got: %s", out);
    REQUIRE_OK(test_run(out, sizeof out, "%s --set logging.run_dir=%s/b", base, dir) ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    const char *files[] = {"transformer/diffusion_pytorch_model.safetensors", "optimizer.safetensors", "trainer_state.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "%s/a/checkpoint-4/%s", dir, files[i]);
        snprintf(b, sizeof b, "%s/b/checkpoint-4/%s", dir, files[i]);
        CHECK_MSG(ckpt_file_cmp(out, sizeof out, a, b) == 0, "%s differs: %s", files[i], out);
    }
    json_t *ra[8], *rb[8];
    snprintf(a, sizeof a, "%s/a/metrics.jsonl", dir);
    snprintf(b, sizeof b, "%s/b/metrics.jsonl", dir);
    const int na = read_rows(a, ra, 8, 0), nb = read_rows(b, rb, 8, 0);
    CHECK_MSG(na == 5 && nb == 5, "rows: resumed %d, straight %d", na, nb);
    for (int i = 0; i < na && i < nb; i++) CHECK_MSG(json_equal(ra[i], rb[i]), "metrics row %d differs", i);
    /* the window moved every step: 4 different training sets, so the transitions are 2 per sample each step */
    for (int i = 0; i < na - 1; i++) CHECK(json_integer_value(json_object_get(ra[i], "transitions")) == 12);
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
}

/* Flow-GRPO-Fast on the tiny recipe (make test-slow): a window of 2 of the 8 steps learns at least as fast per second
 * of step time (rollout + training) as the full trajectory. 60 GRPO steps each, eval every 15; the gain per second is
 * (eval color_match at the end - at step 0) / (sum of time/step_s). Prints both curves (step, seconds, eval). */
static double curve(const char *dir, const char *name, double *gain) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, name);
    FILE *f = fopen(path, "r");
    REQUIRE(f);
    static char line[1 << 16];
    double t = 0, e0 = -1, e1 = -1;
    fprintf(stderr, "  %s:", name);
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o) break;
        const json_t *ev = json_object_get(o, "eval/color_match/mean");
        if (ev) {
            e1 = json_number_value(ev);
            if (e0 < 0) e0 = e1;
            fprintf(stderr, " (%lld, %.1fs, %.4f)", (long long)json_integer_value(json_object_get(o, "step")), t, e1);
        }
        const json_t *st = json_object_get(o, "time/step_s");
        if (st) t += json_number_value(st);
        json_decref(o);
    }
    fclose(f);
    fprintf(stderr, "\n");
    *gain = (e1 - e0) / t;
    return t;
}

TEST(sde_window_fast_learns_per_second_slow) {
    TEST_SLOW();
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[1 << 14];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    const char *c = "--set optim.total_steps=60 --set logging.eval_every=15 --set checkpoint.every=-1";
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.path=%s/model %s --set logging.run_dir=%s/full",
                     bin, dir, c, dir) == 0);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.path=%s/model %s --set "
                     "rollout.sde_window.size=2 --set logging.run_dir=%s/window2", bin, dir, c, dir) == 0);
    double gf, gw;
    const double tf = curve(dir, "full", &gf), tw = curve(dir, "window2", &gw);
    fprintf(stderr, "  eval gain per second of step time: full %.5f/s over %.1fs, window 2 %.5f/s over %.1fs\n", gf, tf,
            gw, tw);
    CHECK(gf > 0 && gw >= gf);
}
