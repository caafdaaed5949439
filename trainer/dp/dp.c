/* trainer/dp/dp.c — data parallelism over trainer ranks (see trainer/dp/dp.h). */
#include "trainer/dp/dp.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "trainer/optim/lora.h"
#include "trainer/dp/zero.h"

/* Packed batch: [int64 n][n x core_traj structs][adv f32 x n][mask u8 x n][per sample: sigmas [N+1], timesteps [N],
 * latents [M x nl], means [(M - 1) x nl] when stored, condition [C x H x W] when stored, log_probs [N], has_log_prob
 * [N], expert [N]] with M the stored latents (n_latents, from latent_first) and nl the latent's elements. Every rank
 * runs the same executable, so the struct layout is shared; the array pointers inside the structs are ignored by the
 * reader except `means`, `condition` and `concat` (I2V-A14B: [concat_channels, F, H, W] after the condition),
 * whose being non-NULL says they follow. */
static size_t concat_numel(const core_traj *t) {
    return t->concat ? (size_t)(t->concat_channels * t->shape[1] * t->shape[2] * t->shape[3]) : 0;
}

static size_t traj_arrays_bytes(const core_traj *t) {
    const size_t N = (size_t)t->n_steps, nl = (size_t)core_traj_latent_numel(t), M = (size_t)t->n_latents;
    const size_t nc = t->condition ? (size_t)(t->shape[0] * t->shape[2] * t->shape[3]) : 0;
    return sizeof(float) * ((N + 1) + N + M * nl + (t->means ? (M - 1) * nl : 0) + nc + concat_numel(t) + N) + 2 * N;
}

/* Allocates the arrays of a received sample as its header describes them (zeroed; core_traj_free frees them). The
 * header's range was checked against the buffer by the caller. */
static int alloc_like(core_traj *t, const core_traj *hdr) {
    const size_t N = (size_t)hdr->n_steps, nl = (size_t)core_traj_latent_numel(hdr), M = (size_t)hdr->n_latents;
    *t = *hdr; /* scalars, shape, range, rewards */
    t->sigmas = calloc(N + 1, sizeof(float));
    t->timesteps = calloc(N, sizeof(float));
    t->latents = calloc(M * nl, sizeof(float));
    t->means = hdr->means ? calloc((M - 1) * nl, sizeof(float)) : NULL;
    t->condition = hdr->condition ? calloc((size_t)(hdr->shape[0] * hdr->shape[2] * hdr->shape[3]), sizeof(float)) : NULL;
    t->concat = hdr->concat ? calloc(concat_numel(hdr), sizeof(float)) : NULL;
    t->log_probs = calloc(N, sizeof(float));
    t->has_log_prob = calloc(N, 1);
    t->expert = calloc(N, 1);
    if (!t->sigmas || !t->timesteps || !t->latents || (hdr->means && !t->means) || (hdr->condition && !t->condition) ||
        (hdr->concat && !t->concat) ||
        !t->log_probs || !t->has_log_prob || !t->expert) {
        core_traj_free(t);
        return core_error("dp: out of memory for %zu steps, %zu latents x %zu elements", N, M, nl);
    }
    return 0;
}

/* 1 when a received header's step count, range and latent shape are sane and its arrays could fit in size bytes
 * (so traj_arrays_bytes cannot overflow). */
static int header_fits(const core_traj *h, int64_t size) {
    if (h->n_steps < 1 || h->n_steps > size || h->latent_first < 0 || h->n_latents < (h->means ? 2 : 1) ||
        h->latent_first + (int64_t)h->n_latents > (int64_t)h->n_steps + 1 ||
        (h->concat && (h->concat_channels < 1 || h->concat_channels > 4096)))
        return 0;
    int64_t nl = 1;
    for (int d = 0; d < 4; d++) {
        if (h->shape[d] < 1 || nl > size / h->shape[d]) return 0;
        nl *= h->shape[d];
    }
    return nl <= size / (int64_t)sizeof(float) / h->n_latents;
}

#define PUT(ptr, bytes) (memcpy(p, (ptr), (bytes)), p += (bytes))
#define GET(ptr, bytes) (memcpy((ptr), p, (bytes)), p += (bytes))

int dp_batch_broadcast(sp_comm *c, dp_batch *b) {
    int64_t size = 0;
    uint8_t *buf = NULL, *p;
    if (c->rank == 0) {
        size = (int64_t)(sizeof(int64_t) + (size_t)b->n * (sizeof(core_traj) + sizeof(float) + 1));
        for (int j = 0; j < b->n; j++) size += (int64_t)traj_arrays_bytes(&b->traj[j]);
    }
    if (sp_comm_broadcast(c, &size, 1, SP_I64, 0)) return core_error_push("dp: batch size: ");
    if (size < (int64_t)sizeof(int64_t)) return core_error("dp: corrupt batch size %lld", (long long)size);
    if (!(buf = malloc((size_t)size))) return core_error("dp: out of memory for a %lld-byte batch", (long long)size);
    if (c->rank == 0) {
        p = buf;
        const int64_t n = b->n;
        PUT(&n, sizeof n);
        PUT(b->traj, sizeof(core_traj) * (size_t)n);
        PUT(b->adv, sizeof(float) * (size_t)n);
        PUT(b->mask, (size_t)n);
        for (int j = 0; j < n; j++) {
            const core_traj *t = &b->traj[j];
            const size_t N = (size_t)t->n_steps, nl = (size_t)core_traj_latent_numel(t), M = (size_t)t->n_latents;
            PUT(t->sigmas, sizeof(float) * (N + 1));
            PUT(t->timesteps, sizeof(float) * N);
            PUT(t->latents, sizeof(float) * M * nl);
            if (t->means) PUT(t->means, sizeof(float) * (M - 1) * nl);
            if (t->condition) PUT(t->condition, sizeof(float) * (size_t)(t->shape[0] * t->shape[2] * t->shape[3]));
            if (t->concat) PUT(t->concat, sizeof(float) * concat_numel(t));
            PUT(t->log_probs, sizeof(float) * N);
            PUT(t->has_log_prob, N);
            PUT(t->expert, N);
        }
    }
    int rc = sp_comm_broadcast(c, buf, (size_t)size, SP_U8, 0);
    if (rc || c->rank == 0) {
        free(buf);
        return rc ? core_error_push("dp: batch: ") : 0;
    }
    memset(b, 0, sizeof *b);
    p = buf;
    int64_t n;
    GET(&n, sizeof n);
    if (n < 1 || (size_t)size < sizeof n + (size_t)n * (sizeof(core_traj) + sizeof(float) + 1)) {
        free(buf);
        return core_error("dp: corrupt batch (%lld samples in %lld bytes)", (long long)n, (long long)size);
    }
    b->traj = calloc((size_t)n, sizeof(core_traj));
    b->adv = malloc(sizeof(float) * (size_t)n);
    b->mask = malloc((size_t)n);
    core_traj *hdr = malloc(sizeof(core_traj) * (size_t)n);
    if (!b->traj || !b->adv || !b->mask || !hdr) {
        free(buf), free(hdr), dp_batch_free(b);
        return core_error("dp: out of memory");
    }
    b->n = (int)n;
    GET(hdr, sizeof(core_traj) * (size_t)n);
    GET(b->adv, sizeof(float) * (size_t)n);
    GET(b->mask, (size_t)n);
    for (int j = 0; j < n; j++) {
        const core_traj *h = &hdr[j];
        if (!header_fits(h, size) || (size_t)(p - buf) + traj_arrays_bytes(h) > (size_t)size) {
            free(buf), free(hdr), dp_batch_free(b);
            return core_error("dp: corrupt batch (sample %d runs past the end or has a bad range)", j);
        }
        core_traj *t = &b->traj[j];
        if (alloc_like(t, h)) {
            free(buf), free(hdr), dp_batch_free(b);
            return core_error_push("dp: sample %d: ", j);
        }
        const size_t N = (size_t)t->n_steps, nl = (size_t)core_traj_latent_numel(t), M = (size_t)t->n_latents;
        GET(t->sigmas, sizeof(float) * (N + 1));
        GET(t->timesteps, sizeof(float) * N);
        GET(t->latents, sizeof(float) * M * nl);
        if (t->means) GET(t->means, sizeof(float) * (M - 1) * nl);
        if (t->condition) GET(t->condition, sizeof(float) * (size_t)(t->shape[0] * t->shape[2] * t->shape[3]));
        if (t->concat) GET(t->concat, sizeof(float) * concat_numel(t));
        GET(t->log_probs, sizeof(float) * N);
        GET(t->has_log_prob, N);
        GET(t->expert, N);
    }
    free(buf), free(hdr);
    return 0;
}

void dp_batch_free(dp_batch *b) {
    if (b->traj)
        for (int j = 0; j < b->n; j++) core_traj_free(&b->traj[j]);
    free(b->traj), free(b->adv), free(b->mask);
    memset(b, 0, sizeof *b);
}

void dp_share(int n, int rank, int size, int *lo, int *hi) {
    *lo = (int)((int64_t)n * rank / size);
    *hi = (int)((int64_t)n * (rank + 1) / size);
}

static int gather_doubles(sp_comm *c, double *x, int n, int max) {
    if (c->size == 1) return 0;
    double *all = malloc(sizeof(double) * (size_t)n * (size_t)c->size);
    if (!all) return core_error("dp: out of memory");
    if (sp_comm_all_gather(c, x, all, sizeof(double) * (size_t)n, SP_U8)) {
        free(all);
        return core_error_push("dp: statistics: ");
    }
    for (int i = 0; i < n; i++) {
        double s = max ? all[i] : 0;
        for (int r = 0; r < c->size; r++) {
            const double v = all[(size_t)r * n + i];
            s = max ? (v > s ? v : s) : s + v;
        }
        x[i] = s;
    }
    free(all);
    return 0;
}

int dp_sum_doubles(sp_comm *c, double *x, int n) { return gather_doubles(c, x, n, 0); }
int dp_max_doubles(sp_comm *c, double *x, int n) { return gather_doubles(c, x, n, 1); }

int dp_grad_reduce(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained, grpo_loss_stats *stats) {
    const dp_reduce_ctx *rc = ctx;
    sp_comm *c = rc ? rc->grads : NULL;
    if (!c || c->size == 1) return 0;
    for (int e = 0; e < n_experts; e++) { /* with LoRA the adapter's gradients (trainer/optim/lora.h); the base has none */
        if (trained && !trained[e]) continue;
        const trainer_trained_buf tb = trainer_trained_buffer(policy[e]);
        int bad;
        if (rc->zero_stage == 2) { /* each rank keeps the sum of its shard only */
            int64_t *offs = dp_zero_offsets(tb.n, c->size);
            bad = !offs || sp_comm_reduce_scatter_ranges(c, tb.grads, offs);
            free(offs);
        } else {
            bad = sp_comm_all_reduce_ordered(c, tb.grads, tb.n);
        }
        if (bad)
            return core_error_push("dp: gradients of %s%s: ", wan_expert_folder(e), tb.params == policy[e]->params ? "" : "'s LoRA adapter");
    }
    return stats ? dp_stats_reduce(rc->stats, stats) : 0;
}

int dp_stats_reduce(sp_comm *c, grpo_loss_stats *stats) {
    double x[7] = {(double)stats->n_transitions, (double)stats->n_clipped, stats->loss, stats->policy, stats->kl,
                   stats->abs_ratio_dev_sum, stats->abs_logp_diff_sum};
    if (c && dp_sum_doubles(c, x, 7)) return -1;
    stats->n_transitions = (int64_t)x[0], stats->n_clipped = (int64_t)x[1];
    stats->loss = x[2], stats->policy = x[3], stats->kl = x[4];
    stats->abs_ratio_dev_sum = x[5], stats->abs_logp_diff_sum = x[6];
    return 0;
}
