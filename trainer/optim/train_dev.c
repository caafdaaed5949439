/* trainer/optim/train_dev.c — the optimizer step on a device and its host mirrors (see trainer/optim/train_dev.h). */
#include "trainer/optim/train_dev.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "kernels/body/kb_optim.h"
#include "trainer/optim/lora.h"

/* What a step trains on the host (trainer/optim/lora.h: the adapter under LoRA, else the model) and on the device: the
 * trained buffer's bf16 compute copy and its fp32 gradients. */
static trainer_trained_buf host_buf(const wan_model *m) { return trainer_trained_buffer((wan_model *)m); }
static kb_bf16 *dev_w16(const wan_dev_model *d) { return d->lora ? d->lora_w : d->w; }
static float *dev_grads(const wan_dev_model *d) { return d->lora ? d->lora_grads : d->grads; }

float *trainer_dev_grads(trainer_dev *D, int e) {
    wan_dev_model *d = e >= 0 && e < D->n_experts && D->trained[e] ? wan_dev_exec_model(D->x, D->pol[e]) : NULL;
    return d ? dev_grads(d) : NULL;
}

/* Expert e's summed gradient on this rank's range [lo, lo + len) on the device: that range of the device gradients
 * (ZeRO stages 2 and 3 leave the sum there, transformer_2's in an expert window too; stages 0 and 1 sum the whole). */
static float *grad_range(const trainer_dev *D, const wan_dev_model *d, int e) { return dev_grads(d) + D->lo[e]; }

/* An expert window's transformer: its summed gradient range waits in host memory (D->ghost). Uploaded piece by piece
 * into the window's gradient buffer outside transformer_2's range (the larger side), each piece clipped and run
 * through AdamW: both elementwise, so the bits of one pass over the whole range. */
static int window_step0(trainer_dev *D, wan_dev_model *d, double coef, kb_adamw_scalars s) {
    const k_dev_ops *dev = wan_dev_exec_ops(D->x);
    float *buf = dev_grads(d);
    const int64_t n = D->numel[1], lo = D->lo[1], len = D->len[1];
    const int64_t at = lo >= n - lo - len ? 0 : lo + len, cap = lo >= n - lo - len ? lo : n - lo - len;
    if (D->len[0] && cap <= 0)
        return core_error("trainer_dev_opt_step: no room outside transformer_2's range [%lld, %lld) of %lld for "
                          "transformer's gradients", (long long)lo, (long long)(lo + len), (long long)n);
    for (int64_t i = 0; i < D->len[0]; i += cap) {
        const int64_t k = D->len[0] - i < cap ? D->len[0] - i : cap;
        float *g = buf + at;
        if (dev->mem_upload(g, D->ghost + i, (size_t)k * sizeof(float)) ||
            (coef < 1.0 && dev->scale(kb_out_f32(g), (float)coef, k)) ||
            dev->adamw_update(D->master[0] + (D->lo[0] - D->mlo[0]) + i, D->m[0] + i, D->v[0] + i, kb_in_f32(g), NULL,
                              s, NULL, k))
            return core_error_push("trainer (model.device cuda): AdamW of transformer from its host gradients: ");
    }
    return 0;
}

kb_bf16 *trainer_dev_weights16(trainer_dev *D, int e) {
    wan_dev_model *d = e >= 0 && e < D->n_experts && D->trained[e] ? wan_dev_exec_model(D->x, D->pol[e]) : NULL;
    return d ? dev_w16(d) : NULL;
}

void trainer_dev_free(trainer_dev *D) {
    if (D->x) {
        const k_dev_ops *dev = wan_dev_exec_ops(D->x);
        for (int e = 0; e < 2; e++) dev->mem_free(D->master[e]), dev->mem_free(D->m[e]), dev->mem_free(D->v[e]);
    }
    free(D->ghost);
    memset(D, 0, sizeof *D);
}

int trainer_dev_upload(trainer_dev *D, optim_adamw *const *opt) {
    const k_dev_ops *dev = wan_dev_exec_ops(D->x);
    for (int e = 0; e < D->n_experts; e++) {
        if (!D->trained[e]) continue;
        const wan_model *m = D->pol[e];
        const size_t mb = (size_t)D->len[e] * sizeof(float);
        if (opt[e]->n != D->numel[e] || opt[e]->lo != D->lo[e] || opt[e]->len != D->len[e])
            return core_error("trainer (model.device cuda): the AdamW state of %s covers [%lld, %lld) of %lld values, "
                              "the device's [%lld, %lld) of %lld", e ? "transformer_2" : "transformer", (long long)opt[e]->lo,
                              (long long)(opt[e]->lo + opt[e]->len), (long long)opt[e]->n, (long long)D->lo[e],
                              (long long)(D->lo[e] + D->len[e]), (long long)D->numel[e]);
        D->host_stale[e] = 0;
        if ((D->mlen[e] &&
             dev->mem_upload(D->master[e], host_buf(m).params + D->mlo[e], (size_t)D->mlen[e] * sizeof(float))) || (mb && dev->mem_upload(D->m[e], opt[e]->m, mb)) ||
            (mb && dev->mem_upload(D->v[e], opt[e]->v, mb)) || dev->mem_sync())
            return core_error_push("trainer (model.device cuda): uploading the master weights and moments: ");
        /* the bf16 compute copy (LoRA: the base's and the adapter's) and proj_out's fp32 bias, from the same host
         * weights; an expert window: proj_out's bias only, the window left empty (the first expert phase rounds the
         * master shards into it: the bits of this upload, without two whole uploads of which one is overwritten) */
        wan_dev_model *d = wan_dev_exec_model(D->x, m);
        const int pout = m->cfg.out_channels * m->cfg.patch_size[0] * m->cfg.patch_size[1] * m->cfg.patch_size[2];
        if (!d ||
            (D->window ? dev->mem_upload(d->proj_out_b, m->w.proj_out_b, (size_t)pout * sizeof(float))
                       : wan_dev_model_upload(d)) ||
            wan_dev_exec_set_version(D->x, m, opt[e]->step))
            return -1;
    }
    if (D->window && wan_dev_exec_set_resident(D->x, NULL)) return -1;
    D->moments_on_host = 1;
    return 0;
}

int trainer_dev_init(trainer_dev *D, wan_dev_exec *x, wan_model *const *pol, int n_experts, const uint8_t *trained,
                     optim_adamw *const *opt) {
    return trainer_dev_init_sharded(D, x, pol, n_experts, trained, opt, 0);
}

static int init_state(trainer_dev *D, wan_dev_exec *x, wan_model *const *pol, int n_experts, const uint8_t *trained,
                      optim_adamw *const *opt, int shard_master, int window);

int trainer_dev_init_sharded(trainer_dev *D, wan_dev_exec *x, wan_model *const *pol, int n_experts,
                             const uint8_t *trained, optim_adamw *const *opt, int shard_master) {
    return init_state(D, x, pol, n_experts, trained, opt, shard_master, 0);
}

int trainer_dev_init_window(trainer_dev *D, wan_dev_exec *x, wan_model *const *pol, const uint8_t *trained,
                            optim_adamw *const *opt) {
    if (trained && (!trained[0] || !trained[1]))
        return core_error("trainer (model.device cuda): an expert window needs both experts trained");
    return init_state(D, x, pol, 2, trained, opt, 1, 1);
}

int trainer_dev_expert_window(const core_recipe *r, int n_experts) {
    return n_experts == 2 && core_recipe_trains_expert(r, 0) && core_recipe_trains_expert(r, 1) &&
           r->zero_stage == 3 && r->trainer_ranks > 1 && r->choice.mode != CORE_MODE_LOCAL && r->lora_rank == 0 &&
           (r->choice.loss == CORE_LOSS_GRPO || r->choice.loss == CORE_LOSS_GRPO_GUARD) && r->choice.device == CORE_CUDA;
}

static int init_state(trainer_dev *D, wan_dev_exec *x, wan_model *const *pol, int n_experts, const uint8_t *trained,
                      optim_adamw *const *opt, int shard_master, int window) {
    memset(D, 0, sizeof *D);
    D->x = x;
    D->n_experts = n_experts;
    D->master_sharded = shard_master != 0;
    const k_dev_ops *dev = wan_dev_exec_ops(x);
    for (int e = 0; e < n_experts; e++) {
        D->pol[e] = pol[e];
        D->trained[e] = !trained || trained[e];
        if (!D->trained[e]) continue;
        D->numel[e] = host_buf(pol[e]).n; /* the adapter's under LoRA (a frozen base) */
        D->lo[e] = opt[e]->lo, D->len[e] = opt[e]->len; /* a ZeRO shard's moments, or the whole */
        if (shard_master && pol[e]->lora) {
            trainer_dev_free(D);
            return core_error("trainer (model.device cuda): %s trains a LoRA adapter; a sharded master (ZeRO stage 3) "
                              "is full fine-tuning's", e ? "transformer_2" : "transformer");
        }
        D->mlo[e] = shard_master ? D->lo[e] : 0, D->mlen[e] = shard_master ? D->len[e] : D->numel[e];
        const size_t bytes = (size_t)(D->mlen[e] > 0 ? D->mlen[e] : 1) * sizeof(float),
                     mb = (size_t)(D->len[e] > 0 ? D->len[e] : 1) * 4;
        if (!(D->master[e] = dev->mem_alloc(bytes)) || !(D->m[e] = dev->mem_alloc(mb)) ||
            !(D->v[e] = dev->mem_alloc(mb))) {
            core_error_push("trainer (model.device cuda): %.1f MiB of fp32 master weights and AdamW moments for %s: ",
                            (double)(bytes + 2 * mb) / 1048576.0, e ? "transformer_2" : "transformer");
            trainer_dev_free(D);
            return -1;
        }
    }
    if (window) { /* one bf16 copy and one gradient buffer for both experts; transformer's reduced shard on the host */
        D->window = 1;
        if (!(D->ghost = malloc((size_t)(D->len[0] > 0 ? D->len[0] : 1) * sizeof(float)))) {
            core_error("trainer (model.device cuda): out of host memory for transformer's gradient shard (%.1f MiB)",
                       D->len[0] * 4.0 / 1048576.0);
            trainer_dev_free(D);
            return -1;
        }
        if (wan_dev_exec_window(x, pol[0], pol[1])) {
            core_error_push("trainer (model.device cuda): the expert window: ");
            trainer_dev_free(D);
            return -1;
        }
    }
    if (trainer_dev_upload(D, opt)) {
        trainer_dev_free(D);
        return -1;
    }
    return 0;
}

int trainer_dev_sync_moments(trainer_dev *D, optim_adamw *const *opt) {
    if (D->moments_on_host) return 0;
    const k_dev_ops *dev = wan_dev_exec_ops(D->x);
    for (int e = 0; e < D->n_experts; e++) {
        if (!D->trained[e]) continue;
        const size_t bytes = (size_t)D->len[e] * sizeof(float);
        if (bytes && (dev->mem_download(opt[e]->m, D->m[e], bytes) || dev->mem_download(opt[e]->v, D->v[e], bytes)))
            return core_error_push("trainer (model.device cuda): downloading the AdamW moments: ");
    }
    if (dev->mem_sync()) return -1;
    D->moments_on_host = 1;
    return 0;
}

/* Expert e's master into its host params (4 bytes per trained parameter); a sharded master's range, then the other
 * ranks' ranges over the host group (the host_gather hook: collective). */
static int download_master(trainer_dev *D, int e) {
    const k_dev_ops *dev = wan_dev_exec_ops(D->x);
    float *params = host_buf(D->pol[e]).params;
    if ((D->mlen[e] && dev->mem_download(params + D->mlo[e], D->master[e], (size_t)D->mlen[e] * sizeof(float))) ||
        dev->mem_sync())
        return core_error_push("trainer (model.device cuda): the master weights' host copy: ");
    if (D->master_sharded &&
        (!D->shards.host_gather ? core_error("trainer (model.device cuda): %s's master is a shard and nothing gathers "
                                             "it", e ? "transformer_2" : "transformer")
                                : D->shards.host_gather(D->shards.ctx, D, e, params)))
        return -1;
    D->host_stale[e] = 0;
    return 0;
}

int trainer_dev_sync_host(trainer_dev *D, optim_adamw *const *opt) {
    for (int e = 0; e < D->n_experts; e++)
        if (D->trained[e] && D->host_stale[e] && download_master(D, e)) return -1;
    return trainer_dev_sync_moments(D, opt);
}

int trainer_dev_opt_step(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained,
                         optim_adamw *const *opt, const optim_config *ocfg, optim_step_info *info) {
    trainer_dev *D = ctx;
    const k_dev_ops *dev = wan_dev_exec_ops(D->x);
    if (optim_config_validate(ocfg)) return -1;
    if (n_experts != D->n_experts)
        return core_error("trainer_dev_opt_step: %d experts, the device state has %d", n_experts, D->n_experts);
    wan_dev_model *d[2] = {NULL, NULL};
    int first = -1;
    double ss = 0.0; /* optim_grad_norm_multi: each trained expert's optim_sumsq, added in expert order */
    for (int e = 0; e < n_experts; e++) {
        if (trained && !trained[e]) continue;
        if (policy[e] != D->pol[e] || !D->trained[e])
            return core_error("trainer_dev_opt_step: expert %d is not the one whose state is on the device", e);
        if (!(d[e] = wan_dev_exec_model(D->x, policy[e])) || !dev_grads(d[e]))
            return core_error("trainer_dev_opt_step: expert %d has no device gradients", e);
        if (D->window && !(D->gshard_ready >> e & 1u))
            return core_error("trainer_dev_opt_step: %s's gradient shard was not kept (the expert phases did not run: "
                              "trainer_config.expert_phase)", e ? "transformer_2" : "transformer");
        double s; /* ZeRO stage 2: the whole gradient's from every rank's shard (the hook) */
        if (D->window && e == 0)
            s = D->gss0; /* formed at its phase end, from the same chunk sums */
        else if (D->shards.sumsq ? D->shards.sumsq(D->shards.ctx, D, e, grad_range(D, d[e], e), &s)
                                 : dev->sumsq(kb_in_f32(dev_grads(d[e])), D->numel[e], &s))
            return -1;
        ss += s;
        if (first < 0) first = e;
    }
    if (first < 0) return core_error("algorithm.train_experts: no expert is trained");
    const double norm = sqrt(ss);
    if (!isfinite(norm))
        return core_error("optim: gradient norm is %s at optimizer step %lld; parameters not updated",
                          isnan(norm) ? "nan" : "inf", (long long)opt[first]->step);
    const double coef = optim_clip_coef(norm, ocfg->max_grad_norm);
    for (int e = 0; e < n_experts; e++) { /* optim_adamw_step_coef, on the device */
        if (!d[e]) continue;
        const int64_t n = D->numel[e], lo = D->lo[e], len = D->len[e]; /* [lo, lo + len): all of it on one rank */
        float *g = grad_range(D, d[e], e);
        if (coef < 1.0 && len && !(D->window && e == 0) && dev->scale(kb_out_f32(g), (float)coef, len)) return -1;
        const double lr = optim_lr_at(ocfg, opt[e]->step);
        const kb_adamw_scalars s =
            kb_adamw_prepare(lr, ocfg->beta1, ocfg->beta2, ocfg->eps, ocfg->weight_decay, opt[e]->step + 1);
        if (D->mlo[e] > lo || D->mlo[e] + D->mlen[e] < lo + len || (D->lazy_host && D->master_sharded))
            return core_error("trainer_dev_opt_step: %s's device master covers [%lld, %lld)%s, the step [%lld, %lld)",
                              e ? "transformer_2" : "transformer", (long long)D->mlo[e],
                              (long long)(D->mlo[e] + D->mlen[e]), D->lazy_host ? " with a lazy host copy" : "",
                              (long long)lo, (long long)(lo + len));
        /* (an expert window: no bf16 copy written; the next expert phase rounds the master into it) */
        if (D->window && e == 0) {
            if (window_step0(D, d[e], coef, s)) return -1;
        } else if (len && dev->adamw_update(D->master[e] + (lo - D->mlo[e]), D->m[e], D->v[e], kb_in_f32(g), NULL, s,
                                            D->window ? NULL : dev_w16(d[e]) + lo, len)) {
            return core_error_push("trainer (model.device cuda): AdamW: ");
        }
        D->moments_on_host = 0;
        D->gshard_ready &= ~(1u << e);
        if (!D->window && D->shards.gather && D->shards.gather(D->shards.ctx, D, e)) return -1; /* the others' ranges */
        /* the host mirror of the master (now, or marked stale for trainer_dev_sync_host), and (not under LoRA)
         * proj_out.bias's fp32 device copy from the master's slice, through its place in the host params */
        wan_model *m = policy[e];
        D->host_stale[e] = 1;
        if (!D->lazy_host && download_master(D, e)) return -1;
        if (D->lazy_host) { /* the caller checks the host copy for non-finite weights (trainer/run/loop.c check_updated):
                             * one sum of squares on the device says whether the master may hold one, and only then
                             * is it brought to the host, where the check names the tensor and element */
            double w2;
            if (dev->sumsq(kb_in_f32(D->master[e]), n, &w2)) return -1;
            if (!isfinite(w2) && download_master(D, e)) return -1;
        }
        const int pout = m->cfg.out_channels * m->cfg.patch_size[0] * m->cfg.patch_size[1] * m->cfg.patch_size[2];
        const size_t pb = (size_t)pout * sizeof(float);
        if (!d[e]->lora && D->host_stale[e] &&
            (dev->mem_download(m->w.proj_out_b, D->master[e] + (m->w.proj_out_b - m->params), pb) || dev->mem_sync()))
            return core_error_push("trainer (model.device cuda): proj_out.bias from the master: ");
        if (!d[e]->lora && dev->mem_upload(d[e]->proj_out_b, m->w.proj_out_b, pb))
            return core_error_push("trainer (model.device cuda): proj_out.bias's device copy: ");
        opt[e]->step++;
        if (wan_dev_exec_set_version(D->x, m, opt[e]->step) || (D->window && wan_dev_exec_set_resident(D->x, NULL)))
            return -1;
        if (info) info->grad_norm = norm, info->clip_coef = coef, info->lr = lr;
    }
    return 0;
}
