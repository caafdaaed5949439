/* tests/test_colocated.c — end-to-end `vgrpo run` with mode: colocated (cli/colocated.c: the supervisor starts
 * `vgrpo reward-server`, parallel.rollout_workers `vgrpo rollout-worker` processes and `vgrpo trainer`, through
 * mpirun when parallel.trainer_ranks > 1; docs/design.md sections 3, 4 and 7). Tiny preset (umT5 + VAE), 3 prompts,
 * B = 2, G = 4, 4 denoising steps, beta > 0, 1 eval sample per prompt, checkpoints every step.
 * Checks:
 *   - colocated == local bit for bit: metrics rows (time/ and weight_sync/ removed) and checkpoint files
 *     (weights, Adam m/v); weight_sync/hash_match is 1 in every colocated row;
 *   - 1 vs 2 rollout workers (chunks of 2 samples spread over them): same rows, eval rewards and weights;
 *   - 2 and 3 trainer ranks (mpirun; 3 is oversubscribed on a 2-core machine) vs 1: same step-0 rewards and eval,
 *     on-policy log_prob_mean_abs_diff exactly 0 at every step, final weights within a relative L2 of
 *     MULTI_RANK_REL_L2 (the all-reduce sums the gradient in another fp32 order);
 *   - (lost workers, the reward server and trainer ranks killed mid-run: tests/test_lost_worker.c)
 *   - exact resume: 2 steps + --resume + 2 steps equals 4 straight steps (checkpoint files, metrics rows);
 *   - SIGTERM to `vgrpo run`, and SIGINT to its process group (a terminal's Ctrl-C), with 1 and 2 trainer ranks:
 *     the trainer finishes its step and saves a checkpoint, everything stops (no process of the run left, socket
 *     folder removed), exit status 1;
 *   - refusals naming the key: a missing model.path, parallel.rollout_workers 0, parallel.trainer_ranks above the
 *     B x G samples of a step.
 * Every test kills any process of its run left behind (pattern: its own test folder) before it ends. Each runs in
 * ~2-7 s on 2 cores. */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/safetensors.h"
#include "tests/metrics_rows.h"
#include "tests/ckpt_cmp.h"
#include "tests/test.h"
#include "trainer/checkpoint/checkpoint.h"

/* Bound on ||w_Nranks - w_1rank|| / ||w_1rank|| over every transformer weight after 2 steps, N = 2, 3 (measured
 * 8.1e-8 for 2 ranks, see the test's stderr lines; fp32 summation order of the gradient all-reduce only). */
#define MULTI_RANK_REL_L2 1e-6

/* metrics.jsonl rows without time/ fields and weight_sync/seconds (and every weight_sync/ field when drop_sync,
 * for a comparison with a local run, which has none); returns the count, -1 when the file is missing. */

static void free_rows(json_t **rows, int n) {
    for (int i = 0; i < n; i++) json_decref(rows[i]);
}

static double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Kills (SIGKILL) every process whose command line names dir (the run's folder, model and recipe paths), and
 * returns how many there were. */
static int reap(const char *dir) {
    char out[4096];
    test_run(out, sizeof out, "pgrep -f '[v]grpo .*%s/' | wc -l; pkill -KILL -f '[v]grpo .*%s/'; true", dir, dir);
    return atoi(out);
}

/* This test's folder: test_tmpdir() + ".<pid>", so that two runs of the suite at once (several build folders share
 * build/test-tmp) neither delete each other's files nor match each other's processes. rm_tmpdir removes it. */
static const char *tmpdir(void) {
    static char path[600];
    char out[1024];
    snprintf(path, sizeof path, "%s.%d", test_tmpdir(), (int)getpid());
    if (test_run(out, sizeof out, "rm -rf %s && mkdir -p %s", path, path)) test_fail(__FILE__, __LINE__, "cannot create %s", path);
    return path;
}

static void rm_tmpdir(const char *dir) {
    char out[1024];
    test_run(out, sizeof out, "rm -rf %s", dir);
}

/* A tiny model in dir/model and a 3-prompt file dir/prompts.txt. */
static void make_inputs(const char *dir) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 2 && "
                                      "printf 'a red kite\\na green frog\\na blue boat\\n' > %s/prompts.txt",
                     test_vgrpo_bin(), dir, dir) == 0);
}

#define SMALL                                                                                                     \
    "--set rollout.num_steps=4 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 "              \
    "--set data.eval_samples_per_prompt=1 --set logging.eval_every=2 --set algorithm.beta=0.05 "                  \
    "--set checkpoint.every=1 --set checkpoint.total_limit=0"

/* The run's command line (without a redirection), mode local or colocated, into dir/<name>. */
static void cmdline(char *buf, size_t cap, const char *dir, const char *name, const char *mode, const char *extra) {
    snprintf(buf, cap,
             "env OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml --set mode=%s --set model.path=%s/model "
             "--set data.prompt_file=%s/prompts.txt --set data.eval_prompt_file=%s/prompts.txt "
             "--set logging.run_dir=%s/%s " SMALL " %s",
             test_vgrpo_bin(), mode, dir, dir, dir, dir, name, extra);
}

static int run(const char *dir, const char *name, const char *mode, const char *extra, char *out, size_t cap) {
    char cmd[4096];
    cmdline(cmd, sizeof cmd, dir, name, mode, extra);
    return test_run(out, cap, "%s", cmd);
}

/* cmp of one file of checkpoint-<step> in two runs: 0 when byte-identical. */
static int cmp_ckpt(const char *dir, const char *a, const char *b, int step, const char *file) {
    char out[1024], fa[1024], fb[1024];
    snprintf(fa, sizeof fa, "%s/%s/checkpoint-%d/%s", dir, a, step, file);
    snprintf(fb, sizeof fb, "%s/%s/checkpoint-%d/%s", dir, b, step, file);
    return ckpt_file_cmp(out, sizeof out, fa, fb);
}

static const char *const CKPT_FILES[] = {"transformer/diffusion_pytorch_model.safetensors", "optimizer.safetensors"};

/* The two runs' metrics rows are equal (n rows each). */
static void check_rows_equal(const char *dir, const char *a, const char *b, int drop_sync, int n_expect) {
    char pa[1024], pb[1024];
    json_t *ra[16], *rb[16];
    snprintf(pa, sizeof pa, "%s/%s/metrics.jsonl", dir, a);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", dir, b);
    int na = read_rows(pa, ra, 16, drop_sync), nb = read_rows(pb, rb, 16, drop_sync);
    CHECK_MSG(na == n_expect && nb == n_expect, "rows: %s %d, %s %d, expected %d", a, na, b, nb, n_expect);
    for (int i = 0; i < na && i < nb; i++) {
        if (json_equal(ra[i], rb[i])) continue;
        char *sa = json_dumps(ra[i], JSON_SORT_KEYS | JSON_COMPACT), *sb = json_dumps(rb[i], JSON_SORT_KEYS | JSON_COMPACT);
        test_fail(__FILE__, __LINE__, "metrics row %d differs between %s and %s:\n  %s\n  %s", i, a, b, sa, sb);
        free(sa), free(sb);
    }
    free_rows(ra, na > 0 ? na : 0), free_rows(rb, nb > 0 ? nb : 0);
}

/* 1. colocated == local, bit for bit */
TEST(colocated_equals_local) {
    const char *dir = tmpdir();
    char out[16384], p[1024];
    make_inputs(dir);
    int rc = run(dir, "local", "local", "--steps 3", out, sizeof out);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    rc = run(dir, "col", "colocated", "--steps 3", out, sizeof out);
    reap(dir);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    CHECK_MSG(strstr(out, "vgrpo run (colocated)") && strstr(out, "1 rollout worker(s), 1 trainer rank(s)") &&
                  strstr(out, "step 2 of 3"),
              "got: %s", out);
    /* every colocated row with a step carries the sync check */
    json_t *rows[16];
    snprintf(p, sizeof p, "%s/col/metrics.jsonl", dir);
    int n = read_rows(p, rows, 16, 0);
    CHECK_MSG(n == 4, "colocated rows: %d", n); /* steps 0..2 + the final eval row */
    for (int i = 0; i < n && i < 3; i++) {
        CHECK_MSG(num(rows[i], "weight_sync/hash_match") == 1, "row %d: weight_sync/hash_match %g", i,
                  num(rows[i], "weight_sync/hash_match"));
        CHECK(num(rows[i], "step") == i && num(rows[i], "log_prob_mean_abs_diff") == 0.0);
    }
    CHECK(n == 4 && isfinite(num(rows[0], "eval/color_match/mean")) && isfinite(num(rows[3], "eval/color_match/mean")));
    free_rows(rows, n > 0 ? n : 0);
    check_rows_equal(dir, "local", "col", 1, 4);
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/local/rewards.jsonl %s/col/rewards.jsonl", dir, dir) == 0,
              "rewards per uid differ: %s", out);
    for (int s = 1; s <= 3; s++)
        for (int f = 0; f < 2; f++)
            CHECK_MSG(cmp_ckpt(dir, "local", "col", s, CKPT_FILES[f]) == 0, "checkpoint-%d/%s differs", s, CKPT_FILES[f]);
    /* the weights did move */
    CHECK(test_run(out, sizeof out, "cmp -s %s/col/checkpoint-1/%s %s/col/checkpoint-3/%s", dir, CKPT_FILES[0], dir,
                   CKPT_FILES[0]) != 0);
    /* each process logged to the run's logs folder */
    CHECK(test_run(out, sizeof out, "test -s %s/col/logs/worker-0.log && test -e %s/col/logs/reward-server.log", dir,
                   dir) == 0);
    CHECK(reap(dir) == 0);
    rm_tmpdir(dir);
}

/* 2. one vs two rollout workers */
TEST(colocated_one_vs_two_workers) {
    const char *dir = tmpdir();
    char out[16384];
    make_inputs(dir);
    int rc = run(dir, "w1", "colocated", "--steps 2 --set rollout.batch_size=2", out, sizeof out);
    reap(dir);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    rc = run(dir, "w2", "colocated", "--steps 2 --set rollout.batch_size=2 --set parallel.rollout_workers=2", out,
             sizeof out);
    reap(dir);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    CHECK_MSG(strstr(out, "2 rollout worker(s)"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "grep -q 'policy version 2 applied' %s/w2/logs/worker-1.log", dir) == 0);
    check_rows_equal(dir, "w1", "w2", 0, 3); /* steps 0, 1 (eval at 0) and the final eval row */
    CHECK_MSG(test_run(out, sizeof out, "test $(wc -l < %s/w2/rewards.jsonl) = 2 && cmp %s/w1/rewards.jsonl "
                                        "%s/w2/rewards.jsonl", dir, dir, dir) == 0,
              "rewards per uid differ: %s", out);
    for (int f = 0; f < 2; f++)
        CHECK_MSG(cmp_ckpt(dir, "w1", "w2", 2, CKPT_FILES[f]) == 0, "checkpoint-2/%s differs", CKPT_FILES[f]);
    CHECK(reap(dir) == 0);
    rm_tmpdir(dir);
}

/* 3. N trainer ranks (mpirun) vs one: run dir/nN and compare it with dir/n1 */
static void check_ranks(const char *dir, int N) {
    char out[16384], pa[1024], pb[1024], name[8], extra[128];
    snprintf(name, sizeof name, "n%d", N);
    snprintf(extra, sizeof extra, "--steps 2 --set parallel.trainer_ranks=%d", N);
    const int rc = run(dir, name, "colocated", extra, out, sizeof out);
    reap(dir);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    snprintf(pa, sizeof pa, "%d trainer rank(s)", N);
    CHECK_MSG(strstr(out, pa) && strstr(out, "step 1 of 2"), "got: %s", out);
    json_t *r1[8], *r2[8];
    snprintf(pa, sizeof pa, "%s/n1/metrics.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", dir, name);
    int n1 = read_rows(pa, r1, 8, 0), n2 = read_rows(pb, r2, 8, 0);
    REQUIRE(n1 == 3 && n2 == 3);
    /* step 0: both roll out with the weights of model.path (version 0) */
    const char *same[] = {"reward/mean", "reward/std", "reward/min", "reward/max", "reward/group_std_mean",
                          "eval/color_match/mean", "eval/color_match/se", "transitions", "masked_fraction"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++)
        CHECK_MSG(num(r1[0], same[k]) == num(r2[0], same[k]), "step 0 %s: 1 rank %.9g, %d ranks %.9g", same[k],
                  num(r1[0], same[k]), N, num(r2[0], same[k]));
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(num(r2[i], "log_prob_mean_abs_diff") == 0.0, "%d ranks step %d: log_prob_mean_abs_diff %g", N, i,
                  num(r2[i], "log_prob_mean_abs_diff"));
        CHECK(num(r2[i], "weight_sync/hash_match") == 1 && num(r2[i], "policy_version") == i);
        CHECK(num(r2[i], "transitions") == num(r1[i], "transitions")); /* counted over all ranks */
        CHECK_NEAR(num(r2[i], "grad_norm"), num(r1[i], "grad_norm"), 1e-4 * num(r1[i], "grad_norm"));
    }
    free_rows(r1, n1), free_rows(r2, n2);
    CHECK_MSG(test_run(out, sizeof out, "test \"$(head -1 %s/n1/rewards.jsonl)\" = \"$(head -1 %s/%s/rewards.jsonl)\"",
                       dir, dir, name) == 0, "%d ranks: step-0 rewards per uid differ", N);
    /* final weights: equal up to the fp32 order of the all-reduce */
    double d2, a2, u2, w2;
    snprintf(pa, sizeof pa, "%s/n1/checkpoint-2/%s", dir, CKPT_FILES[0]);
    snprintf(pb, sizeof pb, "%s/%s/checkpoint-2/%s", dir, name, CKPT_FILES[0]);
    ckpt_l2_diff(pb, pa, &d2, &a2);
    snprintf(pb, sizeof pb, "%s/model/transformer/%s", dir, "diffusion_pytorch_model.safetensors");
    ckpt_l2_diff(pa, pb, &u2, &w2); /* the update of the 1-rank run, for scale */
    const double rel = sqrt(d2 / a2), rel_update = sqrt(d2 / u2);
    fprintf(stderr, "  %d ranks vs 1: relative L2 of the final weights %.3g (of the 2-step update: %.3g)\n", N, rel,
            rel_update);
    CHECK_MSG(rel <= MULTI_RANK_REL_L2, "%d ranks: relative L2 %.3g > %.1g", N, rel, MULTI_RANK_REL_L2);
    CHECK_MSG(rel_update <= 1e-3, "%d ranks: relative to the update: %.3g > 1e-3", N, rel_update);
    CHECK(u2 > 0); /* training moved the weights */
}

/* 2 ranks; 3 ranks: 8 samples split 3/3/2, and more ranks than this machine's 2 cores (--oversubscribe) */
TEST(colocated_trainer_ranks) {
    const char *dir = tmpdir();
    char out[16384];
    make_inputs(dir);
    const int rc = run(dir, "n1", "colocated", "--steps 2", out, sizeof out);
    reap(dir);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    check_ranks(dir, 2);
    check_ranks(dir, 3);
    CHECK(reap(dir) == 0);
    rm_tmpdir(dir);
}

/* 5. exact resume in colocated mode */
TEST(colocated_resume_exact) {
    const char *dir = tmpdir();
    char out[16384], x[1024];
    make_inputs(dir);
    int rc = run(dir, "a", "colocated", "--steps 2", out, sizeof out);
    reap(dir);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    snprintf(x, sizeof x, "--resume %s/a --steps 4", dir);
    rc = run(dir, "a", "colocated", x, out, sizeof out);
    reap(dir);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    CHECK_MSG(strstr(out, "checkpoint-2: step 2") && strstr(out, "step 2 of 4") && !strstr(out, "step 1 of 4"),
              "got: %s", out);
    rc = run(dir, "b", "colocated", "--steps 4", out, sizeof out);
    reap(dir);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    const char *files[] = {CKPT_FILES[0], CKPT_FILES[1], "trainer_state.json", "transformer/config.json"};
    for (int f = 0; f < 4; f++)
        CHECK_MSG(cmp_ckpt(dir, "a", "b", 4, files[f]) == 0, "checkpoint-4/%s differs", files[f]);
    check_rows_equal(dir, "a", "b", 0, 5); /* steps 0..3 + the final eval row */
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/a/rewards.jsonl %s/b/rewards.jsonl", dir, dir) == 0,
              "rewards per uid differ: %s", out);
    CHECK(test_run(out, sizeof out, "cmp -s %s/b/checkpoint-2/%s %s/b/checkpoint-4/%s", dir, CKPT_FILES[0], dir,
                   CKPT_FILES[0]) != 0);
    /* a resume refused after the workers started (the prompt file changed) keeps the logs of the run before it */
    static char before[2][65536], after[2][65536];
    const char *logs[2] = {"worker-0", "reward-server"};
    long nb[2];
    for (int k = 0; k < 2; k++) {
        snprintf(x, sizeof x, "%s/b/logs/%s.log", dir, logs[k]);
        nb[k] = test_slurp(x, before[k], sizeof before[k]);
        CHECK_MSG(nb[k] > 0 && strstr(before[k], "--- started "), "%s: %s", x, before[k]);
    }
    REQUIRE(test_run(out, sizeof out, "printf 'a red kite\\na green frog\\na blue boot\\n' > %s/prompts.txt", dir) == 0);
    snprintf(x, sizeof x, "--resume %s/b --steps 5", dir);
    CHECK(run(dir, "b", "colocated", x, out, sizeof out) == 1);
    reap(dir);
    CHECK_MSG(strstr(out, "prompts.txt changed since the checkpoint"), "got: %s", out);
    for (int k = 0; k < 2; k++) {
        snprintf(x, sizeof x, "%s/b/logs/%s.log", dir, logs[k]);
        const long na = test_slurp(x, after[k], sizeof after[k]);
        CHECK_MSG(nb[k] > 0 && na > nb[k] && !memcmp(before[k], after[k], (size_t)nb[k]) &&
                      strstr(after[k] + nb[k], "--- started "),
                  "%s: %ld bytes before the refused resume, %ld after", x, nb[k], na);
    }
    CHECK(reap(dir) == 0);
    rm_tmpdir(dir);
}

/* 6. stopping the run: SIGTERM to `vgrpo run` (how "term") or SIGINT to its process group, as a terminal's Ctrl-C
 * sends (how "int"): the trainer finishes its step and saves a checkpoint, everything stops, exit status 1. */
static void stop_run(const char *dir, const char *name, const char *extra, const char *how) {
    char out[16384], cmd[4096], x[1024];
    cmdline(cmd, sizeof cmd, dir, name, "colocated", extra);
    snprintf(x, sizeof x, "i=0; while [ ! -s %s/%s/metrics.jsonl ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done",
             dir, name);
    if (!strcmp(how, "term"))
        test_run(out, sizeof out, "%s > %s/%s.log 2>&1 & pid=$!; %s; kill -TERM $pid; wait $pid; echo status=$?; "
                                  "cat %s/%s.log", cmd, dir, name, x, dir, name);
    else /* its own session and process group, as in a terminal */
        test_run(out, sizeof out, "setsid -w sh -c 'echo $$ > %s/%s.pid; exec %s > %s/%s.log 2>&1' & pid=$!; %s; "
                                  "kill -INT -$(cat %s/%s.pid); wait $pid; echo status=$?; cat %s/%s.log",
                 dir, name, cmd, dir, name, x, dir, name, dir, name);
    const int left = reap(dir);
    CHECK_MSG(strstr(out, "status=1") && strstr(out, "stopped by signal 15") && strstr(out, "--resume"),
              "%s (%s): got: %s", name, how, out);
    CHECK_MSG(left == 0, "%s: %d process(es) of the run left after it stopped", name, left);
    /* the reward server's command line does not name the run: find it by the job's socket folder */
    char sock[256] = "";
    REQUIRE(test_run(sock, sizeof sock, "grep -o '/tmp/vgrpo-[A-Za-z0-9]*' %s/%s/logs/worker-0.log | head -1 | "
                                        "tr -d '\\n'", dir, name) == 0);
    REQUIRE(strlen(sock) > 12);
    CHECK_MSG(test_run(out, sizeof out, "pgrep -fa '[v]grpo reward-server .*%s/'", sock) != 0, "left: %s", out);
    struct stat sb;
    CHECK_MSG(stat(sock, &sb) != 0, "socket folder %s left", sock);
    snprintf(x, sizeof x, "%s/%s", dir, name);
    int64_t *steps = NULL;
    const int n = trainer_ckpt_list(x, &steps);
    CHECK_MSG(n == 1 && steps[0] >= 1 && steps[0] < 500, "%s: checkpoints after the signal: %d", name, n);
    if (n == 1) {
        json_t *rows[512];
        snprintf(x, sizeof x, "%s/%s/metrics.jsonl", dir, name);
        int nr = read_rows(x, rows, 512, 0);
        CHECK_MSG(nr == steps[0], "%s: metrics rows %d, checkpoint step %lld", name, nr, (long long)steps[0]);
        free_rows(rows, nr > 0 ? nr : 0);
    }
    free(steps);
}

TEST(colocated_sigterm_sigint) {
    const char *dir = tmpdir();
    make_inputs(dir);
    stop_run(dir, "w2", "--steps 500 --set checkpoint.every=1000 --set parallel.rollout_workers=2", "term");
    /* mpirun kills the job on SIGTERM: `vgrpo run` sends SIGUSR2 instead, which rank 0 takes as SIGTERM */
    stop_run(dir, "n2", "--steps 500 --set checkpoint.every=1000 --set parallel.trainer_ranks=2", "term");
    /* Ctrl-C: the job's processes are in their own process groups, only `vgrpo run` sees it */
    stop_run(dir, "c1", "--steps 500 --set checkpoint.every=1000", "int");
    stop_run(dir, "c2", "--steps 500 --set checkpoint.every=1000 --set parallel.trainer_ranks=2", "int");
    rm_tmpdir(dir);
}

/* 7. refusals naming the key */
TEST(colocated_refusals) {
    const char *dir = tmpdir();
    char out[16384];
    make_inputs(dir);
    struct {
        const char *extra, *expect;
    } cases[] = {
        {"--set model.path=%s/none --set model.init_preset=", "model.path"},
        {"--set parallel.rollout_workers=0", "parallel.rollout_workers"},
        {"--set rollout.prompts_per_step=1 --set rollout.samples_per_prompt=2 --set parallel.trainer_ranks=3",
         "parallel.trainer_ranks"},
        {"--set parallel.trainer_ranks=2 --set parallel.sp=3", "parallel.sp"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char extra[1024], name[16];
        snprintf(extra, sizeof extra, cases[i].extra, dir);
        snprintf(name, sizeof name, "r%zu", i);
        const int rc = run(dir, name, "colocated", extra, out, sizeof out);
        CHECK_MSG(rc == 1 && strstr(out, cases[i].expect), "case %zu (%s): status %d: %s", i, extra, rc, out);
    }
    /* refused before any process started */
    CHECK(test_run(out, sizeof out, "test -e %s/r2/logs", dir) != 0);
    CHECK(reap(dir) == 0);
    rm_tmpdir(dir);
}
