/* tests/test_launch_mpi.c — a run as one MPI job (cli/launch_mpi.c: `vgrpo run --launcher mpirun`, `vgrpo mpi-rank`),
 * under mpirun --oversubscribe on this machine, TCP on 127.0.0.1. Tiny preset, 3 prompts, B = 2, G = 4 in chunks of
 * 2 samples, 4 denoising steps, 2 trainer ranks, 2 rollout workers and the reward server (5 processes):
 *   - the MPMD launch equals the supervisor path (cli/colocated.c, ipc://) bit for bit: metrics rows (time/ and
 *     weight_sync/seconds aside), rewards.jsonl, the last checkpoint's weights and Adam state; the endpoints are
 *     tcp://127.0.0.1:PORT (never 0.0.0.0); the workers and the reward server log to run_dir/logs/; the srun form
 *     (every rank the same `vgrpo mpi-rank` command, roles from rank ranges) gives the same bits; nothing is left
 *     running;
 *   - a TCP client without the run's keys (plain ZeroMQ, and CURVE with another run's keys) that keeps sending to
 *     the controller (hello, trajectory, shutdown) and to the reward server (hello, shutdown) during the whole run
 *     gets nothing back on either channel, and the run still equals the supervisor path bit for bit;
 *   - a rollout worker that leaves (SIGTERM to it alone: it stops within a denoising step, closes its connection and
 *     waits in MPI_Finalize): the controller gives its work to the other worker, the run finishes (status 0) and
 *     equals the supervisor path's bit for bit;
 *   - a rollout worker SIGKILLed: mpirun ends the job (no restarts under mpirun), nothing is left running, and the
 *     run resumes from its last checkpoint with --launcher mpirun (what README says);
 *   - SIGUSR2 to mpirun: the trainer stops within its step, saves a checkpoint, and every process exits (status 1);
 *   - the address rules of core/host_addr.h; the option errors of `vgrpo run --launcher`.
 * The runs take ~1-3 s each on 2 cores. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/curve.h"
#include "core/error.h"
#include "core/host_addr.h"
#include "tests/metrics_rows.h"
#include "tests/test.h"
#include "trainer/checkpoint/checkpoint.h"

#define STEPS 4
/* mpirun on this machine as the launcher runs it (root allowed, no CMA in containers) */
#define MPI_ENV "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "

static int have_mpirun(void) {
    if (!access("/usr/bin/mpirun", X_OK)) return 1;
    test_skip("no /usr/bin/mpirun");
    return 0;
}

/* Kills (SIGKILL) every process whose command line names dir, and returns how many there were. */
static int reap(const char *dir) {
    char out[4096];
    test_run(out, sizeof out, "pgrep -f '[v]grpo .*%s/' | wc -l; pkill -KILL -f '[v]grpo .*%s/'; true", dir, dir);
    return atoi(out);
}

/* test_tmpdir() + ".<pid>" with a tiny model and a 3-prompt file. */
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

/* The recipe overrides of every run here, into dir/<name>. */
static void sets(char *buf, size_t cap, const char *dir, const char *name) {
    snprintf(buf, cap,
             "--set mode=colocated --set model.path=%s/model --set data.prompt_file=%s/prompts.txt "
             "--set data.eval_prompt_file=%s/prompts.txt --set logging.run_dir=%s/%s --set rollout.num_steps=4 "
             "--set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 --set rollout.batch_size=2 "
             "--set data.eval_samples_per_prompt=1 --set logging.eval_every=2 --set algorithm.beta=0.05 "
             "--set checkpoint.every=1 --set checkpoint.total_limit=0 --set parallel.rollout_workers=2 "
             "--set parallel.trainer_ranks=2",
             dir, dir, dir, dir, name);
}

/* `vgrpo run` into dir/<name> (no redirection); extra: --launcher mpirun, --steps ... */
static void cmdline(char *buf, size_t cap, const char *dir, const char *name, const char *extra) {
    char s[2048];
    sets(s, sizeof s, dir, name);
    snprintf(buf, cap, MPI_ENV "OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml %s %s", test_vgrpo_bin(), s, extra);
}

static int run(const char *dir, const char *name, const char *extra, char *out, size_t cap) {
    char cmd[4096];
    cmdline(cmd, sizeof cmd, dir, name, extra);
    return test_run(out, cap, "%s", cmd);
}

/* dir/name equals dir/ref: metrics rows without time/ and weight_sync/seconds, rewards.jsonl, the last checkpoint. */
static void check_same_as_ref(const char *dir, const char *name) {
    static const char *const files[] = {"transformer/diffusion_pytorch_model.safetensors", "optimizer.safetensors"};
    char pa[1024], pb[1024], out[4096];
    json_t *ra[16], *rb[16];
    snprintf(pa, sizeof pa, "%s/ref/metrics.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", dir, name);
    const int na = read_rows(pa, ra, 16, 0), nb = read_rows(pb, rb, 16, 0);
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
              "%s: rewards.jsonl differs: %s", name, out);
    for (int f = 0; f < 2; f++)
        CHECK_MSG(test_run(out, sizeof out, "cmp %s/ref/checkpoint-%d/%s %s/%s/checkpoint-%d/%s", dir, STEPS, files[f],
                           dir, name, STEPS, files[f]) == 0,
                  "%s: checkpoint-%d/%s differs: %s", name, STEPS, files[f], out);
}

/* The supervisor path's run dir/ref (ipc://, 2 trainer ranks through mpirun, 2 workers). */
static void reference(const char *dir) {
    char out[16384];
    const int rc = run(dir, "ref", "--steps 4", out, sizeof out);
    reap(dir);
    if (rc) test_fail(__FILE__, __LINE__, "the supervisor run failed: %s", out);
}

/* The endpoint after `what` ("controller on ", "reward server on ") in a run's output, into ep. */
static int endpoint_in(const char *text, const char *what, char *ep, size_t cap) {
    const char *p = strstr(text, what);
    if (!p) return -1;
    p += strlen(what);
    size_t n = strcspn(p, " \n");
    if (n == 0 || n >= cap) return -1;
    memcpy(ep, p, n);
    ep[n] = 0;
    return 0;
}

TEST(launch_mpi_mpmd_equals_supervisor) {
    if (!have_mpirun()) return;
    const char *dir = setup();
    char out[65536], s[2048], ep[256];
    reference(dir);
    int rc = run(dir, "mpmd", "--steps 4 --launcher mpirun", out, sizeof out);
    CHECK_MSG(rc == 0, "the MPMD run failed: %s", out);
    CHECK_MSG(strstr(out, "-np 2 ") && strstr(out, "--role rollout-worker") && strstr(out, " : -np 1 "),
              "no MPMD mpirun line in: %s", out);
    CHECK_MSG(endpoint_in(out, "controller on ", ep, sizeof ep) == 0 && !strncmp(ep, "tcp://127.0.0.1:", 16),
              "controller endpoint: %s", out);
    CHECK_MSG(endpoint_in(out, "reward server on ", ep, sizeof ep) == 0 && !strncmp(ep, "tcp://127.0.0.1:", 16),
              "reward server endpoint: %s", out);
    CHECK(strstr(out, "0.0.0.0") == NULL);
    CHECK(reap(dir) == 0);
    check_same_as_ref(dir, "mpmd");
    CHECK(test_run(out, sizeof out, "grep -q 'reward-server: stats' %s/mpmd/logs/reward-server.log && "
                                    "grep -q 'worker-1' %s/mpmd/logs/worker-1.log && test -s %s/mpmd/logs/worker-0.log",
                   dir, dir, dir) == 0);
    /* the srun form: every rank the same command, roles from rank ranges (here under mpirun, SPMD) */
    sets(s, sizeof s, dir, "ranges");
    rc = test_run(out, sizeof out,
                  MPI_ENV "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpirun --oversubscribe --bind-to none --mca btl "
                          "self,vader --mca pml ob1 --mca oob_tcp_if_include lo -np 5 %s mpi-rank recipes/tiny-cpu.yaml "
                          "%s --steps 4",
                  test_vgrpo_bin(), s);
    CHECK_MSG(rc == 0, "the rank-range run failed: %s", out);
    CHECK(reap(dir) == 0);
    check_same_as_ref(dir, "ranges");
    cleanup(dir);
}

/* ---- a client without the run's keys ---- */

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The intruder: waits for the run's endpoints in log_path, then until killed connects to each (plain ZeroMQ, and
 * CURVE with keys of its own) and sends what could disturb the run; counts its attempts per channel and the
 * replies it ever got into count_path ("ATTEMPTS_CTL ATTEMPTS_REWARD REPLIES"). */
static void intruder(const char *log_path, const char *count_path) {
    static char text[1 << 16];
    char ctl[256], rew[256];
    for (;;) {
        test_slurp(log_path, text, sizeof text);
        if (!endpoint_in(text, "controller on ", ctl, sizeof ctl) && !endpoint_in(text, "reward server on ", rew, sizeof rew))
            break;
        sleep_ms(5);
    }
    core_curve_keys stranger;
    core_curve_generate(&stranger);
    void *ctx = zmq_ctx_new();
    long attempts[2] = {0, 0}, replies = 0;
    static const char *const msgs[2][3] = {
        {"{\"v\":1,\"type\":\"hello\",\"id\":\"h\",\"client\":\"worker-0\",\"policy_version\":0,"
         "\"model_xxh64\":\"0000000000000001\",\"experts\":1}",
         "{\"v\":1,\"type\":\"trajectory\",\"id\":\"r0-0\",\"policy_version\":0,\"samples\":[]}",
         "{\"v\":1,\"type\":\"shutdown\",\"id\":\"bye\"}"},
        {"{\"v\":1,\"type\":\"hello\",\"id\":\"h\",\"client\":\"worker-0\"}", "{\"v\":1,\"type\":\"shutdown\",\"id\":\"bye\"}",
         NULL}};
    for (long n = 0;; n++) {
        for (int ch = 0; ch < 2; ch++) {
            void *d = zmq_socket(ctx, ZMQ_DEALER);
            int linger = 0;
            zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
            if ((n & 1) && core_curve_client(d, &stranger, ch ? CORE_CURVE_REWARD : CORE_CURVE_CONTROLLER)) {
                zmq_close(d);
                continue;
            }
            zmq_connect(d, ch ? rew : ctl);
            for (int m = 0; m < 3 && msgs[ch][m]; m++) zmq_send(d, msgs[ch][m], strlen(msgs[ch][m]), ZMQ_DONTWAIT);
            zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
            if (zmq_poll(&it, 1, 30) > 0) replies++;
            zmq_close(d);
            attempts[ch]++;
        }
        /* written aside and renamed: the parent kills this process at any moment */
        char tmp[800];
        snprintf(tmp, sizeof tmp, "%s.tmp", count_path);
        FILE *f = fopen(tmp, "w");
        if (f) fprintf(f, "%ld %ld %ld\n", attempts[0], attempts[1], replies), fclose(f), rename(tmp, count_path);
    }
}

TEST(launch_mpi_refuses_clients_without_keys) {
    if (!have_mpirun()) return;
    const char *dir = setup();
    char out[65536], cmd[4096], log_path[700], count_path[700];
    reference(dir);
    snprintf(log_path, sizeof log_path, "%s/intruded.log", dir);
    snprintf(count_path, sizeof count_path, "%s/intruder.count", dir);
    fflush(stdout);
    fflush(stderr);
    pid_t in = fork();
    if (in == 0) {
        intruder(log_path, count_path);
        _exit(0);
    }
    cmdline(cmd, sizeof cmd, dir, "intruded", "--steps 4 --launcher mpirun");
    const int rc = test_run(out, sizeof out, "%s > %s 2>&1", cmd, log_path);
    kill(in, SIGKILL);
    waitpid(in, NULL, 0);
    char cnt[128] = "", log[65536] = "";
    test_slurp(count_path, cnt, sizeof cnt);
    test_slurp(log_path, log, sizeof log);
    long a_ctl = 0, a_rew = 0, replies = -1;
    sscanf(cnt, "%ld %ld %ld", &a_ctl, &a_rew, &replies);
    CHECK_MSG(rc == 0, "the intruded run failed: %s", log);
    CHECK(reap(dir) == 0);
    CHECK_MSG(a_ctl >= 3 && a_rew >= 3, "the intruder made %ld attempts on the controller, %ld on the reward server",
              a_ctl, a_rew);
    CHECK_MSG(replies == 0, "the intruder got %ld replies", replies);
    fprintf(stderr, "    intruder: %ld connections to the controller, %ld to the reward server, %ld replies\n", a_ctl,
            a_rew, replies);
    check_same_as_ref(dir, "intruded");
    cleanup(dir);
}

/* ---- lost processes under mpirun ---- */

TEST(launch_mpi_worker_leaves_run_goes_on) {
    if (!have_mpirun()) return;
    const char *dir = setup();
    char cmd[4096], out[65536];
    reference(dir);
    cmdline(cmd, sizeof cmd, dir, "t", "--steps 4 --launcher mpirun");
    /* worker-1 is world rank 3 (the trainer ranks are 0 and 1) */
    test_run(out, sizeof out,
             "%s > %s/t.log 2>&1 & pid=$!; i=0; while [ ! -e %s/t/checkpoint-1 ] && [ $i -lt 3000 ]; do sleep 0.01; "
             "i=$((i+1)); done; for p in $(pgrep -f '^[^ ]*vgrpo mpi-rank .*--role rollout-worker .*%s/t'); do "
             "if tr '\\0' '\\n' < /proc/$p/environ | grep -qx OMPI_COMM_WORLD_RANK=3; then kill -TERM $p; "
             "echo signalled=$?; fi; done; wait $pid; echo status=$?; cat %s/t.log %s/t/logs/worker-1.log",
             cmd, dir, dir, dir, dir, dir);
    const int left = reap(dir);
    CHECK_MSG(strstr(out, "signalled=0") && strstr(out, "status=0"), "got: %s", out);
    CHECK_MSG(strstr(out, "controller: worker-1 lost") && strstr(out, "left the run"), "got: %s", out);
    CHECK_MSG(left == 0, "%d process(es) of the run left", left);
    fprintf(stderr, "    %s\n", strstr(out, "re-issued to worker-0") ? "its chunk was re-issued to worker-0"
                                                                      : "it left between chunks");
    check_same_as_ref(dir, "t");
    cleanup(dir);
}

/* The run dir/name resumes from its latest checkpoint for one more step (MPMD). mpirun ends the job with SIGTERM,
 * then SIGKILL, so a checkpoint being saved may be cut short: its ".checkpoint-N.tmp" is a leftover the resume
 * skips (trainer/checkpoint/checkpoint.h). */
static void check_resumes(const char *dir, const char *name) {
    char x[2048], out[65536];
    snprintf(x, sizeof x, "%s/%s", dir, name);
    int64_t *steps = NULL;
    const int n = trainer_ckpt_list(x, &steps);
    REQUIRE(n >= 1);
    const int64_t last = steps[n - 1];
    free(steps);
    CHECK_MSG(last < 60, "the run finished before the kill (checkpoint-%lld)", (long long)last);
    snprintf(x, sizeof x, "--launcher mpirun --resume %s/%s --steps %lld", dir, name, (long long)last + 1);
    const int rc = run(dir, name, x, out, sizeof out);
    reap(dir);
    CHECK_MSG(rc == 0 && strstr(out, "resumed from"), "resume: status %d: %s", rc, out);
    snprintf(x, sizeof x, "%s/%s/checkpoint-%lld/trainer_state.json", dir, name, (long long)last + 1);
    struct stat sb;
    CHECK_MSG(stat(x, &sb) == 0, "no %s", x);
}

TEST(launch_mpi_killed_worker_ends_job) {
    if (!have_mpirun()) return;
    const char *dir = setup();
    char cmd[4096], out[65536];
    cmdline(cmd, sizeof cmd, dir, "k", "--steps 60 --launcher mpirun");
    /* one worker: the `vgrpo mpi-rank ... --role rollout-worker` process (not mpirun, whose arguments say the same) */
    test_run(out, sizeof out,
             "%s > %s/k.log 2>&1 & pid=$!; i=0; while [ ! -e %s/k/checkpoint-2 ] && [ $i -lt 600 ]; do sleep 0.05; "
             "i=$((i+1)); done; p=$(pgrep -f '^[^ ]*vgrpo mpi-rank .*--role rollout-worker .*%s/k' | head -1); "
             "kill -KILL $p; echo killed=$?; wait $pid; echo status=$?; cat %s/k.log",
             cmd, dir, dir, dir, dir);
    const int left = reap(dir);
    CHECK_MSG(strstr(out, "killed=0") && !strstr(out, "status=0"), "got: %s", out);
    CHECK_MSG(strstr(out, "exited on signal 9"), "mpirun did not name the killed rank: %s", out);
    CHECK_MSG(left == 0, "%d process(es) of the run left after it stopped", left);
    check_resumes(dir, "k");
    CHECK(reap(dir) == 0);
    cleanup(dir);
}

TEST(launch_mpi_sigusr2_stops_and_saves) {
    if (!have_mpirun()) return;
    const char *dir = setup();
    char cmd[4096], out[65536];
    cmdline(cmd, sizeof cmd, dir, "s", "--steps 60 --launcher mpirun");
    test_run(out, sizeof out,
             "%s > %s/s.log 2>&1 & pid=$!; i=0; while [ ! -e %s/s/checkpoint-1 ] && [ $i -lt 600 ]; do sleep 0.05; "
             "i=$((i+1)); done; kill -USR2 $pid; wait $pid; echo status=$?; cat %s/s.log",
             cmd, dir, dir, dir);
    const int left = reap(dir);
    CHECK_MSG(strstr(out, "status=1") && strstr(out, "stopped by signal 15") && strstr(out, "saved"), "got: %s", out);
    CHECK_MSG(!strstr(out, "MPI_ABORT") && !strstr(out, "exited on signal"), "not a clean stop: %s", out);
    CHECK_MSG(left == 0, "%d process(es) of the run left after it stopped", left);
    cleanup(dir);
}

/* ---- the address rules, the options ---- */

TEST(launch_mpi_host_addr_rules) {
    char a[64], how[128];
    const char *one[] = {"h1", "h1", "h1"};
    unsetenv(CORE_HOST_ADDR_ENV);
    REQUIRE_OK(core_host_addr_pick(NULL, "h1", one, 3, a, sizeof a, how, sizeof how));
    CHECK(!strcmp(a, "127.0.0.1") && strstr(how, "loopback"));
    REQUIRE_OK(core_host_addr_pick("127.0.0.1", "h1", one, 3, a, sizeof a, how, sizeof how));
    CHECK(!strcmp(a, "127.0.0.1") && !strcmp(how, "--bind-host"));
    REQUIRE_OK(core_host_addr_pick("lo", "h1", one, 3, a, sizeof a, NULL, 0)); /* an interface's name */
    CHECK(!strcmp(a, "127.0.0.1"));
    CHECK(core_host_addr_pick("0.0.0.0", "h1", one, 3, a, sizeof a, NULL, 0) == -1 && strstr(core_last_error(), "wildcard"));
    CHECK(core_host_addr_pick("*", "h1", one, 3, a, sizeof a, NULL, 0) == -1);
    CHECK(core_host_addr_pick("no-such-host.invalid", "h1", one, 3, a, sizeof a, NULL, 0) == -1);
    setenv(CORE_HOST_ADDR_ENV, "127.0.0.1", 1);
    REQUIRE_OK(core_host_addr_pick(NULL, "h1", one, 3, a, sizeof a, how, sizeof how));
    CHECK(!strcmp(a, "127.0.0.1") && !strcmp(how, CORE_HOST_ADDR_ENV));
    unsetenv(CORE_HOST_ADDR_ENV);
    REQUIRE_OK(core_host_addr_route("127.0.0.1", a, sizeof a));
    CHECK(!strcmp(a, "127.0.0.1"));
    /* two hosts: never a loopback route, never the wildcard; or an error that names --bind-host */
    const char *two[] = {"h1", "127.0.0.1", "no-such-host.invalid"};
    char self[256] = "";
    gethostname(self, sizeof self - 1);
    two[0] = self;
    if (core_host_addr_pick(NULL, self, two, 3, a, sizeof a, how, sizeof how) == 0)
        CHECK_MSG(strncmp(a, "127.", 4) && strcmp(a, "0.0.0.0"), "picked %s (%s)", a, how);
    else
        CHECK_MSG(strstr(core_last_error(), "--bind-host") != NULL, "%s", core_last_error());
}

TEST(launch_mpi_run_options) {
    char out[8192];
    const char *bin = test_vgrpo_bin();
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --launcher mpirun --max-restarts 2", bin) == 2 &&
          strstr(out, "--max-restarts: restarts are the supervisor's"));
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --hostfile hosts", bin) == 2 &&
          strstr(out, "go with --launcher mpirun"));
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --launcher slurm", bin) == 2 &&
          strstr(out, "expected supervisor or mpirun"));
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --launcher mpirun", bin) == 1 &&
          strstr(out, "--set mode=colocated"));
    CHECK(test_run(out, sizeof out, "%s mpi-rank --help", bin) == 0 && strstr(out, "srun"));
}
