/* model/vae/wan_vae.h — the decoder of the Wan video VAE (Wan 2.1: z_dim 16; Wan 2.2: z_dim 48, residual up-blocks,
 * patch size 2), forward only: fp32 on the CPU, or bf16 on a device (vae_set_device), one description over the
 * device table (kernels/dev_ops.h, model/vae/wan_vae_layers.c).
 *
 * Reference: diffusers 0.42.1 AutoencoderKLWan (models/autoencoders/autoencoder_kl_wan.py): `decode(z).sample` =
 * post_quant_conv (causal 1x1x1), then WanDecoder3d run one latent frame at a time with a feature cache of the last
 * CACHE_T = 2 input frames of every causal 3x3x3 / 3x1x1 convolution, concatenated in time, unpatchified
 * (patch_size) and clamped to [-1, 1]. T latent frames decode to 1 + 2^k (T - 1) frames, k the number of temporal
 * up-samplers (2 for every released Wan VAE: 1 + 4 (T - 1)). Memory held between latent frames is the feature cache
 * (2 frames per cached convolution, at that layer's resolution) and fixed-size scratch: it does not grow with T.
 *
 * Activations inside are channel-last ([frames, H, W, C] per sample) so that norms run over contiguous channels and
 * every convolution is im2col + one GEMM (on the CPU k_cpu_gemm, OpenMP; on a device its bf16 GEMM) with the
 * weights reordered to [cout, kt, kh, kw, cin] at load time.
 *
 * Loading: a diffusers `vae/` folder (config.json + diffusion_pytorch_model.safetensors, or shards with an index;
 * F32, BF16 or F16 on disk). Tensors `post_quant_conv.*` and `decoder.*` must be exactly the set the config implies
 * (a missing, extra or mis-shaped one is an error naming it); `encoder.*` and `quant_conv.*` are not needed and are
 * skipped; any other tensor is an error. Unknown config keys are ignored (as diffusers does); keys starting with
 * '_' too. The encoder (AutoencoderKLWan.encode) is model/vae/wan_vae_encode.h. */
#ifndef MODEL_WAN_VAE_H
#define MODEL_WAN_VAE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dev_ops.h"

#define VAE_MAX_LEVELS 8  /* entries of dim_mult */
#define VAE_MAX_Z 256     /* z_dim */

/* AutoencoderKLWan config.json (decoder-relevant fields; diffusers' __init__ defaults when absent). */
typedef struct {
    int base_dim;         /* 96 */
    int decoder_base_dim; /* null -> base_dim */
    int z_dim;            /* 16 */
    int n_mult;           /* entries of dim_mult */
    int dim_mult[VAE_MAX_LEVELS];            /* [1, 2, 4, 4] */
    int num_res_blocks;                      /* 2 */
    int temperal_downsample[VAE_MAX_LEVELS]; /* n_mult - 1 entries, [False, True, True]; the decoder reverses it */
    int is_residual;                         /* False (Wan 2.2: True) */
    int in_channels, out_channels;           /* 3, 3 (Wan 2.2: 12, 12) */
    int patch_size;                          /* null -> 1 (Wan 2.2: 2) */
    int scale_factor_temporal;               /* 4 */
    int scale_factor_spatial;                /* 8 (Wan 2.2: 16) */
    float latents_mean[VAE_MAX_Z], latents_std[VAE_MAX_Z]; /* z_dim entries each (defaults: Wan 2.1's) */
    int n_attn_scales; /* entries of attn_scales ([]): the encoder's only; the decoder ignores it as diffusers does */
} vae_config;

typedef struct vae_model vae_model;

/* Parses config.json text. Errors name `label` and the key (wrong type, out of range, temperal_downsample length !=
 * len(dim_mult) - 1, latents_mean/std length != z_dim, out_channels not divisible by patch_size^2, a
 * scale_factor_spatial / scale_factor_temporal that disagrees with the decoder's up-samplers). Returns 0 / -1. */
int vae_config_parse(vae_config *c, const char *json_text, const char *label);

/* Loads the decoder from `dir`: a vae folder, or a pipeline folder (model_index.json) whose vae/ is used.
 * Returns the model, or NULL with core_error naming the file, key or tensor. */
vae_model *vae_load(const char *dir);
void vae_free(vae_model *m);
const vae_config *vae_get_config(const vae_model *m);

/* Decoded frame count for T latent frames (1 + 2^k (T - 1)); 0 for T < 1. */
int vae_frames_out(const vae_model *m, int T);
/* Pixels per latent pixel along H and W: 2^(up-samplers) * patch_size (8 for Wan 2.1, 16 for Wan 2.2). */
int vae_spatial_factor(const vae_model *m);
/* Channels of the decoded video: out_channels / patch_size^2 (3). */
int vae_video_channels(const vae_model *m);

/* AutoencoderKLWan.decode(latents).sample: latents F32 [B, z, T, h, w] (z must equal the config's z_dim) ->
 * video F32 [B, C, F, H, W], C = vae_video_channels, F = vae_frames_out(T), H = h * factor, W = w * factor, in
 * [-1, 1]. No un-normalisation. Samples are decoded one after another, each one latent frame at a time. The decode
 * state (feature cache + scratch) is kept in the model for the next call with the same h, w (see
 * vae_state_bytes). Errors: z mismatch (naming z_dim), B, T, h or w < 1, out of memory. Not thread-safe per model. */
int vae_decode(vae_model *m, const float *latents, int B, int z, int T, int h, int w, float *video);

/* Bytes the decode state currently holds (feature cache + scratch buffers; weights excluded). Depends on h, w and
 * the config only, never on T. 0 before the first decode. */
size_t vae_state_bytes(const vae_model *m);
/* Bytes of the feature cache alone (2 frames per cached causal convolution at its resolution). */
size_t vae_cache_bytes(const vae_model *m);
/* The decoder's sizes from its config alone, without weights or a decode (the memory estimate of trainer/budget/budget.h):
 * *params its floats (the tensors vae_load reads: post_quant_conv and decoder.*), *state_bytes what vae_state_bytes
 * reports after a decode of latent h x w (the same planning walk state_begin allocates by, so equal). Errors:
 * vae_load's config refusals (vae_build). */
int vae_decoder_estimate(const vae_config *c, int h, int w, double *params, double *state_bytes);

/* The decode's backend (wan_vae_upload.c). vae_set_device: dev NULL or the CPU table (k_cpu_dev_ops) decodes on the
 * CPU in fp32 (the default; the bits of the CPU decoder); a device table (the CUDA backend, the emulated device)
 * copies the decoder's weights there in bf16 (convolutions padded to multiples of 8, vae_device_weight_bytes) and
 * runs vae_decode / vae_latents_to_u8 there, bf16 activations with fp32 accumulation, latents uploaded and decoded
 * frames downloaded one latent frame at a time (same results as the CPU within bf16 rounding). Frees the decode
 * state and any previous device copy. Errors: a table without the VAE entries, out of device memory. The encoder (wan_vae_encode.h) stays on the CPU. */
int vae_set_device(vae_model *m, const k_dev_ops *dev);
/* Frees the decode state (feature caches, scratch; the next decode allocates it again): a device's decode is a phase
 * of its own, between rollouts that need the memory for the DiT. */
void vae_release_state(vae_model *m);
const char *vae_device_name(const vae_model *m);
size_t vae_device_weight_bytes(const vae_model *m);
/* The decoder on a device from its config alone: *weight_bytes (the bf16 padded copies vae_set_device allocates)
 * and *state_bytes (vae_state_bytes after a device decode of latent h x w: caches, buffers, im2col rows and the
 * attention's scores, all device memory). Errors as vae_decoder_estimate. */
int vae_decoder_estimate_device(const vae_config *c, int h, int w, double *weight_bytes, double *state_bytes);

/* The rollout's path to pixels: un-normalise as WanPipeline does (latents / (1 / latents_std) + latents_mean, per
 * channel), decode, then map each value x to uint8 as diffusers' VideoProcessor does: v = clamp(x / 2 + 0.5, 0, 1)
 * * 255 in fp32, rounded half to even (numpy .round()). latents F32 [B, z, T, h, w] (normalised, as the DiT
 * produces them; not modified) -> out U8 [B, F, H, W, 3] (RGB, channel-last). Errors as vae_decode, a video
 * channel count other than 3, a non-finite latent (naming the sample and element) and a non-finite decoded value
 * (naming the sample, frame, pixel and channel): such a video is refused, never clamped into frames. */
int vae_latents_to_u8(vae_model *m, const float *latents, int B, int z, int T, int h, int w, uint8_t *out);

#endif
