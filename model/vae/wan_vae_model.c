/* model/vae/wan_vae_model.c — AutoencoderKLWan config.json, the decoder's layer structure and parameter table, and
 * loading the weights (the parameter-table builders and the loader are shared with the encoder, wan_vae_encode.c).
 * Reference: diffusers 0.42.1 AutoencoderKLWan.__init__ / WanDecoder3d.__init__ (argument names, defaults, the dims
 * list [d * m for m in [dim_mult[-1]] + dim_mult[::-1]], Wan 2.1's halved in_dim after an up-sampler, the residual
 * up-block's DupUp3D shortcut) and the state_dict names they produce. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "model/vae/wan_vae_internal.h"

static const float wan21_mean[16] = {-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                                     0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503, -0.2921};
static const float wan21_std[16] = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                                    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};

static int get_int(const char *label, const char *key, json_t *v, int lo, int hi, int *out) {
    if (!json_is_integer(v)) return core_error("%s: %s: expected an integer", label, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return core_error("%s: %s: %lld is out of range [%d, %d]", label, key, (long long)x, lo, hi);
    *out = (int)x;
    return 0;
}

static int get_floats(const char *label, const char *key, json_t *v, float *out, int *n) {
    if (!json_is_array(v) || json_array_size(v) > VAE_MAX_Z)
        return core_error("%s: %s: expected a list of at most %d numbers", label, key, VAE_MAX_Z);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_number(e)) return core_error("%s: %s[%zu]: expected a number", label, key, i);
        out[i] = (float)json_number_value(e);
    }
    *n = (int)json_array_size(v);
    return 0;
}

int vae_config_parse(vae_config *c, const char *json_text, const char *label) {
    json_t *root = core_json_parse_object(json_text, label);
    if (!root) return -1;
    memset(c, 0, sizeof *c);
    c->base_dim = 96;
    c->decoder_base_dim = -1;
    c->z_dim = 16;
    c->n_mult = 4;
    const int dm[4] = {1, 2, 4, 4};
    memcpy(c->dim_mult, dm, sizeof dm);
    c->num_res_blocks = 2;
    c->temperal_downsample[1] = c->temperal_downsample[2] = 1;
    c->in_channels = c->out_channels = 3;
    c->patch_size = 1;
    c->scale_factor_temporal = 4;
    c->scale_factor_spatial = 8;
    memcpy(c->latents_mean, wan21_mean, sizeof wan21_mean);
    memcpy(c->latents_std, wan21_std, sizeof wan21_std);
    int n_mean = 16, n_std = 16, n_td = 3, sft_null = 0, sfs_null = 0;
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(root, key, v) {
        if (rc) break;
        if (key[0] == '_') continue;
        if (!strcmp(key, "base_dim")) rc = get_int(label, key, v, 1, 1 << 16, &c->base_dim);
        else if (!strcmp(key, "decoder_base_dim")) {
            if (!json_is_null(v)) rc = get_int(label, key, v, 1, 1 << 16, &c->decoder_base_dim);
        } else if (!strcmp(key, "z_dim")) rc = get_int(label, key, v, 1, VAE_MAX_Z, &c->z_dim);
        else if (!strcmp(key, "num_res_blocks")) rc = get_int(label, key, v, 0, VAE_MAX_RES - 1, &c->num_res_blocks);
        else if (!strcmp(key, "in_channels")) rc = get_int(label, key, v, 1, 1 << 16, &c->in_channels);
        else if (!strcmp(key, "out_channels")) rc = get_int(label, key, v, 1, 1 << 16, &c->out_channels);
        else if (!strcmp(key, "patch_size")) {
            if (json_is_null(v)) c->patch_size = 1;
            else rc = get_int(label, key, v, 1, 64, &c->patch_size);
        } else if (!strcmp(key, "scale_factor_temporal")) {
            if (json_is_null(v)) sft_null = 1;
            else rc = get_int(label, key, v, 1, 1 << 16, &c->scale_factor_temporal);
        } else if (!strcmp(key, "scale_factor_spatial")) {
            if (json_is_null(v)) sfs_null = 1;
            else rc = get_int(label, key, v, 1, 1 << 16, &c->scale_factor_spatial);
        } else if (!strcmp(key, "is_residual")) {
            if (!json_is_boolean(v)) rc = core_error("%s: is_residual: expected true or false", label);
            else c->is_residual = json_is_true(v);
        } else if (!strcmp(key, "dim_mult")) {
            if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > VAE_MAX_LEVELS) {
                rc = core_error("%s: dim_mult: expected a list of 1 to %d integers", label, VAE_MAX_LEVELS);
            } else {
                c->n_mult = (int)json_array_size(v);
                for (int i = 0; i < c->n_mult && !rc; i++)
                    rc = get_int(label, key, json_array_get(v, i), 1, 1 << 12, &c->dim_mult[i]);
            }
        } else if (!strcmp(key, "temperal_downsample")) {
            if (!json_is_array(v) || json_array_size(v) > VAE_MAX_LEVELS) {
                rc = core_error("%s: temperal_downsample: expected a list of booleans", label);
            } else {
                n_td = (int)json_array_size(v);
                for (int i = 0; i < n_td && !rc; i++) {
                    json_t *e = json_array_get(v, i);
                    if (!json_is_boolean(e)) rc = core_error("%s: temperal_downsample[%d]: expected a boolean", label, i);
                    else c->temperal_downsample[i] = json_is_true(e);
                }
            }
        } else if (!strcmp(key, "latents_mean")) rc = get_floats(label, key, v, c->latents_mean, &n_mean);
        else if (!strcmp(key, "latents_std")) rc = get_floats(label, key, v, c->latents_std, &n_std);
        else if (!strcmp(key, "dropout")) {
            if (!json_is_number(v)) rc = core_error("%s: dropout: expected a number", label);
        } else if (!strcmp(key, "attn_scales")) { /* the encoder's only (diffusers' decoder ignores it) */
            if (!json_is_array(v)) rc = core_error("%s: attn_scales: expected a list", label);
            else c->n_attn_scales = (int)json_array_size(v);
        }
        /* other unknown keys are ignored as diffusers does. */
    }
    json_decref(root);
    if (rc) return -1;
    if (c->decoder_base_dim < 0) c->decoder_base_dim = c->base_dim;
    if (n_td < c->n_mult - 1)
        return core_error("%s: temperal_downsample has %d entries, dim_mult needs %d", label, n_td, c->n_mult - 1);
    if (n_mean != c->z_dim) return core_error("%s: latents_mean has %d entries, z_dim is %d", label, n_mean, c->z_dim);
    if (n_std != c->z_dim) return core_error("%s: latents_std has %d entries, z_dim is %d", label, n_std, c->z_dim);
    for (int i = 0; i < c->z_dim; i++)
        if (!(c->latents_std[i] != 0.0f)) return core_error("%s: latents_std[%d] is 0", label, i);
    const int pp = c->patch_size * c->patch_size;
    if (c->out_channels % pp)
        return core_error("%s: out_channels %d is not a multiple of patch_size^2 = %d", label, c->out_channels, pp);
    int tup = 0;
    for (int i = 0; i < c->n_mult - 1; i++) tup += c->temperal_downsample[i];
    const int sfac = (1 << (c->n_mult - 1)) * c->patch_size, tfac = 1 << tup;
    if (!sfs_null && c->scale_factor_spatial != sfac)
        return core_error("%s: scale_factor_spatial %d disagrees with the decoder's 2^%d x patch_size %d = %d", label,
                          c->scale_factor_spatial, c->n_mult - 1, c->patch_size, sfac);
    if (!sft_null && c->scale_factor_temporal != tfac)
        return core_error("%s: scale_factor_temporal %d disagrees with the decoder's %d temporal up-samplers (%d)",
                          label, c->scale_factor_temporal, tup, tfac);
    c->scale_factor_spatial = sfac;
    c->scale_factor_temporal = tfac;
    return 0;
}

/* ---- parameter table ---- */

static size_t add_param(vae_model *m, const char *name, int ndim, const int64_t *shape, int conv) {
    if (m->nparams == m->cap) {
        int nc = m->cap ? 2 * m->cap : 64;
        vae_param *t = realloc(m->table, (size_t)nc * sizeof *t);
        if (!t) return (size_t)-1;
        m->table = t, m->cap = nc;
    }
    vae_param *p = &m->table[m->nparams++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) p->shape[i] = shape[i], n *= (size_t)shape[i];
    p->offset = m->nfloats;
    p->conv = conv;
    m->nfloats += n;
    return p->offset;
}

/* A conv named prefix.weight/.bias; dims3: 1 -> Conv3d weight [co, ci, kt, kh, kw], 0 -> Conv2d [co, ci, kh, kw]. */
int vae_make_conv(vae_model *m, vae_conv *c, const char *prefix, int ci, int co, int kt, int k, int dims3,
                  int cached, int scale) {
    char name[VAE_NAME_MAX];
    c->cin = ci, c->cout = co, c->kt = kt, c->kh = c->kw = k;
    int64_t ws[5] = {co, ci, kt, k, k};
    if (!dims3) ws[2] = k, ws[3] = k;
    snprintf(name, sizeof name, "%s.weight", prefix);
    c->w = add_param(m, name, dims3 ? 5 : 4, ws, 1);
    snprintf(name, sizeof name, "%s.bias", prefix);
    int64_t bs[1] = {co};
    c->b = add_param(m, name, 1, bs, 0);
    c->slot = -1;
    if (cached) {
        if (m->nslots >= (int)(sizeof m->slots / sizeof m->slots[0])) return core_error("too many cached convolutions");
        c->slot = m->nslots;
        m->slots[m->nslots].c = ci, m->slots[m->nslots].scale = scale;
        m->nslots++;
    }
    return 0;
}

void vae_make_norm(vae_model *m, vae_norm *n, const char *prefix, int c, int images) {
    char name[VAE_NAME_MAX];
    snprintf(name, sizeof name, "%s.gamma", prefix);
    int64_t s[4] = {c, 1, 1, 1};
    n->gamma = add_param(m, name, images ? 3 : 4, s, 0);
    n->c = c;
}

int vae_make_res(vae_model *m, vae_resblock *r, const char *prefix, int ci, int co, int scale) {
    char p[VAE_NAME_MAX];
    r->cin = ci, r->cout = co, r->has_sc = ci != co;
    snprintf(p, sizeof p, "%s.norm1", prefix);
    vae_make_norm(m, &r->n1, p, ci, 0);
    snprintf(p, sizeof p, "%s.conv1", prefix);
    if (vae_make_conv(m, &r->c1, p, ci, co, 3, 3, 1, 1, scale)) return -1;
    snprintf(p, sizeof p, "%s.norm2", prefix);
    vae_make_norm(m, &r->n2, p, co, 0);
    snprintf(p, sizeof p, "%s.conv2", prefix);
    if (vae_make_conv(m, &r->c2, p, co, co, 3, 3, 1, 1, scale)) return -1;
    if (r->has_sc) {
        snprintf(p, sizeof p, "%s.conv_shortcut", prefix);
        if (vae_make_conv(m, &r->sc, p, ci, co, 1, 1, 1, 0, scale)) return -1;
    }
    return 0;
}

int vae_build(vae_model *m) {
    const vae_config *c = &m->cfg;
    const int d = c->decoder_base_dim, L = c->n_mult;
    m->dims[0] = d * c->dim_mult[L - 1];
    for (int i = 0; i < L; i++) m->dims[i + 1] = d * c->dim_mult[L - 1 - i];
    int z = c->z_dim, scale = 1;
    if (vae_make_conv(m, &m->post_quant, "post_quant_conv", z, z, 1, 1, 1, 0, 1)) return -1;
    if (vae_make_conv(m, &m->conv_in, "decoder.conv_in", z, m->dims[0], 3, 3, 1, 1, 1)) return -1;
    const int d0 = m->dims[0];
    if (vae_make_res(m, &m->mid_res[0], "decoder.mid_block.resnets.0", d0, d0, 1)) return -1;
    vae_make_norm(m, &m->mid_attn.n, "decoder.mid_block.attentions.0.norm", d0, 1);
    m->mid_attn.c = d0;
    if (vae_make_conv(m, &m->mid_attn.qkv, "decoder.mid_block.attentions.0.to_qkv", d0, 3 * d0, 1, 1, 0, 0, 1))
        return -1;
    if (vae_make_conv(m, &m->mid_attn.proj, "decoder.mid_block.attentions.0.proj", d0, d0, 1, 1, 0, 0, 1)) return -1;
    if (vae_make_res(m, &m->mid_res[1], "decoder.mid_block.resnets.1", d0, d0, 1)) return -1;
    m->nup = L;
    m->ntime = 0;
    m->n_tup = m->n_sup = 0;
    int cur = 0;
    for (int i = 0; i < L; i++) {
        vae_upblock *u = &m->upb[i];
        memset(u, 0, sizeof *u);
        int in_dim = m->dims[i], out_dim = m->dims[i + 1];
        if (i > 0 && !c->is_residual) in_dim /= 2;
        u->in_dim = in_dim, u->out_dim = out_dim;
        u->nres = c->num_res_blocks + 1;
        int up_flag = i != L - 1;
        /* the decoder's temperal_upsample is temperal_downsample reversed */
        int temporal = up_flag && c->temperal_downsample[L - 2 - i];
        u->up = up_flag ? (temporal ? 3 : 2) : 0;
        if (i > 0 && !c->is_residual && cur != in_dim)
            return core_error("vae config: up-block %d expects %d input channels, the previous block gives %d", i,
                              in_dim, cur);
        int ch = in_dim;
        for (int j = 0; j < u->nres; j++) {
            char p[VAE_NAME_MAX];
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d", i, j);
            if (vae_make_res(m, &u->res[j], p, ch, out_dim, scale)) return -1;
            ch = out_dim;
        }
        if (up_flag) {
            const char *ups = c->is_residual ? "upsampler" : "upsamplers.0";
            char p[VAE_NAME_MAX];
            u->up_out = c->is_residual ? out_dim : out_dim / 2;
            if (u->up_out < 1) return core_error("vae config: up-block %d has %d channels, too few to halve", i, out_dim);
            if (temporal) {
                snprintf(p, sizeof p, "decoder.up_blocks.%d.%s.time_conv", i, ups);
                /* time_conv: causal (3,1,1) conv dim -> 2 dim */
                if (vae_make_conv(m, &u->time_conv, p, out_dim, 2 * out_dim, 3, 1, 1, 1, scale)) return -1;
                u->time_slot = m->ntime++;
                m->n_tup++;
            }
            snprintf(p, sizeof p, "decoder.up_blocks.%d.%s.resample.1", i, ups);
            if (vae_make_conv(m, &u->resample, p, out_dim, u->up_out, 1, 3, 0, 0, scale)) return -1;
            m->n_sup++;
            scale *= 2;
            if (c->is_residual) {
                u->dup = 1;
                u->dup_ft = temporal ? 2 : 1;
                if ((out_dim * u->dup_ft * 4) % in_dim)
                    return core_error("vae config: up-block %d: DupUp3D needs out_dim * factor (%d) divisible by "
                                      "in_dim %d",
                                      i, out_dim * u->dup_ft * 4, in_dim);
            }
            cur = u->up_out;
        } else {
            cur = out_dim;
        }
    }
    vae_make_norm(m, &m->norm_out, "decoder.norm_out", cur, 0);
    if (vae_make_conv(m, &m->conv_out, "decoder.conv_out", cur, c->out_channels, 3, 3, 1, 1, scale)) return -1;
    if (!m->table) return core_error("out of memory for the VAE parameter table");
    return 0;
}

/* ---- loading ---- */

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        core_error("%s: cannot open", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s || fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        fclose(f);
        core_error("%s: cannot read", path);
        return NULL;
    }
    s[n] = 0;
    fclose(f);
    return s;
}

/* Reorders a conv weight [co, ci, kt*kh*kw] to [co, kt*kh*kw, ci] in place (tmp: ci*k floats). */
static void reorder(float *w, int co, int ci, int k, float *tmp) {
    for (int o = 0; o < co; o++) {
        float *r = w + (size_t)o * ci * k;
        for (int i = 0; i < ci; i++)
            for (int t = 0; t < k; t++) tmp[(size_t)t * ci + i] = r[(size_t)i * k + t];
        memcpy(r, tmp, (size_t)ci * k * sizeof(float));
    }
}

int vae_load_weights(vae_model *m, const char *dir, int part) {
    const char *what = part == VAE_PART_ENCODER ? "encoder" : "decoder";
    st_set *s = st_open_dir(dir);
    if (!s) return -1;
    int rc = -1;
    float *tmp = NULL;
    m->params = malloc(m->nfloats * sizeof(float));
    if (!m->params) {
        core_error("%s: out of memory for %zu VAE parameters", dir, m->nfloats);
        goto done;
    }
    for (int i = 0; i < m->nparams; i++) {
        const vae_param *p = &m->table[i];
        int k = st_set_find(s, p->name);
        if (k < 0) {
            int any = 0; /* a folder with none of this part's tensors (the tiny preset writes no encoder) */
            for (int j = 0; part == VAE_PART_ENCODER && j < st_set_count(s) && !any; j++)
                any = !strncmp(st_set_name(s, j), "encoder.", 8);
            if (part == VAE_PART_ENCODER && !any)
                core_error("%s: the VAE has no encoder weights (missing tensor \"%s\"); this folder can only decode "
                           "(vgrpo's tiny preset writes the decoder alone)",
                           dir, p->name);
            else
                core_error("%s: missing tensor \"%s\"", dir, p->name);
            goto done;
        }
        const st_info *inf = st_set_info_at(s, k);
        int ok = inf->ndim == p->ndim;
        for (int d = 0; ok && d < p->ndim; d++) ok = inf->shape[d] == p->shape[d];
        if (!ok) {
            char want[96] = "", got[96] = "";
            for (int d = 0; d < p->ndim; d++)
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
                         (long long)p->shape[d]);
            for (int d = 0; d < inf->ndim; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                         (long long)inf->shape[d]);
            core_error("%s: tensor \"%s\" has shape [%s], the config implies [%s]", dir, p->name, got, want);
            goto done;
        }
        int64_t n = 1;
        for (int d = 0; d < p->ndim; d++) n *= p->shape[d];
        if (st_set_read_f32(s, p->name, m->params + p->offset, n)) goto done;
    }
    for (int i = 0; i < st_set_count(s); i++) {
        const char *name = st_set_name(s, i);
        if (part == VAE_PART_DECODER && (!strncmp(name, "encoder.", 8) || !strncmp(name, "quant_conv.", 11)))
            continue;
        if (part == VAE_PART_ENCODER && (!strncmp(name, "decoder.", 8) || !strncmp(name, "post_quant_conv.", 16)))
            continue;
        int found = 0;
        for (int j = 0; j < m->nparams && !found; j++) found = !strcmp(m->table[j].name, name);
        if (!found) {
            core_error("%s: unexpected tensor \"%s\" (not in the %s the config describes)", dir, name, what);
            goto done;
        }
    }
    size_t maxk = 0;
    for (int i = 0; i < m->nparams; i++)
        if (m->table[i].conv) {
            size_t k = 1;
            for (int d = 1; d < m->table[i].ndim; d++) k *= (size_t)m->table[i].shape[d];
            if (k > maxk) maxk = k;
        }
    tmp = malloc((maxk ? maxk : 1) * sizeof(float));
    if (!tmp) {
        core_error("out of memory");
        goto done;
    }
    for (int i = 0; i < m->nparams; i++) {
        const vae_param *p = &m->table[i];
        if (!p->conv) continue;
        int k = 1;
        for (int d = 2; d < p->ndim; d++) k *= (int)p->shape[d];
        reorder(m->params + p->offset, (int)p->shape[0], (int)p->shape[1], k, tmp);
    }
    rc = 0;
done:
    free(tmp);
    st_set_close(s);
    return rc;
}

/* The decode state (allocated by wan_vae_decode.c on first use) is freed with the model, here, so that loading and
 * freeing do not depend on the decode loop (no circle between the two files). */
void vae_state_free(vae_state *st) {
    void (*release)(void *) = st->dev ? st->dev->mem_free : free;
    if (st->cache) {
        for (int i = 0; st->cache[i]; i++) release(st->cache[i]);
    }
    free(st->cache);
    free(st->cache_n);
    free(st->time_seen);
    for (int i = 0; i < 5; i++)
        if (st->buf[i]) release(st->buf[i]);
    if (st->col) release(st->col);
    if (st->attn) release(st->attn);
    free(st->host);
    memset(st, 0, sizeof *st);
}

void vae_upload_free(vae_model *m) {
    if (m->dw) m->dev->mem_free(m->dw);
    m->dw = NULL, m->dw_bytes = 0, m->dev = NULL;
}

void vae_free(vae_model *m) {
    if (!m) return;
    vae_state_free(&m->st);
    vae_upload_free(m);
    free(m->table);
    free(m->params);
    free(m);
}

int vae_open_config(const char *dir_in, char *dir, size_t cap, vae_config *cfg) {
    char path[4200];
    struct stat sb;
    snprintf(dir, cap, "%s", dir_in);
    snprintf(path, sizeof path, "%s/model_index.json", dir_in);
    if (stat(path, &sb) == 0) snprintf(dir, cap, "%s/vae", dir_in);
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = read_text(path);
    if (!text) return -1;
    int rc = vae_config_parse(cfg, text, path);
    free(text);
    return rc;
}

vae_model *vae_load(const char *dir_in) {
    char dir[4096];
    vae_model *m = calloc(1, sizeof *m);
    if (!m) {
        core_error("out of memory");
        return NULL;
    }
    if (vae_open_config(dir_in, dir, sizeof dir, &m->cfg) || vae_build(m) ||
        vae_load_weights(m, dir, VAE_PART_DECODER)) {
        vae_free(m);
        return NULL;
    }
    return m;
}

const vae_config *vae_get_config(const vae_model *m) { return &m->cfg; }

int vae_frames_out(const vae_model *m, int T) { return T < 1 ? 0 : 1 + (T - 1) * (1 << m->n_tup); }

int vae_spatial_factor(const vae_model *m) { return (1 << m->n_sup) * m->cfg.patch_size; }

int vae_video_channels(const vae_model *m) { return m->cfg.out_channels / (m->cfg.patch_size * m->cfg.patch_size); }
