/* tests/mpi/mpi_zero_dev.c — data parallelism and ZeRO stages 1, 2 and 3 on the device path (trainer/dp/dp_dev.h) against
 * the CPU path's (trainer/dp/dp.h, trainer/dp/zero.h), case "zero_dev", on the EMULATED device (kernels/cuda/emu:
 * device memory is host memory, so the MPI comm moves its buffers). Every rank holds two tiny Wan experts with the same
 * weights and its own random gradients; for stage 0, 1, 2 and 3, three optimizer steps (clipping active, weight
 * decay; the device's stage 3, whose fp32 master is a shard too, against the CPU's stage 2):
 *   CPU     dp_grad_reduce, then stage 0's optim_grad_norm_multi + optim_adamw_step_coef, or dp_zero_step;
 *   device  the same gradients uploaded to the device gradients, dp_dev_grad_reduce, trainer_dev_opt_step with the
 *           shard hooks of dp_dev_shards.
 * Checked bit for bit on every rank after every step: the norm, clip factor and lr; the master (its host mirror)
 * against the CPU weights; the device's bf16 copy against the master rounded once (every rank's range, so the
 * all-gather delivered), at stage 3 the device master's shard against the CPU weights; after the steps, the device
 * moments (this rank's shard) against the CPU state's. Then a NaN gradient on the last rank: every rank refuses the
 * step, no weight changed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/dit/wan_dev_exec.h"
#include "tests/mpi/mpi_cases.h"
#include "trainer/dp/dp_dev.h"
#include "trainer/dp/zero.h"

static int equal_f32(const float *a, const float *b, int64_t n) { return !memcmp(a, b, sizeof(float) * (size_t)n); }

/* This rank's gradients of step t for expert e. */
static void grads_of(float *g, int64_t n, int rank, int t, int e) {
    mpi_fill_uniform(g, (size_t)n, 3000 + 97 * t + 13 * e + rank, -0.02f, 0.02f);
}

/* One stage: 3 steps on the CPU and on the device, compared. */
static void run_stage(sp_comm *world, const wan_config *c, int stage) {
    const int P = world->size, me = world->rank;
    wan_model hm[2], dm[2];
    optim_adamw ho[2], dopt[2];
    for (int e = 0; e < 2; e++) {
        MCHECK(!wan_model_init(&hm[e], c) && !wan_model_alloc_grads(&hm[e]) && !wan_model_init(&dm[e], c),
               "models: %s", core_last_error());
        wan_params_init_random(&hm[e], 7 + e);
        memcpy(dm[e].params, hm[e].params, sizeof(float) * (size_t)hm[e].layout.numel);
        MCHECK(!dp_zero_optim_init(&ho[e], hm[e].layout.numel, stage < 3 ? stage : 2, world) &&
                   !dp_zero_optim_init(&dopt[e], hm[e].layout.numel, stage, world),
               "optimizer states: %s", core_last_error());
    }
    const int64_t np = hm[0].layout.numel;
    const optim_config oc = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                             .max_grad_norm = 0.5, .schedule = OPTIM_SCHED_LINEAR, .warmup_steps = 1, .total_steps = 10};
    const uint8_t trained[2] = {1, 1};
    wan_model *hp[2] = {&hm[0], &hm[1]}, *dp[2] = {&dm[0], &dm[1]};
    optim_adamw *hop[2] = {&ho[0], &ho[1]}, *dop[2] = {&dopt[0], &dopt[1]};
    wan_dev_exec *x = wan_dev_exec_new(&k_emu_ops);
    trainer_dev D;
    /* stage 3 on the device (the master sharded too) against stage 2 on the CPU: the same arithmetic */
    dp_reduce_ctx hred = {.grads = world, .stats = world, .zero_stage = stage < 3 ? stage : 2};
    dp_reduce_ctx dred = {.grads = world, .stats = world, .zero_stage = stage, .dev = world};
    dp_dev_ctx dctx = {0};
    MCHECK(x && !trainer_dev_init_sharded(&D, x, dp, 2, trained, dop, stage == 3 && P > 1) &&
               !dp_dev_shards(&dctx, &dred, &D),
           "device state: %s", core_last_error());
    float *g = malloc(sizeof(float) * (size_t)np), *w16 = malloc(sizeof(float) * (size_t)np);
    for (int t = 0; t < 3 && g && w16 && !mpi_test_failures(); t++) {
        optim_step_info ih = {0}, id = {0};
        for (int e = 0; e < 2; e++) {
            grads_of(hm[e].grads, np, me, t, e);
            grads_of(g, np, me, t, e);
            MCHECK(!wan_dev_exec_zero_grads(x, &dm[e]) &&
                       !k_emu_ops.mem_upload(trainer_dev_grads(&D, e), g, sizeof(float) * (size_t)np),
                   "device gradients: %s", core_last_error());
        }
        MCHECK(!dp_grad_reduce(&hred, hp, 2, trained, NULL), "CPU reduce: %s", core_last_error());
        if (stage == 0) {
            const float *gg[2] = {hm[0].grads, hm[1].grads};
            const int64_t ns[2] = {np, np};
            const double norm = optim_grad_norm_multi(gg, ns, 2), coef = optim_clip_coef(norm, oc.max_grad_norm);
            for (int e = 0; e < 2; e++)
                MCHECK(!optim_adamw_step_coef(&ho[e], &oc, hm[e].params, hm[e].grads, NULL, norm, coef, &ih),
                       "CPU step: %s", core_last_error());
        } else {
            MCHECK(!dp_zero_step(&hred, hp, 2, trained, hop, &oc, &ih), "CPU ZeRO step: %s", core_last_error());
        }
        MCHECK(!dp_dev_grad_reduce(&dctx, dp, 2, trained, NULL) && !trainer_dev_opt_step(&D, dp, 2, trained, dop, &oc, &id),
               "device step: %s", core_last_error());
        MCHECK(ih.clip_coef < 1, "clipping should be active (norm %g)", ih.grad_norm);
        MCHECK(ih.grad_norm == id.grad_norm && ih.clip_coef == id.clip_coef && ih.lr == id.lr,
               "stage %d step %d: norm %.17g / %.17g, coef %.17g / %.17g, lr %g / %g", stage, t, ih.grad_norm,
               id.grad_norm, ih.clip_coef, id.clip_coef, ih.lr, id.lr);
        for (int e = 0; e < 2; e++) {
            MCHECK(equal_f32(hm[e].params, dm[e].params, np), "stage %d step %d expert %d: the device master differs "
                   "from the CPU weights", stage, t, e);
            MCHECK(!k_emu_ops.mem_download_bf16(w16, trainer_dev_weights16(&D, e), (size_t)np), "bf16: %s",
                   core_last_error());
            int64_t bad = 0;
            for (int64_t i = 0; i < np; i++) bad += w16[i] != kb_round_bf16(hm[e].params[i]);
            MCHECK(!bad, "stage %d step %d expert %d: %lld bf16 weights are not the master rounded", stage, t, e,
                   (long long)bad);
            MCHECK(dopt[e].step == ho[e].step && dopt[e].step == t + 1, "steps");
            if (stage == 3 && P > 1) { /* the device master: this rank's shard only, equal to the CPU weights there */
                MCHECK(D.master_sharded && D.mlo[e] == ho[e].lo && D.mlen[e] == ho[e].len && D.mlen[e] < np,
                       "stage 3 expert %d: the device master covers [%lld, +%lld)", e, (long long)D.mlo[e],
                       (long long)D.mlen[e]);
                MCHECK(!k_emu_ops.mem_download(g, D.master[e], sizeof(float) * (size_t)D.mlen[e]) &&
                           equal_f32(g, hm[e].params + D.mlo[e], D.mlen[e]),
                       "stage 3 step %d expert %d: the device master shard differs from the CPU weights", t, e);
            }
        }
    }
    MCHECK(!trainer_dev_sync_moments(&D, dop), "moments: %s", core_last_error());
    for (int e = 0; e < 2; e++)
        MCHECK(dopt[e].lo == ho[e].lo && dopt[e].len == ho[e].len && equal_f32(dopt[e].m, ho[e].m, ho[e].len) &&
                   equal_f32(dopt[e].v, ho[e].v, ho[e].len),
               "stage %d expert %d: the device moments [%lld, +%lld) differ from the CPU's", stage, e,
               (long long)dopt[e].lo, (long long)dopt[e].len);
    /* a NaN on the last rank: every rank refuses, nothing changed */
    for (int e = 0; e < 2 && g; e++) {
        grads_of(g, np, me, 9, e);
        if (me == P - 1 && e == 1) g[np / 2] = NAN;
        MCHECK(!wan_dev_exec_zero_grads(x, &dm[e]) &&
                   !k_emu_ops.mem_upload(trainer_dev_grads(&D, e), g, sizeof(float) * (size_t)np),
               "device gradients: %s", core_last_error());
    }
    memcpy(g, dm[0].params, sizeof(float) * (size_t)np);
    optim_step_info id = {0};
    MCHECK(!dp_dev_grad_reduce(&dctx, dp, 2, trained, NULL), "reduce: %s", core_last_error());
    const int rc = trainer_dev_opt_step(&D, dp, 2, trained, dop, &oc, &id);
    MCHECK(rc == -1 && strstr(core_last_error(), "gradient norm is nan"), "NaN step: rc %d, %s", rc, core_last_error());
    MCHECK(equal_f32(g, dm[0].params, np) && dopt[0].step == 3, "the NaN step changed something");
    if (me == 0 && !mpi_test_failures())
        printf("zero_dev stage %d: 3 steps on %d ranks, device = CPU bit for bit (moments of rank 0: %lld of %lld)\n",
               stage, P, (long long)dopt[0].len, (long long)np);
    free(g), free(w16);
    trainer_dev_free(&D);
    for (int e = 0; e < 2; e++) {
        wan_dev_exec_forget(x, &dm[e]);
        wan_model_free(&hm[e]), wan_model_free(&dm[e]);
        optim_adamw_free(&ho[e]), optim_adamw_free(&dopt[e]);
    }
    wan_dev_exec_close(x);
}

int mpi_case_zero_dev(sp_comm *world, int argc, char **argv) {
    (void)argc, (void)argv;
    wan_config c;
    if (wan_config_preset(&c, "tiny")) return fprintf(stderr, "%s\n", core_last_error()), 1;
    for (int stage = 0; stage <= 3; stage++) run_stage(world, &c, stage);
    return mpi_test_failures() ? 1 : 0;
}
