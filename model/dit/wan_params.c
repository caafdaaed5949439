/* model/dit/wan_params.c — the parameter table of WanTransformer3DModel (names, shapes, offsets into one flat
 * buffer, in diffusers' state_dict order), named pointers into a flat buffer, model allocation and random init.
 * The order is the one torch's Module.state_dict() yields: a module's own parameters first, then its children in
 * registration order (checked against diffusers by tests/fixtures/wan_names_<preset>.txt). */
#include "model/dit/wan_dit.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "core/tensor.h"

typedef struct {
    wan_layout *L;
    int cap;
    int oom;
} builder;

static void add(builder *b, int ndim, const int64_t *shape, const char *fmt, ...) {
    wan_layout *L = b->L;
    if (b->oom) return;
    if (L->count == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        wan_tensor *t = realloc(L->tensors, (size_t)cap * sizeof *t);
        if (!t) {
            b->oom = 1;
            return;
        }
        L->tensors = t;
        b->cap = cap;
    }
    wan_tensor *t = &L->tensors[L->count++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= shape[i];
    }
    t->offset = L->numel;
    L->numel += t->numel;
}

#define SHAPE(...) (sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

/* nn.Linear(in, out): weight [out, in], bias [out]. */
static void linear(builder *b, int64_t in, int64_t out, const char *prefix) {
    add(b, SHAPE(out, in), "%s.weight", prefix);
    add(b, SHAPE(out), "%s.bias", prefix);
}

static void attention(builder *b, int64_t D, int layer, const char *which) {
    char p[64];
    const char *proj[] = {"to_q", "to_k", "to_v", "to_out.0"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "blocks.%d.%s.%s", layer, which, proj[i]);
        linear(b, D, D, p);
    }
    add(b, SHAPE(D), "blocks.%d.%s.norm_q.weight", layer, which);
    add(b, SHAPE(D), "blocks.%d.%s.norm_k.weight", layer, which);
}

int wan_layout_init(wan_layout *L, const wan_config *cfg) {
    memset(L, 0, sizeof *L);
    if (wan_config_validate(cfg, "wan config")) return -1;
    L->cfg = *cfg;
    builder b = {L, 0, 0};
    const int64_t D = wan_dim(cfg), C = cfg->in_channels;
    const int64_t pt = cfg->patch_size[0], ph = cfg->patch_size[1], pw = cfg->patch_size[2];
    char p[64];
    /* WanTransformer3DModel: own parameter first, then rope (no parameters), patch_embedding, condition_embedder,
     * blocks, norm_out (no affine), proj_out. */
    add(&b, SHAPE(1, 2, D), "scale_shift_table");
    add(&b, SHAPE(D, C, pt, ph, pw), "patch_embedding.weight");
    add(&b, SHAPE(D), "patch_embedding.bias");
    linear(&b, cfg->freq_dim, D, "condition_embedder.time_embedder.linear_1");
    linear(&b, D, D, "condition_embedder.time_embedder.linear_2");
    linear(&b, D, 6 * D, "condition_embedder.time_proj");
    linear(&b, cfg->text_dim, D, "condition_embedder.text_embedder.linear_1");
    linear(&b, D, D, "condition_embedder.text_embedder.linear_2");
    for (int l = 0; l < cfg->num_layers; l++) {
        /* WanTransformerBlock: scale_shift_table, norm1 (none), attn1, attn2, norm2, ffn, norm3 (none). */
        add(&b, SHAPE(1, 6, D), "blocks.%d.scale_shift_table", l);
        attention(&b, D, l, "attn1");
        attention(&b, D, l, "attn2");
        if (cfg->cross_attn_norm) {
            add(&b, SHAPE(D), "blocks.%d.norm2.weight", l);
            add(&b, SHAPE(D), "blocks.%d.norm2.bias", l);
        }
        snprintf(p, sizeof p, "blocks.%d.ffn.net.0.proj", l);
        linear(&b, D, cfg->ffn_dim, p);
        snprintf(p, sizeof p, "blocks.%d.ffn.net.2", l);
        linear(&b, cfg->ffn_dim, D, p);
    }
    linear(&b, D, (int64_t)cfg->out_channels * pt * ph * pw, "proj_out");
    if (b.oom) {
        wan_layout_free(L);
        return core_error("wan layout: out of memory");
    }
    return 0;
}

void wan_layout_free(wan_layout *L) {
    free(L->tensors);
    memset(L, 0, sizeof *L);
}

int wan_layout_find(const wan_layout *L, const char *name) {
    for (int i = 0; i < L->count; i++)
        if (!strcmp(L->tensors[i].name, name)) return i;
    return -1;
}

int wan_layout_check_finite(const wan_layout *L, const float *base, const char *label, const char *prefix) {
    char name[WAN_NAME_MAX + 96];
    for (int i = 0; i < L->count; i++) {
        const wan_tensor *t = &L->tensors[i];
        if (core_f32_first_nonfinite(base + t->offset, (size_t)t->numel) < 0) continue;
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", t->name);
        return core_f32_check_finite(base + t->offset, (size_t)t->numel, label, name);
    }
    return 0;
}

/* Pointer to tensor `name` in base, or NULL when the layout has no such tensor. */
static float *ptr(const wan_layout *L, float *base, const char *fmt, ...) {
    char name[WAN_NAME_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int i = wan_layout_find(L, name);
    return i < 0 ? NULL : base + L->tensors[i].offset;
}

static void bind_attn(wan_attn_weights *a, const wan_layout *L, float *base, int l, const char *which) {
    a->to_q_w = ptr(L, base, "blocks.%d.%s.to_q.weight", l, which);
    a->to_q_b = ptr(L, base, "blocks.%d.%s.to_q.bias", l, which);
    a->to_k_w = ptr(L, base, "blocks.%d.%s.to_k.weight", l, which);
    a->to_k_b = ptr(L, base, "blocks.%d.%s.to_k.bias", l, which);
    a->to_v_w = ptr(L, base, "blocks.%d.%s.to_v.weight", l, which);
    a->to_v_b = ptr(L, base, "blocks.%d.%s.to_v.bias", l, which);
    a->to_out_w = ptr(L, base, "blocks.%d.%s.to_out.0.weight", l, which);
    a->to_out_b = ptr(L, base, "blocks.%d.%s.to_out.0.bias", l, which);
    a->norm_q = ptr(L, base, "blocks.%d.%s.norm_q.weight", l, which);
    a->norm_k = ptr(L, base, "blocks.%d.%s.norm_k.weight", l, which);
}

int wan_weights_bind(wan_weights *w, const wan_layout *L, float *base) {
    memset(w, 0, sizeof *w);
    const int nl = L->cfg.num_layers;
    w->blocks = calloc((size_t)nl, sizeof *w->blocks);
    if (!w->blocks) return core_error("wan weights: out of memory");
    w->num_layers = nl;
    w->scale_shift_table = ptr(L, base, "scale_shift_table");
    w->patch_w = ptr(L, base, "patch_embedding.weight");
    w->patch_b = ptr(L, base, "patch_embedding.bias");
    w->time1_w = ptr(L, base, "condition_embedder.time_embedder.linear_1.weight");
    w->time1_b = ptr(L, base, "condition_embedder.time_embedder.linear_1.bias");
    w->time2_w = ptr(L, base, "condition_embedder.time_embedder.linear_2.weight");
    w->time2_b = ptr(L, base, "condition_embedder.time_embedder.linear_2.bias");
    w->tproj_w = ptr(L, base, "condition_embedder.time_proj.weight");
    w->tproj_b = ptr(L, base, "condition_embedder.time_proj.bias");
    w->text1_w = ptr(L, base, "condition_embedder.text_embedder.linear_1.weight");
    w->text1_b = ptr(L, base, "condition_embedder.text_embedder.linear_1.bias");
    w->text2_w = ptr(L, base, "condition_embedder.text_embedder.linear_2.weight");
    w->text2_b = ptr(L, base, "condition_embedder.text_embedder.linear_2.bias");
    w->proj_out_w = ptr(L, base, "proj_out.weight");
    w->proj_out_b = ptr(L, base, "proj_out.bias");
    for (int l = 0; l < nl; l++) {
        wan_block_weights *b = &w->blocks[l];
        b->scale_shift_table = ptr(L, base, "blocks.%d.scale_shift_table", l);
        bind_attn(&b->attn1, L, base, l, "attn1");
        bind_attn(&b->attn2, L, base, l, "attn2");
        b->norm2_w = ptr(L, base, "blocks.%d.norm2.weight", l);
        b->norm2_b = ptr(L, base, "blocks.%d.norm2.bias", l);
        b->ffn1_w = ptr(L, base, "blocks.%d.ffn.net.0.proj.weight", l);
        b->ffn1_b = ptr(L, base, "blocks.%d.ffn.net.0.proj.bias", l);
        b->ffn2_w = ptr(L, base, "blocks.%d.ffn.net.2.weight", l);
        b->ffn2_b = ptr(L, base, "blocks.%d.ffn.net.2.bias", l);
    }
    return 0;
}

void wan_weights_free(wan_weights *w) {
    free(w->blocks);
    memset(w, 0, sizeof *w);
}

static float *alloc_floats(int64_t n) {
    float *p = NULL;
    /* 64-byte aligned for the GEMM and vector loops. */
    if (posix_memalign((void **)&p, 64, (size_t)(n > 0 ? n : 1) * sizeof(float))) return NULL;
    memset(p, 0, (size_t)n * sizeof(float));
    return p;
}

int wan_model_init(wan_model *m, const wan_config *cfg) {
    memset(m, 0, sizeof *m);
    if (wan_layout_init(&m->layout, cfg)) return -1;
    m->cfg = *cfg;
    m->params = alloc_floats(m->layout.numel);
    if (!m->params) {
        long long n = (long long)m->layout.numel;
        wan_model_free(m);
        return core_error("wan model: out of memory for %lld parameters (%.1f GB)", n, n * 4e-9);
    }
    if (wan_weights_bind(&m->w, &m->layout, m->params)) {
        wan_model_free(m);
        return -1;
    }
    return 0;
}

int wan_model_alloc_grads(wan_model *m) {
    if (m->grads) return 0;
    m->grads = alloc_floats(m->layout.numel);
    if (!m->grads) return core_error("wan model: out of memory for gradients");
    if (wan_weights_bind(&m->g, &m->layout, m->grads)) {
        free(m->grads);
        m->grads = NULL;
        return -1;
    }
    return 0;
}

int wan_model_alloc_adam(wan_model *m) {
    if (!m->adam_m) m->adam_m = alloc_floats(m->layout.numel);
    if (!m->adam_v) m->adam_v = alloc_floats(m->layout.numel);
    if (!m->adam_m || !m->adam_v) return core_error("wan model: out of memory for Adam moments");
    return 0;
}

void wan_model_zero_grads(wan_model *m) {
    if (m->grads) memset(m->grads, 0, (size_t)m->layout.numel * sizeof(float));
}

void wan_model_free(wan_model *m) {
    free(m->params);
    free(m->grads);
    free(m->adam_m);
    free(m->adam_v);
    wan_weights_free(&m->w);
    wan_weights_free(&m->g);
    wan_layout_free(&m->layout);
    memset(m, 0, sizeof *m);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

void wan_params_init_random(wan_model *m, uint64_t seed) {
    const wan_layout *L = &m->layout;
    const double D = wan_dim(&m->cfg);
    for (int i = 0; i < L->count; i++) {
        const wan_tensor *t = &L->tensors[i];
        float *p = m->params + t->offset;
        if (ends_with(t->name, "scale_shift_table")) {
            core_philox_normal(p, t->numel, seed, (uint32_t)i, 0, WAN_INIT_STREAM);
            const float s = (float)(1.0 / sqrt(D));
            for (int64_t j = 0; j < t->numel; j++) p[j] *= s;
        } else if (t->ndim >= 2) { /* Linear / Conv3d weight */
            core_philox_normal(p, t->numel, seed, (uint32_t)i, 0, WAN_INIT_STREAM);
            const float s = (float)(1.0 / sqrt((double)(t->numel / t->shape[0])));
            for (int64_t j = 0; j < t->numel; j++) p[j] *= s;
        } else if (strstr(t->name, ".norm") && ends_with(t->name, ".weight")) {
            for (int64_t j = 0; j < t->numel; j++) p[j] = 1.0f;
        } else {
            memset(p, 0, (size_t)t->numel * sizeof(float));
        }
    }
}
