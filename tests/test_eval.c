/* tests/test_eval.c — `vgrpo eval` end to end (cli/cmd_eval.c, rollout/worker.c, rollout/pipeline.c, reward server
 * and client) on the tiny pipeline:
 *   - the files it writes, its statistics recomputed from the per-sample rewards, and one sample regenerated in this
 *     process (rollout_pipeline + the scorer): same video bytes (xxh64) and the same reward;
 *   - 1 worker with 4 samples per forward vs 2 workers with 1 sample per forward: identical rewards and video bytes
 *     per uid (a sample does not depend on its worker, batch or batch mates);
 *   - an external reward server killed (SIGKILL) and restarted mid-eval: exactly one reward per uid, equal to an
 *     uninterrupted run's;
 *   - the Python reward peer (reward/examples/score_server.py) as the external server: its mean_red equals the red
 *     mean recomputed here from the regenerated video;
 *   - bad input: a missing model folder and an unknown scorer are refused before any process starts. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/recipe.h"
#include "core/wire_rollout.h"
#include "reward/scorers.h"
#include "rollout/pipeline.h"
#include "media/video.h"
#include "tests/test.h"

/* A tiny pipeline and a prompt file in dir; fills the --set arguments every eval here uses. */
static void setup(const char *dir, char *sets, size_t cap, int samples) {
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", test_vgrpo_bin(), dir) == 0);
    char p[600];
    snprintf(p, sizeof p, "%s/prompts.txt", dir);
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fputs("a red ball\n# a comment\na green tree\nblue water\n", f);
    fclose(f);
    snprintf(sets, cap,
             "--set model.path=%s/model --set data.prompt_file=%s --set data.eval_prompt_file=%s "
             "--set data.eval_samples_per_prompt=%d --set rollout.num_steps=4 --set logging.run_dir=%s/run",
             dir, p, p, samples, dir);
}

static json_t *load_eval(const char *out) {
    char p[700];
    snprintf(p, sizeof p, "%s/eval.json", out);
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    if (!j) test_fail(__FILE__, __LINE__, "%s: %s", p, e.text);
    return j;
}

static const json_t *sample_of(const json_t *ev, int uid, int K) {
    const json_t *pr = json_array_get(json_object_get(ev, "prompts"), (size_t)(uid / K));
    return json_array_get(json_object_get(pr, "samples"), (size_t)(uid % K));
}

/* Every uid's total, color_match and video hash equal in two eval.json files. */
static int same_results(const json_t *a, const json_t *b, int n, int K) {
    int same = 1;
    for (int u = 0; u < n; u++) {
        const json_t *x = sample_of(a, u, K), *y = sample_of(b, u, K);
        if (!x || !y) return 0;
        same &= json_integer_value(json_object_get(x, "uid")) == u && json_integer_value(json_object_get(y, "uid")) == u;
        same &= json_real_value(json_object_get(x, "total")) == json_real_value(json_object_get(y, "total"));
        same &= !strcmp(json_string_value(json_object_get(x, "video_xxh64")), json_string_value(json_object_get(y, "video_xxh64")));
    }
    return same;
}

/* Regenerates eval sample uid of the recipe at `recipe` + sets in this process: its video (caller frees). */
static uint8_t *regenerate(const char *dir, int uid, int K, const char *prompt, rollout_pipeline *p, core_recipe *r) {
    char m[600], pf[600], ks[64];
    snprintf(m, sizeof m, "model.path=%s/model", dir);
    snprintf(pf, sizeof pf, "data.prompt_file=%s/prompts.txt", dir);
    snprintf(ks, sizeof ks, "data.eval_samples_per_prompt=%d", K);
    const char *sets[4] = {m, pf, ks, "rollout.num_steps=4"};
    REQUIRE_OK(core_recipe_load(r, "recipes/tiny-cpu.yaml", sets, 4));
    REQUIRE_OK(rollout_pipeline_load(p, r, NULL));
    const float *cond;
    REQUIRE_OK(rollout_pipeline_embed(p, prompt, &cond));
    rollout_config rc = p->rc;
    rc.stream = CORE_STREAM_EVAL_NOISE;
    rc.eta = r->eval_eta;
    uint64_t u = (uint64_t)uid;
    int64_t pi = uid / K;
    core_traj t;
    REQUIRE_OK(rollout_generate(&rc, &p->experts, NULL, 1, &cond, &u, &pi, &t));
    uint8_t *v = malloc((size_t)rollout_pipeline_video_bytes(p));
    REQUIRE(v);
    REQUIRE_OK(rollout_pipeline_decode(p, &t, v));
    core_traj_free(&t);
    return v;
}

TEST(eval_tiny_files_stats_and_inprocess_parity) {
    const char *dir = test_tmpdir();
    char sets[2048], out[700], log[8192];
    setup(dir, sets, sizeof sets, 2);
    snprintf(out, sizeof out, "%s/ev", dir);
    int st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --set rollout.batch_size=4 --out %s",
                      test_vgrpo_bin(), sets, out);
    if (st) test_fail(__FILE__, __LINE__, "eval failed: %s", log);
    CHECK(strstr(log, "color_match") && strstr(log, "samples/s"));
    json_t *ev = load_eval(out);
    REQUIRE(ev);
    const json_t *prompts = json_object_get(ev, "prompts");
    REQUIRE(json_array_size(prompts) == 3);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(prompts, 1), "prompt")), "a green tree"));
    double sum = 0, mn = 1e9, mx = -1e9;
    for (int u = 0; u < 6; u++) {
        const json_t *s = sample_of(ev, u, 2);
        REQUIRE(s);
        const double t = json_real_value(json_object_get(s, "total"));
        CHECK(json_integer_value(json_object_get(s, "uid")) == u);
        CHECK(t == json_real_value(json_object_get(json_object_get(s, "rewards"), "color_match")));
        sum += t, mn = t < mn ? t : mn, mx = t > mx ? t : mx;
        char vp[800];
        snprintf(vp, sizeof vp, "%s/%s", out, json_string_value(json_object_get(s, "video")));
        core_tensor vid;
        double fps;
        REQUIRE_OK(media_video_read(vp, 0, &vid, &fps));
        CHECK(vid.shape[0] == 5 && vid.shape[1] == 32 && vid.shape[2] == 32 && fps == 16.0);
        core_tensor_free(&vid);
    }
    const json_t *cm = json_object_get(json_object_get(ev, "stats"), "color_match");
    CHECK(json_integer_value(json_object_get(cm, "n")) == 6);
    CHECK_NEAR(json_real_value(json_object_get(cm, "mean")), sum / 6, 1e-6);
    CHECK_NEAR(json_real_value(json_object_get(cm, "min")), mn, 1e-7);
    CHECK_NEAR(json_real_value(json_object_get(cm, "max")), mx, 1e-7);
    char png[800];
    struct stat sb;
    snprintf(png, sizeof png, "%s/sheets/p0002.png", out);
    CHECK(stat(png, &sb) == 0 && sb.st_size > 100);

    /* uid 3 = prompt 1 ("a green tree"), sample 1, regenerated here. */
    rollout_pipeline p;
    core_recipe r;
    uint8_t *v = regenerate(dir, 3, 2, "a green tree", &p, &r);
    char hx[17];
    core_hash_hex(core_xxh64(v, (size_t)rollout_pipeline_video_bytes(&p), 0), hx);
    const json_t *s3 = sample_of(ev, 3, 2);
    CHECK(!strcmp(hx, json_string_value(json_object_get(s3, "video_xxh64"))));
    reward_video rv = {.data = v, .frames = p.dec.frames, .height = p.dec.height, .width = p.dec.width};
    double want;
    REQUIRE_OK(reward_color_match(&rv, "a green tree", NULL, &want));
    CHECK((float)want == (float)json_real_value(json_object_get(s3, "total")));
    free(v);
    rollout_pipeline_free(&p);
    core_recipe_release(&r);
    json_decref(ev);
}

TEST(eval_one_vs_two_workers_identical) {
    const char *dir = test_tmpdir();
    char sets[2048], log[8192];
    setup(dir, sets, sizeof sets, 3);
    int st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --set rollout.batch_size=4 --workers 1 --out %s/w1",
                      test_vgrpo_bin(), sets, dir);
    if (st) test_fail(__FILE__, __LINE__, "eval 1 worker failed: %s", log);
    st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --set rollout.batch_size=1 --workers 2 --out %s/w2",
                  test_vgrpo_bin(), sets, dir);
    if (st) test_fail(__FILE__, __LINE__, "eval 2 workers failed: %s", log);
    CHECK(strstr(log, "2 worker(s)") != NULL);
    char o1[700], o2[700];
    snprintf(o1, sizeof o1, "%s/w1", dir);
    snprintf(o2, sizeof o2, "%s/w2", dir);
    json_t *a = load_eval(o1), *b = load_eval(o2);
    REQUIRE(a && b);
    CHECK(same_results(a, b, 9, 3));
    const json_t *sa = json_object_get(a, "stats"), *sb = json_object_get(b, "stats");
    CHECK(json_equal(json_object_get(sa, "color_match"), json_object_get(sb, "color_match")));
    json_decref(a);
    json_decref(b);
}

static pid_t spawn_server(const char *endpoint, const char *logpath, int append) {
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(logpath, append ? "a" : "w", stderr);
        (void)f;
        execl(test_vgrpo_bin(), test_vgrpo_bin(), "reward-server", "--bind", endpoint, "--scorers", "color_match:1",
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int count_files(const char *dir) {
    char out[64];
    if (test_run(out, sizeof out, "ls %s 2>/dev/null | wc -l", dir)) return 0;
    return atoi(out);
}

TEST(eval_survives_reward_server_restart) {
    const char *dir = test_tmpdir();
    char sets[2048], log[8192], sock[64] = "/tmp/vgrpo-t-XXXXXX", ep[128], slog[700], out[700], cmd[4096];
    setup(dir, sets, sizeof sets, 6);
    REQUIRE(mkdtemp(sock));
    snprintf(ep, sizeof ep, "ipc://%s/r", sock);
    snprintf(slog, sizeof slog, "%s/server.log", dir);
    /* Uninterrupted reference (its own server). */
    int st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --set rollout.batch_size=1 --out %s/ref",
                      test_vgrpo_bin(), sets, dir);
    if (st) test_fail(__FILE__, __LINE__, "reference eval failed: %s", log);
    /* The interrupted one, against an external server. */
    pid_t srv = spawn_server(ep, slog, 0);
    snprintf(out, sizeof out, "%s/ext", dir);
    snprintf(cmd, sizeof cmd, "%s eval recipes/tiny-cpu.yaml %s --set rollout.batch_size=1 --set reward.endpoint=%s "
             "--set reward.timeout_s=0.5 --out %s > %s/ext.log 2>&1", test_vgrpo_bin(), sets, ep, out, dir);
    pid_t ev = fork();
    if (ev == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char vdir[800];
    snprintf(vdir, sizeof vdir, "%s/videos", out);
    for (int i = 0; i < 3000 && count_files(vdir) < 3; i++) usleep(5000);
    int status, running = waitpid(ev, &status, WNOHANG) == 0;
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    const int before = count_files(vdir);
    usleep(1200000); /* no server for 1.2 s: requests time out (0.5 s) and are re-sent */
    srv = spawn_server(ep, slog, 1);
    REQUIRE(waitpid(ev, &status, 0) == ev);
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    CHECK(running);             /* the server really died mid-eval */
    CHECK(before < 18);         /* ... with samples still to score */
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char rp[700];
    snprintf(rp, sizeof rp, "%s/ref", dir);
    json_t *a = load_eval(rp), *b = load_eval(out);
    REQUIRE(a && b);
    CHECK(json_integer_value(json_object_get(json_object_get(json_object_get(b, "stats"), "total"), "n")) == 18);
    CHECK(same_results(a, b, 18, 6));
    json_decref(a);
    json_decref(b);
    char p2[128];
    snprintf(p2, sizeof p2, "%s/r", sock);
    unlink(p2);
    rmdir(sock);
}

TEST(eval_python_reward_peer) {
    if (test_run(NULL, 0, "/usr/bin/python3 -c 'import zmq, numpy' >/dev/null 2>&1")) {
        test_skip("no /usr/bin/python3 with zmq and numpy");
        return;
    }
    const char *dir = test_tmpdir();
    char sets[2048], log[8192], sock[64] = "/tmp/vgrpo-py-XXXXXX", ep[128], out[700];
    setup(dir, sets, sizeof sets, 2);
    REQUIRE(mkdtemp(sock));
    snprintf(ep, sizeof ep, "ipc://%s/py", sock);
    pid_t py = fork();
    if (py == 0) {
        char lp[700];
        snprintf(lp, sizeof lp, "%s/py.log", dir);
        FILE *f = freopen(lp, "w", stderr);
        (void)f;
        execl("/usr/bin/python3", "python3", "reward/examples/score_server.py", "--bind", ep, "--scorers", "mean_red:1",
              (char *)NULL);
        _exit(127);
    }
    snprintf(out, sizeof out, "%s/ev", dir);
    int st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --set reward.endpoint=%s --set "
                      "reward.scorers=[mean_red] --out %s", test_vgrpo_bin(), sets, ep, out);
    kill(py, SIGTERM);
    waitpid(py, NULL, 0);
    if (st) test_fail(__FILE__, __LINE__, "eval against the Python peer failed: %s", log);
    json_t *ev = load_eval(out);
    REQUIRE(ev);
    rollout_pipeline p;
    core_recipe r;
    uint8_t *v = regenerate(dir, 4, 2, "blue water", &p, &r);
    const int64_t nb = rollout_pipeline_video_bytes(&p);
    double red = 0;
    for (int64_t i = 0; i < nb; i += 3) red += v[i];
    red /= (double)(nb / 3) * 255.0;
    const json_t *s4 = sample_of(ev, 4, 2);
    CHECK_NEAR(json_real_value(json_object_get(json_object_get(s4, "rewards"), "mean_red")), red, 1e-6);
    CHECK(json_real_value(json_object_get(s4, "total")) > 0);
    free(v);
    rollout_pipeline_free(&p);
    core_recipe_release(&r);
    json_decref(ev);
    char p2[128];
    snprintf(p2, sizeof p2, "%s/py", sock);
    unlink(p2);
    rmdir(sock);
}

TEST(eval_bad_input_refused) {
    const char *dir = test_tmpdir();
    char sets[2048], log[8192];
    setup(dir, sets, sizeof sets, 2);
    int st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --set model.path=%s/nope --set model.init_preset= --out %s/e1",
                      test_vgrpo_bin(), sets, dir, dir);
    CHECK(st == 1 && strstr(log, "model.path") && strstr(log, "nope/transformer"));
    st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --set reward.scorers=[color_match,nosuch] --set reward.weights=[1,1] --out %s/e2",
                  test_vgrpo_bin(), sets, dir);
    CHECK(st == 1 && strstr(log, "nosuch"));
    st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --prompts %s/none.json --out %s/e3",
                  test_vgrpo_bin(), sets, dir, dir);
    CHECK(st == 1 && strstr(log, "none.json"));
    char jp[700];
    snprintf(jp, sizeof jp, "%s/p.json", dir);
    FILE *f = fopen(jp, "w");
    REQUIRE(f);
    fputs("[{\"prompt_en\": \"a car\", \"color_en\": \"purple\"}, {\"color_en\": \"red\"}]", f);
    fclose(f);
    st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --prompts %s --out %s/e4", test_vgrpo_bin(), sets,
                  jp, dir);
    CHECK(st == 1 && strstr(log, "prompt 2:") && strstr(log, "prompt_en"));
    st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --workers 0", test_vgrpo_bin(), sets);
    CHECK(st == 2 && strstr(log, "--workers"));
}

/* VBench-style JSON prompts: color_en becomes the scorer's colour (the prompt itself names none). */
TEST(eval_vbench_json_prompts) {
    const char *dir = test_tmpdir();
    char sets[2048], log[8192], jp[700], out[700];
    setup(dir, sets, sizeof sets, 1);
    snprintf(jp, sizeof jp, "%s/p.json", dir);
    FILE *f = fopen(jp, "w");
    REQUIRE(f);
    fputs("[{\"prompt_en\": \"a car\", \"color_en\": \"purple\", \"dimension\": [\"color\"]},\n"
          " {\"prompt_en\": \"a tree\", \"color_en\": \"green\"}]", f);
    fclose(f);
    snprintf(out, sizeof out, "%s/ev", dir);
    int st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --prompts %s --out %s", test_vgrpo_bin(), sets,
                      jp, out);
    if (st) test_fail(__FILE__, __LINE__, "eval failed: %s", log);
    json_t *ev = load_eval(out);
    REQUIRE(ev);
    const json_t *p0 = json_array_get(json_object_get(ev, "prompts"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(p0, "metadata"), "color")), "purple"));
    CHECK(json_object_get(json_object_get(p0, "metadata"), "dimension") == NULL);
    json_decref(ev);
    /* Without metadata "a car" names no colour: color_match refuses it at start-up. */
    f = fopen(jp, "w");
    fputs("[{\"prompt_en\": \"a car\"}]", f);
    fclose(f);
    st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --prompts %s --out %s", test_vgrpo_bin(), sets, jp, out);
    CHECK(st == 1 && strstr(log, "color_match") && strstr(log, "prompt 1"));
}

/* model.init_preset: on a fresh checkout the tiny recipe's model folder does not exist; eval writes the preset there
 * first (the same files as `vgrpo init-model --preset tiny --seed 0`) and runs. */
TEST(eval_init_preset_fresh_model) {
    const char *dir = test_tmpdir();
    char log[8192];
    int st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml --set model.path=%s/fresh/model "
                      "--set data.eval_samples_per_prompt=1 --set rollout.num_steps=2 --out %s/ev", test_vgrpo_bin(), dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "eval: %s", log);
    CHECK(strstr(log, "writing the tiny preset") != NULL);
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/ref --seed 0 >/dev/null", test_vgrpo_bin(), dir) == 0);
    CHECK(test_run(NULL, 0, "cmp -s %s/fresh/model/transformer/diffusion_pytorch_model.safetensors "
                   "%s/ref/transformer/diffusion_pytorch_model.safetensors", dir, dir) == 0);
    char p[700];
    snprintf(p, sizeof p, "%s/ev/eval.json", dir);
    FILE *f = fopen(p, "r");
    CHECK(f != NULL);
    if (f) fclose(f);
}

/* The real VBench colour suite (VBench's colour dimension as a JSON list of {"prompt_en", "color_en", ...}, Apache-2.0,
 * not part of this repository), when VGRPO_VBENCH_COLOR names its file: every prompt is evaluated once with its
 * color_en as the scorer's colour. */
TEST(eval_vbench_color_suite) {
    const char *suite = getenv("VGRPO_VBENCH_COLOR");
    FILE *f = suite && *suite ? fopen(suite, "r") : NULL;
    if (!f) {
        test_skip("VGRPO_VBENCH_COLOR does not name VBench's colour suite (a JSON file)");
        return;
    }
    fclose(f);
    const char *dir = test_tmpdir();
    char sets[2048], log[8192], out[700];
    setup(dir, sets, sizeof sets, 1);
    snprintf(out, sizeof out, "%s/ev", dir);
    int st = test_run(log, sizeof log, "%s eval recipes/tiny-cpu.yaml %s --set rollout.num_steps=2 --prompts %s --out %s",
                      test_vgrpo_bin(), sets, suite, out);
    if (st) test_fail(__FILE__, __LINE__, "eval: %s", log);
    json_t *ev = load_eval(out), *src = json_load_file(suite, 0, NULL);
    REQUIRE(ev && src);
    const json_t *prompts = json_object_get(ev, "prompts");
    CHECK(json_array_size(prompts) == json_array_size(src) && json_array_size(src) > 0);
    for (size_t i = 0; i < json_array_size(prompts); i++) {
        const json_t *p = json_array_get(prompts, i), *s = json_array_get(src, i);
        CHECK(!strcmp(json_string_value(json_object_get(p, "prompt")), json_string_value(json_object_get(s, "prompt_en"))));
        CHECK(!strcmp(json_string_value(json_object_get(json_object_get(p, "metadata"), "color")),
                      json_string_value(json_object_get(s, "color_en"))));
    }
    CHECK(json_integer_value(json_object_get(json_object_get(json_object_get(ev, "stats"), "color_match"), "n")) ==
          (json_int_t)json_array_size(src));
    json_decref(ev), json_decref(src);
}
