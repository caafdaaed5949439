/* sp/comm_nccl.h — the comm table (sp/comm.h) on NCCL, for device buffers: the GPU path's trainer ranks (data
 * parallelism's gradient reduction, ZeRO's ranges, Ulysses' all-to-all, the ring's send/recv, broadcasts).
 *
 * The library is loaded at run time (dlopen of $VGRPO_NCCL_LIB when set, else the soname libnccl.so.2), as
 * kernels/cuda/dynload.c loads cuBLASLt and cuDNN: the plain build carries this file but no NCCL, and a test can
 * substitute a library (tests/fake_nccl/: NCCL's calls over MPI on host memory, checked against NCCL's contract).
 * NCCL 2.18 or later (ncclCommSplit).
 *
 * Every operation is enqueued on one stream, the kernels' (k_cuda_stream(); NULL on the emulated device), and returns
 * without waiting, like the device table's entries; barrier waits for the stream (mem_sync). Buffers are the device
 * table's memory (k_dev_ops.mem_alloc). Operations:
 *   all_to_all, sendrecv      grouped ncclSend / ncclRecv (a rank's own block too: NCCL copies to itself)
 *   all_gather, broadcast     ncclAllGather, ncclBroadcast (in place)
 *   barrier                   ncclAllReduce of one float, then the stream waited for
 *   split                     ncclCommSplit (same stream, device table and reduction)
 *   dup_stream                ncclCommSplit of every rank (colour 0, key rank) whose calls, and whose exact
 *                             reduction's block_sum (the table's stream_use), go to a second stream: the gradient
 *                             buckets reduced during the backward (trainer/dp/dp_bucket.h)
 *   reduce_scatter, all_reduce, and the ranges collectives (reduce_scatter_ranges, all_gather_ranges, gather_ranges,
 *   so sp_comm_all_reduce_ordered too):
 *     SP_REDUCE_EXACT (default): the sums of sp/comm_ranges.c, in rank order: each rank's values of this rank's range
 *       arrive by grouped send/recv (an all-to-all of the blocks) in rounds of at most `piece` elements per peer,
 *       into device scratch of size x piece floats; the device table's block_sum adds them in rank order
 *       (kernels/body/kb_blocksum.h). The same bits as the MPI path's sp_comm_reduce_scatter_ranges and
 *       sp_comm_all_reduce_ordered for the same inputs, at every rank count; all_reduce (count n) is the
 *       reduce-scatter of the even split n r / size followed by an all-gather, as sp_comm_all_reduce_ordered.
 *       reduce_scatter with equal blocks is the same with offs r x count.
 *     SP_REDUCE_NCCL (recipe parallel.reduce: nccl): ncclReduceScatter, ncclAllReduce, ncclReduce per range: NCCL's
 *       own order (rings, trees, their chunking): deterministic on one group, but not the same bits across rank
 *       counts nor as the CPU path's. The all-gathers are exact in both modes.
 * A failure is -1 with core_error naming the operation, the group and NCCL's message (ncclGetLastError).
 *
 * Use (the trainer's device path): after k_cuda_init has picked the rank's GPU,
 *     sp_nccl_opts o = {.stream = k_cuda_stream(), .dev = dev, .reduce = (sp_reduce_mode)r->choice.reduce};
 *     sp_comm_nccl_world(mpi_group_of_the_trainer_ranks, &o, &nccl);
 * then the sp_comm_* calls (sp_comm_all_reduce_ordered for the gradients, the ranges ones for ZeRO) on device
 * buffers, as the CPU path makes them on host buffers. On the emulated device (host memory) the same code runs over
 * the fake NCCL: VGRPO_NCCL_LIB=$(BUILD)/libfake_nccl.so. */
#ifndef SP_COMM_NCCL_H
#define SP_COMM_NCCL_H

#include <stdint.h>

#include "kernels/dev_ops.h"
#include "sp/comm.h"

typedef enum { SP_REDUCE_EXACT = 0, SP_REDUCE_NCCL = 1 } sp_reduce_mode; /* core_reduce_mode's values */

/* Elements per peer and round of the exact reduction: scratch is size x this many floats (4 ranks: 64 MiB). */
#define SP_NCCL_PIECE ((int64_t)1 << 22)

typedef struct sp_nccl_opts {
    void *stream;          /* the cudaStream_t every call is enqueued on: k_cuda_stream() (NULL in a plain build) */
    const k_dev_ops *dev;  /* the device the buffers live on: scratch (mem_alloc), block_sum, mem_sync */
    sp_reduce_mode reduce; /* SP_REDUCE_EXACT or SP_REDUCE_NCCL */
    int64_t piece;         /* elements per peer and round of the exact reduction (0: SP_NCCL_PIECE) */
} sp_nccl_opts;

/* Loads NCCL once ($VGRPO_NCCL_LIB, else libnccl.so.2) and checks its version (>= 2.18). 0, or -1 with core_error
 * naming the library and dlerror's reason or the version found. */
int sp_nccl_load(void);
/* The file loaded ("" before sp_nccl_load) and ncclGetVersion's answer (0 before). */
const char *sp_nccl_lib_path(void);
int sp_nccl_version(void);

/* The NCCL group of the ranks of `host`, an sp_comm over host memory with the same ranks (the MPI world, a split of
 * it, or sp_comm_self for one rank): loads NCCL on every rank (all refuse when one cannot), makes the unique id on
 * host's rank 0, broadcasts it over host, and ncclCommInitRank(host->size, id, host->rank) on the current CUDA device.
 * The group is named "nccl-<host's name>"; host is only used here. Collective over host. 0, or -1 with core_error
 * (*out NULL). */
int sp_comm_nccl_world(sp_comm *host, const sp_nccl_opts *opts, sp_comm **out);

/* 1 when c is an NCCL group (its buffers are device memory). */
int sp_comm_is_nccl(const sp_comm *c);

#endif
