/* core/gpu_assign.h — which GPU each process of a job uses (model.device cuda): parallel.gpus (device indices, as
 * CUDA numbers them in the process's environment; absent: the visible devices 0, 1, ...) and parallel.share_gpus.
 *
 * The processes that need a GPU: mode local, the one process (trainer and in-process rollouts: gpus[0]); mode
 * colocated, the T = parallel.trainer_ranks trainer ranks and the W = parallel.rollout_workers rollout workers (the
 * reward server runs on the CPU).
 *
 * GPUs are numbered PER NODE: parallel.gpus and the visible devices are each node's own (every node reads its own
 * CUDA_VISIBLE_DEVICES), and the plan below is made for the processes of one node, T and W being the trainer ranks
 * and workers on that node and a process's index its index among its role's processes on that node (its node-local
 * rank within its role). The nodes come from whoever starts the processes (core_gpu_set_nodes): the MPI launch groups
 * its ranks by MPI's shared-memory node (MPI_Comm_split_type, cli/launch_mpi_startup.c), `vgrpo run --launcher mpirun
 * --hostfile FILE --dry-run` by the hostfile's slots, filled in order as mpirun's default mapping does (trainer ranks
 * first); the supervisor starts every process on its own host, so without a call the job is one node. The plan:
 *   separate (share_gpus false, the default): a GPU each; trainer rank r on gpus[r], rollout worker w on
 *            gpus[T + w]; needs T + W GPUs;
 *   shared   (share_gpus true): trainer rank r on gpus[r] (never two trainer ranks on one GPU: a collective
 *            library pairs ranks with devices), rollout worker w on gpus[w mod n] (n the GPUs in the list: with n = T
 *            worker w shares trainer rank w's GPU), taking turns with it (the rollout phase, then the training phase:
 *            each releases its activations between phases); needs T GPUs.
 * A worker of a job without trainer ranks (`vgrpo eval --workers N`) takes the GPUs in turn: worker w on gpus[w mod n].
 * Refused (the dry run and every process at start-up), naming the node and its counts when the job has several: more
 * processes on a node than GPUs without sharing, more trainer ranks on a node than GPUs, a negative or repeated
 * index, an index past the visible devices when their number is known (CUDA_VISIBLE_DEVICES set; else the CUDA
 * backend checks the index when it opens it).
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
    const char *node;         /* the node's name (core_gpu_set_nodes), NULL: the whole job on one node */
    int n_trainer, n_workers; /* processes on the node that need a GPU: trainer ranks (1 in local mode), rollout
                               * workers (0 local) */
    int shared;               /* parallel.share_gpus */
    int listed;               /* 1: parallel.gpus given */
    int visible;              /* visible devices (CUDA_VISIBLE_DEVICES), -1 unknown */
    int n;                    /* GPUs in the pool */
    const int64_t *gpus;      /* parallel.gpus [n] (NULL: 0 .. n - 1) */
} core_gpu_plan;

/* The number of devices CUDA_VISIBLE_DEVICES names (its comma-separated entries; 0 for an empty value), or -1 when
 * it is not set. */
int core_gpu_visible(void);

/* One node of a job: its name (a host name, a hostfile's host, VGRPO_NODE's value) and how many of the job's trainer
 * ranks and rollout workers run there. */
#define CORE_GPU_NODE_NAME_MAX 64
typedef struct {
    char name[CORE_GPU_NODE_NAME_MAX];
    int n_trainer, n_workers;
} core_gpu_node;

/* The environment variable that names a process's node for the MPI launch instead of MPI's shared-memory node
 * (tests simulate several nodes on one host with it; a cluster may use it where host names mislead). */
#define CORE_GPU_NODE_ENV "VGRPO_NODE"

/* The job's nodes (copied; n >= 1) and this process's place: self its node (-1: a launcher that runs on none, the
 * dry run), local its index among the processes of its role on that node. Until called (and after n 0) the job is
 * one node. 0, or -1 with core_error (out of memory, self out of range). */
int core_gpu_set_nodes(const core_gpu_node *nodes, int n, int self, int local);

/* The plan of recipe r (model.device cuda; visible: core_gpu_visible's value) for this process's node; one node
 * (no core_gpu_set_nodes): the whole job. A launcher (self -1) checks every node and gets the plan of the node with
 * the most processes. 0, or -1 with an error naming parallel.gpus / parallel.share_gpus and the counts (and the node
 * when there are several). r must outlive p. */
int core_gpu_plan_make(const core_recipe *r, int visible, core_gpu_plan *p);
/* The plan of r for one node's processes (n_trainer trainer ranks, n_workers workers; node: its name for errors, or
 * NULL). Errors as core_gpu_plan_make's. */
int core_gpu_plan_node(const core_recipe *r, int visible, const char *node, int n_trainer, int n_workers,
                       core_gpu_plan *p);
/* The device index of trainer rank / rollout worker `index` (its index among its role's processes on p's node). */
int core_gpu_of(const core_gpu_plan *p, core_gpu_role role, int index);
/* The plan as lines ("GPU assignment (...): trainer rank 0 -> GPU 0 ..."), to f: the one node's, or with several
 * nodes (core_gpu_set_nodes) each node's under its name, every node's plan made with visible (the processes
 * numbered over the job in node order, as mpirun's default mapping places them). -1 with core_error when a node's
 * plan is refused (nothing printed). */
int core_gpu_plan_print(FILE *f, const core_recipe *r, int visible);

/* A rollout worker's index from its id "worker-N" (the launchers' names: cli/job.c, cli/launch_mpi_roles.c), or -1
 * for another id (a worker started by hand: it keeps CORE_GPU_ENV as its environment has it, else GPU 0). */
int core_gpu_worker_index(const char *id);

/* For the process that is `role` number `index` of r's job (model.device cuda; a no-op otherwise): its GPU from the
 * plan of its node (with core_gpu_set_nodes: its index on the node, not `index`), exported as CORE_GPU_ENV for the
 * CUDA backend, and one log line naming the process, the GPU, its node and the source. 0, or -1 with the plan's
 * error. */
int core_gpu_select(const core_recipe *r, core_gpu_role role, int index);

#endif
