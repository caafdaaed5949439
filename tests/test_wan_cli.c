/* tests/test_wan_cli.c — end-to-end: `vgrpo init-model` (tiny with weights, a two-expert preset as configs) and
 * `vgrpo dit-forward` on a diffusers fixture (output and every gradient against diffusers) and on a pipeline
 * folder. */
#include <stdio.h>
#include <sys/stat.h>

#include "tests/test.h"
#include "tests/wan_test_util.h"

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

TEST(wan_cli_init_model) {
    const char *tmp = test_tmpdir();
    char out[8192], a[600], b[600], c[600], path[700];
    snprintf(a, sizeof a, "%s/tiny_a", tmp);
    snprintf(b, sizeof b, "%s/tiny_b", tmp);
    snprintf(c, sizeof c, "%s/a14b", tmp);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s --seed 3", test_vgrpo_bin(), a) == 0);
    CHECK(strstr(out, "589248 parameters"));
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s --seed 3", test_vgrpo_bin(), b) == 0);
    /* same seed: the same bytes; refusing to overwrite; another seed: other weights */
    CHECK(test_run(out, sizeof out, "cmp %s/transformer/diffusion_pytorch_model.safetensors "
                                    "%s/transformer/diffusion_pytorch_model.safetensors", a, b) == 0);
    CHECK(test_run(out, sizeof out, "%s init-model --preset tiny --out %s", test_vgrpo_bin(), b) == 1 &&
          strstr(out, "--force"));
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s --seed 4 --force", test_vgrpo_bin(), b) ==
            0);
    CHECK(test_run(out, sizeof out, "cmp -s %s/transformer/diffusion_pytorch_model.safetensors "
                                    "%s/transformer/diffusion_pytorch_model.safetensors", a, b) != 0);
    snprintf(path, sizeof path, "%s/model_index.json", a);
    const char *mi = slurp(path);
    REQUIRE(mi != NULL);
    CHECK(strstr(mi, "\"_class_name\": \"WanPipeline\"") && strstr(mi, "\"WanTransformer3DModel\"") &&
          strstr(mi, "\"boundary_ratio\": null"));
    snprintf(path, sizeof path, "%s/transformer", a);
    wan_model m;
    REQUIRE_OK(wan_model_load(&m, path));
    wan_config tiny;
    REQUIRE_OK(wan_config_preset(&tiny, "tiny"));
    CHECK(wan_config_equal(&m.cfg, &tiny) && m.cfg.num_attention_heads == 4);
    wan_model ref;
    REQUIRE_OK(wan_model_init(&ref, &tiny));
    wan_params_init_random(&ref, 3);
    CHECK(memcmp(ref.params, m.params, (size_t)m.layout.numel * sizeof(float)) == 0);
    wan_model_free(&m), wan_model_free(&ref);

    /* a two-expert real preset: configs only */
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset wan2.2-t2v-a14b --out %s", test_vgrpo_bin(), c) == 0);
    snprintf(path, sizeof path, "%s/model_index.json", c);
    mi = slurp(path);
    REQUIRE(mi != NULL);
    CHECK(strstr(mi, "\"boundary_ratio\": 0.875") && strstr(mi, "\"transformer_2\": [\n    \"diffusers\""));
    wan_config x, want;
    REQUIRE_OK(wan_config_preset(&want, "wan2.2-t2v-a14b"));
    for (int e = 0; e < 2; e++) {
        snprintf(path, sizeof path, "%s/%s/config.json", c, e ? "transformer_2" : "transformer");
        REQUIRE_OK(wan_config_load(&x, path));
        CHECK(wan_config_equal(&x, &want));
        snprintf(path, sizeof path, "%s/%s/diffusion_pytorch_model.safetensors", c,
                 e ? "transformer_2" : "transformer");
        CHECK(!file_exists(path));
    }
    CHECK(test_run(out, sizeof out, "%s init-model --preset wan3 --out %s/x", test_vgrpo_bin(), tmp) == 2 &&
          strstr(out, "wan3"));
}

/* dit-forward on the multihead fixture: output and all gradients against diffusers. */
TEST(wan_cli_dit_forward_fixture) {
    const char *tmp = test_tmpdir();
    char out[8192], path[700];
    snprintf(path, sizeof path, "%s/out.safetensors", tmp);
    REQUIRE(test_run(out, sizeof out,
                     "%s dit-forward --model tests/fixtures/wan_multihead --inputs "
                     "tests/fixtures/wan_multihead_io.safetensors --out %s --recompute",
                     test_vgrpo_bin(), path) == 0);
    st_file *got = st_open(path), *ref = st_open("tests/fixtures/wan_multihead_io.safetensors");
    REQUIRE(got && ref);
    int64_t n;
    float *o = wt_read(got, "output", NULL, NULL, &n), *r = wt_read(ref, "output", NULL, NULL, NULL);
    REQUIRE(o && r);
    CHECK(wt_max_rel(o, r, n) <= 1e-5);
    free(o), free(r);
    int grads = 0;
    for (int i = 0; i < st_count(got); i++) {
        const char *name = st_name(got, i);
        if (strncmp(name, "grad", 4)) continue;
        float *g = wt_read(got, name, NULL, NULL, &n), *gr = wt_read(ref, name, NULL, NULL, NULL);
        REQUIRE(g && gr);
        CHECK_MSG(wt_l2_rel(g, gr, n) <= 1e-4, "%s: %.3g", name, wt_l2_rel(g, gr, n));
        grads++;
        free(g), free(gr);
    }
    wan_model m;
    REQUIRE_OK(wan_model_load(&m, "tests/fixtures/wan_multihead"));
    CHECK(grads == m.layout.count + 2);
    wan_model_free(&m);
    st_close(got), st_close(ref);

    /* missing input: exit 1, the message names the tensor */
    CHECK(test_run(out, sizeof out, "%s dit-forward --model tests/fixtures/wan_multihead --inputs "
                                    "tests/fixtures/wan_difftest/diffusion_pytorch_model.safetensors --out %s",
                   test_vgrpo_bin(), path) == 1 &&
          strstr(out, "hidden_states"));
    CHECK(test_run(out, sizeof out, "%s dit-forward --model x", test_vgrpo_bin()) == 2);
}

/* dit-forward on a pipeline folder made by init-model (the transformer/ component), per-token timesteps. */
TEST(wan_cli_dit_forward_pipeline) {
    const char *tmp = test_tmpdir();
    char out[8192], dir[600], in[700], res[700];
    snprintf(dir, sizeof dir, "%s/tiny", tmp);
    snprintf(in, sizeof in, "%s/in.safetensors", tmp);
    snprintf(res, sizeof res, "%s/out.safetensors", tmp);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s", test_vgrpo_bin(), dir) == 0);
    /* B 1, 16 x 1 x 4 x 8 latent: 8 tokens; 3 text tokens of width 64 */
    static float x[16 * 4 * 8], t[8], e[3 * 64];
    test_fill_uniform(x, 16 * 4 * 8, 1, -1, 1);
    test_fill_uniform(t, 8, 2, 0, 1000);
    test_fill_uniform(e, 3 * 64, 3, -1, 1);
    st_writer *w = st_writer_new();
    int64_t sx[5] = {1, 16, 1, 4, 8}, stt[2] = {1, 8}, se[3] = {1, 3, 64};
    REQUIRE_OK(st_writer_add(w, "hidden_states", CORE_F32, 5, sx, x));
    REQUIRE_OK(st_writer_add(w, "timestep", CORE_F32, 2, stt, t));
    REQUIRE_OK(st_writer_add(w, "encoder_hidden_states", CORE_F32, 3, se, e));
    REQUIRE_OK(st_writer_write(w, in));
    st_writer_free(w);
    REQUIRE(test_run(out, sizeof out, "%s dit-forward --model %s --inputs %s --out %s", test_vgrpo_bin(), dir, in,
                     res) == 0);
    /* the same through the library */
    char tdir[700];
    snprintf(tdir, sizeof tdir, "%s/transformer", dir);
    wan_model m;
    REQUIRE_OK(wan_model_load(&m, tdir));
    wan_shape sh = {1, 1, 4, 8, 3, 1};
    wan_acts *A = wan_acts_new(&m.cfg, &sh, WAN_ACTS_INFER);
    REQUIRE(A != NULL);
    static float o[16 * 4 * 8];
    REQUIRE_OK(wan_forward(&m, A, NULL, o, x, t, e));
    st_file *f = st_open(res);
    REQUIRE(f != NULL);
    int64_t n;
    float *got = wt_read(f, "output", NULL, NULL, &n);
    REQUIRE(got && n == 16 * 4 * 8);
    CHECK(memcmp(got, o, sizeof o) == 0);
    CHECK(st_find(f, "grad_hidden_states") < 0);
    free(got);
    st_close(f);
    wan_acts_free(A);
    wan_model_free(&m);
}
