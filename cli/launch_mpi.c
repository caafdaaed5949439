/* cli/launch_mpi.c — a whole run as one MPI job (cli/launch_mpi.h).
 *
 * The launcher (`vgrpo run RECIPE --launcher mpirun [--hostfile FILE]`, launch_mpi_exec) checks the recipe and the
 * budget, locks the run folder (cli/cmd_run.c) and execs one MPMD job:
 *
 *     mpirun [--hostfile FILE] --bind-to none ... -np T vgrpo mpi-rank RECIPE --role trainer ...
 *                                               : -np W vgrpo mpi-rank RECIPE --role rollout-worker ...
 *                                               : -np 1 vgrpo mpi-rank RECIPE --role reward-server ...
 *
 * (no reward-server app context when reward.endpoint names an external server). Each rank (`vgrpo mpi-rank`,
 * cmd_mpi_rank):
 *   1. MPI_Init, loads the recipe; each start-up step ends with an all-gather of one status record per rank, so a
 *      rank's error ends every rank cleanly and rank 0 prints it (naming the rank, its role and host);
 *   2. finds its role: by MPI_APPNUM when the ranks' app numbers differ (app 0 the trainer ranks, 1 the workers, 2
 *      the reward server), else by rank ranges (as under srun, where every rank runs one command: ranks 0..T-1
 *      trainer, T..T+W-1 workers, the last the reward server); T = parallel.trainer_ranks, W =
 *      parallel.rollout_workers; --role, when given, must agree;
 *   3. splits a communicator per role: the trainer ranks' is the "MPI world" of docs/design.md section 3 (data and
 *      sequence parallelism, trainer_run / trainer_follow); nothing uses MPI_COMM_WORLD after step 6 but MPI_Abort;
 *   4. under srun only (no --launched): rank 0 checks the budget, writes a missing preset model and locks the run
 *      folder, as `vgrpo run` does before it execs mpirun;
 *   5. keys: rank 0 (trainer rank 0) generates the run's CURVE keys (core/curve.h) and sends each rank its role's
 *      subset over MPI, point to point (never a file, the environment or a command line): the workers the client
 *      pair, the reward server the reward pair, trainer rank 0 the controller pair and the client pair (it sends the
 *      reward server its `shutdown` at the end), the other trainer ranks none;
 *   6. endpoints: trainer rank 0 binds the controller's ROUTER and the reward server its ROUTER on tcp://ADDR:*
 *      (ADDR from core/host_addr.h: never 0.0.0.0; 127.0.0.1 when every rank is on one host; the port the system
 *      chose), and an all-gather hands both endpoints to every rank; then the world's duplicate is freed;
 *   7. runs its role: trainer rank 0 the controller and the GRPO loop (as `vgrpo trainer`), the other trainer ranks
 *      trainer_follow, the workers rollout_worker_run (ids worker-K, K the index among the workers), the reward
 *      server reward_server_run. Workers and the reward server write their output to logging.run_dir/logs/
 *      (worker-K.log, reward-server.log) as on the supervisor path; the trainer's lines reach mpirun's terminal;
 *   8. trainer rank 0 shuts the workers down (the controller's `shutdown`) and the reward server (a `shutdown` with
 *      the client keys); every rank calls MPI_Finalize.
 * No process forks after MPI_Init (core_omp_env_defaults' exec of itself comes before).
 *
 * Threads: each trainer rank and each worker gets cores / (processes of its role on its host) OpenMP threads, as the
 * supervisor gives them (cli/colocated.c); the reward server one, plus reward.threads scoring threads.
 *
 * Failures: a rank that fails in steps 1-6 ends every rank (exit 1, one message from rank 0). Later, a trainer rank
 * that fails calls MPI_Abort, which ends the job (as `vgrpo trainer` does); a worker that leaves (its loop fails on a
 * socket error, or SIGTERM reaches it alone) closes its connection, and the controller re-issues its chunk to the
 * others (trainer/net/controller.h), the run going on while a worker is left; the worker waits in MPI_Finalize and
 * exits 0, so the job's exit status is the trainer's. A process that DIES (SIGKILL, the OOM killer) ends the whole
 * job: mpirun's default, kept on purpose (with OpenMPI 4.1's --enable-recovery a trainer rank in a collective with a
 * dead peer waits forever). No process is restarted under mpirun (restarts are the supervisor's, cli/colocated.c):
 * `vgrpo run ... --resume DIR` continues from the last checkpoint.
 *
 * Signals: mpirun forwards SIGUSR1 and SIGUSR2 to every rank. SIGUSR2 makes trainer rank 0 stop as on SIGTERM (the
 * step finished or discarded, a checkpoint saved, then every process stops; exit 1); the other ranks ignore both.
 * SIGINT or SIGTERM to mpirun end the job at once (mpirun sends SIGTERM, then SIGKILL, to every rank).
 *
 * Files: this one is the launcher; cli/cmd_mpi_rank.c is a rank (`vgrpo mpi-rank`: the steps above in order),
 * cli/launch_mpi_startup.c the start-up's collectives (steps 1-6), cli/launch_mpi_roles.c the roles (step 7), and
 * cli/launch_mpi_rank.h what the three share. */
#include "cli/launch_mpi.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/launch_mpi_rank.h"
#include "cli/supervisor.h"
#include "core/error.h"
#include "core/gpu_assign.h"

const char *const launch_role_names[N_ROLES] = {"trainer", "rollout-worker", "reward-server"};

/* ---- the launcher: `vgrpo run --launcher mpirun` ---- */

int launch_mpi_check(const core_recipe *r) {
    if (r->choice.mode != CORE_MODE_COLOCATED)
        return core_error("--launcher mpirun starts the processes of mode: colocated (trainer ranks, rollout workers, "
                          "the reward server); this recipe has mode: %s (add --set mode=colocated)", r->mode);
    return 0;
}

int launch_mpi_nodes(const char *hostfile, const core_recipe *r) {
    FILE *f = fopen(hostfile, "r");
    if (!f) return core_error("--hostfile %s: %s", hostfile, strerror(errno));
    core_gpu_node *nodes = NULL;
    int *slots = NULL, n = 0, cap = 0, line = 0, rc = 0;
    char buf[1024];
    while (!rc && fgets(buf, sizeof buf, f)) {
        line++;
        buf[strcspn(buf, "#\r\n")] = 0; /* CRLF line ends as LF */
        char name[CORE_GPU_NODE_NAME_MAX], *s = buf + strspn(buf, " \t");
        int len = (int)strcspn(s, " \t");
        if (!len) continue;
        if (len >= CORE_GPU_NODE_NAME_MAX) {
            rc = core_error("--hostfile %s:%d: a host name of %d characters (at most %d)", hostfile, line, len,
                            CORE_GPU_NODE_NAME_MAX - 1);
            break;
        }
        memcpy(name, s, (size_t)len), name[len] = 0;
        long k = 1;
        const char *sl = strstr(s + len, "slots=");
        while (sl && sl != s + len && sl[-1] != ' ' && sl[-1] != '\t') sl = strstr(sl + 6, "slots="); /* max_slots= */
        if (sl) {
            char *end;
            k = strtol(sl + 6, &end, 10);
            if (end == sl + 6 || k < 1 || k > 1 << 20 || (*end && *end != ' ' && *end != '\t')) {
                rc = core_error("--hostfile %s:%d: slots=%.20s is not a count >= 1", hostfile, line, sl + 6);
                break;
            }
        }
        int at = -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(nodes[i].name, name)) at = i;
        if (at < 0) {
            if (n == cap) {
                cap = cap ? 2 * cap : 8;
                core_gpu_node *nn = realloc(nodes, sizeof *nodes * (size_t)cap);
                int *ns = realloc(slots, sizeof *slots * (size_t)cap);
                if (nn) nodes = nn;
                if (ns) slots = ns;
                if (!nn || !ns) {
                    rc = core_error("out of memory");
                    break;
                }
            }
            at = n++;
            memset(&nodes[at], 0, sizeof nodes[at]);
            snprintf(nodes[at].name, sizeof nodes[at].name, "%s", name);
            slots[at] = 0;
        }
        slots[at] += (int)k;
    }
    if (!rc && ferror(f)) rc = core_error("--hostfile %s: %s", hostfile, strerror(errno)); /* a folder: EISDIR */
    fclose(f);
    const int n_app[N_ROLES] = {r->trainer_ranks, r->rollout_workers, r->reward_endpoint ? 0 : 1};
    const int total = n_app[0] + n_app[1] + n_app[2];
    if (!rc && !n) rc = core_error("--hostfile %s: no host in it", hostfile);
    int free_slots = 0;
    for (int i = 0; !rc && i < n; i++) free_slots += slots[i];
    if (!rc && free_slots < total)
        rc = core_error("--hostfile %s: %d slot(s) for the job's %d process(es) (%d trainer rank(s), %d rollout "
                        "worker(s)%s): give the hosts more slots", hostfile, free_slots, total, n_app[0], n_app[1],
                        n_app[2] ? ", the reward server" : "");
    /* by slot: rank k on the first host with a slot left */
    for (int k = 0, h = 0, used = 0; !rc && k < n_app[0] + n_app[1]; k++) {
        while (used == slots[h]) h++, used = 0;
        if (k < n_app[0]) nodes[h].n_trainer++;
        else nodes[h].n_workers++;
        used++;
    }
    if (!rc) rc = core_gpu_set_nodes(nodes, n, -1, 0);
    free(nodes), free(slots);
    return rc;
}

int launch_mpi_exec(const char *recipe_path, const char *const *sets, int n_sets, const core_recipe *r, int64_t steps,
                    const char *resume, const char *hostfile, const char *bind_host) {
    const int n_app[N_ROLES] = {r->trainer_ranks, r->rollout_workers, r->reward_endpoint ? 0 : 1};
    const int total = n_app[0] + n_app[1] + n_app[2];
    const char *exe = sup_self_exe();
    if (!exe) return -1;
    const int cap = 64 + N_ROLES * (24 + 2 * n_sets);
    char **argv = calloc((size_t)cap, sizeof(char *));
    if (!argv) return core_error("out of memory");
    char np[N_ROLES][16], sbuf[32];
    snprintf(sbuf, sizeof sbuf, "%lld", (long long)steps);
    int a = 0;
    argv[a++] = "mpirun";
    if (hostfile) argv[a++] = "--hostfile", argv[a++] = (char *)hostfile;
    argv[a++] = "--bind-to", argv[a++] = "none", argv[a++] = "--stdin", argv[a++] = "none";
    if (!hostfile) {
        /* One machine: the trainer ranks talk over shared memory and MPI's out-of-band channel stays on loopback (as
         * on the supervisor path, cli/colocated.c); mpirun's own listener still binds 0.0.0.0 (README) */
        if (total > sysconf(_SC_NPROCESSORS_ONLN)) argv[a++] = "--oversubscribe";
        argv[a++] = "--mca", argv[a++] = "btl", argv[a++] = "self,vader";
        argv[a++] = "--mca", argv[a++] = "pml", argv[a++] = "ob1";
        argv[a++] = "--mca", argv[a++] = "oob_tcp_if_include", argv[a++] = "lo";
    }
    /* what the supervisor gives its children (cli/supervisor.c), to every host */
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    argv[a++] = "-x", argv[a++] = "OPENBLAS_NUM_THREADS", argv[a++] = "-x", argv[a++] = "OMP_WAIT_POLICY";
    const char *ao = getenv("ASAN_OPTIONS");
    if (ao) { /* a sanitizer build: OpenMPI's start-up allocations read as leaks (cli/colocated.c) */
        static char buf[1024];
        snprintf(buf, sizeof buf, "%s%sdetect_leaks=0", ao, *ao ? ":" : "");
        setenv("ASAN_OPTIONS", buf, 1);
        argv[a++] = "-x", argv[a++] = "ASAN_OPTIONS";
    }
    if (geteuid() == 0) setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1), setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    if (!hostfile) setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1); /* containers without CMA */
    int first = 1;
    for (int role = 0; role < N_ROLES; role++) {
        if (!n_app[role]) continue;
        if (!first) argv[a++] = ":";
        first = 0;
        snprintf(np[role], sizeof np[role], "%d", n_app[role]);
        argv[a++] = "-np", argv[a++] = np[role], argv[a++] = (char *)exe, argv[a++] = "mpi-rank";
        argv[a++] = (char *)recipe_path, argv[a++] = "--role", argv[a++] = (char *)launch_role_names[role];
        argv[a++] = "--launched";
        if (steps > 0) argv[a++] = "--steps", argv[a++] = sbuf;
        if (resume) argv[a++] = "--resume", argv[a++] = (char *)resume;
        if (bind_host) argv[a++] = "--bind-host", argv[a++] = (char *)bind_host;
        for (int s = 0; s < n_sets; s++) argv[a++] = "--set", argv[a++] = (char *)sets[s];
    }
    argv[a] = NULL;
    fprintf(stderr, "vgrpo run: one MPI job of %d processes (%d trainer rank(s), %d rollout worker(s)%s) on %s; a process "
                    "that dies ends the job (no restarts under mpirun): --resume %s continues from its last "
                    "checkpoint\nvgrpo run: exec",
            total, n_app[0], n_app[1], n_app[2] ? ", the reward server" : "", hostfile ? hostfile : "this machine",
            r->ckpt_dir ? r->ckpt_dir : r->run_dir);
    for (int i = 0; i < a; i++) fprintf(stderr, " %s", argv[i]);
    fprintf(stderr, "\n");
    fflush(stdout);
    fflush(stderr);
    if (!access("/usr/bin/mpirun", X_OK)) execv("/usr/bin/mpirun", argv);
    else execvp("mpirun", argv);
    const int e = errno;
    free(argv);
    return core_error("cannot run mpirun: %s (install OpenMPI, or run without --launcher)", strerror(e));
}
