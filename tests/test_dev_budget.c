/* tests/test_dev_budget.c — the device-memory estimate of trainer/optim/train_dev.h as `vgrpo run --dry-run` prints it:
 *   - it equals what the model code allocates: a 1-step run of the tiny model on the EMULATED device (model.device cuda
 *     with VGRPO_EMULATE_DEVICE=1; VGRPO_EMULATE_DEVICE_REPORT=1 prints the peak of the bytes its mem_alloc was asked
 *     for, kernels/cuda/emu/k_emu.h) against the dry run's "allocated on the device by DiT, VAE, umT5, sync"
 *     bytes, exactly, for full fine-tuning with a KL reference, LoRA, checkpoint activations with an EMA and in-run
 *     evals, colocated (the trainer rank and the rollout worker, each its own process), algorithm.loss nft
 *     (full, LoRA, KL with CFG) and dpo (full, LoRA). The GPU-only parts (library workspaces, the CUDA context, the
 *     margin) are stated figures the emulated device cannot measure;
 *   - the one-GPU recipes (recipes/ named -1gpu) pass --dry-run without weights, run on the device in one process
 *     and save checkpoints, and their estimate fits an 80 GB H100. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/test.h"

#define EMU "VGRPO_EMULATE_DEVICE=1 VGRPO_EMULATE_DEVICE_REPORT=1 OMP_NUM_THREADS=1 "
#define SMALL                                                                                                      \
    "--set model.device=cuda --set rollout.num_steps=6 --set rollout.prompts_per_step=2 "                          \
    "--set rollout.samples_per_prompt=4 --set rollout.batch_size=3 --set algorithm.micro_batch_size=5 "             \
    "--set data.eval_samples_per_prompt=1 --set optim.total_steps=1 --set checkpoint.every=1"

/* The n-th (0-based) number after `key` in s, or -1. */
static long long nth_after(const char *s, const char *key, int n) {
    const char *p = s;
    for (int i = 0; p && i <= n; i++)
        if ((p = strstr(p, key))) p += strlen(key);
    return p ? atoll(p) : -1;
}

/* A 1-step emulated run and the dry run of the same recipe (recipes/<recipe>.yaml with the model at <dir>/<model>);
 * the peak(s) and the estimate(s) compared. */
static void compare_recipe(const char *dir, const char *recipe, const char *model, const char *name,
                           const char *extra, int colocated) {
    char run[16384], dry[16384], log[16384];
    const char *bin = test_vgrpo_bin();
    const int st = test_run(run, sizeof run, EMU "%s run recipes/%s.yaml " SMALL " --set model.path=%s/%s "
                                             "--set logging.run_dir=%s/%s %s 2>&1", bin, recipe, dir, model, dir,
                            name, extra);
    if (st) test_fail(__FILE__, __LINE__, "%s: the emulated run failed: %s", name, run);
    REQUIRE(test_run(dry, sizeof dry, "%s run recipes/%s.yaml " SMALL " --set model.path=%s/%s "
                                      "--set logging.run_dir=%s/%s-dry %s --dry-run 2>&1", bin, recipe, dir, model,
                     dir, name, extra) == 0);
    const long long peak = nth_after(run, "emulated device: peak ", 0);
    /* the dry run's "(N bytes: always + the larger phase)" figures, in process order */
    long long fig[2] = {-1, -1};
    const char *p = dry;
    for (int i = 0; i < 2 && (p = strstr(p, "allocated on the device by DiT, VAE, umT5, sync")); i++) {
        const char *q = strchr(p, '(');
        fig[i] = q ? atoll(q + 1) : -1;
        p += 10;
    }
    printf("  %s: emulated peak %lld bytes, dry-run estimate %lld bytes\n", name, peak, fig[0]);
    CHECK_MSG(peak > 0 && peak == fig[0], "%s: emulated peak %lld != estimate %lld\n%s", name, peak, fig[0], dry);
    if (colocated) { /* the rollout worker's own process */
        REQUIRE(test_run(log, sizeof log, "cat %s/%s/logs/worker-0.log", dir, name) == 0);
        const long long wpeak = nth_after(log, "emulated device: peak ", 0);
        printf("  %s rollout worker: emulated peak %lld bytes, dry-run estimate %lld bytes\n", name, wpeak, fig[1]);
        CHECK_MSG(wpeak > 0 && wpeak == fig[1], "%s worker: emulated peak %lld != estimate %lld", name, wpeak, fig[1]);
        CHECK(strstr(dry, "per GPU (a trainer rank and 1 rollout worker, parallel.share_gpus true)") != NULL);
    }
}

static void compare(const char *dir, const char *name, const char *extra, int colocated) {
    compare_recipe(dir, "tiny-cpu", "model", name, extra, colocated);
}

TEST(dev_budget_equals_emulated_peak) {
    const char *dir = test_tmpdir();
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 3 >/dev/null",
                     test_vgrpo_bin(), dir) == 0);
    compare(dir, "full", "--set algorithm.beta=0.05 --set logging.eval_every=0", 0);
    compare(dir, "lora", "--set algorithm.beta=0.05 --set model.lora.rank=8 --set logging.eval_every=0", 0);
    compare(dir, "ckpt-ema-eval", "--set algorithm.activations=checkpoint --set algorithm.ema_decay=0.9 "
                                  "--set logging.eval_every=1 --set rollout.batch_size=8", 0);
    compare(dir, "colocated", "--set mode=colocated --set algorithm.beta=0.05 --set logging.eval_every=0 "
                              "--set parallel.share_gpus=true", 1);
}

/* Image to video: TI2V's first-frame conditioning runs the DiT with a timestep per token, I2V-A14B's concatenated
 * condition with one per row (model/flow/denoise.h); the estimate sizes each as the step runs it (it sized I2V-A14B
 * per token: twice the rollout's activations at 14,040 tokens). */
TEST(dev_budget_image_to_video_equals_emulated_peak) {
    const char *dir = test_tmpdir();
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-ti2v --out %s/ti2v --seed 3 >/dev/null && "
                     "%s init-model --preset tiny-i2v --out %s/a14b --seed 3 >/dev/null", test_vgrpo_bin(), dir,
                     test_vgrpo_bin(), dir) == 0);
    compare_recipe(dir, "tiny-cpu-i2v", "ti2v", "ti2v", "--set logging.eval_every=0", 0);
    compare_recipe(dir, "tiny-cpu-i2v-a14b", "a14b", "a14b", "--set logging.eval_every=0 --set parallel.sp=1", 0);
}

/* algorithm.loss nft (recipes/tiny-cpu-nft.yaml: CFG-free training rows, the old policy's device copy and its
 * forward; under LoRA the old policy is the base again with its adapter). */
#define NFT_SEL "--set 'algorithm.timestep_selection=random_k 5'" /* of SMALL's 6 steps */
TEST(dev_budget_nft_equals_emulated_peak) {
    const char *dir = test_tmpdir();
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 3 >/dev/null",
                     test_vgrpo_bin(), dir) == 0);
    compare_recipe(dir, "tiny-cpu-nft", "model", "nft", "--set logging.eval_every=0 " NFT_SEL, 0);
    compare_recipe(dir, "tiny-cpu-nft", "model", "nft-lora", "--set logging.eval_every=0 --set model.lora.rank=8 " NFT_SEL, 0);
    compare_recipe(dir, "tiny-cpu-nft", "model", "nft-kl-cfg", "--set logging.eval_every=0 --set algorithm.beta=0.05 " NFT_SEL " "
                   "--set rollout.guidance_scale=4.5", 0);
}

/* algorithm.loss dpo (recipes/tiny-cpu-dpo.yaml): the reference's forward beside the policy's, the reference a device
 * copy of the initial weights, or under LoRA the base with its adapter off. */
TEST(dev_budget_dpo_equals_emulated_peak) {
    const char *dir = test_tmpdir();
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 3 >/dev/null",
                     test_vgrpo_bin(), dir) == 0);
    compare_recipe(dir, "tiny-cpu-dpo", "model", "dpo", "--set logging.eval_every=0 " NFT_SEL, 0);
    compare_recipe(dir, "tiny-cpu-dpo", "model", "dpo-lora", "--set logging.eval_every=0 --set model.lora.rank=8 " NFT_SEL, 0);
}

/* The one-GPU recipes: valid without weights, on the device in one process, saving checkpoints, and fitting an 80 GB
 * card by the estimate the trainer checks at start-up. */
TEST(dev_budget_one_gpu_recipes_fit_h100) {
    const char *recipes[3] = {"wan2.1-t2v-1.3b-1gpu", "wan2.1-t2v-1.3b-lora-1gpu", "wan2.2-ti2v-5b-lora-1gpu"};
    for (int i = 0; i < 3; i++) {
        char out[32768];
        const int st = test_run(out, sizeof out, "%s run recipes/%s.yaml --dry-run 2>&1", test_vgrpo_bin(), recipes[i]);
        CHECK_MSG(st == 0, "%s: --dry-run failed: %s", recipes[i], out);
        CHECK_MSG(strstr(out, "mode: local") && strstr(out, "device: cuda"), "%s: not a one-process device recipe",
                  recipes[i]);
        const long long every = nth_after(out, "\ncheckpoint:\n  every: ", 0);
        CHECK_MSG(every > 0, "%s: checkpoint.every %lld (want > 0)", recipes[i], every);
        const char *t = strstr(out, "    total ");
        REQUIRE(t);
        const char *num = t + strspn(t, " total");
        const double gib = atof(num);
        const char *eol = strchr(t, '\n');
        printf("  %s: device estimate %.2f GiB\n", recipes[i], gib);
        CHECK_MSG(strstr(out, "local process (trainer and rollout), on its GPU") != NULL, "%s", out);
        CHECK_MSG(eol && strstr(t, "fits on an 80 GB H100") && strstr(t, "fits on an 80 GB H100") < eol,
                  "%s: does not fit an 80 GB H100: %.*s", recipes[i], (int)(eol ? eol - t : 200), t);
        CHECK(gib > 10.0 && gib < 79.65);
    }
}

/* Two trainer ranks of the tiny I2V-A14B (colocated), ZeRO stage 2 and stage 3, whose two trained experts share one
 * window (trainer/dp/dp_dev.h: one bf16 copy, one gradient buffer): the larger of the ranks' emulated peaks equals the
 * dry run's estimate (made with the emulated device's comm, as the run: no NCCL scratch), and the window's estimate
 * is below stage 2's by one expert's bf16 copy and fp32 gradients at least. */
TEST(dev_budget_expert_window_equals_emulated_peak) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-i2v --out %s/a14b --seed 3 >/dev/null", bin, dir) == 0);
    long long est[4] = {0};
    for (int stage = 2; stage <= 3; stage++) {
        const char *x = "--set logging.eval_every=0 --set parallel.sp=1 --set mode=colocated --set parallel.trainer_ranks=2";
        REQUIRE(test_run(out, sizeof out, EMU "%s run recipes/tiny-cpu-i2v-a14b.yaml " SMALL " --set model.path=%s/a14b "
                         "--set logging.run_dir=%s/w%d %s --set parallel.zero_stage=%d 2>&1", bin, dir, dir, stage, x,
                         stage) == 0);
        const long long p0 = nth_after(out, "emulated device: peak ", 0), p1 = nth_after(out, "emulated device: peak ", 1);
        const long long peak = p0 > p1 ? p0 : p1;
        REQUIRE(test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s run recipes/tiny-cpu-i2v-a14b.yaml " SMALL
                         " --set model.path=%s/a14b --set logging.run_dir=%s/w%d-dry %s --set parallel.zero_stage=%d "
                         "--dry-run 2>&1", bin, dir, dir, stage, x, stage) == 0);
        const char *q = strstr(out, "allocated on the device by DiT, VAE, umT5, sync");
        q = q ? strchr(q, '(') : NULL;
        est[stage] = q ? atoll(q + 1) : -1;
        printf("  stage %d, 2 ranks: emulated peaks %lld, %lld bytes; dry-run estimate %lld bytes\n", stage, p0, p1,
               est[stage]);
        CHECK_MSG(p0 > 0 && p1 > 0 && peak == est[stage], "stage %d: peak %lld != estimate %lld", stage, peak,
                  est[stage]);
        CHECK(stage == 2 || strstr(out, "weights (bf16: one expert's window"));
    }
    CHECK(est[2] - est[3] >= 6LL * 599488);
}
