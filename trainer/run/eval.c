/* trainer/run/eval.c — in-run eval: the fixed eval set (every prompt of data.eval_prompt_file x
 * data.eval_samples_per_prompt seeds, noise stream 3, uid = prompt index x samples per prompt + sample, noise level
 * data.eval_eta) through the rollout source at the eval weights (the EMA with algorithm.ema_decay, else the policy),
 * summarised into the step's metrics row (eval/<scorer>/mean and se, eval/reward/..., eval/n, eval/ema) and one
 * terminal line. The numbers do not depend on the source (in process or workers) or the number of workers.
 *
 * The gold eval (guard.gold_scorers, trainer/run/guard.h): the same rollout also returns its videos (in colocated mode
 * they travel from the workers: n x frames x height x width x 3 bytes per eval), which the trainer scores with the
 * gold scorers (the eval prompt's metadata passed as the reward server would get it) into gold/... fields and a
 * second line; the guard's verdict then moves best/ (saving checkpoint-<step> first when it does not exist) and may
 * stop the run (trainer/run/loop.c acts on guard.st.stopped). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/philox.h"
#include "core/reduce.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/run/run_internal.h"

/* The gold scores of the eval videos as their chunks arrive: vals [n][n_gold + 1] (scorers, then the gold score). */
typedef struct {
    const trainer_state *S;
    double *vals;
    int n;
} gold_ctx;

static int gold_chunk(void *ctx, const core_rollout_sample *samples, const core_rollout_result *res, int n,
                      const uint8_t *videos, const int64_t vshape[4]) {
    gold_ctx *C = ctx;
    const trainer_guard *G = &C->S->guard;
    (void)res;
    if (!videos) return core_error("guard.gold_scorers: the rollout source returned no eval videos");
    const int64_t vb = vshape[0] * vshape[1] * vshape[2] * vshape[3];
    for (int j = 0; j < n; j++) {
        const uint64_t s = samples[j].uid; /* eval uid = sample index */
        const int64_t p = samples[j].prompt_index;
        if (s >= (uint64_t)C->n || p < 0 || p >= C->S->eval.n)
            return core_error("guard.gold_scorers: unexpected eval sample (uid %llu, prompt %lld)", (unsigned long long)s,
                              (long long)p);
        double *v = C->vals + (int64_t)s * (G->n_gold + 1);
        if (trainer_guard_score(G, videos + vb * j, vshape, C->S->eval.text[p], C->S->eval.meta[p], v, v + G->n_gold))
            return -1;
    }
    return 0;
}

/* best/ -> checkpoint-<step> (saved first when missing: the eval at `step` evaluated exactly its weights), and the
 * rolling limit applied again now that the previous best's checkpoint counts as an ordinary one. */
static int move_best(trainer_state *S, int64_t step, char *note, size_t cap) {
    const core_recipe *r = S->r;
    const char *home = r->ckpt_dir ? r->ckpt_dir : r->run_dir;
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoint-%" PRId64, home, step);
    if (!core_is_dir(ck)) {
        char *ct = trainer_config_text(r);
        const int bad = !ct || trainer_save_checkpoint(S, step, ct);
        free(ct);
        if (bad) return core_error_push("guard: saving the best gold eval's checkpoint: ");
    }
    if (trainer_ckpt_set_best(home, step)) return -1;
    if (r->ckpt_total_limit > 0 && trainer_ckpt_prune(home, r->ckpt_total_limit, step) < 0) return -1;
    snprintf(note, cap, ", best -> checkpoint-%" PRId64, step);
    return 0;
}

/* The gold eval's summary, verdict, metrics and lines (vals as gold_chunk filled them). */
static int gold_report(trainer_state *S, int64_t step, const double *vals, int n) {
    trainer_guard *G = &S->guard;
    const int ng = G->n_gold;
    double *col = malloc(sizeof(double) * (size_t)n);
    if (!col) return core_error("out of memory");
    char key[160], line[1024], note[128] = "";
    int off = snprintf(line, sizeof line, "gold @ step %" PRId64 " (n=%d):", step, n), rc = -1;
    double m = 0, sd, se = 0;
    for (int j = 0; j <= ng; j++) {
        for (int s = 0; s < n; s++) col[s] = vals[(int64_t)s * (ng + 1) + j];
        core_mean_sd_se(col, n, &m, &sd, &se);
        const char *name = j < ng ? G->gold[j]->name : "score";
        snprintf(key, sizeof key, "gold/%s/mean", name);
        if (core_metrics_f64(S->metrics, key, m)) goto done;
        snprintf(key, sizeof key, "gold/%s/se", name);
        if (core_metrics_f64(S->metrics, key, se)) goto done;
        if (off < (int)sizeof line)
            off += snprintf(line + off, sizeof line - off, "%s %s %.4f +- %.4f", j == ng ? " |" : "", name, m, se);
    }
    guard_verdict v; /* m, se: the gold score's */
    trainer_guard_judge(G, m, se, &v);
    if (v.new_best && S->r->ckpt_every > 0 && move_best(S, step, note, sizeof note)) goto done;
    trainer_guard_commit(G, step, &v);
    const guard_state *st = &G->st;
    if (core_metrics_f64(S->metrics, "gold/lcb", v.lcb) ||
        core_metrics_i64(S->metrics, "gold/best_step", st->best_step) ||
        core_metrics_f64(S->metrics, "gold/best_lcb", st->best_lcb))
        goto done;
    if (G->patience > 0 && (core_metrics_i64(S->metrics, "guard/bad_evals", v.bad_evals) ||
                            core_metrics_i64(S->metrics, "guard/stopped", v.stop)))
        goto done;
    if (off < (int)sizeof line)
        off += snprintf(line + off, sizeof line - off, ", lcb %.4f | %s step %" PRId64 " (lcb %.4f)%s", v.lcb,
                        v.new_best ? "new best:" : "best:", st->best_step, st->best_lcb, note);
    if (G->patience > 0 && off < (int)sizeof line)
        snprintf(line + off, sizeof line - off, " | fell+rose %lld of %d", (long long)v.bad_evals, G->patience);
    printf("%s\n", line);
    if (v.stop)
        printf("guard: stopping after the eval at step %" PRId64 ": the gold score %.4f +- %.4f stayed more than %g "
               "standard errors below its best (%.4f +- %.4f at step %" PRId64 ") for %d eval%s in a row while the "
               "training reward rose (%.4f over the steps since the previous eval vs %.4f at step %" PRId64 ")\n",
               step, v.mean, v.se, G->patience_se, st->best_mean, st->best_se, st->best_step, G->patience, G->patience > 1 ? "s" : "", v.r_now,
               v.r_best, st->best_step);
    fflush(stdout);
    rc = 0;
done:
    free(col);
    return rc;
}

int trainer_eval(trainer_state *S, int64_t step) {
    const core_recipe *r = S->r;
    const int E = S->eval.n, K = r->eval_samples_per_prompt, n = E * K, ns = S->n_scorers;
    const double t0 = trainer_now_s();
    core_rollout_sample *smp = calloc((size_t)n, sizeof *smp);
    core_rollout_result *res = calloc((size_t)n, sizeof *res);
    const float **cond = malloc(sizeof(float *) * (size_t)n);
    double *vals = malloc(sizeof(double) * (size_t)n * (size_t)(ns + 1));
    const int ng = S->guard.n_gold;
    gold_ctx gc = {.S = S, .vals = ng ? malloc(sizeof(double) * (size_t)n * (size_t)(ng + 1)) : NULL, .n = n};
    int rc = -1, have = 0;
    if (!smp || !res || !cond || !vals || (ng && !gc.vals)) {
        core_error("out of memory");
        goto done;
    }
    for (int i = 0; i < E; i++)
        for (int k = 0; k < K; k++) {
            const int s = i * K + k;
            smp[s] = (core_rollout_sample){.uid = (uint64_t)s, .prompt_index = i, .prompt = S->eval.text[i],
                                           .metadata = core_prompts_meta(&S->eval, i)};
            cond[s] = S->emb_eval + (int64_t)i * S->ne;
        }
    int64_t ev;
    if (trainer_eval_weights_begin(S, &ev)) goto done;
    const core_rollout_request tmpl = {.policy_version = ev, .stream = CORE_STREAM_EVAL_NOISE, .eta = r->eval_eta,
                                       .return_videos = ng > 0};
    if (S->src->rollout(S->src->ctx, &tmpl, smp, cond, S->emb_neg, n, res, ng ? gold_chunk : NULL, &gc)) goto done;
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
        const char *name = j < ns ? S->scorer_names[j] : "reward";
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
    if (ng && gold_report(S, step, gc.vals, n)) goto done;
    rc = 0;
done:
    if (have)
        for (int s = 0; s < n; s++) core_rollout_result_free(&res[s]);
    free(smp), free(res), free(cond), free(vals), free(gc.vals);
    return rc;
}
