/* kernels/cpu/gemm.c — fp32 GEMM with a fixed per-element summation order (batch, position and thread invariant).
 *
 * Why not plain cblas_sgemm. OpenBLAS 0.3.21 (Debian, DYNAMIC_ARCH, core "Zen" on the development machine) does
 * not give a row of C that is independent of M or of the thread count. Measured with the same first rows of A
 * and M = 1, 2, 3, 5, 17, 64, 300 (K x N from 7x5 up to 1536x8960 and 8960x1536, all four transpose cases): for
 * every K >= 64 the shared rows differed in some or most elements; e.g. K = N = 1536, both transposed: M = 5 vs
 * M = 1 differed in 1413 of 1536 elements, M = 17 vs M = 1 in 73; with 2 threads the pattern changed again (M = 17
 * then differed like M = 5, because each thread's share of rows picks the micro-kernel). Only K <= 13 was
 * invariant. Reading the kernel (sgemm_kernel_8x4_haswell_2.c) explains it: its 16x6 tiles keep one accumulator
 * per element, while its 8x4 and 8x6 tiles accumulate even and odd k in separate registers and add them at the
 * end, so the order of the K sum depends on where a row lands in the tiling, which depends on M, on the thread
 * split and on the row's position. Other CPUs take other kernels (DYNAMIC_ARCH), so no padding rule on top of
 * OpenBLAS would be portable, and padding would still leave the result dependent on the row's position (a sample's
 * offset in the batch).
 *
 * What this file does instead. Every element is computed by the same chain of fused multiply-adds:
 *     acc = 0;  for k = 0 .. K-1 in order:  acc = fma(op(A)[m,k], op(B)[k,n], acc)
 *     c = acc;  if alpha != 1: c = alpha * c;  if beta != 0: c = c + beta * C_old (c + C_old when beta == 1);
 *     if bias: c = c + bias[n]
 * each step rounded to fp32 once (IEEE fma and single ops). The blocked kernel below (BLIS-style: packed A panels
 * of MR rows, packed B panels of NR columns, K blocked by KC with the partial accumulator stored in C exactly and
 * reloaded) performs exactly this chain for every element, whatever tile, thread, block or edge the element falls
 * in, so a row of C depends only on its row of A, on B, K, alpha, beta and bias: not on M, not on its position,
 * not on the thread count or the block sizes, not even on the CPU (an fma is exactly rounded everywhere).
 * tests/test_kernels_gemm.c checks it bit for bit against a naive fma loop and across M, row offsets and thread
 * counts.
 *
 * Paths (kernels/cpu/path.c, k_cpu_path): a 12 x 32 AVX-512 micro-kernel (24 zmm accumulators; column edges by
 * masks), the 6 x 16 AVX2/FMA one (12 ymm accumulators; edges through a local tile) and a plain C one built on fmaf.
 * Each keeps one accumulator per element and runs the chain above, so all three give the same bits (the test
 * tests/test_kernels_paths.c runs them against each other); the path is chosen at run time, the widest available.
 *
 * Speed. Threads each take a rectangle of C and pack their own operands (no barrier inside a call); each thread's
 * packing buffers are kept between calls (grown, never shrunk), so a call allocates nothing. A is read in place,
 * without packing, when its block meets few B panels (a rectangle at most NOPACK_N columns wide: the small-N GEMMs
 * of the small models and the backward's A^T B weight gradients), where packing it would cost about as much as the
 * products; edge row tiles are then packed alone (the kernels read whole MR-row tiles). beta != 0 (the backward's
 * accumulating GEMMs) with a single K block (K <= KC) applies alpha, beta*C and the bias in the micro-kernel's
 * epilogue, reading C in place; with more K blocks the partial sums would have to live in C, so the product goes
 * through a scratch block of rows first (kept per thread between calls; a single block of K up to 4 KC was tried
 * instead and ran at 0.8x: the B panel no longer fits L1). On the 2-core
 * Sapphire Rapids VM `vgrpo bench kernels` and `vgrpo bench dit` print k_cpu_gemm beside cblas_sgemm and the
 * machine's FMA peak (vgrpo bench peak). Calls with fewer rows than MR (timestep MLPs) compute a padded tile.
 * GEMM_KC/MC/NC may be overridden at compile time for tuning; they never change a value. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>
#include <omp.h>

#include "kernels/kernels.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/prof.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GEMM_AVX2 1
#endif
#if defined(GEMM_AVX2) && defined(__AVX512F__)
#define GEMM_AVX512 1
#endif

#ifndef GEMM_KC
#define GEMM_KC 256
#endif
#ifndef GEMM_MC
#define GEMM_MC 72
#endif
#ifndef GEMM_NC
#define GEMM_NC 1024
#endif
/* MR_MAX x NR_MAX bounds every path's tile; NOPACK_N, SWAP_N: see the top; POOL_B_FLOATS: the largest packed B of
 * the task-pool path. */
enum { KC = GEMM_KC, MC = GEMM_MC, NC = GEMM_NC, MR_MAX = 12, NR_MAX = 32, NOPACK_N = 256, SWAP_N = 16,
       POOL_B_FLOATS = 1 << 20, BETA_ROWS = 256, BETA_SCRATCH = 1 << 24 };

/* op(A)[m,k] and op(B)[k,n] of the BLAS convention (row-major storage). */
static inline float a_at(const float *A, int lda, int transA, int m, int k) {
    return transA ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k];
}
static inline float b_at(const float *B, int ldb, int transB, int k, int n) {
    return transB ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n];
}

/* The epilogue shared by every path: c = alpha*acc; + beta*C_old (when use_beta; C_old itself when beta == 1);
 * + bias. */
static inline float finish(float acc, float alpha, int use_beta, float beta, float old, const float *bias, int n) {
    float c = acc;
    if (alpha != 1.0f) c = alpha * c;
    if (use_beta) c = c + (beta == 1.0f ? old : beta * old);
    if (bias) c = c + bias[n];
    return c;
}

/* Naive fixed-order path, used only if scratch memory cannot be allocated: same arithmetic, same results. */
static void gemm_naive(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc, const float *bias) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc = fmaf(a_at(A, lda, transA, m, k), b_at(B, ldb, transB, k, n), acc);
            float *c = C + (size_t)m * ldc + n;
            *c = finish(acc, alpha, beta != 0.0f, beta, beta != 0.0f ? *c : 0.0f, bias, n);
        }
}

/* ---- micro-kernels ----
 * One tile: C[mr, nr] of an MR x NR tile (mr <= MR, nr <= NR valid) = the fma chain over kc values of A(i, k) =
 * a[i*ars + k*aks] (MR rows readable: packed panels are zero-padded, the driver packs edge tiles of an unpacked A)
 * and the packed B panel b[k*NR + j] (zero-padded columns), starting from 0 (load 0) or from the partial sums in c
 * (load 1); on the last K block the epilogue (alpha; beta*C_old when use_beta, only with load 0; bias: this tile's
 * first column or NULL) before the store. Only the valid rows and columns of c are read or written. */
typedef struct {
    int kc;
    const float *a;
    ptrdiff_t ars, aks;
    const float *b;
    float *c;
    ptrdiff_t ldc;
    int mr, nr, load, last, use_beta;
    float alpha, beta;
    const float *bias;
    const float *c_next; /* the next tile's C, prefetched */
} uk_args;

typedef void (*uk_fn)(const uk_args *);

/* Plain C, MR 6 x NR 16. */
static void uk_c(const uk_args *p) {
    enum { R = 6, W = 16 };
    float acc[R][W];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < W; j++) acc[i][j] = p->load && i < p->mr && j < p->nr ? p->c[i * p->ldc + j] : 0.0f;
    for (int k = 0; k < p->kc; k++)
        for (int i = 0; i < p->mr; i++) {
            const float x = p->a[i * p->ars + k * p->aks];
            for (int j = 0; j < W; j++) acc[i][j] = fmaf(x, p->b[k * W + j], acc[i][j]);
        }
    for (int i = 0; i < p->mr; i++)
        for (int j = 0; j < p->nr; j++) {
            float *c = p->c + i * p->ldc + j;
            *c = p->last ? finish(acc[i][j], p->alpha, p->use_beta, p->beta, p->use_beta ? *c : 0.0f, p->bias, j)
                         : acc[i][j];
        }
}

#ifdef GEMM_AVX2
/* AVX2+FMA, MR 6 x NR 16 (12 ymm accumulators), full tiles: A(i, k) = a[i*ars + k*aks] with one of the two strides
 * a compile-time 1 (always_inline into the two wrappers below). */
static inline __attribute__((always_inline)) void uk_avx2_full(const uk_args *p, ptrdiff_t ars, ptrdiff_t aks,
                                                               float *restrict c, ptrdiff_t ldc) {
    enum { W = 16 };
    const float *restrict a = p->a, *restrict b = p->b;
    const int kc = p->kc;
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    for (int i = 0; i < 6; i++) { /* C tiles live in memory, not cache: fetch the next tile's rows meanwhile */
        _mm_prefetch((const char *)(p->c_next + (size_t)i * p->ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(p->c_next + (size_t)i * p->ldc + W - 1), _MM_HINT_T0);
    }
    if (p->load) {
        c00 = _mm256_loadu_ps(c + 0 * ldc), c01 = _mm256_loadu_ps(c + 0 * ldc + 8);
        c10 = _mm256_loadu_ps(c + 1 * ldc), c11 = _mm256_loadu_ps(c + 1 * ldc + 8);
        c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
        c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
        c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
        c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    }
#pragma GCC unroll 4
    for (int k = 0; k < kc; k++) {
        const float *ak = a + (ptrdiff_t)k * aks;
        __m256 b0 = _mm256_load_ps(b + k * W), b1 = _mm256_load_ps(b + k * W + 8), av;
        av = _mm256_broadcast_ss(ak), c00 = _mm256_fmadd_ps(av, b0, c00), c01 = _mm256_fmadd_ps(av, b1, c01);
        av = _mm256_broadcast_ss(ak + ars), c10 = _mm256_fmadd_ps(av, b0, c10), c11 = _mm256_fmadd_ps(av, b1, c11);
        av = _mm256_broadcast_ss(ak + 2 * ars), c20 = _mm256_fmadd_ps(av, b0, c20), c21 = _mm256_fmadd_ps(av, b1, c21);
        av = _mm256_broadcast_ss(ak + 3 * ars), c30 = _mm256_fmadd_ps(av, b0, c30), c31 = _mm256_fmadd_ps(av, b1, c31);
        av = _mm256_broadcast_ss(ak + 4 * ars), c40 = _mm256_fmadd_ps(av, b0, c40), c41 = _mm256_fmadd_ps(av, b1, c41);
        av = _mm256_broadcast_ss(ak + 5 * ars), c50 = _mm256_fmadd_ps(av, b0, c50), c51 = _mm256_fmadd_ps(av, b1, c51);
    }
    if (p->last && p->alpha != 1.0f) {
        __m256 al = _mm256_set1_ps(p->alpha);
        c00 = _mm256_mul_ps(al, c00), c01 = _mm256_mul_ps(al, c01), c10 = _mm256_mul_ps(al, c10);
        c11 = _mm256_mul_ps(al, c11), c20 = _mm256_mul_ps(al, c20), c21 = _mm256_mul_ps(al, c21);
        c30 = _mm256_mul_ps(al, c30), c31 = _mm256_mul_ps(al, c31), c40 = _mm256_mul_ps(al, c40);
        c41 = _mm256_mul_ps(al, c41), c50 = _mm256_mul_ps(al, c50), c51 = _mm256_mul_ps(al, c51);
    }
    if (p->last && p->use_beta) {
#define OLD(r, h) (p->beta == 1.0f ? _mm256_loadu_ps(c + r * ldc + 8 * h)                                          \
                                   : _mm256_mul_ps(_mm256_set1_ps(p->beta), _mm256_loadu_ps(c + r * ldc + 8 * h)))
        c00 = _mm256_add_ps(c00, OLD(0, 0)), c01 = _mm256_add_ps(c01, OLD(0, 1));
        c10 = _mm256_add_ps(c10, OLD(1, 0)), c11 = _mm256_add_ps(c11, OLD(1, 1));
        c20 = _mm256_add_ps(c20, OLD(2, 0)), c21 = _mm256_add_ps(c21, OLD(2, 1));
        c30 = _mm256_add_ps(c30, OLD(3, 0)), c31 = _mm256_add_ps(c31, OLD(3, 1));
        c40 = _mm256_add_ps(c40, OLD(4, 0)), c41 = _mm256_add_ps(c41, OLD(4, 1));
        c50 = _mm256_add_ps(c50, OLD(5, 0)), c51 = _mm256_add_ps(c51, OLD(5, 1));
#undef OLD
    }
    if (p->last && p->bias) {
        __m256 v0 = _mm256_loadu_ps(p->bias), v1 = _mm256_loadu_ps(p->bias + 8);
        c00 = _mm256_add_ps(c00, v0), c01 = _mm256_add_ps(c01, v1), c10 = _mm256_add_ps(c10, v0);
        c11 = _mm256_add_ps(c11, v1), c20 = _mm256_add_ps(c20, v0), c21 = _mm256_add_ps(c21, v1);
        c30 = _mm256_add_ps(c30, v0), c31 = _mm256_add_ps(c31, v1), c40 = _mm256_add_ps(c40, v0);
        c41 = _mm256_add_ps(c41, v1), c50 = _mm256_add_ps(c50, v0), c51 = _mm256_add_ps(c51, v1);
    }
    _mm256_storeu_ps(c + 0 * ldc, c00), _mm256_storeu_ps(c + 0 * ldc + 8, c01);
    _mm256_storeu_ps(c + 1 * ldc, c10), _mm256_storeu_ps(c + 1 * ldc + 8, c11);
    _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
    _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
    _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
    _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

__attribute__((noinline)) static void uk_avx2_ars1(const uk_args *p, float *c, ptrdiff_t ldc) {
    uk_avx2_full(p, 1, p->aks, c, ldc);
}
__attribute__((noinline)) static void uk_avx2_aks1(const uk_args *p, float *c, ptrdiff_t ldc) {
    uk_avx2_full(p, p->ars, 1, c, ldc);
}

/* A tile, full or at an edge: an edge tile (mr < 6 or nr < 16) runs on a local 6 x 16 copy of its C. */
static void uk_avx2(const uk_args *p) {
    void (*fn)(const uk_args *, float *, ptrdiff_t) = p->ars == 1 ? uk_avx2_ars1 : uk_avx2_aks1;
    if (p->mr == 6 && p->nr == 16) {
        fn(p, p->c, p->ldc);
        return;
    }
    float tile[6 * 16] __attribute__((aligned(64))), bias_pad[16];
    uk_args q = *p;
    memset(tile, 0, sizeof tile);
    if (p->load || (p->last && p->use_beta))
        for (int i = 0; i < p->mr; i++) memcpy(tile + i * 16, p->c + (size_t)i * p->ldc, (size_t)p->nr * sizeof(float));
    if (p->last && p->bias) {
        memset(bias_pad, 0, sizeof bias_pad);
        memcpy(bias_pad, p->bias, (size_t)p->nr * sizeof(float));
        q.bias = bias_pad;
    }
    q.c_next = p->c;
    fn(&q, tile, 16);
    for (int i = 0; i < p->mr; i++) memcpy(p->c + (size_t)i * p->ldc, tile + i * 16, (size_t)p->nr * sizeof(float));
}
#endif

#ifdef GEMM_AVX512
/* AVX-512F, MR 12 x NR 32 (24 zmm accumulators), any tile: columns past nr masked, rows past mr neither read nor
 * written (their A rows are zero padding or a whole tile's). */
static inline __attribute__((always_inline)) void uk_avx512_body(const uk_args *p, ptrdiff_t ars, ptrdiff_t aks,
                                                                 const int MRC) {
    enum { W = 32 };
    const float *restrict a = p->a, *restrict b = p->b;
    float *restrict c = p->c;
    const ptrdiff_t ldc = p->ldc;
    const int kc = p->kc, mr = p->mr, nr = p->nr;
    const __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    const __mmask16 m1 = nr >= 32 ? (__mmask16)0xFFFF : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1u) : (__mmask16)0;
    __m512 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, c60, c61, c70, c71, c80, c81, c90, c91, ca0,
        ca1, cb0, cb1;
    for (int i = 0; i < mr; i++) {
        _mm_prefetch((const char *)(p->c_next + (size_t)i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(p->c_next + (size_t)i * ldc + W - 1), _MM_HINT_T0);
    }
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm512_setzero_ps();
    c60 = c61 = c70 = c71 = c80 = c81 = c90 = c91 = ca0 = ca1 = cb0 = cb1 = _mm512_setzero_ps();
#define LD(r, x0, x1)                                                                                             \
    if (r < mr) x0 = _mm512_maskz_loadu_ps(m0, c + r * ldc), x1 = _mm512_maskz_loadu_ps(m1, c + r * ldc + 16)
    if (p->load) {
        LD(0, c00, c01); LD(1, c10, c11); LD(2, c20, c21); LD(3, c30, c31); LD(4, c40, c41); LD(5, c50, c51);
        LD(6, c60, c61); LD(7, c70, c71); LD(8, c80, c81); LD(9, c90, c91); LD(10, ca0, ca1); LD(11, cb0, cb1);
    }
#pragma GCC unroll 2
    for (int k = 0; k < kc; k++) {
        const float *ak = a + (ptrdiff_t)k * aks;
        const __m512 b0 = _mm512_load_ps(b + k * W), b1 = _mm512_load_ps(b + k * W + 16);
        __m512 av;
#define STEP(r, x0, x1)                                                                                           \
    if (r < MRC) av = _mm512_set1_ps(ak[r * ars]), x0 = _mm512_fmadd_ps(av, b0, x0), x1 = _mm512_fmadd_ps(av, b1, x1)
        STEP(0, c00, c01); STEP(1, c10, c11); STEP(2, c20, c21); STEP(3, c30, c31); STEP(4, c40, c41);
        STEP(5, c50, c51); STEP(6, c60, c61); STEP(7, c70, c71); STEP(8, c80, c81); STEP(9, c90, c91);
        STEP(10, ca0, ca1); STEP(11, cb0, cb1);
#undef STEP
    }
    if (p->last) {
        if (p->alpha != 1.0f) {
            const __m512 al = _mm512_set1_ps(p->alpha);
#define MUL(x0, x1) x0 = _mm512_mul_ps(al, x0), x1 = _mm512_mul_ps(al, x1)
            MUL(c00, c01); MUL(c10, c11); MUL(c20, c21); MUL(c30, c31); MUL(c40, c41); MUL(c50, c51);
            MUL(c60, c61); MUL(c70, c71); MUL(c80, c81); MUL(c90, c91); MUL(ca0, ca1); MUL(cb0, cb1);
#undef MUL
        }
        if (p->use_beta) {
            const int one = p->beta == 1.0f;
            const __m512 be = _mm512_set1_ps(p->beta);
#define BETA(r, x0, x1)                                                                                           \
    if (r < mr) {                                                                                                 \
        __m512 o0 = _mm512_maskz_loadu_ps(m0, c + r * ldc), o1 = _mm512_maskz_loadu_ps(m1, c + r * ldc + 16);      \
        if (!one) o0 = _mm512_mul_ps(be, o0), o1 = _mm512_mul_ps(be, o1);                                          \
        x0 = _mm512_add_ps(x0, o0), x1 = _mm512_add_ps(x1, o1);                                                   \
    }
            BETA(0, c00, c01) BETA(1, c10, c11) BETA(2, c20, c21) BETA(3, c30, c31) BETA(4, c40, c41)
            BETA(5, c50, c51) BETA(6, c60, c61) BETA(7, c70, c71) BETA(8, c80, c81) BETA(9, c90, c91)
            BETA(10, ca0, ca1) BETA(11, cb0, cb1)
#undef BETA
        }
        if (p->bias) {
            const __m512 v0 = _mm512_maskz_loadu_ps(m0, p->bias), v1 = _mm512_maskz_loadu_ps(m1, p->bias + 16);
#define ADD(x0, x1) x0 = _mm512_add_ps(x0, v0), x1 = _mm512_add_ps(x1, v1)
            ADD(c00, c01); ADD(c10, c11); ADD(c20, c21); ADD(c30, c31); ADD(c40, c41); ADD(c50, c51);
            ADD(c60, c61); ADD(c70, c71); ADD(c80, c81); ADD(c90, c91); ADD(ca0, ca1); ADD(cb0, cb1);
#undef ADD
        }
    }
#define ST(r, x0, x1)                                                                                             \
    if (r < mr) _mm512_mask_storeu_ps(c + r * ldc, m0, x0), _mm512_mask_storeu_ps(c + r * ldc + 16, m1, x1)
    ST(0, c00, c01); ST(1, c10, c11); ST(2, c20, c21); ST(3, c30, c31); ST(4, c40, c41); ST(5, c50, c51);
    ST(6, c60, c61); ST(7, c70, c71); ST(8, c80, c81); ST(9, c90, c91); ST(10, ca0, ca1); ST(11, cb0, cb1);
#undef ST
#undef LD
}

/* Instantiations: the two A strides, and 12, 8 or 4 rows computed (an edge tile of mr <= 8 or <= 4 rows skips the
 * products of the rows it does not have). */
#define UK512(name, ars, aks, mrc)                                                                                \
    __attribute__((noinline)) static void name(const uk_args *p) { uk_avx512_body(p, ars, aks, mrc); }
UK512(uk_avx512_ars1_12, 1, p->aks, 12)
UK512(uk_avx512_ars1_8, 1, p->aks, 8)
UK512(uk_avx512_ars1_4, 1, p->aks, 4)
UK512(uk_avx512_aks1_12, p->ars, 1, 12)
UK512(uk_avx512_aks1_8, p->ars, 1, 8)
UK512(uk_avx512_aks1_4, p->ars, 1, 4)
#undef UK512
static void uk_avx512(const uk_args *p) {
    if (p->ars == 1)
        (p->mr > 8 ? uk_avx512_ars1_12 : p->mr > 4 ? uk_avx512_ars1_8 : uk_avx512_ars1_4)(p);
    else
        (p->mr > 8 ? uk_avx512_aks1_12 : p->mr > 4 ? uk_avx512_aks1_8 : uk_avx512_aks1_4)(p);
}
#endif

/* The micro-kernel and tile of a path. */
typedef struct {
    int mr, nr;
    uk_fn fn;
} uk_path;

static uk_path path_of(k_cpu_path p) {
#ifdef GEMM_AVX512
    if (p == K_CPU_PATH_AVX512) return (uk_path){12, 32, uk_avx512};
#endif
#ifdef GEMM_AVX2
    if (p == K_CPU_PATH_AVX2 || p == K_CPU_PATH_AVX512) return (uk_path){6, 16, uk_avx2};
#endif
    (void)p;
    return (uk_path){6, 16, uk_c};
}

/* ---- packing ---- */

#ifdef GEMM_AVX512
/* One full 12-row panel of a row-major A (rows r[i] = A + i*lda, k from 0 to kc): p[k*12 + i] = r[i][k], 16 values of
 * k at a time through a 16 x 16 in-register transpose (rows 12..15 zero, never stored); the rest one by one. Only
 * moves values. */
static void pack_a12_rows(float *p, const float *a, size_t lda, int kc) {
    int k = 0;
    const __m512i lo64 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi64 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    const __m512i lo128 = _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11), hi128 = _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15);
    for (; k + 16 <= kc; k += 16) {
        __m512 r[16], t[16];
        for (int i = 0; i < 12; i++) r[i] = _mm512_loadu_ps(a + i * lda + k);
        for (int i = 12; i < 16; i++) r[i] = _mm512_setzero_ps();
        /* 4 x 4 blocks of 4 x 4: within each 128-bit lane, then across lanes */
        for (int i = 0; i < 16; i += 4) {
            const __m512 u0 = _mm512_unpacklo_ps(r[i], r[i + 1]), u1 = _mm512_unpackhi_ps(r[i], r[i + 1]);
            const __m512 u2 = _mm512_unpacklo_ps(r[i + 2], r[i + 3]), u3 = _mm512_unpackhi_ps(r[i + 2], r[i + 3]);
            t[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u0), _mm512_castps_pd(u2)));
            t[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u0), _mm512_castps_pd(u2)));
            t[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u1), _mm512_castps_pd(u3)));
            t[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u1), _mm512_castps_pd(u3)));
        }
        /* t[i + c] (i = 4 g) holds, in 128-bit lane L, rows 4g..4g+3 at k = 4L + c. Gather lane L of the four groups. */
        for (int c = 0; c < 4; c++) {
            const __m512i a01 = _mm512_castps_si512(t[c]), a23 = _mm512_castps_si512(t[4 + c]);
            const __m512i b01 = _mm512_castps_si512(t[8 + c]), b23 = _mm512_castps_si512(t[12 + c]);
            /* x: lanes (g0 L0, g1 L0, g0 L1, g1 L1), y: (g0 L2, g1 L2, g0 L3, g1 L3); likewise for groups 2, 3 */
            const __m512i x0 = _mm512_permutex2var_epi64(a01, lo64, a23), y0 = _mm512_permutex2var_epi64(a01, hi64, a23);
            const __m512i x1 = _mm512_permutex2var_epi64(b01, lo64, b23), y1 = _mm512_permutex2var_epi64(b01, hi64, b23);
            const __m512 k0 = _mm512_castsi512_ps(_mm512_permutex2var_epi64(x0, lo128, x1));
            const __m512 k1 = _mm512_castsi512_ps(_mm512_permutex2var_epi64(x0, hi128, x1));
            const __m512 k2 = _mm512_castsi512_ps(_mm512_permutex2var_epi64(y0, lo128, y1));
            const __m512 k3 = _mm512_castsi512_ps(_mm512_permutex2var_epi64(y0, hi128, y1));
            _mm512_mask_storeu_ps(p + (size_t)(k + c) * 12, 0x0FFF, k0);
            _mm512_mask_storeu_ps(p + (size_t)(k + 4 + c) * 12, 0x0FFF, k1);
            _mm512_mask_storeu_ps(p + (size_t)(k + 8 + c) * 12, 0x0FFF, k2);
            _mm512_mask_storeu_ps(p + (size_t)(k + 12 + c) * 12, 0x0FFF, k3);
        }
    }
    for (; k < kc; k++)
        for (int i = 0; i < 12; i++) p[(size_t)k * 12 + i] = a[i * lda + k];
}
#endif

/* Packs op(A)[m0 .. m0+mc, k0 .. k0+kc] as ceil(mc/MR) panels, each kc x MR (ap[k*MR + i]); rows past mc are 0. */
static void pack_a(float *ap, int MR, const float *A, int lda, int transA, int m0, int mc, int k0, int kc) {
#ifdef GEMM_AVX512
    if (MR == 12 && transA && mc >= 12) { /* the full panels row by row of the stored A: mc consecutive values each */
        const int full = mc / 12 * 12;
        for (int k = 0; k < kc; k++) {
            const float *src = A + (size_t)(k0 + k) * lda + m0;
            for (int ir = 0; ir < full; ir += 12)
                _mm512_mask_storeu_ps(ap + (size_t)ir * kc + (size_t)k * 12, 0x0FFF, _mm512_maskz_loadu_ps(0x0FFF, src + ir));
        }
        if (full == mc) return;
        ap += (size_t)full * kc, m0 += full, mc -= full; /* the edge panel below */
    }
#endif
    for (int ir = 0; ir < mc; ir += MR) {
        int mr = mc - ir < MR ? mc - ir : MR;
        float *p = ap + (size_t)ir * kc;
#ifdef GEMM_AVX512
        if (MR == 12 && mr == 12 && !transA) { /* (a transposed A's full panels are packed above) */
            pack_a12_rows(p, A + (size_t)(m0 + ir) * lda + k0, (size_t)lda, kc);
            continue;
        }
#endif
        if (transA) {
            for (int k = 0; k < kc; k++) {
                const float *src = A + (size_t)(k0 + k) * lda + m0 + ir;
                int i = 0;
                for (; i < mr; i++) p[k * MR + i] = src[i];
                for (; i < MR; i++) p[k * MR + i] = 0.0f;
            }
        } else {
            for (int i = 0; i < MR; i++) {
                if (i < mr) {
                    const float *r = A + (size_t)(m0 + ir + i) * lda + k0;
                    for (int k = 0; k < kc; k++) p[k * MR + i] = r[k];
                } else {
                    for (int k = 0; k < kc; k++) p[k * MR + i] = 0.0f;
                }
            }
        }
    }
}

#ifdef GEMM_AVX2
/* dst[t*ldd + j] = src_j[t] for an 8 x 8 block: rows src_j = src + j*lds (8 floats each), an in-register transpose. */
static inline void transpose8x8_to_panel(float *dst, size_t ldd, const float *src, size_t lds) {
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds), r2 = _mm256_loadu_ps(src + 2 * lds),
           r3 = _mm256_loadu_ps(src + 3 * lds), r4 = _mm256_loadu_ps(src + 4 * lds),
           r5 = _mm256_loadu_ps(src + 5 * lds), r6 = _mm256_loadu_ps(src + 6 * lds),
           r7 = _mm256_loadu_ps(src + 7 * lds);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
           t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
           t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
           u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
           u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
           u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_store_ps(dst + 0 * ldd, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_store_ps(dst + 1 * ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_store_ps(dst + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_store_ps(dst + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_store_ps(dst + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_store_ps(dst + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_store_ps(dst + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_store_ps(dst + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

/* Packs one NR-column panel of op(B)[k0 .. k0+kc, n0 .. n0+nr] as bp[k*NR + j] (bp 64-byte aligned); columns past
 * nr are 0. With transB the panel is a transpose, done in 8 x 8 register blocks where AVX2 is available. */
static void pack_b_panel(float *bp, int NR, const float *B, int ldb, int transB, int k0, int kc, int n0, int nr) {
    if (transB) {
        int kb = 0;
#ifdef GEMM_AVX2
        if (nr == NR && k_cpu_get_path() != K_CPU_PATH_C) {
            const float *src = B + (size_t)n0 * ldb + k0;
            for (; kb + 8 <= kc; kb += 8)
                for (int j = 0; j < NR; j += 8)
                    transpose8x8_to_panel(bp + (size_t)kb * NR + j, (size_t)NR, src + (size_t)j * ldb + kb,
                                          (size_t)ldb);
        }
#endif
        for (int j = 0; j < NR; j++) {
            if (j < nr) {
                const float *src = B + (size_t)(n0 + j) * ldb + k0;
                for (int k = kb; k < kc; k++) bp[k * NR + j] = src[k];
            } else {
                for (int k = kb; k < kc; k++) bp[k * NR + j] = 0.0f;
            }
        }
    } else {
        for (int k = 0; k < kc; k++) {
            const float *src = B + (size_t)(k0 + k) * ldb + n0;
            int j = 0;
            for (; j < nr; j++) bp[k * NR + j] = src[j];
            for (; j < NR; j++) bp[k * NR + j] = 0.0f;
        }
    }
}

/* This thread's packing buffer of at least `floats` floats, 64-byte aligned, kept for the next call (grown, never
 * shrunk; k_cpu_release_thread frees it before a thread exits). NULL when it cannot be allocated. */
static __thread float *tls_buf;
static __thread size_t tls_cap;
static float *thread_buffer(size_t floats) {
    if (floats <= tls_cap) return tls_buf;
    float *p = NULL;
    size_t cap = floats + floats / 4 + 1024;
    if (posix_memalign((void **)&p, 64, cap * sizeof(float))) return NULL;
    free(tls_buf);
    tls_buf = p, tls_cap = cap;
    return p;
}

/* One thread's rectangle C[m0:m1, n0:n1] = epilogue(op(A) @ op(B)), BLIS loop order: column blocks of NC, K
 * blocks of KC (B block packed once), row blocks of MC (A block packed, or read in place), then NR-wide B panels
 * against MR-row A tiles. beta != 0 only with K <= KC (one K block: the epilogue reads C_old). Returns -1 if its
 * packing buffer cannot be allocated. */
static int gemm_rect(const uk_path *up, int transA, int transB, int m0, int m1, int n0, int n1, int K,
                     float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                     const float *bias) {
    const int MR = up->mr, NR = up->nr;
    const int ncols = n1 - n0, nc_max = ncols < NC ? ncols : NC, kc_max = K < KC ? K : KC;
    const int mc_max = m1 - m0 < MC ? m1 - m0 : MC;
    const int packA = ncols > NOPACK_N;
    const size_t bp_floats = (size_t)((nc_max + NR - 1) / NR) * NR * kc_max;
    const size_t ap_floats = packA ? (size_t)((mc_max + MR - 1) / MR) * MR * kc_max : (size_t)MR * kc_max;
    float *bp = thread_buffer(bp_floats + ap_floats);
    if (!bp) return -1;
    float *ap = bp + bp_floats;
    for (int jc = n0; jc < n1; jc += NC) {
        int nc = n1 - jc < NC ? n1 - jc : NC, npan = (nc + NR - 1) / NR;
        for (int pc = 0; pc < K; pc += KC) {
            int kc = K - pc < KC ? K - pc : KC, first = pc == 0, last = pc + kc >= K;
            for (int p = 0; p < npan; p++) {
                int nr = nc - p * NR < NR ? nc - p * NR : NR;
                pack_b_panel(bp + (size_t)p * NR * kc, NR, B, ldb, transB, pc, kc, jc + p * NR, nr);
            }
            for (int ic = m0; ic < m1; ic += MC) {
                int mc = m1 - ic < MC ? m1 - ic : MC;
                if (packA) pack_a(ap, MR, A, lda, transA, ic, mc, pc, kc);
                uk_args u = {.kc = kc, .ldc = ldc, .load = !first, .last = last, .use_beta = beta != 0.0f,
                             .alpha = alpha, .beta = beta};
                for (int ir = 0; ir < mc; ir += MR) {
                    const int mr = mc - ir < MR ? mc - ir : MR;
                    if (packA) {
                        u.a = ap + (size_t)ir * kc, u.ars = 1, u.aks = MR;
                    } else if (mr < MR) { /* an edge tile of an unpacked A: the kernels read MR rows */
                        pack_a(ap, MR, A, lda, transA, ic + ir, mr, pc, kc);
                        u.a = ap, u.ars = 1, u.aks = MR;
                    } else if (transA) {
                        u.a = A + (size_t)pc * lda + ic + ir, u.ars = 1, u.aks = lda;
                    } else {
                        u.a = A + (size_t)(ic + ir) * lda + pc, u.ars = lda, u.aks = 1;
                    }
                    u.mr = mr;
                    for (int p = 0; p < npan; p++) {
                        u.nr = nc - p * NR < NR ? nc - p * NR : NR;
                        u.b = bp + (size_t)p * NR * kc;
                        u.c = C + (size_t)(ic + ir) * ldc + jc + p * NR;
                        u.bias = last && bias ? bias + jc + p * NR : NULL;
                        u.c_next = p + 1 < npan ? u.c + NR : u.c;
                        up->fn(&u);
                    }
                }
            }
        }
    }
    return 0;
}

/* Splits C among the team as a tr x tc grid of rectangles (whole MR/NR tiles), choosing the grid that minimises
 * one thread's compute plus packing. Each thread packs its own A rows and B columns, so threads never wait for
 * each other (no barrier inside; a parallel region per call). The grid never changes a value (see the top). */
static void choose_grid(int nt, int MR, int NR, int M, int N, int K, int *tr_out, int *tc_out) {
    double best = 0;
    int rp = (M + MR - 1) / MR, cp = (N + NR - 1) / NR;
    *tr_out = 1, *tc_out = 1;
    for (int tr = 1; tr <= nt; tr++) {
        if (nt % tr) continue;
        int tc = nt / tr;
        if (tr > rp || tc > cp) continue;
        double mt = (double)((rp + tr - 1) / tr) * MR, ntc = (double)((cp + tc - 1) / tc) * NR;
        double ncb = ceil(ntc / NC);
        double cost = 2.0 * mt * ntc * K + 8.0 * ((double)K * ntc + (double)K * mt * ncb);
        if (best == 0 || cost < best) best = cost, *tr_out = tr, *tc_out = tc;
    }
}

/* ---- the task-pool path (kernels/cpu/pool.h): B packed once, row blocks as tasks ---- */

typedef struct {
    const uk_path *up;
    int transA, transB, M, N, K, lda, ldb, ldc, rows, npan;
    float alpha, beta;
    const float *A, *B, *bias, *bp; /* bp: every K block's B panels, one block after the other */
    float *C;
} gemm_job;

/* Task t: rows [t*rows, (t+1)*rows) of C, every column, every K block (the chains of gemm_rect). */
static void gemm_task(void *ctx, int t) {
    const gemm_job *j = ctx;
    const int MR = j->up->mr, NR = j->up->nr, m0 = t * j->rows, m1 = m0 + j->rows < j->M ? m0 + j->rows : j->M;
    const int packA = j->N > NOPACK_N, kc_max = j->K < KC ? j->K : KC;
    float *ap = thread_buffer((size_t)(packA ? (m1 - m0 + MR - 1) / MR * MR : MR) * kc_max);
    if (!ap) { /* no memory for packing: these rows by the naive chain (same values) */
        const float *At = j->transA ? j->A + m0 : j->A + (size_t)m0 * j->lda;
        gemm_naive(j->transA, j->transB, m1 - m0, j->N, j->K, j->alpha, At, j->lda, j->B, j->ldb, j->beta,
                   j->C + (size_t)m0 * j->ldc, j->ldc, j->bias);
        return;
    }
    const float *bpk = j->bp;
    for (int pc = 0; pc < j->K; pc += KC) {
        const int kc = j->K - pc < KC ? j->K - pc : KC, first = pc == 0, last = pc + kc >= j->K;
        if (packA) pack_a(ap, MR, j->A, j->lda, j->transA, m0, m1 - m0, pc, kc);
        uk_args u = {.kc = kc, .ldc = j->ldc, .load = !first, .last = last, .use_beta = j->beta != 0.0f,
                     .alpha = j->alpha, .beta = j->beta};
        for (int ir = m0; ir < m1; ir += MR) {
            const int mr = m1 - ir < MR ? m1 - ir : MR;
            if (packA) {
                u.a = ap + (size_t)(ir - m0) * kc, u.ars = 1, u.aks = MR;
            } else if (mr < MR) {
                pack_a(ap, MR, j->A, j->lda, j->transA, ir, mr, pc, kc);
                u.a = ap, u.ars = 1, u.aks = MR;
            } else if (j->transA) {
                u.a = j->A + (size_t)pc * j->lda + ir, u.ars = 1, u.aks = j->lda;
            } else {
                u.a = j->A + (size_t)ir * j->lda + pc, u.ars = j->lda, u.aks = 1;
            }
            u.mr = mr;
            for (int p = 0; p < j->npan; p++) {
                u.nr = j->N - p * NR < NR ? j->N - p * NR : NR;
                u.b = bpk + (size_t)p * NR * kc;
                u.c = j->C + (size_t)ir * j->ldc + p * NR;
                u.bias = last && j->bias ? j->bias + p * NR : NULL;
                u.c_next = p + 1 < j->npan ? u.c + NR : u.c;
                j->up->fn(&u);
            }
        }
        bpk += (size_t)j->npan * NR * kc;
    }
}

/* The shared packed B of the pool path, on the calling thread (apart from thread_buffer, which its tasks use). */
static __thread float *tls_bshared;
static __thread size_t tls_bshared_cap;

/* The pool path for B up to POOL_B_FLOATS packed floats and N <= NC: 0, or -1 (not taken: too large, or no
 * memory) with nothing written. */
static int gemm_pooled(const uk_path *up, int nt, int transA, int transB, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                       const float *bias) {
    const int NR = up->nr, npan = (N + NR - 1) / NR;
    const size_t bfl = (size_t)npan * NR * K;
    if (N > NC || bfl > POOL_B_FLOATS) return -1;
    if (bfl > tls_bshared_cap) {
        float *p = NULL;
        if (posix_memalign((void **)&p, 64, bfl * sizeof(float))) return -1;
        free(tls_bshared);
        tls_bshared = p, tls_bshared_cap = bfl;
    }
    float *bp = tls_bshared;
    for (int pc = 0, off = 0; pc < K; pc += KC) {
        const int kc = K - pc < KC ? K - pc : KC;
        for (int p = 0; p < npan; p++) {
            const int nr = N - p * NR < NR ? N - p * NR : NR;
            pack_b_panel(bp + (size_t)off + (size_t)p * NR * kc, NR, B, ldb, transB, pc, kc, p * NR, nr);
        }
        off += npan * NR * kc;
    }
    /* about four tasks per thread, whole MR tiles, at least two tiles each */
    int rows = (M + 4 * nt - 1) / (4 * nt);
    rows = (rows + up->mr - 1) / up->mr * up->mr;
    if (rows < 2 * up->mr) rows = 2 * up->mr;
    gemm_job j = {.up = up, .transA = transA, .transB = transB, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb,
                  .ldc = ldc, .rows = rows, .npan = npan, .alpha = alpha, .beta = beta, .A = A, .B = B, .bias = bias,
                  .bp = bp, .C = C};
    k_pool_run((M + rows - 1) / rows, gemm_task, &j);
    return 0;
}

/* C[M,N] = epilogue(op(A) @ op(B)) (beta != 0 only with K <= KC), threaded over row blocks (the task pool, when B is
 * small enough to pack once for all threads) or rectangles of C (an OpenMP region). Requires M, N, K >= 1. */
static void gemm_blocked(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc, const float *bias) {
    const uk_path up = path_of(k_cpu_get_path());
    double flops = 2.0 * M * N * K;
    int nt = omp_get_max_threads();
    if (flops < (double)nt * (1 << 22)) nt = (int)(flops / (1 << 22)) > 1 ? (int)(flops / (1 << 22)) : 1;
    if (nt > 1 && !omp_in_parallel() &&
        !gemm_pooled(&up, nt, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias))
        return;
    if (nt == 1) { /* no parallel region: one rectangle on this thread */
        if (gemm_rect(&up, transA, transB, 0, M, 0, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias))
            gemm_naive(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int team = omp_get_num_threads(), t = omp_get_thread_num(), tr, tc;
        choose_grid(team, up.mr, up.nr, M, N, K, &tr, &tc);
        if (t < tr * tc) {
            int rp = (M + up.mr - 1) / up.mr, cp = (N + up.nr - 1) / up.nr, ti = t / tc, tj = t % tc;
            int m0 = (int)((long)rp * ti / tr) * up.mr, m1 = (int)((long)rp * (ti + 1) / tr) * up.mr;
            int n0 = (int)((long)cp * tj / tc) * up.nr, n1 = (int)((long)cp * (tj + 1) / tc) * up.nr;
            if (m1 > M) m1 = M;
            if (n1 > N) n1 = N;
            if (m0 < m1 && n0 < n1 &&
                gemm_rect(&up, transA, transB, m0, m1, n0, n1, K, alpha, A, lda, B, ldb, beta, C, ldc, bias)) {
                /* no memory for packing: this rectangle by the naive chain (same values) */
                const float *At = transA ? A + m0 : A + (size_t)m0 * lda;
                const float *Bt = transB ? B + (size_t)n0 * ldb : B + n0;
                gemm_naive(transA, transB, m1 - m0, n1 - n0, K, alpha, At, lda, Bt, ldb, beta,
                           C + (size_t)m0 * ldc + n0, ldc, bias ? bias + n0 : NULL);
            }
        }
    }
}

/* The beta path's scratch on this thread, kept between calls like thread_buffer's. */
static __thread float *tls_beta;
static __thread size_t tls_beta_cap;
static float *beta_scratch(size_t floats) {
    if (floats <= tls_beta_cap) return tls_beta;
    float *p = malloc(floats * sizeof(float));
    if (!p) return NULL;
    free(tls_beta);
    tls_beta = p, tls_beta_cap = floats;
    return p;
}

/* A narrow C (N < SWAP_N columns, at least 2 SWAP_N rows: the small VAE's convolutions with 3 to 8 output channels)
 * wastes most of an NR-wide B panel. It is computed transposed instead, C^T[N, M] = op(B)^T op(A)^T, into scratch,
 * and written back through the epilogue: element (n, m) of C^T is the chain of fma(op(B)[k,n], op(A)[m,k]) over k
 * in order, and fma(x, y, acc) == fma(y, x, acc) exactly, so every value is the one the direct product gives.
 * Returns -1 (nothing written) when the scratch cannot be allocated. */
static int gemm_swapped(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc, const float *bias) {
    float *ct = malloc(sizeof(float) * (size_t)M * N);
    if (!ct) return -1;
    /* A' = op(B)^T [N, K]: stored [N, K] (lda' = ldb) when transB, else [K, N] transposed; B' = op(A)^T [K, M]:
     * stored [K, M] when transA, else [M, K] transposed. */
    gemm_blocked(!transB, !transA, N, M, K, 1.0f, B, ldb, A, lda, 0.0f, ct, M, NULL);
    for (int m = 0; m < M; m++) {
        float *crow = C + (size_t)m * ldc;
        for (int n = 0; n < N; n++)
            crow[n] = finish(ct[(size_t)n * M + m], alpha, beta != 0.0f, beta, beta != 0.0f ? crow[n] : 0.0f, bias, n);
    }
    free(ct);
    return 0;
}

/* C[M,N] = alpha * op(A) @ op(B) + beta * C, then + bias[n]; contract and exact arithmetic in kernels/kernels.h and
 * at the top of this file. Row-major; op(A) is [M,K] (A stored [M,K], lda >= K, or with transA [K,M], lda >= M);
 * op(B) is [K,N] (B stored [K,N], ldb >= N, or with transB [N,K], ldb >= K). beta == 0 never reads C. Invalid
 * sizes (M, N <= 0) do nothing. Reference: BLAS sgemm (row-major cblas_sgemm) plus a broadcast bias. */
static void gemm_run(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc, const float *bias) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) { /* BLAS convention: A and B are not read; acc = 0 */
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                float *c = C + (size_t)m * ldc + n;
                *c = finish(0.0f, alpha, beta != 0.0f, beta, beta != 0.0f ? *c : 0.0f, bias, n);
            }
        return;
    }
    if (N < SWAP_N && M >= 2 * SWAP_N &&
        !gemm_swapped(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias))
        return;
    if (beta == 0.0f || K <= KC) {
        gemm_blocked(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
        return;
    }
    /* beta != 0 over several K blocks: the product goes to a scratch block of rows, then c = alpha*acc + beta*C_old
     * (+ bias). Rows are independent, so processing them in blocks does not change any value; blocks are as large as
     * BETA_SCRATCH floats allow (at least BETA_ROWS rows) so that B is packed few times. */
    long fit = BETA_SCRATCH / N;
    int rows = fit < BETA_ROWS ? BETA_ROWS : (fit > M ? M : (int)fit);
    if (rows > M) rows = M;
    float *t = beta_scratch((size_t)rows * N);
    for (int m0 = 0; m0 < M; m0 += rows) {
        int mb = M - m0 < rows ? M - m0 : rows;
        const float *Ab = transA ? A + m0 : A + (size_t)m0 * lda;
        float *Cb = C + (size_t)m0 * ldc;
        if (!t) { /* no scratch memory: the naive chain (same values) */
            gemm_naive(transA, transB, mb, N, K, alpha, Ab, lda, B, ldb, beta, Cb, ldc, bias);
            continue;
        }
        gemm_blocked(transA, transB, mb, N, K, 1.0f, Ab, lda, B, ldb, 0.0f, t, N, NULL);
#pragma omp parallel for schedule(static) if ((double)mb * N >= (double)K_PAR_MIN_ELEMS)
        for (int m = 0; m < mb; m++) {
            float *crow = Cb + (size_t)m * ldc;
            for (int n = 0; n < N; n++) crow[n] = finish(t[(size_t)m * N + n], alpha, 1, beta, crow[n], bias, n);
        }
    }
}

double k_cpu_gemm_ukernel_loop(long iters, int *mr, int *nr) {
    const uk_path up = path_of(k_cpu_get_path());
    *mr = up.mr, *nr = up.nr;
    float *a = NULL, *b = NULL; /* the two panels, 64-byte aligned, this call's */
    if (posix_memalign((void **)&a, 64, sizeof(float) * MR_MAX * KC) ||
        posix_memalign((void **)&b, 64, sizeof(float) * KC * NR_MAX)) {
        free(a);
        return 0.0;
    }
    float c[MR_MAX * NR_MAX] __attribute__((aligned(64))) = {0};
    for (int i = 0; i < MR_MAX * KC; i++) a[i] = 0x1p-12f;
    for (int i = 0; i < KC * NR_MAX; i++) b[i] = 0x1p-12f;
    uk_args u = {.kc = KC, .a = a, .ars = 1, .aks = up.mr, .b = b, .c = c, .ldc = up.nr, .mr = up.mr, .nr = up.nr,
                 .load = 1, .last = 0, .alpha = 1.0f, .c_next = c};
    for (long i = 0; i < iters; i++) up.fn(&u);
    volatile float sink = c[0];
    (void)sink;
    free(a), free(b);
    return 2.0 * up.mr * up.nr * KC * (double)iters;
}

void k_cpu_gemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                int ldb, float beta, float *C, int ldc, const float *bias) {
    K_PROF_BEGIN();
    gemm_run(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    if (k_prof_t0_ > 0.0) k_prof_end_gemm(k_prof_t0_, transA, transB, M, N, K);
}

void k_cpu_release_thread(void) {
    free(tls_buf), free(tls_bshared), free(tls_beta);
    tls_buf = tls_bshared = tls_beta = NULL;
    tls_cap = tls_bshared_cap = tls_beta_cap = 0;
    k_cpu_attention_release_thread();
    k_cpu_conv_small_release_thread();
}
