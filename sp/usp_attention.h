/* sp/usp_attention.h — Unified Sequence Parallel (Ulysses x Ring) self-attention, forward and backward, on typed
 * views over a device table (kernels/dev_ops.h): fp32 on the CPU table, bf16 on a device.
 *
 * Sources: DeepSpeed-Ulysses (Jacobs et al., "DeepSpeed Ulysses: System Optimizations for Enabling Training of
 * Extreme Long Sequence Transformer Models", 2023): all-to-all from sequence-sharded to head-sharded and back;
 * Ring Attention (Liu, Zaharia & Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
 * 2023): K/V blocks rotate round a ring, partial outputs merged through the log-sum-exp; USP (Fang & Zhao,
 * "A Unified Sequence Parallelism Approach for Long Context Generative AI", 2024, the code of xDiT / yunchang's
 * LongContextAttention): Ulysses inside, ring across. The backward follows zhuzilin/ring-flash-attention's
 * ring_flash_attn_backward: every step runs the flash backward of the local queries against the visiting K/V block
 * with the MERGED output and LSE of the forward, dQ stays home, and the dK/dV accumulators travel with their K/V
 * block and take one final hop home.
 *
 * Data layout (S_l = local tokens, U = Ulysses degree, R = ring degree, H heads, Hu = H / U):
 *   in/out of the calls:   q, k, v, o, dq, dk, dv, dout [B, S_l, H, Dh]; lse [B, H, S_l]   (sequence-sharded:
 *                          this rank's tokens [sp_rank*S_l, (sp_rank+1)*S_l) of the full sequence S = sp*S_l)
 *   inside (head-sharded): [B, S_r, Hu, Dh] and lse [B, Hu, S_r], S_r = U*S_l, the tokens of ring block ring_rank
 *                          (= the Ulysses group's contiguous tokens), heads [ulysses_rank*Hu, (ulysses_rank+1)*Hu).
 * Forward:  1. all-to-all on the Ulysses group of q, k, v (one message: sequence gathered, heads scattered);
 *           2. ring: step 0 attends to the own K/V block; at step s = 1..R-1 the K/V pair received from ring rank
 *              r-1 (block r-s) replaces the previous one, its partial (o_s, lse_s) is merged into (o, lse) with
 *              the table's lse_merge_forward;
 *           3. inverse all-to-all of o and lse (one message).
 * Backward: 1. all-to-all of q, k, v, o, dout and lse to the head-sharded layout;
 *           2. ring: at step s the visiting block's (K, V, dK_acc, dV_acc) is used by the table's attention_backward
 *              (dQ += locally, dK_acc, dV_acc +=), then the four travel to ring rank r+1; after the last step the
 *              accumulators (now holding every rank's contribution) take one more hop, which brings each home;
 *           3. inverse all-to-all of dQ, dK, dV, ADDED to dq, dk, dv (the hook accumulates, like the kernels).
 *
 * Numerics: with R = 1 (pure Ulysses) every head sees exactly the single-rank inputs and the same kernel call, so
 * o, lse, dq, dk, dv are bit-identical to sp = 1 (the kernels' per-head results do not depend on other heads).
 * With R > 1 the softmax is split over R key blocks and recombined through the LSE, and dQ/dK/dV are sums of R
 * partial backward calls: rounding-level differences, bounded by a small multiple of FLT_EPSILON times the
 * values' scale (tests/mpi/mpi_usp.c states and checks the bound). All results are deterministic: the order of
 * every merge and sum is fixed by the ring rank, never by message timing.
 *
 * Every tensor is in the memory of the sp_usp's table (dev: NULL = k_cpu_dev_ops, fp32 host memory; a device table:
 * bf16 q/k/v/o and fp32 LSE in device memory): the packing is the table's mem_copy2d, the kernels its
 * attention_forward/backward and lse_merge_forward, the gradients' accumulation its add, the messages go through the
 * groups' comm tables on those pointers (the MPI comm on host memory: the CPU and the emulated device; NCCL on GPUs).
 * On a bf16 device the ring's merged output is rounded to bf16 at every merge, and the dQ and travelling dK/dV
 * accumulators are bf16 (the activations' dtype, as the device's own attention backward accumulates); the LSE stays
 * fp32.
 *
 * Limits: no mask, dropout, causal attention or custom scale (sp_validate refuses them at start-up); the scale is
 * 1/sqrt(Dh) rounded from double, as the model's default attention. Communication is blocking (MPI_Sendrecv): the
 * CPU path does not overlap the ring hop with the step's compute (the CUDA path will, with a second stream).
 * Workspace is allocated per call: about 13 (forward) and 22 (backward) times the size of the local q.
 * A failure on one rank leaves its peers blocked in a collective: callers treat -1 as fatal for the whole group
 * (MPI_Abort). */
#ifndef SP_USP_ATTENTION_H
#define SP_USP_ATTENTION_H

#include "kernels/dev_ops.h"
#include "kernels/kernels.h"
#include "sp/comm.h"
#include "sp/topology.h"

/* The context passed as wan_exec.attn_ctx. */
typedef struct {
    const k_dev_ops *dev; /* the table (attention, LSE merge, add, memory); NULL = k_cpu_dev_ops */
    sp_comm *sp;          /* SP group (size sp, rank sp_rank): for sharding/gathering hidden states */
    sp_comm *ulysses;     /* Ulysses group (size U, rank ulysses_rank) */
    sp_comm *ring;        /* ring group (size R, rank ring_rank) */
    sp_rank_info me;      /* this rank's coordinates */
    int owns_groups;      /* 1 when sp_usp_init made the groups (sp_usp_release destroys them) */
    char *ws;             /* the calls' workspace in the table's memory (the ring's blocks, the all-to-alls'
                             messages), grown to the largest call and kept until sp_usp_release */
    size_t ws_bytes;
} sp_usp;

/* Splits world (size t->trainer_ranks, rank = global rank) into this rank's SP, Ulysses and ring groups and fills
 * u. Collective over world. dev NULL = &k_cpu_dev_ops. Returns 0, or -1 with core_error (world size differs from
 * trainer_ranks, a split failed). */
int sp_usp_init(sp_usp *u, sp_comm *world, const sp_topology *t, const k_dev_ops *dev);
/* Uses given groups (not owned): ulysses of size U, ring of size R; sp may be NULL. For tests and sp = 1 (pass
 * sp_comm_self groups). The world rank is unknown here: u->me.global_rank is set to the SP rank. */
void sp_usp_init_groups(sp_usp *u, sp_comm *sp, sp_comm *ulysses, sp_comm *ring, const k_dev_ops *dev);
/* Frees the calls' workspace (u->ws: the next call makes a new one); for a caller that closes the table's device
 * before sp_usp_release. */
void sp_usp_free_workspace(sp_usp *u);
/* Frees the workspace and destroys the groups sp_usp_init made (collective over each); leaves u zeroed. */
void sp_usp_release(sp_usp *u);

/* Forward; the signature of wan_self_attn_fwd_fn (model/dit/wan_dit.h), ctx an sp_usp *.
 * q, k, v [B, S, H, Dh] (one dtype: fp32 or bf16; the table's memory), this rank's S = S_total / sp tokens -> o
 * [B, S, H, Dh] (overwritten) and lse [B, H, S] (natural log, fp32, over ALL S_total keys), scale 1/sqrt(Dh). Collective over the Ulysses and ring
 * groups. Returns 0, or -1 with core_error (H not a multiple of U, out of memory, a communication failure). */
int sp_usp_forward(void *ctx, kb_out o, float *lse, kb_in q, kb_in k, kb_in v, int B, int S, int H, int Dh);

/* Backward; the signature of wan_self_attn_bwd_fn. Given dout [B, S, H, Dh] and q, k, v, o, lse as in and out of
 * sp_usp_forward on this rank, ACCUMULATES dq, dk, dv [B, S, H, Dh] += (the gradient of this rank's tokens with
 * respect to the loss summed over every rank's tokens). Collective like the forward. 0 or -1 with core_error. */
int sp_usp_backward(void *ctx, kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k, kb_in v, kb_in o,
                    const float *lse, int B, int S, int H, int Dh);

#endif
