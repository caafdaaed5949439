/* tests/test_kernels_util.c — implementation of tests/kern_util.h (no tests of its own). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/kern_util.h"
#include "tests/test.h"

float *kt_rand(size_t n, unsigned long long seed, float lo, float hi) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    if (!x) abort();
    test_fill_uniform(x, n, seed, lo, hi);
    return x;
}

float *kt_zeros(size_t n) {
    float *x = calloc(n ? n : 1, sizeof(float));
    if (!x) abort();
    return x;
}

double *kt_to_double(const float *x, size_t n) {
    double *d = malloc((n ? n : 1) * sizeof(double));
    if (!d) abort();
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

double kt_max_rel(const float *a, const double *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d; /* NaN propagates as a failure */
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}

double kt_rel_l2(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    if (isnan(num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

size_t kt_bits_differ(const float *a, const float *b, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return c;
}

void kt_fd_grad(kt_loss_fn loss, void *ctx, double *x, size_t n, double *grad) {
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i], h = 1e-5 * (fabs(x0) > 1 ? fabs(x0) : 1);
        x[i] = x0 + h;
        double lp = loss(ctx);
        x[i] = x0 - h;
        double lm = loss(ctx);
        x[i] = x0;
        grad[i] = (lp - lm) / (2 * h);
    }
}

double kt_dot(const double *g, const double *y, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += g[i] * y[i];
    return s;
}
