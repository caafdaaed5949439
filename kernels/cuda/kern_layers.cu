/* kernels/cuda/kern_layers.cu — the DiT layer kernels of the CUDA backend: LayerNorm, RMSNorm, RoPE, GELU-tanh, SiLU,
 * AdaLN modulation and gated residual, patchify/unpatchify, LSE merge, the modulation table plus embedding rows;
 * forward and backward. Each kernel launches a body of kernels/body/ per work item, in the decomposition
 * kernels/body/kb_host.h runs on the CPU in `make test`:
 *   norm rows   16 lanes per row (16 rows per block of 256 threads); a lane computes its partial sums with the body,
 *               the 16 partials meet in shared memory and every lane adds them with the same fixed tree;
 *   columns     norm weight/bias gradients and broadcast modulation gradients: one thread per (128-row range,
 *               column), then one per column adding the ranges in order (kb_norm.h, kb_modulate.h);
 *   elements    one thread per element, pair (RoPE), output element (patch maps) or query row (LSE merge).
 * Compiled with -fmad=false so fp32 products and sums round as on the CPU; see kernels/cuda/README.md for what has
 * run where (nothing of this file has run on a GPU yet). */
#include "kernels/body/kb_act.h"
#include "kernels/body/kb_index.h"
#include "kernels/body/kb_lse.h"
#include "kernels/body/kb_modulate.h"
#include "kernels/body/kb_norm.h"
#include "kernels/body/kb_patch.h"
#include "kernels/body/kb_rope.h"
#include "kernels/cuda/kern_common.cuh"
#include "kernels/cuda/precond/kc_precond.h"

#define ROWS_PER_BLOCK (KC_THREADS / KB_NORM_LANES)

static unsigned row_blocks(int N) {
    size_t b = ((size_t)N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, cap = (size_t)(kc_sm_count > 0 ? kc_sm_count : 132) * 16;
    if (b > cap) b = cap;
    return b < 1 ? 1u : (unsigned)b;
}

/* The index maps of this file run in 32 bits (kernels/body/kb_index.h): tensors of fewer than 2^31 elements
 * (kc_precond_index32, which the emulated device checks too). */
#define too_big kc_precond_index32

static int bad_row_args(const char *op, int N, int C) {
    if (N < 0 || C < 1) return core_error("%s: N = %d rows of C = %d must be >= 0 and >= 1", op, N, C);
    return 0;
}

/* ---- LayerNorm / RMSNorm forward: rms 0 LayerNorm (mean, rstd), 1 RMSNorm (rstd) ---- */

__global__ void norm_forward_kernel(int rms, kb_out out, float *mean, float *rstd, kb_in x, kb_in w, kb_in b, int N,
                                    int C, float eps) {
    __shared__ double part[ROWS_PER_BLOCK][KB_NORM_LANES];
    const int lane = threadIdx.x % KB_NORM_LANES, r = threadIdx.x / KB_NORM_LANES;
    for (int64_t n0 = (int64_t)blockIdx.x * ROWS_PER_BLOCK; n0 < N; n0 += (int64_t)gridDim.x * ROWS_PER_BLOCK) {
        const int64_t n = n0 + r;
        const bool live = n < N;
        const size_t row = live ? (size_t)n * C : 0;
        double m = 0.0;
        if (!rms) {
            part[r][lane] = live ? kb_norm_lane_sum(x, row, C, lane) : 0.0;
            __syncthreads();
            m = kb_norm_mean(kb_norm_combine(part[r]), C);
            __syncthreads();
        }
        part[r][lane] = live ? kb_norm_lane_sq_dev(x, row, C, lane, m) : 0.0;
        __syncthreads();
        if (live) {
            const float mf = (float)m, rf = kb_norm_rstd(kb_norm_combine(part[r]), C, eps);
            if (lane == 0) {
                if (!rms) mean[n] = mf;
                rstd[n] = rf;
            }
            for (int c = lane; c < C; c += KB_NORM_LANES) {
                const float xv = kb_get(x, row + c), wv = w.p ? kb_get(w, (size_t)c) : 0.0f;
                float y;
                if (rms)
                    y = kb_rmsnorm_elem(xv, rf, w.p != NULL, wv);
                else
                    y = kb_layernorm_elem(xv, mf, rf, w.p != NULL, wv, b.p != NULL, b.p ? kb_get(b, (size_t)c) : 0.0f);
                kb_set(out, row + c, y);
            }
        }
        __syncthreads();
    }
}

__global__ void norm_dx_kernel(int rms, kb_out dx, kb_in dout, kb_in x, kb_in w, const float *mean, const float *rstd,
                               int N, int C) {
    __shared__ double pgx[ROWS_PER_BLOCK][KB_NORM_LANES], pg[ROWS_PER_BLOCK][KB_NORM_LANES];
    const int lane = threadIdx.x % KB_NORM_LANES, r = threadIdx.x / KB_NORM_LANES;
    for (int64_t n0 = (int64_t)blockIdx.x * ROWS_PER_BLOCK; n0 < N; n0 += (int64_t)gridDim.x * ROWS_PER_BLOCK) {
        const int64_t n = n0 + r;
        const bool live = n < N;
        const size_t row = live ? (size_t)n * C : 0;
        const float mf = live && !rms ? mean[n] : 0.0f, rf = live ? rstd[n] : 0.0f;
        double a = 0.0, c2 = 0.0;
        if (live) kb_norm_lane_grad_sums(x, dout, w, row, C, lane, !rms, mf, rf, &a, &c2);
        pgx[r][lane] = a;
        pg[r][lane] = c2;
        __syncthreads();
        if (live) {
            const double mgx = kb_norm_combine(pgx[r]) / C, mg = kb_norm_combine(pg[r]) / C;
            for (int c = lane; c < C; c += KB_NORM_LANES) {
                const float xv = kb_get(x, row + c), gv = kb_get(dout, row + c);
                const float wv = w.p ? kb_get(w, (size_t)c) : 0.0f;
                const float d = rms ? kb_rmsnorm_dx_elem(xv, gv, w.p != NULL, wv, rf, mgx)
                                    : kb_layernorm_dx_elem(xv, gv, w.p != NULL, wv, mf, rf, mg, mgx);
                kb_acc(dx, row + c, d);
            }
        }
        __syncthreads();
    }
}

/* Weight / bias gradients in two launches (kb_norm.h): the (range, column) partials, item i = r * C + c (adjacent
 * threads: adjacent columns of the same rows, coalesced), then one thread per column adds its ranges in order. */
__global__ void norm_param_range_kernel(double *pw, double *pb, kb_in dout, kb_in x, const float *mean,
                                        const float *rstd, int N, int C, int nr) {
    KC_FOR(i, (size_t)nr * C) { /* items < 2^31 (checked at the launch): 32-bit index math */
        const unsigned r = (unsigned)i / (unsigned)C, c = (unsigned)i - r * (unsigned)C;
        kb_norm_param_range(dout, x, mean, rstd, N, C, (int)c, (int)r, &pw[i], &pb[i]);
    }
}

__global__ void norm_param_combine_kernel(kb_out dw, kb_out db, const double *pw, const double *pb, int nr, int C) {
    KC_FOR(c, C) kb_norm_param_combine(dw, db, pw, pb, nr, C, (int)c);
}

extern "C" int kc_layernorm_forward(kb_out out, float *mean, float *rstd, kb_in x, kb_in w, kb_in b, int N, int C,
                                    float eps) {
    if (bad_row_args("layernorm_forward", N, C)) return -1;
    if (N == 0) return 0;
    norm_forward_kernel<<<row_blocks(N), KC_THREADS, 0, kc_stream>>>(0, out, mean, rstd, x, w, b, N, C, eps);
    return kc_launched("layernorm_forward");
}

extern "C" int kc_rmsnorm_forward(kb_out out, float *rstd, kb_in x, kb_in w, int N, int C, float eps) {
    if (bad_row_args("rmsnorm_forward", N, C)) return -1;
    if (N == 0) return 0;
    kb_in nb = {NULL, KB_F32};
    norm_forward_kernel<<<row_blocks(N), KC_THREADS, 0, kc_stream>>>(1, out, NULL, rstd, x, w, nb, N, C, eps);
    return kc_launched("rmsnorm_forward");
}

static int norm_backward(int rms, kb_out dx, kb_out dw, kb_out db, kb_in dout, kb_in x, kb_in w, const float *mean,
                         const float *rstd, int N, int C) {
    const char *op = rms ? "rmsnorm_backward" : "layernorm_backward";
    if (bad_row_args(op, N, C)) return -1;
    if (N == 0) return 0;
    if (dx.p) {
        norm_dx_kernel<<<row_blocks(N), KC_THREADS, 0, kc_stream>>>(rms, dx, dout, x, w, mean, rstd, N, C);
        if (kc_launched(op)) return -1;
    }
    if (dw.p || db.p) {
        const int nr = kb_norm_param_ranges(N);
        const size_t items = (size_t)nr * C;
        if (items > (size_t)INT32_MAX)
            return core_error("%s: %d row ranges x C = %d columns exceed 2^31 work items", op, nr, C);
        double *pw = (double *)kc_scratch(KC_SLOT_REDUCE, 2 * items * sizeof(double));
        if (!pw) return -1;
        norm_param_range_kernel<<<kc_blocks(items), KC_THREADS, 0, kc_stream>>>(pw, pw + items, dout, x,
                                                                               rms ? NULL : mean, rstd, N, C, nr);
        if (kc_launched(op)) return -1;
        norm_param_combine_kernel<<<kc_blocks((size_t)C), KC_THREADS, 0, kc_stream>>>(dw, db, pw, pw + items, nr, C);
        if (kc_launched(op)) return -1;
    }
    return 0;
}

extern "C" int kc_layernorm_backward(kb_out dx, kb_out dw, kb_out db, kb_in dout, kb_in x, kb_in w, const float *mean,
                                     const float *rstd, int N, int C) {
    return norm_backward(0, dx, dw, db, dout, x, w, mean, rstd, N, C);
}

extern "C" int kc_rmsnorm_backward(kb_out dx, kb_out dw, kb_in dout, kb_in x, kb_in w, const float *rstd, int N,
                                   int C) {
    kb_out nb = {NULL, KB_F32};
    return norm_backward(1, dx, dw, nb, dout, x, w, NULL, rstd, N, C);
}

/* ---- RoPE ---- */

__global__ void rope_kernel(int backward, kb_out out, kb_in x, const float *cos, const float *sin, kb_rope_div v,
                            size_t pairs) {
    KC_FOR(p, pairs) {
        const size_t t = kb_rope_table_index32((uint32_t)p, &v);
        const float a = kb_get(x, 2 * p), b = kb_get(x, 2 * p + 1);
        float y1, y2;
        if (backward) {
            kb_rope_bwd_pair(a, b, cos[t], sin[t], &y1, &y2);
            kb_acc(out, 2 * p, y1);
            kb_acc(out, 2 * p + 1, y2);
        } else {
            kb_rope_fwd_pair(a, b, cos[t], sin[t], &y1, &y2);
            kb_set(out, 2 * p, y1);
            kb_set(out, 2 * p + 1, y2);
        }
    }
}

static int rope(int backward, kb_out out, kb_in x, const float *cos, const float *sin, int B, int S, int H, int Dh) {
    const char *op = backward ? "rope_backward" : "rope_forward";
    if (B < 0 || S < 0 || H < 1 || Dh < 2 || Dh % 2)
        return core_error("%s: B %d, S %d, H %d, Dh %d (Dh must be even)", op, B, S, H, Dh);
    const size_t pairs = (size_t)B * S * H * (Dh / 2);
    if (!pairs) return 0;
    if (too_big(op, 2 * pairs)) return -1;
    rope_kernel<<<kc_blocks(pairs), KC_THREADS, 0, kc_stream>>>(backward, out, x, cos, sin,
                                                                kb_rope_div_make(S, H, Dh / 2), pairs);
    return kc_launched(op);
}

extern "C" int kc_rope_forward(kb_out out, kb_in x, const float *cos, const float *sin, int B, int S, int H, int Dh) {
    return rope(0, out, x, cos, sin, B, S, H, Dh);
}
extern "C" int kc_rope_backward(kb_out dx, kb_in dout, const float *cos, const float *sin, int B, int S, int H,
                                int Dh) {
    return rope(1, dx, dout, cos, sin, B, S, H, Dh);
}

/* ---- GELU-tanh, SiLU ---- */

__global__ void act_forward_kernel(int gelu, kb_out out, kb_in x, int64_t n) {
    KC_FOR(i, n) {
        const float v = kb_get(x, i);
        kb_set(out, i, gelu ? kb_gelu_fwd(v) : kb_silu_fwd(v));
    }
}

__global__ void act_backward_kernel(int gelu, kb_out dx, kb_in dout, kb_in x, int64_t n) {
    KC_FOR(i, n) {
        const float v = kb_get(x, i), g = kb_get(dout, i);
        kb_acc(dx, i, gelu ? kb_gelu_bwd(g, v) : kb_silu_bwd(g, v));
    }
}

static int act(int gelu, int backward, kb_out y, kb_in dout, kb_in x, int64_t n) {
    const char *op = gelu ? (backward ? "gelu_backward" : "gelu_forward") : (backward ? "silu_backward" : "silu_forward");
    if (n < 0) return core_error("%s: n = %lld must be >= 0", op, (long long)n);
    if (!n) return 0;
    if (backward)
        act_backward_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(gelu, y, dout, x, n);
    else
        act_forward_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(gelu, y, x, n);
    return kc_launched(op);
}

extern "C" int kc_gelu_forward(kb_out out, kb_in x, int64_t n) { return act(1, 0, out, x, x, n); }
extern "C" int kc_gelu_backward(kb_out dx, kb_in dout, kb_in x, int64_t n) { return act(1, 1, dx, dout, x, n); }
extern "C" int kc_silu_forward(kb_out out, kb_in x, int64_t n) { return act(0, 0, out, x, x, n); }
extern "C" int kc_silu_backward(kb_out dx, kb_in dout, kb_in x, int64_t n) { return act(0, 1, dx, dout, x, n); }

/* ---- AdaLN modulation, gated residual ---- */

/* Element i of [B, S, D] -> (b, s, d), in 32 bits (i < 2^31; divisors fS = S, fD = D prepared at the launch). */
__device__ static inline void bsd_of(size_t i, kb_fdiv fS, kb_fdiv fD, int *b, int *s, int *d) {
    uint32_t dd, ss;
    const uint32_t t = kb_fdiv_qr((uint32_t)i, fD, &dd);
    *b = (int)kb_fdiv_qr(t, fS, &ss);
    *s = (int)ss, *d = (int)dd;
}

/* kind 0: modulate x*(1+scale)+shift (a = shift, c = scale); kind 1: gated residual x + y*gate (a = y, c = gate). */
__global__ void mod_forward_kernel(int kind, kb_out out, kb_in x, kb_in a, kb_in c, int S, kb_fdiv fS, kb_fdiv fD,
                                   int per_token, int mod_stride, size_t n) {
    KC_FOR(i, n) {
        int b, s, d;
        bsd_of(i, fS, fD, &b, &s, &d);
        const size_t m = kb_mod_row(b, s, S, per_token, mod_stride) + (size_t)d;
        const float xv = kb_get(x, i);
        kb_set(out, i, kind ? kb_gate_residual_elem(xv, kb_get(a, i), kb_get(c, m))
                            : kb_modulate_elem(xv, kb_get(a, m), kb_get(c, m)));
    }
}

/* Elementwise part of the backward. kind 0 (modulate): dx += g (1 + scale); per token: dscale += g x, dshift += g.
 * kind 1 (gate): dx += g; dy += g gate; per token: dgate += g y. For kind 1, "x" is y and "scale" is gate; d1 is dy,
 * d2 dgate (d3 unused); for kind 0, d2 is dscale, d3 dshift. */
__global__ void mod_backward_elem_kernel(int kind, kb_out dx, kb_out d1, kb_out d2, kb_out d3, kb_in dout, kb_in x,
                                         kb_in sc, int S, kb_fdiv fS, kb_fdiv fD, int per_token, int mod_stride,
                                         size_t n) {
    KC_FOR(i, n) {
        int b, s, d;
        bsd_of(i, fS, fD, &b, &s, &d);
        const size_t m = kb_mod_row(b, s, S, per_token, mod_stride) + (size_t)d;
        const float g = kb_get(dout, i);
        if (kind == 0) {
            if (dx.p) kb_acc(dx, i, kb_modulate_dx_elem(g, kb_get(sc, m)));
            if (per_token && d2.p) kb_acc(d2, m, g * kb_get(x, i));
            if (per_token && d3.p) kb_acc(d3, m, g);
        } else {
            if (dx.p) kb_acc(dx, i, g);
            if (d1.p) kb_acc(d1, i, g * kb_get(sc, m));
            if (per_token && d2.p) kb_acc(d2, m, g * kb_get(x, i));
        }
    }
}

/* Broadcast rows (kb_modulate.h's range reduction): the (sample, range, column) partials, item i = (b nr + r) D + d
 * (adjacent threads: adjacent columns, coalesced), then one thread per (sample, column) adding its ranges in order:
 * dgx[b, d] += sum g x (p may be NULL), dg[b, d] += sum g (p may be NULL). Items < 2^31 (checked at the launch). */
__global__ void mod_col_range_kernel(double *pa, double *pc, int want_gx, int want_g, kb_in dout, kb_in x, int S,
                                     int D, kb_fdiv fD, kb_fdiv fnr, size_t items) {
    KC_FOR(i, items) {
        uint32_t d, r;
        const uint32_t b = kb_fdiv_qr(kb_fdiv_qr((uint32_t)i, fD, &d), fnr, &r);
        kb_mod_col_range(dout, x, (size_t)b * S * D, S, D, (int)d, (int)r, want_gx ? &pa[i] : NULL,
                         want_g ? &pc[i] : NULL);
    }
}

__global__ void mod_col_combine_kernel(kb_out dgx, kb_out dg, const double *pa, const double *pc, int nr, int D,
                                       kb_fdiv fD, int mod_stride, size_t n) {
    KC_FOR(j, n) {
        uint32_t d;
        const uint32_t b = kb_fdiv_qr((uint32_t)j, fD, &d);
        const size_t off = (size_t)b * nr * D;
        double sgx = 0.0, sg = 0.0;
        kb_mod_col_combine(pa + off, pc + off, nr, D, (int)d, dgx.p ? &sgx : NULL, dg.p ? &sg : NULL);
        const size_t m = (size_t)b * mod_stride + d;
        if (dgx.p) kb_acc(dgx, m, (float)sgx);
        if (dg.p) kb_acc(dg, m, (float)sg);
    }
}

static int mod_cols(const char *op, kb_out dgx, kb_out dg, kb_in dout, kb_in x, int B, int S, int D, int mod_stride) {
    const int nr = kb_mod_col_ranges(S);
    const size_t items = (size_t)B * nr * D;
    if (!items) return 0;
    if (too_big(op, items)) return -1;
    double *pa = (double *)kc_scratch(KC_SLOT_REDUCE, 2 * items * sizeof(double));
    if (!pa) return -1;
    mod_col_range_kernel<<<kc_blocks(items), KC_THREADS, 0, kc_stream>>>(pa, pa + items, dgx.p != NULL, dg.p != NULL,
                                                                         dout, x, S, D, kb_fdiv_make(D),
                                                                         kb_fdiv_make(nr), items);
    if (kc_launched(op)) return -1;
    mod_col_combine_kernel<<<kc_blocks((size_t)B * D), KC_THREADS, 0, kc_stream>>>(dgx, dg, pa, pa + items, nr, D,
                                                                                  kb_fdiv_make(D), mod_stride,
                                                                                  (size_t)B * D);
    return kc_launched(op);
}

static int bad_mod_args(const char *op, int B, int S, int D, int per_token, int mod_stride) {
    if (B < 0 || S < 0 || D < 1 || (per_token != 0 && per_token != 1) || mod_stride < D)
        return core_error("%s: B %d, S %d, D %d, per_token %d, mod_stride %d (>= D)", op, B, S, D, per_token,
                          mod_stride);
    return 0;
}

extern "C" int kc_modulate_forward(kb_out out, kb_in x, kb_in shift, kb_in scale, int B, int S, int D, int per_token,
                                   int mod_stride) {
    if (bad_mod_args("modulate_forward", B, S, D, per_token, mod_stride)) return -1;
    const size_t n = (size_t)B * S * D;
    if (!n) return 0;
    if (too_big("modulate_forward", n)) return -1;
    mod_forward_kernel<<<kc_blocks(n), KC_THREADS, 0, kc_stream>>>(0, out, x, shift, scale, S, kb_fdiv_make(S),
                                                                   kb_fdiv_make(D), per_token, mod_stride, n);
    return kc_launched("modulate_forward");
}

extern "C" int kc_modulate_backward(kb_out dx, kb_out dshift, kb_out dscale, kb_in dout, kb_in x, kb_in scale, int B,
                                    int S, int D, int per_token, int mod_stride) {
    if (bad_mod_args("modulate_backward", B, S, D, per_token, mod_stride)) return -1;
    const size_t n = (size_t)B * S * D;
    if (!n) return 0;
    if (too_big("modulate_backward", n)) return -1;
    kb_out none = {NULL, KB_F32};
    mod_backward_elem_kernel<<<kc_blocks(n), KC_THREADS, 0, kc_stream>>>(0, dx, none, dscale, dshift, dout, x, scale,
                                                                         S, kb_fdiv_make(S), kb_fdiv_make(D),
                                                                         per_token, mod_stride, n);
    if (kc_launched("modulate_backward")) return -1;
    if (per_token || (!dscale.p && !dshift.p)) return 0;
    return mod_cols("modulate_backward", dscale, dshift, dout, x, B, S, D, mod_stride);
}

extern "C" int kc_gate_residual_forward(kb_out out, kb_in x, kb_in y, kb_in gate, int B, int S, int D, int per_token,
                                        int mod_stride) {
    if (bad_mod_args("gate_residual_forward", B, S, D, per_token, mod_stride)) return -1;
    const size_t n = (size_t)B * S * D;
    if (!n) return 0;
    if (too_big("gate_residual_forward", n)) return -1;
    mod_forward_kernel<<<kc_blocks(n), KC_THREADS, 0, kc_stream>>>(1, out, x, y, gate, S, kb_fdiv_make(S),
                                                                   kb_fdiv_make(D), per_token, mod_stride, n);
    return kc_launched("gate_residual_forward");
}

extern "C" int kc_gate_residual_backward(kb_out dx, kb_out dy, kb_out dgate, kb_in dout, kb_in y, kb_in gate, int B,
                                         int S, int D, int per_token, int mod_stride) {
    if (bad_mod_args("gate_residual_backward", B, S, D, per_token, mod_stride)) return -1;
    const size_t n = (size_t)B * S * D;
    if (!n) return 0;
    if (too_big("gate_residual_backward", n)) return -1;
    kb_out none = {NULL, KB_F32};
    mod_backward_elem_kernel<<<kc_blocks(n), KC_THREADS, 0, kc_stream>>>(1, dx, dy, dgate, none, dout, y, gate, S,
                                                                         kb_fdiv_make(S), kb_fdiv_make(D), per_token,
                                                                         mod_stride, n);
    if (kc_launched("gate_residual_backward")) return -1;
    if (per_token || !dgate.p) return 0;
    return mod_cols("gate_residual_backward", dgate, none, dout, y, B, S, D, mod_stride);
}

/* ---- patchify / unpatchify: one thread per element of the op's output ---- */

/* kind 0 patchify forward, 1 patchify backward, 2 unpatchify forward, 3 unpatchify backward. */
__global__ void patch_kernel(int kind, kb_out y, kb_in x, kb_patch_dims d, size_t n) {
    KC_FOR(o, n) {
        if (kind == 0) {
            kb_set(y, o, kb_get(x, kb_patchify_src(&d, o)));
        } else if (kind == 1) {
            kb_acc(y, kb_patchify_src(&d, o), kb_get(x, o));
        } else {
            const size_t src = kb_unpatchify_src(&d, o);
            if (kind == 2)
                kb_set(y, o, src == (size_t)-1 ? 0.0f : kb_get(x, src));
            else if (src != (size_t)-1)
                kb_acc(y, src, kb_get(x, o));
        }
    }
}

static int patch(int kind, kb_out y, kb_in x, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    static const char *names[4] = {"patchify_forward", "patchify_backward", "unpatchify_forward",
                                   "unpatchify_backward"};
    if (B < 0 || C < 1 || F < 1 || H < 1 || W < 1 || pt < 1 || ph < 1 || pw < 1)
        return core_error("%s: sizes B %d C %d F %d H %d W %d, patch %d x %d x %d must be >= 1", names[kind], B, C, F,
                          H, W, pt, ph, pw);
    kb_patch_dims d = kb_patch_dims_make(B, C, F, H, W, pt, ph, pw);
    const size_t n = kind < 2 ? kb_patch_tokens_n(&d) : kb_patch_video_n(&d);
    if (!n) return 0;
    if (too_big(names[kind], kb_patch_tokens_n(&d)) || too_big(names[kind], kb_patch_video_n(&d))) return -1;
    patch_kernel<<<kc_blocks(n), KC_THREADS, 0, kc_stream>>>(kind, y, x, d, n);
    return kc_launched(names[kind]);
}

extern "C" int kc_patchify_forward(kb_out out, kb_in x, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    return patch(0, out, x, B, C, F, H, W, pt, ph, pw);
}
extern "C" int kc_patchify_backward(kb_out dx, kb_in dout, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    return patch(1, dx, dout, B, C, F, H, W, pt, ph, pw);
}
extern "C" int kc_unpatchify_forward(kb_out out, kb_in x, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    return patch(2, out, x, B, C, F, H, W, pt, ph, pw);
}
extern "C" int kc_unpatchify_backward(kb_out dx, kb_in dout, int B, int C, int F, int H, int W, int pt, int ph,
                                      int pw) {
    return patch(3, dx, dout, B, C, F, H, W, pt, ph, pw);
}

/* ---- LSE merge: one thread per query row ---- */

__global__ void lse_merge_fwd_kernel(kb_out o, float *lse, kb_in o1, const float *lse1, kb_in o2, const float *lse2,
                                     int S, int H, int Dh, size_t rows) {
    KC_FOR(r, rows) kb_lse_merge_fwd_row(o, lse, o1, lse1, o2, lse2, r * Dh, kb_lse_index(r, S, H), Dh);
}

__global__ void lse_merge_bwd_kernel(kb_out do1, float *dlse1, kb_out do2, float *dlse2, kb_in dout, const float *dlse,
                                     kb_in o1, const float *lse1, kb_in o2, const float *lse2, int S, int H, int Dh,
                                     size_t rows) {
    KC_FOR(r, rows)
    kb_lse_merge_bwd_row(do1, dlse1, do2, dlse2, dout, dlse, o1, lse1, o2, lse2, r * Dh, kb_lse_index(r, S, H), Dh);
}

extern "C" int kc_lse_merge_forward(kb_out o, float *lse, kb_in o1, const float *lse1, kb_in o2, const float *lse2,
                                    int B, int S, int H, int Dh) {
    if (B < 0 || S < 0 || H < 1 || Dh < 1) return core_error("lse_merge_forward: B %d S %d H %d Dh %d", B, S, H, Dh);
    const size_t rows = (size_t)B * S * H;
    if (!rows) return 0;
    if (too_big("lse_merge_forward", rows * (size_t)Dh)) return -1;
    lse_merge_fwd_kernel<<<kc_blocks(rows), KC_THREADS, 0, kc_stream>>>(o, lse, o1, lse1, o2, lse2, S, H, Dh, rows);
    return kc_launched("lse_merge_forward");
}

extern "C" int kc_lse_merge_backward(kb_out do1, float *dlse1, kb_out do2, float *dlse2, kb_in dout, const float *dlse,
                                     kb_in o1, const float *lse1, kb_in o2, const float *lse2, int B, int S, int H,
                                     int Dh) {
    if (B < 0 || S < 0 || H < 1 || Dh < 1) return core_error("lse_merge_backward: B %d S %d H %d Dh %d", B, S, H, Dh);
    const size_t rows = (size_t)B * S * H;
    if (!rows) return 0;
    if (too_big("lse_merge_backward", rows * (size_t)Dh)) return -1;
    lse_merge_bwd_kernel<<<kc_blocks(rows), KC_THREADS, 0, kc_stream>>>(do1, dlse1, do2, dlse2, dout, dlse, o1, lse1,
                                                                        o2, lse2, S, H, Dh, rows);
    return kc_launched("lse_merge_backward");
}

/* ---- the modulation table plus the embedding rows (the Wan DiT's scale_shift_table + tproj / temb) ----
 * Forward: one thread per element. Backward: one thread per table column (rows summed in order, the CPU's fp32
 * accumulator) and one per source element (broadcast: the nj rows added in order). R is small (batch, or batch x
 * tokens with per-token timesteps), so the column sums are short. */

__global__ void add_table_fwd_kernel(kb_out out, kb_in table, kb_in src, int nj, int D, int src_nj, size_t n) {
    KC_FOR(i, n) kb_set(out, i, kb_add_table_elem(table, src, i, nj, D, src_nj));
}

__global__ void add_table_col_kernel(kb_out dtable, kb_in dmod, int R, int ncol) {
    KC_FOR(c, (size_t)ncol) kb_acc(dtable, c, kb_col_sum_f32(dmod, R, ncol, (int)c));
}

__global__ void add_table_src_kernel(kb_out dsrc, kb_in dmod, int nj, int D, int src_nj, size_t n) {
    KC_FOR(e, n) {
        if (src_nj == 1)
            kb_add_table_bcast_grad(dsrc, dmod, e, nj, D);
        else
            kb_acc(dsrc, e, kb_get(dmod, e));
    }
}

static int bad_table_args(const char *op, int R, int nj, int D, int src_nj) {
    if (R < 0 || nj < 1 || D < 1 || (src_nj != 1 && src_nj != nj))
        return core_error("%s: R %d, nj %d, D %d, src_nj %d (1 or nj)", op, R, nj, D, src_nj);
    return 0;
}

extern "C" int kc_add_table_forward(kb_out out, kb_in table, kb_in src, int R, int nj, int D, int src_nj) {
    if (bad_table_args("add_table_forward", R, nj, D, src_nj)) return -1;
    const size_t n = (size_t)R * nj * D;
    if (!n) return 0;
    if (too_big("add_table_forward", n)) return -1;
    add_table_fwd_kernel<<<kc_blocks(n), KC_THREADS, 0, kc_stream>>>(out, table, src, nj, D, src_nj, n);
    return kc_launched("add_table_forward");
}

extern "C" int kc_add_table_backward(kb_out dtable, kb_out dsrc, kb_in dmod, int R, int nj, int D, int src_nj) {
    if (bad_table_args("add_table_backward", R, nj, D, src_nj)) return -1;
    if (!R) return 0;
    if (too_big("add_table_backward", (size_t)R * nj * D)) return -1;
    if (dtable.p) {
        add_table_col_kernel<<<kc_blocks((size_t)nj * D), KC_THREADS, 0, kc_stream>>>(dtable, dmod, R, nj * D);
        if (kc_launched("add_table_backward")) return -1;
    }
    if (!dsrc.p) return 0;
    const size_t n = (size_t)R * src_nj * D;
    add_table_src_kernel<<<kc_blocks(n), KC_THREADS, 0, kc_stream>>>(dsrc, dmod, nj, D, src_nj, n);
    return kc_launched("add_table_backward");
}
