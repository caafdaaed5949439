/* trainer/run/guard.h — the reward-hacking guard of a GRPO run (the recipe's `guard:` section): three watches on
 * a run whose training reward may be gamed, kept apart from that reward in metrics.jsonl and plots.
 *
 * 1. Video statistics (guard.video_stats, default on). Every training rollout returns its decoded videos (the
 *    rollout request's return_videos; in colocated mode they then travel from the workers to the trainer: B x G x
 *    frames x height x width x 3 bytes per step: 480 KiB for the tiny recipe, 4.7 GiB for 128 videos of
 *    33 x 480 x 832) and media/video_stats.h computes each video's statistics (brightness, saturation, contrast,
 *    black_fraction, white_fraction, motion, hf_energy). Per step and statistic:
 *      stats/<name>/mean      the mean over the step's B x G videos (sample order)
 *      stats/<name>/drift_sd  (mean_k - mean_0) / max(sd_0, GUARD_SD_FLOOR): mean_0 and sd_0 are the mean and the
 *                             population standard deviation over the videos of the run's step 0 (the baseline, kept
 *                             in the checkpoint). Every statistic lies in [0, 1], so a step-0 spread below 0.001 (all
 *                             videos alike, e.g. motion of a static model) counts as 0.001: the drift stays finite.
 *    A warning line on stdout, "guard: stats/<name> drifted +5.2 sd from step 0 at step K (mean .. vs .. +- .. at
 *    step 0)", when |drift| > guard.drift_warn_sd: at the first step of each excursion past the threshold (after a
 *    step within it, or with the other sign) and then every GUARD_WARN_EVERY steps while it stays past it.
 *    The statistics never feed the training: a run's reward, loss, weights and checkpoints are the same bit for bit
 *    with the statistics on or off.
 *
 * 2. The gold eval (guard.gold_scorers non-empty). The in-run eval (trainer/run/eval.c: the fixed eval set at
 *    logging.eval_every) also asks for the videos and scores them in the trainer with the gold scorers
 *    (reward/scorers.h; the eval prompt's "color" metadata as the reward server gets it), so the judge is one the
 *    policy never trained on:
 *      gold/<scorer>/mean, gold/<scorer>/se   per gold scorer (se: the standard error of the mean, core_mean_sd_se)
 *      gold/score/mean, gold/score/se          the gold score of a video = sum of guard.gold_weights x scorer value
 *      gold/lcb                                mean - 1.96 se of the gold score: the lower end of its two-sided 95%
 *                                              normal confidence interval
 *      gold/best_step, gold/best_lcb           the eval with the highest lcb so far (a strictly higher lcb replaces it)
 *    and one terminal line "gold @ step K: ...". With checkpoint.every > 0, run_dir (checkpoint.dir)/best is a
 *    symlink to checkpoint-<best_step> (trainer/checkpoint/checkpoint.h: trainer_ckpt_set_best; the rolling total_limit never
 *    removes its target). The eval at step K evaluates exactly the weights of checkpoint-K (the state after K steps),
 *    so when a new best's checkpoint-K does not exist yet it is saved then (with the state of that step boundary).
 *
 * 3. Early stop (guard.patience n > 0; needs gold scorers). At every gold eval that is not a new best:
 *      fell  = best_mean - mean > guard.patience_se x sqrt(se^2 + best_se^2)   (the gold score fell by more than k
 *              standard errors of the difference below the best eval's)
 *      rose  = R_now > R_best: R_now = the mean of the steps' training reward (reward/mean) over the steps since the
 *              previous eval, R_best = the training reward of the step right after the best eval (its rollouts use
 *              exactly the best eval's weights)
 *    bad_evals counts the evals in a row with fell and rose (a new best, or an eval without both, resets it to 0).
 *    When it reaches n, the run stops after that eval: its metrics row gets guard/stopped 1 (every gold eval row of
 *    a run with patience has guard/bad_evals and guard/stopped), checkpoint-K is saved (checkpoint.every >= 0), and
 *    one line says why. An eval whose row has no training step (the final eval) is judged the same way.
 *
 * State (guard_state) is what a checkpoint must carry for a resumed run to repeat a straight one: the step-0
 * baseline, the excursions being warned about, the best eval, the counter and the training-reward sums. It is saved
 * as the "guard" object of trainer_state.json (trainer_guard_state_json / trainer_guard_state_load; doubles written
 * with 17 significant digits, so they read back bit for bit). */
#ifndef TRAINER_GUARD_H
#define TRAINER_GUARD_H

#include <stdint.h>
#include <stdio.h>

#include "core/metrics.h"
#include "core/prompts.h"
#include "core/recipe.h"
#include "core/wire_rollout.h"
#include "media/video_stats.h"
#include "reward/scorers.h"

#define GUARD_NSTATS MEDIA_VSTAT_COUNT
#define GUARD_MAX_GOLD 8
#define GUARD_SD_FLOOR 1e-3
#define GUARD_WARN_EVERY 10
#define GUARD_LCB_Z 1.96

/* What a checkpoint holds (see the top comment). */
typedef struct {
    /* video statistics */
    int have_base;                  /* the step-0 baseline was taken */
    double base_mean[GUARD_NSTATS], base_sd[GUARD_NSTATS];
    int64_t warn_from[GUARD_NSTATS]; /* first step of the excursion past drift_warn_sd being warned about (-1: none) */
    int warn_sign[GUARD_NSTATS];     /* its sign (+1 / -1) */
    /* gold eval */
    int64_t evals;                  /* gold evals so far */
    int64_t best_step;              /* -1: none yet */
    double best_lcb, best_mean, best_se;
    int best_reward_pending;        /* the step after the best eval has not run yet */
    double best_reward;             /* R_best */
    int64_t bad_evals;
    double reward_sum;              /* training reward/mean summed over the steps since the last gold eval */
    int64_t reward_n;
    int stopped;
} guard_state;

typedef struct {
    /* from the recipe */
    int stats_on, n_gold, patience;
    double warn_sd, patience_se;
    const reward_scorer *gold[GUARD_MAX_GOLD];
    double gold_w[GUARD_MAX_GOLD];
    /* state now, and at the last step boundary (what a checkpoint saved now holds) */
    guard_state st, st0;
    /* the step's per-video statistics [n][GUARD_NSTATS], filled by trainer_guard_on_chunk */
    double *vstats;
    int vcap, vn;
    uint64_t uid0;
    /* the last step's means and drifts (for tests and the warning lines) */
    double mean[GUARD_NSTATS], drift[GUARD_NSTATS];
} trainer_guard;

/* From the recipe: guard.* (gold scorers looked up by name: an unknown one is an error naming guard.gold_scorers.i;
 * with color_match among them, every eval prompt must name a colour, as for a training scorer: the error names
 * file:line). eval: the run's eval prompts (NULL: not checked). -1 with the error. */
int trainer_guard_init(trainer_guard *G, const core_recipe *r, const core_prompts *eval);
void trainer_guard_free(trainer_guard *G);
/* 1 when the guard keeps any state (video statistics or gold scorers): then checkpoints carry it. */
int trainer_guard_active(const trainer_guard *G);

/* ---- video statistics ---- */

/* Before a training rollout of n samples with uids uid0 .. uid0 + n - 1: sizes the per-video buffer. -1 on out of
 * memory. */
int trainer_guard_begin_step(trainer_guard *G, int n, uint64_t uid0);
/* The rollout's chunk callback (core/rollout_source.h core_rollout_chunk_fn; ctx = the guard): the statistics of each
 * video. */
int trainer_guard_on_chunk(void *ctx, const core_rollout_sample *samples, const core_rollout_result *res, int n,
                           const uint8_t *videos, const int64_t vshape[4]);
/* After step `step` completed (its optimizer update done): the means over the step's videos (vstats [n][GUARD_NSTATS],
 * e.g. G->vstats with n = G->vn), the baseline when none is held yet, the drifts; fields stats/... into m (NULL:
 * none); the warning lines into out (NULL: none). Also adds the step's training reward to the early stop's sums
 * (trainer_guard_reward). -1 on a metrics error. */
int trainer_guard_step(trainer_guard *G, int64_t step, const double *vstats, int n, double reward_mean, core_metrics *m,
                       FILE *out);
/* The early stop's bookkeeping of one completed step's training reward (reward/mean); trainer_guard_step calls it. */
void trainer_guard_reward(trainer_guard *G, double reward_mean);

/* ---- gold eval and early stop ---- */

/* The gold score of one eval video: each gold scorer's value into vals[G->n_gold] and *score = sum of weight x value
 * (double, scorer order). meta: the prompt's metadata (core_prompts meta[i], may be NULL). -1 naming the scorer. */
int trainer_guard_score(const trainer_guard *G, const uint8_t *video, const int64_t vshape[4], const char *prompt,
                        const json_t *meta, double *vals, double *score);

typedef struct {
    double mean, se, lcb;
    int new_best;               /* lcb > best lcb, or the first gold eval */
    int fell, rose;             /* see the top comment (0 for a new best) */
    double r_now, r_best;       /* the training rewards compared (NAN when there is none) */
    int64_t bad_evals;          /* the counter after this eval */
    int stop;                   /* patience > 0 and bad_evals >= patience */
} guard_verdict;

/* Judges a gold eval with gold score mean and se against the state (does not change it). */
void trainer_guard_judge(const trainer_guard *G, double mean, double se, guard_verdict *v);
/* Applies the verdict of the gold eval at `step` to the state (best, counter, reward sums). */
void trainer_guard_commit(trainer_guard *G, int64_t step, const guard_verdict *v);
/* The step boundary: st0 = st (called after each completed step, and after set-up or resume). */
void trainer_guard_boundary(trainer_guard *G);
/* A discarded step: st = st0. */
void trainer_guard_rewind(trainer_guard *G);

/* ---- checkpoint ---- */

/* The state s as JSON object text (malloc'd; NULL with an error on out of memory). */
char *trainer_guard_state_json(const guard_state *s);
/* Reads text (trainer_guard_state_json's form) into s; label names the file in errors. -1 naming the field. */
int trainer_guard_state_load(guard_state *s, const char *text, const char *label);

#endif
