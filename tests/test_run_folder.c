/* tests/test_run_folder.c — what a run does to the folders it writes:
 *   - checkpoint.dir is locked as logging.run_dir is: a second run whose checkpoint.dir is a live run's folder is
 *     refused (it removed that run's checkpoints before); a checkpoint records its run (run id, seed, recipe hash),
 *     and eval and --resume print it; a checkpoint without a run id (older) still resumes;
 *   - a symlink planted in the run folder (.vgrpo.lock, config.resolved.yaml) is refused, its target untouched; a
 *     folder others can write (not sticky), or another user's, is refused; files 0600 and folders 0700 by default,
 *     logging.file_mode widens them;
 *   - stale socket folders of dead supervisors are removed (only ours: owner and pid marker);
 *   - SIGINT to a colocated run's supervisor as it starts is reported as a stop, not as "the trainer died". */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fs.h"
#include "tests/test.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_sums.h"

static void make_model(const char *dir) {
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", test_vgrpo_bin(), dir) == 0);
}

/* A small local run (word embeddings and latent_rgb: fast); the caller adds the run folder and what else. */
#define RUN                                                                                                        \
    "%s run recipes/tiny-cpu.yaml --set model.path=%s/model --set rollout.num_steps=4 "                           \
    "--set rollout.samples_per_prompt=4 --set data.eval_samples_per_prompt=1 --set logging.eval_every=0 "          \
    "--set model.text_encoder=word_embed --set model.decoder=latent_rgb "

static unsigned mode_of(const char *path) {
    struct stat sb;
    return lstat(path, &sb) ? 0xffffu : (unsigned)(sb.st_mode & 07777);
}

TEST(run_folder_checkpoint_dir_locked_and_run_recorded) {
    const char *dir = test_tmpdir();
    char out[16384], ck[800];
    make_model(dir);
    /* run a: live (in the background until its first row), its checkpoints in dir/a; then run b into dir/b with
     * checkpoint.dir=dir/a */
    test_run(out, sizeof out,
             RUN "--set logging.run_dir=%s/a --set checkpoint.every=-1 --steps 100000 > %s/a.log 2>&1 & pid=$!; i=0; "
             "while [ ! -s %s/a/metrics.jsonl ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; "
             RUN "--set logging.run_dir=%s/b --set checkpoint.dir=%s/a --steps 1; echo second=$?; kill -KILL $pid; "
             "wait $pid",
             test_vgrpo_bin(), dir, dir, dir, dir, test_vgrpo_bin(), dir, dir, dir);
    test_run(NULL, 0, "pkill -KILL -f '[v]grpo .*%s/' ; true", dir);
    CHECK_MSG(strstr(out, "second=1") && strstr(out, "checkpoint.dir: ") && strstr(out, "/a is in use by another vgrpo run"),
              "got: %s", out);

    /* a run's checkpoints name it; eval and --resume print it */
    REQUIRE(test_run(out, sizeof out, RUN "--set logging.run_dir=%s/c --set data.seed=7 --set checkpoint.every=1 --steps 2",
                     test_vgrpo_bin(), dir, dir) == 0);
    snprintf(ck, sizeof ck, "%s/c/checkpoint-2", dir);
    trainer_ckpt_state st;
    REQUIRE_OK(trainer_ckpt_read_state(ck, &st));
    char id[64];
    snprintf(id, sizeof id, "%s", st.run_id);
    CHECK_MSG(strlen(id) > 16 && st.seed == 7, "run_id \"%s\", seed %lld", id, (long long)st.seed);
    trainer_ckpt_state_free(&st);
    snprintf(ck, sizeof ck, "%s/c/checkpoint-1", dir);
    REQUIRE_OK(trainer_ckpt_read_state(ck, &st));
    CHECK_MSG(!strcmp(st.run_id, id), "checkpoint-1 of run %s, checkpoint-2 of %s", st.run_id, id);
    trainer_ckpt_state_free(&st);
    CHECK(test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml --set model.path=%s/model --set model.text_encoder="
                                    "word_embed --set model.decoder=latent_rgb --set rollout.num_steps=4 --set "
                                    "data.eval_samples_per_prompt=1 --checkpoint %s/c/checkpoint-2 --out %s/ev",
                   test_vgrpo_bin(), dir, dir, dir) == 0);
    char want[200];
    snprintf(want, sizeof want, "checkpoint-2: step 2 of run %s (seed 7, recipe ", id);
    CHECK_MSG(strstr(out, want), "eval: want \"%s\" in: %s", want, out);

    /* an older checkpoint (no run_id; its state hash made anew) still resumes, and the resumed run keeps a run id */
    char sp[900];
    snprintf(sp, sizeof sp, "%s/c/checkpoint-2/trainer_state.json", dir);
    json_t *o = json_load_file(sp, 0, NULL);
    REQUIRE(o);
    REQUIRE(json_object_del(o, "run_id") == 0);
    uint64_t h;
    REQUIRE_OK(trainer_ckpt_sums_state_hash(o, &h));
    char hs[17];
    snprintf(hs, sizeof hs, "%016llx", (unsigned long long)h);
    json_object_set_new(o, "state_xxh64", json_string(hs));
    REQUIRE(json_dump_file(o, sp, JSON_INDENT(2) | JSON_PRESERVE_ORDER) == 0);
    json_decref(o);
    CHECK(test_run(out, sizeof out, RUN "--set logging.run_dir=%s/c --set data.seed=7 --set checkpoint.every=1 --steps 3 "
                                        "--resume %s/c", test_vgrpo_bin(), dir, dir, dir) == 0);
    CHECK_MSG(strstr(out, "checkpoint-2: step 2 of a run not recorded"), "got: %s", out);
    snprintf(ck, sizeof ck, "%s/c/checkpoint-3", dir);
    REQUIRE_OK(trainer_ckpt_read_state(ck, &st));
    CHECK(strlen(st.run_id) > 16);
    trainer_ckpt_state_free(&st);
}

TEST(run_folder_symlinks_modes_owner) {
    const char *dir = test_tmpdir();
    char out[16384], p[800], q[800], buf[64];
    make_model(dir);
    snprintf(q, sizeof q, "%s/victim", dir);
    test_write_text(NULL, q, "keep\n");
    /* a link planted as the lock file, then as config.resolved.yaml: refused, the target untouched */
    const char *names[] = {".vgrpo.lock", "config.resolved.yaml"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/s%d", dir, i);
        REQUIRE(mkdir(p, 0755) == 0);
        snprintf(p, sizeof p, "%s/s%d/%s", dir, i, names[i]);
        REQUIRE(symlink(q, p) == 0);
        const int st = test_run(out, sizeof out, RUN "--set logging.run_dir=%s/s%d --steps 1", test_vgrpo_bin(), dir,
                                dir, i);
        /* the lock is opened in place: refused. config.resolved.yaml is written beside and renamed over the link,
         * which replaces the link itself: the run goes on and the file is a plain one */
        if (i == 0)
            CHECK_MSG(st == 1 && strstr(out, names[i]) && strstr(out, "is a symbolic link"), "%s: status %d: %s",
                      names[i], st, out);
        else {
            struct stat lb;
            CHECK_MSG(st == 0, "%s: status %d: %s", names[i], st, out);
            CHECK(lstat(p, &lb) == 0 && S_ISREG(lb.st_mode));
        }
        CHECK(test_slurp(q, buf, sizeof buf) == 5 && !strcmp(buf, "keep\n"));
    }
    /* a folder others can write (not sticky) is refused; sticky passes that check */
    snprintf(p, sizeof p, "%s/w", dir);
    REQUIRE(mkdir(p, 0755) == 0 && chmod(p, 0777) == 0);
    int st = test_run(out, sizeof out, RUN "--set logging.run_dir=%s/w --steps 1", test_vgrpo_bin(), dir, dir);
    CHECK_MSG(st == 1 && strstr(out, "is writable by other users (mode 0777)"), "status %d: %s", st, out);
    REQUIRE(chmod(p, 01777) == 0);
    CHECK(core_check_own_dir(p, "logging.run_dir") == 0);
    if (geteuid() == 0) { /* another user's folder: refused (root can make one) */
        snprintf(p, sizeof p, "%s/o", dir);
        REQUIRE(mkdir(p, 0755) == 0 && chown(p, 12345, 12345) == 0);
        st = test_run(out, sizeof out, RUN "--set logging.run_dir=%s/o --steps 1", test_vgrpo_bin(), dir, dir);
        CHECK_MSG(st == 1 && strstr(out, "belongs to uid 12345"), "status %d: %s", st, out);
    }
    /* modes: 0600 / 0700 by default (whatever the umask), 0644 / 0755 with logging.file_mode=0644 */
    REQUIRE(test_run(out, sizeof out, "umask 022; " RUN "--set logging.run_dir=%s/m/run --set checkpoint.every=1 --steps 1",
                     test_vgrpo_bin(), dir, dir) == 0);
    const char *files[] = {"config.resolved.yaml", "metrics.jsonl", "rewards.jsonl", ".vgrpo.lock",
                           "checkpoint-1/trainer_state.json", "checkpoint-1/optimizer.safetensors"};
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/m/run/%s", dir, files[i]);
        CHECK_MSG(mode_of(p) == 0600, "%s: mode %04o", files[i], mode_of(p));
    }
    snprintf(p, sizeof p, "%s/m/run/checkpoint-1", dir);
    CHECK_MSG(mode_of(p) == 0700, "checkpoint-1: mode %04o", mode_of(p));
    snprintf(p, sizeof p, "%s/m/run", dir);
    CHECK_MSG(mode_of(p) == 0700, "run folder: mode %04o", mode_of(p));
    REQUIRE(test_run(out, sizeof out, "umask 077; " RUN "--set logging.run_dir=%s/m/wide --set logging.file_mode=0644 "
                     "--set checkpoint.every=1 --steps 1", test_vgrpo_bin(), dir, dir) == 0);
    snprintf(p, sizeof p, "%s/m/wide/metrics.jsonl", dir);
    CHECK_MSG(mode_of(p) == 0644, "0644: metrics.jsonl mode %04o", mode_of(p));
    snprintf(p, sizeof p, "%s/m/wide/checkpoint-1", dir);
    CHECK_MSG(mode_of(p) == 0755, "0644: checkpoint-1 mode %04o", mode_of(p));
    st = test_run(out, sizeof out, RUN "--set logging.run_dir=%s/m/x --set logging.file_mode=0666 --dry-run",
                  test_vgrpo_bin(), dir, dir);
    CHECK_MSG(st == 1 && strstr(out, "logging.file_mode"), "status %d: %s", st, out);
}

/* A socket folder whose supervisor died (SIGKILL) is removed at the next start; one of a live process, one without
 * the marker, and one holding anything but sockets and the marker stay. */
TEST(run_folder_stale_socket_folders) {
    const char *dir = test_tmpdir();
    char p[800], made[700];
    const pid_t child = fork();
    if (child == 0) _exit(0);
    REQUIRE(child > 0 && waitpid(child, NULL, 0) == child); /* a pid that no longer runs */
    const char *names[] = {"vgrpo-dead01", "vgrpo-live01", "vgrpo-nopid1", "vgrpo-other1"};
    const long pids[] = {(long)child, (long)getpid(), 0, (long)child};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        REQUIRE(mkdir(p, 0700) == 0);
        char text[32];
        snprintf(text, sizeof text, "%ld\n", pids[i]);
        if (pids[i]) test_write_text(p, "pid", text);
    }
    test_write_text(dir, "vgrpo-other1/notes.txt", "mine\n");
    REQUIRE_OK(core_sockdir_make(dir, made, sizeof made));
    struct stat sb;
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        CHECK_MSG((stat(p, &sb) == 0) == (i != 0), "%s: %s", names[i], i ? "removed" : "left");
    }
    CHECK_MSG(mode_of(made) == 0700, "%s: mode %04o", made, mode_of(made));
    char buf[32], want[32];
    snprintf(p, sizeof p, "%s/pid", made);
    snprintf(want, sizeof want, "%ld\n", (long)getpid());
    CHECK(test_slurp(p, buf, sizeof buf) > 0 && !strcmp(buf, want));
}

/* SIGINT to a colocated run's supervisor while the job starts (the trainer not yet able to take the stop): a stop,
 * reported as one (it said "the trainer died" and "killed by signal 15"). */
TEST(run_folder_sigint_at_start_is_a_stop) {
    const char *dir = test_tmpdir();
    char out[16384];
    make_model(dir);
    test_run(out, sizeof out,
             RUN "--set mode=colocated --set logging.run_dir=%s/r --steps 3 > %s/r.log 2>&1 & pid=$!; i=0; "
             "while [ ! -e %s/r/logs/worker-0.log ] && [ $i -lt 1200 ]; do sleep 0.01; i=$((i+1)); done; "
             "kill -INT $pid; wait $pid; echo status=$?; cat %s/r.log",
             test_vgrpo_bin(), dir, dir, dir, dir, dir);
    test_run(NULL, 0, "pkill -KILL -f '[v]grpo .*%s/' ; true", dir);
    CHECK_MSG(strstr(out, "status=1") && strstr(out, "stopped by signal") && !strstr(out, "the trainer died") &&
              !strstr(out, "killed by signal"), "got: %s", out);
}

/* checkpoint.every: 0 saves only at the end (and on a signal), -1 never (0 had meant never, and every Wan recipe had
 * it: a run lost its weights at the end and on Ctrl-C). */
TEST(run_folder_checkpoint_every_zero_and_minus_one) {
    const char *dir = test_tmpdir();
    char out[16384], p[800];
    make_model(dir);
    int st = test_run(out, sizeof out, RUN "--set logging.run_dir=%s/z --set checkpoint.every=0 --steps 2",
                      test_vgrpo_bin(), dir, dir);
    CHECK_MSG(st == 0, "every=0: status %d: %s", st, out);
    snprintf(p, sizeof p, "%s/z/checkpoint-2/trainer_state.json", dir);
    CHECK_MSG(access(p, F_OK) == 0, "every=0: no %s", p);
    snprintf(p, sizeof p, "%s/z/checkpoint-1", dir);
    CHECK_MSG(access(p, F_OK) != 0, "every=0: %s was written", p);
    st = test_run(out, sizeof out, RUN "--set logging.run_dir=%s/n --set checkpoint.every=-1 --steps 2",
                  test_vgrpo_bin(), dir, dir);
    CHECK_MSG(st == 0, "every=-1: status %d: %s", st, out);
    char names[64];
    CHECK(test_run(names, sizeof names, "ls -d %s/n/checkpoint-* 2>/dev/null | wc -l", dir) == 0 && atoi(names) == 0);
}
