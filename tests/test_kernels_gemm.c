/* tests/test_kernels_gemm.c — k_cpu_gemm: bit-exact agreement with the documented fixed-order arithmetic (a naive
 * fma chain written here), accuracy against double, the BLAS edge cases, batch / position / thread invariance of
 * rows (docs/design.md section 8), and a linear layer's forward and backward built from gemm calls against finite
 * differences of a double reference. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "tests/kern_util.h"
#include "tests/test.h"

/* op(A)[m,k], op(B)[k,n] */
static float A_at(const float *A, int lda, int tA, int m, int k) {
    return tA ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k];
}
static float B_at(const float *B, int ldb, int tB, int k, int n) {
    return tB ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n];
}

/* The arithmetic gemm.c documents, element by element: acc = fma chain over k from 0; c = alpha*acc (alpha != 1);
 * c = c + beta*C_old (beta != 0; C_old itself when beta == 1); c = c + bias[n]. */
static void gemm_chain(int tA, int tB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc, const float *bias) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            if (alpha != 0.0f)
                for (int k = 0; k < K; k++) acc = fmaf(A_at(A, lda, tA, m, k), B_at(B, ldb, tB, k, n), acc);
            float c = acc;
            if (alpha != 1.0f) c = alpha * c;
            if (beta != 0.0f) {
                float old = C[(size_t)m * ldc + n];
                float t = beta == 1.0f ? old : beta * old;
                c = c + t;
            }
            if (bias) c = c + bias[n];
            C[(size_t)m * ldc + n] = c;
        }
}

static void check_case(int tA, int tB, int M, int N, int K, float alpha, float beta, int with_bias, int pad,
                       unsigned long long seed) {
    int lda = (tA ? M : K) + pad, ldb = (tB ? K : N) + pad, ldc = N + pad;
    size_t na = (size_t)(tA ? K : M) * lda, nb = (size_t)(tB ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = kt_rand(na, seed, -1, 1), *B = kt_rand(nb, seed + 1, -1, 1), *bias = kt_rand(N, seed + 2, -1, 1);
    float *C = kt_rand(nc, seed + 3, -1, 1), *Cref = malloc(nc * sizeof(float));
    memcpy(Cref, C, nc * sizeof(float));
    double *Cd = calloc(nc, sizeof(double));
    for (int m = 0; m < M; m++) /* double reference */
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)A_at(A, lda, tA, m, k) * B_at(B, ldb, tB, k, n);
            Cd[(size_t)m * ldc + n] = alpha * s + beta * C[(size_t)m * ldc + n] + (with_bias ? bias[n] : 0.0);
        }
    k_cpu_gemm(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, with_bias ? bias : NULL);
    gemm_chain(tA, tB, M, N, K, alpha, A, lda, B, ldb, beta, Cref, ldc, with_bias ? bias : NULL);
    size_t diff = kt_bits_differ(C, Cref, nc); /* also covers the ldc padding, which must be untouched */
    CHECK_MSG(diff == 0, "tA=%d tB=%d M=%d N=%d K=%d alpha=%g beta=%g bias=%d pad=%d: %zu elements differ from the "
              "fma chain", tA, tB, M, N, K, alpha, beta, with_bias, pad, diff);
    for (int m = 0; m < M; m++)
        for (int n = N; n < ldc; n++) Cd[(size_t)m * ldc + n] = Cref[(size_t)m * ldc + n];
    double e = kt_max_rel(C, Cd, nc);
    CHECK_MSG(e <= 1e-6 * sqrt(K + 1.0), "tA=%d tB=%d M=%d N=%d K=%d: max rel err vs double %.3g", tA, tB, M, N, K, e);
    free(A), free(B), free(bias), free(C), free(Cref), free(Cd);
}

TEST(kern_gemm_matches_fma_chain) {
    /* sizes cover 1x1x1, edge tiles in M (6) and N (16), several K blocks (256), several M blocks (144) */
    static const int sz[][3] = {{1, 1, 1}, {7, 5, 3}, {13, 17, 300}, {37, 33, 513}, {150, 40, 260}, {6, 16, 256}};
    unsigned long long seed = 200;
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) {
            int M = sz[i][0], N = sz[i][1], K = sz[i][2];
            check_case(t >> 1, t & 1, M, N, K, 1.0f, 0.0f, 0, 0, seed += 5);
            check_case(t >> 1, t & 1, M, N, K, 1.0f, 1.0f, 1, 3, seed += 5);
            check_case(t >> 1, t & 1, M, N, K, -0.5f, 0.75f, 1, 1, seed += 5);
            check_case(t >> 1, t & 1, M, N, K, 2.0f, 0.0f, 1, 0, seed += 5);
        }
    check_case(0, 1, 3, 4100, 5, 1.0f, 0.0f, 1, 2, 290); /* N beyond one column block (4080) */
}

/* BLAS edge cases: alpha == 0 and K == 0 read neither A nor B (NaN there must not leak), beta == 0 never reads C,
 * M or N == 0 write nothing. */
TEST(kern_gemm_edge_cases) {
    float A[6], B[6], bias[3] = {1, 2, 3};
    for (int i = 0; i < 6; i++) A[i] = NAN, B[i] = NAN;
    float C[6] = {1, 1, 1, 2, 2, 2};
    k_cpu_gemm(0, 0, 2, 3, 2, 0.0f, A, 2, B, 3, 2.0f, C, 3, bias);
    CHECK(C[0] == 3 && C[1] == 4 && C[2] == 5 && C[3] == 5 && C[4] == 6 && C[5] == 7);
    for (int i = 0; i < 6; i++) C[i] = NAN;
    k_cpu_gemm(0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, 0.0f, C, 3, bias);
    CHECK(C[0] == 1 && C[2] == 3 && C[5] == 3);
    float a2[2] = {1, 2}, b2[2] = {3, 4};
    for (int i = 0; i < 6; i++) C[i] = NAN;
    k_cpu_gemm(0, 0, 1, 1, 2, 1.0f, a2, 2, b2, 1, 0.0f, C, 1, NULL); /* beta 0 with NaN in C */
    CHECK(C[0] == 11.0f);
    C[0] = 7;
    k_cpu_gemm(0, 0, 0, 1, 2, 1.0f, a2, 2, b2, 1, 0.0f, C, 1, NULL);
    k_cpu_gemm(0, 0, 1, 0, 2, 1.0f, a2, 2, b2, 1, 0.0f, C, 1, NULL);
    CHECK(C[0] == 7.0f);
}

/* A row of C is bitwise the same whatever M, the row's position and the thread count (all four transposes on a
 * mid size; the model's shapes with op(A) = A, op(B) = B^T as a linear layer uses them). */
TEST(kern_gemm_batch_position_thread_invariance) {
    static const int kn[][2] = {{7, 5},      {1, 13},     {13, 1},     {100, 33},
                                {513, 257},  {1536, 1536}, {1536, 8960}, {8960, 1536}};
    static const int Ms[] = {1, 3, 17, 64}; /* against the reference call with M = 300 */
    const int Mmax = 300, shift = 5;
    int saved = omp_get_max_threads();
    for (size_t c = 0; c < sizeof kn / sizeof kn[0]; c++) {
        int K = kn[c][0], N = kn[c][1], big = (size_t)K * N > 100000;
        for (int t = 0; t < (big ? 1 : 4); t++) {
            int tA = big ? 0 : t >> 1, tB = big ? 1 : t & 1;
            /* A holds `shift` extra leading rows so the same rows can also be run at an offset */
            int rows = Mmax + shift;
            float *Aall = kt_rand((size_t)rows * K, 300 + c, -1, 1), *B = kt_rand((size_t)K * N, 310 + c, -1, 1);
            float *bias = kt_rand(N, 320 + c, -1, 1);
            float *At = NULL;
            if (tA) { /* stored [K, rows] */
                At = malloc((size_t)rows * K * sizeof(float));
                for (int m = 0; m < rows; m++)
                    for (int k = 0; k < K; k++) At[(size_t)k * rows + m] = Aall[(size_t)m * K + k];
            }
            int lda = tA ? rows : K, ldb = tB ? K : N;
            const float *A0 = tA ? At + shift : Aall + (size_t)shift * K; /* row 0 of the reference rows */
            float *ref = kt_zeros((size_t)Mmax * N), *C = kt_zeros((size_t)(Mmax + shift) * N);
            omp_set_num_threads(2);
            k_cpu_gemm(tA, tB, Mmax, N, K, 1.0f, A0, lda, B, ldb, 0.0f, ref, N, bias);
            for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
                int M = Ms[i];
                k_cpu_gemm(tA, tB, M, N, K, 1.0f, A0, lda, B, ldb, 0.0f, C, N, bias);
                size_t d = kt_bits_differ(C, ref, (size_t)M * N);
                CHECK_MSG(d == 0, "K=%d N=%d tA=%d tB=%d: M=%d vs M=%d differ in %zu of %zu", K, N, tA, tB, M, Mmax, d,
                          (size_t)M * N);
            }
            /* the same rows placed after `shift` other rows (M = 17 + shift) */
            const float *Ash = tA ? At : Aall;
            k_cpu_gemm(tA, tB, 17 + shift, N, K, 1.0f, Ash, lda, B, ldb, 0.0f, C, N, bias);
            CHECK_MSG(kt_bits_differ(C + (size_t)shift * N, ref, (size_t)17 * N) == 0,
                      "K=%d N=%d tA=%d tB=%d: rows differ when placed at offset %d", K, N, tA, tB, shift);
            /* one and three threads */
            if (c == 0 || c == 4 || c == 5) {
                for (int th = 1; th <= 3; th += 2) {
                    omp_set_num_threads(th);
                    k_cpu_gemm(tA, tB, Mmax, N, K, 1.0f, A0, lda, B, ldb, 0.0f, C, N, bias);
                    CHECK_MSG(kt_bits_differ(C, ref, (size_t)Mmax * N) == 0, "K=%d N=%d: %d threads differ", K, N,
                              th);
                }
            }
            /* spot rows against the fma chain */
            for (int m = 0; m < Mmax; m += 149) {
                float *row = kt_zeros(N);
                const float *Am = tA ? A0 + m : A0 + (size_t)m * K;
                gemm_chain(tA, tB, 1, N, K, 1.0f, Am, lda, B, ldb, 0.0f, row, N, bias);
                CHECK_MSG(kt_bits_differ(row, ref + (size_t)m * N, N) == 0, "K=%d N=%d: row %d differs from chain", K,
                          N, m);
                free(row);
            }
            free(Aall), free(B), free(bias), free(At), free(ref), free(C);
        }
    }
    omp_set_num_threads(saved);
}

/* torch.nn.Linear: Y[M,O] = X[M,I] W[O,I]^T + b; backward by gemm calls: dX += dY W, dW += dY^T X, db += 1^T dY. */
typedef struct {
    double *x, *w, *b, *g;
    int M, I, O;
} lin_ctx;

static double lin_loss(void *p) {
    lin_ctx *l = p;
    double L = 0;
    for (int m = 0; m < l->M; m++)
        for (int o = 0; o < l->O; o++) {
            double y = l->b[o];
            for (int i = 0; i < l->I; i++) y += l->x[(size_t)m * l->I + i] * l->w[(size_t)o * l->I + i];
            L += l->g[(size_t)m * l->O + o] * y;
        }
    return L;
}

TEST(kern_gemm_linear_forward_backward_fd) {
    int M = 7, I = 13, O = 5;
    float *X = kt_rand((size_t)M * I, 401, -1, 1), *W = kt_rand((size_t)O * I, 402, -1, 1), *b = kt_rand(O, 403, -1, 1);
    float *G = kt_rand((size_t)M * O, 404, -1, 1), *Y = kt_zeros((size_t)M * O), ones[7] = {1, 1, 1, 1, 1, 1, 1};
    float *dX = kt_zeros((size_t)M * I), *dW = kt_zeros((size_t)O * I), *db = kt_zeros(O);
    k_cpu_gemm(0, 1, M, O, I, 1.0f, X, I, W, I, 0.0f, Y, O, b);
    k_cpu_gemm(0, 0, M, I, O, 1.0f, G, O, W, I, 1.0f, dX, I, NULL);
    k_cpu_gemm(1, 0, O, I, M, 1.0f, G, O, X, I, 1.0f, dW, I, NULL);
    k_cpu_gemm(0, 0, 1, O, M, 1.0f, ones, M, G, O, 1.0f, db, O, NULL);
    lin_ctx ctx = {kt_to_double(X, (size_t)M * I), kt_to_double(W, (size_t)O * I), kt_to_double(b, O),
                   kt_to_double(G, (size_t)M * O), M, I, O};
    double *yref = calloc((size_t)M * O, sizeof(double));
    for (int m = 0; m < M; m++)
        for (int o = 0; o < O; o++) {
            yref[m * O + o] = ctx.b[o];
            for (int i = 0; i < I; i++) yref[m * O + o] += ctx.x[m * I + i] * ctx.w[o * I + i];
        }
    double e = kt_max_rel(Y, yref, (size_t)M * O);
    CHECK_MSG(e <= 1e-6, "linear forward max rel err %.3g", e);
    double *fd = calloc((size_t)M * I, sizeof(double));
    kt_fd_grad(lin_loss, &ctx, ctx.x, (size_t)M * I, fd);
    e = kt_rel_l2(dX, fd, (size_t)M * I);
    CHECK_MSG(e <= 1e-6, "linear dX rel L2 err %.3g", e);
    kt_fd_grad(lin_loss, &ctx, ctx.w, (size_t)O * I, fd);
    e = kt_rel_l2(dW, fd, (size_t)O * I);
    CHECK_MSG(e <= 1e-6, "linear dW rel L2 err %.3g", e);
    kt_fd_grad(lin_loss, &ctx, ctx.b, O, fd);
    e = kt_rel_l2(db, fd, O);
    CHECK_MSG(e <= 1e-6, "linear db rel L2 err %.3g", e);
    free(X), free(W), free(b), free(G), free(Y), free(dX), free(dW), free(db), free(ctx.x), free(ctx.w), free(ctx.b);
    free(ctx.g), free(yref), free(fd);
}
