/* kernels/cuda/gemm_plan.c — the column-major view of a GEMM, its host model, and batch-invariant algorithm plans;
 * see gemm_plan.h. No CUDA or cuBLASLt header: compiled by the plain build as well (Makefile) for make test. */
#include "kernels/cuda/gemm_plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/body/kb_act.h"

/* ---- 1. column-major view ---- */

void kc_gemm_lt_view(const k_gemm_args *g, kc_lt_view *v) {
    memset(v, 0, sizeof *v);
    v->m = g->N, v->n = g->M, v->k = g->K;
    /* our B is op(B) [K, N] row-major: stored [N, K] (transB) or [K, N] with row stride ldb; read column-major that
     * storage is K x N (transB: cuBLASLt transposes it back to N x K) or N x K (no transpose). */
    v->a = (kc_lt_mat){g->transB ? g->K : g->N, g->transB ? g->N : g->K, g->ldb, !!g->transB};
    /* our A: op(A) [M, K], stored [K, M] (transA) or [M, K]: column-major M x K (transA: op T) or K x M */
    v->b = (kc_lt_mat){g->transA ? g->M : g->K, g->transA ? g->K : g->M, g->lda, !!g->transA};
    v->c = (kc_lt_mat){g->N, g->M, g->ldc, 0};
    const int aux = g->epi == K_EPI_GELU_AUX || g->epi == K_EPI_GELU_AUX_BIAS || g->epi == K_EPI_DGELU ||
                    g->epi == K_EPI_DGELU_BGRAD;
    v->ldaux = aux ? g->ldaux : 0;
}

/* op(X)[i, l] of a column-major matrix */
static float at(const float *p, const kc_lt_mat *x, int i, int l) {
    return x->op ? p[(size_t)l + (size_t)i * x->ld] : p[(size_t)i + (size_t)l * x->ld];
}

static int layout_ok(const kc_lt_mat *x, const char *what) {
    if (x->ld < x->rows)
        return core_error("cuBLASLt view: %s is %d x %d column-major with ld %d < rows", what, x->rows, x->cols, x->ld);
    return 0;
}

int kc_gemm_lt_model(const kc_lt_view *v, int epi, float alpha, float beta, const float *A, const float *B, float *C,
                     const float *bias, float *aux, float *dbias) {
    if (layout_ok(&v->a, "a (our B)") || layout_ok(&v->b, "b (our A)") || layout_ok(&v->c, "c (our C)")) return -1;
    const int opa_rows = v->a.op ? v->a.cols : v->a.rows, opb_cols = v->b.op ? v->b.rows : v->b.cols;
    if (opa_rows != v->m || opb_cols != v->n)
        return core_error("cuBLASLt view: op(a) has %d rows for m %d, op(b) %d columns for n %d", opa_rows, v->m,
                          opb_cols, v->n);
    const int has_bias = epi == K_EPI_BIAS || epi == K_EPI_GELU_AUX_BIAS;
    for (int j = 0; j < v->n; j++)
        for (int i = 0; i < v->m; i++) {
            float acc = 0.0f;
            if (alpha != 0.0f)
                for (int l = 0; l < v->k; l++) acc = fmaf(at(B, &v->a, i, l), at(A, &v->b, l, j), acc);
            float x = acc;
            if (alpha != 1.0f) x = alpha * x;
            float *d = &C[(size_t)i + (size_t)j * v->c.ld];
            if (beta != 0.0f) x = x + (beta == 1.0f ? *d : beta * *d);
            if (has_bias) x = x + bias[i];
            float *ax = aux ? &aux[(size_t)i + (size_t)j * v->ldaux] : NULL;
            if (epi == K_EPI_GELU_AUX || epi == K_EPI_GELU_AUX_BIAS) *ax = x, x = kb_gelu_fwd(x);
            if (epi == K_EPI_DGELU || epi == K_EPI_DGELU_BGRAD) x = kb_gelu_bwd(x, *ax);
            *d = x;
        }
    if (epi == K_EPI_DGELU_BGRAD) /* per row of D: sum over its columns */
        for (int i = 0; i < v->m; i++) {
            double s = 0;
            for (int j = 0; j < v->n; j++) s += C[(size_t)i + (size_t)j * v->c.ld];
            dbias[i] += (float)s;
        }
    if (epi == K_EPI_BGRAD_A) /* BGRADB: per column of D, the sum of op(b) over k */
        for (int j = 0; j < v->n; j++) {
            double s = 0;
            for (int l = 0; l < v->k; l++) s += at(A, &v->b, l, j);
            dbias[j] += (float)s;
        }
    return 0;
}

/* ---- 2. batch-invariant plans ---- */

void kc_gemm_class_of(const k_gemm_args *g, int epi, size_t workspace_limit, int deterministic, kc_gemm_class *cls) {
    memset(cls, 0, sizeof *cls);
    cls->transA = !!g->transA, cls->transB = !!g->transB, cls->N = g->N, cls->K = g->K;
    cls->lda = g->lda, cls->ldb = g->ldb, cls->ldc = g->ldc, cls->c_f32 = g->C.t == KB_F32, cls->epi = epi;
    cls->ldaux = (epi >= K_EPI_GELU_AUX && epi <= K_EPI_DGELU_BGRAD) ? g->ldaux : 0;
    cls->deterministic = !!deterministic, cls->workspace_limit = workspace_limit;
}

int kc_gemm_canonical_m(const kc_gemm_class *cls) {
    return cls->transA ? cls->lda : KC_GEMM_CANONICAL_M;
}

int kc_gemm_pick(const kc_gemm_class *cls, const kc_gemm_cand *c, int n, int *skip_ws, int *skip_splitk) {
    int sw = 0, ss = 0, found = -1;
    for (int i = 0; i < n && found < 0; i++) {
        if (!c[i].ok) continue;
        if (c[i].workspace > cls->workspace_limit) {
            sw++;
            continue;
        }
        if (cls->deterministic && (c[i].splitk > 1 || c[i].reduction != 0)) {
            ss++;
            continue;
        }
        found = i;
    }
    if (skip_ws) *skip_ws = sw;
    if (skip_splitk) *skip_splitk = ss;
    return found;
}

static const char *epi_name(int e) {
    static const char *const names[] = {"none", "bias", "gelu_aux", "gelu_aux_bias", "dgelu", "dgelu_bgrad",
                                        "bgrad_a"};
    return e >= 0 && e <= K_EPI_BGRAD_A ? names[e] : "?";
}

void kc_gemm_class_str(const kc_gemm_class *c, char *buf, size_t cap) {
    snprintf(buf, cap, "%c%c N %d K %d lda %d ldb %d ldc %d %s output, epilogue %s%s, workspace %zu MiB%s",
             c->transA ? 'T' : 'N', c->transB ? 'T' : 'N', c->N, c->K, c->lda, c->ldb, c->ldc,
             c->c_f32 ? "fp32" : "bf16", epi_name(c->epi), c->ldaux ? " (aux ld set)" : "", c->workspace_limit >> 20,
             c->deterministic ? ", deterministic" : "");
}

#define HEURISTIC_CAP 16

kc_gemm_plan *kc_gemm_plan_get(kc_gemm_plans *P, const kc_gemm_class *cls, const kc_gemm_backend *b) {
    for (int i = 0; i < P->n; i++)
        if (memcmp(&P->v[i].cls, cls, sizeof *cls) == 0) return &P->v[i];
    kc_gemm_plan p;
    memset(&p, 0, sizeof p);
    p.cls = *cls;
    p.canonical_m = kc_gemm_canonical_m(cls);
    kc_gemm_cand c[HEURISTIC_CAP];
    int n = 0;
    memset(c, 0, sizeof c);
    char cs[200];
    kc_gemm_class_str(cls, cs, sizeof cs);
    if (b->heuristic(b->ctx, cls, p.canonical_m, c, HEURISTIC_CAP, &n)) {
        core_error_push("GEMM %s at canonical M %d: ", cs, p.canonical_m);
        return NULL;
    }
    int skip_ws = 0, skip_sk = 0, k = kc_gemm_pick(cls, c, n, &skip_ws, &skip_sk);
    if (k < 0) {
        p.none = 1;
        snprintf(p.why, sizeof p.why, "%d candidates at M %d, %d needing more than %zu bytes of workspace, %d with "
                 "split-K or a reduction scheme", n, p.canonical_m, skip_ws, cls->workspace_limit, skip_sk);
    } else {
        p.algo = c[k];
    }
    if (P->n == P->cap) {
        int cap = P->cap ? 2 * P->cap : 32;
        kc_gemm_plan *v = realloc(P->v, (size_t)cap * sizeof *v);
        if (!v) {
            core_error("GEMM: out of memory for the plan cache");
            return NULL;
        }
        P->v = v, P->cap = cap;
    }
    P->v[P->n] = p;
    return &P->v[P->n++];
}

int kc_gemm_plan_validate(kc_gemm_plan *p, int M, const kc_gemm_backend *b, size_t *workspace) {
    char cs[200];
    if (p->none) {
        kc_gemm_class_str(&p->cls, cs, sizeof cs);
        return core_error("GEMM %s: cuBLASLt offers no algorithm (%s)", cs, p->why);
    }
    for (int i = 0; i < p->nvalidated && i < KC_GEMM_PLAN_VALIDATED; i++)
        if (p->validated[i] == M) {
            if (workspace) *workspace = p->validated_ws[i];
            return 0;
        }
    size_t ws = 0;
    kc_gemm_class_str(&p->cls, cs, sizeof cs);
    if (b->check(b->ctx, &p->cls, M, &p->algo, &ws))
        return core_error_push("GEMM %s: the algorithm chosen at canonical M %d (id %d tile %d stages %d) does not "
                               "run at M %d, and another algorithm would break batch invariance: ",
                               cs, p->canonical_m, p->algo.algo_id, p->algo.tile_id, p->algo.stages, M);
    if (ws > p->cls.workspace_limit)
        return core_error(
            "GEMM %s: the algorithm chosen at canonical M %d (id %d) needs %zu bytes of workspace at M %d, "
            "more than the %zu allocated",
            cs, p->canonical_m, p->algo.algo_id, ws, M, p->cls.workspace_limit);
    const int slot = p->nvalidated % KC_GEMM_PLAN_VALIDATED;
    p->validated[slot] = M, p->validated_ws[slot] = ws;
    p->nvalidated++;
    if (workspace) *workspace = ws;
    return 0;
}

kc_gemm_plan *kc_gemm_route(kc_gemm_plans *P, const kc_gemm_class *req, int bgrad_mode, const kc_gemm_backend *b,
                            int *fallback) {
    kc_gemm_class run = *req;
    *fallback = run.epi == K_EPI_BGRAD_A && bgrad_mode == K_GEMM_BGRAD_FALLBACK;
    if (*fallback) run.epi = K_EPI_NONE;
    kc_gemm_plan *p = kc_gemm_plan_get(P, &run, b);
    if (p && p->none && run.epi == K_EPI_BGRAD_A && bgrad_mode == K_GEMM_BGRAD_AUTO) {
        *fallback = 1, run.epi = K_EPI_NONE;
        p = kc_gemm_plan_get(P, &run, b);
    }
    if (p && p->none) {
        char cs[200];
        kc_gemm_class_str(&run, cs, sizeof cs);
        core_error("GEMM %s: cuBLASLt offers no algorithm (%s)%s", cs, p->why,
                   run.epi == K_EPI_BGRAD_A ? "; VGRPO_GEMM_BGRAD=auto or fallback computes the bias gradient with "
                                              "a column-sum kernel instead" : "");
        return NULL;
    }
    return p;
}

void kc_gemm_plans_free(kc_gemm_plans *P) {
    free(P->v);
    memset(P, 0, sizeof *P);
}
