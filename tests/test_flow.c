/* tests/test_flow.c — model/flow and core/reduce: the schedule against diffusers (fixture), the SDE step, log-prob
 * and KL against float64 numpy (fixture from scripts/fixtures_flow.py), the ODE (eta 0) edge, rollout/trainer
 * log-prob parity, thread invariance, the fixed reduction order, and the backward against finite differences of a
 * double-precision forward written here. */
#include <float.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/reduce.h"
#include "core/safetensors.h"
#include "model/flow/flow.h"
#include "tests/test.h"

#define SCHED_FIXTURE "tests/fixtures/flow_schedule.safetensors"
#define SDE_FIXTURE "tests/fixtures/flow_sde.safetensors"

/* Schedule: bitwise equal to diffusers' FlowMatchEulerDiscreteScheduler for every stored (N, shift). */
TEST(flow_schedule_matches_diffusers) {
    st_file *f = st_open(SCHED_FIXTURE);
    REQUIRE_OK(f == NULL);
    const char *cases = st_metadata(f, "cases");
    REQUIRE(cases != NULL);
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", cases);
    int ncase = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
        int N = atoi(tok);
        const char *comma = strchr(tok, ',');
        REQUIRE(comma != NULL && N >= 1 && N <= 100);
        double shift = strtod(comma + 1, NULL);
        char name[128];
        float want_s[101], want_t[100], got_s[101], got_t[100];
        snprintf(name, sizeof name, "sched.N%d.s%s.sigmas", N, comma + 1);
        REQUIRE_OK(st_read_f32(f, name, want_s, N + 1));
        snprintf(name, sizeof name, "sched.N%d.s%s.timesteps", N, comma + 1);
        REQUIRE_OK(st_read_f32(f, name, want_t, N));
        REQUIRE_OK(flow_schedule(N, shift, got_s, got_t));
        for (int j = 0; j <= N; j++)
            CHECK_MSG(memcmp(&got_s[j], &want_s[j], 4) == 0, "N %d shift %g sigma[%d]: %.9g vs diffusers %.9g", N,
                      shift, j, got_s[j], want_s[j]);
        for (int j = 0; j < N; j++)
            CHECK_MSG(memcmp(&got_t[j], &want_t[j], 4) == 0, "N %d shift %g timestep[%d]: %.9g vs diffusers %.9g", N,
                      shift, j, got_t[j], want_t[j]);
        CHECK(got_s[0] == 1.0f && got_s[N] == 0.0f);
        ncase++;
    }
    CHECK(ncase == 24);
    st_close(f);
}

/* Hand-checked values: shift 1 is linspace(1, 0.001, N); shift 3, N = 2: sigma_1 = f(f(0.001)) in double. */
TEST(flow_schedule_values_and_errors) {
    float s[11], t[10];
    REQUIRE_OK(flow_schedule(10, 1.0, s, t));
    for (int j = 0; j < 10; j++) CHECK_NEAR(s[j], 1.0 - j * 0.999 / 9.0, 1e-7);
    CHECK(s[10] == 0.0f);
    REQUIRE_OK(flow_schedule(2, 3.0, s, NULL));
    double u = 3.0 * 0.001 / (1.0 + 2.0 * 0.001), w = 3.0 * u / (1.0 + 2.0 * u);
    CHECK_NEAR(s[1], w, 1e-9);
    CHECK(s[0] == 1.0f && s[2] == 0.0f);
    REQUIRE_OK(flow_schedule(1, 5.0, s, t));
    CHECK(s[0] == 1.0f && s[1] == 0.0f && t[0] == 1000.0f);
    CHECK(flow_schedule(0, 3.0, s, t) == -1 && strstr(core_last_error(), "steps"));
    CHECK(flow_schedule(10, 0.0, s, t) == -1 && strstr(core_last_error(), "shift"));
    CHECK(flow_schedule(10, NAN, s, t) == -1 && strstr(core_last_error(), "shift"));
    /* Wan 2.2 boundary 0.875: timestep 875 is high noise (>=), just below is low noise. */
    CHECK(flow_expert(875.0f, 0.875) == 0 && flow_expert(874.99994f, 0.875) == 1 && flow_expert(999.0f, 0.875) == 0);
}

static double meta_num(const st_file *f, const char *key) {
    const char *s = st_metadata(f, key);
    if (!s) {
        test_fail(__FILE__, __LINE__, "fixture metadata %s missing", key);
        return NAN;
    }
    return strtod(s, NULL);
}

static double max_rel(const float *a, const float *b, int64_t n) {
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md) md = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return md / mb;
}

/* SDE step against float64 numpy. Tolerances: elementwise mean/x_next max|a-b|/max|b| <= 1e-6 (a few fp32 ulps);
 * std_t, step_std relative 1e-6; log-probs |a-b| <= 1e-5 * max(1, |b|) (fp32 sums of 5000 terms; observed <= 1.1e-6);
 * KL relative 2e-5 (a mean of squares of differences of two fp32 means that differ by ~1e-3 to 1e-2, each
 * difference carrying a relative rounding error up to ~1e-4; observed <= 1.3e-6 after averaging). */
TEST(flow_sde_matches_numpy) {
    st_file *f = st_open(SDE_FIXTURE);
    REQUIRE_OK(f == NULL);
    const int64_t n = 5000;
    float *buf = malloc(sizeof(float) * n * 12);
    REQUIRE(buf);
    float *x = buf, *v = x + n, *v_old = v + n, *eps = v_old + n, *given = eps + n, *mean = given + n;
    float *xn = mean + n, *mean_old = xn + n, *mean2 = mean_old + n, *head = mean2 + n;
    REQUIRE_OK(st_read_f32(f, "x", x, n));
    REQUIRE_OK(st_read_f32(f, "v", v, n));
    REQUIRE_OK(st_read_f32(f, "v_old", v_old, n));
    REQUIRE_OK(st_read_f32(f, "eps", eps, n));
    int ncase = (int)meta_num(f, "cases");
    REQUIRE(ncase == 4);
    for (int k = 0; k < ncase; k++) {
        char key[64];
        float p[4];
        snprintf(key, sizeof key, "case%d.params", k);
        REQUIRE_OK(st_read_f32(f, key, p, 4));
        snprintf(key, sizeof key, "case%d.x_given", k);
        REQUIRE_OK(st_read_f32(f, key, given, n));
        flow_step st;
        REQUIRE_OK(flow_sde_step(x, v, eps, NULL, n, p[0], p[1], p[2], p[3], mean, xn, &st));
        CHECK(st.has_std && st.has_logp);
        snprintf(key, sizeof key, "case%d.mean_head", k);
        REQUIRE_OK(st_read_f32(f, key, head, 512));
        CHECK_MSG(max_rel(mean, head, 512) <= 1e-6, "case %d mean rel err %.3g", k, max_rel(mean, head, 512));
        snprintf(key, sizeof key, "case%d.x_next_head", k);
        REQUIRE_OK(st_read_f32(f, key, head, 512));
        CHECK_MSG(max_rel(xn, head, 512) <= 1e-6, "case %d x_next rel err %.3g", k, max_rel(xn, head, 512));
        snprintf(key, sizeof key, "case%d.std_t", k);
        double want = meta_num(f, key);
        CHECK_MSG(fabs(st.std_t - want) <= 1e-6 * want, "case %d std_t %.9g vs %.9g", k, st.std_t, want);
        snprintf(key, sizeof key, "case%d.step_std", k);
        want = meta_num(f, key);
        CHECK_MSG(fabs(st.step_std - want) <= 1e-6 * want, "case %d step std %.9g vs %.9g", k, st.step_std, want);
        snprintf(key, sizeof key, "case%d.logp", k);
        want = meta_num(f, key);
        CHECK_MSG(fabs(st.logp - want) <= 1e-5 * fmax(1.0, fabs(want)), "case %d logp %.9g vs %.9g", k, st.logp, want);

        /* Trainer mode: the recorded x_given under this mean; mean_out bitwise the rollout's. */
        flow_step tr;
        REQUIRE_OK(flow_sde_step(x, v, NULL, given, n, p[0], p[1], p[2], p[3], mean2, NULL, &tr));
        CHECK(tr.has_logp && memcmp(mean, mean2, sizeof(float) * n) == 0);
        snprintf(key, sizeof key, "case%d.logp_given", k);
        want = meta_num(f, key);
        CHECK_MSG(fabs(tr.logp - want) <= 1e-5 * fmax(1.0, fabs(want)), "case %d logp_given %.9g vs %.9g", k,
                  tr.logp, want);

        /* KL to the mean of v_old. */
        flow_step so;
        REQUIRE_OK(flow_sde_step(x, v_old, NULL, NULL, n, p[0], p[1], p[2], p[3], mean_old, NULL, &so));
        CHECK(!so.has_logp && so.logp == 0.0f);
        float kl;
        REQUIRE_OK(flow_kl(mean, mean_old, n, st.step_std, &kl));
        snprintf(key, sizeof key, "case%d.kl", k);
        want = meta_num(f, key);
        CHECK_MSG(fabs(kl - want) <= 2e-5 * want, "case %d KL %.9g vs %.9g", k, kl, want);
    }
    free(buf);
    st_close(f);
}

/* eta 0 (ODE): no log-prob, x_next = x + v*dt bitwise, logp exactly 0, no NaN; KL and backward refuse the step. */
TEST(flow_eta0_has_no_logp) {
    enum { n = 300 };
    float x[n], v[n], eps[n], xn[n], mean[n], dv[n];
    test_fill_uniform(x, n, 1, -2, 2);
    test_fill_uniform(v, n, 2, -2, 2);
    test_fill_uniform(eps, n, 3, -3, 3);
    const float sig[3][2] = {{1.0f, 0.9f}, {0.6f, 0.5f}, {0.2f, 0.0f}};
    for (int c = 0; c < 3; c++) {
        flow_step st;
        REQUIRE_OK(flow_sde_step(x, v, eps, NULL, n, sig[c][0], sig[c][1], 0.9f, 0.0f, mean, xn, &st));
        CHECK(!st.has_std && !st.has_logp && st.logp == 0.0f && st.step_std == 0.0f);
        const float dt = sig[c][1] - sig[c][0];
        for (int i = 0; i < n; i++) {
            float want = x[i] + v[i] * dt;
            CHECK_MSG(memcmp(&xn[i], &want, 4) == 0 && xn[i] == mean[i], "case %d element %d: %.9g vs %.9g", c, i,
                      xn[i], want);
        }
        REQUIRE_OK(flow_sde_step(x, v, NULL, xn, n, sig[c][0], sig[c][1], 0.9f, 0.0f, mean, NULL, &st));
        CHECK(!st.has_logp && st.logp == 0.0f);
        float kl = 7;
        CHECK(flow_kl(mean, x, n, st.step_std, &kl) == -1 && kl == 7 && strstr(core_last_error(), "std"));
        CHECK(flow_sde_backward_v(&st, mean, xn, NULL, n, 1.0f, 0.0f, dv) == -1 && strstr(core_last_error(), "std 0"));
    }
}

/* Argument checks name the bad value. */
TEST(flow_step_errors) {
    flow_step st;
    CHECK(flow_step_init(&st, 0.0f, 0.0f, 0.9f, 1.0f) == -1 && strstr(core_last_error(), "sigma 0"));
    CHECK(flow_step_init(&st, 1.5f, 0.5f, 0.9f, 1.0f) == -1 && strstr(core_last_error(), "sigma 1.5"));
    CHECK(flow_step_init(&st, 0.5f, 0.5f, 0.9f, 1.0f) == -1 && strstr(core_last_error(), "sigma_next"));
    CHECK(flow_step_init(&st, 0.5f, -0.1f, 0.9f, 1.0f) == -1 && strstr(core_last_error(), "sigma_next"));
    CHECK(flow_step_init(&st, 0.5f, 0.4f, 0.9f, -1.0f) == -1 && strstr(core_last_error(), "eta"));
    CHECK(flow_step_init(&st, 0.5f, 0.4f, 0.9f, INFINITY) == -1 && strstr(core_last_error(), "eta"));
    CHECK(flow_step_init(&st, 1.0f, 0.9f, 1.0f, 1.0f) == -1 && strstr(core_last_error(), "sigmas[1]"));
    REQUIRE_OK(flow_step_init(&st, 0.5f, 0.4f, 1.0f, 1.0f)); /* sigma1 only matters at sigma == 1 */
    float a[4] = {0}, b[4] = {0};
    CHECK(flow_sde_step(a, a, a, a, 4, 0.5f, 0.4f, 0.9f, 1.0f, b, b, &st) == -1 && strstr(core_last_error(), "both"));
    CHECK(flow_sde_step(a, a, a, NULL, 4, 0.5f, 0.4f, 0.9f, 1.0f, b, NULL, &st) == -1 &&
          strstr(core_last_error(), "x_next_out"));
    CHECK(flow_sde_step(a, a, a, NULL, 0, 0.5f, 0.4f, 0.9f, 1.0f, b, b, &st) == -1 && strstr(core_last_error(), "count"));
}

/* sigma == 1 uses 1 - sigmas[1]; the last step to sigma 0 has a finite, positive std and a finite log-prob. */
TEST(flow_first_and_last_steps) {
    flow_step st;
    REQUIRE_OK(flow_step_init(&st, 1.0f, 0.96f, 0.96f, 0.7f));
    CHECK_NEAR(st.std_t, 0.7 * sqrt(1.0 / 0.04), 1e-5);
    CHECK_NEAR(st.step_std, 0.7 * sqrt(1.0 / 0.04) * sqrt(0.04), 1e-6);
    CHECK_NEAR(st.coef_x, 1.0 + (0.49 * 25.0 / 2.0) * -0.04, 1e-6); /* std_t^2 = 12.25 */
    CHECK_NEAR(st.coef_v, -0.04, 1e-7);                              /* (1 - sigma) = 0: bracket is 1 */
    enum { n = 1000 };
    float x[n], v[n], eps[n], xn[n];
    test_fill_uniform(x, n, 4, -1, 1);
    test_fill_uniform(v, n, 5, -1, 1);
    test_fill_uniform(eps, n, 6, -1.7f, 1.7f);
    REQUIRE_OK(flow_sde_step(x, v, eps, NULL, n, 0.05f, 0.0f, 0.96f, 1.0f, NULL, xn, &st));
    CHECK(st.has_logp && isfinite(st.logp));
    CHECK_NEAR(st.step_std, sqrt(0.05 / 0.95) * sqrt(0.05), 1e-7);
    /* logp = -mean(eps^2)/2 - log(step_std) - log(sqrt(2 pi)), computed here in double. */
    double m2 = 0;
    for (int i = 0; i < n; i++) m2 += (double)eps[i] * eps[i];
    double want = -m2 / n / 2.0 - log(sqrt(0.05 / 0.95) * sqrt(0.05)) - 0.5 * log(2.0 * M_PI);
    CHECK_NEAR(st.logp, want, 2e-5);
}

/* The log-prob the trainer recomputes from the recorded x_next equals the rollout's, bit for bit (same weights),
 * and a step written in place (x_next_out == x) gives the same bits. */
TEST(flow_rollout_trainer_parity) {
    enum { n = 9000 };
    float *x = malloc(sizeof(float) * n * 5), *v = x + n, *eps = v + n, *xn = eps + n, *y = xn + n;
    REQUIRE(x);
    test_fill_uniform(x, n, 7, -2, 2);
    test_fill_uniform(v, n, 8, -2, 2);
    test_fill_uniform(eps, n, 9, -2, 2);
    float s[21], t[20];
    REQUIRE_OK(flow_schedule(20, 5.0, s, t));
    for (int i = 0; i < 20; i++) {
        flow_step ro, tr, ip;
        REQUIRE_OK(flow_sde_step(x, v, eps, NULL, n, s[i], s[i + 1], s[1], 0.8f, NULL, xn, &ro));
        REQUIRE_OK(flow_sde_step(x, v, NULL, xn, n, s[i], s[i + 1], s[1], 0.8f, NULL, NULL, &tr));
        memcpy(y, x, sizeof(float) * n);
        REQUIRE_OK(flow_sde_step(y, v, eps, NULL, n, s[i], s[i + 1], s[1], 0.8f, NULL, y, &ip));
        CHECK(ro.has_logp && tr.has_logp && isfinite(ro.logp));
        CHECK_MSG(memcmp(&ro.logp, &tr.logp, 4) == 0, "step %d: rollout %.9g trainer %.9g", i, ro.logp, tr.logp);
        CHECK(memcmp(&ro.logp, &ip.logp, 4) == 0 && memcmp(xn, y, sizeof(float) * n) == 0);
    }
    free(x);
}

/* No fused multiply-add: mean = coef_x*x + coef_v*v with each product rounded, x_next = mean + step_std*eps. */
TEST(flow_mean_no_fma) {
    enum { n = 2000 };
    float x[n], v[n], eps[n], xn[n], mean[n];
    test_fill_uniform(x, n, 10, -3, 3);
    test_fill_uniform(v, n, 11, -3, 3);
    test_fill_uniform(eps, n, 12, -3, 3);
    flow_step st;
    REQUIRE_OK(flow_sde_step(x, v, eps, NULL, n, 0.7f, 0.63f, 0.9f, 1.0f, mean, xn, &st));
    int bad = 0;
    for (int i = 0; i < n; i++) {
        volatile float px = st.coef_x * x[i], pv = st.coef_v * v[i];
        volatile float m = px + pv;
        volatile float nz = st.step_std * eps[i];
        volatile float y = m + nz;
        if (m != mean[i] || y != xn[i]) bad++;
    }
    CHECK_MSG(bad == 0, "%d elements differ from separately rounded products", bad);
}

/* Reference of the documented order: sequential chunks of 4096, then level-by-level neighbour pairing. */
static float ref_fixed_sum(const float *x, int64_t n) {
    int64_t m = (n + 4095) / 4096;
    float *c = malloc(sizeof(float) * (m ? m : 1));
    for (int64_t k = 0; k < m; k++) {
        float acc = 0.0f;
        for (int64_t i = k * 4096; i < n && i < (k + 1) * 4096; i++) acc += x[i];
        c[k] = acc;
    }
    while (m > 1) {
        int64_t h = 0;
        for (int64_t k = 0; k + 1 < m; k += 2) c[h++] = c[k] + c[k + 1];
        if (m % 2) c[h++] = c[m - 1];
        m = h;
    }
    float r = n ? c[0] : 0.0f;
    free(c);
    return r;
}

/* The fixed order is the documented one (bitwise, many chunk counts incl. > 256 chunks, a batch boundary) and does
 * not depend on the thread count; the log-prob of a multi-chunk step is bitwise the same on 1 and 2 threads. */
TEST(flow_sum_fixed_order_and_threads) {
    const int64_t nmax = 300 * 4096 + 123;
    float *x = malloc(sizeof(float) * nmax);
    REQUIRE(x);
    test_fill_uniform(x, nmax, 13, -1, 3);
    const int64_t ns[] = {0, 1, 4095, 4096, 4097, 3 * 4096, 5 * 4096 + 7, 11 * 4096, 256 * 4096, 257 * 4096 + 1,
                          nmax};
    int saved = omp_get_max_threads();
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        float want = ref_fixed_sum(x, ns[k]);
        omp_set_num_threads(1);
        float a = core_sum_fixed(x, ns[k]);
        omp_set_num_threads(2);
        float b = core_sum_fixed(x, ns[k]);
        CHECK_MSG(memcmp(&a, &want, 4) == 0 && memcmp(&b, &want, 4) == 0, "n %lld: %.9g %.9g vs reference %.9g",
                  (long long)ns[k], a, b, want);
    }
    float c[7] = {1e8f, 1.0f, -1e8f, 1.0f, 3.0f, 5.0f, 7.0f};
    /* Tree: ((1e8 + 1) + (-1e8 + 1)) + ((3 + 5) + 7) = (1e8 - 1e8) + 15 = 15 in fp32 (1e8 + 1 rounds to 1e8);
     * a sequential sum would give 16. */
    CHECK(core_reduce_combine(c, 7) == 15.0f && core_reduce_combine(c, 0) == 0.0f);
    CHECK_NEAR(core_sum_fixed(x, 4096), ref_fixed_sum(x, 4096), 0);

    /* Log-prob over 300 chunks, 1 vs 2 threads. */
    float *v = malloc(sizeof(float) * nmax * 3), *eps = v + nmax, *xn = eps + nmax;
    REQUIRE(v);
    test_fill_uniform(v, nmax, 14, -1, 1);
    test_fill_uniform(eps, nmax, 15, -2, 2);
    flow_step s1, s2;
    omp_set_num_threads(1);
    REQUIRE_OK(flow_sde_step(x, v, eps, NULL, nmax, 0.5f, 0.45f, 0.9f, 0.7f, NULL, xn, &s1));
    omp_set_num_threads(2);
    REQUIRE_OK(flow_sde_step(x, v, eps, NULL, nmax, 0.5f, 0.45f, 0.9f, 0.7f, NULL, xn, &s2));
    omp_set_num_threads(saved);
    CHECK(s1.has_logp && memcmp(&s1.logp, &s2.logp, 4) == 0);
    free(v);
    free(x);
}

/* Double-precision forward of L = g_logp * logp(v) + g_kl * KL(v) with x, x_next, mean_ref fixed. */
static double ref_loss(const flow_step *st, const float *x, const double *v, const float *xn, const float *mref,
                       int n, double g_logp, double g_kl) {
    double var = (double)st->step_std * st->step_std, sq = 0, kq = 0;
    for (int i = 0; i < n; i++) {
        double m = (double)st->coef_x * x[i] + (double)st->coef_v * v[i];
        sq += (xn[i] - m) * (xn[i] - m);
        kq += (m - mref[i]) * (m - mref[i]);
    }
    double logp = -sq / n / (2 * var) - log((double)st->step_std) - 0.5 * log(2 * M_PI);
    return g_logp * logp + g_kl * kq / n / (2 * var);
}

/* d loss / d v against central differences of the double forward (L is quadratic in v: differences are exact up to
 * double rounding), relative L2 error <= 1e-5; plus each term alone. */
TEST(flow_backward_matches_finite_differences) {
    enum { n = 96 };
    float x[n], v[n], v_ref[n], eps[n], xn[n], mean[n], mref[n], dv[n];
    double vd[n];
    test_fill_uniform(x, n, 16, -1, 1);
    test_fill_uniform(v, n, 17, -1, 1);
    test_fill_uniform(v_ref, n, 18, -1, 1);
    test_fill_uniform(eps, n, 19, -2, 2);
    const float cases[3][3] = {{1.0f, 0.93f, 0.7f}, {0.4f, 0.3f, 1.0f}, {0.1f, 0.0f, 0.5f}};
    const float g[3][2] = {{0.37f, 2.5f}, {-1.3f, 0.0f}, {0.0f, 0.8f}};
    for (int c = 0; c < 3; c++) {
        for (int gi = 0; gi < 3; gi++) {
            flow_step st, sr;
            /* x_next recorded under v_ref (old policy), evaluated under v (new policy). */
            REQUIRE_OK(flow_sde_step(x, v_ref, eps, NULL, n, cases[c][0], cases[c][1], 0.93f, cases[c][2], mref, xn, &sr));
            REQUIRE_OK(flow_sde_step(x, v, NULL, xn, n, cases[c][0], cases[c][1], 0.93f, cases[c][2], mean, NULL, &st));
            REQUIRE_OK(flow_sde_backward_v(&st, mean, g[gi][0] ? xn : NULL, g[gi][1] ? mref : NULL, n, g[gi][0],
                                           g[gi][1], dv));
            double num = 0, den = 0;
            for (int i = 0; i < n; i++) vd[i] = v[i];
            for (int i = 0; i < n; i++) {
                const double h = 1e-3;
                vd[i] = v[i] + h;
                double lp = ref_loss(&st, x, vd, xn, mref, n, g[gi][0], g[gi][1]);
                vd[i] = v[i] - h;
                double lm = ref_loss(&st, x, vd, xn, mref, n, g[gi][0], g[gi][1]);
                vd[i] = v[i];
                double fd = (lp - lm) / (2 * h);
                num += (dv[i] - fd) * (dv[i] - fd);
                den += fd * fd;
            }
            CHECK_MSG(den > 0 && sqrt(num / den) <= 1e-5, "case %d grads %d: rel L2 %.3g", c, gi, sqrt(num / den));
        }
    }
    flow_step st;
    REQUIRE_OK(flow_step_init(&st, 0.5f, 0.4f, 0.9f, 1.0f));
    CHECK(flow_sde_backward_v(&st, mean, NULL, mref, n, 1.0f, 0.0f, dv) == -1 && strstr(core_last_error(), "x_next"));
    CHECK(flow_sde_backward_v(&st, mean, xn, NULL, n, 1.0f, 1.0f, dv) == -1 && strstr(core_last_error(), "mean_ref"));
    CHECK(flow_sde_backward_v(&st, mean, xn, mref, n, NAN, 1.0f, dv) == -1 && strstr(core_last_error(), "finite"));
}
