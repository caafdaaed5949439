/* model/vae/wan_vae_i2v.c — Wan 2.2 I2V-A14B's condition and model input (see model/vae/wan_vae_i2v.h). */
#include "model/vae/wan_vae_i2v.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int vae_i2v_mask(int frames, int T, int h, int w, float *mask) {
    const int k = VAE_I2V_MASK_CHANNELS;
    if (frames < 1 || (frames - 1) % k || T != (frames - 1) / k + 1)
        return core_error("i2v mask: %d frames and %d latent frames (frames must be %dk+1, latent frames (frames - 1) "
                          "/ %d + 1)", frames, T, k, k);
    /* mask_lat_size over pixel frames: 1 on frame 0; frame 0 repeated k times, then frames 1 .. frames-1: k T in all */
    const int n = k + frames - 1;
    uint8_t *seq = malloc((size_t)n);
    if (!seq) return core_error("i2v mask: out of memory");
    for (int i = 0; i < n; i++) seq[i] = i < k; /* the k copies of frame 0 are 1, the other frames 0 */
    /* .view(B, T, k, h, w).transpose(1, 2): mask[c][t] = seq[t k + c] */
    const int64_t hw = (int64_t)h * w;
    for (int c = 0; c < k; c++)
        for (int t = 0; t < T; t++) {
            float *dst = mask + ((int64_t)c * T + t) * hw;
            const float v = seq[t * k + c] ? 1.0f : 0.0f;
            for (int64_t j = 0; j < hw; j++) dst[j] = v;
        }
    free(seq);
    return 0;
}

int vae_i2v_condition(vae_encoder *enc, const float *image, int frames, int H, int W, float *cond) {
    const int C = vae_encoder_video_channels(enc), T = vae_encoder_frames_out(enc, frames);
    const int s = vae_encoder_spatial_factor(enc), h = H / s, w = W / s;
    if (C != 3) return core_error("i2v condition: the VAE encodes %d video channels, an image has 3", C);
    const int64_t hw = (int64_t)H * W, fhw = (int64_t)frames * hw;
    float *video = calloc((size_t)(3 * fhw), sizeof(float)); /* frames 1 .. frames-1 stay zero */
    if (!video) return core_error("i2v condition: out of memory for the condition video");
    for (int c = 0; c < 3; c++) memcpy(video + c * fhw, image + c * hw, sizeof(float) * (size_t)hw);
    int rc = vae_i2v_mask(frames, T, h, w, cond);
    if (!rc) rc = vae_encode(enc, video, 1, 3, frames, H, W, cond + (int64_t)VAE_I2V_MASK_CHANNELS * T * h * w, 1);
    free(video);
    return rc;
}

void vae_i2v_input(int64_t C, int64_t cc, int64_t n, const float *x, const float *cond, float *in) {
    memcpy(in, x, sizeof(float) * (size_t)(C * n));
    memcpy(in + C * n, cond, sizeof(float) * (size_t)(cc * n));
}
