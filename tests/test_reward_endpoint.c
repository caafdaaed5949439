/* tests/test_reward_endpoint.c — training against an external reward server with its own scorers (reward.endpoint;
 * trainer/run/scorers.c, core/recipe.c): the Python example server (reward/examples/score_server.py, scorer mean_red)
 * behind `vgrpo run` in colocated mode on the tiny preset (a few seconds):
 *   - the recipe may name the server's scorers ([mean_red], unknown to the built-in list) or leave them out; the run
 *     learns: eval mean_red after 8 steps exceeds step 0's by > 3 standard errors of the difference;
 *   - a recipe list that differs (another name, another weight) is refused, naming both lists; weights without names;
 *   - `vgrpo parity` runs the same recipe;
 *   - a server whose list has color_match (not named by the recipe): a prompt without a colour is refused at the
 *     start, naming the prompt's file:line and the server's list;
 *   - --dry-run accepts what the run accepts; without reward.endpoint an unknown scorer is still refused;
 *   - reward_client_scorers: the C server's hello lists its scorers and weights in order;
 *   - a server reward past the F32 range (1e40 x mean_red) is reported with its value, not as "inf is not finite".
 * Skipped when /usr/bin/python3 lacks zmq or numpy. */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "core/recipe.h"
#include "reward/client.h"
#include "tests/metrics_rows.h"
#include "tests/reward_thread_util.h"
#include "tests/test.h"

static int have_python(void) {
    if (test_run(NULL, 0, "/usr/bin/python3 -c 'import zmq, numpy' >/dev/null 2>&1") == 0) return 1;
    test_skip("no /usr/bin/python3 with zmq and numpy");
    return 0;
}

/* The Python server on ipc://dir/NAME.sock with `scorers`; its pid. */
static pid_t py_start(const char *dir, const char *name, const char *scorers, char *ep, size_t cap) {
    snprintf(ep, cap, "ipc://%s/%s.sock", dir, name);
    pid_t pid = fork();
    if (pid == 0) {
        char lp[700];
        snprintf(lp, sizeof lp, "%s/%s.log", dir, name);
        FILE *f = freopen(lp, "w", stderr);
        (void)f;
        execl("/usr/bin/python3", "python3", "reward/examples/score_server.py", "--bind", ep, "--scorers", scorers,
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void py_stop(pid_t pid) {
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* A tiny model and a 3-prompt file in dir; the common --set arguments into sets. */
static void setup(const char *dir, char *sets, size_t cap) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null && "
                                      "printf 'a red kite\\na green frog\\na blue boat\\n' > %s/prompts.txt",
                     test_vgrpo_bin(), dir, dir) == 0);
    snprintf(sets, cap,
             "--set mode=colocated --set model.path=%s/model --set data.prompt_file=%s/prompts.txt "
             "--set data.eval_prompt_file=%s/prompts.txt --set rollout.num_steps=4 --set rollout.prompts_per_step=2 "
             "--set rollout.samples_per_prompt=4 --set data.eval_samples_per_prompt=8 --set logging.eval_every=8",
             dir, dir, dir);
}

static double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* eval/mean_red rises over 8 steps of run `name` (both rows carry the server's scorer name). */
static void check_learns(const char *dir, const char *name) {
    char path[700];
    json_t *rows[16];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, name);
    const int n = read_rows(path, rows, 16, 0);
    CHECK_MSG(n == 9, "%s: %d metrics rows (8 steps + the final eval)", name, n);
    if (n < 2) return;
    const double m0 = num(rows[0], "eval/mean_red/mean"), s0 = num(rows[0], "eval/mean_red/se");
    const double m1 = num(rows[n - 1], "eval/mean_red/mean"), s1 = num(rows[n - 1], "eval/mean_red/se");
    const double z = (m1 - m0) / sqrt(s0 * s0 + s1 * s1);
    fprintf(stderr, "  %s: eval mean_red %.4f +- %.4f -> %.4f +- %.4f (%.1f standard errors)\n", name, m0, s0, m1, s1, z);
    CHECK_MSG(z > 3, "%s: mean_red did not rise: %g -> %g", name, m0, m1);
    CHECK(isfinite(num(rows[0], "reward/mean_red/mean")) && !json_object_get(rows[0], "reward/color_match/mean"));
    CHECK(num(rows[0], "reward/mean_red/mean") == num(rows[0], "reward/mean"));
    for (int i = 0; i < n; i++) json_decref(rows[i]);
}

TEST(reward_endpoint_recipe_scorers) {
    core_recipe r;
    const char *none[] = {"reward.scorers=[]"};
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", none, 1)); /* without an endpoint: the default */
    CHECK(r.scorers.n == 1 && !strcmp(r.scorers.v[0], "color_match") && r.weights.n == 1 && r.weights.v[0] == 1.0);
    core_recipe_release(&r);
    const char *ext[] = {"reward.endpoint=ipc:///tmp/x", "reward.scorers=[]", "reward.weights=[]"};
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", ext, 3)); /* the server's list, asked at the start */
    CHECK(r.scorers.n == 0 && r.weights.n == 0 && !r.weights_given);
    core_recipe_release(&r);
    const char *w_only[] = {"reward.endpoint=ipc:///tmp/x", "reward.scorers=[]", "reward.weights=[2]"};
    CHECK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", w_only, 3) != 0);
    CHECK_MSG(strstr(core_last_error(), "reward.weights: 1 weights, but reward.scorers names none"), "got: %s",
              core_last_error());
    const char *named[] = {"reward.endpoint=ipc:///tmp/x", "reward.scorers=[mean_red]"};
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", named, 2)); /* tiny-cpu.yaml gives weights: [1.0] */
    CHECK(r.scorers.n == 1 && r.weights_given);
    core_recipe_release(&r);
}

TEST(reward_endpoint_dry_run) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char sets[2048], out[16384];
    setup(dir, sets, sizeof sets);
    /* an external server's scorer names are its own: accepted (no server needs to be up for a dry run) */
    int rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/d --set "
                      "reward.endpoint=ipc://%s/none.sock --set 'reward.scorers=[mean_red]' --dry-run", bin, sets, dir, dir);
    CHECK_MSG(rc == 0 && strstr(out, "mean_red") && strstr(out, "resolved (dry run; valid)") &&
                  strstr(out, "the run asks it at the start"),
              "rc %d: %s", rc, out);
    /* the built-in list still applies to the reward server the run starts */
    rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/d --set "
                  "'reward.scorers=[mean_red]' --dry-run", bin, sets, dir);
    CHECK_MSG(rc == 1 && strstr(out, "reward.scorers.0: unknown reward scorer 'mean_red'"), "rc %d: %s", rc, out);
}

TEST(reward_endpoint_run_learns) {
    if (!have_python()) return;
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char sets[2048], out[1 << 15], ep[700];
    setup(dir, sets, sizeof sets);
    const pid_t py = py_start(dir, "py", "mean_red:1", ep, sizeof ep);
    /* 1. the recipe names the server's scorer */
    int rc = test_run(out, sizeof out, "env OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/named "
                      "--set reward.endpoint=%s --set 'reward.scorers=[mean_red]' --steps 8", bin, sets, dir, ep);
    CHECK_MSG(rc == 0 && strstr(out, "scorers [mean_red:1] (its hello reply; the recipe's list matches)"), "rc %d: %s",
              rc, out);
    if (rc == 0) check_learns(dir, "named");
    /* 2. the recipe leaves them out */
    rc = test_run(out, sizeof out, "env OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/unnamed "
                  "--set reward.endpoint=%s --set 'reward.scorers=[]' --set 'reward.weights=[]' --steps 8", bin, sets,
                  dir, ep);
    CHECK_MSG(rc == 0 && strstr(out, "(its hello reply; the recipe lists none)"), "rc %d: %s", rc, out);
    if (rc == 0) check_learns(dir, "unnamed");
    /* 3. a list that differs is refused with both lists: another name (tiny-cpu.yaml's color_match), another weight */
    rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/other --set reward.endpoint=%s "
                  "--steps 1", bin, sets, dir, ep);
    CHECK_MSG(rc == 1 && strstr(out, "scores [mean_red:1], the recipe lists [color_match:1] with reward.weights (they "
                                     "must match, in order"), "rc %d: %s", rc, out);
    rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/other --set reward.endpoint=%s "
                  "--set 'reward.scorers=[mean_red]' --set 'reward.weights=[0.5]' --steps 1", bin, sets, dir, ep);
    CHECK_MSG(rc == 1 && strstr(out, "scores [mean_red:1], the recipe lists [mean_red:0.5]"), "rc %d: %s", rc, out);
    /* 4. parity accepts the same recipe (its rollout is scored by the same server) */
    rc = test_run(out, sizeof out, "%s parity recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/parity --set "
                  "reward.endpoint=%s --set 'reward.scorers=[mean_red]'", bin, sets, dir, ep);
    CHECK_MSG(rc == 0 && strstr(out, "PASS"), "rc %d: %s", rc, out);
    py_stop(py);
}

TEST(reward_endpoint_value_past_f32) {
    if (!have_python()) return;
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char sets[2048], out[1 << 15], ep[700];
    setup(dir, sets, sizeof sets);
    /* total = 1e40 x mean_red (a finite double, > FLT_MAX): a float cast would make it inf */
    const pid_t py = py_start(dir, "big", "mean_red:1e40", ep, sizeof ep);
    int rc = test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/ev --set "
                      "data.eval_samples_per_prompt=1 --set reward.endpoint=%s --set 'reward.scorers=[mean_red]' --out %s/ev",
                      bin, sets, dir, ep, dir);
    py_stop(py);
    CHECK_MSG(rc == 1 && strstr(out, "the weighted total = ") && strstr(out, "e+39 for sample ") &&
                  strstr(out, "is outside the F32 range of a trajectory") && !strstr(out, "inf is not finite"),
              "rc %d: %s", rc, out);
}

TEST(reward_endpoint_client_scorers) {
    rsrv s;
    char ep[700];
    snprintf(ep, sizeof ep, "ipc://%s/c.sock", test_tmpdir());
    rsrv_start(&s, ep, "brightness:0.5,flicker:2", 1, 0);
    reward_client *c = reward_client_open(ep, "trainer", 5.0, 3);
    REQUIRE(c);
    reward_result got;
    const int rc = reward_client_scorers(c, &got);
    CHECK_MSG(rc == 0, "%s", core_last_error());
    CHECK(rc == 0 && got.n_scores == 2 && !strcmp(got.scores[0].name, "brightness") && got.scores[0].weight == 0.5 &&
          !strcmp(got.scores[1].name, "flicker") && got.scores[1].weight == 2.0);
    reward_client_close(c);
    rsrv_stop(&s);
    /* nobody there: the attempts' error names the endpoint */
    c = reward_client_open(ep, "trainer", 0.2, 2);
    REQUIRE(c);
    CHECK(reward_client_scorers(c, &got) != 0);
    CHECK_MSG(strstr(core_last_error(), "no hello reply after 2 attempts"), "got: %s", core_last_error());
    reward_client_close(c);
}

TEST(reward_endpoint_server_color_match_checks_prompts) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char sets[2048], out[1 << 15], ep[700], pf[700];
    setup(dir, sets, sizeof sets);
    snprintf(pf, sizeof pf, "%s/nocolour.txt", dir);
    FILE *f = fopen(pf, "w");
    REQUIRE(f);
    fputs("a red kite\na frog\n", f);
    fclose(f);
    snprintf(ep, sizeof ep, "ipc://%s/c.sock", dir);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *e = freopen("/dev/null", "w", stderr);
        (void)e;
        execl(bin, bin, "reward-server", "--bind", ep, "--scorers", "color_match:1", (char *)NULL);
        _exit(127);
    }
    int rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --set logging.run_dir=%s/cm --set reward.endpoint=%s "
                      "--set 'reward.scorers=[]' --set 'reward.weights=[]' --set data.prompt_file=%s --steps 1", bin,
                      sets, dir, ep, pf);
    py_stop(pid);
    CHECK_MSG(rc == 1 && strstr(out, "the reward server at ") && strstr(out, "scores [color_match:1]: ") &&
                  strstr(out, "nocolour.txt:2") && strstr(out, "(color_match)"),
              "rc %d: %s", rc, out);
}
