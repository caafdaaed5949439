/* cli/clip_init.c — `vgrpo init-clip`'s model files: config.json, preprocessor_config.json, model.safetensors
 * (cli/cmd_init_clip.c describes them). */
#include "cli/clip_init.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "core/safetensors.h"

#define PHILOX_STREAM_CLIP 11u /* Philox stream of init-clip's weights (a stream no run uses) */

typedef struct {
    st_writer *w;
    float *bufs[512];
    int n;
    uint64_t seed;
} wr;

/* Adds tensor `name` of the shape, filled with offset + scale x normal (slot = the tensor's index). */
static int add(wr *W, const char *name, int ndim, const int64_t *shape, double offset, double scale) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!x || W->n == 512) return free(x), core_error("init-clip: out of memory");
    core_philox_normal(x, n, W->seed, (uint32_t)W->n, 0, PHILOX_STREAM_CLIP);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(offset + scale * x[i]);
    W->bufs[W->n++] = x;
    return st_writer_add(W->w, name, CORE_F32, ndim, shape, x);
}

static int add_linear(wr *W, const char *prefix, int out, int in, int bias) {
    char name[256];
    const int64_t ws[2] = {out, in}, bs[1] = {out};
    snprintf(name, sizeof name, "%s.weight", prefix);
    if (add(W, name, 2, ws, 0.0, 1.0 / sqrt((double)in))) return -1;
    snprintf(name, sizeof name, "%s.bias", prefix);
    return bias ? add(W, name, 1, bs, 0.0, 0.02) : 0;
}

static int add_ln(wr *W, const char *prefix) {
    char name[256];
    const int64_t s[1] = {CLIP_INIT_WIDTH};
    snprintf(name, sizeof name, "%s.weight", prefix);
    if (add(W, name, 1, s, 1.0, 0.1)) return -1;
    snprintf(name, sizeof name, "%s.bias", prefix);
    return add(W, name, 1, s, 0.0, 0.05);
}

static int add_encoder(wr *W, const char *tower) {
    static const char *const proj[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    char p[256];
    for (int l = 0; l < CLIP_INIT_LAYERS; l++) {
        snprintf(p, sizeof p, "%s.encoder.layers.%d.layer_norm1", tower, l);
        if (add_ln(W, p)) return -1;
        for (int k = 0; k < 4; k++) {
            snprintf(p, sizeof p, "%s.encoder.layers.%d.self_attn.%s", tower, l, proj[k]);
            if (add_linear(W, p, CLIP_INIT_WIDTH, CLIP_INIT_WIDTH, 1)) return -1;
        }
        snprintf(p, sizeof p, "%s.encoder.layers.%d.layer_norm2", tower, l);
        if (add_ln(W, p)) return -1;
        snprintf(p, sizeof p, "%s.encoder.layers.%d.mlp.fc1", tower, l);
        if (add_linear(W, p, CLIP_INIT_MLP, CLIP_INIT_WIDTH, 1)) return -1;
        snprintf(p, sizeof p, "%s.encoder.layers.%d.mlp.fc2", tower, l);
        if (add_linear(W, p, CLIP_INIT_WIDTH, CLIP_INIT_MLP, 1)) return -1;
    }
    return 0;
}

static int write_weights(const char *dir, uint64_t seed, int image) {
    wr W = {.w = st_writer_new(), .seed = seed};
    if (!W.w) return -1;
    const int grid = image / CLIP_INIT_PATCH, P = CLIP_INIT_PATCH, Wd = CLIP_INIT_WIDTH, E = CLIP_INIT_PROJ;
    const int64_t tok[2] = {CLIP_INIT_VOCAB, Wd}, tpos[2] = {CLIP_INIT_POSITIONS, Wd}, cls[1] = {Wd},
                  patch[4] = {Wd, 3, P, P}, vpos[2] = {(int64_t)grid * grid + 1, Wd}, scalar[1] = {1};
    int rc = add(&W, "text_model.embeddings.token_embedding.weight", 2, tok, 0.0, 1.0) ||
             add(&W, "text_model.embeddings.position_embedding.weight", 2, tpos, 0.0, 0.5) ||
             add_encoder(&W, "text_model") || add_ln(&W, "text_model.final_layer_norm") ||
             add(&W, "vision_model.embeddings.class_embedding", 1, cls, 0.0, 0.5) ||
             add(&W, "vision_model.embeddings.patch_embedding.weight", 4, patch, 0.0, 1.0 / sqrt(3.0 * P * P)) ||
             add(&W, "vision_model.embeddings.position_embedding.weight", 2, vpos, 0.0, 0.5) ||
             add_ln(&W, "vision_model.pre_layrnorm") || add_encoder(&W, "vision_model") ||
             add_ln(&W, "vision_model.post_layernorm") ||
             add_linear(&W, "visual_projection", E, Wd, 0) || add_linear(&W, "text_projection", E, Wd, 0);
    /* logit_scale: a 0-dim tensor, ln(1 / 0.07) (CLIP's initial temperature) */
    float *ls = malloc(sizeof(float));
    if (!rc && ls) {
        *ls = (float)log(1.0 / 0.07);
        W.bufs[W.n++] = ls;
        rc = st_writer_add(W.w, "logit_scale", CORE_F32, 0, scalar, ls);
    } else {
        free(ls);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!rc) rc = st_writer_set_metadata(W.w, "format", "pt") || st_writer_write(W.w, path);
    st_writer_free(W.w);
    for (int i = 0; i < W.n; i++) free(W.bufs[i]);
    return rc ? -1 : 0;
}

/* Writes `root` (stolen) to dir/name, indented. */
int clip_init_dump(json_t *root, const char *dir, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const int rc = !root || json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0;
    json_decref(root);
    return rc ? core_error("%s: cannot write", path) : 0;
}

static json_t *tower_json(const char *type, int vision, int image) {
    json_t *t = json_object();
    json_object_set_new(t, "model_type", json_string(type));
    json_object_set_new(t, "hidden_size", json_integer(CLIP_INIT_WIDTH));
    json_object_set_new(t, "intermediate_size", json_integer(CLIP_INIT_MLP));
    json_object_set_new(t, "num_hidden_layers", json_integer(CLIP_INIT_LAYERS));
    json_object_set_new(t, "num_attention_heads", json_integer(CLIP_INIT_HEADS));
    json_object_set_new(t, "hidden_act", json_string("quick_gelu"));
    json_object_set_new(t, "layer_norm_eps", json_real(1e-5));
    json_object_set_new(t, "projection_dim", json_integer(CLIP_INIT_PROJ));
    if (vision) {
        json_object_set_new(t, "image_size", json_integer(image));
        json_object_set_new(t, "patch_size", json_integer(CLIP_INIT_PATCH));
        json_object_set_new(t, "num_channels", json_integer(3));
    } else {
        json_object_set_new(t, "vocab_size", json_integer(CLIP_INIT_VOCAB));
        json_object_set_new(t, "max_position_embeddings", json_integer(CLIP_INIT_POSITIONS));
        json_object_set_new(t, "bos_token_id", json_integer(CLIP_INIT_VOCAB - 2));
        json_object_set_new(t, "eos_token_id", json_integer(CLIP_INIT_VOCAB - 1));
        json_object_set_new(t, "pad_token_id", json_integer(CLIP_INIT_VOCAB - 1));
    }
    return t;
}

static int write_config(const char *dir, int image) {
    json_t *c = json_object(), *arch = json_array();
    json_array_append_new(arch, json_string("CLIPModel"));
    json_object_set_new(c, "architectures", arch);
    json_object_set_new(c, "model_type", json_string("clip"));
    json_object_set_new(c, "projection_dim", json_integer(CLIP_INIT_PROJ));
    json_object_set_new(c, "logit_scale_init_value", json_real(2.6592));
    json_object_set_new(c, "text_config", tower_json("clip_text_model", 0, image));
    json_object_set_new(c, "vision_config", tower_json("clip_vision_model", 1, image));
    return clip_init_dump(c, dir, "config.json");
}

static int write_preprocessor(const char *dir, int image) {
    static const double mean[3] = {0.48145466, 0.4578275, 0.40821073}, std[3] = {0.26862954, 0.26130258, 0.27577711};
    json_t *p = json_object(), *size = json_object(), *crop = json_object(), *m = json_array(), *s = json_array();
    json_object_set_new(p, "image_processor_type", json_string("CLIPImageProcessor"));
    json_object_set_new(p, "do_resize", json_true());
    json_object_set_new(size, "shortest_edge", json_integer(image));
    json_object_set_new(p, "size", size);
    json_object_set_new(p, "resample", json_integer(3));
    json_object_set_new(p, "do_center_crop", json_true());
    json_object_set_new(crop, "height", json_integer(image));
    json_object_set_new(crop, "width", json_integer(image));
    json_object_set_new(p, "crop_size", crop);
    json_object_set_new(p, "do_rescale", json_true());
    json_object_set_new(p, "rescale_factor", json_real(1.0 / 255.0));
    json_object_set_new(p, "do_normalize", json_true());
    for (int i = 0; i < 3; i++) json_array_append_new(m, json_real(mean[i])), json_array_append_new(s, json_real(std[i]));
    json_object_set_new(p, "image_mean", m);
    json_object_set_new(p, "image_std", s);
    json_object_set_new(p, "do_convert_rgb", json_true());
    return clip_init_dump(p, dir, "preprocessor_config.json");
}

int clip_init_write_model(const char *dir, uint64_t seed, int image) {
    return write_config(dir, image) || write_preprocessor(dir, image) || write_weights(dir, seed, image) ? -1 : 0;
}
