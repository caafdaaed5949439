/* tests/test_i2v_run.c — image to video end to end on the `tiny-ti2v` preset (vgrpo init-model: tiny's DiT as a
 * TI2V pipeline, a VAE with an encoder): prompt files of JSON lines with a PNG per prompt (core/prompts.h), the
 * images stretched and encoded at start-up (trainer/run/run_setup.c), the conditions carried by the rollout requests and
 * the trajectories.
 * Checks: `vgrpo parity` exactly 0 with one worker and one trainer rank, with two workers and two trainer ranks
 * (the conditions in the dp broadcast) and with Ulysses sequence parallelism; a local run equals a colocated one bit
 * for bit and resumes exactly; `generate --image` (the first frame is the image's, whatever the seed); `vgrpo eval`
 * (the in-run eval's rewards, sheets led by the input image); the run's sample-video sheets led by it too; the
 * preset (encoder written, decoder as tiny's); JSON-lines prompt files; bad input refused at start-up naming
 * file:line (a missing image, a file that is not a PNG, a folder, a corrupt PNG, a prompt without an image among
 * prompts with one, an eval file without images), an image recipe on a text-to-video model, one latent frame. */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

#include "core/prompts.h"
#include "core/safetensors.h"
#include "media/image.h"
#include "media/png.h"
#include "tests/metrics_rows.h"
#include "tests/i2v_prompts.h"
#include "tests/parity_json.h"
#include "tests/test.h"

static void make_model(const char *dir) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-ti2v --out %s/model --seed 0", test_vgrpo_bin(),
                     dir) == 0);
    CHECK(strstr(out, "preset tiny-ti2v"));
}

TEST(i2v_parity_zero_tiny_ti2v) {
    const char *dir = test_tmpdir();
    char out[16384];
    make_model(dir);
    i2v_write_square_prompts(dir, 1);
    i2v_parity_zero("", dir, "a", "", out, sizeof out);
    CHECK(strstr(out, "PASS") != NULL);
    /* two workers (3 samples per forward), two trainer ranks (the conditions travel in the dp broadcast) */
    i2v_parity_zero("", dir, "b", "--set parallel.rollout_workers=2 --set rollout.batch_size=3 "
                                      "--set parallel.trainer_ranks=2 --set algorithm.micro_batch_size=5", out, sizeof out);
    CHECK(strstr(out, "PASS") && strstr(out, "2 worker(s)") && strstr(out, "2 rank(s)"));
    /* sequence parallel (Ulysses 2: per-token timesteps sliced with the tokens) */
    i2v_parity_zero("", dir, "c", "--set parallel.trainer_ranks=2 --set parallel.sp=2 --set parallel.ulysses_degree=2",
                         out, sizeof out);
}

/* A local run equals a colocated one bit for bit (metrics and rewards), and 2 steps + resume + 1 equals 3 straight. */
TEST(i2v_run_local_colocated_resume) {
    const char *dir = test_tmpdir();
    make_model(dir);
    i2v_write_square_prompts(dir, 1);
    i2v_check_local_colocated_resume(dir, "--set data.eval_samples_per_prompt=1 --set logging.eval_every=2 --set checkpoint.every=2 "
                                          "--set algorithm.beta=0.05 --set optim.total_steps=3");
}

TEST(i2v_preset_and_prompt_files) {
    const char *dir = test_tmpdir();
    char p[4300], q[4300];
    make_model(dir);
    /* the preset's VAE has the encoder; its decoder tensors are tiny's */
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/t2v --seed 0", test_vgrpo_bin(), dir) == 0);
    snprintf(p, sizeof p, "%s/model/vae/diffusion_pytorch_model.safetensors", dir);
    snprintf(q, sizeof q, "%s/t2v/vae/diffusion_pytorch_model.safetensors", dir);
    st_file *a = st_open(p), *b = st_open(q);
    REQUIRE(a && b);
    CHECK(st_find(a, "encoder.conv_in.weight") >= 0 && st_find(a, "quant_conv.weight") >= 0);
    CHECK(st_find(b, "encoder.conv_in.weight") < 0);
    for (int i = 0; i < st_count(b); i++) {
        const char *nm = st_name(b, i);
        const st_info *ia = st_info_at(a, st_find(a, nm)), *ib = st_info_at(b, i);
        int64_t n = 1;
        for (int d = 0; d < ib->ndim; d++) n *= ib->shape[d];
        float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
        REQUIRE(ia && x && y && !st_read_f32(a, nm, x, n) && !st_read_f32(b, nm, y, n));
        CHECK_MSG(!memcmp(x, y, sizeof(float) * (size_t)n), "decoder tensor %s differs from tiny's", nm);
        free(x), free(y);
    }
    st_close(a), st_close(b);
    snprintf(p, sizeof p, "%s/model/model_index.json", dir);
    CHECK(test_run(out, sizeof out, "grep -q '\"expand_timesteps\": true' %s", p) == 0);

    /* JSON lines: the image relative to the file's folder, other strings as metadata, numbered by line */
    i2v_write_square_prompts(dir, 1);
    snprintf(p, sizeof p, "%s/p.jsonl", dir);
    core_prompts pr;
    REQUIRE_OK(core_prompts_read(&pr, p));
    CHECK(pr.n == 4 && pr.n_images == 4 && pr.jsonl && !pr.json);
    snprintf(q, sizeof q, "%s/img/green.png", dir);
    CHECK(!strcmp(pr.text[1], "a green square") && !strcmp(pr.image[1], q) && pr.line[1] == 2);
    CHECK(!strcmp(json_string_value(json_object_get(pr.meta[1], "color")), "green") &&
          !json_object_get(pr.meta[1], "image"));
    char at[4400];
    snprintf(q, sizeof q, "%s:3", p);
    CHECK(!strcmp(core_prompts_where(&pr, 2, at, sizeof at), q));
    core_prompts_free(&pr);
    /* stretched to another size (swscale Lanczos); the same size is a copy */
    uint8_t big[64 * 48 * 3], same[32 * 32 * 3];
    core_tensor t;
    snprintf(q, sizeof q, "%s/img/red.png", dir);
    REQUIRE_OK(media_png_read(q, &t));
    REQUIRE_OK(media_image_load(q, 32, 32, same));
    CHECK(!memcmp(same, t.data, sizeof same));
    REQUIRE_OK(media_image_load(q, 64, 48, big));
    CHECK(big[0] == 220 && big[1] == 30 && big[(32 * 48 + 24) * 3] == 35); /* the border's colour, the square's */
    core_tensor_free(&t);
}

/* `vgrpo run --dry-run` with a prompt file `lines` (written to dir/bad.jsonl) must fail with `want` in its output. */
static void refused(const char *dir, const char *lines, const char *extra, const char *want, int line) {
    char p[4300], out[16384];
    snprintf(p, sizeof p, "%s/bad.jsonl", dir);
    test_write_text(NULL, p, lines);
    const int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/model "
                                             "--set model.init_preset= --set data.prompt_file=%s "
                                             "--set data.eval_prompt_file=%s/p.jsonl %s",
                            test_vgrpo_bin(), dir, p, dir, extra);
    if (st == 0 || !strstr(out, want)) test_fail(__FILE__, line, "exit %d, want \"%s\" in: %s", st, want, out);
}

TEST(i2v_bad_input_refused) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], p[4300], want[4600];
    make_model(dir);
    i2v_write_square_prompts(dir, 1);
    snprintf(p, sizeof p, "%s/notpng.png", dir);
    test_write_text(NULL, p, "GIF89a, not a png at all");
    const char *ok = "{\"prompt\": \"a red square\", \"image\": \"img/red.png\"}\n";
    char lines[2048];
    snprintf(lines, sizeof lines, "%s{\"prompt\": \"a cat\", \"image\": \"img/none.png\"}\n", ok);
    snprintf(want, sizeof want, "%s/bad.jsonl:2: image %s/img/none.png: cannot open: No such file", dir, dir);
    refused(dir, lines, "", want, __LINE__);
    snprintf(lines, sizeof lines, "%s\n{\"prompt\": \"a cat\", \"image\": \"notpng.png\"}\n", ok);
    snprintf(want, sizeof want, "%s/bad.jsonl:3: image %s/notpng.png: not a PNG file", dir, dir);
    refused(dir, lines, "", want, __LINE__);
    snprintf(lines, sizeof lines, "%s{\"prompt\": \"a cat\", \"image\": \"img\"}\n", ok);
    snprintf(want, sizeof want, "%s/bad.jsonl:2: image %s/img: not a regular file", dir, dir);
    refused(dir, lines, "", want, __LINE__);
    snprintf(lines, sizeof lines, "%s{\"prompt\": \"a cat\"}\n", ok);
    snprintf(want, sizeof want, "%s/bad.jsonl:2: no \"image\", but other prompts of the file have one", dir);
    refused(dir, lines, "", want, __LINE__);
    snprintf(lines, sizeof lines, "%s{\"prompt\": \"a cat\", \"image\": 3}\n", ok);
    snprintf(want, sizeof want, "%s/bad.jsonl:2: \"image\" must be a non-empty string", dir);
    refused(dir, lines, "", want, __LINE__);
    snprintf(lines, sizeof lines, "%s{\"prompt\": \"a cat\", \"image\": \"img/red.png\"\n", ok);
    snprintf(want, sizeof want, "%s/bad.jsonl:2: not a JSON object", dir);
    refused(dir, lines, "", want, __LINE__);
    /* one latent frame: nothing to generate after the image's */
    snprintf(lines, sizeof lines, "%s%s", ok, ok);
    refused(dir, lines, "--set rollout.frames=1", "rollout.frames: 1 frames are one latent frame", __LINE__);
    /* the eval prompts without images while the training prompts have them */
    snprintf(p, sizeof p, "%s/text.txt", dir);
    test_write_text(NULL, p, "a red square\na blue square\n");
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/model "
                                       "--set model.init_preset= --set data.prompt_file=%s/p.jsonl "
                                       "--set data.eval_prompt_file=%s", bin, dir, dir, p);
    CHECK_MSG(st != 0 && strstr(out, "the prompt files give images or none does"), "%s", out);
    /* an image recipe on a text-to-video model */
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/t2v --seed 0", bin, dir) == 0);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/t2v "
                                   "--set model.init_preset= --set data.prompt_file=%s/p.jsonl "
                                   "--set data.eval_prompt_file=%s/p.jsonl", bin, dir, dir, dir);
    CHECK_MSG(st != 0 && strstr(out, "is a text-to-video pipeline") && strstr(out, "I2V-A14B"), "%s", out);
    /* a TI2V model runs text prompts (text to video) */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/model "
                                   "--set model.init_preset= --set data.prompt_file=%s --set data.eval_prompt_file=%s",
                  bin, dir, p, p);
    CHECK_MSG(st == 0, "%s", out);
    /* a corrupt PNG (the signature and a 32 x 32 header, then garbage: start-up reads only the header) is refused
     * when the run reads the images, naming file:line */
    snprintf(p, sizeof p, "%s/img/corrupt.png", dir);
    FILE *f = fopen(p, "wb");
    REQUIRE(f);
    fwrite("\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x20\0\0\0\x20garbage", 1, 31, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/c.jsonl", dir);
    f = fopen(p, "w");
    REQUIRE(f);
    fprintf(f, "%s{\"prompt\": \"a red cat\", \"image\": \"img/corrupt.png\"}\n", ok);
    fclose(f);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.path=%s/model --set model.init_preset= "
                                   "--set data.prompt_file=%s --set data.eval_prompt_file=%s --steps 1 "
                                   "--set logging.run_dir=%s/r", bin, dir, p, p, dir);
    snprintf(want, sizeof want, "%s:2: image: png %s/img/corrupt.png: libpng read failed", p, dir);
    CHECK_MSG(st != 0 && strstr(out, want), "want \"%s\" in: %s", want, out);
}

/* `vgrpo generate --image`: the first frame depends on the image alone (two seeds: the same first tile, other later
 * tiles; the sheet's frame tiles below the label band), and a text-to-video pipeline is refused. `vgrpo eval` on
 * image prompts: its rewards are the in-run eval's at step 0, and each sheet row starts with the input image. */
TEST(i2v_generate_and_eval) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], p[4300], q[4300];
    make_model(dir);
    i2v_write_square_prompts(dir, 1);
    for (int s = 1; s <= 2; s++)
        REQUIRE(test_run(out, sizeof out, "%s generate --pipeline %s/model --prompt 'a red square' --image %s/img/red.png "
                                          "--out %s/g%d.mp4 --frames 5 --height 32 --width 32 --steps 4 --seed %d",
                         bin, dir, dir, dir, s, s) == 0);
    core_tensor a, b;
    snprintf(p, sizeof p, "%s/g1.png", dir);
    snprintf(q, sizeof q, "%s/g2.png", dir);
    REQUIRE_OK(media_png_read(p, &a));
    REQUIRE_OK(media_png_read(q, &b));
    /* 32-pixel frames are drawn as 128-pixel tiles (nearest neighbour, media/png.h) */
    REQUIRE(a.shape[0] == b.shape[0] && a.shape[1] == 5 * 128 + 6 * 2);
    const int64_t Wd = a.shape[1], y0 = a.shape[0] - 2 - 128; /* the tiles' row band: the last 128 rows above the gap */
    int same0 = 1, same1 = 1;
    for (int64_t y = y0; y < y0 + 128; y++) {
        same0 &= !memcmp((uint8_t *)a.data + (y * Wd + 2) * 3, (uint8_t *)b.data + (y * Wd + 2) * 3, 128 * 3);
        same1 &= !memcmp((uint8_t *)a.data + (y * Wd + 132) * 3, (uint8_t *)b.data + (y * Wd + 132) * 3, 128 * 3);
    }
    CHECK_MSG(same0 && !same1, "first frame equal across seeds: %d (want 1); second: %d (want 0)", same0, same1);
    core_tensor_free(&a), core_tensor_free(&b);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/t2v --seed 0", bin, dir) == 0);
    int st = test_run(out, sizeof out, "%s generate --pipeline %s/t2v --prompt 'a red square' --image %s/img/red.png "
                                       "--out %s/gx.mp4 --frames 5 --height 32 --width 32 --steps 4", bin, dir, dir, dir);
    CHECK_MSG(st != 0 && strstr(out, "--image: ") && strstr(out, "is a text-to-video pipeline"), "%s", out);

    st = test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml " I2V_SET " --set data.eval_samples_per_prompt=2 "
                                   "--out %s/ev", bin, dir, dir, dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "eval failed: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml " I2V_SET " --set data.eval_samples_per_prompt=2 "
                                   "--steps 1 --set logging.run_dir=%s/r", bin, dir, dir, dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "run failed: %s", out);
    json_t *rows[4];
    snprintf(p, sizeof p, "%s/r/metrics.jsonl", dir);
    const int nrows = read_rows(p, rows, 4, 0);
    REQUIRE(nrows >= 1);
    snprintf(p, sizeof p, "%s/ev/eval.json", dir);
    json_error_t e;
    json_t *ev = json_load_file(p, 0, &e);
    REQUIRE(ev);
    const json_t *sc = json_object_get(json_object_get(ev, "stats"), "color_match");
    /* the same samples and rewards; both files print 9 significant digits */
    CHECK_MSG(fabs(json_number_value(json_object_get(sc, "mean")) -
                   json_number_value(json_object_get(rows[0], "eval/color_match/mean"))) <=
                  1e-8 * fabs(json_number_value(json_object_get(sc, "mean"))),
              "vgrpo eval %.9g, the run's eval at step 0 %.9g", json_number_value(json_object_get(sc, "mean")),
              json_number_value(json_object_get(rows[0], "eval/color_match/mean")));
    json_decref(ev);
    for (int i = 0; i < nrows; i++) json_decref(rows[i]);
    snprintf(p, sizeof p, "%s/ev/sheets/p0001.png", dir);
    snprintf(q, sizeof q, "%s/img/green.png", dir);
    core_tensor sh, im;
    REQUIRE_OK(media_png_read(p, &sh));
    REQUIRE_OK(media_png_read(q, &im));
    CHECK(sh.shape[1] == 6 * 128 + 7 * 2); /* the image and 5 frames per row, 128-pixel tiles */
    const int64_t y1 = sh.shape[0] - 2 - 128; /* the last row's tiles */
    int same = 1;
    for (int64_t y = 0; y < 128; y++) /* tile pixel (y, x) = image pixel (y / 4, x / 4) */
        for (int64_t x = 0; x < 128; x++)
            same &= !memcmp((uint8_t *)sh.data + ((y1 + y) * sh.shape[1] + 2 + x) * 3,
                            (uint8_t *)im.data + ((y / 4) * 32 + x / 4) * 3, 3);
    CHECK_MSG(same, "the sheet's first column is not the input image");
    core_tensor_free(&sh), core_tensor_free(&im);
}

/* logging.video_every on image prompts: each row of videos/step-N/sheet.png starts with the prompt's input image (as
 * `vgrpo eval`'s sheets, media_image_write_sheet), then the frames. Step 0's sheet row j shows sample 0 of eval
 * prompt j at the initial weights with the eval noise (uid j x K), which is `vgrpo eval`'s sample 0 of prompt j: the
 * two sheets' tiles are equal pixel for pixel. */
TEST(i2v_run_sample_video_sheets) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], p[4300];
    make_model(dir);
    i2v_write_square_prompts(dir, 1);
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml " I2V_SET " --set data.eval_samples_per_prompt=2 "
                                       "--set logging.video_every=1 --set checkpoint.every=-1 --steps 1 "
                                       "--set logging.run_dir=%s/r", bin, dir, dir, dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "run failed: %s", out);
    st = test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml " I2V_SET " --set data.eval_samples_per_prompt=2 "
                                   "--out %s/ev", bin, dir, dir, dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "eval failed: %s", out);
    static const char *const names[4] = {"red", "green", "blue", "yellow"};
    /* 32 x 32 frames drawn 4 times larger (128-pixel tiles, nearest neighbour), label scale 4 (media/png.h) */
    const int u = 4, H = 32 * u, W = 32 * u, g = 2, L = 7 * 4, T = media_png_title_band(32, 32);
    CHECK(media_png_sheet_scale(32, 32) == u && T == L + g);
    core_tensor sh, ev, im;
    for (int s = 0; s <= 1; s++) {
        snprintf(p, sizeof p, "%s/r/videos/step-%d/sheet.png", dir, s);
        REQUIRE_OK(media_png_read(p, &sh));
        const int64_t sw = sh.shape[1];
        CHECK_MSG(sw == 6 * W + 7 * g && sh.shape[0] == T + 4 * (L + H) + 5 * g, "step %d: sheet %lld x %lld, want rows "
                  "of the image and 5 frames", s, (long long)sh.shape[0], (long long)sw);
        for (int j = 0; j < 4 && sw == 6 * W + 7 * g; j++) {
            snprintf(p, sizeof p, "%s/img/%s.png", dir, names[j]);
            REQUIRE_OK(media_png_read(p, &im));
            const int64_t y0 = T + g + (int64_t)j * (L + H + g) + L; /* row j's tiles */
            int same = 1;
            for (int y = 0; y < H; y++) /* tile pixel (y, x) = image pixel (y / u, x / u) */
                for (int x = 0; x < W; x++)
                    same &= !memcmp((uint8_t *)sh.data + ((y0 + y) * sw + g + x) * 3,
                                    (uint8_t *)im.data + ((y / u) * (W / u) + x / u) * 3, 3);
            CHECK_MSG(same, "step %d: row %d does not start with %s.png", s, j, names[j]);
            core_tensor_free(&im);
            if (s) continue;
            /* step 0: the row's tiles are vgrpo eval's sample 0 of prompt j (its sheet's first row) */
            snprintf(p, sizeof p, "%s/ev/sheets/p%04d.png", dir, j);
            REQUIRE_OK(media_png_read(p, &ev));
            const int64_t ew = ev.shape[1], e0 = T + g + L;
            REQUIRE(ew == sw);
            same = 1;
            for (int y = 0; y < H; y++)
                same &= !memcmp((uint8_t *)sh.data + (y0 + y) * sw * 3, (uint8_t *)ev.data + (e0 + y) * ew * 3, sw * 3);
            CHECK_MSG(same, "step 0, row %d: the tiles differ from vgrpo eval's sheet p%04d.png", j, j);
            core_tensor_free(&ev);
        }
        core_tensor_free(&sh);
    }
}

/* make test-slow: recipes/tiny-cpu-i2v.yaml learns first_frame_consistency (eval at the end above the start by more
 * than 3 standard errors of the difference). */
TEST(i2v_tiny_recipe_learns_slow) {
    TEST_SLOW();
    const char *dir = test_tmpdir();
    char out[65536], p[4300];
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v.yaml --set model.path=%s/model "
                                       "--set logging.run_dir=%s/run", test_vgrpo_bin(), dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "run failed: %s", out);
    json_t *rows[256];
    snprintf(p, sizeof p, "%s/run/metrics.jsonl", dir);
    const int n = read_rows(p, rows, 256, 0);
    REQUIRE(n >= 2);
    json_t *first = rows[0], *last = rows[n - 1];
    const double m0 = json_number_value(json_object_get(first, "eval/first_frame_consistency/mean"));
    const double s0 = json_number_value(json_object_get(first, "eval/first_frame_consistency/se"));
    const double m1 = json_number_value(json_object_get(last, "eval/first_frame_consistency/mean"));
    const double s1 = json_number_value(json_object_get(last, "eval/first_frame_consistency/se"));
    const double z = (m1 - m0) / sqrt(s0 * s0 + s1 * s1);
    fprintf(stderr, "  eval first_frame_consistency %.4f +- %.4f -> %.4f +- %.4f (z %.1f)\n", m0, s0, m1, s1, z);
    CHECK_MSG(z > 3.0, "the eval rose by %.2f standard errors (want > 3)", z);
    for (int i = 0; i < n; i++) json_decref(rows[i]);
}
