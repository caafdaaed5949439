/* reward/client.c — the reward client (see reward/client.h; protocol: reward/PROTOCOL.md sections 4 and 6).
 *
 * One request at a time. An attempt: (re)open the DEALER when there is none, wait until the connection takes
 * messages (ZMQ_IMMEDIATE: nothing is queued to a dead peer), on a fresh connection send `hello` and wait for its
 * reply (the server's max_videos_bytes: an oversized request would only get the connection dropped), send the
 * request, then read replies until the one
 * with this request's id arrives or the attempt's time-out passes. A time-out closes the socket, so the next attempt
 * starts on a fresh connection; the request keeps its id and bytes, and the server's idempotent cache makes a late
 * duplicate harmless. */
#include "reward/client.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "core/curve.h"
#include "core/error.h"
#include "core/wire.h"

/* Largest reply accepted (one frame): replies are headers only, ~1 KiB per video at 16 scorers. */
#define REPLY_MAX_BYTES ((size_t)64 << 20)

struct reward_client {
    char *endpoint, *client_id;
    double timeout_s;
    int max_attempts, tcp;
    void *ctx, *sock;
    int need_hello;
    char prefix[48];            /* start time + pid: ids stay unique across restarts of the same client id */
    unsigned long long counter; /* per request and per hello */
    char hello_id[CORE_WIRE_MAX_ID + 1];
    size_t max_videos_bytes;    /* from the last hello reply; 0: unknown */
    char last_id[CORE_WIRE_MAX_ID + 1];
    int last_attempts;
    char last_bad[256];         /* why the last unreadable message was ignored ("" if none) */
    int hello_ok;               /* the last hello reply listed its scorers well formed (hello_scorers) */
    reward_result hello_scorers; /* their names and weights (values 0) */
    char hello_bad[256];        /* else why not ("" before any hello reply) */
    int keyed;                  /* CURVE with `keys` (a copy), checking the reward server's public key */
    core_curve_keys keys;
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sleep_s(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

static int setopt_int(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }

static void sock_close(reward_client *c) {
    if (c->sock) zmq_close(c->sock);
    c->sock = NULL;
}

/* A fresh DEALER connected to the endpoint; the next send is preceded by a hello. */
static int sock_open(reward_client *c) {
    sock_close(c);
    void *s = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!s) return core_error("reward client: cannot create a socket: %s", zmq_strerror(zmq_errno()));
    int64_t maxmsg = (int64_t)REPLY_MAX_BYTES;
    int bad = setopt_int(s, ZMQ_LINGER, 0) || setopt_int(s, ZMQ_IMMEDIATE, 1) ||
              zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (!bad && c->tcp)
        bad = setopt_int(s, ZMQ_HEARTBEAT_IVL, 1000) || setopt_int(s, ZMQ_HEARTBEAT_TIMEOUT, 5000) ||
              setopt_int(s, ZMQ_HEARTBEAT_TTL, 10000);
    if (bad) {
        zmq_close(s);
        return core_error("reward client: socket options failed: %s", zmq_strerror(zmq_errno()));
    }
    if (c->keyed && core_curve_client(s, &c->keys, CORE_CURVE_REWARD) != 0) {
        zmq_close(s);
        return core_error_push("reward client: ");
    }
    if (zmq_connect(s, c->endpoint) != 0) {
        int e = zmq_errno();
        zmq_close(s);
        return core_error("reward client: cannot connect to \"%s\": %s", c->endpoint, zmq_strerror(e));
    }
    c->sock = s;
    c->need_hello = 1;
    return 0;
}

reward_client *reward_client_open(const char *endpoint, const char *client_id, double timeout_s, int max_attempts) {
    return reward_client_open_keys(endpoint, client_id, timeout_s, max_attempts, NULL);
}

reward_client *reward_client_open_keys(const char *endpoint, const char *client_id, double timeout_s, int max_attempts,
                                       const core_curve_keys *keys) {
    if (keys && (!core_curve_has(keys, CORE_CURVE_CLIENT, 1) || !core_curve_has(keys, CORE_CURVE_REWARD, 0))) {
        core_error("reward client: the keys lack client-public, client-secret or reward-public");
        return NULL;
    }
    if (!endpoint || (strncmp(endpoint, "ipc://", 6) && strncmp(endpoint, "tcp://", 6)) || !endpoint[6]) {
        core_error("reward client: endpoint \"%s\" is not ipc://PATH or tcp://HOST:PORT", endpoint ? endpoint : "(null)");
        return NULL;
    }
    if (!strncmp(endpoint, "ipc://", 6) && strlen(endpoint + 6) >= 100) {
        core_error("reward client: ipc path \"%s\" is %zu bytes (must be < 100)", endpoint + 6, strlen(endpoint + 6));
        return NULL;
    }
    if (!client_id || !*client_id || strlen(client_id) > CORE_WIRE_MAX_ID) {
        core_error("reward client: client id \"%s\" must be 1..%d bytes", client_id ? client_id : "(null)", CORE_WIRE_MAX_ID);
        return NULL;
    }
    if (!(timeout_s > 0) || !isfinite(timeout_s) || max_attempts < 1) {
        core_error("reward client: timeout_s (%g) must be > 0 and max_attempts (%d) >= 1", timeout_s, max_attempts);
        return NULL;
    }
    reward_client *c = calloc(1, sizeof *c);
    if (!c) {
        core_error("reward client: out of memory");
        return NULL;
    }
    c->endpoint = strdup(endpoint);
    c->client_id = strdup(client_id);
    c->timeout_s = timeout_s;
    c->max_attempts = max_attempts;
    c->tcp = !strncmp(endpoint, "tcp://", 6);
    if (keys) c->keys = *keys, c->keyed = 1;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    snprintf(c->prefix, sizeof c->prefix, "%llx.%x",
             (unsigned long long)t.tv_sec * 1000000ull + (unsigned long long)t.tv_nsec / 1000, (unsigned)getpid());
    c->ctx = zmq_ctx_new();
    if (!c->endpoint || !c->client_id || !c->ctx) {
        core_error("reward client: out of memory");
        reward_client_close(c);
        return NULL;
    }
    if (sock_open(c) != 0) {
        reward_client_close(c);
        return NULL;
    }
    return c;
}

void reward_client_close(reward_client *c) {
    if (!c) return;
    sock_close(c);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c->endpoint);
    free(c->client_id);
    memset(&c->keys, 0, sizeof c->keys); /* no secret left in freed memory */
    free(c);
}

const char *reward_client_last_id(const reward_client *c) { return c->last_id; }
int reward_client_last_attempts(const reward_client *c) { return c->last_attempts; }

/* Sends the frames (hello when `hello`, else the request b) once the connection takes messages. Returns 0 sent,
 * 1 the deadline passed first (no live connection), -1 a socket error (core_error). */
static int send_frames(reward_client *c, const core_wire_built *b, double deadline) {
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return 1;
        zmq_pollitem_t it = {c->sock, 0, ZMQ_POLLOUT, 0};
        int np = zmq_poll(&it, 1, (long)(left * 1000) + 1);
        if (np < 0) {
            if (zmq_errno() == EINTR) continue;
            return core_error("reward client: poll failed: %s", zmq_strerror(zmq_errno()));
        }
        if (!(it.revents & ZMQ_POLLOUT)) continue;
        int i = 0;
        for (; i < b->n_frames; i++) {
            int flags = (i + 1 < b->n_frames ? ZMQ_SNDMORE : 0) | (i == 0 ? ZMQ_DONTWAIT : 0);
            if (zmq_send(c->sock, b->frames[i].data, b->frames[i].len, flags) < 0) break;
        }
        if (i == b->n_frames) return 0;
        if (i == 0 && (zmq_errno() == EAGAIN || zmq_errno() == EINTR)) continue;
        return core_error("reward client: send failed: %s", zmq_strerror(zmq_errno()));
    }
}

/* Receives one message before the deadline into *m (parsed header only: tensor frames, which no reply to a client
 * carries, are dropped; free with core_wire_msg_free). Returns 0, 1 on time-out, -1 on a socket error. An unparsable
 * message is dropped (remembered in last_bad) and reading goes on. */
static int recv_msg(reward_client *c, double deadline, core_wire_msg *m) {
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return 1;
        zmq_pollitem_t it = {c->sock, 0, ZMQ_POLLIN, 0};
        int np = zmq_poll(&it, 1, (long)(left * 1000) + 1);
        if (np < 0) {
            if (zmq_errno() == EINTR) continue;
            return core_error("reward client: poll failed: %s", zmq_strerror(zmq_errno()));
        }
        if (!(it.revents & ZMQ_POLLIN)) continue;
        zmq_msg_t fr[17];
        int n = 0, more = 1, lost = 0;
        while (more) {
            zmq_msg_t tmp, *dst = n < 17 ? &fr[n] : &tmp;
            zmq_msg_init(dst);
            if (zmq_msg_recv(dst, c->sock, 0) < 0) {
                zmq_msg_close(dst);
                lost = 1;
                break;
            }
            more = zmq_msg_more(dst);
            if (dst == &tmp) zmq_msg_close(&tmp), lost = 1;
            else n++;
        }
        core_wire_frame wf[17];
        for (int i = 0; i < n; i++) wf[i] = (core_wire_frame){zmq_msg_data(&fr[i]), zmq_msg_size(&fr[i])};
        core_wire_limits lim = {REPLY_MAX_BYTES, REPLY_MAX_BYTES, REPLY_MAX_BYTES, 16};
        int rc = lost ? core_error("more than 16 tensor frames") : core_wire_parse(wf, n, &lim, m);
        /* The header is parsed into its own JSON; replies carry no tensors we use, so the frames can go now. */
        if (rc == 0) {
            free(m->tensors);
            m->tensors = NULL;
            m->n_tensors = 0;
        }
        for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
        if (rc == 0) return 0;
        snprintf(c->last_bad, sizeof c->last_bad, "%s", core_last_error());
    }
}

/* The "scorers" field of a hello or score_reply ([{"name", "weight"}, ...]) into proto's names and weights (values
 * 0). -1 with core_error naming the field. */
static int parse_scorers(const json_t *scorers, reward_result *proto) {
    size_t ns = json_is_array(scorers) ? json_array_size(scorers) : 0;
    if (ns < 1 || ns > REWARD_CLIENT_MAX_SCORERS)
        return core_error("field \"scorers\" is not an array of 1..%d scorers", REWARD_CLIENT_MAX_SCORERS);
    memset(proto, 0, sizeof *proto);
    proto->n_scores = (int)ns;
    for (size_t s = 0; s < ns; s++) {
        json_t *e = json_array_get(scorers, s), *nm = json_object_get(e, "name"), *w = json_object_get(e, "weight");
        if (!json_is_string(nm) || json_string_length(nm) < 1 || json_string_length(nm) >= REWARD_CLIENT_MAX_NAME ||
            strlen(json_string_value(nm)) != json_string_length(nm))
            return core_error("field \"scorers\"[%zu].name is not a string of 1..%d bytes", s, REWARD_CLIENT_MAX_NAME - 1);
        if (!json_is_number(w) || !isfinite(json_number_value(w)))
            return core_error("field \"scorers\"[%zu].weight is not a finite number", s);
        for (size_t t = 0; t < s; t++)
            if (!strcmp(proto->scores[t].name, json_string_value(nm)))
                return core_error("field \"scorers\" names \"%s\" twice", json_string_value(nm));
        snprintf(proto->scores[s].name, REWARD_CLIENT_MAX_NAME, "%s", json_string_value(nm));
        proto->scores[s].weight = json_number_value(w);
    }
    return 0;
}

/* Checks a score_reply and fills out[0..n). Errors name the field. */
static int take_reply(reward_client *c, const json_t *h, int n, reward_result *out) {
    const char *id = c->last_id;
#define BAD(...) (core_error(__VA_ARGS__), core_error_push("reward server %s: reply to request %s: ", c->endpoint, id))
    json_t *rewards = json_object_get(h, "rewards"), *scorers = json_object_get(h, "scorers");
    if (!json_is_array(rewards) || json_array_size(rewards) != (size_t)n)
        return BAD("field \"rewards\" is not an array of %d entries (got %zu)", n,
                   json_is_array(rewards) ? json_array_size(rewards) : 0);
    reward_result proto;
    if (parse_scorers(scorers, &proto))
        return core_error_push("reward server %s: reply to request %s: ", c->endpoint, id);
    for (int i = 0; i < n; i++) {
        json_t *r = json_array_get(rewards, (size_t)i), *tot = json_object_get(r, "total"), *sc = json_object_get(r, "scores");
        if (!json_is_number(tot) || !isfinite(json_number_value(tot)))
            return BAD("field \"rewards\"[%d].total is missing or not a finite number", i);
        if (!json_is_object(sc)) return BAD("field \"rewards\"[%d].scores is missing or not an object", i);
        out[i] = proto;
        out[i].total = json_number_value(tot);
        double sum = 0, mag = 0;
        for (int s = 0; s < proto.n_scores; s++) {
            json_t *v = json_object_get(sc, proto.scores[s].name);
            if (!json_is_number(v) || !isfinite(json_number_value(v)))
                return BAD("field \"rewards\"[%d].scores.%s is missing or not a finite number", i, proto.scores[s].name);
            out[i].scores[s].value = json_number_value(v);
            sum += proto.scores[s].weight * out[i].scores[s].value;
            mag += fabs(proto.scores[s].weight * out[i].scores[s].value);
        }
        /* total = sum of weight x score (PROTOCOL.md): a peer may sum in another order, hence the tolerance. */
        if (!(fabs(out[i].total - sum) <= 1e-9 * (1 + mag)))
            return BAD("field \"rewards\"[%d].total = %.17g is not the weighted sum of its scores (%.17g)", i,
                       out[i].total, sum);
    }
#undef BAD
    return 0;
}

/* On a fresh connection: sends hello and waits for its reply (other messages are dropped), so the server knows
 * the client id before the request arrives and the client knows the server's max_videos_bytes before sending
 * videos that would get the connection dropped. Returns 0, 1 on time-out, -1 on a socket error. */
static int say_hello(reward_client *c, double deadline) {
    json_t *f = json_pack("{s:s}", "client", c->client_id);
    core_wire_built h;
    snprintf(c->hello_id, sizeof c->hello_id, "%s-h%llu", c->prefix, ++c->counter);
    int rc = f ? core_wire_build(CORE_WIRE_HELLO, c->hello_id, f, NULL, 0, &h) : -1;
    json_decref(f);
    if (rc != 0) return core_error_push("reward client: hello: ");
    c->hello_ok = 0;
    rc = send_frames(c, &h, deadline);
    core_wire_built_free(&h);
    while (rc == 0) {
        core_wire_msg m;
        rc = recv_msg(c, deadline, &m);
        if (rc != 0) break;
        int mine = !strcmp(m.id, c->hello_id);
        if (mine && m.type == CORE_WIRE_HELLO) { /* an error reply to hello (a peer without it) is no limit */
            json_t *mx = json_object_get(m.header, "max_videos_bytes");
            if (json_is_integer(mx) && json_integer_value(mx) > 0) c->max_videos_bytes = (size_t)json_integer_value(mx);
            c->hello_ok = parse_scorers(json_object_get(m.header, "scorers"), &c->hello_scorers) == 0;
            if (!c->hello_ok) snprintf(c->hello_bad, sizeof c->hello_bad, "%s", core_last_error());
        }
        core_wire_msg_free(&m);
        if (mine) {
            c->need_hello = 0;
            return 0;
        }
    }
    return rc;
}

/* Builds the score_request: header fields fps and items, one tensor "videos". Errors name the argument. */
static int build_request(reward_client *c, const uint8_t *videos, int n, int frames, int height, int width, double fps,
                         const char *const *prompts, const json_t *const *metadata, core_wire_built *b) {
    if (n < 1 || frames < 1 || height < 1 || width < 1 || !videos)
        return core_error("reward client: videos [%d, %d, %d, %d, 3] need every dim >= 1 and data", n, frames, height, width);
    if (!(fps > 0) || !isfinite(fps)) return core_error("reward client: fps %g must be a finite number > 0", fps);
    if (!prompts) return core_error("reward client: prompts is NULL");
    json_t *items = json_array();
    int rc = items ? 0 : core_error("reward client: out of memory");
    for (int i = 0; i < n && !rc; i++) {
        json_t *p = prompts[i] ? json_string(prompts[i]) : NULL;
        if (!p) {
            rc = core_error("reward client: prompts[%d] is NULL or not UTF-8", i);
            break;
        }
        json_t *it = json_pack("{s:o}", "prompt", p);
        const json_t *md = metadata ? metadata[i] : NULL;
        if (md) {
            const char *k;
            json_t *v;
            if (!json_is_object(md)) rc = core_error("reward client: metadata[%d] is not a JSON object", i);
            json_object_foreach((json_t *)md, k, v) {
                if (!rc && !json_is_string(v)) rc = core_error("reward client: metadata[%d].%s is not a string", i, k);
            }
            if (!rc) json_object_set_new(it, "metadata", json_deep_copy(md));
        }
        json_array_append_new(items, it);
    }
    json_t *f = rc ? NULL : json_pack("{s:f, s:O}", "fps", fps, "items", items);
    json_decref(items);
    if (rc) return rc;
    if (!f) return core_error("reward client: out of memory");
    core_wire_tensor t = {.name = "videos", .dtype = CORE_U8, .ndim = 5, .shape = {n, frames, height, width, 3},
                          .data = videos};
    if (core_wire_nbytes(CORE_U8, 5, t.shape, &t.nbytes) != 0) {
        json_decref(f);
        return core_error_push("reward client: videos: ");
    }
    snprintf(c->last_id, sizeof c->last_id, "%s-%llu", c->prefix, ++c->counter);
    rc = core_wire_build(CORE_WIRE_SCORE_REQUEST, c->last_id, f, &t, 1, b);
    json_decref(f);
    return rc ? core_error_push("reward client: ") : 0;
}

static int too_big(const reward_client *c, size_t vbytes) {
    return core_error("reward server %s: request %s: videos are %zu bytes, over the server's max_videos_bytes %zu "
                      "(send fewer or smaller videos per request)",
                      c->endpoint, c->last_id, vbytes, c->max_videos_bytes);
}

int reward_client_scorers(reward_client *c, reward_result *out) {
    c->last_attempts = 0;
    c->hello_bad[0] = 0;
    for (int attempt = 1; attempt <= c->max_attempts; attempt++) {
        if (!c->sock && sock_open(c) != 0) return -1;
        c->last_attempts = attempt;
        c->need_hello = 1; /* a hello of its own even on a live connection: the server's list as it is now */
        const int s = say_hello(c, now_s() + c->timeout_s);
        if (s < 0) return -1;
        if (s == 0) {
            if (!c->hello_ok)
                return core_error("reward server %s: hello reply: %s", c->endpoint,
                                  c->hello_bad[0] ? c->hello_bad : "an error instead of a hello reply");
            *out = c->hello_scorers;
            return 0;
        }
        sock_close(c); /* time-out: a fresh connection for the next attempt */
    }
    return core_error("reward server %s: no hello reply after %d attempt%s of %g s", c->endpoint, c->last_attempts,
                      c->last_attempts == 1 ? "" : "s", c->timeout_s);
}

int reward_client_score(reward_client *c, const uint8_t *videos, int n, int frames, int height, int width, double fps,
                        const char *const *prompts, const json_t *const *metadata, reward_result *out) {
    core_wire_built b;
    memset(&b, 0, sizeof b);
    c->last_attempts = 0;
    if (build_request(c, videos, n, frames, height, width, fps, prompts, metadata, &b) != 0) return -1;
    const char *id = c->last_id;
    size_t vbytes = b.frames[1].len;
    char last_why[CORE_ERROR_MAX] = "no reply";
    int rc = 1, retryable_in_a_row = 0; /* rc 1: keep trying */
    c->last_bad[0] = 0;
    for (int attempt = 1; attempt <= c->max_attempts && rc == 1; attempt++) {
        if (c->max_videos_bytes && vbytes > c->max_videos_bytes) {
            rc = too_big(c, vbytes);
            break;
        }
        if (!c->sock && sock_open(c) != 0) {
            rc = -1;
            break;
        }
        c->last_attempts = attempt;
        double deadline = now_s() + c->timeout_s;
        int s = c->need_hello ? say_hello(c, deadline) : 0;
        if (s == 0 && c->max_videos_bytes && vbytes > c->max_videos_bytes) {
            rc = too_big(c, vbytes);
            break;
        }
        if (s == 0) s = send_frames(c, &b, deadline);
        if (s < 0) {
            rc = -1;
            break;
        }
        if (s == 1) snprintf(last_why, sizeof last_why, "no connection or no hello reply within %g s", c->timeout_s);
        while (s == 0) { /* read until our reply or the deadline */
            core_wire_msg m;
            int r = recv_msg(c, deadline, &m);
            if (r < 0) {
                rc = -1;
                break;
            }
            if (r == 1) {
                snprintf(last_why, sizeof last_why, "no reply within %g s", c->timeout_s);
                s = 1;
                break;
            }
            if (strcmp(m.id, id)) { /* a stale repeat of an earlier request, or a late hello reply */
                core_wire_msg_free(&m);
                continue;
            }
            if (m.type == CORE_WIRE_SCORE_REPLY) {
                rc = take_reply(c, m.header, n, out) == 0 ? 0 : -1;
            } else if (m.type == CORE_WIRE_ERROR) {
                const char *code = json_string_value(json_object_get(m.header, "code"));
                const char *why = json_string_value(json_object_get(m.header, "reason"));
                int retry = json_is_true(json_object_get(m.header, "retryable")) ||
                            (code && (!strcmp(code, "busy") || !strcmp(code, "shutting_down")));
                snprintf(last_why, sizeof last_why, "%s: %s", code ? code : "(no code)", why ? why : "(no reason)");
                if (retry) {
                    s = 3;
                } else {
                    rc = core_error("reward server %s: request %s: %s", c->endpoint, id, last_why);
                }
            } else {
                rc = core_error("reward server %s: request %s: unexpected reply of type \"%s\"", c->endpoint, id,
                                core_wire_type_name(m.type));
            }
            core_wire_msg_free(&m);
            break;
        }
        if (rc != 1) break;
        if (s == 1) { /* time-out: a fresh connection for the next attempt (the old one may be dead) */
            retryable_in_a_row = 0;
            sock_close(c);
        } else if (s == 3) { /* busy / shutting_down: back off 50 ms, doubling, at most 1 s */
            double wait = 0.05 * (double)(1 << (retryable_in_a_row < 5 ? retryable_in_a_row : 5));
            retryable_in_a_row++;
            if (attempt < c->max_attempts) sleep_s(wait < 1.0 ? wait : 1.0);
        }
    }
    if (rc == 1)
        rc = core_error("reward server %s: request %s: no answer after %d attempt%s (last: %s%s%s)", c->endpoint, id,
                        c->last_attempts, c->last_attempts == 1 ? "" : "s", last_why,
                        c->last_bad[0] ? "; an unreadable message was ignored: " : "", c->last_bad);
    core_wire_built_free(&b);
    return rc;
}
