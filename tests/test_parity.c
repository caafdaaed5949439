/* tests/test_parity.c — `vgrpo parity` across processes (cli/cmd_parity.c, trainer/run/parity.c): the
 * trainer's recomputed log-prob and velocity of every trainable transition equal the rollout workers' bit for bit
 * (table and parity.json all zeros, exit 0): with one worker and one trainer rank, and with two workers (3 samples per
 * forward), two trainer ranks under mpirun (5 transitions per forward) and different OpenMP thread counts in the
 * workers (2 threads) and the trainer ranks (1 thread each); bad --tolerance values are refused. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string.h>

#include "tests/test.h"

static void check_parity_json(const char *path, int want_steps, int want_transitions) {
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) test_fail(__FILE__, __LINE__, "%s: %s", path, e.text);
    REQUIRE(j);
    CHECK(json_is_true(json_object_get(j, "pass")));
    CHECK(json_real_value(json_object_get(j, "max_abs_dlogp")) == 0.0);
    CHECK(json_real_value(json_object_get(j, "max_abs_dv")) == 0.0);
    const json_t *steps = json_object_get(j, "steps");
    CHECK((int)json_array_size(steps) == want_steps);
    for (size_t i = 0; i < json_array_size(steps); i++) {
        const json_t *s = json_array_get(steps, i);
        CHECK(json_integer_value(json_object_get(s, "transitions")) == want_transitions);
        CHECK(json_real_value(json_object_get(s, "max_abs_dv")) == 0.0);
    }
    json_decref(j);
}

TEST(parity_zero_across_processes) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2048];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    snprintf(base, sizeof base,
             "--set mode=colocated --set model.path=%s/model --set rollout.num_steps=4 --set rollout.prompts_per_step=2 "
             "--set rollout.samples_per_prompt=4 --set algorithm.timestep_selection=all",
             dir);
    int st = test_run(out, sizeof out, "%s parity recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/a", bin, base, dir);
    if (st) test_fail(__FILE__, __LINE__, "parity (1 worker, 1 rank) failed: %s", out);
    CHECK(strstr(out, "PASS") && strstr(out, "1 worker(s)") && strstr(out, "1 rank(s)"));
    char p[700];
    snprintf(p, sizeof p, "%s/a/parity.json", dir);
    check_parity_json(p, 4, 8);
    /* 2 workers x 3 samples per forward (2 threads each is what 2 cores give 1 worker; here 1 each), 2 trainer ranks
     * x 5 transitions per forward (1 thread each), a partial selection */
    st = test_run(out, sizeof out,
                  "%s parity recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/b --set parallel.rollout_workers=2 "
                  "--set rollout.batch_size=3 --set parallel.trainer_ranks=2 --set algorithm.micro_batch_size=5 "
                  "--set algorithm.timestep_selection='first_fraction 0.5'",
                  bin, base, dir);
    if (st) test_fail(__FILE__, __LINE__, "parity (2 workers, 2 ranks) failed: %s", out);
    CHECK(strstr(out, "PASS") && strstr(out, "2 worker(s)") && strstr(out, "2 rank(s)"));
    snprintf(p, sizeof p, "%s/b/parity.json", dir);
    check_parity_json(p, 2, 8);
    /* 1 worker with 2 OpenMP threads vs 2 trainer ranks with 1 */
    st = test_run(out, sizeof out,
                  "%s parity recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/c --set parallel.trainer_ranks=2 "
                  "--set algorithm.micro_batch_size=3", bin, base, dir);
    if (st) test_fail(__FILE__, __LINE__, "parity (threads differ) failed: %s", out);
    CHECK(strstr(out, "PASS") != NULL);
}

TEST(parity_bad_arguments) {
    char out[4096];
    CHECK(test_run(out, sizeof out, "%s parity recipes/tiny-cpu.yaml --tolerance -1", test_vgrpo_bin()) == 2);
    CHECK(strstr(out, "--tolerance") != NULL);
    CHECK(test_run(out, sizeof out, "%s parity", test_vgrpo_bin()) == 2);
    CHECK(test_run(out, sizeof out, "%s parity recipes/tiny-cpu.yaml --set model.path=/nonexistent/m --set model.init_preset= --set mode=colocated",
                   test_vgrpo_bin()) == 1);
    CHECK(strstr(out, "model.path") != NULL);
}

/* Two experts (Wan 2.2 A14B layout, `init-model --experts 2`): parity 0 with both trained and with transformer_2
 * frozen (its steps are not recomputed: only expert-0 steps appear), and a colocated run with one expert frozen
 * keeps the workers' model hash equal to the trainer's (the frozen expert is not sent, yet still matches). */
TEST(parity_two_experts) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2048], p[700];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --experts 2 --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    snprintf(base, sizeof base,
             "--set mode=colocated --set model.path=%s/model --set rollout.num_steps=6 --set rollout.prompts_per_step=2 "
             "--set rollout.samples_per_prompt=2 --set rollout.guidance_scale_2=2.0 --set data.eval_samples_per_prompt=1",
             dir);
    int st = test_run(out, sizeof out, "%s parity recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/a", bin, base, dir);
    if (st) test_fail(__FILE__, __LINE__, "parity (two experts) failed: %s", out);
    snprintf(p, sizeof p, "%s/a/parity.json", dir);
    check_parity_json(p, 6, 4);
    st = test_run(out, sizeof out, "%s parity recipes/tiny-cpu.yaml %s --set algorithm.train_experts=transformer "
                  "--set logging.run_dir=%s/b", bin, base, dir);
    if (st) test_fail(__FILE__, __LINE__, "parity (transformer_2 frozen) failed: %s", out);
    snprintf(p, sizeof p, "%s/b/parity.json", dir);
    /* shift 3, 6 steps: timesteps >= 875 are steps 0 and 1 (expert 0) */
    check_parity_json(p, 2, 4);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --set algorithm.train_experts=transformer_2 --steps 2 "
                  "--set logging.run_dir=%s/c --set checkpoint.every=-1", bin, base, dir);
    if (st) test_fail(__FILE__, __LINE__, "run (transformer frozen) failed: %s", out);
    snprintf(p, sizeof p, "%s/c/metrics.jsonl", dir);
    char grep[128];
    CHECK(test_run(grep, sizeof grep, "grep -c '\"weight_sync/hash_match\":1' %s", p) == 0 && atoi(grep) == 2);
}

/* logging.video_every: videos/step-N/ holds an mp4 per eval prompt (up to 4), a contact sheet and index.json, and a
 * colocated run writes the same frames as a local run (same noise, weights and decoder; the workers decode). */
TEST(run_step_videos_local_equals_colocated) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[8192], base[2048];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    snprintf(base, sizeof base, "--set model.path=%s/model --set rollout.num_steps=3 --set rollout.samples_per_prompt=2 "
             "--set data.eval_samples_per_prompt=1 --set logging.video_every=1 --set checkpoint.every=-1 --steps 1", dir);
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/l", bin, base, dir);
    if (st) test_fail(__FILE__, __LINE__, "local run: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --set mode=colocated --set logging.run_dir=%s/c", bin,
                  base, dir);
    if (st) test_fail(__FILE__, __LINE__, "colocated run: %s", out);
    /* The frames (index.json: raw-frame xxh64 and rewards) and contact sheets are identical; the mp4s exist (libx264
     * has been seen to encode the first video of a process differently from run to run, so their bytes are not
     * compared). */
    const char *same[] = {"step-0/index.json", "step-0/sheet.png", "step-1/index.json", "step-1/sheet.png"};
    for (int i = 0; i < 4; i++)
        CHECK_MSG(test_run(NULL, 0, "cmp -s %s/l/videos/%s %s/c/videos/%s", dir, same[i], dir, same[i]) == 0, "%s differs",
                  same[i]);
    const char *exist[] = {"step-0/p0000.mp4", "step-0/p0003.mp4", "step-1/p0002.mp4"};
    for (int i = 0; i < 3; i++) CHECK(test_run(NULL, 0, "test -s %s/c/videos/%s", dir, exist[i]) == 0);
    CHECK(test_run(NULL, 0, "grep -q video_xxh64 %s/l/videos/step-1/index.json", dir) == 0);
    CHECK(test_run(NULL, 0, "test -e %s/l/videos/step-1/p0004.mp4", dir) != 0);
}

/* Review findings, each refused with the cause on the terminal:
 *   --resume of a checkpoint outside this run's folder (it would truncate another run's metrics and prune its
 *   checkpoints); an external reward server whose scorers differ from reward.scorers (the metrics would carry the
 *   wrong names); reward.endpoint in local mode (it would be ignored); an eval whose worker fails on a truncated
 *   checkpoint quotes the worker's own error, not just its exit status. */
TEST(run_refusals_from_review) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], base[2048];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    snprintf(base, sizeof base, "--set model.path=%s/model --set rollout.num_steps=2 --set rollout.samples_per_prompt=2 "
             "--set data.eval_samples_per_prompt=1 --set checkpoint.every=1", dir);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --steps 1 --set logging.run_dir=%s/a", bin, base, dir) == 0);
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --steps 2 --set logging.run_dir=%s/b --resume %s/a",
                      bin, base, dir, dir);
    CHECK(st == 1 && strstr(out, "not in this run's checkpoint folder") && strstr(out, "logging.run_dir"));
    CHECK(test_run(NULL, 0, "test -e %s/b/metrics.jsonl", dir) != 0);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --steps 1 --set reward.endpoint=ipc://%s/r --set "
                  "logging.run_dir=%s/c", bin, base, dir, dir);
    CHECK(st == 1 && strstr(out, "reward.endpoint") && strstr(out, "local mode"));
    /* an external server scoring brightness while the recipe says color_match */
    char sock[64] = "/tmp/vgrpo-rv-XXXXXX", ep[128];
    REQUIRE(mkdtemp(sock));
    snprintf(ep, sizeof ep, "ipc://%s/r", sock);
    pid_t srv = fork();
    if (srv == 0) {
        FILE *f = freopen("/dev/null", "w", stderr);
        (void)f;
        execl(bin, bin, "reward-server", "--bind", ep, "--scorers", "brightness:1", (char *)NULL);
        _exit(127);
    }
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --steps 1 --set mode=colocated --set reward.endpoint=%s "
                  "--set logging.run_dir=%s/d", bin, base, ep, dir);
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    CHECK_MSG(st == 1 && strstr(out, "[brightness:1]") && strstr(out, "[color_match:1]"), "got: %s", out);
    char p2[128];
    snprintf(p2, sizeof p2, "%s/r", sock);
    unlink(p2);
    rmdir(sock);
    /* a truncated checkpoint: the worker's reason reaches the terminal */
    REQUIRE(test_run(NULL, 0, "truncate -s 1000 %s/a/checkpoint-1/transformer/diffusion_pytorch_model.safetensors", dir) == 0);
    st = test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml %s --checkpoint %s/a/checkpoint-1 --out %s/e", bin, base,
                  dir, dir);
    CHECK_MSG(st == 1 && strstr(out, "rollout worker 0") && strstr(out, "diffusion_pytorch_model.safetensors"), "got: %s", out);
}
