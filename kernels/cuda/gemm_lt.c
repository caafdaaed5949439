/* kernels/cuda/gemm_lt.c — GEMM on the GPU through cuBLASLt: bf16 operands, fp32 accumulation and scaling, bf16 or
 * fp32 output, with the bias / GELU-aux / dGELU / bias-gradient epilogues (k_cuda.h lists them in row-major terms).
 *
 * Row-major to cuBLASLt's column-major (gemm_plan.h kc_gemm_lt_view, checked by its host model in make test):
 * C[M,N] = op(A) op(B) row-major is C^T[N,M] = op(B)^T op(A)^T column-major, so cuBLASLt sees m = N, n = M, its "A" is
 * our B (transposed iff transB) and its "B" is our A (transposed iff transA). The bias (length N) is then per row of
 * cuBLASLt's D, as its BIAS epilogue wants; our K_EPI_BGRAD_A (bias gradient from op(A), length M) is its BGRADB.
 *
 * Determinism and batch invariance: one algorithm per problem class (everything but M, gemm_plan.h), chosen once by
 * cublasLtMatmulAlgoGetHeuristic at the class's canonical M with split-K reductions filtered out
 * (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = NONE, results with SPLITK_NUM > 1 or a reduction scheme skipped),
 * for any 16-byte aligned pointers (MIN_ALIGNMENT = 16) and the workspace we allocate (results needing more
 * skipped); then for each M the same algorithm, validated once per (class, M) by cublasLtMatmulAlgoCheck, or an error.
 * The rollout's and the trainer's GEMMs (different M) therefore run the same kernel. cuBLASLt's GELU is the tanh
 * approximation.
 *
 * The bias gradient of the weight-gradient GEMM (K_EPI_BGRAD_A: bf16 operands, fp32 D, beta 1) may have no BGRADB
 * kernel. k_gemm_set_bgrad_mode picks: auto (the default: BGRADB when the heuristic offers one for the class, else the
 * fallback), fused (BGRADB or an error), fallback (always: a plain GEMM, then gemm_colsum.cu's fixed-order column
 * sum). $VGRPO_GEMM_BGRAD=auto|fused|fallback sets it at start-up. The mode is part of every cache key.
 * Sources: cuBLASLt docs (cublasLtMatmul, epilogues, cublasLtMatmulAlgoCheck); karpathy/llm.c llmc/matmul.cuh read
 * for the pattern. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/dynload.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/precond/kc_precond.h"

#define WORKSPACE_BYTES ((size_t)32 << 20)

typedef struct {
    kc_gemm_class cls; /* with the requested epilogue */
    int M, bgrad_mode;
} gemm_key;

typedef struct {
    gemm_key key;
    kc_lt_descs d;  /* for the epilogue run (K_EPI_NONE under the bias-gradient fallback) at this M */
    int plan;       /* index into plans */
    int fallback;   /* K_EPI_BGRAD_A done by gemm_colsum.cu */
    size_t workspace;
} gemm_entry;

static cublasLtHandle_t lt;
static gemm_entry *cache;
static int cache_n, cache_cap;
static kc_gemm_plans plans;
static k_gemm_bgrad_mode bgrad_mode = K_GEMM_BGRAD_AUTO;

int kc_lt_check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    return core_error("cuBLASLt: %s: %s", what, kc_lt.cublasLtGetStatusString(st));
}

int k_gemm_set_bgrad_mode(k_gemm_bgrad_mode m) {
    if ((int)m < K_GEMM_BGRAD_AUTO || m > K_GEMM_BGRAD_FALLBACK)
        return core_error("GEMM: unknown bias-gradient mode %d", (int)m);
    bgrad_mode = m;
    return 0;
}

int k_gemm_bgrad_mode_parse(const char *s, k_gemm_bgrad_mode *m) {
    if (!strcmp(s, "auto")) *m = K_GEMM_BGRAD_AUTO;
    else if (!strcmp(s, "fused")) *m = K_GEMM_BGRAD_FUSED;
    else if (!strcmp(s, "fallback")) *m = K_GEMM_BGRAD_FALLBACK;
    else return core_error("VGRPO_GEMM_BGRAD: expected auto, fused or fallback, got \"%s\"", s);
    return 0;
}

int kc_gemm_init(void) {
    if (lt) return 0;
    const char *e = getenv("VGRPO_GEMM_BGRAD");
    if (e && *e) {
        k_gemm_bgrad_mode m = K_GEMM_BGRAD_AUTO;
        if (k_gemm_bgrad_mode_parse(e, &m) || k_gemm_set_bgrad_mode(m)) return -1;
    }
    if (kc_lt_check(kc_lt.cublasLtCreate(&lt), "cublasLtCreate")) return -1;
    return kc_scratch(KC_SLOT_GEMM_WS, WORKSPACE_BYTES) ? 0 : -1;
}

void kc_lt_descs_free(kc_lt_descs *d) {
    if (d->desc) kc_lt.cublasLtMatmulDescDestroy(d->desc);
    if (d->la) kc_lt.cublasLtMatrixLayoutDestroy(d->la);
    if (d->lb) kc_lt.cublasLtMatrixLayoutDestroy(d->lb);
    if (d->lc) kc_lt.cublasLtMatrixLayoutDestroy(d->lc);
    if (d->pref) kc_lt.cublasLtMatmulPreferenceDestroy(d->pref);
    memset(d, 0, sizeof *d);
}

void kc_gemm_shutdown(void) {
    for (int i = 0; i < cache_n; i++) kc_lt_descs_free(&cache[i].d);
    free(cache);
    cache = NULL, cache_n = cache_cap = 0;
    kc_gemm_plans_free(&plans);
    if (lt) kc_lt.cublasLtDestroy(lt);
    lt = NULL;
}

cublasLtEpilogue_t kc_lt_epilogue(int e) {
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
    return kc_lt_check(kc_lt.cublasLtMatmulDescSetAttribute(d, a, v, n), what);
}

static int set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *v, size_t n,
                    const char *what) {
    return kc_lt_check(kc_lt.cublasLtMatmulPreferenceSetAttribute(p, a, v, n), what);
}

/* The k_gemm_args of class c at M (shapes only: no pointers). */
static k_gemm_args args_of(const kc_gemm_class *c, int M) {
    k_gemm_args g;
    memset(&g, 0, sizeof g);
    g.transA = c->transA, g.transB = c->transB, g.M = M, g.N = c->N, g.K = c->K;
    g.lda = c->lda, g.ldb = c->ldb, g.ldc = c->ldc, g.C.t = c->c_f32 ? KB_F32 : KB_BF16;
    g.epi = (k_epilogue)c->epi, g.ldaux = c->ldaux;
    return g;
}

static int epi_has_vector(int e) { return e != K_EPI_NONE && e != K_EPI_GELU_AUX && e != K_EPI_DGELU; }

int kc_lt_descs_make(const kc_gemm_class *c, int M, kc_lt_descs *d) {
    memset(d, 0, sizeof *d);
    k_gemm_args g = args_of(c, M);
    kc_lt_view v;
    kc_gemm_lt_view(&g, &v);
    const cudaDataType_t ab = CUDA_R_16BF, ct = c->c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasOperation_t opa = v.a.op ? CUBLAS_OP_T : CUBLAS_OP_N, opb = v.b.op ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (kc_lt_check(kc_lt.cublasLtMatmulDescCreate(&d->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor") ||
        set_desc(d->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa, "TRANSA") ||
        set_desc(d->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb, "TRANSB") ||
        kc_lt_check(kc_lt.cublasLtMatrixLayoutCreate(&d->la, ab, (uint64_t)v.a.rows, (uint64_t)v.a.cols, v.a.ld),
                    "layout of B") ||
        kc_lt_check(kc_lt.cublasLtMatrixLayoutCreate(&d->lb, ab, (uint64_t)v.b.rows, (uint64_t)v.b.cols, v.b.ld),
                    "layout of A") ||
        kc_lt_check(kc_lt.cublasLtMatrixLayoutCreate(&d->lc, ct, (uint64_t)v.c.rows, (uint64_t)v.c.cols, v.c.ld),
                    "layout of C"))
        goto fail;
    cublasLtEpilogue_t epi = kc_lt_epilogue(c->epi);
    if (set_desc(d->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, "EPILOGUE")) goto fail;
    if (epi_has_vector(c->epi)) {
        int32_t bt = ct;
        if (set_desc(d->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt, "BIAS_DATA_TYPE")) goto fail;
    }
    if (v.ldaux) {
        int64_t ld = v.ldaux;
        int32_t at = CUDA_R_16BF;
        if (set_desc(d->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld, "EPILOGUE_AUX_LD") ||
            set_desc(d->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof at, "EPILOGUE_AUX_DATA_TYPE"))
            goto fail;
    }
    /* the algorithm: no split-K (deterministic classes), any 16-byte aligned pointers, the class's workspace */
    size_t ws = c->workspace_limit;
    uint32_t reductions = c->deterministic ? CUBLASLT_REDUCTION_SCHEME_NONE : CUBLASLT_REDUCTION_SCHEME_MASK;
    uint32_t align = 16;
    if (kc_lt_check(kc_lt.cublasLtMatmulPreferenceCreate(&d->pref), "preference") ||
        set_pref(d->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws, "MAX_WORKSPACE_BYTES") ||
        set_pref(d->pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions, sizeof reductions,
                 "REDUCTION_SCHEME_MASK") ||
        set_pref(d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof align, "MIN_ALIGNMENT_A") ||
        set_pref(d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof align, "MIN_ALIGNMENT_B") ||
        set_pref(d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, sizeof align, "MIN_ALIGNMENT_C") ||
        set_pref(d->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, sizeof align, "MIN_ALIGNMENT_D"))
        goto fail;
    return 0;
fail:
    kc_lt_descs_free(d);
    return -1;
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

void kc_lt_cand_of(const cublasLtMatmulAlgo_t *a, size_t workspace, int ok, kc_gemm_cand *c) {
    memset(c, 0, sizeof *c);
    memcpy(c->algo, a, sizeof *a < sizeof c->algo ? sizeof *a : sizeof c->algo);
    c->workspace = workspace, c->ok = ok;
    c->algo_id = c->tile_id = c->stages = c->swizzle = -1;
    c->splitk = 1, c->reduction = 0;
    algo_attr(a, CUBLASLT_ALGO_CONFIG_ID, &c->algo_id);
    algo_attr(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c->tile_id);
    algo_attr(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c->stages);
    algo_attr(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c->swizzle);
    algo_attr(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c->splitk);
    if (c->splitk > 1) algo_attr(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c->reduction);
}

/* ---- the backend of gemm_plan.c: the real heuristic and check ---- */

typedef struct {
    cublasLtHandle_t h;
    const kc_lt_descs *d; /* the descriptors at the M being checked (pointers set) */
} lt_ctx;

static int lt_heuristic(void *ctx, const kc_gemm_class *cls, int M, kc_gemm_cand *out, int cap, int *n) {
    const lt_ctx *x = ctx;
    kc_lt_descs d;
    if (kc_lt_descs_make(cls, M, &d)) return -1;
    cublasLtMatmulHeuristicResult_t res[16];
    int nres = 0;
    if (cap > 16) cap = 16;
    int rc = kc_lt_check(kc_lt.cublasLtMatmulAlgoGetHeuristic(x->h, d.desc, d.la, d.lb, d.lc, d.lc, d.pref, cap, res,
                                                              &nres),
                         "algorithm heuristic");
    if (rc == 0)
        for (int i = 0; i < nres; i++)
            kc_lt_cand_of(&res[i].algo, res[i].workspaceSize, res[i].state == CUBLAS_STATUS_SUCCESS, &out[i]);
    *n = rc == 0 ? nres : 0;
    kc_lt_descs_free(&d);
    return rc;
}

static int lt_check_algo(void *ctx, const kc_gemm_class *cls, int M, const kc_gemm_cand *c, size_t *workspace) {
    (void)cls, (void)M;
    const lt_ctx *x = ctx;
    cublasLtMatmulAlgo_t a;
    memcpy(&a, c->algo, sizeof a);
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    if (kc_lt_check(kc_lt.cublasLtMatmulAlgoCheck(x->h, x->d->desc, x->d->la, x->d->lb, x->d->lc, x->d->lc, &a, &r),
                    "cublasLtMatmulAlgoCheck"))
        return -1;
    if (r.state != CUBLAS_STATUS_SUCCESS) return kc_lt_check(r.state, "cublasLtMatmulAlgoCheck (result state)");
    *workspace = r.workspaceSize;
    return 0;
}

static int set_pointers(const kc_lt_descs *d, int epi, const void *vec, const void *aux) {
    if (epi_has_vector(epi) && set_desc(d->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec, "BIAS_POINTER"))
        return -1;
    if (epi >= K_EPI_GELU_AUX && epi <= K_EPI_DGELU_BGRAD &&
        set_desc(d->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux, "EPILOGUE_AUX_POINTER"))
        return -1;
    return 0;
}

int kc_lt_plan(cublasLtHandle_t h, kc_gemm_plans *P, const kc_gemm_class *req, int bgrad_mode, int M,
               const void *vec, const void *aux, kc_lt_descs *d, int *plan, int *fallback, size_t *workspace) {
    lt_ctx x = {h, NULL};
    const kc_gemm_backend b = {lt_heuristic, lt_check_algo, &x};
    kc_gemm_plan *p = kc_gemm_route(P, req, bgrad_mode, &b, fallback);
    if (!p) return -1;
    *plan = (int)(p - P->v);
    if (kc_lt_descs_make(&p->cls, M, d)) return -1;
    x.d = d;
    if (set_pointers(d, p->cls.epi, *fallback ? NULL : vec, aux) || kc_gemm_plan_validate(p, M, &b, workspace)) {
        kc_lt_descs_free(d);
        return -1;
    }
    return 0;
}

static gemm_entry *lookup(const gemm_key *k) {
    for (int i = 0; i < cache_n; i++)
        if (memcmp(&cache[i].key, k, sizeof *k) == 0) return &cache[i];
    return NULL;
}

/* The plan of the class the call runs (the requested epilogue, or K_EPI_NONE under the bias-gradient fallback),
 * its descriptors at M, and the algorithm checked at M. */
static gemm_entry *create_entry(const gemm_key *k, const void *vec, const void *aux) {
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
    if (kc_lt_plan(lt, &plans, &k->cls, k->bgrad_mode, k->M, vec, aux, &e->d, &e->plan, &e->fallback, &e->workspace))
        return NULL;
    cache_n++;
    return e;
}

static gemm_key key_of(const k_gemm_args *g) {
    gemm_key k;
    memset(&k, 0, sizeof k);
    kc_gemm_class_of(g, (int)g->epi, WORKSPACE_BYTES, 1, &k.cls);
    k.M = g->M, k.bgrad_mode = (int)bgrad_mode;
    return k;
}

int kc_gemm(const k_gemm_args *g) {
    if (kc_precond_gemm(g)) return -1;
    gemm_key k = key_of(g);
    const int needs_dbias = g->epi == K_EPI_DGELU_BGRAD || g->epi == K_EPI_BGRAD_A;
    const size_t esz = g->C.t == KB_F32 ? 4 : 2;
    const size_t nbias = g->epi == K_EPI_BGRAD_A ? (size_t)g->M : (size_t)g->N;
    gemm_entry *e = lookup(&k);
    void *bgrad = NULL;
    /* the fused bias gradient is written to scratch (C's dtype), then added to dbias */
    if (needs_dbias && !(e && e->fallback) && !(bgrad = kc_scratch(KC_SLOT_GEMM_BIAS, nbias * esz))) return -1;
    const void *vec = needs_dbias ? bgrad : g->bias;
    if (!e && !(e = create_entry(&k, vec, g->aux))) return -1;
    const int run_epi = e->fallback ? K_EPI_NONE : (int)g->epi;
    if (e->fallback) vec = NULL;
    if (set_pointers(&e->d, run_epi, vec, g->aux)) return -1;
    void *ws = kc_scratch(KC_SLOT_GEMM_WS, WORKSPACE_BYTES);
    if (!ws) return -1;
    const kc_gemm_plan *p = &plans.v[e->plan];
    cublasLtMatmulAlgo_t algo;
    memcpy(&algo, p->algo.algo, sizeof algo);
    if (kc_lt_check(kc_lt.cublasLtMatmul(lt, e->d.desc, &g->alpha, g->B.p, e->d.la, g->A.p, e->d.lb, &g->beta, g->C.p,
                                         e->d.lc, g->C.p, e->d.lc, &algo, ws, WORKSPACE_BYTES, kc_stream),
                    "cublasLtMatmul"))
        return core_error_push("GEMM M %d N %d K %d: ", g->M, g->N, g->K);
    if (e->fallback) /* dbias[m] += sum_k op(A)[m, k]: A is [K, M] (transA) or [M, K] */
        return kc_colsum_bgrad(g->dbias, g->A, g->transA ? 1 : g->lda, g->transA ? g->lda : 1, g->M,
                               g->K);
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
    const kc_gemm_plan *p = &plans.v[e->plan];
    memset(out, 0, sizeof *out);
    out->algo_id = p->algo.algo_id, out->tile_id = p->algo.tile_id, out->splitk = p->algo.splitk;
    out->stages = p->algo.stages, out->cta_swizzle = p->algo.swizzle, out->workspace = e->workspace;
    out->canonical_m = p->canonical_m, out->bgrad_fallback = e->fallback;
    return 0;
}
