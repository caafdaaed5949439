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
 * others (trainer/controller.h), the run going on while a worker is left; the worker waits in MPI_Finalize and
 * exits 0, so the job's exit status is the trainer's. A process that DIES (SIGKILL, the OOM killer) ends the whole
 * job: mpirun's default, kept on purpose (with OpenMPI 4.1's --enable-recovery a trainer rank in a collective with a
 * dead peer waits forever). No process is restarted under mpirun (restarts are the supervisor's, cli/colocated.c):
 * `vgrpo run ... --resume DIR` continues from the last checkpoint.
 *
 * Signals: mpirun forwards SIGUSR1 and SIGUSR2 to every rank. SIGUSR2 makes trainer rank 0 stop as on SIGTERM (the
 * step finished or discarded, a checkpoint saved, then every process stops; exit 1); the other ranks ignore both.
 * SIGINT or SIGTERM to mpirun end the job at once (mpirun sends SIGTERM, then SIGKILL, to every rank). */
#include "cli/launch_mpi.h"

#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "cli/colocated.h"
#include "cli/commands.h"
#include "cli/job.h"
#include "cli/model_init.h"
#include "cli/opts.h"
#include "cli/supervisor.h"
#include "core/curve.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/host_addr.h"
#include "core/log.h"
#include "core/recipe.h"
#include "core/run_lock.h"
#include "core/stop.h"
#include "core/wire_zmq.h"
#include "reward/learned.h"
#include "reward/server.h"
#include "rollout/pipeline.h"
#include "rollout/worker.h"
#include "sp/comm.h"
#include "trainer/budget.h"
#include "trainer/controller.h"
#include "trainer/run.h"
#include "trainer/source_remote.h"

#define HELLO_TIMEOUT_S 600.0 /* as `vgrpo trainer` */
#define CTL_TIMEOUT_S 3600.0
#define REWARD_STOP_MS 15000  /* the reward server finishes its requests in flight (<= 10 s) before it answers */
#define REC 512               /* one rank's record in a start-up all-gather: a status, a host name or an endpoint */

typedef enum { ROLE_TRAINER = 0, ROLE_WORKER = 1, ROLE_REWARD = 2, N_ROLES = 3 } launch_role;
static const char *const role_names[N_ROLES] = {"trainer", "rollout-worker", "reward-server"};

typedef struct {
    const core_recipe *r;
    const char *bind_host;  /* --bind-host, or NULL */
    sp_comm *world;         /* a duplicate of MPI_COMM_WORLD: the start-up only */
    sp_comm *group;         /* this role's ranks */
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

/* ---- the launcher: `vgrpo run --launcher mpirun` ---- */

int launch_mpi_check(const core_recipe *r) {
    if (r->choice.mode != CORE_MODE_COLOCATED)
        return core_error("--launcher mpirun starts the processes of mode: colocated (trainer ranks, rollout workers, "
                          "the reward server); this recipe has mode: %s (add --set mode=colocated)", r->mode);
    return 0;
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
        argv[a++] = (char *)recipe_path, argv[a++] = "--role", argv[a++] = (char *)role_names[role];
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

/* ---- a rank: `vgrpo mpi-rank` ---- */

/* An MPI failure during the start-up (not a rank's own error: the collective itself): no clean way out. */
static void fatal(const launch *L, const char *what) {
    fprintf(stderr, "vgrpo mpi-rank (rank %d): %s: %s\n", L->rank, what, core_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* "rank 3 (rollout-worker on host h)" into buf. */
static const char *who(const launch *L, int rank, char *buf, size_t cap) {
    if (L->roles) snprintf(buf, cap, "rank %d (%s on %s)", rank, role_names[L->roles[rank]], L->hosts[rank]);
    else snprintf(buf, cap, "rank %d", rank);
    return buf;
}

/* All-gather of one record per rank (mine: REC bytes) into all (size x REC). */
static void gather(launch *L, const char *mine, char *all, const char *what) {
    if (sp_comm_all_gather(L->world, mine, all, REC, SP_U8)) fatal(L, what);
}

/* Every rank's status (failed: this rank's core_last_error). 0 when every rank succeeded; else -1 with core_error
 * naming the first failing rank. Collective over the world. */
static int all_ok(launch *L, int failed, const char *what) {
    char mine[REC] = "";
    if (failed) snprintf(mine, sizeof mine, "%s", core_last_error()[0] ? core_last_error() : "failed");
    char *all = malloc((size_t)L->size * REC);
    if (!all) core_error("out of memory"), fatal(L, what);
    gather(L, mine, all, what);
    int rc = 0;
    for (int k = 0; k < L->size && !rc; k++)
        if (all[(size_t)k * REC]) {
            char w[REC + 64];
            all[(size_t)k * REC + REC - 1] = 0;
            rc = core_error("%s: %s", who(L, k, w, sizeof w), all + (size_t)k * REC);
        }
    free(all);
    return rc;
}

/* This process's MPI app number (MPI_APPNUM), -1 when the MPI library sets none. */
static int64_t appnum(void) {
    int *v = NULL, flag = 0;
    if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &v, &flag) != MPI_SUCCESS || !flag || !v) return -1;
    return *v;
}

/* Step 2: every rank's role and host, this rank's role, index and neighbours on its host. -1 with core_error (the
 * same on every rank, except a --role that disagrees). */
static int find_roles(launch *L, const char *role_opt) {
    const core_recipe *r = L->r;
    const int want[N_ROLES] = {r->trainer_ranks, r->rollout_workers, r->reward_endpoint ? 0 : 1};
    int64_t mine = appnum(), *app = malloc((size_t)L->size * sizeof *app);
    L->roles = calloc((size_t)L->size, sizeof *L->roles);
    L->hosts = calloc((size_t)L->size, sizeof *L->hosts);
    if (!app || !L->roles || !L->hosts) core_error("out of memory"), fatal(L, "roles");
    char host[REC] = "";
    gethostname(host, sizeof host - 1);
    gather(L, host, (char *)L->hosts, "host names");
    if (sp_comm_all_gather(L->world, &mine, app, 1, SP_I64)) fatal(L, "app numbers");
    for (int k = 0; k < L->size; k++) L->hosts[k][REC - 1] = 0;
    int mpmd = 0, rc = 0;
    for (int k = 1; k < L->size; k++) mpmd |= app[k] != app[0];
    if (L->size != want[0] + want[1] + want[2])
        rc = core_error("the job has %d rank(s) but the recipe needs %d: parallel.trainer_ranks %d + "
                        "parallel.rollout_workers %d%s", L->size, want[0] + want[1] + want[2], want[0], want[1],
                        want[2] ? " + 1 reward server" : " (reward.endpoint names an external reward server)");
    L->reward_rank = -1;
    for (int k = 0; k < L->size && !rc; k++) {
        int role;
        if (mpmd) {
            role = (int)app[k];
            if (role < 0 || role >= N_ROLES || !want[role])
                rc = core_error("rank %d is in app context %lld: the app contexts are the trainer ranks, the rollout "
                                "workers%s, in that order", k, (long long)app[k], want[2] ? " and the reward server" : "");
        } else {
            role = k < want[0] ? ROLE_TRAINER : k < want[0] + want[1] ? ROLE_WORKER : ROLE_REWARD;
        }
        if (rc) break;
        L->roles[k] = (launch_role)role;
        if (role == ROLE_REWARD) L->reward_rank = k;
        L->n_role[role]++;
    }
    for (int role = 0; role < N_ROLES && !rc; role++)
        if (L->n_role[role] != want[role])
            rc = core_error("%d %s rank(s) were started, the recipe needs %d (parallel.trainer_ranks, "
                            "parallel.rollout_workers, reward.endpoint)", L->n_role[role], role_names[role], want[role]);
    if (!rc && L->roles[0] != ROLE_TRAINER)
        rc = core_error("rank 0 must be trainer rank 0 (it generates the run's keys): list the trainer ranks first");
    free(app);
    if (rc) {
        free(L->roles), L->roles = NULL;
        return -1;
    }
    L->role = L->roles[L->rank];
    for (int k = 0; k < L->size; k++) {
        if (L->roles[k] != L->role) continue;
        if (k < L->rank) L->role_rank++;
        if (!strcmp(L->hosts[k], L->hosts[L->rank])) L->local_same_role++;
    }
    if (role_opt && strcmp(role_opt, role_names[L->role]))
        return core_error("--role %s, but this rank's place in the job makes it a %s (%s)", role_opt,
                          role_names[L->role], mpmd ? "MPI_APPNUM" : "rank ranges");
    return 0;
}

/* Step 5: the keys, from rank 0 to each rank (its role's subset). -1 with core_error on this rank. */
static int share_keys(launch *L) {
    char text[CORE_CURVE_TEXT_MAX], none = 0;
    int rc = 0;
    memset(text, 0, sizeof text);
    if (L->rank == 0) {
        core_curve_keys all, sub;
        rc = core_curve_generate(&all);
        if (!rc && L->reward_rank < 0) /* an external reward server holds none of the run's keys (cli/job.h) */
            memset(all.pub[CORE_CURVE_REWARD], 0, sizeof all.pub[0]), memset(all.sec[CORE_CURVE_REWARD], 0, sizeof all.sec[0]);
        for (int k = 0; k < L->size; k++) {
            memset(&sub, 0, sizeof sub);
            memset(text, 0, sizeof text);
            if (!rc && L->roles[k] != ROLE_TRAINER) {
                core_curve_subset(&all, L->roles[k] == ROLE_WORKER ? CORE_CURVE_CLIENT : CORE_CURVE_REWARD, &sub);
            } else if (!rc && k == 0) { /* the controller, and the client pair for the reward server's shutdown */
                core_curve_subset(&all, CORE_CURVE_CONTROLLER, &sub);
                memcpy(sub.sec[CORE_CURVE_CLIENT], all.sec[CORE_CURVE_CLIENT], sizeof sub.sec[0]);
            }
            if (!rc && core_curve_format(&sub, text, sizeof text)) rc = -1;
            if (k == 0) L->keys = sub;
            else if (sp_comm_sendrecv(L->world, text, sizeof text, k, &none, 0, k, SP_U8)) fatal(L, "sending the keys");
        }
        memset(&all, 0, sizeof all);
        memset(&sub, 0, sizeof sub);
    } else {
        if (sp_comm_sendrecv(L->world, &none, 0, 0, text, sizeof text, 0, SP_U8)) fatal(L, "receiving the keys");
        text[sizeof text - 1] = 0;
        /* empty: rank 0 failed to make them and says why in the next status exchange */
        if (text[0] && core_curve_parse(text, strlen(text), &L->keys)) rc = core_error_push("the keys from rank 0: ");
    }
    memset(text, 0, sizeof text);
    return rc;
}

/* Step 6: all-gather of the endpoints (mine: this rank's bound endpoint, "" for none, NULL after a failure, whose
 * core_last_error is sent), then the world's duplicate is freed. Fills ctl_ep (rank 0's) and rew_ep (the reward
 * server's, or reward.endpoint). -1 with core_error when any rank failed. */
static int exchange(launch *L, const char *mine) {
    char rec[REC] = "";
    snprintf(rec, sizeof rec, "%c%s", mine ? 'A' : 'E', mine ? mine : core_last_error());
    char *all = malloc((size_t)L->size * REC);
    if (!all) core_error("out of memory"), fatal(L, "endpoints");
    gather(L, rec, all, "endpoints");
    L->exchanged = 1;
    int rc = 0;
    for (int k = 0; k < L->size && !rc; k++) {
        char *x = all + (size_t)k * REC, w[REC + 64];
        x[REC - 1] = 0;
        if (x[0] == 'E') rc = core_error("%s: %s", who(L, k, w, sizeof w), x + 1);
    }
    if (!rc) {
        snprintf(L->ctl_ep, sizeof L->ctl_ep, "%s", all + 1);
        if (L->reward_rank >= 0) snprintf(L->rew_ep, sizeof L->rew_ep, "%s", all + (size_t)L->reward_rank * REC + 1);
        else snprintf(L->rew_ep, sizeof L->rew_ep, "%s", L->r->reward_endpoint);
    }
    free(all);
    sp_comm_destroy(L->world); /* nothing uses the world after this */
    L->world = NULL;
    return rc;
}

/* This host's address for a server (core/host_addr.h) as "tcp://ADDR:*". */
static int bind_endpoint(launch *L, char *ep, size_t cap) {
    const char **hosts = malloc((size_t)L->size * sizeof *hosts);
    if (!hosts) return core_error("out of memory");
    for (int k = 0; k < L->size; k++) hosts[k] = L->hosts[k];
    char addr[64];
    const int rc = core_host_addr_pick(L->bind_host, L->hosts[L->rank], hosts, L->size, addr, sizeof addr, L->addr_how,
                                       sizeof L->addr_how);
    free(hosts);
    if (rc) return -1;
    snprintf(ep, cap, "tcp://%s:*", addr);
    return 0;
}

/* Output of a worker or the reward server into logging.run_dir/logs/NAME.log (as the supervisor's children). */
static int redirect_output(const char *run_dir, const char *name) {
    char logs[4200], path[4400];
    snprintf(logs, sizeof logs, "%s/logs", run_dir);
    if (core_mkdir_p(logs)) return -1;
    snprintf(path, sizeof path, "%s/%s.log", logs, name);
    const int fd = core_open_nofollow(path, O_WRONLY | O_CREAT | O_APPEND); /* as the supervisor's children */
    if (fd < 0) return -1;
    fflush(stdout);
    fflush(stderr);
    dup2(fd, 1), dup2(fd, 2), close(fd);
    char note[120];
    const int k = sup_log_header(note, sizeof note);
    if (write(2, note, (size_t)k) < 0) { /* the log line is a courtesy */ }
    return 0;
}

static volatile sig_atomic_t stop_flag = 0, abort_flag = 0;
static void on_stop(int sig) { (void)sig, stop_flag = 1; }
static void on_usr1(int sig) { (void)sig, abort_flag = 1; }
static void on_usr2(int sig) { (void)sig, kill(getpid(), SIGTERM); } /* trainer rank 0: as SIGTERM (core/stop.h) */

/* The controller's abort check (as `vgrpo trainer`'s). */
static int abort_check(void *ctx) {
    (void)ctx;
    if (abort_flag) return core_error("stopped (SIGUSR1)");
    const int sig = core_stop_interrupt();
    return sig ? core_error("stopped by signal %d while waiting for the rollout workers", sig) : 0;
}

/* Trainer rank 0 at the end: `shutdown` to the reward server, with the client keys; waits for its answer. */
static int stop_reward_server(const launch *L) {
    void *ctx = zmq_ctx_new(), *d = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
    int rc = -1, linger = 0;
    if (!d) core_error("cannot make a socket: %s", zmq_strerror(errno));
    else if (zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger) || core_curve_client(d, &L->keys, CORE_CURVE_REWARD) ||
             zmq_connect(d, L->rew_ep) || core_zmq_send_fields(d, NULL, 0, CORE_WIRE_SHUTDOWN, "launch-shutdown", NULL))
        core_error_push("its shutdown: ");
    else {
        zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
        rc = zmq_poll(&it, 1, REWARD_STOP_MS) == 1 ? 0
             : core_error("no answer to its shutdown within %d s", REWARD_STOP_MS / 1000);
    }
    if (d) zmq_close(d);
    if (ctx) zmq_ctx_term(ctx);
    return rc;
}

/* The trainer role after the exchange; *clean_fail = 1 when every trainer rank finished (parity past its tolerance,
 * a run stopped by a signal). Returns trainer_run's value (0, 1) or -1. */
static int run_trainer(launch *L, const trainer_run_opts *o, ctl_server *ctl, int *clean_fail) {
    const core_recipe *r = L->r;
    if (L->role_rank > 0) return trainer_follow(r, o, L->group);
    core_stop_install();
    if (ctl_wait_workers(ctl, L->n_role[ROLE_WORKER], HELLO_TIMEOUT_S)) {
        core_stop_restore();
        return -1;
    }
    core_stop_restore();
    if (core_stop_pending()) /* a stop as the last hello arrived: trainer_run's own handlers would forget it */
        return core_error("stopped by signal %d while waiting for the rollout workers", core_stop_pending());
    core_rollout_source *src = trainer_source_remote(ctl, r->batch_size, CTL_TIMEOUT_S, r->model_path);
    const int rc = !src ? -1 : trainer_run(r, o, src, L->group);
    trainer_source_remote_free(src);
    *clean_fail = rc == 1;
    return rc;
}

/* The reward server's on_bound: step 6 as soon as it listens. */
static int reward_bound(void *ctx, const char *ep) {
    launch *L = ctx;
    fprintf(stderr, "reward-server: serving on %s (CURVE; address: %s) with %d scorer thread(s)\n", ep, L->addr_how,
            L->r->reward_threads);
    return exchange(L, ep);
}

/* The reward-server role: binds, exchanges (reward_bound), serves until trainer rank 0's shutdown. */
static int run_reward(launch *L, const core_recipe *r) {
    reward_server_config cfg;
    reward_server_config_default(&cfg);
    char spec[2048] = "", ep[REC];
    for (int i = 0; i < r->scorers.n; i++) {
        size_t k = strlen(spec);
        snprintf(spec + k, sizeof spec - k, "%s%s:%.17g", i ? "," : "", r->scorers.v[i], r->weights.v[i]);
    }
    cfg.threads = r->reward_threads;
    /* the largest request a worker sends (as cli/job.c): rollout.batch_size videos */
    const unsigned long long vbytes = (unsigned long long)r->batch_size * r->frames * r->height * r->width * 3;
    cfg.max_frame_bytes = (size_t)((vbytes + (1ull << 20) - 1) >> 20) << 20;
    cfg.keys = &L->keys;
    cfg.on_bound = reward_bound, cfg.on_bound_ctx = L;
    if (reward_server_parse_scorers(&cfg, spec) || reward_recipe_models(r, cfg.scorers, cfg.n_scorers, 1))
        return exchange(L, NULL), -1;
    for (int i = 0; i < cfg.n_scorers; i++) /* learned scorers: their scratch in the memory budget */
        if (cfg.scorers[i].model)
            cfg.model_act_bytes += reward_model_act_bytes(cfg.scorers[i].model, reward_recipe_video_frames(r), 1);
    if (bind_endpoint(L, ep, sizeof ep)) return reward_server_detach_models(&cfg), exchange(L, NULL), -1;
    cfg.endpoint = ep;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop; /* no SA_RESTART: the poll loop wakes and sees the flag */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    reward_server_stats st;
    memset(&st, 0, sizeof st);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int rc = reward_server_run(&cfg, &stop_flag, &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    reward_server_detach_models(&cfg);
    if (!L->exchanged) return exchange(L, NULL), -1; /* it failed before it was bound */
    fprintf(stderr, "reward-server: stats: received %lld, replies %lld, errors %lld, repeats %lld, videos %lld, "
                    "undeliverable %lld, refused %lld, dropped %lld, %.1f s\n",
            st.received, st.replies, st.errors, st.repeats, st.videos, st.undeliverable, st.refused, st.dropped,
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return rc;
}

/* The worker role after the exchange. -2: it failed before its hello (the job must end), -1: later. */
static int run_worker(launch *L, const core_recipe *r) {
    char id[32];
    snprintf(id, sizeof id, "worker-%d", L->role_rank);
    rollout_pipeline p;
    memset(&p, 0, sizeof p);
    rollout_worker_config cfg = {.controller = L->ctl_ep, .reward = L->rew_ep, .id = id, .fps = 16.0,
                                 .reward_timeout_s = r->reward_timeout_s, .reward_max_attempts = r->reward_max_attempts,
                                 .keys = &L->keys};
    int rc = -2;
    if (!rollout_pipeline_load_lora(&p, r, NULL, NULL)) {
        signal(SIGTERM, on_stop);
        signal(SIGINT, on_stop);
        rc = rollout_worker_run(&p, &cfg, &stop_flag) ? -1 : stop_flag ? core_error("stopped by a signal") : 0;
    }
    if (rc == -1) fprintf(stderr, "rollout-worker %s: %s\n", id, core_last_error());
    rollout_pipeline_free(&p);
    return rc;
}

int cmd_mpi_rank(int argc, char **argv) {
    signal(SIGUSR1, SIG_IGN); /* mpirun forwards both to every rank; trainer rank 0 takes them below */
    signal(SIGUSR2, SIG_IGN);
    const char *path = NULL, *role_opt = NULL, *bind_host = NULL;
    int steps = 0, launched = 0, force = 0, overwrite = 0;
    trainer_run_opts o = {0};
    opts_list sets = {.v = calloc((size_t)argc, sizeof(char *)), .cap = argc};
    if (!sets.v) return 1;
    const opts_spec opts[] = {
        {.name = "role", .type = OPTS_STRING, .str = &role_opt, .meta = "ROLE",
         .help = "trainer | rollout-worker | reward-server: what this rank's place in the job must make it\n"
                 "(default: found from MPI_APPNUM, or from rank ranges when every rank runs one command)"},
        {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "key.path=value",
         .help = "override a recipe key (repeatable; the same on every rank)"},
        {.name = "steps", .type = OPTS_INT, .i = &steps, .min = 1, .max = 2000000000, .meta = "N",
         .help = "GRPO steps instead of optim.total_steps"},
        {.name = "resume", .type = OPTS_STRING, .str = &o.resume, .meta = "DIR", .help = "continue from a checkpoint"},
        {.name = "bind-host", .type = OPTS_STRING, .str = &bind_host, .meta = "ADDR|IFACE",
         .help = "the address (or interface) the controller and the reward server bind on (default: "
                 CORE_HOST_ADDR_ENV ",\nelse 127.0.0.1 on one host, else the address that routes to the other hosts)"},
        {.name = "launched", .type = OPTS_FLAG, .flag = &launched,
         .help = "started by `vgrpo run --launcher mpirun`, which checked the recipe and holds the run folder's lock"},
        {.name = "force", .type = OPTS_FLAG, .flag = &force,
         .help = "run even when the estimate exceeds the memory available (without --launched)"},
        {.name = "overwrite", .type = OPTS_FLAG, .flag = &overwrite,
         .help = "without --launched: start afresh in a folder holding an earlier run's checkpoints (deletes them)"},
        {0}};
    const opts_pos pos[] = {{.name = "RECIPE", .dst = &path, .required = 1, .help = "the recipe YAML"}, {0}};
    const opts_cmd cmd = {
        .name = "mpi-rank", .opts = opts, .pos = pos,
        .about = "One rank of a run launched as one MPI job (`vgrpo run RECIPE --launcher mpirun`, or every rank of\n"
                 "`srun -n T+W+1 vgrpo mpi-rank RECIPE`): a trainer rank, a rollout worker or the reward server."};
    const int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) {
        free(sets.v);
        return opts_exit_status(prc);
    }
    o.steps = steps;
    launch L;
    memset(&L, 0, sizeof L);
    L.bind_host = bind_host;
    if (sp_comm_mpi_world(&argc, &argv, &L.world)) {
        fprintf(stderr, "vgrpo mpi-rank: %s\n", core_last_error());
        free(sets.v);
        return 1;
    }
    L.rank = L.world->rank, L.size = L.world->size;
    core_recipe r;
    memset(&r, 0, sizeof r);
    core_run_locks lk = CORE_RUN_LOCKS_INIT;
    ctl_server *ctl = NULL;
    int status = 1, loaded = 0, clean_fail = 0;
    /* 1, 2: the recipe, the roles */
    loaded = !core_recipe_load(&r, path, sets.v, sets.n);
    int failed = !loaded || launch_mpi_check(&r) || core_file_mode_apply(r.file_mode); /* every host's ranks */
    L.r = &r;
    if (all_ok(&L, failed, "the recipe") || all_ok(&L, find_roles(&L, role_opt), "the roles")) goto startup_failed;
    /* 3: the role's communicator; the trainer's checks (as `vgrpo trainer`) */
    if (sp_comm_split(L.world, (int)L.role, L.rank, role_names[L.role], &L.group)) fatal(&L, "the role split");
    failed = L.role == ROLE_TRAINER && trainer_check_recipe(&r);
    if (!failed && L.role == ROLE_TRAINER && r.prompts_per_step * r.samples_per_prompt < L.group->size)
        failed = core_error("parallel.trainer_ranks %d exceeds the %d samples of a step (B x G)", L.group->size,
                            r.prompts_per_step * r.samples_per_prompt);
    /* 4: under srun, what `vgrpo run` does before it execs mpirun */
    if (!failed && !launched && L.rank == 0) {
        const budget_request q = {.job = BUDGET_JOB_RUN};
        failed = budget_preflight(&r, &q, force, stdout) || ensure_model(&r) || colocated_check(&r) ||
                 trainer_claim_folders(&r, o.resume, overwrite, &lk);
    }
    if (all_ok(&L, failed, "the checks")) goto startup_failed;
    /* 5: the keys */
    if (all_ok(&L, share_keys(&L), "the keys")) goto startup_failed;
    if (L.role == ROLE_TRAINER) core_log_set_rank(L.group->rank);
    /* 6, 7: endpoints, then the role */
    const int threads = job_threads_per_process(L.local_same_role);
    if (L.role == ROLE_REWARD) {
        omp_set_num_threads(1);
        if (redirect_output(r.run_dir, "reward-server")) {
            exchange(&L, NULL);
            goto startup_failed;
        }
        const int rc = run_reward(&L, &r);
        if (rc && L.world == NULL && L.ctl_ep[0]) { /* it served, then failed: the run cannot go on */
            fprintf(stderr, "reward-server: %s\n", core_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        status = rc ? 1 : 0;
    } else if (L.role == ROLE_WORKER) {
        omp_set_num_threads(threads);
        if (exchange(&L, "")) goto startup_failed;
        char name[32];
        snprintf(name, sizeof name, "worker-%d", L.role_rank);
        const int rc = redirect_output(r.run_dir, name) ? -2 : run_worker(&L, &r);
        if (rc == -2) { /* before its hello: the controller would wait for it; end the job */
            fprintf(stderr, "rollout-worker %s: %s\n", name, core_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        /* a worker that left (-1) exits 0: the controller went on without it, and the job's status is the trainer's */
        if (rc == -1) fprintf(stderr, "rollout-worker %s: left the run; the controller gives its work to the others\n", name);
        status = 0;
    } else {
        omp_set_num_threads(threads);
        char ep[REC] = "";
        int ok = 1;
        if (L.role_rank == 0) {
            signal(SIGUSR1, on_usr1);
            signal(SIGUSR2, on_usr2);
            size_t max_frame = 0;
            ok = !ctl_max_frame_bytes(L.r, &max_frame) && !bind_endpoint(&L, ep, sizeof ep) &&
                 (ctl = ctl_open(ep, &L.keys, max_frame, abort_check, NULL)) &&
                 !ctl_endpoint(ctl, ep, sizeof ep);
        }
        if (exchange(&L, ok ? ep : NULL)) goto startup_failed;
        if (L.role_rank == 0) {
            char rw[REC + 64] = "reward.endpoint: not a process of the job, plain ZeroMQ";
            if (L.reward_rank >= 0) snprintf(rw, sizeof rw, "CURVE; rank %d on %s", L.reward_rank, L.hosts[L.reward_rank]);
            fprintf(stderr, "vgrpo: one MPI job: %d trainer rank(s), %d rollout worker(s)%s; the run's keys went from "
                            "rank 0 to each rank over MPI\n"
                            "vgrpo: controller on %s (CURVE; address: %s)\n"
                            "vgrpo: reward server on %s (%s)\n",
                    L.n_role[ROLE_TRAINER], L.n_role[ROLE_WORKER], L.reward_rank >= 0 ? ", the reward server" : "",
                    L.ctl_ep, L.addr_how, L.rew_ep, rw);
        }
        const int rc = run_trainer(&L, &o, ctl, &clean_fail);
        if (rc) fprintf(stderr, "vgrpo trainer: %s\n", core_last_error());
        status = rc ? 1 : 0;
        if (rc && !clean_fail) MPI_Abort(MPI_COMM_WORLD, 1); /* as `vgrpo trainer`: every rank stops */
        if (L.role_rank == 0) {
            ctl_shutdown(ctl, 5.0);
            if (L.reward_rank >= 0 && stop_reward_server(&L)) { /* it would keep the job alive */
                fprintf(stderr, "vgrpo: the reward server at %s: %s; ending the job\n", L.rew_ep, core_last_error());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
    }
    goto done;
startup_failed:
    if (L.rank == 0) fprintf(stderr, "vgrpo mpi-rank: %s\n", core_last_error());
    status = 1;
done: /* every rank arrives here together after a start-up failure (each step's outcome is known to all) */
    ctl_close(ctl);
    memset(&L.keys, 0, sizeof L.keys);
    core_run_locks_release(&lk);
    if (loaded) core_recipe_release(&r);
    sp_comm_destroy(L.group);
    sp_comm_destroy(L.world);
    sp_comm_mpi_finalize();
    free(L.roles);
    free(L.hosts);
    free(sets.v);
    return status;
}
