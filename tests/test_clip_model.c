/* tests/test_clip_model.c — model/clip (the CLIP towers, the logits, the aesthetic MLP) against transformers'
 * CLIPModel and open_clip's CLIP on random models (fixtures of scripts/fixtures_clip.py), and at the full ViT-B/32
 * and ViT-H/14 shapes when `fixtures_clip.py full` has written them (skipped otherwise). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/safetensors.h"
#include "model/clip/clip_aesthetic.h"
#include "model/clip/clip_model.h"
#include "tests/test.h"

#define FIX "tests/fixtures/"

/* max|a-b| / max|b| */
static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / den;
}

/* F32 tensor `name` of f, malloc'd; its shape in shape[0..*ndim). */
static float *read_f32(const st_file *f, const char *name, int64_t *shape, int *ndim) {
    int i = st_find(f, name);
    if (i < 0) return NULL;
    const st_info *in = st_info_at(f, i);
    int64_t n = 1;
    for (int d = 0; d < in->ndim; d++) n *= in->shape[d], shape[d] = in->shape[d];
    *ndim = in->ndim;
    float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    if (st_read_f32(f, name, x, n)) {
        free(x);
        return NULL;
    }
    return x;
}

/* I64 tensor as int32 (token ids, indices). */
static int32_t *read_ids(const st_file *f, const char *name, int64_t *shape) {
    core_tensor v;
    if (st_get(f, name, &v) || v.dtype != CORE_I64) return NULL;
    int64_t n = core_tensor_numel(&v);
    int32_t *out = malloc((size_t)n * sizeof *out);
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)((const int64_t *)v.data)[i];
    for (int d = 0; d < v.ndim; d++) shape[d] = v.shape[d];
    core_tensor_free(&v);
    return out;
}

typedef struct {
    double img, txt, logits;
} clip_errs;

/* Runs the model of folder `dir` on io_path's inputs; the three relative errors; checks the pooled positions when
 * the io file has them and that a row alone gives the bits it gets in the batch. */
static clip_errs run_fixture(const char *dir, const char *io_path, int check_batch) {
    clip_errs e = {INFINITY, INFINITY, INFINITY};
    clip_model *m = clip_load(dir);
    REQUIRE_OK(m ? 0 : -1);
    const clip_config *c = clip_get_config(m);
    st_file *f = st_open(io_path);
    REQUIRE_OK(f ? 0 : -1);
    int64_t ps[8], is[8], es[8], ts[8], ls[8], ks[8];
    int pn, en, tn, ln, kn;
    float *px = read_f32(f, "pixel_values", ps, &pn), *img_ref = read_f32(f, "image_embeds", es, &en);
    float *txt_ref = read_f32(f, "text_embeds", ts, &tn), *lg_ref = read_f32(f, "logits_per_image", ls, &ln);
    float *scale = read_f32(f, "logit_scale", ks, &kn);
    int32_t *ids = read_ids(f, "input_ids", is);
    REQUIRE(px && img_ref && txt_ref && lg_ref && scale && ids);
    const int B = (int)ps[0], Bt = (int)is[0], S = (int)is[1], E = c->projection_dim;
    REQUIRE(pn == 4 && ps[1] == c->channels && ps[2] == c->image_h && ps[3] == c->image_w);
    REQUIRE(es[0] == B && es[1] == E && ts[0] == Bt && ts[1] == E);
    CHECK_NEAR(clip_logit_scale(m), scale[0], 0);
    if (st_find(f, "pool_index") >= 0) {
        int64_t qs[8];
        int32_t *pi = read_ids(f, "pool_index", qs);
        REQUIRE(pi);
        for (int b = 0; b < Bt; b++)
            CHECK_MSG(clip_pool_index(c, ids + (size_t)b * S, S) == pi[b], "row %d pooled at %d, reference %d", b,
                      clip_pool_index(c, ids + (size_t)b * S, S), pi[b]);
        free(pi);
    }
    float *img = malloc((size_t)B * E * sizeof *img), *txt = malloc((size_t)Bt * E * sizeof *txt);
    float *lg = malloc((size_t)B * Bt * sizeof *lg);
    REQUIRE_OK(clip_encode_image(m, px, B, img));
    REQUIRE_OK(clip_encode_text(m, ids, Bt, S, txt));
    clip_logits(lg, img, B, txt, Bt, E, clip_logit_scale(m));
    e.img = rel_err(img, img_ref, (size_t)B * E);
    e.txt = rel_err(txt, txt_ref, (size_t)Bt * E);
    e.logits = rel_err(lg, lg_ref, (size_t)B * Bt);
    if (check_batch) { /* the last row alone: the same bits as in the batch */
        float one_img[4096], one_txt[4096];
        REQUIRE(E <= 4096);
        const size_t img_floats = (size_t)c->channels * c->image_h * c->image_w;
        REQUIRE_OK(clip_encode_image(m, px + (size_t)(B - 1) * img_floats, 1, one_img));
        REQUIRE_OK(clip_encode_text(m, ids + (size_t)(Bt - 1) * S, 1, S, one_txt));
        CHECK(memcmp(one_img, img + (size_t)(B - 1) * E, (size_t)E * sizeof(float)) == 0);
        CHECK(memcmp(one_txt, txt + (size_t)(Bt - 1) * E, (size_t)E * sizeof(float)) == 0);
    }
    free(img), free(txt), free(lg), free(px), free(img_ref), free(txt_ref), free(lg_ref), free(scale), free(ids);
    st_close(f);
    clip_free(m);
    return e;
}

static void check_fixture(const char *name, clip_format want) {
    char dir[256], io[256];
    snprintf(dir, sizeof dir, FIX "clip_%s", name);
    snprintf(io, sizeof io, FIX "clip_%s_io.safetensors", name);
    clip_model *m = clip_load(dir);
    REQUIRE_OK(m ? 0 : -1);
    CHECK(clip_get_config(m)->format == want);
    clip_free(m);
    clip_errs e = run_fixture(dir, io, 1);
    fprintf(stderr, "  clip %s: max|a-b|/max|b| image %.3g, text %.3g, logits %.3g\n", name, e.img, e.txt, e.logits);
    CHECK(e.img <= 1e-5);
    CHECK(e.txt <= 1e-5);
    CHECK(e.logits <= 1e-5);
}

TEST(clip_model_tf_quick_gelu_argmax_pool) { check_fixture("tf_qg", CLIP_FORMAT_TRANSFORMERS); }
TEST(clip_model_tf_gelu_eos_pool_cut_grid) { check_fixture("tf_gelu", CLIP_FORMAT_TRANSFORMERS); }
TEST(clip_model_tf_gelu_tanh_one_head) { check_fixture("tf_tanh", CLIP_FORMAT_TRANSFORMERS); }
TEST(clip_model_open_clip_gelu_nonsquare) { check_fixture("oc_gelu", CLIP_FORMAT_OPEN_CLIP); }
TEST(clip_model_open_clip_quick_gelu_eos_bias) { check_fixture("oc_qg", CLIP_FORMAT_OPEN_CLIP); }

/* The configs the fixtures were written with, read back (a default taken wrongly would still load if the shapes
 * agreed: eps, act, pooling are not in any shape). */
TEST(clip_model_configs_read_as_written) {
    clip_config c;
    REQUIRE_OK(clip_config_load_transformers(FIX "clip_tf_gelu/config.json", &c));
    CHECK(c.vision.act == CLIP_ACT_GELU && c.text.act == CLIP_ACT_GELU && c.pool == CLIP_POOL_EOS);
    CHECK(c.eos_token_id == 97 && c.vision.eps == 1e-6f && c.text.heads == 5 && c.image_h == 28 && c.patch == 8);
    REQUIRE_OK(clip_config_load_transformers(FIX "clip_tf_qg/config.json", &c));
    CHECK(c.vision.act == CLIP_ACT_QUICK_GELU && c.pool == CLIP_POOL_ARGMAX && c.vision.eps == 1e-5f);
    REQUIRE_OK(clip_config_load_transformers(FIX "clip_tf_tanh/config.json", &c));
    CHECK(c.vision.act == CLIP_ACT_GELU_TANH && c.text.act == CLIP_ACT_GELU_TANH);
    REQUIRE_OK(clip_config_load_open_clip(FIX "clip_oc_gelu/open_clip_config.json", &c));
    CHECK(c.image_h == 24 && c.image_w == 40 && c.vision.heads == 3 && c.vision.mlp == 90 && c.text.mlp == 60);
    CHECK(c.vision.act == CLIP_ACT_GELU && c.ln_pre == 1 && c.pool == CLIP_POOL_ARGMAX && !c.text_proj_bias);
    REQUIRE_OK(clip_config_load_open_clip(FIX "clip_oc_qg/open_clip_config.json", &c));
    CHECK(c.vision.act == CLIP_ACT_QUICK_GELU && c.ln_pre == 0 && c.pool == CLIP_POOL_EOS && c.text_proj_bias);
    CHECK(c.eos_token_id == 97 && c.text.eps == 1e-6f && c.vision.eps == 1e-6f);
}

/* Pooling rules by hand (transformers CLIPTextModel.forward, open_clip text_global_pool). */
TEST(clip_model_pool_rules) {
    clip_config c = {0};
    const int32_t a[6] = {5, 9, 3, 9, 9, 1}, b[6] = {4, 4, 4, 4, 4, 4};
    c.pool = CLIP_POOL_ARGMAX;
    CHECK(clip_pool_index(&c, a, 6) == 1 && clip_pool_index(&c, b, 6) == 0);
    c.pool = CLIP_POOL_EOS, c.eos_token_id = 9;
    CHECK(clip_pool_index(&c, a, 6) == 1 && clip_pool_index(&c, b, 6) == 0);
    c.eos_token_id = 1;
    CHECK(clip_pool_index(&c, a, 6) == 5);
    c.pool = CLIP_POOL_FIRST;
    CHECK(clip_pool_index(&c, a, 6) == 0);
    c.pool = CLIP_POOL_LAST;
    CHECK(clip_pool_index(&c, a, 6) == 5);
}

/* The logits: cosines times exp(scale); by hand on orthogonal and parallel vectors. */
TEST(clip_model_logits_by_hand) {
    const float img[4] = {3, 4, 0, 0}, txt[6] = {6, 8, 0, 0, -1, 0};
    float lg[3] = {0};
    clip_logits(lg, img, 1, txt, 3, 2, logf(100.0f));
    CHECK_NEAR(lg[0], 100.0, 1e-4);
    CHECK_NEAR(lg[1], 0.0, 0); /* a zero text embedding stays 0 */
    CHECK_NEAR(lg[2], -60.0, 1e-4);
}

/* The aesthetic MLP on the L2-normalised embedding (improved-aesthetic-predictor simple_inference.py). */
TEST(clip_model_aesthetic_mlp) {
    clip_aesthetic *a = clip_aesthetic_load(FIX "clip_aesthetic_small.safetensors");
    REQUIRE_OK(a ? 0 : -1);
    CHECK(clip_aesthetic_dim(a) == 48);
    st_file *f = st_open(FIX "clip_aesthetic_small_io.safetensors");
    REQUIRE_OK(f ? 0 : -1);
    int64_t es[8], ss[8];
    int en, sn;
    float *emb = read_f32(f, "embeds", es, &en), *ref = read_f32(f, "scores", ss, &sn);
    REQUIRE(emb && ref && es[0] == 3 && es[1] == 48);
    float sc[3];
    REQUIRE_OK(clip_aesthetic_score(a, emb, 3, sc));
    double err = rel_err(sc, ref, 3);
    fprintf(stderr, "  aesthetic MLP: max|a-b|/max|b| = %.3g\n", err);
    CHECK(err <= 1e-5);
    /* scale invariance: the embedding is normalised first */
    for (int i = 0; i < 48; i++) emb[i] *= 7.0f;
    float sc7[3];
    REQUIRE_OK(clip_aesthetic_score(a, emb, 3, sc7));
    CHECK_NEAR(sc7[0], sc[0], 1e-5 * fabs(sc[0]) + 1e-6);
    free(emb), free(ref);
    st_close(f);
    clip_aesthetic_free(a);
}

/* ------------------------------------------------------------------------------------------------------------
 * Full shapes (written by `scripts/fixtures_clip.py full`, never committed): skipped when absent. */

static const char *full_dir(void) {
    const char *d = getenv("VGRPO_CLIP_FULL");
    return d && *d ? d : "/tmp/vgrpo-clip-full";
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* images/s of clip_encode_image at batch 8 (best of `reps`), when VGRPO_CLIP_BENCH=1. */
static void bench(const char *dir, const char *label, int reps) {
    const char *b = getenv("VGRPO_CLIP_BENCH");
    if (!b || b[0] != '1') return;
    clip_model *m = clip_load(dir);
    REQUIRE_OK(m ? 0 : -1);
    const clip_config *c = clip_get_config(m);
    const size_t n = (size_t)8 * c->channels * c->image_h * c->image_w;
    float *px = malloc(n * sizeof *px), *emb = malloc((size_t)8 * c->projection_dim * sizeof *emb);
    test_fill_uniform(px, n, 5, -2, 2);
    REQUIRE_OK(clip_encode_image(m, px, 8, emb)); /* warm-up */
    double best = INFINITY;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        REQUIRE_OK(clip_encode_image(m, px, 8, emb));
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    fprintf(stderr, "  %s: clip_encode_image batch 8: %.3f s, %.2f images/s (params %.0f MB, activations %.0f MB)\n",
            label, best, 8 / best, clip_param_bytes(c) / 1e6, clip_act_bytes(c, 8, 8, 77) / 1e6);
    free(px), free(emb);
    clip_free(m);
}

TEST(clip_model_full_shapes) {
    char dir[512], io[512], ae[512], aeio[512];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s/b32", full_dir());
    if (stat(dir, &sb) != 0) {
        test_skip("no full-shape models (scripts/fixtures_clip.py full writes /tmp/vgrpo-clip-full)");
        return;
    }
    const char *which[2] = {"b32", "h14"};
    for (int i = 0; i < 2; i++) {
        snprintf(dir, sizeof dir, "%s/%s", full_dir(), which[i]);
        snprintf(io, sizeof io, "%s/%s_io.safetensors", full_dir(), which[i]);
        clip_errs e = run_fixture(dir, io, 0);
        fprintf(stderr, "  clip %s full shapes: max|a-b|/max|b| image %.3g, text %.3g, logits %.3g\n", which[i],
                e.img, e.txt, e.logits);
        CHECK(e.img <= 1e-5 && e.txt <= 1e-5 && e.logits <= 1e-5);
        bench(dir, which[i], i == 0 ? 5 : 2);
    }
    snprintf(ae, sizeof ae, "%s/aesthetic.safetensors", full_dir());
    snprintf(aeio, sizeof aeio, "%s/aesthetic_io.safetensors", full_dir());
    clip_aesthetic *a = clip_aesthetic_load(ae);
    REQUIRE_OK(a ? 0 : -1);
    CHECK(clip_aesthetic_dim(a) == 768);
    st_file *f = st_open(aeio);
    REQUIRE_OK(f ? 0 : -1);
    int64_t es[8], ss[8];
    int en, sn;
    float *emb = read_f32(f, "embeds", es, &en), *ref = read_f32(f, "scores", ss, &sn), sc[3];
    REQUIRE(emb && ref);
    REQUIRE_OK(clip_aesthetic_score(a, emb, 3, sc));
    fprintf(stderr, "  aesthetic 768: max|a-b|/max|b| = %.3g\n", rel_err(sc, ref, 3));
    CHECK(rel_err(sc, ref, 3) <= 1e-5);
    free(emb), free(ref);
    st_close(f);
    clip_aesthetic_free(a);
}
