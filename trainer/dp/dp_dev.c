/* trainer/dp/dp_dev.c — data parallelism and ZeRO on the device path (see trainer/dp/dp_dev.h). */
#include "trainer/dp/dp_dev.h"

#include <stdlib.h>

#include "core/error.h"
#include "kernels/dev_ops.h"
#include "trainer/dp/zero.h"

/* ZeRO stage 2's norm: this rank's chunk sums of g (its shard: whole chunks), each by the device's sumsq of one chunk
 * (optim_sumsq of one chunk is its chunk sum: 0.0 + s), all-gathered over the host group and added in chunk order.
 * One device call per 8192 values: fine on the emulated device; a GPU wants one chunk-sums launch (kern_flow.cu has
 * the kernel, k_dev_ops no entry for it yet). */
static int shard_sumsq(void *ctxp, trainer_dev *D, int e, const float *g, double *out) {
    dp_dev_ctx *ctx = ctxp;
    sp_comm *c = ctx->red->grads;
    const k_dev_ops *dev = wan_dev_exec_ops(D->x);
    const int64_t n = D->numel[e], m = (n + OPTIM_CHUNK - 1) / OPTIM_CHUNK;
    double *part = malloc(sizeof(double) * (size_t)(m > 0 ? m : 1));
    int64_t *coffs = malloc(sizeof(int64_t) * (size_t)(c->size + 1));
    int rc = -1;
    if (!part || !coffs) {
        core_error("zero (device): out of memory for %lld chunk sums", (long long)m);
        goto done;
    }
    for (int r = 0; r <= c->size; r++) coffs[r] = m * r / c->size; /* dp_zero_offsets' chunks */
    for (int64_t k = coffs[c->rank]; k < coffs[c->rank + 1]; k++) { /* g: this rank's range, from D->lo[e] */
        const int64_t b = k * OPTIM_CHUNK, len = b + OPTIM_CHUNK < n ? OPTIM_CHUNK : n - b;
        if (dev->sumsq(kb_in_f32(g + (b - D->lo[e])), len, &part[k])) goto done;
    }
    if (sp_comm_all_gather_ranges(c, part, coffs, SP_I64)) { /* doubles as 8-byte elements: bits unchanged */
        core_error_push("zero (device): gradient norm: ");
        goto done;
    }
    *out = optim_sumsq_combine(part, m);
    rc = 0;
done:
    free(part), free(coffs);
    return rc;
}

/* The fp32 master (with master 1) and the bf16 copy of every rank's range of expert e, over the device group (the
 * bf16 copy as bytes: 2 per value). */
static int gather_ranges(dp_dev_ctx *ctx, trainer_dev *D, int e, int master) {
    sp_comm *c = ctx->red->dev;
    int64_t *offs = dp_zero_offsets(D->numel[e], c->size), *boffs = malloc(sizeof(int64_t) * (size_t)(c->size + 1));
    kb_bf16 *w16 = trainer_dev_weights16(D, e);
    int bad = !offs || !boffs || !w16;
    if (!bad) {
        for (int r = 0; r <= c->size; r++) boffs[r] = 2 * offs[r];
        bad = (master && sp_comm_all_gather_ranges(c, D->master[e], offs, SP_F32)) ||
              sp_comm_all_gather_ranges(c, w16, boffs, SP_U8);
    }
    free(offs), free(boffs);
    return bad ? -1 : 0;
}

/* After this rank's AdamW on its range: the fp32 master (unless it is a shard: stage 3) and the bf16 copy of every
 * rank's range. */
static int shard_gather(void *ctxp, trainer_dev *D, int e) {
    if (gather_ranges(ctxp, D, e, !D->master_sharded))
        return core_error_push("zero (device): all-gather of the updated %s: ", wan_expert_folder(e));
    return 0;
}

/* Expert e into the window: this rank's master shard rounded to bf16 into its range (mem_round_bf16: the bits of
 * AdamW's bf16 copy and of wan_dev_model_upload), the other ranks' ranges all-gathered. Nothing when e is there. */
static int window_fill(dp_dev_ctx *ctx, trainer_dev *D, int e) {
    if (wan_dev_exec_resident(D->x, D->pol[e])) return 0;
    const k_dev_ops *dev = wan_dev_exec_ops(D->x);
    kb_bf16 *w16 = trainer_dev_weights16(D, e);
    if (!w16 || !dev->mem_round_bf16 ||
        (D->mlen[e] && dev->mem_round_bf16(w16 + D->mlo[e], D->master[e], D->mlen[e])) ||
        gather_ranges(ctx, D, e, 0) || wan_dev_exec_set_resident(D->x, D->pol[e]))
        return core_error_push("zero (device): %s's bf16 weights into the expert window: ", wan_expert_folder(e));
    return 0;
}

/* Expert e's gradients reduce-scattered over the ranks (or the buckets that did it during its last backward waited
 * for); transformer's sum of squares formed (shard_sumsq: collective over the host group), its range kept in host
 * memory (D->ghost) and the window's gradients zeroed for transformer_2, whose range stays where the reduction left
 * it (nothing accumulates after it before the step). */
static int window_keep(dp_dev_ctx *ctx, trainer_dev *D, int e) {
    const k_dev_ops *dev = wan_dev_exec_ops(D->x);
    sp_comm *c = ctx->red->dev;
    float *g = trainer_dev_grads(D, e);
    const int overlapped = dp_buckets_done(ctx->bk, e);
    if (overlapped < 0) return -1;
    if (!g) return core_error("zero (device): %s has no device gradients", wan_expert_folder(e));
    int bad = 0;
    if (overlapped) {
        bad = dp_buckets_join_expert(ctx->bk, e);
    } else {
        int64_t *offs = dp_zero_offsets(D->numel[e], c->size);
        bad = !offs || sp_comm_reduce_scatter_ranges(c, g, offs);
        free(offs);
    }
    const size_t bytes = (size_t)D->len[e] * sizeof(float); /* transformer_2, the last: its range stays in place */
    if (bad || (e == 0 && (shard_sumsq(ctx, D, 0, g + D->lo[0], &D->gss0) ||
                           (bytes && dev->mem_download(D->ghost, g + D->lo[0], bytes)) ||
                           dev->mem_zero(g, (size_t)D->numel[0] * sizeof(float)))))
        return core_error_push("zero (device): gradients of %s in the expert window: ", wan_expert_folder(e));
    D->gshard_ready |= 1u << e;
    return 0;
}

int dp_dev_expert_phase(void *ctxp, int e, int end, int backward) {
    dp_dev_ctx *ctx = ctxp;
    trainer_dev *D = ctx->D;
    if (!D->window) return 0;
    if (e < 0 || e > 1 || !D->trained[e]) return core_error("zero (device): expert phase of expert %d", e);
    if (!end) return window_fill(ctx, D, e);
    return backward ? window_keep(ctx, D, e) : 0;
}

/* Stage 3: the host mirror of the master from every rank's downloaded range, over the host group (the trainer
 * ranks' MPI group: host buffers). */
static int shard_host_gather(void *ctxp, trainer_dev *D, int e, float *params) {
    dp_dev_ctx *ctx = ctxp;
    sp_comm *c = ctx->red->grads;
    int64_t *offs = dp_zero_offsets(D->numel[e], c->size);
    const int bad = !offs || sp_comm_all_gather_ranges(c, params, offs, SP_F32);
    free(offs);
    return bad ? core_error_push("zero (device): the host copy of %s's master weights: ", wan_expert_folder(e)) : 0;
}

int dp_dev_shards(dp_dev_ctx *ctx, dp_reduce_ctx *red, trainer_dev *D) {
    ctx->red = red, ctx->D = D, ctx->bk = NULL; /* buckets: set by the caller afterwards (dp_buckets_init) */
    D->shards = (trainer_dev_shards){0};
    if (!red->grads || red->grads->size == 1 || red->zero_stage == 0) return 0;
    if (!red->dev || red->dev->size != red->grads->size || red->dev->rank != red->grads->rank)
        return core_error("zero (device): no device group over the %d trainer ranks", red->grads->size);
    for (int e = 0; e < D->n_experts; e++) {
        if (!D->trained[e]) continue;
        int64_t lo, len;
        dp_zero_shard(D->numel[e], red->grads->rank, red->grads->size, &lo, &len);
        if (D->lo[e] != lo || D->len[e] != len)
            return core_error("zero (device): the moments of %s on the device cover [%lld, %lld); rank %d of %d owns "
                              "[%lld, %lld)", wan_expert_folder(e), (long long)D->lo[e],
                              (long long)(D->lo[e] + D->len[e]), red->grads->rank, red->grads->size, (long long)lo,
                              (long long)(lo + len));
        const int sharded = D->master_sharded;
        if (sharded != (red->zero_stage == 3) || (sharded && (D->mlo[e] != lo || D->mlen[e] != len)))
            return core_error("zero (device): the master of %s on the device covers [%lld, %lld) of %lld; stage %d on "
                              "rank %d of %d wants %s", wan_expert_folder(e), (long long)D->mlo[e],
                              (long long)(D->mlo[e] + D->mlen[e]), (long long)D->numel[e], red->zero_stage,
                              red->grads->rank, red->grads->size, red->zero_stage == 3 ? "its shard" : "the whole");
    }
    D->shards = (trainer_dev_shards){.ctx = ctx, .sumsq = red->zero_stage >= 2 ? shard_sumsq : NULL,
                                     .gather = shard_gather,
                                     .host_gather = red->zero_stage == 3 ? shard_host_gather : NULL};
    return 0;
}

int dp_dev_grad_reduce(void *ctxp, wan_model *const *policy, int n_experts, const uint8_t *trained,
                       grpo_loss_stats *stats) {
    (void)policy;
    dp_dev_ctx *ctx = ctxp;
    const dp_reduce_ctx *rc = ctx->red;
    sp_comm *c = rc->dev;
    if (!rc->grads || rc->grads->size == 1) return 0;
    if (!c) return core_error("dp (device): no device group over the %d trainer ranks", rc->grads->size);
    for (int e = 0; e < n_experts; e++) {
        if (trained && !trained[e]) continue;
        if (ctx->D->window) { /* reduced at the end of its phase (dp_dev_expert_phase) */
            if (!(ctx->D->gshard_ready >> e & 1u))
                return core_error("dp (device): %s's gradients in the expert window were not reduced (the expert "
                                  "phases did not run)", wan_expert_folder(e));
            continue;
        }
        const int overlapped = dp_buckets_done(ctx->bk, e);
        if (overlapped < 0) return -1;
        if (overlapped) continue; /* reduced bucket by bucket during the backward */
        float *g = trainer_dev_grads(ctx->D, e);
        const int64_t n = ctx->D->numel[e];
        if (!g) return core_error("dp (device): %s has no device gradients", wan_expert_folder(e));
        int bad;
        if (rc->zero_stage >= 2) { /* each rank keeps the sum of its shard only */
            int64_t *offs = dp_zero_offsets(n, c->size);
            bad = !offs || sp_comm_reduce_scatter_ranges(c, g, offs);
            free(offs);
        } else {
            bad = sp_comm_all_reduce_ordered(c, g, n);
        }
        if (bad)
            return core_error_push("dp (device): gradients of %s%s: ", wan_expert_folder(e),
                                   ctx->D->pol[e]->lora ? "'s LoRA adapter" : "");
    }
    if (dp_buckets_join(ctx->bk)) return -1;
    return stats ? dp_stats_reduce(rc->stats, stats) : 0;
}
