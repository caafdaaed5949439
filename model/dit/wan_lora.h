/* model/dit/wan_lora.h — LoRA adapters on the linears of the Wan transformer (the model level): the
 * adapter's tensors, its forward/backward inside wan_forward/wan_backward, its initialisation, merge, and the two
 * file formats users load (diffusers' pytorch_lora_weights.safetensors and peft's adapter folder).
 *
 * References: peft 0.21.2 src/peft/tuners/lora/layer.py (Linear.forward: result = base(x) + lora_B(lora_A(x)) *
 * scaling, scaling = lora_alpha / r; reset_lora_parameters: kaiming_uniform_(lora_A, a=sqrt(5)), lora_B zeros;
 * get_delta_weight = lora_B @ lora_A * scaling), peft's target matching (tuners_utils.check_target_module_exists:
 * a target matches a module whose name equals it or ends with "." + it), diffusers 0.42.1 loaders/lora_pipeline.py
 * (WanLoraLoaderMixin: load_lora_weights, load_into_transformer_2, save_lora_weights), loaders/lora_base.py
 * (LORA_WEIGHT_NAME_SAFE, LORA_ADAPTER_METADATA_KEY, _pack_dict_with_prefix), loaders/peft.py (load_lora_adapter
 * with prefix "transformer", save_lora_adapter), utils/peft_utils.py (_create_lora_config: with metadata the
 * LoraConfig comes from it; without, lora_alpha = r).
 *
 * The adapter of one linear y = x W^T + b (W [out, in]) is A [r, in], B [out, r]; with it
 *     y = x W^T + b + scale * ((x A^T) B^T),   scale = (float)(alpha / r)        (peft's convention, fp32)
 * computed right after the base linear into the same output, by one function (wan_lora.c) that rollout and training
 * both reach through wan_forward, so the log-prob parity stays exactly 0. Backward, with dy = d y:
 *     h = x A^T (recomputed with the forward's call: bit-identical), dB += scale * dy^T h, t = dy B,
 *     dA += scale * t^T x, dx += scale * t A                    (ops->gemm, this fixed order, accumulating)
 * A fresh adapter (B = 0) adds scale * (h 0^T) = +0 to every output: the forward equals the base model's bit for bit
 * (except that an output of exactly -0.0 becomes +0.0; tested on random inputs). Every linear the adapter
 * targets keeps its input for the backward already (wan_internal.h), so LoRA adds no kept activation, only two
 * [M, r] scratch buffers per wan_acts (allocated on the first forward with an adapter; wan_lora_scratch_floats).
 *
 * Targets, named as diffusers names the modules (WAN_LORA_* below): per block (blocks.N.<name>) attn1.to_q,
 * attn1.to_k, attn1.to_v, attn1.to_out.0, attn2.to_q, attn2.to_k, attn2.to_v, attn2.to_out.0, ffn.net.0.proj,
 * ffn.net.2; model level condition_embedder.time_embedder.linear_1, condition_embedder.time_embedder.linear_2,
 * condition_embedder.time_proj, condition_embedder.text_embedder.linear_1, condition_embedder.text_embedder.linear_2,
 * proj_out. That is every nn.Linear of a text-to-video WanTransformer3DModel; patch_embedding (a Conv3d),
 * the norms and the scale_shift_tables are not adapted.
 *
 * Choices beyond the brief, and why:
 *   - wan_lora_config.targets is a bitmask of WAN_LORA_* (not a list of strings): the same set in any order, with
 *     or without duplicates, gives the same layout, init and files, and "same config" (resume) is ==. Names enter
 *     through wan_lora_targets_parse with peft's suffix rule, so peers' lists work: "to_q" = attn1.to_q and
 *     attn2.to_q (Flow-GRPO's Wan list is to_q, to_k, to_v, to_out.0 plus I2V-only names), "all-linear" (peft's
 *     shorthand) = all 16. A name that matches none of the 16 is an error listing the 16.
 *   - A's Philox slot is a fixed id of the module (WAN_LORA_SLOT), not the tensor's index in this adapter, so a
 *     module's initial A does not change when another target is added or removed; uid = the expert (0 transformer,
 *     1 transformer_2), so two experts with one init_seed get different A.
 *   - Switching the adapter off is a field of wan_exec (lora_off), not a model flag: the KL reference forward is
 *     wan_forward(m, acts_ref, &ex_ref, ...) with ex_ref.lora_off = 1 on the same const model, no state to restore
 *     and nothing shared that two forwards could race on.
 *   - The model does not own its adapter (wan_model_attach_lora borrows it; wan_model_free leaves it): the trainer
 *     holds adapters, their AdamW state and their files; two experts have one adapter each.
 *
 * Errors: every function returning int gives 0, or -1 with core_error naming what is wrong (the target and its
 * dims, the file and the key with both shapes, the JSON field). Library code never exits.
 */
#ifndef MODEL_WAN_LORA_H
#define MODEL_WAN_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "model/dit/wan_dit.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Targets */

typedef enum {
    /* per block: blocks.N.<name> */
    WAN_LORA_ATTN1_TO_Q = 0,  /* attn1.to_q       [D, D]   input: modulated LN1 output (xm1) */
    WAN_LORA_ATTN1_TO_K = 1,  /* attn1.to_k       [D, D]   xm1 */
    WAN_LORA_ATTN1_TO_V = 2,  /* attn1.to_v       [D, D]   xm1 */
    WAN_LORA_ATTN1_TO_OUT = 3, /* attn1.to_out.0  [D, D]   self-attention output */
    WAN_LORA_ATTN2_TO_Q = 4,  /* attn2.to_q       [D, D]   norm2 output (xn2) */
    WAN_LORA_ATTN2_TO_K = 5,  /* attn2.to_k       [D, D]   ctx (text tokens) */
    WAN_LORA_ATTN2_TO_V = 6,  /* attn2.to_v       [D, D]   ctx */
    WAN_LORA_ATTN2_TO_OUT = 7, /* attn2.to_out.0  [D, D]   cross-attention output */
    WAN_LORA_FFN_IN = 8,      /* ffn.net.0.proj   [Fd, D]  modulated LN3 output */
    WAN_LORA_FFN_OUT = 9,     /* ffn.net.2        [D, Fd]  gelu output */
    /* model level */
    WAN_LORA_TIME_1 = 10,     /* condition_embedder.time_embedder.linear_1  [D, freq_dim] */
    WAN_LORA_TIME_2 = 11,     /* condition_embedder.time_embedder.linear_2  [D, D] */
    WAN_LORA_TIME_PROJ = 12,  /* condition_embedder.time_proj               [6D, D] */
    WAN_LORA_TEXT_1 = 13,     /* condition_embedder.text_embedder.linear_1  [D, text_dim] */
    WAN_LORA_TEXT_2 = 14,     /* condition_embedder.text_embedder.linear_2  [D, D] */
    WAN_LORA_PROJ_OUT = 15,   /* proj_out                                   [C_out*pt*ph*pw, D] */
    WAN_LORA_NUM_TARGETS = 16
} wan_lora_target;

#define WAN_LORA_BLOCK_TARGETS 10                  /* targets 0..9 are per block */
#define WAN_LORA_MASK(t) (1u << (t))
#define WAN_LORA_ALL_BLOCK ((1u << WAN_LORA_BLOCK_TARGETS) - 1u)  /* the 10 block linears (0x3ff) */
#define WAN_LORA_ALL ((1u << WAN_LORA_NUM_TARGETS) - 1u)          /* every linear, peft's "all-linear" */
/* Philox slot of target t in block l (l = -1: a model-level target). Stable whatever else is targeted. */
#define WAN_LORA_SLOT(l, t) ((uint32_t)(((l) + 1) * WAN_LORA_NUM_TARGETS + (t)))

/* The module name of target t as diffusers names it ("attn1.to_q", ..., "proj_out"); NULL when out of range. */
const char *wan_lora_target_name(int t);
/* 1 if t is a per-block target (t < WAN_LORA_BLOCK_TARGETS). */
static inline int wan_lora_target_is_block(int t) { return t >= 0 && t < WAN_LORA_BLOCK_TARGETS; }
/* in and out features of target t under cfg (the base linear's W is [out, in]). */
void wan_lora_target_dims(const wan_config *cfg, int t, int *in, int *out);

/* Names -> bitmask, peft's rule: a name selects every target whose module name equals it or ends with "." + it;
 * "all-linear" selects all 16. Errors: n < 1 ("<label>: no targets"), a name that selects nothing
 * ("<label>: unknown target \"x\" (valid: attn1.to_q, ..., proj_out, or a suffix of one, or all-linear)"). */
int wan_lora_targets_parse(uint32_t *mask, const char *const *names, int n, const char *label);
/* The module names of mask, comma+space separated, in WAN_LORA_* order, into buf (truncated to cap). Returns buf. */
char *wan_lora_targets_format(uint32_t mask, char *buf, size_t cap);

/* ---------------------------------------------------------------------------------------------------------------
 * Config */

typedef struct {
    int rank;                /* r >= 1 and <= min(in, out) of every targeted linear */
    double alpha;            /* lora_alpha > 0, finite; scale = (float)(alpha / rank) */
    uint32_t targets;        /* bitmask of WAN_LORA_* (WAN_LORA_MASK(t)); != 0 */
    uint64_t init_seed;      /* Philox key of A's initialisation (not stored in adapter files) */
} wan_lora_config;

/* Checks c against the transformer config model. Errors ("<label>: ..."): rank < 1 ("rank must be >= 1, got 0"),
 * rank > min(in, out) of a target ("rank 200 is larger than attn1.to_q's smaller dimension: in 128, out 128"),
 * alpha <= 0 or not finite ("alpha must be > 0, got 0"), targets == 0 or bits past WAN_LORA_ALL. */
int wan_lora_config_validate(const wan_lora_config *c, const wan_config *model, const char *label);
/* 1 if rank, alpha and targets are equal (init_seed is not compared: a loaded adapter has none). */
int wan_lora_config_equal(const wan_lora_config *a, const wan_lora_config *b);
/* Floats of the adapter (sum over targeted modules of r * (in + out)), without allocating: the budget's figure.
 * -1 when the configs are invalid (error recorded). */
int64_t wan_lora_numel(const wan_config *model, const wan_lora_config *c);
/* Floats of the LoRA scratch one wan_acts gets on its first forward with this adapter: 2 * maxM * r, maxM the
 * largest row count of a targeted linear (B*S tokens of this rank, B*L text tokens, or the R modulation rows). */
int64_t wan_lora_scratch_floats(const wan_config *model, const wan_lora_config *c, const wan_shape *shape, int sp);

/* ---------------------------------------------------------------------------------------------------------------
 * The adapter: one flat buffer with a name/offset/shape table, like wan_model */

typedef struct {
    float *A;                /* lora_A.weight [r, in]; NULL: this module is not targeted */
    float *B;                /* lora_B.weight [out, r] */
    int in, out;
} wan_lora_linear;

typedef struct {
    wan_lora_linear *blocks; /* [num_layers * WAN_LORA_BLOCK_TARGETS]: blocks[l * WAN_LORA_BLOCK_TARGETS + t] */
    wan_lora_linear top[WAN_LORA_NUM_TARGETS]; /* model-level targets, indexed by t (entries < 10 unused) */
} wan_lora_weights;

struct wan_lora {            /* typedef'd in wan_dit.h (wan_model holds a pointer to one) */
    wan_lora_config cfg;     /* validated */
    wan_config model;        /* the transformer config it was made for (attach checks equality) */
    float scale;             /* (float)(cfg.alpha / cfg.rank) */
    int expert;              /* 0 transformer (high noise), 1 transformer_2: A's Philox uid; informational else */
    wan_layout layout;       /* tensors, in the model's module order (condition_embedder..., blocks.0 ...
                                blocks.N-1, proj_out), lora_A before lora_B; names as diffusers' state dict
                                WITHOUT prefix: "blocks.3.attn1.to_q.lora_A.weight" [r, in],
                                "blocks.3.attn1.to_q.lora_B.weight" [out, r]; layout.cfg = model */
    float *params;           /* [layout.numel] F32 */
    float *grads;            /* [layout.numel], NULL until wan_lora_alloc_grads */
    float *adam_m, *adam_v;  /* [layout.numel], NULL until wan_lora_alloc_adam */
    wan_lora_weights w;      /* into params */
    wan_lora_weights g;      /* into grads (all A/B NULL until allocated) */
};

/* Allocates the adapter of c for the transformer config model and initialises it as peft does
 * (init_lora_weights=True): every A from U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_(a=sqrt(5)) with fan_in = in),
 * element e of the flattened A is (2u - 1) / sqrt(in) rounded once to float, u = the Philox uniform of element e
 * (core_philox_uniform_range; key init_seed, slot WAN_LORA_SLOT(layer, target), uid expert, stream
 * CORE_STREAM_LORA_INIT); every B = 0. Errors: wan_lora_config_validate's ("lora: ..."), out of memory. On failure
 * *l is left freed. */
int wan_lora_init(wan_lora *l, const wan_config *model, const wan_lora_config *c, int expert);
/* Re-initialises params as wan_lora_init does (A from Philox, B = 0); grads and Adam state are left alone. */
void wan_lora_reset(wan_lora *l);
/* Zeroed gradients / Adam moments (no-op when present). -1 when out of memory. */
int wan_lora_alloc_grads(wan_lora *l);
int wan_lora_alloc_adam(wan_lora *l);
void wan_lora_zero_grads(wan_lora *l);
void wan_lora_free(wan_lora *l);
/* The target's adapter in block `layer` (a block target) or at model level (layer ignored): the entry of w or g,
 * with A == NULL when not targeted. */
static inline const wan_lora_linear *wan_lora_get(const wan_lora_weights *w, int layer, int t) {
    return wan_lora_target_is_block(t) ? &w->blocks[layer * WAN_LORA_BLOCK_TARGETS + t] : &w->top[t];
}

/* xxh64 (seed 0) of tensor i's F32 bytes; and the hash of n experts' adapters, core_model_hash over the names
 * "transformer/<name>", "transformer_2/<name>" (as wan_models_hash does for models). -1 only when out of memory. */
uint64_t wan_lora_tensor_hash(const wan_lora *l, int i);
int wan_lora_hash(const wan_lora *const *adapters, int n, uint64_t *out);

/* ---------------------------------------------------------------------------------------------------------------
 * With a model */

/* m->lora = l (NULL detaches). Borrowed: l must outlive its use and is not freed by wan_model_free. Error when
 * l was made for another transformer config. Forward and backward then apply it unless wan_exec.lora_off. */
int wan_model_attach_lora(wan_model *m, wan_lora *l);

/* What wan_forward/wan_backward do with an attached adapter (documented here, implemented there):
 *   - wan_forward applies m->lora unless ex->lora_off; the activations record whether it did.
 *   - wan_backward follows what the forward did. With the adapter: its gradients are accumulated (+=) into
 *     m->lora->grads (must be allocated), and the base's into m->grads ONLY when m->grads is allocated (frozen base:
 *     leave m->grads NULL; dx and denc are still computed when asked for). Without the adapter (lora_off or none
 *     attached) m->grads is required, as before. -1 when neither gradient buffer is there to receive anything.
 *   - Sequence parallel: the adapter's gradients are this rank's PARTIAL sums, exactly like m->grads; the trainer
 *     all-reduces m->lora->grads (layout.numel floats) with the same collective it uses for m->grads. */

/* W += scale * B A for every targeted linear of m (the merged model for export); biases unchanged. The model and
 * adapter configs must match. Computed with one ops->gemm per linear (alpha = scale, beta = 1). */
int wan_lora_merge(wan_model *m, const wan_lora *l);

/* ---------------------------------------------------------------------------------------------------------------
 * Files. Both formats hold one expert's adapter; tensors F32 on save, F32/BF16/F16 accepted on load.
 *
 * (1) diffusers: pytorch_lora_weights.safetensors (LORA_WEIGHT_NAME_SAFE), keys "transformer." + the layout's name
 *     ("transformer.blocks.0.attn1.to_q.lora_A.weight"), __metadata__ {"format": "pt", "lora_adapter_metadata":
 *     JSON}, the JSON as diffusers' save_lora_weights writes it: LoraConfig fields with the component prefix
 *     ("transformer.r", "transformer.lora_alpha", "transformer.target_modules", ...; indent 2, sorted keys), the
 *     fields that matter to a loader only (r, lora_alpha, target_modules = full module names, peft_type, bias,
 *     init_lora_weights, lora_dropout, fan_in_fan_out, use_dora, use_rslora, empty rank/alpha patterns): an older
 *     peft's LoraConfig(**fields) refuses fields it does not know. pipe.load_lora_weights(folder or file) loads it into pipe.transformer with lora_alpha from the metadata
 *     (without the metadata diffusers would take alpha = r).
 *     Two experts (Wan 2.2 A14B): the low-noise expert's adapter is a second file of the SAME form (keys still
 *     "transformer.", metadata still "transformer.*": load_into_transformer_2 passes the state dict to
 *     transformer_2.load_lora_adapter with prefix "transformer"), loaded with
 *     pipe.load_lora_weights(path_2, load_into_transformer_2=True). A "transformer_2." prefix would load nothing.
 *     Also read: the unprefixed file WanTransformer3DModel.save_lora_adapter writes (keys "blocks....", metadata
 *     JSON with unprefixed LoraConfig fields).
 * (2) peft: a folder with adapter_model.safetensors (keys "base_model.model." + name, __metadata__ {"format": "pt"})
 *     and adapter_config.json (LoraConfig.to_dict as peft's save_pretrained writes it: peft_type "LORA", r,
 *     lora_alpha, target_modules = the module names, init_lora_weights true, ...), loaded by
 *     PeftModel.from_pretrained(WanTransformer3DModel, folder).
 * Refused on load (error naming the key or field): rank_pattern / alpha_pattern entries that differ from r / alpha,
 * use_rslora, use_dora, lora_B biases, a module that is not one of the 16 targets, a target present in some blocks
 * but not all ("missing key ..."), lora_A and lora_B ranks that disagree, shapes that do not fit the model
 * ("key K has shape [a, b], the model expects [c, d]"). */

typedef enum {
    WAN_LORA_FMT_NONE = 0,
    WAN_LORA_FMT_DIFFUSERS = 1,       /* pipeline file: "transformer." keys (save_lora_weights) */
    WAN_LORA_FMT_DIFFUSERS_MODEL = 2, /* model file: unprefixed keys (WanTransformer3DModel.save_lora_adapter) */
    WAN_LORA_FMT_PEFT = 3             /* adapter_model.safetensors + adapter_config.json */
} wan_lora_format;

#define WAN_LORA_DIFFUSERS_FILE "pytorch_lora_weights.safetensors"
#define WAN_LORA_PEFT_FILE "adapter_model.safetensors"
#define WAN_LORA_PEFT_CONFIG "adapter_config.json"

const char *wan_lora_format_name(wan_lora_format f); /* "diffusers", "diffusers-model", "peft", "none" */

/* Writes the diffusers file at `path` (a file path; the folder must exist), atomically (temporary name, rename).
 * These writers refuse an adapter holding a NaN or infinite value before writing anything (wan_layout_check_finite:
 * "not saved: PATH: tensor ... holds a non-finite value (...)"); the readers refuse one too (st_read_f32). */
int wan_lora_save_diffusers(const wan_lora *l, const char *path);
/* Writes dir/adapter_model.safetensors and dir/adapter_config.json (dir created if missing), each atomically. */
int wan_lora_save_peft(const wan_lora *l, const char *dir);
/* Both into one folder (dir created if missing): dir/pytorch_lora_weights.safetensors and the peft pair.
 * diffusers' load_lora_weights(dir) picks pytorch_lora_weights.safetensors among the two .safetensors files by
 * name, and PeftModel.from_pretrained(model, dir) reads the peft pair, so one folder serves both. */
int wan_lora_save(const wan_lora *l, const char *dir);

/* What an adapter file or folder holds, without a model: the format, rank, alpha and target mask (init_seed 0).
 * path: a .safetensors file (diffusers either form, or peft's adapter_model.safetensors with adapter_config.json
 * beside it), or a folder holding pytorch_lora_weights.safetensors (preferred when both are there, as diffusers
 * does) or the peft pair. The file to read is written to file_out (cap bytes; may be NULL). Errors: no adapter
 * found (naming what was looked for), unreadable JSON (naming the field), keys of no known format (naming one),
 * the refusals listed above. */
int wan_lora_inspect(const char *path, wan_lora_config *c, wan_lora_format *fmt, char *file_out, size_t file_cap);
/* wan_lora_inspect, then wan_lora_init for model (expert as given) and the weights read in: a new adapter.
 * Every tensor the adapter has must be in the file and the file must have no other (key and both shapes named). */
int wan_lora_load(wan_lora *l, const wan_config *model, const char *path, int expert);
/* Reads the file's weights into an existing adapter (resume): the file's rank, alpha and targets must equal
 * l->cfg ("<file>: rank 8, the adapter being loaded into has rank 16 (its key \"...\" is [16, 128])"; a target
 * the file lacks or has extra: "<file>: missing key \"transformer.blocks.0.ffn.net.2.lora_A.weight\": the file's
 * targets are ...; the adapter being loaded into has ..."), then every key and shape as wan_lora_load. Grads and
 * Adam state are untouched; on an error the params may be partly overwritten only by a failing read (a file
 * truncated after its checks). */
int wan_lora_load_weights(wan_lora *l, const char *path);

#endif
