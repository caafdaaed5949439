/* model/dit/check/check_dit.c — the GPU check's Wan DiT rows: a 2-block Wan transformer forward
 * and backward on the device table (model/dit/wan_dev.h over k_cuda_ops) against the fp32 CPU model in the same
 * binary (wan_dev_compare: the same comparison tests/test_wan_dev.c runs on the emulated device), at a small config
 * with Wan's head dim: dim 256 = 2 heads x 128, FFN 768, text 256, 16 latent channels, patch (1, 2, 2); batch 2, 3 x
 * 16 x 16 latent (192 tokens), 32 text tokens. Two cases: cross_attn_norm with one timestep per sample (Wan 2.1), and
 * no cross_attn_norm with per-token timesteps (Wan 2.2 TI2V). Weights: wan_params_init_random, then the biases
 * uniform in [-0.5, 0.5) and the norm weights in [0.6, 1.4), so that no term hides behind a zero.
 *
 * First the glue ops the DiT added to the table (add_table forward/backward per sample and broadcast, add) against
 * model/dit/wan_layers.c at the check's model dim, bit for bit. Then, per case (bands: WAN_DEV_BAND_* of wan_dev.h,
 * the test's):
 *   wan dit fwd out         rel-L2 of the velocity; worst = max|dev - cpu| / max|cpu|; repeat = the forward twice
 *   wan dit bwd grads       rel-L2 of the whole parameter gradient; worst = the worst tensor but the key biases (named)
 *                           (fails past the band too); repeat = RECOMPUTE's gradients vs STORE's, bit for bit
 *   wan dit bwd key biases  the worst of attn1/attn2.to_k.bias (a cancelling sum: see wan_dev.h)
 *   wan dit bwd dx / denc   the input gradients
 *   wan dit batch mates     info: sample 1 alone vs in the batch of 2, bit for bit (GEMM/attention batch invariance,
 *                           which vgrpo parity on the GPU needs; not yet guaranteed by the GEMM: kernels/cuda/README.md)
 *   wan dit lora ...        a rank-16 LoRA adapter on every linear of the Wan 2.1 case (frozen base): the output and
 *                           the adapter's gradients (worst tensor named) vs the fp32 CPU model with the same adapter
 * Registered from a constructor (check.h: kernels/ may not call into model/); linked into gpu_check and
 * gpu_check_emu only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/check/check.h"
#include "kernels/cuda/check/check_util.h"
#include "model/dit/wan_dev.h"
#include "model/dit/wan_internal.h"
#include "model/dit/wan_lora.h"

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Biases uniform in [-0.5, 0.5), norm weights in [0.6, 1.4) (1-D tensors but the tables). */
static void perturb(wan_model *m, uint64_t seed) {
    for (int i = 0; i < m->layout.count; i++) {
        const wan_tensor *t = &m->layout.tensors[i];
        if (t->ndim != 1) continue;
        const int norm = strstr(t->name, ".norm") != NULL;
        float *p = m->params + t->offset;
        for (int64_t j = 0; j < t->numel; j++) {
            double u = (double)(mix(seed * 0x9e3779b97f4a7c15ull + (uint64_t)i * 1000003u + (uint64_t)j) >> 11) *
                       (1.0 / 9007199254740992.0);
            p[j] = norm ? (float)(0.6 + 0.8 * u) : (float)(u - 0.5);
        }
    }
}

/* blocks: 2 (the "dit" group), or 1 (the "block" group of stage 1: one DiT block, rows named "wan dit block"). */
static void one_case(const ck_shapes *s, int per_token, int blocks, const char *only) {
    const char *tag = blocks == 1 ? "wan dit block" : per_token ? "wan dit (ti2v)" : "wan dit";
    if (!ck_selected(tag, only)) return;
    wan_config c = {{1, 2, 2}, 2, 128, 16, 16, 256, 256, 768, blocks, !per_token, 1e-6, 1024};
    wan_shape sh = {2, 3, 16, 16, 32, per_token};
    char shape[48], op[64], note[160];
    snprintf(shape, sizeof shape, "%dblk d256 S192 L32 B2", blocks);
    wan_model m;
    memset(&m, 0, sizeof m);
    if (wan_model_init(&m, &c)) {
        ck_row_error(tag, shape, core_last_error());
        return;
    }
    wan_params_init_random(&m, s->seed + 700 + per_token);
    perturb(&m, s->seed + 710 + per_token);
    wan_dev_report r;
    if (wan_dev_compare(&k_cuda_ops, &m, &sh, s->seed + 720 + per_token, &r, NULL)) {
        snprintf(op, sizeof op, "%s fwd+bwd", tag);
        ck_row_error(op, shape, core_last_error());
        wan_model_free(&m);
        return;
    }
    const char *vs = "fp32 CPU model";
    snprintf(op, sizeof op, "%s fwd out", tag);
    ck_row_figures(op, shape, "bf16", r.out_rel_l2, WAN_DEV_BAND_OUT, r.out_max_rel, r.repeat_same, vs, 1,
                   "repeat: the forward twice");
    snprintf(op, sizeof op, "%s bwd grads", tag);
    snprintf(note, sizeof note, "worst tensor %s (band %.0e); repeat: recompute = store and checkpoint = store",
             r.grad_worst, WAN_DEV_BAND_GRAD);
    ck_row_figures(op, shape, "bf16", r.grad_rel_l2, WAN_DEV_BAND_GRAD, r.grad_worst_rel_l2,
                   r.recompute_same && r.checkpoint_same, vs, r.grad_worst_rel_l2 <= WAN_DEV_BAND_GRAD, note);
    snprintf(op, sizeof op, "%s bwd key biases", tag);
    snprintf(note, sizeof note, "worst %s (softmax shift invariance: a cancelling sum)", r.key_bias_worst);
    ck_row_figures(op, shape, "bf16", r.key_bias_rel_l2, WAN_DEV_BAND_KEY_BIAS, r.key_bias_rel_l2, -1, vs, 1, note);
    snprintf(op, sizeof op, "%s bwd dx", tag);
    ck_row_figures(op, shape, "bf16", r.dx_rel_l2, WAN_DEV_BAND_GRAD, r.dx_rel_l2, -1, vs, 1, NULL);
    snprintf(op, sizeof op, "%s bwd denc", tag);
    ck_row_figures(op, shape, "bf16", r.denc_rel_l2, WAN_DEV_BAND_GRAD, r.denc_rel_l2, -1, vs, 1, NULL);
    snprintf(op, sizeof op, "%s batch mates", tag);
    ck_row_info(op, shape,
                r.batch_same == 1 ? "info: sample 1 alone = its rows in the batch of 2, bit for bit"
                                  : "info: sample 1 alone DIFFERS from its rows in the batch of 2 (GEMM or attention "
                                    "not batch-invariant: parity on the GPU needs it)");
    wan_model_free(&m);
}

/* ---- the glue ops of the table (add_table_forward/backward, add) against model/dit/wan_layers.c ---- */

typedef struct {
    int R, nj, D, snj;
    ct_t table, src, out, dmod, dtable, dsrc, y, x;
} table_case;

static int table_fwd_gpu(void *p) {
    table_case *c = p;
    return k_cuda_ops.add_table_forward(ct_out(&c->out), ct_in(&c->table), ct_in(&c->src), c->R, c->nj, c->D, c->snj);
}
static int table_bwd_gpu(void *p) {
    table_case *c = p;
    if (ct_push(&c->dtable) || ct_push(&c->dsrc)) return -1;
    return k_cuda_ops.add_table_backward(ct_out(&c->dtable), ct_out(&c->dsrc), ct_in(&c->dmod), c->R, c->nj, c->D,
                                         c->snj);
}
static int add_gpu(void *p) {
    table_case *c = p;
    if (ct_push(&c->y)) return -1;
    return k_cuda_ops.add(ct_out(&c->y), ct_in(&c->x), (int64_t)c->y.n);
}

/* Modulation rows at the check's model dim: per sample (R = 2, the block's 6 rows) and broadcast (the output norm's
 * 2 rows from one temb row). bf16 table and source, fp32 rows and gradients, as the DiT uses them: every output must
 * equal the CPU's fp32 result on the same values (CK_EXACT). add: bf16 y += fp32 x = one rounding of the sum. */
static void check_glue(const ck_shapes *s, const char *only) {
    for (int bc = 0; bc <= 1; bc++) {
        const char *name = bc ? "add_table (broadcast)" : "add_table";
        if (!ck_selected(name, only)) continue;
        table_case c;
        memset(&c, 0, sizeof c);
        c.R = 2, c.nj = bc ? 2 : 6, c.D = s->D, c.snj = bc ? 1 : 6;
        const size_t nt = (size_t)c.nj * c.D, ns = (size_t)c.R * c.snj * c.D, no = (size_t)c.R * c.nj * c.D;
        char shape[48], op[64];
        snprintf(shape, sizeof shape, "%dx%dx%d src %d", c.R, c.nj, c.D, c.snj);
        uint64_t sd = s->seed + 800 + 10 * bc;
        if (ct_alloc(&c.table, nt, 1) || ct_alloc(&c.src, ns, 1) || ct_alloc(&c.out, no, 0) ||
            ct_alloc(&c.dmod, no, 0) || ct_alloc(&c.dtable, nt, 0) || ct_alloc(&c.dsrc, ns, 0) ||
            ct_alloc(&c.y, no, 1) || ct_alloc(&c.x, no, 0) || ct_rand(&c.table, sd, -1, 1) ||
            ct_rand(&c.src, sd + 1, -1, 1) || ct_rand(&c.dmod, sd + 2, -1, 1) || ct_rand(&c.x, sd + 3, -1, 1)) {
            ck_row_error(name, shape, core_last_error());
            goto out;
        }
        ck_fill(c.dtable.h, nt, sd + 4, -1, 1, 0);
        ck_fill(c.dsrc.h, ns, sd + 5, -1, 1, 0);
        ck_fill(c.y.h, no, sd + 6, -1, 1, 1);
        float *g_out = ck_floats(no), *r_out = ck_floats(no);
        ct_t *fo[1] = {&c.out};
        float *fg[1] = {g_out};
        int rep = ck_run_twice("add_table_forward", table_fwd_gpu, &c, fo, fg, 1);
        k_cpu_add_table(r_out, c.table.h, c.src.h, c.R, c.nj, c.D, c.snj);
        snprintf(op, sizeof op, "%s fwd", name);
        if (rep >= 0) ck_row(op, shape, 0, g_out, r_out, no, CK_EXACT, 0.0, rep, NULL);
        float *g_dt = ck_floats(nt), *g_ds = ck_floats(ns), *r_dt = ck_floats(nt), *r_ds = ck_floats(ns);
        ct_t *bo[2] = {&c.dtable, &c.dsrc};
        float *bg[2] = {g_dt, g_ds};
        rep = ck_run_twice("add_table_backward", table_bwd_gpu, &c, bo, bg, 2);
        memcpy(r_dt, c.dtable.h, nt * sizeof(float));
        memcpy(r_ds, c.dsrc.h, ns * sizeof(float));
        k_cpu_add_table_bwd(r_dt, r_ds, c.dmod.h, c.R, c.nj, c.D, c.snj);
        if (rep >= 0) {
            snprintf(op, sizeof op, "%s bwd dtable", name);
            ck_row(op, shape, 0, g_dt, r_dt, nt, CK_EXACT, 0.0, rep, NULL);
            snprintf(op, sizeof op, "%s bwd dsrc", name);
            ck_row(op, shape, 0, g_ds, r_ds, ns, CK_EXACT, 0.0, rep, NULL);
        }
        if (!bc && ck_selected("add", only)) { /* y (bf16) += x (fp32) */
            float *g_y = ck_floats(no), *r_y = ck_floats(no);
            ct_t *ao[1] = {&c.y};
            float *ag[1] = {g_y};
            rep = ck_run_twice("add", add_gpu, &c, ao, ag, 1);
            for (size_t i = 0; i < no; i++) r_y[i] = c.y.h[i] + c.x.h[i];
            snprintf(shape, sizeof shape, "%zu", no);
            if (rep >= 0) ck_row("add (bf16 += fp32)", shape, 1, g_y, r_y, no, CK_EXACT, 0.00390625, rep, NULL);
            free(g_y), free(r_y);
        }
        free(g_out), free(r_out), free(g_dt), free(g_ds), free(r_dt), free(r_ds);
    out:
        ct_free(&c.table), ct_free(&c.src), ct_free(&c.out), ct_free(&c.dmod), ct_free(&c.dtable);
        ct_free(&c.dsrc), ct_free(&c.y), ct_free(&c.x);
    }
}

static double rel_l2(const float *a, const float *b, int64_t n) {
    double nd = 0, nb = 0;
    for (int64_t i = 0; i < n; i++) nd += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), nb += (double)b[i] * b[i];
    return nd != nd ? 1e30 : nb > 0 ? sqrt(nd / nb) : sqrt(nd);
}

/* LoRA on the device: a rank-16 adapter on every linear of the Wan 2.1 case's model (B uniform in
 * [-0.05, 0.05)), the base frozen: the device forward and the adapter's gradients against the fp32 CPU model with the
 * same adapter (wan_lora.h), bands WAN_DEV_BAND_OUT / WAN_DEV_BAND_GRAD (whole gradient; worst tensor named, within
 * the key-bias band: the to_k adapters share the key bias's cancellation). */
static void lora_case(const ck_shapes *s, const char *only) {
    const char *tag = "wan dit lora";
    if (!ck_selected(tag, only)) return;
    wan_config c = {{1, 2, 2}, 2, 128, 16, 16, 256, 256, 768, 2, 1, 1e-6, 1024};
    wan_shape sh = {2, 3, 16, 16, 32, 0};
    const char *shape = "2blk d256 r16 S192 B2";
    wan_model m;
    wan_lora l;
    wan_dev_model d;
    wan_acts *ca = NULL;
    wan_dev_acts *da = NULL;
    memset(&m, 0, sizeof m), memset(&l, 0, sizeof l), memset(&d, 0, sizeof d);
    const wan_lora_config lc = {16, 32.0, WAN_LORA_ALL, 3};
    const int64_t vox = (int64_t)sh.F * sh.H * sh.W, nx = sh.B * 16 * vox, ne = (int64_t)sh.B * sh.L * c.text_dim;
    float *x = ck_floats(nx), *t = ck_floats(2), *e = ck_floats(ne), *go = ck_floats(nx);
    float *oc = ck_floats(nx), *od = ck_floats(nx), *gd = NULL;
    int ok = 0;
    if (wan_model_init(&m, &c) || wan_lora_init(&l, &c, &lc, 0) || wan_lora_alloc_grads(&l)) goto out;
    wan_params_init_random(&m, s->seed + 750);
    perturb(&m, s->seed + 751);
    for (int i = 1; i < l.layout.count; i += 2) {
        const wan_tensor *tt = &l.layout.tensors[i];
        ck_fill(l.params + tt->offset, (size_t)tt->numel, s->seed + 760 + (uint64_t)i, -0.05f, 0.05f, 0);
    }
    ck_fill(x, nx, s->seed + 770, -2, 2, 0), ck_fill(t, 2, s->seed + 771, 0, 1000, 0);
    ck_fill(e, ne, s->seed + 772, -2, 2, 0), ck_fill(go, nx, s->seed + 773, -1, 1, 0);
    if (wan_model_attach_lora(&m, &l) || !(ca = wan_acts_new(&c, &sh, WAN_ACTS_STORE)) ||
        wan_forward(&m, ca, NULL, oc, x, t, e) || wan_backward(&m, ca, NULL, NULL, NULL, go))
        goto out;
    gd = ck_floats((size_t)l.layout.numel);
    if (wan_dev_model_init(&d, &k_cuda_ops, &m) || !(da = wan_dev_acts_new(&k_cuda_ops, &c, &sh, WAN_ACTS_STORE)) ||
        wan_dev_run_host(&d, da, od, x, t, e, go, NULL, NULL) || wan_dev_grads_download(&d, gd))
        goto out;
    ok = 1;
out:
    if (!ok) {
        ck_row_error(tag, shape, core_last_error());
    } else {
        double worst = 0;
        const char *wn = "";
        for (int i = 0; i < l.layout.count; i++) {
            const wan_tensor *tt = &l.layout.tensors[i];
            const double r = rel_l2(gd + tt->offset, l.grads + tt->offset, tt->numel);
            if (r > worst) worst = r, wn = tt->name;
        }
        char note[160];
        ck_row_figures("wan dit lora fwd out", shape, "bf16", rel_l2(od, oc, nx), WAN_DEV_BAND_OUT, rel_l2(od, oc, nx),
                       -1, "fp32 CPU model", 1, "rank 16 on every linear, base frozen");
        snprintf(note, sizeof note, "adapter gradients; worst tensor %s (band %.0e)", wn, WAN_DEV_BAND_KEY_BIAS);
        ck_row_figures("wan dit lora bwd grads", shape, "bf16", rel_l2(gd, l.grads, l.layout.numel), WAN_DEV_BAND_GRAD,
                       worst, -1, "fp32 CPU model", worst <= WAN_DEV_BAND_KEY_BIAS, note);
    }
    wan_dev_acts_free(da);
    wan_acts_free(ca);
    wan_dev_model_free(&d);
    wan_model_free(&m);
    wan_lora_free(&l);
    free(x), free(t), free(e), free(go), free(oc), free(od), free(gd);
}

static void check_dit(const ck_shapes *s, const char *only) {
    check_glue(s, only);
    one_case(s, 0, 2, only);
    one_case(s, 1, 2, only);
    lora_case(s, only);
}

/* Stage 1's smallest DiT check: one block of the Wan 2.1 case, forward and backward, with its repeat columns. */
static void check_dit_block(const ck_shapes *s, const char *only) { one_case(s, 0, 1, only); }

__attribute__((constructor)) static void register_check_dit(void) {
    ck_register_part("block", check_dit_block);
    ck_register_part("dit", check_dit);
}
