/* rollout/worker_msg.h — what a rollout worker (rollout/worker.h) does with one parsed message from the controller,
 * without sockets: rollout_request checks (then the caller's rollout), the staged weight update (weights_begin /
 * weights_tensor or weights_bucket / weights_end, each tensor's or bucket's xxh64, its values finite and the
 * whole-model hash checked), shutdown,
 * and the answers to anything else. rollout/worker.c calls it for every message; tests/fuzz/fuzz_worker_msg.c calls
 * it with arbitrary messages and a tiny model. Replies go out through the caller's functions (rollout_worker_io).
 *
 * The worker's DEALER has one peer, the controller; with the run's keys (core/curve.h) it is a CURVE client that
 * checks the controller's public key, so only the run's controller can push weights or shut the worker down: a
 * fake controller never completes the handshake and none of its messages arrive here.
 *
 * LoRA (model/dit/wan_lora.h): a worker whose experts carry adapters (model[e]->lora, attached by its pipeline)
 * takes updates of the adapters alone: weights_begin with "adapter": true, tensors named
 * "transformer/blocks.0.attn1.to_q.lora_A.weight" of the adapter's shapes, and a weights_end hash over every expert's
 * adapter (wan_models_adapters_hash); the base weights are never written. Such an update to a worker without
 * adapters is refused at weights_end (`weights_mismatch`, naming model.lora.rank).
 *
 * Answers: rollout_request for another policy version: error `version_mismatch`; a request that does not parse:
 * `bad_request`; weights_begin without a valid policy_version / tensors_count (or a buckets_count < 1): `bad_request`;
 * weights_tensor, weights_bucket (trainer/net/sync_bucket.h: in index order, each expert's contiguous): no
 * answer (a problem is kept and reported at weights_end); weights_end: weights_ack, or `weights_mismatch` naming
 * the first problem, e.g. "weights_tensor: tensor \"transformer/...\" holds a non-finite value (nan at element i of
 * n): refused" (the old weights and version are kept); hello: none (the controller's greeting); error: none,
 * it is logged (an error is never answered with an error); shutdown: shutdown, then the worker stops; any other type:
 * `unsupported`. */
#ifndef ROLLOUT_WORKER_MSG_H
#define ROLLOUT_WORKER_MSG_H

#include <stdint.h>

#include "core/wire.h"
#include "core/wire_rollout.h"
#include "model/dit/wan_dit.h"

struct k_dev_ops;
struct wan_dev_exec;
struct sp_comm;

typedef struct {
    wan_model *model[2];     /* the experts (model[1] only with two); their params are replaced by an update */
    const struct k_dev_ops *dev; /* a device table with ipc_open (kernels/dev_ops.h), or NULL: no IPC syncs */
    int n_experts;
    const char *id;          /* the worker's client id, for logs */
    int64_t version;         /* policy version of the weights held */
    /* a weights update in progress */
    int updating;
    int adapter;             /* the update is of the LoRA adapters (weights_begin "adapter": true) */
    int64_t upd_version;
    int upd_announced, upd_received;
    float *staged[2];        /* copies of the experts' params (or of their adapters' params) */
    uint8_t *seen[2];        /* per tensor: received (whole) */
    int upd_buckets;         /* weights_begin's buckets_count (-1: weights_tensor messages instead) */
    int upd_bucket_next;     /* the index the next weights_bucket must carry */
    int upd_ipc;             /* the update came by IPC (weights_begin "ipc", core/wire_sync.h) */
    int upd_ipc_refused;     /* ... and a handle could not be opened or read: weights_end answers ipc_refused */
    int64_t upd_next[2];     /* per expert: the element the next bucket of it must start at */
    char upd_error[512];
    /* IPC into the device weights (rollout/worker_ipc.h), when the model runs on a device */
    struct wan_dev_exec *dx; /* the worker's executor (its device weights), or NULL: IPC into the staged host copy */
    int upd_device;          /* the update in progress goes to the device: 1 by IPC ("ipc_buckets"), 2 by NCCL
                              * broadcast ("nccl_buckets") */
    struct sp_comm *sync_host;  /* the MPI group of the controller (rank 0) and the workers for NCCL syncs, or NULL */
    struct sp_comm *sync_nccl;  /* its NCCL group, made at the first NCCL sync */
    int upd_written[2];      /* ... and has written expert e's device weights */
    uint64_t *thash[2];      /* ... each tensor's xxh64 of expert e as received [layout count] */
    int stale[2];            /* expert e's host copy is older than its device weights: 1 its params, 2 its adapter */
    float *land;             /* device fp32 landing buffer of one bucket (land_n elements) */
    int64_t land_n;
    float *hbuf;             /* host copy of one bucket (hbuf_n elements) */
    int64_t hbuf_n;
} rollout_worker_state;

typedef struct {
    void *ctx;
    /* Sends an `error` {code, reason} with request id `id`. -1 on a socket failure. */
    int (*send_error)(void *ctx, const char *id, const char *code, const char *reason);
    /* Sends a header-only message of `type` with fields (may be NULL). -1 on a socket failure. */
    int (*send_fields)(void *ctx, core_wire_type type, const char *id, const json_t *fields);
    /* Runs a parsed rollout request of the worker's policy version and sends its reply (trajectory, or an error
     * `rollout_failed`). -1 on a socket failure. NULL: answered with an error `rollout_failed`. */
    int (*rollout)(void *ctx, const core_wire_msg *m, const core_rollout_request *req);
} rollout_worker_io;

/* Handles message m. Returns 0 (keep serving), 1 (`shutdown` was answered: stop), or -1 when io failed to send. */
int rollout_worker_handle(rollout_worker_state *s, const core_wire_msg *m, const rollout_worker_io *io);

/* Frees a weights update in progress (the state's models are the caller's). */
void rollout_worker_state_free(rollout_worker_state *s);

#endif
