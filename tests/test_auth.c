/* tests/test_auth.c — the channels authenticate their peers (core/curve.h; docs/design.md section 3) and one unexpected
 * message never ends a run:
 *   - the controller in process (ctl_open with keys) and fake workers in a thread: a plain client and a client
 *     with another run's key never get through (the ZAP refusal is counted); a keyed peer's message before hello,
 *     a bad hello, a second hello, a hello during a rollout, a duplicate client id, replies to nothing and an
 *     error to nothing are answered (or dropped) and logged, and the rollout and the shutdown still complete;
 *   - the controller's ipc:// socket file is 0600 under umask 000;
 *   - a `vgrpo rollout-worker` with the run's keys never talks to a fake controller (a plain one, and one with
 *     another controller key): the fakes receive nothing; the real controller then gets its hello with the model
 *     hash unchanged;
 *   - a colocated `vgrpo run` with an intruder process (same user, without the run's keys) that keeps sending
 *     hellos, trajectories and shutdowns to the controller (plain, and with CURVE keys of its own) during the whole
 *     run: the run finishes with exactly the numbers of an undisturbed run;
 *   - two trainer ranks (mpirun): no process of the run listens on a non-loopback address except mpirun's own
 *     out-of-band listener (OpenMPI 4.1 binds it to 0.0.0.0 / [::] whatever the options; README), which the test
 *     names in its output. */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/curve.h"
#include "core/error.h"
#include "core/log.h"
#include "core/recipe.h"
#include "core/trajectory.h"
#include "core/wire_rollout.h"
#include "core/wire_zmq.h"
#include "rollout/pipeline.h"
#include "tests/metrics_rows.h"
#include "tests/test.h"
#include "trainer/net/controller.h"

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A DEALER in ctx: keys NULL = plain, else a CURVE client with keys' client pair expecting the controller key. */
static void *dealer(void *ctx, const char *ep, const core_curve_keys *keys) {
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    if (keys && core_curve_client(d, keys, CORE_CURVE_CONTROLLER)) return zmq_close(d), NULL;
    zmq_connect(d, ep);
    return d;
}

static void send_hdr(void *d, const char *hdr) { zmq_send(d, hdr, strlen(hdr), ZMQ_DONTWAIT); }

/* Receives one message on d within ms; returns its parsed form (0) or -1. */
static int recv_msg(void *d, int ms, core_wire_msg *m) {
    zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0) return -1;
    core_zmq_msg zm;
    if (core_zmq_recv(d, ZMQ_DONTWAIT, &zm)) return -1;
    int rc = core_zmq_parse(&zm, 0, NULL, m);
    core_zmq_msg_close(&zm);
    return rc;
}

/* Expects an error reply with this code on d. */
static int expect_error(void *d, const char *code) {
    core_wire_msg m;
    if (recv_msg(d, 3000, &m)) return 0;
    int ok = m.type == CORE_WIRE_ERROR && !strcmp(json_string_value(json_object_get(m.header, "code")), code);
    if (!ok) fprintf(stderr, "expected error %s, got %s %s\n", code, core_wire_type_name(m.type), json_dumps(m.header, 0));
    core_wire_msg_free(&m);
    return ok;
}

#define HELLO(client, hash) \
    "{\"v\":1,\"type\":\"hello\",\"id\":\"h\",\"client\":\"" client "\",\"policy_version\":0,\"model_xxh64\":\"" hash "\",\"experts\":[\"transformer\"]}"
#define H0 "00000000000000aa"

typedef struct {
    const char *ep;
    core_curve_keys run, stranger;
    int fails;    /* checks that failed in the thread */
    int finished; /* reached the end */
} peers_ctx;

#define PCHECK(c)                                                           \
    do {                                                                    \
        if (!(c)) {                                                         \
            fprintf(stderr, "%s:%d: peer check failed: %s\n", __FILE__, __LINE__, #c); \
            P->fails++;                                                     \
        }                                                                   \
    } while (0)

/* The fake workers: A (the run's key) is the one registered; B (the run's key) is a second peer; a plain client
 * and a stranger's key never get through. */
static void *peers_main(void *arg) {
    peers_ctx *P = arg;
    void *ctx = zmq_ctx_new();
    void *plain = dealer(ctx, P->ep, NULL), *strange = dealer(ctx, P->ep, &P->stranger);
    void *a = dealer(ctx, P->ep, &P->run), *b = dealer(ctx, P->ep, &P->run);
    send_hdr(plain, HELLO("worker-0", H0));
    send_hdr(strange, HELLO("worker-0", H0));
    /* before hello, then a hello without model hash: refused; then A registers */
    send_hdr(a, "{\"v\":1,\"type\":\"trajectory\",\"id\":\"x\",\"policy_version\":0,\"samples\":[]}");
    PCHECK(expect_error(a, "unexpected"));
    send_hdr(a, "{\"v\":1,\"type\":\"hello\",\"id\":\"h\",\"client\":\"worker-0\"}");
    PCHECK(expect_error(a, "bad_request"));
    send_hdr(a, "not json");
    PCHECK(expect_error(a, "bad_request"));
    send_hdr(a, HELLO("worker-0", H0));
    /* the controller now waits for nothing more: B's hello under the same id is refused */
    sleep_ms(200);
    send_hdr(b, HELLO("worker-0", H0));
    PCHECK(expect_error(b, "unexpected"));
    /* the rollout request arrives at A */
    core_wire_msg m;
    PCHECK(recv_msg(a, 10000, &m) == 0);
    if (m.type != CORE_WIRE_ROLLOUT_REQUEST) {
        P->fails++;
        goto out;
    }
    char rid[64];
    snprintf(rid, sizeof rid, "%s", m.id);
    core_rollout_request req;
    PCHECK(core_rollout_request_parse(&m, &req) == 0);
    core_wire_msg_free(&m);
    /* during the rollout: B says hello, A says hello again, A acks weights nobody sent, A answers another id, an
     * error answering nothing, a shutdown reply to nothing, a type the controller does not serve */
    send_hdr(b, HELLO("worker-9", H0));
    PCHECK(expect_error(b, "unexpected"));
    send_hdr(a, HELLO("worker-0", H0));
    PCHECK(expect_error(a, "unexpected"));
    send_hdr(a, "{\"v\":1,\"type\":\"weights_ack\",\"id\":\"w1-end\",\"policy_version\":1,\"model_xxh64\":\"" H0 "\"}");
    PCHECK(expect_error(a, "unexpected"));
    send_hdr(a, "{\"v\":1,\"type\":\"trajectory\",\"id\":\"r9-9\",\"policy_version\":0,\"samples\":[]}");
    PCHECK(expect_error(a, "unexpected"));
    send_hdr(a, "{\"v\":1,\"type\":\"shutdown\",\"id\":\"bye\"}");
    PCHECK(expect_error(a, "unexpected"));
    send_hdr(a, "{\"v\":1,\"type\":\"weights_begin\",\"id\":\"wb\",\"policy_version\":1,\"tensors_count\":1}");
    PCHECK(expect_error(a, "unsupported"));
    send_hdr(b, "{\"v\":1,\"type\":\"error\",\"id\":\"zz\",\"code\":\"internal\",\"reason\":\"x\",\"retryable\":false}");
    /* then the real answer */
    core_traj tr[4];
    uint64_t vh[4] = {1, 2, 3, 4};
    memset(tr, 0, sizeof tr);
    for (int j = 0; j < req.n && j < 4; j++) {
        tr[j].uid = req.samples[j].uid, tr[j].prompt_index = req.samples[j].prompt_index;
        const char *names[1] = {"color_match"};
        const float vals[1] = {0.5f + (float)j};
        core_traj_set_rewards(&tr[j], 1, names, vals, vals[0]);
    }
    core_wire_built bt;
    PCHECK(core_trajectory_reply_build_v(rid, 0, req.n, tr, vh, 0, NULL, NULL, NULL, &bt) == 0);
    core_zmq_send(a, NULL, 0, &bt);
    core_wire_built_free(&bt);
    for (int j = 0; j < req.n && j < 4; j++) core_traj_free(&tr[j]);
    core_rollout_request_free(&req);
    /* the shutdown */
    PCHECK(recv_msg(a, 10000, &m) == 0);
    PCHECK(m.type == CORE_WIRE_SHUTDOWN);
    core_wire_msg_free(&m);
    send_hdr(a, "{\"v\":1,\"type\":\"shutdown\",\"id\":\"bye\"}");
    /* the plain client and the stranger never got anything */
    PCHECK(recv_msg(plain, 0, &m) != 0 && recv_msg(strange, 0, &m) != 0);
    P->finished = 1;
out:
    zmq_close(plain), zmq_close(strange), zmq_close(a), zmq_close(b);
    zmq_ctx_term(ctx);
    return NULL;
}

TEST(auth_controller_refuses_and_goes_on) {
    char sock[64] = "/tmp/vgrpo-a-XXXXXX", ep[128];
    REQUIRE(mkdtemp(sock));
    snprintf(ep, sizeof ep, "ipc://%s/ctl", sock);
    core_curve_keys all, ctl_keys;
    peers_ctx P = {.ep = ep};
    REQUIRE_OK(core_curve_generate(&all));
    REQUIRE_OK(core_curve_generate(&P.stranger));
    core_curve_subset(&all, CORE_CURVE_CONTROLLER, &ctl_keys);
    core_curve_subset(&all, CORE_CURVE_CLIENT, &P.run);
    /* the stranger knows the controller's public key, but its own client pair is not the run's */
    memcpy(P.stranger.pub[CORE_CURVE_CONTROLLER], all.pub[CORE_CURVE_CONTROLLER], sizeof all.pub[0]);
    ctl_server *c = ctl_open(ep, &ctl_keys, 1 << 20, NULL, NULL);
    REQUIRE(c);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, peers_main, &P) == 0);
    int rc = ctl_wait_workers(c, 1, 20.0);
    CHECK_MSG(rc == 0, "%s", core_last_error());
    CHECK(ctl_n_workers(c) == 1 && !strcmp(ctl_worker_id(c, 0), "worker-0"));
    core_rollout_sample s[3] = {{.uid = 7, .prompt_index = 0, .prompt = "a red car"},
                                {.uid = 8, .prompt_index = 0, .prompt = "a red car"},
                                {.uid = 9, .prompt_index = 1, .prompt = "a blue car"}};
    core_rollout_request tmpl = {.policy_version = 0, .stream = CORE_STREAM_EVAL_NOISE, .eta = 0};
    core_rollout_result res[3];
    if (rc == 0) {
        rc = ctl_rollout(c, &tmpl, s, 3, 4, 20.0, res, NULL, NULL);
        CHECK_MSG(rc == 0, "rollout: %s", core_last_error());
        for (int j = 0; rc == 0 && j < 3; j++) {
            CHECK(res[j].traj.uid == s[j].uid && res[j].traj.reward_total == 0.5f + (float)j);
            core_rollout_result_free(&res[j]);
        }
    }
    ctl_shutdown(c, 5.0);
    pthread_join(th, NULL);
    CHECK(P.fails == 0 && P.finished);
    CHECK(ctl_refused(c) >= 10); /* the keyed peers' refusals and the stranger's handshake(s) */
    ctl_close(c);
    rmdir(sock);
}

TEST(auth_controller_socket_file_private) {
    char ep[600], path[600];
    snprintf(path, sizeof path, "%s/ctl", test_tmpdir());
    snprintf(ep, sizeof ep, "ipc://%s", path);
    mode_t old = umask(0);
    ctl_server *c = ctl_open(ep, NULL, 1 << 20, NULL, NULL);
    umask(old);
    REQUIRE(c);
    struct stat st;
    REQUIRE(stat(path, &st) == 0);
    CHECK_MSG((st.st_mode & 0777) == 0600, "mode %04o", (unsigned)(st.st_mode & 0777));
    ctl_close(c);
}

/* A `vgrpo rollout-worker` with keys (client subset) through an inherited memfd. */
static pid_t start_worker(const char *dir, const char *ctl_ep, const char *rew_ep, const core_curve_keys *keys) {
    int fd = core_curve_memfd(keys);
    if (fd < 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char lp[700], mset[700], fds[16];
        snprintf(lp, sizeof lp, "%s/worker.log", dir);
        snprintf(mset, sizeof mset, "model.path=%s/model", dir);
        snprintf(fds, sizeof fds, "%d", fd);
        FILE *f = freopen(lp, "w", stderr);
        (void)f;
        fcntl(fd, F_SETFD, 0);
        execl(test_vgrpo_bin(), test_vgrpo_bin(), "rollout-worker", "recipes/tiny-cpu.yaml", "--controller", ctl_ep,
              "--reward", rew_ep, "--id", "worker-t", "--keys-fd", fds, "--set", mset, "--set", "rollout.num_steps=2",
              (char *)NULL);
        _exit(127);
    }
    close(fd);
    return pid;
}

/* A fake controller bound at ep for ms: plain (keys NULL) or a CURVE server with keys' controller pair and a ZAP
 * handler that lets the run's client in. Returns how many messages it received. */
static int fake_controller(const char *ep, const core_curve_keys *keys, const char *allow_client, int ms) {
    void *ctx = zmq_ctx_new();
    core_curve_zap *z = NULL;
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0, got = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &linger, sizeof linger);
    if (keys) {
        const char *allow[] = {allow_client};
        z = core_curve_zap_start(ctx, allow, 1, "fake controller");
        core_curve_server(r, keys, CORE_CURVE_CONTROLLER);
    }
    if (zmq_bind(r, ep) == 0)
        for (int t = 0; t < ms / 50; t++) {
            zmq_pollitem_t it = {r, 0, ZMQ_POLLIN, 0};
            if (zmq_poll(&it, 1, 50) > 0) {
                core_zmq_msg zm;
                if (core_zmq_recv(r, ZMQ_DONTWAIT, &zm) == 0) {
                    got++;
                    /* a real attacker would now push all-zero weights to this routing id */
                    core_zmq_msg_close(&zm);
                }
            }
        }
    zmq_close(r);
    core_curve_zap_stop(z);
    zmq_ctx_term(ctx);
    return got;
}

TEST(auth_worker_ignores_fake_controller) {
    const char *dir = test_tmpdir();
    char sock[64] = "/tmp/vgrpo-f-XXXXXX", ctl_ep[128], rew_ep[128], mset[700], wlog[700];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", test_vgrpo_bin(), dir) == 0);
    REQUIRE(mkdtemp(sock));
    snprintf(ctl_ep, sizeof ctl_ep, "ipc://%s/ctl", sock);
    snprintf(rew_ep, sizeof rew_ep, "ipc://%s/rew", sock);
    core_curve_keys all, wk, ctl_keys, stranger;
    REQUIRE_OK(core_curve_generate(&all));
    REQUIRE_OK(core_curve_generate(&stranger));
    core_curve_subset(&all, CORE_CURVE_CLIENT, &wk);
    core_curve_subset(&all, CORE_CURVE_CONTROLLER, &ctl_keys);
    /* the worker's expected model hash */
    snprintf(mset, sizeof mset, "model.path=%s/model", dir);
    const char *sets[2] = {mset, "rollout.num_steps=2"};
    core_recipe r;
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", sets, 2));
    rollout_pipeline p;
    REQUIRE_OK(rollout_pipeline_load(&p, &r, NULL));
    const wan_model *ms[1] = {&p.model[0]};
    uint64_t want_hash;
    REQUIRE_OK(wan_models_hash(ms, 1, &want_hash));
    rollout_pipeline_free(&p);
    core_recipe_release(&r);

    pid_t wpid = -1;
    int got_plain = -1, got_curve = -1;
    /* fake 1, plain: bound before the worker starts, so the worker's first connection goes to it */
    void *fctx = zmq_ctx_new();
    void *fr = zmq_socket(fctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(fr, ZMQ_LINGER, &linger, sizeof linger);
    REQUIRE(zmq_bind(fr, ctl_ep) == 0);
    wpid = start_worker(dir, ctl_ep, rew_ep, &wk);
    REQUIRE(wpid > 0);
    got_plain = 0;
    for (int t = 0; t < 60; t++) {
        zmq_pollitem_t it = {fr, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) > 0) {
            core_zmq_msg zm;
            if (core_zmq_recv(fr, ZMQ_DONTWAIT, &zm) == 0) got_plain++, core_zmq_msg_close(&zm);
        }
    }
    zmq_close(fr);
    zmq_ctx_term(fctx);
    /* fake 2: CURVE with another controller key (it even admits the run's client key): the worker refuses it */
    core_curve_keys fake = stranger;
    got_curve = fake_controller(ctl_ep, &fake, all.pub[CORE_CURVE_CLIENT], 1500);
    CHECK_MSG(got_plain == 0, "a plain fake controller received %d message(s) from the worker", got_plain);
    CHECK_MSG(got_curve == 0, "a fake controller with another key received %d message(s)", got_curve);
    /* the real controller: the worker's hello, with its weights untouched */
    ctl_server *c = ctl_open(ctl_ep, &ctl_keys, 1 << 20, NULL, NULL);
    REQUIRE(c);
    int rc = ctl_wait_workers(c, 1, 30.0);
    CHECK_MSG(rc == 0, "%s", core_last_error());
    if (rc == 0) {
        CHECK(!strcmp(ctl_worker_id(c, 0), "worker-t"));
        CHECK(ctl_worker_hello_hash(c, 0) == want_hash);
    }
    ctl_shutdown(c, 5.0);
    ctl_close(c);
    int st = -1;
    for (int t = 0; t < 500 && waitpid(wpid, &st, WNOHANG) == 0; t++) sleep_ms(20);
    if (st == -1) kill(wpid, SIGKILL), waitpid(wpid, &st, 0);
    snprintf(wlog, sizeof wlog, "%s/worker.log", dir);
    char logtext[8192] = "";
    test_slurp(wlog, logtext, sizeof logtext);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker status %d; log: %s", st, logtext);
    CHECK(strstr(logtext, "(CURVE)") && !strstr(logtext, "applied"));
    rmdir(sock);
}

/* ---- a colocated run with an intruder ---- */

/* The --controller endpoint of the trainer process whose command line names run_dir, into ep; 0 when found. */
static int find_controller(const char *run_dir, char *ep, size_t cap) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char p[300], buf[16384];
        snprintf(p, sizeof p, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(p, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        int is_trainer = 0, names_dir = 0;
        const char *ctl = NULL;
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
            if (!strcmp(buf + i, "trainer")) is_trainer = 1;
            if (strstr(buf + i, run_dir)) names_dir = 1;
            if (!strcmp(buf + i, "--controller") && i + strlen(buf + i) + 1 < n) ctl = buf + i + strlen(buf + i) + 1;
        }
        if (is_trainer && names_dir && ctl) snprintf(ep, cap, "%s", ctl), found = 1;
    }
    if (d) closedir(d);
    return found ? 0 : -1;
}

/* The intruder process: until killed, keeps connecting to the run's controller (plain, and with a stranger's CURVE
 * key) and sending hellos, trajectories and shutdowns; writes its attempt count to count_path. */
static void intruder(const char *run_dir, const char *count_path) {
    char ep[300];
    while (find_controller(run_dir, ep, sizeof ep)) sleep_ms(5);
    core_curve_keys stranger;
    core_curve_generate(&stranger);
    void *ctx = zmq_ctx_new();
    for (long n = 1;; n++) {
        void *d = dealer(ctx, ep, (n & 1) ? NULL : &stranger);
        if (d) {
            send_hdr(d, HELLO("worker-0", H0));
            send_hdr(d, "{\"v\":1,\"type\":\"trajectory\",\"id\":\"r0-0\",\"policy_version\":0,\"samples\":[]}");
            send_hdr(d, "{\"v\":1,\"type\":\"shutdown\",\"id\":\"bye\"}");
            sleep_ms(30);
            zmq_close(d);
        }
        /* written aside and renamed: the parent kills this process at any moment, and a file cut open by
         * fopen("w") would read as 0 attempts */
        char tmp[800];
        snprintf(tmp, sizeof tmp, "%s.tmp", count_path);
        FILE *f = fopen(tmp, "w");
        if (f) fprintf(f, "%ld\n", n), fclose(f), rename(tmp, count_path);
    }
}

#define RUNSET                                                                                                    \
    "--set rollout.num_steps=4 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 "              \
    "--set data.eval_samples_per_prompt=1 --set logging.eval_every=2 --set checkpoint.every=-1"

static int run_colocated(const char *dir, const char *name, const char *extra, char *out, size_t cap) {
    return test_run(out, cap,
                    "env OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml --set mode=colocated --set model.path=%s/model "
                    "--set data.prompt_file=%s/prompts.txt --set data.eval_prompt_file=%s/prompts.txt "
                    "--set logging.run_dir=%s/%s " RUNSET " %s",
                    test_vgrpo_bin(), dir, dir, dir, dir, name, extra);
}

static void make_inputs(const char *dir) {
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 2 >/dev/null && "
                              "printf 'a red kite\\na green frog\\na blue boat\\n' > %s/prompts.txt",
                     test_vgrpo_bin(), dir, dir) == 0);
}

static void check_same_rows(const char *dir, const char *a, const char *b, int n_expect) {
    char pa[800], pb[800];
    json_t *ra[16], *rb[16];
    snprintf(pa, sizeof pa, "%s/%s/metrics.jsonl", dir, a);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", dir, b);
    int na = read_rows(pa, ra, 16, 0), nb = read_rows(pb, rb, 16, 0);
    CHECK_MSG(na == n_expect && nb == n_expect, "rows: %d and %d, expected %d", na, nb, n_expect);
    for (int i = 0; i < na && i < nb; i++) CHECK_MSG(json_equal(ra[i], rb[i]), "metrics row %d differs", i);
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
}

TEST(auth_colocated_run_survives_intruder) {
    const char *dir = test_tmpdir();
    char out[16384], count_path[700], run_dir[700];
    make_inputs(dir);
    int rc = run_colocated(dir, "ref", "--steps 3", out, sizeof out);
    REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "reference run: %s", out), -1) : 0);
    snprintf(count_path, sizeof count_path, "%s/intruder.count", dir);
    snprintf(run_dir, sizeof run_dir, "%s/intruded", dir);
    pid_t in = fork();
    if (in == 0) {
        intruder(run_dir, count_path);
        _exit(0);
    }
    rc = run_colocated(dir, "intruded", "--steps 3", out, sizeof out);
    kill(in, SIGKILL);
    waitpid(in, NULL, 0);
    char cnt[64] = "";
    test_slurp(count_path, cnt, sizeof cnt);
    CHECK_MSG(rc == 0, "the intruded run failed: %s", out);
    CHECK_MSG(atol(cnt) >= 3, "the intruder made %ld attempts", atol(cnt));
    check_same_rows(dir, "ref", "intruded", 4);
    CHECK(test_run(out, sizeof out, "cmp %s/ref/rewards.jsonl %s/intruded/rewards.jsonl", dir, dir) == 0);
}

/* ---- MPI: listening sockets of a two-rank run ---- */

/* Socket inode -> "addr:port" of every TCP listener (/proc/net/tcp and tcp6); returns the count. */
typedef struct {
    unsigned long inode;
    char addr[64];
} listener;

static int tcp_listeners(listener *L, int cap) {
    const char *files[2] = {"/proc/net/tcp", "/proc/net/tcp6"};
    int n = 0;
    for (int f = 0; f < 2; f++) {
        FILE *fp = fopen(files[f], "r");
        char line[512];
        if (!fp) continue;
        if (!fgets(line, sizeof line, fp)) line[0] = 0; /* the column titles */
        while (n < cap && fgets(line, sizeof line, fp)) {
            char local[80], remote[80];
            unsigned st;
            unsigned long inode;
            if (sscanf(line, " %*d: %79s %79s %x %*s %*s %*s %*s %*s %lu", local, remote, &st, &inode) != 4) continue;
            if (st != 0x0A) continue; /* LISTEN */
            L[n].inode = inode;
            char *colon = strrchr(local, ':');
            unsigned port = colon ? (unsigned)strtoul(colon + 1, NULL, 16) : 0;
            if (colon) *colon = 0;
            const int loop = f == 0 ? !strcmp(local, "0100007F")
                                    : !strcmp(local, "00000000000000000000000001000000");
            const int any = strspn(local, "0") == strlen(local);
            snprintf(L[n].addr, sizeof L[n].addr, "%s:%u", loop ? "loopback" : any ? (f ? "[::]" : "0.0.0.0") : local, port);
            n++;
        }
        fclose(fp);
    }
    return n;
}

TEST(auth_mpi_two_ranks_listen_on_loopback_only) {
    if (access("/usr/bin/mpirun", X_OK)) {
        test_skip("no /usr/bin/mpirun");
        return;
    }
    const char *dir = test_tmpdir();
    char out[16384], run_dir[700], cmd[4096];
    make_inputs(dir);
    snprintf(run_dir, sizeof run_dir, "%s/mpi", dir);
    snprintf(cmd, sizeof cmd,
             "env OMP_NUM_THREADS=1 %s run recipes/tiny-cpu.yaml --set mode=colocated --set model.path=%s/model "
             "--set data.prompt_file=%s/prompts.txt --set data.eval_prompt_file=%s/prompts.txt "
             "--set logging.run_dir=%s " RUNSET " --set parallel.trainer_ranks=2 --steps 6 > %s/run.log 2>&1",
             test_vgrpo_bin(), dir, dir, dir, run_dir, dir);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* while it runs: every listener of a process whose command line names the run's folder (the vgrpo processes
     * and mpirun, whose arguments carry them) */
    char seen[32][160];
    int n_seen = 0, samples = 0, ranks_seen = 0, st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        listener L[512];
        const int nl = tcp_listeners(L, 512);
        DIR *d = opendir("/proc");
        struct dirent *e;
        int ranks = 0;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
            char p[300], buf[16384], exe[64] = "";
            snprintf(p, sizeof p, "/proc/%s/cmdline", e->d_name);
            FILE *f = fopen(p, "r");
            if (!f) continue;
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            int mine = 0, trainer = 0;
            for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
                if (strstr(buf + i, run_dir)) mine = 1;
                if (!strcmp(buf + i, "trainer")) trainer = 1;
            }
            if (!mine) continue;
            snprintf(exe, sizeof exe, "%s", strrchr(buf, '/') ? strrchr(buf, '/') + 1 : buf);
            if (trainer && !strcmp(exe, "vgrpo")) ranks++;
            snprintf(p, sizeof p, "/proc/%s/fd", e->d_name);
            DIR *fd = opendir(p);
            struct dirent *fe;
            while (fd && (fe = readdir(fd))) {
                char lp[400], target[128];
                snprintf(lp, sizeof lp, "%s/%s", p, fe->d_name);
                ssize_t tl = readlink(lp, target, sizeof target - 1);
                if (tl <= 0) continue;
                target[tl] = 0;
                unsigned long ino;
                if (sscanf(target, "socket:[%lu]", &ino) != 1) continue;
                for (int k = 0; k < nl; k++) {
                    if (L[k].inode != ino) continue;
                    char item[160];
                    snprintf(item, sizeof item, "%s%s %s", exe, trainer ? " (trainer)" : "", L[k].addr);
                    int dup = 0;
                    for (int s = 0; s < n_seen; s++) dup |= !strcmp(seen[s], item);
                    if (!dup && n_seen < 32) snprintf(seen[n_seen++], sizeof seen[0], "%s", item);
                }
            }
            if (fd) closedir(fd);
        }
        if (d) closedir(d);
        if (ranks == 2) ranks_seen++;
        samples++;
        sleep_ms(100);
    }
    char log[16384] = "";
    snprintf(out, sizeof out, "%s/run.log", dir);
    test_slurp(out, log, sizeof log);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the run failed: %s", log);
    CHECK_MSG(ranks_seen >= 2, "two trainer ranks seen in %d of %d samples", ranks_seen, samples);
    int bad = 0;
    for (int s = 0; s < n_seen; s++) {
        const int open_to_all = strstr(seen[s], "0.0.0.0:") || strstr(seen[s], "[::]:");
        const int loopback = strstr(seen[s], "loopback:") != NULL;
        const int is_mpirun = !strncmp(seen[s], "mpirun ", 7);
        fprintf(stderr, "    listening: %s%s\n", seen[s],
                is_mpirun && !loopback ? "  (mpirun's out-of-band channel: OpenMPI binds it to every address)" : "");
        if (!loopback && !(is_mpirun && open_to_all)) bad++;
    }
    CHECK_MSG(bad == 0, "%d listener(s) of the run's processes on non-loopback addresses (see the lines above)", bad);
}
