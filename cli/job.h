/* cli/job.h — the processes of a multi-process job (`vgrpo eval`, `vgrpo run` colocated, `vgrpo parity`;
 * DESIGN.md section 3): a short private folder for the ipc:// endpoints, the reward server (unless the recipe names
 * an external reward.endpoint, which is then not the job's process: its outages are retried by the workers), the
 * rollout workers, each process's log under LOG_DIR, and the abort check the controller polls (a signal, or any of
 * the job's processes exiting: the error names it and its log). */
#ifndef CLI_JOB_H
#define CLI_JOB_H

#include <signal.h>

#include "cli/supervisor.h"
#include "core/recipe.h"

typedef struct {
    sup_procs procs;
    char sockdir[64];              /* /tmp/vgrpo-XXXXXX */
    char ctl_ep[160], rew_ep[160]; /* controller ROUTER, reward server */
    int reward_proc;               /* index in procs, or -1 (external) */
    volatile sig_atomic_t *stop;   /* set by the caller's signal handler */
} job;

/* Creates the socket folder and the endpoints (reward: r->reward_endpoint or ipc://SOCKDIR/reward). */
int job_init(job *j, const core_recipe *r, volatile sig_atomic_t *stop);

/* Starts `vgrpo reward-server` with the recipe's scorers, weights and reward.threads (none when external). */
int job_start_reward(job *j, const core_recipe *r, const char *log_dir);

/* Starts n `vgrpo rollout-worker` processes (ids worker-0..n-1) for the recipe file with the --set overrides and
 * optional transformer folder, each with `threads` OpenMP threads. */
int job_start_workers(job *j, const char *recipe_path, const char *const *sets, int n_sets, const char *transformer,
                      int n, int threads, const char *log_dir);

/* The controller's abort check (ctx = the job): non-zero with core_error when *stop is set or a process exited. */
int job_abort_check(void *ctx);

/* SIGTERM to the reward server, then waits up to timeout_s for every process (SIGTERM, SIGKILL after), and removes
 * the socket folder. */
void job_stop(job *j, double timeout_s);

/* Cores for OpenMP per process when `procs` compute-heavy processes share this machine (>= 1). */
int job_threads_per_process(int procs);

#endif
