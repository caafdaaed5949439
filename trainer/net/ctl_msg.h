/* trainer/net/ctl_msg.h — what the controller (trainer/net/controller.h) does with one received message, without sockets:
 * the registry of workers, the phase the controller is in (waiting for hellos, a rollout, a weight sync, the
 * shutdown) and the rules below. trainer/net/controller.c receives and parses, calls ctl_msg_handle, sends the error
 * reply it asks for and acts on the event; tests/fuzz/fuzz_ctl_msg.c calls it with arbitrary messages.
 *
 * Rules (reward/PROTOCOL.md section 8): one unexpected message never ends a run. These are answered with an `error`
 * (code `unexpected`, or `unsupported` for a type the controller does not serve; `bad_request` for a message that
 * does not parse: ctl_msg_malformed) and logged (the first 20, then every 1000th), and the controller goes on:
 *   - a second hello from a registered worker; a hello while the controller is not waiting for workers (during a
 *     rollout or a weight sync, or once all have come); a hello naming a client id already registered (except in
 *     the hello phase, below); a hello
 *     without `client` (1..128 bytes) or `model_xxh64`, or with an `adapter_xxh64` that is not 16 hex digits;
 *   - any other message from a routing id that never said hello;
 *   - a reply to nothing: a trajectory, weights_ack or shutdown that answers no request in flight (another phase,
 *     another id, a worker not working, a second ack);
 * and an `error` that answers nothing is logged only (an error is never answered with an error: no ping-pong).
 * What ends the operation (-1 with core_error, as before): an `error` a worker sends in answer to its own request
 * (a failed rollout chunk, refused weights; but not `ipc_refused` answering a sync that went to it by IPC: the event
 * says ipc_refused, and the controller sends it the sync again in buckets, core/wire_sync.h), a malformed trajectory for the request in flight, a weights_ack with
 * another model hash or version. Those come from the run's own workers: with keys (core/curve.h) no other process
 * can reach the controller.
 *
 * A lost worker comes back (trainer/net/controller.h: a worker whose connection closed is `lost`): a hello naming a lost
 * worker's client id, in any phase but the shutdown, is its restarted process. It must report its first process's
 * model_xxh64 and adapter_xxh64 (both loaded model.path and model.lora), else it is refused (`bad_request`, naming the
 * two hashes) and stays lost; then it takes its old place (index, name) with the new routing id: in the hello phase
 * ready at once (the start-up checks and sync cover it), otherwise `pending` until its admission weight sync (the
 * weights every worker holds, ids "j<n>-...") is acknowledged with the controller's hash and version (ready; a
 * mismatch or its error ends the operation, as for any sync). A weight sync to every worker also admits a pending
 * worker it reached. Any other message from a lost worker's routing id (sent before its connection closed, read
 * after) is dropped without a reply: the peer is gone.
 *
 * A registered worker's new connection: in the hello phase (before anything was sent to its workers), a hello naming
 * a registered, not lost, worker's client id from another routing id, with its first hello's model and adapter
 * hashes, moves that worker to the new routing id (rollout/worker.c connects afresh when it has not seen its
 * handshake succeed, and the old connection may have delivered the first hello); with other hashes it is refused as
 * a second worker of that name. */
#ifndef TRAINER_CTL_MSG_H
#define TRAINER_CTL_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"
#include "core/wire_rollout.h"
#include "core/wire_sync.h"

#define CTL_MAX_WORKERS 64

typedef struct {
    char id[129];       /* client id from its hello */
    uint8_t rid[256];   /* ZeroMQ routing id */
    size_t rid_len;
    uint64_t hello_hash; /* model_xxh64 of its hello (its base weights) */
    uint64_t hello_adapter_hash; /* adapter_xxh64 of its hello: the LoRA adapters it holds */
    int hello_has_adapter;      /* the hello named adapter_xxh64 */
    int busy;           /* rollout: chunk index + 1, 0 when idle */
    int done;           /* sync: weights_ack counted; shutdown: reply counted */
    int lost;           /* its connection closed (or a send to it failed): no work, not waited for, until it is back */
    int fd;             /* its connection's descriptor here (ZMQ_SRCFD of its hello; <= 0: unknown), for the monitor */
    int admit;          /* CTL_ADMIT_READY: gets work; PENDING / SYNCING: back from a restart, not yet synced */
    char admit_id[48];  /* SYNCING: the id of its admission sync's weights_end */
    int64_t admit_version;
    uint64_t admit_hash;
    int rejoins;        /* times it came back */
    int back;           /* admitted after coming back and given no chunk yet (for one log line) */
    char host_id[CORE_SYNC_HOST_ID_MAX]; /* its hello's host_id ("": unknown; core/wire_sync.h) */
    int ipc;            /* its hello said "ipc": its device opens IPC handles */
    int ipc_used;       /* the sync in flight went to it by IPC */
    int nccl;           /* its hello said "nccl": it takes NCCL syncs (the job's communicator, device weights) */
    int nccl_used;      /* the sync in flight went to it by NCCL broadcast */
    char ipc_refused[256]; /* why it refused IPC (an ipc_refused error); "": never. It then gets buckets only */
} ctl_worker;

enum { CTL_ADMIT_READY = 0, CTL_ADMIT_PENDING, CTL_ADMIT_SYNCING };

typedef enum { CTL_IDLE = 0, CTL_HELLO, CTL_ROLLOUT, CTL_SYNC, CTL_SHUTDOWN } ctl_phase;

typedef struct {
    ctl_phase phase;
    int n;                        /* registered workers */
    int want;                     /* CTL_HELLO: workers to wait for */
    ctl_worker w[CTL_MAX_WORKERS];
    /* CTL_ROLLOUT: the chunks (requests, their ids) and where results go: chunk k's samples are
     * res[k * chunk .. k * chunk + reqs[k].n) */
    const core_rollout_request *reqs;
    const char (*ids)[40];
    int n_chunks, chunk;
    core_rollout_result *res;
    uint8_t *chunk_done;          /* per chunk: 1 once its trajectory arrived */
    /* CTL_SYNC: the version pushed, the controller's whole-model hash, weights_end's id */
    int64_t version;
    uint64_t model_hash;
    char end_id[48];
    /* counters */
    long unexpected;              /* messages answered with an error or dropped */
} ctl_state;

/* The error reply ctl_msg_handle asks for (send == 0: none). */
typedef struct {
    int send;
    char id[130];
    char code[32];
    char reason[512];
} ctl_reply;

/* What a message did. worker: the sender's index (-1: unknown routing id); progress: 1 when it counts towards the
 * phase's goal (a worker registered, a chunk finished, an ack or a shutdown reply counted); chunk: the finished
 * chunk (-1 otherwise), whose results are in res and whose videos (when asked) point into the message: [n, vshape]
 * U8, valid while the message is. */
typedef struct {
    int worker, progress, chunk;
    int registered;  /* a hello (re-)registered the sender: its connection's fd is to be recorded */
    int rejoined;    /* ... and it is a lost worker back (now pending, or ready in the hello phase) */
    int admitted;    /* an admission sync was acknowledged: the worker is ready */
    int ipc_refused; /* the worker answered the sync in flight with ipc_refused: it is to get it again in buckets */
    const uint8_t *videos;
    int64_t vshape[4];
} ctl_event;

/* Handles message m from routing id rid under the rules above. Returns 0 (see ev and reply) or -1 when the current
 * operation failed (core_error names the worker and the reason). Never frees m. */
int ctl_msg_handle(ctl_state *s, const void *rid, size_t rid_len, const core_wire_msg *m, ctl_event *ev,
                   ctl_reply *reply);

/* A message from rid that could not be parsed (why: the parser's reason) or that came over a connection without
 * authentication while the controller has keys (code "unauthenticated"): fills the error reply and logs it. */
void ctl_msg_refuse(ctl_state *s, const void *rid, size_t rid_len, const char *code, const char *why, ctl_reply *reply);

/* Workers registered and not lost. */
int ctl_msg_live(const ctl_state *s);

/* The worker a routing id belongs to, or -1. */
int ctl_msg_find(const ctl_state *s, const void *rid, size_t rid_len);

#endif
