/* kernels/body/kb_norm.h — LayerNorm and RMSNorm bodies (forward, backward, weight/bias gradients), one row split
 * over KB_NORM_LANES = 16 lanes.
 *
 * The order is kernels/cpu/norm.c's, operation for operation (its loops call the element bodies, the statistics and
 * the lane tree below), so with fp32 storage a body reproduces k_cpu_ops bit for bit (tests/test_kernel_bodies.c):
 * - Row statistics and the backward's two row sums accumulate in double over 16 lanes: lane j adds elements
 *   j, j+16, j+32, ... in order, then the 16 lane sums are added in a fixed pairwise tree (kb_norm_combine).
 *   On the GPU the 16 lanes are 16 threads of a warp; each computes its lane sum with the same function and the
 *   tree over the 16 values is the same function too.
 * - mean and rstd are rounded to fp32 once; out and the backward use those fp32 values.
 * - Weight and bias gradients: a fixed-order parallel reduction over rows. The rows are cut into ranges of
 *   KB_NORM_PARAM_ROWS = 128 (fixed by the data layout, not by the launch); the partial of (range r, column c) adds
 *   its rows in order in double (on the GPU one thread per (range, column): C x ceil(N / 128) threads, coalesced
 *   across columns), then each column adds its range partials in range order in double from 0 and rounds once (one
 *   thread per column, ceil(N / 128) values). With N <= 128 that is the CPU's order (rows 0..N-1 in order in double)
 *   exactly; above, the double sum is regrouped at range boundaries, so the fp32 result may differ from
 *   kernels/cpu/norm.c's in the last bit (tests/test_kernel_bodies.c: kbody_norm_param_ranges).
 * RMSNorm is the LayerNorm path with mean 0 (x - 0 is exact), as in norm.c. Wan's q/k norm is RMSNorm over all
 * heads: C = H * Dh.
 * Reference: torch.nn.LayerNorm (biased variance, eps inside the sqrt), torch.nn.RMSNorm / diffusers RMSNorm. */
#ifndef KERNELS_BODY_KB_NORM_H
#define KERNELS_BODY_KB_NORM_H

#include <math.h>

#include "kernels/body/kb_base.h"

#define KB_NORM_LANES 16

/* Lane `lane`'s partial sum of row x[row .. row + C): elements lane, lane + 16, ... in order, in double. */
KB_FN double kb_norm_lane_sum(kb_in x, size_t row, int C, int lane) {
    double s = 0.0;
    for (int c = lane; c < C; c += KB_NORM_LANES) s += (double)kb_get(x, row + (size_t)c);
    return s;
}

/* Lane partial of sum (x - m)^2 (m = 0 for RMSNorm). */
KB_FN double kb_norm_lane_sq_dev(kb_in x, size_t row, int C, int lane, double m) {
    double s = 0.0;
    for (int c = lane; c < C; c += KB_NORM_LANES) {
        double d = (double)kb_get(x, row + (size_t)c) - m;
        s += d * d;
    }
    return s;
}

/* The 16 lane sums added in the fixed pairwise tree: l[j] += l[j + w] for w = 8, 4, 2, 1. l is not modified. */
KB_FN double kb_norm_combine(const double *l) {
    double t[KB_NORM_LANES];
    for (int j = 0; j < KB_NORM_LANES; j++) t[j] = l[j];
    for (int w = KB_NORM_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) t[j] = t[j] + t[j + w];
    return t[0];
}

/* Row mean from the row sum, in double (kept for the variance pass; rounded to fp32 for storage and use). */
KB_FN double kb_norm_mean(double sum, int C) { return sum / C; }

/* rstd = 1 / sqrt(sqdev / C + eps) rounded to fp32 (sqdev: sum of squared deviations, or of squares for RMSNorm). */
KB_FN float kb_norm_rstd(double sqdev, int C, float eps) {
    double var = sqdev / C;
    return (float)(1.0 / sqrt(var + (double)eps));
}

/* LayerNorm output element: (x - mean) * rstd, then * w and + b when has_w (b only with w, as the CPU op). */
KB_FN float kb_layernorm_elem(float x, float mf, float rf, int has_w, float w, int has_b, float b) {
    float xh = (x - mf) * rf;
    if (has_w) {
        float t = xh * w;
        return has_b ? t + b : t;
    }
    return xh;
}

/* RMSNorm output element: (x * rstd) * w (or x * rstd). */
KB_FN float kb_rmsnorm_elem(float x, float rf, int has_w, float w) {
    float xh = x * rf;
    return has_w ? xh * w : xh;
}

/* Backward lane sums of one row: sgx += g * x_hat and sg += g in double, g = dout * w (w.p NULL: dout), x_hat =
 * (x - mean) * rstd (has_mean 0: x * rstd), both formed in fp32 as the forward forms them. */
KB_FN void kb_norm_lane_grad_sums(kb_in x, kb_in dout, kb_in w, size_t row, int C, int lane, int has_mean, float mf,
                                  float rf, double *sgx, double *sg) {
    double l1 = 0.0, l2 = 0.0;
    for (int c = lane; c < C; c += KB_NORM_LANES) {
        float xv = kb_get(x, row + (size_t)c);
        float xh = has_mean ? (xv - mf) * rf : xv * rf;
        float gv = kb_get(dout, row + (size_t)c);
        float g = w.p ? gv * kb_get(w, (size_t)c) : gv;
        l1 += (double)g * (double)xh;
        l2 += (double)g;
    }
    *sgx = l1;
    *sg = l2;
}

/* LayerNorm dx element (to be added to dx): rstd * (g - mean(g) - x_hat * mean(g * x_hat)) in double, rounded. */
KB_FN float kb_layernorm_dx_elem(float x, float gv, int has_w, float w, float mf, float rf, double mg, double mgx) {
    float xh = (x - mf) * rf;
    float g = has_w ? gv * w : gv;
    return (float)((double)rf * ((double)g - mg - (double)xh * mgx));
}

/* RMSNorm dx element: rstd * (g - x_hat * mean(g * x_hat)). */
KB_FN float kb_rmsnorm_dx_elem(float x, float gv, int has_w, float w, float rf, double mgx) {
    float xh = x * rf;
    float g = has_w ? gv * w : gv;
    return (float)((double)rf * ((double)g - (double)xh * mgx));
}

#define KB_NORM_PARAM_ROWS 128

/* Number of row ranges of N rows. */
KB_FN int kb_norm_param_ranges(int N) { return (N + KB_NORM_PARAM_ROWS - 1) / KB_NORM_PARAM_ROWS; }

/* The partial of row range r and column c: *sw = sum over rows n in [128 r, min(N, 128 (r + 1))) in order of
 * dout[n,c] * x_hat[n,c], *sb = sum of dout[n,c], in double; x_hat = (x - mean[n]) * rstd[n] in fp32 (mean NULL:
 * RMSNorm, mean 0). x, dout [N, C]; mean, rstd [N] fp32. */
KB_FN void kb_norm_param_range(kb_in dout, kb_in x, const float *mean, const float *rstd, int N, int C, int c, int r,
                               double *sw, double *sb) {
    double a = 0.0, b = 0.0;
    const int n1 = (r + 1) * KB_NORM_PARAM_ROWS < N ? (r + 1) * KB_NORM_PARAM_ROWS : N;
    for (int n = r * KB_NORM_PARAM_ROWS; n < n1; n++) {
        size_t i = (size_t)n * C + (size_t)c;
        float mf = mean ? mean[n] : 0.0f, rf = rstd[n];
        float xh = (kb_get(x, i) - mf) * rf;
        float g = kb_get(dout, i);
        a += (double)g * (double)xh;
        b += (double)g;
    }
    *sw = a;
    *sb = b;
}

/* Column c of the weight / bias gradients from the range partials pw, pb [nr, C] (range-major: pw[r * C + c]):
 * added in range order in double from 0, rounded to fp32 once: dw[c] += ..., db[c] += ... . dw.p or db.p may be
 * NULL (not wanted; pb may then be NULL too). */
KB_FN void kb_norm_param_combine(kb_out dw, kb_out db, const double *pw, const double *pb, int nr, int C, int c) {
    double sw = 0.0, sb = 0.0;
    for (int r = 0; r < nr; r++) {
        sw += pw[(size_t)r * C + (size_t)c];
        if (db.p) sb += pb[(size_t)r * C + (size_t)c];
    }
    if (dw.p) kb_acc(dw, (size_t)c, (float)sw);
    if (db.p) kb_acc(db, (size_t)c, (float)sb);
}

#endif
