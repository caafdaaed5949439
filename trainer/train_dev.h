/* trainer/train_dev.h — the optimizer half of the training step on a device (model.device cuda):
 * every trained expert's fp32 master weights and AdamW moments live on the device, and the optimizer step runs there
 * (kernels/cuda/k_cuda.h: sumsq for the global gradient norm, scale for clipping, adamw_update writing the fp32
 * master AND the bf16 copy the device model computes with), so no weight crosses to the device after a step.
 *
 * The arithmetic is trainer/optim.c's, bit for bit (kernels/body/kb_optim.h restates it; tests/test_kernel_bodies*.c
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
 * LoRA (model.lora): the trained buffer is each trained expert's adapter (trainer/lora.h's trainer_trained_buffer):
 * its fp32 master and moments live on the device, the step writes the adapter's bf16 copy, and the base stays a
 * frozen bf16 copy (no master, no gradients); the KL reference is the same device model with the adapter off.
 * Not here yet: several trainer ranks (gradients would be reduced over NCCL), ZeRO, an EMA of the adapters evaluated
 * in process. trainer/run_setup.c refuses those recipes with model.device cuda. */
#ifndef TRAINER_TRAIN_DEV_H
#define TRAINER_TRAIN_DEV_H

#include <stdint.h>

#include "model/dit/wan_dev_exec.h"
#include "trainer/optim.h"

typedef struct {
    wan_dev_exec *x;
    int n_experts;
    const wan_model *pol[2];        /* the policy's host models (the keys of their device copies) */
    uint8_t trained[2];
    float *master[2], *m[2], *v[2]; /* device [numel] fp32; NULL for a frozen expert */
    int64_t numel[2];
    int moments_on_host;            /* 1: the host optim_adamw m, v equal the device's */
    int lazy_host;                  /* 1: the master's host copy is made on demand (trainer_dev_sync_host) */
    uint8_t host_stale[2];          /* 1: expert e's host params are older than its device master */
} trainer_dev;

/* Allocates the device state of every trained expert of pol (trained NULL: all) and uploads it: the master from the
 * host params, the moments from opt[e] (zero for a fresh run), the device model's bf16 weights (version
 * opt[e]->step). 0, or -1 (out of device memory; everything freed). */
int trainer_dev_init(trainer_dev *D, wan_dev_exec *x, wan_model *const *pol, int n_experts, const uint8_t *trained,
                     optim_adamw *const *opt);
/* The host state (params, opt m, v, step) uploaded again: after a resume replaced it. */
int trainer_dev_upload(trainer_dev *D, optim_adamw *const *opt);
/* The device moments into the host opt[e] m, v (no-op when they are current there). */
int trainer_dev_sync_moments(trainer_dev *D, optim_adamw *const *opt);
/* The device master into the host params of every expert whose host copy is stale (lazy_host), then the moments
 * (trainer_dev_sync_moments): everything a checkpoint reads. No-op for what is current. 0, or -1 (a device error). */
int trainer_dev_sync_host(trainer_dev *D, optim_adamw *const *opt);
void trainer_dev_free(trainer_dev *D);

/* The start-up estimate of the device memory a trainer process needs (nothing allocated), and the refusal.
 *   c: the transformer config; lora_numel: the parameters of each trained expert's adapter (LoRA: those train,
 *   the base is a frozen bf16 copy) or 0; n_experts, trained (NULL: all); copies: bf16 copies of what trains besides
 *   the policy's (a KL reference copy, an EMA evaluated in this process); ref_forward: a KL reference forward;
 *   train: the shape of the largest training forward (B = micro-batch rows, CFG rows included) and its mode;
 *   rollout: the shape of the largest rollout forward in this process (local mode), or NULL.
 * Counts: per trained expert its trained parameters' bf16 copy, fp32 gradients, master and two moments (18 bytes per
 * parameter), the frozen base under LoRA (2), a frozen expert's bf16 weights and the copies (2 each); the training
 * activations (wan_dev_acts_estimate), the reference's and the rollout's inference activations, the staging. (The
 * LoRA scratch, 2 x rows x rank bf16, is left out: small.) Library workspaces (cuBLASLt, cuDNN)
 * and the allocator's slack are not in it. */
typedef struct {
    double weights;    /* every device copy of weights, gradients, master weights and moments */
    double train_acts; /* the training forward's (and the reference's) activations */
    double roll_acts;  /* the rollout forward's activations (local mode) */
    double staging;    /* host <-> device tensors of the largest forward */
    double total;
} trainer_dev_budget;
int trainer_dev_estimate(const wan_config *c, int64_t lora_numel, int n_experts, const uint8_t *trained, int copies,
                         int ref_forward, const wan_shape *train, wan_acts_mode mode, const wan_shape *rollout,
                         trainer_dev_budget *b);
/* Prints the estimate (one line, stdout) and refuses it, naming the keys to change, when the device reports less
 * free memory than it (mem_info; the emulated device reports none unless VGRPO_EMULATE_DEVICE_MIB is set). -1 then. */
int trainer_dev_check_memory(wan_dev_exec *x, const trainer_dev_budget *b, const char *acts_key_value);

/* trainer_config.opt_step on the device (ctx: a trainer_dev): the step described above over the trained experts'
 * device gradients (accumulated by trainer_accumulate_experts with ex->dev), then the host mirrors. Errors (-1, no
 * weights changed): an invalid config, a non-finite norm ("optim: gradient norm is nan at optimizer step N;
 * parameters not updated"), policy models other than D's, a device failure. */
int trainer_dev_opt_step(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained,
                         optim_adamw *const *opt, const optim_config *ocfg, optim_step_info *info);

#endif
