/* kernels/cpu/rope.c — rotary position embedding on interleaved pairs (forward, backward) and the Wan 3-D RoPE
 * table builder k_wan_rope_table.
 *
 * Reference: diffusers WanAttnProcessor.apply_rotary_emb (pairs (2j, 2j+1) rotated by angle theta_sj:
 * out = (x1*cos - x2*sin, x1*sin + x2*cos), each product rounded before the add, as torch does in fp32) and
 * diffusers WanRotaryPosEmbed / get_1d_rotary_pos_embed (freqs and angles in float64, cos/sin cast to float32).
 * The pair arithmetic is kernels/body/kb_rope.h's (the device kernels' too); this file adds the loops. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "core/error.h"
#include "kernels/body/kb_rope.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/prof.h"

/* out[b,s,h,2j]   = x[2j]*cos[s,j] - x[2j+1]*sin[s,j]
 * out[b,s,h,2j+1] = x[2j]*sin[s,j] + x[2j+1]*cos[s,j]
 * x, out [B, S, H, Dh] fp32 (out == x allowed); cos, sin [S, Dh/2]. Dh even. */
static void rope_forward_run(float *out, const float *x, const float *cos, const float *sin, int B, int S, int H,
                        int Dh) {
    int half = Dh / 2;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * S * H * Dh >= K_PAR_MIN_ELEMS)
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            const float *cr = cos + (size_t)s * half, *sr = sin + (size_t)s * half;
            for (int h = 0; h < H; h++) {
                size_t off = (((size_t)b * S + s) * H + h) * Dh;
                const float *xr = x + off;
                float *yr = out + off;
                for (int j = 0; j < half; j++) {
                    float y1, y2;
                    kb_rope_fwd_pair(xr[2 * j], xr[2 * j + 1], cr[j], sr[j], &y1, &y2);
                    yr[2 * j] = y1;
                    yr[2 * j + 1] = y2;
                }
            }
        }
}

/* The transpose of the rotation (rotation by -theta), accumulated:
 * dx[2j] += dout[2j]*cos + dout[2j+1]*sin;  dx[2j+1] += dout[2j+1]*cos - dout[2j]*sin.
 * dx, dout [B, S, H, Dh]; cos, sin [S, Dh/2]. */
static void rope_backward_run(float *dx, const float *dout, const float *cos, const float *sin, int B, int S, int H,
                         int Dh) {
    int half = Dh / 2;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * S * H * Dh >= K_PAR_MIN_ELEMS)
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            const float *cr = cos + (size_t)s * half, *sr = sin + (size_t)s * half;
            for (int h = 0; h < H; h++) {
                size_t off = (((size_t)b * S + s) * H + h) * Dh;
                const float *gr = dout + off;
                float *dr = dx + off;
                for (int j = 0; j < half; j++) {
                    float d1, d2;
                    kb_rope_bwd_pair(gr[2 * j], gr[2 * j + 1], cr[j], sr[j], &d1, &d2);
                    dr[2 * j] += d1;
                    dr[2 * j + 1] += d2;
                }
            }
        }
}

/* Wan 3-D RoPE tables; contract in kernels/kernels.h. For part dim in (t_dim, h_dim, w_dim), pair i < dim/2 of
 * the part has freq = 1 / theta^((2i)/dim) and angle = pos * freq, all in double (as diffusers with
 * freqs_dtype float64), then cos/sin cast to fp32. pos is the token's frame index f for the t part, row h for the
 * h part, column w for the w part. cos, sin [F*Hp*Wp, Dh/2]. Errors (-1): Dh odd or < 6, a grid size < 1 or
 * > max_seq_len (diffusers' table has max_seq_len positions), theta <= 0. */
int k_wan_rope_table(float *cos_out, float *sin_out, int F, int Hp, int Wp, int Dh, double theta, int max_seq_len) {
    if (Dh < 6 || Dh % 2)
        return core_error("k_wan_rope_table: attention head dim %d must be even and >= 6", Dh);
    if (F < 1 || Hp < 1 || Wp < 1)
        return core_error("k_wan_rope_table: latent grid %dx%dx%d (frames x height x width patches) must be >= 1", F,
                          Hp, Wp);
    if (F > max_seq_len || Hp > max_seq_len || Wp > max_seq_len)
        return core_error("k_wan_rope_table: latent grid %dx%dx%d exceeds rope max_seq_len %d", F, Hp, Wp,
                          max_seq_len);
    if (!(theta > 0.0)) return core_error("k_wan_rope_table: rope theta %g must be > 0", theta);
    int h_dim = 2 * (Dh / 6), w_dim = h_dim, t_dim = Dh - h_dim - w_dim;
    int half = Dh / 2;
    int dims[3] = {t_dim, h_dim, w_dim}, lens[3] = {F, Hp, Wp}, first[3] = {0, t_dim / 2, t_dim / 2 + h_dim / 2};
    /* One [len, dim/2] cos/sin table per part, then each token row gathers its three parts. */
    float *part[3][2] = {{NULL, NULL}, {NULL, NULL}, {NULL, NULL}};
    int rc = 0;
    for (int p = 0; p < 3 && rc == 0; p++) {
        int np = dims[p] / 2;
        part[p][0] = malloc(((size_t)lens[p] * np + 1) * sizeof(float));
        part[p][1] = malloc(((size_t)lens[p] * np + 1) * sizeof(float));
        if (!part[p][0] || !part[p][1]) {
            rc = core_error("k_wan_rope_table: out of memory");
            break;
        }
        for (int i = 0; i < np; i++) {
            double freq = 1.0 / pow(theta, (double)(2 * i) / (double)dims[p]);
            for (int pos = 0; pos < lens[p]; pos++) {
                double ang = (double)pos * freq;
                part[p][0][(size_t)pos * np + i] = (float)cos(ang);
                part[p][1][(size_t)pos * np + i] = (float)sin(ang);
            }
        }
    }
    for (int f = 0; rc == 0 && f < F; f++)
        for (int h = 0; h < Hp; h++)
            for (int w = 0; w < Wp; w++) {
                size_t row = (((size_t)f * Hp + h) * Wp + w) * half;
                int pos[3] = {f, h, w};
                for (int p = 0; p < 3; p++) {
                    int np = dims[p] / 2;
                    for (int i = 0; i < np; i++) {
                        cos_out[row + first[p] + i] = part[p][0][(size_t)pos[p] * np + i];
                        sin_out[row + first[p] + i] = part[p][1][(size_t)pos[p] * np + i];
                    }
                }
            }
    for (int p = 0; p < 3; p++) free(part[p][0]), free(part[p][1]);
    return rc;
}

/* ---- the op table entries: the bodies above, timed when kernels/cpu/prof.h is on ---- */

void k_cpu_rope_forward(float *out, const float *x, const float *cos, const float *sin, int B, int S, int H, int Dh) {
    K_PROF_BEGIN();
    rope_forward_run(out, x, cos, sin, B, S, H, Dh);
    K_PROF_END("rope_forward", (int64_t)B * S * H * Dh, 0);
}

void k_cpu_rope_backward(float *dx, const float *dout, const float *cos, const float *sin, int B, int S, int H,
                         int Dh) {
    K_PROF_BEGIN();
    rope_backward_run(dx, dout, cos, sin, B, S, H, Dh);
    K_PROF_END("rope_backward", (int64_t)B * S * H * Dh, 0);
}
