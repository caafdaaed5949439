/* kernels/body/kb_base.h — the common ground of the kernel bodies: one definition of a function for the C compiler
 * and for nvcc, the bf16 storage type with its round-to-nearest-even conversion, and typed tensor views that read
 * and write fp32 or bf16 storage while every computation stays fp32 (or double where the CPU op uses double).
 *
 * Why bodies. The CUDA backend (kernels/cuda/) and the fp32 CPU op table (kernels/cpu/) must agree: each CUDA kernel
 * launches a body from kernels/body/ over its threads (one element, one row lane, one column or one chunk each), and
 * `make test` runs the SAME bodies on the CPU (tests/test_kernel_bodies*.c through kb_host.h) against k_cpu_ops, so
 * a body that matches the CPU op bit for bit on the CPU is known correct before any GPU runs it. On the GPU the
 * bodies are compiled with `nvcc -fmad=false` (no contraction, like the CPU build's -ffp-contract=off), IEEE division
 * and square root (nvcc's defaults), so the fp32 arithmetic of a body is the same sequence of correctly rounded
 * operations on both sides. The exceptions are calls into the maths library (expf, log1pf, logf: CUDA's and glibc's
 * differ by an ulp or two); each body that makes one says so.
 *
 * The headers are C11 and C++ (nvcc) at once: no designated initialisers, no compound literals, no restrict, no VLAs.
 *
 * bf16: 1 sign, 8 exponent, 7 mantissa bits, the top half of an fp32. From fp32 by round to nearest, ties to even
 * (what __float2bfloat16_rn does on the GPU): overflow rounds to +-inf, NaN stays NaN (quieted, sign kept), -0 stays
 * -0, subnormals round like any other value. To fp32: exact (bits << 16). kb_bf16 is our own type so that the CPU
 * side needs no cuda_bf16.h; on the GPU it has the layout of __nv_bfloat16 (2 bytes, same bits). */
#ifndef KERNELS_BODY_KB_BASE_H
#define KERNELS_BODY_KB_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KB_FN __host__ __device__ static inline
#else
#define KB_FN static inline
#endif
/* Host-only helpers (scalars prepared once per call, in double, with the C library the CPU code uses). */
#define KB_HOST_FN static inline

/* bf16 storage: the upper 16 bits of an fp32. */
typedef struct kb_bf16 {
    uint16_t bits;
} kb_bf16;

KB_FN uint32_t kb_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

KB_FN float kb_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* fp32 -> bf16, round to nearest, ties to even. NaN: the top 16 bits with the quiet bit set (a payload living only
 * in the low 16 bits must not round into an infinity). Otherwise adding 0x7fff plus the lowest kept bit and
 * truncating rounds to nearest-even; a carry out of the mantissa bumps the exponent, which is right (up to +inf). */
KB_FN kb_bf16 kb_bf16_from_f32(float f) {
    uint32_t u = kb_f32_bits(f);
    kb_bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.bits = (uint16_t)((u >> 16) | 0x0040u);
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.bits = (uint16_t)(u >> 16);
    return r;
}

/* bf16 -> fp32, exact. */
KB_FN float kb_f32_from_bf16(kb_bf16 h) { return kb_bits_f32((uint32_t)h.bits << 16); }

/* The fp32 value nearest to f that bf16 can hold (what a bf16 store followed by a load gives). */
KB_FN float kb_round_bf16(float f) { return kb_f32_from_bf16(kb_bf16_from_f32(f)); }

/* ---- Typed tensor views ----
 * A body reads and writes through these so that one body serves fp32 and bf16 storage. The dtype is a run-time
 * field: uniform over a launch, so the branch costs nothing measurable next to the memory traffic of these memory-
 * bound kernels, and the CPU tests run the very same code path for both dtypes. p == NULL means "absent" where a
 * body's comment allows an optional tensor. */
typedef enum { KB_F32 = 0, KB_BF16 = 1 } kb_dtype;

typedef struct kb_in {
    const void *p;
    kb_dtype t;
} kb_in;

typedef struct kb_out {
    void *p;
    kb_dtype t;
} kb_out;

KB_FN kb_in kb_in_f32(const float *p) {
    kb_in v;
    v.p = p;
    v.t = KB_F32;
    return v;
}
KB_FN kb_in kb_in_bf16(const kb_bf16 *p) {
    kb_in v;
    v.p = p;
    v.t = KB_BF16;
    return v;
}
KB_FN kb_out kb_out_f32(float *p) {
    kb_out v;
    v.p = p;
    v.t = KB_F32;
    return v;
}
KB_FN kb_out kb_out_bf16(kb_bf16 *p) {
    kb_out v;
    v.p = p;
    v.t = KB_BF16;
    return v;
}
/* The same storage viewed read-only. */
KB_FN kb_in kb_as_in(kb_out o) {
    kb_in v;
    v.p = o.p;
    v.t = o.t;
    return v;
}

/* x[i] as fp32 (exact for either dtype). */
KB_FN float kb_get(kb_in x, size_t i) {
    return x.t == KB_BF16 ? kb_f32_from_bf16(((const kb_bf16 *)x.p)[i]) : ((const float *)x.p)[i];
}

/* y[i] = v, rounded to nearest-even when y is bf16. */
KB_FN void kb_set(kb_out y, size_t i, float v) {
    if (y.t == KB_BF16)
        ((kb_bf16 *)y.p)[i] = kb_bf16_from_f32(v);
    else
        ((float *)y.p)[i] = v;
}

/* y[i] += v: one fp32 addition of the stored value and v, then the store's rounding (the accumulate convention of
 * kernels/kernels.h; for bf16 gradients every += rounds once). */
KB_FN void kb_acc(kb_out y, size_t i, float v) {
    float old = kb_get(kb_as_in(y), i);
    kb_set(y, i, old + v);
}

#endif
