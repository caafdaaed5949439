/* trainer/net/sync_nccl.c — the weight sync by NCCL broadcast (see trainer/net/sync_nccl.h). */
#include "trainer/net/sync_nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/recipe.h"
#include "core/wire_zmq.h"
#include "kernels/cuda/k_cuda.h"
#include "sp/comm_nccl.h"
#include "trainer/net/sync_bucket.h"

int sync_nccl_broadcast(sp_comm **nccl, sp_comm *host, const k_dev_ops *dev,
                        const wan_layout *const *layouts, const void *const *bufs, const uint8_t *send, int n_experts,
                        int64_t bucket_bytes, const float *const *hsrc, void *staging, int64_t staging_bytes) {
    if (!*nccl) {
        const sp_nccl_opts o = {.stream = k_cuda_stream(), .dev = dev, .reduce = SP_REDUCE_EXACT};
        if (sp_comm_nccl_world(host, &o, nccl)) return core_error_push("weight sync by NCCL: the group: ");
    }
    const int nb = sync_bucket_plan(layouts, send, n_experts, bucket_bytes, NULL, 0);
    if (nb < 0) return -1;
    sync_bucket *bk = malloc(sizeof *bk * (size_t)(nb ? nb : 1));
    if (!bk) return core_error("out of memory");
    int rc = sync_bucket_plan(layouts, send, n_experts, bucket_bytes, bk, nb) == nb ? 0 : -1;
    for (int k = 0; k < nb && !rc; k++) { /* in place on the root: its buffer is read, not written */
        float *src;
        if (bufs) {
            src = (float *)bufs[bk[k].expert] + bk[k].offset;
        } else { /* staged from the host copy */
            const size_t b = (size_t)bk[k].count * sizeof(float);
            src = staging;
            if (!hsrc || !hsrc[bk[k].expert] || !staging || (int64_t)b > staging_bytes) {
                rc = core_error("weight sync by NCCL: bucket %d (%zu bytes) has no host source or staging of its size",
                                bk[k].index, b);
                break;
            }
            if (dev->mem_upload(src, hsrc[bk[k].expert] + bk[k].offset, b)) {
                rc = core_error_push("weight sync by NCCL: bucket %d to the staging: ", bk[k].index);
                break;
            }
        }
        if (sp_comm_broadcast(*nccl, src, (size_t)bk[k].count, SP_F32, 0))
            rc = core_error_push("weight sync by NCCL: bucket %d: ", bk[k].index);
    }
    if (!rc && dev->mem_sync()) rc = core_error_push("weight sync by NCCL: ");
    free(bk);
    return rc;
}

int sync_nccl_choose(int mode, const sp_comm *host, int bufs, int *off, const ctl_state *st, const char *host_id,
                     char *why, size_t cap) {
    if (mode != CORE_SYNC_AUTO && mode != CORE_SYNC_NCCL) return snprintf(why, cap, "parallel.sync"), 0;
    if (!host) return snprintf(why, cap, "the workers are not in the job's communicator (not one MPI launch)"), 0;
    if (*off) return snprintf(why, cap, "a worker was lost, and a broadcast needs every worker"), 0;
    if (!bufs)
        return snprintf(why, cap, "the weights of this sync are not the trainer's device buffers (nor is there a device "
                        "staging buffer for its host copy)"), 0;
    if (st->n != host->size - 1)
        return snprintf(why, cap, "%d worker(s) said hello, the job's group has %d", st->n, host->size - 1), 0;
    int other = 0;
    for (int w = 0; w < st->n; w++) {
        if (st->w[w].lost) {
            *off = 1;
            return snprintf(why, cap, "%s was lost, and a broadcast needs every worker", st->w[w].id), 0;
        }
        if (!st->w[w].nccl) /* no device weights, or no landing buffer (rollout_worker_land_reserve; its log says) */
            return snprintf(why, cap, "%s takes no NCCL syncs (no device weights or no landing buffer)", st->w[w].id), 0;
        other |= strcmp(st->w[w].host_id, host_id) != 0;
    }
    /* a staged sync (bufs 2) has no device buffer to export: IPC cannot serve it, the broadcast can */
    if (mode == CORE_SYNC_AUTO && !other && bufs == 1)
        return snprintf(why, cap, "every worker is on this host (CUDA IPC)"), 0;
    return 1;
}

int sync_nccl_send(void *router, const ctl_state *st, sp_comm **nccl, sp_comm *host, const k_dev_ops *dev,
                   const sync_nccl_job *j) {
    json_t *nb = sync_bucket_hashes_json(j->layouts, j->host, j->send, j->n_experts, j->bucket_bytes);
    if (!nb) return -1;
    char id[64];
    int rc = 0;
    for (int w = 0; w < st->n && !rc; w++) {
        const ctl_worker *wk = &st->w[w];
        snprintf(id, sizeof id, "%s-begin", j->tag);
        json_t *f = json_pack("{s:I, s:i, s:O}", "policy_version", (json_int_t)j->version, "tensors_count", j->count,
                              "nccl_buckets", nb);
        if (f && j->adapters) json_object_set_new(f, "adapter", json_true());
        rc = !f ? core_error("out of memory")
                : core_zmq_send_fields(router, wk->rid, wk->rid_len, CORE_WIRE_WEIGHTS_BEGIN, id, f)
                    ? core_error_push("controller: weights (NCCL) to %s: ", wk->id)
                    : 0;
        json_decref(f);
    }
    json_decref(nb);
    if (!rc)
        rc = sync_nccl_broadcast(nccl, host, dev, j->layouts, j->dev_bufs, j->send, j->n_experts, j->bucket_bytes,
                                 j->host, j->staging, j->staging_bytes);
    for (int w = 0; w < st->n && !rc; w++) {
        const ctl_worker *wk = &st->w[w];
        snprintf(id, sizeof id, "%s-end", j->tag);
        json_t *f = json_pack("{s:I, s:s}", "policy_version", (json_int_t)j->version, "model_xxh64", j->model_hash);
        if (core_zmq_send_fields(router, wk->rid, wk->rid_len, CORE_WIRE_WEIGHTS_END, id, f))
            rc = core_error_push("controller: weights (NCCL) to %s: ", wk->id);
        json_decref(f);
    }
    return rc;
}
