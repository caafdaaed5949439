/* model/clip/clip_internal.h — the CLIP model's parameter layout, shared by clip_load.c and clip_forward.c.
 *
 * Every weight is F32 in one allocation per tower, in transformers' orientation (Linear weights [out, in]); the
 * loader maps open_clip's names and layouts onto it (fused in_proj: q, k, v rows in that order, as here; proj and
 * text_projection [in, out]: transposed at load). */
#ifndef MODEL_CLIP_INTERNAL_H
#define MODEL_CLIP_INTERNAL_H

#include <stddef.h>

#include "model/clip/clip_model.h"

typedef struct {
    float *ln1_w, *ln1_b; /* [W] */
    float *qkv_w, *qkv_b; /* [3W, W], [3W]: q rows, then k, then v */
    float *out_w, *out_b; /* [W, W], [W] */
    float *ln2_w, *ln2_b; /* [W] */
    float *fc1_w, *fc1_b; /* [F, W], [F] */
    float *fc2_w, *fc2_b; /* [W, F], [W] */
} clip_layer;

typedef struct {
    float *params;        /* one allocation */
    size_t n_params;      /* floats */
    clip_layer *layers;   /* [layers] pointers into params */
    float *embed;         /* vision: patch weight [W, C*P*P] (Conv2d weight flattened (c, kh, kw));
                             text: token embedding [vocab, W] */
    float *class_emb;     /* vision: [W]; text: NULL */
    float *pos;           /* [positions, W] */
    float *pre_w, *pre_b; /* vision LN before the encoder [W] (NULL when ln_pre is 0); text: NULL */
    float *post_w, *post_b; /* post_layernorm / final_layer_norm (ln_post / ln_final) [W] */
    float *proj_w;        /* [E, W] */
    float *proj_b;        /* [E] or NULL */
} clip_tower;

struct clip_model {
    clip_config cfg;
    clip_tower vision, text;
    float logit_scale;
};

/* Patches per image and tokens per image (patches + class token). */
int clip_grid_h(const clip_config *c);
int clip_grid_w(const clip_config *c);
/* Floats of each tower's parameters (the layout above). */
size_t clip_vision_param_floats(const clip_config *c);
size_t clip_text_param_floats(const clip_config *c);
/* Points the tower's fields into t->params (allocated by the caller with the size above). */
void clip_vision_layout(const clip_config *c, clip_tower *t);
void clip_text_layout(const clip_config *c, clip_tower *t);
/* Checks a filled config (sizes positive, heads dividing widths, ...). `label` starts the message. 0 or -1. */
int clip_config_check(const clip_config *c, const char *label);

#endif
