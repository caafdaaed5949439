/* tests/test_scorers.c — reward/scorers on synthetic videos: solid colours, split frames, prompt parsing and the
 * metadata override, brightness values computed by hand, the registry and error messages. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reward/scorers.h"
#include "tests/test.h"

/* A representative of each colour class, in reward_color order (names as in CSS/X11 where one exists). */
static const uint8_t solid[REWARD_N_COLORS][3] = {
    {220, 20, 60},   /* red (crimson) */
    {34, 139, 34},   /* green (forest green) */
    {30, 60, 220},   /* blue */
    {240, 230, 40},  /* yellow */
    {255, 140, 0},   /* orange (dark orange) */
    {128, 0, 128},   /* purple */
    {255, 105, 180}, /* pink (hot pink) */
    {12, 12, 12},    /* black */
    {245, 245, 245}, /* white (white smoke) */
};

static uint8_t *make_video(int64_t F, int64_t H, int64_t W) { return malloc((size_t)(F * H * W * 3)); }

static void fill(uint8_t *v, int64_t npix, const uint8_t rgb[3]) {
    for (int64_t i = 0; i < npix; i++) memcpy(v + 3 * i, rgb, 3);
}

TEST(reward_solid_colors_score_one_or_zero) {
    const int64_t F = 2, H = 5, W = 7;
    uint8_t *v = make_video(F, H, W);
    REQUIRE(v);
    reward_video vid = {v, F, H, W};
    for (int c = 0; c < REWARD_N_COLORS; c++) {
        fill(v, F * H * W, solid[c]);
        CHECK_MSG(reward_classify_pixel(solid[c][0], solid[c][1], solid[c][2]) == c, "class of %s",
                  reward_color_name(c));
        for (int d = 0; d < REWARD_N_COLORS; d++) {
            const char *k[1] = {"color"}, *val[1] = {reward_color_name(d)};
            reward_meta m = {1, k, val};
            double r = -1;
            REQUIRE_OK(reward_color_match(&vid, "a video", &m, &r));
            CHECK_MSG(r == (c == d ? 1.0 : 0.0), "%s video scored %g for %s", reward_color_name(c), r,
                      reward_color_name(d));
        }
    }
    free(v);
}

/* Hand-classified pixels, incl. the documented edge decisions. */
TEST(reward_classify_pixel_rules) {
    CHECK(reward_classify_pixel(128, 128, 128) == -1);            /* mid grey: none */
    CHECK(reward_classify_pixel(200, 200, 200) == REWARD_WHITE);  /* light grey, L 0.78 */
    CHECK(reward_classify_pixel(64, 64, 64) == REWARD_BLACK);     /* dark grey, L 0.25 */
    CHECK(reward_classify_pixel(80, 0, 0) == REWARD_BLACK);       /* L 0.157 < 0.20 */
    CHECK(reward_classify_pixel(128, 0, 0) == REWARD_RED);        /* maroon, L 0.25 */
    CHECK(reward_classify_pixel(255, 182, 193) == REWARD_PINK);   /* light pink: red hue, L 0.86 > 0.70 */
    CHECK(reward_classify_pixel(255, 230, 230) == REWARD_WHITE);  /* L 0.95 > 0.90 */
    CHECK(reward_classify_pixel(0, 255, 255) == REWARD_BLUE);     /* cyan, hue 180 */
    CHECK(reward_classify_pixel(139, 69, 19) == REWARD_ORANGE);   /* saddle brown, hue 25 */
    CHECK(reward_classify_pixel(255, 0, 255) == REWARD_PURPLE);   /* magenta, hue 300 */
    CHECK(reward_classify_pixel(255, 215, 0) == REWARD_YELLOW);   /* gold, hue 50.6 */
    CHECK(reward_classify_pixel(154, 205, 50) == REWARD_GREEN);   /* yellow green, hue 80 */
    /* Hue boundaries: (255, 63.75, 0) would be hue 15; 63 -> 14.8 (red), 64 -> 15.06 (orange). */
    CHECK(reward_classify_pixel(255, 63, 0) == REWARD_RED && reward_classify_pixel(255, 64, 0) == REWARD_ORANGE);
    /* Lightness boundary of black: max + min = 101 -> L 0.198 (black), 102 -> L 0.2 (classified by hue). */
    CHECK(reward_classify_pixel(101, 0, 0) == REWARD_BLACK && reward_classify_pixel(102, 0, 0) == REWARD_RED);
}

/* Half the pixels of every frame in one colour: 0.5 for each half's colour, 0 for a third. */
TEST(reward_half_frames_score_half) {
    const int64_t F = 3, H = 4, W = 6;
    uint8_t *v = make_video(F, H, W);
    REQUIRE(v);
    for (int64_t f = 0; f < F; f++)
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) memcpy(v + 3 * ((f * H + y) * W + x), solid[x < W / 2 ? REWARD_RED : REWARD_BLUE], 3);
    reward_video vid = {v, F, H, W};
    double r;
    REQUIRE_OK(reward_color_match(&vid, "a red car", NULL, &r));
    CHECK(r == 0.5);
    REQUIRE_OK(reward_color_match(&vid, "a blue car", NULL, &r));
    CHECK(r == 0.5);
    REQUIRE_OK(reward_color_match(&vid, "a green car", NULL, &r));
    CHECK(r == 0.0);
    /* One frame of three fully red, the others white: 1/3. */
    fill(v, F * H * W, solid[REWARD_WHITE]);
    fill(v, H * W, solid[REWARD_RED]);
    REQUIRE_OK(reward_color_match(&vid, "a red car", NULL, &r));
    CHECK_NEAR(r, 1.0 / 3.0, 1e-15);
    free(v);
}

TEST(reward_prompt_and_metadata_target) {
    CHECK(reward_color_in_prompt("a red car") == REWARD_RED);
    CHECK(reward_color_in_prompt("A Red Car") == REWARD_RED);
    CHECK(reward_color_in_prompt("an orange bicycle") == REWARD_ORANGE);
    CHECK(reward_color_in_prompt("a car, white and black") == REWARD_WHITE); /* earliest word wins */
    CHECK(reward_color_in_prompt("the blue-green sea") == REWARD_BLUE);
    CHECK(reward_color_in_prompt("red") == REWARD_RED);
    CHECK(reward_color_in_prompt("a reddish car") == -1);  /* not a whole word */
    CHECK(reward_color_in_prompt("a bored cat") == -1);    /* "red" inside a word */
    CHECK(reward_color_in_prompt("pinkish redwood") == -1);
    CHECK(reward_color_in_prompt("") == -1 && reward_color_in_prompt(NULL) == -1);

    int c = -1;
    const char *k[2] = {"style", "color"}, *v1[2] = {"x", "Green"}, *v2[2] = {"x", "teal"};
    reward_meta m1 = {2, k, v1}, m2 = {2, k, v2};
    REQUIRE_OK(reward_target_color("a red car", &m1, &c));
    CHECK(c == REWARD_GREEN); /* metadata overrides the prompt */
    REQUIRE_OK(reward_target_color("a red car", NULL, &c));
    CHECK(c == REWARD_RED);
    CHECK(reward_target_color("a red car", &m2, &c) == -1);
    CHECK(strstr(core_last_error(), "metadata color 'teal' is not one of red, green, blue") != NULL);
    CHECK(reward_target_color("a fast car", NULL, &c) == -1);
    CHECK(strstr(core_last_error(), "no colour word") && strstr(core_last_error(), "'a fast car'"));

    /* Through the scorer: a solid green video scores 1 for prompt "a red car" with metadata green, 0 without. */
    uint8_t *v = make_video(1, 2, 2);
    REQUIRE(v);
    fill(v, 4, solid[REWARD_GREEN]);
    reward_video vid = {v, 1, 2, 2};
    double r;
    REQUIRE_OK(reward_color_match(&vid, "a red car", &m1, &r));
    CHECK(r == 1.0);
    REQUIRE_OK(reward_color_match(&vid, "a red car", NULL, &r));
    CHECK(r == 0.0);
    CHECK(reward_color_match(&vid, "a car", NULL, &r) == -1 && strstr(core_last_error(), "color_match"));
    free(v);
}

TEST(reward_brightness_values) {
    uint8_t *v = make_video(2, 3, 4);
    REQUIRE(v);
    reward_video vid = {v, 2, 3, 4};
    double r;
    const uint8_t black[3] = {0, 0, 0}, white[3] = {255, 255, 255}, red[3] = {255, 0, 0}, mix[3] = {100, 150, 200};
    fill(v, 24, black);
    REQUIRE_OK(reward_brightness(&vid, NULL, NULL, &r));
    CHECK(r == 0.0);
    fill(v, 24, white);
    REQUIRE_OK(reward_brightness(&vid, "ignored", NULL, &r));
    CHECK(r == 1.0);
    fill(v, 24, red);
    REQUIRE_OK(reward_brightness(&vid, NULL, NULL, &r));
    CHECK_NEAR(r, 0.299, 1e-15); /* Rec. 601 red weight */
    fill(v, 24, mix);
    REQUIRE_OK(reward_brightness(&vid, NULL, NULL, &r));
    CHECK_NEAR(r, (0.299 * 100 + 0.587 * 150 + 0.114 * 200) / 255.0, 1e-12);
    fill(v, 12, white); /* first frame white, second black */
    fill(v + 36, 12, black);
    REQUIRE_OK(reward_brightness(&vid, NULL, NULL, &r));
    CHECK(r == 0.5);
    free(v);
}

TEST(reward_registry_and_errors) {
    CHECK(reward_scorer_count() == 11); /* 7 pure, then clip_score, pickscore, hpsv2, aesthetic (learned) */
    const reward_scorer *s = reward_find("color_match");
    REQUIRE(s);
    CHECK(s->fn == reward_color_match && s->lo == 0.0 && s->hi == 1.0);
    s = reward_find("brightness");
    REQUIRE(s);
    CHECK(s->fn == reward_brightness);
    CHECK(reward_find("aesthetics") == NULL);
    CHECK(strstr(core_last_error(), "unknown reward scorer 'aesthetics' (known: color_match, brightness, "
                                    "colorfulness, motion, flicker, sharpness, first_frame_consistency, clip_score, "
                                    "pickscore, hpsv2, aesthetic)") != NULL);
    CHECK(reward_scorer_at(0) != NULL && reward_scorer_at(11) == NULL && reward_scorer_at(-1) == NULL);
    for (int i = 0; i < reward_scorer_count(); i++) /* the learned ones: no pure function, a model folder */
        CHECK_MSG(!reward_scorer_at(i)->fn == (i >= 7) && reward_scorer_at(i)->learned == (i >= 7), "%d", i);

    /* Every scorer stays in its range on a random video (large enough for the threaded path). */
    const int64_t F = 3, H = 80, W = 300;
    uint8_t *v = make_video(F, H, W);
    REQUIRE(v);
    float *u = malloc(sizeof(float) * F * H * W * 3);
    REQUIRE(u);
    test_fill_uniform(u, (size_t)(F * H * W * 3), 5, 0, 256);
    for (int64_t i = 0; i < F * H * W * 3; i++) v[i] = (uint8_t)u[i];
    reward_video vid = {v, F, H, W};
    for (int i = 0; i < reward_scorer_count(); i++) {
        s = reward_scorer_at(i);
        if (s->learned) continue; /* tests/test_reward_learned.c */
        double r = -1;
        REQUIRE_OK(s->fn(&vid, "a purple flower", NULL, &r));
        CHECK_MSG(r >= s->lo && r <= s->hi && r > 0.0, "%s = %g", s->name, r);
    }
    free(u);

    double r;
    reward_video bad = {v, 0, 2, 2};
    CHECK(reward_brightness(&bad, NULL, NULL, &r) == -1 && strstr(core_last_error(), "brightness: video shape"));
    reward_video null = {NULL, 1, 1, 1};
    CHECK(reward_color_match(&null, "red", NULL, &r) == -1 && strstr(core_last_error(), "color_match: video data"));
    free(v);
}

/* reward_score_weighted: each scorer's reward in order and the total sum of weight x reward in double (the sum the
 * reward server and the in-process source both take); a failing scorer is named by its index. */
TEST(reward_score_weighted_total_in_scorer_order) {
    const int64_t F = 2, H = 3, W = 4;
    uint8_t *v = make_video(F, H, W);
    REQUIRE(v);
    fill(v, F * H * W, solid[REWARD_RED]);
    const reward_video vid = {v, F, H, W};
    const reward_weighted sc[2] = {{.scorer = reward_find("color_match"), .weight = 0.25},
                                   {.scorer = reward_find("brightness"), .weight = -3.0}};
    REQUIRE(sc[0].scorer && sc[1].scorer);
    double vals[2], total = 0, b;
    int failed = -1;
    REQUIRE_OK(reward_score_weighted(sc, 2, &vid, "a red car", NULL, vals, &total, &failed));
    REQUIRE_OK(sc[1].scorer->fn(&vid, "a red car", NULL, &b));
    CHECK(vals[0] == 1.0 && vals[1] == b && failed == -1);
    CHECK(total == 0.25 * 1.0 + -3.0 * b);
    CHECK(reward_score_weighted(sc, 2, &vid, "no colour word", NULL, vals, &total, &failed) == -1 && failed == 0);
    free(v);
}
