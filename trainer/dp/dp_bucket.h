/* trainer/dp/dp_bucket.h — the gradient reduction overlapping the backward on the device path with several trainer
 * ranks (recipe parallel.grad_bucket_mib > 0): the trained gradients (the model's, or its LoRA adapter's) are cut into
 * buckets of whole DiT blocks, and each bucket is reduced over the trainer ranks as soon as the backward has made its
 * gradients final, while the backward goes on with the blocks before it, as PyTorch DDP's buckets (25 MiB there too).
 *
 * When: the backward runs the blocks last to first and calls wan_exec.grad_ready after each block and at its end
 * (model/dit/wan_backward.c). Only the last micro-batch's backward of an expert makes its gradients final (gradient
 * accumulation adds every micro-batch's into them), so trainer_accumulate_experts arms the hook for that one alone
 * (trainer_config.grad_arm / grad_ready, trainer/step/train_step.h). Arming is agreed over the trainer ranks first
 * (dp_buckets_arm, collective): an expert is reduced during the backward only where every rank has micro-batches of it,
 * so every rank enqueues the same buckets in the same order; the others are reduced after the backward, as before.
 *
 * Where: on a second stream (the device table's stream_new), over a group of its own (sp_comm_dup_stream of the
 * device group: NCCL's calls and the exact reduction's block_sum on that stream). Each bucket: an event recorded on
 * the device's own stream after the block's backward, the second stream waiting for it, then the bucket's reduction
 * enqueued there; before the optimizer step (dp_dev_grad_reduce, trainer/dp/dp_dev.h) the device's own stream waits for
 * an event recorded on the second stream after the last bucket. On the emulated device every call runs at once
 * (the streams keep the books of that contract, kernels/cuda/emu/emu_stream.h, and the fake NCCL checks them).
 *
 * The same bits: a bucket is a range of the flat gradient buffer, reduced with the calls of the whole buffer's
 * reduction: sp_comm_all_reduce_ordered (ZeRO stages 0 and 1), or sp_comm_reduce_scatter_ranges over the ZeRO
 * shards cut to the bucket (stages 2 and 3: each rank keeps the sum of its shard's part of the bucket, the rest of the
 * bucket is left as it was, as the whole buffer's reduce-scatter leaves it). Every element's sum is over the same
 * ranks' values in rank order (sp/comm.h), whatever range it is reduced in, so with parallel.reduce exact the
 * gradients, norms and weights are those of the reduction after the backward, bit for bit. (parallel.reduce nccl
 * follows NCCL's own order, which may depend on the message size: not bit-identical with and without buckets.)
 * No device buffer is added: the buckets are reduced in place (the NCCL group has its own exact-reduction scratch,
 * as the device group has; the device estimate counts it, trainer/optim/train_dev.h).
 *
 * Not run on GPUs: on a GPU the buckets' NCCL kernels run beside the backward's kernels and, under sequence
 * parallelism, beside the SP groups' NCCL kernels on the device's own stream. Every rank enqueues both in the same
 * order (the hook fires at the same point of the same backward everywhere), which is what NCCL asks of several
 * communicators used at once; how much of the reduction hides behind the backward has not been measured. */
#ifndef TRAINER_DP_DP_BUCKET_H
#define TRAINER_DP_DP_BUCKET_H

#include <stdint.h>

#include "core/trajectory.h"
#include "model/dit/wan_dit.h"
#include "sp/comm.h"
#include "trainer/optim/train_dev.h"

/* One bucket: [lo, hi) of the trained flat buffer (fp32 elements), reduced once block `after`'s gradients are final
 * (-1: at the end of the backward). */
typedef struct {
    int64_t lo, hi;
    int after;
} dp_bucket;

/* The buckets of layout L (the trained buffer's: "blocks.<i>." tensors, each block's contiguous, block after block in
 * order): from the last block down, whole blocks gathered until the bucket holds >= cap_bytes of fp32 gradients (a
 * block larger than that is a bucket of its own); then, at the end, the blocks left over with everything below them
 * (the embeddings, the model's scale_shift_table) and, apart, everything above the last block (proj_out). *n buckets
 * in launch order into *out (malloc'd; the caller frees). -1 with core_error when L's blocks are not laid out so
 * (naming the tensor) or out of memory. */
int dp_bucket_plan(const wan_layout *L, int64_t cap_bytes, dp_bucket **out, int *n);

/* The state of the overlapped reduction of one trainer rank. */
typedef struct {
    trainer_dev *D;          /* the device optimizer: the experts' host models, gradients, numel */
    const k_dev_ops *dev;    /* D's device table */
    sp_comm *host;           /* the trainer ranks' host group (the arming's agreement) */
    sp_comm *comm;           /* the buckets' group: sp_comm_dup_stream of the device group on `stream` */
    void *stream, *ready, *done; /* the second stream; events: after a block (device stream), after the buckets */
    int zero_stage;          /* 2 or 3: reduce-scatter over the ZeRO shards; else all-reduce */
    dp_bucket *b[CORE_TRAJ_MAX_EXPERTS];
    int n[CORE_TRAJ_MAX_EXPERTS];
    int next[CORE_TRAJ_MAX_EXPERTS]; /* the next bucket of each expert to launch in this backward */
    unsigned armed;          /* bit e: expert e's last micro-batch reduces its buckets during the backward */
    int64_t launched;        /* buckets launched since dp_buckets_init (tests, the log) */
} dp_buckets;

/* Sets up B for the trained experts of D over the device group dev (the trainer ranks; host: their host group) with
 * buckets of cap_mib MiB (> 0): the plans, the second stream, its events and its group (collective over dev). The
 * device table must have the stream entries (kernels/dev_ops.h): -1 naming it otherwise. -1 with core_error. */
int dp_buckets_init(dp_buckets *B, trainer_dev *D, sp_comm *host, sp_comm *dev, int zero_stage, double cap_mib);
void dp_buckets_free(dp_buckets *B);

/* trainer_config.grad_arm (ctx: a dp_buckets): collective over B->host. n_micro[e]: this rank's micro-batches of
 * expert e in this accumulation; arms the experts every rank has micro-batches of (*armed: bit e), resets the launch
 * positions. -1 with core_error. */
int dp_buckets_arm(void *ctx, int n_experts, const int *n_micro, unsigned *armed);
/* wan_exec.grad_ready (ctx: a dp_buckets): launches the buckets of m's expert that block `block` completes (-1: all
 * left). A model that is not one of D's, or an expert not armed: nothing. -1 with core_error naming the bucket. */
int dp_buckets_ready(void *ctx, const wan_model *m, int block);
/* After the backward: 1 when expert e's gradients were reduced during it (all its buckets launched; its reduction is
 * then not to be run again), 0 when not armed; -1 with core_error when armed but not every bucket was launched. */
int dp_buckets_done(dp_buckets *B, int e);
/* The device's own stream waits for every bucket launched (an event on the second stream), and the arming ends.
 * Before anything reads the reduced gradients. -1 with core_error. */
int dp_buckets_join(dp_buckets *B);
/* dp_buckets_join for expert e alone (its arming ends, the others' stays): the expert window's end of e's phase
 * (trainer/dp/dp_dev.h), whose gradients the other expert's backward overwrites next. No-op when e is not armed. */
int dp_buckets_join_expert(dp_buckets *B, int e);

#endif
