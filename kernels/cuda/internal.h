/* kernels/cuda/internal.h — what the files of the CUDA backend share: the loaded libraries (dynload.c), the stream
 * and scratch memory (device.c), error helpers, and the launchers of our own kernels (kern_*.cu, extern "C").
 * Not for use outside kernels/cuda/. */
#ifndef KERNELS_CUDA_INTERNAL_H
#define KERNELS_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/k_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's stream (valid after k_cuda_init). */
extern cudaStream_t kc_stream;
/* Multiprocessors of the device (grid sizing). */
extern int kc_sm_count;

/* 0 when e is cudaSuccess, else -1 with core_error("CUDA: <what>: <error>"). */
int kc_check(cudaError_t e, const char *what);
/* After a launch: cudaGetLastError through kc_check (a launch error; faults inside kernels surface at a sync). */
int kc_launched(const char *op);

/* Device scratch buffer number slot (0 .. KC_SCRATCH_SLOTS-1), at least bytes long: grown (freed and reallocated,
 * after a stream sync) when too small, kept between calls. NULL and core_error when the allocation fails. Work
 * that uses one slot must finish (stream order) before the slot is reused: every user is on kc_stream. */
#define KC_SCRATCH_SLOTS 8
enum { KC_SLOT_REDUCE = 0, KC_SLOT_GEMM_WS, KC_SLOT_GEMM_BIAS, KC_SLOT_ATTN_WS, KC_SLOT_ATTN_DQ, KC_SLOT_ATTN_DK,
       KC_SLOT_ATTN_DV, KC_SLOT_SCALAR };
void *kc_scratch(int slot, size_t bytes);
void kc_scratch_free_all(void);

/* Library set-up and tear-down (gemm_lt.c, attn_cudnn.c), called by k_cuda_init / k_cuda_shutdown. */
int kc_gemm_init(void);
void kc_gemm_shutdown(void);
int kc_attn_init(void);
void kc_attn_shutdown(void);

/* y[i] += x[i] for n elements (kern_flow.cu): the accumulate step behind library outputs (attention gradients,
 * GEMM bias gradients). */
int kc_add(kb_out y, kb_in x, int64_t n);
/* dbias[m] += sum_k a[m * stride_m + k * stride_k] for m < M, k < K, fp32 += (gemm_colsum.cu: the bias-gradient
 * fallback of gemm_lt.c, the fixed order of kernels/body/kb_colsum.h); scratch slot KC_SLOT_GEMM_BIAS. */
int kc_colsum_bgrad(float *dbias, kb_in a, int64_t stride_m, int64_t stride_k, int M, int K);

/* ---- Launchers of kern_layers.cu (k_dev_ops entries; see k_cuda.h and kernels/kernels.h) ---- */
int kc_layernorm_forward(kb_out out, float *mean, float *rstd, kb_in x, kb_in w, kb_in b, int N, int C, float eps);
int kc_layernorm_backward(kb_out dx, kb_out dw, kb_out db, kb_in dout, kb_in x, kb_in w, const float *mean,
                          const float *rstd, int N, int C);
int kc_rmsnorm_forward(kb_out out, float *rstd, kb_in x, kb_in w, int N, int C, float eps);
int kc_rmsnorm_backward(kb_out dx, kb_out dw, kb_in dout, kb_in x, kb_in w, const float *rstd, int N, int C);
int kc_rope_forward(kb_out out, kb_in x, const float *cos, const float *sin, int B, int S, int H, int Dh);
int kc_rope_backward(kb_out dx, kb_in dout, const float *cos, const float *sin, int B, int S, int H, int Dh);
int kc_gelu_forward(kb_out out, kb_in x, int64_t n);
int kc_gelu_backward(kb_out dx, kb_in dout, kb_in x, int64_t n);
int kc_silu_forward(kb_out out, kb_in x, int64_t n);
int kc_silu_backward(kb_out dx, kb_in dout, kb_in x, int64_t n);
int kc_modulate_forward(kb_out out, kb_in x, kb_in shift, kb_in scale, int B, int S, int D, int per_token,
                        int mod_stride);
int kc_modulate_backward(kb_out dx, kb_out dshift, kb_out dscale, kb_in dout, kb_in x, kb_in scale, int B, int S,
                         int D, int per_token, int mod_stride);
int kc_gate_residual_forward(kb_out out, kb_in x, kb_in y, kb_in gate, int B, int S, int D, int per_token,
                             int mod_stride);
int kc_gate_residual_backward(kb_out dx, kb_out dy, kb_out dgate, kb_in dout, kb_in y, kb_in gate, int B, int S,
                              int D, int per_token, int mod_stride);
int kc_patchify_forward(kb_out out, kb_in x, int B, int C, int F, int H, int W, int pt, int ph, int pw);
int kc_patchify_backward(kb_out dx, kb_in dout, int B, int C, int F, int H, int W, int pt, int ph, int pw);
int kc_unpatchify_forward(kb_out out, kb_in x, int B, int C, int F, int H, int W, int pt, int ph, int pw);
int kc_unpatchify_backward(kb_out dx, kb_in dout, int B, int C, int F, int H, int W, int pt, int ph, int pw);
int kc_lse_merge_forward(kb_out o, float *lse, kb_in o1, const float *lse1, kb_in o2, const float *lse2, int B, int S,
                         int H, int Dh);
int kc_lse_merge_backward(kb_out do1, float *dlse1, kb_out do2, float *dlse2, kb_in dout, const float *dlse, kb_in o1,
                          const float *lse1, kb_in o2, const float *lse2, int B, int S, int H, int Dh);
int kc_add_table_forward(kb_out out, kb_in table, kb_in src, int R, int nj, int D, int src_nj);
int kc_add_table_backward(kb_out dtable, kb_out dsrc, kb_in dmod, int R, int nj, int D, int src_nj);

/* ---- Launchers of kern_vae.cu (the Wan VAE decoder's k_dev_ops entries; kernels/dev_ops.h) ---- */
int kc_vae_conv3d_entry(const k_vae_conv_args *a);
int kc_vae_rms_norm(kb_out out, kb_in x, kb_in gamma, int64_t n, int C, int silu);
int kc_vae_dupup_add(kb_out out, kb_in x, int nf, int H, int W, int cin, int cout, int ft, int drop);
int kc_vae_attention_entry(kb_out o, kb_in q, kb_in k, kb_in v, int S, int C, float scale, void *work,
                           size_t work_bytes);

/* ---- Launchers of kern_flow.cu ---- */
int kc_sde_step(kb_in x, kb_in v, kb_in eps, kb_in given, kb_out mean_out, kb_out x_next_out, float coef_x,
                float coef_v, float step_std, int want_sum, int64_t n, float *sum_out);
int kc_sq_diff_sum(kb_in a, kb_in b, int64_t n, float *sum_out);
int kc_sde_backward_v(kb_out dv, kb_in mean, kb_in x_next, kb_in mean_ref, float g_logp, float g_kl, float k,
                      int64_t n);
int kc_cfg_combine(kb_out v, kb_in vc, kb_in vu, float g, int64_t n);
int kc_cfg_backward(kb_out dvc, kb_out dvu, kb_in dv, float g, int64_t n);
int kc_adamw_update(float *p, float *m, float *v, kb_in g, const uint8_t *wd_mask, kb_adamw_scalars s,
                    kb_bf16 *p_bf16, int64_t n);
int kc_sumsq(kb_in x, int64_t n, double *out);
int kc_scale(kb_out x, float f, int64_t n);
/* The exact reduction's rank-order block sum (kern_blocksum.cu; k_dev_ops.block_sum). */
int kc_block_sum(float *out, const float *blocks, int nb, int64_t stride, int64_t n);
/* The umT5 encoder (kern_t5.cu; k_dev_ops.t5_attention, t5_gated_gelu). */
int kc_t5_attention(kb_out o, kb_in q, kb_in k, kb_in v, const float *rel_bias, const int *bucket_of,
                    const int32_t *mask, int B, int S, int H, int Dk);
int kc_t5_gated_gelu(kb_out g, kb_in a0, kb_in a1, int64_t n);
/* streams.c: the table's stream and event entries (kernels/dev_ops.h). */
void *kc_stream_new(void);
void kc_stream_free(void *s);
void *kc_event_new(void);
void kc_event_free(void *e);
int kc_event_record(void *e, void *s);
int kc_stream_wait(void *s, void *e);
void *kc_stream_use(void *s);
/* fp32 to bf16 on the device, round to nearest even (kern_sync.cu; k_dev_ops.mem_round_bf16). */
int kc_round_bf16(kb_bf16 *dst, const float *src, int64_t n);

/* ---- cuBLASLt and cuDNN entries (gemm_lt.c, attn_cudnn.c) ---- */
int kc_gemm(const k_gemm_args *g);
int kc_attention_forward(kb_out o, float *lse, kb_in q, kb_in k, kb_in v, int B, int Sq, int Skv, int H, int Dh,
                         float scale);
int kc_attention_backward(kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k, kb_in v, kb_in o,
                          const float *lse, int B, int Sq, int Skv, int H, int Dh, float scale);

#ifdef __cplusplus
}
#endif

#endif
