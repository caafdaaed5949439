/* core/gpu_assign.h — which GPU each process of a job uses (model.device cuda): parallel.gpus (device indices, as
 * CUDA numbers them in the process's environment; absent: the visible devices 0, 1, ...) and parallel.share_gpus.
 *
 * The processes that need a GPU: mode local, the one process (trainer and in-process rollouts: gpus[0]); mode
 * colocated, the T = parallel.trainer_ranks trainer ranks and the W = parallel.rollout_workers rollout workers (the
 * reward server runs on the CPU). The plan:
 *   separate (share_gpus false, the default): a GPU each; trainer rank r on gpus[r], rollout worker w on
 *            gpus[T + w]; needs T + W GPUs;
 *   shared   (share_gpus true): trainer rank r on gpus[r] (never two trainer ranks on one GPU: a collective
 *            library pairs ranks with devices), rollout worker w on gpus[w mod n] (n the GPUs in the list: with n = T
 *            worker w shares trainer rank w's GPU), taking turns with it (the rollout phase, then the training phase:
 *            each releases its activations between phases); needs T GPUs.
 * A worker of a job without trainer ranks (`vgrpo eval --workers N`) takes the GPUs in turn: worker w on gpus[w mod n].
 * Refused (the dry run and every process at start-up): more processes than GPUs without sharing, more trainer ranks
 * than GPUs, a negative or repeated index, an index past the visible devices when their number is known
 * (CUDA_VISIBLE_DEVICES set; else the CUDA backend checks the index when it opens it).
 *
 * How a process gets its GPU: it computes its own entry of the plan (core_gpu_select: its role and index, the
 * recipe) and sets CORE_GPU_ENV, which the CUDA backend reads when it opens the device (kernels/cuda/init.c; default
 * 0); the launchers pass nothing. Every process logs its assignment at start-up (the emulated device too, whose
 * devices are all the same host memory). */
#ifndef CORE_GPU_ASSIGN_H
#define CORE_GPU_ASSIGN_H

#include <stdio.h>

#include "core/recipe.h"

#define CORE_GPU_ENV "VGRPO_CUDA_DEVICE"

typedef enum { CORE_GPU_TRAINER = 0, CORE_GPU_WORKER = 1 } core_gpu_role;

typedef struct {
    int n_trainer, n_workers; /* processes that need a GPU: trainer ranks (1 in local mode), rollout workers (0 local) */
    int shared;               /* parallel.share_gpus */
    int listed;               /* 1: parallel.gpus given */
    int visible;              /* visible devices (CUDA_VISIBLE_DEVICES), -1 unknown */
    int n;                    /* GPUs in the pool */
    const int64_t *gpus;      /* parallel.gpus [n] (NULL: 0 .. n - 1) */
} core_gpu_plan;

/* The number of devices CUDA_VISIBLE_DEVICES names (its comma-separated entries; 0 for an empty value), or -1 when
 * it is not set. */
int core_gpu_visible(void);

/* The plan of recipe r (model.device cuda; visible: core_gpu_visible's value). 0, or -1 with an error naming
 * parallel.gpus / parallel.share_gpus and the counts. r must outlive p. */
int core_gpu_plan_make(const core_recipe *r, int visible, core_gpu_plan *p);
/* The device index of trainer rank / rollout worker `index`. */
int core_gpu_of(const core_gpu_plan *p, core_gpu_role role, int index);
/* The plan as lines ("GPU assignment (...): trainer rank 0 -> GPU 0 ..."), to f. */
void core_gpu_plan_print(FILE *f, const core_gpu_plan *p);

/* A rollout worker's index from its id "worker-N" (the launchers' names: cli/job.c, cli/launch_mpi_roles.c), or -1
 * for another id (a worker started by hand: it keeps CORE_GPU_ENV as its environment has it, else GPU 0). */
int core_gpu_worker_index(const char *id);

/* For the process that is `role` number `index` of r's job (model.device cuda; a no-op otherwise): its GPU from the
 * plan, exported as CORE_GPU_ENV for the CUDA backend, and one log line naming the process, the GPU and its source.
 * 0, or -1 with the plan's error. */
int core_gpu_select(const core_recipe *r, core_gpu_role role, int index);

#endif
