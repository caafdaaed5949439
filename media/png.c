/* media/png.c — 8-bit RGB PNG writer and reader through libpng (the simple row API of libpng's manual,
 * libpng-manual.txt, with setjmp error handling). Messages from libpng are kept and returned, never printed. */
#include "media/png.h"

#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

typedef struct {
    char msg[256];
} png_err_ctx;

static void on_png_error(png_structp png, png_const_charp msg) {
    png_err_ctx *ctx = png_get_error_ptr(png);
    if (ctx) snprintf(ctx->msg, sizeof ctx->msg, "%s", msg ? msg : "unknown libpng error");
    png_longjmp(png, 1);
}

static void on_png_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg; /* warnings (e.g. unknown chunks) are not errors; ignored */
}

int media_png_write(const char *path, const uint8_t *rgb, int height, int width) {
    if (!path || !path[0]) return core_error("png: output path is empty");
    if (!rgb) return core_error("png %s: no image data", path);
    if (height < 1 || width < 1 || height > 65535 || width > 65535)
        return core_error("png %s: bad image size %dx%d (1..65535)", path, width, height);
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.partial", path) >= sizeof tmp)
        return core_error("png %s: path too long", path);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) return core_error("png %s: cannot create %s: %s", path, tmp, strerror(errno));

    png_err_ctx ctx = {{0}};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_write_struct(&png, &info);
        fclose(fp);
        unlink(tmp);
        return core_error("png %s: out of memory creating the libpng writer", path);
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        fclose(fp);
        unlink(tmp);
        return core_error("png %s: libpng write failed: %s", path, ctx.msg);
    }
    png_init_io(png, fp);
    png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < height; y++) png_write_row(png, (png_const_bytep)(rgb + (size_t)y * width * 3));
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    int bad = ferror(fp);
    if (fclose(fp) != 0 || bad) {
        int e = errno;
        unlink(tmp);
        return core_error("png %s: writing %s failed: %s", path, tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return core_error("png %s: rename from %s failed: %s", path, tmp, strerror(e));
    }
    return 0;
}

int media_png_read(const char *path, core_tensor *out) {
    memset(out, 0, sizeof *out);
    if (!path || !path[0]) return core_error("png: input path is empty");
    FILE *fp = fopen(path, "rb");
    if (!fp) return core_error("png %s: cannot open: %s", path, strerror(errno));
    unsigned char sig[8];
    if (fread(sig, 1, 8, fp) != 8 || png_sig_cmp(sig, 0, 8) != 0) {
        fclose(fp);
        return core_error("png %s: not a PNG file (bad signature)", path);
    }
    png_err_ctx ctx = {{0}};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_read_struct(&png, &info, NULL);
        fclose(fp);
        return core_error("png %s: out of memory creating the libpng reader", path);
    }
    uint8_t *volatile buf = NULL;
    png_bytep *volatile rows = NULL;
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        fclose(fp);
        free(buf);
        free(rows);
        return core_error("png %s: libpng read failed: %s", path, ctx.msg);
    }
    png_init_io(png, fp);
    png_set_sig_bytes(png, 8);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);
    if (color & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)w * 3) {
        snprintf(ctx.msg, sizeof ctx.msg, "rows are %zu bytes after conversion, expected %zu",
                 (size_t)png_get_rowbytes(png, info), (size_t)w * 3);
        png_longjmp(png, 1);
    }
    buf = malloc((size_t)w * h * 3);
    rows = malloc(sizeof(png_bytep) * h);
    if (!buf || !rows) {
        snprintf(ctx.msg, sizeof ctx.msg, "out of memory for %ux%u", (unsigned)w, (unsigned)h);
        png_longjmp(png, 1);
    }
    for (png_uint_32 y = 0; y < h; y++) rows[y] = buf + (size_t)y * w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    fclose(fp);
    free(rows);
    int64_t shape[3] = {h, w, 3};
    core_tensor_wrap(out, buf, CORE_U8, 3, shape);
    out->owned = 1;
    return 0;
}
