/* model/vae/tiny_vae.h — the tiny preset's VAE: a small random Wan 2.1-style decoder written in the layout diffusers
 * uses, so that `vgrpo init-model --preset tiny` gives a complete WanPipeline folder (tests, demo). Not trained.
 * The tiny tokenizer and text encoder are model/text/tiny_text.h.
 *
 * Randomness: Philox (core/philox.h) with key = seed, counter (element / 4, slot, uid 0, CORE_STREAM_MODEL_INIT),
 * slot = TINY_SLOT_TEXT + tensor index (text encoder) or TINY_SLOT_VAE + tensor index (VAE), so neither overlaps
 * the transformer's slots (0 .. a few hundred, wan_params_init_random). */
#ifndef MODEL_VAE_TINY_VAE_H
#define MODEL_VAE_TINY_VAE_H

#include <stdint.h>

#define TINY_SLOT_VAE 200000u
#define TINY_SLOT_VAE_ENC 210000u

/* Writes dir/config.json (diffusers AutoencoderKLWan, Wan 2.1 style: z_dim, base_dim 4, dim_mult [1, 2, 2, 2],
 * one res block, temporal up-sampling in the last two up-samplers: 8x spatial, 4x temporal; latents_mean 0,
 * latents_std 1) and dir/diffusion_pytorch_model.safetensors with the decoder's tensors (F32; the encoder and
 * quant_conv are not written — the text-to-video preset only decodes; diffusers loads the folder, warning that it
 * initialised those; vae_tiny_write_with_encoder below writes them).
 * Initialisation (see tiny_vae.c): near-linear skip paths, a per-frame tint from the mid-block attention and a
 * wide colour gain, so that different latents decode to clearly different colours, also on average over a frame.
 * Returns 0, or -1 naming the path. */
int vae_tiny_write(const char *dir, int z_dim, uint64_t seed);

/* vae_tiny_write plus the encoder's tensors (encoder.*, quant_conv.*: the `tiny-ti2v` preset, whose image is encoded
 * as the first latent frame), initialised the same way (quant_conv the identity) on Philox slots TINY_SLOT_VAE_ENC +
 * tensor index. The decoder's tensors are those vae_tiny_write writes, bit for bit. */
int vae_tiny_write_with_encoder(const char *dir, int z_dim, uint64_t seed);

#endif
