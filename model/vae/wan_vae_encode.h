/* model/vae/wan_vae_encode.h — the encoder of the Wan video VAE (Wan 2.1: z_dim 16; Wan 2.2: z_dim 48, residual
 * down-blocks with the AvgDown3D shortcut, patch size 2), fp32 on the CPU, forward only. The decoder is wan_vae.h.
 *
 * Reference: diffusers 0.42.1 AutoencoderKLWan (models/autoencoders/autoencoder_kl_wan.py): `encode(video)
 * .latent_dist.mode()` = the mean half of quant_conv(WanEncoder3d(patchify(video))), the encoder run on the first
 * frame alone, then on chunks of 4 frames, with a feature cache of the last CACHE_T = 2 input frames of every causal
 * 3x3x3 convolution and, per 'downsample3d', the last frame after its spatial conv (the first chunk skips the strided
 * time_conv; later chunks run it over [that frame, chunk]). patchify puts pixel (y, x) of channel c into channel
 * c p^2 + (x % p) p + (y % p) at (y / p, x / p) (diffusers' permute(0, 1, 6, 4, 2, 3, 5)). WanImageToVideoPipeline
 * then normalises: (z - latents_mean) * (1 / latents_std), per channel.
 *
 * Frames: F = 1 + 4 k (what the pipelines pass; diffusers silently drops the frames of an incomplete last chunk, we
 * refuse them) -> T = 1 + k 4 / 2^d latent frames, d the number of temporal down-samplers (2 for every released Wan
 * VAE: T = 1 + (F - 1) / 4; d > 2 is refused, diffusers cannot run it either). H and W must be multiples of the
 * spatial factor 2^(len(dim_mult) - 1) patch_size (8 for Wan 2.1, 16 for Wan 2.2): h = H / factor.
 * Memory held between chunks is the feature cache and fixed-size scratch (for 4 frames at H x W): it does not grow
 * with F. Not supported (refused when loading): a non-empty attn_scales (no released Wan VAE has one).
 *
 * Loading: a diffusers `vae/` folder or a pipeline folder (its vae/), as vae_load. Tensors `encoder.*` and
 * `quant_conv.*` must be exactly the set the config implies (missing, extra or mis-shaped: an error naming it; a
 * folder with no encoder.* tensor at all, like the tiny preset's decoder-only VAE, says so); `decoder.*` and
 * `post_quant_conv.*` are skipped. */
#ifndef MODEL_WAN_VAE_ENCODE_H
#define MODEL_WAN_VAE_ENCODE_H

#include <stddef.h>
#include <stdint.h>

#include "model/vae/wan_vae.h"

typedef struct vae_encoder vae_encoder;

/* Loads the encoder from `dir` (a vae folder, or a pipeline folder whose vae/ is used). Returns the encoder, or NULL
 * with core_error naming the file, key or tensor. */
vae_encoder *vae_encoder_load(const char *dir);
void vae_encoder_free(vae_encoder *e);
const vae_config *vae_encoder_get_config(const vae_encoder *e);

/* Latent frames for F video frames: 1 + (F - 1) / 4 * (4 / 2^d); 0 when F is not 1 + 4 k (k >= 0). */
int vae_encoder_frames_out(const vae_encoder *e, int F);
/* Pixels per latent pixel along H and W: 2^(down-samplers) * patch_size (8 for Wan 2.1, 16 for Wan 2.2). */
int vae_encoder_spatial_factor(const vae_encoder *e);
/* Channels of the video: in_channels / patch_size^2 (3). */
int vae_encoder_video_channels(const vae_encoder *e);

/* video F32 [B, C, F, H, W] (C = vae_encoder_video_channels, values as diffusers takes them: [-1, 1]) -> latents F32
 * [B, z_dim, T, H / factor, W / factor], T = vae_encoder_frames_out(F): the posterior mode (the mean of the diagonal
 * Gaussian; AutoencoderKLWan.encode(video).latent_dist.mode()), or with `normalize` the latents WanImageToVideoPipeline
 * feeds the transformer: (mode - latents_mean) * (1 / latents_std). Samples are encoded one after another. The state
 * (feature cache + scratch) is kept for the next call with the same H, W. Errors: C != video channels, F not 1 + 4 k,
 * H or W not a positive multiple of the factor, B < 1, out of memory. Not thread-safe per encoder. */
int vae_encode(vae_encoder *e, const float *video, int B, int C, int F, int H, int W, float *latents, int normalize);

/* RGB uint8 video [B, F, H, W, 3] (channel-last, as decoded frames or PNGs come) -> F32 [B, 3, F, H, W] as
 * diffusers' VideoProcessor.preprocess_video maps it: x = 2 (u8 / 255) - 1 in fp32. */
void vae_video_from_u8(const uint8_t *u8, int B, int F, int H, int W, float *video);

/* Bytes the encode state holds (feature cache + scratch; weights excluded); depends on H, W and the config, never
 * on F. 0 before the first encode. */
size_t vae_encoder_state_bytes(const vae_encoder *e);
/* Bytes of the feature cache alone (2 frames per cached causal convolution, 1 per temporal down-sampler). */
size_t vae_encoder_cache_bytes(const vae_encoder *e);

/* What encoding one F-frame video at H x W takes, from config c alone (nothing loaded or allocated that lasts; the
 * start-up estimate, trainer/budget/budget.h): *params the encoder's floats (encoder.* and quant_conv.*, what
 * vae_encoder_load reads), *state_bytes what vae_encoder_state_bytes reports after that vae_encode (feature cache +
 * scratch; the same layout, so equal), *flop 2 x the multiply-adds of its convolutions and of the mid-block
 * attention's two products, chunk by chunk as vae_encode runs them (norms and activations not counted). Errors:
 * vae_encoder_load's config refusals, F not 1 + 4k, H or W not a positive multiple of the spatial factor. */
int vae_encoder_estimate(const vae_config *c, int F, int H, int W, double *params, double *state_bytes, double *flop);

#endif
