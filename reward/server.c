/* reward/server.c — the reward server (see reward/server.h and reward/PROTOCOL.md).
 *
 * Threads: the main thread owns the ROUTER and an inproc PULL socket; each scoring thread owns a PUSH socket to
 * that PULL (ZeroMQ sockets are not thread-safe, the context is). Jobs go to the scoring threads through a mutex-
 * protected list. Repeats are found by a linear scan of the reply cache: at the default 4096 entries this costs
 * microseconds per request, far below scoring; a hash table would be the fix if the cache grew large. */
#include "reward/server.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "core/error.h"

#define DONE_EP "inproc://vgrpo-reward-done"
#define MAX_RID 256
#define MAX_CLIENTS 1024

void reward_server_config_default(reward_server_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->threads = 2;
    cfg->queue = 64;
    cfg->max_frame_bytes = (size_t)1 << 30;
    cfg->cache = 4096;
}

int reward_server_parse_scorers(reward_server_config *cfg, const char *spec) {
    cfg->n_scorers = 0;
    if (!spec || !*spec) return core_error("--scorers: empty list (expected NAME:WEIGHT,...)");
    char *s = strdup(spec), *save = NULL;
    if (!s) return core_error("--scorers: out of memory");
    int rc = 0;
    for (char *tok = strtok_r(s, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        double w = 1.0;
        if (colon) {
            *colon = 0;
            char *end;
            errno = 0;
            w = strtod(colon + 1, &end);
            if (end == colon + 1 || *end || errno || !isfinite(w)) {
                rc = core_error("--scorers: entry \"%s\": weight \"%s\" is not a finite number", tok, colon + 1);
                break;
            }
        }
        const reward_scorer *sc = reward_find(tok);
        if (!sc) {
            rc = core_error_push("--scorers: ");
            break;
        }
        for (int i = 0; i < cfg->n_scorers; i++)
            if (cfg->scorers[i].scorer == sc) rc = core_error("--scorers: scorer \"%s\" is named twice", tok);
        if (!rc && cfg->n_scorers == REWARD_SERVER_MAX_SCORERS)
            rc = core_error("--scorers: more than %d scorers", REWARD_SERVER_MAX_SCORERS);
        if (!rc) cfg->scorers[cfg->n_scorers++] = (reward_weighted){sc, w};
    }
    free(s);
    if (!rc && cfg->n_scorers == 0) rc = core_error("--scorers: empty list (expected NAME:WEIGHT,...)");
    return rc;
}

int reward_check_score_request(const core_wire_msg *m) {
    const core_wire_tensor *v = core_wire_find(m, "videos");
    if (!v || m->n_tensors != 1) return core_error("score_request: needs exactly one tensor, \"videos\"");
    if (v->dtype != CORE_U8 || v->ndim != 5 || v->shape[4] != 3)
        return core_error("score_request: tensor \"videos\" must be U8 [N, F, H, W, 3]");
    for (int d = 0; d < 4; d++)
        if (v->shape[d] < 1) return core_error("score_request: tensor \"videos\" has shape[%d] = 0 (must be >= 1)", d);
    json_t *fps = json_object_get(m->header, "fps");
    if (!json_is_number(fps) || !(json_number_value(fps) > 0) || !isfinite(json_number_value(fps)))
        return core_error("score_request: field \"fps\" is missing or not a number > 0");
    json_t *items = json_object_get(m->header, "items");
    if (!json_is_array(items) || (int64_t)json_array_size(items) != v->shape[0])
        return core_error("score_request: field \"items\" must be an array of %lld objects (one per video)",
                          (long long)v->shape[0]);
    for (size_t i = 0; i < json_array_size(items); i++) {
        json_t *it = json_array_get(items, i), *p = json_object_get(it, "prompt"), *md = json_object_get(it, "metadata");
        if (!json_is_object(it)) return core_error("score_request: field \"items\"[%zu] is not an object", i);
        if (!json_is_string(p) || strlen(json_string_value(p)) != json_string_length(p))
            return core_error("score_request: field \"items\"[%zu].prompt is missing or not a string", i);
        if (md && !json_is_object(md))
            return core_error("score_request: field \"items\"[%zu].metadata is not an object", i);
        const char *k;
        json_t *val;
        json_object_foreach(md, k, val) {
            if (!json_is_string(val) || strlen(json_string_value(val)) != json_string_length(val))
                return core_error("score_request: field \"items\"[%zu].metadata.%.64s is not a string", i, k);
        }
    }
    return 0;
}

json_t *reward_score_request(const core_wire_msg *m, const reward_weighted *scorers, int n_scorers) {
    const core_wire_tensor *v = core_wire_find(m, "videos");
    json_t *items = json_object_get(m->header, "items");
    json_t *rewards = json_array(), *names = json_array();
    size_t per = (size_t)v->shape[1] * (size_t)v->shape[2] * (size_t)v->shape[3] * 3;
    for (int s = 0; s < n_scorers; s++)
        json_array_append_new(names, json_pack("{s:s, s:f}", "name", scorers[s].scorer->name, "weight", scorers[s].weight));
    for (int64_t i = 0; i < v->shape[0]; i++) {
        json_t *it = json_array_get(items, (size_t)i), *md = json_object_get(it, "metadata");
        int nm = md ? (int)json_object_size(md) : 0, k = 0;
        const char **keys = calloc((size_t)nm + 1, sizeof *keys), **vals = calloc((size_t)nm + 1, sizeof *vals);
        const char *key;
        json_t *val;
        json_object_foreach(md, key, val) {
            keys[k] = key;
            vals[k++] = json_string_value(val);
        }
        reward_meta meta = {nm, keys, vals};
        reward_video vid = {(const uint8_t *)v->data + (size_t)i * per, v->shape[1], v->shape[2], v->shape[3]};
        json_t *sc = json_object();
        double total = 0;
        int bad = !keys || !vals;
        for (int s = 0; s < n_scorers && !bad; s++) {
            double r;
            if (scorers[s].scorer->fn(&vid, json_string_value(json_object_get(it, "prompt")), &meta, &r) != 0) {
                core_error_push("items[%lld], scorer %s: ", (long long)i, scorers[s].scorer->name);
                bad = 1;
                break;
            }
            total += scorers[s].weight * r;
            json_object_set_new(sc, scorers[s].scorer->name, json_real(r));
        }
        free(keys);
        free(vals);
        if (bad) {
            json_decref(sc);
            json_decref(rewards);
            json_decref(names);
            return NULL;
        }
        json_array_append_new(rewards, json_pack("{s:f, s:o}", "total", total, "scores", sc));
    }
    return json_pack("{s:o, s:o}", "rewards", rewards, "scorers", names);
}

/* ---- Server state ---- */

typedef struct job {
    struct job *next;
    zmq_msg_t *frames; /* after the routing id */
    int n_frames;
    core_wire_msg msg;
    int slot;
    uint64_t gen;
} job;

typedef struct {
    int state; /* 0 empty, 1 pending, 2 done */
    uint64_t gen;
    char *client, *id, *reply;
    size_t reply_len;
    uint8_t rid[MAX_RID];
    size_t rid_len;
} cache_entry;

typedef struct {
    uint8_t rid[MAX_RID];
    size_t rid_len;
    char *client;
} client_entry;

typedef struct {
    const reward_server_config *cfg;
    void *ctx, *router, *done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    int qlen, in_flight, quit;
    long long videos;
    cache_entry *cache;
    int cache_next;
    uint64_t gen;
    client_entry clients[MAX_CLIENTS];
    int clients_next;
    reward_server_stats st;
} server;

static void job_free(job *j) {
    if (!j) return;
    core_wire_msg_free(&j->msg);
    for (int i = 0; i < j->n_frames; i++) zmq_msg_close(&j->frames[i]);
    free(j->frames);
    free(j);
}

/* Builds an error header (new malloc'd text) for request id `id` ("" when unknown). */
static char *error_text(const char *id, const char *code, const char *reason) {
    /* The reason may quote a peer's bytes cut at any length: keep it printable ASCII so it is always valid UTF-8. */
    char clean[CORE_ERROR_MAX];
    size_t k = 0;
    for (; reason[k] && k + 1 < sizeof clean; k++)
        clean[k] = ((unsigned char)reason[k] < 0x20 || (unsigned char)reason[k] >= 0x7f) ? '?' : reason[k];
    clean[k] = 0;
    json_t *f = json_pack("{s:s, s:s, s:b}", "code", code, "reason", clean, "retryable",
                          !strcmp(code, "busy") || !strcmp(code, "shutting_down"));
    core_wire_built b;
    char *out = NULL;
    if (f && core_wire_build(CORE_WIRE_ERROR, id ? id : "", f, NULL, 0, &b) == 0) {
        out = b.header_text;
        b.header_text = NULL;
        core_wire_built_free(&b);
    }
    json_decref(f);
    return out;
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

static void send_error(server *s, const uint8_t *rid, size_t rid_len, const char *id, const char *code, const char *reason) {
    char *t = error_text(id, code, reason);
    send_to(s, rid, rid_len, t, t ? strlen(t) : 0);
    free(t);
    s->st.errors++;
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
        json_t *f = reward_score_request(&j->msg, s->cfg->scorers, s->cfg->n_scorers);
        char *text = NULL;
        int ok = f != NULL;
        if (f) {
            core_wire_built b;
            if (core_wire_build(CORE_WIRE_SCORE_REPLY, j->msg.id, f, NULL, 0, &b) == 0) {
                text = b.header_text;
                b.header_text = NULL;
                core_wire_built_free(&b);
            }
            json_decref(f);
            pthread_mutex_lock(&s->mu);
            s->videos += core_wire_find(&j->msg, "videos")->shape[0];
            pthread_mutex_unlock(&s->mu);
        } else {
            text = error_text(j->msg.id, "scorer_failed", core_last_error());
        }
        if (!text) text = error_text(j->msg.id, "internal", "could not build the reply");
        uint64_t tag[3] = {(uint64_t)j->slot, j->gen, ok ? 0u : 1u};
        zmq_send(push, tag, sizeof tag, ZMQ_SNDMORE);
        zmq_send(push, text ? text : "", text ? strlen(text) : 0, 0);
        free(text);
        job_free(j);
    }
    zmq_close(push);
    return NULL;
}

static const char *client_of(server *s, const uint8_t *rid, size_t rid_len, char *buf, size_t cap) {
    for (int i = 0; i < MAX_CLIENTS; i++)
        if (s->clients[i].client && s->clients[i].rid_len == rid_len && !memcmp(s->clients[i].rid, rid, rid_len))
            return s->clients[i].client;
    size_t o = (size_t)snprintf(buf, cap, "rid:");
    for (size_t i = 0; i < rid_len && o + 3 < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%02x", rid[i]);
    return buf;
}

static void set_client(server *s, const uint8_t *rid, size_t rid_len, const char *client) {
    int slot = -1;
    for (int i = 0; i < MAX_CLIENTS && slot < 0; i++)
        if (s->clients[i].client && s->clients[i].rid_len == rid_len && !memcmp(s->clients[i].rid, rid, rid_len)) slot = i;
    if (slot < 0) slot = s->clients_next++ % MAX_CLIENTS;
    free(s->clients[slot].client);
    s->clients[slot].client = strdup(client);
    memcpy(s->clients[slot].rid, rid, rid_len);
    s->clients[slot].rid_len = rid_len;
}

/* Handles one received message (frames after the routing id); takes ownership of frames. */
static void handle(server *s, const uint8_t *rid, size_t rid_len, zmq_msg_t *frames, int n, int *stop_req) {
    core_wire_frame wf[18];
    core_wire_limits lim = {.max_header_bytes = (size_t)1 << 20,
                            .max_frame_bytes = s->cfg->max_frame_bytes,
                            .max_total_bytes = s->cfg->max_frame_bytes + ((size_t)1 << 20),
                            .max_tensors = 16};
    job *j = calloc(1, sizeof *j);
    if (!j) goto drop;
    j->frames = frames;
    j->n_frames = n;
    frames = NULL;
    if (n < 1 || n > 17) {
        send_error(s, rid, rid_len, "", "bad_request", n < 1 ? "wire: message has no frames" : "wire: more than 16 tensor frames");
        job_free(j);
        return;
    }
    for (int i = 0; i < n; i++) wf[i] = (core_wire_frame){zmq_msg_data(&j->frames[i]), zmq_msg_size(&j->frames[i])};
    if (core_wire_parse(wf, n, &lim, &j->msg) != 0) {
        /* Echo the id when the header at least parses as an object with a sane string id. */
        char idbuf[CORE_WIRE_MAX_ID + 1] = "";
        json_t *h = wf[0].len <= lim.max_header_bytes ? json_loadb(wf[0].data, wf[0].len, JSON_REJECT_DUPLICATES, NULL) : NULL;
        json_t *id = json_object_get(h, "id");
        if (json_is_string(id) && json_string_length(id) <= CORE_WIRE_MAX_ID &&
            strlen(json_string_value(id)) == json_string_length(id))
            snprintf(idbuf, sizeof idbuf, "%s", json_string_value(id));
        json_decref(h);
        char reason[CORE_ERROR_MAX];
        snprintf(reason, sizeof reason, "%s", core_last_error());
        send_error(s, rid, rid_len, idbuf, "bad_request", reason);
        job_free(j);
        return;
    }
    const char *id = j->msg.id;
    if (j->msg.type == CORE_WIRE_HELLO) {
        json_t *c = json_object_get(j->msg.header, "client");
        if (!json_is_string(c) || json_string_length(c) < 1 || json_string_length(c) > CORE_WIRE_MAX_ID ||
            strlen(json_string_value(c)) != json_string_length(c)) {
            send_error(s, rid, rid_len, id, "bad_request", "hello: field \"client\" is missing or not a string of 1..128 bytes");
        } else {
            set_client(s, rid, rid_len, json_string_value(c));
            json_t *names = json_array();
            for (int i = 0; i < s->cfg->n_scorers; i++)
                json_array_append_new(names, json_pack("{s:s, s:f}", "name", s->cfg->scorers[i].scorer->name, "weight",
                                                       s->cfg->scorers[i].weight));
            json_t *f = json_pack("{s:s, s:o, s:I}", "server", "vgrpo-reward", "scorers", names, "max_videos_bytes",
                                  (json_int_t)s->cfg->max_frame_bytes);
            core_wire_built b;
            if (f && core_wire_build(CORE_WIRE_HELLO, id, f, NULL, 0, &b) == 0) {
                send_to(s, rid, rid_len, b.header_text, b.frames[0].len);
                core_wire_built_free(&b);
            }
            json_decref(f);
        }
        job_free(j);
        return;
    }
    if (j->msg.type == CORE_WIRE_SHUTDOWN) {
        core_wire_built b;
        if (core_wire_build(CORE_WIRE_SHUTDOWN, id, NULL, NULL, 0, &b) == 0) {
            send_to(s, rid, rid_len, b.header_text, b.frames[0].len);
            core_wire_built_free(&b);
        }
        *stop_req = 1;
        job_free(j);
        return;
    }
    if (j->msg.type != CORE_WIRE_SCORE_REQUEST) {
        char reason[160];
        snprintf(reason, sizeof reason, "a reward server does not serve \"%s\" messages", core_wire_type_name(j->msg.type));
        send_error(s, rid, rid_len, id, "unsupported", reason);
        job_free(j);
        return;
    }
    char cbuf[2 * MAX_RID + 8];
    const char *client = client_of(s, rid, rid_len, cbuf, sizeof cbuf);
    for (int i = 0; i < s->cfg->cache; i++) {
        cache_entry *e = &s->cache[i];
        if (!e->state || strcmp(e->id, id) || strcmp(e->client, client)) continue;
        s->st.repeats++;
        memcpy(e->rid, rid, rid_len);
        e->rid_len = rid_len;
        if (e->state == 2) {
            send_to(s, rid, rid_len, e->reply, e->reply_len);
            s->st.replies++;
        }
        job_free(j);
        return;
    }
    if (reward_check_score_request(&j->msg) != 0) {
        char reason[CORE_ERROR_MAX];
        snprintf(reason, sizeof reason, "%s", core_last_error());
        send_error(s, rid, rid_len, id, "bad_request", reason);
        job_free(j);
        return;
    }
    pthread_mutex_lock(&s->mu);
    int full = s->qlen >= s->cfg->queue;
    pthread_mutex_unlock(&s->mu);
    if (full) {
        send_error(s, rid, rid_len, id, "busy", "the scoring queue is full; retry with the same id");
        job_free(j);
        return;
    }
    cache_entry *e = &s->cache[s->cache_next];
    j->slot = s->cache_next;
    s->cache_next = (s->cache_next + 1) % s->cfg->cache;
    free(e->client);
    free(e->id);
    free(e->reply);
    memset(e, 0, sizeof *e);
    e->state = 1;
    e->gen = j->gen = ++s->gen;
    e->client = strdup(client);
    e->id = strdup(id);
    memcpy(e->rid, rid, rid_len);
    e->rid_len = rid_len;
    if (!e->client || !e->id) {
        e->state = 0;
        send_error(s, rid, rid_len, id, "internal", "out of memory");
        job_free(j);
        return;
    }
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->qlen++;
    s->in_flight++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return;
drop:
    for (int i = 0; frames && i < n; i++) zmq_msg_close(&frames[i]);
    free(frames);
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
    zmq_msg_t *frames = calloc(18, sizeof *frames);
    while (more) {
        zmq_msg_t tmp, *dst = (frames && n < 18) ? &frames[n] : &tmp;
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
    if (!frames || rl > MAX_RID) {
        for (int i = 0; i < n; i++) zmq_msg_close(&frames[i]);
        free(frames);
    } else {
        handle(s, zmq_msg_data(&rid), rl, frames, over ? 18 : n, stop_req);
    }
    zmq_msg_close(&rid);
}

/* Receives one finished reply from a scoring thread, caches it and sends it. */
static void recv_done(server *s) {
    uint64_t tag[3];
    zmq_msg_t body;
    if (zmq_recv(s->done, tag, sizeof tag, ZMQ_DONTWAIT) != (int)sizeof tag) return;
    zmq_msg_init(&body);
    if (zmq_msg_recv(&body, s->done, 0) < 0) {
        zmq_msg_close(&body);
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->in_flight--;
    pthread_mutex_unlock(&s->mu);
    cache_entry *e = (tag[0] < (uint64_t)s->cfg->cache) ? &s->cache[tag[0]] : NULL;
    size_t len = zmq_msg_size(&body);
    if (e && e->state == 1 && e->gen == tag[1]) {
        e->reply = malloc(len + 1);
        if (e->reply) {
            memcpy(e->reply, zmq_msg_data(&body), len);
            e->reply[len] = 0;
            e->reply_len = len;
            e->state = 2;
        } else {
            e->state = 0;
        }
        send_to(s, e->rid, e->rid_len, zmq_msg_data(&body), len);
        if (tag[2]) s->st.errors++;
        else s->st.replies++;
    }
    zmq_msg_close(&body);
}

static int setopt_int(void *sock, int opt, int v) { return zmq_setsockopt(sock, opt, &v, sizeof v); }

int reward_server_run(const reward_server_config *cfg, volatile sig_atomic_t *stop, reward_server_stats *stats) {
    if (cfg->n_scorers < 1 || cfg->threads < 1 || cfg->queue < 1 || cfg->cache < 1 || !cfg->endpoint)
        return core_error("reward server: needs an endpoint, >= 1 scorer, thread, queue slot and cache entry");
    if (!strncmp(cfg->endpoint, "ipc://", 6) && strlen(cfg->endpoint + 6) >= 100)
        return core_error("reward server: ipc path \"%s\" is %zu bytes (must be < 100)", cfg->endpoint + 6,
                          strlen(cfg->endpoint + 6));
    server *s = calloc(1, sizeof *s);
    if (!s) return core_error("reward server: out of memory");
    s->cfg = cfg;
    s->cache = calloc((size_t)cfg->cache, sizeof *s->cache);
    pthread_t *th = calloc((size_t)cfg->threads, sizeof *th);
    int n_th = 0, rc = 0;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->ctx = zmq_ctx_new();
    if (!s->cache || !th || !s->ctx) {
        rc = core_error("reward server: out of memory");
        goto out;
    }
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    s->done = zmq_socket(s->ctx, ZMQ_PULL);
    int64_t maxmsg = (int64_t)cfg->max_frame_bytes;
    if (!s->router || !s->done || setopt_int(s->router, ZMQ_ROUTER_MANDATORY, 1) || setopt_int(s->router, ZMQ_LINGER, 100) ||
        setopt_int(s->router, ZMQ_SNDTIMEO, 1000) || zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
        setopt_int(s->router, ZMQ_HEARTBEAT_IVL, 1000) || setopt_int(s->router, ZMQ_HEARTBEAT_TIMEOUT, 5000) ||
        setopt_int(s->router, ZMQ_HEARTBEAT_TTL, 10000) || setopt_int(s->done, ZMQ_LINGER, 0)) {
        rc = core_error("reward server: socket setup failed: %s", zmq_strerror(zmq_errno()));
        goto out;
    }
    if (zmq_bind(s->done, DONE_EP) != 0 || zmq_bind(s->router, cfg->endpoint) != 0) {
        rc = core_error("reward server: cannot bind \"%s\": %s", cfg->endpoint, zmq_strerror(zmq_errno()));
        goto out;
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
        pthread_mutex_lock(&s->mu);
        int inflight = s->in_flight;
        pthread_mutex_unlock(&s->mu);
        if (stopping) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (!t_stop.tv_sec) t_stop = now;
            if (inflight == 0 || now.tv_sec - t_stop.tv_sec > 10) break;
        }
        zmq_pollitem_t items[2] = {{s->done, 0, ZMQ_POLLIN, 0}, {s->router, 0, ZMQ_POLLIN, 0}};
        int np = zmq_poll(items, stopping ? 1 : 2, 100);
        if (np < 0) {
            if (zmq_errno() == EINTR) continue;
            rc = core_error("reward server: poll failed: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if (items[0].revents & ZMQ_POLLIN) recv_done(s);
        if (!stopping && (items[1].revents & ZMQ_POLLIN)) recv_router(s, &stop_req);
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
    if (stats) *stats = s->st;
    if (s->router) zmq_close(s->router);
    if (s->done) zmq_close(s->done);
    if (s->ctx) zmq_ctx_term(s->ctx);
    for (int i = 0; s->cache && i < cfg->cache; i++) {
        free(s->cache[i].client);
        free(s->cache[i].id);
        free(s->cache[i].reply);
    }
    for (int i = 0; i < MAX_CLIENTS; i++) free(s->clients[i].client);
    free(s->cache);
    free(th);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return rc;
}
