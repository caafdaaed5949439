/* model/dit/wan_config.c — WanTransformer3DModel config.json (read, check, write) and the presets.
 * Reference: diffusers 0.42.1 WanTransformer3DModel.__init__ (argument names and defaults) and
 * ConfigMixin.save_config (the file save_pretrained writes: every argument plus _class_name and
 * _diffusers_version, keys sorted, indent 2). */
#include "model/dit/wan_dit.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "model/dit/wan_dev.h"

/* diffusers' __init__ defaults. */
static const wan_config wan_defaults = {
    .patch_size = {1, 2, 2},
    .num_attention_heads = 40,
    .attention_head_dim = 128,
    .in_channels = 16,
    .out_channels = 16,
    .text_dim = 4096,
    .freq_dim = 256,
    .ffn_dim = 13824,
    .num_layers = 40,
    .cross_attn_norm = 1,
    .eps = 1e-6,
    .rope_max_seq_len = 1024,
};

static int get_int(const char *label, const char *key, json_t *v, int *out) {
    if (!json_is_integer(v)) return core_error("%s: %s: expected an integer", label, key);
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > 1000000000) return core_error("%s: %s: %lld is out of range", label, key, (long long)x);
    *out = (int)x;
    return 0;
}

int wan_config_parse(wan_config *c, const char *json_text, const char *label) {
    json_t *root = core_json_parse_object(json_text, label);
    if (!root) return -1;
    *c = wan_defaults;
    int out_channels_null = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        int rc = 0;
        if (key[0] == '_') continue; /* _class_name, _diffusers_version, _name_or_path, ... */
        if (!strcmp(key, "patch_size")) {
            if (!json_is_array(v) || json_array_size(v) != 3) {
                rc = core_error("%s: patch_size: expected a list of 3 integers", label);
            } else {
                for (int i = 0; i < 3 && !rc; i++) rc = get_int(label, key, json_array_get(v, i), &c->patch_size[i]);
            }
        } else if (!strcmp(key, "num_attention_heads")) {
            rc = get_int(label, key, v, &c->num_attention_heads);
        } else if (!strcmp(key, "attention_head_dim")) {
            rc = get_int(label, key, v, &c->attention_head_dim);
        } else if (!strcmp(key, "in_channels")) {
            rc = get_int(label, key, v, &c->in_channels);
        } else if (!strcmp(key, "out_channels")) {
            if (json_is_null(v)) out_channels_null = 1;
            else rc = get_int(label, key, v, &c->out_channels);
            if (!rc && c->out_channels == 0) out_channels_null = 1; /* `out_channels or in_channels` */
        } else if (!strcmp(key, "text_dim")) {
            rc = get_int(label, key, v, &c->text_dim);
        } else if (!strcmp(key, "freq_dim")) {
            rc = get_int(label, key, v, &c->freq_dim);
        } else if (!strcmp(key, "ffn_dim")) {
            rc = get_int(label, key, v, &c->ffn_dim);
        } else if (!strcmp(key, "num_layers")) {
            rc = get_int(label, key, v, &c->num_layers);
        } else if (!strcmp(key, "rope_max_seq_len")) {
            rc = get_int(label, key, v, &c->rope_max_seq_len);
        } else if (!strcmp(key, "cross_attn_norm")) {
            if (!json_is_boolean(v)) rc = core_error("%s: cross_attn_norm: expected true or false", label);
            else c->cross_attn_norm = json_is_true(v);
        } else if (!strcmp(key, "eps")) {
            if (!json_is_number(v)) rc = core_error("%s: eps: expected a number", label);
            else c->eps = json_number_value(v);
        } else if (!strcmp(key, "qk_norm")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "rms_norm_across_heads") != 0)
                rc = core_error("%s: qk_norm: only \"rms_norm_across_heads\" is supported (diffusers 0.42 always "
                                "applies RMSNorm across heads to q and k)", label);
        } else if (!strcmp(key, "image_dim")) {
            if (!json_is_null(v))
                rc = core_error("%s: image_dim: must be null: Wan 2.1 I2V's CLIP image embeddings are not supported "
                                "(Wan 2.2 I2V-A14B and TI2V-5B have no image encoder)", label);
        } else if (!strcmp(key, "added_kv_proj_dim") || !strcmp(key, "pos_embed_seq_len")) {
            if (!json_is_null(v))
                rc = core_error("%s: %s: must be null: image conditioning (I2V/FLF2V) is not supported yet", label,
                                key);
        } else {
            rc = core_error("%s: unknown key \"%s\" (not a WanTransformer3DModel argument in diffusers 0.42)", label,
                            key);
        }
        if (rc) {
            json_decref(root);
            return -1;
        }
    }
    json_decref(root);
    if (out_channels_null) c->out_channels = c->in_channels;
    return wan_config_validate(c, label);
}

int wan_config_load(wan_config *c, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return core_error("%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return core_error("%s: cannot read", path);
    }
    long n = ftell(f);
    if (n < 0 || n > (1 << 20)) {
        fclose(f);
        return core_error("%s: unreadable or larger than 1 MiB", path);
    }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return core_error("%s: out of memory", path);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(buf);
        return core_error("%s: short read", path);
    }
    buf[n] = 0;
    int rc = wan_config_parse(c, buf, path);
    free(buf);
    return rc;
}

int wan_config_validate(const wan_config *c, const char *label) {
    const struct {
        const char *key;
        int v;
    } pos[] = {{"patch_size", c->patch_size[0]},
               {"patch_size", c->patch_size[1]},
               {"patch_size", c->patch_size[2]},
               {"num_attention_heads", c->num_attention_heads},
               {"attention_head_dim", c->attention_head_dim},
               {"in_channels", c->in_channels},
               {"out_channels", c->out_channels},
               {"text_dim", c->text_dim},
               {"freq_dim", c->freq_dim},
               {"ffn_dim", c->ffn_dim},
               {"num_layers", c->num_layers},
               {"rope_max_seq_len", c->rope_max_seq_len}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v < 1) return core_error("%s: %s: must be >= 1, got %d", label, pos[i].key, pos[i].v);
    if (c->attention_head_dim % 2 || c->attention_head_dim < 6)
        return core_error("%s: attention_head_dim: must be even and >= 6 for Wan's 3-D RoPE, got %d", label,
                          c->attention_head_dim);
    if ((int64_t)c->num_attention_heads * c->attention_head_dim > 65536)
        return core_error("%s: num_attention_heads * attention_head_dim is too large", label);
    if (!(c->eps > 0) || !isfinite(c->eps)) return core_error("%s: eps: must be a positive number", label);
    return 0;
}

int wan_config_save(const wan_config *c, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return core_error("%s: cannot create: %s", path, strerror(errno));
    /* Keys sorted as diffusers writes them (json.dumps(sort_keys=True)); eps in Python's repr form. */
    char eps[64];
    snprintf(eps, sizeof eps, "%.17g", c->eps);
    for (int p = 1; p <= 17; p++) { /* shortest representation that round-trips */
        snprintf(eps, sizeof eps, "%.*g", p, c->eps);
        if (strtod(eps, NULL) == c->eps) break;
    }
    if (!strchr(eps, '.') && !strchr(eps, 'e') && !strchr(eps, 'n') && !strchr(eps, 'i')) strcat(eps, ".0");
    int rc = fprintf(f,
                     "{\n"
                     "  \"_class_name\": \"WanTransformer3DModel\",\n"
                     "  \"_diffusers_version\": \"0.42.1\",\n"
                     "  \"added_kv_proj_dim\": null,\n"
                     "  \"attention_head_dim\": %d,\n"
                     "  \"cross_attn_norm\": %s,\n"
                     "  \"eps\": %s,\n"
                     "  \"ffn_dim\": %d,\n"
                     "  \"freq_dim\": %d,\n"
                     "  \"image_dim\": null,\n"
                     "  \"in_channels\": %d,\n"
                     "  \"num_attention_heads\": %d,\n"
                     "  \"num_layers\": %d,\n"
                     "  \"out_channels\": %d,\n"
                     "  \"patch_size\": [\n    %d,\n    %d,\n    %d\n  ],\n"
                     "  \"pos_embed_seq_len\": null,\n"
                     "  \"qk_norm\": \"rms_norm_across_heads\",\n"
                     "  \"rope_max_seq_len\": %d,\n"
                     "  \"text_dim\": %d\n"
                     "}\n",
                     c->attention_head_dim, c->cross_attn_norm ? "true" : "false", eps, c->ffn_dim, c->freq_dim,
                     c->in_channels, c->num_attention_heads, c->num_layers, c->out_channels, c->patch_size[0],
                     c->patch_size[1], c->patch_size[2], c->rope_max_seq_len, c->text_dim);
    if (rc < 0 || fclose(f) != 0) return core_error("%s: write failed: %s", path, strerror(errno));
    return 0;
}

int wan_config_equal(const wan_config *a, const wan_config *b) {
    return a->patch_size[0] == b->patch_size[0] && a->patch_size[1] == b->patch_size[1] &&
           a->patch_size[2] == b->patch_size[2] && a->num_attention_heads == b->num_attention_heads &&
           a->attention_head_dim == b->attention_head_dim && a->in_channels == b->in_channels &&
           a->out_channels == b->out_channels && a->text_dim == b->text_dim && a->freq_dim == b->freq_dim &&
           a->ffn_dim == b->ffn_dim && a->num_layers == b->num_layers && a->cross_attn_norm == b->cross_attn_norm &&
           a->eps == b->eps && a->rope_max_seq_len == b->rope_max_seq_len;
}

wan_cond wan_cond_kind(const wan_config *c) {
    if (c->in_channels == c->out_channels) return WAN_COND_LATENT;
    if (c->in_channels == 2 * c->out_channels + 4) return WAN_COND_CONCAT; /* 4: VAE_I2V_MASK_CHANNELS */
    return WAN_COND_UNKNOWN;
}

int wan_cond_channels(const wan_config *c) {
    return wan_cond_kind(c) == WAN_COND_CONCAT ? c->in_channels - c->out_channels : 0;
}

/* Presets. Real sizes: the official Wan-AI/<model>-Diffusers transformer/config.json files; the tiny one is ours. */
typedef struct {
    const char *name;
    wan_config cfg;
} wan_preset;

#define WAN_REAL(H, FFN, LAYERS, CH) \
    {{1, 2, 2}, (H), 128, (CH), (CH), 4096, 256, (FFN), (LAYERS), 1, 1e-6, 1024}
/* Wan 2.2 I2V-A14B: the A14B experts with 36 input channels (latents 16, mask 4, condition latents 16), 16 out */
#define WAN_I2V(H, FFN, LAYERS, IN, OUT) \
    {{1, 2, 2}, (H), 128, (IN), (OUT), 4096, 256, (FFN), (LAYERS), 1, 1e-6, 1024}

static const wan_preset presets[] = {
    {"tiny", {{1, 2, 2}, 4, 32, 16, 16, 64, 256, 256, 2, 1, 1e-6, 1024}},
    {"tiny-ti2v", {{1, 2, 2}, 4, 32, 16, 16, 64, 256, 256, 2, 1, 1e-6, 1024}}, /* tiny's DiT; the pipeline differs */
    {"tiny-i2v", {{1, 2, 2}, 4, 32, 36, 16, 64, 256, 256, 2, 1, 1e-6, 1024}},  /* tiny with I2V-A14B's 36 in, 16 out */
    {"wan2.1-t2v-1.3b", WAN_REAL(12, 8960, 30, 16)},
    {"wan2.2-ti2v-5b", WAN_REAL(24, 14336, 30, 48)},
    {"wan2.2-t2v-a14b", WAN_REAL(40, 13824, 40, 16)},
    {"wan2.2-i2v-a14b", WAN_I2V(40, 13824, 40, 36, 16)},
};

static const char *const preset_names[] = {"tiny",           "tiny-ti2v",       "tiny-i2v",        "wan2.1-t2v-1.3b",
                                           "wan2.2-ti2v-5b", "wan2.2-t2v-a14b", "wan2.2-i2v-a14b", NULL};

const char *const *wan_preset_names(void) { return preset_names; }

int wan_config_preset(wan_config *c, const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(presets[i].name, name)) {
            *c = presets[i].cfg;
            return 0;
        }
    return core_error("unknown preset \"%s\" (presets: tiny, tiny-ti2v, tiny-i2v, wan2.1-t2v-1.3b, wan2.2-ti2v-5b, "
                      "wan2.2-t2v-a14b, wan2.2-i2v-a14b)", name);
}

/* The device's constraints (wan_dev.h): here beside the config's other checks, so that the activation planner
 * (wan_acts.c) needs no more of the device files. */
int wan_dev_config_check(const wan_config *c, const char *label) {
    if (wan_config_validate(c, label)) return -1;
    const int *p = c->patch_size;
    const struct {
        const char *key;
        long v;
    } dims[] = {
        {"dim (num_attention_heads x attention_head_dim)", (long)wan_dim(c)},
        {"attention_head_dim", c->attention_head_dim},
        {"ffn_dim", c->ffn_dim},
        {"text_dim", c->text_dim},
        {"freq_dim", c->freq_dim},
        {"in_channels x patch_size", (long)c->in_channels * p[0] * p[1] * p[2]},
        {"out_channels x patch_size", (long)c->out_channels * p[0] * p[1] * p[2]},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v % 8)
            return core_error("%s: %s %ld is not a multiple of 8 (cuBLASLt's leading dimensions and cuDNN's head "
                              "dim on the device)", label, dims[i].key, dims[i].v);
    if (c->attention_head_dim > 128)
        return core_error("%s: attention_head_dim %d is above 128 (cuDNN's fused attention backward)", label,
                          c->attention_head_dim);
    return 0;
}
