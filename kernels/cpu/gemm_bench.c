/* kernels/cpu/gemm_bench.c — k_cpu_gemm against raw cblas_sgemm on the same operands (see gemm_bench.h). */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/gemm_bench.h"

/* OpenBLAS extensions (declared in its cblas.h; repeated here in case another cblas.h is found first). */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);

int k_cpu_gemm_bench(int M, int N, int K, int threads, int reps, double *ours_gflops, double *cblas_gflops) {
    if (M < 1 || N < 1 || K < 1 || threads < 1 || reps < 1)
        return core_error("k_cpu_gemm_bench: sizes M=%d N=%d K=%d, threads %d and reps %d must be >= 1", M, N, K,
                          threads, reps);
    float *A = malloc((size_t)M * K * sizeof(float)), *B = malloc((size_t)N * K * sizeof(float));
    float *C = malloc((size_t)M * N * sizeof(float));
    if (!A || !B || !C) {
        free(A), free(B), free(C);
        return core_error("k_cpu_gemm_bench: out of memory for %dx%dx%d operands", M, N, K);
    }
    unsigned s = 12345u;
    for (size_t i = 0; i < (size_t)M * K; i++) s = s * 1664525u + 1013904223u, A[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < (size_t)N * K; i++) s = s * 1664525u + 1013904223u, B[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
    int saved_omp = omp_get_max_threads(), saved_blas = openblas_get_num_threads();
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    double best_ours = 1e30, best_blas = 1e30;
    for (int r = 0; r < reps + 1; r++) { /* the first round warms caches and page tables, not timed */
        double t0 = omp_get_wtime();
        k_cpu_gemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, NULL);
        double t1 = omp_get_wtime();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
        double t2 = omp_get_wtime();
        if (r > 0 && t1 - t0 < best_ours) best_ours = t1 - t0;
        if (r > 0 && t2 - t1 < best_blas) best_blas = t2 - t1;
    }
    omp_set_num_threads(saved_omp);
    openblas_set_num_threads(saved_blas);
    double flops = 2.0 * M * N * K;
    *ours_gflops = flops / best_ours / 1e9;
    *cblas_gflops = flops / best_blas / 1e9;
    free(A), free(B), free(C);
    return 0;
}
