/* model/dit/wan_dev.h — the Wan transformer on a device op table (the CUDA backend's DiT stage): forward (inference and
 * training activations) and backward of WanTransformer3DModel on k_dev_ops (kernels/cuda/k_cuda.h), the bf16
 * counterpart of the fp32 CPU model of wan_dit.h.
 *
 * One model: the forward and backward are wan_forward.c / wan_backward.c, written once over k_dev_ops; the fp32 CPU
 * model runs the same code through k_cpu_dev_ops (kernels/cpu/dev_table.h), a device through its table with bf16
 * activations (wan_internal.h: the activation layout, the model view of the weights). nn.Linear is one GEMM with the
 * bias epilogue (cuBLASLt's on the GPU); its backward dX then dW with the bias-gradient epilogue; the modulation
 * table and the residual adds are the table's add_table_* and add entries. Only the timestep's sinusoidal features
 * (wan_timestep_features) and the RoPE table (k_wan_rope_table) are computed on the host, exactly as the CPU computes
 * them, and uploaded. This file declares the device's entries (wan_dev.c) and its weights and gradients.
 * The code reaches the device only through a `const k_dev_ops *` (memory entries included), so it builds in the
 * plain CPU build and runs there against the emulated device (kernels/cuda/emu/k_emu.h: `make test`,
 * tests/test_wan_dev.c) and on a GPU against k_cuda_ops (`make cuda`; scripts/gpu_check.sh's Wan DiT rows).
 * Status: never run on a GPU (kernels/cuda/README.md).
 *
 * Dtypes (docs/design.md section 4, "On the GPU"):
 *   weights      bf16 device copies of the fp32 master wan_model.params, at the same offsets of the same table
 *                (wan_layout: one source of truth for names and shapes; a tensor's device pointer is found from the
 *                host model's named pointer, wan_weights, by its offset). Plus one fp32 copy of proj_out.bias, the
 *                epilogue of the fp32 velocity GEMM.
 *   activations  bf16: every GEMM input and output, the attention operands, the norm and modulation outputs, the
 *                residual stream.
 *   fp32         norm statistics (mean, rstd), attention LSE (natural log, cuDNN's stats), the modulation rows
 *                (scale_shift_table + tproj / temb, small), proj_out's output (the velocity: the SDE step and its
 *                log-prob stay fp32), parameter gradients (accumulated, +=), and the backward's long sums: the
 *                residual stream's gradient (a bf16 copy where a GEMM reads it), the text context's gradient (summed
 *                over every block's K/V projections), the time embedding's gradients (summed over every block's
 *                modulation). dx and d enc are whatever views the caller passes (fp32 recommended).
 *   GEMMs accumulate in fp32 (cuBLASLt; the emulated device runs k_cpu_ops on widened operands).
 *
 * Device constraints (wan_dev_config_check; cuBLASLt's leading dimensions and cuDNN's head dim): dim, head dim,
 * ffn_dim, text_dim, freq_dim and the patch vectors C*pt*ph*pw, C_out*pt*ph*pw multiples of 8; head dim <= 128
 * (cuDNN's SDPA backward). Every preset satisfies them (tiny included); tests' smallest configs may not.
 * LoRA (model/dit/wan_lora.h): an adapter attached to the host model is copied too (bf16 A and B, fp32 gradients),
 * applied after every adapted linear unless the forward says not (wan_dev_forward_lora); its rank must be a multiple
 * of 8. Sequence parallelism: wan_dev_acts_new_sp and wan_dev_forward_sp / wan_dev_backward_sp run the DiT's SP
 * branches (model/dit/wan_forward.c) on the bf16 activations with a sequence-parallel self-attention hook on device
 * tensors (sp/usp_attention.h on this device's table); without SP the self-attention is the table's (cuDNN's).
 * The rollout engine and the trainer reach this model through the executor of model/dit/wan_dev_exec.h (host fp32
 * tensors in and out, device copies per host model and weights version).
 *
 * Memory (device bytes): weights 2 x numel, gradients 4 x numel (wan_dev_alloc_grads), activations
 * wan_dev_acts_bytes — about half of the CPU's wan_acts_bytes for the same mode (bf16 instead of fp32, fp32 for
 * the statistics and the few tensors above). wan_dev_acts_estimate gives the figure before allocating (library
 * workspaces and scratch not included). At 81 frames 480x832 (32,760 tokens), 512 text tokens, batch 1:
 *   wan2.1-t2v-1.3b   weights 2.6 GiB, gradients 5.3 GiB; activations INFER 3.2, CHECKPOINT 7.9, RECOMPUTE 48.4,
 *                     STORE 88.8 GiB
 *   wan2.2-t2v-a14b   weights 26.6 GiB, gradients 53.2 GiB; activations INFER 8.6, CHECKPOINT 25.4, RECOMPUTE 168.7,
 *                     STORE 311.5 GiB
 * (tests/test_wan_dev.c wan_dev_memory_wan_shapes). The A14B's training forward does not fit one 141 GiB GPU with
 * RECOMPUTE (the GEMM and attention results of every block are kept); WAN_ACTS_CHECKPOINT (whole-block
 * checkpointing: each block's input kept, 0.31 GiB per block at A14B, plus one block's full set, and the block's
 * forward rerun in its backward, about a third more GEMM work) does. Full fine-tuning adds the trainer's fp32 master
 * weights and two AdamW moments on the device (trainer/optim/train_dev.h): 18 bytes per parameter with the bf16 copy and
 * the gradients, 23.8 GiB for the 1.3B, 240 GiB for one A14B expert; so the A14B trains with LoRA on one device: both
 * experts' frozen bf16 bases (53.2 GiB) and rank-64 adapters on the block linears (18 bytes per adapter parameter,
 * 10.3 GiB) beside CHECKPOINT's activations, 95.4 GiB in all at its recipe's 14,040 tokens with workspaces, margin
 * and context (trainer/optim/train_dev.h's estimate; RECOMPUTE would need 224.9).
 *
 * Exactness: every op of the table is deterministic (k_cuda.h), so a forward twice gives the same bits;
 * WAN_ACTS_RECOMPUTE and WAN_ACTS_CHECKPOINT give the same gradients as WAN_ACTS_STORE bit for bit (the backward
 * recomputes the elementwise steps, or the whole block, with the forward's own functions); a sample's forward does
 * not depend on its batch mates where the table's GEMM and attention are batch-invariant (the emulated device:
 * tested; the GPU: gpu_check reports it).
 *
 * Errors: every int function returns 0, or -1 with core_error naming the op or the mismatch (a table entry's own
 * message for a failed launch or a shape it refuses). */
#ifndef MODEL_WAN_DEV_H
#define MODEL_WAN_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/k_cuda.h"
#include "model/dit/wan_dit.h"

/* The device's constraints on a config (see the top comment). 0, or -1 naming the key: "<label>: ffn_dim 100 is not
 * a multiple of 8 (cuBLASLt's leading dimensions on the device)". */
int wan_dev_config_check(const wan_config *c, const char *label);

/* ---------------------------------------------------------------------------------------------------------------
 * The model on the device */

typedef struct {
    const k_dev_ops *dev;
    const wan_model *host;   /* borrowed: config, table, named pointers (the offset map) and the fp32 master */
    kb_bf16 *w;              /* device [layout.numel] bf16 weights at the table's offsets */
    float *proj_out_b;       /* device [C_out*pt*ph*pw] fp32 proj_out.bias */
    float *grads;            /* device [layout.numel] fp32 gradients, NULL until wan_dev_alloc_grads */
    /* LoRA (model/dit/wan_lora.h): the adapter attached to host when the device copy was made or last uploaded,
     * its bf16 copy at the adapter table's offsets and its fp32 gradients; the base then has no gradients (frozen) */
    const wan_lora *lora;    /* borrowed (host->lora); NULL: none */
    kb_bf16 *lora_w;         /* device [lora->layout.numel] bf16 */
    float *lora_grads;       /* device [lora->layout.numel] fp32, NULL until wan_dev_alloc_grads */
    int base_borrowed;       /* 1: w and proj_out_b are another copy's (wan_dev_model_init_view): not freed here */
    int window;              /* 1: w and grads are the window owner's (wan_dev_exec_window, model/dit/wan_dev_exec.h):
                                not freed here; proj_out_b is this copy's own */
} wan_dev_model;

/* Checks the config (wan_dev_config_check), allocates the device copy of host's weights and uploads them
 * (wan_dev_model_upload). host must outlive d. 0 or -1 (on failure d is left freed). */
int wan_dev_model_init(wan_dev_model *d, const k_dev_ops *dev, const wan_model *host);
/* A second adapter on a frozen base already on the device (DiffusionNFT's old policy under LoRA,
 * trainer/run/old_policy.c): d borrows base's bf16 weights and proj_out.bias (no copy) and holds host->lora's bf16
 * adapter of its own. host must share base->host's fp32 weights (the same params buffer) and carry an adapter; base
 * must outlive d. wan_dev_model_upload of d uploads the adapter only. 0 or -1 (d left freed). */
int wan_dev_model_init_view(wan_dev_model *d, const wan_dev_model *base, const wan_model *host);
/* Rounds host->params to bf16 (round to nearest even) into the device copy again: after the master changed. With
 * an adapter attached to host (LoRA), the adapter's bf16 copy too (made, or made again when host->lora changed). */
int wan_dev_model_upload(wan_dev_model *d);
/* The adapter alone (host->lora's params rounded to bf16): a LoRA update leaves the frozen base as it is. Refused
 * with a rank that is not a multiple of 8 (cuBLASLt's leading dimensions): "model.lora.rank: ...". */
int wan_dev_model_upload_lora(wan_dev_model *d);
/* The weight sync's device-to-device path (rollout/worker_ipc.c): the device copy from src, a DEVICE fp32 buffer in
 * the host table's layout (adapter 0: [layout.numel], the model's params, whose proj_out.bias also goes to
 * proj_out_b; adapter 1: [lora->layout.numel], the attached adapter's, which must be the one the copy holds), rounded
 * to bf16 by mem_round_bf16: the bits wan_dev_model_upload gives for the same values, without the host. 0, or -1
 * (no such entry, no adapter on the copy). */
int wan_dev_model_from_device(wan_dev_model *d, const float *src, int adapter);
/* Allocates zeroed fp32 device gradients (no-op if present) / zeroes them: the base's, or with an adapter attached
 * (LoRA: a frozen base) the adapter's only. */
int wan_dev_alloc_grads(wan_dev_model *d);
int wan_dev_zero_grads(wan_dev_model *d);
/* Copies the device gradients into host [layout.numel] (the table's order and offsets: wan_model.grads' layout); with
 * an adapter, its gradients [lora->layout.numel] (wan_lora.grads' layout). */
int wan_dev_grads_download(const wan_dev_model *d, float *host);
void wan_dev_model_free(wan_dev_model *d);

/* ---------------------------------------------------------------------------------------------------------------
 * Activations (model/dit/wan_acts.c): what wan_acts keeps, in device memory, for one (config, shape, mode) */

typedef struct wan_acts wan_dev_acts; /* the one activation struct (model/dit/wan_internal.h) on a device */

/* Allocates device activations (checked like wan_acts_new, plus wan_dev_config_check) and uploads the RoPE table.
 * NULL with core_error on a bad shape or when the device is out of memory. */
wan_dev_acts *wan_dev_acts_new(const k_dev_ops *dev, const wan_config *cfg, const wan_shape *shape,
                               wan_acts_mode mode);
/* The activations of sequence-parallel rank sp_rank of sp (wan_acts_new_sp's slicing, on the device: bf16 per-token
 * tensors for S/sp tokens, the full-sequence scratch); use with wan_dev_forward_sp / wan_dev_backward_sp and an SP
 * group of that size and rank. sp 1 is wan_dev_acts_new. */
wan_dev_acts *wan_dev_acts_new_sp(const k_dev_ops *dev, const wan_config *cfg, const wan_shape *shape,
                                  wan_acts_mode mode, int sp, int sp_rank);
void wan_dev_acts_free(wan_dev_acts *a);
/* Device bytes held by a. */
size_t wan_dev_acts_bytes(const wan_dev_acts *a);
/* The device bytes wan_dev_acts_new would allocate (the start-up memory estimate), or 0 with core_error on a bad
 * config or shape. */
size_t wan_dev_acts_estimate(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode);
/* The same for one rank of sequence parallelism of degree sp (wan_dev_acts_new_sp); 0 with core_error also when the
 * tokens are not a multiple of sp. */
size_t wan_dev_acts_estimate_sp(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode, int sp);

/* ---------------------------------------------------------------------------------------------------------------
 * Forward and backward (device pointers unless said) */

/* Forward: x [B, C, F, H, W] (device; fp32 or bf16 view), timestep [B] or [B, S] (HOST floats, diffusers' 0..1000
 * units: the sinusoidal features are computed on the host as wan_forward computes them and uploaded), enc
 * [B, L, text_dim] (device view) -> out [B, C_out, F, H, W] (device view; fp32 keeps the GEMM's fp32 result).
 * The shape is a's. Returns 0, or -1 (another config or device than a's, a failed op). */
int wan_dev_forward(const wan_dev_model *d, wan_dev_acts *a, kb_out out, kb_in x, const float *timestep, kb_in enc);
/* wan_dev_forward with the adapter applied (use_lora 1, when d has one) or not (0: the base model, the KL reference
 * under LoRA, as wan_exec.lora_off); the backward follows the forward's choice. LoRA on the device, per adapted
 * linear (wan_lora.h's formula with bf16 operands): h = x A^T (bf16, a GEMM with fp32 accumulation), y += scale h B^T
 * (beta 1 into the base linear's output); backward h again, dB += scale dy^T h, t = dy B (bf16), dA += scale t^T x,
 * dx += scale t A, in wan_lora_bwd's order, the adapter's gradients fp32. */
int wan_dev_forward_lora(const wan_dev_model *d, wan_dev_acts *a, kb_out out, kb_in x, const float *timestep,
                         kb_in enc, int use_lora);

/* Backward of the last wan_dev_forward on a (mode STORE, RECOMPUTE or CHECKPOINT): given dout [B, C_out, F, H, W]
 * (device view), ACCUMULATES (+=) every parameter's gradient into d->grads (allocated; with the adapter applied in
 * that forward: into d->lora_grads, and into d->grads only when allocated), and into dx [B, C, F, H, W] and denc
 * [B, L, text_dim] when their .p is not NULL. The timestep gets no gradient. 0 or -1 (no gradients, wrong
 * mode, no forward, a failed op). */
int wan_dev_backward(wan_dev_model *d, wan_dev_acts *a, kb_out dx, kb_out denc, kb_in dout);
/* The two under sequence parallelism (a from wan_dev_acts_new_sp): ex->sp the SP group (its comm moves device
 * buffers), ex->attn_fwd/attn_bwd a sequence-parallel self-attention on device tensors (sp_usp_forward/backward
 * with an sp_usp on this device's table); wan_dev_forward / wan_dev_backward's contract otherwise, collective over
 * ex->sp as wan_forward / wan_backward are (out, dx, denc full on every rank; parameter gradients this rank's part).
 * ex NULL or sp 1: exactly wan_dev_forward_lora / wan_dev_backward. -1 with core_error also when ex does not fit a
 * (wan_exec_check_sp). */
int wan_dev_forward_sp(const wan_dev_model *d, wan_dev_acts *a, const wan_exec *ex, kb_out out, kb_in x,
                       const float *timestep, kb_in enc, int use_lora);
int wan_dev_backward_sp(wan_dev_model *d, wan_dev_acts *a, const wan_exec *ex, kb_out dx, kb_out denc, kb_in dout);

/* ---------------------------------------------------------------------------------------------------------------
 * Host-memory conveniences and the comparison with the CPU model (model/dit/wan_dev_run.c) */

/* wan_dev_forward (and, when dout is not NULL, wan_dev_backward into d->grads, which it allocates and ZEROES first)
 * with host fp32 tensors: x, timestep, enc and dout are uploaded, out (and dx, denc when not NULL, overwritten) are
 * downloaded. a: activations of the call's shape (mode STORE, RECOMPUTE or CHECKPOINT when dout is given). */
int wan_dev_run_host(wan_dev_model *d, wan_dev_acts *a, float *out, const float *x, const float *timestep,
                     const float *enc, const float *dout, float *dx, float *denc);

/* The device model against the fp32 CPU model on the same inputs (relative L2 = ||dev - cpu||_2 / ||cpu||_2). */
typedef struct {
    double out_rel_l2, out_max_rel;  /* forward output; and max|dev - cpu| / max|cpu| */
    double dx_rel_l2, denc_rel_l2;   /* input gradients */
    double grad_rel_l2;              /* the whole flat parameter gradient */
    double grad_worst_rel_l2;        /* the worst parameter tensor but the key biases */
    char grad_worst[WAN_NAME_MAX];   /* its name */
    double key_bias_rel_l2;          /* the worst key bias (attn1/attn2.to_k.bias: see WAN_DEV_BAND_KEY_BIAS) */
    char key_bias_worst[WAN_NAME_MAX];
    int recompute_same;              /* 1: the device's RECOMPUTE gradients (and out, dx, denc) equal STORE's bits */
    int checkpoint_same;             /* 1: the device's CHECKPOINT gradients (and out, dx, denc) equal STORE's bits */
    int repeat_same;                 /* 1: the device forward run twice gives the same bits */
    int batch_same;                  /* 1: sample 1's forward alone (B 1) equals its rows of the batch's, bit for bit;
                                        0: differs; -1: not measured (B < 2) */
} wan_dev_report;

/* The bf16 bands of the comparison (relative L2 against the fp32 CPU model), shared by tests/test_wan_dev.c and the
 * GPU check. Every weight, activation and GEMM operand is rounded to bf16 (unit roundoff 2^-8 = 3.9e-3); measured on
 * the emulated device at the test configs (two blocks): output 6.0e-3, whole gradient 7.3e-3, every tensor but the
 * key biases <= 1.7e-2, dx 6e-3, d enc 1.1e-2. The key biases are the exception: softmax is invariant to a shift
 * shared by all keys, so the gradient reaching k sums to ~0 over the keys of each query and the bias gradient is a
 * cancelling sum whose relative error is amplified (measured 1.9e-2 .. 7.8e-2; the band still catches a wrong
 * gradient, which is off by ~1). */
#define WAN_DEV_BAND_OUT 2e-2      /* forward output */
#define WAN_DEV_BAND_GRAD 3e-2     /* every parameter tensor but the key biases; dx; d enc */
#define WAN_DEV_BAND_KEY_BIAS 2e-1 /* attn1.to_k.bias, attn2.to_k.bias */
/* 1 if tensor `name` is a key bias (its band is WAN_DEV_BAND_KEY_BIAS). */
int wan_dev_is_key_bias(const char *name);

/* Runs m's fp32 CPU forward+backward (k_cpu_ops, WAN_ACTS_STORE) and the device model's (STORE, RECOMPUTE,
 * CHECKPOINT) on the same inputs: x, enc uniform in [-2, 2), timesteps uniform in [0, 1000) (per token when shape->
 * per_token_timestep), dout uniform in [-1, 1), all from seed; then the device forward once more (repeat) and, when
 * B >= 2, sample 1 alone (batch mates); fills rep. grad_rel (may be NULL): [layout.count], each parameter tensor's
 * relative L2. m needs no gradients of its own (the CPU side uses a copy). 0 or -1. */
int wan_dev_compare(const k_dev_ops *dev, const wan_model *m, const wan_shape *shape, uint64_t seed,
                    wan_dev_report *rep, double *grad_rel);

#endif
