/* sp/usp_attention.c — Ulysses x Ring self-attention (USP), forward and backward; the algorithm, layouts and
 * sources are described in usp_attention.h. This file has three parts: the Ulysses all-to-all in both directions
 * (packing several tensors and an LSE into one message), the ring forward, the ring backward. */
#include "sp/usp_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/dev_table.h"

/* Problem size of one call. */
typedef struct {
    int B, S_l, H, Dh, U, R, Hu, S_r;
    size_t n;   /* elements of one [B, S_l, H, Dh] tensor = one [B, S_r, Hu, Dh] tensor */
    size_t xb;  /* elements of one tensor's block for one peer: B*S_l*Hu*Dh */
    size_t lb;  /* floats of one LSE block for one peer: B*Hu*S_l */
    size_t es;  /* bytes of one element of q, k, v, o (the activations' dtype) */
    kb_dtype t; /* that dtype */
} usp_dims;

/* 1/sqrt(Dh) rounded to fp32 from double: the model's default scale (wan_attn_scale), torch SDPA's default. */
static float usp_scale(int Dh) { return (float)(1.0 / sqrt((double)Dh)); }

static int dims_init(usp_dims *d, const sp_usp *u, kb_dtype t, int B, int S, int H, int Dh) {
    if (!u || !u->ulysses || !u->ring) return core_error("USP attention: no Ulysses/ring groups (sp_usp_init)");
    if (B < 1 || S < 1 || H < 1 || Dh < 1)
        return core_error("USP attention: sizes must be >= 1 (B %d, S %d, H %d, Dh %d)", B, S, H, Dh);
    if (t != KB_F32 && t != KB_BF16) return core_error("USP attention: tensors must be fp32 or bf16 (dtype %d)", (int)t);
    d->B = B, d->S_l = S, d->H = H, d->Dh = Dh;
    d->U = u->ulysses->size, d->R = u->ring->size;
    if (H % d->U != 0)
        return core_error("USP attention: attention heads (%d) are not a multiple of the Ulysses degree (%d)", H,
                          d->U);
    d->Hu = H / d->U;
    d->S_r = d->U * S;
    d->n = (size_t)B * S * H * Dh;
    d->xb = (size_t)B * S * d->Hu * Dh;
    d->lb = (size_t)B * d->Hu * S;
    d->t = t;
    d->es = t == KB_BF16 ? 2 : 4;
    return 0;
}

/* The table of u (NULL: the fp32 CPU table). */
static const k_dev_ops *usp_dev(const sp_usp *u) { return u->dev ? u->dev : &k_cpu_dev_ops; }

/* The context's workspace of at least n bytes (the table's memory), grown when a call needs more: freed first, so
 * the old and the new are never held together; kept for the next call (a GPU's cudaMalloc per attention call
 * otherwise) until sp_usp_release. NULL with core_error. */
static char *workspace(sp_usp *u, const k_dev_ops *dev, size_t n, const char *what) {
    if (n <= u->ws_bytes) return u->ws;
    if (u->ws) dev->mem_free(u->ws);
    u->ws = NULL, u->ws_bytes = 0;
    if (!(u->ws = dev->mem_alloc(n))) {
        core_error_push("USP %s: %zu bytes of %s memory: ", what, n, dev->name);
        return NULL;
    }
    u->ws_bytes = n;
    return u->ws;
}

/* Bytes through the comm: as fp32 elements when they divide (the CPU's fp32 tensors: MPI's per-block limit counts
 * elements), else as bytes. */
static int a2a(sp_comm *c, const void *send, void *recv, size_t bytes) {
    return bytes % 4 ? sp_comm_all_to_all(c, send, recv, bytes, SP_U8)
                     : sp_comm_all_to_all(c, send, recv, bytes / 4, SP_F32);
}
static int shift(sp_comm *c, const void *send, void *recv, size_t bytes, int dest, int source) {
    return bytes % 4 ? sp_comm_sendrecv(c, send, bytes, dest, recv, bytes, source, SP_U8)
                     : sp_comm_sendrecv(c, send, bytes / 4, dest, recv, bytes / 4, source, SP_F32);
}

static kb_in vin(const usp_dims *d, const void *p) { return (kb_in){p, d->t}; }
static kb_out vout(const usp_dims *d, void *p) { return (kb_out){p, d->t}; }

/* ---- Ulysses all-to-all ----
 * Message block for peer j (Ulysses rank j), nx tensors then optionally one LSE (fp32):
 *   to heads:    tensor t: x_t[b, s, j*Hu + hh, :] for s < S_l (my tokens, peer j's heads), as [B, S_l, Hu, Dh];
 *                LSE:      lse[b, j*Hu + hh, s], as [B, Hu, S_l].
 *   to sequence: tensor t: xg_t[b, j*S_l + s, hh, :] (peer j's tokens, my heads), as [B, S_l, Hu, Dh];
 *                LSE:      lseg[b, hh, j*S_l + s], as [B, Hu, S_l].
 * The receiver places block i (from Ulysses rank i) at token chunk i (to heads) or head chunk i (to sequence).
 * Every move is a 2-D copy of the table (mem_copy2d): rows of Hu*Dh elements, or of S_l tokens. */

static size_t block_bytes(const usp_dims *d, int nx, int has_lse) {
    return nx * d->xb * d->es + (has_lse ? d->lb * sizeof(float) : 0);
}

/* Scratch bytes of one all-to-all of nx tensors (and an LSE): the send and receive buffers, and with accumulate the
 * unpacked values before the add (to_seq). */
static size_t a2a_bytes(const usp_dims *d, int nx, int has_lse, int accumulate) {
    return 2 * block_bytes(d, nx, has_lse) * (size_t)d->U + (accumulate ? d->n * d->es : 0);
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* x [B, S_l, H, Dh], lse [B, H, S_l] (sequence-sharded) -> xg [B, S_r, Hu, Dh], lseg [B, Hu, S_r] (head-sharded).
 * lse/lseg NULL: no LSE. */
static int to_heads(const k_dev_ops *dev, sp_comm *c, const usp_dims *d, int nx, const void *const *x,
                    void *const *xg, const float *lse, float *lseg, char *scratch) {
    const int has_lse = lse != NULL, U = d->U, Hu = d->Hu, S_l = d->S_l, S_r = d->S_r, B = d->B;
    const size_t bb = block_bytes(d, nx, has_lse), row = (size_t)Hu * d->Dh * d->es, F = sizeof(float);
    char *send = scratch, *recv = scratch + bb * U; /* a2a_bytes */
    for (int j = 0; j < U; j++) {
        char *blk = send + j * bb;
        for (int t = 0; t < nx; t++, blk += d->xb * d->es)
            if (dev->mem_copy2d(blk, row, (const char *)x[t] + j * row, (size_t)d->H * d->Dh * d->es, row,
                                (size_t)B * S_l))
                return -1;
        if (has_lse && dev->mem_copy2d(blk, (size_t)Hu * S_l * F, lse + (size_t)j * Hu * S_l,
                                       (size_t)d->H * S_l * F, (size_t)Hu * S_l * F, (size_t)B))
            return -1;
    }
    if (a2a(c, send, recv, bb)) return core_error_push("USP all-to-all (to heads): ");
    for (int i = 0; i < U; i++) {
        const char *blk = recv + i * bb;
        for (int t = 0; t < nx; t++, blk += d->xb * d->es)
            if (dev->mem_copy2d((char *)xg[t] + (size_t)i * S_l * row, (size_t)S_r * row, blk, (size_t)S_l * row,
                                (size_t)S_l * row, (size_t)B))
                return -1;
        if (has_lse && dev->mem_copy2d(lseg + (size_t)i * S_l, (size_t)S_r * F, blk, (size_t)S_l * F,
                                       (size_t)S_l * F, (size_t)B * Hu))
            return -1;
    }
    return 0;
}

/* The inverse: xg [B, S_r, Hu, Dh], lseg [B, Hu, S_r] -> x [B, S_l, H, Dh], lse [B, H, S_l]. accumulate: x += the
 * received values (gradients: unpacked into scratch, then the table's add), else x = them. lse is always
 * overwritten; lseg/lse NULL: no LSE. */
static int to_seq(const k_dev_ops *dev, sp_comm *c, const usp_dims *d, int nx, const void *const *xg,
                  void *const *x, const float *lseg, float *lse, int accumulate, char *scratch) {
    const int has_lse = lseg != NULL, U = d->U, Hu = d->Hu, S_l = d->S_l, S_r = d->S_r, B = d->B;
    const size_t bb = block_bytes(d, nx, has_lse), row = (size_t)Hu * d->Dh * d->es, F = sizeof(float);
    const size_t xrow = (size_t)d->H * d->Dh * d->es;
    char *send = scratch, *recv = scratch + bb * U, *acc = accumulate ? recv + bb * U : NULL; /* a2a_bytes */
    for (int j = 0; j < U; j++) {
        char *blk = send + j * bb;
        for (int t = 0; t < nx; t++, blk += d->xb * d->es)
            if (dev->mem_copy2d(blk, (size_t)S_l * row, (const char *)xg[t] + (size_t)j * S_l * row,
                                (size_t)S_r * row, (size_t)S_l * row, (size_t)B))
                return -1;
        if (has_lse && dev->mem_copy2d(blk, (size_t)S_l * F, lseg + (size_t)j * S_l, (size_t)S_r * F,
                                       (size_t)S_l * F, (size_t)B * Hu))
            return -1;
    }
    if (a2a(c, send, recv, bb)) return core_error_push("USP all-to-all (to sequence): ");
    for (int t = 0; t < nx; t++) {
        char *dst = accumulate ? acc : x[t];
        for (int i = 0; i < U; i++)
            if (dev->mem_copy2d(dst + i * row, xrow, recv + i * bb + t * d->xb * d->es, row, row, (size_t)B * S_l))
                return -1;
        if (accumulate && dev->add(vout(d, x[t]), vin(d, acc), (int64_t)d->n)) return -1;
    }
    for (int i = 0; has_lse && i < U; i++)
        if (dev->mem_copy2d(lse + (size_t)i * Hu * S_l, (size_t)d->H * S_l * F, recv + i * bb + nx * d->xb * d->es,
                            (size_t)Hu * S_l * F, (size_t)Hu * S_l * F, (size_t)B))
            return -1;
    return 0;
}

/* Ring neighbours: K/V travel from rank r to r+1, so at step s rank r holds block (r - s) mod R. */
static int ring_next(const sp_comm *c) { return (c->rank + 1) % c->size; }
static int ring_prev(const sp_comm *c) { return (c->rank + c->size - 1) % c->size; }

/* The dtype of the calls' tensors: one for all, else -1 with core_error. */
static int one_dtype(const char *who, kb_dtype *t, const kb_dtype *ts, int n) {
    *t = ts[0];
    for (int i = 1; i < n; i++)
        if (ts[i] != ts[0]) return core_error("USP attention %s: tensors of different dtypes (%d and %d)", who,
                                              (int)ts[0], (int)ts[i]);
    return 0;
}

/* ---- forward ---- */

int sp_usp_forward(void *ctx, kb_out o, float *lse, kb_in q, kb_in k, kb_in v, int B, int S, int H, int Dh) {
    sp_usp *u = ctx;
    usp_dims d;
    kb_dtype t;
    const kb_dtype ts[4] = {o.t, q.t, k.t, v.t};
    if (one_dtype("forward", &t, ts, 4) || dims_init(&d, u, t, B, S, H, Dh)) return -1;
    const k_dev_ops *dev = usp_dev(u);
    const size_t n = d.n, nl = (size_t)B * H * S, es = d.es;
    const float scale = usp_scale(Dh);
    /* qg | kv (k, v: the block in hand) | kv2 (the block arriving) | og | os, then lseg | lses (fp32), then the
     * all-to-alls' scratch */
    const size_t main = 7 * n * es + 2 * nl * sizeof(float);
    char *ws = workspace(u, dev, main + max_sz(a2a_bytes(&d, 3, 0, 0), a2a_bytes(&d, 1, 1, 0)), "attention forward");
    if (!ws) return core_error_push("USP attention forward (rank %d): ", u->me.global_rank);
    char *qg = ws, *kv = qg + n * es, *kv2 = kv + 2 * n * es, *og = kv2 + 2 * n * es, *os = og + n * es;
    float *lseg = (float *)(os + n * es), *lses = lseg + nl;
    char *scratch = ws + main;
    int rc = -1;

    const void *in[3] = {q.p, k.p, v.p};
    void *g[3] = {qg, kv, kv + n * es};
    if (to_heads(dev, u->ulysses, &d, 3, in, g, NULL, NULL, scratch)) goto out;

    if (dev->attention_forward(vout(&d, og), lseg, vin(&d, qg), vin(&d, kv), vin(&d, kv + n * es), B, d.S_r, d.S_r,
                               d.Hu, Dh, scale))
        goto out;
    for (int s = 1; s < d.R; s++) {
        /* Block r-s arrives from r-1 while block r-s+1 leaves for r+1; this step uses the block that arrived. */
        if (shift(u->ring, kv, kv2, 2 * n * es, ring_next(u->ring), ring_prev(u->ring))) {
            core_error_push("USP ring step %d of %d: ", s, d.R);
            goto out;
        }
        char *tmp = kv;
        kv = kv2, kv2 = tmp;
        if (dev->attention_forward(vout(&d, os), lses, vin(&d, qg), vin(&d, kv), vin(&d, kv + n * es), B, d.S_r,
                                   d.S_r, d.Hu, Dh, scale) ||
            dev->lse_merge_forward(vout(&d, og), lseg, vin(&d, og), lseg, vin(&d, os), lses, B, d.S_r, d.Hu, Dh))
            goto out;
    }

    const void *outg[1] = {og};
    void *outl[1] = {o.p};
    if (to_seq(dev, u->ulysses, &d, 1, outg, outl, lseg, lse, 0, scratch)) goto out;
    rc = 0;
out:
    return rc ? core_error_push("USP attention forward (rank %d): ", u->me.global_rank) : 0;
}

/* ---- backward ---- */

int sp_usp_backward(void *ctx, kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k, kb_in v, kb_in o,
                    const float *lse, int B, int S, int H, int Dh) {
    sp_usp *u = ctx;
    usp_dims d;
    kb_dtype t;
    const kb_dtype ts[8] = {dq.t, dk.t, dv.t, dout.t, q.t, k.t, v.t, o.t};
    if (one_dtype("backward", &t, ts, 8) || dims_init(&d, u, t, B, S, H, Dh)) return -1;
    const k_dev_ops *dev = usp_dev(u);
    const size_t n = d.n, nl = (size_t)B * H * S, es = d.es, ne = n * es;
    const float scale = usp_scale(Dh);
    /* qg | og | dog | dqg | blk (k, v, dk_acc, dv_acc: in hand) | blk2 (arriving), then lseg (fp32), then the
     * all-to-alls' scratch */
    const size_t main = 12 * ne + nl * sizeof(float);
    char *ws = workspace(u, dev, main + max_sz(a2a_bytes(&d, 5, 1, 0), a2a_bytes(&d, 3, 0, 1)), "attention backward");
    if (!ws) return core_error_push("USP attention backward (rank %d): ", u->me.global_rank);
    char *qg = ws, *og = qg + ne, *dog = og + ne, *dqg = dog + ne, *blk = dqg + ne, *blk2 = blk + 4 * ne;
    float *lseg = (float *)(blk2 + 4 * ne);
    char *scratch = ws + main;
    int rc = -1;

    const void *in[5] = {q.p, k.p, v.p, o.p, dout.p};
    void *g[5] = {qg, blk, blk + ne, og, dog};
    if (to_heads(dev, u->ulysses, &d, 5, in, g, lse, lseg, scratch)) goto out;
    if (dev->mem_zero(dqg, ne) || dev->mem_zero(blk + 2 * ne, 2 * ne)) goto out;

    for (int s = 0; s < d.R; s++) {
        if (s > 0) {
            /* (K, V, dK_acc, dV_acc) of block r-s arrive from r-1; those of block r-s+1 leave for r+1. */
            if (shift(u->ring, blk, blk2, 4 * ne, ring_next(u->ring), ring_prev(u->ring))) {
                core_error_push("USP ring backward step %d of %d: ", s, d.R);
                goto out;
            }
            char *tmp = blk;
            blk = blk2, blk2 = tmp;
        }
        if (dev->attention_backward(vout(&d, dqg), vout(&d, blk + 2 * ne), vout(&d, blk + 3 * ne), vin(&d, dog),
                                    vin(&d, qg), vin(&d, blk), vin(&d, blk + ne), vin(&d, og), lseg, B, d.S_r, d.S_r,
                                    d.Hu, Dh, scale))
            goto out;
    }
    /* After step R-1 rank r holds the complete accumulators of block r+1: one hop home. */
    char *dkv = blk + 2 * ne;
    if (d.R > 1) {
        if (shift(u->ring, blk + 2 * ne, blk2 + 2 * ne, 2 * ne, ring_next(u->ring), ring_prev(u->ring))) {
            core_error_push("USP ring backward, final dK/dV hop: ");
            goto out;
        }
        dkv = blk2 + 2 * ne;
    }

    const void *gg[3] = {dqg, dkv, dkv + ne};
    void *gl[3] = {dq.p, dk.p, dv.p};
    if (to_seq(dev, u->ulysses, &d, 3, gg, gl, NULL, NULL, 1, scratch)) goto out;
    rc = 0;
out:
    return rc ? core_error_push("USP attention backward (rank %d): ", u->me.global_rank) : 0;
}

/* ---- groups ---- */

int sp_usp_init(sp_usp *u, sp_comm *world, const sp_topology *t, const k_dev_ops *dev) {
    memset(u, 0, sizeof *u);
    if (!world) return core_error("USP groups: no world communicator");
    if (world->size != t->trainer_ranks)
        return core_error("USP groups: the MPI world has %d ranks but parallel.trainer_ranks is %d", world->size,
                          t->trainer_ranks);
    u->dev = dev;
    u->me = sp_topology_rank(t, world->rank);
    u->owns_groups = 1;
    static const char *names[3] = {"sp", "ulysses", "ring"};
    static const sp_group_kind kinds[3] = {SP_GROUP_SP, SP_GROUP_ULYSSES, SP_GROUP_RING};
    sp_comm **dst[3] = {&u->sp, &u->ulysses, &u->ring};
    for (int i = 0; i < 3; i++) {
        int colour, key;
        sp_topology_colour(t, world->rank, kinds[i], &colour, &key);
        if (sp_comm_split(world, colour, key, names[i], dst[i])) {
            sp_usp_release(u);
            return core_error_push("USP groups: ");
        }
    }
    return 0;
}

void sp_usp_init_groups(sp_usp *u, sp_comm *sp, sp_comm *ulysses, sp_comm *ring, const k_dev_ops *dev) {
    memset(u, 0, sizeof *u);
    u->dev = dev;
    u->sp = sp, u->ulysses = ulysses, u->ring = ring;
    u->me = (sp_rank_info){-1, -1, -1, -1, -1};
    if (ulysses && ring) {
        u->me.ulysses_rank = ulysses->rank, u->me.ring_rank = ring->rank;
        u->me.sp_rank = ring->rank * ulysses->size + ulysses->rank;
        u->me.global_rank = u->me.sp_rank; /* unknown here; messages name the SP rank */
    }
}

void sp_usp_free_workspace(sp_usp *u) {
    if (u->ws) usp_dev(u)->mem_free(u->ws);
    u->ws = NULL, u->ws_bytes = 0;
}

void sp_usp_release(sp_usp *u) {
    sp_usp_free_workspace(u);
    if (u->owns_groups) {
        sp_comm_destroy(u->ring);
        sp_comm_destroy(u->ulysses);
        sp_comm_destroy(u->sp);
    }
    memset(u, 0, sizeof *u);
}
