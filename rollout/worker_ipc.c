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
#include "kernels/cuda/k_cuda.h"
#include "model/dit/wan_dev_exec.h"
#include "model/dit/wan_lora.h"
#include "sp/comm_nccl.h"

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
        if (!(w->land = dev->mem_alloc(sizeof(float) * (size_t)n)))
            return core_error("%.1f MiB of device memory for the weight sync's landing buffer", n * 4.0 / 1048576.0);
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

/* One expert an update brings into the device weights. */
typedef struct {
    int e;
    const wan_layout *L;
    wan_dev_model *d;
    int64_t next; /* the element its next bucket starts at */
    int cur;      /* the tensor its running hash is in */
} dev_expert;

/* Expert e of `elements` F32 elements: its layout, its device copy (made on first use), its tensor hashes. 0, or -1
 * with the problem in w->upd_error (refused: the update's shape or the device copy). */
static int begin_expert(rollout_worker_state *w, int e, int64_t elements, const char *field, dev_expert *x) {
    wan_model *m = w->model[e];
    float *hp;
    const char *ex = wan_expert_folder(e);
    *x = (dev_expert){.e = e, .L = rollout_worker_layout(w, e, &hp)};
    if (!x->L || (elements >= 0 && x->L->numel != elements))
        return fail(w, 1, "weights_begin: \"%s\" %s of %lld elements, this worker's %s has %lld", field, ex,
                    (long long)elements, w->adapter ? "adapter" : "model", x->L ? (long long)x->L->numel : 0LL);
    x->d = wan_dev_exec_model(w->dx, m);
    if (x->d && w->adapter && x->d->lora != m->lora && wan_dev_model_upload_lora(x->d)) x->d = NULL;
    if (!x->d || (w->adapter && !x->d->lora_w)) {
        fail(w, 1, "weights_begin: the device copy of %s: %s", ex, core_last_error());
        core_error_clear();
        return -1;
    }
    if (!w->thash[e] && !(w->thash[e] = calloc((size_t)x->L->count, sizeof(uint64_t))))
        return fail(w, 0, "out of memory");
    return 0;
}

/* Steps 2 and 3 for bucket b of expert x, whose bytes are in w->land (how: "IPC", "NCCL broadcast"). 0, or -1 with
 * the problem in w->upd_error, naming the bucket. */
static int take_bucket(rollout_worker_state *w, const k_dev_ops *dev, dev_expert *x, const core_sync_bucket *b,
                       XXH64_state_t *st, const char *how) {
    const wan_layout *L = x->L;
    const char *ex = wan_expert_folder(x->e);
    const int64_t off = b->offset, n = b->count;
    const size_t nbytes = sizeof(float) * (size_t)n;
    if (off != x->next || off + n > L->numel)
        return fail(w, 0, "weights_begin: bucket %d covers %s elements [%lld, %lld), %lld was due (of %lld)", b->index,
                    ex, (long long)off, (long long)(off + n), (long long)x->next, (long long)L->numel);
    if (dev->mem_download(w->hbuf, w->land, nbytes)) { /* 2: the worker's hash of what landed */
        fail(w, 0, "weights_begin: bucket %d of %s by %s: %s", b->index, ex, how, core_last_error());
        core_error_clear();
        return -1;
    }
    const uint64_t got = core_xxh64(w->hbuf, nbytes, 0);
    if (got != b->xxh64) {
        const int t0 = tensor_at(L, off), t1 = tensor_at(L, off + n - 1);
        return fail(w, 0, "weights (%s) bucket %d (%s elements [%lld, %lld): %s .. %s): xxh64 of the bytes received is "
                    "%016" PRIx64 ", the controller's is %016" PRIx64, how, b->index, ex, (long long)off,
                    (long long)(off + n), t0 >= 0 ? L->tensors[t0].name : "?", t1 >= 0 ? L->tensors[t1].name : "?", got,
                    b->xxh64);
    }
    if (tensors(w, L, ex, off, n, st, w->thash[x->e], &x->cur)) return -1;
    if (store(w, dev, w->model[x->e], x->d, w->adapter, off, n)) { /* 3: into the device weights */
        fail(w, 0, "weights (%s): bucket %d into the device weights of %s: %s", how, b->index, ex, core_last_error());
        core_error_clear();
        return -1;
    }
    x->next = off + n;
    return 0;
}

/* The expert complete: its tensors count as received. 0, or -1 (its buckets stopped short). */
static int end_expert(rollout_worker_state *w, const dev_expert *x) {
    if (x->next != x->L->numel)
        return fail(w, 0, "weights_begin: the buckets cover %lld of the %lld elements of %s", (long long)x->next,
                    (long long)x->L->numel, wan_expert_folder(x->e));
    memset(w->seen[x->e], 1, (size_t)x->L->count);
    w->upd_received += x->L->count;
    return 0;
}

/* One exported expert (x) and its buckets b[0..nb): steps 1-3, the copy device to device out of the mapped handle.
 * 0, or -1 with the problem in w->upd_error. */
static int expert(rollout_worker_state *w, const k_dev_ops *dev, const core_sync_ipc *x, const core_sync_bucket *b,
                  int nb, XXH64_state_t *st) {
    dev_expert de;
    if (begin_expert(w, x->expert, x->elements, "ipc", &de)) return -1;
    const char *ex = wan_expert_folder(x->expert);
    const void *p = NULL;
    if (dev->ipc_open(x->handle, sizeof(float) * (size_t)de.L->numel, &p)) {
        fail(w, 1, "weights_begin: the IPC handle of %s: %s", ex, core_last_error());
        core_error_clear();
        return -1;
    }
    int rc = 0;
    for (int k = 0; k < nb && !rc; k++) {
        if (b[k].expert != x->expert) continue;
        const size_t nbytes = sizeof(float) * (size_t)b[k].count;
        w->upd_written[x->expert] = 1;
        /* 1: device to device into the landing buffer */
        if (b[k].offset + b[k].count > de.L->numel || buffers(w, dev, b[k].count) ||
            dev->mem_copy2d(w->land, nbytes, (const float *)p + b[k].offset, nbytes, nbytes, 1)) {
            rc = fail(w, 1, "weights_begin: bucket %d of %s by IPC: %s", b[k].index, ex,
                      core_last_error()[0] ? core_last_error() : "past the expert's elements");
            core_error_clear();
            break;
        }
        rc = take_bucket(w, dev, &de, &b[k], st, "IPC");
    }
    if (dev->ipc_close(p)) core_log_warn("%s: %s", w->id ? w->id : "worker", core_last_error()), core_error_clear();
    return rc ? -1 : end_expert(w, &de);
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

int rollout_worker_land_reserve(rollout_worker_state *w, int64_t n) {
    if (!w->dx) return core_error("the weight sync's landing buffer: this worker has no device");
    return n > 0 ? buffers(w, wan_dev_exec_ops(w->dx), n) : 0;
}

void rollout_worker_nccl_device(rollout_worker_state *w, const json_t *buckets) {
    core_sync_bucket *b = NULL;
    int nb = 0;
    w->upd_ipc = 0, w->upd_device = 2, w->upd_buckets = 0;
    const k_dev_ops *dev = wan_dev_exec_ops(w->dx);
    if (core_sync_buckets_parse(buckets, w->n_experts, &b, &nb)) {
        fail(w, 0, "%s", core_last_error());
        core_error_clear();
        return;
    }
    /* the group: made at the first broadcast, together with the controller and every worker (collective) */
    if (!w->sync_nccl) {
        const sp_nccl_opts o = {.stream = k_cuda_stream(), .dev = dev, .reduce = SP_REDUCE_EXACT};
        if (sp_comm_nccl_world(w->sync_host, &o, &w->sync_nccl)) {
            fail(w, 0, "weights_begin: the NCCL group of the weight sync: %s", core_last_error());
            core_error_clear();
            free(b);
            return;
        }
    }
    dev_expert de[2];
    int have[2] = {0, 0}; /* 1: begun, 2: refused */
    XXH64_state_t *st = XXH64_createState();
    if (!st) fail(w, 0, "out of memory");
    for (int k = 0; k < nb; k++) {
        const int e = b[k].expert;
        if (!have[e]) have[e] = begin_expert(w, e, -1, "nccl_buckets", &de[e]) ? 2 : 1;
        /* every bucket is received whatever happened before: the broadcast is collective over the group */
        if (buffers(w, dev, b[k].count) || sp_comm_broadcast(w->sync_nccl, w->land, (size_t)b[k].count, SP_F32, 0)) {
            fail(w, 0, "weights_begin: bucket %d by NCCL broadcast: %s", b[k].index, core_last_error());
            core_error_clear();
            continue;
        }
        if (w->upd_error[0] || have[e] != 1 || !st) continue;
        w->upd_written[e] = 1;
        take_bucket(w, dev, &de[e], &b[k], st, "NCCL broadcast");
    }
    for (int e = 0; e < 2 && !w->upd_error[0]; e++)
        if (have[e] == 1) end_expert(w, &de[e]);
    XXH64_freeState(st);
    free(b);
}

int rollout_worker_ipc_finish(rollout_worker_state *w, uint64_t want, uint64_t *got, char *why, size_t cap) {
    const int kind = w->adapter ? 2 : 1;
    const wan_layout *L[2] = {NULL, NULL};
    const float *P[2] = {NULL, NULL};
    const uint64_t *H[2] = {NULL, NULL};
    for (int e = 0; e < w->n_experts; e++) {
        float *p = NULL;
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
    if (w->sync_nccl) sp_comm_destroy(w->sync_nccl), w->sync_nccl = NULL;
    if (w->land && w->dx) wan_dev_exec_ops(w->dx)->mem_free(w->land);
    free(w->hbuf);
    w->land = NULL, w->hbuf = NULL, w->land_n = w->hbuf_n = 0;
}
