/* tests/test_nft.c — DiffusionNFT's arithmetic (trainer/step/nft.h): the loss of a transition and its gradient
 * against a float64 torch transcription of NVlabs/DiffusionNFT train_nft_sd3.py (tests/fixtures/nft_loss.safetensors,
 * scripts/fixtures_nft.py), the gradient against central finite differences of the C loss, the optimality
 * probability, the forward-process sample's determinism, the old policy's decay schedule and soft update, errors. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "tests/test.h"
#include "trainer/step/nft.h"

#define NFT_FIXTURE "tests/fixtures/nft_loss.safetensors"
#define NM 96 /* elements per transition */
#define NT 8  /* transitions in the fixture */

static void read_f64(const st_file *f, const char *name, double *dst, int64_t n) {
    core_tensor t;
    REQUIRE_OK(st_get(f, name, &t));
    CHECK_MSG(t.dtype == CORE_I64 && core_tensor_numel(&t) == n, "%s: I64 [%lld] expected", name, (long long)n);
    if (t.dtype == CORE_I64 && core_tensor_numel(&t) == n) memcpy(dst, t.data, sizeof(double) * (size_t)n);
    core_tensor_free(&t);
}

typedef struct {
    float x0[NT][NM], eps[NT][NM], v[NT][NM], vo[NT][NM], vr[NT][NM], xt[NT][NM], t[NT], adv[NT], hyper[3];
    int64_t denom;
    double r[NT], contrib[NT], parts[NT][4], dv[NT][NM];
} nft_fix;

static nft_fix *load_fixture(void) {
    nft_fix *g = calloc(1, sizeof(*g));
    REQUIRE(g != NULL);
    st_file *f = st_open(NFT_FIXTURE);
    REQUIRE_OK(f == NULL);
    REQUIRE_OK(st_read_f32(f, "nft.x0", &g->x0[0][0], NT * NM));
    REQUIRE_OK(st_read_f32(f, "nft.eps", &g->eps[0][0], NT * NM));
    REQUIRE_OK(st_read_f32(f, "nft.v", &g->v[0][0], NT * NM));
    REQUIRE_OK(st_read_f32(f, "nft.v_old", &g->vo[0][0], NT * NM));
    REQUIRE_OK(st_read_f32(f, "nft.v_ref", &g->vr[0][0], NT * NM));
    REQUIRE_OK(st_read_f32(f, "nft.xt", &g->xt[0][0], NT * NM));
    REQUIRE_OK(st_read_f32(f, "nft.t", g->t, NT));
    REQUIRE_OK(st_read_f32(f, "nft.adv", g->adv, NT));
    REQUIRE_OK(st_read_f32(f, "nft.hyper", g->hyper, 3));
    const char *d = st_metadata(f, "nft_denom");
    REQUIRE(d != NULL);
    g->denom = atoll(d);
    read_f64(f, "nft.r.f64", g->r, NT);
    read_f64(f, "nft.contrib.f64", g->contrib, NT);
    read_f64(f, "nft.parts.f64", &g->parts[0][0], NT * 4);
    read_f64(f, "nft.dv.f64", &g->dv[0][0], NT * NM);
    st_close(f);
    return g;
}

static double rel(double a, double b, double scale) { return fabs(a - b) / (scale > 0 ? scale : 1.0); }

/* Against the torch float64 transcription: both sides compute in double from the same fp32 inputs, so the loss parts
 * agree to ~1e-15 relative; dv is rounded once to float (2^-24 relative of the transition's largest |dv|). The bound
 * asked for is 1e-6 relative. */
TEST(nft_loss_matches_reference) {
    nft_fix *g = load_fixture();
    const float beta = g->hyper[0], clip = g->hyper[1], klb = g->hyper[2];
    float r[NT], dv[NM];
    REQUIRE_OK(nft_optimality(g->adv, NT, clip, r));
    double worst_r = 0, worst_c = 0, worst_p = 0, worst_dv = 0, total = 0;
    nft_loss_stats st = {0};
    for (int k = 0; k < NT; k++) {
        worst_r = fmax(worst_r, fabs(r[k] - g->r[k]));
        nft_loss_stats one = {0};
        REQUIRE_OK(nft_loss_terms(NM, g->t[k], g->x0[k], g->xt[k], g->v[k], g->vo[k], g->vr[k], r[k], beta, clip,
                                  klb, g->denom, dv, &one));
        nft_loss_stats_add(&st, &one);
        total += g->contrib[k];
        worst_c = fmax(worst_c, rel(one.loss, g->contrib[k], fabs(g->contrib[k])));
        worst_p = fmax(worst_p, rel(one.positive_sum, g->parts[k][0], fabs(g->parts[k][0])));
        worst_p = fmax(worst_p, rel(one.negative_sum, g->parts[k][1], fabs(g->parts[k][1])));
        worst_p = fmax(worst_p, rel(one.kl * (double)g->denom, g->parts[k][2], fabs(g->parts[k][2])));
        worst_p = fmax(worst_p, rel(one.policy * (double)g->denom, g->parts[k][3], fabs(g->parts[k][3])));
        double scale = 0;
        for (int i = 0; i < NM; i++) scale = fmax(scale, fabs(g->dv[k][i]));
        for (int i = 0; i < NM; i++) worst_dv = fmax(worst_dv, rel(dv[i], g->dv[k][i], scale));
    }
    if (getenv("VGRPO_VERBOSE"))
        printf("nft fixture: |r| %.3g, contrib %.3g, parts %.3g, dv %.3g (relative)\n", worst_r, worst_c, worst_p,
               worst_dv);
    CHECK(worst_r < 1e-7); /* r in float, the reference's in double */
    CHECK(worst_c < 1e-6);
    CHECK(worst_p < 1e-6);
    CHECK(worst_dv < 1e-6);
    CHECK(rel(st.loss, total, fabs(total)) < 1e-6);
    CHECK(st.n_transitions == NT);
    /* the cases the fixture is meant to cover */
    CHECK(r[0] == 1.0f && r[1] == 0.0f && r[2] == 0.5f);
    free(g);
}

/* The loss of one transition written here in double, with the adaptive weights wp, wn given (held fixed, as the
 * reference's no_grad holds them): the function whose derivative nft_loss_terms' dv is. */
static double loss_frozen(const nft_fix *g, int k, const double *v, double r, double wp, double wn) {
    const double t = g->t[k], beta = g->hyper[0], c = g->hyper[1], klb = g->hyper[2];
    double lp = 0, ln = 0, kl = 0;
    for (int i = 0; i < NM; i++) {
        const double vp = beta * v[i] + (1 - beta) * g->vo[k][i], vn = (1 + beta) * g->vo[k][i] - beta * v[i];
        const double ep = g->xt[k][i] - t * vp - g->x0[k][i], en = g->xt[k][i] - t * vn - g->x0[k][i];
        lp += ep * ep / wp;
        ln += en * en / wn;
        kl += (v[i] - g->vr[k][i]) * (v[i] - g->vr[k][i]);
    }
    return (c * (r * lp / NM + (1 - r) * ln / NM) / beta + klb * kl / NM) / (double)g->denom;
}

/* The adaptive weights at v: max(mean |x0 prediction - x0|, 1e-5) of the positive and negative policies. */
static void weights_at(const nft_fix *g, int k, double *wp, double *wn) {
    const double t = g->t[k], beta = g->hyper[0];
    double sp = 0, sn = 0;
    for (int i = 0; i < NM; i++) {
        const double v = g->v[k][i];
        sp += fabs(g->xt[k][i] - t * (beta * v + (1 - beta) * g->vo[k][i]) - g->x0[k][i]);
        sn += fabs(g->xt[k][i] - t * ((1 + beta) * g->vo[k][i] - beta * v) - g->x0[k][i]);
    }
    *wp = fmax(sp / NM, 1e-5);
    *wn = fmax(sn / NM, 1e-5);
}

/* Central differences (h = 1e-3, in double) of the loss with the weights frozen at the evaluation point, on every
 * transition of the fixture and every element: the loss is then an exact quadratic in v, so the difference quotient
 * equals the derivative up to double rounding; dv is rounded once to float. Bound: 1e-6 of the transition's largest
 * |dv|. The frozen loss at v itself must equal nft_loss_terms' (the weights are the same numbers). */
TEST(nft_gradient_matches_finite_differences) {
    nft_fix *g = load_fixture();
    float r[NT], dv[NM];
    double vd[NM];
    REQUIRE_OK(nft_optimality(g->adv, NT, g->hyper[1], r));
    double worst = 0, worst_l = 0;
    for (int k = 0; k < NT; k++) {
        nft_loss_stats st = {0};
        REQUIRE_OK(nft_loss_terms(NM, g->t[k], g->x0[k], g->xt[k], g->v[k], g->vo[k], g->vr[k], r[k], g->hyper[0],
                                  g->hyper[1], g->hyper[2], g->denom, dv, &st));
        double wp, wn, scale = 0;
        weights_at(g, k, &wp, &wn);
        for (int i = 0; i < NM; i++) vd[i] = g->v[k][i];
        const double l0 = loss_frozen(g, k, vd, r[k], wp, wn);
        worst_l = fmax(worst_l, fabs(l0 - st.loss) / fabs(st.loss));
        for (int i = 0; i < NM; i++) scale = fmax(scale, fabs(dv[i]));
        REQUIRE(scale > 0);
        for (int i = 0; i < NM; i++) {
            const double h = 1e-3;
            vd[i] = g->v[k][i] + h;
            const double lp = loss_frozen(g, k, vd, r[k], wp, wn);
            vd[i] = g->v[k][i] - h;
            const double lm = loss_frozen(g, k, vd, r[k], wp, wn);
            vd[i] = g->v[k][i];
            worst = fmax(worst, fabs((lp - lm) / (2 * h) - dv[i]) / scale);
        }
    }
    if (getenv("VGRPO_VERBOSE")) printf("nft finite differences: worst %.3g of max |dv|, loss %.3g\n", worst, worst_l);
    CHECK(worst < 1e-6);
    CHECK(worst_l < 1e-12);
    free(g);
}

/* With the weights frozen (1e-5 floor on both sides, v == v_old: transition 7) the loss is an exact quadratic in v
 * near its minimum, so finite differences match the analytic gradient tightly. */
TEST(nft_gradient_finite_differences_at_floor) {
    nft_fix *g = load_fixture();
    float dv[NM], vp[NM];
    const int k = 7;
    const float r = 0.3f;
    nft_loss_stats st = {0};
    REQUIRE_OK(nft_loss_terms(NM, g->t[k], g->x0[k], g->xt[k], g->v[k], g->vo[k], NULL, r, g->hyper[0], g->hyper[1],
                              0.0f, g->denom, dv, &st));
    double worst = 0, scale = 0;
    for (int i = 0; i < NM; i++) scale = fmax(scale, fabs(dv[i]));
    for (int i = 0; i < NM; i += 7) {
        memcpy(vp, g->v[k], sizeof(vp));
        const float h = 1e-7f;
        nft_loss_stats a = {0}, b = {0};
        vp[i] = g->v[k][i] + h;
        const double hp = (double)vp[i] - g->v[k][i];
        REQUIRE_OK(nft_loss_terms(NM, g->t[k], g->x0[k], g->xt[k], vp, g->vo[k], NULL, r, g->hyper[0], g->hyper[1],
                                  0.0f, g->denom, NULL, &a));
        vp[i] = g->v[k][i] - h;
        const double hm = (double)g->v[k][i] - vp[i];
        REQUIRE_OK(nft_loss_terms(NM, g->t[k], g->x0[k], g->xt[k], vp, g->vo[k], NULL, r, g->hyper[0], g->hyper[1],
                                  0.0f, g->denom, NULL, &b));
        worst = fmax(worst, fabs((a.loss - b.loss) / (hp + hm) - dv[i]));
    }
    (void)scale;
    /* dv ~ 2 c t / M * e / 1e-5 with e ~ 1e-7: the gradient is of order 1e-2 here, the difference quotient exact to
     * ~1e-6 absolute (the loss is quadratic; the weights stay on the floor) */
    CHECK(worst < 1e-5);
    free(g);
}

TEST(nft_optimality_values_and_errors) {
    const float adv[6] = {-10.0f, -5.0f, -2.5f, 0.0f, 2.5f, 7.0f};
    float r[6];
    REQUIRE_OK(nft_optimality(adv, 6, 5.0f, r));
    CHECK(r[0] == 0.0f && r[1] == 0.0f && r[2] == 0.25f && r[3] == 0.5f && r[4] == 0.75f && r[5] == 1.0f);
    CHECK(nft_optimality(adv, 6, 0.0f, r) == -1 && strstr(core_last_error(), "algorithm.adv_clip_max"));
    CHECK(nft_optimality(adv, 6, INFINITY, r) == -1 && strstr(core_last_error(), "algorithm.adv_clip_max"));
    const float bad[2] = {0.0f, NAN};
    CHECK(nft_optimality(bad, 2, 5.0f, r) == -1 && strstr(core_last_error(), "sample 1"));
}

/* x_t from Philox stream CORE_STREAM_NFT_NOISE: the same (seed, slot, uid) give the same bits, another slot or uid
 * other noise; x_t = (1 - t) x0 + t eps in fp32 exactly; t = 0 gives x0 and t = 1 the noise. */
TEST(nft_forward_sample_deterministic) {
    enum { N = 37 };
    float x0[N], xt[N], xt2[N], eps[N], ref[N];
    for (int i = 0; i < N; i++) x0[i] = 0.1f * (float)i - 1.0f;
    REQUIRE_OK(nft_forward_sample(x0, N, 0.625f, 42, 3, 17, xt, eps));
    core_philox_normal(ref, N, 42, 3, 17, CORE_STREAM_NFT_NOISE);
    CHECK(memcmp(eps, ref, sizeof(ref)) == 0);
    int exact = 1;
    for (int i = 0; i < N; i++) exact &= xt[i] == (1.0f - 0.625f) * x0[i] + 0.625f * eps[i];
    CHECK(exact);
    REQUIRE_OK(nft_forward_sample(x0, N, 0.625f, 42, 3, 17, xt2, NULL));
    CHECK(memcmp(xt, xt2, sizeof(xt)) == 0);
    REQUIRE_OK(nft_forward_sample(x0, N, 0.625f, 42, 4, 17, xt2, NULL));
    CHECK(memcmp(xt, xt2, sizeof(xt)) != 0);
    REQUIRE_OK(nft_forward_sample(x0, N, 0.625f, 42, 3, 18, xt2, NULL));
    CHECK(memcmp(xt, xt2, sizeof(xt)) != 0);
    REQUIRE_OK(nft_forward_sample(x0, N, 0.0f, 42, 3, 17, xt2, NULL));
    CHECK(memcmp(x0, xt2, sizeof(x0)) == 0);
    REQUIRE_OK(nft_forward_sample(x0, N, 1.0f, 42, 3, 17, xt2, NULL));
    CHECK(memcmp(ref, xt2, sizeof(ref)) == 0);
    CHECK(nft_forward_sample(x0, N, 1.5f, 42, 3, 17, xt2, NULL) == -1 && strstr(core_last_error(), "timestep"));
    CHECK(nft_forward_sample(x0, 0, 0.5f, 42, 3, 17, xt2, NULL) == -1);
}

/* The reference's return_decay: decay_type 1 (0, 0.001, 0.5) and 2 (75, 0.0075, 0.999); the soft update. */
TEST(nft_old_policy_decay_and_soft_update) {
    CHECK(nft_old_decay(0, 0, 0.001, 0.5) == 0.0);
    CHECK_NEAR(nft_old_decay(120, 0, 0.001, 0.5), 0.12, 1e-15);
    CHECK(nft_old_decay(900, 0, 0.001, 0.5) == 0.5);
    CHECK(nft_old_decay(74, 75, 0.0075, 0.999) == 0.0);
    CHECK(nft_old_decay(75, 75, 0.0075, 0.999) == 0.0);
    CHECK_NEAR(nft_old_decay(175, 75, 0.0075, 0.999), 0.75, 1e-15);
    CHECK(nft_old_decay(100000, 75, 0.0075, 0.999) == 0.999);
    CHECK(nft_old_decay(5, 0, 0.0, 0.0) == 0.0);
    float old[3] = {1.0f, -2.0f, 4.0f};
    const float cur[3] = {3.0f, 2.0f, 0.0f};
    nft_soft_update(old, cur, 3, 0.25f);
    CHECK(old[0] == 2.5f && old[1] == 1.0f && old[2] == 1.0f);
    nft_soft_update(old, cur, 3, 0.0f); /* decay 0: the old policy becomes the current one */
    CHECK(old[0] == 3.0f && old[1] == 2.0f && old[2] == 0.0f);
}

/* First update (v == v_old): v+ = v- = v_old, so L+ == L- and the gradient is 2 c t / M (1 - 2 r) e / w; with r = 1/2
 * it vanishes. Errors name what is wrong. */
TEST(nft_loss_first_update_and_errors) {
    nft_fix *g = load_fixture();
    float dv[NM];
    nft_loss_stats st = {0};
    const int k = 6;
    REQUIRE_OK(nft_loss_terms(NM, g->t[k], g->x0[k], g->xt[k], g->v[k], g->vo[k], NULL, 0.5f, 0.1f, 5.0f, 0.0f, 1,
                              dv, &st));
    CHECK(st.positive_sum == st.negative_sum && st.positive_sum > 0);
    CHECK(st.old_deviate_sum == 0.0);
    int zero = 1;
    for (int i = 0; i < NM; i++) zero &= dv[i] == 0.0f;
    CHECK(zero);
    const float *x = g->x0[0];
    CHECK(nft_loss_terms(NM, 0.5f, x, x, x, x, NULL, 0.5f, 0.0f, 5.0f, 0.0f, 1, dv, NULL) == -1 &&
          strstr(core_last_error(), "algorithm.nft_beta"));
    CHECK(nft_loss_terms(NM, 0.5f, x, x, x, x, NULL, 0.5f, 0.1f, 5.0f, 0.1f, 1, dv, NULL) == -1 &&
          strstr(core_last_error(), "reference velocity"));
    CHECK(nft_loss_terms(NM, 0.5f, x, x, x, x, NULL, 1.5f, 0.1f, 5.0f, 0.0f, 1, dv, NULL) == -1 &&
          strstr(core_last_error(), "optimality"));
    CHECK(nft_loss_terms(NM, 0.5f, x, x, x, x, NULL, 0.5f, 0.1f, 5.0f, 0.0f, 0, dv, NULL) == -1 &&
          strstr(core_last_error(), "denominator"));
    CHECK(nft_loss_terms(NM, 0.5f, x, x, x, x, NULL, 0.5f, 0.1f, 5.0f, -1.0f, 1, dv, NULL) == -1 &&
          strstr(core_last_error(), "algorithm.beta"));
    float vbad[NM];
    memcpy(vbad, x, sizeof(vbad));
    vbad[9] = NAN;
    CHECK(nft_loss_terms(NM, 0.5f, x, x, vbad, x, NULL, 0.5f, 0.1f, 5.0f, 0.0f, 1, dv, NULL) == -1 &&
          strstr(core_last_error(), "velocity[9]"));
    free(g);
}
