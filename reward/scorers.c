/* reward/scorers.c — the built-in reward scorers and their registry (see reward/scorers.h). */
#include "reward/scorers.h"

#include <ctype.h>
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

/* ---- Registry ---- */

static const reward_scorer registry[] = {
    {"color_match", reward_color_match, 0.0, 1.0,
     "share of pixels in the colour named by metadata 'color' or the prompt (VBench colour words)"},
    {"brightness", reward_brightness, 0.0, 1.0, "mean Rec. 601 luma / 255"},
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
