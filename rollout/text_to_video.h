/* rollout/text_to_video.h — text to video with a WanPipeline folder (what `vgrpo generate` runs), as diffusers'
 * WanPipeline.__call__ does with FlowMatchEulerDiscreteScheduler:
 *
 *   prompt, negative prompt -> tokenizer + umT5 (model/text/t5_prompt.h; max_sequence_length 512, zero-padded)
 *   latents [C, T, h, w] = normals of Philox (seed, slot 0, uid, CORE_STREAM_EVAL_NOISE)   (docs/design.md section 4)
 *   per step i: expert = transformer, or transformer_2 when the pipeline has one and timestep < boundary_ratio * 1000
 *               (flow_expert); v = v_u + g (v_c - v_u) with g = guidance (transformer) or guidance2
 *               (transformer_2); x <- x + v dt (flow_sde_step with eta 0: the Euler ODE step; eta > 0: the SDE step)
 *   VAE: un-normalise, decode, map to U8 (vae_latents_to_u8)
 *
 * T = (frames - 1) / 4 + 1 latent frames, h = height / 8, w = width / 8 (factors of the VAE: 4 and 8 for Wan 2.1,
 * 4 and 16 for Wan 2.2). Checked before any sampling, each with a message naming it: tokenizer.json present, the
 * VAE's z_dim equal to the transformer's in_channels, the encoder's d_model equal to its text_dim, frames = 4k + 1,
 * height and width multiples of the VAE's spatial factor x the transformer's patch size (16 for Wan 2.1, 32 for 2.2).
 * Whether there are two experts is read from the pipeline's model_index.json (a non-null transformer_2 entry and
 * boundary_ratio in (0, 1)). With LoRA adapters (rollout_t2v_args.adapter) every forward adds the adapter
 * (model/dit/wan_lora.h: the rollout's and training's arithmetic).
 * Image to video (rollout_t2v_args.image, a pipeline whose model_index.json says "expand_timesteps": true: Wan 2.2
 * TI2V, diffusers' WanImageToVideoPipeline): the PNG is stretched to the size, encoded alone as the first latent frame
 * and normalised (media/image.h), frame 0 of the latents is held to it, every forward takes per-token timesteps (0 on
 * frame 0's tokens) and the Euler step runs over frames 1 .. T-1 (model/flow/first_frame.h). On a Wan 2.2
 * I2V-A14B pipeline (a transformer of in = 2 out + 4 channels; WanImageToVideoPipeline without expand_timesteps) the
 * image is required: the PNG stretched to the size, [image, zeros] encoded as one video, and cat(latents, mask,
 * condition) is every forward's input, every frame stepped (model/vae/wan_vae_i2v.h).
 * Limits: with two experts and one guidance scale of 1, the unconditional row is still computed at that expert's
 * steps (and ignored); without an image expand_timesteps is not read, which is exact for text to video (every token
 * has the same timestep). */
#ifndef ROLLOUT_TEXT_TO_VIDEO_H
#define ROLLOUT_TEXT_TO_VIDEO_H

#include <stddef.h>
#include <stdint.h>

#define ROLLOUT_T2V_TEXT_LEN 512 /* WanPipeline's max_sequence_length */
#define ROLLOUT_T2V_FPS 16.0     /* Wan's frame rate */

typedef struct {
    const char *pipeline;    /* WanPipeline folder: model_index.json, text_encoder/, tokenizer/, vae/, transformer[_2]/ */
    const char *transformer; /* NULL: pipeline/transformer. Else the (high-noise) expert's folder instead, and its
                                sibling "<transformer>_2", when it is a folder, replaces pipeline/transformer_2
                                (rollout_checkpoint_transformer turns a checkpoint folder into this) */
    const char *adapter;     /* NULL, or LoRA adapters on the experts (model/dit/wan_lora.h): expert 0's at this path
                                (a folder or file in diffusers' or peft's format), expert 1's at "<adapter>_2", each
                                where present (rollout_checkpoint_weights turns a LoRA checkpoint into this) */
    const char *prompt, *negative; /* negative: "" for none (the pipeline's default) */
    const char *image;             /* NULL: text to video; a PNG: image to video (first-frame conditioning) */
    int steps;                     /* sampling steps, 1..1000 */
    int frames, height, width;     /* video size in frames and pixels */
    double guidance, guidance2;    /* CFG scales of transformer and transformer_2 (1: no unconditional pass) */
    double shift;                  /* flow shift of the sigma schedule */
    uint64_t seed;                 /* noise seed */
    double eta;                    /* SDE noise level: 0 (the default) the Euler ODE step; > 0 flow_sde_step with
                                      flow_kind_default() and the noise of step i from Philox (seed, slot i + 1, uid,
                                      CORE_STREAM_EVAL_NOISE), as rollout/engine.c draws it */
    uint64_t uid;                  /* Philox counter word of the noise (< 2^32; 0: today's default) */
    /* Called with done = 0 before the first step and after each step (done = 1..steps); NULL: none. */
    void (*progress)(void *ctx, int done, int total);
    void *progress_ctx;
} rollout_t2v_args;

typedef struct {
    int two_experts;
    double encode_s, sample_s, decode_s; /* wall seconds of the text encoder, the sampling loop, the VAE */
} rollout_t2v_stats;

/* Generates one video into `video` (U8 [frames, height, width, 3], caller-allocated). stats may be NULL.
 * Returns 0, or -1 with an error naming the input at fault (the folder, file or argument: "--frames 8 is not 4k+1",
 * "the VAE's z_dim is 8 but the transformer's in_channels is 16", ...). */
int rollout_text_to_video(const rollout_t2v_args *a, uint8_t *video, rollout_t2v_stats *stats);

/* Resolves a weights folder given for a pipeline's transformer: `dir` itself when it holds config.json (a
 * transformer folder), or dir/transformer when that holds config.json (a checkpoint-N folder written by
 * `vgrpo run`, trainer/checkpoint/checkpoint.h; its transformer_2/, if any, is then the sibling rollout_text_to_video uses).
 * dir/transformer is preferred when both exist. Writes the folder to out. Returns 0, or -1 naming dir when neither
 * dir/transformer/config.json nor dir/config.json exists. */
int rollout_checkpoint_transformer(const char *dir, char *out, size_t cap);

/* A transformer folder given instead of the pipeline's own (--checkpoint) must be the same model: its config.json
 * equal to pipeline/transformer/config.json (wan_config_equal), and its "_2" sibling's, when there is one, to
 * pipeline/transformer_2/config.json. 0 when equal, or when the pipeline has no transformer config to compare with; -1 naming flag, both files and the sizes that differ ("in_channels 36 here, 16
 * there") otherwise, or when a config does not parse. */
int rollout_checkpoint_fits(const char *transformer_dir, const char *pipeline, const char *flag);

/* rollout_checkpoint_transformer (*adapter = 0) or, for a LoRA checkpoint of `vgrpo run` (no config.json, its
 * transformer/ or transformer_2/ holding an adapter wan_lora_inspect accepts: trainer/checkpoint/checkpoint.h), *adapter = 1 and
 * out = "<dir>/transformer", the adapter path of rollout_t2v_args.adapter / `rollout-worker --adapter` (its _2
 * sibling is expert 1's); dir itself an adapter folder or file is taken as expert 0's. -1 naming dir when it holds
 * none of these (or an adapter that is refused, with wan_lora_inspect's reason). */
int rollout_checkpoint_weights(const char *dir, char *out, size_t cap, int *adapter);

#endif
