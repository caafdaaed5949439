/* kernels/cpu/attn_tile.h — private building blocks of the blocked CPU attention (attention.c): a register-tiled
 * 6 x 16 matrix-multiply micro-kernel over a packed right operand (on AVX-512 also 12 x 32 and 6 x 32 over two
 * strips), the driver that covers a block with them, the
 * packing routines that gather a head's strided rows into contiguous block buffers, and a vectorised exp.
 *
 * Packed right operand ("strips"): a [Kd, N] matrix, N a multiple of 16, stored as N/16 strips, each strip the
 * Kd x 16 sub-matrix row after row (strip s holds columns 16s..16s+15). Columns past the valid width are zero.
 * The micro-kernel streams one strip and broadcasts six elements of the left operand per step, the layout of the
 * classic GotoBLAS / BLIS micro-kernel (Goto & van de Geijn, "Anatomy of high-performance matrix
 * multiplication", 2008), written here from that description.
 *
 * Everything here is deterministic: each output element is one fixed-order chain of fused multiply-adds, so
 * results never depend on thread count or on which block a thread takes. Three paths, chosen per call by `vec`
 * (kernels/cpu/path.c): AVX-512 tiles (vec 2), AVX2+FMA (vec 1) when the compiler targets them, and plain C that
 * performs the same operations lane by lane (fmaf for every fused multiply-add, the exp polynomial and the 8-lane sums and maxima in the same order),
 * so all give the same bits (tests/test_kernels_paths.c). */
#ifndef KERNELS_CPU_ATTN_TILE_H
#define KERNELS_CPU_ATTN_TILE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ATTN_AVX2 1
#else
#define ATTN_AVX2 0
#endif

#define ATTN_MR 6  /* rows of a micro-tile */
#define ATTN_NR 16 /* columns of a micro-tile (one strip) */

static inline int attn_round_up(int x, int m) { return (x + m - 1) / m * m; }

#if ATTN_AVX2
/* One micro-tile: C[6 x 16] (= or +=) sum_k A(r, k) * Bs[k][0..15], A(r, k) at a[r*ars + k*aks], Bs one strip.
 * always_inline so that the two stride patterns used (row-major A: aks = 1; transposed A: ars = 1) are each
 * compiled with a constant stride. */
static inline __attribute__((always_inline)) void attn_tile_avx2(int kc, const float *a, ptrdiff_t ars, ptrdiff_t aks,
                                                            const float *bs, float *c, ptrdiff_t ldc, int acc) {
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (acc) {
        c00 = _mm256_loadu_ps(c + 0 * ldc), c01 = _mm256_loadu_ps(c + 0 * ldc + 8);
        c10 = _mm256_loadu_ps(c + 1 * ldc), c11 = _mm256_loadu_ps(c + 1 * ldc + 8);
        c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
        c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
        c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
        c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    }
#define ATTN_STEP(k)                                                                 \
    do {                                                                             \
        const float *ak_ = a + (ptrdiff_t)(k) * aks;                                 \
        __m256 b0_ = _mm256_load_ps(bs + (k) * 16), b1_ = _mm256_load_ps(bs + (k) * 16 + 8); \
        __m256 x_ = _mm256_broadcast_ss(ak_);                                        \
        c00 = _mm256_fmadd_ps(x_, b0_, c00), c01 = _mm256_fmadd_ps(x_, b1_, c01);    \
        x_ = _mm256_broadcast_ss(ak_ + ars);                                         \
        c10 = _mm256_fmadd_ps(x_, b0_, c10), c11 = _mm256_fmadd_ps(x_, b1_, c11);    \
        x_ = _mm256_broadcast_ss(ak_ + 2 * ars);                                     \
        c20 = _mm256_fmadd_ps(x_, b0_, c20), c21 = _mm256_fmadd_ps(x_, b1_, c21);    \
        x_ = _mm256_broadcast_ss(ak_ + 3 * ars);                                     \
        c30 = _mm256_fmadd_ps(x_, b0_, c30), c31 = _mm256_fmadd_ps(x_, b1_, c31);    \
        x_ = _mm256_broadcast_ss(ak_ + 4 * ars);                                     \
        c40 = _mm256_fmadd_ps(x_, b0_, c40), c41 = _mm256_fmadd_ps(x_, b1_, c41);    \
        x_ = _mm256_broadcast_ss(ak_ + 5 * ars);                                     \
        c50 = _mm256_fmadd_ps(x_, b0_, c50), c51 = _mm256_fmadd_ps(x_, b1_, c51);    \
    } while (0)
    /* Not unrolled on purpose: with gcc 12 manual or pragma unrolling spills the two B vectors into memory
     * operands of the FMAs and runs at about 2/3 of the speed of this plain loop. */
    for (int k = 0; k < kc; k++) ATTN_STEP(k);
#undef ATTN_STEP
    _mm256_storeu_ps(c + 0 * ldc, c00), _mm256_storeu_ps(c + 0 * ldc + 8, c01);
    _mm256_storeu_ps(c + 1 * ldc, c10), _mm256_storeu_ps(c + 1 * ldc + 8, c11);
    _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
    _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
    _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
    _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}
#endif

#if ATTN_AVX2 && defined(__AVX512F__)
#define ATTN_AVX512 1
/* The AVX-512 tile: one 16-wide row of C per zmm register (6 accumulators), one strip load and six broadcasts per k:
 * the same chain per element as the AVX2 and C tiles, at twice the width. */
static inline __attribute__((always_inline)) void attn_tile_avx512(int kc, const float *a, ptrdiff_t ars,
                                                                   ptrdiff_t aks, const float *bs, float *c,
                                                                   ptrdiff_t ldc, int acc) {
    __m512 c0, c1, c2, c3, c4, c5;
    if (acc) {
        c0 = _mm512_loadu_ps(c + 0 * ldc), c1 = _mm512_loadu_ps(c + 1 * ldc), c2 = _mm512_loadu_ps(c + 2 * ldc);
        c3 = _mm512_loadu_ps(c + 3 * ldc), c4 = _mm512_loadu_ps(c + 4 * ldc), c5 = _mm512_loadu_ps(c + 5 * ldc);
    } else {
        c0 = c1 = c2 = c3 = c4 = c5 = _mm512_setzero_ps();
    }
    for (int k = 0; k < kc; k++) {
        const float *ak = a + (ptrdiff_t)k * aks;
        const __m512 b = _mm512_load_ps(bs + k * 16);
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(ak[0]), b, c0);
        c1 = _mm512_fmadd_ps(_mm512_set1_ps(ak[ars]), b, c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(ak[2 * ars]), b, c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(ak[3 * ars]), b, c3);
        c4 = _mm512_fmadd_ps(_mm512_set1_ps(ak[4 * ars]), b, c4);
        c5 = _mm512_fmadd_ps(_mm512_set1_ps(ak[5 * ars]), b, c5);
    }
    _mm512_storeu_ps(c + 0 * ldc, c0), _mm512_storeu_ps(c + 1 * ldc, c1), _mm512_storeu_ps(c + 2 * ldc, c2);
    _mm512_storeu_ps(c + 3 * ldc, c3), _mm512_storeu_ps(c + 4 * ldc, c4), _mm512_storeu_ps(c + 5 * ldc, c5);
}

/* Two strips at once on AVX-512: rows r < MRW (6 or 12) of C[., 32] (= or +=) A times the strips b0 (columns 0..15)
 * and b1 (16..31); the same chain per element as attn_tile_avx512, but 2*MRW accumulators, so that the two strip
 * loads and MRW broadcasts per k feed 2*MRW fused multiply-adds (the 6 x 16 tile spends seven loads on six: bound
 * by loads and by the latency of six chains, about 30% of the FMA peak in `vgrpo bench dit --profile`). */
static inline __attribute__((always_inline)) void attn_tile2_avx512(int kc, const float *a, ptrdiff_t ars,
                                                                    ptrdiff_t aks, const float *b0, const float *b1,
                                                                    float *c, ptrdiff_t ldc, int acc, const int MRW) {
    __m512 x0[12], x1[12];
    for (int r = 0; r < MRW; r++) {
        x0[r] = acc ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
        x1[r] = acc ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
    }
    for (int k = 0; k < kc; k++) {
        const float *ak = a + (ptrdiff_t)k * aks;
        const __m512 v0 = _mm512_load_ps(b0 + k * 16), v1 = _mm512_load_ps(b1 + k * 16);
        for (int r = 0; r < MRW; r++) {
            const __m512 x = _mm512_set1_ps(ak[r * ars]);
            x0[r] = _mm512_fmadd_ps(x, v0, x0[r]), x1[r] = _mm512_fmadd_ps(x, v1, x1[r]);
        }
    }
    for (int r = 0; r < MRW; r++) _mm512_storeu_ps(c + r * ldc, x0[r]), _mm512_storeu_ps(c + r * ldc + 16, x1[r]);
}

/* C[M, N] over the strips of b (each Kd x 16), A(r, k) = a[r*ars + k*aks]: pairs of strips by the two-strip tile (12
 * rows, then 6), an odd last strip by the 6 x 16 tile. */
static inline __attribute__((always_inline)) void attn_mm_avx512(int M, int N, int Kd, const float *a, ptrdiff_t ars,
                                                                 ptrdiff_t aks, const float *b, float *c,
                                                                 ptrdiff_t ldc, int acc) {
    const int ns = N / ATTN_NR;
    int s = 0;
    for (; s + 1 < ns; s += 2) {
        const float *b0 = b + (ptrdiff_t)s * Kd * ATTN_NR, *b1 = b0 + (ptrdiff_t)Kd * ATTN_NR;
        int r = 0;
        for (; r + 12 <= M; r += 12) attn_tile2_avx512(Kd, a + r * ars, ars, aks, b0, b1, c + r * ldc + s * 16, ldc, acc, 12);
        for (; r < M; r += 6) attn_tile2_avx512(Kd, a + r * ars, ars, aks, b0, b1, c + r * ldc + s * 16, ldc, acc, 6);
    }
    for (; s < ns; s++)
        for (int r = 0; r < M; r += ATTN_MR)
            attn_tile_avx512(Kd, a + r * ars, ars, aks, b + (ptrdiff_t)s * Kd * ATTN_NR, c + r * ldc + s * ATTN_NR, ldc,
                             acc);
}
#else
#define ATTN_AVX512 0
#endif

/* The plain C tile: the same chain per element. */
static inline void attn_tile_c(int kc, const float *a, ptrdiff_t ars, ptrdiff_t aks, const float *bs, float *c,
                               ptrdiff_t ldc, int acc) {
    float t[ATTN_MR][ATTN_NR];
    for (int r = 0; r < ATTN_MR; r++)
        for (int j = 0; j < ATTN_NR; j++) t[r][j] = acc ? c[r * ldc + j] : 0.0f;
    for (int k = 0; k < kc; k++)
        for (int r = 0; r < ATTN_MR; r++) {
            float x = a[r * ars + (ptrdiff_t)k * aks];
            for (int j = 0; j < ATTN_NR; j++) t[r][j] = fmaf(x, bs[k * 16 + j], t[r][j]);
        }
    for (int r = 0; r < ATTN_MR; r++)
        for (int j = 0; j < ATTN_NR; j++) c[r * ldc + j] = t[r][j];
}

#if ATTN_AVX512
#define ATTN_TILE(vec, ...)                                                                                       \
    ((vec) == 2 ? attn_tile_avx512(__VA_ARGS__) : (vec) ? attn_tile_avx2(__VA_ARGS__) : attn_tile_c(__VA_ARGS__))
#elif ATTN_AVX2
#define ATTN_TILE(vec, ...) ((vec) ? attn_tile_avx2(__VA_ARGS__) : attn_tile_c(__VA_ARGS__))
#else
#define ATTN_TILE(vec, ...) attn_tile_c(__VA_ARGS__)
#endif

/* C[M, N] (= or +=) A[M, Kd] @ B[Kd, N] with A row-major (row stride lda) and B packed in strips.
 * M a multiple of 6, N a multiple of 16; C row stride ldc. vec: 2 the AVX-512 tile, 1 the AVX2 one, 0 plain C. */
static inline void attn_mm_n(int vec, int M, int N, int Kd, const float *a, ptrdiff_t lda, const float *b, float *c,
                             ptrdiff_t ldc, int acc) {
    (void)vec;
#if ATTN_AVX512
    if (vec == 2) {
        attn_mm_avx512(M, N, Kd, a, lda, 1, b, c, ldc, acc);
        return;
    }
#endif
    for (int s = 0; s < N / ATTN_NR; s++)
        for (int r = 0; r < M; r += ATTN_MR)
            ATTN_TILE(vec, Kd, a + r * lda, lda, 1, b + (ptrdiff_t)s * Kd * ATTN_NR, c + r * ldc + s * ATTN_NR, ldc, acc);
}

/* As attn_mm_n with A given transposed: A(r, k) = at[k*lda + r] (at is [Kd, >= M] row-major). */
static inline void attn_mm_t(int vec, int M, int N, int Kd, const float *at, ptrdiff_t lda, const float *b, float *c,
                             ptrdiff_t ldc, int acc) {
    (void)vec;
#if ATTN_AVX512
    if (vec == 2) {
        attn_mm_avx512(M, N, Kd, at, 1, lda, b, c, ldc, acc);
        return;
    }
#endif
    for (int s = 0; s < N / ATTN_NR; s++)
        for (int r = 0; r < M; r += ATTN_MR)
            ATTN_TILE(vec, Kd, at + r, 1, lda, b + (ptrdiff_t)s * Kd * ATTN_NR, c + r * ldc + s * ATTN_NR, ldc, acc);
}

/* Packs n rows of a head (row i of Dh floats at src + i*rs) as the TRANSPOSED operand [Dh, nc] in strips:
 * column j of the operand is row j of src; columns n..nc-1 (nc a multiple of 16) are zero. */
static inline void attn_pack_t(float *dst, const float *src, ptrdiff_t rs, int n, int nc, int Dh) {
    for (int s = 0; s < nc / ATTN_NR; s++) {
        float *d = dst + (ptrdiff_t)s * Dh * ATTN_NR;
        for (int j = 0; j < ATTN_NR; j++) {
            int row = s * ATTN_NR + j;
            if (row < n) {
                const float *x = src + row * rs;
                for (int e = 0; e < Dh; e++) d[e * ATTN_NR + j] = x[e];
            } else {
                for (int e = 0; e < Dh; e++) d[e * ATTN_NR + j] = 0.0f;
            }
        }
    }
}

/* Packs n rows of a head as the operand [n, Dp] in strips (Dp = Dh rounded up to 16, pad columns zero),
 * each element multiplied by mul (exactly 1.0f leaves values unchanged). */
static inline void attn_pack_n(float *dst, const float *src, ptrdiff_t rs, int n, int Dh, float mul) {
    int Dp = attn_round_up(Dh, ATTN_NR);
    for (int s = 0; s < Dp / ATTN_NR; s++) {
        float *d = dst + (ptrdiff_t)s * n * ATTN_NR;
        int c0 = s * ATTN_NR, w = Dh - c0 < ATTN_NR ? Dh - c0 : ATTN_NR;
        for (int i = 0; i < n; i++) {
            const float *x = src + i * rs + c0;
            int j = 0;
            for (; j < w; j++) d[i * ATTN_NR + j] = x[j] * mul;
            for (; j < ATTN_NR; j++) d[i * ATTN_NR + j] = 0.0f;
        }
    }
}

/* Gathers n rows of a head into a contiguous [m, Dh] buffer (m >= n, rows n..m-1 zero), times mul. */
static inline void attn_gather(float *dst, const float *src, ptrdiff_t rs, int n, int m, int Dh, float mul) {
    for (int i = 0; i < n; i++)
        for (int e = 0; e < Dh; e++) dst[(ptrdiff_t)i * Dh + e] = src[i * rs + e] * mul;
    memset(dst + (ptrdiff_t)n * Dh, 0, sizeof(float) * (size_t)(m - n) * Dh);
}

/* The exp's constants, one set for its three paths (attn_exp8, attn_exp16, attn_exp1), so that they give the same
 * bits: the clamp, log2(e), ln 2 split in a high and a low part, and Cephes' expf polynomial (S. L. Moshier). */
#define ATTN_EXP_LO (-87.3f)
#define ATTN_EXP_HI 88.0f
#define ATTN_EXP_LOG2E 1.44269504088896341f
#define ATTN_EXP_LN2_HI 0.693359375f
#define ATTN_EXP_LN2_LO (-2.12194440e-4f)
#define ATTN_EXP_P0 1.9875691500e-4f
#define ATTN_EXP_P1 1.3981999507e-3f
#define ATTN_EXP_P2 8.3334519073e-3f
#define ATTN_EXP_P3 4.1665795894e-2f
#define ATTN_EXP_P4 1.6666665459e-1f
#define ATTN_EXP_P5 5.0000001201e-1f

#if ATTN_AVX2
/* exp(x) for 8 lanes: range reduction x = n ln2 + r (ln2 split in two parts), |r| <= ln2/2, then
 * 1 + r + r^2 p(r) with the degree-5 minimax p of Cephes' expf (S. L. Moshier), scaled by 2^n through the exponent
 * bits. Relative error about 2 ulp; x < -87.3 (including -inf) gives exactly 0;
 * x > 88 saturates (never reached here: arguments are <= 0). */
static inline __m256 attn_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(ATTN_EXP_LO), hi = _mm256_set1_ps(ATTN_EXP_HI);
    __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(ATTN_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ATTN_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(ATTN_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(ATTN_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ATTN_EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), zero_mask);
}
#endif

#if ATTN_AVX512
/* attn_exp8's operations on 16 lanes (each lane's value is attn_exp8's: the same roundings, the same polynomial;
 * the zero mask applied by a zeroing multiply, as the and of attn_exp8 gives +0 too). */
static inline __m512 attn_exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(ATTN_EXP_LO), hi = _mm512_set1_ps(ATTN_EXP_HI);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(ATTN_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ATTN_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(ATTN_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(ATTN_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ATTN_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ATTN_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ATTN_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ATTN_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ATTN_EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
}
#endif

/* The plain C exp: attn_exp8's operations on one lane (fmaf for each fused multiply-add, rintf for the
 * round-to-nearest-even, the exponent bits built as the integer n + 127 shifted). */
static inline float attn_exp1(float x) {
    const float lo = ATTN_EXP_LO, hi = ATTN_EXP_HI;
    const int keep = x >= lo; /* ordered compare: NaN gives 0, as _CMP_GE_OQ */
    x = x > lo ? x : lo;      /* _mm256_max_ps(x, lo): the second operand unless x > lo */
    x = x < hi ? x : hi;      /* _mm256_min_ps(x, hi) */
    const float n = rintf(x * ATTN_EXP_LOG2E);
    float r = fmaf(-n, ATTN_EXP_LN2_HI, x);
    r = fmaf(-n, ATTN_EXP_LN2_LO, r);
    float p = ATTN_EXP_P0;
    p = fmaf(p, r, ATTN_EXP_P1);
    p = fmaf(p, r, ATTN_EXP_P2);
    p = fmaf(p, r, ATTN_EXP_P3);
    p = fmaf(p, r, ATTN_EXP_P4);
    p = fmaf(p, r, ATTN_EXP_P5);
    p = fmaf(p, r * r, r + 1.0f);
    const uint32_t eb = (uint32_t)((int32_t)n + 127) << 23;
    float e;
    memcpy(&e, &eb, sizeof e);
    const float y = p * e;
    return keep ? y : 0.0f;
}

/* p[j] = exp(s[j] - m) for j < n (n a multiple of 16); returns the sum of p[0..n-1] in a fixed order: 8 lanes, lane
 * l summing j = l, l + 8, ... in order, then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). */
static inline float attn_exp_sub(int vec, float *p, const float *s, float m, int n) {
    (void)vec;
#if ATTN_AVX512
    if (vec == 2) { /* 16 lanes of exp, the sum still 8 lanes wide in the order below */
        const __m512 vm = _mm512_set1_ps(m);
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < n; j += 16) {
            const __m512 e = attn_exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
            _mm512_storeu_ps(p + j, e);
            acc = _mm256_add_ps(acc, _mm512_castps512_ps256(e));
            acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(e, 1));
        }
        float t[8];
        _mm256_storeu_ps(t, acc);
        return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    }
#endif
#if ATTN_AVX2
    if (vec) {
        __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
        for (int j = 0; j < n; j += 8) {
            __m256 e = attn_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
            _mm256_storeu_ps(p + j, e);
            acc = _mm256_add_ps(acc, e);
        }
        float t[8];
        _mm256_storeu_ps(t, acc);
        return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    }
#endif
    float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < n; j += 8)
        for (int l = 0; l < 8; l++) t[l] = t[l] + (p[j + l] = attn_exp1(s[j + l] - m));
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

/* Maximum of s[0..n-1] (n a multiple of 16): 8 lanes (lane l over j = l, l + 8, ...: v = v > x ? v : x, as
 * _mm256_max_ps), then m = t[0] and m = t[j] > m ? t[j] : m for j = 1..7. */
static inline float attn_row_max(int vec, const float *s, int n) {
    (void)vec;
    float t[8];
#if ATTN_AVX2
    if (vec) {
        __m256 v = _mm256_loadu_ps(s);
        for (int j = 8; j < n; j += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(s + j));
        _mm256_storeu_ps(t, v);
    } else
#endif
    {
        for (int l = 0; l < 8; l++) t[l] = s[l];
        for (int j = 8; j < n; j += 8)
            for (int l = 0; l < 8; l++) t[l] = t[l] > s[j + l] ? t[l] : s[j + l];
    }
    float m = t[0];
    for (int j = 1; j < 8; j++) m = t[j] > m ? t[j] : m;
    return m;
}

#endif
