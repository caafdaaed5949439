/* trainer/net/ctl_msg.c — the controller's rules for one received message (see trainer/net/ctl_msg.h). */
#include "trainer/net/ctl_msg.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "core/wire_sync.h"

int ctl_msg_find(const ctl_state *s, const void *rid, size_t rid_len) {
    for (int w = 0; w < s->n; w++)
        if (s->w[w].rid_len == rid_len && !memcmp(s->w[w].rid, rid, rid_len)) return w;
    return -1;
}

/* A printable name of the sender for logs: its client id, or "an unknown peer". */
static const char *who(const ctl_state *s, int w) { return w >= 0 ? s->w[w].id : "a peer that never said hello"; }

/* Fills an error reply and logs it (rate-limited). */
static void refuse(ctl_state *s, ctl_reply *r, const char *id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void refuse(ctl_state *s, ctl_reply *r, const char *id, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof r->reason, fmt, ap);
    va_end(ap);
    r->send = 1;
    snprintf(r->id, sizeof r->id, "%s", id ? id : "");
    snprintf(r->code, sizeof r->code, "%s", code);
    const long n = ++s->unexpected;
    if (n <= 20 || n % 1000 == 0) core_log_warn("controller: refused (%s, #%ld): %s", code, n, r->reason);
}

void ctl_msg_refuse(ctl_state *s, const void *rid, size_t rid_len, const char *code, const char *why, ctl_reply *reply) {
    memset(reply, 0, sizeof *reply);
    const int w = ctl_msg_find(s, rid, rid_len);
    refuse(s, reply, "", code, "a message from %s: %s", who(s, w), why);
}

int ctl_msg_live(const ctl_state *s) {
    int n = 0;
    for (int w = 0; w < s->n; w++) n += !s->w[w].lost;
    return n;
}

static int valid_client_id(const char *cid) {
    if (!cid) return 0;
    const size_t L = strlen(cid);
    if (L < 1 || L > 128) return 0;
    for (size_t i = 0; i < L; i++)
        if ((unsigned char)cid[i] < 32 || (unsigned char)cid[i] > 126) return 0;
    return 1;
}

/* The hello's IPC handshake fields (core/wire_sync.h): where the worker runs and whether its device opens IPC
 * handles. Optional: a bad or missing host_id is unknown (no IPC), never a refusal. A new process starts afresh. */
static void hello_sync(ctl_worker *x, const core_wire_msg *m) {
    const char *host = json_string_value(json_object_get(m->header, "host_id"));
    snprintf(x->host_id, sizeof x->host_id, "%s", host && strlen(host) < sizeof x->host_id ? host : "");
    x->ipc = json_is_true(json_object_get(m->header, "ipc"));
    x->nccl = json_is_true(json_object_get(m->header, "nccl"));
    x->ipc_refused[0] = 0;
}

/* A hello naming lost worker k (see trainer/net/ctl_msg.h): the same model and adapter hashes as its first hello. */
static void rejoin(ctl_state *s, int k, const void *rid, size_t rid_len, const core_wire_msg *m, ctl_event *ev,
                   ctl_reply *r) {
    ctl_worker *x = &s->w[k];
    uint64_t h, adapter = 0;
    const json_t *ah = json_object_get(m->header, "adapter_xxh64");
    if (rid_len > sizeof x->rid || rid_len == 0) {
        refuse(s, r, m->id, "bad_request", "hello from %s: a routing id of %zu bytes", x->id, rid_len);
        return;
    }
    if (core_hash_parse(json_string_value(json_object_get(m->header, "model_xxh64")), &h) ||
        (ah && core_hash_parse(json_string_value(ah), &adapter))) {
        refuse(s, r, m->id, "bad_request", "hello from %s: \"model_xxh64\" (and \"adapter_xxh64\" when present) must be "
               "16 hex digits", x->id);
        return;
    }
    if (h != x->hello_hash || (ah != NULL) != x->hello_has_adapter || adapter != x->hello_adapter_hash) {
        refuse(s, r, m->id, "bad_request", "hello from %s, back after it was lost: it holds model hash %016" PRIx64
               "%s, its first process held %016" PRIx64 "%s (both must load model.path and model.lora); not admitted",
               x->id, h, ah ? " with adapters" : "", x->hello_hash, x->hello_has_adapter ? " with adapters" : "");
        return;
    }
    memcpy(x->rid, rid, rid_len);
    x->rid_len = rid_len;
    x->lost = 0, x->fd = -1, x->busy = 0, x->rejoins++;
    hello_sync(x, m);
    x->done = s->phase == CTL_SYNC; /* a sync in flight did not reach it: its admission sync follows */
    x->admit = s->phase == CTL_HELLO ? CTL_ADMIT_READY : CTL_ADMIT_PENDING;
    x->admit_id[0] = 0;
    ev->worker = k;
    ev->registered = ev->rejoined = 1;
    ev->progress = s->phase == CTL_HELLO;
}

/* A hello naming registered worker k from another routing id, in the hello phase (see trainer/net/ctl_msg.h): the
 * worker connected afresh before it heard from the controller (rollout/worker.c gives up on a connection whose
 * handshake it did not see succeed), and nothing has been sent to the old connection yet. With its first hello's
 * hashes the new routing id replaces the old one; else it is refused as a second worker of that name. */
static void take_over(ctl_state *s, int k, const void *rid, size_t rid_len, const core_wire_msg *m, ctl_event *ev,
                      ctl_reply *r) {
    ctl_worker *x = &s->w[k];
    uint64_t h, adapter = 0;
    const json_t *ah = json_object_get(m->header, "adapter_xxh64");
    if (rid_len > sizeof x->rid || rid_len == 0 ||
        core_hash_parse(json_string_value(json_object_get(m->header, "model_xxh64")), &h) ||
        (ah && core_hash_parse(json_string_value(ah), &adapter)) || h != x->hello_hash ||
        (ah != NULL) != x->hello_has_adapter || adapter != x->hello_adapter_hash) {
        refuse(s, r, m->id, "unexpected", "hello: a worker named %s is already connected", x->id);
        return;
    }
    memcpy(x->rid, rid, rid_len);
    x->rid_len = rid_len;
    x->fd = -1;
    hello_sync(x, m);
    ev->worker = k;
    ev->registered = 1; /* its new connection's descriptor is recorded; the old one's close is then not a loss */
}

static void on_hello(ctl_state *s, int w, const void *rid, size_t rid_len, const core_wire_msg *m, ctl_event *ev,
                     ctl_reply *r) {
    const char *cid = json_string_value(json_object_get(m->header, "client"));
    uint64_t h;
    if (w >= 0) {
        refuse(s, r, m->id, "unexpected", "%s said hello a second time", s->w[w].id);
        return;
    }
    if (s->phase == CTL_SHUTDOWN) { /* a worker that reconnected late: it is told the run is over, so it exits */
        refuse(s, r, m->id, "shutting_down", "a hello from %.128s while the controller is shutting down",
               cid ? cid : "?");
        return;
    }
    /* a lost worker's restarted process: it takes its old place once its hello matches its first one's */
    for (int k = 0; cid && k < s->n; k++)
        if (s->w[k].lost && !strcmp(s->w[k].id, cid)) {
            rejoin(s, k, rid, rid_len, m, ev, r);
            return;
        }
    for (int k = 0; cid && s->phase == CTL_HELLO && k < s->n; k++)
        if (!s->w[k].lost && !strcmp(s->w[k].id, cid)) {
            take_over(s, k, rid, rid_len, m, ev, r);
            return;
        }
    if (s->phase != CTL_HELLO || s->n >= s->want) {
        refuse(s, r, m->id, "unexpected", "a hello from %.128s while the controller is not waiting for workers (%s)",
               valid_client_id(cid) ? cid : "?",
               s->phase == CTL_ROLLOUT ? "a rollout is running" : s->phase == CTL_SYNC ? "a weight sync is running"
               : s->phase == CTL_SHUTDOWN ? "shutting down" : "all workers have come");
        return;
    }
    if (!valid_client_id(cid)) {
        refuse(s, r, m->id, "bad_request", "hello: \"client\" must be 1..128 printable ASCII bytes");
        return;
    }
    if (rid_len > sizeof s->w[0].rid || rid_len == 0) {
        refuse(s, r, m->id, "bad_request", "hello from %s: a routing id of %zu bytes", cid, rid_len);
        return;
    }
    if (core_hash_parse(json_string_value(json_object_get(m->header, "model_xxh64")), &h)) {
        refuse(s, r, m->id, "bad_request", "hello from %s: \"model_xxh64\" must be 16 hex digits", cid);
        return;
    }
    const json_t *ah = json_object_get(m->header, "adapter_xxh64");
    uint64_t adapter = 0;
    if (ah && core_hash_parse(json_string_value(ah), &adapter)) {
        refuse(s, r, m->id, "bad_request", "hello from %s: \"adapter_xxh64\" must be 16 hex digits", cid);
        return;
    }
    for (int k = 0; k < s->n; k++)
        if (!strcmp(s->w[k].id, cid)) {
            refuse(s, r, m->id, "unexpected", "hello: a worker named %s is already connected", cid);
            return;
        }
    ctl_worker *x = &s->w[s->n];
    memset(x, 0, sizeof *x);
    snprintf(x->id, sizeof x->id, "%s", cid);
    memcpy(x->rid, rid, rid_len);
    x->rid_len = rid_len;
    x->hello_hash = h;
    x->hello_adapter_hash = adapter;
    x->hello_has_adapter = ah != NULL;
    x->fd = -1;
    hello_sync(x, m);
    ev->worker = s->n++;
    ev->registered = 1;
    ev->progress = 1;
}

static int on_trajectory(ctl_state *s, int w, const core_wire_msg *m, ctl_event *ev, ctl_reply *r) {
    const int k = w >= 0 && s->phase == CTL_ROLLOUT ? s->w[w].busy - 1 : -1;
    if (k < 0 || k >= s->n_chunks || s->chunk_done[k] || strcmp(m->id, s->ids[k])) {
        refuse(s, r, m->id, "unexpected", "a trajectory %.128s from %s that answers no request in flight", m->id, who(s, w));
        return 0;
    }
    core_rollout_result *out = s->res + (size_t)k * s->chunk;
    if (core_trajectory_reply_parse(m, &s->reqs[k], out, &ev->videos, ev->vshape))
        return core_error_push("%s: ", s->w[w].id);
    s->chunk_done[k] = 1;
    s->w[w].busy = 0;
    ev->chunk = k;
    ev->progress = 1;
    return 0;
}

/* The ack of worker w's admission sync: the hash and version it was sent. */
static int on_admit_ack(ctl_state *s, int w, const core_wire_msg *m, ctl_event *ev) {
    ctl_worker *x = &s->w[w];
    uint64_t h = 0;
    const json_t *pv = json_object_get(m->header, "policy_version");
    if (!json_is_integer(pv) || json_integer_value(pv) != x->admit_version ||
        core_hash_parse(json_string_value(json_object_get(m->header, "model_xxh64")), &h))
        return core_error("%s (back after it was lost): weights_ack without policy_version %" PRId64 " and model_xxh64",
                          x->id, x->admit_version);
    if (h != x->admit_hash)
        return core_error("%s (back after it was lost): model hash after its sync is %016" PRIx64 ", the trainer's is "
                          "%016" PRIx64, x->id, h, x->admit_hash);
    x->admit = CTL_ADMIT_READY;
    x->admit_id[0] = 0;
    ev->admitted = 1;
    return 0;
}

static int on_ack(ctl_state *s, int w, const core_wire_msg *m, ctl_event *ev, ctl_reply *r) {
    if (w >= 0 && !s->w[w].lost && s->w[w].admit == CTL_ADMIT_SYNCING && !strcmp(m->id, s->w[w].admit_id))
        return on_admit_ack(s, w, m, ev);
    if (w < 0 || s->phase != CTL_SYNC || s->w[w].done || s->w[w].lost || strcmp(m->id, s->end_id)) {
        refuse(s, r, m->id, "unexpected", "a weights_ack %.128s from %s that answers no weight sync in flight", m->id, who(s, w));
        return 0;
    }
    uint64_t h = 0;
    const json_t *pv = json_object_get(m->header, "policy_version");
    if (!json_is_integer(pv) || json_integer_value(pv) != s->version ||
        core_hash_parse(json_string_value(json_object_get(m->header, "model_xxh64")), &h))
        return core_error("%s: weights_ack without policy_version %" PRId64 " and model_xxh64", s->w[w].id, s->version);
    if (h != s->model_hash)
        return core_error("%s: model hash after the sync is %016" PRIx64 ", the trainer's is %016" PRIx64, s->w[w].id,
                          h, s->model_hash);
    s->w[w].done = 1;
    if (s->w[w].admit == CTL_ADMIT_PENDING) { /* back from a restart: this sync brought it the weights */
        s->w[w].admit = CTL_ADMIT_READY;
        ev->admitted = 1;
    }
    ev->progress = 1;
    return 0;
}

/* An error from a worker: the end of the operation when it answers that worker's request in flight. */
static int on_error(ctl_state *s, int w, const core_wire_msg *m, ctl_event *ev) {
    const char *code = json_string_value(json_object_get(m->header, "code"));
    const char *why = json_string_value(json_object_get(m->header, "reason"));
    if (w >= 0 && s->phase == CTL_ROLLOUT && s->w[w].busy > 0 && s->w[w].busy <= s->n_chunks &&
        !strcmp(m->id, s->ids[s->w[w].busy - 1]))
        return core_error("%s: request %s failed: %s: %s", s->w[w].id, m->id, code ? code : "?", why ? why : "?");
    if (w >= 0 && s->phase == CTL_SYNC && !s->w[w].done && !strcmp(m->id, s->end_id) && s->w[w].ipc_used && code &&
        !strcmp(code, CORE_SYNC_IPC_REFUSED)) {
        /* the same-host path failed on its side: the controller sends it this sync again in buckets */
        snprintf(s->w[w].ipc_refused, sizeof s->w[w].ipc_refused, "%s", why ? why : "?");
        ev->ipc_refused = 1;
        return 0;
    }
    if (w >= 0 && s->phase == CTL_SYNC && !s->w[w].done && !strcmp(m->id, s->end_id))
        return core_error("%s refused the weights of version %" PRId64 ": %s: %s", s->w[w].id, s->version,
                          code ? code : "?", why ? why : "?");
    if (w >= 0 && s->w[w].admit == CTL_ADMIT_SYNCING && !strcmp(m->id, s->w[w].admit_id))
        return core_error("%s (back after it was lost) refused the weights of version %" PRId64 ": %s: %s", s->w[w].id,
                          s->w[w].admit_version, code ? code : "?", why ? why : "?");
    const long n = ++s->unexpected;
    if (n <= 20 || n % 1000 == 0)
        core_log_warn("controller: an error %.128s from %s that answers nothing, ignored (#%ld): %.32s: %.300s", m->id,
                      who(s, w), n, code ? code : "?", why ? why : "?");
    return 0;
}

int ctl_msg_handle(ctl_state *s, const void *rid, size_t rid_len, const core_wire_msg *m, ctl_event *ev,
                   ctl_reply *reply) {
    memset(reply, 0, sizeof *reply);
    memset(ev, 0, sizeof *ev);
    ev->chunk = -1;
    const int w = ev->worker = ctl_msg_find(s, rid, rid_len);
    switch (m->type) {
    case CORE_WIRE_HELLO: on_hello(s, w, rid, rid_len, m, ev, reply); return 0;
    case CORE_WIRE_ERROR: return on_error(s, w, m, ev);
    default: break;
    }
    if (w < 0) {
        refuse(s, reply, m->id, "unexpected", "a %s from a peer that never said hello", core_wire_type_name(m->type));
        return 0;
    }
    if (s->w[w].lost) { /* it left before we read it (a reply to a chunk already re-issued, or to the shutdown) */
        core_log_debug("controller: a %s %.128s from %s, which is lost: dropped", core_wire_type_name(m->type), m->id,
                       s->w[w].id);
        return 0;
    }
    switch (m->type) {
    case CORE_WIRE_TRAJECTORY: return on_trajectory(s, w, m, ev, reply);
    case CORE_WIRE_WEIGHTS_ACK: return on_ack(s, w, m, ev, reply);
    case CORE_WIRE_SHUTDOWN:
        if (s->phase == CTL_SHUTDOWN && !s->w[w].done) {
            s->w[w].done = 1;
            ev->progress = 1;
        } else {
            refuse(s, reply, m->id, "unexpected", "a shutdown reply from %s that answers nothing", s->w[w].id);
        }
        return 0;
    default:
        refuse(s, reply, m->id, "unsupported", "the controller does not serve \"%s\" (from %s)",
               core_wire_type_name(m->type), s->w[w].id);
        return 0;
    }
}
