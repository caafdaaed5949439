/* media/video_stats.h — per-video pixel statistics of a decoded U8 RGB video, for watching what training does to the
 * videos (the reward-hacking guard, trainer/run/guard.h): a policy that games its reward often shows it first as a drift
 * of plain pixel statistics (brighter, washed out or over-saturated, clipped to black or white, frozen, or covered in
 * a fine grid pattern).
 *
 * A video is U8 RGB [F, H, W, 3], row-major (as reward/scorers.h). With L = 299 R + 587 G + 114 B (1000 x the
 * Rec. 601 luma Y, an exact integer in [0, 255000]) and y = L / 255000 in [0, 1] (Y / 255, the `brightness` scorer's
 * luma), N = F H W pixels, P = H W pixels per frame:
 *
 *   brightness      mean y over all pixels of all frames (equals the `brightness` scorer bit for bit)
 *   saturation      mean HSV saturation s = (max - min) / max of (R, G, B) per pixel (0 where max = 0), over all pixels
 *   contrast        mean over frames of the frame's population standard deviation of y
 *   black_fraction  fraction of pixels with y <= 0.05 (L <= 12750: near black)
 *   white_fraction  fraction of pixels with y >= 0.95 (L >= 242250: near white)
 *   motion          mean |y_t - y_{t-1}| over consecutive frame pairs and all pixels (0 for one frame; equals the
 *                   `motion` scorer bit for bit)
 *   hf_energy       E / V, the energy of the highest spatial frequency (the 2 x 2 checkerboard) relative to the luma
 *                   variance: for every frame and every 2 x 2 window (rows i, i+1, columns j, j+1; overlapping, P' =
 *                   (H - 1)(W - 1) windows per frame) the checkerboard coefficient d = (y[i][j] - y[i][j+1] - y[i+1][j]
 *                   + y[i+1][j+1]) / 4; E = mean of d^2 over all windows of all frames; V = mean over frames of the
 *                   frame's variance of y (contrast^2 per frame). The filter's power response is
 *                   sin^2(wx / 2) sin^2(wy / 2), so hf_energy is 1 for a pure checkerboard, about 0.25 for white
 *                   noise, near 0 for smooth content (in [0, 1] up to edge effects). A grid artifact (period-2
 *                   pixel pattern, e.g. from 2 x 2 patches) raises it. 0 when V = 0 (every frame of constant luma)
 *                   and when H or W is 1 (no 2 x 2 window).
 *
 * Determinism: every count and every luma sum (L, L^2, |dL|, the checkerboard's 4 x 255000 d and its square) is an
 * exact integer per frame (64- or 128-bit); the saturation is summed in double in pixel order per frame; frames are
 * combined in frame order. Frames may be processed by several OpenMP threads: the result does not depend on it. */
#ifndef MEDIA_VIDEO_STATS_H
#define MEDIA_VIDEO_STATS_H

#include <stdint.h>

typedef enum {
    MEDIA_VSTAT_BRIGHTNESS = 0,
    MEDIA_VSTAT_SATURATION,
    MEDIA_VSTAT_CONTRAST,
    MEDIA_VSTAT_BLACK,
    MEDIA_VSTAT_WHITE,
    MEDIA_VSTAT_MOTION,
    MEDIA_VSTAT_HF,
    MEDIA_VSTAT_COUNT
} media_vstat;

/* Thresholds of the near-black / near-white fractions, on L = 1000 x Rec. 601 luma (y = 0.05 and 0.95). */
#define MEDIA_VSTAT_BLACK_L 12750
#define MEDIA_VSTAT_WHITE_L 242250

/* The statistics' names as metrics spell them: "brightness", "saturation", "contrast", "black_fraction",
 * "white_fraction", "motion", "hf_energy" (index = media_vstat). */
extern const char *const media_vstat_names[MEDIA_VSTAT_COUNT];

/* The statistics above of one video [frames, height, width, 3] U8 into out[MEDIA_VSTAT_COUNT]. Returns 0, or -1
 * with an error for NULL data, a dim < 1, or a size whose sums could overflow (more than 2^40 pixels). */
int media_video_stats(const uint8_t *video, int64_t frames, int64_t height, int64_t width,
                      double out[MEDIA_VSTAT_COUNT]);

#endif
