/* trainer/ctl_msg.h — what the controller (trainer/controller.h) does with one received message, without sockets:
 * the registry of workers, the phase the controller is in (waiting for hellos, a rollout, a weight sync, the
 * shutdown) and the rules below. trainer/controller.c receives and parses, calls ctl_msg_handle, sends the error
 * reply it asks for and acts on the event; tests/fuzz/fuzz_ctl_msg.c calls it with arbitrary messages.
 *
 * Rules (reward/PROTOCOL.md section 8): one unexpected message never ends a run. These are answered with an `error`
 * (code `unexpected`, or `unsupported` for a type the controller does not serve; `bad_request` for a message that
 * does not parse: ctl_msg_malformed) and logged (the first 20, then every 1000th), and the controller goes on:
 *   - a second hello from a registered worker; a hello while the controller is not waiting for workers (during a
 *     rollout or a weight sync, or once all have come); a hello naming a client id already registered; a hello
 *     without `client` (1..128 bytes) or `model_xxh64`, or with an `adapter_xxh64` that is not 16 hex digits;
 *   - any other message from a routing id that never said hello;
 *   - a reply to nothing: a trajectory, weights_ack or shutdown that answers no request in flight (another phase,
 *     another id, a worker not working, a second ack);
 * and an `error` that answers nothing is logged only (an error is never answered with an error: no ping-pong).
 * What ends the operation (-1 with core_error, as before): an `error` a worker sends in answer to its own request
 * (a failed rollout chunk, refused weights), a malformed trajectory for the request in flight, a weights_ack with
 * another model hash or version. Those come from the run's own workers: with keys (core/curve.h) no other process
 * can reach the controller. */
#ifndef TRAINER_CTL_MSG_H
#define TRAINER_CTL_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"
#include "core/wire_rollout.h"

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
} ctl_worker;

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

/* The worker a routing id belongs to, or -1. */
int ctl_msg_find(const ctl_state *s, const void *rid, size_t rid_len);

#endif
