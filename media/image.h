/* media/image.h — the input images of image to video (Wan 2.2 TI2V): a PNG read through libpng (media/png.h) and
 * stretched to the rollout's size with swscale.
 *
 * diffusers' VideoProcessor.preprocess resizes the image to (height, width) with PIL's Lanczos filter, without
 * cropping (the aspect ratio is not kept). vgrpo does the same with swscale's Lanczos (SWS_LANCZOS, RGB24 in and out,
 * accurate rounding): the same kind of filter, not PIL's bits, so a resized image differs from PIL's by a few levels.
 * An image already at the size is copied unchanged, as PIL does: the parity fixtures use such images. */
#ifndef MEDIA_IMAGE_H
#define MEDIA_IMAGE_H

#include <stdint.h>

#include "model/vae/wan_vae_encode.h"

/* src U8 RGB [h, w, 3] -> dst U8 RGB [H, W, 3] (caller's buffer), stretched with swscale's Lanczos; a copy when the
 * sizes are equal. Where swscale takes no one-pass context for the sizes (a far change of aspect, e.g. 1000 x 1 to
 * 32 x 32), one axis then the other. -1 with core_error on bad sizes or a swscale failure. */
int media_rgb_resize(const uint8_t *src, int h, int w, uint8_t *dst, int H, int W);

/* Reads the PNG at path (any libpng colour type, as media_png_read converts it) and stretches it to [H, W, 3] into
 * out (caller's buffer). Errors name the path (missing, not a PNG, a corrupt file). */
int media_image_load(const char *path, int H, int W, uint8_t *out);

/* The image condition of image to video (diffusers' WanImageToVideoPipeline.prepare_latents): the PNG at path
 * stretched to H x W (media_image_load), mapped to [-1, 1] as VideoProcessor does (vae_video_from_u8), encoded alone
 * as one frame and normalised (vae_encode with normalize): cond F32 [z_dim, 1, H / f, W / f] (f the encoder's
 * spatial factor; H, W multiples of it). Errors name the path. */
int media_image_encode(vae_encoder *enc, const char *path, int H, int W, float *cond);

/* The contact sheet of image to video (`vgrpo eval`'s per-prompt sheets, `vgrpo run`'s sample videos): the titled
 * sheet of media/png.h whose row j starts with images[j], the PNG stretched to h x w as the rollout conditioned on it
 * (media_image_load; a path equal to the row above's is read once), then video j's frames: videos U8 [n, frames, h,
 * w, 3] are shown as [n, frames + 1, h, w, 3] with max_cols + 1 columns (max_cols <= 0: all), so the image is the
 * first column and the last frame the last. images: n paths (none NULL), or NULL for media_png_write_sheet_titled's
 * sheet of the videos alone, byte for byte. An image that cannot be read now (moved or changed since the run or eval
 * read it: the sheet is for people, the conditions are made) leaves its tiles the sheet's background (RGB 24, 24, 24)
 * and the sheet is written: then 1, with core_error naming the sheet, the first such row and why. Returns 0, 1, or -1
 * naming the path. */
int media_image_write_sheet(const char *path, const uint8_t *videos, int n, int frames, int h, int w, int max_cols,
                            const char *title, const char *const *labels, const char *const *images);

#endif
