/* core/wire.h — the one wire format of every vgrpo channel (docs/design.md section 3; specified for other peers in
 * reward/PROTOCOL.md).
 *
 * A message is a list of frames: frame 0 is a UTF-8 JSON object (the header), then one frame of raw little-endian
 * bytes per tensor. The header has "v" (protocol version, CORE_WIRE_VERSION), "type" (one of core_wire_type),
 * "id" (the sender's request id, a string), type-specific fields, and "tensors": [{"name","dtype","shape"}, ...]
 * describing the tensor frames in order (dtypes as in safetensors: U8, F32, BF16, F16, I64).
 *
 * This module works on plain (pointer, length) frame arrays, so it knows nothing about ZeroMQ: the transport
 * hands it the frames after any routing-id frame. The parser checks everything before anything looks at tensor
 * bytes; its errors name the field that is wrong. */
#ifndef CORE_WIRE_H
#define CORE_WIRE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

#define CORE_WIRE_VERSION 1
/* Longest request id, in bytes of UTF-8. */
#define CORE_WIRE_MAX_ID 128
/* Longest tensor name, in bytes of UTF-8. */
#define CORE_WIRE_MAX_NAME 512

typedef enum {
    CORE_WIRE_HELLO = 0,
    CORE_WIRE_ROLLOUT_REQUEST,
    CORE_WIRE_TRAJECTORY,
    CORE_WIRE_SCORE_REQUEST,
    CORE_WIRE_SCORE_REPLY,
    CORE_WIRE_WEIGHTS_BEGIN,
    CORE_WIRE_WEIGHTS_TENSOR,
    CORE_WIRE_WEIGHTS_END,
    CORE_WIRE_WEIGHTS_ACK,
    CORE_WIRE_ERROR,
    CORE_WIRE_SHUTDOWN,
    CORE_WIRE_WEIGHTS_BUCKET, /* after shutdown: the numbers of the older types stay as they were */
    CORE_WIRE_TYPE_COUNT
} core_wire_type;

/* One frame: borrowed bytes. */
typedef struct {
    const void *data;
    size_t len;
} core_wire_frame;

/* Receive limits, in bytes (and a count). A message over any limit is rejected before its JSON is parsed. */
typedef struct {
    size_t max_header_bytes; /* frame 0 */
    size_t max_frame_bytes;  /* any one tensor frame */
    size_t max_total_bytes;  /* all frames together, header included */
    int max_tensors;         /* tensor frames per message */
} core_wire_limits;

/* Defaults: header 1 MiB, frame 4 GiB, total 8 GiB, 65536 tensors. */
core_wire_limits core_wire_limits_default(void);

/* A tensor of a message. In a parsed message name points into the header and data into the frame (both
 * borrowed); for the builder the caller fills every field. nbytes = prod(shape) * dtype size. */
typedef struct {
    const char *name;
    core_dtype dtype;
    int ndim; /* 0 .. CORE_MAX_DIMS; 0 is a scalar (one element) */
    int64_t shape[CORE_MAX_DIMS];
    const void *data;
    size_t nbytes;
} core_wire_tensor;

/* A parsed message. header is owned (json_decref'd by core_wire_msg_free); id points into it. Tensor data
 * points into the frames given to core_wire_parse, which must outlive the message. */
typedef struct {
    json_t *header;
    core_wire_type type;
    const char *id;
    int n_tensors;
    core_wire_tensor *tensors;
} core_wire_msg;

/* A built message: frames[0] is the header text (owned, header_text), frames[1..] borrow the tensor data. */
typedef struct {
    int n_frames;
    core_wire_frame *frames;
    char *header_text;
} core_wire_built;

/* "hello", "rollout_request", ... ; NULL outside the enum. */
const char *core_wire_type_name(core_wire_type t);
/* The type called `name` (exact), or -1. */
int core_wire_type_from_name(const char *name);

/* Parses and checks a message of n_frames frames (n_frames >= 1; frame 0 is the header) against lim (NULL: the
 * defaults). Checks, in order: frame count within limits, every frame's size and the total within limits (with
 * overflow-safe sums), header is UTF-8 JSON of one object without duplicate keys, "v" == CORE_WIRE_VERSION,
 * "type" a known name, "id" a string of at most CORE_WIRE_MAX_ID bytes (non-empty except for `error`), "tensors"
 * an array (may be absent when there are no tensor frames) of objects with a non-empty unique "name", a known
 * "dtype" and a "shape" of at most CORE_MAX_DIMS non-negative integers, tensor count == n_frames - 1, and each
 * frame's length == prod(shape) x dtype size (computed without overflow). Returns 0 and fills *out (free with
 * core_wire_msg_free), or -1 with core_error("wire: ...") naming the field; *out is then empty. */
int core_wire_parse(const core_wire_frame *frames, int n_frames, const core_wire_limits *lim, core_wire_msg *out);

/* Frees what core_wire_parse filled; safe on an empty (zeroed) message. */
void core_wire_msg_free(core_wire_msg *m);

/* The tensor called `name` in m, or NULL. */
const core_wire_tensor *core_wire_find(const core_wire_msg *m, const char *name);

/* Builds a message: header {"v", "type", "id", the members of `fields` (may be NULL; borrowed, copied), "tensors"}
 * followed by one frame per tensor (borrowing tensors[i].data). fields must not contain "v", "type", "id" or
 * "tensors". Each tensor's nbytes must equal prod(shape) x dtype size, names unique and non-empty. Returns 0 and
 * fills *out (free with core_wire_built_free), or -1 with core_error naming the field or tensor. */
int core_wire_build(core_wire_type type, const char *id, const json_t *fields, const core_wire_tensor *tensors,
                    int n_tensors, core_wire_built *out);

/* Frees what core_wire_build filled; safe on a zeroed struct. */
void core_wire_built_free(core_wire_built *b);

/* Bytes of a tensor of this dtype and shape: returns 0 and sets *nbytes, or -1 (core_error) on a negative
 * dimension or size_t overflow. */
int core_wire_nbytes(core_dtype dt, int ndim, const int64_t *shape, size_t *nbytes);

#endif
