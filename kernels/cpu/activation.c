/* kernels/cpu/activation.c — GELU (tanh approximation) and SiLU, forward and backward, elementwise fp32.
 *
 * The formulas follow torch's CPU kernels step by step (aten/src/ATen/native/cpu/Activation.cpp: GeluKernel and
 * GeluBackwardKernel with approximate="tanh", silu_kernel, silu_backward_kernel), with each product and sum
 * rounded to fp32 in the same order; tanhf/expf come from the C library, so results can differ from torch's
 * vectorised tanh/exp by an ulp or so. Elementwise: no value depends on the thread count. */
#include <math.h>
#include <stdint.h>

#include "kernels/cpu/cpu.h"

enum { PAR_MIN = 1 << 14 }; /* below this many elements a parallel region costs more than it saves */

/* sqrt(2/pi) (torch computes M_SQRT2 * M_2_SQRTPI * 0.5 in double and rounds it to fp32) and the cubic term. */
#define GELU_BETA ((float)(1.41421356237309504880 * 1.12837916709551257390 * 0.5))
#define GELU_KAPPA 0.044715f

/* out = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))). x, out [n]. torch gelu(approximate="tanh"). */
void k_cpu_gelu_forward(float *out, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float cube = v * v * v;
        float inner = GELU_BETA * (v + GELU_KAPPA * cube);
        float half_x = 0.5f * v;
        out[i] = half_x * (1.0f + tanhf(inner));
    }
}

/* dx += dout * d/dx gelu_tanh(x), with t = tanh(inner):
 * d/dx = 0.5 * (1 + t) + 0.5 * x * (1 - t^2) * sqrt(2/pi) * (1 + 3 * 0.044715 * x^2). dx, dout, x [n]. */
void k_cpu_gelu_backward(float *dx, const float *dout, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float sq = v * v;
        float cube = sq * v;
        float inner = GELU_BETA * (v + GELU_KAPPA * cube);
        float t = tanhf(inner);
        float left = 0.5f * v, right = 1.0f + t;
        float left_d = 0.5f * right;
        float tanh_d = 1.0f - t * t;
        float inner_d = GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * sq);
        float right_d = left * tanh_d * inner_d;
        float g = dout[i] * (left_d + right_d);
        dx[i] += g;
    }
}

/* out = x * sigmoid(x), computed as x / (1 + exp(-x)) (torch's form). x, out [n]. torch.nn.functional.silu. */
void k_cpu_silu_forward(float *out, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        out[i] = v / (1.0f + expf(-v));
    }
}

/* dx += dout * s * (1 + x * (1 - s)), s = 1 / (1 + exp(-x)). dx, dout, x [n]. */
void k_cpu_silu_backward(float *dx, const float *dout, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float s = 1.0f / (1.0f + expf(-v));
        float g = dout[i] * s * (1.0f + v * (1.0f - s));
        dx[i] += g;
    }
}
