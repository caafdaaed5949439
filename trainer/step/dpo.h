/* trainer/step/dpo.h — the model-independent arithmetic of online Flow-DPO (algorithm.loss: dpo): preference pairs
 * from the rewards of each prompt group, the forward-process sample of a pair at shared noise and timestep, and the
 * Diffusion-DPO loss of one pair at one timestep with its gradient w.r.t. the policy's velocities of both samples.
 *
 * Diffusion-DPO (Wallace et al. 2023, "Diffusion Model Alignment Using Direct Preference Optimization",
 * arXiv 2311.12908; reference code SalesforceAIResearch/DiffusionDPO train.py l.1125-1145) compares, for a preferred
 * sample x^w and a rejected one x^l noised with the SAME noise at the SAME timestep, the policy's denoising errors
 * with the reference model's:
 *   z = -beta / 2 ((err_w - err_w_ref) - (err_l - err_l_ref)),      loss = -log sigmoid(z)
 * where err is the mean squared error of the prediction against its target. The flow-matching form (yifan123/flow_grpo
 * scripts/train_sd3_dpo.py l.884-937; X-GenGroup/Flow-Factory src/flow_factory/trainers/rl/dpo.py, DPOTrainer) takes
 * the velocity and its target eps - x0 (Wan's convention: the DiT predicts v ~ noise - x0, model/flow/flow.h), with
 * x_t = (1 - t) x0 + t eps (l.903). "Online": the pairs come from the current policy's rollouts, ranked by reward
 * within each prompt group (flow_grpo/stat_tracking.py l.38-52: the group's argmax and argmin).
 *
 * How the trainer uses it, per optimizer step (the same skeleton as nft.h's):
 *   controller: dpo_select_pairs(rewards of the B x G batch) -> pairs (w, l) of batch indices
 *               denom = dpo_count_terms of the global batch (trained steps summed over pairs)
 *   each rank:  per pair: grpo_select_steps(sel, N, NULL, seed, uid_w) -> trained steps; per step: t = sigma,
 *               dpo_forward_pair -> x_t^w, x_t^l, eps; reference forward (no grad) and policy forward of both;
 *               dpo_loss_terms -> dv_w, dv_l; DiT backward of both (CFG-free: the conditional forward only).
 * Everything here is single-threaded, in a fixed order, sums in double: results depend on the inputs only. */
#ifndef TRAINER_DPO_H
#define TRAINER_DPO_H

#include <stdint.h>

/* How pairs are chosen in a group (algorithm.dpo_pairs). */
typedef enum {
    DPO_PAIRS_BEST_WORST = 0, /* "best_worst": the best and the worst sample of each group (the references') */
    DPO_PAIRS_ALL = 1         /* "all": every two samples of a group whose rewards differ by more than the margin */
} dpo_pair_rule;

/* "best_worst" or "all" -> *out. Errors (-1): anything else (names algorithm.dpo_pairs). */
int dpo_pair_rule_parse(const char *text, dpo_pair_rule *out);
/* The rule's recipe spelling ("best_worst", "all"). */
const char *dpo_pair_rule_name(dpo_pair_rule rule);

/* One preference pair: batch indices of the preferred (w, winner) and the rejected (l, loser) sample, and the reward
 * gap r_w - r_l (> margin >= 0). */
typedef struct {
    int w, l;
    float gap;
} dpo_pair;

/* The most pairs dpo_select_pairs can give for B groups of G: B (best_worst) or B G (G - 1) / 2 (all); -1 on bad
 * arguments or overflow of int. */
int dpo_max_pairs(int B, int G, dpo_pair_rule rule);

/* Preference pairs of a batch of B groups (prompts) x G samples, sample index b*G + g (grpo_advantages' layout).
 *   rewards [B*G] f32, finite; margin >= 0 (algorithm.dpo_margin, in reward units);
 *   out [dpo_max_pairs(B, G, rule)]; *n_out: the pairs written, in group order.
 * best_worst: w = the first sample of the group's largest reward, l = the first of its smallest (torch.argmax /
 *   argmin: the first index of a tie, as flow_grpo/stat_tracking.py l.42-43 and Flow-Factory's
 *   _form_pairs_from_advantages); kept when r_w - r_l > margin. A group whose rewards are all equal gives no pair
 *   (flow_grpo then trains samples 1 over 0 of the group, l.45-47, a pair without a preference; we leave it out).
 * all: for g < h in group order, the pair (the higher, the lower) when |r_g - r_h| > margin; ties give no pair.
 * Errors (-1): B < 1, G < 2 (a group of one has no pair: rollout.samples_per_prompt must be >= 2 for algorithm.loss dpo),
 * margin negative or not finite (algorithm.dpo_margin), a non-finite reward (names the sample). */
int dpo_select_pairs(const float *rewards, int B, int G, dpo_pair_rule rule, float margin, dpo_pair *out, int *n_out);

/* The forward-process samples of a pair at one timestep with shared noise: eps = Philox normals of
 * (seed ^ (uid_l << 32), slot, uid_w, CORE_STREAM_DPO_NOISE) (core_philox_normal, element i of the latent), then in
 * fp32 x_t^w[i] = (1 - t) x0_w[i] + t eps[i] and x_t^l[i] = (1 - t) x0_l[i] + t eps[i] (flow_grpo
 * train_sd3_dpo.py l.884-886 and l.903: one noise for both, fresh per step). Keying by both uids gives every pair its
 * own noise (under the "all" rule a sample is in several pairs) and a resumed or colocated run the same;
 * slot = update * N + step (N: denoising steps), as nft_forward_sample's.
 *   x0_w, x0_l, xt_w, xt_l, eps_out [nl] f32 (nl >= 1; outputs do not alias inputs; eps_out may be NULL);
 *   0 <= t <= 1. Errors (-1): nl < 1, t out of [0, 1] or NaN. */
int dpo_forward_pair(const float *x0_w, const float *x0_l, int64_t nl, float t, uint64_t seed, uint32_t slot,
                     uint32_t uid_w, uint32_t uid_l, float *xt_w, float *xt_l, float *eps_out);

/* Sums over terms (a pair at one timestep), additive across micro-batches and ranks (zero before the first call).
 * loss is divided by the global denominator, so its sum over the global batch is the logged mean. */
typedef struct {
    int64_t n_terms;
    double loss;         /* sum of -log sigmoid(z) / denom */
    double margin_sum;   /* sum of z, the implicit reward margin (inside_term; divide by n_terms for its mean) */
    int64_t n_positive;  /* terms with z > 0 (implicit_acc: n_positive / n_terms) */
    double err_w_sum;    /* sums of the policy's errors err_w, err_l and the reference's (model_w_err, ...) */
    double err_l_sum;
    double ref_w_sum;
    double ref_l_sum;
} dpo_loss_stats;

/* dst += src, field by field. */
void dpo_loss_stats_add(dpo_loss_stats *dst, const dpo_loss_stats *src);

/* The Diffusion-DPO loss of one term and its gradient w.r.t. the policy's velocities of both samples.
 *   nl: latent elements M (>= 1); eps [nl]: the shared noise; x0_w, x0_l [nl]: the clean latents;
 *   v_w, v_l [nl]: the policy's velocities at (x_t^w, t), (x_t^l, t) (with gradient); vr_w, vr_l [nl]: the
 *   reference's (data); beta: algorithm.dpo_beta (> 0); denom: terms of the global batch (>= 1).
 * In double, per element (flow_grpo train_sd3_dpo.py l.924-937; DiffusionDPO train.py l.1125-1145):
 *   target_w = eps - x0_w,  target_l = eps - x0_l
 *   err_w = mean (v_w - target_w)^2,  err_l = mean (v_l - target_l)^2,  ref_w, ref_l the same of vr_w, vr_l
 *   z = -beta / 2 ((err_w - ref_w) - (err_l - ref_l)),   contribution = softplus(-z) / denom  (= -log sigmoid(z))
 *   dvw_out[i] =  sigmoid(-z) beta (v_w[i] - target_w[i]) / M / denom
 *   dvl_out[i] = -sigmoid(-z) beta (v_l[i] - target_l[i]) / M / denom
 * softplus and sigmoid in their overflow-free forms; the gradients rounded once to float (either may be NULL).
 * stats (may be NULL) is accumulated into. Errors (-1): nl < 1, beta not finite and > 0, denom < 1, a non-finite
 * input element (names the tensor and index). */
int dpo_loss_terms(int64_t nl, const float *eps, const float *x0_w, const float *x0_l, const float *v_w,
                   const float *v_l, const float *vr_w, const float *vr_l, float beta, int64_t denom, float *dvw_out,
                   float *dvl_out, dpo_loss_stats *stats);

#endif
