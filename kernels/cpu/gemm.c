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
 * Speed: the 6x16 AVX2/FMA micro-kernel keeps one accumulator per element (12 ymm registers), which is what a fast
 * kernel wants anyway, so the fixed order costs little. Threads each take a rectangle of C and pack their own
 * operands (no barrier inside a call). Measured on the 2-core Zen 3 development VM, best of 5, 2 threads
 * (C = A B^T, the linear-layer form): 1024^3 about 120 GFLOP/s against cblas_sgemm's 127; 1560x1536x1536 about
 * 128 against 129 (single-thread CPU time: 0.85-1.0 of OpenBLAS). `vgrpo bench kernels` prints both on any
 * machine. Known cost: calls with M < 6 rows (timestep MLPs) compute a padded 6-row tile and pack B first, about
 * 2x slower than OpenBLAS's gemv there; they are a few calls per forward. Machines without AVX2+FMA use a plain C
 * micro-kernel built on fmaf with the same results (slowly). GEMM_KC/MC/NC may be overridden at compile time for
 * tuning; they never change a value. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>
#include <omp.h>

#include "kernels/kernels.h"
#include "kernels/cpu/cpu.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define GEMM_AVX2 1
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
enum { MR = 6, NR = 16, KC = GEMM_KC, MC = GEMM_MC, NC = GEMM_NC, BETA_ROWS = 256, BETA_SCRATCH = 1 << 24 };

/* op(A)[m,k] and op(B)[k,n] of the BLAS convention (row-major storage). */
static inline float a_at(const float *A, int lda, int transA, int m, int k) {
    return transA ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k];
}
static inline float b_at(const float *B, int ldb, int transB, int k, int n) {
    return transB ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n];
}

/* The epilogue shared by every path: c = alpha*acc, then + bias. (beta is applied by the caller's row-block path.) */
static inline float epilogue(float acc, float alpha, const float *bias, int n) {
    float c = acc;
    if (alpha != 1.0f) c = alpha * c;
    if (bias) c = c + bias[n];
    return c;
}

/* Naive fixed-order path, used only if scratch memory cannot be allocated: same arithmetic, same results. */
static void gemm_naive(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float *C, int ldc, const float *bias) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc = fmaf(a_at(A, lda, transA, m, k), b_at(B, ldb, transB, k, n), acc);
            C[(size_t)m * ldc + n] = epilogue(acc, alpha, bias, n);
        }
}

/* Packs op(A)[m0 .. m0+mc, k0 .. k0+kc] as ceil(mc/MR) panels, each kc x MR (ap[k*MR + i]); rows past mc are 0.
 * Writes are sequential; reads come from MR row streams (or one contiguous run with transA). */
static void pack_a(float *ap, const float *A, int lda, int transA, int m0, int mc, int k0, int kc) {
    for (int ir = 0; ir < mc; ir += MR) {
        int mr = mc - ir < MR ? mc - ir : MR;
        float *p = ap + (size_t)ir * kc;
        if (transA) {
            for (int k = 0; k < kc; k++) {
                const float *src = A + (size_t)(k0 + k) * lda + m0 + ir;
                int i = 0;
                for (; i < mr; i++) p[k * MR + i] = src[i];
                for (; i < MR; i++) p[k * MR + i] = 0.0f;
            }
        } else if (mr == MR) {
            const float *r0 = A + (size_t)(m0 + ir) * lda + k0, *r1 = r0 + lda, *r2 = r1 + lda, *r3 = r2 + lda,
                        *r4 = r3 + lda, *r5 = r4 + lda;
            for (int k = 0; k < kc; k++) {
                p[0] = r0[k], p[1] = r1[k], p[2] = r2[k], p[3] = r3[k], p[4] = r4[k], p[5] = r5[k];
                p += MR;
            }
        } else {
            for (int k = 0; k < kc; k++)
                for (int i = 0; i < MR; i++) p[k * MR + i] = i < mr ? A[(size_t)(m0 + ir + i) * lda + k0 + k] : 0.0f;
        }
    }
}

#ifdef GEMM_AVX2
/* dst[t*NR + j] = src_j[t] for an 8 x 8 block: rows src_j = src + j*lds (8 floats each), an in-register transpose. */
static inline void transpose8x8_to_panel(float *dst, const float *src, size_t lds) {
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
    _mm256_store_ps(dst + 0 * NR, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_store_ps(dst + 1 * NR, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_store_ps(dst + 2 * NR, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_store_ps(dst + 3 * NR, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_store_ps(dst + 4 * NR, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_store_ps(dst + 5 * NR, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_store_ps(dst + 6 * NR, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_store_ps(dst + 7 * NR, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

/* Packs one NR-column panel of op(B)[k0 .. k0+kc, n0 .. n0+nr] as bp[k*NR + j] (bp 64-byte aligned); columns past
 * nr are 0. With transB the panel is a transpose, done in 8 x 8 register blocks where AVX2 is available. */
static void pack_b_panel(float *bp, const float *B, int ldb, int transB, int k0, int kc, int n0, int nr) {
    if (transB) {
        int kb = 0;
#ifdef GEMM_AVX2
        if (nr == NR) {
            const float *src = B + (size_t)n0 * ldb + k0;
            for (; kb + 8 <= kc; kb += 8) {
                transpose8x8_to_panel(bp + (size_t)kb * NR, src + kb, (size_t)ldb);
                transpose8x8_to_panel(bp + (size_t)kb * NR + 8, src + (size_t)8 * ldb + kb, (size_t)ldb);
            }
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

/* The MR x NR micro-kernel on a full tile: c[i*ldc + j] = fma chain over the kc packed values, starting from 0
 * (load == 0) or from the partial sums already in c (load == 1); on the last K block the epilogue (alpha, bias:
 * bias points at this tile's first column, or NULL) is applied before the store. */
#ifdef GEMM_AVX2
__attribute__((noinline)) static void ukernel(int kc, const float *restrict a, const float *restrict b,
                                              float *restrict c, int ldc, int load, int last, float alpha,
                                              const float *bias, const float *c_next) {
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    /* C tiles live in memory, not cache: fetch the next tile's rows while this one computes */
    for (int i = 0; i < MR; i++) {
        _mm_prefetch((const char *)(c_next + (size_t)i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c_next + (size_t)i * ldc + NR - 1), _MM_HINT_T0);
    }
    if (load) {
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
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), av;
        av = _mm256_broadcast_ss(a + 0), c00 = _mm256_fmadd_ps(av, b0, c00), c01 = _mm256_fmadd_ps(av, b1, c01);
        av = _mm256_broadcast_ss(a + 1), c10 = _mm256_fmadd_ps(av, b0, c10), c11 = _mm256_fmadd_ps(av, b1, c11);
        av = _mm256_broadcast_ss(a + 2), c20 = _mm256_fmadd_ps(av, b0, c20), c21 = _mm256_fmadd_ps(av, b1, c21);
        av = _mm256_broadcast_ss(a + 3), c30 = _mm256_fmadd_ps(av, b0, c30), c31 = _mm256_fmadd_ps(av, b1, c31);
        av = _mm256_broadcast_ss(a + 4), c40 = _mm256_fmadd_ps(av, b0, c40), c41 = _mm256_fmadd_ps(av, b1, c41);
        av = _mm256_broadcast_ss(a + 5), c50 = _mm256_fmadd_ps(av, b0, c50), c51 = _mm256_fmadd_ps(av, b1, c51);
        a += MR;
        b += NR;
    }
    if (last && alpha != 1.0f) {
        __m256 al = _mm256_set1_ps(alpha);
        c00 = _mm256_mul_ps(al, c00), c01 = _mm256_mul_ps(al, c01), c10 = _mm256_mul_ps(al, c10);
        c11 = _mm256_mul_ps(al, c11), c20 = _mm256_mul_ps(al, c20), c21 = _mm256_mul_ps(al, c21);
        c30 = _mm256_mul_ps(al, c30), c31 = _mm256_mul_ps(al, c31), c40 = _mm256_mul_ps(al, c40);
        c41 = _mm256_mul_ps(al, c41), c50 = _mm256_mul_ps(al, c50), c51 = _mm256_mul_ps(al, c51);
    }
    if (last && bias) {
        __m256 v0 = _mm256_loadu_ps(bias), v1 = _mm256_loadu_ps(bias + 8);
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
#else
__attribute__((noinline)) static void ukernel(int kc, const float *restrict a, const float *restrict b,
                                              float *restrict c, int ldc, int load, int last, float alpha,
                                              const float *bias, const float *c_next) {
    (void)c_next;
    float acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = load ? c[i * ldc + j] : 0.0f;
    for (int k = 0; k < kc; k++)
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i][j] = fmaf(a[k * MR + i], b[k * NR + j], acc[i][j]);
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) c[i * ldc + j] = last ? epilogue(acc[i][j], alpha, bias, j) : acc[i][j];
}
#endif

/* An edge tile (mr < MR or nr < NR): runs the same micro-kernel on a local MR x NR copy. */
static void ukernel_edge(int kc, const float *a, const float *b, float *c, int ldc, int mr, int nr, int load,
                         int last, float alpha, const float *bias) {
    float tile[MR * NR] __attribute__((aligned(64)));
    float bias_pad[NR];
    memset(tile, 0, sizeof tile);
    if (load)
        for (int i = 0; i < mr; i++) memcpy(tile + i * NR, c + (size_t)i * ldc, (size_t)nr * sizeof(float));
    if (last && bias) {
        memset(bias_pad, 0, sizeof bias_pad);
        memcpy(bias_pad, bias, (size_t)nr * sizeof(float));
    }
    ukernel(kc, a, b, tile, NR, load, last, alpha, last && bias ? bias_pad : NULL, c);
    for (int i = 0; i < mr; i++) memcpy(c + (size_t)i * ldc, tile + i * NR, (size_t)nr * sizeof(float));
}

/* One thread's rectangle C[m0:m1, n0:n1] = epilogue(op(A) @ op(B)), beta = 0, BLIS loop order: column blocks of
 * NC, K blocks of KC (B block packed once, kept in L3), row blocks of MC (A block packed, kept in L2), then NR-wide
 * B micro-panels (L1) against MR-row A micro-panels. Returns -1 if its packing buffers cannot be allocated. */
static int gemm_rect(int transA, int transB, int m0, int m1, int n0, int n1, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float *C, int ldc, const float *bias) {
    int ncols = n1 - n0, nc_max = ncols < NC ? ncols : NC, kc_max = K < KC ? K : KC;
    int mc_max = m1 - m0 < MC ? m1 - m0 : MC;
    float *bp = NULL, *ap = NULL;
    if (posix_memalign((void **)&bp, 64, (size_t)((nc_max + NR - 1) / NR) * NR * kc_max * sizeof(float))) return -1;
    if (posix_memalign((void **)&ap, 64, (size_t)((mc_max + MR - 1) / MR) * MR * kc_max * sizeof(float))) {
        free(bp);
        return -1;
    }
    for (int jc = n0; jc < n1; jc += NC) {
        int nc = n1 - jc < NC ? n1 - jc : NC, npan = (nc + NR - 1) / NR;
        for (int pc = 0; pc < K; pc += KC) {
            int kc = K - pc < KC ? K - pc : KC, first = pc == 0, last = pc + kc >= K;
            for (int p = 0; p < npan; p++) {
                int nr = nc - p * NR < NR ? nc - p * NR : NR;
                pack_b_panel(bp + (size_t)p * NR * kc, B, ldb, transB, pc, kc, jc + p * NR, nr);
            }
            for (int ic = m0; ic < m1; ic += MC) {
                int mc = m1 - ic < MC ? m1 - ic : MC;
                pack_a(ap, A, lda, transA, ic, mc, pc, kc);
                for (int p = 0; p < npan; p++) {
                    int nr = nc - p * NR < NR ? nc - p * NR : NR;
                    const float *bpp = bp + (size_t)p * NR * kc, *bias_t = bias ? bias + jc + p * NR : NULL;
                    for (int ir = 0; ir < mc; ir += MR) {
                        int mr = mc - ir < MR ? mc - ir : MR;
                        float *ct = C + (size_t)(ic + ir) * ldc + jc + p * NR;
                        const float *app = ap + (size_t)ir * kc;
                        const float *cn =
                            ir + MR < mc ? ct + (size_t)MR * ldc : C + (size_t)ic * ldc + jc + p * NR + NR;
                        if (mr == MR && nr == NR)
                            ukernel(kc, app, bpp, ct, ldc, !first, last, alpha, bias_t, cn);
                        else
                            ukernel_edge(kc, app, bpp, ct, ldc, mr, nr, !first, last, alpha, bias_t);
                    }
                }
            }
        }
    }
    free(ap);
    free(bp);
    return 0;
}

/* Splits C among the team as a tr x tc grid of rectangles (whole MR/NR tiles), choosing the grid that minimises
 * one thread's compute plus packing. Each thread packs its own A rows and B columns, so threads never wait for
 * each other (no barrier inside; a parallel region per call). The grid never changes a value (see the top). */
static void choose_grid(int nt, int M, int N, int K, int *tr_out, int *tc_out) {
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

/* C[M,N] = epilogue(op(A) @ op(B)) with beta = 0, threaded over rectangles of C. Requires M, N, K >= 1. */
static void gemm_blocked(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float *C, int ldc, const float *bias) {
    double flops = 2.0 * M * N * K;
    int nt = omp_get_max_threads();
    if (flops < (double)nt * (1 << 22)) nt = (int)(flops / (1 << 22)) > 1 ? (int)(flops / (1 << 22)) : 1;
#pragma omp parallel num_threads(nt)
    {
        int team = omp_get_num_threads(), t = omp_get_thread_num(), tr, tc;
        choose_grid(team, M, N, K, &tr, &tc);
        if (t < tr * tc) {
            int rp = (M + MR - 1) / MR, cp = (N + NR - 1) / NR, ti = t / tc, tj = t % tc;
            int m0 = (int)((long)rp * ti / tr) * MR, m1 = (int)((long)rp * (ti + 1) / tr) * MR;
            int n0 = (int)((long)cp * tj / tc) * NR, n1 = (int)((long)cp * (tj + 1) / tc) * NR;
            if (m1 > M) m1 = M;
            if (n1 > N) n1 = N;
            if (m0 < m1 && n0 < n1 &&
                gemm_rect(transA, transB, m0, m1, n0, n1, K, alpha, A, lda, B, ldb, C, ldc, bias)) {
                /* no memory for packing: this rectangle by the naive chain (same values) */
                const float *At = transA ? A + m0 : A + (size_t)m0 * lda;
                const float *Bt = transB ? B + (size_t)n0 * ldb : B + n0;
                gemm_naive(transA, transB, m1 - m0, n1 - n0, K, alpha, At, lda, Bt, ldb, C + (size_t)m0 * ldc + n0,
                           ldc, bias ? bias + n0 : NULL);
            }
        }
    }
}

/* beta == 0 core. */
static void gemm_beta0(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float *C, int ldc, const float *bias) {
    if (K <= 0 || alpha == 0.0f) { /* BLAS convention: A and B are not read; acc = 0 */
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) C[(size_t)m * ldc + n] = bias ? 0.0f + bias[n] : 0.0f;
        return;
    }
    gemm_blocked(transA, transB, M, N, K, alpha, A, lda, B, ldb, C, ldc, bias);
}

/* C[M,N] = alpha * op(A) @ op(B) + beta * C, then + bias[n]; contract and exact arithmetic in kernels/kernels.h and
 * at the top of this file. Row-major; op(A) is [M,K] (A stored [M,K], lda >= K, or with transA [K,M], lda >= M);
 * op(B) is [K,N] (B stored [K,N], ldb >= N, or with transB [N,K], ldb >= K). beta == 0 never reads C. Invalid
 * sizes (M, N <= 0) do nothing. Reference: BLAS sgemm (row-major cblas_sgemm) plus a broadcast bias. */
void k_cpu_gemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                int ldb, float beta, float *C, int ldc, const float *bias) {
    if (M <= 0 || N <= 0) return;
    if (beta == 0.0f) {
        gemm_beta0(transA, transB, M, N, K, alpha, A, lda, B, ldb, C, ldc, bias);
        return;
    }
    /* beta != 0: the product goes to a scratch block of rows, then c = alpha*acc + beta*C_old (+ bias). Rows are
     * independent, so processing them in blocks does not change any value; blocks are as large as BETA_SCRATCH
     * floats allow (at least BETA_ROWS rows) so that B is packed few times. */
    long fit = BETA_SCRATCH / N;
    int rows = fit < BETA_ROWS ? BETA_ROWS : (fit > M ? M : (int)fit);
    if (rows > M) rows = M;
    float *t = malloc((size_t)rows * N * sizeof(float));
    for (int m0 = 0; m0 < M; m0 += rows) {
        int mb = M - m0 < rows ? M - m0 : rows;
        const float *Ab = transA ? A + m0 : A + (size_t)m0 * lda;
        float *Cb = C + (size_t)m0 * ldc;
        if (t && alpha != 0.0f) gemm_beta0(transA, transB, mb, N, K, 1.0f, Ab, lda, B, ldb, t, N, NULL);
#pragma omp parallel for schedule(static) if ((double)mb * N * (K + 1) >= (double)K_PAR_MIN_ELEMS)
        for (int m = 0; m < mb; m++) {
            float *crow = Cb + (size_t)m * ldc;
            for (int n = 0; n < N; n++) {
                float acc = 0.0f; /* alpha == 0: A and B are not read */
                if (alpha != 0.0f && t) {
                    acc = t[(size_t)m * N + n];
                } else if (alpha != 0.0f) { /* no scratch memory: the naive chain for this element */
                    for (int k = 0; k < K; k++)
                        acc = fmaf(a_at(Ab, lda, transA, m, k), b_at(B, ldb, transB, k, n), acc);
                }
                float c = acc;
                if (alpha != 1.0f) c = alpha * c;
                float old = beta == 1.0f ? crow[n] : beta * crow[n];
                c = c + old;
                if (bias) c = c + bias[n];
                crow[n] = c;
            }
        }
    }
    free(t);
}
