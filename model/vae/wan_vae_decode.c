/* model/vae/wan_vae_decode.c — AutoencoderKLWan.decode, one latent frame at a time with the feature cache, and the
 * rollout's latents -> uint8 RGB path.
 * Reference: diffusers 0.42.1 AutoencoderKLWan._decode (post_quant_conv, the per-frame WanDecoder3d loop with
 * first_chunk on frame 0, unpatchify, clamp), WanResample.forward (upsample3d: the first chunk skips time_conv and
 * marks its cache "Rep"; later chunks run the causal time_conv and interleave its two channel halves as frames 2t,
 * 2t+1), WanResidualUpBlock (DupUp3D shortcut, first_chunk drops factor_t - 1 frames), WanPipeline (latents /
 * (1 / latents_std) + latents_mean) and VideoProcessor.postprocess_video + numpy_to_pil (uint8). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/dev_table.h"
#include "kernels/kernels.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/vae/wan_vae_internal.h"

static size_t zmax(size_t a, size_t b) { return a > b ? a : b; }

/* Floats of feature-cache slot i for latent h x w: VAE_CACHE_T frames at the slot's resolution and channels. */
static size_t slot_floats(const vae_model *m, int i, size_t hw) {
    return VAE_CACHE_T * hw * (size_t)m->slots[i].scale * m->slots[i].scale * m->slots[i].c;
}

/* Buffers of the decode loop: buf[4] keeps a residual up-block's input (DupUp3D). */
static int state_nbuf(const vae_model *m) { return m->cfg.is_residual ? 5 : 4; }

static size_t round8(size_t n) { return (n + 7) / 8 * 8; }

/* The decode state's sizes for latent h x w, walked with the up-blocks: st's buf_floats, col_floats, attn_floats,
 * cache_bytes and bytes (what state_begin allocates and vae_decoder_estimate reports), in elements of the backend's
 * activation dtype: fp32 on the CPU (device 0), bf16 on a device (device 1: the im2col rows padded to multiples of
 * 8 with room for the GEMM's padded output, and the attention's scores and probabilities, kernels/dev_ops.h). */
static void plan_state(const vae_model *m, int h, int w, int device, vae_state *st) {
    const size_t hw = (size_t)h * w;
    size_t act = hw * zmax((size_t)m->cfg.z_dim, (size_t)m->dims[0]);
    size_t kn = hw * 27 * zmax((size_t)m->cfg.z_dim, (size_t)m->dims[0]), kmax = 27 * (size_t)m->dims[0];
    size_t nf = 1, s2 = 1; /* frames per chunk (after the first) and scale^2 at the current stage */
    size_t pix = hw, cmax_all = zmax((size_t)m->cfg.z_dim, (size_t)m->dims[0]); /* the device's walk */
    for (int i = 0; i < m->nup; i++) {
        const vae_upblock *u = &m->upb[i];
        const size_t cmax = zmax((size_t)u->in_dim, (size_t)u->out_dim);
        act = zmax(act, nf * s2 * hw * cmax);
        kn = zmax(kn, nf * s2 * hw * 27 * cmax);
        kmax = zmax(kmax, 27 * cmax);
        cmax_all = zmax(cmax_all, 2 * cmax);
        if (u->up == 3) {
            act = zmax(act, nf * s2 * hw * 2 * (size_t)u->out_dim);
            nf *= 2;
        }
        if (u->up) {
            s2 *= 4;
            act = zmax(act, nf * s2 * hw * (size_t)u->up_out);
            kn = zmax(kn, nf * s2 * hw * 9 * (size_t)u->out_dim);
        }
        pix = zmax(pix, nf * s2 * hw);
    }
    act = zmax(act, nf * s2 * hw * (size_t)m->cfg.out_channels);
    kmax = zmax(kmax, 27 * (size_t)m->conv_out.cin);
    kn = zmax(kn, nf * s2 * hw * kmax);
    st->buf_floats = act;
    const size_t C0 = (size_t)m->dims[0];
    if (!device) {
        st->col_floats = kn < zmax((size_t)1 << 22, kmax) ? kn : zmax((size_t)1 << 22, kmax);
        st->attn_floats = 8 * hw * C0 + hw;
    } else {
        /* one im2col row and one padded output row per output pixel of a frame, at most 2^26 elements a chunk */
        const size_t row = round8(kmax) + round8(zmax(cmax_all, 3 * C0)), need = pix * row;
        st->col_floats = need < zmax((size_t)1 << 26, row) ? need : zmax((size_t)1 << 26, row);
        /* t, qkv, q, k, v, o at [S, round8(C)] each, then fp32 scores and bf16 probabilities (6 bytes each) */
        st->attn_floats = 8 * hw * round8(C0) + 3 * hw * round8(hw);
    }
    st->es = device ? sizeof(kb_bf16) : sizeof(float);
    st->cache_bytes = 0;
    for (int i = 0; i < m->nslots; i++) st->cache_bytes += slot_floats(m, i, hw) * st->es;
    st->bytes = st->cache_bytes + ((size_t)state_nbuf(m) * st->buf_floats + st->col_floats + st->attn_floats) * st->es;
    st->host_floats = device ? zmax(hw * (size_t)m->cfg.z_dim, nf * s2 * hw * (size_t)m->cfg.out_channels) : 0;
}

/* Allocates the decode state for latent size h x w on the model's backend (kept while h, w and it stay the same). */
static int state_begin(vae_model *m, int h, int w) {
    vae_state *st = &m->st;
    const k_dev_ops *d = vae_backend(m);
    if (st->buf[0] && st->h == h && st->w == w && st->dev == d) return 0;
    vae_state_free(st);
    st->h = h, st->w = w, st->dev = d;
    const size_t hw = (size_t)h * w;
    plan_state(m, h, w, m->dw != NULL, st);
    st->cache = calloc((size_t)m->nslots + 1, sizeof *st->cache);
    st->cache_n = calloc((size_t)m->nslots + 1, sizeof *st->cache_n);
    st->time_seen = calloc((size_t)m->ntime + 1, sizeof *st->time_seen);
    if (!st->cache || !st->cache_n || !st->time_seen) goto oom;
    for (int i = 0; i < m->nslots; i++)
        if (!(st->cache[i] = d->mem_alloc(slot_floats(m, i, hw) * st->es))) goto oom;
    for (int i = 0; i < state_nbuf(m); i++)
        if (!(st->buf[i] = d->mem_alloc(st->buf_floats * st->es))) goto oom;
    if (!(st->col = d->mem_alloc(st->col_floats * st->es)) || !(st->attn = d->mem_alloc(st->attn_floats * st->es)))
        goto oom;
    if (st->host_floats && !(st->host = malloc(st->host_floats * sizeof(float)))) goto oom;
    return 0;
oom:
    vae_state_free(st);
    return core_error("vae: out of %s memory for the decode state of a %d x %d latent", d == &k_cpu_dev_ops ? "host" : "device", h, w);
}

/* Both estimates: the decoder built without weights, its decode state planned for an h x w latent on the host
 * (device 0: *size = fp32 parameter count) or the device (1: *size = vae_upload_bytes). */
static int estimate(const vae_config *c, int h, int w, int device, double *size, double *state_bytes) {
    vae_model *m = calloc(1, sizeof *m);
    if (!m) return core_error("out of memory");
    m->cfg = *c;
    const int rc = vae_build(m);
    if (!rc) {
        vae_state st;
        memset(&st, 0, sizeof st);
        plan_state(m, h, w, device, &st);
        *size = device ? (double)vae_upload_bytes(m) : (double)m->nfloats;
        *state_bytes = (double)st.bytes;
    }
    vae_free(m);
    return rc;
}

int vae_decoder_estimate(const vae_config *c, int h, int w, double *params, double *state_bytes) {
    return estimate(c, h, w, 0, params, state_bytes);
}

int vae_decoder_estimate_device(const vae_config *c, int h, int w, double *weight_bytes, double *state_bytes) {
    return estimate(c, h, w, 1, weight_bytes, state_bytes);
}

size_t vae_state_bytes(const vae_model *m) { return m->st.bytes; }
size_t vae_cache_bytes(const vae_model *m) { return m->st.cache_bytes; }

/* Element i of backend buffer p (st.es bytes an element). */
static void *el(const vae_state *st, void *p, size_t i) { return (char *)p + i * st->es; }

/* Decodes latent frame x [h, w, z] (channel-last) of chunk `chunk`; result in *res (one of st->buf), *nf_out frames
 * at (*Ho) x (*Wo) with out_channels channels. */
static int decode_chunk(vae_model *m, int chunk, int *nf_out, int *Ho, int *Wo, void **res) {
    vae_state *st = &m->st;
    void **b = st->buf;
    int H = st->h, W = st->w, nf = 1;
    /* buf[0] holds the latent frame on entry */
    if (vae_conv_forward(m, &m->post_quant, b[0], 1, H, W, 0, b[1])) return -1;
    if (vae_conv_forward(m, &m->conv_in, b[1], 1, H, W, 0, b[0])) return -1;
    if (vae_res_forward(m, &m->mid_res[0], b[0], 1, H, W, b[1], b[2], b[3])) return -1;
    if (vae_attn_forward(m, &m->mid_attn, b[1], 1, H, W)) return -1;
    if (vae_res_forward(m, &m->mid_res[1], b[1], 1, H, W, b[0], b[2], b[3])) return -1;
    int cur = 0; /* index of the buffer holding x; buffer 4 keeps a residual block's input */
    for (int i = 0; i < m->nup; i++) {
        const vae_upblock *u = &m->upb[i];
        const int nf_in = nf;
        if (u->dup) {
            const size_t bytes = (size_t)nf * H * W * u->in_dim * st->es;
            if (vae_copy2d(m, b[4], bytes, b[cur], bytes, bytes, 1)) return -1;
        }
        for (int j = 0; j < u->nres; j++) {
            int o = -1, s1 = -1, s2 = -1;
            for (int k = 0; k < 4; k++)
                if (k != cur) {
                    if (o < 0) o = k;
                    else if (s1 < 0) s1 = k;
                    else s2 = k;
                }
            if (vae_res_forward(m, &u->res[j], b[cur], nf, H, W, b[o], b[s1], b[s2])) return -1;
            cur = o;
        }
        if (u->up) {
            const int c = u->out_dim;
            int src = cur;
            if (u->up == 3) {
                if (!st->time_seen[u->time_slot]) {
                    st->time_seen[u->time_slot] = 1; /* diffusers' "Rep": the first chunk skips time_conv */
                } else {
                    const int t = (cur + 1) % 4, il = (cur + 2) % 4;
                    if (vae_conv_forward(m, &u->time_conv, b[cur], nf, H, W, 0, b[t])) return -1;
                    /* the two channel halves of every pixel become frames 2f and 2f + 1 */
                    const size_t fp = (size_t)H * W, row = (size_t)c * st->es;
                    for (int f = 0; f < nf; f++)
                        for (int half = 0; half < 2; half++)
                            if (vae_copy2d(m, el(st, b[il], (size_t)(2 * f + half) * fp * c), row,
                                           el(st, b[t], (size_t)f * fp * 2 * c + (size_t)half * c), 2 * row, row, fp))
                                return -1;
                    nf *= 2;
                    src = il;
                }
            }
            const int dst = (src + 1) % 4;
            if (vae_conv_forward(m, &u->resample, b[src], nf, H, W, 1, b[dst])) return -1;
            if (u->dup) {
                const int drop = chunk == 0 ? u->dup_ft - 1 : 0;
                if (vae_dupup_add(m, b[dst], b[4], nf_in, H, W, u->in_dim, u->up_out, u->dup_ft, drop)) return -1;
            }
            H *= 2, W *= 2;
            cur = dst;
        }
    }
    const int o = (cur + 1) % 4, s = (cur + 2) % 4;
    if (vae_norm_forward(m, &m->norm_out, b[cur], b[s], (int64_t)nf * H * W, 1)) return -1;
    if (vae_conv_forward(m, &m->conv_out, b[s], nf, H, W, 0, b[o])) return -1;
    *nf_out = nf, *Ho = H, *Wo = W, *res = b[o];
    return 0;
}

/* Decodes one sample: lat [z, T, h, w] -> vid [C, F, H, W]. Unnormalises first when unnorm. On a device the latent
 * frame is built in the host staging buffer and uploaded (bf16), the decoded chunk downloaded (fp32 from bf16). */
static int decode_sample(vae_model *m, const float *lat, int T, int h, int w, float *vid, int unnorm) {
    const vae_config *c = &m->cfg;
    const int z = c->z_dim, p = c->patch_size, C = vae_video_channels(m), F = vae_frames_out(m, T);
    const int H = h * vae_spatial_factor(m), W = w * vae_spatial_factor(m);
    vae_state *st = &m->st;
    const k_dev_ops *d = vae_backend(m);
    memset(st->cache_n, 0, (size_t)m->nslots * sizeof *st->cache_n);
    memset(st->time_seen, 0, (size_t)m->ntime * sizeof *st->time_seen);
    const size_t hw = (size_t)h * w;
    float *in = m->dw ? st->host : (float *)st->buf[0];
    int f0 = 0;
    for (int t = 0; t < T; t++) {
        for (int k = 0; k < z; k++) {
            const float *src = lat + ((size_t)k * T + t) * hw;
            const float inv = 1.0f / c->latents_std[k], mean = c->latents_mean[k];
            for (size_t q = 0; q < hw; q++) in[q * z + k] = unnorm ? src[q] / inv + mean : src[q];
        }
        if (m->dw && d->mem_upload_bf16((kb_bf16 *)st->buf[0], in, hw * z)) return -1;
        int nf, Hd, Wd;
        void *res;
        if (decode_chunk(m, t, &nf, &Hd, &Wd, &res)) return -1;
        const int oc = c->out_channels;
        const float *o = (const float *)res;
        if (m->dw) {
            if (d->mem_download_bf16(st->host, (const kb_bf16 *)res, (size_t)nf * Hd * Wd * oc)) return -1;
            o = st->host;
        }
        for (int f = 0; f < nf; f++)
            for (int ch = 0; ch < C; ch++)
                for (int yy = 0; yy < H; yy++)
                    for (int xx = 0; xx < W; xx++) {
                        const int hh = yy / p, q = yy % p, ww = xx / p, r = xx % p;
                        float v = o[(((size_t)f * Hd + hh) * Wd + ww) * oc + ch * p * p + r * p + q];
                        v = v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v);
                        vid[(((size_t)ch * F + f0 + f) * H + yy) * W + xx] = v;
                    }
        f0 += nf;
    }
    if (f0 != F) return core_error("vae: decoded %d frames, expected %d (internal error)", f0, F);
    return 0;
}

static int check_args(const vae_model *m, int B, int z, int T, int h, int w) {
    if (z != m->cfg.z_dim)
        return core_error("vae: latents have %d channels, the VAE's z_dim is %d", z, m->cfg.z_dim);
    if (B < 1 || T < 1 || h < 1 || w < 1)
        return core_error("vae: latents shape [%d, %d, %d, %d, %d] has an empty dimension", B, z, T, h, w);
    return 0;
}

int vae_decode(vae_model *m, const float *latents, int B, int z, int T, int h, int w, float *video) {
    if (check_args(m, B, z, T, h, w) || state_begin(m, h, w)) return -1;
    const size_t lsz = (size_t)z * T * h * w;
    const size_t vsz = (size_t)vae_video_channels(m) * vae_frames_out(m, T) * h * w * vae_spatial_factor(m) *
                       vae_spatial_factor(m);
    for (int b = 0; b < B; b++)
        if (decode_sample(m, latents + b * lsz, T, h, w, video + b * vsz, 0)) return -1;
    return 0;
}

int vae_latents_to_u8(vae_model *m, const float *latents, int B, int z, int T, int h, int w, uint8_t *out) {
    if (check_args(m, B, z, T, h, w)) return -1;
    if (vae_video_channels(m) != 3) return core_error("vae: the decoder gives %d channels, RGB needs 3", vae_video_channels(m));
    if (state_begin(m, h, w)) return -1;
    const int F = vae_frames_out(m, T), H = h * vae_spatial_factor(m), W = w * vae_spatial_factor(m);
    const size_t lsz = (size_t)z * T * h * w, plane = (size_t)F * H * W;
    float *vid = malloc(3 * plane * sizeof(float));
    if (!vid) return core_error("vae: out of memory for a %d x %d x %d video", F, H, W);
    for (int b = 0; b < B; b++) {
        /* non-finite latents or pixels are refused, not turned into (black) frames someone would score */
        int64_t j = core_f32_first_nonfinite(latents + b * lsz, lsz);
        if (j >= 0) {
            free(vid);
            return core_error("vae: sample %d: latent element %lld is %g: the denoised latents are not finite (the "
                              "transformer's output)", b, (long long)j, (double)latents[b * lsz + (size_t)j]);
        }
        if (decode_sample(m, latents + b * lsz, T, h, w, vid, 1)) {
            free(vid);
            return -1;
        }
        if ((j = core_f32_first_nonfinite(vid, 3 * plane)) >= 0) {
            const int64_t i = j % (int64_t)plane, hw = (int64_t)H * W;
            const double v = vid[j];
            free(vid);
            return core_error("vae: sample %d: frame %lld, pixel (%lld, %lld), channel %lld decoded to %g from finite "
                              "latents: check the VAE's weights", b, (long long)(i / hw), (long long)(i % hw / W),
                              (long long)(i % W), (long long)(j / (int64_t)plane), v);
        }
        uint8_t *ob = out + (size_t)b * plane * 3;
        for (size_t i = 0; i < plane; i++)
            for (int ch = 0; ch < 3; ch++) {
                float v = vid[ch * plane + i] / 2.0f + 0.5f;
                v = v >= 0.0f ? (v > 1.0f ? 1.0f : v) : 0.0f; /* clamp; a NaN (never here: checked) would give 0 */
                ob[i * 3 + ch] = (uint8_t)nearbyintf(v * 255.0f); /* default rounding mode: half to even */
            }
    }
    free(vid);
    return 0;
}
