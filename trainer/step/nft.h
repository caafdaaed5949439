/* trainer/step/nft.h — the model-independent arithmetic of DiffusionNFT (algorithm.loss: nft): rewards to an
 * optimality probability, the forward-process sample at a trained timestep, the loss of one transition with its
 * gradient w.r.t. the current velocity, and the old policy's soft update.
 *
 * DiffusionNFT (Zheng et al. 2025, "DiffusionNFT: Online Diffusion Reinforcement with Forward Process",
 * arXiv 2509.16117; reference code NVlabs/DiffusionNFT scripts/train_nft_sd3.py) trains on the forward process: the
 * clean final latent x0 of a rollout (any sampler, ODE included; no log-prob) is noised at a sampled timestep t,
 * x_t = (1 - t) x0 + t eps, and the current velocity v and the old policy's v_old at x_t define the implicit
 * positive and negative policies
 *   v+ = beta v + (1 - beta) v_old,        v- = (1 + beta) v_old - beta v        (script l.934-937)
 * whose x0 predictions are regressed onto x0 with the weight r (the optimality probability) and 1 - r.
 *
 * How the trainer uses it, per optimizer step (the same skeleton as grpo.h's):
 *   controller: grpo_advantages(rewards, GRPO_STD_BATCH, adv_clip_max) -> A;  nft_optimality(A) -> r per sample
 *               denom = grpo_count_transitions(random_k K, has_logp NULL) of the global batch
 *   each rank:  grpo_select_steps(sel, N, NULL, seed, uid) -> trained steps; per step: t = sigma of that step,
 *               nft_forward_sample -> x_t; old policy forward (no grad) -> v_old; policy forward -> v;
 *               nft_loss_terms -> dv; DiT backward of dv (CFG-free: the conditional forward only).
 *   after the update(s) of a step: nft_old_decay(step) -> d; nft_soft_update(old, policy, d).
 * Everything here is single-threaded, in a fixed order, sums in double: results depend on the inputs only. */
#ifndef TRAINER_NFT_H
#define TRAINER_NFT_H

#include <stdint.h>

/* Optimality probabilities of n samples from their group advantages (grpo_advantages with GRPO_STD_BATCH: per-group
 * mean, whole-batch std + 1e-4, the reference's PerPromptStatTracker with global_std, its default):
 *   r = clamp(clamp(A, -c, c) / c / 2 + 1/2, 0, 1),   c = adv_clip_max           (script l.910-929, adv_mode "all")
 * computed in double, rounded once to float. A group whose rewards are all equal has A = 0, hence r = 1/2: its
 * samples still train (the positive and negative terms at equal weight), as in the reference.
 *   adv [n] f32, finite; r_out [n] f32. Errors (-1): n < 0, adv_clip_max not finite and > 0
 *   (algorithm.adv_clip_max), a non-finite advantage (names the sample). */
int nft_optimality(const float *adv, int n, float adv_clip_max, float *r_out);

/* The forward-process sample of one transition: eps = Philox normals of (seed, slot, uid, CORE_STREAM_NFT_NOISE)
 * (core_philox_normal, element i of the latent), x_t[i] = (1 - t) x0[i] + t eps[i] in fp32 (script l.868-870:
 * xt = (1 - t) x0 + t noise, noise fresh per transition). slot = update * N + step (N: denoising steps; update:
 * the index of the optimizer update within the rollout step), so every (sample, step, update) draws its own noise
 * and a resumed or colocated run draws the same. eps_out may be NULL.
 *   x0, xt_out [nl] f32 (nl >= 1; xt_out may not alias x0); 0 <= t <= 1.
 * Errors (-1): nl < 1, t out of [0, 1] or NaN. */
int nft_forward_sample(const float *x0, int64_t nl, float t, uint64_t seed, uint32_t slot, uint32_t uid,
                       float *xt_out, float *eps_out);

/* Sums over transitions, additive across micro-batches and ranks (zero before the first call). loss, policy and kl
 * are divided by the global denominator, so their sums over the global batch are the logged means. */
typedef struct {
    int64_t n_transitions;
    double loss;          /* sum of (policy + kl_beta KL) / denom */
    double policy;        /* sum of c (r L+ + (1 - r) L-) / beta / denom   (policy_loss) */
    double kl;            /* sum of KL / denom, KL = mean (v - v_ref)^2 (0 without a reference) */
    double positive_sum;  /* sum of L+ (divide by n_transitions for its mean) */
    double negative_sum;  /* sum of L- */
    double r_sum;         /* sum of r (mean optimality probability) */
    double old_deviate_sum; /* sum of mean (v - v_old)^2 (old_deviate) */
} nft_loss_stats;

/* dst += src, field by field. */
void nft_loss_stats_add(nft_loss_stats *dst, const nft_loss_stats *src);

/* The DiffusionNFT loss of one transition (a sample at one timestep) and its gradient w.r.t. the current velocity.
 *   nl: latent elements M (>= 1); t: the timestep as sigma in [0, 1];
 *   x0 [nl]: the clean latent; xt [nl]: nft_forward_sample's; v [nl]: the policy's velocity at (xt, t) (with
 *   gradient); v_old [nl]: the old policy's (data); v_ref [nl]: the reference model's (NULL when kl_beta == 0);
 *   r: nft_optimality of the sample, in [0, 1]; beta: the mixing coefficient (algorithm.nft_beta, > 0);
 *   adv_clip_max: c (> 0; the reference scales the loss by it); kl_beta: algorithm.beta (>= 0);
 *   denom: trained transitions of the global batch (>= 1).
 * In double, per element i (script l.934-970: the paper's negative-aware
 * loss with the adaptive weighting of the reference code):
 *   e+ = xt - t v+ - x0,  e- = xt - t v- - x0       (x0 predictions minus x0; v+, v- as in the file comment)
 *   w+ = max(mean |e+|, 1e-5),  w- = max(mean |e-|, 1e-5)     (no gradient: the reference's torch.no_grad)
 *   L+ = mean e+^2 / w+,  L- = mean e-^2 / w-,   KL = mean (v - v_ref)^2
 *   contribution = (c (r L+ + (1 - r) L-) / beta + kl_beta KL) / denom
 *   dv_out[i] = d contribution / d v[i]
 *             = (2 c t / M (-r e+_i / w+ + (1 - r) e-_i / w-) + 2 kl_beta (v_i - v_ref_i) / M) / denom
 *   (d e+ / d v = -t beta, d e- / d v = +t beta: beta cancels the 1 / beta), rounded once to float.
 * stats (may be NULL) is accumulated into. Errors (-1): nl < 1, t out of [0, 1], r out of [0, 1], beta or
 * adv_clip_max not finite and > 0, kl_beta < 0 or NaN, v_ref NULL with kl_beta > 0, denom < 1, a non-finite input
 * element (names the tensor and index). */
int nft_loss_terms(int64_t nl, float t, const float *x0, const float *xt, const float *v, const float *v_old,
                   const float *v_ref, float r, float beta, float adv_clip_max, float kl_beta, int64_t denom,
                   float *dv_out, nft_loss_stats *stats);

/* The old policy's decay after `step` optimizer steps (script l.169-189 return_decay, applied at l.1035-1039 once per
 * rollout step after its updates): 0 while step < flat, else min((step - flat) * rate, max). The reference's
 * decay_type 1 is (flat 0, rate 0.001, max 0.5), its default (config/nft.py); decay_type 2 is (75, 0.0075, 0.999);
 * decay_type 0 (0, 0, 0) makes the old policy the current one after every step. Returns the decay in [0, max]. */
double nft_old_decay(int64_t step, int64_t flat, double rate, double max);

/* old[i] = old[i] * decay + cur[i] * (1 - decay) in fp32 (script l.1039), i < n. decay in [0, 1]. With LoRA, old and
 * cur are the adapters' flat buffers (the reference keeps the old policy as a second adapter). */
void nft_soft_update(float *old, const float *cur, int64_t n, float decay);

#endif
