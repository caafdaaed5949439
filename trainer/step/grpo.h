/* trainer/step/grpo.h — the model-independent arithmetic of GRPO: group advantages, the clipped policy loss of one
 * transition with its gradient, timestep selection, and the loss denominator (docs/design.md section 4).
 *
 * How the trainer uses it, per optimizer step:
 *   controller:  grpo_advantages(rewards of the B x G batch)        -> A, mask per sample (scattered with samples)
 *                grpo_count_transitions(selection, whole batch)       -> denom (same number on every rank)
 *   each rank, each micro-batch, each sample: grpo_select_steps(seed, sample's uid) -> its trained steps;
 *                per step: model forward -> logp_new (flow), KL (flow); grpo_loss_terms(..., denom) -> dloss/dlogp_new,
 *                dloss/dKL; model backward accumulates parameter gradients (never divided again).
 *   gradients summed over every micro-batch and every rank = gradient of the global loss, whatever the split.
 *
 * Sources: Flow-GRPO (train_sd3.py: ratio, clipped loss, KL term; flow_grpo/stat_tracking.py: per-prompt mean,
 * per-prompt or global std, +1e-4), DanceGRPO (random steps per sample), miles (steps from a range), PPO (Schulman et
 * al. 2017). Gradient conventions follow torch autograd of the same expressions (see grpo_ppo_term). */
#ifndef TRAINER_GRPO_H
#define TRAINER_GRPO_H

#include <stdint.h>

/* ---- Advantages ---- */

/* Which std divides the centred rewards. The mean is always the group's. */
enum {
    GRPO_STD_GROUP = 0, /* std of the sample's own group (default) */
    GRPO_STD_BATCH = 1  /* std of all B*G rewards around the batch mean (Flow-GRPO's global_std, its default) */
};

/* Batch statistics returned by grpo_advantages (rewards: total reward per sample). */
typedef struct {
    double reward_mean, reward_std; /* over the B*G rewards; std is the population std (ddof 0) */
    double reward_min, reward_max;
    int n_masked_groups;   /* groups whose rewards are all exactly equal (incl. groups of one) */
    int n_masked_samples;  /* samples in those groups */
    double masked_fraction; /* n_masked_samples / (B*G) */
    int n_clamped;          /* samples whose |A| was cut to adv_clip_max */
} grpo_adv_stats;

/* Group-relative advantages of a batch of B groups (prompts) x G samples each, sample index b*G + g.
 *   rewards [B*G] f32, finite;  adv_out [B*G] f32;  mask_out [B*G] u8 (1: policy term trained, 0: masked);
 *   stats may be NULL.
 *   A = (r - mean_group(r)) / (std + 1e-4), std = population std (ddof 0) of the group (GRPO_STD_GROUP) or of the
 *   whole batch around the batch mean (GRPO_STD_BATCH); then A = clamp(A, -adv_clip_max, adv_clip_max).
 *   A group whose rewards are all exactly equal (max == min; a group of one always) gets A = 0 and mask = 0: its
 *   samples add no policy term but keep their KL term and still count in the loss denominator.
 * Arithmetic: every sum is in double, sample by sample in index order (group sums in g order, batch sums in b*G+g
 * order), one thread; A is computed in double and rounded once to float. So the result depends on the rewards only.
 * Errors (-1, nothing written to the outputs): B < 1 or G < 1 ("algorithm: ..."), std_mode unknown, adv_clip_max
 * NaN or <= 0 (INFINITY = no clamp; message names algorithm.adv_clip_max), a reward NaN/inf (names the sample).
 * Source: Flow-GRPO flow_grpo/stat_tracking.py (PerPromptStatTracker, global_std) and train_sd3.py (clamp). */
int grpo_advantages(const float *rewards, int B, int G, int std_mode, float adv_clip_max, float *adv_out,
                    uint8_t *mask_out, grpo_adv_stats *stats);

/* ---- Clipped policy loss of one transition ---- */

/* The PPO term of one transition as a function of its ratio, in fp32:
 *   *policy = max(-adv*ratio, -adv*clamp(ratio, 1-eps, 1+eps))      (bounds lo = 1.0f-eps, hi = 1.0f+eps in fp32)
 *   *dpolicy_dratio = its derivative with torch autograd's conventions for torch.maximum and torch.clamp:
 *     torch.clamp passes the gradient where lo <= ratio <= hi (bounds included); torch.maximum gives the larger
 *     branch its gradient and splits an exact tie 0.5/0.5. Consequences: inside [lo, hi] and exactly at lo or hi
 *     the gradient is -adv (no clipping); clipping (gradient 0) engages only for ratio strictly above hi with
 *     adv > 0 or strictly below lo with adv < 0; strictly outside with adv < 0 above hi (or adv > 0 below lo) the
 *     unclipped branch wins and the gradient is -adv; adv == 0 gives 0.
 * Returns 1 if ratio is strictly outside [lo, hi] (the event counted by the clip fraction), else 0.
 * Source: Flow-GRPO train_sd3.py (unclipped_loss, clipped_loss, torch.maximum), PPO-clip. */
int grpo_ppo_term(float ratio, float adv, float eps, float *policy, float *dpolicy_dratio);

/* Sums over transitions, additive across micro-batches and ranks (add the fields; then divide the *_sum fields by
 * n_transitions for means; loss, policy and kl are already divided by the global denominator, so their sums over
 * the whole global batch ARE the logged loss, policy loss and mean KL). Zero-initialise before the first call. */
typedef struct {
    int64_t n_transitions;   /* transitions passed to grpo_loss_terms */
    int64_t n_clipped;       /* ratio strictly outside [1-eps, 1+eps]: clip fraction = n_clipped / n_transitions */
    double loss;             /* sum of (mask*policy + beta*KL) / denom */
    double policy;           /* sum of mask*policy / denom */
    double kl;               /* sum of KL / denom (not multiplied by beta) */
    double abs_ratio_dev_sum; /* sum of |ratio - 1| */
    double abs_logp_diff_sum; /* sum of |logp_new - logp_old| (log_prob_mean_abs_diff on the first update) */
} grpo_loss_stats;

/* dst += src, field by field. */
void grpo_loss_stats_add(grpo_loss_stats *dst, const grpo_loss_stats *src);

/* Loss contributions and gradients of n trained transitions of one micro-batch (any n >= 0, any grouping).
 *   logp_new, logp_old, adv [n] f32; mask [n] u8 (from grpo_advantages, per sample, repeated per transition);
 *   kl [n] f32 = flow KL of the transition to the reference model (NULL allowed only when beta == 0);
 *   eps: clip range (> 0); beta: KL coefficient (>= 0); denom: grpo_count_transitions of the GLOBAL batch (>= 1;
 *   used as fp32, exact up to 2^24 transitions).
 * Per transition i, all in fp32: ratio = expf(logp_new - logp_old); grpo_ppo_term(ratio, adv, eps) -> policy, dpr;
 *   contribution = (mask*policy + beta*KL) / denom;
 *   dlogp_out[i] = d contribution / d logp_new = mask * dpr * ratio / denom   (d ratio / d logp_new = ratio);
 *   dkl_out[i]   = d contribution / d KL = beta / denom (the same for every transition; NULL allowed).
 * dlogp_out [n] f32 feeds the backward of the log-prob (flow), dkl_out that of the KL. Gradients flow through
 * logp_new only (logp_old, adv are data). stats (may be NULL) is accumulated into, not reset; its sums are in double
 * in index order. Errors (-1): eps <= 0 or NaN, beta < 0 or NaN, denom < 1, kl NULL with beta > 0, a non-finite
 * logp/adv/KL (names the transition index).
 * Source: Flow-GRPO train_sd3.py (ratio, clip, loss = policy_loss + beta * kl_loss), docs/design.md section 4 denominator. */
int grpo_loss_terms(int n, const float *logp_new, const float *logp_old, const float *adv, const uint8_t *mask,
                    const float *kl, float eps, float beta, int64_t denom, float *dlogp_out, float *dkl_out,
                    grpo_loss_stats *stats);

/* ---- GRPO-Guard (algorithm.loss: grpo_guard) ---- */

/* Loss terms of n transitions under GRPO-Guard (verl-omni GRPOGuardLoss; Wang et al. 2025, arXiv 2510.22319), which
 * replaces the ratio of grpo_loss_terms by a mean-bias-corrected, step-scaled one and rescales each step's policy
 * term. Per transition t (fp32, in this order):
 *   scale = step_std[t]                       (= sqrt(-dt) * std_t of the "sde" step: flow_step.step_std)
 *   ratio = expf((logp_new - logp_old + bias) * scale),  bias[t] = flow_kl(mean_new, mean_old_rollout) of the step
 *   w     = sqrt_dt * sqrt_dt,  sqrt_dt = sqrtf(-dt[t])
 *   policy term = grpo_ppo_term(ratio, adv, eps) / w
 *   loss += (mask * policy term + beta * KL) / denom   (stats->loss, ->policy, ->kl as in grpo_loss_terms)
 *   dlogp_out[t] = dbias_out[t] = mask * dpolicy_dratio * ratio * scale / w / denom,  dkl_out[t] = beta / denom.
 * (The reference takes means of sqrt(-dt) and std_t over the batch of one denoising step, which all share the
 * schedule: per transition they are its own values.) stats: as grpo_loss_terms (clip events on this ratio;
 * abs_logp_diff_sum of logp_new - logp_old without the bias).
 * dbias_out and dkl_out may be NULL (dbias equals dlogp). With a cps step verl-omni's scale is sqrt(-dt) * s (its
 * std_dev_t is s), not flow_step.step_std = s: passing step_std there departs from the reference. The bias and its
 * gradient (flow_kl, flow_sde_backward_v_guard) use step_std, so scale must be that same number.
 * Errors (-1): those of grpo_loss_terms, a NULL bias / step_std / dt (n > 0), a non-finite bias, step_std not finite
 * and > 0, dt not finite and < 0 (names t). */
int grpo_guard_loss_terms(int n, const float *logp_new, const float *logp_old, const float *bias,
                          const float *step_std, const float *dt, const float *adv, const uint8_t *mask,
                          const float *kl, float eps, float beta, int64_t denom, float *dlogp_out, float *dbias_out,
                          float *dkl_out, grpo_loss_stats *stats);

/* ---- Timestep selection (algorithm.timestep_selection) ---- */

typedef enum {
    GRPO_SEL_ALL = 0,        /* every step with a log-prob */
    GRPO_SEL_FIRST_FRACTION, /* steps 0 .. int(fraction*N)-1 (Flow-GRPO timestep_fraction) */
    GRPO_SEL_RANDOM_K,       /* k distinct random steps per sample (DanceGRPO) */
    GRPO_SEL_FROM_RANGE      /* k distinct random steps per sample from range_a..range_b inclusive (miles) */
} grpo_sel_mode;

typedef struct {
    grpo_sel_mode mode;
    double fraction;       /* FIRST_FRACTION: 0 < fraction <= 1 */
    int k;                 /* RANDOM_K, FROM_RANGE: steps per sample */
    int range_a, range_b;  /* FROM_RANGE: step indices, 0 <= a <= b <= N-1 */
} grpo_selection;

/* Parses the text form: "all", "first_fraction F", "random_k K", "from_range A B K" (also "from_range [A, B] K").
 * Does not check against N (see grpo_selection_validate). Returns 0, or -1 with an error naming
 * algorithm.timestep_selection and the bad text. */
int grpo_selection_parse(const char *text, grpo_selection *out);

/* Writes the text form of sel into buf (cap bytes, NUL-terminated; truncated if short): "random_k 3", ... */
void grpo_selection_format(const grpo_selection *sel, char *buf, int cap);

/* Checks sel against N denoising steps (N >= 1). Errors (-1, message starts "algorithm.timestep_selection: "):
 * FIRST_FRACTION with fraction NaN, <= 0 or > 1, or int(fraction*N) == 0; RANDOM_K with k < 1 or k > N;
 * FROM_RANGE with a < 0, b > N-1, a > b, k < 1 or k > b-a+1; an unknown mode. */
int grpo_selection_validate(const grpo_selection *sel, int N);

/* The trained steps of one sample, in ascending order.
 *   N: denoising steps of the trajectory (transitions i = 0..N-1, latents[i] -> latents[i+1]);
 *   has_logp [N] u8: 1 where step i has a log-prob (std > 0); 0 steps (eta 0, ODE) are never trained; NULL = all;
 *   seed: the run's seed; uid: the sample's rollout uid (docs/design.md section 4: rollout_round*B*G + prompt_slot*G +
 *   replica); steps_out [N] int (capacity N); *n_out = number written.
 * Candidates: ALL -> steps with a log-prob; FIRST_FRACTION -> those among 0..int(fraction*N)-1; RANDOM_K -> k of the
 * steps with a log-prob; FROM_RANGE -> k of those in a..b. Random draws: with E = the m candidates in ascending
 * order, a partial Fisher-Yates shuffle, j = 0..k-1: r = j + floor(u_j * (m - j)), swap E[j], E[r], where
 * u_j is Philox uniform element j of (seed, slot 0, uid, stream 1) (core_philox_uniform, double in (0,1)); the
 * chosen E[0..k-1] are then sorted. So the selection depends on (seed, uid, N, has_logp, sel) only.
 * Errors (-1): sel invalid for N (grpo_selection_validate), fewer than k candidates with a log-prob, or no step
 * selected at all (e.g. every step has std 0): messages name algorithm.timestep_selection. */
int grpo_select_steps(const grpo_selection *sel, int N, const uint8_t *has_logp, uint64_t seed, uint32_t uid,
                      int *steps_out, int *n_out);

/* ---- Loss denominator ---- */

/* The number of trained transitions of a batch of n_samples samples (pass the GLOBAL batch: every dp rank, every
 * accumulation micro-batch, each sample once however many SP peers hold it). has_logp: NULL (all steps have a
 * log-prob), one row [N] shared by all samples (has_logp_stride 0), or [n_samples, N] (has_logp_stride N).
 * Equals the sum over the samples of grpo_select_steps' *n_out without drawing any random number (the random modes
 * take exactly k per sample). Masked samples (A = 0) count: they keep their KL term. Every micro-batch divides by
 * this one number, so the summed gradient does not depend on the micro-batch or rank split.
 * Errors (-1): n_samples < 0, has_logp_stride not 0 or N, and every error of grpo_select_steps. */
int grpo_count_transitions(const grpo_selection *sel, int N, const uint8_t *has_logp, int has_logp_stride,
                           int n_samples, int64_t *count);

/* ---- Two experts (Wan 2.2 A14B; algorithm.train_experts) ---- */

/* A two-expert rollout records the expert of every step (0: transformer/, high noise; 1: transformer_2/, low noise).
 * When only some experts are trained, the steps of a frozen expert are treated like steps without a log-prob: they
 * are never candidates of the selection and never counted in the denominator. So with every expert trained these
 * functions equal grpo_select_steps / grpo_count_transitions (same random draws); with one frozen, "first_fraction"
 * keeps the trained expert's steps among the first ones, and "random_k k" draws its k steps among the trained
 * expert's steps (a sample still trains k transitions). A frozen expert's transitions thus neither train nor dilute
 * the loss: "freeze transformer_2" means its steps do not contribute. */

/* The trainable-step mask of one sample: out[i] = 1 where step i has a log-prob (has_logp NULL: all) and its expert
 * is trained (expert NULL: all steps expert 0; trained NULL: every expert trained), else 0.
 *   has_logp, expert, out [N] u8; trained [n_experts] u8 (0 or 1); 1 <= n_experts <= 2.
 * Errors (-1): N < 1, n_experts out of range, an expert id >= n_experts (names the step). */
int grpo_trainable_steps(int N, const uint8_t *has_logp, const uint8_t *expert, const uint8_t *trained, int n_experts,
                         uint8_t *out);

/* grpo_select_steps over the trainable steps (grpo_trainable_steps) of one sample: the trained steps, ascending.
 * Errors: those of grpo_trainable_steps and grpo_select_steps; when an expert is frozen the message says that its
 * steps are not candidates (algorithm.train_experts). */
int grpo_select_steps_experts(const grpo_selection *sel, int N, const uint8_t *has_logp, const uint8_t *expert,
                              const uint8_t *trained, int n_experts, uint64_t seed, uint32_t uid, int *steps_out,
                              int *n_out);

/* grpo_count_transitions over the trainable steps: the loss denominator of a two-expert batch with some experts
 * frozen (pass the GLOBAL batch, as for grpo_count_transitions). has_logp and expert: NULL, one row [N] shared by all
 * samples (stride 0) or [n_samples, N] (stride N), both read with the same stride. Equals the sum over samples of
 * grpo_select_steps_experts' *n_out. Errors: stride not 0 or N, n_samples < 0, and those of
 * grpo_select_steps_experts (prefixed with the sample index). */
int grpo_count_transitions_experts(const grpo_selection *sel, int N, const uint8_t *has_logp, const uint8_t *expert,
                                   int stride, int n_samples, const uint8_t *trained, int n_experts, int64_t *count);

#endif
