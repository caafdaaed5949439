/* tests/test_faults.c — regressions for the faults a new user hit, each failing on the code before it:
 *   1. two `vgrpo run`s into one run folder: the second is refused naming the folder and the first's pid; a lock left
 *      by a killed run is taken over (and said so);
 *   2. `vgrpo eval` whose reward server is SIGKILLed names the reward server, its signal and its log (not "timed out
 *      waiting for shutdown replies");
 *   3. a file-size limit while a run appends rows: metrics.jsonl and rewards.jsonl keep whole rows only, and the
 *      error names the file;
 *   4. --dry-run refuses what `run` would refuse only after loading the model: rollout.eta 0 (no log-prob to train
 *      on), invalid UTF-8 in a prompt file (file:line, the bytes escaped, never raw), a prompt without a colour under
 *      color_match (file:line). */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/test.h"

static void make_model(const char *dir) {
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", test_vgrpo_bin(), dir) == 0);
}

/* A small local run into dir/NAME (word embeddings and latent_rgb: fast). */
#define SMALL_RUN                                                                                                  \
    "%s run recipes/tiny-cpu.yaml --set model.path=%s/model --set logging.run_dir=%s/%s --set rollout.num_steps=4 " \
    "--set rollout.samples_per_prompt=4 --set data.eval_samples_per_prompt=1 --set logging.eval_every=0 "          \
    "--set checkpoint.every=-1 --set model.text_encoder=word_embed --set model.decoder=latent_rgb"

TEST(fault_run_folder_locked) {
    const char *dir = test_tmpdir();
    char out[16384], first[4096];
    make_model(dir);
    snprintf(first, sizeof first, SMALL_RUN " --steps 100000", test_vgrpo_bin(), dir, dir, "r");
    /* the first run, in the background until its first metrics row; then a second one into the same folder */
    test_run(out, sizeof out,
             "%s > %s/first.log 2>&1 & pid=$!; echo pid=$pid; i=0; while [ ! -s %s/r/metrics.jsonl ] && [ $i -lt 1200 ]; "
             "do sleep 0.05; i=$((i+1)); done; " SMALL_RUN " --steps 1; echo second=$?; kill -KILL $pid; wait $pid; "
             SMALL_RUN " --steps 1; echo third=$?",
             first, dir, dir, test_vgrpo_bin(), dir, dir, "r", test_vgrpo_bin(), dir, dir, "r");
    const char *p = strstr(out, "pid=");
    REQUIRE(p);
    const long pid = strtol(p + 4, NULL, 10);
    char want[128];
    snprintf(want, sizeof want, "is in use by another vgrpo run (pid %ld", pid);
    CHECK_MSG(strstr(out, "second=1") && strstr(out, want) && strstr(out, "logging.run_dir"), "got: %s", out);
    CHECK_MSG(strstr(out, "third=0") && strstr(out, "took over the lock"), "got: %s", out);
}

/* 64 samples per prompt (1,152 in all): the eval must still be running when its reward server is killed after the
 * first two videos (with 8, a loaded machine's polling loop sometimes saw the eval end first: killed=1). */
TEST(fault_eval_reward_server_killed) {
    const char *dir = test_tmpdir();
    char out[16384];
    make_model(dir);
    test_run(out, sizeof out,
             "%s eval recipes/tiny-cpu.yaml --set model.path=%s/model --set rollout.num_steps=4 --set rollout.batch_size=1 "
             "--set data.eval_samples_per_prompt=64 --set reward.timeout_s=0.5 --out %s/ev > %s/ev.log 2>&1 & pid=$!; "
             "i=0; while [ \"$(ls %s/ev/videos 2>/dev/null | wc -l)\" -lt 2 ] && [ $i -lt 1200 ]; do sleep 0.05; "
             "i=$((i+1)); done; pkill -KILL -P $pid -f 'vgrpo reward-server'; echo killed=$?; wait $pid; echo status=$?; "
             "cat %s/ev.log",
             test_vgrpo_bin(), dir, dir, dir, dir, dir);
    test_run(NULL, 0, "pkill -KILL -f '[v]grpo .*%s/' ; true", dir);
    CHECK_MSG(strstr(out, "killed=0") && strstr(out, "status=1"), "got: %s", out);
    CHECK_MSG(strstr(out, "reward server was killed by signal 9") && strstr(out, "reward-server.log"), "got: %s", out);
    CHECK_MSG(!strstr(out, "timed out waiting for shutdown replies"), "got: %s", out);
}

/* Every line of path parses as a JSON object and the file ends with a newline; returns the number of rows. */
static int whole_rows(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rows = 0, bad = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        json_error_t e;
        json_t *j = line[len - 1] == '\n' ? json_loads(line, 0, &e) : NULL;
        if (!json_is_object(j)) bad = 1;
        json_decref(j);
        rows++;
    }
    free(line);
    fclose(f);
    return bad ? -2 : rows;
}

TEST(fault_full_disk_keeps_whole_rows) {
    const char *dir = test_tmpdir();
    char out[16384], p[700];
    make_model(dir);
    /* 24 KiB per file: config.resolved.yaml fits, the rows run into the limit after a few steps. No `trap '' XFSZ`:
     * vgrpo ignores SIGXFSZ itself (it died of it with no word before), so the write fails with EFBIG, named */
    const int st = test_run(out, sizeof out, "ulimit -f 24; " SMALL_RUN " --steps 200", test_vgrpo_bin(),
                            dir, dir, "r");
    CHECK_MSG(st == 1 && strstr(out, ".jsonl: cannot append a row") && strstr(out, "File too large"), "status %d: %s",
              st, out);
    snprintf(p, sizeof p, "%s/r/metrics.jsonl", dir);
    const int m = whole_rows(p);
    snprintf(p, sizeof p, "%s/r/rewards.jsonl", dir);
    const int r = whole_rows(p);
    CHECK_MSG(m >= 1 && r >= 1, "metrics.jsonl %d rows, rewards.jsonl %d rows (-2: a torn row)", m, r);
}

TEST(fault_dry_run_checks_without_weights) {
    const char *dir = test_tmpdir();
    char out[16384], p[700], q[700];
    const char *bin = test_vgrpo_bin();
    /* eta 0: the ODE sampler, no log-prob to train on (refused before: only after loading the model and an eval) */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set rollout.eta=0", bin) == 1);
    CHECK_MSG(strstr(out, "rollout.eta") && strstr(out, "no log-prob"), "got: %s", out);
    /* invalid UTF-8 on line 3: file:line, the byte escaped, no raw byte in the output */
    snprintf(p, sizeof p, "%s/bad.txt", dir);
    FILE *f = fopen(p, "wb");
    REQUIRE(f);
    fputs("a red car\n\n a blue \xff\xfe sky\n", f);
    fclose(f);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set data.prompt_file=%s", bin, p) == 1);
    char want[800];
    snprintf(want, sizeof want, "%s:3:", p);
    CHECK_MSG(strstr(out, want) && strstr(out, "UTF-8") && strstr(out, "\\xff"), "got: %s", out);
    CHECK_MSG(!strchr(out, '\xff'), "a raw byte was printed: %s", out);
    /* a prompt without a colour word under color_match, in the eval prompt file: file:line */
    snprintf(q, sizeof q, "%s/nocolour.txt", dir);
    f = fopen(q, "w");
    REQUIRE(f);
    fputs("# eval prompts\na red car\na cat on a sofa\n", f);
    fclose(f);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set data.eval_prompt_file=%s", bin, q) == 1);
    snprintf(want, sizeof want, "%s:3 (color_match)", q);
    CHECK_MSG(strstr(out, want), "got: %s", out);
    /* the same recipe is fine with a colour-free scorer */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set data.eval_prompt_file=%s "
                                    "--set reward.scorers=[brightness]", bin, q) == 0);
}

/* A text key left empty (a null value) was a crash; bytes from the command line were echoed raw into errors; a
 * UTF-8 byte-order mark stuck to the first prompt. */
TEST(fault_null_keys_binary_args_bom) {
    const char *dir = test_tmpdir();
    char out[16384], p[700];
    const char *bin = test_vgrpo_bin();
    const char *keys[] = {"mode", "optim.schedule", "model.text_encoder", "model.decoder", "algorithm.train_experts",
                          "algorithm.activations", "algorithm.std_mode", "logging.run_dir"};
    for (int i = 0; i < 8; i++) {
        const int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set %s=", bin, keys[i]);
        CHECK_MSG(st == 1 && strstr(out, keys[i]) && strstr(out, "a value is required"), "%s: status %d: %s", keys[i],
                  st, out);
    }
    /* keys without a default may be null */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set reward.endpoint=", bin) == 0);
    CHECK(test_run(out, sizeof out, "%s run \"$(printf '/tmp/\\033[31mx\\377.yaml')\" --dry-run", bin) == 1);
    CHECK_MSG(strstr(out, "\\x1b[31mx\\xff.yaml") && !strchr(out, '\x1b') && !strchr(out, '\xff'), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml \"$(printf -- '--st\\033eps')\" 3", bin) == 2);
    CHECK_MSG(strstr(out, "\"--st\\x1beps\"") && !strchr(out, '\x1b'), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set \"$(printf 'rollout.eta=\\377')\"", bin) == 1);
    CHECK_MSG(!strchr(out, '\xff') && strstr(out, "\\xff"), "got: %s", out);
    /* a BOM before the first prompt is not part of it: the prompt's colour word is still found */
    snprintf(p, sizeof p, "%s/bom.txt", dir);
    FILE *f = fopen(p, "wb");
    REQUIRE(f);
    fputs("\xef\xbb\xbfred car\na blue sky\n", f);
    fclose(f);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set data.prompt_file=%s "
                                    "--set data.eval_prompt_file=%s --set rollout.prompts_per_step=2 --set model.text_encoder=word_embed "
                                    "--set rollout.text_len=3", bin, p, p) == 0);
}

/* A fresh run into a folder holding an earlier run's checkpoints is refused, naming the folder, the newest checkpoint
 * and the two ways on (it deleted them with a warning after the fact before); with --overwrite it replaces them (they
 * survived before that, and `--resume FOLDER` then continued the old run on top of the new one's metrics). */
TEST(fault_fresh_run_replaces_checkpoints) {
    const char *dir = test_tmpdir();
    char out[16384], x[800];
    make_model(dir);
    REQUIRE(test_run(out, sizeof out, SMALL_RUN " --steps 4 --set checkpoint.every=1", test_vgrpo_bin(), dir, dir, "r") == 0);
    snprintf(x, sizeof x, "%s/r/checkpoint-4", dir);
    REQUIRE(test_run(NULL, 0, "test -d %s", x) == 0);
    int st = test_run(out, sizeof out, SMALL_RUN " --steps 2 --set checkpoint.every=1", test_vgrpo_bin(), dir, dir, "r");
    CHECK_MSG(st == 1 && strstr(out, "logging.run_dir: ") && strstr(out, "/r holds the checkpoints of an earlier run") &&
              strstr(out, "/r/checkpoint-4, 2 in all") && strstr(out, "--resume ") && strstr(out, "--overwrite"),
              "status %d: %s", st, out);
    CHECK(test_run(NULL, 0, "test -d %s", x) == 0); /* untouched */
    CHECK(test_run(out, sizeof out, SMALL_RUN " --steps 2 --set checkpoint.every=1 --overwrite", test_vgrpo_bin(), dir,
                   dir, "r") == 0);
    CHECK_MSG(strstr(out, "removed checkpoint-3, checkpoint-4 of an earlier run (--overwrite)"), "got: %s", out);
    CHECK(test_run(NULL, 0, "test -d %s", x) != 0);
    snprintf(x, sizeof x, "%s/r/checkpoint-2", dir);
    CHECK(test_run(NULL, 0, "test -d %s", x) == 0);
    CHECK(test_run(out, sizeof out, SMALL_RUN " --steps 3 --resume %s/r", test_vgrpo_bin(), dir, dir, "r", dir) == 0);
    CHECK_MSG(strstr(out, "resumed from") && strstr(out, "checkpoint-2") && strstr(out, " of run "), "got: %s", out);
}

/* The supervisor of a colocated run killed with SIGKILL: its trainer and workers still run for a moment (they get
 * SIGTERM and stop, the trainer saving a checkpoint), so the folder must stay locked until the last of them exits: the
 * run's processes hold the lock's open file (an inherited descriptor), not only the supervisor. Checked directly:
 * the trainer and the worker have DIR/.vgrpo.lock open. */
TEST(fault_lock_held_by_the_runs_processes) {
    const char *dir = test_tmpdir();
    char out[16384];
    make_model(dir);
    test_run(out, sizeof out,
             SMALL_RUN " --set mode=colocated --steps 100000 > %s/first.log 2>&1 & pid=$!; i=0; "
             "while [ ! -s %s/r/metrics.jsonl ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; "
             "for c in trainer rollout-worker; do p=$(pgrep -P $pid -f \"vgrpo $c\"); "
             "echo \"$c holds=$(ls -l /proc/$p/fd 2>/dev/null | grep -c 'vgrpo.lock')\"; done; "
             "kill -TERM $pid; wait $pid",
             test_vgrpo_bin(), dir, dir, "r", dir, dir);
    test_run(NULL, 0, "pkill -KILL -f '[v]grpo .*%s/' ; true", dir);
    CHECK_MSG(strstr(out, "trainer holds=1") && strstr(out, "rollout-worker holds=1"), "got: %s", out);
}
