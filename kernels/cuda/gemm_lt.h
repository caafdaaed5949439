/* kernels/cuda/gemm_lt.h — what gemm_lt.c shares with gemm_lt_selftest.c: the cuBLASLt descriptors of one GEMM
 * class at one M, built by the one function kc_gemm uses, so the self-test reads back exactly what a GEMM would run
 * with. Not for use outside kernels/cuda/. */
#ifndef KERNELS_CUDA_GEMM_LT_H
#define KERNELS_CUDA_GEMM_LT_H

#include "kernels/cuda/dynload.h"
#include "kernels/cuda/gemm_plan.h"

typedef struct kc_lt_descs {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D (our C): kc_gemm_lt_view */
    cublasLtMatmulPreference_t pref;
} kc_lt_descs;

/* The descriptors of class c at M: transposes, epilogue, bias dtype (C's), aux ld and dtype (bf16), the layouts of
 * kc_gemm_lt_view, and the preference (workspace limit, reduction schemes NONE when deterministic, 16-byte minimum
 * alignments). Pointers are not set. Needs no cuBLASLt handle and no GPU. 0, or -1 with core_error (nothing kept). */
int kc_lt_descs_make(const kc_gemm_class *c, int M, kc_lt_descs *d);
void kc_lt_descs_free(kc_lt_descs *d);
/* 0 for CUBLAS_STATUS_SUCCESS, else -1 with core_error("cuBLASLt: <what>: <status string>"). */
int kc_lt_check(cublasStatus_t st, const char *what);
cublasLtEpilogue_t kc_lt_epilogue(int k_epi);
/* A heuristic result as gemm_plan.c's candidate (its config attributes read back). */
void kc_lt_cand_of(const cublasLtMatmulAlgo_t *a, size_t workspace, int ok, kc_gemm_cand *c);

/* The plan a call of class req runs (gemm_plan.c kc_gemm_route with the real heuristic on handle h, cached in P;
 * bgrad_mode: k_gemm_bgrad_mode) and its descriptors at M with the bias / aux pointers set, the algorithm checked at
 * M by cublasLtMatmulAlgoCheck: 0 (d kept; *plan the index in P; *fallback when K_EPI_BGRAD_A runs as the plain GEMM
 * plus the column sum; *workspace the bytes at M), or -1 with core_error (nothing kept). */
int kc_lt_plan(cublasLtHandle_t h, kc_gemm_plans *P, const kc_gemm_class *req, int bgrad_mode, int M,
               const void *vec, const void *aux, kc_lt_descs *d, int *plan, int *fallback, size_t *workspace);

#endif
