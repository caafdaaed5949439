/* tests/test_attention.c — the blocked fp32 CPU attention and the LSE merge against double-precision references:
 * forward (O, LSE) against a naive double attention; backward against the double analytic gradient and against
 * central finite differences of the double forward (loss = sum(O * G)); thread-count and batch-mate invariance
 * (bitwise); split-KV + lse_merge composition, forward and ring-style backward; the merge's own gradient by finite
 * differences (loss = sum(o * G) + sum(lse * g2)), including empty (lse = -inf) partials. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "tests/test.h"

typedef struct {
    int B, Sq, Skv, H, Dh;
    float mag; /* q, k uniform in [-mag, mag]; v, G in [-1, 1] */
} attn_cfg;

/* The odd shapes: S not a multiple of any block size, H = 1, Dh = 12, cross-attention (Skv = 7 and 512 text
 * tokens), an exact block, and peaky softmax rows (mag 3) whose running max changes across key blocks. */
static const attn_cfg cfgs[] = {
    {2, 65, 65, 3, 64, 1.0f},  {1, 37, 37, 1, 12, 2.0f},   {1, 130, 7, 2, 16, 1.0f},
    {1, 100, 512, 2, 128, 1.0f}, {1, 200, 193, 2, 64, 3.0f}, {1, 96, 96, 1, 128, 1.0f},
};

static size_t nq(const attn_cfg *c) { return (size_t)c->B * c->Sq * c->H * c->Dh; }
static size_t nkv(const attn_cfg *c) { return (size_t)c->B * c->Skv * c->H * c->Dh; }
static size_t nl(const attn_cfg *c) { return (size_t)c->B * c->H * c->Sq; }
static float cfg_scale(const attn_cfg *c) { return 1.0f / sqrtf((float)c->Dh); }

static double *to_d(const float *x, size_t n) {
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

/* Naive double attention: o [B,Sq,H,Dh], lse [B,H,Sq]; p (scratch [Skv]) */
static void ref_forward(double *o, double *lse, const double *q, const double *k, const double *v,
                        const attn_cfg *c, double scale) {
    const int H = c->H, Dh = c->Dh;
    double *s = malloc(sizeof(double) * (size_t)(c->Skv > 0 ? c->Skv : 1));
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < c->Sq; i++) {
                const double *qi = q + (((size_t)b * c->Sq + i) * H + h) * Dh;
                double m = -INFINITY, l = 0.0;
                for (int j = 0; j < c->Skv; j++) {
                    const double *kj = k + (((size_t)b * c->Skv + j) * H + h) * Dh;
                    double d = 0.0;
                    for (int e = 0; e < Dh; e++) d += qi[e] * kj[e];
                    s[j] = scale * d;
                    if (s[j] > m) m = s[j];
                }
                double *oi = o + (((size_t)b * c->Sq + i) * H + h) * Dh;
                for (int e = 0; e < Dh; e++) oi[e] = 0.0;
                for (int j = 0; j < c->Skv; j++) {
                    double p = exp(s[j] - m);
                    l += p;
                    const double *vj = v + (((size_t)b * c->Skv + j) * H + h) * Dh;
                    for (int e = 0; e < Dh; e++) oi[e] += p * vj[e];
                }
                for (int e = 0; e < Dh; e++) oi[e] /= l;
                lse[((size_t)b * H + h) * c->Sq + i] = m + log(l);
            }
    free(s);
}

/* Double analytic gradient of sum(O * dout): dq, dk, dv overwritten. */
static void ref_backward(double *dq, double *dk, double *dv, const double *dout, const double *q, const double *k,
                         const double *v, const attn_cfg *c, double scale) {
    const int H = c->H, Dh = c->Dh;
    double *o = malloc(sizeof(double) * nq(c)), *lse = malloc(sizeof(double) * nl(c));
    double *p = malloc(sizeof(double) * c->Skv), *dp = malloc(sizeof(double) * c->Skv);
    ref_forward(o, lse, q, k, v, c, scale);
    memset(dq, 0, sizeof(double) * nq(c));
    memset(dk, 0, sizeof(double) * nkv(c));
    memset(dv, 0, sizeof(double) * nkv(c));
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < c->Sq; i++) {
                size_t qo = (((size_t)b * c->Sq + i) * H + h) * Dh;
                double L = lse[((size_t)b * H + h) * c->Sq + i], D = 0.0;
                for (int e = 0; e < Dh; e++) D += dout[qo + e] * o[qo + e];
                for (int j = 0; j < c->Skv; j++) {
                    size_t ko = (((size_t)b * c->Skv + j) * H + h) * Dh;
                    double s = 0.0, g = 0.0;
                    for (int e = 0; e < Dh; e++) s += q[qo + e] * k[ko + e], g += dout[qo + e] * v[ko + e];
                    p[j] = exp(scale * s - L);
                    dp[j] = p[j] * (g - D); /* dS */
                    for (int e = 0; e < Dh; e++) dv[ko + e] += p[j] * dout[qo + e];
                    for (int e = 0; e < Dh; e++) dk[ko + e] += scale * dp[j] * q[qo + e];
                    for (int e = 0; e < Dh; e++) dq[qo + e] += scale * dp[j] * k[ko + e];
                }
            }
    free(o), free(lse), free(p), free(dp);
}

/* max|a - b| / max|b| */
static double max_rel(const float *a, const double *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= num)) num = d; /* NaN propagates */
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / (den > 0 ? den : 1.0);
}

/* ||a - b|| / ||b|| */
static double rel_l2(const float *a, const double *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

typedef struct {
    float *q, *k, *v, *o, *lse, *g, *dq, *dk, *dv;
} attn_data;

static attn_data data_new(const attn_cfg *c, unsigned long long seed) {
    attn_data d;
    d.q = malloc(sizeof(float) * nq(c)), d.o = malloc(sizeof(float) * nq(c)), d.g = malloc(sizeof(float) * nq(c));
    d.k = malloc(sizeof(float) * nkv(c)), d.v = malloc(sizeof(float) * nkv(c));
    d.lse = malloc(sizeof(float) * nl(c));
    d.dq = calloc(nq(c), sizeof(float)), d.dk = calloc(nkv(c), sizeof(float)), d.dv = calloc(nkv(c), sizeof(float));
    test_fill_uniform(d.q, nq(c), seed, -c->mag, c->mag);
    test_fill_uniform(d.k, nkv(c), seed + 1, -c->mag, c->mag);
    test_fill_uniform(d.v, nkv(c), seed + 2, -1.0f, 1.0f);
    test_fill_uniform(d.g, nq(c), seed + 3, -1.0f, 1.0f);
    return d;
}

static void data_free(attn_data *d) {
    free(d->q), free(d->k), free(d->v), free(d->o), free(d->lse), free(d->g), free(d->dq), free(d->dk), free(d->dv);
}

static void run_fwd(attn_data *d, const attn_cfg *c) {
    k_cpu_attention_forward(d->o, d->lse, d->q, d->k, d->v, c->B, c->Sq, c->Skv, c->H, c->Dh, cfg_scale(c));
}

static void run_bwd(attn_data *d, const attn_cfg *c) {
    k_cpu_attention_backward(d->dq, d->dk, d->dv, d->g, d->q, d->k, d->v, d->o, d->lse, c->B, c->Sq, c->Skv, c->H,
                             c->Dh, cfg_scale(c));
}

TEST(attn_forward_vs_double_reference) {
    for (size_t t = 0; t < sizeof cfgs / sizeof cfgs[0]; t++) {
        const attn_cfg *c = &cfgs[t];
        attn_data d = data_new(c, 100 + t);
        run_fwd(&d, c);
        double *q = to_d(d.q, nq(c)), *k = to_d(d.k, nkv(c)), *v = to_d(d.v, nkv(c));
        double *o = malloc(sizeof(double) * nq(c)), *lse = malloc(sizeof(double) * nl(c));
        ref_forward(o, lse, q, k, v, c, 1.0 / sqrt(c->Dh));
        double eo = max_rel(d.o, o, nq(c)), el = 0.0, lmax = 0.0;
        for (size_t i = 0; i < nl(c); i++) {
            double e = fabs(d.lse[i] - lse[i]);
            el = e > el || isnan(e) ? e : el;
            lmax = fabs(lse[i]) > lmax ? fabs(lse[i]) : lmax;
        }
        CHECK_MSG(eo < 5e-6, "cfg %zu: O max rel err %.3g", t, eo);
        CHECK_MSG(el < 5e-6 * (1.0 + lmax), "cfg %zu: LSE max abs err %.3g (|lse| up to %.3g)", t, el, lmax);
        free(q), free(k), free(v), free(o), free(lse);
        data_free(&d);
    }
}

TEST(attn_backward_vs_double_analytic) {
    for (size_t t = 0; t < sizeof cfgs / sizeof cfgs[0]; t++) {
        const attn_cfg *c = &cfgs[t];
        attn_data d = data_new(c, 200 + t);
        run_fwd(&d, c);
        run_bwd(&d, c);
        double *q = to_d(d.q, nq(c)), *k = to_d(d.k, nkv(c)), *v = to_d(d.v, nkv(c)), *g = to_d(d.g, nq(c));
        double *dq = malloc(sizeof(double) * nq(c)), *dk = malloc(sizeof(double) * nkv(c));
        double *dv = malloc(sizeof(double) * nkv(c));
        ref_backward(dq, dk, dv, g, q, k, v, c, 1.0 / sqrt(c->Dh));
        double eq = rel_l2(d.dq, dq, nq(c)), ek = rel_l2(d.dk, dk, nkv(c)), ev = rel_l2(d.dv, dv, nkv(c));
        CHECK_MSG(eq < 1e-5 && ek < 1e-5 && ev < 1e-5, "cfg %zu: rel L2 dq %.3g dk %.3g dv %.3g", t, eq, ek, ev);
        free(q), free(k), free(v), free(g), free(dq), free(dk), free(dv);
        data_free(&d);
    }
}

/* Loss sum(O * G) of the double reference forward. */
static double ref_loss(const double *q, const double *k, const double *v, const double *g, const attn_cfg *c,
                       double *o, double *lse) {
    ref_forward(o, lse, q, k, v, c, 1.0 / sqrt(c->Dh));
    double L = 0.0;
    for (size_t i = 0; i < nq(c); i++) L += o[i] * g[i];
    return L;
}

/* Central differences (step 1e-4) of the double loss at every stride-th element of x (one of q, k, v);
 * compares with the fp32 analytic gradient ga on those elements. Returns the relative L2 error. */
static double fd_check(double *x, size_t n, size_t stride, const float *ga, const double *q, const double *k,
                       const double *v, const double *g, const attn_cfg *c) {
    double *o = malloc(sizeof(double) * nq(c)), *lse = malloc(sizeof(double) * nl(c));
    size_t m = (n + stride - 1) / stride;
    double *fd = malloc(sizeof(double) * m);
    float *an = malloc(sizeof(float) * m);
    const double h = 1e-4;
    for (size_t i = 0, j = 0; i < n; i += stride, j++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = ref_loss(q, k, v, g, c, o, lse);
        x[i] = x0 - h;
        double lm = ref_loss(q, k, v, g, c, o, lse);
        x[i] = x0;
        fd[j] = (lp - lm) / (2 * h);
        an[j] = ga[i];
    }
    double e = rel_l2(an, fd, m);
    free(o), free(lse), free(fd), free(an);
    return e;
}

TEST(attn_backward_vs_finite_differences) {
    /* A small shape with two key blocks, a partial query block, H = 1 and Dh = 12 (every element), and a
     * cross-attention shape with more query blocks (a strided subset of elements). */
    const attn_cfg fd_cfgs[] = {{1, 37, 101, 1, 12, 2.0f}, {2, 53, 7, 2, 16, 1.0f}};
    const size_t strides[] = {1, 3};
    for (size_t t = 0; t < 2; t++) {
        const attn_cfg *c = &fd_cfgs[t];
        attn_data d = data_new(c, 300 + t);
        run_fwd(&d, c);
        run_bwd(&d, c);
        double *q = to_d(d.q, nq(c)), *k = to_d(d.k, nkv(c)), *v = to_d(d.v, nkv(c)), *g = to_d(d.g, nq(c));
        double eq = fd_check(q, nq(c), strides[t], d.dq, q, k, v, g, c);
        double ek = fd_check(k, nkv(c), strides[t], d.dk, q, k, v, g, c);
        double ev = fd_check(v, nkv(c), strides[t], d.dv, q, k, v, g, c);
        CHECK_MSG(eq < 1e-4 && ek < 1e-4 && ev < 1e-4, "cfg %zu: FD rel L2 dq %.3g dk %.3g dv %.3g", t, eq, ek, ev);
        free(q), free(k), free(v), free(g);
        data_free(&d);
    }
}

TEST(attn_backward_accumulates) {
    const attn_cfg c = {1, 50, 40, 2, 12, 1.0f};
    attn_data d = data_new(&c, 400);
    run_fwd(&d, &c);
    run_bwd(&d, &c);
    float *dq1 = malloc(sizeof(float) * nq(&c)), *dk1 = malloc(sizeof(float) * nkv(&c));
    memcpy(dq1, d.dq, sizeof(float) * nq(&c));
    memcpy(dk1, d.dk, sizeof(float) * nkv(&c));
    run_bwd(&d, &c); /* g + g == 2 g exactly */
    int ok = 1;
    for (size_t i = 0; i < nq(&c); i++) ok &= d.dq[i] == 2.0f * dq1[i];
    for (size_t i = 0; i < nkv(&c); i++) ok &= d.dk[i] == 2.0f * dk1[i];
    CHECK_MSG(ok, "a second backward call did not add exactly the same gradient again");
    free(dq1), free(dk1);
    data_free(&d);
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

TEST(attn_thread_count_invariance) {
    const attn_cfg c = {2, 211, 150, 3, 64, 2.0f};
    attn_data d1 = data_new(&c, 500), d2 = data_new(&c, 500);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    run_fwd(&d1, &c);
    run_bwd(&d1, &c);
    omp_set_num_threads(2);
    run_fwd(&d2, &c);
    run_bwd(&d2, &c);
    omp_set_num_threads(saved);
    CHECK(same_bits(d1.o, d2.o, nq(&c)) && same_bits(d1.lse, d2.lse, nl(&c)));
    CHECK(same_bits(d1.dq, d2.dq, nq(&c)));
    CHECK(same_bits(d1.dk, d2.dk, nkv(&c)) && same_bits(d1.dv, d2.dv, nkv(&c)));
    data_free(&d1), data_free(&d2);
}

TEST(attn_batch_mate_invariance) {
    /* Sample 0 of a batch of 1 against the same sample at index 1 of a batch of 3 (mates with other values). */
    const attn_cfg c1 = {1, 130, 100, 2, 16, 2.0f}, c3 = {3, 130, 100, 2, 16, 2.0f};
    attn_data a = data_new(&c1, 600), m = data_new(&c3, 601);
    const size_t sq = nq(&c1), skv = nkv(&c1), sl = nl(&c1);
    memcpy(m.q + sq, a.q, sq * sizeof(float));
    memcpy(m.k + skv, a.k, skv * sizeof(float));
    memcpy(m.v + skv, a.v, skv * sizeof(float));
    memcpy(m.g + sq, a.g, sq * sizeof(float));
    run_fwd(&a, &c1), run_bwd(&a, &c1);
    run_fwd(&m, &c3), run_bwd(&m, &c3);
    CHECK(same_bits(a.o, m.o + sq, sq) && same_bits(a.lse, m.lse + sl, sl));
    CHECK(same_bits(a.dq, m.dq + sq, sq) && same_bits(a.dk, m.dk + skv, skv) && same_bits(a.dv, m.dv + skv, skv));
    data_free(&a), data_free(&m);
}

/* Copies keys [j0, j0+n) of every (b, h) of a [B, Skv, H, Dh] tensor into [B, n, H, Dh]. */
static float *slice_keys(const float *x, const attn_cfg *c, int j0, int n) {
    size_t row = (size_t)c->H * c->Dh;
    float *y = malloc(sizeof(float) * c->B * n * row);
    for (int b = 0; b < c->B; b++)
        memcpy(y + (size_t)b * n * row, x + ((size_t)b * c->Skv + j0) * row, sizeof(float) * n * row);
    return y;
}

static void unslice_keys(float *x, const float *y, const attn_cfg *c, int j0, int n) {
    size_t row = (size_t)c->H * c->Dh;
    for (int b = 0; b < c->B; b++)
        memcpy(x + ((size_t)b * c->Skv + j0) * row, y + (size_t)b * n * row, sizeof(float) * n * row);
}

TEST(attn_split_kv_lse_merge_matches_full) {
    const attn_cfg c = {2, 70, 150, 2, 16, 2.0f};
    const int n1 = 37, n2 = c.Skv - n1; /* split inside a key block */
    const float sc = cfg_scale(&c);
    attn_data d = data_new(&c, 700);
    run_fwd(&d, &c);
    run_bwd(&d, &c);
    float *k1 = slice_keys(d.k, &c, 0, n1), *v1 = slice_keys(d.v, &c, 0, n1);
    float *k2 = slice_keys(d.k, &c, n1, n2), *v2 = slice_keys(d.v, &c, n1, n2);
    float *o1 = malloc(sizeof(float) * nq(&c)), *o2 = malloc(sizeof(float) * nq(&c));
    float *l1 = malloc(sizeof(float) * nl(&c)), *l2 = malloc(sizeof(float) * nl(&c));
    k_cpu_attention_forward(o1, l1, d.q, k1, v1, c.B, c.Sq, n1, c.H, c.Dh, sc);
    k_cpu_attention_forward(o2, l2, d.q, k2, v2, c.B, c.Sq, n2, c.H, c.Dh, sc);
    k_cpu_lse_merge_forward(o1, l1, o1, l1, o2, l2, c.B, c.Sq, c.H, c.Dh); /* in place, as the ring does */
    double *of = to_d(d.o, nq(&c));
    CHECK_MSG(max_rel(o1, of, nq(&c)) < 1e-6, "merged O differs from full attention: %.3g", max_rel(o1, of, nq(&c)));
    double el = 0.0;
    for (size_t i = 0; i < nl(&c); i++) el = fmax(el, fabs(l1[i] - d.lse[i]));
    CHECK_MSG(el < 1e-5, "merged LSE differs by %.3g", el);

    /* Ring-style backward: each K/V part's backward with the merged O and LSE gives that part's dK, dV and its
     * share of dQ; the shares add up (accumulate) to the full dQ. */
    float *dq = calloc(nq(&c), sizeof(float)), *dk1 = calloc(nkv(&c), sizeof(float));
    float *dv1 = calloc(nkv(&c), sizeof(float)), *dk2 = calloc(nkv(&c), sizeof(float));
    float *dv2 = calloc(nkv(&c), sizeof(float));
    k_cpu_attention_backward(dq, dk1, dv1, d.g, d.q, k1, v1, o1, l1, c.B, c.Sq, n1, c.H, c.Dh, sc);
    k_cpu_attention_backward(dq, dk2, dv2, d.g, d.q, k2, v2, o1, l1, c.B, c.Sq, n2, c.H, c.Dh, sc);
    float *dk = calloc(nkv(&c), sizeof(float)), *dv = calloc(nkv(&c), sizeof(float));
    unslice_keys(dk, dk1, &c, 0, n1), unslice_keys(dk, dk2, &c, n1, n2);
    unslice_keys(dv, dv1, &c, 0, n1), unslice_keys(dv, dv2, &c, n1, n2);
    double *rq = to_d(d.dq, nq(&c)), *rk = to_d(d.dk, nkv(&c)), *rv = to_d(d.dv, nkv(&c));
    double eq = rel_l2(dq, rq, nq(&c)), ek = rel_l2(dk, rk, nkv(&c)), ev = rel_l2(dv, rv, nkv(&c));
    CHECK_MSG(eq < 1e-5 && ek < 1e-5 && ev < 1e-5, "split backward vs full: dq %.3g dk %.3g dv %.3g", eq, ek, ev);

    /* An empty partial (zero keys: o = 0, lse = -inf) merged with the full result leaves it unchanged, bitwise. */
    float *oe = malloc(sizeof(float) * nq(&c)), *le = malloc(sizeof(float) * nl(&c));
    float *om = malloc(sizeof(float) * nq(&c)), *lm = malloc(sizeof(float) * nl(&c));
    k_cpu_attention_forward(oe, le, d.q, k1, v1, c.B, c.Sq, 0, c.H, c.Dh, sc);
    CHECK(isinf(le[0]) && le[0] < 0 && oe[0] == 0.0f);
    k_cpu_lse_merge_forward(om, lm, oe, le, d.o, d.lse, c.B, c.Sq, c.H, c.Dh);
    CHECK(same_bits(om, d.o, nq(&c)) && same_bits(lm, d.lse, nl(&c)));

    free(k1), free(v1), free(k2), free(v2), free(o1), free(o2), free(l1), free(l2), free(of);
    free(dq), free(dk1), free(dv1), free(dk2), free(dv2), free(dk), free(dv), free(rq), free(rk), free(rv);
    free(oe), free(le), free(om), free(lm);
    data_free(&d);
}

/* Double merge: returns sum(o * G) + sum(lse * g2). Shapes [B, S, H, Dh] / [B, H, S] with B = 1. */
static double ref_merge_loss(const double *o1, const double *l1, const double *o2, const double *l2,
                             const double *G, const double *g2, int S, int H, int Dh) {
    double L = 0.0;
    for (int s = 0; s < S; s++)
        for (int h = 0; h < H; h++) {
            size_t li = (size_t)h * S + s, oi = ((size_t)s * H + h) * Dh;
            double m = fmax(l1[li], l2[li]), lse = m + log(exp(l1[li] - m) + exp(l2[li] - m));
            double w1 = exp(l1[li] - lse), w2 = exp(l2[li] - lse);
            for (int e = 0; e < Dh; e++) L += (w1 * o1[oi + e] + w2 * o2[oi + e]) * G[oi + e];
            L += lse * g2[li];
        }
    return L;
}

TEST(attn_lse_merge_forward_backward_fd) {
    const int S = 9, H = 2, Dh = 5, no = S * H * Dh, nl_ = H * S;
    float o1[90], o2[90], l1[18], l2[18], G[90], g2[18], o[90], lse[18];
    test_fill_uniform(o1, no, 800, -1, 1), test_fill_uniform(o2, no, 801, -1, 1);
    test_fill_uniform(l1, nl_, 802, -3, 3), test_fill_uniform(l2, nl_, 803, -3, 3);
    test_fill_uniform(G, no, 804, -1, 1), test_fill_uniform(g2, nl_, 805, -1, 1);
    l2[4] = l1[4] + 30.0f; /* one partial dominating */
    k_cpu_lse_merge_forward(o, lse, o1, l1, o2, l2, 1, S, H, Dh);
    for (int s = 0; s < S; s++)
        for (int h = 0; h < H; h++) {
            int li = h * S + s, oi = (s * H + h) * Dh;
            double L = log(exp((double)l1[li]) + exp((double)l2[li]));
            CHECK_NEAR(lse[li], L, 2e-6 * (1 + fabs(L)));
            for (int e = 0; e < Dh; e++)
                CHECK_NEAR(o[oi + e], exp(l1[li] - L) * o1[oi + e] + exp(l2[li] - L) * o2[oi + e], 2e-6);
        }

    float do1[90] = {0}, do2[90] = {0}, dl1[18] = {0}, dl2[18] = {0};
    k_cpu_lse_merge_backward(do1, dl1, do2, dl2, G, g2, o1, l1, o2, l2, 1, S, H, Dh);
    double x[2 * 90 + 2 * 18], dG[90], dg2[18];
    for (int i = 0; i < no; i++) x[i] = o1[i], x[90 + i] = o2[i], dG[i] = G[i];
    for (int i = 0; i < nl_; i++) x[180 + i] = l1[i], x[198 + i] = l2[i], dg2[i] = g2[i];
    const float *an[4] = {do1, do2, dl1, dl2};
    const int off[4] = {0, 90, 180, 198}, cnt[4] = {no, no, nl_, nl_};
    for (int part = 0; part < 4; part++) {
        double fd[90];
        for (int i = 0; i < cnt[part]; i++) {
            double *xi = &x[off[part] + i], x0 = *xi, h = 1e-5;
            *xi = x0 + h;
            double lp = ref_merge_loss(x, x + 180, x + 90, x + 198, dG, dg2, S, H, Dh);
            *xi = x0 - h;
            double lm = ref_merge_loss(x, x + 180, x + 90, x + 198, dG, dg2, S, H, Dh);
            *xi = x0;
            fd[i] = (lp - lm) / (2 * h);
        }
        double e = rel_l2(an[part], fd, cnt[part]);
        CHECK_MSG(e < 1e-5, "merge gradient part %d (do1, do2, dlse1, dlse2): FD rel L2 %.3g", part, e);
    }

    /* dlse NULL means zero: matches an explicit zero dlse; a second call accumulates exactly. */
    float z[18] = {0}, a1[90] = {0}, b1[90] = {0}, a2[18] = {0}, b2[18] = {0};
    k_cpu_lse_merge_backward(a1, a2, NULL, NULL, G, NULL, o1, l1, o2, l2, 1, S, H, Dh);
    k_cpu_lse_merge_backward(b1, b2, NULL, NULL, G, z, o1, l1, o2, l2, 1, S, H, Dh);
    CHECK(same_bits(a1, b1, no) && same_bits(a2, b2, nl_));
    k_cpu_lse_merge_backward(do1, dl1, do2, dl2, G, g2, o1, l1, o2, l2, 1, S, H, Dh);
    float do1b[90] = {0}, dl1b[18] = {0};
    k_cpu_lse_merge_backward(do1b, dl1b, NULL, NULL, G, g2, o1, l1, o2, l2, 1, S, H, Dh);
    int ok = 1;
    for (int i = 0; i < no; i++) ok &= do1[i] == 2.0f * do1b[i];
    for (int i = 0; i < nl_; i++) ok &= dl1[i] == 2.0f * dl1b[i];
    CHECK_MSG(ok, "lse_merge_backward did not accumulate");
}

TEST(attn_lse_merge_empty_partials) {
    /* Row 0: partial 1 empty (lse -inf, o NaN garbage); row 1: both empty; row 2: partial 2 empty. */
    const int S = 3, Dh = 4;
    float o1[12], o2[12], l1[3] = {-INFINITY, -INFINITY, 0.5f}, l2[3] = {1.5f, -INFINITY, -INFINITY};
    test_fill_uniform(o1, 12, 900, -1, 1), test_fill_uniform(o2, 12, 901, -1, 1);
    for (int e = 0; e < Dh; e++) o1[e] = NAN, o2[Dh + e] = NAN, o2[2 * Dh + e] = NAN;
    o1[Dh] = NAN;
    float o[12], lse[3];
    k_cpu_lse_merge_forward(o, lse, o1, l1, o2, l2, 1, S, 1, Dh);
    CHECK(lse[0] == 1.5f && lse[2] == 0.5f && isinf(lse[1]) && lse[1] < 0);
    for (int e = 0; e < Dh; e++) {
        CHECK(o[e] == o2[e]);
        CHECK(o[Dh + e] == 0.0f);
        CHECK(o[2 * Dh + e] == o1[2 * Dh + e]);
    }
    float G[12], g2[3] = {0.3f, 0.7f, -0.2f}, do1[12] = {0}, do2[12] = {0}, dl1[3] = {0}, dl2[3] = {0};
    test_fill_uniform(G, 12, 902, -1, 1);
    k_cpu_lse_merge_backward(do1, dl1, do2, dl2, G, g2, o1, l1, o2, l2, 1, S, 1, Dh);
    for (int i = 0; i < 12; i++) CHECK(isfinite(do1[i]) && isfinite(do2[i]));
    CHECK(dl1[0] == 0.0f && dl2[0] == 0.3f && dl1[1] == 0.0f && dl2[1] == 0.0f && dl1[2] == -0.2f && dl2[2] == 0.0f);
    for (int e = 0; e < Dh; e++) CHECK(do2[e] == G[e] && do1[e] == 0.0f && do1[2 * Dh + e] == G[2 * Dh + e]);
}

TEST(attn_bench_cli_usage) {
    char out[4096];
    int rc = test_run(out, sizeof out, "%s bench no-such-bench", test_vgrpo_bin());
    CHECK_MSG(rc == 2, "`vgrpo bench no-such-bench` exited %d (want 2): %s", rc, out);
    CHECK(strstr(out, "kernels") != NULL);
    rc = test_run(out, sizeof out, "%s bench kernels --threads 0", test_vgrpo_bin());
    CHECK_MSG(rc == 2, "`vgrpo bench kernels --threads 0` exited %d (want 2): %s", rc, out);
}
