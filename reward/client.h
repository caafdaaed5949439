/* reward/client.h — the reward client a rollout worker uses to score videos on a reward server
 * (reward/server.h, or any peer speaking reward/PROTOCOL.md; docs/design.md section 3).
 *
 * One client is one ZeroMQ DEALER (ZMQ_LINGER 0, ZMQ_IMMEDIATE 1, ZMTP heartbeats on tcp://) that introduces itself
 * with `hello` on every fresh connection (and waits for the reply, which carries the server's max_videos_bytes) and
 * then asks one `score_request` at a time. A request gets an id unique for this client's life
 * (client start time + counter) and is re-sent with the SAME id and content when no reply comes within the time-out:
 * the socket is closed and a fresh one connects (hello again), so a restarted server or a dropped connection is
 * survived; the server answers repeats idempotently (PROTOCOL.md section 4). Retryable errors (`busy`,
 * `shutting_down`) are re-sent after a short back-off; other errors are returned. Replies with another id (stale
 * repeats of earlier requests) are ignored. Not thread-safe: one client per thread. */
#ifndef REWARD_CLIENT_H
#define REWARD_CLIENT_H

#include <jansson.h>
#include <stdint.h>

#include "core/curve.h"

/* Most scorers a reply may list (as the C server: REWARD_SERVER_MAX_SCORERS) and longest scorer name kept. */
#define REWARD_CLIENT_MAX_SCORERS 16
#define REWARD_CLIENT_MAX_NAME 64

/* One video's rewards: the weighted total and each scorer's reward, in the order the server lists its scorers
 * (the reply's "scorers" array). */
typedef struct {
    double total;
    int n_scores;
    struct {
        char name[REWARD_CLIENT_MAX_NAME];
        double weight; /* the server's weight for this scorer */
        double value;  /* the scorer's reward (unweighted) */
    } scores[REWARD_CLIENT_MAX_SCORERS];
} reward_result;

typedef struct reward_client reward_client;

/* Opens a client of the reward server at `endpoint` (ipc://PATH with PATH < 100 bytes, or tcp://HOST:PORT) as
 * `client_id` (1..128 bytes, stable across restarts of the same logical client, e.g. "worker-3"). timeout_s (> 0,
 * seconds): how long one attempt waits for its reply (also for the connection to come up); max_attempts (>= 1):
 * sends of one request before giving up. Connecting is lazy: the server need not be up yet. Returns the client, or
 * NULL with core_error naming the bad argument or the endpoint libzmq refused. */
reward_client *reward_client_open(const char *endpoint, const char *client_id, double timeout_s, int max_attempts);

/* reward_client_open with the run's keys (core/curve.h; a worker's set, core_curve_subset CORE_CURVE_CLIENT: the
 * client pair and the reward server's public key; copied): the DEALER is a CURVE client that completes its
 * handshake only with the run's reward server, and the server admits it. keys NULL: plain ZeroMQ, as
 * reward_client_open. NULL with core_error also when keys lack client-public, client-secret or reward-public. A
 * server with other keys (or none) looks like a server that is down: no reply, then the attempts' error. */
reward_client *reward_client_open_keys(const char *endpoint, const char *client_id, double timeout_s, int max_attempts,
                                       const core_curve_keys *keys);

/* Scores n >= 1 videos, U8 RGB [n, frames, height, width, 3] (row-major, 0..255), at fps (> 0) frames per second,
 * with prompts[i] (UTF-8) and metadata[i] (a JSON object of string values, e.g. {"color": "red"}; metadata itself or
 * any entry may be NULL: none). Fills out[0..n) in video order. Returns 0, or -1 with core_error:
 *   - a bad argument (names it: prompts[i], metadata[i].key, a dim);
 *   - the videos are larger than the server's max_videos_bytes (from its hello reply): not sent;
 *   - a non-retryable error reply: "reward server ENDPOINT: request ID: CODE: REASON" (bad_request, scorer_failed,
 *     unsupported, internal);
 *   - a malformed reply: names the field (rewards length, a missing or non-finite scorer value, total);
 *   - no reply after max_attempts sends: names the endpoint, the request id and the number of attempts.
 * Blocks at most about max_attempts x (timeout_s + back-off). */
int reward_client_score(reward_client *c, const uint8_t *videos, int n, int frames, int height, int width, double fps,
                        const char *const *prompts, const json_t *const *metadata, reward_result *out);

/* The server's scorers as its `hello` reply lists them (PROTOCOL.md section 2): out->n_scores names and weights in
 * the server's order (values 0). Sends a hello of its own (connecting first when needed) and waits timeout_s for the
 * reply, max_attempts times on a fresh connection each. A trainer with an external reward.endpoint takes the run's
 * scorers from it. Returns 0, or -1 with core_error: no reply after the attempts (names the endpoint), or a reply
 * that is an error or lists no well-formed scorers (names the field). */
int reward_client_scorers(reward_client *c, reward_result *out);

/* The id of the last request reward_client_score built ("" before the first) and the attempts it took (an attempt
 * that found no live connection within timeout_s counts). */
const char *reward_client_last_id(const reward_client *c);
int reward_client_last_attempts(const reward_client *c);

/* Closes the socket (pending messages are dropped: linger 0) and frees the client; NULL is a no-op. */
void reward_client_close(reward_client *c);

#endif
