/* tests/mpi/mpi_zero.c — ZeRO stages 1 and 2 (trainer/dp/zero.h) and the rank-order collectives under them (sp/comm.h
 * "Ranges of one flat buffer"), case "zero", checked bit for bit on every rank:
 *   - sp_comm_reduce_scatter_ranges over uneven ranges (rank 0's empty, one range over several SP_RANGE_PIECE
 *     rounds) gives each rank ((x_0 + x_1) + x_2) + ... of its range and leaves the rest untouched;
 *     sp_comm_all_gather_ranges, sp_comm_all_reduce_ordered and sp_comm_gather_ranges (to rank 0 and to the last
 *     rank) deliver exactly those values; printed, not checked: how many elements MPI_Allreduce (sp_comm_all_reduce)
 *     adds in another order on this group (OpenMPI 4.1: none at 2 and 3 ranks);
 *   - three optimizer steps on two tiny Wan experts (random per-rank gradients, clipping active, weight decay):
 *     stage 0 (dp_grad_reduce, optim_grad_norm_multi, optim_adamw_step_coef on whole states) against stage 1 and
 *     stage 2 (dp_grad_reduce with zero_stage, dp_zero_step on shards): the same weights, norm, clip factor and lr
 *     after every step, each shard's m and v equal to the whole state's slice, and dp_zero_gather's state on rank 0
 *     equal to stage 0's whole m and v;
 *   - a NaN gradient on the last rank: every rank's dp_zero_step fails ("gradient norm is nan") with no weight
 *     changed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tests/mpi/mpi_cases.h"
#include "trainer/dp/dp.h"
#include "trainer/dp/zero.h"

static int64_t rank_order_diffs(sp_comm *w, int64_t n) {
    const int P = w->size, me = w->rank;
    float *all = malloc(sizeof(float) * (size_t)n * P), *buf = malloc(sizeof(float) * (size_t)n);
    float *ref = malloc(sizeof(float) * (size_t)n), *out = malloc(sizeof(float) * (size_t)n);
    int64_t *offs = malloc(sizeof(int64_t) * (size_t)(P + 1));
    MCHECK(all && buf && ref && out && offs, "out of memory");
    if (!all || !buf || !ref || !out || !offs) return -1;
    for (int r = 0; r < P; r++) mpi_fill_uniform(all + (size_t)r * n, (size_t)n, 100 + r, -1.0f, 1.0f);
    for (int64_t i = 0; i < n; i++) { /* the rank-order sum */
        float s = all[i];
        for (int r = 1; r < P; r++) s += all[(size_t)r * n + i];
        ref[i] = s;
    }
    /* uneven ranges: rank 0 empty, the others split the buffer (rank 1 alone at 2 ranks: several rounds) */
    offs[0] = 0, offs[1] = 0, offs[P] = n;
    for (int r = 2; r < P; r++) offs[r] = n * r / P;
    const float *mine = all + (size_t)me * n;
    memcpy(buf, mine, sizeof(float) * (size_t)n);
    MCHECK(!sp_comm_reduce_scatter_ranges(w, buf, offs), "reduce_scatter_ranges: %s", core_last_error());
    int64_t bad = 0, moved = 0;
    for (int64_t i = 0; i < n; i++) {
        const int own = i >= offs[me] && i < offs[me + 1];
        bad += memcmp(&buf[i], own ? &ref[i] : &mine[i], sizeof(float)) != 0;
    }
    MCHECK(bad == 0, "reduce_scatter_ranges: %lld elements differ from the rank-order sum / the input", (long long)bad);
    MCHECK(!sp_comm_all_gather_ranges(w, buf, offs, SP_F32), "all_gather_ranges: %s", core_last_error());
    MCHECK(!memcmp(buf, ref, sizeof(float) * (size_t)n), "all_gather_ranges: not the rank-order sums");
    memcpy(buf, mine, sizeof(float) * (size_t)n);
    MCHECK(!sp_comm_all_reduce_ordered(w, buf, n), "all_reduce_ordered: %s", core_last_error());
    MCHECK(!memcmp(buf, ref, sizeof(float) * (size_t)n), "all_reduce_ordered: not the rank-order sums");
    for (int root = 0; root < P; root += P - 1 > 0 ? P - 1 : 1) { /* rank 0 and the last rank */
        memset(out, 0, sizeof(float) * (size_t)n);
        MCHECK(!sp_comm_gather_ranges(w, ref + offs[me], root == me ? out : NULL, offs, SP_F32, root),
               "gather_ranges to %d: %s", root, core_last_error());
        if (me == root) MCHECK(!memcmp(out, ref, sizeof(float) * (size_t)n), "gather_ranges to %d: wrong values", root);
    }
    MCHECK(!sp_comm_all_reduce(w, mine, out, (size_t)n, SP_F32), "all_reduce: %s", core_last_error());
    for (int64_t i = 0; i < n; i++) moved += out[i] != ref[i];
    free(all), free(buf), free(ref), free(out), free(offs);
    return moved;
}

/* Two tiny experts and this rank's gradients of step t (the same weights on every rank, its own gradients). */
static void fill_grads(wan_model *m, int rank, int t) {
    for (int e = 0; e < 2; e++)
        mpi_fill_uniform(m[e].grads, (size_t)m[e].layout.numel, 1000 + 97 * t + 13 * e + rank, -0.02f, 0.02f);
}

static int equal_f32(const float *a, const float *b, int64_t n) { return !memcmp(a, b, sizeof(float) * (size_t)n); }

int mpi_case_zero(sp_comm *world, int argc, char **argv) {
    (void)argc, (void)argv;
    const int P = world->size, me = world->rank;
    /* 1. the collectives */
    const int64_t n = 2 * SP_RANGE_PIECE + 1237;
    const int64_t moved = rank_order_diffs(world, n);
    if (me == 0)
        printf("MPI_Allreduce vs rank order on %d ranks: %lld of %lld sums differ\n", P, (long long)moved, (long long)n);
    /* 2. stage 0 against stages 1 and 2 */
    wan_config c;
    if (wan_config_preset(&c, "tiny")) return fprintf(stderr, "%s\n", core_last_error()), 1;
    wan_model ref[2], zm[2];
    optim_adamw whole[2], shard[2];
    for (int e = 0; e < 2; e++) {
        if (wan_model_init(&ref[e], &c) || wan_model_alloc_grads(&ref[e]) || wan_model_init(&zm[e], &c) ||
            wan_model_alloc_grads(&zm[e]))
            return fprintf(stderr, "%s\n", core_last_error()), 1;
        wan_params_init_random(&ref[e], 7 + e);
    }
    const int64_t np = ref[0].layout.numel;
    const optim_config oc = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                             .max_grad_norm = 0.5, .schedule = OPTIM_SCHED_LINEAR, .warmup_steps = 1, .total_steps = 10};
    const uint8_t trained[2] = {1, 1};
    wan_model *rp[2] = {&ref[0], &ref[1]}, *zp[2] = {&zm[0], &zm[1]};
    optim_adamw *so[2] = {&shard[0], &shard[1]};
    for (int stage = 1; stage <= 2; stage++) {
        dp_reduce_ctx c0 = {.grads = world, .stats = world, .zero_stage = 0};
        dp_reduce_ctx cz = {.grads = world, .stats = world, .zero_stage = stage};
        for (int e = 0; e < 2; e++) {
            wan_params_init_random(&ref[e], 7 + e);
            memcpy(zm[e].params, ref[e].params, sizeof(float) * (size_t)np);
            MCHECK(!optim_adamw_init(&whole[e], np) && !dp_zero_optim_init(&shard[e], np, stage, world),
                   "optimizer states: %s", core_last_error());
        }
        int64_t lo, len;
        dp_zero_shard(np, me, P, &lo, &len);
        MCHECK(shard[0].lo == lo && shard[0].len == len && len > 0, "stage %d: shard [%lld, +%lld)", stage,
               (long long)shard[0].lo, (long long)shard[0].len);
        for (int t = 0; t < 3; t++) {
            fill_grads(ref, me, t), fill_grads(zm, me, t);
            /* stage 0, as trainer_update_experts does it */
            MCHECK(!dp_grad_reduce(&c0, rp, 2, trained, NULL), "stage 0 reduce: %s", core_last_error());
            const float *g[2] = {ref[0].grads, ref[1].grads};
            const int64_t ns[2] = {np, np};
            const double norm = optim_grad_norm_multi(g, ns, 2), coef = optim_clip_coef(norm, oc.max_grad_norm);
            optim_step_info i0 = {0}, iz = {0};
            for (int e = 0; e < 2; e++)
                MCHECK(!optim_adamw_step_coef(&whole[e], &oc, ref[e].params, ref[e].grads, NULL, norm, coef, &i0),
                       "stage 0 step: %s", core_last_error());
            MCHECK(!dp_grad_reduce(&cz, zp, 2, trained, NULL), "stage %d reduce: %s", stage, core_last_error());
            MCHECK(!dp_zero_step(&cz, zp, 2, trained, so, &oc, &iz), "stage %d step: %s", stage, core_last_error());
            MCHECK(coef < 1, "clipping should be active (norm %g)", norm);
            MCHECK(i0.grad_norm == iz.grad_norm && i0.clip_coef == iz.clip_coef && i0.lr == iz.lr,
                   "stage %d step %d: norm %.17g / %.17g, coef %.17g / %.17g, lr %g / %g", stage, t, i0.grad_norm,
                   iz.grad_norm, i0.clip_coef, iz.clip_coef, i0.lr, iz.lr);
            for (int e = 0; e < 2; e++) {
                MCHECK(equal_f32(ref[e].params, zm[e].params, np), "stage %d step %d expert %d: weights differ", stage,
                       t, e);
                MCHECK(equal_f32(whole[e].m + lo, shard[e].m, len) && equal_f32(whole[e].v + lo, shard[e].v, len),
                       "stage %d step %d expert %d: the shard's m, v differ from stage 0's", stage, t, e);
                MCHECK(shard[e].step == whole[e].step, "steps");
            }
        }
        optim_adamw full[2];
        MCHECK(!dp_zero_gather(world, shard, 2, full), "gather: %s", core_last_error());
        for (int e = 0; e < 2; e++) {
            if (me == 0)
                MCHECK(full[e].n == np && full[e].len == np && full[e].step == 3 && equal_f32(full[e].m, whole[e].m, np) &&
                           equal_f32(full[e].v, whole[e].v, np),
                       "stage %d: the gathered state of expert %d differs from stage 0's", stage, e);
            else
                MCHECK(!full[e].m, "gathered state on rank %d", me);
            optim_adamw_free(&full[e]);
        }
        /* a NaN on the last rank: every rank refuses the step, no weight changed */
        fill_grads(zm, me, 9);
        if (me == P - 1) zm[1].grads[np / 2] = NAN;
        float *before = malloc(sizeof(float) * (size_t)np);
        memcpy(before, zm[0].params, sizeof(float) * (size_t)np);
        optim_step_info iz = {0};
        MCHECK(!dp_grad_reduce(&cz, zp, 2, trained, NULL), "reduce: %s", core_last_error());
        const int rc = dp_zero_step(&cz, zp, 2, trained, so, &oc, &iz);
        MCHECK(rc == -1 && strstr(core_last_error(), "gradient norm is nan"), "NaN step: rc %d, %s", rc,
               core_last_error());
        MCHECK(equal_f32(before, zm[0].params, np) && shard[0].step == 3, "the NaN step changed something");
        free(before);
        for (int e = 0; e < 2; e++) optim_adamw_free(&whole[e]), optim_adamw_free(&shard[e]);
        if (me == 0) printf("stage %d: 3 steps on %d ranks equal stage 0 bit for bit (shard of rank 0: %lld of %lld)\n",
                            stage, P, (long long)len, (long long)np);
    }
    for (int e = 0; e < 2; e++) wan_model_free(&ref[e]), wan_model_free(&zm[e]);
    return mpi_test_failures() ? 1 : 0;
}
