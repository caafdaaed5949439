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
    /* Hand-computed: scale s = clamp(20/32, 1, 4) = 1, label band L = 7, gap 2.
     * width = 4*12 + 5*2 = 58; height = 3*(7+20) + 4*2 = 89; without labels 3*20 + 4*2 = 68; all 9 columns:
     * width 9*12 + 10*2 = 128. Columns j = 0..3 show frames round(j*8/3) = 0, 3, 5, 8. */
    int sh, sw, cols;
    REQUIRE_OK(media_png_sheet_layout(N, F, H, W, 4, 1, &sh, &sw, &cols));
    CHECK(sh == 89 && sw == 58 && cols == 4);
    REQUIRE_OK(media_png_sheet_layout(N, F, H, W, 4, 0, &sh, &sw, &cols));
    CHECK(sh == 68 && sw == 58 && cols == 4);
    REQUIRE_OK(media_png_sheet_layout(N, F, H, W, 0, 1, &sh, &sw, &cols));
    CHECK(sh == 89 && sw == 128 && cols == 9);
    REQUIRE_OK(media_png_sheet_layout(1, 1, 64, 64, 4, 1, &sh, &sw, &cols)); /* s = 2: L = 14 */
    CHECK(sh == 64 + 14 + 4 && sw == 64 + 4 && cols == 1);

    const char *labels[3] = {"S0", "", NULL};
    core_tensor sheet;
    int rc = media_png_sheet_render(v, N, F, H, W, 4, labels, &sheet);
    if (rc) free(v);
    REQUIRE_OK(rc);
    REQUIRE(sheet.shape[0] == 89 && sheet.shape[1] == 58);
    const uint8_t *img = sheet.data;
    const uint8_t bg[3] = {24, 24, 24}, white[3] = {255, 255, 255};
    const int frame_of_col[4] = {0, 3, 5, 8};
    for (int i = 0; i < N; i++)
        for (int j = 0; j < 4; j++) {
            uint8_t c[3];
            sheet_colour(i, frame_of_col[j], c);
            int x0 = 2 + j * 14, y0 = 2 + i * 29 + 7;
            CHECK_MSG(px_is(img, 58, x0, y0, c) && px_is(img, 58, x0 + W - 1, y0 + H - 1, c),
                      "tile (%d, %d) wrong", i, j);
            CHECK(px_is(img, 58, x0 - 1, y0, bg) && px_is(img, 58, x0 + W, y0 + H - 1, bg)); /* gaps */
        }
    CHECK(px_is(img, 58, 0, 0, bg) && px_is(img, 58, 57, 88, bg));
    /* "S0" at x = 2, y = 2 + 1: 'S' top row is .## and '0' (x = 6) top row is ###; 'S' row 2 is .#. */
    CHECK(px_is(img, 58, 2, 3, bg) && px_is(img, 58, 3, 3, white) && px_is(img, 58, 4, 3, white));
    CHECK(px_is(img, 58, 6, 3, white) && px_is(img, 58, 7, 3, white) && px_is(img, 58, 8, 3, white));
    CHECK(px_is(img, 58, 2, 5, bg) && px_is(img, 58, 3, 5, white) && px_is(img, 58, 4, 5, bg));
    /* Bands of samples 1 ("") and 2 (NULL) have no label pixels; band 0 has exactly the glyph pixels of "S0"
     * ('S' 7 pixels, '0' 12 pixels). */
    int white_in_band[3] = {0, 0, 0};
    for (int i = 0; i < N; i++)
        for (int y = 2 + i * 29; y < 2 + i * 29 + 7; y++)
            for (int x = 0; x < 58; x++) white_in_band[i] += px_is(img, 58, x, y, white);
    CHECK(white_in_band[0] == 19 && white_in_band[1] == 0 && white_in_band[2] == 0);

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
    CHECK(back.shape[0] == 89 && back.shape[1] == 58 && memcmp(back.data, sheet.data, 89 * 58 * 3) == 0);
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
    const int band = media_png_title_band(H), sw = (int)plain.shape[1], ph = (int)plain.shape[0];
    CHECK(band == 9); /* s = 1: 7 + 2 */
    CHECK(titled.shape[0] == ph + band && titled.shape[1] == sw);
    const uint8_t *img = titled.data, bg[3] = {24, 24, 24}, white[3] = {255, 255, 255};
    CHECK(!memcmp(img + (size_t)band * sw * 3, plain.data, (size_t)ph * sw * 3));
    int white_px = 0, other = 0;
    for (int y = 0; y < band; y++)
        for (int x = 0; x < sw; x++) white_px += px_is(img, sw, x, y, white), other += !px_is(img, sw, x, y, white) &&
                                                                                      !px_is(img, sw, x, y, bg);
    CHECK_MSG(white_px > 20 && other == 0, "title band: %d white pixels, %d others", white_px, other);
    /* "A" at x = 2, y = 3: top row .#. ; the band's first two rows and the text's row above are background */
    CHECK(px_is(img, sw, 2, 3, bg) && px_is(img, sw, 3, 3, white) && px_is(img, sw, 4, 3, bg));
    for (int x = 0; x < sw; x++) CHECK(px_is(img, sw, x, 0, bg) && px_is(img, sw, x, 2, bg));

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
