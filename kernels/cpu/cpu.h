/* kernels/cpu/cpu.h — the fp32 CPU backend's functions; each is documented at its entry in kernels/kernels.h.
 * One file per op family: gemm.c, norm.c, rope.c, activation.c, modulate.c, patch.c, attention.c, lse_merge.c. */
#ifndef KERNELS_CPU_H
#define KERNELS_CPU_H

#include <stddef.h>

#include "kernels/kernels.h"

/* The vector path of the GEMM and attention micro-kernels (kernels/cpu/path.c). Every path gives the same values bit
 * for bit; the default is the widest one compiled in (the build's -march) that this CPU runs, or the one the
 * environment variable VGRPO_CPU_PATH names (c, avx2, avx512) when available. Set it only while no kernel runs. */
typedef enum { K_CPU_PATH_C = 0, K_CPU_PATH_AVX2 = 1, K_CPU_PATH_AVX512 = 2 } k_cpu_path;
int k_cpu_path_available(k_cpu_path p); /* 1: compiled into this binary and this CPU runs it */
k_cpu_path k_cpu_get_path(void);
int k_cpu_set_path(k_cpu_path p);       /* 0, or -1 when p is not available (the path is then unchanged) */
const char *k_cpu_path_name(k_cpu_path p);

/* The attention backward keeps pass 1's dS for pass 2 when a head group's Sq x Skv floats fit this many bytes
 * (default 64 MiB), else pass 2 recomputes it: the same values either way (tests/test_kernels_paths.c). Set it only
 * while no kernel runs. */
extern size_t k_cpu_attn_ds_budget;

void k_cpu_gemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc, const float *bias);
/* Frees the calling thread's kernel scratch (gemm, attention and conv buffers kept between calls): call it before a
 * thread of its own that ran CPU kernels exits (the reward server's scoring threads); the pool's threads live as
 * long as the process. The next kernel call on the thread allocates again. The per-file parts it calls: */
void k_cpu_release_thread(void);
void k_cpu_attention_release_thread(void);
void k_cpu_conv_small_release_thread(void);
/* The ceiling of k_cpu_gemm's inner loop (`vgrpo bench peak`): the current path's micro-kernel run `iters` times
 * over one packed A panel (MR x KC) and one packed B panel (KC x NR) that stay in L1, accumulating into one C tile
 * (no packing, no memory traffic beyond L1). Returns the flops done (2 MR NR KC per run; 0 when its two panels cannot
 * be allocated); *mr, *nr: the tile. */
double k_cpu_gemm_ukernel_loop(long iters, int *mr, int *nr);
void k_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b, int N, int C, float eps);
void k_cpu_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, const float *mean, const float *rstd, int N, int C);
void k_cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps);
void k_cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *w, const float *rstd, int N, int C);
void k_cpu_rope_forward(float *out, const float *x, const float *cos, const float *sin, int B, int S, int H, int Dh);
void k_cpu_rope_backward(float *dx, const float *dout, const float *cos, const float *sin, int B, int S, int H, int Dh);
void k_cpu_gelu_forward(float *out, const float *x, int64_t n);
void k_cpu_gelu_backward(float *dx, const float *dout, const float *x, int64_t n);
void k_cpu_silu_forward(float *out, const float *x, int64_t n);
void k_cpu_silu_backward(float *dx, const float *dout, const float *x, int64_t n);
void k_cpu_modulate_forward(float *out, const float *x, const float *shift, const float *scale, int B, int S, int D, int per_token, int mod_stride);
void k_cpu_modulate_backward(float *dx, float *dshift, float *dscale, const float *dout, const float *x, const float *scale, int B, int S, int D, int per_token, int mod_stride);
void k_cpu_gate_residual_forward(float *out, const float *x, const float *y, const float *gate, int B, int S, int D, int per_token, int mod_stride);
void k_cpu_gate_residual_backward(float *dx, float *dy, float *dgate, const float *dout, const float *y, const float *gate, int B, int S, int D, int per_token, int mod_stride);
void k_cpu_patchify_forward(float *out, const float *x, int B, int C, int F, int H, int W, int pt, int ph, int pw);
void k_cpu_patchify_backward(float *dx, const float *dout, int B, int C, int F, int H, int W, int pt, int ph, int pw);
void k_cpu_unpatchify_forward(float *out, const float *x, int B, int C, int F, int H, int W, int pt, int ph, int pw);
void k_cpu_unpatchify_backward(float *dx, const float *dout, int B, int C, int F, int H, int W, int pt, int ph, int pw);
void k_cpu_attention_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B, int Sq, int Skv, int H, int Dh, float scale);
void k_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v, const float *o, const float *lse, int B, int Sq, int Skv, int H, int Dh, float scale);
void k_cpu_lse_merge_forward(float *o, float *lse, const float *o1, const float *lse1, const float *o2, const float *lse2, int B, int S, int H, int Dh);
/* nf output frames of a small causal convolution (cout <= K_CONV_SMALL_MAX_CO), equal bit for bit to
 * kernels/cpu/vae_conv.c's im2col + k_cpu_gemm (kernels/cpu/conv_small.c): out [nf, Ho, Wo, co] channel-last
 * (Ho, Wo = H, W, or 2H, 2W with up2x: nearest 2x upsampling of the input first); src [nf * kt]: output frame f reads
 * the input frames src[f*kt + t], t < kt, each [H, W, ci] (NULL: zeros; leading NULL taps are left out of the sum, as
 * the GEMM path does); w [co] rows of ldw floats, tap order (t, dy, dx, c); zero padding kh/2, kw/2; bias [co] or
 * NULL. 0, or -1 when kt > 3, nf * kt > 64 or its scratch cannot be allocated (nothing written). */
#define K_CONV_SMALL_MAX_CO 16
int k_cpu_conv_small(float *out, int nf, const float *const *src, int kt, int H, int W, int ci, int up2x,
                     const float *w, int ldw, int kh, int kw, int co, const float *bias);
/* ---- kernels/cpu/vae_conv.c: the Wan VAE decoder's layers (the CPU table's vae_* entries, kernels/dev_ops.h) ----
 * k_cpu_vae_conv3d: out [nf, Ho, Wo, co] from x [nf, H, W, ci] with cache [ncache, H, W, ci] before it (NULL: none),
 * weights wt [co, kt kh kw ci], bias [co]; im2col rows in col_buf (col_floats floats, at least kt kh kw ci): the
 * small-channel path (co <= K_CONV_SMALL_MAX_CO), else per frame im2col + k_cpu_gemm with the leading taps that read
 * before the stream left out. 0, or -1 when col_buf holds less than one row. k_cpu_vae_rms_norm: WanRMS_norm (+ SiLU)
 * of n rows of C (out may alias x). k_cpu_vae_dupup_add: DupUp3D's shortcut added into out. */
int k_cpu_vae_conv3d(float *out, const float *x, const float *cache, int ncache, const float *wt, const float *bias,
                     int nf, int H, int W, int ci, int co, int kt, int kh, int kw, int up2x, float *col_buf,
                     size_t col_floats);
void k_cpu_vae_rms_norm(float *out, const float *x, const float *g, int64_t n, int C, int silu);
void k_cpu_vae_dupup_add(float *out, const float *x, int nf, int H, int W, int cin, int cout, int ft, int drop);
void k_cpu_lse_merge_backward(float *do1, float *dlse1, float *do2, float *dlse2, const float *dout, const float *dlse, const float *o1, const float *lse1, const float *o2, const float *lse2, int B, int S, int H, int Dh);

/* ---- kernels/cpu/glue.c: the DiT's small loops beside the table (the CPU device table's add entries) ---- */
/* db[N] += sum over rows m of dy[m, n] (row stride ld), rows in order 0..M-1 for every n (thread invariant). */
void k_cpu_colsum_acc(float *db, const float *dy, int64_t M, int N, int64_t ld);
/* out[r, j, :] = table[j, :] + src[r, j, :] for j < nj; out, src [R, nj, D], table [nj, D]. With src_nj == 1,
 * src[r, 0, :] is added to every j (temb broadcast over the output norm's shift and scale). */
void k_cpu_add_table(float *out, const float *table, const float *src, int R, int nj, int D, int src_nj);
/* dtable[j,:] += sum_r dmod[r,j,:] (fixed order; skipped when NULL); dsrc[r,j,:] += dmod[r,j,:] (src_nj == nj) or
 * dsrc[r,0,:] += dmod[r,j,:] for j in order (src_nj == 1; skipped when NULL). */
void k_cpu_add_table_bwd(float *dtable, float *dsrc, const float *dmod, int R, int nj, int D, int src_nj);
/* y[n] += x[n] (n floats). */
void k_cpu_axpy1(float *y, const float *x, int64_t n);

/* T5 self-attention (the umT5 encoder's core, model/text/umt5.h): q, k, v [B, S, H*Dk] F32 (head h's columns
 * h*Dk ..) -> o [B, S, H*Dk]; score(i, j) = q_i . k_j (no 1/sqrt(Dk): T5) + rel_bias[bucket_of[j - i + S - 1] * H + h]
 * (rel_bias [buckets, H]);
 * keys with mask[b][j] == 0 left out (mask NULL: none); o_i = sum_j p_j v_j / sum_j p_j with p_j = exp(score - max)
 * in double; a row without kept keys gets zeros. Exact arithmetic (the values are these chains, whatever the
 * vector width or thread count): each score is the fp32 sum over d in order of the rounded products q[d]*k[d] (no
 * fma), then + bias; p_j = exp((double)score_j - (double)max) (libm); sum and every output column the double sums
 * over kept keys in key order of p_j and of the rounded products p_j * (double)v_j[d]; o = (float)(col / sum).
 * Returns 0, or -1 (out of memory). Reference: transformers UMT5Attention (encoder, no dropout). */
int k_cpu_t5_attention(float *o, const float *q, const float *k, const float *v, const float *rel_bias,
                        const int *bucket_of, const int32_t *mask, int B, int S, int H, int Dk);

#endif
