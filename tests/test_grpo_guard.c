/* tests/test_grpo_guard.c — GRPO-Guard's loss terms (trainer/step/grpo.h, grpo_guard_loss_terms) against float64 numpy
 * following verl-omni's GRPOGuardLoss (tests/fixtures/algo_cps_guard.safetensors, scripts/fixtures_algo.py), against
 * finite differences of a double forward written here, the first update (ratio exactly 1), the reduction to
 * grpo_loss_terms, errors, and the composed backward: dbias through flow_sde_backward_v_guard to the velocity. */
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/safetensors.h"
#include "core/tensor.h"
#include "model/flow/flow.h"
#include "tests/test.h"
#include "trainer/step/grpo.h"

#define ALGO_FIXTURE "tests/fixtures/algo_cps_guard.safetensors"
#define NE 64 /* elements per mean */
#define GT 7  /* transitions in the fixture */

static void read_f64(const st_file *f, const char *name, double *dst, int64_t n) {
    core_tensor t;
    REQUIRE_OK(st_get(f, name, &t));
    CHECK_MSG(t.dtype == CORE_I64 && core_tensor_numel(&t) == n, "%s: I64 [%lld] expected", name, (long long)n);
    if (t.dtype == CORE_I64 && core_tensor_numel(&t) == n) memcpy(dst, t.data, sizeof(double) * (size_t)n);
    core_tensor_free(&t);
}

typedef struct {
    float params[GT][4], std_t[GT], dt[GT], lnew[GT], lold[GT], adv[GT], kl[GT], mnew[GT][NE], mold[GT][NE];
    float eps, beta;
    uint8_t mask[GT];
    int64_t denom;
    double bias[GT], ratio[GT], contrib[GT], dlogp[GT], dmean[GT][NE], totals[4];
} guard_fix;

static void load_fixture(guard_fix *g) {
    st_file *f = st_open(ALGO_FIXTURE);
    REQUIRE_OK(f == NULL);
    REQUIRE_OK(st_read_f32(f, "guard.params", &g->params[0][0], GT * 4));
    REQUIRE_OK(st_read_f32(f, "guard.std_t", g->std_t, GT));
    REQUIRE_OK(st_read_f32(f, "guard.dt", g->dt, GT));
    REQUIRE_OK(st_read_f32(f, "guard.logp_new", g->lnew, GT));
    REQUIRE_OK(st_read_f32(f, "guard.logp_old", g->lold, GT));
    REQUIRE_OK(st_read_f32(f, "guard.adv", g->adv, GT));
    REQUIRE_OK(st_read_f32(f, "guard.kl", g->kl, GT));
    REQUIRE_OK(st_read_f32(f, "guard.mean_new", &g->mnew[0][0], GT * NE));
    REQUIRE_OK(st_read_f32(f, "guard.mean_old", &g->mold[0][0], GT * NE));
    float hyper[2];
    REQUIRE_OK(st_read_f32(f, "guard.hyper", hyper, 2));
    g->eps = hyper[0];
    g->beta = hyper[1];
    core_tensor t;
    REQUIRE_OK(st_get(f, "guard.mask", &t));
    REQUIRE(t.dtype == CORE_U8 && core_tensor_numel(&t) == GT);
    memcpy(g->mask, t.data, GT);
    core_tensor_free(&t);
    const char *d = st_metadata(f, "guard_denom");
    REQUIRE(d != NULL);
    g->denom = atoll(d);
    read_f64(f, "guard.bias.f64", g->bias, GT);
    read_f64(f, "guard.ratio.f64", g->ratio, GT);
    read_f64(f, "guard.contrib.f64", g->contrib, GT);
    read_f64(f, "guard.dlogp.f64", g->dlogp, GT);
    read_f64(f, "guard.dmean_new.f64", &g->dmean[0][0], GT * NE);
    read_f64(f, "guard.totals.f64", g->totals, 4);
    st_close(f);
}

/* Against float64 numpy (verl-omni GRPOGuardLoss, per transition, divided by the loss denominator). The inputs are
 * fp32; the C side forms step_std = std_t * sqrtf(-dt) and bias = flow_kl(mean_new, mean_old) in fp32, the fixture
 * sqrt(-dt) std_t and the bias in double. Tolerances, in fp32 epsilons of the value's scale (measured maxima printed
 * with VGRPO_VERBOSE):
 *   bias              8 eps of the bias (64 squares of exact or once-rounded differences, summed)    measured 0.9
 *   dlogp             16 eps of |A| scale / w / denom (the gradient's size before clipping)          measured 0.5
 *   contributions     16 eps of (|A| ratio / w mask + beta kl) / denom, per transition; the sums (loss, policy)
 *                     16 eps of the sum of those scales; the KL sum 4 eps
 *   |ratio - 1|       16 eps (ratio ~ 1)
 * dbias is dlogp bit for bit, dkl = beta / denom, and the clip count is exact (every ratio keeps 1e-3 from a
 * bound). */
TEST(grpo_guard_matches_numpy) {
    guard_fix *g = malloc(sizeof *g);
    REQUIRE(g);
    load_fixture(g);
    REQUIRE(g->denom == 9);
    const int verbose = getenv("VGRPO_VERBOSE") != NULL;
    float scale[GT], bias[GT], dl[GT], db[GT], dk[GT];
    for (int t = 0; t < GT; t++) {
        scale[t] = g->std_t[t] * sqrtf(-g->dt[t]);
        REQUIRE_OK(flow_kl(g->mnew[t], g->mold[t], NE, scale[t], &bias[t]));
        const double e = g->bias[t] == 0 ? (bias[t] == 0 ? 0 : INFINITY)
                                          : fabs(bias[t] - g->bias[t]) / (FLT_EPSILON * g->bias[t]);
        CHECK_MSG(e <= 8, "transition %d: bias %.9g vs %.9g (%.3g eps of scale)", t, bias[t], g->bias[t], e);
        if (verbose) printf("  transition %d: bias %.3g eps of scale\n", t, e);
    }
    grpo_loss_stats stats = {0};
    REQUIRE_OK(grpo_guard_loss_terms(GT, g->lnew, g->lold, bias, scale, g->dt, g->adv, g->mask, g->kl, g->eps, g->beta,
                                     g->denom, dl, db, dk, &stats));
    double csum = 0, pol_scale = 0;
    for (int t = 0; t < GT; t++) {
        const double w = -(double)g->dt[t];
        const double gsc = fabs(g->adv[t]) * scale[t] / w / g->denom;
        const double e = fabs(dl[t] - g->dlogp[t]) / (FLT_EPSILON * gsc);
        CHECK_MSG(e <= 16, "transition %d: dlogp %.9g vs %.9g (%.3g eps of scale)", t, dl[t], g->dlogp[t], e);
        CHECK(memcmp(&dl[t], &db[t], 4) == 0);
        CHECK(dk[t] == g->beta / (float)g->denom);
        if (verbose) printf("  transition %d: ratio %.9g, dlogp %.3g eps of scale\n", t, g->ratio[t], e);
        /* per transition: its own call with n = 1 */
        grpo_loss_stats one = {0};
        float d1, b1, k1;
        REQUIRE_OK(grpo_guard_loss_terms(1, &g->lnew[t], &g->lold[t], &bias[t], &scale[t], &g->dt[t], &g->adv[t],
                                         &g->mask[t], &g->kl[t], g->eps, g->beta, g->denom, &d1, &b1, &k1, &one));
        CHECK(memcmp(&d1, &dl[t], 4) == 0);
        const double csc = (fabs(g->adv[t]) * g->ratio[t] / w * g->mask[t] + g->beta * g->kl[t]) / g->denom;
        const double ec = fabs(one.loss - g->contrib[t]) / (FLT_EPSILON * csc);
        CHECK_MSG(ec <= 16, "transition %d: contribution %.9g vs %.9g (%.3g eps of scale)", t, one.loss,
                  g->contrib[t], ec);
        if (verbose) printf("  transition %d: contribution %.3g eps of scale\n", t, ec);
        CHECK(fabs(one.abs_ratio_dev_sum - fabs(g->ratio[t] - 1.0)) <= 16 * FLT_EPSILON);
        csum += csc;
        pol_scale += fabs(g->adv[t]) * g->ratio[t] / w * g->mask[t] / g->denom;
    }
    CHECK(stats.n_transitions == GT && stats.n_clipped == (int64_t)g->totals[3] && stats.n_clipped == 4);
    CHECK_MSG(fabs(stats.loss - g->totals[0]) <= 16 * FLT_EPSILON * csum, "loss %.9g vs %.9g", stats.loss,
              g->totals[0]);
    CHECK_MSG(fabs(stats.policy - g->totals[1]) <= 16 * FLT_EPSILON * pol_scale, "policy %.9g vs %.9g", stats.policy,
              g->totals[1]);
    CHECK_MSG(fabs(stats.kl - g->totals[2]) <= 4 * FLT_EPSILON * g->totals[2], "kl %.9g vs %.9g", stats.kl,
              g->totals[2]);
    double lsum = 0;
    for (int t = 0; t < GT; t++) lsum += fabs((double)g->lnew[t] - g->lold[t]);
    CHECK(stats.abs_logp_diff_sum == lsum); /* without the bias */
    free(g);
}

/* The composed backward: dbias of grpo_guard_loss_terms through flow_sde_backward_v_guard (g_logp = g_kl = 0) gives
 * d loss / d v through the bias = coef_v d loss / d mean_new, against the fixture's float64 d loss / d mean_new. The
 * step comes from flow_step_init of the fixture's (sigma, sigma_next, sigma1, eta), so its std_t and step_std are
 * fp32 (a few eps from the fixture's double sqrt(-dt) std_t). Tolerance: 16 eps of max|coef_v dmean| (measured 2.1:
 * step_std enters squared twice, through the bias's ratio and its gradient 1 / step_std^2); a transition whose
 * gradient is 0 (clipped, masked, first update without drift) gives dv exactly 0. */
TEST(grpo_guard_bias_backward_through_flow) {
    guard_fix *g = malloc(sizeof *g);
    REQUIRE(g);
    load_fixture(g);
    float dv[NE];
    int n_nonzero = 0;
    for (int t = 0; t < GT; t++) {
        const float *p = g->params[t];
        flow_step st;
        REQUIRE_OK(flow_step_init(&st, p[0], p[1], p[2], p[3]));
        CHECK(st.dt == g->dt[t] && fabs(st.std_t - g->std_t[t]) <= 2 * FLT_EPSILON * g->std_t[t]);
        float bias, dl, db;
        REQUIRE_OK(flow_kl(g->mnew[t], g->mold[t], NE, st.step_std, &bias));
        REQUIRE_OK(grpo_guard_loss_terms(1, &g->lnew[t], &g->lold[t], &bias, &st.step_std, &st.dt, &g->adv[t],
                                         &g->mask[t], &g->kl[t], g->eps, g->beta, g->denom, &dl, &db, NULL, NULL));
        REQUIRE_OK(flow_sde_backward_v_guard(&st, g->mnew[t], NULL, NULL, g->mold[t], NE, 0.0f, 0.0f, db, dv));
        double md = 0, err = 0;
        for (int i = 0; i < NE; i++) {
            const double want = (double)st.coef_v * g->dmean[t][i];
            err = fmax(err, fabs(dv[i] - want));
            md = fmax(md, fabs(g->dmean[t][i]));
        }
        const double sc = fabs((double)st.coef_v) * md;
        const double e = md == 0 ? (err == 0 ? 0 : INFINITY) : err / (FLT_EPSILON * sc);
        CHECK_MSG(e <= 16, "transition %d: dv max err %.3g (%.3g eps of scale)", t, err, e);
        if (getenv("VGRPO_VERBOSE")) printf("  transition %d: dv %.3g eps of scale\n", t, e);
        n_nonzero += md > 0;
    }
    CHECK(n_nonzero == 3); /* inside the range (1), unclipped above (3) and below (5); the rest have gradient 0 */
    free(g);
}

/* Double forward of one transition's contribution, as a function of logp_new and bias. */
static double guard_contrib_ref(double lnew, double lold, double bias, double scale, double dt, double adv, int mask,
                                double kl, double eps, double beta, double denom) {
    const double r = exp((lnew - lold + bias) * scale);
    const double rc = fmin(fmax(r, 1.0 - eps), 1.0 + eps);
    const double pol = fmax(-adv * r, -adv * rc) / (-dt);
    return (mask * pol + beta * kl) / denom;
}

/* dlogp and dbias against central differences of that double forward, at random points away from the clip bounds
 * (where the loss has a kink): relative error <= 1e-4 (fp32 ratio, h = 1e-4 / scale). Also the C loss itself
 * equals the double forward within 16 eps of its scale. */
TEST(grpo_guard_matches_finite_differences) {
    enum { n = 40 };
    float lnew[n], lold[n], bias[n], sstd[n], dt[n], adv[n], kl[n], dl[n], db[n];
    uint8_t mask[n];
    test_fill_uniform(lold, n, 71, -3, -1);
    test_fill_uniform(bias, n, 72, 0, 0.05f);
    test_fill_uniform(sstd, n, 73, 0.05f, 0.8f);
    test_fill_uniform(dt, n, 74, -0.2f, -0.01f);
    test_fill_uniform(adv, n, 75, -2, 2);
    test_fill_uniform(kl, n, 76, 0, 0.01f);
    float lr[n];
    test_fill_uniform(lr, n, 77, -0.4f, 0.4f); /* the log of the target ratio */
    const float eps = 0.1f, beta = 0.03f;
    const int64_t denom = 13;
    int checked = 0;
    for (int i = 0; i < n; i++) {
        lnew[i] = lold[i] + lr[i] / sstd[i] - bias[i];
        mask[i] = i % 7 != 3;
    }
    grpo_loss_stats stats = {0};
    REQUIRE_OK(grpo_guard_loss_terms(n, lnew, lold, bias, sstd, dt, adv, mask, kl, eps, beta, denom, dl, db, NULL,
                                     &stats));
    double lref = 0, lsc = 0;
    for (int i = 0; i < n; i++) {
        const double r = exp(((double)lnew[i] - lold[i] + bias[i]) * sstd[i]);
        lref += guard_contrib_ref(lnew[i], lold[i], bias[i], sstd[i], dt[i], adv[i], mask[i], kl[i], eps, beta, denom);
        lsc += (fabs(adv[i]) * r / -dt[i] * mask[i] + beta * kl[i]) / denom;
        if (fabs(r - (1 - eps)) < 1e-3 || fabs(r - (1 + eps)) < 1e-3) continue;
        const double h = 1e-4 / sstd[i];
        double fd[2];
        for (int which = 0; which < 2; which++) {
            const double a = which ? 0 : h, b = which ? h : 0;
            double lp = guard_contrib_ref(lnew[i] + a, lold[i], bias[i] + b, sstd[i], dt[i], adv[i], mask[i], kl[i], eps,
                                          beta, denom);
            double lm = guard_contrib_ref(lnew[i] - a, lold[i], bias[i] - b, sstd[i], dt[i], adv[i], mask[i], kl[i], eps,
                                          beta, denom);
            fd[which] = (lp - lm) / (2 * h);
        }
        const double gsc = fabs(adv[i]) * r * sstd[i] / -dt[i] / denom;
        CHECK_MSG(fabs(dl[i] - fd[0]) <= 1e-4 * gsc, "transition %d: dlogp %.9g vs fd %.9g", i, dl[i], fd[0]);
        CHECK_MSG(fabs(db[i] - fd[1]) <= 1e-4 * gsc, "transition %d: dbias %.9g vs fd %.9g", i, db[i], fd[1]);
        checked++;
    }
    CHECK(checked >= 30);
    CHECK_MSG(fabs(stats.loss - lref) <= 16 * FLT_EPSILON * lsc, "loss %.9g vs double %.9g", stats.loss, lref);
}

/* The first update (logp_new == logp_old, mean_new == mean_old so bias == 0): ratio exactly 1, nothing clipped,
 * dlogp = mask (-A) scale / w / denom bit for bit (w = sqrtf(-dt)^2), policy -A / w. With scale 1 and dt -1 (w 1)
 * the guard is grpo_loss_terms bit for bit, at any ratio. */
TEST(grpo_guard_first_update_ratio_one) {
    enum { n = 12 };
    float lp[n], bias[n], sstd[n], dt[n], adv[n], kl[n], dl[n], db[n], dk[n];
    uint8_t mask[n];
    test_fill_uniform(lp, n, 81, -3, -1);
    test_fill_uniform(sstd, n, 82, 0.05f, 0.8f);
    test_fill_uniform(dt, n, 83, -0.2f, -0.01f);
    test_fill_uniform(adv, n, 84, -2, 2);
    test_fill_uniform(kl, n, 85, 0, 0.01f);
    for (int i = 0; i < n; i++) {
        bias[i] = 0.0f;
        mask[i] = i != 5;
    }
    const int64_t denom = 7;
    const float fden = (float)denom;
    grpo_loss_stats stats = {0};
    REQUIRE_OK(grpo_guard_loss_terms(n, lp, lp, bias, sstd, dt, adv, mask, kl, 0.2f, 0.0f, denom, dl, db, dk, &stats));
    CHECK(stats.abs_ratio_dev_sum == 0.0 && stats.n_clipped == 0 && stats.abs_logp_diff_sum == 0.0);
    double pol = 0;
    for (int i = 0; i < n; i++) {
        const float sq = sqrtf(-dt[i]);
        const float w = sq * sq;
        const float m = mask[i] ? 1.0f : 0.0f;
        const float want = m * -adv[i] * sstd[i] / w / fden;
        CHECK_MSG(memcmp(&dl[i], &want, 4) == 0 && memcmp(&db[i], &want, 4) == 0, "transition %d: %.9g vs %.9g", i,
                  dl[i], want);
        CHECK(dk[i] == 0.0f);
        pol += (double)(m * (-adv[i] / w)) / denom;
    }
    CHECK_NEAR(stats.policy, pol, 1e-12 * fabs(pol) + 1e-15);

    /* scale 1, dt -1: the plain ratio expf(logp_new - logp_old) of grpo_loss_terms */
    float lnew[n], one[n], mone[n], dl2[n], dk2[n];
    test_fill_uniform(lnew, n, 86, -3.2f, -0.8f);
    for (int i = 0; i < n; i++) {
        one[i] = 1.0f;
        mone[i] = -1.0f;
    }
    grpo_loss_stats a = {0}, b = {0};
    REQUIRE_OK(grpo_guard_loss_terms(n, lnew, lp, bias, one, mone, adv, mask, kl, 0.2f, 0.04f, denom, dl, db, dk, &a));
    REQUIRE_OK(grpo_loss_terms(n, lnew, lp, adv, mask, kl, 0.2f, 0.04f, denom, dl2, dk2, &b));
    CHECK(memcmp(dl, dl2, sizeof dl) == 0 && memcmp(dk, dk2, sizeof dk) == 0 && memcmp(&a, &b, sizeof a) == 0);
}

/* Errors name the bad field or transition; nothing is written. */
TEST(grpo_guard_errors) {
    float lp[2] = {-1, -1.1f}, bias[2] = {0, 0.01f}, sstd[2] = {0.3f, 0.2f}, dt[2] = {-0.1f, -0.05f}, adv[2] = {1, -1};
    float kl[2] = {0, 0}, dl[2] = {7, 7}, db[2] = {7, 7};
    uint8_t mask[2] = {1, 1};
    CHECK(grpo_guard_loss_terms(2, lp, lp, NULL, sstd, dt, adv, mask, kl, 0.2f, 0, 4, dl, db, NULL, NULL) == -1 &&
          strstr(core_last_error(), "bias"));
    CHECK(grpo_guard_loss_terms(2, lp, lp, bias, NULL, dt, adv, mask, kl, 0.2f, 0, 4, dl, db, NULL, NULL) == -1);
    CHECK(grpo_guard_loss_terms(2, lp, lp, bias, sstd, NULL, adv, mask, kl, 0.2f, 0, 4, dl, db, NULL, NULL) == -1);
    float bad_std[2] = {0.3f, 0.0f};
    CHECK(grpo_guard_loss_terms(2, lp, lp, bias, bad_std, dt, adv, mask, kl, 0.2f, 0, 4, dl, db, NULL, NULL) == -1 &&
          strstr(core_last_error(), "transition 1") && strstr(core_last_error(), "step std"));
    float bad_dt[2] = {0.0f, -0.05f};
    CHECK(grpo_guard_loss_terms(2, lp, lp, bias, sstd, bad_dt, adv, mask, kl, 0.2f, 0, 4, dl, db, NULL, NULL) == -1 &&
          strstr(core_last_error(), "transition 0") && strstr(core_last_error(), "dt"));
    float bad_bias[2] = {0, NAN};
    CHECK(grpo_guard_loss_terms(2, lp, lp, bad_bias, sstd, dt, adv, mask, kl, 0.2f, 0, 4, dl, db, NULL, NULL) == -1 &&
          strstr(core_last_error(), "transition 1") && strstr(core_last_error(), "bias"));
    CHECK(grpo_guard_loss_terms(2, lp, lp, bias, sstd, dt, adv, mask, kl, 0.0f, 0, 4, dl, db, NULL, NULL) == -1 &&
          strstr(core_last_error(), "algorithm.clip_range"));
    CHECK(grpo_guard_loss_terms(2, lp, lp, bias, sstd, dt, adv, mask, NULL, 0.2f, 0.1f, 4, dl, db, NULL, NULL) == -1 &&
          strstr(core_last_error(), "beta"));
    CHECK(grpo_guard_loss_terms(2, lp, lp, bias, sstd, dt, adv, mask, kl, 0.2f, 0, 0, dl, db, NULL, NULL) == -1 &&
          strstr(core_last_error(), "denominator"));
    CHECK(dl[0] == 7 && dl[1] == 7 && db[0] == 7 && db[1] == 7);
    /* n == 0 needs no per-transition arrays */
    grpo_loss_stats s = {0};
    REQUIRE_OK(grpo_guard_loss_terms(0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0.2f, 0, 4, NULL, NULL, NULL, &s));
    CHECK(s.n_transitions == 0);
}
