/* tests/test_video.c — media/video (mp4 write -> read round trip, PSNR computed here, odd sizes, ffprobe's
 * view of the file, error paths) and media/png (bit-exact PNG round trip, contact-sheet layout and labels
 * against hand-computed pixel positions). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "media/png.h"
#include "media/video.h"
#include "tests/test.h"

/* A smooth synthetic video: colour gradients plus a disc with a 6-px soft edge moving right 2 px per frame. */
static uint8_t *synth_video(int F, int H, int W) {
    uint8_t *v = malloc((size_t)F * H * W * 3);
    for (int f = 0; f < F; f++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                double r = 40 + 160.0 * x / (W > 1 ? W - 1 : 1);
                double g = 40 + 160.0 * y / (H > 1 ? H - 1 : 1);
                double b = 110 + 50 * sin(2 * M_PI * (x + y + 2.0 * f) / (W + H));
                double cx = W * 0.25 + 2.0 * f, cy = H * 0.5, rad = H * 0.25;
                double d = sqrt((x - cx) * (x - cx) + (y - cy) * (y - cy));
                double a = fmin(1.0, fmax(0.0, (rad - d) / 6.0 + 0.5)); /* 6-px soft edge */
                r = (1 - a) * r + a * 230;
                g = (1 - a) * g + a * 200;
                b = (1 - a) * b + a * 60;
                uint8_t *p = v + (((size_t)f * H + y) * W + x) * 3;
                p[0] = (uint8_t)lrint(r);
                p[1] = (uint8_t)lrint(g);
                p[2] = (uint8_t)lrint(b);
            }
    return v;
}

/* PSNR (dB) of the H x W top-left region of decoded frames b [F, Hb, Wb, 3] against a [F, H, W, 3]. */
static double psnr_region(const uint8_t *a, const uint8_t *b, int F, int H, int W, int Hb, int Wb) {
    double se = 0;
    for (int f = 0; f < F; f++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++)
                for (int c = 0; c < 3; c++) {
                    double d = (double)a[(((size_t)f * H + y) * W + x) * 3 + c] -
                               (double)b[(((size_t)f * Hb + y) * Wb + x) * 3 + c];
                    se += d * d;
                }
    double mse = se / ((double)F * H * W * 3);
    return mse == 0 ? 99.0 : 10 * log10(255.0 * 255.0 / mse);
}

static int file_exists(const char *p) { return access(p, F_OK) == 0; }

static void roundtrip(const char *encoder, const char *want_encoder) {
    const int F = 10, H = 48, W = 64;
    char path[600], partial[700];
    snprintf(path, sizeof path, "%s/rt.mp4", test_tmpdir());
    snprintf(partial, sizeof partial, "%s.partial", path);
    uint8_t *v = synth_video(F, H, W);
    const char *used = NULL;
    int rc = media_video_write_mp4(path, v, F, H, W, 8.0, encoder, &used);
    if (rc) free(v);
    REQUIRE_OK(rc);
    CHECK(used && !strcmp(used, want_encoder));
    CHECK(file_exists(path));
    CHECK(!file_exists(partial));
    core_tensor back;
    double fps = 0;
    rc = media_video_read(path, 0, &back, &fps);
    if (rc) free(v);
    REQUIRE_OK(rc);
    CHECK(back.dtype == CORE_U8 && back.ndim == 4);
    CHECK(back.shape[0] == F && back.shape[1] == H && back.shape[2] == W && back.shape[3] == 3);
    CHECK_NEAR(fps, 8.0, 1e-6);
    if (back.shape[0] == F && back.shape[1] == H && back.shape[2] == W) {
        double p = psnr_region(v, back.data, F, H, W, H, W);
        printf("    %s: PSNR %.2f dB over %d frames %dx%d\n", used ? used : "?", p, F, W, H);
        CHECK_MSG(p >= 30.0, "PSNR %.2f dB < 30 dB (%s)", p, used ? used : "?");
    }
    /* max_frames stops early */
    core_tensor part;
    rc = media_video_read(path, 3, &part, NULL);
    CHECK(rc == 0 && part.shape[0] == 3);
    core_tensor_free(&part);
    core_tensor_free(&back);
    free(v);
}

TEST(video_roundtrip_default_encoder_psnr) {
    roundtrip(NULL, media_video_have_x264() ? "libx264" : "mpeg4");
}

TEST(video_roundtrip_mpeg4_fallback_psnr) { roundtrip("mpeg4", "mpeg4"); }

/* 33 x 17 is padded to 34 x 18 by replicating the last column and row (documented in media/video.h). */
TEST(video_odd_size_padded_to_even) {
    const int F = 5, H = 17, W = 33;
    char path[600];
    snprintf(path, sizeof path, "%s/odd.mp4", test_tmpdir());
    uint8_t *v = synth_video(F, H, W);
    int rc = media_video_write_mp4(path, v, F, H, W, 16.0, NULL, NULL);
    if (rc) free(v);
    REQUIRE_OK(rc);
    core_tensor back;
    rc = media_video_read(path, 0, &back, NULL);
    if (rc) free(v);
    REQUIRE_OK(rc);
    CHECK(back.shape[0] == F && back.shape[1] == 18 && back.shape[2] == 34);
    if (back.shape[0] == F && back.shape[1] == 18 && back.shape[2] == 34) {
        const uint8_t *b = back.data;
        double p = psnr_region(v, b, F, H, W, 18, 34);
        printf("    odd 33x17: PSNR %.2f dB over the original region\n", p);
        CHECK_MSG(p >= 30.0, "PSNR %.2f dB < 30 dB", p);
        /* The padding column 33 repeats column 32 of the source and the padding row 17 repeats row 16: compare
         * the decoded padding with the SOURCE's last column / row. */
        double se = 0;
        int n = 0;
        for (int f = 0; f < F; f++) {
            for (int y = 0; y < H; y++)
                for (int c = 0; c < 3; c++, n++) {
                    double d = (double)b[(((size_t)f * 18 + y) * 34 + 33) * 3 + c] -
                               (double)v[(((size_t)f * H + y) * W + 32) * 3 + c];
                    se += d * d;
                }
            for (int x = 0; x < W; x++)
                for (int c = 0; c < 3; c++, n++) {
                    double d = (double)b[(((size_t)f * 18 + 17) * 34 + x) * 3 + c] -
                               (double)v[(((size_t)f * H + 16) * W + x) * 3 + c];
                    se += d * d;
                }
        }
        double pp = 10 * log10(255.0 * 255.0 / fmax(se / n, 1e-9));
        CHECK_MSG(pp >= 30.0, "padding PSNR %.2f dB < 30 dB: padding does not replicate the last column/row", pp);
    }
    core_tensor_free(&back);
    free(v);
}

/* ffprobe (an independent reader) sees the codec, size and every frame. */
TEST(video_ffprobe_codec_and_frame_count) {
    char out[4096];
    if (test_run(out, sizeof out, "command -v ffprobe") != 0) {
        test_skip("ffprobe not installed (scripts/install-deps.sh installs ffmpeg)");
        return;
    }
    const int F = 7, H = 32, W = 48;
    char path[600];
    snprintf(path, sizeof path, "%s/probe.mp4", test_tmpdir());
    uint8_t *v = synth_video(F, H, W);
    const char *used = NULL;
    int rc = media_video_write_mp4(path, v, F, H, W, 12.0, NULL, &used);
    free(v);
    REQUIRE_OK(rc);
    rc = test_run(out, sizeof out,
                  "ffprobe -v error -select_streams v:0 -count_frames -show_entries "
                  "stream=codec_name,width,height,pix_fmt,nb_read_frames,avg_frame_rate -of default=nw=1 '%s'",
                  path);
    CHECK_MSG(rc == 0, "ffprobe exit %d: %s", rc, out);
    const char *codec = !strcmp(used, "libx264") ? "codec_name=h264" : "codec_name=mpeg4";
    CHECK_MSG(strstr(out, codec) != NULL, "want %s in ffprobe output:\n%s", codec, out);
    CHECK_MSG(strstr(out, "width=48\n") && strstr(out, "height=32\n"), "size wrong:\n%s", out);
    CHECK_MSG(strstr(out, "pix_fmt=yuv420p\n") != NULL, "pix_fmt wrong:\n%s", out);
    CHECK_MSG(strstr(out, "nb_read_frames=7\n") != NULL, "frame count wrong:\n%s", out);
    CHECK_MSG(strstr(out, "avg_frame_rate=12/1\n") != NULL, "frame rate wrong:\n%s", out);
}

TEST(video_errors_name_path_and_leave_no_file) {
    char path[600], partial[700];
    snprintf(path, sizeof path, "%s/no/such/dir/out.mp4", test_tmpdir());
    snprintf(partial, sizeof partial, "%s.partial", path);
    uint8_t px[2 * 2 * 3] = {0};
    CHECK(media_video_write_mp4(path, px, 1, 2, 2, 8.0, NULL, NULL) == -1);
    const char *e = core_last_error();
    CHECK_MSG(strstr(e, path) != NULL, "error does not name the path: %s", e);
    CHECK_MSG(strstr(e, "avio_open") != NULL, "error does not name the libav function: %s", e);
    CHECK_MSG(strstr(e, "No such file or directory") != NULL, "error lacks av_err2str's message: %s", e);
    CHECK(!file_exists(path) && !file_exists(partial));

    /* bad arguments */
    char ok[600];
    snprintf(ok, sizeof ok, "%s/x.mp4", test_tmpdir());
    CHECK(media_video_write_mp4(ok, px, 0, 2, 2, 8.0, NULL, NULL) == -1);
    CHECK(strstr(core_last_error(), "shape") != NULL);
    CHECK(media_video_write_mp4(ok, px, 1, 2, 2, 0.0, NULL, NULL) == -1);
    CHECK(strstr(core_last_error(), "fps") != NULL);
    CHECK(media_video_write_mp4(ok, px, 1, 2, 2, 8.0, "vp9", NULL) == -1);
    CHECK(strstr(core_last_error(), "vp9") != NULL);
    CHECK(!file_exists(ok));

    /* reader: missing file and a file that is not a video */
    core_tensor t;
    CHECK(media_video_read(path, 0, &t, NULL) == -1);
    e = core_last_error();
    CHECK_MSG(strstr(e, path) && strstr(e, "avformat_open_input"), "reader error: %s", e);
    CHECK(t.data == NULL);
    char junk[600];
    snprintf(junk, sizeof junk, "%s/junk.mp4", test_tmpdir());
    FILE *fp = fopen(junk, "wb");
    REQUIRE(fp);
    fputs("this is not a video file at all\n", fp);
    fclose(fp);
    CHECK(media_video_read(junk, 0, &t, NULL) == -1);
    CHECK_MSG(strstr(core_last_error(), junk) != NULL, "reader error: %s", core_last_error());
}

TEST(video_png_roundtrip_bit_exact) {
    const int H = 23, W = 37;
    uint8_t img[23 * 37 * 3];
    unsigned long long s = 12345;
    for (size_t i = 0; i < sizeof img; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        img[i] = (uint8_t)(s >> 56);
    }
    char path[600];
    snprintf(path, sizeof path, "%s/img.png", test_tmpdir());
    REQUIRE_OK(media_png_write(path, img, H, W));
    core_tensor back;
    REQUIRE_OK(media_png_read(path, &back));
    CHECK(back.ndim == 3 && back.shape[0] == H && back.shape[1] == W && back.shape[2] == 3);
    CHECK(back.shape[0] == H && back.shape[1] == W && memcmp(back.data, img, sizeof img) == 0);
    core_tensor_free(&back);

    /* errors: missing directory (no file left), missing file, not a PNG */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/missing/img.png", test_tmpdir());
    CHECK(media_png_write(bad, img, H, W) == -1);
    CHECK_MSG(strstr(core_last_error(), bad) != NULL, "png error: %s", core_last_error());
    CHECK(!file_exists(bad));
    CHECK(media_png_read(bad, &back) == -1);
    CHECK(strstr(core_last_error(), bad) != NULL);
    char junk[600];
    snprintf(junk, sizeof junk, "%s/junk.png", test_tmpdir());
    FILE *fp = fopen(junk, "wb");
    REQUIRE(fp);
    fputs("not a png file", fp);
    fclose(fp);
    CHECK(media_png_read(junk, &back) == -1);
    CHECK(strstr(core_last_error(), "signature") != NULL);
}

/* Frame (i, f) of the sheet test is filled with colour (10 * i + f, 100 + f, 200 - i). */
static void sheet_colour(int i, int f, uint8_t c[3]) {
    c[0] = (uint8_t)(10 * i + f);
    c[1] = (uint8_t)(100 + f);
    c[2] = (uint8_t)(200 - i);
}

static int px_is(const uint8_t *img, int w, int x, int y, const uint8_t c[3]) {
    return memcmp(img + ((size_t)y * w + x) * 3, c, 3) == 0;
}

TEST(video_contact_sheet_layout_and_labels) {
    const int N = 3, F = 9, H = 20, W = 12;
    uint8_t *v = malloc((size_t)N * F * H * W * 3);
    for (int i = 0; i < N; i++)
        for (int f = 0; f < F; f++) {
            uint8_t c[3];
            sheet_colour(i, f, c);
            for (int p = 0; p < H * W; p++) memcpy(v + (((size_t)i * F + f) * H * W + p) * 3, c, 3);
        }
    /* Hand-computed: 20 x 12 frames are under 128 pixels, so each is drawn u = ceil(128 / 20) = 7 times larger (140 x
     * 84 tiles); label scale s = clamp(140/32, 1, 4) = 4, label band L = 28, gap 2.
     * width = 4*84 + 5*2 = 346; height = 3*(28+140) + 4*2 = 512; without labels 3*140 + 4*2 = 428; all 9 columns:
     * width 9*84 + 10*2 = 776. Columns j = 0..3 show frames round(j*8/3) = 0, 3, 5, 8. */
    int sh, sw, cols;
    CHECK(media_png_sheet_scale(H, W) == 7 && media_png_sheet_scale(64, 64) == 2 && media_png_sheet_scale(128, 4) == 1);
    REQUIRE_OK(media_png_sheet_layout(N, F, H, W, 4, 1, &sh, &sw, &cols));
    CHECK(sh == 512 && sw == 346 && cols == 4);
    REQUIRE_OK(media_png_sheet_layout(N, F, H, W, 4, 0, &sh, &sw, &cols));
    CHECK(sh == 428 && sw == 346 && cols == 4);
    REQUIRE_OK(media_png_sheet_layout(N, F, H, W, 0, 1, &sh, &sw, &cols));
    CHECK(sh == 512 && sw == 776 && cols == 9);
    REQUIRE_OK(media_png_sheet_layout(1, 1, 64, 64, 4, 1, &sh, &sw, &cols)); /* u = 2: 128, s = 4: L = 28 */
    CHECK(sh == 128 + 28 + 4 && sw == 128 + 4 && cols == 1);
    REQUIRE_OK(media_png_sheet_layout(1, 1, 160, 128, 4, 1, &sh, &sw, &cols)); /* u = 1, s = 4 */
    CHECK(sh == 160 + 28 + 4 && sw == 128 + 4 && cols == 1);

    const char *labels[3] = {"S0", "", NULL};
    core_tensor sheet;
    int rc = media_png_sheet_render(v, N, F, H, W, 4, labels, &sheet);
    if (rc) free(v);
    REQUIRE_OK(rc);
    REQUIRE(sheet.shape[0] == 512 && sheet.shape[1] == 346);
    const uint8_t *img = sheet.data;
    const uint8_t bg[3] = {24, 24, 24}, white[3] = {255, 255, 255};
    const int frame_of_col[4] = {0, 3, 5, 8}, TH = 140, TW = 84;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < 4; j++) {
            uint8_t c[3];
            sheet_colour(i, frame_of_col[j], c);
            int x0 = 2 + j * (TW + 2), y0 = 2 + i * (28 + TH + 2) + 28;
            CHECK_MSG(px_is(img, 346, x0, y0, c) && px_is(img, 346, x0 + TW - 1, y0 + TH - 1, c),
                      "tile (%d, %d) wrong", i, j);
            CHECK(px_is(img, 346, x0 - 1, y0, bg) && px_is(img, 346, x0 + TW, y0 + TH - 1, bg)); /* gaps */
        }
    CHECK(px_is(img, 346, 0, 0, bg) && px_is(img, 346, 345, 511, bg));
    /* "S0" at x = 2, y = 2 + 4, each font pixel 4 x 4: 'S' top row is .## and '0' (x = 2 + 16) top row is ###;
     * 'S' row 2 (y = 6 + 8) is .#. */
    CHECK(px_is(img, 346, 2, 6, bg) && px_is(img, 346, 6, 6, white) && px_is(img, 346, 10, 6, white));
    CHECK(px_is(img, 346, 18, 6, white) && px_is(img, 346, 22, 6, white) && px_is(img, 346, 26, 9, white));
    CHECK(px_is(img, 346, 2, 14, bg) && px_is(img, 346, 6, 14, white) && px_is(img, 346, 10, 14, bg));
    /* Bands of samples 1 ("") and 2 (NULL) have no label pixels; band 0 has exactly the glyph pixels of "S0"
     * ('S' 7 pixels, '0' 12 pixels, each 4 x 4). */
    int white_in_band[3] = {0, 0, 0};
    for (int i = 0; i < N; i++)
        for (int y = 2 + i * (28 + TH + 2); y < 2 + i * (28 + TH + 2) + 28; y++)
            for (int x = 0; x < 346; x++) white_in_band[i] += px_is(img, 346, x, y, white);
    CHECK(white_in_band[0] == 19 * 16 && white_in_band[1] == 0 && white_in_band[2] == 0);

    /* Written as PNG and read back bit-exact. */
    char path[600];
    snprintf(path, sizeof path, "%s/sheet.png", test_tmpdir());
    rc = media_png_write_sheet(path, v, N, F, H, W, 4, labels);
    free(v);
    if (rc) core_tensor_free(&sheet);
    REQUIRE_OK(rc);
    core_tensor back;
    rc = media_png_read(path, &back);
    if (rc) core_tensor_free(&sheet);
    REQUIRE_OK(rc);
    CHECK(back.shape[0] == 512 && back.shape[1] == 346 && memcmp(back.data, sheet.data, 512 * 346 * 3) == 0);
    core_tensor_free(&back);
    core_tensor_free(&sheet);
}

/* media_png_fit_text: '?' for what the font cannot draw (one per UTF-8 character), "..." when cut. */
TEST(video_sheet_title_fit_text) {
    char out[64];
    CHECK(media_png_fit_text(out, sizeof out, "a red car, 2 birds!", 1000, 1) == 19 &&
          !strcmp(out, "a red car, 2 birds!"));
    CHECK(media_png_fit_text(out, sizeof out, "caf\xc3\xa9 \xe2\x80\x94 tab\there~", 1000, 1) == 16 &&
          !strcmp(out, "caf? ? tab?here?"));
    /* scale 1, 39 pixels: (39 + 1) / 4 = 10 characters */
    CHECK(media_png_fit_text(out, sizeof out, "abcdefghij", 39, 1) == 10 && !strcmp(out, "abcdefghij"));
    CHECK(media_png_fit_text(out, sizeof out, "abcdefghijk", 39, 1) == 10 && !strcmp(out, "abcdefg..."));
    CHECK(media_png_fit_text(out, sizeof out, "abcdefghijk", 38, 1) == 9 && !strcmp(out, "abcdef..."));
    CHECK(media_png_fit_text(out, sizeof out, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 16, 1) == 4 &&
          !strcmp(out, "?..."));
    /* scale 2: (38 + 2) / 8 = 5 characters; fewer than 4 of room: cut without dots */
    CHECK(media_png_fit_text(out, sizeof out, "abcdefgh", 38, 2) == 5 && !strcmp(out, "ab..."));
    CHECK(media_png_fit_text(out, sizeof out, "abcd", 11, 1) == 3 && !strcmp(out, "abc"));
    CHECK(media_png_fit_text(out, sizeof out, NULL, 100, 1) == 0 && !strcmp(out, ""));
    CHECK(media_png_fit_text(out, 4, "abcdefgh", 1000, 1) == 3 && !strcmp(out, "abc"));
}

/* A titled sheet is the untitled sheet moved down by the title band, whose text pixels are drawn; without a title
 * the sheet (rendered and written) is byte for byte the untitled one. */
TEST(video_sheet_title_band) {
    const int N = 2, F = 5, H = 20, W = 12;
    uint8_t *v = malloc((size_t)N * F * H * W * 3);
    REQUIRE(v);
    for (int i = 0; i < N; i++)
        for (int f = 0; f < F; f++) {
            uint8_t c[3];
            sheet_colour(i, f, c);
            for (int p = 0; p < H * W; p++) memcpy(v + (((size_t)i * F + f) * H * W + p) * 3, c, 3);
        }
    const char *labels[2] = {"seed 1", "seed 2"};
    core_tensor plain, none, titled;
    REQUIRE_OK(media_png_sheet_render(v, N, F, H, W, 4, labels, &plain));
    REQUIRE_OK(media_png_sheet_render_titled(v, N, F, H, W, 4, NULL, labels, &none));
    CHECK(none.shape[0] == plain.shape[0] && none.shape[1] == plain.shape[1] &&
          !memcmp(none.data, plain.data, (size_t)plain.shape[0] * plain.shape[1] * 3));
    REQUIRE_OK(media_png_sheet_render_titled(v, N, F, H, W, 4, "a red car", labels, &titled));
    const int band = media_png_title_band(H, W), sw = (int)plain.shape[1], ph = (int)plain.shape[0];
    CHECK(band == 30); /* 140-pixel tiles (u = 7): s = 4, 7 * 4 + 2 */
    CHECK(titled.shape[0] == ph + band && titled.shape[1] == sw);
    const uint8_t *img = titled.data, bg[3] = {24, 24, 24}, white[3] = {255, 255, 255};
    CHECK(!memcmp(img + (size_t)band * sw * 3, plain.data, (size_t)ph * sw * 3));
    int white_px = 0, other = 0;
    for (int y = 0; y < band; y++)
        for (int x = 0; x < sw; x++) white_px += px_is(img, sw, x, y, white), other += !px_is(img, sw, x, y, white) &&
                                                                                      !px_is(img, sw, x, y, bg);
    CHECK_MSG(white_px > 20 && other == 0, "title band: %d white pixels, %d others", white_px, other);
    /* "A" at x = 2, y = 2 + 4 (font pixels 4 x 4): top row .#. ; the band's first two rows and the text's 4 rows
     * above are background */
    CHECK(px_is(img, sw, 2, 6, bg) && px_is(img, sw, 6, 6, white) && px_is(img, sw, 9, 9, white) &&
          px_is(img, sw, 10, 6, bg));
    for (int x = 0; x < sw; x++) CHECK(px_is(img, sw, x, 0, bg) && px_is(img, sw, x, 5, bg));

    /* written: no title gives the old file byte for byte; the titled file reads back as rendered */
    char dir[600], a[700], b[700], c[700];
    snprintf(dir, sizeof dir, "%s", test_tmpdir());
    snprintf(a, sizeof a, "%s/plain.png", dir), snprintf(b, sizeof b, "%s/none.png", dir);
    snprintf(c, sizeof c, "%s/titled.png", dir);
    REQUIRE_OK(media_png_write_sheet(a, v, N, F, H, W, 4, labels));
    REQUIRE_OK(media_png_write_sheet_titled(b, v, N, F, H, W, 4, NULL, labels));
    REQUIRE_OK(media_png_write_sheet_titled(c, v, N, F, H, W, 4, "a red car", labels));
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    REQUIRE(fa && fb);
    static unsigned char ba[1 << 16], bb[1 << 16];
    size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
    fclose(fa), fclose(fb);
    CHECK(na > 0 && na == nb && !memcmp(ba, bb, na));
    core_tensor back;
    REQUIRE_OK(media_png_read(c, &back));
    CHECK(back.shape[0] == titled.shape[0] && !memcmp(back.data, titled.data, (size_t)titled.shape[0] * sw * 3));
    core_tensor_free(&back), core_tensor_free(&plain), core_tensor_free(&none), core_tensor_free(&titled);
    free(v);
}

/* Frames under 128 pixels are upscaled by nearest neighbour (media_png_sheet_scale): a 3 x 2 frame of six colours is
 * a 129 x 86 tile (u = 43) whose pixel (y, x) is the frame's (y / 43, x / 43); a frame of 128 pixels is drawn as is.
 * Before, tiles were the frames' own size (a 32 x 32 video gave a sheet of 32-pixel tiles). */
TEST(video_sheet_small_frames_upscaled) {
    uint8_t f[2 * 3 * 3];
    for (int k = 0; k < (int)sizeof f; k++) f[k] = (uint8_t)(40 * k + 5);
    core_tensor t;
    REQUIRE_OK(media_png_sheet_render(f, 1, 1, 3, 2, 1, NULL, &t));
    CHECK(media_png_sheet_scale(3, 2) == 43);
    REQUIRE(t.shape[0] == 129 + 4 && t.shape[1] == 86 + 4);
    int same = 1;
    for (int y = 0; y < 129; y++)
        for (int x = 0; x < 86; x++) same &= !memcmp((uint8_t *)t.data + ((2 + y) * 90 + 2 + x) * 3, f + ((y / 43) * 2 + x / 43) * 3, 3);
    CHECK(same);
    core_tensor_free(&t);
    uint8_t *g = malloc(128 * 5 * 3);
    REQUIRE(g);
    for (int k = 0; k < 128 * 5 * 3; k++) g[k] = (uint8_t)(k * 7);
    REQUIRE_OK(media_png_sheet_render(g, 1, 1, 128, 5, 1, NULL, &t));
    CHECK(t.shape[0] == 128 + 4 && t.shape[1] == 5 + 4);
    same = 1;
    for (int y = 0; y < 128; y++) same &= !memcmp((uint8_t *)t.data + ((2 + y) * 9 + 2) * 3, g + y * 5 * 3, 5 * 3);
    CHECK(same);
    core_tensor_free(&t);
    free(g);
}
