/* tests/test_curve.c — core/curve.h: key text round trip and refusals, keys through an inherited descriptor and a
 * 0600 key file, and CURVE + ZAP on ipc:// and tcp://: the run's client gets through, a client with other keys, a
 * plain (NULL) client and a client expecting another server key do not, and each refusal is counted. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "core/curve.h"
#include "core/error.h"
#include "tests/test.h"

TEST(curve_keys_text_roundtrip) {
    REQUIRE(core_curve_available());
    core_curve_keys k, back, sub;
    REQUIRE_OK(core_curve_generate(&k));
    for (int r = 0; r < CORE_CURVE_N_ROLES; r++) CHECK(core_curve_has(&k, r, 1));
    CHECK(strcmp(k.pub[0], k.pub[1]) && strcmp(k.pub[1], k.pub[2]));
    char text[CORE_CURVE_TEXT_MAX];
    REQUIRE_OK(core_curve_format(&k, text, sizeof text));
    CHECK(!strncmp(text, "vgrpo-keys 1\n", 13));
    REQUIRE_OK(core_curve_parse(text, strlen(text), &back));
    CHECK(!memcmp(&k, &back, sizeof k));
    /* a worker's subset: every public key, only the client secret */
    core_curve_subset(&k, CORE_CURVE_CLIENT, &sub);
    CHECK(core_curve_has(&sub, CORE_CURVE_CLIENT, 1) && core_curve_has(&sub, CORE_CURVE_CONTROLLER, 0));
    CHECK(!core_curve_has(&sub, CORE_CURVE_CONTROLLER, 1) && !core_curve_has(&sub, CORE_CURVE_REWARD, 1));
    REQUIRE_OK(core_curve_format(&sub, text, sizeof text));
    CHECK(!strstr(text, "controller-secret") && !strstr(text, k.sec[CORE_CURVE_CONTROLLER]));
    CHECK(strstr(text, "client-secret") != NULL);
    /* CRLF, comments and blank lines */
    char crlf[512];
    snprintf(crlf, sizeof crlf, "# keys\r\nvgrpo-keys 1\r\n\r\nreward-public %s\r\n", k.pub[1]);
    REQUIRE_OK(core_curve_parse(crlf, strlen(crlf), &back));
    CHECK(!strcmp(back.pub[1], k.pub[1]) && !back.pub[0][0] && !back.sec[1][0]);
}

TEST(curve_keys_text_refusals) {
    core_curve_keys k, other, out;
    REQUIRE_OK(core_curve_generate(&k));
    REQUIRE_OK(core_curve_generate(&other));
    char t[1024];
    const struct {
        const char *fmt, *want;
    } bad[] = {
        {"", "empty"},
        {"vgrpo-keys 2\n", "vgrpo-keys 1"},
        {"vgrpo-keys 1\nworker-public %s\n", "unknown item"},
        {"vgrpo-keys 1\nclient-public abc\n", "40 Z85"},
        {"vgrpo-keys 1\nclient-public %s\nclient-public %s\n", "twice"},
        {"vgrpo-keys 1\nclient-public\n", "expected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(t, sizeof t, bad[i].fmt, k.pub[2], k.pub[2]);
        CHECK_MSG(core_curve_parse(t, strlen(t), &out) == -1 && strstr(core_last_error(), bad[i].want),
                  "case %zu: %s", i, core_last_error());
    }
    /* a secret without its public, a secret of another key pair: refused without quoting the secret */
    snprintf(t, sizeof t, "vgrpo-keys 1\nclient-secret %s\n", k.sec[2]);
    CHECK(core_curve_parse(t, strlen(t), &out) == -1 && strstr(core_last_error(), "without client-public"));
    snprintf(t, sizeof t, "vgrpo-keys 1\nclient-public %s\nclient-secret %s\n", k.pub[2], other.sec[2]);
    CHECK(core_curve_parse(t, strlen(t), &out) == -1 && strstr(core_last_error(), "does not belong"));
    CHECK(!strstr(core_last_error(), other.sec[2]));
    CHECK(!out.pub[2][0]); /* nothing kept on failure */
    /* a NUL byte or other non-printable byte */
    memcpy(t, "vgrpo-keys 1\n\x01\n", 15);
    CHECK(core_curve_parse(t, 15, &out) == -1 && strstr(core_last_error(), "printable"));
}

TEST(curve_keys_fd_and_file) {
    core_curve_keys k, got;
    int have = 0;
    REQUIRE_OK(core_curve_generate(&k));
    /* a memfd read twice (two children share it: pread from 0), then closed by the reader */
    int fd = core_curve_memfd(&k);
    REQUIRE(fd >= 0);
    CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    int fd2 = dup(fd);
    REQUIRE_OK(core_curve_read_fd(fd, &got));
    CHECK(!memcmp(&k, &got, sizeof k));
    CHECK(fcntl(fd, F_GETFD) < 0); /* closed */
    REQUIRE_OK(core_curve_options(fd2, NULL, &got, &have));
    CHECK(have == 1 && !memcmp(&k, &got, sizeof k));
    /* a pipe works too */
    int p[2];
    REQUIRE(pipe(p) == 0);
    char text[CORE_CURVE_TEXT_MAX];
    REQUIRE_OK(core_curve_format(&k, text, sizeof text));
    REQUIRE(write(p[1], text, strlen(text)) == (ssize_t)strlen(text));
    close(p[1]);
    REQUIRE_OK(core_curve_read_fd(p[0], &got));
    CHECK(!memcmp(&k, &got, sizeof k));
    CHECK(core_curve_read_fd(987, &got) == -1 && strstr(core_last_error(), "--keys-fd 987: not an open"));
    /* a file: written 0600 whatever the umask, refused when others may read it or when it is a symlink */
    char path[512], link[600];
    snprintf(path, sizeof path, "%s/run.keys", test_tmpdir());
    snprintf(link, sizeof link, "%s.link", path);
    mode_t old = umask(0);
    int wrc = core_curve_write_file(path, &k);
    umask(old);
    REQUIRE_OK(wrc);
    struct stat st;
    REQUIRE(stat(path, &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    CHECK(core_curve_write_file(path, &k) == -1); /* exists */
    REQUIRE_OK(core_curve_load_file(path, &got));
    CHECK(!memcmp(&k, &got, sizeof k));
    REQUIRE(chmod(path, 0640) == 0);
    CHECK(core_curve_load_file(path, &got) == -1 && strstr(core_last_error(), "mode 0640") &&
          strstr(core_last_error(), "chmod 600"));
    REQUIRE(chmod(path, 0400) == 0);
    REQUIRE_OK(core_curve_load_file(path, &got));
    REQUIRE(symlink(path, link) == 0);
    CHECK(core_curve_load_file(link, &got) == -1 && strstr(core_last_error(), "symlink"));
    CHECK(core_curve_options(3, path, &got, &have) == -1 && strstr(core_last_error(), "one of them"));
    REQUIRE_OK(core_curve_options(-1, NULL, &got, &have));
    CHECK(have == 0 && !got.pub[0][0]);
    unlink(link);
    unlink(path);
}

/* A DEALER in ctx that connects to ep with keys kc (NULL: plain) expecting server key of `server`, sends "ping"
 * and waits up to ms for "pong"; returns 1 when the reply came. */
static int try_client(void *ctx, const char *ep, const core_curve_keys *kc, core_curve_role server, void *router, int ms) {
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    if (kc && core_curve_client(d, kc, server)) {
        zmq_close(d);
        return -1;
    }
    zmq_connect(d, ep);
    zmq_send(d, "ping", 4, ZMQ_DONTWAIT);
    int got = 0;
    for (int t = 0; t < ms / 20 && !got; t++) {
        zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 20) > 0) {
            zmq_msg_t rid, body;
            zmq_msg_init(&rid), zmq_msg_init(&body);
            zmq_msg_recv(&rid, router, 0);
            zmq_msg_recv(&body, router, 0);
            const char *user = core_curve_peer(&body);
            if (user && !strcmp(user, CORE_CURVE_USER_ID)) {
                zmq_send(router, zmq_msg_data(&rid), zmq_msg_size(&rid), ZMQ_SNDMORE);
                zmq_send(router, "pong", 4, 0);
            }
            zmq_msg_close(&rid), zmq_msg_close(&body);
        }
        zmq_pollitem_t di = {d, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&di, 1, 0) > 0) {
            char b[8];
            got = zmq_recv(d, b, sizeof b, 0) == 4 && !memcmp(b, "pong", 4);
        }
    }
    zmq_close(d);
    return got;
}

static void curve_channel(const char *ep_fmt) {
    core_curve_keys k, stranger, srv, cli;
    REQUIRE_OK(core_curve_generate(&k));
    REQUIRE_OK(core_curve_generate(&stranger));
    core_curve_subset(&k, CORE_CURVE_CONTROLLER, &srv);
    core_curve_subset(&k, CORE_CURVE_CLIENT, &cli);
    void *ctx = zmq_ctx_new();
    const char *allow[] = {srv.pub[CORE_CURVE_CLIENT]};
    core_curve_zap *z = core_curve_zap_start(ctx, allow, 1, "test server");
    REQUIRE(z);
    CHECK(!core_curve_zap_start(ctx, allow, 1, "second") && strstr(core_last_error(), "one handler per context"));
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
    REQUIRE_OK(core_curve_server(router, &srv, CORE_CURVE_CONTROLLER));
    CHECK(core_curve_server(router, &cli, CORE_CURVE_CONTROLLER) == -1); /* a worker has no controller secret */
    char ep[256];
    if (strstr(ep_fmt, "%s")) snprintf(ep, sizeof ep, ep_fmt, test_tmpdir());
    else snprintf(ep, sizeof ep, "%s", ep_fmt);
    REQUIRE(zmq_bind(router, ep) == 0);
    size_t el = sizeof ep;
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &el);
    /* clients in a context of their own (as another process would be) */
    void *cctx = zmq_ctx_new();
    CHECK(try_client(cctx, ep, &cli, CORE_CURVE_CONTROLLER, router, 3000) == 1);
    CHECK(core_curve_zap_accepted(z) == 1);
    /* another run's client pair expecting this server: the ZAP handler refuses it */
    core_curve_keys wrong = cli;
    memcpy(wrong.pub[CORE_CURVE_CLIENT], stranger.pub[CORE_CURVE_CLIENT], sizeof wrong.pub[0]);
    memcpy(wrong.sec[CORE_CURVE_CLIENT], stranger.sec[CORE_CURVE_CLIENT], sizeof wrong.sec[0]);
    CHECK(try_client(cctx, ep, &wrong, CORE_CURVE_CONTROLLER, router, 600) == 0);
    CHECK(core_curve_zap_refused(z) >= 1);
    /* a plain client, and the run's client expecting another server key (a fake server): nothing gets through */
    CHECK(try_client(cctx, ep, NULL, CORE_CURVE_CONTROLLER, router, 400) == 0);
    core_curve_keys fake = cli;
    memcpy(fake.pub[CORE_CURVE_CONTROLLER], stranger.pub[CORE_CURVE_CONTROLLER], sizeof fake.pub[0]);
    CHECK(try_client(cctx, ep, &fake, CORE_CURVE_CONTROLLER, router, 400) == 0);
    /* and the run's client still gets through afterwards */
    CHECK(try_client(cctx, ep, &cli, CORE_CURVE_CONTROLLER, router, 3000) == 1);
    zmq_ctx_term(cctx);
    zmq_close(router);
    core_curve_zap_stop(z);
    zmq_ctx_term(ctx);
}

TEST(curve_zap_ipc) { curve_channel("ipc://%s/s"); }
TEST(curve_zap_tcp) { curve_channel("tcp://127.0.0.1:*"); }

/* core_curve_zap_check, for servers with a ZAP handler of their own: a request naming the client key is accepted,
 * another key, another domain, another mechanism or a short request are not. */
TEST(curve_zap_check_frames) {
    core_curve_keys k, other;
    REQUIRE_OK(core_curve_generate(&k));
    REQUIRE_OK(core_curve_generate(&other));
    uint8_t key[32], okey[32];
    REQUIRE(zmq_z85_decode(key, k.pub[CORE_CURVE_CLIENT]) && zmq_z85_decode(okey, other.pub[CORE_CURVE_CLIENT]));
    const char *allow[] = {"not a key", k.pub[CORE_CURVE_CLIENT]};
    struct {
        const char *domain, *mech;
        const uint8_t *cred;
        int n, want;
    } cases[] = {{"vgrpo", "CURVE", key, 7, 1}, {"vgrpo", "CURVE", okey, 7, 0}, {"other", "CURVE", key, 7, 0},
                 {"vgrpo", "NULL", key, 7, 0}, {"vgrpo", "CURVE", key, 5, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        zmq_msg_t f[7];
        const char *txt[6] = {"1.0", "7", cases[c].domain, "127.0.0.1", "", cases[c].mech};
        for (int i = 0; i < 6; i++) {
            zmq_msg_init_size(&f[i], strlen(txt[i]));
            memcpy(zmq_msg_data(&f[i]), txt[i], strlen(txt[i]));
        }
        zmq_msg_init_size(&f[6], 32);
        memcpy(zmq_msg_data(&f[6]), cases[c].cred, 32);
        const char *why = NULL;
        CHECK_MSG(core_curve_zap_check(f, cases[c].n, allow, 2, &why) == cases[c].want, "case %zu", c);
        CHECK(why && (cases[c].want ? !strcmp(why, "OK") : strcmp(why, "OK") != 0));
        for (int i = 0; i < 7; i++) zmq_msg_close(&f[i]);
    }
}
