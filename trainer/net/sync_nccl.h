/* trainer/net/sync_nccl.h — the weight sync by NCCL broadcast (parallel.sync nccl, or auto inside one MPI job with a
 * worker on another host; trainer/net/controller.h decides): the controller's process (trainer rank 0, rank 0 of the
 * group) broadcasts each bucket (trainer/net/sync_bucket.h's plan) straight out of its device fp32 master to every
 * rollout worker of the job's communicator, which receives it into its landing buffer, hashes it on the host
 * against the controller's xxh64 and rounds it into its bf16 device weights (rollout/worker_ipc.h).
 *
 * The group: an MPI group of the controller and every worker made by the MPI launch (cli/cmd_mpi_rank.c), and
 * over it an NCCL group (sp/comm_nccl.h) made at the first NCCL sync, collectively with the workers (which make
 * theirs on that sync's weights_begin). Every broadcast is collective over all workers: a sync goes by NCCL only
 * while every worker is there (a lost worker turns it off for the rest of the run). */
#ifndef TRAINER_SYNC_NCCL_H
#define TRAINER_SYNC_NCCL_H

#include <stdint.h>

#include "kernels/dev_ops.h"
#include "model/dit/wan_dit.h"
#include "sp/comm.h"
#include "trainer/net/ctl_msg.h"

/* Whether a sync goes to every worker by NCCL broadcast: mode (core_sync_mode) auto or nccl, the job's group host
 * (NULL: not one MPI launch), bufs (1: the experts sent are the trainer's device buffers; 2: their host copy goes
 * through a device staging buffer, ZeRO stage 3; 0: neither), every worker of st in the group, none lost (a lost one
 * sets *off: no more NCCL syncs) and each able (its hello's "nccl"), and with auto and bufs 1 one of them on another
 * host than host_id (else IPC serves them; a staged sync has no buffer IPC could export, so auto broadcasts it on one
 * host too). 1, or 0 with why (cap bytes). */
int sync_nccl_choose(int mode, const sp_comm *host, int bufs, int *off, const ctl_state *st, const char *host_id,
                     char *why, size_t cap);

/* One NCCL sync: the experts with send[e] (layouts[e]; host[e] the controller's host copy, which the bucket hashes
 * are taken over; dev_bufs[e] the device buffer broadcast out of), as policy `version` with tensors_count `count`,
 * request ids "<tag>-begin" / "<tag>-end", the whole-model hash (16 hex digits). */
typedef struct {
    const wan_layout *const *layouts;
    const float *const *host;
    const void *const *dev_bufs;    /* NULL: each bucket is uploaded from host[e] into staging, then broadcast */
    void *staging;                  /* with dev_bufs NULL: a device buffer of staging_bytes >= one bucket */
    int64_t staging_bytes;
    const uint8_t *send;
    int n_experts;
    int64_t bucket_bytes;
    int adapters, count;
    int64_t version;
    const char *tag, *model_hash;
} sync_nccl_job;

/* Sends weights_begin with "nccl_buckets" (core/wire_sync.h's bucket list with the xxh64 of each over j->host) to
 * every worker of st on router, the broadcasts (sync_nccl_broadcast), then weights_end to each. -1 with core_error:
 * the job cannot go on (a worker that got its weights_begin waits in a broadcast). */
int sync_nccl_send(void *router, const ctl_state *st, sp_comm **nccl, sp_comm *host, const k_dev_ops *dev,
                   const sync_nccl_job *j);

/* The broadcasts of one sync from root 0 of *nccl (made over host on dev and the kernels' stream, k_cuda_stream, when
 * NULL: collective with every worker): the buckets of bucket_bytes over the experts with send[e] (layouts[e]; bufs[e] the device buffer
 * each is read from), in sync_bucket_plan's order, then the device synchronized. bufs NULL (the root's side at ZeRO
 * stage 3, where no device holds a whole master): each bucket uploaded from hsrc[e] (host fp32, the layout's) into
 * staging (device, staging_bytes >= one bucket) and broadcast from there; the workers' side is the same either way.
 * 0, or -1 with core_error (the group could not be made, a broadcast or an upload failed, a bucket larger than the
 * staging: the job cannot go on). */
int sync_nccl_broadcast(sp_comm **nccl, sp_comm *host, const k_dev_ops *dev,
                        const wan_layout *const *layouts, const void *const *bufs, const uint8_t *send, int n_experts,
                        int64_t bucket_bytes, const float *const *hsrc, void *staging, int64_t staging_bytes);

#endif
