/* model/dit/wan_dev_run.c — the device model with host tensors (upload, run, download) and its comparison with the
 * fp32 CPU model on the same inputs (wan_dev.h): what tests/test_wan_dev.c asserts on the emulated device and what
 * the GPU check's Wan DiT rows (model/dit/check/) print on a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_dev.h"
#include "model/dit/wan_internal.h"

/* Device buffers of one host run, freed together. */
typedef struct {
    const k_dev_ops *dev;
    void *p[8];
    int n;
} dev_bufs;

static void *buf(dev_bufs *b, size_t bytes) {
    void *p = b->dev->mem_alloc(bytes);
    if (p) b->p[b->n++] = p;
    return p;
}
static void bufs_free(dev_bufs *b) {
    for (int i = 0; i < b->n; i++) b->dev->mem_free(b->p[i]);
    b->n = 0;
}

int wan_dev_run_host(wan_dev_model *d, wan_dev_acts *a, float *out, const float *x, const float *timestep,
                     const float *enc, const float *dout, float *dx, float *denc) {
    const k_dev_ops *dev = d->dev;
    const wan_config *c = &d->host->cfg;
    const wan_shape *sh = &a->shape;
    const size_t vox = (size_t)sh->F * sh->H * sh->W;
    const size_t nx = (size_t)sh->B * c->in_channels * vox, no = (size_t)sh->B * c->out_channels * vox;
    const size_t ne = (size_t)sh->B * sh->L * c->text_dim;
    dev_bufs b = {dev, {0}, 0};
    int rc = -1;
    float *x_d = buf(&b, nx * 4), *e_d = buf(&b, ne * 4), *o_d = buf(&b, no * 4);
    if (!x_d || !e_d || !o_d) goto out;
    if (dev->mem_upload(x_d, x, nx * 4) || dev->mem_upload(e_d, enc, ne * 4)) goto out;
    if (wan_dev_forward(d, a, kb_out_f32(o_d), kb_in_f32(x_d), timestep, kb_in_f32(e_d))) goto out;
    if (dev->mem_download(out, o_d, no * 4)) goto out;
    if (dout) {
        float *g_d = buf(&b, no * 4), *dx_d = dx ? buf(&b, nx * 4) : NULL, *de_d = denc ? buf(&b, ne * 4) : NULL;
        if (!g_d || (dx && !dx_d) || (denc && !de_d)) goto out;
        if (wan_dev_alloc_grads(d) || wan_dev_zero_grads(d) || dev->mem_upload(g_d, dout, no * 4)) goto out;
        if ((dx_d && dev->mem_zero(dx_d, nx * 4)) || (de_d && dev->mem_zero(de_d, ne * 4))) goto out;
        if (wan_dev_backward(d, a, kb_out_f32(dx_d), kb_out_f32(de_d), kb_in_f32(g_d))) goto out;
        if ((dx && dev->mem_download(dx, dx_d, nx * 4)) || (denc && dev->mem_download(denc, de_d, ne * 4))) goto out;
    }
    rc = dev->mem_sync();
out:
    if (rc) core_error_push("wan_dev_run_host: ");
    bufs_free(&b);
    return rc;
}

/* ---- the comparison with the CPU model ---- */

int wan_dev_is_key_bias(const char *name) {
    const char *suffix = ".to_k.bias";
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && !strcmp(name + n - k, suffix);
}

static double rel_l2(const float *a, const float *b, int64_t n) {
    double nd = 0, nb = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        nd += e * e, nb += (double)b[i] * b[i];
    }
    if (nd != nd) return INFINITY;
    return nb > 0 ? sqrt(nd / nb) : sqrt(nd);
}

static double max_rel(const float *a, const float *b, int64_t n) {
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (e > md || e != e) md = e != e ? INFINITY : e;
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return mb > 0 ? md / mb : md;
}

/* n uniforms in [lo, hi) from a splitmix64 hash of (seed, what, i): the comparison's inputs (not model noise). */
static void fill(float *x, int64_t n, uint64_t seed, uint64_t what, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t z = seed * 0x9e3779b97f4a7c15ull + what * 0xd1b54a32d192ed03ull + (uint64_t)i * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        x[i] = lo + (hi - lo) * (float)((double)(z >> 40) * (1.0 / 16777216.0));
    }
}

int wan_dev_compare(const k_dev_ops *dev, const wan_model *m, const wan_shape *sh, uint64_t seed,
                    wan_dev_report *rep, double *grad_rel) {
    memset(rep, 0, sizeof *rep);
    const wan_config *c = &m->cfg;
    const int64_t S = wan_tokens(c, sh), vox = (int64_t)sh->F * sh->H * sh->W;
    const int64_t nx = sh->B * c->in_channels * vox, no = sh->B * c->out_channels * vox;
    const int64_t ne = (int64_t)sh->B * sh->L * c->text_dim, nt = sh->per_token_timestep ? sh->B * S : sh->B;
    const int64_t np = m->layout.numel;
    int rc = -1;
    wan_model cpu = {0};
    wan_dev_model d = {0};
    wan_acts *ca = NULL;
    wan_dev_acts *da = NULL;
    float *x = malloc(nx * 4), *t = malloc(nt * 4), *e = malloc(ne * 4), *go = malloc(no * 4);
    float *o_c = calloc(no, 4), *dx_c = calloc(nx, 4), *de_c = calloc(ne, 4);
    float *o_d = calloc(no, 4), *dx_d = calloc(nx, 4), *de_d = calloc(ne, 4), *g_d = malloc(np * 4);
    float *o_2 = calloc(no, 4), *dx_2 = calloc(nx, 4), *de_2 = calloc(ne, 4), *g_2 = malloc(np * 4);
    if (!x || !t || !e || !go || !o_c || !dx_c || !de_c || !o_d || !dx_d || !de_d || !g_d || !o_2 || !dx_2 ||
        !de_2 || !g_2) {
        core_error("wan_dev_compare: out of memory");
        goto out;
    }
    fill(x, nx, seed, 1, -2.0f, 2.0f);
    fill(t, nt, seed, 2, 0.0f, 1000.0f);
    fill(e, ne, seed, 3, -2.0f, 2.0f);
    fill(go, no, seed, 4, -1.0f, 1.0f);

    /* the CPU reference: a copy of m with its own gradients */
    if (wan_model_init(&cpu, c) || wan_model_alloc_grads(&cpu)) goto out;
    memcpy(cpu.params, m->params, np * sizeof(float));
    if (!(ca = wan_acts_new(c, sh, WAN_ACTS_STORE))) goto out;
    if (wan_forward(&cpu, ca, NULL, o_c, x, t, e) || wan_backward(&cpu, ca, NULL, dx_c, de_c, go)) goto out;

    /* the device: STORE, then RECOMPUTE and CHECKPOINT (same bits expected), then the forward once more (repeat) */
    if (wan_dev_model_init(&d, dev, m)) goto out;
    if (!(da = wan_dev_acts_new(dev, c, sh, WAN_ACTS_STORE))) goto out;
    if (wan_dev_run_host(&d, da, o_d, x, t, e, go, dx_d, de_d) || wan_dev_grads_download(&d, g_d)) goto out;
    wan_dev_acts_free(da);
    if (!(da = wan_dev_acts_new(dev, c, sh, WAN_ACTS_RECOMPUTE))) goto out;
    if (wan_dev_run_host(&d, da, o_2, x, t, e, go, dx_2, de_2) || wan_dev_grads_download(&d, g_2)) goto out;
    rep->recompute_same = !memcmp(o_d, o_2, no * 4) && !memcmp(dx_d, dx_2, nx * 4) && !memcmp(de_d, de_2, ne * 4) &&
                          !memcmp(g_d, g_2, np * 4);
    wan_dev_acts_free(da); /* whole-block checkpointing: each block's forward rerun in the backward */
    if (!(da = wan_dev_acts_new(dev, c, sh, WAN_ACTS_CHECKPOINT))) goto out;
    if (wan_dev_run_host(&d, da, o_2, x, t, e, go, dx_2, de_2) || wan_dev_grads_download(&d, g_2)) goto out;
    rep->checkpoint_same = !memcmp(o_d, o_2, no * 4) && !memcmp(dx_d, dx_2, nx * 4) && !memcmp(de_d, de_2, ne * 4) &&
                           !memcmp(g_d, g_2, np * 4);
    if (wan_dev_run_host(&d, da, o_2, x, t, e, NULL, NULL, NULL)) goto out;
    rep->repeat_same = !memcmp(o_d, o_2, no * 4);

    rep->out_rel_l2 = rel_l2(o_d, o_c, no);
    rep->out_max_rel = max_rel(o_d, o_c, no);
    rep->dx_rel_l2 = rel_l2(dx_d, dx_c, nx);
    rep->denc_rel_l2 = rel_l2(de_d, de_c, ne);
    rep->grad_rel_l2 = rel_l2(g_d, cpu.grads, np);
    for (int i = 0; i < m->layout.count; i++) {
        const wan_tensor *tt = &m->layout.tensors[i];
        double r = rel_l2(g_d + tt->offset, cpu.grads + tt->offset, tt->numel);
        if (grad_rel) grad_rel[i] = r;
        const int kb = wan_dev_is_key_bias(tt->name);
        double *worst = kb ? &rep->key_bias_rel_l2 : &rep->grad_worst_rel_l2;
        if (!(r <= *worst)) { /* NaN counts as worst */
            *worst = r;
            snprintf(kb ? rep->key_bias_worst : rep->grad_worst, WAN_NAME_MAX, "%s", tt->name);
        }
    }

    /* batch mates: sample 1 alone, inference activations */
    rep->batch_same = -1;
    if (sh->B >= 2) {
        wan_shape one = *sh;
        one.B = 1;
        wan_dev_acts_free(da);
        if (!(da = wan_dev_acts_new(dev, c, &one, WAN_ACTS_INFER))) goto out;
        if (wan_dev_run_host(&d, da, o_2, x + nx / sh->B, t + nt / sh->B, e + ne / sh->B, NULL, NULL, NULL))
            goto out;
        rep->batch_same = !memcmp(o_2, o_d + no / sh->B, (size_t)(no / sh->B) * 4);
    }
    rc = 0;
out:
    if (rc) core_error_push("wan_dev_compare: ");
    wan_dev_acts_free(da);
    wan_acts_free(ca);
    wan_dev_model_free(&d);
    wan_model_free(&cpu);
    free(x), free(t), free(e), free(go), free(o_c), free(dx_c), free(de_c), free(o_d), free(dx_d), free(de_d);
    free(g_d), free(o_2), free(dx_2), free(de_2), free(g_2);
    return rc;
}
