/* core/recipe.c — the recipe schema and its checks (see core/recipe.h). */
#include "core/recipe.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define O(f) offsetof(core_recipe, f)
#define MINV CORE_CFG_MIN
#define MAXV CORE_CFG_MAX

const core_cfg_entry core_recipe_schema[] = {
    {"mode", CORE_CFG_STRING, O(mode), "local", 0, 0, 0, "local|colocated", "local: one process; colocated: reward server, rollout workers, trainer ranks"},
    {"model.path", CORE_CFG_STRING, O(model_path), NULL, CORE_CFG_REQUIRED, 0, 0, NULL, "pipeline folder"},
    {"model.init_preset", CORE_CFG_STRING, O(init_preset), NULL, 0, 0, 0, NULL,
     "when model.path has no pipeline yet, write this preset there first (vgrpo init-model; e.g. tiny)"},
    {"model.text_encoder", CORE_CFG_STRING, O(text_encoder), "umt5", 0, 0, 0, "umt5|word_embed",
     "prompt conditioning: the pipeline's umT5, or the tiny preset's word embeddings"},
    {"model.decoder", CORE_CFG_STRING, O(decoder), "vae", 0, 0, 0, "vae|latent_rgb",
     "latents to pixels: the pipeline's VAE, or the tiny preset's latent-to-RGB map"},
    {"model.vae_scale_factor_spatial", CORE_CFG_INT, O(vae_scale_factor_spatial), "8", MINV | MAXV, 8, 16, NULL,
     "VAE spatial factor: 8 (Wan 2.1 VAE: Wan 2.1, Wan 2.2 A14B, tiny) or 16 (Wan 2.2 VAE: TI2V-5B)"},
    {"model.boundary_ratio", CORE_CFG_DOUBLE, O(boundary_ratio), "0.875", CORE_CFG_MIN_OPEN | CORE_CFG_MAX_OPEN, 0, 1,
     NULL, "two experts: timestep >= this x 1000 uses transformer/, else transformer_2/"},
    {"model.device", CORE_CFG_STRING, O(device), "cpu", 0, 0, 0, "cpu|cuda",
     "where the transformer runs: cpu (fp32 reference) or cuda (bf16 on one GPU; refused where there is none)"},
    {"model.dtype", CORE_CFG_STRING, O(dtype), NULL, 0, 0, 0, "fp32|bf16",
     "the transformer's compute dtype (default: fp32 on cpu, bf16 on cuda)"},
    {"model.text_device", CORE_CFG_STRING, O(text_device), "auto", 0, 0, 0, "auto|cpu",
     "where the umT5 text encoder runs: auto (the transformer's device) or cpu (the fp32 CPU encoder)"},
    {"model.vae_device", CORE_CFG_STRING, O(vae_device), "auto", 0, 0, 0, "auto|cpu",
     "where the VAE decodes: auto (the transformer's model.device: bf16 on the GPU with cuda) or cpu (fp32)"},
    {"model.lora.rank", CORE_CFG_INT, O(lora_rank), "0", MINV | MAXV, 0, 65536, NULL,
     "LoRA rank r of the trained experts' adapters (0: no LoRA, every weight trained)"},
    {"model.lora.alpha", CORE_CFG_DOUBLE, O(lora_alpha), NULL, 0, 0, 0, NULL,
     "LoRA alpha (scale alpha / r, peft's convention); > 0, required with a rank (the peers use 2 x rank)"},
    {"model.lora.targets", CORE_CFG_STRINGS, O(lora_targets), "[to_q, to_k, to_v, to_out.0]", 0, 0, 0, NULL,
     "adapted linears, diffusers module names or dot-suffixes as peft matches them (attn1.to_q, ffn.net.2, to_q, "
     "all-linear, ...)"},
    {"model.lora.init_seed", CORE_CFG_INT64, O(lora_init_seed), "0", MINV, 0, 0, NULL,
     "Philox key of the adapters' A matrices (stream 6; B starts at 0)"},
    {"data.prompt_file", CORE_CFG_STRING, O(prompt_file), NULL, CORE_CFG_REQUIRED, 0, 0, NULL, "training prompts"},
    {"data.eval_prompt_file", CORE_CFG_STRING, O(eval_prompt_file), NULL, 0, 0, 0, NULL, "eval prompts (default: training)"},
    {"data.eval_samples_per_prompt", CORE_CFG_INT, O(eval_samples_per_prompt), "4", MINV | MAXV, 1, 1 << 16, NULL,
     "eval samples per eval prompt"},
    {"data.eval_eta", CORE_CFG_FLOAT, O(eval_eta), "-1", MINV | MAXV, -1, 10, NULL,
     "eval noise level (0: ODE; -1: rollout.eta)"},
    {"data.seed", CORE_CFG_INT64, O(seed), "42", MINV, 0, 0, NULL, "Philox key of every random stream"},
    {"data.max_prompt_file_mb", CORE_CFG_INT, O(max_prompt_file_mb), "64", MINV | MAXV, 1, 1 << 20, NULL,
     "largest prompt file read (MiB; training, eval, eval --prompts)"},
    {"data.max_prompt_bytes", CORE_CFG_INT, O(max_prompt_bytes), "4096", MINV | MAXV, 16, 1 << 24, NULL,
     "longest prompt line (bytes; more than umT5's 512 tokens take)"},
    {"rollout.height", CORE_CFG_INT, O(height), "64", MINV | MAXV, 16, 8192, NULL,
     "pixels, multiple of 2 x model.vae_scale_factor_spatial"},
    {"rollout.width", CORE_CFG_INT, O(width), "64", MINV | MAXV, 16, 8192, NULL,
     "pixels, multiple of 2 x model.vae_scale_factor_spatial"},
    {"rollout.frames", CORE_CFG_INT, O(frames), "5", MINV | MAXV, 1, 4097, NULL, "video frames, 4k+1"},
    {"rollout.num_steps", CORE_CFG_INT, O(num_steps), "10", MINV | MAXV, 2, 1000, NULL,
     "denoising steps (>= 2)"},
    /* shift k maps sigma s to k s / (1 + (k - 1) s), and 1/k mirrors k (f_1/k(s) = 1 - f_k(1 - s)): the lower bound
     * mirrors the upper one. Below about 1e-16, (k - 1) rounds to -1 in double and the first sigma divides by 0. */
    {"rollout.shift", CORE_CFG_DOUBLE, O(shift), "3.0", MINV | MAXV, 1e-3, 1000, NULL, "sigma shift"},
    {"rollout.eta", CORE_CFG_FLOAT, O(eta), "0.7", MINV | MAXV, 0, 10, NULL, "SDE noise level"},
    {"rollout.guidance_scale", CORE_CFG_FLOAT, O(guidance_scale), "4.5", MINV | MAXV, 0, 100, NULL,
     "classifier-free guidance (1: no unconditional forward)"},
    {"rollout.guidance_scale_2", CORE_CFG_FLOAT, O(guidance_scale_2), "-1", MINV | MAXV, -1, 100, NULL,
     "guidance of the low-noise expert transformer_2 (-1: rollout.guidance_scale)"},
    {"rollout.sde_type", CORE_CFG_STRING, O(sde_type), "sde", 0, 0, 0, "sde|cps",
     "SDE step: Flow-GRPO's sde, or its coefficients-preserving cps (eta in [0, 1])"},
    {"rollout.sde_window.size", CORE_CFG_INT, O(sde_window_size), "0", MINV | MAXV, 0, 1000, NULL,
     "noisy (SDE) steps per rollout, the only ones trained (0: every step; Flow-GRPO-Fast, MixGRPO)"},
    {"rollout.sde_window.range", CORE_CFG_INTS, O(sde_window_range), NULL, 0, 0, 0, NULL,
     "[lo, hi]: the window's steps lie in lo .. hi-1 (default [0, num_steps - 1]: the last step is left out)"},
    {"rollout.sde_window.schedule", CORE_CFG_STRING, O(sde_window_schedule), "random", 0, 0, 0, "random|progressive",
     "random: a start per rollout round (Philox stream 7); progressive: MixGRPO's moving window"},
    {"rollout.sde_window.shift", CORE_CFG_INT, O(sde_window_shift), "0", MINV | MAXV, 0, 1000, NULL,
     "progressive: steps the window moves each time (0: its size)"},
    {"rollout.sde_window.iters_per_window", CORE_CFG_INT, O(sde_window_iters), "1", MINV | MAXV, 1, 1 << 30, NULL,
     "progressive: optimizer steps before the window moves"},
    {"rollout.sde_window.at_end", CORE_CFG_STRING, O(sde_window_at_end), "clamp", 0, 0, 0, "clamp|restart",
     "progressive: past the range's end the window stays at the last position, or starts again at lo"},
    {"rollout.prompts_per_step", CORE_CFG_INT, O(prompts_per_step), "2", MINV | MAXV, 1, 1 << 16, NULL, "B"},
    {"rollout.samples_per_prompt", CORE_CFG_INT, O(samples_per_prompt), "4", MINV | MAXV, 2, 1 << 16, NULL,
     "G (>= 2: a group of one has advantage 0 and never trains)"},
    {"rollout.text_len", CORE_CFG_INT, O(text_len), "8", MINV | MAXV, 1, 4096, NULL, "text tokens"},
    {"rollout.batch_size", CORE_CFG_INT, O(batch_size), "8", MINV | MAXV, 1, 1 << 16, NULL, "samples per forward"},
    {"reward.scorers", CORE_CFG_STRINGS, O(scorers), "[]", 0, 0, 0, NULL,
     "scorer names (absent or []: [color_match], or with reward.endpoint the server's list)"},
    {"reward.weights", CORE_CFG_DOUBLES, O(weights), NULL, MINV | MAXV, -1e6, 1e6, NULL, "per scorer (default 1)"},
    {"reward.endpoint", CORE_CFG_STRING, O(reward_endpoint), NULL, 0, 0, 0, NULL,
     "external reward server (ipc://PATH or tcp://HOST:PORT); default: start one"},
    {"reward.models", CORE_CFG_TREE, O(reward_models), NULL, 0, 0, 0, NULL,
     "learned scorers' model folders: a map scorer -> folder (e.g. pickscore: /data/PickScore_v1)"},
    {"reward.frames", CORE_CFG_STRING, O(reward_frames), "all", 0, 0, 0, NULL,
     "frames a learned scorer scores: first, all, or K evenly spaced (first and last included); reward = mean"},
    {"reward.threads", CORE_CFG_INT, O(reward_threads), "2", MINV | MAXV, 1, 256, NULL, "scoring threads of a started server"},
    {"reward.timeout_s", CORE_CFG_DOUBLE, O(reward_timeout_s), "30", CORE_CFG_MIN_OPEN | MAXV, 0, 86400, NULL,
     "seconds before a score request is re-sent (same id)"},
    {"reward.max_attempts", CORE_CFG_INT, O(reward_max_attempts), "20", MINV | MAXV, 1, 100000, NULL,
     "sends of one score request before the worker gives up"},
    {"algorithm.beta", CORE_CFG_FLOAT, O(beta), "0.0", MINV | MAXV, 0, 1e6, NULL, "KL coefficient"},
    {"algorithm.clip_range", CORE_CFG_FLOAT, O(clip_range), "0.2", CORE_CFG_MIN_OPEN | MAXV, 0, 1e6, NULL, "PPO eps"},
    {"algorithm.adv_clip_max", CORE_CFG_FLOAT, O(adv_clip_max), "5.0", CORE_CFG_MIN_OPEN, 0, 0, NULL,
     "advantage clamp (.inf: none)"},
    {"algorithm.std_mode", CORE_CFG_STRING, O(std_mode), "group", 0, 0, 0, "group|batch", "advantage std"},
    {"algorithm.timestep_selection", CORE_CFG_STRING, O(timestep_selection), "all", 0, 0, 0, NULL,
     "all | first_fraction F | random_k K | from_range A B K"},
    {"algorithm.loss", CORE_CFG_STRING, O(loss), "grpo", 0, 0, 0, "grpo|grpo_guard|nft|dpo",
     "objective: GRPO's clipped ratio, GRPO-Guard's mean-bias-corrected, step-scaled one (sde only), DiffusionNFT "
     "on the forward process (no log-prob; any sampler, eta 0 included), or online Flow-DPO (pairs per group, ditto)"},
    /* DiffusionNFT's values (trainer/step/nft.h): the defaults are NVlabs/DiffusionNFT's, config/nft.py */
    {"algorithm.nft_beta", CORE_CFG_FLOAT, O(nft_beta), "1.0", MINV | MAXV, 1e-6, 1e6, NULL,
     "nft: the mixing coefficient beta of the implicit policies v+- (config.beta; 1.0, 0.1 for OCR; the loss divides "
     "by it, so at least 1e-6)"},
    {"algorithm.old_decay_flat", CORE_CFG_INT64, O(old_decay_flat), "0", MINV, 0, 0, NULL,
     "nft: optimizer steps before the old policy starts to lag (decay 0 until then)"},
    {"algorithm.old_decay_rate", CORE_CFG_DOUBLE, O(old_decay_rate), "0.001", MINV | MAXV, 0, 1, NULL,
     "nft: the old policy's decay grows by this per optimizer step past old_decay_flat"},
    {"algorithm.old_decay_max", CORE_CFG_DOUBLE, O(old_decay_max), "0.5", MINV | MAXV, 0, 1, NULL,
     "nft: the old policy's largest decay (old = d old + (1 - d) policy after each step's updates)"},
    /* online Flow-DPO's values (trainer/step/dpo.h): beta is yifan123/flow_grpo's, config/dpo.py */
    {"algorithm.dpo_beta", CORE_CFG_FLOAT, O(dpo_beta), "100", CORE_CFG_MIN_OPEN | MAXV, 0, 1e9, NULL,
     "dpo: beta of the Diffusion-DPO loss -log sigmoid(-beta/2 ((err_w - ref_w) - (err_l - ref_l))) (train.beta 100)"},
    {"algorithm.dpo_pairs", CORE_CFG_STRING, O(dpo_pairs), "best_worst", 0, 0, 0, "best_worst|all",
     "dpo: the pairs of a group: its best and worst sample, or every two whose rewards differ by more than the margin"},
    {"algorithm.dpo_margin", CORE_CFG_FLOAT, O(dpo_margin), "0", MINV | MAXV, 0, 1e9, NULL,
     "dpo: a pair is trained when its reward gap exceeds this (reward units; 0: any preference, ties never)"},
    {"algorithm.cps_logprob", CORE_CFG_STRING, O(cps_logprob), "exact", 0, 0, 0, "exact|flow_grpo",
     "cps log-prob: the exact Gaussian one, or Flow-GRPO's -(x' - mean)^2 (no 1/(2 s^2): other ratios)"},
    {"algorithm.optimizer_steps_per_rollout", CORE_CFG_INT, O(optimizer_steps_per_rollout), "1", MINV | MAXV, 1, 1000,
     NULL, "updates per rollout batch"},
    {"algorithm.micro_batch_size", CORE_CFG_INT, O(micro_batch_size), "16", MINV | MAXV, 1, 1 << 20, NULL,
     "transitions per training forward"},
    {"algorithm.train_experts", CORE_CFG_STRING, O(train_experts), "all", 0, 0, 0, "all|transformer|transformer_2",
     "two-expert pipelines: the experts trained (a frozen one is not trained or synced)"},
    {"algorithm.ema_decay", CORE_CFG_DOUBLE, O(ema_decay), "0", MINV | CORE_CFG_MAX_OPEN, 0, 1, NULL,
     "EMA of the weights for eval (0: off; e.g. 0.99)"},
    {"algorithm.activations", CORE_CFG_STRING, O(activations), "store", 0, 0, 0, "store|recompute|checkpoint",
     "activation memory mode (checkpoint: model.device cuda only, each block rerun in the backward)"},
    {"optim.lr", CORE_CFG_DOUBLE, O(lr), "1e-4", CORE_CFG_MIN_OPEN | MAXV, 0, 10, NULL, "peak learning rate"},
    {"optim.beta1", CORE_CFG_DOUBLE, O(beta1), "0.9", MINV | CORE_CFG_MAX_OPEN, 0, 1, NULL, "AdamW beta1"},
    {"optim.beta2", CORE_CFG_DOUBLE, O(beta2), "0.999", MINV | CORE_CFG_MAX_OPEN, 0, 1, NULL, "AdamW beta2"},
    /* eps is added to sqrt(v) in fp32 (trainer/optim/optim.c): below FLT_MIN (1.2e-38) it rounds to a subnormal or 0, and
     * a parameter whose gradient is 0 divides 0 by 0; 1e-30 leaves room. No upper bound: a large eps only slows. */
    {"optim.eps", CORE_CFG_DOUBLE, O(eps), "1e-8", MINV, 1e-30, 0, NULL, "AdamW eps"},
    /* the weights are multiplied by 1 - lr x weight_decay each update: past 1 that factor is negative, past 2 the
     * weights grow geometrically to inf; core_recipe_check bounds lr x weight_decay by 1 */
    {"optim.weight_decay", CORE_CFG_DOUBLE, O(weight_decay), "0.0", MINV, 0, 0, NULL,
     "decoupled weight decay (optim.lr x weight_decay <= 1)"},
    {"optim.max_grad_norm", CORE_CFG_DOUBLE, O(max_grad_norm), "1.0", 0, 0, 0, NULL, "<= 0: no clipping"},
    {"optim.schedule", CORE_CFG_STRING, O(schedule), "constant", 0, 0, 0, "constant|linear|cosine", "lr schedule"},
    {"optim.warmup_steps", CORE_CFG_INT64, O(warmup_steps), "0", MINV, 0, 0, NULL, "optimizer steps of warm-up"},
    {"optim.total_steps", CORE_CFG_INT64, O(total_steps), "20", MINV | MAXV, 1, 1e9, NULL, "GRPO steps of the run"},
    {"parallel.trainer_ranks", CORE_CFG_INT, O(trainer_ranks), "1", MINV, 1, 0, NULL, "trainer processes"},
    {"parallel.sp", CORE_CFG_INT, O(sp), "1", MINV, 1, 0, NULL, "sequence-parallel degree"},
    {"parallel.ulysses_degree", CORE_CFG_INT, O(ulysses_degree), "1", MINV, 1, 0, NULL, "Ulysses degree"},
    {"parallel.rollout_workers", CORE_CFG_INT, O(rollout_workers), "1", MINV, 1, 0, NULL, "rollout processes"},
    /* 256 MiB: a message's fixed cost (a JSON header, one libzmq message, a few syscalls: tens of microseconds) is
     * under 0.1% of moving 256 MiB at 2-20 GB/s, while the bucket stays a small share of the weights (Wan 2.1 1.3B
     * F32 is 5.7 GB: 22 buckets; an adapter of rank 32 fits in one). 4096 MiB bounds what one message holds. */
    {"parallel.sync_bucket_mib", CORE_CFG_INT, O(sync_bucket_mib), "256", MINV | MAXV, 1, 4096, NULL,
     "weight sync to the rollout workers: bucket size in MiB"},
    /* 25 MiB as PyTorch DDP's bucket_cap_mb: small enough that the first bucket leaves early in the backward, large
     * enough that a bucket's fixed cost (a few NCCL calls) is small; a bucket holds whole DiT blocks (a Wan 2.1 1.3B
     * block is 135 MiB of fp32 gradients: a bucket each) */
    {"parallel.grad_bucket_mib", CORE_CFG_DOUBLE, O(grad_bucket_mib), "25", MINV | MAXV, 0, 65536, NULL,
     "model.device cuda, several trainer ranks: gradient buckets (MiB) reduced during the backward; 0: after it"},
    {"parallel.zero_stage", CORE_CFG_INT, O(zero_stage), "0", MINV | MAXV, 0, 3, NULL,
     "ZeRO: 0 off, 1 AdamW state sharded over the trainer ranks, 2 gradients reduce-scattered too, 3 the fp32 master "
     "weights sharded too (model.device cuda, full fine-tuning) (all bit-identical to 0)"},
    {"parallel.reduce", CORE_CFG_STRING, O(reduce), "exact", 0, 0, 0, "exact|nccl",
     "gradient sums on GPUs: exact (rank order, the same bits at every rank count) or nccl (NCCL's own; faster, "
     "not bit-identical across rank counts; model.device cuda only)"},
    {"parallel.sync", CORE_CFG_STRING, O(sync), "auto", 0, 0, 0, "auto|ipc|buckets|nccl",
     "how a weight sync reaches the rollout workers: auto (CUDA IPC on the trainer's host, NCCL broadcast inside one "
     "MPI job, else buckets over ZeroMQ), ipc, buckets or nccl (trainer/net/controller.h)"},
    {"parallel.gpus", CORE_CFG_INTS, O(gpus), NULL, 0, 0, 0, NULL,
     "model.device cuda: device indices for each node's processes (default: the visible devices)"},
    {"parallel.share_gpus", CORE_CFG_BOOL, O(share_gpus), "false", 0, 0, 0, NULL,
     "model.device cuda: rollout workers share the trainer ranks' GPUs in turns (false: a GPU each)"},
    {"checkpoint.every", CORE_CFG_INT64, O(ckpt_every), "-1", MINV, -1, 0, NULL,
     "save every N GRPO steps, at the end and on SIGINT/SIGTERM (0: only at the end and on a signal; -1: never)"},
    {"checkpoint.dir", CORE_CFG_STRING, O(ckpt_dir), NULL, 0, 0, 0, NULL, "default: the run directory"},
    {"checkpoint.total_limit", CORE_CFG_INT, O(ckpt_total_limit), "0", MINV, 0, 0, NULL, "0: keep all"},
    {"logging.run_dir", CORE_CFG_STRING, O(run_dir), "runs/run", 0, 0, 0, NULL, "run directory"},
    {"logging.file_mode", CORE_CFG_STRING, O(file_mode), "0600", 0, 0, 0, "0600|0640|0644",
     "mode of the files a run creates (folders: the same plus x where r); 0600: private"},
    {"logging.eval_every", CORE_CFG_INT64, O(eval_every), "0", MINV, 0, 0, NULL, "eval every K steps (0: start, end)"},
    {"logging.video_every", CORE_CFG_INT64, O(video_every), "0", MINV, 0, 0, NULL,
     "sample videos every K steps into run_dir/videos/step-K (0: off)"},
    {"guard.gold_scorers", CORE_CFG_STRINGS, O(gold_scorers), "[]", 0, 0, 0, NULL,
     "held-out judges of the in-run eval, scored in the trainer apart from the training reward ([]: none)"},
    {"guard.gold_weights", CORE_CFG_DOUBLES, O(gold_weights), NULL, MINV | MAXV, -1e6, 1e6, NULL,
     "per gold scorer (default 1): the gold score is their weighted sum"},
    {"guard.video_stats", CORE_CFG_BOOL, O(video_stats), "true", 0, 0, 0, NULL,
     "per-step statistics of the training videos (brightness, saturation, contrast, clipping, motion, "
     "high-frequency energy) and their drift from step 0"},
    {"guard.drift_warn_sd", CORE_CFG_DOUBLE, O(drift_warn_sd), "4", CORE_CFG_MIN_OPEN, 0, 0, NULL,
     "warn when a statistic drifts more than this many step-0 standard deviations"},
    {"guard.patience", CORE_CFG_INT, O(guard_patience), "0", MINV | MAXV, 0, 1 << 20, NULL,
     "stop when the training reward rose while the gold eval fell for this many evals in a row (0: never)"},
    {"guard.patience_se", CORE_CFG_DOUBLE, O(guard_patience_se), "2", MINV, 0, 0, NULL,
     "a fall counts when the gold eval is more than this many standard errors below its best"},
    {"limits.memory_mb", CORE_CFG_INT64, O(memory_mb), "0", MINV, 0, 0, NULL,
     "memory the job may use, MiB (0: what the cgroup / machine has available, less a margin)"},
    {"limits.max_step_minutes", CORE_CFG_DOUBLE, O(max_step_minutes), "60", MINV, 0, 0, NULL,
     "refuse a recipe whose GRPO step is estimated to take longer here (0: no bound)"},
    {0},
};

/* The index of text among the choices ("a|b|c") of the schema's key. -1 naming the key and its choices when text is
 * none of them (core_config_apply refuses those first; this covers a recipe filled some other way). */
static int choice_index(const char *key, const char *text, int *out) {
    const core_cfg_entry *e = core_recipe_schema;
    while (e->key && strcmp(e->key, key)) e++;
    if (!e->key || !e->choices) return core_error("%s: not a key with choices (core/recipe.c)", key);
    if (!text) return core_error("%s: must be one of %s, got null", key, e->choices);
    const size_t n = strlen(text);
    int i = 0;
    for (const char *c = e->choices;; i++) {
        const char *bar = strchr(c, '|');
        const size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && !strncmp(c, text, n)) return *out = i, 0;
        if (!bar) break;
        c = bar + 1;
    }
    return core_error("%s: must be one of %s, got \"%s\"", key, e->choices, text);
}

/* Parses every choice key of r into r->choice (model.dtype after its default is filled, by the caller). */
static int parse_choices(core_recipe *r) {
    core_recipe_choices *c = &r->choice;
    int v;
#define CHOICE(key, field)                                                                                             \
    do {                                                                                                               \
        if (choice_index(key, r->field, &v)) return -1;                                                                \
        c->field = v;                                                                                                  \
    } while (0)
    CHOICE("mode", mode);
    CHOICE("model.text_encoder", text_encoder);
    CHOICE("model.decoder", decoder);
    CHOICE("model.text_device", text_device);
    CHOICE("model.device", device);
    CHOICE("model.vae_device", vae_device);
    CHOICE("rollout.sde_type", sde_type);
    CHOICE("rollout.sde_window.schedule", sde_window_schedule);
    CHOICE("rollout.sde_window.at_end", sde_window_at_end);
    CHOICE("algorithm.std_mode", std_mode);
    CHOICE("algorithm.loss", loss);
    CHOICE("algorithm.cps_logprob", cps_logprob);
    CHOICE("algorithm.dpo_pairs", dpo_pairs);
    CHOICE("algorithm.train_experts", train_experts);
    CHOICE("algorithm.activations", activations);
    CHOICE("optim.schedule", schedule);
    CHOICE("parallel.reduce", reduce);
    CHOICE("parallel.sync", sync);
#undef CHOICE
    return 0;
}

/* The options a forward-process objective (core_recipe_forward_process) has no use for: they shape the log-prob of
 * the sampler's steps, which it never computes. */
static int core_recipe_check_forward(const core_recipe *r) {
    const char *loss = r->loss;
    if (r->choice.sde_type == CORE_SDE_TYPE_CPS)
        return core_error("rollout.sde_type: cps is a step chosen for its log-prob; algorithm.loss %s trains on the "
                          "forward process and needs none (use sde; rollout.eta 0 samples with the ODE)", loss);
    if (r->sde_window_size > 0)
        return core_error("rollout.sde_window.size: %d: an SDE window picks the steps whose log-prob GRPO trains; "
                          "algorithm.loss %s trains on the forward process at the rollout's timesteps (use 0, and "
                          "algorithm.timestep_selection to choose them)", r->sde_window_size, loss);
    if (r->choice.cps_logprob != CORE_CPS_LOGP_EXACT)
        return core_error("algorithm.cps_logprob: %s is a log-prob choice; algorithm.loss %s computes no log-prob",
                          r->cps_logprob, loss);
    return 0;
}

int core_recipe_forward_process(const core_recipe *r) {
    switch (r->choice.loss) {
    case CORE_LOSS_GRPO:
    case CORE_LOSS_GRPO_GUARD:
        return 0;
    case CORE_LOSS_NFT:
    case CORE_LOSS_DPO:
        return 1;
    }
    return 0;
}

int core_recipe_check(core_recipe *r) {
    const int f = r->vae_scale_factor_spatial, m = 2 * f; /* every Wan DiT patchifies 2 x 2 latent pixels */
    if (f != 8 && f != 16)
        return core_error("model.vae_scale_factor_spatial: must be 8 (Wan 2.1 VAE) or 16 (Wan 2.2 VAE), got %d", f);
    if (r->height % m)
        return core_error("rollout.height: must be a multiple of %d (model.vae_scale_factor_spatial %d x patch 2), got %d",
                          m, f, r->height);
    if (r->width % m)
        return core_error("rollout.width: must be a multiple of %d (model.vae_scale_factor_spatial %d x patch 2), got %d",
                          m, f, r->width);
    if ((r->frames - 1) % 4) return core_error("rollout.frames: must be 4k+1 (1, 5, 9, ...), got %d", r->frames);
    if (!r->device) return core_error("model.device: must be cpu or cuda, got null");
    if (parse_choices(r)) return -1;
    const core_recipe_choices *c = &r->choice;
    const int cuda = c->device == CORE_CUDA;
    if (!r->dtype && !(r->dtype = strdup(cuda ? "bf16" : "fp32"))) return core_error("out of memory");
    int dt;
    if (choice_index("model.dtype", r->dtype, &dt)) return -1;
    r->choice.dtype = dt;
    if (!cuda && c->dtype != CORE_COMPUTE_FP32)
        return core_error("model.dtype: %s needs model.device cuda (the CPU path computes in fp32)", r->dtype);
    if (cuda && c->dtype != CORE_COMPUTE_BF16)
        return core_error("model.dtype: %s on model.device cuda is not implemented (the device model computes in "
                          "bf16 with fp32 statistics, master weights and optimizer state)", r->dtype);
    if (!cuda && c->reduce == CORE_REDUCE_NCCL)
        return core_error("parallel.reduce: nccl is NCCL's own reduction of device buffers (model.device cuda); "
                          "model.device cpu sums over MPI in rank order: use exact");
    if (c->sync == CORE_SYNC_NCCL && !cuda)
        return core_error("parallel.sync: nccl broadcasts the trainer's device weights to the rollout workers in the "
                          "job's communicator (model.device cuda, mode colocated, --launcher mpirun); this recipe has "
                          "model.device %s", r->device);
    if (r->zero_stage == 3 && !cuda)
        return core_error("parallel.zero_stage: 3 (the fp32 master weights sharded over the trainer ranks) is the "
                          "device path's (model.device cuda); the CPU path has stages 0, 1 and 2");
    if (r->zero_stage == 3 && r->lora_rank > 0)
        return core_error("parallel.zero_stage: 3 shards the fp32 master weights of full fine-tuning; a LoRA adapter "
                          "(model.lora.rank %d) is small (its master, moments and gradients are a few hundred MiB at "
                          "Wan 2.2 A14B): use 2", r->lora_rank);
    if (!cuda && c->activations == CORE_ACTS_CHECKPOINT)
        return core_error("algorithm.activations: checkpoint (whole-block checkpointing) is the device model's "
                          "(model.device cuda); the CPU model has store and recompute");
    /* With reward.endpoint the scorers and weights are the server's (its hello reply, trainer/run/scorers.c): the
     * recipe may list them (then they must match) or leave them out. Else absent means [color_match]. */
    r->weights_given = r->weights.n > 0;
    if (r->scorers.n == 0 && r->reward_endpoint && r->weights.n > 0)
        return core_error("reward.weights: %d weights, but reward.scorers names none (with reward.endpoint %s the "
                          "server's scorers and weights apply; list the scorers too, or leave both out)",
                          r->weights.n, r->reward_endpoint);
    if (r->scorers.n == 0 && !r->reward_endpoint) {
        free(r->scorers.v); /* an empty list's */
        if (!(r->scorers.v = calloc(1, sizeof(char *))) || !(r->scorers.v[0] = strdup("color_match")))
            return core_error("out of memory");
        r->scorers.n = 1;
    }
    for (int i = 0; i < r->scorers.n; i++) {
        if (!r->scorers.v[i] || !r->scorers.v[i][0]) return core_error("reward.scorers.%d: empty name", i);
        for (int j = 0; j < i; j++)
            if (!strcmp(r->scorers.v[i], r->scorers.v[j]))
                return core_error("reward.scorers: \"%s\" is listed twice", r->scorers.v[i]);
    }
    if (r->reward_models) { /* which scorers need folders: the reward module's checks (reward/learned.h) */
        const core_cfg_node *mm = r->reward_models;
        if (mm->kind != CORE_NODE_MAP)
            return core_error("%s: reward.models: a map scorer -> model folder (e.g. pickscore: /data/PickScore_v1)",
                              mm->where);
        if (r->reward_endpoint && mm->n > 0)
            return core_error("%s: reward.models: the external reward server at %s loads its own models (leave "
                              "reward.models out)", mm->where, r->reward_endpoint);
        for (int i = 0; i < mm->n; i++) {
            if (mm->items[i]->kind != CORE_NODE_SCALAR || !mm->items[i]->text || !mm->items[i]->text[0])
                return core_error("%s: reward.models.%s: a folder path", mm->items[i]->where, mm->keys[i]);
            int listed = 0;
            for (int j = 0; j < r->scorers.n; j++) listed |= !strcmp(r->scorers.v[j], mm->keys[i]);
            if (!listed)
                return core_error("%s: reward.models.%s: scorer %s is not in reward.scorers (list it, or remove its "
                                  "folder)", mm->items[i]->where, mm->keys[i], mm->keys[i]);
        }
    }
    if (r->weights.n == 0) {
        free(r->weights.v); /* an empty list's ([] given) */
        r->weights.v = malloc(sizeof(double) * (size_t)(r->scorers.n ? r->scorers.n : 1));
        if (!r->weights.v) return core_error("out of memory");
        r->weights.n = r->scorers.n;
        for (int i = 0; i < r->scorers.n; i++) r->weights.v[i] = 1.0;
    } else if (r->weights.n != r->scorers.n) {
        return core_error("reward.weights: %d weights for %d scorers", r->weights.n, r->scorers.n);
    }
    if (r->lora_rank > 0) { /* the targets and the ranks against the transformer: trainer_check_recipe */
        if (!(r->lora_alpha > 0) || isinf(r->lora_alpha))
            return core_error("model.lora.alpha: must be > 0 with model.lora.rank %d, got %g (Flow-GRPO and miles use "
                              "2 x rank)", r->lora_rank, r->lora_alpha);
        if (r->lora_targets.n < 1)
            return core_error("model.lora.targets: no targets (module names such as to_q, attn1.to_q, ffn.net.2, or "
                              "all-linear)");
    }
    if (r->gold_weights.n == 0 && r->gold_scorers.n > 0) {
        free(r->gold_weights.v); /* an empty list's ([] given) */
        r->gold_weights.v = malloc(sizeof(double) * (size_t)r->gold_scorers.n);
        if (!r->gold_weights.v) return core_error("out of memory");
        r->gold_weights.n = r->gold_scorers.n;
        for (int i = 0; i < r->gold_scorers.n; i++) r->gold_weights.v[i] = 1.0;
    } else if (r->gold_weights.n != r->gold_scorers.n) {
        return core_error("guard.gold_weights: %d weights for %d gold scorers", r->gold_weights.n, r->gold_scorers.n);
    }
    for (int i = 0; i < r->gold_scorers.n; i++) {
        if (!r->gold_scorers.v[i] || !r->gold_scorers.v[i][0]) return core_error("guard.gold_scorers.%d: empty name", i);
        for (int j = 0; j < i; j++)
            if (!strcmp(r->gold_scorers.v[i], r->gold_scorers.v[j]))
                return core_error("guard.gold_scorers: \"%s\" is listed twice", r->gold_scorers.v[i]);
    }
    if (r->guard_patience > 0 && r->gold_scorers.n == 0)
        return core_error("guard.patience: %d needs guard.gold_scorers (the early stop watches the gold eval)",
                          r->guard_patience);
    if (c->sde_type == CORE_SDE_TYPE_CPS && r->eta > 1.0f)
        return core_error("rollout.eta: %g with rollout.sde_type cps, whose noise is sigma_next x sin(eta pi / 2): eta "
                          "must be in [0, 1]", (double)r->eta);
    if (c->cps_logprob == CORE_CPS_LOGP_FLOW_GRPO && c->sde_type != CORE_SDE_TYPE_CPS)
        return core_error("algorithm.cps_logprob: flow_grpo is Flow-GRPO's log-prob of the cps step; rollout.sde_type "
                          "is %s (use exact)", r->sde_type);
    if (core_recipe_forward_process(r) && core_recipe_check_forward(r)) return -1;
    if (c->loss == CORE_LOSS_DPO && r->beta > 0)
        return core_error("algorithm.beta: %g is GRPO's KL weight; algorithm.loss dpo keeps the policy near the reference "
                          "through algorithm.dpo_beta (use 0)", (double)r->beta);
    if (c->loss == CORE_LOSS_GRPO_GUARD && c->sde_type != CORE_SDE_TYPE_SDE)
        return core_error("algorithm.loss: grpo_guard is defined for rollout.sde_type sde (its ratio is scaled by the "
                          "sde step's std sqrt(-dt) std_t); rollout.sde_type is %s", r->sde_type);
    if (r->sde_window_range.n == 0) {
        if (!(r->sde_window_range.v = malloc(2 * sizeof(int64_t)))) return core_error("out of memory");
        r->sde_window_range.n = 2;
        r->sde_window_range.v[0] = 0, r->sde_window_range.v[1] = r->num_steps - 1;
    }
    if (r->sde_window_range.n != 2)
        return core_error("rollout.sde_window.range: must be [lo, hi] (two step indices), got %d numbers",
                          r->sde_window_range.n);
    {
        const int64_t lo = r->sde_window_range.v[0], hi = r->sde_window_range.v[1];
        const int sz = r->sde_window_size;
        if (lo < 0 || hi > r->num_steps || lo >= hi)
            return core_error("rollout.sde_window.range: [%lld, %lld] must satisfy 0 <= lo < hi <= rollout.num_steps "
                              "(%d); the window's steps lie in lo .. hi-1", (long long)lo, (long long)hi, r->num_steps);
        if (sz > hi - lo)
            return core_error("rollout.sde_window.size: %d steps do not fit rollout.sde_window.range [%lld, %lld] (%lld "
                              "steps)", sz, (long long)lo, (long long)hi, (long long)(hi - lo));
    }
    if (!r->eval_prompt_file && !(r->eval_prompt_file = strdup(r->prompt_file))) return core_error("out of memory");
    if (c->mode == CORE_MODE_LOCAL) {
        if (r->trainer_ranks != 1) return core_error("parallel.trainer_ranks: local mode trains in one process (1), got %d", r->trainer_ranks);
        if (r->sp != 1) return core_error("parallel.sp: local mode has no sequence parallelism (1), got %d", r->sp);
        if (r->ulysses_degree != 1) return core_error("parallel.ulysses_degree: must be 1 in local mode, got %d", r->ulysses_degree);
    } else {
        /* docs/design.md section 6: dp = trainer_ranks / sp, ring = sp / ulysses_degree; the sequence is sharded over sp */
        if (r->trainer_ranks % r->sp)
            return core_error("parallel.sp: %d does not divide parallel.trainer_ranks %d", r->sp, r->trainer_ranks);
        if (r->sp % r->ulysses_degree)
            return core_error("parallel.ulysses_degree: %d does not divide parallel.sp %d", r->ulysses_degree, r->sp);
        int F, H, W;
        core_recipe_latent_size(r, &F, &H, &W);
        const int64_t tokens = (int64_t)F * (H / 2) * (W / 2);
        if (tokens % r->sp)
            return core_error("parallel.sp: %d does not divide the video's %lld tokens (%d latent frames x %d x %d "
                              "patches)", r->sp, (long long)tokens, F, H / 2, W / 2);
    }
    if (r->guidance_scale_2 < 0) r->guidance_scale_2 = r->guidance_scale;
    if (r->eval_eta < 0) r->eval_eta = r->eta;
    if (r->lr * r->weight_decay > 1.0) /* the schedule never exceeds the peak lr */
        return core_error("optim.weight_decay: %g x optim.lr %g = %g, over 1: each update multiplies the weights by 1 - "
                          "lr x weight_decay, which would flip their sign (past 2: grow them to inf)", r->weight_decay,
                          r->lr, r->lr * r->weight_decay);
    if (r->warmup_steps > r->total_steps * r->optimizer_steps_per_rollout && c->schedule != CORE_SCHED_CONSTANT)
        return core_error("optim.warmup_steps: %lld is past the last optimizer step (%lld)", (long long)r->warmup_steps,
                          (long long)(r->total_steps * r->optimizer_steps_per_rollout));
    return 0;
}

int core_recipe_text_on_device(const core_recipe *r) {
    return r->choice.text_encoder == CORE_TEXT_UMT5 && r->choice.device == CORE_CUDA &&
           r->choice.text_device == CORE_TEXT_DEVICE_AUTO;
}

void core_recipe_latent_size(const core_recipe *r, int *F, int *H, int *W) {
    *F = (r->frames - 1) / 4 + 1;
    *H = r->height / r->vae_scale_factor_spatial;
    *W = r->width / r->vae_scale_factor_spatial;
}

int core_recipe_load(core_recipe *r, const char *path, const char *const *sets, int n_sets) {
    memset(r, 0, sizeof *r);
    core_cfg_node *root = NULL;
    if (core_config_load_file(path, &root)) return -1;
    int rc = 0;
    for (int i = 0; i < n_sets && !rc; i++) rc = core_config_set(root, sets[i]);
    if (!rc) rc = core_config_apply(root, core_recipe_schema, r);
    core_config_free(root);
    if (!rc && core_recipe_check(r)) rc = core_error_push("%s: ", path);
    if (rc) core_recipe_release(r); /* nothing for the caller to release after a refusal */
    return rc;
}

int core_recipe_dump(const core_recipe *r, FILE *f) { return core_config_dump(core_recipe_schema, r, f); }

core_prompts_limits core_recipe_prompt_limits(const core_recipe *r) {
    return (core_prompts_limits){(int64_t)r->max_prompt_file_mb << 20, r->max_prompt_bytes};
}

void core_recipe_release(core_recipe *r) { core_config_release(core_recipe_schema, r); }
