/* cli/check/check_grpo.c — the GPU check's GRPO rows: the rollout engine (rollout/engine.c) and
 * the training step (trainer/step/train_step.c with the device optimizer step of trainer/optim/train_dev.h) on the device, with
 * the tiny Wan preset, against the same code on the fp32 CPU model in the same binary. It lives in cli/ because it
 * composes rollout/ and trainer/ (the one folder allowed to), and registers itself from a constructor (check.h);
 * linked into gpu_check and gpu_check_emu only, so it needs nothing but libc/libm (no recipe, prompt file, VAE,
 * scorer process or checkpoint files: the GPU machine may lack the libraries the vgrpo binary links).
 *
 * The task: 6 "prompts" (conditioning [8, 64] normals from Philox, seed 42, uid = prompt), latent 16 x 2 x 8 x 8
 * (32 tokens), 6 denoising steps, shift 3, eta 1, CFG 4.5 (the negative prompt all zeros); reward of a sample of
 * prompt p = the mean of latent channel p % 4 of its final latent (a pure function, so every difference comes from
 * the DiT). GRPO: 2 prompts x 8 samples per step (uid = step x 16 + slot x 8 + replica, prompts in a fixed rotation),
 * group advantages, every step trained, micro-batches of 16 transitions, clip 0.2, beta 0, AdamW lr 5e-4 constant,
 * clip norm 1; 10 steps. Eval: 6 prompts x 4 samples with the eval noise stream, before and after.
 *
 * Rows:
 *   grpo 10 steps vs cpu   the device run's final eval against the CPU run's: rel = |mean_dev - mean_cpu| / se_diff
 *                          (se_diff = sqrt(se_dev^2 + se_cpu^2), the standard error of the difference of two means of
 *                          24 samples); band 2: two draws of one learning process (bf16 rounding changes the samples,
 *                          so the updates, so the runs), not two roundings of one number. Also fails when the device
 *                          run did not learn (its eval after <= before). The note prints both runs' figures.
 *   grpo first updates     info: every step's first-update mean |logp_new - logp_old| on the device (0: on-policy,
 *                          the trainer recomputes the rollout's log-probs exactly)
 *   grpo parity            one rollout of 16 samples at the trained weights, 3 samples per forward (CFG: 6 rows),
 *                          recomputed by the trainer path with 5 transitions per forward: max |dlogp| (the row's
 *                          figure) and max |dv| (worst) must be exactly 0 (band 0): vgrpo parity on the GPU. It holds
 *                          when the device's GEMM and attention are batch-invariant (the "batch mates" DiT row).
 *   grpo lora parity       the same with a rank-8 LoRA adapter on every linear (B random) on those weights: the
 *                          adapter's GEMMs in the rollout and in the trainer's recomputation.
 * On the emulated device (make gpu-check-emu) every row is computed the same way. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "kernels/cuda/check/check.h"
#include "kernels/cuda/check/check_util.h"
#include "model/dit/wan_dev_exec.h"
#include "model/dit/wan_lora.h"
#include "rollout/engine.h"
#include "trainer/step/grpo.h"
#include "trainer/optim/train_dev.h"
#include "trainer/step/train_step.h"

enum { P = 6, B = 2, G = 8, N = 6, L = 8, STEPS = 10, EVAL_S = 4 };
static const int64_t SHAPE[4] = {16, 2, 8, 8};
#define NL (16 * 2 * 8 * 8)

typedef struct {
    const char *name;
    wan_model m;
    const wan_exec *ex;      /* NULL: the CPU */
    optim_adamw opt;
    trainer_config tc;
    double eval0, eval1, se1;
    double first_dlogp;       /* largest first-update mean |dlogp| over the steps */
} run;

static float reward_of(const core_traj *t, int p) {
    const float *x = core_traj_latent(t, t->n_steps) + (int64_t)(p % 4) * (NL / 16);
    double s = 0;
    for (int i = 0; i < NL / 16; i++) s += x[i];
    return (float)(s / (NL / 16));
}

/* n samples of the given prompts and uids, with velocities when vel != NULL. */
static int sample(run *R, const float *emb, int td, const int *prompt, const uint64_t *uids, int n, uint32_t stream,
                  int batch, float *const *vel, core_traj *out) {
    rollout_config rc;
    if (rollout_config_init(&rc, N, 3.0, 1.0f, 4.5f, SHAPE, L, 42, batch)) return -1;
    rc.stream = stream;
    rc.velocities = vel;
    const float *cond[16];
    for (int j = 0; j < n; j++) cond[j] = emb + (int64_t)prompt[j] * L * td;
    const rollout_experts E = rollout_one_expert(&R->m);
    return rollout_generate(&rc, &E, R->ex, n, cond, uids, NULL, out);
}

static int eval_mean(run *R, const float *emb, int td, double *mean, double *se) {
    int prompt[P * EVAL_S];
    uint64_t uids[P * EVAL_S];
    core_traj t[P * EVAL_S];
    double s = 0, q = 0;
    for (int k = 0; k < P * EVAL_S; k += 12) { /* 12 at a time (sample()'s conditioning array holds 16) */
        for (int j = 0; j < 12; j++) prompt[k + j] = (k + j) / EVAL_S, uids[k + j] = (uint64_t)(k + j);
        if (sample(R, emb, td, prompt + k, uids + k, 12, CORE_STREAM_EVAL_NOISE, 12, NULL, t + k)) return -1;
    }
    for (int j = 0; j < P * EVAL_S; j++) {
        const double r = reward_of(&t[j], prompt[j]);
        s += r, q += r * r;
        core_traj_free(&t[j]);
    }
    const int n = P * EVAL_S;
    *mean = s / n;
    *se = sqrt(fmax(q / n - *mean * *mean, 0.0) / (n - 1));
    return 0;
}

static int train(run *R, const float *emb, int td, const optim_config *oc) {
    double se0;
    if (eval_mean(R, emb, td, &R->eval0, &se0)) return -1;
    for (int k = 0; k < STEPS; k++) {
        int prompt[B * G];
        uint64_t uids[B * G];
        for (int j = 0; j < B * G; j++) prompt[j] = (k * B + j / G) % P, uids[j] = (uint64_t)(k * B * G + j);
        core_traj t[B * G];
        if (sample(R, emb, td, prompt, uids, B * G, CORE_STREAM_ROLLOUT_NOISE, 8, NULL, t)) return -1;
        float rew[B * G], adv[B * G];
        uint8_t mask[B * G];
        const float *cond[B * G];
        for (int j = 0; j < B * G; j++) rew[j] = reward_of(&t[j], prompt[j]), cond[j] = emb + prompt[j] * L * td;
        grpo_adv_stats as;
        grpo_loss_stats st = {0};
        optim_step_info info;
        trainer_batch tb = {.n = B * G, .traj = t, .cond = cond, .neg = NULL, .text_len = L, .adv = adv, .mask = mask};
        const int bad = grpo_advantages(rew, B, G, GRPO_STD_GROUP, 5.0f, adv, mask, &as) ||
                        trainer_update(&R->m, NULL, R->ex, &R->tc, &tb, &R->opt, oc, &st, &info);
        for (int j = 0; j < B * G; j++) core_traj_free(&t[j]);
        if (bad) return -1;
        const double d = st.n_transitions ? st.abs_logp_diff_sum / st.n_transitions : 0;
        R->first_dlogp = d > R->first_dlogp ? d : R->first_dlogp;
    }
    return eval_mean(R, emb, td, &R->eval1, &R->se1);
}

/* The parity probe: the largest |logp_new - logp_rollout| and |v_new - v_rollout| over every transition. */
typedef struct {
    const core_traj *t;
    float *const *vel;
    double dlogp, dv;
} parity;

static void probe(void *ctx, int s, int i, const float *v, int64_t nl, float logp) {
    parity *q = ctx;
    const double d = fabs((double)logp - q->t[s].log_probs[i]);
    q->dlogp = d > q->dlogp ? d : q->dlogp;
    const float *vr = q->vel[s] + (int64_t)i * nl;
    for (int64_t k = 0; k < nl; k++) {
        const double e = fabs((double)v[k] - vr[k]);
        q->dv = e > q->dv ? e : q->dv;
    }
}

static int parity_check(run *R, const float *emb, int td, parity *q) {
    int prompt[16];
    uint64_t uids[16];
    core_traj t[16];
    float *vel[16] = {NULL};
    float adv[16] = {0};
    uint8_t mask[16] = {0};
    const float *cond[16];
    int rc = -1;
    for (int j = 0; j < 16; j++) {
        prompt[j] = j % P, uids[j] = 5000 + (uint64_t)j, cond[j] = emb + prompt[j] * L * td;
        if (!(vel[j] = malloc(sizeof(float) * N * NL))) goto out;
    }
    if (sample(R, emb, td, prompt, uids, 16, CORE_STREAM_ROLLOUT_NOISE, 3, vel, t)) goto out;
    trainer_config tc = R->tc;
    tc.micro_batch_size = 5;
    tc.probe = probe;
    tc.probe_ctx = q;
    q->t = t, q->vel = vel;
    trainer_batch tb = {.n = 16, .traj = t, .cond = cond, .neg = NULL, .text_len = L, .adv = adv, .mask = mask};
    grpo_loss_stats st = {0};
    rc = trainer_accumulate(&R->m, NULL, R->ex, &tc, &tb, 0, &st);
    for (int j = 0; j < 16; j++) core_traj_free(&t[j]);
out:
    for (int j = 0; j < 16; j++) free(vel[j]);
    return rc;
}

static void check_grpo(const ck_shapes *s, const char *only) {
    (void)s;
    if (!ck_selected("grpo", only)) return;
    const char *shape = "tiny 2x8 N6 10 steps";
    wan_config c;
    run cpu = {.name = "cpu"}, dev = {.name = "device"};
    wan_dev_exec *x = NULL;
    trainer_dev D = {0};
    float *emb = NULL;
    int ok = 0;
    const optim_config oc = {.lr = 5e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0,
                             .max_grad_norm = 1.0, .schedule = OPTIM_SCHED_CONSTANT, .total_steps = STEPS};
    if (wan_config_preset(&c, "tiny") || wan_model_init(&cpu.m, &c) || wan_model_init(&dev.m, &c) ||
        wan_model_alloc_grads(&cpu.m) || optim_adamw_init(&cpu.opt, cpu.m.layout.numel) ||
        optim_adamw_init(&dev.opt, dev.m.layout.numel) || !(x = wan_dev_exec_new(&k_cuda_ops)))
        goto out;
    wan_params_init_random(&cpu.m, 42);
    memcpy(dev.m.params, cpu.m.params, sizeof(float) * (size_t)cpu.m.layout.numel);
    const int td = c.text_dim;
    if (!(emb = malloc(sizeof(float) * P * L * (size_t)td))) goto out;
    for (int p = 0; p < P; p++) core_philox_normal(emb + (int64_t)p * L * td, (int64_t)L * td, 42, 0, (uint32_t)p, 4);
    const wan_exec dex = {.dev = x};
    dev.ex = &dex;
    wan_model *pd[1] = {&dev.m};
    optim_adamw *od[1] = {&dev.opt};
    if (trainer_dev_init(&D, x, pd, 1, NULL, od)) goto out;
    for (int r = 0; r < 2; r++) {
        run *R = r ? &dev : &cpu;
        R->tc = (trainer_config){.sel = {GRPO_SEL_ALL, 0, 0, 0, 0}, .seed = 42, .clip_eps = 0.2f, .beta = 0.0f,
                                 .micro_batch_size = 16, .acts_mode = WAN_ACTS_STORE};
        if (r) R->tc.opt_step = trainer_dev_opt_step, R->tc.opt_step_ctx = &D;
        if (train(R, emb, td, &oc)) goto out;
    }
    ok = 1;
out:
    if (!ok) {
        ck_row_error("grpo 10 steps vs cpu", shape, core_last_error());
    } else {
        const double se = sqrt(cpu.se1 * cpu.se1 + dev.se1 * dev.se1), z = fabs(dev.eval1 - cpu.eval1) / se;
        char note[200], txt[200];
        snprintf(note, sizeof note, "eval reward cpu %.4f -> %.4f, device %.4f -> %.4f (+- %.4f); rel = |diff| / se_diff",
                 cpu.eval0, cpu.eval1, dev.eval0, dev.eval1, dev.se1);
        ck_row_figures("grpo 10 steps vs cpu", shape, "bf16", z, 2.0, fabs(dev.eval1 - cpu.eval1), -1, "fp32 CPU run",
                       dev.eval1 > dev.eval0, note);
        snprintf(txt, sizeof txt, "info: largest first-update mean |dlogp| device %.3g, cpu %.3g (0: on-policy, exact)",
                 dev.first_dlogp, cpu.first_dlogp);
        ck_row_info("grpo first updates", shape, txt);
        parity q = {0};
        if (parity_check(&dev, emb, td, &q)) {
            ck_row_error("grpo parity", "16 samples, fwd 3 / 5", core_last_error());
        } else {
            ck_row_figures("grpo parity", "16 samples, fwd 3 / 5", "bf16", q.dlogp, 0.0, q.dv, -1,
                           "rollout on the device", q.dv == 0.0, "max |dlogp| (worst: max |dv|), must be 0");
        }
        /* the same with a LoRA adapter (rank 8 on every linear, B random) on the trained weights: the adapter GEMMs */
        wan_lora l;
        const wan_lora_config lc = {8, 16.0, WAN_LORA_ALL, 7};
        parity ql = {0};
        int bad = wan_lora_init(&l, &c, &lc, 0);
        if (!bad) {
            for (int i = 1; i < l.layout.count; i += 2) {
                const wan_tensor *tt = &l.layout.tensors[i];
                ck_fill(l.params + tt->offset, (size_t)tt->numel, 900 + (uint64_t)i, -0.05f, 0.05f, 0);
            }
            bad = wan_model_attach_lora(&dev.m, &l) || wan_dev_exec_sync(x, &dev.m, 1000) ||
                  parity_check(&dev, emb, td, &ql);
            wan_model_attach_lora(&dev.m, NULL);
            wan_dev_exec_forget(x, &dev.m);
            wan_lora_free(&l);
        }
        if (bad)
            ck_row_error("grpo lora parity", "rank 8, fwd 3 / 5", core_last_error());
        else
            ck_row_figures("grpo lora parity", "rank 8, fwd 3 / 5", "bf16", ql.dlogp, 0.0, ql.dv, -1,
                           "rollout on the device", ql.dv == 0.0, "LoRA on every linear; must be 0");
    }
    trainer_dev_free(&D);
    if (x) wan_dev_exec_forget(x, &dev.m), wan_dev_exec_close(x);
    wan_model_free(&cpu.m), wan_model_free(&dev.m);
    optim_adamw_free(&cpu.opt), optim_adamw_free(&dev.opt);
    free(emb);
}

__attribute__((constructor)) static void register_check_grpo(void) { ck_register_part("grpo", check_grpo); }
