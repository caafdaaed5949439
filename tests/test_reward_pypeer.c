/* tests/test_reward_pypeer.c — the Python reward server reward/examples/score_server.py, written from
 * reward/PROTOCOL.md alone, driven by the same DEALER client as the C server's test (tests/zmq_test_util.h):
 * hello, a batched score_request whose `mean_red` score and weighted total are recomputed here in double precision,
 * malformed messages (each an `error` with the right id and code, and the server keeps serving), repeated ids
 * (the same reply bytes, keyed by the hello's client id across connections; a re-used id with other videos is a
 * bad_request), SIGTERM and `shutdown` (exit 0), and with the run's keys (--keys-file): the C reward client with
 * the client key is scored, a peer without it gets nothing, and the ipc socket file is 0600 under umask 0.
 * Skipped when no python3 with the zmq and numpy modules is found (VGRPO_PYTHON overrides the interpreter). */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <sys/stat.h>

#include "core/curve.h"
#include "core/wire.h"
#include "reward/client.h"
#include "tests/test.h"
#include "tests/zmq_test_util.h"

#define PY_SCRIPT "reward/examples/score_server.py"

/* An interpreter that imports zmq and numpy, or NULL (looked up once per process: each try costs a Python start). */
static const char *find_python(void) {
    static int looked;
    static const char *found;
    const char *env = getenv("VGRPO_PYTHON");
    const char *cands[] = {env && *env ? env : "/usr/bin/python3", "python3"};
    for (int i = 0; i < 2 && !looked; i++)
        if (test_run(NULL, 0, "%s -c 'import zmq, numpy' >/dev/null 2>&1", cands[i]) == 0) found = cands[i], looked = 1;
    looked = 1;
    return found;
}

/* Starts the Python server on an ipc:// endpoint under the test's directory; 0, or -1 when it is skipped. */
static int py_start(srv *s, const char *scorers) {
    const char *py = find_python();
    if (!py) {
        test_skip("no python3 with the zmq and numpy modules (Debian: python3-zmq python3-numpy)");
        return -1;
    }
    const char *dir = test_tmpdir();
    snprintf(s->endpoint, sizeof s->endpoint, "ipc://%s/py.sock", dir);
    snprintf(s->log, sizeof s->log, "%s/server.log", dir);
    const char *argv[] = {py, PY_SCRIPT, "--bind", s->endpoint, "--scorers", scorers, NULL};
    srv_spawn(s, argv);
    return 0;
}

/* Waits up to 8 s for a reply on sock, failing early (with the server's log) if the server exits. */
static char *py_wait_reply(srv *s, void *sock) {
    for (int i = 0; i < 80; i++) {
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) == 1) return recv_reply(sock);
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            char out[4096];
            test_run(out, sizeof out, "cat %s", s->log);
            test_fail(__FILE__, __LINE__, "the Python server exited (status %d): %s", st, out);
            s->pid = -1;
            return NULL;
        }
    }
    return NULL;
}

static uint64_t lcg(uint64_t *x) {
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return *x >> 33;
}

/* Two 3-frame 4x5 videos of pseudo-random bytes and their mean red / 255, in double precision. */
#define NV 2
#define PER (3 * 4 * 5 * 3)
static uint8_t pv[NV * PER];
static double red_mean[NV];
static void make_py_videos(void) {
    uint64_t x = 777;
    for (size_t i = 0; i < sizeof pv; i++) pv[i] = (uint8_t)lcg(&x);
    for (int v = 0; v < NV; v++) {
        double sum = 0;
        for (int p = 0; p < PER / 3; p++) sum += pv[v * PER + 3 * p];
        red_mean[v] = sum / (PER / 3) / 255.0;
    }
}

static const char *PY_REQ = "{\"v\":1,\"type\":\"score_request\",\"id\":\"%s\",\"fps\":16,\"items\":[{\"prompt\":"
                            "\"a red car\"},{\"prompt\":\"a cat\",\"metadata\":{\"color\":\"blue\"}}],\"tensors\":[{"
                            "\"name\":\"videos\",\"dtype\":\"%s\",\"shape\":[2,3,4,5,3]}]}";

/* Checks a score_reply text: id, mean_red per video against the C value, total = 2.5 x mean_red, the scorers. */
static void check_py_reply(const char *r, const char *id, int line) {
    json_t *h = parse_reply(r, CORE_WIRE_SCORE_REPLY, id);
    json_t *rw = json_object_get(h, "rewards"), *sc = json_object_get(h, "scorers");
    if (json_array_size(rw) != NV || json_array_size(sc) != 1) {
        test_fail(__FILE__, line, "reply lacks 2 rewards or 1 scorer: %s", r);
    } else {
        for (int v = 0; v < NV; v++) {
            json_t *e = json_array_get(rw, (size_t)v);
            CHECK_NEAR(json_number_value(json_object_get(json_object_get(e, "scores"), "mean_red")), red_mean[v], 1e-12);
            CHECK_NEAR(json_number_value(json_object_get(e, "total")), 2.5 * red_mean[v], 1e-12);
        }
        json_t *s0 = json_array_get(sc, 0);
        const char *nm = json_string_value(json_object_get(s0, "name"));
        CHECK(nm && !strcmp(nm, "mean_red"));
        CHECK_NEAR(json_number_value(json_object_get(s0, "weight")), 2.5, 0);
    }
    json_decref(h);
}

TEST(reward_pypeer_protocol) {
    make_py_videos();
    CHECK(red_mean[0] > 0.3 && red_mean[0] < 0.7 && red_mean[0] != red_mean[1]); /* the data is not degenerate */
    srv s;
    if (py_start(&s, "mean_red:2.5") != 0) return;
    send_frames(s.sock, "{\"v\":1,\"type\":\"hello\",\"id\":\"h\",\"client\":\"py-test\"}", NULL, 0, 0);
    char *r = py_wait_reply(&s, s.sock);
    if (!r && s.pid > 0) kill(s.pid, SIGKILL), waitpid(s.pid, NULL, 0);
    REQUIRE(r);
    json_t *h = parse_reply(r, CORE_WIRE_HELLO, "h");
    const char *name = json_string_value(json_object_get(h, "server"));
    CHECK(name && !strcmp(name, "vgrpo-reward"));
    CHECK(json_integer_value(json_object_get(h, "max_videos_bytes")) == (json_int_t)16 << 20);
    CHECK(json_array_size(json_object_get(h, "scorers")) == 1);
    json_decref(h);
    free(r);

    char hdr[1024];
    snprintf(hdr, sizeof hdr, PY_REQ, "g1", "U8");
    send_frames(s.sock, hdr, pv, sizeof pv, 1);
    char *first = recv_reply(s.sock);
    REQUIRE(first);
    check_py_reply(first, "g1", __LINE__);

    /* Malformed messages: an error each, with the request's id when it could be read. */
    expect_error(&s, "\x01\x02garbage", NULL, 0, 0, "", "bad_request", "not valid JSON");
    expect_error(&s, "{\"v\":1,\"v\":1,\"type\":\"hello\",\"id\":\"d\",\"client\":\"c\"}", NULL, 0, 0, "d", "bad_request",
                 "duplicate key");
    snprintf(hdr, sizeof hdr, PY_REQ, "lie", "U8");
    expect_error(&s, hdr, pv, sizeof pv - 1, 1, "lie", "bad_request", "frame 1 (tensor \"videos\")");
    expect_error(&s, hdr, NULL, 0, 0, "lie", "bad_request", "lists 1 tensors but the message has 0");
    expect_error(&s, "{\"v\":1,\"type\":\"bogus\",\"id\":\"u\"}", NULL, 0, 0, "u", "bad_request", "unknown message type");
    expect_error(&s, "{\"v\":9,\"type\":\"hello\",\"id\":\"u\"}", NULL, 0, 0, "u", "bad_request",
                 "unsupported protocol version 9");
    expect_error(&s, "{\"v\":1,\"type\":\"trajectory\",\"id\":\"t\"}", NULL, 0, 0, "t", "unsupported", "trajectory");
    static uint8_t f32[sizeof pv * 4];
    snprintf(hdr, sizeof hdr, PY_REQ, "dt", "F32");
    expect_error(&s, hdr, f32, sizeof f32, 1, "dt", "bad_request", "U8 [N, F, H, W, 3]");
    expect_error(&s,
                 "{\"v\":1,\"type\":\"score_request\",\"id\":\"nofps\",\"items\":[{\"prompt\":\"a\"},{\"prompt\":\"b\"}],"
                 "\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[2,3,4,5,3]}]}",
                 pv, sizeof pv, 1, "nofps", "bad_request", "\"fps\"");

    /* Still serving a new request; a repeated id gets the first reply byte for byte. */
    snprintf(hdr, sizeof hdr, PY_REQ, "g2", "U8");
    send_frames(s.sock, hdr, pv, sizeof pv, 1);
    r = recv_reply(s.sock);
    REQUIRE(r);
    check_py_reply(r, "g2", __LINE__);
    free(r);
    snprintf(hdr, sizeof hdr, PY_REQ, "g1", "U8");
    send_frames(s.sock, hdr, pv, sizeof pv, 1);
    r = recv_reply(s.sock);
    REQUIRE(r);
    CHECK_MSG(!strcmp(r, first), "repeat reply differs:\n%s\n%s", r, first);
    free(r);
    /* A new connection with the same client id (a reconnected worker) is answered from the cache too. */
    void *d2 = srv_dealer(&s);
    send_frames(d2, "{\"v\":1,\"type\":\"hello\",\"id\":\"h2\",\"client\":\"py-test\"}", NULL, 0, 0);
    r = recv_reply(d2);
    CHECK(r != NULL);
    free(r);
    send_frames(d2, hdr, pv, sizeof pv, 1);
    r = recv_reply(d2);
    CHECK_MSG(r && !strcmp(r, first), "repeat on a new connection differs:\n%s\n%s", r ? r : "(none)", first);
    free(r);
    free(first);
    /* The same id with other videos is refused, naming the id (not answered with g1's score). */
    static uint8_t other[sizeof pv];
    memset(other, 7, sizeof other);
    send_frames(d2, hdr, other, sizeof other, 1);
    r = recv_reply(d2);
    REQUIRE(r);
    h = parse_reply(r, CORE_WIRE_ERROR, "g1");
    const char *why = json_string_value(json_object_get(h, "reason"));
    CHECK_MSG(why && strstr(why, "request id \"g1\" was already used"), "%s", r);
    json_decref(h);
    free(r);
    zmq_close(d2);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = srv_stop(&s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK_MSG(rc == 0, "exit status %d after SIGTERM", rc);
    CHECK((double)(t1.tv_sec - t0.tv_sec) < 3.0);
    char out[4096];
    test_run(out, sizeof out, "cat %s", s.log);
    CHECK_MSG(strstr(out, "stats: received 16, replies 6, errors 10, repeats 2, videos 4,"), "log: %s", out);
}

TEST(reward_pypeer_shutdown) {
    srv s;
    if (py_start(&s, "mean_red") != 0) return;
    send_frames(s.sock, "{\"v\":1,\"type\":\"shutdown\",\"id\":\"bye\"}", NULL, 0, 0);
    char *r = py_wait_reply(&s, s.sock);
    if (!r && s.pid > 0) kill(s.pid, SIGKILL), waitpid(s.pid, NULL, 0);
    REQUIRE(r);
    json_decref(parse_reply(r, CORE_WIRE_SHUTDOWN, "bye"));
    free(r);
    int st = -1, done = 0;
    for (int i = 0; i < 500 && !done; i++) {
        done = waitpid(s.pid, &st, WNOHANG) == s.pid;
        if (!done) usleep(10000);
    }
    if (!done) kill(s.pid, SIGKILL), waitpid(s.pid, NULL, 0);
    CHECK_MSG(done && WIFEXITED(st) && WEXITSTATUS(st) == 0, "after shutdown: exited %d, status %d", done, st);
    zmq_close(s.sock);
    zmq_ctx_term(s.ctx);
    /* Usage errors exit 2 and name the problem. */
    char out[4096];
    int rc = test_run(out, sizeof out, "%s %s --bind ipc://x --scorers nope:1", find_python(), PY_SCRIPT);
    CHECK_MSG(rc == 2 && strstr(out, "unknown scorer"), "status %d: %s", rc, out);
}

/* With the run's keys: a CURVE server that admits only the client key (PROTOCOL.md section 6). */
TEST(reward_pypeer_curve) {
    make_py_videos();
    const char *py = find_python();
    if (!py) {
        test_skip("no python3 with the zmq and numpy modules (Debian: python3-zmq python3-numpy)");
        return;
    }
    if (!core_curve_available()) {
        test_skip("libzmq without CURVE");
        return;
    }
    core_curve_keys all, server, client;
    REQUIRE_OK(core_curve_generate(&all));
    core_curve_subset(&all, CORE_CURVE_REWARD, &server);
    core_curve_subset(&all, CORE_CURVE_CLIENT, &client);
    const char *dir = test_tmpdir();
    char kpath[256];
    snprintf(kpath, sizeof kpath, "%s/reward.keys", dir);
    REQUIRE_OK(core_curve_write_file(kpath, &server));
    srv s;
    snprintf(s.endpoint, sizeof s.endpoint, "ipc://%s/pyk.sock", dir);
    snprintf(s.log, sizeof s.log, "%s/server.log", dir);
    const char *argv[] = {py, PY_SCRIPT, "--bind", s.endpoint, "--scorers", "mean_red:2.5", "--keys-file", kpath, NULL};
    mode_t old = umask(0);
    srv_spawn(&s, argv); /* s.sock: a DEALER without keys */
    umask(old);

    reward_client *c = reward_client_open_keys(s.endpoint, "py-keyed", 5.0, 3, &client);
    REQUIRE(c);
    const char *prompts[NV] = {"a red car", "a cat"};
    reward_result out[NV];
    int rc = reward_client_score(c, pv, NV, 3, 4, 5, 16, prompts, NULL, out);
    CHECK_MSG(rc == 0, "keyed client: %s", rc ? core_last_error() : "");
    for (int v = 0; rc == 0 && v < NV; v++) CHECK_NEAR(out[v].scores[0].value, red_mean[v], 1e-12);
    reward_client_close(c);
    struct stat st;
    CHECK(stat(s.endpoint + 6, &st) == 0 && (st.st_mode & 0777) == 0600);

    /* No keys: no handshake, so nothing is read; a `shutdown` from it does not stop the server. */
    int tmo = 500;
    zmq_setsockopt(s.sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    send_frames(s.sock, "{\"v\":1,\"type\":\"shutdown\",\"id\":\"bye\"}", NULL, 0, 0);
    char *r = recv_reply(s.sock);
    CHECK_MSG(r == NULL, "a keyless peer got a reply: %s", r ? r : "");
    free(r);
    CHECK(waitpid(s.pid, NULL, WNOHANG) == 0);
    CHECK(srv_stop(&s) == 0);
    char log[4096];
    test_run(log, sizeof log, "cat %s", s.log);
    CHECK_MSG(strstr(log, "received 2, replies 2, errors 0"), "log: %s", log); /* hello and the request */
}
