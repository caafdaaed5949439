/* trainer/budget/budget.h — what a job will need, estimated from the recipe and the model's config files before anything is
 * allocated, and the refusals that follow: `vgrpo run` (both modes, also --dry-run), `vgrpo eval` and `vgrpo parity`
 * print the estimate at start-up and refuse a recipe that does not fit this machine (--force runs it anyway).
 *
 * The model: model.path/transformer/config.json (and transformer_2/ when present), text_encoder/config.json,
 * vae/config.json. When model.path has no transformer yet (a fresh clone, a dry run), the configs of the preset the
 * job would write there (model.init_preset), else of the preset whose name is model.path's folder name lower-cased
 * without "-Diffusers" (recipes/wan2.1-t2v-1.3b.yaml: models/Wan2.1-T2V-1.3B-Diffusers -> wan2.1-t2v-1.3b), with the
 * text encoder and VAE that preset's pipeline has (the tiny ones, or umT5-XXL and the Wan 2.1 / 2.2 VAE). With
 * neither, nothing is estimated (the table says why) and only the recipe's own checks apply.
 *
 * Model limits (refused, --force or not: the run would fail at start-up): the latent patch grid, per axis
 * (F/pt, H/ph, W/pw with latent F = (frames - 1)/4 + 1, H = height / factor, W = width / factor), within the
 * transformer's rope_max_seq_len and the latent sizes divisible by the patch (what wan_acts_new requires); a VAE
 * (the decoder's, or with image prompts the encoder's) whose spatial factor is not model.vae_scale_factor_spatial
 * (named with both values and the VAE folder), or whose temporal factor is not 4 (rollout.frames 4k+1), or whose
 * z_dim is not the transformer's out_channels (what rollout_decoder_load requires); a text encoder whose
 * d_model is not the transformer's text_dim (what text_cond_load requires).
 *
 * Memory, per process kind (a local process; colocated: trainer rank, rollout worker, reward server, supervisor; eval:
 * workers, reward server, the eval process; parity: as colocated), as parts that are held the whole job or only in a
 * phase (start-up, rollout, training, eval, weight sync); a process's peak is what it always holds plus its largest
 * phase, and the job needs the sum over its processes (they share this machine). fp32 throughout, as the CPU path:
 *   weights (params x 4 bytes per expert), gradients and AdamW m and v (every expert: the trainer allocates them for
 *   a frozen one too; parallel.zero_stage 1 or 2 over R trainer ranks: m and v of the rank's shard, about 1/R, the
 *   gradients still whole: trainer/dp/zero.h), the KL reference (algorithm.beta > 0), the EMA (algorithm.ema_decay > 0); prompt embeddings
 *   (training + eval prompts + the negative, x text_len x text_dim); the trajectories of a step (B x G samples x
 *   ((N+1) latents [C, F, H, W] + sigmas, timesteps, log-probs)) and of a local in-run eval (every eval sample at
 *   once); DiT activations, the model's own count (wan_acts_plan_bytes; rollout: WAN_ACTS_INFER for min(batch_size,
 *   n) samples, doubled by CFG; training: algorithm.activations for min(micro_batch_size, transitions) transitions,
 *   doubled by CFG, with sp the token slice; the reference's WAN_ACTS_INFER beside it) and the sampler's and
 *   trainer's scratch buffers; the text encoder (umT5 weights except the token embedding, which stays in the mapped
 *   file; the trainer frees it after encoding, a worker keeps it) and its tokenizer; the VAE decoder (weights, its
 *   decode state: the model's vae_decoder_estimate, the fp32 video of one sample) and the U8 videos; a worker's
 *   second copy of the weights while a sync is staged, and its reply message; image to video (prompt files with
 *   images, trainer/run/images.h): every prompt's condition (TI2V [C, 1, h, w], I2V-A14B [K, F, h, w]) held the whole
 *   job by the trainer (counted on every rank; rank 0 encodes) or the eval process, and at start-up the VAE
 *   encoder's weights, its encode state (model/vae/wan_vae_encode.h vae_encoder_estimate: what it allocates) and
 *   one image's buffers; a fixed runtime of
 *   BUDGET_RUNTIME_MIB per process (code, shared libraries, OpenBLAS / OpenMP buffers: 33 MiB measured for a bare
 *   `vgrpo run --dry-run`). With LoRA (model.lora.rank > 0): the base weights without gradients, moments or a
 *   reference copy (the KL reference is the same weights with the adapters off), the trained experts' adapters with
 *   their gradients and AdamW moments (and their EMA), LoRA's [rows, r] scratch beside each set of activations, and a
 *   worker's staged sync of the adapters only.
 * Not counted: file pages of mapped safetensors while a model loads (reclaimable page cache), allocator
 * fragmentation, ZeroMQ queues beyond one message, the reward scorers' own buffers. How close it is: the activations
 * and the VAE states are what the models allocate, counted by the models' own planning passes (wan_acts_plan_bytes,
 * vae_decoder_estimate, vae_encoder_estimate; tests/test_budget.c compares them with wan_acts_bytes and
 * vae_state_bytes, tests/test_budget_images.c the encoder's with vae_encoder_state_bytes);
 * the whole is checked against the peak RSS of real tiny runs (getrusage of a child `vgrpo run`): within a factor
 * BUDGET_TOLERANCE (1.25) either way; measured on 2 cores, estimate / peak RSS = 1.02 (recipes/tiny-cpu.yaml, 96.5 vs 94.6 MiB), 1.03 (96 x 96, 9 frames: 525 vs 509 MiB), 1.06
 * (64 x 64, recompute, beta 0.01: 246 vs 232 MiB), 1.08 (128 x 128, word_embed, latent_rgb: 125 vs 115 MiB); the
 * margin above that is for thread-count-dependent buffers (OpenBLAS, OpenMP) and the allocator. For full-size models the unmodelled terms are small beside the modelled ones; the estimate
 * is meant to say "38 GiB, not 3", not to size a cgroup to the megabyte.
 *
 * Available memory: the smallest cgroup limit on the process's path (cgroup v2 memory.max or v1
 * memory.limit_in_bytes, read from /proc/self/cgroup and /sys/fs/cgroup, each less the anonymous memory the cgroup
 * already holds), else (and at most) MemAvailable of /proc/meminfo, else physical memory; less a margin of 10% (at
 * least 64 MiB) for the kernel, the page cache and fragmentation; at most limits.memory_mb when set.
 *
 * Work: DiT FLOPs of one GRPO step (docs/design.md section 9 per block, 12SD^2 + 4S^2D + 4SLD + 4LD^2 + 4SDF, plus the
 * patch embedding, proj_out and the text and time embedders): rollout forwards N x B x G x (2 with CFG), training
 * 3 x forward per trained row (CFG: 2 rows per transition) x optimizer_steps_per_rollout, plus the reference's forward
 * (beta > 0); the VAE decode and the scorers are not counted. The time is FLOPs / this process's sgemm rate measured
 * at start-up (k_cpu_ops.gemm, 256 x 512 x 512, best of 3: a few ms): the DiT runs slower than sgemm (the tiny
 * model's small GEMMs at about a tenth of it: 15 GFLOP a step in 1 s against ~130 GFLOP/s), so the time is a lower
 * bound, good to an order of magnitude. Image prompts add the VAE encoder's FLOPs (its convolutions and mid-block
 * attention) for each distinct image once, at start-up: printed on a line of their own, not part of a step. limits.max_step_minutes bounds it (run, parity): a sanity bound against a
 * recipe that would take days a step (8192 x 8192: months), not a schedule.
 *
 * A recipe this build runs only on the CUDA backend (mode colocated, or parity, with a full-size transformer: the
 * refusal of cli/colocated.c) gets its estimate printed (the fp32 CPU figures) and no machine check. With
 * model.device cuda the host parts are the device path's: no DiT activations or parameter gradients (the GPU's: the
 * rollout and training rows, x, enc, out, dout, stay), AdamW's host state, the VAE's fp32 weights without its decode
 * state when it decodes on the GPU, an expert window's gradient shard (trainer/dp/dp_dev.h); checked on the emulated
 * device, whose memory is host memory: host estimate + its peak allocation against the peak RSS
 * (tests/test_budget.c); not checked against this machine (the processes may be on several hosts). budget_preflight then prints the device estimate of each process (trainer/optim/train_dev.h
 * trainer_dev_estimate_recipe, the function the trainer checks at start-up) and whether it fits an 80 GB H100 and a
 * 141 GB H200: reported, not refused (the trainer refuses at start-up against the device's free memory). */
#ifndef TRAINER_BUDGET_H
#define TRAINER_BUDGET_H

#include <stdint.h>
#include <stdio.h>

#include "core/recipe.h"
#include "model/dit/wan_dit.h"
#include "model/text/umt5.h"
#include "model/vae/wan_vae.h"
#include "model/vae/wan_vae_encode.h"

#define BUDGET_RUNTIME_MIB 40  /* per process: code, libraries, thread buffers (33 MiB measured for a dry run) */
#define BUDGET_TOLERANCE 1.25  /* estimate / measured peak RSS within [1/1.25, 1.25] (tiny runs: 1.03-1.08 measured) */
#define BUDGET_MAX_PARTS 24
#define BUDGET_MAX_PROCS 4

/* Phases a part is held in (bit set); 0: the whole job. */
enum { BUDGET_START = 1, BUDGET_ROLLOUT = 2, BUDGET_TRAIN = 4, BUDGET_EVAL = 8, BUDGET_SYNC = 16 };

typedef struct {
    const char *name;   /* "weights", "training activations", ... */
    const char *keys;   /* the recipe keys that drive it (for the refusal and the table) */
    unsigned phases;    /* 0 or BUDGET_* bits */
    double bytes;       /* one process */
} budget_part;

typedef struct {
    const char *name;   /* "local process", "trainer rank", "rollout worker", "reward server", "supervisor", ... */
    int count;          /* processes of this kind in the job */
    int n_parts;
    budget_part part[BUDGET_MAX_PARTS];
    double peak;        /* bytes of one process: its whole-job parts + its largest phase */
} budget_proc;

typedef enum { BUDGET_JOB_RUN, BUDGET_JOB_EVAL, BUDGET_JOB_PARITY } budget_job;

typedef struct {
    budget_job job;
    int workers;              /* eval: --workers (0: parallel.rollout_workers) */
    const char *eval_prompts; /* eval: --prompts (NULL: data.eval_prompt_file) */
} budget_request;

typedef struct {
    budget_job job;
    /* the model as found before loading anything */
    wan_config dit;
    int n_experts;
    int64_t params;           /* per expert */
    int64_t lora_params;      /* model.lora: floats of one expert's adapter (0: no LoRA) */
    int n_adapters;           /* model.lora: adapters trained (one per trained expert) */
    char source[700];         /* where the config came from */
    int have_t5, have_vae;    /* have_vae: the VAE decoder is counted (model.decoder vae) */
    int have_vae_config;      /* vae holds the pipeline's VAE config (its folder's, or the preset's) */
    t5_config t5;
    vae_config vae;
    /* image to video (prompt files with images): the VAE encoder at start-up and the conditions it makes */
    int n_images;             /* distinct image files of the job's prompt files (0: text prompts) */
    int have_enc;             /* n_images > 0 and a VAE config to size the encoder from */
    double enc_params;        /* the encoder's floats (vae_encoder_estimate) */
    double enc_state;         /* bytes of its encode state at rollout.height x rollout.width */
    double enc_pixels;        /* bytes of one image's input buffers (the largest PNG decoded at its own size, U8 and
                                 fp32 at the video's; I2V-A14B: the condition video) */
    double src_pixels;        /* the largest input image's pixels (its PNG header's width x height) */
    int64_t cond_floats;      /* one prompt's condition: TI2V [C, 1, h, w], I2V-A14B [K, F, h, w] */
    double flop_images;       /* FLOPs of encoding the n_images once, at start-up */
    /* sizes */
    int F, H, W;              /* latent frames, height, width */
    int64_t tokens;           /* video tokens per sample */
    int n_train_prompts, n_eval_prompts;
    int64_t transitions;      /* trained transitions of one step (all samples) */
    int cuda_only;            /* no machine check: 1 a full-size transformer in a colocated job, 2 model.device cuda
                                 (the trainer checks the device's own estimate: trainer/optim/train_dev.h) */
    /* parallel.zero_stage (trainer/dp/zero.h): AdamW m and v of the trained buffers, whole and per trainer rank */
    int zero_stage, zero_ranks;
    double adam_whole, adam_shard; /* bytes (the largest rank's shard; stage 0 or one rank: the whole) */
    double shard;             /* fp32 bytes of the largest rank's shard of one trained buffer (the whole without ZeRO):
                                 an expert window's gradient shard (trainer/dp/dp_dev.h) */
    /* memory */
    int n_procs;
    budget_proc proc[BUDGET_MAX_PROCS];
    double total;             /* bytes, every process of the job */
    /* work, FLOPs */
    double flop_rollout, flop_train; /* run: one step (training: all updates); eval: the whole eval in rollout;
                                        parity: the batch and its recompute in train */
    double flop_eval;         /* run: one in-run eval */
} budget_estimate;

/* Estimates job q of recipe r (checked by core_recipe_load / trainer_check_recipe first). Returns 0; 1 when no
 * transformer config is found (nothing estimated; e->source says why); -1 with an error naming the recipe key and the
 * model's limit (see the top comment) or a config file that does not parse. Reads config files and the prompt files
 * (to count prompts, under the recipe's limits); allocates nothing that lasts. */
int budget_estimate_job(budget_estimate *e, const core_recipe *r, const budget_request *q);

/* The transformer config the estimate uses (see the top comment: model.path/transformer/config.json, else a preset),
 * without reading weights; *n_experts (may be NULL) 1 or 2; source (may be NULL) says where it came from or why none.
 * 0, 1 when none is found, -1 when a config file does not parse. */
int budget_transformer_config(const core_recipe *r, wan_config *c, int *n_experts, char *source, size_t cap);

/* The preset the estimate falls back on when model.path has no transformer yet: model.init_preset when set, else the
 * preset model.path's folder name names (e.g. models/Wan2.2-I2V-A14B-Diffusers), else NULL. */
const char *budget_model_preset(const core_recipe *r);

/* DiT FLOPs of one forward of one sample: S video tokens, L text tokens (see the top comment). */
double budget_dit_flop(const wan_config *c, int64_t S, int L);

/* Memory available to this process (see the top comment); root prefixes /proc and /sys (NULL or "": the real ones;
 * tests pass a fake tree). limit_mb > 0 caps it (limits.memory_mb). Never fails: with nothing readable, physical
 * memory. */
typedef struct {
    double bytes;             /* usable: detected less the margin, at most limit_mb */
    double detected;          /* before the margin */
    char source[400];         /* what bounded it: "cgroup v2 memory.max /sys/fs/cgroup/...", "MemAvailable", ... */
} budget_memory;
void budget_memory_available(budget_memory *m, int64_t limit_mb, const char *root);

/* `vgrpo generate`'s memory for one video of frames x height x width from pipeline folder `pipeline` (configs only,
 * no weights read): everything rollout/text_to_video.c holds at once. rows: 2 with classifier-free guidance, else 1;
 * text_len: the prompt's tokens (ROLLOUT_T2V_TEXT_LEN). Bytes: */
typedef struct {
    double weights; /* the transformer(s), fp32 */
    double acts;    /* each expert's inference activations for `rows` rows (wan_acts_plan_bytes) */
    double vae;     /* the VAE decoder's weights and decode state */
    double text;    /* umT5 and its activations (text_encoder/config.json; 0 without one) */
    double image;   /* --image: the VAE encoder's weights and encode state, the image's buffers (the PNG decoded at its
                       own size, then at the video's) and its condition (TI2V [C, 1, h, w]; I2V-A14B [K, T, h, w] and
                       the [3, F, H, W] condition video); 0 without */
    double other;   /* latents, model inputs and outputs, the U8 video and its fp32 pixels */
    double total;   /* the sum, with the runtime */
    int experts;    /* 1, or 2 with a transformer_2 folder */
    int64_t tokens; /* the DiT's video tokens */
    double flop_step; /* one denoising step: rows x budget_dit_flop (one expert runs a step) */
} budget_generate;
/* What `vgrpo generate` holds at once for a frames x height x width video, rows transformer rows (2 with guidance)
 * and image_px (> 0: --image, the first frame's condition, whose PNG has that many pixels, as media_png_probe reads
 * them; 0: none). 0; 1 when the pipeline has no transformer/config.json or vae/config.json (nothing estimated: the
 * job's own loading says what is missing); -1 when a config does not parse (the error names the file and key). */
int budget_generate_bytes(budget_generate *g, const char *pipeline, int frames, int height, int width, int rows,
                          int text_len, double image_px);

/* The pipeline's VAE config as the estimate finds it: model.path/vae/config.json, else (no transformer there yet) the
 * preset's (model.init_preset or the folder's name; z_dim: the transformer's out_channels). 1 found, 0 none, -1 a
 * config that does not parse (the error names the file and key). */
int budget_vae_config(const core_recipe *r, int z_dim, vae_config *v);

/* x FLOPs as "1.23 GFLOP" (GFLOP .. EFLOP, 3 significant digits); s seconds as "12 s", "45 min", "2.5 h" or "3 days". */
void budget_format_flop(char *buf, size_t cap, double x);
void budget_format_duration(char *buf, size_t cap, double s);

/* This process's sgemm rate, GFLOP/s (k_cpu_ops.gemm 256 x 512 x 512, best of 3 after a warm-up; a few ms). */
double budget_gflops(void);

/* The estimate as one table (per process kind: part, MiB or GiB, phase, keys; the job's total against the
 * available memory; the step's GFLOP and time at gflops). */
void budget_print(FILE *f, const budget_estimate *e, const budget_memory *m, double gflops);

/* The machine checks of e: memory (total > m->bytes) and, for run and parity, the step time against
 * limits.max_step_minutes. Returns 0 when everything fits, when e->cuda_only, or with force (then a warning line per
 * excess goes to warn); -1 with an error naming the figures and the recipe keys of the largest parts. */
int budget_check(const budget_estimate *e, const core_recipe *r, const budget_memory *m, double gflops, int force,
                 FILE *warn);

/* The start-up sequence of run, eval and parity: budget_estimate_job, budget_print to out (a title line first),
 * budget_check (warnings to stderr). 0, or -1 with the error (a model limit, a config that does not parse, a
 * refusal). */
int budget_preflight(const core_recipe *r, const budget_request *q, int force, FILE *out);

#endif
