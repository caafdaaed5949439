/* reward/server.c — the reward server's sockets and threads (see reward/server.h and reward/PROTOCOL.md); what it
 * does with each message is reward/server_requests.c, its bounds on connections and memory reward/server_guard.c.
 *
 * Threads: the main thread owns the ROUTER, the guard's ZAP and monitor sockets and an inproc PULL socket; each
 * scoring thread owns a PUSH socket to that PULL (ZeroMQ sockets are not thread-safe, the context is). Jobs go to
 * the scoring threads through a mutex-protected list. */
#include "reward/server.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "core/curve.h"
#include "core/error.h"
#include "core/wire_zmq.h"
#include "kernels/cpu/cpu.h"
#include "reward/server_guard.h"
#include "reward/server_requests.h"

#define DONE_EP "inproc://vgrpo-reward-done"

typedef struct job {
    struct job *next;
    zmq_msg_t *frames; /* after the routing id */
    int n_frames;
    core_wire_msg msg; /* borrows frames */
    int slot;
    uint64_t gen;
    size_t bytes;
} job;

typedef struct {
    const reward_server_config *cfg;
    void *ctx, *router, *done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    int qlen, quit;     /* under mu */
    long long videos;   /* under mu */
    int in_flight;      /* main thread: jobs queued or being scored */
    size_t held;        /* main thread: their bytes */
    reward_requests *req;
    reward_guard *guard;
    reward_server_stats st;
} server;

static void job_free(job *j) {
    if (!j) return;
    core_wire_msg_free(&j->msg);
    for (int i = 0; i < j->n_frames; i++) zmq_msg_close(&j->frames[i]);
    free(j->frames);
    free(j);
}

/* Never blocks: a peer whose reply queue is full (it does not read its replies) or that is gone loses this reply
 * (counted undeliverable; it may re-send the id and get the cached reply). A blocking send would let one peer that
 * stopped reading stall the single socket thread, SNDTIMEO per message, for every other client. */
static void send_to(server *s, const uint8_t *rid, size_t rid_len, const char *text, size_t len) {
    if (!text) return;
    if (zmq_send(s->router, rid, rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(s->router, text, len, ZMQ_DONTWAIT) < 0)
        s->st.undeliverable++;
}

static void *worker_main(void *arg) {
    server *s = arg;
    void *push = zmq_socket(s->ctx, ZMQ_PUSH);
    int linger = 1000;
    if (push) zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    if (!push || zmq_connect(push, DONE_EP) != 0) {
        if (push) zmq_close(push);
        return NULL; /* the main thread notices a lost thread only as a slower server; cannot happen for inproc */
    }
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
        job *j = s->head;
        if (j) {
            s->head = j->next;
            if (!s->head) s->tail = NULL;
            s->qlen--;
        }
        pthread_mutex_unlock(&s->mu);
        if (!j) break;
        int ok = 0;
        char *text = reward_requests_reply_text(&j->msg, s->cfg->scorers, s->cfg->n_scorers, &ok);
        if (ok) {
            pthread_mutex_lock(&s->mu);
            s->videos += core_wire_find(&j->msg, "videos")->shape[0];
            pthread_mutex_unlock(&s->mu);
        }
        uint64_t tag[4] = {(uint64_t)j->slot, j->gen, (uint64_t)ok, (uint64_t)j->bytes};
        zmq_send(push, tag, sizeof tag, ZMQ_SNDMORE);
        zmq_send(push, text ? text : "", text ? strlen(text) : 0, 0);
        free(text);
        job_free(j);
    }
    zmq_close(push);
    k_cpu_release_thread(); /* the learned scorers' kernel scratch on this thread (reward/learned.h) */
    return NULL;
}

/* Carries out what reward_requests_handle decided for one message; takes the frames (n of them, or 18 for "too
 * many": only 17 are held). */
static void handle(server *s, const reward_peer *peer, zmq_msg_t *frames, int n, int *stop_req) {
    core_wire_frame wf[REWARD_MAX_FRAMES];
    int held_n = n < REWARD_MAX_FRAMES ? n : REWARD_MAX_FRAMES;
    for (int i = 0; i < held_n; i++) wf[i] = (core_wire_frame){zmq_msg_data(&frames[i]), zmq_msg_size(&frames[i])};
    pthread_mutex_lock(&s->mu);
    int queued = s->qlen;
    pthread_mutex_unlock(&s->mu);
    reward_action act;
    reward_requests_handle(s->req, peer, wf, n, queued, s->held, &act);
    s->st.repeats += act.repeat;
    if (act.verb == REWARD_SEND || act.verb == REWARD_STOP) {
        send_to(s, peer->id, peer->len, act.reply, act.reply_len);
        if (act.error) s->st.errors++;
        else if (act.repeat) s->st.replies++;
        if (act.verb == REWARD_STOP) *stop_req = 1;
    }
    free(act.reply);
    job *j = act.verb == REWARD_SCORE ? calloc(1, sizeof *j) : NULL;
    if (act.verb == REWARD_SCORE && !j) { /* out of memory: dropped unanswered; the client re-sends */
        core_wire_msg_free(&act.msg);
        reward_requests_done(s->req, act.slot, act.gen, "", 0, 0, (reward_peer[REWARD_MAX_WAITERS]){0});
    }
    if (!j) {
        for (int i = 0; i < held_n; i++) zmq_msg_close(&frames[i]);
        free(frames);
        return;
    }
    j->frames = frames;
    j->n_frames = held_n;
    j->msg = act.msg;
    j->slot = act.slot;
    j->gen = act.gen;
    j->bytes = act.bytes;
    s->held += j->bytes;
    s->in_flight++;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->qlen++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Receives one whole multipart message from the ROUTER. Frames past 17 are read and dropped. */
static void recv_router(server *s, int *stop_req) {
    zmq_msg_t rid;
    zmq_msg_init(&rid);
    if (zmq_msg_recv(&rid, s->router, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&rid);
        return;
    }
    s->st.received++;
    int more = zmq_msg_more(&rid), n = 0, over = 0;
    zmq_msg_t *frames = calloc(REWARD_MAX_FRAMES, sizeof *frames);
    while (more) {
        zmq_msg_t tmp, *dst = (frames && n < REWARD_MAX_FRAMES) ? &frames[n] : &tmp;
        zmq_msg_init(dst);
        if (zmq_msg_recv(dst, s->router, 0) < 0) {
            zmq_msg_close(dst);
            break;
        }
        more = zmq_msg_more(dst);
        if (dst == &tmp) {
            zmq_msg_close(&tmp);
            over = 1;
        } else {
            n++;
        }
    }
    size_t rl = zmq_msg_size(&rid);
    /* Second line behind the ZAP handler (PROTOCOL.md section 9): with keys, a message from a connection it did not
     * admit is not read; it gets `unauthenticated`. */
    const char *user = (s->cfg->keys && frames && n > 0) ? core_curve_peer(&frames[0]) : NULL;
    int stranger = s->cfg->keys && (!user || strcmp(user, CORE_CURVE_USER_ID));
    if (stranger && rl >= 1 && rl <= REWARD_MAX_PEER) {
        char *t = reward_requests_error_text("", "unauthenticated", "the connection is not authenticated with the run's keys");
        send_to(s, zmq_msg_data(&rid), rl, t, t ? strlen(t) : 0);
        free(t);
        s->st.errors++;
    }
    if (!stranger && frames && n > 0) reward_guard_authenticated(s->guard, zmq_msg_get(&frames[0], ZMQ_SRCFD));
    if (!frames || rl > REWARD_MAX_PEER || rl < 1 || stranger) {
        for (int i = 0; i < n; i++) zmq_msg_close(&frames[i]);
        free(frames);
    } else {
        reward_peer peer;
        peer.len = rl;
        memcpy(peer.id, zmq_msg_data(&rid), rl);
        handle(s, &peer, frames, over ? REWARD_MAX_FRAMES + 1 : n, stop_req);
    }
    zmq_msg_close(&rid);
}

/* Receives one finished reply from a scoring thread, caches it and sends it to every connection waiting for it. */
static void recv_done(server *s) {
    uint64_t tag[4];
    zmq_msg_t body;
    if (zmq_recv(s->done, tag, sizeof tag, ZMQ_DONTWAIT) != (int)sizeof tag) return;
    zmq_msg_init(&body);
    if (zmq_msg_recv(&body, s->done, 0) < 0) {
        zmq_msg_close(&body);
        return;
    }
    s->in_flight--;
    s->held -= (size_t)tag[3];
    reward_peer to[REWARD_MAX_WAITERS];
    int n = reward_requests_done(s->req, (int)tag[0], tag[1], zmq_msg_data(&body), zmq_msg_size(&body), (int)tag[2], to);
    for (int i = 0; i < n; i++) {
        send_to(s, to[i].id, to[i].len, zmq_msg_data(&body), zmq_msg_size(&body));
        if (tag[2]) s->st.replies++;
        else s->st.errors++;
    }
    zmq_msg_close(&body);
}

static int setopt_int(void *sock, int opt, int v) { return zmq_setsockopt(sock, opt, &v, sizeof v); }

/* The ROUTER's options (PROTOCOL.md section 6), all before it binds.
 * ZMQ_RCVHWM 2: at most two complete messages wait in libzmq per connection (1 would do, but libzmq 4.3.4 then
 * never delivers a CURVE peer's messages). No ZMTP heartbeats of the server's own: in libzmq 4.3.4 (and master as
 * of 2025) a connection whose input is stopped at the high-water mark when its peer hangs up is left with
 * _io_error set, and the next heartbeat tick asserts in out_event (stream_engine_base.cpp:331), aborting the
 * process; a peer could trigger that at will. Dead clients are still found: their PINGs carry a TTL
 * (ZMQ_HEARTBEAT_TTL on the client) that the server's libzmq enforces, and TCP keepalive covers the rest. */
static int router_options(server *s) {
    const reward_server_config *cfg = s->cfg;
    int64_t maxmsg = (int64_t)cfg->max_frame_bytes;
    return setopt_int(s->router, ZMQ_ROUTER_MANDATORY, 1) || setopt_int(s->router, ZMQ_LINGER, 100) ||
           setopt_int(s->router, ZMQ_SNDTIMEO, 1000) || zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
           setopt_int(s->router, ZMQ_RCVHWM, 2) || setopt_int(s->router, ZMQ_HANDSHAKE_IVL, 5000) ||
           setopt_int(s->router, ZMQ_TCP_KEEPALIVE, 1) || setopt_int(s->router, ZMQ_TCP_KEEPALIVE_IDLE, 30) ||
           setopt_int(s->router, ZMQ_TCP_KEEPALIVE_INTVL, 10) || setopt_int(s->router, ZMQ_TCP_KEEPALIVE_CNT, 3);
}

int reward_server_run(const reward_server_config *cfg, volatile sig_atomic_t *stop, reward_server_stats *stats) {
    if (cfg->n_scorers < 1 || cfg->threads < 1 || cfg->queue < 1 || cfg->cache < 1 || cfg->max_peers < 1 ||
        !cfg->max_frame_bytes || !cfg->endpoint)
        return core_error("reward server: needs an endpoint, a frame limit, >= 1 scorer, thread, queue slot, cache "
                          "entry and peer");
    if (!strncmp(cfg->endpoint, "ipc://", 6) && strlen(cfg->endpoint + 6) >= 100)
        return core_error("reward server: ipc path \"%s\" is %zu bytes (must be < 100)", cfg->endpoint + 6,
                          strlen(cfg->endpoint + 6));
    server *s = calloc(1, sizeof *s);
    if (!s) return core_error("reward server: out of memory");
    s->cfg = cfg;
    s->req = reward_requests_new(cfg);
    pthread_t *th = calloc((size_t)cfg->threads, sizeof *th);
    int n_th = 0, rc = 0;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->ctx = zmq_ctx_new();
    if (!s->req || !th || !s->ctx) {
        rc = core_error("reward server: out of memory");
        goto out;
    }
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    s->done = zmq_socket(s->ctx, ZMQ_PULL);
    if (!s->router || !s->done || router_options(s) || setopt_int(s->done, ZMQ_LINGER, 0)) {
        rc = core_error("reward server: socket setup failed: %s", zmq_strerror(zmq_errno()));
        goto out;
    }
    if (cfg->keys && (!core_curve_has(cfg->keys, CORE_CURVE_CLIENT, 0) ||
                      core_curve_server(s->router, cfg->keys, CORE_CURVE_REWARD) != 0)) {
        rc = core_curve_has(cfg->keys, CORE_CURVE_CLIENT, 0) ? core_error_push("reward server: ")
                                                             : core_error("reward server: the keys lack client-public");
        goto out;
    }
    if (!(s->guard = reward_guard_open(s->ctx, s->router, cfg->max_peers, reward_server_memory_budget(cfg),
                                       cfg->keys ? cfg->keys->pub[CORE_CURVE_CLIENT] : NULL))) {
        rc = -1;
        goto out;
    }
    if (zmq_bind(s->done, DONE_EP) != 0) {
        rc = core_error("reward server: cannot bind %s: %s", DONE_EP, zmq_strerror(zmq_errno()));
        goto out;
    }
    if (core_zmq_bind(s->router, cfg->endpoint) != 0) { /* an ipc:// socket file: 0600 whatever the umask */
        rc = core_error_push("reward server: ");
        goto out;
    }
    if (cfg->on_bound) {
        char bound[512] = "";
        size_t bl = sizeof bound;
        if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, bound, &bl) != 0) {
            rc = core_error("reward server: cannot read its bound endpoint: %s", zmq_strerror(zmq_errno()));
            goto out;
        }
        if (cfg->on_bound(cfg->on_bound_ctx, bound) != 0) {
            rc = -1;
            goto out;
        }
    }
    for (; n_th < cfg->threads; n_th++)
        if (pthread_create(&th[n_th], NULL, worker_main, s) != 0) {
            rc = core_error("reward server: cannot start scoring thread %d", n_th);
            goto out;
        }
    int stop_req = 0;
    struct timespec t_stop = {0, 0};
    for (;;) {
        int stopping = stop_req || (stop && *stop);
        if (stopping) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (!t_stop.tv_sec) t_stop = now;
            if (s->in_flight == 0 || now.tv_sec - t_stop.tv_sec > 10) break;
        }
        /* 10 ms: the memory check must run even while nothing is readable (a message still arriving is not). */
        zmq_pollitem_t items[4] = {{s->done, 0, ZMQ_POLLIN, 0}, {0}, {0}, {s->router, 0, ZMQ_POLLIN, 0}};
        reward_guard_pollitems(s->guard, items + 1);
        int np = zmq_poll(items, stopping ? 3 : 4, 10);
        if (np < 0) {
            if (zmq_errno() == EINTR) continue;
            rc = core_error("reward server: poll failed: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if ((items[1].revents | items[2].revents) & ZMQ_POLLIN) reward_guard_serve(s->guard);
        if (items[0].revents & ZMQ_POLLIN) recv_done(s);
        if (!stopping && (items[3].revents & ZMQ_POLLIN)) recv_router(s, &stop_req);
        reward_guard_check_memory(s->guard);
    }
out:
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    for (job *j = s->head, *nx; j; j = nx) { /* requests still queued at the 10 s limit are dropped */
        nx = j->next;
        job_free(j);
    }
    s->head = s->tail = NULL;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    s->st.videos = s->videos;
    if (s->guard) {
        s->st.refused = reward_guard_refused(s->guard);
        s->st.dropped = reward_guard_dropped(s->guard);
    }
    if (stats) *stats = s->st;
    reward_guard_close(s->guard);
    if (s->router) zmq_close(s->router);
    if (s->done) zmq_close(s->done);
    if (s->ctx) zmq_ctx_term(s->ctx);
    reward_requests_free(s->req);
    free(th);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return rc;
}
