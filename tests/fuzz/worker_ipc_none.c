/* tests/fuzz/worker_ipc_none.c — the fuzz build's rollout/worker_ipc.h without a device: the fuzzed rollout/
 * worker_msg.c links against the parsers only (no device table, NCCL or DiT executor). Its worker has no device
 * (w->dx NULL), so weights_begin never takes the device paths; if it did, the update is refused as a worker without
 * a device would refuse it. */
#include <stdio.h>
#include <stdlib.h>

#include "rollout/worker_ipc.h"

void rollout_worker_ipc_device(rollout_worker_state *w, const json_t *ipc, const json_t *buckets) {
    w->upd_ipc_refused = 1;
    snprintf(w->upd_error, sizeof w->upd_error, "weights_begin: IPC offered, but this worker has no device");
}

void rollout_worker_nccl_device(rollout_worker_state *w, const json_t *buckets) {
    snprintf(w->upd_error, sizeof w->upd_error, "weights_begin: an NCCL sync, but this worker has no device");
}

int rollout_worker_ipc_finish(rollout_worker_state *w, uint64_t want, uint64_t *got, char *why, size_t cap) {
    *got = 0;
    snprintf(why, cap, "weights_end: a device update, but this worker has no device");
    return -1;
}

void rollout_worker_ipc_abandon(rollout_worker_state *w) { w->upd_written[0] = w->upd_written[1] = 0; }

void rollout_worker_ipc_free(rollout_worker_state *w) {
    free(w->hbuf);
    w->hbuf = NULL, w->hbuf_n = 0;
}
