/* kernels/cuda/precond/kc_vae.h — the host side of the Wan VAE decoder's coarse device entries (kernels/dev_ops.h's
 * vae_conv3d and vae_attention), shared by the CUDA backend (kernels/cuda/kern_vae.cu) and the emulated device
 * (kernels/cuda/emu/emu_vae.c), which differ only in how they run an im2col gather, a row softmax, a GEMM and a
 * strided copy. Lives beside the preconditions because it is plain C compiled into the same four builds (the plain
 * build for the emulator, the CUDA build, both check programs) and it is where the GEMM's rules meet the VAE:
 *   vae_conv3d     frame by frame, chunks of output pixels: im2col rows [rows, ldw] bf16 into work (columns K .. ldw
 *                  - 1 zero; the leading taps before the stream are zeros here, not skipped as on the CPU), one GEMM
 *                  against the padded weights [cout_w, ldw] (transB) with the bias epilogue into out (cout % 8 == 0),
 *                  or into a padded [rows, cout_w] block after the rows in work, then copied to out row by row. The
 *                  pointwise convolution (1x1x1, cin % 8 == 0) multiplies x itself.
 *   vae_attention  scores [S, round8(S)] fp32 = scale q k^T (GEMM), row softmax into bf16 probabilities (body
 *                  kb_vae_softmax_row), o = P v (GEMM): cuDNN's SDPA stops at head dimension 256, the VAE's is 384
 *                  (Wan 2.1) or 1024 (Wan 2.2).
 * Every view bf16 (a refused dtype is named). */
#ifndef KERNELS_CUDA_PRECOND_KC_VAE_H
#define KERNELS_CUDA_PRECOND_KC_VAE_H

#include "kernels/body/kb_vae.h"
#include "kernels/dev_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kc_vae_backend {
    const char *name;
    int (*gemm)(const k_gemm_args *g);
    int (*copy2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height);
    /* col [rows, ldc] bf16: row r = pixel pix0 + r of output frame f, columns k < K kb_vae_im2col_at, K .. ldc-1 0 */
    int (*im2col)(kb_bf16 *col, int ldc, int K, kb_in x, kb_in cache, kb_vae_conv_geom g, int f, size_t pix0,
                  size_t rows);
    /* p [S, ld] bf16 from s [S, ld] fp32: kb_vae_softmax_row for every row */
    int (*softmax)(kb_bf16 *p, const float *s, int S, int ld);
} kc_vae_backend;

/* The entries' host drivers (see above); 0, or -1 with core_error naming the entry, the argument and the value. */
int kc_vae_conv3d(const kc_vae_backend *b, const k_vae_conv_args *a);
int kc_vae_attention(const kc_vae_backend *b, kb_out o, kb_in q, kb_in k, kb_in v, int S, int C, float scale,
                     void *work, size_t work_bytes);
/* The element-wise entries' argument checks (bf16 views, sizes), run before their kernels. */
int kc_vae_check_norm(const char *backend, kb_out out, kb_in x, kb_in gamma, int64_t n, int C);
int kc_vae_check_dupup(const char *backend, kb_out out, kb_in x, int nf, int H, int W, int cin, int cout, int ft,
                       int drop);

#ifdef __cplusplus
}
#endif

#endif
