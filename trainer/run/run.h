/* trainer/run/run.h — the jobs of the trainer process: the GRPO loop (`vgrpo run` in both modes: trainer/run/loop.c), the
 * follower ranks of data/sequence parallelism, and the parity job (trainer/run/parity.c), all written against a rollout
 * source (core/rollout_source.h) so they never depend on where rollouts come from.
 *
 * One GRPO step k (rollout round k; docs/design.md sections 4 and 7):
 *   prompts : B distinct prompts (trainer/run/sampler.h: epoch order from Philox stream 2, uid = epoch)
 *   rollout : src->rollout of G samples each, uid = k*B*G + prompt_slot*G + replica, noise stream 0, policy version =
 *             optimizer steps so far, with rewards (total = sum of weight x scorer reward)
 *   batch   : with dp, broadcast to the other trainer ranks (trainer_follow)
 *   train   : group advantages, optimizer_steps_per_rollout updates over the whole batch (micro-batches of
 *             micro_batch_size transitions, gradients accumulated and summed over dp; global denominator), AdamW
 *   ema     : algorithm.ema_decay: the moving average after every update (trainer/run/ema.c)
 *   sync    : src->push_weights(policy, version)
 *   log     : one metrics.jsonl row, one rewards.jsonl row, one terminal line
 * In-run eval (trainer/run/eval.c) runs before step 0, every logging.eval_every steps and after the last; sample videos
 * (trainer/run/step_videos.c) every logging.video_every steps; checkpoints (trainer/checkpoint/checkpoint.h, trainer/run/run_files.c)
 * every checkpoint.every steps, at the end and on SIGINT/SIGTERM (core/stop.h: a signal before the step's optimizer
 * update discards the step; one after it is acted on at the step's end).
 *
 * Frozen experts (algorithm.train_experts, two-expert pipelines): the trained experts are those the key names
 * ("all", "transformer", "transformer_2"); a frozen expert keeps its weights, gets no gradients or Adam steps and is
 * never re-sent to the workers; transitions whose timestep routes to it (timestep >= boundary_ratio * 1000: expert 0,
 * else expert 1) are not trained and do not count in the loss denominator. The policy version is the optimizer step
 * count of the first trained expert (every trained expert steps together).
 *
 * LoRA (model.lora.rank >= 1; trainer/optim/lora.h, model/dit/wan_lora.h): each trained expert carries an adapter (A from
 * Philox stream 6 with model.lora.init_seed and the expert's index, B = 0, so step 0 is the base model's bit for bit) on
 * its frozen base; the optimizer (AdamW, the recipe's schedule, one clip over every trained adapter's gradients), the
 * dp/SP gradient all-reduce and the EMA run over the adapters' flat buffers; the KL reference is the same model with
 * the adapter switched off (no copy of the weights); sync sends the adapters only; checkpoints hold the adapters (both
 * formats) and their Adam state, and a resume with another model.lora is refused by the config hash (naming the key).
 * The run's last line checks the base still hashes as at start-up (it is never written). */
#ifndef TRAINER_RUN_H
#define TRAINER_RUN_H

#include <stdint.h>
#include <stdio.h>

#include "core/prompts.h"
#include "core/recipe.h"
#include "core/run_lock.h"
#include "sp/comm.h"
#include "core/rollout_source.h"

typedef struct {
    int64_t steps;      /* > 0: the number of GRPO steps to run instead of optim.total_steps (the lr schedule keeps
                           optim.total_steps) */
    const char *resume; /* NULL, or a checkpoint-N folder / a folder meaning its latest checkpoint that verifies */
} trainer_run_opts;

/* The checks of a recipe that need no weights (`vgrpo run --dry-run` and the start of every job run them): timestep
 * selection vs rollout.num_steps, a trainable step (rollout.eta > 0, or no log-prob to train on), scorer names,
 * optimizer values, both prompt files (readable, valid UTF-8, prompts_per_step distinct prompts, a colour word for
 * color_match, at most text_len words for word_embed; errors name file:line). -1 naming the key or file:line. */
int trainer_check_recipe(const core_recipe *r);

/* Every prompt of p against the recipe: at most rollout.text_len words with the word_embed text encoder, a target
 * colour (a colour word, or a "color" metadata entry) when color_match is a scorer. -1 naming file:line. */
int trainer_check_prompts(const core_recipe *r, const core_prompts *p);

/* Claims the folders of a run for the command that owns it (`vgrpo run`; `vgrpo mpi-rank` rank 0 under srun):
 * applies logging.file_mode to this process and those it starts (core_file_mode_apply), locks logging.run_dir and
 * checkpoint.dir (core_run_locks_acquire: each must be this user's own, not writable by others), and for a fresh run
 * (resume NULL) refuses a checkpoint folder holding an earlier run's checkpoints unless overwrite:
 *   "logging.run_dir: runs/x holds the checkpoints of an earlier run (newest: runs/x/checkpoint-20, 2 in all); a
 *    new run would delete them. Continue that run with --resume runs/x, or pass --overwrite to replace them"
 * (with overwrite the run deletes them as it starts: trainer_open_run_files). A lock taken over from a dead run is
 * logged. 0 with L held, or -1 with an error and nothing held. */
int trainer_claim_folders(const core_recipe *r, const char *resume, int overwrite, core_run_locks *L);

/* `vgrpo run --resume DIR` before anything starts (`--dry-run`, and a colocated job before its processes): what the
 * resume checks before reading weights. DIR is a checkpoint, or a folder whose newest checkpoint-N is taken (the
 * resume itself falls back to an older one when that one does not verify; this reads only trainer_state.json, no
 * file's hash). The recipe r must be the checkpoint's (trainer_config_text against its recorded config hash; the
 * keys a resume may change are free), else the error lists the keys that differ as the resume does. strict 0: a
 * checkpoint that cannot be found or read is left to the resume (0, nothing printed), only a recipe that differs
 * is an error. On success with f non-NULL prints "--resume: would continue from CKPT: step N of run ..." to f.
 * 0, or -1 with the error ("--resume: ..."). */
int trainer_resume_check(const core_recipe *r, const char *resume, int strict, FILE *f);

/* The GRPO loop on trainer rank 0 (dp: all trainer ranks, NULL or size 1: alone). Writes logging.run_dir
 * (config.resolved.yaml, metrics.jsonl, rewards.jsonl, checkpoint-N/, videos/) and prints one line per step.
 * Resume: weights, Adam state, EMA, step counters and the sampler's position are restored (the KL reference stays
 * the initial weights of model.path), the recipe must match the checkpoint's (trainer_resume_free_keys aside), and
 * metrics.jsonl keeps its rows before the checkpoint's step, so a resumed run's rows equal a straight run's (time/
 * fields aside). Returns 0; 1 when stopped by SIGINT/SIGTERM, between steps or inside one (a step stopped before its
 * optimizer update is discarded and the checkpoint of the steps before it saved; error set; the other ranks were told
 * to stop, so no MPI abort is needed); -1 with an error. */
int trainer_run(const core_recipe *r, const trainer_run_opts *o, core_rollout_source *src, sp_comm *dp);

/* Trainer ranks > 0: the same model, optimizer and (with resume) checkpoint as rank 0; trains on its share of each
 * batch rank 0 broadcasts until rank 0 says stop. -1 with an error (the caller aborts the MPI job). */
int trainer_follow(const core_recipe *r, const trainer_run_opts *o, sp_comm *dp);

/* `vgrpo parity` on trainer rank 0: one rollout batch (step 0's prompts, B x G samples, noise stream 0) at policy
 * version 0 with velocities recorded, then every trainable transition recomputed by the trainer ranks through the
 * training path (trainer_accumulate, micro-batches of algorithm.micro_batch_size) and compared: per step index,
 * transitions, mean and max |logp_trainer - logp_rollout| and max |v_trainer - v_rollout| printed and written to
 * logging.run_dir/parity.json.
 * tolerance < 0 ("auto"): 0 when the trainer's ring degree is 1 (sp = 1 or pure Ulysses: the same arithmetic as the
 * rollout), else the ring bound: |dv| <= 32 eps max|v| and |dlogp| <= 32 eps max(1, max|logp|) (eps = FLT_EPSILON,
 * maxima over the rollout's batch): the LSE merge of R partial attentions reassociates fp32 sums (sp/ measures at most
 * 8 eps x scale per attention at op level, about 3.4 eps at the tiny model's output); on the device (model.device
 * cuda: bf16 activations, the ring's merged output rounded to bf16) 8 bf16 epsilons (2^-8) in place of 32 fp32 ones
 * (measured on the emulated device, ring 2: |dv| 2.8, |dlogp| 0.16 bf16 eps of the maxima). Otherwise both maxima must
 * be <= tolerance. Returns 0 (pass), 1 (all computed, a maximum past the tolerance: error set), -1 (failure). */
int trainer_parity(const core_recipe *r, core_rollout_source *src, sp_comm *dp, double tolerance);
/* trainer_parity on the weights of a checkpoint (o->resume, as trainer_run resumes: the recipe must be the
 * checkpoint's; the other trainer ranks resume it in trainer_follow): the rollout at its policy version, the prompts
 * of its next step. o NULL or without resume: trainer_parity. With LoRA the checkpoint's adapters reach the workers
 * through the source's start (an adapter sync), so the parity covers trained adapters, not just B = 0. */
int trainer_parity_opts(const core_recipe *r, const trainer_run_opts *o, core_rollout_source *src, sp_comm *dp,
                        double tolerance);

/* Recipe keys that may change when a run is resumed (NULL-terminated): optim.total_steps, checkpoint.*, logging.*,
 * the eval-only data keys (eval_prompt_file, eval_samples_per_prompt, eval_eta), where scoring runs (reward.endpoint,
 * threads, timeout_s, max_attempts), and keys that do not change any number a run computes (rollout.batch_size,
 * parallel.rollout_workers, algorithm.activations). Every other key is part of the config hash. */
extern const char *const trainer_resume_free_keys[];
/* The recipe's canonical config text for the checkpoint's config hash (trainer_ckpt_config_text with the keys
 * above set to null). malloc'd, or NULL with an error. */
char *trainer_config_text(const core_recipe *r);

#endif
