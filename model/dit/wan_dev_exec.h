/* model/dit/wan_dev_exec.h — the DiT executor on a device (the CUDA backend's GRPO stage): where wan_executor.h's
 * calls (the rollout engine's and the training step's) go instead of wan_forward / wan_backward when the recipe says
 * model.device: cuda. It holds the device copies of the host models it is shown (wan_dev.h: bf16 weights
 * at the host table's offsets, fp32 gradients), keyed by the host model's address and a weights version, and runs
 * the device model with HOST fp32 tensors in and out: x, timestep and enc are uploaded, the velocity (proj_out's
 * fp32 GEMM result) is downloaded as fp32, the output gradient dout uploaded.
 *
 * Why the flow arithmetic stays on the host: the velocity leaves the device in fp32, so the schedule, SDE step,
 * log-prob, KL, CFG combination, loss and advantages run in the very functions of the CPU path (model/flow,
 * trainer/step/grpo.h): docs/design.md section 4's "one function computes mean, std and logp; rollout and trainer both call it"
 * holds on the device path too, and exactly (nothing to match bit for bit between a kernel and model/flow). The
 * price is one download of the velocity and one upload of dout per forward/backward: C*F*H*W floats per row
 * (8.4 MB at Wan 2.1's 81 x 480 x 832), next to a forward that moves tens of GB through the GPU's memory. The
 * k_dev_ops flow entries (sde_step, cfg_combine, ...) are there for when that transfer shows up in a profile.
 *
 * Where the device comes from (wan_dev_exec_open): model.device cuda is the GPU of the CUDA backend (k_cuda_device:
 * a `make cuda` build on a machine with a GPU). For tests only, the environment variable VGRPO_EMULATE_DEVICE=1 puts
 * the EMULATED device there instead (kernels/cuda/emu/k_emu.h: host memory, the kernel bodies on the CPU, k_cpu_ops
 * for GEMM and attention on bf16 operands): the whole device code path (engine, trainer, optimizer, parity) runs in
 * `make test` on a machine without a GPU. Every process that opens it says so on stderr ("EMULATED device ... not a
 * GPU"); it is not a user feature and proves nothing about CUDA.
 *
 * One executor per device per process, shared (reference-counted) by whoever opens it: in local mode the trainer
 * and the in-process rollout source see the same device copies, so the policy the trainer's device optimizer step
 * just refreshed is what the next rollout samples with, without an upload. Not thread-safe (one host thread drives
 * the device, as the CUDA backend's caches require).
 *
 * Weights versions: wan_dev_exec_sync(x, m, v) makes m's device copy hold version v of m's weights (uploaded when the
 * copy is new or holds another version; with a LoRA adapter attached to m, the adapter alone, the base being frozen); a copy used before any sync is uploaded on first use. Whoever changes a
 * host model's weights must sync it with a new version (the rollout worker after a weight update, the local source
 * on push_weights) or, having changed the device copy itself (the trainer's device optimizer step), say so with
 * wan_dev_exec_set_version. A host model that is freed must be forgotten first (wan_dev_exec_forget), since copies
 * are keyed by address. */
#ifndef MODEL_WAN_DEV_EXEC_H
#define MODEL_WAN_DEV_EXEC_H

#include <stdint.h>

#include "model/dit/wan_dev.h"

typedef struct wan_dev_exec wan_dev_exec;

/* The environment variable that selects the emulated device for model.device cuda (tests only; see above). */
#define WAN_DEV_EMULATE_ENV "VGRPO_EMULATE_DEVICE"

/* The process's executor for model.device `device`: "cpu" gives *out = NULL (the fp32 CPU path) and 0; "cuda" the
 * shared executor on the GPU, or on the emulated device when VGRPO_EMULATE_DEVICE=1. Every successful open with
 * *out != NULL needs one wan_dev_exec_close. -1 with "model.device: cuda: <why>" (no CUDA backend in this build, no
 * GPU: k_cuda_available's line), or naming a value other than cpu / cuda. */
int wan_dev_exec_open(const char *device, wan_dev_exec **out);
void wan_dev_exec_close(wan_dev_exec *x);
/* An executor of its own on table dev (not the process's shared one; tests and the GPU check): close it once. */
wan_dev_exec *wan_dev_exec_new(const k_dev_ops *dev);
/* 1 when model.device cuda would run on the emulated device here (VGRPO_EMULATE_DEVICE=1). */
int wan_dev_exec_emulating(void);

const k_dev_ops *wan_dev_exec_ops(const wan_dev_exec *x);
/* "emulated" or the GPU's table name ("cuda-bf16"). */
const char *wan_dev_exec_name(const wan_dev_exec *x);

/* ---- device copies of host models ---- */

/* m's device copy at weights version `version` (uploaded when new or at another version). 0 or -1. */
int wan_dev_exec_sync(wan_dev_exec *x, const wan_model *m, int64_t version);
/* m's device copy was brought to `version` on the device (the trainer's optimizer step wrote its bf16 weights). */
int wan_dev_exec_set_version(wan_dev_exec *x, const wan_model *m, int64_t version);
/* m's device copy (made and uploaded on first use, version unknown); NULL with an error (out of device memory, a
 * config the device refuses: wan_dev_config_check). The pointer stays valid until m is forgotten. The trainer's
 * device optimizer (trainer/optim/train_dev.h) writes its bf16 weights and reads its gradients through it. */
wan_dev_model *wan_dev_exec_model(wan_dev_exec *x, const wan_model *m);
/* Frees m's device copy (no-op when there is none); a window's first model takes the second's with it. */
void wan_dev_exec_forget(wan_dev_exec *x, const wan_model *m);

/* ---- two experts in one window (the trainer at ZeRO stage 3 with both experts trained: trainer/dp/dp_dev.h) ----
 * wan_dev_exec_window: a and b, two host models of one config without adapters (Wan 2.2's two experts), share ONE
 * device buffer of bf16 weights [numel] and ONE of fp32 gradients [numel]; each keeps its fp32 proj_out.bias. The
 * window holds one expert's weights at a time, the RESIDENT one: a forward or backward of the other is refused
 * ("this expert's weights are not on the device ..."), never run on the wrong weights. Whoever fills the window says
 * so: wan_dev_exec_set_resident (trainer/dp/dp_dev.c's expert phases, trainer/optim/train_dev.c's upload; NULL:
 * neither, after the optimizer step), and wan_dev_exec_sync of either uploads it and makes it resident. Both
 * experts' backwards accumulate into the one gradient buffer: the trainer reduces one expert's gradients and keeps
 * its shard elsewhere before the other's first backward (trainer/dp/dp_dev.h). Called before b has a device copy (a's
 * is made here when missing, with its gradients); the window holds a's weights, so a is resident (b's proj_out.bias
 * is uploaded, its weights are not). 0, or -1 naming
 * the reason (other configs, an adapter, b copied already, out of device memory). */
int wan_dev_exec_window(wan_dev_exec *x, const wan_model *a, const wan_model *b);
int wan_dev_exec_set_resident(wan_dev_exec *x, const wan_model *m);
/* 1 when m's weights are on the device for a forward: m resident in its window, or m in no window. */
int wan_dev_exec_resident(const wan_dev_exec *x, const wan_model *m);

/* ---- forward and backward with host tensors ---- */

/* Device activations for m's config, the call's shape and mode (wan_dev_acts_new_sp on the executor's device):
 * rank sp_rank of sequence parallelism of degree sp (1, 0: the whole sequence). */
wan_dev_acts *wan_dev_exec_acts(wan_dev_exec *x, const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode,
                                int sp, int sp_rank);

/* wan_forward's contract with the model on the device: x [B, C, F, H, W], timestep [B] (or [B, S]), enc
 * [B, L, text_dim] host fp32 -> out [B, C_out, F, H, W] host fp32 (the device's fp32 velocity). The shape is a's.
 * A sample's output does not depend on its batch mates where the device's GEMM and attention are batch-invariant
 * (the emulated device: tested; the GPU: gpu_check's "batch mates" row). 0 or -1. */
int wan_dev_exec_forward(wan_dev_exec *x, const wan_model *m, wan_dev_acts *a, float *out, const float *xin,
                         const float *timestep, const float *enc);
/* With m's LoRA adapter applied (use_lora 1, as wan_dev_exec_forward) or not (0: the base, wan_exec.lora_off).
 * ex: NULL, or the sequence-parallel part of the call (wan_dev_forward_sp: ex->sp, ex->attn_*; a from
 * wan_dev_exec_acts with that degree and rank): collective over ex->sp, out full on every rank. */
int wan_dev_exec_forward_lora(wan_dev_exec *x, const wan_model *m, wan_dev_acts *a, const wan_exec *ex, float *out,
                              const float *xin, const float *timestep, const float *enc, int use_lora);
/* wan_backward's contract: dout [B, C_out, F, H, W] host fp32; the parameter gradients ACCUMULATE (+=) into m's
 * device gradients (allocated zeroed on first use; wan_dev_exec_zero_grads): with a LoRA adapter on m, the
 * adapter's (wan_dev_model.lora_grads; the base is frozen). No dx / d enc. ex as in wan_dev_exec_forward_lora
 * (under SP the gradients are this rank's part: the caller sums them over the trainer ranks). 0 or -1. */
int wan_dev_exec_backward(wan_dev_exec *x, const wan_model *m, wan_dev_acts *a, const wan_exec *ex,
                          const float *dout);
/* Zeroes m's device gradients (allocating them). */
int wan_dev_exec_zero_grads(wan_dev_exec *x, const wan_model *m);

#endif
