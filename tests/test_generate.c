/* tests/test_generate.c — the tiny pipeline's text encoder, tokenizer and VAE (model/text/tiny_text.h, model/vae/tiny_vae.h) and
 * `vgrpo generate` end to end (cli/cmd_generate.c), including the errors that name a bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "core/error.h"
#include "core/philox.h"
#include "model/text/t5_prompt.h"
#include "model/vae/tiny_vae.h"
#include "model/text/tiny_text.h"
#include "model/vae/wan_vae.h"
#include "media/png.h"
#include "media/video.h"
#include "tests/test.h"

/* Vocabulary ids of the tiny tokenizer, from its documented layout: 0-2 specials, 3 "▁", 4-29 "▁a".."▁z",
 * 30-65 the 36 words ("the" 30, "red" 40, "cat" 48), 66-91 "a".."z", then ASCII 33..126 without a-z from 92. */
TEST(gen_tiny_tokenizer_encodes) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tok", test_tmpdir());
    int vocab = 0;
    REQUIRE_OK(tok_tiny_write(dir, &vocab));
    CHECK(vocab == 92 + (94 - 26));
    tok_tokenizer *t = tok_load(dir);
    REQUIRE(t);
    CHECK(tok_vocab_size(t) == vocab);
    int32_t *ids = NULL;
    int n = 0;
    REQUIRE_OK(tok_encode(t, "a red  cat, xyz", 0, &ids, &n));
    const int32_t want[] = {4, 40, 48, 92 + (',' - 33), 4 + ('x' - 'a'), 66 + ('y' - 'a'), 66 + ('z' - 'a'), 1};
    CHECK(n == 8);
    for (int i = 0; i < n && i < 8; i++) CHECK_MSG(ids[i] == want[i], "id %d: got %d, want %d", i, ids[i], want[i]);
    free(ids);
    REQUIRE_OK(tok_encode(t, "the", 0, &ids, &n));
    CHECK(n == 2 && ids[0] == 30 && ids[1] == 1);
    free(ids);
    tok_free(t);
}

/* The encoder loads, has the requested width, and its output rows are RMS-normalised (final T5 norm, weight 1). */
TEST(gen_tiny_text_encoder_loads) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/te", test_tmpdir());
    REQUIRE_OK(t5_tiny_write(dir, 64, 192, 3));
    t5_encoder *e = t5_load(dir);
    REQUIRE(e);
    const t5_config *c = t5_get_config(e);
    CHECK(c->d_model == 64 && c->vocab_size == 192 && c->num_heads == 4 && c->d_kv == 16 && c->num_layers == 2);
    int32_t ids[5] = {4, 40, 48, 100, 1};
    float out[5 * 64];
    REQUIRE_OK(t5_forward(e, ids, NULL, 1, 5, out));
    for (int s = 0; s < 5; s++) {
        double ss = 0;
        for (int d = 0; d < 64; d++) ss += (double)out[s * 64 + d] * out[s * 64 + d];
        CHECK_NEAR(sqrt(ss / 64), 1.0, 1e-3);
    }
    /* different tokens give different rows */
    double diff = 0;
    for (int d = 0; d < 64; d++) diff += fabs(out[d] - out[64 + d]);
    CHECK(diff > 1.0);
    /* the colour word of "a red" vs "a green" (ids 40, 41) gives clearly different rows: every tensor has its own
     * values (the writer borrows each tensor's data until the file is written) */
    int32_t ids2[3] = {4, 41, 1};
    float out2[3 * 64];
    REQUIRE_OK(t5_forward(e, ids2, NULL, 1, 3, out2));
    double dot = 0, n1 = 0, n2 = 0;
    for (int d = 0; d < 64; d++) dot += (double)out[64 + d] * out2[64 + d], n1 += (double)out[64 + d] * out[64 + d],
                                 n2 += (double)out2[64 + d] * out2[64 + d];
    CHECK_MSG(dot / sqrt(n1 * n2) < 0.9, "cosine of the red and green rows %.3f", dot / sqrt(n1 * n2));
    t5_free(e);
}

/* Decoded colours follow the latent: the mean RGB of videos decoded from different random latents differs by a
 * clear margin (the GRPO demo needs reward variance within a group), and frames are not flat. */
TEST(gen_tiny_vae_colours_differ) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/vae", test_tmpdir());
    REQUIRE_OK(vae_tiny_write(dir, 16, 0));
    vae_model *m = vae_load(dir);
    REQUIRE(m);
    CHECK(vae_spatial_factor(m) == 8 && vae_frames_out(m, 2) == 5 && vae_get_config(m)->z_dim == 16);
    enum { Z = 16, T = 2, h = 4, w = 4, N = 6, F = 5, P = F * 32 * 32 };
    static float lat[Z * T * h * w];
    static uint8_t vid[P * 3];
    double mean[N][3], maxd = 0, minstd = 1e9;
    for (int k = 0; k < N; k++) {
        core_philox_normal(lat, Z * T * h * w, 7, 0, (uint32_t)k, CORE_STREAM_EVAL_NOISE);
        REQUIRE_OK(vae_latents_to_u8(m, lat, 1, Z, T, h, w, vid));
        double s[3] = {0, 0, 0}, s2 = 0;
        for (int p = 0; p < P; p++)
            for (int c = 0; c < 3; c++) s[c] += vid[p * 3 + c], s2 += (double)vid[p * 3 + c] * vid[p * 3 + c];
        for (int c = 0; c < 3; c++) mean[k][c] = s[c] / P;
        double m0 = (s[0] + s[1] + s[2]) / (3.0 * P), sd = sqrt(s2 / (3.0 * P) - m0 * m0);
        if (sd < minstd) minstd = sd;
        for (int j = 0; j < k; j++)
            for (int c = 0; c < 3; c++) maxd = fmax(maxd, fabs(mean[k][c] - mean[j][c]));
    }
    printf("  tiny VAE: largest mean-colour difference %.1f levels, smallest pixel std %.1f\n", maxd, minstd);
    CHECK_MSG(maxd > 20.0, "mean colours differ by at most %.1f levels", maxd);
    CHECK_MSG(minstd > 20.0, "a decoded video is nearly flat (std %.1f)", minstd);
    vae_free(m);
}

/* A fresh tiny pipeline in the test's folder. */
static const char *make_pipeline(const char *tmp) {
    static char dir[4200];
    char out[4096];
    snprintf(dir, sizeof dir, "%s/pipe", tmp);
    int rc = test_run(out, sizeof out, "%s init-model --preset tiny --out %s", test_vgrpo_bin(), dir);
    CHECK_MSG(rc == 0, "init-model failed: %s", out);
    return dir;
}

static int gen(char *out, size_t cap, const char *pipe, const char *mp4, const char *extra) {
    return test_run(out, cap, "%s generate --pipeline %s --prompt 'a red cat on the sea' --out %s --steps 3 %s",
                    test_vgrpo_bin(), pipe, mp4, extra);
}

TEST(gen_writes_mp4_and_sheet) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir()); /* each test_tmpdir() call empties it */
    const char *pipe = make_pipeline(tmp);
    char out[8192], mp4[4200], png[4200];
    snprintf(mp4, sizeof mp4, "%s/a.mp4", tmp);
    snprintf(png, sizeof png, "%s/a.png", tmp);
    int rc = gen(out, sizeof out, pipe, mp4, "--frames 9 --height 32 --width 48 --seed 5");
    CHECK_MSG(rc == 0, "generate failed: %s", out);
    REQUIRE(rc == 0);
    CHECK(strstr(out, "generate: sampling steps 3/3") != NULL); /* the progress reached the end */
    CHECK_MSG(strstr(out, "generate: estimate ") && strstr(out, "GiB of memory") && strstr(out, "a denoising step, about ")
                  && strstr(out, "for 3 steps at this machine's "), "no estimate line in: %s", out);
    CHECK_MSG(strchr(out, '\r') == NULL, "no terminal here, yet a '\\r' in: %s", out); /* plain lines off a tty */
    core_tensor v;
    REQUIRE_OK(media_video_read(mp4, 0, &v, NULL));
    CHECK(v.ndim == 4 && v.shape[0] == 1 + 4 * (3 - 1) && v.shape[1] == 32 && v.shape[2] == 48 && v.shape[3] == 3);
    core_tensor_free(&v);
    core_tensor s;
    REQUIRE_OK(media_png_read(png, &s));
    int sh, sw, cols;
    REQUIRE_OK(media_png_sheet_layout(1, 9, 32, 48, 8, 1, &sh, &sw, &cols));
    /* 32 x 48 frames are drawn 3 times larger (96 x 144 tiles: under 128 pixels, media/png.h), label scale 3 */
    CHECK(sh == 7 * 3 + 96 + 2 * 2 && sw == 8 * 144 + 9 * 2 && media_png_title_band(32, 48) == 7 * 3 + 2);
    CHECK(s.shape[0] == sh + media_png_title_band(32, 48) && s.shape[1] == sw); /* the prompt's title band on top */
    core_tensor_free(&s);
}

static int read_file(const char *path, unsigned char **buf, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc((size_t)*n + 1);
    int ok = *buf && fread(*buf, 1, (size_t)*n, f) == (size_t)*n;
    fclose(f);
    return ok ? 0 : -1;
}

/* Same seed: the same mp4, byte for byte (every stage is deterministic); another seed: other frames. */
TEST(gen_same_seed_same_video) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir()); /* each test_tmpdir() call empties it */
    const char *pipe = make_pipeline(tmp);
    char out[8192], p[3][4200];
    const char *seeds[3] = {"--seed 11", "--seed 11", "--seed 12"};
    for (int k = 0; k < 3; k++) {
        snprintf(p[k], sizeof p[k], "%s/v%d.mp4", tmp, k);
        char extra[128];
        snprintf(extra, sizeof extra, "--frames 5 --height 32 --width 32 %s", seeds[k]);
        int rc = gen(out, sizeof out, pipe, p[k], extra);
        CHECK_MSG(rc == 0, "generate failed: %s", out);
        REQUIRE(rc == 0);
    }
    unsigned char *a = NULL, *b = NULL;
    long na = 0, nb = 0;
    REQUIRE_OK(read_file(p[0], &a, &na));
    REQUIRE_OK(read_file(p[1], &b, &nb));
    CHECK(na == nb && na > 0 && memcmp(a, b, (size_t)na) == 0);
    free(a), free(b);
    core_tensor v0, v2;
    REQUIRE_OK(media_video_read(p[0], 0, &v0, NULL));
    REQUIRE_OK(media_video_read(p[2], 0, &v2, NULL));
    const uint8_t *x = v0.data, *y = v2.data;
    long n = 5 * 32 * 32 * 3, differ = 0;
    for (long i = 0; i < n; i++) differ += abs((int)x[i] - (int)y[i]) > 8;
    CHECK_MSG(differ > n / 10, "seeds 11 and 12 give nearly the same video (%ld of %ld values differ)", differ, n);
    core_tensor_free(&v0), core_tensor_free(&v2);
}

/* Each bad input: exit status 1 and a message naming the problem. */
TEST(gen_errors_name_the_problem) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir()); /* each test_tmpdir() call empties it */
    const char *pipe = make_pipeline(tmp);
    char out[8192], mp4[4200], path[4300];
    snprintf(mp4, sizeof mp4, "%s/e.mp4", tmp);
    int rc = gen(out, sizeof out, pipe, mp4, "--frames 8");
    CHECK_MSG(rc == 1 && strstr(out, "--frames 8 is not 4k+1"), "frames 8: rc %d, %s", rc, out);
    rc = gen(out, sizeof out, pipe, mp4, "--height 40");
    CHECK_MSG(rc == 1 && strstr(out, "--height 40") && strstr(out, "multiples of 16"), "height 40: rc %d, %s", rc, out);
    rc = gen(out, sizeof out, pipe, mp4, "--width 24");
    CHECK_MSG(rc == 1 && strstr(out, "multiples of 16"), "width 24: rc %d, %s", rc, out);
    rc = gen(out, sizeof out, pipe, mp4, "--height 32 --width 32 --frames 5 --steps 0");
    CHECK_MSG(rc == 2 && strstr(out, "--steps"), "steps 0: rc %d, %s", rc, out);
    /* a VAE whose z_dim differs from the transformer's out_channels (16; in_channels too, a text-to-video model) */
    snprintf(path, sizeof path, "%s/vae", pipe);
    REQUIRE_OK(vae_tiny_write(path, 8, 0));
    rc = gen(out, sizeof out, pipe, mp4, "");
    CHECK_MSG(rc == 1 && strstr(out, "z_dim is 8") && strstr(out, "out_channels is 16"), "z_dim: rc %d, %s", rc, out);
    /* no tokenizer.json */
    snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", pipe);
    REQUIRE(unlink(path) == 0);
    rc = gen(out, sizeof out, pipe, mp4, "");
    CHECK_MSG(rc == 1 && strstr(out, "tokenizer.json is missing"), "tokenizer: rc %d, %s", rc, out);
    CHECK(access(mp4, F_OK) != 0); /* nothing written on failure */
}

/* Sets transformer_2 and boundary_ratio in pipe/model_index.json. */
static int set_two_experts(const char *pipe, double boundary) {
    char path[4300];
    snprintf(path, sizeof path, "%s/model_index.json", pipe);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return -1;
    json_object_set_new(root, "transformer_2", json_pack("[s, s]", "diffusers", "WanTransformer3DModel"));
    json_object_set_new(root, "boundary_ratio", json_real(boundary));
    int rc = json_dump_file(root, path, JSON_INDENT(2));
    json_decref(root);
    return rc;
}

static int same_file(const char *a, const char *b) {
    unsigned char *x = NULL, *y = NULL;
    long nx = 0, ny = 0;
    int same = !read_file(a, &x, &nx) && !read_file(b, &y, &ny) && nx == ny && !memcmp(x, y, (size_t)nx);
    free(x), free(y);
    return same;
}

/* Two experts: with 3 steps at shift 5 the timesteps are 1000, ~833, ~24, so boundary 0.875 routes steps 1 and 2 to
 * transformer_2 (other weights: another video; --guidance-2 matters), and boundary 0.0001 routes every step to
 * transformer (the single-expert video, byte for byte). */
TEST(gen_two_experts_route_by_boundary) {
    char tmp[4096], out[8192], p2[4200], v[4][4300];
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir()); /* each test_tmpdir() call empties it */
    const char *pipe = make_pipeline(tmp);
    snprintf(p2, sizeof p2, "%s/other", tmp);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s --seed 9 && cp -r %s/transformer "
                                      "%s/transformer_2", test_vgrpo_bin(), p2, p2, pipe) == 0);
    for (int k = 0; k < 4; k++) snprintf(v[k], sizeof v[k], "%s/v%d.mp4", tmp, k);
    const char *size = "--frames 5 --height 32 --width 32 --seed 1";
    REQUIRE(gen(out, sizeof out, pipe, v[0], size) == 0); /* model_index still says one expert */
    REQUIRE_OK(set_two_experts(pipe, 0.875));
    int rc = gen(out, sizeof out, pipe, v[1], size);
    CHECK_MSG(rc == 0 && strstr(out, "two experts"), "rc %d: %s", rc, out);
    char extra[256];
    snprintf(extra, sizeof extra, "%s --guidance-2 1.5", size);
    REQUIRE(gen(out, sizeof out, pipe, v[2], extra) == 0);
    REQUIRE_OK(set_two_experts(pipe, 0.0001));
    REQUIRE(gen(out, sizeof out, pipe, v[3], size) == 0);
    CHECK(!same_file(v[0], v[1]));
    CHECK(!same_file(v[1], v[2]));
    CHECK(same_file(v[0], v[3]));
}

/* --checkpoint: a checkpoint folder whose transformer/ has other weights gives another video; pointing it at the
 * pipeline's own transformer (as a transformer folder, or the pipeline folder as a checkpoint-like folder) gives the
 * no-checkpoint video and sheet byte for byte; a folder with neither config.json is an error naming it, and another
 * model's transformer a refusal naming what differs. */
TEST(gen_checkpoint_replaces_transformer) {
    char tmp[4096], out[8192], other[4200], ckpt[4200], arg[4400], v[4][4300], png[4][4300];
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir()); /* each test_tmpdir() call empties it */
    const char *pipe = make_pipeline(tmp);
    snprintf(other, sizeof other, "%s/other", tmp);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint-3", tmp);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s --seed 9 && mkdir -p %s && cp -r "
                                      "%s/transformer %s/transformer", test_vgrpo_bin(), other, ckpt, other, ckpt) == 0);
    const char *ck[4] = {NULL, ckpt, NULL, pipe};
    char own[4300];
    snprintf(own, sizeof own, "%s/transformer", pipe);
    ck[2] = own;
    for (int k = 0; k < 4; k++) {
        snprintf(v[k], sizeof v[k], "%s/v%d.mp4", tmp, k);
        snprintf(png[k], sizeof png[k], "%s/v%d.png", tmp, k);
        snprintf(arg, sizeof arg, "--frames 5 --height 32 --width 32 --seed 2%s%s", ck[k] ? " --checkpoint " : "",
                 ck[k] ? ck[k] : "");
        int rc = gen(out, sizeof out, pipe, v[k], arg);
        CHECK_MSG(rc == 0, "generate %d failed: %s", k, out);
        REQUIRE(rc == 0);
        if (ck[k]) CHECK_MSG(strstr(out, "transformer weights from"), "%s", out);
    }
    CHECK(!same_file(v[0], v[1]));
    core_tensor a, b;
    REQUIRE_OK(media_video_read(v[0], 0, &a, NULL));
    REQUIRE_OK(media_video_read(v[1], 0, &b, NULL));
    long n = 5 * 32 * 32 * 3, differ = 0;
    for (long i = 0; i < n; i++) differ += ((const uint8_t *)a.data)[i] != ((const uint8_t *)b.data)[i];
    CHECK_MSG(differ > n / 10, "the checkpoint's weights changed only %ld of %ld values", differ, n);
    core_tensor_free(&a), core_tensor_free(&b);
    for (int k = 2; k < 4; k++) {
        CHECK_MSG(same_file(v[0], v[k]), "--checkpoint %s: not the pipeline's own video", ck[k]);
        CHECK_MSG(same_file(png[0], png[k]), "--checkpoint %s: not the pipeline's own sheet", ck[k]);
    }
    /* neither DIR/transformer/config.json nor DIR/config.json: exit 1, the path named, nothing written */
    snprintf(arg, sizeof arg, "--frames 5 --height 32 --width 32 --checkpoint %s/nowhere", tmp);
    snprintf(v[0], sizeof v[0], "%s/bad.mp4", tmp);
    int rc = gen(out, sizeof out, pipe, v[0], arg);
    CHECK_MSG(rc == 1 && strstr(out, "vgrpo generate: --checkpoint: ") && strstr(out, "/nowhere has neither "
              "transformer/config.json") && strstr(out, "nor config.json"), "rc %d: %s", rc, out);
    CHECK(access(v[0], F_OK) != 0);
    /* another model's transformer (tiny-i2v's: 36 channels in) on this pipeline: refused naming both configs, by
     * generate and by eval (before it starts a process or makes --out) */
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-i2v --out %s/i2v --seed 0", test_vgrpo_bin(), tmp) == 0);
    snprintf(arg, sizeof arg, "--frames 5 --height 32 --width 32 --checkpoint %s/i2v/transformer", tmp);
    rc = gen(out, sizeof out, pipe, v[0], arg);
    CHECK_MSG(rc == 1 && strstr(out, "--checkpoint: ") && strstr(out, "is another transformer than") &&
                  strstr(out, "in_channels 36 here, 16 there"), "rc %d: %s", rc, out);
    CHECK(access(v[0], F_OK) != 0);
    rc = test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml --set model.path=%s --checkpoint %s/i2v/transformer "
                  "--out %s/ev", test_vgrpo_bin(), pipe, tmp, tmp);
    CHECK_MSG(rc == 1 && strstr(out, "in_channels 36 here, 16 there"), "rc %d: %s", rc, out);
    snprintf(v[1], sizeof v[1], "%s/ev", tmp);
    CHECK(access(v[1], F_OK) != 0);
    /* a two-expert checkpoint whose transformer_2 is another model's (tiny's, 16 in) on the tiny-i2v pipeline */
    static uint8_t px[3 * 32 * 32];
    snprintf(v[2], sizeof v[2], "%s/i.png", tmp);
    REQUIRE_OK(media_png_write(v[2], px, 32, 32));
    REQUIRE(test_run(out, sizeof out, "mkdir -p %s/ck2 && cp -r %s/i2v/transformer %s/ck2/transformer && cp -r "
                     "%s/transformer %s/ck2/transformer_2", tmp, tmp, tmp, pipe, tmp) == 0);
    snprintf(arg, sizeof arg, "--frames 5 --height 32 --width 32 --image %s --checkpoint %s/ck2", v[2], tmp);
    snprintf(v[3], sizeof v[3], "%s/i2v", tmp);
    rc = gen(out, sizeof out, v[3], v[0], arg);
    CHECK_MSG(rc == 1 && strstr(out, "ck2/transformer_2/config.json is another transformer than") &&
                  strstr(out, "in_channels 16 here, 36 there"), "rc %d: %s", rc, out);
    CHECK(access(v[0], F_OK) != 0);
}

/* --force with another preset removes the tiny components (and model_index.json no longer lists them). */
TEST(gen_init_model_force_removes_tiny_components) {
    char tmp[4096], out[8192], path[4300];
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir());
    const char *pipe = make_pipeline(tmp);
    snprintf(path, sizeof path, "%s/vae/config.json", pipe);
    CHECK(access(path, F_OK) == 0);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset wan2.1-t2v-1.3b --out %s --force", test_vgrpo_bin(),
                     pipe) == 0);
    static const char *const gone[] = {"vae", "text_encoder", "tokenizer", "latent_rgb.safetensors"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", pipe, gone[i]);
        CHECK_MSG(access(path, F_OK) != 0, "%s still exists", path);
    }
    snprintf(path, sizeof path, "%s/model_index.json", pipe);
    json_t *mi = json_load_file(path, 0, NULL);
    REQUIRE(mi);
    CHECK(!json_object_get(mi, "vae") && !json_object_get(mi, "text_encoder") && json_object_get(mi, "transformer"));
    json_decref(mi);
}
