/* kernels/body/kb_optim.h — the optimizer's elementwise and reduction bodies: the AdamW update of
 * trainer/optim/optim.c's optim_adamw_update (torch.optim.AdamW's single-tensor order), the fixed-order sum of squares of
 * optim_sumsq behind the global gradient norm, and the clip scaling. kernels/ stands below trainer/, so the formulas
 * are restated here; tests/test_kernel_bodies_flow.c checks them bit for bit against trainer/optim/optim.c.
 *
 * AdamW per element, fp32, scalars from kb_adamw_prepare (host, double, rounded to fp32 once as optim.c does):
 *   p = p * decay (where decayed);  m = m + w1 (g - m);  v = v b2 + w2 g g;  d = sqrt(v) / bc2_sqrt + eps;
 *   p = p + step_size * m / d        (left to right: (step_size * m) / d)
 * Master weights and moments stay fp32 on the GPU (docs/design.md section 4); the optional bf16 copy of p is the
 * compute weight the model reads.
 * Sum of squares: chunks of KB_SUMSQ_CHUNK = 8192 elements (optim.h's OPTIM_CHUNK), each summed sequentially in
 * double from its first element, then the chunk sums added sequentially in chunk order. */
#ifndef KERNELS_BODY_KB_OPTIM_H
#define KERNELS_BODY_KB_OPTIM_H

#include <math.h>

#include "kernels/body/kb_base.h"

#define KB_SUMSQ_CHUNK 8192

typedef struct kb_adamw_scalars {
    float decay, w1, b2, w2, bc2_sqrt, eps, step_size;
    int do_decay;
} kb_adamw_scalars;

/* The fp32 scalars of one update at step t >= 1 (optim_adamw_update's prologue). */
KB_HOST_FN kb_adamw_scalars kb_adamw_prepare(double lr, double beta1, double beta2, double eps, double weight_decay,
                                             int64_t t) {
    kb_adamw_scalars s;
    s.decay = (float)(1.0 - lr * weight_decay);
    s.do_decay = weight_decay != 0.0;
    s.w1 = (float)(1.0 - beta1);
    s.b2 = (float)beta2;
    s.w2 = (float)(1.0 - beta2);
    const double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
    s.bc2_sqrt = (float)sqrt(bc2);
    s.eps = (float)eps;
    s.step_size = (float)(-(lr / bc1));
    return s;
}

/* One element: updates *p, *m, *v from gradient g; decay_this: this element takes weight decay (wd_mask). */
KB_FN void kb_adamw_elem(float *p, float *m, float *v, float g, const kb_adamw_scalars *s, int decay_this) {
    float pv = *p;
    if (s->do_decay && decay_this) pv = pv * s->decay;
    const float mi = *m + s->w1 * (g - *m);
    const float vi = *v * s->b2 + s->w2 * g * g;
    const float d = sqrtf(vi) / s->bc2_sqrt + s->eps;
    *m = mi;
    *v = vi;
    *p = pv + s->step_size * mi / d;
}

/* One step of a chunk's sum: s + v^2 in double. */
KB_FN double kb_sumsq_add(double s, float v) {
    const double xi = (double)v;
    return s + xi * xi;
}

/* Sum of squares of x[b .. e) in double, sequentially. */
KB_FN double kb_sumsq_chunk(kb_in x, int64_t b, int64_t e) {
    double s = 0.0;
    for (int64_t i = b; i < e; i++) s = kb_sumsq_add(s, kb_get(x, (size_t)i));
    return s;
}

/* total + part[0] + part[1] + ... in that order (the combine continued over consecutive pieces of the partials). */
KB_FN double kb_sumsq_combine_from(double total, const double *part, int64_t n) {
    for (int64_t c = 0; c < n; c++) total += part[c];
    return total;
}

/* The chunk sums added in chunk order. */
KB_FN double kb_sumsq_combine(const double *part, int64_t nchunks) { return kb_sumsq_combine_from(0.0, part, nchunks); }

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6)), 1 when max_norm <= 0 (host). */
KB_HOST_FN double kb_clip_coef(double norm, double max_norm) {
    if (!(max_norm > 0)) return 1.0;
    double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

#endif
