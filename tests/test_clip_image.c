/* tests/test_clip_image.c — model/clip/clip_image.c against transformers' CLIPImageProcessor (torchvision backend,
 * the default), CLIPImageProcessorPil and open_clip's eval transform, on the fixtures of
 * scripts/fixtures_clip_image.py: the resized u8 images equal, pixel_values equal bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "model/clip/clip_image.h"
#include "tests/test.h"

#define IO_PATH "tests/fixtures/clip_image_io.safetensors"
static const char *VNAME[4] = {"hf", "hf_pil", "open_clip", "hpsv2"};
static const char *RNAME[4] = {"hf", "pil", "pil", "hpsv2"}; /* the fixture's resized images */

static uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* The fixture's frames (scripts/fixtures_clip_image.py frame_pixels): u8 [n, h, w, 3], noise in the top half. */
static uint8_t *frame_pixels(int n, int h, int w, uint64_t seed) {
    uint8_t *p = malloc((size_t)n * h * w * 3);
    if (!p) return NULL;
    for (int f = 0; f < n; f++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int c = 0; c < 3; c++) {
                    uint64_t idx = (((uint64_t)f * h + y) * w + x) * 3 + c;
                    uint8_t v = y < h / 2 ? (uint8_t)((splitmix64(seed << 32 | idx) >> 24) & 255)
                                          : (uint8_t)((x * 255 / (w > 1 ? w - 1 : 1) + y * 97 / h + c * 60 + f * 17) & 255);
                    p[idx] = v;
                }
    return p;
}

static uint64_t fnv64(const void *data, size_t n) {
    const unsigned char *b = data;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* Parses "[[n, h, w, seed], ...]" from the fixture's metadata into cases[k][4]; returns the count. */
static int parse_cases(const char *s, int cases[][4], int cap) {
    int k = 0;
    while (s && k < cap && (s = strstr(s, "[")) != NULL) {
        if (s[1] == '[') {
            s++;
            continue;
        }
        if (sscanf(s, "[%d, %d, %d, %d]", &cases[k][0], &cases[k][1], &cases[k][2], &cases[k][3]) == 4) k++;
        s++;
    }
    return k;
}

/* Small config (shortest edge 16, crop 12 x 16): odd sizes, landscape, portrait, upscaling, identity, 13x
 * downscale, Pillow's height-first order; every variant's resized u8 image and pixel_values against the fixture. */
TEST(clip_image_matches_transformers_and_open_clip) {
    clip_image_config cfg;
    REQUIRE_OK(clip_image_config_load("tests/fixtures/clip_image_small", &cfg));
    CHECK(cfg.shortest_edge == 16 && cfg.crop_h == 12 && cfg.crop_w == 16 && cfg.variant == CLIP_IMAGE_HF);
    st_file *io = st_open(IO_PATH);
    REQUIRE_OK(io ? 0 : -1);
    int cases[16][4], ncase = parse_cases(st_metadata(io, "small"), cases, 16);
    REQUIRE(ncase >= 6);
    for (int v = 0; v < 4; v++) {
        cfg.variant = (clip_image_variant)v;
        if (v == CLIP_IMAGE_HPSV2) cfg.crop_h = cfg.crop_w = 16; /* HPSv2: a 16 x 16 square (the longer crop side) */
        int ph = cfg.crop_h, pw = cfg.crop_w, u8_bad = 0;
        double maxerr = 0.0;
        for (int i = 0; i < ncase; i++) {
            int n = cases[i][0], h = cases[i][1], w = cases[i][2], oh, ow;
            uint8_t *frames = frame_pixels(n, h, w, (uint64_t)cases[i][3]);
            REQUIRE(frames);
            clip_image_resized_size(&cfg, h, w, &oh, &ow);
            char name[64];
            core_tensor want;
            snprintf(name, sizeof name, "small.%d.resized.%s", i, RNAME[v]);
            REQUIRE_OK(st_get(io, name, &want));
            REQUIRE(want.ndim == 4 && want.shape[1] == oh && want.shape[2] == ow);
            uint8_t *got = malloc((size_t)oh * ow * 3);
            REQUIRE(got);
            for (int f = 0; f < n; f++) {
                REQUIRE_OK(clip_image_resize_u8(&cfg, frames + (size_t)f * h * w * 3, h, w, got, oh, ow));
                const uint8_t *ref = (const uint8_t *)want.data + (size_t)f * oh * ow * 3;
                for (size_t k = 0; k < (size_t)oh * ow * 3; k++) u8_bad += got[k] != ref[k];
            }
            free(got);
            float *out = malloc((size_t)n * 3 * ph * pw * sizeof *out);
            REQUIRE(out);
            REQUIRE_OK(clip_image_preprocess(&cfg, frames, n, h, w, out));
            snprintf(name, sizeof name, "small.%d.out.%s", i, VNAME[v]);
            REQUIRE_OK(st_get(io, name, &want));
            REQUIRE(want.dtype == CORE_F32 && core_tensor_numel(&want) == (int64_t)n * 3 * ph * pw);
            for (size_t k = 0; k < (size_t)n * 3 * ph * pw; k++) {
                double d = fabs((double)out[k] - ((const float *)want.data)[k]);
                if (d > maxerr) maxerr = d;
            }
            free(out);
            free(frames);
        }
        fprintf(stderr, "  %s: %d u8 values of the resize differ, pixel_values max |C - ref| = %.3g\n", VNAME[v], u8_bad,
                maxerr);
        CHECK_MSG(u8_bad == 0, "%s: %d resized u8 values differ from the reference", VNAME[v], u8_bad);
        CHECK_MSG(maxerr == 0.0, "%s: pixel_values differ by up to %.3g", VNAME[v], maxerr);
    }
    st_close(io);
}

/* At CLIP's real 224 (openai's preprocessor_config.json, old integer keys), Wan's 480p and 720p frames among
 * others: the FNV-1a hashes of the resized u8 image and of pixel_values equal the references' (bit for bit). */
TEST(clip_image_224_bit_exact) {
    clip_image_config cfg;
    REQUIRE_OK(clip_image_config_load("tests/fixtures/clip_image_224/preprocessor_config.json", &cfg));
    CHECK(cfg.shortest_edge == 224 && cfg.crop_h == 224 && cfg.crop_w == 224 && cfg.resample == 3);
    st_file *io = st_open(IO_PATH);
    REQUIRE_OK(io ? 0 : -1);
    int cases[16][4], ncase = parse_cases(st_metadata(io, "real"), cases, 16), bad = 0;
    REQUIRE(ncase >= 6);
    for (int i = 0; i < ncase; i++) {
        int n = cases[i][0], h = cases[i][1], w = cases[i][2], oh, ow;
        uint8_t *frames = frame_pixels(n, h, w, (uint64_t)cases[i][3]);
        REQUIRE(frames);
        float *out = malloc((size_t)n * 3 * 224 * 224 * sizeof *out);
        REQUIRE(out);
        for (int v = 0; v < 4; v++) {
            cfg.variant = (clip_image_variant)v;
            clip_image_resized_size(&cfg, h, w, &oh, &ow);
            uint8_t *rs = malloc((size_t)n * oh * ow * 3);
            REQUIRE(rs);
            for (int f = 0; f < n; f++)
                REQUIRE_OK(clip_image_resize_u8(&cfg, frames + (size_t)f * h * w * 3, h, w, rs + (size_t)f * oh * ow * 3, oh, ow));
            REQUIRE_OK(clip_image_preprocess(&cfg, frames, n, h, w, out));
            char name[64];
            core_tensor want;
            snprintf(name, sizeof name, "real.%d.hash.%s", i, VNAME[v]);
            REQUIRE_OK(st_get(io, name, &want));
            const int64_t *hw = want.data;
            uint64_t h0 = fnv64(rs, (size_t)n * oh * ow * 3), h1 = fnv64(out, (size_t)n * 3 * 224 * 224 * sizeof *out);
            if (h0 != (uint64_t)hw[0] || h1 != (uint64_t)hw[1]) {
                fprintf(stderr, "  %dx%d (%d frames) %s: resize %s, pixel_values %s\n", h, w, n, VNAME[v],
                        h0 == (uint64_t)hw[0] ? "equal" : "DIFFERS", h1 == (uint64_t)hw[1] ? "equal" : "DIFFER");
                bad++;
            }
            free(rs);
        }
        free(out);
        free(frames);
    }
    CHECK_MSG(bad == 0, "%d of %d (size, variant) cases differ from the references at 224", bad, 4 * ncase);
    st_close(io);
}

/* By hand: a constant frame stays constant through the resize (the weights sum to one), and its pixel_values are
 * (c / 255 - mean) / std; batching gives each frame what it gives alone; the crop offsets of the variants. */
TEST(clip_image_by_hand) {
    clip_image_config cfg;
    clip_image_config_default(&cfg);
    cfg.shortest_edge = 8, cfg.crop_h = 8, cfg.crop_w = 8;
    uint8_t frame[2 * 13 * 21 * 3];
    for (size_t i = 0; i < sizeof frame; i++) frame[i] = i < sizeof frame / 2 ? 200 : (uint8_t)(i * 7);
    float out[2 * 3 * 64], one[3 * 64];
    for (int v = 0; v < 3; v++) {
        cfg.variant = (clip_image_variant)v;
        REQUIRE_OK(clip_image_preprocess(&cfg, frame, 2, 13, 21, out));
        for (int c = 0; c < 3; c++)
            for (int p = 0; p < 64; p++)
                CHECK_NEAR(out[c * 64 + p], (200.0 / 255.0 - cfg.image_mean[c]) / cfg.image_std[c], 1e-6);
        REQUIRE_OK(clip_image_preprocess(&cfg, frame + 13 * 21 * 3, 1, 13, 21, one));
        CHECK(!memcmp(one, out + 3 * 64, sizeof one));
    }
    /* a 10 x 13 resized image (shortest edge 10) cropped to 10 x 10: 13 - 10 = 3 columns spare; transformers
     * starts at column 1, open_clip at round(1.5) = 2 */
    uint8_t ramp[10 * 13 * 3];
    for (int y = 0; y < 10; y++)
        for (int x = 0; x < 13; x++)
            for (int c = 0; c < 3; c++) ramp[(y * 13 + x) * 3 + c] = (uint8_t)(x * 10);
    cfg.shortest_edge = 10, cfg.crop_h = 10, cfg.crop_w = 10;
    float o[3 * 100];
    int want_left[3] = {1, 1, 2};
    for (int v = 0; v < 3; v++) {
        cfg.variant = (clip_image_variant)v;
        REQUIRE_OK(clip_image_preprocess(&cfg, ramp, 1, 10, 13, o)); /* no resize: 10 x 13 already */
        double x0 = (o[0] * cfg.image_std[0] + cfg.image_mean[0]) * 255.0;
        CHECK_MSG(fabs(x0 - 10.0 * want_left[v]) < 1e-3, "%s: first column %.3f, want %d", VNAME[v], x0, 10 * want_left[v]);
    }
}

/* HPSv2's letterbox by hand: a constant 8 x 16 frame into an 8 x 8 square is resized to 4 x 8 and padded with two
 * zero rows above and below; its refusals. */
TEST(clip_image_hpsv2_letterbox_by_hand) {
    clip_image_config cfg;
    clip_image_config_default(&cfg);
    cfg.variant = CLIP_IMAGE_HPSV2, cfg.crop_h = cfg.crop_w = 8;
    uint8_t frame[8 * 16 * 3];
    memset(frame, 100, sizeof frame);
    int oh, ow;
    clip_image_resized_size(&cfg, 8, 16, &oh, &ow);
    CHECK(oh == 4 && ow == 8);
    float out[3 * 64];
    REQUIRE_OK(clip_image_preprocess(&cfg, frame, 1, 8, 16, out));
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < 8; y++)
            for (int x = 0; x < 8; x++) {
                double want = ((y >= 2 && y < 6 ? 100.0 : 0.0) / 255.0 - cfg.image_mean[c]) / cfg.image_std[c];
                CHECK_NEAR(out[(c * 8 + y) * 8 + x], want, 1e-6);
            }
    /* a 13 x 8 frame: 8 x 5 (round(8 * 8 / 13) = round(4.92) = 5); the padding would be 1 column left, 2 right */
    clip_image_resized_size(&cfg, 13, 8, &oh, &ow);
    CHECK(oh == 8 && ow == 5);
    cfg.crop_w = 7;
    CHECK(clip_image_preprocess(&cfg, frame, 1, 8, 16, out) == -1);
    CHECK_MSG(strstr(core_last_error(), "square crop") != NULL, "error: %s", core_last_error());
    cfg.crop_w = 8;
    CHECK(clip_image_preprocess(&cfg, frame, 1, 4, 8, out) == -1); /* longer side already 8: left as 4 x 8 */
    CHECK_MSG(strstr(core_last_error(), "leaves a 4x8 frame") != NULL, "error: %s", core_last_error());
}

static void expect_cfg_error(const char *json, const char *needle) {
    const char *dir = test_tmpdir();
    test_write_text(dir, "preprocessor_config.json", json);
    clip_image_config cfg;
    int rc = clip_image_config_load(dir, &cfg);
    CHECK_MSG(rc == -1 && strstr(core_last_error(), needle), "%s: want an error naming \"%s\", got \"%s\"", json, needle,
              rc ? core_last_error() : "(loaded)");
}

TEST(clip_image_config_errors_name_the_problem) {
    clip_image_config cfg;
    CHECK(clip_image_config_load(test_tmpdir(), &cfg) == -1);
    CHECK_MSG(strstr(core_last_error(), "missing preprocessor_config.json") != NULL, "error: %s", core_last_error());
#define OK_KEYS "\"image_mean\": [0.5, 0.5, 0.5], \"image_std\": [0.5, 0.5, 0.5]"
    expect_cfg_error("{\"crop_size\": 224, " OK_KEYS "}", "missing key \"size\"");
    expect_cfg_error("{\"size\": 224, " OK_KEYS "}", "missing key \"crop_size\"");
    expect_cfg_error("{\"size\": 224, \"crop_size\": 224, \"image_mean\": [0.5, 0.5]}", "\"image_mean\" must be a list of 3");
    expect_cfg_error("{\"size\": 224, \"crop_size\": 224, \"image_mean\": [0.5, 0.5, 0.5]}", "missing key \"image_std\"");
    expect_cfg_error("{\"size\": {\"height\": 224}, \"crop_size\": 224, " OK_KEYS "}", "\"size\" must be an integer or {\"shortest_edge\"");
    expect_cfg_error("{\"size\": 224, \"crop_size\": {\"height\": 224}, " OK_KEYS "}", "needs \"height\" and \"width\"");
    expect_cfg_error("{\"size\": 224, \"crop_size\": 256, " OK_KEYS "}", "larger than size.shortest_edge");
    expect_cfg_error("{\"size\": 224, \"crop_size\": 224, \"resample\": 2, " OK_KEYS "}", "resample 2 (bilinear)");
    expect_cfg_error("{\"size\": 224, \"crop_size\": 224, \"do_center_crop\": false, " OK_KEYS "}", "\"do_center_crop\"");
    expect_cfg_error("{\"size\": 224, \"crop_size\": 224, \"image_processor_type\": \"SiglipImageProcessor\", " OK_KEYS "}",
                     "not a CLIPImageProcessor");
    expect_cfg_error("{\"size\": 224, \"crop_size\": 224, \"image_mean\": [0.5, 0.5, 0.5], \"image_std\": [0.5, 0, 0.5]}",
                     "image_std[1] is zero");
    expect_cfg_error("{\"size\": 224, \"crop_size\": 224, " OK_KEYS, "preprocessor_config.json:");
#undef OK_KEYS
    clip_image_config_default(&cfg);
    float out[3 * 224 * 224];
    uint8_t px[3] = {0, 0, 0};
    CHECK(clip_image_preprocess(&cfg, px, 1, 0, 1, out) == -1);
}
