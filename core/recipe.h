/* core/recipe.h — the recipe: the YAML file `vgrpo run` reads (docs/design.md section 7), its schema, defaults and the
 * checks that need no weights on disk. Keys (defaults in core/recipe.c's schema; `vgrpo run --help-config` lists them):
 *
 *   mode: local | colocated        local: rollout, reward and training in one process (colocated: separate processes)
 *   model.path                     pipeline folder (model_index.json, transformer/, text_encoder/, tokenizer/,
 *                                  vae/; latent_rgb.safetensors for the tiny preset's latent_rgb decoder)
 *   model.init_preset              a preset name (tiny): when model.path/model_index.json is missing, run, eval and
 *                                  parity first write that preset's pipeline there (vgrpo init-model, seed 0)
 *   model.text_encoder             umt5 | word_embed: prompts encoded once at start-up by the pipeline's umT5
 *                                  (text_encoder/ + tokenizer/tokenizer.json; WanPipeline handling: max length
 *                                  rollout.text_len, trimmed and zero-padded; negative = the empty prompt), or the
 *                                  tiny preset's fixed word embeddings (model/text/word_embed.h; negative = zeros)
 *   model.decoder                  vae | latent_rgb: final latents to pixels by the pipeline's VAE (vae/,
 *                                  vae_latents_to_u8: 1 + 4(T-1) frames at rollout.height x width) or by the tiny
 *                                  preset's linear latent-to-RGB map (one frame per latent frame, 8 x 8 blocks)
 *   model.device                   cpu | cuda: where the transformer runs. cpu: the fp32 reference; cuda: the bf16
 *                                  model on one GPU (model/dit/wan_dev.h, the sampler's and the trainer's DiT
 *                                  through model/dit/wan_dev_exec.h). `vgrpo run/eval/parity` refuse cuda
 *                                  with one line on a build or machine without a GPU (kernels.h k_cuda_available);
 *                                  cuda trains with data parallelism (parallel.sp 1; several trainer ranks over
 *                                  NCCL, sp/comm_nccl.h, or the MPI world on the emulated device: trainer/dp/dp_dev.h;
 *                                  model.lora with a rank that is a multiple of 8, no EMA of adapters); --dry-run
 *                                  checks the recipe on any machine
 *   model.vae_device               auto | cpu: where model.decoder vae decodes. auto: where the transformer runs
 *                                  (model.device cuda: the bf16 decoder on that GPU, model/vae/wan_vae.h
 *                                  vae_set_device; cpu: the fp32 CPU decoder); cpu: the CPU decoder whatever the
 *                                  transformer's device (the fp32 reference bits)
 *   model.dtype                    fp32 | bf16: the transformer's compute dtype; default fp32 on cpu, bf16 on cuda
 *                                  (resolved into the recipe); cpu computes fp32 only, cuda bf16 only. Master
 *                                  weights, AdamW state and everything of docs/design.md section 4 stay fp32 either way
 *   model.text_device              auto | cpu: where the umT5 text encoder runs. auto (the default): where the
 *                                  transformer runs (model.device cuda: the encoder's bf16 copy on the same GPU,
 *                                  model/text/umt5.h t5_to_device); cpu: the fp32 CPU encoder whatever model.device
 *                                  says. No effect with model.text_encoder word_embed
 *   model.lora.rank, alpha, targets, init_seed   LoRA: rank >= 1 trains an adapter per trained expert
 *                                  (model/dit/wan_lora.h: y += alpha/rank (x A^T) B^T after each targeted linear, A from
 *                                  Philox stream 6 with init_seed, B = 0) on a frozen base; rank 0 (the default): every
 *                                  weight is trained. alpha > 0 is required with a rank; targets are diffusers module
 *                                  names or dot-suffixes (peft's rule: to_q = attn1.to_q and attn2.to_q; all-linear),
 *                                  checked against the transformer by trainer_check_recipe
 *   data.prompt_file               training prompts, one per line ('#' comments and blank lines skipped)
 *   data.eval_prompt_file          fixed eval prompts (default: the training prompts)
 *   data.eval_samples_per_prompt   eval samples per eval prompt (eval uid = prompt index * this + sample)
 *   data.eval_eta                  eval noise level (0: ODE, deterministic; -1, the default: rollout.eta)
 *   data.seed                      the run's seed: Philox key of rollout noise, selection, shuffle and eval noise
 *   data.max_prompt_file_mb, data.max_prompt_bytes  limits of every prompt file a job reads (core/prompts.h): file
 *                                  size in MiB (64) and line length in bytes (4096); over them the file is refused
 *                                  naming file:line, never read whole or tokenized
 *   model.vae_scale_factor_spatial the VAE's spatial factor (diffusers' vae_scale_factor_spatial): 8 for the Wan 2.1
 *                                  VAE (Wan 2.1, Wan 2.2 A14B, the tiny preset), 16 for the Wan 2.2 VAE (TI2V-5B).
 *                                  In the recipe so --dry-run checks sizes without the VAE's config.json; it must
 *                                  equal the VAE's (checked at start-up and when the decoder loads); 8 with
 *                                  model.decoder latent_rgb
 *   rollout.height, rollout.width  video size in pixels, multiples of factor x 2 (the DiT's patch is 2 x 2 in every
 *                                  Wan model): 16 for factor 8, 32 for factor 16; latent = / factor
 *   rollout.frames                 video frames, 4k+1 (Wan's VAE); latent frames = (frames - 1) / 4 + 1. The
 *                                  latent_rgb decoder decodes one frame per latent frame (no temporal
 *                                  upsampling), so its clips have (frames - 1) / 4 + 1 frames.
 *   rollout.num_steps (>= 2), rollout.shift, rollout.eta, rollout.guidance_scale
 *   rollout.guidance_scale_2       guidance of the low-noise expert (two-expert pipelines; -1: guidance_scale)
 *   model.boundary_ratio           two-expert pipelines (transformer_2/ present): timestep >= ratio x 1000 runs
 *                                  transformer/ (high noise), below it transformer_2/ (low noise); in (0, 1)
 *   rollout.sde_type               sde | cps: Flow-GRPO's SDE step, or its coefficients-preserving one (model/flow/flow.h;
 *                                  cps needs eta in [0, 1]; algorithm.cps_logprob picks its log-prob)
 *   rollout.sde_window.size, range, schedule, shift, iters_per_window, at_end   SDE windows (trainer/step/sde_window.h):
 *                                  size > 0 steps in [lo, hi) are noisy (eta), every other step is the ODE step
 *                                  (eta 0); only window steps are trained and the trajectories keep only their
 *                                  latents. random: Flow-GRPO-Fast's start per rollout round; progressive: MixGRPO's
 *                                  window moving by shift every iters_per_window optimizer steps
 *   rollout.prompts_per_step (B), rollout.samples_per_prompt (G): each step trains on B x G samples
 *   rollout.text_len               text tokens L (umt5: max_sequence_length, longer prompts truncated;
 *                                  word_embed: words, a longer prompt is an error)
 *   rollout.batch_size             samples per DiT forward in rollout (trajectories do not depend on it)
 *   reward.scorers, reward.weights total reward = sum of weight x scorer reward (weights default to 1 each;
 *                                  scorers default to [color_match]); with reward.endpoint they are the server's
 *                                  (its hello reply): listed, they must match it; left out, the server's apply
 *   reward.models.<scorer>         the model folder of a learned scorer (clip_score, pickscore, hpsv2, aesthetic:
 *                                  reward/learned.h), loaded once by the process that scores
 *   reward.frames                  frames a learned scorer scores: first | all | K evenly spaced (the mean is
 *                                  the reward); K at most the decoded video's frames
 *   reward.endpoint                an external reward server (ipc:// or tcp://); absent: eval/run start one
 *                                  (vgrpo reward-server) with reward.threads scoring threads
 *   reward.timeout_s, reward.max_attempts  a rollout worker re-sends a score request (same id) after timeout_s
 *                                  without a reply, up to max_attempts sends, then fails
 *   algorithm.beta                 KL coefficient (0: no reference model)
 *   algorithm.clip_range           PPO clip eps
 *   algorithm.adv_clip_max         advantages clamped to +- this (.inf: no clamp)
 *   algorithm.std_mode             group | batch
 *   algorithm.timestep_selection   all | first_fraction F | random_k K | from_range A B K
 *   algorithm.loss                 grpo | grpo_guard (trainer/step/grpo.h: GRPO-Guard's ratio; rollout.sde_type sde only)
 *                                  | nft (trainer/step/nft.h: DiffusionNFT on the forward process; no log-prob, so
 *                                  rollout.eta 0 is allowed and the cps step, an SDE window and cps_logprob flow_grpo
 *                                  are refused)
 *   algorithm.nft_beta             nft: the mixing coefficient of the implicit positive and negative policies
 *   algorithm.old_decay_flat, old_decay_rate, old_decay_max   nft: the old policy's decay after step k,
 *                                  min(max(0, k - flat) x rate, max); it is soft-updated after each step's updates
 *                                  | dpo (trainer/step/dpo.h: online Flow-DPO, pairs of each group against the initial
 *                                  model; on the forward process as nft, the same refusals; algorithm.beta must be 0)
 *   algorithm.dpo_beta             dpo: beta of the Diffusion-DPO loss
 *   algorithm.dpo_pairs            dpo: best_worst | all (every two samples of a group whose reward gap > dpo_margin)
 *   algorithm.dpo_margin           dpo: the reward gap a pair must exceed (>= 0)
 *   algorithm.cps_logprob          exact | flow_grpo: the cps step's log-prob (flow_grpo: Flow-GRPO's -(x' - mean)^2)
 *   algorithm.optimizer_steps_per_rollout  U >= 1 updates per rollout batch, each on the whole batch (PPO epochs;
 *                                  updates after the first are off-policy)
 *   algorithm.micro_batch_size     trained transitions per DiT forward (gradient accumulation over the rest)
 *   algorithm.train_experts        all | transformer | transformer_2: with two experts, which are trained (each
 *                                  transition trains the expert its rollout step used; a frozen expert's steps
 *                                  are not trained and its weights are not synced)
 *   algorithm.ema_decay            0 (off) or d in (0, 1): after every optimizer step ema = d ema + (1 - d) weights;
 *                                  eval and sample videos then use the EMA (metrics eval/ema = 1), checkpoints keep
 *                                  it under ema/
 *   algorithm.activations          store | recompute | checkpoint (model.device cuda only: whole-block
 *                                  checkpointing, each block's input kept and the block rerun in the backward)
 *   optim.lr, beta1, beta2, eps, weight_decay, max_grad_norm (<= 0: no clipping), schedule (constant | linear |
 *   cosine), warmup_steps (optimizer steps), total_steps (GRPO steps of the run; the schedule spans total_steps x U
 *   optimizer steps)
 *   parallel.trainer_ranks, parallel.sp, parallel.ulysses_degree, parallel.rollout_workers: all 1 in local mode;
 *                                  otherwise sp divides trainer_ranks, ulysses_degree divides sp and sp divides the
 *                                  video's token count (docs/design.md section 6)
 *   parallel.zero_stage            0 | 1 | 2 | 3 (trainer/dp/zero.h): 1 shards the AdamW moments over the trainer
 *                                  ranks, 2 also reduce-scatters the gradients, 3 also shards the fp32 master weights
 *                                  (model.device cuda, full fine-tuning: trainer/dp/dp_dev.h);
 *                                  bit-identical to 0; with one trainer rank
 *                                  (local mode too) the shard is the whole buffer, so any stage runs as 0
 *   parallel.reduce                exact | nccl: how the trainer ranks sum gradients on GPUs (sp/comm_nccl.h). exact
 *                                  (default): in rank order (all-to-all, then a fixed-order sum), the same bits at every
 *                                  rank count and as the CPU path's; nccl: NCCL's own reduce-scatter / all-reduce
 *                                  (faster, not bit-identical across rank counts). model.device cpu refuses nccl
 *   parallel.grad_bucket_mib       model.device cuda with several trainer ranks: the gradients are reduced in buckets of
 *                                  about this many MiB of whole DiT blocks, each as soon as the backward has made it
 *                                  final, on a second stream (trainer/dp/dp_bucket.h); 0: after the backward. The same
 *                                  bits either way with parallel.reduce exact. Default 25 (PyTorch DDP's bucket_cap_mb)
 *   parallel.sync                  auto | ipc | buckets | nccl: how a weight sync reaches the rollout workers
 *                                  (trainer/net/controller.h): auto (default) by CUDA IPC to a worker on the trainer's
 *                                  host, by NCCL broadcast when the workers are in the job's communicator (--launcher
 *                                  mpirun, model.device cuda, a worker on another host), else in buckets over ZeroMQ;
 *                                  ipc: IPC where it can, else buckets; buckets: always buckets; nccl: the broadcast
 *                                  (refused without model.device cuda, and by `vgrpo run` without --launcher mpirun)
 *   parallel.gpus, parallel.share_gpus  model.device cuda: the device indices each node's processes use (absent: the
 *                                  visible devices) and whether rollout workers share the trainer ranks' GPUs in
 *                                  turns (core/gpu_assign.h: who gets which GPU, the refusals)
 *   checkpoint.every               save checkpoint-N (trainer/checkpoint/checkpoint.h) every N GRPO steps, at the end of the run
 *                                  and on SIGINT/SIGTERM (0: only at the end and on a signal; -1, the default: never);
 *                                  checkpoint.dir (default: logging.run_dir); checkpoint.total_limit (keep the
 *                                  newest K; 0: all)
 *   logging.run_dir (config.resolved.yaml, metrics.jsonl), logging.eval_every (0: only at start and end),
 *   logging.file_mode              "0600" (default) | "0640" | "0644": the mode of every file the run creates (its
 *                                  folders: 0700 | 0750 | 0755), through the process umask (core/fs.h)
 *   logging.video_every            K > 0: before every K-th step (and after the last), sample 0 of the first (up to)
 *                                  4 eval prompts (eval noise and eta: the same videos as the eval's) is written to
 *                                  run_dir/videos/step-N/ as mp4s and one PNG contact sheet (0: off)
 *   guard.gold_scorers, gold_weights   held-out judges of the in-run eval (scored in the trainer on the eval videos,
 *                                  metrics gold/...; best/ points at the checkpoint of the best gold eval)
 *   guard.video_stats, drift_warn_sd   per-step training-video statistics (metrics stats/...) and their drift from
 *                                  step 0 in step-0 standard deviations; a warning line past drift_warn_sd
 *   guard.patience, patience_se    early stop: the run stops (and saves) when the training reward rose while the gold
 *                                  eval stayed more than patience_se standard errors below its best for patience evals
 *   limits.memory_mb               memory the whole job may use on this machine, MiB; 0 (default): what the cgroup
 *                                  or the machine has available less a margin (trainer/budget/budget.h)
 *   limits.max_step_minutes        refuse a recipe whose GRPO step (run) or rollout batch (parity) is estimated to take
 *                                  longer than this on this machine (trainer/budget/budget.h; 0: no bound; default 60)
 * run, eval and parity estimate memory and work before allocating anything and refuse what does not fit
 * (trainer/budget/budget.h; --force overrides). */
#ifndef CORE_RECIPE_H
#define CORE_RECIPE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/config.h"
#include "core/prompts.h"
#include "core/tensor.h"

/* The recipe's choices, parsed once from their text by core_recipe_check (core_recipe_load) into r->choice. Each
 * enum lists its key's choices in core_recipe_schema's order ("local|colocated": CORE_MODE_LOCAL = 0, ...); the text
 * fields stay for printing and config.resolved.yaml. algorithm.timestep_selection, which carries numbers, is parsed
 * by trainer/step/grpo.h's grpo_selection_parse. */
typedef enum { CORE_MODE_LOCAL = 0, CORE_MODE_COLOCATED } core_run_mode;               /* mode */
typedef enum { CORE_TEXT_UMT5 = 0, CORE_TEXT_WORD_EMBED } core_text_encoder;           /* model.text_encoder */
typedef enum { CORE_TEXT_DEVICE_AUTO = 0, CORE_TEXT_DEVICE_CPU } core_text_device;       /* model.text_device */
typedef enum { CORE_DECODER_VAE = 0, CORE_DECODER_LATENT_RGB } core_decoder;           /* model.decoder */
typedef enum { CORE_COMPUTE_FP32 = 0, CORE_COMPUTE_BF16 } core_compute_dtype;          /* model.dtype */
typedef enum { CORE_VAE_DEVICE_AUTO = 0, CORE_VAE_DEVICE_CPU } core_vae_device;        /* model.vae_device */
typedef enum { CORE_SDE_TYPE_SDE = 0, CORE_SDE_TYPE_CPS } core_sde_type;               /* rollout.sde_type */
typedef enum { CORE_WINDOW_RANDOM = 0, CORE_WINDOW_PROGRESSIVE } core_window_schedule; /* rollout.sde_window.schedule */
typedef enum { CORE_WINDOW_CLAMP = 0, CORE_WINDOW_RESTART } core_window_at_end;        /* rollout.sde_window.at_end */
typedef enum { CORE_STD_GROUP = 0, CORE_STD_BATCH } core_std_mode;                     /* algorithm.std_mode */
typedef enum { CORE_LOSS_GRPO = 0, CORE_LOSS_GRPO_GUARD, CORE_LOSS_NFT, CORE_LOSS_DPO } core_loss; /* algorithm.loss */
typedef enum { CORE_CPS_LOGP_EXACT = 0, CORE_CPS_LOGP_FLOW_GRPO } core_cps_logprob;    /* algorithm.cps_logprob */
typedef enum { CORE_DPO_PAIRS_BEST_WORST = 0, CORE_DPO_PAIRS_ALL } core_dpo_pairs;    /* algorithm.dpo_pairs */
typedef enum {
    CORE_EXPERTS_ALL = 0,
    CORE_EXPERTS_TRANSFORMER,  /* the high-noise expert, transformer/ */
    CORE_EXPERTS_TRANSFORMER_2 /* the low-noise expert, transformer_2/ */
} core_train_experts;          /* algorithm.train_experts */
typedef enum { CORE_ACTS_STORE = 0, CORE_ACTS_RECOMPUTE, CORE_ACTS_CHECKPOINT } core_activations; /* activations */
typedef enum { CORE_SCHED_CONSTANT = 0, CORE_SCHED_LINEAR, CORE_SCHED_COSINE } core_schedule;     /* optim.schedule */
typedef enum { CORE_REDUCE_EXACT = 0, CORE_REDUCE_NCCL } core_reduce_mode;                       /* parallel.reduce */
typedef enum { CORE_SYNC_AUTO = 0, CORE_SYNC_IPC, CORE_SYNC_BUCKETS, CORE_SYNC_NCCL } core_sync_mode; /* parallel.sync */

typedef struct {
    core_run_mode mode;
    core_text_encoder text_encoder;
    core_text_device text_device;
    core_decoder decoder;
    core_device device; /* core/tensor.h: CORE_CPU, CORE_CUDA */
    core_vae_device vae_device;
    core_compute_dtype dtype;
    core_sde_type sde_type;
    core_window_schedule sde_window_schedule;
    core_window_at_end sde_window_at_end;
    core_std_mode std_mode;
    core_loss loss;
    core_cps_logprob cps_logprob;
    core_dpo_pairs dpo_pairs;
    core_train_experts train_experts;
    core_activations activations;
    core_schedule schedule;
    core_reduce_mode reduce;
    core_sync_mode sync;
} core_recipe_choices;

typedef struct {
    core_recipe_choices choice; /* the choice keys below, parsed (core_recipe_check); read these, print the text */
    char *mode;
    char *model_path, *text_encoder, *decoder, *init_preset;
    char *device, *dtype, *text_device, *vae_device;
    int lora_rank;
    double lora_alpha;
    core_cfg_strings lora_targets;
    int64_t lora_init_seed;
    int vae_scale_factor_spatial;
    double boundary_ratio;
    char *prompt_file, *eval_prompt_file;
    int eval_samples_per_prompt;
    float eval_eta;
    int64_t seed;
    int height, width, frames, num_steps;
    double shift;
    float eta, guidance_scale, guidance_scale_2;
    char *sde_type, *sde_window_schedule, *sde_window_at_end;
    int sde_window_size, sde_window_shift, sde_window_iters;
    core_cfg_ints sde_window_range;
    int prompts_per_step, samples_per_prompt, text_len, batch_size;
    core_cfg_strings scorers;
    core_cfg_doubles weights;
    int weights_given; /* reward.weights was in the recipe (not the default 1 each): compared with the server's */
    char *reward_endpoint;
    char *reward_frames;             /* reward.frames: first | all | K (reward/learned.h) */
    core_cfg_node *reward_models;    /* reward.models: a map scorer -> model folder (NULL: none) */
    int reward_threads, reward_max_attempts;
    double reward_timeout_s;
    float beta, clip_range, adv_clip_max;
    char *std_mode, *timestep_selection, *activations, *train_experts, *loss, *cps_logprob;
    double ema_decay;
    float nft_beta;                                      /* algorithm.nft_beta */
    float dpo_beta, dpo_margin;                          /* algorithm.dpo_beta, dpo_margin */
    char *dpo_pairs;                                     /* algorithm.dpo_pairs */
    int64_t old_decay_flat;                              /* algorithm.old_decay_flat */
    double old_decay_rate, old_decay_max;                /* algorithm.old_decay_rate, old_decay_max */
    int optimizer_steps_per_rollout, micro_batch_size;
    double lr, beta1, beta2, eps, weight_decay, max_grad_norm;
    char *schedule;
    int64_t warmup_steps, total_steps;
    int trainer_ranks, sp, ulysses_degree, rollout_workers;
    int zero_stage;
    char *reduce; /* parallel.reduce */
    char *sync;   /* parallel.sync */
    core_cfg_ints gpus; /* parallel.gpus (n 0: absent, the visible devices) */
    bool share_gpus;
    int sync_bucket_mib; /* parallel.sync_bucket_mib: a weight sync's bucket size (trainer/net/sync_bucket.h) */
    double grad_bucket_mib; /* parallel.grad_bucket_mib: gradient buckets reduced during the backward (0: after it) */
    int64_t ckpt_every;
    char *ckpt_dir;
    int ckpt_total_limit;
    char *run_dir;
    char *file_mode; /* logging.file_mode: "0600" | "0640" | "0644" (core_file_mode_apply) */
    int64_t eval_every, video_every;
    int max_prompt_file_mb, max_prompt_bytes;
    core_cfg_strings gold_scorers;
    core_cfg_doubles gold_weights;
    bool video_stats;
    double drift_warn_sd, guard_patience_se;
    int guard_patience;
    int64_t memory_mb;
    double max_step_minutes;
} core_recipe;

/* The schema (NULL-key terminated), for core_config_* calls and --help-config. */
extern const core_cfg_entry core_recipe_schema[];

/* Loads path, applies the n --set assignments in order, extracts against the schema and runs core_recipe_check.
 * On success *r owns its strings (core_recipe_release). Errors (-1) name the file and line or the --set, and the
 * key. After a failure *r holds nothing (it is released; releasing it again is harmless). */
int core_recipe_load(core_recipe *r, const char *path, const char *const *sets, int n_sets);

/* The cross-field checks that need no weights: size divisibility (rollout.height/width multiple of 2 x
 * model.vae_scale_factor_spatial, which is 8 or 16; frames 4k+1), reward.weights count, distinct scorer names,
 * eval_prompt_file default, parallel degrees (local mode: trainer_ranks, sp, ulysses_degree 1; else trainer_ranks %
 * sp, sp % ulysses_degree, tokens % sp),
 * Fills defaults that depend on other keys
 * (eval_prompt_file = prompt_file when absent; weights = 1 each when absent) and parses the choice keys into r->choice
 * (a text outside the key's choices: -1, "KEY: must be one of A|B, got \"X\""). -1 naming the key. */
int core_recipe_check(core_recipe *r);

/* 1 when algorithm.loss is an objective on the forward process (nft, dpo): no log-prob, the rollout's final latents
 * noised at its timesteps, a second copy of weights (nft: the old policy; dpo: the reference), parity by the velocity
 * alone. */
int core_recipe_forward_process(const core_recipe *r);

/* Whether algorithm.train_experts trains expert e (0: transformer/, 1: transformer_2/). Whether the pipeline has
 * expert 1 at all is the caller's to check. */
static inline int core_recipe_trains_expert(const core_recipe *r, int e) {
    return r->choice.train_experts == CORE_EXPERTS_ALL ||
           r->choice.train_experts == (e ? CORE_EXPERTS_TRANSFORMER_2 : CORE_EXPERTS_TRANSFORMER);
}

/* 1 when the umT5 text encoder runs on the transformer's device: model.text_encoder umt5, model.device cuda and
 * model.text_device auto; 0: on the CPU. */
int core_recipe_text_on_device(const core_recipe *r);

/* Latent frames, height, width of the recipe's video size: (frames - 1) / 4 + 1, height / factor, width / factor
 * (factor = model.vae_scale_factor_spatial). */
void core_recipe_latent_size(const core_recipe *r, int *F, int *H, int *W);

/* The prompt-file limits of the recipe (data.max_prompt_file_mb, data.max_prompt_bytes) for core_prompts_read_limited. */
core_prompts_limits core_recipe_prompt_limits(const core_recipe *r);

/* Writes the resolved recipe (every key, defaults included) as YAML. -1 if writing fails. */
int core_recipe_dump(const core_recipe *r, FILE *f);

void core_recipe_release(core_recipe *r);

#endif
