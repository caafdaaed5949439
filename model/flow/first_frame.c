/* model/flow/first_frame.c — first-frame image conditioning of Wan 2.2 TI2V (see model/flow/first_frame.h). */
#include "model/flow/first_frame.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

int64_t flow_ff_numel(const flow_ff *c) { return c->C * c->F * c->H * c->W; }

int64_t flow_ff_generated(const flow_ff *c) { return c->C * (c->cond ? c->F - 1 : c->F) * c->H * c->W; }

void flow_ff_gather(const flow_ff *c, const float *x, float *g) {
    if (!c->cond) {
        memcpy(g, x, sizeof(float) * (size_t)flow_ff_numel(c));
        return;
    }
    const int64_t hw = c->H * c->W, per = (c->F - 1) * hw;
    for (int64_t ch = 0; ch < c->C; ch++) memcpy(g + ch * per, x + ch * c->F * hw + hw, sizeof(float) * (size_t)per);
}

static void scatter(const flow_ff *c, const float *g, float *x, int grad) {
    if (!c->cond) {
        memcpy(x, g, sizeof(float) * (size_t)flow_ff_numel(c));
        return;
    }
    const int64_t hw = c->H * c->W, per = (c->F - 1) * hw;
    for (int64_t ch = 0; ch < c->C; ch++) {
        float *xc = x + ch * c->F * hw;
        if (grad) memset(xc, 0, sizeof(float) * (size_t)hw);
        else memcpy(xc, c->cond + ch * hw, sizeof(float) * (size_t)hw);
        memcpy(xc + hw, g + ch * per, sizeof(float) * (size_t)per);
    }
}

void flow_ff_scatter(const flow_ff *c, const float *g, float *x) { scatter(c, g, x, 0); }

void flow_ff_scatter_grad(const flow_ff *c, const float *g, float *x) { scatter(c, g, x, 1); }

void flow_ff_apply(const flow_ff *c, float *x) {
    if (!c->cond) return;
    const int64_t hw = c->H * c->W;
    for (int64_t ch = 0; ch < c->C; ch++) memcpy(x + ch * c->F * hw, c->cond + ch * hw, sizeof(float) * (size_t)hw);
}

int flow_ff_first_is_cond(const flow_ff *c, const float *x) {
    if (!c->cond) return 1;
    const int64_t hw = c->H * c->W;
    for (int64_t ch = 0; ch < c->C; ch++)
        if (memcmp(x + ch * c->F * hw, c->cond + ch * hw, sizeof(float) * (size_t)hw)) return 0;
    return 1;
}

const float *flow_ff_view(const flow_ff *c, const float *x, float *work) {
    if (!c->cond) return x;
    flow_ff_gather(c, x, work);
    return work;
}

void flow_ff_timesteps(int64_t F, int64_t tokens_per_frame, float t, float *ts) {
    for (int64_t s = 0; s < F * tokens_per_frame; s++) ts[s] = s < tokens_per_frame ? 0.0f : t;
}

int flow_ff_sde_step(flow_kind k, const flow_ff *c, const float *x, const float *v, const float *eps,
                     const float *x_next_given, float sigma, float sigma_next, float sigma1, float eta,
                     float *mean_out, float *x_next_out, flow_step *st, float *work) {
    if (!c->cond)
        return flow_sde_step_kind(k, x, v, eps, x_next_given, flow_ff_numel(c), sigma, sigma_next, sigma1, eta,
                                  mean_out, x_next_out, st);
    if (c->F < 2) return core_error("first-frame conditioning: one latent frame leaves nothing to generate (F = %lld)",
                                    (long long)c->F);
    const int64_t n = flow_ff_generated(c);
    float *gx = work, *gv = work + n, *ge = work + 2 * n, *gn = work + 3 * n, *gm = work + 4 * n;
    flow_ff_gather(c, x, gx);
    flow_ff_gather(c, v, gv);
    if (eps) flow_ff_gather(c, eps, ge);
    if (x_next_given) flow_ff_gather(c, x_next_given, gn);
    /* x_next_out is written only when eps is given or both are NULL (flow_sde_step's contract) */
    const int want_next = x_next_out && !x_next_given;
    if (flow_sde_step_kind(k, gx, gv, eps ? ge : NULL, x_next_given ? gn : NULL, n, sigma, sigma_next, sigma1, eta,
                           mean_out ? gm : NULL, want_next ? gn : NULL, st))
        return -1;
    if (mean_out) flow_ff_scatter(c, gm, mean_out);
    if (want_next) flow_ff_scatter(c, gn, x_next_out);
    return 0;
}

int flow_ff_pipeline_conditions(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 2 : core_error("%s: cannot read: %s", path, strerror(errno));
    json_error_t je;
    json_t *root = json_loadf(f, 0, &je);
    fclose(f);
    if (!json_is_object(root)) {
        json_decref(root);
        return core_error("%s: not a JSON object (%s)", path, je.text);
    }
    const int yes = json_is_true(json_object_get(root, "expand_timesteps"));
    json_decref(root);
    return yes;
}
