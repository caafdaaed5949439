/* sp/comm.h — the collectives sequence parallelism needs, behind one interface.
 *
 * (The trainer's data parallelism uses the same interface: broadcast of a batch, all-reduce of gradients.)
 * An sp_comm is a group of ranks with a table of operations. Two implementations exist now:
 *   - MPI on host (CPU) memory (sp_comm_mpi_world, sp/comm_mpi.c), the trainer's CPU path and the tests;
 *   - "self", a group of one rank (sp_comm_self), so sp = 1 runs the same code without MPI;
 *   - NCCL on device memory (sp_comm_nccl_world, sp/comm_nccl.h): the GPU path's trainer ranks, its unique id sent
 *     over an MPI (host) group at start-up, the library loaded at run time.
 * Callers only use the sp_comm_* functions below, never MPI or NCCL directly.
 *
 * Conventions:
 * - Buffers hold `count` elements of `dtype` (counts are elements, not bytes). For the collectives with one block
 *   per rank (all-to-all, all-gather, reduce-scatter) `count` is the size of ONE block and the big buffer holds
 *   size * count elements, block r for rank r.
 * - Reductions are sums, F32 only. An implementation must be deterministic: the same inputs on the same group give
 *   bit-identical results, run after run (OpenMPI's reduction algorithm is fixed for a given group size and count).
 * - Every function returns 0, or -1 with core_error naming the operation, the group and the cause. A failure is
 *   not recoverable on the group (peers may be blocked); the caller reports and exits.
 * - Every call is collective over the group except sendrecv, which pairs with the matching sendrecv of the peers.
 */
#ifndef SP_COMM_H
#define SP_COMM_H

#include <stddef.h>
#include <stdint.h>

typedef enum { SP_F32 = 0, SP_I64 = 1, SP_U8 = 2 } sp_dtype;

/* Bytes of one element of dtype (0 for an unknown value). */
size_t sp_dtype_size(sp_dtype dtype);

typedef struct sp_comm sp_comm;

/* The operation table an implementation fills. Arguments as in the sp_comm_* wrappers below (which check the
 * common preconditions first, so implementations can assume count sizes fit and ranks are in range). */
typedef struct sp_comm_ops {
    int (*all_to_all)(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype);
    int (*sendrecv)(sp_comm *c, const void *send, size_t send_count, int dest, void *recv, size_t recv_count,
                    int source, sp_dtype dtype);
    int (*all_gather)(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype);
    int (*reduce_scatter)(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype);
    int (*all_reduce)(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype);
    int (*barrier)(sp_comm *c);
    int (*broadcast)(sp_comm *c, void *buf, size_t count, sp_dtype dtype, int root);
    int (*split)(sp_comm *c, int colour, int key, const char *name, sp_comm **out);
    void (*destroy)(sp_comm *c);
    /* Optional (NULL: comm_ranges.c's host path, built on sendrecv and host memcpy): the ranges collectives below,
     * same contract, for an implementation whose buffers the host cannot touch (NCCL's device memory). */
    int (*reduce_scatter_ranges)(sp_comm *c, float *buf, const int64_t *offs);
    int (*all_gather_ranges)(sp_comm *c, void *buf, const int64_t *offs, sp_dtype dtype);
    int (*gather_ranges)(sp_comm *c, const void *mine, void *all, const int64_t *offs, sp_dtype dtype, int root);
    /* Optional (NULL: split, the group having no stream): sp_comm_dup_stream. */
    int (*dup_stream)(sp_comm *c, void *stream, const char *name, sp_comm **out);
} sp_comm_ops;

struct sp_comm {
    const sp_comm_ops *ops;
    int rank;          /* this rank within the group */
    int size;          /* ranks in the group */
    char name[48];     /* for messages: "world", "ulysses", "ring", ... */
    void *impl;        /* implementation state (an MPI_Comm; an ncclComm_t with its stream and scratch) */
};

/* A group of one rank on host memory: all-to-all, all-gather, reduce-scatter and all-reduce copy send to recv,
 * sendrecv with itself copies, split returns another self group. Returns NULL only when out of memory. */
sp_comm *sp_comm_self(const char *name);

/* MPI: initialises MPI (MPI_Init_thread, MPI_THREAD_FUNNELED; a no-op when already initialised) and returns the
 * world group: a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so failures come back as -1. argc/argv may
 * be NULL. -1 with core_error. */
int sp_comm_mpi_world(int *argc, char ***argv, sp_comm **out);
/* MPI_Finalize if MPI is initialised and not finalised. Call after destroying every sp_comm. */
void sp_comm_mpi_finalize(void);

/* all-to-all: send holds size blocks of count elements, block j goes to rank j; recv gets block i from rank i
 * (the block this rank sent itself is copied). send and recv must not overlap. */
int sp_comm_all_to_all(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype);
/* Sends send_count elements to dest and receives recv_count elements from source at the same time (a ring shift
 * when every rank sends to rank+1 and receives from rank-1). dest == source == rank copies. No overlap. */
int sp_comm_sendrecv(sp_comm *c, const void *send, size_t send_count, int dest, void *recv, size_t recv_count,
                     int source, sp_dtype dtype);
/* all-gather: recv [size * count] gets rank i's send [count] as block i. */
int sp_comm_all_gather(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype);
/* reduce-scatter (sum, F32): send [size * count]; recv [count] = sum over ranks of their block `rank`. */
int sp_comm_reduce_scatter(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype);
/* all-reduce (sum, F32): recv [count] = sum over ranks of send; send == recv reduces in place. */
int sp_comm_all_reduce(sp_comm *c, const void *send, void *recv, size_t count, sp_dtype dtype);
int sp_comm_barrier(sp_comm *c);
/* broadcast: buf [count] of rank `root` is copied into every rank's buf (any dtype). */
int sp_comm_broadcast(sp_comm *c, void *buf, size_t count, sp_dtype dtype, int root);
/* Splits c: ranks passing the same colour (>= 0) form one new group, ordered by key (ties by rank in c). The new
 * group is named `name` (NULL: c's name). Collective over c. */
int sp_comm_split(sp_comm *c, int colour, int key, const char *name, sp_comm **out);
/* A new group of the same ranks in the same order (collective over c), named `name`, whose device work is enqueued
 * on `stream` (a k_dev_ops stream, kernels/dev_ops.h; NULL: the device table's own): the NCCL group's calls and its
 * exact reduction's block_sum. Its own scratch, and its own communicator, so that its collectives may run on that
 * stream beside c's (trainer/dp/dp_bucket.h: the gradient buckets reduced during the backward). Groups without a
 * stream (MPI and self, on host memory, synchronous) give a split of c. -1 with core_error. */
int sp_comm_dup_stream(sp_comm *c, void *stream, const char *name, sp_comm **out);
/* Frees c (NULL allowed). For MPI this is MPI_Comm_free, collective over the group (the world group too: it is a
 * duplicate of MPI_COMM_WORLD). */
void sp_comm_destroy(sp_comm *c);

/* ---- Ranges of one flat buffer (sp/comm_ranges.c; the trainer's ZeRO shards, trainer/dp/zero.h) ----
 * offs [size + 1]: rank r owns [offs[r], offs[r + 1]) of a buffer of offs[size] elements (offs[0] = 0, ascending;
 * a range may be empty, and ranges need not be equal). Built on sendrecv alone (pairwise exchanges in rounds of at
 * most SP_RANGE_PIECE elements per peer), so every implementation of the table has them with the same arithmetic.
 * The sums are in RANK ORDER, whatever the MPI library: element i is ((x_0 + x_1) + x_2) + ... + x_{size-1} in
 * fp32, x_r being rank r's value, so the result does not depend on which rank owns i nor on the group's algorithm
 * choices (MPI_Allreduce's order depends on the group and message size: OpenMPI 4.1 adds 2 and 3 ranks in rank
 * order but 4 as (x_0 + x_1) + (x_2 + x_3)). Collective over the group; -1 with core_error naming the operation. */
#define SP_RANGE_PIECE ((int64_t)1 << 18)

/* In place, F32: buf [offs[size]] on every rank; afterwards this rank's range holds the rank-order sum of every
 * rank's values there; the rest of buf is unchanged. Scratch: size x SP_RANGE_PIECE floats. */
int sp_comm_reduce_scatter_ranges(sp_comm *c, float *buf, const int64_t *offs);
/* In place, any dtype: every rank's buf [offs[size]] gets rank r's range [offs[r], offs[r+1]) from rank r. */
int sp_comm_all_gather_ranges(sp_comm *c, void *buf, const int64_t *offs, sp_dtype dtype);
/* To one rank, any dtype: mine [offs[rank + 1] - offs[rank]] is this rank's range; on root, all [offs[size]] gets
 * every rank's (root's own copied); all is not touched elsewhere (may be NULL there). */
int sp_comm_gather_ranges(sp_comm *c, const void *mine, void *all, const int64_t *offs, sp_dtype dtype, int root);
/* In place, F32: buf [n] = the rank-order sum over the group (sp_comm_reduce_scatter_ranges over an even split,
 * then sp_comm_all_gather_ranges): the same bits as reduce-scattering with any other ranges. */
int sp_comm_all_reduce_ordered(sp_comm *c, float *buf, int64_t n);

#endif
