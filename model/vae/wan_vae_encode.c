/* model/vae/wan_vae_encode.c — AutoencoderKLWan.encode: the encoder's layer structure and parameter table, loading,
 * and the chunked encode loop (the first frame alone, then chunks of 4 frames, with the feature cache) up to the
 * posterior mode and the pipeline's normalisation (see wan_vae_encode.h).
 * Reference: diffusers 0.42.1 autoencoder_kl_wan.py: WanEncoder3d.__init__ / forward (dims [base_dim * m for m in
 * [1] + dim_mult]; Wan 2.1: a flat down_blocks list of WanResidualBlocks and WanResample's; Wan 2.2: one
 * WanResidualDownBlock per level with the AvgDown3D shortcut added after the down-sampler), WanResample.forward
 * ('downsample3d': the first chunk keeps its frame for the cache and skips time_conv), AutoencoderKLWan._encode
 * (patchify, chunks, quant_conv), DiagonalGaussianDistribution.mode (the mean: channels 0 .. z_dim - 1) and
 * WanImageToVideoPipeline.prepare_latents ((z - latents_mean) * (1 / latents_std)). */
#include "model/vae/wan_vae_encode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/vae/wan_vae_internal.h"

/* One level of the encoder: WanResidualDownBlock (Wan 2.2) or the same run of down_blocks entries (Wan 2.1). */
typedef struct {
    int nres;
    vae_resblock res[VAE_MAX_RES];
    int in_dim, out_dim;
    int down;           /* 0 none (last level), 2 downsample2d, 3 downsample3d */
    vae_conv resample;  /* Conv2d 3x3 stride 2 after ZeroPad2d((0, 1, 0, 1)), out_dim -> out_dim */
    vae_conv time_conv; /* downsample3d: (3, 1, 1) stride 2, no padding, out_dim -> out_dim */
    int avg, avg_ft, avg_fs; /* Wan 2.2: AvgDown3D(in_dim -> out_dim, factor_t, factor_s) shortcut */
} enc_level;

struct vae_encoder {
    vae_model *m; /* config, parameter table + weights, scratch and feature cache: the layer kernels' context */
    int dims[VAE_MAX_LEVELS + 1];
    int nlev;
    enc_level lev[VAE_MAX_LEVELS];
    vae_conv conv_in, conv_out, quant;
    vae_resblock mid_res[2];
    vae_attnblock mid_attn;
    vae_norm norm_out;
    int n_tdown, n_sdown;
    float *tcache[VAE_MAX_LEVELS]; /* downsample3d: the last frame after the spatial conv [H_l / 2, W_l / 2, out] */
    int tseen[VAE_MAX_LEVELS];     /* 1 once the first chunk passed (diffusers' feat_cache entry is set) */
    size_t tcache_bytes;
};

/* ---- structure ---- */

static int build(vae_encoder *e) {
    vae_model *m = e->m;
    const vae_config *c = &m->cfg;
    const int L = c->n_mult, p = c->patch_size, z2 = 2 * c->z_dim;
    if (c->n_attn_scales)
        return core_error("vae config: attn_scales has %d entries: the encoder's attention blocks are not supported "
                          "(every released Wan VAE has [])",
                          c->n_attn_scales);
    if (c->in_channels % (p * p))
        return core_error("vae config: in_channels %d is not a multiple of patch_size^2 = %d", c->in_channels, p * p);
    e->dims[0] = c->base_dim;
    for (int i = 0; i < L; i++) e->dims[i + 1] = c->base_dim * c->dim_mult[i];
    if (vae_make_conv(m, &e->conv_in, "encoder.conv_in", c->in_channels, e->dims[0], 3, 3, 1, 1, 1)) return -1;
    int scale = 1, flat = 0; /* flat: index into Wan 2.1's down_blocks list */
    char p1[VAE_NAME_MAX], p2[VAE_NAME_MAX];
    e->nlev = L;
    e->n_tdown = e->n_sdown = 0;
    for (int i = 0; i < L; i++) {
        enc_level *lv = &e->lev[i];
        memset(lv, 0, sizeof *lv);
        const int in_dim = e->dims[i], out_dim = e->dims[i + 1], down = i != L - 1;
        const int temporal = down && c->temperal_downsample[i];
        lv->in_dim = in_dim, lv->out_dim = out_dim, lv->nres = c->num_res_blocks;
        int ch = in_dim;
        for (int j = 0; j < lv->nres; j++) {
            if (c->is_residual) snprintf(p1, sizeof p1, "encoder.down_blocks.%d.resnets.%d", i, j);
            else snprintf(p1, sizeof p1, "encoder.down_blocks.%d", flat++);
            if (vae_make_res(m, &lv->res[j], p1, ch, out_dim, scale)) return -1;
            ch = out_dim;
        }
        if (down) {
            if (c->is_residual) snprintf(p1, sizeof p1, "encoder.down_blocks.%d.downsampler", i);
            else snprintf(p1, sizeof p1, "encoder.down_blocks.%d", flat++);
            snprintf(p2, sizeof p2, "%s.resample.1", p1);
            if (vae_make_conv(m, &lv->resample, p2, out_dim, out_dim, 1, 3, 0, 0, scale)) return -1;
            if (temporal) {
                snprintf(p2, sizeof p2, "%s.time_conv", p1);
                if (vae_make_conv(m, &lv->time_conv, p2, out_dim, out_dim, 3, 1, 1, 0, 2 * scale)) return -1;
                e->n_tdown++;
            }
            lv->down = temporal ? 3 : 2;
            e->n_sdown++;
            scale *= 2;
        }
        if (c->is_residual) {
            lv->avg = 1, lv->avg_ft = temporal ? 2 : 1, lv->avg_fs = down ? 2 : 1;
            const int f = lv->avg_ft * lv->avg_fs * lv->avg_fs;
            if ((in_dim * f) % out_dim)
                return core_error("vae config: down-block %d: AvgDown3D needs in_dim * factor (%d) divisible by "
                                  "out_dim %d",
                                  i, in_dim * f, out_dim);
        }
    }
    if (e->n_tdown > 2)
        return core_error("vae config: temperal_downsample has %d temporal down-samplers; the encoder's 4-frame chunks "
                          "allow at most 2",
                          e->n_tdown);
    const int d = e->dims[L];
    if (vae_make_res(m, &e->mid_res[0], "encoder.mid_block.resnets.0", d, d, scale)) return -1;
    vae_make_norm(m, &e->mid_attn.n, "encoder.mid_block.attentions.0.norm", d, 1);
    e->mid_attn.c = d;
    if (vae_make_conv(m, &e->mid_attn.qkv, "encoder.mid_block.attentions.0.to_qkv", d, 3 * d, 1, 1, 0, 0, scale))
        return -1;
    if (vae_make_conv(m, &e->mid_attn.proj, "encoder.mid_block.attentions.0.proj", d, d, 1, 1, 0, 0, scale)) return -1;
    if (vae_make_res(m, &e->mid_res[1], "encoder.mid_block.resnets.1", d, d, scale)) return -1;
    vae_make_norm(m, &e->norm_out, "encoder.norm_out", d, 0);
    if (vae_make_conv(m, &e->conv_out, "encoder.conv_out", d, z2, 3, 3, 1, 1, scale)) return -1;
    if (vae_make_conv(m, &e->quant, "quant_conv", z2, z2, 1, 1, 1, 0, scale)) return -1;
    if (!m->table) return core_error("out of memory for the VAE parameter table");
    return 0;
}

int vae_encoder_build_table(vae_model *m) {
    vae_encoder e;
    memset(&e, 0, sizeof e);
    e.m = m;
    return build(&e);
}

vae_encoder *vae_encoder_load(const char *dir_in) {
    char dir[4096];
    vae_encoder *e = calloc(1, sizeof *e);
    if (!e || !(e->m = calloc(1, sizeof *e->m))) {
        free(e);
        core_error("out of memory");
        return NULL;
    }
    if (vae_open_config(dir_in, dir, sizeof dir, &e->m->cfg) || build(e) ||
        vae_load_weights(e->m, dir, VAE_PART_ENCODER)) {
        vae_encoder_free(e);
        return NULL;
    }
    return e;
}

static void tcache_free(vae_encoder *e) {
    for (int i = 0; i < VAE_MAX_LEVELS; i++) free(e->tcache[i]), e->tcache[i] = NULL;
    e->tcache_bytes = 0;
}

void vae_encoder_free(vae_encoder *e) {
    if (!e) return;
    tcache_free(e);
    vae_free(e->m);
    free(e);
}

const vae_config *vae_encoder_get_config(const vae_encoder *e) { return &e->m->cfg; }

int vae_encoder_frames_out(const vae_encoder *e, int F) {
    if (F < 1 || (F - 1) % 4) return 0;
    return 1 + (F - 1) / 4 * (4 >> e->n_tdown);
}

int vae_encoder_spatial_factor(const vae_encoder *e) { return (1 << e->n_sdown) * e->m->cfg.patch_size; }

int vae_encoder_video_channels(const vae_encoder *e) {
    return e->m->cfg.in_channels / (e->m->cfg.patch_size * e->m->cfg.patch_size);
}

size_t vae_encoder_state_bytes(const vae_encoder *e) { return e->m->st.bytes; }
size_t vae_encoder_cache_bytes(const vae_encoder *e) { return e->m->st.cache_bytes; }

/* ---- state ---- */

static size_t zmax(size_t a, size_t b) { return a > b ? a : b; }

/* The encode state's sizes for a patchified input of Hp x Wp: 4 activation buffers (5 with the AvgDown3D shortcut's
 * copy) sized for the largest chunk tensor, im2col scratch, the attention scratch of the mid-block, the feature cache
 * (2 frames per cached convolution, 1 per temporal down-sampler). state_begin allocates exactly these; the start-up
 * estimate (vae_encoder_estimate) reports them. */
typedef struct {
    size_t buf_floats, col_floats, attn_floats;
    size_t cache_bytes;  /* the cached convolutions' frames */
    size_t tcache_bytes; /* the temporal down-samplers' last frames */
    int nbuf;
    size_t bytes;        /* everything: what vae_encoder_state_bytes reports */
} enc_plan;

static void plan_state(const vae_encoder *e, int Hp, int Wp, enc_plan *pl) {
    const vae_model *m = e->m;
    const vae_config *c = &m->cfg;
    size_t hw = (size_t)Hp * Wp, nf = 4;
    size_t act = nf * hw * zmax((size_t)c->in_channels, (size_t)e->dims[0]);
    size_t col = hw * 27 * (size_t)c->in_channels, kmax = 27 * (size_t)c->in_channels;
    for (int i = 0; i < e->nlev; i++) {
        const enc_level *lv = &e->lev[i];
        const size_t cm = zmax((size_t)lv->in_dim, (size_t)lv->out_dim);
        act = zmax(act, nf * hw * cm);
        col = zmax(col, hw * 27 * cm);
        kmax = zmax(kmax, 27 * cm);
        if (lv->down) {
            hw /= 4; /* H and W are multiples of the spatial factor: every level halves exactly */
            col = zmax(col, hw * 9 * (size_t)lv->out_dim);
            if (lv->down == 3) nf /= 2;
        }
    }
    const size_t d = (size_t)e->dims[e->nlev], z2 = 2 * (size_t)c->z_dim;
    act = zmax(act, nf * hw * zmax(d, z2));
    col = zmax(col, hw * 27 * d);
    kmax = zmax(kmax, 27 * d);
    pl->buf_floats = act;
    pl->col_floats = col < zmax((size_t)1 << 22, kmax) ? col : zmax((size_t)1 << 22, kmax);
    pl->attn_floats = 8 * hw * d + hw;
    pl->cache_bytes = pl->tcache_bytes = 0;
    for (int i = 0; i < m->nslots; i++) {
        const size_t s = (size_t)m->slots[i].scale;
        pl->cache_bytes += VAE_CACHE_T * (Hp / s) * (Wp / s) * (size_t)m->slots[i].c * sizeof(float);
    }
    for (int i = 0; i < e->nlev; i++)
        if (e->lev[i].down == 3)
            pl->tcache_bytes += (Hp >> (i + 1)) * (size_t)(Wp >> (i + 1)) * (size_t)e->lev[i].out_dim * sizeof(float);
    pl->nbuf = c->is_residual ? 5 : 4; /* buf[4] keeps a residual down-block's input (AvgDown3D) */
    pl->bytes = pl->cache_bytes + pl->tcache_bytes +
                ((size_t)pl->nbuf * pl->buf_floats + pl->col_floats + pl->attn_floats) * sizeof(float);
}

/* Allocates the encode state of plan_state for a patchified input of Hp x Wp (kept while the size stays the same). */
static int state_begin(vae_encoder *e, int Hp, int Wp) {
    vae_model *m = e->m;
    vae_state *st = &m->st;
    if (st->buf[0] && st->h == Hp && st->w == Wp) return 0;
    vae_state_free(st);
    tcache_free(e);
    st->h = Hp, st->w = Wp;
    const vae_config *c = &m->cfg;
    enc_plan pl;
    plan_state(e, Hp, Wp, &pl);
    st->buf_floats = pl.buf_floats;
    st->col_floats = pl.col_floats;
    st->attn_floats = pl.attn_floats;
    st->cache = calloc((size_t)m->nslots + 1, sizeof *st->cache);
    st->cache_n = calloc((size_t)m->nslots + 1, sizeof *st->cache_n);
    if (!st->cache || !st->cache_n) goto oom;
    for (int i = 0; i < m->nslots; i++) {
        const size_t s = (size_t)m->slots[i].scale;
        const size_t n = VAE_CACHE_T * (Hp / s) * (Wp / s) * (size_t)m->slots[i].c;
        if (!(st->cache[i] = malloc(n * sizeof(float)))) goto oom;
    }
    for (int i = 0; i < e->nlev; i++) {
        const enc_level *lv = &e->lev[i];
        if (lv->down != 3) continue;
        const size_t n = (Hp >> (i + 1)) * (size_t)(Wp >> (i + 1)) * (size_t)lv->out_dim;
        if (!(e->tcache[i] = malloc(n * sizeof(float)))) goto oom;
    }
    e->tcache_bytes = pl.tcache_bytes;
    st->cache_bytes = pl.cache_bytes + pl.tcache_bytes;
    for (int i = 0; i < pl.nbuf; i++)
        if (!(st->buf[i] = malloc(st->buf_floats * sizeof(float)))) goto oom;
    if (!(st->col = malloc(st->col_floats * sizeof(float))) || !(st->attn = malloc(st->attn_floats * sizeof(float))))
        goto oom;
    st->bytes = pl.bytes;
    return 0;
oom:
    vae_state_free(st);
    tcache_free(e);
    return core_error("vae: out of memory for the encode state of a %d x %d input", Hp * c->patch_size,
                      Wp * c->patch_size);
}

/* ---- the encode loop ---- */

/* The three buffer indices among 0..3 other than cur. */
static void others(int cur, int *o, int *s1, int *s2) {
    int k = 0, v[3];
    for (int i = 0; i < 4; i++)
        if (i != cur) v[k++] = i;
    *o = v[0], *s1 = v[1], *s2 = v[2];
}

/* Encodes the chunk in buf[0] ([nf, Hp, Wp, in_channels], patchified) through quant_conv; the result [nf_out, h, w,
 * 2 z_dim] is left in *res (one of st->buf). */
static int encode_chunk(vae_encoder *e, int nf, int *nf_out, float **res) {
    vae_model *m = e->m;
    vae_state *st = &m->st;
    float *b[5];
    for (int i = 0; i < 5; i++) b[i] = st->buf[i];
    int H = st->h, W = st->w, cur = 1, o, s1, s2;
    if (vae_conv_forward(m, &e->conv_in, b[0], nf, H, W, 0, b[1])) return -1;
    for (int i = 0; i < e->nlev; i++) {
        const enc_level *lv = &e->lev[i];
        const int nf_in = nf, H_in = H, W_in = W;
        if (lv->avg) memcpy(b[4], b[cur], (size_t)nf * H * W * lv->in_dim * sizeof(float));
        for (int j = 0; j < lv->nres; j++) {
            others(cur, &o, &s1, &s2);
            if (vae_res_forward(m, &lv->res[j], b[cur], nf, H, W, b[o], b[s1], b[s2])) return -1;
            cur = o;
        }
        if (lv->down) {
            const int dst = (cur + 1) % 4;
            if (vae_conv_down2d(m, &lv->resample, b[cur], nf, H, W, b[dst])) return -1;
            H = (H - 2) / 2 + 1, W = (W - 2) / 2 + 1;
            cur = dst;
            if (lv->down == 3) {
                const size_t fsz = (size_t)H * W * lv->out_dim;
                const float *last = b[cur] + (size_t)(nf - 1) * fsz; /* the next chunk's prev frame */
                if (e->tseen[i]) { /* the first chunk skips time_conv */
                    const int t = (cur + 1) % 4;
                    if (vae_conv_tdown(m, &lv->time_conv, e->tcache[i], b[cur], nf, H, W, b[t])) return -1;
                    nf = (nf - 2) / 2 + 1;
                    cur = t;
                }
                e->tseen[i] = 1;
                memcpy(e->tcache[i], last, fsz * sizeof(float));
            }
        }
        if (lv->avg) {
            const int pad = (lv->avg_ft - nf_in % lv->avg_ft) % lv->avg_ft;
            if ((nf_in + pad) / lv->avg_ft != nf)
                return core_error("vae: AvgDown3D gives %d frames, the down-sampler %d (internal error)",
                                  (nf_in + pad) / lv->avg_ft, nf);
            vae_avgdown_add(b[cur], b[4], nf_in, H_in, W_in, lv->in_dim, lv->out_dim, lv->avg_ft, lv->avg_fs);
        }
    }
    others(cur, &o, &s1, &s2);
    if (vae_res_forward(m, &e->mid_res[0], b[cur], nf, H, W, b[o], b[s1], b[s2])) return -1;
    cur = o;
    if (vae_attn_forward(m, &e->mid_attn, b[cur], nf, H, W)) return -1;
    others(cur, &o, &s1, &s2);
    if (vae_res_forward(m, &e->mid_res[1], b[cur], nf, H, W, b[o], b[s1], b[s2])) return -1;
    cur = o;
    others(cur, &o, &s1, &s2);
    vae_norm_forward(m, &e->norm_out, b[cur], b[s1], (int64_t)nf * H * W, 1);
    if (vae_conv_forward(m, &e->conv_out, b[s1], nf, H, W, 0, b[o])) return -1;
    if (vae_conv_forward(m, &e->quant, b[o], nf, H, W, 0, b[s2])) return -1;
    *nf_out = nf, *res = b[s2];
    return 0;
}

/* Encodes one sample: vid [C, F, H, W] -> lat [z, T, h, w]. */
static int encode_sample(vae_encoder *e, const float *vid, int F, int H, int W, float *lat, int normalize) {
    vae_model *m = e->m;
    vae_state *st = &m->st;
    const vae_config *c = &m->cfg;
    const int p = c->patch_size, C = vae_encoder_video_channels(e), ci = c->in_channels, z = c->z_dim;
    const int Hp = H / p, Wp = W / p, fac = vae_encoder_spatial_factor(e), h = H / fac, w = W / fac;
    const int T = vae_encoder_frames_out(e, F);
    const size_t hw = (size_t)h * w;
    memset(st->cache_n, 0, (size_t)m->nslots * sizeof *st->cache_n);
    memset(e->tseen, 0, sizeof e->tseen);
    int t0 = 0;
    for (int f0 = 0; f0 < F;) {
        const int nf = f0 == 0 ? 1 : 4;
        float *x = st->buf[0];
        for (int f = 0; f < nf; f++) /* patchify into channel-last [nf, Hp, Wp, ci] */
            for (int ch = 0; ch < C; ch++)
                for (int yy = 0; yy < H; yy++) {
                    const float *src = vid + (((size_t)ch * F + f0 + f) * H + yy) * W;
                    float *dst = x + ((size_t)f * Hp + yy / p) * Wp * ci + (size_t)ch * p * p + yy % p;
                    for (int xx = 0; xx < W; xx++) dst[(size_t)(xx / p) * ci + (xx % p) * p] = src[xx];
                }
        int nfo = 0;
        float *o = NULL;
        if (encode_chunk(e, nf, &nfo, &o)) return -1;
        if (t0 + nfo > T) return core_error("vae: encoded more than %d latent frames (internal error)", T);
        for (int k = 0; k < z; k++) { /* the posterior mode: channels 0 .. z - 1 of quant_conv's 2 z */
            const float mean = c->latents_mean[k], inv = 1.0f / c->latents_std[k];
            for (int f = 0; f < nfo; f++) {
                float *dst = lat + ((size_t)k * T + t0 + f) * hw;
                const float *src = o + (size_t)f * hw * 2 * z + k;
                for (size_t q = 0; q < hw; q++) {
                    const float v = src[q * 2 * z];
                    dst[q] = normalize ? (v - mean) * inv : v;
                }
            }
        }
        t0 += nfo;
        f0 += nf;
    }
    if (t0 != T) return core_error("vae: encoded %d latent frames, expected %d (internal error)", t0, T);
    return 0;
}

int vae_encode(vae_encoder *e, const float *video, int B, int C, int F, int H, int W, float *latents, int normalize) {
    const vae_config *c = &e->m->cfg;
    const int vc = vae_encoder_video_channels(e), fac = vae_encoder_spatial_factor(e);
    if (C != vc) return core_error("vae: the video has %d channels, the encoder takes %d", C, vc);
    if (B < 1 || F < 1 || H < 1 || W < 1)
        return core_error("vae: video shape [%d, %d, %d, %d, %d] has an empty dimension", B, C, F, H, W);
    if ((F - 1) % 4)
        return core_error("vae: %d frames: the encoder takes 1 + 4k frames (the first alone, then chunks of 4; "
                          "diffusers would drop the last %d)",
                          F, (F - 1) % 4);
    if (H % fac || W % fac)
        return core_error("vae: a %d x %d video: height and width must be multiples of %d (2^%d x patch_size %d)", H,
                          W, fac, e->n_sdown, c->patch_size);
    if (state_begin(e, H / c->patch_size, W / c->patch_size)) return -1;
    const int T = vae_encoder_frames_out(e, F);
    const size_t vsz = (size_t)C * F * H * W, lsz = (size_t)c->z_dim * T * (H / fac) * (W / fac);
    for (int b = 0; b < B; b++)
        if (encode_sample(e, video + b * vsz, F, H, W, latents + b * lsz, normalize)) return -1;
    return 0;
}

void vae_video_from_u8(const uint8_t *u8, int B, int F, int H, int W, float *video) {
    const size_t plane = (size_t)F * H * W;
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < plane; i++)
            for (int ch = 0; ch < 3; ch++) {
                const float v = (float)u8[((size_t)b * plane + i) * 3 + ch] / 255.0f; /* pil_to_numpy */
                video[((size_t)b * 3 + ch) * plane + i] = 2.0f * v - 1.0f;          /* normalize */
            }
}

/* ---- the start-up estimate ---- */

static double conv_flop(const vae_conv *c, double positions) {
    return 2.0 * c->cin * c->cout * c->kt * c->kh * c->kw * positions;
}

static double res_flop(const vae_resblock *r, double positions) {
    return conv_flop(&r->c1, positions) + conv_flop(&r->c2, positions) + (r->has_sc ? conv_flop(&r->sc, positions) : 0);
}

/* FLOPs of encode_chunk for nf frames of Hp x Wp (first: the first chunk, which skips time_conv), the frames and
 * sizes walked as encode_chunk walks them. */
static double chunk_flop(const vae_encoder *e, int nf, int Hp, int Wp, int first) {
    double H = Hp, W = Wp, f = 0;
    f += conv_flop(&e->conv_in, nf * H * W);
    for (int i = 0; i < e->nlev; i++) {
        const enc_level *lv = &e->lev[i];
        for (int j = 0; j < lv->nres; j++) f += res_flop(&lv->res[j], nf * H * W);
        if (!lv->down) continue;
        H = (int)(H - 2) / 2 + 1, W = (int)(W - 2) / 2 + 1;
        f += 2.0 * lv->resample.cin * lv->resample.cout * 9 * nf * H * W; /* 3 x 3, stride 2 */
        if (lv->down == 3 && !first) {
            nf = (nf - 2) / 2 + 1;
            f += conv_flop(&lv->time_conv, nf * H * W);
        }
    }
    const double hw = H * W, d = e->mid_attn.c;
    f += res_flop(&e->mid_res[0], nf * hw) + res_flop(&e->mid_res[1], nf * hw);
    f += conv_flop(&e->mid_attn.qkv, nf * hw) + conv_flop(&e->mid_attn.proj, nf * hw) + nf * 4.0 * hw * hw * d;
    f += conv_flop(&e->conv_out, nf * hw) + conv_flop(&e->quant, nf * hw);
    return f;
}

int vae_encoder_estimate(const vae_config *c, int F, int H, int W, double *params, double *state_bytes, double *flop) {
    vae_encoder e;
    memset(&e, 0, sizeof e);
    if (!(e.m = calloc(1, sizeof *e.m))) return core_error("out of memory");
    e.m->cfg = *c;
    int rc = build(&e);
    const int fac = rc ? 0 : (1 << e.n_sdown) * c->patch_size;
    if (!rc && (F < 1 || (F - 1) % 4))
        rc = core_error("vae: %d frames: the encoder takes 1 + 4k frames", F);
    if (!rc && (H < fac || W < fac || H % fac || W % fac))
        rc = core_error("vae: a %d x %d video: height and width must be positive multiples of %d", H, W, fac);
    if (!rc) {
        const int Hp = H / c->patch_size, Wp = W / c->patch_size;
        enc_plan pl;
        plan_state(&e, Hp, Wp, &pl);
        *params = (double)e.m->nfloats;
        *state_bytes = (double)pl.bytes;
        *flop = chunk_flop(&e, 1, Hp, Wp, 1) + (F - 1) / 4 * chunk_flop(&e, 4, Hp, Wp, 0);
    }
    vae_free(e.m);
    return rc;
}
