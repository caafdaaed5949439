/* media/video_stats.c — per-video pixel statistics (formulas in media/video_stats.h): one pass per frame with exact
 * integer sums, then the frames combined in order. */
#include "media/video_stats.h"

#include <math.h>
#include <stdlib.h>

#include "core/error.h"

const char *const media_vstat_names[MEDIA_VSTAT_COUNT] = {"brightness",     "saturation", "contrast", "black_fraction",
                                                          "white_fraction", "motion",     "hf_energy"};

typedef unsigned __int128 u128;

/* One frame's sums. */
typedef struct {
    uint64_t s1;      /* sum L */
    u128 s2;          /* sum L^2 */
    uint64_t black, white;
    double sat;       /* sum of s, pixel order */
    uint64_t dabs;    /* sum |L_t - L_{t-1}| against the previous frame (0 for frame 0) */
    u128 hf;          /* sum D^2, D = L00 - L01 - L10 + L11 (= 4 x 255000 d) */
} frame_sums;

static inline int64_t luma(const uint8_t *p) { return 299 * (int64_t)p[0] + 587 * (int64_t)p[1] + 114 * (int64_t)p[2]; }

static void frame_pass(const uint8_t *f, const uint8_t *prev, int64_t H, int64_t W, frame_sums *o) {
    const int64_t P = H * W;
    frame_sums s = {0};
    for (int64_t i = 0; i < P; i++) {
        const uint8_t *p = f + 3 * i;
        const int64_t L = luma(p);
        s.s1 += (uint64_t)L;
        s.s2 += (u128)(uint64_t)(L * L);
        s.black += L <= MEDIA_VSTAT_BLACK_L;
        s.white += L >= MEDIA_VSTAT_WHITE_L;
        int mx = p[0], mn = p[0];
        for (int c = 1; c < 3; c++) mx = p[c] > mx ? p[c] : mx, mn = p[c] < mn ? p[c] : mn;
        if (mx > 0) s.sat += (double)(mx - mn) / (double)mx;
        if (prev) {
            const int64_t d = L - luma(prev + 3 * i);
            s.dabs += (uint64_t)(d < 0 ? -d : d);
        }
    }
    for (int64_t y = 0; y + 1 < H; y++)
        for (int64_t x = 0; x + 1 < W; x++) {
            const int64_t a = luma(f + 3 * (y * W + x)), b = luma(f + 3 * (y * W + x + 1));
            const int64_t c = luma(f + 3 * ((y + 1) * W + x)), d = luma(f + 3 * ((y + 1) * W + x + 1));
            const int64_t D = a - b - c + d;
            s.hf += (u128)(uint64_t)(D * D);
        }
    *o = s;
}

int media_video_stats(const uint8_t *video, int64_t frames, int64_t height, int64_t width,
                      double out[MEDIA_VSTAT_COUNT]) {
    if (!video) return core_error("video stats: video data is NULL");
    if (frames < 1 || height < 1 || width < 1)
        return core_error("video stats: video shape [%lld, %lld, %lld, 3] has a dim < 1", (long long)frames,
                          (long long)height, (long long)width);
    const int64_t lim = (int64_t)1 << 40;
    if (height > lim / width || frames > lim / (height * width))
        return core_error("video stats: video shape [%lld, %lld, %lld, 3] has more than 2^40 pixels", (long long)frames,
                          (long long)height, (long long)width);
    const int64_t P = height * width, F = frames;
    frame_sums *fs = malloc(sizeof *fs * (size_t)F);
    if (!fs) return core_error("out of memory");
#pragma omp parallel for schedule(static) if (F > 1 && P * F >= (1 << 16))
    for (int64_t t = 0; t < F; t++)
        frame_pass(video + 3 * t * P, t ? video + 3 * (t - 1) * P : NULL, height, width, &fs[t]);
    uint64_t s1 = 0, black = 0, white = 0, dabs = 0;
    double sat = 0, sd_sum = 0, var_sum = 0, hf = 0;
    const double scale2 = 255000.0 * 255000.0;
    for (int64_t t = 0; t < F; t++) {
        s1 += fs[t].s1, black += fs[t].black, white += fs[t].white, dabs += fs[t].dabs;
        sat += fs[t].sat;
        /* P^2 var(L) = P sum L^2 - (sum L)^2, exact in 128 bits (P <= 2^40, sum L^2 < 2^76: the product < 2^116) */
        const u128 pv = (u128)(uint64_t)P * fs[t].s2 - (u128)fs[t].s1 * fs[t].s1;
        const double var = (double)pv / ((double)P * (double)P) / scale2;
        sd_sum += sqrt(var);
        var_sum += var;
        hf += (double)fs[t].hf;
    }
    free(fs);
    const double N = (double)(F * P);
    out[MEDIA_VSTAT_BRIGHTNESS] = (double)s1 / (255000.0 * N);
    out[MEDIA_VSTAT_SATURATION] = sat / N;
    out[MEDIA_VSTAT_CONTRAST] = sd_sum / (double)F;
    out[MEDIA_VSTAT_BLACK] = (double)black / N;
    out[MEDIA_VSTAT_WHITE] = (double)white / N;
    out[MEDIA_VSTAT_MOTION] = F > 1 ? (double)dabs / (255000.0 * (double)((F - 1) * P)) : 0.0;
    const double V = var_sum / (double)F;
    const int64_t windows = (height - 1) * (width - 1);
    out[MEDIA_VSTAT_HF] = windows > 0 && V > 0 ? hf / (16.0 * scale2 * (double)(F * windows)) / V : 0.0;
    return 0;
}
