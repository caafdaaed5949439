/* reward/scorers.h — built-in reward scorers: pure functions of one video, its prompt and its metadata, and the
 * registry that finds them by name (the reward server and local mode call them; docs/design.md sections 3 and 4).
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
 *                gamma-encoded values), in [0, 1]; prompt and metadata are ignored.
 *
 * Video-statistics scorers (prompt and metadata ignored; Y is the Rec. 601 luma above, in [0, 255]; "highpass" of a
 * frame is h = Y - (mean of the 4 neighbours), with a neighbour outside the frame replaced by the pixel itself):
 *   colorfulness min(M / 150, 1) in [0, 1], with M the colourfulness metric of Hasler and Suesstrunk ("Measuring
 *                colourfulness in natural images", SPIE Human Vision and Electronic Imaging 2003):
 *                M = sqrt(std_rg^2 + std_yb^2) + 0.3 sqrt(mean_rg^2 + mean_yb^2), rg = R - G, yb = (R + G) / 2 - B,
 *                means and population standard deviations over all pixels of all frames. A grey video scores 0;
 *                solid pure red scores 0.3 * 255 * sqrt(1.25) / 150 = 0.5702. The paper's "extremely colourful"
 *                class starts near M = 109, so 150 leaves headroom; M reaches about 300 at most (then clamped).
 *   motion       mean |Y_t - Y_{t-1}| / 255 over consecutive frame pairs and all pixels, in [0, 1]; 0 for 1 frame.
 *   flicker      1 - min(1, 2 D), D = mean |h_t - h_{t-1}| / 255 over consecutive frame pairs and all pixels, in
 *                [0, 1]: 1 for a static video or one frame, lower when fine detail changes between frames (k = 2:
 *                D = 0.5, a mean high-pass change of half the luma range, scores 0). A uniform change of the whole
 *                frame leaves h unchanged and is not penalised (motion sees it).
 *   sharpness    v / (v + 100) in [0, 1), with v the variance over the pixels of a frame of the 4-neighbour Laplacian
 *                of Y (sum of the 4 neighbours - 4 Y, edges replicated), averaged over frames: the variance-of-
 *                Laplacian focus measure (Pech-Pacheco et al., ICPR 2000). c = 100 is the usual blur threshold for it,
 *                so a video at that threshold scores 0.5. A flat video scores 0.
 *   first_frame_consistency
 *                1 - D in [0, 1], D = mean |x_t - x_0| / 255 over every pixel and channel of frames t = 1 .. F-1 (x_0
 *                the same pixel of frame 0); 1 for one frame or a video that never leaves its first frame. Made for
 *                image to video (Wan 2.2 TI2V, model/flow/first_frame.h): there frame 0 is the decoded input image (the
 *                decode of its latent), so the score is the generated frames' pixel agreement with the input image as
 *                the decoder shows it, and needs nothing but the video (in-process scoring and reward servers alike).
 *                On a text-to-video clip it measures how far the video drifts from its first frame.
 * These sums are exact integers except sharpness, which sums each frame in double in pixel order, frames in order;
 * all results are deterministic. */
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
    reward_fn fn;     /* NULL for a learned scorer */
    double lo, hi;    /* the range every reward of this scorer lies in (learned: the range for real models) */
    const char *summary;
    int learned;      /* 1: model-backed (reward/learned.h): needs a model folder, scored through reward_weighted.model */
    const char *learned_folder; /* learned: the usual hub folder, for messages */
} reward_scorer;

/* A learned scorer's loaded model (reward/learned.h) and its scoring function (reward_model_score, set by
 * reward_models_attach: called through the pointer so that this file does not link the CLIP). */
typedef struct reward_model reward_model;

/* The scorer called `name`, or NULL with core_error listing the known names. The learned scorers (clip_score,
 * pickscore, hpsv2, aesthetic: reward/learned.h) are found too; callers that cannot load models refuse them. */
const reward_scorer *reward_find(const char *name);
/* Number of registered scorers and scorer i (0 <= i < count; NULL outside), in registry order. */
int reward_scorer_count(void);
const reward_scorer *reward_scorer_at(int i);

/* A scorer and its weight in the total (reward.scorers, reward.weights; a reward server's --scorer NAME:W). */
typedef struct {
    const reward_scorer *scorer;
    double weight;
    reward_model *model; /* a learned scorer's model (reward_models_attach); NULL for the others */
    int (*model_fn)(reward_model *model, const reward_video *video, const char *prompt, double *out);
    /* the same for n videos of one shape at once (reward_model_score_batch: the reward server's requests) */
    int (*model_batch_fn)(reward_model *model, const reward_video *videos, const char *const *prompts, int n,
                          double *out);
} reward_weighted;

/* Scores one video with n weighted scorers in their order: vals[i] = scorer i's reward and *total = the sum of
 * weight x reward in double, in scorer order. This is the one place the weighted total is summed: the reward server's
 * reply (reward/server_requests.c) and the in-process rollout source (rollout/source_local.c) both take it from here,
 * so a local run's totals equal a colocated one's. A learned scorer is scored by reward_model_score with its model
 * (an error when none is attached). 0, or -1 with the failing scorer's error (not prefixed; *failed = its index, for
 * the caller's prefix). */
int reward_score_weighted(const reward_weighted *sc, int n, const reward_video *video, const char *prompt,
                          const reward_meta *meta, double *vals, double *total, int *failed);

/* reward_score_weighted with some rewards known: given[i] (given may be NULL; NaN: not given) is taken as scorer i's
 * reward instead of scoring (the reward server's batched learned scorers); the total is summed as there. */
int reward_score_weighted_given(const reward_weighted *sc, int n, const reward_video *video, const char *prompt,
                                const reward_meta *meta, const double *given, double *vals, double *total, int *failed);

/* One scorer of a weighted list on one video (sc->scorer->fn, or the learned model): 0 or -1 (error unprefixed). */
int reward_score_one(const reward_weighted *sc, const reward_video *video, const char *prompt, const reward_meta *meta,
                     double *out);

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

/* The constants of the scorers below (see the top of this file). */
#define REWARD_COLORFULNESS_SCALE 150.0
#define REWARD_FLICKER_K 2.0
#define REWARD_SHARPNESS_C 100.0

/* colorfulness, motion, flicker, sharpness (see the top of this file): one video U8 [F, H, W, 3] -> *out in
 * [0, 1]. Errors: bad video (NULL data, a dim < 1, size overflow). */
int reward_colorfulness(const reward_video *video, const char *prompt, const reward_meta *meta, double *out);
int reward_motion(const reward_video *video, const char *prompt, const reward_meta *meta, double *out);
int reward_flicker(const reward_video *video, const char *prompt, const reward_meta *meta, double *out);
int reward_sharpness(const reward_video *video, const char *prompt, const reward_meta *meta, double *out);
int reward_first_frame_consistency(const reward_video *video, const char *prompt, const reward_meta *meta, double *out);

#endif
