/* tests/test_ema.c — algorithm.ema_decay: the moving average of the weights (trainer/run/ema.c), kept in
 * checkpoints under ema/ and used for eval and sample videos:
 *   - the saved EMA after steps 1 and 2 equals d * previous + (1 - d) * weights recomputed here in fp32, bit for bit
 *     (previous = the initial weights for step 1);
 *   - a colocated run (EMA pushed to the workers for each eval as version + 2^40, then the policy pushed back) gives
 *     the local run's metrics (eval/ema = 1, timings aside) and the same checkpoint files;
 *   - 1 step + --resume 1 step equals 2 straight steps, EMA included (byte-identical files). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_dit.h"
#include "tests/metrics_rows.h"
#include "tests/test.h"

#define D 0.75f

static int load(wan_model *m, const char *dir, const char *sub) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s", dir, sub);
    if (wan_model_load(m, p)) return test_fail(__FILE__, __LINE__, "%s", core_last_error()), -1;
    return 0;
}

TEST(ema_values_colocated_and_resume) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2048];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    snprintf(base, sizeof base, "--set model.path=%s/model --set rollout.num_steps=3 --set rollout.samples_per_prompt=4 "
             "--set data.eval_samples_per_prompt=1 --set checkpoint.every=1 --set checkpoint.total_limit=0 "
             "--set algorithm.ema_decay=%.2f --set logging.eval_every=1", dir, (double)D);
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --steps 2 --set logging.run_dir=%s/l", bin, base, dir);
    if (st) test_fail(__FILE__, __LINE__, "local run: %s", out);
    /* EMA values */
    char c1[700], c2[700];
    snprintf(c1, sizeof c1, "%s/l/checkpoint-1", dir);
    snprintf(c2, sizeof c2, "%s/l/checkpoint-2", dir);
    wan_model w0, w1, w2, e1, e2;
    REQUIRE_OK(load(&w0, dir, "model/transformer"));
    REQUIRE_OK(load(&w1, c1, "transformer"));
    REQUIRE_OK(load(&w2, c2, "transformer"));
    REQUIRE_OK(load(&e1, c1, "ema/transformer"));
    REQUIRE_OK(load(&e2, c2, "ema/transformer"));
    int64_t bad1 = 0, bad2 = 0, moved = 0;
    const float w = 1.0f - D;
    for (int64_t k = 0; k < w0.layout.numel; k++) {
        const float a = D * w0.params[k] + w * w1.params[k];
        const float b = D * a + w * w2.params[k];
        bad1 += a != e1.params[k], bad2 += b != e2.params[k], moved += w2.params[k] != w0.params[k];
    }
    CHECK_MSG(bad1 == 0 && bad2 == 0, "EMA differs from d*prev + (1-d)*w in %lld / %lld elements", (long long)bad1,
              (long long)bad2);
    CHECK(moved > 0);
    wan_model_free(&w0), wan_model_free(&w1), wan_model_free(&w2), wan_model_free(&e1), wan_model_free(&e2);
    /* colocated == local */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --steps 2 --set mode=colocated --set logging.run_dir=%s/c",
                  bin, base, dir);
    if (st) test_fail(__FILE__, __LINE__, "colocated run: %s", out);
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/l/metrics.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/c/metrics.jsonl", dir);
    json_t *ra[8], *rb[8];
    const int na = read_rows(pa, ra, 8, 1), nb = read_rows(pb, rb, 8, 1);
    CHECK(na == 3 && nb == 3);
    for (int i = 0; i < na && i < nb; i++) {
        CHECK(json_integer_value(json_object_get(ra[i], "eval/ema")) == 1);
        CHECK_MSG(json_equal(ra[i], rb[i]), "metrics row %d differs between local and colocated", i);
    }
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
    CHECK(test_run(NULL, 0, "cmp -s %s/l/checkpoint-2/ema/transformer/diffusion_pytorch_model.safetensors "
                   "%s/c/checkpoint-2/ema/transformer/diffusion_pytorch_model.safetensors", dir, dir) == 0);
    /* resume: 1 + 1 == 2 */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --steps 1 --set logging.run_dir=%s/r", bin, base, dir);
    if (st) test_fail(__FILE__, __LINE__, "1 step: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --steps 2 --set logging.run_dir=%s/r --resume %s/r", bin,
                  base, dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "resume: %s", out);
    const char *files[] = {"ema/transformer/diffusion_pytorch_model.safetensors", "transformer/diffusion_pytorch_model.safetensors",
                           "optimizer.safetensors"};
    for (int i = 0; i < 3; i++)
        CHECK_MSG(test_run(NULL, 0, "cmp -s %s/l/checkpoint-2/%s %s/r/checkpoint-2/%s", dir, files[i], dir, files[i]) == 0,
                  "%s differs after resume", files[i]);
}
