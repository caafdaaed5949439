/* trainer/controller.c — the controller side of the rollout channel (see trainer/controller.h). */
#include "trainer/controller.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/wire_zmq.h"

typedef struct {
    char id[64];
    uint8_t rid[256];
    size_t rid_len;
    uint64_t hello_hash;
    int busy; /* chunk index + 1 */
} ctl_worker;

struct ctl_server {
    void *ctx, *router;
    ctl_abort_fn abort_check;
    void *abort_ctx;
    int n;
    ctl_worker w[CTL_MAX_WORKERS];
    uint64_t seq; /* request ids */
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

ctl_server *ctl_open(const char *endpoint, ctl_abort_fn abort_check, void *abort_ctx) {
    ctl_server *c = calloc(1, sizeof *c);
    if (!c) return core_error("out of memory"), NULL;
    c->abort_check = abort_check, c->abort_ctx = abort_ctx;
    c->ctx = zmq_ctx_new();
    c->router = c->ctx ? zmq_socket(c->ctx, ZMQ_ROUTER) : NULL;
    int one = 1, linger = 0, hb_ivl = 1000, hb_to = 5000, hb_ttl = 10000;
    if (!c->router) {
        core_error("zmq: cannot create the controller socket");
        ctl_close(c);
        return NULL;
    }
    zmq_setsockopt(c->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(c->router, ZMQ_LINGER, &linger, sizeof linger);
    if (!strncmp(endpoint, "tcp://", 6)) {
        zmq_setsockopt(c->router, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
        zmq_setsockopt(c->router, ZMQ_HEARTBEAT_TIMEOUT, &hb_to, sizeof hb_to);
        zmq_setsockopt(c->router, ZMQ_HEARTBEAT_TTL, &hb_ttl, sizeof hb_ttl);
    }
    if (zmq_bind(c->router, endpoint)) {
        core_error("controller: cannot bind %s: %s", endpoint, zmq_strerror(errno));
        ctl_close(c);
        return NULL;
    }
    return c;
}

void ctl_close(ctl_server *c) {
    if (!c) return;
    if (c->router) zmq_close(c->router);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c);
}

int ctl_n_workers(const ctl_server *c) { return c->n; }
const char *ctl_worker_id(const ctl_server *c, int w) { return c->w[w].id; }
uint64_t ctl_worker_hello_hash(const ctl_server *c, int w) { return c->w[w].hello_hash; }

/* The worker a routing id belongs to, or -1. */
static int find_worker(const ctl_server *c, const void *rid, size_t len) {
    for (int w = 0; w < c->n; w++)
        if (c->w[w].rid_len == len && !memcmp(c->w[w].rid, rid, len)) return w;
    return -1;
}

/* Receives one message within the remaining time: 0 with *zm and *m filled and *w the sender (-1: unknown peer),
 * 1 on nothing yet (keep waiting), -1 on error/abort/time-out. */
static int recv_one(ctl_server *c, double deadline, core_zmq_msg *zm, core_wire_msg *m, int *w, const char *waiting_for) {
    if (c->abort_check && c->abort_check(c->abort_ctx)) return -1;
    if (now_s() > deadline) return core_error("controller: timed out waiting for %s", waiting_for);
    zmq_pollitem_t it = {c->router, 0, ZMQ_POLLIN, 0};
    int pr = zmq_poll(&it, 1, 100);
    if (pr < 0 && errno != EINTR) return core_error("controller: zmq poll: %s", zmq_strerror(errno));
    if (pr <= 0) return 1;
    int r = core_zmq_recv(c->router, ZMQ_DONTWAIT, zm);
    if (r) return r;
    if (zm->n < 2) {
        core_zmq_msg_close(zm);
        return 1;
    }
    *w = find_worker(c, zmq_msg_data(&zm->frames[0]), zmq_msg_size(&zm->frames[0]));
    if (core_zmq_parse(zm, 1, NULL, m)) {
        core_error_push("controller: a malformed message from %s: ", *w >= 0 ? c->w[*w].id : "an unknown peer");
        core_zmq_msg_close(zm);
        return -1;
    }
    return 0;
}

static int add_worker(ctl_server *c, const core_zmq_msg *zm, const core_wire_msg *m) {
    if (c->n >= CTL_MAX_WORKERS) return core_error("controller: more than %d workers", CTL_MAX_WORKERS);
    const char *cid = json_string_value(json_object_get(m->header, "client"));
    const size_t rl = zmq_msg_size(&zm->frames[0]);
    if (!cid || rl > sizeof c->w[0].rid) return core_error("controller: a hello without a client id");
    ctl_worker *x = &c->w[c->n];
    memset(x, 0, sizeof *x);
    snprintf(x->id, sizeof x->id, "%s", cid);
    memcpy(x->rid, zmq_msg_data(&zm->frames[0]), rl);
    x->rid_len = rl;
    if (core_hash_parse(json_string_value(json_object_get(m->header, "model_xxh64")), &x->hello_hash))
        return core_error("controller: %s's hello has no model_xxh64", cid);
    c->n++;
    return 0;
}

int ctl_wait_workers(ctl_server *c, int n, double timeout_s) {
    const double deadline = now_s() + timeout_s;
    while (c->n < n) {
        core_zmq_msg zm;
        core_wire_msg m;
        int w, r = recv_one(c, deadline, &zm, &m, &w, "the rollout workers' hello");
        if (r < 0) return core_error_push("%d of %d workers connected: ", c->n, n);
        if (r) continue;
        int bad = 0;
        if (m.type == CORE_WIRE_HELLO && w < 0) bad = add_worker(c, &zm, &m);
        else if (m.type != CORE_WIRE_HELLO) bad = core_error("controller: a %s before every worker said hello", core_wire_type_name(m.type));
        core_wire_msg_free(&m);
        core_zmq_msg_close(&zm);
        if (bad) return -1;
    }
    return 0;
}

int ctl_rollout(ctl_server *c, const core_rollout_request *tmpl, const core_rollout_sample *samples, int n, int chunk,
                double timeout_s, core_rollout_result *res, ctl_chunk_fn on_chunk, void *ctx) {
    if (c->n < 1) return core_error("controller: no rollout workers");
    if (chunk < 1) chunk = 1;
    const int n_chunks = (n + chunk - 1) / chunk;
    core_rollout_request *reqs = calloc((size_t)n_chunks, sizeof *reqs);
    char (*ids)[40] = calloc((size_t)n_chunks, sizeof *ids);
    uint8_t *done = calloc((size_t)n_chunks, 1);
    int next = 0, n_done = 0, rc = -1;
    memset(res, 0, sizeof *res * (size_t)n);
    if (!reqs || !ids || !done) {
        core_error("out of memory");
        goto out;
    }
    for (int k = 0; k < n_chunks; k++) {
        reqs[k] = *tmpl;
        reqs[k].samples = (core_rollout_sample *)samples + (size_t)k * chunk;
        reqs[k].n = n - k * chunk < chunk ? n - k * chunk : chunk;
        snprintf(ids[k], sizeof ids[k], "r%" PRIu64 "-%d", c->seq, k);
    }
    c->seq++;
    for (int w = 0; w < c->n; w++) c->w[w].busy = 0;
    double deadline = now_s() + timeout_s;
    while (n_done < n_chunks) {
        for (int w = 0; w < c->n && next < n_chunks; w++) {
            if (c->w[w].busy) continue;
            core_wire_built b;
            if (core_rollout_request_build(ids[next], &reqs[next], &b)) goto out;
            int sr = core_zmq_send(c->router, c->w[w].rid, c->w[w].rid_len, &b);
            core_wire_built_free(&b);
            if (sr) {
                core_error_push("controller: sending %s to %s: ", ids[next], c->w[w].id);
                goto out;
            }
            c->w[w].busy = ++next;
        }
        core_zmq_msg zm;
        core_wire_msg m;
        int w, r = recv_one(c, deadline, &zm, &m, &w, "rollout results");
        if (r < 0) goto out;
        if (r) continue;
        int bad = 0;
        if (w < 0) {
            if (m.type == CORE_WIRE_HELLO) bad = core_error("controller: a new worker said hello during a rollout");
            else bad = core_error("controller: a %s message from a peer that never said hello", core_wire_type_name(m.type));
        } else if (m.type == CORE_WIRE_ERROR) {
            bad = core_error("%s: request %s failed: %s: %s", c->w[w].id, m.id,
                             json_string_value(json_object_get(m.header, "code")),
                             json_string_value(json_object_get(m.header, "reason")));
        } else if (m.type != CORE_WIRE_TRAJECTORY || !c->w[w].busy) {
            bad = core_error("controller: unexpected %s message from %s", core_wire_type_name(m.type), c->w[w].id);
        } else {
            const int k = c->w[w].busy - 1;
            const uint8_t *videos;
            int64_t vshape[4];
            core_rollout_result *out = res + (size_t)k * chunk;
            if (strcmp(m.id, ids[k])) {
                bad = core_error("controller: %s answered %s while working on %s", c->w[w].id, m.id, ids[k]);
            } else if (core_trajectory_reply_parse(&m, &reqs[k], out, &videos, vshape)) {
                bad = core_error_push("%s: ", c->w[w].id);
            } else {
                done[k] = 1;
                n_done++;
                c->w[w].busy = 0;
                deadline = now_s() + timeout_s;
                if (on_chunk && on_chunk(ctx, reqs[k].samples, out, reqs[k].n, videos, vshape)) bad = -1;
            }
        }
        core_wire_msg_free(&m);
        core_zmq_msg_close(&zm);
        if (bad) goto out;
    }
    rc = 0;
out:
    if (rc)
        for (int k = 0; done && k < n_chunks; k++)
            if (done[k])
                for (int j = 0; j < reqs[k].n; j++) core_rollout_result_free(&res[(size_t)k * chunk + j]);
    free(reqs), free(ids), free(done);
    return rc;
}

int ctl_sync_weights(ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send,
                     int64_t version, double timeout_s, int *hash_match) {
    uint64_t model_hash;
    *hash_match = 0;
    if (wan_models_hash(experts, n_experts, &model_hash)) return -1;
    int count = 0;
    for (int e = 0; e < n_experts; e++)
        if (send[e]) count += experts[e]->layout.count;
    char hx[17], id[48];
    core_hash_hex(model_hash, hx);
    for (int w = 0; w < c->n; w++) {
        const void *rid = c->w[w].rid;
        const size_t rl = c->w[w].rid_len;
        snprintf(id, sizeof id, "w%" PRId64 "-begin", version);
        json_t *f = json_pack("{s:I, s:i}", "policy_version", (json_int_t)version, "tensors_count", count);
        int rc = core_zmq_send_fields(c->router, rid, rl, CORE_WIRE_WEIGHTS_BEGIN, id, f);
        json_decref(f);
        for (int e = 0; !rc && e < n_experts; e++) {
            if (!send[e]) continue;
            const wan_model *m = experts[e];
            for (int i = 0; !rc && i < m->layout.count; i++) {
                const wan_tensor *t = &m->layout.tensors[i];
                char name[160], th[17];
                snprintf(name, sizeof name, "%s/%s", wan_expert_folder(e), t->name);
                core_hash_hex(wan_tensor_hash(m, i), th);
                snprintf(id, sizeof id, "w%" PRId64 "-%d-%d", version, e, i);
                core_wire_tensor wt = {.name = "value", .dtype = CORE_F32, .ndim = t->ndim,
                                       .data = m->params + t->offset, .nbytes = sizeof(float) * (size_t)t->numel};
                memcpy(wt.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
                json_t *tf = json_pack("{s:s, s:s}", "name", name, "xxh64", th);
                core_wire_built b;
                rc = core_wire_build(CORE_WIRE_WEIGHTS_TENSOR, id, tf, &wt, 1, &b);
                if (!rc) rc = core_zmq_send(c->router, rid, rl, &b);
                core_wire_built_free(&b);
                json_decref(tf);
            }
        }
        snprintf(id, sizeof id, "w%" PRId64 "-end", version);
        f = json_pack("{s:I, s:s}", "policy_version", (json_int_t)version, "model_xxh64", hx);
        if (!rc) rc = core_zmq_send_fields(c->router, rid, rl, CORE_WIRE_WEIGHTS_END, id, f);
        json_decref(f);
        if (rc) return core_error_push("controller: weights to %s: ", c->w[w].id);
    }
    int acked = 0, match = 1;
    const double deadline = now_s() + timeout_s;
    uint8_t got[CTL_MAX_WORKERS] = {0};
    while (acked < c->n) {
        core_zmq_msg zm;
        core_wire_msg m;
        int w, r = recv_one(c, deadline, &zm, &m, &w, "weights_ack");
        if (r < 0) return -1;
        if (r) continue;
        int bad = 0;
        uint64_t h = 0;
        if (w < 0) {
            bad = core_error("controller: a %s from an unknown peer during the weight sync", core_wire_type_name(m.type));
        } else if (m.type == CORE_WIRE_ERROR) {
            bad = core_error("%s refused the weights of version %" PRId64 ": %s: %s", c->w[w].id, version,
                             json_string_value(json_object_get(m.header, "code")),
                             json_string_value(json_object_get(m.header, "reason")));
        } else if (m.type != CORE_WIRE_WEIGHTS_ACK || got[w]) {
            bad = core_error("controller: unexpected %s from %s during the weight sync", core_wire_type_name(m.type), c->w[w].id);
        } else if (json_integer_value(json_object_get(m.header, "policy_version")) != version ||
                   core_hash_parse(json_string_value(json_object_get(m.header, "model_xxh64")), &h)) {
            bad = core_error("%s: weights_ack without policy_version %" PRId64 " and model_xxh64", c->w[w].id, version);
        } else if (h != model_hash) {
            match = 0;
            bad = core_error("%s: model hash after the sync is %016" PRIx64 ", the trainer's is %016" PRIx64,
                             c->w[w].id, h, model_hash);
        } else {
            got[w] = 1;
            acked++;
        }
        core_wire_msg_free(&m);
        core_zmq_msg_close(&zm);
        if (bad) return -1;
    }
    *hash_match = match;
    return 0;
}

void ctl_shutdown(ctl_server *c, double timeout_s) {
    /* A shutdown follows a failure as often as a success: its own time-out must not replace the first error. */
    char first[1024];
    snprintf(first, sizeof first, "%s", core_last_error());
    for (int w = 0; w < c->n; w++) core_zmq_send_fields(c->router, c->w[w].rid, c->w[w].rid_len, CORE_WIRE_SHUTDOWN, "bye", NULL);
    const double deadline = now_s() + timeout_s;
    int n = 0;
    ctl_abort_fn saved = c->abort_check;
    c->abort_check = NULL;
    while (n < c->n) {
        core_zmq_msg zm;
        core_wire_msg m;
        int w, r = recv_one(c, deadline, &zm, &m, &w, "shutdown replies");
        if (r < 0) break;
        if (r) continue;
        if (m.type == CORE_WIRE_SHUTDOWN) n++;
        core_wire_msg_free(&m);
        core_zmq_msg_close(&zm);
    }
    c->abort_check = saved;
    if (first[0]) core_error("%s", first);
    else core_error_clear();
}
