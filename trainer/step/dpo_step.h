/* trainer/step/dpo_step.h — one online Flow-DPO training pass over a batch of trajectories on the Wan DiT: for every
 * trained (pair, step), both clean final latents noised with the pair's shared noise at the step's sigma
 * (dpo_forward_pair), the reference's velocities of both without gradient, the policy's with gradient,
 * dpo_loss_terms, and the DiT backward of d loss / d v of both samples (flow_denoise_grad, flow_denoise_backward).
 * trainer/step/dpo.h has the arithmetic and its sources (flow_grpo scripts/train_sd3_dpo.py l.884-937).
 *
 * Terms: pair p = (w, l) of b->pairs (dpo_select_pairs' batch indices into traj), step i in
 * grpo_select_steps(sel, N, NULL, seed, uid_w) (the preferred sample's uid: no log-prob needed, ODE steps are
 * candidates; the reference trains int(timestep_fraction N) timesteps per pair), listed pair by pair, steps
 * ascending, cut into micro-batches of micro_batch_size terms (2 DiT rows each: the preferred, then the rejected).
 * Per term:
 *   t = sigma_i of the pair's trajectories (they must share the schedule); the model's timestep traj.timesteps[i];
 *   x0 = each trajectory's final latent (latents[N]); x_t^w, x_t^l, eps = dpo_forward_pair(x0_w, x0_l, t, seed,
 *   slot = update * N + i, uid_w, uid_l);
 *   CFG-free: one conditional row per sample (guidance 1), as the reference trains (its training forward has no
 *   unconditional branch, l.905-922);
 *   forwards in this order: reference (no grad; the policy's base with its adapter off when ref == policy under
 *   LoRA, else a frozen copy of the initial weights), policy (activations kept).
 * The reference differs from flow_grpo's in two places, both documented in recipes/README.md: its timesteps are a
 * logit-normal draw over the 1000-step training schedule (l.890-898), ours the rollout's own sigmas chosen by
 * algorithm.timestep_selection (as DiffusionNFT's pass here); its reference is a LoRA adapter copied from the
 * learner every ref_update_step steps (10^7 in config/dpo.py: in effect the initial model), ours the initial model.
 * denom = the global batch's terms (dpo_count_terms), so gradients summed over micro-batches and ranks do not depend
 * on the split. A row's velocity does not depend on its batch mates, so the loss is the same for every micro-batch
 * size. Scope: one expert, text to video (no image condition). Tested on the CPU (ex NULL); with ex->dev the
 * reference must be resident on the device (untested there). */
#ifndef TRAINER_DPO_STEP_H
#define TRAINER_DPO_STEP_H

#include <stdint.h>

#include "core/trajectory.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_executor.h"
#include "trainer/step/dpo.h"
#include "trainer/step/grpo.h"

typedef struct {
    grpo_selection sel;      /* algorithm.timestep_selection (has_logp is not used: every step is a candidate) */
    uint64_t seed;           /* run seed: selection (stream 1) and the pairs' noise (CORE_STREAM_DPO_NOISE) */
    uint32_t update;         /* the optimizer update's index within the rollout step (noise slot update * N + i) */
    float dpo_beta;          /* algorithm.dpo_beta, > 0 */
    int micro_batch_size;    /* terms (pairs at one step) per forward, >= 1; each is two DiT rows */
    wan_acts_mode acts_mode; /* WAN_ACTS_STORE or WAN_ACTS_RECOMPUTE */
    /* Probe (NULL: none): called for every term after its loss, with the pair's index in b->pairs, the step, the
     * policy's velocities and d loss / d v of both samples ([C, F, H, W] fp32, valid during the call; the dv NULL
     * when backward == 0). */
    void (*probe)(void *ctx, int pair, int step, const float *v_w, const float *v_l, const float *dv_w,
                  const float *dv_l, int64_t nl);
    void *probe_ctx;
} dpo_step_config;

typedef struct {
    int n;                    /* trajectories */
    const core_traj *traj;    /* [n]: uid, sigmas, timesteps, latents (latents[N] the clean final latent) */
    const float *const *cond; /* [n] prompt embeddings [text_len, text_dim] */
    int text_len;
    int n_pairs;              /* >= 0 (a batch without pairs trains nothing) */
    const dpo_pair *pairs;    /* [n_pairs] indices into traj (dpo_select_pairs) */
    int64_t denom;            /* global term count; 0 = this batch's */
} dpo_batch;

/* The term count of a batch (the loss denominator): sum over pairs of grpo_select_steps' count with every step a
 * candidate. Pass the global batch. Errors (-1): no trajectories, step counts that differ, a pair index out of
 * range, sel invalid. */
int dpo_count_terms(const dpo_step_config *c, const dpo_batch *b, int64_t *count);

/* One pass over every trained term of the batch (see the file comment).
 *   policy: with backward != 0 its trained buffer's grads (the adapter's under LoRA) are ACCUMULATED into (+=);
 *   ref: the reference (required; may be policy itself under LoRA: its base);
 *   stats: accumulated into (zero it first).
 * Errors (-1): bad config (dpo_beta, micro_batch_size, selection vs N), a missing model or one of another config,
 * ref == policy without an adapter, trajectories of different steps or shapes or of the wrong channels, a pair whose
 * samples differ in sigmas or whose indices are out of range or equal, an image-conditioned or two-expert
 * trajectory (not supported here), a uid over 32 bits, DiT failures, out of memory. The gradient may be partly
 * accumulated on error. */
int dpo_accumulate(wan_model *policy, const wan_model *ref, const wan_exec *ex, const dpo_step_config *c,
                   const dpo_batch *b, int backward, dpo_loss_stats *stats);

#endif
