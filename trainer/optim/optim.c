/* trainer/optim/optim.c — AdamW (torch semantics), transformers-style LR schedules, fixed-order global-norm clipping and
 * gradient accumulation over flat fp32 buffers. See optim.h. Every loop is elementwise or a fixed-chunk reduction,
 * so results do not depend on OMP_NUM_THREADS. */
#include "trainer/optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* No fused multiply-add: results must equal torch's fp32 kernels and the other ports (GCC does not contract in
 * ISO C mode; clang needs telling). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Below this many elements a loop runs on one thread (the parallel region would cost more than it saves). */
#define PAR_MIN 32768

int optim_config_validate(const optim_config *c) {
    if (!(c->lr > 0) || isinf(c->lr)) return core_error("optim.lr: must be finite and > 0, got %g", c->lr);
    if (!(c->beta1 >= 0 && c->beta1 < 1)) return core_error("optim.beta1: must be in [0, 1), got %g", c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1)) return core_error("optim.beta2: must be in [0, 1), got %g", c->beta2);
    if (!(c->eps > 0) || isinf(c->eps)) return core_error("optim.eps: must be finite and > 0, got %g", c->eps);
    if (!(c->weight_decay >= 0) || isinf(c->weight_decay))
        return core_error("optim.weight_decay: must be finite and >= 0, got %g", c->weight_decay);
    if (isnan(c->max_grad_norm)) return core_error("optim.max_grad_norm: is NaN (use 0 for no clipping)");
    if (c->warmup_steps < 0) return core_error("optim.warmup_steps: must be >= 0, got %lld", (long long)c->warmup_steps);
    switch (c->schedule) {
    case OPTIM_SCHED_CONSTANT: return 0;
    case OPTIM_SCHED_LINEAR:
    case OPTIM_SCHED_COSINE:
        if (c->total_steps <= c->warmup_steps)
            return core_error("optim.total_steps: must exceed optim.warmup_steps (%lld) for a linear or cosine "
                              "schedule, got %lld", (long long)c->warmup_steps, (long long)c->total_steps);
        return 0;
    }
    return core_error("optim.schedule: unknown schedule %d (constant, linear, cosine)", (int)c->schedule);
}

double optim_lr_at(const optim_config *c, int64_t step) {
    if (step < 0) step = 0;
    const double w = (double)c->warmup_steps;
    if (step < c->warmup_steps) return c->lr * ((double)step / (w > 1 ? w : 1));
    const double span = (double)(c->total_steps - c->warmup_steps);
    const double den = span > 1 ? span : 1;
    double f = 1.0;
    if (c->schedule == OPTIM_SCHED_LINEAR) {
        f = (double)(c->total_steps - step) / den;
        if (f < 0) f = 0;
    } else if (c->schedule == OPTIM_SCHED_COSINE) {
        double p = (double)(step - c->warmup_steps) / den;
        if (p > 1) p = 1;
        f = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * p)); /* num_cycles = 0.5, as transformers writes it */
        if (f < 0) f = 0;
    }
    return c->lr * f;
}

double optim_sumsq(const float *x, int64_t n) {
    if (n <= 0) return 0.0;
    const int64_t nchunks = (n + OPTIM_CHUNK - 1) / OPTIM_CHUNK;
    /* Chunk sums are formed in batches of at most SUPER chunks (a stack array), each batch's sums then added in
     * chunk order: the same sequence of additions as one pass over all chunk sums, without a heap buffer. */
    enum { SUPER = 1024 };
    double part[SUPER];
    double total = 0.0;
    for (int64_t c0 = 0; c0 < nchunks; c0 += SUPER) {
        const int nc = (int)(nchunks - c0 < SUPER ? nchunks - c0 : SUPER);
#pragma omp parallel for schedule(static) if ((int64_t)nc * OPTIM_CHUNK >= PAR_MIN)
        for (int c = 0; c < nc; c++) {
            const int64_t b = (c0 + c) * OPTIM_CHUNK;
            const int64_t e = b + OPTIM_CHUNK < n ? b + OPTIM_CHUNK : n;
            double s = 0.0;
            for (int64_t i = b; i < e; i++) s += (double)x[i] * (double)x[i];
            part[c] = s;
        }
        for (int c = 0; c < nc; c++) total += part[c];
    }
    return total;
}

void optim_sumsq_chunks(const float *x, int64_t n, int64_t c_lo, int64_t c_hi, double *part) {
    const int64_t nc = c_hi - c_lo;
#pragma omp parallel for schedule(static) if (nc * OPTIM_CHUNK >= PAR_MIN)
    for (int64_t c = 0; c < nc; c++) { /* the loop body of optim_sumsq */
        const int64_t b = (c_lo + c) * OPTIM_CHUNK;
        const int64_t e = b + OPTIM_CHUNK < n ? b + OPTIM_CHUNK : n;
        double s = 0.0;
        for (int64_t i = b; i < e; i++) s += (double)x[i] * (double)x[i];
        part[c] = s;
    }
}

double optim_sumsq_combine(const double *part, int64_t m) {
    double total = 0.0;
    for (int64_t c = 0; c < m; c++) total += part[c];
    return total;
}

double optim_grad_norm(const float *g, int64_t n) { return sqrt(optim_sumsq(g, n)); }

double optim_grad_norm_multi(const float *const *g, const int64_t *n, int k) {
    double ss = 0.0;
    for (int j = 0; j < k; j++) ss += optim_sumsq(g[j], n[j]);
    return sqrt(ss);
}

double optim_clip_coef(double norm, double max_norm) {
    if (!(max_norm > 0)) return 1.0;
    double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

void optim_zero(float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] = 0.0f;
}

void optim_accumulate(float *dst, const float *src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

void optim_scale(float *x, int64_t n, double s) {
    const float f = (float)s;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] *= f;
}

void optim_adamw_update(float *params, const float *grads, float *m, float *v, int64_t n, const uint8_t *wd_mask,
                        double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t) {
    const float decay = (float)(1.0 - lr * weight_decay);
    const int do_decay = weight_decay != 0.0;
    const float w1 = (float)(1.0 - beta1), b2 = (float)beta2, w2 = (float)(1.0 - beta2);
    const double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
    const float bc2_sqrt = (float)sqrt(bc2), feps = (float)eps;
    const float step_size = (float)(-(lr / bc1));
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float p = params[i];
        const float g = grads[i];
        if (do_decay && (!wd_mask || wd_mask[i])) p = p * decay;
        const float mi = m[i] + w1 * (g - m[i]);
        const float vi = v[i] * b2 + w2 * g * g;
        const float d = sqrtf(vi) / bc2_sqrt + feps;
        m[i] = mi;
        v[i] = vi;
        params[i] = p + step_size * mi / d; /* addcdiv_: self + value * t1 / t2 */
    }
}

int optim_adamw_init_shard(optim_adamw *o, int64_t n, int64_t lo, int64_t len) {
    memset(o, 0, sizeof *o);
    if (n < 1) return core_error("optim: parameter count must be >= 1, got %lld", (long long)n);
    if (lo < 0 || len < 0 || lo > n - len)
        return core_error("optim: shard [%lld, %lld) outside %lld parameters", (long long)lo, (long long)(lo + len),
                          (long long)n);
    const size_t k = len > 0 ? (size_t)len : 1;
    o->m = calloc(k, sizeof(float));
    o->v = calloc(k, sizeof(float));
    if (!o->m || !o->v) {
        optim_adamw_free(o);
        return core_error("optim: out of memory for AdamW moments of %lld parameters", (long long)len);
    }
    o->n = n, o->lo = lo, o->len = len;
    return 0;
}

int optim_adamw_init(optim_adamw *o, int64_t n) { return optim_adamw_init_shard(o, n, 0, n); }

void optim_adamw_free(optim_adamw *o) {
    free(o->m);
    free(o->v);
    o->m = o->v = NULL;
    o->n = o->lo = o->len = 0;
}

int optim_adamw_step_coef(optim_adamw *o, const optim_config *cfg, float *params, float *grads, const uint8_t *wd_mask,
                          double grad_norm, double clip_coef, optim_step_info *info) {
    if (optim_config_validate(cfg)) return -1;
    if (!isfinite(grad_norm))
        return core_error("optim: gradient norm is %s at optimizer step %lld; parameters not updated",
                          isnan(grad_norm) ? "nan" : "inf", (long long)o->step);
    if (!(clip_coef > 0 && clip_coef <= 1))
        return core_error("optim: clip factor %g at optimizer step %lld must be in (0, 1]; parameters not updated",
                          clip_coef, (long long)o->step);
    const int64_t lo = o->lo; /* a shard's part of the buffers (the whole: 0, n) */
    if (clip_coef < 1.0) optim_scale(grads + lo, o->len, clip_coef);
    const double lr = optim_lr_at(cfg, o->step);
    optim_adamw_update(params + lo, grads + lo, o->m, o->v, o->len, wd_mask ? wd_mask + lo : NULL, lr, cfg->beta1,
                       cfg->beta2, cfg->eps, cfg->weight_decay, o->step + 1);
    o->step++;
    if (info) {
        info->grad_norm = grad_norm;
        info->clip_coef = clip_coef;
        info->lr = lr;
    }
    return 0;
}

int optim_adamw_step(optim_adamw *o, const optim_config *cfg, float *params, float *grads, const uint8_t *wd_mask,
                     optim_step_info *info) {
    if (optim_config_validate(cfg)) return -1;
    if (o->lo != 0 || o->len != o->n)
        return core_error("optim: a sharded AdamW state (parameters %lld..%lld of %lld) needs the norm of every shard "
                          "(trainer/dp/zero.h)", (long long)o->lo, (long long)(o->lo + o->len), (long long)o->n);
    const double norm = optim_grad_norm(grads, o->n);
    return optim_adamw_step_coef(o, cfg, params, grads, wd_mask, norm,
                                 isfinite(norm) ? optim_clip_coef(norm, cfg->max_grad_norm) : 1.0, info);
}
