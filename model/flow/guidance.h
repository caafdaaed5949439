/* model/flow/guidance.h — classifier-free guidance, the one combination rollout and trainer both use (docs/design.md
 * section 4): v = v_u + g * (v_c - v_u), fp32, per element in this order: d = v_c - v_u; t = g * d; v = v_u + t.
 * With g == 1 (or no negative prompt) there is a single forward and v = v_c exactly: the caller asks
 * flow_cfg_active(g) and skips the unconditional forward. In training both forwards carry gradient:
 * dv_c = g * dv, dv_u = (1 - g) * dv (flow_cfg_backward). Source: Ho & Salimans, "Classifier-Free Diffusion
 * Guidance" (2022); diffusers WanPipeline (noise_uncond + guidance_scale * (noise_pred - noise_uncond)). */
#ifndef MODEL_GUIDANCE_H
#define MODEL_GUIDANCE_H

#include <stdint.h>

/* 1 when guidance needs the unconditional forward (g != 1). */
static inline int flow_cfg_active(float g) { return g != 1.0f; }

/* v [n] = v_u + g * (v_c - v_u) as above; v may alias v_c or v_u. */
static inline void flow_cfg_combine(float *v, const float *v_c, const float *v_u, float g, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float d = v_c[i] - v_u[i];
        float t = g * d;
        v[i] = v_u[i] + t;
    }
}

/* dv_c [n] = g * dv, dv_u [n] = (1 - g) * dv (fp32; 1 - g rounded once). */
static inline void flow_cfg_backward(float *dv_c, float *dv_u, const float *dv, float g, int64_t n) {
    const float gu = 1.0f - g;
    for (int64_t i = 0; i < n; i++) {
        dv_c[i] = g * dv[i];
        dv_u[i] = gu * dv[i];
    }
}

#endif
