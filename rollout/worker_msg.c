/* rollout/worker_msg.c — a rollout worker's answer to one controller message (see rollout/worker_msg.h). */
#include "rollout/worker_msg.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/log.h"
#include "core/tensor.h"
#include "core/wire_sync.h"
#include "kernels/dev_ops.h"
#include "model/dit/wan_lora.h"
#include "rollout/worker_ipc.h"

static void update_reset(rollout_worker_state *w) {
    if (w->upd_device) rollout_worker_ipc_abandon(w); /* a device update not applied: its device copies go */
    w->upd_device = 0;
    for (int e = 0; e < 2; e++) free(w->thash[e]), w->thash[e] = NULL;
    for (int e = 0; e < 2; e++) free(w->staged[e]), free(w->seen[e]), w->staged[e] = NULL, w->seen[e] = NULL;
    w->updating = 0;
    w->adapter = 0;
    w->upd_buckets = -1, w->upd_bucket_next = 0;
    w->upd_ipc = w->upd_ipc_refused = 0;
    w->upd_next[0] = w->upd_next[1] = 0;
    w->upd_error[0] = 0;
}

void rollout_worker_state_free(rollout_worker_state *s) {
    update_reset(s);
    rollout_worker_ipc_free(s);
}

/* ---- weights ---- */

/* The IPC half of weights_begin (core/wire_sync.h): each exported expert's buffer, opened through the device table,
 * is copied whole into the staged copy (on CUDA a device-to-host copy out of the trainer's buffer) and closed; the
 * whole-model hash at weights_end then covers these bytes. No buckets follow. A handle that cannot be used is kept
 * as upd_error with upd_ipc_refused: weights_end answers ipc_refused and the controller sends buckets instead. */
static void ipc_copy(rollout_worker_state *w, const json_t *arr) {
    core_sync_ipc x[2];
    int n = 0;
    w->upd_ipc = 1, w->upd_buckets = 0;
    const k_dev_ops *dev = w->dev;
    if (!dev || !dev->ipc_open || !dev->ipc_close) {
        w->upd_ipc_refused = 1;
        snprintf(w->upd_error, sizeof w->upd_error, "weights_begin: IPC offered, but this worker has no device that "
                 "opens IPC handles");
        return;
    }
    if (core_sync_ipc_parse(arr, w->n_experts, x, 2, &n)) {
        w->upd_ipc_refused = 1;
        snprintf(w->upd_error, sizeof w->upd_error, "%s", core_last_error());
        core_error_clear();
        return;
    }
    for (int k = 0; k < n; k++) {
        const int e = x[k].expert;
        float *params;
        const wan_layout *L = rollout_worker_layout(w, e, &params);
        const void *p = NULL;
        if (!L || !w->staged[e] || L->numel != x[k].elements) {
            w->upd_ipc_refused = 1;
            snprintf(w->upd_error, sizeof w->upd_error, "weights_begin: \"ipc\" %s of %lld elements, this worker's %s "
                     "has %lld", wan_expert_folder(e), (long long)x[k].elements, w->adapter ? "adapter" : "model",
                     L ? (long long)L->numel : 0LL);
            return;
        }
        const size_t bytes = sizeof(float) * (size_t)L->numel;
        if (dev->ipc_open(x[k].handle, bytes, &p) || dev->mem_download(w->staged[e], p, bytes) || dev->mem_sync()) {
            w->upd_ipc_refused = 1;
            snprintf(w->upd_error, sizeof w->upd_error, "weights_begin: the IPC handle of %s: %s", wan_expert_folder(e),
                     core_last_error());
            core_error_clear();
            if (p) dev->ipc_close(p);
            return;
        }
        if (dev->ipc_close(p)) core_log_warn("%s: %s", w->id ? w->id : "worker", core_last_error()), core_error_clear();
        char prefix[32];
        snprintf(prefix, sizeof prefix, "%s/", wan_expert_folder(e));
        if (wan_layout_check_finite(L, w->staged[e], "weights (IPC)", prefix)) {
            snprintf(w->upd_error, sizeof w->upd_error, "%s", core_last_error()); /* not a refusal: the values */
            core_error_clear();
            return;
        }
        memset(w->seen[e], 1, (size_t)L->count);
        w->upd_received += L->count;
    }
}

static int weights_begin(rollout_worker_state *w, const core_wire_msg *m, const rollout_worker_io *io) {
    update_reset(w);
    const json_t *pv = json_object_get(m->header, "policy_version"), *nt = json_object_get(m->header, "tensors_count");
    if (!json_is_integer(pv) || json_integer_value(pv) < 0)
        return io->send_error(io->ctx, m->id, "bad_request", "weights_begin: \"policy_version\" must be an integer >= 0");
    if (!json_is_integer(nt) || json_integer_value(nt) < 1)
        return io->send_error(io->ctx, m->id, "bad_request", "weights_begin: \"tensors_count\" must be an integer >= 1");
    const json_t *nb = json_object_get(m->header, "buckets_count");
    if (nb && (!json_is_integer(nb) || json_integer_value(nb) < 1 || json_integer_value(nb) > INT32_MAX))
        return io->send_error(io->ctx, m->id, "bad_request", "weights_begin: \"buckets_count\" must be an integer >= 1");
    w->adapter = json_is_true(json_object_get(m->header, "adapter"));
    const json_t *ipc = json_object_get(m->header, "ipc"), *ipc_buckets = json_object_get(m->header, "ipc_buckets");
    const json_t *nccl = json_object_get(m->header, "nccl_buckets");
    /* device weights and the buckets' hashes: device to device, nothing staged on the host (rollout/worker_ipc.h) */
    const int device = ((ipc && ipc_buckets) || (nccl && w->sync_host)) && w->dx;
    int staged = 0;
    for (int e = 0; e < w->n_experts; e++) {
        float *params;
        const wan_layout *L = rollout_worker_layout(w, e, &params);
        if (!L) continue; /* an adapter update: this expert has none (frozen) */
        if (!device) w->staged[e] = malloc(sizeof(float) * (size_t)L->numel);
        w->seen[e] = calloc((size_t)L->count, 1);
        if ((!device && !w->staged[e]) || !w->seen[e]) {
            update_reset(w);
            return io->send_error(io->ctx, m->id, "internal", "out of memory staging the weights");
        }
        if (!device) memcpy(w->staged[e], params, sizeof(float) * (size_t)L->numel);
        staged++;
    }
    if (!staged) /* reported at weights_end, which the controller waits for */
        snprintf(w->upd_error, sizeof w->upd_error, "weights_begin: an update of LoRA adapters, but this worker holds "
                 "none (model.lora.rank 0 in its recipe, and no --adapter)");
    w->updating = 1;
    w->upd_version = json_integer_value(pv);
    w->upd_announced = (int)json_integer_value(nt);
    w->upd_received = 0;
    w->upd_buckets = nb ? (int)json_integer_value(nb) : -1;
    if (device && nccl) rollout_worker_nccl_device(w, nccl); /* collective: even after a problem */
    else if (device && !w->upd_error[0]) rollout_worker_ipc_device(w, ipc, ipc_buckets);
    else if (ipc && !w->upd_error[0]) ipc_copy(w, ipc);
    return 0; /* weights_begin, weights_tensor and weights_bucket are not answered; weights_end is */
}

static void weights_tensor(rollout_worker_state *w, const core_wire_msg *m) {
    if (!w->updating) {
        if (!w->upd_error[0]) snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor without weights_begin");
        return;
    }
    if (w->upd_error[0]) return; /* the first error is reported at weights_end */
    if (w->upd_buckets >= 0) {
        snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor %s: weights_begin announced buckets", m->id);
        return;
    }
    const char *name = json_string_value(json_object_get(m->header, "name"));
    uint64_t want;
    if (!name || core_hash_parse(json_string_value(json_object_get(m->header, "xxh64")), &want)) {
        snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor %s: needs \"name\" and \"xxh64\" (16 hex digits)", m->id);
        return;
    }
    const core_wire_tensor *t = core_wire_find(m, "value");
    int e = -1;
    const char *rest = NULL;
    for (int k = 0; k < w->n_experts; k++) {
        const char *f = wan_expert_folder(k);
        size_t fl = strlen(f);
        if (!strncmp(name, f, fl) && name[fl] == '/') e = k, rest = name + fl + 1;
    }
    if (e < 0) {
        snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor: \"%.200s\" names no expert of this worker", name);
        return;
    }
    float *params;
    const wan_layout *L = rollout_worker_layout(w, e, &params);
    const int i = L ? wan_layout_find(L, rest) : -1;
    if (i < 0) {
        snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor: the %s has no tensor \"%.200s\"",
                 w->adapter ? "LoRA adapter" : "model", name);
        return;
    }
    const wan_tensor *lt = &L->tensors[i];
    int shape_ok = t && t->dtype == CORE_F32 && t->ndim == lt->ndim;
    for (int d = 0; shape_ok && d < lt->ndim; d++) shape_ok = t->shape[d] == lt->shape[d];
    if (!shape_ok) {
        snprintf(w->upd_error, sizeof w->upd_error, "weights_tensor \"%.200s\": needs one F32 tensor \"value\" of the %s's shape", name,
                 w->adapter ? "adapter" : "model");
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
    if (core_f32_check_finite(w->staged[e] + lt->offset, (size_t)lt->numel, "weights_tensor", name)) {
        snprintf(w->upd_error, sizeof w->upd_error, "%s", core_last_error()); /* the staged copy is dropped */
        return;
    }
    w->upd_received++;
}

/* The tensor of L holding element pos (tensors lie back to back in layout order), or -1. */
static int tensor_at(const wan_layout *L, int64_t pos) {
    for (int i = 0; i < L->count; i++)
        if (pos >= L->tensors[i].offset && pos < L->tensors[i].offset + L->tensors[i].numel) return i;
    return -1;
}

/* One bucket of a bucketed update (trainer/net/sync_bucket.h): its pieces land in the staged copy at the expert's
 * next offset, then the worker's side of the bucket hash: xxh64 of the staged bytes [offset, offset + count), which
 * must equal the header's (computed by the controller over the bytes it sent); then the values must be finite. The
 * first problem is kept for weights_end, naming the bucket, its element range and the tensors it spans. */
static void weights_bucket(rollout_worker_state *w, const core_wire_msg *m) {
    char *err = w->upd_error;
    const size_t cap = sizeof w->upd_error;
    if (!w->updating) {
        if (!err[0]) snprintf(err, cap, "weights_bucket without weights_begin");
        return;
    }
    if (err[0]) return;
    if (w->upd_buckets < 0) {
        snprintf(err, cap, "weights_bucket %s: weights_begin announced no buckets_count", m->id);
        return;
    }
    const char *ex = json_string_value(json_object_get(m->header, "expert"));
    const json_t *ji = json_object_get(m->header, "index"), *jo = json_object_get(m->header, "offset");
    uint64_t want;
    if (!ex || !json_is_integer(ji) || !json_is_integer(jo) ||
        core_hash_parse(json_string_value(json_object_get(m->header, "xxh64")), &want)) {
        snprintf(err, cap, "weights_bucket %s: needs \"expert\", \"index\", \"offset\" (integers) and \"xxh64\" (16 hex "
                 "digits)", m->id);
        return;
    }
    const long long idx = json_integer_value(ji), off = json_integer_value(jo);
    int e = -1;
    for (int k = 0; k < w->n_experts; k++)
        if (!strcmp(ex, wan_expert_folder(k))) e = k;
    float *params;
    const wan_layout *L = e >= 0 ? rollout_worker_layout(w, e, &params) : NULL;
    if (idx != w->upd_bucket_next) {
        snprintf(err, cap, "weights_bucket %lld: bucket %d was due (buckets come in order)", idx, w->upd_bucket_next);
        return;
    }
    if (!L || !w->staged[e]) {
        snprintf(err, cap, "weights_bucket %lld: \"%.64s\" names no %s of this worker", idx, ex,
                 w->adapter ? "expert with a LoRA adapter" : "expert");
        return;
    }
    if (off != w->upd_next[e]) {
        snprintf(err, cap, "weights_bucket %lld: offset %lld into %s, %lld was due (an expert's buckets are contiguous)",
                 idx, off, ex, (long long)w->upd_next[e]);
        return;
    }
    int64_t pos = off;
    int first = -1, last = -1;
    for (int k = 0; k < m->n_tensors; k++) {
        const core_wire_tensor *t = &m->tensors[k];
        const int i = tensor_at(L, pos);
        if (i < 0) {
            snprintf(err, cap, "weights_bucket %lld: piece %d runs past the %lld elements of %s", idx, k,
                     (long long)L->numel, ex);
            return;
        }
        const wan_tensor *lt = &L->tensors[i];
        const int64_t n = t->ndim == 1 ? t->shape[0] : -1;
        if (t->dtype != CORE_F32 || n < 1 || strcmp(t->name, lt->name) || pos + n > lt->offset + lt->numel) {
            snprintf(err, cap, "weights_bucket %lld: piece %d \"%.200s\" must be F32 [n] of %s/%s from its element %lld "
                     "(at most %lld elements)", idx, k, t->name, ex, lt->name, (long long)(pos - lt->offset),
                     (long long)(lt->offset + lt->numel - pos));
            return;
        }
        memcpy(w->staged[e] + pos, t->data, t->nbytes);
        pos += n;
        if (first < 0) first = i;
        last = i;
    }
    if (pos == off) {
        snprintf(err, cap, "weights_bucket %lld holds no piece", idx);
        return;
    }
    const uint64_t got = core_xxh64(w->staged[e] + off, sizeof(float) * (size_t)(pos - off), 0);
    if (got != want) {
        snprintf(err, cap, "weights_bucket %lld (%s elements [%lld, %lld): %s .. %s): xxh64 of the received bytes is "
                 "%016" PRIx64 ", the header says %016" PRIx64, idx, ex, off, (long long)pos, L->tensors[first].name,
                 L->tensors[last].name, got, want);
        return;
    }
    for (int i = first; i <= last; i++) {
        const wan_tensor *lt = &L->tensors[i];
        const int64_t lo = lt->offset > off ? lt->offset : off, hi = lt->offset + lt->numel < pos ? lt->offset + lt->numel : pos;
        char name[200];
        snprintf(name, sizeof name, "%s/%s", ex, lt->name);
        if (core_f32_check_finite(w->staged[e] + lo, (size_t)(hi - lo), "weights_bucket", name)) {
            snprintf(err, cap, "%s (elements from %lld of the tensor)", core_last_error(), (long long)(lo - lt->offset));
            core_error_clear();
            return;
        }
        if (hi == lt->offset + lt->numel) w->seen[e][i] = 1, w->upd_received++; /* the tensor is complete */
    }
    w->upd_next[e] = pos;
    w->upd_bucket_next++;
}

/* A host-path update that leaves out an expert whose host copy is older than its device weights (an update by IPC
 * into the device, rollout/worker_ipc.h, wrote them): 1 with why filled; else 0, and an update that goes on to
 * match makes every host copy current (the experts it sent are replaced by the staged ones). */
static int stale_uncovered(rollout_worker_state *w, char *why, size_t cap) {
    const int kind = w->adapter ? 2 : 1;
    for (int e = 0; e < w->n_experts; e++) {
        float *p;
        const wan_layout *L = rollout_worker_layout(w, e, &p);
        if (!L || !(w->stale[e] & kind)) continue;
        int whole = w->seen[e] != NULL;
        for (int i = 0; whole && i < L->count; i++) whole = w->seen[e][i];
        if (!whole) {
            snprintf(why, cap, "weights_end: %s's weights on this worker's device came by IPC and are newer than its "
                     "host copy, so an update must send them: this one does not", wan_expert_folder(e));
            return 1;
        }
    }
    return 0;
}

/* An update that matched: the worker now serves its version; weights_ack with the hash, and one log line. */
static int ack_update(rollout_worker_state *w, const core_wire_msg *m, const rollout_worker_io *io, uint64_t got,
                      const char *what, const char *hash_name) {
    w->version = w->upd_version;
    const char *how = w->upd_device == 2 ? "by NCCL broadcast, into the device"
                      : w->upd_device  ? "by IPC, device to device"
                      : w->upd_ipc     ? "by IPC"
                      : w->upd_buckets >= 0 ? "in buckets" : "per tensor";
    if (!w->upd_device) /* the host copies are current again (stale_uncovered checked the ones this update left) */
        for (int e = 0; e < 2; e++) w->stale[e] &= w->adapter ? ~2 : ~1;
    update_reset(w);
    char hx[17];
    core_hash_hex(got, hx);
    json_t *f = json_pack("{s:I, s:s}", "policy_version", (json_int_t)w->version, "model_xxh64", hx);
    const int rc = io->send_fields(io->ctx, CORE_WIRE_WEIGHTS_ACK, m->id, f);
    json_decref(f);
    core_log_info("%s: %s of policy version %" PRId64 " applied (%s; %s xxh64 %s)", w->id, what, w->version, how,
                  hash_name, hx);
    return rc;
}

static int weights_end(rollout_worker_state *w, const core_wire_msg *m, const rollout_worker_io *io) {
    char why[700];
    uint64_t want, got = 0;
    const json_t *pv = json_object_get(m->header, "policy_version");
    if (!w->updating) snprintf(why, sizeof why, "weights_end without weights_begin");
    else if (w->upd_error[0]) snprintf(why, sizeof why, "%s", w->upd_error);
    else if (!json_is_integer(pv) || json_integer_value(pv) != w->upd_version)
        snprintf(why, sizeof why, "weights_end: \"policy_version\" differs from weights_begin's %" PRId64, w->upd_version);
    else if (core_hash_parse(json_string_value(json_object_get(m->header, "model_xxh64")), &want))
        snprintf(why, sizeof why, "weights_end: \"model_xxh64\" must be 16 hex digits");
    else if (w->upd_buckets >= 0 && w->upd_bucket_next != w->upd_buckets)
        snprintf(why, sizeof why, "weights_end: %d buckets received, weights_begin announced %d", w->upd_bucket_next,
                 w->upd_buckets);
    else if (w->upd_received != w->upd_announced)
        snprintf(why, sizeof why, "weights_end: %d tensors received, weights_begin announced %d", w->upd_received,
                 w->upd_announced);
    else if (w->upd_device) {
        if (!rollout_worker_ipc_finish(w, want, &got, why, sizeof why))
            return ack_update(w, m, io, got, w->adapter ? "LoRA adapters" : "weights", w->adapter ? "adapter" : "model");
    } else if (stale_uncovered(w, why, sizeof why)) {
        /* refused: why says which expert */
    } else if (w->adapter) {
        /* The staged adapters' hash (an expert not sent keeps its adapter), then a copy into the adapters: their named
         * views (wan_lora.w) stay bound to the adapters' own buffers. */
        const wan_layout *L[2] = {NULL, NULL};
        const float *P[2] = {NULL, NULL};
        int count = 0;
        for (int e = 0; e < w->n_experts; e++) {
            const wan_lora *l = w->model[e]->lora;
            if (l) L[e] = &l->layout, P[e] = w->staged[e] ? w->staged[e] : l->params, count++;
        }
        got = 0;
        const int hrc = count ? wan_tensor_sets_hash(L, P, w->n_experts, &got) : 0;
        if (hrc < 0 || got != want) {
            snprintf(why, sizeof why, "weights_end: the updated LoRA adapters hash to %016" PRIx64 ", the controller's "
                     "is %016" PRIx64 "; the update is refused and version %" PRId64 " kept", got, want, w->version);
        } else {
            for (int e = 0; e < w->n_experts; e++)
                if (w->staged[e])
                    memcpy(w->model[e]->lora->params, w->staged[e], sizeof(float) * (size_t)w->model[e]->lora->layout.numel);
            return ack_update(w, m, io, got, "LoRA adapters", "adapter");
        }
    } else {
        /* The staged model's hash; on a match the staged buffers become the parameters (named views re-bound). */
        const wan_layout *L[2] = {NULL, NULL};
        const float *P[2] = {NULL, NULL};
        for (int e = 0; e < w->n_experts; e++) L[e] = &w->model[e]->layout, P[e] = w->staged[e];
        if (wan_tensor_sets_hash(L, P, w->n_experts, &got) || got != want) {
            snprintf(why, sizeof why, "weights_end: the updated model hashes to %016" PRIx64 ", the controller's is %016" PRIx64
                     "; the update is refused and version %" PRId64 " kept", got, want, w->version);
        } else {
            for (int e = 0; e < w->n_experts; e++) {
                wan_model *mm = w->model[e];
                wan_weights_free(&mm->w);
                if (wan_weights_bind(&mm->w, &mm->layout, w->staged[e])) {
                    snprintf(why, sizeof why, "weights_end: out of memory");
                    return io->send_error(io->ctx, m->id, "internal", why);
                }
                free(mm->params);
                mm->params = w->staged[e];
                w->staged[e] = NULL;
            }
            return ack_update(w, m, io, got, "weights", "model");
        }
    }
    const int refused = w->updating && w->upd_ipc_refused;
    update_reset(w);
    core_log_warn("%s: %s", w->id, why);
    return io->send_error(io->ctx, m->id, refused ? CORE_SYNC_IPC_REFUSED : "weights_mismatch", why);
}

/* ---- dispatch ---- */

static int rollout_request(rollout_worker_state *w, const core_wire_msg *m, const rollout_worker_io *io) {
    core_rollout_request req;
    if (core_rollout_request_parse(m, &req)) return io->send_error(io->ctx, m->id, "bad_request", core_last_error());
    int rc;
    if (req.policy_version != w->version) {
        char why[160];
        snprintf(why, sizeof why, "request for policy version %" PRId64 ", this worker holds %" PRId64,
                 req.policy_version, w->version);
        rc = io->send_error(io->ctx, m->id, "version_mismatch", why);
    } else if (!io->rollout) {
        rc = io->send_error(io->ctx, m->id, "rollout_failed", "this worker cannot run rollouts");
    } else {
        /* one line per chunk in the worker's log: which worker ran what (and, for tests/test_lost_worker.c, proof
         * that this worker holds a chunk from here until its reply) */
        core_log_info("%s: rollout request %s: %d sample(s) of policy version %" PRId64, w->id ? w->id : "worker",
                      m->id, req.n, req.policy_version);
        rc = io->rollout(io->ctx, m, &req);
    }
    core_rollout_request_free(&req);
    return rc;
}

int rollout_worker_handle(rollout_worker_state *s, const core_wire_msg *m, const rollout_worker_io *io) {
    switch (m->type) {
    case CORE_WIRE_ROLLOUT_REQUEST: return rollout_request(s, m, io) ? -1 : 0;
    case CORE_WIRE_WEIGHTS_BEGIN: return weights_begin(s, m, io) ? -1 : 0;
    case CORE_WIRE_WEIGHTS_TENSOR: weights_tensor(s, m); return 0;
    case CORE_WIRE_WEIGHTS_BUCKET: weights_bucket(s, m); return 0;
    case CORE_WIRE_WEIGHTS_END: return weights_end(s, m, io) ? -1 : 0;
    case CORE_WIRE_HELLO: return 0; /* the controller's greeting: nothing to answer */
    case CORE_WIRE_ERROR: {
        /* e.g. the controller refusing a message of ours: logged, never answered (no error ping-pong) */
        const char *code = json_string_value(json_object_get(m->header, "code"));
        const char *why = json_string_value(json_object_get(m->header, "reason"));
        core_log_warn("%s: the controller answered %.128s with an error: %.32s: %.300s", s->id ? s->id : "worker",
                      m->id, code ? code : "?", why ? why : "?");
        /* the run's controller is shutting down (this worker's connection came back after its shutdown was sent):
         * leave as on a shutdown. Only an authenticated controller reaches here (CURVE, trainer/net/controller.c). */
        return code && !strcmp(code, "shutting_down") ? 1 : 0;
    }
    case CORE_WIRE_SHUTDOWN: return io->send_fields(io->ctx, CORE_WIRE_SHUTDOWN, m->id, NULL) ? -1 : 1;
    default: {
        char why[96];
        snprintf(why, sizeof why, "a rollout worker does not serve \"%s\"", core_wire_type_name(m->type));
        return io->send_error(io->ctx, m->id, "unsupported", why) ? -1 : 0;
    }
    }
}
