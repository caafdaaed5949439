/* tests/test_vae_encode.c — the Wan VAE encoder (model/vae/wan_vae_encode.*) against diffusers 0.42.1
 * AutoencoderKLWan.encode(video).latent_dist.mode() and WanImageToVideoPipeline's normalisation (fixtures from
 * scripts/fixtures_vae_enc.py: the encoders of the decoder fixtures vae_wan21 / vae_wan22 and two encoder-only
 * configs, enc21 (3 levels, temporal down-sampling at full resolution) and enc22 (Wan 2.2 residual, two res blocks);
 * 1, 5 and 9 or 13 frames, batch 2 at 5 frames, H != W; uint8 frames through VideoProcessor.preprocess_video),
 * memory independent of the frame count, refusals (no encoder weights, frame counts, sizes, channels, attn_scales,
 * missing / extra / mis-shaped tensors) and `vgrpo vae-encode`.
 * Tolerance: max|a - b| / max|b| <= 1e-5 per tensor (fp32; the order of the sums differs from PyTorch's). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/vae/tiny_vae.h"
#include "model/vae/wan_vae.h"
#include "model/vae/wan_vae_encode.h"
#include "tests/test.h"

#define ENC_TOL 1e-5

/* Reads tensor `name` of io (F32/BF16/F16) as F32 into a malloc'd buffer; shape into sh (5 dims). */
static float *read5(st_file *io, const char *name, int64_t *sh) {
    int i = st_find(io, name);
    if (i < 0) return NULL;
    const st_info *t = st_info_at(io, i);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) sh[d] = t->shape[d], n *= t->shape[d];
    float *b = malloc((size_t)n * sizeof(float));
    if (b && st_read_f32(io, name, b, n)) {
        free(b);
        return NULL;
    }
    return b;
}

/* max|a - b| / max|b| (NaN in a gives a failing value). */
static double rel_err(const float *a, const float *b, size_t n) {
    double e = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
    }
    return mx > 0 ? e / mx : e;
}

/* Encodes video_f<F> and returns the worse relative error of the mode and the normalised latents. */
static double run_case(vae_encoder *e, st_file *io, int F) {
    char vn[32], mn[32], ln[32];
    snprintf(vn, sizeof vn, "video_f%d", F);
    snprintf(mn, sizeof mn, "mode_f%d", F);
    snprintf(ln, sizeof ln, "latents_f%d", F);
    int64_t vs[5], ms[5], ls[5];
    float *vid = read5(io, vn, vs), *mode = read5(io, mn, ms), *lref = read5(io, ln, ls);
    REQUIRE(vid && mode && lref);
    const int fac = vae_encoder_spatial_factor(e);
    REQUIRE(vs[2] == F && vs[1] == vae_encoder_video_channels(e));
    CHECK(ms[1] == vae_encoder_get_config(e)->z_dim && ms[2] == vae_encoder_frames_out(e, F));
    CHECK(ms[2] == 1 + (F - 1) / 4);
    CHECK(ms[0] == vs[0] && ms[3] == vs[3] / fac && ms[4] == vs[4] / fac);
    const size_t nl = (size_t)ms[0] * ms[1] * ms[2] * ms[3] * ms[4];
    float *out = malloc(nl * sizeof(float));
    REQUIRE(out);
    REQUIRE_OK(vae_encode(e, vid, (int)vs[0], (int)vs[1], F, (int)vs[3], (int)vs[4], out, 0));
    double err = rel_err(out, mode, nl);
    REQUIRE_OK(vae_encode(e, vid, (int)vs[0], (int)vs[1], F, (int)vs[3], (int)vs[4], out, 1));
    const double e2 = rel_err(out, lref, nl);
    if (!(e2 <= err)) err = e2;
    free(vid), free(mode), free(lref), free(out);
    return err;
}

/* The uint8 case: frames [1, 5, H, W, 3] through vae_video_from_u8, then the mode. */
static double run_u8(vae_encoder *e, st_file *io) {
    core_tensor u8;
    REQUIRE_OK(st_get(io, "u8_video", &u8));
    REQUIRE(u8.dtype == CORE_U8 && u8.ndim == 5 && u8.shape[4] == 3);
    const int B = (int)u8.shape[0], F = (int)u8.shape[1], H = (int)u8.shape[2], W = (int)u8.shape[3];
    int64_t ms[5];
    float *mode = read5(io, "u8_mode", ms);
    REQUIRE(mode);
    const size_t nl = (size_t)ms[0] * ms[1] * ms[2] * ms[3] * ms[4];
    float *vid = malloc((size_t)B * 3 * F * H * W * sizeof(float)), *out = malloc(nl * sizeof(float));
    REQUIRE(vid && out);
    vae_video_from_u8(u8.data, B, F, H, W, vid);
    REQUIRE_OK(vae_encode(e, vid, B, 3, F, H, W, out, 0));
    const double err = rel_err(out, mode, nl);
    core_tensor_free(&u8);
    free(mode), free(vid), free(out);
    return err;
}

static void run_fixture(const char *name, int f_last) {
    char dir[256], iop[256];
    snprintf(dir, sizeof dir, "tests/fixtures/vae_%s", name);
    snprintf(iop, sizeof iop, "tests/fixtures/vae_%s_enc_io.safetensors", name);
    vae_encoder *e = vae_encoder_load(dir);
    REQUIRE_OK(e ? 0 : -1);
    st_file *io = st_open(iop);
    REQUIRE_OK(io ? 0 : -1);
    const int frames[3] = {1, 5, f_last};
    double worst = 0;
    for (int k = 0; k < 3; k++) {
        const double err = run_case(e, io, frames[k]);
        printf("  vae encode %s F=%d: max|a-b|/max|b| %.3g\n", name, frames[k], err);
        CHECK_MSG(err <= ENC_TOL, "vae encode %s F=%d: %.3g > %g", name, frames[k], err, ENC_TOL);
        if (!(err <= worst)) worst = err;
    }
    const double eu = run_u8(e, io);
    printf("  vae encode %s u8 F=5: max|a-b|/max|b| %.3g\n", name, eu);
    CHECK_MSG(eu <= ENC_TOL, "vae encode %s u8: %.3g > %g", name, eu, ENC_TOL);
    st_close(io);
    vae_encoder_free(e);
}

TEST(vae_enc_wan21_fixture) { run_fixture("wan21", 9); }
TEST(vae_enc_wan22_fixture) { run_fixture("wan22", 9); }
TEST(vae_enc_enc21_fixture) { run_fixture("enc21", 13); }
TEST(vae_enc_enc22_fixture) { run_fixture("enc22", 9); }

/* The encode state is the same for 1 and 9 frames, and the cache is the hand-counted one of the wan21 fixture's
 * encoder at 24 x 40 (dims [2, 2, 2, 4, 4], temperal_downsample [False, True, True]): 2 frames per causal conv:
 * conv_in 3 ch at 960 px; level 0: 2 + 2 at 960; level 1: 2 + 2 at 240; level 2: 2 + 4 at 60; level 3: 4 + 4 at 15;
 * mid 4 x 4 at 15; conv_out 4 at 15; plus 1 frame per downsample3d: 2 ch at 60 (level 1), 4 ch at 15 (level 2). */
TEST(vae_enc_memory_independent_of_F) {
    vae_encoder *e = vae_encoder_load("tests/fixtures/vae_wan21");
    REQUIRE_OK(e ? 0 : -1);
    CHECK(vae_encoder_state_bytes(e) == 0);
    const int H = 24, W = 40, z = 16;
    float *vid = malloc((size_t)3 * 9 * H * W * sizeof(float)), *lat = malloc((size_t)z * 3 * 15 * sizeof(float));
    REQUIRE(vid && lat);
    test_fill_uniform(vid, (size_t)3 * 9 * H * W, 7, -1, 1);
    REQUIRE_OK(vae_encode(e, vid, 1, 3, 1, H, W, lat, 0));
    const size_t b1 = vae_encoder_state_bytes(e), c1 = vae_encoder_cache_bytes(e);
    REQUIRE_OK(vae_encode(e, vid, 1, 3, 9, H, W, lat, 0));
    CHECK(b1 > 0 && vae_encoder_state_bytes(e) == b1 && vae_encoder_cache_bytes(e) == c1);
    const size_t want = 2 * (3 * 960 + (2 + 2) * 960 + (2 + 2) * 240 + (2 + 4) * 60 + (4 + 4) * 15 + 4 * 4 * 15 +
                             4 * 15) +
                        2 * 60 + 4 * 15;
    CHECK_MSG(c1 == want * sizeof(float), "cache bytes %zu, expected %zu", c1, want * sizeof(float));
    free(vid), free(lat);
    vae_encoder_free(e);
}

/* A copy of fixture folder src in dst: tensor `drop` left out, `reshape` written as a 1-D tensor one element short,
 * `extra` added (any may be NULL); config key `cfg_key` set to the JSON `cfg_val` when given. */
static void write_variant(const char *src, const char *dst, const char *drop, const char *reshape, const char *extra,
                          const char *cfg_key, const char *cfg_val) {
    char p[512], out[4096];
    REQUIRE(test_run(out, sizeof out, "mkdir -p %s && cp %s/config.json %s/", dst, src, dst) == 0);
    if (cfg_key) {
        snprintf(p, sizeof p, "%s/config.json", dst);
        json_t *cfg = json_load_file(p, 0, NULL), *v = json_loads(cfg_val, JSON_DECODE_ANY, NULL);
        REQUIRE(cfg && v);
        json_object_set_new(cfg, cfg_key, v);
        REQUIRE(json_dump_file(cfg, p, JSON_INDENT(2)) == 0);
        json_decref(cfg);
    }
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", src);
    st_file *f = st_open(p);
    REQUIRE_OK(f ? 0 : -1);
    st_writer *w = st_writer_new();
    REQUIRE(w);
    static float extra_data[4];
    core_tensor views[512];
    int nv = 0;
    for (int i = 0; i < st_count(f); i++) {
        const st_info *t = st_info_at(f, i);
        if (drop && !strcmp(t->name, drop)) continue;
        REQUIRE(nv < 512);
        core_tensor *v = &views[nv++];
        REQUIRE_OK(st_get(f, t->name, v));
        if (reshape && !strcmp(t->name, reshape)) {
            int64_t n = core_tensor_numel(v) - 1;
            REQUIRE_OK(st_writer_add(w, t->name, v->dtype, 1, &n, v->data));
        } else {
            REQUIRE_OK(st_writer_add(w, t->name, v->dtype, t->ndim, t->shape, v->data));
        }
    }
    if (extra) {
        int64_t n = 4;
        REQUIRE_OK(st_writer_add(w, extra, CORE_F32, 1, &n, extra_data));
    }
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dst);
    REQUIRE_OK(st_writer_write(w, p));
    st_writer_free(w);
    for (int i = 0; i < nv; i++) core_tensor_free(&views[i]);
    st_close(f);
}

static void expect_enc_error(const char *dir, const char *needle) {
    vae_encoder *e = vae_encoder_load(dir);
    CHECK_MSG(!e, "loading the encoder of %s should fail", dir);
    vae_encoder_free(e);
    CHECK_MSG(strstr(core_last_error(), needle) != NULL, "error \"%s\" does not name \"%s\"", core_last_error(),
              needle);
}

TEST(vae_enc_load_errors) {
    const char *tmp = test_tmpdir();
    char d[512];
    /* the tiny preset's VAE has no encoder: the error says so and names the first missing tensor */
    snprintf(d, sizeof d, "%s/tiny", tmp);
    REQUIRE_OK(vae_tiny_write(d, 16, 3));
    expect_enc_error(d, "no encoder weights");
    expect_enc_error(d, "\"encoder.conv_in.weight\"");
    /* the decoder still loads from it, and the encoder-only fixture has no decoder */
    vae_model *m = vae_load(d);
    CHECK_MSG(m != NULL, "%s", core_last_error());
    vae_free(m);
    /* one encoder tensor missing, mis-shaped, or one too many: named */
    const char *src = "tests/fixtures/vae_wan22";
    snprintf(d, sizeof d, "%s/missing", tmp);
    write_variant(src, d, "encoder.down_blocks.1.downsampler.time_conv.bias", NULL, NULL, NULL, NULL);
    expect_enc_error(d, "missing tensor \"encoder.down_blocks.1.downsampler.time_conv.bias\"");
    snprintf(d, sizeof d, "%s/shape", tmp);
    write_variant(src, d, NULL, "quant_conv.weight", NULL, NULL, NULL);
    expect_enc_error(d, "\"quant_conv.weight\" has shape");
    snprintf(d, sizeof d, "%s/extra", tmp);
    write_variant(src, d, NULL, NULL, "encoder.down_blocks.7.resnets.0.conv1.bias", NULL, NULL);
    expect_enc_error(d, "unexpected tensor \"encoder.down_blocks.7.resnets.0.conv1.bias\" (not in the encoder");
    /* the decoder's tensors are not needed: dropping one still loads the encoder */
    snprintf(d, sizeof d, "%s/nodec", tmp);
    write_variant(src, d, "decoder.conv_in.weight", NULL, NULL, NULL, NULL);
    vae_encoder *e = vae_encoder_load(d);
    CHECK_MSG(e != NULL, "decoder tensors must not be required: %s", core_last_error());
    vae_encoder_free(e);
    /* config: attention in the encoder, more temporal down-samplers than 4-frame chunks allow */
    snprintf(d, sizeof d, "%s/attn", tmp);
    write_variant("tests/fixtures/vae_wan21", d, NULL, NULL, NULL, "attn_scales", "[1.0]");
    expect_enc_error(d, "attn_scales");
    snprintf(d, sizeof d, "%s/tdown", tmp);
    write_variant("tests/fixtures/vae_enc21", d, NULL, NULL, NULL, "dim_mult", "[1, 2, 2, 2]");
    {
        char cp[600];
        snprintf(cp, sizeof cp, "%s/config.json", d);
        json_t *cfg = json_load_file(cp, 0, NULL);
        REQUIRE(cfg);
        json_object_set_new(cfg, "temperal_downsample", json_loads("[true, true, true]", 0, NULL));
        json_object_set_new(cfg, "scale_factor_spatial", json_integer(8));
        json_object_set_new(cfg, "scale_factor_temporal", json_integer(8));
        REQUIRE(json_dump_file(cfg, cp, JSON_INDENT(2)) == 0);
        json_decref(cfg);
    }
    expect_enc_error(d, "temperal_downsample");
}

TEST(vae_enc_input_errors) {
    vae_encoder *e = vae_encoder_load("tests/fixtures/vae_wan22");
    REQUIRE_OK(e ? 0 : -1);
    CHECK(vae_encoder_spatial_factor(e) == 16 && vae_encoder_video_channels(e) == 3);
    CHECK(vae_encoder_frames_out(e, 81) == 21 && vae_encoder_frames_out(e, 1) == 1);
    CHECK(vae_encoder_frames_out(e, 4) == 0);
    const int H = 32, W = 48;
    float *vid = calloc((size_t)4 * 6 * H * W, sizeof(float)), *lat = calloc((size_t)48 * 2 * 6, sizeof(float));
    REQUIRE(vid && lat);
    CHECK(vae_encode(e, vid, 1, 3, 4, H, W, lat, 0) == -1 && strstr(core_last_error(), "1 + 4k"));
    CHECK(vae_encode(e, vid, 1, 3, 1, 24, W, lat, 0) == -1 && strstr(core_last_error(), "multiples of 16"));
    CHECK(vae_encode(e, vid, 1, 4, 1, H, W, lat, 0) == -1 && strstr(core_last_error(), "4 channels"));
    CHECK(vae_encode(e, vid, 0, 3, 1, H, W, lat, 0) == -1);
    free(vid), free(lat);
    vae_encoder_free(e);
}

/* `vgrpo vae-encode`: the wan22 fixture's 5-frame batch of 2 (F16 input) with and without --normalize, the uint8
 * frames, and a refused frame count. */
TEST(vae_enc_cli) {
    const char *tmp = test_tmpdir();
    char in[512], inu[512], outp[512], out[4096];
    snprintf(in, sizeof in, "%s/in.safetensors", tmp);
    snprintf(inu, sizeof inu, "%s/in_u8.safetensors", tmp);
    snprintf(outp, sizeof outp, "%s/out.safetensors", tmp);
    st_file *io = st_open("tests/fixtures/vae_wan22_enc_io.safetensors");
    REQUIRE_OK(io ? 0 : -1);
    core_tensor v, u;
    REQUIRE_OK(st_get(io, "video_f5", &v));
    REQUIRE_OK(st_get(io, "u8_video", &u));
    st_writer *w = st_writer_new();
    REQUIRE_OK(st_writer_add(w, "video", v.dtype, 5, v.shape, v.data));
    REQUIRE_OK(st_writer_write(w, in));
    st_writer_free(w);
    w = st_writer_new();
    REQUIRE_OK(st_writer_add(w, "video", u.dtype, 5, u.shape, u.data));
    REQUIRE_OK(st_writer_write(w, inu));
    st_writer_free(w);
    const char *refs[3] = {"mode_f5", "latents_f5", "u8_mode"};
    const char *flags[3] = {"", " --normalize", ""};
    for (int k = 0; k < 3; k++) {
        REQUIRE(test_run(out, sizeof out, "%s vae-encode --vae tests/fixtures/vae_wan22 --video %s --out %s%s",
                         test_vgrpo_bin(), k == 2 ? inu : in, outp, flags[k]) == 0);
        st_file *o = st_open(outp);
        REQUIRE_OK(o ? 0 : -1);
        int64_t os[5], rs[5];
        float *lat = read5(o, "latents", os), *ref = read5(io, refs[k], rs);
        REQUIRE(lat && ref);
        for (int d = 0; d < 5; d++) CHECK(os[d] == rs[d]);
        const double err = rel_err(lat, ref, (size_t)rs[0] * rs[1] * rs[2] * rs[3] * rs[4]);
        CHECK_MSG(err <= ENC_TOL, "vae-encode %s: %.3g", refs[k], err);
        const char *meta = st_metadata(o, "normalized");
        CHECK(meta && !strcmp(meta, k == 1 ? "true" : "false"));
        free(lat), free(ref);
        st_close(o);
    }
    /* 4 frames: refused, naming the rule */
    int64_t s4[5] = {1, 3, 4, 32, 48};
    static float zeros[3 * 4 * 32 * 48];
    w = st_writer_new();
    REQUIRE_OK(st_writer_add(w, "video", CORE_F32, 5, s4, zeros));
    REQUIRE_OK(st_writer_write(w, in));
    st_writer_free(w);
    CHECK(test_run(out, sizeof out, "%s vae-encode --vae tests/fixtures/vae_wan22 --video %s --out %s",
                   test_vgrpo_bin(), in, outp) == 1 &&
          strstr(out, "1 + 4k"));
    /* a NaN in the video: refused naming the element, no output written */
    int64_t s5[5] = {1, 3, 5, 32, 48};
    static float five[3 * 5 * 32 * 48];
    five[1234] = NAN;
    w = st_writer_new();
    REQUIRE_OK(st_writer_add(w, "video", CORE_F32, 5, s5, five));
    REQUIRE_OK(st_writer_write(w, in));
    st_writer_free(w);
    remove(outp);
    CHECK_MSG(test_run(out, sizeof out, "%s vae-encode --vae tests/fixtures/vae_wan22 --video %s --out %s",
                       test_vgrpo_bin(), in, outp) == 1 &&
                  strstr(out, "tensor \"video\" holds a non-finite value (nan at element 1234 of"), "got: %s", out);
    CHECK(access(outp, F_OK) != 0);
    /* 0..255 floats: encoded, with a warning naming the range; --out a folder: refused before the work */
    five[1234] = 255.0f;
    w = st_writer_new();
    REQUIRE_OK(st_writer_add(w, "video", CORE_F32, 5, s5, five));
    REQUIRE_OK(st_writer_write(w, in));
    st_writer_free(w);
    CHECK_MSG(test_run(out, sizeof out, "%s vae-encode --vae tests/fixtures/vae_wan22 --video %s --out %s",
                       test_vgrpo_bin(), in, outp) == 0 && strstr(out, "values span [0, 255]"), "got: %s", out);
    CHECK_MSG(test_run(out, sizeof out, "%s vae-encode --vae tests/fixtures/vae_wan22 --video %s --out %s",
                       test_vgrpo_bin(), in, tmp) == 1 && strstr(out, "is a folder"), "got: %s", out);
    core_tensor_free(&v), core_tensor_free(&u);
    st_close(io);
}
