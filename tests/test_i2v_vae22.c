/* tests/test_i2v_vae22.c — image to video (Wan 2.2 TI2V first-frame conditioning) with the Wan 2.2 VAE (spatial
 * factor 16, 48 channels, patchified) as the rollout's decoder, as the real TI2V-5B has it: a tiny pipeline made from
 * `init-model --preset tiny-ti2v` (tokenizer, text encoder, expand_timesteps) with a tiny DiT of 48 in / 48 out
 * channels and the Wan 2.2 VAE fixture (tests/fixtures/vae_wan22: decoder and encoder) in place of the Wan 2.1-style
 * tiny VAE; rollout.height/width 64 (latent 4 x 4), model.vae_scale_factor_spatial 16.
 * Checks: a rollout's decoded video (rollout_pipeline_decode: 5 frames of 64 x 64) equals vae_latents_to_u8 of the
 * trajectory's final latents bit for bit, and the final latents keep the image's latent as frame 0; `vgrpo parity`
 * exactly 0; a local run equals a colocated one bit for bit (metrics and the sample videos' hashes); the refusals: a
 * recipe whose model.vae_scale_factor_spatial is not the VAE's (named with the value and the VAE folder, at start-up
 * and by rollout_decoder_load), latent_rgb with factor 16 (by rollout_decoder_load and before a colocated job starts). */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/recipe.h"
#include "media/image.h"
#include "media/png.h"
#include "model/dit/wan_dit.h"
#include "model/vae/wan_vae.h"
#include "model/vae/wan_vae_encode.h"
#include "rollout/pipeline.h"
#include "tests/metrics_rows.h"
#include "tests/i2v_prompts.h"
#include "tests/parity_json.h"
#include "tests/test.h"

/* dir/model: tiny-ti2v with a 48-channel DiT (tiny's otherwise, seed 0) and the Wan 2.2 VAE fixture. */
static void make_model(const char *dir) {
    char out[4096], path[4300];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-ti2v --out %s/model --seed 0", test_vgrpo_bin(),
                     dir) == 0);
    REQUIRE(test_run(out, sizeof out, "rm -rf %s/model/transformer %s/model/vae && cp -r tests/fixtures/vae_wan22 "
                                      "%s/model/vae", dir, dir, dir) == 0);
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny-ti2v"));
    c.in_channels = c.out_channels = 48;
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wan_params_init_random(&m, 0);
    snprintf(path, sizeof path, "%s/model/transformer", dir);
    REQUIRE_OK(wan_model_save(&m, path));
    wan_model_free(&m);
}

#define V22_SET                                                                                                     \
    "--set model.path=%s/model --set model.init_preset= --set data.prompt_file=%s/p.jsonl "                        \
    "--set data.eval_prompt_file=%s/p.jsonl --set model.vae_scale_factor_spatial=16 --set rollout.height=64 "      \
    "--set rollout.width=64 --set rollout.num_steps=4 --set rollout.prompts_per_step=2 "                          \
    "--set rollout.samples_per_prompt=4 --set algorithm.timestep_selection=all"

/* The recipe of V22_SET in-process (factor: model.vae_scale_factor_spatial; decoder: model.decoder). */
static void load_recipe(core_recipe *r, const char *dir, int factor, const char *decoder, char sets[8][4400]) {
    snprintf(sets[0], 4400, "model.path=%s/model", dir);
    snprintf(sets[1], 4400, "model.init_preset=");
    snprintf(sets[2], 4400, "data.prompt_file=%s/p.jsonl", dir);
    snprintf(sets[3], 4400, "data.eval_prompt_file=%s/p.jsonl", dir);
    snprintf(sets[4], 4400, "model.vae_scale_factor_spatial=%d", factor);
    snprintf(sets[5], 4400, "rollout.num_steps=4");
    snprintf(sets[6], 4400, "model.decoder=%s", decoder);
    snprintf(sets[7], 4400, "rollout.height=64");
    const char *s[9] = {sets[0], sets[1], sets[2], sets[3], sets[4], sets[5], sets[6], sets[7], "rollout.width=64"};
    REQUIRE_OK(core_recipe_load(r, "recipes/tiny-cpu.yaml", s, 9));
}

TEST(i2v_vae22_rollout_decodes_final_latents) {
    const char *dir = test_tmpdir();
    char sets[8][4400], p[4300];
    make_model(dir);
    i2v_write_square_prompts(dir, 0);
    core_recipe r;
    load_recipe(&r, dir, 16, "vae", sets);
    rollout_pipeline pl;
    REQUIRE_OK(rollout_pipeline_load(&pl, &r, NULL));
    const rollout_decoder *d = &pl.dec;
    CHECK_MSG(d->frames == 5 && d->height == 64 && d->width == 64, "decoded video %d x %d x %d, want 5 x 64 x 64",
              d->frames, d->height, d->width);
    CHECK(d->latent[0] == 48 && d->latent[1] == 2 && d->latent[2] == 4 && d->latent[3] == 4);
    CHECK(rollout_pipeline_video_bytes(&pl) == 5 * 64 * 64 * 3);
    /* two samples of two images: each image's latent [48, 1, 4, 4] by the pipeline's encoder */
    snprintf(p, sizeof p, "%s/model", dir);
    vae_encoder *enc = vae_encoder_load(p);
    REQUIRE(enc);
    enum { N = 2, NC = 48 * 4 * 4 };
    float conds[N][NC];
    const float *cp[N], *emb[N];
    uint64_t uids[N] = {0, 1};
    int64_t pidx[N] = {0, 2};
    const char *names[N] = {"red", "blue"};
    for (int j = 0; j < N; j++) {
        snprintf(p, sizeof p, "%s/img/%s.png", dir, names[j]);
        REQUIRE_OK(media_image_encode(enc, p, 64, 64, conds[j]));
        cp[j] = conds[j];
        snprintf(p, sizeof p, "a %s square", names[j]);
        REQUIRE_OK(rollout_pipeline_embed(&pl, p, &emb[j]));
    }
    vae_encoder_free(enc);
    rollout_config rc = pl.rc;
    rc.conditions = cp;
    core_traj t[N];
    REQUIRE_OK(rollout_generate(&rc, &pl.experts, NULL, N, emb, uids, pidx, t));
    snprintf(p, sizeof p, "%s/model/vae", dir);
    vae_model *vae = vae_load(p);
    REQUIRE(vae);
    const size_t vb = 5 * 64 * 64 * 3, fb = 64 * 64 * 3;
    uint8_t *got = malloc(N * vb), *want = malloc(vb);
    REQUIRE(got && want);
    for (int j = 0; j < N; j++) {
        const float *z = core_traj_latent(&t[j], t[j].n_steps);
        REQUIRE_OK(rollout_pipeline_decode(&pl, &t[j], got + j * vb));
        REQUIRE_OK(vae_latents_to_u8(vae, z, 1, 48, 2, 4, 4, want));
        CHECK_MSG(!memcmp(got + j * vb, want, vb), "sample %d: the rollout's video is not vae_latents_to_u8 of its final "
                  "latents", j);
        /* frame 0 of every channel is the image's latent, bit for bit (the first frame is held, not sampled) */
        int held = 1;
        for (int c = 0; c < 48; c++) held &= !memcmp(z + c * 2 * 16, conds[j] + c * 16, 16 * sizeof(float));
        CHECK_MSG(held, "sample %d: the final latent's frame 0 is not the image's latent", j);
        core_traj_free(&t[j]);
    }
    /* the two samples' generated frames differ (a real decode of different latents, not a constant video) */
    CHECK(memcmp(got + fb, got + vb + fb, 4 * fb) != 0);
    free(got), free(want);
    vae_free(vae);
    rollout_pipeline_free(&pl);
    core_recipe_release(&r);

    /* the recipe's factor must be the VAE's: named with the value and the VAE folder */
    load_recipe(&r, dir, 8, "vae", sets);
    wan_config wc;
    snprintf(p, sizeof p, "%s/model/transformer/config.json", dir);
    REQUIRE_OK(wan_config_load(&wc, p));
    rollout_decoder dd;
    char want_msg[4600];
    snprintf(want_msg, sizeof want_msg, "model.vae_scale_factor_spatial: 8, but the VAE in %s/model/vae has spatial "
             "factor 16", dir);
    CHECK(rollout_decoder_load(&dd, &r, &wc) == -1);
    CHECK_MSG(strstr(core_last_error(), want_msg), "got: %s", core_last_error());
    core_recipe_release(&r);
    /* latent_rgb paints 8 x 8 pixels per latent pixel */
    load_recipe(&r, dir, 16, "latent_rgb", sets);
    CHECK(rollout_decoder_load(&dd, &r, &wc) == -1);
    CHECK_MSG(strstr(core_last_error(), "model.vae_scale_factor_spatial: 16, but model.decoder latent_rgb paints 8 x 8"),
              "got: %s", core_last_error());
    core_recipe_release(&r);
}

/* `vgrpo parity` exactly 0; a local run (its decoder: rollout/source_local.c) equals a colocated one (the workers':
 * rollout/pipeline.c) bit for bit, the sample videos (64 x 64, logging.video_every) included; the start-up refusal. */
TEST(i2v_vae22_parity_and_runs) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], p[4300], q[4300], want[4600];
    make_model(dir);
    i2v_write_square_prompts(dir, 0);
    int st = test_run(out, sizeof out, "%s parity recipes/tiny-cpu.yaml --set mode=colocated " V22_SET
                                       " --set logging.run_dir=%s/par", bin, dir, dir, dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "parity failed: %s", out);
    CHECK(strstr(out, "PASS") != NULL);
    snprintf(p, sizeof p, "%s/par/parity.json", dir);
    check_parity_zero(p, 4);

    const char *more = "--set data.eval_samples_per_prompt=1 --set logging.eval_every=2 --set logging.video_every=2 "
                       "--set optim.total_steps=2";
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml " V22_SET " %s --set logging.run_dir=%s/loc", bin, dir,
                  dir, dir, more, dir);
    if (st) test_fail(__FILE__, __LINE__, "local run failed: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set mode=colocated " V22_SET
                                   " %s --set logging.run_dir=%s/col", bin, dir, dir, dir, more, dir);
    if (st) test_fail(__FILE__, __LINE__, "colocated run failed: %s", out);
    json_t *a[8], *b[8];
    snprintf(p, sizeof p, "%s/loc/metrics.jsonl", dir);
    const int na = read_rows(p, a, 8, 1);
    snprintf(p, sizeof p, "%s/col/metrics.jsonl", dir);
    const int nb = read_rows(p, b, 8, 1);
    CHECK_MSG(na == 3 && nb == 3, "%d and %d rows, want 3", na, nb);
    for (int i = 0; i < na && i < nb; i++) {
        CHECK_MSG(json_equal(a[i], b[i]), "row %d: local and colocated differ", i);
        if (i < 2) CHECK(json_number_value(json_object_get(a[i], "log_prob_mean_abs_diff")) == 0.0);
    }
    for (int i = 0; i < na; i++) json_decref(a[i]);
    for (int i = 0; i < nb; i++) json_decref(b[i]);
    /* the sample videos: the same raw frames in both modes, and the sheet's tiles 128 x 128 (the image and 5 frames of
     * 64 x 64, drawn twice as large: media/png.h) */
    for (int s = 0; s <= 2; s += 2) {
        snprintf(p, sizeof p, "%s/loc/videos/step-%d/index.json", dir, s);
        snprintf(q, sizeof q, "%s/col/videos/step-%d/index.json", dir, s);
        json_error_t e;
        json_t *x = json_load_file(p, 0, &e), *y = json_load_file(q, 0, &e);
        CHECK_MSG(x && y && json_equal(x, y), "step %d: the sample videos' index.json differ (or are missing)", s);
        json_decref(x), json_decref(y);
    }
    snprintf(p, sizeof p, "%s/loc/videos/step-2/sheet.png", dir);
    core_tensor sh;
    REQUIRE_OK(media_png_read(p, &sh));
    CHECK_MSG(sh.shape[1] == 6 * 128 + 7 * 2, "sheet width %lld, want the image and 5 frames of 64 as 128-pixel tiles",
              (long long)sh.shape[1]);
    core_tensor_free(&sh);

    /* start-up refusal: the recipe's factor is not the VAE's */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run " V22_SET
                                   " --set model.vae_scale_factor_spatial=8", bin, dir, dir, dir);
    snprintf(want, sizeof want, "model.vae_scale_factor_spatial: 8, but the VAE in %s/model/vae has spatial factor 16",
             dir);
    CHECK_MSG(st != 0 && strstr(out, want), "exit %d, want \"%s\" in: %s", st, want, out);
    /* latent_rgb paints 8 x 8 pixels per latent pixel: a colocated job refuses factor 16 before starting a worker */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set mode=colocated " V22_SET " --set "
                                   "model.decoder=latent_rgb --set logging.run_dir=%s/lrgb", bin, dir, dir, dir, dir);
    CHECK_MSG(st != 0 && strstr(out, "vgrpo run: model.vae_scale_factor_spatial: 16, but model.decoder latent_rgb"),
              "exit %d: %s", st, out);
    CHECK(test_run(NULL, 0, "test -e %s/lrgb/logs", dir) != 0); /* no process was started */
}
