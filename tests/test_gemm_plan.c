/* tests/test_gemm_plan.c — the host side of the cuBLASLt GEMM (kernels/cuda/gemm_plan.h) and the bias-gradient
 * fallback's body (kernels/body/kb_colsum.h), on the CPU:
 * - gemm_plan_layout_model: the column-major view gemm_lt.c gives cuBLASLt, run through a host model that reads our
 *   row-major buffers exactly as cuBLASLt's layouts say, equals the row-major reference GEMM (k_cpu_ops.gemm) bit for
 *   bit for every transpose pair and epilogue, with padded leading dimensions; a view whose ld of our A ignores the
 *   padding does not (so the comparison can fail).
 * - gemm_plan_batch_invariant*: with a fake heuristic that prefers another tile for another M (as the real one may),
 *   M = 1 x, 2 x and 8 x tokens and M = 1 get the one algorithm chosen at the canonical M, whatever the call order;
 *   the heuristic is asked once; a per-M check that fails is an error naming M, never another algorithm.
 * - gemm_plan_pick_*: candidates needing more workspace than allocated, with split-K or with a reduction scheme are
 *   skipped; a class with none left is cached as "none" with the reason.
 * - gemm_plan_cache_key: epilogue, workspace limit, determinism, output dtype and aux ld each make another plan.
 * - gemm_plan_bgrad_route: the bias gradient's AUTO / FUSED / FALLBACK routing with and without a BGRADB kernel.
 * - gemm_plan_colsum_*: the fixed-order column sum against a long-double reference and the emulated device's sum.
 * - gemm_plan_real_cublaslt: `vgrpo gemm-plan` against the real cuBLASLt (make test's CUDA smoke subset runs it on
 *   the `make cuda` binary; skipped, saying so, on the plain build). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/body/kb_act.h"
#include "kernels/body/kb_colsum.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/kernels.h"
#include "tests/test.h"

/* ---- layout model ---- */

static const k_epilogue all_epis[] = {K_EPI_NONE,  K_EPI_BIAS,        K_EPI_GELU_AUX, K_EPI_GELU_AUX_BIAS,
                                      K_EPI_DGELU, K_EPI_DGELU_BGRAD, K_EPI_BGRAD_A};

/* The row-major reference: k_cpu_ops.gemm, then the epilogue in k_cuda.h's row-major words. */
static void reference(const k_gemm_args *g, const float *A, const float *B, float *C, const float *bias, float *aux,
                      float *dbias) {
    const int has_bias = g->epi == K_EPI_BIAS || g->epi == K_EPI_GELU_AUX_BIAS;
    k_cpu_ops.gemm(g->transA, g->transB, g->M, g->N, g->K, g->alpha, A, g->lda, B, g->ldb, g->beta, C, g->ldc,
                   has_bias ? bias : NULL);
    for (int m = 0; m < g->M; m++)
        for (int n = 0; n < g->N; n++) {
            float *c = &C[(size_t)m * g->ldc + n];
            if (g->epi == K_EPI_GELU_AUX || g->epi == K_EPI_GELU_AUX_BIAS)
                aux[(size_t)m * g->ldaux + n] = *c, *c = kb_gelu_fwd(*c);
            if (g->epi == K_EPI_DGELU || g->epi == K_EPI_DGELU_BGRAD)
                *c = kb_gelu_bwd(*c, aux[(size_t)m * g->ldaux + n]);
        }
    if (g->epi == K_EPI_DGELU_BGRAD)
        for (int n = 0; n < g->N; n++) {
            double s = 0;
            for (int m = 0; m < g->M; m++) s += C[(size_t)m * g->ldc + n];
            dbias[n] += (float)s;
        }
    if (g->epi == K_EPI_BGRAD_A)
        for (int m = 0; m < g->M; m++) {
            double s = 0;
            for (int k = 0; k < g->K; k++)
                s += g->transA ? A[(size_t)k * g->lda + m] : A[(size_t)m * g->lda + k];
            dbias[m] += (float)s;
        }
}

typedef struct {
    float *A, *B, *C, *bias, *aux, *dbias;
    size_t na, nb, nc, naux, nbias;
} bufs;

static void bufs_make(bufs *b, const k_gemm_args *g, unsigned long long seed) {
    b->na = (size_t)(g->transA ? g->K : g->M) * g->lda, b->nb = (size_t)(g->transB ? g->N : g->K) * g->ldb;
    b->nc = (size_t)g->M * g->ldc, b->naux = (size_t)g->M * g->ldaux, b->nbias = (size_t)(g->M > g->N ? g->M : g->N);
    b->A = malloc(b->na * 4), b->B = malloc(b->nb * 4), b->C = malloc(b->nc * 4);
    b->aux = malloc((b->naux ? b->naux : 1) * 4), b->bias = malloc(b->nbias * 4), b->dbias = malloc(b->nbias * 4);
    test_fill_uniform(b->A, b->na, seed, -1, 1);
    test_fill_uniform(b->B, b->nb, seed + 1, -1, 1);
    test_fill_uniform(b->C, b->nc, seed + 2, -1, 1);
    test_fill_uniform(b->aux, b->naux ? b->naux : 1, seed + 3, -2, 2);
    test_fill_uniform(b->bias, b->nbias, seed + 4, -1, 1);
    test_fill_uniform(b->dbias, b->nbias, seed + 5, -1, 1);
}
static void bufs_copy(bufs *d, const bufs *s) {
    *d = *s;
    d->C = malloc(s->nc * 4), d->aux = malloc((s->naux ? s->naux : 1) * 4), d->dbias = malloc(s->nbias * 4);
    memcpy(d->C, s->C, s->nc * 4), memcpy(d->aux, s->aux, (s->naux ? s->naux : 1) * 4);
    memcpy(d->dbias, s->dbias, s->nbias * 4);
}
static void bufs_free_out(bufs *b) { free(b->C), free(b->aux), free(b->dbias); }
static void bufs_free(bufs *b) { bufs_free_out(b), free(b->A), free(b->B), free(b->bias); }

/* Model vs reference for g; returns the number of differing bits-patterns (C, aux, dbias). */
static size_t model_vs_reference(const k_gemm_args *g, const kc_lt_view *v, const bufs *in) {
    bufs r, m;
    bufs_copy(&r, in), bufs_copy(&m, in);
    reference(g, in->A, in->B, r.C, in->bias, r.aux, r.dbias);
    size_t differ = 0;
    if (kc_gemm_lt_model(v, g->epi, g->alpha, g->beta, in->A, in->B, m.C, in->bias, m.aux, m.dbias))
        differ = (size_t)-1;
    else {
        for (size_t i = 0; i < in->nc; i++) differ += memcmp(&r.C[i], &m.C[i], 4) != 0;
        for (size_t i = 0; i < in->naux; i++) differ += memcmp(&r.aux[i], &m.aux[i], 4) != 0;
        for (size_t i = 0; i < in->nbias; i++) differ += memcmp(&r.dbias[i], &m.dbias[i], 4) != 0;
    }
    bufs_free_out(&r), bufs_free_out(&m);
    return differ;
}

TEST(gemm_plan_layout_model) {
    /* non-square, every leading dimension padded past its row, so a swapped dimension or ld shows */
    const int M = 13, N = 24, K = 19;
    int combos = 0;
    for (int tA = 0; tA < 2; tA++)
        for (int tB = 0; tB < 2; tB++)
            for (size_t e = 0; e < sizeof all_epis / sizeof all_epis[0]; e++) {
                k_gemm_args g;
                memset(&g, 0, sizeof g);
                g.transA = tA, g.transB = tB, g.M = M, g.N = N, g.K = K, g.epi = all_epis[e];
                g.lda = (tA ? M : K) + 3, g.ldb = (tB ? K : N) + 5, g.ldc = N + 2, g.C.t = KB_F32;
                const int gelu = g.epi >= K_EPI_GELU_AUX && g.epi <= K_EPI_DGELU_BGRAD;
                g.ldaux = gelu ? N + 4 : 0;
                g.alpha = gelu ? 1.0f : 0.75f, g.beta = gelu ? 0.0f : (e % 2 ? 1.0f : 0.5f);
                bufs in;
                bufs_make(&in, &g, 100 + 10 * (unsigned long long)combos);
                kc_lt_view v;
                kc_gemm_lt_view(&g, &v);
                CHECK(v.m == N && v.n == M && v.k == K);
                const size_t d = model_vs_reference(&g, &v, &in);
                CHECK_MSG(d == 0,
                          "transA %d transB %d epilogue %d: %zu values differ from the row-major reference (%s)", tA,
                          tB, (int)g.epi, d, d == (size_t)-1 ? core_last_error() : "");
                /* the comparison can fail: cuBLASLt told our A's ld without its padding (reads stay in bounds) */
                kc_lt_view w = v;
                w.b.ld = w.b.rows;
                const size_t dw = model_vs_reference(&g, &w, &in);
                CHECK_MSG(dw != 0, "transA %d transB %d epilogue %d: a wrong ld of b went unnoticed", tA, tB,
                          (int)g.epi);
                bufs_free(&in);
                combos++;
            }
    CHECK(combos == 28);
    /* an impossible layout is refused by name */
    k_gemm_args g = {.transA = 0, .transB = 1, .M = 4, .N = 8, .K = 8, .lda = 8, .ldb = 4, .ldc = 8, .alpha = 1};
    kc_lt_view v;
    kc_gemm_lt_view(&g, &v);
    float z[64] = {0};
    CHECK(kc_gemm_lt_model(&v, K_EPI_NONE, 1, 0, z, z, z, NULL, NULL, NULL) == -1);
    CHECK_MSG(strstr(core_last_error(), "a (our B) is 8 x 8 column-major with ld 4 < rows"), "%s", core_last_error());
}

/* The DiT's GEMMs at the Wan shapes' mapping, named: what cuBLASLt is told for each (model/dit/wan_layers.c). */
TEST(gemm_plan_view_dit) {
    kc_lt_view v;
    /* forward linear y[S, N] = x[S, K] w[N, K]^T + b: cuBLASLt a = w (K x N col-major, op T), b = x (K x S) */
    k_gemm_args f = {.transA = 0, .transB = 1, .M = 1560, .N = 8960, .K = 1536, .lda = 1536, .ldb = 1536, .ldc = 8960,
                     .epi = K_EPI_BIAS};
    kc_gemm_lt_view(&f, &v);
    CHECK(v.m == 8960 && v.n == 1560 && v.k == 1536);
    CHECK(v.a.rows == 1536 && v.a.cols == 8960 && v.a.ld == 1536 && v.a.op == 1);
    CHECK(v.b.rows == 1536 && v.b.cols == 1560 && v.b.ld == 1536 && v.b.op == 0);
    CHECK(v.c.rows == 8960 && v.c.cols == 1560 && v.c.ld == 8960);
    /* weight gradient dw[N, K] = dy[S, N]^T x[S, K]: a = x (K x S, op N), b = dy (N x S, op T): BGRADB sums dy's
     * columns over S (cuBLASLt's k) */
    k_gemm_args w = {.transA = 1, .transB = 0, .M = 1536, .N = 8960, .K = 1560, .lda = 1536, .ldb = 8960, .ldc = 8960,
                     .epi = K_EPI_BGRAD_A};
    kc_gemm_lt_view(&w, &v);
    CHECK(v.m == 8960 && v.n == 1536 && v.k == 1560);
    CHECK(v.a.rows == 8960 && v.a.cols == 1560 && v.a.op == 0);
    CHECK(v.b.rows == 1536 && v.b.cols == 1560 && v.b.ld == 1536 && v.b.op == 1);
}

/* ---- plans with a fake heuristic ---- */

typedef struct {
    int heuristic_calls, last_heuristic_m, check_calls, fail_check_m;
    size_t check_ws;
    kc_gemm_cand extra[4];
    int nextra; /* when set: returned instead of the M-dependent list */
    int no_bgrad; /* no candidate for K_EPI_BGRAD_A classes (as cuBLASLt may have no BGRADB kernel) */
} fake;

/* Like a real heuristic: the best tile depends on M (small M: a narrow tile), so choosing per M would give the
 * rollout (one sample) and the trainer (several) different kernels. */
static int fake_algo_for(int M) { return M < 64 ? 11 : M < 2048 ? 22 : 33; }

static int fake_heuristic(void *ctx, const kc_gemm_class *cls, int M, kc_gemm_cand *out, int cap, int *n) {
    fake *f = ctx;
    f->heuristic_calls++, f->last_heuristic_m = M;
    if (f->no_bgrad && cls->epi == K_EPI_BGRAD_A) {
        *n = 0;
        return 0;
    }
    if (f->nextra) {
        for (int i = 0; i < f->nextra && i < cap; i++) out[i] = f->extra[i];
        *n = f->nextra;
        return 0;
    }
    memset(out, 0, 2 * sizeof *out);
    out[0].ok = 1, out[0].algo_id = fake_algo_for(M), out[0].tile_id = fake_algo_for(M) + 100, out[0].splitk = 1;
    out[0].algo[0] = (uint64_t)fake_algo_for(M);
    out[1].ok = 1, out[1].algo_id = 44, out[1].splitk = 1;
    *n = cap < 2 ? cap : 2;
    return 0;
}

static int fake_check(void *ctx, const kc_gemm_class *cls, int M, const kc_gemm_cand *c, size_t *ws) {
    fake *f = ctx;
    f->check_calls++;
    if (M == f->fail_check_m) return core_error("cublasLtMatmulAlgoCheck: CUBLAS_STATUS_NOT_SUPPORTED (fake)");
    *ws = f->check_ws;
    return 0;
}

static k_gemm_args fwd_args(int M) {
    k_gemm_args g = {.transA = 0, .transB = 1, .M = M, .N = 1536, .K = 1536, .lda = 1536, .ldb = 1536, .ldc = 1536,
                     .epi = K_EPI_BIAS};
    g.C.t = KB_BF16;
    return g;
}

/* The algorithm used at each M of ms (in that order) with a fresh plan cache. */
static void plan_ids(const int *ms, int n, int *ids, fake *f) {
    kc_gemm_plans P = {0};
    kc_gemm_backend b = {fake_heuristic, fake_check, f};
    for (int i = 0; i < n; i++) {
        k_gemm_args g = fwd_args(ms[i]);
        kc_gemm_class c;
        kc_gemm_class_of(&g, g.epi, (size_t)32 << 20, 1, &c);
        kc_gemm_plan *p = kc_gemm_plan_get(&P, &c, &b);
        REQUIRE(p && !p->none);
        REQUIRE_OK(kc_gemm_plan_validate(p, ms[i], &b, NULL));
        ids[i] = p->algo.algo_id;
    }
    CHECK(P.n == 1);
    kc_gemm_plans_free(&P);
}

TEST(gemm_plan_batch_invariant) {
    const int S = 1560; /* tokens of one sample */
    const int ms[4] = {S, 2 * S, 8 * S, 1};
    /* what choosing per M (today's gemm_lt.c before this change) would have run: not one kernel */
    CHECK(fake_algo_for(ms[0]) != fake_algo_for(ms[1]) && fake_algo_for(ms[3]) != fake_algo_for(ms[2]));
    fake f = {0};
    int ids[4];
    plan_ids(ms, 4, ids, &f);
    CHECK_MSG(ids[0] == 33 && ids[1] == 33 && ids[2] == 33 && ids[3] == 33, "algorithms %d %d %d %d", ids[0], ids[1],
              ids[2], ids[3]);
    CHECK(f.heuristic_calls == 1 && f.last_heuristic_m == KC_GEMM_CANONICAL_M);
    CHECK(f.check_calls == 4); /* each M checked once */
    /* another call order, same algorithm (the canonical M is the class's, not the first call's) */
    const int rev[4] = {1, 8 * S, S, 2 * S};
    fake g = {0};
    int ids2[4];
    plan_ids(rev, 4, ids2, &g);
    CHECK(ids2[0] == 33 && ids2[1] == 33 && ids2[2] == 33 && ids2[3] == 33);
    CHECK(g.last_heuristic_m == KC_GEMM_CANONICAL_M);
}

TEST(gemm_plan_batch_invariant_checks) {
    fake f = {.fail_check_m = 1};
    kc_gemm_plans P = {0};
    kc_gemm_backend b = {fake_heuristic, fake_check, &f};
    k_gemm_args g = fwd_args(1);
    kc_gemm_class c;
    kc_gemm_class_of(&g, g.epi, (size_t)32 << 20, 1, &c);
    kc_gemm_plan *p = kc_gemm_plan_get(&P, &c, &b);
    REQUIRE(p);
    size_t ws = 7;
    CHECK(kc_gemm_plan_validate(p, 1560, &b, &ws) == 0 && ws == 0);
    CHECK(kc_gemm_plan_validate(p, 1560, &b, &ws) == 0 && f.check_calls == 1); /* memoized */
    /* the canonical algorithm does not run at M 1: an error naming it, and no other algorithm asked for */
    CHECK(kc_gemm_plan_validate(p, 1, &b, &ws) == -1);
    const char *e = core_last_error();
    CHECK_MSG(strstr(e, "chosen at canonical M 4096 (id 33") && strstr(e, "does not run at M 1") &&
                  strstr(e, "batch invariance") && strstr(e, "NOT_SUPPORTED (fake)") && strstr(e, "NT N 1536 K 1536"),
              "%s", e);
    CHECK(f.heuristic_calls == 1 && p->algo.algo_id == 33);
    /* more workspace at some M than allocated: an error too */
    f.fail_check_m = -1, f.check_ws = (size_t)64 << 20;
    CHECK(kc_gemm_plan_validate(p, 2, &b, &ws) == -1);
    CHECK_MSG(strstr(core_last_error(), "needs 67108864 bytes of workspace at M 2"), "%s", core_last_error());
    kc_gemm_plans_free(&P);
}

TEST(gemm_plan_canonical_m) {
    k_gemm_args g = fwd_args(3);
    kc_gemm_class c;
    kc_gemm_class_of(&g, g.epi, 1 << 20, 1, &c);
    CHECK(kc_gemm_canonical_m(&c) == 4096);
    g.M = 100000;
    kc_gemm_class c2;
    kc_gemm_class_of(&g, g.epi, 1 << 20, 1, &c2);
    CHECK(memcmp(&c, &c2, sizeof c) == 0); /* M is not in the class */
    /* the weight gradient: op(A) = dy^T stored [tokens, out] with lda = out bounds M */
    k_gemm_args w = {.transA = 1, .transB = 0, .M = 1536, .N = 1536, .K = 1560, .lda = 1536, .ldb = 1536, .ldc = 1536};
    kc_gemm_class_of(&w, K_EPI_BGRAD_A, 1 << 20, 1, &c);
    CHECK(kc_gemm_canonical_m(&c) == 1536);
    w.lda = w.M = 8960; /* the FFN up's dW: heuristic at its real M */
    kc_gemm_class_of(&w, K_EPI_BGRAD_A, 1 << 20, 1, &c);
    CHECK(kc_gemm_canonical_m(&c) == 8960);
}

static kc_gemm_cand cand(int id, size_t ws, int splitk, int reduction) {
    kc_gemm_cand c;
    memset(&c, 0, sizeof c);
    c.ok = 1, c.algo_id = id, c.workspace = ws, c.splitk = splitk, c.reduction = reduction;
    return c;
}

TEST(gemm_plan_pick_workspace_splitk) {
    const kc_gemm_cand c[5] = {cand(1, (size_t)64 << 20, 1, 0), cand(2, 0, 4, 1), cand(3, 0, 2, 2),
                               cand(4, 1 << 20, 1, 0), cand(5, 0, 1, 0)};
    k_gemm_args g = fwd_args(8);
    kc_gemm_class cls;
    kc_gemm_class_of(&g, g.epi, (size_t)32 << 20, 1, &cls);
    int sw = -1, ss = -1;
    CHECK(kc_gemm_pick(&cls, c, 5, &sw, &ss) == 3 && sw == 1 && ss == 2);
    kc_gemm_cand bad = c[3];
    bad.ok = 0;
    const kc_gemm_cand c2[2] = {bad, c[4]};
    CHECK(kc_gemm_pick(&cls, c2, 2, NULL, NULL) == 1); /* a failed state is skipped */
    kc_gemm_class_of(&g, g.epi, (size_t)128 << 20, 1, &cls);
    CHECK(kc_gemm_pick(&cls, c, 5, NULL, NULL) == 0); /* enough workspace for the first */
    kc_gemm_class_of(&g, g.epi, (size_t)32 << 20, 0, &cls);
    CHECK(kc_gemm_pick(&cls, c, 5, NULL, NULL) == 1); /* not deterministic: split-K allowed */
}

TEST(gemm_plan_pick_none_cached) {
    fake f = {.nextra = 2};
    f.extra[0] = cand(1, (size_t)64 << 20, 1, 0), f.extra[1] = cand(2, 0, 4, 1);
    kc_gemm_plans P = {0};
    kc_gemm_backend b = {fake_heuristic, fake_check, &f};
    k_gemm_args w = {.transA = 1, .transB = 0, .M = 1536, .N = 1536, .K = 1560, .lda = 1536, .ldb = 1536, .ldc = 1536};
    w.C.t = KB_F32;
    kc_gemm_class c;
    kc_gemm_class_of(&w, K_EPI_BGRAD_A, (size_t)32 << 20, 1, &c);
    kc_gemm_plan *p = kc_gemm_plan_get(&P, &c, &b);
    REQUIRE(p);
    CHECK(p->none == 1);
    CHECK_MSG(strstr(p->why, "2 candidates at M 1536, 1 needing more than 33554432 bytes of workspace, 1 with split-K"),
              "%s", p->why);
    CHECK(kc_gemm_plan_validate(p, 1536, &b, NULL) == -1);
    CHECK_MSG(strstr(core_last_error(), "TN N 1536 K 1560") && strstr(core_last_error(), "epilogue bgrad_a") &&
                  strstr(core_last_error(), "offers no algorithm"),
              "%s", core_last_error());
    CHECK(kc_gemm_plan_get(&P, &c, &b) == p && f.heuristic_calls == 1); /* not asked again */
    kc_gemm_plans_free(&P);
}

TEST(gemm_plan_cache_key) {
    fake f = {0};
    kc_gemm_plans P = {0};
    kc_gemm_backend b = {fake_heuristic, fake_check, &f};
    k_gemm_args g = fwd_args(8);
    kc_gemm_class c[6];
    kc_gemm_class_of(&g, K_EPI_BIAS, (size_t)32 << 20, 1, &c[0]);
    kc_gemm_class_of(&g, K_EPI_NONE, (size_t)32 << 20, 1, &c[1]);    /* epilogue */
    kc_gemm_class_of(&g, K_EPI_BIAS, (size_t)16 << 20, 1, &c[2]);    /* workspace limit */
    kc_gemm_class_of(&g, K_EPI_BIAS, (size_t)32 << 20, 0, &c[3]);    /* determinism */
    g.C.t = KB_F32;
    kc_gemm_class_of(&g, K_EPI_BIAS, (size_t)32 << 20, 1, &c[4]);    /* output dtype */
    g.C.t = KB_BF16, g.ldaux = 1536;
    kc_gemm_class_of(&g, K_EPI_GELU_AUX_BIAS, (size_t)32 << 20, 1, &c[5]);
    for (int i = 0; i < 6; i++) REQUIRE(kc_gemm_plan_get(&P, &c[i], &b));
    CHECK(P.n == 6 && f.heuristic_calls == 6);
    g.ldaux = 2048; /* aux ld */
    kc_gemm_class a;
    kc_gemm_class_of(&g, K_EPI_GELU_AUX_BIAS, (size_t)32 << 20, 1, &a);
    REQUIRE(kc_gemm_plan_get(&P, &a, &b));
    CHECK(P.n == 7);
    g.M = 99999; /* M is not */
    g.ldaux = 0, g.C.t = KB_BF16;
    kc_gemm_class_of(&g, K_EPI_BIAS, (size_t)32 << 20, 1, &a);
    CHECK(kc_gemm_plan_get(&P, &a, &b) == &P.v[0] && P.n == 7);
    kc_gemm_plans_free(&P);
}

/* The bias-gradient routing: AUTO falls back to the plain GEMM + column sum only when cuBLASLt has no BGRADB kernel,
 * FUSED refuses then, FALLBACK always routes there (both paths selectable, so the GPU check can time both). */
TEST(gemm_plan_bgrad_route) {
    k_gemm_args w = {.transA = 1, .transB = 0, .M = 1536, .N = 1536, .K = 1560, .lda = 1536, .ldb = 1536, .ldc = 1536};
    w.C.t = KB_F32;
    kc_gemm_class req;
    kc_gemm_class_of(&w, K_EPI_BGRAD_A, (size_t)32 << 20, 1, &req);
    for (int has_kernel = 0; has_kernel < 2; has_kernel++)
        for (int mode = K_GEMM_BGRAD_AUTO; mode <= K_GEMM_BGRAD_FALLBACK; mode++) {
            fake f = {.no_bgrad = !has_kernel};
            kc_gemm_plans P = {0};
            kc_gemm_backend b = {fake_heuristic, fake_check, &f};
            int fb = -1;
            kc_gemm_plan *p = kc_gemm_route(&P, &req, mode, &b, &fb);
            if (mode == K_GEMM_BGRAD_FUSED && !has_kernel) {
                CHECK(p == NULL);
                CHECK_MSG(strstr(core_last_error(), "epilogue bgrad_a") && strstr(core_last_error(), "offers no "
                          "algorithm (0 candidates") && strstr(core_last_error(), "VGRPO_GEMM_BGRAD=auto or fallback"),
                          "%s", core_last_error());
            } else {
                REQUIRE(p);
                const int want_fb = mode == K_GEMM_BGRAD_FALLBACK || (mode == K_GEMM_BGRAD_AUTO && !has_kernel);
                CHECK_MSG(fb == want_fb, "mode %d kernel %d: fallback %d", mode, has_kernel, fb);
                CHECK(p->cls.epi == (want_fb ? K_EPI_NONE : K_EPI_BGRAD_A));
                CHECK(p->cls.N == 1536 && p->cls.K == 1560 && p->cls.c_f32 == 1);
                /* FALLBACK never asks for a BGRADB kernel */
                CHECK(f.heuristic_calls == (mode == K_GEMM_BGRAD_AUTO && !has_kernel ? 2 : 1));
            }
            kc_gemm_plans_free(&P);
        }
    /* other epilogues are not rerouted */
    fake f = {.no_bgrad = 1};
    kc_gemm_plans P = {0};
    kc_gemm_backend b = {fake_heuristic, fake_check, &f};
    k_gemm_args g = fwd_args(8);
    kc_gemm_class_of(&g, K_EPI_BIAS, (size_t)32 << 20, 1, &req);
    int fb = -1;
    kc_gemm_plan *p = kc_gemm_route(&P, &req, K_GEMM_BGRAD_FALLBACK, &b, &fb);
    CHECK(p && fb == 0 && p->cls.epi == K_EPI_BIAS);
    kc_gemm_plans_free(&P);
}

/* ---- the bias-gradient fallback's column sum ---- */

/* The GPU's decomposition on the host: every (m, chunk) in reverse order (any order gives the same bits), then the
 * finish per m. */
static void colsum_host(float *dbias, kb_in a, int64_t sm, int64_t sk, int M, int K) {
    const int P = kb_colsum_chunks(K);
    double *part = malloc((size_t)P * M * sizeof *part);
    for (int p = P - 1; p >= 0; p--)
        for (int m = M - 1; m >= 0; m--) part[(size_t)p * M + m] = kb_colsum_chunk(a, sm, sk, m, K, p);
    for (int m = 0; m < M; m++) kb_colsum_finish(dbias, part, M, m, P);
    free(part);
}

TEST(gemm_plan_colsum_body) {
    const int Ks[6] = {1, 255, 256, 257, 1000, 20000};
    const int M = 24;
    int cases = 0;
    size_t ulp1 = 0, total = 0;
    for (int ki = 0; ki < 6; ki++)
        for (int trans = 0; trans < 2; trans++)
            for (int bf = 0; bf < 2; bf++) {
                const int K = Ks[ki], ld = trans ? M + 8 : K + 8;
                const size_t n = (size_t)(trans ? K : M) * ld;
                float *x = malloc(n * 4);
                kb_bf16 *h = malloc(n * sizeof *h);
                test_fill_uniform(x, n, 7 + ki, -3, 5); /* a positive mean: sums grow with K */
                for (size_t i = 0; i < n; i++) h[i] = kb_bf16_from_f32(x[i]), x[i] = bf ? kb_f32_from_bf16(h[i]) : x[i];
                const kb_in a = bf ? kb_in_bf16(h) : kb_in_f32(x);
                const int64_t sm = trans ? 1 : ld, sk = trans ? ld : 1;
                float got[24], emu[24];
                for (int m = 0; m < M; m++) got[m] = emu[m] = 0.25f * (float)m;
                colsum_host(got, a, sm, sk, M, K);
                for (int m = 0; m < M; m++) {
                    long double ref = 0;
                    double seq = 0; /* the emulated device's sum (kernels/cuda/emu/emu_ops.c) */
                    for (int k = 0; k < K; k++) {
                        ref += (long double)x[(size_t)m * sm + (size_t)k * sk];
                        seq += x[(size_t)m * sm + (size_t)k * sk];
                    }
                    emu[m] += (float)seq;
                    const float want = 0.25f * (float)m + (float)ref;
                    /* fp32 rounding of the double sums, then one fp32 add: within one ulp of the exact sum's */
                    CHECK_MSG(fabsf(got[m] - want) <= nextafterf(fabsf(want), INFINITY) - fabsf(want),
                              "K %d trans %d bf16 %d m %d: %.9g vs %.9g", K, trans, bf, m, got[m], want);
                    CHECK_MSG(fabsf(got[m] - emu[m]) <= nextafterf(fabsf(emu[m]), INFINITY) - fabsf(emu[m]),
                              "K %d m %d: vs the emulated device %.9g %.9g", K, m, got[m], emu[m]);
                    ulp1 += got[m] != emu[m], total++;
                }
                /* repeat: the same bits */
                float again[24];
                for (int m = 0; m < M; m++) again[m] = 0.25f * (float)m;
                colsum_host(again, a, sm, sk, M, K);
                CHECK(memcmp(again, got, sizeof got) == 0);
                free(x), free(h);
                cases++;
            }
    CHECK(cases == 24);
    printf("  column sum vs the emulated device's one-loop sum: %zu of %zu differ by one ulp, the rest equal\n", ulp1,
           total);
    CHECK(kb_colsum_chunks(256) == 1 && kb_colsum_chunks(257) == 2 && kb_colsum_chunks(1) == 1);
}

/* ---- the real cuBLASLt ---- */

TEST(gemm_plan_real_cublaslt) {
    static char out[16384];
    CHECK(test_run(out, sizeof out, "%s gemm-plan extra 2>&1", test_vgrpo_bin()) == 2);
    CHECK_MSG(strstr(out, "vgrpo gemm-plan: unexpected argument \"extra\""), "%s", out);
    const int rc = test_run(out, sizeof out, "%s gemm-plan 2>&1", test_vgrpo_bin());
    if (rc == 1 && strstr(out, "built without the CUDA backend")) {
        test_skip("the plain build has no cuBLASLt (make test runs this on the make cuda binary: CUDA_SMOKE)");
        return;
    }
    printf("%s", out);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    CHECK_MSG(strstr(out, "cuBLASLt: ") && strstr(out, "(version "), "%s", out);
    CHECK_MSG(strstr(out, "cublasLtCreate: "), "%s", out);
    /* 5 batch classes at 3 Ms, 2 weight-gradient classes at 1 */
    CHECK_MSG(strstr(out, "17 descriptor sets read back, 0 mismatched"), "%s", out);
    int ok = 0;
    for (const char *p = out; (p = strstr(p, ": every attribute read back as meant")); p++) ok++;
    CHECK(ok == 17);
    /* --bgrad needs a GPU: without one, k_cuda_init's one-line reason */
    if (strstr(out, "(status 1)")) {
        char o2[4096];
        CHECK(test_run(o2, sizeof o2, "%s gemm-plan --bgrad 2>&1", test_vgrpo_bin()) == 1);
        CHECK_MSG(strstr(o2, "vgrpo gemm-plan --bgrad: CUDA: "), "%s", o2);
    }
    if (strstr(out, "(status 1)")) { /* no driver: CUBLAS_STATUS_NOT_INITIALIZED, and so for every handle call */
        CHECK_MSG(strstr(out, "0 plans checked on a GPU (none: no GPU)"), "%s", out);
        CHECK_MSG(strstr(out, "without a handle: cublasLtMatmulAlgoGetHeuristic status 1, cublasLtMatmulAlgoCheck "
                              "status 1; cublasLtMatrixLayoutCreate(16 x 4, ld 8) status 0"),
                  "%s", out);
    }
}
