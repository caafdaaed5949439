/* model/vae/wan_vae_upload.c — the Wan VAE decoder's weights on a device (vae_set_device): one allocation of bf16
 * copies, every convolution's weight [cout, K] zero-padded to [round8(cout), round8(K)] and its bias to round8(cout)
 * (the device GEMM's rows start 16-byte aligned: kernels/dev_ops.h's vae_conv3d), every norm's gamma [C]; each
 * block starts at a multiple of 8 elements. The offsets land in the layer structs (dev_w, dev_b, ldw, cout_w,
 * dev_gamma), which the layers read instead of params while m->dw is set. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/dev_table.h"
#include "model/vae/wan_vae_internal.h"

static size_t r8(size_t n) { return (n + 7) / 8 * 8; }

/* Every convolution and norm of the decoder, in a fixed order, through fn (with ctx); stops at the first error. */
typedef int (*conv_fn)(vae_model *m, vae_conv *c, void *ctx);
typedef int (*norm_fn)(vae_model *m, vae_norm *n, void *ctx);
static int res_walk(vae_model *m, vae_resblock *r, conv_fn fc, norm_fn fn, void *ctx) {
    if (fn(m, &r->n1, ctx) || fc(m, &r->c1, ctx) || fn(m, &r->n2, ctx) || fc(m, &r->c2, ctx)) return -1;
    return r->has_sc ? fc(m, &r->sc, ctx) : 0;
}
static int walk(vae_model *m, conv_fn fc, norm_fn fn, void *ctx) {
    if (fc(m, &m->post_quant, ctx) || fc(m, &m->conv_in, ctx)) return -1;
    if (res_walk(m, &m->mid_res[0], fc, fn, ctx) || res_walk(m, &m->mid_res[1], fc, fn, ctx)) return -1;
    if (fn(m, &m->mid_attn.n, ctx) || fc(m, &m->mid_attn.qkv, ctx) || fc(m, &m->mid_attn.proj, ctx)) return -1;
    for (int i = 0; i < m->nup; i++) {
        vae_upblock *u = &m->upb[i];
        for (int j = 0; j < u->nres; j++)
            if (res_walk(m, &u->res[j], fc, fn, ctx)) return -1;
        if (u->up && fc(m, &u->resample, ctx)) return -1;
        if (u->up == 3 && fc(m, &u->time_conv, ctx)) return -1;
    }
    return fn(m, &m->norm_out, ctx) || fc(m, &m->conv_out, ctx);
}

/* Pass 1 (ctx: size_t elements so far): the layout. Pass 2 (ctx: the device): the copies. */
static int lay_conv(vae_model *m, vae_conv *c, void *ctx) {
    size_t *n = ctx;
    const int K = c->kt * c->kh * c->kw * c->cin;
    c->ldw = (int)r8((size_t)K), c->cout_w = (int)r8((size_t)c->cout);
    c->dev_w = *n, *n += (size_t)c->cout_w * c->ldw;
    c->dev_b = *n, *n += (size_t)c->cout_w;
    (void)m;
    return 0;
}
static int lay_norm(vae_model *m, vae_norm *nm, void *ctx) {
    size_t *n = ctx;
    nm->dev_gamma = *n, *n += r8((size_t)nm->c);
    (void)m;
    return 0;
}
static int put_conv(vae_model *m, vae_conv *c, void *ctx) {
    const k_dev_ops *d = ctx;
    const int K = c->kt * c->kh * c->kw * c->cin;
    const size_t n = (size_t)c->cout_w * c->ldw;
    float *tmp = calloc(n + (size_t)c->cout_w, sizeof(float));
    if (!tmp) return core_error("vae: out of memory staging a convolution's weights");
    for (int o = 0; o < c->cout; o++) {
        memcpy(tmp + (size_t)o * c->ldw, m->params + c->w + (size_t)o * K, (size_t)K * sizeof(float));
        tmp[n + o] = m->params[c->b + o];
    }
    kb_bf16 *dw = m->dw;
    const int rc = d->mem_upload_bf16(dw + c->dev_w, tmp, n) || d->mem_upload_bf16(dw + c->dev_b, tmp + n, c->cout_w);
    free(tmp);
    return rc ? -1 : 0;
}
static int put_norm(vae_model *m, vae_norm *nm, void *ctx) {
    const k_dev_ops *d = ctx;
    return d->mem_upload_bf16((kb_bf16 *)m->dw + nm->dev_gamma, m->params + nm->gamma, (size_t)nm->c);
}

size_t vae_upload_bytes(const vae_model *m) {
    vae_model tmp = *m; /* the walk writes the layout into the layer structs: on a copy */
    size_t n = 0;
    walk(&tmp, lay_conv, lay_norm, &n);
    return n * sizeof(kb_bf16);
}

int vae_upload(vae_model *m, const k_dev_ops *dev) {
    size_t n = 0;
    walk(m, lay_conv, lay_norm, &n);
    if (!(m->dw = dev->mem_alloc(n * sizeof(kb_bf16))))
        return core_error_push("vae: the decoder's weights on %s (%zu bytes): ", dev->name, n * sizeof(kb_bf16));
    m->dev = dev, m->dw_bytes = n * sizeof(kb_bf16);
    if (walk(m, put_conv, put_norm, (void *)dev)) {
        vae_upload_free(m);
        return core_error_push("vae: uploading the decoder's weights to %s: ", dev->name);
    }
    return 0;
}

int vae_set_device(vae_model *m, const k_dev_ops *dev) {
    if (dev == &k_cpu_dev_ops) dev = NULL;
    if (dev == m->dev) return 0;
    vae_state_free(&m->st);
    vae_upload_free(m);
    if (!dev) return 0;
    if (!dev->vae_conv3d || !dev->vae_rms_norm || !dev->vae_dupup_add || !dev->vae_attention)
        return core_error("vae: the backend %s has no VAE decoder entries", dev->name);
    return vae_upload(m, dev);
}

void vae_release_state(vae_model *m) { vae_state_free(&m->st); }
const char *vae_device_name(const vae_model *m) { return vae_backend(m)->name; }
size_t vae_device_weight_bytes(const vae_model *m) { return m->dw_bytes; }
