/* tests/test_lost_worker.c — a colocated `vgrpo run` that loses processes (cli/colocated.c restarts them,
 * trainer/net/controller.h re-issues a lost worker's chunk and admits a restarted one after a weight sync). Tiny preset,
 * 3 prompts, B = 2, G = 4 in chunks of 2 samples, 4 denoising steps, 2 rollout workers, checkpoints every step.
 *   - a rollout worker SIGKILLed while it holds a chunk (the reward server is stopped, and the worker's log shows a
 *     request it began after that: it waits for its scores; the server goes on once the restarted worker is
 *     admitted): the run finishes, and its metrics.jsonl rows (time/ and
 *     weight_sync/ aside), rewards.jsonl and the final checkpoint's weights and Adam state equal an undisturbed run's
 *     byte for byte; the output shows the loss, the re-issued chunk, the restart, the admission (weight hash checked)
 *     and the restarted worker's first chunk;
 *   - the reward server SIGKILLed with requests in flight: restarted, the workers re-send (reward.timeout_s), and
 *     the run equals the undisturbed one the same way;
 *   - every worker killed again and again with --max-restarts 1: the run stops (exit 1) naming both workers and
 *     their restarts, no process of the run is left, the checkpoints left are complete and the run resumes from the
 *     last;
 *   - two trainer ranks (mpirun) and rank 1 SIGKILLed: mpirun ends the job, `vgrpo run` exits 1 naming the trainer,
 *     nothing is left running, and the run resumes from its last checkpoint (what README says of a lost rank).
 * Each runs in ~2-5 s on 2 cores (~8 s under ASan). */
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/metrics_rows.h"
#include "tests/test.h"
#include "trainer/checkpoint/checkpoint.h"

/* Kills (SIGKILL) every process whose command line names dir, and returns how many there were. */
static int reap(const char *dir) {
    char out[4096];
    test_run(out, sizeof out, "pgrep -f '[v]grpo .*%s/' | wc -l; pkill -KILL -f '[v]grpo .*%s/'; true", dir, dir);
    return atoi(out);
}

/* test_tmpdir() + ".<pid>" (several suites may share build/test-tmp), with a tiny model and a 3-prompt file. */
static const char *setup(void) {
    static char path[600];
    char out[4096];
    snprintf(path, sizeof path, "%s.%d", test_tmpdir(), (int)getpid());
    if (test_run(out, sizeof out, "rm -rf %s && mkdir -p %s && %s init-model --preset tiny --out %s/model --seed 2 "
                                  ">/dev/null && printf 'a red kite\\na green frog\\na blue boat\\n' > %s/prompts.txt",
                 path, path, test_vgrpo_bin(), path, path))
        test_fail(__FILE__, __LINE__, "cannot set up %s: %s", path, out);
    return path;
}

static void cleanup(const char *dir) {
    char out[1024];
    test_run(out, sizeof out, "rm -rf %s", dir);
}

/* The run's command line into dir/<name> (no redirection). */
static void cmdline(char *buf, size_t cap, const char *dir, const char *name, const char *extra) {
    snprintf(buf, cap,
             "env OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml --set mode=colocated --set model.path=%s/model "
             "--set data.prompt_file=%s/prompts.txt --set data.eval_prompt_file=%s/prompts.txt "
             "--set logging.run_dir=%s/%s --set rollout.num_steps=4 --set rollout.prompts_per_step=2 "
             "--set rollout.samples_per_prompt=4 --set rollout.batch_size=2 --set data.eval_samples_per_prompt=1 "
             "--set logging.eval_every=2 --set algorithm.beta=0.05 --set checkpoint.every=1 "
             "--set checkpoint.total_limit=0 --set parallel.rollout_workers=2 %s",
             test_vgrpo_bin(), dir, dir, dir, dir, name, extra);
}

#define STEPS 4
static const char *const CKPT_FILES[] = {"transformer/diffusion_pytorch_model.safetensors", "optimizer.safetensors"};

/* The undisturbed run dir/ref (STEPS steps). */
static void reference(const char *dir) {
    char cmd[4096], out[16384];
    cmdline(cmd, sizeof cmd, dir, "ref", "--steps 4");
    const int rc = test_run(out, sizeof out, "%s", cmd);
    reap(dir);
    if (rc) test_fail(__FILE__, __LINE__, "the undisturbed run failed: %s", out);
}

/* dir/name equals dir/ref: metrics rows without time/ and weight_sync/, rewards.jsonl, the last checkpoint. */
static void check_same_as_ref(const char *dir, const char *name) {
    char pa[1024], pb[1024], out[4096];
    json_t *ra[16], *rb[16];
    snprintf(pa, sizeof pa, "%s/ref/metrics.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", dir, name);
    const int na = read_rows(pa, ra, 16, 1), nb = read_rows(pb, rb, 16, 1);
    CHECK_MSG(na == STEPS + 1 && nb == na, "metrics rows: ref %d, %s %d", na, name, nb);
    for (int i = 0; i < na && i < nb; i++)
        if (!json_equal(ra[i], rb[i])) {
            char *sa = json_dumps(ra[i], JSON_SORT_KEYS | JSON_COMPACT), *sb = json_dumps(rb[i], JSON_SORT_KEYS | JSON_COMPACT);
            test_fail(__FILE__, __LINE__, "metrics row %d differs:\n  ref %s\n  %s %s", i, sa, name, sb);
            free(sa), free(sb);
        }
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/ref/rewards.jsonl %s/%s/rewards.jsonl", dir, dir, name) == 0,
              "rewards.jsonl differs: %s", out);
    for (int f = 0; f < 2; f++)
        CHECK_MSG(test_run(out, sizeof out, "cmp %s/ref/checkpoint-%d/%s %s/%s/checkpoint-%d/%s", dir, STEPS,
                           CKPT_FILES[f], dir, name, STEPS, CKPT_FILES[f]) == 0,
                  "checkpoint-%d/%s differs: %s", STEPS, CKPT_FILES[f], out);
}

/* Shell: waits until dir/name/checkpoint-1 exists, then sets $rs to the pid of the run's reward server: the child of
 * the run's supervisor ($pid) that is a reward server (found before by the job's socket folder in worker-0's log, which
 * matched any reward server on the machine when that line was not there yet: a stranger's pid, "No such process"). */
#define WAIT_AND_FIND_REWARD                                                                                     \
    "i=0; while [ ! -e %s/%s/checkpoint-1 ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "                 \
    "rs=$(pgrep -P $pid -f '[v]grpo reward-server' | head -1); echo reward=$rs; "

TEST(lost_worker_restarted_same_run) {
    const char *dir = setup();
    char cmd[4096], out[32768];
    reference(dir);
    cmdline(cmd, sizeof cmd, dir, "k", "--steps 4");
    /* worker-1 dies while it holds a chunk, and comes back before the run ends, whatever the load. A fixed sleep
     * after stopping the reward server did not make sure of either: the tiny step's whole rollout takes ~50 ms, so
     * by the time the reward server stopped, worker-1 had often finished the step's last chunk and sat idle (its
     * loss was then "lost; 1 rollout worker(s) left", with no chunk to re-issue: 1 failure in ~7 under load), and a
     * restart slower than the rest of the run would never be admitted. So: the reward server is stopped, and worker-1
     * is killed once its log shows a rollout request it began after the stop (its scores cannot come: it holds that
     * chunk until it dies; if none comes within 2 s, the server is let go on and stopped again); the server goes on
     * only once the controller has admitted the restarted worker (at most 20 s: the workers' reward time-out is
     * 30 s), so the rollout in flight, and the rest of the run, still has work for it. */
    test_run(out, sizeof out,
             "%s > %s/k.log 2>&1 & pid=$!; " WAIT_AND_FIND_REWARD
             "w1=%s/k/logs/worker-1.log; got=0; "
             "for try in $(seq 1 40); do kill -STOP $rs; n=$(grep -c 'rollout request' $w1); j=0; "
             "  while [ $j -lt 40 ] && [ $(grep -c 'rollout request' $w1) -le $n ]; do sleep 0.05; j=$((j+1)); done; "
             "  if [ $(grep -c 'rollout request' $w1) -gt $n ]; then got=1; break; fi; kill -CONT $rs; sleep 0.1; "
             "done; echo holds=$got; "
             "pkill -KILL -f '[r]ollout-worker .*--id worker-1 .*%s/k'; echo killed=$?; "
             "j=0; while [ $j -lt 400 ] && ! grep -q 'worker-1 is back at work' %s/k.log; do sleep 0.05; j=$((j+1)); "
             "done; kill -CONT $rs; wait $pid; echo status=$?; cat %s/k.log",
             cmd, dir, dir, "k", dir, dir, dir, dir);
    const int left = reap(dir);
    CHECK_MSG(strstr(out, "holds=1") && strstr(out, "killed=0") && strstr(out, "status=0"), "got: %s", out);
    CHECK_MSG(left == 0, "%d process(es) of the run left", left);
    /* the loss, the re-issued chunk, the restart, the admission with its hash, and work again */
    const char *want[] = {"controller: worker-1 lost (its connection closed) with chunk r",
                          "re-issued to worker-",
                          "rollout worker 1 was killed by signal 9",
                          "restarting it (restart 1 of 3)",
                          "controller: worker-1 is back (restart 1): sent it the weights of policy version",
                          "controller: worker-1 is back at work: its weights of policy version",
                          "controller: worker-1, back after a restart, works again: chunk r"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_MSG(strstr(out, want[i]), "no \"%s\" in: %s", want[i], out);
    CHECK(test_run(out, sizeof out, "grep -q -- '--- restarted by the supervisor (restart 1) ---' %s/k/logs/worker-1.log",
                   dir) == 0);
    check_same_as_ref(dir, "k");
    CHECK(reap(dir) == 0);
    cleanup(dir);
}

TEST(lost_reward_server_restarted_same_run) {
    const char *dir = setup();
    char cmd[4096], out[32768];
    reference(dir);
    cmdline(cmd, sizeof cmd, dir, "r", "--steps 4 --set reward.timeout_s=1");
    /* stopped first, so that requests are in flight when it dies */
    test_run(out, sizeof out,
             "%s > %s/r.log 2>&1 & pid=$!; " WAIT_AND_FIND_REWARD
             "kill -STOP $rs; sleep 0.5; kill -KILL $rs; echo killed=$?; wait $pid; echo status=$?; cat %s/r.log",
             cmd, dir, dir, "r", dir);
    const int left = reap(dir);
    CHECK_MSG(strstr(out, "killed=0") && strstr(out, "status=0"), "got: %s", out);
    CHECK_MSG(left == 0, "%d process(es) of the run left", left);
    CHECK_MSG(strstr(out, "reward server was killed by signal 9") && strstr(out, "restarting it (restart 1 of 3)"),
              "got: %s", out);
    CHECK(test_run(out, sizeof out, "grep -q -- '--- restarted by the supervisor (restart 1) ---' "
                                    "%s/r/logs/reward-server.log", dir) == 0);
    check_same_as_ref(dir, "r");
    CHECK(reap(dir) == 0);
    cleanup(dir);
}

/* The checkpoints of dir/name are complete (no temporary folder) and the run resumes from the latest for one more
 * step (extra: the options of the run). */
static void check_resumes(const char *dir, const char *name, const char *extra) {
    char x[2048], cmd[4096], out[16384];
    snprintf(x, sizeof x, "%s/%s", dir, name);
    int64_t *steps = NULL;
    const int n = trainer_ckpt_list(x, &steps);
    REQUIRE(n >= 1);
    const int64_t last = steps[n - 1];
    free(steps);
    CHECK_MSG(last < 50, "the run finished before the kill (checkpoint-%lld)", (long long)last);
    CHECK(test_run(out, sizeof out, "ls -a %s/%s | grep -c tmp", dir, name) != 0);
    snprintf(x, sizeof x, "--resume %s/%s --steps %lld %s", dir, name, (long long)last + 1, extra);
    cmdline(cmd, sizeof cmd, dir, name, x);
    const int rc = test_run(out, sizeof out, "%s", cmd);
    reap(dir);
    CHECK_MSG(rc == 0 && strstr(out, "resumed from"), "resume: status %d: %s", rc, out);
    snprintf(x, sizeof x, "%s/%s/checkpoint-%lld/trainer_state.json", dir, name, (long long)last + 1);
    struct stat sb;
    CHECK_MSG(stat(x, &sb) == 0, "no %s", x);
}

TEST(lost_all_workers_past_restarts) {
    const char *dir = setup();
    char cmd[4096], out[32768];
    cmdline(cmd, sizeof cmd, dir, "a", "--steps 50 --max-restarts 1");
    /* every worker, again and again (each restart too), until the run gives up */
    test_run(out, sizeof out,
             "%s > %s/a.log 2>&1 & pid=$!; i=0; while [ ! -e %s/a/checkpoint-1 ] && [ $i -lt 600 ]; do sleep 0.05; "
             "i=$((i+1)); done; i=0; while kill -0 $pid 2>/dev/null && [ $i -lt 100 ]; do "
             "pkill -KILL -f '[r]ollout-worker .*%s/a'; sleep 0.3; i=$((i+1)); done; wait $pid; echo status=$?; "
             "cat %s/a.log",
             cmd, dir, dir, dir, dir);
    const int left = reap(dir);
    CHECK_MSG(strstr(out, "status=1"), "got: %s", out);
    CHECK_MSG(left == 0, "%d process(es) of the run left after it stopped", left);
    const char *want[] = {"no rollout worker is left (--max-restarts 1): rollout worker 0 was killed by signal 9",
                          "rollout worker 1 was killed by signal 9", "(restarted 1 time(s))",
                          "restarting it (restart 1 of 1)"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_MSG(strstr(out, want[i]), "no \"%s\" in: %s", want[i], out);
    check_resumes(dir, "a", "");
    CHECK(reap(dir) == 0);
    cleanup(dir);
}

TEST(lost_trainer_rank_ends_job) {
    const char *dir = setup();
    char cmd[4096], out[32768];
    cmdline(cmd, sizeof cmd, dir, "m", "--steps 50 --set parallel.trainer_ranks=2");
    /* rank 1: the `vgrpo trainer` process whose environment says OMPI_COMM_WORLD_RANK=1 */
    test_run(out, sizeof out,
             "%s > %s/m.log 2>&1 & pid=$!; i=0; while [ ! -e %s/m/checkpoint-1 ] && [ $i -lt 600 ]; do sleep 0.05; "
             "i=$((i+1)); done; for p in $(pgrep -f '^[^ ]*vgrpo trainer .*%s/'); do "
             "if tr '\\0' '\\n' < /proc/$p/environ | grep -qx OMPI_COMM_WORLD_RANK=1; then kill -KILL $p; echo killed=$?; fi; "
             "done; wait $pid; echo status=$?; cat %s/m.log",
             cmd, dir, dir, dir, dir);
    const int left = reap(dir);
    CHECK_MSG(strstr(out, "killed=0") && strstr(out, "status=1"), "got: %s", out);
    CHECK_MSG(strstr(out, "vgrpo run: trainer (mpirun)") && strstr(out, "a lost trainer rank ends the whole MPI job") &&
                  strstr(out, "--resume"), "got: %s", out);
    CHECK_MSG(left == 0, "%d process(es) of the run left after it stopped", left);
    check_resumes(dir, "m", "--set parallel.trainer_ranks=2");
    CHECK(reap(dir) == 0);
    cleanup(dir);
}
