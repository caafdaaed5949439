/* tests/test_reward_server.c — the reward server (reward/server.h): the score_request checks and scoring in
 * process, then `vgrpo reward-server` as a subprocess on an ipc:// endpoint, driven by a small DEALER client:
 * hello, a batched request with hand-computed rewards, several requests in flight, malformed messages (each gets an
 * error naming the problem, and the server keeps serving), a repeated id (the same reply bytes), an id re-used
 * with other content and a second connection claiming the same client id (a bad_request, never the other
 * request's score), and SIGTERM (exit 0 and a stats line). */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/wire.h"
#include "reward/server.h"
#include "tests/test.h"
#include "tests/zmq_test_util.h"

/* Two 2-frame 2x3 videos: video 0 all red (255,0,0); video 1 frame 0 grey 128, frame 1 blue (0,0,255). */
static uint8_t vids[2 * 2 * 2 * 3 * 3];
static void make_videos(void) {
    for (int p = 0; p < 12; p++) {
        uint8_t *a = vids + 3 * p, *b = vids + 36 + 3 * p;
        a[0] = 255, a[1] = 0, a[2] = 0;
        if (p < 6) b[0] = b[1] = b[2] = 128;
        else b[0] = 0, b[1] = 0, b[2] = 255;
    }
}
/* Hand-computed: brightness = mean(0.299 R + 0.587 G + 0.114 B) / 255. */
#define BRIGHT0 0.299
#define BRIGHT1 ((6 * 128.0 + 6 * 0.114 * 255) / (255.0 * 12))

static const char *REQ_FMT = "{\"v\":1,\"type\":\"score_request\",\"id\":\"%s\",\"fps\":16,\"items\":["
                             "{\"prompt\":\"a red car\"},{\"prompt\":\"a cat\",\"metadata\":{\"color\":\"blue\"}}],"
                             "\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[2,2,2,3,3]}]}";

static void check_rewards(json_t *rewards, int line) {
    if (json_array_size(rewards) != 2) {
        test_fail(__FILE__, line, "rewards is not an array of 2");
        return;
    }
    json_t *r0 = json_array_get(rewards, 0), *r1 = json_array_get(rewards, 1);
    double b0 = json_real_value(json_object_get(json_object_get(r0, "scores"), "brightness"));
    double c0 = json_real_value(json_object_get(json_object_get(r0, "scores"), "color_match"));
    double b1 = json_real_value(json_object_get(json_object_get(r1, "scores"), "brightness"));
    double c1 = json_real_value(json_object_get(json_object_get(r1, "scores"), "color_match"));
    CHECK_NEAR(b0, BRIGHT0, 1e-12);
    CHECK_NEAR(c0, 1.0, 0);
    CHECK_NEAR(b1, BRIGHT1, 1e-12);
    CHECK_NEAR(c1, 0.5, 0);
    CHECK_NEAR(json_real_value(json_object_get(r0, "total")), 2 * BRIGHT0 + 1.0, 1e-12);
    CHECK_NEAR(json_real_value(json_object_get(r1, "total")), 2 * BRIGHT1 + 0.5, 1e-12);
}

TEST(reward_server_score_in_process) {
    make_videos();
    reward_server_config cfg;
    reward_server_config_default(&cfg);
    REQUIRE_OK(reward_server_parse_scorers(&cfg, "brightness:2,color_match"));
    CHECK(cfg.n_scorers == 2 && cfg.scorers[0].weight == 2.0 && cfg.scorers[1].weight == 1.0);
    CHECK(reward_server_parse_scorers(&cfg, "brightnes:1") == -1 && strstr(core_last_error(), "known: "));
    CHECK(reward_server_parse_scorers(&cfg, "brightness:x") == -1 && strstr(core_last_error(), "weight \"x\""));
    CHECK(reward_server_parse_scorers(&cfg, "brightness,brightness:2") == -1 && strstr(core_last_error(), "named twice"));
    REQUIRE_OK(reward_server_parse_scorers(&cfg, "brightness:2,color_match:1"));

    char hdr[1024];
    snprintf(hdr, sizeof hdr, REQ_FMT, "a");
    core_wire_frame fr[2] = {{hdr, strlen(hdr)}, {vids, sizeof vids}};
    core_wire_msg m;
    REQUIRE_OK(core_wire_parse(fr, 2, NULL, &m));
    REQUIRE_OK(reward_check_score_request(&m));
    json_t *f = reward_score_request(&m, cfg.scorers, cfg.n_scorers);
    REQUIRE(f);
    check_rewards(json_object_get(f, "rewards"), __LINE__);
    CHECK(json_array_size(json_object_get(f, "scorers")) == 2);
    json_decref(f);
    core_wire_msg_free(&m);

    /* Field checks name the field. */
    const char *bad[][2] = {
        {"{\"v\":1,\"type\":\"score_request\",\"id\":\"a\",\"items\":[{\"prompt\":\"x\"},{\"prompt\":\"y\"}],"
         "\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[2,2,2,3,3]}]}",
         "\"fps\""},
        {"{\"v\":1,\"type\":\"score_request\",\"id\":\"a\",\"fps\":16,\"items\":[{\"prompt\":\"x\"}],"
         "\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[2,2,2,3,3]}]}",
         "\"items\" must be an array of 2"},
        {"{\"v\":1,\"type\":\"score_request\",\"id\":\"a\",\"fps\":16,\"items\":[{\"prompt\":\"x\"},{\"prompt\":3}],"
         "\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[2,2,2,3,3]}]}",
         "\"items\"[1].prompt"},
        {"{\"v\":1,\"type\":\"score_request\",\"id\":\"a\",\"fps\":16,\"items\":[{\"prompt\":\"x\",\"metadata\":{\"c\":1}},"
         "{\"prompt\":\"y\"}],\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[2,2,2,3,3]}]}",
         "\"items\"[0].metadata.c"},
        {"{\"v\":1,\"type\":\"score_request\",\"id\":\"a\",\"fps\":16,\"items\":[{\"prompt\":\"x\"},{\"prompt\":\"y\"}],"
         "\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[2,2,2,9]}]}",
         "U8 [N, F, H, W, 3]"},
        {"{\"v\":1,\"type\":\"score_request\",\"id\":\"a\",\"fps\":16,\"items\":[{\"prompt\":\"x\"},{\"prompt\":\"y\"}],"
         "\"tensors\":[{\"name\":\"vids\",\"dtype\":\"U8\",\"shape\":[2,2,2,3,3]}]}",
         "exactly one tensor, \"videos\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        core_wire_frame b[2] = {{bad[i][0], strlen(bad[i][0])}, {vids, sizeof vids}};
        REQUIRE_OK(core_wire_parse(b, 2, NULL, &m));
        CHECK_MSG(reward_check_score_request(&m) == -1 && strstr(core_last_error(), bad[i][1]), "case %zu: \"%s\"", i,
                  core_last_error());
        core_wire_msg_free(&m);
    }
}

/* ---- The server as a subprocess ---- */

static void srv_start(srv *s, const char *scorers, const char *max_frame_mb) {
    const char *dir = test_tmpdir();
    snprintf(s->endpoint, sizeof s->endpoint, "ipc://%s/rs.sock", dir);
    snprintf(s->log, sizeof s->log, "%s/server.log", dir);
    const char *argv[] = {test_vgrpo_bin(), "reward-server", "--bind", s->endpoint, "--scorers", scorers,
                          "--threads", "2", "--max-frame-mb", max_frame_mb, NULL};
    srv_spawn(s, argv);
}

TEST(reward_server_requests) {
    make_videos();
    srv s;
    srv_start(&s, "brightness:2,color_match:1", "1024");
    /* hello: the scorers come back. */
    send_frames(s.sock, "{\"v\":1,\"type\":\"hello\",\"id\":\"h\",\"client\":\"test-client\"}", NULL, 0, 0);
    char *r = recv_reply(s.sock);
    REQUIRE(r);
    json_t *h = parse_reply(r, CORE_WIRE_HELLO, "h");
    CHECK(json_array_size(json_object_get(h, "scorers")) == 2);
    json_decref(h);
    free(r);

    /* Good request, then three in flight at once (replies matched by id). */
    char hdr[1024];
    snprintf(hdr, sizeof hdr, REQ_FMT, "good-1");
    send_frames(s.sock, hdr, vids, sizeof vids, 1);
    char *first = recv_reply(s.sock);
    REQUIRE(first);
    h = parse_reply(first, CORE_WIRE_SCORE_REPLY, "good-1");
    check_rewards(json_object_get(h, "rewards"), __LINE__);
    json_decref(h);
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(hdr, sizeof hdr, REQ_FMT, i == 0 ? "f0" : i == 1 ? "f1" : "f2");
        send_frames(s.sock, hdr, vids, sizeof vids, 1);
    }
    for (int i = 0; i < 3; i++) {
        r = recv_reply(s.sock);
        REQUIRE(r);
        core_wire_frame f = {r, strlen(r)};
        core_wire_msg m;
        REQUIRE_OK(core_wire_parse(&f, 1, NULL, &m));
        CHECK(m.type == CORE_WIRE_SCORE_REPLY && m.id[0] == 'f' && m.id[1] >= '0' && m.id[1] <= '2');
        seen |= 1 << (m.id[1] - '0');
        check_rewards(json_object_get(m.header, "rewards"), __LINE__);
        core_wire_msg_free(&m);
        free(r);
    }
    CHECK(seen == 7);

    /* Malformed messages: each gets an error naming the problem. */
    expect_error(&s, "\x01\x02garbage", NULL, 0, 0, "", "bad_request", "not valid JSON");
    snprintf(hdr, sizeof hdr, REQ_FMT, "lie");
    expect_error(&s, hdr, vids, sizeof vids - 1, 1, "lie", "bad_request", "frame 1 (tensor \"videos\"");
    expect_error(&s, hdr, NULL, 0, 0, "lie", "bad_request", "lists 1 tensors but the message has 0");
    expect_error(&s, "{\"v\":1,\"type\":\"bogus\",\"id\":\"u\"}", NULL, 0, 0, "u", "bad_request", "unknown message type");
    expect_error(&s, "{\"v\":9,\"type\":\"hello\",\"id\":\"u\"}", NULL, 0, 0, "u", "bad_request", "unsupported protocol version 9");
    expect_error(&s, "{\"v\":1,\"type\":\"trajectory\",\"id\":\"t\"}", NULL, 0, 0, "t", "unsupported", "trajectory");
    expect_error(&s,
                 "{\"v\":1,\"type\":\"score_request\",\"id\":\"nofps\",\"items\":[{\"prompt\":\"a\"},{\"prompt\":\"b\"}],"
                 "\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[2,2,2,3,3]}]}",
                 vids, sizeof vids, 1, "nofps", "bad_request", "\"fps\"");
    /* A scorer that cannot score (no colour in the prompt of items[1]) gives scorer_failed. */
    expect_error(&s,
                 "{\"v\":1,\"type\":\"score_request\",\"id\":\"nocolor\",\"fps\":8,\"items\":[{\"prompt\":\"a red\"},"
                 "{\"prompt\":\"a dog\"}],\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[2,2,2,3,3]}]}",
                 vids, sizeof vids, 1, "nocolor", "scorer_failed", "items[1], scorer color_match");

    /* Still serving; a repeated id gets the first reply byte for byte. */
    snprintf(hdr, sizeof hdr, REQ_FMT, "good-1");
    send_frames(s.sock, hdr, vids, sizeof vids, 1);
    r = recv_reply(s.sock);
    REQUIRE(r);
    CHECK_MSG(!strcmp(r, first), "repeat reply differs:\n%s\n%s", r, first);
    free(r);
    free(first);
    CHECK(srv_stop(&s) == 0);
    char out[4096];
    test_run(out, sizeof out, "cat %s", s.log);
    CHECK_MSG(strstr(out, "repeats 1,") && strstr(out, "replies 5,") && strstr(out, "videos 8,") &&
                  strstr(out, "errors 8,"),
              "stats line: %s", out);
}

/* Expects an `error` with this id and code whose reason holds reason_part on sock. */
static void expect_error_on(void *sock, const char *id, const char *code, const char *reason_part, int line) {
    char *r = recv_reply(sock);
    if (!r) {
        test_fail(__FILE__, line, "no reply (want error %s)", code);
        return;
    }
    json_t *h = parse_reply(r, CORE_WIRE_ERROR, id);
    const char *c = json_string_value(json_object_get(h, "code")), *why = json_string_value(json_object_get(h, "reason"));
    if (!c || strcmp(c, code) || !why || !strstr(why, reason_part))
        test_fail(__FILE__, line, "want error %s with \"%s\", got %s", code, reason_part, r);
    json_decref(h);
    free(r);
}

/* A cached reply is only given for the same content. Before, a re-send of id d1 with other videos got the
 * first videos' score, and a second connection claiming the same client id got the first one's replies. */
TEST(reward_server_id_reuse) {
    make_videos();
    static uint8_t other[sizeof vids];
    memset(other, 200, sizeof other);
    srv s;
    srv_start(&s, "brightness:2,color_match:1", "16");
    send_frames(s.sock, "{\"v\":1,\"type\":\"hello\",\"id\":\"h\",\"client\":\"w\"}", NULL, 0, 0);
    free(recv_reply(s.sock));
    char hdr[1024];
    snprintf(hdr, sizeof hdr, REQ_FMT, "d1");
    send_frames(s.sock, hdr, vids, sizeof vids, 1);
    char *first = recv_reply(s.sock);
    REQUIRE(first);
    json_t *h = parse_reply(first, CORE_WIRE_SCORE_REPLY, "d1");
    check_rewards(json_object_get(h, "rewards"), __LINE__);
    json_decref(h);

    /* The same id with other videos, or other fields: bad_request naming the id, not the first score. */
    send_frames(s.sock, hdr, other, sizeof other, 1);
    expect_error_on(s.sock, "d1", "bad_request", "request id \"d1\" was already used by client \"w\"", __LINE__);
    char hdr8[1024];
    snprintf(hdr8, sizeof hdr8, "%s", hdr);
    memcpy(strstr(hdr8, "\"fps\":16"), "\"fps\":18", 8);
    send_frames(s.sock, hdr8, vids, sizeof vids, 1);
    expect_error_on(s.sock, "d1", "bad_request", "other content", __LINE__);
    /* An identical re-send (a retry after a lost reply) still gets the cached reply byte for byte. */
    send_frames(s.sock, hdr, vids, sizeof vids, 1);
    char *r = recv_reply(s.sock);
    CHECK_MSG(r && !strcmp(r, first), "repeat reply differs:\n%s\n%s", r ? r : "(none)", first);
    free(r);

    /* A second connection claiming client id "w": its d1 with other videos is refused, its own d2 is scored, and
     * the first connection's d2 with the first videos is refused in turn (neither gets the other's score). */
    void *b = srv_dealer(&s);
    send_frames(b, "{\"v\":1,\"type\":\"hello\",\"id\":\"h2\",\"client\":\"w\"}", NULL, 0, 0);
    free(recv_reply(b));
    send_frames(b, hdr, other, sizeof other, 1);
    expect_error_on(b, "d1", "bad_request", "request id \"d1\"", __LINE__);
    snprintf(hdr, sizeof hdr, REQ_FMT, "d2");
    send_frames(b, hdr, other, sizeof other, 1);
    r = recv_reply(b);
    REQUIRE(r);
    h = parse_reply(r, CORE_WIRE_SCORE_REPLY, "d2");
    double bright = json_real_value(json_object_get(json_object_get(json_array_get(json_object_get(h, "rewards"), 0),
                                                                    "scores"), "brightness"));
    CHECK_NEAR(bright, 200.0 / 255.0, 1e-12);
    json_decref(h);
    free(r);
    send_frames(s.sock, hdr, vids, sizeof vids, 1);
    expect_error_on(s.sock, "d2", "bad_request", "request id \"d2\"", __LINE__);
    /* Both connections re-sending identical content get the reply. */
    snprintf(hdr, sizeof hdr, REQ_FMT, "d3");
    send_frames(s.sock, hdr, vids, sizeof vids, 1);
    send_frames(b, hdr, vids, sizeof vids, 1);
    char *ra = recv_reply(s.sock), *rb = recv_reply(b);
    CHECK_MSG(ra && rb && !strcmp(ra, rb), "identical d3 from two connections: %s / %s", ra ? ra : "(none)",
              rb ? rb : "(none)");
    if (ra) {
        h = parse_reply(ra, CORE_WIRE_SCORE_REPLY, "d3");
        check_rewards(json_object_get(h, "rewards"), __LINE__);
        json_decref(h);
    }
    free(ra);
    free(rb);
    free(first);
    zmq_close(b);
    CHECK(srv_stop(&s) == 0);
}

TEST(reward_server_sigterm) {
    srv s;
    srv_start(&s, "brightness", "1024");
    /* A round trip first, so the server is up and bound before it is signalled. */
    send_frames(s.sock, "{\"v\":1,\"type\":\"hello\",\"id\":\"h\",\"client\":\"c\"}", NULL, 0, 0);
    char *r = recv_reply(s.sock);
    REQUIRE(r);
    free(r);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = srv_stop(&s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK_MSG(rc == 0, "exit status %d", rc);
    CHECK((double)(t1.tv_sec - t0.tv_sec) < 3.0);
    char out[4096];
    test_run(out, sizeof out, "cat %s", s.log);
    CHECK_MSG(strstr(out, "reward-server: stats: received 1, replies 0, errors 0, repeats 0, videos 0"), "log: %s", out);
    /* Usage errors exit 2 and name the problem. */
    int st = test_run(out, sizeof out, "%s reward-server --bind ipc://x --scorers nope:1", test_vgrpo_bin());
    CHECK(st == 2 && strstr(out, "unknown reward scorer"));
}

static uint64_t lcg(uint64_t *x) {
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return *x >> 33;
}

/* The robustness test: 10,000 malformed messages of seven kinds, each answered with an error; an oversized
 * frame drops only that connection (the DEALER reconnects); then a retried good request is scored correctly. */
TEST(reward_server_malformed_flood) {
    make_videos();
    srv s;
    srv_start(&s, "brightness:2,color_match:1", "1");
    uint64_t x = 12345;
    char hdr[1024], good[1024];
    uint8_t junk[300];
    int errors = 0, wrong = 0, n = 10000, batch = 100;
    for (int b = 0; b < n; b += batch) {
        for (int i = b; i < b + batch; i++) {
            snprintf(good, sizeof good, REQ_FMT, "m");
            int kind = i % 7;
            if (kind == 0) { /* random bytes, never starting a JSON object */
                size_t len = 1 + lcg(&x) % sizeof junk;
                for (size_t k = 0; k < len; k++) junk[k] = (uint8_t)lcg(&x);
                junk[0] = (uint8_t)(junk[0] == '{' ? '}' : junk[0]);
                zmq_send(s.sock, junk, len, 0);
            } else if (kind == 1) { /* lying shape: frame length off by 1..72 either way */
                static uint8_t pad[2 * sizeof vids];
                size_t d = 1 + lcg(&x) % sizeof vids;
                zmq_send(s.sock, good, strlen(good), ZMQ_SNDMORE);
                zmq_send(s.sock, pad, (lcg(&x) & 1) ? sizeof vids - d : sizeof vids + d, 0);
            } else if (kind == 2) { /* wrong frame count: 0 or 2 tensor frames */
                int two = (int)(lcg(&x) & 1);
                zmq_send(s.sock, good, strlen(good), two ? ZMQ_SNDMORE : 0);
                if (two) {
                    zmq_send(s.sock, vids, sizeof vids, ZMQ_SNDMORE);
                    zmq_send(s.sock, vids, 3, 0);
                }
            } else if (kind == 3) { /* unknown type */
                snprintf(hdr, sizeof hdr, "{\"v\":1,\"type\":\"t%llu\",\"id\":\"m\"}", (unsigned long long)lcg(&x));
                zmq_send(s.sock, hdr, strlen(hdr), 0);
            } else if (kind == 4) { /* truncated JSON */
                size_t cut = 1 + lcg(&x) % (strlen(good) - 1);
                zmq_send(s.sock, good, cut, ZMQ_SNDMORE);
                zmq_send(s.sock, vids, sizeof vids, 0);
            } else if (kind == 5) { /* wrong dtype for videos (a well-formed wire message) */
                const char *dt[] = {"F32", "BF16", "F16", "I64"};
                size_t sz[] = {4, 2, 2, 8};
                int k = (int)(lcg(&x) % 4);
                snprintf(hdr, sizeof hdr,
                         "{\"v\":1,\"type\":\"score_request\",\"id\":\"m\",\"fps\":16,\"items\":[{\"prompt\":\"a red\"},"
                         "{\"prompt\":\"blue\"}],\"tensors\":[{\"name\":\"videos\",\"dtype\":\"%s\",\"shape\":[2,2,2,3,3]}]}",
                         dt[k]);
                static uint8_t big[72 * 8];
                zmq_send(s.sock, hdr, strlen(hdr), ZMQ_SNDMORE);
                zmq_send(s.sock, big, 72 * sz[k], 0);
            } else { /* shape whose byte size overflows */
                snprintf(hdr, sizeof hdr,
                         "{\"v\":1,\"type\":\"score_request\",\"id\":\"m\",\"tensors\":[{\"name\":\"videos\",\"dtype\":"
                         "\"U8\",\"shape\":[%llu,4294967296,4294967296,1,3]}]}",
                         1 + (unsigned long long)(lcg(&x) % 1000));
                zmq_send(s.sock, hdr, strlen(hdr), ZMQ_SNDMORE);
                zmq_send(s.sock, vids, sizeof vids, 0);
            }
        }
        for (int i = 0; i < batch; i++) {
            char *r = recv_reply(s.sock);
            if (!r) break;
            core_wire_frame f = {r, strlen(r)};
            core_wire_msg m;
            if (core_wire_parse(&f, 1, NULL, &m) == 0 && m.type == CORE_WIRE_ERROR) errors++;
            else wrong++;
            core_wire_msg_free(&m);
            free(r);
        }
    }
    CHECK_MSG(errors == n && wrong == 0, "%d errors and %d other replies for %d malformed messages", errors, wrong, n);

    /* A 2 MiB frame over the 1 MiB limit: libzmq drops the connection, no reply. */
    uint8_t *huge = calloc(2 << 20, 1);
    REQUIRE(huge);
    snprintf(hdr, sizeof hdr,
             "{\"v\":1,\"type\":\"score_request\",\"id\":\"huge\",\"fps\":16,\"items\":[{\"prompt\":\"red\"}],"
             "\"tensors\":[{\"name\":\"videos\",\"dtype\":\"U8\",\"shape\":[1,2,1024,341,3]}]}");
    zmq_send(s.sock, hdr, strlen(hdr), ZMQ_SNDMORE);
    zmq_send(s.sock, huge, 2 * 1024 * 341 * 3, 0);
    free(huge);
    int tmo = 500;
    zmq_setsockopt(s.sock, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    char *r = recv_reply(s.sock);
    CHECK_MSG(r == NULL, "an oversized frame got a reply: %s", r ? r : "");
    free(r);
    /* The client retries a good request with the same id until answered (the connection comes back). */
    snprintf(hdr, sizeof hdr, REQ_FMT, "after");
    for (int attempt = 0; attempt < 10 && !r; attempt++) {
        send_frames(s.sock, hdr, vids, sizeof vids, 1);
        r = recv_reply(s.sock);
    }
    REQUIRE(r);
    json_t *h = parse_reply(r, CORE_WIRE_SCORE_REPLY, "after");
    check_rewards(json_object_get(h, "rewards"), __LINE__);
    json_decref(h);
    free(r);
    /* Drain any duplicate replies of the retries before stopping. */
    while ((r = recv_reply(s.sock)) != NULL) free(r);
    CHECK(srv_stop(&s) == 0);
}
