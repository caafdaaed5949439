/* rollout/worker.c — the rollout worker's serving loop (see rollout/worker.h). */
#include "rollout/worker.h"

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
#include "core/wire_rollout.h"
#include "core/wire_zmq.h"
#include "reward/client.h"

typedef struct {
    rollout_pipeline *p;
    const rollout_worker_config *cfg;
    void *sock;
    reward_client *reward;
    int64_t version;
    /* a weights update in progress */
    int updating;
    int64_t upd_version;
    int upd_announced, upd_received;
    float *staged[2];   /* copies of the experts' params */
    uint8_t *seen[2];   /* per tensor: received */
    char upd_error[512];
} worker;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void update_reset(worker *w) {
    for (int e = 0; e < 2; e++) free(w->staged[e]), free(w->seen[e]), w->staged[e] = NULL, w->seen[e] = NULL;
    w->updating = 0;
    w->upd_error[0] = 0;
}

/* ---- rollout ---- */

static int do_rollout(worker *w, const core_wire_msg *m, const uint8_t *rid, size_t rid_len) {
    rollout_pipeline *p = w->p;
    core_rollout_request req;
    if (core_rollout_request_parse(m, &req))
        return core_zmq_send_error(w->sock, rid, rid_len, m->id, "bad_request", core_last_error());
    if (req.policy_version != w->version) {
        char why[160];
        snprintf(why, sizeof why, "request for policy version %" PRId64 ", this worker holds %" PRId64,
                 req.policy_version, w->version);
        core_rollout_request_free(&req);
        return core_zmq_send_error(w->sock, rid, rid_len, m->id, "version_mismatch", why);
    }
    const int n = req.n;
    const int64_t vb = rollout_pipeline_video_bytes(p);
    core_traj *tr = calloc((size_t)n, sizeof *tr);
    const float **cond = calloc((size_t)n, sizeof *cond);
    uint64_t *uids = malloc(sizeof(uint64_t) * (size_t)n), *vh = malloc(sizeof(uint64_t) * (size_t)n);
    int64_t *pidx = malloc(sizeof(int64_t) * (size_t)n);
    uint8_t *videos = malloc((size_t)(vb * n));
    const char **prompts = calloc((size_t)n, sizeof *prompts);
    const json_t **meta = calloc((size_t)n, sizeof *meta);
    reward_result *res = calloc((size_t)n, sizeof *res);
    const int64_t nstep_el = (int64_t)p->rc.n_steps * p->rc.shape[0] * p->rc.shape[1] * p->rc.shape[2] * p->rc.shape[3];
    float **vel = req.return_velocities ? calloc((size_t)n, sizeof(float *)) : NULL;
    float *vel_buf = req.return_velocities ? malloc(sizeof(float) * (size_t)(nstep_el * n)) : NULL;
    int have = 0, rc = 0, failed = 1;
    core_wire_built b = {0};
    if (!tr || !cond || !uids || !vh || !pidx || !videos || !prompts || !meta || !res ||
        (req.return_velocities && (!vel || !vel_buf))) {
        core_error("out of memory for %d samples", n);
        goto done;
    }
    for (int j = 0; j < n; j++) {
        uids[j] = req.samples[j].uid, pidx[j] = req.samples[j].prompt_index;
        prompts[j] = req.samples[j].prompt, meta[j] = req.samples[j].metadata;
        if (rollout_pipeline_embed(p, prompts[j], &cond[j])) goto done;
    }
    rollout_config rc_ = p->rc;
    rc_.stream = req.stream;
    rc_.eta = req.eta;
    rc_.policy_version = req.policy_version;
    if (vel) {
        for (int j = 0; j < n; j++) vel[j] = vel_buf + nstep_el * j;
        rc_.velocities = vel;
    }
    if (rollout_generate(&rc_, &p->experts, NULL, n, cond, uids, pidx, tr)) goto done;
    have = 1;
    for (int j = 0; j < n; j++) {
        if (rollout_pipeline_decode(p, &tr[j], videos + vb * j)) goto done;
        vh[j] = core_xxh64(videos + vb * j, (size_t)vb, 0);
    }
    if (reward_client_score(w->reward, videos, n, p->dec.frames, p->dec.height, p->dec.width, w->cfg->fps,
                            prompts, meta, res))
        goto done;
    for (int j = 0; j < n; j++) {
        const char *names[CORE_TRAJ_MAX_REWARDS];
        float vals[CORE_TRAJ_MAX_REWARDS];
        const int ns = res[j].n_scores < CORE_TRAJ_MAX_REWARDS ? res[j].n_scores : CORE_TRAJ_MAX_REWARDS;
        for (int k = 0; k < ns; k++) names[k] = res[j].scores[k].name, vals[k] = (float)res[j].scores[k].value;
        if (core_traj_set_rewards(&tr[j], ns, names, vals, (float)res[j].total)) goto done;
    }
    const int64_t vshape[4] = {p->dec.frames, p->dec.height, p->dec.width, 3};
    if (core_trajectory_reply_build_v(m->id, req.policy_version, n, tr, vh, req.return_trajectories,
                                      (const float *const *)vel, req.return_videos ? videos : NULL, vshape, &b))
        goto done;
    failed = 0;
    rc = core_zmq_send(w->sock, rid, rid_len, &b);
done:
    if (failed) {
        char why[1024];
        snprintf(why, sizeof why, "%s", core_last_error());
        core_log_warn("%s: request %s failed: %s", w->cfg->id, m->id, why);
        rc = core_zmq_send_error(w->sock, rid, rid_len, m->id, "rollout_failed", why);
    }
    core_wire_built_free(&b);
    if (have)
        for (int j = 0; j < n; j++) core_traj_free(&tr[j]);
    free(tr), free(cond), free(uids), free(vh), free(pidx), free(videos), free(prompts), free(meta), free(res);
    free(vel), free(vel_buf);
    core_rollout_request_free(&req);
    return rc;
}

/* ---- weights ---- */

static int weights_begin(worker *w, const core_wire_msg *m, const uint8_t *rid, size_t rid_len) {
    update_reset(w);
    const json_t *pv = json_object_get(m->header, "policy_version"), *nt = json_object_get(m->header, "tensors_count");
    if (!json_is_integer(pv) || json_integer_value(pv) < 0)
        return core_zmq_send_error(w->sock, rid, rid_len, m->id, "bad_request", "weights_begin: \"policy_version\" must be an integer >= 0");
    if (!json_is_integer(nt) || json_integer_value(nt) < 1)
        return core_zmq_send_error(w->sock, rid, rid_len, m->id, "bad_request", "weights_begin: \"tensors_count\" must be an integer >= 1");
    for (int e = 0; e < w->p->experts.n; e++) {
        const wan_model *md = w->p->experts.expert[e];
        w->staged[e] = malloc(sizeof(float) * (size_t)md->layout.numel);
        w->seen[e] = calloc((size_t)md->layout.count, 1);
        if (!w->staged[e] || !w->seen[e]) {
            update_reset(w);
            return core_zmq_send_error(w->sock, rid, rid_len, m->id, "internal", "out of memory staging the weights");
        }
        memcpy(w->staged[e], md->params, sizeof(float) * (size_t)md->layout.numel);
    }
    w->updating = 1;
    w->upd_version = json_integer_value(pv);
    w->upd_announced = (int)json_integer_value(nt);
    w->upd_received = 0;
    return 0; /* weights_begin and weights_tensor are not answered; weights_end is */
}

static void weights_tensor(worker *w, const core_wire_msg *m) {
    if (!w->updating) {
        if (!w->upd_error[0]) snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor without weights_begin");
        return;
    }
    if (w->upd_error[0]) return; /* the first error is reported at weights_end */
    const char *name = json_string_value(json_object_get(m->header, "name"));
    uint64_t want;
    if (!name || core_hash_parse(json_string_value(json_object_get(m->header, "xxh64")), &want)) {
        snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor %s: needs \"name\" and \"xxh64\" (16 hex digits)", m->id);
        return;
    }
    const core_wire_tensor *t = core_wire_find(m, "value");
    int e = -1;
    const char *rest = NULL;
    for (int k = 0; k < w->p->experts.n; k++) {
        const char *f = wan_expert_folder(k);
        size_t fl = strlen(f);
        if (!strncmp(name, f, fl) && name[fl] == '/') e = k, rest = name + fl + 1;
    }
    if (e < 0) {
        snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor: \"%.200s\" names no expert of this worker", name);
        return;
    }
    const wan_model *md = w->p->experts.expert[e];
    const int i = wan_layout_find(&md->layout, rest);
    if (i < 0) {
        snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor: the model has no tensor \"%.200s\"", name);
        return;
    }
    const wan_tensor *lt = &md->layout.tensors[i];
    int shape_ok = t && t->dtype == CORE_F32 && t->ndim == lt->ndim;
    for (int d = 0; shape_ok && d < lt->ndim; d++) shape_ok = t->shape[d] == lt->shape[d];
    if (!shape_ok) {
        snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor \"%.200s\": needs one F32 tensor \"value\" of the model's shape", name);
        return;
    }
    const uint64_t got = core_xxh64(t->data, t->nbytes, 0);
    if (got != want) {
        snprintf(w->upd_error, sizeof w->upd_error,
                 "weights_tensor \"%.200s\": xxh64 of the received bytes is %016" PRIx64 ", the header says %016" PRIx64,
                 name, got, want);
        return;
    }
    if (w->seen[e][i]) {
        snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor \"%.200s\" sent twice", name);
        return;
    }
    w->seen[e][i] = 1;
    memcpy(w->staged[e] + lt->offset, t->data, t->nbytes);
    w->upd_received++;
}

static int weights_end(worker *w, const core_wire_msg *m, const uint8_t *rid, size_t rid_len) {
    char why[700];
    uint64_t want, got = 0;
    const json_t *pv = json_object_get(m->header, "policy_version");
    if (!w->updating) snprintf(why, sizeof why, "weights_end without weights_begin");
    else if (w->upd_error[0]) snprintf(why, sizeof why, "%s", w->upd_error);
    else if (!json_is_integer(pv) || json_integer_value(pv) != w->upd_version)
        snprintf(why, sizeof why, "weights_end: \"policy_version\" differs from weights_begin's %" PRId64, w->upd_version);
    else if (core_hash_parse(json_string_value(json_object_get(m->header, "model_xxh64")), &want))
        snprintf(why, sizeof why, "weights_end: \"model_xxh64\" must be 16 hex digits");
    else if (w->upd_received != w->upd_announced)
        snprintf(why, sizeof why, "weights_end: %d tensors received, weights_begin announced %d", w->upd_received,
                 w->upd_announced);
    else {
        /* Hash the staged model: swap the staged buffers in, hash, swap back unless it matches. */
        float *old[2] = {NULL, NULL};
        wan_model *ms[2] = {&w->p->model[0], &w->p->model[1]};
        for (int e = 0; e < w->p->experts.n; e++) old[e] = ms[e]->params, ms[e]->params = w->staged[e];
        const wan_model *cm[2] = {ms[0], ms[1]};
        int hrc = wan_models_hash(cm, w->p->experts.n, &got);
        if (hrc || got != want) {
            for (int e = 0; e < w->p->experts.n; e++) ms[e]->params = old[e];
            snprintf(why, sizeof why, "weights_end: the updated model hashes to %016" PRIx64 ", the controller's is %016" PRIx64
                     "; the update is refused and version %" PRId64 " kept", got, want, w->version);
        } else {
            /* Keep the staged buffers as the parameters; re-bind the named views onto them. */
            for (int e = 0; e < w->p->experts.n; e++) {
                wan_weights_free(&ms[e]->w);
                if (wan_weights_bind(&ms[e]->w, &ms[e]->layout, ms[e]->params)) {
                    snprintf(why, sizeof why, "weights_end: out of memory");
                    return core_zmq_send_error(w->sock, rid, rid_len, m->id, "internal", why);
                }
                free(old[e]);
                w->staged[e] = NULL;
            }
            w->version = w->upd_version;
            update_reset(w);
            char hx[17];
            core_hash_hex(got, hx);
            json_t *f = json_pack("{s:I, s:s}", "policy_version", (json_int_t)w->version, "model_xxh64", hx);
            int rc = core_zmq_send_fields(w->sock, rid, rid_len, CORE_WIRE_WEIGHTS_ACK, m->id, f);
            json_decref(f);
            core_log_info("%s: weights of policy version %" PRId64 " applied (model xxh64 %s)", w->cfg->id, w->version, hx);
            return rc;
        }
    }
    update_reset(w);
    core_log_warn("%s: %s", w->cfg->id, why);
    return core_zmq_send_error(w->sock, rid, rid_len, m->id, "weights_mismatch", why);
}

/* ---- loop ---- */

static int send_hello(worker *w) {
    json_t *ex = json_array();
    for (int e = 0; e < w->p->experts.n; e++) json_array_append_new(ex, json_string(wan_expert_folder(e)));
    const wan_model *ms[2] = {w->p->experts.expert[0], w->p->experts.expert[1]};
    uint64_t h;
    char hx[17];
    if (wan_models_hash(ms, w->p->experts.n, &h)) return json_decref(ex), -1;
    core_hash_hex(h, hx);
    json_t *f = json_pack("{s:s, s:I, s:s, s:o}", "client", w->cfg->id, "policy_version", (json_int_t)w->version,
                          "model_xxh64", hx, "experts", ex);
    int rc = core_zmq_send_fields(w->sock, NULL, 0, CORE_WIRE_HELLO, "hello", f);
    json_decref(f);
    return rc;
}

int rollout_worker_run(rollout_pipeline *p, const rollout_worker_config *cfg, volatile sig_atomic_t *stop) {
    worker w = {.p = p, .cfg = cfg};
    void *ctx = zmq_ctx_new();
    int rc = -1;
    if (!ctx) return core_error("zmq: cannot create a context");
    w.sock = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, hb_ivl = 1000, hb_to = 5000, hb_ttl = 10000;
    zmq_setsockopt(w.sock, ZMQ_LINGER, &linger, sizeof linger);
    if (!strncmp(cfg->controller, "tcp://", 6)) {
        zmq_setsockopt(w.sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
        zmq_setsockopt(w.sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_to, sizeof hb_to);
        zmq_setsockopt(w.sock, ZMQ_HEARTBEAT_TTL, &hb_ttl, sizeof hb_ttl);
    }
    if (zmq_connect(w.sock, cfg->controller)) {
        core_error("controller endpoint %s: %s", cfg->controller, zmq_strerror(errno));
        goto done;
    }
    if (!(w.reward = reward_client_open(cfg->reward, cfg->id, cfg->reward_timeout_s, cfg->reward_max_attempts)))
        goto done;
    if (send_hello(&w)) goto done;
    core_log_info("%s: connected to %s, reward server %s, %d expert(s)", cfg->id, cfg->controller, cfg->reward, p->experts.n);
    double last = now_s();
    for (;;) {
        if (stop && *stop) {
            rc = 0;
            break;
        }
        zmq_pollitem_t it = {w.sock, 0, ZMQ_POLLIN, 0};
        int pr = zmq_poll(&it, 1, 200);
        if (pr < 0 && errno != EINTR) {
            core_error("zmq poll: %s", zmq_strerror(errno));
            break;
        }
        if (pr <= 0) {
            if (cfg->idle_exit_s > 0 && now_s() - last > cfg->idle_exit_s) {
                core_error("%s: no message from the controller %s for %.0f s", cfg->id, cfg->controller, cfg->idle_exit_s);
                break;
            }
            continue;
        }
        core_zmq_msg zm;
        int r = core_zmq_recv(w.sock, ZMQ_DONTWAIT, &zm);
        if (r < 0) break;
        if (r == 1) continue;
        last = now_s();
        core_wire_msg m;
        int sr = 0;
        if (core_zmq_parse(&zm, 0, NULL, &m)) {
            sr = core_zmq_send_error(w.sock, NULL, 0, "", "bad_request", core_last_error());
        } else {
            switch (m.type) {
            case CORE_WIRE_ROLLOUT_REQUEST: sr = do_rollout(&w, &m, NULL, 0); break;
            case CORE_WIRE_WEIGHTS_BEGIN: sr = weights_begin(&w, &m, NULL, 0); break;
            case CORE_WIRE_WEIGHTS_TENSOR: weights_tensor(&w, &m); break;
            case CORE_WIRE_WEIGHTS_END: sr = weights_end(&w, &m, NULL, 0); break;
            case CORE_WIRE_HELLO: break; /* the controller's greeting: nothing to answer */
            case CORE_WIRE_SHUTDOWN:
                sr = core_zmq_send_fields(w.sock, NULL, 0, CORE_WIRE_SHUTDOWN, m.id, NULL);
                core_wire_msg_free(&m);
                core_zmq_msg_close(&zm);
                rc = sr;
                goto done;
            default: {
                char why[96];
                snprintf(why, sizeof why, "a rollout worker does not serve \"%s\"", core_wire_type_name(m.type));
                sr = core_zmq_send_error(w.sock, NULL, 0, m.id, "unsupported", why);
            }
            }
            core_wire_msg_free(&m);
        }
        core_zmq_msg_close(&zm);
        if (sr) break;
    }
done:
    update_reset(&w);
    reward_client_close(w.reward);
    if (w.sock) zmq_close(w.sock);
    zmq_ctx_term(ctx);
    return rc;
}
