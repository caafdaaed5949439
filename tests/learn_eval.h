/* tests/learn_eval.h — the reward and fixed eval the forward-process learning tests share (tests/test_nft_learn.c,
 * tests/test_dpo_learn.c): reward = the mean of a trajectory's final latent, a brightness-like scalar the tiny model
 * can move; the eval = its mean and standard error over LEVAL ODE samples (uids 1e6 + k, prompts alternating), noises
 * the training never draws. Include after defining LEVAL. */
#ifndef VGRPO_TESTS_LEARN_EVAL_H
#define VGRPO_TESTS_LEARN_EVAL_H

#include <math.h>

#include "rollout/engine.h"
#include "tests/test.h"

static float latent_mean(const core_traj *t) {
    const int64_t nl = core_traj_latent_numel(t);
    const float *x = core_traj_latent(t, t->n_steps);
    double s = 0;
    for (int64_t i = 0; i < nl; i++) s += x[i];
    return (float)(s / (double)nl);
}

static void eval_reward(const rollout_config *rc, wan_model *m, const float *const *cond2, double *mean, double *se) {
    core_traj t[LEVAL];
    const float *cond[LEVAL];
    uint64_t uids[LEVAL];
    int64_t pidx[LEVAL];
    for (int k = 0; k < LEVAL; k++) cond[k] = cond2[k % 2], uids[k] = 1000000 + k, pidx[k] = k % 2;
    REQUIRE_OK(rollout_generate(rc, &(rollout_experts){1, {m, NULL}}, NULL, LEVAL, cond, uids, pidx, t));
    double s = 0, ss = 0;
    for (int k = 0; k < LEVAL; k++) {
        const double r = latent_mean(&t[k]);
        s += r, ss += r * r;
        core_traj_free(&t[k]);
    }
    *mean = s / LEVAL;
    const double var = (ss - LEVAL * *mean * *mean) / (LEVAL - 1);
    *se = sqrt(var > 0 ? var : 0) / sqrt((double)LEVAL);
}

#endif
