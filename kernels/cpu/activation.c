/* kernels/cpu/activation.c — GELU (tanh approximation) and SiLU, forward and backward, elementwise fp32.
 *
 * Both are written through the logistic sigmoid s(z) = 1 / (1 + exp(-z)), using 0.5 * (1 + tanh(u)) = s(2u):
 *   gelu_tanh(x) = x * s(2u), u = sqrt(2/pi) * (x + 0.044715 x^3)      (torch gelu(approximate="tanh"))
 *   silu(x)      = x * s(x), computed as x / (1 + exp(-x))              (torch silu)
 * The sigmoid form has no cancellation for negative x (torch's 0.5x(1 + tanh u) loses relative accuracy there), and
 * exp is our own (kb_expf: Cody-Waite reduction and a degree-7 polynomial, plain fp32 operations), so the
 * loops vectorise (libm's tanhf/expf are scalar calls: ~10x slower on the FFN's S x 8960 activations) and the
 * results do not depend on the C library. Against a double reference: within ~2 ulp where the function is well
 * conditioned; against torch's fp32 kernels: rounding-level differences.
 * The element bodies are kernels/body/kb_act.h's, the ones the device kernels run (one source of the arithmetic);
 * this file adds the loops. Elementwise: no value depends on the thread count. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/prof.h"

/* GCC will not if-convert the clamps in kb_expf (so will not vectorise these loops) while it must preserve FP trap
 * behaviour; no code here relies on FP exceptions, and this option never changes a computed value. Set before the
 * element bodies are included, so that they carry it too and inline into the loops below. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "kernels/body/kb_act.h"

enum { PAR_MIN = (int)K_PAR_MIN_ELEMS }; /* kernels/kernels.h */

/* out = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), evaluated as x * s(2u) (see the top).
 * x, out [n]. Reference: torch gelu(approximate="tanh"). */
static void gelu_forward_run(float *out, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        out[i] = kb_gelu_fwd(x[i]);
    }
}

/* dx += dout * d/dx gelu_tanh(x). With s = s(2u) = 0.5 * (1 + tanh u) and 1 - tanh^2 u = 4 s (1 - s):
 * d/dx = s + 2 x s (1 - s) * sqrt(2/pi) * (1 + 3 * 0.044715 * x^2). dx, dout, x [n]. */
static void gelu_backward_run(float *dx, const float *dout, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        dx[i] += kb_gelu_bwd(dout[i], x[i]);
    }
}

/* out = x * sigmoid(x), computed as x / (1 + exp(-x)) (torch's form). x, out [n]. torch.nn.functional.silu. */
static void silu_forward_run(float *out, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        out[i] = kb_silu_fwd(x[i]);
    }
}

/* dx += dout * s * (1 + x * (1 - s)), s = 1 / (1 + exp(-x)). dx, dout, x [n]. */
static void silu_backward_run(float *dx, const float *dout, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        dx[i] += kb_silu_bwd(dout[i], x[i]);
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
