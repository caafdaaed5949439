/* model/vae/wan_vae_enc_layers.c — the Wan VAE encoder's down-sampling layers on channel-last frames ([nf, H, W, C]
 * per sample): WanResample's 'downsample2d' conv (zero pad right/bottom, 3x3 stride 2), 'downsample3d''s strided
 * causal time_conv, and the AvgDown3D shortcut of Wan 2.2's residual down-blocks. Every convolution is im2col + one
 * k_cpu_ops.gemm per block of output pixels, as in wan_vae_layers.c, with the weights reordered at load time to
 * [cout, kt, kh, kw, cin]. Reference: diffusers 0.42.1 autoencoder_kl_wan.py (WanResample.forward, AvgDown3D). */
#include <string.h>

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/vae/wan_vae_internal.h"

/* Output pixels per GEMM so that rows x K fits the im2col scratch. */
static size_t col_rows(const vae_model *m, int K, size_t npix) {
    size_t rows = m->st.col_floats / (size_t)K;
    return rows > npix ? npix : rows;
}

int vae_conv_down2d(vae_model *m, const vae_conv *c, const float *x, int nf, int H, int W, float *out) {
    const int ci = c->cin, co = c->cout, K = 9 * ci;
    if (c->kt != 1 || c->kh != 3 || c->kw != 3) return core_error("vae: downsample conv must be 3x3 (internal error)");
    if (H < 2 || W < 2) return core_error("vae: cannot down-sample a %d x %d feature map", H, W);
    const int Ho = (H - 2) / 2 + 1, Wo = (W - 2) / 2 + 1;
    const size_t npix = (size_t)Ho * Wo, fsz = (size_t)H * W * ci;
    const size_t rows = col_rows(m, K, npix);
    if (rows < 1) return core_error("vae: im2col scratch too small for K = %d", K);
    const float *wt = m->params + c->w, *bias = m->params + c->b;
    for (int f = 0; f < nf; f++) {
        const float *src = x + (size_t)f * fsz;
        for (size_t r0 = 0; r0 < npix; r0 += rows) {
            const size_t nr = npix - r0 < rows ? npix - r0 : rows;
            float *col = m->st.col;
#pragma omp parallel for schedule(static) if ((size_t)nr * (size_t)K >= K_PAR_MIN_ELEMS)
            for (long long r = 0; r < (long long)nr; r++) {
                const int oy = (int)((r0 + (size_t)r) / (size_t)Wo), ox = (int)((r0 + (size_t)r) % (size_t)Wo);
                float *dst = col + (size_t)r * K;
                for (int dy = 0; dy < 3; dy++)
                    for (int dx = 0; dx < 3; dx++, dst += ci) {
                        const int yy = 2 * oy + dy, xx = 2 * ox + dx; /* the padding is one row/column after */
                        if (yy >= H || xx >= W) memset(dst, 0, (size_t)ci * sizeof(float));
                        else memcpy(dst, src + ((size_t)yy * W + xx) * ci, (size_t)ci * sizeof(float));
                    }
            }
            k_cpu_ops.gemm(0, 1, (int)nr, co, K, 1.0f, col, K, wt, K, 0.0f, out + ((size_t)f * npix + r0) * co, co,
                           bias);
        }
    }
    return 0;
}

int vae_conv_tdown(vae_model *m, const vae_conv *c, const float *prev, const float *x, int nf, int H, int W,
                   float *out) {
    const int ci = c->cin, co = c->cout, K = 3 * ci;
    if (c->kt != 3 || c->kh != 1 || c->kw != 1) return core_error("vae: time_conv must be 3x1x1 (internal error)");
    if (nf < 2)
        return core_error("vae: a temporal down-sampler got %d frame(s) in a chunk after the first (needs >= 2: "
                          "more temporal down-samplers than 4-frame chunks allow)",
                          nf);
    const int nfo = (nf - 2) / 2 + 1;
    const size_t npix = (size_t)H * W, fsz = npix * ci;
    const size_t rows = col_rows(m, K, npix);
    if (rows < 1) return core_error("vae: im2col scratch too small for K = %d", K);
    const float *wt = m->params + c->w, *bias = m->params + c->b;
    for (int k = 0; k < nfo; k++) {
        const float *src[3];
        for (int t = 0; t < 3; t++) { /* stream position 2k + t: 0 is prev, s >= 1 is x[s - 1] */
            const int s = 2 * k + t;
            src[t] = s == 0 ? prev : x + (size_t)(s - 1) * fsz;
        }
        for (size_t r0 = 0; r0 < npix; r0 += rows) {
            const size_t nr = npix - r0 < rows ? npix - r0 : rows;
            float *col = m->st.col;
#pragma omp parallel for schedule(static) if ((size_t)nr * (size_t)K >= K_PAR_MIN_ELEMS)
            for (long long r = 0; r < (long long)nr; r++)
                for (int t = 0; t < 3; t++)
                    memcpy(col + (size_t)r * K + (size_t)t * ci, src[t] + (r0 + (size_t)r) * ci,
                           (size_t)ci * sizeof(float));
            k_cpu_ops.gemm(0, 1, (int)nr, co, K, 1.0f, col, K, wt, K, 0.0f, out + ((size_t)k * npix + r0) * co, co,
                           bias);
        }
    }
    return 0;
}

void vae_avgdown_add(float *out, const float *x, int nf, int H, int W, int cin, int cout, int ft, int fs) {
    const int factor = ft * fs * fs, g = cin * factor / cout;
    const int pad = (ft - nf % ft) % ft, nfo = (nf + pad) / ft, Ho = H / fs, Wo = W / fs;
    const float gn = (float)g;
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)nfo * Ho * Wo * cout * g >= K_PAR_MIN_ELEMS)
    for (int fo = 0; fo < nfo; fo++)
        for (int yo = 0; yo < Ho; yo++)
            for (int xo = 0; xo < Wo; xo++) {
                float *dst = out + (((size_t)fo * Ho + yo) * Wo + xo) * cout;
                for (int o = 0; o < cout; o++) {
                    float s = 0.0f; /* in the order of the group, as torch's mean over dim 2 */
                    for (int e = o * g; e < (o + 1) * g; e++) {
                        const int c = e / factor, rem = e % factor, a = rem / (fs * fs), i = (rem / fs) % fs,
                                  j = rem % fs;
                        const int t = fo * ft + a - pad; /* frames before the chunk are the zero padding */
                        if (t < 0) continue;
                        s += x[(((size_t)t * H + yo * fs + i) * W + xo * fs + j) * cin + c];
                    }
                    dst[o] += s / gn;
                }
            }
}
