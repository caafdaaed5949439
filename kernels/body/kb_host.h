/* kernels/body/kb_host.h — the kernel bodies driven over whole tensors on the host, in the decomposition the CUDA
 * kernels use (kernels/cuda/kern_*.cu): one element, one pair, one row split in 16 lanes, one column or one chunk at
 * a time. tests/test_kernel_bodies*.c run these against k_cpu_ops (fp32: bit for bit; bf16 storage: within stated
 * bands), and the GPU check (kernels/cuda/check/) runs them as the CPU side of the ops that have no k_cpu_ops entry
 * (flow, guidance, optimizer). Single-threaded and simple: they prove arithmetic, they are not a fast path.
 * Argument conventions are kernels/kernels.h's (forwards overwrite, backwards accumulate), with typed views
 * (kb_base.h) in place of float pointers; fp32-only tensors (norm statistics, LSE, RoPE tables) stay float *. */
#ifndef KERNELS_BODY_KB_HOST_H
#define KERNELS_BODY_KB_HOST_H

#include <stdlib.h>

#include "kernels/body/kb_act.h"
#include "kernels/body/kb_base.h"
#include "kernels/body/kb_flow.h"
#include "kernels/body/kb_lse.h"
#include "kernels/body/kb_modulate.h"
#include "kernels/body/kb_norm.h"
#include "kernels/body/kb_optim.h"
#include "kernels/body/kb_patch.h"
#include "kernels/body/kb_rope.h"

/* ---- norms: one row at a time, its 16 lanes computed one after the other, as 16 GPU threads compute them ---- */

static inline void kbh_layernorm_forward(kb_out out, float *mean, float *rstd, kb_in x, kb_in w, kb_in b, int N,
                                         int C, float eps) {
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        double l[KB_NORM_LANES];
        for (int j = 0; j < KB_NORM_LANES; j++) l[j] = kb_norm_lane_sum(x, row, C, j);
        double m = kb_norm_mean(kb_norm_combine(l), C);
        for (int j = 0; j < KB_NORM_LANES; j++) l[j] = kb_norm_lane_sq_dev(x, row, C, j, m);
        float mf = (float)m, rf = kb_norm_rstd(kb_norm_combine(l), C, eps);
        mean[n] = mf;
        rstd[n] = rf;
        for (int c = 0; c < C; c++) {
            float wv = w.p ? kb_get(w, (size_t)c) : 0.0f, bv = b.p ? kb_get(b, (size_t)c) : 0.0f;
            kb_set(out, row + c, kb_layernorm_elem(kb_get(x, row + c), mf, rf, w.p != NULL, wv, b.p != NULL, bv));
        }
    }
}

static inline void kbh_rmsnorm_forward(kb_out out, float *rstd, kb_in x, kb_in w, int N, int C, float eps) {
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        double l[KB_NORM_LANES];
        for (int j = 0; j < KB_NORM_LANES; j++) l[j] = kb_norm_lane_sq_dev(x, row, C, j, 0.0);
        float rf = kb_norm_rstd(kb_norm_combine(l), C, eps);
        rstd[n] = rf;
        for (int c = 0; c < C; c++) {
            float wv = w.p ? kb_get(w, (size_t)c) : 0.0f;
            kb_set(out, row + c, kb_rmsnorm_elem(kb_get(x, row + c), rf, w.p != NULL, wv));
        }
    }
}

/* rms 0: LayerNorm (mean used), 1: RMSNorm. dx.p, dw.p, db.p may be NULL (not wanted). */
static inline void kbh_norm_backward(int rms, kb_out dx, kb_out dw, kb_out db, kb_in dout, kb_in x, kb_in w,
                                     const float *mean, const float *rstd, int N, int C) {
    if (dx.p) {
        for (int n = 0; n < N; n++) {
            size_t row = (size_t)n * C;
            float mf = rms ? 0.0f : mean[n], rf = rstd[n];
            double lgx[KB_NORM_LANES], lg[KB_NORM_LANES];
            for (int j = 0; j < KB_NORM_LANES; j++)
                kb_norm_lane_grad_sums(x, dout, w, row, C, j, !rms, mf, rf, &lgx[j], &lg[j]);
            double mgx = kb_norm_combine(lgx) / C, mg = kb_norm_combine(lg) / C;
            for (int c = 0; c < C; c++) {
                float xv = kb_get(x, row + c), gv = kb_get(dout, row + c), wv = w.p ? kb_get(w, (size_t)c) : 0.0f;
                float d = rms ? kb_rmsnorm_dx_elem(xv, gv, w.p != NULL, wv, rf, mgx)
                              : kb_layernorm_dx_elem(xv, gv, w.p != NULL, wv, mf, rf, mg, mgx);
                kb_acc(dx, row + c, d);
            }
        }
    }
    if (dw.p || (db.p && !rms)) { /* the GPU's two launches: (range, column) partials, then one pass per column */
        kb_out no_db = {NULL, KB_F32};
        const int nr = kb_norm_param_ranges(N);
        double *pw = (double *)malloc(sizeof(double) * ((size_t)nr * C + 1)),
               *pb = (double *)malloc(sizeof(double) * ((size_t)nr * C + 1));
        if (!pw || !pb) abort();
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < C; c++)
                kb_norm_param_range(dout, x, rms ? NULL : mean, rstd, N, C, c, r, &pw[(size_t)r * C + c],
                                    &pb[(size_t)r * C + c]);
        for (int c = 0; c < C; c++) kb_norm_param_combine(dw, rms ? no_db : db, pw, pb, nr, C, c);
        free(pw), free(pb);
    }
}

/* ---- RoPE: one pair at a time ---- */

static inline void kbh_rope(int backward, kb_out out, kb_in x, const float *cos, const float *sin, int B, int S,
                            int H, int Dh) {
    int half = Dh / 2;
    size_t pairs = (size_t)B * S * H * half; /* < 2^31 (k_emu's caller checks, as the kernel's launcher) */
    const kb_rope_div v = kb_rope_div_make(S, H, half);
    for (size_t p = 0; p < pairs; p++) {
        size_t t = kb_rope_table_index32((uint32_t)p, &v);
        float a = kb_get(x, 2 * p), b = kb_get(x, 2 * p + 1), y1, y2;
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

/* ---- activations: one element at a time; gelu 1: GELU-tanh, 0: SiLU ---- */

static inline void kbh_act_forward(int gelu, kb_out out, kb_in x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = kb_get(x, (size_t)i);
        kb_set(out, (size_t)i, gelu ? kb_gelu_fwd(v) : kb_silu_fwd(v));
    }
}

static inline void kbh_act_backward(int gelu, kb_out dx, kb_in dout, kb_in x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = kb_get(x, (size_t)i), g = kb_get(dout, (size_t)i);
        kb_acc(dx, (size_t)i, gelu ? kb_gelu_bwd(g, v) : kb_silu_bwd(g, v));
    }
}

/* ---- modulation and gated residual: elementwise, then (broadcast rows) one column of one sample at a time ---- */

static inline void kbh_modulate_forward(kb_out out, kb_in x, kb_in shift, kb_in scale, int B, int S, int D,
                                        int per_token, int mod_stride) {
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            size_t r = ((size_t)b * S + s) * D, m = kb_mod_row(b, s, S, per_token, mod_stride);
            for (int d = 0; d < D; d++)
                kb_set(out, r + d, kb_modulate_elem(kb_get(x, r + d), kb_get(shift, m + d), kb_get(scale, m + d)));
        }
}

/* The broadcast modulation gradients (kb_modulate.h's range reduction, in the GPU's two launches): dgx[b, d] +=
 * sum_s g x, dg[b, d] += sum_s g (either .p may be NULL), rows of dgx / dg mod_stride apart. */
static inline void kbh_mod_cols(kb_out dgx, kb_out dg, kb_in dout, kb_in x, int B, int S, int D, int mod_stride) {
    const int nr = kb_mod_col_ranges(S);
    const size_t per = (size_t)nr * D;
    double *pa = (double *)malloc(sizeof(double) * (per + 1)), *pc = (double *)malloc(sizeof(double) * (per + 1));
    if (!pa || !pc) abort();
    for (int b = 0; b < B; b++) {
        for (int r = 0; r < nr; r++)
            for (int d = 0; d < D; d++)
                kb_mod_col_range(dout, x, (size_t)b * S * D, S, D, d, r, dgx.p ? &pa[(size_t)r * D + d] : NULL,
                                 dg.p ? &pc[(size_t)r * D + d] : NULL);
        for (int d = 0; d < D; d++) {
            double sgx = 0.0, sg = 0.0;
            kb_mod_col_combine(pa, pc, nr, D, d, dgx.p ? &sgx : NULL, dg.p ? &sg : NULL);
            const size_t m = (size_t)b * mod_stride + d;
            if (dgx.p) kb_acc(dgx, m, (float)sgx);
            if (dg.p) kb_acc(dg, m, (float)sg);
        }
    }
    free(pa), free(pc);
}

static inline void kbh_modulate_backward(kb_out dx, kb_out dshift, kb_out dscale, kb_in dout, kb_in x, kb_in scale,
                                         int B, int S, int D, int per_token, int mod_stride) {
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            size_t r = ((size_t)b * S + s) * D, m = kb_mod_row(b, s, S, per_token, mod_stride);
            for (int d = 0; d < D; d++) {
                float g = kb_get(dout, r + d);
                if (dx.p) kb_acc(dx, r + d, kb_modulate_dx_elem(g, kb_get(scale, m + d)));
                if (per_token && dscale.p) kb_acc(dscale, m + d, g * kb_get(x, r + d));
                if (per_token && dshift.p) kb_acc(dshift, m + d, g);
            }
        }
    if (per_token || (!dscale.p && !dshift.p)) return;
    kbh_mod_cols(dscale, dshift, dout, x, B, S, D, mod_stride);
}

static inline void kbh_gate_residual_forward(kb_out out, kb_in x, kb_in y, kb_in gate, int B, int S, int D,
                                             int per_token, int mod_stride) {
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            size_t r = ((size_t)b * S + s) * D, m = kb_mod_row(b, s, S, per_token, mod_stride);
            for (int d = 0; d < D; d++)
                kb_set(out, r + d, kb_gate_residual_elem(kb_get(x, r + d), kb_get(y, r + d), kb_get(gate, m + d)));
        }
}

static inline void kbh_gate_residual_backward(kb_out dx, kb_out dy, kb_out dgate, kb_in dout, kb_in y, kb_in gate,
                                              int B, int S, int D, int per_token, int mod_stride) {
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            size_t r = ((size_t)b * S + s) * D, m = kb_mod_row(b, s, S, per_token, mod_stride);
            for (int d = 0; d < D; d++) {
                float g = kb_get(dout, r + d);
                if (dx.p) kb_acc(dx, r + d, g);
                if (dy.p) kb_acc(dy, r + d, g * kb_get(gate, m + d));
                if (per_token && dgate.p) kb_acc(dgate, m + d, g * kb_get(y, r + d));
            }
        }
    if (per_token || !dgate.p) return;
    kb_out none = {NULL, KB_F32};
    kbh_mod_cols(dgate, none, dout, y, B, S, D, mod_stride);
}

/* ---- the modulation table plus the embedding rows: one element, one table column, one source element ---- */

static inline void kbh_add_table_forward(kb_out out, kb_in table, kb_in src, int R, int nj, int D, int src_nj) {
    size_t n = (size_t)R * nj * D;
    for (size_t i = 0; i < n; i++) kb_set(out, i, kb_add_table_elem(table, src, i, nj, D, src_nj));
}

/* dtable.p, dsrc.p may be NULL (not wanted). */
static inline void kbh_add_table_backward(kb_out dtable, kb_out dsrc, kb_in dmod, int R, int nj, int D, int src_nj) {
    if (dtable.p)
        for (int c = 0; c < nj * D; c++) kb_acc(dtable, (size_t)c, kb_col_sum_f32(dmod, R, nj * D, c));
    if (!dsrc.p) return;
    if (src_nj == nj) {
        size_t n = (size_t)R * nj * D;
        for (size_t i = 0; i < n; i++) kb_acc(dsrc, i, kb_get(dmod, i));
    } else {
        for (size_t e = 0; e < (size_t)R * D; e++) kb_add_table_bcast_grad(dsrc, dmod, e, nj, D);
    }
}

/* ---- patch layouts: one element of the op's output at a time ---- */

static inline void kbh_patchify_forward(kb_out out, kb_in x, const kb_patch_dims *d) {
    size_t n = kb_patch_tokens_n(d);
    for (size_t o = 0; o < n; o++) kb_set(out, o, kb_get(x, kb_patchify_src(d, o)));
}
static inline void kbh_patchify_backward(kb_out dx, kb_in dout, const kb_patch_dims *d) {
    size_t n = kb_patch_tokens_n(d);
    for (size_t o = 0; o < n; o++) kb_acc(dx, kb_patchify_src(d, o), kb_get(dout, o));
}
static inline void kbh_unpatchify_forward(kb_out out, kb_in x, const kb_patch_dims *d) {
    size_t n = kb_patch_video_n(d);
    for (size_t o = 0; o < n; o++) {
        size_t src = kb_unpatchify_src(d, o);
        kb_set(out, o, src == (size_t)-1 ? 0.0f : kb_get(x, src));
    }
}
static inline void kbh_unpatchify_backward(kb_out dx, kb_in dout, const kb_patch_dims *d) {
    size_t n = kb_patch_video_n(d);
    for (size_t o = 0; o < n; o++) {
        size_t src = kb_unpatchify_src(d, o);
        if (src != (size_t)-1) kb_acc(dx, src, kb_get(dout, o));
    }
}

/* ---- LSE merge: one query row at a time ---- */

static inline void kbh_lse_merge_forward(kb_out o, float *lse, kb_in o1, const float *lse1, kb_in o2,
                                         const float *lse2, int B, int S, int H, int Dh) {
    size_t rows = (size_t)B * S * H;
    for (size_t r = 0; r < rows; r++) kb_lse_merge_fwd_row(o, lse, o1, lse1, o2, lse2, r * Dh, kb_lse_index(r, S, H), Dh);
}

static inline void kbh_lse_merge_backward(kb_out do1, float *dlse1, kb_out do2, float *dlse2, kb_in dout,
                                          const float *dlse, kb_in o1, const float *lse1, kb_in o2, const float *lse2,
                                          int B, int S, int H, int Dh) {
    size_t rows = (size_t)B * S * H;
    for (size_t r = 0; r < rows; r++)
        kb_lse_merge_bwd_row(do1, dlse1, do2, dlse2, dout, dlse, o1, lse1, o2, lse2, r * Dh, kb_lse_index(r, S, H),
                             Dh);
}

/* ---- flow: chunk sums in index order, combined by the counter ---- */

/* One SDE step over n elements (see kb_sde_chunk); returns the fixed-order sum of (x_next - mean)^2 (0 when
 * !want_sum). */
static inline float kbh_sde_step(kb_in x, kb_in v, kb_in eps, kb_in given, kb_out mean_out, kb_out x_next_out,
                                 float cx, float cv, float step_std, int want_sum, int64_t n) {
    kb_counter k;
    kb_counter_init(&k);
    for (int64_t b = 0; b < n; b += KB_REDUCE_CHUNK) {
        int64_t e = b + KB_REDUCE_CHUNK < n ? b + KB_REDUCE_CHUNK : n;
        kb_counter_push(&k, kb_sde_chunk(x, v, eps, given, mean_out, x_next_out, cx, cv, step_std, want_sum, b, e));
    }
    return kb_counter_finish(&k);
}

static inline float kbh_sq_diff_sum(kb_in a, kb_in b, int64_t n) {
    kb_counter k;
    kb_counter_init(&k);
    for (int64_t c = 0; c < n; c += KB_REDUCE_CHUNK) {
        int64_t e = c + KB_REDUCE_CHUNK < n ? c + KB_REDUCE_CHUNK : n;
        kb_counter_push(&k, kb_sq_diff_chunk(a, b, c, e));
    }
    return kb_counter_finish(&k);
}

static inline void kbh_sde_backward_v(kb_out dv, kb_in mean, kb_in x_next, kb_in mean_ref, float g_logp, float g_kl,
                                      float k, int64_t n) {
    int use_logp = g_logp != 0.0f, use_kl = g_kl != 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float m = kb_get(mean, (size_t)i);
        float xn = use_logp ? kb_get(x_next, (size_t)i) : 0.0f, mr = use_kl ? kb_get(mean_ref, (size_t)i) : 0.0f;
        kb_set(dv, (size_t)i, kb_sde_dv_elem(m, xn, mr, g_logp, g_kl, use_logp, use_kl, k));
    }
}

static inline void kbh_cfg_combine(kb_out v, kb_in vc, kb_in vu, float g, int64_t n) {
    for (int64_t i = 0; i < n; i++) kb_set(v, (size_t)i, kb_cfg_elem(kb_get(vc, (size_t)i), kb_get(vu, (size_t)i), g));
}

static inline void kbh_cfg_backward(kb_out dvc, kb_out dvu, kb_in dv, float g, int64_t n) {
    const float gu = 1.0f - g;
    for (int64_t i = 0; i < n; i++) {
        float d = kb_get(dv, (size_t)i);
        kb_set(dvc, (size_t)i, g * d);
        kb_set(dvu, (size_t)i, gu * d);
    }
}

/* ---- optimizer ---- */

/* AdamW over n fp32 elements; wd_mask NULL = every element decays; p_bf16 (may be NULL) receives the bf16 copy. */
static inline void kbh_adamw(float *p, float *m, float *v, kb_in g, const uint8_t *wd_mask, kb_adamw_scalars s,
                             kb_bf16 *p_bf16, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        kb_adamw_elem(&p[i], &m[i], &v[i], kb_get(g, (size_t)i), &s, !wd_mask || wd_mask[i]);
        if (p_bf16) p_bf16[i] = kb_bf16_from_f32(p[i]);
    }
}

/* optim_sumsq's order: chunk sums of KB_SUMSQ_CHUNK in double, added in chunk order. */
static inline double kbh_sumsq(kb_in x, int64_t n) {
    double total = 0.0;
    for (int64_t b = 0; b < n; b += KB_SUMSQ_CHUNK) {
        int64_t e = b + KB_SUMSQ_CHUNK < n ? b + KB_SUMSQ_CHUNK : n;
        total += kb_sumsq_chunk(x, b, e);
    }
    return total;
}

#endif
