/* model/flow/first_frame.h — first-frame image conditioning of Wan 2.2 TI2V (the 5B's image-to-video form), the one
 * piece rollout (rollout/engine.c) and trainer (trainer/step/train_step.c) share, so both build the same model input, the
 * same per-token timesteps and the same step over the same elements.
 *
 * Reference: diffusers 0.42.1 pipelines/wan/pipeline_wan_i2v.py, WanImageToVideoPipeline with expand_timesteps=True:
 *   condition  = (vae.encode(image as one frame).mode() - latents_mean) * (1 / latents_std)   [C, 1, H, W]
 *   mask m     = 0 on latent frame 0, 1 on frames 1 .. F-1                                     [1, 1, F, H, W]
 *   each step  model input = (1 - m) * condition + m * latents;  timestep per token = m * t  (tokens of frame 0
 *              get 0, the others t; mask[0][0][:, ::2, ::2].flatten(): patch (1, 2, 2), tokens frame-major)
 *   after      latents = (1 - m) * condition + m * latents, then decode.
 * diffusers lets frame 0 of `latents` drift with the scheduler and overwrites it in the model input and at the end,
 * so it never reaches the output. vgrpo keeps frame 0 of every latent of the chain EQUAL to the condition (the
 * initial noise of frame 0 is drawn and discarded), so a stored latent is itself the model input and the final
 * latent is what diffusers decodes; with m in {0, 1} the blend equals that copy exactly (up to the sign of a zero).
 *
 * The step (SDE or ODE, model/flow/flow.h) and its log-prob run over the GENERATED elements only: frames 1 .. F-1 of
 * every channel, gathered in [C, F-1, H, W] order (n = C (F-1) H W). The noise eps of a step is drawn over the full
 * [C, F, H, W] element index as for text-to-video (docs/design.md section 4) and gathered the same way, so a generated
 * element gets the noise it would get without an image. So for a conditioned step
 *   logp = -(S / n) / (2 step_std^2) - log(step_std) - log(sqrt(2 pi)),  S = sum over generated elements (fixed order)
 * and the KL and GRPO-Guard's mean bias are means over the same n elements; frame 0 has no log-prob term, its
 * velocity gets no gradient. Without a condition (cond NULL) every function here is the identity on the layout:
 * the text-to-video step, bit for bit.
 *
 * Not covered: Wan 2.2 I2V-A14B (condition video + 4-channel mask concatenated to 36 input channels), Wan 2.1 I2V
 * (CLIP image embeddings), last-frame conditioning (diffusers' last_image). */
#ifndef MODEL_FLOW_FIRST_FRAME_H
#define MODEL_FLOW_FIRST_FRAME_H

#include <stdint.h>

#include "model/flow/flow.h"

typedef struct {
    int64_t C, F, H, W; /* latent shape [C, F, H, W] */
    const float *cond;  /* [C, 1, H, W] the normalised latent of the image; NULL: nothing conditioned */
} flow_ff;

static inline flow_ff flow_ff_make(const int64_t shape[4], const float *cond) {
    flow_ff c = {shape[0], shape[1], shape[2], shape[3], cond};
    return c;
}

/* Elements of one latent (C F H W), and the generated ones (C (F - 1) H W with a condition, else C F H W). */
int64_t flow_ff_numel(const flow_ff *c);
int64_t flow_ff_generated(const flow_ff *c);

/* g [flow_ff_generated] = x's frames 1 .. F-1 in [C, F-1, H, W] order (without a condition: a copy of x). */
void flow_ff_gather(const flow_ff *c, const float *x, float *g);
/* x [C, F, H, W]: frames 1 .. F-1 from g, frame 0 = the condition (without one: x = g). */
void flow_ff_scatter(const flow_ff *c, const float *g, float *x);
/* The same with frame 0 = 0: a gradient with respect to the latent (frame 0 is not generated). */
void flow_ff_scatter_grad(const flow_ff *c, const float *g, float *x);
/* x's frame 0 = the condition (no-op without one). */
void flow_ff_apply(const flow_ff *c, float *x);
/* 1 when x's frame 0 equals the condition bit for bit (or there is none), else 0. */
int flow_ff_first_is_cond(const flow_ff *c, const float *x);
/* x itself without a condition (no copy), else x gathered into work [flow_ff_generated] and work. */
const float *flow_ff_view(const flow_ff *c, const float *x, float *work);

/* Per-token timesteps of one sample for the DiT's per-token form (wan_shape.per_token_timestep): ts [F * tpf]
 * (tpf = tokens per latent frame = (H / patch_h) (W / patch_w); the patch must be 1 frame deep): 0 on frame 0's
 * tokens, t on the others (diffusers' m * t). */
void flow_ff_timesteps(int64_t F, int64_t tokens_per_frame, float t, float *ts);

/* One step (model/flow/flow.h flow_sde_step_kind, same arguments and contract) over the generated elements: x, v,
 * eps, x_next_given are full latents [C, F, H, W]; mean_out and x_next_out (full, may be NULL as there) get frame 0
 * = the condition; st's log-prob is over the generated elements. work: 5 * flow_ff_generated floats (unused and may
 * be NULL without a condition: then this is flow_sde_step_kind on the full latent, bit for bit). Errors: those of
 * flow_sde_step_kind, F < 2 with a condition. */
int flow_ff_sde_step(flow_kind k, const flow_ff *c, const float *x, const float *v, const float *eps,
                     const float *x_next_given, float sigma, float sigma_next, float sigma1, float eta,
                     float *mean_out, float *x_next_out, flow_step *st, float *work);

/* Whether the diffusers pipeline folder dir does first-frame conditioning: its model_index.json says
 * "expand_timesteps": true (WanImageToVideoPipeline / Wan 2.2 TI2V; `vgrpo init-model` writes it for wan2.2-ti2v-5b
 * and tiny-ti2v). Returns 1 (yes), 0 (the key false or absent: a text-to-video pipeline), 2 (no model_index.json:
 * unknown, e.g. a dry run before the model exists), -1 with core_error (unreadable or not a JSON object). */
int flow_ff_pipeline_conditions(const char *dir);

#endif
