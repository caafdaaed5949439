/* model/dit/wan_dit.h — the Wan 2.1 / 2.2 video diffusion transformer (diffusers `WanTransformer3DModel`), fp32,
 * forward and backward, with diffusers checkpoints in and out.
 *
 * Reference: diffusers 0.42.1 src/diffusers/models/transformers/transformer_wan.py (WanTransformer3DModel,
 * WanTransformerBlock, WanAttention + WanAttnProcessor, WanTimeTextImageEmbedding, WanRotaryPosEmbed) and the
 * pieces it uses: embeddings.py (get_timestep_embedding with flip_sin_to_cos=True, downscale_freq_shift=0;
 * TimestepEmbedding; PixArtAlphaTextProjection with gelu_tanh), attention.py FeedForward("gelu-approximate"),
 * normalization.py FP32LayerNorm. Text-to-video only: image_dim / added_kv_proj_dim / pos_embed_seq_len (I2V,
 * FLF2V) are refused when loading a config.
 *
 * Files: wan_config.c (config.json, presets), wan_params.c (name/offset/shape table, named pointers, random init),
 * wan_io.c (load/save diffusers folders), wan_acts.c (activation memory), wan_forward.c, wan_backward.c,
 * wan_layers.c (small shared helpers), wan_internal.h (what forward and backward share); LoRA adapters on the
 * linears: wan_lora.h (wan_lora.c, wan_lora_io.c). Forward and backward are written once over the backend
 * interface (kernels/dev_ops.h's k_dev_ops): this header's fp32 model runs them through the CPU's (k_cpu_dev_ops),
 * the same code runs in bf16 on a device table (the CUDA backend, or the emulated device in tests): wan_dev.h
 * (wan_dev.c, its executor wan_dev_exec.c, wan_dev_run.c; check/check_dit.c: its GPU check rows).
 *
 * Forward, x [B, C, F, H, W] -> velocity [B, C_out, F, H, W] (S = F/pt * H/ph * W/pw video tokens, D = dim):
 *   tokens  = patchify(x) @ patch_embedding^T + b                                   [B, S, D]
 *   temb    = time_embedder(sinusoid(timestep))            [B, D]  (per-token timesteps: [B, S, D])
 *   tproj   = time_proj(silu(temb))                        [B, 6D] (per-token: [B, S, 6D])
 *   ctx     = text_embedder(encoder_hidden_states)         [B, L, D]  (linear, gelu-tanh, linear)
 *   per block, (sh, sc, g, csh, csc, cg) = block.scale_shift_table + tproj:
 *     x = x + g  * to_out(selfattn(rope(rms(to_q(m1))), rope(rms(to_k(m1))), to_v(m1))), m1 = LN(x)*(1+sc)+sh
 *     x = x + to_out(crossattn(rms(to_q(n2)), rms(to_k(ctx)), to_v(ctx))),          n2 = LN_affine(x) or x
 *     x = x + cg * ffn(LN(x)*(1+csc)+csh),  ffn = net.2(gelu_tanh(net.0.proj(.)))
 *   out = unpatchify(proj_out(LN(x)*(1+scale)+shift)), (shift, scale) = scale_shift_table + temb
 * LN: LayerNorm without affine; rms: RMSNorm over all heads (H*Dh) with weight; attention scale 1/sqrt(Dh).
 *
 * Activation memory (wan_acts, floats; S tokens, L text tokens, D dim, Fd ffn dim, B batch; one "x" = B*S*D):
 *   kept per block, both training modes: the block input x, to_q/to_k/to_v outputs before the norms (3x), the
 *     self-attention output and its LSE [B, H, S], the to_out output, to_q of the cross-attention before its norm,
 *     the cross-attention output and LSE, the residual after the cross-attention, the FFN output
 *     (10x + B*S*Fd for the FFN hidden before gelu + 2*B*L*D for the text K/V before/without norm
 *     + LayerNorm/RMSNorm statistics, a few B*S floats).
 *   WAN_ACTS_STORE also keeps the elementwise results: LN1 output, modulated LN1 output, q and k after norm+RoPE,
 *     the residual after self-attention, the cross-attention LN output (cross_attn_norm only), q after norm, LN3
 *     output and its modulated form (8-9x), the text k after norm (B*L*D) and the gelu output (B*S*Fd).
 *   WAN_ACTS_RECOMPUTE recomputes those in backward from what is kept, with the same kernels on the same inputs,
 *     so gradients are bitwise identical to WAN_ACTS_STORE (tested). Per block that is ~16.5 x B*S*D floats kept
 *     instead of ~31.7 (Wan-1.3B shapes, Fd = 5.83 D): e.g. 30 layers, 1,560 tokens, 512 text tokens, batch 1:
 *     STORE 8.7 GiB, RECOMPUTE 4.8 GiB, INFER 0.33 GiB (wan_acts_bytes, scratch included).
 *   Model-level: the patchified input, the time and text embedding intermediates, the final LN statistics and
 *     the proj_out input. WAN_ACTS_INFER keeps nothing per block (one scratch set, ping-pong residual): forward only.
 *   Modulation tables (scale_shift_table + tproj) are rebuilt per block, never stored per block.
 *   Sequence parallelism (wan_acts_new_sp, sp > 1): S above is the local S/sp, so everything per token drops by sp;
 *     what stays whole is per text token (B*L*D terms, the enc copy) and one [B, S, max(Pin, Pout)] scratch
 *     (patch vectors: 64 floats per token for 16 channels and patch (1,2,2)) plus B*L*text_dim for d enc.
 *
 * Presets (wan_config_preset):
 *   tiny             4 heads x 32 = 128 dim, 2 layers, ffn 256, in/out 16 channels, text_dim 64, freq_dim 256,
 *                    patch (1,2,2), eps 1e-6, cross_attn_norm, rope_max_seq_len 1024: 589,248 parameters
 *                    (2.36 MB fp32). Random weights from Philox (wan_params_init_random). 4 heads so Ulysses
 *                    degree 4 divides them; callers pick token counts divisible by 4.
 *   tiny-ti2v        tiny's transformer config; `vgrpo init-model` writes it as an image-to-video pipeline
 *                    (expand_timesteps, a VAE with an encoder: Wan 2.2 TI2V's first-frame conditioning)
 *   wan2.1-t2v-1.3b  12 x 128 = 1536, 30 layers, ffn 8960, in/out 16, text 4096: 1,418,996,800 parameters
 *   wan2.2-ti2v-5b   24 x 128 = 3072, 30 layers, ffn 14336, in/out 48, text 4096: 4,999,787,712 (per-token t)
 *   wan2.2-t2v-a14b  40 x 128 = 5120, 40 layers, ffn 13824, in/out 16, text 4096: 14,288,491,584 per expert,
 *                    two experts (transformer: high noise, transformer_2: low noise, boundary_ratio 0.875)
 * (the real ones: the official Wan-AI/<model>-Diffusers transformer/config.json values; names and shapes are checked
 * against tests/fixtures/wan_names_<preset>.txt, generated from diffusers on the meta device).
 */
#ifndef MODEL_WAN_DIT_H
#define MODEL_WAN_DIT_H

#include <stddef.h>
#include <stdint.h>

#include "core/philox.h"
#include "kernels/body/kb_base.h"
#include "kernels/kernels.h"
#include "sp/comm.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Config (diffusers transformer/config.json) */

typedef struct {
    int patch_size[3];       /* (pt, ph, pw) */
    int num_attention_heads; /* H */
    int attention_head_dim;  /* Dh; D = H * Dh */
    int in_channels;         /* C */
    int out_channels;        /* C_out (null or 0 in config.json: = in_channels, as diffusers) */
    int text_dim;            /* width of encoder_hidden_states (4096 for UMT5-XXL) */
    int freq_dim;            /* sinusoidal timestep features */
    int ffn_dim;
    int num_layers;
    int cross_attn_norm;     /* 1: affine LayerNorm before the cross-attention (blocks.N.norm2) */
    double eps;              /* LayerNorm and RMSNorm epsilon */
    int rope_max_seq_len;    /* longest grid side the RoPE table covers */
} wan_config;

/* D = num_attention_heads * attention_head_dim. */
static inline int wan_dim(const wan_config *c) { return c->num_attention_heads * c->attention_head_dim; }

/* Parses a diffusers WanTransformer3DModel config.json text. Keys starting with '_' (_class_name,
 * _diffusers_version, ...) are ignored; qk_norm must be "rms_norm_across_heads"; image_dim, added_kv_proj_dim and
 * pos_embed_seq_len must be null or absent ("I2V not supported yet"); any other unknown key is an error. Missing
 * keys take diffusers' defaults. Returns 0, or -1 with an error "<label>: <key>: ...". */
int wan_config_parse(wan_config *c, const char *json_text, const char *label);
/* wan_config_parse of the file at path (label = path). */
int wan_config_load(wan_config *c, const char *path);
/* Checks sizes are positive, Dh even and >= 6 (RoPE), rope_max_seq_len >= 1, eps > 0. -1 naming the key. */
int wan_config_validate(const wan_config *c, const char *label);
/* Writes config.json as diffusers' save_pretrained does (every __init__ argument, sorted keys). -1 naming path. */
int wan_config_save(const wan_config *c, const char *path);
/* 1 if every field of a and b is equal (not memcmp: the struct has padding). */
int wan_config_equal(const wan_config *a, const wan_config *b);
/* What the transformer's input holds besides the latent, from its config: WAN_COND_LATENT when in_channels ==
 * out_channels (text to video, and Wan 2.2 TI2V, whose first frame is written into the latent itself:
 * model/flow/first_frame.h; the pipeline's expand_timesteps, not the transformer, tells TI2V apart), WAN_COND_CONCAT
 * when in_channels == 2 out_channels + 4 (Wan 2.2 I2V-A14B: a 4-channel mask and the condition video's latents,
 * model/vae/wan_vae_i2v.h, concatenated to every step's input; their in_channels - out_channels channels are
 * wan_cond_channels), WAN_COND_UNKNOWN for any other pair (no Wan model; refused where a model is checked). */
typedef enum { WAN_COND_UNKNOWN = -1, WAN_COND_LATENT = 0, WAN_COND_CONCAT = 1 } wan_cond;
wan_cond wan_cond_kind(const wan_config *c);
/* The channels concatenated after the latent: in_channels - out_channels for WAN_COND_CONCAT, else 0. */
int wan_cond_channels(const wan_config *c);
/* Fills c with preset `name` (see the top comment). -1 with the list of presets if unknown. */
int wan_config_preset(wan_config *c, const char *name);
/* NULL-terminated list of preset names. */
const char *const *wan_preset_names(void);

/* ---------------------------------------------------------------------------------------------------------------
 * Parameters: one flat float buffer, a name/offset/shape table in diffusers state_dict order (llm.c pattern) */

#define WAN_NAME_MAX 80
#define WAN_MAX_DIMS 5

typedef struct {
    char name[WAN_NAME_MAX]; /* diffusers key, e.g. "blocks.3.attn1.to_q.weight" */
    int ndim;
    int64_t shape[WAN_MAX_DIMS];
    int64_t numel;
    int64_t offset;          /* in floats, into the flat buffer */
} wan_tensor;

typedef struct {
    wan_config cfg;
    int count;               /* number of tensors */
    wan_tensor *tensors;     /* [count], state_dict order */
    int64_t numel;           /* total floats */
} wan_layout;

/* Builds the table for cfg (validated first). Returns 0, or -1 (bad config, out of memory). */
int wan_layout_init(wan_layout *L, const wan_config *cfg);
void wan_layout_free(wan_layout *L);
/* Index of tensor `name`, or -1 (no error recorded). */
int wan_layout_find(const wan_layout *L, const char *name);
/* 0 when every value of the flat buffer base [L->numel] (params, an EMA, Adam m or v: L's order) is finite, else -1
 * with core_f32_check_finite's error naming label, the tensor (prefix + its name, e.g. "transformer/exp_avg_sq/" +
 * "blocks.0.attn1.to_q.weight"), the element and its value. One read of the buffer: about 0.6-0.8 s for 1.3B F32
 * parameters (5.2 GB) on one core here. */
int wan_layout_check_finite(const wan_layout *L, const float *base, const char *label, const char *prefix);

/* Named pointers into a flat buffer (params, grads, Adam m or v: same layout). */
typedef struct {
    float *to_q_w, *to_q_b, *to_k_w, *to_k_b, *to_v_w, *to_v_b; /* [D, D], [D] */
    float *to_out_w, *to_out_b;                                 /* to_out.0: [D, D], [D] */
    float *norm_q, *norm_k;                                     /* RMSNorm weights [D] */
} wan_attn_weights;

typedef struct {
    float *scale_shift_table;    /* [1, 6, D]: shift, scale, gate (self-attn); shift, scale, gate (ffn) */
    wan_attn_weights attn1, attn2;
    float *norm2_w, *norm2_b;    /* [D]; NULL unless cross_attn_norm */
    float *ffn1_w, *ffn1_b;      /* ffn.net.0.proj: [Fd, D], [Fd] */
    float *ffn2_w, *ffn2_b;      /* ffn.net.2: [D, Fd], [D] */
} wan_block_weights;

typedef struct {
    float *scale_shift_table;    /* [1, 2, D]: shift, scale of the output norm */
    float *patch_w, *patch_b;    /* patch_embedding: [D, C, pt, ph, pw], [D] */
    float *time1_w, *time1_b;    /* condition_embedder.time_embedder.linear_1: [D, freq_dim], [D] */
    float *time2_w, *time2_b;    /* ...linear_2: [D, D], [D] */
    float *tproj_w, *tproj_b;    /* condition_embedder.time_proj: [6D, D], [6D] */
    float *text1_w, *text1_b;    /* condition_embedder.text_embedder.linear_1: [D, text_dim], [D] */
    float *text2_w, *text2_b;    /* ...linear_2: [D, D], [D] */
    float *proj_out_w, *proj_out_b; /* [C_out*pt*ph*pw, D], [C_out*pt*ph*pw] */
    int num_layers;
    wan_block_weights *blocks;   /* [num_layers] */
} wan_weights;

/* Points w's fields into base[0..L->numel). Allocates w->blocks. Returns 0 or -1 (out of memory). */
int wan_weights_bind(wan_weights *w, const wan_layout *L, float *base);
void wan_weights_free(wan_weights *w);

typedef struct wan_lora wan_lora; /* a LoRA adapter: model/dit/wan_lora.h */

/* The model: config, table, flat parameters and (on request) gradients and Adam moments. (Tagged: the rollout source
 * interface, core/rollout_source.h, names it without including this header.) */
typedef struct wan_model {
    wan_config cfg;
    wan_layout layout;
    float *params;               /* [layout.numel] */
    float *grads;                /* [layout.numel], NULL until wan_model_alloc_grads */
    float *adam_m, *adam_v;      /* [layout.numel], NULL until wan_model_alloc_adam */
    wan_weights w;               /* into params */
    wan_weights g;               /* into grads (zeroed struct until allocated) */
    wan_lora *lora;              /* attached LoRA adapter (wan_model_attach_lora, borrowed), NULL: none. With one,
                                    m->grads may stay NULL (frozen base): see wan_lora.h */
} wan_model;

/* Allocates a model for cfg with zeroed parameters. Returns 0 or -1 (bad config, out of memory). */
int wan_model_init(wan_model *m, const wan_config *cfg);
/* Allocates zeroed gradients (and binds m->g) / zeroed Adam m and v. 0 or -1 (out of memory). No-op if present. */
int wan_model_alloc_grads(wan_model *m);
int wan_model_alloc_adam(wan_model *m);
/* Sets every gradient to 0 (no-op without gradients). */
void wan_model_zero_grads(wan_model *m);
void wan_model_free(wan_model *m);

/* Random initial weights (the tiny preset; tests): Linear and Conv3d weights N(0, 1/fan_in), biases 0, norm
 * weights 1, scale_shift_tables N(0, 1/D) (diffusers' initialisation of those tables). Normals from Philox
 * (core/philox.h) with key seed, counter (element / 4, slot = tensor index, uid 0, stream WAN_INIT_STREAM), so a
 * tensor's values depend only on (seed, its index, element). */
#define WAN_INIT_STREAM CORE_STREAM_MODEL_INIT
void wan_params_init_random(wan_model *m, uint64_t seed);

/* ---------------------------------------------------------------------------------------------------------------
 * Checksums (docs/design.md section 3; model/dit/wan_hash.c) */

/* "transformer" for expert 0 (high noise, or the only one), "transformer_2" for expert 1. */
const char *wan_expert_folder(int expert);
/* xxh64 (seed 0) of tensor i's F32 bytes. */
uint64_t wan_tensor_hash(const wan_model *m, int i);
/* The whole-model hash of n experts (core_model_hash over names "transformer/<name>", "transformer_2/<name>").
 * -1 only when out of memory. */
int wan_models_hash(const wan_model *const *experts, int n, uint64_t *out);
/* The same hash over any per-expert tensor sets (the weights' layouts, the LoRA adapters' layouts): set e (NULL:
 * expert e has none, skipped) named "<wan_expert_folder(e)>/<tensor name>", each tensor the xxh64 of its F32 bytes
 * at params[e] + offset. n <= WAN_HASH_MAX_SETS. -1 only when out of memory. */
#define WAN_HASH_MAX_SETS 2
int wan_tensor_sets_hash(const wan_layout *const *layouts, const float *const *params, int n, uint64_t *out);
/* The same, with the tensors' xxh64 of set e given in hashes[e] ([layouts[e]->count], layout order) where hashes[e]
 * is not NULL (a worker that hashed the bytes as they arrived: rollout/worker_ipc.c); params[e] is then not read. */
int wan_tensor_sets_hash_given(const wan_layout *const *layouts, const float *const *params,
                               const uint64_t *const *hashes, int n, uint64_t *out);
/* The whole-adapter hash of the LoRA adapters attached to experts[0..n) (wan_tensor_sets_hash over the adapters'
 * layouts; an expert without an adapter contributes nothing; with every expert adapted it equals wan_lora_hash):
 * what a worker's hello reports as adapter_xxh64 and an adapter sync must match, on both sides. Returns the number
 * of adapters (0: none, *out = 0), or -1 when out of memory. Reads struct fields only (no call into wan_lora.c). */
int wan_models_adapters_hash(const wan_model *const *experts, int n, uint64_t *out);

/* ---------------------------------------------------------------------------------------------------------------
 * Checkpoints (diffusers layout) */

/* Loads a transformer folder: config.json and either one *.safetensors or a *.safetensors.index.json with its
 * shards (diffusion_pytorch_model*.safetensors). Tensors may be F32, BF16 or F16 and are converted to F32.
 * Errors (-1) name the folder and: the config key, a tensor the checkpoint lacks ("missing tensor ..."), a tensor
 * the model does not have ("unexpected tensor ..."), a shape mismatch ("tensor X has shape [..], expected [..]"),
 * a dtype other than F32/BF16/F16, a NaN or infinite value (st_read_f32: the shard, tensor, element and value).
 * On failure *m is left freed. */
int wan_model_load(wan_model *m, const char *dir);
/* Loads weights from the checkpoint in dir into an initialised model with the same config (same checks). */
int wan_model_load_weights(wan_model *m, const char *dir);
/* Writes dir/config.json and dir/diffusion_pytorch_model.safetensors (F32, every tensor) so that
 * WanTransformer3DModel.from_pretrained(dir) loads it. dir is created if missing. -1 naming the path; a NaN or
 * infinite weight is refused before anything is written ("not saved: DIR: tensor ... holds a non-finite value"). */
int wan_model_save(const wan_model *m, const char *dir);

/* ---------------------------------------------------------------------------------------------------------------
 * Forward and backward */

/* Self-attention through one function pointer (sp/ supplies Ulysses x Ring; the default is ops->attention_*).
 * q, k, v, o [B, S, H, Dh] typed views in the activations' dtype and memory (fp32 host tensors on the CPU, bf16
 * device tensors on a device; S: the tokens this call sees), lse [B, H, S] fp32 natural log; scale 1/sqrt(Dh) is the
 * implementation's to apply. Backward accumulates (+=) into dq, dk, dv. Return 0, or -1 with core_error. */
typedef int (*wan_self_attn_fwd_fn)(void *ctx, kb_out o, float *lse, kb_in q, kb_in k, kb_in v, int B, int S, int H,
                                     int Dh);
typedef int (*wan_self_attn_bwd_fn)(void *ctx, kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k,
                                     kb_in v, kb_in o, const float *lse, int B, int S, int H, int Dh);

/* How a forward/backward runs: the kernels, the self-attention and (optionally) the sequence-parallel group.
 * ops NULL = &k_cpu_ops, the only table taken (the model runs on k_cpu_dev_ops, whose entries are k_cpu_ops'; ops
 * serves the default self-attention); attn_fwd NULL = the default (ops->attention_forward/backward with scale
 * 1/sqrt(Dh); ctx is then the k_ops pointer). sp: the SP group (sp/comm.h; docs/design.md section 6) when the
 * activations were made for one token slice (wan_acts_new_sp with sp > 1): its size and rank must be that sp and
 * sp_rank, and attn_fwd/attn_bwd must be a sequence-parallel self-attention (sp_usp_forward/backward with an sp_usp
 * context: the default attention would only see the local keys). NULL (or a group of one) with sp-1 activations: the
 * whole sequence, exactly the single-rank path (activations from wan_acts_new). */
typedef struct {
    const k_ops *ops;
    wan_self_attn_fwd_fn attn_fwd;
    wan_self_attn_bwd_fn attn_bwd;
    void *attn_ctx;
    sp_comm *sp;
    int lora_off;            /* 1: run without the model's LoRA adapter (the KL reference = the base model) */
    struct wan_dev_exec *dev; /* not NULL: the model runs on a device (model/dit/wan_dev_exec.h, model.device cuda):
                                wan_exec_forward / wan_exec_backward (model/dit/wan_executor.h) hand the call to that
                                executor (wan_forward / wan_backward ignore this field); NULL: the fp32 CPU model.
                                With sp (more than one rank) the device runs the same sequence-parallel branches on
                                its bf16 activations: attn_fwd/attn_bwd must then take device tensors (an sp_usp
                                whose table is the device's), sp's comm must move device buffers */
    /* Optional: called during a backward (wan_backward; on a device wan_dev_exec_backward) as soon as the parameter
     * gradients of block `block` are final for this backward (the blocks run last to first), then once with block
     * -1 when every gradient is (the embeddings, proj_out, the model's scale_shift_table). m: the host model whose
     * (or whose adapter's) gradients they are. The gradient reduction overlapping the backward hangs here
     * (trainer/dp/dp_bucket.h). A nonzero return stops the backward with the hook's error. */
    int (*grad_ready)(void *ctx, const wan_model *m, int block);
    void *grad_ready_ctx;
} wan_exec;

/* Problem size of one call. */
typedef struct {
    int B;                   /* batch */
    int F, H, W;             /* latent frames, height, width (multiples of the patch size) */
    int L;                   /* text tokens in encoder_hidden_states */
    int per_token_timestep;  /* 0: timestep [B]; 1: timestep [B, S] (Wan 2.2 TI2V expand_timesteps) */
} wan_shape;

typedef enum {
    WAN_ACTS_INFER = 0,      /* forward only; nothing kept per block */
    WAN_ACTS_STORE = 1,      /* forward keeps everything backward needs */
    WAN_ACTS_RECOMPUTE = 2,  /* forward keeps the GEMM/attention results; backward recomputes norms, RoPE, ... */
    WAN_ACTS_CHECKPOINT = 3  /* the device model only (wan_dev.h; the CPU model refuses it): whole-block
                                checkpointing, forward keeps each block's input, backward reruns the block */
} wan_acts_mode;

typedef struct wan_acts wan_acts; /* activations + scratch for one (config, shape, mode); model/dit/wan_internal.h */

/* Allocates activations for cfg and shape (checked: divisibility by the patch size, grid within
 * rope_max_seq_len, sizes > 0). NULL with core_error on a bad shape or out of memory. */
wan_acts *wan_acts_new(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode);
/* The activations of SP rank sp_rank of sp (docs/design.md section 6): the blocks will run on video tokens
 * [sp_rank * S/sp, (sp_rank+1) * S/sp) of every sample (S = wan_tokens), so everything per token is sized for S/sp;
 * the full-sequence extras are one [B, S, C*pt*ph*pw] scratch (patchified input, gathered proj_out output) and
 * d enc's [B, L, text_dim] scratch. sp == 1 is wan_acts_new. NULL with core_error also when sp < 1, sp_rank is out
 * of [0, sp) or S is not a multiple of sp. Use with a wan_exec whose sp group has this size and rank. */
wan_acts *wan_acts_new_sp(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode, int sp, int sp_rank);
void wan_acts_free(wan_acts *a);
/* Bytes held by a (activations + scratch). */
size_t wan_acts_bytes(const wan_acts *a);
/* What wan_acts_bytes reports for the activations wan_acts_new_sp(cfg, shape, mode, sp, any rank) allocates, before
 * any forward (so without the LoRA scratch: wan_lora_scratch_floats), computed by the allocator's own counting pass
 * without allocating: the figure trainer/budget/budget.c estimates with. Bytes; 0 with core_error for a shape, mode or sp
 * that wan_acts_new_sp refuses. */
size_t wan_acts_plan_bytes(const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode, int sp);
/* Video tokens S of a shape under cfg's patch size. */
int64_t wan_tokens(const wan_config *cfg, const wan_shape *shape);

/* Forward: x [B, C, F, H, W], timestep [B] or [B, S] (float, in diffusers' 0..1000 units), enc
 * [B, L, text_dim] -> out [B, C_out, F, H, W] (velocity). ex NULL = CPU defaults. Returns 0, or -1 when the
 * attention function fails. A sample's output does not depend on its batch mates or the thread count.
 * Sequence parallel (a's shape has sp > 1; ex->sp the SP group, ex->attn_* the USP hook): every SP rank passes the
 * same full x, timestep and enc; patchify runs on the full sample, the patch embedding and the blocks on this
 * rank's token slice (RoPE rows and per-token timesteps sliced to it), the text embedding on the full text on
 * every rank; after proj_out the slices are all-gathered (sp_gather_rows) and every rank writes the same full
 * out. Collective over ex->sp. With the Ulysses-only hook out is bit-identical to the single-rank forward. */
int wan_forward(const wan_model *m, wan_acts *a, const wan_exec *ex, float *out, const float *x,
                const float *timestep, const float *enc);

/* Backward of the last wan_forward on a (mode STORE or RECOMPUTE): given dout [B, C_out, F, H, W], ACCUMULATES
 * (+=) the gradients of every parameter into m->grads (allocated), and into dx [B, C, F, H, W] and denc
 * [B, L, text_dim] when not NULL. The timestep gets no gradient. Returns 0, or -1 (no gradients allocated, wrong
 * mode, no forward run, attention failure, a communication failure).
 * Sequence parallel: every SP rank passes the same full dout (every rank computed the same loss from the gathered
 * output), and the gather's backward takes this rank's rows of it. Then, per rank:
 *   - m->grads += this rank's PARTIAL parameter gradients (its tokens' share of every sum over tokens; the time
 *     and text embedders included). The caller sums them over the SP group, or once over all trainer ranks
 *     (dp x sp) after accumulating every micro-batch: sp_comm_all_reduce(world, m->grads, m->grads, numel, SP_F32)
 *     (docs/design.md section 4). Nothing is divided by sp. (Not reduced here: the backward accumulates, and reducing
 *     an accumulating buffer per call would count earlier calls sp times.)
 *   - denc += the FULL text-embedding gradient, the same on every SP rank (this call's partial is all-reduced over
 *     ex->sp in a scratch buffer before it is added);
 *   - dx += the FULL input gradient, the same on every SP rank (the patch-embedding input gradients of the slices
 *     are all-gathered); with the Ulysses-only hook bit-identical to the single-rank backward.
 * Collective over ex->sp: every SP rank passes dx and denc alike (both NULL or both not). */
int wan_backward(wan_model *m, wan_acts *a, const wan_exec *ex, float *dx, float *denc, const float *dout);

#endif
