/* kernels/cuda/k_cuda.h — the CUDA backend: the device op table k_cuda_ops, device memory helpers and the facts of
 * the GPU and libraries in use. Built only by `make cuda` (nvcc for the kernels, cuBLASLt for GEMM, cuDNN for
 * attention); a CPU-only build compiles none of kernels/cuda/ except absent.c, which answers k_cuda_available (see
 * kernels/kernels.h) with "built without the CUDA backend". Status: compiled and linked, never run on a GPU yet
 * (kernels/cuda/README.md says what has and has not run).
 *
 * Why a parallel table instead of k_ops entries. The GPU keeps activations in bf16 (docs/design.md section 4: weights
 * and activations bf16, norm statistics, LSE, master weights, optimizer state and parameter gradients fp32), so the
 * float * signatures of k_ops do not fit. k_dev_ops has one entry per k_ops entry with the same meaning, shapes and
 * conventions (row-major [B, S, D]; heads [B, S, H, Dh]; LSE [B, H, S]; forwards overwrite; backwards ACCUMULATE
 * into every gradient; NULL / .p == NULL for gradients not wanted where kernels.h allows it), plus the flow and
 * optimizer entries model/flow and trainer/ will need on the GPU, the device memory entries and the Wan DiT's glue
 * (model/dit/wan_dev.h holds the whole device in one const k_dev_ops *, so the emulated device of
 * kernels/cuda/emu/k_emu.h runs the same model code in `make test`). Tensors whose dtype is the caller's choice are
 * typed views (kb_in / kb_out of kernels/body/kb_base.h: fp32 or bf16 storage, fp32 arithmetic); the fp32-only ones
 * (statistics, LSE, RoPE tables, master weights, moments) are float *; attention operands are bf16 (cuDNN's fused
 * attention takes bf16). Every pointer is device memory. Every entry returns 0, or -1 with a message (core_error):
 * a bad argument, a launch failure, or for GEMM and attention a shape no deterministic algorithm supports.
 *
 * Determinism: every kernel of ours writes each output element from one thread in a fixed order (no atomics);
 * GEMM algorithms are pinned per problem class (all but M: batch-invariant) with no split-K; the attention backward is
 * cuDNN's deterministic variant (no atomic dQ accumulation; the engine notes cannot tell, attn_cudnn.c), one plan per
 * (sequence lengths, heads, head dimension) for every batch size. All work runs on one stream (k_cuda_stream);
 * entries return without waiting, except those that hand a scalar back to the host (sde_step, sq_diff_sum, sumsq),
 * which wait for it. */
#ifndef KERNELS_CUDA_K_CUDA_H
#define KERNELS_CUDA_K_CUDA_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/body/kb_base.h"
#include "kernels/body/kb_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/kernels.h"

/* ---- Start-up and facts ---- */

/* Loads cuBLASLt and cuDNN (dlopen: $VGRPO_CUBLASLT_LIB / $VGRPO_CUDNN_LIB when set, else the sonames
 * libcublasLt.so.13 and libcudnn.so.9 through the usual search, which includes this binary's run path
 * /usr/local/cuda/lib64), picks GPU 0, creates the stream and the library handles. Idempotent. Returns 0, or -1 with
 * one line in why (K_WHY_MAX bytes, may be NULL) and in core_error: no CUDA driver or GPU, a GPU that is not compute
 * capability 9.x (this build carries sm_90a code only), a library not found or too old (cuDNN < 9.13 has no fused
 * attention descriptor). k_cuda_available (kernels.h) calls this. */
int k_cuda_init(char *why);

/* Releases handles, caches and scratch memory (safe when never initialised). */
void k_cuda_shutdown(void);

typedef struct k_cuda_info {
    char gpu[256];               /* device name */
    int cc_major, cc_minor;      /* compute capability */
    int sm_count;
    size_t mem_bytes;            /* device memory */
    int driver_version;          /* cudaDriverGetVersion, e.g. 13000 */
    int runtime_version;         /* cudaRuntimeGetVersion of the (static) runtime linked in */
    size_t cublaslt_version;     /* cublasLtGetVersion of the library loaded, e.g. 130100 */
    size_t cudnn_version;        /* cudnnGetVersion of the library loaded, e.g. 91900 */
    char cublaslt_path[512];     /* file the library was loaded from */
    char cudnn_path[512];
} k_cuda_info;

/* Facts of the initialised backend. Returns 0, or -1 when k_cuda_init has not succeeded. */
int k_cuda_get_info(k_cuda_info *info);

/* The stream every entry runs on (a cudaStream_t, as void * so that this header needs no CUDA header). */
void *k_cuda_stream(void);

/* ---- Device memory ---- */

/* cudaMalloc'd bytes (NULL and core_error on failure; never managed memory). */
void *k_dev_alloc(size_t bytes);
void k_dev_free(void *p);
/* Copies on the stream, waiting for completion. */
int k_dev_upload(void *dst_dev, const void *src_host, size_t bytes);
int k_dev_download(void *dst_host, const void *src_dev, size_t bytes);
/* n floats rounded to bf16 on the host (kb_bf16_from_f32) and uploaded; bf16 downloaded and widened exactly. */
int k_dev_upload_bf16(kb_bf16 *dst_dev, const float *src_host, size_t n);
int k_dev_download_bf16(float *dst_host, const kb_bf16 *src_dev, size_t n);
int k_dev_zero(void *p, size_t bytes);
/* Waits for all work on the stream; reports an asynchronous error of an earlier launch. */
int k_dev_sync(void);
/* Free and total bytes of the device's memory now (cudaMemGetInfo). 0, or -1 with core_error. */
int k_dev_mem_info(size_t *free_bytes, size_t *total_bytes);

/* ---- GEMM ---- */

/* Epilogues of the GEMM, fused by cuBLASLt (row-major terms; C is [M, N]):
 *   K_EPI_NONE            C = alpha op(A) op(B) + beta C
 *   K_EPI_BIAS            ... + bias[n]                                  (bias [N], C's dtype)
 *   K_EPI_GELU_AUX        aux = alpha op(A) op(B); C = gelu_tanh(aux)    (beta must be 0)
 *   K_EPI_GELU_AUX_BIAS   aux = alpha op(A) op(B) + bias; C = gelu_tanh(aux)
 *   K_EPI_DGELU           C = (alpha op(A) op(B)) * gelu_tanh'(aux)      (beta 0; aux from the forward)
 *   K_EPI_DGELU_BGRAD     as K_EPI_DGELU, and dbias[n] += sum_m C[m, n]  (the first FFN linear's bias gradient)
 *   K_EPI_BGRAD_A         C as K_EPI_NONE, and dbias[m] += sum_k op(A)[m, k] (the weight-gradient GEMM
 *                         dW = dY^T X, with A = dY stored [tokens, out] and transA: dbias = column sums of dY)
 * aux: [M, N] bf16 row-major with row stride ldaux (a multiple of 8, >= N). dbias: fp32, accumulated (+=) through a
 * scratch vector, since cuBLASLt writes its bias gradient (in C's dtype). */
typedef enum {
    K_EPI_NONE = 0,
    K_EPI_BIAS,
    K_EPI_GELU_AUX,
    K_EPI_GELU_AUX_BIAS,
    K_EPI_DGELU,
    K_EPI_DGELU_BGRAD,
    K_EPI_BGRAD_A,
} k_epilogue;

/* One GEMM, with kernels.h's gemm conventions: C[M, N] = alpha op(A) op(B) + beta C, row-major; op(A) is [M, K]
 * (A stored [M, K], or [K, M] with transA); op(B) is [K, N] (B stored [K, N], or [N, K] with transB). A, B typed
 * views: bf16 on the CUDA table and the emulated device (cuBLASLt's operands; an fp32 A or B is refused, naming it),
 * fp32 on the CPU table (kernels/cpu/dev_table.h); C bf16 or fp32 (c.t), fp32 accumulation and scaling. Leading
 * dimensions in elements; pointers 16-byte aligned, leading dimensions multiples of 8 (cuBLASLt's fast paths need
 * both; refused otherwise). */
typedef struct k_gemm_args {
    int transA, transB, M, N, K;
    float alpha, beta;
    kb_in A;
    int lda;
    kb_in B;
    int ldb;
    kb_out C;
    int ldc;
    k_epilogue epi;
    const void *bias; /* K_EPI_BIAS, K_EPI_GELU_AUX_BIAS: [N] in C's dtype */
    kb_bf16 *aux;     /* GELU epilogues: [M, N] pre-activation, written (forward) or read (backward) */
    int ldaux;
    float *dbias;     /* BGRAD epilogues: fp32, += */
} k_gemm_args;

/* The algorithm a GEMM problem was pinned to (for reports); -1 if the problem has not run yet. One algorithm per
 * problem class (all but M), chosen at canonical_m and checked at each M (kernels/cuda/gemm_plan.h); workspace is
 * the bytes it needs at this M. bgrad_fallback: K_EPI_BGRAD_A ran as a plain GEMM plus the fixed-order column sum. */
typedef struct k_gemm_algo_info {
    int algo_id, tile_id, splitk, stages, cta_swizzle;
    size_t workspace;
    int canonical_m, bgrad_fallback;
} k_gemm_algo_info;
int k_gemm_algo_of(const k_gemm_args *g, k_gemm_algo_info *out);

/* How K_EPI_BGRAD_A's bias gradient is computed: AUTO (cuBLASLt's BGRADB when it offers a kernel for the problem
 * class, else the fallback), FUSED (BGRADB or an error), FALLBACK (a plain GEMM, then a fixed-order column sum:
 * kernels/body/kb_colsum.h). Default AUTO; $VGRPO_GEMM_BGRAD=auto|fused|fallback at k_cuda_init. Part of the
 * algorithm cache key, so switching takes effect for the next call. 0, or -1 with core_error. */
typedef enum { K_GEMM_BGRAD_AUTO = 0, K_GEMM_BGRAD_FUSED, K_GEMM_BGRAD_FALLBACK } k_gemm_bgrad_mode;
int k_gemm_set_bgrad_mode(k_gemm_bgrad_mode m);
int k_gemm_bgrad_mode_parse(const char *s, k_gemm_bgrad_mode *m);

/* `vgrpo gemm-plan` (kernels/cuda/gemm_lt_selftest.c): loads cuBLASLt, reports what cublasLtCreate answers here,
 * builds every GEMM class the Wan DiT uses with the real library (descriptors, layouts, preference: no GPU needed)
 * and reads each attribute back against kc_gemm_lt_view; with a GPU, also the algorithm planned at the canonical M
 * and checked at M = 1, 2 and 8 x tokens. Prints to out; 0 when every check passed, -1 with core_error otherwise
 * (the plain build: "built without the CUDA backend"). */
int k_gemm_plan_selftest(FILE *out);
/* `vgrpo gemm-plan --bgrad` (GPU only): the weight-gradient GEMM with its bias gradient at the Wan 1.3B's shapes
 * (dW of a 1536 x 1536 linear and of the FFN up, K = 8 x 1560 tokens), fused BGRADB vs the fallback vs the plain GEMM
 * alone: ms per call (mean of reps) and the bias gradient's error against a double column sum. The measurement that
 * decides which path to keep. 0, or -1 with core_error (no GPU: k_cuda_init's reason). */
int k_gemm_bgrad_compare(FILE *out, int reps);

/* ---- Attention ---- */

/* The cuDNN engine an attention problem was pinned to (global engine index, workspace bytes of one call). B is
 * ignored: one plan serves every batch size. Returns 0 for the deterministic backward (and every forward), 1 for the
 * atomic-dQ backward (only built after the call below), -1 when the problem has not run. */
int k_attention_engine_of(int backward, int B, int Sq, int Skv, int H, int Dh, int64_t *engine_id, size_t *workspace);

/* Measurements only (the GPU check): 1 = backwards from now on use cuDNN's atomic-dQ graph (fp32 dQ accumulated
 * with atomics: not bitwise repeatable, small workspace), so that a speed can be reported where the deterministic
 * plan fails. Training never calls this. */
void k_attention_allow_nondeterministic(int allow);

/* `vgrpo gpu-plans` (attn_plans.c): builds every cuDNN attention graph the Wan DiT runs (self and cross, forward
 * and deterministic backward, tiny / Wan 1.3B / A14B shapes) for a described GPU (gpu "h100" or "h200") and
 * prints one line per plan to out: "plan <gpu> <shape> <self|cross> <key>: finalised|compiled engine E knobs K
 * notes N workspace W extra X configs C build T s", "compiled" meaning NVRTC built the kernel and only loading it
 * needed a GPU driver. fused: also the fused SDPA_FWD/SDPA_BWD operations and the atomic-dQ backward at the tiny
 * shape (their failures are reported, not counted); verbose: every configuration the heuristics offered. Needs no
 * GPU (the toolkit's driver stub stands in when libcuda.so.1 is absent); never call it in a process using the GPU.
 * 0, or -1 with core_error (cuDNN or NVRTC missing or too old, a DiT plan failed). */
int k_cuda_attention_plans(FILE *out, const char *gpu, int fused, int verbose);

/* ---- The device op table ---- */

typedef struct k_dev_ops {
    const char *name; /* "cuda-bf16" */

    int (*gemm)(const k_gemm_args *g);

    int (*layernorm_forward)(kb_out out, float *mean, float *rstd, kb_in x, kb_in w, kb_in b, int N, int C,
                             float eps);
    int (*layernorm_backward)(kb_out dx, kb_out dw, kb_out db, kb_in dout, kb_in x, kb_in w, const float *mean,
                              const float *rstd, int N, int C);
    int (*rmsnorm_forward)(kb_out out, float *rstd, kb_in x, kb_in w, int N, int C, float eps);
    int (*rmsnorm_backward)(kb_out dx, kb_out dw, kb_in dout, kb_in x, kb_in w, const float *rstd, int N, int C);

    int (*rope_forward)(kb_out out, kb_in x, const float *cos, const float *sin, int B, int S, int H, int Dh);
    int (*rope_backward)(kb_out dx, kb_in dout, const float *cos, const float *sin, int B, int S, int H, int Dh);

    int (*gelu_forward)(kb_out out, kb_in x, int64_t n);
    int (*gelu_backward)(kb_out dx, kb_in dout, kb_in x, int64_t n);
    int (*silu_forward)(kb_out out, kb_in x, int64_t n);
    int (*silu_backward)(kb_out dx, kb_in dout, kb_in x, int64_t n);

    int (*modulate_forward)(kb_out out, kb_in x, kb_in shift, kb_in scale, int B, int S, int D, int per_token,
                            int mod_stride);
    int (*modulate_backward)(kb_out dx, kb_out dshift, kb_out dscale, kb_in dout, kb_in x, kb_in scale, int B, int S,
                             int D, int per_token, int mod_stride);
    int (*gate_residual_forward)(kb_out out, kb_in x, kb_in y, kb_in gate, int B, int S, int D, int per_token,
                                 int mod_stride);
    int (*gate_residual_backward)(kb_out dx, kb_out dy, kb_out dgate, kb_in dout, kb_in y, kb_in gate, int B, int S,
                                  int D, int per_token, int mod_stride);

    int (*patchify_forward)(kb_out out, kb_in x, int B, int C, int F, int H, int W, int pt, int ph, int pw);
    int (*patchify_backward)(kb_out dx, kb_in dout, int B, int C, int F, int H, int W, int pt, int ph, int pw);
    int (*unpatchify_forward)(kb_out out, kb_in x, int B, int C, int F, int H, int W, int pt, int ph, int pw);
    int (*unpatchify_backward)(kb_out dx, kb_in dout, int B, int C, int F, int H, int W, int pt, int ph, int pw);

    /* Attention (SDPA): q [B, Sq, H, Dh], k, v [B, Skv, H, Dh], o [B, Sq, H, Dh] typed views; lse [B, H, Sq] fp32
     * natural log (softmax statistics). On the CUDA table cuDNN's fused attention: every view bf16 (an fp32 one is
     * refused, naming it), Dh a multiple of 8, at most 128 for the backward; on the CPU table every view fp32. */
    int (*attention_forward)(kb_out o, float *lse, kb_in q, kb_in k, kb_in v, int B, int Sq, int Skv, int H, int Dh,
                             float scale);
    /* dq, dk, dv += (.p NULL: not wanted; on the GPU through scratch buffers: cuDNN writes its gradients). Needs
     * cuDNN >= 9.19 (attn_libs.c: the version the composite graphs are verified with). */
    int (*attention_backward)(kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k, kb_in v, kb_in o,
                              const float *lse, int B, int Sq, int Skv, int H, int Dh, float scale);

    int (*lse_merge_forward)(kb_out o, float *lse, kb_in o1, const float *lse1, kb_in o2, const float *lse2, int B,
                             int S, int H, int Dh);
    int (*lse_merge_backward)(kb_out do1, float *dlse1, kb_out do2, float *dlse2, kb_in dout, const float *dlse,
                              kb_in o1, const float *lse1, kb_in o2, const float *lse2, int B, int S, int H, int Dh);

    /* ---- flow (model/flow on the GPU; kernels/body/kb_flow.h) ----
     * One SDE step (kb_sde_chunk): mean / x_next per element, and in *sum_out (host) the fixed-order sum of
     * (x_next - mean)^2 when want_sum (the caller forms the log-prob from it as flow_sde_step does). */
    int (*sde_step)(kb_in x, kb_in v, kb_in eps, kb_in given, kb_out mean_out, kb_out x_next_out, float coef_x,
                    float coef_v, float step_std, int want_sum, int64_t n, float *sum_out);
    /* Fixed-order sum of (a - b)^2 into *sum_out (host): the KL's sum. */
    int (*sq_diff_sum)(kb_in a, kb_in b, int64_t n, float *sum_out);
    /* dv = k (g_logp (x_next - mean) + g_kl (mean - mean_ref)) (written, as flow_sde_backward_v). */
    int (*sde_backward_v)(kb_out dv, kb_in mean, kb_in x_next, kb_in mean_ref, float g_logp, float g_kl, float k,
                          int64_t n);
    int (*cfg_combine)(kb_out v, kb_in vc, kb_in vu, float g, int64_t n);
    int (*cfg_backward)(kb_out dvc, kb_out dvu, kb_in dv, float g, int64_t n);

    /* ---- optimizer (trainer/optim on the GPU; kernels/body/kb_optim.h) ----
     * AdamW over fp32 master weights and moments; wd_mask (device, may be NULL); p_bf16 (may be NULL) receives the
     * bf16 compute copy. */
    int (*adamw_update)(float *p, float *m, float *v, kb_in g, const uint8_t *wd_mask, kb_adamw_scalars s,
                        kb_bf16 *p_bf16, int64_t n);
    /* optim_sumsq's fixed-order sum of squares into *out (host, double). */
    int (*sumsq)(kb_in x, int64_t n, double *out);
    /* x *= f (gradient clipping; f already rounded to fp32 as optim_scale does). */
    int (*scale)(kb_out x, float f, int64_t n);

    /* ---- device memory: the k_dev_* helpers above (on the emulated device, kernels/cuda/emu/k_emu.h: host memory),
     * so that code above kernels/ holds the whole device in one const k_dev_ops * (model/dit/wan_dev.h). ---- */
    void *(*mem_alloc)(size_t bytes);
    void (*mem_free)(void *p);
    int (*mem_upload)(void *dst_dev, const void *src_host, size_t bytes);
    int (*mem_download)(void *dst_host, const void *src_dev, size_t bytes);
    int (*mem_upload_bf16)(kb_bf16 *dst_dev, const float *src_host, size_t n);
    int (*mem_download_bf16)(float *dst_host, const kb_bf16 *src_dev, size_t n);
    int (*mem_zero)(void *p, size_t bytes);
    int (*mem_sync)(void);
    /* Free and total device memory (the start-up estimate's bound); -1 when the device has none to say (the emulated
     * device: host memory, unless its tests set VGRPO_EMULATE_DEVICE_MIB). */
    int (*mem_info)(size_t *free_bytes, size_t *total_bytes);

    /* ---- the glue of the Wan DiT (model/dit/wan_layers.c's helpers on the device; kernels/body/kb_modulate.h) ----
     * y += x, n elements (k_cpu_axpy1; into a zeroed y: a dtype conversion). */
    int (*add)(kb_out y, kb_in x, int64_t n);
    /* out[r, j, :] = table[j, :] + src[r, j, :] (src_nj == nj) or src[r, 0, :] (src_nj == 1): k_cpu_add_table.
     * out [R, nj, D], table [nj, D], src [R, src_nj, D]. */
    int (*add_table_forward)(kb_out out, kb_in table, kb_in src, int R, int nj, int D, int src_nj);
    /* k_cpu_add_table_bwd: dtable[j, :] += sum over r in order of dmod[r, j, :] (one thread per column);
     * dsrc[r, j, :] += dmod[r, j, :], or with src_nj == 1 dsrc[r, 0, :] += dmod[r, j, :] for j in order. dtable.p,
     * dsrc.p may be NULL. */
    int (*add_table_backward)(kb_out dtable, kb_out dsrc, kb_in dmod, int R, int nj, int D, int src_nj);
} k_dev_ops;

/* The CUDA backend's table; use only after k_cuda_init (or k_cuda_available) succeeded. */
extern const k_dev_ops k_cuda_ops;

#ifdef __cplusplus
}
#endif

#endif
