/* tests/test_scorers_more.c — the video-statistics scorers (colorfulness, motion, flicker, sharpness) on tiny
 * synthetic videos with values computed by hand from the formulas in reward/scorers.h, and their registry entries. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reward/scorers.h"
#include "tests/test.h"

/* Sets pixel (t, y, x) of a video [F, H, W, 3] to (r, g, b). */
static void px(uint8_t *v, int64_t H, int64_t W, int64_t t, int64_t y, int64_t x, uint8_t r, uint8_t g, uint8_t b)
{
    uint8_t *q = v + 3 * ((t * H + y) * W + x);
    q[0] = r;
    q[1] = g;
    q[2] = b;
}

/* Fills frame t with grey level g. */
static void grey_frame(uint8_t *v, int64_t H, int64_t W, int64_t t, uint8_t g)
{
    memset(v + 3 * t * H * W, g, (size_t)(3 * H * W));
}

TEST(reward_more_colorfulness_values) {
    uint8_t v[3 * 2 * 2 * 3];
    reward_video vid = {v, 3, 2, 2};
    double r = -1;
    /* Grey levels vary, but R = G = B everywhere: rg = yb = 0. */
    for (int i = 0; i < 12; i++) px(v, 2, 2, i / 4, (i / 2) % 2, i % 2, (uint8_t)(20 * i), (uint8_t)(20 * i), (uint8_t)(20 * i));
    REQUIRE_OK(reward_colorfulness(&vid, NULL, NULL, &r));
    CHECK(r == 0.0);
    /* Solid pure red: rg = 255, yb = 127.5, no spread; M = 0.3 * sqrt(255^2 + 127.5^2). */
    for (int i = 0; i < 12; i++) px(v, 2, 2, i / 4, (i / 2) % 2, i % 2, 255, 0, 0);
    REQUIRE_OK(reward_colorfulness(&vid, NULL, NULL, &r));
    CHECK_NEAR(r, 0.3 * sqrt(255.0 * 255.0 + 127.5 * 127.5) / 150.0, 1e-12);
    CHECK_NEAR(r, 0.570198, 1e-6);
    /* Half (100, 0, 0), half black: rg in {100, 0} -> mean 50, std 50; yb in {50, 0} -> mean 25, std 25.
     * M = sqrt(50^2 + 25^2) + 0.3 sqrt(50^2 + 25^2) = 1.3 sqrt(3125) = 72.6722. */
    for (int i = 0; i < 12; i++) {
        const uint8_t red = i % 2 ? 100 : 0;
        px(v, 2, 2, i / 4, (i / 2) % 2, i % 2, red, 0, 0);
    }
    REQUIRE_OK(reward_colorfulness(&vid, NULL, NULL, &r));
    CHECK_NEAR(r, 1.3 * sqrt(3125.0) / 150.0, 1e-12);
    CHECK_NEAR(r, 0.484481, 1e-6);
    /* Half pure red, half pure green: std_rg = 255, mean_yb = 127.5 -> M = 255 + 38.25 = 293.25 > 150: clamped. */
    for (int i = 0; i < 12; i++) px(v, 2, 2, i / 4, (i / 2) % 2, i % 2, i % 2 ? 255 : 0, i % 2 ? 0 : 255, 0);
    REQUIRE_OK(reward_colorfulness(&vid, NULL, NULL, &r));
    CHECK(r == 1.0);
    /* Solid blue (0, 0, 200): rg = 0, yb = -200 -> M = 0.3 * 200 = 60 -> 0.4. */
    for (int i = 0; i < 12; i++) px(v, 2, 2, i / 4, (i / 2) % 2, i % 2, 0, 0, 200);
    REQUIRE_OK(reward_colorfulness(&vid, "a red car", NULL, &r));
    CHECK_NEAR(r, 0.4, 1e-15);
}

TEST(reward_more_motion_values) {
    const int64_t F = 4, H = 2, W = 3;
    uint8_t v[4 * 2 * 3 * 3];
    reward_video vid = {v, F, H, W};
    double r = -1;
    /* Static (but textured) video: 0. */
    for (int64_t t = 0; t < F; t++)
        for (int64_t i = 0; i < H * W; i++) px(v, H, W, t, i / W, i % W, (uint8_t)(40 * i), (uint8_t)(7 * i), 200);
    REQUIRE_OK(reward_motion(&vid, NULL, NULL, &r));
    CHECK(r == 0.0);
    /* Alternating black / white frames: every |dY| = 255. */
    for (int64_t t = 0; t < F; t++) grey_frame(v, H, W, t, t % 2 ? 255 : 0);
    REQUIRE_OK(reward_motion(&vid, NULL, NULL, &r));
    CHECK(r == 1.0);
    /* Grey 0, 51, 51, 153: |dY| per pair 51, 0, 102 -> mean 51 -> 0.2. */
    const uint8_t g[4] = {0, 51, 51, 153};
    for (int64_t t = 0; t < F; t++) grey_frame(v, H, W, t, g[t]);
    REQUIRE_OK(reward_motion(&vid, NULL, NULL, &r));
    CHECK_NEAR(r, 0.2, 1e-15);
    /* Black to one pure-red pixel in 6: dY = 0.299 * 255 at 1 of 6 pixels, 3 pairs with the change in pair 1 only
     * (frames 1..3 identical). Mean = 0.299 * 255 / 18 -> / 255 = 0.299 / 18. */
    for (int64_t t = 0; t < F; t++) grey_frame(v, H, W, t, 0);
    for (int64_t t = 1; t < F; t++) px(v, H, W, t, 1, 2, 255, 0, 0);
    REQUIRE_OK(reward_motion(&vid, NULL, NULL, &r));
    CHECK_NEAR(r, 0.299 / 18.0, 1e-15);
    /* One frame: 0. */
    reward_video one = {v, 1, H, W};
    r = -1;
    REQUIRE_OK(reward_motion(&one, NULL, NULL, &r));
    CHECK(r == 0.0);
}

TEST(reward_more_flicker_values) {
    const int64_t H = 2, W = 2;
    uint8_t v[3 * 2 * 2 * 3];
    reward_video vid = {v, 2, H, W};
    double r = -1;
    /* Static textured video: 1. */
    for (int64_t t = 0; t < 2; t++) {
        px(v, H, W, t, 0, 0, 255, 255, 255);
        px(v, H, W, t, 0, 1, 10, 200, 30);
        px(v, H, W, t, 1, 0, 0, 0, 0);
        px(v, H, W, t, 1, 1, 90, 90, 250);
    }
    REQUIRE_OK(reward_flicker(&vid, NULL, NULL, &r));
    CHECK(r == 1.0);
    /* Black then white: a uniform change, h = 0 in both frames: 1 (motion is 1). */
    grey_frame(v, H, W, 0, 0);
    grey_frame(v, H, W, 1, 255);
    REQUIRE_OK(reward_flicker(&vid, NULL, NULL, &r));
    CHECK(r == 1.0);
    /* Black, then grey 51 at (0, 0) only. In frame 1 (edge neighbours replaced by the pixel itself):
     * h(0,0) = 51 - (51 + 51 + 0 + 0) / 4 = 25.5; h(0,1) = h(1,0) = 0 - 51 / 4 = -12.75; h(1,1) = 0.
     * Sum |dh| = 51 over 4 pixels -> D = 12.75 / 255 = 0.05 -> 1 - 2 * 0.05 = 0.9. */
    grey_frame(v, H, W, 1, 0);
    px(v, H, W, 1, 0, 0, 51, 51, 51);
    REQUIRE_OK(reward_flicker(&vid, NULL, NULL, &r));
    CHECK_NEAR(r, 0.9, 1e-15);
    /* Three frames: pair 0 as above, pair 1 static -> D = 0.025 -> 0.95. */
    reward_video three = {v, 3, H, W};
    memcpy(v + 24, v + 12, 12);
    REQUIRE_OK(reward_flicker(&three, NULL, NULL, &r));
    CHECK_NEAR(r, 0.95, 1e-15);
    /* Inverting black / white checkerboard: h = +-127.5 and flips, |dh| = 255 -> D = 1 -> 0. */
    for (int64_t t = 0; t < 3; t++)
        for (int64_t i = 0; i < 4; i++) {
            const uint8_t g = ((i / 2 + i % 2 + t) % 2) ? 255 : 0;
            px(v, H, W, t, i / 2, i % 2, g, g, g);
        }
    REQUIRE_OK(reward_flicker(&three, NULL, NULL, &r));
    CHECK(r == 0.0);
    /* One frame: 1. */
    reward_video one = {v, 1, H, W};
    REQUIRE_OK(reward_flicker(&one, NULL, NULL, &r));
    CHECK(r == 1.0);
}

TEST(reward_more_sharpness_values) {
    uint8_t v[2 * 3 * 3 * 3];
    double r = -1;
    /* Flat frames (different levels): Laplacian 0 everywhere -> 0. */
    reward_video flat = {v, 2, 3, 3};
    grey_frame(v, 3, 3, 0, 30);
    grey_frame(v, 3, 3, 1, 200);
    REQUIRE_OK(reward_sharpness(&flat, NULL, NULL, &r));
    CHECK(r == 0.0);
    /* 2x2 black / white checkerboard, one frame. With edges replicated, the white pixel (0,0) has neighbours
     * 255, 255, 0, 0 -> L = 510 - 1020 = -510; each black pixel has L = +510. Mean 0, variance 510^2 = 260100
     * -> 260100 / 260200. */
    reward_video cb = {v, 1, 2, 2};
    for (int i = 0; i < 4; i++) {
        const uint8_t g = (i / 2 + i % 2) % 2 ? 0 : 255;
        px(v, 2, 2, 0, i / 2, i % 2, g, g, g);
    }
    REQUIRE_OK(reward_sharpness(&cb, NULL, NULL, &r));
    CHECK_NEAR(r, 260100.0 / 260200.0, 1e-15);
    /* 3x3, one white (255) pixel in the centre of black, frame 0; frame 1 flat. Frame 0: L = -1020 at the centre,
     * +255 at its 4 neighbours, 0 at the corners: mean 0, E[L^2] = (1020^2 + 4 * 255^2) / 9 = 1300500 / 9 = 144500.
     * Frame 1: 0. v = 72250 -> 72250 / 72350. */
    grey_frame(v, 3, 3, 0, 0);
    grey_frame(v, 3, 3, 1, 0);
    px(v, 3, 3, 0, 1, 1, 255, 255, 255);
    REQUIRE_OK(reward_sharpness(&flat, NULL, NULL, &r));
    CHECK_NEAR(r, 72250.0 / 72350.0, 1e-15);
    /* A gentle horizontal ramp 0, 10, 20 in one 1x3 frame: L = 10, 0, -10 (ends replicated) -> v = 200 / 3,
     * r = (200/3) / (200/3 + 100) = 0.4. Blurry content scores low, the checkerboard near 1. */
    reward_video ramp = {v, 1, 1, 3};
    for (int x = 0; x < 3; x++) px(v, 1, 3, 0, 0, x, (uint8_t)(10 * x), (uint8_t)(10 * x), (uint8_t)(10 * x));
    REQUIRE_OK(reward_sharpness(&ramp, NULL, NULL, &r));
    CHECK_NEAR(r, 0.4, 1e-12);
}

TEST(reward_more_registry_and_errors) {
    const char *names[4] = {"colorfulness", "motion", "flicker", "sharpness"};
    const reward_fn fns[4] = {reward_colorfulness, reward_motion, reward_flicker, reward_sharpness};
    double r;
    reward_video null = {NULL, 1, 1, 1};
    uint8_t px1[3] = {1, 2, 3};
    reward_video bad = {px1, 1, 0, 1};
    for (int i = 0; i < 4; i++) {
        const reward_scorer *s = reward_find(names[i]);
        REQUIRE(s);
        CHECK_MSG(s->fn == fns[i] && s->lo == 0.0 && s->hi == 1.0 && !strcmp(s->name, names[i]), "%s", names[i]);
        CHECK_MSG(fns[i](&null, NULL, NULL, &r) == -1 && strstr(core_last_error(), names[i]) &&
                      strstr(core_last_error(), "video data is NULL"),
                  "%s: %s", names[i], core_last_error());
        CHECK_MSG(fns[i](&bad, NULL, NULL, &r) == -1 && strstr(core_last_error(), "has a dim < 1"), "%s", names[i]);
    }
    CHECK(reward_find("Motion") == NULL);

    /* Threaded paths (>= 2^16 pixels) equal a second call and stay in range; motion / flicker of a video whose
     * second half repeats its first frame-by-frame shift agree with a per-frame-pair recomputation. */
    const int64_t F = 3, H = 90, W = 400, n = F * H * W;
    uint8_t *v = malloc((size_t)(n * 3));
    float *u = malloc(sizeof(float) * (size_t)(n * 3));
    REQUIRE(v && u);
    test_fill_uniform(u, (size_t)(n * 3), 11, 0, 256);
    for (int64_t i = 0; i < n * 3; i++) v[i] = (uint8_t)u[i];
    reward_video vid = {v, F, H, W};
    for (int i = 0; i < 4; i++) {
        double a = -1, b = -2;
        REQUIRE_OK(fns[i](&vid, NULL, NULL, &a));
        REQUIRE_OK(fns[i](&vid, NULL, NULL, &b));
        CHECK_MSG(a == b && a > 0.0 && a < 1.0, "%s = %.17g / %.17g", names[i], a, b);
    }
    /* motion over 3 frames = mean of the motions of the two 2-frame videos (equal pixel counts per pair). */
    double m3, m01, m12;
    reward_video v01 = {v, 2, H, W}, v12 = {v + 3 * H * W, 2, H, W};
    REQUIRE_OK(reward_motion(&vid, NULL, NULL, &m3));
    REQUIRE_OK(reward_motion(&v01, NULL, NULL, &m01));
    REQUIRE_OK(reward_motion(&v12, NULL, NULL, &m12));
    CHECK_NEAR(m3, 0.5 * (m01 + m12), 1e-14);
    /* Independent uniform RGB noise: E|dY| for two independent lumas is about 0.21 * 255 (checked loosely). */
    CHECK_MSG(m3 > 0.15 && m3 < 0.3, "motion of noise = %g", m3);
    free(u);
    free(v);
}
