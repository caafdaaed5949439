/* kernels/cpu/gemm_bench.h — timing of the fixed-order GEMM (k_cpu_gemm) against raw OpenBLAS cblas_sgemm, for
 * `vgrpo bench` and for the figures quoted in kernels/cpu/gemm.c. */
#ifndef KERNELS_CPU_GEMM_BENCH_H
#define KERNELS_CPU_GEMM_BENCH_H

/* Times C[M,N] = A[M,K] @ B[N,K]^T (the linear-layer form) with `threads` OpenMP/OpenBLAS threads, best of `reps`
 * runs of each (alternating), and returns both rates in GFLOP/s (2*M*N*K flops per call). The thread settings are
 * restored afterwards. Returns 0, or -1 on bad sizes or when the operands cannot be allocated. */
int k_cpu_gemm_bench(int M, int N, int K, int threads, int reps, double *ours_gflops, double *cblas_gflops);

#endif
