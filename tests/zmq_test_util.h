/* tests/zmq_test_util.h — a small DEALER client for tests that drive a reward server subprocess over ZeroMQ
 * (tests/test_reward_server.c: `vgrpo reward-server`; tests/test_reward_pypeer.c: reward/examples/score_server.py):
 * start the server with its stderr in a log file, send a message, receive and parse a header-only reply, expect an
 * error with a given code, and stop the server with SIGTERM. Protocol: reward/PROTOCOL.md. */
#ifndef TESTS_ZMQ_TEST_UTIL_H
#define TESTS_ZMQ_TEST_UTIL_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "core/wire.h"
#include "tests/test.h"

typedef struct {
    pid_t pid;
    char endpoint[160], log[160];
    void *ctx, *sock;
} srv;

/* A new DEALER connected to s->endpoint: linger 0, send and receive time-outs 5 s. */
static inline void *srv_dealer(srv *s) {
    void *d = zmq_socket(s->ctx, ZMQ_DEALER);
    REQUIRE(d);
    int linger = 0, tmo = 5000;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(d, ZMQ_SNDTIMEO, &tmo, sizeof tmo);
    REQUIRE(zmq_connect(d, s->endpoint) == 0);
    return d;
}

/* Starts argv (NULL-terminated; argv[0] looked up in PATH) with stderr to s->log, then connects s->sock to
 * s->endpoint (both set by the caller). The DEALER may connect before the server binds: libzmq reconnects. */
static inline void srv_spawn(srv *s, const char *const argv[]) {
    s->pid = fork();
    REQUIRE(s->pid >= 0);
    if (s->pid == 0) {
        FILE *f = freopen(s->log, "w", stderr);
        (void)f;
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    s->ctx = zmq_ctx_new();
    s->sock = srv_dealer(s);
}

/* Closes the client, sends SIGTERM, and returns the exit status (128 + signal if killed; -1 after 8 s). */
static inline int srv_stop(srv *s) {
    zmq_close(s->sock);
    zmq_ctx_term(s->ctx);
    kill(s->pid, SIGTERM);
    for (int i = 0; i < 800; i++) {
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(10000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    return -1;
}

/* Sends the header (a C string) and, when with_tensor, one tensor frame of tlen bytes. */
static inline void send_frames(void *sock, const char *hdr, const void *t, size_t tlen, int with_tensor) {
    zmq_send(sock, hdr, strlen(hdr), with_tensor ? ZMQ_SNDMORE : 0);
    if (with_tensor) zmq_send(sock, t, tlen, 0);
}

/* Receives one reply (header only expected); returns its header text (malloc'd) or NULL on time-out. */
static inline char *recv_reply(void *sock) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, 0) < 0) {
        zmq_msg_close(&m);
        return NULL;
    }
    char *s = strndup(zmq_msg_data(&m), zmq_msg_size(&m));
    int more = zmq_msg_more(&m);
    while (more) { /* a reply of the reward server has no tensor frames: any extra frame is a defect */
        test_fail(__FILE__, __LINE__, "reply has an unexpected tensor frame");
        zmq_msg_recv(&m, sock, 0);
        more = zmq_msg_more(&m);
    }
    zmq_msg_close(&m);
    return s;
}

/* Parses a reply with the wire parser (so the server's output is itself checked) and returns its header
 * (json_decref it), after checking its type and id. */
static inline json_t *parse_reply(const char *text, core_wire_type want, const char *want_id) {
    core_wire_frame f = {text, strlen(text)};
    core_wire_msg m;
    if (core_wire_parse(&f, 1, NULL, &m) != 0) {
        test_fail(__FILE__, __LINE__, "reply does not parse: %s (%s)", core_last_error(), text);
        return NULL;
    }
    if (m.type != want || strcmp(m.id, want_id))
        test_fail(__FILE__, __LINE__, "reply type %s id \"%s\", want %s \"%s\": %s", core_wire_type_name(m.type), m.id,
                  core_wire_type_name(want), want_id, text);
    json_t *h = json_incref(m.header);
    core_wire_msg_free(&m);
    return h;
}

/* Sends a message and checks that the reply is an `error` with this id and code whose reason contains reason_part. */
static inline void expect_error(srv *s, const char *hdr, const void *t, size_t tlen, int with_tensor, const char *id,
                                const char *code, const char *reason_part) {
    send_frames(s->sock, hdr, t, tlen, with_tensor);
    char *r = recv_reply(s->sock);
    CHECK_MSG(r != NULL, "no reply to a malformed message: %s", hdr);
    if (!r) return;
    json_t *h = parse_reply(r, CORE_WIRE_ERROR, id);
    const char *c = json_string_value(json_object_get(h, "code")), *why = json_string_value(json_object_get(h, "reason"));
    CHECK_MSG(c && !strcmp(c, code), "code %s, want %s", c ? c : "(none)", code);
    CHECK_MSG(why && strstr(why, reason_part), "reason \"%s\" lacks \"%s\"", why ? why : "(none)", reason_part);
    json_decref(h);
    free(r);
}

#endif
