/* trainer/run/old_policy.c — the old policy of a forward-process objective (algorithm.loss nft, trainer/step/nft.h):
 * a copy of the trained weights at the start of the run, soft-updated after each step's optimizer updates,
 * old = d old + (1 - d) policy (NVlabs/DiffusionNFT scripts/train_nft_sd3.py l.1035-1039), and read by the training
 * pass only (its velocity at the noised final latents). It lives where the EMA lives (trainer/run/ema.c): on every
 * trainer rank, in host memory. With LoRA (trainer/optim/lora.h) the trained weights are the adapters, so the old
 * policy is an adapter copy, as the reference keeps a second adapter "old": old_view[e] is the policy model with the
 * old adapter attached instead (a shallow copy sharing the frozen base). Checkpoints keep it under old/. On a device
 * (model.device cuda) the host copy is the one updated, from the master's host copy (made every step:
 * trainer/optim/train_dev.h lazy_host 0), and its bf16 device copy is uploaded again after each update
 * (wan_dev_exec_sync at the policy version: the adapter alone under LoRA) for the training pass's forward, as the KL
 * reference's is once. Under LoRA the device executor holds old_view as a view of the policy's device copy: the
 * frozen bf16 base once, the old adapter's bf16 copy of its own (model/dit/wan_dev.h wan_dev_model_init_view; so
 * trainer/budget counts). Two experts: a copy per trained expert, none
 * for a frozen one (its steps are not trained). Every rank applies the same update to the same weights (the
 * optimizer step is identical on every rank), so the copies stay equal without communication. */
#include <string.h>

#include "trainer/run/run_internal.h"
#include "trainer/step/nft.h"

int trainer_old_init(trainer_state *S) {
    if (S->r->choice.loss != CORE_LOSS_NFT) return 0; /* dpo compares with the reference, not an old policy */
    for (int e = 0; e < S->n_experts; e++) {
        if (S->lora_on) {
            S->old_view[e] = S->pol[e];
            S->old_view[e].lora = NULL;
            if (!S->trained[e]) continue;
            if (wan_lora_init(&S->old_lora[e], &S->pol[e].cfg, &S->lc, e)) return -1;
            memcpy(S->old_lora[e].params, S->lora[e].params, sizeof(float) * (size_t)S->lora[e].layout.numel);
            S->old_view[e].lora = &S->old_lora[e];
            continue;
        }
        if (!S->trained[e]) continue; /* a frozen expert's steps are not trained: no old policy */
        if (wan_model_init(&S->old[e], &S->pol[e].cfg)) return -1;
        memcpy(S->old[e].params, S->pol[e].params, sizeof(float) * (size_t)S->pol[e].layout.numel);
    }
    S->old_on = 1;
    return trainer_old_sync_device(S);
}

int trainer_old_sync_device(trainer_state *S) {
    if (!S->old_on || !S->dx) return 0;
    for (int e = 0; e < S->n_experts; e++)
        if (S->trained[e] && wan_dev_exec_sync(S->dx, trainer_old_model(S, e), TRAINER_VERSION(S))) return -1;
    return 0;
}

int trainer_old_update(trainer_state *S, double *decay) {
    *decay = 0;
    if (!S->old_on) return 0;
    const core_recipe *r = S->r;
    const double d = nft_old_decay(TRAINER_VERSION(S), r->old_decay_flat, r->old_decay_rate, r->old_decay_max);
    for (int e = 0; e < S->n_experts; e++) {
        if (!S->trained[e]) continue;
        if (S->lora_on)
            nft_soft_update(S->old_lora[e].params, S->lora[e].params, S->lora[e].layout.numel, (float)d);
        else
            nft_soft_update(S->old[e].params, S->pol[e].params, S->pol[e].layout.numel, (float)d);
    }
    *decay = d;
    return trainer_old_sync_device(S);
}

const wan_model *trainer_old_model(const trainer_state *S, int e) {
    if (!S->old_on) return NULL;
    return S->lora_on ? &S->old_view[e] : &S->old[e];
}

void trainer_old_free(trainer_state *S) {
    for (int e = 0; e < 2; e++) {
        if (S->dx) wan_dev_exec_forget(S->dx, &S->old[e]), wan_dev_exec_forget(S->dx, &S->old_view[e]);
        wan_model_free(&S->old[e]);
        wan_lora_free(&S->old_lora[e]);
    }
    S->old_on = 0;
}
