/* tests/test_run.c — end-to-end `vgrpo run` in local mode on the tiny preset (umT5 + VAE, and the word-embedding +
 * latent-to-RGB path; B = 2 prompts x G = 4 samples,
 * latent 16 x 2 x 8 x 8 = 32 tokens, 6 denoising steps, CFG 4.5, beta > 0, 2 optimizer steps per rollout,
 * training micro-batch 5 transitions vs rollout batch 3 samples), and the recipe's errors.
 * Checks: log_prob_mean_abs_diff is exactly 0 on the first update of every batch and not 0 on the off-policy second
 * update; at step 0 most groups have reward std > 0 (umT5 conditioning, VAE decoding, the empty negative prompt); eval rows at start and end; two runs with the same seed and
 * recipe give the same metrics bit for bit (time/ fields aside), also with 1 vs 2 threads, and another seed does not; recipe errors name the
 * key and line. The slow test (make test-slow) runs recipes/tiny-cpu.yaml and requires the eval color_match to
 * rise by more than 3 standard errors of the difference. */
#include <jansson.h>
#include <string.h>

#include "tests/metrics_rows.h"
#include "tests/test.h"

/* Reads metrics.jsonl: rows[] (json objects, caller decrefs), returns count. Timing fields (time/...) removed. */

static double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* A tiny model folder with init seed `seed` in dir/model. */
static void make_model(const char *dir, int seed) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed %d", test_vgrpo_bin(), dir,
                     seed) == 0);
}

#define SMALL                                                                                                      \
    "--set rollout.num_steps=6 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 "               \
    "--set rollout.batch_size=3 --set algorithm.micro_batch_size=5 --set algorithm.beta=0.05 "                     \
    "--set algorithm.optimizer_steps_per_rollout=2 --set data.eval_samples_per_prompt=1 --set logging.eval_every=0 " \
    "--set optim.total_steps=3"

static int run_small(const char *dir, const char *name, int threads, const char *extra, char *out, size_t cap) {
    return test_run(out, cap, "OMP_NUM_THREADS=%d %s run recipes/tiny-cpu.yaml --set model.path=%s/model "
                              "--set logging.run_dir=%s/%s " SMALL " %s",
                    threads, test_vgrpo_bin(), dir, dir, name, extra);
}

TEST(run_local_parity_and_determinism) {
    const char *dir = test_tmpdir();
    char out[16384], path[700];
    make_model(dir, 1);
    int rc = run_small(dir, "a", 1, "", out, sizeof out);
    REQUIRE_OK(rc != 0 ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    CHECK(strstr(out, "step 2 of 3") != NULL && strstr(out, "eval @ step 0") != NULL);
    REQUIRE(run_small(dir, "b", 2, "", out, sizeof out) == 0);
    REQUIRE(run_small(dir, "c", 1, "--set data.seed=7", out, sizeof out) == 0);
    /* the word-embedding + latent-to-RGB path still runs, on-policy first update exact, and differs from umT5 + VAE */
    REQUIRE(run_small(dir, "d", 2, "--set model.text_encoder=word_embed --set model.decoder=latent_rgb", out,
                      sizeof out) == 0);
    CHECK_MSG(strstr(out, "(word_embed, latent_rgb)") != NULL, "got: %s", out);
    json_t *a[8], *b[8], *c[8];
    snprintf(path, sizeof path, "%s/a/metrics.jsonl", dir);
    int na = read_rows(path, a, 8, 0);
    snprintf(path, sizeof path, "%s/b/metrics.jsonl", dir);
    int nb = read_rows(path, b, 8, 0);
    snprintf(path, sizeof path, "%s/c/metrics.jsonl", dir);
    int nc = read_rows(path, c, 8, 0);
    REQUIRE(na == 4 && nb == 4 && nc == 4); /* 3 steps + the final eval row */
    for (int i = 0; i < 3; i++) {
        CHECK(num(a[i], "step") == i && num(a[i], "policy_version") == 2 * i);
        CHECK_MSG(num(a[i], "log_prob_mean_abs_diff") == 0.0, "step %d: log_prob_mean_abs_diff %g", i,
                  num(a[i], "log_prob_mean_abs_diff"));
        CHECK(num(a[i], "offpolicy_last/log_prob_mean_abs_diff") > 0); /* second update: off-policy */
        CHECK(num(a[i], "transitions") == 48);
        CHECK(isfinite(num(a[i], "grad_norm")) && num(a[i], "lr") > 0);
    }
    /* step 0: advantages carry signal: no group with all-equal rewards, positive within-group std */
    CHECK(num(a[0], "masked_fraction") < 0.5 && num(a[0], "reward/group_std_mean") > 0);
    CHECK(num(a[0], "eval/n") == 18 && isfinite(num(a[0], "eval/color_match/mean")));
    CHECK(num(a[3], "step") == 3 && num(a[3], "policy_version") == 6 && isfinite(num(a[3], "eval/color_match/mean")));
    CHECK(num(a[0], "kl") == 0.0); /* first update of step 0: the policy is the reference */
    CHECK(num(a[1], "kl") > 0 && num(a[2], "kl") > 0); /* weights moved from the reference */
    for (int i = 0; i < 4; i++) {
        CHECK_MSG(json_equal(a[i], b[i]), "row %d differs between two identical runs (1 and 2 threads)", i);
        if (i < 3) CHECK_MSG(!json_equal(a[i], c[i]), "row %d: another seed gives the same metrics", i);
    }
    json_t *d[8];
    snprintf(path, sizeof path, "%s/d/metrics.jsonl", dir);
    int nd = read_rows(path, d, 8, 0);
    REQUIRE(nd == 4);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(num(d[i], "log_prob_mean_abs_diff") == 0.0, "word_embed step %d: log_prob_mean_abs_diff %g", i,
                  num(d[i], "log_prob_mean_abs_diff"));
        CHECK(num(d[i], "transitions") == 48);
    }
    CHECK(num(d[0], "eval/color_match/mean") != num(a[0], "eval/color_match/mean"));
    for (int i = 0; i < 4; i++) json_decref(a[i]), json_decref(b[i]), json_decref(c[i]), json_decref(d[i]);
    snprintf(path, sizeof path, "%s/a/config.resolved.yaml", dir);
    CHECK(test_run(out, sizeof out, "grep -q 'micro_batch_size: 5' %s", path) == 0);
}

TEST(run_recipe_errors) {
    const char *dir = test_tmpdir();
    char out[8192], path[700];
    const char *bin = test_vgrpo_bin();
    snprintf(path, sizeof path, "%s/typo.yaml", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f, "mode: local\nmodel:\n  path: %s/none\ndata:\n  prompt_file: recipes/prompts/colors.txt\nrollout:\n"
               "  num_steps: 6\n  nm_steps: 3\n", dir);
    fclose(f);
    CHECK(test_run(out, sizeof out, "%s run %s --dry-run", bin, path) == 1);
    CHECK_MSG(strstr(out, "typo.yaml:8") && strstr(out, "unknown key \"rollout.nm_steps\""), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set \"algorithm.timestep_selection=first_fraction 0.1\"", bin) == 1);
    CHECK_MSG(strstr(out, "algorithm.timestep_selection"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set \"algorithm.timestep_selection=random_k 9\"", bin) == 1);
    CHECK_MSG(strstr(out, "algorithm.timestep_selection"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set rollout.frames=6", bin) == 1);
    CHECK_MSG(strstr(out, "rollout.frames"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set parallel.trainer_ranks=2", bin) == 1);
    CHECK_MSG(strstr(out, "parallel.trainer_ranks"), "got: %s", out);
    /* word_embed: one row per word, a longer prompt is an error (umt5 truncates, as WanPipeline does) */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set rollout.text_len=3 "
                                    "--set model.text_encoder=word_embed", bin) == 1);
    CHECK_MSG(strstr(out, "rollout.text_len") && strstr(out, "colors.txt"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set reward.scorers=[colour]", bin) == 1);
    CHECK_MSG(strstr(out, "reward.scorers"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set rollout.text_len=3", bin) == 0);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.decoder=rgb", bin) == 1);
    CHECK_MSG(strstr(out, "model.decoder"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.text_encoder=t5", bin) == 1);
    CHECK_MSG(strstr(out, "model.text_encoder"), "got: %s", out);
    /* a pipeline without tokenizer.json (umt5) or without vae/ (vae): errors naming the key */
    make_model(dir, 3);
    CHECK(test_run(out, sizeof out, "rm %s/model/tokenizer/tokenizer.json && mv %s/model/vae %s/model/novae", dir, dir,
                   dir) == 0);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.path=%s/model --set logging.run_dir=%s/r1",
                   bin, dir, dir) == 1);
    CHECK_MSG(strstr(out, "model.decoder") && strstr(out, "vae"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.path=%s/model --set logging.run_dir=%s/r2 "
                                    "--set model.decoder=latent_rgb", bin, dir, dir) == 1);
    CHECK_MSG(strstr(out, "model.text_encoder") && strstr(out, "tokenizer.json"), "got: %s", out);
    /* dry run: valid, prints every key (defaults included), needs no weights */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/none", bin, dir) == 0);
    CHECK(strstr(out, "micro_batch_size: 64") && strstr(out, "total_limit: 2"));
    /* a real run refuses the missing model, naming model.path */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.path=%s/none --set model.init_preset= --set logging.run_dir=%s/r",
                   bin, dir, dir) == 1);
    CHECK_MSG(strstr(out, "model.path"), "got: %s", out);
}

/* Learning: the full tiny-cpu recipe. eval color_match at the end exceeds the start by > 3 standard errors of the
 * difference (sqrt(se_start^2 + se_end^2), treating the two evals as independent: conservative, they share seeds). */
TEST(run_learns_color_slow) {
    TEST_SLOW();
    const char *dir = test_tmpdir();
    char out[1 << 16], path[700];
    make_model(dir, 0); /* as `make demo` */
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.path=%s/model --set logging.run_dir=%s/run",
                     test_vgrpo_bin(), dir, dir) == 0);
    json_t *rows[256];
    snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
    int n = read_rows(path, rows, 256, 0);
    REQUIRE(n >= 2);
    double m0 = num(rows[0], "eval/color_match/mean"), s0 = num(rows[0], "eval/color_match/se");
    double m1 = num(rows[n - 1], "eval/color_match/mean"), s1 = num(rows[n - 1], "eval/color_match/se");
    double z = (m1 - m0) / sqrt(s0 * s0 + s1 * s1);
    fprintf(stderr, "  eval color_match %.4f +- %.4f -> %.4f +- %.4f (%.1f standard errors)\n", m0, s0, m1, s1, z);
    CHECK(z > 3);
    for (int i = 0; i < n; i++) json_decref(rows[i]);
}

/* The embedded default end to end, as `make demo` runs it but in colocated mode (separate reward server, rollout
 * worker and trainer processes): eval of the initial weights, the run (final checkpoint), eval of that checkpoint,
 * and scripts/compare_eval.py; the color_match gain must exceed 3 standard errors of the difference over the 144
 * eval videos. About 3-4 minutes on 2 cores: make test-slow only. */
TEST(demo_flow_colocated_slow) {
    TEST_SLOW();
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[1 << 16], sets[1024];
    snprintf(sets, sizeof sets, "--set model.path=%s/model --set logging.run_dir=%s/run --set mode=colocated", dir, dir);
    REQUIRE(test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml %s --out %s/ev0", bin, sets, dir) == 0);
    if (test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s", bin, sets) != 0)
        test_fail(__FILE__, __LINE__, "run: %s", out);
    REQUIRE(test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml %s --checkpoint %s/run/checkpoint-150 --out %s/ev1", bin,
                     sets, dir, dir) == 0);
    REQUIRE(test_run(out, sizeof out, "python3 scripts/compare_eval.py %s/ev0/eval.json %s/ev1/eval.json --scorer color_match",
                     dir, dir) == 0);
    fprintf(stderr, "%s", out);
    char path[700];
    double m[2], se[2];
    int n[2];
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/ev%d/eval.json", dir, k);
        json_t *j = json_load_file(path, 0, NULL);
        REQUIRE(j);
        const json_t *cm = json_object_get(json_object_get(j, "stats"), "color_match");
        m[k] = json_number_value(json_object_get(cm, "mean")), se[k] = json_number_value(json_object_get(cm, "se"));
        n[k] = (int)json_integer_value(json_object_get(cm, "n"));
        json_decref(j);
    }
    CHECK(n[0] >= 32 && n[1] >= 32);
    const double z = (m[1] - m[0]) / sqrt(se[0] * se[0] + se[1] * se[1]);
    CHECK_MSG(z > 3, "color_match %.4f +- %.4f -> %.4f +- %.4f: %.1f standard errors", m[0], se[0], m[1], se[1], z);
}
