/* reward/scorers.h — built-in reward scorers: pure functions of one video, its prompt and its metadata, and the
 * registry that finds them by name (the reward server and local mode call them; DESIGN.md sections 3 and 4).
 *
 * A video is U8 RGB [F, H, W, 3], row-major, as in the `score_request` message. A scorer returns 0 and writes a
 * finite reward in its documented range, or returns -1 with core_error naming the scorer and what is wrong.
 * Scorers keep no state; any number of threads may call them at once. Their sums are integer counts, so results
 * do not depend on thread count or order.
 *
 * Scorers:
 *   color_match  share of pixels whose colour class (reward_classify_pixel) is the target colour, in [0, 1].
 *                Target: metadata "color" when present (one of the nine words, any letter case), else the first of
 *                the nine VBench colour words (red, green, blue, yellow, orange, purple, pink, black, white) that
 *                occurs in the prompt as a whole word (earliest position; case-insensitive; word characters are
 *                ASCII letters and digits). Error when neither names a colour, or metadata names another colour.
 *                Follows the idea of VBench's "color" dimension (Huang et al., CVPR 2024), which asks whether the
 *                generated object has the prompted colour; this is a pixel-statistics proxy, not VBench's detector.
 *   brightness   mean Rec. 601 luma / 255, Y = 0.299 R + 0.587 G + 0.114 B (ITU-R BT.601 weights on the stored,
 *                gamma-encoded values), in [0, 1]; prompt and metadata are ignored. */
#ifndef REWARD_SCORERS_H
#define REWARD_SCORERS_H

#include <stdint.h>

/* A borrowed video: frames x height x width RGB pixels (3 bytes each), contiguous. */
typedef struct {
    const uint8_t *data;
    int64_t frames, height, width;
} reward_video;

/* A borrowed string map (the per-video "metadata" of a score_request). n may be 0; keys/values then unused. */
typedef struct {
    int n;
    const char *const *keys;
    const char *const *values;
} reward_meta;

/* Value of `key`, or NULL when absent (or meta is NULL). The first entry wins if a key repeats. */
const char *reward_meta_get(const reward_meta *meta, const char *key);

/* The scorer signature. prompt may be NULL (treated as ""), meta may be NULL (no metadata). */
typedef int (*reward_fn)(const reward_video *video, const char *prompt, const reward_meta *meta, double *out);

typedef struct {
    const char *name; /* registry name, as recipes spell it */
    reward_fn fn;
    double lo, hi;    /* the range every reward of this scorer lies in */
    const char *summary;
} reward_scorer;

/* The scorer called `name`, or NULL with core_error listing the known names. */
const reward_scorer *reward_find(const char *name);
/* Number of registered scorers and scorer i (0 <= i < count; NULL outside), in registry order. */
int reward_scorer_count(void);
const reward_scorer *reward_scorer_at(int i);

/* ---- Colour classes ---- */

typedef enum {
    REWARD_RED = 0,
    REWARD_GREEN,
    REWARD_BLUE,
    REWARD_YELLOW,
    REWARD_ORANGE,
    REWARD_PURPLE,
    REWARD_PINK,
    REWARD_BLACK,
    REWARD_WHITE,
    REWARD_N_COLORS
} reward_color;

/* "red", "green", ... ; NULL outside the enum. */
const char *reward_color_name(int color);
/* The colour called `name` (case-insensitive, exact word), or -1. */
int reward_color_from_name(const char *name);
/* The first colour word in `prompt` (earliest whole-word occurrence, case-insensitive), or -1 when none. */
int reward_color_in_prompt(const char *prompt);

/* The colour class of one pixel, or -1 (grey or not clearly any of the nine). With HSL values computed from the
 * 8-bit channels: max, min of (R, G, B); L = (max + min) / 510; S = (max - min) / min(max + min, 510 - max - min)
 * (0 when max == min); hue H in degrees [0, 360) (the usual hexagonal formula). Rules, first match wins:
 *   1. L < 0.20                       -> black   (very dark, any hue)
 *   2. L > 0.90                       -> white   (very light, any hue: faint tints read as white)
 *   3. S < 0.25: L >= 0.70 -> white, L <= 0.30 -> black, else -1 (mid grey)
 *   4. by hue:  [345, 360) or [0, 15): red if L <= 0.70, else pink (light red reads as pink)
 *               [15, 45) orange (browns included)   [45, 70) yellow     [70, 170) green
 *               [170, 260) blue (cyan included)     [260, 320) purple (magenta included)   [320, 345) pink
 * The classes partition the RGB cube (with -1 for greys), so a solid colour scores 1 for its class and exactly 0
 * for the eight others. */
int reward_classify_pixel(uint8_t r, uint8_t g, uint8_t b);

/* The target colour of color_match for this prompt and metadata (rules above). Returns 0 and sets *color, or -1
 * with an error naming the metadata value or quoting the prompt. */
int reward_target_color(const char *prompt, const reward_meta *meta, int *color);

/* ---- Scorers (also reachable through the registry) ---- */

/* color_match (see the top of this file). Errors: bad video (NULL data, a dim < 1, size overflow), no target. */
int reward_color_match(const reward_video *video, const char *prompt, const reward_meta *meta, double *out);
/* brightness (see the top of this file). Errors: bad video. */
int reward_brightness(const reward_video *video, const char *prompt, const reward_meta *meta, double *out);

#endif
