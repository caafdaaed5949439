/* trainer/dp/zero.c — ZeRO stages 1 and 2 over the trainer ranks (see trainer/dp/zero.h). */
#include "trainer/dp/zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "trainer/optim/lora.h"

static int64_t n_chunks(int64_t n) { return (n + OPTIM_CHUNK - 1) / OPTIM_CHUNK; }

/* Rank r's first chunk (r = size: the end). */
static int64_t first_chunk(int64_t n, int r, int size) { return n_chunks(n) * r / size; }

int64_t *dp_zero_offsets(int64_t n, int size) {
    int64_t *offs = malloc(sizeof(int64_t) * (size_t)(size + 1));
    if (!offs) return core_error("zero: out of memory"), NULL;
    for (int r = 0; r <= size; r++) {
        const int64_t o = first_chunk(n, r, size) * OPTIM_CHUNK;
        offs[r] = o < n ? o : n;
    }
    return offs;
}

void dp_zero_shard(int64_t n, int rank, int size, int64_t *lo, int64_t *len) {
    int64_t a = first_chunk(n, rank, size) * OPTIM_CHUNK, b = first_chunk(n, rank + 1, size) * OPTIM_CHUNK;
    a = a < n ? a : n, b = b < n ? b : n;
    *lo = a, *len = b - a;
}

int dp_zero_optim_init(optim_adamw *o, int64_t n, int stage, const sp_comm *grads) {
    if (stage == 0 || !grads || grads->size == 1) return optim_adamw_init(o, n);
    int64_t lo, len;
    dp_zero_shard(n, grads->rank, grads->size, &lo, &len);
    return optim_adamw_init_shard(o, n, lo, len);
}

/* The sum of squares of a trained buffer's whole gradient, from this rank's chunks and the others' chunk sums:
 * optim_sumsq(g, n) bit for bit (zero.h). */
static int sharded_sumsq(sp_comm *c, const float *g, int64_t n, double *out) {
    const int64_t m = n_chunks(n);
    double *part = malloc(sizeof(double) * (size_t)(m > 0 ? m : 1));
    int64_t *coffs = malloc(sizeof(int64_t) * (size_t)(c->size + 1));
    int rc = -1;
    if (!part || !coffs) {
        core_error("zero: out of memory for %lld chunk sums", (long long)m);
        goto done;
    }
    for (int r = 0; r <= c->size; r++) coffs[r] = first_chunk(n, r, c->size);
    optim_sumsq_chunks(g, n, coffs[c->rank], coffs[c->rank + 1], part + coffs[c->rank]);
    /* doubles travel as 8-byte I64 elements: bits unchanged */
    if (sp_comm_all_gather_ranges(c, part, coffs, SP_I64)) {
        core_error_push("zero: gradient norm: ");
        goto done;
    }
    *out = optim_sumsq_combine(part, m);
    rc = 0;
done:
    free(part), free(coffs);
    return rc;
}

int dp_zero_step(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained, optim_adamw *const *opt,
                 const optim_config *ocfg, optim_step_info *info) {
    const dp_reduce_ctx *rc = ctx;
    sp_comm *c = rc ? rc->grads : NULL;
    if (!c) return core_error("zero: no gradient group");
    int first = -1;
    /* every state is this rank's shard of its buffer (the layout is a function of n and the group) */
    for (int e = 0; e < n_experts; e++) {
        if (trained && !trained[e]) continue;
        const trainer_trained_buf tb = trainer_trained_buffer(policy[e]);
        int64_t lo, len;
        dp_zero_shard(tb.n, c->rank, c->size, &lo, &len);
        if (opt[e]->n != tb.n || opt[e]->lo != lo || opt[e]->len != len)
            return core_error("zero: the AdamW state of %s covers [%lld, %lld) of %lld values; rank %d of %d owns "
                              "[%lld, %lld) of %lld", wan_expert_folder(e), (long long)opt[e]->lo,
                              (long long)(opt[e]->lo + opt[e]->len), (long long)opt[e]->n, c->rank, c->size,
                              (long long)lo, (long long)(lo + len), (long long)tb.n);
        if (first < 0) first = e;
    }
    if (first < 0) return core_error("algorithm.train_experts: no expert is trained");
    /* optim_grad_norm_multi: the experts' sums of squares added in expert order from 0.0 */
    double ss = 0.0;
    for (int e = 0; e < n_experts; e++) {
        if (trained && !trained[e]) continue;
        const trainer_trained_buf tb = trainer_trained_buffer(policy[e]);
        double s;
        if (sharded_sumsq(c, tb.grads, tb.n, &s)) return -1;
        ss += s;
    }
    const double norm = sqrt(ss);
    if (!isfinite(norm))
        return core_error("optim: gradient norm is %s at optimizer step %lld; parameters not updated",
                          isnan(norm) ? "nan" : "inf", (long long)opt[first]->step);
    const double coef = optim_clip_coef(norm, ocfg->max_grad_norm);
    for (int e = 0; e < n_experts; e++) {
        if (trained && !trained[e]) continue;
        const trainer_trained_buf tb = trainer_trained_buffer(policy[e]);
        if (optim_adamw_step_coef(opt[e], ocfg, tb.params, tb.grads, NULL, norm, coef, info)) return -1;
        int64_t *offs = dp_zero_offsets(tb.n, c->size);
        const int bad = !offs || sp_comm_all_gather_ranges(c, tb.params, offs, SP_F32);
        free(offs);
        if (bad)
            return core_error_push("zero: all-gather of the updated %s%s: ", wan_expert_folder(e),
                                   tb.params == policy[e]->params ? "" : "'s LoRA adapter");
    }
    return 0;
}

int dp_zero_gather(sp_comm *c, optim_adamw *opt, int k, optim_adamw *full) {
    memset(full, 0, sizeof *full * (size_t)k);
    for (int e = 0; e < k; e++) {
        const optim_adamw *o = &opt[e];
        if (o->n == 0) continue; /* a state never allocated (a frozen expert's under LoRA) */
        int64_t *offs = dp_zero_offsets(o->n, c->size);
        if (!offs) goto fail;
        int bad = 0;
        if (o->lo != offs[c->rank] || o->len != offs[c->rank + 1] - offs[c->rank])
            bad = core_error("zero: an AdamW state over [%lld, %lld) of %lld is not rank %d's shard", (long long)o->lo,
                             (long long)(o->lo + o->len), (long long)o->n, c->rank);
        /* (a failure here leaves the peers waiting in the gather: as for every collective, the run then stops) */
        if (!bad && c->rank == 0 && optim_adamw_init(&full[e], o->n)) bad = -1;
        if (!bad)
            bad = sp_comm_gather_ranges(c, o->m, full[e].m, offs, SP_F32, 0) ||
                  sp_comm_gather_ranges(c, o->v, full[e].v, offs, SP_F32, 0);
        free(offs);
        if (bad) goto fail;
        full[e].step = o->step;
    }
    return 0;
fail:
    for (int e = 0; e < k; e++) optim_adamw_free(&full[e]);
    return core_error_push("zero: gathering the AdamW state for a checkpoint: ");
}
