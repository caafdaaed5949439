/* kernels/kernels.h — the op table of vgrpo's compute kernels.
 *
 * Every op the DiT needs is one entry here: the fp32 CPU backend (kernels/cpu/, OpenBLAS + OpenMP) fills it now
 * (k_cpu_ops); a CUDA backend (bf16, cuBLASLt, cuDNN) will fill the same table later. Model code calls ops through
 * a `const k_ops *`, never a backend directly.
 *
 * Conventions (llm.c style):
 * - Activations are row-major [B, S, D]; attention heads are [B, S, H, Dh]; the attention LSE is [B, H, S].
 * - A forward writes (overwrites) its outputs.
 * - A backward ACCUMULATES (+=) into every gradient it produces (inputs and parameters), so callers zero
 *   gradient buffers once and residual branches add up naturally. Pointers for gradients not wanted may be NULL
 *   where the comment says so.
 * - Results per row/sample never depend on how many rows share the call, on batch mates or on the thread count
 *   (docs/design.md sections 4 and 8): each reduction runs in a fixed order.
 */
#ifndef KERNELS_H
#define KERNELS_H

/* CPU kernels and layers run their loops in parallel only from this much work (elements, or multiply-adds for
 * attention) on: below it, waking the OpenMP threads (they sleep between regions: OMP_WAIT_POLICY=passive, so
 * processes sharing the cores do not starve each other) costs more than the work, and the region's closing barrier
 * waits for a thread that its core's other jobs have not let run yet. Measured on the tiny preset (2 cores): a GRPO
 * step took 1.27 s with 2 threads and 0.65 s with 1 at a threshold of 1 << 14; at 1 << 17, with other jobs on the
 * machine, the demo recipe's step (vgrpo bench step) took 2.2x as long with 2 threads as with 1, most of it in
 * regions of 128 K to 256 K elements; at 1 << 20 the small model's elementwise passes (a few hundred microseconds at
 * most) run alone and the large ones (the 1.3B block's, millions of elements) still in parallel. The GEMMs and the
 * short-sequence attention use the task pool (kernels/cpu/pool.h), which never waits for a late thread, with their own
 * thresholds. Results never depend on it (every kernel is thread-count invariant). */
#define K_PAR_MIN_ELEMS ((size_t)1 << 20)

#include <stdint.h>

typedef struct k_ops {
    const char *name; /* "cpu-fp32", later "cuda-bf16" */

    /* C[M,N] = alpha * op(A) @ op(B) + beta * C, then C[m,:] += bias[:] if bias != NULL.
     * op(A) is [M,K]: A stored [M,K] (lda >= K) or, with transA, [K,M] (lda >= M); op(B) is [K,N]: B stored
     * [K,N] or, with transB, [N,K]. Row-major. A row of C does not depend on M or the thread count. */
    void (*gemm)(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc, const float *bias);

    /* LayerNorm over the last dim: out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), var biased (ddof 0).
     * x, out [N, C]; w, b [C] or both NULL (no affine); mean, rstd [N] saved for backward.
     * Reference: torch.nn.LayerNorm (elementwise_affine True or False). */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                              int N, int C, float eps);
    /* dx [N,C] +=; dw, db [C] += (NULL when no affine). */
    void (*layernorm_backward)(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                               const float *mean, const float *rstd, int N, int C);

    /* RMSNorm over the last dim: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). x, out [N, C]; w [C] or NULL;
     * rstd [N]. Reference: diffusers RMSNorm / torch.nn.RMSNorm (Wan's qk norm runs over all heads: C = H*Dh). */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
    void (*rmsnorm_backward)(float *dx, float *dw, const float *dout, const float *x, const float *w,
                             const float *rstd, int N, int C);

    /* Rotary embedding on interleaved pairs: for pair j of head dim (elements 2j, 2j+1),
     *   out[2j] = x[2j]*cos[s,j] - x[2j+1]*sin[s,j];  out[2j+1] = x[2j]*sin[s,j] + x[2j+1]*cos[s,j].
     * x, out [B, S, H, Dh] (in place allowed); cos, sin [S, Dh/2] from k_wan_rope_table.
     * Reference: diffusers WanAttnProcessor apply_rotary_emb. */
    void (*rope_forward)(float *out, const float *x, const float *cos, const float *sin, int B, int S, int H, int Dh);
    /* dx += rotation of dout by the negative angle. */
    void (*rope_backward)(float *dx, const float *dout, const float *cos, const float *sin, int B, int S, int H,
                          int Dh);

    /* GELU, tanh approximation (torch gelu(approximate="tanh")); x, out [n]. */
    void (*gelu_forward)(float *out, const float *x, int64_t n);
    void (*gelu_backward)(float *dx, const float *dout, const float *x, int64_t n);
    /* SiLU x*sigmoid(x); x, out [n]. */
    void (*silu_forward)(float *out, const float *x, int64_t n);
    void (*silu_backward)(float *dx, const float *dout, const float *x, int64_t n);

    /* AdaLN modulation out = x * (1 + scale) + shift. x, out [B, S, D]; shift, scale [B, D] when per_token == 0,
     * [B, S, D] when per_token == 1 (Wan 2.2 TI2V per-token timesteps). shift/scale rows are addressed with a row
     * stride of mod_stride floats (so they can point into a [B, 6, D] modulation table: mod_stride = 6*D). */
    void (*modulate_forward)(float *out, const float *x, const float *shift, const float *scale, int B, int S, int D,
                             int per_token, int mod_stride);
    /* dx [B,S,D] +=; dshift, dscale (same layout and stride as shift/scale) +=. */
    void (*modulate_backward)(float *dx, float *dshift, float *dscale, const float *dout, const float *x,
                              const float *scale, int B, int S, int D, int per_token, int mod_stride);

    /* Gated residual out = x + y * gate; gate [B, D] or [B, S, D] (per_token), row stride mod_stride as above.
     * out may alias x. */
    void (*gate_residual_forward)(float *out, const float *x, const float *y, const float *gate, int B, int S, int D,
                                  int per_token, int mod_stride);
    /* dx += dout (skipped when dx is NULL); dy += dout*gate; dgate += dout*y (summed over s unless per_token). */
    void (*gate_residual_backward)(float *dx, float *dy, float *dgate, const float *dout, const float *y,
                                   const float *gate, int B, int S, int D, int per_token, int mod_stride);

    /* Patch embedding layout (Conv3d with kernel = stride = (pt, ph, pw) is patchify + gemm):
     * x [B, C, F, H, W] -> out [B, S, C*pt*ph*pw], S = (F/pt)*(H/ph)*(W/pw) in (f, h, w) order, patch vector
     * in (c, kt, kh, kw) order (the Conv3d weight's flattening). Backward: dx += inverse permutation of dout. */
    void (*patchify_forward)(float *out, const float *x, int B, int C, int F, int H, int W, int pt, int ph, int pw);
    void (*patchify_backward)(float *dx, const float *dout, int B, int C, int F, int H, int W, int pt, int ph,
                              int pw);
    /* Wan unpatchify: x [B, S, pt*ph*pw*C] (patch vector in (kt, kh, kw, c) order, as diffusers'
     * WanTransformer3DModel reshapes proj_out) -> out [B, C, F, H, W]. Backward: dx += inverse of dout. */
    void (*unpatchify_forward)(float *out, const float *x, int B, int C, int F, int H, int W, int pt, int ph, int pw);
    void (*unpatchify_backward)(float *dx, const float *dout, int B, int C, int F, int H, int W, int pt, int ph,
                                int pw);

    /* Scaled dot-product attention, no mask, blocked (flash-style): extra memory O(S x block).
     * q [B, Sq, H, Dh], k, v [B, Skv, H, Dh] -> o [B, Sq, H, Dh] and lse [B, H, Sq] =
     * log(sum_j exp(scale * q.k_j)) (natural log, fp32). Reference: torch scaled_dot_product_attention. */
    void (*attention_forward)(float *o, float *lse, const float *q, const float *k, const float *v, int B, int Sq,
                              int Skv, int H, int Dh, float scale);
    /* dq [B,Sq,H,Dh] +=, dk, dv [B,Skv,H,Dh] += given o, lse from the forward and dout. (FlashAttention-2 bwd.) */
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                               const float *v, const float *o, const float *lse, int B, int Sq, int Skv, int H,
                               int Dh, float scale);

    /* Merge of two partial attention results over disjoint key sets (ring attention):
     * lse = log(exp(lse1) + exp(lse2)); o = exp(lse1 - lse) * o1 + exp(lse2 - lse) * o2.
     * o*, [B, S, H, Dh]; lse*, [B, H, S]. o/lse may alias o1/lse1. */
    void (*lse_merge_forward)(float *o, float *lse, const float *o1, const float *lse1, const float *o2,
                              const float *lse2, int B, int S, int H, int Dh);
    /* Given dout [B,S,H,Dh] and dlse [B,H,S] (dlse may be NULL: zero), do1, do2 +=, dlse1, dlse2 +=. */
    void (*lse_merge_backward)(float *do1, float *dlse1, float *do2, float *dlse2, const float *dout,
                               const float *dlse, const float *o1, const float *lse1, const float *o2,
                               const float *lse2, int B, int S, int H, int Dh);
} k_ops;

/* The fp32 CPU backend. */
extern const k_ops k_cpu_ops;

/* Wan 3-D RoPE tables (diffusers WanRotaryPosEmbed): head dim Dh split as h_dim = w_dim = 2*(Dh/6),
 * t_dim = Dh - 2*h_dim; each part's angles pos * theta^(-2i/dim) computed in double. For the token at
 * (f, h, w) of a [F, Hp, Wp] grid (S = F*Hp*Wp, row-major f, h, w), pair j < t_dim/2 uses f, the next h_dim/2
 * pairs h, the last w_dim/2 pairs w. cos, sin [S, Dh/2] fp32. Returns 0, or -1 if Dh is odd or < 6 or a grid
 * size exceeds max_seq_len. */
int k_wan_rope_table(float *cos, float *sin, int F, int Hp, int Wp, int Dh, double theta, int max_seq_len);

/* ---- The CUDA backend (kernels/cuda/k_cuda.h: the device op table k_cuda_ops, bf16 activations) ----
 * k_cuda_available: 1 when this binary carries the CUDA backend and it can run here (a GPU of compute capability
 * 9.x, cuBLASLt and cuDNN found and initialised); otherwise 0, with one line saying why in why (K_WHY_MAX bytes; may
 * be NULL). A build without `make cuda` answers 0, "built without the CUDA backend (make cuda)"; a CUDA build on a
 * machine without a GPU answers 0 and names what is missing, and every CPU path still works. */
#define K_WHY_MAX 512
int k_cuda_available(char *why);
/* The CUDA backend's device op table (kernels/cuda/k_cuda.h: k_cuda_ops) when k_cuda_available answers 1; else NULL
 * with k_cuda_available's line in why. Lets code above kernels/ (vgrpo dit-forward --device cuda) reach the device
 * without #ifdefs or a link-time reference to a table a plain build does not have. */
struct k_dev_ops;
const struct k_dev_ops *k_cuda_device(char *why);

#endif
