/* media/contact_sheet.c — contact sheets (rows = samples, columns = evenly spaced frames) and the tiny
 * built-in 3 x 5 bitmap font for their labels. The layout is documented in media/png.h. The glyphs were drawn
 * for this project: each is five rows top to bottom, each row one octal digit whose bits 4, 2, 1 are the left,
 * middle and right pixel. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "media/png.h"

#define SHEET_GAP 2
static const uint8_t sheet_bg[3] = {24, 24, 24};
static const uint8_t label_fg[3] = {255, 255, 255};

static const char font_chars[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;-_+=/()#'!?%[]<>*\"";
static const char *const font_glyphs[] = {
    "75557", "26227", "71747", "71717", "55711", "74717", "74757", "71111", "75757", "75717", /* 0-9 */
    "25755", "65656", "34443", "65556", "74647", "74644", "34553", "55755", "72227", "11152", /* A-J */
    "55655", "44447", "57755", "65555", "25552", "65644", "25563", "65655", "34216", "72222", /* K-T */
    "55557", "55552", "55775", "55255", "55222", "71247",                                     /* U-Z */
    "00000", "00002", "00024", "02020", "02024", "00700", "00007", "02720", "07070", "11244", /*  .,:;-_+=/ */
    "24442", "21112", "57575", "22000", "22202", "61202", "51245", "64446", "31113", "12421", /* ()#'!?%[]< */
    "42124", "05250", "55000",                                                                /* >*"        */
};
static const char font_unknown[] = "77777"; /* filled block */

/* Whether the font has a glyph for c (lower case drawn as upper case). */
static int drawable(char c) {
    if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
    return c && strchr(font_chars, c) != NULL;
}

static const char *glyph_of(char c) {
    if (c >= 'a' && c <= 'z') c = (char)(c - 'a' + 'A');
    const char *p = c ? strchr(font_chars, c) : NULL;
    return p ? font_glyphs[p - font_chars] : font_unknown;
}

int media_png_draw_text(uint8_t *img, int img_h, int img_w, int x, int y, int scale, const uint8_t color[3],
                          const char *text) {
    if (scale < 1) scale = 1;
    for (const char *t = text; t && *t; t++, x += 4 * scale) {
        const char *g = glyph_of(*t);
        for (int r = 0; r < 5; r++) {
            int bits = g[r] - '0';
            for (int c = 0; c < 3; c++) {
                if (!(bits & (4 >> c))) continue;
                for (int dy = 0; dy < scale; dy++) {
                    int py = y + r * scale + dy;
                    if (py < 0 || py >= img_h) continue;
                    for (int dx = 0; dx < scale; dx++) {
                        int px = x + c * scale + dx;
                        if (px < 0 || px >= img_w) continue;
                        memcpy(img + ((size_t)py * img_w + px) * 3, color, 3);
                    }
                }
            }
        }
    }
    return x;
}

static int label_scale(int h) {
    int s = h / 32;
    return s < 1 ? 1 : s > 4 ? 4 : s;
}

int media_png_sheet_scale(int h, int w) {
    const int m = h > w ? h : w;
    return m < 1 || m >= MEDIA_PNG_SHEET_MIN_PX ? 1 : (MEDIA_PNG_SHEET_MIN_PX + m - 1) / m;
}

int media_png_sheet_layout(int n, int frames, int h, int w, int max_cols, int has_labels, int *sheet_h,
                             int *sheet_w, int *cols) {
    if (n < 1 || frames < 1 || h < 1 || w < 1)
        return core_error("contact sheet: bad video shape [%d, %d, %d, %d, 3]", n, frames, h, w);
    int c = (max_cols > 0 && max_cols < frames) ? max_cols : frames;
    const int u = media_png_sheet_scale(h, w); /* tiles of u h x u w pixels */
    h *= u, w *= u;
    int64_t L = has_labels ? 7 * label_scale(h) : 0;
    int64_t sw = (int64_t)c * w + (int64_t)(c + 1) * SHEET_GAP;
    int64_t sh = (int64_t)n * (L + h) + (int64_t)(n + 1) * SHEET_GAP;
    if (sw > 65535 || sh > 65535)
        return core_error("contact sheet: %lldx%lld pixels is over the PNG limit used here (65535); "
                          "use fewer columns or samples",
                          (long long)sw, (long long)sh);
    *sheet_h = (int)sh;
    *sheet_w = (int)sw;
    *cols = c;
    return 0;
}

int media_png_sheet_render(const uint8_t *videos, int n, int frames, int h, int w, int max_cols,
                             const char *const *labels, core_tensor *out) {
    memset(out, 0, sizeof *out);
    if (!videos) return core_error("contact sheet: no video data");
    int sh, sw, cols;
    if (media_png_sheet_layout(n, frames, h, w, max_cols, labels != NULL, &sh, &sw, &cols)) return -1;
    int64_t shape[3] = {sh, sw, 3};
    if (core_tensor_alloc(out, CORE_U8, 3, shape)) return core_error_push("contact sheet: ");
    uint8_t *img = out->data;
    for (size_t p = 0; p < (size_t)sh * sw; p++) memcpy(img + p * 3, sheet_bg, 3);
    const int u = media_png_sheet_scale(h, w), th = u * h, tw = u * w; /* a tile: the frame scaled by u */
    int s = label_scale(th), L = labels ? 7 * s : 0;
    size_t frame_bytes = (size_t)h * w * 3;
    for (int i = 0; i < n; i++) {
        int band_y = SHEET_GAP + i * (L + th + SHEET_GAP);
        if (labels && labels[i]) media_png_draw_text(img, sh, sw, SHEET_GAP, band_y + s, s, label_fg, labels[i]);
        for (int j = 0; j < cols; j++) {
            int f = cols == 1 ? 0 : (int)(((int64_t)j * (frames - 1) * 2 + (cols - 1)) / (2 * (int64_t)(cols - 1)));
            const uint8_t *src = videos + ((size_t)i * frames + f) * frame_bytes;
            int x0 = SHEET_GAP + j * (tw + SHEET_GAP);
            for (int y = 0; y < th; y++) { /* nearest neighbour: tile pixel (y, x) is frame pixel (y / u, x / u) */
                uint8_t *dst = img + ((size_t)(band_y + L + y) * sw + x0) * 3;
                const uint8_t *row = src + (size_t)(y / u) * w * 3;
                if (u == 1) memcpy(dst, row, (size_t)w * 3);
                else
                    for (int x = 0; x < tw; x++) memcpy(dst + (size_t)x * 3, row + (size_t)(x / u) * 3, 3);
            }
        }
    }
    return 0;
}

int media_png_write_sheet(const char *path, const uint8_t *videos, int n, int frames, int h, int w, int max_cols,
                            const char *const *labels) {
    core_tensor sheet;
    if (media_png_sheet_render(videos, n, frames, h, w, max_cols, labels, &sheet))
        return core_error_push("png %s: ", path ? path : "(null)");
    int rc = media_png_write(path, sheet.data, (int)sheet.shape[0], (int)sheet.shape[1]);
    core_tensor_free(&sheet);
    return rc;
}

int media_png_title_band(int h, int w) { return 7 * label_scale(h * media_png_sheet_scale(h, w)) + SHEET_GAP; }

int media_png_fit_text(char *out, size_t cap, const char *text, int width, int scale) {
    if (!cap) return 0;
    if (scale < 1) scale = 1;
    int room = width > 0 ? (width + scale) / (4 * scale) : 0, n = 0, total = 0;
    if ((size_t)room > cap - 1) room = (int)(cap - 1);
    /* count the characters (a UTF-8 sequence is one), to know whether the text must be cut */
    for (const unsigned char *t = (const unsigned char *)(text ? text : ""); *t; t++) total += (*t & 0xC0) != 0x80;
    const int keep = total <= room ? total : room >= 4 ? room - 3 : room;
    for (const unsigned char *t = (const unsigned char *)(text ? text : ""); *t && n < keep; t++) {
        if ((*t & 0xC0) == 0x80) continue; /* continuation byte: its character was counted at the lead byte */
        out[n++] = *t < 0x80 && drawable((char)*t) ? (char)*t : '?';
    }
    if (total > room && room >= 4)
        for (int k = 0; k < 3; k++) out[n++] = '.';
    out[n] = '\0';
    return n;
}

int media_png_sheet_render_titled(const uint8_t *videos, int n, int frames, int h, int w, int max_cols,
                                    const char *title, const char *const *labels, core_tensor *out) {
    if (!title) return media_png_sheet_render(videos, n, frames, h, w, max_cols, labels, out);
    memset(out, 0, sizeof *out);
    core_tensor body;
    if (media_png_sheet_render(videos, n, frames, h, w, max_cols, labels, &body)) return -1;
    const int th = h * media_png_sheet_scale(h, w), band = 7 * label_scale(th) + SHEET_GAP, s = label_scale(th);
    const int bh = (int)body.shape[0], sw = (int)body.shape[1];
    if (bh + band > 65535) {
        core_tensor_free(&body);
        return core_error("contact sheet: %dx%d pixels with the title is over the PNG limit used here (65535)",
                          bh + band, sw);
    }
    int64_t shape[3] = {bh + band, sw, 3};
    if (core_tensor_alloc(out, CORE_U8, 3, shape)) {
        core_tensor_free(&body);
        return core_error_push("contact sheet: ");
    }
    uint8_t *img = out->data;
    for (size_t p = 0; p < (size_t)band * sw; p++) memcpy(img + p * 3, sheet_bg, 3);
    memcpy(img + (size_t)band * sw * 3, body.data, (size_t)bh * sw * 3);
    core_tensor_free(&body);
    char text[1024];
    media_png_fit_text(text, sizeof text, title, sw - 2 * SHEET_GAP, s);
    media_png_draw_text(img, bh + band, sw, SHEET_GAP, SHEET_GAP + s, s, label_fg, text);
    return 0;
}

int media_png_write_sheet_titled(const char *path, const uint8_t *videos, int n, int frames, int h, int w,
                                   int max_cols, const char *title, const char *const *labels) {
    core_tensor sheet;
    if (media_png_sheet_render_titled(videos, n, frames, h, w, max_cols, title, labels, &sheet))
        return core_error_push("png %s: ", path ? path : "(null)");
    int rc = media_png_write(path, sheet.data, (int)sheet.shape[0], (int)sheet.shape[1]);
    core_tensor_free(&sheet);
    return rc;
}
