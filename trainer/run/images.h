/* trainer/run/images.h — the image side of image to video (Wan 2.2 TI2V first-frame conditioning,
 * model/flow/first_frame.h) for the trainer's jobs (trainer_setup) and `vgrpo eval`: the start-up checks of a recipe
 * whose prompt files give images, and each prompt's condition, encoded once by the trainer (rank 0) or the eval job
 * and sent with the rollout requests (core/wire_rollout.h), so rollout workers need neither the images nor the VAE
 * encoder. */
#ifndef TRAINER_IMAGES_H
#define TRAINER_IMAGES_H

#include <stdint.h>

#include "core/prompts.h"
#include "core/recipe.h"

/* The checks that need no weights, for prompt lists `lists` (n_lists >= 1; the first names the recipe key `key`):
 * every list gives images or none does; with images, the latent has a frame to generate after the image's
 * (rollout.frames >= 5; not on an I2V-A14B model, which generates every latent frame, so 1 frame runs) and
 * model.path is a pipeline that conditions on a first frame (model_index.json
 * "expand_timesteps": true, Wan 2.2 TI2V; or a Wan 2.2 I2V-A14B transformer, in = 2 out + 4 channels). A TI2V
 * model also runs text-only prompt files (text to video), as diffusers' WanPipeline runs it; an I2V-A14B one is
 * refused with them. The model is model.path's files, or where it has no model_index.json yet the preset the job
 * would write there or its folder's name names (budget_model_preset), neither when there is none: a dry run needs no
 * model, and a wrong preset is refused before it is written. -1 naming the key. */
int trainer_images_check(const core_recipe *r, const core_prompts *const *lists, int n_lists, const char *key);

/* Every prompt's condition for lists with images: out[k] [lists[k]->n, C, 1, h, w] (malloc'd) with (h, w) the
 * recipe's latent size and C the transformer's latent (output) channels: media_image_encode with model.path's VAE
 * encoder (checked: z_dim == C and its spatial factor the recipe's). K > 0 (Wan 2.2 I2V-A14B: the transformer takes
 * C + K channels): out[k] [n, K, F, h, w], vae_i2v_condition of the image stretched to the size (the mask and the
 * condition video [image, zeros] encoded; model/vae/wan_vae_i2v.h). Each distinct image file is encoded once over
 * all the lists. Errors name file:line and the image; nothing is left allocated on error. */
int trainer_images_encode(const core_recipe *r, int64_t C, int64_t K, const core_prompts *const *lists, int n_lists,
                          float **out);

#endif
