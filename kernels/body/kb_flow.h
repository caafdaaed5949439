/* kernels/body/kb_flow.h — the per-element and per-chunk arithmetic of the SDE step with its log-prob, its backward
 * with respect to the velocity, the KL sum, and classifier-free guidance: the bodies behind model/flow/flow.c and
 * model/flow/guidance.h on the GPU. kernels/ stands below model/, so these bodies restate the formulas rather than
 * include them; tests/test_kernel_bodies_flow.c checks them bit for bit against flow_sde_step, flow_kl,
 * flow_sde_backward_v, flow_cfg_combine and flow_cfg_backward.
 *
 * Everything is fp32 (docs/design.md section 4: sampling and log-prob arithmetic stays fp32 on the GPU; the velocity may
 * come from the model in bf16 and is read exactly). Sums follow core/reduce.h's fixed order: chunks of
 * KB_REDUCE_CHUNK = 4096 consecutive elements, each summed sequentially in fp32 from element 0, then the chunk sums
 * combined by the fixed pairwise tree, evaluated as core/reduce.c's binary counter (kb_counter_*). On the GPU one
 * thread sums one chunk and one thread combines the chunk sums; the result is the CPU's to the bit.
 * The step's scalars (coef_x, coef_v, step_std; flow_step_init) and the final log-prob from the sum
 * (logp = -(S/n) / (2 step_std^2) - logf(step_std) - log(sqrt(2 pi))) are host arithmetic of model/flow, done once
 * per step; kb_sde_logp_from_sum restates the latter for the GPU check. */
#ifndef KERNELS_BODY_KB_FLOW_H
#define KERNELS_BODY_KB_FLOW_H

#include <math.h>

#include "kernels/body/kb_base.h"

#define KB_REDUCE_CHUNK 4096

/* The fixed pairwise tree as a binary counter (core/reduce.c): push chunk sums in index order; two partials that
 * cover equal numbers of chunks merge left + right as soon as both exist; finish merges what is left from the
 * right. 64 levels cover any int64 count. */
typedef struct kb_counter {
    float val[64];
    int64_t size[64];
    int top;
} kb_counter;

KB_FN void kb_counter_init(kb_counter *c) { c->top = 0; }

KB_FN void kb_counter_push(kb_counter *c, float v) {
    int64_t size = 1;
    while (c->top > 0 && c->size[c->top - 1] == size) {
        c->top--;
        v = c->val[c->top] + v;
        size *= 2;
    }
    c->val[c->top] = v;
    c->size[c->top] = size;
    c->top++;
}

KB_FN float kb_counter_finish(const kb_counter *c) {
    if (c->top == 0) return 0.0f;
    float v = c->val[c->top - 1];
    for (int j = c->top - 2; j >= 0; j--) v = c->val[j] + v;
    return v;
}

/* Chunk [b, e) of one SDE step (model/flow/flow.c step_chunk): per element
 *   mean = cx * x + cv * v (two products, one sum);  x_next = mean + step_std * eps (eps.p != NULL), the recorded
 *   given[i] (given.p != NULL), or mean;  mean_out[i] = mean (p may be NULL);  x_next_out[i] = x_next unless given
 *   (p may be NULL);  and, when want_sum, returns the fp32 sum in index order of (x_next - mean)^2 (else 0). */
KB_FN float kb_sde_chunk(kb_in x, kb_in v, kb_in eps, kb_in given, kb_out mean_out, kb_out x_next_out, float cx,
                         float cv, float step_std, int want_sum, int64_t b, int64_t e) {
    float acc = 0.0f;
    for (int64_t i = b; i < e; i++) {
        const float xi = kb_get(x, (size_t)i), vi = kb_get(v, (size_t)i);
        const float px = cx * xi;
        const float pv = cv * vi;
        const float m = px + pv;
        float xn;
        if (eps.p) {
            const float noise = step_std * kb_get(eps, (size_t)i);
            xn = m + noise;
        } else if (given.p) {
            xn = kb_get(given, (size_t)i);
        } else {
            xn = m;
        }
        if (mean_out.p) kb_set(mean_out, (size_t)i, m);
        if (x_next_out.p && !given.p) kb_set(x_next_out, (size_t)i, xn);
        if (want_sum) {
            const float d = xn - m;
            acc += d * d;
        }
    }
    return acc;
}

/* Chunk [b, e) of sum (a - b)^2 in index order (core_sum_sq_diff_fixed; the KL's sum). */
KB_FN float kb_sq_diff_chunk(kb_in a, kb_in bb, int64_t b, int64_t e) {
    float acc = 0.0f;
    for (int64_t i = b; i < e; i++) {
        const float d = kb_get(a, (size_t)i) - kb_get(bb, (size_t)i);
        acc += d * d;
    }
    return acc;
}

/* The log-prob from the step's sum of squares (flow_sde_step's last lines; host arithmetic, glibc logf). */
KB_HOST_FN float kb_sde_logp_from_sum(float sum, int64_t n, float step_std) {
    const float var = step_std * step_std;
    const float msq = sum / (float)n;
    return -msq / (2.0f * var) - logf(step_std) - 0.918938533204672742f;
}

/* dv element of flow_sde_backward_v: k * (g_logp * (x_next - mean) + g_kl * (mean - mean_ref)), each term left out
 * when its flag is 0; k = coef_v / (step_std^2 * n) computed once on the host. */
KB_FN float kb_sde_dv_elem(float m, float xn, float mref, float g_logp, float g_kl, int use_logp, int use_kl,
                           float k) {
    float g = 0.0f;
    if (use_logp) {
        const float a = g_logp * (xn - m);
        g = g + a;
    }
    if (use_kl) {
        const float bb = g_kl * (m - mref);
        g = g + bb;
    }
    return k * g;
}

/* Classifier-free guidance (model/flow/guidance.h): v = v_u + g (v_c - v_u); backward dv_c = g dv, dv_u = (1-g) dv
 * with gu = 1 - g rounded once by the caller. */
KB_FN float kb_cfg_elem(float vc, float vu, float g) {
    float d = vc - vu;
    float t = g * d;
    return vu + t;
}

#endif
