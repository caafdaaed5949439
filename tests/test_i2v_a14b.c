/* tests/test_i2v_a14b.c — Wan 2.2 I2V-A14B (diffusers' WanImageToVideoPipeline without expand_timesteps), what exists
 * of it so far: the condition and the 36-channel input (model/vae/wan_vae_i2v.h) and the rollout engine's sampling
 * with them, one whole two-expert CFG loop against diffusers' pipeline on the same image, embeddings and noise
 * (scripts/fixtures_i2v.py a14b: the condition, every step's latents and the final latents within 1e-5 relative,
 * max|a-b| / max|b|; the mask exactly); an SDE rollout samples every step, batch-invariant; the wan2.2-i2v-a14b
 * preset (36 input, 16 output channels; its names and shapes are checked against diffusers by
 * wan_params_match_diffusers_names), init-model's pipeline folder (model_index.json as
 * Wan-AI/Wan2.2-I2V-A14B-Diffusers: WanImageToVideoPipeline, boundary_ratio 0.9, no image encoder), the recipe's
 * dry run, the refusals: a transformer config with image_dim (Wan 2.1 I2V's CLIP embeddings), text prompts on an
 * I2V-A14B pipeline, sampling the 36-channel model without conditions; the tiny-i2v preset (two tiny 36-in / 16-out
 * experts and a VAE with its encoder) sampled from a PNG's condition, run, and generate --image on it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/dit/wan_dit.h"
#include "model/vae/wan_vae_i2v.h"
#include "media/image.h"
#include "model/vae/wan_vae_encode.h"
#include "core/trajectory.h"
#include "rollout/engine.h"
#include "tests/test.h"
#include "trainer/step/grpo.h"
#include "trainer/step/train_step.h"

TEST(i2v_a14b_preset_config) {
    wan_config c, t;
    REQUIRE_OK(wan_config_preset(&c, "wan2.2-i2v-a14b"));
    REQUIRE_OK(wan_config_preset(&t, "wan2.2-t2v-a14b"));
    CHECK(c.in_channels == 36 && c.out_channels == 16);
    c.in_channels = 16; /* otherwise the T2V A14B's experts */
    CHECK(wan_config_equal(&c, &t));
}

/* wan_cond_kind: every preset's input from its config alone (TI2V's first frame is no transformer matter) */
TEST(i2v_a14b_cond_kind_of_the_presets) {
    const char *const *names = wan_preset_names();
    for (int i = 0; names[i]; i++) {
        wan_config c;
        REQUIRE_OK(wan_config_preset(&c, names[i]));
        const int a14b = !strcmp(names[i], "wan2.2-i2v-a14b") || !strcmp(names[i], "tiny-i2v");
        CHECK_MSG(wan_cond_kind(&c) == (a14b ? WAN_COND_CONCAT : WAN_COND_LATENT), "%s", names[i]);
        CHECK_MSG(wan_cond_channels(&c) == (a14b ? VAE_I2V_MASK_CHANNELS + c.out_channels : 0), "%s", names[i]);
    }
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    c.in_channels = c.out_channels + 3; /* neither: no Wan model */
    CHECK(wan_cond_kind(&c) == WAN_COND_UNKNOWN && wan_cond_channels(&c) == 0);
}

TEST(i2v_a14b_image_dim_refused) {
    wan_config c;
    const char *j = "{\"in_channels\": 36, \"out_channels\": 16, \"image_dim\": 1280}";
    CHECK(wan_config_parse(&c, j, "t/config.json") == -1);
    CHECK_MSG(strstr(core_last_error(), "image_dim") && strstr(core_last_error(), "CLIP image embeddings are not "
                                                                                  "supported"),
              "got: %s", core_last_error());
    REQUIRE_OK(wan_config_parse(&c, "{\"in_channels\": 36, \"out_channels\": 16, \"image_dim\": null}", "x"));
    CHECK(c.in_channels == 36 && c.out_channels == 16);
}

TEST(i2v_a14b_init_model_and_recipe) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    static char out[65536];
    char path[700];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset wan2.2-i2v-a14b --out %s/m", bin, dir) == 0);
    snprintf(path, sizeof path, "%s/m/model_index.json", dir);
    static char mi[8192];
    REQUIRE(test_slurp(path, mi, sizeof mi) > 0);
    CHECK_MSG(strstr(mi, "\"_class_name\": \"WanImageToVideoPipeline\"") && strstr(mi, "\"boundary_ratio\": 0.9") &&
                  strstr(mi, "\"expand_timesteps\": false") && strstr(mi, "\"image_encoder\": [\n    null"),
              "got: %s", mi);
    wan_config x, want;
    REQUIRE_OK(wan_config_preset(&want, "wan2.2-i2v-a14b"));
    for (int e = 0; e < 2; e++) {
        snprintf(path, sizeof path, "%s/m/%s/config.json", dir, e ? "transformer_2" : "transformer");
        REQUIRE_OK(wan_config_load(&x, path));
        CHECK(wan_config_equal(&x, &want));
    }
    /* the recipe checks without weights: two experts at 0.9, the VAE's 16 channels (= out_channels) */
    REQUIRE(test_run(out, sizeof out, "%s run recipes/wan2.2-i2v-a14b.yaml --dry-run", bin) == 0);
    CHECK_MSG(strstr(out, "boundary_ratio: 0.9\n") && strstr(out, "guidance_scale: 3.5\n  guidance_scale_2: 3.5\n") &&
                  strstr(out, "i2v_squares.jsonl"),
              "got: %s", out);
    /* on the preset's folder (configs, no weights): the estimate takes 36 in / 16 out */
    CHECK_MSG(test_run(out, sizeof out, "%s run recipes/wan2.2-i2v-a14b.yaml --dry-run --set model.path=%s/m", bin,
                       dir) == 0,
              "got: %s", out);
    /* text prompts on it: the dry run refuses them from the transformer's config (so do a run's trainer,
     * i2v_a14b_tiny_preset, and the rollout engine, i2v_a14b_sampling_refused) */
    CHECK_MSG(test_run(out, sizeof out, "%s run recipes/wan2.2-i2v-a14b.yaml --dry-run --set model.path=%s/m --set "
                       "data.prompt_file=recipes/prompts/scenes.txt --set data.eval_prompt_file=recipes/prompts/scenes_eval.txt",
                       bin, dir) == 1 &&
                  strstr(out, "data.prompt_file: recipes/prompts/scenes.txt has no images") &&
                  strstr(out, "36 channels for 16 out"),
              "got: %s", out);
}

TEST(i2v_a14b_sampling_refused) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    c.in_channels = 36; /* the tiny DiT with the I2V-A14B's channels */
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wan_params_init_random(&m, 1);
    rollout_experts E = rollout_one_expert(&m);
    rollout_config rc;
    const int64_t shape[4] = {16, 2, 4, 4};
    REQUIRE_OK(rollout_config_init(&rc, 2, 3.0, 0.0f, 1.0f, shape, 4, 1, 1));
    float *e = calloc((size_t)(4 * c.text_dim), sizeof(float));
    REQUIRE(e);
    const float *cond[1] = {e};
    uint64_t uid = 1;
    core_traj t;
    CHECK(rollout_generate(&rc, &E, NULL, 1, cond, &uid, NULL, &t) == -1);
    CHECK_MSG(strstr(core_last_error(), "I2V-A14B") && strstr(core_last_error(), "36"), "got: %s", core_last_error());
    free(e);
    wan_model_free(&m);
}

static double rel_err(const float *a, const float *b, size_t n) {
    double e = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= e)) e = d;
        if (fabs(b[i]) > mx) mx = fabs(b[i]);
    }
    return mx > 0 ? e / mx : e;
}

static float *read_f32(st_file *f, const char *name, int64_t *n) {
    const int i = st_find(f, name);
    if (i < 0) return NULL;
    const st_info *t = st_info_at(f, i);
    int64_t k = 1;
    for (int d = 0; d < t->ndim; d++) k *= t->shape[d];
    float *b = malloc(sizeof(float) * (size_t)k);
    if (b && st_read_f32(f, name, b, k)) {
        free(b);
        return NULL;
    }
    if (n) *n = k;
    return b;
}

TEST(i2v_a14b_mask_layout) {
    /* 9 frames -> 3 latent frames: ones on latent frame 0 in all 4 channels */
    float m[4 * 3 * 2];
    REQUIRE_OK(vae_i2v_mask(9, 3, 1, 2, m));
    for (int c = 0; c < 4; c++)
        for (int t = 0; t < 3; t++)
            for (int j = 0; j < 2; j++) CHECK(m[(c * 3 + t) * 2 + j] == (t == 0 ? 1.0f : 0.0f));
    REQUIRE_OK(vae_i2v_mask(1, 1, 1, 1, m));
    CHECK(m[0] == 1 && m[1] == 1 && m[2] == 1 && m[3] == 1);
    CHECK(vae_i2v_mask(8, 2, 1, 1, m) == -1 && strstr(core_last_error(), "4k+1"));
    CHECK(vae_i2v_mask(9, 2, 1, 1, m) == -1);
    const float x[2 * 3] = {1, 2, 3, 4, 5, 6}, cc[1 * 3] = {7, 8, 9};
    float in[9];
    vae_i2v_input(2, 1, 3, x, cc, in);
    for (int i = 0; i < 9; i++) CHECK(in[i] == (float)(i + 1));
}

typedef struct {
    st_file *io;
    wan_model hi, lo;
    vae_encoder *enc;
    int N, Fv, H, W, T, h, w, L;
    double shift, boundary;
    float g, g2;
    float *pe, *ne, *noise, *cref, *steps, *lref, *cond;
} a14b_fix;

static void a14b_load(a14b_fix *f) {
    memset(f, 0, sizeof *f);
    f->io = st_open("tests/fixtures/i2v_a14b36_io.safetensors");
    REQUIRE(f->io);
    f->N = atoi(st_metadata(f->io, "steps")), f->Fv = atoi(st_metadata(f->io, "frames"));
    f->H = atoi(st_metadata(f->io, "height")), f->W = atoi(st_metadata(f->io, "width"));
    f->shift = atof(st_metadata(f->io, "shift")), f->boundary = atof(st_metadata(f->io, "boundary_ratio"));
    f->g = (float)atof(st_metadata(f->io, "guidance_scale")), f->g2 = (float)atof(st_metadata(f->io, "guidance_scale_2"));
    REQUIRE_OK(wan_model_load(&f->hi, "tests/fixtures/i2v_a14b36/transformer"));
    REQUIRE_OK(wan_model_load(&f->lo, "tests/fixtures/i2v_a14b36/transformer_2"));
    REQUIRE(f->hi.cfg.in_channels == 36 && f->hi.cfg.out_channels == 16);
    f->enc = vae_encoder_load("tests/fixtures/vae_wan21");
    REQUIRE(f->enc);
    f->T = vae_encoder_frames_out(f->enc, f->Fv), f->h = f->H / 8, f->w = f->W / 8;
    int64_t n_pe = 0;
    f->pe = read_f32(f->io, "prompt_embeds", &n_pe), f->ne = read_f32(f->io, "negative_embeds", NULL);
    f->noise = read_f32(f->io, "noise", NULL), f->cref = read_f32(f->io, "condition", NULL);
    f->steps = read_f32(f->io, "step_latents", NULL), f->lref = read_f32(f->io, "latents", NULL);
    REQUIRE(f->pe && f->ne && f->noise && f->cref && f->steps && f->lref);
    f->L = (int)(n_pe / f->hi.cfg.text_dim);
    core_tensor img;
    REQUIRE_OK(st_get(f->io, "image", &img));
    REQUIRE(img.dtype == CORE_U8 && img.shape[0] == f->H && img.shape[1] == f->W);
    float *image = malloc(sizeof(float) * 3 * (size_t)(f->H * f->W));
    f->cond = malloc(sizeof(float) * 20 * (size_t)(f->T * f->h * f->w));
    REQUIRE(image && f->cond);
    vae_video_from_u8(img.data, 1, 1, f->H, f->W, image);
    REQUIRE_OK(vae_i2v_condition(f->enc, image, f->Fv, f->H, f->W, f->cond));
    free(image);
    core_tensor_free(&img);
}

static void a14b_free(a14b_fix *f) {
    free(f->pe), free(f->ne), free(f->noise), free(f->cref), free(f->steps), free(f->lref), free(f->cond);
    vae_encoder_free(f->enc);
    wan_model_free(&f->hi), wan_model_free(&f->lo);
    st_close(f->io);
}

TEST(i2v_a14b_pipeline_vs_diffusers) {
    a14b_fix f;
    a14b_load(&f);
    const int64_t thw = (int64_t)f.T * f.h * f.w, nl = 16 * thw;
    /* the condition: the mask exactly, the encoded condition video within the tolerance */
    CHECK(!memcmp(f.cond, f.cref, sizeof(float) * 4 * (size_t)thw));
    const double e_cond = rel_err(f.cond + 4 * thw, f.cref + 4 * thw, (size_t)(16 * thw));
    /* the loop: ODE, CFG with the negative embeddings, two experts by the boundary, the fixture's noise */
    const int64_t shape[4] = {16, f.T, f.h, f.w};
    rollout_config rc;
    REQUIRE_OK(rollout_config_init(&rc, f.N, f.shift, 0.0f, f.g, shape, f.L, 1, 1));
    rc.guidance_scale_2 = f.g2, rc.boundary_ratio = f.boundary, rc.neg = f.ne;
    const float *cc[1] = {f.cond}, *n0[1] = {f.noise}, *pc[1] = {f.pe};
    rc.concat_conditions = cc, rc.noise0 = n0;
    rollout_experts E = {2, {&f.hi, &f.lo}};
    core_traj t;
    const uint64_t uid = 0;
    REQUIRE_OK(rollout_generate(&rc, &E, NULL, 1, pc, &uid, NULL, &t));
    double e_step = 0;
    int hi_steps = 0;
    for (int i = 0; i < f.N; i++) {
        const double e = rel_err(core_traj_latent(&t, i + 1), f.steps + (int64_t)i * nl, (size_t)nl);
        if (e > e_step) e_step = e;
        if (getenv("VGRPO_VERBOSE")) fprintf(stderr, "  step %d (expert %d): %.3g\n", i, t.expert[i], e);
        hi_steps += t.expert[i] == 0;
    }
    const double e_final = rel_err(core_traj_latent(&t, f.N), f.lref, (size_t)nl);
    CHECK_MSG(hi_steps > 0 && hi_steps < f.N, "%d of %d steps on the high-noise expert: both should run", hi_steps, f.N);
    if (getenv("VGRPO_VERBOSE"))
        fprintf(stderr, "  condition latents %.3g, steps %.3g, final latents %.3g (high-noise steps %d of %d)\n", e_cond,
                e_step, e_final, hi_steps, f.N);
    CHECK_MSG(e_cond <= 1e-5, "condition: rel err %.3g", e_cond);
    CHECK_MSG(e_step <= 1e-5, "step latents: rel err %.3g", e_step);
    CHECK_MSG(e_final <= 1e-5, "final latents: rel err %.3g", e_final);
    core_traj_free(&t);
    a14b_free(&f);
}

TEST(i2v_a14b_sde_every_step_batch_invariant) {
    a14b_fix f;
    a14b_load(&f);
    const int64_t shape[4] = {16, f.T, f.h, f.w};
    const int64_t nl = 16 * (int64_t)f.T * f.h * f.w, ncc = 20 * (int64_t)f.T * f.h * f.w;
    float *cond2 = malloc(sizeof(float) * (size_t)ncc);
    REQUIRE(cond2);
    for (int64_t i = 0; i < ncc; i++) cond2[i] = i < 4 * (ncc / 20) ? f.cond[i] : -f.cond[i];
    const float *cc[2] = {f.cond, cond2}, *pc[2] = {f.pe, f.ne};
    const uint64_t uids[2] = {5, 6};
    rollout_config r1, r2;
    REQUIRE_OK(rollout_config_init(&r1, f.N, f.shift, 0.7f, f.g, shape, f.L, 3, 1));
    REQUIRE_OK(rollout_config_init(&r2, f.N, f.shift, 0.7f, f.g, shape, f.L, 3, 2));
    r1.guidance_scale_2 = r2.guidance_scale_2 = f.g2;
    r1.boundary_ratio = r2.boundary_ratio = f.boundary;
    r1.concat_conditions = r2.concat_conditions = cc;
    rollout_experts E = {2, {&f.hi, &f.lo}};
    core_traj a[2], b[2];
    REQUIRE_OK(rollout_generate(&r2, &E, NULL, 2, pc, uids, NULL, b));
    for (int j = 0; j < 2; j++) {
        r1.concat_conditions = cc + j;
        REQUIRE_OK(rollout_generate(&r1, &E, NULL, 1, pc + j, uids + j, NULL, &a[j]));
        CHECK(!a[j].condition); /* not carried in the trajectory yet */
        for (int i = 0; i <= f.N; i++)
            CHECK(!memcmp(core_traj_latent(&a[j], i), core_traj_latent(&b[j], i), sizeof(float) * (size_t)nl));
        for (int i = 0; i < f.N; i++) {
            CHECK(a[j].has_log_prob[i] == 1 && isfinite(a[j].log_probs[i])); /* every step is sampled */
            CHECK(!memcmp(&a[j].log_probs[i], &b[j].log_probs[i], sizeof(float)));
        }
    }
    /* the two conditions give different videos */
    CHECK(memcmp(core_traj_latent(&b[0], f.N), core_traj_latent(&b[1], f.N), sizeof(float) * (size_t)nl) != 0);
    /* refusals: no condition for a sample, concatenated and first-frame conditions together, a plain model */
    const float *none[2] = {f.cond, NULL};
    r2.concat_conditions = none;
    CHECK(rollout_generate(&r2, &E, NULL, 2, pc, uids, NULL, a) == -1 && strstr(core_last_error(), "sample 1"));
    r2.concat_conditions = cc;
    r2.conditions = cc;
    CHECK(rollout_generate(&r2, &E, NULL, 2, pc, uids, NULL, a) == -1 && strstr(core_last_error(), "TI2V"));
    for (int j = 0; j < 2; j++) core_traj_free(&a[j]), core_traj_free(&b[j]);
    free(cond2);
    a14b_free(&f);
}

/* The tiny I2V pipeline (init-model --preset tiny-i2v): two tiny 36-in / 16-out experts, the tiny VAE with its
 * encoder; a PNG of the tiny I2V recipe as the condition, one SDE rollout through the engine with both experts;
 * what is refused at start-up on it. */
TEST(i2v_a14b_tiny_preset) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    static char out[65536];
    char path[700];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-i2v --out %s/t --seed 4", bin, dir) == 0);
    snprintf(path, sizeof path, "%s/t/model_index.json", dir);
    static char mi[8192];
    REQUIRE(test_slurp(path, mi, sizeof mi) > 0);
    CHECK_MSG(strstr(mi, "\"_class_name\": \"WanImageToVideoPipeline\"") && strstr(mi, "\"boundary_ratio\": 0.875") &&
                  strstr(mi, "\"expand_timesteps\": false"),
              "got: %s", mi);
    wan_model hi, lo;
    snprintf(path, sizeof path, "%s/t/transformer", dir);
    REQUIRE_OK(wan_model_load(&hi, path));
    snprintf(path, sizeof path, "%s/t/transformer_2", dir);
    REQUIRE_OK(wan_model_load(&lo, path));
    CHECK(hi.cfg.in_channels == 36 && hi.cfg.out_channels == 16 && wan_config_equal(&hi.cfg, &lo.cfg));
    CHECK(memcmp(hi.params, lo.params, sizeof(float) * 64) != 0); /* seed and seed + 1 */
    snprintf(path, sizeof path, "%s/t", dir);
    vae_encoder *enc = vae_encoder_load(path);
    REQUIRE(enc);
    const int Fv = 9, H = 32, Wd = 32, T = vae_encoder_frames_out(enc, Fv), s = vae_encoder_spatial_factor(enc);
    const int h = H / s, w = Wd / s;
    uint8_t px[32 * 32 * 3];
    REQUIRE_OK(media_image_load("recipes/prompts/images/white_on_red.png", H, Wd, px));
    float img[3 * 32 * 32];
    vae_video_from_u8(px, 1, 1, H, Wd, img);
    float *cond = malloc(sizeof(float) * 20 * (size_t)(T * h * w));
    REQUIRE(cond);
    REQUIRE_OK(vae_i2v_condition(enc, img, Fv, H, Wd, cond));
    const int64_t shape[4] = {16, T, h, w};
    rollout_config rc;
    REQUIRE_OK(rollout_config_init(&rc, 6, 3.0, 0.8f, 4.0f, shape, 4, 7, 2));
    rc.guidance_scale_2 = 3.0f;
    const float *cc[2] = {cond, cond};
    rc.concat_conditions = cc;
    float *emb = calloc((size_t)(4 * hi.cfg.text_dim), sizeof(float));
    REQUIRE(emb);
    for (int i = 0; i < 4 * hi.cfg.text_dim; i++) emb[i] = (float)((i % 7) - 3) * 0.1f;
    const float *pc[2] = {emb, emb};
    const uint64_t uids[2] = {1, 2};
    rollout_experts E = {2, {&hi, &lo}};
    core_traj t[2];
    REQUIRE_OK(rollout_generate(&rc, &E, NULL, 2, pc, uids, NULL, t));
    int used[2] = {0, 0};
    for (int i = 0; i < 6; i++) {
        used[t[0].expert[i]] = 1;
        CHECK(t[0].has_log_prob[i] && isfinite(t[0].log_probs[i]));
    }
    CHECK(used[0] && used[1]);
    const int64_t nl = 16 * (int64_t)T * h * w;
    int finite = 1;
    for (int64_t i = 0; i < nl; i++) finite &= isfinite(core_traj_latent(&t[0], 6)[i]) != 0;
    CHECK(finite);
    CHECK(memcmp(core_traj_latent(&t[0], 6), core_traj_latent(&t[1], 6), sizeof(float) * (size_t)nl) != 0);
    for (int j = 0; j < 2; j++) core_traj_free(&t[j]);
    /* the image recipe runs on it (tests/test_i2v_a14b_run.c: parity, resume); a text recipe is refused at start-up */
    CHECK_MSG(test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v.yaml --steps 1 --set model.path=%s/t --set "
                       "model.init_preset= --set logging.run_dir=%s/r1 --set rollout.num_steps=2 --set "
                       "logging.eval_every=0", bin, dir, dir) == 0,
              "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --steps 1 --set model.path=%s/t --set "
                   "model.init_preset= --set logging.run_dir=%s/r2", bin, dir, dir) == 1);
    CHECK_MSG(strstr(out, "36 channels for 16 out") && strstr(out, "needs prompt files with an image"), "got: %s", out);
    /* vgrpo generate --image on it (the condition concatenated at every step); without --image it is refused */
    CHECK_MSG(test_run(out, sizeof out, "%s generate --pipeline %s/t --prompt \"a red square\" --image "
                       "recipes/prompts/images/white_on_red.png --out %s/g.mp4 --steps 4 --frames 9 --height 32 --width 32",
                       bin, dir, dir) == 0,
              "got: %s", out);
    snprintf(path, sizeof path, "%s/g.mp4", dir);
    CHECK(test_slurp(path, mi, sizeof mi) > 0);
    CHECK(test_run(out, sizeof out, "%s generate --pipeline %s/t --prompt x --out %s/h.mp4 --steps 2 --frames 5 "
                   "--height 32 --width 32", bin, dir, dir) == 1);
    CHECK_MSG(strstr(out, "give the first frame with --image"), "got: %s", out);
    free(emb), free(cond);
    vae_encoder_free(enc);
    wan_model_free(&hi), wan_model_free(&lo);
}

/* The trainer recomputes an I2V-A14B rollout's log-probs bit for bit: the trajectory keeps the condition, and the
 * training step builds the same 36-channel input (micro-batches mixing samples and steps, both experts, with and
 * without GRPO-Guard); the gradient reaches both experts. The trajectory is stored with its condition and read back
 * bit for bit; a batch mixing it with trajectories without one is refused. */
TEST(i2v_a14b_trainer_recomputes_rollout) {
    a14b_fix f;
    a14b_load(&f);
    const int64_t shape[4] = {16, f.T, f.h, f.w}, ncc = 20 * (int64_t)f.T * f.h * f.w;
    float *cond2 = malloc(sizeof(float) * (size_t)ncc);
    REQUIRE(cond2);
    for (int64_t i = 0; i < ncc; i++) cond2[i] = i < 4 * (ncc / 20) ? f.cond[i] : 0.5f * f.cond[i];
    enum { NS = 4 };
    const float *cc[NS] = {f.cond, f.cond, cond2, cond2}, *pc[NS] = {f.pe, f.pe, f.ne, f.ne};
    const uint64_t uids[NS] = {10, 11, 12, 13};
    const int64_t pidx[NS] = {0, 0, 1, 1};
    rollout_config rc;
    REQUIRE_OK(rollout_config_init(&rc, f.N, f.shift, 0.8f, f.g, shape, f.L, 9, 3));
    rc.guidance_scale_2 = f.g2, rc.boundary_ratio = f.boundary, rc.concat_conditions = cc, rc.record_means = 1;
    rollout_experts E = {2, {&f.hi, &f.lo}};
    core_traj t[NS];
    REQUIRE_OK(rollout_generate(&rc, &E, NULL, NS, pc, uids, pidx, t));
    for (int s = 0; s < NS; s++) {
        REQUIRE(t[s].concat && t[s].concat_channels == 20);
        CHECK(!memcmp(t[s].concat, cc[s], sizeof(float) * (size_t)ncc));
        for (int i = 0; i < f.N; i++) CHECK(t[s].has_log_prob[i] == 1);
    }
    const float r[NS] = {0.1f, 0.9f, 0.3f, 0.6f};
    float adv[NS];
    uint8_t mask[NS];
    REQUIRE_OK(grpo_advantages(r, 2, 2, GRPO_STD_GROUP, 5.0f, adv, mask, NULL));
    REQUIRE_OK(wan_model_alloc_grads(&f.hi));
    REQUIRE_OK(wan_model_alloc_grads(&f.lo));
    wan_model *pol[2] = {&f.hi, &f.lo};
    const uint8_t trained[2] = {1, 1};
    const int mbs[2] = {1, 3};
    for (int k = 0; k < 2; k++)
        for (int guard = 0; guard < 2; guard++) {
            trainer_config tc = {.seed = 5, .clip_eps = 0.2f, .micro_batch_size = mbs[k], .acts_mode = WAN_ACTS_STORE,
                                 .guard = guard};
            REQUIRE_OK(grpo_selection_parse("all", &tc.sel));
            trainer_batch b = {.n = NS, .traj = t, .cond = pc, .text_len = f.L, .adv = adv, .mask = mask, .neg = NULL};
            grpo_loss_stats st = {0};
            wan_model_zero_grads(&f.hi), wan_model_zero_grads(&f.lo);
            REQUIRE_OK(trainer_accumulate_experts(pol, NULL, 2, trained, NULL, &tc, &b, 1, &st));
            CHECK(st.n_transitions == NS * f.N);
            CHECK_MSG(st.abs_logp_diff_sum == 0.0, "micro %d guard %d: |dlogp| %g", mbs[k], guard, st.abs_logp_diff_sum);
            double g0 = 0, g1 = 0;
            for (int64_t q = 0; q < f.hi.layout.numel; q++) g0 += (double)f.hi.grads[q] * f.hi.grads[q];
            for (int64_t q = 0; q < f.lo.layout.numel; q++) g1 += (double)f.lo.grads[q] * f.lo.grads[q];
            CHECK(g0 > 0 && g1 > 0 && isfinite(g0) && isfinite(g1));
        }
    /* stored (format_version 2, tensor concat) and read back bit for bit */
    char path[600];
    snprintf(path, sizeof path, "%s/t.safetensors", test_tmpdir());
    REQUIRE_OK(core_traj_save(&t[2], path));
    core_traj back;
    REQUIRE_OK(core_traj_load(&back, path));
    CHECK(back.concat && back.concat_channels == 20 && !memcmp(back.concat, t[2].concat, sizeof(float) * (size_t)ncc));
    CHECK(!memcmp(back.latents, t[2].latents, sizeof(float) * (size_t)(f.N + 1) * 16 * f.T * f.h * f.w));
    core_traj_free(&back);
    /* a batch mixing conditioned and unconditioned trajectories is refused */
    float *keep = t[1].concat;
    t[1].concat = NULL;
    trainer_config tc = {.seed = 5, .clip_eps = 0.2f, .micro_batch_size = 2, .acts_mode = WAN_ACTS_STORE};
    REQUIRE_OK(grpo_selection_parse("all", &tc.sel));
    trainer_batch b = {.n = NS, .traj = t, .cond = pc, .text_len = f.L, .adv = adv, .mask = mask};
    grpo_loss_stats st = {0};
    CHECK(trainer_accumulate_experts(pol, NULL, 2, trained, NULL, &tc, &b, 0, &st) == -1 &&
          strstr(core_last_error(), "concatenated image condition"));
    t[1].concat = keep;
    for (int s = 0; s < NS; s++) core_traj_free(&t[s]);
    free(cond2);
    a14b_free(&f);
}
