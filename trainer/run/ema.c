/* trainer/run/ema.c — algorithm.ema_decay: an exponential moving average of the trained experts' weights, updated after
 * every optimizer step and used by in-run eval and sample videos (never by training or the rollouts it trains on).
 * The EMA is pushed to the rollout source as the policy version + CORE_EVAL_VERSION_OFFSET for an eval and the
 * policy pushed back after it; in process that is a pointer swap, remote it is a weight sync.
 * With LoRA (trainer/optim/lora.h) the trained weights are the adapters: the EMA averages the adapters (as Flow-GRPO's
 * EMAModuleWrapper averages its LoRA parameters), and the eval weights are the frozen base with the EMA adapter
 * attached (ema_view: a shallow copy of the policy model; a remote eval push then sends the EMA adapters only). */
#include <string.h>

#include "trainer/run/run_internal.h"

int trainer_ema_init(trainer_state *S) {
    if (!(S->r->ema_decay > 0)) return 0;
    for (int e = 0; e < S->n_experts; e++) { /* the moving average starts at the initial weights */
        if (S->lora_on) {
            S->ema_view[e] = S->pol[e];
            S->ema_view[e].lora = NULL;
            if (!S->trained[e]) continue;
            if (wan_lora_init(&S->ema_lora[e], &S->pol[e].cfg, &S->lc, e)) return -1;
            memcpy(S->ema_lora[e].params, S->lora[e].params, sizeof(float) * (size_t)S->lora[e].layout.numel);
            S->ema_view[e].lora = &S->ema_lora[e];
            continue;
        }
        if (wan_model_init(&S->ema[e], &S->pol[e].cfg)) return -1;
        memcpy(S->ema[e].params, S->pol[e].params, sizeof(float) * (size_t)S->pol[e].layout.numel);
    }
    S->ema_on = 1;
    return 0;
}

void trainer_ema_update(trainer_state *S) {
    const float d = (float)S->r->ema_decay, w = 1.0f - d;
    for (int e = 0; e < S->n_experts; e++) {
        if (!S->trained[e]) continue;
        float *a = S->lora_on ? S->ema_lora[e].params : S->ema[e].params;
        const float *p = S->lora_on ? S->lora[e].params : S->pol[e].params;
        const int64_t n = S->lora_on ? S->lora[e].layout.numel : S->pol[e].layout.numel;
        for (int64_t k = 0; k < n; k++) a[k] = d * a[k] + w * p[k];
    }
}

int trainer_eval_weights_begin(trainer_state *S, int64_t *version) {
    *version = TRAINER_VERSION(S);
    if (!S->ema_on) return 0;
    *version += CORE_EVAL_VERSION_OFFSET;
    const wan_model *mm[2] = {S->lora_on ? &S->ema_view[0] : &S->ema[0], S->lora_on ? &S->ema_view[1] : &S->ema[1]};
    int match;
    int64_t bytes;
    return S->src->push_weights(S->src->ctx, mm, S->n_experts, S->trained, *version, &match, &bytes);
}

int trainer_eval_weights_end(trainer_state *S) {
    if (!S->ema_on) return 0;
    const wan_model *mm[2] = {&S->pol[0], &S->pol[1]};
    int match;
    int64_t bytes;
    return S->src->push_weights(S->src->ctx, mm, S->n_experts, S->trained, TRAINER_VERSION(S), &match, &bytes);
}
