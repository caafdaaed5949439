/* tests/test_reward_curve.c — `vgrpo reward-server` with the run's keys (core/curve.h; reward/PROTOCOL.md section
 * 6): the reward client with the client key is scored exactly; a peer without keys, or with another client key,
 * gets nothing (refused at the handshake, counted), and its `shutdown` does not stop the server; the run's client
 * may send `shutdown`. The ipc socket file is 0600 under umask 0, with keys and without; a key file others may
 * read is refused. */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "core/curve.h"
#include "core/wire.h"
#include "reward/client.h"
#include "tests/reward_thread_util.h"
#include "tests/test.h"
#include "tests/zmq_test_util.h"

enum { NV = 2, FR = 3, HH = 8, WW = 8 };

static void start(srv *s, const char *dir, const char *name, const char *keys_file) {
    snprintf(s->endpoint, sizeof s->endpoint, "ipc://%s/%s.sock", dir, name);
    snprintf(s->log, sizeof s->log, "%s/%s.log", dir, name);
    const char *argv[] = {test_vgrpo_bin(), "reward-server", "--bind", s->endpoint, "--scorers", "brightness:2",
                          keys_file ? "--keys-file" : NULL, keys_file, NULL};
    mode_t old = umask(0);
    srv_spawn(s, argv); /* s->sock: a DEALER without keys */
    umask(old);
}

static int sock_mode(const srv *s) {
    struct stat st;
    for (int i = 0; i < 200; i++) { /* the server binds on its own time */
        if (stat(s->endpoint + 6, &st) == 0) return (int)(st.st_mode & 0777);
        usleep(10000);
    }
    return -1;
}

TEST(reward_server_curve) {
    if (!core_curve_available()) {
        test_skip("libzmq without CURVE");
        return;
    }
    const char *dir = test_tmpdir(); /* once: each call empties it */
    /* Without keys the socket file is private too. */
    srv plain;
    start(&plain, dir, "plain", NULL);
    int mode = sock_mode(&plain);
    CHECK_MSG(mode == 0600, "keyless server's socket file has mode %o under umask 0", mode);
    CHECK(srv_stop(&plain) == 0);
    char out[8192];
    test_run(out, sizeof out, "cat %s", plain.log);
    CHECK_MSG(strstr(out, "not authenticated"), "log: %s", out);

    core_curve_keys all, server, client, stranger_all, stranger;
    REQUIRE_OK(core_curve_generate(&all));
    REQUIRE_OK(core_curve_generate(&stranger_all));
    core_curve_subset(&all, CORE_CURVE_REWARD, &server);
    core_curve_subset(&all, CORE_CURVE_CLIENT, &client);
    core_curve_subset(&stranger_all, CORE_CURVE_CLIENT, &stranger);
    memcpy(stranger.pub[CORE_CURVE_REWARD], all.pub[CORE_CURVE_REWARD], sizeof stranger.pub[0]); /* knows the server */
    char kpath[256], bad[256];
    snprintf(kpath, sizeof kpath, "%s/reward.keys", dir);
    snprintf(bad, sizeof bad, "%s/open.keys", dir);
    REQUIRE_OK(core_curve_write_file(kpath, &server));
    REQUIRE_OK(core_curve_write_file(bad, &server));
    REQUIRE(chmod(bad, 0644) == 0);
    int st = test_run(out, sizeof out, "%s reward-server --bind ipc://%s/x.sock --scorers brightness --keys-file %s",
                      test_vgrpo_bin(), dir, bad);
    CHECK_MSG(st == 1 && strstr(out, "chmod 600"), "status %d: %s", st, out);

    srv s;
    start(&s, dir, "keyed", kpath);
    mode = sock_mode(&s);
    CHECK_MSG(mode == 0600, "keyed server's socket file has mode %o under umask 0", mode);

    /* The run's client: scored exactly. */
    static uint8_t v[NV * FR * HH * WW * 3];
    rsrv_fill_videos(v, NV, FR, HH, WW, 3);
    const char *prompts[NV] = {"a", "b"};
    reward_result res[NV];
    reward_client *c = reward_client_open_keys(s.endpoint, "w0", 5.0, 2, &client);
    REQUIRE(c);
    int rc = reward_client_score(c, v, NV, FR, HH, WW, 16, prompts, NULL, res);
    CHECK_MSG(rc == 0, "keyed client: %s", rc ? core_last_error() : "");
    for (int i = 0; rc == 0 && i < NV; i++)
        CHECK(res[i].scores[0].value == rsrv_direct("brightness", v + (size_t)i * FR * HH * WW * 3, FR, HH, WW, "", NULL));
    reward_client_close(c);

    /* Another client key: refused at the handshake, so no answer. */
    c = reward_client_open_keys(s.endpoint, "w9", 0.5, 2, &stranger);
    REQUIRE(c);
    rc = reward_client_score(c, v, NV, FR, HH, WW, 16, prompts, NULL, res);
    CHECK_MSG(rc == -1 && strstr(core_last_error(), "no answer after 2 attempts"), "stranger: %s",
              rc ? core_last_error() : "scored");
    reward_client_close(c);

    /* No keys: the handshake cannot even start; a `shutdown` from it is not read. */
    int tmo = 300;
    zmq_setsockopt(s.sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    send_frames(s.sock, "{\"v\":1,\"type\":\"shutdown\",\"id\":\"bye\"}", NULL, 0, 0);
    char *r = recv_reply(s.sock);
    CHECK_MSG(r == NULL, "a keyless peer got a reply: %s", r ? r : "");
    free(r);
    CHECK(waitpid(s.pid, NULL, WNOHANG) == 0);

    /* The run's client may send `shutdown`: answered, and the server exits 0. */
    void *d = zmq_socket(s.ctx, ZMQ_DEALER);
    int zero = 0, five = 5000;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &five, sizeof five);
    REQUIRE_OK(core_curve_client(d, &client, CORE_CURVE_REWARD));
    REQUIRE(zmq_connect(d, s.endpoint) == 0);
    send_frames(d, "{\"v\":1,\"type\":\"shutdown\",\"id\":\"bye\"}", NULL, 0, 0);
    r = recv_reply(d);
    CHECK_MSG(r && strstr(r, "\"type\":\"shutdown\""), "reply to the run's shutdown: %s", r ? r : "(none)");
    free(r);
    zmq_close(d);
    int status = -1;
    for (int i = 0; i < 500 && waitpid(s.pid, &status, WNOHANG) != s.pid; i++) usleep(10000);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d after shutdown", status);
    if (!WIFEXITED(status)) kill(s.pid, SIGKILL), waitpid(s.pid, NULL, 0);
    zmq_close(s.sock);
    zmq_ctx_term(s.ctx);
    test_run(out, sizeof out, "cat %s", s.log);
    const char *line = strstr(out, "reward-server: stats:");
    long long refused = line && strstr(line, "refused ") ? strtoll(strstr(line, "refused ") + 8, NULL, 10) : -1;
    CHECK_MSG(line && strstr(line, "replies 1,") && refused >= 1, "log: %s", out);
    CHECK_MSG(strstr(out, "(CURVE)") && strstr(out, "not the run's client key"), "log: %s", out);
}
