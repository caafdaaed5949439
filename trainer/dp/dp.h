/* trainer/dp/dp.h — data parallelism over trainer ranks (docs/design.md sections 3 and 4): rank 0 (the controller) has
 * the batch and broadcasts it; each dp rank trains on a contiguous share of the samples with the GLOBAL loss
 * denominator; parameter gradients are summed over the ranks (all-reduce) before the one optimizer step every rank
 * takes, so the parameters stay identical on every rank and the gradient does not depend on the split (up to fp32
 * summation order: the all-reduce adds the ranks' partial sums instead of accumulating one sum).
 * The communicator is sp/comm.h's (MPI on CPU; a group of one without MPI). */
#ifndef TRAINER_DP_H
#define TRAINER_DP_H

#include <stdint.h>

#include "core/trajectory.h"
#include "model/dit/wan_dit.h"
#include "sp/comm.h"
#include "trainer/step/grpo.h"

/* What rank 0 broadcasts before each batch (SP_I64): train on the batch that follows, or stop. */
#define DP_CMD_STOP 0
#define DP_CMD_TRAIN 1
#define DP_CMD_PARITY 2
#define DP_CMD_ZERO_GATHER 3 /* ZeRO: gather the AdamW shards to rank 0, which writes a checkpoint (trainer/dp/zero.h) */

/* A batch as the trainer ranks share it. */
typedef struct {
    int n;               /* samples */
    core_traj *traj;     /* [n] (owned after dp_batch_broadcast on ranks > 0) */
    float *adv;          /* [n] */
    uint8_t *mask;       /* [n] */
} dp_batch;

/* Broadcasts rank 0's batch to every rank of c (root 0): on ranks > 0, *b is filled with allocated copies (free
 * with dp_batch_free); rank 0's *b is read only. Trajectories arrive bit for bit (struct fields and arrays: the
 * stored range latent_first / n_latents with its M latents, the means and the condition when rank 0's sample has them).
 * -1 with core_error (a communication failure, out of memory, a corrupt buffer). */
int dp_batch_broadcast(sp_comm *c, dp_batch *b);
void dp_batch_free(dp_batch *b);

/* The contiguous share of n samples of dp rank `rank` of `size`: [*lo, *hi) = [n*rank/size, n*(rank+1)/size). */
void dp_share(int n, int rank, int size, int *lo, int *hi);

/* The groups dp_grad_reduce reduces over: gradients over every trainer rank (dp x sp: with sequence parallelism
 * each SP rank holds its tokens' partial parameter gradients, docs/design.md section 6), statistics over the dp group
 * only (the SP peers of a dp rank computed the same loss terms, so counting them once per dp rank). Without SP both
 * are the world. */
typedef struct {
    sp_comm *grads;
    sp_comm *stats;
    int zero_stage;  /* parallel.zero_stage (trainer/dp/zero.h): 2 reduce-scatters the gradients instead */
    sp_comm *dev;    /* model.device cuda: the group over the same ranks as grads that moves DEVICE buffers (gradients,
                        updated weights: trainer/dp/dp_dev.h); NULL on the CPU path */
} dp_reduce_ctx;

/* The trainer's gradient hook for data parallelism (trainer_config.grad_reduce, ctx = a dp_reduce_ctx): all-reduces
 * (sums) the gradients of the trained experts (with LoRA their adapters' gradients: trainer/optim/lora.h) over ctx->grads,
 * and sums the loss statistics over ctx->stats in rank order (in double, so every rank gets the same numbers).
 * The gradient sum is in rank order, ((g_0 + g_1) + g_2) + ..., whatever the MPI library
 * (sp_comm_all_reduce_ordered; OpenMPI 4.1's MPI_Allreduce, used before, gives the same bits at 2 and 3 ranks but
 * not at 4 or more); with ctx->zero_stage 2 it is sp_comm_reduce_scatter_ranges over the ZeRO shards
 * (dp_zero_offsets): the same sums, each rank keeping its shard only. */
int dp_grad_reduce(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained, grpo_loss_stats *stats);

/* The loss statistics' half of dp_grad_reduce: *stats summed over c in rank order (dp_sum_doubles; c NULL: kept). */
int dp_stats_reduce(sp_comm *c, grpo_loss_stats *stats);

/* Sums a few doubles over the group in rank order (all-gather, then a fixed-order sum; same result on every rank). */
int dp_sum_doubles(sp_comm *c, double *x, int n);
/* The element-wise maximum of a few doubles over the group. */
int dp_max_doubles(sp_comm *c, double *x, int n);

#endif
