/* trainer/net/controller.h — the controller's side of the controller <-> rollout worker channel (docs/design.md section 3,
 * reward/PROTOCOL.md section 8): a ROUTER that the workers (rollout/worker.h) connect to, the registry of workers
 * from their `hello`, rollouts spread over the workers in chunks, weight syncs in buckets with per-bucket and whole-model
 * xxh64 checked on both sides, and shutdown. Used by `vgrpo eval`, `vgrpo trainer` (rank 0) and `vgrpo parity`.
 *
 * Every wait polls `abort_check` (when set) every 100 ms: a non-zero return stops the wait with an error (the
 * supervisor's "a child exited" or a signal), so a dead worker never hangs the controller.
 *
 * Lost workers: a monitor on the ROUTER sees a worker's connection close (its process died; on tcp:// also ZMTP
 * heartbeats timing out), matched to the worker by the descriptor its hello came on (ZMQ_SRCFD); a send that fails
 * (ZMQ_ROUTER_MANDATORY: its routing id reaches no one) counts the same. A lost worker gets no more work: the chunk it
 * held goes back to the queue and is re-issued to the next free worker (a sample's trajectory depends only on its
 * uid, stream, eta and the weights of its version, so the results are those of an undisturbed run, bit for bit),
 * and syncs and the shutdown stop waiting for it. When no worker is left, ctl_rollout fails at once naming them, or
 * with ctl_set_rejoin_wait waits that long for one to come back. A lost worker comes back when its restarted process
 * says hello under the same client id with its first process's hashes (trainer/net/ctl_msg.h); it gets the weights every
 * worker holds (the last sync's experts, or ctl_set_weights's) and works again once its weights_ack carries the
 * controller's hash. A worker that is alive but hangs is not noticed before the chunk time-out. Log lines (stderr):
 *   controller: worker-1 lost (its connection closed) with chunk r3-1 (2 sample(s)) in flight: it is re-issued ...
 *   controller: chunk r3-1 re-issued to worker-0
 *   controller: worker-1 is back (restart 1): sent it the weights of policy version 3 (xxh64 ...); it gets work ...
 *   controller: worker-1 is back at work: its weights of policy version 3 hash to ..., as the trainer's
 *
 * Authentication (core/curve.h): with keys, the ROUTER is a CURVE server with the controller key pair and a ZAP
 * handler that accepts only the run's client key, on ipc:// and tcp:// alike; a process without the client secret
 * cannot complete the handshake, so none of its messages reach the controller (the ZAP refusal is logged). An
 * ipc:// socket file is 0600 whatever the umask (core_zmq_bind). What the controller does with each message that
 * does reach it (an unexpected hello, a reply to nothing: an error reply and a log line, never the end of the run)
 * is trainer/net/ctl_msg.h. */
#ifndef TRAINER_CONTROLLER_H
#define TRAINER_CONTROLLER_H

#include <stdint.h>

#include "core/curve.h"
#include "core/recipe.h"
#include "core/wire_rollout.h"
#include "kernels/dev_ops.h"
#include "model/dit/wan_dit.h"
#include "trainer/net/ctl_msg.h"

typedef struct ctl_server ctl_server;

/* Returns non-zero (with core_error set to the reason) when the controller must stop waiting. */
typedef int (*ctl_abort_fn)(void *ctx);

/* Called once per finished chunk with its results (in sample order) and, when the request asked for videos, the
 * videos [n, vshape] U8 (borrowed for the call). Non-zero aborts the rollout. */
typedef int (*ctl_chunk_fn)(void *ctx, const core_rollout_sample *samples, const core_rollout_result *res, int n,
                            const uint8_t *videos, const int64_t vshape[4]);

/* Binds a ROUTER at endpoint. keys: the controller's keys (its pair and the client public key; core_curve_subset
 * with CORE_CURVE_CONTROLLER), or NULL for plain ZeroMQ (tests, a debugging set-up: anyone who can reach the
 * endpoint can talk to the controller). max_frame_bytes (> 0): the largest frame a worker may send
 * (ctl_max_frame_bytes), set as ZMQ_MAXMSGSIZE: a connection that declares a larger frame, already during its
 * security handshake and so before any key is checked, is dropped by libzmq before the frame is buffered. NULL with
 * core_error when it cannot. */
ctl_server *ctl_open(const char *endpoint, const core_curve_keys *keys, size_t max_frame_bytes, ctl_abort_fn abort_check,
                     void *abort_ctx);

/* The largest frame a rollout worker's message can hold for the recipe (core_rollout_reply_max_frame with the
 * transformer's channels from model.path/transformer/config.json, the latent and video size of rollout.* and
 * model.decoder, and chunks of rollout.batch_size samples) into *bytes. -1 with core_error naming the file. */
int ctl_max_frame_bytes(const core_recipe *r, size_t *bytes);
void ctl_close(ctl_server *c);

/* The endpoint the ROUTER is bound to, as libzmq reports it (ZMQ_LAST_ENDPOINT: a tcp://HOST:* bind names the port
 * the system chose), into buf (cap bytes). -1 with core_error. An MPI launch (cli/launch_mpi.c) hands it to the
 * workers. */
int ctl_endpoint(const ctl_server *c, char *buf, size_t cap);

/* Waits up to timeout_s for n workers' hello (and for a lost one's restart to take its place) {client, policy_version, model_xxh64, experts, adapter_xxh64?}. -1 with core_error
 * (time-out naming how many came, abort). A hello without client id or model hash, or naming a client already
 * registered, and any other message are refused (trainer/net/ctl_msg.h) and the wait goes on. */
int ctl_wait_workers(ctl_server *c, int n, double timeout_s);

/* Number of workers and their client ids. */
int ctl_n_workers(const ctl_server *c);
const char *ctl_worker_id(const ctl_server *c, int w);
/* The hash and version a worker reported in its hello (for start-up checks). */
uint64_t ctl_worker_hello_hash(const ctl_server *c, int w);
/* 1 with *hash when the worker's hello named the hash of the LoRA adapters it holds (adapter_xxh64), else 0. */
int ctl_worker_hello_adapter(const ctl_server *c, int w, uint64_t *hash);
/* Messages refused so far: answered with an error (trainer/net/ctl_msg.h) plus handshakes the ZAP handler refused. */
long ctl_refused(const ctl_server *c);
/* 1 while worker w is lost (see above); the times it came back. */
int ctl_worker_lost(const ctl_server *c, int w);
int ctl_worker_rejoins(const ctl_server *c, int w);

/* With no worker left, ctl_rollout waits up to `seconds` for a restarted one to come back (0, the default: it fails at
 * once naming the lost workers). `vgrpo trainer` waits as long as for the first hellos: its supervisor restarts dead
 * workers, and stops the run itself when it restarts no more. */
void ctl_set_rejoin_wait(ctl_server *c, double seconds);

/* The size of a weight sync's buckets in bytes (trainer/net/sync_bucket.h; default SYNC_BUCKET_MIB_DEFAULT MiB, a
 * recipe's parallel.sync_bucket_mib), 4 .. SYNC_BUCKET_MIB_MAX MiB, rounded down to whole F32 elements. -1 with
 * core_error outside that range (the size is kept). */
int ctl_set_sync_bucket(ctl_server *c, int64_t bytes);

/* The same-host path of the weight sync (core/wire_sync.h): the trainer's device dev (a table with ipc_export) holds,
 * for each expert e with bufs[e] != NULL, the F32 buffer of elements[e] elements that a sync of experts[e] sends (its
 * fp32 master: the model's params, or with LoRA its adapter's, in the host buffer's layout) and that the host
 * buffer mirrors when a sync starts. A sync of exactly those experts then goes by IPC to every worker whose hello
 * named this host and an IPC-capable device (buckets to the others, and to one that answers ipc_refused, for that
 * sync and every later one); any other sync (an EMA's weights, an admission) goes in buckets. dev NULL: buckets
 * only (the default). The buffers must stay allocated while the controller may sync. */
void ctl_set_device_weights(ctl_server *c, const k_dev_ops *dev, const wan_model *const *experts,
                            const void *const *bufs, const int64_t *elements, int n_experts);

/* How syncs travel: mode is parallel.sync (core_sync_mode: auto, ipc, buckets, nccl; the default auto). auto: by
 * NCCL broadcast (trainer/net/sync_nccl.h) when nccl_host is given, the experts sent are the device buffers of
 * ctl_set_device_weights, every worker said "nccl" in its hello and one of them is on another host; else by IPC to
 * the workers on this host (as above) and in buckets to the others. ipc: never NCCL. buckets: buckets only. nccl:
 * NCCL whenever it can (else buckets, with a warning). nccl_host: an MPI group of this process (rank 0) and every
 * worker (an MPI launch: cli/cmd_mpi_rank.c), NULL outside one. */
struct sp_comm;
void ctl_set_sync(ctl_server *c, int mode, struct sp_comm *nccl_host);

/* NCCL syncs of weights that are not in device buffers of ctl_set_device_weights (ZeRO stage 3: no device holds a
 * whole master; the host copy, gathered after every step, is what a sync sends): each bucket is uploaded from the
 * host copy into `staging` (a buffer of `bytes` on dev, at least parallel.sync_bucket_mib; it must hold nothing the
 * trainer needs between its optimizer step and its next accumulation: trainer/run/run_setup.c lends the device
 * gradients) and broadcast from there. staging NULL: none (such syncs go in buckets). */
void ctl_set_sync_staging(ctl_server *c, const k_dev_ops *dev, void *staging, int64_t bytes);

/* Records that every worker holds the experts (send[e]: sent, or to be sent to a worker that comes back) as policy
 * `version`, without sending anything: what a fresh run's workers loaded (trainer/net/source_remote.c's start). Each
 * ctl_sync_weights records its weights the same way. The experts are kept by pointer and must stay valid and
 * unchanged until the next record or sync; experts NULL forgets them. -1 with core_error (a hash failed). */
int ctl_set_weights(ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send,
                    int64_t version);

/* Runs samples[0..n) through the workers: chunks of `chunk` samples, each a rollout_request built from tmpl
 * (policy_version, stream, eta, return flags; tmpl->samples and n ignored), handed to idle workers in order (the
 * lowest chunk nobody holds first: a lost worker's chunk is re-issued). Results land in res[0..n) in sample order
 * (core_traj_free each .traj); on_chunk (may be NULL) sees each chunk as it arrives. Errors (-1): a worker's error
 * reply to its chunk (named with its reason), a malformed trajectory for the chunk in flight, a time-out of timeout_s
 * for one chunk, no worker left (see above), an abort. Messages that answer nothing in flight are refused and the
 * rollout goes on (trainer/net/ctl_msg.h). On error res holds nothing to free. */
int ctl_rollout(ctl_server *c, const core_rollout_request *tmpl, const core_rollout_sample *samples, int n, int chunk,
                double timeout_s, core_rollout_result *res, ctl_chunk_fn on_chunk, void *ctx);

/* Pushes the weights of the experts with send[e] != 0 to every worker not lost as policy `version` (weights_begin,
 * weights_bucket per bucket with its xxh64 (trainer/net/sync_bucket.h), weights_end with the whole-model hash of all
 * n_experts experts; to a worker on this host by IPC instead when ctl_set_device_weights named these experts'
 * device buffers, core/wire_sync.h, and in buckets again when it answers ipc_refused; to every worker by NCCL
 * broadcast when ctl_set_sync's rules choose it, trainer/net/sync_nccl.h) and
 * waits for every weights_ack (a worker lost meanwhile is not waited for; one back from a restart is admitted by
 * it). It records the experts as ctl_set_weights does. *hash_match = 1 when every worker's hash equals the controller's; *bytes (may be
 * NULL) = the tensor bytes sent to each worker. LoRA: when the experts to send carry adapters (wan_model.lora), the
 * sync is of the adapters only (weights_begin "adapter": true; tensors "transformer/blocks.0.attn1.to_q.lora_A.weight",
 * ...; the hash is wan_models_adapters_hash over every expert's adapter): the workers' base weights are not touched.
 * Errors (-1): a worker's refusal (its reason), an ack with another hash (names the worker and both hashes), a
 * time-out, abort, a mix of adapters and full weights in one sync. */
int ctl_sync_weights(ctl_server *c, const wan_model *const *experts, int n_experts, const uint8_t *send,
                     int64_t version, double timeout_s, int *hash_match, int64_t *bytes);

/* Sends `shutdown` to every worker and waits up to timeout_s for their replies. The current error (core_last_error)
 * is kept as it was: a time-out here never replaces the failure that led to the shutdown. */
void ctl_shutdown(ctl_server *c, double timeout_s);

#endif
