/* model/vae/tiny_vae.c — the tiny preset's random Wan 2.1-style VAE decoder (see model/text/tiny_text.h, model/vae/tiny_vae.h).
 *
 * The parameter table comes from the decoder builder itself (vae_build in wan_vae_model.c), so the names and shapes
 * written are exactly those vae_load expects and diffusers' AutoencoderKLWan has.
 *
 * Initialisation, chosen so that the decoded colour follows the latent (the GRPO demo needs rewards that vary within
 * a group): convolution weights N(0, 1/fan_in) (variance-preserving), biases 0, norm gammas 1; post_quant_conv the
 * identity. On top of that:
 *   - kernels with several taps carry their map on the current frame's centre tap (the others faint,
 *     TINY_VAE_TAP), so a latent pixel decodes to a block of one colour rather than noise;
 *   - the skip-path channel maps (conv_shortcut, resample, time_conv) copy or sum channels plus TINY_VAE_MIX x
 *     noise, so the features keep several independent directions of the latent (random maps in a chain collapse
 *     to one: two-colour videos);
 *   - every residual branch's second convolution is scaled by TINY_VAE_BRANCH, so each block stays close to its
 *     skip path;
 *   - the mid-block attention is near-uniform (q, k rows x TINY_VAE_QK) with a strong output projection
 *     (TINY_VAE_GLOBAL), so every pixel gets a tint from the frame's average latent: this is what makes the MEAN
 *     colour of a video vary from latent to latent (a purely local map averages out over the frame);
 *   - conv_out reads three orthogonal contrasts of the final features with gain TINY_VAE_COLOR_GAIN.
 * Checked by tests/test_generate.c (gen_tiny_vae_colours_differ): on 6 random latents the mean colours differ by
 * about 90 levels of 255, and by diffusers: AutoencoderKLWan.from_pretrained decodes the same video. */
#include "model/vae/tiny_vae.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "model/vae/wan_vae_internal.h"

#define TINY_VAE_BRANCH 0.2f
#define TINY_VAE_COLOR_GAIN 1.0f
#define TINY_VAE_TAP 0.1f
#define TINY_VAE_GLOBAL 4.0f
#define TINY_VAE_QK 0.1f
#define TINY_VAE_MIX 0.3f

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* config.json text for z_dim (the same text is parsed here and written to disk). */
static int config_text(char *buf, size_t cap, int z) {
    size_t o = (size_t)snprintf(buf, cap,
                                "{\n  \"_class_name\": \"AutoencoderKLWan\",\n  \"_diffusers_version\": \"0.42.1\",\n"
                                "  \"attn_scales\": [],\n  \"base_dim\": 4,\n  \"decoder_base_dim\": null,\n"
                                "  \"dim_mult\": [1, 2, 2, 2],\n  \"dropout\": 0.0,\n  \"in_channels\": 3,\n"
                                "  \"is_residual\": false,\n  \"num_res_blocks\": 1,\n  \"out_channels\": 3,\n"
                                "  \"patch_size\": null,\n  \"scale_factor_spatial\": 8,\n"
                                "  \"scale_factor_temporal\": 4,\n  \"temperal_downsample\": [false, true, true],\n"
                                "  \"z_dim\": %d,\n  \"latents_mean\": [",
                                z);
    for (int i = 0; i < z && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s0.0", i ? ", " : "");
    if (o < cap) o += (size_t)snprintf(buf + o, cap - o, "],\n  \"latents_std\": [");
    for (int i = 0; i < z && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s1.0", i ? ", " : "");
    if (o < cap) o += (size_t)snprintf(buf + o, cap - o, "]\n}\n");
    return o < cap ? 0 : core_error("tiny VAE: config text too long for z_dim %d", z);
}

/* Fills parameter i of table p (one tensor, v) as the header comment says; slot0 separates the decoder's Philox slots
 * from the encoder's. */
static void init_param(const vae_param *p, float *v, uint64_t seed, uint32_t slot) {
    int64_t n = 1, fan_in = 1;
    for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
    for (int d = 1; d < p->ndim; d++) fan_in *= p->shape[d];
    if (ends_with(p->name, ".gamma")) {
        for (int64_t k = 0; k < n; k++) v[k] = 1.0f;
    } else if (ends_with(p->name, ".bias")) {
        memset(v, 0, sizeof(float) * (size_t)n);
    } else if (!strcmp(p->name, "post_quant_conv.weight") || !strcmp(p->name, "quant_conv.weight")) {
        memset(v, 0, sizeof(float) * (size_t)n);
        for (int64_t k = 0; k < p->shape[0]; k++) v[k * p->shape[1] + k] = 1.0f;
    } else {
        float g = 1.0f / sqrtf((float)fan_in);
        if (ends_with(p->name, ".conv2.weight")) g *= TINY_VAE_BRANCH;
        if (ends_with(p->name, ".attentions.0.proj.weight")) g *= TINY_VAE_GLOBAL;
        if (!strcmp(p->name, "decoder.conv_out.weight")) g *= TINY_VAE_COLOR_GAIN;
        core_philox_normal(v, n, seed, slot, 0, CORE_STREAM_MODEL_INIT);
        /* a kernel with several taps: the current frame's centre tap carries the map, the others are faint */
        const int64_t taps = fan_in / p->shape[1], co = p->shape[0], ci = p->shape[1];
        const int64_t plane = p->ndim == 5 ? p->shape[3] * p->shape[4] : p->shape[2] * p->shape[3];
        const int64_t centre = taps - 1 - plane / 2; /* [kt - 1, kh / 2, kw / 2]; 0 for a 1x1 kernel */
        if (taps > 1) {
            const float gc = g * sqrtf((float)taps);
            for (int64_t k = 0; k < n; k++) v[k] *= k % taps == centre ? gc : g * TINY_VAE_TAP;
        } else {
            for (int64_t k = 0; k < n; k++) v[k] *= g;
        }
        /* skip-path channel maps: copy / sum channels (plus a little noise) instead of a random matrix, so
         * that the chain of them keeps the latent's directions (a product of random maps collapses them) */
        if (ends_with(p->name, ".conv_shortcut.weight") || ends_with(p->name, ".resample.1.weight") ||
            ends_with(p->name, ".time_conv.weight")) {
            const float s = ci > co ? 1.0f / sqrtf((float)ci / (float)co) : 1.0f;
            for (int64_t o = 0; o < co; o++)
                for (int64_t c = 0; c < ci; c++) {
                    float *e = v + (o * ci + c) * taps + centre;
                    int match = ci >= co ? c % co == o : o % ci == c;
                    *e = TINY_VAE_MIX * *e + (match ? s : 0.0f);
                }
        }
        /* conv_out's centre tap: orthonormal Helmert rows (r_o = (1, .., 1, -(o + 1), 0, ..) / norm over the
         * first o + 2 channels) x TINY_VAE_COLOR_GAIN: each colour reads a different contrast of the features,
         * and none their common mode (SiLU's positive mean), so colours spread in all three directions */
        if (!strcmp(p->name, "decoder.conv_out.weight"))
            for (int64_t o = 0; o < co; o++) {
                const float nrm = sqrtf((float)((o + 1) * (o + 2)));
                for (int64_t c = 0; c < ci; c++) {
                    float h = c <= o ? 1.0f : c == o + 1 ? -(float)(o + 1) : 0.0f;
                    v[(o * ci + c) * taps + centre] = o + 1 < ci ? TINY_VAE_COLOR_GAIN * h / nrm : 0.0f;
                }
            }
        if (ends_with(p->name, ".attentions.0.to_qkv.weight")) /* q and k rows faint: near-uniform attention */
            for (int64_t k = 0; k < 2 * n / 3; k++) v[k] *= TINY_VAE_QK;
    }
}

/* The weights of model m's whole table into w (m->params allocated here; m must outlive the write). */
static int add_all(vae_model *m, st_writer *w, uint64_t seed, uint32_t slot0) {
    if (!(m->params = malloc(m->nfloats * sizeof(float))))
        return core_error("tiny VAE: out of memory for %zu parameters", m->nfloats);
    for (int i = 0; i < m->nparams; i++) {
        const vae_param *p = &m->table[i];
        float *v = m->params + p->offset;
        init_param(p, v, seed, slot0 + (uint32_t)i);
        if (st_writer_add(w, p->name, CORE_F32, p->ndim, p->shape, v)) return -1;
    }
    return 0;
}

static int write_vae(const char *dir, int z_dim, uint64_t seed, int encoder) {
    if (z_dim < 1 || z_dim > VAE_MAX_Z) return core_error("tiny VAE: z_dim %d outside 1..%d", z_dim, VAE_MAX_Z);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return core_error("%s: cannot create folder: %s", dir, strerror(errno));
    char text[8192], path[4200];
    if (config_text(text, sizeof text, z_dim)) return -1;
    vae_model *m = calloc(1, sizeof *m), *me = encoder ? calloc(1, sizeof *me) : NULL;
    st_writer *w = st_writer_new();
    int rc = -1;
    if (!m || !w || (encoder && !me)) {
        core_error("tiny VAE: out of memory");
        goto done;
    }
    if (vae_config_parse(&m->cfg, text, "tiny VAE config") || vae_build(m) || add_all(m, w, seed, TINY_SLOT_VAE))
        goto done;
    if (encoder) { /* the encoder's tensors from its own builder, on Philox slots after the decoder's */
        me->cfg = m->cfg;
        if (vae_encoder_build_table(me) || add_all(me, w, seed, TINY_SLOT_VAE_ENC)) goto done;
    }
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    if (st_writer_set_metadata(w, "format", "pt") || st_writer_write(w, path)) goto done;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0) {
        if (f) fclose(f);
        core_error("%s: cannot write", path);
        goto done;
    }
    if (fclose(f)) {
        core_error("%s: cannot write", path);
        goto done;
    }
    rc = 0;
done:
    st_writer_free(w);
    if (m) vae_free(m);
    if (me) vae_free(me);
    return rc;
}

int vae_tiny_write(const char *dir, int z_dim, uint64_t seed) { return write_vae(dir, z_dim, seed, 0); }

int vae_tiny_write_with_encoder(const char *dir, int z_dim, uint64_t seed) { return write_vae(dir, z_dim, seed, 1); }
