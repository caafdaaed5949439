/* trainer/train_step.h — one GRPO training pass over a batch of trajectories on the Wan DiT (CPU, fp32): recompute
 * the (guided) velocity of every trained transition with gradient, the log-prob of the recorded next latent and the
 * KL to the frozen reference, the loss terms with the global denominator, and the backward into the parameter
 * gradients; then the optimizer step. DESIGN.md section 4 is the contract; trainer/grpo.h has the per-transition
 * arithmetic, model/flow.h the step and its backward, model/guidance.h the CFG combination.
 *
 * Transitions: sample s, step i in grpo_select_steps(sel, N, has_log_prob, seed, uid_s), listed sample by sample,
 * steps ascending; cut into micro-batches of micro_batch_size transitions (any size: a micro-batch may mix samples
 * and steps, every transition carries its own timestep and recorded guidance). One micro-batch:
 *   rows   = the transitions' conditional forwards, then the unconditional ones of those with guidance g != 1
 *   policy : wan_forward (activations kept) -> v_c, v_u;  v = flow_cfg_combine;  flow_sde_step(x_i, v, x_{i+1}
 *            recorded) -> mean, logp_new
 *   ref    : (beta > 0) the reference's forward with the same rows, no gradient -> mean_ref;  flow_kl -> KL
 *   loss   : grpo_loss_terms(logp_new, logp_old, A, mask, KL, eps, beta, denom) -> d/dlogp, d/dKL
 *   back   : flow_sde_backward_v -> dv; flow_cfg_backward -> dv_c, dv_u; wan_backward accumulates into grads.
 * denom = the number of trained transitions of the whole batch (grpo_count_transitions), so gradients summed over
 * micro-batches do not depend on the split. Weights are fp32; the velocity of a sample does not depend on its batch
 * mates (the DiT's contract), so on the first update logp_new equals the rollout's log-prob bit for bit, whatever the
 * micro-batch size. */
#ifndef TRAINER_TRAIN_STEP_H
#define TRAINER_TRAIN_STEP_H

#include <stdint.h>

#include "core/trajectory.h"
#include "model/wan_dit.h"
#include "trainer/grpo.h"
#include "trainer/optim.h"

/* The batch one update trains on (borrowed arrays, n samples). */
typedef struct {
    int n;                       /* samples */
    const core_traj *traj;       /* [n]; uid, sigmas, timesteps, latents, log-probs, has_log_prob, eta, guidance */
    const float *const *cond;    /* [n] prompt embeddings [text_len, text_dim] */
    const float *neg;            /* negative prompt embedding [text_len, text_dim]; NULL: all zeros */
    int text_len;                /* L */
    const float *adv;            /* [n] advantages (grpo_advantages) */
    const uint8_t *mask;         /* [n] 1: policy term trained */
    int64_t denom;               /* global trained-transition count; 0 = count this batch (local mode) */
} trainer_batch;

typedef struct {
    grpo_selection sel;          /* algorithm.timestep_selection */
    uint64_t seed;               /* run seed (selection stream key) */
    float clip_eps;              /* algorithm.clip_range, > 0 */
    float beta;                  /* algorithm.beta (KL), >= 0 */
    int micro_batch_size;        /* transitions per forward, >= 1 */
    wan_acts_mode acts_mode;     /* WAN_ACTS_STORE or WAN_ACTS_RECOMPUTE */
} trainer_config;

/* One pass over every trained transition of the batch.
 *   policy: weights under training; with backward != 0 its grads must be allocated and are ACCUMULATED into (+=;
 *   the caller zeroes them). backward == 0: forward only (loss and stats, e.g. for finite differences).
 *   ref: frozen reference weights (needed when beta > 0; may be NULL when beta == 0).
 *   stats: accumulated into (zero it first): loss, policy loss, KL, clip counts, |ratio-1|, |logp_new-logp_old|.
 * Errors (-1): bad config (clip_eps, beta, micro_batch_size, selection vs N), beta > 0 without ref, a trajectory whose
 * shape differs from the first or from the model, an expert id other than 0 (two experts: later), DiT failures,
 * out of memory. The gradient may be partly accumulated when an error occurs mid-way. */
int trainer_accumulate(wan_model *policy, const wan_model *ref, const wan_exec *ex, const trainer_config *tc,
                       const trainer_batch *b, int backward, grpo_loss_stats *stats);

/* One optimizer update on the batch: zero grads, trainer_accumulate, optim_adamw_step (clipping, lr schedule,
 * AdamW). opt and policy's grads must be allocated. info and stats may be NULL. Errors: as above, and a non-finite
 * gradient norm (the weights are then unchanged). */
int trainer_update(wan_model *policy, const wan_model *ref, const wan_exec *ex, const trainer_config *tc,
                   const trainer_batch *b, optim_adamw *opt, const optim_config *ocfg, grpo_loss_stats *stats,
                   optim_step_info *info);

#endif
