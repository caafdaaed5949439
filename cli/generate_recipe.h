/* cli/generate_recipe.h — `vgrpo generate --recipe FILE`: one video sampled as the eval of that recipe samples it
 * (rollout/pipeline.h and rollout/engine.h, the code the eval's rollout workers run): model.path's pipeline with
 * model.text_encoder (umT5 at rollout.text_len, or word embeddings), model.decoder (VAE or latent_rgb), the recipe's
 * size, steps, shift, guidance (and guidance_scale_2), data.seed as the Philox key, noise stream 3 (eval) and noise level
 * data.eval_eta (0: the ODE sampler; > 0: the SDE step of rollout.sde_type's default kind, as the eval's request),
 * the negative prompt of the text encoder (umT5's empty prompt, zeros for word embeddings). With the eval's uid (prompt
 * i, sample k: i * data.eval_samples_per_prompt + k) and its weights, the video is the eval's byte for byte (its
 * xxh64 is eval.json's video_xxh64). cmd_generate.c applies its flags to the recipe first. */
#ifndef CLI_GENERATE_RECIPE_H
#define CLI_GENERATE_RECIPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/recipe.h"
#include "rollout/text_to_video.h"

typedef struct {
    const core_recipe *r;          /* the recipe, generate's flags applied */
    const char *prompt;            /* the prompt (at most data.max_prompt_bytes; word_embed: rollout.text_len words) */
    const char *negative;          /* NULL or "": the text encoder's negative (as the eval); else this prompt's
                                      embedding in the unconditional rows */
    const char *image;             /* NULL, or a PNG: its condition as the eval encodes a prompt file's image
                                      (trainer/run/images.h) */
    const char *transformer;       /* NULL: model.path/transformer[_2]; else a transformer folder (a checkpoint's) */
    const char *adapter;           /* NULL, or a LoRA adapter path on model.path's experts (a LoRA checkpoint's) */
    uint64_t uid;                  /* the eval sample whose noise is drawn (< 2^32) */
    void (*progress)(void *ctx, int done, int total); /* called before step 1 (done 0) and after each; NULL: none */
    void *progress_ctx;
} gen_recipe_args;

typedef struct {
    uint8_t *video;                /* U8 [frames, height, width, 3], malloc'd (the decoder's size) */
    int frames, height, width;
    int experts;                   /* 1 or 2 */
    double encode_s, sample_s, decode_s; /* wall seconds: text (and image) encoding, sampling, decoding */
} gen_recipe_video;

/* Which of generate's flags were given: those override the recipe's keys. */
typedef struct {
    int pipeline, steps, frames, height, width, guidance, guidance2, shift, eta, seed;
} gen_recipe_given;

/* The given flags of g onto r: --pipeline model.path, --steps rollout.num_steps, --frames / --height / --width
 * rollout.frames / height / width, --guidance rollout.guidance_scale (and guidance_scale_2 unless --guidance-2),
 * --guidance-2 rollout.guidance_scale_2, --shift rollout.shift, --eta data.eval_eta, --seed data.seed; then
 * core_recipe_check again (the sizes against the VAE factor, ...) and r's values back into g (pipeline, steps, size,
 * guidance, shift, eta, seed). -1 naming the key (core_recipe_check's message) or out of memory. */
int gen_recipe_apply(core_recipe *r, const gen_recipe_given *given, rollout_t2v_args *g);

/* Loads the pipeline, samples and decodes one video into out (free out->video). -1 with an error naming the key,
 * file or flag at fault (rollout_pipeline_load's, the prompt's, the image's). */
int gen_recipe_generate(const gen_recipe_args *a, gen_recipe_video *out);

/* The uid of the eval's first sample of `prompt`: its index in data.eval_prompt_file times
 * data.eval_samples_per_prompt, and its image (image to video prompt files; "" when none) into image[cap]. 0 with
 * *found 0 when the file does not hold it; -1 when the file cannot be read. */
int gen_recipe_eval_uid(const core_recipe *r, const char *prompt, uint64_t *uid, int *found, char *image, size_t cap);

#endif
