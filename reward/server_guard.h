/* reward/server_guard.h — the reward server's bounds on connections and memory (reward/PROTOCOL.md section 3),
 * which libzmq alone does not give: ZMQ_MAXMSGSIZE bounds one frame and ZMQ_RCVHWM the complete messages queued
 * per connection, but neither the number of connections nor the frames of one message (libzmq keeps every frame
 * of a message until its last arrives, and counts the message against the high-water mark only then).
 *
 *   - Connections: a socket monitor (ZMQ_EVENT_ACCEPTED / ZMQ_EVENT_DISCONNECTED, with the connection's fd) keeps
 *     the set of open connections, and a ZAP handler (ZeroMQ RFC 27, inproc://zeromq.zap.01, asked for every
 *     handshake because the ROUTER has a ZAP domain) refuses the handshake of a connection while max_peers peers
 *     are admitted. A refused peer gets a ZMTP ERROR and is disconnected before it can send a message. Only
 *     authenticated peers count: a connection counts from its admission (the ZAP request names no fd, so an
 *     admission counts on its own until a message ties it to its connection: reward_guard_authenticated, at most
 *     10 s) until it closes. Unauthenticated connections (in their handshake, or never sending a message) are
 *     bounded apart: at most 2 x max_peers + 8 open, the oldest dropped for a newer one, and libzmq closes one
 *     whose handshake has not finished after ZMQ_HANDSHAKE_IVL; so idle raw connections cannot lock key holders
 *     out.
 *   - Memory: the server's resident size (/proc/self/statm) is read every 10 ms; when it exceeds its size at start
 *     plus the budget, every open connection is shut down (shutdown(2) on the fds the monitor reported), which
 *     makes libzmq free what they were sending. Clients reconnect and re-send with the same ids (the reply cache
 *     outlives connections), so a well-behaved client loses time, not answers.
 *
 * Single-threaded: the server's socket thread owns it. */
#ifndef REWARD_SERVER_GUARD_H
#define REWARD_SERVER_GUARD_H

#include <stddef.h>
#include <zmq.h>

typedef struct reward_guard reward_guard;

/* Must be called before `router` binds: binds the ZAP handler in ctx (one per context), sets ZMQ_ZAP_DOMAIN
 * CORE_CURVE_ZAP_DOMAIN on the router, and starts its monitor. max_peers >= 1; budget_bytes: allowed growth of
 * resident memory over the size now. allow_z85: NULL for a plain (NULL-mechanism) router; else the one client
 * public key (Z85) admitted, whose connections get the ZAP user id CORE_CURVE_USER_ID (the router must be a CURVE
 * server: core_curve_server). The handler makes core/curve.c's allow-list checks (domain, CURVE, key) as well as
 * the connection limit, since a context has one handler. Returns the guard, or NULL with core_error. */
reward_guard *reward_guard_open(void *ctx, void *router, int max_peers, size_t budget_bytes, const char *allow_z85);

/* The guard's two sockets (ZAP handler, monitor), for the caller's zmq_poll: fills items[0..2). */
void reward_guard_pollitems(reward_guard *g, zmq_pollitem_t items[2]);

/* Reads every pending monitor event and answers every pending ZAP request. Call when either polled readable. */
void reward_guard_serve(reward_guard *g);

/* A message that passed authentication (with keys: the run's ZAP user id; without: any) came from connection fd
 * (zmq_msg_get ZMQ_SRCFD of one of its frames): fd counts as an admitted peer until it closes. */
void reward_guard_authenticated(reward_guard *g, int fd);

/* Checks the resident size (at most every 10 ms); over the bound, drops every open connection (at most every
 * 200 ms; in between, returns freed heap to the system). Returns the connections dropped now. */
int reward_guard_check_memory(reward_guard *g);

/* Counters: handshakes refused (over max_peers, or not the allowed key) and unauthenticated connections dropped
 * past their bound, connections dropped by the memory bound; and the bound on resident memory in bytes. */
long long reward_guard_refused(const reward_guard *g);
long long reward_guard_dropped(const reward_guard *g);
size_t reward_guard_bound(const reward_guard *g);

/* Stops the monitor and closes the guard's sockets (before the router is closed); NULL is a no-op. */
void reward_guard_close(reward_guard *g);

#endif
