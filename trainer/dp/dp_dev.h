/* trainer/dp/dp_dev.h — data parallelism and ZeRO stages 1, 2 and 3 on the device path (model.device cuda, with
 * parallel.trainer_ranks > 1): the gradients, master weights, AdamW moments and bf16 compute copies live on each
 * rank's device (trainer/optim/train_dev.h), and what the CPU path does with host buffers (trainer/dp/dp.h,
 * trainer/dp/zero.h) is done here with the device's, through the comm table (sp/comm.h) only:
 *   - gradients: summed over the ranks in rank order, sp_comm_all_reduce_ordered (stage 0 and 1) or
 *     sp_comm_reduce_scatter_ranges over the ZeRO shards (stage 2), on the device buffers;
 *   - the norm for clipping: stage 0 and 1 the device's sumsq of the whole summed gradient; stage 2 each rank's
 *     chunk sums of its shard (whole OPTIM_CHUNK chunks: optim_sumsq's own), all-gathered as host doubles and added in
 *     chunk order (optim_sumsq_combine): optim_sumsq of the whole, bit for bit, as trainer/dp/zero.c does;
 *   - the step: stage 0 every rank updates everything; stages 1 and 2 each rank's moments are its shard's and it
 *     updates its range of the fp32 master and the bf16 copy, then both are all-gathered by ranges (the master so that
 *     every rank's host mirror and proj_out.bias are whole, the bf16 copy for the next forward).
 *   - stage 3 (full fine-tuning; trainer_dev_init_sharded): stage 2, and the fp32 master on each rank's device is its
 *     shard only (the moments' range): AdamW updates it, only the bf16 copy is all-gathered over the device group,
 *     and the host copy of the master (checkpoints, the weight sync, the finiteness check, an EMA) is made after
 *     every step: each rank downloads its range and the ranges are all-gathered over the host group .grads (MPI,
 *     host buffers). The same values in the same operations as stage 2 (AdamW is elementwise): the same bits, at
 *     every micro-batch split.
 *   - stage 3 with both experts trained (Wan 2.2 A14B; trainer_dev_expert_window: GRPO, full fine-tuning): the
 *     EXPERT WINDOW. The accumulation already runs one expert's micro-batches, then the other's
 *     (trainer/step/train_step.h), so the two experts share one bf16 copy and one fp32 gradient buffer on the device
 *     (model/dit/wan_dev_exec.h wan_dev_exec_window), and trainer_config.expert_phase = dp_dev_expert_phase brackets
 *     each expert's micro-batches: before them, the expert into the window (each rank's master shard rounded to bf16
 *     by mem_round_bf16 into its range, the ranges all-gathered: the bits AdamW's bf16 copy has; nothing when it is
 *     there already); after them, its gradients reduce-scattered (or its buckets waited for), and for transformer the
 *     sum of squares formed (stage 2's chunk sums and combine), this rank's range downloaded to host memory
 *     (D->ghost) and the buffer zeroed for transformer_2, whose range then stays in place; the step uploads
 *     transformer's range piece by piece into the buffer outside transformer_2's range for clipping and AdamW. The step reads the shards, writes
 *     no bf16 copy, and leaves the window empty. Each expert's gradient is the same sum as at stage 2 (its micro-
 *     batches in order on each rank, then the ranks in order), the norm, clipping and AdamW the same operations: the
 *     same bits, for 2 + 4 bytes per parameter of one expert less on the device (one expert's bf16 copy and fp32
 *     gradients), 4 per value of transformer's shard more in host memory, and that shard over the bus twice a step. A forward of the expert not in the window is refused (wan_dev_exec), so a
 *     path without the phases fails loudly; nft keeps two buffers (its accumulation has no phases yet; dpo trains one expert).
 *     Still whole per rank: one expert's fp32 gradients and bf16 weights (sharding them, FSDP's way, needs each
 *     block's gradients reduce-scattered per micro-batch during the backward, another order of the sum over
 *     micro-batches and ranks, and an all-gather of each block's bf16 weights before its forward).
 * So the ranks' numbers equal each other's at every stage bit for bit (the same sums in the same order, elementwise
 * AdamW, copies), as on the CPU path, and a rank count gives the same losses and weights at stages 0 to 3. As on
 * the CPU, they are not the one-rank run's bits: a rank's share accumulates its own micro-batches and the shares are
 * then added (the one-rank run accumulates every micro-batch into one sum).
 *
 * Two groups: the device buffers move over dp_reduce_ctx.dev, the host ones (the statistics, the stage-2 chunk sums:
 * a few doubles) over .grads / .stats. On the emulated device (VGRPO_EMULATE_DEVICE=1) device memory is host memory
 * and .dev is the MPI group itself (or the NCCL comm over the tests' fake NCCL when VGRPO_NCCL_LIB is set). On a GPU
 * .dev is the NCCL comm (sp/comm_nccl.c, made by trainer/run/run_setup.c), whose ranged reduce-scatter sums on the
 * device; the MPI comm of sp/comm_mpi.c would need every device buffer staged through the host (download, MPI,
 * upload: 3 x 4 bytes per parameter per step over the bus) and sp/comm_ranges.c's host-side sum.
 *
 * With parallel.grad_bucket_mib > 0 (ctx->bk) the reductions begin during the last micro-batch's backward, bucket by
 * bucket on a second stream (trainer/dp/dp_bucket.h: the same calls on ranges of the buffer, the same bits), and
 * dp_dev_grad_reduce only waits for them. (Sequence parallelism on the device shares these reductions: every
 * rank's partial gradients are summed over the world, dp x sp, as on the CPU; trainer/run/run_setup.c gives the
 * device executor the USP hooks.) */
#ifndef TRAINER_DP_DEV_H
#define TRAINER_DP_DEV_H

#include "trainer/dp/dp.h"
#include "trainer/dp/dp_bucket.h"
#include "trainer/optim/train_dev.h"

/* The state the hooks below share: the reduction groups and the device optimizer they work on. */
typedef struct {
    dp_reduce_ctx *red;
    trainer_dev *D;
    dp_buckets *bk; /* the reduction overlapping the backward (trainer/dp/dp_bucket.h); NULL: after it only */
} dp_dev_ctx;

/* Sets up the device optimizer D for ZeRO over red (D->shards; ctx must live as long as D): stage 0 or one rank
 * leaves the one-rank step; stage 1 gathers the updated ranges; stage 2 also forms the norm from the shards; stage 3
 * gathers the bf16 ranges and the host copy of the master (D's master must be sharded: trainer_dev_init_sharded,
 * and only then). D's moments must be the shards of dp_zero_optim_init (trainer_dev_init from those states). ctx->bk is left NULL (no
 * buckets). 0, or -1 naming the mismatch. */
int dp_dev_shards(dp_dev_ctx *ctx, dp_reduce_ctx *red, trainer_dev *D);

/* trainer_config.grad_reduce on the device (ctx: a dp_dev_ctx): each trained expert's device gradients summed over
 * red->dev in rank order (stage 2: reduce-scattered to the shards), then the loss statistics over red->stats
 * (dp_stats_reduce). An expert whose buckets were reduced during the backward (ctx->bk) is not reduced again: the
 * device's stream waits for the buckets instead (dp_buckets_join). -1 with an error naming the expert. */
int dp_dev_grad_reduce(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained,
                       grpo_loss_stats *stats);

/* trainer_config.expert_phase (ctx: a dp_dev_ctx) for an expert window (D->window; otherwise nothing): end 0, expert e
 * into the window; end 1 with backward, e's gradients reduced and this rank's range kept (see the top comment).
 * Collective over the device group. -1 with an error naming the expert. (dp_dev_grad_reduce then reduces the
 * statistics only, and refuses an expert whose phase did not keep its gradients.) */
int dp_dev_expert_phase(void *ctx, int e, int end, int backward);

#endif
