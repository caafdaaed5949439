/* trainer/eval.c — in-run eval: the fixed eval set (every prompt of data.eval_prompt_file x
 * data.eval_samples_per_prompt seeds, noise stream 3, uid = prompt index x samples per prompt + sample, noise level
 * data.eval_eta) through the rollout source at the eval weights (the EMA with algorithm.ema_decay, else the policy),
 * summarised into the step's metrics row (eval/<scorer>/mean and se, eval/reward/..., eval/n, eval/ema) and one
 * terminal line. The numbers do not depend on the source (in process or workers) or the number of workers. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "core/reduce.h"
#include "trainer/run_internal.h"

/* The rewards a sample came back with must be the recipe's scorers, in its order (an external reward.endpoint
 * serves its own list): else the metrics would label one scorer's values with another's name. */
int trainer_check_scorers(const trainer_state *S, const core_traj *t) {
    const core_recipe *r = S->r;
    int same = t->n_rewards == r->scorers.n;
    for (int j = 0; same && j < r->scorers.n; j++) same = !strcmp(t->reward_names[j], r->scorers.v[j]);
    if (same) return 0;
    char got[512] = "", want[512] = "";
    for (int j = 0; j < t->n_rewards; j++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", j ? ", " : "", t->reward_names[j]);
    for (int j = 0; j < r->scorers.n; j++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", j ? ", " : "", r->scorers.v[j]);
    return core_error("reward.scorers: the reward server%s%s scores [%s], the recipe lists [%s] (they must match, in "
                      "order)", r->reward_endpoint ? " at " : "", r->reward_endpoint ? r->reward_endpoint : "", got, want);
}

int trainer_eval(trainer_state *S, int64_t step) {
    const core_recipe *r = S->r;
    const int E = S->eval.n, K = r->eval_samples_per_prompt, n = E * K, ns = r->scorers.n;
    const double t0 = trainer_now_s();
    core_rollout_sample *smp = calloc((size_t)n, sizeof *smp);
    core_rollout_result *res = calloc((size_t)n, sizeof *res);
    const float **cond = malloc(sizeof(float *) * (size_t)n);
    double *vals = malloc(sizeof(double) * (size_t)n * (size_t)(ns + 1));
    int rc = -1, have = 0;
    if (!smp || !res || !cond || !vals) {
        core_error("out of memory");
        goto done;
    }
    for (int i = 0; i < E; i++)
        for (int k = 0; k < K; k++) {
            const int s = i * K + k;
            smp[s] = (core_rollout_sample){.uid = (uint64_t)s, .prompt_index = i, .prompt = S->eval.text[i]};
            cond[s] = S->emb_eval + (int64_t)i * S->ne;
        }
    int64_t ev;
    if (trainer_eval_weights_begin(S, &ev)) goto done;
    const core_rollout_request tmpl = {.policy_version = ev, .stream = CORE_STREAM_EVAL_NOISE, .eta = r->eval_eta};
    if (S->src->rollout(S->src->ctx, &tmpl, smp, cond, S->emb_neg, n, res, NULL, NULL)) goto done;
    have = 1;
    if (trainer_eval_weights_end(S)) goto done;
    for (int s = 0; s < n; s++) {
        if (trainer_check_scorers(S, &res[s].traj)) goto done;
        for (int j = 0; j < ns; j++) vals[(int64_t)j * n + s] = res[s].traj.rewards[j];
        vals[(int64_t)ns * n + s] = res[s].traj.reward_total;
    }
    char key[160], line[1024];
    int off = snprintf(line, sizeof line, "eval @ step %" PRId64 " (policy version %" PRId64 ", n=%d):", step,
                       TRAINER_VERSION(S), n);
    for (int j = 0; j <= ns; j++) {
        double m, se, sd;
        core_mean_sd_se(vals + (int64_t)j * n, n, &m, &sd, &se);
        const char *name = j < ns ? r->scorers.v[j] : "reward";
        snprintf(key, sizeof key, "eval/%s/mean", name);
        if (core_metrics_f64(S->metrics, key, m)) goto done;
        snprintf(key, sizeof key, "eval/%s/se", name);
        if (core_metrics_f64(S->metrics, key, se)) goto done;
        if (off < (int)sizeof line) off += snprintf(line + off, sizeof line - off, " %s %.4f +- %.4f", name, m, se);
    }
    if (core_metrics_i64(S->metrics, "eval/n", n) || core_metrics_i64(S->metrics, "eval/ema", S->ema_on) ||
        core_metrics_f64(S->metrics, "time/eval_s", trainer_now_s() - t0))
        goto done;
    printf("%s\n", line);
    fflush(stdout);
    rc = 0;
done:
    if (have)
        for (int s = 0; s < n; s++) core_rollout_result_free(&res[s]);
    free(smp), free(res), free(cond), free(vals);
    return rc;
}
