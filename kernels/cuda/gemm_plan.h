/* kernels/cuda/gemm_plan.h — the host-side logic of the cuBLASLt GEMM (gemm_lt.c), kept free of CUDA and cuBLASLt
 * headers so the plain build compiles it too and `make test` runs it (tests/test_gemm_plan.c):
 *
 * 1. The column-major view: how gemm_lt.c hands our row-major k_gemm_args to cuBLASLt (kc_gemm_lt_view), and a host
 *    model that computes D exactly as cuBLASLt reads those buffers with those layouts (kc_gemm_lt_model), so the
 *    mapping is checked against the row-major reference GEMM without a GPU.
 * 2. Batch-invariant algorithm plans: one algorithm per problem class (everything but M: transposes, N, K, leading
 *    dimensions, dtypes, epilogue, aux ld, workspace limit, determinism), chosen by the heuristic at a canonical M
 *    (kc_gemm_canonical_m) and reused for every M after a per-M check (cublasLtMatmulAlgoCheck in gemm_lt.c). A
 *    failed check is an error naming the class and M, never a silent switch to another kernel. The heuristic and the
 *    check are reached through kc_gemm_backend, so tests inject fakes (the real heuristic needs a GPU: without a
 *    driver cublasLtCreate answers CUBLAS_STATUS_NOT_INITIALIZED, and every call taking the handle does the same).
 *
 * Why rows are then independent of M: with one algorithm (kernel, tile, stages, CTA swizzle, cluster shape), split-K
 * 1 and reduction scheme NONE, each output tile's K loop is the same code over the same K range whatever M is: M only
 * changes how many tiles there are. cuBLAS documents bitwise reproducibility run to run for a fixed configuration on
 * one architecture (its "Results reproducibility" section); per-row independence of M is what that gives once the
 * configuration no longer depends on M. It is not a documented promise, so gpu_check measures it ("gemm batch
 * invariance" row). */
#ifndef KERNELS_CUDA_GEMM_PLAN_H
#define KERNELS_CUDA_GEMM_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/k_cuda.h"

/* ---- 1. column-major view ---- */

/* One column-major matrix as cuBLASLt is told it: rows x cols stored, element (r, c) at p[r + c * ld]; op
 * transposes it (1) or not (0). */
typedef struct kc_lt_mat {
    int rows, cols, ld, op;
} kc_lt_mat;

/* C[M, N] = op(A) op(B) row-major is D^T: cuBLASLt computes D[m, n] = op(a) op(b) column-major with m = N, n = M,
 * its a = our B (op = transB), its b = our A (op = transA), its C = D = our C. bias / aux / dbias placement follows
 * the epilogue: BIAS and the GELU epilogues per row of D (length m = N), BGRADB per column of D (length n = M). */
typedef struct kc_lt_view {
    int m, n, k;
    kc_lt_mat a, b, c; /* a: our B, b: our A, c: our C (also D) */
    int ldaux;         /* GELU epilogues: aux is m x n column-major with this ld (= our ldaux) */
} kc_lt_view;
void kc_gemm_lt_view(const k_gemm_args *g, kc_lt_view *v);

/* The host model of one cuBLASLt matmul with view v over fp32 copies of our buffers (A, B, C as k_gemm_args lays
 * them out, row-major): for every D element, acc = fma chain over k from 0 of op(a)[i, l] * op(b)[l, j] read through
 * the column-major layouts, then alpha, beta * C, bias (kernels/cpu/gemm.c's documented order), then the epilogue:
 * GELU_AUX*: aux (fp32 here) = the value, D = gelu_tanh(value); DGELU*: D = value * gelu_tanh'(aux); BGRAD epilogues
 * add their sums to dbias (double, in index order). C is updated in place; aux, bias, dbias as the epilogue needs.
 * Returns 0, or -1 with core_error when a layout is impossible (ld below rows). */
int kc_gemm_lt_model(const kc_lt_view *v, int epi, float alpha, float beta, const float *A, const float *B, float *C,
                     const float *bias, float *aux, float *dbias);

/* ---- 2. batch-invariant plans ---- */

#define KC_GEMM_CANONICAL_M 4096

/* A GEMM problem class: everything that selects a cuBLASLt algorithm except M. Compared with memcmp (build with
 * kc_gemm_class_of, which zeroes the padding). */
typedef struct kc_gemm_class {
    int transA, transB, N, K, lda, ldb, ldc;
    int c_f32;         /* C = D and the bias vector fp32 (else bf16); A, B bf16; compute and scale fp32 */
    int epi;           /* the k_epilogue cuBLASLt runs (K_EPI_NONE for the bias-gradient fallback's GEMM) */
    int ldaux;         /* GELU epilogues, else 0 */
    int deterministic; /* 1: split-K > 1 and every reduction scheme refused */
    int pad_;
    size_t workspace_limit; /* bytes the caller can give the algorithm */
} kc_gemm_class;
void kc_gemm_class_of(const k_gemm_args *g, int epi, size_t workspace_limit, int deterministic, kc_gemm_class *cls);

/* The M the algorithm of a class is chosen at, a function of the class alone (the same algorithm whatever M the
 * first call had and whatever order calls come in; "the largest M seen so far" would depend on both):
 * - A not transposed (forward linears, dx, the FFN's GELU epilogues: M = samples x tokens, the batch dimension):
 *   KC_GEMM_CANONICAL_M = 4096 tokens, inside the range the DiT runs (1,560 to 32,760 tokens per sample, times the
 *   batch), so the heuristic picks its large-M tile, the one that matters for speed; smaller M run the same tile with
 *   fewer rows (correct, and not where the time goes).
 * - A transposed (every weight gradient dW = dY^T X, LoRA's dA and dB: op(A) [M, K] stored [K, M]): lda, which bounds
 *   M (lda >= M) and equals it in every such GEMM of the DiT (M = output features); the batch is K there. */
int kc_gemm_canonical_m(const kc_gemm_class *cls);

/* One heuristic result: the algorithm's bytes (cublasLtMatmulAlgo_t) and what gemm_lt.c read from it. */
typedef struct kc_gemm_cand {
    uint64_t algo[8];
    size_t workspace;
    int ok; /* the heuristic's state was CUBLAS_STATUS_SUCCESS */
    int algo_id, tile_id, stages, splitk, reduction, swizzle;
} kc_gemm_cand;

typedef struct kc_gemm_backend {
    /* Up to cap results for cls at M, best first, count in *n. 0, or -1 with core_error. */
    int (*heuristic)(void *ctx, const kc_gemm_class *cls, int M, kc_gemm_cand *out, int cap, int *n);
    /* Whether algorithm c runs cls at M (cublasLtMatmulAlgoCheck): 0 and its workspace there, or -1 with core_error. */
    int (*check)(void *ctx, const kc_gemm_class *cls, int M, const kc_gemm_cand *c, size_t *workspace);
    void *ctx;
} kc_gemm_backend;

/* The first acceptable candidate of n: ok, workspace <= cls->workspace_limit, and with cls->deterministic split-K
 * <= 1 and reduction scheme 0 (NONE). -1 if none; counts of candidates skipped for workspace and for split-K /
 * reduction in *skip_ws, *skip_splitk (either may be NULL). */
int kc_gemm_pick(const kc_gemm_class *cls, const kc_gemm_cand *c, int n, int *skip_ws, int *skip_splitk);

#define KC_GEMM_PLAN_VALIDATED 8
typedef struct kc_gemm_plan {
    kc_gemm_class cls;
    int canonical_m;
    int none;          /* the heuristic offered no acceptable algorithm (cached, not asked again) */
    char why[200];     /* when none: what the heuristic returned */
    kc_gemm_cand algo; /* when !none */
    int validated[KC_GEMM_PLAN_VALIDATED]; /* Ms whose check passed (a small memo, oldest replaced) */
    size_t validated_ws[KC_GEMM_PLAN_VALIDATED];
    int nvalidated;
} kc_gemm_plan;

typedef struct kc_gemm_plans {
    kc_gemm_plan *v;
    int n, cap;
} kc_gemm_plans;

/* The plan of cls: found in P, or made by asking b->heuristic at kc_gemm_canonical_m(cls) and picking with
 * kc_gemm_pick. A class with no acceptable algorithm gets a plan with none = 1 (the caller decides: error, or the
 * bias-gradient fallback). NULL and core_error on a heuristic error or out of memory (nothing cached then). */
kc_gemm_plan *kc_gemm_plan_get(kc_gemm_plans *P, const kc_gemm_class *cls, const kc_gemm_backend *b);

/* Checks that plan p's algorithm runs at M (b->check, once per M, memoized) within the workspace limit; its
 * workspace at M in *workspace. 0, or -1 with core_error naming the class, M and the canonical M. */
int kc_gemm_plan_validate(kc_gemm_plan *p, int M, const kc_gemm_backend *b, size_t *workspace);

/* The plan a call with requested class req runs, after the bias-gradient routing (bgrad_mode: k_gemm_bgrad_mode):
 * for req->epi == K_EPI_BGRAD_A, FALLBACK takes the class with K_EPI_NONE (the column sum then runs after it), AUTO
 * takes BGRAD_A's plan when the heuristic offers an algorithm and otherwise K_EPI_NONE's, FUSED takes BGRAD_A's or
 * fails; other epilogues take their own. *fallback says whether the column sum is needed. NULL and core_error when
 * the class run has no algorithm (the message says what the heuristic returned) or on a heuristic error. */
kc_gemm_plan *kc_gemm_route(kc_gemm_plans *P, const kc_gemm_class *req, int bgrad_mode, const kc_gemm_backend *b,
                            int *fallback);

/* Frees every plan. */
void kc_gemm_plans_free(kc_gemm_plans *P);

/* "NT N 1536 K 1536 lda .. epi bias fp32 ..." for messages. */
void kc_gemm_class_str(const kc_gemm_class *cls, char *buf, size_t cap);

#endif
