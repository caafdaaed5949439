/* reward/scorers.c — the built-in reward scorers and their registry (see reward/scorers.h). */
#include "reward/scorers.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"

static const char *const color_names[REWARD_N_COLORS] = {"red",    "green",  "blue", "yellow", "orange",
                                                         "purple", "pink", "black", "white"};

const char *reward_meta_get(const reward_meta *meta, const char *key)
{
    if (!meta || !key) return NULL;
    for (int i = 0; i < meta->n; i++)
        if (meta->keys[i] && !strcmp(meta->keys[i], key)) return meta->values[i];
    return NULL;
}

const char *reward_color_name(int color) { return color >= 0 && color < REWARD_N_COLORS ? color_names[color] : NULL; }

int reward_color_from_name(const char *name)
{
    if (!name) return -1;
    for (int c = 0; c < REWARD_N_COLORS; c++)
        if (!strcasecmp(name, color_names[c])) return c;
    return -1;
}

static int is_word_char(char ch) { return isalnum((unsigned char)ch) != 0; }

int reward_color_in_prompt(const char *prompt)
{
    if (!prompt) return -1;
    for (const char *p = prompt; *p; p++) {
        if (p > prompt && is_word_char(p[-1])) continue; /* not at a word start */
        for (int c = 0; c < REWARD_N_COLORS; c++) {
            const size_t len = strlen(color_names[c]);
            if (!strncasecmp(p, color_names[c], len) && !is_word_char(p[len])) return c;
        }
    }
    return -1;
}

int reward_classify_pixel(uint8_t r, uint8_t g, uint8_t b)
{
    const int mx = r > g ? (r > b ? r : b) : (g > b ? g : b);
    const int mn = r < g ? (r < b ? r : b) : (g < b ? g : b);
    const int sum = mx + mn, chroma = mx - mn;
    const double L = sum / 510.0;
    if (L < 0.20) return REWARD_BLACK;
    if (L > 0.90) return REWARD_WHITE;
    const int span = sum < 510 - sum ? sum : 510 - sum; /* > 0 here since 0.2 <= L <= 0.9 */
    const double S = (double)chroma / span;
    if (S < 0.25) {
        if (L >= 0.70) return REWARD_WHITE;
        if (L <= 0.30) return REWARD_BLACK;
        return -1;
    }
    double h;
    if (mx == r) h = 60.0 * (double)(g - b) / chroma;
    else if (mx == g) h = 60.0 * ((double)(b - r) / chroma + 2.0);
    else h = 60.0 * ((double)(r - g) / chroma + 4.0);
    if (h < 0.0) h += 360.0;
    if (h >= 345.0 || h < 15.0) return L <= 0.70 ? REWARD_RED : REWARD_PINK;
    if (h < 45.0) return REWARD_ORANGE;
    if (h < 70.0) return REWARD_YELLOW;
    if (h < 170.0) return REWARD_GREEN;
    if (h < 260.0) return REWARD_BLUE;
    if (h < 320.0) return REWARD_PURPLE;
    return REWARD_PINK;
}

static void list_colors(char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = 0;
    for (int c = 0; c < REWARD_N_COLORS && o < cap; c++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", c ? ", " : "", color_names[c]);
}

int reward_target_color(const char *prompt, const reward_meta *meta, int *color)
{
    char known[128];
    const char *m = reward_meta_get(meta, "color");
    if (m) {
        const int c = reward_color_from_name(m);
        if (c < 0) {
            list_colors(known, sizeof known);
            return core_error("color_match: metadata color '%.60s' is not one of %s", m, known);
        }
        *color = c;
        return 0;
    }
    const int c = reward_color_in_prompt(prompt);
    if (c < 0) {
        list_colors(known, sizeof known);
        return core_error("color_match: no colour word (%s) in prompt '%.120s' and no metadata 'color'", known,
                          prompt ? prompt : "");
    }
    *color = c;
    return 0;
}

/* Checks the video and returns its pixel count (> 0), or -1 with an error naming the scorer. */
static int64_t check_video(const reward_video *v, const char *scorer)
{
    if (!v || !v->data) return core_error("%s: video data is NULL", scorer);
    if (v->frames < 1 || v->height < 1 || v->width < 1)
        return core_error("%s: video shape [%lld, %lld, %lld, 3] has a dim < 1", scorer, (long long)v->frames,
                          (long long)v->height, (long long)v->width);
    const int64_t lim = INT64_MAX / 3;
    if (v->frames > lim / v->height || v->frames * v->height > lim / v->width)
        return core_error("%s: video shape [%lld, %lld, %lld, 3] overflows", scorer, (long long)v->frames,
                          (long long)v->height, (long long)v->width);
    return v->frames * v->height * v->width;
}

int reward_color_match(const reward_video *video, const char *prompt, const reward_meta *meta, double *out)
{
    const int64_t n = check_video(video, "color_match");
    if (n < 0) return -1;
    int target;
    if (reward_target_color(prompt, meta, &target)) return -1;
    int64_t hits = 0;
    const uint8_t *p = video->data;
#pragma omp parallel for reduction(+ : hits) schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; i++) hits += reward_classify_pixel(p[3 * i], p[3 * i + 1], p[3 * i + 2]) == target;
    *out = (double)hits / (double)n;
    return 0;
}

int reward_brightness(const reward_video *video, const char *prompt, const reward_meta *meta, double *out)
{
    const int64_t n = check_video(video, "brightness");
    if (n < 0) return -1;
    /* 1000 * Y summed exactly in integers: 299 R + 587 G + 114 B <= 255000 per pixel. */
    uint64_t sum = 0;
    const uint8_t *p = video->data;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; i++) sum += 299u * p[3 * i] + 587u * p[3 * i + 1] + 114u * p[3 * i + 2];
    *out = (double)sum / (255000.0 * (double)n);
    return 0;
}

/* ---- Video-statistics scorers (prompt and metadata ignored) ---- */

/* 1000 x Rec. 601 luma of pixel i, exact in integers: 299 R + 587 G + 114 B, in [0, 255000]. */
static inline int64_t luma1000(const uint8_t *p, int64_t i)
{
    return 299 * (int64_t)p[3 * i] + 587 * (int64_t)p[3 * i + 1] + 114 * (int64_t)p[3 * i + 2];
}

/* 4 x 1000 x (Y - mean of the 4 neighbours) at (y, x) of one frame, neighbours outside the frame replaced by the
 * pixel itself (edge replication). Exact integer, |value| <= 1020000. */
static int64_t highpass4000(const uint8_t *f, int64_t H, int64_t W, int64_t y, int64_t x)
{
    const int64_t c = luma1000(f, y * W + x);
    const int64_t up = y > 0 ? luma1000(f, (y - 1) * W + x) : c;
    const int64_t dn = y + 1 < H ? luma1000(f, (y + 1) * W + x) : c;
    const int64_t lf = x > 0 ? luma1000(f, y * W + x - 1) : c;
    const int64_t rt = x + 1 < W ? luma1000(f, y * W + x + 1) : c;
    return 4 * c - up - dn - lf - rt;
}

int reward_colorfulness(const reward_video *video, const char *prompt, const reward_meta *meta, double *out)
{
    const int64_t n = check_video(video, "colorfulness");
    if (n < 0) return -1;
    /* Exact integer sums of rg = R - G and yb2 = 2 yb = R + G - 2B and of their squares. */
    int64_t s_rg = 0, s_yb2 = 0;
    uint64_t q_rg = 0, q_yb2 = 0;
    const uint8_t *p = video->data;
#pragma omp parallel for reduction(+ : s_rg, s_yb2, q_rg, q_yb2) schedule(static) if (n >= (1 << 16))
    for (int64_t i = 0; i < n; i++) {
        const int64_t rg = (int64_t)p[3 * i] - p[3 * i + 1];
        const int64_t yb2 = (int64_t)p[3 * i] + p[3 * i + 1] - 2 * (int64_t)p[3 * i + 2];
        s_rg += rg;
        s_yb2 += yb2;
        q_rg += (uint64_t)(rg * rg);
        q_yb2 += (uint64_t)(yb2 * yb2);
    }
    const double nd = (double)n;
    const double m_rg = (double)s_rg / nd, m_yb = 0.5 * (double)s_yb2 / nd;
    double v_rg = (double)q_rg / nd - m_rg * m_rg, v_yb = 0.25 * (double)q_yb2 / nd - m_yb * m_yb;
    if (v_rg < 0.0) v_rg = 0.0; /* rounding only */
    if (v_yb < 0.0) v_yb = 0.0;
    const double M = sqrt(v_rg + v_yb) + 0.3 * sqrt(m_rg * m_rg + m_yb * m_yb);
    const double r = M / REWARD_COLORFULNESS_SCALE;
    *out = r > 1.0 ? 1.0 : r;
    return 0;
}

int reward_motion(const reward_video *video, const char *prompt, const reward_meta *meta, double *out)
{
    const int64_t n = check_video(video, "motion");
    if (n < 0) return -1;
    if (video->frames == 1) {
        *out = 0.0;
        return 0;
    }
    const int64_t fp = video->height * video->width, m = n - fp; /* pixels in frames 1..F-1 */
    uint64_t sum = 0;
    const uint8_t *p = video->data;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (m >= (1 << 16))
    for (int64_t i = 0; i < m; i++) {
        const int64_t d = luma1000(p, i + fp) - luma1000(p, i);
        sum += (uint64_t)(d < 0 ? -d : d);
    }
    *out = (double)sum / (255000.0 * (double)m);
    return 0;
}

int reward_flicker(const reward_video *video, const char *prompt, const reward_meta *meta, double *out)
{
    const int64_t n = check_video(video, "flicker");
    if (n < 0) return -1;
    if (video->frames == 1) {
        *out = 1.0;
        return 0;
    }
    const int64_t H = video->height, W = video->width, fp = H * W, m = n - fp;
    uint64_t sum = 0;
    const uint8_t *p = video->data;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (m >= (1 << 16))
    for (int64_t i = 0; i < m; i++) {
        const int64_t t = i / fp + 1, y = (i % fp) / W, x = i % W;
        const int64_t d = highpass4000(p + 3 * t * fp, H, W, y, x) - highpass4000(p + 3 * (t - 1) * fp, H, W, y, x);
        sum += (uint64_t)(d < 0 ? -d : d);
    }
    const double d = REWARD_FLICKER_K * (double)sum / (4.0 * 255000.0 * (double)m);
    *out = d >= 1.0 ? 0.0 : 1.0 - d;
    return 0;
}

int reward_sharpness(const reward_video *video, const char *prompt, const reward_meta *meta, double *out)
{
    if (check_video(video, "sharpness") < 0) return -1;
    const int64_t F = video->frames, H = video->height, W = video->width, fp = H * W;
    /* Laplacian in luma units is -highpass4000 / 1000; frames in order, pixels in order, sums in double. */
    double acc = 0.0;
    for (int64_t t = 0; t < F; t++) {
        const uint8_t *f = video->data + 3 * t * fp;
        double s = 0.0, q = 0.0;
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) {
                const double l = (double)highpass4000(f, H, W, y, x) / 1000.0;
                s += l;
                q += l * l;
            }
        const double mean = s / (double)fp;
        const double v = q / (double)fp - mean * mean;
        acc += v > 0.0 ? v : 0.0;
    }
    const double v = acc / (double)F;
    *out = v / (v + REWARD_SHARPNESS_C);
    return 0;
}

int reward_first_frame_consistency(const reward_video *video, const char *prompt, const reward_meta *meta, double *out)
{
    const int64_t n = check_video(video, "first_frame_consistency");
    if (n < 0) return -1;
    if (video->frames == 1) {
        *out = 1.0;
        return 0;
    }
    const int64_t fp3 = 3 * video->height * video->width, m = 3 * n - fp3; /* channel values of frames 1..F-1 */
    uint64_t sum = 0;
    const uint8_t *p = video->data;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (m >= (1 << 16))
    for (int64_t i = 0; i < m; i++) {
        const int d = (int)p[fp3 + i] - (int)p[i % fp3];
        sum += (uint64_t)(d < 0 ? -d : d);
    }
    *out = 1.0 - (double)sum / (255.0 * (double)m);
    return 0;
}

/* ---- Registry ---- */

static const reward_scorer registry[] = {
    {"color_match", reward_color_match, 0.0, 1.0,
     "share of pixels in the colour named by metadata 'color' or the prompt (VBench colour words)", 0, NULL},
    {"brightness", reward_brightness, 0.0, 1.0, "mean Rec. 601 luma / 255", 0, NULL},
    {"colorfulness", reward_colorfulness, 0.0, 1.0, "Hasler-Suesstrunk colourfulness M / 150, clamped to 1", 0, NULL},
    {"motion", reward_motion, 0.0, 1.0, "mean |luma difference| of consecutive frames / 255", 0, NULL},
    {"flicker", reward_flicker, 0.0, 1.0, "1 - 2 x mean |change of high-pass luma| / 255, clamped; 1 = steady", 0, NULL},
    {"sharpness", reward_sharpness, 0.0, 1.0, "variance of the luma Laplacian v, as v / (v + 100)", 0, NULL},
    {"first_frame_consistency", reward_first_frame_consistency, 0.0, 1.0,
     "1 - mean |frame t - frame 0| / 255 over t >= 1 (image to video: frame 0 is the input image)", 0, NULL},
    /* learned scorers (reward/learned.h): ranges for real models (logit scales up to 100) */
    {"clip_score", NULL, -100.0 / 30.0, 100.0 / 30.0,
     "CLIP logit exp(logit_scale) cos(image, prompt) / 30 (flow_grpo), mean over reward.frames", 1,
     "clip-vit-large-patch14"},
    {"pickscore", NULL, -100.0 / 26.0, 100.0 / 26.0,
     "PickScore exp(logit_scale) cos(image, prompt) / 26 (flow_grpo), mean over reward.frames", 1, "PickScore_v1"},
    {"hpsv2", NULL, -1.0, 1.0, "HPSv2 cos(image, prompt) (open_clip ViT-H-14), mean over reward.frames", 1, "HPSv2.1"},
    {"aesthetic", NULL, -1e4, 1e4, "LAION aesthetic MLP on the normalised CLIP ViT-L/14 image embedding, mean over "
     "reward.frames", 1, "clip-vit-large-patch14-aesthetic"},
};
#define N_SCORERS ((int)(sizeof registry / sizeof registry[0]))

int reward_scorer_count(void) { return N_SCORERS; }

const reward_scorer *reward_scorer_at(int i) { return i >= 0 && i < N_SCORERS ? &registry[i] : NULL; }

const reward_scorer *reward_find(const char *name)
{
    for (int i = 0; name && i < N_SCORERS; i++)
        if (!strcmp(registry[i].name, name)) return &registry[i];
    char known[256];
    size_t o = 0;
    known[0] = 0;
    for (int i = 0; i < N_SCORERS && o < sizeof known; i++)
        o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", i ? ", " : "", registry[i].name);
    core_error("unknown reward scorer '%.60s' (known: %s)", name ? name : "(null)", known);
    return NULL;
}

int reward_score_one(const reward_weighted *sc, const reward_video *video, const char *prompt, const reward_meta *meta,
                     double *out) {
    if (sc->scorer->fn) return sc->scorer->fn(video, prompt, meta, out);
    if (!sc->model || !sc->model_fn)
        return core_error("%s: no model loaded (a learned scorer needs reward.models.%s)", sc->scorer->name,
                          sc->scorer->name);
    return sc->model_fn(sc->model, video, prompt, out);
}

int reward_score_weighted_given(const reward_weighted *sc, int n, const reward_video *video, const char *prompt,
                                const reward_meta *meta, const double *given, double *vals, double *total, int *failed) {
    double t = 0;
    for (int i = 0; i < n; i++) {
        if (given && !isnan(given[i])) vals[i] = given[i];
        else if (reward_score_one(&sc[i], video, prompt, meta, &vals[i])) {
            *failed = i;
            return -1;
        }
        t += sc[i].weight * vals[i];
    }
    *total = t;
    return 0;
}

int reward_score_weighted(const reward_weighted *sc, int n, const reward_video *video, const char *prompt,
                          const reward_meta *meta, double *vals, double *total, int *failed) {
    return reward_score_weighted_given(sc, n, video, prompt, meta, NULL, vals, total, failed);
}
