/* model/flow/denoise.h — one denoising step of a batch through the Wan DiT: the model's input rows built from the
 * samples' latents, the forward on the backend a wan_exec names, and classifier-free guidance; for training, the
 * guidance's backward and the DiT backward over the same rows. The one place the rollout engine (rollout/engine.c),
 * `generate` (rollout/text_to_video.c) and the training step (trainer/step/train_step.c) build the model input, so the
 * three feed the DiT the same rows and guide its output the same way (what parity 0 rests on).
 *
 * Rows (docs/design.md section 4): for samples j = 0 .. n-1, row j is sample j's conditional forward; then, in sample
 * order, one unconditional row for each sample whose guidance is active (flow_cfg_active(g)), with the negative prompt
 * embedding (or zeros). Each row's input is
 *   text to video, TI2V      the latent x [C, F, H, W] (a TI2V latent's frame 0 already is its condition:
 *                            model/flow/first_frame.h);
 *   I2V-A14B                 cat(x, condition) [in_channels, F, H, W] (model/vae/wan_vae_i2v.h vae_i2v_input);
 * and its timestep the step's t, or (per-token timesteps, TI2V) [F * tokens per frame] with 0 on frame 0's tokens
 * (flow_ff_timesteps). The guided velocity of sample j is flow_cfg_combine(v_c, v_u, g) of its two rows, or v_c.
 * The forward of a row does not depend on its batch mates, so a sample's velocity is the same in any batch.
 *
 * Layering: model/flow stands above model/dit and model/vae (it calls the DiT and builds I2V-A14B's input); neither
 * includes model/flow (scripts/check_layout.py). Which expert runs a step stays with the caller (flow_expert). */
#ifndef MODEL_FLOW_DENOISE_H
#define MODEL_FLOW_DENOISE_H

#include <stdint.h>

#include "model/dit/wan_executor.h"

/* One sample of a step. */
typedef struct {
    const float *latent; /* x [C, F, H, W] fp32 at this step */
    const float *concat; /* I2V-A14B: the condition [in_channels - C, F, H, W] (mask, then the condition video's
                            latents); NULL for a model of C input channels (text to video, TI2V) */
    const float *text;   /* the prompt's embedding [text_len, text_dim] fp32 (the conditional row) */
    float timestep;      /* the step's timestep, 1000 sigma */
    float guidance;      /* g; the sample gets an unconditional row when flow_cfg_active(g) */
} flow_denoise_sample;

/* The scratch of steps over up to cap samples of one latent shape (rows <= 2 cap), allocated once by
 * flow_denoise_init; the fields are read-only for callers except in[]. */
typedef struct {
    wan_config cfg;            /* the DiT's config (a copy) */
    int64_t shape[4];          /* latent [C, F, H, W] */
    int text_len;              /* L */
    int per_token;             /* 1: per-token timesteps (TI2V first-frame conditioning) */
    int cap;                   /* samples per step, >= 1 */
    int64_t nl, nin, ne, nts;  /* per row: latent C F H W, model input in_channels F H W, text L text_dim,
                                  timesteps (1, or F * tokens per frame) */
    int64_t tpf;               /* tokens per latent frame: (H / patch_h) (W / patch_w) */
    flow_denoise_sample *in;   /* [cap]: the caller fills in[0 .. n-1] before flow_denoise_build */
    int n, rows;               /* the last build's samples and rows (0 before one) */
    int *urow;                 /* [cap]: sample j's unconditional row, or -1 */
    float *x, *ts, *enc, *out; /* [2 cap, nin], [2 cap, nts], [2 cap, ne], [2 cap, nl]: the rows, the forward's out */
    float *dout;               /* [2 cap, nl]: d loss / d out (with grads only, else NULL) */
} flow_denoise;

/* Allocates d for steps of up to cap samples of latent shape [C, F, H, W] on a DiT of config cfg (C == its
 * out_channels; in_channels C, or 2 C + 4 for I2V-A14B) with text_len embedding rows; per_token: per-token timesteps
 * (TI2V, the patch one frame deep); grads: also the buffer of the backward (flow_denoise_grad). Errors (-1, d zeroed):
 * cap < 1, a shape or text_len < 1, C not the model's out_channels, a model input of other channels than C or
 * 2 C + 4 (wan_cond_kind), per_token with a patch deeper than one frame, out of memory. */
int flow_denoise_init(flow_denoise *d, const wan_config *cfg, const int64_t shape[4], int text_len, int per_token,
                      int cap, int grads);
/* Frees what flow_denoise_init allocated and zeroes d (a zeroed d is fine). */
void flow_denoise_free(flow_denoise *d);

/* Builds the rows of samples d->in[0 .. n-1] (above) into d->x, d->ts, d->enc: the unconditional rows get neg
 * [text_len, text_dim] (NULL: zeros). Returns the row count (n .. 2 n), or -1 with core_error: n outside 1 .. cap, a
 * NULL latent or text, a sample with a condition for a model without concatenated input or without one for a model
 * with it. */
int flow_denoise_build(flow_denoise *d, int n, const float *neg);

/* Activations for the last build's rows on ex's backend (wan_exec_acts_new for shape [rows, F, H, W], L, the
 * per-token flag). rows: d->rows, or the row count of the builds the activations will serve. NULL with core_error. */
wan_exec_acts *flow_denoise_acts_new(const flow_denoise *d, const wan_exec *ex, int rows, wan_acts_mode mode);

/* The forward of model m over the built rows (wan_exec_forward with a, which must have been made for d->rows rows on
 * ex's backend), then the guided velocity of every sample into its conditional row, in place: flow_denoise_velocity.
 * May run again on the same rows (another model or ex, e.g. the KL reference). 0, or -1 (wan_exec_forward's). */
int flow_denoise_forward(flow_denoise *d, const wan_model *m, wan_exec_acts *a, const wan_exec *ex);

/* Sample j's guided velocity [C, F, H, W] fp32 of the last flow_denoise_forward. */
static inline float *flow_denoise_velocity(const flow_denoise *d, int j) { return d->out + (int64_t)j * d->nl; }

/* The backward of the guidance for sample j: d->dout's rows from dv [nl] = d loss / d (j's guided velocity):
 * flow_cfg_backward (g dv to the conditional row, (1 - g) dv to the unconditional) or a copy. Every sample of the
 * build is given one before flow_denoise_backward. d made without grads: -1. */
int flow_denoise_grad(flow_denoise *d, int j, const float *dv);

/* wan_exec_backward of m over the built rows with d->dout: the parameter gradients accumulate (wan_executor.h); a is
 * the activations of m's last forward over these rows (a training mode). 0 or -1. */
int flow_denoise_backward(flow_denoise *d, wan_model *m, wan_exec_acts *a, const wan_exec *ex);

#endif
