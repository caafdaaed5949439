/* tests/test_nft_run.c — algorithm.loss nft through `vgrpo run` (trainer/run/objective.c, trainer/run/old_policy.c):
 *   - the old policy saved under old/ after steps 1 and 2 equals d_k old + (1 - d_k) weights recomputed here in fp32,
 *     bit for bit (d_k = nft_old_decay of the policy version; old starts at the initial weights), and the metrics
 *     rows carry the objective's fields (nft/..., old_decay) and no GRPO field;
 *   - colocated (2 rollout workers) equals local: metrics rows (timings aside), rewards and checkpoint files;
 *   - 2 steps + --resume 2 steps equals 4 straight steps (weights, old policy, Adam state), alone and over 2 trainer
 *     ranks (whose followers restore their old policy from the checkpoint too), and with LoRA (the old adapter); the
 *     2 ranks' statistics summed over the dp group equal the local run's on step 0 (1e-6 relative: summation order);
 *   - --dry-run refuses what does not apply to nft (cps, an SDE window, cps_logprob) naming the key, and allows
 *     rollout.eta 0;
 *   - vgrpo parity: the velocity alone (no log-prob), exactly 0 on the CPU;
 *   - model.device cuda on the emulated device: resume exact with the old policy's device copy, full and LoRA (whose
 *     old adapter's device copy is shown to follow the host's);
 *   - two experts (Wan 2.2 A14B's layout): resume, colocated, parity, and algorithm.train_experts transformer;
 *   - (slow) recipes/tiny-cpu-nft.yaml learns: eval color_match rises by more than 3 standard errors. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_dit.h"
#include "tests/metrics_rows.h"
#include "tests/test.h"
#include "trainer/step/nft.h"

static int load(wan_model *m, const char *dir, const char *sub) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s", dir, sub);
    if (wan_model_load(m, p)) return test_fail(__FILE__, __LINE__, "%s", core_last_error()), -1;
    return 0;
}

/* The small nft run every case starts from (3 steps, 2 x 4 samples, decay 0.25 per step up to 0.5). */
static void base_args(char *buf, size_t cap, const char *dir) {
    snprintf(buf, cap, "--set model.path=%s/model --set rollout.num_steps=3 --set rollout.samples_per_prompt=4 "
             "--set algorithm.timestep_selection='random_k 2' --set data.eval_samples_per_prompt=1 "
             "--set checkpoint.every=1 --set checkpoint.total_limit=0 --set algorithm.old_decay_rate=0.25 "
             "--set algorithm.old_decay_max=0.5", dir);
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

#define W "transformer/diffusion_pytorch_model.safetensors"
#define OLD "old/transformer/diffusion_pytorch_model.safetensors"

TEST(nft_run_old_policy_colocated_resume) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2048];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    base_args(base, sizeof base, dir);
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 4 --set logging.run_dir=%s/l", bin,
                      base, dir);
    REQUIRE_OK(st ? (test_fail(__FILE__, __LINE__, "local run: %s", out), -1) : 0);
    CHECK_MSG(strstr(out, "L+ ") && strstr(out, "r 0.5"), "step line: %s", out);
    /* the old policy's values */
    char c1[700], c2[700];
    snprintf(c1, sizeof c1, "%s/l/checkpoint-1", dir);
    snprintf(c2, sizeof c2, "%s/l/checkpoint-2", dir);
    wan_model w0, w1, w2, o1, o2;
    REQUIRE_OK(load(&w0, dir, "model/transformer"));
    REQUIRE_OK(load(&w1, c1, "transformer"));
    REQUIRE_OK(load(&w2, c2, "transformer"));
    REQUIRE_OK(load(&o1, c1, "old/transformer"));
    REQUIRE_OK(load(&o2, c2, "old/transformer"));
    const float d1 = (float)nft_old_decay(1, 0, 0.25, 0.5), d2 = (float)nft_old_decay(2, 0, 0.25, 0.5);
    CHECK(d1 == 0.25f && d2 == 0.5f);
    int64_t bad1 = 0, bad2 = 0, lag = 0;
    for (int64_t k = 0; k < w0.layout.numel; k++) {
        const float a = w0.params[k] * d1 + w1.params[k] * (1.0f - d1);
        const float b = a * d2 + w2.params[k] * (1.0f - d2);
        bad1 += a != o1.params[k], bad2 += b != o2.params[k], lag += o2.params[k] != w2.params[k];
    }
    CHECK_MSG(bad1 == 0 && bad2 == 0, "old policy differs from d old + (1 - d) w in %lld / %lld elements",
              (long long)bad1, (long long)bad2);
    CHECK(lag > 0);
    wan_model_free(&w0), wan_model_free(&w1), wan_model_free(&w2), wan_model_free(&o1), wan_model_free(&o2);
    /* the rows: the objective's fields */
    char p[700];
    snprintf(p, sizeof p, "%s/l/metrics.jsonl", dir);
    json_t *rows[16];
    const int nr = read_rows(p, rows, 16, 1);
    CHECK(nr == 5);
    if (nr >= 2) {
        const char *want[] = {"loss", "policy_loss", "nft/positive_loss", "nft/negative_loss", "nft/optimality_mean",
                              "nft/old_deviate", "old_decay", "grad_norm", "transitions"};
        for (int i = 0; i < 9; i++) CHECK_MSG(json_object_get(rows[1], want[i]), "row 1 lacks %s", want[i]);
        CHECK(!json_object_get(rows[1], "clip_fraction") && !json_object_get(rows[1], "log_prob_mean_abs_diff"));
        CHECK(json_real_value(json_object_get(rows[1], "old_decay")) == 0.5);
        CHECK(json_integer_value(json_object_get(rows[1], "transitions")) == 2 * 4 * 2);
        CHECK(json_real_value(json_object_get(rows[1], "nft/old_deviate")) > 0);
    }
    for (int i = 0; i < nr; i++) json_decref(rows[i]);
    /* colocated (two rollout workers) == local */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 4 --set mode=colocated "
                  "--set parallel.rollout_workers=2 --set logging.run_dir=%s/c", bin, base, dir);
    CHECK_MSG(st == 0, "colocated run: %s", out);
    rows_equal(dir, "l", "c", 5);
    CHECK(test_run(NULL, 0, "cmp -s %s/l/rewards.jsonl %s/c/rewards.jsonl", dir, dir) == 0);
    const char *files[] = {W, OLD, "optimizer.safetensors"};
    for (int i = 0; i < 3; i++) CHECK_MSG(cmp_files(dir, "l", "c", 4, files[i]) == 0, "colocated: %s differs", files[i]);
    /* resume: 2 + 2 == 4 */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 2 --set logging.run_dir=%s/r", bin, base,
                  dir);
    CHECK_MSG(st == 0, "2 steps: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 4 --set logging.run_dir=%s/r --resume %s/r",
                  bin, base, dir, dir);
    CHECK_MSG(st == 0, "resume: %s", out);
    for (int i = 0; i < 3; i++) CHECK_MSG(cmp_files(dir, "l", "r", 4, files[i]) == 0, "resume: %s differs", files[i]);
    rows_equal(dir, "l", "r", 5);
    /* two trainer ranks: 2 + 2 == 4 (rank 1 restores its old policy too) */
    char two[2400];
    snprintf(two, sizeof two, "%s --set mode=colocated --set parallel.trainer_ranks=2", base);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 4 --set logging.run_dir=%s/t4", bin, two,
                  dir);
    CHECK_MSG(st == 0, "2 ranks, 4 steps: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 2 --set logging.run_dir=%s/t2", bin, two,
                  dir);
    CHECK_MSG(st == 0, "2 ranks, 2 steps: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 4 --set logging.run_dir=%s/t2 "
                  "--resume %s/t2", bin, two, dir, dir);
    CHECK_MSG(st == 0, "2 ranks, resume: %s", out);
    for (int i = 0; i < 3; i++) CHECK_MSG(cmp_files(dir, "t4", "t2", 4, files[i]) == 0, "2 ranks, resume: %s differs", files[i]);
    rows_equal(dir, "t4", "t2", 5);
    /* the 2 ranks' statistics, summed over the dp group, are the local run's on step 0 (same weights and batch; the
     * sums differ in their order only) */
    char pl[700], pt[700];
    snprintf(pl, sizeof pl, "%s/l/metrics.jsonl", dir);
    snprintf(pt, sizeof pt, "%s/t4/metrics.jsonl", dir);
    json_t *a[8], *b[8];
    const int na = read_rows(pl, a, 8, 1), nb = read_rows(pt, b, 8, 1);
    CHECK(na >= 1 && nb >= 1);
    if (na >= 1 && nb >= 1) {
        CHECK(json_integer_value(json_object_get(a[0], "transitions")) ==
              json_integer_value(json_object_get(b[0], "transitions")));
        const char *keys[] = {"loss", "policy_loss", "nft/positive_loss", "nft/negative_loss", "nft/optimality_mean",
                              "grad_norm"};
        for (int i = 0; i < 6; i++) {
            const double x = json_number_value(json_object_get(a[0], keys[i]));
            const double y = json_number_value(json_object_get(b[0], keys[i]));
            CHECK_MSG(x > 0 && fabs(x - y) <= 1e-6 * x, "step 0 %s: local %.9g, 2 ranks %.9g", keys[i], x, y);
        }
    }
    for (int i = 0; i < na; i++) json_decref(a[i]);
    for (int i = 0; i < nb; i++) json_decref(b[i]);
}

TEST(nft_run_lora_old_adapter_resume) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2400];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    base_args(base, sizeof base, dir);
    strcat(base, " --set model.lora.rank=8");
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 2 --set logging.run_dir=%s/a", bin,
                      base, dir);
    REQUIRE_OK(st ? (test_fail(__FILE__, __LINE__, "LoRA run: %s", out), -1) : 0);
    CHECK_MSG(strstr(out, "LoRA: base weights unchanged"), "%s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 1 --set logging.run_dir=%s/b", bin, base,
                  dir);
    CHECK_MSG(st == 0, "1 step: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 2 --set logging.run_dir=%s/b --resume %s/b",
                  bin, base, dir, dir);
    CHECK_MSG(st == 0, "resume: %s", out);
    const char *files[] = {"transformer/pytorch_lora_weights.safetensors", "old/transformer/pytorch_lora_weights.safetensors",
                           "optimizer.safetensors"};
    for (int i = 0; i < 3; i++) CHECK_MSG(cmp_files(dir, "a", "b", 2, files[i]) == 0, "LoRA resume: %s differs", files[i]);
    /* the old adapter lags the adapter (decay 0.25, then 0.5) and no old model copy is written */
    CHECK(cmp_files(dir, "a", "a", 2, files[0]) == 0);
    CHECK(test_run(NULL, 0, "cmp -s %s/a/checkpoint-2/%s %s/a/checkpoint-2/%s", dir, files[0], dir, files[1]) != 0);
    CHECK(test_run(NULL, 0, "test -e %s/a/checkpoint-2/" OLD, dir) != 0);
}

TEST(nft_recipe_refusals) {
    const char *bin = test_vgrpo_bin();
    char out[16384];
    const struct {
        const char *set, *want;
    } bad[] = {
        {"--set rollout.sde_type=cps", "rollout.sde_type: cps"},
        {"--set rollout.sde_window.size=2", "rollout.sde_window.size: 2"},
        {"--set rollout.sde_type=cps --set algorithm.cps_logprob=flow_grpo", "rollout.sde_type"},
        {"--set algorithm.nft_beta=0", "algorithm.nft_beta"},
        {"--set algorithm.nft_beta=1e-30", "algorithm.nft_beta: must be >= 1e-06, got 1e-30"}, /* loss / beta overflows */
        {"--set algorithm.old_decay_max=1.5", "algorithm.old_decay_max"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml --dry-run %s 2>&1", bin, bad[i].set);
        CHECK_MSG(rc != 0 && strstr(out, bad[i].want), "%s: exit %d, want \"%s\": %s", bad[i].set, rc, bad[i].want, out);
    }
    /* rollout.eta 0 (the recipe's) passes with nft, and an SDE rollout too; GRPO refuses eta 0 */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml --dry-run >/dev/null 2>&1", bin) == 0);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml --dry-run --set rollout.eta=0.7 >/dev/null 2>&1", bin) == 0);
    const int rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml --dry-run --set algorithm.loss=grpo 2>&1", bin);
    CHECK_MSG(rc != 0 && strstr(out, "rollout.eta"), "grpo with eta 0: %s", out);
    /* image prompts: refused at --dry-run already, as recipes/README.md says (not only at the run's start) */
    const int rc2 = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v.yaml --dry-run --set algorithm.loss=nft "
                             "--set rollout.eta=0 2>&1", bin);
    CHECK_MSG(rc2 == 1 && strstr(out, "algorithm.loss: nft trains text to video only") &&
                  strstr(out, "i2v_squares.jsonl gives images"), "nft with images: exit %d: %s", rc2, out);
}

/* vgrpo parity with nft: no log-prob, the velocity at the recorded states, exactly 0 on the CPU (CFG and SDE rollouts
 * too), alone and over 2 workers x 2 trainer ranks; parity.json says "log_prob": false. */
TEST(nft_parity_velocity_only) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[32768], base[2048], p[700], js[65536];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    base_args(base, sizeof base, dir);
    const char *extra[] = {"", "--set rollout.guidance_scale=4.5 --set rollout.eta=0.7",
                           "--set mode=colocated --set parallel.rollout_workers=2 --set parallel.trainer_ranks=2"};
    for (int k = 0; k < 3; k++) {
        const int rc = test_run(out, sizeof out, "%s parity recipes/tiny-cpu-nft.yaml %s %s --set logging.run_dir=%s/p%d",
                                bin, base, extra[k], dir, k);
        CHECK_MSG(rc == 0 && strstr(out, "parity: no log-prob (algorithm.loss nft") &&
                      strstr(out, "max |v_trainer - v_rollout| = 0 (tolerance 0): PASS") && !strstr(out, "logp_trainer"),
                  "parity %d: exit %d: %s", k, rc, out);
        snprintf(p, sizeof p, "%s/p%d/parity.json", dir, k);
        CHECK(test_slurp(p, js, sizeof js) > 0 && strstr(js, "\"log_prob\": false") && !strstr(js, "dlogp"));
        /* 2 x 4 samples x random_k 2 transitions */
        json_t *root = json_loads(js, 0, NULL);
        int64_t n = 0;
        json_t *st = json_object_get(root, "steps");
        for (size_t i = 0; i < json_array_size(st); i++)
            n += json_integer_value(json_object_get(json_array_get(st, i), "transitions"));
        CHECK_MSG(n == 16, "parity %d: %lld transitions", k, (long long)n);
        json_decref(root);
    }
}

/* model.device cuda on the emulated device: the old policy's device copy follows the host's (1 + --resume 1 == 2), with
 * full fine-tuning and with LoRA. */
TEST(nft_run_emulated_device_resume) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2400];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    base_args(base, sizeof base, dir);
    strcat(base, " --set model.device=cuda");
    int st = test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s run recipes/tiny-cpu-nft.yaml %s --steps 2 "
                      "--set logging.run_dir=%s/a", bin, base, dir);
    REQUIRE_OK(st ? (test_fail(__FILE__, __LINE__, "emulated run: %s", out), -1) : 0);
    st = test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s run recipes/tiny-cpu-nft.yaml %s --steps 1 "
                  "--set logging.run_dir=%s/b", bin, base, dir);
    CHECK_MSG(st == 0, "1 step: %s", out);
    st = test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s run recipes/tiny-cpu-nft.yaml %s --steps 2 "
                  "--set logging.run_dir=%s/b --resume %s/b", bin, base, dir, dir);
    CHECK_MSG(st == 0, "resume: %s", out);
    const char *files[] = {W, OLD, "optimizer.safetensors"};
    for (int i = 0; i < 3; i++) CHECK_MSG(cmp_files(dir, "a", "b", 2, files[i]) == 0, "emulated resume: %s differs", files[i]);
    rows_equal(dir, "a", "b", 3);
    /* LoRA there: the old adapter's device copy follows the host's (decay 0: the old policy is the policy after
     * every step, so |v - v_old| is exactly 0 on step 1 only when the device copy was updated), and resume is exact */
    strcat(base, " --set model.lora.rank=8");
    st = test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s run recipes/tiny-cpu-nft.yaml %s --steps 2 "
                  "--set algorithm.old_decay_max=0 --set logging.run_dir=%s/z", bin, base, dir);
    CHECK_MSG(st == 0 && strstr(out, "step 1 of 2") && strstr(strstr(out, "step 1 of 2"), "|v-v_old|^2 0 |"),
              "emulated LoRA, decay 0: %s", out);
    st = test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s run recipes/tiny-cpu-nft.yaml %s --steps 2 "
                  "--set logging.run_dir=%s/la", bin, base, dir);
    CHECK_MSG(st == 0, "emulated LoRA: %s", out);
    st = test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s run recipes/tiny-cpu-nft.yaml %s --steps 1 "
                  "--set logging.run_dir=%s/lb", bin, base, dir);
    CHECK_MSG(st == 0, "emulated LoRA, 1 step: %s", out);
    st = test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s run recipes/tiny-cpu-nft.yaml %s --steps 2 "
                  "--set logging.run_dir=%s/lb --resume %s/lb", bin, base, dir, dir);
    CHECK_MSG(st == 0, "emulated LoRA, resume: %s", out);
    const char *lf[] = {"transformer/pytorch_lora_weights.safetensors", "old/transformer/pytorch_lora_weights.safetensors",
                        "optimizer.safetensors"};
    for (int i = 0; i < 3; i++) CHECK_MSG(cmp_files(dir, "la", "lb", 2, lf[i]) == 0, "emulated LoRA resume: %s differs", lf[i]);
}

/* Two experts (tiny --experts 2, as Wan 2.2 A14B): each transition through its step's expert with that expert's old
 * policy; 1 + --resume 1 == 2 (both old policies), colocated == local, parity exactly 0 through both experts; with
 * algorithm.train_experts transformer only expert 0 has an old policy and transformer_2 does not change. */
TEST(nft_run_two_experts) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[32768], base[2400];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 --experts 2 >/dev/null", bin, dir) == 0);
    base_args(base, sizeof base, dir);
    strcat(base, " --set rollout.num_steps=4 --set algorithm.timestep_selection=all");
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 2 --set logging.run_dir=%s/a", bin,
                      base, dir);
    REQUIRE_OK(st ? (test_fail(__FILE__, __LINE__, "two experts: %s", out), -1) : 0);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 1 --set logging.run_dir=%s/b", bin, base,
                  dir);
    CHECK_MSG(st == 0, "1 step: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 2 --set logging.run_dir=%s/b --resume %s/b",
                  bin, base, dir, dir);
    CHECK_MSG(st == 0, "resume: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 2 --set mode=colocated "
                  "--set logging.run_dir=%s/c", bin, base, dir);
    CHECK_MSG(st == 0, "colocated: %s", out);
    const char *files[] = {W, "transformer_2/diffusion_pytorch_model.safetensors", OLD,
                           "old/transformer_2/diffusion_pytorch_model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 5; i++) {
        CHECK_MSG(cmp_files(dir, "a", "b", 2, files[i]) == 0, "two experts, resume: %s differs", files[i]);
        CHECK_MSG(cmp_files(dir, "a", "c", 2, files[i]) == 0, "two experts, colocated: %s differs", files[i]);
    }
    rows_equal(dir, "a", "b", 3);
    rows_equal(dir, "a", "c", 3);
    /* both experts trained: both moved */
    CHECK(test_run(NULL, 0, "cmp -s %s/model/transformer_2/diffusion_pytorch_model.safetensors "
                   "%s/a/checkpoint-2/transformer_2/diffusion_pytorch_model.safetensors", dir, dir) != 0);
    st = test_run(out, sizeof out, "%s parity recipes/tiny-cpu-nft.yaml %s --set logging.run_dir=%s/p 2>&1", bin, base, dir);
    CHECK_MSG(st == 0 && strstr(out, "max |v_trainer - v_rollout| = 0 (tolerance 0): PASS"), "parity: %s", out);
    /* expert 0 alone */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --steps 2 --set algorithm.train_experts=transformer "
                  "--set logging.run_dir=%s/t", bin, base, dir);
    CHECK_MSG(st == 0, "transformer only: %s", out);
    CHECK(test_run(NULL, 0, "test -e %s/t/checkpoint-2/" OLD " && ! test -e %s/t/checkpoint-2/old/transformer_2", dir,
                   dir) == 0);
    CHECK(test_run(NULL, 0, "cmp -s %s/model/transformer_2/diffusion_pytorch_model.safetensors "
                   "%s/t/checkpoint-2/transformer_2/diffusion_pytorch_model.safetensors", dir, dir) == 0);
}

static double num(json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* Learning with nft (make test-slow): recipes/tiny-cpu-nft.yaml as shipped (150 steps of 2 x 16 ODE rollouts, CFG-free,
 * random_k 7 of 8 steps, the old policy with decay_type 1): the final eval's color_match exceeds the first by more
 * than 3 standard errors of the difference (recipes/README.md quotes the run). About 2 minutes on 2 cores. */
TEST(nft_tiny_learns_slow) {
    TEST_SLOW();
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[1 << 16], path[700];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    const int rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml --set model.path=%s/model "
                            "--set logging.run_dir=%s/run --set checkpoint.every=-1", bin, dir, dir);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    json_t *rows[256];
    snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
    const int n = read_rows(path, rows, 256, 0);
    REQUIRE(n >= 2);
    const double m0 = num(rows[0], "eval/color_match/mean"), s0 = num(rows[0], "eval/color_match/se");
    const double m1 = num(rows[n - 1], "eval/color_match/mean"), s1 = num(rows[n - 1], "eval/color_match/se");
    const double z = (m1 - m0) / sqrt(s0 * s0 + s1 * s1);
    fprintf(stderr, "  nft: eval color_match %.4f +- %.4f -> %.4f +- %.4f (%.1f standard errors)\n", m0, s0, m1, s1, z);
    CHECK(z > 3);
    for (int i = 0; i < n; i++) json_decref(rows[i]);
}
