/* model/clip/clip_model.h — CLIP's vision and text transformers (forward only, fp32, CPU op table), loaded from a
 * transformers CLIPModel folder or an open_clip checkpoint.
 *
 * Reference: transformers models/clip/modeling_clip.py (CLIPModel: get_image_features, get_text_features, forward)
 * and open_clip model.py / transformer.py (CLIP: encode_image, encode_text, get_logits). Both compute:
 *   vision: x = [class; patches @ W_patch^T] + pos; x = LN_pre(x); per layer
 *           x = x + out(MHA(LN1(x))); x = x + fc2(act(fc1(LN2(x)))); pooled = LN_post(x[:, 0]);
 *           image_embeds = pooled @ P_vis^T (no bias)
 *   text:   x = tok_emb[ids] + pos[0 .. S); the same layers with a causal mask; x = LN_final(x);
 *           pooled = x[b, pool_index(ids[b])]; text_embeds = pooled @ P_txt^T (+ bias: open_clip proj_bias)
 *   logits_per_image[i, t] = exp(logit_scale) * cos(image_embeds[i], text_embeds[t])
 * Attention: multi-head, q/k/v/out with biases, softmax(q k^T / sqrt(head_dim)). act: quick-GELU x*sigmoid(1.702x),
 * GELU (erf) or GELU (tanh) as the config says. Dropout and patch dropout are identities (inference).
 * Pooling of the text (transformers CLIPTextModel.forward, open_clip text_global_pool): "argmax" takes the first
 * position of the largest id (transformers when text_config.eos_token_id == 2, the configs written before the
 * eos fix; open_clip's default), "eos" the first position holding eos_token_id (0 when none), "first", "last".
 *
 * Supported:
 *   transformers: model_type "clip" (CLIPModel), hidden_act quick_gelu / gelu / gelu_new / gelu_pytorch_tanh,
 *     any widths, heads dividing the width, image_size not a multiple of patch_size (the convolution's floor).
 *   open_clip: the ViT towers of open_clip's CLIP class (model_cfg with vision_cfg/text_cfg; ViT-B/32, B/16,
 *     L/14, H/14, bigG/14 style, quick_gelu or not, image_size [h, w] (a non-square grid), no_ln_pre,
 *     norm_kwargs.eps, text pool_type argmax / eos / first / last, proj_bias).
 *   Not supported (refused at load, naming the key): ResNet towers (vision layers a list), timm or Hugging Face
 *     towers (timm_model_name, hf_model_name), attentional pooling (CoCa), layer scale (ls_init_value), custom
 *     blocks (block_type, qk_norm, scaled_cosine_attn, scale_*), vision pool_type other than "tok",
 *     embed_cls, no_causal_mask, proj_type "none", act_kwargs, logit_bias
 *     (SigLIP), interpolated position embeddings (input size must be the config's).
 * Weights: F32, BF16 or F16 tensors, converted to F32 once at load. */
#ifndef MODEL_CLIP_MODEL_H
#define MODEL_CLIP_MODEL_H

#include <stddef.h>
#include <stdint.h>

typedef enum { CLIP_ACT_QUICK_GELU, CLIP_ACT_GELU, CLIP_ACT_GELU_TANH } clip_act;
typedef enum { CLIP_POOL_ARGMAX, CLIP_POOL_EOS, CLIP_POOL_FIRST, CLIP_POOL_LAST } clip_pool;
typedef enum { CLIP_FORMAT_TRANSFORMERS, CLIP_FORMAT_OPEN_CLIP } clip_format;

/* One transformer tower. */
typedef struct {
    int width;  /* hidden_size */
    int layers; /* num_hidden_layers */
    int heads;  /* num_attention_heads (width % heads == 0) */
    int mlp;    /* intermediate_size */
    float eps;  /* layer_norm_eps */
    clip_act act;
} clip_tower_config;

typedef struct {
    clip_format format;
    clip_tower_config vision, text;
    int channels;             /* num_channels (3) */
    int image_h, image_w;     /* input size in pixels (transformers: image_size x image_size) */
    int patch;                /* patch_size; grid = floor(image_h / patch) x floor(image_w / patch) */
    int ln_pre;               /* 1: LN before the vision encoder (0: open_clip no_ln_pre) */
    int vocab_size;           /* text vocab_size */
    int max_positions;        /* max_position_embeddings / context_length: the longest id sequence */
    clip_pool pool;
    int eos_token_id;         /* for CLIP_POOL_EOS */
    int projection_dim;       /* width of image and text embeddings */
    int text_proj_bias;       /* 1: the text projection has a bias (open_clip proj_bias) */
} clip_config;

typedef struct clip_model clip_model;

/* Reads a transformers CLIPModel config.json (text_config and vision_config objects; missing keys take
 * transformers' CLIPTextConfig / CLIPVisionConfig defaults). Returns 0, or -1 naming the file and key (not a
 * positive integer, unknown hidden_act, heads not dividing the width, model_type other than "clip", ...). */
int clip_config_load_transformers(const char *path, clip_config *cfg);
/* Reads an open_clip model config: a JSON file holding the model config itself (as open_clip's model_configs/
 * ViT-H-14.json) or {"model_cfg": {...}} (the open_clip_config.json beside hub checkpoints). Returns 0, or -1
 * naming the file and the unsupported or bad key. */
int clip_config_load_open_clip(const char *path, clip_config *cfg);

/* Loads a model from folder `dir`:
 *   - config.json present: a transformers CLIPModel; weights model.safetensors, or model.safetensors.index.json
 *     and its shards, or else the folder's one *.safetensors file. Tensor names as CLIPModel.state_dict().
 *   - else open_clip_config.json present: an open_clip CLIP; weights open_clip_model.safetensors, or else the
 *     folder's one *.safetensors file (a .pt/.bin checkpoint must be converted first: torch.load, then
 *     safetensors.torch.save_file of its state_dict). Names as CLIP.state_dict() (or CustomTextCLIP's, the text
 *     tower under "text."), a leading "module." removed.
 * Every tensor the model uses is checked against the config before any is read: NULL with core_error naming the
 * folder and the tensor, for a missing tensor, or the tensor, its shape in the file and the shape the config gives
 * (with the config keys it comes from); also non-finite values and other dtypes than F32/BF16/F16. Tensors the
 * model does not use (position_ids buffers, ...) are ignored. */
clip_model *clip_load(const char *dir);
/* As clip_load, with the format given. */
clip_model *clip_load_transformers(const char *dir);
clip_model *clip_load_open_clip(const char *dir);
void clip_free(clip_model *m);

const clip_config *clip_get_config(const clip_model *m);
/* The logit_scale parameter (a log; the logits multiply cosines by exp of it). */
float clip_logit_scale(const clip_model *m);

/* Image embeddings: pixels [B, channels, image_h, image_w] F32 (preprocessed: resized, cropped, normalised) ->
 * embeds [B, projection_dim] F32, not normalised (CLIPModel.get_image_features / open_clip encode_image with
 * normalize False). Rows do not depend on batch mates. Returns 0, or -1 (B < 1, out of memory). */
int clip_encode_image(const clip_model *m, const float *pixels, int B, float *embeds);

/* Text embeddings: ids [B, S] int32 token ids (each in [0, vocab_size), 1 <= S <= max_positions; positions 0..S-1)
 * -> embeds [B, projection_dim] F32, not normalised (get_text_features / encode_text). Padding after the pooled
 * token does not change the result (causal attention), so no attention mask is taken. Returns 0, or -1 naming the
 * row and position of an id out of range, or S out of range. */
int clip_encode_text(const clip_model *m, const int32_t *ids, int B, int S, float *embeds);

/* The position clip_encode_text pools for one row of ids [S] under the model's rule (see the top of this file). */
int clip_pool_index(const clip_config *cfg, const int32_t *ids, int S);

/* logits [Bi, Bt] = exp(logit_scale) * (img_i / |img_i|) . (txt_t / |txt_t|) (CLIPModel.forward's
 * logits_per_image; open_clip get_logits' image_logits). img [Bi, D], txt [Bt, D]. A zero vector stays zero. */
void clip_logits(float *logits, const float *img, int Bi, const float *txt, int Bt, int D, float logit_scale);

/* Bytes of the parameters clip_load holds (F32) and of the activations clip_encode_image for n_images plus
 * clip_encode_text for n_prompts rows of S tokens allocate at their peak (the larger of the two: they run one
 * after the other), not counting the CPU attention kernel's own blocks (a few hundred KB per thread). */
size_t clip_param_bytes(const clip_config *cfg);
size_t clip_act_bytes(const clip_config *cfg, int n_images, int n_prompts, int S);

#endif
