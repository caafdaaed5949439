/* tests/fuzz/fuzz_reward_server.c — libFuzzer target for the reward server's message handling
 * (reward/server_requests.h: parse, check, hello, shutdown, the content-keyed reply cache, busy), in process and
 * without sockets (`make fuzz`).
 *
 * Input: a script of operations, each starting with one byte op:
 *   op >> 6 == 3           finish the oldest request handed out for scoring (score it, reward_requests_done);
 *   otherwise              a message from peer (op & 3): a u16 little-endian length L, then L bytes cut into frames
 *                          as tests/fuzz/fuzz_frames.h does (up to 3 tensor frames); (op >> 2) & 1 set: it counts as
 *                          a message of more than 17 frames.
 * Requests still being scored at the end are finished. The handler is fresh per input with small limits (frame
 * 4096 bytes, queue 3, cache 4 entries, 2 peers) so that busy, eviction and repeats are reached.
 *
 * Checked (abort on failure): every reply is a well-formed wire message of an expected type whose id is the
 * request's when it could be read; a score_request handed out for scoring passed reward_check_score_request; the
 * bytes and queue limits hold; a repeat answered from the cache is byte for byte the reply that scoring the repeat
 * itself would give (so a re-used id never returns another request's score); at most REWARD_MAX_WAITERS peers get a
 * reply. Crashes, sanitizer reports and leaks are findings. Seeds: seeds-fuzz_reward_server/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/wire.h"
#include "reward/server_requests.h"
#include "tests/fuzz/fuzz_frames.h"

#define MAX_PENDING 4

typedef struct {
    core_wire_msg msg;
    int slot;
    uint64_t gen;
    size_t bytes;
} pending;

static reward_server_config cfg;

static void setup(void) {
    static int done;
    if (done) return;
    done = 1;
    reward_server_config_default(&cfg);
    if (reward_server_parse_scorers(&cfg, "brightness:2,color_match:1,motion:0.5") != 0) abort();
    cfg.max_frame_bytes = 4096;
    cfg.queue = 3;
    cfg.cache = 4;
    cfg.max_peers = 2;
    cfg.endpoint = "inproc://fuzz";
}

/* A reply must parse; its type is one the server sends; an error has a known code. */
static void check_reply(const char *text, size_t len) {
    if (!text || strlen(text) != len) abort();
    core_wire_frame f = {text, len};
    core_wire_msg m;
    if (core_wire_parse(&f, 1, NULL, &m) != 0) abort();
    if (m.type != CORE_WIRE_ERROR && m.type != CORE_WIRE_HELLO && m.type != CORE_WIRE_SHUTDOWN &&
        m.type != CORE_WIRE_SCORE_REPLY)
        abort();
    if (m.type == CORE_WIRE_ERROR) {
        const char *code = json_string_value(json_object_get(m.header, "code"));
        const char *ok[] = {"bad_request", "unsupported", "scorer_failed", "busy", "internal"};
        int known = 0;
        for (size_t i = 0; code && i < sizeof ok / sizeof ok[0]; i++) known |= !strcmp(code, ok[i]);
        if (!known || !json_is_string(json_object_get(m.header, "reason"))) abort();
    }
    core_wire_msg_free(&m);
}

static void finish(reward_requests *r, pending *p) {
    int ok = 0;
    char *text = reward_requests_reply_text(&p->msg, cfg.scorers, cfg.n_scorers, &ok);
    if (!text) abort();
    check_reply(text, strlen(text));
    reward_peer to[REWARD_MAX_WAITERS];
    int n = reward_requests_done(r, p->slot, p->gen, text, strlen(text), ok, to);
    if (n < 0 || n > REWARD_MAX_WAITERS) abort();
    free(text);
    core_wire_msg_free(&p->msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    reward_requests *r = reward_requests_new(&cfg);
    if (!r) abort();
    pending q[MAX_PENDING];
    int nq = 0;
    size_t held = 0, pos = 0;
    core_wire_limits lim = {REWARD_SERVER_HEADER_BYTES, cfg.max_frame_bytes, cfg.max_frame_bytes + REWARD_SERVER_HEADER_BYTES,
                            REWARD_MAX_FRAMES - 1};
    while (pos < size) {
        const uint8_t op = data[pos++];
        if (op >> 6 == 3) {
            if (nq > 0) {
                held -= q[0].bytes;
                finish(r, &q[0]);
                memmove(q, q + 1, sizeof q[0] * (size_t)--nq);
            }
            continue;
        }
        if (pos + 2 > size) break;
        size_t len = (size_t)data[pos] | ((size_t)data[pos + 1] << 8);
        pos += 2;
        if (len > size - pos) len = size - pos;
        core_wire_frame fr[5];
        const int k = fuzz_cut_frames(data + pos, len, 3, fr);
        pos += len;
        if (k < 0) continue;
        reward_peer peer = {.len = 5};
        memcpy(peer.id, "\0peer", 5);
        peer.id[4] = (uint8_t)('0' + (op & 3));
        const int n = (op >> 2) & 1 ? REWARD_MAX_FRAMES + 1 : k + 1;
        reward_action act;
        if (reward_requests_handle(r, &peer, fr, n, nq, held, &act) != 0) abort();
        switch (act.verb) {
        case REWARD_SEND:
        case REWARD_STOP:
            check_reply(act.reply, act.reply_len);
            if (act.msg.header) abort();
            if (act.repeat) { /* from the cache: exactly what scoring this very request gives */
                core_wire_msg m;
                if (core_wire_parse(fr, n, &lim, &m) != 0 || reward_check_score_request(&m) != 0) abort();
                int ok = 0;
                char *fresh = reward_requests_reply_text(&m, cfg.scorers, cfg.n_scorers, &ok);
                if (!fresh || ok == act.error || strcmp(fresh, act.reply)) abort();
                free(fresh);
                core_wire_msg_free(&m);
            }
            break;
        case REWARD_WAIT:
            if (!act.repeat || act.reply || act.msg.header) abort();
            break;
        case REWARD_SCORE:
            if (act.reply || act.msg.type != CORE_WIRE_SCORE_REQUEST || reward_check_score_request(&act.msg) != 0 ||
                nq >= cfg.queue || (held > 0 && held + act.bytes > reward_server_held_bound(&cfg)))
                abort();
            if (nq == MAX_PENDING) abort(); /* cannot be: cfg.queue < MAX_PENDING */
            q[nq++] = (pending){act.msg, act.slot, act.gen, act.bytes};
            held += act.bytes;
            break;
        default:
            abort();
        }
        free(act.reply);
    }
    for (int i = 0; i < nq; i++) finish(r, &q[i]);
    reward_requests_free(r);
    return 0;
}
