/* kernels/cpu/modulate.c — AdaLN modulation (x * (1 + scale) + shift) and the gated residual (x + y * gate),
 * forward and backward, fp32.
 *
 * Reference: diffusers WanTransformerBlock: norm(x) * (1 + scale_msa) + shift_msa and
 * x + attn_output * gate_msa, in fp32 with each product and sum rounded as written.
 * Modulation rows: with per_token == 0 a row per sample, at row b (shift + b * mod_stride), broadcast over the S
 * tokens; with per_token == 1 a row per token, at row b*S + s (Wan 2.2 TI2V). mod_stride lets the rows sit inside
 * a [.., 6, D] modulation table (mod_stride = 6*D).
 * Gradients of broadcast rows are sums over s: each thread owns (sample, block of columns) and adds the tokens in
 * order 0..S-1 in double, so no value depends on the thread count. */
#include <stddef.h>

#include "kernels/cpu/cpu.h"

enum { COL_BLOCK = 64 };

/* below this many elements a parallel region costs more than it saves */
#define PAR ((size_t)B * S * D >= ((size_t)1 << 14))

static inline size_t mod_row(int b, int s, int S, int per_token, int mod_stride) {
    return (per_token ? (size_t)b * S + s : (size_t)b) * (size_t)mod_stride;
}

/* out = x * (1 + scale) + shift. x, out [B, S, D]; shift, scale rows of D floats at stride mod_stride
 * ([B, .] or [B, S, .] with per_token). out may alias x. */
void k_cpu_modulate_forward(float *out, const float *x, const float *shift, const float *scale, int B, int S, int D,
                            int per_token, int mod_stride) {
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            size_t r = ((size_t)b * S + s) * D, m = mod_row(b, s, S, per_token, mod_stride);
            const float *sh = shift + m, *sc = scale + m;
            for (int d = 0; d < D; d++) {
                float one_sc = 1.0f + sc[d];
                float y = x[r + d] * one_sc;
                out[r + d] = y + sh[d];
            }
        }
}

/* dx += dout * (1 + scale); dscale += dout * x; dshift += dout (the last two summed over s unless per_token).
 * dx, dout, x [B, S, D]; dshift, dscale, scale rows as in the forward. Any of dx, dshift, dscale may be NULL. */
void k_cpu_modulate_backward(float *dx, float *dshift, float *dscale, const float *dout, const float *x,
                             const float *scale, int B, int S, int D, int per_token, int mod_stride) {
    if (per_token) {
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
        for (int b = 0; b < B; b++)
            for (int s = 0; s < S; s++) {
                size_t r = ((size_t)b * S + s) * D, m = mod_row(b, s, S, 1, mod_stride);
                for (int d = 0; d < D; d++) {
                    float g = dout[r + d];
                    if (dx) {
                        float one_sc = 1.0f + scale[m + d];
                        dx[r + d] += g * one_sc;
                    }
                    if (dscale) dscale[m + d] += g * x[r + d];
                    if (dshift) dshift[m + d] += g;
                }
            }
        return;
    }
    int nblk = (D + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
    for (int b = 0; b < B; b++)
        for (int blk = 0; blk < nblk; blk++) {
            int d0 = blk * COL_BLOCK, d1 = d0 + COL_BLOCK < D ? d0 + COL_BLOCK : D;
            size_t m = (size_t)b * mod_stride;
            double ssc[COL_BLOCK] = {0}, ssh[COL_BLOCK] = {0};
            for (int s = 0; s < S; s++) {
                size_t r = ((size_t)b * S + s) * D;
                for (int d = d0; d < d1; d++) {
                    float g = dout[r + d];
                    if (dx) {
                        float one_sc = 1.0f + scale[m + d];
                        dx[r + d] += g * one_sc;
                    }
                    ssc[d - d0] += (double)g * (double)x[r + d];
                    ssh[d - d0] += (double)g;
                }
            }
            for (int d = d0; d < d1; d++) {
                if (dscale) dscale[m + d] += (float)ssc[d - d0];
                if (dshift) dshift[m + d] += (float)ssh[d - d0];
            }
        }
}

/* out = x + y * gate. x, y, out [B, S, D]; gate rows as for modulate. out may alias x. */
void k_cpu_gate_residual_forward(float *out, const float *x, const float *y, const float *gate, int B, int S, int D,
                                 int per_token, int mod_stride) {
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            size_t r = ((size_t)b * S + s) * D;
            const float *gt = gate + mod_row(b, s, S, per_token, mod_stride);
            for (int d = 0; d < D; d++) {
                float t = y[r + d] * gt[d];
                out[r + d] = x[r + d] + t;
            }
        }
}

/* dx += dout (skipped when dx is NULL); dy += dout * gate; dgate += dout * y (summed over s unless per_token).
 * dy, dgate may be NULL too. */
void k_cpu_gate_residual_backward(float *dx, float *dy, float *dgate, const float *dout, const float *y,
                                  const float *gate, int B, int S, int D, int per_token, int mod_stride) {
    if (per_token) {
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
        for (int b = 0; b < B; b++)
            for (int s = 0; s < S; s++) {
                size_t r = ((size_t)b * S + s) * D, m = mod_row(b, s, S, 1, mod_stride);
                for (int d = 0; d < D; d++) {
                    float g = dout[r + d];
                    if (dx) dx[r + d] += g;
                    if (dy) dy[r + d] += g * gate[m + d];
                    if (dgate) dgate[m + d] += g * y[r + d];
                }
            }
        return;
    }
    int nblk = (D + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for collapse(2) schedule(static) if (PAR)
    for (int b = 0; b < B; b++)
        for (int blk = 0; blk < nblk; blk++) {
            int d0 = blk * COL_BLOCK, d1 = d0 + COL_BLOCK < D ? d0 + COL_BLOCK : D;
            size_t m = (size_t)b * mod_stride;
            double sg[COL_BLOCK] = {0};
            for (int s = 0; s < S; s++) {
                size_t r = ((size_t)b * S + s) * D;
                for (int d = d0; d < d1; d++) {
                    float g = dout[r + d];
                    if (dx) dx[r + d] += g;
                    if (dy) dy[r + d] += g * gate[m + d];
                    sg[d - d0] += (double)g * (double)y[r + d];
                }
            }
            if (dgate)
                for (int d = d0; d < d1; d++) dgate[m + d] += (float)sg[d - d0];
        }
}
