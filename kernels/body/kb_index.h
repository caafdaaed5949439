/* kernels/body/kb_index.h — element-index math in 32 bits: division by a divisor fixed for a whole launch through a
 * precomputed multiplier and shift (no division instruction per element), for index maps over tensors of fewer
 * than 2^31 elements (the launchers refuse larger ones, naming the op and the count).
 *
 * Why: a 64-bit integer division is a long software routine on the GPU (no hardware divide), and the elementwise
 * kernels decompose every element index into (batch, token, column); with 32-bit operands and a divisor known at
 * launch the quotient is one high multiply and one shift.
 *
 * The method (Granlund and Montgomery, "Division by invariant integers using multiplication", PLDI 1994, the
 * round-up variant): for 1 <= d < 2^31 let l = ceil(log2 d) and m = ceil(2^(31+l) / d) (< 2^32); for 0 <= a < 2^31,
 * floor(a / d) = floor(a m / 2^(31+l)) = umulhi(a, m) >> (l - 1) (d = 1: a). Exact: m d = 2^(31+l) + e with
 * 0 <= e < d, so a m / 2^(31+l) = a / d + a e / (d 2^(31+l)), and the added term is below 2^-l <= 1/d, which cannot
 * carry a / d (whose fraction is at most (d - 1) / d) past the next integer. tests/test_kernel_bodies.c
 * (kbody_fdiv_exact) checks it against '/' on edge and random values; the emulated device's drivers
 * (kernels/body/kb_host.h) use it too, so make test's device runs go through the same index math. */
#ifndef KERNELS_BODY_KB_INDEX_H
#define KERNELS_BODY_KB_INDEX_H

#include "kernels/body/kb_base.h"

/* Division by d (1 <= d < 2^31) for dividends below 2^31. */
typedef struct kb_fdiv {
    uint32_t d, m;
    int shift; /* l - 1; -1 for d = 1 */
} kb_fdiv;

KB_FN kb_fdiv kb_fdiv_make(uint32_t d) {
    kb_fdiv f;
    int l = 0;
    while (l < 32 && ((uint64_t)1 << l) < (uint64_t)d) l++;
    f.d = d;
    f.shift = l - 1;
    f.m = d <= 1 ? 0u : (uint32_t)((((uint64_t)1 << (31 + l)) + d - 1) / d);
    return f;
}

KB_FN uint32_t kb_fdiv_q(uint32_t a, kb_fdiv f) {
    if (f.shift < 0) return a;
#ifdef __CUDA_ARCH__
    return __umulhi(a, f.m) >> f.shift;
#else
    return (uint32_t)(((uint64_t)a * f.m) >> 32) >> f.shift;
#endif
}

/* Quotient and remainder. */
KB_FN uint32_t kb_fdiv_qr(uint32_t a, kb_fdiv f, uint32_t *r) {
    const uint32_t q = kb_fdiv_q(a, f);
    *r = a - q * f.d;
    return q;
}

/* The largest element count the 32-bit index maps take. */
#define KB_INDEX32_MAX ((size_t)INT32_MAX)

#endif
