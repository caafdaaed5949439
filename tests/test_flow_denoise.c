/* tests/test_flow_denoise.c — one denoising step (model/flow/denoise.h) on the tiny DiT with random weights: the row
 * layout (conditional rows, then one unconditional row per guided sample, the negative prompt or zeros), the
 * guided velocity against single-row forwards combined by hand, per-token timesteps and I2V-A14B's concatenated
 * input, the guidance backward (g dv, (1 - g) dv) and the DiT backward over the rows against wan_backward with that
 * gradient, and the refusals. */
#include <string.h>

#include "core/philox.h"
#include "model/dit/wan_dit.h"
#include "model/flow/denoise.h"
#include "tests/test.h"

#define DL 4 /* text length */
static const int64_t DSHAPE[4] = {16, 2, 4, 4};
#define DNL (16 * 2 * 4 * 4)

static void tiny(wan_model *m, const char *preset, uint64_t seed) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, preset));
    REQUIRE_OK(wan_model_init(m, &c));
    wan_params_init_random(m, seed);
}

/* Philox normals of (seed, slot) into a fresh buffer of n floats. */
static float *normals(int64_t n, uint32_t slot) {
    float *p = malloc(sizeof(float) * (size_t)n);
    REQUIRE(p);
    core_philox_normal(p, n, 5, slot, 0, 0);
    return p;
}

TEST(flow_denoise_rows_and_guidance) {
    wan_model m;
    tiny(&m, "tiny", 11);
    const int64_t ne = (int64_t)DL * m.cfg.text_dim;
    float *lat[3], *txt[3], *neg = normals(ne, 9);
    const float g[3] = {4.5f, 1.0f, 2.0f}; /* sample 1 unguided: no unconditional row */
    flow_denoise d;
    REQUIRE_OK(flow_denoise_init(&d, &m.cfg, DSHAPE, DL, 0, 3, 0));
    for (int j = 0; j < 3; j++) {
        lat[j] = normals(DNL, 1 + j), txt[j] = normals(ne, 4 + j);
        d.in[j] = (flow_denoise_sample){lat[j], NULL, txt[j], 900.0f - 100.0f * j, g[j]};
    }
    REQUIRE(flow_denoise_build(&d, 3, neg) == 5);
    CHECK(d.urow[0] == 3 && d.urow[1] == -1 && d.urow[2] == 4);
    const int src[5] = {0, 1, 2, 0, 2};
    for (int r = 0; r < 5; r++) {
        CHECK(memcmp(d.x + r * DNL, lat[src[r]], sizeof(float) * DNL) == 0);
        CHECK(memcmp(d.enc + r * ne, r < 3 ? txt[r] : neg, sizeof(float) * (size_t)ne) == 0);
        CHECK(d.ts[r] == 900.0f - 100.0f * src[r]);
    }
    wan_exec_acts *a = flow_denoise_acts_new(&d, NULL, 5, WAN_ACTS_INFER);
    REQUIRE(a);
    REQUIRE_OK(flow_denoise_forward(&d, &m, a, NULL));
    /* each sample alone, one row at a time, guided by hand: the same bits */
    wan_shape one = {.B = 1, .F = 2, .H = 4, .W = 4, .L = DL};
    wan_acts *a1 = wan_acts_new(&m.cfg, &one, WAN_ACTS_INFER);
    REQUIRE(a1);
    float vc[DNL], vu[DNL], want[DNL];
    for (int j = 0; j < 3; j++) {
        const float t = 900.0f - 100.0f * j;
        REQUIRE_OK(wan_forward(&m, a1, NULL, vc, lat[j], &t, txt[j]));
        REQUIRE_OK(wan_forward(&m, a1, NULL, vu, lat[j], &t, neg));
        for (int k = 0; k < DNL; k++) {
            const float dd = vc[k] - vu[k], tt = g[j] * dd;
            want[k] = g[j] != 1.0f ? vu[k] + tt : vc[k];
        }
        CHECK_MSG(memcmp(flow_denoise_velocity(&d, j), want, sizeof want) == 0, "sample %d", j);
    }
    /* no negative prompt: zeros in the unconditional rows */
    REQUIRE(flow_denoise_build(&d, 1, NULL) == 2);
    int zero = 1;
    for (int64_t k = 0; k < ne; k++) zero &= d.enc[ne + k] == 0.0f;
    CHECK(zero);
    /* refusals */
    CHECK(flow_denoise_build(&d, 4, neg) == -1);
    CHECK(strstr(core_last_error(), "4 samples for a step of up to 3") != NULL);
    CHECK(flow_denoise_grad(&d, 0, vc) == -1);
    CHECK(strstr(core_last_error(), "without grads") != NULL);
    d.in[0].concat = lat[1];
    CHECK(flow_denoise_build(&d, 1, NULL) == -1);
    CHECK(strstr(core_last_error(), "sample 0 has a concatenated image condition but the transformer takes 16") !=
          NULL);
    wan_acts_free(a1);
    wan_exec_acts_free(a);
    flow_denoise_free(&d);
    for (int j = 0; j < 3; j++) free(lat[j]), free(txt[j]);
    free(neg);
    wan_model_free(&m);
}

TEST(flow_denoise_per_token_and_concat) {
    wan_model m;
    tiny(&m, "tiny-i2v", 12); /* 36 in (latent 16, mask 4, condition 16), 16 out */
    const int64_t ne = (int64_t)DL * m.cfg.text_dim, cc = 20 * 2 * 4 * 4;
    float *lat = normals(DNL, 1), *cond = normals(cc, 2), *txt = normals(ne, 3);
    flow_denoise d;
    REQUIRE_OK(flow_denoise_init(&d, &m.cfg, DSHAPE, DL, 1, 1, 0));
    CHECK(d.nin == 36 * 2 * 4 * 4 && d.tpf == 4 && d.nts == 8);
    d.in[0] = (flow_denoise_sample){lat, cond, txt, 750.0f, 3.0f};
    REQUIRE(flow_denoise_build(&d, 1, NULL) == 2);
    for (int r = 0; r < 2; r++) {
        CHECK(memcmp(d.x + r * d.nin, lat, sizeof(float) * DNL) == 0);
        CHECK(memcmp(d.x + r * d.nin + DNL, cond, sizeof(float) * (size_t)cc) == 0);
        for (int k = 0; k < 8; k++) CHECK(d.ts[r * 8 + k] == (k < 4 ? 0.0f : 750.0f)); /* frame 0's tokens get 0 */
    }
    d.in[0].concat = NULL;
    CHECK(flow_denoise_build(&d, 1, NULL) == -1);
    CHECK(strstr(core_last_error(), "sample 0 lacks a concatenated image condition") != NULL);
    flow_denoise_free(&d);
    /* a latent of other channels than the model gives, or per-token timesteps with a deep patch: refused */
    const int64_t bad[4] = {36, 2, 4, 4};
    CHECK(flow_denoise_init(&d, &m.cfg, bad, DL, 0, 1, 0) == -1);
    CHECK(strstr(core_last_error(), "a latent of 36 channels for a transformer of 36 in / 16 out") != NULL);
    m.cfg.patch_size[0] = 2;
    CHECK(flow_denoise_init(&d, &m.cfg, DSHAPE, DL, 1, 1, 0) == -1);
    CHECK(strstr(core_last_error(), "patch one frame deep") != NULL);
    free(lat), free(cond), free(txt);
    wan_model_free(&m);
}

TEST(flow_denoise_backward_through_guidance) {
    wan_model m;
    tiny(&m, "tiny", 13);
    REQUIRE_OK(wan_model_alloc_grads(&m));
    const int64_t ne = (int64_t)DL * m.cfg.text_dim, np = m.layout.numel;
    float *lat[2] = {normals(DNL, 1), normals(DNL, 2)}, *txt = normals(ne, 3);
    float *dv[2] = {normals(DNL, 4), normals(DNL, 5)};
    flow_denoise d;
    REQUIRE_OK(flow_denoise_init(&d, &m.cfg, DSHAPE, DL, 0, 2, 1));
    d.in[0] = (flow_denoise_sample){lat[0], NULL, txt, 800.0f, 1.0f};
    d.in[1] = (flow_denoise_sample){lat[1], NULL, txt, 600.0f, 3.0f};
    REQUIRE(flow_denoise_build(&d, 2, NULL) == 3);
    wan_exec_acts *a = flow_denoise_acts_new(&d, NULL, 3, WAN_ACTS_STORE);
    REQUIRE(a);
    REQUIRE_OK(flow_denoise_forward(&d, &m, a, NULL));
    wan_model_zero_grads(&m);
    REQUIRE_OK(flow_denoise_grad(&d, 0, dv[0]));
    REQUIRE_OK(flow_denoise_grad(&d, 1, dv[1]));
    for (int k = 0; k < DNL; k++) { /* row 0 a copy; row 1 g dv, row 2 (its unconditional) (1 - g) dv */
        CHECK(d.dout[k] == dv[0][k]);
        CHECK(d.dout[DNL + k] == 3.0f * dv[1][k] && d.dout[2 * DNL + k] == -2.0f * dv[1][k]);
    }
    REQUIRE_OK(flow_denoise_backward(&d, &m, a, NULL));
    float *got = malloc(sizeof(float) * (size_t)np), *dout = malloc(sizeof(float) * 3 * DNL);
    REQUIRE(got && dout);
    memcpy(got, m.grads, sizeof(float) * (size_t)np);
    /* the same rows through wan_forward / wan_backward by hand */
    memcpy(dout, d.dout, sizeof(float) * 3 * DNL);
    wan_shape sh = {.B = 3, .F = 2, .H = 4, .W = 4, .L = DL};
    wan_acts *ref = wan_acts_new(&m.cfg, &sh, WAN_ACTS_STORE);
    REQUIRE(ref);
    float *out = malloc(sizeof(float) * 3 * DNL);
    REQUIRE(out);
    wan_model_zero_grads(&m);
    REQUIRE_OK(wan_forward(&m, ref, NULL, out, d.x, d.ts, d.enc));
    REQUIRE_OK(wan_backward(&m, ref, NULL, NULL, NULL, dout));
    CHECK(memcmp(got, m.grads, sizeof(float) * (size_t)np) == 0);
    double s = 0;
    for (int64_t k = 0; k < np; k++) s += got[k] != 0.0f;
    CHECK(s > 0.5 * np); /* the gradient reached the weights */
    CHECK(flow_denoise_grad(&d, 2, dv[0]) == -1);
    wan_acts_free(ref);
    wan_exec_acts_free(a);
    flow_denoise_free(&d);
    free(got), free(dout), free(out), free(lat[0]), free(lat[1]), free(txt), free(dv[0]), free(dv[1]);
    wan_model_free(&m);
}
