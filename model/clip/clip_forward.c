/* model/clip/clip_forward.c — CLIP's vision and text towers, forward, fp32 on the CPU op table (see clip_model.h).
 *
 * Follows transformers' modeling_clip.py (CLIPVisionEmbeddings, CLIPTextEmbeddings, CLIPEncoderLayer,
 * CLIPVisionModel, CLIPTextModel, CLIPModel) step by step; open_clip's VisionTransformer / TextTransformer compute
 * the same with fused q/k/v weights. GEMMs, LayerNorm and the vision tower's attention go through k_cpu_ops (each
 * row's result is independent of batch mates and thread count). The text tower's causal attention is computed here
 * (the op table's attention has no mask; CLIP's 77-token rows make it a small part of the work), as are quick-GELU
 * and the erf GELU (the op table's GELU is the tanh form). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/body/kb_act.h"
#include "kernels/kernels.h"
#include "model/clip/clip_internal.h"

/* Activations of one tower for T = B * S tokens. */
typedef struct {
    float *x;          /* [T, W] the residual stream */
    float *h;          /* [T, W] LayerNorm output */
    float *q, *k, *v;  /* [T, W] each, [B, S, H, Dh] */
    float *a;          /* [T, W] attention output (vision: also the patch embeddings) */
    float *m;          /* [T, max(F, ...)] MLP hidden (vision: also the patches) */
    float *mean, *rstd; /* [T] */
    float *lse;        /* [B, H, S] (vision attention) */
    float *pooled;     /* [B, W] x 2: the pooled rows and their LayerNorm */
} clip_acts;

static size_t vision_m_floats(const clip_config *c, int B) {
    const size_t np = (size_t)clip_grid_h(c) * clip_grid_w(c), S = np + 1;
    const size_t mlp = (size_t)B * S * c->vision.mlp, pat = (size_t)B * np * c->channels * c->patch * c->patch;
    return mlp > pat ? mlp : pat;
}

/* Floats of a tower's activations: 6 [T, W] buffers, the MLP buffer, mean/rstd, lse, the pooled rows. */
static size_t acts_floats(size_t T, size_t W, size_t m_floats, size_t lse, size_t B) {
    return 6 * T * W + m_floats + 2 * T + lse + 2 * B * W;
}

static size_t vision_act_floats(const clip_config *c, int B) {
    const size_t S = (size_t)clip_grid_h(c) * clip_grid_w(c) + 1, T = (size_t)B * S;
    return acts_floats(T, (size_t)c->vision.width, vision_m_floats(c, B), (size_t)B * c->vision.heads * S,
                       (size_t)B);
}

static size_t text_act_floats(const clip_config *c, int B, int S) {
    const size_t T = (size_t)B * S;
    return acts_floats(T, (size_t)c->text.width, T * c->text.mlp, 0, (size_t)B);
}

size_t clip_param_bytes(const clip_config *c) {
    return (clip_vision_param_floats(c) + clip_text_param_floats(c) + 1) * sizeof(float);
}

size_t clip_act_bytes(const clip_config *c, int n_images, int n_prompts, int S) {
    size_t v = n_images > 0 ? vision_act_floats(c, n_images) : 0;
    size_t t = n_prompts > 0 && S > 0 ? text_act_floats(c, n_prompts, S) : 0;
    return (v > t ? v : t) * sizeof(float);
}

static float *acts_alloc(clip_acts *a, size_t T, size_t W, size_t m_floats, size_t lse, size_t B) {
    float *p = malloc(acts_floats(T, W, m_floats, lse, B) * sizeof(float));
    if (!p) return NULL;
    float *q = p;
    a->x = q, q += T * W;
    a->h = q, q += T * W;
    a->q = q, q += T * W;
    a->k = q, q += T * W;
    a->v = q, q += T * W;
    a->a = q, q += T * W;
    a->m = q, q += m_floats;
    a->mean = q, q += T;
    a->rstd = q, q += T;
    a->lse = lse ? q : NULL, q += lse;
    a->pooled = q;
    return p;
}

/* ------------------------------------------------------------------------------------------------------------
 * Element-wise activations (transformers ACT2FN; open_clip QuickGELU / nn.GELU) */

static void activation(float *x, size_t n, clip_act act, const k_ops *ops) {
    if (act == CLIP_ACT_GELU_TANH) { /* gelu_new / gelu_pytorch_tanh: the op table's GELU */
        ops->gelu_forward(x, x, (int64_t)n);
        return;
    }
    const int par = n >= K_PAR_MIN_ELEMS;
    if (act == CLIP_ACT_QUICK_GELU) { /* x * sigmoid(1.702 x); kb_expf (~2 ulp) vectorises, libm's expf does not */
#pragma omp parallel for schedule(static) if (par)
        for (size_t i = 0; i < n; i++) x[i] = x[i] * (1.0f / (1.0f + kb_expf(-(1.702f * x[i]))));
    } else { /* erf GELU: x * 0.5 * (1 + erf(x / sqrt(2))) */
#pragma omp parallel for schedule(static) if (par)
        for (size_t i = 0; i < n; i++) x[i] = x[i] * 0.5f * (1.0f + erff(x[i] * (float)M_SQRT1_2));
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * Causal self-attention for the text tower: q, k, v, o [B, S, H, Dh]; query i sees keys 0..i.
 * score = scale * q.k (fp32 sum over d in order), p = exp(score - max) and the weighted sum of values in double,
 * o = sum / sum(p). Reference: transformers eager_attention_forward with create_causal_mask; open_clip's
 * nn.MultiheadAttention with the causal attn_mask. */
static int causal_attention(float *o, const float *q, const float *k, const float *v, int B, int S, int H, int Dh,
                            float scale) {
    const size_t W = (size_t)H * Dh;
    int fail = 0;
#pragma omp parallel if ((size_t)B * H * S * S * Dh >= K_PAR_MIN_ELEMS) reduction(| : fail)
    {
        double *p = malloc(((size_t)S + (size_t)Dh) * sizeof *p), *acc = p + S;
        if (!p) fail = 1;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                if (!p) continue;
                const float *qb = q + (size_t)b * S * W + (size_t)h * Dh, *kb = k + (size_t)b * S * W + (size_t)h * Dh,
                            *vb = v + (size_t)b * S * W + (size_t)h * Dh;
                float *ob = o + (size_t)b * S * W + (size_t)h * Dh;
                for (int i = 0; i < S; i++) {
                    const float *qi = qb + (size_t)i * W;
                    float mx = -INFINITY;
                    for (int j = 0; j <= i; j++) {
                        const float *kj = kb + (size_t)j * W;
                        float s = 0;
                        for (int d = 0; d < Dh; d++) s += qi[d] * kj[d];
                        s *= scale;
                        p[j] = s;
                        if (s > mx) mx = s;
                    }
                    double sum = 0;
                    for (int d = 0; d < Dh; d++) acc[d] = 0;
                    for (int j = 0; j <= i; j++) {
                        double e = exp(p[j] - (double)mx);
                        sum += e;
                        const float *vj = vb + (size_t)j * W;
                        for (int d = 0; d < Dh; d++) acc[d] += e * vj[d];
                    }
                    float *oi = ob + (size_t)i * W;
                    for (int d = 0; d < Dh; d++) oi[d] = (float)(acc[d] / sum);
                }
            }
        free(p);
    }
    return fail ? core_error("clip: out of memory in the text attention") : 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * One encoder layer (CLIPEncoderLayer): x += out(attn(LN1(x))); x += fc2(act(fc1(LN2(x)))). The residual adds are
 * the GEMMs' beta = 1. */
static int encoder_layer(const k_ops *ops, const clip_tower_config *c, const clip_layer *L, clip_acts *a, int B,
                         int S, int causal) {
    const int T = B * S, W = c->width, F = c->mlp, H = c->heads, Dh = W / H;
    const float scale = (float)(1.0 / sqrt((double)Dh));
    const size_t WW = (size_t)W * W;
    ops->layernorm_forward(a->h, a->mean, a->rstd, a->x, L->ln1_w, L->ln1_b, T, W, c->eps);
    ops->gemm(0, 1, T, W, W, 1.0f, a->h, W, L->qkv_w, W, 0.0f, a->q, W, L->qkv_b);
    ops->gemm(0, 1, T, W, W, 1.0f, a->h, W, L->qkv_w + WW, W, 0.0f, a->k, W, L->qkv_b + W);
    ops->gemm(0, 1, T, W, W, 1.0f, a->h, W, L->qkv_w + 2 * WW, W, 0.0f, a->v, W, L->qkv_b + 2 * W);
    if (causal) {
        if (causal_attention(a->a, a->q, a->k, a->v, B, S, H, Dh, scale)) return -1;
    } else {
        core_error_clear();
        ops->attention_forward(a->a, a->lse, a->q, a->k, a->v, B, S, S, H, Dh, scale);
        if (*core_last_error()) return core_error_push("clip: vision attention: ");
    }
    ops->gemm(0, 1, T, W, W, 1.0f, a->a, W, L->out_w, W, 1.0f, a->x, W, L->out_b);
    ops->layernorm_forward(a->h, a->mean, a->rstd, a->x, L->ln2_w, L->ln2_b, T, W, c->eps);
    ops->gemm(0, 1, T, F, W, 1.0f, a->h, W, L->fc1_w, W, 0.0f, a->m, F, L->fc1_b);
    activation(a->m, (size_t)T * F, c->act, ops);
    ops->gemm(0, 1, T, W, F, 1.0f, a->m, F, L->fc2_w, F, 1.0f, a->x, W, L->fc2_b);
    return 0;
}

/* pooled rows [B, W] -> LN -> embeds [B, E] = LN(pooled) @ proj^T (+ bias). */
static void pool_project(const k_ops *ops, const clip_tower *t, const clip_tower_config *c, clip_acts *a, int B,
                         int E, float *embeds) {
    const int W = c->width;
    float *ln = a->pooled + (size_t)B * W;
    ops->layernorm_forward(ln, a->mean, a->rstd, a->pooled, t->post_w, t->post_b, B, W, c->eps);
    ops->gemm(0, 1, B, E, W, 1.0f, ln, W, t->proj_w, W, 0.0f, embeds, E, t->proj_b);
}

/* ------------------------------------------------------------------------------------------------------------ */

int clip_encode_image(const clip_model *m, const float *pixels, int B, float *embeds) {
    const clip_config *c = &m->cfg;
    const clip_tower *t = &m->vision;
    if (B < 1) return core_error("clip_encode_image: batch %d < 1", B);
    const k_ops *ops = &k_cpu_ops;
    const int gh = clip_grid_h(c), gw = clip_grid_w(c), np = gh * gw, S = np + 1, W = c->vision.width;
    const int C = c->channels, P = c->patch, Hi = c->image_h, Wi = c->image_w, cpp = C * P * P;
    const size_t T = (size_t)B * S;
    clip_acts a;
    float *buf = acts_alloc(&a, T, (size_t)W, vision_m_floats(c, B), (size_t)B * c->vision.heads * S, (size_t)B);
    if (!buf) return core_error("clip_encode_image: out of memory for %d images", B);
    /* Conv2d(kernel = stride = P, no bias) as patchify + GEMM: patches [B, np, C*P*P] in (c, kh, kw) order */
#pragma omp parallel for collapse(2) schedule(static) if (T * cpp >= K_PAR_MIN_ELEMS)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < np; g++) {
            const int gy = g / gw, gx = g % gw;
            float *dst = a.m + ((size_t)b * np + g) * cpp;
            for (int ch = 0; ch < C; ch++)
                for (int ky = 0; ky < P; ky++)
                    memcpy(dst + ((size_t)ch * P + ky) * P,
                           pixels + (((size_t)b * C + ch) * Hi + (size_t)gy * P + ky) * Wi + (size_t)gx * P,
                           (size_t)P * sizeof(float));
        }
    ops->gemm(0, 1, B * np, W, cpp, 1.0f, a.m, cpp, t->embed, cpp, 0.0f, a.a, W, NULL);
    /* [class; patches] + positions */
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++) {
            const float *src = s == 0 ? t->class_emb : a.a + ((size_t)b * np + s - 1) * W;
            const float *pos = t->pos + (size_t)s * W;
            float *x = a.x + ((size_t)b * S + s) * W;
            for (int i = 0; i < W; i++) x[i] = src[i] + pos[i];
        }
    if (t->pre_w) {
        ops->layernorm_forward(a.h, a.mean, a.rstd, a.x, t->pre_w, t->pre_b, (int)T, W, c->vision.eps);
        memcpy(a.x, a.h, T * W * sizeof(float));
    }
    for (int l = 0; l < c->vision.layers; l++)
        if (encoder_layer(ops, &c->vision, &t->layers[l], &a, B, S, 0)) {
            free(buf);
            return -1;
        }
    for (int b = 0; b < B; b++) memcpy(a.pooled + (size_t)b * W, a.x + (size_t)b * S * W, W * sizeof(float));
    pool_project(ops, t, &c->vision, &a, B, c->projection_dim, embeds);
    free(buf);
    return 0;
}

int clip_pool_index(const clip_config *c, const int32_t *ids, int S) {
    int best = 0;
    switch (c->pool) {
    case CLIP_POOL_ARGMAX: /* torch argmax: the first of equal maxima */
        for (int s = 1; s < S; s++)
            if (ids[s] > ids[best]) best = s;
        return best;
    case CLIP_POOL_EOS: /* (ids == eos).int().argmax(): the first eos, 0 when none */
        for (int s = 0; s < S; s++)
            if (ids[s] == c->eos_token_id) return s;
        return 0;
    case CLIP_POOL_FIRST: return 0;
    case CLIP_POOL_LAST: return S - 1;
    }
    return 0;
}

int clip_encode_text(const clip_model *m, const int32_t *ids, int B, int S, float *embeds) {
    const clip_config *c = &m->cfg;
    const clip_tower *t = &m->text;
    if (B < 1) return core_error("clip_encode_text: batch %d < 1", B);
    if (S < 1 || S > c->max_positions)
        return core_error("clip_encode_text: %d tokens per row; the model takes 1 to %d", S, c->max_positions);
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            if (ids[(size_t)b * S + s] < 0 || ids[(size_t)b * S + s] >= c->vocab_size)
                return core_error("clip_encode_text: token id %d at row %d, position %d is outside [0, %d)",
                                  ids[(size_t)b * S + s], b, s, c->vocab_size);
    const k_ops *ops = &k_cpu_ops;
    const int W = c->text.width;
    const size_t T = (size_t)B * S;
    clip_acts a;
    float *buf = acts_alloc(&a, T, (size_t)W, T * c->text.mlp, 0, (size_t)B);
    if (!buf) return core_error("clip_encode_text: out of memory for %d prompts", B);
    for (size_t r = 0; r < T; r++) {
        const float *e = t->embed + (size_t)ids[r] * W, *pos = t->pos + (r % (size_t)S) * W;
        float *x = a.x + r * W;
        for (int i = 0; i < W; i++) x[i] = e[i] + pos[i];
    }
    for (int l = 0; l < c->text.layers; l++)
        if (encoder_layer(ops, &c->text, &t->layers[l], &a, B, S, 1)) {
            free(buf);
            return -1;
        }
    /* final LayerNorm is per token: applied to the pooled rows only */
    for (int b = 0; b < B; b++) {
        const int s = clip_pool_index(c, ids + (size_t)b * S, S);
        memcpy(a.pooled + (size_t)b * W, a.x + ((size_t)b * S + s) * W, W * sizeof(float));
    }
    pool_project(ops, t, &c->text, &a, B, c->projection_dim, embeds);
    free(buf);
    return 0;
}

void clip_logits(float *logits, const float *img, int Bi, const float *txt, int Bt, int D, float logit_scale) {
    const float s = expf(logit_scale);
    for (int i = 0; i < Bi; i++) {
        double ni = 0;
        for (int d = 0; d < D; d++) ni += (double)img[(size_t)i * D + d] * img[(size_t)i * D + d];
        ni = ni > 0 ? sqrt(ni) : 1;
        for (int t = 0; t < Bt; t++) {
            double nt = 0, dot = 0;
            for (int d = 0; d < D; d++) {
                nt += (double)txt[(size_t)t * D + d] * txt[(size_t)t * D + d];
                dot += (double)img[(size_t)i * D + d] * txt[(size_t)t * D + d];
            }
            nt = nt > 0 ? sqrt(nt) : 1;
            logits[(size_t)i * Bt + t] = (float)(dot / (ni * nt)) * s;
        }
    }
}
