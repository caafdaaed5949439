/* rollout/engine.c — the sampling loop (see rollout/engine.h). */
#include "rollout/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "model/flow/denoise.h"
#include "model/flow/first_frame.h"
#include "model/flow/flow.h"
#include "model/flow/guidance.h"

int rollout_config_init(rollout_config *rc, int n_steps, double shift, float eta, float guidance_scale,
                        const int64_t shape[4], int text_len, uint64_t seed, int batch_size) {
    memset(rc, 0, sizeof *rc);
    if (n_steps < 1 || n_steps > ROLLOUT_MAX_STEPS)
        return core_error("rollout.num_steps: must be in 1..%d, got %d", ROLLOUT_MAX_STEPS, n_steps);
    if (flow_schedule(n_steps, shift, rc->sigmas, rc->timesteps)) return core_error_push("rollout.shift: ");
    if (!isfinite(eta) || eta < 0) return core_error("rollout.eta: must be finite and >= 0, got %g", (double)eta);
    if (!isfinite(guidance_scale)) return core_error("rollout.guidance_scale: must be finite");
    for (int d = 0; d < 4; d++)
        if (shape[d] < 1) return core_error("rollout: latent shape dim %d is %lld (must be >= 1)", d, (long long)shape[d]);
    if (text_len < 1) return core_error("rollout.text_len: must be >= 1, got %d", text_len);
    if (batch_size < 1) return core_error("rollout.batch_size: must be >= 1, got %d", batch_size);
    rc->n_steps = n_steps;
    rc->eta = eta;
    rc->guidance_scale = guidance_scale;
    rc->guidance_scale_2 = guidance_scale;
    rc->boundary_ratio = 0.875;
    memcpy(rc->shape, shape, sizeof rc->shape);
    rc->text_len = text_len;
    rc->seed = seed;
    rc->stream = CORE_STREAM_ROLLOUT_NOISE;
    rc->batch_size = batch_size;
    rc->kind = flow_kind_default();
    return 0;
}

int rollout_config_apply_request(rollout_config *rc, const core_rollout_request *req) {
    rc->stream = req->stream;
    rc->eta = req->eta;
    rc->policy_version = req->policy_version;
    rc->kind.type = req->sde_type ? FLOW_CPS : FLOW_SDE;
    rc->kind.logp = req->logp_mode ? FLOW_LOGP_FLOW_GRPO : FLOW_LOGP_EXACT;
    if (req->window_hi > rc->n_steps)
        return core_error("rollout request: sde_window [%d, %d] is past the %d denoising steps", req->window_lo,
                          req->window_hi, rc->n_steps);
    rc->window_lo = req->window_hi > 0 ? req->window_lo : 0;
    rc->window_hi = req->window_hi;
    rc->record_means = req->return_means;
    return 0;
}

int rollout_trim_to_window(const rollout_config *rc, core_traj *t) {
    if (rc->window_hi <= 0) return 0;
    return core_traj_trim(t, rc->window_lo, rc->window_hi);
}

/* Runs samples [s0, s0+b) through all steps; their trajectories are already allocated and filled with metadata.
 * The step's rows, forward and guidance are model/flow/denoise.h's; activations are allocated per row count (b, or 2b
 * with CFG), since the experts' guidance may differ. On the device (ex->dev: model/dit/wan_dev_exec.h) the DiT forward
 * runs there and hands back the fp32 velocity; everything after it (CFG, the noise, the SDE step and its log-prob) is
 * the same host code as on the CPU. */
static int run_chunk(const rollout_config *rc, const rollout_experts *E, const wan_exec *ex, int b,
                     const float *const *cond, const float *const *ccond, core_traj *tr, float *const *vel) {
    const int64_t nl = rc->shape[0] * rc->shape[1] * rc->shape[2] * rc->shape[3];
    const int i2v = tr[0].condition != NULL; /* TI2V: per-token timesteps, the step over frames 1 .. F-1 */
    wan_exec_acts *acts[2] = {NULL, NULL};  /* [cfg off, cfg on] */
    flow_denoise d;
    float *eps = malloc(sizeof(float) * (size_t)nl);
    float *work = i2v ? malloc(sizeof(float) * (size_t)(5 * nl)) : NULL;
    int rc_ = -1;
    if (flow_denoise_init(&d, &E->expert[0]->cfg, rc->shape, rc->text_len, i2v, b, 0)) {
        core_error_push("rollout: ");
        goto done;
    }
    if (!eps || (i2v && !work)) {
        core_error("rollout: out of memory");
        goto done;
    }
    for (int i = 0; i < rc->n_steps; i++) {
        const int sig = rc->should_stop ? rc->should_stop() : 0;
        if (sig) {
            core_error("rollout stopped by signal %d (before denoising step %d of %d)", sig, i + 1, rc->n_steps);
            goto done;
        }
        const int e = E->n == 2 ? flow_expert(rc->timesteps[i], rc->boundary_ratio) : 0;
        const float eta_i = rc->window_hi <= 0 || (i >= rc->window_lo && i < rc->window_hi) ? rc->eta : 0.0f;
        const float g = e ? rc->guidance_scale_2 : rc->guidance_scale;
        const int cfg = flow_cfg_active(g);
        for (int j = 0; j < b; j++) /* a conditioned latent's frame 0 is its condition: it is the model input */
            d.in[j] = (flow_denoise_sample){core_traj_latent(&tr[j], i), ccond ? ccond[j] : NULL, cond[j],
                                            rc->timesteps[i], g};
        const int rows = flow_denoise_build(&d, b, rc->neg);
        if (rows < 0 || (!acts[cfg] && !(acts[cfg] = flow_denoise_acts_new(&d, ex, rows, WAN_ACTS_INFER))) ||
            flow_denoise_forward(&d, E->expert[e], acts[cfg], ex))
            goto done;
        for (int j = 0; j < b; j++) {
            const float *v = flow_denoise_velocity(&d, j);
            if (vel) memcpy(vel[j] + (int64_t)i * nl, v, sizeof(float) * (size_t)nl);
            /* an ODE step (eta 0) uses no noise: none drawn (the step is the mean either way) */
            if (eta_i > 0.0f) core_philox_normal(eps, nl, rc->seed, (uint32_t)(i + 1), (uint32_t)tr[j].uid, rc->stream);
            flow_step st;
            const flow_ff ff = flow_ff_make(rc->shape, tr[j].condition);
            if (flow_ff_sde_step(rc->kind, &ff, core_traj_latent(&tr[j], i), v, eta_i > 0.0f ? eps : NULL, NULL,
                                 rc->sigmas[i], rc->sigmas[i + 1], rc->sigmas[1], eta_i, core_traj_mean(&tr[j], i),
                                 core_traj_latent(&tr[j], i + 1), &st, work))
                goto done;
            tr[j].log_probs[i] = st.has_logp ? st.logp : 0.0f;
            tr[j].has_log_prob[i] = (uint8_t)st.has_logp;
            tr[j].expert[i] = (uint8_t)e;
        }
    }
    rc_ = 0;
done:
    wan_exec_acts_free(acts[0]);
    wan_exec_acts_free(acts[1]);
    flow_denoise_free(&d);
    free(eps), free(work);
    return rc_;
}

int rollout_generate(const rollout_config *rc, const rollout_experts *E, const wan_exec *ex, int n,
                     const float *const *cond, const uint64_t *uids, const int64_t *prompt_index, core_traj *out) {
    if (n < 1) return core_error("rollout: no samples requested");
    if (E->n < 1 || E->n > 2 || !E->expert[0] || (E->n == 2 && !E->expert[1]))
        return core_error("rollout: %d experts given (1 or 2)", E->n);
    const wan_model *m = E->expert[0];
    if (E->n == 2) {
        if (!wan_config_equal(&E->expert[0]->cfg, &E->expert[1]->cfg))
            return core_error("rollout: transformer and transformer_2 have different configs");
        if (!(rc->boundary_ratio > 0 && rc->boundary_ratio < 1))
            return core_error("model.boundary_ratio: must be in (0, 1) for two experts, got %g", rc->boundary_ratio);
    }
    if (rc->concat_conditions) {
        if (rc->conditions)
            return core_error("rollout: a call gives first-frame (TI2V) and concatenated (I2V-A14B) conditions");
        if (rc->shape[0] != m->cfg.out_channels || wan_cond_kind(&m->cfg) != WAN_COND_CONCAT)
            return core_error("rollout: concatenated image conditions need a Wan 2.2 I2V-A14B model (2 x out + 4 input "
                              "channels) and a latent of its output channels: latent %lld, model %d in / %d out",
                              (long long)rc->shape[0], m->cfg.in_channels, m->cfg.out_channels);
        for (int j = 0; j < n; j++)
            if (!rc->concat_conditions[j])
                return core_error("rollout: sample %d has no image condition (every sample of a conditioned call "
                                  "needs one)", j);
    } else if (wan_cond_kind(&m->cfg) == WAN_COND_CONCAT)
        return core_error("rollout: the transformer takes %d channels for %d out: a Wan 2.2 I2V-A14B model (latents, "
                          "a 4-channel mask and the condition video's latents concatenated), which samples only with an "
                          "image condition per sample (prompt files with an image per prompt)", m->cfg.in_channels,
                          m->cfg.out_channels);
    if (!rc->concat_conditions && (rc->shape[0] != m->cfg.in_channels || wan_cond_kind(&m->cfg) != WAN_COND_LATENT))
        return core_error("rollout: latent has %lld channels, the model %d in / %d out", (long long)rc->shape[0],
                          m->cfg.in_channels, m->cfg.out_channels);
    for (int j = 0; j < n; j++)
        if (uids[j] > 0xffffffffull) return core_error("rollout: uid %llu does not fit Philox's 32-bit counter word",
                                                      (unsigned long long)uids[j]);
    if (rc->conditions) {
        if (rc->shape[1] < 2)
            return core_error("rollout: image conditioning needs at least 2 latent frames (rollout.frames >= 5); with "
                              "one the first frame is the image and nothing is generated");
        if (m->cfg.patch_size[0] != 1)
            return core_error("rollout: image conditioning needs a patch one frame deep, the model's is %d",
                              m->cfg.patch_size[0]);
        for (int j = 0; j < n; j++)
            if (!rc->conditions[j]) return core_error("rollout: sample %d has no image condition (every sample of a "
                                                      "conditioned call needs one)", j);
    }
    memset(out, 0, sizeof(core_traj) * (size_t)n);
    const int64_t nl = rc->shape[0] * rc->shape[1] * rc->shape[2] * rc->shape[3];
    for (int j = 0; j < n; j++) {
        core_traj *t = &out[j];
        if (core_traj_alloc(t, rc->n_steps, rc->shape)) goto fail;
        t->uid = uids[j];
        t->prompt_index = prompt_index ? prompt_index[j] : 0;
        t->policy_version = rc->policy_version;
        t->eta = rc->eta;
        t->guidance_scale = rc->guidance_scale;
        t->guidance_scale_2 = E->n == 2 ? rc->guidance_scale_2 : rc->guidance_scale;
        memcpy(t->sigmas, rc->sigmas, sizeof(float) * (size_t)(rc->n_steps + 1));
        memcpy(t->timesteps, rc->timesteps, sizeof(float) * (size_t)rc->n_steps);
        if (rc->record_means && core_traj_alloc_means(t)) goto fail;
        if (rc->noise0) memcpy(core_traj_latent(t, 0), rc->noise0[j], sizeof(float) * (size_t)nl);
        else core_philox_normal(core_traj_latent(t, 0), nl, rc->seed, 0, (uint32_t)uids[j], rc->stream);
        if (rc->concat_conditions) { /* I2V-A14B: the trajectory keeps the condition its inputs were built from */
            const int64_t cc = wan_cond_channels(&m->cfg), ncc = cc * (nl / rc->shape[0]);
            if (!(t->concat = malloc(sizeof(float) * (size_t)ncc))) {
                core_error("rollout: out of memory for the image condition");
                goto fail;
            }
            memcpy(t->concat, rc->concat_conditions[j], sizeof(float) * (size_t)ncc);
            t->concat_channels = cc;
        }
        if (rc->conditions) { /* frame 0 of the chain is the image's latent from the start */
            if (core_traj_alloc_condition(t)) goto fail;
            memcpy(t->condition, rc->conditions[j], sizeof(float) * (size_t)(nl / rc->shape[1]));
            const flow_ff ff = flow_ff_make(rc->shape, t->condition);
            flow_ff_apply(&ff, core_traj_latent(t, 0));
        }
    }
    for (int s0 = 0; s0 < n; s0 += rc->batch_size) {
        int b = n - s0 < rc->batch_size ? n - s0 : rc->batch_size;
        if (run_chunk(rc, E, ex, b, cond + s0, rc->concat_conditions ? rc->concat_conditions + s0 : NULL, out + s0,
                      rc->velocities ? rc->velocities + s0 : NULL))
            goto fail;
    }
    return 0;
fail:
    for (int j = 0; j < n; j++) core_traj_free(&out[j]);
    return -1;
}
