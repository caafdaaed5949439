/* tests/test_clip_load.c — model/clip's loaders on bad and unusual input: a config that disagrees with the weights
 * (the error names the tensor, both shapes and the config keys), a missing tensor, unsupported configs of both
 * formats, bad token ids; and the layouts that must load: sharded transformers checkpoints, open_clip names with
 * "module." or CustomTextCLIP's "text.", a hub folder holding both formats. Also the memory estimate at ViT-B/32's shapes. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "model/clip/clip_model.h"
#include "tests/test.h"

#define FIX "tests/fixtures/"

/* A copy of fixture folder clip_<name> in this test's temporary folder; returns its path (static). */
static const char *copy_fixture(const char *name, const char *as) {
    static char dst[1024];
    snprintf(dst, sizeof dst, "%s/%s", test_tmpdir(), as);
    char out[512];
    REQUIRE(test_run(out, sizeof out, "rm -rf '%s' && cp -r " FIX "clip_%s '%s'", dst, name, dst) == 0);
    return dst;
}

/* Sets dir/file's key path ("vision_config.intermediate_size", one dot at most) to the JSON value `json`. */
static void edit_json(const char *dir, const char *file, const char *key, const char *json) {
    char path[1024], k[128];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err), *obj = root;
    REQUIRE(root);
    snprintf(k, sizeof k, "%s", key);
    char *dot = strchr(k, '.');
    if (dot) {
        *dot = 0;
        obj = json_object_get(root, k);
        if (!obj) json_object_set_new(root, k, obj = json_object());
    }
    json_t *v = json_loads(json, JSON_DECODE_ANY, &err);
    REQUIRE(v && json_object_set_new(obj, dot ? dot + 1 : k, v) == 0);
    REQUIRE(json_dump_file(root, path, JSON_INDENT(1)) == 0);
    json_decref(root);
}

/* clip_load(dir) fails and its message holds every one of the NULL-terminated strings. */
static void expect_error(const char *dir, ...) {
    core_error_clear();
    clip_model *m = clip_load(dir);
    CHECK(m == NULL);
    clip_free(m);
    const char *msg = core_last_error();
    fprintf(stderr, "  %s\n", msg);
    va_list ap;
    va_start(ap, dir);
    for (const char *s; (s = va_arg(ap, const char *));)
        CHECK_MSG(strstr(msg, s), "error \"%s\" lacks \"%s\"", msg, s);
    va_end(ap);
}

/* Rewrites dir/file keeping every tensor except `drop` (may be NULL), names prefixed with `prefix` (all names, or
 * with skip != NULL those not starting with skip). */
static void rewrite_weights_some(const char *dir, const char *file, const char *drop, const char *prefix,
                                 const char *skip) {
    char path[1024], tmp[1024], name[256];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(tmp, sizeof tmp, "%s/%s.orig", dir, file);
    REQUIRE(rename(path, tmp) == 0);
    st_file *f = st_open(tmp);
    REQUIRE_OK(f ? 0 : -1);
    st_writer *w = st_writer_new();
    core_tensor *views = calloc((size_t)st_count(f), sizeof *views);
    for (int i = 0; i < st_count(f); i++) {
        if (drop && !strcmp(st_name(f, i), drop)) continue;
        REQUIRE_OK(st_get(f, st_name(f, i), &views[i]));
        const int keep = skip && (!strncmp(st_name(f, i), skip, strlen(skip)) || !strcmp(st_name(f, i), "logit_scale"));
        snprintf(name, sizeof name, "%s%s", keep ? "" : prefix, st_name(f, i));
        REQUIRE_OK(st_writer_add_tensor(w, name, &views[i]));
    }
    REQUIRE_OK(st_writer_write(w, path));
    for (int i = 0; i < st_count(f); i++) core_tensor_free(&views[i]);
    free(views);
    st_writer_free(w);
    st_close(f);
    remove(tmp);
}

static void rewrite_weights(const char *dir, const char *file, const char *drop, const char *prefix) {
    rewrite_weights_some(dir, file, drop, prefix, NULL);
}

/* Image and text embeddings of a model on fixed inputs (the model's own sizes). */
static void embeds_of(const char *dir, float *img, float *txt) {
    clip_model *m = clip_load(dir);
    REQUIRE_OK(m ? 0 : -1);
    const clip_config *c = clip_get_config(m);
    size_t n = (size_t)c->channels * c->image_h * c->image_w;
    float *px = malloc(n * sizeof *px);
    test_fill_uniform(px, n, 3, -1, 1);
    int32_t ids[8] = {5, 7, 9, 98, 0, 0, 0, 0};
    REQUIRE_OK(clip_encode_image(m, px, 1, img));
    REQUIRE_OK(clip_encode_text(m, ids, 1, c->max_positions < 8 ? c->max_positions : 8, txt));
    free(px);
    clip_free(m);
}

TEST(clip_load_config_disagrees_with_weights) {
    const char *d = copy_fixture("tf_qg", "tf_ffn");
    edit_json(d, "config.json", "vision_config.intermediate_size", "38");
    expect_error(d, "vision_model.encoder.layers.0.mlp.fc1.weight", "[37, 30]", "[38, 30]",
                 "intermediate_size 38", NULL);
    d = copy_fixture("tf_qg", "tf_proj");
    edit_json(d, "config.json", "projection_dim", "21");
    expect_error(d, "visual_projection.weight", "[20, 30]", "[21, 30]", "projection_dim 21", NULL);
    d = copy_fixture("tf_qg", "tf_img");
    edit_json(d, "config.json", "vision_config.image_size", "36");
    expect_error(d, "vision_model.embeddings.position_embedding.weight", "[26, 30]", "[37, 30]", "image_size 36",
                 NULL);
    d = copy_fixture("oc_gelu", "oc_width");
    edit_json(d, "open_clip_config.json", "model_cfg", "{\"embed_dim\": 20, \"vision_cfg\": {\"image_size\": [24, 40],"
              " \"layers\": 2, \"width\": 36, \"head_width\": 12, \"patch_size\": 8, \"mlp_ratio\": 2.5}, \"text_cfg\":"
              " {\"context_length\": 10, \"vocab_size\": 99, \"width\": 32, \"heads\": 4, \"layers\": 2}}");
    expect_error(d, "token_embedding.weight", "[99, 30]", "[99, 32]", "text_cfg: width 32", NULL);
}

TEST(clip_load_missing_tensor) {
    const char *d = copy_fixture("tf_gelu", "tf_missing");
    rewrite_weights(d, "model.safetensors", "text_model.encoder.layers.1.self_attn.k_proj.bias", "");
    expect_error(d, "text_model.encoder.layers.1.self_attn.k_proj.bias", "missing", NULL);
    d = copy_fixture("oc_qg", "oc_missing");
    rewrite_weights(d, "open_clip_model.safetensors", "text_projection.bias", "");
    expect_error(d, "\"text_projection.bias\" is missing", NULL);
}

TEST(clip_load_unsupported_configs) {
    const char *d = copy_fixture("tf_qg", "tf_act");
    edit_json(d, "config.json", "text_config.hidden_act", "\"relu\"");
    expect_error(d, "text_config.\"hidden_act\" is relu", NULL);
    d = copy_fixture("tf_qg", "tf_type");
    edit_json(d, "config.json", "model_type", "\"siglip\"");
    expect_error(d, "\"model_type\" is \"siglip\"", NULL);
    d = copy_fixture("tf_qg", "tf_heads");
    edit_json(d, "config.json", "text_config.num_attention_heads", "7");
    expect_error(d, "width 36 is not divisible by the head count 7", NULL);
    static const char *oc[][3] = {
        {"vision_cfg", "\"attentional_pool\": true", "attentional pooling"},
        {"vision_cfg", "\"timm_model_name\": \"vit_base_patch16_224\"", "timm"},
        {"vision_cfg", "\"ls_init_value\": 1e-5", "layer scale"},
        {"vision_cfg", "\"pool_type\": \"avg\"", "\"pool_type\" is \"avg\""},
        {"text_cfg", "\"hf_model_name\": \"roberta-base\"", "Hugging Face text tower"},
        {"text_cfg", "\"embed_cls\": true", "CoCa"},
        {"text_cfg", "\"no_causal_mask\": true", "bidirectional"},
        {"text_cfg", "\"qk_norm\": true", "qk norm"},
    };
    for (size_t i = 0; i < sizeof oc / sizeof *oc; i++) {
        d = copy_fixture("oc_gelu", "oc_bad");
        char cfg[1024];
        snprintf(cfg, sizeof cfg,
                 "{\"embed_dim\": 20, \"vision_cfg\": {\"image_size\": [24, 40], \"layers\": 2, \"width\": 36, "
                 "\"head_width\": 12, \"patch_size\": 8, \"mlp_ratio\": 2.5%s%s}, \"text_cfg\": {\"context_length\": "
                 "10, \"vocab_size\": 99, \"width\": 30, \"heads\": 5, \"layers\": 2, \"mlp_ratio\": 2%s%s}}",
                 strcmp(oc[i][0], "vision_cfg") ? "" : ", ", strcmp(oc[i][0], "vision_cfg") ? "" : oc[i][1],
                 strcmp(oc[i][0], "text_cfg") ? "" : ", ", strcmp(oc[i][0], "text_cfg") ? "" : oc[i][1]);
        edit_json(d, "open_clip_config.json", "model_cfg", cfg);
        expect_error(d, oc[i][0], oc[i][2], NULL);
    }
    d = copy_fixture("oc_gelu", "oc_resnet");
    edit_json(d, "open_clip_config.json", "model_cfg", "{\"embed_dim\": 20, \"vision_cfg\": {\"layers\": [3, 4, 6, 3]},"
              " \"text_cfg\": {}}");
    expect_error(d, "ResNet", NULL);
    d = copy_fixture("oc_gelu", "oc_bias");
    char out[256];
    /* a logit_bias tensor (SigLIP) is refused even when the config does not say so */
    {
        char path[1024], tmp[1024];
        snprintf(path, sizeof path, "%s/open_clip_model.safetensors", d);
        snprintf(tmp, sizeof tmp, "%s/x.safetensors", d);
        REQUIRE(rename(path, tmp) == 0);
        st_file *f = st_open(tmp);
        REQUIRE_OK(f ? 0 : -1);
        st_writer *w = st_writer_new();
        core_tensor *v = calloc((size_t)st_count(f), sizeof *v);
        for (int i = 0; i < st_count(f); i++) {
            REQUIRE_OK(st_get(f, st_name(f, i), &v[i]));
            REQUIRE_OK(st_writer_add_tensor(w, st_name(f, i), &v[i]));
        }
        const float bias = -10.0f;
        REQUIRE_OK(st_writer_add(w, "logit_bias", CORE_F32, 0, NULL, &bias));
        REQUIRE_OK(st_writer_write(w, path));
        for (int i = 0; i < st_count(f); i++) core_tensor_free(&v[i]);
        free(v);
        st_writer_free(w);
        st_close(f);
        remove(tmp);
    }
    expect_error(d, "logit_bias", "SigLIP", NULL);
    d = copy_fixture("oc_gelu", "oc_none");
    REQUIRE(test_run(out, sizeof out, "rm '%s/open_clip_config.json'", d) == 0);
    expect_error(d, "neither config.json", NULL);
}

TEST(clip_load_bad_token_ids) {
    clip_model *m = clip_load(FIX "clip_tf_qg");
    REQUIRE_OK(m ? 0 : -1);
    float emb[2 * 20];
    int32_t ids[2 * 4] = {1, 2, 3, 4, 5, 6, 99, 8};
    CHECK(clip_encode_text(m, ids, 2, 4, emb) == -1);
    CHECK_MSG(strstr(core_last_error(), "token id 99 at row 1, position 2"), "%s", core_last_error());
    ids[6] = -1;
    CHECK(clip_encode_text(m, ids, 2, 4, emb) == -1);
    int32_t many[21] = {0};
    CHECK(clip_encode_text(m, many, 1, 21, emb) == -1);
    CHECK_MSG(strstr(core_last_error(), "1 to 20"), "%s", core_last_error());
    CHECK(clip_encode_image(m, NULL, 0, emb) == -1);
    clip_free(m);
}

/* Layouts that must load to the same model: transformers shards + index, open_clip with "module." or "text." names, a hub
 * folder with both formats' files (config.json wins: the transformers weights are read). */
TEST(clip_load_layouts) {
    float ref_img[24], ref_txt[24], img[24], txt[24];
    embeds_of(FIX "clip_tf_gelu", ref_img, ref_txt);
    const char *d = copy_fixture("tf_gelu", "tf_sharded");
    {
        char path[1024], out[256];
        snprintf(path, sizeof path, "%s/model.safetensors", d);
        st_file *f = st_open(path);
        REQUIRE_OK(f ? 0 : -1);
        st_writer *w = st_writer_new();
        core_tensor *v = calloc((size_t)st_count(f), sizeof *v);
        for (int i = 0; i < st_count(f); i++) {
            REQUIRE_OK(st_get(f, st_name(f, i), &v[i]));
            REQUIRE_OK(st_writer_add_tensor(w, st_name(f, i), &v[i]));
        }
        REQUIRE_OK(st_writer_write_sharded(w, d, "model", 20000));
        for (int i = 0; i < st_count(f); i++) core_tensor_free(&v[i]);
        free(v);
        st_writer_free(w);
        st_close(f);
        REQUIRE(test_run(out, sizeof out, "ls '%s' | grep -c 'model-0000.-of-' | grep -qv '^1$'", d) == 0);
    }
    embeds_of(d, img, txt);
    CHECK(memcmp(img, ref_img, sizeof img) == 0 && memcmp(txt, ref_txt, sizeof txt) == 0);

    float oref_img[20], oref_txt[20], oimg[20], otxt[20];
    embeds_of(FIX "clip_oc_gelu", oref_img, oref_txt);
    d = copy_fixture("oc_gelu", "oc_module");
    rewrite_weights(d, "open_clip_model.safetensors", NULL, "module.");
    embeds_of(d, oimg, otxt);
    CHECK(memcmp(oimg, oref_img, sizeof oimg) == 0 && memcmp(otxt, oref_txt, sizeof otxt) == 0);
    /* CustomTextCLIP: the text tower's names under "text." */
    d = copy_fixture("oc_gelu", "oc_custom_text");
    rewrite_weights_some(d, "open_clip_model.safetensors", NULL, "text.", "visual.");
    embeds_of(d, oimg, otxt);
    CHECK(memcmp(oimg, oref_img, sizeof oimg) == 0 && memcmp(otxt, oref_txt, sizeof otxt) == 0);

    /* both formats in one folder, as on the hub: clip_load reads the transformers files */
    char out[256];
    d = copy_fixture("tf_gelu", "both");
    REQUIRE(test_run(out, sizeof out, "cp " FIX "clip_oc_gelu/open_clip_* '%s'/", d) == 0);
    embeds_of(d, img, txt);
    CHECK(memcmp(img, ref_img, sizeof img) == 0 && memcmp(txt, ref_txt, sizeof txt) == 0);
    clip_model *m = clip_load_open_clip(d);
    REQUIRE_OK(m ? 0 : -1);
    CHECK(clip_get_config(m)->format == CLIP_FORMAT_OPEN_CLIP && clip_get_config(m)->image_w == 40);
    clip_free(m);
}

/* Parameter bytes at ViT-B/32's shapes = transformers' CLIPModel(CLIPConfig()) parameter count (151,277,313, with
 * logit_scale) x 4; activation bytes by hand from the layout. */
TEST(clip_load_memory_estimate_b32) {
    clip_config c;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/b32cfg", test_tmpdir());
    char out[256];
    REQUIRE(test_run(out, sizeof out, "mkdir -p '%s' && echo '{\"model_type\": \"clip\", \"text_config\": {}, "
                     "\"vision_config\": {}}' > '%s/config.json'", dir, dir) == 0);
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    REQUIRE_OK(clip_config_load_transformers(path, &c));
    CHECK(c.vision.width == 768 && c.patch == 32 && c.text.width == 512 && c.projection_dim == 512);
    CHECK(clip_param_bytes(&c) == (size_t)151277313 * 4);
    /* vision, 8 images: T = 8 * 50 tokens; 6 [T, 768] buffers, the MLP [T, 3072], mean/rstd, lse [8, 12, 50],
     * pooled 2 x [8, 768]; larger than the text side for 8 prompts of 77 tokens */
    const size_t T = 400, v = 6 * T * 768 + T * 3072 + 2 * T + 8 * 12 * 50 + 2 * 8 * 768;
    const size_t Tt = 8 * 77, t = 6 * Tt * 512 + Tt * 2048 + 2 * Tt + 2 * 8 * 512;
    CHECK(clip_act_bytes(&c, 8, 0, 77) == v * 4);
    CHECK(clip_act_bytes(&c, 0, 8, 77) == t * 4);
    CHECK(clip_act_bytes(&c, 8, 8, 77) == (v > t ? v : t) * 4);
}
