/* kernels/cpu/lse_merge.c — merge of two partial attention results over disjoint key sets through their
 * log-sum-exp (the combine step of ring attention and of split-KV "flash decoding"), forward and backward, fp32.
 *
 * With L = log(exp(lse1) + exp(lse2)) and weights w_k = exp(lse_k - L) (w1 + w2 = 1):
 *   o = w1 o1 + w2 o2,
 *   do_k += w_k dout,   dlse_k += w_k (dlse + dout . (o_k - o))      (per query row; dot over Dh)
 * (d L / d lse_k = w_k; d w_1 / d lse_1 = w1 w2, d w_2 / d lse_1 = -w1 w2, and w2 (o1 - o2) = o1 - o).
 * An empty partial (lse_k = -inf, e.g. attention over zero keys) has weight 0 and its o_k is never read, so it
 * cannot inject NaN; two empty partials give o = 0, lse = -inf and zero gradients. Each row is independent, so
 * results do not depend on the thread count. The row arithmetic is kernels/body/kb_lse.h's (the device kernels'
 * too), on fp32 views; this file adds the loop over rows. */
#include <math.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "kernels/body/kb_lse.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/prof.h"

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
        kb_lse_merge_fwd_row(kb_out_f32(o), lse, kb_in_f32(o1), lse1, kb_in_f32(o2), lse2, (size_t)oi, (size_t)li, Dh);
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
        kb_lse_merge_bwd_row(kb_out_f32(do1), dlse1, kb_out_f32(do2), dlse2, kb_in_f32(dout), dlse, kb_in_f32(o1), lse1,
                             kb_in_f32(o2), lse2, (size_t)oi, (size_t)li, Dh);
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
