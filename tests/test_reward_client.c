/* tests/test_reward_client.c — the reward client (reward/client.h) against an in-process reward server thread
 * (values equal to the scorers called directly; a scorer_failed error surfaces with its reason) and against a fake
 * server (a ROUTER in the test) that plays the failures: a server that is down then comes back (the client times
 * out, reconnects with a new hello and re-sends the same id and bytes; a stale reply with another id is ignored),
 * `busy` (retried with the same id after a back-off), malformed replies (errors naming the field), and a server
 * that never answers (the error names the endpoint, the id and the attempts). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/wire.h"
#include "reward/client.h"
#include "tests/reward_thread_util.h"
#include "tests/test.h"

#define NV 3
#define FR 3
#define HH 8
#define WW 10
#define VBYTES (FR * HH * WW * 3)
static uint8_t vids[NV * VBYTES];
static const char *prompts[NV] = {"a red car", "a cat", "green leaves and a blue sky"};
static const char *colors[NV] = {NULL, "blue", NULL};
static const char *SCORERS = "brightness:2,colorfulness:0.5,sharpness,motion,flicker,color_match:3";
static const char *names[6] = {"brightness", "colorfulness", "sharpness", "motion", "flicker", "color_match"};
static const double weights[6] = {2, 0.5, 1, 1, 1, 3};

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static json_t *metas[NV];
static void setup(void) {
    rsrv_fill_videos(vids, NV, FR, HH, WW, 11);
    for (int i = 0; i < NV; i++) {
        json_decref(metas[i]);
        metas[i] = colors[i] ? json_pack("{s:s}", "color", colors[i]) : NULL;
    }
}

/* out[i] must equal the scorers called directly, bit for bit (the server sums in the same order and JSON reals
 * round-trip), in the server's scorer order. */
static void check_direct(const reward_result *out, int n, int line) {
    for (int i = 0; i < n; i++) {
        if (out[i].n_scores != 6) {
            test_fail(__FILE__, line, "video %d: %d scores, want 6", i, out[i].n_scores);
            continue;
        }
        double total = 0;
        for (int s = 0; s < 6; s++) {
            double d = rsrv_direct(names[s], vids + (size_t)i * VBYTES, FR, HH, WW, prompts[i], colors[i]);
            total += weights[s] * d;
            if (strcmp(out[i].scores[s].name, names[s]) || out[i].scores[s].value != d ||
                out[i].scores[s].weight != weights[s])
                test_fail(__FILE__, line, "video %d score %d: %s = %.17g (weight %g), want %s = %.17g (weight %g)", i, s,
                          out[i].scores[s].name, out[i].scores[s].value, out[i].scores[s].weight, names[s], d, weights[s]);
        }
        if (out[i].total != total)
            test_fail(__FILE__, line, "video %d: total %.17g, want %.17g", i, out[i].total, total);
    }
}

static const char *ep(const char *name) {
    static char buf[200];
    snprintf(buf, sizeof buf, "ipc://%s/%s", test_tmpdir(), name);
    return buf;
}

TEST(reward_client_scores) {
    setup();
    /* Bad arguments to open. */
    CHECK(!reward_client_open("ftp://x", "w", 1, 1) && strstr(core_last_error(), "\"ftp://x\""));
    char longp[160];
    memset(longp, 'a', sizeof longp);
    memcpy(longp, "ipc://", 6);
    longp[120] = 0;
    CHECK(!reward_client_open(longp, "w", 1, 1) && strstr(core_last_error(), "must be < 100"));
    CHECK(!reward_client_open("tcp://127.0.0.1:notaport", "w", 1, 1) && strstr(core_last_error(), "cannot connect"));
    CHECK(!reward_client_open("ipc://x", "", 1, 1) && strstr(core_last_error(), "client id"));
    CHECK(!reward_client_open("ipc://x", "w", 0, 1) && strstr(core_last_error(), "timeout_s"));

    char endpoint[200];
    snprintf(endpoint, sizeof endpoint, "%s", ep("c.sock"));
    rsrv s;
    rsrv_start(&s, endpoint, SCORERS, 2, 0);
    reward_client *c = reward_client_open(endpoint, "worker-0", 5.0, 3);
    REQUIRE(c);
    reward_result out[NV];
    memset(out, 0, sizeof out);
    CHECK_MSG(reward_client_score(c, vids, NV, FR, HH, WW, 16, prompts, (const json_t *const *)metas, out) == 0, "%s",
              core_last_error());
    check_direct(out, NV, __LINE__);
    CHECK(reward_client_last_attempts(c) == 1);
    char id1[160];
    snprintf(id1, sizeof id1, "%s", reward_client_last_id(c));
    /* One video (the second), metadata array NULL for a video that needs none. */
    const char *p1[1] = {prompts[0]};
    CHECK_MSG(reward_client_score(c, vids, 1, FR, HH, WW, 8, p1, NULL, out) == 0, "%s", core_last_error());
    check_direct(out, 1, __LINE__);
    CHECK(strcmp(id1, reward_client_last_id(c)) != 0);

    /* scorer_failed: no colour in the prompt and no metadata; the reason names the item and the scorer. */
    const char *nocolor[2] = {"a red car", "a dog"};
    CHECK(reward_client_score(c, vids, 2, FR, HH, WW, 16, nocolor, NULL, out) == -1);
    CHECK_MSG(strstr(core_last_error(), "scorer_failed") && strstr(core_last_error(), "items[1], scorer color_match") &&
                  strstr(core_last_error(), endpoint) && strstr(core_last_error(), reward_client_last_id(c)),
              "%s", core_last_error());
    CHECK(reward_client_last_attempts(c) == 1);
    /* Bad arguments are refused before sending and name the argument. */
    json_t *bad = json_pack("{s:i}", "color", 3);
    const json_t *badm[2] = {NULL, bad};
    CHECK(reward_client_score(c, vids, 2, FR, HH, WW, 16, prompts, badm, out) == -1 &&
          strstr(core_last_error(), "metadata[1].color"));
    json_decref(bad);
    const char *nullp[2] = {"x", NULL};
    CHECK(reward_client_score(c, vids, 2, FR, HH, WW, 16, nullp, NULL, out) == -1 && strstr(core_last_error(), "prompts[1]"));
    CHECK(reward_client_score(c, vids, 2, FR, HH, WW, 0, prompts, NULL, out) == -1 && strstr(core_last_error(), "fps"));
    /* Still good after the errors. */
    CHECK_MSG(reward_client_score(c, vids, NV, FR, HH, WW, 16, prompts, (const json_t *const *)metas, out) == 0, "%s",
              core_last_error());
    check_direct(out, NV, __LINE__);
    reward_client_close(c);
    CHECK(rsrv_stop(&s) == 0);
    CHECK_MSG(s.stats.replies == 3 && s.stats.errors == 1 && s.stats.videos == 2 * NV + 1 && s.stats.repeats == 0,
              "replies %lld errors %lld videos %lld repeats %lld", s.stats.replies, s.stats.errors, s.stats.videos,
              s.stats.repeats);

    /* Videos over the server's frame limit (learned from its hello reply) are refused, not re-sent forever. */
    rsrv_start(&s, endpoint, "brightness", 1, 1000);
    c = reward_client_open(endpoint, "worker-0", 0.5, 10);
    REQUIRE(c);
    CHECK(reward_client_score(c, vids, NV, FR, HH, WW, 16, prompts, NULL, out) == -1);
    CHECK_MSG(strstr(core_last_error(), "max_videos_bytes 1000"), "%s", core_last_error());
    reward_client_close(c);
    CHECK(rsrv_stop(&s) == 0);
    for (int i = 0; i < NV; i++) json_decref(metas[i]), metas[i] = NULL;
}

/* ---- A client call on its own thread, so the test can play the server ---- */

typedef struct {
    reward_client *c;
    int n;
    int rc;
    char err[CORE_ERROR_MAX];
    reward_result out[NV];
    pthread_t th;
} call;

static void *call_main(void *arg) {
    call *k = arg;
    k->rc = reward_client_score(k->c, vids, k->n, FR, HH, WW, 16, prompts, (const json_t *const *)metas, k->out);
    snprintf(k->err, sizeof k->err, "%s", k->rc ? core_last_error() : "");
    return NULL;
}

static void call_start(call *k, reward_client *c, int n) {
    memset(k, 0, sizeof *k);
    k->c = c;
    k->n = n;
    REQUIRE(pthread_create(&k->th, NULL, call_main, k) == 0);
}

/* A message received by the fake server: routing id, header text, optional tensor frame. */
typedef struct {
    char rid[256];
    size_t rid_len;
    char *hdr;
    uint8_t *t;
    size_t tlen;
    json_t *h;
} fmsg;

static void fmsg_free(fmsg *m) {
    free(m->hdr);
    free(m->t);
    json_decref(m->h);
    memset(m, 0, sizeof *m);
}

/* Receives one message on the fake ROUTER (time-out: the socket's RCVTIMEO). Returns 0 or -1. */
static int fake_recv(void *r, fmsg *m) {
    memset(m, 0, sizeof *m);
    int n = zmq_recv(r, m->rid, sizeof m->rid, 0);
    if (n < 0) return -1;
    m->rid_len = (size_t)n;
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, r, 0) < 0) return -1;
    m->hdr = strndup(zmq_msg_data(&f), zmq_msg_size(&f));
    if (zmq_msg_more(&f)) {
        zmq_msg_recv(&f, r, 0);
        m->tlen = zmq_msg_size(&f);
        m->t = malloc(m->tlen + 1);
        memcpy(m->t, zmq_msg_data(&f), m->tlen);
    }
    zmq_msg_close(&f);
    m->h = json_loads(m->hdr, 0, NULL);
    return m->h ? 0 : -1;
}

static const char *fm_type(const fmsg *m) { return json_string_value(json_object_get(m->h, "type")); }
static const char *fm_id(const fmsg *m) { return json_string_value(json_object_get(m->h, "id")); }

static void fake_send(void *r, const fmsg *to, const char *text) {
    zmq_send(r, to->rid, to->rid_len, ZMQ_SNDMORE);
    zmq_send(r, text, strlen(text), 0);
}

static void *fake_router(void *ctx, const char *endpoint) {
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 0, tmo = 3000;
    zmq_setsockopt(r, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(r, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    if (zmq_bind(r, endpoint) != 0) {
        zmq_close(r);
        return NULL;
    }
    return r;
}

/* Receives the next hello (answers it) + score_request pair (a fresh connection introduces itself first). */
static int fake_recv_request(void *r, fmsg *hello, fmsg *req) {
    if (fake_recv(r, hello) != 0) return -1;
    if (!fm_type(hello) || strcmp(fm_type(hello), "hello")) {
        test_fail(__FILE__, __LINE__, "expected a hello first, got %s", hello->hdr);
        return -1;
    }
    const char *cl = json_string_value(json_object_get(hello->h, "client"));
    CHECK(cl && !strcmp(cl, "worker-7"));
    char text[512];
    snprintf(text, sizeof text,
             "{\"v\":1,\"type\":\"hello\",\"id\":\"%s\",\"server\":\"fake\",\"scorers\":[],\"max_videos_bytes\":1000000}",
             fm_id(hello));
    fake_send(r, hello, text);
    if (fake_recv(r, req) != 0) return -1;
    CHECK_MSG(fm_type(req) && !strcmp(fm_type(req), "score_request"), "%s", req->hdr);
    CHECK(req->rid_len == hello->rid_len && !memcmp(req->rid, hello->rid, req->rid_len));
    return 0;
}

TEST(reward_client_server_restart) {
    setup();
    char endpoint[200];
    snprintf(endpoint, sizeof endpoint, "%s", ep("r.sock"));
    rsrv s;
    rsrv_start(&s, endpoint, SCORERS, 2, 0);
    reward_client *c = reward_client_open(endpoint, "worker-7", 0.3, 100);
    REQUIRE(c);
    reward_result out[NV];
    REQUIRE(reward_client_score(c, vids, NV, FR, HH, WW, 16, prompts, (const json_t *const *)metas, out) == 0);
    char id1[160];
    snprintf(id1, sizeof id1, "%s", reward_client_last_id(c));
    CHECK(rsrv_stop(&s) == 0);

    /* The server is down: the call times out (no connection) and keeps retrying. */
    double t0 = mono();
    call k;
    call_start(&k, c, NV);
    usleep(450 * 1000);
    /* A server that receives but never answers: the client re-sends on a fresh connection, same id and bytes. */
    void *ctx = zmq_ctx_new();
    void *r = fake_router(ctx, endpoint);
    REQUIRE(r);
    fmsg h1, q1, h2, q2;
    REQUIRE(fake_recv_request(r, &h1, &q1) == 0);
    const char *id = fm_id(&q1);
    REQUIRE(id);
    CHECK(strcmp(id, id1) != 0);
    CHECK(q1.tlen == sizeof vids && !memcmp(q1.t, vids, sizeof vids));
    /* A stale reply (another id, wrong values) must be ignored. */
    fake_send(r, &q1,
              "{\"v\":1,\"type\":\"score_reply\",\"id\":\"stale-1\",\"rewards\":[{\"total\":9,\"scores\":{\"brightness\":9}}],"
              "\"scorers\":[{\"name\":\"brightness\",\"weight\":1}]}");
    REQUIRE(fake_recv_request(r, &h2, &q2) == 0);
    CHECK_MSG(!strcmp(q2.hdr, q1.hdr), "re-sent header differs:\n%s\n%s", q2.hdr, q1.hdr);
    CHECK(q2.tlen == q1.tlen && !memcmp(q2.t, q1.t, q1.tlen));
    CHECK_MSG(q2.rid_len != q1.rid_len || memcmp(q2.rid, q1.rid, q1.rid_len), "the re-send came on the same connection");
    CHECK(strcmp(fm_id(&h1), fm_id(&h2)) != 0);
    char want_id[160];
    snprintf(want_id, sizeof want_id, "%s", id);
    fmsg_free(&h1), fmsg_free(&q1), fmsg_free(&h2), fmsg_free(&q2);
    zmq_close(r);
    zmq_ctx_term(ctx);

    /* The real server comes back on the same endpoint: the next re-send is scored. */
    rsrv_start(&s, endpoint, SCORERS, 2, 0);
    pthread_join(k.th, NULL);
    double dt = mono() - t0;
    CHECK_MSG(k.rc == 0, "%s", k.err);
    check_direct(k.out, NV, __LINE__);
    CHECK_MSG(!strcmp(reward_client_last_id(c), want_id), "id %s, want %s", reward_client_last_id(c), want_id);
    CHECK_MSG(reward_client_last_attempts(c) >= 4, "attempts %d", reward_client_last_attempts(c));
    CHECK_MSG(dt < 5.0, "%.2f s", dt);
    reward_client_close(c);
    CHECK(rsrv_stop(&s) == 0);
    CHECK_MSG(s.stats.replies == 1 && s.stats.videos == NV, "replies %lld videos %lld", s.stats.replies, s.stats.videos);
    for (int i = 0; i < NV; i++) json_decref(metas[i]), metas[i] = NULL;
}

static void reply_for(char *buf, size_t cap, const char *id, const char *rewards) {
    snprintf(buf, cap,
             "{\"v\":1,\"type\":\"score_reply\",\"id\":\"%s\",\"rewards\":%s,"
             "\"scorers\":[{\"name\":\"b\",\"weight\":2},{\"name\":\"a\",\"weight\":0.5}]}",
             id, rewards);
}

TEST(reward_client_busy_and_bad_replies) {
    setup();
    char endpoint[200];
    snprintf(endpoint, sizeof endpoint, "%s", ep("b.sock"));
    void *ctx = zmq_ctx_new();
    void *r = fake_router(ctx, endpoint);
    REQUIRE(r);
    reward_client *c = reward_client_open(endpoint, "worker-7", 2.0, 5);
    REQUIRE(c);
    fmsg h, q, q2;
    char text[2048];
    /* busy twice, then an answer: the same id on the same connection, after a back-off. */
    call k;
    call_start(&k, c, 1);
    REQUIRE(fake_recv_request(r, &h, &q) == 0);
    double t0 = mono();
    for (int b = 0; b < 2; b++) {
        snprintf(text, sizeof text,
                 "{\"v\":1,\"type\":\"error\",\"id\":\"%s\",\"code\":\"busy\",\"reason\":\"queue full\",\"retryable\":true}",
                 fm_id(&q));
        fake_send(r, &q, text);
        REQUIRE(fake_recv(r, &q2) == 0);
        CHECK(!strcmp(q2.hdr, q.hdr) && q2.rid_len == q.rid_len && !memcmp(q2.rid, q.rid, q.rid_len));
        fmsg_free(&q2);
    }
    CHECK_MSG(mono() - t0 >= 0.14, "back-off %.3f s (want 0.05 + 0.1)", mono() - t0);
    /* Scores listed in the "scorers" order (b, a), whatever the key order. */
    reply_for(text, sizeof text, fm_id(&q), "[{\"scores\":{\"a\":0.25,\"b\":0.5},\"total\":1.125}]");
    fake_send(r, &q, text);
    pthread_join(k.th, NULL);
    CHECK_MSG(k.rc == 0, "%s", k.err);
    CHECK(k.out[0].n_scores == 2 && !strcmp(k.out[0].scores[0].name, "b") && k.out[0].scores[0].value == 0.5 &&
          k.out[0].scores[0].weight == 2 && !strcmp(k.out[0].scores[1].name, "a") && k.out[0].scores[1].value == 0.25 &&
          k.out[0].total == 1.125);
    CHECK(reward_client_last_attempts(c) == 3);
    fmsg_free(&h), fmsg_free(&q);

    /* Malformed replies: the error names the field. */
    const char *bad[][2] = {
        {"[{\"scores\":{\"b\":0.5},\"total\":1}]", "\"rewards\"[0].scores.a"},
        {"[{\"scores\":{\"a\":0.25,\"b\":0.5},\"total\":1.125},{\"scores\":{\"a\":0,\"b\":0},\"total\":0}]",
         "\"rewards\" is not an array of 1"},
        {"[{\"scores\":{\"a\":0.25,\"b\":\"0.5\"},\"total\":1.125}]", "\"rewards\"[0].scores.b"},
        {"[{\"scores\":{\"a\":0.25,\"b\":0.5}}]", "\"rewards\"[0].total"},
        {"[{\"scores\":{\"a\":0.25,\"b\":0.5},\"total\":7}]", "not the weighted sum"},
        {"{}", "\"rewards\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        call_start(&k, c, 1);
        REQUIRE(fake_recv(r, &q) == 0);
        reply_for(text, sizeof text, fm_id(&q), bad[i][0]);
        fake_send(r, &q, text);
        pthread_join(k.th, NULL);
        CHECK_MSG(k.rc == -1 && strstr(k.err, bad[i][1]) && strstr(k.err, fm_id(&q)), "case %zu: %s", i, k.err);
        fmsg_free(&q);
    }
    /* A non-retryable error comes back with its code and reason, after one attempt. */
    call_start(&k, c, 1);
    REQUIRE(fake_recv(r, &q) == 0);
    snprintf(text, sizeof text,
             "{\"v\":1,\"type\":\"error\",\"id\":\"%s\",\"code\":\"bad_request\",\"reason\":\"field \\\"fps\\\" is odd\","
             "\"retryable\":false}",
             fm_id(&q));
    fake_send(r, &q, text);
    pthread_join(k.th, NULL);
    CHECK_MSG(k.rc == -1 && strstr(k.err, "bad_request: field \"fps\" is odd") && reward_client_last_attempts(c) == 1, "%s",
              k.err);
    fmsg_free(&q);

    /* A server that never answers: max_attempts sends (each on a fresh connection), then an error naming the
     * endpoint, the id and the attempts. */
    reward_client_close(c);
    c = reward_client_open(endpoint, "worker-7", 0.2, 3);
    REQUIRE(c);
    t0 = mono();
    call_start(&k, c, 1);
    int got = 0;
    for (int i = 0; i < 3; i++)
        if (fake_recv_request(r, &h, &q) == 0) got++, fmsg_free(&h), fmsg_free(&q);
    pthread_join(k.th, NULL);
    CHECK(got == 3);
    CHECK_MSG(k.rc == -1 && strstr(k.err, endpoint) && strstr(k.err, reward_client_last_id(c)) &&
                  strstr(k.err, "no answer after 3 attempts") && strstr(k.err, "no reply within 0.2 s"),
              "%s", k.err);
    CHECK(mono() - t0 < 2.0);
    reward_client_close(c);
    zmq_close(r);
    zmq_ctx_term(ctx);

    /* Nobody listening at all: the same error after the attempts, quickly. */
    c = reward_client_open(ep("nobody.sock"), "worker-7", 0.1, 3);
    REQUIRE(c);
    reward_result out[NV];
    t0 = mono();
    CHECK(reward_client_score(c, vids, 1, FR, HH, WW, 16, prompts, NULL, out) == -1);
    CHECK_MSG(strstr(core_last_error(), "nobody.sock") && strstr(core_last_error(), "no answer after 3 attempts") &&
                  strstr(core_last_error(), reward_client_last_id(c)) && strstr(core_last_error(), "no connection"),
              "%s", core_last_error());
    CHECK(mono() - t0 < 1.5);
    reward_client_close(c);
    for (int i = 0; i < NV; i++) json_decref(metas[i]), metas[i] = NULL;
}
