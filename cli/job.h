/* cli/job.h — the processes of a multi-process job (`vgrpo eval`, `vgrpo run` colocated, `vgrpo parity`;
 * docs/design.md section 3): a short private folder for the ipc:// endpoints, the reward server (unless the recipe names
 * an external reward.endpoint, which is then not the job's process: its outages are retried by the workers), the
 * rollout workers, each process's log under LOG_DIR, and the abort check the controller polls (a signal, or any of
 * the job's processes exiting: the error names it and its log).
 *
 * Keys (core/curve.h): job_init generates the run's CURVE keys; every process gets its role's subset through an
 * inherited memfd named by `--keys-fd N` (never the environment or the command line): the workers the client
 * pair, the reward server the reward pair, the trainer (colocated.c) the controller pair; `vgrpo eval` binds the
 * controller itself with job_keys(CORE_CURVE_CONTROLLER). An external reward server (reward.endpoint) holds no key
 * of this run: the workers reach it in plain ZeroMQ (see README). The socket folder is mkdtemp's 0700 and every
 * ipc:// socket file in it 0600 (core_zmq_bind). */
#ifndef CLI_JOB_H
#define CLI_JOB_H

#include <signal.h>

#include "cli/supervisor.h"
#include "core/curve.h"
#include "core/recipe.h"

typedef struct {
    sup_procs procs;
    char sockdir[64];              /* /tmp/vgrpo-XXXXXX */
    char ctl_ep[160], rew_ep[160]; /* controller ROUTER, reward server */
    int reward_proc;               /* index in procs, or -1 (external) */
    int worker_first, n_workers;   /* the rollout workers: procs indices worker_first .. + n_workers (job_start_workers) */
    volatile sig_atomic_t *stop;   /* set by the caller's signal handler */
    core_curve_keys keys[CORE_CURVE_N_ROLES]; /* per role: the keys its process holds (core_curve_subset) */
    int keys_fd[CORE_CURVE_N_ROLES]; /* per role: a close-on-exec memfd of keys[role] for `--keys-fd`, or -1 */
    int reward_keyed;              /* the reward channel is authenticated (a reward server the job starts) */
} job;

/* Creates the socket folder, the endpoints (reward: r->reward_endpoint or ipc://SOCKDIR/reward) and the run's keys
 * (-1 with core_error when this libzmq has no CURVE: vgrpo's channels need it). */
int job_init(job *j, const core_recipe *r, volatile sig_atomic_t *stop);

/* The keys of role's process (its subset) and the memfd that carries them to a child. */
const core_curve_keys *job_keys(const job *j, core_curve_role role);
int job_keys_fd(const job *j, core_curve_role role);

/* Starts `vgrpo reward-server` with the recipe's scorers, weights and reward.threads (none when external). */
int job_start_reward(job *j, const core_recipe *r, const char *log_dir);

/* Starts n `vgrpo rollout-worker` processes (ids worker-0..n-1) for the recipe file with the --set overrides and
 * optional transformer folder, each with `threads` OpenMP threads. */
int job_start_workers(job *j, const char *recipe_path, const char *const *sets, int n_sets, const char *transformer,
                      int n, int threads, const char *log_dir);
/* job_start_workers with LoRA adapters read from files (`vgrpo rollout-worker --adapter PATH`: expert 0's adapter,
 * PATH_2 expert 1's; rollout/pipeline.h) on the base of model.path (or transformer); adapter NULL: as above. */
int job_start_workers_lora(job *j, const char *recipe_path, const char *const *sets, int n_sets,
                           const char *transformer, const char *adapter, int n, int threads, const char *log_dir);

/* The controller's abort check (ctx = the job): non-zero with core_error when *stop is set or a process exited. */
int job_abort_check(void *ctx);

/* SIGTERM to the reward server, then waits up to timeout_s for every process (SIGTERM, SIGKILL after), removes
 * the socket folder and closes the key memfds. */
void job_stop(job *j, double timeout_s);

/* Cores for OpenMP per process when `procs` compute-heavy processes share this machine (>= 1). */
int job_threads_per_process(int procs);

#endif
