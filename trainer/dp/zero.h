/* trainer/dp/zero.h — sharded optimizer state and gradients over the trainer ranks: ZeRO stages 1 and 2
 * (parallel.zero_stage; Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
 * SC 2020; DeepSpeed's stage 1 and 2), bit-identical to stage 0 on the CPU. (Stage 3, the fp32 master weights sharded
 * too, is the device path's only: trainer/dp/dp_dev.h; core/recipe.c refuses it with model.device cpu.)
 *
 * Stage 0 (trainer/dp/dp.h): every rank all-reduces the gradients, then runs AdamW on every parameter with its own full
 * m and v. Stage 1: the same all-reduce; each rank keeps m and v of its SHARD only and updates only the shard's
 * parameters, then the updated parameters are all-gathered. Stage 2: the gradients are reduce-scattered instead (each
 * rank ends with the summed gradient of its shard; the rest of its gradient buffer is its own unsummed part and is
 * never read), then as stage 1. The group is the gradient group (dp_reduce_ctx.grads: every trainer rank, dp x sp),
 * so with sequence parallelism the SP peers shard too. The trained buffers are each expert's flat parameters, or its
 * LoRA adapter's (trainer/optim/lora.h); each is sharded on its own.
 *
 * Shards: a buffer of n values is cut into c = ceil(n / OPTIM_CHUNK) chunks (optim.h's norm chunks) and rank r of R
 * owns chunks [c r / R, c (r + 1) / R) (dp_share's split), the last cut at n; a rank may own none (a small adapter
 * over many ranks). The layout is a function of (n, R) only: nothing of it is written to a checkpoint.
 *
 * Why the result equals stage 0 bit for bit:
 *   - gradients: stage 0 sums them in rank order (sp_comm_all_reduce_ordered) and stage 2's reduce-scatter adds the
 *     same values in the same order (sp_comm_reduce_scatter_ranges): sp/comm.h;
 *   - the norm for clipping: optim_sumsq adds fixed chunks' sums of squares sequentially in chunk order. The shards
 *     are whole chunks, so each rank forms the sums of its chunks (optim_sumsq_chunks), the chunk sums are
 *     all-gathered (8 bytes per 32 KiB of gradient) and every rank adds all of them in chunk order
 *     (optim_sumsq_combine): the very additions of optim_sumsq, then of optim_grad_norm_multi over the experts;
 *   - clipping and AdamW are elementwise (optim_adamw_step_coef on the shard), and the all-gather copies.
 * Stage 0's figures did not change for this: its norm is computed as before, and its gradient sum equals OpenMPI
 * 4.1's MPI_Allreduce (used before) at 2 and 3 ranks (checked: tests/mpi/mpi_zero.c prints the comparison); at 4 or
 * more ranks MPI_Allreduce added in another order, so those runs' last bits differ from before the change.
 *
 * Memory per rank (fp32): weights 4 B, gradients 4 B, m and v 8 B per trained parameter at stage 0; m and v 8/R B
 * at stages 1 and 2. The gradients stay whole at stage 2 in this build: the backward accumulates every micro-batch
 * of the update into the whole buffer before the one reduction (reducing per micro-batch would add in another order
 * and break bit-identity), so stage 2 saves communication (a reduce-scatter instead of an all-reduce: stage 2 moves
 * what stage 0 moves, stage 1 half as much again), not memory. trainer/budget/budget.h prints the figures.
 *
 * Checkpoints: written GATHERED, one optimizer.safetensors as at stage 0 (rank 0 gathers m and v before it writes,
 * dp_zero_gather; the file, and the whole checkpoint folder, are those of stage 0 byte for byte), and read back as
 * shards (each rank reads its range: trainer/checkpoint/checkpoint.c). So a checkpoint resumes at any stage and any number of
 * ranks (parallel.zero_stage and parallel.trainer_ranks may change on resume); the cost is m and v of the whole model
 * on rank 0 while a checkpoint is written (8 B per trained parameter, transient). */
#ifndef TRAINER_ZERO_H
#define TRAINER_ZERO_H

#include <stdint.h>

#include "model/dit/wan_dit.h"
#include "sp/comm.h"
#include "trainer/dp/dp.h"
#include "trainer/optim/optim.h"

/* The shard ranges of a buffer of n values over `size` ranks (see the top comment): offs [size + 1], malloc'd
 * (caller frees); NULL with an error when out of memory. */
int64_t *dp_zero_offsets(int64_t n, int size);
/* Rank `rank`'s shard of it: [*lo, *lo + *len). */
void dp_zero_shard(int64_t n, int rank, int size, int64_t *lo, int64_t *len);

/* AdamW state for a trained buffer of n values: stage 0 or a group of one: the whole (optim_adamw_init); stage 1
 * or 2: this rank's shard (optim_adamw_init_shard). -1 with an error. */
int dp_zero_optim_init(optim_adamw *o, int64_t n, int stage, const sp_comm *grads);

/* The optimizer step of stages 1 and 2 (trainer_config.opt_step, ctx = the dp_reduce_ctx whose grad_reduce ran
 * before): the global gradient norm over every trained expert from the shards' chunk sums (above), the clip factor
 * optim_clip_coef(norm, max_grad_norm), AdamW on this rank's shard of each trained buffer (optim_adamw_step_coef:
 * opt[e] must be its dp_zero_optim_init state), then the all-gather of each trained buffer's parameters. info (may
 * be NULL): norm, clip factor, lr, as stage 0 gives them. Errors (-1, collective: every rank gets the same): a
 * non-finite norm ("gradient norm is nan at optimizer step N"; no weights changed), a state that is not this rank's
 * shard, a communication failure (the weights may then differ between ranks: the run must stop). */
int dp_zero_step(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained, optim_adamw *const *opt,
                 const optim_config *ocfg, optim_step_info *info);

/* For a checkpoint: gathers the sharded states opt[0..k) (dp_zero_optim_init's shards over c; a state with n == 0,
 * never allocated, is skipped: the same on every rank) to rank 0 of c. On rank 0 full[e] receives the whole state
 * (allocated; optim_adamw_free it) with the same step; elsewhere full is left zeroed. Collective over c. -1 with an
 * error (full freed). */
int dp_zero_gather(sp_comm *c, optim_adamw *opt, int k, optim_adamw *full);

#endif
