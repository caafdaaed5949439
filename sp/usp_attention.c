/* sp/usp_attention.c — Ulysses x Ring self-attention (USP), forward and backward; the algorithm, layouts and
 * sources are described in usp_attention.h. This file has three parts: the Ulysses all-to-all in both directions
 * (packing several tensors and an LSE into one message), the ring forward, the ring backward. */
#include "sp/usp_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Problem size of one call. */
typedef struct {
    int B, S_l, H, Dh, U, R, Hu, S_r;
    size_t n;   /* floats of one [B, S_l, H, Dh] tensor = one [B, S_r, Hu, Dh] tensor */
    size_t xb;  /* floats of one tensor's block for one peer: B*S_l*Hu*Dh */
    size_t lb;  /* floats of one LSE block for one peer: B*Hu*S_l */
} usp_dims;

/* 1/sqrt(Dh) rounded to fp32 from double: the model's default scale (wan_attn_scale), torch SDPA's default. */
static float usp_scale(int Dh) { return (float)(1.0 / sqrt((double)Dh)); }

static int dims_init(usp_dims *d, const sp_usp *u, int B, int S, int H, int Dh) {
    if (!u || !u->ulysses || !u->ring) return core_error("USP attention: no Ulysses/ring groups (sp_usp_init)");
    if (B < 1 || S < 1 || H < 1 || Dh < 1)
        return core_error("USP attention: sizes must be >= 1 (B %d, S %d, H %d, Dh %d)", B, S, H, Dh);
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
    return 0;
}

static float *falloc(size_t n) { return malloc((n ? n : 1) * sizeof(float)); }

/* Kernel calls are void and report out-of-memory through core_error: clear before, check after. */
static int kernel_failed(void) { return core_last_error()[0] != '\0'; }

/* ---- Ulysses all-to-all ----
 * Message block for peer j (Ulysses rank j), nx tensors then optionally one LSE:
 *   to heads:    tensor t: x_t[b, s, j*Hu + hh, :] for s < S_l (my tokens, peer j's heads), as [B, S_l, Hu, Dh];
 *                LSE:      lse[b, j*Hu + hh, s], as [B, Hu, S_l].
 *   to sequence: tensor t: xg_t[b, j*S_l + s, hh, :] (peer j's tokens, my heads), as [B, S_l, Hu, Dh];
 *                LSE:      lseg[b, hh, j*S_l + s], as [B, Hu, S_l].
 * The receiver places block i (from Ulysses rank i) at token chunk i (to heads) or head chunk i (to sequence). */

static size_t block_floats(const usp_dims *d, int nx, int has_lse) { return nx * d->xb + (has_lse ? d->lb : 0); }

/* x [B, S_l, H, Dh], lse [B, H, S_l] (sequence-sharded) -> xg [B, S_r, Hu, Dh], lseg [B, Hu, S_r] (head-sharded).
 * lse/lseg NULL: no LSE. */
static int to_heads(sp_comm *c, const usp_dims *d, int nx, const float *const *x, float *const *xg,
                    const float *lse, float *lseg) {
    const int has_lse = lse != NULL, U = d->U, Hu = d->Hu, Dh = d->Dh, S_l = d->S_l, S_r = d->S_r;
    const size_t bf = block_floats(d, nx, has_lse), row = (size_t)Hu * Dh;
    float *send = falloc(bf * U), *recv = falloc(bf * U);
    int rc = -1;
    if (!send || !recv) {
        core_error("USP all-to-all: out of memory (%zu floats)", 2 * bf * U);
        goto out;
    }
    for (int j = 0; j < U; j++) {
        float *blk = send + j * bf;
        for (int t = 0; t < nx; t++, blk += d->xb)
            for (int b = 0; b < d->B; b++)
                for (int s = 0; s < S_l; s++)
                    memcpy(blk + ((size_t)b * S_l + s) * row, x[t] + (((size_t)b * S_l + s) * d->H + j * Hu) * Dh,
                           row * sizeof(float));
        if (has_lse)
            for (int b = 0; b < d->B; b++)
                for (int hh = 0; hh < Hu; hh++)
                    memcpy(blk + ((size_t)b * Hu + hh) * S_l, lse + ((size_t)b * d->H + j * Hu + hh) * S_l,
                           S_l * sizeof(float));
    }
    if (sp_comm_all_to_all(c, send, recv, bf, SP_F32)) {
        core_error_push("USP all-to-all (to heads): ");
        goto out;
    }
    for (int i = 0; i < U; i++) {
        const float *blk = recv + i * bf;
        for (int t = 0; t < nx; t++, blk += d->xb)
            for (int b = 0; b < d->B; b++)
                memcpy(xg[t] + ((size_t)b * S_r + (size_t)i * S_l) * row, blk + (size_t)b * S_l * row,
                       S_l * row * sizeof(float));
        if (has_lse)
            for (int b = 0; b < d->B; b++)
                for (int hh = 0; hh < Hu; hh++)
                    memcpy(lseg + ((size_t)b * Hu + hh) * S_r + (size_t)i * S_l, blk + ((size_t)b * Hu + hh) * S_l,
                           S_l * sizeof(float));
    }
    rc = 0;
out:
    free(send);
    free(recv);
    return rc;
}

/* The inverse: xg [B, S_r, Hu, Dh], lseg [B, Hu, S_r] -> x [B, S_l, H, Dh], lse [B, H, S_l]. accumulate: x += the
 * received values (gradients), else x = them. lse is always overwritten; lseg/lse NULL: no LSE. */
static int to_seq(sp_comm *c, const usp_dims *d, int nx, const float *const *xg, float *const *x, const float *lseg,
                  float *lse, int accumulate) {
    const int has_lse = lseg != NULL, U = d->U, Hu = d->Hu, Dh = d->Dh, S_l = d->S_l, S_r = d->S_r;
    const size_t bf = block_floats(d, nx, has_lse), row = (size_t)Hu * Dh;
    float *send = falloc(bf * U), *recv = falloc(bf * U);
    int rc = -1;
    if (!send || !recv) {
        core_error("USP all-to-all: out of memory (%zu floats)", 2 * bf * U);
        goto out;
    }
    for (int j = 0; j < U; j++) {
        float *blk = send + j * bf;
        for (int t = 0; t < nx; t++, blk += d->xb)
            for (int b = 0; b < d->B; b++)
                memcpy(blk + (size_t)b * S_l * row, xg[t] + ((size_t)b * S_r + (size_t)j * S_l) * row,
                       S_l * row * sizeof(float));
        if (has_lse)
            for (int b = 0; b < d->B; b++)
                for (int hh = 0; hh < Hu; hh++)
                    memcpy(blk + ((size_t)b * Hu + hh) * S_l, lseg + ((size_t)b * Hu + hh) * S_r + (size_t)j * S_l,
                           S_l * sizeof(float));
    }
    if (sp_comm_all_to_all(c, send, recv, bf, SP_F32)) {
        core_error_push("USP all-to-all (to sequence): ");
        goto out;
    }
    for (int i = 0; i < U; i++) {
        const float *blk = recv + i * bf;
        for (int t = 0; t < nx; t++, blk += d->xb)
            for (int b = 0; b < d->B; b++)
                for (int s = 0; s < S_l; s++) {
                    float *dst = x[t] + (((size_t)b * S_l + s) * d->H + (size_t)i * Hu) * Dh;
                    const float *src = blk + ((size_t)b * S_l + s) * row;
                    if (accumulate)
                        for (size_t e = 0; e < row; e++) dst[e] += src[e];
                    else
                        memcpy(dst, src, row * sizeof(float));
                }
        if (has_lse)
            for (int b = 0; b < d->B; b++)
                for (int hh = 0; hh < Hu; hh++)
                    memcpy(lse + ((size_t)b * d->H + (size_t)i * Hu + hh) * S_l, blk + ((size_t)b * Hu + hh) * S_l,
                           S_l * sizeof(float));
    }
    rc = 0;
out:
    free(send);
    free(recv);
    return rc;
}

/* Ring neighbours: K/V travel from rank r to r+1, so at step s rank r holds block (r - s) mod R. */
static int ring_next(const sp_comm *c) { return (c->rank + 1) % c->size; }
static int ring_prev(const sp_comm *c) { return (c->rank + c->size - 1) % c->size; }

/* ---- forward ---- */

int sp_usp_forward(void *ctx, float *o, float *lse, const float *q, const float *k, const float *v, int B, int S,
                   int H, int Dh) {
    sp_usp *u = ctx;
    usp_dims d;
    if (dims_init(&d, u, B, S, H, Dh)) return -1;
    const k_ops *ops = u->ops ? u->ops : &k_cpu_ops;
    const size_t n = d.n, nl = (size_t)B * H * S;
    const float scale = usp_scale(Dh);
    /* qg | kv (k, v: the block in hand) | kv2 (the block arriving) | og | os | lseg | lses */
    float *ws = falloc(6 * n + n + 2 * nl);
    if (!ws) return core_error("USP attention forward: out of memory (%zu floats)", 7 * n + 2 * nl);
    float *qg = ws, *kv = qg + n, *kv2 = kv + 2 * n, *og = kv2 + 2 * n, *os = og + n, *lseg = os + n,
          *lses = lseg + nl;
    int rc = -1;

    const float *in[3] = {q, k, v};
    float *g[3] = {qg, kv, kv + n};
    if (to_heads(u->ulysses, &d, 3, in, g, NULL, NULL)) goto out;

    core_error_clear();
    ops->attention_forward(og, lseg, qg, kv, kv + n, B, d.S_r, d.S_r, d.Hu, Dh, scale);
    if (kernel_failed()) goto out;
    for (int s = 1; s < d.R; s++) {
        /* Block r-s arrives from r-1 while block r-s+1 leaves for r+1; this step uses the block that arrived. */
        if (sp_comm_sendrecv(u->ring, kv, 2 * n, ring_next(u->ring), kv2, 2 * n, ring_prev(u->ring), SP_F32)) {
            core_error_push("USP ring step %d of %d: ", s, d.R);
            goto out;
        }
        float *t = kv;
        kv = kv2, kv2 = t;
        core_error_clear();
        ops->attention_forward(os, lses, qg, kv, kv + n, B, d.S_r, d.S_r, d.Hu, Dh, scale);
        if (kernel_failed()) goto out;
        ops->lse_merge_forward(og, lseg, og, lseg, os, lses, B, d.S_r, d.Hu, Dh);
    }

    const float *outg[1] = {og};
    float *outl[1] = {o};
    if (to_seq(u->ulysses, &d, 1, outg, outl, lseg, lse, 0)) goto out;
    rc = 0;
out:
    free(ws);
    return rc ? core_error_push("USP attention forward (rank %d): ", u->me.global_rank) : 0;
}

/* ---- backward ---- */

int sp_usp_backward(void *ctx, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                    const float *v, const float *o, const float *lse, int B, int S, int H, int Dh) {
    sp_usp *u = ctx;
    usp_dims d;
    if (dims_init(&d, u, B, S, H, Dh)) return -1;
    const k_ops *ops = u->ops ? u->ops : &k_cpu_ops;
    const size_t n = d.n, nl = (size_t)B * H * S;
    const float scale = usp_scale(Dh);
    /* qg | og | dog | dqg | blk (k, v, dk_acc, dv_acc: in hand) | blk2 (arriving) | lseg */
    float *ws = falloc(12 * n + nl);
    if (!ws) return core_error("USP attention backward: out of memory (%zu floats)", 12 * n + nl);
    float *qg = ws, *og = qg + n, *dog = og + n, *dqg = dog + n, *blk = dqg + n, *blk2 = blk + 4 * n,
          *lseg = blk2 + 4 * n;
    int rc = -1;

    const float *in[5] = {q, k, v, o, dout};
    float *g[5] = {qg, blk, blk + n, og, dog};
    if (to_heads(u->ulysses, &d, 5, in, g, lse, lseg)) goto out;
    memset(dqg, 0, n * sizeof(float));
    memset(blk + 2 * n, 0, 2 * n * sizeof(float));

    for (int s = 0; s < d.R; s++) {
        if (s > 0) {
            /* (K, V, dK_acc, dV_acc) of block r-s arrive from r-1; those of block r-s+1 leave for r+1. */
            if (sp_comm_sendrecv(u->ring, blk, 4 * n, ring_next(u->ring), blk2, 4 * n, ring_prev(u->ring),
                                 SP_F32)) {
                core_error_push("USP ring backward step %d of %d: ", s, d.R);
                goto out;
            }
            float *t = blk;
            blk = blk2, blk2 = t;
        }
        core_error_clear();
        ops->attention_backward(dqg, blk + 2 * n, blk + 3 * n, dog, qg, blk, blk + n, og, lseg, B, d.S_r, d.S_r,
                                d.Hu, Dh, scale);
        if (kernel_failed()) goto out;
    }
    /* After step R-1 rank r holds the complete accumulators of block r+1: one hop home. */
    float *dkv = blk + 2 * n;
    if (d.R > 1) {
        if (sp_comm_sendrecv(u->ring, blk + 2 * n, 2 * n, ring_next(u->ring), blk2 + 2 * n, 2 * n,
                             ring_prev(u->ring), SP_F32)) {
            core_error_push("USP ring backward, final dK/dV hop: ");
            goto out;
        }
        dkv = blk2 + 2 * n;
    }

    const float *gg[3] = {dqg, dkv, dkv + n};
    float *gl[3] = {dq, dk, dv};
    if (to_seq(u->ulysses, &d, 3, gg, gl, NULL, NULL, 1)) goto out;
    rc = 0;
out:
    free(ws);
    return rc ? core_error_push("USP attention backward (rank %d): ", u->me.global_rank) : 0;
}

/* ---- groups ---- */

int sp_usp_init(sp_usp *u, sp_comm *world, const sp_topology *t, const k_ops *ops) {
    memset(u, 0, sizeof *u);
    if (!world) return core_error("USP groups: no world communicator");
    if (world->size != t->trainer_ranks)
        return core_error("USP groups: the MPI world has %d ranks but parallel.trainer_ranks is %d", world->size,
                          t->trainer_ranks);
    u->ops = ops ? ops : &k_cpu_ops;
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

void sp_usp_init_groups(sp_usp *u, sp_comm *sp, sp_comm *ulysses, sp_comm *ring, const k_ops *ops) {
    memset(u, 0, sizeof *u);
    u->ops = ops ? ops : &k_cpu_ops;
    u->sp = sp, u->ulysses = ulysses, u->ring = ring;
    u->me = (sp_rank_info){-1, -1, -1, -1, -1};
    if (ulysses && ring) {
        u->me.ulysses_rank = ulysses->rank, u->me.ring_rank = ring->rank;
        u->me.sp_rank = ring->rank * ulysses->size + ulysses->rank;
        u->me.global_rank = u->me.sp_rank; /* unknown here; messages name the SP rank */
    }
}

void sp_usp_release(sp_usp *u) {
    if (u->owns_groups) {
        sp_comm_destroy(u->ring);
        sp_comm_destroy(u->ulysses);
        sp_comm_destroy(u->sp);
    }
    memset(u, 0, sizeof *u);
}
