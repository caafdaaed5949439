/* trainer/dp/dp_bucket.c — the gradient reduction overlapping the backward (see trainer/dp/dp_bucket.h). */
#include "trainer/dp/dp_bucket.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "kernels/dev_ops.h"
#include "trainer/dp/zero.h"
#include "trainer/optim/lora.h"

/* The block of tensor name ("blocks.<i>.<...>"), or -1 outside the blocks. */
static int block_of(const char *name) {
    if (strncmp(name, "blocks.", 7)) return -1;
    char *end = NULL;
    const long i = strtol(name + 7, &end, 10);
    return end != name + 7 && *end == '.' && i >= 0 && i < 1000000 ? (int)i : -1;
}

int dp_bucket_plan(const wan_layout *L, int64_t cap_bytes, dp_bucket **out, int *n) {
    *out = NULL, *n = 0;
    const int nb = L->cfg.num_layers;
    const size_t nblk = (size_t)(nb > 0 ? nb : 1);
    int64_t *blo = calloc(nblk, sizeof(int64_t)), *bhi = calloc(nblk, sizeof(int64_t));
    dp_bucket *b = malloc(sizeof(dp_bucket) * (size_t)(nb + 2));
    int rc = -1, phase = 0, cur = -1, k = 0; /* phase 0: before the blocks, 1: in them, 2: after them */
    if (!blo || !bhi || !b) {
        core_error("gradient buckets: out of memory");
        goto done;
    }
    int64_t at = 0;
    for (int t = 0; t < L->count; t++) {
        const wan_tensor *x = &L->tensors[t];
        if (x->offset != at) {
            core_error("gradient buckets: tensor %s at offset %lld, not right after the one before (%lld)", x->name,
                       (long long)x->offset, (long long)at);
            goto done;
        }
        at += x->numel;
        const int i = block_of(x->name);
        if (i < 0) {
            if (phase == 1) phase = 2, bhi[cur] = x->offset;
            continue;
        }
        if (phase == 2 || i >= nb || (phase == 0 && i != 0) || (phase == 1 && i != cur && i != cur + 1)) {
            core_error("gradient buckets: tensor %s out of block order (after block %d of %d)", x->name, cur, nb);
            goto done;
        }
        if (phase == 0) phase = 1, cur = 0, blo[0] = x->offset;
        else if (i == cur + 1) bhi[cur] = blo[i] = x->offset, cur = i;
    }
    if (phase == 1) bhi[cur] = at;
    if (at != L->numel) {
        core_error("gradient buckets: the layout's tensors cover %lld of %lld values", (long long)at,
                   (long long)L->numel);
        goto done;
    }
    if (phase > 0 && cur != nb - 1) {
        core_error("gradient buckets: the layout has blocks 0..%d of the model's %d", cur, nb);
        goto done;
    }
    int64_t top = phase > 0 ? bhi[nb - 1] : 0, hi = top; /* hi: the lowest value a bucket holds so far */
    for (int i = nb - 1; phase > 0 && i >= 0; i--)
        if ((hi - blo[i]) * 4 >= cap_bytes) b[k++] = (dp_bucket){blo[i], hi, i}, hi = blo[i];
    if (hi > 0) b[k++] = (dp_bucket){0, hi, -1};                 /* the blocks left and what lies below them */
    if (L->numel > top && top > 0) b[k++] = (dp_bucket){top, L->numel, -1}; /* proj_out */
    *out = b, *n = k, b = NULL;
    rc = 0;
done:
    free(blo), free(bhi), free(b);
    return rc;
}

int dp_buckets_init(dp_buckets *B, trainer_dev *D, sp_comm *host, sp_comm *dev, int zero_stage, double cap_mib) {
    memset(B, 0, sizeof *B);
    B->D = D, B->host = host, B->zero_stage = zero_stage;
    B->dev = wan_dev_exec_ops(D->x);
    const k_dev_ops *d = B->dev;
    if (!(cap_mib > 0)) return core_error("parallel.grad_bucket_mib: %g; the buckets need a size > 0", cap_mib);
    if (!d->stream_new || !d->stream_free || !d->event_new || !d->event_free || !d->event_record || !d->stream_wait ||
        !d->stream_use)
        return core_error("parallel.grad_bucket_mib: the device table %s has no second stream (stream and event "
                          "entries); set parallel.grad_bucket_mib: 0", d->name);
    const int64_t cap = (int64_t)(cap_mib * 1048576.0);
    for (int e = 0; e < D->n_experts; e++) {
        if (!D->trained[e]) continue;
        const trainer_trained_buf tb = trainer_trained_buffer((wan_model *)D->pol[e]);
        if (tb.n != D->numel[e]) {
            dp_buckets_free(B);
            return core_error("gradient buckets: %s trains %lld values, its device gradients hold %lld",
                              wan_expert_folder(e), (long long)tb.n, (long long)D->numel[e]);
        }
        if (dp_bucket_plan(tb.layout, cap > 4 ? cap : 4, &B->b[e], &B->n[e])) {
            dp_buckets_free(B);
            return core_error_push("%s: ", wan_expert_folder(e));
        }
    }
    if (!(B->stream = d->stream_new()) || !(B->ready = d->event_new()) || !(B->done = d->event_new()) ||
        sp_comm_dup_stream(dev, B->stream, "grad-buckets", &B->comm)) {
        dp_buckets_free(B);
        return core_error_push("gradient buckets: ");
    }
    char per[96] = "";
    for (int e = 0, k = 0; e < D->n_experts; e++)
        if (B->n[e])
            k += snprintf(per + k, sizeof per - (size_t)k, "%s%s %d", k ? ", " : "", wan_expert_folder(e), B->n[e]);
    core_log_info("trainer rank %d: gradients reduced during the backward in buckets of %g MiB on a second stream (a "
                  "step's buckets: %s)", host->rank, cap_mib, per);
    return 0;
}

void dp_buckets_free(dp_buckets *B) {
    if (B->launched)
        core_log_info("trainer rank %d: %lld gradient buckets reduced during the backward", B->host->rank,
                      (long long)B->launched);
    sp_comm_destroy(B->comm);
    if (B->dev) {
        if (B->ready) B->dev->event_free(B->ready);
        if (B->done) B->dev->event_free(B->done);
        if (B->stream) B->dev->stream_free(B->stream);
    }
    for (int e = 0; e < CORE_TRAJ_MAX_EXPERTS; e++) free(B->b[e]);
    memset(B, 0, sizeof *B);
}

int dp_buckets_arm(void *ctx, int n_experts, const int *n_micro, unsigned *armed) {
    dp_buckets *B = ctx;
    float none[CORE_TRAJ_MAX_EXPERTS] = {0}; /* ranks without micro-batches of expert e */
    *armed = 0;
    if (n_experts > CORE_TRAJ_MAX_EXPERTS || n_experts > B->D->n_experts)
        return core_error("gradient buckets: %d experts, the device optimizer has %d", n_experts, B->D->n_experts);
    for (int e = 0; e < n_experts; e++) none[e] = n_micro[e] > 0 ? 0.0f : 1.0f;
    if (sp_comm_all_reduce(B->host, none, none, (size_t)n_experts, SP_F32))
        return core_error_push("gradient buckets: agreeing on the experts: ");
    B->armed = 0;
    for (int e = 0; e < n_experts; e++) {
        B->next[e] = 0;
        if (B->D->trained[e] && none[e] == 0.0f && B->n[e] > 0) B->armed |= 1u << e;
    }
    *armed = B->armed;
    return 0;
}

/* Bucket k of expert e, enqueued on the second stream after everything the device's own stream has so far. */
static int launch(dp_buckets *B, int e, const dp_bucket *k) {
    float *g = trainer_dev_grads(B->D, e);
    if (!g) return core_error("gradient buckets: %s has no device gradients", wan_expert_folder(e));
    if (B->dev->event_record(B->ready, NULL) || B->dev->stream_wait(B->stream, B->ready)) return -1;
    int bad;
    if (B->zero_stage >= 2) { /* the ZeRO shards of the whole buffer, cut to the bucket */
        int64_t *offs = dp_zero_offsets(B->D->numel[e], B->comm->size);
        bad = !offs;
        for (int r = 0; !bad && r <= B->comm->size; r++)
            offs[r] = (offs[r] < k->lo ? k->lo : offs[r] > k->hi ? k->hi : offs[r]) - k->lo;
        bad = bad || sp_comm_reduce_scatter_ranges(B->comm, g + k->lo, offs);
        free(offs);
    } else {
        bad = sp_comm_all_reduce_ordered(B->comm, g + k->lo, k->hi - k->lo);
    }
    if (bad)
        return core_error_push("gradient bucket [%lld, %lld) of %s (after block %d): ", (long long)k->lo,
                               (long long)k->hi, wan_expert_folder(e), k->after);
    B->launched++;
    return 0;
}

int dp_buckets_ready(void *ctx, const wan_model *m, int block) {
    dp_buckets *B = ctx;
    int e = 0;
    while (e < B->D->n_experts && B->D->pol[e] != m) e++;
    if (e == B->D->n_experts || !(B->armed >> e & 1u)) return 0;
    while (B->next[e] < B->n[e] && (block < 0 || B->b[e][B->next[e]].after == block))
        if (launch(B, e, &B->b[e][B->next[e]++])) return -1;
    return 0;
}

int dp_buckets_done(dp_buckets *B, int e) {
    if (!B || !(B->armed >> e & 1u)) return 0;
    if (B->next[e] != B->n[e])
        return core_error("gradient buckets: %s launched %d of its %d buckets in its last backward",
                          wan_expert_folder(e), B->next[e], B->n[e]);
    return 1;
}

int dp_buckets_join_expert(dp_buckets *B, int e) {
    if (!B || !(B->armed >> e & 1u)) return 0;
    B->armed &= ~(1u << e);
    if (B->dev->event_record(B->done, B->stream) || B->dev->stream_wait(NULL, B->done))
        return core_error_push("gradient buckets: waiting for %s's: ", wan_expert_folder(e));
    return 0;
}

int dp_buckets_join(dp_buckets *B) {
    if (!B || !B->armed) return 0;
    B->armed = 0;
    if (B->dev->event_record(B->done, B->stream) || B->dev->stream_wait(NULL, B->done))
        return core_error_push("gradient buckets: the optimizer waiting for them: ");
    return 0;
}
