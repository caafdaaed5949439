/* kernels/cuda/check/check_flow.c — the flow and optimizer ops of k_cuda_ops against the same kernel bodies run on
 * the CPU (kernels/body/kb_host.h), which tests/test_kernel_bodies_flow.c proves bit-identical to model/flow
 * (flow_sde_step, flow_kl, flow_sde_backward_v, flow_cfg_*) and trainer/optim (optim_adamw_update, optim_sumsq).
 * Expectation: every output, sum, log-prob and parameter bit-identical (CK_EXACT), since docs/design.md section 4 keeps
 * this arithmetic fp32 on the GPU and the fixed reduction order is the CPU's. Shapes: one Wan 2.1 latent
 * (16 x 21 x 60 x 104 = 2,096,640 elements, velocity in bf16 as the model returns it) and a 64M-parameter slice of
 * the optimizer state. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/body/kb_host.h"
#include "kernels/cuda/check/check.h"
#include "kernels/cuda/check/check_util.h"

typedef struct {
    int64_t n;
    int mode; /* 0 rollout (eps), 1 trainer (recorded x_next) */
    float cx, cv, std;
    ct_t x, v, eps, given, mean, xn;
    float sum, sum_prev; /* this run's sum of squares, and the previous run's */
} sde_case;

static int sde_gpu(void *p) {
    sde_case *c = p;
    c->sum_prev = c->sum;
    return k_cuda_ops.sde_step(ct_in(&c->x), ct_in(&c->v), c->mode == 0 ? ct_in(&c->eps) : CK_NO_IN,
                               c->mode == 1 ? ct_in(&c->given) : CK_NO_IN, ct_out(&c->mean),
                               c->mode == 0 ? ct_out(&c->xn) : CK_NO_OUT, c->cx, c->cv, c->std, 1, c->n, &c->sum);
}

typedef struct {
    int64_t n;
    float g_logp, g_kl, k, cfg;
    ct_t mean, xn, mref, dv, vc, vu, v, dvc, dvu;
    float sum;
} flow2_case;

static int kl_gpu(void *p) {
    flow2_case *c = p;
    return k_cuda_ops.sq_diff_sum(ct_in(&c->mean), ct_in(&c->mref), c->n, &c->sum);
}
static int dv_gpu(void *p) {
    flow2_case *c = p;
    return k_cuda_ops.sde_backward_v(ct_out(&c->dv), ct_in(&c->mean), ct_in(&c->xn), ct_in(&c->mref), c->g_logp,
                                     c->g_kl, c->k, c->n);
}
static int cfg_gpu(void *p) {
    flow2_case *c = p;
    return k_cuda_ops.cfg_combine(ct_out(&c->v), ct_in(&c->vc), ct_in(&c->vu), c->cfg, c->n);
}
static int cfg_bwd_gpu(void *p) {
    flow2_case *c = p;
    return k_cuda_ops.cfg_backward(ct_out(&c->dvc), ct_out(&c->dvu), ct_in(&c->dv), c->cfg, c->n);
}

typedef struct {
    int64_t n;
    kb_adamw_scalars sc;
    ct_t p, m, v, g, pb;
    double ss;
} opt_case;

static int adamw_gpu(void *q) {
    opt_case *c = q;
    if (ct_push(&c->p) || ct_push(&c->m) || ct_push(&c->v)) return -1;
    return k_cuda_ops.adamw_update(c->p.d, c->m.d, c->v.d, ct_in(&c->g), NULL, c->sc, c->pb.d, c->n);
}
static int sumsq_gpu(void *q) {
    opt_case *c = q;
    return k_cuda_ops.sumsq(ct_in(&c->g), c->n, &c->ss);
}

/* A row for one host scalar computed twice on the GPU. */
static void scalar_row(const char *op, const char *shape, float got, float got2, float ref, const char *note) {
    ck_row(op, shape, 0, &got, &ref, 1, CK_EXACT, 0.0, memcmp(&got, &got2, sizeof got) == 0, note);
}

void check_flow(const ck_shapes *s, const char *only) {
    const int64_t n = (int64_t)s->C * s->F * s->Hl * s->Wl;
    char shape[48];
    snprintf(shape, sizeof shape, "%dx%dx%dx%d", s->C, s->F, s->Hl, s->Wl);
    if (ck_selected("sde_step", only)) {
        /* an interior step of a 50-step shift-5 schedule at eta 0.7 (the scalars as flow_step_init forms them) */
        const float sigma = 0.8f, sigma_next = 0.78f, eta = 0.7f;
        sde_case c;
        memset(&c, 0, sizeof c);
        c.n = n;
        const float dt = sigma_next - sigma, std_t = eta * sqrtf(sigma / (1.0f - sigma));
        const float w = std_t * std_t, two_sigma = 2.0f * sigma;
        c.std = std_t * sqrtf(-dt);
        c.cx = 1.0f + (w / two_sigma) * dt;
        c.cv = (1.0f + w * (1.0f - sigma) / two_sigma) * dt;
        if (ct_alloc(&c.x, n, 0) || ct_alloc(&c.v, n, 1) || ct_alloc(&c.eps, n, 0) || ct_alloc(&c.given, n, 0) ||
            ct_alloc(&c.mean, n, 0) || ct_alloc(&c.xn, n, 0) || ct_rand(&c.x, s->seed + 1000, -2, 2) ||
            ct_rand(&c.v, s->seed + 1001, -2, 2) || ct_rand(&c.eps, s->seed + 1002, -3, 3)) {
            ck_row_error("sde_step", shape, core_last_error());
        } else {
            for (c.mode = 0; c.mode < 2; c.mode++) {
                float *gm = ck_floats(n), *gx = ck_floats(n), *rm = ck_floats(n), *rx = ck_floats(n);
                ct_t *o[2] = {&c.mean, &c.xn};
                float *g[2] = {gm, gx};
                const char *nm = c.mode ? "sde_step (trainer) " : "sde_step (rollout) ";
                char op[64];
                snprintf(op, sizeof op, "%smean", nm);
                int rep = ck_run_twice(op, sde_gpu, &c, o, g, c.mode ? 1 : 2);
                float rsum = kbh_sde_step(kb_in_f32(c.x.h), kb_in_f32(c.v.h), c.mode ? CK_NO_IN : kb_in_f32(c.eps.h),
                                          c.mode ? kb_in_f32(c.given.h) : CK_NO_IN, kb_out_f32(rm),
                                          c.mode ? CK_NO_OUT : kb_out_f32(rx), c.cx, c.cv, c.std, 1, n);
                if (rep >= 0) {
                    ck_row(op, shape, 0, gm, rm, n, CK_EXACT, 0.0, rep, "v in bf16");
                    if (!c.mode) {
                        snprintf(op, sizeof op, "%sx_next", nm);
                        ck_row(op, shape, 0, gx, rx, n, CK_EXACT, 0.0, rep, NULL);
                        memcpy(c.given.h, gx, n * sizeof(float)); /* the trainer re-scores this x_next */
                        ct_push(&c.given);
                    }
                    float lg = kb_sde_logp_from_sum(c.sum_prev, n, c.std), lg2 = kb_sde_logp_from_sum(c.sum, n, c.std);
                    float lr = kb_sde_logp_from_sum(rsum, n, c.std);
                    snprintf(op, sizeof op, "%slog-prob", nm);
                    scalar_row(op, shape, lg, lg2, lr, "fixed-order sum, then flow_sde_step's formula");
                }
                free(gm), free(gx), free(rm), free(rx);
            }
        }
        ct_free(&c.x), ct_free(&c.v), ct_free(&c.eps), ct_free(&c.given), ct_free(&c.mean), ct_free(&c.xn);
    }
    if (ck_selected("kl", only) || ck_selected("sde_backward", only) || ck_selected("cfg", only)) {
        flow2_case c;
        memset(&c, 0, sizeof c);
        c.n = n, c.g_logp = -0.37f, c.g_kl = 0.04f, c.k = -1.3e-6f, c.cfg = 5.0f;
        if (ct_alloc(&c.mean, n, 0) || ct_alloc(&c.xn, n, 0) || ct_alloc(&c.mref, n, 0) || ct_alloc(&c.dv, n, 0) ||
            ct_alloc(&c.vc, n, 1) || ct_alloc(&c.vu, n, 1) || ct_alloc(&c.v, n, 0) || ct_alloc(&c.dvc, n, 0) ||
            ct_alloc(&c.dvu, n, 0) || ct_rand(&c.mean, s->seed + 1010, -2, 2) || ct_rand(&c.xn, s->seed + 1011, -2, 2) ||
            ct_rand(&c.mref, s->seed + 1012, -2, 2) || ct_rand(&c.vc, s->seed + 1013, -2, 2) ||
            ct_rand(&c.vu, s->seed + 1014, -2, 2)) {
            ck_row_error("kl / sde_backward / cfg", shape, core_last_error());
        } else {
            if (k_cuda_ops.sq_diff_sum(ct_in(&c.mean), ct_in(&c.mref), n, &c.sum) == 0) {
                float s1 = c.sum;
                if (kl_gpu(&c) == 0) {
                    float r = kbh_sq_diff_sum(kb_in_f32(c.mean.h), kb_in_f32(c.mref.h), n);
                    scalar_row("kl sum (mean - mean_ref)^2", shape, s1, c.sum, r, "flow_kl's fixed-order sum");
                }
            } else {
                ck_row_error("kl sum", shape, core_last_error());
            }
            float *g = ck_floats(n), *r = ck_floats(n), *g2 = ck_floats(n), *r2 = ck_floats(n);
            ct_t *o1[1] = {&c.dv};
            float *gg[1] = {g};
            int rep = ck_run_twice("sde_backward_v", dv_gpu, &c, o1, gg, 1);
            kbh_sde_backward_v(kb_out_f32(r), kb_in_f32(c.mean.h), kb_in_f32(c.xn.h), kb_in_f32(c.mref.h), c.g_logp,
                               c.g_kl, c.k, n);
            if (rep >= 0) ck_row("sde_backward_v dv", shape, 0, g, r, n, CK_EXACT, 0.0, rep, NULL);
            ct_t *o2[1] = {&c.v};
            rep = ck_run_twice("cfg_combine", cfg_gpu, &c, o2, gg, 1);
            kbh_cfg_combine(kb_out_f32(r), kb_in_f32(c.vc.h), kb_in_f32(c.vu.h), c.cfg, n);
            if (rep >= 0) ck_row("cfg_combine v", shape, 0, g, r, n, CK_EXACT, 0.0, rep, "v_c, v_u in bf16");
            memcpy(c.dv.h, r, n * sizeof(float)); /* any fp32 gradient */
            ct_push(&c.dv);
            ct_t *o3[2] = {&c.dvc, &c.dvu};
            float *g3[2] = {g, g2};
            rep = ck_run_twice("cfg_backward", cfg_bwd_gpu, &c, o3, g3, 2);
            kbh_cfg_backward(kb_out_f32(r), kb_out_f32(r2), kb_in_f32(c.dv.h), c.cfg, n);
            if (rep >= 0) {
                ck_row("cfg_backward dv_c", shape, 0, g, r, n, CK_EXACT, 0.0, rep, NULL);
                ck_row("cfg_backward dv_u", shape, 0, g2, r2, n, CK_EXACT, 0.0, rep, NULL);
            }
            free(g), free(r), free(g2), free(r2);
        }
        ct_free(&c.mean), ct_free(&c.xn), ct_free(&c.mref), ct_free(&c.dv), ct_free(&c.vc), ct_free(&c.vu);
        ct_free(&c.v), ct_free(&c.dvc), ct_free(&c.dvu);
    }
    if (ck_selected("adamw", only) || ck_selected("sumsq", only)) {
        opt_case c;
        memset(&c, 0, sizeof c);
        c.n = s->adamw_n > 0 ? (int64_t)s->adamw_n : (int64_t)64 << 20;
        c.sc = kb_adamw_prepare(3e-5, 0.9, 0.999, 1e-8, 1e-4, 7);
        char sh[48];
        snprintf(sh, sizeof sh, "%lld params", (long long)c.n);
        if (ct_alloc(&c.p, c.n, 0) || ct_alloc(&c.m, c.n, 0) || ct_alloc(&c.v, c.n, 0) || ct_alloc(&c.g, c.n, 0) ||
            ct_alloc(&c.pb, c.n, 1) || ct_rand(&c.g, s->seed + 1020, -0.01f, 0.01f)) {
            ck_row_error("adamw", sh, core_last_error());
        } else {
            ck_fill(c.p.h, c.n, s->seed + 1021, -0.1f, 0.1f, 0);
            ck_fill(c.m.h, c.n, s->seed + 1022, -0.001f, 0.001f, 0);
            ck_fill(c.v.h, c.n, s->seed + 1023, 0.0f, 1e-5f, 0);
            float *gp = ck_floats(c.n), *gm = ck_floats(c.n), *gv = ck_floats(c.n), *gb = ck_floats(c.n);
            ct_t *o[4] = {&c.p, &c.m, &c.v, &c.pb};
            float *g[4] = {gp, gm, gv, gb};
            int rep = ck_run_twice("adamw_update", adamw_gpu, &c, o, g, 4);
            float *rp = ck_floats(c.n), *rm = ck_floats(c.n), *rv = ck_floats(c.n);
            kb_bf16 *rb = malloc(c.n * sizeof(kb_bf16));
            memcpy(rp, c.p.h, c.n * 4), memcpy(rm, c.m.h, c.n * 4), memcpy(rv, c.v.h, c.n * 4);
            kbh_adamw(rp, rm, rv, kb_in_f32(c.g.h), NULL, c.sc, rb, c.n);
            if (rep >= 0) {
                ck_row("adamw p (fp32 master)", sh, 0, gp, rp, c.n, CK_EXACT, 0.0, rep, "optim_adamw_update's order");
                ck_row("adamw m", sh, 0, gm, rm, c.n, CK_EXACT, 0.0, rep, NULL);
                ck_row("adamw v", sh, 0, gv, rv, c.n, CK_EXACT, 0.0, rep, NULL);
                ck_row("adamw p (bf16 copy)", sh, 1, gb, rp, c.n, CK_EXACT, 0.00390625, rep, NULL);
            }
            free(gp), free(gm), free(gv), free(gb), free(rp), free(rm), free(rv), free(rb);
            double s1 = 0, s2 = 0;
            if (sumsq_gpu(&c) == 0) {
                s1 = c.ss;
                if (sumsq_gpu(&c) == 0) {
                    s2 = c.ss;
                    double r = kbh_sumsq(kb_in_f32(c.g.h), c.n);
                    char txt[200];
                    int same = memcmp(&s1, &r, sizeof r) == 0, rep2 = memcmp(&s1, &s2, sizeof s1) == 0;
                    snprintf(txt, sizeof txt, "%.17g vs CPU %.17g: %s, repeat %s -> %s", s1, r,
                             same ? "same bits" : "DIFFER", rep2 ? "same" : "DIFFER", same && rep2 ? "ok" : "FAIL");
                    ck_row_info("sumsq (grad norm^2, double)", sh, txt);
                    if (!(same && rep2)) ck_row_error("sumsq", sh, "the sum of squares differs from optim_sumsq's");
                }
            } else {
                ck_row_error("sumsq", sh, core_last_error());
            }
        }
        ct_free(&c.p), ct_free(&c.m), ct_free(&c.v), ct_free(&c.g), ct_free(&c.pb);
    }
}
