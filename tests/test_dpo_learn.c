/* tests/test_dpo_learn.c — online Flow-DPO learns (slow: VGRPO_SLOW=1): the tiny Wan DiT, ODE rollouts of the current
 * policy (eta 0, guidance 1), reward = the mean of the final latent (a brightness-like scalar the tiny model can move),
 * the best and the worst sample of each group as the pair (dpo_select_pairs), dpo_accumulate against a frozen copy
 * of the initial weights (random_k 3 of 5 steps), AdamW. The eval (16 fixed noises never trained on) must rise by
 * more than 3 standard errors of the difference of the two means, and fall so with the reward negated. The whole loop
 * of trainer/step/dpo.h's "how the trainer uses it", without the run folder. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_dit.h"
#include "model/text/word_embed.h"
#include "rollout/engine.h"
#include "tests/test.h"
#include "trainer/optim/optim.h"
#include "trainer/step/dpo_step.h"

#define LL 4
#define LB 4
#define LG 4
#define LN (LB * LG)
#define LSTEPS 5
#define LEVAL 16
#define LITERS 24

#include "tests/learn_eval.h"

/* Trains LITERS steps with reward sign * latent mean; returns the eval's rise in standard errors (of the latent
 * mean, so a negative sign should make it fall). */
static double train_and_eval(float sign) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model pol, ref;
    REQUIRE_OK(wan_model_init(&pol, &c));
    REQUIRE_OK(wan_model_init(&ref, &c));
    wan_params_init_random(&pol, 21);
    const int64_t n = pol.layout.numel;
    memcpy(ref.params, pol.params, sizeof(float) * n); /* the reference: the initial weights, frozen */
    REQUIRE_OK(wan_model_alloc_grads(&pol));
    float *emb = malloc(sizeof(float) * 2 * LL * c.text_dim);
    REQUIRE_OK(wan_word_embed("a red ball", LL, c.text_dim, emb));
    REQUIRE_OK(wan_word_embed("green grass", LL, c.text_dim, emb + LL * c.text_dim));
    const float *cond2[2] = {emb, emb + LL * c.text_dim}, *cond[LN];
    rollout_config rc;
    const int64_t shape[4] = {16, 2, 8, 8};
    REQUIRE_OK(rollout_config_init(&rc, LSTEPS, 3.0, 0.0f, 1.0f, shape, LL, 77, LN));
    optim_adamw opt;
    REQUIRE_OK(optim_adamw_init(&opt, n));
    const optim_config oc = {.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0,
                             .max_grad_norm = 1.0, .schedule = OPTIM_SCHED_CONSTANT};
    dpo_step_config sc = {.seed = 77, .dpo_beta = 100.0f, .micro_batch_size = 8, .acts_mode = WAN_ACTS_STORE};
    REQUIRE_OK(grpo_selection_parse("random_k 3", &sc.sel));
    double m0, se0, m1, se1;
    eval_reward(&rc, &pol, cond2, &m0, &se0);
    double first_loss = 0, last_acc = 0;
    for (int it = 0; it < LITERS; it++) {
        core_traj t[LN];
        uint64_t uids[LN];
        int64_t pidx[LN];
        float rew[LN];
        dpo_pair pairs[LB];
        int np = 0;
        /* group b: prompt b % 2, LG samples */
        for (int s = 0; s < LN; s++) cond[s] = cond2[(s / LG) % 2], uids[s] = (uint64_t)it * LN + s, pidx[s] = s / LG;
        REQUIRE_OK(rollout_generate(&rc, &(rollout_experts){1, {&pol, NULL}}, NULL, LN, cond, uids, pidx, t));
        for (int s = 0; s < LN; s++) rew[s] = sign * latent_mean(&t[s]);
        REQUIRE_OK(dpo_select_pairs(rew, LB, LG, DPO_PAIRS_BEST_WORST, 0.0f, pairs, &np));
        dpo_batch b = {.n = LN, .traj = t, .cond = cond, .text_len = LL, .n_pairs = np, .pairs = pairs};
        dpo_loss_stats st = {0};
        wan_model_zero_grads(&pol);
        REQUIRE_OK(dpo_accumulate(&pol, &ref, NULL, &sc, &b, 1, &st));
        REQUIRE_OK(optim_adamw_step(&opt, &oc, pol.params, pol.grads, NULL, NULL));
        if (it == 0) first_loss = st.loss;
        if (st.n_terms) last_acc = (double)st.n_positive / (double)st.n_terms;
        for (int s = 0; s < LN; s++) core_traj_free(&t[s]);
    }
    eval_reward(&rc, &pol, cond2, &m1, &se1);
    const double se = sqrt(se0 * se0 + se1 * se1), z = (m1 - m0) / se;
    printf("  dpo learning, reward %+g x latent mean: eval latent mean %.5f +- %.5f -> %.5f +- %.5f (%d steps): "
           "change %.2f standard errors; first loss %.4g (log 2 = 0.6931), last positive-pair fraction %.2f\n",
           (double)sign, m0, se0, m1, se1, LITERS, z, first_loss, last_acc);
    CHECK_NEAR(first_loss, log(2.0), 1e-12); /* the first step: policy == reference, z = 0 for every term */
    optim_adamw_free(&opt);
    wan_model_free(&pol), wan_model_free(&ref);
    free(emb);
    return z;
}

/* The eval reward rises by more than 3 standard errors; with the reward negated the same quantity falls by more than
 * 3 (so the rise is the objective's doing, not a drift of the training). */
TEST(dpo_learns_tiny) {
    TEST_SLOW();
    const double up = train_and_eval(1.0f), down = train_and_eval(-1.0f);
    CHECK_MSG(up > 3.0, "eval rose by %.2f standard errors only", up);
    CHECK_MSG(down < -3.0, "with the reward negated the eval moved by %.2f standard errors (should fall)", down);
}
