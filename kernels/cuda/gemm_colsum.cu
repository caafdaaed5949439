/* kernels/cuda/gemm_colsum.cu — the bias-gradient fallback of gemm_lt.c: dbias[m] += sum_k op(A)[m, k] as a
 * fixed-order parallel reduction (body and order: kernels/body/kb_colsum.h). Two launches on kc_stream: one thread per (m, chunk)
 * writes its chunk sum in double to scratch (grid x over m, grid y over chunks: no division per element), then one
 * thread per m adds its chunk sums in chunk order and accumulates into dbias. No atomics: the bits do not depend on
 * the launch geometry or the scheduling. */
#include "kernels/body/kb_colsum.h"
#include "kernels/cuda/kern_common.cuh"

__global__ void colsum_chunk_kernel(double *partial, kb_in a, int64_t stride_m, int64_t stride_k, int M, int K) {
    const int p = (int)blockIdx.y;
    for (int m = (int)(blockIdx.x * blockDim.x + threadIdx.x); m < M; m += (int)(gridDim.x * blockDim.x))
        partial[(int64_t)p * M + m] = kb_colsum_chunk(a, stride_m, stride_k, m, K, p);
}

__global__ void colsum_finish_kernel(float *dbias, const double *partial, int M, int P) {
    for (int m = (int)(blockIdx.x * blockDim.x + threadIdx.x); m < M; m += (int)(gridDim.x * blockDim.x))
        kb_colsum_finish(dbias, partial, M, m, P);
}

extern "C" int kc_colsum_bgrad(float *dbias, kb_in a, int64_t stride_m, int64_t stride_k, int M, int K) {
    if (M <= 0 || K <= 0) return 0;
    const int P = kb_colsum_chunks(K);
    if (P > 65535) return core_error("GEMM bias gradient: K = %d needs %d chunks (at most 65535)", K, P);
    double *partial = (double *)kc_scratch(KC_SLOT_GEMM_BIAS, (size_t)P * (size_t)M * sizeof(double));
    if (!partial) return -1;
    const unsigned bx = (unsigned)((M + KC_THREADS - 1) / KC_THREADS);
    colsum_chunk_kernel<<<dim3(bx, (unsigned)P), KC_THREADS, 0, kc_stream>>>(partial, a, stride_m, stride_k, M, K);
    if (kc_launched("GEMM bias gradient (chunk sums)")) return -1;
    colsum_finish_kernel<<<bx, KC_THREADS, 0, kc_stream>>>(dbias, partial, M, P);
    return kc_launched("GEMM bias gradient (finish)");
}
