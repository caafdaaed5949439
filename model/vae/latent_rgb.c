/* model/vae/latent_rgb.c — the tiny preset's fixed latent-to-RGB map (see model/vae/latent_rgb.h). */
#include "kernels/kernels.h"
#include "model/vae/latent_rgb.h"

#include <math.h>
#include <string.h>

#include "core/error.h"
#include "core/safetensors.h"

int wan_latent_rgb_default(wan_latent_rgb *m, int channels) {
    if (channels < 1 || channels > WAN_LATENT_RGB_MAX_C)
        return core_error("latent_rgb: %d channels (1..%d supported)", channels, WAN_LATENT_RGB_MAX_C);
    memset(m, 0, sizeof *m);
    m->channels = channels;
    static const int rows[3] = {1, 2, 4};
    const float s = WAN_LATENT_RGB_GAIN / sqrtf((float)channels);
    for (int c = 0; c < 3; c++)
        for (int k = 0; k < channels; k++) m->weight[c][k] = (__builtin_popcount((unsigned)(rows[c] & k)) & 1) ? -s : s;
    return 0;
}

int wan_latent_rgb_save(const wan_latent_rgb *m, const char *path) {
    float w[3 * WAN_LATENT_RGB_MAX_C];
    for (int c = 0; c < 3; c++) memcpy(w + c * m->channels, m->weight[c], sizeof(float) * (size_t)m->channels);
    st_writer *wr = st_writer_new();
    if (!wr) return -1;
    int64_t ws[2] = {3, m->channels}, bs[1] = {3};
    int rc = st_writer_add(wr, "weight", CORE_F32, 2, ws, w);
    if (!rc) rc = st_writer_add(wr, "bias", CORE_F32, 1, bs, m->bias);
    if (!rc) rc = st_writer_set_metadata(wr, "format", "vgrpo.latent_rgb");
    if (!rc) rc = st_writer_set_metadata(wr, "spatial_factor", "8");
    if (!rc) rc = st_writer_write(wr, path);
    st_writer_free(wr);
    return rc;
}

int wan_latent_rgb_load(wan_latent_rgb *m, const char *path, int channels) {
    if (channels < 1 || channels > WAN_LATENT_RGB_MAX_C)
        return core_error("%s: %d latent channels (1..%d supported)", path, channels, WAN_LATENT_RGB_MAX_C);
    st_file *f = st_open(path);
    if (!f) return -1;
    float w[3 * WAN_LATENT_RGB_MAX_C];
    memset(m, 0, sizeof *m);
    m->channels = channels;
    int rc = st_read_f32(f, "weight", w, 3 * (int64_t)channels);
    if (!rc) {
        int i = st_find(f, "weight");
        const st_info *in = st_info_at(f, i);
        if (in->ndim != 2 || in->shape[0] != 3) rc = core_error("%s: tensor weight must have shape [3, %d]", path, channels);
    }
    if (!rc) rc = st_read_f32(f, "bias", m->bias, 3);
    st_close(f);
    if (rc) return -1;
    for (int c = 0; c < 3; c++) memcpy(m->weight[c], w + c * channels, sizeof(float) * (size_t)channels);
    return 0; /* a non-finite weight or bias was refused by st_read_f32, named */
}

int wan_latent_rgb_decode(const wan_latent_rgb *m, const float *z, int64_t F, int64_t H, int64_t W, uint8_t *video) {
    const int C = m->channels, s = WAN_LATENT_RGB_FACTOR;
    const int64_t plane = F * H * W, OW = W * s;
    const int64_t j = core_f32_first_nonfinite(z, (size_t)(C * plane)); /* refused, not decoded into black frames */
    if (j >= 0)
        return core_error("latent_rgb: latent element %lld (channel %lld, frame %lld) is %g: the denoised latents are "
                          "not finite (the transformer's output)", (long long)j, (long long)(j / plane),
                          (long long)(j % plane / (H * W)), (double)z[j]);
    int nan_px = 0; /* finite latents and weights can still overflow to inf - inf */
#pragma omp parallel for collapse(2) schedule(static) reduction(| : nan_px) if ((size_t)plane * 3 >= K_PAR_MIN_ELEMS)
    for (int64_t f = 0; f < F; f++)
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) {
                const int64_t p = (f * H + y) * W + x;
                uint8_t rgb[3];
                for (int c = 0; c < 3; c++) {
                    float acc = 0.0f;
                    for (int k = 0; k < C; k++) acc += m->weight[c][k] * z[(int64_t)k * plane + p];
                    float v = 127.5f * (acc + m->bias[c] + 1.0f);
                    nan_px |= isnan(v);
                    v = v >= 0.0f ? (v > 255.0f ? 255.0f : v) : 0.0f; /* NaN -> 0: defined, and refused below */
                    rgb[c] = (uint8_t)floorf(v + 0.5f);
                }
                for (int dy = 0; dy < s; dy++) {
                    uint8_t *row = video + ((f * H * s + y * s + dy) * OW + x * s) * 3;
                    for (int dx = 0; dx < s; dx++) memcpy(row + dx * 3, rgb, 3);
                }
            }
    if (nan_px) return core_error("latent_rgb: a pixel's value is NaN (finite latents overflowed in the map)");
    return 0;
}
