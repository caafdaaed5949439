/* kernels/body/kb_act.h — GELU (tanh approximation) and SiLU per element, forward and backward.
 *
 * The one source of this arithmetic: kernels/cpu/activation.c's loops (k_cpu_ops) and the device kernels (CUDA, the
 * emulated device) call these bodies, including their own exp (kb_expf: Cody-Waite reduction and a degree-7
 * polynomial from plain fp32 multiplies and adds, no maths library), so results are the same bits on the CPU and,
 * compiled without contraction, on the GPU too:
 *   gelu_tanh(x) = x * s(2u), u = sqrt(2/pi) (x + 0.044715 x^3), s(z) = 1 / (1 + exp(-z))
 *   silu(x)      = x / (1 + exp(-x))
 * Reference: torch gelu(approximate="tanh"), torch silu. */
#ifndef KERNELS_BODY_KB_ACT_H
#define KERNELS_BODY_KB_ACT_H

#include <math.h>

#include "kernels/body/kb_base.h"

/* sqrt(2/pi) (torch computes M_SQRT2 * M_2_SQRTPI * 0.5 in double and rounds it to fp32), and the cubic term. */
#define KB_GELU_BETA ((float)(1.41421356237309504880 * 1.12837916709551257390 * 0.5))
#define KB_GELU_KAPPA 0.044715f

/* exp(x) in fp32, max error ~2 ulp; +inf above 88, 0 below -87 (the sigmoids only need it saturated there).
 * x = n ln2 + r, |r| <= ln2/2: n by round-to-nearest (adding 1.5 * 2^23 leaves n in the low mantissa bits of t,
 * which also gives 2^n without a float-to-int conversion, so CPU loops vectorise), ln2 split in a 9-bit high part
 * (n * hi exact) and a low part; exp(r) by its Taylor series to r^7 (truncation < 0.15 ulp). Plain multiplies and
 * adds, no fma: the same results with or without FMA hardware. */
KB_FN float kb_expf(float x) {
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
    uint32_t tb = kb_f32_bits(t);
    uint32_t bits = (tb - 0x4B400000u + 127u) << 23; /* (n + 127) << 23 */
    float scale = kb_bits_f32(bits);
    float y = p * scale;
    y = x > 88.0f ? INFINITY : y;
    y = x < -87.0f ? 0.0f : y;
    return y;
}

KB_FN float kb_gelu_fwd(float v) {
    float cube = v * v * v;
    float inner = KB_GELU_BETA * (v + KB_GELU_KAPPA * cube);
    float e = kb_expf(-2.0f * inner);
    return v / (1.0f + e);
}

/* dout * d/dx gelu_tanh(x) (to be added to dx). */
KB_FN float kb_gelu_bwd(float dout, float v) {
    float sq = v * v;
    float cube = sq * v;
    float inner = KB_GELU_BETA * (v + KB_GELU_KAPPA * cube);
    float s = 1.0f / (1.0f + kb_expf(-2.0f * inner));
    float inner_d = KB_GELU_BETA * (1.0f + 3.0f * KB_GELU_KAPPA * sq);
    float two_x = 2.0f * v;
    float right = two_x * s * (1.0f - s) * inner_d;
    return dout * (s + right);
}

KB_FN float kb_silu_fwd(float v) { return v / (1.0f + kb_expf(-v)); }

/* dout * s * (1 + x (1 - s)), s = 1 / (1 + exp(-x)) (to be added to dx). */
KB_FN float kb_silu_bwd(float dout, float v) {
    float s = 1.0f / (1.0f + kb_expf(-v));
    return dout * s * (1.0f + v * (1.0f - s));
}

#endif
