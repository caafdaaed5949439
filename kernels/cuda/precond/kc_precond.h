/* kernels/cuda/precond/kc_precond.h — the preconditions the GPU path's libraries put on a GEMM (cuBLASLt) and an
 * attention call (cuDNN SDPA), checked in one place. The CUDA backend calls them at its entries (kernels/cuda/gemm_lt.c
 * kc_gemm, kernels/cuda/attn_cudnn.c kc_attention_*), and so does the emulated device (kernels/cuda/emu/emu_ops.c),
 * so that a call only the GPU would refuse fails `make test` on a CPU as well, with the same message.
 *
 * Plain C, no CUDA header: compiled into the plain build (for the emulator), the CUDA build and both check programs
 * (Makefile: LIB_SRC, GPU_CHECK_SRC, GPU_EMU_SRC).
 *
 * Sources of each rule (in kc_precond.c next to the check): cuBLASLt's header cublasLt.h (13.x:
 * CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD "divisible by 8 and no less than the number of rows" of its column-major D,
 * i.e. our N), gemm_lt.c's algorithm preference (MIN_ALIGNMENT_A/B/C/D_BYTES = 16, so every pointer and every row
 * start 16-byte aligned), k_cuda.h's definition of the GELU epilogues (aux = alpha op(A) op(B): beta 0); cuDNN's SDPA
 * limitations (cudnn-frontend docs/operations/Attention.md: fp16/bf16 operands, fp32 statistics, head dimension a
 * multiple of 8; the backward at most 128 on Hopper, the forward at most 256) and attn_cudnn.c's tensor descriptors
 * (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT 16 on every operand, statistics included). */
#ifndef KERNELS_CUDA_PRECOND_KC_PRECOND_H
#define KERNELS_CUDA_PRECOND_KC_PRECOND_H

#include "kernels/cuda/k_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest head dimension of each direction (elements). */
#define KC_ATTN_DH_MAX_FWD 256
#define KC_ATTN_DH_MAX_BWD 128

/* The GEMM g (k_cuda.h's k_gemm_args, row-major terms) against cuBLASLt's preconditions: M, N, K >= 1; C's dtype
 * fp32 or bf16; leading dimensions at least the row lengths, lda / ldb multiples of 8 (bf16) and ldc a multiple of 8
 * (bf16) or 4 (fp32) so that every row starts 16-byte aligned; A, B, C, bias and aux pointers 16-byte aligned and not
 * NULL where used; A and B bf16 (an fp32 operand is named); a known epilogue with its bias / aux / dbias; aux's
 * leading dimension >= N and a multiple of 8; beta 0 with the GELU epilogues. Returns 0, or -1 with core_error naming
 * the argument and its value, e.g. "GEMM: lda 12 is not a multiple of 8 (bf16 rows must start 16-byte aligned)". */
int kc_precond_gemm(const k_gemm_args *g);

/* Attention forward (k_dev_ops.attention_forward): q [B, Sq, H, Dh], k, v [B, Skv, H, Dh], o [B, Sq, H, Dh] bf16,
 * lse [B, H, Sq] fp32. B, Sq, Skv, H >= 1; Dh a multiple of 8 in 8 .. KC_ATTN_DH_MAX_FWD; every tensor under 2^31
 * elements (int64 descriptors, but the scratch add of the backward and our kernels beside it index in 32 bits);
 * every pointer non-NULL and 16-byte aligned; q, k, v, o bf16 views ("attention_forward: q is fp32: ..."). Returns
 * 0, or -1 with core_error naming the argument and value. */
int kc_precond_attention_forward(kb_out o, const float *lse, kb_in q, kb_in k, kb_in v, int B, int Sq, int Skv,
                                 int H, int Dh);

/* Attention backward (k_dev_ops.attention_backward): as the forward, Dh at most KC_ATTN_DH_MAX_BWD; dout, q, k, v,
 * o, lse required; dq, dk, dv may be NULL (.p: not wanted), else 16-byte aligned; every view given bf16. */
int kc_precond_attention_backward(kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k, kb_in v, kb_in o,
                                  const float *lse, int B, int Sq, int Skv, int H, int Dh);

/* The element-index maps of our own kernels run in 32 bits (kernels/body/kb_index.h; kernels/cuda/kern_layers.cu):
 * an op over n elements needs n <= 2^31 - 1. 0, or -1 with core_error naming op and n. */
int kc_precond_index32(const char *op, size_t n);

/* The longest sequence of t5_attention on a device: one query row per block keeps its S scores in shared memory
 * (kernels/cuda/kern_t5.cu: S floats of the 48 KiB a block may take without opting in). */
#define KC_T5_S_MAX 8192

/* T5 attention (k_dev_ops.t5_attention, kernels/body/kb_t5.h): B, S, H, Dk >= 1, S <= KC_T5_S_MAX; o, q, k, v,
 * rel_bias and bucket_of non-NULL; B * S * H * Dk < 2^31. 0, or -1 with core_error naming the argument and value. */
int kc_precond_t5_attention(kb_out o, kb_in q, kb_in k, kb_in v, const float *rel_bias, const int *bucket_of, int B,
                            int S, int H, int Dk);

#ifdef __cplusplus
}
#endif

#endif
