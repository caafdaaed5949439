/* trainer/run/run_internal.h — the state the trainer's jobs (trainer/run/run.h) carry from one GRPO step to the next, shared by
 * the files that make up the loop: run_setup.c (models, prompts, conditioning, the parallel layout), run_files.c (the
 * run folder, checkpoints, resume), loop.c (the step), eval.c (in-run eval), step_videos.c, ema.c and parity.c. Not a
 * public interface. */
#ifndef TRAINER_RUN_INTERNAL_H
#define TRAINER_RUN_INTERNAL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/metrics.h"
#include "core/prompts.h"
#include "core/recipe.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"
#include "sp/comm.h"
#include "sp/topology.h"
#include "sp/usp_attention.h"
#include "trainer/dp/dp_dev.h"
#include "trainer/run/guard.h"
#include "trainer/optim/optim.h"
#include "trainer/run/run.h"
#include "trainer/run/sampler.h"
#include "trainer/step/sde_window.h"
#include "core/rollout_source.h"
#include "trainer/optim/train_dev.h"
#include "trainer/step/dpo.h"
#include "trainer/step/nft.h"
#include "trainer/step/train_step.h"

typedef struct {
    const core_recipe *r;
    core_rollout_source *src;  /* NULL on follower ranks */
    /* models: expert 0 (transformer/), expert 1 (transformer_2/, two-expert pipelines) */
    wan_model pol[2], ref[2];  /* policy; KL reference = the initial weights (algorithm.beta > 0; never with LoRA) */
    wan_model ema[2];          /* algorithm.ema_decay > 0 (rank 0): moving average of the weights, used for eval */
    int n_experts, have_ref, ema_on;
    /* model.lora (trainer/optim/lora.h): an adapter per trained expert, attached to pol[e] (whose base has no gradients);
     * the KL reference is pol[e] itself with the adapter off; the EMA averages the adapters, and ema_view[e] is pol[e]
     * with the EMA adapter attached instead (a shallow copy sharing the base: never freed) */
    int lora_on;
    wan_lora_config lc;
    uint64_t base_hash;        /* LoRA or a reference (TRAINER_BASE_HASHED): wan_models_hash of model.path's weights
                                  at start-up, before a resume loads any; checkpoints record it (base_xxh64), a resume
                                  compares it, and under LoRA the run's end checks the frozen base against it */
    wan_lora lora[2], ema_lora[2];
    wan_model ema_view[2];
    /* algorithm.loss nft (core_recipe_forward_process): the old policy, a soft-updated copy of the trained weights
     * (trainer/run/old_policy.c), kept where the EMA is: old[e] a whole model, or with LoRA old_lora[e] and old_view[e]
     * (pol[e] with the old adapter attached: a shallow copy sharing the base, never freed) */
    int old_on;
    wan_model old[2], old_view[2];
    wan_lora old_lora[2];
    uint8_t trained[2];        /* algorithm.train_experts */
    int first;                 /* the first trained expert: its optimizer's step is the policy version */
    optim_config oc;
    optim_adamw opt[2];
    trainer_config tc;
    sde_window win; /* rollout.sde_window */
    /* data */
    core_prompts train, eval;
    uint64_t data_xxh64; /* core_prompts_xxh64(&train): checkpoints record it, a resume compares it */
    char run_id[64];     /* this run's id (trainer_run_id_make; a resumed run keeps its checkpoint's): checkpoints
                            record it */
    trainer_sampler smp;
    float *emb_train, *emb_eval, *emb_neg; /* conditioning [P, L, td], [E, L, td], [L, td] (NULL: zeros) */
    float *img_train, *img_eval; /* image to video (rank 0): each prompt's image condition [P | E, C, 1, h, w], on
                                    the source as its core_rollout_images; NULL for text prompts */
    int64_t shape[4];          /* latent [C, F, H, W] */
    int64_t nl, ne;            /* latent elements, conditioning elements per prompt (L x td) */
    /* outputs (rank 0) */
    core_metrics *metrics;
    int rewards_fd;            /* rewards.jsonl (-1: not open): per step, every sample's uid, prompt index and reward */
    /* parallel layout (sp/topology.h): dp groups of sp ranks; SP peers share samples (docs/design.md section 6) */
    sp_comm *dp;               /* all trainer ranks (NULL: one rank): batches are broadcast over it */
    sp_topology topo;
    sp_rank_info me;
    sp_comm *dpg;              /* this rank's dp group (same sp_rank): loss statistics are summed over it */
    sp_comm *nccl;             /* model.device cuda, several ranks: the trainer ranks on NCCL (sp/comm_nccl.h) */
    sp_usp usp;                /* SP > 1: the Ulysses x Ring self-attention context (its groups) */
    sp_usp usp_dev;            /* SP > 1 on NCCL: the same groups split from the NCCL world (device buffers) */
    wan_exec exec;             /* SP > 1: the DiT's execution with USP attention and the SP group; model.device cuda:
                                  the device executor (exec.dev) */
    const wan_exec *ex;        /* &exec with SP > 1 or on a device, else NULL (the default single-rank CPU path) */
    /* model.device cuda: the DiT executor on the device (model/dit/wan_dev_exec.h, shared with an
     * in-process rollout source) and the trained experts' master weights and moments there (trainer/optim/train_dev.h;
     * tc.opt_step is its step); NULL on the CPU */
    wan_dev_exec *dx;
    trainer_dev dev;
    dp_reduce_ctx red;         /* gradients over dp, statistics over dpg */
    dp_dev_ctx red_dev;        /* model.device cuda over several ranks: red and dev (trainer/dp/dp_dev.h) */
    dp_buckets bk;             /* its gradient buckets reduced during the backward (parallel.grad_bucket_mib) */
    trainer_guard guard;       /* rank 0 (trainer_run): the reward-hacking guard (trainer/run/guard.h); zero elsewhere */
    int n_scorers;             /* rank 0: the run's scorers (trainer_scorers_init), the order of every traj's rewards */
    char scorer_names[CORE_TRAJ_MAX_REWARDS][CORE_TRAJ_NAME_MAX];
} trainer_state;

/* The recipe's step kind (rollout.sde_type, algorithm.cps_logprob). */
flow_kind trainer_flow_kind(const core_recipe *r);
/* The recipe's sampling settings of rollout round `round` onto a training rollout request: step kind, SDE window,
 * step means for GRPO-Guard (with return_trajectories). */
void trainer_rollout_settings(const trainer_state *S, int64_t round, core_rollout_request *req);

/* model.device as the run's lines and parity.json say it: "cpu", "cuda", or "cuda (emulated)" on the tests' emulated
 * device (model/dit/wan_dev_exec.h), which is never presented as a GPU. */
static inline const char *trainer_device_label(const trainer_state *S) {
    return !S->dx ? "cpu" : strcmp(wan_dev_exec_name(S->dx), "emulated") ? "cuda" : "cuda (emulated)";
}

/* The policy version: optimizer steps taken (every trained expert steps together). */
#define TRAINER_VERSION(S) ((S)->opt[(S)->first].step)
/* base_hash holds model.path's weights hash: the run reads them again on resume (LoRA's base, a reference) */
#define TRAINER_BASE_HASHED(S) ((S)->lora_on || (S)->have_ref)

/* The experts' KL references for trainer_update_experts / trainer_accumulate_experts: NULL without a KL term
 * (algorithm.beta 0); with LoRA the policy models themselves (their forward with the adapter switched off); else the
 * copies of the initial weights. */
static inline const wan_model *const *trainer_refs(trainer_state *S, const wan_model *buf[2]) {
    if (!S->have_ref) return NULL;
    for (int e = 0; e < 2; e++) buf[e] = S->lora_on ? &S->pol[e] : &S->ref[e];
    return buf;
}

/* ---- run_setup.c ---- */
/* Checks the recipe, reads the models, prompts and their conditioning, sets up the optimizer, the training config
 * and the parallel layout. -1 with an error. */
int trainer_setup(trainer_state *S, const core_recipe *r, sp_comm *dp);
void trainer_teardown(trainer_state *S);
/* The optimizer config of the recipe (optim.*; total steps = optim.total_steps x optimizer_steps_per_rollout). */
int trainer_optim_config(const core_recipe *r, optim_config *oc);
double trainer_now_s(void);

/* ---- run_files.c ---- */
/* Creates the run folder, writes config.resolved.yaml, opens metrics.jsonl and rewards.jsonl: truncated, or after a
 * resume from step `start` cut back to the rows before it and appended to. */
int trainer_open_run_files(trainer_state *S, int resumed, int64_t start);
/* Saves checkpoint-<step> into checkpoint.dir (default: the run folder) and prints one line. */
int trainer_save_checkpoint(trainer_state *S, int64_t step, const char *config_text);
/* --resume: loads the checkpoint at (or latest in) dir into S (weights, Adam, EMA, sampler, the guard's state);
 * *step = its step. */
int trainer_resume(trainer_state *S, const char *dir, const char *config_text, int64_t total, int64_t *step);
/* The checkpoint folder's best link as the guard's state says (checkpoint-<best_step>; removed, with a warning, when
 * that checkpoint is gone; nothing without gold scorers or checkpoints). -1 with the error. */
int trainer_restore_best(trainer_state *S);

/* ---- eval.c ---- */
/* The fixed eval set (every eval prompt x data.eval_samples_per_prompt, noise stream 3, uid = prompt index x samples
 * per prompt + sample) at the eval weights; adds eval/... fields to the metrics row and prints one line. */
int trainer_eval(trainer_state *S, int64_t step);

/* ---- scorers.c ---- */
/* The run's scorers into S->scorer_names / n_scorers: the recipe's reward.scorers, or with reward.endpoint the
 * server's as its hello reply lists them (a recipe that lists scorers, and weights, must match them in order; one
 * line is printed). -1 with the error naming both lists, or the endpoint that did not answer. */
int trainer_scorers_init(trainer_state *S);
/* The rewards a sample came back with must be the run's scorers, in their order. -1 naming both lists. */
int trainer_check_scorers(const trainer_state *S, const core_traj *t);

/* ---- step_videos.c ---- */
/* logging.video_every: sample videos of the first (up to) 4 eval prompts into run_dir/videos/step-<step>/. */
int trainer_step_videos(trainer_state *S, int64_t step);

/* ---- ema.c ---- */
/* Allocates the EMA (algorithm.ema_decay > 0) at the initial weights. */
int trainer_ema_init(trainer_state *S);
/* ema = d * ema + (1 - d) * weights for every trained expert, after an optimizer step. */
void trainer_ema_update(trainer_state *S);
/* The experts and version eval and sample videos run with (the EMA's, pushed to the source as version +
 * CORE_EVAL_VERSION_OFFSET; else the policy's); trainer_eval_weights_end pushes the policy back. */
int trainer_eval_weights_begin(trainer_state *S, int64_t *version);
int trainer_eval_weights_end(trainer_state *S);

/* ---- objective.c ---- */
/* An update's statistics: the field of the recipe's algorithm.loss (additive: zero it first). */
typedef struct {
    grpo_loss_stats grpo; /* grpo, grpo_guard */
    nft_loss_stats nft;   /* nft */
    dpo_loss_stats dpo;   /* dpo */
} trainer_obj_stats;
/* Optimizer update u (0-based, of algorithm.optimizer_steps_per_rollout) on the step's batch with the recipe's
 * objective (see objective.c; over the dp ranks when there are several, each training its share). stoppable: a
 * signal may end the update before its optimizer step, weights untouched (alone only). -1 with the error. */
int trainer_obj_update(trainer_state *S, const trainer_batch *tb, int u, trainer_obj_stats *st, optim_step_info *info,
                       int stoppable);
/* The trained transitions the statistics count. */
int64_t trainer_obj_transitions(const trainer_state *S, const trainer_obj_stats *st);
/* The statistics as metrics fields under prefix ("" or "offpolicy_last/"): loss, policy_loss, kl and the objective's
 * own (GRPO: clip_fraction, ratio_dev_mean, log_prob_mean_abs_diff; nft: nft/positive_loss, nft/negative_loss,
 * nft/optimality_mean, nft/old_deviate; dpo: dpo/pairs, dpo/reward_margin, dpo/positive_fraction, dpo/err_w,
 * dpo/err_l, dpo/ref_err_w, dpo/ref_err_l). */
int trainer_obj_put_metrics(const trainer_state *S, core_metrics *m, const char *prefix, const trainer_obj_stats *st);
/* The statistics on the step's printed line ("loss ... kl ... | ..."). */
void trainer_obj_summary(const trainer_state *S, const trainer_obj_stats *st, char *buf, size_t cap);

/* ---- old_policy.c ---- */
/* The old policy of algorithm.loss nft (nothing otherwise) at the initial
 * weights: a model copy per expert, or with LoRA an adapter copy per trained expert (on a device, uploaded there).
 * -1 with the error. */
int trainer_old_init(trainer_state *S);
/* After a step's optimizer updates: old = d old + (1 - d) policy for every trained expert (nft_soft_update), with
 * d = nft_old_decay(policy version, algorithm.old_decay_flat, _rate, _max) into *decay (0 without an old policy);
 * on a device its copy there is brought up to date. -1 with the error (a device upload). */
int trainer_old_update(trainer_state *S, double *decay);
/* model.device cuda: the old policy's device copy at the host copy's values (after init, update and resume). */
int trainer_old_sync_device(trainer_state *S);
/* Expert e's old policy (with LoRA: the base with the old adapter attached); NULL without one. */
const wan_model *trainer_old_model(const trainer_state *S, int e);
void trainer_old_free(trainer_state *S);

/* ---- parity.c ---- */
/* This rank's share of the batch recomputed through the training path (no backward), compared with the rollout's
 * velocities vel [n, N, nl]: acc[4i..4i+3] = transitions, sum |dlogp|, max |dlogp|, max |dv| of step i, combined over
 * the dp group. */
int trainer_parity_share(trainer_state *S, const trainer_batch *tb, const float *vel, int N, double *acc);

#endif
