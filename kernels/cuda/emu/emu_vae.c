/* kernels/cuda/emu/emu_vae.c — the element and row work of the emulated device's Wan VAE entries (k_emu.h): the
 * bodies of kernels/body/kb_vae.h looped over on the host in the CUDA kernels' decomposition (one element or row at a
 * time). emu_ops.c runs the entries' host drivers (kernels/cuda/precond/kc_vae.h) over these and its GEMM. */
#include "core/error.h"
#include "kernels/body/kb_vae.h"
#include "kernels/cuda/emu/k_emu.h"
#include "kernels/cuda/precond/kc_precond.h"
#include "kernels/cuda/precond/kc_vae.h"

int k_emu_vae_im2col(kb_bf16 *col, int ldc, int K, kb_in x, kb_in cache, kb_vae_conv_geom g, int f, size_t pix0,
                     size_t rows) {
    if (kc_precond_index32("vae_conv3d (im2col)", rows * (size_t)ldc)) return -1;
    for (size_t r = 0; r < rows; r++)
        for (int k = 0; k < ldc; k++)
            col[r * ldc + k] = kb_bf16_from_f32(k < K ? kb_vae_im2col_at(x, cache, &g, f, pix0 + r, k) : 0.0f);
    return 0;
}

int k_emu_vae_softmax(kb_bf16 *p, const float *s, int S, int ld) {
    for (int r = 0; r < S; r++) kb_vae_softmax_row(kb_out_bf16(p), s, (size_t)r, S, ld);
    return 0;
}

int k_emu_vae_rms_norm(kb_out out, kb_in x, kb_in gamma, int64_t n, int C, int silu) {
    if (kc_vae_check_norm("emulated", out, x, gamma, n, C) || kc_precond_index32("vae_rms_norm", (size_t)n * C))
        return -1;
    const float scale = (float)sqrt((double)C);
    for (int64_t r = 0; r < n; r++) kb_vae_norm_row(out, x, gamma, (size_t)r, C, scale, silu);
    return 0;
}

int k_emu_vae_dupup_add(kb_out out, kb_in x, int nf, int H, int W, int cin, int cout, int ft, int drop) {
    if (kc_vae_check_dupup("emulated", out, x, nf, H, W, cin, cout, ft, drop)) return -1;
    const size_t n = (size_t)(nf * ft - drop) * 4 * H * W * cout;
    if (kc_precond_index32("vae_dupup_add", n)) return -1;
    for (size_t e = 0; e < n; e++) kb_vae_dupup_at(out, x, H, W, cin, cout, ft, drop, e);
    return 0;
}
