/* kernels/cpu/lse_merge.c — merge of two partial attention results over disjoint key sets through their
 * log-sum-exp (the combine step of ring attention and of split-KV "flash decoding"), forward and backward, fp32.
 *
 * With L = log(exp(lse1) + exp(lse2)) and weights w_k = exp(lse_k - L) (w1 + w2 = 1):
 *   o = w1 o1 + w2 o2,
 *   do_k += w_k dout,   dlse_k += w_k (dlse + dout . (o_k - o))      (per query row; dot over Dh)
 * (d L / d lse_k = w_k; d w_1 / d lse_1 = w1 w2, d w_2 / d lse_1 = -w1 w2, and w2 (o1 - o2) = o1 - o).
 * An empty partial (lse_k = -inf, e.g. attention over zero keys) has weight 0 and its o_k is never read, so it
 * cannot inject NaN; two empty partials give o = 0, lse = -inf and zero gradients. Each row is independent, so
 * results do not depend on the thread count. */
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/prof.h"

/* Merged lse and the two weights of one row; returns 0 when both partials are empty (L = -inf). */
static int merge_weights(float l1, float l2, float *L, float *w1, float *w2) {
    float mx = l1 > l2 ? l1 : l2, mn = l1 > l2 ? l2 : l1;
    if (mx == -INFINITY || isnan(mx)) {
        *L = isnan(mx) ? mx : -INFINITY;
        *w1 = *w2 = 0.0f;
        return 0;
    }
    *L = mx + log1pf(expf(mn - mx));
    *w1 = expf(l1 - *L);
    *w2 = expf(l2 - *L);
    return 1;
}

/* Forward: see kernels.h (lse_merge_forward). o, o1, o2 [B,S,H,Dh]; lse, lse1, lse2 [B,H,S] natural log.
 * o may alias o1 (or o2) and lse may alias lse1 (or lse2). Reference: the log-sum-exp combine of
 * FlashAttention's split-KV kernel / ring attention (Liu et al., "Ring Attention", 2023). */
static void lse_merge_forward_run(float *o, float *lse, const float *o1, const float *lse1, const float *o2,
                             const float *lse2, int B, int S, int H, int Dh) {
    const long rows = (long)B * S * H;
#pragma omp parallel for schedule(static) if ((size_t)rows * Dh >= K_PAR_MIN_ELEMS)
    for (long r = 0; r < rows; r++) {
        const long b = r / ((long)S * H), s = r / H % S, h = r % H;
        const ptrdiff_t li = (b * H + h) * S + s, oi = r * Dh;
        float L, w1, w2;
        int live = merge_weights(lse1[li], lse2[li], &L, &w1, &w2);
        for (int e = 0; e < Dh; e++) {
            float x = 0.0f;
            if (live) {
                if (w1 != 0.0f) x += w1 * o1[oi + e];
                if (w2 != 0.0f) x += w2 * o2[oi + e];
            }
            o[oi + e] = x;
        }
        lse[li] = L;
    }
}

/* Backward: see kernels.h (lse_merge_backward). Given dout [B,S,H,Dh] and dlse [B,H,S] (NULL: zero), and the
 * forward's inputs, ACCUMULATES do1, do2 [B,S,H,Dh] += and dlse1, dlse2 [B,H,S] +=; any of the four outputs may be
 * NULL when not wanted. The merged o is recomputed exactly as the forward computes it. */
static void lse_merge_backward_run(float *do1, float *dlse1, float *do2, float *dlse2, const float *dout,
                              const float *dlse, const float *o1, const float *lse1, const float *o2,
                              const float *lse2, int B, int S, int H, int Dh) {
    const long rows = (long)B * S * H;
#pragma omp parallel for schedule(static) if ((size_t)rows * Dh >= K_PAR_MIN_ELEMS)
    for (long r = 0; r < rows; r++) {
        const long b = r / ((long)S * H), s = r / H % S, h = r % H;
        const ptrdiff_t li = (b * H + h) * S + s, oi = r * Dh;
        float L, w1, w2;
        if (!merge_weights(lse1[li], lse2[li], &L, &w1, &w2)) continue;
        const float g = dlse ? dlse[li] : 0.0f;
        float dot1 = 0.0f, dot2 = 0.0f;
        for (int e = 0; e < Dh; e++) {
            float a = w1 != 0.0f ? o1[oi + e] : 0.0f, c = w2 != 0.0f ? o2[oi + e] : 0.0f;
            float x = 0.0f;
            if (w1 != 0.0f) x += w1 * a;
            if (w2 != 0.0f) x += w2 * c;
            dot1 += dout[oi + e] * (a - x);
            dot2 += dout[oi + e] * (c - x);
        }
        if (w1 != 0.0f) {
            if (do1)
                for (int e = 0; e < Dh; e++) do1[oi + e] += w1 * dout[oi + e];
            if (dlse1) dlse1[li] += w1 * (g + dot1);
        }
        if (w2 != 0.0f) {
            if (do2)
                for (int e = 0; e < Dh; e++) do2[oi + e] += w2 * dout[oi + e];
            if (dlse2) dlse2[li] += w2 * (g + dot2);
        }
    }
}

/* ---- the op table entries: the bodies above, timed when kernels/cpu/prof.h is on ---- */

void k_cpu_lse_merge_forward(float *o, float *lse, const float *o1, const float *lse1, const float *o2,
                             const float *lse2, int B, int S, int H, int Dh) {
    K_PROF_BEGIN();
    lse_merge_forward_run(o, lse, o1, lse1, o2, lse2, B, S, H, Dh);
    K_PROF_END("lse_merge_forward", (int64_t)B * S * H * Dh, 0);
}

void k_cpu_lse_merge_backward(float *do1, float *dlse1, float *do2, float *dlse2, const float *dout, const float *dlse,
                              const float *o1, const float *lse1, const float *o2, const float *lse2, int B, int S,
                              int H, int Dh) {
    K_PROF_BEGIN();
    lse_merge_backward_run(do1, dlse1, do2, dlse2, dout, dlse, o1, lse1, o2, lse2, B, S, H, Dh);
    K_PROF_END("lse_merge_backward", (int64_t)B * S * H * Dh, 0);
}
