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

size_t t5_param_floats(const t5_config *c) {
    const size_t D = (size_t)c->d_model, I = (size_t)c->num_heads * c->d_kv, F = (size_t)c->d_ff;
    const size_t per = 4 * I * D + (size_t)c->num_buckets * c->num_heads + 2 * D + 3 * F * D; /* one block */
    return per * (size_t)c->num_layers + D;
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
    e->params = malloc(t5_param_floats(c) * sizeof(float));
    e->layers = calloc((size_t)c->num_layers, sizeof *e->layers);
    if (!e->params || !e->layers) {
        core_error("umt5: out of memory for %zu parameters", t5_param_floats(c));
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

/* t5_attention (umt5.h). Each score is the sequential fp32 sum over d of q[d] * k[d] (a product, then a sum, each
 * rounded; no fma); each output column is the sequential double sum over the kept keys, in key order, of
 * p_j * v_j[d] (likewise). The loops below keep exactly those chains and only choose how many run side by side: R query rows at once, each with
 * the scores of 64 keys (one key per vector lane, the head's keys transposed first) and then 32 output columns, so
 * that every key's loads serve R rows and the chains' add latency hides behind independent lanes instead of one
 * dependent add per key (measured on `vgrpo bench umt5`, 512 tokens, 2 threads: 144 -> 99 ms, the attention had been
 * most of the encoder's time). GCC vector extensions: AVX-512 registers under -march=native on such a machine,
 * narrower ones or scalars elsewhere, the same values (tests/test_umt5.c: t5_attention_chains_bitwise). */
typedef float t5_v16f __attribute__((vector_size(64)));
typedef double t5_v8d __attribute__((vector_size(64)));
/* SKV keys per score vector, SDV columns per output vector; R query rows at a time share each key's loads (the rows
 * of a head keep the same keys: the mask is per key). */
enum { SKV = 16, SDV = 8, R = 4 };

static inline t5_v16f ld16f(const float *p) {
    t5_v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline t5_v8d ld8d(const double *p) {
    t5_v8d v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* sc[r][j0 .. j0 + NV*SKV) for the NR rows q[r] (row stride qs; sc row stride Sp) = the score chains against the
 * transposed keys kt (row stride Sp). */
#define T5_SCORES(NR, NV)                                                                                         \
    static inline void scores_##NR##x##NV(float *sc, const float *q, ptrdiff_t qs, const float *kt, int Sp,      \
                                          int Dk, int j0) {                                                       \
        t5_v16f s[NR][NV];                                                                                        \
        for (int r = 0; r < NR; r++)                                                                              \
            for (int u = 0; u < NV; u++) s[r][u] = (t5_v16f){0};                                                  \
        for (int d = 0; d < Dk; d++) {                                                                            \
            const float *kd = kt + (size_t)d * Sp + j0;                                                           \
            t5_v16f kv[NV];                                                                                       \
            for (int u = 0; u < NV; u++) kv[u] = ld16f(kd + u * SKV);                                             \
            for (int r = 0; r < NR; r++) {                                                                        \
                const t5_v16f qd = (t5_v16f){0} + q[r * qs + d];                                                  \
                for (int u = 0; u < NV; u++) s[r][u] += qd * kv[u];                                               \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < NR; r++) memcpy(sc + (size_t)r * Sp + j0, s[r], sizeof s[r]);                         \
    }
T5_SCORES(4, 4)
T5_SCORES(1, 4)
T5_SCORES(4, 1)
T5_SCORES(1, 1)
#undef T5_SCORES

/* acc[r][d0 .. d0 + NV*SDV) (row stride Dk) = sum over t < nj in order of pj[r][t] * vd[jl[t]][d] for the NR rows
 * (pj row stride S; vd rows of Dk doubles). */
#define T5_COLUMNS(NR, NV)                                                                                        \
    static inline void columns_##NR##x##NV(double *acc, const double *pj, int S, const int *jl, int nj,           \
                                           const double *vd, int Dk, int d0) {                                    \
        t5_v8d a[NR][NV];                                                                                         \
        for (int r = 0; r < NR; r++)                                                                              \
            for (int u = 0; u < NV; u++) a[r][u] = (t5_v8d){0};                                                   \
        for (int t = 0; t < nj; t++) {                                                                            \
            const double *vj = vd + (size_t)jl[t] * Dk + d0;                                                      \
            t5_v8d vv[NV];                                                                                        \
            for (int u = 0; u < NV; u++) vv[u] = ld8d(vj + u * SDV);                                              \
            for (int r = 0; r < NR; r++) {                                                                        \
                const t5_v8d p = (t5_v8d){0} + pj[(size_t)r * S + t];                                             \
                for (int u = 0; u < NV; u++) a[r][u] += p * vv[u];                                                \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < NR; r++) memcpy(acc + (size_t)r * Dk + d0, a[r], sizeof a[r]);                        \
    }
T5_COLUMNS(4, 4)
T5_COLUMNS(1, 4)
T5_COLUMNS(4, 1)
T5_COLUMNS(1, 1)
#undef T5_COLUMNS

/* Rows i0 .. i0 + nr - 1 (nr = R or 1) of one head: scores, softmax, outputs (the chains of the comment above);
 * bias_rel[j - i + S - 1]: the head's bias for key j of query i. */
static void attention_rows(float *o, const float *q, const float *kt, const double *vd, float *sc, double *pj,
                           double *acc, int *jl, const float *bias_rel, const int32_t *m, int b, int h, int S, int Sp,
                           int H, int Dk, int i0, int nr) {
    const int I = H * Dk;
    const float *q0 = q + ((size_t)b * S + i0) * I + (size_t)h * Dk;
    int j0 = 0;
    for (; j0 + 4 * SKV <= Sp; j0 += 4 * SKV)
        (nr == R ? scores_4x4 : scores_1x4)(sc, q0, I, kt, Sp, Dk, j0);
    for (; j0 < Sp; j0 += SKV) (nr == R ? scores_4x1 : scores_1x1)(sc, q0, I, kt, Sp, Dk, j0);
    double sum[R];
    int nj = 0;
    for (int r = 0; r < nr; r++) {
        /* the scores plus the head's bias by relative position; their maximum over the kept keys in 16 running
         * maxima (the same value whatever the order, but for the sign of a zero, which exp(s - max) does not see) */
        const float *br = bias_rel + (S - 1 - (i0 + r));
        float *sr = sc + (size_t)r * Sp, mxl[16];
        for (int l = 0; l < 16; l++) mxl[l] = -INFINITY;
        int j = 0;
        for (; j + 16 <= S; j += 16) /* (masked keys' sums are written too, never read) */
            for (int l = 0; l < 16; l++) {
                const float s = sr[j + l] + br[j + l], c = m && !m[j + l] ? -INFINITY : s;
                sr[j + l] = s;
                mxl[l] = c > mxl[l] ? c : mxl[l];
            }
        for (; j < S; j++) {
            const float s = sr[j] + br[j], c = m && !m[j] ? -INFINITY : s;
            sr[j] = s;
            mxl[j & 15] = c > mxl[j & 15] ? c : mxl[j & 15];
        }
        float mx = -INFINITY;
        for (int l = 0; l < 16; l++)
            if (mxl[l] > mx) mx = mxl[l];
        /* the probabilities and their sum in key order */
        double sm = 0, *pr = pj + (size_t)r * S;
        nj = 0;
        for (int j = 0; j < S; j++) {
            if (m && !m[j]) continue;
            double p = exp((double)sr[j] - mx);
            sm += p;
            pr[nj] = p, jl[nj++] = j;
        }
        sum[r] = sm;
    }
    int d0 = 0;
    for (; d0 + 4 * SDV <= Dk; d0 += 4 * SDV) (nr == R ? columns_4x4 : columns_1x4)(acc, pj, S, jl, nj, vd, Dk, d0);
    for (; d0 + SDV <= Dk; d0 += SDV) (nr == R ? columns_4x1 : columns_1x1)(acc, pj, S, jl, nj, vd, Dk, d0);
    for (int r = 0; r < nr; r++) {
        double *ar = acc + (size_t)r * Dk;
        const double *pr = pj + (size_t)r * S;
        for (int d = d0; d < Dk; d++) {
            double a = 0;
            for (int t = 0; t < nj; t++) a += pr[t] * vd[(size_t)jl[t] * Dk + d];
            ar[d] = a;
        }
        float *oi = o + ((size_t)b * S + i0 + r) * I + (size_t)h * Dk;
        for (int d = 0; d < Dk; d++) oi[d] = sum[r] > 0 ? (float)(ar[d] / sum[r]) : 0.0f;
    }
}

int t5_attention(float *o, const float *q, const float *k, const float *v, const float *rel_bias, const int *bucket_of,
                 const int32_t *mask, int B, int S, int H, int Dk) {
    int I = H * Dk, oom = 0;
    const int Sp = (S + SKV - 1) / SKV * SKV;
#pragma omp parallel reduction(| : oom)
    {
        float *sc = malloc((size_t)R * Sp * sizeof(float)), *kt = malloc((size_t)Dk * Sp * sizeof(float));
        double *acc = malloc((size_t)R * Dk * sizeof(double)), *pj = malloc((size_t)R * S * sizeof(double));
        double *vd = malloc((size_t)S * Dk * sizeof(double));
        int *jl = malloc((size_t)S * sizeof(int));
        float *bias_rel = malloc((size_t)(2 * S - 1) * sizeof(float));
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                if (!sc || !acc || !kt || !pj || !jl || !vd || !bias_rel) {
                    oom = 1;
                    continue;
                }
                const int32_t *m = mask ? mask + (size_t)b * S : NULL;
                for (int r = 0; r < 2 * S - 1; r++) bias_rel[r] = rel_bias[(size_t)bucket_of[r] * H + h];
                for (int j = 0; j < Sp; j++) /* kt[d][j] = k_j[d]; keys past S zero (their scores are not used) */
                    for (int d = 0; d < Dk; d++)
                        kt[(size_t)d * Sp + j] = j < S ? k[((size_t)b * S + j) * I + (size_t)h * Dk + d] : 0.0f;
                for (int j = 0; j < S; j++) /* vd[j][d] = v_j[d] as double (exact), as the sums use it */
                    for (int d = 0; d < Dk; d++) vd[(size_t)j * Dk + d] = (double)v[((size_t)b * S + j) * I + (size_t)h * Dk + d];
                int i = 0;
                for (; i + R <= S; i += R)
                    attention_rows(o, q, kt, vd, sc, pj, acc, jl, bias_rel, m, b, h, S, Sp, H, Dk, i, R);
                for (; i < S; i++)
                    attention_rows(o, q, kt, vd, sc, pj, acc, jl, bias_rel, m, b, h, S, Sp, H, Dk, i, 1);
            }
        free(sc);
        free(kt);
        free(acc);
        free(pj);
        free(jl);
        free(vd);
        free(bias_rel);
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
        if ((rc = t5_attention(att, q, k, v, L->rel_bias, bucket_of, mask, B, S, H, Dk))) goto done;
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
