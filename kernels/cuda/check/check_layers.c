/* kernels/cuda/check/check_layers.c — the layer ops of k_cuda_ops against k_cpu_ops at Wan shapes: LayerNorm
 * (without and with affine), RMSNorm over the heads, RoPE, GELU-tanh, SiLU, AdaLN modulation (per sample and per
 * token) and gated residual, patchify/unpatchify, LSE merge; forward and backward.
 *
 * Expectations (the same as tests/test_kernel_bodies.c states for the bodies on the CPU): with the same inputs,
 * every bf16 output equals the CPU's fp32 result rounded to bf16 and every fp32 output (norm statistics, parameter
 * gradients) equals the CPU's bits (CK_EXACT; the rel-L2 band 2^-8 is then implied), since the GPU runs the same
 * bodies without contraction. Exception: the LSE merge calls expf/log1pf, whose CUDA and glibc versions differ by an
 * ulp or two (CK_BAND: bf16 outputs 2^-8, fp32 LSE 1e-6). Backward ops start from random accumulators (+=). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/check/check.h"
#include "kernels/cuda/check/check_util.h"

#define BF16_BAND 0.00390625 /* 2^-8: one RNE rounding to bf16 */

static float *copy_of(const float *x, size_t n) {
    float *y = ck_floats(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* ---- LayerNorm / RMSNorm ---- */

typedef struct {
    int rms, affine, N, C;
    ct_t x, w, b, out, mean, rstd, dout, dx, dw, db;
} norm_case;

static int norm_fwd_gpu(void *p) {
    norm_case *c = p;
    kb_in w = c->affine ? ct_in(&c->w) : CK_NO_IN, b = c->affine && !c->rms ? ct_in(&c->b) : CK_NO_IN;
    if (c->rms) return k_cuda_ops.rmsnorm_forward(ct_out(&c->out), c->rstd.d, ct_in(&c->x), w, c->N, c->C, 1e-6f);
    return k_cuda_ops.layernorm_forward(ct_out(&c->out), c->mean.d, c->rstd.d, ct_in(&c->x), w, b, c->N, c->C, 1e-6f);
}

static int norm_bwd_gpu(void *p) {
    norm_case *c = p;
    if (ct_push(&c->dx) || (c->affine && (ct_push(&c->dw) || (!c->rms && ct_push(&c->db))))) return -1;
    kb_in w = c->affine ? ct_in(&c->w) : CK_NO_IN;
    kb_out dw = c->affine ? ct_out(&c->dw) : CK_NO_OUT, db = c->affine && !c->rms ? ct_out(&c->db) : CK_NO_OUT;
    if (c->rms)
        return k_cuda_ops.rmsnorm_backward(ct_out(&c->dx), dw, ct_in(&c->dout), ct_in(&c->x), w, c->rstd.d, c->N, c->C);
    return k_cuda_ops.layernorm_backward(ct_out(&c->dx), dw, db, ct_in(&c->dout), ct_in(&c->x), w, c->mean.d,
                                         c->rstd.d, c->N, c->C);
}

static void check_norm(const ck_shapes *s, int rms, int affine, const char *only) {
    const char *name = rms ? (affine ? "rmsnorm" : "rmsnorm(no w)") : (affine ? "layernorm(affine)" : "layernorm");
    if (!ck_selected(name, only)) return;
    norm_case c;
    memset(&c, 0, sizeof c);
    c.rms = rms, c.affine = affine, c.N = s->S, c.C = s->D;
    const size_t n = (size_t)c.N * c.C;
    char shape[48], op[64];
    snprintf(shape, sizeof shape, "%dx%d", c.N, c.C);
    uint64_t seed = s->seed + 100 + 10 * rms + affine;
    if (ct_alloc(&c.x, n, 1) || ct_alloc(&c.w, c.C, 1) || ct_alloc(&c.b, c.C, 1) || ct_alloc(&c.out, n, 1) ||
        ct_alloc(&c.mean, c.N, 0) || ct_alloc(&c.rstd, c.N, 0) || ct_alloc(&c.dout, n, 1) || ct_alloc(&c.dx, n, 1) ||
        ct_alloc(&c.dw, c.C, 0) || ct_alloc(&c.db, c.C, 0) || ct_rand(&c.x, seed, -2.0f, 3.0f) ||
        ct_rand(&c.w, seed + 1, 0.5f, 1.5f) || ct_rand(&c.b, seed + 2, -0.5f, 0.5f) ||
        ct_rand(&c.dout, seed + 3, -1.0f, 1.0f)) {
        ck_row_error(name, shape, core_last_error());
        goto out;
    }
    ck_fill(c.dx.h, n, seed + 4, -1.0f, 1.0f, 1);
    ck_fill(c.dw.h, c.C, seed + 5, -1.0f, 1.0f, 0);
    ck_fill(c.db.h, c.C, seed + 6, -1.0f, 1.0f, 0);
    /* forward */
    float *g_out = ck_floats(n), *g_mean = ck_floats(c.N), *g_rstd = ck_floats(c.N);
    ct_t *fo[3] = {&c.out, &c.rstd, &c.mean};
    float *fg[3] = {g_out, g_rstd, g_mean};
    snprintf(op, sizeof op, "%s_forward", rms ? "rmsnorm" : "layernorm");
    int rep = ck_run_twice(op, norm_fwd_gpu, &c, fo, fg, rms ? 2 : 3);
    float *r_out = ck_floats(n), *r_mean = ck_floats(c.N), *r_rstd = ck_floats(c.N);
    const float *w = affine ? c.w.h : NULL, *b = affine && !rms ? c.b.h : NULL;
    if (rms)
        k_cpu_ops.rmsnorm_forward(r_out, r_rstd, c.x.h, w, c.N, c.C, 1e-6f);
    else
        k_cpu_ops.layernorm_forward(r_out, r_mean, r_rstd, c.x.h, w, b, c.N, c.C, 1e-6f);
    if (rep >= 0) {
        snprintf(op, sizeof op, "%s fwd out", name);
        ck_row(op, shape, 1, g_out, r_out, n, CK_EXACT, BF16_BAND, rep, NULL);
        if (!rms) {
            snprintf(op, sizeof op, "%s fwd mean", name);
            ck_row(op, shape, 0, g_mean, r_mean, c.N, CK_EXACT, 0.0, rep, NULL);
        }
        snprintf(op, sizeof op, "%s fwd rstd", name);
        ck_row(op, shape, 0, g_rstd, r_rstd, c.N, CK_EXACT, 0.0, rep, NULL);
    }
    /* backward: the GPU uses its own statistics, the CPU its own (equal when the rows above are exact) */
    float *g_dx = ck_floats(n), *g_dw = ck_floats(c.C), *g_db = ck_floats(c.C);
    ct_t *bo[3] = {&c.dx, &c.dw, &c.db};
    float *bg[3] = {g_dx, g_dw, g_db};
    snprintf(op, sizeof op, "%s_backward", rms ? "rmsnorm" : "layernorm");
    rep = ck_run_twice(op, norm_bwd_gpu, &c, bo, bg, affine ? (rms ? 2 : 3) : 1);
    float *r_dx = copy_of(c.dx.h, n), *r_dw = copy_of(c.dw.h, c.C), *r_db = copy_of(c.db.h, c.C);
    if (rms)
        k_cpu_ops.rmsnorm_backward(r_dx, affine ? r_dw : NULL, c.dout.h, c.x.h, w, r_rstd, c.N, c.C);
    else
        k_cpu_ops.layernorm_backward(r_dx, affine ? r_dw : NULL, affine ? r_db : NULL, c.dout.h, c.x.h, w, r_mean,
                                     r_rstd, c.N, c.C);
    if (rep >= 0) {
        snprintf(op, sizeof op, "%s bwd dx", name);
        ck_row(op, shape, 1, g_dx, r_dx, n, CK_EXACT, BF16_BAND, rep, NULL);
        if (affine) {
            snprintf(op, sizeof op, "%s bwd dw", name);
            ck_row(op, shape, 0, g_dw, r_dw, c.C, CK_EXACT, 0.0, rep, NULL);
            if (!rms) {
                snprintf(op, sizeof op, "%s bwd db", name);
                ck_row(op, shape, 0, g_db, r_db, c.C, CK_EXACT, 0.0, rep, NULL);
            }
        }
    }
    free(g_out), free(g_mean), free(g_rstd), free(r_out), free(r_mean), free(r_rstd);
    free(g_dx), free(g_dw), free(g_db), free(r_dx), free(r_dw), free(r_db);
out:
    ct_free(&c.x), ct_free(&c.w), ct_free(&c.b), ct_free(&c.out), ct_free(&c.mean), ct_free(&c.rstd);
    ct_free(&c.dout), ct_free(&c.dx), ct_free(&c.dw), ct_free(&c.db);
}

/* ---- RoPE ---- */

typedef struct {
    int S, H, Dh;
    ct_t x, out, dout, dx, cs, sn;
} rope_case;

static int rope_fwd_gpu(void *p) {
    rope_case *c = p;
    return k_cuda_ops.rope_forward(ct_out(&c->out), ct_in(&c->x), c->cs.d, c->sn.d, 1, c->S, c->H, c->Dh);
}
static int rope_bwd_gpu(void *p) {
    rope_case *c = p;
    if (ct_push(&c->dx)) return -1;
    return k_cuda_ops.rope_backward(ct_out(&c->dx), ct_in(&c->dout), c->cs.d, c->sn.d, 1, c->S, c->H, c->Dh);
}

static void check_rope(const ck_shapes *s, const char *only) {
    if (!ck_selected("rope", only)) return;
    rope_case c;
    memset(&c, 0, sizeof c);
    c.S = s->S, c.H = s->H, c.Dh = s->Dh;
    const size_t n = (size_t)c.S * c.H * c.Dh, nt = (size_t)c.S * (c.Dh / 2);
    char shape[48];
    snprintf(shape, sizeof shape, "1x%dx%dx%d", c.S, c.H, c.Dh);
    if (ct_alloc(&c.x, n, 1) || ct_alloc(&c.out, n, 1) || ct_alloc(&c.dout, n, 1) || ct_alloc(&c.dx, n, 1) ||
        ct_alloc(&c.cs, nt, 0) || ct_alloc(&c.sn, nt, 0) ||
        k_wan_rope_table(c.cs.h, c.sn.h, s->Fp, s->Hp, s->Wp, c.Dh, 10000.0, 1024) || ct_push(&c.cs) ||
        ct_push(&c.sn) || ct_rand(&c.x, s->seed + 200, -2, 2) || ct_rand(&c.dout, s->seed + 201, -1, 1)) {
        ck_row_error("rope", shape, core_last_error());
        goto out;
    }
    ck_fill(c.dx.h, n, s->seed + 202, -1, 1, 1);
    float *g = ck_floats(n), *r = ck_floats(n);
    ct_t *o1[1] = {&c.out};
    float *g1[1] = {g};
    int rep = ck_run_twice("rope_forward", rope_fwd_gpu, &c, o1, g1, 1);
    k_cpu_ops.rope_forward(r, c.x.h, c.cs.h, c.sn.h, 1, c.S, c.H, c.Dh);
    if (rep >= 0) ck_row("rope fwd", shape, 1, g, r, n, CK_EXACT, BF16_BAND, rep, NULL);
    ct_t *o2[1] = {&c.dx};
    rep = ck_run_twice("rope_backward", rope_bwd_gpu, &c, o2, g1, 1);
    memcpy(r, c.dx.h, n * sizeof(float));
    k_cpu_ops.rope_backward(r, c.dout.h, c.cs.h, c.sn.h, 1, c.S, c.H, c.Dh);
    if (rep >= 0) ck_row("rope bwd dx", shape, 1, g, r, n, CK_EXACT, BF16_BAND, rep, NULL);
    free(g), free(r);
out:
    ct_free(&c.x), ct_free(&c.out), ct_free(&c.dout), ct_free(&c.dx), ct_free(&c.cs), ct_free(&c.sn);
}

/* ---- GELU, SiLU ---- */

typedef struct {
    int gelu;
    int64_t n;
    ct_t x, out, dout, dx;
} act_case;

static int act_fwd_gpu(void *p) {
    act_case *c = p;
    return (c->gelu ? k_cuda_ops.gelu_forward : k_cuda_ops.silu_forward)(ct_out(&c->out), ct_in(&c->x), c->n);
}
static int act_bwd_gpu(void *p) {
    act_case *c = p;
    if (ct_push(&c->dx)) return -1;
    return (c->gelu ? k_cuda_ops.gelu_backward : k_cuda_ops.silu_backward)(ct_out(&c->dx), ct_in(&c->dout),
                                                                           ct_in(&c->x), c->n);
}

static void check_act(const ck_shapes *s, int gelu, const char *only) {
    const char *name = gelu ? "gelu" : "silu";
    if (!ck_selected(name, only)) return;
    act_case c;
    memset(&c, 0, sizeof c);
    c.gelu = gelu;
    const int rows = s->S, cols = gelu ? s->FFN : s->D; /* GELU: the FFN's hidden layer; SiLU: a [S, D] sample */
    c.n = (int64_t)rows * cols;
    char shape[48], op[48];
    snprintf(shape, sizeof shape, "%dx%d", rows, cols);
    if (ct_alloc(&c.x, c.n, 1) || ct_alloc(&c.out, c.n, 1) || ct_alloc(&c.dout, c.n, 1) || ct_alloc(&c.dx, c.n, 1) ||
        ct_rand(&c.x, s->seed + 300 + gelu, -6, 6) || ct_rand(&c.dout, s->seed + 302 + gelu, -1, 1)) {
        ck_row_error(name, shape, core_last_error());
        goto out;
    }
    ck_fill(c.dx.h, c.n, s->seed + 304 + gelu, -1, 1, 1);
    float *g = ck_floats(c.n), *r = ck_floats(c.n);
    ct_t *o1[1] = {&c.out};
    float *g1[1] = {g};
    snprintf(op, sizeof op, "%s_forward", name);
    int rep = ck_run_twice(op, act_fwd_gpu, &c, o1, g1, 1);
    (gelu ? k_cpu_ops.gelu_forward : k_cpu_ops.silu_forward)(r, c.x.h, c.n);
    snprintf(op, sizeof op, "%s fwd", name);
    if (rep >= 0) ck_row(op, shape, 1, g, r, c.n, CK_EXACT, BF16_BAND, rep, NULL);
    ct_t *o2[1] = {&c.dx};
    snprintf(op, sizeof op, "%s_backward", name);
    rep = ck_run_twice(op, act_bwd_gpu, &c, o2, g1, 1);
    memcpy(r, c.dx.h, c.n * sizeof(float));
    (gelu ? k_cpu_ops.gelu_backward : k_cpu_ops.silu_backward)(r, c.dout.h, c.x.h, c.n);
    snprintf(op, sizeof op, "%s bwd dx", name);
    if (rep >= 0) ck_row(op, shape, 1, g, r, c.n, CK_EXACT, BF16_BAND, rep, NULL);
    free(g), free(r);
out:
    ct_free(&c.x), ct_free(&c.out), ct_free(&c.dout), ct_free(&c.dx);
}

/* ---- AdaLN modulation and gated residual ---- */

/* per_token 0: shift/scale/gate rows 0/1/2 of a [1, 6, D] table (stride 6D); per_token 1 (Wan 2.2 TI2V): [S, D]
 * rows each (stride D) and no gate. Table gradients fp32. */
typedef struct {
    int per_token, S, D, stride;
    ct_t x, y, out, dout, dx, dy, shift, scale, gate, dshift, dscale, dgate;
} mod_case;

static int mod_fwd_gpu(void *p) {
    mod_case *c = p;
    return k_cuda_ops.modulate_forward(ct_out(&c->out), ct_in(&c->x), ct_in(&c->shift), ct_in(&c->scale), 1, c->S,
                                       c->D, c->per_token, c->stride);
}
static int mod_bwd_gpu(void *p) {
    mod_case *c = p;
    if (ct_push(&c->dx) || ct_push(&c->dshift) || ct_push(&c->dscale)) return -1;
    return k_cuda_ops.modulate_backward(ct_out(&c->dx), ct_out(&c->dshift), ct_out(&c->dscale), ct_in(&c->dout),
                                        ct_in(&c->x), ct_in(&c->scale), 1, c->S, c->D, c->per_token, c->stride);
}
static int gate_fwd_gpu(void *p) {
    mod_case *c = p;
    return k_cuda_ops.gate_residual_forward(ct_out(&c->out), ct_in(&c->x), ct_in(&c->y), ct_in(&c->gate), 1, c->S,
                                            c->D, 0, c->stride);
}
static int gate_bwd_gpu(void *p) {
    mod_case *c = p;
    if (ct_push(&c->dx) || ct_push(&c->dy) || ct_push(&c->dgate)) return -1;
    return k_cuda_ops.gate_residual_backward(ct_out(&c->dx), ct_out(&c->dy), ct_out(&c->dgate), ct_in(&c->dout),
                                             ct_in(&c->y), ct_in(&c->gate), 1, c->S, c->D, 0, c->stride);
}

static void check_modulate(const ck_shapes *s, int per_token, const char *only) {
    const char *name = per_token ? "modulate(per token)" : "modulate";
    if (!ck_selected(name, only)) return;
    mod_case c;
    memset(&c, 0, sizeof c);
    c.per_token = per_token, c.S = s->S, c.D = s->D, c.stride = per_token ? s->D : 6 * s->D;
    const size_t n = (size_t)c.S * c.D;
    char shape[48];
    snprintf(shape, sizeof shape, "1x%dx%d", c.S, c.D);
    /* per_token 0: each role (shift, scale, gate) gets its own 6D buffer read with row stride 6D, as rows of a
     * [1, 6, D] table are; per_token 1: [S, D] each, stride D */
    const size_t ntab = per_token ? n : (size_t)6 * c.D;
    uint64_t sd = s->seed + 400 + 10 * per_token;
    if (ct_alloc(&c.x, n, 1) || ct_alloc(&c.y, n, 1) || ct_alloc(&c.out, n, 1) || ct_alloc(&c.dout, n, 1) ||
        ct_alloc(&c.dx, n, 1) || ct_alloc(&c.dy, n, 1) || ct_alloc(&c.shift, ntab, 1) || ct_alloc(&c.scale, ntab, 1) ||
        ct_alloc(&c.gate, ntab, 1) || ct_alloc(&c.dshift, ntab, 0) || ct_alloc(&c.dscale, ntab, 0) ||
        ct_alloc(&c.dgate, ntab, 0) || ct_rand(&c.x, sd, -2, 2) || ct_rand(&c.y, sd + 1, -2, 2) ||
        ct_rand(&c.dout, sd + 2, -1, 1) || ct_rand(&c.shift, sd + 3, -0.5f, 0.5f) ||
        ct_rand(&c.scale, sd + 4, -0.5f, 0.5f) || ct_rand(&c.gate, sd + 5, -1, 1)) {
        ck_row_error(name, shape, core_last_error());
        goto out;
    }
    ck_fill(c.dx.h, n, sd + 6, -1, 1, 1);
    ck_fill(c.dy.h, n, sd + 7, -1, 1, 1);
    ck_fill(c.dshift.h, ntab, sd + 8, -1, 1, 0);
    ck_fill(c.dscale.h, ntab, sd + 9, -1, 1, 0);
    ck_fill(c.dgate.h, ntab, sd + 10, -1, 1, 0);
    float *g = ck_floats(n), *r = ck_floats(n), *g2 = ck_floats(n), *r2 = ck_floats(n);
    float *gs = ck_floats(ntab), *gc = ck_floats(ntab), *rs = copy_of(c.dshift.h, ntab), *rc = copy_of(c.dscale.h, ntab);
    char op[64];
    ct_t *o1[1] = {&c.out};
    float *g1[1] = {g};
    int rep = ck_run_twice("modulate_forward", mod_fwd_gpu, &c, o1, g1, 1);
    k_cpu_ops.modulate_forward(r, c.x.h, c.shift.h, c.scale.h, 1, c.S, c.D, per_token, c.stride);
    snprintf(op, sizeof op, "%s fwd", name);
    if (rep >= 0) ck_row(op, shape, 1, g, r, n, CK_EXACT, BF16_BAND, rep, NULL);
    ct_t *o3[3] = {&c.dx, &c.dshift, &c.dscale};
    float *g3[3] = {g, gs, gc};
    rep = ck_run_twice("modulate_backward", mod_bwd_gpu, &c, o3, g3, 3);
    memcpy(r, c.dx.h, n * sizeof(float));
    k_cpu_ops.modulate_backward(r, rs, rc, c.dout.h, c.x.h, c.scale.h, 1, c.S, c.D, per_token, c.stride);
    if (rep >= 0) {
        snprintf(op, sizeof op, "%s bwd dx", name);
        ck_row(op, shape, 1, g, r, n, CK_EXACT, BF16_BAND, rep, NULL);
        snprintf(op, sizeof op, "%s bwd dshift", name);
        ck_row(op, shape, 0, gs, rs, ntab, CK_EXACT, 0.0, rep, NULL);
        snprintf(op, sizeof op, "%s bwd dscale", name);
        ck_row(op, shape, 0, gc, rc, ntab, CK_EXACT, 0.0, rep, NULL);
    }
    if (!per_token && ck_selected("gate_residual", only)) {
        rep = ck_run_twice("gate_residual_forward", gate_fwd_gpu, &c, o1, g1, 1);
        k_cpu_ops.gate_residual_forward(r, c.x.h, c.y.h, c.gate.h, 1, c.S, c.D, 0, c.stride);
        if (rep >= 0) ck_row("gate_residual fwd", shape, 1, g, r, n, CK_EXACT, BF16_BAND, rep, NULL);
        ct_t *o4[3] = {&c.dx, &c.dy, &c.dgate};
        float *g4[3] = {g, g2, gs};
        rep = ck_run_twice("gate_residual_backward", gate_bwd_gpu, &c, o4, g4, 3);
        memcpy(r, c.dx.h, n * sizeof(float));
        memcpy(r2, c.dy.h, n * sizeof(float));
        memcpy(rs, c.dgate.h, ntab * sizeof(float));
        k_cpu_ops.gate_residual_backward(r, r2, rs, c.dout.h, c.y.h, c.gate.h, 1, c.S, c.D, 0, c.stride);
        if (rep >= 0) {
            ck_row("gate_residual bwd dx", shape, 1, g, r, n, CK_EXACT, BF16_BAND, rep, NULL);
            ck_row("gate_residual bwd dy", shape, 1, g2, r2, n, CK_EXACT, BF16_BAND, rep, NULL);
            ck_row("gate_residual bwd dgate", shape, 0, gs, rs, ntab, CK_EXACT, 0.0, rep, NULL);
        }
    }
    free(g), free(r), free(g2), free(r2), free(gs), free(gc), free(rs), free(rc);
out:
    ct_free(&c.x), ct_free(&c.y), ct_free(&c.out), ct_free(&c.dout), ct_free(&c.dx), ct_free(&c.dy);
    ct_free(&c.shift), ct_free(&c.scale), ct_free(&c.gate), ct_free(&c.dshift), ct_free(&c.dscale), ct_free(&c.dgate);
}

/* ---- patchify / unpatchify ---- */

typedef struct {
    const ck_shapes *s;
    int kind; /* 0 patchify fwd, 1 patchify bwd, 2 unpatchify fwd, 3 unpatchify bwd */
    ct_t *in, *out;
} patch_case;

static int patch_gpu(void *p) {
    patch_case *c = p;
    const ck_shapes *s = c->s;
    if ((c->kind == 1 || c->kind == 3) && ct_push(c->out)) return -1;
    int (*f)(kb_out, kb_in, int, int, int, int, int, int, int, int) =
        c->kind == 0 ? k_cuda_ops.patchify_forward
                     : c->kind == 1 ? k_cuda_ops.patchify_backward
                                    : c->kind == 2 ? k_cuda_ops.unpatchify_forward : k_cuda_ops.unpatchify_backward;
    return f(ct_out(c->out), ct_in(c->in), 1, s->C, s->F, s->Hl, s->Wl, s->pt, s->ph, s->pw);
}

static void check_patch(const ck_shapes *s, const char *only) {
    if (!ck_selected("patchify", only) && !ck_selected("unpatchify", only)) return;
    const size_t nv = (size_t)s->C * s->F * s->Hl * s->Wl, nt = (size_t)s->S * s->C * s->pt * s->ph * s->pw;
    char shape[48];
    snprintf(shape, sizeof shape, "%dx%dx%dx%d p%d%d%d", s->C, s->F, s->Hl, s->Wl, s->pt, s->ph, s->pw);
    ct_t vid, tok, otok, ovid;
    memset(&vid, 0, sizeof vid), memset(&tok, 0, sizeof tok), memset(&otok, 0, sizeof otok), memset(&ovid, 0, sizeof ovid);
    if (ct_alloc(&vid, nv, 1) || ct_alloc(&tok, nt, 1) || ct_alloc(&otok, nt, 1) || ct_alloc(&ovid, nv, 1) ||
        ct_rand(&vid, s->seed + 500, -2, 2) || ct_rand(&tok, s->seed + 501, -2, 2)) {
        ck_row_error("patchify", shape, core_last_error());
        goto out;
    }
    float *g = ck_floats(nv > nt ? nv : nt), *r = ck_floats(nv > nt ? nv : nt);
    static const char *names[4] = {"patchify fwd", "patchify bwd dx", "unpatchify fwd", "unpatchify bwd dx"};
    for (int kind = 0; kind < 4; kind++) {
        patch_case c = {s, kind, kind == 0 ? &vid : kind == 1 ? &tok : kind == 2 ? &tok : &vid,
                        kind == 0 ? &otok : kind == 1 ? &ovid : kind == 2 ? &ovid : &otok};
        if (kind == 1) ck_fill(ovid.h, nv, s->seed + 502, -1, 1, 1);
        if (kind == 3) ck_fill(otok.h, nt, s->seed + 503, -1, 1, 1);
        ct_t *o[1] = {c.out};
        float *gg[1] = {g};
        int rep = ck_run_twice(names[kind], patch_gpu, &c, o, gg, 1);
        size_t n = c.out->n;
        memcpy(r, c.out->h, n * sizeof(float));
        if (kind == 0) k_cpu_ops.patchify_forward(r, vid.h, 1, s->C, s->F, s->Hl, s->Wl, s->pt, s->ph, s->pw);
        if (kind == 1) k_cpu_ops.patchify_backward(r, tok.h, 1, s->C, s->F, s->Hl, s->Wl, s->pt, s->ph, s->pw);
        if (kind == 2) k_cpu_ops.unpatchify_forward(r, tok.h, 1, s->C, s->F, s->Hl, s->Wl, s->pt, s->ph, s->pw);
        if (kind == 3) k_cpu_ops.unpatchify_backward(r, vid.h, 1, s->C, s->F, s->Hl, s->Wl, s->pt, s->ph, s->pw);
        if (rep >= 0) ck_row(names[kind], shape, 1, g, r, n, CK_EXACT, kind % 2 ? BF16_BAND : 0.0, rep, NULL);
    }
    free(g), free(r);
out:
    ct_free(&vid), ct_free(&tok), ct_free(&otok), ct_free(&ovid);
}

/* ---- LSE merge ---- */

typedef struct {
    int S, H, Dh;
    ct_t o1, o2, l1, l2, o, l, dout, dl, do1, do2, dl1, dl2;
} lse_case;

static int lse_fwd_gpu(void *p) {
    lse_case *c = p;
    return k_cuda_ops.lse_merge_forward(ct_out(&c->o), c->l.d, ct_in(&c->o1), c->l1.d, ct_in(&c->o2), c->l2.d, 1,
                                        c->S, c->H, c->Dh);
}
static int lse_bwd_gpu(void *p) {
    lse_case *c = p;
    if (ct_push(&c->do1) || ct_push(&c->do2) || ct_push(&c->dl1) || ct_push(&c->dl2)) return -1;
    return k_cuda_ops.lse_merge_backward(ct_out(&c->do1), c->dl1.d, ct_out(&c->do2), c->dl2.d, ct_in(&c->dout),
                                         c->dl.d, ct_in(&c->o1), c->l1.d, ct_in(&c->o2), c->l2.d, 1, c->S, c->H,
                                         c->Dh);
}

static void check_lse_merge(const ck_shapes *s, const char *only) {
    if (!ck_selected("lse_merge", only)) return;
    lse_case c;
    memset(&c, 0, sizeof c);
    c.S = s->S, c.H = s->H, c.Dh = s->Dh;
    const size_t n = (size_t)c.S * c.H * c.Dh, nl = (size_t)c.H * c.S;
    char shape[48];
    snprintf(shape, sizeof shape, "1x%dx%dx%d", c.S, c.H, c.Dh);
    uint64_t sd = s->seed + 600;
    if (ct_alloc(&c.o1, n, 1) || ct_alloc(&c.o2, n, 1) || ct_alloc(&c.o, n, 1) || ct_alloc(&c.dout, n, 1) ||
        ct_alloc(&c.do1, n, 1) || ct_alloc(&c.do2, n, 1) || ct_alloc(&c.l1, nl, 0) || ct_alloc(&c.l2, nl, 0) ||
        ct_alloc(&c.l, nl, 0) || ct_alloc(&c.dl, nl, 0) || ct_alloc(&c.dl1, nl, 0) || ct_alloc(&c.dl2, nl, 0) ||
        ct_rand(&c.o1, sd, -1, 1) || ct_rand(&c.o2, sd + 1, -1, 1) || ct_rand(&c.dout, sd + 2, -1, 1) ||
        ct_rand(&c.l1, sd + 3, -3, 5) || ct_rand(&c.l2, sd + 4, -3, 5) || ct_rand(&c.dl, sd + 5, -1, 1)) {
        ck_row_error("lse_merge", shape, core_last_error());
        goto out;
    }
    ck_fill(c.do1.h, n, sd + 6, -1, 1, 1);
    ck_fill(c.do2.h, n, sd + 7, -1, 1, 1);
    ck_fill(c.dl1.h, nl, sd + 8, -1, 1, 0);
    ck_fill(c.dl2.h, nl, sd + 9, -1, 1, 0);
    float *g = ck_floats(n), *gl = ck_floats(nl), *r = ck_floats(n), *rl = ck_floats(nl);
    ct_t *o2[2] = {&c.o, &c.l};
    float *g2[2] = {g, gl};
    int rep = ck_run_twice("lse_merge_forward", lse_fwd_gpu, &c, o2, g2, 2);
    k_cpu_ops.lse_merge_forward(r, rl, c.o1.h, c.l1.h, c.o2.h, c.l2.h, 1, c.S, c.H, c.Dh);
    const char *why = "expf/log1pf: CUDA vs glibc";
    if (rep >= 0) {
        ck_row("lse_merge fwd o", shape, 1, g, r, n, CK_BAND, BF16_BAND, rep, why);
        ck_row("lse_merge fwd lse", shape, 0, gl, rl, nl, CK_BAND, 1e-6, rep, why);
    }
    float *gb = ck_floats(n), *gd1 = ck_floats(nl), *gd2 = ck_floats(nl);
    float *rb1 = copy_of(c.do1.h, n), *rb2 = copy_of(c.do2.h, n), *rd1 = copy_of(c.dl1.h, nl), *rd2 = copy_of(c.dl2.h, nl);
    ct_t *o4[4] = {&c.do1, &c.do2, &c.dl1, &c.dl2};
    float *g4[4] = {g, gb, gd1, gd2};
    rep = ck_run_twice("lse_merge_backward", lse_bwd_gpu, &c, o4, g4, 4);
    k_cpu_ops.lse_merge_backward(rb1, rd1, rb2, rd2, c.dout.h, c.dl.h, c.o1.h, c.l1.h, c.o2.h, c.l2.h, 1, c.S, c.H,
                                 c.Dh);
    if (rep >= 0) {
        ck_row("lse_merge bwd do1", shape, 1, g, rb1, n, CK_BAND, BF16_BAND, rep, why);
        ck_row("lse_merge bwd do2", shape, 1, gb, rb2, n, CK_BAND, BF16_BAND, rep, why);
        ck_row("lse_merge bwd dlse1", shape, 0, gd1, rd1, nl, CK_BAND, 1e-6, rep, why);
        ck_row("lse_merge bwd dlse2", shape, 0, gd2, rd2, nl, CK_BAND, 1e-6, rep, why);
    }
    free(g), free(gl), free(r), free(rl), free(gb), free(gd1), free(gd2), free(rb1), free(rb2), free(rd1), free(rd2);
out:
    ct_free(&c.o1), ct_free(&c.o2), ct_free(&c.o), ct_free(&c.dout), ct_free(&c.do1), ct_free(&c.do2);
    ct_free(&c.l1), ct_free(&c.l2), ct_free(&c.l), ct_free(&c.dl), ct_free(&c.dl1), ct_free(&c.dl2);
}

void check_layers(const ck_shapes *s, const char *only) {
    check_norm(s, 0, 0, only);
    check_norm(s, 0, 1, only);
    check_norm(s, 1, 1, only);
    check_rope(s, only);
    check_act(s, 1, only);
    check_act(s, 0, only);
    check_modulate(s, 0, only);
    check_modulate(s, 1, only);
    check_patch(s, only);
    check_lse_merge(s, only);
}
