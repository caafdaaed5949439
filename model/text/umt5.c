/* model/text/umt5.c — umT5 encoder: config and weight loading, forward (see umt5.h). */
#include "model/text/umt5.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "kernels/kernels.h"

typedef struct {
    float *q, *k, *v, *o; /* [H*Dk, D] x3, [D, H*Dk] (torch Linear: [out, in]) */
    float *rel_bias;      /* [num_buckets, H] */
    float *ln_attn;       /* [D] */
    float *wi0, *wi1, *wo; /* [F, D], [F, D], [D, F] */
    float *ln_ff;         /* [D] */
} t5_layer;

struct t5_encoder {
    t5_config cfg;
    st_set *st;          /* kept open: the embedding is read from it row by row */
    core_tensor embed;   /* [vocab, D] view (F32/BF16/F16) */
    float *params;       /* every other weight, F32, one allocation */
    t5_layer *layers;    /* [num_layers] pointers into params */
    float *final_ln;     /* [D] */
};

static int get_int(json_t *root, const char *key, int *out, const char *file) {
    json_t *v = json_object_get(root, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 1 << 30)
        return core_error("%s: \"%s\" missing or not a positive integer", file, key);
    *out = (int)json_integer_value(v);
    return 0;
}

int t5_config_load(const char *dir, t5_config *cfg) {
    char file[4096];
    snprintf(file, sizeof file, "%s/config.json", dir);
    json_t *root = core_json_load_object(file);
    if (!root) return -1;
    int rc = get_int(root, "vocab_size", &cfg->vocab_size, file) || get_int(root, "d_model", &cfg->d_model, file) ||
             get_int(root, "d_kv", &cfg->d_kv, file) || get_int(root, "d_ff", &cfg->d_ff, file) ||
             get_int(root, "num_layers", &cfg->num_layers, file) || get_int(root, "num_heads", &cfg->num_heads, file);
    cfg->num_buckets = 32, cfg->max_distance = 128, cfg->eps = 1e-6f;
    if (!rc && json_object_get(root, "relative_attention_num_buckets"))
        rc = get_int(root, "relative_attention_num_buckets", &cfg->num_buckets, file);
    if (!rc && json_object_get(root, "relative_attention_max_distance"))
        rc = get_int(root, "relative_attention_max_distance", &cfg->max_distance, file);
    json_t *eps = json_object_get(root, "layer_norm_epsilon");
    if (!rc && eps) {
        if (!json_is_number(eps) || json_number_value(eps) <= 0)
            rc = core_error("%s: \"layer_norm_epsilon\" is not a positive number", file);
        else cfg->eps = (float)json_number_value(eps);
    }
    const char *ff = json_string_value(json_object_get(root, "feed_forward_proj"));
    if (!rc && ff && strcmp(ff, "gated-gelu") != 0)
        rc = core_error("%s: \"feed_forward_proj\" is \"%s\"; only \"gated-gelu\" (umT5) is supported", file, ff);
    json_decref(root);
    return rc ? -1 : 0;
}

const t5_config *t5_get_config(const t5_encoder *e) { return &e->cfg; }

void t5_free(t5_encoder *e) {
    if (!e) return;
    core_tensor_free(&e->embed);
    st_set_close(e->st);
    free(e->params);
    free(e->layers);
    free(e);
}

t5_encoder *t5_load(const char *dir) {
    t5_encoder *e = calloc(1, sizeof *e);
    if (!e) {
        core_error("umt5: out of memory");
        return NULL;
    }
    t5_config *c = &e->cfg;
    if (t5_config_load(dir, c) || !(e->st = st_open_dir(dir))) goto fail;
    const char *ename = st_set_find(e->st, "shared.weight") >= 0 ? "shared.weight" : "encoder.embed_tokens.weight";
    if (st_set_get(e->st, ename, &e->embed)) goto fail;
    if (e->embed.ndim != 2 || e->embed.shape[0] != c->vocab_size || e->embed.shape[1] != c->d_model ||
        (e->embed.dtype != CORE_F32 && e->embed.dtype != CORE_BF16 && e->embed.dtype != CORE_F16)) {
        core_error("%s: tensor \"%s\" should be F32/BF16/F16 [%d, %d]", dir, ename, c->vocab_size, c->d_model);
        goto fail;
    }
    size_t D = (size_t)c->d_model, I = (size_t)c->num_heads * c->d_kv, F = (size_t)c->d_ff, H = (size_t)c->num_heads;
    size_t per = 4 * I * D + (size_t)c->num_buckets * H + 2 * D + 3 * F * D;
    e->params = malloc((per * (size_t)c->num_layers + D) * sizeof(float));
    e->layers = calloc((size_t)c->num_layers, sizeof *e->layers);
    if (!e->params || !e->layers) {
        core_error("umt5: out of memory for %zu parameters", per * (size_t)c->num_layers + D);
        goto fail;
    }
    float *p = e->params;
    char name[256];
#define LOAD(ptr, suffix, n)                                                                                      \
    do {                                                                                                          \
        snprintf(name, sizeof name, "encoder.block.%d.layer.%s", l, suffix);                                      \
        (ptr) = p;                                                                                                \
        if (st_set_read_f32(e->st, name, p, (int64_t)(n))) goto fail;                                             \
        p += (n);                                                                                                 \
    } while (0)
    for (int l = 0; l < c->num_layers; l++) {
        t5_layer *L = &e->layers[l];
        LOAD(L->q, "0.SelfAttention.q.weight", I * D);
        LOAD(L->k, "0.SelfAttention.k.weight", I * D);
        LOAD(L->v, "0.SelfAttention.v.weight", I * D);
        LOAD(L->o, "0.SelfAttention.o.weight", D * I);
        LOAD(L->rel_bias, "0.SelfAttention.relative_attention_bias.weight", (size_t)c->num_buckets * H);
        LOAD(L->ln_attn, "0.layer_norm.weight", D);
        LOAD(L->wi0, "1.DenseReluDense.wi_0.weight", F * D);
        LOAD(L->wi1, "1.DenseReluDense.wi_1.weight", F * D);
        LOAD(L->wo, "1.DenseReluDense.wo.weight", D * F);
        LOAD(L->ln_ff, "1.layer_norm.weight", D);
    }
#undef LOAD
    e->final_ln = p;
    if (st_set_read_f32(e->st, "encoder.final_layer_norm.weight", p, (int64_t)D)) goto fail;
    return e;
fail:
    core_error_push("loading umT5 encoder from %s: ", dir);
    t5_free(e);
    return NULL;
}

int t5_relative_bucket(int rel, int num_buckets, int max_distance) {
    int nb = num_buckets / 2, bucket = rel > 0 ? nb : 0, r = rel < 0 ? -rel : rel, max_exact = nb / 2;
    if (r < max_exact) return bucket + r;
    /* float32 as the reference: log(r / max_exact) / log(max_distance / max_exact) * (nb - max_exact), truncated */
    float v = logf((float)r / (float)max_exact) / (float)log((double)max_distance / max_exact);
    v = v * (float)(nb - max_exact);
    int large = max_exact + (int)v;
    return bucket + (large < nb - 1 ? large : nb - 1);
}

/* Self-attention core: q, k, v [B, S, H*Dk] -> o [B, S, H*Dk]; scores q.k (no scaling) + bias[h][bucket(j-i)],
 * keys with mask 0 left out, softmax in float with double sums. Returns 0, or -1 when scratch allocation fails.
 * Each score is the sequential fp32 sum over d of q[d] * k[d] (a product, then a sum, each rounded); the scores of
 * KB consecutive keys are computed together, one key per vector lane (the head's keys transposed first), which
 * changes no value and replaces a chain of Dk dependent adds per score (measured on `vgrpo bench umt5`, 512 tokens:
 * most of the encoder's time) by independent lanes; likewise the output sums run DB columns at a time over the keys
 * (each column's sum still in key order), in registers instead of a memory round trip per key. */
enum { KB = 32, DB = 16 };
static int attention(float *o, const float *q, const float *k, const float *v, const float *rel_bias,
                      const int *bucket_of, const int32_t *mask, int B, int S, int H, int Dk) {
    int I = H * Dk, oom = 0;
    const int Sp = (S + KB - 1) / KB * KB;
#pragma omp parallel reduction(| : oom)
    {
        float *sc = malloc((size_t)Sp * sizeof(float)), *kt = malloc((size_t)Dk * Sp * sizeof(float));
        double *acc = malloc((size_t)Dk * sizeof(double)), *pj = malloc((size_t)S * sizeof(double));
        double *vd = malloc((size_t)S * Dk * sizeof(double));
        int *jl = malloc((size_t)S * sizeof(int));
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                if (!sc || !acc || !kt || !pj || !jl || !vd) {
                    oom = 1;
                    continue;
                }
                const int32_t *m = mask ? mask + (size_t)b * S : NULL;
                for (int j = 0; j < Sp; j++) /* kt[d][j] = k_j[d]; keys past S zero (their scores are not used) */
                    for (int d = 0; d < Dk; d++)
                        kt[(size_t)d * Sp + j] = j < S ? k[((size_t)b * S + j) * I + (size_t)h * Dk + d] : 0.0f;
                for (int j = 0; j < S; j++) /* vd[j][d] = v_j[d] as double (exact), as the sums use it */
                    for (int d = 0; d < Dk; d++) vd[(size_t)j * Dk + d] = (double)v[((size_t)b * S + j) * I + (size_t)h * Dk + d];
                for (int i = 0; i < S; i++) {
                    const float *qi = q + ((size_t)b * S + i) * I + (size_t)h * Dk;
                    for (int j0 = 0; j0 < Sp; j0 += KB) {
                        float s[KB];
                        for (int jj = 0; jj < KB; jj++) s[jj] = 0;
                        for (int d = 0; d < Dk; d++) {
                            const float qd = qi[d], *kd = kt + (size_t)d * Sp + j0;
                            for (int jj = 0; jj < KB; jj++) s[jj] += qd * kd[jj];
                        }
                        for (int jj = 0; jj < KB; jj++) sc[j0 + jj] = s[jj];
                    }
                    float mx = -INFINITY;
                    for (int j = 0; j < S; j++) {
                        if (m && !m[j]) continue;
                        const float s = sc[j] + rel_bias[(size_t)bucket_of[j - i + S - 1] * H + h];
                        sc[j] = s;
                        if (s > mx) mx = s;
                    }
                    /* the probabilities and their sum in key order, then acc[d] = sum over those keys in order of
                     * p_j v_j[d], DB columns at a time with the accumulators in registers */
                    double sum = 0;
                    int nj = 0;
                    for (int j = 0; j < S; j++) {
                        if (m && !m[j]) continue;
                        double p = exp((double)sc[j] - mx);
                        sum += p;
                        pj[nj] = p, jl[nj++] = j;
                    }
                    int d0 = 0;
                    for (; d0 + DB <= Dk; d0 += DB) {
                        double a[DB];
                        for (int dd = 0; dd < DB; dd++) a[dd] = 0;
                        for (int t = 0; t < nj; t++) {
                            const double p = pj[t], *vj = vd + (size_t)jl[t] * Dk + d0;
                            for (int dd = 0; dd < DB; dd++) a[dd] += p * vj[dd];
                        }
                        for (int dd = 0; dd < DB; dd++) acc[d0 + dd] = a[dd];
                    }
                    for (int d = d0; d < Dk; d++) {
                        double a = 0;
                        for (int t = 0; t < nj; t++) a += pj[t] * vd[(size_t)jl[t] * Dk + d];
                        acc[d] = a;
                    }
                    float *oi = o + ((size_t)b * S + i) * I + (size_t)h * Dk;
                    for (int d = 0; d < Dk; d++) oi[d] = sum > 0 ? (float)(acc[d] / sum) : 0.0f;
                }
            }
        free(sc);
        free(kt);
        free(acc);
        free(pj);
        free(jl);
        free(vd);
    }
    return oom ? core_error("umt5: out of memory in attention") : 0;
}

int t5_forward(const t5_encoder *e, const int32_t *ids, const int32_t *mask, int B, int S, float *out) {
    const t5_config *c = &e->cfg;
    const k_ops *K = &k_cpu_ops;
    int D = c->d_model, H = c->num_heads, Dk = c->d_kv, I = H * Dk, F = c->d_ff;
    size_t N = (size_t)B * S;
    size_t esz = core_dtype_size(e->embed.dtype);
    for (size_t t = 0; t < N; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return core_error("umt5: token id %d at position %zu outside the vocabulary (%d)", ids[t], t, c->vocab_size);
    float *x = out; /* the residual stream lives in the output buffer */
    float *h = malloc(N * D * sizeof(float)), *rstd = malloc(N * sizeof(float));
    float *q = malloc(N * I * sizeof(float)), *k = malloc(N * I * sizeof(float)), *v = malloc(N * I * sizeof(float));
    float *att = malloc(N * I * sizeof(float)), *a = malloc(N * F * sizeof(float)), *g = malloc(N * F * sizeof(float));
    int *bucket_of = malloc((size_t)(2 * S) * sizeof(int));
    int rc = 0;
    if (!h || !rstd || !q || !k || !v || !att || !a || !g || !bucket_of) {
        rc = core_error("umt5: out of memory for %d x %d tokens", B, S);
        goto done;
    }
    for (int r = -(S - 1); r <= S - 1; r++) bucket_of[r + S - 1] = t5_relative_bucket(r, c->num_buckets, c->max_distance);
    for (size_t t = 0; t < N; t++)
        core_convert_to_f32(x + t * D, (const char *)e->embed.data + (size_t)ids[t] * D * esz, e->embed.dtype, (size_t)D);
    for (int l = 0; l < c->num_layers; l++) {
        const t5_layer *L = &e->layers[l];
        K->rmsnorm_forward(h, rstd, x, L->ln_attn, (int)N, D, c->eps);
        K->gemm(0, 1, (int)N, I, D, 1.0f, h, D, L->q, D, 0.0f, q, I, NULL);
        K->gemm(0, 1, (int)N, I, D, 1.0f, h, D, L->k, D, 0.0f, k, I, NULL);
        K->gemm(0, 1, (int)N, I, D, 1.0f, h, D, L->v, D, 0.0f, v, I, NULL);
        if ((rc = attention(att, q, k, v, L->rel_bias, bucket_of, mask, B, S, H, Dk))) goto done;
        K->gemm(0, 1, (int)N, D, I, 1.0f, att, I, L->o, I, 1.0f, x, D, NULL); /* x += o(att) */
        K->rmsnorm_forward(h, rstd, x, L->ln_ff, (int)N, D, c->eps);
        K->gemm(0, 1, (int)N, F, D, 1.0f, h, D, L->wi0, D, 0.0f, a, F, NULL);
        K->gelu_forward(g, a, (int64_t)N * F);
        K->gemm(0, 1, (int)N, F, D, 1.0f, h, D, L->wi1, D, 0.0f, a, F, NULL);
        for (size_t i = 0; i < N * F; i++) g[i] *= a[i];
        K->gemm(0, 1, (int)N, D, F, 1.0f, g, F, L->wo, F, 1.0f, x, D, NULL); /* x += wo(gelu(wi_0 h) * wi_1 h) */
    }
    memcpy(h, x, N * D * sizeof(float));
    K->rmsnorm_forward(out, rstd, h, e->final_ln, (int)N, D, c->eps);
done:
    free(h), free(rstd), free(q), free(k), free(v), free(att), free(a), free(g), free(bucket_of);
    return rc;
}
