/* kernels/body/kb_lse.h — merge of two partial attention results through their log-sum-exp (ring attention), one
 * query row (Dh values of one token and head) per body call; kernels/cpu/lse_merge.c's loop calls these bodies.
 * The weights use the maths library (expf, log1pf): on the CPU the body therefore equals k_cpu_ops bit for bit, on
 * the GPU CUDA's expf/log1pf (within 2 ulp) make it differ by rounding, so the GPU check uses a band there.
 *   L = max + log1p(exp(min - max)), w_k = exp(lse_k - L); o = w1 o1 + w2 o2 (a term with w_k == 0 is skipped, so
 *   an empty partial's o_k is never read); backward: do_k += w_k dout, dlse_k += w_k (dlse + dout . (o_k - o)).
 * o rows [B, S, H, Dh]; lse [B, H, S] fp32 (always fp32). */
#ifndef KERNELS_BODY_KB_LSE_H
#define KERNELS_BODY_KB_LSE_H

#include <math.h>

#include "kernels/body/kb_base.h"

/* Row r of a [B, S, H, Dh] tensor (r = (b*S + s)*H + h) -> its entry (b*H + h)*S + s of the [B, H, S] LSE. */
KB_FN size_t kb_lse_index(size_t r_, int S, int H) {
    const uint32_t r = (uint32_t)r_; /* rows < 2^31: the callers check (32-bit index math) */
    uint32_t b = r / ((uint32_t)S * H), s = r / (uint32_t)H % (uint32_t)S, h = r % (uint32_t)H;
    return (b * (uint32_t)H + h) * (uint32_t)S + s;
}

/* Merged lse and the two weights; returns 0 when both partials are empty (L = -inf, or NaN when one lse is NaN). */
KB_FN int kb_lse_merge_weights(float l1, float l2, float *L, float *w1, float *w2) {
    float mx = l1 > l2 ? l1 : l2, mn = l1 > l2 ? l2 : l1;
    if (mx == -INFINITY || mx != mx) {
        *L = mx != mx ? mx : -INFINITY;
        *w1 = *w2 = 0.0f;
        return 0;
    }
    *L = mx + log1pf(expf(mn - mx));
    *w1 = expf(l1 - *L);
    *w2 = expf(l2 - *L);
    return 1;
}

/* One row of the forward: o[oi .. oi+Dh) and lse[li]. o may alias o1 or o2 (each element is read before written). */
KB_FN void kb_lse_merge_fwd_row(kb_out o, float *lse, kb_in o1, const float *lse1, kb_in o2, const float *lse2,
                                size_t oi, size_t li, int Dh) {
    float L, w1, w2;
    int live = kb_lse_merge_weights(lse1[li], lse2[li], &L, &w1, &w2);
    for (int e = 0; e < Dh; e++) {
        float x = 0.0f;
        if (live) {
            if (w1 != 0.0f) x += w1 * kb_get(o1, oi + (size_t)e);
            if (w2 != 0.0f) x += w2 * kb_get(o2, oi + (size_t)e);
        }
        kb_set(o, oi + (size_t)e, x);
    }
    lse[li] = L;
}

/* One row of the backward: do1, do2 += (p NULL: not wanted); dlse1, dlse2 += (NULL: not wanted); dlse NULL = 0. */
KB_FN void kb_lse_merge_bwd_row(kb_out do1, float *dlse1, kb_out do2, float *dlse2, kb_in dout, const float *dlse,
                                kb_in o1, const float *lse1, kb_in o2, const float *lse2, size_t oi, size_t li,
                                int Dh) {
    float L, w1, w2;
    if (!kb_lse_merge_weights(lse1[li], lse2[li], &L, &w1, &w2)) return;
    const float g = dlse ? dlse[li] : 0.0f;
    float dot1 = 0.0f, dot2 = 0.0f;
    for (int e = 0; e < Dh; e++) {
        size_t i = oi + (size_t)e;
        float a = w1 != 0.0f ? kb_get(o1, i) : 0.0f, c = w2 != 0.0f ? kb_get(o2, i) : 0.0f;
        float x = 0.0f;
        if (w1 != 0.0f) x += w1 * a;
        if (w2 != 0.0f) x += w2 * c;
        float d = kb_get(dout, i);
        dot1 += d * (a - x);
        dot2 += d * (c - x);
    }
    if (w1 != 0.0f) {
        if (do1.p)
            for (int e = 0; e < Dh; e++) kb_acc(do1, oi + (size_t)e, w1 * kb_get(dout, oi + (size_t)e));
        if (dlse1) dlse1[li] += w1 * (g + dot1);
    }
    if (w2 != 0.0f) {
        if (do2.p)
            for (int e = 0; e < Dh; e++) kb_acc(do2, oi + (size_t)e, w2 * kb_get(dout, oi + (size_t)e));
        if (dlse2) dlse2[li] += w2 * (g + dot2);
    }
}

#endif
