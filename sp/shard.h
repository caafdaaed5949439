/* sp/shard.h — sharding hidden states on the sequence and gathering them back (docs/design.md section 6).
 *
 * SP rank p of a dp rank owns tokens [p*S_l, (p+1)*S_l) of every sample, S_l = S / sp (sp/topology.h). The DiT
 * shards right after patch embedding and gathers right after proj_out; everything in between is per token except
 * the self-attention, which sp_usp_forward/backward (sp/usp_attention.h) make sequence-parallel.
 *
 * How model/dit/wan_forward.c and wan_backward.c use this (model/ sees a token range, the attention hook and the SP
 * group; the API is wan_acts_new_sp + wan_exec.sp in model/dit/wan_dit.h):
 *   forward   x [B, C, F, H, W] (the same on every SP peer) -> patchify of the full sample -> sp_shard_rows takes
 *             rows [s0, s0+S_l), s0 = sp_rank*S_l -> patch_embedding on [B, S_l, D]: norms, modulation, Q/K/V/out
 *             projections, FFN and the cross-attention (text K/V replicated: every rank embeds the full text) are
 *             per token; RoPE uses rows [s0, s0+S_l) of the full grid's table (wan_acts_new_sp slices it);
 *             per-token timesteps (Wan 2.2 TI2V) are sliced the same way; the self-attention is the hook
 *             (wan_exec.attn_fwd = sp_usp_forward, attn_ctx = the sp_usp) -> norm_out, modulation, proj_out on
 *             [B, S_l, C_out*pt*ph*pw] -> sp_gather_rows over the SP group -> [B, S, ...] -> unpatchify on every
 *             rank: each SP rank holds the same full velocity and computes the same loss.
 *   backward  dout [B, C_out, F, H, W] (full, the same on every rank) -> unpatchify_backward -> sp_gather_rows_backward
 *             takes this rank's rows (no reduction: every rank has the full gradient) -> proj_out ... blocks in
 *             reverse on S_l tokens (attention backward through sp_usp_backward) -> patch_embedding backward on the
 *             local rows -> (when dx is asked) sp_gather_rows of the patch-vector gradients -> patchify_backward:
 *             every rank gets the full dx. The text-embedding input gradient d enc is this rank's part summed
 *             over the SP group (sp_comm_all_reduce of a scratch buffer), also full on every rank.
 *   gradients every parameter gradient is this rank's partial sum over its tokens (the time/text embedders and
 *             scale_shift_tables included); the caller sums them over ALL trainer ranks (dp x sp) with
 *             sp_comm_all_reduce on the world, once after accumulating, as docs/design.md section 4 says. Nothing is
 *             divided by sp: the loss is computed once per SP group worth of tokens because each rank
 *             back-propagates only its slice.
 *   activations wan_acts_new_sp(cfg, shape, mode, sp, sp_rank) sizes everything per token for S_l tokens, so
 *             activation memory drops by sp (plus one [B, S, C*pt*ph*pw] scratch and the per-text-token terms);
 *             the hook's lse is [B, H, S_l] as the model already stores it.
 * Tested against the single-rank model in tests/mpi/mpi_dit.c (bands u2r1, u4r1, u1r2, u2r2, u1r4, dp 2).
 *
 * The _dev functions work on typed views in the memory of a device table (kernels/dev_ops.h: its mem_copy2d moves rows,
 * its add accumulates; the comm must move that memory: MPI for host memory, NCCL for a GPU's), row-major [B, S, W],
 * fp32 or bf16; 0, or -1 with core_error. The others are the same on host memory, fp32 (the CPU table). */
#ifndef SP_SHARD_H
#define SP_SHARD_H

#include "kernels/dev_ops.h"
#include "sp/comm.h"

/* local [B, S_l, W] = rows [sp_rank*S_l, (sp_rank+1)*S_l) of every sample of full [B, S, W], S = sp*S_l. */
void sp_shard_rows(float *local, const float *full, int B, int S_l, int W, int sp, int sp_rank);

/* full [B, S, W] (S = sp->size * S_l) = every SP rank's local [B, S_l, W] in SP-rank order (all-gather on the SP
 * group, then each sample's rows put in sequence order). Collective over sp. 0, or -1 with core_error. */
int sp_gather_rows(sp_comm *sp, float *full, const float *local, int B, int S_l, int W);

/* Backward of sp_gather_rows when every rank holds the same full gradient: dlocal [B, S_l, W] += this rank's rows
 * of dfull [B, S, W]. Local (no communication). */
void sp_gather_rows_backward(float *dlocal, const float *dfull, int B, int S_l, int W, int sp, int sp_rank);

/* The same on a device table's memory (local and full of one dtype). */
int sp_shard_rows_dev(const k_dev_ops *dev, kb_out local, kb_in full, int B, int S_l, int W, int sp, int sp_rank);
int sp_gather_rows_dev(const k_dev_ops *dev, sp_comm *sp, kb_out full, kb_in local, int B, int S_l, int W);
/* dlocal += this rank's rows of dfull (the table's add: dtypes may differ where the table allows). */
int sp_gather_rows_backward_dev(const k_dev_ops *dev, kb_out dlocal, kb_in dfull, int B, int S_l, int W, int sp,
                                int sp_rank);

#endif
