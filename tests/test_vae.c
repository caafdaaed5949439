/* tests/test_vae.c — the Wan VAE decoder (model/wan_vae.*) against diffusers 0.42.1 AutoencoderKLWan.decode
 * (fixtures from scripts/fixtures_vae.py: tiny random Wan 2.1 and Wan 2.2 configs, 1, 2 and 3 latent frames,
 * h != w), the uint8 path against WanPipeline's un-normalisation + VideoProcessor, memory independent of T, loading
 * errors and `vgrpo vae-decode`. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/vae/wan_vae.h"
#include "tests/test.h"

/* Reads F32 tensor `name` of io into a malloc'd buffer; shape into sh (5 dims). */
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

/* Decodes latents_t<T> of fixture `name` and returns max|a - b| against video_t<T>; also checks u8_t<T>. */
static double run_case(vae_model *m, st_file *io, int T, int *u8_off, double *u8_eq) {
    char ln[32], vn[32], un[32];
    snprintf(ln, sizeof ln, "latents_t%d", T);
    snprintf(vn, sizeof vn, "video_t%d", T);
    snprintf(un, sizeof un, "u8_t%d", T);
    int64_t ls[5], vs[5];
    float *lat = read5(io, ln, ls), *ref = read5(io, vn, vs);
    REQUIRE(lat && ref);
    REQUIRE(ls[1] == vae_get_config(m)->z_dim && ls[2] == T);
    CHECK(vs[2] == 1 + 4 * (T - 1) && vs[2] == vae_frames_out(m, T));
    CHECK(vs[1] == 3 && vs[3] == ls[3] * vae_spatial_factor(m) && vs[4] == ls[4] * vae_spatial_factor(m));
    const size_t nv = (size_t)vs[0] * vs[1] * vs[2] * vs[3] * vs[4];
    float *out = malloc(nv * sizeof(float));
    uint8_t *u8 = malloc(nv);
    REQUIRE(out && u8);
    REQUIRE_OK(vae_decode(m, lat, (int)ls[0], (int)ls[1], T, (int)ls[3], (int)ls[4], out));
    double err = 0;
    for (size_t i = 0; i < nv; i++) {
        double d = fabs((double)out[i] - ref[i]);
        if (!(d <= err)) err = d; /* NaN propagates as a failure */
    }
    REQUIRE_OK(vae_latents_to_u8(m, lat, (int)ls[0], (int)ls[1], T, (int)ls[3], (int)ls[4], u8));
    core_tensor ut;
    REQUIRE_OK(st_get(io, un, &ut));
    REQUIRE((size_t)core_tensor_numel(&ut) == nv && ut.dtype == CORE_U8);
    const uint8_t *ur = ut.data;
    size_t eq = 0;
    int off = 0;
    for (size_t i = 0; i < nv; i++) {
        int d = abs((int)u8[i] - (int)ur[i]);
        eq += d == 0;
        if (d > off) off = d;
    }
    if (off > *u8_off) *u8_off = off;
    if ((double)eq / nv < *u8_eq) *u8_eq = (double)eq / nv;
    core_tensor_free(&ut);
    free(lat), free(ref), free(out), free(u8);
    return err;
}

static void run_fixture(const char *name) {
    char dir[256], iop[256];
    snprintf(dir, sizeof dir, "tests/fixtures/vae_%s", name);
    snprintf(iop, sizeof iop, "tests/fixtures/vae_%s_io.safetensors", name);
    vae_model *m = vae_load(dir);
    REQUIRE_OK(m ? 0 : -1);
    st_file *io = st_open(iop);
    REQUIRE_OK(io ? 0 : -1);
    double worst = 0, u8_eq = 1;
    int u8_off = 0;
    for (int T = 1; T <= 3; T++) {
        double e = run_case(m, io, T, &u8_off, &u8_eq);
        CHECK_MSG(e <= 1e-4, "vae %s T=%d: max|a-b| = %.3g > 1e-4", name, T, e);
        if (!(e <= worst)) worst = e;
    }
    printf("  vae %s: worst max|a-b| %.3g over T = 1, 2, 3; u8: max off %d, %.4f%% equal\n", name, worst, u8_off,
           100 * u8_eq);
    CHECK(u8_off <= 1 && u8_eq >= 0.999);
    st_close(io);
    vae_free(m);
}

TEST(vae_wan21_fixture) { run_fixture("wan21"); }
TEST(vae_wan22_fixture) { run_fixture("wan22"); }

/* The decode state (feature cache + scratch) is the same for 1 and 3 latent frames, and the cache is the
 * hand-counted 2 frames per cached convolution of the wan21 fixture (h = 3, w = 5, decoder dims [12, 12, 12, 6, 6],
 * Wan 2.1 halving after each up-sampler): conv_in 16 ch at 15 px; mid 4 x 12 ch at 15; up0 4 x 12 + time_conv 12 at
 * 15; up1 (6 + 12 + 12 + 12) + time_conv 12 at 60 px; up2 4 x 6 at 240; up3 (3 + 6 + 6 + 6) at 960; conv_out 6 at
 * 960. */
TEST(vae_memory_independent_of_T) {
    vae_model *m = vae_load("tests/fixtures/vae_wan21");
    REQUIRE_OK(m ? 0 : -1);
    CHECK(vae_state_bytes(m) == 0);
    const int z = 16, h = 3, w = 5;
    float *lat = calloc((size_t)z * 6 * h * w, sizeof(float));
    float *vid = malloc((size_t)3 * (1 + 4 * 5) * h * 8 * w * 8 * sizeof(float));
    REQUIRE(lat && vid);
    test_fill_uniform(lat, (size_t)z * 6 * h * w, 5, -2, 2);
    REQUIRE_OK(vae_decode(m, lat, 1, z, 1, h, w, vid));
    const size_t b1 = vae_state_bytes(m), c1 = vae_cache_bytes(m);
    REQUIRE_OK(vae_decode(m, lat, 1, z, 6, h, w, vid));
    CHECK(b1 > 0 && vae_state_bytes(m) == b1 && vae_cache_bytes(m) == c1);
    const size_t want = 2 * (16 * 15 + 4 * 12 * 15 + (4 * 12 + 12) * 15 + (6 + 12 + 12 + 12 + 12) * 60 + 4 * 6 * 240 +
                             (3 + 6 + 6 + 6) * 960 + 6 * 960);
    CHECK_MSG(c1 == want * sizeof(float), "cache bytes %zu, expected %zu", c1, want * sizeof(float));
    free(lat), free(vid);
    vae_free(m);
}

/* Writes a copy of fixture folder src into dst: tensor `drop` left out, `reshape` written with its first dim - 1
 * elements' worth as a 1-D tensor, `extra` added (any may be NULL). */
static void write_variant(const char *src, const char *dst, const char *drop, const char *reshape, const char *extra) {
    char p[512], out[4096];
    REQUIRE(test_run(out, sizeof out, "mkdir -p %s && cp %s/config.json %s/", dst, src, dst) == 0);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", src);
    st_file *f = st_open(p);
    REQUIRE_OK(f ? 0 : -1);
    st_writer *w = st_writer_new();
    REQUIRE(w);
    static float extra_data[4];
    for (int i = 0; i < st_count(f); i++) {
        const st_info *t = st_info_at(f, i);
        if (drop && !strcmp(t->name, drop)) continue;
        core_tensor v;
        REQUIRE_OK(st_get(f, t->name, &v));
        if (reshape && !strcmp(t->name, reshape)) {
            int64_t n = core_tensor_numel(&v) - 1;
            REQUIRE_OK(st_writer_add(w, t->name, v.dtype, 1, &n, v.data));
        } else {
            REQUIRE_OK(st_writer_add(w, t->name, v.dtype, t->ndim, t->shape, v.data));
        }
        /* views borrow the mapping (the fixture is aligned), so nothing to free before the write */
        REQUIRE(!v.owned);
    }
    if (extra) {
        int64_t n = 4;
        REQUIRE_OK(st_writer_add(w, extra, CORE_F32, 1, &n, extra_data));
    }
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dst);
    REQUIRE_OK(st_writer_write(w, p));
    st_writer_free(w);
    st_close(f);
}

static void expect_load_error(const char *dir, const char *needle) {
    vae_model *m = vae_load(dir);
    CHECK_MSG(!m, "loading %s should fail", dir);
    vae_free(m);
    CHECK_MSG(strstr(core_last_error(), needle) != NULL, "error \"%s\" does not name \"%s\"", core_last_error(),
              needle);
}

TEST(vae_load_errors) {
    const char *src = "tests/fixtures/vae_wan22", *tmp = test_tmpdir();
    char d[512];
    snprintf(d, sizeof d, "%s/missing", tmp);
    write_variant(src, d, "decoder.up_blocks.1.upsampler.time_conv.bias", NULL, NULL);
    expect_load_error(d, "decoder.up_blocks.1.upsampler.time_conv.bias");
    snprintf(d, sizeof d, "%s/shape", tmp);
    write_variant(src, d, NULL, "decoder.mid_block.attentions.0.norm.gamma", NULL);
    expect_load_error(d, "decoder.mid_block.attentions.0.norm.gamma");
    expect_load_error(d, "shape");
    snprintf(d, sizeof d, "%s/extra", tmp);
    write_variant(src, d, NULL, NULL, "decoder.up_blocks.9.resnets.0.conv1.bias");
    expect_load_error(d, "decoder.up_blocks.9.resnets.0.conv1.bias");
    /* the encoder is not needed: dropping one of its tensors still loads */
    snprintf(d, sizeof d, "%s/noenc", tmp);
    write_variant(src, d, "encoder.conv_in.weight", NULL, NULL);
    vae_model *m = vae_load(d);
    CHECK_MSG(m != NULL, "encoder tensors must not be required: %s", core_last_error());
    vae_free(m);
    /* a config that disagrees with the weights: z_dim 16 over Wan 2.2 weights (latents_mean/std cut to 16) */
    snprintf(d, sizeof d, "%s/zdim", tmp);
    write_variant(src, d, NULL, NULL, NULL);
    {
        char cp[600];
        snprintf(cp, sizeof cp, "%s/config.json", d);
        json_t *cfg = json_load_file(cp, 0, NULL);
        REQUIRE(cfg);
        json_object_set_new(cfg, "z_dim", json_integer(16));
        const char *keys[2] = {"latents_mean", "latents_std"};
        for (int k = 0; k < 2; k++) {
            json_t *a = json_object_get(cfg, keys[k]);
            REQUIRE(json_is_array(a));
            while (json_array_size(a) > 16) json_array_remove(a, json_array_size(a) - 1);
        }
        REQUIRE(json_dump_file(cfg, cp, JSON_INDENT(2)) == 0);
        json_decref(cfg);
    }
    expect_load_error(d, "post_quant_conv.weight");
    vae_config c;
    CHECK(vae_config_parse(&c, "{\"z_dim\": 4, \"latents_mean\": [0, 0, 0]}", "cfg") == -1 &&
          strstr(core_last_error(), "latents_mean"));
    CHECK(vae_config_parse(&c, "{\"dim_mult\": [1, 2], \"temperal_downsample\": [], \"z_dim\": 16}", "cfg") == -1 &&
          strstr(core_last_error(), "temperal_downsample"));
    CHECK(vae_config_parse(&c, "{\"patch_size\": 2, \"out_channels\": 3}", "cfg") == -1 &&
          strstr(core_last_error(), "out_channels"));
    CHECK(vae_config_parse(&c, "{\"scale_factor_spatial\": 16}", "cfg") == -1 &&
          strstr(core_last_error(), "scale_factor_spatial"));
    REQUIRE_OK(vae_config_parse(&c, "{\"_class_name\": \"AutoencoderKLWan\"}", "cfg"));
    CHECK(c.z_dim == 16 && c.decoder_base_dim == 96 && c.scale_factor_spatial == 8 && c.scale_factor_temporal == 4);
}

TEST(vae_zdim_mismatch) {
    vae_model *m = vae_load("tests/fixtures/vae_wan22");
    REQUIRE_OK(m ? 0 : -1);
    float lat[16 * 2 * 3] = {0}, vid[3 * 32 * 48];
    CHECK(vae_decode(m, lat, 1, 16, 1, 2, 3, vid) == -1 && strstr(core_last_error(), "z_dim"));
    CHECK(vae_decode(m, lat, 1, 48, 0, 2, 3, vid) == -1);
    vae_free(m);
}

/* `vgrpo vae-decode` on the Wan 2.1 fixture's T = 2 latents (B = 2) equals diffusers' video. */
TEST(vae_cli_decode) {
    const char *tmp = test_tmpdir();
    char in[512], outp[512], out[4096];
    snprintf(in, sizeof in, "%s/in.safetensors", tmp);
    snprintf(outp, sizeof outp, "%s/out.safetensors", tmp);
    st_file *io = st_open("tests/fixtures/vae_wan21_io.safetensors");
    REQUIRE_OK(io ? 0 : -1);
    int64_t ls[5], vs[5];
    float *lat = read5(io, "latents_t2", ls), *ref = read5(io, "video_t2", vs);
    REQUIRE(lat && ref);
    st_writer *w = st_writer_new();
    REQUIRE_OK(st_writer_add(w, "latents", CORE_F32, 5, ls, lat));
    REQUIRE_OK(st_writer_write(w, in));
    st_writer_free(w);
    REQUIRE(test_run(out, sizeof out, "%s vae-decode --vae tests/fixtures/vae_wan21 --latents %s --out %s",
                     test_vgrpo_bin(), in, outp) == 0);
    st_file *o = st_open(outp);
    REQUIRE_OK(o ? 0 : -1);
    int64_t os[5];
    float *vid = read5(o, "video", os);
    REQUIRE(vid);
    for (int d = 0; d < 5; d++) CHECK(os[d] == vs[d]);
    double err = 0;
    for (int64_t i = 0; i < vs[0] * vs[1] * vs[2] * vs[3] * vs[4]; i++)
        if (fabs((double)vid[i] - ref[i]) > err) err = fabs((double)vid[i] - ref[i]);
    CHECK_MSG(err <= 1e-4, "vae-decode: max|a-b| = %.3g", err);
    /* wrong z_dim: the error names it */
    CHECK(test_run(out, sizeof out, "%s vae-decode --vae tests/fixtures/vae_wan22 --latents %s --out %s",
                   test_vgrpo_bin(), in, outp) == 1 &&
          strstr(out, "z_dim"));
    /* an infinite latent: refused naming the element, no output written */
    lat[7] = INFINITY;
    w = st_writer_new();
    REQUIRE_OK(st_writer_add(w, "latents", CORE_F32, 5, ls, lat));
    REQUIRE_OK(st_writer_write(w, in));
    st_writer_free(w);
    remove(outp);
    CHECK_MSG(test_run(out, sizeof out, "%s vae-decode --vae tests/fixtures/vae_wan21 --latents %s --out %s",
                       test_vgrpo_bin(), in, outp) == 1 &&
                  strstr(out, "tensor \"latents\" holds a non-finite value (inf at element 7 of"), "got: %s", out);
    CHECK(access(outp, F_OK) != 0);
    free(lat), free(ref), free(vid);
    st_close(o);
    st_close(io);
}
