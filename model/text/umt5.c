/* model/text/umt5.c — umT5 encoder: config and weight loading (see umt5.h; the forward is umt5_forward.c). */
#include "model/text/umt5.h"
#include "model/text/umt5_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "kernels/cpu/cpu.h"

static int get_int(json_t *root, const char *key, int *out, const char *file) {
    json_t *v = json_object_get(root, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 1 << 30)
        return core_error("%s: \"%s\" missing or not a positive integer", file, key);
    *out = (int)json_integer_value(v);
    return 0;
}

int t5_config_load(const char *dir, t5_config *cfg) {
    char file[4096];
    snprintf(file, sizeof file, "%s/config.json", dir);
    json_t *root = core_json_load_object(file);
    if (!root) return -1;
    int rc = get_int(root, "vocab_size", &cfg->vocab_size, file) || get_int(root, "d_model", &cfg->d_model, file) ||
             get_int(root, "d_kv", &cfg->d_kv, file) || get_int(root, "d_ff", &cfg->d_ff, file) ||
             get_int(root, "num_layers", &cfg->num_layers, file) || get_int(root, "num_heads", &cfg->num_heads, file);
    cfg->num_buckets = 32, cfg->max_distance = 128, cfg->eps = 1e-6f;
    if (!rc && json_object_get(root, "relative_attention_num_buckets"))
        rc = get_int(root, "relative_attention_num_buckets", &cfg->num_buckets, file);
    if (!rc && json_object_get(root, "relative_attention_max_distance"))
        rc = get_int(root, "relative_attention_max_distance", &cfg->max_distance, file);
    json_t *eps = json_object_get(root, "layer_norm_epsilon");
    if (!rc && eps) {
        if (!json_is_number(eps) || json_number_value(eps) <= 0)
            rc = core_error("%s: \"layer_norm_epsilon\" is not a positive number", file);
        else cfg->eps = (float)json_number_value(eps);
    }
    const char *ff = json_string_value(json_object_get(root, "feed_forward_proj"));
    if (!rc && ff && strcmp(ff, "gated-gelu") != 0)
        rc = core_error("%s: \"feed_forward_proj\" is \"%s\"; only \"gated-gelu\" (umT5) is supported", file, ff);
    json_decref(root);
    return rc ? -1 : 0;
}

const t5_config *t5_get_config(const t5_encoder *e) { return &e->cfg; }

void t5_free(t5_encoder *e) {
    if (!e) return;
    t5_device_free(e);
    core_tensor_free(&e->embed);
    st_set_close(e->st);
    free(e->params);
    free(e->layers);
    free(e);
}

size_t t5_param_floats(const t5_config *c) {
    const size_t D = (size_t)c->d_model, I = (size_t)c->num_heads * c->d_kv, F = (size_t)c->d_ff;
    const size_t per = 4 * I * D + (size_t)c->num_buckets * c->num_heads + 2 * D + 3 * F * D; /* one block */
    return per * (size_t)c->num_layers + D;
}

size_t t5_host_bytes(const t5_encoder *e) {
    return e->params ? t5_param_floats(&e->cfg) * sizeof(float) + (size_t)e->cfg.num_layers * sizeof(t5_layer) : 0;
}

t5_encoder *t5_load(const char *dir) {
    t5_encoder *e = calloc(1, sizeof *e);
    if (!e) {
        core_error("umt5: out of memory");
        return NULL;
    }
    t5_config *c = &e->cfg;
    if (t5_config_load(dir, c) || !(e->st = st_open_dir(dir))) goto fail;
    const char *ename = st_set_find(e->st, "shared.weight") >= 0 ? "shared.weight" : "encoder.embed_tokens.weight";
    if (st_set_get(e->st, ename, &e->embed)) goto fail;
    if (e->embed.ndim != 2 || e->embed.shape[0] != c->vocab_size || e->embed.shape[1] != c->d_model ||
        (e->embed.dtype != CORE_F32 && e->embed.dtype != CORE_BF16 && e->embed.dtype != CORE_F16)) {
        core_error("%s: tensor \"%s\" should be F32/BF16/F16 [%d, %d]", dir, ename, c->vocab_size, c->d_model);
        goto fail;
    }
    size_t D = (size_t)c->d_model, I = (size_t)c->num_heads * c->d_kv, F = (size_t)c->d_ff, H = (size_t)c->num_heads;
    e->params = malloc(t5_param_floats(c) * sizeof(float));
    e->layers = calloc((size_t)c->num_layers, sizeof *e->layers);
    if (!e->params || !e->layers) {
        core_error("umt5: out of memory for %zu parameters", t5_param_floats(c));
        goto fail;
    }
    float *p = e->params;
    char name[256];
#define LOAD(ptr, suffix, n)                                                                                      \
    do {                                                                                                          \
        snprintf(name, sizeof name, "encoder.block.%d.layer.%s", l, suffix);                                      \
        (ptr) = p;                                                                                                \
        if (st_set_read_f32(e->st, name, p, (int64_t)(n))) goto fail;                                             \
        p += (n);                                                                                                 \
    } while (0)
    for (int l = 0; l < c->num_layers; l++) {
        t5_layer *L = &e->layers[l];
        LOAD(L->q, "0.SelfAttention.q.weight", I * D);
        LOAD(L->k, "0.SelfAttention.k.weight", I * D);
        LOAD(L->v, "0.SelfAttention.v.weight", I * D);
        LOAD(L->o, "0.SelfAttention.o.weight", D * I);
        LOAD(L->rel_bias, "0.SelfAttention.relative_attention_bias.weight", (size_t)c->num_buckets * H);
        LOAD(L->ln_attn, "0.layer_norm.weight", D);
        LOAD(L->wi0, "1.DenseReluDense.wi_0.weight", F * D);
        LOAD(L->wi1, "1.DenseReluDense.wi_1.weight", F * D);
        LOAD(L->wo, "1.DenseReluDense.wo.weight", D * F);
        LOAD(L->ln_ff, "1.layer_norm.weight", D);
    }
#undef LOAD
    e->final_ln = p;
    if (st_set_read_f32(e->st, "encoder.final_layer_norm.weight", p, (int64_t)D)) goto fail;
    return e;
fail:
    core_error_push("loading umT5 encoder from %s: ", dir);
    t5_free(e);
    return NULL;
}

int t5_attention(float *o, const float *q, const float *k, const float *v, const float *rel_bias, const int *bucket_of,
                 const int32_t *mask, int B, int S, int H, int Dk) {
    return k_cpu_t5_attention(o, q, k, v, rel_bias, bucket_of, mask, B, S, H, Dk);
}
