/* kernels/cpu/activation.c — GELU (tanh approximation) and SiLU, forward and backward, elementwise fp32.
 *
 * Both are written through the logistic sigmoid s(z) = 1 / (1 + exp(-z)), using 0.5 * (1 + tanh(u)) = s(2u):
 *   gelu_tanh(x) = x * s(2u), u = sqrt(2/pi) * (x + 0.044715 x^3)      (torch gelu(approximate="tanh"))
 *   silu(x)      = x * s(x), computed as x / (1 + exp(-x))              (torch silu)
 * The sigmoid form has no cancellation for negative x (torch's 0.5x(1 + tanh u) loses relative accuracy there), and
 * exp is our own (k_expf below: Cody-Waite reduction and a degree-7 polynomial, plain fp32 operations), so the
 * loops vectorise (libm's tanhf/expf are scalar calls: ~10x slower on the FFN's S x 8960 activations) and the
 * results do not depend on the C library. Against a double reference: within ~2 ulp where the function is well
 * conditioned; against torch's fp32 kernels: rounding-level differences.
 * Elementwise: no value depends on the thread count. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/prof.h"

/* GCC will not if-convert the clamps in k_expf (so will not vectorise these loops) while it must preserve FP trap
 * behaviour; no code here relies on FP exceptions, and this option never changes a computed value. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

enum { PAR_MIN = (int)K_PAR_MIN_ELEMS }; /* kernels/kernels.h */

/* sqrt(2/pi) (torch computes M_SQRT2 * M_2_SQRTPI * 0.5 in double and rounds it to fp32) and the cubic term. */
#define GELU_BETA ((float)(1.41421356237309504880 * 1.12837916709551257390 * 0.5))
#define GELU_KAPPA 0.044715f

/* exp(x) in fp32, max error ~2 ulp; +inf above 88, 0 below -87 (the sigmoids below only need it saturated there).
 * x = n ln2 + r, |r| <= ln2/2: n by round-to-nearest (adding 1.5 * 2^23 leaves n in the low mantissa bits of t,
 * which also gives 2^n without a float-to-int conversion, so the loops vectorise), ln2 split in a 9-bit high part
 * (n * hi exact) and a low part; exp(r) by its Taylor series to r^7 (truncation < 0.15 ulp). Plain multiplies and
 * adds, no fma: the same results with or without FMA hardware. */
static inline float k_expf(float x) {
    float xc = x > 88.0f ? 88.0f : x;
    xc = xc < -87.0f ? -87.0f : xc;
    float t = xc * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t tb, bits;
    memcpy(&tb, &t, sizeof tb);
    bits = (tb - 0x4B400000u + 127u) << 23; /* (n + 127) << 23 */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    y = x > 88.0f ? INFINITY : y;
    y = x < -87.0f ? 0.0f : y;
    return y;
}

/* out = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), evaluated as x * s(2u) (see the top).
 * x, out [n]. Reference: torch gelu(approximate="tanh"). */
static void gelu_forward_run(float *out, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float cube = v * v * v;
        float inner = GELU_BETA * (v + GELU_KAPPA * cube);
        float e = k_expf(-2.0f * inner);
        out[i] = v / (1.0f + e);
    }
}

/* dx += dout * d/dx gelu_tanh(x). With s = s(2u) = 0.5 * (1 + tanh u) and 1 - tanh^2 u = 4 s (1 - s):
 * d/dx = s + 2 x s (1 - s) * sqrt(2/pi) * (1 + 3 * 0.044715 * x^2). dx, dout, x [n]. */
static void gelu_backward_run(float *dx, const float *dout, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float sq = v * v;
        float cube = sq * v;
        float inner = GELU_BETA * (v + GELU_KAPPA * cube);
        float s = 1.0f / (1.0f + k_expf(-2.0f * inner));
        float inner_d = GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * sq);
        float two_x = 2.0f * v;
        float right = two_x * s * (1.0f - s) * inner_d;
        float g = dout[i] * (s + right);
        dx[i] += g;
    }
}

/* out = x * sigmoid(x), computed as x / (1 + exp(-x)) (torch's form). x, out [n]. torch.nn.functional.silu. */
static void silu_forward_run(float *out, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        out[i] = v / (1.0f + k_expf(-v));
    }
}

/* dx += dout * s * (1 + x * (1 - s)), s = 1 / (1 + exp(-x)). dx, dout, x [n]. */
static void silu_backward_run(float *dx, const float *dout, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float s = 1.0f / (1.0f + k_expf(-v));
        float g = dout[i] * s * (1.0f + v * (1.0f - s));
        dx[i] += g;
    }
}

/* ---- the op table entries: the bodies above, timed when kernels/cpu/prof.h is on ---- */

void k_cpu_gelu_forward(float *out, const float *x, int64_t n) {
    K_PROF_BEGIN();
    gelu_forward_run(out, x, n);
    K_PROF_END("gelu_forward", n, 0);
}

void k_cpu_gelu_backward(float *dx, const float *dout, const float *x, int64_t n) {
    K_PROF_BEGIN();
    gelu_backward_run(dx, dout, x, n);
    K_PROF_END("gelu_backward", n, 0);
}

void k_cpu_silu_forward(float *out, const float *x, int64_t n) {
    K_PROF_BEGIN();
    silu_forward_run(out, x, n);
    K_PROF_END("silu_forward", n, 0);
}

void k_cpu_silu_backward(float *dx, const float *dout, const float *x, int64_t n) {
    K_PROF_BEGIN();
    silu_backward_run(dx, dout, x, n);
    K_PROF_END("silu_backward", n, 0);
}
