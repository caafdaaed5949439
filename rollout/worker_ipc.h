/* rollout/worker_ipc.h — a rollout worker's weight update by IPC into its DEVICE weights (core/wire_sync.h): what
 * rollout/worker_msg.c does with weights_begin "ipc" + "ipc_buckets" when the worker's model runs on a device
 * (rollout_worker_state.dx, model.device cuda), instead of copying the trainer's buffer into a host staging copy.
 *
 * The path, per exported expert and per bucket of "ipc_buckets" (in index order):
 *   1. a device-to-device copy (mem_copy2d) of the bucket's fp32 bytes out of the trainer's exported buffer into the
 *      worker's device landing buffer of one bucket (reused: one bucket of device memory, not a model);
 *   2. the worker's hash: the landing buffer downloaded into one reused host buffer of a bucket, its xxh64 compared
 *      with the controller's (computed over the trainer's host copy); a mismatch refuses the update naming the bucket,
 *      its element range and tensors; each tensor's xxh64 is accumulated over its pieces (the whole-model hash's
 *      terms) and its values checked finite;
 *   3. the landing buffer rounded to bf16 (mem_round_bf16) into the worker's device weights at the bucket's offset
 *      (proj_out.bias also copied as fp32): the bits an upload of the same values gives.
 * At weights_end the whole-model xxh64 (wan_tensor_sets_hash_given: the tensors' hashes from step 2, the host copy's
 * for experts not sent) must equal the controller's; then the device copies are at the new policy version
 * (wan_dev_exec_set_version) with no host staging and no upload. The worker's host fp32 copy of a sent expert is then
 * OLDER than its device weights ("stale"): a later update must send that expert whole (it always does: a sync sends
 * the experts that train, and only those change), else it is refused naming the expert. A refused device update
 * leaves the device weights partly written: their copies are dropped (the next rollout uploads the host copy), and
 * a worker whose host copy was stale holds no usable version until the next sync (its version becomes -1). */
#ifndef ROLLOUT_WORKER_IPC_H
#define ROLLOUT_WORKER_IPC_H

#include <jansson.h>

#include "model/dit/wan_lora.h"
#include "rollout/worker_msg.h"

/* The flat buffer (*params) and layout an update writes for expert e: its LoRA adapter's (an adapter update; NULL
 * when the expert has none) or its own. (Inline here, for rollout/worker_msg.c and worker_ipc.c alike: the message
 * handler calls the device path, not the other way round, and links without it where there is no device: the fuzz
 * build's tests/fuzz/worker_ipc_none.c.) */
static inline const wan_layout *rollout_worker_layout(const rollout_worker_state *w, int e, float **params) {
    wan_model *m = w->model[e];
    if (w->adapter) {
        if (!m->lora) return NULL;
        *params = m->lora->params;
        return &m->lora->layout;
    }
    *params = m->params;
    return &m->layout;
}

/* Step 1-3 for weights_begin's "ipc" handles and "ipc_buckets" (w is updating, w->adapter set). Problems are kept in
 * w->upd_error (with upd_ipc_refused for a handle that cannot be used: weights_end answers ipc_refused and the
 * controller sends buckets). */
void rollout_worker_ipc_device(rollout_worker_state *w, const json_t *ipc, const json_t *buckets);

/* The same for weights_begin's "nccl_buckets" (an NCCL sync, trainer/net/controller.h): each bucket received by
 * ncclBroadcast from the controller (root 0 of w->sync_host's group, whose NCCL group is made at the first such
 * sync) into the landing buffer instead of step 1, then steps 2 and 3. Every bucket is received even after a
 * problem (the broadcast is collective). The landing buffer of one bucket is reserved before the worker's hello
 * (rollout_worker_land_reserve): a worker that cannot reserve it says so there and gets no NCCL sync (one that could
 * not receive a broadcast would leave the group waiting: NCCL has no time-out here). */
void rollout_worker_nccl_device(rollout_worker_state *w, const json_t *buckets);

/* The device landing buffer and the host bucket buffer of n fp32 elements, allocated now (grown if smaller) and held
 * for the updates: a worker that takes NCCL syncs reserves one bucket of parallel.sync_bucket_mib (capped at what a
 * sync sends: the model's or its adapter's elements) before its hello. 0, or -1 with core_error naming the MiB. */
int rollout_worker_land_reserve(rollout_worker_state *w, int64_t n);

/* weights_end of a device update: the whole-model hash into *got; 0 and the device copies brought to w->upd_version
 * when it equals want; else -1 with why (cap bytes) filled. */
int rollout_worker_ipc_finish(rollout_worker_state *w, uint64_t want, uint64_t *got, char *why, size_t cap);

/* A device update that was not applied (refused, or a new weights_begin before its weights_end): drops the device
 * copies it wrote into (see above). */
void rollout_worker_ipc_abandon(rollout_worker_state *w);

/* Frees the device path's buffers (the landing buffer, the host bucket buffer). */
void rollout_worker_ipc_free(rollout_worker_state *w);

#endif
