/* cli/grpo_run.h — the GRPO loop of `vgrpo run` in both modes and its pieces: local mode (rollout, reward and
 * training in one process), trainer ranks of a colocated run (rank 0 drives the rollout workers; ranks > 0 follow),
 * the parity job, prompt lists, the epoch shuffle, decoding + scoring, checkpoint helpers. Only cli/ composes
 * rollout/ and trainer/ (DESIGN.md 2). */
#ifndef CLI_GRPO_RUN_H
#define CLI_GRPO_RUN_H

#include <stdint.h>

#include "core/recipe.h"
#include "core/trajectory.h"
#include "model/vae/latent_rgb.h"
#include "model/vae/wan_vae.h"
#include "reward/scorers.h"
#include "rollout/pipeline.h"
#include "sp/comm.h"
#include "trainer/controller.h"

/* ---- prompts (cli/local_data.c) ---- */

typedef struct {
    int n;
    char **text; /* [n] */
} local_prompts;

/* Reads a prompt file: one prompt per line, surrounding spaces trimmed, blank lines and lines starting with '#'
 * skipped. -1 naming the path (missing, no prompts). */
int local_prompts_read(local_prompts *p, const char *path);
void local_prompts_free(local_prompts *p);

/* The order of epoch `epoch` over n prompts: a Fisher-Yates shuffle, j = 0..n-2: r = j + floor(u_j * (n - j)),
 * swap(perm[j], perm[r]), with u_j = Philox uniform element j of (seed, slot 0, uid = epoch, stream 2). */
void local_epoch_order(uint64_t seed, uint32_t epoch, int n, int *perm);

/* Draws B distinct prompts per step: the current epoch's order, B at a time; when fewer than B remain, they are
 * skipped and the next epoch (reshuffled) starts (drop-last), so a step never repeats a prompt. */
typedef struct {
    int n, B;
    uint64_t seed;
    uint32_t epoch;
    int pos;
    int *perm;
} local_sampler;

/* -1 when B > n (names rollout.prompts_per_step) or out of memory. */
int local_sampler_init(local_sampler *s, int n, int B, uint64_t seed);
void local_sampler_next(local_sampler *s, int *out);
void local_sampler_free(local_sampler *s);

/* ---- scoring (cli/local_data.c) ---- */

typedef struct {
    int n;                              /* scorers */
    const reward_scorer *sc[CORE_TRAJ_MAX_REWARDS];
    const char *names[CORE_TRAJ_MAX_REWARDS];
    double weight[CORE_TRAJ_MAX_REWARDS];
} local_scoring;

/* Looks up the recipe's scorers (unknown name: error naming reward.scorers). */
int local_scoring_init(local_scoring *s, const core_recipe *r);

/* Decodes traj's final latent [C, T, h, w] through d (rollout/pipeline.h) into video (caller's buffer
 * [d->frames, d->height, d->width, 3] U8) and scores it: rewards[i] per scorer, the total sum of weight x reward (in
 * double, scorer order, rounded to float once), stored into the trajectory too (core_traj_set_rewards). -1 naming
 * the decoder, scorer or prompt. */
int local_score(const local_scoring *s, rollout_decoder *d, core_traj *t, const char *prompt, uint8_t *video);

/* ---- the run (cli/grpo_run.c) ---- */

/* Runs the recipe in local mode: steps_override > 0 replaces optim.total_steps as the number of GRPO steps (the lr
 * schedule keeps optim.total_steps). Writes the run directory and prints one line per step. -1 with an error.
 * Checkpoints (checkpoint.every > 0; trainer/checkpoint.h) go to checkpoint.dir (default logging.run_dir): after
 * every `every` steps, at the end of the run, and when SIGINT/SIGTERM arrives (the current step finishes, a
 * checkpoint is saved, and the run stops with an error saying so). resume (NULL: none) is a checkpoint-N folder or a
 * folder meaning its latest complete checkpoint: weights, Adam state, step counters and the prompt sampler's
 * position are restored (the reference model stays the initial weights of model.path), the recipe must match the
 * checkpoint's (local_resume_free_keys aside), and metrics.jsonl keeps its rows before the checkpoint's step and is
 * appended to, so a resumed run's rows equal a straight run's (time/ fields aside). */
int local_run(const core_recipe *r, int64_t steps_override, const char *resume);

/* The same loop for trainer rank 0 of a colocated run (`vgrpo trainer`): rollouts and rewards come from the
 * workers behind ctl (connected; ctl_wait_workers done), weights are pushed to them after every optimizer step
 * (ctl_sync_weights, metrics weight_sync/seconds and weight_sync/hash_match), and with dp (NULL or one rank: alone)
 * the batch is broadcast to the other trainer ranks (grpo_follow) and the gradients summed over them. A fresh run
 * first checks that every worker holds the trainer's initial weights (hello hash); a resumed run pushes its own.
 * ctl_timeout: seconds one rollout chunk or sync may take. Returns 0, 1 when stopped by SIGINT/SIGTERM between
 * steps (error set; the other ranks were told to stop, so no MPI abort is needed), -1 with an error. */
int grpo_run(const core_recipe *r, int64_t steps_override, const char *resume, ctl_server *ctl, sp_comm *dp,
             double ctl_timeout);

/* `vgrpo parity` on trainer rank 0 (workers behind ctl connected): one rollout batch (step 0's prompts, B x G
 * samples, noise stream 0) at policy version 0 with velocities recorded, then every trainable transition recomputed
 * by the trainer ranks through the training path (trainer_accumulate, micro-batches of algorithm.micro_batch_size)
 * and compared: per step index, transitions, mean and max |logp_trainer - logp_rollout| and max |v_trainer -
 * v_rollout| printed and written to logging.run_dir/parity.json.
 * tolerance < 0 ("auto"): 0 when the trainer's ring degree is 1 (sp = 1 or pure Ulysses: the same arithmetic as the
 * rollout), else the ring bound: |dv| <= 32 eps max|v| and |dlogp| <= 32 eps max(1, max|logp|) (eps = FLT_EPSILON,
 * maxima over the rollout's batch): the LSE merge of R partial attentions reassociates fp32 sums (sp/ measures at most
 * 8 eps x scale per attention at op level, about 3.4 eps at the tiny model's output). Otherwise both maxima must
 * be <= tolerance. Returns 0 (pass), 1 (all computed, a maximum past the tolerance: error set), -1 (failure). */
int grpo_parity(const core_recipe *r, ctl_server *ctl, sp_comm *dp, double tolerance, double ctl_timeout);

/* `vgrpo run` with mode: colocated (cli/colocated.c): starts the reward server, parallel.rollout_workers workers and
 * parallel.trainer_ranks trainer ranks (`vgrpo trainer`, through mpirun when more than one), waits for the trainer
 * and stops everything when any process fails (the error names it and its log). recipe_path and the --set
 * assignments are passed on to the children. A full-size Wan transformer is refused (needs the CUDA backend).
 * parity (NULL: the run): `vgrpo parity` instead, with this tolerance ("auto" or a number; see grpo_parity). */
int colocated_run(const char *recipe_path, const char *const *sets, int n_sets, const core_recipe *r, int64_t steps,
                  const char *resume, const char *parity);

/* Trainer ranks > 0: the same model, optimizer and (with resume) checkpoint as rank 0; trains on its share of each
 * batch rank 0 broadcasts until rank 0 says stop. -1 with an error (the caller aborts the MPI job). */
int grpo_follow(const core_recipe *r, int64_t steps_override, const char *resume, sp_comm *dp);

/* ---- checkpoints (cli/local_ckpt.c) ---- */

/* Recipe keys that may change when a run is resumed (NULL-terminated): optim.total_steps, checkpoint.*, logging.*,
 * the eval-only data keys (eval_prompt_file, eval_samples_per_prompt, eval_eta), where scoring runs (reward.endpoint,
 * threads, timeout_s, max_attempts), and keys that do not change any number a run computes (rollout.batch_size,
 * parallel.rollout_workers, algorithm.activations). Every other key is part of the config hash. */
extern const char *const local_resume_free_keys[];
/* The recipe's canonical config text for the checkpoint's config hash (trainer_ckpt_config_text with the keys
 * above set to null). malloc'd, or NULL with an error. */
char *local_config_text(const core_recipe *r);
/* Keeps the rows of metrics.jsonl at path whose "step" is below step (stopping at the first that is not, or at a
 * row cut short), replacing the file atomically. A missing file is fine. -1 naming the path. */
int local_metrics_truncate(const char *path, int64_t step);
/* SIGINT/SIGTERM: install sets a flag instead of stopping (once: a second signal stops at once); pending returns
 * the signal number (0: none); restore puts the previous handlers back. */
void local_signals_install(void);
int local_signal_pending(void);
void local_signals_restore(void);

/* model.init_preset (cli/model_init.c): when model.path has no model_index.json and the recipe names a preset, writes
 * the preset's pipeline there (vgrpo init-model --seed 0). 0, or -1 with an error. */
int ensure_model(const core_recipe *r);

/* The checks of a recipe that need trainer/reward modules but no weights (every mode; `vgrpo run --dry-run` runs
 * them): timestep selection vs num_steps, scorer names, optimizer values, prompt files; in local mode also
 * rollout_workers 1 and VAE factor 8. -1 naming the key. */
int local_check_recipe(const core_recipe *r);

#endif
