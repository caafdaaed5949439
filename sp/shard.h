/* sp/shard.h — sharding hidden states on the sequence and gathering them back (DESIGN.md section 6).
 *
 * SP rank p of a dp rank owns tokens [p*S_l, (p+1)*S_l) of every sample, S_l = S / sp (sp/topology.h). The DiT
 * shards right after patch embedding and gathers right after proj_out; everything in between is per token except
 * the self-attention, which sp_usp_forward/backward (sp/usp_attention.h) make sequence-parallel.
 *
 * How model/wan_forward.c and wan_backward.c will use this (the integration step; model/ stays ignorant of ranks,
 * it only sees a token range and the attention hook):
 *   forward   x [B, C, F, H, W] (the same on every SP peer) -> patchify -> patch_embedding on this rank's rows only
 *             (patchify output rows [s0, s0+S_l), s0 = sp_rank*S_l; the embedding is per token) -> blocks on
 *             [B, S_l, D]: norms, modulation, Q/K/V/out projections, FFN and the cross-attention (text K/V are
 *             replicated: every rank embeds the full text) are per token; RoPE uses rows [s0, s0+S_l) of the
 *             table of the full grid (the table is indexed by global token position, so it must be offset);
 *             per-token timesteps (Wan 2.2 TI2V) are sliced the same way; the self-attention is the hook
 *             (wan_exec.attn_fwd = sp_usp_forward, attn_ctx = the sp_usp) -> norm_out, modulation, proj_out on
 *             [B, S_l, C_out*pt*ph*pw] -> sp_gather_rows over the SP group -> [B, S, ...] -> unpatchify on every
 *             rank: each SP rank holds the same full velocity and computes the same loss.
 *   backward  dout [B, C_out, F, H, W] (full, the same on every rank) -> unpatchify_backward -> sp_gather_rows_backward
 *             takes this rank's rows (no reduction: every rank has the full gradient) -> proj_out ... blocks in
 *             reverse on S_l tokens (attention backward through sp_usp_backward) -> patch_embedding backward on the
 *             local rows -> patchify_backward into dx (zeros outside this rank's patches; sum over the SP group if
 *             dx is ever needed in full).
 *   gradients every parameter gradient is this rank's partial sum over its tokens (the time/text embedders and
 *             scale_shift_tables included); the trainer sums all of them over ALL trainer ranks (dp x sp) with
 *             sp_comm_all_reduce on the world, as DESIGN.md section 4 says. Nothing is divided by sp: the loss is
 *             computed once per SP group worth of tokens because each rank back-propagates only its slice.
 *   activations wan_acts is allocated for S_l tokens (a token-range field in wan_shape: S total, s0, S_l), so
 *             activation memory drops by sp; the hook's lse is [B, H, S_l] as the model already stores it.
 *
 * All functions work on host memory, fp32, row-major [B, S, W] (W floats per token). */
#ifndef SP_SHARD_H
#define SP_SHARD_H

#include "sp/comm.h"

/* local [B, S_l, W] = rows [sp_rank*S_l, (sp_rank+1)*S_l) of every sample of full [B, S, W], S = sp*S_l. */
void sp_shard_rows(float *local, const float *full, int B, int S_l, int W, int sp, int sp_rank);

/* full [B, S, W] (S = sp->size * S_l) = every SP rank's local [B, S_l, W] in SP-rank order (all-gather on the SP
 * group, then each sample's rows put in sequence order). Collective over sp. 0, or -1 with core_error. */
int sp_gather_rows(sp_comm *sp, float *full, const float *local, int B, int S_l, int W);

/* Backward of sp_gather_rows when every rank holds the same full gradient: dlocal [B, S_l, W] += this rank's rows
 * of dfull [B, S, W]. Local (no communication). */
void sp_gather_rows_backward(float *dlocal, const float *dfull, int B, int S_l, int W, int sp, int sp_rank);

#endif
