/* model/vae/wan_vae_i2v.h — the image conditioning of Wan 2.2 I2V-A14B (diffusers 0.42.1 WanImageToVideoPipeline
 * without expand_timesteps, pipelines/wan/pipeline_wan_i2v.py prepare_latents and the denoising loop):
 *   video_condition = cat([image, zeros x (frames - 1)], dim=frames)           [3, frames, H, W] in [-1, 1]
 *   c    = (vae.encode(video_condition).mode() - latents_mean) * (1 / latents_std)   [z, T, h, w]
 *   mask = mask_lat_size: 1 on pixel frame 0, 0 on the others; frame 0 repeated vae_scale_factor_temporal (4)
 *          times, the 4T frames viewed as [T, 4] and transposed to [4, T, h, w]: 1 on latent frame 0 in every one of
 *          its 4 channels, 0 elsewhere
 *   condition = cat(mask, c)                                                     [4 + z, T, h, w]
 *   each step: model input = cat(latents, condition) (z + 4 + z = 36 channels for the A14B), the timestep a scalar,
 *   the output z channels; the scheduler steps every frame (nothing is held, unlike TI2V's first frame).
 * Wan 2.1 I2V's CLIP image embeddings (image_dim) are not part of it (refused by model/dit's config reader). */
#ifndef MODEL_VAE_WAN_VAE_I2V_H
#define MODEL_VAE_WAN_VAE_I2V_H

#include <stdint.h>

#include "model/vae/wan_vae_encode.h" /* the condition is VAE-encoded: this lives in model/vae, below rollout/ and trainer/ */

#define VAE_I2V_MASK_CHANNELS 4 /* vae_scale_factor_temporal of the Wan VAE */

/* mask [4, T, h, w] as diffusers builds it for `frames` pixel frames (frames = 4 (T - 1) + 1). Errors (-1): frames
 * not 4k+1 or T not (frames - 1) / 4 + 1. */
int vae_i2v_mask(int frames, int T, int h, int w, float *mask);

/* condition [4 + z, T, h, w] for image [3, H, W] in [-1, 1] (vae_video_from_u8 of the PNG): the mask, then the
 * normalised latents of [image, zeros x (frames - 1)] encoded by enc (one video, vae_encode with normalize). T, h, w
 * are enc's output sizes for (frames, H, W). Errors: those of vae_encode, out of memory. */
int vae_i2v_condition(vae_encoder *enc, const float *image, int frames, int H, int W, float *cond);

/* The model input of one sample: in [C + cc, n] = cat(x [C, n], cond [cc, n]) (n = F h w). */
void vae_i2v_input(int64_t C, int64_t cc, int64_t n, const float *x, const float *cond, float *in);

#endif
