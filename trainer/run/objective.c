/* trainer/run/objective.c — the loop's objective (algorithm.loss): one optimizer update on a step's batch, its
 * statistics as metrics fields and on the step's line. GRPO and GRPO-Guard go through trainer/step/train_step.h
 * (log-probs of the sampler's steps); the forward-process objectives (core_recipe_forward_process: nft, dpo) share
 * fp_update below (no log-prob; the rollout's final latents noised at its timesteps; nft's old policy,
 * trainer/run/old_policy.c; dpo's reference, the initial weights), each adding one accumulate function and its
 * statistics. Data parallelism is the same for every objective: this rank's contiguous share of the batch (dpo: of
 * the batch's pairs, every rank holding the whole batch) with the whole batch's transition count as the denominator,
 * the gradients summed over the ranks by the hook GRPO uses, the statistics summed over the dp group in rank order,
 * then the one optimizer step every rank takes (trainer_opt_step_experts).
 * Another forward-process objective plugs in with: its core_loss value (core/recipe.h, the key's choices in
 * core/recipe.c) counted by core_recipe_forward_process (the refusals, every step a candidate, parity by the velocity
 * alone, the budget's CFG-free rows then apply); its statistics as a field of trainer_obj_stats with a pack/unpack to
 * doubles; an accumulate function for fp_update (this rank's share: the batch's trajectories, conditioning and
 * advantages from share_of, the denominator of the whole batch); and one case in each switch below (they have no
 * default, so the compiler names a switch that lacks the new value: -Wswitch). The copies of
 * weights it reads: the old policy (trainer_old_model; allocated for nft by trainer/run/old_policy.c) or the frozen
 * reference (trainer_refs: the initial weights, or with LoRA the policy with its adapter off). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/stop.h"
#include "trainer/dp/dp.h"
#include "trainer/dp/dp_bucket.h"
#include "trainer/dp/dp_dev.h"
#include "trainer/dp/zero.h"
#include "trainer/optim/lora.h"
#include "trainer/run/run_internal.h"
#include "trainer/step/dpo_step.h"
#include "trainer/step/nft_step.h"

/* The update's config and this rank's share of the batch (*lo: its first sample); the gradient and optimizer hooks of
 * data parallelism when there are several dp ranks. */
static int share_of(trainer_state *S, const trainer_batch *tb, int stoppable, trainer_config *tc, trainer_batch *sub,
                    int *lo) {
    *sub = *tb;
    *tc = S->tc;
    *lo = 0;
    tc->should_stop = stoppable && !(S->dp && S->dp->size > 1) ? core_stop_interrupt : NULL;
    if (!(S->dp && S->dp->size > 1)) return 0;
    int hi;
    dp_share(tb->n, S->me.dp_rank, S->topo.dp, lo, &hi);
    sub->n = hi - *lo, sub->traj += *lo, sub->cond += *lo, sub->adv += *lo, sub->mask += *lo;
    tc->grad_reduce = dp_grad_reduce;
    tc->grad_reduce_ctx = &S->red;
    if (S->dx) { /* on the device: its gradients, and trainer_dev_opt_step with the shard hooks (dp_dev.h) */
        tc->grad_reduce = dp_dev_grad_reduce, tc->grad_reduce_ctx = &S->red_dev;
        if (S->red_dev.bk) /* begun during the backward (trainer/dp/dp_bucket.h; GRPO's micro-batch loop arms them) */
            tc->grad_arm = dp_buckets_arm, tc->grad_ready = dp_buckets_ready, tc->grad_overlap_ctx = S->red_dev.bk;
    } else if (S->red.zero_stage > 0)
        tc->opt_step = dp_zero_step, tc->opt_step_ctx = &S->red; /* trainer/dp/zero.h */
    return 0;
}

/* GRPO, GRPO-Guard: trainer_update_experts on this rank's share (its denominator: the whole batch's count). */
static int grpo_update(trainer_state *S, const trainer_batch *tb, grpo_loss_stats *st, optim_step_info *info,
                       int stoppable) {
    wan_model *pol[2] = {&S->pol[0], &S->pol[1]};
    const wan_model *ref[2];
    optim_adamw *opt[2] = {&S->opt[0], &S->opt[1]};
    trainer_batch sub;
    trainer_config tc;
    int lo;
    share_of(S, tb, stoppable, &tc, &sub, &lo);
    if (S->dp && S->dp->size > 1 && trainer_count_transitions(&S->tc, tb, S->n_experts, S->trained, &sub.denom))
        return -1;
    return trainer_update_experts(pol, trainer_refs(S, ref), S->n_experts, S->trained, S->ex, &tc, &sub, opt, &S->oc,
                                  st, info);
}

/* One optimizer update of a forward-process objective: the trained experts' grads zeroed, acc(ctx) accumulates this
 * rank's gradients and its n_stats statistics (doubles, additive) into stats, the last stop poll, the gradients
 * summed over the ranks (tc->grad_reduce, without GRPO's statistics) and the statistics over the dp group in rank
 * order (dp_sum_doubles: every rank gets the same numbers), then the optimizer step as GRPO's. */
static int fp_update(trainer_state *S, const trainer_config *tc, int (*acc)(void *ctx, double *stats), void *ctx,
                     double *stats, int n_stats, optim_step_info *info) {
    wan_model *pol[2] = {&S->pol[0], &S->pol[1]};
    optim_adamw *opt[2] = {&S->opt[0], &S->opt[1]};
    int first;
    if (trainer_update_check(pol, S->n_experts, S->trained, S->ex, tc, opt, &S->oc, &first)) return -1;
    for (int e = 0; e < S->n_experts; e++)
        if (S->trained[e] && wan_exec_zero_grads(S->ex, pol[e])) return -1;
    if (acc(ctx, stats)) return -1;
    const int sig = tc->should_stop ? tc->should_stop() : 0;
    if (sig) return core_error("training stopped by signal %d (before the optimizer step)", sig);
    if (tc->grad_reduce && tc->grad_reduce(tc->grad_reduce_ctx, pol, S->n_experts, S->trained, NULL)) return -1;
    if (S->dp && S->dp->size > 1 && dp_sum_doubles(S->red.stats, stats, n_stats)) return -1;
    return trainer_opt_step_experts(pol, S->n_experts, S->trained, tc, opt, &S->oc, first, info);
}

/* ---- DiffusionNFT (trainer/step/nft_step.h) ---- */

enum { NFT_NSTATS = 8 };

static void nft_pack(const nft_loss_stats *s, double *x) {
    x[0] = (double)s->n_transitions, x[1] = s->loss, x[2] = s->policy, x[3] = s->kl;
    x[4] = s->positive_sum, x[5] = s->negative_sum, x[6] = s->r_sum, x[7] = s->old_deviate_sum;
}

static void nft_unpack(const double *x, nft_loss_stats *s) {
    *s = (nft_loss_stats){.n_transitions = (int64_t)x[0], .loss = x[1], .policy = x[2], .kl = x[3],
                          .positive_sum = x[4], .negative_sum = x[5], .r_sum = x[6], .old_deviate_sum = x[7]};
}

typedef struct {
    trainer_state *S;
    const trainer_config *tc;
    const nft_step_config *c;
    const nft_batch *b;
} nft_ctx;

static int nft_acc(void *ctx, double *stats) {
    const nft_ctx *k = ctx;
    trainer_state *S = k->S;
    wan_model *pol[2] = {&S->pol[0], &S->pol[1]};
    const wan_model *ref[2], *old[2] = {trainer_old_model(S, 0), trainer_old_model(S, 1)};
    nft_loss_stats st = {0};
    if (nft_accumulate_experts(pol, old, trainer_refs(S, ref), S->n_experts, S->trained, S->ex, k->c, k->b, 1, &st))
        return -1;
    nft_pack(&st, stats);
    return 0;
}

/* The optimality probabilities of the whole batch (nft_optimality of the advantages the loop computed). */
static float *nft_probabilities(const trainer_state *S, const trainer_batch *tb) {
    float *r = malloc(sizeof(float) * (size_t)tb->n);
    if (!r) return core_error("out of memory"), NULL;
    if (nft_optimality(tb->adv, tb->n, S->r->adv_clip_max, r)) return free(r), NULL;
    return r;
}

static int nft_update(trainer_state *S, const trainer_batch *tb, int u, nft_loss_stats *st, optim_step_info *info,
                      int stoppable) {
    trainer_batch sub;
    trainer_config tc;
    int lo;
    share_of(S, tb, stoppable, &tc, &sub, &lo);
    const nft_step_config c = {.sel = S->tc.sel, .seed = S->tc.seed, .update = (uint32_t)u,
                               .nft_beta = S->r->nft_beta, .adv_clip_max = S->r->adv_clip_max, .kl_beta = S->r->beta,
                               .micro_batch_size = S->tc.micro_batch_size, .acts_mode = S->tc.acts_mode};
    float *r = nft_probabilities(S, tb);
    if (!r) return -1;
    nft_batch whole = {.n = tb->n, .traj = tb->traj, .cond = tb->cond, .text_len = tb->text_len, .r = r};
    nft_batch b = {.n = sub.n, .traj = sub.traj, .cond = sub.cond, .text_len = sub.text_len, .r = r + lo};
    double x[NFT_NSTATS];
    nft_ctx k = {S, &tc, &c, &b};
    int rc = nft_count_transitions_experts(&c, &whole, S->n_experts, S->trained, &b.denom);
    if (!rc) rc = fp_update(S, &tc, nft_acc, &k, x, NFT_NSTATS, info);
    free(r);
    if (rc) return -1;
    nft_loss_stats add;
    nft_unpack(x, &add);
    nft_loss_stats_add(st, &add);
    return 0;
}

/* ---- online Flow-DPO (trainer/step/dpo_step.h) ---- */

enum { DPO_NSTATS = 8 };

static void dpo_pack(const dpo_loss_stats *s, double *x) {
    x[0] = (double)s->n_terms, x[1] = s->loss, x[2] = s->margin_sum, x[3] = (double)s->n_positive;
    x[4] = s->err_w_sum, x[5] = s->err_l_sum, x[6] = s->ref_w_sum, x[7] = s->ref_l_sum;
}

static void dpo_unpack(const double *x, dpo_loss_stats *s) {
    *s = (dpo_loss_stats){.n_terms = (int64_t)x[0], .loss = x[1], .margin_sum = x[2], .n_positive = (int64_t)x[3],
                          .err_w_sum = x[4], .err_l_sum = x[5], .ref_w_sum = x[6], .ref_l_sum = x[7]};
}

typedef struct {
    trainer_state *S;
    const dpo_step_config *c;
    const dpo_batch *b;
} dpo_ctx;

static int dpo_acc(void *ctx, double *stats) {
    const dpo_ctx *k = ctx;
    trainer_state *S = k->S;
    const wan_model *ref[2];
    dpo_loss_stats st = {0};
    if (dpo_accumulate(&S->pol[0], trainer_refs(S, ref)[0], S->ex, k->c, k->b, 1, &st)) return -1;
    dpo_pack(&st, stats);
    return 0;
}

/* The pairs of the whole batch from its rewards (every rank holds the batch, so every rank finds the same pairs), this
 * rank's contiguous share of them, the whole batch's term count as the denominator. */
static int dpo_update(trainer_state *S, const trainer_batch *tb, int u, dpo_loss_stats *st, optim_step_info *info,
                      int stoppable) {
    const core_recipe *r = S->r;
    const int B = r->prompts_per_step, G = r->samples_per_prompt;
    if (tb->n != B * G) return core_error("dpo: a batch of %d samples, %d x %d expected", tb->n, B, G);
    trainer_batch sub;
    trainer_config tc;
    int lo, hi;
    share_of(S, tb, stoppable, &tc, &sub, &lo); /* the hooks; the share is of the pairs, below */
    const dpo_pair_rule rule = r->choice.dpo_pairs == CORE_DPO_PAIRS_ALL ? DPO_PAIRS_ALL : DPO_PAIRS_BEST_WORST;
    const int cap = dpo_max_pairs(B, G, rule);
    if (cap < 1) /* refused by the recipe's checks before a run gets here */
        return core_error("rollout.samples_per_prompt: %d groups of %d have no preference pair", B, G);
    float *rew = malloc(sizeof(float) * (size_t)tb->n);
    dpo_pair *pairs = malloc(sizeof(dpo_pair) * (size_t)cap);
    int np = 0, rc = -1;
    if (!rew || !pairs) {
        core_error("dpo: out of memory for %d pairs", cap);
        goto done;
    }
    for (int s = 0; s < tb->n; s++) rew[s] = tb->traj[s].reward_total;
    if (dpo_select_pairs(rew, B, G, rule, r->dpo_margin, pairs, &np)) goto done;
    lo = 0, hi = np;
    if (S->dp && S->dp->size > 1) dp_share(np, S->me.dp_rank, S->topo.dp, &lo, &hi);
    const dpo_step_config c = {.sel = S->tc.sel, .seed = S->tc.seed, .update = (uint32_t)u, .dpo_beta = r->dpo_beta,
                               .micro_batch_size = S->tc.micro_batch_size, .acts_mode = S->tc.acts_mode};
    dpo_batch whole = {.n = tb->n, .traj = tb->traj, .cond = tb->cond, .text_len = tb->text_len, .n_pairs = np,
                       .pairs = pairs};
    dpo_batch b = whole;
    b.n_pairs = hi - lo, b.pairs = pairs + lo;
    double x[DPO_NSTATS];
    dpo_ctx k = {S, &c, &b};
    /* no group with a preference (no pair): a zero gradient and the optimizer step all the same, as GRPO's when every
     * group is masked, so the policy version counts the steps */
    if (dpo_count_terms(&c, &whole, &b.denom)) goto done;
    if (fp_update(S, &tc, dpo_acc, &k, x, DPO_NSTATS, info)) goto done;
    dpo_loss_stats add;
    dpo_unpack(x, &add);
    dpo_loss_stats_add(st, &add);
    rc = 0;
done:
    free(rew), free(pairs);
    return rc;
}

/* ---- the dispatch ---- */

int trainer_obj_update(trainer_state *S, const trainer_batch *tb, int u, trainer_obj_stats *st, optim_step_info *info,
                       int stoppable) {
    switch (S->r->choice.loss) {
    case CORE_LOSS_GRPO:
    case CORE_LOSS_GRPO_GUARD:
        return grpo_update(S, tb, &st->grpo, info, stoppable);
    case CORE_LOSS_NFT:
        return nft_update(S, tb, u, &st->nft, info, stoppable);
    case CORE_LOSS_DPO:
        return dpo_update(S, tb, u, &st->dpo, info, stoppable);
    }
    return core_error("algorithm.loss: %s has no training pass", S->r->loss);
}

int64_t trainer_obj_transitions(const trainer_state *S, const trainer_obj_stats *st) {
    switch (S->r->choice.loss) {
    case CORE_LOSS_GRPO:
    case CORE_LOSS_GRPO_GUARD:
        return st->grpo.n_transitions;
    case CORE_LOSS_NFT:
        return st->nft.n_transitions;
    case CORE_LOSS_DPO:
        return st->dpo.n_terms;
    }
    return 0;
}

int trainer_obj_put_metrics(const trainer_state *S, core_metrics *m, const char *prefix, const trainer_obj_stats *st) {
    char k[96];
#define PUT(name, val) (snprintf(k, sizeof k, "%s%s", prefix, name), core_metrics_f64(m, k, val))
    switch (S->r->choice.loss) {
    case CORE_LOSS_GRPO:
    case CORE_LOSS_GRPO_GUARD: {
        const grpo_loss_stats *s = &st->grpo;
        const double nt = s->n_transitions > 0 ? (double)s->n_transitions : 1;
        return PUT("loss", s->loss) || PUT("policy_loss", s->policy) || PUT("kl", s->kl) ||
               PUT("clip_fraction", s->n_clipped / nt) || PUT("ratio_dev_mean", s->abs_ratio_dev_sum / nt) ||
               PUT("log_prob_mean_abs_diff", s->abs_logp_diff_sum / nt);
    }
    case CORE_LOSS_NFT: {
        const nft_loss_stats *s = &st->nft;
        const double nt = s->n_transitions > 0 ? (double)s->n_transitions : 1;
        return PUT("loss", s->loss) || PUT("policy_loss", s->policy) || PUT("kl", s->kl) ||
               PUT("nft/positive_loss", s->positive_sum / nt) || PUT("nft/negative_loss", s->negative_sum / nt) ||
               PUT("nft/optimality_mean", s->r_sum / nt) || PUT("nft/old_deviate", s->old_deviate_sum / nt);
    }
    case CORE_LOSS_DPO: {
        const dpo_loss_stats *s = &st->dpo;
        const double nt = s->n_terms > 0 ? (double)s->n_terms : 1;
        return PUT("loss", s->loss) || PUT("dpo/reward_margin", s->margin_sum / nt) ||
               PUT("dpo/positive_fraction", (double)s->n_positive / nt) || PUT("dpo/err_w", s->err_w_sum / nt) ||
               PUT("dpo/err_l", s->err_l_sum / nt) || PUT("dpo/ref_err_w", s->ref_w_sum / nt) ||
               PUT("dpo/ref_err_l", s->ref_l_sum / nt);
    }
    }
#undef PUT
    return 0;
}

void trainer_obj_summary(const trainer_state *S, const trainer_obj_stats *st, char *buf, size_t cap) {
    buf[0] = 0;
    switch (S->r->choice.loss) {
    case CORE_LOSS_GRPO:
    case CORE_LOSS_GRPO_GUARD: {
        const grpo_loss_stats *s = &st->grpo;
        snprintf(buf, cap, "loss %+.3e kl %.3g | clip %.3f |dlogp| %.3g", s->loss, s->kl,
                 s->n_transitions ? (double)s->n_clipped / s->n_transitions : 0.0,
                 s->n_transitions ? s->abs_logp_diff_sum / s->n_transitions : 0.0);
        return;
    }
    case CORE_LOSS_NFT: {
        const nft_loss_stats *s = &st->nft;
        const double nt = s->n_transitions > 0 ? (double)s->n_transitions : 1;
        snprintf(buf, cap, "loss %+.3e kl %.3g | L+ %.3g L- %.3g r %.3f |v-v_old|^2 %.3g", s->loss, s->kl,
                 s->positive_sum / nt, s->negative_sum / nt, s->r_sum / nt, s->old_deviate_sum / nt);
        return;
    }
    case CORE_LOSS_DPO: {
        const dpo_loss_stats *s = &st->dpo;
        const double nt = s->n_terms > 0 ? (double)s->n_terms : 1;
        snprintf(buf, cap, "loss %.4f | margin %+.3g positive %.2f | err w %.4g l %.4g", s->loss, s->margin_sum / nt,
                 (double)s->n_positive / nt, s->err_w_sum / nt, s->err_l_sum / nt);
        return;
    }
    }
}
