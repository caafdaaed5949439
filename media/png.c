/* media/png.c — 8-bit RGB PNG writer and reader through libpng (the simple row API of libpng's manual,
 * libpng-manual.txt, with setjmp error handling). Messages from libpng are kept and returned, never printed. */
#include "media/png.h"

#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"

typedef struct {
    char msg[256];
    unsigned long long refused; /* bytes of the first allocation over MEDIA_PNG_MAX_CHUNK_BYTES libpng asked for */
    char refused_chunk[5];      /* the chunk being read then ("" when none) */
} png_err_ctx;

/* libpng's allocator for the reader: every block libpng asks for (a chunk's data, a row, zlib's state) is at most
 * MEDIA_PNG_MAX_CHUNK_BYTES. A chunk's length is read from the file, and libpng 1.6.39 allocates an ancillary chunk
 * (tEXt, iCCP, ...) whole before reading it, without applying png_set_chunk_malloc_max to it: a 54-byte file declaring
 * a 2 GiB tEXt chunk took 2 GiB before failing as truncated. Refused here, libpng treats the chunk as one it cannot
 * hold (a benign error: it skips the chunk's bytes), and the first refusal is kept for the message. */
static png_voidp png_bounded_malloc(png_structp png, png_alloc_size_t n) {
    png_err_ctx *ctx = png_get_mem_ptr(png);
    if (n > MEDIA_PNG_MAX_CHUNK_BYTES) {
        if (ctx && !ctx->refused) {
            ctx->refused = (unsigned long long)n;
            const png_uint_32 t = png_get_io_chunk_type(png);
            for (int k = 0; k < 4; k++) {
                const char c = (char)(t >> (24 - 8 * k));
                ctx->refused_chunk[k] = c >= 33 && c <= 126 ? c : '?';
            }
            ctx->refused_chunk[4] = 0;
        }
        return NULL;
    }
    return malloc(n ? n : 1);
}

static void png_bounded_free(png_structp png, png_voidp p) {
    (void)png;
    free(p);
}

static void on_png_error(png_structp png, png_const_charp msg) {
    png_err_ctx *ctx = png_get_error_ptr(png);
    if (ctx) snprintf(ctx->msg, sizeof ctx->msg, "%s", msg ? msg : "unknown libpng error");
    png_longjmp(png, 1);
}

/* The reader's input: a short read is reported as the file ending early (libpng's own read says "Read Error"). */
typedef struct {
    FILE *fp;
    unsigned long long offset; /* bytes read so far */
} png_reader;

static void on_png_read(png_structp png, png_bytep data, size_t n) {
    png_reader *r = png_get_io_ptr(png);
    const size_t got = fread(data, 1, n, r->fp);
    r->offset += got;
    if (got == n) return;
    char m[200];
    if (ferror(r->fp)) snprintf(m, sizeof m, "reading failed at byte %llu: %s", r->offset, strerror(errno));
    else snprintf(m, sizeof m, "the file ends after %llu bytes, before the image does (truncated)", r->offset);
    png_error(png, m);
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
    unlink(tmp); /* a leftover of a write cut short: the temporary is new (O_EXCL), never written through a link */
    FILE *fp = core_fopen_nofollow(tmp, "wx");
    if (!fp) return core_error_push("png %s: ", path);

    png_err_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
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

/* path opened at the end of its PNG signature: *fpp, or -1 naming what is wrong (as media_png_read). */
static int open_signed(const char *path, FILE **fpp) {
    *fpp = NULL;
    if (!path || !path[0]) return core_error("png: input path is empty");
    FILE *fp = fopen(path, "rb");
    if (!fp) return core_error("png %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (!fstat(fileno(fp), &st) && S_ISDIR(st.st_mode)) {
        fclose(fp);
        return core_error("png %s: is a folder, not a PNG file", path);
    }
    unsigned char sig[8];
    const size_t got = fread(sig, 1, 8, fp);
    if (got != 8 || png_sig_cmp(sig, 0, 8) != 0) {
        const int err = ferror(fp) ? errno : 0;
        fclose(fp);
        if (err) return core_error("png %s: cannot read: %s", path, strerror(err));
        if (got >= 3 && sig[0] == 0xff && sig[1] == 0xd8 && sig[2] == 0xff)
            return core_error("png %s: not a PNG file (a JPEG file: images are read as PNG only)", path);
        return core_error("png %s: not a PNG file (%s)", path, got == 0 ? "the file is empty"
                                                              : got < 8 ? "shorter than the PNG signature"
                                                                        : "bad signature");
    }
    *fpp = fp;
    return 0;
}

/* The size limit of media_png_read: -1 naming path and the size when w x h is over it. */
static int size_ok(const char *path, uint64_t w, uint64_t h) {
    if (w > 65535 || h > 65535 || w * h > (uint64_t)MEDIA_PNG_MAX_PIXELS)
        return core_error("png %s: %llu x %llu pixels, over the reader's limit (65535 a side and %lld pixels, e.g. "
                          "16384 x 8192): shrink the image", path, (unsigned long long)w, (unsigned long long)h,
                          (long long)MEDIA_PNG_MAX_PIXELS);
    return 0;
}

int media_png_probe(const char *path, int *width, int *height) {
    FILE *fp;
    if (open_signed(path, &fp)) return -1;
    unsigned char c[16]; /* the first chunk: length (13), "IHDR", width, height (big-endian) */
    const size_t got = fread(c, 1, sizeof c, fp);
    fclose(fp);
    if (got != sizeof c || memcmp(c + 4, "IHDR", 4))
        return core_error("png %s: %s", path, got != sizeof c ? "the file ends inside its header" : "no IHDR chunk first");
    const uint64_t w = (uint64_t)c[8] << 24 | (uint64_t)c[9] << 16 | (uint64_t)c[10] << 8 | c[11];
    const uint64_t h = (uint64_t)c[12] << 24 | (uint64_t)c[13] << 16 | (uint64_t)c[14] << 8 | c[15];
    if (w == 0 || h == 0) return core_error("png %s: a %llu x %llu image", path, (unsigned long long)w, (unsigned long long)h);
    if (size_ok(path, w, h)) return -1;
    if (width) *width = (int)w;
    if (height) *height = (int)h;
    return 0;
}

int media_png_read(const char *path, core_tensor *out) {
    memset(out, 0, sizeof *out);
    FILE *fp;
    if (open_signed(path, &fp)) return -1;
    png_err_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    png_structp png = png_create_read_struct_2(PNG_LIBPNG_VER_STRING, &ctx, on_png_error, on_png_warning, &ctx,
                                               png_bounded_malloc, png_bounded_free);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_read_struct(&png, &info, NULL);
        fclose(fp);
        return core_error("png %s: out of memory creating the libpng reader", path);
    }
    /* libpng's own limits, as far as this version applies them: a chunk's allocation (also the decompressed size of
     * zTXt / iCCP), the number of ancillary chunks kept. The image's sides are bounded by size_ok below, from the
     * header and before any pixel is allocated (png_set_user_limits would refuse first, as "Invalid IHDR data") */
    png_set_chunk_malloc_max(png, MEDIA_PNG_MAX_CHUNK_BYTES);
    png_set_chunk_cache_max(png, MEDIA_PNG_MAX_CHUNKS);
    uint8_t *volatile buf = NULL;
    png_bytep *volatile rows = NULL;
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        fclose(fp);
        free(buf);
        free(rows);
        if (ctx.refused)
            return core_error("png %s: its %s chunk asks for %llu bytes, over the reader's limit of %d bytes at "
                              "once (not read; then: %s)", path, ctx.refused_chunk, ctx.refused,
                              MEDIA_PNG_MAX_CHUNK_BYTES, ctx.msg);
        return core_error("png %s: libpng read failed: %s", path, ctx.msg);
    }
    png_reader rd = {fp, 8};
    png_set_read_fn(png, &rd, on_png_read);
    png_set_sig_bytes(png, 8);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if (size_ok(path, w, h)) { /* before any pixel is allocated */
        png_destroy_read_struct(&png, &info, NULL);
        fclose(fp);
        return -1;
    }
    int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);
    /* a palette's tRNS chunk becomes an alpha channel when the palette is expanded: dropped as an RGBA image's */
    if ((color & PNG_COLOR_MASK_ALPHA) || (color == PNG_COLOR_TYPE_PALETTE && png_get_valid(png, info, PNG_INFO_tRNS)))
        png_set_strip_alpha(png);
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
