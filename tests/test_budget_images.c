/* tests/test_budget_images.c — the start-up estimate (trainer/budget/budget.h) of image to video's encoding:
 *   - vae_encoder_estimate (model/vae/wan_vae_encode.h) equals what the encoder holds: the parameters of the files'
 *     encoder.* and quant_conv.* tensors, and vae_encoder_state_bytes after a real encode at that size (the Wan 2.1
 *     and 2.2 fixtures, the encoder-only ones, the tiny preset's); its FLOPs grow by the same amount per 4-frame chunk;
 *   - an image recipe's estimate against the same recipe with text prompts (the tiny-ti2v and tiny-i2v presets, run,
 *     parity and eval): the parts "image conditions" (held the whole job: every prompt's condition, TI2V [C, 1, h, w],
 *     I2V-A14B [K, F, h, w]) and "image encoder" (at start-up: its weights, encode state and one image's buffers, the
 *     largest source PNG decoded at its own size) with
 *     their exact values, the job total larger by the conditions (TI2V: also in each trajectory), the start-up
 *     FLOPs of each distinct image once; a
 *     text recipe has neither part;
 *   - `vgrpo generate --image`'s estimate (budget_generate_bytes): the image's encoding on top of the same video's. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/trajectory.h"
#include "core/recipe.h"
#include "core/safetensors.h"
#include "media/png.h"
#include "model/vae/tiny_vae.h"
#include "model/vae/wan_vae.h"
#include "model/vae/wan_vae_encode.h"
#include "tests/test.h"
#include "trainer/budget/budget.h"

/* The encoder of vae folder dir at F x H x W: vae_encoder_estimate against the loaded encoder after an encode. */
static void check_encoder(const char *dir, int F, int H, int W) {
    vae_encoder *e = vae_encoder_load(dir);
    REQUIRE_OK(e ? 0 : -1);
    const vae_config *c = vae_encoder_get_config(e);
    double params, state, flop, flop5, flop9, p2, s2;
    REQUIRE_OK(vae_encoder_estimate(c, F, H, W, &params, &state, &flop));
    const size_t nv = (size_t)3 * F * H * W, nl = (size_t)c->z_dim * vae_encoder_frames_out(e, F) * H * W;
    float *vid = malloc(sizeof(float) * nv), *lat = malloc(sizeof(float) * nl);
    REQUIRE(vid && lat);
    test_fill_uniform(vid, nv, 3, -1, 1);
    REQUIRE_OK(vae_encode(e, vid, 1, 3, F, H, W, lat, 1));
    CHECK_MSG(state == (double)vae_encoder_state_bytes(e), "%s %d x %d x %d: estimated state %.0f, "
              "vae_encoder_state_bytes %zu", dir, F, H, W, state, vae_encoder_state_bytes(e));
    char p[600];
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    st_file *sf = st_open(p);
    REQUIRE_OK(sf ? 0 : -1);
    double n = 0;
    for (int i = 0; i < st_count(sf); i++) {
        const st_info *t = st_info_at(sf, i);
        if (strncmp(t->name, "encoder.", 8) && strncmp(t->name, "quant_conv.", 11)) continue;
        double k = 1;
        for (int d = 0; d < t->ndim; d++) k *= (double)t->shape[d];
        n += k;
    }
    st_close(sf);
    CHECK_MSG(params == n, "%s: estimated %.0f parameters, the file's encoder has %.0f", dir, params, n);
    /* every chunk after the first is the same work: F = 1, 5, 9 in equal steps, the first chunk less */
    REQUIRE_OK(vae_encoder_estimate(c, 1, H, W, &p2, &s2, &flop));
    REQUIRE_OK(vae_encoder_estimate(c, 5, H, W, &p2, &s2, &flop5));
    REQUIRE_OK(vae_encoder_estimate(c, 9, H, W, &p2, &s2, &flop9));
    CHECK_MSG(flop > 0 && flop9 - flop5 == flop5 - flop && flop5 - flop > flop, "%s: FLOPs %.0f, %.0f, %.0f for 1, 5, "
              "9 frames", dir, flop, flop5, flop9);
    CHECK(p2 == params && s2 == state); /* neither depends on the frame count */
    /* refused as vae_encode refuses */
    CHECK(vae_encoder_estimate(c, 4, H, W, &p2, &s2, &flop) == -1 && strstr(core_last_error(), "1 + 4k"));
    CHECK(vae_encoder_estimate(c, 1, H + 1, W, &p2, &s2, &flop) == -1 && strstr(core_last_error(), "multiples"));
    free(vid), free(lat);
    vae_encoder_free(e);
}

TEST(budget_vae_encoder_estimate_matches) {
    check_encoder("tests/fixtures/vae_wan21", 5, 24, 40);
    check_encoder("tests/fixtures/vae_wan21", 1, 16, 8);
    check_encoder("tests/fixtures/vae_wan22", 5, 32, 64);
    check_encoder("tests/fixtures/vae_enc21", 1, 32, 16);
    check_encoder("tests/fixtures/vae_enc22", 5, 32, 32);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/vae", test_tmpdir());
    REQUIRE_OK(vae_tiny_write_with_encoder(dir, 16, 0));
    check_encoder(dir, 1, 32, 32);
    check_encoder(dir, 5, 64, 48);
}

/* dir/p.jsonl: 4 prompts with 3 distinct images (32 x 32), dir/t.txt: the same 4 prompts as text. */
static void write_prompts(const char *dir) {
    char path[4300];
    snprintf(path, sizeof path, "%s/img", dir);
    mkdir(path, 0777);
    uint8_t img[32 * 32 * 3];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 32 * 32 * 3; i++) img[i] = (uint8_t)(40 * k + i % 97);
        snprintf(path, sizeof path, "%s/img/i%d.png", dir, k);
        REQUIRE_OK(media_png_write(path, img, 32, 32));
    }
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    FILE *f = fopen(path, "w"), *g = NULL;
    REQUIRE(f);
    for (int k = 0; k < 4; k++) fprintf(f, "{\"prompt\": \"a red square %d\", \"image\": \"img/i%d.png\"}\n", k, k % 3);
    fclose(f);
    snprintf(path, sizeof path, "%s/t.txt", dir);
    REQUIRE((g = fopen(path, "w")));
    for (int k = 0; k < 4; k++) fprintf(g, "a red square %d\n", k);
    fclose(g);
}

/* dir/ti2v and dir/i2v (the tiny-ti2v and tiny-i2v presets) and write_prompts' files. */
static void image_models(const char *dir) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-ti2v --out %s/ti2v --seed 0", test_vgrpo_bin(),
                     dir) == 0);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-i2v --out %s/i2v --seed 0", test_vgrpo_bin(),
                     dir) == 0);
    write_prompts(dir);
}

/* Bytes of the part named `name` of the process kind `proc` (-1: none). */
static double part(const budget_estimate *e, const char *proc, const char *name) {
    for (int i = 0; i < e->n_procs; i++)
        if (!strcmp(e->proc[i].name, proc))
            for (int k = 0; k < e->proc[i].n_parts; k++)
                if (!strcmp(e->proc[i].part[k].name, name)) return e->proc[i].part[k].bytes;
    return -1;
}

/* The estimate of job q of recipes/tiny-cpu.yaml on model dir/<model> with prompt file `prompts` (training and
 * eval) and the extra set `extra` (may be NULL). */
static void estimate(budget_estimate *e, const char *dir, const char *model, const char *prompts, const char *extra,
                     budget_job job) {
    char s[4][4400];
    snprintf(s[0], sizeof s[0], "model.path=%s/%s", dir, model);
    snprintf(s[1], sizeof s[1], "data.prompt_file=%s/%s", dir, prompts);
    snprintf(s[2], sizeof s[2], "data.eval_prompt_file=%s/%s", dir, prompts);
    const char *sets[5] = {s[0], s[1], s[2], "model.init_preset=", extra};
    core_recipe r;
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", sets, extra ? 5 : 4));
    const int rc = budget_estimate_job(e, &r, &(budget_request){.job = job});
    core_recipe_release(&r);
    REQUIRE_OK(rc);
}

/* image vs text prompts on pipeline dir/model: cond_floats per prompt; frames the encoder's video (1: the image
 * alone, TI2V; rollout.frames: I2V-A14B's condition video). */
static void check_image_parts(const char *dir, const char *model, const char *extra, int64_t cond_floats, int frames) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, model);
    vae_encoder *enc = vae_encoder_load(p);
    REQUIRE_OK(enc ? 0 : -1);
    double params, state, flop;
    REQUIRE_OK(vae_encoder_estimate(vae_encoder_get_config(enc), frames, 32, 32, &params, &state, &flop));
    vae_encoder_free(enc);
    /* the 32 x 32 PNG decoded, stretched to 32 x 32 (U8), as floats; I2V-A14B's condition video */
    const double px = 32 * 32, pixels = 3 * px + 3 * px + 4 * 3 * px + (frames > 1 ? 4 * 3.0 * frames * px : 0);
    const double enc_bytes = 4 * params + state + pixels;
    static const struct {
        budget_job job;
        const char *proc;
        int prompts;  /* prompts whose conditions the process holds: training + eval, or eval */
        int enc_peak; /* the encoder is the process's largest phase (the eval process has no other) */
    } jobs[3] = {{BUDGET_JOB_RUN, "local process", 8, 0}, {BUDGET_JOB_PARITY, "trainer rank", 8, 0},
                 {BUDGET_JOB_EVAL, "eval process", 4, 1}};
    budget_estimate *ti = malloc(sizeof *ti), *tt = malloc(sizeof *tt);
    REQUIRE(ti && tt);
    for (int j = 0; j < 3; j++) {
        estimate(ti, dir, model, "p.jsonl", extra, jobs[j].job);
        estimate(tt, dir, model, "t.txt", extra, jobs[j].job);
        const double conds = 4.0 * (double)cond_floats * jobs[j].prompts;
        CHECK_MSG(ti->n_images == 3 && ti->cond_floats == cond_floats, "%s job %d: %d images, %lld floats per condition",
                  model, j, ti->n_images, (long long)ti->cond_floats);
        CHECK_MSG(part(ti, jobs[j].proc, "image conditions") == conds, "%s job %d: image conditions %.0f bytes, want "
                  "%.0f", model, j, part(ti, jobs[j].proc, "image conditions"), conds);
        CHECK_MSG(part(ti, jobs[j].proc, "image encoder (VAE encoder, one image)") == enc_bytes, "%s job %d: image "
                  "encoder %.0f bytes, want %.0f", model, j, part(ti, jobs[j].proc, "image encoder (VAE encoder, one image)"),
                  enc_bytes);
        CHECK_MSG(ti->flop_images == 3 * flop, "%s job %d: %.0f FLOPs for the images, want 3 x %.0f", model, j,
                  ti->flop_images, flop);
        /* the same recipe with text prompts: no image parts. The image job needs the conditions more, and the
         * encoder where it makes the process's peak: the eval process's; the trainer's start-up phase (text and
         * image encoders) stays below its training phase at this size */
        CHECK(tt->n_images == 0 && tt->flop_images == 0 && part(tt, jobs[j].proc, "image conditions") < 0 &&
              part(tt, jobs[j].proc, "image encoder (VAE encoder, one image)") < 0);
        /* TI2V's trajectories each hold the condition [16, 1, 4, 4] (core_traj.condition): a step's 32 (2 prompts x
         * 16 samples) in the trainer's part, and the total more by a whole number of them (the workers' and eval's
         * too); I2V-A14B's concat is counted with text prompts too */
        const double one = frames == 1 ? 4.0 * cond_floats : 0;
        const char *step = j == 1 ? "trajectories + velocities of the batch" : "trajectories of a step";
        if (j < 2)
            CHECK_MSG(part(ti, jobs[j].proc, step) - part(tt, jobs[j].proc, step) == 32 * one, "%s job %d: %s %.0f "
                      "bytes, %.0f with text prompts: want + 32 x %.0f", model, j, step, part(ti, jobs[j].proc, step),
                      part(tt, jobs[j].proc, step), one);
        const double more = conds + (jobs[j].enc_peak ? enc_bytes : 0), traj = ti->total - tt->total - more;
        CHECK_MSG(frames == 1 ? traj >= 32 * one && traj / one == (double)(int64_t)(traj / one) : traj == 0,
                  "%s job %d: total %.0f with images, %.0f without: want + %.0f%s", model, j, ti->total, tt->total,
                  more, frames == 1 ? " and whole trajectories' conditions" : "");
    }
    free(ti), free(tt);
}

TEST(budget_counts_image_encoding) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[4096];
    image_models(dir);
    /* TI2V: the image alone, [16, 1, 4, 4] per prompt at 32 x 32 */
    check_image_parts(dir, "ti2v", NULL, 16 * 4 * 4, 1);
    /* I2V-A14B: [image, zeros x 4] encoded as 5 frames, [4 + 16, 2, 4, 4] per prompt */
    check_image_parts(dir, "i2v", NULL, 20 * 2 * 4 * 4, 5);
    /* the printed table names both parts and the start-up work */
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/ti2v --set "
                     "model.init_preset= --set data.prompt_file=%s/p.jsonl --set data.eval_prompt_file=%s/p.jsonl "
                     "2>&1 >/dev/null", bin, dir, dir, dir) == 0);
    CHECK_MSG(strstr(out, "image conditions") && strstr(out, "image encoder (VAE encoder, one image)") &&
                  strstr(out, "image encoding at start-up: 3 images through the VAE encoder"), "got: %s", out);
    /* a source image larger than the video: the encoder's part grows by its decoded U8 (1000 x 800, from the header) */
    static const uint8_t ihdr[24] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                                     0, 0, 0x03, 0xe8, 0, 0, 0x03, 0x20};
    char p[4400];
    snprintf(p, sizeof p, "%s/img/big.png", dir);
    FILE *f = fopen(p, "wb");
    REQUIRE(f && fwrite(ihdr, 1, sizeof ihdr, f) == sizeof ihdr);
    fclose(f);
    test_write_text(dir, "big.jsonl", "{\"prompt\": \"a\", \"image\": \"img/i0.png\"}\n{\"prompt\": \"b\", \"image\": "
                                      "\"img/big.png\"}\n");
    budget_estimate *small = malloc(sizeof *small), *large = malloc(sizeof *large);
    REQUIRE(small && large);
    estimate(small, dir, "ti2v", "p.jsonl", NULL, BUDGET_JOB_RUN);
    estimate(large, dir, "ti2v", "big.jsonl", NULL, BUDGET_JOB_RUN);
    const char *enc = "image encoder (VAE encoder, one image)";
    CHECK_MSG(part(large, "local process", enc) - part(small, "local process", enc) == 3.0 * (1000 * 800 - 32 * 32),
              "%.0f bytes with a 1000 x 800 image, %.0f with 32 x 32 ones", part(large, "local process", enc),
              part(small, "local process", enc));
    free(small), free(large);
}

/* I2V-A14B's trajectories keep the 16-channel latents (every step's) and the concatenated condition once
 * ([4 + 16, F, h, w], core_traj.concat), not 36-channel latents; TI2V's keep the first-frame condition
 * ([16, 1, h, w], core_traj.condition): on the same recipe (8 steps, latent [16, 2, 4, 4], 2 prompts x 16 samples a
 * step) a step's trajectories differ by exactly the conditions, and the TI2V figure is the documented layout. */
TEST(budget_i2v_a14b_trajectories) {
    const char *dir = test_tmpdir();
    image_models(dir);
    budget_estimate *ti = malloc(sizeof *ti), *ia = malloc(sizeof *ia);
    REQUIRE(ti && ia);
    estimate(ti, dir, "ti2v", "p.jsonl", NULL, BUDGET_JOB_RUN);
    estimate(ia, dir, "i2v", "p.jsonl", NULL, BUDGET_JOB_RUN);
    const double nl = 16 * 2 * 4 * 4, N = 8, b = 2 * 16;
    const double one = 4 * ((N + 1) * nl + 3 * N + 1) + 2 * N + sizeof(core_traj) + 4 * 16 * 4 * 4;
    const double t_ti = part(ti, "local process", "trajectories of a step");
    const double t_ia = part(ia, "local process", "trajectories of a step");
    CHECK_MSG(t_ti == b * one, "TI2V: %.0f bytes of trajectories, want %.0f", t_ti, b * one);
    CHECK_MSG(t_ia - t_ti == b * 4 * (20 * 2 * 4 * 4 - 16 * 4 * 4), "I2V-A14B: %.0f bytes of trajectories, TI2V "
              "%.0f: want + %.0f", t_ia, t_ti, b * 4 * (20 * 2 * 4 * 4 - 16 * 4 * 4));
    free(ti), free(ia);
}

/* A VAE whose z_dim is not the transformer's out_channels is refused naming what uses it: with model.decoder
 * latent_rgb and image prompts only the image encoder does (the message had named model.decoder, which is not the
 * VAE then); with model.decoder vae the decoder does. tiny-ti2v with its vae/config.json rewritten to z_dim 8. */
TEST(budget_vae_z_dim_names_its_user) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[4096], path[4400], s[4][4400];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-ti2v --out %s/ti2v --seed 0", bin, dir) == 0);
    write_prompts(dir);
    snprintf(path, sizeof path, "%s/ti2v/vae/config.json", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f, "{\"_class_name\": \"AutoencoderKLWan\", \"attn_scales\": [], \"base_dim\": 4, \"dim_mult\": [1, 2, 2, 2], "
               "\"in_channels\": 3, \"is_residual\": false, \"num_res_blocks\": 1, \"out_channels\": 3, "
               "\"scale_factor_spatial\": 8, \"scale_factor_temporal\": 4, \"temperal_downsample\": [false, true, true], "
               "\"z_dim\": 8, \"latents_mean\": [0, 0, 0, 0, 0, 0, 0, 0], \"latents_std\": [1, 1, 1, 1, 1, 1, 1, 1]}\n");
    fclose(f);
    snprintf(s[0], sizeof s[0], "model.path=%s/ti2v", dir);
    snprintf(s[1], sizeof s[1], "data.prompt_file=%s/p.jsonl", dir);
    snprintf(s[2], sizeof s[2], "data.eval_prompt_file=%s/p.jsonl", dir);
    budget_estimate *e = malloc(sizeof *e);
    REQUIRE(e);
    for (int dec = 0; dec < 2; dec++) {
        snprintf(s[3], sizeof s[3], "model.decoder=%s", dec ? "vae" : "latent_rgb");
        const char *sets[5] = {s[0], s[1], s[2], "model.init_preset=", s[3]};
        core_recipe r;
        REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", sets, 5));
        const int rc = budget_estimate_job(e, &r, &(budget_request){.job = BUDGET_JOB_RUN});
        core_recipe_release(&r);
        const char *msg = core_last_error();
        CHECK(rc == -1 && strstr(msg, "z_dim is 8"));
        if (dec)
            CHECK_MSG(!strncmp(msg, "model.decoder: ", 15), "decoder vae: %s", msg);
        else
            CHECK_MSG(!strstr(msg, "model.decoder") && strstr(msg, "image conditions"), "decoder latent_rgb: %s", msg);
        core_error_clear();
    }
    free(e);
}

/* vgrpo generate --image: budget_generate_bytes counts the image's encoding (the encoder's weights and state from
 * vae_encoder_estimate, the PNG decoded at its own size (generate reads it from the header: a larger source image
 * counts more), the
 * image's U8 and fp32 buffers at the video's size, the condition: TI2V [16, 1, 4, 4], I2V-A14B [4 + 16, 3, 4, 4]
 * and its [3, 9, 32, 32] condition video) on top of the same video without it; and a refusal with --image names the
 * image encoding. */
TEST(budget_generate_counts_the_image) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[4096], path[700];
    const char *models[2] = {"tiny-ti2v", "tiny-i2v"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, models[k]);
        REQUIRE(test_run(out, sizeof out, "%s init-model --preset %s --out %s --seed 0", bin, models[k], path) == 0);
        budget_generate with, without, larger;
        REQUIRE_OK(budget_generate_bytes(&with, path, 9, 32, 32, 2, 512, 32 * 32));
        REQUIRE_OK(budget_generate_bytes(&without, path, 9, 32, 32, 2, 512, 0));
        REQUIRE_OK(budget_generate_bytes(&larger, path, 9, 32, 32, 2, 512, 1000 * 800));
        CHECK_MSG(larger.image - with.image == 3.0 * (1000 * 800 - 32 * 32), "%s: a 1000 x 800 source image: %.0f "
                  "bytes more than a 32 x 32 one", models[k], larger.image - with.image);
        snprintf(path, sizeof path, "%s/%s/vae", dir, models[k]);
        vae_encoder *e = vae_encoder_load(path);
        REQUIRE_OK(e ? 0 : -1);
        double ep, es, flop;
        const int cat = k == 1;
        REQUIRE_OK(vae_encoder_estimate(vae_encoder_get_config(e), cat ? 9 : 1, 32, 32, &ep, &es, &flop));
        vae_encoder_free(e);
        const double px = 32 * 32, cond = cat ? 20 * 3 * 4 * 4 : 16 * 4 * 4;
        const double want = 3 * px + 4 * ep + es + 3 * px + 4 * 3 * px + (cat ? 4 * 3 * 9 * px : 0) + 4 * cond;
        CHECK_MSG(without.image == 0 && with.image == want && with.total - without.total == want,
                  "%s: image part %.0f (want %.0f), totals %.0f and %.0f", models[k], with.image, want, with.total,
                  without.total);
    }
    snprintf(path, sizeof path, "%s/i.png", dir);
    uint8_t img[3 * 8 * 8];
    memset(img, 200, sizeof img);
    REQUIRE_OK(media_png_write(path, img, 8, 8));
    CHECK(test_run(out, sizeof out, "%s generate --pipeline %s/tiny-ti2v --prompt x --image %s --out %s/a.mp4 "
                   "--height 8192 --width 8192 --frames 81", bin, dir, path, dir) == 1);
    CHECK_MSG(strstr(out, "image encoding and video and latents") && strstr(out, "or --force"), "got: %s", out);
}
