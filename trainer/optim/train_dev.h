/* trainer/optim/train_dev.h — the optimizer half of the training step on a device (model.device cuda):
 * every trained expert's fp32 master weights and AdamW moments live on the device, and the optimizer step runs there
 * (kernels/cuda/k_cuda.h: sumsq for the global gradient norm, scale for clipping, adamw_update writing the fp32
 * master AND the bf16 copy the device model computes with), so no weight crosses to the device after a step.
 *
 * The arithmetic is trainer/optim/optim.c's, bit for bit (kernels/body/kb_optim.h restates it; tests/test_kernel_bodies*.c
 * and tests/test_train_dev.c check): norm = sqrt(sum over the trained experts, in order, of optim_sumsq of their
 * gradients) (optim_grad_norm_multi), clip factor optim_clip_coef, gradients scaled by (float)factor when it is
 * below 1, lr = optim_lr_at(step), AdamW at t = step + 1 (kb_adamw_prepare's fp32 scalars), no weight-decay mask
 * (as the CPU trainer). So a device step on given gradients equals optim_adamw_step_coef on the same gradients.
 *
 * Host mirrors, which the rest of the trainer reads as on the CPU path. The fp32 master is downloaded into the host
 * model's params after every step only when something reads them every step (lazy_host 0: an EMA, pushes to rollout
 * workers in other processes, and the default); with lazy_host 1 (local mode without EMA: the in-process rollouts
 * and evals use the device copy) a step only marks the host copy stale and trainer_dev_sync_host downloads it when
 * the host needs it (before a checkpoint is written). That saves 4 bytes per parameter per step over the bus (5.7 GB
 * at Wan 1.3B). proj_out.bias's fp32 device copy is refreshed from the master's slice (a few hundred bytes). The
 * moments are downloaded only when the host needs them (trainer_dev_sync_moments / _sync_host: before a checkpoint
 * is written), since nothing else reads them; after a resume the host state is uploaded again (trainer_dev_upload).
 * The host optim_adamw keeps the step count.
 *
 * LoRA (model.lora): the trained buffer is each trained expert's adapter (trainer/optim/lora.h's trainer_trained_buffer):
 * its fp32 master and moments live on the device, the step writes the adapter's bf16 copy, and the base stays a
 * frozen bf16 copy (no master, no gradients); the KL reference is the same device model with the adapter off.
 * Several trainer ranks (data parallelism, ZeRO stages 1 and 2: trainer/dp/dp_dev.h): the moments may be a SHARD
 * [lo, lo + len) of the trained buffer (optim_adamw_init_shard's, as the host state), the step then updates the
 * shard's master, moments and bf16 copy only, and the shard hooks (trainer_dev_shards) supply the whole gradient's
 * sum of squares and bring the other ranks' updated shards in before the host mirrors are made. Without hooks (one
 * rank, or ZeRO stage 0) the step is the one-rank step unchanged. ZeRO stage 3 (trainer_dev_init_sharded) keeps only
 * the shard [lo, lo + len) of the fp32 master on the device too: the step updates it, the bf16 copy's other ranges
 * come from the other ranks (the gather hook), and the host mirror is made every step (lazy_host must be 0) from
 * this rank's range downloaded and the others' gathered over the host group (the host_gather hook); proj_out.bias's
 * fp32 device copy comes from that host mirror. Nothing on the device holds the whole master then: a same-host
 * worker cannot copy it (trainer/run/run_setup.c gives the weight sync no device buffers at stage 3; NCCL syncs send
 * the host copy through the idle device gradients instead: trainer/net/controller.h ctl_set_sync_staging).
 * Not here yet: sequence parallelism on the device, an EMA of the adapters evaluated in process. trainer/run/run_setup.c
 * refuses those recipes with model.device cuda. */
#ifndef TRAINER_TRAIN_DEV_H
#define TRAINER_TRAIN_DEV_H

#include <stdint.h>
#include <stdio.h>

#include "core/recipe.h"

#include "model/dit/wan_dev_exec.h"
#include "model/text/umt5.h"
#include "trainer/optim/optim.h"

typedef struct trainer_dev trainer_dev;

/* How a sharded step (ZeRO over trainer ranks: trainer/dp/dp_dev.h) completes the one-rank step; any hook may be NULL.
 *   sumsq   *out = optim_sumsq of expert e's WHOLE summed gradient, bit for bit, from g: this rank's range of it
 *           (device fp32 [D->len[e]], g[0] is element D->lo[e]; the stage-2 reduce-scatter leaves the range summed; an
 *           expert window's transformer has its sum formed at its phase end, D->gss0, instead); NULL: the device's sumsq of the whole gradient (every rank holds
 *           the whole sum: ZeRO stage 1, after an all-reduce);
 *   gather  after AdamW updated [D->lo[e], + D->len[e]) of expert e's master and bf16 copy on this rank: every other
 *           rank's updated range into them, so that both are whole again (a sharded master, ZeRO stage 3: into the
 *           bf16 copy only);
 *   host_gather  (a sharded master only; required then) params = the host copy [D->numel[e]] of expert e's master,
 *           whose range [D->mlo[e], + D->mlen[e]) this rank has just downloaded: every other rank's range into it
 *           (collective over the trainer ranks). */
typedef struct {
    void *ctx;
    int (*sumsq)(void *ctx, trainer_dev *D, int e, const float *g, double *out);
    int (*gather)(void *ctx, trainer_dev *D, int e);
    int (*host_gather)(void *ctx, trainer_dev *D, int e, float *params);
} trainer_dev_shards;

struct trainer_dev {
    wan_dev_exec *x;
    int n_experts;
    const wan_model *pol[2];        /* the policy's host models (the keys of their device copies) */
    uint8_t trained[2];
    float *master[2];               /* device [mlen] fp32, values [mlo, mlo + mlen) of the trained buffer: the whole
                                       ([0, numel)), or at ZeRO stage 3 the moments' shard; NULL for a frozen expert */
    int64_t mlo[2], mlen[2];
    int master_sharded;             /* 1: trainer_dev_init_sharded's (ZeRO stage 3) */
    float *m[2], *v[2];             /* device [len] fp32: the moments of [lo, lo + len) (the whole without ZeRO) */
    int64_t numel[2], lo[2], len[2];
    trainer_dev_shards shards;      /* zeroed: one rank (set by the caller after trainer_dev_init) */
    int moments_on_host;            /* 1: the host optim_adamw m, v equal the device's */
    int lazy_host;                  /* 1: the master's host copy is made on demand (trainer_dev_sync_host) */
    uint8_t host_stale[2];          /* 1: expert e's host params are older than its device master */
    /* The expert window (trainer_dev_init_window; ZeRO stage 3 with both experts trained): the two experts' bf16
     * weights and fp32 gradients share one device buffer each (wan_dev_exec_window); once an expert's phase of the
     * accumulation ends (trainer/dp/dp_dev.h dp_dev_expert_phase), its summed gradient on this rank's range
     * [lo, lo + len) is kept (transformer's in HOST memory, ghost, with its sum of squares gss0; transformer_2's in
     * place in the window) and bit e of gshard_ready set; the step reads them and clears it. */
    int window;
    float *ghost;                   /* host [len[0]] fp32: transformer's summed gradient on this rank's range */
    double gss0;                    /* optim_sumsq of transformer's whole summed gradient (formed at its phase end) */
    unsigned gshard_ready;
};

/* Allocates the device state of every trained expert of pol (trained NULL: all) and uploads it: the master from the
 * host params, the moments from opt[e] (zero for a fresh run; opt[e]'s range [lo, lo + len): the whole, or a ZeRO
 * shard), the device model's bf16 weights (version opt[e]->step). 0, or -1 (out of device memory; everything freed). */
int trainer_dev_init(trainer_dev *D, wan_dev_exec *x, wan_model *const *pol, int n_experts, const uint8_t *trained,
                     optim_adamw *const *opt);
/* trainer_dev_init with shard_master 1 (ZeRO stage 3: trainer/dp/dp_dev.h): the fp32 master of each trained expert
 * covers the range of its moments only, opt[e]'s [lo, lo + len) (4 bytes per value of the shard; at least 4 bytes
 * for an empty shard), uploaded from that range of the host params. The bf16 copy stays whole, uploaded from the
 * whole host params. Full fine-tuning only: -1 naming the expert for a LoRA adapter. shard_master 0: trainer_dev_init. */
int trainer_dev_init_sharded(trainer_dev *D, wan_dev_exec *x, wan_model *const *pol, int n_experts,
                             const uint8_t *trained, optim_adamw *const *opt, int shard_master);
/* trainer_dev_init_sharded with shard_master 1 and the two experts in one window (wan_dev_exec_window): one bf16 copy
 * and one fp32 gradient buffer on the device instead of two (2 + 4 bytes per parameter of one expert saved), and
 * transformer's reduced gradient shard in host memory until the step (4 bytes per value of the shard, on the host;
 * the step uploads it piece by piece into the window's gradient buffer outside transformer_2's range, where AdamW
 * reads it: elementwise, the same bits). Both experts trained, full fine-tuning, ZeRO stage 3
 * over several ranks (trainer_dev_expert_window says when); the trainer must run the expert phases
 * (trainer_config.expert_phase = dp_dev_expert_phase: trainer/dp/dp_dev.h). -1 naming what is missing otherwise. */
int trainer_dev_init_window(trainer_dev *D, wan_dev_exec *x, wan_model *const *pol, const uint8_t *trained,
                            optim_adamw *const *opt);
/* 1 when a trainer rank of recipe r (n_experts experts) trains in an expert window: model.device cuda, colocated,
 * parallel.zero_stage 3 over trainer_ranks > 1, both experts trained (algorithm.train_experts all), full fine-tuning,
 * and algorithm.loss grpo or grpo_guard (the objectives that accumulate through trainer_accumulate_experts, which
 * runs the expert phases; nft keeps the two experts' buffers apart, dpo trains one expert). The estimate and the trainer both ask it. */
int trainer_dev_expert_window(const core_recipe *r, int n_experts);
/* The host state (params, opt m, v, step) uploaded again: after a resume replaced it (opt's ranges must be those of
 * trainer_dev_init: -1 naming them otherwise). */
int trainer_dev_upload(trainer_dev *D, optim_adamw *const *opt);
/* The device moments into the host opt[e] m, v (no-op when they are current there). */
int trainer_dev_sync_moments(trainer_dev *D, optim_adamw *const *opt);
/* The device master into the host params of every expert whose host copy is stale (lazy_host), then the moments
 * (trainer_dev_sync_moments): everything a checkpoint reads. No-op for what is current. 0, or -1 (a device error). */
int trainer_dev_sync_host(trainer_dev *D, optim_adamw *const *opt);
void trainer_dev_free(trainer_dev *D);

/* The device-memory estimate (trainer/budget/train_dev_budget.c): what one process holds on its GPU, computed from the config
 * and the recipe without a device. ONE function for both users: the trainer's start-up check (trainer/run/run_setup.c,
 * against cudaMemGetInfo's free memory) and `vgrpo run --dry-run` (trainer/budget/budget_host.c, against the cards' sizes).
 *
 * Parts, in bytes (numel: one expert's parameters; t: what trains, the adapter's parameters under LoRA, else numel):
 *   weights      bf16 device copies (wan_dev.h): 2 x numel per expert (the policy; a frozen expert; under LoRA the
 *                frozen base), 2 x t per extra copy of a trained expert (the KL reference's bf16 copy under full
 *                fine-tuning, an EMA evaluated in this process, nft's old policy), the LoRA adapter's bf16 copy 2 x t
 *                (under LoRA an extra copy, nft's old policy, is the base and its adapter again: 2 x (numel + t));
 *                plus each copy's fp32 proj_out.bias (4 x C_out*pt*ph*pw)
 *   gradients    fp32, 4 x t per trained expert (allocated at the first backward); an expert window (request
 *                .window: trainer/dp/dp_dev.h) holds one buffer of 4 x t for both experts (transformer's reduced
 *                shard waits in host memory) and one bf16 copy (2 x numel) for both in `weights`
 *   optimizer    fp32 master weights and AdamW m, v: 12 x t per trained expert; with ZeRO (parallel.zero_stage 1
 *                or 2 over R trainer ranks: trainer/dp/dp_dev.h) 4 x t + 8 x the largest shard (ceil(chunks / R) of
 *                OPTIM_CHUNK values); stage 3 (the master sharded too) 12 x the largest shard
 *   reduction    NCCL's exact reduction over R > 1 trainer ranks (sp/comm_nccl.c: R x min(SP_NCCL_PIECE, the longest
 *                range one rank sums) fp32, made at the first reduction and held): the device group's for gradients
 *                reduced after the backward (ranges of the whole buffer), or with parallel.grad_bucket_mib the buckets'
 *                group's (ranges of a bucket: trainer/dp/dp_bucket.h; a LoRA adapter's bounded by the whole
 *                buffer's). With buckets the device group's is not counted: it reduces gradients only for an expert
 *                some rank has no micro-batch of. 0 over MPI (the emulated device without VGRPO_NCCL_LIB)
 *   staging      the executor's one growing buffer: 4 x rows x ((C_in + C_out) F H W + L text_dim) of the largest forward
 *   training     phase: wan_dev_acts_estimate(train shape, algorithm.activations) + the reference's WAN_ACTS_INFER
 *                beside it (beta > 0), + LoRA's scratch 2 x rows x max(S, L) x rank bf16 (the policy's forward only)
 *   rollout      phase (local mode, and a rollout worker): WAN_ACTS_INFER per distinct CFG setting of the experts
 *                (rows = rollout.batch_size, doubled with CFG), + LoRA's scratch
 *   sequence parallelism (parallel.sp > 1, the trainer): the training activations are one rank's (S / sp tokens,
 *                plus the full-sequence scratch: wan_dev_acts_estimate_sp), plus the USP attention's workspace, held
 *                from its first call (sp/usp_attention.c, the backward's: 22 x the local q's bf16 bytes + 3 x its
 *                LSE's fp32 bytes) and the velocity's all-gather (4 x rows x S x C_out*pt*ph*pw) beside it; LoRA's
 *                scratch for S / sp tokens; cuDNN's workspace for the calls' shapes (self-attention: S / ring tokens,
 *                heads / ulysses; cross-attention: S / sp queries)
 *   VAE decode   a process that decodes on the device (local mode or a rollout worker with model.decoder vae and
 *                model.vae_device auto): the VAE decoder's bf16 weights, held once loaded, and its decode state
 *                (feature caches, activations, im2col rows, the attention's scores) at the rollout's latent size: a
 *                phase of its own, after the rollout's activations are freed and released after each video
 *                (rollout/pipeline.c; model/vae/wan_vae.h vae_decoder_estimate_device: what vae_set_device and a
 *                decode allocate)
 *   sync landing a rollout worker's buffer of one weight sync bucket on the device (rollout/worker_ipc.c: a sync by
 *                IPC or NCCL broadcast lands there before the device weights; parallel.sync buckets: none): 4 x
 *                min(what trains: the model's or the adapter's elements, parallel.sync_bucket_mib), held from the
 *                first sync (a worker of an MPI launch, which may take NCCL syncs: from start-up,
 *                rollout_worker_land_reserve)
 *   allocated    = weights + gradients + optimizer + staging + VAE weights + sync landing + the largest phase (training, rollout,
 *                decode): every byte the DiT and VAE code ask mem_alloc for at its peak (the emulated device counts
 *                exactly this: tests/test_dev_budget.c)
 *   GPU only (the emulated device has no libraries): cuBLASLt's workspace TRAINER_DEV_LT_WS_MIB (gemm_lt.c's
 *   WORKSPACE_BYTES); cuDNN's SDPA backward (training only): a workspace stated as the deterministic backward's fp32
 *   dQ accumulator and fp32 row sums (4 x rows x S x dim + 4 x rows x heads x S), plus attn_cudnn.c's dQ, dK, dV
 *   scratch (bf16, 2 x rows x S x dim + 2 x 2 x rows x max(S, L) x dim); the other scratch slots (reductions, the
 *   bias-gradient vector: TRAINER_DEV_SCRATCH_MIB); a margin of TRAINER_DEV_MARGIN_PCT % of all that (at least
 *   TRAINER_DEV_MARGIN_MIN_MIB) for cudaMalloc's granularity and fragmentation;
 *   need         = allocated + workspaces + margin: what must be free when the process starts (checked at start-up)
 *   context      the CUDA context and the libraries' loaded kernels, stated (TRAINER_DEV_CONTEXT_MIB, not measured:
 *                cudaMemGetInfo's free memory already excludes it at start-up; on a card it counts)
 *   total        = need + context: a card must hold this; compared with an 80 GB H100 (TRAINER_DEV_H100_MIB, what
 *                cudaMemGetInfo reports as total) and a 141 GB H200 (TRAINER_DEV_H200_MIB). */
#define TRAINER_DEV_LT_WS_MIB 32        /* kernels/cuda/gemm_lt.c WORKSPACE_BYTES */
#define TRAINER_DEV_SCRATCH_MIB 16      /* kc_scratch's reduce, bias-gradient and scalar slots (a few MiB at Wan sizes) */
#define TRAINER_DEV_CONTEXT_MIB 1024    /* stated: a Hopper CUDA context with lazy loading is 0.3-0.6 GiB, plus the
                                           cuBLASLt and cuDNN kernels it loads; gpu_check has not measured it yet */
#define TRAINER_DEV_MARGIN_PCT 5
#define TRAINER_DEV_MARGIN_MIN_MIB 256
#define TRAINER_DEV_H100_MIB 81559      /* H100 SXM 80 GB: nvidia-smi's / cudaMemGetInfo's total */
#define TRAINER_DEV_H200_MIB 143771     /* H200 141 GB */

typedef struct {
    const wan_config *c;
    int n_experts;
    const uint8_t *trained; /* per expert; NULL: all */
    int64_t lora_numel;     /* one trained expert's adapter parameters; 0: full fine-tuning */
    int lora_rank;
    int zero_ranks;         /* ZeRO over this many trainer ranks: m, v of a shard (0 or 1: whole) */
    int nccl_ranks;         /* the gradients summed over this many trainer ranks by NCCL's exact reduction
                               (sp/comm_nccl.h; 0 or 1: none, e.g. the emulated device over MPI): its scratch */
    int zero_stage;         /* parallel.zero_stage (2, 3: the reductions are reduce-scatters over the shards; 3: the
                               master is a shard too) */
    double grad_bucket_mib; /* parallel.grad_bucket_mib: the buckets reduced during the backward (trainer/dp/dp_bucket.h) */
    int window;             /* trainer_dev_expert_window: the two trained experts share one bf16 copy and one gradient
                               buffer */
    int copies;             /* extra bf16 copies of each trained expert (a KL reference copy, an in-process EMA,
                               nft's old policy) */
    int ref_forward;        /* a KL reference (or nft's old policy) forward beside the training forward */
    int old_forward;        /* nft: the old policy's forward runs with an adapter under LoRA (its own LoRA scratch) */
    int train;              /* 0: no training (a rollout worker) */
    wan_shape train_shape;  /* the largest training forward (B = micro-batch rows, CFG rows included) */
    int sp, ulysses;        /* the trainer's sequence parallelism (parallel.sp, ulysses_degree; 0 or 1: none): each
                               rank's training activations for tokens / sp, the USP attention's workspace and the
                               gather's transient buffer (sp/usp_attention.c, sp/shard.c) */
    wan_acts_mode mode;     /* algorithm.activations */
    int n_rollout;          /* rollout forwards held at once in the rollout phase (0, 1, or 2 with CFG on one expert
                               and off on the other) */
    wan_shape rollout[2];
    double vae_weights, vae_state; /* the VAE decode's device bytes (0, 0: it decodes on the CPU) */
    int64_t sync_land_numel; /* a rollout worker's weight sync landing buffer, fp32 elements of one bucket (rollout/
                                worker_ipc.c; 0: none) */
} trainer_dev_request;

typedef struct {
    double weights, grads, optim, staging; /* held the whole job once made */
    double reduce;      /* NCCL's exact-reduction scratch (made at the first reduction, then held) */
    double vae;         /* the VAE decoder's weights on the device, held once loaded */
    double vae_state;   /* decode phase: the VAE's decode state */
    double sync_land;   /* a rollout worker's weight sync landing buffer (one bucket, fp32), held from the first sync */
    double train_acts;  /* training phase: activations (train, reference) and LoRA scratch */
    double roll_acts;   /* rollout phase */
    double alloc;       /* what the model code (DiT, VAE, umT5, sync landing) allocates at peak (emulated: exactly) */
    double lt_ws, attn_ws, scratch; /* GPU libraries' workspaces and the backend's scratch */
    double margin, need, context, total;
    double text_weights, text_acts; /* umT5 on the device (trainer_dev_budget_text); 0: on the CPU */
    int window;         /* the request's expert window (weights and gradients counted once for both experts) */
} trainer_dev_budget;

/* The estimate of request q (nothing allocated). 0, or -1 with core_error (a config or shape the device refuses). */
int trainer_dev_estimate(const trainer_dev_request *q, trainer_dev_budget *b);

/* The request of a process of recipe r with transformer config c (n_experts experts; i2v: image prompts, per-token
 * timesteps), then its estimate: worker 0 the trainer process (local mode: with the rollout in it; colocated: the
 * trainer rank), 1 a rollout worker (the policy's bf16 copies, adapters included, and the rollout's activations).
 * The keys read: mode, model.lora, algorithm.train_experts / micro_batch_size / activations / beta / ema_decay,
 * rollout.batch_size / guidance_scale(_2) / text_len / frames / height / width, model.decoder / vae_device (the VAE's
 * config as trainer/budget/budget.h budget_vae_config finds it). 0 or -1. */
int trainer_dev_estimate_recipe(const core_recipe *r, const wan_config *c, int n_experts, int i2v, int worker,
                                trainer_dev_budget *b);

/* Adds the umT5 text encoder to b when it runs on the device (core_recipe_text_on_device) with config t5 (NULL:
 * nothing): its weights (model/text/umt5.h t5_device_bytes) and one prompt's forward buffers at rollout.text_len
 * tokens (text_cond encodes one prompt at a time, at most text_len tokens). A rollout worker (worker 1) keeps the
 * weights the whole job and encodes a new prompt between rollouts (the forward beside the other phases); the trainer
 * process (worker 0: local, or a trainer rank) encodes every prompt at start-up and frees the encoder before the DiT
 * allocates anything, so its peak is the larger of the two. Then margin, need and total again. */
void trainer_dev_budget_text(trainer_dev_budget *b, const core_recipe *r, const t5_config *t5, int worker);

/* The estimate as a table (one line per part with its arithmetic, the total against the H100 and H200), to f. who
 * names the process ("local process", "trainer rank", "rollout worker"); acts: algorithm.activations. */
void trainer_dev_budget_print(FILE *f, const char *who, const trainer_dev_budget *b, const char *acts);

/* Prints the estimate (one line, stdout) and refuses it, naming the keys to change, when the device reports less
 * free memory than b->need (mem_info; the emulated device reports none unless VGRPO_EMULATE_DEVICE_MIB is set). -1
 * then. */
int trainer_dev_check_memory(wan_dev_exec *x, const trainer_dev_budget *b, const char *acts_key_value);

/* trainer_config.opt_step on the device (ctx: a trainer_dev): the step described above over the trained experts'
 * device gradients (accumulated by trainer_accumulate_experts with ex->dev), then the host mirrors. Errors (-1, no
 * weights changed): an invalid config, a non-finite norm ("optim: gradient norm is nan at optimizer step N;
 * parameters not updated"), policy models other than D's, a device failure. With shard hooks (D->shards) AdamW runs
 * on this rank's range and the hooks supply the norm and the other ranks' ranges (a hook's failure after an update
 * leaves the ranks' weights different: the run must stop, as for every collective). */
int trainer_dev_opt_step(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained,
                         optim_adamw *const *opt, const optim_config *ocfg, optim_step_info *info);

/* Expert e's device fp32 gradients [D->numel[e]] (the adapter's under LoRA) and its bf16 compute copy; NULL when the
 * expert is not trained or has no gradients yet. In an expert window both experts' are the one window's. */
float *trainer_dev_grads(trainer_dev *D, int e);
kb_bf16 *trainer_dev_weights16(trainer_dev *D, int e);

#endif
