/* model/text/umt5_forward.c — the umT5 encoder's forward, written once over the device table (kernels/dev_ops.h):
 * the fp32 CPU encoder through k_cpu_dev_ops (host weights, fp32 activations: the bits of the CPU encoder before the
 * table), a device through its table after t5_to_device (bf16 weights and activations, fp32 residual stream; umt5.h
 * says what stays fp32 and why); the relative position buckets. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/dev_table.h"
#include "model/text/umt5_internal.h"

/* The buffers of one forward on backend K: N = B * S tokens. */
typedef struct {
    float *x, *y, *rstd; /* [N, D] residual stream, [N, D] output, [N] (fp32) */
    void *h, *q, *k, *v, *att, *a, *g; /* [N, D], [N, I] x4, [N, F] x2 (activation dtype) */
    int *bucket_of;      /* [2S - 1] */
    int32_t *mask;       /* [B, S] or NULL */
} t5_bufs;

int t5_relative_bucket(int rel, int num_buckets, int max_distance) {
    int nb = num_buckets / 2, bucket = rel > 0 ? nb : 0, r = rel < 0 ? -rel : rel, max_exact = nb / 2;
    if (r < max_exact) return bucket + r;
    /* float32 as the reference: log(r / max_exact) / log(max_distance / max_exact) * (nb - max_exact), truncated */
    float v = logf((float)r / (float)max_exact) / (float)log((double)max_distance / max_exact);
    v = v * (float)(nb - max_exact);
    int large = max_exact + (int)v;
    return bucket + (large < nb - 1 ? large : nb - 1);
}

size_t t5_device_bytes(const t5_config *c, int B, int S) {
    const size_t D = (size_t)c->d_model, I = (size_t)c->num_heads * c->d_kv, F = (size_t)c->d_ff;
    const size_t N = (size_t)B * S, L = (size_t)c->num_layers;
    const size_t weights = L * ((4 * I * D + 3 * F * D) * sizeof(kb_bf16) +
                                ((size_t)c->num_buckets * c->num_heads + 2 * D) * sizeof(float)) +
                           D * sizeof(float);
    const size_t acts = N ? N * (2 * D + 1) * sizeof(float) + N * (D + 4 * I + 2 * F) * sizeof(kb_bf16) +
                                (size_t)(2 * S - 1) * sizeof(int) + N * sizeof(int32_t)
                          : 0; /* B or S 0: the weights alone */
    return weights + acts;
}

void t5_device_free(t5_encoder *e) {
    t5_device *d = e->dev;
    if (!d) return;
    for (int i = 0; i < d->n_allocs; i++) d->K->mem_free(d->allocs[i]);
    free(d->allocs);
    free(d->layers);
    free(d);
    e->dev = NULL;
}

/* A device copy of n host floats: bf16 (GEMM weights) or fp32. NULL on failure (error recorded). */
static void *dev_copy(t5_device *d, const float *src, size_t n, int bf16) {
    const k_dev_ops *K = d->K;
    void *p = K->mem_alloc(n * (bf16 ? sizeof(kb_bf16) : sizeof(float)));
    if (!p) return NULL;
    d->allocs[d->n_allocs++] = p;
    if (bf16 ? K->mem_upload_bf16(p, src, n) : K->mem_upload(p, src, n * sizeof(float))) return NULL;
    return p;
}

int t5_to_device(t5_encoder *e, const k_dev_ops *K) {
    const t5_config *c = &e->cfg;
    const int I = c->num_heads * c->d_kv;
    if (!K) return core_error("umt5 on a device: no device table");
    if (e->dev) return core_error("umt5 on a device: the encoder is already on %s", e->dev->K->name);
    if (c->d_model % 8 || I % 8 || c->d_ff % 8)
        return core_error("umt5 on %s: d_model %d, num_heads x d_kv %d and d_ff %d must be multiples of 8 (the GEMM's "
                          "bf16 rows start 16-byte aligned)", K->name, c->d_model, I, c->d_ff);
    t5_device *d = calloc(1, sizeof *d);
    if (!d) return core_error("umt5 on a device: out of memory");
    e->dev = d;
    d->K = K;
    d->layers = calloc((size_t)c->num_layers, sizeof *d->layers);
    d->allocs = calloc((size_t)c->num_layers * 10 + 1, sizeof *d->allocs);
    if (!d->layers || !d->allocs) goto oom;
    const size_t D = (size_t)c->d_model, F = (size_t)c->d_ff, IW = (size_t)I * D, FW = F * D;
    for (int l = 0; l < c->num_layers; l++) {
        const t5_layer *L = &e->layers[l];
        t5_layer_view *V = &d->layers[l];
        const void *p[10] = {dev_copy(d, L->q, IW, 1),   dev_copy(d, L->k, IW, 1),   dev_copy(d, L->v, IW, 1),
                             dev_copy(d, L->o, IW, 1),   dev_copy(d, L->wi0, FW, 1), dev_copy(d, L->wi1, FW, 1),
                             dev_copy(d, L->wo, FW, 1),  dev_copy(d, L->ln_attn, D, 0),
                             dev_copy(d, L->ln_ff, D, 0),
                             dev_copy(d, L->rel_bias, (size_t)c->num_buckets * c->num_heads, 0)};
        for (int i = 0; i < 10; i++)
            if (!p[i]) goto fail;
        V->q = kb_in_bf16(p[0]), V->k = kb_in_bf16(p[1]), V->v = kb_in_bf16(p[2]), V->o = kb_in_bf16(p[3]);
        V->wi0 = kb_in_bf16(p[4]), V->wi1 = kb_in_bf16(p[5]), V->wo = kb_in_bf16(p[6]);
        V->ln_attn = kb_in_f32(p[7]), V->ln_ff = kb_in_f32(p[8]), V->rel_bias = p[9];
    }
    const void *fl = dev_copy(d, e->final_ln, D, 0);
    if (!fl) goto fail;
    d->final_ln = kb_in_f32(fl);
    /* The device copy is all the forward reads from now on (layer_view, the final norm): the host's fp32 weights go
     * (umT5-XXL: 17.5 GiB a process). The embedding stays mapped: its rows are looked up on the host. */
    free(e->params), free(e->layers);
    e->params = NULL, e->layers = NULL, e->final_ln = NULL;
    return 0;
oom:
    core_error("umt5 on a device: out of memory");
fail:
    core_error_push("umt5: copying the weights to %s: ", K->name);
    t5_device_free(e);
    return -1;
}

const char *t5_device_name(const t5_encoder *e) { return e->dev ? e->dev->K->name : NULL; }

/* Layer l as the forward reads it: the device copy, or views of the host weights (fp32). */
static t5_layer_view layer_view(const t5_encoder *e, int l) {
    if (e->dev) return e->dev->layers[l];
    const t5_layer *L = &e->layers[l];
    t5_layer_view V;
    V.q = kb_in_f32(L->q), V.k = kb_in_f32(L->k), V.v = kb_in_f32(L->v), V.o = kb_in_f32(L->o);
    V.wi0 = kb_in_f32(L->wi0), V.wi1 = kb_in_f32(L->wi1), V.wo = kb_in_f32(L->wo);
    V.ln_attn = kb_in_f32(L->ln_attn), V.ln_ff = kb_in_f32(L->ln_ff), V.rel_bias = L->rel_bias;
    return V;
}

/* C [M, N] = alpha A [M, K] W^T + beta C (W [N, K] row-major: torch's Linear weight). */
static int linear(const k_dev_ops *K, int M, int N, int Kd, kb_in A, kb_in W, kb_out C, float beta) {
    k_gemm_args g;
    memset(&g, 0, sizeof g);
    g.transB = 1, g.M = M, g.N = N, g.K = Kd, g.alpha = 1.0f, g.beta = beta;
    g.A = A, g.lda = Kd, g.B = W, g.ldb = Kd, g.C = C, g.ldc = N, g.epi = K_EPI_NONE;
    return K->gemm(&g);
}

static void bufs_free(const k_dev_ops *K, t5_bufs *b) {
    void *all[] = {b->x, b->y, b->rstd, b->h, b->q, b->k, b->v, b->att, b->a, b->g, b->bucket_of, b->mask};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) K->mem_free(all[i]);
}

int t5_forward(const t5_encoder *e, const int32_t *ids, const int32_t *mask, int B, int S, float *out) {
    const t5_config *c = &e->cfg;
    const k_dev_ops *K = e->dev ? e->dev->K : &k_cpu_dev_ops;
    const kb_dtype at = e->dev ? KB_BF16 : KB_F32; /* activations */
    const size_t ab = at == KB_BF16 ? sizeof(kb_bf16) : sizeof(float);
    const int D = c->d_model, H = c->num_heads, Dk = c->d_kv, I = H * Dk, F = c->d_ff;
    if (B < 1 || S < 1) return core_error("umt5: %d prompts of %d tokens: both must be >= 1", B, S);
    const size_t N = (size_t)B * S;
    const size_t esz = core_dtype_size(e->embed.dtype);
    for (size_t t = 0; t < N; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return core_error("umt5: token id %d at position %zu outside the vocabulary (%d)", ids[t], t,
                              c->vocab_size);
    t5_bufs b = {0};
    float *x0 = malloc(N * D * sizeof(float));
    int *bucket = malloc((size_t)(2 * S) * sizeof(int));
    int rc = 0;
    if (!x0 || !bucket) {
        rc = core_error("umt5: out of memory for %d x %d tokens", B, S);
        goto done;
    }
    b.x = K->mem_alloc(N * D * sizeof(float)), b.y = K->mem_alloc(N * D * sizeof(float));
    b.rstd = K->mem_alloc(N * sizeof(float)), b.h = K->mem_alloc(N * D * ab);
    b.q = K->mem_alloc(N * I * ab), b.k = K->mem_alloc(N * I * ab), b.v = K->mem_alloc(N * I * ab);
    b.att = K->mem_alloc(N * I * ab), b.a = K->mem_alloc(N * F * ab), b.g = K->mem_alloc(N * F * ab);
    b.bucket_of = K->mem_alloc((size_t)(2 * S - 1) * sizeof(int));
    if (mask) b.mask = K->mem_alloc(N * sizeof(int32_t));
    if (!b.x || !b.y || !b.rstd || !b.h || !b.q || !b.k || !b.v || !b.att || !b.a || !b.g || !b.bucket_of ||
        (mask && !b.mask)) {
        rc = core_error_push("umt5 on %s: buffers for %d x %d tokens: ", K->name, B, S);
        goto done;
    }
    for (int r = -(S - 1); r <= S - 1; r++) bucket[r + S - 1] = t5_relative_bucket(r, c->num_buckets, c->max_distance);
    for (size_t t = 0; t < N; t++)
        core_convert_to_f32(x0 + t * D, (const char *)e->embed.data + (size_t)ids[t] * D * esz, e->embed.dtype,
                            (size_t)D);
    if (K->mem_upload(b.x, x0, N * D * sizeof(float)) ||
        K->mem_upload(b.bucket_of, bucket, (size_t)(2 * S - 1) * sizeof(int)) ||
        (mask && K->mem_upload(b.mask, mask, N * sizeof(int32_t)))) {
        rc = -1;
        goto done;
    }
    const kb_out x = kb_out_f32(b.x), h = {b.h, at}, q = {b.q, at}, k = {b.k, at}, v = {b.v, at}, att = {b.att, at};
    const kb_out a = {b.a, at}, g = {b.g, at};
    const int n = (int)N;
    for (int l = 0; l < c->num_layers && !rc; l++) {
        const t5_layer_view L = layer_view(e, l);
        rc = K->rmsnorm_forward(h, b.rstd, kb_as_in(x), L.ln_attn, n, D, c->eps) ||
             linear(K, n, I, D, kb_as_in(h), L.q, q, 0.0f) || linear(K, n, I, D, kb_as_in(h), L.k, k, 0.0f) ||
             linear(K, n, I, D, kb_as_in(h), L.v, v, 0.0f) ||
             K->t5_attention(att, kb_as_in(q), kb_as_in(k), kb_as_in(v), L.rel_bias, b.bucket_of, b.mask, B, S, H,
                             Dk) ||
             linear(K, n, D, I, kb_as_in(att), L.o, x, 1.0f) || /* x += o(att) */
             K->rmsnorm_forward(h, b.rstd, kb_as_in(x), L.ln_ff, n, D, c->eps) ||
             linear(K, n, F, D, kb_as_in(h), L.wi0, a, 0.0f) || linear(K, n, F, D, kb_as_in(h), L.wi1, g, 0.0f) ||
             K->t5_gated_gelu(a, kb_as_in(a), kb_as_in(g), (int64_t)N * F) || /* a = gelu(wi_0 h) * wi_1 h */
             linear(K, n, D, F, kb_as_in(a), L.wo, x, 1.0f);                  /* x += wo(a) */
        if (rc) rc = core_error_push("umt5 on %s, layer %d: ", K->name, l);
    }
    const kb_in fl = e->dev ? e->dev->final_ln : kb_in_f32(e->final_ln);
    if (!rc && (K->rmsnorm_forward(kb_out_f32(b.y), b.rstd, kb_as_in(x), fl, n, D, c->eps) ||
                K->mem_download(out, b.y, N * D * sizeof(float))))
        rc = core_error_push("umt5 on %s, final norm: ", K->name);
done:
    bufs_free(K, &b);
    free(x0), free(bucket);
    return rc ? -1 : 0;
}
