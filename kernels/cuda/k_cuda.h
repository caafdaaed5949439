/* kernels/cuda/k_cuda.h — the CUDA backend: the device op table k_cuda_ops, device memory helpers and the facts of
 * the GPU and libraries in use. Built only by `make cuda` (nvcc for the kernels, cuBLASLt for GEMM, cuDNN for
 * attention); a CPU-only build compiles none of kernels/cuda/ except absent.c, which answers k_cuda_available (see
 * kernels/kernels.h) with "built without the CUDA backend". Status: compiled and linked, never run on a GPU yet
 * (kernels/cuda/README.md says what has and has not run).
 *
 * The device op table k_dev_ops, its GEMM arguments and epilogues are kernels/dev_ops.h's (the backend interface the
 * Wan DiT is written over; the CPU fills it too). Here every pointer is device memory and every entry returns 0, or
 * -1 with a message (core_error): a bad argument, a launch failure, or for GEMM and attention a shape no deterministic
 * algorithm supports.
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
#include "kernels/dev_ops.h"

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
/* height rows of width bytes, device to device on the stream (cudaMemcpy2DAsync; k_dev_ops.mem_copy2d). */
int k_dev_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height);
/* Waits for all work on the stream; reports an asynchronous error of an earlier launch. */
int k_dev_sync(void);
/* Free and total bytes of the device's memory now (cudaMemGetInfo). 0, or -1 with core_error. */
int k_dev_mem_info(size_t *free_bytes, size_t *total_bytes);
/* CUDA IPC (kernels/dev_ops.h ipc_*): cudaIpcGetMemHandle of the allocation dev starts; nothing to release;
 * cudaIpcOpenMemHandle (lazy peer access) / cudaIpcCloseMemHandle. 0, or -1 with core_error. */
int k_dev_ipc_export(const void *dev, size_t bytes, uint8_t *handle);
int k_dev_ipc_unexport(const uint8_t *handle);
int k_dev_ipc_open(const uint8_t *handle, size_t bytes, const void **dev);
int k_dev_ipc_close(const void *dev);

/* ---- GEMM ---- */

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

/* ---- The device op table (kernels/dev_ops.h) ---- */

/* The CUDA backend's table; use only after k_cuda_init (or k_cuda_available) succeeded. */
extern const k_dev_ops k_cuda_ops;

#ifdef __cplusplus
}
#endif

#endif
