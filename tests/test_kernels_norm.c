/* tests/test_kernels_norm.c — LayerNorm and RMSNorm kernels against double-precision references written here:
 * forward values, backward against central finite differences of the double forward, accumulation (+=), and
 * bitwise independence from the thread count. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "tests/kern_util.h"
#include "tests/test.h"

/* Tolerances. Forward: fp32 rounding of a few ops on O(1) values. Backward: fp32 analytic gradient against an FD
 * gradient of the double forward that is accurate to ~1e-9, so the bound is fp32 noise with margin. */
#define FWD_TOL 1e-6
#define BWD_TOL 1e-6

/* torch.nn.LayerNorm in double: biased variance, eps inside the sqrt; w, b NULL = no affine. */
static void ln_ref(double *out, const double *x, const double *w, const double *b, int N, int C, double eps) {
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += xr[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        v /= C;
        double r = 1.0 / sqrt(v + eps);
        for (int c = 0; c < C; c++) {
            double y = (xr[c] - m) * r;
            out[(size_t)n * C + c] = w ? y * w[c] + b[c] : y;
        }
    }
}

/* torch.nn.RMSNorm in double. */
static void rms_ref(double *out, const double *x, const double *w, int N, int C, double eps) {
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C;
        double ms = 0;
        for (int c = 0; c < C; c++) ms += xr[c] * xr[c];
        double r = 1.0 / sqrt(ms / C + eps);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = xr[c] * r * (w ? w[c] : 1.0);
    }
}

typedef struct {
    double *x, *w, *b, *g, *out;
    int N, C, rms;
    double eps;
} norm_ctx;

static double norm_loss(void *p) {
    norm_ctx *c = p;
    if (c->rms)
        rms_ref(c->out, c->x, c->w, c->N, c->C, c->eps);
    else
        ln_ref(c->out, c->x, c->w, c->b, c->N, c->C, c->eps);
    return kt_dot(c->g, c->out, (size_t)c->N * c->C);
}

/* Runs one forward/backward check of LayerNorm (rms = 0) or RMSNorm (rms = 1) with or without affine. */
static void check_norm(int rms, int affine, int N, int C, float eps, unsigned long long seed) {
    size_t nc = (size_t)N * C;
    float *x = kt_rand(nc, seed, -2.0f, 2.0f);
    for (int n = 0; n < N; n++) /* give rows different means and scales */
        for (int c = 0; c < C; c++) x[(size_t)n * C + c] = x[(size_t)n * C + c] * (0.5f + 0.3f * n) + (float)n - 3.0f;
    float *w = affine ? kt_rand(C, seed + 1, 0.5f, 1.5f) : NULL;
    float *b = affine && !rms ? kt_rand(C, seed + 2, -0.5f, 0.5f) : NULL;
    float *g = kt_rand(nc, seed + 3, -1.0f, 1.0f);
    float *out = kt_zeros(nc), *mean = kt_zeros(N), *rstd = kt_zeros(N);
    float *dx = kt_zeros(nc), *dw = kt_zeros(C), *db = kt_zeros(C);

    norm_ctx ctx = {kt_to_double(x, nc), w ? kt_to_double(w, C) : NULL, b ? kt_to_double(b, C) : NULL,
                    kt_to_double(g, nc), calloc(nc, sizeof(double)), N, C, rms, eps};
    double *ref = calloc(nc, sizeof(double));
    if (rms) {
        k_cpu_rmsnorm_forward(out, rstd, x, w, N, C, eps);
        rms_ref(ref, ctx.x, ctx.w, N, C, eps);
        k_cpu_rmsnorm_backward(dx, w ? dw : NULL, g, x, w, rstd, N, C);
    } else {
        k_cpu_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
        ln_ref(ref, ctx.x, ctx.w, ctx.b, N, C, eps);
        k_cpu_layernorm_backward(dx, w ? dw : NULL, w ? db : NULL, g, x, w, mean, rstd, N, C);
    }
    double e = kt_max_rel(out, ref, nc);
    CHECK_MSG(e <= FWD_TOL, "%s affine=%d N=%d C=%d: forward max rel err %.3g > %.1g", rms ? "rmsnorm" : "layernorm",
              affine, N, C, e, FWD_TOL);
    /* saved statistics */
    for (int n = 0; n < N; n++) {
        const double *xr = ctx.x + (size_t)n * C;
        double m = 0, v = 0, ms = 0;
        for (int c = 0; c < C; c++) m += xr[c], ms += xr[c] * xr[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        v /= C;
        double r = rms ? 1.0 / sqrt(ms / C + eps) : 1.0 / sqrt(v + eps);
        CHECK_NEAR(rstd[n], r, 1e-6 * r);
        if (!rms) CHECK_NEAR(mean[n], m, 1e-6 * (1 + fabs(m)));
    }

    double *fd = calloc(nc, sizeof(double));
    kt_fd_grad(norm_loss, &ctx, ctx.x, nc, fd);
    e = kt_rel_l2(dx, fd, nc);
    CHECK_MSG(e <= BWD_TOL, "%s affine=%d N=%d C=%d: dx rel L2 err %.3g > %.1g", rms ? "rmsnorm" : "layernorm",
              affine, N, C, e, BWD_TOL);
    if (w) {
        kt_fd_grad(norm_loss, &ctx, ctx.w, C, fd);
        e = kt_rel_l2(dw, fd, C);
        CHECK_MSG(e <= BWD_TOL, "%s N=%d C=%d: dw rel L2 err %.3g", rms ? "rmsnorm" : "layernorm", N, C, e);
    }
    if (b) {
        kt_fd_grad(norm_loss, &ctx, ctx.b, C, fd);
        e = kt_rel_l2(db, fd, C);
        CHECK_MSG(e <= BWD_TOL, "layernorm N=%d C=%d: db rel L2 err %.3g", N, C, e);
    }

    /* Accumulation: starting from nonzero gradients gives exactly init + (gradient from zero). */
    float *dx2 = kt_rand(nc, seed + 4, -1, 1), *dw2 = kt_rand(C, seed + 5, -1, 1), *db2 = kt_rand(C, seed + 6, -1, 1);
    float *dx0 = malloc(nc * sizeof(float)), *dw0 = malloc(C * sizeof(float)), *db0 = malloc(C * sizeof(float));
    memcpy(dx0, dx2, nc * sizeof(float)), memcpy(dw0, dw2, C * sizeof(float)), memcpy(db0, db2, C * sizeof(float));
    if (rms)
        k_cpu_rmsnorm_backward(dx2, w ? dw2 : NULL, g, x, w, rstd, N, C);
    else
        k_cpu_layernorm_backward(dx2, w ? dw2 : NULL, w ? db2 : NULL, g, x, w, mean, rstd, N, C);
    size_t bad = 0;
    for (size_t i = 0; i < nc; i++) bad += dx2[i] != dx0[i] + dx[i];
    for (int c = 0; c < C && w; c++) bad += dw2[c] != dw0[c] + dw[c];
    for (int c = 0; c < C && b; c++) bad += db2[c] != db0[c] + db[c];
    CHECK_MSG(bad == 0, "%zu gradient elements are not init + gradient", bad);

    free(x), free(w), free(b), free(g), free(out), free(mean), free(rstd), free(dx), free(dw), free(db);
    free(ctx.x), free(ctx.w), free(ctx.b), free(ctx.g), free(ctx.out), free(ref), free(fd);
    free(dx2), free(dw2), free(db2), free(dx0), free(dw0), free(db0);
}

TEST(kern_layernorm_forward_backward_fd) {
    check_norm(0, 1, 7, 13, 1e-5f, 11);
    check_norm(0, 0, 7, 13, 1e-6f, 12);
    check_norm(0, 1, 3, 100, 1e-6f, 13);
    check_norm(0, 1, 1, 1, 1e-5f, 14); /* C = 1: x_hat = 0, dx = 0 */
}

TEST(kern_rmsnorm_forward_backward_fd) {
    check_norm(1, 1, 7, 13, 1e-6f, 21);
    check_norm(1, 0, 7, 13, 1e-6f, 22);
    check_norm(1, 1, 2, 96, 1e-5f, 23);
}

/* Wide rows (model widths) and a constant row (variance 0: rstd = 1/sqrt(eps), output = bias). */
TEST(kern_layernorm_wide_and_constant_rows) {
    int N = 3, C = 1536;
    float *x = kt_rand((size_t)N * C, 31, -3, 5), *w = kt_rand(C, 32, -1, 1), *b = kt_rand(C, 33, -1, 1);
    for (int c = 0; c < C; c++) x[2 * C + c] = 0.25f;
    float *out = kt_zeros((size_t)N * C), mean[3], rstd[3];
    k_cpu_layernorm_forward(out, mean, rstd, x, w, b, N, C, 1e-6f);
    double *xd = kt_to_double(x, (size_t)N * C), *wd = kt_to_double(w, C), *bd = kt_to_double(b, C);
    double *ref = calloc((size_t)N * C, sizeof(double));
    ln_ref(ref, xd, wd, bd, N, C, 1e-6);
    double e = kt_max_rel(out, ref, (size_t)N * C);
    CHECK_MSG(e <= FWD_TOL, "wide layernorm max rel err %.3g", e);
    CHECK(mean[2] == 0.25f);
    CHECK_NEAR(rstd[2], 1000.0, 1e-3);
    for (int c = 0; c < C; c++) CHECK(out[2 * C + c] == b[c]);
    free(x), free(w), free(b), free(out), free(xd), free(wd), free(bd), free(ref);
}

/* Every output and gradient is bitwise the same with 1, 2 and 3 threads. */
TEST(kern_norm_thread_invariance) {
    int N = 67, C = 1000;
    size_t nc = (size_t)N * C;
    float *x = kt_rand(nc, 41, -2, 2), *w = kt_rand(C, 42, 0.5f, 1.5f), *b = kt_rand(C, 43, -1, 1);
    float *g = kt_rand(nc, 44, -1, 1);
    float *res[3][8];
    int saved = omp_get_max_threads();
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(t + 1);
        float *out = kt_zeros(nc), *mean = kt_zeros(N), *rstd = kt_zeros(N), *dx = kt_zeros(nc), *dw = kt_zeros(C),
              *db = kt_zeros(C), *out2 = kt_zeros(nc), *rstd2 = kt_zeros(N);
        k_cpu_layernorm_forward(out, mean, rstd, x, w, b, N, C, 1e-6f);
        k_cpu_layernorm_backward(dx, dw, db, g, x, w, mean, rstd, N, C);
        k_cpu_rmsnorm_forward(out2, rstd2, x, w, N, C, 1e-6f);
        k_cpu_rmsnorm_backward(dx, dw, g, x, w, rstd2, N, C);
        float *r[8] = {out, mean, rstd, dx, dw, db, out2, rstd2};
        memcpy(res[t], r, sizeof r);
    }
    omp_set_num_threads(saved);
    size_t len[8] = {nc, N, N, nc, C, C, nc, N};
    for (int t = 1; t < 3; t++)
        for (int k = 0; k < 8; k++)
            CHECK_MSG(kt_bits_differ(res[0][k], res[t][k], len[k]) == 0, "output %d differs with %d threads", k,
                      t + 1);
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < 8; k++) free(res[t][k]);
    free(x), free(w), free(b), free(g);
}
