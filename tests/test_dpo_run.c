/* tests/test_dpo_run.c — algorithm.loss dpo through `vgrpo run` (trainer/run/objective.c):
 *   - the metrics rows carry the objective's fields (dpo/...) and no GRPO or nft field; the first step's loss is
 *     log 2 (the policy is the reference: every margin 0); each step trains 2 terms (random_k 2) per group whose
 *     rewards (rewards.jsonl) are not all equal; no old policy is kept;
 *   - colocated (2 rollout workers) equals local: metrics rows (timings aside), rewards and checkpoint files;
 *   - 2 steps + --resume 2 steps equals 4 straight steps (the reference stays the initial weights), alone and over 2
 *     trainer ranks (each training its share of the pairs), whose first loss is local's;
 *   - LoRA: the reference is the base with the adapter off (first loss log 2), the base unchanged, resume exact;
 *   - the emulated device (model.device cuda): the reference's device copy, first loss log 2, resume exact;
 *   - a margin no gap exceeds: no pair, the steps still count, the weights stay;
 *   - `vgrpo parity` reports the velocity difference, 0 on the CPU, and no log-prob;
 *   - --dry-run refuses what does not apply to dpo, naming the key;
 *   - slow: the tiny recipe learns (eval color_match rises by more than 3 standard errors). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "tests/metrics_rows.h"
#include "tests/test.h"

static void base_args(char *buf, size_t cap, const char *dir) {
    snprintf(buf, cap, "--set model.path=%s/model --set rollout.num_steps=3 --set rollout.samples_per_prompt=4 "
             "--set algorithm.timestep_selection='random_k 2' --set data.eval_samples_per_prompt=1 "
             "--set checkpoint.every=1 --set checkpoint.total_limit=0", dir);
}

/* `env vgrpo run recipes/tiny-cpu-dpo.yaml args --steps first` into dir/name, then the same continued with --resume to
 * `total` steps; a run that fails fails the test, naming `what`. */
static void run_resumed(const char *env, const char *args, const char *dir, const char *name, int first, int total,
                        const char *what) {
    static char out[16384];
    const char *bin = test_vgrpo_bin();
    int st = test_run(out, sizeof out, "%s %s run recipes/tiny-cpu-dpo.yaml %s --steps %d --set logging.run_dir=%s/%s "
                      "2>&1", env, bin, args, first, dir, name);
    CHECK_MSG(st == 0, "%s, %d step(s): %s", what, first, out);
    st = test_run(out, sizeof out, "%s %s run recipes/tiny-cpu-dpo.yaml %s --steps %d --set logging.run_dir=%s/%s "
                  "--resume %s/%s 2>&1", env, bin, args, total, dir, name, dir, name);
    CHECK_MSG(st == 0, "%s, resumed to %d: %s", what, total, out);
}

static int cmp_files(const char *dir, const char *a, const char *b, int step, const char *f) {
    return test_run(NULL, 0, "cmp -s %s/%s/checkpoint-%d/%s %s/%s/checkpoint-%d/%s", dir, a, step, f, dir, b, step, f);
}

static void rows_equal(const char *dir, const char *a, const char *b, int want) {
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/%s/metrics.jsonl", dir, a);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", dir, b);
    json_t *ra[16], *rb[16];
    const int na = read_rows(pa, ra, 16, 1), nb = read_rows(pb, rb, 16, 1);
    CHECK_MSG(na == want && nb == want, "%s: %d rows, %s: %d rows, %d expected", a, na, b, nb, want);
    for (int i = 0; i < na && i < nb; i++) CHECK_MSG(json_equal(ra[i], rb[i]), "metrics row %d differs: %s vs %s", i, a, b);
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
}

/* Groups (prompts_per_step 2 of samples_per_prompt 4) of each step of rewards.jsonl whose rewards are not all equal:
 * the best_worst pairs the step trains. Returns the number of steps read. */
static int pairs_per_step(const char *path, int *pairs, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    static char line[1 << 16];
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        const json_t *rw = json_object_get(o, "reward");
        pairs[n] = 0;
        for (int b = 0; b < 2 && json_array_size(rw) == 8; b++) {
            double lo = INFINITY, hi = -INFINITY;
            for (int g = 0; g < 4; g++) {
                const double v = json_number_value(json_array_get(rw, (size_t)(b * 4 + g)));
                lo = fmin(lo, v), hi = fmax(hi, v);
            }
            pairs[n] += hi > lo;
        }
        json_decref(o);
        n++;
    }
    fclose(f);
    return n;
}

#define W "transformer/diffusion_pytorch_model.safetensors"

TEST(dpo_run_rows_colocated_resume) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2048], p[700];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    base_args(base, sizeof base, dir);
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml %s --steps 4 --set logging.run_dir=%s/l", bin,
                      base, dir);
    REQUIRE_OK(st ? (test_fail(__FILE__, __LINE__, "local run: %s", out), -1) : 0);
    CHECK_MSG(strstr(out, "loss 0.6931 | margin +0 positive 0.00"), "step line: %s", out);
    /* the rows: the objective's fields, the terms trained from the pairs the rewards give */
    int pairs[8];
    snprintf(p, sizeof p, "%s/l/rewards.jsonl", dir);
    CHECK(pairs_per_step(p, pairs, 8) == 4);
    snprintf(p, sizeof p, "%s/l/metrics.jsonl", dir);
    json_t *rows[16];
    const int nr = read_rows(p, rows, 16, 1);
    CHECK(nr == 5);
    int trained = 0;
    for (int k = 0; k < 4 && k < nr; k++) {
        const json_t *r = rows[k];
        const char *want[] = {"loss", "dpo/reward_margin", "dpo/positive_fraction", "dpo/err_w", "dpo/err_l",
                              "dpo/ref_err_w", "dpo/ref_err_l", "grad_norm", "transitions"};
        for (int i = 0; i < 9; i++) CHECK_MSG(json_object_get(r, want[i]), "row %d lacks %s", k, want[i]);
        CHECK(!json_object_get(r, "clip_fraction") && !json_object_get(r, "policy_loss") &&
              !json_object_get(r, "nft/old_deviate") && !json_object_get(r, "old_decay"));
        CHECK_MSG(json_integer_value(json_object_get(r, "transitions")) == 2 * pairs[k], "step %d: %lld terms, %d pairs",
                  k, (long long)json_integer_value(json_object_get(r, "transitions")), pairs[k]);
        trained += pairs[k] > 0;
    }
    CHECK(trained >= 2); /* the case is not empty */
    if (nr >= 1 && pairs[0] > 0) {
        CHECK_NEAR(json_real_value(json_object_get(rows[0], "loss")), log(2.0), 1e-12);
        CHECK(json_real_value(json_object_get(rows[0], "dpo/reward_margin")) == 0.0);
        CHECK(json_real_value(json_object_get(rows[0], "dpo/err_w")) ==
              json_real_value(json_object_get(rows[0], "dpo/ref_err_w")));
    }
    for (int i = 0; i < nr; i++) json_decref(rows[i]);
    CHECK(test_run(NULL, 0, "test -e %s/l/checkpoint-4/old", dir) != 0); /* no old policy */
    /* colocated (two rollout workers) == local */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml %s --steps 4 --set mode=colocated "
                  "--set parallel.rollout_workers=2 --set logging.run_dir=%s/c", bin, base, dir);
    CHECK_MSG(st == 0, "colocated run: %s", out);
    rows_equal(dir, "l", "c", 5);
    CHECK(test_run(NULL, 0, "cmp -s %s/l/rewards.jsonl %s/c/rewards.jsonl", dir, dir) == 0);
    const char *files[] = {W, "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) CHECK_MSG(cmp_files(dir, "l", "c", 4, files[i]) == 0, "colocated: %s differs", files[i]);
    /* resume: 2 + 2 == 4 (the reference is the initial weights, not the checkpoint's) */
    run_resumed("", base, dir, "r", 2, 4, "resume");
    for (int i = 0; i < 2; i++) CHECK_MSG(cmp_files(dir, "l", "r", 4, files[i]) == 0, "resume: %s differs", files[i]);
    rows_equal(dir, "l", "r", 5);
    /* two trainer ranks, each its share of the pairs: the first loss is local's; 2 + 2 == 4 */
    char two[2400];
    snprintf(two, sizeof two, "%s --set mode=colocated --set parallel.trainer_ranks=2", base);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml %s --steps 4 --set logging.run_dir=%s/t4", bin, two,
                  dir);
    CHECK_MSG(st == 0, "2 ranks, 4 steps: %s", out);
    run_resumed("", two, dir, "t2", 2, 4, "2 ranks");
    for (int i = 0; i < 2; i++) CHECK_MSG(cmp_files(dir, "t4", "t2", 4, files[i]) == 0, "2 ranks, resume: %s differs", files[i]);
    rows_equal(dir, "t4", "t2", 5);
    json_t *a[16], *b[16];
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/l/metrics.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/t4/metrics.jsonl", dir);
    const int na = read_rows(pa, a, 16, 1), nb = read_rows(pb, b, 16, 1);
    if (na >= 1 && nb >= 1) {
        const double la = json_real_value(json_object_get(a[0], "loss")), lb = json_real_value(json_object_get(b[0], "loss"));
        CHECK_MSG(fabs(la - lb) <= 1e-12 * fabs(la), "first loss: local %.17g, 2 ranks %.17g", la, lb);
        CHECK(json_integer_value(json_object_get(a[0], "transitions")) ==
              json_integer_value(json_object_get(b[0], "transitions")));
    }
    for (int i = 0; i < na; i++) json_decref(a[i]);
    for (int i = 0; i < nb; i++) json_decref(b[i]);
    /* parity: the velocity, no log-prob */
    st = test_run(out, sizeof out, "%s parity recipes/tiny-cpu-dpo.yaml %s --set logging.run_dir=%s/p 2>&1", bin, base,
                  dir);
    CHECK_MSG(st == 0 && strstr(out, "no log-prob") && strstr(out, "max |v_trainer - v_rollout| = 0 (tolerance 0): PASS"),
              "parity: %s", out);
}

TEST(dpo_run_lora_reference_is_base) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2400];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    base_args(base, sizeof base, dir);
    strcat(base, " --set model.lora.rank=8");
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml %s --steps 2 --set logging.run_dir=%s/a", bin,
                      base, dir);
    REQUIRE_OK(st ? (test_fail(__FILE__, __LINE__, "LoRA run: %s", out), -1) : 0);
    CHECK_MSG(strstr(out, "LoRA: base weights unchanged"), "%s", out);
    CHECK_MSG(strstr(out, "loss 0.6931 | margin +0 positive 0.00"), "the first step against the base: %s", out);
    run_resumed("", base, dir, "b", 1, 2, "LoRA");
    const char *files[] = {"transformer/pytorch_lora_weights.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) CHECK_MSG(cmp_files(dir, "a", "b", 2, files[i]) == 0, "LoRA resume: %s differs", files[i]);
    CHECK(test_run(NULL, 0, "test -e %s/a/checkpoint-2/old", dir) != 0);
}

/* model.device cuda on the emulated device: the reference's device copy (the initial weights, uploaded once) serves
 * every step; the first loss is log 2 there too, and 1 + --resume 1 == 2. */
TEST(dpo_run_emulated_device_resume) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2400];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    base_args(base, sizeof base, dir);
    strcat(base, " --set model.device=cuda");
    int st = test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s run recipes/tiny-cpu-dpo.yaml %s --steps 2 "
                      "--set logging.run_dir=%s/a", bin, base, dir);
    REQUIRE_OK(st ? (test_fail(__FILE__, __LINE__, "emulated run: %s", out), -1) : 0);
    CHECK_MSG(strstr(out, "loss 0.6931 | margin +0 positive 0.00"), "the first step against the reference: %s", out);
    run_resumed("VGRPO_EMULATE_DEVICE=1", base, dir, "b", 1, 2, "emulated");
    const char *files[] = {W, "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) CHECK_MSG(cmp_files(dir, "a", "b", 2, files[i]) == 0, "emulated resume: %s differs", files[i]);
    rows_equal(dir, "a", "b", 3);
}

/* LoRA on the emulated device: the reference is the base (the policy's device forward with its adapter off): the
 * first step's errors equal the reference's to the bit (loss log 2), later ones differ from them; the base stays
 * unchanged; 1 + --resume 2 == 3 (the adapter and its AdamW state). */
TEST(dpo_run_emulated_device_lora) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2400];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    base_args(base, sizeof base, dir);
    strcat(base, " --set model.device=cuda --set model.lora.rank=8");
    int st = test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s run recipes/tiny-cpu-dpo.yaml %s --steps 3 "
                      "--set logging.run_dir=%s/a 2>&1", bin, base, dir);
    REQUIRE_OK(st ? (test_fail(__FILE__, __LINE__, "emulated LoRA run: %s", out), -1) : 0);
    CHECK_MSG(strstr(out, "LoRA: base weights unchanged"), "%s", out);
    CHECK_MSG(strstr(out, "loss 0.6931 | margin +0 positive 0.00"), "the first step against the base: %s", out);
    /* the rows: step 0's policy errors are the reference's, step 2's are not */
    char path[1024];
    snprintf(path, sizeof path, "%s/a/metrics.jsonl", dir);
    double e[3][4] = {{0}};
    const char *keys[4] = {"\"dpo/err_w\":", "\"dpo/ref_err_w\":", "\"dpo/err_l\":", "\"dpo/ref_err_l\":"};
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    char line[16384];
    for (int s = 0; s < 3 && fgets(line, sizeof line, f); s++)
        for (int k = 0; k < 4; k++) {
            const char *p = strstr(line, keys[k]);
            e[s][k] = p ? atof(p + strlen(keys[k])) : -1;
        }
    fclose(f);
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 4; k++) CHECK_MSG(e[s][k] > 0, "step %d: %s missing", s, keys[k]);
    CHECK_MSG(e[0][0] == e[0][1] && e[0][2] == e[0][3], "step 0: policy %.17g %.17g, reference %.17g %.17g", e[0][0],
              e[0][2], e[0][1], e[0][3]);
    CHECK_MSG(e[2][0] != e[2][1] && e[2][2] != e[2][3], "step 2: the policy's errors equal the reference's (%.17g)",
              e[2][0]);
    run_resumed("VGRPO_EMULATE_DEVICE=1", base, dir, "b", 1, 3, "emulated LoRA");
    const char *files[] = {"transformer/pytorch_lora_weights.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++)
        CHECK_MSG(cmp_files(dir, "a", "b", 3, files[i]) == 0, "emulated LoRA resume: %s differs", files[i]);
}

/* The reference is model.path's weights as the run started: a checkpoint records their hash (base_xxh64), and a
 * resume after the folder was written again with other weights is refused, naming model.path, for the dpo reference
 * and for a LoRA run's frozen base (GRPO); the same weights written again resume. */
TEST(dpo_resume_refuses_other_reference_weights) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2400];
    const char *cases[2][2] = {{"tiny-cpu-dpo", ""}, {"tiny-cpu", " --set model.lora.rank=8"}};
    for (int i = 0; i < 2; i++) {
        REQUIRE(test_run(NULL, 0, "rm -rf %s/model && %s init-model --preset tiny --out %s/model --seed 0 >/dev/null",
                         dir, bin, dir) == 0);
        base_args(base, sizeof base, dir);
        strcat(base, cases[i][1]);
        int st = test_run(out, sizeof out, "%s run recipes/%s.yaml %s --steps 1 --set logging.run_dir=%s/r%d 2>&1",
                          bin, cases[i][0], base, dir, i);
        REQUIRE_OK(st ? (test_fail(__FILE__, __LINE__, "%s: %s", cases[i][0], out), -1) : 0);
        CHECK_MSG(test_run(NULL, 0, "grep -q '\"base_xxh64\": \"' %s/r%d/checkpoint-1/trainer_state.json", dir, i) == 0,
                  "%s: no base_xxh64 in its trainer_state.json", cases[i][0]);
        /* other weights in the same folder */
        REQUIRE(test_run(NULL, 0, "rm -rf %s/model && %s init-model --preset tiny --out %s/model --seed 5 >/dev/null",
                         dir, bin, dir) == 0);
        st = test_run(out, sizeof out, "%s run recipes/%s.yaml %s --steps 2 --set logging.run_dir=%s/r%d --resume %s/r%d "
                      "2>&1", bin, cases[i][0], base, dir, i, dir, i);
        CHECK_MSG(st != 0 && strstr(out, "the transformer weights of model.path") && strstr(out, "hash to") &&
                      strstr(out, i ? "LoRA adapters' frozen base" : "reference model"),
                  "%s: resumed against other weights: %s", cases[i][0], out);
        /* the run's own weights again: resumes */
        REQUIRE(test_run(NULL, 0, "rm -rf %s/model && %s init-model --preset tiny --out %s/model --seed 0 >/dev/null",
                         dir, bin, dir) == 0);
        st = test_run(out, sizeof out, "%s run recipes/%s.yaml %s --steps 2 --set logging.run_dir=%s/r%d --resume %s/r%d "
                      "2>&1", bin, cases[i][0], base, dir, i, dir, i);
        CHECK_MSG(st == 0, "%s: the same weights again: %s", cases[i][0], out);
    }
}

/* A margin no reward gap exceeds: no pair in any step. Each step still takes its optimizer step (the policy version
 * counts the steps) with a zero gradient, which leaves AdamW's update 0 from zero moments: the weights stay the
 * initial ones bit for bit, and the rows say 0 terms. */
TEST(dpo_run_without_pairs) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2400], p[700];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    base_args(base, sizeof base, dir);
    const int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml %s --steps 2 --set algorithm.dpo_margin=1e9 "
                            "--set logging.run_dir=%s/n", bin, base, dir);
    REQUIRE_OK(st ? (test_fail(__FILE__, __LINE__, "run: %s", out), -1) : 0);
    CHECK(test_run(NULL, 0, "cmp -s %s/model/" W " %s/n/checkpoint-2/" W, dir, dir) == 0);
    snprintf(p, sizeof p, "%s/n/metrics.jsonl", dir);
    json_t *rows[8];
    const int nr = read_rows(p, rows, 8, 1);
    CHECK(nr == 3);
    for (int k = 0; k < 2 && k < nr; k++) {
        CHECK(json_integer_value(json_object_get(rows[k], "transitions")) == 0);
        CHECK(json_real_value(json_object_get(rows[k], "loss")) == 0.0);
        CHECK(json_integer_value(json_object_get(rows[k], "policy_version")) == k);
    }
    if (nr == 3) CHECK(json_integer_value(json_object_get(rows[2], "policy_version")) == 2);
    for (int i = 0; i < nr; i++) json_decref(rows[i]);
}

TEST(dpo_recipe_refusals) {
    const char *bin = test_vgrpo_bin();
    char out[16384];
    const struct {
        const char *set, *want;
    } bad[] = {
        {"--set rollout.sde_type=cps", "rollout.sde_type: cps"},
        {"--set rollout.sde_window.size=2", "rollout.sde_window.size: 2"},
        {"--set rollout.sde_type=cps --set algorithm.cps_logprob=flow_grpo", "rollout.sde_type"},
        {"--set rollout.samples_per_prompt=1", "rollout.samples_per_prompt"},
        {"--set algorithm.beta=0.01", "algorithm.beta: 0.01"},
        {"--set algorithm.dpo_beta=0", "algorithm.dpo_beta"},
        {"--set algorithm.dpo_pairs=every", "algorithm.dpo_pairs"},
        {"--set algorithm.dpo_margin=-0.1", "algorithm.dpo_margin"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml --dry-run %s 2>&1", bin, bad[i].set);
        CHECK_MSG(rc != 0 && strstr(out, bad[i].want), "%s: exit %d, want \"%s\": %s", bad[i].set, rc, bad[i].want, out);
    }
    /* the recipe (rollout.eta 0), an SDE rollout, the all-pairs rule with a margin pass */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml --dry-run >/dev/null 2>&1", bin) == 0);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml --dry-run --set rollout.eta=0.7 >/dev/null 2>&1",
                   bin) == 0);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml --dry-run --set algorithm.dpo_pairs=all "
                   "--set algorithm.dpo_margin=0.05 >/dev/null 2>&1", bin) == 0);
    /* image prompts: refused at --dry-run already (not only at the run's start, after the model is written) */
    const int rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v-a14b.yaml --dry-run --set algorithm.loss=dpo "
                            "--set algorithm.beta=0 2>&1", bin);
    CHECK_MSG(rc == 1 && strstr(out, "algorithm.loss: dpo trains text to video only") &&
                  strstr(out, "i2v_squares.jsonl gives images"), "dpo with images: exit %d: %s", rc, out);
    /* a two-expert model (the pass trains one expert: trainer/step/dpo_step.h): refused at --dry-run and at the
     * start, naming the key and the first step of transformer_2, not after the first rollout; a model folder
     * (tiny, two experts) and a preset without weights (the full A14B recipe) */
    const char *dir = test_tmpdir();
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --experts 2 --out %s/two --seed 0 >/dev/null", bin, dir) == 0);
    const int r2 = test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml --dry-run --set model.path=%s/two 2>&1",
                            bin, dir);
    CHECK_MSG(r2 == 1 && strstr(out, "algorithm.loss: dpo trains one expert") &&
                  strstr(out, "runs transformer_2 from step 3 of 8"), "dpo, two experts: exit %d: %s", r2, out);
    const int r3 = test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml --set model.path=%s/two --set "
                            "logging.run_dir=%s/two-run --steps 1 2>&1", bin, dir, dir);
    CHECK_MSG(r3 != 0 && strstr(out, "algorithm.loss: dpo trains one expert") && !strstr(out, "uses expert"),
              "dpo, two experts, a run: exit %d: %s", r3, out);
    const int r4 = test_run(out, sizeof out, "%s run recipes/wan2.2-t2v-a14b.yaml --dry-run --set algorithm.loss=dpo "
                            "2>&1", bin);
    CHECK_MSG(r4 == 1 && strstr(out, "runs transformer_2 from step 6 of 10"), "the A14B with dpo: exit %d: %s", r4, out);
    test_run(NULL, 0, "rm -rf %s/two %s/two-run", dir, dir);
}

/* Learning: the full tiny-cpu-dpo recipe (150 steps). The eval color_match at the end exceeds the start by more than 3
 * standard errors of the difference (as run_learns_color_slow for GRPO). */
TEST(dpo_run_learns_color_slow) {
    TEST_SLOW();
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[1 << 16], path[700];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml --set model.path=%s/model "
                     "--set logging.run_dir=%s/run", bin, dir, dir) == 0);
    json_t *rows[256];
    snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
    const int n = read_rows(path, rows, 256, 0);
    REQUIRE(n >= 2);
    const json_t *r0 = rows[0], *r1 = rows[n - 1];
    const double m0 = json_number_value(json_object_get(r0, "eval/color_match/mean")),
                 s0 = json_number_value(json_object_get(r0, "eval/color_match/se")),
                 m1 = json_number_value(json_object_get(r1, "eval/color_match/mean")),
                 s1 = json_number_value(json_object_get(r1, "eval/color_match/se"));
    const double z = (m1 - m0) / sqrt(s0 * s0 + s1 * s1);
    fprintf(stderr, "  dpo: eval color_match %.4f +- %.4f -> %.4f +- %.4f (%.1f standard errors)\n", m0, s0, m1, s1, z);
    CHECK_MSG(z > 3, "eval rose by %.2f standard errors only", z);
    for (int i = 0; i < n; i++) json_decref(rows[i]);
}
