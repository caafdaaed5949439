/* kernels/cpu/dev_table.c — k_cpu_dev_ops: the fp32 CPU backend behind the device table (dev_table.h). */
#include "kernels/cpu/dev_table.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/body/kb_blocksum.h"
#include "kernels/cpu/cpu.h"

/* An fp32 view (or an absent one, p NULL), else -1 naming the entry and the argument. */
static int f32(const char *op, const char *name, const void *p, kb_dtype t) {
    if (!p || t == KB_F32) return 0;
    return core_error("cpu-f32 %s: %s is %s: the CPU table takes fp32 views", op, name,
                      t == KB_BF16 ? "bf16" : "of an unknown dtype");
}
#define IN(op, v) f32(op, #v, (v).p, (v).t)
#define FI(v) ((const float *)(v).p)
#define FO(v) ((float *)(v).p)

static int c_gemm(const k_gemm_args *g) {
    if (f32("gemm", "A", g->A.p, g->A.t) || f32("gemm", "B", g->B.p, g->B.t) || f32("gemm", "C", g->C.p, g->C.t))
        return -1;
    if (g->epi != K_EPI_NONE && g->epi != K_EPI_BIAS && g->epi != K_EPI_BGRAD_A)
        return core_error("cpu-f32 gemm: epilogue %d is not on the CPU table (bias and the weight-gradient bias sum "
                          "only)", (int)g->epi);
    if (g->epi == K_EPI_BGRAD_A && !g->transA)
        return core_error("cpu-f32 gemm: K_EPI_BGRAD_A needs transA (dW = dY^T X with dY stored [K, M])");
    k_cpu_gemm(g->transA, g->transB, g->M, g->N, g->K, g->alpha, FI(g->A), g->lda, FI(g->B), g->ldb, g->beta, FO(g->C),
               g->ldc, g->epi == K_EPI_BIAS ? (const float *)g->bias : NULL);
    /* dbias[m] += sum_k op(A)[m, k]: op(A) = A^T, A stored [K, M] with row stride lda: the column sums of A's rows */
    if (g->epi == K_EPI_BGRAD_A) k_cpu_colsum_acc(g->dbias, FI(g->A), g->K, g->M, g->lda);
    return 0;
}

static int c_ln_f(kb_out out, float *mean, float *rstd, kb_in x, kb_in w, kb_in b, int N, int C, float eps) {
    const char *op = "layernorm_forward";
    if (IN(op, out) || IN(op, x) || IN(op, w) || IN(op, b)) return -1;
    return k_cpu_layernorm_forward(FO(out), mean, rstd, FI(x), FI(w), FI(b), N, C, eps), 0;
}
static int c_ln_b(kb_out dx, kb_out dw, kb_out db, kb_in dout, kb_in x, kb_in w, const float *mean, const float *rstd,
                  int N, int C) {
    const char *op = "layernorm_backward";
    if (IN(op, dx) || IN(op, dw) || IN(op, db) || IN(op, dout) || IN(op, x) || IN(op, w)) return -1;
    return k_cpu_layernorm_backward(FO(dx), FO(dw), FO(db), FI(dout), FI(x), FI(w), mean, rstd, N, C), 0;
}
static int c_rms_f(kb_out out, float *rstd, kb_in x, kb_in w, int N, int C, float eps) {
    const char *op = "rmsnorm_forward";
    if (IN(op, out) || IN(op, x) || IN(op, w)) return -1;
    return k_cpu_rmsnorm_forward(FO(out), rstd, FI(x), FI(w), N, C, eps), 0;
}
static int c_rms_b(kb_out dx, kb_out dw, kb_in dout, kb_in x, kb_in w, const float *rstd, int N, int C) {
    const char *op = "rmsnorm_backward";
    if (IN(op, dx) || IN(op, dw) || IN(op, dout) || IN(op, x) || IN(op, w)) return -1;
    return k_cpu_rmsnorm_backward(FO(dx), FO(dw), FI(dout), FI(x), FI(w), rstd, N, C), 0;
}
static int c_rope_f(kb_out out, kb_in x, const float *cs, const float *sn, int B, int S, int H, int Dh) {
    if (IN("rope_forward", out) || IN("rope_forward", x)) return -1;
    return k_cpu_rope_forward(FO(out), FI(x), cs, sn, B, S, H, Dh), 0;
}
static int c_rope_b(kb_out dx, kb_in dout, const float *cs, const float *sn, int B, int S, int H, int Dh) {
    if (IN("rope_backward", dx) || IN("rope_backward", dout)) return -1;
    return k_cpu_rope_backward(FO(dx), FI(dout), cs, sn, B, S, H, Dh), 0;
}
static int c_gelu_f(kb_out out, kb_in x, int64_t n) {
    if (IN("gelu_forward", out) || IN("gelu_forward", x)) return -1;
    return k_cpu_gelu_forward(FO(out), FI(x), n), 0;
}
static int c_gelu_b(kb_out dx, kb_in dout, kb_in x, int64_t n) {
    if (IN("gelu_backward", dx) || IN("gelu_backward", dout) || IN("gelu_backward", x)) return -1;
    return k_cpu_gelu_backward(FO(dx), FI(dout), FI(x), n), 0;
}
static int c_silu_f(kb_out out, kb_in x, int64_t n) {
    if (IN("silu_forward", out) || IN("silu_forward", x)) return -1;
    return k_cpu_silu_forward(FO(out), FI(x), n), 0;
}
static int c_silu_b(kb_out dx, kb_in dout, kb_in x, int64_t n) {
    if (IN("silu_backward", dx) || IN("silu_backward", dout) || IN("silu_backward", x)) return -1;
    return k_cpu_silu_backward(FO(dx), FI(dout), FI(x), n), 0;
}
static int c_mod_f(kb_out out, kb_in x, kb_in shift, kb_in scale, int B, int S, int D, int pt, int st) {
    const char *op = "modulate_forward";
    if (IN(op, out) || IN(op, x) || IN(op, shift) || IN(op, scale)) return -1;
    return k_cpu_modulate_forward(FO(out), FI(x), FI(shift), FI(scale), B, S, D, pt, st), 0;
}
static int c_mod_b(kb_out dx, kb_out dshift, kb_out dscale, kb_in dout, kb_in x, kb_in scale, int B, int S, int D,
                   int pt, int st) {
    const char *op = "modulate_backward";
    if (IN(op, dx) || IN(op, dshift) || IN(op, dscale) || IN(op, dout) || IN(op, x) || IN(op, scale)) return -1;
    return k_cpu_modulate_backward(FO(dx), FO(dshift), FO(dscale), FI(dout), FI(x), FI(scale), B, S, D, pt, st), 0;
}
static int c_gate_f(kb_out out, kb_in x, kb_in y, kb_in gate, int B, int S, int D, int pt, int st) {
    const char *op = "gate_residual_forward";
    if (IN(op, out) || IN(op, x) || IN(op, y) || IN(op, gate)) return -1;
    return k_cpu_gate_residual_forward(FO(out), FI(x), FI(y), FI(gate), B, S, D, pt, st), 0;
}
static int c_gate_b(kb_out dx, kb_out dy, kb_out dgate, kb_in dout, kb_in y, kb_in gate, int B, int S, int D, int pt,
                    int st) {
    const char *op = "gate_residual_backward";
    if (IN(op, dx) || IN(op, dy) || IN(op, dgate) || IN(op, dout) || IN(op, y) || IN(op, gate)) return -1;
    return k_cpu_gate_residual_backward(FO(dx), FO(dy), FO(dgate), FI(dout), FI(y), FI(gate), B, S, D, pt, st), 0;
}
static int c_patch_f(kb_out out, kb_in x, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    if (IN("patchify_forward", out) || IN("patchify_forward", x)) return -1;
    return k_cpu_patchify_forward(FO(out), FI(x), B, C, F, H, W, pt, ph, pw), 0;
}
static int c_patch_b(kb_out dx, kb_in dout, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    if (IN("patchify_backward", dx) || IN("patchify_backward", dout)) return -1;
    return k_cpu_patchify_backward(FO(dx), FI(dout), B, C, F, H, W, pt, ph, pw), 0;
}
static int c_unpatch_f(kb_out out, kb_in x, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    if (IN("unpatchify_forward", out) || IN("unpatchify_forward", x)) return -1;
    return k_cpu_unpatchify_forward(FO(out), FI(x), B, C, F, H, W, pt, ph, pw), 0;
}
static int c_unpatch_b(kb_out dx, kb_in dout, int B, int C, int F, int H, int W, int pt, int ph, int pw) {
    if (IN("unpatchify_backward", dx) || IN("unpatchify_backward", dout)) return -1;
    return k_cpu_unpatchify_backward(FO(dx), FI(dout), B, C, F, H, W, pt, ph, pw), 0;
}
static int c_attn_f(kb_out o, float *lse, kb_in q, kb_in k, kb_in v, int B, int Sq, int Skv, int H, int Dh,
                    float scale) {
    const char *op = "attention_forward";
    if (IN(op, o) || IN(op, q) || IN(op, k) || IN(op, v)) return -1;
    return k_cpu_attention_forward(FO(o), lse, FI(q), FI(k), FI(v), B, Sq, Skv, H, Dh, scale), 0;
}
static int c_attn_b(kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k, kb_in v, kb_in o, const float *lse,
                    int B, int Sq, int Skv, int H, int Dh, float scale) {
    const char *op = "attention_backward";
    if (IN(op, dq) || IN(op, dk) || IN(op, dv) || IN(op, dout) || IN(op, q) || IN(op, k) || IN(op, v) || IN(op, o))
        return -1;
    if (!dq.p || !dk.p || !dv.p) return core_error("cpu-f32 attention_backward: dq, dk and dv are all required");
    return k_cpu_attention_backward(FO(dq), FO(dk), FO(dv), FI(dout), FI(q), FI(k), FI(v), FI(o), lse, B, Sq, Skv, H,
                                    Dh, scale),
           0;
}
static int c_lse_f(kb_out o, float *lse, kb_in o1, const float *lse1, kb_in o2, const float *lse2, int B, int S,
                   int H, int Dh) {
    if (IN("lse_merge_forward", o) || IN("lse_merge_forward", o1) || IN("lse_merge_forward", o2)) return -1;
    return k_cpu_lse_merge_forward(FO(o), lse, FI(o1), lse1, FI(o2), lse2, B, S, H, Dh), 0;
}
static int c_lse_b(kb_out do1, float *dlse1, kb_out do2, float *dlse2, kb_in dout, const float *dlse, kb_in o1,
                   const float *lse1, kb_in o2, const float *lse2, int B, int S, int H, int Dh) {
    const char *op = "lse_merge_backward";
    if (IN(op, do1) || IN(op, do2) || IN(op, dout) || IN(op, o1) || IN(op, o2)) return -1;
    return k_cpu_lse_merge_backward(FO(do1), dlse1, FO(do2), dlse2, FI(dout), dlse, FI(o1), lse1, FI(o2), lse2, B, S,
                                    H, Dh),
           0;
}

/* ---- flow and optimizer: not on this table ---- */
static int absent(const char *op) {
    return core_error("cpu-f32 %s: not on the CPU table (model/flow and trainer/optim call their CPU functions)", op);
}
static int c_sde(kb_in x, kb_in v, kb_in eps, kb_in given, kb_out mean, kb_out xn, float cx, float cv, float sd,
                 int want, int64_t n, float *sum) {
    return absent("sde_step");
}
static int c_sqd(kb_in a, kb_in b, int64_t n, float *sum) { return absent("sq_diff_sum"); }
static int c_sdeb(kb_out dv, kb_in mean, kb_in xn, kb_in mref, float gl, float gk, float k, int64_t n) {
    return absent("sde_backward_v");
}
static int c_cfg(kb_out v, kb_in vc, kb_in vu, float g, int64_t n) { return absent("cfg_combine"); }
static int c_cfgb(kb_out dvc, kb_out dvu, kb_in dv, float g, int64_t n) { return absent("cfg_backward"); }
static int c_adamw(float *p, float *m, float *v, kb_in g, const uint8_t *mask, kb_adamw_scalars s, kb_bf16 *pb,
                   int64_t n) {
    return absent("adamw_update");
}
static int c_sumsq(kb_in x, int64_t n, double *out) { return absent("sumsq"); }
static int c_scale(kb_out x, float f, int64_t n) { return absent("scale"); }

/* ---- memory: the host's ---- */
static void *c_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 1)) {
        core_error("cpu-f32: out of memory (%zu bytes)", bytes);
        return NULL;
    }
    return memset(p, 0, bytes ? bytes : 1);
}
static void c_free(void *p) { free(p); }
static int c_copy(void *dst, const void *src, size_t bytes) { return memcpy(dst, src, bytes), 0; }
static int c_up16(kb_bf16 *dst, const float *src, size_t n) {
    return core_error("cpu-f32 mem_upload_bf16: the CPU table holds no bf16 tensors");
}
static int c_round16(kb_bf16 *dst, const float *src, int64_t n) {
    (void)dst, (void)src, (void)n;
    return core_error("cpu-f32 mem_round_bf16: the CPU table holds no bf16 tensors");
}
static int c_down16(float *dst, const kb_bf16 *src, size_t n) {
    return core_error("cpu-f32 mem_download_bf16: the CPU table holds no bf16 tensors");
}
static int c_zero(void *p, size_t bytes) { return memset(p, 0, bytes), 0; }
static int c_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height) {
    for (size_t i = 0; i < height; i++) memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
    return 0;
}
static int c_sync(void) { return 0; }
static int c_info(size_t *free_bytes, size_t *total_bytes) {
    return core_error("cpu-f32 mem_info: host memory (no device bound)");
}

/* ---- the DiT's glue ---- */
static int c_add(kb_out y, kb_in x, int64_t n) {
    if (IN("add", y) || IN("add", x)) return -1;
    return k_cpu_axpy1(FO(y), FI(x), n), 0;
}
static int c_tab_f(kb_out out, kb_in table, kb_in src, int R, int nj, int D, int src_nj) {
    const char *op = "add_table_forward";
    if (IN(op, out) || IN(op, table) || IN(op, src)) return -1;
    return k_cpu_add_table(FO(out), FI(table), FI(src), R, nj, D, src_nj), 0;
}
static int c_tab_b(kb_out dtable, kb_out dsrc, kb_in dmod, int R, int nj, int D, int src_nj) {
    const char *op = "add_table_backward";
    if (IN(op, dtable) || IN(op, dsrc) || IN(op, dmod)) return -1;
    return k_cpu_add_table_bwd(FO(dtable), FO(dsrc), FI(dmod), R, nj, D, src_nj), 0;
}

/* ---- the exact reduction's rank-order sum (kernels/body/kb_blocksum.h) ---- */
static int c_block_sum(float *out, const float *blocks, int nb, int64_t stride, int64_t n) {
    if (nb < 1 || n < 0 || stride < n)
        return core_error("cpu-f32 block_sum: nb %d, stride %lld, n %lld", nb, (long long)stride, (long long)n);
    for (int64_t i = 0; i < n; i++) out[i] = kb_blocksum_at(blocks, nb, stride, i);
    return 0;
}

/* ---- the umT5 encoder: the CPU encoder's own code (model/text/umt5.c's fp32 path keeps its bits) ---- */
static int c_t5_attn(kb_out o, kb_in q, kb_in k, kb_in v, const float *rel_bias, const int *bucket_of,
                     const int32_t *mask, int B, int S, int H, int Dk) {
    const char *op = "t5_attention";
    if (IN(op, o) || IN(op, q) || IN(op, k) || IN(op, v)) return -1;
    return k_cpu_t5_attention(FO(o), FI(q), FI(k), FI(v), rel_bias, bucket_of, mask, B, S, H, Dk);
}
/* gelu_forward into g, then g *= a1 (the order of the CPU encoder before the table: the same bits) */
static int c_t5_ggelu(kb_out g, kb_in a0, kb_in a1, int64_t n) {
    const char *op = "t5_gated_gelu";
    if (IN(op, g) || IN(op, a0) || IN(op, a1)) return -1;
    float *gf = FO(g);
    const float *b = FI(a1);
    k_cpu_gelu_forward(gf, FI(a0), n);
    for (int64_t i = 0; i < n; i++) gf[i] *= b[i];
    return 0;
}

/* ---- the Wan VAE decoder (kernels/cpu/vae_conv.c) ---- */
static int c_vae_conv(const k_vae_conv_args *a) {
    const char *op = "vae_conv3d";
    if (IN(op, a->out) || IN(op, a->x) || IN(op, a->cache) || IN(op, a->w) || IN(op, a->bias)) return -1;
    if (a->ldw != a->kt * a->kh * a->kw * a->cin || a->cout_w != a->cout)
        return core_error("cpu-f32 vae_conv3d: weights [%d, %d] for cout %d, K %d: the CPU table takes them unpadded",
                          a->cout_w, a->ldw, a->cout, a->kt * a->kh * a->kw * a->cin);
    if (a->up2x && a->kt != 1) return core_error("cpu-f32 vae_conv3d: up2x with kt %d (kt 1 only)", a->kt);
    return k_cpu_vae_conv3d(FO(a->out), FI(a->x), FI(a->cache), a->cache.p ? a->ncache : 0, FI(a->w), FI(a->bias),
                            a->nf, a->H, a->W, a->cin, a->cout, a->kt, a->kh, a->kw, a->up2x, (float *)a->work,
                            a->work_bytes / sizeof(float));
}
static int c_vae_norm(kb_out out, kb_in x, kb_in gamma, int64_t n, int C, int silu) {
    if (IN("vae_rms_norm", out) || IN("vae_rms_norm", x) || IN("vae_rms_norm", gamma)) return -1;
    return k_cpu_vae_rms_norm(FO(out), FI(x), FI(gamma), n, C, silu), 0;
}
static int c_vae_dup(kb_out out, kb_in x, int nf, int H, int W, int cin, int cout, int ft, int drop) {
    if (IN("vae_dupup_add", out) || IN("vae_dupup_add", x)) return -1;
    return k_cpu_vae_dupup_add(FO(out), FI(x), nf, H, W, cin, cout, ft, drop), 0;
}
static int c_vae_attn(kb_out o, kb_in q, kb_in k, kb_in v, int S, int C, float scale, void *work, size_t work_bytes) {
    const char *op = "vae_attention";
    if (IN(op, o) || IN(op, q) || IN(op, k) || IN(op, v)) return -1;
    if (work_bytes < (size_t)S * sizeof(float))
        return core_error("cpu-f32 vae_attention: work holds %zu bytes, the LSE of S = %d needs %zu", work_bytes, S,
                          (size_t)S * sizeof(float));
    return k_cpu_attention_forward(FO(o), (float *)work, FI(q), FI(k), FI(v), 1, S, S, 1, C, scale), 0;
}

const k_dev_ops k_cpu_dev_ops = {
    .name = "cpu-f32",
    .gemm = c_gemm,
    .layernorm_forward = c_ln_f,
    .layernorm_backward = c_ln_b,
    .rmsnorm_forward = c_rms_f,
    .rmsnorm_backward = c_rms_b,
    .rope_forward = c_rope_f,
    .rope_backward = c_rope_b,
    .gelu_forward = c_gelu_f,
    .gelu_backward = c_gelu_b,
    .silu_forward = c_silu_f,
    .silu_backward = c_silu_b,
    .modulate_forward = c_mod_f,
    .modulate_backward = c_mod_b,
    .gate_residual_forward = c_gate_f,
    .gate_residual_backward = c_gate_b,
    .patchify_forward = c_patch_f,
    .patchify_backward = c_patch_b,
    .unpatchify_forward = c_unpatch_f,
    .unpatchify_backward = c_unpatch_b,
    .attention_forward = c_attn_f,
    .attention_backward = c_attn_b,
    .lse_merge_forward = c_lse_f,
    .lse_merge_backward = c_lse_b,
    .sde_step = c_sde,
    .sq_diff_sum = c_sqd,
    .sde_backward_v = c_sdeb,
    .cfg_combine = c_cfg,
    .cfg_backward = c_cfgb,
    .adamw_update = c_adamw,
    .sumsq = c_sumsq,
    .scale = c_scale,
    .mem_alloc = c_alloc,
    .mem_free = c_free,
    .mem_upload = c_copy,
    .mem_download = c_copy,
    .mem_upload_bf16 = c_up16,
    .mem_download_bf16 = c_down16,
    .mem_zero = c_zero,
    .mem_copy2d = c_copy2d,
    .mem_sync = c_sync,
    .mem_info = c_info,
    .add = c_add,
    .add_table_forward = c_tab_f,
    .add_table_backward = c_tab_b,
    .block_sum = c_block_sum,
    /* the umT5 encoder */
    .t5_attention = c_t5_attn,
    .t5_gated_gelu = c_t5_ggelu,
    /* the Wan VAE decoder */
    .vae_conv3d = c_vae_conv,
    .vae_rms_norm = c_vae_norm,
    .vae_dupup_add = c_vae_dup,
    .vae_attention = c_vae_attn,
    /* the weight sync's device-to-device path */
    .mem_round_bf16 = c_round16,
};
