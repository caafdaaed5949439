/* model/clip/clip_image.h — CLIP image preprocessing: u8 RGB frames to the normalised fp32 pixels a CLIP vision
 * tower takes (resize of the shorter side with antialiased bicubic, centre crop, rescale, normalise).
 *
 * Four references, chosen by clip_image_config.variant; each is matched exactly on the resized u8 image and to
 * the last float32 rounding after it (tests/test_clip_image.c; fixtures from scripts/fixtures_clip_image.py):
 *   CLIP_IMAGE_HF          transformers 5.x CLIPImageProcessor, the class AutoImageProcessor loads by default for a
 *                          CLIP folder (the torchvision backend): torchvision's resize of a u8 tensor, i.e. torch's
 *                          uint8 antialiased bicubic (separable, width first, weights rounded to int16 at a
 *                          precision chosen per axis, u8 between the passes); crop offset int((H - crop) / 2);
 *                          (x - mean * 255) / (std * 255) in float32 (its fused rescale + normalise).
 *   CLIP_IMAGE_HF_PIL      transformers' CLIPImageProcessorPil (backend="pil"; the "slow" processor of 4.x): PIL's
 *                          resize (the same filter, weights rounded to 22 bits, u8 between the passes, Pillow 13's
 *                          pass order: height first when in_h - out_h > max(0, 2 * (in_w - out_w))); crop offset
 *                          (H - crop) // 2; float32(x * (1/255 in double)), then (x - mean) / std in float32.
 *   CLIP_IMAGE_OPEN_CLIP   open_clip's preprocess (HPSv2): torchvision Resize(BICUBIC) on a PIL image (PIL's
 *                          resize), CenterCrop with the offset int(round((H - crop) / 2)) (half to even: one pixel
 *                          further than transformers when H - crop is 3 mod 4), ToTensor (x / 255 in float32),
 *                          Normalize ((x - mean) / std in float32).
 *   CLIP_IMAGE_HPSV2       HPSv2's preprocess_val (its vendored open_clip 2.x image_transform with
 *                          resize_longest_max=True): ResizeMaxSize to crop_h (= crop_w) on a PIL image, i.e. the
 *                          longer side becomes crop_h, each side round(side * crop_h / longer) (half to even), with
 *                          PIL's resize, then zero padding to a square (left / top get pad // 2); no resize and no
 *                          padding when the longer side already equals crop_h (refused unless the frame is square:
 *                          the reference then returns a non-square image); ToTensor and Normalize as open_clip.
 * For the first three the output size of the resize is transformers' and torchvision's: the shorter side becomes
 * shortest_edge, the longer int(shortest_edge * long / short); crop_size may not exceed shortest_edge. */
#ifndef MODEL_CLIP_IMAGE_H
#define MODEL_CLIP_IMAGE_H

#include <stdint.h>

typedef enum { CLIP_IMAGE_HF = 0, CLIP_IMAGE_HF_PIL = 1, CLIP_IMAGE_OPEN_CLIP = 2, CLIP_IMAGE_HPSV2 = 3 } clip_image_variant;

/* What preprocessor_config.json says (only what CLIPImageProcessor reads for CLIP). */
typedef struct {
    int shortest_edge;        /* size.shortest_edge (or "size": N), pixels */
    int crop_h, crop_w;       /* crop_size.height / .width (or "crop_size": N), pixels */
    int resample;             /* PIL's code; 3 (bicubic) is the one supported */
    double rescale_factor;    /* 1/255 by default */
    float image_mean[3], image_std[3];
    clip_image_variant variant; /* CLIP_IMAGE_HF after loading; set it for another reference */
} clip_image_config;

/* The defaults of transformers' CLIPImageProcessor (OpenAI CLIP at 224: shortest edge 224, crop 224x224, bicubic,
 * OPENAI_CLIP_MEAN / OPENAI_CLIP_STD, rescale 1/255), variant CLIP_IMAGE_HF. */
void clip_image_config_default(clip_image_config *cfg);

/* Reads `path`: a model folder holding preprocessor_config.json, or the file. Keys read: size, crop_size,
 * image_mean, image_std (required: an error names the missing one, where transformers would fall back to the
 * class defaults), resample, rescale_factor, do_resize, do_center_crop, do_rescale, do_normalize (optional,
 * defaults as CLIPImageProcessor), image_processor_type (when present: a CLIPImageProcessor class). Returns 0, or
 * -1 with core_error naming the file and key: missing file, bad JSON, a missing or malformed key, a resample other
 * than 3 (named: nearest, lanczos, bilinear, box, hamming), a do_* flag set to false (not supported), sizes out
 * of 1..4096, a zero std. */
int clip_image_config_load(const char *path, clip_image_config *cfg);

/* The size (*oh, *ow) of the resized image for an h x w input (before the crop or, for CLIP_IMAGE_HPSV2, the
 * padding). */
void clip_image_resized_size(const clip_image_config *cfg, int h, int w, int *oh, int *ow);

/* Resizes one u8 RGB image src [h, w, 3] to dst [oh, ow, 3] with the variant's resampler (antialiased bicubic; a
 * side that keeps its length is copied, as both references skip that pass). Returns 0, or -1 (sizes < 1, out of
 * memory). Exposed for the tests and for callers that want the resized frame. */
int clip_image_resize_u8(const clip_image_config *cfg, const uint8_t *src, int h, int w, uint8_t *dst, int oh, int ow);

/* Preprocesses n frames src [n, h, w, 3] (u8 RGB, row-major, as a rollout's video) into out [n, 3, crop_h,
 * crop_w] float32 (channel-first, the vision tower's pixel_values). Only the rows and columns the crop keeps are
 * resampled (the values are those of the full resize). Frames run in parallel (OpenMP). Returns 0, or -1 with
 * core_error (n < 0, sizes < 1, a crop the resized frame cannot hold, CLIP_IMAGE_HPSV2 with a non-square crop or
 * a non-square frame whose longer side is already crop_h, out of memory). */
int clip_image_preprocess(const clip_image_config *cfg, const uint8_t *src, int n, int h, int w, float *out);

#endif
