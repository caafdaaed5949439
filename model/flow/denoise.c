/* model/flow/denoise.c — one denoising step through the DiT: rows, forward, guidance (see denoise.h). */
#include "model/flow/denoise.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/flow/first_frame.h"
#include "model/flow/guidance.h"
#include "model/vae/wan_vae_i2v.h"

int flow_denoise_init(flow_denoise *d, const wan_config *cfg, const int64_t shape[4], int text_len, int per_token,
                      int cap, int grads) {
    memset(d, 0, sizeof *d);
    if (cap < 1) return core_error("flow_denoise: %d samples per step (must be >= 1)", cap);
    for (int k = 0; k < 4; k++)
        if (shape[k] < 1) return core_error("flow_denoise: latent shape dim %d is %lld (must be >= 1)", k,
                                            (long long)shape[k]);
    if (text_len < 1) return core_error("flow_denoise: text_len %d (must be >= 1)", text_len);
    if (shape[0] != cfg->out_channels || wan_cond_kind(cfg) == WAN_COND_UNKNOWN)
        return core_error("flow_denoise: a latent of %lld channels for a transformer of %d in / %d out (in must be "
                          "out, or 2 out + 4 for I2V-A14B)", (long long)shape[0], cfg->in_channels,
                          cfg->out_channels);
    if (per_token && cfg->patch_size[0] != 1)
        return core_error("flow_denoise: per-token timesteps need a patch one frame deep, the model's is %d",
                          cfg->patch_size[0]);
    d->cfg = *cfg;
    memcpy(d->shape, shape, sizeof d->shape);
    d->text_len = text_len, d->per_token = per_token, d->cap = cap;
    const int64_t vox = shape[1] * shape[2] * shape[3];
    d->nl = shape[0] * vox, d->nin = (int64_t)cfg->in_channels * vox, d->ne = (int64_t)text_len * cfg->text_dim;
    d->tpf = (shape[2] / cfg->patch_size[1]) * (shape[3] / cfg->patch_size[2]);
    d->nts = per_token ? shape[1] * d->tpf : 1;
    const size_t rows = 2 * (size_t)cap, f = sizeof(float);
    d->in = calloc((size_t)cap, sizeof *d->in), d->urow = malloc(sizeof(int) * (size_t)cap);
    d->x = malloc(f * rows * (size_t)d->nin), d->ts = malloc(f * rows * (size_t)d->nts);
    d->enc = malloc(f * rows * (size_t)d->ne), d->out = malloc(f * rows * (size_t)d->nl);
    if (grads) d->dout = malloc(f * rows * (size_t)d->nl);
    if (!d->in || !d->urow || !d->x || !d->ts || !d->enc || !d->out || (grads && !d->dout)) {
        flow_denoise_free(d);
        return core_error("flow_denoise: out of memory for a step of %d samples", cap);
    }
    return 0;
}

void flow_denoise_free(flow_denoise *d) {
    free(d->in), free(d->urow), free(d->x), free(d->ts), free(d->enc), free(d->out), free(d->dout);
    memset(d, 0, sizeof *d);
}

/* Row r's input, timesteps and text from sample s. */
static void put_row(flow_denoise *d, int r, const flow_denoise_sample *s, const float *text) {
    if (s->concat)
        vae_i2v_input(d->shape[0], d->cfg.in_channels - d->shape[0], d->nl / d->shape[0], s->latent, s->concat,
                      d->x + r * d->nin);
    else memcpy(d->x + r * d->nin, s->latent, sizeof(float) * (size_t)d->nl);
    if (d->per_token) flow_ff_timesteps(d->shape[1], d->tpf, s->timestep, d->ts + r * d->nts);
    else d->ts[r] = s->timestep;
    if (text) memcpy(d->enc + r * d->ne, text, sizeof(float) * (size_t)d->ne);
    else memset(d->enc + r * d->ne, 0, sizeof(float) * (size_t)d->ne);
}

int flow_denoise_build(flow_denoise *d, int n, const float *neg) {
    if (n < 1 || n > d->cap) return core_error("flow_denoise: %d samples for a step of up to %d", n, d->cap);
    const int cat = d->nin != d->nl;
    for (int j = 0; j < n; j++) {
        const flow_denoise_sample *s = &d->in[j];
        if (!s->latent || !s->text)
            return core_error("flow_denoise: sample %d has no %s", j, s->latent ? "text" : "latent");
        if (!s->concat != !cat)
            return core_error("flow_denoise: sample %d %s a concatenated image condition but the transformer takes %d "
                              "channels for %d out", j, s->concat ? "has" : "lacks", d->cfg.in_channels,
                              d->cfg.out_channels);
    }
    int rows = n;
    for (int j = 0; j < n; j++) d->urow[j] = flow_cfg_active(d->in[j].guidance) ? rows++ : -1;
    for (int j = 0; j < n; j++) {
        put_row(d, j, &d->in[j], d->in[j].text);
        if (d->urow[j] >= 0) put_row(d, d->urow[j], &d->in[j], neg);
    }
    d->n = n, d->rows = rows;
    return rows;
}

wan_exec_acts *flow_denoise_acts_new(const flow_denoise *d, const wan_exec *ex, int rows, wan_acts_mode mode) {
    wan_shape sh = {.B = rows, .F = (int)d->shape[1], .H = (int)d->shape[2], .W = (int)d->shape[3], .L = d->text_len,
                    .per_token_timestep = d->per_token};
    return wan_exec_acts_new(ex, &d->cfg, &sh, mode);
}

int flow_denoise_forward(flow_denoise *d, const wan_model *m, wan_exec_acts *a, const wan_exec *ex) {
    if (d->rows < 1) return core_error("flow_denoise_forward: no rows built (flow_denoise_build first)");
    if (wan_exec_forward(m, a, ex, d->out, d->x, d->ts, d->enc)) return -1;
    for (int j = 0; j < d->n; j++)
        if (d->urow[j] >= 0)
            flow_cfg_combine(d->out + j * d->nl, d->out + j * d->nl, d->out + d->urow[j] * d->nl, d->in[j].guidance,
                             d->nl);
    return 0;
}

int flow_denoise_grad(flow_denoise *d, int j, const float *dv) {
    if (!d->dout) return core_error("flow_denoise_grad: the step was made without grads");
    if (j < 0 || j >= d->n) return core_error("flow_denoise_grad: sample %d of %d", j, d->n);
    if (d->urow[j] >= 0)
        flow_cfg_backward(d->dout + j * d->nl, d->dout + d->urow[j] * d->nl, dv, d->in[j].guidance, d->nl);
    else memcpy(d->dout + j * d->nl, dv, sizeof(float) * (size_t)d->nl);
    return 0;
}

int flow_denoise_backward(flow_denoise *d, wan_model *m, wan_exec_acts *a, const wan_exec *ex) {
    if (!d->dout || d->rows < 1) return core_error("flow_denoise_backward: %s", d->dout ? "no rows built" : "the step "
                                                                                          "was made without grads");
    return wan_exec_backward(m, a, ex, d->dout);
}
