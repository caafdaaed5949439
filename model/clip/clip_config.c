/* model/clip/clip_config.c — CLIP configs (transformers config.json, open_clip model config) and the parameter
 * layout they imply (see clip_model.h, clip_internal.h). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "model/clip/clip_internal.h"

/* obj[key] as a positive int into *out; absent: *out keeps its default. `where` names the object ("text_config"). */
static int get_int(json_t *obj, const char *key, int *out, const char *file, const char *where) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 1 << 30)
        return core_error("%s: %s%s\"%s\" is not a positive integer", file, where, *where ? "." : "", key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_eps(json_t *obj, const char *key, float *out, const char *file, const char *where) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v) || !(json_number_value(v) > 0) || json_number_value(v) > 1)
        return core_error("%s: %s%s\"%s\" is not a number in (0, 1]", file, where, *where ? "." : "", key);
    *out = (float)json_number_value(v);
    return 0;
}

/* transformers' ACT2FN names the model can run. */
static int parse_act(json_t *obj, clip_act *act, const char *file, const char *where) {
    json_t *v = json_object_get(obj, "hidden_act");
    if (!v) return 0;
    const char *s = json_string_value(v);
    if (s && !strcmp(s, "quick_gelu")) *act = CLIP_ACT_QUICK_GELU;
    else if (s && !strcmp(s, "gelu")) *act = CLIP_ACT_GELU;
    else if (s && (!strcmp(s, "gelu_new") || !strcmp(s, "gelu_pytorch_tanh"))) *act = CLIP_ACT_GELU_TANH;
    else
        return core_error("%s: %s.\"hidden_act\" is %s; supported: \"quick_gelu\", \"gelu\", \"gelu_new\", "
                          "\"gelu_pytorch_tanh\"", file, where, s ? s : "not a string");
    return 0;
}

int clip_config_check(const clip_config *c, const char *label) {
    const clip_tower_config *t[2] = {&c->vision, &c->text};
    const char *nm[2] = {"vision", "text"};
    for (int i = 0; i < 2; i++) {
        if (t[i]->width < 1 || t[i]->layers < 1 || t[i]->heads < 1 || t[i]->mlp < 1 || !(t[i]->eps > 0))
            return core_error("%s: %s tower: width, layers, heads, mlp width and eps must be positive", label, nm[i]);
        if (t[i]->width % t[i]->heads)
            return core_error("%s: %s tower: width %d is not divisible by the head count %d", label, nm[i],
                              t[i]->width, t[i]->heads);
    }
    if (c->channels < 1 || c->patch < 1 || c->image_h < c->patch || c->image_w < c->patch)
        return core_error("%s: vision: image size %d x %d, patch size %d and %d channels give no patch", label,
                          c->image_h, c->image_w, c->patch, c->channels);
    if (c->vocab_size < 1 || c->max_positions < 1 || c->projection_dim < 1)
        return core_error("%s: text vocab_size, max positions and projection_dim must be positive", label);
    return 0;
}

int clip_grid_h(const clip_config *c) { return c->image_h / c->patch; }
int clip_grid_w(const clip_config *c) { return c->image_w / c->patch; }

static size_t layers_floats(const clip_tower_config *t) {
    const size_t W = (size_t)t->width, F = (size_t)t->mlp;
    return (size_t)t->layers * (4 * W + 3 * W * W + 3 * W + W * W + W + F * W + F + W * F + W);
}

size_t clip_vision_param_floats(const clip_config *c) {
    const size_t W = (size_t)c->vision.width, N = (size_t)clip_grid_h(c) * clip_grid_w(c) + 1;
    const size_t cpp = (size_t)c->channels * c->patch * c->patch;
    return W * cpp + W + N * W + (c->ln_pre ? 2 * W : 0) + 2 * W + (size_t)c->projection_dim * W +
           layers_floats(&c->vision);
}

size_t clip_text_param_floats(const clip_config *c) {
    const size_t W = (size_t)c->text.width, E = (size_t)c->projection_dim;
    return (size_t)c->vocab_size * W + (size_t)c->max_positions * W + 2 * W + E * W + (c->text_proj_bias ? E : 0) +
           layers_floats(&c->text);
}

static float *layout_layers(const clip_tower_config *t, clip_layer *L, float *p) {
    const size_t W = (size_t)t->width, F = (size_t)t->mlp;
    for (int l = 0; l < t->layers; l++) {
        clip_layer *y = &L[l];
        y->ln1_w = p, p += W;
        y->ln1_b = p, p += W;
        y->qkv_w = p, p += 3 * W * W;
        y->qkv_b = p, p += 3 * W;
        y->out_w = p, p += W * W;
        y->out_b = p, p += W;
        y->ln2_w = p, p += W;
        y->ln2_b = p, p += W;
        y->fc1_w = p, p += F * W;
        y->fc1_b = p, p += F;
        y->fc2_w = p, p += W * F;
        y->fc2_b = p, p += W;
    }
    return p;
}

void clip_vision_layout(const clip_config *c, clip_tower *t) {
    const size_t W = (size_t)c->vision.width, N = (size_t)clip_grid_h(c) * clip_grid_w(c) + 1;
    float *p = t->params;
    t->embed = p, p += W * (size_t)c->channels * c->patch * c->patch;
    t->class_emb = p, p += W;
    t->pos = p, p += N * W;
    t->pre_w = t->pre_b = NULL;
    if (c->ln_pre) t->pre_w = p, p += W, t->pre_b = p, p += W;
    p = layout_layers(&c->vision, t->layers, p);
    t->post_w = p, p += W;
    t->post_b = p, p += W;
    t->proj_w = p, p += (size_t)c->projection_dim * W;
    t->proj_b = NULL;
}

void clip_text_layout(const clip_config *c, clip_tower *t) {
    const size_t W = (size_t)c->text.width;
    float *p = t->params;
    t->embed = p, p += (size_t)c->vocab_size * W;
    t->class_emb = NULL;
    t->pos = p, p += (size_t)c->max_positions * W;
    t->pre_w = t->pre_b = NULL;
    p = layout_layers(&c->text, t->layers, p);
    t->post_w = p, p += W;
    t->post_b = p, p += W;
    t->proj_w = p, p += (size_t)c->projection_dim * W;
    t->proj_b = c->text_proj_bias ? p : NULL;
}

/* ------------------------------------------------------------------------------------------------------------
 * transformers (configuration_clip.py: CLIPTextConfig, CLIPVisionConfig, CLIPConfig defaults) */

int clip_config_load_transformers(const char *path, clip_config *c) {
    json_t *root = core_json_load_object(path);
    if (!root) return -1;
    int rc = 0;
    memset(c, 0, sizeof *c);
    c->format = CLIP_FORMAT_TRANSFORMERS;
    c->text = (clip_tower_config){512, 12, 8, 2048, 1e-5f, CLIP_ACT_QUICK_GELU};
    c->vision = (clip_tower_config){768, 12, 12, 3072, 1e-5f, CLIP_ACT_QUICK_GELU};
    c->channels = 3, c->image_h = 224, c->patch = 32, c->ln_pre = 1;
    c->vocab_size = 49408, c->max_positions = 77, c->eos_token_id = 49407, c->projection_dim = 512;
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (mt && strcmp(mt, "clip") != 0) {
        rc = core_error("%s: \"model_type\" is \"%s\"; only \"clip\" (CLIPModel) is supported", path, mt);
        goto out;
    }
    json_t *tc = json_object_get(root, "text_config"), *vc = json_object_get(root, "vision_config");
    if (!tc || json_is_null(tc)) tc = json_object_get(root, "text_config_dict");
    if (!vc || json_is_null(vc)) vc = json_object_get(root, "vision_config_dict");
    if (!json_is_object(tc) || !json_is_object(vc)) {
        rc = core_error("%s: \"text_config\" and \"vision_config\" must be objects (a CLIPModel config)", path);
        goto out;
    }
    rc = get_int(root, "projection_dim", &c->projection_dim, path, "");
    rc = rc || get_int(tc, "vocab_size", &c->vocab_size, path, "text_config") ||
         get_int(tc, "hidden_size", &c->text.width, path, "text_config") ||
         get_int(tc, "intermediate_size", &c->text.mlp, path, "text_config") ||
         get_int(tc, "num_hidden_layers", &c->text.layers, path, "text_config") ||
         get_int(tc, "num_attention_heads", &c->text.heads, path, "text_config") ||
         get_int(tc, "max_position_embeddings", &c->max_positions, path, "text_config") ||
         get_eps(tc, "layer_norm_eps", &c->text.eps, path, "text_config") ||
         parse_act(tc, &c->text.act, path, "text_config");
    rc = rc || get_int(vc, "hidden_size", &c->vision.width, path, "vision_config") ||
         get_int(vc, "intermediate_size", &c->vision.mlp, path, "vision_config") ||
         get_int(vc, "num_hidden_layers", &c->vision.layers, path, "vision_config") ||
         get_int(vc, "num_attention_heads", &c->vision.heads, path, "vision_config") ||
         get_int(vc, "num_channels", &c->channels, path, "vision_config") ||
         get_int(vc, "image_size", &c->image_h, path, "vision_config") ||
         get_int(vc, "patch_size", &c->patch, path, "vision_config") ||
         get_eps(vc, "layer_norm_eps", &c->vision.eps, path, "vision_config") ||
         parse_act(vc, &c->vision.act, path, "vision_config");
    if (rc) goto out;
    json_t *eos = json_object_get(tc, "eos_token_id");
    if (eos && !json_is_null(eos)) {
        if (!json_is_integer(eos) || json_integer_value(eos) < 0 || json_integer_value(eos) > 1 << 30) {
            rc = core_error("%s: text_config.\"eos_token_id\" is not a non-negative integer", path);
            goto out;
        }
        c->eos_token_id = (int)json_integer_value(eos);
    }
    /* CLIPTextModel.forward: eos_token_id 2 marks the configs written before the eos fix: argmax of the ids. */
    c->pool = c->eos_token_id == 2 ? CLIP_POOL_ARGMAX : CLIP_POOL_EOS;
    c->image_w = c->image_h;
    rc = clip_config_check(c, path);
out:
    json_decref(root);
    return rc ? -1 : 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * open_clip (model.py CLIPVisionCfg, CLIPTextCfg, _build_vision_tower, _build_text_tower) */

/* Keys whose presence with a value other than the default the C model cannot follow. */
static int refuse_key(json_t *o, const char *key, const char *file, const char *where, const char *what) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v) || json_is_false(v)) return 0;
    if (json_is_string(v) && !json_string_length(v)) return 0;
    if (json_is_number(v) && json_number_value(v) == 0) return 0;
    return core_error("%s: %s.\"%s\" is set: %s is not supported", file, where, key, what);
}

static int oc_eps(json_t *tower, float *eps, const char *file, const char *where) {
    json_t *nk = json_object_get(tower, "norm_kwargs");
    if (!nk || json_is_null(nk)) return 0;
    if (!json_is_object(nk) || json_object_size(nk) != (json_object_get(nk, "eps") ? 1u : 0u))
        return core_error("%s: %s.\"norm_kwargs\": only {\"eps\": ...} is supported", file, where);
    return get_eps(nk, "eps", eps, file, where);
}

int clip_config_load_open_clip(const char *path, clip_config *c) {
    json_t *root = core_json_load_object(path);
    if (!root) return -1;
    int rc = 0;
    memset(c, 0, sizeof *c);
    c->format = CLIP_FORMAT_OPEN_CLIP;
    json_t *mc = json_object_get(root, "model_cfg");
    if (!mc) mc = root;
    json_t *vc = json_object_get(mc, "vision_cfg"), *tc = json_object_get(mc, "text_cfg");
    if (!json_is_object(vc) || !json_is_object(tc)) {
        rc = core_error("%s: \"vision_cfg\" and \"text_cfg\" must be objects (an open_clip model config)", path);
        goto out;
    }
    if (json_is_array(json_object_get(vc, "layers"))) {
        rc = core_error("%s: vision_cfg.\"layers\" is a list: ResNet image towers are not supported", path);
        goto out;
    }
    static const char *vrefuse[][2] = {
        {"timm_model_name", "a timm image tower"}, {"attentional_pool", "attentional pooling"},
        {"ls_init_value", "layer scale"}, {"block_type", "a custom attention block"}, {"qk_norm", "qk norm"},
        {"scaled_cosine_attn", "scaled cosine attention"}, {"scale_heads", "head scaling"},
        {"scale_attn_inner", "inner attention norm"}, {"scale_attn", "attention norm"}, {"scale_fc", "MLP norm"},
        {"act_kwargs", "activation arguments"}};
    static const char *trefuse[][2] = {
        {"hf_model_name", "a Hugging Face text tower"}, {"ls_init_value", "layer scale"},
        {"embed_cls", "an appended class token (CoCa)"}, {"no_causal_mask", "a bidirectional text tower"},
        {"block_type", "a custom attention block"}, {"qk_norm", "qk norm"},
        {"scaled_cosine_attn", "scaled cosine attention"}, {"scale_heads", "head scaling"},
        {"scale_attn_inner", "inner attention norm"}, {"scale_attn", "attention norm"}, {"scale_fc", "MLP norm"},
        {"act_kwargs", "activation arguments"}};
    for (size_t i = 0; i < sizeof vrefuse / sizeof *vrefuse && !rc; i++)
        rc = refuse_key(vc, vrefuse[i][0], path, "vision_cfg", vrefuse[i][1]);
    for (size_t i = 0; i < sizeof trefuse / sizeof *trefuse && !rc; i++)
        rc = refuse_key(tc, trefuse[i][0], path, "text_cfg", trefuse[i][1]);
    if (!rc) rc = refuse_key(mc, "init_logit_bias", path, "model_cfg", "a logit bias (SigLIP)");
    if (rc) goto out;
    const char *s;
    if ((s = json_string_value(json_object_get(vc, "pool_type"))) && strcmp(s, "tok")) {
        rc = core_error("%s: vision_cfg.\"pool_type\" is \"%s\"; only \"tok\" is supported", path, s);
        goto out;
    }
    if ((s = json_string_value(json_object_get(vc, "pos_embed_type"))) && strcmp(s, "learnable") &&
        strcmp(s, "sin_cos_2d")) {
        rc = core_error("%s: vision_cfg.\"pos_embed_type\" is \"%s\"; supported: learnable, sin_cos_2d", path, s);
        goto out;
    }
    if ((s = json_string_value(json_object_get(tc, "proj_type"))) && strcmp(s, "linear")) {
        rc = core_error("%s: text_cfg.\"proj_type\" is \"%s\"; only \"linear\" is supported", path, s);
        goto out;
    }
    c->pool = CLIP_POOL_ARGMAX, c->eos_token_id = 2;
    if ((s = json_string_value(json_object_get(tc, "pool_type")))) {
        if (!strcmp(s, "argmax")) c->pool = CLIP_POOL_ARGMAX;
        else if (!strcmp(s, "eos")) c->pool = CLIP_POOL_EOS;
        else if (!strcmp(s, "first")) c->pool = CLIP_POOL_FIRST;
        else if (!strcmp(s, "last")) c->pool = CLIP_POOL_LAST;
        else {
            rc = core_error("%s: text_cfg.\"pool_type\" is \"%s\"; supported: argmax, eos, first, last", path, s);
            goto out;
        }
    }
    rc = get_int(mc, "embed_dim", &c->projection_dim, path, "model_cfg");
    if (!rc && !json_object_get(mc, "embed_dim"))
        rc = core_error("%s: model_cfg.\"embed_dim\" is missing", path);
    /* CLIPVisionCfg / CLIPTextCfg defaults */
    int v_head_width = 64, v_layers = 12, v_width = 768, v_patch = 16, t_heads = 8, t_layers = 12, t_width = 512;
    double v_ratio = 4.0, t_ratio = 4.0;
    c->image_h = c->image_w = 224, c->channels = 3, c->ln_pre = 1;
    c->vocab_size = 49408, c->max_positions = 77;
    c->vision.eps = c->text.eps = 1e-5f;
    rc = rc || get_int(vc, "layers", &v_layers, path, "vision_cfg") ||
         get_int(vc, "width", &v_width, path, "vision_cfg") ||
         get_int(vc, "head_width", &v_head_width, path, "vision_cfg") ||
         get_int(vc, "patch_size", &v_patch, path, "vision_cfg") || oc_eps(vc, &c->vision.eps, path, "vision_cfg") ||
         get_int(tc, "context_length", &c->max_positions, path, "text_cfg") ||
         get_int(tc, "vocab_size", &c->vocab_size, path, "text_cfg") ||
         get_int(tc, "width", &t_width, path, "text_cfg") || get_int(tc, "heads", &t_heads, path, "text_cfg") ||
         get_int(tc, "layers", &t_layers, path, "text_cfg") || oc_eps(tc, &c->text.eps, path, "text_cfg");
    if (rc) goto out;
    json_t *eos = json_object_get(tc, "eos_id");
    if (eos && (!json_is_integer(eos) || json_integer_value(eos) < 0)) {
        rc = core_error("%s: text_cfg.\"eos_id\" is not a non-negative integer", path);
        goto out;
    }
    if (eos) c->eos_token_id = (int)json_integer_value(eos);
    json_t *isz = json_object_get(vc, "image_size");
    if (json_is_array(isz)) {
        if (json_array_size(isz) != 2 || !json_is_integer(json_array_get(isz, 0)) ||
            !json_is_integer(json_array_get(isz, 1))) {
            rc = core_error("%s: vision_cfg.\"image_size\" is not an integer or a pair of integers", path);
            goto out;
        }
        c->image_h = (int)json_integer_value(json_array_get(isz, 0));
        c->image_w = (int)json_integer_value(json_array_get(isz, 1));
    } else if (isz) {
        if ((rc = get_int(vc, "image_size", &c->image_h, path, "vision_cfg"))) goto out;
        c->image_w = c->image_h;
    }
    if (json_is_array(json_object_get(vc, "patch_size"))) {
        rc = core_error("%s: vision_cfg.\"patch_size\" is a pair: only square patches are supported", path);
        goto out;
    }
    json_t *r;
    if ((r = json_object_get(vc, "mlp_ratio"))) v_ratio = json_number_value(r);
    if ((r = json_object_get(tc, "mlp_ratio"))) t_ratio = json_number_value(r);
    json_t *nl = json_object_get(vc, "no_ln_pre");
    c->ln_pre = !(nl && json_is_true(nl));
    c->text_proj_bias = json_is_true(json_object_get(tc, "proj_bias"));
    c->patch = v_patch;
    /* open_clip: vision heads = width // head_width; mlp width = int(width * mlp_ratio) */
    c->vision = (clip_tower_config){v_width, v_layers, v_width / v_head_width, (int)(v_width * v_ratio),
                                    c->vision.eps, CLIP_ACT_GELU};
    c->text = (clip_tower_config){t_width, t_layers, t_heads, (int)(t_width * t_ratio), c->text.eps, CLIP_ACT_GELU};
    if (json_is_true(json_object_get(mc, "quick_gelu"))) c->vision.act = c->text.act = CLIP_ACT_QUICK_GELU;
    if (v_width % v_head_width) {
        rc = core_error("%s: vision_cfg.\"width\" %d is not a multiple of \"head_width\" %d", path, v_width,
                        v_head_width);
        goto out;
    }
    rc = clip_config_check(c, path);
out:
    json_decref(root);
    return rc ? -1 : 0;
}
