/* tests/test_i2v_images.c — the input images of image to video as a user gives them (media/png.h media_png_read,
 * which `generate --image`, `vgrpo run`/`eval`'s image conditions and the sheets read them with): valid but unusual
 * PNGs are converted to 8-bit RGB (a palette with transparency as an RGBA image: alpha dropped), and bad files are
 * refused with one line that names the file and what is wrong (a folder, an empty file, a JPEG named .png, a file cut
 * short, a header claiming more pixels than the reader takes, refused before anything is allocated); prompt files
 * that do not fit the model (text prompts on an I2V-A14B model, images on a text-to-video one) refused up front. */
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/prompts.h"
#include "core/tensor.h"
#include "media/image.h"
#include "media/png.h"
#include "tests/test.h"

/* The PNG chunk CRC (ISO 3309, as the PNG spec's sample code). */
static uint32_t crc32_png(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return c ^ 0xffffffffu;
}

static void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = v; }

/* A 32 x 32 palette PNG (bit depth 8 or 4) of two entries, red (index 0) with a white 16 x 16 square (index 1) in
 * the middle, with a tRNS chunk (index 0 transparent) when trns. Written with libpng. */
static void write_palette_png(const char *path, int depth, int trns) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    REQUIRE(png && info && !setjmp(png_jmpbuf(png)));
    png_init_io(png, f);
    png_set_IHDR(png, info, 32, 32, depth, PNG_COLOR_TYPE_PALETTE, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_color pal[2] = {{200, 30, 30}, {255, 255, 255}};
    png_set_PLTE(png, info, pal, 2);
    png_byte alpha[1] = {0};
    if (trns) png_set_tRNS(png, info, alpha, 1, NULL);
    png_write_info(png, info);
    uint8_t row[32];
    for (int y = 0; y < 32; y++) {
        memset(row, 0, sizeof row);
        for (int x = 0; x < 32; x++) {
            const int v = x >= 8 && x < 24 && y >= 8 && y < 24;
            if (depth == 8) row[x] = (uint8_t)v;
            else row[x / 2] |= (uint8_t)(v << (x % 2 ? 0 : 4));
        }
        png_write_row(png, row);
    }
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    fclose(f);
}

/* A PNG whose header says w x h 8-bit RGB but whose one IDAT holds a single zlib-compressed zero byte. */
static void write_claiming_png(const char *path, uint32_t w, uint32_t h) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    static const uint8_t idat_data[9] = {0x78, 0x9c, 0x63, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01}; /* zlib of "\0" */
    uint8_t ihdr[4 + 4 + 13 + 4], idat[4 + 4 + 9 + 4], iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D'};
    put32(ihdr, 13), memcpy(ihdr + 4, "IHDR", 4), put32(ihdr + 8, w), put32(ihdr + 12, h);
    ihdr[16] = 8, ihdr[17] = 2, ihdr[18] = ihdr[19] = ihdr[20] = 0;
    put32(ihdr + 21, crc32_png(ihdr + 4, 17));
    put32(idat, 9), memcpy(idat + 4, "IDAT", 4), memcpy(idat + 8, idat_data, 9);
    put32(idat + 17, crc32_png(idat + 4, 13));
    put32(iend + 8, crc32_png(iend + 4, 4));
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fwrite(sig, 1, 8, f), fwrite(ihdr, 1, sizeof ihdr, f), fwrite(idat, 1, sizeof idat, f), fwrite(iend, 1, 12, f);
    fclose(f);
}

/* media_png_read(path) fails with `want` in its message. */
static void read_refused(const char *path, const char *want, int line) {
    core_tensor t;
    if (!media_png_read(path, &t)) {
        core_tensor_free(&t);
        test_fail(__FILE__, line, "%s was read; want the error \"%s\"", path, want);
    } else if (!strstr(core_last_error(), want) || !strstr(core_last_error(), path))
        test_fail(__FILE__, line, "want \"%s\" (and the path) in: %s", want, core_last_error());
}

/* A palette PNG with transparency (tRNS) is an RGB image to vgrpo, as PIL's convert("RGB") makes it (the alpha
 * dropped): it had been refused ("rows are 128 bytes after conversion, expected 96"). `generate --image` takes it. */
TEST(i2v_image_palette_with_transparency) {
    const char *dir = test_tmpdir();
    char p[4300], out[16384];
    for (int depth = 8; depth >= 4; depth -= 4)
        for (int trns = 0; trns <= 1; trns++) {
            snprintf(p, sizeof p, "%s/pal%d_%d.png", dir, depth, trns);
            write_palette_png(p, depth, trns);
            core_tensor t;
            if (media_png_read(p, &t)) {
                test_fail(__FILE__, __LINE__, "depth %d tRNS %d: %s", depth, trns, core_last_error());
                continue;
            }
            const uint8_t *d = t.data;
            CHECK(t.dtype == CORE_U8 && t.ndim == 3 && t.shape[0] == 32 && t.shape[1] == 32 && t.shape[2] == 3);
            const size_t c = (16 * 32 + 16) * 3;
            CHECK_MSG(d[0] == 200 && d[1] == 30 && d[2] == 30 && d[c] == 255 && d[c + 1] == 255 && d[c + 2] == 255,
                      "depth %d tRNS %d: corner %d,%d,%d centre %d,%d,%d", depth, trns, d[0], d[1], d[2], d[c],
                      d[c + 1], d[c + 2]);
            core_tensor_free(&t);
        }
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-ti2v --out %s/model --seed 0", test_vgrpo_bin(),
                     dir) == 0);
    snprintf(p, sizeof p, "%s/pal8_1.png", dir);
    const int st = test_run(out, sizeof out, "%s generate --pipeline %s/model --prompt 'a white square' --image %s "
                                             "--out %s/g.mp4 --frames 5 --height 32 --width 32 --steps 2",
                            test_vgrpo_bin(), dir, p, dir);
    CHECK_MSG(st == 0, "generate --image (palette with tRNS) failed: %s", out);
}

/* A header claiming a huge image is refused from the header, naming the size, before any pixel buffer is allocated
 * (it had been malloc'd: 30000 x 30000 x 3 bytes, then "Not enough image data"; 100000 x 100000: "out of memory").
 * Under a 1 GiB address-space limit the refusal is the same, so nothing large was asked for. */
TEST(i2v_image_huge_header_refused) {
    const char *dir = test_tmpdir();
    char p[4300], out[16384], want[200];
    static const uint32_t sizes[][2] = {{100000, 100000}, {30000, 30000}, {70000, 1}, {16384, 8193}};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/claims%d.png", dir, i);
        write_claiming_png(p, sizes[i][0], sizes[i][1]);
        snprintf(want, sizeof want, "%u x %u pixels, over the reader's limit", sizes[i][0], sizes[i][1]);
        read_refused(p, want, __LINE__);
    }
    /* at the limit the header is accepted; the missing data is then the error */
    snprintf(p, sizeof p, "%s/at_limit.png", dir);
    write_claiming_png(p, 16384, 8192);
    core_tensor t;
    CHECK(media_png_read(p, &t) != 0 && !strstr(core_last_error(), "over the reader's limit"));
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-ti2v --out %s/model --seed 0", test_vgrpo_bin(),
                     dir) == 0);
    snprintf(p, sizeof p, "%s/claims1.png", dir);
    /* AddressSanitizer (make asan: VGRPO_ASAN=1) reserves terabytes of shadow address space: no limit there */
    const int st = test_run(out, sizeof out, "%s%s generate --pipeline %s/model --prompt a --image %s --out %s/g.mp4 "
                                             "--frames 5 --height 32 --width 32 --steps 2",
                            getenv("VGRPO_ASAN") ? "" : "ulimit -v 1048576; ", test_vgrpo_bin(), dir, p, dir);
    CHECK_MSG(st == 1 && strstr(out, "--image: png ") && strstr(out, "30000 x 30000 pixels, over the reader's limit"),
              "exit %d: %s", st, out);
    snprintf(p, sizeof p, "%s/g.mp4", dir);
    CHECK(access(p, F_OK) != 0);
    /* the header is checked at start-up, so --dry-run refuses a prompt file that names such an image (file:line) */
    for (int i = 0; i < 4; i++) {
        int w = 0, h = 0;
        snprintf(p, sizeof p, "%s/claims%d.png", dir, i);
        snprintf(want, sizeof want, "%u x %u pixels, over the reader's limit", sizes[i][0], sizes[i][1]);
        CHECK_MSG(media_png_probe(p, &w, &h) == -1 && strstr(core_last_error(), want), "%s: %s", p, core_last_error());
    }
    snprintf(p, sizeof p, "%s/at_limit.png", dir);
    int w = 0, h = 0;
    CHECK(media_png_probe(p, &w, &h) == 0 && w == 16384 && h == 8192);
    snprintf(p, sizeof p, "%s/p.jsonl", dir);
    test_write_text(NULL, p, "{\"prompt\": \"a\", \"image\": \"at_limit.png\"}\n{\"prompt\": \"b\", \"image\": \"claims0.png\"}\n");
    const int rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v.yaml --dry-run --set model.path=%s/model --set "
                            "model.init_preset= --set data.prompt_file=%s --set data.eval_prompt_file=%s",
                            test_vgrpo_bin(), dir, p, p);
    CHECK_MSG(rc == 1 && strstr(out, "p.jsonl:2: image: png ") && strstr(out, "100000 x 100000 pixels, over the reader's "
              "limit"), "exit %d: %s", rc, out);
}

/* Files that are not PNG images: each refusal says what the file is (they had been "not a PNG file (bad
 * signature)" for a folder, an empty file and a JPEG, and libpng's "Read Error" for a file cut short). */
TEST(i2v_image_bad_files_named) {
    const char *dir = test_tmpdir();
    char p[4300], q[4300];
    snprintf(p, sizeof p, "%s/folder.png", dir);
    REQUIRE(mkdir(p, 0777) == 0);
    read_refused(p, "is a folder, not a PNG file", __LINE__);
    snprintf(p, sizeof p, "%s/empty.png", dir);
    FILE *f = fopen(p, "wb");
    REQUIRE(f);
    fclose(f);
    read_refused(p, "not a PNG file (the file is empty)", __LINE__);
    snprintf(p, sizeof p, "%s/short.png", dir);
    REQUIRE((f = fopen(p, "wb")));
    fwrite("\x89PNG", 1, 4, f);
    fclose(f);
    read_refused(p, "not a PNG file (shorter than the PNG signature)", __LINE__);
    snprintf(p, sizeof p, "%s/photo.png", dir); /* a JPEG's first bytes (SOI, APP0 JFIF) under a .png name */
    REQUIRE((f = fopen(p, "wb")));
    fwrite("\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00", 1, 20, f);
    fclose(f);
    read_refused(p, "not a PNG file (a JPEG file: images are read as PNG only)", __LINE__);
    snprintf(p, sizeof p, "%s/gif.png", dir);
    REQUIRE((f = fopen(p, "wb")));
    fputs("GIF89a, not a png at all", f);
    fclose(f);
    read_refused(p, "not a PNG file (bad signature)", __LINE__);
    /* a valid PNG cut short: in its header, and in its image data */
    uint8_t img[32 * 32 * 3];
    for (size_t i = 0; i < sizeof img; i++) img[i] = (uint8_t)(i * 37 + i / 96);
    snprintf(q, sizeof q, "%s/whole.png", dir);
    REQUIRE_OK(media_png_write(q, img, 32, 32));
    struct stat st;
    REQUIRE(stat(q, &st) == 0 && st.st_size > 100);
    char data[16384];
    REQUIRE((f = fopen(q, "rb")) && fread(data, 1, (size_t)st.st_size, f) == (size_t)st.st_size);
    fclose(f);
    const long cuts[2] = {20, (long)st.st_size - 30};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/cut%d.png", dir, i);
        REQUIRE((f = fopen(p, "wb")));
        fwrite(data, 1, (size_t)cuts[i], f);
        fclose(f);
        char want[200];
        snprintf(want, sizeof want, "the file ends after %ld bytes, before the image does (truncated)", cuts[i]);
        read_refused(p, want, __LINE__);
    }
    core_tensor t;
    REQUIRE_OK(media_png_read(q, &t));
    CHECK(!memcmp(t.data, img, sizeof img));
    core_tensor_free(&t);
}

/* Text-only prompt files on a Wan 2.2 I2V-A14B model (it samples only with an image) are refused by the checks that
 * read the transformer's config: `run --dry-run`, `vgrpo eval` and `vgrpo parity` name the key, the file and the
 * model, and create nothing (the dry run had passed; eval had started its workers, made --out and failed in a worker
 * with "which vgrpo does not sample yet"; parity had started its processes and its trainer failed). An image recipe
 * on a text-to-video model names both image-to-video pipelines vgrpo runs (the message had called I2V-A14B "not
 * supported"). */
TEST(i2v_text_prompts_on_i2v_a14b_refused) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], p[4300], want[4600];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-i2v --out %s/i2v --seed 0", bin, dir) == 0);
    snprintf(p, sizeof p, "%s/text.txt", dir);
    test_write_text(NULL, p, "a red square\na blue square\n");
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v-a14b.yaml --dry-run --set model.path=%s/i2v "
                                       "--set model.init_preset= --set data.prompt_file=%s --set data.eval_prompt_file=%s "
                                       "--set rollout.prompts_per_step=1", bin, dir, p, p);
    snprintf(want, sizeof want, "data.prompt_file: %s has no images, but model.path %s/i2v is a Wan 2.2 I2V-A14B model "
                                "(its transformer takes 36 channels for 16 out", p, dir);
    CHECK_MSG(st == 1 && strstr(out, want) && strstr(out, "needs prompt files with an image"), "exit %d: %s", st, out);
    st = test_run(out, sizeof out, "%s eval recipes/tiny-cpu-i2v-a14b.yaml --set model.path=%s/i2v "
                                   "--set model.init_preset= --prompts %s --out %s/ev", bin, dir, p, dir);
    snprintf(want, sizeof want, "--prompts: %s has no images, but model.path %s/i2v is a Wan 2.2 I2V-A14B model", p,
             dir);
    CHECK_MSG(st == 1 && strstr(out, want), "exit %d: %s", st, out);
    snprintf(p, sizeof p, "%s/ev", dir);
    CHECK_MSG(access(p, F_OK) != 0, "eval made %s", p);
    st = test_run(out, sizeof out, "%s parity recipes/tiny-cpu-i2v-a14b.yaml --set model.path=%s/i2v "
                                   "--set model.init_preset= --set data.prompt_file=%s/text.txt "
                                   "--set data.eval_prompt_file=%s/text.txt --set logging.run_dir=%s/par",
                  bin, dir, dir, dir, dir);
    CHECK_MSG(st == 1 && strstr(out, "has no images, but model.path"), "exit %d: %s", st, out);
    snprintf(p, sizeof p, "%s/par", dir);
    CHECK_MSG(access(p, F_OK) != 0, "parity made %s", p);
    /* its image recipe passes the same checks */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v-a14b.yaml --dry-run --set model.path=%s/i2v "
                                   "--set model.init_preset=", bin, dir);
    CHECK_MSG(st == 0, "exit %d: %s", st, out);
    /* an image recipe on a text-to-video model */
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/t2v --seed 0", bin, dir) == 0);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v.yaml --dry-run --set model.path=%s/t2v "
                                   "--set model.init_preset=", bin, dir);
    CHECK_MSG(st == 1 && strstr(out, "is a text-to-video pipeline") && strstr(out, "tiny-ti2v") &&
                  strstr(out, "tiny-i2v") && !strstr(out, "I2V-A14B (36 input channels) and"),
              "exit %d: %s", st, out);
}

/* An image path with a control character (JSON "\n", "\u001b") is refused where the prompt file is read, at file:line,
 * quoted with the byte escaped: the error stays one line (a newline in the path had split "cannot open" in two). */
TEST(i2v_image_path_control_character) {
    const char *dir = test_tmpdir();
    static const char *const bad[2] = {"img\\nx.png", "img\\u001b[31m.png"};
    static const char *const want[2] = {"\"image\" has a control character (byte 4): \"img\\x0ax.png\"",
                                        "\"image\" has a control character (byte 4): \"img\\x1b[31m.png\""};
    char p[4300], w[4600];
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/c%d.jsonl", dir, i);
        FILE *f = fopen(p, "w");
        REQUIRE(f);
        fprintf(f, "# a comment\n{\"prompt\": \"a red square\", \"image\": \"%s\"}\n", bad[i]);
        fclose(f);
        core_prompts pr;
        REQUIRE(core_prompts_read(&pr, p) != 0);
        snprintf(w, sizeof w, "%s:2: %s", p, want[i]);
        CHECK_MSG(strstr(core_last_error(), w) && !strchr(core_last_error(), '\n'), "want \"%s\" on one line, got: %s",
                  w, core_last_error());
    }
}

/* The same checks where model.path has no pipeline yet: on the preset the job would write there (model.init_preset)
 * or its folder's name names, as the estimate takes it. `run --dry-run` refuses; `run` and `eval` refuse before
 * writing the preset or making a folder (they had written the tiny pipeline, then refused; the dry runs had passed). */
TEST(i2v_prompts_checked_on_init_preset) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], p[4300], want[4600];
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v.yaml --dry-run --set model.path=%s/m "
                                       "--set model.init_preset=tiny", bin, dir);
    snprintf(want, sizeof want, "data.prompt_file: recipes/prompts/i2v_squares.jsonl gives images (image to video), but "
                                "model.init_preset tiny (%s/m has no pipeline yet) is a text-to-video pipeline", dir);
    CHECK_MSG(st == 1 && strstr(out, want), "exit %d: %s", st, out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v.yaml --steps 1 --set model.path=%s/m "
                                   "--set model.init_preset=tiny --set logging.run_dir=%s/r", bin, dir, dir);
    CHECK_MSG(st == 1 && strstr(out, want), "exit %d: %s", st, out);
    st = test_run(out, sizeof out, "%s eval recipes/tiny-cpu-i2v.yaml --set model.path=%s/m --set model.init_preset=tiny "
                                   "--out %s/ev", bin, dir, dir);
    CHECK_MSG(st == 1 && strstr(out, "data.eval_prompt_file: recipes/prompts/i2v_squares.jsonl gives images") &&
                  strstr(out, "model.init_preset tiny ("),
              "exit %d: %s", st, out);
    const char *made[3] = {"m", "r", "ev"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, made[i]);
        CHECK_MSG(access(p, F_OK) != 0, "%s was made", p);
    }
    /* text prompts on the tiny-i2v preset, and on the I2V-A14B recipe's model folder named by its name */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/m "
                                   "--set model.init_preset=tiny-i2v", bin, dir);
    CHECK_MSG(st == 1 && strstr(out, "has no images, but model.init_preset tiny-i2v (") &&
                  strstr(out, "is a Wan 2.2 I2V-A14B model"),
              "exit %d: %s", st, out);
    st = test_run(out, sizeof out, "%s run recipes/wan2.2-i2v-a14b.yaml --dry-run "
                                   "--set model.path=%s/Wan2.2-I2V-A14B-Diffusers "
                                   "--set data.prompt_file=recipes/prompts/scenes.txt "
                                   "--set data.eval_prompt_file=recipes/prompts/scenes_eval.txt", bin, dir);
    CHECK_MSG(st == 1 && strstr(out, "has no images, but the preset wan2.2-i2v-a14b ("), "exit %d: %s", st, out);
    /* what fits passes: images on tiny-ti2v and tiny-i2v, text on tiny-ti2v */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v.yaml --dry-run --set model.path=%s/m "
                                   "--set model.init_preset=tiny-ti2v && %s run recipes/tiny-cpu-i2v.yaml --dry-run "
                                   "--set model.path=%s/m --set model.init_preset=tiny-i2v && %s run recipes/tiny-cpu.yaml "
                                   "--dry-run --set model.path=%s/m --set model.init_preset=tiny-ti2v",
                  bin, dir, bin, dir, bin, dir);
    CHECK_MSG(st == 0, "exit %d: %s", st, out);
}

/* An image whose aspect is far from the video's (1000 x 1 to 32 x 32): swscale makes no Lanczos context for it in one
 * pass, so it is stretched one axis at a time (it had been refused: "sws_getContext (RGB24 1000x1 -> 32x32)
 * failed"). A one-colour strip stays that colour within a few levels (swscale's Lanczos moves the last row's edge
 * pixels by up to 3 in one pass too, e.g. 64 x 1000 to 64 x 32); `generate --image` takes such a PNG. */
TEST(i2v_image_far_aspect_stretched) {
    const char *dir = test_tmpdir();
    static const int sizes[][4] = {{1000, 1, 32, 32}, {1, 1000, 32, 32}, {3, 5000, 64, 64}, {4000, 4, 64, 48}};
    for (int i = 0; i < 4; i++) {
        const int w = sizes[i][0], h = sizes[i][1], W = sizes[i][2], H = sizes[i][3];
        uint8_t *src = malloc((size_t)w * h * 3), *dst = malloc((size_t)W * H * 3);
        REQUIRE(src && dst);
        for (int k = 0; k < w * h; k++) src[3 * k] = 200, src[3 * k + 1] = 30, src[3 * k + 2] = 90;
        if (media_rgb_resize(src, h, w, dst, H, W)) {
            test_fail(__FILE__, __LINE__, "%d x %d -> %d x %d: %s", w, h, W, H, core_last_error());
        } else {
            int far = 0;
            for (int k = 0; k < W * H; k++)
                far += abs(dst[3 * k] - 200) > 4 || abs(dst[3 * k + 1] - 30) > 4 || abs(dst[3 * k + 2] - 90) > 4;
            CHECK_MSG(far == 0, "%d x %d -> %d x %d: %d pixels off the colour", w, h, W, H, far);
        }
        free(src), free(dst);
    }
    char p[4300], out[16384];
    uint8_t row[1000 * 3];
    for (int k = 0; k < 1000; k++) row[3 * k] = (uint8_t)k, row[3 * k + 1] = 30, row[3 * k + 2] = 90;
    snprintf(p, sizeof p, "%s/strip.png", dir);
    REQUIRE_OK(media_png_write(p, row, 1, 1000));
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-ti2v --out %s/model --seed 0", test_vgrpo_bin(),
                     dir) == 0);
    const int st = test_run(out, sizeof out, "%s generate --pipeline %s/model --prompt a --image %s --out %s/g.mp4 "
                                             "--frames 5 --height 32 --width 32 --steps 2", test_vgrpo_bin(), dir, p, dir);
    CHECK_MSG(st == 0, "generate --image (1000 x 1) failed: %s", out);
}

/* A sheet's input image that is gone by the time the sheet is drawn (the run's sample videos come every
 * logging.video_every steps, long after the conditions were made): its tiles are left the sheet's background, the
 * sheet is written and the call answers 1 naming the row and the image, so the run warns and goes on (it had
 * stopped: "contact sheet row 0: png ...: cannot open"). */
TEST(i2v_image_sheet_survives_a_missing_image) {
    const char *dir = test_tmpdir();
    char gone[4300], img[4300], sheet[4300];
    uint8_t px[32 * 32 * 3], video[2 * 32 * 32 * 3];
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 7 + 3);
    for (size_t i = 0; i < sizeof video; i++) video[i] = (uint8_t)(i * 13 + 1);
    snprintf(gone, sizeof gone, "%s/gone.png", dir);
    snprintf(img, sizeof img, "%s/img.png", dir);
    snprintf(sheet, sizeof sheet, "%s/sheet.png", dir);
    REQUIRE_OK(media_png_write(img, px, 32, 32));
    const char *const images[2] = {gone, img};
    const int rc = media_image_write_sheet(sheet, video, 2, 1, 32, 32, 8, "a title", NULL, images);
    CHECK_MSG(rc == 1, "returned %d: %s", rc, core_last_error());
    CHECK_MSG(strstr(core_last_error(), "row 0: png ") && strstr(core_last_error(), gone) &&
                  strstr(core_last_error(), "its image tile is left blank"),
              "got: %s", core_last_error());
    core_tensor t;
    REQUIRE_OK(media_png_read(sheet, &t));
    /* 32-pixel frames drawn 4 times larger (128-pixel tiles, nearest neighbour: media/png.h): label scale 4, title
     * band 30, gap 2, no labels: row r's tiles at y = 32 + 130 r, column c at x = 2 + 130 c */
    const int64_t Wd = t.shape[1];
    REQUIRE(t.shape[0] == 30 + 2 * 128 + 3 * 2 && Wd == 2 * 128 + 3 * 2);
    const uint8_t *d = t.data;
    int blank = 1, image = 1, frame = 1;
    for (int y = 0; y < 128; y++)
        for (int x = 0; x < 128; x++)
            for (int ch = 0; ch < 3; ch++) {
                const int src = ((y / 4) * 32 + x / 4) * 3 + ch;
                blank &= d[((32 + y) * Wd + 2 + x) * 3 + ch] == 24;
                image &= d[((162 + y) * Wd + 2 + x) * 3 + ch] == px[src];
                frame &= d[((32 + y) * Wd + 132 + x) * 3 + ch] == video[src];
            }
    CHECK_MSG(blank && image && frame, "row 0's image tile blank %d, row 1's the image %d, row 0's frame %d", blank,
              image, frame);
    core_tensor_free(&t);
}
