/* kernels/cpu/vae_conv.c — the Wan VAE decoder's layers on the fp32 CPU (the CPU table's vae_* entries,
 * kernels/dev_ops.h): the causal 3-D convolution as im2col rows + k_cpu_gemm (or the small-channel path of
 * conv_small.c), WanRMS_norm + SiLU and DupUp3D's shortcut add, on channel-last frames ([nf, H, W, C]).
 * Moved here from model/vae/wan_vae_layers.c, unchanged (the same operations in the same order), when the decoder
 * was written over the device table; the device's counterparts are the bodies of kernels/body/kb_vae.h.
 * Reference: diffusers 0.42.1 autoencoder_kl_wan.py (WanCausalConv3d, WanRMS_norm, DupUp3D, WanResample's
 * nearest-exact 2x up-sampling, which for a factor of exactly 2 is pixel repetition). */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu.h"

/* Small copies and zero fills of the im2col rows (a few channels per tap in the small VAEs, where calls to memcpy
 * and memset cost more than the bytes): 8 floats at a time, fixed-size copies the compiler inlines (the pragma keeps
 * it from turning these loops back into library calls). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif
static inline void copy_floats(float *restrict d, const float *restrict s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) memcpy(d + i, s + i, 8 * sizeof(float));
    if (n - i >= 4) memcpy(d + i, s + i, 4 * sizeof(float)), i += 4;
    for (; i < n; i++) d[i] = s[i];
}
static inline void zero_floats(float *d, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) memset(d + i, 0, 8 * sizeof(float));
    for (; i < n; i++) d[i] = 0.0f;
}

/* Source frame of padded tap position p (relative to the chunk: p < 0 reads the cache) or NULL for zeros. */
static const float *tap_frame(const float *x, int p, const float *cache, int ncache, size_t fsz) {
    if (p >= 0) return x + (size_t)p * fsz;
    int cp = ncache + p; /* cache holds the last ncache frames before the chunk */
    if (cp < 0 || !cache) return NULL;
    return cache + (size_t)cp * fsz;
}

int k_cpu_vae_conv3d(float *out, const float *x, const float *cache, int ncache, const float *wt, const float *bias,
                     int nf, int H, int W, int ci, int co, int kt, int kh, int kw, int up2x, float *col_buf,
                     size_t col_floats) {
    const int Ho = up2x ? 2 * H : H, Wo = up2x ? 2 * W : W;
    const size_t fsz = (size_t)H * W * ci, npix = (size_t)Ho * Wo;
    if (kt == 1 && kh == 1 && kw == 1 && !up2x) { /* pointwise: one GEMM over all pixels of all frames */
        k_cpu_gemm(0, 1, (int)(nf * npix), co, ci, 1.0f, x, ci, wt, ci, 0.0f, out, co, bias);
        return 0;
    }
    const int K = kt * kh * kw * ci, KT = kh * kw * ci; /* K: weight row length; KT: one time tap's share */
    size_t rows = col_floats / (size_t)K;
    if (rows < 1) return core_error("vae: im2col scratch too small for K = %d", K);
    if (rows > npix) rows = npix;
    const int ph = kh / 2, pw = kw / 2;
    /* few output channels (the tiny VAE): the same chains without im2col rows (conv_small.c) */
    const float *taps[64];
    int small = co <= K_CONV_SMALL_MAX_CO && nf * kt <= 64;
    for (int f = 0; small && f < nf; f++)
        for (int t = 0; t < kt; t++) taps[f * kt + t] = tap_frame(x, f + t - (kt - 1), cache, ncache, fsz);
    const int nf_gemm = small && !k_cpu_conv_small(out, nf, taps, kt, H, W, ci, up2x, wt, K, kh, kw, co, bias) ? 0 : nf;
    for (int f = 0; f < nf_gemm; f++) {
        const float *src[3] = {NULL, NULL, NULL};
        for (int t = 0; t < kt; t++) src[t] = tap_frame(x, f + t - (kt - 1), cache, ncache, fsz);
        /* Taps reading the zero padding before the stream are the leading ones: leave them out of the GEMM
         * (their weights meet zeros), which makes the first latent frame about kt times cheaper. */
        int t0 = 0;
        while (t0 < kt - 1 && !src[t0]) t0++;
        const int Ku = (kt - t0) * KT;
        for (size_t r0 = 0; r0 < npix; r0 += rows) {
            const size_t nr = npix - r0 < rows ? npix - r0 : rows;
            float *col = col_buf;
#pragma omp parallel for schedule(static) if ((size_t)nr * (size_t)Ku >= K_PAR_MIN_ELEMS)
            for (long long r = 0; r < (long long)nr; r++) {
                const int py = (int)((r0 + (size_t)r) / (size_t)Wo), px = (int)((r0 + (size_t)r) % (size_t)Wo);
                float *dst = col + (size_t)r * Ku;
                for (int t = t0; t < kt; t++)
                    for (int dy = 0; dy < kh; dy++) {
                        const int yy = py + dy - ph;
                        if (!src[t] || yy < 0 || yy >= Ho) {
                            zero_floats(dst, (size_t)kw * ci);
                            dst += (size_t)kw * ci;
                            continue;
                        }
                        const float *row = src[t] + (size_t)(up2x ? yy >> 1 : yy) * W * ci;
                        if (!up2x && px - pw >= 0 && px - pw + kw <= Wo) { /* the kw taps are one run */
                            copy_floats(dst, row + (size_t)(px - pw) * ci, (size_t)kw * ci);
                            dst += (size_t)kw * ci;
                            continue;
                        }
                        for (int dx = 0; dx < kw; dx++, dst += ci) {
                            const int xx = px + dx - pw;
                            if (xx < 0 || xx >= Wo) zero_floats(dst, (size_t)ci);
                            else copy_floats(dst, row + (size_t)(up2x ? xx >> 1 : xx) * ci, (size_t)ci);
                        }
                    }
            }
            k_cpu_gemm(0, 1, (int)nr, co, Ku, 1.0f, col, Ku, wt + (size_t)t0 * KT, K, 0.0f,
                       out + ((size_t)f * npix + r0) * co, co, bias);
        }
    }
    return 0;
}

void k_cpu_vae_rms_norm(float *out, const float *x, const float *g, int64_t n, int C, int silu) {
    const float scale = (float)sqrt((double)C);
#pragma omp parallel for schedule(static) if ((size_t)n * C >= K_PAR_MIN_ELEMS)
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * C;
        float *o = out + (size_t)r * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        float den = (float)sqrt(ss);
        if (den < 1e-12f) den = 1e-12f; /* F.normalize: x / max(||x||_2, eps) */
        for (int c = 0; c < C; c++) {
            float v = xr[c] / den * scale * g[c];
            o[c] = silu ? v / (1.0f + expf(-v)) : v;
        }
    }
}

void k_cpu_vae_dupup_add(float *out, const float *x, int nf, int H, int W, int cin, int cout, int ft, int drop) {
    const int fs = 2, factor = ft * fs * fs, repeats = cout * factor / cin;
    const int Ho = H * fs, Wo = W * fs, nfo = nf * ft - drop;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)nfo * Ho * Wo * cout >= K_PAR_MIN_ELEMS)
    for (int fo = 0; fo < nfo; fo++)
        for (int yo = 0; yo < Ho; yo++) {
            const int tf = fo + drop, t = tf / ft, a = tf % ft, y = yo / fs, i = yo % fs;
            for (int xo = 0; xo < Wo; xo++) {
                const int xs = xo / fs, j = xo % fs;
                const float *src = x + (((size_t)t * H + y) * W + xs) * cin;
                float *dst = out + (((size_t)fo * Ho + yo) * Wo + xo) * cout;
                for (int o = 0; o < cout; o++) {
                    const int e = ((o * ft + a) * fs + i) * fs + j; /* channel of repeat_interleave'd x */
                    dst[o] += src[e / repeats];
                }
            }
        }
}
