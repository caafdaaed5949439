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
#include "core/log.h"
#include "core/wire_zmq.h"
#include "model/dit/wan_lora.h"
#include "trainer/lora.h"

struct ctl_server {
    void *ctx, *router;
    core_curve_zap *zap;  /* NULL without keys */
    int keyed;            /* messages must come over an authenticated connection */
    ctl_abort_fn abort_check;
    void *abort_ctx;
    ctl_state st;
    uint64_t seq; /* request ids */
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

ctl_server *ctl_open(const char *endpoint, const core_curve_keys *keys, ctl_abort_fn abort_check, void *abort_ctx) {
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
    if (keys) {
        /* the ZAP handler first: without it libzmq's CURVE accepts any client key */
        const char *allow[] = {keys->pub[CORE_CURVE_CLIENT]};
        if (!core_curve_has(keys, CORE_CURVE_CLIENT, 0) ||
            !(c->zap = core_curve_zap_start(c->ctx, allow, 1, "controller")) ||
            core_curve_server(c->router, keys, CORE_CURVE_CONTROLLER)) {
            if (!core_curve_has(keys, CORE_CURVE_CLIENT, 0)) core_error("the keys hold no client public key");
            core_error_push("controller: ");
            ctl_close(c);
            return NULL;
        }
        c->keyed = 1;
    }
    if (core_zmq_bind(c->router, endpoint)) {
        core_error_push("controller: ");
        ctl_close(c);
        return NULL;
    }
    return c;
}

void ctl_close(ctl_server *c) {
    if (!c) return;
    if (c->router) zmq_close(c->router);
    core_curve_zap_stop(c->zap);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c);
}

int ctl_n_workers(const ctl_server *c) { return c->st.n; }
const char *ctl_worker_id(const ctl_server *c, int w) { return c->st.w[w].id; }
uint64_t ctl_worker_hello_hash(const ctl_server *c, int w) { return c->st.w[w].hello_hash; }
int ctl_worker_hello_adapter(const ctl_server *c, int w, uint64_t *hash) {
    *hash = c->st.w[w].hello_adapter_hash;
    return c->st.w[w].hello_has_adapter;
}
long ctl_refused(const ctl_server *c) { return c->st.unexpected + core_curve_zap_refused(c->zap); }

/* Receives one message within the remaining time and applies the rules of trainer/ctl_msg.h: 0 with *zm, *m and
 * *ev filled (the caller frees zm and m), 1 on nothing to act on yet (a refused message was answered, or nothing
 * came: keep waiting), -1 on error, abort or time-out. */
static int recv_one(ctl_server *c, double deadline, core_zmq_msg *zm, core_wire_msg *m, ctl_event *ev,
                    const char *waiting_for) {
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
    const void *rid = zmq_msg_data(&zm->frames[0]);
    const size_t rl = zmq_msg_size(&zm->frames[0]);
    ctl_reply reply;
    int rc = 1;
    if (c->keyed && !core_curve_peer(&zm->frames[1])) {
        ctl_msg_refuse(&c->st, rid, rl, "unauthenticated", "the connection is not authenticated with the run's keys",
                       &reply);
    } else if (core_zmq_parse(zm, 1, NULL, m)) {
        ctl_msg_refuse(&c->st, rid, rl, "bad_request", core_last_error(), &reply);
        core_error_clear();
    } else {
        rc = ctl_msg_handle(&c->st, rid, rl, m, ev, &reply);
        if (rc == 0 && !ev->progress) rc = 1;
        if (rc != 0) core_wire_msg_free(m);
    }
    /* never blocks: a peer that does not read cannot stall the controller; a failed reply is only logged */
    if (reply.send && core_zmq_send_error_nowait(c->router, rid, rl, reply.id, reply.code, reply.reason))
        core_log_debug("controller: error reply not delivered: %s", core_last_error());
    if (rc != 0) core_zmq_msg_close(zm);
    return rc < 0 ? -1 : rc;
}

int ctl_wait_workers(ctl_server *c, int n, double timeout_s) {
    if (n > CTL_MAX_WORKERS) return core_error("controller: more than %d workers", CTL_MAX_WORKERS);
    const double deadline = now_s() + timeout_s;
    c->st.phase = CTL_HELLO;
    c->st.want = n;
    int rc = 0;
    while (c->st.n < n) {
        core_zmq_msg zm;
        core_wire_msg m;
        ctl_event ev;
        int r = recv_one(c, deadline, &zm, &m, &ev, "the rollout workers' hello");
        if (r < 0) {
            rc = core_error_push("%d of %d workers connected: ", c->st.n, n);
            break;
        }
        if (r) continue;
        core_wire_msg_free(&m);
        core_zmq_msg_close(&zm);
    }
    c->st.phase = CTL_IDLE;
    return rc;
}

int ctl_rollout(ctl_server *c, const core_rollout_request *tmpl, const core_rollout_sample *samples, int n, int chunk,
                double timeout_s, core_rollout_result *res, ctl_chunk_fn on_chunk, void *ctx) {
    ctl_state *st = &c->st;
    if (st->n < 1) return core_error("controller: no rollout workers");
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
    for (int w = 0; w < st->n; w++) st->w[w].busy = 0;
    st->reqs = reqs, st->ids = (const char(*)[40])ids, st->n_chunks = n_chunks, st->chunk = chunk;
    st->res = res, st->chunk_done = done;
    st->phase = CTL_ROLLOUT;
    double deadline = now_s() + timeout_s;
    while (n_done < n_chunks) {
        for (int w = 0; w < st->n && next < n_chunks; w++) {
            if (st->w[w].busy) continue;
            core_wire_built b;
            if (core_rollout_request_build(ids[next], &reqs[next], &b)) goto out;
            int sr = core_zmq_send(c->router, st->w[w].rid, st->w[w].rid_len, &b);
            core_wire_built_free(&b);
            if (sr) {
                core_error_push("controller: sending %s to %s: ", ids[next], st->w[w].id);
                goto out;
            }
            st->w[w].busy = ++next;
        }
        core_zmq_msg zm;
        core_wire_msg m;
        ctl_event ev;
        int r = recv_one(c, deadline, &zm, &m, &ev, "rollout results");
        if (r < 0) goto out;
        if (r) continue;
        int bad = 0;
        if (ev.chunk >= 0) {
            const int k = ev.chunk;
            n_done++;
            deadline = now_s() + timeout_s;
            if (on_chunk && on_chunk(ctx, reqs[k].samples, res + (size_t)k * chunk, reqs[k].n, ev.videos, ev.vshape)) bad = -1;
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
    for (int w = 0; w < st->n; w++) st->w[w].busy = 0;
    st->phase = CTL_IDLE;
    st->reqs = NULL, st->ids = NULL, st->n_chunks = 0, st->res = NULL, st->chunk_done = NULL;
    free(reqs), free(ids), free(done);
    return rc;
}

/* The tensors a sync sends for expert e: the attached LoRA adapter's when the sync is of adapters, else the model's. */
static const wan_layout *sync_layout(const wan_model *m, int adapters, const float **params) {
    *params = adapters ? m->lora->params : m->params;
    return adapters ? &m->lora->layout : &m->layout;
}

int ctl_sync_weights(ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send,
                     int64_t version, double timeout_s, int *hash_match, int64_t *bytes) {
    uint64_t model_hash;
    *hash_match = 0;
    if (bytes) *bytes = 0;
    /* LoRA: the experts that change carry adapters; only those travel, and the hash covers every expert's adapter */
    int adapters = -1;
    for (int e = 0; e < n_experts; e++) {
        if (!send[e]) continue;
        const int a = experts[e]->lora != NULL;
        if (adapters >= 0 && a != adapters)
            return core_error("controller: a weight sync of one expert's LoRA adapter and another's full weights");
        adapters = a;
    }
    if (adapters < 0) adapters = 0;
    if (adapters ? wan_models_adapters_hash(experts, n_experts, &model_hash) < 0 : wan_models_hash(experts, n_experts, &model_hash))
        return -1;
    int count = 0;
    int64_t payload = 0;
    for (int e = 0; e < n_experts; e++)
        if (send[e]) {
            const float *p;
            const wan_layout *L = sync_layout(experts[e], adapters, &p);
            count += L->count, payload += (int64_t)sizeof(float) * L->numel;
        }
    char hx[17], id[48];
    core_hash_hex(model_hash, hx);
    ctl_state *st = &c->st;
    for (int w = 0; w < st->n; w++) {
        const void *rid = st->w[w].rid;
        const size_t rl = st->w[w].rid_len;
        snprintf(id, sizeof id, "w%" PRId64 "-begin", version);
        json_t *f = json_pack("{s:I, s:i}", "policy_version", (json_int_t)version, "tensors_count", count);
        if (adapters) json_object_set_new(f, "adapter", json_true());
        int rc = core_zmq_send_fields(c->router, rid, rl, CORE_WIRE_WEIGHTS_BEGIN, id, f);
        json_decref(f);
        for (int e = 0; !rc && e < n_experts; e++) {
            if (!send[e]) continue;
            const wan_model *m = experts[e];
            const float *params;
            const wan_layout *L = sync_layout(m, adapters, &params);
            for (int i = 0; !rc && i < L->count; i++) {
                const wan_tensor *t = &L->tensors[i];
                char name[160], th[17];
                snprintf(name, sizeof name, "%s/%s", wan_expert_folder(e), t->name);
                core_hash_hex(adapters ? wan_lora_tensor_hash(m->lora, i) : wan_tensor_hash(m, i), th);
                snprintf(id, sizeof id, "w%" PRId64 "-%d-%d", version, e, i);
                core_wire_tensor wt = {.name = "value", .dtype = CORE_F32, .ndim = t->ndim,
                                       .data = params + t->offset, .nbytes = sizeof(float) * (size_t)t->numel};
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
        if (rc) return core_error_push("controller: weights to %s: ", st->w[w].id);
    }
    if (bytes) *bytes = payload;
    for (int w = 0; w < st->n; w++) st->w[w].done = 0;
    st->version = version, st->model_hash = model_hash;
    snprintf(st->end_id, sizeof st->end_id, "w%" PRId64 "-end", version);
    st->phase = CTL_SYNC;
    int acked = 0, rc = 0;
    const double deadline = now_s() + timeout_s;
    while (acked < st->n) {
        core_zmq_msg zm;
        core_wire_msg m;
        ctl_event ev;
        int r = recv_one(c, deadline, &zm, &m, &ev, "weights_ack");
        if (r < 0) {
            rc = -1;
            break;
        }
        if (r) continue;
        acked++;
        core_wire_msg_free(&m);
        core_zmq_msg_close(&zm);
    }
    st->phase = CTL_IDLE;
    *hash_match = rc == 0;
    return rc;
}

void ctl_shutdown(ctl_server *c, double timeout_s) {
    /* A shutdown follows a failure as often as a success: its own time-out must not replace the first error. */
    char first[1024];
    snprintf(first, sizeof first, "%s", core_last_error());
    ctl_state *st = &c->st;
    for (int w = 0; w < st->n; w++) {
        st->w[w].done = 0;
        core_zmq_send_fields(c->router, st->w[w].rid, st->w[w].rid_len, CORE_WIRE_SHUTDOWN, "bye", NULL);
    }
    st->phase = CTL_SHUTDOWN;
    const double deadline = now_s() + timeout_s;
    int n = 0;
    ctl_abort_fn saved = c->abort_check;
    c->abort_check = NULL;
    while (n < st->n) {
        core_zmq_msg zm;
        core_wire_msg m;
        ctl_event ev;
        int r = recv_one(c, deadline, &zm, &m, &ev, "shutdown replies");
        if (r < 0) break;
        if (r) continue;
        n++;
        core_wire_msg_free(&m);
        core_zmq_msg_close(&zm);
    }
    st->phase = CTL_IDLE;
    c->abort_check = saved;
    if (first[0]) core_error("%s", first);
    else core_error_clear();
}
