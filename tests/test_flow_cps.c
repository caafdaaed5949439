/* tests/test_flow_cps.c — the step kinds of model/flow/flow.h: Flow-GRPO's coefficients-preserving (cps) step with
 * both log-prob modes and the GRPO-Guard bias term of the backward, against float64 numpy (tests/fixtures/
 * algo_cps_guard.safetensors, scripts/fixtures_algo.py); the default kind bit for bit the existing "sde" functions;
 * the cps last step; the reference's per-element fp32 form of the cps mean against our coefficient form; errors. */
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/safetensors.h"
#include "core/tensor.h"
#include "model/flow/flow.h"
#include "tests/test.h"

#define ALGO_FIXTURE "tests/fixtures/algo_cps_guard.safetensors"
#define NE 64 /* elements per latent in the fixture */

/* A float64 reference stored bit for bit as I64 (scripts/fixtures_algo.py), into dst[0..n). */
static void read_f64(const st_file *f, const char *name, double *dst, int64_t n) {
    core_tensor t;
    REQUIRE_OK(st_get(f, name, &t));
    CHECK_MSG(t.dtype == CORE_I64 && core_tensor_numel(&t) == n, "%s: I64 [%lld] expected", name, (long long)n);
    if (t.dtype == CORE_I64 && core_tensor_numel(&t) == n) memcpy(dst, t.data, sizeof(double) * (size_t)n);
    core_tensor_free(&t);
}

static double max_abs(const double *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

/* max_i |a_i - b_i| in units of FLT_EPSILON * scale. */
static double err_ulps(const float *a, const double *b, int64_t n, double scale) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m) m = d;
    }
    return m / (FLT_EPSILON * scale);
}

/* The cps step against float64 numpy, in both log-prob modes. Every tolerance is K fp32 epsilons of the value's
 * natural scale, the sum of the magnitudes of the terms that form it (so cancellation cannot hide an error):
 *   s, coef_x                  K = 2 of the value (one rounding each after the double sine)
 *   coef_v = c (1 - sigma) - sigma (1 - sigma_next)            K = 4 of |c (1 - sigma)| + |sigma (1 - sigma_next)|
 *   mean, x_next (elementwise) K = 8 of max_i (|coef_x x_i| + (|c (1 - sigma)| + |sigma (1 - sigma_next)|) |v_i|
 *                              (+ s |eps_i| for x_next))                                   measured <= 1.5
 *   log-probs                  K = 16 of |quadratic term| (+ |log s| + log sqrt(2 pi) in the exact mode): 64 fp32
 *                              squares of differences of rounded latents summed in fp32     measured <= 2.5
 *   KL                         K = 8 of KL + max|mean| max|mean - mean_ref| / s^2 (the fp32 mean is rounded once,
 *                              and enters through its difference to mean_ref)               measured <= 0.01
 *   dv                         K = 8 of max|dv| + |coef_v| max|mean| (|g_logp| + |g_kl|) / (s^2 n)  measured <= 0.8
 * Measured errors are printed in those units when VGRPO_VERBOSE is set. */
TEST(flow_cps_matches_numpy) {
    st_file *f = st_open(ALGO_FIXTURE);
    REQUIRE_OK(f == NULL);
    float x[NE], v[NE], eps[NE], given[NE], mref[NE], mean[NE], mean2[NE], xn[NE], dv[NE];
    double mean_r[NE], xn_r[NE], dv_r[NE], ref[8];
    REQUIRE_OK(st_read_f32(f, "cps.x", x, NE));
    REQUIRE_OK(st_read_f32(f, "cps.v", v, NE));
    REQUIRE_OK(st_read_f32(f, "cps.eps", eps, NE));
    const char *nc = st_metadata(f, "cps_cases");
    REQUIRE(nc != NULL);
    const int ncase = atoi(nc);
    REQUIRE(ncase == 5);
    const int verbose = getenv("VGRPO_VERBOSE") != NULL;
    int n_last = 0, n_trained = 0;
    for (int k = 0; k < ncase; k++) {
        char key[64];
        float p[5];
        snprintf(key, sizeof key, "cps.case%d.params", k);
        REQUIRE_OK(st_read_f32(f, key, p, 5));
        const float sigma = p[0], sigma_next = p[1], eta = p[2], g_logp = p[3], g_kl = p[4];
        snprintf(key, sizeof key, "cps.case%d.x_given", k);
        REQUIRE_OK(st_read_f32(f, key, given, NE));
        snprintf(key, sizeof key, "cps.case%d.mean_ref", k);
        REQUIRE_OK(st_read_f32(f, key, mref, NE));
        snprintf(key, sizeof key, "cps.case%d.ref.f64", k);
        read_f64(f, key, ref, 8);
        snprintf(key, sizeof key, "cps.case%d.mean.f64", k);
        read_f64(f, key, mean_r, NE);
        snprintf(key, sizeof key, "cps.case%d.x_next.f64", k);
        read_f64(f, key, xn_r, NE);
        const double s = ref[0];

        for (int mode = 0; mode < 2; mode++) {
            const flow_kind kind = {FLOW_CPS, mode ? FLOW_LOGP_FLOW_GRPO : FLOW_LOGP_EXACT};
            flow_step st;
            REQUIRE_OK(flow_sde_step_kind(kind, x, v, eps, NULL, NE, sigma, sigma_next, 0.5f, eta, mean, xn, &st));
            CHECK(st.kind.type == FLOW_CPS && st.kind.logp == kind.logp);
            CHECK(st.dt == sigma_next - sigma && st.std_t == st.step_std);
            CHECK_MSG(fabs(st.step_std - s) <= 2 * FLT_EPSILON * s, "case %d s %.9g vs %.9g", k, st.step_std, s);
            CHECK_MSG(fabs(st.coef_x - ref[1]) <= 2 * FLT_EPSILON * fabs(ref[1]), "case %d coef_x %.9g vs %.9g", k,
                      st.coef_x, ref[1]);
            const double c = sqrt(fmax((double)sigma_next * sigma_next - s * s, 0.0));
            const double cv_scale = fabs(c * (1.0 - sigma)) + fabs((double)sigma * (1.0 - sigma_next));
            CHECK_MSG(fabs(st.coef_v - ref[2]) <= 4 * FLT_EPSILON * cv_scale, "case %d coef_v %.9g vs %.9g", k,
                      st.coef_v, ref[2]);
            double msc = 0, xsc = 0;
            for (int i = 0; i < NE; i++) {
                double t = fabs(ref[1] * x[i]) + cv_scale * fabs(v[i]);
                msc = fmax(msc, t);
                xsc = fmax(xsc, t + s * fabs(eps[i]));
            }
            const double em = err_ulps(mean, mean_r, NE, msc), ex = err_ulps(xn, xn_r, NE, xsc);
            CHECK_MSG(em <= 8, "case %d mean: %.3g eps of scale", k, em);
            CHECK_MSG(ex <= 8, "case %d x_next: %.3g eps of scale", k, ex);
            if (verbose) printf("  case %d mode %d: mean %.3g, x_next %.3g eps of scale\n", k, mode, em, ex);

            if (s == 0.0) { /* the last step: an ODE step, no log-prob */
                CHECK(sigma_next == 0.0f && !st.has_std && !st.has_logp && st.logp == 0.0f);
                n_last++;
                continue;
            }
            CHECK(st.has_std && st.has_logp);
            /* rollout log-prob of its own x_next, then the trainer's of x_given (mean bitwise the rollout's) */
            flow_step tr;
            REQUIRE_OK(flow_sde_step_kind(kind, x, v, NULL, given, NE, sigma, sigma_next, 0.5f, eta, mean2, NULL, &tr));
            CHECK(tr.has_logp && memcmp(mean, mean2, sizeof mean) == 0);
            for (int g = 0; g < 2; g++) {
                const float got = g ? tr.logp : st.logp;
                const double want = ref[3 + 2 * g + mode];
                double sq = 0;
                for (int i = 0; i < NE; i++) {
                    double xv = g ? (double)given[i] : xn_r[i];
                    sq += (xv - mean_r[i]) * (xv - mean_r[i]);
                }
                const double quad = mode ? sq / NE : sq / NE / (2 * s * s);
                const double scale = mode ? quad : quad + fabs(log(s)) + 0.9189385332046727;
                const double e = fabs(got - want) / (FLT_EPSILON * scale);
                CHECK_MSG(e <= 16, "case %d mode %d %s logp %.9g vs %.9g: %.3g eps of scale", k, mode,
                          g ? "given" : "rollout", got, want, e);
                if (verbose) printf("  case %d mode %d %s logp: %.3g eps of scale\n", k, mode, g ? "given" : "rollout", e);
            }
            /* KL to the reference model's mean, std s */
            float kl;
            REQUIRE_OK(flow_kl(mean, mref, NE, st.step_std, &kl));
            double dm = 0, mm = 0;
            for (int i = 0; i < NE; i++) {
                dm = fmax(dm, fabs(mean_r[i] - mref[i]));
                mm = fmax(mm, fabs(mean_r[i]));
            }
            const double kl_scale = mm * dm / (s * s) + ref[7];
            const double ekl = fabs(kl - ref[7]) / (FLT_EPSILON * kl_scale);
            CHECK_MSG(ekl <= 8, "case %d KL %.9g vs %.9g: %.3g", k, kl, ref[7], ekl);
            /* backward of g_logp logp(x_given) + g_kl KL with respect to v */
            snprintf(key, sizeof key, "cps.case%d.%s.f64", k, mode ? "dv_flow_grpo" : "dv_exact");
            read_f64(f, key, dv_r, NE);
            REQUIRE_OK(flow_sde_backward_v_guard(&tr, mean2, given, mref, NULL, NE, g_logp, g_kl, 0.0f, dv));
            const double dv_scale = max_abs(dv_r, NE) + fabs(ref[2]) * mm / (s * s * NE) * (fabs(g_logp) + fabs(g_kl));
            const double edv = err_ulps(dv, dv_r, NE, dv_scale);
            CHECK_MSG(edv <= 8, "case %d mode %d dv: %.3g eps of scale", k, mode, edv);
            if (verbose) printf("  case %d mode %d KL %.3g, dv %.3g eps of scale\n", k, mode, ekl, edv);
            n_trained++;
        }
    }
    CHECK(n_last == 2 && n_trained == 8);
    st_close(f);
}

/* The cps last step (sigma_next 0): s = 0, coef_x 1, coef_v -sigma, the mean is x - sigma v bit for bit, no
 * log-prob (logp exactly 0) in either mode and whichever way x_next comes; backward and KL refuse it. */
TEST(flow_cps_last_step_is_x_minus_sigma_v) {
    enum { n = 500 };
    float x[n], v[n], eps[n], xn[n], mean[n], dv[n];
    test_fill_uniform(x, n, 31, -2, 2);
    test_fill_uniform(v, n, 32, -2, 2);
    test_fill_uniform(eps, n, 33, -3, 3);
    const float sig[3] = {0.05f, 0.3f, 1.0f};
    for (int c = 0; c < 3; c++) {
        for (int mode = 0; mode < 2; mode++) {
            const flow_kind kind = {FLOW_CPS, mode ? FLOW_LOGP_FLOW_GRPO : FLOW_LOGP_EXACT};
            flow_step st;
            REQUIRE_OK(flow_sde_step_kind(kind, x, v, eps, NULL, n, sig[c], 0.0f, 0.9f, 0.7f, mean, xn, &st));
            CHECK(!st.has_std && !st.has_logp && st.logp == 0.0f && st.step_std == 0.0f);
            CHECK(st.coef_x == 1.0f && st.coef_v == -sig[c]);
            int bad = 0;
            for (int i = 0; i < n; i++) {
                volatile float sv = sig[c] * v[i];
                volatile float want = x[i] - sv;
                if (memcmp(&mean[i], (const void *)&want, 4) || mean[i] != xn[i]) bad++;
            }
            CHECK_MSG(bad == 0, "sigma %g mode %d: %d elements differ from x - sigma v", sig[c], mode, bad);
            REQUIRE_OK(flow_sde_step_kind(kind, x, v, NULL, xn, n, sig[c], 0.0f, 0.9f, 0.7f, mean, NULL, &st));
            CHECK(!st.has_logp && st.logp == 0.0f);
            CHECK(flow_sde_backward_v_guard(&st, mean, xn, NULL, NULL, n, 1.0f, 0.0f, 0.0f, dv) == -1 &&
                  strstr(core_last_error(), "std 0"));
            float kl = 3;
            CHECK(flow_kl(mean, x, n, st.step_std, &kl) == -1 && kl == 3);
        }
    }
    /* eta 0 on an interior step is also an ODE step: x_next = mean, no log-prob */
    flow_step st;
    REQUIRE_OK(flow_sde_step_kind((flow_kind){FLOW_CPS, FLOW_LOGP_EXACT}, x, v, eps, NULL, n, 0.6f, 0.5f, 0.9f, 0.0f,
                                  mean, xn, &st));
    CHECK(!st.has_std && !st.has_logp && memcmp(mean, xn, sizeof mean) == 0);
}

/* The default kind is the "sde" step bit for bit: flow_step_init == flow_step_init_kind(default) (whole struct,
 * kind included), flow_sde_step == flow_sde_step_kind(default) in all three ways of getting x_next (outputs and
 * struct), over two reduction chunks; flow_sde_backward_v == flow_sde_backward_v_guard with g_bias 0 (mean_old NULL
 * or given), for every combination of the two other terms. */
TEST(flow_cps_default_kind_is_sde_bitwise) {
    enum { n = 5000 };
    float *buf = malloc(sizeof(float) * n * 12);
    REQUIRE(buf);
    float *x = buf, *v = x + n, *eps = v + n, *m1 = eps + n, *m2 = m1 + n, *x1 = m2 + n, *x2 = x1 + n;
    float *mref = x2 + n, *mold = mref + n, *dv1 = mold + n, *dv2 = dv1 + n, *xr = dv2 + n;
    test_fill_uniform(x, n, 41, -2, 2);
    test_fill_uniform(v, n, 42, -2, 2);
    test_fill_uniform(eps, n, 43, -3, 3);
    test_fill_uniform(mref, n, 44, -2, 2);
    test_fill_uniform(mold, n, 45, -2, 2);
    float s[21];
    REQUIRE_OK(flow_schedule(20, 5.0, s, NULL));
    const flow_kind def = flow_kind_default();
    CHECK(def.type == FLOW_SDE && def.logp == FLOW_LOGP_EXACT);
    const float etas[3] = {0.7f, 1.0f, 0.0f};
    int n_cmp = 0;
    for (int i = 0; i < 20; i += 3) {
        for (int e = 0; e < 3; e++) {
            flow_step a, b;
            memset(&a, 0x5a, sizeof a);
            memset(&b, 0xa5, sizeof b);
            REQUIRE_OK(flow_step_init(&a, s[i], s[i + 1], s[1], etas[e]));
            REQUIRE_OK(flow_step_init_kind(&b, def, s[i], s[i + 1], s[1], etas[e]));
            CHECK(memcmp(&a, &b, sizeof a) == 0 && a.kind.type == FLOW_SDE && a.kind.logp == FLOW_LOGP_EXACT);
            for (int way = 0; way < 3; way++) {
                const float *ep = way == 0 ? eps : NULL;
                const float *given = way == 1 ? xr : NULL; /* the rollout's x_next of way 0 */
                memset(&a, 0x5a, sizeof a);
                memset(&b, 0xa5, sizeof b);
                REQUIRE_OK(flow_sde_step(x, v, ep, given, n, s[i], s[i + 1], s[1], etas[e], m1, x1, &a));
                REQUIRE_OK(flow_sde_step_kind(def, x, v, ep, given, n, s[i], s[i + 1], s[1], etas[e], m2,
                                              way == 1 ? x1 : x2, &b));
                CHECK_MSG(memcmp(&a, &b, sizeof a) == 0 && memcmp(m1, m2, sizeof(float) * n) == 0,
                          "step %d eta %g way %d: struct or mean differs", i, etas[e], way);
                if (way != 1) CHECK(memcmp(x1, x2, sizeof(float) * n) == 0);
                if (way == 0) memcpy(xr, x1, sizeof(float) * n);
                n_cmp++;
            }
            flow_step st;
            REQUIRE_OK(flow_sde_step(x, v, NULL, xr, n, s[i], s[i + 1], s[1], etas[e], m1, NULL, &st));
            if (!st.has_std) continue;
            const float g[4][2] = {{0.37f, 2.5f}, {-1.3f, 0.0f}, {0.0f, 0.8f}, {1e-3f, -7.0f}};
            for (int gi = 0; gi < 4; gi++) {
                REQUIRE_OK(flow_sde_backward_v(&st, m1, xr, mref, n, g[gi][0], g[gi][1], dv1));
                REQUIRE_OK(flow_sde_backward_v_guard(&st, m1, xr, mref, NULL, n, g[gi][0], g[gi][1], 0.0f, dv2));
                CHECK(memcmp(dv1, dv2, sizeof(float) * n) == 0);
                REQUIRE_OK(flow_sde_backward_v_guard(&st, m1, xr, mref, mold, n, g[gi][0], g[gi][1], 0.0f, dv2));
                CHECK(memcmp(dv1, dv2, sizeof(float) * n) == 0);
                n_cmp++;
            }
        }
    }
    CHECK(n_cmp == 7 * 3 * 3 + 7 * 2 * 4);
    free(buf);
}

/* Double forward of the guard backward's loss L(v) = g_logp logp + g_kl KL(mean, mean_ref) + g_bias KL(mean,
 * mean_old) of a step, mean = coef_x x + coef_v v, with the step's log-prob mode. */
static double guard_loss_ref(const flow_step *st, const float *x, const double *v, const float *xn, const float *mref,
                             const float *mold, int n, double gl, double gk, double gb) {
    const double var = (double)st->step_std * st->step_std;
    double sq = 0, kq = 0, bq = 0;
    for (int i = 0; i < n; i++) {
        double m = (double)st->coef_x * x[i] + (double)st->coef_v * v[i];
        sq += (xn[i] - m) * (xn[i] - m);
        kq += (m - mref[i]) * (m - mref[i]);
        bq += (m - mold[i]) * (m - mold[i]);
    }
    const double logp = st->kind.logp == FLOW_LOGP_FLOW_GRPO
                            ? -sq / n
                            : -sq / n / (2 * var) - log((double)st->step_std) - 0.5 * log(2 * M_PI);
    return gl * logp + gk * kq / n / (2 * var) + gb * bq / n / (2 * var);
}

/* flow_sde_backward_v_guard against central differences of that double forward (quadratic in v: exact up to
 * rounding), relative L2 error <= 1e-5, for sde and cps steps, both log-prob modes, each term alone and together. */
TEST(flow_cps_guard_backward_matches_finite_differences) {
    enum { n = 80 };
    float x[n], v[n], vo[n], vr[n], eps[n], xn[n], mean[n], mold[n], mref[n], dv[n];
    double vd[n];
    test_fill_uniform(x, n, 51, -1, 1);
    test_fill_uniform(v, n, 52, -1, 1);
    test_fill_uniform(vo, n, 53, -1, 1);
    test_fill_uniform(vr, n, 54, -1, 1);
    test_fill_uniform(eps, n, 55, -2, 2);
    const flow_kind kinds[3] = {{FLOW_SDE, FLOW_LOGP_EXACT}, {FLOW_CPS, FLOW_LOGP_EXACT}, {FLOW_CPS, FLOW_LOGP_FLOW_GRPO}};
    const float steps[3][3] = {{1.0f, 0.93f, 0.7f}, {0.6f, 0.5f, 1.0f}, {0.2f, 0.1f, 0.3f}};
    const float g[4][3] = {{0.37f, 0.0f, 0.0f}, {0.0f, 0.8f, 0.0f}, {0.0f, 0.0f, -1.9f}, {-1.3f, 0.6f, 2.2f}};
    for (int kk = 0; kk < 3; kk++) {
        for (int c = 0; c < 3; c++) {
            flow_step st, so, sr;
            const float *p = steps[c];
            REQUIRE_OK(flow_sde_step_kind(kinds[kk], x, vo, eps, NULL, n, p[0], p[1], 0.93f, p[2], mold, xn, &so));
            REQUIRE_OK(flow_sde_step_kind(kinds[kk], x, vr, NULL, NULL, n, p[0], p[1], 0.93f, p[2], mref, NULL, &sr));
            REQUIRE_OK(flow_sde_step_kind(kinds[kk], x, v, NULL, xn, n, p[0], p[1], 0.93f, p[2], mean, NULL, &st));
            REQUIRE(st.has_std);
            for (int gi = 0; gi < 4; gi++) {
                REQUIRE_OK(flow_sde_backward_v_guard(&st, mean, g[gi][0] ? xn : NULL, g[gi][1] ? mref : NULL,
                                                     g[gi][2] ? mold : NULL, n, g[gi][0], g[gi][1], g[gi][2], dv));
                double num = 0, den = 0;
                for (int i = 0; i < n; i++) vd[i] = v[i];
                for (int i = 0; i < n; i++) {
                    const double h = 1e-3;
                    vd[i] = v[i] + h;
                    double lp = guard_loss_ref(&st, x, vd, xn, mref, mold, n, g[gi][0], g[gi][1], g[gi][2]);
                    vd[i] = v[i] - h;
                    double lm = guard_loss_ref(&st, x, vd, xn, mref, mold, n, g[gi][0], g[gi][1], g[gi][2]);
                    vd[i] = v[i];
                    double fd = (lp - lm) / (2 * h);
                    num += (dv[i] - fd) * (dv[i] - fd);
                    den += fd * fd;
                }
                CHECK_MSG(den > 0 && sqrt(num / den) <= 1e-5, "kind %d step %d grads %d: rel L2 %.3g", kk, c, gi,
                          sqrt(num / den));
            }
        }
    }
}

/* The reference computes the cps mean per element in fp32 (torch: x0 = x - sigma v, x1 = x + v (1 - sigma),
 * mean = x0 (1 - sigma_next) + x1 c); we form coef_x x + coef_v v. The two differ by rounding only: measured here on
 * a 20-step shift-3 schedule at eta 0.3 / 0.7 / 1.0, max |ours - theirs| <= 8 eps of max(|coef_x x| + |c (1 - sigma)
 * v| + |sigma (1 - sigma_next) v|) (printed with VGRPO_VERBOSE). */
TEST(flow_cps_coefficient_form_vs_reference_form) {
    enum { n = 4000 };
    float *x = malloc(sizeof(float) * n * 3), *v = x + n, *mean = v + n;
    REQUIRE(x);
    test_fill_uniform(x, n, 61, -3, 3);
    test_fill_uniform(v, n, 62, -3, 3);
    float s[21];
    REQUIRE_OK(flow_schedule(20, 3.0, s, NULL));
    const float etas[3] = {0.3f, 0.7f, 1.0f};
    double worst = 0;
    for (int i = 0; i < 20; i++) {
        for (int e = 0; e < 3; e++) {
            flow_step st;
            REQUIRE_OK(flow_sde_step_kind((flow_kind){FLOW_CPS, FLOW_LOGP_EXACT}, x, v, NULL, NULL, n, s[i], s[i + 1],
                                          0.9f, etas[e], mean, NULL, &st));
            const float sn = s[i + 1], sg = s[i];
            const float sd = sn * (float)sin((double)etas[e] * M_PI / 2.0);
            volatile float c2 = sn * sn - sd * sd;
            const float c = sqrtf(c2 > 0 ? c2 : 0);
            double md = 0, sc = 0;
            for (int j = 0; j < n; j++) {
                volatile float sv = sg * v[j];
                volatile float x0 = x[j] - sv;
                volatile float vv = v[j] * (1.0f - sg);
                volatile float x1 = x[j] + vv;
                volatile float a = x0 * (1.0f - sn), b = x1 * c;
                volatile float ref = a + b;
                md = fmax(md, fabs((double)mean[j] - ref));
                sc = fmax(sc, fabs((double)st.coef_x * x[j]) + (fabs((double)c * (1.0 - sg)) +
                                                                fabs((double)sg * (1.0 - sn))) * fabs(v[j]));
            }
            const double u = md / (FLT_EPSILON * sc);
            CHECK_MSG(u <= 8, "step %d eta %g: %.3g eps of scale", i, etas[e], u);
            worst = fmax(worst, u);
        }
    }
    if (getenv("VGRPO_VERBOSE")) printf("  cps mean, coefficient vs per-element fp32 form: max %.3g eps of scale\n", worst);
    free(x);
}

/* Errors name the setting. */
TEST(flow_cps_errors) {
    flow_step st;
    memset(&st, 0x11, sizeof st);
    flow_step keep = st;
    CHECK(flow_step_init_kind(&st, (flow_kind){FLOW_SDE, FLOW_LOGP_FLOW_GRPO}, 0.5f, 0.4f, 0.9f, 0.7f) == -1 &&
          strstr(core_last_error(), "algorithm.cps_logprob") && strstr(core_last_error(), "cps only"));
    CHECK(flow_step_init_kind(&st, (flow_kind){FLOW_CPS, FLOW_LOGP_EXACT}, 0.5f, 0.4f, 0.9f, 1.1f) == -1 &&
          strstr(core_last_error(), "rollout.eta") && strstr(core_last_error(), "[0, 1]"));
    CHECK(flow_step_init_kind(&st, (flow_kind){(flow_sde_type)7, FLOW_LOGP_EXACT}, 0.5f, 0.4f, 0.9f, 0.7f) == -1 &&
          strstr(core_last_error(), "sde_type"));
    CHECK(flow_step_init_kind(&st, (flow_kind){FLOW_CPS, (flow_logp_mode)5}, 0.5f, 0.4f, 0.9f, 0.7f) == -1 &&
          strstr(core_last_error(), "cps_logprob"));
    CHECK(flow_step_init_kind(&st, (flow_kind){FLOW_CPS, FLOW_LOGP_EXACT}, 0.5f, 0.5f, 0.9f, 0.7f) == -1 &&
          strstr(core_last_error(), "sigma_next"));
    CHECK(flow_step_init_kind(&st, (flow_kind){FLOW_CPS, FLOW_LOGP_EXACT}, 0.5f, 0.4f, 0.9f, NAN) == -1 &&
          strstr(core_last_error(), "eta"));
    CHECK(memcmp(&st, &keep, sizeof st) == 0); /* nothing written on error */
    /* eta 1 is allowed (s = sigma_next, c = 0); sigma1 is not looked at by cps, even at sigma 1 */
    REQUIRE_OK(flow_step_init_kind(&st, (flow_kind){FLOW_CPS, FLOW_LOGP_EXACT}, 1.0f, 0.9f, 1.0f, 1.0f));
    CHECK(st.step_std == 0.9f && st.coef_x == 1.0f - 0.9f && st.kind.type == FLOW_CPS);
    float a[4] = {1, 2, 3, 4}, b[4], dv[4];
    CHECK(flow_sde_step_kind((flow_kind){FLOW_SDE, FLOW_LOGP_FLOW_GRPO}, a, a, NULL, a, 4, 0.5f, 0.4f, 0.9f, 0.7f, b,
                             NULL, &st) == -1 && strstr(core_last_error(), "cps only"));
    REQUIRE_OK(flow_sde_step_kind((flow_kind){FLOW_CPS, FLOW_LOGP_FLOW_GRPO}, a, a, NULL, a, 4, 0.5f, 0.4f, 0.9f,
                                  0.7f, b, NULL, &st));
    CHECK(flow_sde_backward_v_guard(&st, b, a, NULL, NULL, 4, 1.0f, 0.0f, 0.5f, dv) == -1 &&
          strstr(core_last_error(), "mean_old"));
    CHECK(flow_sde_backward_v_guard(&st, b, a, NULL, a, 4, 1.0f, 0.0f, NAN, dv) == -1 &&
          strstr(core_last_error(), "finite"));
    CHECK(flow_sde_backward_v_guard(&st, b, a, NULL, a, 4, 1.0f, 0.0f, INFINITY, dv) == -1 &&
          strstr(core_last_error(), "flow_sde_backward_v_guard"));
}
