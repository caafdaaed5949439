/* model/clip/clip_load.c — loading a CLIP model's weights from a transformers CLIPModel folder or an open_clip
 * checkpoint (see clip_model.h). Each format is a table of (tensor name, shape the config gives, destination);
 * every entry is checked against the file before any is read, so a wrong checkpoint fails fast, naming the first
 * tensor that does not fit. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/clip/clip_internal.h"

/* A checkpoint: one safetensors file (opened by name: hub folders hold both transformers' and open_clip's) or a
 * folder / index (core's st_set). */
typedef struct {
    st_file *file;
    st_set *set;
    char prefix[16]; /* "module." when the names carry it (a checkpoint saved from DistributedDataParallel) */
} clip_src;

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static const st_info *src_info(const clip_src *s, const char *name) {
    if (s->file) {
        int i = st_find(s->file, name);
        return i < 0 ? NULL : st_info_at(s->file, i);
    }
    int i = st_set_find(s->set, name);
    return i < 0 ? NULL : st_set_info_at(s->set, i);
}

static int src_read(const clip_src *s, const char *name, float *dst, int64_t n) {
    return s->file ? st_read_f32(s->file, name, dst, n) : st_set_read_f32(s->set, name, dst, n);
}

/* Drops tensor name's pages of the mapped file once converted (core/safetensors.h st_drop_pages): the file and the
 * fp32 copy are never both resident whole (ViT-H/14: 3.9 GB each). */
static void src_drop(const clip_src *s, const char *name) {
    st_drop_pages(s->file ? s->file : st_set_file_of(s->set, name), name);
}

static void src_close(clip_src *s) {
    st_close(s->file);
    st_set_close(s->set);
    s->file = NULL, s->set = NULL;
}

/* Opens dir/preferred when it exists, else dir/index when given and present, else the folder's one checkpoint. */
static int src_open(clip_src *s, const char *dir, const char *preferred, const char *index) {
    char p[4096];
    memset(s, 0, sizeof *s);
    snprintf(p, sizeof p, "%s/%s", dir, preferred);
    if (file_exists(p)) return (s->file = st_open(p)) ? 0 : -1;
    if (index) {
        snprintf(p, sizeof p, "%s/%s", dir, index);
        if (file_exists(p)) return (s->set = st_open_index(p)) ? 0 : -1;
    }
    return (s->set = st_open_dir(dir)) ? 0 : -1;
}

/* ------------------------------------------------------------------------------------------------------------
 * The table of wanted tensors */

typedef struct {
    char name[192];
    int ndim;                     /* 0: a scalar ([] or [1] accepted) */
    int64_t shape[4];
    float *dst;
    int transpose;                /* the file holds [a, b]; dst gets [b, a] */
    const char *keys;             /* the config keys the shape comes from */
} clip_want;

typedef struct {
    clip_want *w;
    int n, cap;
    const clip_src *src;
} clip_table;

static int want(clip_table *t, const char *keys, float *dst, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                const char *fmt, ...) __attribute__((format(printf, 9, 10)));
static int want(clip_table *t, const char *keys, float *dst, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                const char *fmt, ...) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 256;
        clip_want *w = realloc(t->w, (size_t)cap * sizeof *w);
        if (!w) return core_error("clip: out of memory");
        t->w = w, t->cap = cap;
    }
    clip_want *e = &t->w[t->n++];
    memset(e, 0, sizeof *e);
    size_t pl = strlen(t->src->prefix);
    memcpy(e->name, t->src->prefix, pl);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name + pl, sizeof e->name - pl, fmt, ap);
    va_end(ap);
    e->ndim = ndim, e->dst = dst, e->keys = keys;
    e->shape[0] = d0, e->shape[1] = d1, e->shape[2] = d2, e->shape[3] = d3;
    return 0;
}

static void shape_str(char *out, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++) n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? ", " : "",
                                                                    (long long)shape[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Checks every entry's presence, dtype and shape; then reads them all (transposing where asked). */
static int table_run(clip_table *t) {
    for (int i = 0; i < t->n; i++) {
        const clip_want *e = &t->w[i];
        const st_info *in = src_info(t->src, e->name);
        if (!in) return core_error("tensor \"%s\" is missing", e->name);
        if (in->dtype != CORE_F32 && in->dtype != CORE_BF16 && in->dtype != CORE_F16)
            return core_error("tensor \"%s\" is %s; F32, BF16 or F16 expected", e->name,
                              core_dtype_name(in->dtype));
        int ok = in->ndim == e->ndim;
        for (int d = 0; ok && d < e->ndim; d++) ok = in->shape[d] == e->shape[d];
        if (e->ndim == 0) ok = in->ndim == 0 || (in->ndim == 1 && in->shape[0] == 1);
        if (!ok) {
            char got[128], exp[128];
            shape_str(got, sizeof got, in->ndim, in->shape);
            shape_str(exp, sizeof exp, e->ndim, e->shape);
            return core_error("tensor \"%s\" has shape %s; the config gives %s (%s)", e->name, got, exp, e->keys);
        }
    }
    float *tmp = NULL;
    size_t tmp_cap = 0;
    for (int i = 0; i < t->n; i++) {
        const clip_want *e = &t->w[i];
        int64_t n = 1;
        for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
        if (!e->transpose) {
            if (src_read(t->src, e->name, e->dst, n)) goto fail;
            src_drop(t->src, e->name);
            continue;
        }
        if ((size_t)n > tmp_cap) {
            free(tmp);
            if (!(tmp = malloc((size_t)n * sizeof *tmp))) {
                core_error("clip: out of memory");
                goto fail;
            }
            tmp_cap = (size_t)n;
        }
        if (src_read(t->src, e->name, tmp, n)) goto fail;
        src_drop(t->src, e->name);
        const int64_t a = e->shape[0], b = e->shape[1];
        for (int64_t r = 0; r < a; r++)
            for (int64_t c = 0; c < b; c++) e->dst[c * a + r] = tmp[r * b + c];
    }
    free(tmp);
    return 0;
fail:
    free(tmp);
    return -1;
}

/* ------------------------------------------------------------------------------------------------------------
 * Name tables */

typedef struct {
    char vis[256], txt[256], proj[128]; /* config keys, for shape errors */
} clip_keys;

/* transformers: CLIPEncoderLayer under `pre` ("vision_model.encoder.layers.3."). */
static int want_tf_layer(clip_table *t, const clip_tower_config *c, const clip_layer *L, const char *pre,
                         const char *keys) {
    const int64_t W = c->width, F = c->mlp;
    const char *qkv[3] = {"q", "k", "v"};
    int rc = want(t, keys, L->ln1_w, 1, W, 0, 0, 0, "%slayer_norm1.weight", pre) ||
             want(t, keys, L->ln1_b, 1, W, 0, 0, 0, "%slayer_norm1.bias", pre);
    for (int i = 0; i < 3 && !rc; i++)
        rc = want(t, keys, L->qkv_w + (size_t)i * W * W, 2, W, W, 0, 0, "%sself_attn.%s_proj.weight", pre, qkv[i]) ||
             want(t, keys, L->qkv_b + (size_t)i * W, 1, W, 0, 0, 0, "%sself_attn.%s_proj.bias", pre, qkv[i]);
    return rc || want(t, keys, L->out_w, 2, W, W, 0, 0, "%sself_attn.out_proj.weight", pre) ||
           want(t, keys, L->out_b, 1, W, 0, 0, 0, "%sself_attn.out_proj.bias", pre) ||
           want(t, keys, L->ln2_w, 1, W, 0, 0, 0, "%slayer_norm2.weight", pre) ||
           want(t, keys, L->ln2_b, 1, W, 0, 0, 0, "%slayer_norm2.bias", pre) ||
           want(t, keys, L->fc1_w, 2, F, W, 0, 0, "%smlp.fc1.weight", pre) ||
           want(t, keys, L->fc1_b, 1, F, 0, 0, 0, "%smlp.fc1.bias", pre) ||
           want(t, keys, L->fc2_w, 2, W, F, 0, 0, "%smlp.fc2.weight", pre) ||
           want(t, keys, L->fc2_b, 1, W, 0, 0, 0, "%smlp.fc2.bias", pre);
}

/* open_clip: ResidualAttentionBlock (nn.MultiheadAttention's fused in_proj) under `pre`. */
static int want_oc_layer(clip_table *t, const clip_tower_config *c, const clip_layer *L, const char *pre,
                         const char *keys) {
    const int64_t W = c->width, F = c->mlp;
    return want(t, keys, L->ln1_w, 1, W, 0, 0, 0, "%sln_1.weight", pre) ||
           want(t, keys, L->ln1_b, 1, W, 0, 0, 0, "%sln_1.bias", pre) ||
           want(t, keys, L->qkv_w, 2, 3 * W, W, 0, 0, "%sattn.in_proj_weight", pre) ||
           want(t, keys, L->qkv_b, 1, 3 * W, 0, 0, 0, "%sattn.in_proj_bias", pre) ||
           want(t, keys, L->out_w, 2, W, W, 0, 0, "%sattn.out_proj.weight", pre) ||
           want(t, keys, L->out_b, 1, W, 0, 0, 0, "%sattn.out_proj.bias", pre) ||
           want(t, keys, L->ln2_w, 1, W, 0, 0, 0, "%sln_2.weight", pre) ||
           want(t, keys, L->ln2_b, 1, W, 0, 0, 0, "%sln_2.bias", pre) ||
           want(t, keys, L->fc1_w, 2, F, W, 0, 0, "%smlp.c_fc.weight", pre) ||
           want(t, keys, L->fc1_b, 1, F, 0, 0, 0, "%smlp.c_fc.bias", pre) ||
           want(t, keys, L->fc2_w, 2, W, F, 0, 0, "%smlp.c_proj.weight", pre) ||
           want(t, keys, L->fc2_b, 1, W, 0, 0, 0, "%smlp.c_proj.bias", pre);
}

static int table_transformers(clip_table *t, clip_model *m, const clip_keys *k) {
    const clip_config *c = &m->cfg;
    const clip_tower *v = &m->vision, *x = &m->text;
    const int64_t Wv = c->vision.width, Wt = c->text.width, E = c->projection_dim, P = c->patch;
    const int64_t N = (int64_t)clip_grid_h(c) * clip_grid_w(c) + 1;
    char pre[96];
    int rc = want(t, k->vis, v->class_emb, 1, Wv, 0, 0, 0, "vision_model.embeddings.class_embedding") ||
             want(t, k->vis, v->embed, 4, Wv, c->channels, P, P, "vision_model.embeddings.patch_embedding.weight") ||
             want(t, k->vis, v->pos, 2, N, Wv, 0, 0, "vision_model.embeddings.position_embedding.weight") ||
             want(t, k->vis, v->pre_w, 1, Wv, 0, 0, 0, "vision_model.pre_layrnorm.weight") ||
             want(t, k->vis, v->pre_b, 1, Wv, 0, 0, 0, "vision_model.pre_layrnorm.bias");
    for (int l = 0; l < c->vision.layers && !rc; l++) {
        snprintf(pre, sizeof pre, "vision_model.encoder.layers.%d.", l);
        rc = want_tf_layer(t, &c->vision, &v->layers[l], pre, k->vis);
    }
    rc = rc || want(t, k->vis, v->post_w, 1, Wv, 0, 0, 0, "vision_model.post_layernorm.weight") ||
         want(t, k->vis, v->post_b, 1, Wv, 0, 0, 0, "vision_model.post_layernorm.bias") ||
         want(t, k->proj, v->proj_w, 2, E, Wv, 0, 0, "visual_projection.weight") ||
         want(t, k->txt, x->embed, 2, c->vocab_size, Wt, 0, 0, "text_model.embeddings.token_embedding.weight") ||
         want(t, k->txt, x->pos, 2, c->max_positions, Wt, 0, 0, "text_model.embeddings.position_embedding.weight");
    for (int l = 0; l < c->text.layers && !rc; l++) {
        snprintf(pre, sizeof pre, "text_model.encoder.layers.%d.", l);
        rc = want_tf_layer(t, &c->text, &x->layers[l], pre, k->txt);
    }
    return rc || want(t, k->txt, x->post_w, 1, Wt, 0, 0, 0, "text_model.final_layer_norm.weight") ||
           want(t, k->txt, x->post_b, 1, Wt, 0, 0, 0, "text_model.final_layer_norm.bias") ||
           want(t, k->proj, x->proj_w, 2, E, Wt, 0, 0, "text_projection.weight") ||
           want(t, "a scalar", &m->logit_scale, 0, 0, 0, 0, 0, "logit_scale");
}

static int table_open_clip(clip_table *t, clip_model *m, const clip_keys *k) {
    const clip_config *c = &m->cfg;
    const clip_tower *v = &m->vision, *x = &m->text;
    const int64_t Wv = c->vision.width, Wt = c->text.width, E = c->projection_dim, P = c->patch;
    const int64_t N = (int64_t)clip_grid_h(c) * clip_grid_w(c) + 1;
    char pre[96], probe[64];
    /* CustomTextCLIP (custom_text) keeps the text tower under "text."; CLIP flattens it into the root */
    snprintf(probe, sizeof probe, "%stext.token_embedding.weight", t->src->prefix);
    const char *tp = src_info(t->src, probe) ? "text." : "";
    int rc = want(t, k->vis, v->embed, 4, Wv, c->channels, P, P, "visual.conv1.weight") ||
             want(t, k->vis, v->class_emb, 1, Wv, 0, 0, 0, "visual.class_embedding") ||
             want(t, k->vis, v->pos, 2, N, Wv, 0, 0, "visual.positional_embedding");
    if (!rc && c->ln_pre)
        rc = want(t, k->vis, v->pre_w, 1, Wv, 0, 0, 0, "visual.ln_pre.weight") ||
             want(t, k->vis, v->pre_b, 1, Wv, 0, 0, 0, "visual.ln_pre.bias");
    for (int l = 0; l < c->vision.layers && !rc; l++) {
        snprintf(pre, sizeof pre, "visual.transformer.resblocks.%d.", l);
        rc = want_oc_layer(t, &c->vision, &v->layers[l], pre, k->vis);
    }
    rc = rc || want(t, k->vis, v->post_w, 1, Wv, 0, 0, 0, "visual.ln_post.weight") ||
         want(t, k->vis, v->post_b, 1, Wv, 0, 0, 0, "visual.ln_post.bias") ||
         want(t, k->proj, v->proj_w, 2, Wv, E, 0, 0, "visual.proj") ||
         want(t, k->txt, x->embed, 2, c->vocab_size, Wt, 0, 0, "%stoken_embedding.weight", tp) ||
         want(t, k->txt, x->pos, 2, c->max_positions, Wt, 0, 0, "%spositional_embedding", tp);
    if (!rc) t->w[t->n - 3].transpose = 1; /* visual.proj is [W, E]: x @ proj */
    for (int l = 0; l < c->text.layers && !rc; l++) {
        snprintf(pre, sizeof pre, "%stransformer.resblocks.%d.", tp, l);
        rc = want_oc_layer(t, &c->text, &x->layers[l], pre, k->txt);
    }
    rc = rc || want(t, k->txt, x->post_w, 1, Wt, 0, 0, 0, "%sln_final.weight", tp) ||
         want(t, k->txt, x->post_b, 1, Wt, 0, 0, 0, "%sln_final.bias", tp);
    if (rc) return rc;
    if (c->text_proj_bias) /* nn.Linear(width, output_dim) */
        return want(t, k->proj, x->proj_w, 2, E, Wt, 0, 0, "%stext_projection.weight", tp) ||
               want(t, k->proj, x->proj_b, 1, E, 0, 0, 0, "%stext_projection.bias", tp) ||
               want(t, "a scalar", &m->logit_scale, 0, 0, 0, 0, 0, "logit_scale");
    rc = want(t, k->proj, x->proj_w, 2, Wt, E, 0, 0, "%stext_projection", tp);
    if (!rc) t->w[t->n - 1].transpose = 1; /* a [width, output_dim] parameter: x @ text_projection */
    return rc || want(t, "a scalar", &m->logit_scale, 0, 0, 0, 0, 0, "logit_scale");
}

/* ------------------------------------------------------------------------------------------------------------ */

void clip_free(clip_model *m) {
    if (!m) return;
    free(m->vision.params);
    free(m->vision.layers);
    free(m->text.params);
    free(m->text.layers);
    free(m);
}

const clip_config *clip_get_config(const clip_model *m) { return &m->cfg; }
float clip_logit_scale(const clip_model *m) { return m->logit_scale; }

static int alloc_towers(clip_model *m) {
    clip_config *c = &m->cfg;
    m->vision.n_params = clip_vision_param_floats(c);
    m->text.n_params = clip_text_param_floats(c);
    m->vision.params = malloc(m->vision.n_params * sizeof(float));
    m->text.params = malloc(m->text.n_params * sizeof(float));
    m->vision.layers = calloc((size_t)c->vision.layers, sizeof(clip_layer));
    m->text.layers = calloc((size_t)c->text.layers, sizeof(clip_layer));
    if (!m->vision.params || !m->text.params || !m->vision.layers || !m->text.layers)
        return core_error("clip: out of memory for %zu parameters", m->vision.n_params + m->text.n_params);
    clip_vision_layout(c, &m->vision);
    clip_text_layout(c, &m->text);
    return 0;
}

static clip_model *load(const char *dir, clip_format fmt) {
    clip_model *m = calloc(1, sizeof *m);
    clip_src src = {0};
    clip_table t = {.src = &src};
    char path[4096];
    if (!m) {
        core_error("clip: out of memory");
        return NULL;
    }
    clip_config *c = &m->cfg;
    clip_keys k;
    if (fmt == CLIP_FORMAT_TRANSFORMERS) {
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (clip_config_load_transformers(path, c) || src_open(&src, dir, "model.safetensors",
                                                               "model.safetensors.index.json"))
            goto fail;
        snprintf(k.vis, sizeof k.vis, "vision_config: hidden_size %d, intermediate_size %d, num_channels %d, "
                 "patch_size %d, image_size %d", c->vision.width, c->vision.mlp, c->channels, c->patch, c->image_h);
        snprintf(k.txt, sizeof k.txt, "text_config: hidden_size %d, intermediate_size %d, vocab_size %d, "
                 "max_position_embeddings %d", c->text.width, c->text.mlp, c->vocab_size, c->max_positions);
        snprintf(k.proj, sizeof k.proj, "projection_dim %d and the tower's hidden_size", c->projection_dim);
    } else {
        snprintf(path, sizeof path, "%s/open_clip_config.json", dir);
        if (clip_config_load_open_clip(path, c) || src_open(&src, dir, "open_clip_model.safetensors", NULL))
            goto fail;
        snprintf(k.vis, sizeof k.vis, "vision_cfg: width %d, mlp width %d, patch_size %d, image_size %d x %d",
                 c->vision.width, c->vision.mlp, c->patch, c->image_h, c->image_w);
        snprintf(k.txt, sizeof k.txt, "text_cfg: width %d, mlp width %d, vocab_size %d, context_length %d",
                 c->text.width, c->text.mlp, c->vocab_size, c->max_positions);
        snprintf(k.proj, sizeof k.proj, "embed_dim %d and the tower's width", c->projection_dim);
        if (!src_info(&src, "visual.conv1.weight") && src_info(&src, "module.visual.conv1.weight"))
            strcpy(src.prefix, "module.");
        char lb[32];
        snprintf(lb, sizeof lb, "%slogit_bias", src.prefix);
        if (src_info(&src, lb)) {
            core_error("the checkpoint has \"%s\": a logit bias (SigLIP) is not supported", lb);
            goto fail;
        }
    }
    if (alloc_towers(m)) goto fail;
    if ((fmt == CLIP_FORMAT_TRANSFORMERS ? table_transformers(&t, m, &k) : table_open_clip(&t, m, &k)) ||
        table_run(&t))
        goto fail;
    free(t.w);
    src_close(&src);
    return m;
fail:
    core_error_push("loading CLIP (%s) from %s: ", fmt == CLIP_FORMAT_TRANSFORMERS ? "transformers" : "open_clip",
                    dir);
    free(t.w);
    src_close(&src);
    clip_free(m);
    return NULL;
}

clip_model *clip_load_transformers(const char *dir) { return load(dir, CLIP_FORMAT_TRANSFORMERS); }
clip_model *clip_load_open_clip(const char *dir) { return load(dir, CLIP_FORMAT_OPEN_CLIP); }

clip_model *clip_load(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (file_exists(p)) return load(dir, CLIP_FORMAT_TRANSFORMERS);
    snprintf(p, sizeof p, "%s/open_clip_config.json", dir);
    if (file_exists(p)) return load(dir, CLIP_FORMAT_OPEN_CLIP);
    core_error("loading CLIP from %s: neither config.json (transformers) nor open_clip_config.json (open_clip) "
               "is there", dir);
    return NULL;
}
