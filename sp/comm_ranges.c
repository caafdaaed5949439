/* sp/comm_ranges.c — collectives over uneven ranges of one flat buffer, summing in rank order (see sp/comm.h,
 * "Ranges of one flat buffer"). The trainer's ZeRO stages (trainer/dp/zero.h) shard the gradients and the AdamW state
 * this way and must equal its all-reduce bit for bit, so the all-reduce of the gradients is built from the same
 * reduce-scatter (sp_comm_all_reduce_ordered) instead of MPI_Allreduce, whose summation order is the library's.
 *
 * Everything is a sequence of rounds; in round t every rank exchanges piece t (at most SP_RANGE_PIECE elements) of
 * the ranges involved with every peer, pairwise: for s = 1 .. size-1, send to rank + s, receive from rank - s (mod
 * size), one sp_comm_sendrecv each. The number of rounds follows from offs alone, so every rank runs the same ones;
 * a piece that is empty on one side is exchanged as 0 elements. The volume is that of a ring: each rank sends and
 * receives (size - 1) / size of the buffer per reduce-scatter or all-gather.
 * An implementation on memory the host cannot touch (NCCL's device buffers) brings its own versions through the
 * table's optional entries (sp/comm.h), with the same sums in the same order (sp/comm_nccl.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "sp/comm.h"

static int64_t len_of(const int64_t *offs, int r) { return offs[r + 1] - offs[r]; }

/* Piece t of a range of length len: [t P, min(len, (t + 1) P)) relative to its start; *count 0 past its end. */
static void piece(int64_t len, int64_t t, int64_t P, int64_t *start, int64_t *count) {
    *start = t * P;
    const int64_t left = len - *start;
    *count = left <= 0 ? 0 : left < P ? left : P;
}

/* Rounds needed for the longest range. */
static int64_t rounds(const int64_t *offs, int size, int64_t P) {
    int64_t m = 0;
    for (int r = 0; r < size; r++) m = len_of(offs, r) > m ? len_of(offs, r) : m;
    return (m + P - 1) / P;
}

static int check_offs(sp_comm *c, const char *op, const int64_t *offs) {
    if (!c || !c->ops) return core_error("%s: no communicator", op);
    if (!offs || offs[0] != 0) return core_error("%s on group %s: ranges must start at 0", op, c->name);
    for (int r = 0; r < c->size; r++)
        if (offs[r + 1] < offs[r])
            return core_error("%s on group %s: range of rank %d is [%lld, %lld)", op, c->name, r, (long long)offs[r],
                              (long long)offs[r + 1]);
    return 0;
}

int sp_comm_reduce_scatter_ranges(sp_comm *c, float *buf, const int64_t *offs) {
    if (check_offs(c, "reduce_scatter_ranges", offs)) return -1;
    const int size = c->size, me = c->rank;
    if (size == 1) return 0;
    if (c->ops->reduce_scatter_ranges) return c->ops->reduce_scatter_ranges(c, buf, offs);
    const int64_t P = SP_RANGE_PIECE, R = rounds(offs, size, P), mylen = len_of(offs, me);
    float *tmp = malloc(sizeof(float) * (size_t)P * (size_t)size); /* slot r: rank r's values of my piece */
    if (!tmp) return core_error("reduce_scatter_ranges on group %s: out of memory", c->name);
    int rc = 0;
    for (int64_t t = 0; t < R && !rc; t++) {
        int64_t mine0, mine;
        piece(mylen, t, P, &mine0, &mine);
        float *own = buf + offs[me] + mine0;
        for (int s = 1; s < size && !rc; s++) {
            const int dst = (me + s) % size, src = (me - s + size) % size;
            int64_t d0, dn;
            piece(len_of(offs, dst), t, P, &d0, &dn);
            rc = sp_comm_sendrecv(c, buf + offs[dst] + d0, (size_t)dn, dst, tmp + (size_t)src * P, (size_t)mine, src,
                                  SP_F32);
        }
        if (rc || mine == 0) continue;
        memcpy(tmp + (size_t)me * P, own, sizeof(float) * (size_t)mine);
        /* ((x_0 + x_1) + x_2) + ...: rank order, element by element */
        memcpy(own, tmp, sizeof(float) * (size_t)mine);
        for (int r = 1; r < size; r++) {
            const float *x = tmp + (size_t)r * P;
            for (int64_t i = 0; i < mine; i++) own[i] += x[i];
        }
    }
    free(tmp);
    return rc ? core_error_push("reduce_scatter_ranges: ") : 0;
}

int sp_comm_all_gather_ranges(sp_comm *c, void *buf, const int64_t *offs, sp_dtype dtype) {
    if (check_offs(c, "all_gather_ranges", offs)) return -1;
    const size_t es = sp_dtype_size(dtype);
    if (!es) return core_error("all_gather_ranges on group %s: unknown dtype %d", c->name, (int)dtype);
    const int size = c->size, me = c->rank;
    if (size == 1) return 0;
    if (c->ops->all_gather_ranges) return c->ops->all_gather_ranges(c, buf, offs, dtype);
    const int64_t P = SP_RANGE_PIECE * 64, R = rounds(offs, size, P); /* no scratch: pieces only bound MPI's count */
    uint8_t *b = buf;
    for (int64_t t = 0; t < R; t++) {
        int64_t m0, mn;
        piece(len_of(offs, me), t, P, &m0, &mn);
        for (int s = 1; s < size; s++) {
            const int dst = (me + s) % size, src = (me - s + size) % size;
            int64_t r0, rn;
            piece(len_of(offs, src), t, P, &r0, &rn);
            if (sp_comm_sendrecv(c, b + (size_t)(offs[me] + m0) * es, (size_t)mn, dst, b + (size_t)(offs[src] + r0) * es,
                                 (size_t)rn, src, dtype))
                return core_error_push("all_gather_ranges: ");
        }
    }
    return 0;
}

int sp_comm_gather_ranges(sp_comm *c, const void *mine, void *all, const int64_t *offs, sp_dtype dtype, int root) {
    if (check_offs(c, "gather_ranges", offs)) return -1;
    const size_t es = sp_dtype_size(dtype);
    if (!es) return core_error("gather_ranges on group %s: unknown dtype %d", c->name, (int)dtype);
    if (root < 0 || root >= c->size) return core_error("gather_ranges on group %s: root %d", c->name, root);
    if (c->ops->gather_ranges) return c->ops->gather_ranges(c, mine, all, offs, dtype, root);
    const int64_t P = SP_RANGE_PIECE * 64;
    const int me = c->rank;
    uint8_t none = 0;
    if (me == root) {
        memcpy((uint8_t *)all + (size_t)offs[me] * es, mine, (size_t)len_of(offs, me) * es);
        for (int r = 0; r < c->size; r++) { /* rank by rank, each range piece by piece */
            if (r == root) continue;
            const int64_t R = (len_of(offs, r) + P - 1) / P;
            for (int64_t t = 0; t < R; t++) {
                int64_t r0, rn;
                piece(len_of(offs, r), t, P, &r0, &rn);
                if (sp_comm_sendrecv(c, &none, 0, r, (uint8_t *)all + (size_t)(offs[r] + r0) * es, (size_t)rn, r, dtype))
                    return core_error_push("gather_ranges: ");
            }
        }
        return 0;
    }
    const int64_t R = (len_of(offs, me) + P - 1) / P;
    for (int64_t t = 0; t < R; t++) {
        int64_t m0, mn;
        piece(len_of(offs, me), t, P, &m0, &mn);
        if (sp_comm_sendrecv(c, (const uint8_t *)mine + (size_t)m0 * es, (size_t)mn, root, &none, 0, root, dtype))
            return core_error_push("gather_ranges: ");
    }
    return 0;
}

int sp_comm_all_reduce_ordered(sp_comm *c, float *buf, int64_t n) {
    if (!c || !c->ops) return core_error("all_reduce_ordered: no communicator");
    if (c->size == 1 || n <= 0) return 0;
    int64_t *offs = malloc(sizeof(int64_t) * (size_t)(c->size + 1));
    if (!offs) return core_error("all_reduce_ordered on group %s: out of memory", c->name);
    for (int r = 0; r <= c->size; r++) offs[r] = n * r / c->size;
    const int rc = sp_comm_reduce_scatter_ranges(c, buf, offs) || sp_comm_all_gather_ranges(c, buf, offs, SP_F32);
    free(offs);
    return rc ? -1 : 0;
}
