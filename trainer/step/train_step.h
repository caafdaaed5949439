/* trainer/step/train_step.h — one GRPO training pass over a batch of trajectories on the Wan DiT (CPU, fp32): recompute
 * the (guided) velocity of every trained transition with gradient, the log-prob of the recorded next latent and the
 * KL to the frozen reference, the loss terms with the global denominator, and the backward into the parameter
 * gradients; then the optimizer step. docs/design.md section 4 is the contract; trainer/step/grpo.h has the per-transition
 * arithmetic, model/flow/flow.h the step and its backward, model/flow/guidance.h the CFG combination.
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
 * micro-batch size.
 * Image to video (Wan 2.2 TI2V; trajectories with a `condition`, core/trajectory.h): the forwards take the stored
 * latents as they are (frame 0 is the condition) with per-token timesteps, and the step, its log-prob, the KL and
 * GRPO-Guard's bias run over the generated frames only (model/flow/first_frame.h), exactly as the rollout's did; the
 * velocity of frame 0 gets no gradient. A batch is conditioned throughout or not at all.
 * On a device (ex->dev, model.device cuda; model/dit/wan_dev_exec.h): the forwards and the backward run there (bf16;
 * acts_mode may also be WAN_ACTS_CHECKPOINT), the velocity comes back in fp32 and everything between them is the host
 * code above; the gradients stay on the device, so the update needs trainer_config.opt_step = trainer/optim/train_dev.h's
 * step (the policy's host grads need not be allocated). */
#ifndef TRAINER_TRAIN_STEP_H
#define TRAINER_TRAIN_STEP_H

#include <stdint.h>

#include "core/trajectory.h"
#include "model/dit/wan_dit.h"
#include "model/flow/flow.h"
#include "trainer/step/grpo.h"
#include "trainer/optim/optim.h"

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
    flow_kind kind;              /* the rollout's step kind (rollout.sde_type, algorithm.cps_logprob); zeroed = sde */
    int guard;                   /* 1: algorithm.loss grpo_guard (grpo_guard_loss_terms; trajectories carry the
                                    rollout's step means) */
    /* Gradient hook of trainer_update / trainer_update_experts (NULL: none; data parallelism: trainer/dp/dp.h's
     * dp_grad_reduce with ctx = the communicator): called once per update after this rank's gradients of the trained
     * experts are accumulated and before the norm, clipping and AdamW; it may sum the trained experts' grads over
     * ranks, and `stats` (this update's statistics alone, zeroed before the accumulation; added to the caller's stats
     * afterwards) with them. Returns 0, or -1 with core_error (the update then changes no weights). */
    int (*grad_reduce)(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained,
                       grpo_loss_stats *stats);
    void *grad_reduce_ctx;
    /* The gradient reduction overlapping the backward (trainer/dp/dp_bucket.h; NULL: none; the device path only,
     * ex->dev): grad_arm is called once per accumulation with a backward, on every rank before its first micro-batch,
     * with this rank's micro-batches per expert, and sets bit e of *armed for the experts whose LAST micro-batch's
     * backward then runs with wan_exec.grad_ready = grad_ready (the gradients are final only there); both get
     * grad_overlap_ctx. The gradient hook above then completes what the buckets began. 0, or -1 with core_error. */
    int (*grad_arm)(void *ctx, int n_experts, const int *n_micro, unsigned *armed);
    int (*grad_ready)(void *ctx, const wan_model *m, int block);
    void *grad_overlap_ctx;
    /* Expert phases (NULL: none; the device path at ZeRO stage 3 with both experts trained: trainer/dp/dp_dev.h's
     * expert window, where the two experts share one buffer of weights and one of gradients): trainer_accumulate_experts
     * calls expert_phase(ctx, e, 0, backward) before trained expert e's first micro-batch and expert_phase(ctx, e, 1,
     * backward) after its last (after the grad_arm above), for every trained expert in order and on every rank, a share
     * without transitions of e too (the hook is collective over the trainer ranks). 0, or -1 with core_error. */
    int (*expert_phase)(void *ctx, int e, int end, int backward);
    void *expert_phase_ctx;
    /* Optimizer-step hook (NULL: the step below on this rank's whole state; ZeRO stages 1 and 2: trainer/dp/zero.h's
     * dp_zero_step, ctx = the dp_reduce_ctx): called after the gradient hook in place of the norm, clipping and
     * AdamW, with the same arguments; it must give the same norm, clip factor and update (info as they do). */
    int (*opt_step)(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained,
                    optim_adamw *const *opt, const optim_config *ocfg, optim_step_info *info);
    void *opt_step_ctx;
    /* Probe (NULL: none; the parity check): called for every transition right after its forward, with the sample's
     * index in the batch, the step, the velocity the loss uses (guided: v_u + g (v_c - v_u) when the step's g != 1;
     * [C, F, H, W] fp32, valid during the call) and the recomputed log-prob of the recorded next latent. */
    void (*probe)(void *ctx, int sample, int step, const float *v, int64_t nl, float logp_new);
    void *probe_ctx;
    /* Stop hook (NULL: never stops; the GRPO loop passes core/stop.h's core_stop_interrupt): polled before every
     * micro-batch and, in trainer_update(_experts), once more after the last one, before the gradient hook and the
     * optimizer step. A non-zero return (the signal number) ends the pass with the error "training stopped by signal
     * N ..." having changed no weight and no optimizer state (the gradients may hold a partial sum). Once the last
     * poll has passed, the update runs to its end. With a gradient hook over several ranks every rank must get the
     * same answer (a collective would otherwise wait for ever): the GRPO loop passes NULL there. */
    int (*should_stop)(void);
} trainer_config;

/* One pass over every trained transition of the batch.
 *   policy: weights under training; with backward != 0 its grads must be allocated and are ACCUMULATED into (+=;
 *   the caller zeroes them). backward == 0: forward only (loss and stats, e.g. for finite differences).
 *   ref: frozen reference weights (needed when beta > 0; may be NULL when beta == 0).
 *   stats: accumulated into (zero it first): loss, policy loss, KL, clip counts, |ratio-1|, |logp_new-logp_old|.
 * Errors (-1): bad config (clip_eps, beta, micro_batch_size, selection vs N), beta > 0 without ref, a trajectory whose
 * shape differs from the first or from the model, an expert id other than 0 (a two-expert rollout: use
 * trainer_accumulate_experts), DiT failures, out of memory, a stop (tc->should_stop). The gradient may be partly accumulated when an error
 * occurs mid-way. The one-expert case of trainer_accumulate_experts (same results, bit for bit). */
int trainer_accumulate(wan_model *policy, const wan_model *ref, const wan_exec *ex, const trainer_config *tc,
                       const trainer_batch *b, int backward, grpo_loss_stats *stats);

/* One optimizer update on the batch: zero grads, trainer_accumulate, optim_adamw_step (clipping, lr schedule,
 * AdamW). opt and policy's grads must be allocated. info and stats may be NULL. Errors: as above, and a non-finite
 * gradient norm (the weights are then unchanged). The one-expert case of trainer_update_experts. */
int trainer_update(wan_model *policy, const wan_model *ref, const wan_exec *ex, const trainer_config *tc,
                   const trainer_batch *b, optim_adamw *opt, const optim_config *ocfg, grpo_loss_stats *stats,
                   optim_step_info *info);

/* ---- Two experts (Wan 2.2 A14B: expert 0 = transformer/, high noise; expert 1 = transformer_2/, low noise) ----
 *
 * Every transition is trained by the expert its rollout step used (traj.expert[i], recorded by rollout/engine.h),
 * sample by sample, never by a batch's first: forward and backward through policy[e] with that step's guidance
 * (guidance_scale for expert 0, guidance_scale_2 for expert 1, both recorded in the trajectory), the KL to ref[e].
 * trained[e] (algorithm.train_experts; NULL = every expert) picks the experts under training; a frozen expert is
 * neither trained nor synced, and its steps are not candidates of the timestep selection and not counted in the
 * loss denominator (grpo_select_steps_experts, grpo_count_transitions_experts): "freeze transformer_2" means its
 * steps do not contribute, and the loss is the mean over the trained experts' transitions. With every expert
 * trained the selection, the denominator and the random draws are those of the one-expert trainer.
 * Micro-batches: the selected transitions are grouped by expert (expert 0's, then expert 1's; within a group sample
 * by sample, steps ascending) and each group is cut into micro-batches of micro_batch_size transitions, so a forward
 * runs one expert and never mixes them. Each expert's gradient is therefore exactly that of trainer_accumulate on
 * its transitions alone with the same denominator, and, as there, logp_new equals the rollout's log-prob bit for
 * bit on the first update and the gradient depends on micro_batch_size only through fp32 summation order.
 * b->denom (when > 0) must be grpo_count_transitions_experts of the global batch with the same trained flags. */

/* The loss denominator of a batch: the number of its trained transitions (grpo_count_transitions_experts over each
 * trajectory's has_log_prob and expert rows, with tc->sel and the trained experts; n_experts 1 and trained NULL: the
 * one-expert count). Pass the whole global batch and set the result as trainer_batch.denom of every rank's share.
 * Errors (-1): n_experts not 1 or 2, an empty batch, trajectories of different step counts, the selection invalid
 * for N, an expert id >= n_experts, a sample without a trainable step (messages name the sample). */
int trainer_count_transitions(const trainer_config *tc, const trainer_batch *b, int n_experts, const uint8_t *trained,
                              int64_t *count);

/* trainer_accumulate over n_experts (1 or 2) experts.
 *   policy [n_experts]: each expert's weights (same config); grads of the TRAINED experts are accumulated into (+=;
 *   the caller zeroes them) when backward != 0; a frozen expert's weights and grads are never touched.
 *   ref [n_experts] (may be NULL when beta == 0): each expert's frozen reference (needed for trained experts when
 *   beta > 0; same config as its policy).
 *   trained [n_experts] u8 0/1, NULL = all; at least one expert trained.
 * Errors (-1): those of trainer_accumulate, n_experts not 1 or 2, experts of different configs, no trained expert, a
 * trained flag other than 0/1, an expert id >= n_experts, a sample whose selection finds no trainable step (e.g.
 * "all" with every one of its steps on a frozen expert; the message names algorithm.train_experts). */
int trainer_accumulate_experts(wan_model *const *policy, const wan_model *const *ref, int n_experts,
                               const uint8_t *trained, const wan_exec *ex, const trainer_config *tc,
                               const trainer_batch *b, int backward, grpo_loss_stats *stats);

/* LoRA (model/dit/wan_lora.h, trainer/optim/lora.h): a policy model with an adapter attached and no base gradients trains
 * its adapter: the backward accumulates into the adapter's grads, and the update below zeroes, clips and steps the
 * adapter's flat buffers (trainer_trained_buffer) instead of the model's; opt[e]->n is then the adapter's numel. Its
 * reference may be the policy model itself (ref[e] == policy[e]): the KL reference forward then runs it with
 * wan_exec.lora_off = 1 (the base), so no second copy of the weights exists.
 *
 * One optimizer step over every trained expert: zero the trained experts' grads, trainer_accumulate_experts, then
 * the global L2 norm over all trained experts' gradients together (optim_grad_norm_multi: torch's
 * clip_grad_norm_ over the parameters of both models), one clip factor optim_clip_coef(norm, max_grad_norm) for all,
 * and AdamW on each trained expert's own buffer and moments (optim_adamw_step_coef) with the same lr. When
 * tc->grad_reduce is set it runs between the accumulation and the norm (see trainer_config).
 *   opt [n_experts]: each trained expert's optimizer state (n = its parameter count; NULL allowed for a frozen
 *   expert); the trained experts' states must be at the same step (one run, one schedule).
 *   info (may be NULL): the global grad norm, the clip factor and the lr.
 * Errors (-1): those of trainer_accumulate_experts, missing grads or optimizer state of a trained expert, a
 * parameter count mismatch, trained optimizers at different steps, an invalid optim_config, a stop (tc->should_stop),
 * a grad_reduce failure or a non-finite global gradient norm (no weights changed). A frozen expert's params, grads and optimizer state are never touched. */
int trainer_update_experts(wan_model *const *policy, const wan_model *const *ref, int n_experts,
                           const uint8_t *trained, const wan_exec *ex, const trainer_config *tc,
                           const trainer_batch *b, optim_adamw *const *opt, const optim_config *ocfg,
                           grpo_loss_stats *stats, optim_step_info *info);

/* The two halves of trainer_update_experts around its accumulation, for an objective that accumulates its own
 * gradients (trainer/run/objective.c: the forward-process objectives) and then steps exactly as GRPO does.
 * trainer_update_check: trainer_update_experts' checks of the models, grads, optimizer states and ocfg; *first = the
 * first trained expert. trainer_opt_step_experts: after the gradients are accumulated (and reduced), tc->opt_step
 * when set, else the global norm over the trained experts, one clip factor and AdamW on each (errors: a non-finite
 * norm, no weights changed). */
int trainer_update_check(wan_model *const *policy, int n_experts, const uint8_t *trained, const wan_exec *ex,
                         const trainer_config *tc, optim_adamw *const *opt, const optim_config *ocfg, int *first);
int trainer_opt_step_experts(wan_model *const *policy, int n_experts, const uint8_t *trained, const trainer_config *tc,
                             optim_adamw *const *opt, const optim_config *ocfg, int first, optim_step_info *info);

#endif
