/* trainer/net/sync_bucket.h — the buckets of a weight sync (reward/PROTOCOL.md section 8: weights_bucket): what the
 * controller (trainer/net/controller.c) sends a rollout worker instead of one message per tensor.
 *
 * A sync sends, for each expert with send[e] in expert order, its flat F32 buffer (the model's params, or its LoRA
 * adapter's: wan_layout order, the tensors back to back) cut into buckets of at most bucket_bytes. A bucket never
 * spans two experts; it may hold part of a tensor (a bucket smaller than the tensor), several tensors, or the whole
 * expert (a bucket larger than everything). On the wire a bucket is one weights_bucket message: {"expert", "index"
 * (0, 1, ... over the whole sync), "offset" (elements into the expert's flat buffer), "xxh64"} followed by its
 * pieces, one F32 [n] frame per tensor it touches, named after that tensor (so no frame is larger than the largest
 * tensor: the worker's frame bound, rollout/worker.c, holds whatever the bucket size).
 *
 * Where the hashes are computed: the bucket's xxh64 (seed 0) is computed by the controller over the bucket's bytes
 * exactly as they leave it (the host buffer the frames point into), and by the worker over the same bytes after
 * they landed in its staged copy; the whole-model hash (weights_end) is the trainer's over its host weights and the
 * worker's over its complete staged model (rollout/worker_msg.c), as before buckets. A sync by IPC (core/wire_sync.h)
 * carries the same buckets' hashes in weights_begin ("ipc_buckets", sync_bucket_hashes_json: the controller's over its
 * host copy); a worker with device weights checks each against the bucket it copied device to device, downloaded
 * into one host buffer of a bucket (rollout/worker_ipc.h). */
#ifndef TRAINER_SYNC_BUCKET_H
#define TRAINER_SYNC_BUCKET_H

#include <stdint.h>

#include "core/wire.h"
#include "model/dit/wan_dit.h"

/* The bucket size a recipe may choose (parallel.sync_bucket_mib), in MiB: default and bounds. */
#define SYNC_BUCKET_MIB_DEFAULT 256
#define SYNC_BUCKET_MIB_MAX 4096

/* One bucket: elements [offset, offset + count) of expert `expert`'s flat buffer. */
typedef struct {
    int index, expert;
    int64_t offset, count;
} sync_bucket;

/* Buckets of at most bucket_bytes (rounded down to whole F32 elements, at least one) over the experts with
 * send[e] (layouts[e] their tensor tables): the number of buckets, or -1 with core_error on bucket_bytes < 4. When
 * out is non-NULL it receives the buckets (cap >= the count: call once with out NULL to size it). */
int sync_bucket_plan(const wan_layout *const *layouts, const uint8_t *send, int n_experts, int64_t bucket_bytes,
                     sync_bucket *out, int cap);

/* Builds bucket b's weights_bucket message with request id `id` from params (expert b->expert's flat buffer, laid
 * out by L). The frames borrow params (no copy). The header's xxh64 is over params[offset, offset + count).
 * 0, or -1 with core_error. Free with core_wire_built_free. */
int sync_bucket_build(const char *id, const sync_bucket *b, const wan_layout *L, const float *params,
                      core_wire_built *out);

/* The "ipc_buckets" of an IPC sync (core/wire_sync.h): sync_bucket_plan's buckets over the experts with send[e]
 * (layouts[e], params[e]: the host copy the controller holds of each exported buffer), each with the xxh64 of its
 * bytes at params. A new reference, or NULL with core_error. */
json_t *sync_bucket_hashes_json(const wan_layout *const *layouts, const float *const *params, const uint8_t *send,
                                int n_experts, int64_t bucket_bytes);

#endif
