/* sp/comm.c — the sp_comm wrappers (argument checks shared by every implementation) and the one-rank "self"
 * implementation. The MPI implementation is in comm_mpi.c. */
#include "sp/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

size_t sp_dtype_size(sp_dtype dtype) {
    switch (dtype) {
    case SP_F32: return 4;
    case SP_I64: return 8;
    case SP_U8: return 1;
    }
    return 0;
}

static int check(sp_comm *c, const char *op, sp_dtype dtype, int reduce) {
    if (!c || !c->ops) return core_error("%s: no communicator", op);
    if (!sp_dtype_size(dtype)) return core_error("%s on group %s: unknown dtype %d", op, c->name, (int)dtype);
    if (reduce && dtype != SP_F32)
        return core_error("%s on group %s: sums are F32 only (dtype %d)", op, c->name, (int)dtype);
    return 0;
}

int sp_comm_all_to_all(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype) {
    if (check(c, "all_to_all", dtype, 0)) return -1;
    return count ? c->ops->all_to_all(c, send, recv, count, dtype) : 0;
}

int sp_comm_sendrecv(sp_comm *c, const void *send, size_t send_count, int dest, void *recv, size_t recv_count,
                     int source, sp_dtype dtype) {
    if (check(c, "sendrecv", dtype, 0)) return -1;
    if (dest < 0 || dest >= c->size || source < 0 || source >= c->size)
        return core_error("sendrecv on group %s (size %d): peer out of range (dest %d, source %d)", c->name, c->size,
                          dest, source);
    return c->ops->sendrecv(c, send, send_count, dest, recv, recv_count, source, dtype);
}

int sp_comm_all_gather(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype) {
    if (check(c, "all_gather", dtype, 0)) return -1;
    return count ? c->ops->all_gather(c, send, recv, count, dtype) : 0;
}

int sp_comm_reduce_scatter(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype) {
    if (check(c, "reduce_scatter", dtype, 1)) return -1;
    return count ? c->ops->reduce_scatter(c, send, recv, count, dtype) : 0;
}

int sp_comm_all_reduce(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype) {
    if (check(c, "all_reduce", dtype, 1)) return -1;
    return count ? c->ops->all_reduce(c, send, recv, count, dtype) : 0;
}

int sp_comm_barrier(sp_comm *c) {
    if (!c || !c->ops) return core_error("barrier: no communicator");
    return c->ops->barrier(c);
}

int sp_comm_broadcast(sp_comm *c, void *buf, size_t count, sp_dtype dtype, int root) {
    if (check(c, "broadcast", dtype, 0)) return -1;
    if (root < 0 || root >= c->size)
        return core_error("broadcast on group %s: root %d outside 0..%d", c->name, root, c->size - 1);
    return count ? c->ops->broadcast(c, buf, count, dtype, root) : 0;
}

int sp_comm_split(sp_comm *c, int colour, int key, const char *name, sp_comm **out) {
    *out = NULL;
    if (!c || !c->ops) return core_error("split: no communicator");
    if (colour < 0) return core_error("split of group %s: colour must be >= 0, got %d", c->name, colour);
    return c->ops->split(c, colour, key, name ? name : c->name, out);
}

int sp_comm_dup_stream(sp_comm *c, void *stream, const char *name, sp_comm **out) {
    *out = NULL;
    if (!c || !c->ops) return core_error("dup_stream: no communicator");
    if (c->ops->dup_stream) return c->ops->dup_stream(c, stream, name ? name : c->name, out);
    return c->ops->split(c, 0, c->rank, name ? name : c->name, out);
}

void sp_comm_destroy(sp_comm *c) {
    if (c && c->ops) c->ops->destroy(c);
}

/* ---- self: a group of one rank ---- */

static int self_copy(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype) {
    if (send != recv) memmove(recv, send, count * sp_dtype_size(dtype));
    return 0;
}

static int self_sendrecv(sp_comm *c, const void *send, size_t send_count, int dest, void *recv, size_t recv_count,
                         int source, sp_dtype dtype) {
    if (send_count != recv_count)
        return core_error("sendrecv on group %s: sending %zu elements to itself but receiving %zu", c->name,
                          send_count, recv_count);
    return self_copy(c, send, recv, send_count, dtype);
}

static int self_barrier(sp_comm *c) { return 0; }
static int self_broadcast(sp_comm *c, void *buf, size_t count, sp_dtype dtype, int root) { return 0; }

static int self_split(sp_comm *c, int colour, int key, const char *name, sp_comm **out) {
    *out = sp_comm_self(name);
    return *out ? 0 : core_error("split of group %s: out of memory", c->name);
}

static void self_destroy(sp_comm *c) { free(c); }

static const sp_comm_ops self_ops = {self_copy, self_sendrecv, self_copy, self_copy, self_copy,
                                     self_barrier, self_broadcast, self_split, self_destroy, NULL, NULL, NULL,
                                     NULL};

sp_comm *sp_comm_self(const char *name) {
    sp_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->ops = &self_ops;
    c->rank = 0;
    c->size = 1;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "self");
    return c;
}
