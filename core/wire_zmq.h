/* core/wire_zmq.h — moving core/wire.h messages over ZeroMQ sockets: receive a whole multipart message (with the
 * routing-id frame on a ROUTER), send a built message, send an `error` reply (reward/PROTOCOL.md sections 1, 2, 6),
 * bind with a private ipc:// socket file. Authentication (CURVE keys, the ZAP handler) is core/curve.h. */
#ifndef CORE_WIRE_ZMQ_H
#define CORE_WIRE_ZMQ_H

#include <stddef.h>
#include <zmq.h>

#include "core/wire.h"

#define CORE_ZMQ_MAX_FRAMES 65538

/* A received multipart message: n frames (the routing id first when received with has_rid), owned. */
typedef struct {
    int n;
    zmq_msg_t *frames;
} core_zmq_msg;

/* Receives one whole multipart message (flags: 0 or ZMQ_DONTWAIT for the first frame). Returns 0, 1 when nothing
 * was waiting (ZMQ_DONTWAIT / time-out), or -1 with core_error (socket failure, more than CORE_ZMQ_MAX_FRAMES
 * frames: the rest are drained and dropped). */
int core_zmq_recv(void *sock, int flags, core_zmq_msg *out);
void core_zmq_msg_close(core_zmq_msg *m);

/* Parses m's frames from index `first` (1 after a routing id, else 0) with core_wire_parse. */
int core_zmq_parse(const core_zmq_msg *m, int first, const core_wire_limits *lim, core_wire_msg *out);

/* Sends b, prefixed by the routing id rid (NULL: none, for DEALER sockets). -1 with core_error on failure. */
int core_zmq_send(void *sock, const void *rid, size_t rid_len, const core_wire_built *b);

/* core_zmq_send with ZMQ_DONTWAIT on every frame: a reply to a peer that is gone or does not read (its queue is
 * full) fails at once (-1 with core_error) instead of blocking, so one peer cannot stall a server. */
int core_zmq_send_nowait(void *sock, const void *rid, size_t rid_len, const core_wire_built *b);

/* Binds sock at endpoint. For ipc://PATH the socket file gets mode 0600 whatever the process's umask (it is bound
 * under umask 077, then chmod 0600), so only this user can connect to it; the umask is process-wide, so a file
 * another thread creates during the bind gets 077 too. -1 with core_error naming the endpoint. */
int core_zmq_bind(void *sock, const char *endpoint);

/* Builds and sends an `error` reply {code, reason, retryable false}. */
int core_zmq_send_error(void *sock, const void *rid, size_t rid_len, const char *id, const char *code,
                        const char *reason);
/* The same without blocking (core_zmq_send_nowait): for replies to unexpected messages. */
int core_zmq_send_error_nowait(void *sock, const void *rid, size_t rid_len, const char *id, const char *code,
                               const char *reason);

/* Builds and sends a message of `type` with fields (may be NULL) and no tensors. */
int core_zmq_send_fields(void *sock, const void *rid, size_t rid_len, core_wire_type type, const char *id,
                         const json_t *fields);

#endif
