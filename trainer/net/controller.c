/* trainer/net/controller.c — the controller side of the rollout channel (see trainer/net/controller.h). About 860
 * lines: one state (the workers, the chunks in flight, the sync in flight and the weights every worker holds) that
 * the rollout, the three sync paths and the admissions share; what each sync path does apart from that state lives in
 * trainer/net/sync_bucket.c (buckets), core/wire_sync.c (IPC) and trainer/net/sync_nccl.c (NCCL). */
#include "trainer/net/controller.h"

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
#include "core/wire_sync.h"
#include "core/wire_zmq.h"
#include "model/dit/wan_lora.h"
#include "model/vae/latent_rgb.h"
#include "trainer/net/sync_bucket.h"
#include "trainer/net/sync_nccl.h"
#include "trainer/optim/lora.h"

struct ctl_server {
    void *ctx, *router;
    void *mon;            /* PAIR receiving the ROUTER's disconnect events: a lost worker */
    core_curve_zap *zap;  /* NULL without keys */
    int keyed;            /* messages must come over an authenticated connection */
    ctl_abort_fn abort_check;
    void *abort_ctx;
    ctl_state st;
    uint64_t seq; /* request ids */
    double rejoin_wait_s; /* with no worker left: how long to wait for a restarted one (0: fail at once) */
    /* The weights every worker holds (the last sync, or ctl_set_weights): what a worker back from a restart gets.
     * cur_send: every expert ever sent (a restarted worker holds model.path's weights). */
    int have_cur, cur_n, cur_adapters;
    const wan_model *cur[2];
    uint8_t cur_send[2];
    int64_t cur_version;
    uint64_t cur_hash;
    uint64_t admit_seq;
    int64_t bucket_bytes; /* a weight sync's bucket size (ctl_set_sync_bucket) */
    /* the same-host path (ctl_set_device_weights): the device, its buffers of the experts dev_model[e] */
    const k_dev_ops *dev;
    const wan_model *dev_model[2];
    const void *dev_buf[2];
    int64_t dev_elements[2];
    /* NCCL syncs without device buffers (ctl_set_sync_staging: ZeRO stage 3): the host copy through this staging */
    const k_dev_ops *stage_dev;
    void *staging;
    int64_t staging_bytes;
    char host_id[CORE_SYNC_HOST_ID_MAX];
    /* how syncs travel (ctl_set_sync): parallel.sync, and for NCCL syncs the group and its NCCL group */
    int sync_mode;
    sp_comm *nccl_host, *nccl;
    int nccl_off; /* a worker was lost: the broadcasts could not complete, no more NCCL syncs */
};

/* Messages queued per worker on the controller's side (ZMQ_SNDHWM; the worker's receive queue is as short,
 * rollout/worker.c); the seconds an admission sync's sends may wait for a restarted worker. */
#define CTL_SEND_QUEUE 1
#define CTL_ADMIT_SEND_S 600.0

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int ctl_max_frame_bytes(const core_recipe *r, size_t *bytes) {
    char path[4200];
    wan_config cfg;
    snprintf(path, sizeof path, "%s/transformer/config.json", r->model_path);
    if (wan_config_load(&cfg, path)) return core_error_push("controller: the bound on a worker's frames: ");
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    /* the decoded video as rollout/pipeline.c's decoder makes it: the latent frames (latent_rgb) or the recipe's */
    const int rgb = r->choice.decoder == CORE_DECODER_LATENT_RGB;
    const int fac = rgb ? WAN_LATENT_RGB_FACTOR : r->vae_scale_factor_spatial;
    const size_t video = (size_t)(rgb ? F : r->frames) * (size_t)(H * fac) * (size_t)(W * fac) * 3;
    *bytes = core_rollout_reply_max_frame(r->num_steps, cfg.in_channels, cfg.out_channels ? cfg.out_channels : cfg.in_channels,
                                          F, H, W, r->batch_size, video);
    return 0;
}

ctl_server *ctl_open(const char *endpoint, const core_curve_keys *keys, size_t max_frame_bytes, ctl_abort_fn abort_check,
                     void *abort_ctx) {
    ctl_server *c = calloc(1, sizeof *c);
    if (!c) return core_error("out of memory"), NULL;
    c->abort_check = abort_check, c->abort_ctx = abort_ctx;
    c->bucket_bytes = (int64_t)SYNC_BUCKET_MIB_DEFAULT << 20;
    core_sync_host_id(c->host_id, sizeof c->host_id);
    c->ctx = zmq_ctx_new();
    c->router = c->ctx ? zmq_socket(c->ctx, ZMQ_ROUTER) : NULL;
    int one = 1, linger = 0, hb_ivl = 1000, hb_to = 5000, hb_ttl = 10000, hs_ivl = 5000;
    if (!c->router) {
        core_error("zmq: cannot create the controller socket");
        ctl_close(c);
        return NULL;
    }
    zmq_setsockopt(c->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    /* one message queued per worker: a weight sync's buckets wait for the worker to take the previous one */
    const int sndhwm = CTL_SEND_QUEUE;
    zmq_setsockopt(c->router, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm);
    zmq_setsockopt(c->router, ZMQ_LINGER, &linger, sizeof linger);
    /* a connection that has not finished its (CURVE) handshake within 5 s is closed: what a peer without keys may
     * hold, at most one frame of max_frame_bytes per connection, is held that long at most */
    zmq_setsockopt(c->router, ZMQ_HANDSHAKE_IVL, &hs_ivl, sizeof hs_ivl);
    const int64_t maxmsg = max_frame_bytes > 0 && max_frame_bytes <= (size_t)INT64_MAX ? (int64_t)max_frame_bytes : -1;
    if (maxmsg < 0 || zmq_setsockopt(c->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg)) {
        core_error("controller: the frame bound %zu bytes cannot be set (ZMQ_MAXMSGSIZE)", max_frame_bytes);
        ctl_close(c);
        return NULL;
    }
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
    /* A worker's connection closing (its process died, or TCP heartbeats timed out) is seen by the monitor: the
     * event carries the connection's descriptor, which each worker's hello recorded (ZMQ_SRCFD). The PAIR has no
     * receive limit, so a flood of refused connections never stalls libzmq's I/O thread on a full monitor queue. */
    char mon_ep[64];
    int hwm = 0;
    snprintf(mon_ep, sizeof mon_ep, "inproc://ctl-monitor-%p", (void *)c);
    if (zmq_socket_monitor(c->router, mon_ep, ZMQ_EVENT_DISCONNECTED) || !(c->mon = zmq_socket(c->ctx, ZMQ_PAIR)) ||
        zmq_setsockopt(c->mon, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_setsockopt(c->mon, ZMQ_RCVHWM, &hwm, sizeof hwm) || zmq_connect(c->mon, mon_ep)) {
        core_error("controller: cannot monitor its socket: %s", zmq_strerror(errno));
        ctl_close(c);
        return NULL;
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
    if (c->nccl) sp_comm_destroy(c->nccl);
    if (c->router && c->mon) zmq_socket_monitor(c->router, NULL, 0);
    if (c->mon) zmq_close(c->mon);
    if (c->router) zmq_close(c->router);
    core_curve_zap_stop(c->zap);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c);
}

int ctl_endpoint(const ctl_server *c, char *buf, size_t cap) {
    size_t len = cap;
    if (!cap || zmq_getsockopt(c->router, ZMQ_LAST_ENDPOINT, buf, &len))
        return core_error("controller: cannot read its bound endpoint: %s", zmq_strerror(errno));
    return 0;
}

int ctl_n_workers(const ctl_server *c) { return c->st.n; }
const char *ctl_worker_id(const ctl_server *c, int w) { return c->st.w[w].id; }
uint64_t ctl_worker_hello_hash(const ctl_server *c, int w) { return c->st.w[w].hello_hash; }
int ctl_worker_hello_adapter(const ctl_server *c, int w, uint64_t *hash) {
    *hash = c->st.w[w].hello_adapter_hash;
    return c->st.w[w].hello_has_adapter;
}
long ctl_refused(const ctl_server *c) { return c->st.unexpected + core_curve_zap_refused(c->zap); }
int ctl_worker_lost(const ctl_server *c, int w) { return c->st.w[w].lost; }
int ctl_worker_rejoins(const ctl_server *c, int w) { return c->st.w[w].rejoins; }
void ctl_set_rejoin_wait(ctl_server *c, double seconds) { c->rejoin_wait_s = seconds > 0 ? seconds : 0; }

void ctl_set_device_weights(ctl_server *c, const k_dev_ops *dev, const wan_model *const *experts,
                            const void *const *bufs, const int64_t *elements, int n_experts) {
    memset(c->dev_model, 0, sizeof c->dev_model);
    c->dev = dev && dev->ipc_export && dev->ipc_unexport ? dev : NULL;
    for (int e = 0; c->dev && e < n_experts && e < 2; e++)
        if (bufs[e]) c->dev_model[e] = experts[e], c->dev_buf[e] = bufs[e], c->dev_elements[e] = elements[e];
}

void ctl_set_sync(ctl_server *c, int mode, sp_comm *nccl_host) { c->sync_mode = mode, c->nccl_host = nccl_host; }

void ctl_set_sync_staging(ctl_server *c, const k_dev_ops *dev, void *staging, int64_t bytes) {
    c->stage_dev = staging && bytes > 0 ? dev : NULL;
    c->staging = c->stage_dev ? staging : NULL;
    c->staging_bytes = c->stage_dev ? bytes : 0;
}


int ctl_set_sync_bucket(ctl_server *c, int64_t bytes) {
    if (bytes < (int64_t)sizeof(float) || bytes > ((int64_t)SYNC_BUCKET_MIB_MAX << 20))
        return core_error("controller: a weight sync bucket of %lld bytes (4 .. %d MiB)", (long long)bytes,
                          SYNC_BUCKET_MIB_MAX);
    c->bucket_bytes = bytes;
    return 0;
}

/* "worker-0, worker-1" (the lost ones) into buf. */
static const char *lost_names(const ctl_server *c, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int w = 0; w < c->st.n && k + 1 < cap; w++)
        if (c->st.w[w].lost) k += (size_t)snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", c->st.w[w].id);
    return buf;
}

/* Worker w is gone (why: "its connection closed", a send error): no more work or waits for it; a chunk it held goes
 * back to the queue (ctl_rollout re-issues it to the next free worker); a sync or shutdown stops waiting for it. */
static void lose(ctl_server *c, int w, const char *why) {
    ctl_state *st = &c->st;
    ctl_worker *x = &st->w[w];
    if (x->lost) return;
    x->lost = 1, x->fd = -1, x->done = 1, x->back = 0;
    x->admit = CTL_ADMIT_READY, x->admit_id[0] = 0;
    const int live = ctl_msg_live(st);
    if (st->phase == CTL_SHUTDOWN) { /* told to leave: it did */
        core_log_debug("controller: %s left (%s) during the shutdown", x->id, why);
    } else if (st->phase == CTL_ROLLOUT && x->busy > 0 && x->busy <= st->n_chunks) {
        const int k = x->busy - 1;
        core_log_warn("controller: %s lost (%s) with chunk %s (%d sample(s)) in flight: it is re-issued to %s", x->id,
                      why, st->ids[k], st->reqs[k].n, live ? "the next free worker" : "a worker that comes back");
    } else {
        core_log_warn("controller: %s lost (%s); %d rollout worker(s) left", x->id, why, live);
    }
    x->busy = 0;
}

/* Drains the ROUTER's disconnect events: a registered worker whose connection closed is lost. Called before every
 * receive, so a disconnect is seen before any message of a later connection that reuses its descriptor. */
static void drain_monitor(ctl_server *c) {
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev), zmq_msg_init(&addr);
        if (zmq_msg_recv(&ev, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev), zmq_msg_close(&addr);
            return;
        }
        if (zmq_msg_more(&ev)) zmq_msg_recv(&addr, c->mon, 0);
        uint16_t code = 0;
        uint32_t fd = 0;
        if (zmq_msg_size(&ev) >= 6) memcpy(&code, zmq_msg_data(&ev), 2), memcpy(&fd, (char *)zmq_msg_data(&ev) + 2, 4);
        zmq_msg_close(&ev), zmq_msg_close(&addr);
        if (code != ZMQ_EVENT_DISCONNECTED) continue;
        for (int w = 0; w < c->st.n; w++)
            if (!c->st.w[w].lost && c->st.w[w].fd > 0 && (uint32_t)c->st.w[w].fd == fd) lose(c, w, "its connection closed");
    }
}

/* The tensors a sync sends for expert e: the attached LoRA adapter's when the sync is of adapters, else the model's. */
static const wan_layout *sync_layout(const wan_model *m, int adapters, const float **params) {
    *params = adapters ? m->lora->params : m->params;
    return adapters ? &m->lora->layout : &m->layout;
}

/* What a sync of the experts with send[e] carries: adapters or full weights (LoRA: the experts that change carry
 * adapters; only those travel, and the hash covers every expert's adapter), the whole-model hash, the tensor count
 * and the tensor bytes. -1 with core_error on a mix of adapters and full weights. */
static int sync_plan(const wan_model *const *experts, int n_experts, const uint8_t *send, int *adapters,
                     uint64_t *model_hash, int *count, int64_t *payload) {
    int a = -1;
    for (int e = 0; e < n_experts; e++) {
        if (!send[e]) continue;
        const int has = experts[e]->lora != NULL;
        if (a >= 0 && has != a)
            return core_error("controller: a weight sync of one expert's LoRA adapter and another's full weights");
        a = has;
    }
    *adapters = a < 0 ? 0 : a;
    if (*adapters ? wan_models_adapters_hash(experts, n_experts, model_hash) < 0
                  : wan_models_hash(experts, n_experts, model_hash))
        return -1;
    *count = 0, *payload = 0;
    for (int e = 0; e < n_experts; e++)
        if (send[e]) {
            const float *p;
            const wan_layout *L = sync_layout(experts[e], *adapters, &p);
            *count += L->count, *payload += (int64_t)sizeof(float) * L->numel;
        }
    return 0;
}

/* Sends b to worker x, waiting while its queue is full (ZMQ_SNDHWM CTL_SEND_QUEUE: a worker that has not taken the
 * previous bucket holds this one back), up to deadline, polling abort_check. A multipart message is all or nothing
 * for libzmq's queue: once its routing-id frame is taken, the rest follow at once. -1 with core_error. */
static int send_queued(ctl_server *c, const ctl_worker *x, const core_wire_built *b, double deadline) {
    while (zmq_send(c->router, x->rid, x->rid_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        if (errno != EAGAIN) return core_error("zmq send: %s", zmq_strerror(errno));
        if (c->abort_check && c->abort_check(c->abort_ctx)) return -1;
        if (now_s() > deadline) return core_error("timed out: it took no message for the whole sync time-out");
        const struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    for (int i = 0; i < b->n_frames; i++)
        if (zmq_send(c->router, b->frames[i].data, b->frames[i].len, i + 1 < b->n_frames ? ZMQ_SNDMORE : 0) < 0)
            return core_error("zmq send: %s", zmq_strerror(errno));
    return 0;
}

/* Sends one weight sync to the workers ws[0..nw) side by side: weights_begin "<tag>-begin" {policy_version,
 * tensors_count, buckets_count} to each, then bucket after bucket to each in turn (the experts with send[e] in
 * buckets of c->bucket_bytes, trainer/net/sync_bucket.h: weights_bucket "<tag>-b<k>" with the xxh64 of its bytes),
 * then weights_end "<tag>-end" with the whole-model hash hx. Memory: a bucket's frames point into the experts' host
 * buffers, and libzmq copies each message into a queue of CTL_SEND_QUEUE message per worker (the worker's receive
 * queue holds as few), so a few buckets per worker are in flight, never a second copy of the weights. A worker
 * whose send fails is lost (lose, with the reason); -1 with core_error only when the buckets cannot be planned. */
static int send_weights(ctl_server *c, const int *ws, int nw, const char *tag, const wan_model *const *experts,
                        int n_experts, const uint8_t *send, int adapters, int count, int64_t version, const char *hx,
                        double deadline) {
    char id[64];
    const wan_layout *L[2] = {NULL, NULL};
    const float *P[2] = {NULL, NULL};
    for (int e = 0; e < n_experts && e < 2; e++)
        if (send[e]) L[e] = sync_layout(experts[e], adapters, &P[e]);
    const int nb = sync_bucket_plan(L, send, n_experts, c->bucket_bytes, NULL, 0);
    sync_bucket *bk = nb > 0 ? malloc(sizeof *bk * (size_t)nb) : NULL;
    if (nb < 0 || (nb > 0 && (!bk || sync_bucket_plan(L, send, n_experts, c->bucket_bytes, bk, nb) != nb))) {
        free(bk);
        if (nb > 0 && !bk) core_error("out of memory");
        return core_error_push("controller: the weights of version %" PRId64 ": ", version);
    }
    for (int k = -1; k <= nb; k++) { /* -1: weights_begin; nb: weights_end */
        core_wire_built b = {0};
        json_t *f = NULL;
        int rc = 0;
        if (k < 0) {
            snprintf(id, sizeof id, "%s-begin", tag);
            f = json_pack("{s:I, s:i, s:i}", "policy_version", (json_int_t)version, "tensors_count", count,
                          "buckets_count", nb);
            if (f && adapters) json_object_set_new(f, "adapter", json_true());
            rc = f ? core_wire_build(CORE_WIRE_WEIGHTS_BEGIN, id, f, NULL, 0, &b) : core_error("out of memory");
        } else if (k < nb) {
            snprintf(id, sizeof id, "%s-b%d", tag, k);
            rc = sync_bucket_build(id, &bk[k], L[bk[k].expert], P[bk[k].expert], &b);
        } else {
            snprintf(id, sizeof id, "%s-end", tag);
            f = json_pack("{s:I, s:s}", "policy_version", (json_int_t)version, "model_xxh64", hx);
            rc = f ? core_wire_build(CORE_WIRE_WEIGHTS_END, id, f, NULL, 0, &b) : core_error("out of memory");
        }
        json_decref(f);
        for (int j = 0; j < nw; j++) {
            const int w = ws[j];
            if (c->st.w[w].lost) continue;
            if (rc || send_queued(c, &c->st.w[w], &b, deadline)) {
                char why[600];
                snprintf(why, sizeof why, "sending the weights of version %" PRId64 " (%s) failed: %s", version, id,
                         core_last_error());
                lose(c, w, why);
            }
        }
        core_error_clear();
        core_wire_built_free(&b);
    }
    free(bk);
    return 0;
}

/* Records the weights every worker now holds (the experts' pointers are kept, not their bytes: they must stay
 * valid and unchanged until the next record). */
static void set_current(ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send,
                        int adapters, int64_t version, uint64_t hash) {
    if (n_experts < 1 || n_experts > 2) {
        c->have_cur = 0;
        return;
    }
    if (!c->have_cur || c->cur_n != n_experts || c->cur_adapters != adapters) memset(c->cur_send, 0, sizeof c->cur_send);
    c->have_cur = 1, c->cur_n = n_experts, c->cur_adapters = adapters;
    for (int e = 0; e < n_experts; e++) c->cur[e] = experts[e], c->cur_send[e] |= send[e] != 0;
    c->cur_version = version, c->cur_hash = hash;
}

/* The workers back from a restart (pending) get the weights every worker holds, under ids of their own
 * ("j<n>-..."); their weights_ack (any phase) makes them ready. With no weights recorded yet they are ready at once:
 * they hold what they loaded, as the others do (their hello matched their first one's). */
static void admit_pending(ctl_server *c) {
    ctl_state *st = &c->st;
    for (int w = 0; w < st->n; w++) {
        ctl_worker *x = &st->w[w];
        if (x->lost || x->admit != CTL_ADMIT_PENDING) continue;
        if (!c->have_cur) {
            x->admit = CTL_ADMIT_READY;
            core_log_warn("controller: %s is back at work (no weights were synced yet: it holds what it loaded)", x->id);
            continue;
        }
        int adapters, count;
        int64_t payload;
        uint64_t hash;
        char tag[32], hx[17];
        snprintf(tag, sizeof tag, "j%" PRIu64, ++c->admit_seq);
        core_hash_hex(c->cur_hash, hx);
        if (sync_plan(c->cur, c->cur_n, c->cur_send, &adapters, &hash, &count, &payload) ||
            send_weights(c, &w, 1, tag, c->cur, c->cur_n, c->cur_send, adapters, count, c->cur_version, hx,
                         now_s() + CTL_ADMIT_SEND_S)) {
            char why[600];
            snprintf(why, sizeof why, "its admission sync failed: %s", core_last_error());
            core_error_clear();
            lose(c, w, why);
            continue;
        }
        if (x->lost) continue; /* its send failed: lost, with the reason */
        x->admit = CTL_ADMIT_SYNCING;
        snprintf(x->admit_id, sizeof x->admit_id, "%s-end", tag);
        x->admit_version = c->cur_version, x->admit_hash = c->cur_hash;
        core_log_warn("controller: %s is back (restart %d): sent it the weights of policy version %" PRId64
                      " (xxh64 %s); it gets work once its hash is acknowledged", x->id, x->rejoins, c->cur_version, hx);
    }
}

int ctl_set_weights(ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send,
                    int64_t version) {
    if (!experts) {
        c->have_cur = 0;
        return 0;
    }
    int adapters, count;
    int64_t payload;
    uint64_t hash;
    if (sync_plan(experts, n_experts, send, &adapters, &hash, &count, &payload)) return -1;
    set_current(c, experts, n_experts, send, adapters, version, hash);
    admit_pending(c);
    return 0;
}

/* After a handled message: a (re-)registered worker's connection descriptor, a restarted worker's admission. */
static void after_event(ctl_server *c, core_zmq_msg *zm, const ctl_event *ev) {
    if (ev->worker < 0) return;
    ctl_worker *x = &c->st.w[ev->worker];
    if (ev->registered) x->fd = zmq_msg_get(&zm->frames[zm->n - 1], ZMQ_SRCFD);
    if (ev->rejoined) {
        if (x->admit == CTL_ADMIT_READY) core_log_warn("controller: %s is back (restart %d)", x->id, x->rejoins);
        admit_pending(c);
    }
    if (ev->admitted) {
        x->back = 1;
        char hx[17];
        core_hash_hex(c->have_cur ? c->cur_hash : 0, hx);
        core_log_warn("controller: %s is back at work: its weights of policy version %" PRId64 " hash to %s, as the "
                      "trainer's", x->id, c->cur_version, hx);
    }
}

/* Receives one message within the remaining time and applies the rules of trainer/net/ctl_msg.h: 0 with *zm, *m and
 * *ev filled (the caller frees zm and m), 1 on nothing to act on yet (a refused message was answered, a worker was
 * lost or came back, or nothing came: keep waiting), -1 on error, abort or time-out. */
static int recv_one(ctl_server *c, double deadline, core_zmq_msg *zm, core_wire_msg *m, ctl_event *ev,
                    const char *waiting_for) {
    if (c->abort_check && c->abort_check(c->abort_ctx)) return -1;
    if (now_s() > deadline) return core_error("controller: timed out waiting for %s", waiting_for);
    zmq_pollitem_t it[2] = {{c->router, 0, ZMQ_POLLIN, 0}, {c->mon, 0, ZMQ_POLLIN, 0}};
    int pr = zmq_poll(it, 2, 100);
    if (pr < 0 && errno != EINTR) return core_error("controller: zmq poll: %s", zmq_strerror(errno));
    drain_monitor(c); /* before the message: a disconnect comes before a later connection's messages */
    if (pr <= 0 || !(it[0].revents & ZMQ_POLLIN)) return 1;
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
        if (rc == 0) after_event(c, zm, ev);
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
    /* every worker registered and connected (one lost meanwhile is waited for: its restart takes its place) */
    while (c->st.n < n || ctl_msg_live(&c->st) < c->st.n) {
        core_zmq_msg zm;
        core_wire_msg m;
        ctl_event ev;
        int r = recv_one(c, deadline, &zm, &m, &ev, "the rollout workers' hello");
        if (r < 0) {
            rc = core_error_push("%d of %d workers connected: ", ctl_msg_live(&c->st), n);
            break;
        }
        if (r) continue;
        core_wire_msg_free(&m);
        core_zmq_msg_close(&zm);
    }
    c->st.phase = CTL_IDLE;
    return rc;
}

/* The lowest chunk neither finished nor held by a worker, or -1. */
static int next_chunk(const ctl_state *st, const uint8_t *done, int n_chunks) {
    for (int k = 0; k < n_chunks; k++) {
        if (done[k]) continue;
        int held = 0;
        for (int w = 0; w < st->n && !held; w++) held = st->w[w].busy == k + 1;
        if (!held) return k;
    }
    return -1;
}

int ctl_rollout(ctl_server *c, const core_rollout_request *tmpl, const core_rollout_sample *samples, int n, int chunk,
                double timeout_s, core_rollout_result *res, ctl_chunk_fn on_chunk, void *ctx) {
    ctl_state *st = &c->st;
    if (st->n < 1) return core_error("controller: no rollout workers");
    if (chunk < 1) chunk = 1;
    const int n_chunks = (n + chunk - 1) / chunk;
    core_rollout_request *reqs = calloc((size_t)n_chunks, sizeof *reqs);
    char (*ids)[40] = calloc((size_t)n_chunks, sizeof *ids);
    uint8_t *done = calloc((size_t)n_chunks, 1), *issued = calloc((size_t)n_chunks, 1);
    int n_done = 0, rc = -1;
    char names[1024];
    memset(res, 0, sizeof *res * (size_t)n);
    if (!reqs || !ids || !done || !issued) {
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
    admit_pending(c);
    double deadline = now_s() + timeout_s, alone_since = -1;
    while (n_done < n_chunks) {
        /* the lowest chunks nobody holds go to the free ready workers, in worker order: a lost worker's chunk again */
        for (int w = 0; w < st->n; w++) {
            ctl_worker *x = &st->w[w];
            if (x->lost || x->admit != CTL_ADMIT_READY || x->busy) continue;
            const int k = next_chunk(st, done, n_chunks);
            if (k < 0) break;
            core_wire_built b;
            if (core_rollout_request_build(ids[k], &reqs[k], &b)) goto out;
            int sr = core_zmq_send(c->router, x->rid, x->rid_len, &b);
            core_wire_built_free(&b);
            if (sr) { /* the worker is gone (ZMQ_ROUTER_MANDATORY: its routing id no longer reaches anyone) */
                char why[600];
                snprintf(why, sizeof why, "sending %s failed: %s", ids[k], core_last_error());
                core_error_clear();
                lose(c, w, why);
                continue;
            }
            x->busy = k + 1;
            if (issued[k]) core_log_warn("controller: chunk %s re-issued to %s", ids[k], x->id);
            if (x->back) core_log_warn("controller: %s, back after a restart, works again: chunk %s", x->id, ids[k]);
            issued[k] = 1, x->back = 0;
        }
        /* no worker left: a restarted one may come back (the supervisor restarts a dead worker), else the run stops */
        if (ctl_msg_live(st) == 0) {
            if (c->rejoin_wait_s <= 0) {
                core_error("controller: no rollout worker is left (%s lost)", lost_names(c, names, sizeof names));
                goto out;
            }
            if (alone_since < 0) {
                alone_since = now_s();
                core_log_warn("controller: no rollout worker is left (%s lost): waiting up to %.0f s for a restarted one",
                              lost_names(c, names, sizeof names), c->rejoin_wait_s);
            } else if (now_s() - alone_since > c->rejoin_wait_s) {
                core_error("controller: no rollout worker is left (%s lost) and none came back within %.0f s",
                           lost_names(c, names, sizeof names), c->rejoin_wait_s);
                goto out;
            }
        } else {
            alone_since = -1;
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
    free(reqs), free(ids), free(done), free(issued);
    return rc;
}

/* A worker neither lost nor done: the sync or shutdown still waits for it. */
static int waiting(const ctl_state *st) {
    for (int w = 0; w < st->n; w++)
        if (!st->w[w].lost && !st->w[w].done) return 1;
    return 0;
}

/* The experts sent are the device buffers of ctl_set_device_weights. */
static int dev_bufs_sent(const ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send,
                         int adapters) {
    int bufs = c->dev != NULL;
    for (int e = 0; e < n_experts && e < 2; e++) {
        const float *p;
        if (send[e] && (experts[e] != c->dev_model[e] || sync_layout(experts[e], adapters, &p)->numel != c->dev_elements[e]))
            bufs = 0;
    }
    return bufs;
}

/* The same-host exports of one sync (core/wire_sync.h): every expert with send[e], when each is a registered device
 * buffer of the experts given (not, e.g., an EMA's host copy) of the size of what the sync sends. 0 with *n = 0
 * when the sync cannot go by IPC (*why says why), or with the handles exported; -1 with core_error when an export
 * failed (the sync then goes in buckets). */
static int ipc_export(ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send, int adapters,
                      core_sync_ipc *x, int *n, char *why, size_t cap) {
    *n = 0;
    if (!c->dev) return snprintf(why, cap, "the trainer's weights are not on a device that exports them"), 0;
    if (!dev_bufs_sent(c, experts, n_experts, send, adapters))
        return snprintf(why, cap, "the weights of this sync are not the trainer's device buffers"), 0;
    for (int e = 0; e < n_experts && e < 2; e++) {
        if (!send[e]) continue;
        x[*n] = (core_sync_ipc){.expert = e, .elements = c->dev_elements[e]};
        if (c->dev->ipc_export(c->dev_buf[e], sizeof(float) * (size_t)c->dev_elements[e], x[*n].handle)) {
            for (int k = 0; k < *n; k++) c->dev->ipc_unexport(x[k].handle);
            *n = 0;
            return core_error_push("controller: the IPC export of %s: ", wan_expert_folder(e));
        }
        (*n)++;
    }
    return 0;
}

/* The IPC form of send_weights: weights_begin "<tag>-begin" with the exported handles ("ipc") and the buckets' hashes
 * ("ipc_buckets", borrowed), then weights_end. */
static int send_weights_ipc(ctl_server *c, int w, const char *tag, const core_sync_ipc *x, int nx, json_t *buckets,
                            int adapters, int count, int64_t version, const char *hx) {
    const ctl_worker *wk = &c->st.w[w];
    char id[64];
    snprintf(id, sizeof id, "%s-begin", tag);
    json_t *f = json_pack("{s:I, s:i, s:o}", "policy_version", (json_int_t)version, "tensors_count", count, "ipc",
                          core_sync_ipc_json(x, nx));
    if (!f) return core_error("out of memory");
    if (adapters) json_object_set_new(f, "adapter", json_true());
    json_object_set(f, "ipc_buckets", buckets);
    int rc = core_zmq_send_fields(c->router, wk->rid, wk->rid_len, CORE_WIRE_WEIGHTS_BEGIN, id, f);
    json_decref(f);
    snprintf(id, sizeof id, "%s-end", tag);
    f = json_pack("{s:I, s:s}", "policy_version", (json_int_t)version, "model_xxh64", hx);
    if (!rc) rc = core_zmq_send_fields(c->router, wk->rid, wk->rid_len, CORE_WIRE_WEIGHTS_END, id, f);
    json_decref(f);
    return rc ? core_error_push("controller: weights (IPC) to %s: ", wk->id) : 0;
}


/* Bytes of the largest bucket of this sync (sync_bucket_plan: a bucket never spans two experts, so with
 * parallel.sync_bucket_mib above an expert's size that expert is one bucket of its own size). */
static int64_t largest_bucket(const ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send,
                              int adapters) {
    const int64_t per = c->bucket_bytes / (int64_t)sizeof(float);
    int64_t most = 0;
    for (int e = 0; e < n_experts && e < 2; e++) {
        const float *p;
        if (!send[e]) continue;
        const int64_t n = sync_layout(experts[e], adapters, &p)->numel, k = n < per ? n : per;
        if (k > most) most = k;
    }
    return most * (int64_t)sizeof(float);
}

/* Whether this sync goes to every worker by NCCL broadcast (sync_nccl_choose): the experts sent must be the device
 * buffers of ctl_set_device_weights, or a staging buffer that holds its largest bucket (ctl_set_sync_staging) must
 * carry their host copy (then parallel.sync auto broadcasts on one host too: no device buffer for IPC). */
static int nccl_choose(ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send,
                       int adapters, char *why, size_t cap) {
    const int bufs = dev_bufs_sent(c, experts, n_experts, send, adapters)                                      ? 1
                     : c->staging && c->staging_bytes >= largest_bucket(c, experts, n_experts, send, adapters) ? 2
                                                                                                             : 0;
    return sync_nccl_choose(c->sync_mode, c->nccl_host, bufs, &c->nccl_off, &c->st, c->host_id, why, cap);
}

/* The NCCL form of send_weights (sync_nccl_send). */
static int send_weights_nccl(ctl_server *c, const char *tag, const wan_model *const *experts, int n_experts,
                             const uint8_t *send, int adapters, int count, int64_t version, const char *hx) {
    const wan_layout *L[2] = {NULL, NULL};
    const float *P[2] = {NULL, NULL};
    const int n = n_experts < 2 ? n_experts : 2;
    for (int e = 0; e < n; e++)
        if (send[e]) L[e] = sync_layout(experts[e], adapters, &P[e]);
    const int bufs = dev_bufs_sent(c, experts, n_experts, send, adapters); /* else staged from the host copy */
    const sync_nccl_job j = {.layouts = L, .host = P, .dev_bufs = bufs ? c->dev_buf : NULL,
                             .staging = bufs ? NULL : c->staging, .staging_bytes = bufs ? 0 : c->staging_bytes,
                             .send = send, .n_experts = n, .bucket_bytes = c->bucket_bytes, .adapters = adapters,
                             .count = count, .version = version, .tag = tag, .model_hash = hx};
    return sync_nccl_send(c->router, &c->st, &c->nccl, c->nccl_host, bufs ? c->dev : c->stage_dev, &j);
}

int ctl_sync_weights(ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send,
                     int64_t version, double timeout_s, int *hash_match, int64_t *bytes) {
    uint64_t model_hash;
    int adapters, count;
    int64_t payload;
    const double t0 = now_s();
    *hash_match = 0;
    if (bytes) *bytes = 0;
    if (sync_plan(experts, n_experts, send, &adapters, &model_hash, &count, &payload)) return -1;
    /* what a worker back from a restart gets from now on (with every expert sent so far) */
    set_current(c, experts, n_experts, send, adapters, version, model_hash);
    char hx[17], tag[32];
    core_hash_hex(model_hash, hx);
    snprintf(tag, sizeof tag, "w%" PRId64, version);
    ctl_state *st = &c->st;
    /* same host: the workers that can copy the weights out of the trainer's device buffers (core/wire_sync.h) */
    core_sync_ipc xs[2];
    int nx = 0;
    char why[512];
    const int nccl = nccl_choose(c, experts, n_experts, send, adapters, why, sizeof why);
    if (!nccl && c->sync_mode == CORE_SYNC_NCCL)
        core_log_warn("controller: parallel.sync nccl: version %" PRId64 " goes in buckets: %s", version, why);
    const int want_ipc = c->dev != NULL && !nccl && (c->sync_mode == CORE_SYNC_AUTO || c->sync_mode == CORE_SYNC_IPC);
    int bw[CTL_MAX_WORKERS], nbw = 0; /* the workers that get this sync in buckets */
    if (want_ipc && ipc_export(c, experts, n_experts, send, adapters, xs, &nx, why, sizeof why)) {
        snprintf(why, sizeof why, "%s", core_last_error());
        core_error_clear();
        core_log_warn("%s: this sync goes in buckets", why);
    }
    json_t *ipc_buckets = NULL; /* the buckets' xxh64 over the host copy (core/wire_sync.h), once for every worker */
    if (nx > 0) {
        const wan_layout *L[2] = {NULL, NULL};
        const float *P[2] = {NULL, NULL};
        for (int e = 0; e < n_experts && e < 2; e++)
            if (send[e]) L[e] = sync_layout(experts[e], adapters, &P[e]);
        if (!(ipc_buckets = sync_bucket_hashes_json(L, P, send, n_experts < 2 ? n_experts : 2, c->bucket_bytes))) {
            core_log_warn("controller: %s: this sync goes in buckets", core_last_error());
            core_error_clear();
            for (int k = 0; k < nx; k++) c->dev->ipc_unexport(xs[k].handle);
            nx = 0;
        }
    }
    for (int w = 0; w < st->n; w++) {
        ctl_worker *x = &st->w[w];
        x->done = 1;
        x->ipc_used = 0;
        x->nccl_used = 0;
        if (x->lost) continue;
        if (nccl) { /* every worker by broadcast (nccl_choose: none lost) */
            x->nccl_used = 1, x->done = 0;
            continue;
        }
        const core_sync_side me = {.host_id = c->host_id, .ipc = nx > 0},
                             them = {.host_id = x->host_id, .ipc = x->ipc, .refused = x->ipc_refused[0] ? x->ipc_refused : NULL};
        char whyw[512];
        x->ipc_used = nx > 0 && core_sync_ipc_choose(&me, &them, whyw, sizeof whyw);
        if (want_ipc)
            core_log_debug("controller: weights of version %" PRId64 " to %s %s (%s)", version, x->id,
                           x->ipc_used ? "by IPC" : "in buckets", nx > 0 ? whyw : why);
        if (x->ipc_used && send_weights_ipc(c, w, tag, xs, nx, ipc_buckets, adapters, count, version, hx)) {
            char lost_why[600];
            snprintf(lost_why, sizeof lost_why, "%s", core_last_error());
            core_error_clear();
            lose(c, w, lost_why);
            continue;
        }
        x->done = 0;
        if (!x->ipc_used) bw[nbw++] = w;
    }
    if (nccl && send_weights_nccl(c, tag, experts, n_experts, send, adapters, count, version, hx)) {
        for (int w = 0; w < st->n; w++) st->w[w].nccl_used = 0, st->w[w].done = 1;
        return -1;
    }
    const double deadline = now_s() + timeout_s;
    if (nbw && send_weights(c, bw, nbw, tag, experts, n_experts, send, adapters, count, version, hx, deadline)) {
        for (int j = 0; j < nbw; j++) lose(c, bw[j], core_last_error());
        core_error_clear();
    }
    if (bytes) *bytes = payload;
    st->version = version, st->model_hash = model_hash;
    snprintf(st->end_id, sizeof st->end_id, "%s-end", tag);
    st->phase = CTL_SYNC;
    int rc = 0;
    while (waiting(st)) {
        core_zmq_msg zm;
        core_wire_msg m;
        ctl_event ev = {0}; /* stays zeroed when nothing came */
        int r = recv_one(c, deadline, &zm, &m, &ev, "weights_ack");
        if (r < 0) {
            rc = -1;
            break;
        }
        if (r == 1 && ev.ipc_refused && ev.worker >= 0) { /* the same sync again, in buckets */
            ctl_worker *x = &st->w[ev.worker];
            core_log_warn("controller: %s cannot take the weights by IPC (%s): version %" PRId64 " goes to it in "
                          "buckets, as every sync from now on", x->id, x->ipc_refused, version);
            x->ipc_used = 0;
            if (send_weights(c, &ev.worker, 1, tag, experts, n_experts, send, adapters, count, version, hx, deadline)) {
                lose(c, ev.worker, core_last_error());
                core_error_clear();
            }
        }
        if (r) continue;
        core_wire_msg_free(&m);
        core_zmq_msg_close(&zm);
    }
    json_decref(ipc_buckets);
    for (int k = 0; k < nx; k++) /* every worker has read (or will never read) the exported buffers */
        if (c->dev->ipc_unexport(xs[k].handle)) core_log_warn("controller: %s", core_last_error()), core_error_clear();
    st->phase = CTL_IDLE;
    *hash_match = rc == 0;
    int n_ipc = 0, n_nccl = 0, n_bk = 0; /* the per-sync line: bytes, seconds, GB/s and the path each worker took */
    for (int w = 0; w < st->n; w++)
        if (!st->w[w].lost) {
            n_ipc += st->w[w].ipc_used, n_nccl += st->w[w].nccl_used;
            n_bk += !st->w[w].ipc_used && !st->w[w].nccl_used;
        }
    const int nw = n_ipc + n_nccl + n_bk;
    const double dt = now_s() - t0;
    if (!rc)
        core_log_info("controller: weight sync of policy version %" PRId64 ": %.2f MiB to each of %d worker(s) (%d by "
                      "IPC, %d by NCCL broadcast, %d in buckets) in %.3f s, %.3f GB/s", version, payload / 1048576.0,
                      nw, n_ipc, n_nccl, n_bk, dt, dt > 0 ? (double)payload * nw / dt / 1e9 : 0.0);
    return rc;
}

void ctl_shutdown(ctl_server *c, double timeout_s) {
    /* A shutdown follows a failure as often as a success: its own time-out must not replace the first error. */
    char first[1024];
    snprintf(first, sizeof first, "%s", core_last_error());
    ctl_state *st = &c->st;
    for (int w = 0; w < st->n; w++) {
        st->w[w].done = st->w[w].lost;
        if (!st->w[w].lost &&
            core_zmq_send_fields(c->router, st->w[w].rid, st->w[w].rid_len, CORE_WIRE_SHUTDOWN, "bye", NULL))
            lose(c, w, "the shutdown could not be sent"); /* gone: no reply to wait for */
    }
    st->phase = CTL_SHUTDOWN;
    const double deadline = now_s() + timeout_s;
    ctl_abort_fn saved = c->abort_check;
    c->abort_check = NULL;
    while (waiting(st)) {
        core_zmq_msg zm;
        core_wire_msg m;
        ctl_event ev;
        int r = recv_one(c, deadline, &zm, &m, &ev, "shutdown replies");
        if (r < 0) break;
        if (r) continue;
        core_wire_msg_free(&m);
        core_zmq_msg_close(&zm);
    }
    st->phase = CTL_IDLE;
    c->abort_check = saved;
    if (first[0]) core_error("%s", first);
    else core_error_clear();
}
