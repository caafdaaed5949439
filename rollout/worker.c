/* rollout/worker.c — the rollout worker's serving loop (see rollout/worker.h). */
#include "rollout/worker.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "core/checksum.h"
#include "core/curve.h"
#include "core/error.h"
#include "core/log.h"
#include "core/wire_rollout.h"
#include "core/wire_sync.h"
#include "core/wire_zmq.h"
#include "model/dit/wan_dev_exec.h"
#include "model/dit/wan_lora.h"
#include "rollout/worker_ipc.h"
#include "reward/client.h"
#include "rollout/batch.h"
#include "rollout/worker_msg.h"

typedef struct {
    rollout_pipeline *p;
    const rollout_worker_config *cfg;
    void *sock;
    int64_t max_frame; /* ZMQ_MAXMSGSIZE of the controller socket: max_frame_bytes */
    reward_client *reward;
    rollout_worker_state st;
} worker;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- replies to the controller (rollout_worker_io) ---- */

static int io_error(void *ctx, const char *id, const char *code, const char *reason) {
    worker *w = ctx;
    return core_zmq_send_error(w->sock, NULL, 0, id, code, reason);
}

static int io_fields(void *ctx, core_wire_type type, const char *id, const json_t *fields) {
    worker *w = ctx;
    return core_zmq_send_fields(w->sock, NULL, 0, type, id, fields);
}

/* ---- rollout ---- */

static int worker_should_stop(void);

/* A trajectory carries rewards as F32 (core/trajectory.h): a server's value (a finite double, reward/client.c) past
 * the float range would become inf in the cast, so it is refused here with the value the server sent. */
static int check_f32_rewards(const worker *w, const reward_result *res, int ns, int sample) {
    for (int k = 0; k <= ns; k++) {
        const double v = k < ns ? res->scores[k].value : res->total;
        if (fabs(v) > FLT_MAX)
            return core_error("reward server %s: %s%s = %.17g for sample %d is outside the F32 range of a trajectory "
                              "(|value| <= %g)", w->cfg->reward, k < ns ? "scorer " : "the weighted total",
                              k < ns ? res->scores[k].name : "", v, sample, (double)FLT_MAX);
    }
    return 0;
}

/* The batch's scorer (rollout/batch.h): the whole batch in one score request to the reward server (reward/client.h),
 * whose rewards and weighted total (reward_score_weighted, summed there) go into the trajectories. */
typedef struct {
    worker *w;
    const core_rollout_request *req;
} worker_score_ctx;

static int worker_score(void *ctx, int j0, int n, const uint8_t *videos, const int64_t vshape[4], core_traj *tr) {
    const worker_score_ctx *c = ctx;
    const char **prompts = calloc((size_t)n, sizeof *prompts);
    const json_t **meta = calloc((size_t)n, sizeof *meta);
    reward_result *res = calloc((size_t)n, sizeof *res);
    int rc = -1;
    if (!prompts || !meta || !res) {
        core_error("out of memory for %d samples", n);
        goto done;
    }
    for (int j = 0; j < n; j++) prompts[j] = c->req->samples[j0 + j].prompt, meta[j] = c->req->samples[j0 + j].metadata;
    if (reward_client_score(c->w->reward, videos, n, vshape[0], vshape[1], vshape[2], c->w->cfg->fps, prompts, meta,
                            res))
        goto done;
    for (int j = 0; j < n; j++) {
        const char *names[CORE_TRAJ_MAX_REWARDS];
        float vals[CORE_TRAJ_MAX_REWARDS];
        const int ns = res[j].n_scores < CORE_TRAJ_MAX_REWARDS ? res[j].n_scores : CORE_TRAJ_MAX_REWARDS;
        if (check_f32_rewards(c->w, &res[j], ns, j0 + j)) goto done;
        for (int k = 0; k < ns; k++) names[k] = res[j].scores[k].name, vals[k] = (float)res[j].scores[k].value;
        if (core_traj_set_rewards(&tr[j], ns, names, vals, (float)res[j].total)) goto done;
    }
    rc = 0;
done:
    free(prompts), free(meta), free(res);
    return rc;
}

/* rollout_worker_io.rollout: rolls out and scores the request's samples (rollout/batch.h) and sends the trajectory
 * reply (or an error `rollout_failed`; none when the process's stop flag cut it short). */
static int do_rollout(void *ctx, const core_wire_msg *m, const core_rollout_request *reqp) {
    worker *w = ctx;
    rollout_pipeline *p = w->p;
    const core_rollout_request req = *reqp;
    const int n = req.n;
    const int64_t vb = rollout_pipeline_video_bytes(p);
    core_traj *tr = calloc((size_t)n, sizeof *tr);
    const float **cond = calloc((size_t)n, sizeof *cond);
    uint64_t *vh = malloc(sizeof(uint64_t) * (size_t)n);
    uint8_t *videos = malloc((size_t)(vb * n));
    const float **conds = NULL;
    const int64_t nstep_el = (int64_t)p->rc.n_steps * p->rc.shape[0] * p->rc.shape[1] * p->rc.shape[2] * p->rc.shape[3];
    float **vel = req.return_velocities ? calloc((size_t)n, sizeof(float *)) : NULL;
    float *vel_buf = req.return_velocities ? malloc(sizeof(float) * (size_t)(nstep_el * n)) : NULL;
    int have = 0, rc = 0, failed = 1;
    core_wire_built b = {0};
    if (!tr || !cond || !vh || !videos || (req.return_velocities && (!vel || !vel_buf))) {
        core_error("out of memory for %d samples", n);
        goto done;
    }
    for (int j = 0; j < n; j++)
        if (rollout_pipeline_embed(p, req.samples[j].prompt, &cond[j])) goto done;
    rollout_config rc_ = p->rc;
    if (rollout_config_apply_request(&rc_, &req)) goto done;
    if (req.cond_shape[0]) { /* image to video: each sample's condition came with the request */
        const int64_t *s = rc_.shape, *c = req.cond_shape;
        /* Wan 2.2 I2V-A14B: [K, F, h, w] concatenated to every input; else TI2V's first frame [C, 1, h, w] */
        const wan_config *mc = &p->experts.expert[0]->cfg;
        const int cat = wan_cond_kind(mc) == WAN_COND_CONCAT;
        if (cat ? c[0] != wan_cond_channels(mc) || c[1] != s[1] || c[2] != s[2] || c[3] != s[3]
                : c[0] != s[0] || c[1] != 1 || c[2] != s[2] || c[3] != s[3]) {
            core_error("image conditions [%lld, %lld, %lld, %lld], but this worker's latent is [%lld, %lld, %lld, "
                       "%lld]", (long long)c[0], (long long)c[1], (long long)c[2], (long long)c[3], (long long)s[0],
                       (long long)s[1], (long long)s[2], (long long)s[3]);
            goto done;
        }
        if (!(conds = malloc(sizeof(float *) * (size_t)n))) {
            core_error("out of memory");
            goto done;
        }
        for (int j = 0; j < n; j++) conds[j] = req.samples[j].condition;
    }
    if (vel) {
        for (int j = 0; j < n; j++) vel[j] = vel_buf + nstep_el * j;
        rc_.velocities = vel;
    }
    for (int e = 0; p->dx && e < p->experts.n; e++) /* the device copies hold the weights of this version */
        if (wan_dev_exec_sync(p->dx, p->experts.expert[e], w->st.version)) goto done;
    worker_score_ctx sctx = {w, &req};
    const rollout_scorer sc = {worker_score, &sctx, 0};
    if (rollout_batch_run(&rc_, &p->experts, rollout_pipeline_exec(p), &p->dec, n, req.samples, cond, conds, &sc,
                          videos, vh, tr))
        goto done;
    have = 1;
    const int64_t vshape[4] = {p->dec.frames, p->dec.height, p->dec.width, 3};
    if (core_trajectory_reply_build_v(m->id, req.policy_version, n, tr, vh, req.return_trajectories,
                                      (const float *const *)vel, req.return_videos ? videos : NULL, vshape, &b))
        goto done;
    failed = 0;
    rc = core_zmq_send(w->sock, NULL, 0, &b);
done:
    if (failed && worker_should_stop()) {
        /* stopped by a signal: the worker leaves, and its connection closing tells the controller, which re-issues
         * the chunk (trainer/net/controller.h); an error reply would end the whole rollout instead */
        core_log_warn("%s: request %s abandoned: %s", w->cfg->id, m->id, core_last_error());
    } else if (failed) {
        char why[1024];
        snprintf(why, sizeof why, "%s", core_last_error());
        core_log_warn("%s: request %s failed: %s", w->cfg->id, m->id, why);
        rc = core_zmq_send_error(w->sock, NULL, 0, m->id, "rollout_failed", why);
    }
    core_wire_built_free(&b);
    if (have)
        for (int j = 0; j < n; j++) core_traj_free(&tr[j]);
    free(tr), free(cond), free(vh), free(videos), free(vel), free(vel_buf), free(conds);
    return rc;
}

/* ---- loop ---- */

/* Queues the hello on the controller socket: 0; 1 when it cannot be queued now (no connection to queue it on: the
 * caller connects afresh); -1 with the error set when the model's hash cannot be taken. */
static int send_hello(worker *w) {
    json_t *ex = json_array();
    for (int e = 0; e < w->p->experts.n; e++) json_array_append_new(ex, json_string(wan_expert_folder(e)));
    const wan_model *ms[2] = {w->p->experts.expert[0], w->p->experts.expert[1]};
    uint64_t h;
    char hx[17];
    if (wan_models_hash(ms, w->p->experts.n, &h)) return json_decref(ex), -1;
    core_hash_hex(h, hx);
    json_t *f = json_pack("{s:s, s:I, s:s, s:o}", "client", w->cfg->id, "policy_version", (json_int_t)w->st.version,
                          "model_xxh64", hx, "experts", ex);
    /* LoRA: model_xxh64 stays the base's; the adapters (the recipe's fresh ones, or --adapter's) are named apart */
    wan_model *mm[2] = {&w->p->model[0], &w->p->model[1]};
    const int n_ad = wan_models_adapters_hash((const wan_model *const *)mm, w->p->experts.n, &h);
    if (n_ad < 0) return json_decref(f), -1;
    if (n_ad > 0) core_hash_hex(h, hx), json_object_set_new(f, "adapter_xxh64", json_string(hx));
    /* the IPC handshake (core/wire_sync.h): where this worker runs, and whether its device opens IPC handles */
    char host[CORE_SYNC_HOST_ID_MAX];
    core_sync_host_id(host, sizeof host);
    json_object_set_new(f, "host_id", json_string(host));
    if (w->st.dev) json_object_set_new(f, "ipc", json_true());
    if (w->st.sync_host) json_object_set_new(f, "nccl", json_true()); /* it takes NCCL syncs (trainer/net/controller.h) */
    /* without waiting: a socket whose only connection just failed a handshake has no queue, and a blocking send
     * would wait for a peer forever (the loop would never connect afresh) */
    core_wire_built b;
    int rc = core_wire_build(CORE_WIRE_HELLO, "hello", f, NULL, 0, &b);
    json_decref(f);
    if (rc) return -1;
    if (core_zmq_send_nowait(w->sock, NULL, 0, &b)) rc = 1, core_error_clear();
    core_wire_built_free(&b);
    return rc;
}

/* The process's stop flag (SIGTERM/SIGINT, cmd_rollout_worker.c), polled by the engine between denoising steps so a
 * worker in the middle of a long rollout stops within one step, not at the end of its chunk. */
static volatile sig_atomic_t *worker_stop_flag;
static int worker_should_stop(void) { return worker_stop_flag && *worker_stop_flag ? SIGTERM : 0; }

/* Stops the monitor of the controller socket and closes its reading end (*mon). libzmq's I/O thread sends each
 * event with a blocking send: a monitor whose reader is closed, or one nobody reads any more, would stop that thread,
 * and every socket of the context with it. */
static void ctl_unmonitor(worker *w, void **mon) {
    if (w->sock) zmq_socket_monitor(w->sock, NULL, 0); /* no monitor: a no-op */
    if (*mon) zmq_close(*mon), *mon = NULL;
}

/* The controller connection, attempt `attempt`: closes the previous socket and monitor (*mon), opens a DEALER
 * with the run's keys (tcp: with heartbeats), a monitor of its handshakes on its own inproc endpoint, and connects.
 * With the run's keys the worker checks the controller's public key: only the run's controller completes the
 * handshake, so only it can send rollout requests, push weights or shut the worker down. 0, or -1 with the error
 * set. */
/* The largest frame the controller may send this worker (core_rollout_worker_max_frame): a weight sync's largest
 * tensor (of the experts, or of their LoRA adapters) and a rollout request's image condition for this latent. */
static int64_t max_frame_bytes(const rollout_pipeline *p) {
    int64_t numel = 0;
    for (int e = 0; e < p->experts.n; e++) {
        const wan_layout *L[2] = {&p->experts.expert[e]->layout, &p->lora[e].layout};
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < L[k]->count; i++) numel = L[k]->tensors[i].numel > numel ? L[k]->tensors[i].numel : numel;
    }
    const size_t b = core_rollout_worker_max_frame(numel, p->experts.expert[0]->cfg.in_channels, (int)p->rc.shape[1],
                                                   (int)p->rc.shape[2], (int)p->rc.shape[3]);
    return b > (size_t)INT64_MAX ? INT64_MAX : (int64_t)b;
}

static int ctl_connect(worker *w, void *ctx, void **mon, int attempt) {
    const rollout_worker_config *cfg = w->cfg;
    int linger = 0, hb_ivl = 1000, hb_to = 5000, hb_ttl = 10000;
    ctl_unmonitor(w, mon);
    if (w->sock) zmq_close(w->sock);
    if (!(w->sock = zmq_socket(ctx, ZMQ_DEALER))) return core_error("zmq: cannot create a socket: %s", zmq_strerror(errno));
    zmq_setsockopt(w->sock, ZMQ_LINGER, &linger, sizeof linger);
    /* one message queued here: a weight sync's buckets wait on the controller's side until this worker has taken
     * the previous one (trainer/net/controller.c), so a few buckets at most are in flight, not the whole model */
    const int rcvhwm = 1;
    zmq_setsockopt(w->sock, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
    if (zmq_setsockopt(w->sock, ZMQ_MAXMSGSIZE, &w->max_frame, sizeof w->max_frame))
        return core_error("zmq: cannot bound the controller socket's frames: %s", zmq_strerror(errno));
    if (!strncmp(cfg->controller, "tcp://", 6)) {
        zmq_setsockopt(w->sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
        zmq_setsockopt(w->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_to, sizeof hb_to);
        zmq_setsockopt(w->sock, ZMQ_HEARTBEAT_TTL, &hb_ttl, sizeof hb_ttl);
    }
    if (cfg->keys && core_curve_client(w->sock, cfg->keys, CORE_CURVE_CONTROLLER))
        return core_error_push("%s: controller channel: ", cfg->id);
    char mon_ep[80];
    snprintf(mon_ep, sizeof mon_ep, "inproc://worker-monitor-%p-%d", (void *)w, attempt);
    if (zmq_socket_monitor(w->sock, mon_ep, ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                                ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED) ||
        !(*mon = zmq_socket(ctx, ZMQ_PAIR)) || zmq_setsockopt(*mon, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_connect(*mon, mon_ep))
        return core_error("zmq: cannot monitor the controller socket: %s", zmq_strerror(errno));
    if (zmq_connect(w->sock, cfg->controller))
        return core_error("controller endpoint %s: %s", cfg->controller, zmq_strerror(errno));
    return 0;
}

/* The next event of the controller socket's monitor without waiting: its ZMQ_EVENT_* code, or -1 when none. */
static int ctl_event(void *mon) {
    zmq_msg_t ev, addr;
    int code = -1;
    zmq_msg_init(&ev), zmq_msg_init(&addr);
    if (zmq_msg_recv(&ev, mon, ZMQ_DONTWAIT) >= 0) {
        if (zmq_msg_more(&ev)) zmq_msg_recv(&addr, mon, 0); /* the event's endpoint: a frame that always follows */
        if (zmq_msg_size(&ev) >= 2) {
            uint16_t c;
            memcpy(&c, zmq_msg_data(&ev), 2);
            code = c;
        } else {
            code = 0; /* a malformed event: none of the codes above */
        }
    }
    zmq_msg_close(&ev), zmq_msg_close(&addr);
    return code;
}

int rollout_worker_run(rollout_pipeline *p, const rollout_worker_config *cfg, volatile sig_atomic_t *stop) {
    worker w = {.p = p, .cfg = cfg, .max_frame = max_frame_bytes(p)};
    worker_stop_flag = stop;
    p->rc.should_stop = stop ? worker_should_stop : NULL;
    int told_to_stop = 0; /* the loop ended on the controller's shutdown */
    w.st = (rollout_worker_state){.model = {&p->model[0], &p->model[1]}, .n_experts = p->experts.n, .id = cfg->id};
    /* a device that opens another process's buffers: weight syncs from a trainer on this host may come by IPC */
    const k_dev_ops *dev = p->dx ? wan_dev_exec_ops(p->dx) : NULL;
    w.st.dev = dev && dev->ipc_open && dev->ipc_close ? dev : NULL;
    w.st.dx = w.st.dev ? p->dx : NULL; /* ... into its device weights, device to device (rollout/worker_ipc.h) */
    w.st.sync_host = w.st.dx ? cfg->sync_group : NULL; /* ... or by NCCL broadcast inside one MPI job */
    if (w.st.sync_host) { /* its landing buffer now: a broadcast it could not receive would leave the job waiting */
        const wan_model *m0 = &p->model[0];
        const int64_t sent = m0->lora ? m0->lora->layout.numel : m0->layout.numel,
                      per = (int64_t)(cfg->sync_bucket_mib * 1048576.0 / sizeof(float));
        if (rollout_worker_land_reserve(&w.st, per > 0 && per < sent ? per : sent)) {
            core_log_warn("%s: no NCCL weight sync for this worker (host buckets instead): %s", cfg->id,
                          core_last_error());
            core_error_clear();
            w.st.sync_host = NULL;
        }
    }
    const rollout_worker_io io = {.ctx = &w, .send_error = io_error, .send_fields = io_fields, .rollout = do_rollout};
    void *ctx = zmq_ctx_new(), *mon = NULL;
    int rc = -1;
    if (!ctx) return core_error("zmq: cannot create a context");
    if (!cfg->keys)
        core_log_warn("%s: no keys (--keys-fd / --keys-file): the controller channel is not authenticated", cfg->id);
    int attempt = 0;
    if (ctl_connect(&w, ctx, &mon, attempt)) goto done;
    /* the reward channel is authenticated when the keys name the reward server (one the job started); an external
     * reward server holds none of the run's keys */
    const int reward_keyed = cfg->keys && core_curve_has(cfg->keys, CORE_CURVE_REWARD, 0);
    if (!(w.reward = reward_keyed ? reward_client_open_keys(cfg->reward, cfg->id, cfg->reward_timeout_s,
                                                            cfg->reward_max_attempts, cfg->keys)
                                  : reward_client_open(cfg->reward, cfg->id, cfg->reward_timeout_s, cfg->reward_max_attempts)))
        goto done;
    int hello_rc = send_hello(&w);
    if (hello_rc < 0) goto done;
    core_log_info("%s: connected to %s%s, reward server %s%s, %d expert(s)", cfg->id, cfg->controller,
                  cfg->keys ? " (CURVE)" : "", cfg->reward, reward_keyed ? " (CURVE)" : "", p->experts.n);
    /* Until the run's controller has completed a handshake, the worker connects afresh (ctl_connect: a new socket,
     * so nothing of an earlier attempt can act on this one) when libzmq will not retry by itself: after a protocol
     * error (a peer with another security mechanism) or a ZAP refusal, and every 2 s while no handshake has succeeded
     * (a failure without detail, a CURVE peer with another key, is retried by libzmq on the same socket; the fresh
     * socket is the net for a retry that never comes). Monitor events are read before each decision, and once more
     * after the monitor stops, so a handshake that has succeeded is torn down only if it completes in between (its
     * success event is queued before the first message can leave); the controller then takes the repeated hello from
     * the new socket in its hello phase (trainer/net/ctl_msg.h). */
    double last = now_s(), connect_at = now_s(), redo_at = hello_rc ? connect_at + 0.25 : 0;
    int heard = 0, failures = 0; /* heard: a message from the controller came */
    int shook = 0;               /* a handshake on the current socket succeeded (the run's controller, or plain) */
    for (;;) {
        if (stop && *stop) {
            rc = 0;
            break;
        }
        for (int code; !shook && (code = ctl_event(mon)) >= 0;) {
            if (code == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) { /* the run's controller: nothing more to watch */
                shook = 1, redo_at = 0;
                ctl_unmonitor(&w, &mon);
                break;
            }
            if (++failures <= 10 || failures % 1000 == 0)
                core_log_warn("%s: the handshake with %s failed (event 0x%x, failure %d): not the run's controller?%s",
                              cfg->id, cfg->controller, (unsigned)code, failures,
                              code == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ? "" : " connecting again");
            /* at most 4 attempts a second against a peer that fails every handshake at once */
            if (code != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && redo_at == 0) redo_at = fmax(now_s(), connect_at + 0.25);
        }
        if (!heard && !shook && redo_at == 0 && now_s() - connect_at > 2.0) redo_at = now_s();
        if (!shook && redo_at > 0 && now_s() >= redo_at) {
            /* the monitor stopped first, then what it had queued read: a handshake that succeeded in the meantime
             * keeps its socket (only one that completes between this stop and the close below is lost) */
            zmq_socket_monitor(w.sock, NULL, 0);
            for (int code; !shook && (code = ctl_event(mon)) >= 0;)
                if (code == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) shook = 1, redo_at = 0, ctl_unmonitor(&w, &mon);
            if (shook) continue;
            redo_at = 0, connect_at = now_s(), attempt++;
            if (attempt <= 10 || attempt % 100 == 0)
                core_log_info("%s: connecting to %s afresh (attempt %d)", cfg->id, cfg->controller, attempt + 1);
            if (ctl_connect(&w, ctx, &mon, attempt)) break;
            if (!heard && (hello_rc = send_hello(&w)) < 0) break;
            if (!heard && hello_rc) redo_at = connect_at + 0.25; /* this attempt died before the hello was queued */
        }
        zmq_pollitem_t it[2] = {{w.sock, 0, ZMQ_POLLIN, 0}, {mon, 0, ZMQ_POLLIN, 0}};
        int pr = zmq_poll(it, mon ? 2 : 1, 200);
        if (pr < 0 && errno != EINTR) {
            core_error("zmq poll: %s", zmq_strerror(errno));
            break;
        }
        if (pr > 0 && !(it[0].revents & ZMQ_POLLIN)) pr = 0; /* only a monitor event (read at the top): no message */
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
        heard = 1;
        core_wire_msg m;
        int hr;
        if (core_zmq_parse(&zm, 0, NULL, &m)) {
            hr = core_zmq_send_error(w.sock, NULL, 0, "", "bad_request", core_last_error()) ? -1 : 0;
        } else {
            hr = rollout_worker_handle(&w.st, &m, &io);
            core_wire_msg_free(&m);
        }
        core_zmq_msg_close(&zm);
        if (hr) {
            rc = hr > 0 ? 0 : -1;
            told_to_stop = hr > 0;
            break;
        }
    }
done:
    if (told_to_stop && w.sock) { /* the controller's `shutdown`: let our reply leave before closing */
        int flush_ms = 2000;
        zmq_setsockopt(w.sock, ZMQ_LINGER, &flush_ms, sizeof flush_ms);
    }
    rollout_worker_state_free(&w.st);
    reward_client_close(w.reward);
    ctl_unmonitor(&w, &mon);
    if (w.sock) zmq_close(w.sock);
    zmq_ctx_term(ctx);
    return rc;
}
