/* kernels/cuda/gemm_lt_selftest.c — `vgrpo gemm-plan`: the real cuBLASLt on whatever machine this runs, GPU or not
 * (k_cuda.h k_gemm_plan_selftest). Measured on the build machine (no NVIDIA driver, cuBLASLt 13.1): cublasLtCreate
 * answers CUBLAS_STATUS_NOT_INITIALIZED, and so does every call that takes the handle (cublasLtMatmulAlgoGetHeuristic,
 * cublasLtMatmulAlgoInit, cublasLtMatmulAlgoCheck, cublasLtMatmulAlgoGetIds); matmul descriptors, matrix layouts and
 * preferences are created, set and read back without a device. So without a GPU this builds every GEMM class the
 * Wan DiT runs with gemm_lt.c's own kc_lt_descs_make and reads every attribute back against kc_gemm_lt_view (whose
 * host model make test checks against the row-major reference GEMM); with a GPU it also plans each class at its
 * canonical M and checks the algorithm at M = 1, 2 and 8 samples of tokens (one algorithm id for all three). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/internal.h"

typedef struct {
    const char *name;
    int transA, transB, N, K, lda, ldb, ldc, c_f32, epi, ldaux;
    int batch_m; /* M is tokens (1, 2, 8 samples); else M = m_fixed */
    int m_fixed;
} st_case;

/* Wan 2.1 1.3B: dim 1536, FFN 8960; tokens per sample 1560 (81 x 480 x 832 would be 32,760; any M works here) */
enum { D = 1536, F = 8960, S = 1560 };
static const st_case cases[] = {
    {"linear fwd (q, k, v, o, ffn down), bias", 0, 1, D, D, D, D, D, 0, K_EPI_BIAS, 0, 1, 0},
    {"ffn up, bias", 0, 1, F, D, D, D, F, 0, K_EPI_BIAS, 0, 1, 0},
    {"ffn up, gelu aux bias", 0, 1, F, D, D, D, F, 0, K_EPI_GELU_AUX_BIAS, F, 1, 0},
    {"linear bwd dx (beta 1)", 0, 0, D, D, D, D, D, 0, K_EPI_NONE, 0, 1, 0},
    {"ffn down bwd, dgelu bgrad", 0, 0, F, D, D, F, F, 0, K_EPI_DGELU_BGRAD, F, 1, 0},
    {"weight grad (fp32 +=), bgrad_a", 1, 0, D, 8 * S, D, D, D, 1, K_EPI_BGRAD_A, 0, 0, D},
    {"weight grad (fp32 +=), plain (bgrad fallback)", 1, 0, D, 8 * S, D, D, D, 1, K_EPI_NONE, 0, 0, D},
};

static int want_u64(FILE *out, const char *what, uint64_t got, uint64_t want) {
    if (got == want) return 0;
    fprintf(out, "    MISMATCH %s: read back %llu, gemm_lt.c meant %llu\n", what, (unsigned long long)got,
            (unsigned long long)want);
    return 1;
}

static int layout_back(FILE *out, cublasLtMatrixLayout_t l, const kc_lt_mat *m, cudaDataType_t t, const char *what) {
    uint32_t type = 0;
    uint64_t rows = 0, cols = 0;
    int64_t ld = 0;
    size_t w = 0;
    char nm[64];
    if (kc_lt_check(kc_lt.cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_TYPE, &type, sizeof type, &w),
                    "layout TYPE") ||
        kc_lt_check(kc_lt.cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows, &w),
                    "layout ROWS") ||
        kc_lt_check(kc_lt.cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols, &w),
                    "layout COLS") ||
        kc_lt_check(kc_lt.cublasLtMatrixLayoutGetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld, &w),
                    "layout LD"))
        return -1;
    int bad = 0;
    snprintf(nm, sizeof nm, "%s TYPE", what), bad += want_u64(out, nm, type, (uint64_t)t);
    snprintf(nm, sizeof nm, "%s ROWS", what), bad += want_u64(out, nm, rows, (uint64_t)m->rows);
    snprintf(nm, sizeof nm, "%s COLS", what), bad += want_u64(out, nm, cols, (uint64_t)m->cols);
    snprintf(nm, sizeof nm, "%s LD", what), bad += want_u64(out, nm, (uint64_t)ld, (uint64_t)m->ld);
    return bad;
}

static int desc_back(FILE *out, const kc_lt_descs *d, const kc_gemm_class *c, const kc_lt_view *v) {
    int32_t ta = -1, tb = -1, bt = -1;
    uint32_t epi = 0, red = 99, al[4] = {0};
    int64_t auxld = 0;
    uint64_t ws = 0;
    size_t w = 0;
    cublasLtMatmulDesc_t m = d->desc;
    if (kc_lt_check(kc_lt.cublasLtMatmulDescGetAttribute(m, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta, &w),
                    "TRANSA") ||
        kc_lt_check(kc_lt.cublasLtMatmulDescGetAttribute(m, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb, &w),
                    "TRANSB") ||
        kc_lt_check(kc_lt.cublasLtMatmulDescGetAttribute(m, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, &w),
                    "EPILOGUE") ||
        kc_lt_check(kc_lt.cublasLtMatmulPreferenceGetAttribute(d->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                               sizeof ws, &w),
                    "MAX_WORKSPACE_BYTES") ||
        kc_lt_check(kc_lt.cublasLtMatmulPreferenceGetAttribute(d->pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                               &red, sizeof red, &w),
                    "REDUCTION_SCHEME_MASK"))
        return -1;
    for (int i = 0; i < 4; i++)
        if (kc_lt_check(kc_lt.cublasLtMatmulPreferenceGetAttribute(
                            d->pref,
                            (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i),
                            &al[i], sizeof al[i], &w),
                        "MIN_ALIGNMENT"))
            return -1;
    int bad = 0;
    bad += want_u64(out, "TRANSA", (uint64_t)ta, v->a.op ? CUBLAS_OP_T : CUBLAS_OP_N);
    bad += want_u64(out, "TRANSB", (uint64_t)tb, v->b.op ? CUBLAS_OP_T : CUBLAS_OP_N);
    bad += want_u64(out, "EPILOGUE", epi, (uint64_t)kc_lt_epilogue(c->epi));
    if (c->epi != K_EPI_NONE && c->epi != K_EPI_GELU_AUX && c->epi != K_EPI_DGELU) {
        if (kc_lt_check(
                kc_lt.cublasLtMatmulDescGetAttribute(m, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt, &w),
                "BIAS_DATA_TYPE"))
            return -1;
        bad += want_u64(out, "BIAS_DATA_TYPE", (uint64_t)bt, c->c_f32 ? CUDA_R_32F : CUDA_R_16BF);
    }
    if (v->ldaux) {
        if (kc_lt_check(kc_lt.cublasLtMatmulDescGetAttribute(m, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxld,
                                                             sizeof auxld, &w),
                        "EPILOGUE_AUX_LD"))
            return -1;
        bad += want_u64(out, "EPILOGUE_AUX_LD", (uint64_t)auxld, (uint64_t)v->ldaux);
    }
    bad += want_u64(out, "MAX_WORKSPACE_BYTES", ws, c->workspace_limit);
    bad += want_u64(out, "REDUCTION_SCHEME_MASK", red, CUBLASLT_REDUCTION_SCHEME_NONE);
    for (int i = 0; i < 4; i++) bad += want_u64(out, "MIN_ALIGNMENT", al[i], 16);
    const cudaDataType_t ct = c->c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    int r1 = layout_back(out, d->la, &v->a, CUDA_R_16BF, "a (our B)"), r2 = layout_back(out, d->lb, &v->b, CUDA_R_16BF,
                                                                                          "b (our A)"),
        r3 = layout_back(out, d->lc, &v->c, ct, "c (our C)");
    if (r1 < 0 || r2 < 0 || r3 < 0) return -1;
    return bad + r1 + r2 + r3;
}

#define WS ((size_t)32 << 20)

/* Without a handle: what the calls gemm_lt.c needs a GPU for answer, and that a layout's ld is not checked when the
 * layout is made (gemm_lt.c's check_args is what refuses ld < row length). */
static void probe_without_handle(FILE *out) {
    kc_gemm_class c;
    k_gemm_args g;
    memset(&g, 0, sizeof g);
    g.transB = 1, g.M = 64, g.N = 64, g.K = 64, g.lda = g.ldb = g.ldc = 64;
    kc_gemm_class_of(&g, K_EPI_NONE, WS, 1, &c);
    kc_lt_descs d;
    if (kc_lt_descs_make(&c, 64, &d)) return;
    cublasLtMatmulHeuristicResult_t r[1];
    int n = -1;
    cublasStatus_t sh = kc_lt.cublasLtMatmulAlgoGetHeuristic(NULL, d.desc, d.la, d.lb, d.lc, d.lc, d.pref, 1, r, &n);
    cublasLtMatmulAlgo_t a;
    memset(&a, 0, sizeof a);
    cublasStatus_t sc = kc_lt.cublasLtMatmulAlgoCheck(NULL, d.desc, d.la, d.lb, d.lc, d.lc, &a, r);
    kc_lt_descs_free(&d);
    cublasLtMatrixLayout_t l = NULL;
    cublasStatus_t sl = kc_lt.cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 16, 4, 8);
    if (l) kc_lt.cublasLtMatrixLayoutDestroy(l);
    fprintf(out, "without a handle: cublasLtMatmulAlgoGetHeuristic status %d, cublasLtMatmulAlgoCheck status %d; "
            "cublasLtMatrixLayoutCreate(16 x 4, ld 8) status %d (ld is not checked there)\n", (int)sh, (int)sc,
            (int)sl);
}

int k_gemm_plan_selftest(FILE *out) {
    if (kc_dynload()) return -1;
    fprintf(out, "cuBLASLt: %s (version %zu)\n", kc_dynload_path(0), kc_lt.cublasLtGetVersion());
    cublasLtHandle_t h = NULL;
    const cublasStatus_t st = kc_lt.cublasLtCreate(&h);
    fprintf(out, "cublasLtCreate: %s (status %d)%s\n", kc_lt.cublasLtGetStatusString(st), (int)st,
            st == CUBLAS_STATUS_SUCCESS ? "" : ": no usable GPU; the heuristic and cublasLtMatmulAlgoCheck need the "
                                               "handle, so only descriptors, layouts and preferences are checked");
    if (st != CUBLAS_STATUS_SUCCESS) {
        h = NULL;
        probe_without_handle(out);
    }
    int bad = 0, checked = 0, planned = 0;
    kc_gemm_plans plans = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const st_case *t = &cases[i];
        const int ms[3] = {S, 2 * S, 8 * S};
        const int nm = t->batch_m ? 3 : 1;
        int plan_of[3] = {-1, -1, -1};
        for (int j = 0; j < nm; j++) {
            k_gemm_args g;
            memset(&g, 0, sizeof g);
            g.transA = t->transA, g.transB = t->transB, g.M = t->batch_m ? ms[j] : t->m_fixed, g.N = t->N, g.K = t->K;
            g.lda = t->lda, g.ldb = t->ldb, g.ldc = t->ldc, g.C.t = t->c_f32 ? KB_F32 : KB_BF16;
            g.epi = (k_epilogue)t->epi, g.ldaux = t->ldaux;
            kc_gemm_class c;
            kc_gemm_class_of(&g, t->epi, WS, 1, &c);
            kc_lt_view v;
            kc_gemm_lt_view(&g, &v);
            kc_lt_descs d;
            if (kc_lt_descs_make(&c, g.M, &d)) return core_error_push("gemm-plan: %s: ", t->name);
            int r = desc_back(out, &d, &c, &v);
            kc_lt_descs_free(&d);
            if (r < 0) return core_error_push("gemm-plan: %s: ", t->name);
            fprintf(out, "%s %s, M %d: a %dx%d ld %d %c, b %dx%d ld %d %c, c %dx%d ld %d%s\n", r ? "MISMATCH" : "ok",
                    t->name, g.M, v.a.rows, v.a.cols, v.a.ld, v.a.op ? 'T' : 'N', v.b.rows, v.b.cols, v.b.ld,
                    v.b.op ? 'T' : 'N', v.c.rows, v.c.cols, v.c.ld, r ? "" : ": every attribute read back as meant");
            bad += r > 0, checked++;
            if (!h) continue;
            size_t ws = 0;
            static const char dummy[64] __attribute__((aligned(256)));
            int fb = 0;
            /* FUSED for BGRAD_A: report whether cuBLASLt has a BGRADB kernel at all (the fallback case follows) */
            int pr = kc_lt_plan(h, &plans, &c, K_GEMM_BGRAD_FUSED, g.M, dummy, dummy, &d, &plan_of[j], &fb, &ws);
            if (pr == 0) kc_lt_descs_free(&d);
            const kc_gemm_plan *p = pr == 0 ? &plans.v[plan_of[j]] : NULL;
            if (pr)
                fprintf(out, "  %s at M %d: %s\n", t->epi == K_EPI_BGRAD_A ? "no BGRADB kernel (the fallback runs)"
                                                                          : "FAILED", g.M, core_last_error());
            else
                fprintf(out, "  plan (canonical M %d): algo %d tile %d stages %d swizzle %d splitK %d; at M %d: "
                        "workspace %zu bytes\n", p->canonical_m, p->algo.algo_id, p->algo.tile_id, p->algo.stages,
                        p->algo.swizzle, p->algo.splitk, g.M, ws);
            bad += pr != 0 && t->epi != K_EPI_BGRAD_A; /* BGRADB may have no kernel: the fallback covers it */
            planned += pr == 0;
            if (j && plan_of[j] != plan_of[0]) {
                fprintf(out, "  MISMATCH: M %d got plan %d, M %d plan %d\n", g.M, plan_of[j], ms[0], plan_of[0]);
                bad++;
            }
        }
    }
    kc_gemm_plans_free(&plans);
    if (h) kc_lt.cublasLtDestroy(h);
    fprintf(out, "%d descriptor sets read back, %d mismatched; %d plans checked on a GPU%s\n", checked, bad, planned,
            h ? "" : " (none: no GPU)");
    if (bad) return core_error("gemm-plan: %d mismatch(es) (lines above)", bad);
    return 0;
}

/* ---- the bias-gradient paths side by side (GPU) ---- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    double ms;
    float *dw, *db; /* host copies after one call from the initial values */
} bg_run;

/* One weight-gradient GEMM dW[M, N] += dy[K, M]^T x[K, N], dbias[M] += column sums of dy, in mode m: the first call's
 * results (from dw0 / db0) and the mean time of reps further calls. 1 when the mode cannot run it (message in
 * core_error), -1 on other failures. */
static int bg_time(k_gemm_bgrad_mode m, int epi, const kb_bf16 *dy, const kb_bf16 *x, float *dw, float *db,
                   const float *dw0, const float *db0, int M, int N, int K, int reps, bg_run *r) {
    if (k_gemm_set_bgrad_mode(m) || k_dev_upload(dw, dw0, (size_t)M * N * 4) || k_dev_upload(db, db0, (size_t)M * 4))
        return -1;
    k_gemm_args g;
    memset(&g, 0, sizeof g);
    g.transA = 1, g.M = M, g.N = N, g.K = K, g.alpha = 1.0f, g.beta = 1.0f;
    g.A = kb_in_bf16(dy), g.lda = M, g.B = kb_in_bf16(x), g.ldb = N;
    g.C = kb_out_f32(dw), g.ldc = N, g.epi = (k_epilogue)epi, g.dbias = epi == K_EPI_BGRAD_A ? db : NULL;
    if (kc_gemm(&g)) return m == K_GEMM_BGRAD_FUSED ? 1 : -1;
    if (k_dev_sync() || k_dev_download(r->dw, dw, (size_t)M * N * 4) || k_dev_download(r->db, db, (size_t)M * 4))
        return -1;
    const double t0 = now_s();
    for (int i = 0; i < reps; i++)
        if (kc_gemm(&g)) return -1;
    if (k_dev_sync()) return -1;
    r->ms = 1e3 * (now_s() - t0) / reps;
    return 0;
}

static double max_rel(const float *a, const float *b, size_t n) {
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        m = d > m ? d : m, s = fabs((double)b[i]) > s ? fabs((double)b[i]) : s;
    }
    return s > 0 ? m / s : m;
}

int k_gemm_bgrad_compare(FILE *out, int reps) {
    char why[K_WHY_MAX];
    if (k_cuda_init(why)) return core_error("%s", why);
    static const int shapes[2][3] = {{D, D, 8 * S}, {F, D, 8 * S}}; /* dW of a D x D linear, of the FFN up */
    int rc = 0;
    for (int s = 0; s < 2 && rc == 0; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        const size_t na = (size_t)K * M, nb = (size_t)K * N, nc = (size_t)M * N;
        float *ha = malloc(na * 4), *hb = malloc(nb * 4), *dw0 = malloc(nc * 4), *db0 = calloc((size_t)M, 4);
        bg_run r[3];
        for (int i = 0; i < 3; i++) r[i].dw = malloc(nc * 4), r[i].db = malloc((size_t)M * 4), r[i].ms = -1;
        kb_bf16 *dy = k_dev_alloc(na * 2), *x = k_dev_alloc(nb * 2);
        float *dw = k_dev_alloc(nc * 4), *db = k_dev_alloc((size_t)M * 4);
        if (!ha || !hb || !dw0 || !db0 || !dy || !x || !dw || !db) {
            rc = core_error("gemm-plan --bgrad: out of memory at M %d N %d K %d", M, N, K);
            goto next;
        }
        uint64_t st = 0x9e3779b97f4a7c15ull + (uint64_t)s;
        for (size_t i = 0; i < na; i++)
            st = st * 6364136223846793005ull + 1, ha[i] = (float)(st >> 40) / 8388608.0f - 1;
        for (size_t i = 0; i < nb; i++)
            st = st * 6364136223846793005ull + 1, hb[i] = (float)(st >> 40) / 8388608.0f - 1;
        memset(dw0, 0, nc * 4);
        if (k_dev_upload_bf16(dy, ha, na) || k_dev_upload_bf16(x, hb, nb)) {
            rc = -1;
            goto next;
        }
        const int f = bg_time(K_GEMM_BGRAD_FUSED, K_EPI_BGRAD_A, dy, x, dw, db, dw0, db0, M, N, K, reps, &r[0]);
        if (f < 0 || bg_time(K_GEMM_BGRAD_FALLBACK, K_EPI_BGRAD_A, dy, x, dw, db, dw0, db0, M, N, K, reps, &r[1]) ||
            bg_time(K_GEMM_BGRAD_AUTO, K_EPI_NONE, dy, x, dw, db, dw0, db0, M, N, K, reps, &r[2])) {
            rc = -1;
            goto next;
        }
        /* the bias gradient's reference: column sums of the bf16 dy, in double */
        double *ref = calloc((size_t)M, sizeof *ref);
        float *reff = malloc((size_t)M * 4);
        for (int k = 0; k < K; k++)
            for (int m = 0; m < M; m++) ref[m] += kb_round_bf16(ha[(size_t)k * M + m]);
        for (int m = 0; m < M; m++) reff[m] = (float)ref[m];
        fprintf(out,
                "weight grad %d x %d x %d (TN, fp32 +=): plain GEMM %.3f ms; fallback (GEMM + column sum) %.3f ms, "
                "dbias max-rel %.2e vs double; ",
                M, N, K, r[2].ms, r[1].ms, max_rel(r[1].db, reff, (size_t)M));
        if (f == 1)
            fprintf(out, "fused BGRADB: none (%s)\n", core_last_error());
        else
            fprintf(out, "fused BGRADB %.3f ms, dbias max-rel %.2e vs double, dW max-rel fused vs plain %.2e\n",
                    r[0].ms, max_rel(r[0].db, reff, (size_t)M), max_rel(r[0].dw, r[2].dw, nc));
        fprintf(out, "  dW of the fallback %s the plain GEMM's\n", memcmp(r[1].dw, r[2].dw, nc * 4) ? "DIFFERS from"
                                                                                                  : "equals");
        free(ref), free(reff);
    next:
        free(ha), free(hb), free(dw0), free(db0);
        for (int i = 0; i < 3; i++) free(r[i].dw), free(r[i].db);
        k_dev_free(dy), k_dev_free(x), k_dev_free(dw), k_dev_free(db);
    }
    k_gemm_set_bgrad_mode(K_GEMM_BGRAD_AUTO);
    return rc;
}
