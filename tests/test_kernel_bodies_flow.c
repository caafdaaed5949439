/* tests/test_kernel_bodies_flow.c — the flow, guidance and optimizer bodies of kernels/body/ (what the CUDA backend
 * launches for them) against the CPU code they restate, run on the CPU through kernels/body/kb_host.h:
 *   kb_flow.h   vs model/flow/flow.c (flow_sde_step with eps, with a recorded x_next, and deterministic; flow_kl;
 *               flow_sde_backward_v) and model/flow/guidance.h (flow_cfg_combine, flow_cfg_backward);
 *   kb_optim.h  vs trainer/optim/optim.c (optim_adamw_update with and without a weight-decay mask, optim_sumsq,
 *               optim_clip_coef).
 * Band: none. Every result is asserted bit-identical (sums, log-probs, KL, means, next latents, velocity gradients,
 * parameters and moments): the bodies keep the same fp32 operations in the same order and the same fixed-order
 * sums (core/reduce.h for the flow, optim.h's chunked double sum for the norm). The velocity and the gradient are
 * also read from bf16 storage (the model's output dtype on the GPU): the result is then bit-identical to the CPU
 * code run on the same, bf16-representable values. Sizes span several reduction chunks with a tail, so the pairwise
 * tree (flow) and the chunk order (norm) are exercised. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/body/kb_host.h"
#include "model/flow/flow.h"
#include "model/flow/guidance.h"
#include "trainer/optim/optim.h"
#include "tests/test.h"

static float *frand(size_t n, unsigned long long seed, float lo, float hi) {
    float *x = malloc(n * sizeof(float));
    if (!x) abort();
    test_fill_uniform(x, n, seed, lo, hi);
    return x;
}

static float *fcopy(const float *x, size_t n) {
    float *y = malloc(n * sizeof(float));
    if (!y) abort();
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* bf16 storage of x, and x itself rounded to those values. */
static kb_bf16 *to_bf16_round(float *x, size_t n) {
    kb_bf16 *h = malloc(n * sizeof(kb_bf16));
    if (!h) abort();
    for (size_t i = 0; i < n; i++) h[i] = kb_bf16_from_f32(x[i]), x[i] = kb_f32_from_bf16(h[i]);
    return h;
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }
static int same_f(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* n spans 5 full chunks of 4096 and a tail: a 6-leaf tree. */
#define FLOW_N (5 * KB_REDUCE_CHUNK + 77)

TEST(kbody_sde_step_matches_flow) {
    const int64_t n = FLOW_N;
    float *x = frand(n, 1, -2, 2), *v = frand(n, 2, -2, 2), *eps = frand(n, 3, -3, 3);
    kb_bf16 *vh = NULL;
    kb_in nil = {NULL, KB_F32};
    /* sigma == 1 (the sigma1 branch) and an interior step */
    const float steps[2][4] = {{1.0f, 0.93f, 0.93f, 0.7f}, {0.55f, 0.48f, 0.93f, 1.0f}};
    for (int vb = 0; vb < 2; vb++) {
        if (vb) vh = to_bf16_round(v, n); /* v rounded in place: the CPU code sees the same values */
        kb_in vin = vb ? kb_in_bf16(vh) : kb_in_f32(v);
        for (int c = 0; c < 2; c++) {
            const float *p = steps[c];
            flow_step st;
            float *mean = malloc(n * sizeof(float)), *xn = malloc(n * sizeof(float)), *bmean = malloc(n * sizeof(float)),
                  *bxn = malloc(n * sizeof(float));
            /* rollout: eps given */
            REQUIRE_OK(flow_sde_step(x, v, eps, NULL, n, p[0], p[1], p[2], p[3], mean, xn, &st));
            REQUIRE(st.has_logp);
            float sum = kbh_sde_step(kb_in_f32(x), vin, kb_in_f32(eps), nil, kb_out_f32(bmean), kb_out_f32(bxn),
                                     st.coef_x, st.coef_v, st.step_std, 1, n);
            CHECK(same_bits(bmean, mean, n));
            CHECK(same_bits(bxn, xn, n));
            CHECK_MSG(same_f(kb_sde_logp_from_sum(sum, n, st.step_std), st.logp), "rollout logp %.9g vs %.9g",
                      (double)kb_sde_logp_from_sum(sum, n, st.step_std), (double)st.logp);
            /* trainer: the recorded x_next */
            flow_step tr;
            float *given = fcopy(xn, n);
            REQUIRE_OK(flow_sde_step(x, v, NULL, given, n, p[0], p[1], p[2], p[3], mean, NULL, &tr));
            memset(bmean, 0, n * sizeof(float));
            sum = kbh_sde_step(kb_in_f32(x), vin, nil, kb_in_f32(given), kb_out_f32(bmean), kb_out_f32(NULL),
                               tr.coef_x, tr.coef_v, tr.step_std, 1, n);
            CHECK(same_bits(bmean, mean, n));
            CHECK_MSG(same_f(kb_sde_logp_from_sum(sum, n, tr.step_std), tr.logp), "trainer logp %.9g vs %.9g",
                      (double)kb_sde_logp_from_sum(sum, n, tr.step_std), (double)tr.logp);
            /* deterministic step: x_next = mean, no sum */
            REQUIRE_OK(flow_sde_step(x, v, NULL, NULL, n, p[0], p[1], p[2], p[3], NULL, xn, &st));
            sum = kbh_sde_step(kb_in_f32(x), vin, nil, nil, kb_out_f32(NULL), kb_out_f32(bxn), st.coef_x, st.coef_v,
                               st.step_std, 0, n);
            CHECK(same_bits(bxn, xn, n));
            CHECK(sum == 0.0f);
            /* KL to a reference mean, and the backward with respect to v */
            float *mref = frand(n, 4 + c, -2, 2), kl, bkl;
            REQUIRE_OK(flow_kl(mean, mref, n, tr.step_std, &kl));
            float s2 = kbh_sq_diff_sum(kb_in_f32(mean), kb_in_f32(mref), n);
            bkl = (s2 / (float)n) / (2.0f * (tr.step_std * tr.step_std));
            CHECK_MSG(same_f(bkl, kl), "kl %.9g vs %.9g", (double)bkl, (double)kl);
            float *dv = malloc(n * sizeof(float)), *bdv = malloc(n * sizeof(float));
            const float gl[3][2] = {{-0.37f, 0.0f}, {0.0f, 0.02f}, {0.81f, 0.04f}};
            for (int g = 0; g < 3; g++) {
                REQUIRE_OK(flow_sde_backward_v(&tr, mean, given, mref, n, gl[g][0], gl[g][1], dv));
                const float var = tr.step_std * tr.step_std, k = tr.coef_v / (var * (float)n);
                kbh_sde_backward_v(kb_out_f32(bdv), kb_in_f32(mean), kb_in_f32(given), kb_in_f32(mref), gl[g][0],
                                   gl[g][1], k, n);
                CHECK_MSG(same_bits(bdv, dv, n), "dv, g_logp %g g_kl %g", (double)gl[g][0], (double)gl[g][1]);
            }
            free(mean), free(xn), free(bmean), free(bxn), free(given), free(mref), free(dv), free(bdv);
        }
    }
    free(x), free(v), free(eps), free(vh);
}

TEST(kbody_cfg_matches_guidance) {
    const int64_t n = 10007;
    float *vc = frand(n, 11, -3, 3), *vu = frand(n, 12, -3, 3), *dv = frand(n, 13, -1, 1);
    float *v = malloc(n * sizeof(float)), *bv = malloc(n * sizeof(float)), *dc = malloc(n * sizeof(float)),
          *du = malloc(n * sizeof(float)), *bdc = malloc(n * sizeof(float)), *bdu = malloc(n * sizeof(float));
    const float gs[3] = {1.0f, 5.0f, 3.5f};
    for (int vb = 0; vb < 2; vb++) {
        kb_bf16 *hc = vb ? to_bf16_round(vc, n) : NULL, *hu = vb ? to_bf16_round(vu, n) : NULL;
        kb_in ic = vb ? kb_in_bf16(hc) : kb_in_f32(vc), iu = vb ? kb_in_bf16(hu) : kb_in_f32(vu);
        for (int k = 0; k < 3; k++) {
            flow_cfg_combine(v, vc, vu, gs[k], n);
            kbh_cfg_combine(kb_out_f32(bv), ic, iu, gs[k], n);
            CHECK_MSG(same_bits(bv, v, n), "cfg combine g %g, %s velocities", (double)gs[k], vb ? "bf16" : "fp32");
            flow_cfg_backward(dc, du, dv, gs[k], n);
            kbh_cfg_backward(kb_out_f32(bdc), kb_out_f32(bdu), kb_in_f32(dv), gs[k], n);
            CHECK(same_bits(bdc, dc, n) && same_bits(bdu, du, n));
        }
        free(hc), free(hu);
    }
    free(vc), free(vu), free(dv), free(v), free(bv), free(dc), free(du), free(bdc), free(bdu);
}

TEST(kbody_adamw_matches_optim) {
    const int64_t n = 3 * KB_SUMSQ_CHUNK + 5;
    float *p0 = frand(n, 21, -1, 1), *g = frand(n, 22, -0.1f, 0.1f);
    uint8_t *mask = malloc(n);
    for (int64_t i = 0; i < n; i++) mask[i] = (uint8_t)(i % 3 != 0);
    for (int gb = 0; gb < 2; gb++) {
        kb_bf16 *gh = gb ? to_bf16_round(g, n) : NULL;
        kb_in gin = gb ? kb_in_bf16(gh) : kb_in_f32(g);
        for (int mk = 0; mk < 2; mk++) {
            float *p = fcopy(p0, n), *bp = fcopy(p0, n), *m = calloc(n, 4), *v = calloc(n, 4), *bm = calloc(n, 4),
                  *bv = calloc(n, 4);
            kb_bf16 *ph = malloc(n * sizeof(kb_bf16));
            const double lr = 3e-4, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
            for (int64_t t = 1; t <= 3; t++) {
                optim_adamw_update(p, g, m, v, n, mk ? mask : NULL, lr, b1, b2, eps, wd, t);
                kbh_adamw(bp, bm, bv, gin, mk ? mask : NULL, kb_adamw_prepare(lr, b1, b2, eps, wd, t), ph, n);
            }
            CHECK_MSG(same_bits(bp, p, n) && same_bits(bm, m, n) && same_bits(bv, v, n),
                      "adamw, %s gradient, mask %d", gb ? "bf16" : "fp32", mk);
            int ok = 1;
            for (int64_t i = 0; i < n; i++) ok &= ph[i].bits == kb_bf16_from_f32(p[i]).bits;
            CHECK(ok);
            free(p), free(bp), free(m), free(v), free(bm), free(bv), free(ph);
        }
        /* the global norm's sum of squares, and the clip factor */
        double want = optim_sumsq(g, n), got = kbh_sumsq(gin, n);
        CHECK_MSG(memcmp(&want, &got, sizeof want) == 0, "sumsq %.17g vs %.17g", got, want);
        const double norms[3] = {0.5, 2.0, 1e6};
        for (int k = 0; k < 3; k++)
            for (int mx = 0; mx < 2; mx++) CHECK(kb_clip_coef(norms[k], mx ? 1.0 : 0.0) == optim_clip_coef(norms[k], mx ? 1.0 : 0.0));
        free(gh);
    }
    free(p0), free(g), free(mask);
}
