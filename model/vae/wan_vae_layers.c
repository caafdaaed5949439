/* model/vae/wan_vae_layers.c — the Wan VAE decoder's layers on channel-last frames ([nf, H, W, C] per sample),
 * written once over the device table (kernels/dev_ops.h, "the Wan VAE decoder"): causal 3-D convolution with the
 * feature cache (vae_conv3d; the cache kept here with mem_copy2d), WanRMS_norm + SiLU (vae_rms_norm), the
 * single-head spatial attention of the mid-block (vae_attention between two 1x1 convolutions), the DupUp3D shortcut
 * of Wan 2.2's residual up-blocks (vae_dupup_add) and WanResidualBlock (shared with the encoder; its own layers are
 * in wan_vae_enc_layers.c). On the CPU table (fp32) these run the code they ran before the table existed
 * (kernels/cpu/vae_conv.c), so the CPU decode keeps its bits; on a device, bf16 activations and weights
 * (wan_vae_upload.c).
 * Reference: diffusers 0.42.1 autoencoder_kl_wan.py (WanCausalConv3d, WanRMS_norm, WanAttentionBlock, DupUp3D,
 * WanResample's nearest-exact 2x up-sampling, which for a factor of exactly 2 is pixel repetition). */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/dev_table.h"
#include "model/vae/wan_vae_internal.h"

const k_dev_ops *vae_backend(const vae_model *m) { return m->dev ? m->dev : &k_cpu_dev_ops; }

/* Views of activations (the backend's dtype) and of a weight tensor (params on the CPU, the device copy else). */
static kb_in ain(const vae_model *m, const void *p) {
    return m->dw ? kb_in_bf16((const kb_bf16 *)p) : kb_in_f32((const float *)p);
}
static kb_out aout(const vae_model *m, void *p) { return m->dw ? kb_out_bf16((kb_bf16 *)p) : kb_out_f32((float *)p); }
static kb_in wview(const vae_model *m, size_t host_off, size_t dev_off) {
    return m->dw ? kb_in_bf16((const kb_bf16 *)m->dw + dev_off) : kb_in_f32(m->params + host_off);
}
/* The element size of m's activations and the element at index i of p. */
static size_t es(const vae_model *m) { return m->dw ? sizeof(kb_bf16) : sizeof(float); }
static void *at(const vae_model *m, const void *p, size_t i) { return (char *)p + i * es(m); }

int vae_copy2d(const vae_model *m, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
               size_t height) {
    return vae_backend(m)->mem_copy2d(dst, dpitch, src, spitch, width, height);
}

int vae_conv_forward(vae_model *m, const vae_conv *c, const void *x, int nf, int H, int W, int up2x, void *out) {
    vae_state *st = &m->st;
    const k_dev_ops *d = vae_backend(m);
    const size_t fsz = (size_t)H * W * c->cin, fb = fsz * es(m);
    void *cache = c->slot >= 0 ? st->cache[c->slot] : NULL;
    const int ncache = c->slot >= 0 ? st->cache_n[c->slot] : 0;
    k_vae_conv_args a;
    memset(&a, 0, sizeof a);
    a.out = aout(m, out), a.x = ain(m, x), a.cache = ain(m, cache), a.ncache = ncache;
    a.w = wview(m, c->w, c->dev_w), a.bias = wview(m, c->b, c->dev_b);
    a.ldw = m->dw ? c->ldw : c->kt * c->kh * c->kw * c->cin, a.cout_w = m->dw ? c->cout_w : c->cout;
    a.nf = nf, a.H = H, a.W = W, a.cin = c->cin, a.cout = c->cout, a.kt = c->kt, a.kh = c->kh, a.kw = c->kw;
    a.up2x = up2x, a.work = st->col, a.work_bytes = st->col_floats * es(m);
    if (d->vae_conv3d(&a)) return -1;
    if (cache) { /* keep the last VAE_CACHE_T frames of the stream (cache ++ x), as diffusers' cache_x rule does */
        if (nf >= VAE_CACHE_T) {
            if (vae_copy2d(m, cache, fb, at(m, x, (size_t)(nf - VAE_CACHE_T) * fsz), fb, fb, VAE_CACHE_T)) return -1;
            st->cache_n[c->slot] = VAE_CACHE_T;
        } else if (ncache >= 1) {
            if (ncache > 1 && vae_copy2d(m, cache, fb, at(m, cache, (size_t)(ncache - 1) * fsz), fb, fb, 1)) return -1;
            if (vae_copy2d(m, at(m, cache, fsz), fb, x, fb, fb, 1)) return -1;
            st->cache_n[c->slot] = 2;
        } else {
            if (vae_copy2d(m, cache, fb, x, fb, fb, 1)) return -1;
            st->cache_n[c->slot] = 1;
        }
    }
    return 0;
}

int vae_norm_forward(const vae_model *m, const vae_norm *nm, const void *x, void *out, int64_t n, int silu) {
    return vae_backend(m)->vae_rms_norm(aout(m, out), ain(m, x), wview(m, nm->gamma, nm->dev_gamma), n, nm->c, silu);
}

int vae_attn_forward(vae_model *m, const vae_attnblock *a, void *x, int nf, int H, int W) {
    vae_state *st = &m->st;
    const k_dev_ops *d = vae_backend(m);
    /* q, k, v, o: [S, Cq]; a device's attention GEMMs need rows of a multiple of 8 (zero columns added) */
    const int C = a->c, S = H * W, Cq = m->dw ? (C + 7) / 8 * 8 : C;
    const size_t sc = (size_t)S * C, sq = (size_t)S * Cq, e = es(m), row = (size_t)C * e, rq = (size_t)Cq * e;
    void *t = st->attn, *qkv = at(m, t, sq), *q = at(m, qkv, 3 * sq), *k = at(m, q, sq), *v = at(m, k, sq),
         *o = at(m, v, sq), *work = at(m, o, sq);
    const size_t work_bytes = (st->attn_floats - 8 * sq) * e;
    for (int f = 0; f < nf; f++) {
        void *xf = at(m, x, (size_t)f * sc);
        if (vae_norm_forward(m, &a->n, xf, t, S, 0)) return -1;
        if (vae_conv_forward(m, &a->qkv, t, 1, H, W, 0, qkv)) return -1;
        if (Cq != C && d->mem_zero(q, 3 * sq * e)) return -1;
        if (vae_copy2d(m, q, rq, qkv, 3 * row, row, (size_t)S) ||
            vae_copy2d(m, k, rq, at(m, qkv, (size_t)C), 3 * row, row, (size_t)S) ||
            vae_copy2d(m, v, rq, at(m, qkv, 2 * (size_t)C), 3 * row, row, (size_t)S))
            return -1;
        if (d->vae_attention(aout(m, o), ain(m, q), ain(m, k), ain(m, v), S, Cq, (float)(1.0 / sqrt((double)C)),
                             work, work_bytes))
            return -1;
        void *po = o, *pr = t; /* the projection's input and output */
        if (Cq != C) {
            if (vae_copy2d(m, t, row, o, rq, row, (size_t)S)) return -1;
            po = t, pr = o;
        }
        if (vae_conv_forward(m, &a->proj, po, 1, H, W, 0, pr)) return -1;
        if (d->add(aout(m, xf), ain(m, pr), (int64_t)sc)) return -1;
    }
    return 0;
}

int vae_dupup_add(const vae_model *m, void *out, const void *x, int nf, int H, int W, int cin, int cout, int ft,
                  int drop) {
    return vae_backend(m)->vae_dupup_add(aout(m, out), ain(m, x), nf, H, W, cin, cout, ft, drop);
}

int vae_res_forward(vae_model *m, const vae_resblock *r, const void *x, int nf, int H, int W, void *out, void *s1,
                    void *s2) {
    const int64_t n = (int64_t)nf * H * W;
    if (r->has_sc) {
        if (vae_conv_forward(m, &r->sc, x, nf, H, W, 0, out)) return -1;
    } else {
        const size_t b = (size_t)n * r->cin * es(m);
        if (vae_copy2d(m, out, b, x, b, b, 1)) return -1;
    }
    if (vae_norm_forward(m, &r->n1, x, s1, n, 1)) return -1;
    if (vae_conv_forward(m, &r->c1, s1, nf, H, W, 0, s2)) return -1;
    if (vae_norm_forward(m, &r->n2, s2, s2, n, 1)) return -1;
    if (vae_conv_forward(m, &r->c2, s2, nf, H, W, 0, s1)) return -1;
    return vae_backend(m)->add(aout(m, out), ain(m, s1), (int64_t)((size_t)n * r->cout));
}
