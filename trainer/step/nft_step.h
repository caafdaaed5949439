/* trainer/step/nft_step.h — one DiffusionNFT training pass over a batch of trajectories on the Wan DiT: for every
 * trained (sample, step), the clean final latent noised at the step's sigma (nft_forward_sample), the old policy's
 * and (kl_beta > 0) the reference's velocity without gradient, the policy's with gradient, nft_loss_terms, and the
 * DiT backward of d loss / d v (flow_denoise_grad, flow_denoise_backward). trainer/step/nft.h has the arithmetic and
 * its sources (NVlabs/DiffusionNFT scripts/train_nft_sd3.py l.853-988).
 *
 * Transitions: sample s, step i in grpo_select_steps(sel, N, NULL, seed, uid_s) (no log-prob needed: ODE steps are
 * candidates; the reference's timestep_fraction f over a random permutation is "random_k int(f N)"), listed sample
 * by sample, steps ascending, cut into micro-batches of micro_batch_size transitions. Per transition:
 *   t = sigma_i (traj.sigmas[i]); the model's timestep traj.timesteps[i] (1000 sigma, the rollout's);
 *   x0 = the trajectory's final latent (latents[N]); x_t = nft_forward_sample(x0, t, seed, slot, uid) with
 *   slot = update * N + i;
 *   CFG-free: one conditional row per transition (guidance 1), as the reference trains (config/nft.py sets
 *   sample.guidance_scale 1.0; the guidance strength is then the model's own, no unconditional forward);
 *   forwards in this order: old (no grad), reference (no grad; the policy's base with its adapter off when
 *   ref == policy under LoRA), policy (activations kept).
 * denom = the global batch's trained transitions (grpo_count_transitions with has_logp NULL), so gradients summed
 * over micro-batches and ranks do not depend on the split. A transition's velocity does not depend on its batch
 * mates, so the loss is the same for every micro-batch size.
 * Two experts (Wan 2.2 A14B, nft_accumulate_experts): every transition is trained by the expert its rollout step
 * used (traj.expert[i]: the forward-process sample at that step's sigma goes through the same expert, as the
 * sampler's boundary routes it), with that expert's old policy and reference; a frozen expert's steps are not
 * candidates of the selection and not counted (grpo_select_steps_experts, as GRPO's trainer: trainer/step/train_step.h);
 * the transitions are grouped by expert into micro-batches. With one expert it is nft_accumulate, bit for bit.
 * Scope: text to video (no image condition); the old policy is a whole model (with LoRA: a model whose adapter is the
 * old adapter). Tested on the CPU and the emulated device (trainer/run/objective.c; the old policy resident on the
 * device as the reference is). */
#ifndef TRAINER_NFT_STEP_H
#define TRAINER_NFT_STEP_H

#include <stdint.h>

#include "core/trajectory.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_executor.h"
#include "trainer/step/grpo.h"
#include "trainer/step/nft.h"

typedef struct {
    grpo_selection sel;      /* algorithm.timestep_selection (has_logp is not used: every step is a candidate) */
    uint64_t seed;           /* run seed: selection (stream 1) and forward noise (CORE_STREAM_NFT_NOISE) */
    uint32_t update;         /* the optimizer update's index within the rollout step (noise slot update * N + i) */
    float nft_beta;          /* algorithm.nft_beta, > 0 */
    float adv_clip_max;      /* algorithm.adv_clip_max, > 0 */
    float kl_beta;           /* algorithm.beta, >= 0 (the reference's train.beta KL on velocities) */
    int micro_batch_size;    /* transitions per forward, >= 1 */
    wan_acts_mode acts_mode; /* WAN_ACTS_STORE or WAN_ACTS_RECOMPUTE */
    /* Probe (NULL: none): called for every transition after its loss, with the sample's batch index, the step, the
     * policy's velocity v and d loss / d v ([C, F, H, W] fp32, valid during the call; dv NULL when backward == 0). */
    void (*probe)(void *ctx, int sample, int step, const float *v, const float *dv, int64_t nl);
    void *probe_ctx;
} nft_step_config;

typedef struct {
    int n;                    /* samples */
    const core_traj *traj;    /* [n]: uid, sigmas, timesteps, latents (latents[N] the clean final latent) */
    const float *const *cond; /* [n] prompt embeddings [text_len, text_dim] */
    int text_len;
    const float *r;           /* [n] optimality probabilities (nft_optimality) */
    int64_t denom;            /* global trained-transition count; 0 = this batch's */
} nft_batch;

/* The trained-transition count of a batch (the loss denominator): sum over samples of grpo_select_steps' count with
 * every step a candidate. Pass the global batch. Errors (-1): empty batch, step counts that differ, sel invalid. */
int nft_count_transitions(const nft_step_config *c, const nft_batch *b, int64_t *count);

/* One pass over every trained transition of the batch (see the file comment).
 *   policy: with backward != 0 its trained buffer's grads (the adapter's under LoRA) are ACCUMULATED into (+=);
 *   old: the old policy (same config; may be policy itself only on the first update of a run, when they are equal);
 *   ref: the reference (needed when kl_beta > 0; may be policy under LoRA: its base);
 *   stats: accumulated into (zero it first).
 * Errors (-1): bad config (nft_beta, adv_clip_max, kl_beta, micro_batch_size, selection vs N), a missing model or
 * one of another config, kl_beta > 0 without ref, ref == policy without an adapter, trajectories of different steps
 * or shapes or of the wrong channels, an image-conditioned or two-expert trajectory (not supported here), a uid over
 * 32 bits, r out of [0, 1], DiT failures, out of memory. The gradient may be partly accumulated on error. */
int nft_accumulate(wan_model *policy, const wan_model *old, const wan_model *ref, const wan_exec *ex,
                   const nft_step_config *c, const nft_batch *b, int backward, nft_loss_stats *stats);

/* The trained-transition count over n_experts experts (1 or 2) with the trained flags (NULL: all): the sum over
 * samples of grpo_count_transitions_experts of their expert rows. Pass the global batch. n_experts 1 and trained
 * NULL: nft_count_transitions. Errors (-1): those of nft_count_transitions, n_experts out of range, an expert id or
 * a selection a sample cannot satisfy (named). */
int nft_count_transitions_experts(const nft_step_config *c, const nft_batch *b, int n_experts, const uint8_t *trained,
                                  int64_t *count);

/* nft_accumulate over n_experts experts (see the file comment): policy, old, ref [n_experts] (ref NULL when
 * kl_beta == 0; old[e], ref[e] needed for the trained experts only); trained [n_experts] 0/1 (NULL: all). The trained
 * experts' grads are accumulated into. Errors: those of nft_accumulate, n_experts out of range, experts of different
 * configs, no expert trained, a step's expert id >= n_experts. */
int nft_accumulate_experts(wan_model *const *policy, const wan_model *const *old, const wan_model *const *ref,
                           int n_experts, const uint8_t *trained, const wan_exec *ex, const nft_step_config *c,
                           const nft_batch *b, int backward, nft_loss_stats *stats);

#endif
