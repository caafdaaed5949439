/* kernels/cpu/attention.c — fp32 scaled dot-product attention on the CPU, blocked (FlashAttention-2 style).
 *
 * Forward (Dao, "FlashAttention-2", 2023, Algorithm 1): one task per (batch, head, query block); the task walks
 * the key blocks with an online softmax (running row max m and row sum l, output rescaled by exp(m_old - m_new)),
 * so no Sq x Skv matrix ever exists.
 * Backward (same paper, Algorithm 2, split into two race-free passes instead of atomics on dQ):
 *   pass 1, one task per (b, h, key block j): for every query block i recompute P = exp(S - lse) and accumulate
 *           dV_j += P^T dO_i and dK_j += scale * dS^T Q_i with dS = P * (dP - D_i), dP = dO_i V_j^T,
 *           D_i = rowsum(dO_i * O_i);
 *   pass 2, one task per (b, h, query block i): dQ_i += scale*dS K_j over every key block j, dS as pass 1 stored it
 *           when the head group's Sq x Skv floats fit k_cpu_attn_ds_budget (then a barrier between the passes), else the
 *           same recomputation (the same values either way).
 *
 * Heads are processed in groups of G (at most the thread count): the group's K/V (and, in the backward, Q, dO,
 * lse, D) are first gathered from their strided [B, S, H, Dh] rows into packed block buffers, in parallel, then
 * the tasks of the group run. Re-gathering strided rows for every (query block, key block) pair cost about 40% of
 * the forward's time; packing once per head makes it negligible. Extra memory: G heads' packed operands
 * (O(S x Dh) each, capped by ATTN_PACK_BUDGET) plus a few blocks per thread, and in the backward the group's dS
 * (Sq x Skv floats a head) when it fits k_cpu_attn_ds_budget.
 *
 * Each task owns the rows it writes and runs its reductions in a fixed order; packing only moves data. So results
 * are bitwise independent of the thread count, of G and of batch mates. The matrix products use the micro-kernels of
 * attn_tile.h (6 x 16; on AVX-512 12 x 32 over pairs of strips, each element the same chain).
 *
 * Limits: exp is a polynomial approximation (about 2 ulp) on AVX2 machines; on allocation failure the outputs are
 * filled with NaN and core_error is set, since the op table's signature is void. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "core/error.h"
#include "kernels/cpu/attn_tile.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/prof.h"

/* Block sizes: BQ query rows and BK keys per block. BQ must be a multiple of ATTN_MR; BK a multiple of both
 * ATTN_MR and ATTN_NR (key rows are micro-tile rows in dK/dV and columns in S). */
#ifndef ATTN_BQ
#define ATTN_BQ 96
#endif
#ifndef ATTN_BK
#define ATTN_BK 96
#endif
#ifndef ATTN_BQ_BWD
#define ATTN_BQ_BWD 96
#endif
/* Upper bound on the packed operands of one head group, in bytes (a group has at least one head). */
#define ATTN_PACK_BUDGET ((size_t)256 << 20)
/* Upper bound on the backward's stored dS of one head group (Sq x Skv floats a head, rounded to blocks), in bytes:
 * k_cpu_attn_ds_budget (kernels/cpu/cpu.h; tests set 0 to take the recomputing path). 64 MiB: a group of two heads
 * up to about 2,900 tokens (the Wan-1.3B bench block's 1,560 use 21 MB); like the packed operands, kernel scratch
 * that the start-up estimate (trainer/budget/budget.c) leaves to its tolerance. */
size_t k_cpu_attn_ds_budget = (size_t)64 << 20;

typedef struct {
    int B, Sq, Skv, H, Dh, Dp;
    ptrdiff_t rs; /* stride between consecutive tokens of one head: H*Dh */
    float scale;
    int nqb, nkb, bq, bk; /* query blocks (of bq rows), key blocks (of bk keys) */
    int vec;              /* 2: AVX-512 tiles, 1: AVX2 (and the AVX2 exp for both), 0: plain C; the same values */
} attn_shape;

/* Block sizes of a call. A short sequence gets blocks just large enough for it (one block), which changes no value:
 * the forward's online softmax sees one key block either way (any bk >= Skv), every other sum runs over rows or
 * keys in the same order whatever the blocks (the fma chains continue through the stored accumulators), and rows are
 * independent. Longer sequences keep ATTN_BQ x ATTN_BK (a multiple of both tile sizes). */
static void attn_blocks(attn_shape *a, int bq_max) {
    /* multiples of 48 (of ATTN_MR and ATTN_NR), so that every packed region stays 64-byte aligned */
    a->bq = a->Sq < bq_max ? attn_round_up(a->Sq, 48) : bq_max;
    a->bk = a->Skv <= ATTN_BK ? attn_round_up(a->Skv, 48) : ATTN_BK;
    if (a->bk > ATTN_BK) a->bk = ATTN_BK;
    if (a->bq > bq_max) a->bq = bq_max;
    a->nqb = (a->Sq + a->bq - 1) / a->bq, a->nkb = (a->Skv + a->bk - 1) / a->bk;
    a->vec = k_cpu_get_path() == K_CPU_PATH_AVX512 ? 2 : k_cpu_get_path() == K_CPU_PATH_AVX2 ? 1 : 0;
}

static int imin(int a, int b) { return a < b ? a : b; }
static size_t r16(size_t n) { return (n + 15) / 16 * 16; }

/* Offset of token s of head h in batch b of a [B, S, H, Dh] tensor. */
static ptrdiff_t tok(const attn_shape *a, int b, int S, int s, int h) {
    return (((ptrdiff_t)b * S + s) * a->H + h) * a->Dh;
}

/* 64-byte aligned and zeroed (zeroed so that micro-tile rows past a tail block's end read finite values). */
static float *falloc(size_t nfloats) {
    size_t bytes = r16(nfloats) * sizeof(float);
    float *p = bytes ? aligned_alloc(64, bytes) : NULL;
    if (p) memset(p, 0, bytes);
    return p;
}

static void fill_nan(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

/* Heads per group: enough for every thread to have its own head when heads are many, within the budget. */
static int group_size(int BH, size_t head_floats) {
    size_t g = ATTN_PACK_BUDGET / (head_floats * sizeof(float) + 1);
    int G = omp_get_max_threads();
    if ((size_t)G > g) G = (int)g;
    if (G > BH) G = BH;
    return G < 1 ? 1 : G;
}

/* ---- forward ---- */

/* Packed K/V of one head: per key block j, Kt at kt + j*BK*Dh (transposed strips) and V at vp + j*BK*Dp. */
static size_t fwd_head_floats(const attn_shape *a) {
    return (size_t)a->nkb * a->bk * ((size_t)a->Dh + a->Dp);
}

static void fwd_pack(float *pk, const float *k, const float *v, const attn_shape *a, int b, int h, int kb) {
    const int k0 = kb * a->bk, nk = imin(a->bk, a->Skv - k0);
    float *kt = pk + (size_t)kb * a->bk * a->Dh, *vp = pk + (size_t)a->nkb * a->bk * a->Dh;
    vp += (size_t)kb * a->bk * a->Dp;
    attn_pack_t(kt, k + tok(a, b, a->Skv, k0, h), a->rs, nk, attn_round_up(nk, ATTN_NR), a->Dh);
    attn_pack_n(vp, v + tok(a, b, a->Skv, k0, h), a->rs, nk, a->Dh, 1.0f);
}

static size_t fwd_ws_floats(const attn_shape *a) {
    return r16((size_t)a->bq * a->Dh) + r16((size_t)a->bq * a->bk) + r16((size_t)a->bq * a->Dp) + 2 * r16(a->bq);
}

/* One forward task: query block qb of head h in batch b, against the head's packed K/V pk. */
static void fwd_block(float *ws, float *o, float *lse, const float *q, const float *pk, const attn_shape *a, int b,
                      int h, int qb) {
    const int Dh = a->Dh, Dp = a->Dp, q0 = qb * a->bq, mq = imin(a->bq, a->Sq - q0);
    const int M = attn_round_up(mq, ATTN_MR);
    float *Qs = ws, *S = Qs + r16((size_t)a->bq * Dh), *O = S + r16((size_t)a->bq * a->bk);
    float *m = O + r16((size_t)a->bq * Dp), *l = m + r16(a->bq);
    const float *kt0 = pk, *vp0 = pk + (size_t)a->nkb * a->bk * Dh;

    attn_gather(Qs, q + tok(a, b, a->Sq, q0, h), a->rs, mq, M, Dh, a->scale);
    memset(O, 0, sizeof(float) * (size_t)M * Dp);
    for (int i = 0; i < M; i++) m[i] = -INFINITY, l[i] = 0.0f;

    for (int kb = 0; kb < a->nkb; kb++) {
        const int nk = imin(a->bk, a->Skv - kb * a->bk), N = attn_round_up(nk, ATTN_NR);
        attn_mm_n(a->vec, M, N, Dh, Qs, Dh, kt0 + (size_t)kb * a->bk * Dh, S, a->bk, 0);
        for (int i = 0; i < M; i++) {
            float *si = S + (ptrdiff_t)i * a->bk;
            for (int j = nk; j < N; j++) si[j] = -INFINITY;
            float mx = attn_row_max(a->vec, si, N), mnew = mx > m[i] ? mx : m[i];
            float alpha = expf(m[i] - mnew); /* 0 on the first block (m = -inf) */
            l[i] = l[i] * alpha + attn_exp_sub(a->vec, si, si, mnew, N);
            m[i] = mnew;
            if (alpha != 1.0f) {
                float *oi = O + (ptrdiff_t)i * Dp;
                for (int e = 0; e < Dp; e++) oi[e] *= alpha;
            }
        }
        attn_mm_n(a->vec, M, Dp, nk, S, a->bk, vp0 + (size_t)kb * a->bk * Dp, O, Dp, 1);
    }

    for (int i = 0; i < mq; i++) {
        float inv = 1.0f / l[i], *dst = o + tok(a, b, a->Sq, q0 + i, h);
        const float *src = O + (ptrdiff_t)i * Dp;
        for (int e = 0; e < Dh; e++) dst[e] = src[e] * inv;
        lse[((ptrdiff_t)b * a->H + h) * a->Sq + q0 + i] = m[i] + logf(l[i]);
    }
}

/* ---- short sequences: one block each way, a task per few heads on the task pool ---- */

typedef struct {
    const attn_shape *a;
    float *o, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *o_in, *lse_in;
    size_t hf;  /* packed floats of one head */
    int per;    /* heads per task */
    int failed; /* set (never cleared) by a task without memory */
} small_job;

/* Heads per task: all of them when the call is too small for threads, else about eight tasks per thread. */
static int heads_per_task(int BH, int par) {
    if (!par) return BH;
    int per = BH / (8 * k_pool_threads());
    return per < 1 ? 1 : per;
}

/* This thread's workspace and packing buffer for the small path (kept between calls, grown when needed, zeroed
 * when new: the tiles read finite values past a short block's rows). */
static __thread float *tls_small;
static __thread size_t tls_small_cap;
void k_cpu_attention_release_thread(void) {
    free(tls_small);
    tls_small = NULL, tls_small_cap = 0;
}

static float *small_buffer(size_t floats) {
    if (floats <= tls_small_cap) return tls_small;
    float *p = falloc(floats);
    if (!p) return NULL;
    free(tls_small);
    tls_small = p, tls_small_cap = r16(floats);
    return p;
}

static void fwd_small_task(void *ctx, int t) {
    small_job *j = ctx;
    const attn_shape *a = j->a;
    const size_t wsf = r16(fwd_ws_floats(a));
    float *ws = small_buffer(wsf + j->hf), *pk = ws ? ws + wsf : NULL;
    if (!ws) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const int BH = a->B * a->H, b1 = (t + 1) * j->per < BH ? (t + 1) * j->per : BH;
    for (int bh = t * j->per; bh < b1; bh++) {
        for (int kb = 0; kb < a->nkb; kb++) fwd_pack(pk, j->k, j->v, a, bh / a->H, bh % a->H, kb);
        fwd_block(ws, j->o, j->lse, j->q, pk, a, bh / a->H, bh % a->H, 0);
    }
}

/* Forward: see kernels.h (attention_forward). q [B,Sq,H,Dh], k, v [B,Skv,H,Dh] -> o [B,Sq,H,Dh] (overwritten),
 * lse [B,H,Sq] natural-log fp32. Skv == 0 gives o = 0 and lse = -inf (an empty partial for lse_merge).
 * Reference: torch.nn.functional.scaled_dot_product_attention (no mask, no dropout); FlashAttention-2 Alg. 1. */
static void attention_forward_run(float *o, float *lse, const float *q, const float *k, const float *v, int B, int Sq,
                             int Skv, int H, int Dh, float scale) {
    if (B <= 0 || Sq <= 0 || H <= 0 || Dh <= 0) return;
    const size_t n_o = (size_t)B * Sq * H * Dh, n_lse = (size_t)B * H * Sq;
    if (Skv <= 0) {
        memset(o, 0, sizeof(float) * n_o);
        for (size_t i = 0; i < n_lse; i++) lse[i] = -INFINITY;
        return;
    }
    attn_shape a = {.B = B, .Sq = Sq, .Skv = Skv, .H = H, .Dh = Dh, .Dp = attn_round_up(Dh, ATTN_NR),
                    .rs = (ptrdiff_t)H * Dh, .scale = scale};
    attn_blocks(&a, ATTN_BQ);
    const int BH = B * H;
    const size_t hf = fwd_head_floats(&a);
    const int par = (double)BH * Sq * Skv * Dh >= (double)K_PAR_MIN_ELEMS * 4;
    int failed = 0, G = 1;
    float *pack = NULL;
    if (a.nqb == 1) {
        /* One query block per head (short sequences): each task packs a few heads' K/V into its thread's buffer and
         * runs their blocks, on the task pool (kernels/cpu/pool.h: no barrier, no waiting for a late thread). */
        small_job j = {.a = &a, .o = o, .lse = lse, .q = q, .k = k, .v = v, .hf = hf};
        j.per = heads_per_task(BH, par);
        k_pool_run((BH + j.per - 1) / j.per, fwd_small_task, &j);
        failed = j.failed;
        goto done;
    }
    G = group_size(BH, hf);
    pack = falloc((size_t)G * hf);
    failed = !pack;
    if (failed) goto done;
    /* Threads only when the work pays for waking them (results do not depend on the thread count). */
#pragma omp parallel if (par)
    {
        float *ws = falloc(fwd_ws_floats(&a));
        if (!ws) {
#pragma omp atomic write
            failed = 1;
        }
        for (int g0 = 0; g0 < BH; g0 += G) {
            const int gn = imin(G, BH - g0);
#pragma omp for schedule(static)
            for (long t = 0; t < (long)gn * a.nkb; t++) {
                int bh = g0 + (int)(t / a.nkb);
                fwd_pack(pack + (size_t)(bh - g0) * hf, k, v, &a, bh / H, bh % H, (int)(t % a.nkb));
            }
#pragma omp for schedule(dynamic, 1)
            for (long t = 0; t < (long)gn * a.nqb; t++) {
                int bh = g0 + (int)(t / a.nqb);
                if (ws) fwd_block(ws, o, lse, q, pack + (size_t)(bh - g0) * hf, &a, bh / H, bh % H, (int)(t % a.nqb));
            }
        }
        free(ws);
    }
done:
    free(pack);
    if (failed) {
        core_error("attention_forward: out of memory for the packed K/V of %d heads (%zu floats each)", G, hf);
        fill_nan(o, n_o);
        fill_nan(lse, n_lse);
    }
}

/* ---- backward ---- */

/* Packed operands of one head, each an array of blocks:
 *   per key block (BK):  Kt, Vt (transposed strips, BK*Dh), Kp (strips, BK*Dp);
 *   per query block (bq): Qs, dOs (row-major, bq*Dh; Q times scale), Qp, dOp (strips, bq*Dp), lse, D (bq). */
typedef struct {
    float *Kt, *Vt, *Kp, *Qs, *dOs, *Qp, *dOp, *lse, *D;
} bwd_pack;

static size_t bwd_head_floats(const attn_shape *a) {
    const size_t kf = (size_t)a->nkb * a->bk, qf = (size_t)a->nqb * a->bq;
    return kf * (2 * (size_t)a->Dh + a->Dp) + qf * (2 * (size_t)a->Dh + 2 * (size_t)a->Dp + 2);
}

static bwd_pack bwd_pack_at(float *base, const attn_shape *a) {
    const size_t kf = (size_t)a->nkb * a->bk, qf = (size_t)a->nqb * a->bq;
    bwd_pack p;
    p.Kt = base, p.Vt = p.Kt + kf * a->Dh, p.Kp = p.Vt + kf * a->Dh;
    p.Qs = p.Kp + kf * a->Dp, p.dOs = p.Qs + qf * a->Dh, p.Qp = p.dOs + qf * a->Dh, p.dOp = p.Qp + qf * a->Dp;
    p.lse = p.dOp + qf * a->Dp, p.D = p.lse + qf;
    return p;
}

static void bwd_pack_k(const bwd_pack *p, const float *k, const float *v, const attn_shape *a, int b, int h, int kb) {
    const int Dh = a->Dh, k0 = kb * a->bk, nk = imin(a->bk, a->Skv - k0), N = attn_round_up(nk, ATTN_NR);
    const ptrdiff_t t0 = tok(a, b, a->Skv, k0, h);
    const size_t off = (size_t)kb * a->bk;
    attn_pack_t(p->Kt + off * Dh, k + t0, a->rs, nk, N, Dh);
    attn_pack_t(p->Vt + off * Dh, v + t0, a->rs, nk, N, Dh);
    attn_pack_n(p->Kp + off * a->Dp, k + t0, a->rs, nk, Dh, 1.0f);
}

/* Query block qb: scaled Q and dO (rows past the end zero), lse, and D_i = rowsum(dO_i * O_i) (padding rows 0). */
static void bwd_pack_q(const bwd_pack *p, const float *dout, const float *q, const float *o, const float *lse,
                       const attn_shape *a, int b, int h, int qb) {
    const int Dh = a->Dh, q0 = qb * a->bq, mq = imin(a->bq, a->Sq - q0), M = attn_round_up(mq, ATTN_MR);
    const ptrdiff_t t0 = tok(a, b, a->Sq, q0, h);
    const size_t off = (size_t)qb * a->bq;
    attn_gather(p->Qs + off * Dh, q + t0, a->rs, mq, M, Dh, a->scale);
    attn_gather(p->dOs + off * Dh, dout + t0, a->rs, mq, M, Dh, 1.0f);
    attn_pack_n(p->Qp + off * a->Dp, q + t0, a->rs, mq, Dh, a->scale);
    attn_pack_n(p->dOp + off * a->Dp, dout + t0, a->rs, mq, Dh, 1.0f);
    const float *lrow = lse + ((ptrdiff_t)b * a->H + h) * a->Sq + q0;
    for (int i = 0; i < a->bq; i++) {
        float d = 0.0f;
        if (i < mq) {
            const float *oi = o + t0 + i * a->rs, *gi = dout + t0 + i * a->rs;
            for (int e = 0; e < Dh; e++) d += gi[e] * oi[e];
        }
        p->D[off + i] = d;
        p->lse[off + i] = i < mq ? lrow[i] : 0.0f;
    }
}

static size_t bwd_ws_floats(const attn_shape *a) {
    const size_t rows = (size_t)(a->bq > a->bk ? a->bq : a->bk); /* dK, dV: bk rows; dQ: bq rows */
    return 2 * r16((size_t)a->bq * a->bk) + 2 * r16(rows * a->Dp);
}

/* The recomputation shared by both passes for query block qb and key block kb: S = Qs Kt, P = exp(S - lse) (keys
 * past nk masked to 0) into S; dP = dO Vt and dS = P * (dP - D) into dP. Rows 0..M-1. */
static void bwd_pair(const bwd_pack *p, const attn_shape *a, int qb, int kb, int M, int nk, float *S, float *dP) {
    const int Dh = a->Dh, N = attn_round_up(nk, ATTN_NR);
    const size_t qo = (size_t)qb * a->bq, ko = (size_t)kb * a->bk * Dh;
    attn_mm_n(a->vec, M, N, Dh, p->Qs + qo * Dh, Dh, p->Kt + ko, S, a->bk, 0);
    attn_mm_n(a->vec, M, N, Dh, p->dOs + qo * Dh, Dh, p->Vt + ko, dP, a->bk, 0);
    for (int i = 0; i < M; i++) {
        float *si = S + (ptrdiff_t)i * a->bk, *di = dP + (ptrdiff_t)i * a->bk;
        for (int j = nk; j < N; j++) si[j] = -INFINITY;
        attn_exp_sub(a->vec, si, si, p->lse[qo + i], N);
        const float Di = p->D[qo + i];
        for (int j = 0; j < N; j++) di[j] = si[j] * (di[j] - Di);
    }
}

/* The stored dS of one head (attention_backward_run's ds): block (qb, kb) of bq x bk floats, rows of bk. */
static float *ds_block(float *ds, const attn_shape *a, int qb, int kb) {
    return ds + ((size_t)qb * a->nkb + kb) * a->bq * a->bk;
}

/* Pass 1 task: dK, dV of key block kb of (b, h); with ds (not NULL) every dS block it computes is kept there for
 * pass 2. */
static void bwd_kv_block(float *ws, float *dk, float *dv, const bwd_pack *p, const attn_shape *a, int b, int h,
                         int kb, float *ds) {
    const int Dh = a->Dh, Dp = a->Dp, k0 = kb * a->bk, nk = imin(a->bk, a->Skv - k0);
    const int MK = attn_round_up(nk, ATTN_MR);
    float *S = ws, *dP = S + r16((size_t)a->bq * a->bk), *dK = dP + r16((size_t)a->bq * a->bk);
    float *dV = dK + r16((size_t)a->bk * Dp);
    memset(dK, 0, sizeof(float) * (size_t)MK * Dp);
    memset(dV, 0, sizeof(float) * (size_t)MK * Dp);
    for (int qb = 0; qb < a->nqb; qb++) {
        const int mq = imin(a->bq, a->Sq - qb * a->bq), M = attn_round_up(mq, ATTN_MR);
        const size_t qo = (size_t)qb * a->bq * Dp;
        bwd_pair(p, a, qb, kb, M, nk, S, dP);
        if (ds) memcpy(ds_block(ds, a, qb, kb), dP, sizeof(float) * (size_t)M * a->bk);
        /* dV += P^T dO, dK += dS^T (scale Q): key rows are the tile rows, the mq query rows the reduction. */
        attn_mm_t(a->vec, MK, Dp, mq, S, a->bk, p->dOp + qo, dV, Dp, 1);
        attn_mm_t(a->vec, MK, Dp, mq, dP, a->bk, p->Qp + qo, dK, Dp, 1);
    }
    const ptrdiff_t t0 = tok(a, b, a->Skv, k0, h);
    for (int j = 0; j < nk; j++) {
        float *gk = dk + t0 + j * a->rs, *gv = dv + t0 + j * a->rs;
        const float *sk = dK + (ptrdiff_t)j * Dp, *sv = dV + (ptrdiff_t)j * Dp;
        for (int e = 0; e < Dh; e++) gk[e] += sk[e], gv[e] += sv[e];
    }
}

/* Pass 2 task: dQ of query block qb of (b, h); dS recomputed, or read from ds (pass 1's, the same values). */
static void bwd_q_block(float *ws, float *dq, const bwd_pack *p, const attn_shape *a, int b, int h, int qb,
                        float *ds) {
    const int Dh = a->Dh, Dp = a->Dp, q0 = qb * a->bq, mq = imin(a->bq, a->Sq - q0);
    const int M = attn_round_up(mq, ATTN_MR);
    float *S = ws, *dP = S + r16((size_t)a->bq * a->bk), *dQ = dP + r16((size_t)a->bq * a->bk);
    memset(dQ, 0, sizeof(float) * (size_t)M * Dp);
    for (int kb = 0; kb < a->nkb; kb++) {
        const int nk = imin(a->bk, a->Skv - kb * a->bk);
        const float *dS = ds ? ds_block(ds, a, qb, kb) : dP;
        if (!ds) bwd_pair(p, a, qb, kb, M, nk, S, dP);
        attn_mm_n(a->vec, M, Dp, nk, dS, a->bk, p->Kp + (size_t)kb * a->bk * Dp, dQ, Dp, 1);
    }
    for (int i = 0; i < mq; i++) {
        float *g = dq + tok(a, b, a->Sq, q0 + i, h);
        const float *s = dQ + (ptrdiff_t)i * Dp;
        for (int e = 0; e < Dh; e++) g[e] += a->scale * s[e];
    }
}

static void bwd_small_task(void *ctx, int t) {
    small_job *j = ctx;
    const attn_shape *a = j->a;
    const size_t wsf = r16(bwd_ws_floats(a));
    float *ws = small_buffer(wsf + j->hf), *pk = ws ? ws + wsf : NULL;
    if (!ws) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const int BH = a->B * a->H, b1 = (t + 1) * j->per < BH ? (t + 1) * j->per : BH;
    for (int bh = t * j->per; bh < b1; bh++) {
        const int b = bh / a->H, h = bh % a->H;
        bwd_pack p = bwd_pack_at(pk, a);
        bwd_pack_k(&p, j->k, j->v, a, b, h, 0);
        bwd_pack_q(&p, j->dout, j->q, j->o_in, j->lse_in, a, b, h, 0);
        bwd_kv_block(ws, j->dk, j->dv, &p, a, b, h, 0, NULL);
        bwd_q_block(ws, j->dq, &p, a, b, h, 0, NULL);
    }
}

/* Backward: see kernels.h (attention_backward). Given dout, q, k, v, and o, lse from the forward, ACCUMULATES
 * dq [B,Sq,H,Dh] +=, dk, dv [B,Skv,H,Dh] +=. Reference: FlashAttention-2 Algorithm 2 (two passes, no atomics). */
static void attention_backward_run(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                              const float *v, const float *o, const float *lse, int B, int Sq, int Skv, int H,
                              int Dh, float scale) {
    if (B <= 0 || Sq <= 0 || Skv <= 0 || H <= 0 || Dh <= 0) return;
    attn_shape a = {.B = B, .Sq = Sq, .Skv = Skv, .H = H, .Dh = Dh, .Dp = attn_round_up(Dh, ATTN_NR),
                    .rs = (ptrdiff_t)H * Dh, .scale = scale};
    attn_blocks(&a, ATTN_BQ_BWD);
    const int BH = B * H;
    const size_t hf = bwd_head_floats(&a);
    const int par = (double)BH * Sq * Skv * Dh >= (double)K_PAR_MIN_ELEMS * 2;
    int failed = 0, G = 1;
    float *pack = NULL;
    if (a.nqb == 1 && a.nkb == 1) {
        /* One block each way (short sequences): each task packs a few heads and runs both passes (the same blocks in
         * the same order), on the task pool. */
        small_job j = {.a = &a, .dq = dq, .dk = dk, .dv = dv, .dout = dout, .q = q, .k = k, .v = v, .o_in = o,
                       .lse_in = lse, .hf = hf};
        j.per = heads_per_task(BH, par);
        k_pool_run((BH + j.per - 1) / j.per, bwd_small_task, &j);
        failed = j.failed;
        goto done;
    }
    G = group_size(BH, hf);
    pack = falloc((size_t)G * hf);
    failed = !pack;
    if (failed) goto done;
    /* Pass 1's dS kept for pass 2 when the group's fits k_cpu_attn_ds_budget (pass 2 then skips recomputing S, P, dP and
     * dS: two of its three products), else recomputed; either way the same values. */
    const size_t ds_head = (size_t)a.nqb * a.bq * a.nkb * a.bk;
    float *ds = ds_head * G * sizeof(float) <= k_cpu_attn_ds_budget ? malloc(ds_head * G * sizeof(float)) : NULL;
#pragma omp parallel if (par)
    {
        float *ws = falloc(bwd_ws_floats(&a));
        if (!ws) {
#pragma omp atomic write
            failed = 1;
        }
        for (int g0 = 0; g0 < BH; g0 += G) {
            const int gn = imin(G, BH - g0), per = a.nkb + a.nqb;
#pragma omp for schedule(dynamic, 4)
            for (long t = 0; t < (long)gn * per; t++) {
                int bh = g0 + (int)(t / per), j = (int)(t % per);
                bwd_pack p = bwd_pack_at(pack + (size_t)(bh - g0) * hf, &a);
                if (j < a.nkb)
                    bwd_pack_k(&p, k, v, &a, bh / H, bh % H, j);
                else
                    bwd_pack_q(&p, dout, q, o, lse, &a, bh / H, bh % H, j - a.nkb);
            }
#pragma omp for schedule(dynamic, 1) nowait
            for (long t = 0; t < (long)gn * a.nkb; t++) {
                int bh = g0 + (int)(t / a.nkb);
                bwd_pack p = bwd_pack_at(pack + (size_t)(bh - g0) * hf, &a);
                float *dsh = ds ? ds + (size_t)(bh - g0) * ds_head : NULL; /* this head's stored dS */
                if (ws) bwd_kv_block(ws, dk, dv, &p, &a, bh / H, bh % H, (int)(t % a.nkb), dsh);
            }
            if (ds) { /* pass 2 reads what pass 1 wrote */
#pragma omp barrier
            }
#pragma omp for schedule(dynamic, 1)
            for (long t = 0; t < (long)gn * a.nqb; t++) {
                int bh = g0 + (int)(t / a.nqb);
                bwd_pack p = bwd_pack_at(pack + (size_t)(bh - g0) * hf, &a);
                float *dsh = ds ? ds + (size_t)(bh - g0) * ds_head : NULL;
                if (ws) bwd_q_block(ws, dq, &p, &a, bh / H, bh % H, (int)(t % a.nqb), dsh);
            }
        }
        free(ws);
    }
    free(ds);
done:
    free(pack);
    if (failed) {
        core_error("attention_backward: out of memory for the packed operands of %d heads (%zu floats each)", G, hf);
        fill_nan(dq, (size_t)B * Sq * H * Dh);
        fill_nan(dk, (size_t)B * Skv * H * Dh);
        fill_nan(dv, (size_t)B * Skv * H * Dh);
    }
}

/* ---- the op table entries: the bodies above, timed when kernels/cpu/prof.h is on ---- */

void k_cpu_attention_forward(float *o, float *lse, const float *q, const float *k, const float *v, int B, int Sq,
                             int Skv, int H, int Dh, float scale) {
    K_PROF_BEGIN();
    attention_forward_run(o, lse, q, k, v, B, Sq, Skv, H, Dh, scale);
    K_PROF_END("attention_forward", (int64_t)B * H * Sq * Skv * Dh, 4.0 * B * H * Sq * Skv * Dh);
}

void k_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                              const float *v, const float *o, const float *lse, int B, int Sq, int Skv, int H, int Dh,
                              float scale) {
    K_PROF_BEGIN();
    attention_backward_run(dq, dk, dv, dout, q, k, v, o, lse, B, Sq, Skv, H, Dh, scale);
    K_PROF_END("attention_backward", (int64_t)B * H * Sq * Skv * Dh, 10.0 * B * H * Sq * Skv * Dh);
}
