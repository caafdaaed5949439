/* model/vae/wan_vae_internal.h — the Wan VAE's layer structs, parameter table and decode state, shared by
 * wan_vae_model.c (config, loading, freeing), wan_vae_layers.c (the layer kernels), wan_vae_decode.c (the chunked
 * decode loop) and the encoder (wan_vae_encode.c, its own layers in wan_vae_enc_layers.c), which keeps its weights,
 * scratch and feature cache in a vae_model of its own so that the same kernels run it. Not a public interface. */
#ifndef MODEL_WAN_VAE_INTERNAL_H
#define MODEL_WAN_VAE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dev_ops.h"
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

/* A convolution (Conv3d causal in time, or Conv2d as kt = 1). Weights at params + w ([cout, kt*kh*kw*cin]); on a
 * device (vae_set_device) bf16 copies at dw + dev_w ([cout_w, ldw], zero-padded to multiples of 8) and dw + dev_b. */
typedef struct {
    size_t w, b;
    int cin, cout, kt, kh, kw;
    int slot; /* feature-cache slot (kt == 3), else -1 */
    size_t dev_w, dev_b;
    int ldw, cout_w;
} vae_conv;

typedef struct {
    size_t gamma;
    int c;
    size_t dev_gamma; /* on a device: the bf16 copy at dw + dev_gamma */
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
    int c, scale; /* channels and spatial multiple of the latent size (encoder: divisor of the patchified input) */
} vae_slot_info;

/* Decode state for one latent size (h, w): feature caches and scratch, in the decode backend's memory (dev: the
 * table they were allocated with; NULL: host malloc, the encoder's) and its activation dtype (es bytes an element:
 * 4, fp32 on the CPU; 2, bf16 on a device). Sizes below count elements of es bytes. */
typedef struct {
    int h, w;
    const k_dev_ops *dev;
    size_t es;
    void **cache;    /* [nslots] -> [VAE_CACHE_T, H, W, C] */
    int *cache_n;    /* frames held (0..2) */
    int *time_seen;  /* per upsample3d: 1 once the first chunk passed ("Rep") */
    void *buf[5];    /* activation scratch, buf_floats each */
    size_t buf_floats;
    void *col;       /* im2col scratch, col_floats (a device: also its padded GEMM output) */
    size_t col_floats;
    void *attn;      /* t, qkv, q, k, v, o, then the attention's work (CPU: the LSE) */
    size_t attn_floats;
    float *host;     /* a device's host staging of a latent frame and a decoded chunk (host_floats fp32; not in bytes) */
    size_t host_floats;
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
    const k_dev_ops *dev; /* the decode's backend (vae_set_device; NULL: the CPU table) */
    void *dw;             /* a device's bf16 weights (convolutions padded, norms' gamma), dw_bytes; NULL on the CPU */
    size_t dw_bytes;
};

/* The table the decode runs on (m->dev, or the CPU's). */
const k_dev_ops *vae_backend(const vae_model *m);

/* wan_vae_model.c: builds the decoder's layer structs and parameter table from m->cfg. Returns 0 / -1. */
int vae_build(vae_model *m);
/* wan_vae_model.c, the builders behind vae_build (and the encoder's): each appends its tensors to m's table.
 * vae_make_conv: prefix.weight / .bias; dims3 1: Conv3d weight [co, ci, kt, k, k], 0: Conv2d [co, ci, k, k]; cached:
 * the conv gets a feature-cache slot (channels ci, size factor `scale`). vae_make_norm: prefix.gamma [c, 1, 1(, 1)]
 * (images: the 2-D form). vae_make_res: a WanResidualBlock (norm1, conv1, norm2, conv2, conv_shortcut when ci != co).
 * Return 0 / -1 (too many cached convolutions). */
int vae_make_conv(vae_model *m, vae_conv *c, const char *prefix, int ci, int co, int kt, int k, int dims3,
                  int cached, int scale);
void vae_make_norm(vae_model *m, vae_norm *n, const char *prefix, int c, int images);
int vae_make_res(vae_model *m, vae_resblock *r, const char *prefix, int ci, int co, int scale);

/* wan_vae_encode.c: appends the encoder's tensors (encoder.*, quant_conv.*) for m->cfg to m's table (a fresh model
 * with only cfg set; the tiny preset writes them from it). Returns 0 / -1 (an unsupported config). */
int vae_encoder_build_table(vae_model *m);

enum { VAE_PART_DECODER = 0, VAE_PART_ENCODER = 1 };
/* wan_vae_model.c: reads the tensors of m's table from the safetensors of `dir` (F32/BF16/F16 -> F32), checks their
 * shapes and reorders the conv weights. The other part's tensors (decoder: encoder.*, quant_conv.*; encoder:
 * decoder.*, post_quant_conv.*) are skipped; any other tensor not in the table is an error naming it. A missing
 * tensor is named; for the encoder, a folder without any encoder.* tensor says so. Returns 0 / -1. */
int vae_load_weights(vae_model *m, const char *dir, int part);
/* wan_vae_model.c: resolves dir_in (a vae folder, or a pipeline folder with model_index.json: its vae/) into dir and
 * parses its config.json into cfg. Returns 0 / -1 naming the file and key. */
int vae_open_config(const char *dir_in, char *dir, size_t cap, vae_config *cfg);
/* wan_vae_model.c: frees the decode buffers and feature cache (the decode loop reallocates them per latent size). */
void vae_state_free(vae_state *st);

/* wan_vae_layers.c — the layers, written once over the decode backend's table (vae_backend: the CPU's fp32 entries
 * or a device's bf16 ones); activations are that backend's memory in its dtype (st.es), channel-last, x frames
 * [nf, H, W, C] contiguous. The encoder calls them on its own model (the CPU table). */
/* Causal conv: out [nf, Ho, Wo, cout] from x [nf, H, W, cin] with the conv's cache (slot >= 0) prepended in time
 * (zeros where fewer than kt - 1 frames are known) and zero spatial padding (kh/2, kw/2). up2x: the input is first
 * upsampled 2x nearest (Ho = 2H), only with kt == 1. Updates the cache to the last 2 frames of the stream. */
int vae_conv_forward(vae_model *m, const vae_conv *c, const void *x, int nf, int H, int W, int up2x, void *out);
/* WanRMS_norm (F.normalize over channels * sqrt(C) * gamma), then SiLU when silu; n rows of C. out may alias x.
 * Returns 0 / -1 (a device's refusal). */
int vae_norm_forward(const vae_model *m, const vae_norm *nm, const void *x, void *out, int64_t n, int silu);
/* WanAttentionBlock on each of nf frames of x [nf, H, W, C], in place (adds the identity). */
int vae_attn_forward(vae_model *m, const vae_attnblock *a, void *x, int nf, int H, int W);
/* WanResidualBlock: out = conv2(silu(norm2(conv1(silu(norm1(x)))))) + shortcut(x); x [nf, H, W, cin] -> out
 * [nf, H, W, cout]; s1, s2: scratch of nf H W max(cin, cout) floats. x, out, s1, s2 distinct. */
int vae_res_forward(vae_model *m, const vae_resblock *r, const void *x, int nf, int H, int W, void *out, void *s1,
                    void *s2);
/* DupUp3D added into out: out[nf_out, 2H, 2W, cout] += dup(x [nf, H, W, cin]); drop: frames dropped at the start
 * (factor_t - 1 on the first chunk). Returns 0 / -1. */
int vae_dupup_add(const vae_model *m, void *out, const void *x, int nf, int H, int W, int cin, int cout, int ft,
                  int drop);
/* Device-to-device copy of height rows of width bytes (the backend's mem_copy2d). */
int vae_copy2d(const vae_model *m, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
               size_t height);

/* wan_vae_upload.c — the decoder's weights on a device: bf16 copies of every convolution (padded to the device
 * GEMM's multiples of 8) and norm, their offsets set in the layer structs. vae_upload_bytes: the bytes they take
 * (the same walk, for the estimate). vae_upload_free (wan_vae_model.c, with vae_free): back to the CPU. Return 0 / -1. */
int vae_upload(vae_model *m, const k_dev_ops *dev);
size_t vae_upload_bytes(const vae_model *m);
void vae_upload_free(vae_model *m);

/* wan_vae_enc_layers.c — the encoder's down-sampling layers (WanResample 'downsample2d' / 'downsample3d', AvgDown3D).
 * Spatial down-sampling: ZeroPad2d((0, 1, 0, 1)) then the conv (kt 1, 3x3) with stride 2 on every frame:
 * x [nf, H, W, cin] -> out [nf, Ho, Wo, cout], Ho = (H - 2) / 2 + 1 (H / 2 for even H; H, W >= 2). */
int vae_conv_down2d(vae_model *m, const vae_conv *c, const float *x, int nf, int H, int W, float *out);
/* downsample3d's time_conv (kernel (3, 1, 1), stride 2, no padding) over the stream [prev, x_0 .. x_{nf-1}]:
 * out frame k = bias + sum_t W_t s_{2k+t}, nfo = (nf - 2) / 2 + 1 frames; prev [H, W, cin] is the last frame of the
 * previous chunk. nf >= 2 (fewer is an error: diffusers' Conv3d fails there too). */
int vae_conv_tdown(vae_model *m, const vae_conv *c, const float *prev, const float *x, int nf, int H, int W,
                   float *out);
/* AvgDown3D added into out: out[nfo, H/fs, W/fs, cout] += mean over groups of cin ft fs^2 / cout values of x
 * [nf, H, W, cin] zero-padded in front to a multiple of ft frames (nfo = ceil(nf / ft)); expanded channel
 * e = c ft fs^2 + (a fs + i) fs + j (a: frame in the group, i, j: row, column in the block), group o = e / size. */
void vae_avgdown_add(float *out, const float *x, int nf, int H, int W, int cin, int cout, int ft, int fs);

#endif
