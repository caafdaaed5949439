/* trainer/optim/lora.h — the trainer's glue to LoRA adapters (the adapter itself, its forward/backward, init and
 * files are model/dit/wan_lora.h): the recipe's model.lora as a wan_lora_config, the buffers an optimizer step
 * updates for an expert (its adapter's when it trains one), and the hash of the adapters a set of experts carries.
 *
 * How the trainer uses them (trainer/run/run_setup.c, train_step.c, dp.c, controller.c): with model.lora.rank >= 1 every
 * TRAINED expert gets its own adapter (wan_lora_init with expert = its index: transformer 0, transformer_2 1), attached
 * to the loaded base, whose gradients are never allocated (the frozen-base contract of wan_lora.h); a frozen expert
 * (algorithm.train_experts) has none. The KL reference is the same model with wan_exec.lora_off = 1. AdamW, clipping
 * and the dp/SP all-reduce run over the adapters' flat buffers exactly as over a model's. */
#ifndef TRAINER_LORA_H
#define TRAINER_LORA_H

#include <stdint.h>

#include "core/recipe.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"

/* The recipe's model.lora: 0 with *c zeroed when LoRA is off (rank 0); 1 with *c filled (rank, alpha, init_seed, the
 * targets parsed with peft's rule: "model.lora.targets: unknown target ..." listing the valid names) and, when model
 * is not NULL, checked against that transformer config ("model.lora.rank: rank 200 is larger than attn1.to_q's smaller
 * dimension (in 128, out 128)"); -1 with the error. */
int trainer_lora_config(const core_recipe *r, const wan_config *model, wan_lora_config *c);

/* What an optimizer step of expert m updates: the attached adapter's params/grads [n] when m trains one (an adapter
 * attached and no base gradients: wan_lora.h's frozen base), else the model's own. grads may be NULL (none allocated). */
typedef struct {
    float *params, *grads;
    int64_t n;
    const wan_layout *layout; /* names and shapes of the buffer's tensors */
} trainer_trained_buf;

static inline trainer_trained_buf trainer_trained_buffer(wan_model *m) {
    if (m->lora && !m->grads)
        return (trainer_trained_buf){m->lora->params, m->lora->grads, m->lora->layout.numel, &m->lora->layout};
    return (trainer_trained_buf){m->params, m->grads, m->layout.numel, &m->layout};
}

#endif
