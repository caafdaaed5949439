/* tests/test_kernels_paths.c — every vector path of the CPU kernels that this machine runs (kernels/cpu/path.c:
 * AVX-512, AVX2, plain C) gives the same bits: the GEMM against the documented fma chain (so every path equals every
 * other), the blocked attention forward and backward of each path against the plain C path (the backward's dS kept
 * for its second pass and recomputed), and the small direct
 * convolution of the VAE (kernels/cpu/conv_small.c) against the im2col + GEMM it replaces, on fresh random inputs
 * with signed zeros, edge tiles, several K blocks, narrow outputs (the transposed GEMM) and 1 and 2 threads.
 * The elementwise kernels have one source each, compiled without contraction or reassociation (-ffp-contract=off,
 * no -ffast-math), so vectorising them cannot change a value; their own tests cover them. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "tests/kern_util.h"
#include "tests/test.h"

/* Random values in [-1, 1), with about one in eight an exact +0 or -0 (signed zeros through the chains). */
static float *rand_z(size_t n, unsigned long long seed) {
    float *x = kt_rand(n, seed, -1, 1);
    for (size_t i = 0; i < n; i++) {
        uint32_t h = (uint32_t)((i + 1) * 2654435761u) ^ (uint32_t)seed;
        if (h % 8 == 0) x[i] = (h & 16) ? -0.0f : 0.0f;
    }
    return x;
}

static int n_paths(k_cpu_path *out) {
    int n = 0;
    for (int p = K_CPU_PATH_C; p <= K_CPU_PATH_AVX512; p++)
        if (k_cpu_path_available((k_cpu_path)p)) out[n++] = (k_cpu_path)p;
    return n;
}

/* The chain kernels/cpu/gemm.c documents: acc = fma chain over k from 0; c = alpha*acc (alpha != 1); + beta*C_old
 * (C_old when beta == 1; beta 0 never reads C); + bias. */
static void chain(int tA, int tB, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc, const float *bias) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++)
                acc = fmaf(tA ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k],
                           tB ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n], acc);
            float c = acc, *cp = C + (size_t)m * ldc + n;
            if (alpha != 1.0f) c = alpha * c;
            if (beta != 0.0f) c = c + (beta == 1.0f ? *cp : beta * *cp);
            if (bias) c = c + bias[n];
            *cp = c;
        }
}

TEST(kern_paths_gemm_bitwise) {
    static const int shapes[][3] = {{1, 1, 1},    {5, 3, 7},     {13, 33, 100}, {37, 40, 257}, {25, 70, 600},
                                    {300, 4, 108}, {64, 12, 30}, {7, 600, 20},  {130, 128, 128}, {3, 300, 9}};
    static const float ab[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {0.5f, 0.25f}};
    k_cpu_path paths[3];
    const int np = n_paths(paths), saved = omp_get_max_threads();
    const k_cpu_path was = k_cpu_get_path();
    CHECK(np >= 1 && paths[0] == K_CPU_PATH_C);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int t = 0; t < 4; t++) {
            const int tA = t >> 1, tB = t & 1, lda = (tA ? M : K) + 3, ldb = (tB ? K : N) + 1, ldc = N + 2;
            float *A = rand_z((size_t)K * lda + M * (size_t)lda, 10 + s), *B = rand_z((size_t)(K + N) * ldb, 20 + s);
            float *bias = rand_z(N, 30 + s), *C0 = rand_z((size_t)M * ldc, 40 + s);
            float *ref = malloc(sizeof(float) * (size_t)M * ldc), *C = malloc(sizeof(float) * (size_t)M * ldc);
            for (size_t c = 0; c < sizeof ab / sizeof ab[0]; c++) {
                const float alpha = ab[c][0], beta = ab[c][1];
                const float *bp = c ? bias : NULL;
                memcpy(ref, C0, sizeof(float) * (size_t)M * ldc);
                chain(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, ref, ldc, bp);
                for (int p = 0; p < np; p++)
                    for (int th = 1; th <= 2; th++) {
                        REQUIRE(k_cpu_set_path(paths[p]) == 0);
                        omp_set_num_threads(th);
                        memcpy(C, C0, sizeof(float) * (size_t)M * ldc);
                        k_cpu_gemm(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bp);
                        size_t d = kt_bits_differ(C, ref, (size_t)M * ldc);
                        CHECK_MSG(d == 0, "gemm %s M %d N %d K %d tA %d tB %d alpha %g beta %g bias %d, %d threads: "
                                  "%zu elements differ from the fma chain", k_cpu_path_name(paths[p]), M, N, K, tA, tB,
                                  alpha, beta, bp != NULL, th, d);
                    }
            }
            free(A), free(B), free(bias), free(C0), free(ref), free(C);
        }
    }
    k_cpu_set_path(was);
    omp_set_num_threads(saved);
}

TEST(kern_paths_attention_bitwise) {
    /* B, Sq, Skv, H, Dh: the tiny model's 8-token heads, odd sizes, several query and key blocks */
    static const int shapes[][5] = {{16, 8, 8, 4, 32}, {2, 7, 13, 3, 8}, {1, 100, 50, 2, 16}, {1, 130, 200, 2, 40},
                                    {3, 20, 5, 2, 64}};
    k_cpu_path paths[3];
    const int np = n_paths(paths), saved = omp_get_max_threads();
    const k_cpu_path was = k_cpu_get_path();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int B = shapes[s][0], Sq = shapes[s][1], Skv = shapes[s][2], H = shapes[s][3], Dh = shapes[s][4];
        const size_t nq = (size_t)B * Sq * H * Dh, nk = (size_t)B * Skv * H * Dh, nl = (size_t)B * H * Sq;
        const float scale = 1.0f / sqrtf((float)Dh);
        float *q = kt_rand(nq, 50 + s, -2, 2), *k = kt_rand(nk, 51 + s, -2, 2), *v = rand_z(nk, 52 + s);
        float *dout = rand_z(nq, 53 + s), *g0 = rand_z(nq + 2 * nk, 54 + s);
        float *ref = NULL, *got = malloc(sizeof(float) * (2 * nq + nl + nq + 2 * nk));
        for (int p = 0; p < np; p++)
            for (int th = 1; th <= 2; th++)
                for (int keep = 1; keep >= 0; keep--) { /* the backward's dS kept for pass 2, then recomputed */
                REQUIRE(k_cpu_set_path(paths[p]) == 0);
                omp_set_num_threads(th);
                const size_t budget = k_cpu_attn_ds_budget;
                if (!keep) k_cpu_attn_ds_budget = 0;
                float *o = got, *lse = o + nq, *dq = lse + nl, *dk = dq + nq, *dv = dk + nk;
                memcpy(dq, g0, sizeof(float) * (nq + 2 * nk)); /* the backward accumulates */
                k_cpu_attention_forward(o, lse, q, k, v, B, Sq, Skv, H, Dh, scale);
                k_cpu_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, B, Sq, Skv, H, Dh, scale);
                k_cpu_attn_ds_budget = budget;
                const size_t n = nq + nl + nq + 2 * nk;
                if (!ref) {
                    ref = malloc(sizeof(float) * n);
                    memcpy(ref, got, sizeof(float) * n);
                    continue;
                }
                size_t d = kt_bits_differ(got, ref, n);
                CHECK_MSG(d == 0, "attention B %d Sq %d Skv %d H %d Dh %d: path %s, %d threads, dS %s differs from plain "
                          "C, 1 thread in %zu of %zu values", B, Sq, Skv, H, Dh, k_cpu_path_name(paths[p]), th,
                          keep ? "kept" : "recomputed", d, n);
                }
        free(q), free(k), free(v), free(dout), free(g0), free(ref), free(got);
    }
    k_cpu_set_path(was);
    omp_set_num_threads(saved);
}

/* The im2col + GEMM of model/vae/wan_vae_layers.c for nf output frames (the reference conv_small must equal). */
static void conv_ref(float *out, int nf, const float *const *src, int kt, int H, int W, int ci, int up2x,
                     const float *w, int kh, int kw, int co, const float *bias) {
    const int Ho = up2x ? 2 * H : H, Wo = up2x ? 2 * W : W, ph = kh / 2, pw = kw / 2, KT = kh * kw * ci,
              K = kt * KT;
    float *col = malloc(sizeof(float) * (size_t)Ho * Wo * K);
    for (int f = 0; f < nf; f++) {
        const float *const *sf = src + (size_t)f * kt;
        int t0 = 0;
        while (t0 < kt - 1 && !sf[t0]) t0++;
        const int Ku = (kt - t0) * KT;
        for (int r = 0; r < Ho * Wo; r++) {
            const int py = r / Wo, px = r % Wo;
            float *dst = col + (size_t)r * Ku;
            for (int t = t0; t < kt; t++)
                for (int dy = 0; dy < kh; dy++)
                    for (int dx = 0; dx < kw; dx++, dst += ci) {
                        const int yy = py + dy - ph, xx = px + dx - pw;
                        if (!sf[t] || yy < 0 || yy >= Ho || xx < 0 || xx >= Wo) {
                            for (int c = 0; c < ci; c++) dst[c] = 0.0f;
                            continue;
                        }
                        const int sy = up2x ? yy >> 1 : yy, sx = up2x ? xx >> 1 : xx;
                        memcpy(dst, sf[t] + ((size_t)sy * W + sx) * ci, sizeof(float) * ci);
                    }
        }
        k_cpu_gemm(0, 1, Ho * Wo, co, Ku, 1.0f, col, Ku, w + (size_t)t0 * KT, K, 0.0f,
                   out + (size_t)f * Ho * Wo * co, co, bias);
    }
    free(col);
}

TEST(kern_paths_conv_small_bitwise) {
    /* H, W, ci, co, kt, up2x, nf */
    static const int cases[][7] = {{4, 4, 16, 8, 3, 0, 2}, {5, 7, 3, 3, 3, 0, 3}, {32, 32, 4, 4, 3, 0, 4},
                                   {16, 16, 8, 4, 1, 1, 2}, {8, 8, 8, 13, 3, 1, 1}, {6, 40, 1, 16, 3, 0, 2},
                                   {9, 3, 5, 1, 1, 0, 1}};
    k_cpu_path paths[3];
    const int np = n_paths(paths);
    const k_cpu_path was = k_cpu_get_path();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int H = cases[c][0], W = cases[c][1], ci = cases[c][2], co = cases[c][3], kt = cases[c][4],
                  up = cases[c][5], nf = cases[c][6], kh = 3, kw = 3;
        const int K = kt * kh * kw * ci, Ho = up ? 2 * H : H, Wo = up ? 2 * W : W;
        /* a stream of frames: two cached (the first of them NULL for the odd cases: padding before the stream),
         * then the chunk's nf frames; output frame f reads frames f .. f + kt - 1 */
        const int total = nf + kt - 1;
        float *frames = rand_z((size_t)total * H * W * ci, 60 + c);
        const float *src[64];
        for (int f = 0; f < nf; f++)
            for (int t = 0; t < kt; t++) {
                const int i = f + t;
                src[f * kt + t] = (c % 2 == 1 && i == 0 && kt > 1) ? NULL : frames + (size_t)i * H * W * ci;
            }
        if (c == 4 && kt == 3) src[1] = NULL; /* a zero frame inside the taps */
        float *w = rand_z((size_t)co * K, 70 + c), *bias = c == 6 ? NULL : rand_z(co, 80 + c);
        float *ref = malloc(sizeof(float) * (size_t)nf * Ho * Wo * co), *got = malloc(sizeof(float) * (size_t)nf * Ho * Wo * co);
        REQUIRE(k_cpu_set_path(K_CPU_PATH_C) == 0);
        conv_ref(ref, nf, src, kt, H, W, ci, up, w, kh, kw, co, bias);
        for (int p = 0; p < np; p++) {
            REQUIRE(k_cpu_set_path(paths[p]) == 0);
            REQUIRE(k_cpu_conv_small(got, nf, src, kt, H, W, ci, up, w, K, kh, kw, co, bias) == 0);
            size_t d = kt_bits_differ(got, ref, (size_t)nf * Ho * Wo * co);
            CHECK_MSG(d == 0, "conv_small %s H %d W %d ci %d co %d kt %d up %d nf %d: %zu values differ from im2col + "
                      "gemm", k_cpu_path_name(paths[p]), H, W, ci, co, kt, up, nf, d);
        }
        free(frames), free(w), free(bias), free(ref), free(got);
    }
    k_cpu_set_path(was);
}

/* The GEMM ceiling loop of `vgrpo bench peak` runs each path's own micro-kernel: its tile (12 x 32 on AVX-512, 6 x 16
 * on AVX2 and plain C) and 2 MR NR KC flops per run, KC = 256. */
TEST(kern_paths_gemm_ukernel_loop) {
    k_cpu_path paths[3];
    const int np = n_paths(paths);
    const k_cpu_path was = k_cpu_get_path();
    for (int i = 0; i < np; i++) {
        REQUIRE_OK(k_cpu_set_path(paths[i]));
        int mr = 0, nr = 0;
        const double flops = k_cpu_gemm_ukernel_loop(3, &mr, &nr);
        CHECK(paths[i] == K_CPU_PATH_AVX512 ? mr == 12 && nr == 32 : mr == 6 && nr == 16);
        CHECK(flops == 2.0 * mr * nr * 256 * 3);
    }
    REQUIRE_OK(k_cpu_set_path(was));
}
