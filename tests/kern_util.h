/* tests/kern_util.h — helpers shared by the kernel tests (tests/test_kernels_*.c): double copies of fp32 data,
 * error measures (docs/design.md section 8: outputs by max|a-b| / max|b|, gradients by relative L2 norm) and central
 * finite differences of a double-precision loss. */
#ifndef TESTS_KERN_UTIL_H
#define TESTS_KERN_UTIL_H

#include <stddef.h>

/* n floats uniform in [lo, hi) (test_fill_uniform), returned in a new buffer; kt_zeros: calloc'd floats. */
float *kt_rand(size_t n, unsigned long long seed, float lo, float hi);
float *kt_zeros(size_t n);
/* A new double copy of n floats. */
double *kt_to_double(const float *x, size_t n);
/* max|a - b| / max|b| (b == 0 everywhere: max|a - b|). */
double kt_max_rel(const float *a, const double *b, size_t n);
/* ||a - b||_2 / ||b||_2 (b == 0: ||a - b||_2). */
double kt_rel_l2(const float *a, const double *b, size_t n);
/* Number of elements whose bit patterns differ. */
size_t kt_bits_differ(const float *a, const float *b, size_t n);

/* Central finite differences of loss(ctx) with respect to each of the n doubles at x (perturbed in place and
 * restored): grad[i] = (loss(x + h e_i) - loss(x - h e_i)) / 2h, h = 1e-5 * max(1, |x_i|). */
typedef double (*kt_loss_fn)(void *ctx);
void kt_fd_grad(kt_loss_fn loss, void *ctx, double *x, size_t n, double *grad);

/* sum_i g[i] * y[i] in double: the scalar loss whose gradient w.r.t. y is g. */
double kt_dot(const double *g, const double *y, size_t n);

#endif
