/* model/vae/latent_rgb.h — a fixed linear latent-to-RGB map for the tiny preset, standing in for the VAE decoder until it
 * exists, so that rewards on pixels work end to end.
 *
 * For a latent z [C, F, H, W] (fp32) the video is U8 RGB [F, s*H, s*W, 3], s = WAN_LATENT_RGB_FACTOR = 8 (the Wan
 * 2.1 VAE's spatial factor): every latent pixel becomes an s x s block of one colour, and each latent frame one
 * video frame (no temporal upsampling: the decoded clip has F frames, the latent frame count). Per latent pixel:
 *   y_c  = sum_k weight[c][k] * z[k]  (fp32, k ascending)  for c = R, G, B
 *   rgb_c = round(clamp(127.5 * (y_c + bias[c] + 1), 0, 255))      (round half up; fp32)
 * So y in [-1, 1] spans the 8-bit range and y = 0 is mid grey.
 *
 * The map init-model writes (wan_latent_rgb_default): rows are Sylvester-Hadamard rows 1, 2 and 4 scaled to norm
 * WAN_LATENT_RGB_GAIN: weight[c][k] = GAIN / sqrt(C) * (-1)^popcount(r_c & k), r = (1, 2, 4); bias 0. For C a
 * power of two (16 for the tiny preset) the rows are orthogonal, so for unit-variance latents each channel has std
 * GAIN (0.6: about 76 levels around mid grey, clamped in ~10% of pixels) and the three channels are independent:
 * random latents give every hue and lightness class, which the colour scorer needs to see a signal.
 *
 * File: <pipeline>/latent_rgb.safetensors with tensors "weight" F32 [3, C] and "bias" F32 [3], metadata
 * format "vgrpo.latent_rgb", spatial_factor "8". */
#ifndef MODEL_LATENT_RGB_H
#define MODEL_LATENT_RGB_H

#include <stdint.h>

#define WAN_LATENT_RGB_FACTOR 8
#define WAN_LATENT_RGB_GAIN 0.6f
#define WAN_LATENT_RGB_MAX_C 64

typedef struct {
    int channels;                          /* C */
    float weight[3][WAN_LATENT_RGB_MAX_C]; /* [3, C] */
    float bias[3];
} wan_latent_rgb;

/* The default map for C channels (1..WAN_LATENT_RGB_MAX_C). -1 on a bad C. */
int wan_latent_rgb_default(wan_latent_rgb *m, int channels);
/* Writes m to path (atomic rename). -1 naming the path. */
int wan_latent_rgb_save(const wan_latent_rgb *m, const char *path);
/* Reads path; the weight must be [3, channels] (F32/BF16/F16) and bias [3]. -1 naming the path and tensor. */
int wan_latent_rgb_load(wan_latent_rgb *m, const char *path, int channels);

/* Decodes z [C, F, H, W] (C == m->channels) into video [F, 8H, 8W, 3] U8 as above (sizes trusted). Returns 0, or -1
 * when a latent is NaN or infinite (naming its element, channel and frame) or a pixel's value overflowed to NaN:
 * such a video is refused, never clamped into frames to be scored. */
int wan_latent_rgb_decode(const wan_latent_rgb *m, const float *z, int64_t F, int64_t H, int64_t W, uint8_t *video);

#endif
