/* model/dit/wan_lora.c — LoRA adapters of the Wan transformer: targets, config checks, the flat adapter and its
 * name table, peft's initialisation from Philox, attaching to a model, the forward/backward of one adapted linear
 * (called from wan_forward.c / wan_backward.c) and the merge. Files are in wan_lora_io.c. The contract and the
 * references are in wan_lora.h. */
#include "model/dit/wan_lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/philox.h"
#include "model/dit/wan_internal.h"

/* ---- targets ---- */

static const char *const TARGET_NAMES[WAN_LORA_NUM_TARGETS] = {
    "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v",
    "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2", "condition_embedder.time_embedder.linear_1",
    "condition_embedder.time_embedder.linear_2", "condition_embedder.time_proj",
    "condition_embedder.text_embedder.linear_1", "condition_embedder.text_embedder.linear_2", "proj_out"};

const char *wan_lora_target_name(int t) { return t >= 0 && t < WAN_LORA_NUM_TARGETS ? TARGET_NAMES[t] : NULL; }

void wan_lora_target_dims(const wan_config *c, int t, int *in, int *out) {
    const int D = wan_dim(c), P = c->out_channels * c->patch_size[0] * c->patch_size[1] * c->patch_size[2];
    int i = D, o = D;
    switch (t) {
    case WAN_LORA_FFN_IN: o = c->ffn_dim; break;
    case WAN_LORA_FFN_OUT: i = c->ffn_dim; break;
    case WAN_LORA_TIME_1: i = c->freq_dim; break;
    case WAN_LORA_TIME_PROJ: o = 6 * D; break;
    case WAN_LORA_TEXT_1: i = c->text_dim; break;
    case WAN_LORA_PROJ_OUT: o = P; break;
    default: break;
    }
    *in = i, *out = o;
}

/* peft's check_target_module_exists for a plain string: equal, or the module name ends with "." + target. */
static int peft_match(const char *module, const char *target) {
    size_t n = strlen(module), k = strlen(target);
    if (n == k) return !strcmp(module, target);
    return n > k && module[n - k - 1] == '.' && !strcmp(module + n - k, target);
}

int wan_lora_targets_parse(uint32_t *mask, const char *const *names, int n, const char *label) {
    *mask = 0;
    if (n < 1) return core_error("%s: no targets (give module names such as attn1.to_q, or all-linear)", label);
    for (int i = 0; i < n; i++) {
        const char *s = names[i] ? names[i] : "";
        uint32_t m = 0;
        if (!strcmp(s, "all-linear")) m = WAN_LORA_ALL;
        for (int t = 0; t < WAN_LORA_NUM_TARGETS; t++)
            if (*s && peft_match(TARGET_NAMES[t], s)) m |= WAN_LORA_MASK(t);
        if (!m) {
            char all[1024];
            return core_error("%s: unknown target \"%s\" (valid: %s; a dot-suffix of one, as peft matches, e.g. "
                              "to_q for attn1.to_q and attn2.to_q; or all-linear)",
                              label, s, wan_lora_targets_format(WAN_LORA_ALL, all, sizeof all));
        }
        *mask |= m;
    }
    return 0;
}

char *wan_lora_targets_format(uint32_t mask, char *buf, size_t cap) {
    size_t n = 0;
    if (cap) buf[0] = 0;
    for (int t = 0; t < WAN_LORA_NUM_TARGETS; t++)
        if (mask & WAN_LORA_MASK(t)) {
            int k = snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", TARGET_NAMES[t]);
            if (k > 0) n += (size_t)k;
            if (n >= cap) break;
        }
    return buf;
}

/* ---- config ---- */

int wan_lora_config_validate(const wan_lora_config *c, const wan_config *model, const char *label) {
    if (c->rank < 1) return core_error("%s: rank must be >= 1, got %d", label, c->rank);
    if (!(c->alpha > 0) || !isfinite(c->alpha)) return core_error("%s: alpha must be > 0, got %g", label, c->alpha);
    if (!c->targets) return core_error("%s: no targets", label);
    if (c->targets & ~WAN_LORA_ALL) return core_error("%s: target mask 0x%x has unknown bits", label, c->targets);
    for (int t = 0; t < WAN_LORA_NUM_TARGETS; t++) {
        if (!(c->targets & WAN_LORA_MASK(t))) continue;
        int in, out;
        wan_lora_target_dims(model, t, &in, &out);
        if (c->rank > (in < out ? in : out))
            return core_error("%s: rank %d is larger than %s's smaller dimension (in %d, out %d)", label, c->rank,
                              TARGET_NAMES[t], in, out);
    }
    return 0;
}

int wan_lora_config_equal(const wan_lora_config *a, const wan_lora_config *b) {
    return a->rank == b->rank && a->alpha == b->alpha && a->targets == b->targets;
}

int64_t wan_lora_numel(const wan_config *model, const wan_lora_config *c) {
    if (wan_config_validate(model, "wan config") || wan_lora_config_validate(c, model, "lora")) return -1;
    int64_t n = 0;
    for (int t = 0; t < WAN_LORA_NUM_TARGETS; t++) {
        if (!(c->targets & WAN_LORA_MASK(t))) continue;
        int in, out;
        wan_lora_target_dims(model, t, &in, &out);
        n += (int64_t)c->rank * (in + out) * (wan_lora_target_is_block(t) ? model->num_layers : 1);
    }
    return n;
}

/* The most rows any adapted linear of one call has: B*S (this rank's tokens), B*L (text) or R (modulation). */
static int64_t max_rows(const wan_shape *shape, int64_t S) {
    int64_t BS = (int64_t)shape->B * S, BL = (int64_t)shape->B * shape->L;
    int64_t R = shape->per_token_timestep ? BS : shape->B;
    int64_t m = BS > BL ? BS : BL;
    return m > R ? m : R;
}

int64_t wan_lora_scratch_floats(const wan_config *model, const wan_lora_config *c, const wan_shape *shape, int sp) {
    int64_t S = wan_tokens(model, shape) / (sp > 0 ? sp : 1);
    return 2 * max_rows(shape, S) * c->rank;
}

/* ---- the adapter ---- */

static float *alloc_floats(int64_t n) {
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, (size_t)(n > 0 ? n : 1) * sizeof(float))) return NULL;
    memset(p, 0, (size_t)(n > 0 ? n : 1) * sizeof(float));
    return p;
}

/* Module order of WanTransformer3DModel: condition_embedder (time_embedder, time_proj, text_embedder), blocks,
 * proj_out. */
static const int TOP_BEFORE[] = {WAN_LORA_TIME_1, WAN_LORA_TIME_2, WAN_LORA_TIME_PROJ, WAN_LORA_TEXT_1,
                                 WAN_LORA_TEXT_2};

static void add_pair(wan_layout *L, int *k, const char *module, int r, int in, int out) {
    wan_tensor *a = &L->tensors[(*k)++], *b = &L->tensors[(*k)++];
    snprintf(a->name, WAN_NAME_MAX, "%s.lora_A.weight", module);
    snprintf(b->name, WAN_NAME_MAX, "%s.lora_B.weight", module);
    a->ndim = b->ndim = 2;
    a->shape[0] = r, a->shape[1] = in, a->numel = (int64_t)r * in;
    b->shape[0] = out, b->shape[1] = r, b->numel = (int64_t)out * r;
    a->offset = L->numel, L->numel += a->numel;
    b->offset = L->numel, L->numel += b->numel;
}

static int build_layout(wan_layout *L, const wan_config *model, const wan_lora_config *c) {
    memset(L, 0, sizeof *L);
    L->cfg = *model;
    int pairs = 0;
    for (int t = 0; t < WAN_LORA_NUM_TARGETS; t++)
        if (c->targets & WAN_LORA_MASK(t)) pairs += wan_lora_target_is_block(t) ? model->num_layers : 1;
    L->tensors = calloc((size_t)pairs * 2, sizeof *L->tensors);
    if (!L->tensors) return core_error("lora: out of memory");
    int k = 0, in, out;
    char name[WAN_NAME_MAX];
    for (size_t i = 0; i < sizeof TOP_BEFORE / sizeof *TOP_BEFORE; i++) {
        int t = TOP_BEFORE[i];
        if (!(c->targets & WAN_LORA_MASK(t))) continue;
        wan_lora_target_dims(model, t, &in, &out);
        add_pair(L, &k, TARGET_NAMES[t], c->rank, in, out);
    }
    for (int l = 0; l < model->num_layers; l++)
        for (int t = 0; t < WAN_LORA_BLOCK_TARGETS; t++) {
            if (!(c->targets & WAN_LORA_MASK(t))) continue;
            wan_lora_target_dims(model, t, &in, &out);
            snprintf(name, sizeof name, "blocks.%d.%s", l, TARGET_NAMES[t]);
            add_pair(L, &k, name, c->rank, in, out);
        }
    if (c->targets & WAN_LORA_MASK(WAN_LORA_PROJ_OUT)) {
        wan_lora_target_dims(model, WAN_LORA_PROJ_OUT, &in, &out);
        add_pair(L, &k, TARGET_NAMES[WAN_LORA_PROJ_OUT], c->rank, in, out);
    }
    L->count = k;
    return 0;
}

/* Walks the layout pairs in order, giving (layer or -1, target) of each: the inverse of build_layout. */
typedef void (*pair_fn)(void *ctx, int pair, int layer, int t);
static void for_pairs(const wan_lora_config *c, int num_layers, pair_fn fn, void *ctx) {
    int p = 0;
    for (size_t i = 0; i < sizeof TOP_BEFORE / sizeof *TOP_BEFORE; i++)
        if (c->targets & WAN_LORA_MASK(TOP_BEFORE[i])) fn(ctx, p++, -1, TOP_BEFORE[i]);
    for (int l = 0; l < num_layers; l++)
        for (int t = 0; t < WAN_LORA_BLOCK_TARGETS; t++)
            if (c->targets & WAN_LORA_MASK(t)) fn(ctx, p++, l, t);
    if (c->targets & WAN_LORA_MASK(WAN_LORA_PROJ_OUT)) fn(ctx, p++, -1, WAN_LORA_PROJ_OUT);
}

typedef struct {
    const wan_lora *l;
    wan_lora_weights *w;
    float *base;
} bind_ctx;

static void bind_pair(void *vctx, int pair, int layer, int t) {
    bind_ctx *b = vctx;
    const wan_tensor *ta = &b->l->layout.tensors[2 * pair], *tb = &b->l->layout.tensors[2 * pair + 1];
    wan_lora_linear *x = layer >= 0 ? &b->w->blocks[layer * WAN_LORA_BLOCK_TARGETS + t] : &b->w->top[t];
    x->A = b->base + ta->offset;
    x->B = b->base + tb->offset;
    x->in = (int)ta->shape[1];
    x->out = (int)tb->shape[0];
}

static int bind(const wan_lora *l, wan_lora_weights *w, float *base) {
    memset(w, 0, sizeof *w);
    w->blocks = calloc((size_t)(l->model.num_layers > 0 ? l->model.num_layers : 1) * WAN_LORA_BLOCK_TARGETS,
                       sizeof *w->blocks);
    if (!w->blocks) return core_error("lora: out of memory");
    for (int t = 0; t < WAN_LORA_NUM_TARGETS; t++) {
        int in, out;
        wan_lora_target_dims(&l->model, t, &in, &out);
        w->top[t].in = in, w->top[t].out = out;
        for (int j = 0; j < l->model.num_layers && wan_lora_target_is_block(t); j++)
            w->blocks[j * WAN_LORA_BLOCK_TARGETS + t].in = in, w->blocks[j * WAN_LORA_BLOCK_TARGETS + t].out = out;
    }
    bind_ctx b = {l, w, base};
    for_pairs(&l->cfg, l->model.num_layers, bind_pair, &b);
    return 0;
}

typedef struct {
    wan_lora *l;
} init_ctx;

static void init_pair(void *vctx, int pair, int layer, int t) {
    wan_lora *l = ((init_ctx *)vctx)->l;
    const wan_tensor *ta = &l->layout.tensors[2 * pair], *tb = &l->layout.tensors[2 * pair + 1];
    float *A = l->params + ta->offset;
    const int64_t n = ta->numel;
    double *u = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    const double root = sqrt((double)ta->shape[1]); /* A = (2u - 1) / sqrt(in): U(-1/sqrt(in), 1/sqrt(in)) */
    if (u) {
        core_philox_uniform(u, n, l->cfg.init_seed, WAN_LORA_SLOT(layer, t), (uint32_t)l->expert,
                            CORE_STREAM_LORA_INIT);
        for (int64_t i = 0; i < n; i++) A[i] = (float)((2.0 * u[i] - 1.0) / root);
    } else { /* out of memory for the doubles: the same values, element by element */
        for (int64_t i = 0; i < n; i++) {
            double v;
            core_philox_uniform_range(&v, i, 1, l->cfg.init_seed, WAN_LORA_SLOT(layer, t), (uint32_t)l->expert,
                                      CORE_STREAM_LORA_INIT);
            A[i] = (float)((2.0 * v - 1.0) / root);
        }
    }
    free(u);
    memset(l->params + tb->offset, 0, (size_t)tb->numel * sizeof(float));
}

void wan_lora_reset(wan_lora *l) {
    init_ctx c = {l};
    for_pairs(&l->cfg, l->model.num_layers, init_pair, &c);
}

int wan_lora_init(wan_lora *l, const wan_config *model, const wan_lora_config *c, int expert) {
    memset(l, 0, sizeof *l);
    if (wan_config_validate(model, "wan config") || wan_lora_config_validate(c, model, "lora")) return -1;
    l->cfg = *c;
    l->model = *model;
    l->scale = (float)(c->alpha / c->rank);
    l->expert = expert;
    if (build_layout(&l->layout, model, c)) goto fail;
    l->params = alloc_floats(l->layout.numel);
    if (!l->params) {
        core_error("lora: out of memory for %lld adapter parameters", (long long)l->layout.numel);
        goto fail;
    }
    if (bind(l, &l->w, l->params)) goto fail;
    wan_lora_reset(l);
    return 0;
fail:
    wan_lora_free(l);
    return -1;
}

int wan_lora_alloc_grads(wan_lora *l) {
    if (l->grads) return 0;
    l->grads = alloc_floats(l->layout.numel);
    if (!l->grads) return core_error("lora: out of memory for gradients");
    if (bind(l, &l->g, l->grads)) {
        free(l->grads);
        l->grads = NULL;
        return -1;
    }
    return 0;
}

int wan_lora_alloc_adam(wan_lora *l) {
    if (!l->adam_m) l->adam_m = alloc_floats(l->layout.numel);
    if (!l->adam_v) l->adam_v = alloc_floats(l->layout.numel);
    if (!l->adam_m || !l->adam_v) return core_error("lora: out of memory for Adam moments");
    return 0;
}

void wan_lora_zero_grads(wan_lora *l) {
    if (l->grads) memset(l->grads, 0, (size_t)l->layout.numel * sizeof(float));
}

void wan_lora_free(wan_lora *l) {
    free(l->params);
    free(l->grads);
    free(l->adam_m);
    free(l->adam_v);
    free(l->w.blocks);
    free(l->g.blocks);
    free(l->layout.tensors);
    memset(l, 0, sizeof *l);
}

uint64_t wan_lora_tensor_hash(const wan_lora *l, int i) {
    const wan_tensor *t = &l->layout.tensors[i];
    return core_xxh64(l->params + t->offset, sizeof(float) * (size_t)t->numel, 0);
}

int wan_lora_hash(const wan_lora *const *adapters, int n, uint64_t *out) {
    const wan_layout *L[WAN_HASH_MAX_SETS];
    const float *P[WAN_HASH_MAX_SETS];
    if (n < 0 || n > WAN_HASH_MAX_SETS) return core_error("wan_lora_hash: %d adapters", n);
    for (int e = 0; e < n; e++) L[e] = &adapters[e]->layout, P[e] = adapters[e]->params;
    return wan_tensor_sets_hash(L, P, n, out);
}

/* ---- with a model ---- */

int wan_model_attach_lora(wan_model *m, wan_lora *l) {
    if (l && !wan_config_equal(&l->model, &m->cfg))
        return core_error("lora: the adapter was made for another transformer config");
    m->lora = l;
    return 0;
}

/* The base linear's weight of target t in block `layer` (or model level). */
static float *base_weight(const wan_weights *w, int layer, int t) {
    const wan_block_weights *b = layer >= 0 ? &w->blocks[layer] : NULL;
    switch (t) {
    case WAN_LORA_ATTN1_TO_Q: return b->attn1.to_q_w;
    case WAN_LORA_ATTN1_TO_K: return b->attn1.to_k_w;
    case WAN_LORA_ATTN1_TO_V: return b->attn1.to_v_w;
    case WAN_LORA_ATTN1_TO_OUT: return b->attn1.to_out_w;
    case WAN_LORA_ATTN2_TO_Q: return b->attn2.to_q_w;
    case WAN_LORA_ATTN2_TO_K: return b->attn2.to_k_w;
    case WAN_LORA_ATTN2_TO_V: return b->attn2.to_v_w;
    case WAN_LORA_ATTN2_TO_OUT: return b->attn2.to_out_w;
    case WAN_LORA_FFN_IN: return b->ffn1_w;
    case WAN_LORA_FFN_OUT: return b->ffn2_w;
    case WAN_LORA_TIME_1: return w->time1_w;
    case WAN_LORA_TIME_2: return w->time2_w;
    case WAN_LORA_TIME_PROJ: return w->tproj_w;
    case WAN_LORA_TEXT_1: return w->text1_w;
    case WAN_LORA_TEXT_2: return w->text2_w;
    case WAN_LORA_PROJ_OUT: return w->proj_out_w;
    default: return NULL;
    }
}

typedef struct {
    wan_model *m;
    const wan_lora *l;
} merge_ctx;

static void merge_pair(void *vctx, int pair, int layer, int t) {
    merge_ctx *c = vctx;
    (void)pair;
    const wan_lora_linear *a = wan_lora_get(&c->l->w, layer, t);
    float *W = base_weight(&c->m->w, layer, t);
    /* W[out, in] += scale * B[out, r] @ A[r, in] */
    k_cpu_ops.gemm(0, 0, a->out, a->in, c->l->cfg.rank, c->l->scale, a->B, c->l->cfg.rank, a->A, a->in, 1.0f, W,
                   a->in, NULL);
}

int wan_lora_merge(wan_model *m, const wan_lora *l) {
    if (!wan_config_equal(&l->model, &m->cfg))
        return core_error("lora merge: the adapter was made for another transformer config");
    merge_ctx c = {m, l};
    for_pairs(&l->cfg, l->model.num_layers, merge_pair, &c);
    return 0;
}

/* ---- forward and backward of one adapted linear (wan_internal.h) ---- */

int wan_lora_acts_prepare(wan_acts *A) {
    const wan_lora *l = A->mv.lora;
    if (!l) return 0;
    if (!wan_config_equal(&l->model, &A->cfg))
        return core_error("lora: the adapter was made for another transformer config");
    const int64_t need = max_rows(&A->shape, A->S) * l->cfg.rank;
    if (A->lora_cap >= need) return 0;
    A->dev->mem_free(A->lora_h);
    A->lora_h = A->lora_t = NULL;
    A->lora_cap = 0;
    const size_t esz = A->at == KB_BF16 ? 2 : 4;
    char *p = A->dev->mem_alloc((size_t)(2 * need) * esz);
    if (!p) return core_error_push("lora: the adapter's scratch (%lld values): ", (long long)(2 * need));
    A->lora_h = p, A->lora_t = p + (size_t)need * esz, A->lora_cap = need;
    return 0;
}

/* The view of one adapter tensor (host pointer p into lora->params) and its gradient. */
static kb_in lw(const wan_mview *mv, const float *p) {
    kb_in v = {(const char *)mv->lw + (size_t)(p - mv->lora->params) * (mv->wt == KB_BF16 ? 2 : 4), mv->wt};
    return v;
}
static float *lg(const wan_mview *mv, const float *p) { return mv->lg ? mv->lg + (p - mv->lora->params) : NULL; }

/* C[M, N] = alpha op(A) op(B) + beta C. */
static int gemm(const k_dev_ops *dev, int ta, int tb, int M, int N, int K, float alpha, kb_in a, int lda, kb_in b,
                int ldb, float beta, kb_out c, int ldc) {
    k_gemm_args g = {0};
    g.transA = ta, g.transB = tb, g.M = M, g.N = N, g.K = K, g.alpha = alpha, g.beta = beta;
    g.A = a, g.lda = lda, g.B = b, g.ldb = ldb, g.C = c, g.ldc = ldc;
    return dev->gemm(&g);
}

int wan_lora_fwd(const wan_acts *A, int layer, int t, kb_out y, kb_in x, int M) {
    const wan_mview *mv = &A->mv;
    const wan_lora *l = mv->lora;
    if (!l) return 0;
    const wan_lora_linear *a = wan_lora_get(&l->w, layer, t);
    if (!a->A) return 0;
    const int r = l->cfg.rank, K = a->in, N = a->out;
    const kb_in h = wan_ai(A, A->lora_h);
    WAN_TRY(gemm(A->dev, 0, 1, M, r, K, 1.0f, x, K, lw(mv, a->A), K, 0.0f, wan_ao(A, A->lora_h), r)); /* h = x A^T */
    return gemm(A->dev, 0, 1, M, N, r, l->scale, h, r, lw(mv, a->B), r, 1.0f, y, N); /* y += scale h B^T [M, N] */
}

int wan_lora_bwd(const wan_acts *A, int layer, int t, kb_out dx, kb_in dy, kb_in x, int M) {
    const wan_mview *mv = &A->mv;
    const wan_lora *l = mv->lora;
    if (!l) return 0;
    const wan_lora_linear *a = wan_lora_get(&l->w, layer, t);
    if (!a->A) return 0;
    const k_dev_ops *dev = A->dev;
    const int r = l->cfg.rank, K = a->in, N = a->out;
    const float s = l->scale;
    float *gA = lg(mv, a->A), *gB = lg(mv, a->B);
    const kb_in h = wan_ai(A, A->lora_h), tt = wan_ai(A, A->lora_t);
    if (gA) {
        WAN_TRY(gemm(dev, 0, 1, M, r, K, 1.0f, x, K, lw(mv, a->A), K, 0.0f, wan_ao(A, A->lora_h), r)); /* h = x A^T */
        WAN_TRY(gemm(dev, 1, 0, N, r, M, s, dy, N, h, r, 1.0f, kb_out_f32(gB), r)); /* dB += scale dy^T h [N, r] */
    }
    WAN_TRY(gemm(dev, 0, 0, M, r, N, 1.0f, dy, N, lw(mv, a->B), r, 0.0f, wan_ao(A, A->lora_t), r)); /* t = dy B */
    if (gA) WAN_TRY(gemm(dev, 1, 0, r, K, M, s, tt, r, x, K, 1.0f, kb_out_f32(gA), K)); /* dA += scale t^T x [r, K] */
    if (dx.p) WAN_TRY(gemm(dev, 0, 0, M, K, r, s, tt, r, lw(mv, a->A), K, 1.0f, dx, K)); /* dx += scale t A [M, K] */
    return 0;
}

int wan_lora_active(const wan_acts *A, int t) {
    const wan_lora *l = A->mv.lora;
    return l && (l->cfg.targets & WAN_LORA_MASK(t));
}
