/* kernels/cpu/conv_small.c — a direct 3-D convolution for few output channels (the tiny VAE's 3 to 16), giving the
 * values of im2col + k_cpu_gemm bit for bit.
 *
 * kernels/cpu/vae_conv.c (the Wan VAE decoder on the CPU) computes a causal Conv3d output frame as im2col (one row
 * of K = taps x cin values per output pixel, zeros at padded positions) and one GEMM against the weights [cout, K]: each output is
 *     acc = 0;  for k = 0 .. K-1 in order: acc = fma(col[k], w[o][k], acc);   out = acc + bias[o]
 * (kernels/cpu/gemm.c). With a handful of output channels that GEMM is all overhead: the im2col rows and their
 * packing move ~K x 4 bytes per pixel for 2 x K x cout flops. This kernel runs the same chain directly: the used
 * input frames are first copied channel-planar with a zero border (nearest 2x upsampled when asked), then 16
 * consecutive output pixels of a row are one vector per output channel and the taps are walked in im2col's order
 * (t, dy, dx, c), one fused multiply-add per tap: the same operations on the same operands, including fma(0, w, acc)
 * at the padding, so every value equals the GEMM's. Paths (kernels/cpu/path.c): AVX-512 (16 pixels per vector) and
 * plain C (fmaf); both equal the GEMM, tested in tests/test_kernels_paths.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/prof.h"

#if defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CONV_AVX512 1
#endif

enum { CO_BLOCK = 8 }; /* output channels per pass (accumulators: CO_BLOCK x 2 vectors of 16 pixels) */

static __thread float *tls_plane;
static __thread size_t tls_plane_cap;

void k_cpu_conv_small_release_thread(void) {
    free(tls_plane);
    tls_plane = NULL, tls_plane_cap = 0;
}

static float *plane_buffer(size_t floats) {
    if (floats <= tls_plane_cap) return tls_plane;
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, floats * sizeof(float))) return NULL;
    free(tls_plane);
    tls_plane = p, tls_plane_cap = floats;
    return p;
}

/* The chain of output pixels x0 .. x0+n-1 (n <= 32) of row y, output channels o0 .. o0+no-1 (no <= CO_BLOCK), plain
 * C: the reference the vector path must equal. pl: planes [nt][ci][Hp][Wp]; acc[o][j]. */
static void row_c(float acc[CO_BLOCK][32], const float *const *tp, int nt, int ci, int kh, int kw, int Hp, int Wp,
                  int y, int x0, int n, const float *w, int ldw, int o0, int no) {
    for (int o = 0; o < no; o++)
        for (int j = 0; j < n; j++) acc[o][j] = 0.0f;
    int k = 0;
    for (int t = 0; t < nt; t++)
        for (int dy = 0; dy < kh; dy++)
            for (int dx = 0; dx < kw; dx++)
                for (int c = 0; c < ci; c++, k++) {
                    const float *src = tp[t] + ((size_t)c * Hp + y + dy) * Wp + x0 + dx;
                    for (int o = 0; o < no; o++) {
                        const float wk = w[(size_t)(o0 + o) * ldw + k];
                        for (int j = 0; j < n; j++) acc[o][j] = fmaf(src[j], wk, acc[o][j]);
                    }
                }
}

#ifdef CONV_AVX512
/* The same chain, 2 x 16 pixels (masked to n) x NO output channels in registers (named accumulators: an array of
 * vectors would live on the stack). */
static inline __attribute__((always_inline)) void row_avx512(float acc[CO_BLOCK][32], const float *const *tp, int nt,
                                                             int ci,
                                                             int kh, int kw, int Hp, int Wp, int y, int x0, int n,
                                                             const float *w, int ldw, int o0, const int NO) {
    const __mmask16 m0 = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
    const __mmask16 m1 = n >= 32 ? (__mmask16)0xFFFF : n > 16 ? (__mmask16)((1u << (n - 16)) - 1u) : (__mmask16)0;
    const __m512 z = _mm512_setzero_ps();
    __m512 a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z, a30 = z, a31 = z;
    __m512 a40 = z, a41 = z, a50 = z, a51 = z, a60 = z, a61 = z, a70 = z, a71 = z;
    const float *w0 = w + (size_t)o0 * ldw;
    int k = 0;
    for (int t = 0; t < nt; t++)
        for (int dy = 0; dy < kh; dy++)
            for (int dx = 0; dx < kw; dx++) {
                const float *src = tp[t] + ((size_t)y + dy) * Wp + x0 + dx;
                for (int c = 0; c < ci; c++, k++, src += (size_t)Hp * Wp) {
                    const __m512 x0v = _mm512_maskz_loadu_ps(m0, src), x1v = _mm512_maskz_loadu_ps(m1, src + 16);
                    const float *wk = w0 + k;
#define FMA2(o, p0, p1)                                                                                           \
    if (NO > o) {                                                                                                 \
        const __m512 wv = _mm512_set1_ps(wk[(size_t)(o) * ldw]);                                                  \
        p0 = _mm512_fmadd_ps(x0v, wv, p0), p1 = _mm512_fmadd_ps(x1v, wv, p1);                                     \
    }
                    FMA2(0, a00, a01) FMA2(1, a10, a11) FMA2(2, a20, a21) FMA2(3, a30, a31)
                    FMA2(4, a40, a41) FMA2(5, a50, a51) FMA2(6, a60, a61) FMA2(7, a70, a71)
#undef FMA2
                }
            }
#define OUT(o, p0, p1)                                                                                            \
    if (NO > o) _mm512_storeu_ps(acc[o], p0), _mm512_storeu_ps(acc[o] + 16, p1);
    OUT(0, a00, a01) OUT(1, a10, a11) OUT(2, a20, a21) OUT(3, a30, a31)
    OUT(4, a40, a41) OUT(5, a50, a51) OUT(6, a60, a61) OUT(7, a70, a71)
#undef OUT
}

#define ROW512(no)                                                                                                \
    static void row_avx512_##no(float acc[CO_BLOCK][32], const float *const *tp, int nt, int ci, int kh, int kw,  \
                                int Hp, int Wp, int y, int x0, int n, const float *w, int ldw, int o0) {          \
        row_avx512(acc, tp, nt, ci, kh, kw, Hp, Wp, y, x0, n, w, ldw, o0, no);                                    \
    }
ROW512(1) ROW512(2) ROW512(3) ROW512(4) ROW512(5) ROW512(6) ROW512(7) ROW512(8)
#undef ROW512
typedef void (*row_fn)(float acc[CO_BLOCK][32], const float *const *, int, int, int, int, int, int, int, int, int,
                       const float *, int, int);
static const row_fn rows512[CO_BLOCK + 1] = {NULL,           row_avx512_1, row_avx512_2, row_avx512_3, row_avx512_4,
                                             row_avx512_5, row_avx512_6, row_avx512_7, row_avx512_8};
#endif

/* Copies frame src [H, W, ci] channel-planar into dst [ci][Hp][Wp] inside a zero border of (ph, pw) (nearest 2x
 * upsampled when up2x); src NULL: all zeros. */
static void to_planar(float *dst, const float *src, int H, int W, int ci, int up2x, int ph, int pw, int Hp, int Wp) {
    const int Ho = up2x ? 2 * H : H, Wo = up2x ? 2 * W : W;
    if (!src) {
        memset(dst, 0, sizeof(float) * (size_t)ci * Hp * Wp);
        return;
    }
    for (int c = 0; c < ci; c++) {
        float *pc = dst + (size_t)c * Hp * Wp;
        memset(pc, 0, sizeof(float) * (size_t)ph * Wp);
        memset(pc + (size_t)(ph + Ho) * Wp, 0, sizeof(float) * (size_t)(Hp - ph - Ho) * Wp);
        for (int yy = 0; yy < Ho; yy++) {
            float *d = pc + (size_t)(yy + ph) * Wp;
            for (int xx = 0; xx < pw; xx++) d[xx] = 0.0f;
            for (int xx = pw + Wo; xx < Wp; xx++) d[xx] = 0.0f;
        }
    }
    for (int yy = 0; yy < Ho; yy++) {
        const float *row = src + (size_t)(up2x ? yy >> 1 : yy) * W * ci;
        float *d = dst + (size_t)(yy + ph) * Wp + pw;
        if (up2x) {
            for (int xx = 0; xx < Wo; xx++)
                for (int c = 0; c < ci; c++) d[(size_t)c * Hp * Wp + xx] = row[(size_t)(xx >> 1) * ci + c];
        } else {
            for (int xx = 0; xx < Wo; xx++)
                for (int c = 0; c < ci; c++) d[(size_t)c * Hp * Wp + xx] = row[(size_t)xx * ci + c];
        }
    }
}

int k_cpu_conv_small(float *out, int nf, const float *const *src, int kt, int H, int W, int ci, int up2x,
                     const float *w, int ldw, int kh, int kw, int co, const float *bias) {
    K_PROF_BEGIN();
    const int Ho = up2x ? 2 * H : H, Wo = up2x ? 2 * W : W, ph = kh / 2, pw = kw / 2, KT = kh * kw * ci;
    const int Hp = Ho + 2 * ph, Wp = Wo + 2 * pw; /* the vector path's masked loads never touch lanes past n */
    const size_t fpl = (size_t)ci * Hp * Wp;      /* floats of one planar frame */
    /* every distinct frame once: slot[f*kt + t] indexes the planar copies (NULL frames share one zero plane) */
    enum { MAX_REFS = 64 };
    int slot[MAX_REFS], nslots = 0;
    const float *seen[MAX_REFS];
    if (nf * kt > MAX_REFS || kt > 3) return -1;
    for (int i = 0; i < nf * kt; i++) {
        int j = 0;
        while (j < nslots && seen[j] != src[i]) j++;
        if (j == nslots) seen[nslots++] = src[i];
        slot[i] = j;
    }
    float *pl = plane_buffer((size_t)nslots * fpl);
    if (!pl) return -1;
    for (int j = 0; j < nslots; j++) to_planar(pl + (size_t)j * fpl, seen[j], H, W, ci, up2x, ph, pw, Hp, Wp);
    const int vec = k_cpu_get_path() == K_CPU_PATH_AVX512;
    float acc[CO_BLOCK][32] __attribute__((aligned(64)));
    double flops = 0;
    for (int f = 0; f < nf; f++) {
        const float *const *sf = src + (size_t)f * kt;
        int t0 = 0; /* leading taps on the zero padding before the stream are left out, as the GEMM path does */
        while (t0 < kt - 1 && !sf[t0]) t0++;
        const int nt = kt - t0;
        /* the used taps' planes, in tap order, as one array when they are consecutive slots, else copied */
        const float *tp[3];
        for (int t = 0; t < nt && t < 3; t++) tp[t] = pl + (size_t)slot[f * kt + t0 + t] * fpl;
        float *of = out + (size_t)f * Ho * Wo * co;
        const float *wf = w + (size_t)t0 * KT;
        flops += 2.0 * Ho * Wo * co * nt * KT;
        for (int y = 0; y < Ho; y++)
            for (int x0 = 0; x0 < Wo; x0 += 32) {
                const int n = Wo - x0 < 32 ? Wo - x0 : 32;
                for (int o0 = 0; o0 < co; o0 += CO_BLOCK) {
                    const int no = co - o0 < CO_BLOCK ? co - o0 : CO_BLOCK;
#ifdef CONV_AVX512
                    if (vec)
                        rows512[no](acc, tp, nt, ci, kh, kw, Hp, Wp, y, x0, n, wf, ldw, o0);
                    else
#endif
                        row_c(acc, tp, nt, ci, kh, kw, Hp, Wp, y, x0, n, wf, ldw, o0, no);
                    for (int j = 0; j < n; j++) {
                        float *o = of + ((size_t)y * Wo + x0 + j) * co + o0;
                        for (int q = 0; q < no; q++) o[q] = bias ? acc[q][j] + bias[o0 + q] : acc[q][j];
                    }
                }
            }
    }
    (void)vec;
    K_PROF_END("conv_small", (int64_t)(flops / 2), flops);
    return 0;
}
