/* reward/server.h — the reward server: a ZeroMQ ROUTER that scores batches of videos with the built-in scorers
 * (reward/scorers.h) for any number of clients, as reward/PROTOCOL.md specifies (docs/design.md section 3).
 *
 * One thread owns the sockets: it receives, checks every message (core/wire.h plus the score_request fields),
 * answers errors, hellos and repeats itself, and queues good requests for a pool of scoring threads, whose replies
 * come back over an inproc socket and are cached for idempotent repeats. */
#ifndef REWARD_SERVER_H
#define REWARD_SERVER_H

#include <jansson.h>
#include <signal.h>
#include <stddef.h>

#include "core/curve.h"
#include "core/wire.h"
#include "reward/scorers.h"

#define REWARD_SERVER_MAX_SCORERS 16

typedef struct {
    const char *endpoint;   /* ipc://PATH (PATH < 100 bytes) or tcp://HOST:PORT */
    int n_scorers;
    reward_weighted scorers[REWARD_SERVER_MAX_SCORERS];
    int threads;            /* scoring threads, >= 1 */
    int queue;              /* requests waiting for a thread before `busy` errors, >= 1 */
    size_t max_frame_bytes; /* largest tensor frame (ZMQ_MAXMSGSIZE); the whole message may add 1 MiB of header */
    int cache;              /* replies kept for idempotent repeats, >= 1 (and at most REWARD_SERVER_CACHE_BYTES) */
    int max_peers;          /* connections at once, >= 1: the handshake of one more is refused (ZAP) */
    size_t max_memory_bytes; /* resident memory growth above the size at start past which every connection is
                              * dropped; 0: reward_server_memory_budget */
    const core_curve_keys *keys; /* the server's keys (core_curve_subset CORE_CURVE_REWARD: the reward pair and the
                                  * client public key): a CURVE server that admits only the run's client key. NULL:
                                  * plain ZeroMQ, any peer that can reach the endpoint (borrowed) */
    /* Called once on the thread of reward_server_run right after the ROUTER is bound, before any message is read,
     * with the endpoint as bound (ZMQ_LAST_ENDPOINT: a tcp://HOST:* bind names the port the system chose); a
     * non-zero return stops the server (reward_server_run returns -1 with the callback's core_error). NULL: none.
     * An MPI launch (cli/launch_mpi.c) hands the endpoint to the other ranks here. */
    int (*on_bound)(void *ctx, const char *endpoint);
    void *on_bound_ctx;
    size_t model_act_bytes; /* scratch the learned scorers' models allocate at once (reward_server_attach_models;
                             * their parameters are loaded before the server starts, so outside the growth) */
} reward_server_config;

/* Reply text the cache keeps at most, all entries together (the oldest go first). */
#define REWARD_SERVER_CACHE_BYTES ((size_t)64 << 20)
/* Header bytes a message may add to its tensor frame. */
#define REWARD_SERVER_HEADER_BYTES ((size_t)1 << 20)

/* Counters printed at exit. */
typedef struct {
    long long received;  /* messages received (all kinds) */
    long long replies;   /* score_reply sent (repeats included) */
    long long errors;    /* error replies sent */
    long long repeats;   /* requests answered from (or joined to) the cache */
    long long videos;    /* videos scored */
    long long undeliverable; /* replies whose peer was gone */
    long long refused;   /* connections refused at the handshake (over max_peers) */
    long long dropped;   /* connections dropped because the server's memory went over its budget */
} reward_server_stats;

/* Defaults: no scorers, 2 threads, queue 64, frame limit REWARD_SERVER_DEFAULT_FRAME_MB MiB (the CPU recipes' largest
 * request, recipes/tiny-cpu.yaml: 16 videos x 5 x 32 x 32 x 3 = 240 KiB, with room), cache 4096, 16 peers, memory
 * budget derived. */
#define REWARD_SERVER_DEFAULT_FRAME_MB 16
void reward_server_config_default(reward_server_config *cfg);

/* Bytes of requests the server holds (queued or being scored) before it answers `busy`: max_peers x (max_frame_bytes
 * + REWARD_SERVER_HEADER_BYTES), one largest message per allowed connection. */
size_t reward_server_held_bound(const reward_server_config *cfg);

/* The memory budget (PROTOCOL.md section 3) when cfg->max_memory_bytes is 0: what the server may hold with every
 * peer sending its largest messages, 4 x max_peers x (max_frame_bytes + 1 MiB) (in libzmq per connection: two
 * complete messages queued, ZMQ_RCVHWM 2, and one being read; held for scoring: reward_server_held_bound), plus the
 * reply cache (REWARD_SERVER_CACHE_BYTES), 64 MiB for parsing and replies, and model_act_bytes. */
size_t reward_server_memory_budget(const reward_server_config *cfg);

/* Parses "NAME:WEIGHT,NAME[:WEIGHT],..." (weight default 1, finite) into cfg->scorers. Returns 0, or -1 with
 * core_error naming the entry (unknown scorer: the message lists the known ones; repeated name; bad weight). */
int reward_server_parse_scorers(reward_server_config *cfg, const char *spec);

/* Loads the learned scorers' models of cfg->scorers (reward_models_attach; models "NAME=DIR,..." as --models,
 * frames as --frames, video_frames the videos' frame count the scratch estimate and the K check use) and sets
 * cfg->model_act_bytes: the sum over models of reward_model_act_bytes (each model runs one call at a time). 0 or
 * -1 with core_error naming --models or --frames. reward_server_detach_models frees them. */
int reward_server_attach_models(reward_server_config *cfg, const char *models, const char *frames, int64_t video_frames);
void reward_server_detach_models(reward_server_config *cfg);

/* Checks a parsed score_request's fields (PROTOCOL.md section 2): one U8 tensor "videos" [N,F,H,W,3] with all dims
 * >= 1, "fps" a number > 0, "items" an array of N objects with a string "prompt" and an optional "metadata" object
 * of strings. Returns 0, or -1 with core_error naming the field. */
int reward_check_score_request(const core_wire_msg *m);

/* Scores a checked score_request with the weighted scorers: returns the score_reply's fields
 * {"rewards": [{"total", "scores": {...}}...], "scorers": [...]} (new reference), or NULL with core_error naming
 * the item and scorer that failed. Thread-safe. */
json_t *reward_score_request(const core_wire_msg *m, const reward_weighted *scorers, int n_scorers);

/* Serves on cfg->endpoint until *stop becomes non-zero (a signal handler sets it) or a `shutdown` message
 * arrives, then finishes the requests in flight (up to 10 s) and returns 0, filling *stats. An ipc:// socket file
 * is created with mode 0600 whatever the umask. With cfg->keys, a message whose connection was not admitted with
 * the client key (ZAP user id) is not read (an `unauthenticated` error), so only the run's clients can score or
 * send `shutdown`. Returns
 * -1 with core_error when the endpoint cannot be bound, the keys are incomplete or a socket fails. A peer's message
 * never makes it return. */
int reward_server_run(const reward_server_config *cfg, volatile sig_atomic_t *stop, reward_server_stats *stats);

#endif
