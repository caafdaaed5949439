/* tests/test_i2v_a14b.c — Wan 2.2 I2V-A14B (diffusers' WanImageToVideoPipeline without expand_timesteps), what exists
 * of it so far: the wan2.2-i2v-a14b preset (36 input, 16 output channels; its names and shapes are checked against
 * diffusers by wan_params_match_diffusers_names), init-model's pipeline folder (model_index.json as
 * Wan-AI/Wan2.2-I2V-A14B-Diffusers: WanImageToVideoPipeline, boundary_ratio 0.9, no image encoder), the recipe's
 * dry run, the refusals: a transformer config with image_dim (Wan 2.1 I2V's CLIP embeddings) and sampling the
 * 36-channel input, which vgrpo does not do yet (the rollout engine names the model). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_dit.h"
#include "rollout/engine.h"
#include "tests/test.h"

TEST(i2v_a14b_preset_config) {
    wan_config c, t;
    REQUIRE_OK(wan_config_preset(&c, "wan2.2-i2v-a14b"));
    REQUIRE_OK(wan_config_preset(&t, "wan2.2-t2v-a14b"));
    CHECK(c.in_channels == 36 && c.out_channels == 16);
    c.in_channels = 16; /* otherwise the T2V A14B's experts */
    CHECK(wan_config_equal(&c, &t));
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
    /* on the preset's folder (configs, no weights): refused at start-up, naming the model as I2V-A14B */
    CHECK(test_run(out, sizeof out, "%s run recipes/wan2.2-i2v-a14b.yaml --dry-run --set model.path=%s/m", bin, dir) ==
          1);
    CHECK_MSG(strstr(out, "data.prompt_file") && strstr(out, "I2V-A14B pipeline") && strstr(out, "36 channels for 16"),
              "got: %s", out);
    /* text prompts on it: the dry run passes (the estimate takes 36 in / 16 out); a run is refused by the trainer
     * (trainer/run_setup.c) and the rollout engine (i2v_a14b_sampling_refused) */
    CHECK_MSG(test_run(out, sizeof out, "%s run recipes/wan2.2-i2v-a14b.yaml --dry-run --set model.path=%s/m --set "
                       "data.prompt_file=recipes/prompts/scenes.txt --set data.eval_prompt_file=recipes/prompts/scenes_eval.txt",
                       bin, dir) == 0,
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
