/* tests/test_dpo.c — online Flow-DPO's arithmetic (trainer/step/dpo.h): the loss of a term and its gradients against
 * a float64 torch transcription of flow_grpo's train_sd3_dpo.py (tests/fixtures/dpo_loss.safetensors,
 * scripts/fixtures_dpo.py), the gradients against central finite differences, the pair selection (ties, margins, a
 * group of one refused), the shared-noise forward sample's determinism, errors. */
#include <float.h>
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
#include "trainer/step/dpo.h"

#define DPO_FIXTURE "tests/fixtures/dpo_loss.safetensors"
#define DM 96 /* elements per term */
#define DT 8  /* terms in the fixture */

static void read_f64(const st_file *f, const char *name, double *dst, int64_t n) {
    core_tensor t;
    REQUIRE_OK(st_get(f, name, &t));
    CHECK_MSG(t.dtype == CORE_I64 && core_tensor_numel(&t) == n, "%s: I64 [%lld] expected", name, (long long)n);
    if (t.dtype == CORE_I64 && core_tensor_numel(&t) == n) memcpy(dst, t.data, sizeof(double) * (size_t)n);
    core_tensor_free(&t);
}

typedef struct {
    float eps[DT][DM], x0w[DT][DM], x0l[DT][DM], vw[DT][DM], vl[DT][DM], rw[DT][DM], rl[DT][DM], beta;
    int64_t denom;
    double contrib[DT], parts[DT][5], dvw[DT][DM], dvl[DT][DM];
} dpo_fix;

static dpo_fix *load_fixture(void) {
    dpo_fix *g = calloc(1, sizeof(*g));
    REQUIRE(g != NULL);
    st_file *f = st_open(DPO_FIXTURE);
    REQUIRE_OK(f == NULL);
    REQUIRE_OK(st_read_f32(f, "dpo.eps", &g->eps[0][0], DT * DM));
    REQUIRE_OK(st_read_f32(f, "dpo.x0_w", &g->x0w[0][0], DT * DM));
    REQUIRE_OK(st_read_f32(f, "dpo.x0_l", &g->x0l[0][0], DT * DM));
    REQUIRE_OK(st_read_f32(f, "dpo.v_w", &g->vw[0][0], DT * DM));
    REQUIRE_OK(st_read_f32(f, "dpo.v_l", &g->vl[0][0], DT * DM));
    REQUIRE_OK(st_read_f32(f, "dpo.vr_w", &g->rw[0][0], DT * DM));
    REQUIRE_OK(st_read_f32(f, "dpo.vr_l", &g->rl[0][0], DT * DM));
    REQUIRE_OK(st_read_f32(f, "dpo.beta", &g->beta, 1));
    const char *d = st_metadata(f, "dpo_denom");
    REQUIRE(d != NULL);
    g->denom = atoll(d);
    read_f64(f, "dpo.contrib.f64", g->contrib, DT);
    read_f64(f, "dpo.parts.f64", &g->parts[0][0], DT * 5);
    read_f64(f, "dpo.dv_w.f64", &g->dvw[0][0], DT * DM);
    read_f64(f, "dpo.dv_l.f64", &g->dvl[0][0], DT * DM);
    st_close(f);
    return g;
}

static double rel(double a, double b, double scale) { return fabs(a - b) / (scale > 0 ? scale : 1.0); }

/* The scale a term's gradient is compared at: its largest |dv|, floored at FLT_MIN (a saturated term's gradient,
 * ~1e-130, is below float's range and flushes to 0 when rounded to float, as it does on the torch side in fp32). */
static double dv_scale(const double *a, const double *b) {
    double s = FLT_MIN;
    for (int i = 0; i < DM; i++) s = fmax(s, fmax(fabs(a[i]), fabs(b[i])));
    return s;
}

/* Against the torch float64 transcription: both sides compute in double from the same fp32 inputs, so the loss and
 * its parts agree to ~1e-15 relative; dv is rounded once to float (2^-24 of the term's largest |dv|). The bound asked
 * for is 1e-6 relative. */
TEST(dpo_loss_matches_reference) {
    dpo_fix *g = load_fixture();
    float dw[DM], dl[DM];
    double worst_c = 0, worst_p = 0, worst_dv = 0, total = 0;
    dpo_loss_stats st = {0};
    for (int k = 0; k < DT; k++) {
        dpo_loss_stats one = {0};
        REQUIRE_OK(dpo_loss_terms(DM, g->eps[k], g->x0w[k], g->x0l[k], g->vw[k], g->vl[k], g->rw[k], g->rl[k],
                                  g->beta, g->denom, dw, dl, &one));
        dpo_loss_stats_add(&st, &one);
        total += g->contrib[k];
        worst_c = fmax(worst_c, rel(one.loss, g->contrib[k], fabs(g->contrib[k])));
        const double mine[5] = {one.err_w_sum, one.err_l_sum, one.ref_w_sum, one.ref_l_sum, one.margin_sum};
        for (int j = 0; j < 5; j++) worst_p = fmax(worst_p, rel(mine[j], g->parts[k][j], fabs(g->parts[k][j])));
        CHECK(one.n_positive == (g->parts[k][4] > 0));
        const double scale = dv_scale(g->dvw[k], g->dvl[k]);
        for (int i = 0; i < DM; i++) {
            worst_dv = fmax(worst_dv, rel(dw[i], g->dvw[k][i], scale));
            worst_dv = fmax(worst_dv, rel(dl[i], g->dvl[k][i], scale));
        }
    }
    if (getenv("VGRPO_VERBOSE"))
        printf("dpo fixture: contrib %.3g, parts %.3g, dv %.3g (relative)\n", worst_c, worst_p, worst_dv);
    CHECK(worst_c < 1e-6);
    CHECK(worst_p < 1e-6);
    CHECK(worst_dv < 1e-6);
    CHECK(rel(st.loss, total, fabs(total)) < 1e-6);
    CHECK(st.n_terms == DT);
    /* the cases the fixture is meant to cover: z = 0 (log 2), both signs, saturation on both sides */
    CHECK(g->parts[0][4] == 0.0 && g->parts[5][4] == 0.0);
    CHECK(g->parts[3][4] > 30 && g->parts[4][4] < -30 && fabs(g->parts[6][4]) < 3 && fabs(g->parts[6][4]) > 0);
    CHECK(st.n_positive == 3); /* terms 1, 3, 7 */
    free(g);
}

/* The loss of one term written here in double from double velocities: the function whose derivative dv is. */
static double loss_at(const dpo_fix *g, int k, const double *vw, const double *vl) {
    double ew = 0, el = 0, rw = 0, rl = 0;
    for (int i = 0; i < DM; i++) {
        const double tw = (double)g->eps[k][i] - g->x0w[k][i], tl = (double)g->eps[k][i] - g->x0l[k][i];
        ew += (vw[i] - tw) * (vw[i] - tw), el += (vl[i] - tl) * (vl[i] - tl);
        rw += (g->rw[k][i] - tw) * (g->rw[k][i] - tw), rl += (g->rl[k][i] - tl) * (g->rl[k][i] - tl);
    }
    const double z = -0.5 * g->beta * ((ew / DM - rw / DM) - (el / DM - rl / DM));
    const double sp = -z > 0 ? -z + log1p(exp(z)) : log1p(exp(-z)); /* softplus(-z) */
    return sp / (double)g->denom;
}

/* Central differences (h = 1e-6, in double) of loss_at on every term and every element of both velocities; the
 * loss is smooth, so with |dz| ~ 2 beta |v - target| h / M ~ 5e-5 per step the quotient's error is ~1e-9 relative.
 * dv is rounded to float. Bound: 1e-6 of the term's largest |dv| (floored at FLT_MIN, see dv_scale). The loss at v
 * itself must equal dpo_loss_terms'. */
TEST(dpo_gradient_matches_finite_differences) {
    dpo_fix *g = load_fixture();
    float dw[DM], dl[DM];
    double vw[DM], vl[DM], fw[DM], fl[DM];
    double worst = 0, worst_l = 0;
    for (int k = 0; k < DT; k++) {
        dpo_loss_stats st = {0};
        REQUIRE_OK(dpo_loss_terms(DM, g->eps[k], g->x0w[k], g->x0l[k], g->vw[k], g->vl[k], g->rw[k], g->rl[k],
                                  g->beta, g->denom, dw, dl, &st));
        for (int i = 0; i < DM; i++) vw[i] = g->vw[k][i], vl[i] = g->vl[k][i];
        const double l0 = loss_at(g, k, vw, vl);
        worst_l = fmax(worst_l, fabs(l0 - st.loss) / fabs(st.loss));
        const double h = 1e-6;
        for (int i = 0; i < DM; i++) {
            vw[i] = g->vw[k][i] + h;
            const double a = loss_at(g, k, vw, vl);
            vw[i] = g->vw[k][i] - h;
            const double b = loss_at(g, k, vw, vl);
            vw[i] = g->vw[k][i];
            fw[i] = (a - b) / (2 * h);
            vl[i] = g->vl[k][i] + h;
            const double c = loss_at(g, k, vw, vl);
            vl[i] = g->vl[k][i] - h;
            const double d = loss_at(g, k, vw, vl);
            vl[i] = g->vl[k][i];
            fl[i] = (c - d) / (2 * h);
        }
        const double scale = dv_scale(fw, fl);
        for (int i = 0; i < DM; i++) worst = fmax(worst, fmax(fabs(fw[i] - dw[i]), fabs(fl[i] - dl[i])) / scale);
    }
    if (getenv("VGRPO_VERBOSE")) printf("dpo finite differences: worst %.3g of max |dv|, loss %.3g\n", worst, worst_l);
    CHECK(worst < 1e-6);
    CHECK(worst_l < 1e-12);
    free(g);
}

/* Central differences of dpo_loss_terms itself (float velocities moved by h = 2^-14, the step taken as the float
 * difference) on the unsaturated term (|z| < 3), every third element of both velocities. */
TEST(dpo_gradient_finite_differences_of_c_loss) {
    dpo_fix *g = load_fixture();
    const int k = 6;
    float dw[DM], dl[DM], vp[DM];
    REQUIRE_OK(dpo_loss_terms(DM, g->eps[k], g->x0w[k], g->x0l[k], g->vw[k], g->vl[k], g->rw[k], g->rl[k], g->beta,
                              g->denom, dw, dl, NULL));
    double scale = 0, worst = 0;
    for (int i = 0; i < DM; i++) scale = fmax(scale, fmax(fabs(dw[i]), fabs(dl[i])));
    REQUIRE(scale > 0);
    for (int side = 0; side < 2; side++)
        for (int i = 0; i < DM; i += 3) {
            const float *v0 = side ? g->vl[k] : g->vw[k];
            const float h = 1.0f / 16384;
            dpo_loss_stats a = {0}, b = {0};
            memcpy(vp, v0, sizeof vp);
            vp[i] = v0[i] + h;
            const double hp = (double)vp[i] - v0[i];
            REQUIRE_OK(dpo_loss_terms(DM, g->eps[k], g->x0w[k], g->x0l[k], side ? g->vw[k] : vp, side ? vp : g->vl[k],
                                      g->rw[k], g->rl[k], g->beta, g->denom, NULL, NULL, &a));
            vp[i] = v0[i] - h;
            const double hm = (double)v0[i] - vp[i];
            REQUIRE_OK(dpo_loss_terms(DM, g->eps[k], g->x0w[k], g->x0l[k], side ? g->vw[k] : vp, side ? vp : g->vl[k],
                                      g->rw[k], g->rl[k], g->beta, g->denom, NULL, NULL, &b));
            const double fd = (a.loss - b.loss) / (hp + hm);
            worst = fmax(worst, fabs(fd - (side ? dl[i] : dw[i])) / scale);
        }
    if (getenv("VGRPO_VERBOSE")) printf("dpo C finite differences: worst %.3g of max |dv|\n", worst);
    CHECK(worst < 1e-6); /* O(h^2) curvature: |dz| ~ 2 beta |v - target| h / M ~ 1e-3 per step (seen: 9e-8) */
    free(g);
}

/* On the first update (policy == reference) z = 0 exactly: the loss is log 2 per term and the gradient
 * beta / 2 (v - target) / M / denom (the policy moves its preferred velocity towards its target, its rejected away). */
TEST(dpo_loss_first_update) {
    dpo_fix *g = load_fixture();
    const int k = 0;
    float dw[DM], dl[DM];
    dpo_loss_stats st = {0};
    REQUIRE_OK(dpo_loss_terms(DM, g->eps[k], g->x0w[k], g->x0l[k], g->rw[k], g->rl[k], g->rw[k], g->rl[k], 100.0f, 4,
                              dw, dl, &st));
    CHECK(st.loss == log(2.0) / 4 && st.margin_sum == 0.0 && st.n_positive == 0);
    CHECK(st.err_w_sum == st.ref_w_sum && st.err_l_sum == st.ref_l_sum);
    int exact = 1;
    for (int i = 0; i < DM; i++) {
        const double tw = (double)g->eps[k][i] - g->x0w[k][i], tl = (double)g->eps[k][i] - g->x0l[k][i];
        const double c = 0.5 * 100.0 / DM / 4;
        exact &= dw[i] == (float)(c * (g->rw[k][i] - tw)) && dl[i] == (float)(-c * (g->rl[k][i] - tl));
    }
    CHECK(exact);
    free(g);
}

TEST(dpo_loss_errors) {
    dpo_fix *g = load_fixture();
    float dw[DM], dl[DM];
    const float *x = g->eps[0];
    CHECK(dpo_loss_terms(DM, x, x, x, x, x, x, x, 0.0f, 1, dw, dl, NULL) == -1 &&
          strstr(core_last_error(), "algorithm.dpo_beta"));
    CHECK(dpo_loss_terms(DM, x, x, x, x, x, x, x, INFINITY, 1, dw, dl, NULL) == -1 &&
          strstr(core_last_error(), "algorithm.dpo_beta"));
    CHECK(dpo_loss_terms(DM, x, x, x, x, x, x, x, 1.0f, 0, dw, dl, NULL) == -1 &&
          strstr(core_last_error(), "denominator"));
    CHECK(dpo_loss_terms(0, x, x, x, x, x, x, x, 1.0f, 1, dw, dl, NULL) == -1);
    float bad[DM];
    memcpy(bad, x, sizeof bad);
    bad[11] = NAN;
    CHECK(dpo_loss_terms(DM, x, x, x, x, bad, x, x, 1.0f, 1, dw, dl, NULL) == -1 &&
          strstr(core_last_error(), "rejected velocity[11]"));
    CHECK(dpo_loss_terms(DM, x, x, x, x, x, bad, x, 1.0f, 1, dw, dl, NULL) == -1 &&
          strstr(core_last_error(), "preferred reference velocity[11]"));
    /* NULL gradients: the loss alone */
    dpo_loss_stats st = {0};
    REQUIRE_OK(dpo_loss_terms(DM, g->eps[1], g->x0w[1], g->x0l[1], g->vw[1], g->vl[1], g->rw[1], g->rl[1], g->beta,
                              g->denom, NULL, NULL, &st));
    CHECK(st.n_terms == 1 && st.loss > 0);
    free(g);
}

/* best_worst: the first index of the largest and of the smallest reward (torch.argmax / argmin on ties); a group
 * whose rewards are all equal, or whose gap is within the margin, gives no pair. */
TEST(dpo_pairs_best_worst) {
    const float r[12] = {0.2f, 0.9f, 0.1f, 0.9f,  /* group 0: best 1 (first of the tie with 3), worst 2 */
                         0.5f, 0.5f, 0.5f, 0.5f,  /* group 1: all equal: no pair */
                         0.3f, 0.1f, 0.1f, 0.35f}; /* group 2: best 11, worst 9 (first of the tie with 10) */
    dpo_pair p[3];
    int n = -1;
    CHECK(dpo_max_pairs(3, 4, DPO_PAIRS_BEST_WORST) == 3);
    REQUIRE_OK(dpo_select_pairs(r, 3, 4, DPO_PAIRS_BEST_WORST, 0.0f, p, &n));
    REQUIRE(n == 2);
    CHECK(p[0].w == 1 && p[0].l == 2 && p[0].gap == (float)((double)0.9f - (double)0.1f));
    CHECK(p[1].w == 11 && p[1].l == 9);
    CHECK(p[1].gap == (float)((double)0.35f - (double)0.1f));
    /* a margin between the two gaps keeps group 0 only; a margin equal to a gap drops it (gap > margin, strict) */
    REQUIRE_OK(dpo_select_pairs(r, 3, 4, DPO_PAIRS_BEST_WORST, 0.5f, p, &n));
    CHECK(n == 1 && p[0].w == 1 && p[0].l == 2);
    const float two[2] = {0.25f, 0.75f};
    REQUIRE_OK(dpo_select_pairs(two, 1, 2, DPO_PAIRS_BEST_WORST, 0.5f, p, &n));
    CHECK(n == 0);
    REQUIRE_OK(dpo_select_pairs(two, 1, 2, DPO_PAIRS_BEST_WORST, 0.25f, p, &n));
    CHECK(n == 1 && p[0].w == 1 && p[0].l == 0 && p[0].gap == 0.5f);
}

/* all: every two samples of a group whose gap exceeds the margin, the higher preferred, in (g, h) order. */
TEST(dpo_pairs_all_with_margin) {
    const float r[8] = {0.0f, 1.0f, 0.5f, 1.0f, /* group 0 */
                        2.0f, 2.0f, 2.0f, 1.0f}; /* group 1 */
    dpo_pair p[12];
    int n = -1;
    CHECK(dpo_max_pairs(2, 4, DPO_PAIRS_ALL) == 12);
    REQUIRE_OK(dpo_select_pairs(r, 2, 4, DPO_PAIRS_ALL, 0.0f, p, &n));
    /* group 0: (0,1) (0,2) (0,3) (1,2) [(1,3) tie] (2,3); group 1: [ties] (4,7) (5,7) (6,7) */
    const int want[8][2] = {{1, 0}, {2, 0}, {3, 0}, {1, 2}, {3, 2}, {4, 7}, {5, 7}, {6, 7}};
    REQUIRE(n == 8);
    int ok = 1;
    for (int k = 0; k < 8; k++) ok &= p[k].w == want[k][0] && p[k].l == want[k][1] && p[k].gap > 0;
    CHECK(ok);
    CHECK(p[0].gap == 1.0f && p[1].gap == 0.5f && p[4].gap == 0.5f);
    /* margin 0.5: gaps of exactly 0.5 go; 1.0 stays */
    REQUIRE_OK(dpo_select_pairs(r, 2, 4, DPO_PAIRS_ALL, 0.5f, p, &n));
    const int want2[5][2] = {{1, 0}, {3, 0}, {4, 7}, {5, 7}, {6, 7}};
    REQUIRE(n == 5);
    ok = 1;
    for (int k = 0; k < 5; k++) ok &= p[k].w == want2[k][0] && p[k].l == want2[k][1];
    CHECK(ok);
    REQUIRE_OK(dpo_select_pairs(r, 2, 4, DPO_PAIRS_ALL, 1.0f, p, &n));
    CHECK(n == 0);
}

TEST(dpo_pairs_errors_and_parse) {
    const float r[4] = {0.1f, 0.2f, NAN, 0.4f};
    dpo_pair p[8];
    int n = 7;
    CHECK(dpo_select_pairs(r, 4, 1, DPO_PAIRS_BEST_WORST, 0.0f, p, &n) == -1 && n == 0 &&
          strstr(core_last_error(), "rollout.samples_per_prompt") && strstr(core_last_error(), "group of one"));
    CHECK(dpo_select_pairs(r, 4, 1, DPO_PAIRS_ALL, 0.0f, p, &n) == -1 && strstr(core_last_error(), "group of one"));
    CHECK(dpo_max_pairs(4, 1, DPO_PAIRS_ALL) == -1);
    CHECK(dpo_select_pairs(r, 2, 2, DPO_PAIRS_BEST_WORST, 0.0f, p, &n) == -1 && strstr(core_last_error(), "sample 2"));
    CHECK(dpo_select_pairs(r, 1, 2, DPO_PAIRS_BEST_WORST, -0.1f, p, &n) == -1 &&
          strstr(core_last_error(), "algorithm.dpo_margin"));
    CHECK(dpo_select_pairs(r, 1, 2, DPO_PAIRS_BEST_WORST, NAN, p, &n) == -1 &&
          strstr(core_last_error(), "algorithm.dpo_margin"));
    CHECK(dpo_select_pairs(r, 0, 2, DPO_PAIRS_BEST_WORST, 0.0f, p, &n) == -1);
    dpo_pair_rule rule = DPO_PAIRS_ALL;
    REQUIRE_OK(dpo_pair_rule_parse("best_worst", &rule));
    CHECK(rule == DPO_PAIRS_BEST_WORST && strcmp(dpo_pair_rule_name(rule), "best_worst") == 0);
    REQUIRE_OK(dpo_pair_rule_parse("all", &rule));
    CHECK(rule == DPO_PAIRS_ALL && strcmp(dpo_pair_rule_name(rule), "all") == 0);
    CHECK(dpo_pair_rule_parse("pairs", &rule) == -1 && strstr(core_last_error(), "algorithm.dpo_pairs"));
}

/* Both samples of a pair get the same noise: Philox stream CORE_STREAM_DPO_NOISE keyed by (seed ^ uid_l << 32, slot,
 * uid_w); x_t = (1 - t) x0 + t eps in fp32 exactly; another slot, preferred or rejected uid gives other noise. */
TEST(dpo_forward_pair_shared_noise) {
    enum { N = 37 };
    float xw[N], xl[N], tw[N], tl[N], eps[N], ref[N], tw2[N], tl2[N];
    for (int i = 0; i < N; i++) xw[i] = 0.1f * (float)i - 1.0f, xl[i] = 0.5f - 0.05f * (float)i;
    REQUIRE_OK(dpo_forward_pair(xw, xl, N, 0.625f, 42, 3, 17, 21, tw, tl, eps));
    core_philox_normal(ref, N, 42 ^ ((uint64_t)21 << 32), 3, 17, CORE_STREAM_DPO_NOISE);
    CHECK(memcmp(eps, ref, sizeof ref) == 0);
    int exact = 1;
    for (int i = 0; i < N; i++)
        exact &= tw[i] == (1.0f - 0.625f) * xw[i] + 0.625f * eps[i] && tl[i] == (1.0f - 0.625f) * xl[i] + 0.625f * eps[i];
    CHECK(exact);
    REQUIRE_OK(dpo_forward_pair(xw, xl, N, 0.625f, 42, 3, 17, 21, tw2, tl2, NULL));
    CHECK(memcmp(tw, tw2, sizeof tw) == 0 && memcmp(tl, tl2, sizeof tl) == 0);
    REQUIRE_OK(dpo_forward_pair(xw, xl, N, 0.625f, 42, 4, 17, 21, tw2, tl2, NULL));
    CHECK(memcmp(tw, tw2, sizeof tw) != 0);
    REQUIRE_OK(dpo_forward_pair(xw, xl, N, 0.625f, 42, 3, 18, 21, tw2, tl2, NULL));
    CHECK(memcmp(tw, tw2, sizeof tw) != 0);
    REQUIRE_OK(dpo_forward_pair(xw, xl, N, 0.625f, 42, 3, 17, 22, tw2, tl2, NULL));
    CHECK(memcmp(tw, tw2, sizeof tw) != 0);
    REQUIRE_OK(dpo_forward_pair(xw, xl, N, 0.0f, 42, 3, 17, 21, tw2, tl2, NULL));
    CHECK(memcmp(xw, tw2, sizeof xw) == 0 && memcmp(xl, tl2, sizeof xl) == 0);
    REQUIRE_OK(dpo_forward_pair(xw, xl, N, 1.0f, 42, 3, 17, 21, tw2, tl2, NULL));
    CHECK(memcmp(ref, tw2, sizeof ref) == 0 && memcmp(ref, tl2, sizeof ref) == 0);
    CHECK(dpo_forward_pair(xw, xl, N, 1.5f, 42, 3, 17, 21, tw2, tl2, NULL) == -1 && strstr(core_last_error(), "timestep"));
    CHECK(dpo_forward_pair(xw, xl, 0, 0.5f, 42, 3, 17, 21, tw2, tl2, NULL) == -1);
}
