/* kernels/cuda/emu/emu_ops.c — the emulated device's op table (k_emu.h): host memory, the kernel bodies through
 * kernels/body/kb_host.h, k_cpu_ops for GEMM and attention on widened operands. Moved here from the GPU check's
 * emulator (kernels/cuda/check/emu/emulate.c, which keeps the rest of the k_cuda.h interface) so that `make test`
 * links it too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/body/kb_blocksum.h"
#include "kernels/body/kb_host.h"
#include "kernels/body/kb_t5.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/emu/emu_stream.h"
#include "kernels/cuda/emu/k_emu.h"
#include "kernels/cuda/precond/kc_precond.h"

/* ---- memory ---- */
/* The bytes mem_alloc was asked for, now held and at most (k_emu_mem_stats): each block carries its size in a
 * 256-byte header before the pointer it returns. */
static size_t g_held, g_peak;
/* A test's injected failure (tests/test_sync_nccl.c): VGRPO_EMULATE_DEVICE_FAIL_BYTES=N fails every allocation of
 * exactly N bytes, as cudaMalloc's out-of-memory would. */
static int injected_failure(size_t bytes) {
    static size_t fail; /* read once: mem_alloc is called per forward */
    static int read;
    if (!read) {
        const char *e = getenv("VGRPO_EMULATE_DEVICE_FAIL_BYTES");
        fail = e && *e ? (size_t)strtoull(e, NULL, 10) : 0, read = 1;
    }
    return fail && fail == bytes;
}
static void *e_alloc(size_t bytes) { /* 256-byte aligned, as cudaMalloc */
    void *p = NULL;
    if (injected_failure(bytes)) {
        core_error("emulated device: out of memory (%zu bytes; VGRPO_EMULATE_DEVICE_FAIL_BYTES)", bytes);
        return NULL;
    }
    if (posix_memalign(&p, 256, 256 + (bytes ? bytes : 1))) {
        core_error("emulated device: out of memory (%zu bytes)", bytes);
        return NULL;
    }
    *(size_t *)p = bytes;
    g_held += bytes;
    if (g_held > g_peak) g_peak = g_held;
    return (char *)p + 256;
}
static void e_free(void *p) {
    if (!p) return;
    char *b = (char *)p - 256;
    g_held -= *(size_t *)b;
    free(b);
}
void k_emu_mem_stats(size_t *held, size_t *peak) {
    if (held) *held = g_held;
    if (peak) *peak = g_peak;
}
static k_emu_traffic traffic;
void k_emu_traffic_get(k_emu_traffic *t) { *t = traffic; }
static int e_upload(void *d, const void *s, size_t b) {
    traffic.uploads++, traffic.upload_bytes += b;
    return memcpy(d, s, b), 0;
}
static int e_download(void *d, const void *s, size_t b) {
    traffic.downloads++, traffic.download_bytes += b;
    return memcpy(d, s, b), 0;
}
static int e_upload_bf16(kb_bf16 *d, const float *s, size_t n) {
    traffic.uploads++, traffic.upload_bytes += n * sizeof(kb_bf16);
    for (size_t i = 0; i < n; i++) d[i] = kb_bf16_from_f32(s[i]);
    return 0;
}
static int e_download_bf16(float *d, const kb_bf16 *s, size_t n) {
    traffic.downloads++, traffic.download_bytes += n * sizeof(kb_bf16);
    for (size_t i = 0; i < n; i++) d[i] = kb_f32_from_bf16(s[i]);
    return 0;
}
static int e_zero(void *p, size_t b) { return memset(p, 0, b), 0; }
static int e_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height) {
    for (size_t i = 0; i < height; i++) memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
    return 0;
}
static int e_sync(void) { return 0; }
/* No bound of its own (host memory); tests of the device-memory refusal give it one: VGRPO_EMULATE_DEVICE_MIB. */
static int e_mem_info(size_t *free_bytes, size_t *total_bytes) {
    const char *e = getenv("VGRPO_EMULATE_DEVICE_MIB");
    const long long mib = e ? atoll(e) : 0;
    if (mib <= 0) return core_error("the emulated device has no memory bound of its own (host memory)");
    *free_bytes = *total_bytes = (size_t)mib << 20;
    return 0;
}

static float *widen(kb_in x, size_t n) {
    float *f = malloc((n ? n : 1) * sizeof(float));
    if (!f) abort();
    for (size_t i = 0; i < n; i++) f[i] = kb_get(x, i);
    return f;
}
static void store(kb_out y, const float *f, size_t n) {
    for (size_t i = 0; i < n; i++) kb_set(y, i, f[i]);
}

/* ---- GEMM: fp32 k_cpu_ops.gemm on the widened operands ---- */
static int emu_gemm(const k_gemm_args *g) {
    if (kc_precond_gemm(g)) return -1; /* what cuBLASLt on the GPU refuses */
    emu_stream_gemm();
    const size_t na = (size_t)(g->transA ? g->K : g->M) * g->lda, nb = (size_t)(g->transB ? g->N : g->K) * g->ldb;
    const size_t nc = (size_t)g->M * g->ldc;
    float *a = widen(g->A, na), *b = widen(g->B, nb), *c = widen(kb_as_in(g->C), nc);
    float *bias = NULL;
    if (g->epi == K_EPI_BIAS || g->epi == K_EPI_GELU_AUX_BIAS) bias = widen((kb_in){g->bias, g->C.t}, g->N);
    if (g->epi == K_EPI_BGRAD_A) {
        for (int m = 0; m < g->M; m++) {
            double s = 0;
            for (int k = 0; k < g->K; k++) s += g->transA ? a[(size_t)k * g->lda + m] : a[(size_t)m * g->lda + k];
            g->dbias[m] += (float)s;
        }
    }
    k_cpu_ops.gemm(g->transA, g->transB, g->M, g->N, g->K, g->alpha, a, g->lda, b, g->ldb, g->beta, c, g->ldc, bias);
    if (g->epi == K_EPI_GELU_AUX || g->epi == K_EPI_GELU_AUX_BIAS) {
        for (int m = 0; m < g->M; m++) {
            float *row = c + (size_t)m * g->ldc;
            for (int n = 0; n < g->N; n++) g->aux[(size_t)m * g->ldaux + n] = kb_bf16_from_f32(row[n]);
            k_cpu_ops.gelu_forward(row, row, g->N);
        }
    }
    if (g->epi == K_EPI_DGELU || g->epi == K_EPI_DGELU_BGRAD) {
        float *pre = malloc(g->N * sizeof(float)), *d = malloc(g->N * sizeof(float));
        for (int m = 0; m < g->M; m++) {
            float *row = c + (size_t)m * g->ldc;
            for (int n = 0; n < g->N; n++) pre[n] = kb_f32_from_bf16(g->aux[(size_t)m * g->ldaux + n]), d[n] = 0;
            k_cpu_ops.gelu_backward(d, row, pre, g->N);
            memcpy(row, d, g->N * sizeof(float));
        }
        free(pre), free(d);
        if (g->epi == K_EPI_DGELU_BGRAD)
            for (int n = 0; n < g->N; n++) {
                double s = 0;
                for (int m = 0; m < g->M; m++) s += c[(size_t)m * g->ldc + n];
                g->dbias[n] += (float)s;
            }
    }
    store(g->C, c, nc);
    free(a), free(b), free(c), free(bias);
    return 0;
}

/* ---- attention: fp32 k_cpu_ops on the widened operands ---- */
static int emu_attn_fwd(kb_out o, float *lse, kb_in q, kb_in k, kb_in v, int B, int Sq, int Skv, int H, int Dh,
                        float scale) {
    if (kc_precond_attention_forward(o, lse, q, k, v, B, Sq, Skv, H, Dh)) return -1; /* what cuDNN refuses */
    size_t nq = (size_t)B * Sq * H * Dh, nk = (size_t)B * Skv * H * Dh;
    float *fq = widen(q, nq), *fk = widen(k, nk), *fv = widen(v, nk);
    float *fo = malloc(nq * sizeof(float));
    k_cpu_ops.attention_forward(fo, lse, fq, fk, fv, B, Sq, Skv, H, Dh, scale);
    store(o, fo, nq);
    free(fq), free(fk), free(fv), free(fo);
    return 0;
}
static int emu_attn_bwd(kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k, kb_in v, kb_in o,
                        const float *lse, int B, int Sq, int Skv, int H, int Dh, float scale) {
    if (kc_precond_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, B, Sq, Skv, H, Dh)) return -1;
    size_t nq = (size_t)B * Sq * H * Dh, nk = (size_t)B * Skv * H * Dh;
    float *fq = widen(q, nq), *fk = widen(k, nk), *fv = widen(v, nk);
    float *fo = widen(o, nq), *fd = widen(dout, nq);
    /* a gradient not wanted (NULL, as the GPU path allows) goes to a zeroed buffer that is dropped */
    float *gq = dq.p ? widen(kb_as_in(dq), nq) : calloc(nq, sizeof(float));
    float *gk = dk.p ? widen(kb_as_in(dk), nk) : calloc(nk, sizeof(float));
    float *gv = dv.p ? widen(kb_as_in(dv), nk) : calloc(nk, sizeof(float));
    if (!gq || !gk || !gv) abort();
    k_cpu_ops.attention_backward(gq, gk, gv, fd, fq, fk, fv, fo, lse, B, Sq, Skv, H, Dh, scale);
    if (dq.p) store(dq, gq, nq);
    if (dk.p) store(dk, gk, nk);
    if (dv.p) store(dv, gv, nk);
    free(fq), free(fk), free(fv), free(fo), free(fd), free(gq), free(gk), free(gv);
    return 0;
}

/* ---- layer, flow, optimizer and glue ops: the kb_host drivers ---- */
static int e_ln_f(kb_out out, float *mean, float *rstd, kb_in x, kb_in w, kb_in b, int N, int C, float eps) {
    return kbh_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps), 0;
}
static int e_ln_b(kb_out dx, kb_out dw, kb_out db, kb_in dout, kb_in x, kb_in w, const float *mean, const float *rstd,
                  int N, int C) {
    return kbh_norm_backward(0, dx, dw, db, dout, x, w, mean, rstd, N, C), 0;
}
static int e_rms_f(kb_out out, float *rstd, kb_in x, kb_in w, int N, int C, float eps) {
    return kbh_rmsnorm_forward(out, rstd, x, w, N, C, eps), 0;
}
static int e_rms_b(kb_out dx, kb_out dw, kb_in dout, kb_in x, kb_in w, const float *rstd, int N, int C) {
    kb_out none = {NULL, KB_F32};
    return kbh_norm_backward(1, dx, dw, none, dout, x, w, NULL, rstd, N, C), 0;
}
static int e_rope_f(kb_out out, kb_in x, const float *c, const float *s, int B, int S, int H, int Dh) {
    if (kc_precond_index32("rope_forward", (size_t)B * S * H * Dh)) return -1; /* as the kernel's launcher */
    return kbh_rope(0, out, x, c, s, B, S, H, Dh), 0;
}
static int e_rope_b(kb_out dx, kb_in dout, const float *c, const float *s, int B, int S, int H, int Dh) {
    if (kc_precond_index32("rope_backward", (size_t)B * S * H * Dh)) return -1;
    return kbh_rope(1, dx, dout, c, s, B, S, H, Dh), 0;
}
static int e_gelu_f(kb_out out, kb_in x, int64_t n) { return kbh_act_forward(1, out, x, n), 0; }
static int e_gelu_b(kb_out dx, kb_in dout, kb_in x, int64_t n) { return kbh_act_backward(1, dx, dout, x, n), 0; }
static int e_silu_f(kb_out out, kb_in x, int64_t n) { return kbh_act_forward(0, out, x, n), 0; }
static int e_silu_b(kb_out dx, kb_in dout, kb_in x, int64_t n) { return kbh_act_backward(0, dx, dout, x, n), 0; }
static int e_mod_f(kb_out out, kb_in x, kb_in sh, kb_in sc, int B, int S, int D, int pt, int ms) {
    if (kc_precond_index32("modulate_forward", (size_t)B * S * D)) return -1;
    return kbh_modulate_forward(out, x, sh, sc, B, S, D, pt, ms), 0;
}
static int e_mod_b(kb_out dx, kb_out dsh, kb_out dsc, kb_in dout, kb_in x, kb_in sc, int B, int S, int D, int pt,
                   int ms) {
    if (kc_precond_index32("modulate_backward", (size_t)B * S * D)) return -1;
    return kbh_modulate_backward(dx, dsh, dsc, dout, x, sc, B, S, D, pt, ms), 0;
}
static int e_gate_f(kb_out out, kb_in x, kb_in y, kb_in g, int B, int S, int D, int pt, int ms) {
    if (kc_precond_index32("gate_residual_forward", (size_t)B * S * D)) return -1;
    return kbh_gate_residual_forward(out, x, y, g, B, S, D, pt, ms), 0;
}
static int e_gate_b(kb_out dx, kb_out dy, kb_out dg, kb_in dout, kb_in y, kb_in g, int B, int S, int D, int pt,
                    int ms) {
    if (kc_precond_index32("gate_residual_backward", (size_t)B * S * D)) return -1;
    return kbh_gate_residual_backward(dx, dy, dg, dout, y, g, B, S, D, pt, ms), 0;
}
#define PATCH_FN(name, drv, op)                                                                                \
    static int name(kb_out y, kb_in x, int B, int C, int F, int H, int W, int pt, int ph, int pw) {            \
        kb_patch_dims d = kb_patch_dims_make(B, C, F, H, W, pt, ph, pw);                                        \
        if (kc_precond_index32(op, kb_patch_tokens_n(&d)) || kc_precond_index32(op, kb_patch_video_n(&d)))      \
            return -1;                                                                                          \
        return drv(y, x, &d), 0;                                                                                \
    }
PATCH_FN(e_pf, kbh_patchify_forward, "patchify_forward")
PATCH_FN(e_pb, kbh_patchify_backward, "patchify_backward")
PATCH_FN(e_uf, kbh_unpatchify_forward, "unpatchify_forward")
PATCH_FN(e_ub, kbh_unpatchify_backward, "unpatchify_backward")
static int e_lse_f(kb_out o, float *l, kb_in o1, const float *l1, kb_in o2, const float *l2, int B, int S, int H,
                   int Dh) {
    if (kc_precond_index32("lse_merge_forward", (size_t)B * S * H * Dh)) return -1;
    return kbh_lse_merge_forward(o, l, o1, l1, o2, l2, B, S, H, Dh), 0;
}
static int e_lse_b(kb_out do1, float *dl1, kb_out do2, float *dl2, kb_in dout, const float *dl, kb_in o1,
                   const float *l1, kb_in o2, const float *l2, int B, int S, int H, int Dh) {
    if (kc_precond_index32("lse_merge_backward", (size_t)B * S * H * Dh)) return -1;
    return kbh_lse_merge_backward(do1, dl1, do2, dl2, dout, dl, o1, l1, o2, l2, B, S, H, Dh), 0;
}
static int e_sde(kb_in x, kb_in v, kb_in eps, kb_in given, kb_out mean, kb_out xn, float cx, float cv, float sd,
                 int want, int64_t n, float *sum) {
    float s = kbh_sde_step(x, v, eps, given, mean, xn, cx, cv, sd, want, n);
    if (sum) *sum = s;
    return 0;
}
static int e_sqd(kb_in a, kb_in b, int64_t n, float *sum) {
    *sum = kbh_sq_diff_sum(a, b, n);
    return 0;
}
static int e_dv(kb_out dv, kb_in m, kb_in xn, kb_in mr, float gl, float gk, float k, int64_t n) {
    return kbh_sde_backward_v(dv, m, xn, mr, gl, gk, k, n), 0;
}
static int e_cfg(kb_out v, kb_in vc, kb_in vu, float g, int64_t n) { return kbh_cfg_combine(v, vc, vu, g, n), 0; }
static int e_cfgb(kb_out a, kb_out b, kb_in dv, float g, int64_t n) { return kbh_cfg_backward(a, b, dv, g, n), 0; }
static int e_adamw(float *p, float *m, float *v, kb_in g, const uint8_t *mask, kb_adamw_scalars s, kb_bf16 *pb,
                   int64_t n) {
    if (emu_stream_joined("adamw_update")) return -1;
    return kbh_adamw(p, m, v, g, mask, s, pb, n), 0;
}
static int e_sumsq(kb_in x, int64_t n, double *out) {
    if (emu_stream_joined("sumsq")) return -1;
    *out = kbh_sumsq(x, n);
    return 0;
}
static int e_scale(kb_out x, float f, int64_t n) {
    if (emu_stream_joined("scale")) return -1;
    for (int64_t i = 0; i < n; i++) kb_set(x, (size_t)i, kb_get(kb_as_in(x), (size_t)i) * f);
    return 0;
}
static int e_add(kb_out y, kb_in x, int64_t n) {
    for (int64_t i = 0; i < n; i++) kb_acc(y, (size_t)i, kb_get(x, (size_t)i));
    return 0;
}
static int e_table_f(kb_out out, kb_in table, kb_in src, int R, int nj, int D, int src_nj) {
    if (R < 0 || nj < 1 || D < 1 || (src_nj != 1 && src_nj != nj))
        return core_error("add_table_forward: R %d, nj %d, D %d, src_nj %d (1 or nj)", R, nj, D, src_nj);
    if (kc_precond_index32("add_table_forward", (size_t)R * nj * D)) return -1;
    return kbh_add_table_forward(out, table, src, R, nj, D, src_nj), 0;
}
static int e_table_b(kb_out dtable, kb_out dsrc, kb_in dmod, int R, int nj, int D, int src_nj) {
    if (R < 0 || nj < 1 || D < 1 || (src_nj != 1 && src_nj != nj))
        return core_error("add_table_backward: R %d, nj %d, D %d, src_nj %d (1 or nj)", R, nj, D, src_nj);
    if (kc_precond_index32("add_table_backward", (size_t)R * nj * D)) return -1;
    return kbh_add_table_backward(dtable, dsrc, dmod, R, nj, D, src_nj), 0;
}

static int e_block_sum(float *out, const float *blocks, int nb, int64_t stride, int64_t n) {
    if (nb < 1 || n < 0 || stride < n)
        return core_error("block_sum: nb %d, stride %lld, n %lld", nb, (long long)stride, (long long)n);
    if (emu_stream_launch("block_sum")) return -1;
    for (int64_t i = 0; i < n; i++) out[i] = kb_blocksum_at(blocks, nb, stride, i);
    return 0;
}

/* ---- the umT5 encoder (kernels/body/kb_t5.h's rows, as the CUDA kernels) ---- */
static int e_t5_attn(kb_out o, kb_in q, kb_in k, kb_in v, const float *rel_bias, const int *bucket_of,
                     const int32_t *mask, int B, int S, int H, int Dk) {
    if (kc_precond_t5_attention(o, q, k, v, rel_bias, bucket_of, B, S, H, Dk)) return -1;
    float *sc = malloc((size_t)S * sizeof(float));
    if (!sc) return core_error("t5_attention: out of memory");
    kbh_t5_attention(o, q, k, v, rel_bias, bucket_of, mask, B, S, H, Dk, sc);
    free(sc);
    return 0;
}
static int e_t5_ggelu(kb_out g, kb_in a0, kb_in a1, int64_t n) {
    if (n < 0) return core_error("t5_gated_gelu: n = %lld must be >= 0", (long long)n);
    if (kc_precond_index32("t5_gated_gelu", (size_t)n)) return -1;
    return kbh_t5_gated_gelu(g, a0, a1, n), 0;
}

/* ---- the Wan VAE decoder: kc_vae.h's host drivers over this GEMM and copy, emu_vae.c's bodies ---- */
static const kc_vae_backend vae_be = {"emulated", emu_gemm, e_copy2d, k_emu_vae_im2col, k_emu_vae_softmax};
static int e_vae_conv(const k_vae_conv_args *a) { return kc_vae_conv3d(&vae_be, a); }
static int e_vae_attn(kb_out o, kb_in q, kb_in k, kb_in v, int S, int C, float scale, void *work, size_t bytes) {
    return kc_vae_attention(&vae_be, o, q, k, v, S, C, scale, work, bytes);
}

/* ---- the weight sync's device-to-device path ---- */
static int e_round_bf16(kb_bf16 *dst, const float *src, int64_t n) {
    if (n < 0) return core_error("mem_round_bf16: n %lld", (long long)n);
    for (int64_t i = 0; i < n; i++) dst[i] = kb_bf16_from_f32(src[i]);
    return 0;
}

const k_dev_ops k_emu_ops = {
    .name = "emulated",
    .gemm = emu_gemm,
    .layernorm_forward = e_ln_f,
    .layernorm_backward = e_ln_b,
    .rmsnorm_forward = e_rms_f,
    .rmsnorm_backward = e_rms_b,
    .rope_forward = e_rope_f,
    .rope_backward = e_rope_b,
    .gelu_forward = e_gelu_f,
    .gelu_backward = e_gelu_b,
    .silu_forward = e_silu_f,
    .silu_backward = e_silu_b,
    .modulate_forward = e_mod_f,
    .modulate_backward = e_mod_b,
    .gate_residual_forward = e_gate_f,
    .gate_residual_backward = e_gate_b,
    .patchify_forward = e_pf,
    .patchify_backward = e_pb,
    .unpatchify_forward = e_uf,
    .unpatchify_backward = e_ub,
    .attention_forward = emu_attn_fwd,
    .attention_backward = emu_attn_bwd,
    .lse_merge_forward = e_lse_f,
    .lse_merge_backward = e_lse_b,
    .sde_step = e_sde,
    .sq_diff_sum = e_sqd,
    .sde_backward_v = e_dv,
    .cfg_combine = e_cfg,
    .cfg_backward = e_cfgb,
    .adamw_update = e_adamw,
    .sumsq = e_sumsq,
    .scale = e_scale,
    .mem_alloc = e_alloc,
    .mem_free = e_free,
    .mem_upload = e_upload,
    .mem_download = e_download,
    .mem_upload_bf16 = e_upload_bf16,
    .mem_download_bf16 = e_download_bf16,
    .mem_zero = e_zero,
    .mem_copy2d = e_copy2d,
    .mem_sync = e_sync,
    .mem_info = e_mem_info,
    .ipc_export = k_emu_ipc_export,
    .ipc_unexport = k_emu_ipc_unexport,
    .ipc_open = k_emu_ipc_open,
    .ipc_close = k_emu_ipc_close,
    .add = e_add,
    .add_table_forward = e_table_f,
    .add_table_backward = e_table_b,
    .block_sum = e_block_sum,
    /* the umT5 encoder */
    .t5_attention = e_t5_attn,
    .t5_gated_gelu = e_t5_ggelu,
    /* streams and events */
    .stream_new = emu_stream_new,
    .stream_free = emu_stream_free,
    .event_new = emu_event_new,
    .event_free = emu_event_free,
    .event_record = emu_event_record,
    .stream_wait = emu_stream_wait,
    .stream_use = emu_stream_use,
    /* the Wan VAE decoder */
    .vae_conv3d = e_vae_conv,
    .vae_rms_norm = k_emu_vae_rms_norm,
    .vae_dupup_add = k_emu_vae_dupup_add,
    .vae_attention = e_vae_attn,
    /* the weight sync's device-to-device path */
    .mem_round_bf16 = e_round_bf16,
};
