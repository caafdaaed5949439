/* tests/mpi/mpi_comm.c — case "comm": every sp_comm collective on the MPI world (any size), values checked exactly,
 * the argument errors, and the groups sp_usp_init splits off for every valid (sp, ulysses) on this world, checked
 * member by member against sp/topology's lists. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "sp/shard.h"
#include "sp/usp_attention.h"
#include "tests/mpi/mpi_cases.h"

enum { C = 3 };

static void collectives(sp_comm *w) {
    const int P = w->size, r = w->rank;
    float *send = calloc((size_t)P * C, sizeof(float)), *recv = calloc((size_t)P * C, sizeof(float));

    /* all-to-all: block j of rank r holds r*1000 + j*10 + e; rank r receives block r of every rank i. */
    for (int j = 0; j < P; j++)
        for (int e = 0; e < C; e++) send[j * C + e] = (float)(r * 1000 + j * 10 + e);
    MCHECK(sp_comm_all_to_all(w, send, recv, C, SP_F32) == 0, "all_to_all: %s", core_last_error());
    for (int i = 0; i < P; i++)
        for (int e = 0; e < C; e++)
            MCHECK(recv[i * C + e] == (float)(i * 1000 + r * 10 + e), "all_to_all: rank %d block %d elem %d = %g", r,
                   i, e, recv[i * C + e]);

    /* sendrecv as a ring shift: from r to r+1. */
    float mine[2] = {(float)r, (float)(r + 100)}, got[2] = {-1, -1};
    MCHECK(sp_comm_sendrecv(w, mine, 2, (r + 1) % P, got, 2, (r + P - 1) % P, SP_F32) == 0, "sendrecv: %s",
           core_last_error());
    MCHECK(got[0] == (float)((r + P - 1) % P) && got[1] == got[0] + 100, "sendrecv: rank %d got %g %g", r, got[0],
           got[1]);

    /* all-gather, F32 and I64. */
    float g2[2] = {(float)r, r + 0.5f};
    MCHECK(sp_comm_all_gather(w, g2, recv, 2, SP_F32) == 0, "all_gather: %s", core_last_error());
    for (int i = 0; i < P; i++) MCHECK(recv[2 * i] == i && recv[2 * i + 1] == i + 0.5f, "all_gather: block %d", i);
    int64_t big = ((int64_t)1 << 40) + r, *all = calloc((size_t)P, sizeof(int64_t));
    MCHECK(sp_comm_all_gather(w, &big, all, 1, SP_I64) == 0, "all_gather I64: %s", core_last_error());
    for (int i = 0; i < P; i++) MCHECK(all[i] == ((int64_t)1 << 40) + i, "all_gather I64: block %d", i);
    free(all);

    /* reduce-scatter: block j of rank r holds r + j + e; rank r gets sum_i (i + r + e). */
    for (int j = 0; j < P; j++)
        for (int e = 0; e < C; e++) send[j * C + e] = (float)(r + j + e);
    MCHECK(sp_comm_reduce_scatter(w, send, recv, C, SP_F32) == 0, "reduce_scatter: %s", core_last_error());
    for (int e = 0; e < C; e++)
        MCHECK(recv[e] == (float)(P * (P - 1) / 2 + P * (r + e)), "reduce_scatter: elem %d = %g", e, recv[e]);

    /* all-reduce, out of place and in place. */
    for (int e = 0; e < C; e++) send[e] = (float)(r * e + 1);
    MCHECK(sp_comm_all_reduce(w, send, recv, C, SP_F32) == 0, "all_reduce: %s", core_last_error());
    for (int e = 0; e < C; e++) MCHECK(recv[e] == (float)(e * P * (P - 1) / 2 + P), "all_reduce: elem %d", e);
    MCHECK(sp_comm_all_reduce(w, send, send, C, SP_F32) == 0, "all_reduce in place: %s", core_last_error());
    for (int e = 0; e < C; e++) MCHECK(send[e] == recv[e], "all_reduce in place: elem %d", e);
    MCHECK(sp_comm_barrier(w) == 0, "barrier: %s", core_last_error());

    /* broadcast from the last rank: bytes. */
    uint8_t bb[5];
    for (int e = 0; e < 5; e++) bb[e] = (uint8_t)(r == P - 1 ? 200 + e : 0);
    MCHECK(sp_comm_broadcast(w, bb, 5, SP_U8, P - 1) == 0, "broadcast: %s", core_last_error());
    for (int e = 0; e < 5; e++) MCHECK(bb[e] == 200 + e, "broadcast: byte %d = %d", e, bb[e]);
    MCHECK(sp_comm_broadcast(w, bb, 5, SP_U8, P) == -1 && strstr(core_last_error(), "root"), "broadcast: bad root accepted");

    /* Argument errors come back with messages (nothing is sent, so no peer waits). */
    MCHECK(sp_comm_sendrecv(w, mine, 1, P, got, 1, 0, SP_F32) == -1 && strstr(core_last_error(), "peer out of range"),
           "sendrecv to rank P: %s", core_last_error());
    int64_t i64 = 1;
    MCHECK(sp_comm_all_reduce(w, &i64, &i64, 1, SP_I64) == -1 && strstr(core_last_error(), "F32 only"),
           "all_reduce I64: %s", core_last_error());
    MCHECK(sp_comm_split(w, -1, 0, NULL, &(sp_comm *){NULL}) == -1 && strstr(core_last_error(), "colour"),
           "split colour -1: %s", core_last_error());

    /* split by parity, reversed order: the group of rank r is {q : q % 2 == r % 2}, rank within by descending q. */
    sp_comm *half = NULL;
    MCHECK(sp_comm_split(w, r % 2, -r, "parity", &half) == 0, "split: %s", core_last_error());
    if (half) {
        int n = (P - r % 2 + 1) / 2;
        MCHECK(half->size == n, "split: size %d, expected %d", half->size, n);
        float me = (float)r;
        MCHECK(sp_comm_all_gather(half, &me, recv, 1, SP_F32) == 0, "split all_gather: %s", core_last_error());
        for (int i = 0; i < half->size; i++) {
            int expect = r % 2 + 2 * (n - 1 - i);
            MCHECK(recv[i] == (float)expect, "split: member %d is %g, expected %d", i, recv[i], expect);
        }
        MCHECK(!strcmp(half->name, "parity"), "split name %s", half->name);
        sp_comm_destroy(half);
    }
    free(send);
    free(recv);
}

/* One group of u against the topology's member list: all-gather the global ranks in group order. */
static void check_group(sp_comm *g, const int *expect, int n, int my_rank_within, const char *what, int sp, int ul) {
    MCHECK(g && g->size == n, "sp %d u %d: %s group size %d, expected %d", sp, ul, what, g ? g->size : -1, n);
    if (!g || g->size != n) return;
    MCHECK(g->rank == my_rank_within, "sp %d u %d: %s rank %d, expected %d", sp, ul, what, g->rank, my_rank_within);
    float *got = calloc((size_t)n, sizeof(float)), me = 0;
    int world_rank = expect[my_rank_within];
    me = (float)world_rank;
    MCHECK(sp_comm_all_gather(g, &me, got, 1, SP_F32) == 0, "%s all_gather: %s", what, core_last_error());
    for (int i = 0; i < n; i++)
        MCHECK(got[i] == (float)expect[i], "sp %d u %d: %s member %d is %g, expected %d", sp, ul, what, i, got[i],
               expect[i]);
    free(got);
}

static void groups(sp_comm *w) {
    const int P = w->size;
    int *list = calloc((size_t)P, sizeof(int));
    for (int sp = 1; sp <= P; sp++) {
        if (P % sp) continue;
        for (int ul = 1; ul <= sp; ul++) {
            if (sp % ul) continue;
            sp_topology t;
            if (sp_topology_init(&t, P, sp, ul)) {
                MCHECK(0, "topology %d %d %d: %s", P, sp, ul, core_last_error());
                continue;
            }
            sp_usp u;
            if (sp_usp_init(&u, w, &t, NULL)) {
                MCHECK(0, "sp_usp_init sp %d u %d: %s", sp, ul, core_last_error());
                continue;
            }
            sp_rank_info me = sp_topology_rank(&t, w->rank);
            MCHECK(u.me.global_rank == w->rank && u.me.sp_rank == me.sp_rank, "sp %d u %d: coordinates", sp, ul);
            int n = sp_topology_sp_group(&t, w->rank, list);
            check_group(u.sp, list, n, me.sp_rank, "SP", sp, ul);
            n = sp_topology_ulysses_group(&t, w->rank, list);
            check_group(u.ulysses, list, n, me.ulysses_rank, "Ulysses", sp, ul);
            n = sp_topology_ring_group(&t, w->rank, list);
            check_group(u.ring, list, n, me.ring_rank, "ring", sp, ul);
            sp_usp_release(&u);
        }
    }
    /* World size differs from trainer_ranks: refused before any split. */
    sp_topology t;
    sp_usp u;
    if (sp_topology_init(&t, 2 * P, 1, 1) == 0)
        MCHECK(sp_usp_init(&u, w, &t, NULL) == -1 && strstr(core_last_error(), "trainer_ranks"),
               "world size check: %s", core_last_error());
    free(list);
}

/* The world as one SP group: shard a known [B, S, W] tensor, gather it back exactly; the gather's backward takes
 * this rank's rows (accumulating). */
static void shard_gather(sp_comm *w) {
    const int B = 2, S_l = 5, W = 3, P = w->size, S = P * S_l;
    const size_t nf = (size_t)B * S * W, nl = (size_t)B * S_l * W;
    float *full = malloc(nf * 4), *back = calloc(nf, 4), *loc = malloc(nl * 4), *dl = malloc(nl * 4);
    for (size_t i = 0; i < nf; i++) full[i] = (float)i; /* element (b, s, c) = (b*S + s)*W + c */
    sp_shard_rows(loc, full, B, S_l, W, P, w->rank);
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S_l; s++)
            MCHECK(loc[((size_t)b * S_l + s) * W] == (float)(((size_t)b * S + w->rank * S_l + s) * W),
                   "shard: rank %d b %d row %d", w->rank, b, s);
    MCHECK(sp_gather_rows(w, back, loc, B, S_l, W) == 0, "gather: %s", core_last_error());
    MCHECK(!memcmp(back, full, nf * 4), "gather: rank %d: not the full tensor", w->rank);
    for (size_t i = 0; i < nl; i++) dl[i] = 1.0f;
    sp_gather_rows_backward(dl, full, B, S_l, W, P, w->rank);
    for (size_t i = 0; i < nl; i++) MCHECK(dl[i] == loc[i] + 1.0f, "gather backward: rank %d elem %zu", w->rank, i);
    free(full), free(back), free(loc), free(dl);
}

int mpi_case_comm(sp_comm *world, int argc, char **argv) {
    collectives(world);
    shard_gather(world);
    groups(world);
    return 0;
}
