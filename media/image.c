/* media/image.c — input images of image to video: PNG in, stretched with swscale's Lanczos (see media/image.h). */
#include "media/image.h"

#include <libswscale/swscale.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/tensor.h"
#include "media/png.h"

/* One swscale pass: 0, -1 with core_error, or 1 (no error set) when swscale makes no context for these sizes. */
static int resize_pass(const uint8_t *src, int h, int w, uint8_t *dst, int H, int W) {
    struct SwsContext *s = sws_getContext(w, h, AV_PIX_FMT_RGB24, W, H, AV_PIX_FMT_RGB24,
                                          SWS_LANCZOS | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, NULL, NULL, NULL);
    if (!s) return 1;
    const uint8_t *in[4] = {src, NULL, NULL, NULL};
    uint8_t *out[4] = {dst, NULL, NULL, NULL};
    const int in_stride[4] = {3 * w, 0, 0, 0}, out_stride[4] = {3 * W, 0, 0, 0};
    const int got = sws_scale(s, in, in_stride, 0, h, out, out_stride);
    sws_freeContext(s);
    return got == H ? 0 : core_error("image resize: swscale wrote %d of %d rows", got, H);
}

int media_rgb_resize(const uint8_t *src, int h, int w, uint8_t *dst, int H, int W) {
    if (h < 1 || w < 1 || H < 1 || W < 1) return core_error("image resize: bad size %dx%d -> %dx%d", w, h, W, H);
    if (h == H && w == W) {
        memcpy(dst, src, (size_t)H * W * 3);
        return 0;
    }
    int rc = resize_pass(src, h, w, dst, H, W);
    if (rc != 1) return rc;
    /* swscale makes no context for some far changes of aspect in one pass (1000 x 1 to 32 x 32): one axis, then the
     * other, through the smaller of the two intermediate images */
    const int x_first = (int64_t)h * W <= (int64_t)H * w, mh = x_first ? h : H, mw = x_first ? W : w;
    uint8_t *mid = malloc((size_t)mh * mw * 3);
    if (!mid) return core_error("image resize: out of memory for a %dx%d intermediate image", mw, mh);
    rc = resize_pass(src, h, w, mid, mh, mw);
    if (!rc) rc = resize_pass(mid, mh, mw, dst, H, W);
    free(mid);
    if (rc == 1)
        return core_error("image resize: swscale cannot stretch %d x %d pixels to %d x %d, in one pass or one axis at a "
                          "time", w, h, W, H);
    return rc;
}

int media_image_load(const char *path, int H, int W, uint8_t *out) {
    core_tensor t;
    if (media_png_read(path, &t)) return -1;
    const int rc = media_rgb_resize(t.data, (int)t.shape[0], (int)t.shape[1], out, H, W);
    core_tensor_free(&t);
    return rc ? core_error_push("%s: ", path) : 0;
}

int media_image_encode(vae_encoder *enc, const char *path, int H, int W, float *cond) {
    uint8_t *rgb = malloc((size_t)H * W * 3);
    float *video = malloc(sizeof(float) * 3 * (size_t)H * W);
    int rc = -1;
    if (!rgb || !video) core_error("%s: out of memory for a %dx%d image", path, W, H);
    else if (!media_image_load(path, H, W, rgb)) {
        vae_video_from_u8(rgb, 1, 1, H, W, video);
        rc = vae_encode(enc, video, 1, 3, 1, H, W, cond, 1) ? core_error_push("%s: ", path) : 0;
    }
    free(rgb), free(video);
    return rc;
}

int media_image_write_sheet(const char *path, const uint8_t *videos, int n, int frames, int h, int w, int max_cols,
                            const char *title, const char *const *labels, const char *const *images) {
    if (!images) return media_png_write_sheet_titled(path, videos, n, frames, h, w, max_cols, title, labels);
    if (n < 1 || frames < 1 || h < 1 || w < 1)
        return core_error("contact sheet: bad video shape [%d, %d, %d, %d, 3]", n, frames, h, w);
    const size_t fb = (size_t)h * w * 3;
    uint8_t *v = malloc(fb * (size_t)(frames + 1) * (size_t)n); /* [n, frames + 1, h, w, 3] */
    if (!v) return core_error("contact sheet: out of memory");
    char unread[1024] = ""; /* the first image that could not be read, and why */
    for (int j = 0; j < n; j++) { /* row j: its image, then video j's frames */
        uint8_t *row = v + (size_t)j * (frames + 1) * fb;
        if (j && !strcmp(images[j], images[j - 1])) memcpy(row, row - (size_t)(frames + 1) * fb, fb);
        else if (media_image_load(images[j], h, w, row)) { /* gone or changed since the conditions were made */
            memset(row, 24, fb); /* the sheet's background */
            if (!unread[0]) snprintf(unread, sizeof unread, "row %d: %s", j, core_last_error());
        }
        memcpy(row + fb, videos + (size_t)j * frames * fb, fb * (size_t)frames);
    }
    const int rc = media_png_write_sheet_titled(path, v, n, frames + 1, h, w, max_cols > 0 ? max_cols + 1 : 0, title,
                                                labels);
    free(v);
    if (rc || !unread[0]) return rc;
    core_error("contact sheet %s: %s: its image tile is left blank", path, unread);
    return 1;
}
