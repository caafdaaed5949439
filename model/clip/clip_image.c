/* model/clip/clip_image.c — CLIP image preprocessing; see clip_image.h.
 *
 * References read to write this: Pillow's src/libImaging/Resample.c (precompute_coeffs, normalize_coeffs_8bpc,
 * ImagingResampleHorizontal_8bpc / Vertical, ImagingResampleInner: which passes run), PyTorch's
 * aten/src/ATen/native/cpu/UpSampleKernel.cpp (HelperInterpCubic::aa_filter, _compute_indices_min_size_weights_aa,
 * _compute_index_ranges_int16_weights, basic_loop_aa_horizontal<uint8_t>) and UpSampleKernelAVXAntialias.h (width
 * pass, then height pass, u8 in between), torchvision's transforms/v2 resize_image and center_crop, transformers'
 * image_processing_backends.py (TorchvisionBackend, PilBackend) and image_transforms.py, open_clip's transform.py.
 *
 * Both resamplers are PIL's design: for each output index a window of input taps with the Keys cubic (a = -0.5)
 * stretched by the downscale factor, weights normalised to sum 1, rounded to integers, and an integer dot product
 * per pass rounded by adding half an LSB and shifting. They differ in (1) the cubic's operation order for
 * 1 <= |x| < 2, (2) the fixed-point precision: PIL 22 bits; torch the most bits (<= 22) for which the axis's
 * largest weight still fits int16. */
#include "model/clip/clip_image.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"

#define PIL_PRECISION_BITS 22 /* Pillow: 32 - 8 - 2 */
#define MAX_SIDE 4096

/* OPENAI_CLIP_MEAN / OPENAI_CLIP_STD (transformers' image_utils; the values of CLIP's own preprocessing). */
static const float OPENAI_MEAN[3] = {0.48145466f, 0.4578275f, 0.40821073f};
static const float OPENAI_STD[3] = {0.26862954f, 0.26130258f, 0.27577711f};

void clip_image_config_default(clip_image_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->shortest_edge = 224;
    cfg->crop_h = cfg->crop_w = 224;
    cfg->resample = 3;
    cfg->rescale_factor = 1.0 / 255.0;
    memcpy(cfg->image_mean, OPENAI_MEAN, sizeof OPENAI_MEAN);
    memcpy(cfg->image_std, OPENAI_STD, sizeof OPENAI_STD);
    cfg->variant = CLIP_IMAGE_HF;
}

/* ---- preprocessor_config.json ---- */

/* An int key given as N or as {"<sub>": N}: *out, or -1 with an error. */
static int size_key(json_t *root, const char *key, const char *sub, int *out, const char *file) {
    json_t *v = json_object_get(root, key);
    if (!v) return core_error("%s: missing key \"%s\"", file, key);
    json_t *n = json_is_object(v) ? json_object_get(v, sub) : v;
    if (!json_is_integer(n))
        return core_error("%s: \"%s\" must be an integer or {\"%s\": integer}", file, key, sub);
    if (json_integer_value(n) < 1 || json_integer_value(n) > MAX_SIDE)
        return core_error("%s: \"%s\" %lld is out of 1..%d", file, key, (long long)json_integer_value(n), MAX_SIDE);
    *out = (int)json_integer_value(n);
    return 0;
}

static int triple_key(json_t *root, const char *key, float out[3], const char *file) {
    json_t *v = json_object_get(root, key);
    if (!v) return core_error("%s: missing key \"%s\"", file, key);
    if (json_array_size(v) != 3) return core_error("%s: \"%s\" must be a list of 3 numbers (R, G, B)", file, key);
    for (size_t i = 0; i < 3; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_number(x)) return core_error("%s: \"%s\"[%zu] is not a number", file, key, i);
        out[i] = (float)json_number_value(x); /* torch.tensor(list) / np.array(..., float32): one rounding */
    }
    return 0;
}

int clip_image_config_load(const char *path, clip_image_config *cfg) {
    char file[4096];
    struct stat st;
    if (!stat(path, &st) && S_ISDIR(st.st_mode))
        snprintf(file, sizeof file, "%s/preprocessor_config.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    if (stat(file, &st)) return core_error("%s: missing preprocessor_config.json (the CLIP image processor)", file);
    json_error_t je;
    json_t *root = json_load_file(file, 0, &je);
    if (!root) return core_error("%s:%d: %s", file, je.line, je.text);
    clip_image_config c;
    clip_image_config_default(&c);
    int rc = -1;
    const char *type = json_string_value(json_object_get(root, "image_processor_type"));
    if (type && strncmp(type, "CLIPImageProcessor", 18)) {
        core_error("%s: image_processor_type \"%s\" is not a CLIPImageProcessor", file, type);
        goto out;
    }
    if (size_key(root, "size", "shortest_edge", &c.shortest_edge, file)) goto out;
    json_t *cs = json_object_get(root, "crop_size");
    if (json_is_object(cs) && (!json_object_get(cs, "height") || !json_object_get(cs, "width"))) {
        core_error("%s: \"crop_size\" needs \"height\" and \"width\"", file);
        goto out;
    }
    if (size_key(root, "crop_size", "height", &c.crop_h, file) || size_key(root, "crop_size", "width", &c.crop_w, file))
        goto out;
    if (c.crop_h > c.shortest_edge || c.crop_w > c.shortest_edge) {
        core_error("%s: crop_size %dx%d is larger than size.shortest_edge %d (zero padding is not supported)", file,
                   c.crop_h, c.crop_w, c.shortest_edge);
        goto out;
    }
    if (triple_key(root, "image_mean", c.image_mean, file) || triple_key(root, "image_std", c.image_std, file)) goto out;
    for (int i = 0; i < 3; i++)
        if (!(c.image_std[i] != 0.0f)) {
            core_error("%s: image_std[%d] is zero", file, i);
            goto out;
        }
    json_t *rs = json_object_get(root, "resample");
    if (rs) {
        static const char *names[6] = {"nearest", "lanczos", "bilinear", "bicubic", "box", "hamming"};
        long long r = json_is_integer(rs) ? json_integer_value(rs) : -1;
        if (r != 3) {
            core_error("%s: resample %lld (%s) is not supported: CLIP processors use 3 (bicubic)", file, r,
                       r >= 0 && r < 6 ? names[r] : "not a PIL filter code");
            goto out;
        }
    }
    json_t *rf = json_object_get(root, "rescale_factor");
    if (rf) {
        if (!json_is_number(rf) || !(json_number_value(rf) > 0)) {
            core_error("%s: \"rescale_factor\" must be a positive number", file);
            goto out;
        }
        c.rescale_factor = json_number_value(rf);
    }
    static const char *flags[4] = {"do_resize", "do_center_crop", "do_rescale", "do_normalize"};
    for (int i = 0; i < 4; i++) {
        json_t *f = json_object_get(root, flags[i]);
        if (f && !json_is_true(f)) {
            core_error("%s: \"%s\": only true is supported (CLIP's processor does all four steps)", file, flags[i]);
            goto out;
        }
    }
    *cfg = c;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

void clip_image_resized_size(const clip_image_config *cfg, int h, int w, int *oh, int *ow) {
    if (cfg->variant == CLIP_IMAGE_HPSV2) { /* round(side * (size / longer)): Python's round, half to even */
        double scale = (double)cfg->crop_h / (double)(h > w ? h : w);
        if (scale == 1.0) {
            *oh = h, *ow = w;
        } else {
            *oh = (int)nearbyint((double)h * scale), *ow = (int)nearbyint((double)w * scale);
        }
        return;
    }
    int s = cfg->shortest_edge;
    if (w <= h) { /* int(size * long / short): Python's true division, then truncation */
        *ow = s, *oh = (int)((double)s * h / w);
    } else {
        *oh = s, *ow = (int)((double)s * w / h);
    }
}

/* ---- the resampling coefficients of one axis ---- */
typedef struct {
    int ksize;         /* taps stored per output index */
    int *xmin, *xsize; /* [out] first input index and number of taps */
    int32_t *k;        /* [out * ksize] fixed-point weights */
    int prec;          /* their precision in bits */
} axis_coeffs;

static void axis_free(axis_coeffs *a) {
    free(a->xmin);
    free(a->xsize);
    free(a->k);
    a->xmin = a->xsize = NULL, a->k = NULL;
}

/* Keys cubic, a = -0.5, in torch's operation order (UpSample.h cubic_convolution1/2). */
static double cubic_torch(double x) {
    const double A = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((A + 2) * x - (A + 3)) * x * x + 1;
    if (x < 2.0) return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
    return 0.0;
}

/* The same in Pillow's order (Resample.c bicubic_filter). */
static double cubic_pil(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static int axis_init(axis_coeffs *a, int in, int out, int torch) {
    double scale = (double)in / out, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = 2.0 * filterscale, ss = 1.0 / filterscale;
    a->ksize = (int)ceil(support) * 2 + 1;
    a->xmin = malloc((size_t)out * sizeof *a->xmin);
    a->xsize = malloc((size_t)out * sizeof *a->xsize);
    a->k = malloc((size_t)out * (size_t)a->ksize * sizeof *a->k);
    double *w = malloc((size_t)out * (size_t)a->ksize * sizeof *w);
    if (!a->xmin || !a->xsize || !a->k || !w) {
        free(w);
        axis_free(a);
        return core_error("clip image: out of memory");
    }
    double wmax = 0.0;
    for (int i = 0; i < out; i++) {
        double center = (i + 0.5) * scale, total = 0.0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in) xmax = in;
        int n = xmax - xmin;
        if (n > a->ksize) n = a->ksize; /* torch clamps; never reached with these sizes */
        if (n < 0) n = 0;
        double *wi = w + (size_t)i * a->ksize;
        for (int j = 0; j < n; j++) {
            double x = (j + xmin - center + 0.5) * ss;
            wi[j] = torch ? cubic_torch(x) : cubic_pil(x);
            total += wi[j];
        }
        for (int j = 0; j < n; j++) {
            if (total != 0.0) wi[j] /= total;
            if (total != 0.0 && wi[j] > wmax) wmax = wi[j];
        }
        for (int j = n; j < a->ksize; j++) wi[j] = 0.0;
        a->xmin[i] = xmin, a->xsize[i] = n;
    }
    if (torch) { /* the most bits for which the largest weight still fits int16 */
        for (a->prec = 0; a->prec < 22; a->prec++)
            if ((int)(0.5 + wmax * (1 << (a->prec + 1))) >= (1 << 15)) break;
    } else {
        a->prec = PIL_PRECISION_BITS;
    }
    for (size_t j = 0; j < (size_t)out * (size_t)a->ksize; j++) {
        double v = w[j] * (1 << a->prec);
        a->k[j] = v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v);
    }
    free(w);
    return 0;
}

static inline uint8_t clamp_shift(int32_t acc, int prec) {
    if (acc < 0) return 0;
    acc >>= prec;
    return acc > 255 ? 255 : (uint8_t)acc;
}

/* Width pass: dst[r, c - c0, :] for rows r of src (sw pixels a row, whose first column is input column xoff) and
 * output columns c0..c1. */
static void pass_h(const axis_coeffs *a, const uint8_t *src, int sw, int xoff, int rows, int c0, int c1, uint8_t *dst) {
    int dw = c1 - c0;
    for (int r = 0; r < rows; r++) {
        const uint8_t *in = src + (size_t)r * sw * 3;
        uint8_t *o = dst + (size_t)r * dw * 3;
        for (int c = c0; c < c1; c++) {
            const int32_t *k = a->k + (size_t)c * a->ksize;
            const uint8_t *p = in + (size_t)(a->xmin[c] - xoff) * 3;
            int32_t s0 = 1 << (a->prec - 1), s1 = s0, s2 = s0;
            for (int j = 0; j < a->xsize[c]; j++) {
                s0 += p[3 * j] * k[j];
                s1 += p[3 * j + 1] * k[j];
                s2 += p[3 * j + 2] * k[j];
            }
            o[3 * (c - c0)] = clamp_shift(s0, a->prec);
            o[3 * (c - c0) + 1] = clamp_shift(s1, a->prec);
            o[3 * (c - c0) + 2] = clamp_shift(s2, a->prec);
        }
    }
}

/* Height pass: dst[r - r0, :, :] (cols pixels wide) for output rows r0..r1, reading columns col0..col0 + cols of
 * src (sw pixels a row, whose first row is input row row0). */
static void pass_v(const axis_coeffs *a, const uint8_t *src, int sw, int row0, int col0, int cols, int r0, int r1,
                   uint8_t *dst) {
    size_t rowlen = (size_t)cols * 3, stride = (size_t)sw * 3;
    for (int r = r0; r < r1; r++) {
        const int32_t *k = a->k + (size_t)r * a->ksize;
        const uint8_t *base = src + (size_t)(a->xmin[r] - row0) * stride + (size_t)col0 * 3;
        uint8_t *o = dst + (size_t)(r - r0) * rowlen;
        for (size_t x = 0; x < rowlen; x++) {
            int32_t s = 1 << (a->prec - 1);
            for (int j = 0; j < a->xsize[r]; j++) s += base[(size_t)j * stride + x] * k[j];
            o[x] = clamp_shift(s, a->prec);
        }
    }
}

/* The resized image's rows r0..r1 and columns c0..c1, into dst [r1 - r0, c1 - c0, 3]. The passes run in the
 * reference's order: torch always width first; Pillow 13 height first when the height shrinks by more than twice
 * what the width shrinks (in_h - out_h > max(0, 2 * (in_w - out_w)); read from its ImagingResample, checked on
 * random shapes), width first otherwise. The order matters: the intermediate image is rounded to u8. */
static int resize_region(const clip_image_config *cfg, const uint8_t *src, int h, int w, int oh, int ow, int r0,
                         int r1, int c0, int c1, uint8_t *dst) {
    int torch = cfg->variant == CLIP_IMAGE_HF;
    int need_h = ow != w, need_v = oh != h, rc = -1, dw = c1 - c0;
    int vfirst = !torch && need_h && need_v && h - oh > 0 && h - oh > 2 * (w - ow);
    axis_coeffs ax = {0}, ay = {0};
    uint8_t *tmp = NULL;
    if (need_h && axis_init(&ax, w, ow, torch)) return -1;
    if (need_v && axis_init(&ay, h, oh, torch)) goto out;
    if (need_h && need_v && vfirst) { /* height pass over the input columns the width pass reads */
        int x0 = ax.xmin[c0], x1 = x0;
        for (int c = c0; c < c1; c++)
            if (ax.xmin[c] + ax.xsize[c] > x1) x1 = ax.xmin[c] + ax.xsize[c];
        tmp = malloc((size_t)(r1 - r0) * (size_t)(x1 - x0) * 3 + 1);
        if (!tmp) goto oom;
        pass_v(&ay, src, w, 0, x0, x1 - x0, r0, r1, tmp);
        pass_h(&ax, tmp, x1 - x0, x0, r1 - r0, c0, c1, dst);
    } else if (need_h && need_v) { /* width pass over the input rows the height pass reads */
        int s0 = ay.xmin[r0], s1 = s0;
        for (int r = r0; r < r1; r++)
            if (ay.xmin[r] + ay.xsize[r] > s1) s1 = ay.xmin[r] + ay.xsize[r];
        tmp = malloc((size_t)(s1 - s0) * (size_t)dw * 3 + 1);
        if (!tmp) goto oom;
        pass_h(&ax, src + (size_t)s0 * w * 3, w, 0, s1 - s0, c0, c1, tmp);
        pass_v(&ay, tmp, dw, s0, 0, dw, r0, r1, dst);
    } else if (need_h) {
        pass_h(&ax, src + (size_t)r0 * w * 3, w, 0, r1 - r0, c0, c1, dst);
    } else if (need_v) {
        pass_v(&ay, src, w, 0, c0, dw, r0, r1, dst);
    } else {
        for (int r = r0; r < r1; r++)
            memcpy(dst + (size_t)(r - r0) * dw * 3, src + ((size_t)r * w + c0) * 3, (size_t)dw * 3);
    }
    rc = 0;
    goto out;
oom:
    core_error("clip image: out of memory");
out:
    free(tmp);
    if (need_h) axis_free(&ax);
    if (need_v) axis_free(&ay);
    return rc;
}

int clip_image_resize_u8(const clip_image_config *cfg, const uint8_t *src, int h, int w, uint8_t *dst, int oh, int ow) {
    if (h < 1 || w < 1 || oh < 1 || ow < 1)
        return core_error("clip image: resize %dx%d -> %dx%d: sizes must be positive", h, w, oh, ow);
    return resize_region(cfg, src, h, w, oh, ow, 0, oh, 0, ow, dst);
}

/* The crop's first row or column in the resized image: transformers int((n - crop) / 2.0); open_clip
 * int(round(...)), half to even; HPSv2's padding puts (crop - n) // 2 zeros first (a negative offset). */
static int crop_offset(const clip_image_config *cfg, int n, int crop) {
    if (cfg->variant == CLIP_IMAGE_HPSV2) return -((crop - n) / 2);
    return cfg->variant == CLIP_IMAGE_OPEN_CLIP ? (int)nearbyint((n - crop) / 2.0) : (n - crop) / 2;
}

int clip_image_preprocess(const clip_image_config *cfg, const uint8_t *src, int n, int h, int w, float *out) {
    if (n < 0 || h < 1 || w < 1) return core_error("clip image: %d frames of %dx%d: bad shape", n, h, w);
    int oh, ow, ch = cfg->crop_h, cw = cfg->crop_w, hps = cfg->variant == CLIP_IMAGE_HPSV2;
    clip_image_resized_size(cfg, h, w, &oh, &ow);
    if (hps && ch != cw) return core_error("clip image: HPSv2's preprocessing needs a square crop, not %dx%d", ch, cw);
    if (hps && (h > w ? h : w) == ch && h != w)
        return core_error("clip image: HPSv2's preprocessing leaves a %dx%d frame as it is (its longer side is already "
                          "%d): not a %dx%d image", h, w, ch, ch, ch);
    if (!hps && (oh < ch || ow < cw))
        return core_error("clip image: a %dx%d frame resizes to %dx%d, smaller than the %dx%d crop", h, w, oh, ow, ch, cw);
    if (hps && (oh > ch || ow > cw || oh < 1 || ow < 1))
        return core_error("clip image: a %dx%d frame resizes to %dx%d for a %dx%d square", h, w, oh, ow, ch, cw);
    int top = crop_offset(cfg, oh, ch), left = crop_offset(cfg, ow, cw);
    /* the part of the crop window [top, top + ch) x [left, left + cw) inside the resized image (all of it but
     * HPSv2's padding) */
    int r0 = top < 0 ? 0 : top, r1 = top + ch > oh ? oh : top + ch;
    int c0 = left < 0 ? 0 : left, c1 = left + cw > ow ? ow : left + cw;
    /* per-channel affine maps, in each reference's float32 operations */
    float sub[3], div[3];
    float inv = (float)(1.0 / cfg->rescale_factor);
    for (int c = 0; c < 3; c++) {
        if (cfg->variant == CLIP_IMAGE_HF) /* mean and std scaled by 1/rescale_factor in float32, then (x - m) / s */
            sub[c] = cfg->image_mean[c] * inv, div[c] = cfg->image_std[c] * inv;
        else
            sub[c] = cfg->image_mean[c], div[c] = cfg->image_std[c];
    }
    int failed = 0;
    size_t plane = (size_t)ch * cw, fsize = (size_t)h * w * 3;
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
    for (int f = 0; f < n; f++) {
        uint8_t *crop = calloc(plane * 3, 1), *part = malloc((size_t)(r1 - r0) * (size_t)(c1 - c0) * 3 + 1);
        if (!crop || !part || resize_region(cfg, src + (size_t)f * fsize, h, w, oh, ow, r0, r1, c0, c1, part)) {
            free(crop);
            free(part);
#pragma omp atomic write
            failed = 1;
            continue;
        }
        for (int r = r0; r < r1; r++) /* into the window; the rest stays zero (the padding) */
            memcpy(crop + ((size_t)(r - top) * cw + (size_t)(c0 - left)) * 3, part + (size_t)(r - r0) * (c1 - c0) * 3,
                   (size_t)(c1 - c0) * 3);
        free(part);
        float *o = out + (size_t)f * 3 * plane;
        for (size_t p = 0; p < plane; p++) {
            for (int c = 0; c < 3; c++) {
                uint8_t x = crop[3 * p + (size_t)c];
                float v;
                if (cfg->variant == CLIP_IMAGE_HF) v = (float)x;
                else if (cfg->variant == CLIP_IMAGE_HF_PIL) v = (float)((double)x * cfg->rescale_factor);
                else v = (float)x / 255.0f;
                o[(size_t)c * plane + p] = (v - sub[c]) / div[c];
            }
        }
        free(crop);
    }
    return failed ? core_error("clip image: out of memory preprocessing %d frames of %dx%d", n, h, w) : 0;
}
