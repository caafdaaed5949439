/* kernels/body/kb_colsum.h — the bias gradient of the weight-gradient GEMM as a fixed-order parallel reduction:
 * dbias[m] += sum_k op(A)[m, k], the sum cuBLASLt's BGRADB epilogue fuses (k_cuda.h K_EPI_BGRAD_A). The CUDA backend
 * uses it when cuBLASLt offers no BGRADB kernel for a problem, or when asked to (kernels/cuda/gemm_colsum.cu,
 * gemm_lt.c's bias-gradient fallback: a plain GEMM, then this).
 *
 * Element (m, k) of op(A) is a[m * stride_m + k * stride_k] (transA, A stored [K, M] with row stride lda: stride_m 1,
 * stride_k lda, so neighbouring threads m read neighbouring addresses; no transA: stride_m lda, stride_k 1).
 * Order, the same on every device and for every launch geometry:
 * - the k range is cut into chunks of KB_COLSUM_CHUNK (the last one shorter); chunk p of vector m adds
 *   k = p*CHUNK .. min(K, (p+1)*CHUNK) - 1 in increasing k, in double (one GPU thread per (m, p));
 * - the chunk sums of m are added in increasing p, in double, rounded to fp32 once, and added to dbias[m] in fp32
 *   (one GPU thread per m).
 * In double, the chunked order differs from one long sum by far less than an fp32 rounding (tests compare both with a
 * long-double reference: tests/test_gemm_plan.c). The emulated device (kernels/cuda/emu) sums each m in one double
 * loop; the two agree to the fp32 rounding. */
#ifndef KERNELS_BODY_KB_COLSUM_H
#define KERNELS_BODY_KB_COLSUM_H

#include <stdint.h>

#include "kernels/body/kb_base.h"

#define KB_COLSUM_CHUNK 256

/* Number of chunks of a K-long reduction (>= 1 for K >= 1). */
KB_FN int kb_colsum_chunks(int K) { return (K + KB_COLSUM_CHUNK - 1) / KB_COLSUM_CHUNK; }

/* Chunk p of vector m: sum over its k range of op(A)[m, k], in increasing k, in double. */
KB_FN double kb_colsum_chunk(kb_in a, int64_t stride_m, int64_t stride_k, int m, int K, int p) {
    const int k0 = p * KB_COLSUM_CHUNK, k1 = k0 + KB_COLSUM_CHUNK < K ? k0 + KB_COLSUM_CHUNK : K;
    double s = 0.0;
    for (int k = k0; k < k1; k++) s += (double)kb_get(a, (size_t)((int64_t)m * stride_m + (int64_t)k * stride_k));
    return s;
}

/* The P chunk sums of m (partial[p * pstride + m], p = 0 .. P-1) added in increasing p; dbias[m] += the sum as fp32. */
KB_FN void kb_colsum_finish(float *dbias, const double *partial, int64_t pstride, int m, int P) {
    double s = 0.0;
    for (int p = 0; p < P; p++) s += partial[(int64_t)p * pstride + m];
    dbias[m] = dbias[m] + (float)s;
}

#endif
