/* model/vae/wan_vae_internal.h — the Wan VAE decoder's layer structs, parameter table and decode state, shared by
 * wan_vae_model.c (config, loading, freeing), wan_vae_layers.c (the layer kernels) and wan_vae_decode.c (the chunked
 * decode loop). Not a public interface. */
#ifndef MODEL_WAN_VAE_INTERNAL_H
#define MODEL_WAN_VAE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "model/vae/wan_vae.h"

#define VAE_NAME_MAX 96
#define VAE_MAX_RES 8   /* num_res_blocks + 1 */
#define VAE_CACHE_T 2   /* frames kept per cached convolution (diffusers CACHE_T) */

/* One parameter tensor in the flat buffer (diffusers name and shape). */
typedef struct {
    char name[VAE_NAME_MAX];
    int ndim;
    int64_t shape[5];
    size_t offset; /* floats into vae_model.params */
    int conv;      /* 1: a convolution weight, reordered after loading to [cout, kt, kh, kw, cin] */
} vae_param;

/* A convolution (Conv3d causal in time, or Conv2d as kt = 1). Weights at params + w ([cout, kt*kh*kw*cin]). */
typedef struct {
    size_t w, b;
    int cin, cout, kt, kh, kw;
    int slot; /* feature-cache slot (kt == 3), else -1 */
} vae_conv;

typedef struct {
    size_t gamma;
    int c;
} vae_norm;

typedef struct {
    vae_norm n1, n2;
    vae_conv c1, c2, sc;
    int cin, cout, has_sc;
} vae_resblock;

typedef struct {
    vae_norm n;
    vae_conv qkv, proj;
    int c;
} vae_attnblock;

/* One up-block (WanUpBlock or WanResidualUpBlock). */
typedef struct {
    int nres;
    vae_resblock res[VAE_MAX_RES];
    int in_dim, out_dim;
    int up;          /* 0 none, 2 upsample2d, 3 upsample3d */
    vae_conv resample; /* Conv2d 3x3 (out_dim -> up_out) after nearest 2x */
    vae_conv time_conv; /* upsample3d: causal (3,1,1), out_dim -> 2 out_dim */
    int time_slot;      /* index into vae_state.time_seen */
    int up_out;         /* channels after the resample */
    int dup;            /* residual: DupUp3D shortcut (in_dim -> up_out, factor_t 2 or 1, factor_s 2) */
    int dup_ft;
} vae_upblock;

typedef struct {
    int c, scale; /* channels and spatial multiple of the latent size */
} vae_slot_info;

/* Decode state for one latent size (h, w): feature caches and scratch. */
typedef struct {
    int h, w;
    float **cache;   /* [nslots] -> [VAE_CACHE_T, H, W, C] */
    int *cache_n;    /* frames held (0..2) */
    int *time_seen;  /* per upsample3d: 1 once the first chunk passed ("Rep") */
    float *buf[5];   /* activation scratch, buf_floats each */
    size_t buf_floats;
    float *col;      /* im2col scratch, col_floats */
    size_t col_floats;
    float *attn;     /* q, k, v, o, qkv, lse */
    size_t attn_floats;
    size_t bytes, cache_bytes;
} vae_state;

struct vae_model {
    vae_config cfg;
    int dims[VAE_MAX_LEVELS + 1];
    vae_param *table;
    int nparams, cap;
    float *params;
    size_t nfloats;
    vae_conv post_quant, conv_in, conv_out;
    vae_resblock mid_res[2];
    vae_attnblock mid_attn;
    int nup;
    vae_upblock upb[VAE_MAX_LEVELS];
    vae_norm norm_out;
    int nslots;
    vae_slot_info slots[4 * VAE_MAX_LEVELS * VAE_MAX_RES + 16];
    int ntime;
    int n_tup, n_sup; /* temporal / spatial up-samplers */
    vae_state st;
};

/* wan_vae_model.c: builds the layer structs and parameter table from m->cfg. Returns 0 / -1. */
int vae_build(vae_model *m);
/* wan_vae_model.c: frees the decode buffers and feature cache (the decode loop reallocates them per latent size). */
void vae_state_free(vae_state *st);

/* wan_vae_layers.c — channel-last layer kernels. x frames are [nf, H, W, C] contiguous. */
/* Causal conv: out [nf, Ho, Wo, cout] from x [nf, H, W, cin] with the conv's cache (slot >= 0) prepended in time
 * (zeros where fewer than kt - 1 frames are known) and zero spatial padding (kh/2, kw/2). up2x: the input is first
 * upsampled 2x nearest (Ho = 2H), only with kt == 1. Updates the cache to the last 2 frames of the stream. */
int vae_conv_forward(vae_model *m, const vae_conv *c, const float *x, int nf, int H, int W, int up2x, float *out);
/* WanRMS_norm (F.normalize over channels * sqrt(C) * gamma), then SiLU when silu; n rows of C. out may alias x. */
void vae_norm_forward(const vae_model *m, const vae_norm *nm, const float *x, float *out, int64_t n, int silu);
/* WanAttentionBlock on each of nf frames of x [nf, H, W, C], in place (adds the identity). */
int vae_attn_forward(vae_model *m, const vae_attnblock *a, float *x, int nf, int H, int W);
/* DupUp3D added into out: out[nf_out, 2H, 2W, cout] += dup(x [nf, H, W, cin]); drop: frames dropped at the start
 * (factor_t - 1 on the first chunk). */
void vae_dupup_add(float *out, const float *x, int nf, int H, int W, int cin, int cout, int ft, int drop);

#endif
