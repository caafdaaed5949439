/* kernels/cuda/kern_vae.cu — the Wan VAE decoder's entries of the CUDA backend (kernels/dev_ops.h, "the Wan VAE
 * decoder"): the host drivers of kernels/cuda/precond/kc_vae.h (im2col + cuBLASLt GEMM for the causal convolution,
 * GEMM + softmax + GEMM for the mid-block attention) over these kernels, each a grid-stride loop calling a body of
 * kernels/body/kb_vae.h:
 *   im2col    one thread per element of the [rows, ldc] bf16 block;
 *   softmax   one thread per score row (S up to a few thousand latent pixels: the rows are the parallelism);
 *   norm      one thread per pixel row of C channels (WanRMS_norm + SiLU);
 *   dupup     one thread per output element (DupUp3D's shortcut, +=).
 * Simple first versions (the memory traffic of im2col rows, uncoalesced per-row norms); nothing of this file has run
 * on a GPU yet (kernels/cuda/README.md). Compiled with -fmad=false like the other kernels. */
#include "kernels/body/kb_vae.h"
#include "kernels/cuda/kern_common.cuh"
#include "kernels/cuda/precond/kc_precond.h"
#include "kernels/cuda/precond/kc_vae.h"

__global__ void vae_im2col_kernel(kb_bf16 *col, int ldc, int K, kb_in x, kb_in cache, kb_vae_conv_geom g, int f,
                                  size_t pix0, size_t n) {
    KC_FOR(i, n) {
        const size_t r = i / (size_t)ldc;
        const int k = (int)(i % (size_t)ldc);
        col[i] = kb_bf16_from_f32(k < K ? kb_vae_im2col_at(x, cache, &g, f, pix0 + r, k) : 0.0f);
    }
}

__global__ void vae_softmax_kernel(kb_bf16 *p, const float *s, int S, int ld) {
    KC_FOR(r, (size_t)S) kb_vae_softmax_row(kb_out_bf16(p), s, r, S, ld);
}

__global__ void vae_norm_kernel(kb_out out, kb_in x, kb_in gamma, size_t n, int C, float scale, int silu) {
    KC_FOR(r, n) kb_vae_norm_row(out, x, gamma, r, C, scale, silu);
}

__global__ void vae_dupup_kernel(kb_out out, kb_in x, int H, int W, int cin, int cout, int ft, int drop, size_t n) {
    KC_FOR(e, n) kb_vae_dupup_at(out, x, H, W, cin, cout, ft, drop, e);
}

static int im2col(kb_bf16 *col, int ldc, int K, kb_in x, kb_in cache, kb_vae_conv_geom g, int f, size_t pix0,
                  size_t rows) {
    const size_t n = rows * (size_t)ldc;
    if (!n) return 0;
    vae_im2col_kernel<<<kc_blocks(n), KC_THREADS, 0, kc_stream>>>(col, ldc, K, x, cache, g, f, pix0, n);
    return kc_launched("vae_conv3d (im2col)");
}

static int softmax(kb_bf16 *p, const float *s, int S, int ld) {
    vae_softmax_kernel<<<kc_blocks((size_t)S), KC_THREADS, 0, kc_stream>>>(p, s, S, ld);
    return kc_launched("vae_attention (softmax)");
}

static const kc_vae_backend *backend(void) {
    static kc_vae_backend b;
    b.name = "cuda-bf16", b.gemm = kc_gemm, b.copy2d = k_dev_copy2d, b.im2col = im2col, b.softmax = softmax;
    return &b;
}

extern "C" int kc_vae_conv3d_entry(const k_vae_conv_args *a) { return kc_vae_conv3d(backend(), a); }

extern "C" int kc_vae_attention_entry(kb_out o, kb_in q, kb_in k, kb_in v, int S, int C, float scale, void *work,
                                      size_t work_bytes) {
    return kc_vae_attention(backend(), o, q, k, v, S, C, scale, work, work_bytes);
}

extern "C" int kc_vae_rms_norm(kb_out out, kb_in x, kb_in gamma, int64_t n, int C, int silu) {
    if (kc_vae_check_norm("cuda-bf16", out, x, gamma, n, C)) return -1;
    if (!n) return 0;
    const float scale = (float)sqrt((double)C);
    vae_norm_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(out, x, gamma, (size_t)n, C, scale, silu);
    return kc_launched("vae_rms_norm");
}

extern "C" int kc_vae_dupup_add(kb_out out, kb_in x, int nf, int H, int W, int cin, int cout, int ft, int drop) {
    if (kc_vae_check_dupup("cuda-bf16", out, x, nf, H, W, cin, cout, ft, drop)) return -1;
    const size_t n = (size_t)(nf * ft - drop) * 4 * H * W * cout;
    vae_dupup_kernel<<<kc_blocks(n), KC_THREADS, 0, kc_stream>>>(out, x, H, W, cin, cout, ft, drop, n);
    return kc_launched("vae_dupup_add");
}
