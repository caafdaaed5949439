/* cli/launch_mpi_rank.h — one rank of a run launched as one MPI job (`vgrpo mpi-rank`; the steps are listed at the
 * top of cli/launch_mpi.c): the rank's state and the parts cli/cmd_mpi_rank.c runs in order, from
 * cli/launch_mpi_startup.c (the start-up's collectives: steps 1-6) and cli/launch_mpi_roles.c (step 7: the roles).
 * Not a public interface: these three files and cli/launch_mpi.c (the role names) are its users. */
#ifndef CLI_LAUNCH_MPI_RANK_H
#define CLI_LAUNCH_MPI_RANK_H

#include <signal.h>
#include <stddef.h>

#include "core/curve.h"
#include "core/recipe.h"
#include "sp/comm.h"
#include "trainer/net/controller.h"
#include "trainer/run/run.h"

#define REC 512               /* one rank's record in a start-up all-gather: a status, a host name or an endpoint */

typedef enum { ROLE_TRAINER = 0, ROLE_WORKER = 1, ROLE_REWARD = 2, N_ROLES = 3 } launch_role;
/* Each role's name as --role spells it, by launch_role. */
extern const char *const launch_role_names[N_ROLES];

typedef struct {
    const core_recipe *r;
    const char *bind_host;  /* --bind-host, or NULL */
    sp_comm *world;         /* a duplicate of MPI_COMM_WORLD: the start-up only */
    sp_comm *group;         /* this role's ranks */
    sp_comm *sync;          /* model.device cuda: trainer rank 0 (rank 0) and the workers, for NCCL weight syncs;
                             * NULL on the other ranks */
    int rank, size;         /* in the world */
    launch_role role;
    int role_rank;          /* index among this role's ranks (worker-K) */
    int n_role[N_ROLES];
    int local_same_role;    /* processes of this role on this host (this one included) */
    launch_role *roles;     /* per world rank */
    char (*hosts)[REC];     /* per world rank */
    int reward_rank;        /* world rank of the reward server, -1: external reward.endpoint */
    core_curve_keys keys;   /* this rank's subset */
    int exchanged;          /* step 6 done (or failed) */
    char ctl_ep[REC], rew_ep[REC], addr_how[128];
} launch;

/* ---- the start-up (cli/launch_mpi_startup.c): collectives over the world, every rank calls them together ---- */

/* An MPI failure during the start-up (not a rank's own error: the collective itself): prints it, MPI_Abort. */
void launch_fatal(const launch *L, const char *what);
/* Every rank's status (failed: this rank's core_last_error). 0 when every rank succeeded; else -1 with core_error
 * naming the first failing rank. */
int launch_all_ok(launch *L, int failed, const char *what);
/* Step 2: every rank's role and host, this rank's role, index and neighbours on its host. -1 with core_error (the
 * same on every rank, except a --role that disagrees). */
int launch_find_roles(launch *L, const char *role_opt);
/* Step 5: the keys, from rank 0 to each rank (its role's subset). -1 with core_error on this rank. */
int launch_share_keys(launch *L);
/* Step 6: all-gather of the endpoints (mine: this rank's bound endpoint, "" for none, NULL after a failure, whose
 * core_last_error is sent), then the world's duplicate is freed. Fills ctl_ep and rew_ep. -1 with core_error when
 * any rank failed. */
int launch_exchange(launch *L, const char *mine);
/* This host's address for a server (core/host_addr.h) as "tcp://ADDR:*" into ep (cap bytes). -1 with core_error. */
int launch_bind_endpoint(launch *L, char *ep, size_t cap);

/* ---- the roles (cli/launch_mpi_roles.c): step 7 ---- */

/* Output of a worker or the reward server into logging.run_dir/logs/NAME.log. -1 with core_error. */
int launch_redirect_output(const char *run_dir, const char *name);
/* Trainer rank 0's SIGUSR1 (the controller's wait ends: launch_abort_check) and SIGUSR2 (as SIGTERM) handlers. */
void launch_on_usr1(int sig);
void launch_on_usr2(int sig);
/* The controller's abort check (ctl_open's; as `vgrpo trainer`'s). */
int launch_abort_check(void *ctx);
/* Trainer rank 0 at the end: `shutdown` to the reward server, with the client keys; waits for its answer. -1 with
 * core_error. */
int launch_stop_reward_server(const launch *L);
/* The trainer role after the exchange; *clean_fail = 1 when every trainer rank finished (parity past its tolerance,
 * a run stopped by a signal). Returns trainer_run's value (0, 1) or -1. */
int launch_run_trainer(launch *L, const trainer_run_opts *o, ctl_server *ctl, int *clean_fail);
/* The reward-server role: binds, exchanges, serves until trainer rank 0's shutdown. -1 with core_error. */
int launch_run_reward(launch *L, const core_recipe *r);
/* The worker role after the exchange. -2: it failed before its hello (the job must end), -1: later. */
int launch_run_worker(launch *L, const core_recipe *r);

#endif
