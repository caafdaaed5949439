/* tests/test_i2v_a14b_run.c — Wan 2.2 I2V-A14B end to end on the `tiny-i2v` preset (vgrpo init-model: two tiny
 * experts of 36 in / 16 out channels, a VAE with an encoder): prompt files of JSON lines with a PNG per prompt, each
 * image's condition (the mask and the condition video's latents, model/vae/wan_vae_i2v.h) made at start-up, carried
 * by the rollout requests ("<j>/condition" [20, F, h, w]) and the trajectories (`concat`), concatenated to every
 * forward's input by the workers and the trainer.
 * Checks: `vgrpo parity` exactly 0 with one worker and one trainer rank and with two workers and two trainer ranks
 * (the conditions in the dp broadcast), with Ulysses sequence parallelism (sp 2, also beside dp 2) and on the
 * emulated device (model.device cuda); `vgrpo eval`; a local run equals a colocated one bit for bit and resumes
 * exactly. */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "media/png.h"
#include "tests/metrics_rows.h"
#include "tests/i2v_prompts.h"
#include "tests/parity_json.h"
#include "tests/test.h"

static void make_model(const char *dir) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-i2v --out %s/model --seed 0", test_vgrpo_bin(),
                     dir) == 0);
    CHECK(strstr(out, "preset tiny-i2v") && strstr(out, "two experts"));
}

TEST(i2v_a14b_parity_zero_tiny_i2v) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], p[4300];
    make_model(dir);
    i2v_write_square_prompts(dir, 1);
    i2v_parity_zero("", dir, "a", "", out, sizeof out);
    CHECK(strstr(out, "PASS") != NULL);
    /* two workers (3 samples per forward), two trainer ranks (the conditions travel in the dp broadcast) */
    i2v_parity_zero("", dir, "b", "--set parallel.rollout_workers=2 --set rollout.batch_size=3 "
                                      "--set parallel.trainer_ranks=2 --set algorithm.micro_batch_size=5", out, sizeof out);
    CHECK(strstr(out, "PASS") && strstr(out, "2 worker(s)") && strstr(out, "2 rank(s)"));
    /* vgrpo eval: the conditions sent with the requests, every prompt scored */
    int st = test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml " I2V_SET " --set data.eval_samples_per_prompt=2 "
                                   "--set reward.scorers=[first_frame_consistency] --set reward.weights=[1.0] --out %s/ev "
                                   "--workers 2", bin, dir, dir, dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "eval failed: %s", out);
    CHECK(strstr(out, "8 samples (4 prompts x 2)") != NULL);
    snprintf(p, sizeof p, "%s/ev/eval.json", dir);
    struct stat sb;
    CHECK(stat(p, &sb) == 0);
}

/* One frame: I2V-A14B generates its one latent frame (the mask and the condition say it is the image's), so
 * rollout.frames 1 trains: parity exactly 0 over two workers and two trainer ranks (the trajectories' concatenated
 * conditions [20, 1, 4, 4] are checked against the requests'; they had been taken for TI2V's first-frame ones and
 * refused). TI2V, whose one latent frame is the image itself, still refuses it. */
TEST(i2v_a14b_one_frame_parity_zero) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384];
    make_model(dir);
    i2v_write_square_prompts(dir, 1);
    i2v_parity_zero("", dir, "f1", "--set rollout.frames=1 --set parallel.rollout_workers=2 "
                                       "--set parallel.trainer_ranks=2", out, sizeof out);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny-ti2v --out %s/ti2v --seed 0", bin, dir) == 0);
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/ti2v --set "
                                   "model.init_preset= --set data.prompt_file=%s/p.jsonl --set data.eval_prompt_file=%s/p.jsonl "
                                   "--set rollout.frames=1", bin, dir, dir, dir);
    CHECK(st == 1);
    CHECK_MSG(strstr(out, "rollout.frames: 1 frames are one latent frame, the image's: TI2V"), "got: %s", out);
}

/* Sequence parallelism on I2V-A14B: Ulysses degree 2 over two trainer ranks (one dp group of sp 2): each rank's
 * token slice of the 36-channel input (latents, mask and condition concatenated before the patch embedding), both
 * experts; then dp 2 x sp 2 over four ranks with two workers. parity exactly 0 both times. */
TEST(i2v_a14b_parity_zero_ulysses) {
    const char *dir = test_tmpdir();
    char out[16384];
    make_model(dir);
    i2v_write_square_prompts(dir, 1);
    i2v_parity_zero("", dir, "u", "--set parallel.trainer_ranks=2 --set parallel.sp=2 --set parallel.ulysses_degree=2",
                               out, sizeof out);
    CHECK_MSG(strstr(out, "PASS") && strstr(out, "dp 1 x sp 2 (ulysses 2, ring 1)"), "got: %s", out);
    i2v_parity_zero("", dir, "v", "--set parallel.trainer_ranks=4 --set parallel.sp=2 --set parallel.ulysses_degree=2 "
                                      "--set parallel.rollout_workers=2 --set rollout.batch_size=3", out, sizeof out);
    CHECK_MSG(strstr(out, "PASS") && strstr(out, "dp 2 x sp 2 (ulysses 2, ring 1)"), "got: %s", out);
}

/* model.device cuda on the EMULATED device (kernels/cuda/emu; VGRPO_EMULATE_DEVICE=1): the 36-channel input goes
 * through the device forward and backward; parity exactly 0 (the sampler and the trainer on the same device math). */
TEST(i2v_a14b_parity_zero_emulated_device) {
    const char *dir = test_tmpdir();
    char out[16384];
    make_model(dir);
    i2v_write_square_prompts(dir, 1);
    i2v_parity_zero("VGRPO_EMULATE_DEVICE=1 ", dir, "d", "--set model.device=cuda", out, sizeof out);
    CHECK_MSG(strstr(out, "PASS") && strstr(out, "model.device cuda (emulated)"), "got: %s", out);
}

/* A local run equals a colocated one bit for bit (metrics and rewards), and 2 steps + resume + 1 equals 3 straight. */
TEST(i2v_a14b_run_local_colocated_resume) {
    const char *dir = test_tmpdir();
    make_model(dir);
    i2v_write_square_prompts(dir, 1);
    i2v_check_local_colocated_resume(dir, "--set data.eval_samples_per_prompt=1 --set logging.eval_every=2 --set checkpoint.every=2 "
                                          "--set optim.total_steps=3");
}

/* recipes/tiny-cpu-i2v-a14b.yaml learns (make test-slow): the eval's first_frame_consistency rises by more than 3
 * standard errors in its 50 steps (our run: 0.825 +- 0.005 -> 0.962 +- 0.0003, about 16 s on 2 cores). */
TEST(i2v_a14b_tiny_recipe_learns_slow) {
    TEST_SLOW();
    const char *dir = test_tmpdir();
    char out[65536], p[4300];
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu-i2v-a14b.yaml --set model.path=%s/model "
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
