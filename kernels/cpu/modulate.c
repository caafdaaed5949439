/* kernels/cpu/modulate.c — AdaLN modulation (x * (1 + scale) + shift) and the gated residual (x + y * gate),
 * forward and backward, fp32.
 *
 * Reference: diffusers WanTransformerBlock: norm(x) * (1 + scale_msa) + shift_msa and
 * x + attn_output * gate_msa, in fp32 with each product and sum rounded as written.
 * Modulation rows: with per_token == 0 a row per sample, at row b (shift + b * mod_stride), broadcast over the S
 * tokens; with per_token == 1 a row per token, at row b*S + s (Wan 2.2 TI2V). mod_stride lets the rows sit inside
 * a [.., 6, D] modulation table (mod_stride = 6*D).
 * Gradients of broadcast rows are sums over s: each thread owns (sample, range of columns) and adds the tokens in
 * order 0..S-1 in double, so no value depends on the thread count. The per-element arithmetic and the modulation
 * row offsets are kernels/body/kb_modulate.h's (the device kernels' too); this file adds the loops and the CPU's
 * column sums. */
#include <omp.h>
#include <stddef.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/body/kb_modulate.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/prof.h"

/* Column sums (gradients of broadcast rows) run over the rows in order; threads split the columns into contiguous
 * ranges (one per thread) so that each reads long runs of every row, and a range is swept in sub-blocks of at most
 * COL_BLOCK columns (its double accumulators live on the stack). The split never changes a value. */
enum { COL_BLOCK = 2048 };

/* below this many elements a parallel region costs more than it saves */
#define PAR ((size_t)B * S * D >= K_PAR_MIN_ELEMS)

/* out = x * (1 + scale) + shift. x, out [B, S, D]; shift, scale rows of D floats at stride mod_stride
 * ([B, .] or [B, S, .] with per_token). out may alias x. */
static void modulate_forward_run(float *out, const float *x, const float *shift, const float *scale, int B, int S, int D,
                            int per_token, int mod_stride) {
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            size_t r = ((size_t)b * S + s) * D, m = kb_mod_row(b, s, S, per_token, mod_stride);
            const float *sh = shift + m, *sc = scale + m;
            for (int d = 0; d < D; d++) out[r + d] = kb_modulate_elem(x[r + d], sh[d], sc[d]);
        }
}

/* Row helpers (restrict: gradients never overlap dout or the inputs). */
static void row_axpy1(float *restrict dx, const float *restrict g, const float *restrict sc, int D) {
    for (int d = 0; d < D; d++) dx[d] += kb_modulate_dx_elem(g[d], sc[d]); /* dx += g * (1 + sc) */
}
static void row_add(float *restrict dx, const float *restrict g, int D) {
    for (int d = 0; d < D; d++) dx[d] += g[d];
}
static void row_mul_add(float *restrict dy, const float *restrict g, const float *restrict gt, int D) {
    for (int d = 0; d < D; d++) dy[d] += g[d] * gt[d];
}

/* Column sums over the S rows (stride D) of one sample, rows in order 0..S-1, in double, for nd columns:
 * sgx[j] += sum_s g[s,j] * x[s,j] (sgx may be NULL), sg[j] += sum_s g[s,j] (sg may be NULL). */
static void col_sums(double *restrict sgx, double *restrict sg, const float *restrict g, const float *restrict x,
                     int S, int D, int nd) {
    for (int s = 0; s < S; s++) {
        const float *gr = g + (size_t)s * D, *xr = x + (size_t)s * D;
        if (sgx)
            for (int j = 0; j < nd; j++) sgx[j] += (double)gr[j] * (double)xr[j];
        if (sg)
            for (int j = 0; j < nd; j++) sg[j] += (double)gr[j];
    }
}

/* Width of each thread's column range for B samples of D columns (a multiple of 16 floats). */
static int col_range_width(int B, int D, int par) {
    int nt = par ? omp_get_max_threads() : 1;
    int per_sample = (nt + B - 1) / B;
    int w = (D + per_sample - 1) / per_sample;
    return (w + 15) / 16 * 16;
}

/* dx += dout * (1 + scale); dscale += dout * x; dshift += dout (the last two summed over s unless per_token).
 * dx, dout, x [B, S, D]; dshift, dscale, scale rows as in the forward. Any of dx, dshift, dscale may be NULL;
 * gradients must not overlap dout, x or scale. */
static void modulate_backward_run(float *dx, float *dshift, float *dscale, const float *dout, const float *x,
                             const float *scale, int B, int S, int D, int per_token, int mod_stride) {
    if (dx) {
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
        for (int b = 0; b < B; b++)
            for (int s = 0; s < S; s++) {
                size_t r = ((size_t)b * S + s) * D;
                row_axpy1(dx + r, dout + r, scale + kb_mod_row(b, s, S, per_token, mod_stride), D);
            }
    }
    if (per_token) { /* one modulation row per token: elementwise */
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
        for (int b = 0; b < B; b++)
            for (int s = 0; s < S; s++) {
                size_t r = ((size_t)b * S + s) * D, m = kb_mod_row(b, s, S, 1, mod_stride);
                if (dscale) row_mul_add(dscale + m, dout + r, x + r, D);
                if (dshift) row_add(dshift + m, dout + r, D);
            }
        return;
    }
    if (!dscale && !dshift) return;
    int width = col_range_width(B, D, PAR), nblk = (D + width - 1) / width;
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
    for (int b = 0; b < B; b++)
        for (int blk = 0; blk < nblk; blk++) {
            int end = (blk + 1) * width < D ? (blk + 1) * width : D;
            for (int d0 = blk * width; d0 < end; d0 += COL_BLOCK) {
                int nd = end - d0 < COL_BLOCK ? end - d0 : COL_BLOCK;
                size_t r = (size_t)b * S * D + d0, m = (size_t)b * mod_stride + d0;
                double ssc[COL_BLOCK], ssh[COL_BLOCK];
                memset(ssc, 0, sizeof(double) * nd), memset(ssh, 0, sizeof(double) * nd);
                col_sums(dscale ? ssc : NULL, dshift ? ssh : NULL, dout + r, x + r, S, D, nd);
                for (int j = 0; j < nd; j++) {
                    if (dscale) dscale[m + j] += (float)ssc[j];
                    if (dshift) dshift[m + j] += (float)ssh[j];
                }
            }
        }
}

/* out = x + y * gate. x, y, out [B, S, D]; gate rows as for modulate. out may alias x. */
static void gate_residual_forward_run(float *out, const float *x, const float *y, const float *gate, int B, int S, int D,
                                 int per_token, int mod_stride) {
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            size_t r = ((size_t)b * S + s) * D;
            const float *gt = gate + kb_mod_row(b, s, S, per_token, mod_stride);
            for (int d = 0; d < D; d++) out[r + d] = kb_gate_residual_elem(x[r + d], y[r + d], gt[d]);
        }
}

/* dx += dout (skipped when dx is NULL); dy += dout * gate; dgate += dout * y (summed over s unless per_token).
 * dy, dgate may be NULL too; gradients must not overlap dout, y or gate. */
static void gate_residual_backward_run(float *dx, float *dy, float *dgate, const float *dout, const float *y,
                                  const float *gate, int B, int S, int D, int per_token, int mod_stride) {
    if (dx || dy || (per_token && dgate)) {
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
        for (int b = 0; b < B; b++)
            for (int s = 0; s < S; s++) {
                size_t r = ((size_t)b * S + s) * D, m = kb_mod_row(b, s, S, per_token, mod_stride);
                if (dx) row_add(dx + r, dout + r, D);
                if (dy) row_mul_add(dy + r, dout + r, gate + m, D);
                if (per_token && dgate) row_mul_add(dgate + m, dout + r, y + r, D);
            }
    }
    if (per_token || !dgate) return;
    int width = col_range_width(B, D, PAR), nblk = (D + width - 1) / width;
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
    for (int b = 0; b < B; b++)
        for (int blk = 0; blk < nblk; blk++) {
            int end = (blk + 1) * width < D ? (blk + 1) * width : D;
            for (int d0 = blk * width; d0 < end; d0 += COL_BLOCK) {
                int nd = end - d0 < COL_BLOCK ? end - d0 : COL_BLOCK;
                size_t r = (size_t)b * S * D + d0, m = (size_t)b * mod_stride + d0;
                double sg[COL_BLOCK];
                memset(sg, 0, sizeof(double) * nd);
                col_sums(sg, NULL, dout + r, y + r, S, D, nd);
                for (int j = 0; j < nd; j++) dgate[m + j] += (float)sg[j];
            }
        }
}

/* ---- the op table entries: the bodies above, timed when kernels/cpu/prof.h is on ---- */

void k_cpu_modulate_forward(float *out, const float *x, const float *shift, const float *scale, int B, int S, int D,
                            int per_token, int mod_stride) {
    K_PROF_BEGIN();
    modulate_forward_run(out, x, shift, scale, B, S, D, per_token, mod_stride);
    K_PROF_END("modulate_forward", (int64_t)B * S * D, 0);
}

void k_cpu_modulate_backward(float *dx, float *dshift, float *dscale, const float *dout, const float *x,
                             const float *scale, int B, int S, int D, int per_token, int mod_stride) {
    K_PROF_BEGIN();
    modulate_backward_run(dx, dshift, dscale, dout, x, scale, B, S, D, per_token, mod_stride);
    K_PROF_END("modulate_backward", (int64_t)B * S * D, 0);
}

void k_cpu_gate_residual_forward(float *out, const float *x, const float *y, const float *gate, int B, int S, int D,
                                 int per_token, int mod_stride) {
    K_PROF_BEGIN();
    gate_residual_forward_run(out, x, y, gate, B, S, D, per_token, mod_stride);
    K_PROF_END("gate_residual_forward", (int64_t)B * S * D, 0);
}

void k_cpu_gate_residual_backward(float *dx, float *dy, float *dgate, const float *dout, const float *y,
                                  const float *gate, int B, int S, int D, int per_token, int mod_stride) {
    K_PROF_BEGIN();
    gate_residual_backward_run(dx, dy, dgate, dout, y, gate, B, S, D, per_token, mod_stride);
    K_PROF_END("gate_residual_backward", (int64_t)B * S * D, 0);
}
