/* rollout/worker_ipc.c — a rollout worker's weight update by IPC into its device weights (see rollout/worker_ipc.h). */
#include "rollout/worker_ipc.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/log.h"
#include "core/tensor.h"
#include "core/wire_sync.h"
#include "kernels/dev_ops.h"
#include "model/dit/wan_dev_exec.h"

/* Keeps the first problem of the update for weights_end (refused: answered ipc_refused, the handles unusable). -1. */
static int fail(rollout_worker_state *w, int refused, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(rollout_worker_state *w, int refused, const char *fmt, ...) {
    if (!w->upd_error[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->upd_error, sizeof w->upd_error, fmt, ap);
        va_end(ap);
    }
    w->upd_ipc_refused |= refused;
    return -1;
}

/* The reusable buffers grown to n elements: the device landing buffer and the host bucket. 0 or -1. */
static int buffers(rollout_worker_state *w, const k_dev_ops *dev, int64_t n) {
    if (n > w->land_n) {
        if (w->land) dev->mem_free(w->land);
        w->land_n = 0;
        if (!(w->land = dev->mem_alloc(sizeof(float) * (size_t)n))) return -1;
        w->land_n = n;
    }
    if (n > w->hbuf_n) {
        free(w->hbuf);
        w->hbuf_n = 0;
        if (!(w->hbuf = malloc(sizeof(float) * (size_t)n))) return core_error("out of memory");
        w->hbuf_n = n;
    }
    return 0;
}

/* Step 3 for bucket [off, off + n) of expert m (its device copy d), in w->land: rounded into the device weights (the
 * adapter's with adapter), proj_out.bias's overlap copied as fp32. 0 or -1. */
static int store(const rollout_worker_state *w, const k_dev_ops *dev, const wan_model *m, wan_dev_model *d,
                 int adapter, int64_t off, int64_t n) {
    if (dev->mem_round_bf16(adapter ? d->lora_w + off : d->w + off, w->land, n)) return -1;
    if (adapter) return 0;
    const int pout = m->cfg.out_channels * m->cfg.patch_size[0] * m->cfg.patch_size[1] * m->cfg.patch_size[2];
    const int64_t b0 = m->w.proj_out_b - m->params, b1 = b0 + pout;
    const int64_t lo = off > b0 ? off : b0, hi = off + n < b1 ? off + n : b1;
    if (lo >= hi) return 0;
    const size_t bytes = sizeof(float) * (size_t)(hi - lo);
    return dev->mem_copy2d(d->proj_out_b + (lo - b0), bytes, w->land + (lo - off), bytes, bytes, 1);
}

/* Step 2's per-tensor half for the bucket in w->hbuf ([off, off + n) of layout L, expert folder ex): each piece's
 * bytes into the running xxh64 of its tensor (st), a tensor's hash kept in th[i] when its last piece came, each
 * piece checked finite. 0, or -1 with the problem in w->upd_error. */
static int tensors(rollout_worker_state *w, const wan_layout *L, const char *ex, int64_t off, int64_t n,
                   XXH64_state_t *st, uint64_t *th, int *cur) {
    for (int64_t pos = off; pos < off + n;) {
        while (*cur < L->count && pos >= L->tensors[*cur].offset + L->tensors[*cur].numel) (*cur)++;
        if (*cur >= L->count) return fail(w, 0, "weights (IPC): %s has no tensor at element %lld", ex, (long long)pos);
        const wan_tensor *t = &L->tensors[*cur];
        const int64_t end = t->offset + t->numel < off + n ? t->offset + t->numel : off + n;
        const float *piece = w->hbuf + (pos - off);
        if (pos == t->offset) XXH64_reset(st, 0);
        XXH64_update(st, piece, sizeof(float) * (size_t)(end - pos));
        char name[200];
        snprintf(name, sizeof name, "%s/%s", ex, t->name);
        if (core_f32_check_finite(piece, (size_t)(end - pos), "weights (IPC)", name)) {
            fail(w, 0, "%s (elements from %lld of the tensor)", core_last_error(), (long long)(pos - t->offset));
            core_error_clear();
            return -1;
        }
        if (end == t->offset + t->numel) th[*cur] = XXH64_digest(st);
        pos = end;
    }
    return 0;
}

/* The tensor of L holding element pos (tensors lie back to back in layout order), or -1. */
static int tensor_at(const wan_layout *L, int64_t pos) {
    for (int i = 0; i < L->count; i++)
        if (pos >= L->tensors[i].offset && pos < L->tensors[i].offset + L->tensors[i].numel) return i;
    return -1;
}

/* One exported expert (x) and its buckets b[0..nb): steps 1-3. 0, or -1 with the problem in w->upd_error. */
static int expert(rollout_worker_state *w, const k_dev_ops *dev, const core_sync_ipc *x, const core_sync_bucket *b,
                  int nb, XXH64_state_t *st) {
    const int e = x->expert;
    wan_model *m = w->model[e];
    float *hp;
    const wan_layout *L = rollout_worker_layout(w, e, &hp);
    const char *ex = wan_expert_folder(e);
    if (!L || L->numel != x->elements)
        return fail(w, 1, "weights_begin: \"ipc\" %s of %lld elements, this worker's %s has %lld", ex,
                    (long long)x->elements, w->adapter ? "adapter" : "model", L ? (long long)L->numel : 0LL);
    wan_dev_model *d = wan_dev_exec_model(w->dx, m);
    if (d && w->adapter && d->lora != m->lora && wan_dev_model_upload_lora(d)) d = NULL;
    if (!d || (w->adapter && !d->lora_w)) {
        fail(w, 1, "weights_begin: the device copy of %s: %s", ex, core_last_error());
        core_error_clear();
        return -1;
    }
    if (!(w->thash[e] = calloc((size_t)L->count, sizeof(uint64_t)))) return fail(w, 0, "out of memory");
    const size_t bytes = sizeof(float) * (size_t)L->numel;
    const void *p = NULL;
    if (dev->ipc_open(x->handle, bytes, &p)) {
        fail(w, 1, "weights_begin: the IPC handle of %s: %s", ex, core_last_error());
        core_error_clear();
        return -1;
    }
    int64_t next = 0;
    int cur = 0, rc = 0;
    for (int k = 0; k < nb && !rc; k++) {
        if (b[k].expert != e) continue;
        const int64_t off = b[k].offset, n = b[k].count;
        if (off != next || off + n > L->numel) {
            rc = fail(w, 0, "weights_begin: \"ipc_buckets\"[%d] covers %s elements [%lld, %lld), %lld was due (of %lld)", k,
                      ex, (long long)off, (long long)(off + n), (long long)next, (long long)L->numel);
            break;
        }
        const size_t nbytes = sizeof(float) * (size_t)n;
        /* 1: device to device into the landing buffer; 2: the worker's hash of what landed */
        w->upd_written[e] = 1;
        if (buffers(w, dev, n) || dev->mem_copy2d(w->land, nbytes, (const float *)p + off, nbytes, nbytes, 1) ||
            dev->mem_download(w->hbuf, w->land, nbytes)) {
            rc = fail(w, 1, "weights_begin: bucket %d of %s by IPC: %s", b[k].index, ex, core_last_error());
            core_error_clear();
            break;
        }
        const uint64_t got = core_xxh64(w->hbuf, nbytes, 0);
        if (got != b[k].xxh64) {
            const int t0 = tensor_at(L, off), t1 = tensor_at(L, off + n - 1);
            rc = fail(w, 0, "weights (IPC) bucket %d (%s elements [%lld, %lld): %s .. %s): xxh64 of the bytes received is "
                      "%016" PRIx64 ", the controller's is %016" PRIx64, b[k].index, ex, (long long)off,
                      (long long)(off + n), t0 >= 0 ? L->tensors[t0].name : "?", t1 >= 0 ? L->tensors[t1].name : "?",
                      got, b[k].xxh64);
            break;
        }
        rc = tensors(w, L, ex, off, n, st, w->thash[e], &cur);
        /* 3: into the device weights */
        if (!rc && store(w, dev, m, d, w->adapter, off, n)) {
            rc = fail(w, 0, "weights (IPC): bucket %d into the device weights of %s: %s", b[k].index, ex,
                      core_last_error());
            core_error_clear();
        }
        next = off + n;
    }
    if (!rc && next != L->numel)
        rc = fail(w, 0, "weights_begin: \"ipc_buckets\" cover %lld of the %lld elements of %s", (long long)next,
                  (long long)L->numel, ex);
    if (dev->ipc_close(p)) core_log_warn("%s: %s", w->id ? w->id : "worker", core_last_error()), core_error_clear();
    if (rc) return -1;
    memset(w->seen[e], 1, (size_t)L->count);
    w->upd_received += L->count;
    return 0;
}

void rollout_worker_ipc_device(rollout_worker_state *w, const json_t *ipc, const json_t *buckets) {
    core_sync_ipc x[2];
    core_sync_bucket *b = NULL;
    int n = 0, nb = 0;
    w->upd_ipc = 1, w->upd_device = 1, w->upd_buckets = 0;
    const k_dev_ops *dev = wan_dev_exec_ops(w->dx);
    if (!dev->ipc_open || !dev->ipc_close || !dev->mem_copy2d || !dev->mem_round_bf16) {
        fail(w, 1, "weights_begin: IPC offered, but this worker's device (%s) cannot copy from IPC handles", dev->name);
        return;
    }
    if (core_sync_ipc_parse(ipc, w->n_experts, x, 2, &n) || core_sync_buckets_parse(buckets, w->n_experts, &b, &nb)) {
        fail(w, 1, "%s", core_last_error());
        core_error_clear();
        return;
    }
    for (int k = 0; k < nb; k++) {
        int sent = 0;
        for (int j = 0; j < n; j++) sent |= x[j].expert == b[k].expert;
        if (!sent) {
            fail(w, 0, "weights_begin: \"ipc_buckets\"[%d] is of %s, which \"ipc\" does not export", k,
                 wan_expert_folder(b[k].expert));
            free(b);
            return;
        }
    }
    XXH64_state_t *st = XXH64_createState();
    if (!st) fail(w, 0, "out of memory");
    for (int k = 0; st && k < n && !w->upd_error[0]; k++) expert(w, dev, &x[k], b, nb, st);
    XXH64_freeState(st);
    free(b);
}

int rollout_worker_ipc_finish(rollout_worker_state *w, uint64_t want, uint64_t *got, char *why, size_t cap) {
    const int kind = w->adapter ? 2 : 1;
    const wan_layout *L[2] = {NULL, NULL};
    const float *P[2] = {NULL, NULL};
    const uint64_t *H[2] = {NULL, NULL};
    for (int e = 0; e < w->n_experts; e++) {
        float *p;
        L[e] = rollout_worker_layout(w, e, &p);
        P[e] = p, H[e] = w->thash[e];
        if (L[e] && !H[e] && (w->stale[e] & kind)) { /* its host copy is not what the device holds */
            snprintf(why, cap, "weights_end: %s's weights on this worker's device came by IPC and are newer than its "
                     "host copy, so an update must send them: this one does not", wan_expert_folder(e));
            return -1;
        }
    }
    *got = 0;
    if (wan_tensor_sets_hash_given(L, P, H, w->n_experts, got) || *got != want) {
        snprintf(why, cap, "weights_end: the %s received by IPC into the device hash to %016" PRIx64 ", the "
                 "controller's is %016" PRIx64 "; the update is refused", w->adapter ? "LoRA adapters" : "weights",
                 *got, want);
        return -1;
    }
    for (int e = 0; e < w->n_experts; e++) {
        if (!w->thash[e]) continue;
        if (wan_dev_exec_set_version(w->dx, w->model[e], w->upd_version)) {
            snprintf(why, cap, "weights_end: %s", core_last_error());
            core_error_clear();
            return -1;
        }
        w->stale[e] |= kind, w->upd_written[e] = 0;
    }
    return 0;
}

void rollout_worker_ipc_abandon(rollout_worker_state *w) {
    for (int e = 0; e < 2; e++) {
        if (!w->upd_written[e]) continue;
        /* the next rollout uploads the host copy; when that copy is stale, no version is left to serve */
        wan_dev_exec_forget(w->dx, w->model[e]);
        if (w->stale[e]) {
            w->stale[e] = 0, w->version = -1;
            core_log_warn("%s: a refused update by IPC overwrote %s's device weights, whose host copy was older: "
                          "this worker serves no policy version until the next update", w->id ? w->id : "worker",
                          wan_expert_folder(e));
        }
        w->upd_written[e] = 0;
    }
}

void rollout_worker_ipc_free(rollout_worker_state *w) {
    if (w->land && w->dx) wan_dev_exec_ops(w->dx)->mem_free(w->land);
    free(w->hbuf);
    w->land = NULL, w->hbuf = NULL, w->land_n = w->hbuf_n = 0;
}
