/* kernels/dev_ops.h — the backend interface the Wan DiT (model/dit/) is written over: the device op table k_dev_ops,
 * with one entry per op on typed tensor views that say their dtype, plus the memory entries, so that one forward and
 * backward run on any backend that fills it. Its implementations:
 *   k_cpu_dev_ops  kernels/cpu/dev_table.h: the fp32 CPU backend (host memory; each entry a k_ops call of
 *                  kernels/kernels.h, so the CPU model keeps its bits);
 *   k_cuda_ops     kernels/cuda/k_cuda.h: the CUDA backend (bf16 activations, cuBLASLt, cuDNN; `make cuda`);
 *   k_emu_ops      kernels/cuda/emu/k_emu.h: the emulated device (host memory, the kernel bodies; `make test`).
 *
 * Why a table beside k_ops. The GPU keeps activations in bf16 (docs/design.md section 4: weights and activations
 * bf16, norm statistics, LSE, master weights, optimizer state and parameter gradients fp32), so the float *
 * signatures of k_ops do not fit. k_dev_ops has one entry per k_ops entry with the same meaning, shapes and
 * conventions (row-major [B, S, D]; heads [B, S, H, Dh]; LSE [B, H, S]; forwards overwrite; backwards ACCUMULATE
 * into every gradient; NULL / .p == NULL for gradients not wanted where kernels.h allows it), plus the flow and
 * optimizer entries model/flow and trainer/ need on the GPU, the memory entries and the Wan DiT's glue (the model
 * holds the whole backend in one const k_dev_ops *). Tensors whose dtype is the caller's choice are typed views
 * (kb_in / kb_out of kernels/body/kb_base.h: fp32 or bf16 storage, fp32 arithmetic); the fp32-only ones (statistics,
 * LSE, RoPE tables, master weights, moments) are float *. A backend refuses a view of a dtype it cannot take, naming
 * the entry and the argument (the GPU's GEMM operands and attention: bf16; the CPU's: fp32). Every pointer is the
 * backend's memory. Every entry returns 0, or -1 with a message (core_error). */
#ifndef KERNELS_DEV_OPS_H
#define KERNELS_DEV_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/body/kb_base.h"
#include "kernels/body/kb_optim.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* Bytes of an ipc_export handle (CUDA's cudaIpcMemHandle_t is 64). */
#define K_IPC_HANDLE_BYTES 64

/* One causal 3-D convolution of the Wan VAE decoder (the vae_conv3d entry; model/vae/wan_vae_layers.c):
 * out [nf, Ho, Wo, cout] = bias + sum over taps (t, dy, dx, ci) of w[o, t, dy, dx, ci] times input frame
 * f + t - (kt - 1) of the stream (cache ++ x; zero before the stream), pixel (y + dy - kh/2, x + dx - kw/2) (zero
 * outside); with up2x (kt 1 only) the input frames are first up-sampled 2x nearest (Ho = 2H, Wo = 2W). Activations
 * channel-last in the backend's activation dtype (the CPU table fp32, a device bf16): x [nf, H, W, cin], cache
 * [ncache, H, W, cin] (the stream's last ncache frames before x; p NULL or ncache 0: none), out must not overlap
 * them. Weights w [cout_w, ldw] (rows [kt, kh, kw, cin], K = kt kh kw cin <= ldw; rows cout .. cout_w - 1 and
 * columns K .. ldw - 1 zero) and bias [cout_w], the backend's weight dtype (CPU fp32, ldw = K, cout_w = cout; a device
 * bf16 with ldw and cout_w rounded up to multiples of 8: its GEMM's rows start 16-byte aligned). work: scratch of
 * work_bytes in the backend's memory (the im2col rows; a device also the GEMM's padded output when cout % 8 != 0),
 * at least one output pixel's row (K elements; a device: round8(K) + round8(cout) bf16). The cache is the caller's
 * to update. */
typedef struct k_vae_conv_args {
    kb_out out;
    kb_in x, cache;
    int ncache;
    kb_in w, bias;
    int ldw, cout_w;
    int nf, H, W, cin, cout, kt, kh, kw, up2x;
    void *work;
    size_t work_bytes;
} k_vae_conv_args;

/* ---- The table ---- */

typedef struct k_dev_ops {
    const char *name; /* "cuda-bf16", "cpu-f32", "emulated" */

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
    /* Device-to-device copy of `height` rows of `width` bytes: row i from src + i * spitch to dst + i * dpitch
     * (cudaMemcpy2D's convention; pitches >= width; no overlap). Sequence parallelism's packing of rows and heads
     * (sp/usp_attention.c, sp/shard.c). */
    int (*mem_copy2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height);
    int (*mem_sync)(void);
    /* Free and total device memory (the start-up estimate's bound); -1 when the device has none to say (the emulated
     * device: host memory, unless its tests set VGRPO_EMULATE_DEVICE_MIB). */
    int (*mem_info)(size_t *free_bytes, size_t *total_bytes);

    /* ---- inter-process sharing on one host (the weight sync, trainer/net/sync_ipc.h); NULL: none (the CPU table) ----
     * ipc_export: a handle (K_IPC_HANDLE_BYTES opaque bytes) through which another process on this host reads the
     * `bytes` at dev (the start of a mem_alloc allocation): CUDA cudaIpcGetMemHandle (the live allocation); the
     * emulated device a POSIX shared-memory object holding a copy of the bytes as they are now. ipc_unexport ends
     * what ipc_export began, once the readers are done (CUDA: nothing to do; emulated: the object is removed).
     * ipc_open maps a handle of `bytes` into this process: *dev is device memory (mem_download and device copies
     * read it) until ipc_close(*dev). A handle of another backend or host, or one already gone, is refused (-1,
     * core_error naming why): the caller falls back to the buckets over ZeroMQ. */
    int (*ipc_export)(const void *dev, size_t bytes, uint8_t *handle);
    int (*ipc_unexport)(const uint8_t *handle);
    int (*ipc_open)(const uint8_t *handle, size_t bytes, const void **dev);
    int (*ipc_close)(const void *dev);

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

    /* ---- the exact gradient reduction (sp/comm_nccl.c; kernels/body/kb_blocksum.h) ----
     * out [n] = ((b_0 + b_1) + b_2) + ... + b_{nb-1} in fp32, element by element, b_r = blocks + r * stride (the
     * blocks an all-to-all delivered, in rank order); nb >= 1, stride >= n. out must not overlap blocks. */
    int (*block_sum)(float *out, const float *blocks, int nb, int64_t stride, int64_t n);

    /* ---- the umT5 text encoder (model/text/umt5.c over this table; kernels/body/kb_t5.h) ----
     * Its RMS norm is rmsnorm_forward above (T5's: no mean, no bias) and its linears gemm.
     * t5_attention: o [B, S, H*Dk] = T5 self-attention of q, k, v [B, S, H*Dk] (head h: columns h*Dk ..): scores
     * q.k with NO 1/sqrt(Dk) scale plus rel_bias[bucket_of[j - i + S - 1] * H + h] (rel_bias [buckets, H] fp32,
     * bucket_of [2S - 1] int), keys with mask[b * S + j] == 0 left out (mask [B, S] int32, NULL: none), a row
     * without kept keys zeros. CPU table: the fp32 chains of kernels/cpu/t5_attention.c (double softmax); the device
     * tables: kb_t5.h's fp32 rows, every view bf16 or fp32. All pointers the backend's memory. */
    int (*t5_attention)(kb_out o, kb_in q, kb_in k, kb_in v, const float *rel_bias, const int *bucket_of,
                        const int32_t *mask, int B, int S, int H, int Dk);
    /* g[i] = gelu_tanh(a0[i]) * a1[i], i < n (T5's gated-GELU feed-forward; g may be a0, not a1: the CPU table
     * writes gelu(a0) into g before it multiplies). */
    int (*t5_gated_gelu)(kb_out g, kb_in a0, kb_in a1, int64_t n);

    /* ---- streams and events: the gradient reduction overlapping the backward (trainer/dp/dp_bucket.h) ----
     * A stream is an opaque handle; NULL names the table's own stream (where every entry runs by default). The
     * CUDA table: cudaStreamCreateWithFlags (non-blocking), cudaEventCreateWithFlags (timing off), cudaEventRecord,
     * cudaStreamWaitEvent, the entries' stream switched. The emulated device runs everything at once, in order, so
     * its streams only keep the books the tests check (kernels/cuda/emu/emu_stream.h: a collective on a stream that
     * has not waited for the table's stream's latest work, an optimizer entry before the table's stream waited for
     * every stream's work: refused). NULL entries (the CPU table): no second stream, no overlap.
     * stream_new: a second stream (NULL with core_error). event_new: an event (NULL with core_error).
     * event_record: e marks the work enqueued on stream s so far. stream_wait: s's later work waits for e's.
     * stream_use: the entries launch on s from now on (NULL: the table's own); returns the stream used before. */
    void *(*stream_new)(void);
    void (*stream_free)(void *s);
    void *(*event_new)(void);
    void (*event_free)(void *e);
    int (*event_record)(void *e, void *s);
    int (*stream_wait)(void *s, void *e);
    void *(*stream_use)(void *s);

    /* ---- the Wan VAE decoder (model/vae/wan_vae_layers.c; kernels/body/kb_vae.h) ----
     * The coarse layers of the decoder; the rest of it is the add, mem_copy2d and memory entries above. The CPU
     * table runs its fp32 code (kernels/cpu/vae_conv.c: im2col rows + k_cpu_gemm, the small-channel path of
     * kernels/cpu/conv_small.c, leading zero taps skipped); a device gathers im2col rows with the body
     * kb_vae_im2col_at into work and multiplies them by the weights with its bf16 GEMM (fp32 accumulation).
     * vae_conv3d: one causal convolution (k_vae_conv_args above). */
    int (*vae_conv3d)(const k_vae_conv_args *a);
    /* WanRMS_norm over the C channels of each of n rows: out = x / max(||x||, 1e-12) * sqrt(C) * gamma, then SiLU
     * when silu (gamma [C] in the weight dtype; out may alias x). */
    int (*vae_rms_norm)(kb_out out, kb_in x, kb_in gamma, int64_t n, int C, int silu);
    /* DupUp3D's shortcut added into out [nf ft - drop, 2H, 2W, cout] from x [nf, H, W, cin] (kb_vae_dupup_at). */
    int (*vae_dupup_add)(kb_out out, kb_in x, int nf, int H, int W, int cin, int cout, int ft, int drop);
    /* Single-head attention of the mid-block over one frame: o [S, C] = softmax(scale q k^T) v, q, k, v [S, C].
     * work: work_bytes of the backend's memory (CPU: the LSE, S floats; a device: the fp32 scores and the bf16
     * probabilities, S x round8(S) each, 6 S round8(S) bytes; C a multiple of 8 there: its GEMM's rows). */
    int (*vae_attention)(kb_out o, kb_in q, kb_in k, kb_in v, int S, int C, float scale, void *work,
                         size_t work_bytes);

    /* ---- the weight sync's device-to-device path (rollout/worker_ipc.c; model/dit/wan_dev.h) ----
     * dst [n] bf16 = src [n] fp32 rounded to nearest even (kb_bf16_from_f32, as mem_upload_bf16 rounds), both device
     * memory: a worker's bf16 weights from the fp32 bytes it copied out of the trainer's buffer. */
    int (*mem_round_bf16)(kb_bf16 *dst, const float *src, int64_t n);
} k_dev_ops;


#ifdef __cplusplus
}
#endif

#endif
