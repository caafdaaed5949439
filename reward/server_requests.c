/* reward/server_requests.c — the reward server's handling of one message (see reward/server_requests.h), plus the
 * configuration, the score_request checks and scoring that reward/server.h declares.
 *
 * The reply cache is a ring of cfg->cache entries found by a linear scan: at the default 4096 entries this costs
 * microseconds per request, far below scoring; a hash table would be the fix if the cache grew large. Its reply
 * text is also bounded in bytes (REWARD_SERVER_CACHE_BYTES): a request of many tiny videos has a long reply. */
#include "reward/server_requests.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "core/checksum.h"
#include "core/error.h"

#define MAX_CLIENTS 1024

void reward_server_config_default(reward_server_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->threads = 2;
    cfg->queue = 64;
    cfg->max_frame_bytes = (size_t)REWARD_SERVER_DEFAULT_FRAME_MB << 20;
    cfg->cache = 4096;
    cfg->max_peers = 16;
}

size_t reward_server_held_bound(const reward_server_config *cfg) {
    return (size_t)(cfg->max_peers > 0 ? cfg->max_peers : 1) * (cfg->max_frame_bytes + REWARD_SERVER_HEADER_BYTES);
}

size_t reward_server_memory_budget(const reward_server_config *cfg) {
    if (cfg->max_memory_bytes) return cfg->max_memory_bytes;
    return 4 * reward_server_held_bound(cfg) + REWARD_SERVER_CACHE_BYTES + ((size_t)64 << 20) + cfg->model_act_bytes;
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
        if (!rc) cfg->scorers[cfg->n_scorers++] = (reward_weighted){.scorer = sc, .weight = w};
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
    if (n_scorers > REWARD_SERVER_MAX_SCORERS)
        return core_error("score_request: %d scorers (at most %d)", n_scorers, REWARD_SERVER_MAX_SCORERS), NULL;
    const core_wire_tensor *v = core_wire_find(m, "videos");
    json_t *items = json_object_get(m->header, "items");
    json_t *rewards = json_array(), *names = json_array();
    size_t per = (size_t)v->shape[1] * (size_t)v->shape[2] * (size_t)v->shape[3] * 3;
    for (int s = 0; s < n_scorers; s++)
        json_array_append_new(names, json_pack("{s:s, s:f}", "name", scorers[s].scorer->name, "weight", scorers[s].weight));
    /* learned scorers: every video of the request at once (reward_model_score_batch), given[i * n_scorers + s]; NaN
     * where not computed (a pure scorer, or a batch that failed: then scored per video below, naming the item) */
    const int64_t N = v->shape[0];
    double *given = NULL;
    for (int s = 0; s < n_scorers; s++) {
        if (!scorers[s].model || !scorers[s].model_batch_fn) continue;
        reward_video *vids = malloc(sizeof *vids * (size_t)N);
        const char **prompts = malloc(sizeof *prompts * (size_t)N);
        double *out = malloc(sizeof *out * (size_t)N);
        if (!given && (given = malloc(sizeof *given * (size_t)(N * n_scorers))))
            for (int64_t k = 0; k < N * n_scorers; k++) given[k] = NAN;
        if (given && vids && prompts && out) {
            for (int64_t i = 0; i < N; i++) {
                vids[i] = (reward_video){(const uint8_t *)v->data + (size_t)i * per, v->shape[1], v->shape[2], v->shape[3]};
                prompts[i] = json_string_value(json_object_get(json_array_get(items, (size_t)i), "prompt"));
            }
            if (scorers[s].model_batch_fn(scorers[s].model, vids, prompts, (int)N, out) == 0)
                for (int64_t i = 0; i < N; i++) given[i * n_scorers + s] = out[i];
        }
        free(vids);
        free(prompts);
        free(out);
    }
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
        double r[REWARD_SERVER_MAX_SCORERS], total = 0;
        int bad = !keys || !vals, failed = 0;
        if (!bad && reward_score_weighted_given(scorers, n_scorers, &vid, json_string_value(json_object_get(it, "prompt")),
                                                &meta, given ? given + i * n_scorers : NULL, r, &total, &failed)) {
            core_error_push("items[%lld], scorer %s: ", (long long)i, scorers[failed].scorer->name);
            bad = 1;
        }
        for (int s = 0; s < n_scorers && !bad; s++) json_object_set_new(sc, scorers[s].scorer->name, json_real(r[s]));
        free(keys);
        free(vals);
        if (bad) {
            json_decref(sc);
            json_decref(rewards);
            json_decref(names);
            free(given);
            return NULL;
        }
        json_array_append_new(rewards, json_pack("{s:f, s:o}", "total", total, "scores", sc));
    }
    free(given);
    return json_pack("{s:o, s:o}", "rewards", rewards, "scorers", names);
}

/* ---- Replies ---- */

char *reward_requests_error_text(const char *id, const char *code, const char *reason) {
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

/* Header text of a header-only message (malloc'd), NULL when out of memory. */
static char *header_text(core_wire_type type, const char *id, const json_t *fields) {
    core_wire_built b;
    if (core_wire_build(type, id, fields, NULL, 0, &b) != 0) return NULL;
    char *out = b.header_text;
    b.header_text = NULL;
    core_wire_built_free(&b);
    return out;
}

char *reward_requests_reply_text(const core_wire_msg *m, const reward_weighted *scorers, int n_scorers, int *ok) {
    json_t *f = reward_score_request(m, scorers, n_scorers);
    *ok = f != NULL;
    char *text = f ? header_text(CORE_WIRE_SCORE_REPLY, m->id, f) : reward_requests_error_text(m->id, "scorer_failed", core_last_error());
    json_decref(f);
    if (!text) {
        *ok = 0;
        text = reward_requests_error_text(m->id, "internal", "could not build the reply");
    }
    return text;
}

/* ---- State ---- */

typedef struct {
    int state; /* 0 empty, 1 being scored, 2 reply cached */
    int is_error; /* state 2: the reply is an error (scorer_failed, internal) */
    uint64_t gen, hash;
    char *client, *id, *reply;
    size_t reply_len;
    reward_peer waiters[REWARD_MAX_WAITERS]; /* state 1: who gets the reply */
    int n_waiters;
} cache_entry;

typedef struct {
    reward_peer peer;
    char *client;
} client_entry;

struct reward_requests {
    const reward_server_config *cfg;
    uint64_t seed; /* of the content hash: a peer cannot aim a collision at a hash it cannot compute */
    cache_entry *cache;
    int cache_next;    /* the oldest slot, taken next */
    size_t cache_bytes; /* reply text held */
    uint64_t gen;
    client_entry clients[MAX_CLIENTS];
    int clients_next;
};

reward_requests *reward_requests_new(const reward_server_config *cfg) {
    reward_requests *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->cfg = cfg;
    r->cache = calloc((size_t)(cfg->cache > 0 ? cfg->cache : 1), sizeof *r->cache);
    if (!r->cache) {
        free(r);
        return NULL;
    }
    if (getrandom(&r->seed, sizeof r->seed, GRND_NONBLOCK) != (ssize_t)sizeof r->seed) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        r->seed = (uint64_t)t.tv_sec * 1000000007ull ^ (uint64_t)t.tv_nsec ^ (uint64_t)(uintptr_t)r;
    }
    return r;
}

static void entry_clear(reward_requests *r, cache_entry *e) {
    if (e->state == 2) r->cache_bytes -= e->reply_len;
    free(e->client);
    free(e->id);
    free(e->reply);
    memset(e, 0, sizeof *e);
}

void reward_requests_free(reward_requests *r) {
    if (!r) return;
    for (int i = 0; i < r->cfg->cache; i++) entry_clear(r, &r->cache[i]);
    for (int i = 0; i < MAX_CLIENTS; i++) free(r->clients[i].client);
    free(r->cache);
    free(r);
}

static int same_peer(const reward_peer *a, const reward_peer *b) {
    return a->len == b->len && !memcmp(a->id, b->id, a->len);
}

/* The client id of a connection: its last hello's, else "rid:" and its routing id in hex. */
static const char *client_of(reward_requests *r, const reward_peer *p, char *buf, size_t cap) {
    for (int i = 0; i < MAX_CLIENTS; i++)
        if (r->clients[i].client && same_peer(&r->clients[i].peer, p)) return r->clients[i].client;
    size_t o = (size_t)snprintf(buf, cap, "rid:");
    for (size_t i = 0; i < p->len && o + 3 < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%02x", p->id[i]);
    return buf;
}

static int set_client(reward_requests *r, const reward_peer *p, const char *client) {
    char *c = strdup(client);
    if (!c) return -1;
    int slot = -1;
    for (int i = 0; i < MAX_CLIENTS && slot < 0; i++)
        if (r->clients[i].client && same_peer(&r->clients[i].peer, p)) slot = i;
    if (slot < 0) slot = r->clients_next++ % MAX_CLIENTS;
    free(r->clients[slot].client);
    r->clients[slot].client = c;
    r->clients[slot].peer = *p;
    return 0;
}

/* xxh64, seeded per server, of what scoring reads: fps and items (canonical JSON: sorted keys, compact), the
 * videos' shape and their bytes. Returns 0 and sets *out, or -1 when out of memory. */
static int content_hash(const reward_requests *r, const core_wire_msg *m, uint64_t *out) {
    const core_wire_tensor *v = core_wire_find(m, "videos");
    json_t *k = json_pack("{s:O, s:O}", "fps", json_object_get(m->header, "fps"), "items",
                          json_object_get(m->header, "items"));
    char *t = k ? json_dumps(k, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(k);
    if (!t) return -1;
    char shape[200];
    int n = snprintf(shape, sizeof shape, "%lld,%lld,%lld,%lld,%lld", (long long)v->shape[0], (long long)v->shape[1],
                     (long long)v->shape[2], (long long)v->shape[3], (long long)v->shape[4]);
    uint64_t h = core_xxh64(t, strlen(t), r->seed);
    free(t);
    h = core_xxh64(shape, (size_t)n, h);
    *out = core_xxh64(v->data, v->nbytes, h);
    return 0;
}

static void reply_error(reward_action *act, const char *id, const char *code, const char *reason) {
    act->verb = REWARD_SEND;
    act->reply = reward_requests_error_text(id, code, reason);
    act->reply_len = act->reply ? strlen(act->reply) : 0;
    act->error = 1;
}

static void reply_header(reward_action *act, reward_verb verb, core_wire_type type, const char *id, const json_t *fields) {
    act->verb = verb;
    act->reply = header_text(type, id, fields);
    act->reply_len = act->reply ? strlen(act->reply) : 0;
}

/* The id of a message that failed to parse, when its header at least parses as an object with a sane string id. */
static void salvage_id(const core_wire_frame *h, size_t max_header, char out[CORE_WIRE_MAX_ID + 1]) {
    out[0] = 0;
    json_t *j = h->len <= max_header ? json_loadb(h->data, h->len, JSON_REJECT_DUPLICATES, NULL) : NULL;
    json_t *id = json_object_get(j, "id");
    if (json_is_string(id) && json_string_length(id) <= CORE_WIRE_MAX_ID &&
        strlen(json_string_value(id)) == json_string_length(id))
        snprintf(out, CORE_WIRE_MAX_ID + 1, "%s", json_string_value(id));
    json_decref(j);
}

static void handle_hello(reward_requests *r, const reward_peer *peer, const core_wire_msg *m, reward_action *act) {
    const reward_server_config *cfg = r->cfg;
    json_t *c = json_object_get(m->header, "client");
    if (!json_is_string(c) || json_string_length(c) < 1 || json_string_length(c) > CORE_WIRE_MAX_ID ||
        strlen(json_string_value(c)) != json_string_length(c)) {
        reply_error(act, m->id, "bad_request", "hello: field \"client\" is missing or not a string of 1..128 bytes");
        return;
    }
    if (set_client(r, peer, json_string_value(c)) != 0) {
        reply_error(act, m->id, "internal", "out of memory");
        return;
    }
    json_t *names = json_array();
    for (int i = 0; i < cfg->n_scorers; i++)
        json_array_append_new(names, json_pack("{s:s, s:f}", "name", cfg->scorers[i].scorer->name, "weight",
                                               cfg->scorers[i].weight));
    json_t *f = json_pack("{s:s, s:o, s:I}", "server", "vgrpo-reward", "scorers", names, "max_videos_bytes",
                          (json_int_t)cfg->max_frame_bytes);
    if (f) reply_header(act, REWARD_SEND, CORE_WIRE_HELLO, m->id, f);
    json_decref(f);
}

static void add_waiter(cache_entry *e, const reward_peer *p) {
    for (int i = 0; i < e->n_waiters; i++)
        if (same_peer(&e->waiters[i], p)) return;
    if (e->n_waiters == REWARD_MAX_WAITERS) { /* forget the oldest: most likely a connection that is gone */
        memmove(e->waiters, e->waiters + 1, sizeof e->waiters[0] * (REWARD_MAX_WAITERS - 1));
        e->n_waiters--;
    }
    e->waiters[e->n_waiters++] = *p;
}

static void handle_score(reward_requests *r, const reward_peer *peer, reward_action *act, int queued, size_t held) {
    const reward_server_config *cfg = r->cfg;
    const char *id = act->msg.id;
    if (reward_check_score_request(&act->msg) != 0) {
        char reason[CORE_ERROR_MAX];
        snprintf(reason, sizeof reason, "%s", core_last_error());
        reply_error(act, id, "bad_request", reason);
        return;
    }
    uint64_t hash;
    if (content_hash(r, &act->msg, &hash) != 0) {
        reply_error(act, id, "internal", "out of memory");
        return;
    }
    char cbuf[2 * REWARD_MAX_PEER + 8];
    const char *client = client_of(r, peer, cbuf, sizeof cbuf);
    for (int i = 0; i < cfg->cache; i++) {
        cache_entry *e = &r->cache[i];
        if (!e->state || strcmp(e->id, id) || strcmp(e->client, client)) continue;
        if (e->hash != hash) {
            char reason[512];
            snprintf(reason, sizeof reason,
                     "request id \"%s\" was already used by client \"%.140s\" for a request with other content (fps, "
                     "items or videos differ); ids must be unique per client id, and a re-send must repeat the request",
                     id, client);
            reply_error(act, id, "bad_request", reason);
            return;
        }
        act->repeat = 1;
        if (e->state == 2) {
            act->verb = REWARD_SEND;
            act->reply = malloc(e->reply_len + 1);
            if (act->reply) memcpy(act->reply, e->reply, e->reply_len + 1), act->reply_len = e->reply_len;
            act->error = e->is_error;
        } else {
            act->verb = REWARD_WAIT;
            add_waiter(e, peer);
        }
        return;
    }
    size_t bytes = act->bytes;
    if (queued >= cfg->queue || (held > 0 && held + bytes > reward_server_held_bound(cfg))) {
        reply_error(act, id, "busy", "the scoring queue is full; retry with the same id");
        return;
    }
    cache_entry *e = &r->cache[r->cache_next];
    int slot = r->cache_next;
    entry_clear(r, e);
    e->client = strdup(client);
    e->id = strdup(id);
    if (!e->client || !e->id) {
        entry_clear(r, e);
        reply_error(act, id, "internal", "out of memory");
        return;
    }
    r->cache_next = (r->cache_next + 1) % cfg->cache;
    e->state = 1;
    e->hash = hash;
    e->gen = ++r->gen;
    e->waiters[0] = *peer;
    e->n_waiters = 1;
    act->verb = REWARD_SCORE;
    act->slot = slot;
    act->gen = e->gen;
}

int reward_requests_handle(reward_requests *r, const reward_peer *peer, const core_wire_frame *frames, int n,
                           int queued, size_t held, reward_action *act) {
    const reward_server_config *cfg = r->cfg;
    memset(act, 0, sizeof *act);
    if (n < 1 || n > REWARD_MAX_FRAMES) {
        reply_error(act, "", "bad_request", n < 1 ? "wire: message has no frames" : "wire: more than 16 tensor frames");
        return 0;
    }
    core_wire_limits lim = {.max_header_bytes = REWARD_SERVER_HEADER_BYTES,
                            .max_frame_bytes = cfg->max_frame_bytes,
                            .max_total_bytes = cfg->max_frame_bytes + REWARD_SERVER_HEADER_BYTES,
                            .max_tensors = REWARD_MAX_FRAMES - 1};
    for (int i = 0; i < n; i++) act->bytes += frames[i].len;
    if (core_wire_parse(frames, n, &lim, &act->msg) != 0) {
        char idbuf[CORE_WIRE_MAX_ID + 1], reason[CORE_ERROR_MAX];
        snprintf(reason, sizeof reason, "%s", core_last_error());
        salvage_id(&frames[0], lim.max_header_bytes, idbuf);
        reply_error(act, idbuf, "bad_request", reason);
        return 0;
    }
    const char *id = act->msg.id;
    if (act->msg.type == CORE_WIRE_HELLO) {
        handle_hello(r, peer, &act->msg, act);
    } else if (act->msg.type == CORE_WIRE_SHUTDOWN) {
        reply_header(act, REWARD_STOP, CORE_WIRE_SHUTDOWN, id, NULL);
    } else if (act->msg.type != CORE_WIRE_SCORE_REQUEST) {
        char reason[160];
        snprintf(reason, sizeof reason, "a reward server does not serve \"%s\" messages", core_wire_type_name(act->msg.type));
        reply_error(act, id, "unsupported", reason);
    } else {
        handle_score(r, peer, act, queued, held);
    }
    if (act->verb != REWARD_SCORE) core_wire_msg_free(&act->msg);
    return 0;
}

int reward_requests_done(reward_requests *r, int slot, uint64_t gen, const char *reply, size_t len, int ok,
                         reward_peer to[REWARD_MAX_WAITERS]) {
    if (slot < 0 || slot >= r->cfg->cache) return 0;
    cache_entry *e = &r->cache[slot];
    if (e->state != 1 || e->gen != gen) return 0;
    int n = e->n_waiters;
    memcpy(to, e->waiters, sizeof e->waiters[0] * (size_t)n);
    e->n_waiters = 0;
    e->reply = malloc(len + 1);
    if (!e->reply) {
        entry_clear(r, e); /* not cached: a repeat is scored again */
        return n;
    }
    memcpy(e->reply, reply, len);
    e->reply[len] = 0;
    e->reply_len = len;
    e->is_error = !ok;
    e->state = 2;
    r->cache_bytes += len;
    /* Over the byte budget: the oldest cached replies go (requests being scored stay). */
    for (int k = 0; k < r->cfg->cache && r->cache_bytes > REWARD_SERVER_CACHE_BYTES; k++) {
        cache_entry *o = &r->cache[(r->cache_next + k) % r->cfg->cache];
        if (o->state == 2) entry_clear(r, o);
    }
    return n;
}
