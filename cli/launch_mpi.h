/* cli/launch_mpi.h — a whole run as ONE MPI job (cli/launch_mpi.c): `vgrpo run RECIPE --launcher mpirun
 * [--hostfile FILE]` replaces itself with one MPMD `mpirun` whose app contexts are the trainer ranks, the rollout
 * workers and the reward server, each a `vgrpo mpi-rank` process; `srun ... vgrpo mpi-rank RECIPE` starts the same
 * processes with the roles taken from rank ranges. The supervisor path (cli/colocated.c) is unchanged. */
#ifndef CLI_LAUNCH_MPI_H
#define CLI_LAUNCH_MPI_H

#include <stdint.h>

#include "core/recipe.h"

/* Refusals of an MPI launch that need no process (mode local: the MPI launch runs the colocated processes). -1 with
 * core_error. */
int launch_mpi_check(const core_recipe *r);

/* The job's nodes as mpirun places it over hostfile (core/gpu_assign.h: the per-node GPU plan): each host line
 * "NAME [slots=N] ..." (OpenMPI's form; '#' starts a comment; a host without slots= counts 1 slot; a host named
 * again adds its slots), filled slot by slot in line order with the ranks in app order (the trainer ranks, the
 * rollout workers, the reward server), as mpirun's default by-slot mapping does. Registered with
 * core_gpu_set_nodes as the launcher's view (self -1). 0, or -1 with core_error naming the file (and line): no host,
 * a bad slots value, fewer slots than processes. */
int launch_mpi_nodes(const char *hostfile, const core_recipe *r);

/* `vgrpo run --launcher mpirun`: prints the mpirun command line and the job's shape, then execs `mpirun` (the run
 * folder's lock, core_run_lock_share, stays held by mpirun until the job ends). hostfile NULL: this machine only
 * (shared memory between the trainer ranks, MPI's out-of-band channel on loopback, --oversubscribe past the cores);
 * bind_host NULL: each server picks its address (core/host_addr.h). recipe_path, sets, steps and resume are passed
 * to every rank. Returns only on failure: -1 with core_error. */
int launch_mpi_exec(const char *recipe_path, const char *const *sets, int n_sets, const core_recipe *r, int64_t steps,
                    const char *resume, const char *hostfile, const char *bind_host);

#endif
