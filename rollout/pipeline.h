/* rollout/pipeline.h — everything a rollout process loads from a recipe (docs/design.md sections 3 and 5): the expert(s)
 * (transformer/, and transformer_2/ for Wan 2.2 A14B), the prompt conditioning (umT5 or the tiny preset's word
 * embeddings, cached per prompt text), the decoder from final latents to U8 video, and the sampling settings.
 *
 *   rollout_pipeline p;
 *   rollout_pipeline_load(&p, &recipe, NULL);               // NULL: model.path/transformer[_2]; model.lora
 *   rollout_pipeline_embed(&p, "a red car", &emb);           // [L, text_dim] fp32, cached (owned by p)
 *   rollout_generate(&p.rc, &p.experts, NULL, n, cond, uids, pidx, traj);
 *   rollout_pipeline_decode(&p, &traj[j], video);            // [dec.frames, dec.height, dec.width, 3] U8
 *
 * The conditioning is model/text/text_cond.h (p.rc.neg is its negative embedding: umT5's empty prompt, or NULL). */
#ifndef ROLLOUT_PIPELINE_H
#define ROLLOUT_PIPELINE_H

#include <stdint.h>

#include "core/recipe.h"
#include "core/trajectory.h"
#include "model/vae/latent_rgb.h"
#include "model/text/text_cond.h"
#include "model/dit/wan_dev_exec.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"
#include "model/vae/wan_vae.h"
#include "rollout/engine.h"


/* The path from final latents [C, F, h, w] to U8 video (model.decoder): the pipeline's Wan VAE (vae_latents_to_u8:
 * 1 + 4(F - 1) frames; Wan 2.1's, spatial factor 8, or Wan 2.2's, 16 with 48 channels, patchified) or the tiny
 * preset's latent_rgb map (one frame per latent frame, factor 8). The video is h x factor by w x factor: the recipe's
 * rollout.height x rollout.width. Used by rollout workers (inside rollout_pipeline) and by local-mode runs. */
typedef struct {
    wan_latent_rgb map;           /* latent_rgb */
    vae_model *vae;               /* vae (NULL: latent_rgb) */
    wan_dev_exec *dx;             /* the device the VAE decodes on (model.device cuda, model.vae_device auto); NULL: CPU */
    int64_t latent[4];            /* [C, F, h, w] the recipe's latents */
    int frames, height, width;    /* the decoded video's size */
} rollout_decoder;

/* The decoder's check that needs no file: model.decoder latent_rgb paints WAN_LATENT_RGB_FACTOR (8) pixels per latent
 * pixel, so model.vae_scale_factor_spatial must be 8 with it. -1 naming the key and its value. */
int rollout_decoder_check(const core_recipe *r);
/* Loads model.decoder for recipe r and a transformer of config wc. Errors (-1) name model.decoder /
 * model.vae_scale_factor_spatial and the path: a missing file, the VAE's z_dim != the transformer's out_channels, a
 * VAE that is not temporal factor 4 and RGB, a VAE whose spatial factor (vae_spatial_factor) is not the recipe's
 * model.vae_scale_factor_spatial (naming both values and the VAE folder), latent_rgb with a factor other than 8.
 * With model.device cuda and model.vae_device auto the VAE decodes on the process's device (the DiT's executor,
 * model/dit/wan_dev_exec.h; the VAE's bf16 weights uploaded here, its decode state allocated by each decode and
 * released after it: a phase of its own),
 * else on the CPU (fp32). */
int rollout_decoder_load(rollout_decoder *d, const core_recipe *r, const wan_config *wc);
/* Decodes z [C, F, h, w] (the recipe's latent shape) into video [frames, height, width, 3] U8 (caller's buffer).
 * -1 naming model.decoder on failure. */
int rollout_decoder_decode(rollout_decoder *d, const float *z, uint8_t *video);
/* Decodes a finished trajectory's final latent (rollout_decoder_decode). -1 naming model.decoder when its latent is
 * not the decoder's shape or the trajectory no longer holds its final latent (trimmed before it was decoded). */
int rollout_decoder_decode_traj(rollout_decoder *d, const core_traj *t, uint8_t *video);
/* Bytes of one decoded video. */
int64_t rollout_decoder_video_bytes(const rollout_decoder *d);
void rollout_decoder_free(rollout_decoder *d);

typedef struct {
    wan_model model[2];           /* model[1] loaded only for two experts */
    wan_lora lora[2];             /* LoRA adapters attached to model[e] (layout.count 0: none) */
    rollout_experts experts;      /* points into model[] */
    text_cond *text;              /* model.text_encoder (umt5 or word_embed), cached per prompt */
    rollout_decoder dec;          /* model.decoder: dec.frames, dec.height, dec.width give the video size */
    rollout_config rc;            /* sampling: rollout.* of the recipe (stream: rollout noise) */
    wan_dev_exec *dx;             /* model.device cuda: the experts' DiT on the device (model/dit/wan_dev_exec.h;
                                     sync each expert with the weights version it holds before a rollout); NULL: CPU */
    wan_exec exec;                /* rollout_generate's ex on the device (.dev = dx); pass rollout_pipeline_exec(p) */
} rollout_pipeline;

/* rollout_generate's ex for the pipeline: NULL on the CPU, &p->exec on the device. */
static inline const wan_exec *rollout_pipeline_exec(const rollout_pipeline *p) { return p->dx ? &p->exec : NULL; }

/* Loads the pipeline of recipe r (model.path, model.text_encoder, model.decoder, rollout.*, model.boundary_ratio).
 * transformer_dir: the high-noise (or only) expert's folder instead of model.path/transformer (a checkpoint's
 * transformer/; its transformer_2/ sibling, when present, replaces model.path/transformer_2). Two experts when
 * model.path/transformer_2 (or the sibling) exists; they must share one config. Errors (-1) name the key and the
 * path: a missing folder, a config mismatch between transformer, text encoder and VAE, a VAE rollout_decoder_load
 * refuses. On error everything loaded so far is freed. */
int rollout_pipeline_load(rollout_pipeline *p, const core_recipe *r, const char *transformer_dir);

/* rollout_pipeline_load, then the LoRA adapters (model/dit/wan_lora.h), attached to the experts:
 *   adapter_path NULL: the recipe's model.lora; with rank >= 1 a fresh adapter for every trained expert
 *     (algorithm.train_experts), made exactly as the trainer makes its own (wan_lora_init with model.lora.init_seed
 *     and the expert's index), so the worker's policy equals the trainer's initial one; rank 0: none. This is what
 *     rollout_pipeline_load does.
 *   adapter_path given (`vgrpo rollout-worker --adapter`, eval of a LoRA checkpoint): expert 0's adapter is read from
 *     adapter_path and expert 1's from "<adapter_path>_2", each where it exists (a folder or file wan_lora_inspect
 *     accepts: diffusers' or peft's format; at least one must), and model.lora is ignored.
 * Errors (-1) name model.lora.* or the adapter file (wan_lora_load's key and shape messages). */
int rollout_pipeline_load_lora(rollout_pipeline *p, const core_recipe *r, const char *transformer_dir,
                               const char *adapter_path);

/* The conditioning of one prompt: *out points to [text_len, text_dim] fp32 owned by the pipeline's cache (valid
 * until rollout_pipeline_free). Errors (-1): a word_embed prompt with more than text_len words (names
 * rollout.text_len), tokenizer or encoder failure, out of memory. Not thread-safe. */
int rollout_pipeline_embed(rollout_pipeline *p, const char *prompt, const float **out);

/* Decodes a finished trajectory's final latent [C, F, h, w] into video [dec.frames, dec.height, dec.width, 3]
 * U8 (caller's buffer). -1 naming model.decoder on a shape mismatch or decoder failure. */
int rollout_pipeline_decode(rollout_pipeline *p, const core_traj *t, uint8_t *video);

/* Bytes of one decoded video. */
int64_t rollout_pipeline_video_bytes(const rollout_pipeline *p);

void rollout_pipeline_free(rollout_pipeline *p);

#endif
