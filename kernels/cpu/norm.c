/* kernels/cpu/norm.c — LayerNorm and RMSNorm over the last dim, forward and backward (fp32 in and out).
 *
 * Numerics (the choice is ours; torch's fp32 kernels accumulate in fp32 and differ from this by rounding only):
 * - Row statistics (mean, variance, mean of squares, and the two row sums of the backward) accumulate in double
 *   over 16 lanes: lane j sums elements j, j+16, j+32, ... in order, then the lanes are added in a fixed pairwise
 *   tree. The order depends only on C, the loop vectorises, and double makes the fp32 result nearly exact.
 * - mean and rstd are rounded to fp32 and saved; out and the backward use those fp32 values, so forward and
 *   backward agree on x_hat = (x - mean) * rstd bit for bit.
 * - One row per OpenMP iteration (static schedule); weight and bias gradients are reduced over rows by threads
 *   that each own a range of columns and add rows in order 0..N-1 in double. No result depends on the thread count.
 * The per-element arithmetic, the statistics from the sums and the lane tree are kernels/body/kb_norm.h's (the device
 * kernels' too); this file adds the vectorised lane loops and the CPU's column sums.
 * Reference: torch.nn.LayerNorm (biased variance, eps inside the sqrt), torch.nn.RMSNorm / diffusers RMSNorm
 * (out = (x * rstd) * w). */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/body/kb_norm.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/prof.h"

enum { LANES = KB_NORM_LANES, COL_BLOCK = 2048 };

/* below this many elements a parallel region costs more than it saves */
#define PAR(N, C) ((size_t)(N) * (size_t)(C) >= K_PAR_MIN_ELEMS)

/* Adds the 16 lanes in a fixed pairwise tree. */
static inline double lanes_sum(const double *l) { return kb_norm_combine(l); }

static double row_sum(const float *x, int C) {
    double l[LANES] = {0};
    int c = 0;
    for (; c + LANES <= C; c += LANES)
        for (int j = 0; j < LANES; j++) l[j] += (double)x[c + j];
    for (int j = 0; c + j < C; j++) l[j] += (double)x[c + j];
    return lanes_sum(l);
}

/* sum of (x - m)^2 */
static double row_sq_dev(const float *x, double m, int C) {
    double l[LANES] = {0};
    int c = 0;
    for (; c + LANES <= C; c += LANES)
        for (int j = 0; j < LANES; j++) {
            double d = (double)x[c + j] - m;
            l[j] += d * d;
        }
    for (int j = 0; c + j < C; j++) {
        double d = (double)x[c + j] - m;
        l[j] += d * d;
    }
    return lanes_sum(l);
}

/* For the backward: sum over the row of g * x_hat and of g, with g = dout * w (or dout) and
 * x_hat = (x - mean) * rstd (mean_f NULL: x * rstd), both formed in fp32 exactly as the forward and dx use them. */
static void row_grad_sums(const float *x, const float *dout, const float *w, const float *mean_f, float rf, int C,
                          double *sum_gx, double *sum_g) {
    double l1[LANES] = {0}, l2[LANES] = {0};
    float mf = mean_f ? *mean_f : 0.0f;
    for (int c0 = 0; c0 < C; c0 += LANES) {
        int nj = C - c0 < LANES ? C - c0 : LANES;
        for (int j = 0; j < nj; j++) {
            int c = c0 + j;
            float xh = mean_f ? (x[c] - mf) * rf : x[c] * rf;
            float g = w ? dout[c] * w[c] : dout[c];
            l1[j] += (double)g * (double)xh;
            l2[j] += (double)g;
        }
    }
    *sum_gx = lanes_sum(l1);
    *sum_g = lanes_sum(l2);
}

/* out = (x - mean) * rstd * w + b per row. x, out [N, C] fp32; w, b [C] or both NULL (b alone may be NULL);
 * mean, rstd [N] (written).
 * rstd = 1/sqrt(var + eps), var biased. See kernels.h; reference torch.nn.LayerNorm. */
static void layernorm_forward_run(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                             int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (PAR(N, C))
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *yr = out + (size_t)n * C;
        double m = kb_norm_mean(row_sum(xr, C), C);
        float mf = (float)m, rf = kb_norm_rstd(row_sq_dev(xr, m, C), C, eps);
        mean[n] = mf;
        rstd[n] = rf;
        for (int c = 0; c < C; c++)
            yr[c] = kb_layernorm_elem(xr[c], mf, rf, w != NULL, w ? w[c] : 0.0f, b != NULL, b ? b[c] : 0.0f);
    }
}

/* Sums over the rows, in order, for nd columns starting at c0: sw[j] += dout * x_hat, sb[j] += dout (sb may be NULL);
 * x_hat = (x - mean) * rstd, or x * rstd when mean is NULL, in fp32 as the forward forms it. */
static void col_param_sums(double *restrict sw, double *restrict sb, const float *restrict dout,
                           const float *restrict x, const float *mean, const float *rstd, int N, int C, int c0,
                           int nd) {
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C + c0, *gr = dout + (size_t)n * C + c0;
        float mf = mean ? mean[n] : 0.0f, rf = rstd[n];
        for (int j = 0; j < nd; j++) {
            float xh = (xr[j] - mf) * rf; /* mf = 0 for RMSNorm: x - 0 is exact */
            sw[j] += (double)gr[j] * (double)xh;
        }
        if (sb)
            for (int j = 0; j < nd; j++) sb[j] += (double)gr[j];
    }
}

/* Gradient of the weight and bias: dw[c] += sum_n dout[n,c] * x_hat[n,c], db[c] += sum_n dout[n,c], rows added in
 * order 0..N-1 in double. Threads own contiguous column ranges (one each, swept in sub-blocks of COL_BLOCK) so that
 * every thread reads long runs of each row; the split never changes a value. */
static void norm_param_grads(float *dw, float *db, const float *dout, const float *x, const float *mean,
                             const float *rstd, int N, int C) {
    int nt = PAR(N, C) ? omp_get_max_threads() : 1;
    int width = ((C + nt - 1) / nt + 15) / 16 * 16, nblk = (C + width - 1) / width;
#pragma omp parallel for schedule(static) if (nblk > 1)
    for (int blk = 0; blk < nblk; blk++) {
        int end = (blk + 1) * width < C ? (blk + 1) * width : C;
        for (int c0 = blk * width; c0 < end; c0 += COL_BLOCK) {
            int nd = end - c0 < COL_BLOCK ? end - c0 : COL_BLOCK;
            double sw[COL_BLOCK], sb[COL_BLOCK];
            memset(sw, 0, sizeof(double) * nd), memset(sb, 0, sizeof(double) * nd);
            col_param_sums(sw, db ? sb : NULL, dout, x, mean, rstd, N, C, c0, nd);
            for (int j = 0; j < nd; j++) {
                if (dw) dw[c0 + j] += (float)sw[j];
                if (db) db[c0 + j] += (float)sb[j];
            }
        }
    }
}

/* LayerNorm backward: with g = dout * w (or dout) and x_hat from the saved mean/rstd,
 * dx += rstd * (g - mean(g) - x_hat * mean(g * x_hat)); dw += sum_n dout * x_hat; db += sum_n dout.
 * dx [N,C]; dw, db [C] (NULL when no affine, or not wanted). */
static void layernorm_backward_run(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                              const float *mean, const float *rstd, int N, int C) {
    if (dx) {
#pragma omp parallel for schedule(static) if (PAR(N, C))
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)n * C, *gr = dout + (size_t)n * C;
            float *dr = dx + (size_t)n * C;
            float mf = mean[n], rf = rstd[n];
            double sgx, sg;
            row_grad_sums(xr, gr, w, &mf, rf, C, &sgx, &sg);
            double mgx = sgx / C, mg = sg / C;
            for (int c = 0; c < C; c++)
                dr[c] += kb_layernorm_dx_elem(xr[c], gr[c], w != NULL, w ? w[c] : 0.0f, mf, rf, mg, mgx);
        }
    }
    if (dw || db) norm_param_grads(dw, db, dout, x, mean, rstd, N, C);
}

/* RMSNorm forward: out = (x * rstd) * w, rstd = 1/sqrt(mean(x^2) + eps). x, out [N,C]; w [C] or NULL; rstd [N]
 * (written). Reference torch.nn.RMSNorm / diffusers RMSNorm. */
static void rmsnorm_forward_run(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (PAR(N, C))
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *yr = out + (size_t)n * C;
        float rf = kb_norm_rstd(row_sq_dev(xr, 0.0, C), C, eps);
        rstd[n] = rf;
        for (int c = 0; c < C; c++) yr[c] = kb_rmsnorm_elem(xr[c], rf, w != NULL, w ? w[c] : 0.0f);
    }
}

/* RMSNorm backward: g = dout * w (or dout), x_hat = x * rstd; dx += rstd * (g - x_hat * mean(g * x_hat));
 * dw += sum_n dout * x_hat. dx [N,C] (NULL: skipped); dw [C] (NULL: skipped). */
static void rmsnorm_backward_run(float *dx, float *dw, const float *dout, const float *x, const float *w,
                            const float *rstd, int N, int C) {
    if (dx) {
#pragma omp parallel for schedule(static) if (PAR(N, C))
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)n * C, *gr = dout + (size_t)n * C;
            float *dr = dx + (size_t)n * C;
            float rf = rstd[n];
            double sgx, sg;
            row_grad_sums(xr, gr, w, NULL, rf, C, &sgx, &sg);
            double mgx = sgx / C;
            for (int c = 0; c < C; c++) dr[c] += kb_rmsnorm_dx_elem(xr[c], gr[c], w != NULL, w ? w[c] : 0.0f, rf, mgx);
        }
    }
    if (dw) norm_param_grads(dw, NULL, dout, x, NULL, rstd, N, C);
}

/* ---- the op table entries: the bodies above, timed when kernels/cpu/prof.h is on ---- */

void k_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                             int N, int C, float eps) {
    K_PROF_BEGIN();
    layernorm_forward_run(out, mean, rstd, x, w, b, N, C, eps);
    K_PROF_END("layernorm_forward", (int64_t)N * C, 0);
}

void k_cpu_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                              const float *mean, const float *rstd, int N, int C) {
    K_PROF_BEGIN();
    layernorm_backward_run(dx, dw, db, dout, x, w, mean, rstd, N, C);
    K_PROF_END("layernorm_backward", (int64_t)N * C, 0);
}

void k_cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    K_PROF_BEGIN();
    rmsnorm_forward_run(out, rstd, x, w, N, C, eps);
    K_PROF_END("rmsnorm_forward", (int64_t)N * C, 0);
}

void k_cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd,
                            int N, int C) {
    K_PROF_BEGIN();
    rmsnorm_backward_run(dx, dw, dout, x, w, rstd, N, C);
    K_PROF_END("rmsnorm_backward", (int64_t)N * C, 0);
}
