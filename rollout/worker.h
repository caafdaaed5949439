/* rollout/worker.h — the rollout worker process (`vgrpo rollout-worker`; docs/design.md section 3): a DEALER peer of the
 * controller's ROUTER. It says `hello` {client, policy_version, model_xxh64, experts}, then serves, one message at a time:
 *   rollout_request -> generates the samples (rollout/engine.h) with the request's stream and eta, decodes them,
 *                      scores them on the reward server (reward/client.h: time-outs, re-sends with the same id),
 *                      and replies `trajectory` (core/wire_rollout.h) with rewards, per-sample video xxh64 and, as
 *                      asked, trajectories and videos. A request for another policy version than the worker holds
 *                      gets an error (code `version_mismatch`).
 *   weights_begin / weights_bucket... (or weights_tensor..., or by IPC: core/wire_sync.h) / weights_end -> each
 *                      bucket's (tensor's) xxh64 is checked on arrival against its header, the update is staged in a
 *                      copy, and at weights_end the whole-model hash of the staged
 *                      model (every expert) must equal the controller's: then it replaces the weights, the policy
 *                      version becomes weights_end's, and the worker answers weights_ack {policy_version,
 *                      model_xxh64}. Any mismatch answers an error naming the tensor (or the two hashes) and keeps
 *                      the old weights and version.
 *   shutdown        -> replies shutdown and returns 0.
 * Other types get an `unsupported` error; an `error` from the controller is logged, not answered. A failure inside a
 * request (reward server unreachable after its attempts, a prompt that cannot be encoded) is answered with an error
 * reply (code `rollout_failed`, the reason), and the worker keeps serving. A request cut short by *stop (SIGTERM:
 * the engine stops within a denoising step) gets no reply: the worker leaves, and the controller, seeing its
 * connection close, re-issues the chunk to another worker. The rules for each message are
 * rollout/worker_msg.h (no sockets there: the fuzz target calls it).
 *
 * Authentication: with cfg.keys (core/curve.h: the client pair and the controller's public key) the DEALER is a
 * CURVE client that checks the controller's key, so only the run's controller can reach the worker: nothing from a
 * fake controller (another key, or none) is ever delivered. Without keys (a worker run by hand) it is plain
 * ZeroMQ, and says so in its log. */
#ifndef ROLLOUT_WORKER_H
#define ROLLOUT_WORKER_H

#include <signal.h>

#include "core/curve.h"
#include "rollout/pipeline.h"

typedef struct {
    const char *controller;       /* endpoint the controller binds (ipc:// or tcp://) */
    const char *reward;           /* reward server endpoint */
    const char *id;               /* client id, e.g. "worker-0" (also the reward client's id) */
    double reward_timeout_s;      /* per attempt */
    int reward_max_attempts;
    double fps;                   /* frame rate sent with the videos */
    double idle_exit_s;           /* exit 1 after this long without any message from the controller (0: never) */
    const core_curve_keys *keys;  /* the worker's keys (core_curve_subset CORE_CURVE_CLIENT), NULL: plain ZeroMQ */
    struct sp_comm *sync_group;   /* an MPI launch: the group of the controller (rank 0) and the workers, over which
                                   * a worker with device weights takes NCCL syncs (rollout/worker_ipc.h); NULL: none */
    double sync_bucket_mib;       /* parallel.sync_bucket_mib: with sync_group, the landing buffer of one bucket is
                                   * reserved before the hello (rollout_worker_land_reserve); a worker that cannot
                                   * reserve it takes no NCCL syncs (it says so in its hello and its log) */
} rollout_worker_config;

/* Serves until `shutdown` (returns 0), *stop set by a signal (returns 0), or a socket failure / idle time-out
 * (returns -1 with core_error). */
int rollout_worker_run(rollout_pipeline *p, const rollout_worker_config *cfg, volatile sig_atomic_t *stop);

#endif
