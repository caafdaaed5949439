/* reward/server_requests.h — what the reward server does with one message, with no sockets and no threads:
 * parse and check it, answer errors, hellos and repeats, and hand good score_requests to the caller for scoring
 * (reward/PROTOCOL.md sections 1-4). reward/server.c drives it from its socket thread; the fuzz target
 * tests/fuzz/fuzz_reward_server.c drives it directly.
 *
 * Idempotent ids: a score_request is keyed by (client id, request id) and a hash of its content (xxh64 of the
 * fields that scoring reads, fps and items, the videos' shape and every video byte). A repeat with the same key
 * and content gets the cached reply byte for byte, or joins the request still being scored; the same key with
 * other content is a `bad_request` naming the id, so a re-used id (or a second connection claiming the same client
 * id) never gets another request's score. Not thread-safe: one caller. */
#ifndef REWARD_SERVER_REQUESTS_H
#define REWARD_SERVER_REQUESTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/wire.h"
#include "reward/server.h"

/* Longest routing id kept (libzmq's are 5 bytes; a peer-chosen one may be up to 255). */
#define REWARD_MAX_PEER 256
/* Connections a request still being scored can be waiting on (a client that reconnected and re-sent; a second
 * connection with the same client id and the same request). Beyond that the oldest waiter is forgotten. */
#define REWARD_MAX_WAITERS 4
/* Frames a message may have after the routing id: the header and 16 tensors. */
#define REWARD_MAX_FRAMES 17

typedef struct {
    uint8_t id[REWARD_MAX_PEER];
    size_t len;
} reward_peer;

typedef enum {
    REWARD_SEND,  /* send `reply` to the peer that sent the message */
    REWARD_WAIT,  /* a repeat of a request still being scored: nothing now, the reply will go to this peer too */
    REWARD_SCORE, /* score `msg` (reward_requests_reply_text on a scoring thread), then call reward_requests_done */
    REWARD_STOP,  /* `shutdown`: send `reply`, then stop reading new requests */
} reward_verb;

typedef struct {
    reward_verb verb;
    char *reply;      /* REWARD_SEND, REWARD_STOP: header text to send (malloc'd, NUL-terminated; NULL when out of
                       * memory: nothing to send) */
    size_t reply_len;
    int error;        /* the reply is an `error` (the stats count it under errors) */
    int repeat;       /* answered from the cache or joined to a request being scored (counted under repeats) */
    int slot;         /* REWARD_SCORE: the request's cache slot and generation, for reward_requests_done */
    uint64_t gen;
    core_wire_msg msg; /* REWARD_SCORE: the parsed, checked request; it borrows the frames, which must live until
                        * it is scored; free with core_wire_msg_free. Empty for the other verbs. */
    size_t bytes;      /* REWARD_SCORE: all frames' bytes (what holding the request costs) */
} reward_action;

typedef struct reward_requests reward_requests;

/* A handler for cfg (scorers, max_frame_bytes, cache, queue; borrowed: must outlive it). NULL when out of memory. */
reward_requests *reward_requests_new(const reward_server_config *cfg);
void reward_requests_free(reward_requests *r);

/* Handles one message from `peer` (its routing id, 1..REWARD_MAX_PEER bytes): n frames after the routing id
 * (n > REWARD_MAX_FRAMES stands for "too many"; only the first REWARD_MAX_FRAMES are read). queued: requests
 * waiting for or being scored now; held: their bytes (`busy` once either is at its limit: cfg->queue requests,
 * reward_server_held_bound bytes). Fills *act; always returns 0 (a peer's message is never a failure of the server,
 * and out of memory becomes an `internal` error or a silent drop). */
int reward_requests_handle(reward_requests *r, const reward_peer *peer, const core_wire_frame *frames, int n,
                           int queued, size_t held, reward_action *act);

/* The reply to a scored request (a score_reply, or a scorer_failed error with the scorer's reason): header text
 * (malloc'd), *ok 1 for a score_reply. Thread-safe: the scoring threads call it. NULL when out of memory. */
char *reward_requests_reply_text(const core_wire_msg *m, const reward_weighted *scorers, int n_scorers, int *ok);

/* Takes the reply of the request handed out as (slot, gen) (ok: it is a score_reply, not an error): caches it and fills to[0..n) with the peers waiting for
 * it (the one that sent it, and any that re-sent it meanwhile; n <= REWARD_MAX_WAITERS). Returns n, 0 when the
 * entry was evicted meanwhile (the reply is dropped; a repeat is scored again). */
int reward_requests_done(reward_requests *r, int slot, uint64_t gen, const char *reply, size_t len, int ok,
                         reward_peer to[REWARD_MAX_WAITERS]);

/* An `error` header text (malloc'd) for request id `id` ("" when unknown): retryable for busy and shutting_down;
 * the reason is cut to printable ASCII. NULL when out of memory. */
char *reward_requests_error_text(const char *id, const char *code, const char *reason);

#endif
