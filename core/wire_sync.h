/* core/wire_sync.h — the same-host (IPC) handshake of a weight sync, on the controller <-> rollout worker channel
 * (reward/PROTOCOL.md section 8; trainer/net/controller.c and rollout/worker_msg.c use it):
 *
 *   hello           the worker adds "host_id" (core_sync_host_id) and "ipc": true when its device can open another
 *                   process's device buffers (a device table with ipc_open, kernels/dev_ops.h);
 *   weights_begin   the controller, for a worker it chose IPC for (core_sync_ipc_choose), adds "ipc": [{"expert":
 *                   "transformer", "handle": 128 hex digits (the device table's ipc_export), "elements": F32
 *                   elements of the expert's flat buffer}, ...] and sends no buckets: weights_end follows at once;
 *                   and "ipc_buckets": [{"expert", "index", "offset", "count", "xxh64"}, ...], the sync's buckets
 *                   (trainer/net/sync_bucket.h's plan at the recipe's bucket size) with the xxh64 of each, computed
 *                   by the controller over its host copy of the weights (which mirrors the exported device buffer
 *                   when the sync starts);
 *   the worker      opens each handle; a worker whose weights are on the device (rollout/worker_ipc.c) copies each
 *                   bucket device to device into its receive buffer, downloads it into one reused host buffer of a
 *                   bucket and hashes it there (the bucket's xxh64, which must equal the header's, and each tensor's
 *                   xxh64 for the whole-model hash), then at weights_end rounds the receive buffer into its bf16
 *                   device weights when the whole-model xxh64 matches; a worker without device weights copies the
 *                   expert's buffer into its staged host copy and hashes the staged model as for buckets. A handle it
 *                   cannot open (another host after all, no peer access, a handle of another backend) is answered at
 *                   weights_end with error code "ipc_refused" and the reason; a bucket whose bytes hash otherwise
 *                   with "weights_mismatch" naming the bucket;
 *   the controller  on "ipc_refused" sends that worker the same sync again in buckets and never offers it IPC again.
 * Version: these are optional fields of CORE_WIRE_VERSION 1 messages; a peer that does not know them ignores them
 * (a worker without "ipc" in its hello is never offered IPC). */
#ifndef CORE_WIRE_SYNC_H
#define CORE_WIRE_SYNC_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes of a device IPC handle (kernels/dev_ops.h K_IPC_HANDLE_BYTES: CUDA's cudaIpcMemHandle_t). */
#define CORE_SYNC_HANDLE_BYTES 64
#define CORE_SYNC_HOST_ID_MAX 128
/* The error code of a worker that cannot open the handles. */
#define CORE_SYNC_IPC_REFUSED "ipc_refused"

/* One expert's exported buffer. */
typedef struct {
    int expert;       /* 0: "transformer", 1: "transformer_2" */
    int64_t elements; /* F32 elements */
    uint8_t handle[CORE_SYNC_HANDLE_BYTES];
} core_sync_ipc;

/* This host's identity: "<hostname>/<boot id>" (/proc/sys/kernel/random/boot_id; the host name alone when it cannot
 * be read), at most CORE_SYNC_HOST_ID_MAX - 1 bytes, into buf (cap bytes). Two processes with equal ids run on one
 * machine since its last boot. */
void core_sync_host_id(char *buf, size_t cap);

/* The "ipc" array of weights_begin for n exported buffers (a new reference; NULL when out of memory). */
json_t *core_sync_ipc_json(const core_sync_ipc *x, int n);

/* Parses weights_begin's "ipc" array (at most cap entries, experts < n_experts, no expert twice, handles of 128 hex
 * digits, elements >= 1) into out[0..*n). 0, or -1 with core_error naming the entry and field. */
int core_sync_ipc_parse(const json_t *arr, int n_experts, core_sync_ipc *out, int cap, int *n);

/* One bucket of an IPC sync (weights_begin "ipc_buckets"): elements [offset, offset + count) of an expert's flat
 * F32 buffer and the controller's xxh64 (seed 0) of their bytes. */
typedef struct {
    int index, expert;
    int64_t offset, count;
    uint64_t xxh64;
} core_sync_bucket;

/* The "ipc_buckets" array of n buckets (a new reference; NULL when out of memory). */
json_t *core_sync_buckets_json(const core_sync_bucket *b, int n);
/* Parses "ipc_buckets" into *out (malloc'd, *n entries; free it): indices 0, 1, ... in order, experts < n_experts,
 * offset >= 0, count >= 1, xxh64 16 hex digits. Whether they cover the experts is the caller's check. 0, or -1 with
 * core_error naming the entry and field. */
int core_sync_buckets_parse(const json_t *arr, int n_experts, core_sync_bucket **out, int *n);

/* What each side knows when a sync is planned. */
typedef struct {
    const char *host_id;  /* NULL or "": unknown */
    int ipc;              /* controller: its weights are on a device it can export; worker: its hello said "ipc" */
    const char *refused;  /* worker: the reason it refused IPC before (NULL: never) */
} core_sync_side;

/* 1 when the controller offers the worker IPC: both sides IPC-capable, the same non-empty host id, never refused.
 * Else 0, and why (cap bytes) names the first reason, e.g. "the worker is on another host (a/1 vs b/2)". */
int core_sync_ipc_choose(const core_sync_side *ctl, const core_sync_side *worker, char *why, size_t cap);

#endif
