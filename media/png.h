/* media/png.h — PNG frames and contact sheets through libpng.
 *
 * media_png_write / media_png_read: one 8-bit RGB image, written losslessly (read back bit-exact).
 *
 * Contact sheet (media/contact_sheet.c): a grid with one ROW PER SAMPLE and one COLUMN PER CHOSEN FRAME.
 * For N videos U8 [N, F, H, W, 3] and C columns (C = min(F, max_cols); max_cols <= 0 means all F frames) the
 * column j shows frame round(j * (F - 1) / (C - 1)) (frame 0 when C = 1), so the first and last frames are
 * always shown. Every tile is the frame scaled by u = media_png_sheet_scale(H, W): 1 when its larger side is at least
 * MEDIA_PNG_SHEET_MIN_PX (128), else ceil(128 / max(H, W)), each frame pixel drawn as a u x u block (nearest
 * neighbour), so that a 32 x 32 video is seen as 128 x 128 tiles. With H' = u H and W' = u W, the layout in pixels:
 *   gap g = 2 (background colour RGB 24,24,24 between tiles and around the border)
 *   label scale s = clamp(H' / 32, 1, 4); label band height L = 7 * s when labels are given, else 0
 *   sheet width  = C * W' + (C + 1) * g
 *   sheet height = N * (L + H') + (N + 1) * g
 *   sample i's label band starts at y = g + i * (L + H' + g), its tiles at y + L; column j's tile at
 *   x = g + j * (W' + g).
 * Labels are drawn in the band in white with a built-in 3 x 5 pixel font scaled by s (each character 4s wide,
 * one row s of space above). The font has digits, A-Z (lower case is drawn as upper case) and  . , : ; - _ + = /
 * ( ) # ' ! ? % [ ] < > * "; any other character is drawn as a filled block. Text past the sheet's width is cut.
 *
 * Titled sheet (media_png_write_sheet_titled): the same sheet with a title band on top, for the prompt of the
 * videos shown. The band is T = 7 * s + g pixels (s the label scale above) and everything of the untitled sheet moves
 * down by T, so sheet height = untitled height + T and the width is unchanged. The title is drawn like a label, in
 * white at x = g, y = g + s. Before drawing, the text is made to fit (media_png_fit_text): every character the font
 * cannot draw becomes '?' (a UTF-8 sequence counts as one character, so "café" gives "caf?", drawn as CAF?), and text wider than
 * the sheet is cut to the width with "..." at its end. A NULL title gives the untitled sheet, byte for byte. */
#ifndef MEDIA_PNG_H
#define MEDIA_PNG_H

#include <stddef.h>
#include <stdint.h>
#include "core/tensor.h"

/* Writes `rgb` (U8 [height, width, 3], contiguous) to `path` as an 8-bit RGB PNG (via "<path>.partial", renamed
 * when complete). 1 <= height, width <= 65535. Returns 0, or -1 with an error naming `path` (libpng's message
 * included); no file is left at `path` on failure. */
int media_png_write(const char *path, const uint8_t *rgb, int height, int width);

/* The largest image media_png_read decodes: 2^27 pixels (e.g. 16384 x 8192; 384 MiB as RGB), each side at most
 * 65535. A PNG's header states its size, so a small file can claim a huge image (a decompression bomb): larger ones are
 * refused from the header, before anything is allocated. */
#define MEDIA_PNG_MAX_PIXELS ((int64_t)1 << 27)

/* The most media_png_read lets libpng allocate at once (a chunk's data: text, colour profile; a row; zlib's state), and
 * the most ancillary chunks it keeps: a file declares its chunks' lengths, so a few bytes can claim gigabytes. */
#define MEDIA_PNG_MAX_CHUNK_BYTES (8 * 1024 * 1024)
#define MEDIA_PNG_MAX_CHUNKS 1000

/* Reads a PNG into `out`: a new owned tensor U8 [H, W, 3]. Palette, grey, 16-bit and alpha images are converted
 * to 8-bit RGB (alpha dropped, a palette's transparency (tRNS) too, as PIL's convert("RGB"); 16-bit truncated to
 * the high byte). Returns 0, or -1 naming `path` and what is wrong: a folder, an empty or short file, not a PNG (a
 * JPEG named as such), an image over MEDIA_PNG_MAX_PIXELS, a chunk over MEDIA_PNG_MAX_CHUNK_BYTES (named with its
 * declared length; nothing that large is allocated), a file that ends before the image does (truncated), or
 * libpng's message for a corrupt one. */
int media_png_read(const char *path, core_tensor *out);

/* The size a PNG's header states, without decoding it: the checks of media_png_read that need no pixels (a folder,
 * an empty or short file, not a PNG, no IHDR chunk first, a zero size, over MEDIA_PNG_MAX_PIXELS), for start-up and
 * --dry-run. width, height may be NULL. 0, or -1 naming path and what is wrong. */
int media_png_probe(const char *path, int *width, int *height);

/* Contact-sheet size for n samples of h x w frames with `frames` frames each, max_cols as above and labels
 * drawn (has_labels != 0) or not. Sets *sheet_h, *sheet_w, *cols. Returns 0, or -1 for bad sizes. */
int media_png_sheet_layout(int n, int frames, int h, int w, int max_cols, int has_labels, int *sheet_h,
                             int *sheet_w, int *cols);

/* Renders the contact sheet of `videos` (U8 [n, frames, h, w, 3], contiguous) into `out`: a new owned tensor
 * U8 [sheet_h, sheet_w, 3] laid out as documented above. `labels`: NULL (no label bands) or n strings (NULL
 * entries draw nothing). Returns 0, or -1 (bad sizes, out of memory). */
int media_png_sheet_render(const uint8_t *videos, int n, int frames, int h, int w, int max_cols,
                             const char *const *labels, core_tensor *out);

/* Renders the contact sheet and writes it to `path` as PNG. Returns 0, or -1 naming `path`. */
int media_png_write_sheet(const char *path, const uint8_t *videos, int n, int frames, int h, int w, int max_cols,
                            const char *const *labels);

/* Contact sheet with a title band (layout above): renders into `out` (a new owned tensor U8 [H, W, 3]) or writes
 * `path` as PNG. title: NULL for no band (then the output equals media_png_sheet_render / media_png_write_sheet);
 * labels as there. Typical calls: one video and its prompt (`vgrpo generate`),
 *   media_png_write_sheet_titled(path, video, 1, frames, h, w, 8, prompt, NULL);
 * or K samples of one prompt, labelled by seed or reward,
 *   media_png_write_sheet_titled(path, videos, K, frames, h, w, 8, prompt, labels);
 * Returns 0, or -1 (bad sizes, out of memory, a sheet over 65535 pixels; the write names `path`). */
int media_png_sheet_render_titled(const uint8_t *videos, int n, int frames, int h, int w, int max_cols,
                                    const char *title, const char *const *labels, core_tensor *out);
int media_png_write_sheet_titled(const char *path, const uint8_t *videos, int n, int frames, int h, int w,
                                   int max_cols, const char *title, const char *const *labels);

/* The tile scale of a sheet of h x w frames: 1 when max(h, w) >= MEDIA_PNG_SHEET_MIN_PX, else
 * ceil(MEDIA_PNG_SHEET_MIN_PX / max(h, w)) (nearest-neighbour upscaling of small frames; layout above). */
#define MEDIA_PNG_SHEET_MIN_PX 128
int media_png_sheet_scale(int h, int w);

/* Height in pixels of the title band of a sheet of h x w frames: 7 * s + 2 (s = clamp(h u / 32, 1, 4), u =
 * media_png_sheet_scale(h, w)). */
int media_png_title_band(int h, int w);

/* Makes `text` fit `width` pixels at font `scale` as the title is drawn: at most (width + scale) / (4 * scale)
 * characters, characters the font cannot draw replaced by '?' (one per UTF-8 sequence), and text that is longer
 * cut with "..." as its last three characters (fewer than 4 characters of room: cut without dots). Writes the result
 * (NUL-terminated, at most cap - 1 bytes) to out and returns its length. text NULL: "". */
int media_png_fit_text(char *out, size_t cap, const char *text, int width, int scale);

/* Draws `text` at (x, y) (top-left of the first character) into an RGB image [img_h, img_w, 3] with the
 * built-in 3 x 5 font at integer `scale` >= 1 in `color`; pixels outside the image are skipped. Returns the
 * x just past the last character. */
int media_png_draw_text(uint8_t *img, int img_h, int img_w, int x, int y, int scale, const uint8_t color[3],
                          const char *text);

#endif
