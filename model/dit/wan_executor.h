/* model/dit/wan_executor.h — the DiT where its wan_exec says it runs, behind one set of calls: the fp32 CPU model
 * (wan_forward / wan_backward of wan_dit.h, sequence-parallel under ex->sp) or, with ex->dev, the device executor
 * (wan_dev_exec.h: bf16 on the device, host fp32 tensors in and out). What the rollout engine and the training step
 * call, so that they do not branch on the device: the executor decides. */
#ifndef MODEL_WAN_EXECUTOR_H
#define MODEL_WAN_EXECUTOR_H

#include "model/dit/wan_dit.h"

/* Activations on ex's backend for one (config, shape, mode). */
typedef struct wan_exec_acts wan_exec_acts;

/* With ex->dev: the device executor's (wan_dev_exec_acts; the SP group is not used there, and mode may be
 * WAN_ACTS_CHECKPOINT); otherwise wan_acts_new_sp for ex->sp's size and rank (ex or ex->sp NULL: the whole
 * sequence). NULL with core_error as wan_acts_new_sp / wan_dev_acts_new (bad shape, out of memory). */
wan_exec_acts *wan_exec_acts_new(const wan_exec *ex, const wan_config *cfg, const wan_shape *shape,
                                 wan_acts_mode mode);
void wan_exec_acts_free(wan_exec_acts *a);

/* wan_forward's contract (x [B, C, F, H, W], timestep [B] or [B, S], enc [B, L, text_dim] host fp32 -> out
 * [B, C_out, F, H, W] host fp32) on ex's backend, with a from wan_exec_acts_new for the same ex. On the device the
 * adapter is applied unless ex->lora_off (wan_dev_exec_forward_lora). 0, or -1 (also when a belongs to the other
 * backend). */
int wan_exec_forward(const wan_model *m, wan_exec_acts *a, const wan_exec *ex, float *out, const float *x,
                     const float *timestep, const float *enc);
/* wan_backward's contract without dx / d enc: the parameter gradients ACCUMULATE into m->grads (or its adapter's)
 * on the CPU, into m's device gradients on the device (wan_dev_exec_backward). 0 or -1. */
int wan_exec_backward(wan_model *m, wan_exec_acts *a, const wan_exec *ex, const float *dout);
/* Zeroes the gradients wan_exec_backward accumulates into: on the device m's device gradients (allocated on first
 * use: wan_dev_exec_zero_grads); on the CPU the attached adapter's when m trains one (a LoRA adapter and no base
 * gradients: wan_lora.h's frozen base), else m's own (allocated: wan_model_alloc_grads). 0 or -1. */
int wan_exec_zero_grads(const wan_exec *ex, wan_model *m);

#endif
