/* kernels/cuda/gemm_lt.c — GEMM on the GPU through cuBLASLt: bf16 operands, fp32 accumulation and scaling, bf16 or
 * fp32 output, with the bias / GELU-aux / dGELU / bias-gradient epilogues (k_cuda.h lists them in row-major terms).
 *
 * Row-major to cuBLASLt's column-major: C[M,N] = op(A) op(B) row-major is C^T[N,M] = op(B)^T op(A)^T column-major,
 * so cuBLASLt sees m = N, n = M, its "A" is our B (transposed iff transB) and its "B" is our A (transposed iff
 * transA). The bias (length N) is then per row of cuBLASLt's D, as its BIAS epilogue wants; our K_EPI_BGRAD_A (bias
 * gradient from op(A), length M) is its BGRADB (from its B, length = its columns).
 *
 * Determinism: each distinct problem (transposes, M, N, K, leading dimensions, output dtype, epilogue, aux ld) gets
 * one algorithm, chosen once by cublasLtMatmulAlgoGetHeuristic with split-K reductions filtered out
 * (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = NONE, and any result whose SPLITK_NUM > 1 skipped), for any 16-byte
 * aligned pointers (MIN_ALIGNMENT = 16), and reused for every later call (the "pinned" algorithm; the descriptors are
 * cached with it). With one algorithm and no split-K each output element's K sum runs in one fixed order, so a
 * repeated call gives the same bits. Not yet guaranteed: the same row of C for different M (the heuristic may pick
 * another tile for another M; the GPU check measures whether it does). cuBLASLt's GELU is the tanh approximation.
 * Sources: cuBLASLt docs (cublasLtMatmul, epilogues); karpathy/llm.c llmc/matmul.cuh read for the pattern. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/dynload.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/precond/kc_precond.h"

#define WORKSPACE_BYTES ((size_t)32 << 20)
#define HEURISTIC_RESULTS 8

typedef struct {
    int transA, transB, M, N, K, lda, ldb, ldc, c_f32, epi, ldaux;
} gemm_key;

typedef struct {
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D */
    cublasLtMatmulAlgo_t algo;
    k_gemm_algo_info info;
} gemm_entry;

static cublasLtHandle_t lt;
static gemm_entry *cache;
static int cache_n, cache_cap;

static int lt_check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    return core_error("cuBLASLt: %s: %s", what, kc_lt.cublasLtGetStatusString(st));
}

int kc_gemm_init(void) {
    if (lt) return 0;
    if (lt_check(kc_lt.cublasLtCreate(&lt), "cublasLtCreate")) return -1;
    return kc_scratch(KC_SLOT_GEMM_WS, WORKSPACE_BYTES) ? 0 : -1;
}

static void entry_free(gemm_entry *e) {
    if (e->desc) kc_lt.cublasLtMatmulDescDestroy(e->desc);
    if (e->la) kc_lt.cublasLtMatrixLayoutDestroy(e->la);
    if (e->lb) kc_lt.cublasLtMatrixLayoutDestroy(e->lb);
    if (e->lc) kc_lt.cublasLtMatrixLayoutDestroy(e->lc);
    memset(e, 0, sizeof *e);
}

void kc_gemm_shutdown(void) {
    for (int i = 0; i < cache_n; i++) entry_free(&cache[i]);
    free(cache);
    cache = NULL, cache_n = cache_cap = 0;
    if (lt) kc_lt.cublasLtDestroy(lt);
    lt = NULL;
}

static gemm_key key_of(const k_gemm_args *g) {
    gemm_key k;
    memset(&k, 0, sizeof k);
    k.transA = !!g->transA, k.transB = !!g->transB, k.M = g->M, k.N = g->N, k.K = g->K;
    k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc, k.c_f32 = g->C.t == KB_F32, k.epi = (int)g->epi;
    k.ldaux = (g->epi >= K_EPI_GELU_AUX && g->epi <= K_EPI_DGELU_BGRAD) ? g->ldaux : 0;
    return k;
}

static gemm_entry *lookup(const gemm_key *k) {
    for (int i = 0; i < cache_n; i++)
        if (memcmp(&cache[i].key, k, sizeof *k) == 0) return &cache[i];
    return NULL;
}

static cublasLtEpilogue_t lt_epilogue(k_epilogue e) {
    switch (e) {
    case K_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case K_EPI_GELU_AUX: return CUBLASLT_EPILOGUE_GELU_AUX;
    case K_EPI_GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case K_EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case K_EPI_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case K_EPI_BGRAD_A: return CUBLASLT_EPILOGUE_BGRADB;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

static int set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v, size_t n,
                    const char *what) {
    return lt_check(kc_lt.cublasLtMatmulDescSetAttribute(d, a, v, n), what);
}

static int algo_attr(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t at, int *out) {
    uint32_t v32 = 0;
    size_t written = 0;
    /* every attribute read here is 32 bits wide (int32 or uint32) */
    if (kc_lt.cublasLtMatmulAlgoConfigGetAttribute(a, at, &v32, sizeof v32, &written) != CUBLAS_STATUS_SUCCESS)
        return -1;
    *out = (int)v32;
    return 0;
}

/* Builds the descriptors of a new problem and pins its algorithm. */
static gemm_entry *create_entry(const gemm_key *k, const void *bias_or_dbias, const void *aux) {
    if (cache_n == cache_cap) {
        int cap = cache_cap ? 2 * cache_cap : 32;
        gemm_entry *c = realloc(cache, (size_t)cap * sizeof *c);
        if (!c) {
            core_error("GEMM: out of memory for the algorithm cache");
            return NULL;
        }
        cache = c, cache_cap = cap;
    }
    gemm_entry *e = &cache[cache_n];
    memset(e, 0, sizeof *e);
    e->key = *k;
    const cudaDataType_t ab = CUDA_R_16BF, ct = k->c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasOperation_t opa = k->transB ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k->transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    if (lt_check(kc_lt.cublasLtMatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor") ||
        set_desc(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa, "TRANSA") ||
        set_desc(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb, "TRANSB"))
        goto fail;
    /* cuBLASLt's A = our B: [N, K] after op; stored rows x cols (column-major) = transB ? K x N : N x K */
    if (lt_check(kc_lt.cublasLtMatrixLayoutCreate(&e->la, ab, k->transB ? k->K : k->N, k->transB ? k->N : k->K,
                                                  k->ldb),
                 "layout of B") ||
        lt_check(kc_lt.cublasLtMatrixLayoutCreate(&e->lb, ab, k->transA ? k->M : k->K, k->transA ? k->K : k->M,
                                                  k->lda),
                 "layout of A") ||
        lt_check(kc_lt.cublasLtMatrixLayoutCreate(&e->lc, ct, k->N, k->M, k->ldc), "layout of C"))
        goto fail;
    cublasLtEpilogue_t epi = lt_epilogue((k_epilogue)k->epi);
    if (set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, "EPILOGUE")) goto fail;
    if (k->epi != K_EPI_NONE && k->epi != K_EPI_GELU_AUX && k->epi != K_EPI_DGELU) {
        int32_t bt = ct;
        if (set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt, "BIAS_DATA_TYPE") ||
            set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_or_dbias, sizeof bias_or_dbias, "BIAS_POINTER"))
            goto fail;
    }
    if (k->ldaux) {
        int64_t ld = k->ldaux;
        int32_t at = CUDA_R_16BF;
        if (set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld, "EPILOGUE_AUX_LD") ||
            set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof at, "EPILOGUE_AUX_DATA_TYPE") ||
            set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux, "EPILOGUE_AUX_POINTER"))
            goto fail;
    }
    /* the algorithm: no split-K, any 16-byte aligned pointers, our workspace */
    size_t ws = WORKSPACE_BYTES;
    uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE, align = 16;
    if (lt_check(kc_lt.cublasLtMatmulPreferenceCreate(&pref), "preference") ||
        lt_check(kc_lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                            sizeof ws), "MAX_WORKSPACE_BYTES") ||
        lt_check(kc_lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                            &no_reduction, sizeof no_reduction),
                 "REDUCTION_SCHEME_MASK") ||
        lt_check(kc_lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align,
                                                            sizeof align), "MIN_ALIGNMENT_A") ||
        lt_check(kc_lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align,
                                                            sizeof align), "MIN_ALIGNMENT_B") ||
        lt_check(kc_lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align,
                                                            sizeof align), "MIN_ALIGNMENT_C") ||
        lt_check(kc_lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align,
                                                            sizeof align), "MIN_ALIGNMENT_D"))
        goto fail;
    cublasLtMatmulHeuristicResult_t res[HEURISTIC_RESULTS];
    int nres = 0;
    if (lt_check(kc_lt.cublasLtMatmulAlgoGetHeuristic(lt, e->desc, e->la, e->lb, e->lc, e->lc, pref,
                                                      HEURISTIC_RESULTS, res, &nres),
                 "algorithm heuristic"))
        goto fail;
    int found = -1;
    for (int i = 0; i < nres && found < 0; i++) {
        int splitk = 1;
        if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > ws) continue;
        if (algo_attr(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk) == 0 && splitk > 1) continue;
        found = i;
    }
    if (found < 0) {
        core_error("GEMM: no cuBLASLt algorithm without split-K for M %d N %d K %d (transA %d transB %d, lda %d ldb "
                   "%d ldc %d, %s output, epilogue %d; %d candidates)",
                   k->M, k->N, k->K, k->transA, k->transB, k->lda, k->ldb, k->ldc, k->c_f32 ? "fp32" : "bf16",
                   k->epi, nres);
        goto fail;
    }
    e->algo = res[found].algo;
    e->info.workspace = res[found].workspaceSize;
    e->info.algo_id = e->info.tile_id = e->info.splitk = e->info.stages = e->info.cta_swizzle = -1;
    algo_attr(&e->algo, CUBLASLT_ALGO_CONFIG_ID, &e->info.algo_id);
    algo_attr(&e->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &e->info.tile_id);
    algo_attr(&e->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &e->info.splitk);
    algo_attr(&e->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &e->info.stages);
    algo_attr(&e->algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &e->info.cta_swizzle);
    kc_lt.cublasLtMatmulPreferenceDestroy(pref);
    cache_n++;
    return e;
fail:
    if (pref) kc_lt.cublasLtMatmulPreferenceDestroy(pref);
    entry_free(e);
    return NULL;
}

int kc_gemm(const k_gemm_args *g) {
    if (kc_precond_gemm(g)) return -1;
    gemm_key k = key_of(g);
    const int needs_dbias = g->epi == K_EPI_DGELU_BGRAD || g->epi == K_EPI_BGRAD_A;
    const size_t esz = g->C.t == KB_F32 ? 4 : 2;
    const size_t nbias = g->epi == K_EPI_BGRAD_A ? (size_t)g->M : (size_t)g->N;
    void *bgrad = NULL;
    if (needs_dbias && !(bgrad = kc_scratch(KC_SLOT_GEMM_BIAS, nbias * esz))) return -1;
    const void *bias_ptr = needs_dbias ? bgrad : g->bias;
    gemm_entry *e = lookup(&k);
    if (!e && !(e = create_entry(&k, bias_ptr, g->aux))) return -1;
    if (g->epi != K_EPI_NONE && g->epi != K_EPI_GELU_AUX && g->epi != K_EPI_DGELU &&
        set_desc(e->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof bias_ptr, "BIAS_POINTER"))
        return -1;
    if (k.ldaux) {
        const void *aux = g->aux;
        if (set_desc(e->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux, "EPILOGUE_AUX_POINTER"))
            return -1;
    }
    void *ws = kc_scratch(KC_SLOT_GEMM_WS, WORKSPACE_BYTES);
    if (!ws) return -1;
    if (lt_check(kc_lt.cublasLtMatmul(lt, e->desc, &g->alpha, g->B, e->la, g->A, e->lb, &g->beta, g->C.p, e->lc,
                                      g->C.p, e->lc, &e->algo, ws, WORKSPACE_BYTES, kc_stream),
                 "cublasLtMatmul"))
        return core_error_push("GEMM M %d N %d K %d: ", g->M, g->N, g->K);
    if (needs_dbias) {
        kb_in src = {bgrad, g->C.t};
        if (kc_add(kb_out_f32(g->dbias), src, (int64_t)nbias)) return -1;
    }
    return 0;
}

int k_gemm_algo_of(const k_gemm_args *g, k_gemm_algo_info *out) {
    gemm_key k = key_of(g);
    gemm_entry *e = lookup(&k);
    if (!e) return -1;
    *out = e->info;
    return 0;
}
