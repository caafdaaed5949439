/* model/dit/wan_dev.c — the Wan transformer's weights and gradients on a device (wan_dev.h): the bf16 copy of the
 * host's fp32 master at the table's offsets, the fp32 copy of proj_out.bias, the fp32 gradients; and the device
 * entries of the one forward and backward (wan_forward.c, wan_backward.c) with the device model as the table sees
 * it. The device's constraints on a config (wan_dev_config_check) are in wan_config.c. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_dev.h"
#include "model/dit/wan_internal.h"
#include "model/dit/wan_lora.h"

static void lora_free(wan_dev_model *d) {
    d->dev->mem_free(d->lora_w);
    d->dev->mem_free(d->lora_grads);
    d->lora = NULL, d->lora_w = NULL, d->lora_grads = NULL;
}

void wan_dev_model_free(wan_dev_model *d) {
    if (!d) return;
    if (d->dev) {
        if (!d->base_borrowed && !d->window) d->dev->mem_free(d->w);
        if (!d->base_borrowed) d->dev->mem_free(d->proj_out_b);
        if (!d->window) d->dev->mem_free(d->grads);
        lora_free(d);
    }
    memset(d, 0, sizeof *d);
}

int wan_dev_model_upload_lora(wan_dev_model *d) {
    const wan_lora *l = d->host->lora;
    if (d->lora != l) lora_free(d); /* another adapter (or none) since the last upload */
    if (!l) return 0;
    if (l->cfg.rank % 8)
        return core_error("model.lora.rank: %d is not a multiple of 8 (cuBLASLt's leading dimensions on the device)",
                          l->cfg.rank);
    const size_t n = (size_t)l->layout.numel;
    if (!d->lora_w && !(d->lora_w = d->dev->mem_alloc(n * sizeof(kb_bf16))))
        return core_error_push("wan_dev: %.1f MiB of bf16 LoRA weights: ", n * 2.0 / 1048576.0);
    d->lora = l;
    if (d->dev->mem_upload_bf16(d->lora_w, l->params, n)) return core_error_push("wan_dev: uploading the adapter: ");
    return 0;
}

int wan_dev_model_upload(wan_dev_model *d) {
    if (d->base_borrowed) return wan_dev_model_upload_lora(d); /* the base is the lender's, frozen */
    const wan_model *m = d->host;
    const int pout = m->cfg.out_channels * m->cfg.patch_size[0] * m->cfg.patch_size[1] * m->cfg.patch_size[2];
    if (d->dev->mem_upload_bf16(d->w, m->params, (size_t)m->layout.numel) ||
        d->dev->mem_upload(d->proj_out_b, m->w.proj_out_b, (size_t)pout * sizeof(float)))
        return core_error_push("wan_dev: uploading the weights: ");
    return wan_dev_model_upload_lora(d);
}

int wan_dev_model_from_device(wan_dev_model *d, const float *src, int adapter) {
    const k_dev_ops *dev = d->dev;
    if (!dev->mem_round_bf16) return core_error("wan_dev: the %s table has no mem_round_bf16", dev->name);
    if (adapter) {
        if (!d->lora || !d->lora_w || d->lora != d->host->lora)
            return core_error("wan_dev: a device-to-device adapter update, but the device copy holds no adapter");
        if (dev->mem_round_bf16(d->lora_w, src, d->lora->layout.numel))
            return core_error_push("wan_dev: the adapter from device memory: ");
        return 0;
    }
    const wan_model *m = d->host;
    const int pout = m->cfg.out_channels * m->cfg.patch_size[0] * m->cfg.patch_size[1] * m->cfg.patch_size[2];
    const size_t at = (size_t)(m->w.proj_out_b - m->params), bytes = (size_t)pout * sizeof(float);
    if (dev->mem_round_bf16(d->w, src, m->layout.numel) ||
        dev->mem_copy2d(d->proj_out_b, bytes, src + at, bytes, bytes, 1))
        return core_error_push("wan_dev: the weights from device memory: ");
    return 0;
}

int wan_dev_model_init(wan_dev_model *d, const k_dev_ops *dev, const wan_model *host) {
    memset(d, 0, sizeof *d);
    if (!dev || !host || !host->params) return core_error("wan_dev_model_init: no device table or no host model");
    if (wan_dev_config_check(&host->cfg, "wan_dev: transformer config")) return -1;
    for (int i = 0; i < host->layout.count; i++) /* 16-byte aligned bf16 tensors (GEMM operands) */
        if (host->layout.tensors[i].offset % 8)
            return core_error("wan_dev: tensor %s starts at element %lld, not a multiple of 8",
                              host->layout.tensors[i].name, (long long)host->layout.tensors[i].offset);
    d->dev = dev, d->host = host;
    const wan_config *c = &host->cfg;
    const int pout = c->out_channels * c->patch_size[0] * c->patch_size[1] * c->patch_size[2];
    d->w = dev->mem_alloc((size_t)host->layout.numel * sizeof(kb_bf16));
    d->proj_out_b = dev->mem_alloc((size_t)pout * sizeof(float));
    if (!d->w || !d->proj_out_b) {
        core_error_push("wan_dev: %.1f MiB of bf16 weights: ", host->layout.numel * 2.0 / 1048576.0);
        wan_dev_model_free(d);
        return -1;
    }
    if (wan_dev_model_upload(d)) {
        wan_dev_model_free(d);
        return -1;
    }
    return 0;
}

int wan_dev_model_init_view(wan_dev_model *d, const wan_dev_model *base, const wan_model *host) {
    memset(d, 0, sizeof *d);
    if (!base || !base->w || base->base_borrowed || !host || !host->lora || host->params != base->host->params ||
        !wan_config_equal(&host->cfg, &base->host->cfg))
        return core_error("wan_dev_model_init_view: host must carry an adapter on base's own fp32 weights");
    d->dev = base->dev, d->host = host, d->w = base->w, d->proj_out_b = base->proj_out_b, d->base_borrowed = 1;
    if (wan_dev_model_upload_lora(d)) {
        wan_dev_model_free(d);
        return -1;
    }
    return 0;
}

int wan_dev_alloc_grads(wan_dev_model *d) {
    float **g = d->lora ? &d->lora_grads : &d->grads; /* LoRA: the adapter's only (a frozen base) */
    if (*g) return 0;
    const size_t bytes = (size_t)(d->lora ? d->lora->layout.numel : d->host->layout.numel) * sizeof(float);
    if (!(*g = d->dev->mem_alloc(bytes)))
        return core_error_push("wan_dev: %.1f MiB of fp32 gradients: ", bytes / 1048576.0);
    return wan_dev_zero_grads(d);
}

int wan_dev_zero_grads(wan_dev_model *d) {
    if (d->lora_grads && d->dev->mem_zero(d->lora_grads, (size_t)d->lora->layout.numel * sizeof(float))) return -1;
    return d->grads ? d->dev->mem_zero(d->grads, (size_t)d->host->layout.numel * sizeof(float)) : 0;
}

int wan_dev_grads_download(const wan_dev_model *d, float *host) {
    const float *g = d->lora ? d->lora_grads : d->grads;
    const int64_t n = d->lora ? d->lora->layout.numel : d->host->layout.numel;
    if (!g) return core_error("wan_dev_grads_download: gradients are not allocated (wan_dev_alloc_grads)");
    if (d->dev->mem_download(host, g, (size_t)n * sizeof(float)) || d->dev->mem_sync())
        return core_error_push("wan_dev: downloading the gradients: ");
    return 0;
}

/* ---- forward and backward on the device ---- */

/* A->mv = d as the table sees it, with its adapter when with_lora. */
static void mview_dev(wan_acts *A, const wan_dev_model *d, int with_lora) {
    wan_mview *mv = &A->mv;
    memset(mv, 0, sizeof *mv);
    mv->dev = d->dev;
    mv->host = d->host;
    mv->w = d->w, mv->wt = KB_BF16;
    mv->g = d->grads;
    mv->proj_out_b = d->proj_out_b;
    if (with_lora && d->lora) mv->lora = d->lora, mv->lw = d->lora_w, mv->lg = d->lora_grads;
}

/* 0 when d and A belong together (config, device), else -1 naming who. */
static int check_pair(const wan_dev_model *d, const wan_dev_acts *A, const char *who) {
    if (!wan_config_equal(&A->cfg, &d->host->cfg))
        return core_error("%s: activations were made for another config", who);
    if (A->dev != d->dev)
        return core_error("%s: activations live on device %s, the model on %s", who, A->dev->name, d->dev->name);
    return 0;
}

int wan_dev_forward(const wan_dev_model *d, wan_dev_acts *A, kb_out out, kb_in x, const float *timestep, kb_in enc) {
    return wan_dev_forward_lora(d, A, out, x, timestep, enc, 1);
}

int wan_dev_forward_lora(const wan_dev_model *d, wan_dev_acts *A, kb_out out, kb_in x, const float *timestep,
                         kb_in enc, int use_lora) {
    return wan_dev_forward_sp(d, A, NULL, out, x, timestep, enc, use_lora);
}

int wan_dev_forward_sp(const wan_dev_model *d, wan_dev_acts *A, const wan_exec *ex, kb_out out, kb_in x,
                       const float *timestep, kb_in enc, int use_lora) {
    if (check_pair(d, A, "wan_dev_forward") || wan_exec_check_sp(ex, A, "wan_dev_forward")) return -1;
    mview_dev(A, d, use_lora); /* the backward follows the forward's adapter choice */
    /* the table's attention on the whole sequence, or the SP hook on this rank's slice */
    if (wan_model_forward(A->sp > 1 ? ex : NULL, A, out, x, timestep, enc)) return core_error_push("wan_dev_forward: ");
    return 0;
}

int wan_dev_backward(wan_dev_model *d, wan_dev_acts *A, kb_out dx, kb_out denc, kb_in dout) {
    return wan_dev_backward_sp(d, A, NULL, dx, denc, dout);
}

int wan_dev_backward_sp(wan_dev_model *d, wan_dev_acts *A, const wan_exec *ex, kb_out dx, kb_out denc, kb_in dout) {
    if (!d->grads && !(A->mv.lora && d->lora_grads)) /* LoRA: the adapter's, the base frozen */
        return core_error("wan_dev_backward: gradients are not allocated (wan_dev_alloc_grads)");
    if (A->mode == WAN_ACTS_INFER) return core_error("wan_dev_backward: activations were allocated for inference only");
    if (!A->have_forward) return core_error("wan_dev_backward: no forward has run on these activations");
    if (check_pair(d, A, "wan_dev_backward")) return -1;
    if (wan_exec_check_sp(ex, A, "wan_dev_backward")) return -1;
    mview_dev(A, d, A->mv.lora != NULL); /* the gradients as they are now */
    if (ex) A->mv.grad_ready = ex->grad_ready, A->mv.grad_ready_ctx = ex->grad_ready_ctx;
    if (wan_model_backward(A->sp > 1 ? ex : NULL, A, dx, denc, dout))
        return core_error_push("wan_dev_backward: ");
    return 0;
}
