/* tests/test_wan_io.c — Wan transformer checkpoints: save/load round trip, BF16 and sharded loads, and the
 * errors for a missing, an unexpected and a mis-shaped tensor (checked by content). */
#include <stdio.h>

#include "tests/test.h"
#include "tests/wan_test_util.h"

TEST(wan_io_save_load_roundtrip) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model a, b;
    REQUIRE_OK(wan_model_init(&a, &c));
    wan_params_init_random(&a, 7);
    const char *dir = test_tmpdir();
    REQUIRE_OK(wan_model_save(&a, dir));
    REQUIRE_OK(wan_model_load(&b, dir));
    CHECK(wan_config_equal(&a.cfg, &b.cfg));
    REQUIRE(a.layout.numel == b.layout.numel);
    CHECK(memcmp(a.params, b.params, (size_t)a.layout.numel * sizeof(float)) == 0);
    /* the init is what the header says: weights ~ N(0, 1/fan_in), biases 0, norm weights 1 */
    const wan_tensor *t = &a.layout.tensors[wan_layout_find(&a.layout, "blocks.1.ffn.net.0.proj.weight")];
    double s2 = 0;
    for (int64_t i = 0; i < t->numel; i++) s2 += (double)a.params[t->offset + i] * a.params[t->offset + i];
    CHECK_NEAR(s2 / t->numel * t->shape[1], 1.0, 0.05);
    CHECK(a.w.blocks[0].ffn1_b[3] == 0.0f && a.w.blocks[1].attn2.norm_k[5] == 1.0f);
    /* same seed, same weights; another seed, other weights */
    wan_params_init_random(&b, 7);
    CHECK(memcmp(a.params, b.params, (size_t)a.layout.numel * sizeof(float)) == 0);
    wan_params_init_random(&b, 8);
    CHECK(memcmp(a.params, b.params, (size_t)a.layout.numel * sizeof(float)) != 0);
    wan_model_free(&a);
    wan_model_free(&b);
}

/* BF16 on disk -> exactly the bf16 rounding of the fp32 weights; shards -> exactly the single-file weights. */
TEST(wan_io_bf16_and_sharded_loads) {
    wan_model f32, bf, sh, mh;
    REQUIRE_OK(wan_model_load(&f32, "tests/fixtures/wan_difftest"));
    REQUIRE_OK(wan_model_load(&bf, "tests/fixtures/wan_difftest_bf16"));
    REQUIRE(f32.layout.numel == bf.layout.numel);
    int64_t diff = 0, changed = 0;
    for (int64_t i = 0; i < f32.layout.numel; i++) {
        float r = core_bf16_to_f32(core_f32_to_bf16(f32.params[i]));
        diff += r != bf.params[i];
        changed += r != f32.params[i];
    }
    CHECK_MSG(diff == 0, "%lld BF16 weights differ from the rounded F32 ones", (long long)diff);
    CHECK(changed > f32.layout.numel / 2); /* the file really is BF16 */
    REQUIRE_OK(wan_model_load(&sh, "tests/fixtures/wan_multihead_sharded"));
    REQUIRE_OK(wan_model_load(&mh, "tests/fixtures/wan_multihead"));
    REQUIRE(sh.layout.numel == mh.layout.numel);
    CHECK(memcmp(sh.params, mh.params, (size_t)sh.layout.numel * sizeof(float)) == 0);
    wan_model_free(&f32), wan_model_free(&bf), wan_model_free(&sh), wan_model_free(&mh);
}

/* Writes dir/config.json and a weights file from m, with tensor `skip` left out, an `extra` tensor added and
 * tensor `reshape` given a wrong shape (each NULL for none). */
static void write_variant(const wan_model *m, const char *dir, const char *skip, const char *extra,
                          const char *reshape) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    REQUIRE_OK(wan_config_save(&m->cfg, path));
    st_writer *w = st_writer_new();
    REQUIRE(w != NULL);
    static float pad[4];
    for (int i = 0; i < m->layout.count; i++) {
        const wan_tensor *t = &m->layout.tensors[i];
        if (skip && !strcmp(t->name, skip)) continue;
        int64_t shape[WAN_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        int nd = t->ndim;
        if (reshape && !strcmp(t->name, reshape)) shape[0] = t->numel, nd = 1; /* same size, other shape */
        REQUIRE_OK(st_writer_add(w, t->name, CORE_F32, nd, shape, m->params + t->offset));
    }
    if (extra) {
        int64_t s1[1] = {4};
        REQUIRE_OK(st_writer_add(w, extra, CORE_F32, 1, s1, pad));
    }
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    REQUIRE_OK(st_writer_write(w, path));
    st_writer_free(w);
}

TEST(wan_io_errors_name_the_tensor) {
    wan_config c;
    REQUIRE_OK(wan_config_load(&c, "tests/fixtures/wan_difftest/config.json"));
    wan_model m, x;
    REQUIRE_OK(wan_model_init(&m, &c));
    const char *tmp = test_tmpdir();
    char dir[600];
    struct {
        const char *skip, *extra, *reshape, *want1, *want2;
    } cases[] = {
        {"blocks.1.attn2.norm_k.weight", NULL, NULL, "missing tensor", "blocks.1.attn2.norm_k.weight"},
        {NULL, "blocks.0.attn2.add_k_proj.weight", NULL, "unexpected tensor", "blocks.0.attn2.add_k_proj.weight"},
        {NULL, NULL, "blocks.0.ffn.net.2.weight", "blocks.0.ffn.net.2.weight", "has shape [768], expected [24, 32]"},
    };
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/v%d", tmp, i);
        char cmd[700];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
        REQUIRE(system(cmd) == 0);
        write_variant(&m, dir, cases[i].skip, cases[i].extra, cases[i].reshape);
        core_error_clear();
        CHECK(wan_model_load(&x, dir) == -1);
        const char *msg = core_last_error();
        CHECK_MSG(strstr(msg, dir) && strstr(msg, cases[i].want1) && strstr(msg, cases[i].want2), "case %d: \"%s\"",
                  i, msg);
        CHECK(x.params == NULL); /* freed on failure */
    }
    /* a folder without a config */
    CHECK(wan_model_load(&x, tmp) == -1 && strstr(core_last_error(), "config.json"));
    wan_model_free(&m);
}

/* F16 on disk -> exactly the f16 rounding of the fp32 weights. */
TEST(wan_io_f16_load) {
    wan_model m, h;
    REQUIRE_OK(wan_model_load(&m, "tests/fixtures/wan_difftest"));
    const char *dir = test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    REQUIRE_OK(wan_config_save(&m.cfg, path));
    uint16_t *half = malloc((size_t)m.layout.numel * sizeof(uint16_t));
    REQUIRE(half != NULL);
    for (int64_t i = 0; i < m.layout.numel; i++) half[i] = core_f32_to_f16(m.params[i]);
    st_writer *w = st_writer_new();
    for (int i = 0; i < m.layout.count; i++) {
        const wan_tensor *t = &m.layout.tensors[i];
        REQUIRE_OK(st_writer_add(w, t->name, CORE_F16, t->ndim, t->shape, half + t->offset));
    }
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    REQUIRE_OK(st_writer_write(w, path));
    st_writer_free(w);
    REQUIRE_OK(wan_model_load(&h, dir));
    int64_t diff = 0;
    for (int64_t i = 0; i < m.layout.numel; i++) diff += h.params[i] != core_f16_to_f32(half[i]);
    CHECK(diff == 0);
    free(half);
    wan_model_free(&m), wan_model_free(&h);
}
