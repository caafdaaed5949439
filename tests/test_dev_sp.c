/* tests/test_dev_sp.c — Ulysses x Ring sequence parallelism in the trainer on the device path (model.device cuda on
 * the EMULATED device: bf16 activations in host memory, the MPI comm moving the device buffers; the DiT's SP
 * branches, sp/usp_attention.c and sp/shard.c on the device's table), against the one-rank device run:
 *   - colocated runs of 3 steps at sp 2 as Ulysses (u2r1) and as a ring (u1r2), with 2 trainer ranks (dp 1) and 4
 *     (dp 2): the same step-0 rewards per sample (the workers roll out with model.path's weights), on-policy |dlogp|
 *     exactly 0 at every step for Ulysses (the trainer's forward is bit-identical to the rollout's sp-1 forward),
 *     the final weights within DEV_SP_REL_L2 (Ulysses) and DEV_SP_RING_REL_L2 (ring) relative L2 of the one-rank
 *     run's. Not bit-identical, even for Ulysses: the backward rounds each rank's PART of the fp32 sums over tokens to
 *     bf16 where a GEMM reads them (d ctx, the cross-attention's d k2 / d v2), one rounding per rank instead of one
 *     (tests/mpi/mpi_dit_dev.c measures it per tensor); the ring's merged attention outputs are rounded to bf16 at
 *     each merge, in the forward too;
 *   - vgrpo parity with 2 and 4 device trainer ranks at sp 2: exactly 0 for Ulysses; within the device's ring bound
 *     (8 bf16 epsilons of the maxima, trainer_parity) for the ring;
 *   - the device-memory estimate under SP equals every rank's emulated peak;
 *   - the SP groups over the fake NCCL (as on GPUs) give the same checkpoints as over MPI, bit for bit;
 *   - image to video (TI2V per-token timesteps, I2V-A14B two experts) under Ulysses: parity exactly 0. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "tests/metrics_rows.h"
#include "tests/ckpt_cmp.h"
#include "tests/test.h"

/* Seen (tiny preset, 3 steps): Ulysses 2.8e-4 (4 % of the update), ring 9.4e-4 (13 %), at 2 and 4 ranks alike;
 * data parallelism alone at 2 ranks: 1.4e-4 (tests/test_dev_dp.c). */
#define DEV_SP_REL_L2 1e-3
#define DEV_SP_RING_REL_L2 2e-3

/* This test's folder (with the pid) and a tiny model in it. */
static const char *run_dir(void) {
    static char path[600];
    char out[4096];
    snprintf(path, sizeof path, "%s.%d", test_tmpdir(), (int)getpid());
    REQUIRE(test_run(out, sizeof out, "rm -rf %s && mkdir -p %s && %s init-model --preset tiny --out %s/model --seed 2",
                     path, path, test_vgrpo_bin(), path) == 0);
    return path;
}

/* A 3-step colocated run on the emulated device into dir/name with `ranks` trainer ranks and sp / ulysses. */
static void drun(const char *dir, const char *name, int ranks, int sp, int ulysses) {
    static char out[65536];
    const int rc = test_run(
        out, sizeof out,
        "env VGRPO_EMULATE_DEVICE=1 OMP_NUM_THREADS=1 %s run recipes/tiny-cpu.yaml --set mode=colocated "
        "--set model.device=cuda --set model.path=%s/model --set logging.run_dir=%s/%s --set rollout.num_steps=4 "
        "--set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 --set data.eval_samples_per_prompt=1 "
        "--set logging.eval_every=2 --set algorithm.beta=0.05 --set optim.max_grad_norm=0.05 "
        "--set optim.weight_decay=0.01 --set optim.schedule=linear --set optim.total_steps=3 --set checkpoint.every=1 "
        "--set checkpoint.total_limit=0 --set parallel.trainer_ranks=%d --set parallel.sp=%d "
        "--set parallel.ulysses_degree=%d --steps 3 >%s/%s.log 2>&1",
        test_vgrpo_bin(), dir, dir, name, ranks, sp, ulysses, dir, name);
    if (rc) {
        test_run(out, sizeof out, "tail -c 4000 %s/%s.log", dir, name);
        test_fail(__FILE__, __LINE__, "run %s (%d ranks, sp %d, ulysses %d): exit %d:\n%s", name, ranks, sp, ulysses,
                  rc, out);
        longjmp(test_abort_jmp, 1);
    }
}

static double num(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Run `name` against the one-rank device run r1 (see the top comment); ring: the ring's bounds. */
static void check_vs_one_rank(const char *dir, const char *name, int ring) {
    char pa[1024], pb[1024], out[8192];
    json_t *r1[8], *rn[8];
    snprintf(pa, sizeof pa, "%s/r1/metrics.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", dir, name);
    const int n1 = read_rows(pa, r1, 8, 0), nn = read_rows(pb, rn, 8, 0);
    REQUIRE(n1 == 4 && nn == 4);
    const char *same[] = {"reward/mean", "reward/std", "reward/min", "reward/max", "transitions", "masked_fraction"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++)
        CHECK_MSG(num(r1[0], same[k]) == num(rn[0], same[k]), "%s step 0 %s: one rank %.9g, sp %.9g", name, same[k],
                  num(r1[0], same[k]), num(rn[0], same[k]));
    for (int i = 0; i < 3; i++) {
        const double d = num(rn[i], "log_prob_mean_abs_diff");
        CHECK_MSG(ring ? d > 0 && d < 1e-2 : d == 0.0, "%s step %d: |dlogp| %g", name, i, d);
        CHECK(num(rn[i], "weight_sync/hash_match") == 1);
        CHECK_NEAR(num(rn[i], "grad_norm"), num(r1[i], "grad_norm"), 5e-2 * num(r1[i], "grad_norm"));
    }
    for (int i = 0; i < n1; i++) json_decref(r1[i]);
    for (int i = 0; i < nn; i++) json_decref(rn[i]);
    CHECK_MSG(test_run(out, sizeof out, "test \"$(head -1 %s/r1/rewards.jsonl)\" = \"$(head -1 %s/%s/rewards.jsonl)\"",
                       dir, dir, name) == 0, "%s: step-0 rewards per uid differ", name);
    double d2, a2, u2, w2;
    snprintf(pa, sizeof pa, "%s/r1/checkpoint-3/transformer/diffusion_pytorch_model.safetensors", dir);
    snprintf(pb, sizeof pb, "%s/%s/checkpoint-3/transformer/diffusion_pytorch_model.safetensors", dir, name);
    ckpt_l2_diff(pb, pa, &d2, &a2);
    snprintf(pb, sizeof pb, "%s/model/transformer/diffusion_pytorch_model.safetensors", dir);
    ckpt_l2_diff(pa, pb, &u2, &w2);
    const double rel = sqrt(d2 / a2), bound = ring ? DEV_SP_RING_REL_L2 : DEV_SP_REL_L2;
    fprintf(stderr, "  %s vs one rank on the device: relative L2 of the final weights %.3g (of the update: %.3g)\n",
            name, rel, sqrt(d2 / u2));
    CHECK_MSG(rel <= bound, "%s: relative L2 %.3g > %.1g", name, rel, bound);
    CHECK(u2 > 0); /* training moved the weights */
}

TEST(dev_sp_runs_ulysses_and_ring_vs_one_rank) {
    const char *dir = run_dir();
    drun(dir, "r1", 1, 1, 1);
    drun(dir, "u2", 2, 2, 2);
    drun(dir, "g2", 2, 2, 1);
    drun(dir, "u2d2", 4, 2, 2);
    drun(dir, "g2d2", 4, 2, 1);
    check_vs_one_rank(dir, "u2", 0);
    check_vs_one_rank(dir, "g2", 1);
    check_vs_one_rank(dir, "u2d2", 0);
    check_vs_one_rank(dir, "g2d2", 1);
    test_run(NULL, 0, "rm -rf %s", dir);
}

TEST(dev_sp_parity_ulysses_zero_ring_bounded) {
    const char *dir = run_dir();
    static char out[65536];
    const struct {
        int ranks, ulysses;
        const char *layout, *result;
    } c[] = {
        {2, 2, "dp 1 x sp 2 (ulysses 2, ring 1)", "= 0 (tolerance 0), max |v_trainer - v_rollout| = 0 (tolerance 0): PASS"},
        {4, 2, "dp 2 x sp 2 (ulysses 2, ring 1)", "= 0 (tolerance 0), max |v_trainer - v_rollout| = 0 (tolerance 0): PASS"},
        {2, 1, "dp 1 x sp 2 (ulysses 1, ring 2)", ": PASS"},
        {4, 1, "dp 2 x sp 2 (ulysses 1, ring 2)", ": PASS"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const int st = test_run(out, sizeof out,
                                "VGRPO_EMULATE_DEVICE=1 OMP_NUM_THREADS=1 %s parity recipes/tiny-cpu.yaml "
                                "--set mode=colocated --set model.device=cuda --set model.path=%s/model "
                                "--set parallel.trainer_ranks=%d --set parallel.sp=2 --set parallel.ulysses_degree=%d "
                                "--set parallel.rollout_workers=2 --set rollout.num_steps=4 --set logging.run_dir=%s/p%zu "
                                "2>&1",
                                test_vgrpo_bin(), dir, c[i].ranks, c[i].ulysses, dir, i);
        CHECK_MSG(st == 0 && strstr(out, c[i].layout) && strstr(out, "model.device cuda (emulated)") &&
                      strstr(out, c[i].result),
                  "parity %s: exit %d:\n%s", c[i].layout, st, out);
        if (c[i].ulysses == 1) /* the ring differs from the rollout, within the bf16 bound */
            CHECK_MSG(!strstr(out, "max |v_trainer - v_rollout| = 0 "), "ring parity exactly 0:\n%s", out);
    }
    test_run(NULL, 0, "rm -rf %s", dir);
}

/* The trainer rank's device estimate under sequence parallelism (trainer/optim/train_dev.h: one rank's activations
 * for S / sp tokens, the USP attention's held workspace and the velocity's all-gather) equals every rank's emulated
 * peak exactly under full fine-tuning: Ulysses and ring at 2 ranks with a KL reference; with LoRA (a ring at dp 2 x
 * sp 2) it counts the gather beside the LoRA scratch, which the run never holds together: at most the gather's
 * 262,144 bytes over (4 bytes x 2 rows x the tiny preset's tokens x 64 patch values). */
TEST(dev_sp_memory_estimate_equals_emulated_peak) {
    const char *dir = run_dir(), *bin = test_vgrpo_bin();
    static char run[65536], dry[65536];
    const struct {
        int ranks, ulysses;
        const char *extra;
    } c[] = {{2, 2, ""}, {2, 1, ""}, {4, 1, " --set model.lora.rank=8"}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char args[1024];
        snprintf(args, sizeof args,
                 "recipes/tiny-cpu.yaml --set mode=colocated --set model.device=cuda --set rollout.num_steps=4 "
                 "--set parallel.trainer_ranks=%d --set parallel.sp=2 --set parallel.ulysses_degree=%d "
                 "--set logging.eval_every=0 --set algorithm.beta=0.05 %s --set model.path=%s/model",
                 c[i].ranks, c[i].ulysses, c[i].extra, dir);
        const int st = test_run(run, sizeof run,
                                "VGRPO_EMULATE_DEVICE=1 VGRPO_EMULATE_DEVICE_REPORT=1 OMP_NUM_THREADS=1 %s run %s "
                                "--set logging.run_dir=%s/m%zu --steps 1 2>&1", bin, args, dir, i);
        CHECK_MSG(st == 0, "run %zu: %s", i, run);
        REQUIRE(test_run(dry, sizeof dry, "VGRPO_EMULATE_DEVICE=1 %s run %s --dry-run 2>&1", bin, args) == 0);
        const char *a = strstr(dry, "allocated on the device by DiT, VAE, umT5, sync"), *q = a ? strchr(a, '(') : NULL;
        const long long est = q ? atoll(q + 1) : -1;
        const char *p = run;
        int seen = 0;
        while ((p = strstr(p, "emulated device: peak "))) {
            p += strlen("emulated device: peak ");
            const long long pk = atoll(p);
            seen++;
            const long long over = c[i].extra[0] ? 262144 : 0; /* LoRA: the bound above */
            CHECK_MSG(est >= pk && est - pk <= over, "ranks %d ulysses %d: a rank's emulated peak %lld, estimate %lld",
                      c[i].ranks, c[i].ulysses, pk, est);
        }
        printf("  %d ranks, sp 2, ulysses %d%s: estimate %lld bytes, every rank's emulated peak at most that (%d "
               "ranks)\n", c[i].ranks, c[i].ulysses, c[i].extra, est, seen);
        CHECK_MSG(seen == c[i].ranks, "%d peaks reported for %d ranks:\n%s", seen, c[i].ranks, run);
    }
    test_run(NULL, 0, "rm -rf %s", dir);
}

/* On GPUs the SP groups are split from the NCCL world (trainer/run/run_setup.c): with the tests' fake NCCL
 * (VGRPO_NCCL_LIB, tests/fake_nccl/) on the emulated device the Ulysses all-to-all, the ring's send/recv, the
 * velocity's all-gather and d enc's all-reduce go through sp/comm_nccl.c on device pointers: the same checkpoints and
 * rewards as over MPI, bit for bit (Ulysses at dp 1 x sp 2; a ring at dp 2 x sp 2). */
TEST(dev_sp_over_nccl_equals_mpi) {
    const char *dir = run_dir();
    const char *e = getenv("VGRPO_MPI_TESTS");
    const char *bin = e && *e ? e : test_vgrpo_bin(), *slash = strrchr(bin, '/');
    char lib[1024], out[4096];
    snprintf(lib, sizeof lib, "%.*s/libfake_nccl.so", slash ? (int)(slash - bin) : 1, slash ? bin : ".");
    FILE *f = fopen(lib, "r");
    if (!f) {
        test_skip("no fake NCCL library beside the test binaries (make builds it with vgrpo_mpi_tests)");
        return;
    }
    fclose(f);
    drun(dir, "mu", 2, 2, 2);
    drun(dir, "mr", 4, 2, 1);
    setenv("VGRPO_NCCL_LIB", lib, 1);
    drun(dir, "nu", 2, 2, 2);
    drun(dir, "nr", 4, 2, 1);
    unsetenv("VGRPO_NCCL_LIB");
    CHECK_MSG(test_run(out, sizeof out, "grep -c 'gradients and weights over NCCL .*libfake_nccl.so' %s/nr.log", dir) ==
                  0 && atoi(out) == 4, "every rank on NCCL: %s", out);
    const char *pairs[2][2] = {{"mu", "nu"}, {"mr", "nr"}};
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(test_run(out, sizeof out, "cmp %s/%s/rewards.jsonl %s/%s/rewards.jsonl", dir, pairs[i][0], dir,
                           pairs[i][1]) == 0, "rewards: %s", out);
        for (int k = 1; k <= 3; k++)
            CHECK_MSG(test_run(out, sizeof out, "cmp %s/%s/checkpoint-%d/transformer/diffusion_pytorch_model.safetensors "
                               "%s/%s/checkpoint-%d/transformer/diffusion_pytorch_model.safetensors", dir, pairs[i][0],
                               k, dir, pairs[i][1], k) == 0,
                      "%s vs %s checkpoint-%d: %s", pairs[i][0], pairs[i][1], k, out);
    }
    test_run(NULL, 0, "rm -rf %s", dir);
}

/* Image to video under Ulysses on the device: TI2V's per-token timesteps (each SP rank embeds its tokens' slice) and
 * I2V-A14B's two experts and concatenated condition: parity exactly 0 at dp 1 x sp 2. */
TEST(dev_sp_parity_image_to_video_zero) {
    const char *dir = run_dir(), *bin = test_vgrpo_bin();
    static char out[65536];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-ti2v --out %s/ti2v --seed 3 >/dev/null && "
                     "%s init-model --preset tiny-i2v --out %s/a14b --seed 3 >/dev/null", bin, dir, bin, dir) == 0);
    const char *m[2][2] = {{"ti2v", "tiny-cpu-i2v"}, {"a14b", "tiny-cpu-i2v-a14b"}};
    for (int i = 0; i < 2; i++) {
        const int st = test_run(out, sizeof out,
                                "VGRPO_EMULATE_DEVICE=1 OMP_NUM_THREADS=1 %s parity recipes/%s.yaml --set mode=colocated "
                                "--set model.device=cuda --set model.path=%s/%s --set parallel.trainer_ranks=2 "
                                "--set parallel.sp=2 --set parallel.ulysses_degree=2 --set logging.run_dir=%s/p%d 2>&1",
                                bin, m[i][1], dir, m[i][0], dir, i);
        CHECK_MSG(st == 0 && strstr(out, "dp 1 x sp 2 (ulysses 2, ring 1)") &&
                      strstr(out, "max |logp_trainer - logp_rollout| = 0 (tolerance 0), max |v_trainer - v_rollout| = 0 "
                                  "(tolerance 0): PASS"),
                  "%s parity: exit %d:\n%s", m[i][0], st, out);
    }
    test_run(NULL, 0, "rm -rf %s", dir);
}
