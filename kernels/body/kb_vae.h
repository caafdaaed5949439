/* kernels/body/kb_vae.h — the element and row bodies of the Wan VAE decoder's device entries (kernels/dev_ops.h,
 * "the Wan VAE decoder"): the im2col gather of the causal 3-D convolution (feature cache, zero padding, optional 2x
 * nearest up-sampling), WanRMS_norm (+ SiLU), the DupUp3D shortcut's add and the row softmax of the mid-block's
 * single-head attention. The CUDA kernels (kernels/cuda/kern_vae.cu) run them one thread per element or row; the
 * emulated device (kernels/cuda/emu/emu_vae.c) loops over them on the host. The fp32 CPU table keeps its own code
 * (kernels/cpu/vae_conv.c: im2col rows + k_cpu_gemm, the small-channel path, skipped leading taps), which these
 * bodies follow element for element; on bf16 storage the device's values agree within bf16 rounding.
 * Maths-library calls: expf (SiLU, softmax) differs by an ulp or two between CUDA and glibc.
 * Reference: diffusers 0.42.1 autoencoder_kl_wan.py (WanCausalConv3d, WanRMS_norm, DupUp3D, WanAttentionBlock). */
#ifndef KERNELS_BODY_KB_VAE_H
#define KERNELS_BODY_KB_VAE_H

#include <math.h>

#include "kernels/body/kb_base.h"

/* The geometry of one causal convolution over a chunk (channel-last frames [nf, H, W, cin]). */
typedef struct kb_vae_conv_geom {
    int H, W, cin, kt, kh, kw, up2x, ncache;
} kb_vae_conv_geom;

/* im2col value of output pixel `pix` (row-major over Ho x Wo, Ho = 2H with up2x) of output frame f, column k of the
 * weight row [kt, kh, kw, cin] (k < kt kh kw cin): the input of time tap t is stream frame f + t - (kt - 1) of the
 * chunk x (>= 0), else frame ncache + (f + t - (kt - 1)) of the cache (the stream's last ncache frames before x),
 * else zero (before the stream); spatial taps outside the (up-sampled) frame read zero (padding kh/2, kw/2). */
KB_FN float kb_vae_im2col_at(kb_in x, kb_in cache, const kb_vae_conv_geom *g, int f, size_t pix, int k) {
    const int ci = k % g->cin, r1 = k / g->cin, dx = r1 % g->kw, r2 = r1 / g->kw, dy = r2 % g->kh, t = r2 / g->kh;
    const int Ho = g->up2x ? 2 * g->H : g->H, Wo = g->up2x ? 2 * g->W : g->W;
    const int py = (int)(pix / (size_t)Wo), px = (int)(pix % (size_t)Wo);
    const int yy = py + dy - g->kh / 2, xx = px + dx - g->kw / 2;
    if (yy < 0 || yy >= Ho || xx < 0 || xx >= Wo) return 0.0f;
    const int p = f + t - (g->kt - 1);
    kb_in src = x;
    int fr = p;
    if (p < 0) {
        fr = g->ncache + p;
        if (fr < 0 || !cache.p) return 0.0f;
        src = cache;
    }
    const int ys = g->up2x ? yy >> 1 : yy, xs = g->up2x ? xx >> 1 : xx;
    return kb_get(src, (((size_t)fr * g->H + ys) * g->W + xs) * g->cin + ci);
}

/* WanRMS_norm of row r (C channels): out = x / max(||x||_2, 1e-12) * scale * gamma (scale = sqrt(C) in fp32),
 * then SiLU v / (1 + exp(-v)) when silu; the squares summed in double in channel order, as the CPU's loop. out may
 * alias x (each element is read before it is written). */
KB_FN void kb_vae_norm_row(kb_out out, kb_in x, kb_in gamma, size_t r, int C, float scale, int silu) {
    const size_t row = r * (size_t)C;
    double ss = 0;
    for (int c = 0; c < C; c++) {
        const double v = (double)kb_get(x, row + c);
        ss += v * v;
    }
    float den = (float)sqrt(ss);
    if (den < 1e-12f) den = 1e-12f;
    for (int c = 0; c < C; c++) {
        const float v = kb_get(x, row + c) / den * scale * kb_get(gamma, (size_t)c);
        kb_set(out, row + c, silu ? v / (1.0f + expf(-v)) : v);
    }
}

/* DupUp3D's shortcut added into output element e of out [nfo, 2H, 2W, cout] (nfo = nf ft - drop): x [nf, H, W, cin]
 * repeat_interleave'd over channels (cout ft 4 / cin repeats), its expanded channel ((o ft + a) 2 + i) 2 + j read
 * for output channel o of frame a of the time group, row i and column j of the 2x2 block; drop leading frames. */
KB_FN void kb_vae_dupup_at(kb_out out, kb_in x, int H, int W, int cin, int cout, int ft, int drop, size_t e) {
    const int fs = 2, repeats = cout * ft * fs * fs / cin, Ho = H * fs, Wo = W * fs;
    const int o = (int)(e % (size_t)cout);
    size_t q = e / (size_t)cout;
    const int xo = (int)(q % (size_t)Wo);
    q /= (size_t)Wo;
    const int yo = (int)(q % (size_t)Ho), fo = (int)(q / (size_t)Ho);
    const int tf = fo + drop, t = tf / ft, a = tf % ft, y = yo / fs, i = yo % fs, xs = xo / fs, j = xo % fs;
    const int ex = ((o * ft + a) * fs + i) * fs + j;
    kb_acc(out, e, kb_get(x, (((size_t)t * H + y) * W + xs) * cin + ex / repeats));
}

/* Row softmax of the attention scores: p[c] = exp(s[c] - max) / sum over the S columns (the sum in double, column
 * order); s: fp32 row, p: the probabilities' row (bf16 on the device), columns S .. ld - 1 set to 0. */
KB_FN void kb_vae_softmax_row(kb_out p, const float *s, size_t r, int S, int ld) {
    const float *sr = s + r * (size_t)ld;
    float mx = sr[0];
    for (int c = 1; c < S; c++) mx = sr[c] > mx ? sr[c] : mx;
    double sum = 0;
    for (int c = 0; c < S; c++) sum += (double)expf(sr[c] - mx);
    const float inv = (float)(1.0 / sum);
    for (int c = 0; c < ld; c++) kb_set(p, r * (size_t)ld + c, c < S ? expf(sr[c] - mx) * inv : 0.0f);
}

#endif
