/* cli/supervisor.h — the processes a job starts (docs/design.md section 3): spawn `vgrpo <subcommand> ...` children
 * with their own OMP_NUM_THREADS, notice any that exits, restart one (the same command line, descriptor and
 * environment; its log appended to), stop them all. The supervisor is never an MPI process.
 * Children get PR_SET_PDEATHSIG = SIGTERM, so they do not outlive a supervisor that is killed. */
#ifndef CLI_SUPERVISOR_H
#define CLI_SUPERVISOR_H

#include <stddef.h>
#include <sys/types.h>

#define SUP_MAX_PROCS 64

typedef struct {
    int n;
    struct {
        char name[64];  /* e.g. "rollout worker 1" */
        pid_t pid;      /* 0 once reaped */
        int status;     /* wait status once reaped */
        int reported;   /* sup_poll returned it already */
        char log[4096]; /* its stderr+stdout file ("" = inherited) */
        char **argv;    /* its command line (owned copy), for a restart */
        int threads, pass_fd, as_stdin;
        int restarts;   /* times sup_restart started it again */
    } p[SUP_MAX_PROCS];
} sup_procs;

/* The path of the running vgrpo executable (/proc/self/exe), for spawning subcommands. NULL on failure. */
const char *sup_self_exe(void);

/* Starts argv (argv[0] the executable, NULL-terminated) as process `name`, with OMP_NUM_THREADS=threads (> 0) and
 * OPENBLAS_NUM_THREADS=1 in its environment, stdout and stderr appended to log_path after a sup_log_header line
 * (NULL: inherited; logs are never truncated, so a job refused after its start, e.g. by a resume's checks, keeps the
 * previous job's log above its own). Returns its index in s, or -1 with core_error. */
int sup_spawn(sup_procs *s, const char *name, char *const *argv, int threads, const char *log_path);

/* sup_spawn, and the child inherits the descriptor pass_fd (>= 0; e.g. a memfd of the run's keys, core/curve.h,
 * made close-on-exec so that no other child gets it): as_stdin 0 keeps its number (the child is told it with
 * `--keys-fd N`), 1 makes it the child's standard input (mpirun hands its stdin to rank 0 only, and closes every
 * other inherited descriptor). -1 as sup_spawn. */
int sup_spawn_fd(sup_procs *s, const char *name, char *const *argv, int threads, const char *log_path, int pass_fd,
                 int as_stdin);

/* Starts process i again after it exited (reaped): the same command line, threads and passed descriptor, in the same
 * slot (name, index), its log opened for appending after a line "--- restarted by the supervisor (restart N) ---".
 * Counts the restart. -1 with core_error (fork failed, i still running). */
int sup_restart(sup_procs *s, int i);

/* The line a process's log gets when it starts: "--- started YYYY-MM-DD HH:MM:SS by pid N ---\n" (local time; the
 * calling process's pid: the supervisor's for its children, a rank's own under mpirun) into buf (cap bytes); returns
 * its length. */
int sup_log_header(char *buf, size_t cap);

/* Frees the command-line copies (after sup_stop_all). */
void sup_free(sup_procs *s);

/* Reaps children that have exited; returns the index of one exited child not returned before (lowest index first),
 * or -1 when there is none. */
int sup_poll(sup_procs *s);

/* Describes process i's exit ("exited with status 3", "killed by signal 9") into buf, quoting the last line of its
 * log (usually the reason) and naming the log. */
void sup_describe(const sup_procs *s, int i, char *buf, size_t n);

/* Waits up to timeout_s for every child to exit (after a shutdown message), then SIGTERM, then SIGKILL after 2 s. */
void sup_stop_all(sup_procs *s, double timeout_s);

#endif
