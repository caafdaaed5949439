/* rollout/engine.h — the sampling loop: Philox noise, classifier-free guidance, SDE steps with log-probs, recorded
 * into trajectories (core/trajectory.h). First version: one expert, CPU, conditioning given as embeddings.
 *
 * Per sample with uid u (docs/design.md section 4):
 *   latents[0] = normals of Philox (seed, slot 0, uid u, stream), element index over [C, F, H, W];
 *   step i (0..N-1): v = flow_cfg_combine(v_c, v_u, g) (or v_c alone when g == 1), eps = normals of
 *   (seed, slot i+1, u, stream), flow_sde_step(latents[i], v, eps) -> latents[i+1] and the step's log-prob.
 * Two experts (Wan 2.2 A14B): step i runs experts[flow_expert(timesteps[i], boundary_ratio)] with guidance_scale
 * (expert 0, high noise) or guidance_scale_2 (expert 1, low noise), and records the expert in the trajectory; the
 * whole batch shares the schedule, so every sample of a forward routes to the same expert.
 * The DiT forward is batched over up to batch_size samples (rows: the samples' conditional forwards, then their
 * unconditional ones); a sample's trajectory is bitwise the same whatever its batch mates or batch size, because
 * the DiT forward, the noise and the step are per-sample computations (tested).
 * Stream: CORE_STREAM_ROLLOUT_NOISE (uid = round*B*G + prompt_slot*G + replica) for training rollouts,
 * CORE_STREAM_EVAL_NOISE (uid = prompt index * samples_per_prompt + sample) for the fixed eval set.
 * Image conditioning (Wan 2.2 TI2V; rc->conditions): sample j's first latent frame is held to its condition
 * (model/flow/first_frame.h): latents[0] is the Philox noise with frame 0 replaced by the condition, every forward
 * runs with per-token timesteps (0 on frame 0's tokens, t elsewhere), and every step (flow_ff_sde_step) samples and
 * scores frames 1 .. F-1 only, frame 0 staying the condition; the trajectory carries the condition. */
#ifndef ROLLOUT_ENGINE_H
#define ROLLOUT_ENGINE_H

#include <stdint.h>

#include "core/trajectory.h"
#include "core/wire_rollout.h"
#include "model/dit/wan_dit.h"
#include "model/flow/flow.h"

#define ROLLOUT_MAX_STEPS 1000

typedef struct {
    int n_steps;                            /* N >= 1 */
    float sigmas[ROLLOUT_MAX_STEPS + 1];    /* flow_schedule(N, shift) */
    float timesteps[ROLLOUT_MAX_STEPS];     /* 1000 * sigma */
    float eta;                              /* SDE noise level >= 0 (0: ODE, no log-probs) */
    float guidance_scale;                   /* g of expert 0 (1: no unconditional forward) */
    float guidance_scale_2;                 /* g of expert 1, the low-noise transformer_2 (two experts only) */
    double boundary_ratio;                  /* two experts: timestep >= boundary_ratio * 1000 runs expert 0 */
    int64_t shape[4];                       /* latent [C, F, H, W] */
    int text_len;                           /* L: rows of each embedding */
    uint64_t seed;                          /* Philox key */
    uint32_t stream;                        /* CORE_STREAM_ROLLOUT_NOISE or CORE_STREAM_EVAL_NOISE */
    int batch_size;                         /* samples per DiT forward, >= 1 */
    int64_t policy_version;                 /* recorded in each trajectory */
    const float *neg;                       /* negative prompt embedding [text_len, text_dim] (NULL: all zeros) */
    float *const *velocities;               /* NULL, or per sample j of a rollout_generate call a buffer
                                               [N, C, F, H, W] that receives the guided velocity v of every step
                                               (what the step used; for the parity check) */
    flow_kind kind;                         /* the step (rollout.sde_type) and its log-prob (algorithm.cps_logprob) */
    int window_lo, window_hi;               /* SDE window: steps [lo, hi) step with eta, the others with eta 0 (the
                                               ODE step, no log-prob); window_hi 0: every step with eta */
    int record_means;                       /* 1: each trajectory gets its step means (core_traj_mean; GRPO-Guard) */
    const float *const *conditions;         /* NULL (text to video), or per sample j of a rollout_generate call its
                                               first-frame condition [C, 1, H, W] (TI2V: every sample of the call has
                                               one; the normalised VAE latent of its image) */
    const float *const *concat_conditions;  /* NULL, or (Wan 2.2 I2V-A14B, model/vae/wan_vae_i2v.h) per sample j of a
                                               call its condition [in - C, F, H, W] (the 4-channel mask, then the
                                               normalised latents of the condition video), concatenated after the
                                               latent [C, F, H, W] as every forward's input: the model takes
                                               in_channels = C + that and gives C out; every frame is stepped. Not
                                               carried in the trajectory yet (so not trained) */
    const float *const *noise0;             /* NULL (Philox slot 0), or per sample j of a call the initial noise
                                               [C, F, H, W] to start from instead (tests against a reference
                                               pipeline's noise) */
    int (*should_stop)(void);               /* NULL (never stops), or polled before every denoising step of every
                                               chunk: a non-zero return (the signal number, e.g. core/stop.h's
                                               core_stop_interrupt) ends rollout_generate with the error "rollout
                                               stopped by signal N ..." and nothing allocated */
} rollout_config;

/* Fills rc: the schedule from flow_schedule(n_steps, shift), the other fields from the arguments (policy_version 0,
 * stream CORE_STREAM_ROLLOUT_NOISE, neg NULL, velocities and should_stop NULL, guidance_scale_2 = guidance_scale,
 * boundary_ratio 0.875, kind flow_kind_default(), no window, no means). Errors (-1): n_steps outside 1..ROLLOUT_MAX_STEPS (rollout.num_steps), bad
 * shift (rollout.shift), eta negative/non-finite (rollout.eta), guidance not finite (rollout.guidance_scale), a
 * shape dim < 1, text_len < 1, batch_size < 1. */
int rollout_config_init(rollout_config *rc, int n_steps, double shift, float eta, float guidance_scale,
                        const int64_t shape[4], int text_len, uint64_t seed, int batch_size);

/* The request's sampling settings onto rc (a copy of the process's config): stream, eta, policy version, step kind,
 * window (checked against rc->n_steps) and record_means. Errors (-1): a window past the schedule. */
int rollout_config_apply_request(rollout_config *rc, const core_rollout_request *req);

/* After decoding: a windowed request's trajectory keeps latents[lo .. hi] (and the means of steps lo .. hi-1) only
 * (core_traj_trim). No window: nothing changes. -1 on error (core_traj_trim's). */
int rollout_trim_to_window(const rollout_config *rc, core_traj *t);

/* The models a rollout runs: one expert, or two (Wan 2.2 A14B: expert[0] = transformer/, expert[1] =
 * transformer_2/, same config). */
typedef struct {
    int n;                       /* 1 or 2 */
    const wan_model *expert[2];
} rollout_experts;

/* Generates n >= 1 samples with the experts (C == cfg.in_channels == out_channels).
 *   cond[j]: sample j's prompt embedding [text_len, text_dim] fp32 (the negative prompt is rc->neg, or all zeros when
 *   NULL: the word-embedding preset's empty prompt); uids[j] < 2^32; prompt_index[j] recorded; out[n] receives allocated trajectories
 *   (core_traj_free each). ex NULL = CPU defaults; ex->dev: the DiT runs on that device (model/dit/wan_dev_exec.h,
 *   model.device cuda: bf16, the velocity back in fp32), everything after the forward is the same host code.
 * Errors (-1): bad arguments (uid >= 2^32, shape not matching the model or its patch size, experts.n not 1 or 2,
 * two experts of different configs, boundary_ratio outside (0, 1) with two experts; with conditions: a NULL one, a
 * single latent frame, a patch deeper than one frame), out of memory, a DiT or step
 * failure, a stop (rc->should_stop); on error no trajectory is left allocated. */
int rollout_generate(const rollout_config *rc, const rollout_experts *experts, const wan_exec *ex, int n,
                     const float *const *cond, const uint64_t *uids, const int64_t *prompt_index, core_traj *out);

/* rollout_experts of one model. */
static inline rollout_experts rollout_one_expert(const wan_model *m) {
    rollout_experts e = {1, {m, NULL}};
    return e;
}

#endif
