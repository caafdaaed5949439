/* cli/cmd_trainer.c — `vgrpo trainer RECIPE --controller ENDPOINT --workers M [--resume DIR] [--steps N]
 * [--set key=value ...]`: the trainer process(es) of a colocated run (docs/design.md section 3). `vgrpo run` starts it
 * (alone, or `mpirun -n N --bind-to none vgrpo trainer ...`) after the reward server and the rollout workers.
 * Rank 0 is the controller: it binds the ROUTER the workers connect to, waits for their hello, and runs the GRPO loop
 * (trainer/run/run.h: trainer_run over the remote rollout source, core/rollout_source.h); ranks > 0 train on their share of
 * every batch (trainer_follow). Without mpirun (no
 * OMPI_COMM_WORLD_SIZE in the environment) it runs as one rank without initialising MPI.
 * SIGINT/SIGTERM: a step stopped before its optimizer update is discarded (after it: the step finishes), the checkpoint
 * of the steps done is saved (checkpoint.every >= 0), and it exits 1 (trainer/run/run.h).
 * Exit status 0, 1 on failure (a failing rank > 0 aborts the MPI job), 2 on a usage error. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <mpi.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "core/curve.h"
#include "core/error.h"
#include "core/log.h"
#include "core/recipe.h"
#include "core/stop.h"
#include "sp/comm.h"
#include "trainer/net/controller.h"
#include "trainer/run/run.h"
#include "trainer/net/source_remote.h"

#define TRAINER_HELLO_TIMEOUT_S 600.0
#define TRAINER_CTL_TIMEOUT_S 3600.0

/* SIGUSR1 (sent by `vgrpo run` when another process of the job failed): stop waiting for the workers at once.
 * SIGINT/SIGTERM are graceful: the step in progress is discarded or finished and a checkpoint saved (core/stop.h), except
 * while waiting for the workers' hello, where there is no step to finish. */
static volatile sig_atomic_t abort_flag = 0, in_hello = 0;
static void on_usr1(int sig) {
    (void)sig;
    abort_flag = 1;
}

/* SIGUSR2 (sent by `vgrpo run` through mpirun, which forwards SIGUSR1/SIGUSR2 to every rank but kills the job on
 * SIGTERM): rank 0 takes it as SIGTERM (graceful stop, its handler from core/stop.h); ranks > 0 ignore it and
 * stop when rank 0 does. */
static void on_usr2(int sig) {
    (void)sig;
    kill(getpid(), SIGTERM);
}

static int abort_check(void *ctx) {
    (void)ctx;
    if (abort_flag) return core_error("stopped (SIGUSR1): another process of the run failed");
    const int sig = core_stop_interrupt(); /* the hello, and inside a GRPO step (trainer_run's handlers) */
    return sig ? core_error("stopped by signal %d while waiting for the rollout workers", sig) : 0;
}

int cmd_trainer(int argc, char **argv) {
    const char *mpi_rank = getenv("OMPI_COMM_WORLD_RANK");
    signal(SIGUSR2, mpi_rank && atoi(mpi_rank) > 0 ? SIG_IGN : on_usr2); /* first: `vgrpo run` may send it early */
    const char *path = NULL, *endpoint = NULL;
    const char *parity = NULL; /* `vgrpo parity` with this tolerance ("auto" or a number) */
    int workers = 0, steps = 0, keys_fd = -1;
    const char *keys_file = NULL;
    trainer_run_opts o = {0};
    opts_list sets = {.v = calloc((size_t)argc, sizeof(char *)), .cap = argc};
    if (!sets.v) return 1;
    const opts_spec opts[] = {
        {.name = "controller", .type = OPTS_STRING, .str = &endpoint, .required = 1, .meta = "ENDPOINT",
         .help = "the ROUTER endpoint rank 0 binds for the rollout workers"},
        {.name = "workers", .type = OPTS_INT, .i = &workers, .required = 1, .min = 1, .max = CTL_MAX_WORKERS,
         .meta = "M", .help = "rollout workers to wait for"},
        {.name = "resume", .type = OPTS_STRING, .str = &o.resume, .meta = "DIR", .help = "continue from a checkpoint"},
        {.name = "steps", .type = OPTS_INT, .i = &steps, .min = 1, .max = 2000000000, .meta = "N",
         .help = "GRPO steps instead of optim.total_steps"},
        {.name = "parity", .type = OPTS_STRING, .str = &parity, .meta = "TOLERANCE",
         .help = "run `vgrpo parity` instead of the loop (\"auto\" or a number)"},
        {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "key.path=value",
         .help = "override a recipe key (repeatable)"},
        {.name = "keys-fd", .type = OPTS_INT, .i = &keys_fd, .min = 0, .max = 1 << 20, .meta = "N",
         .help = "read the run's keys (core/curve.h) from inherited descriptor N (rank 0)"},
        {.name = "keys-file", .type = OPTS_STRING, .str = &keys_file, .meta = "PATH",
         .help = "read the run's keys from a file of mode 0600 (rank 0)"},
        {0}};
    const opts_pos pos[] = {{.name = "RECIPE", .dst = &path, .required = 1, .help = "the recipe YAML"}, {0}};
    const opts_cmd cmd = {.name = "trainer", .opts = opts, .pos = pos,
                          .about = "The trainer of a colocated run; `vgrpo run RECIPE` starts it with the workers and "
                                   "the reward server."};
    const int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) {
        free(sets.v);
        return opts_exit_status(prc);
    }
    o.steps = steps;
    sp_comm *world = NULL;
    const int use_mpi = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
    if (use_mpi ? sp_comm_mpi_world(&argc, &argv, &world) : !(world = sp_comm_self("world"))) {
        fprintf(stderr, "vgrpo trainer: %s\n", core_last_error());
        free(sets.v);
        return 1;
    }
    core_log_set_rank(world->rank);
    signal(SIGUSR1, on_usr1);
    core_recipe r;
    int status = 1;
    ctl_server *ctl = NULL;
    int clean_fail = 0;
    if (core_recipe_load(&r, path, sets.v, sets.n) || trainer_check_recipe(&r)) {
        fprintf(stderr, "vgrpo trainer: %s\n", core_last_error());
    } else if (r.trainer_ranks != world->size) {
        fprintf(stderr, "vgrpo trainer: parallel.trainer_ranks is %d but %d rank(s) were started\n", r.trainer_ranks,
                world->size);
    } else if (r.prompts_per_step * r.samples_per_prompt < world->size) {
        fprintf(stderr, "vgrpo trainer: parallel.trainer_ranks %d exceeds the %d samples of a step (B x G)\n",
                world->size, r.prompts_per_step * r.samples_per_prompt);
    } else if (world->rank > 0) {
        if (trainer_follow(&r, &o, world)) fprintf(stderr, "vgrpo trainer rank %d: %s\n", world->rank, core_last_error());
        else status = 0;
    } else {
        core_stop_install();
        in_hello = 1;
        core_curve_keys keys;
        int keyed = 0;
        const int krc = core_curve_options(keys_fd, keys_file, &keys, &keyed);
        if (!krc && !keyed)
            core_log_warn("vgrpo trainer: no keys (--keys-fd / --keys-file): the controller channel is not authenticated");
        size_t max_frame = 0;
        const int hello_failed = krc || ctl_max_frame_bytes(&r, &max_frame) ||
                                 !(ctl = ctl_open(endpoint, keyed ? &keys : NULL, max_frame, abort_check, NULL)) ||
                                 ctl_set_sync_bucket(ctl, (int64_t)r.sync_bucket_mib << 20) ||
                                 (ctl_set_sync(ctl, (int)r.choice.sync, NULL), 0) ||
                                 ctl_wait_workers(ctl, workers, TRAINER_HELLO_TIMEOUT_S);
        /* the hello's handlers go before trainer_run installs its own (afresh: they would forget a signal already
         * received, so a stop that came as the last hello arrived is taken here); from here until then a signal takes
         * the default action, which `vgrpo run` reports as a stop too */
        core_stop_restore();
        if (hello_failed) {
            fprintf(stderr, "vgrpo trainer: %s\n", core_last_error());
        } else if (core_stop_pending()) {
            fprintf(stderr, "vgrpo trainer: stopped by signal %d while waiting for the rollout workers\n",
                    core_stop_pending());
        } else {
            in_hello = 0;
            /* a worker lost mid-run: its chunk goes to the others; with none left, wait for `vgrpo run` to restart one
             * (as long as for the first hellos); `vgrpo run` stops the run itself (SIGUSR1) when it restarts no more */
            ctl_set_rejoin_wait(ctl, TRAINER_HELLO_TIMEOUT_S);
            core_rollout_source *src = trainer_source_remote(ctl, r.batch_size, TRAINER_CTL_TIMEOUT_S, r.model_path);
            const int prc = !src ? -1
                            : parity ? trainer_parity_opts(&r, &o, src, world, strcmp(parity, "auto") ? atof(parity) : -1.0)
                                     : trainer_run(&r, &o, src, world);
            trainer_source_remote_free(src);
            if (prc) fprintf(stderr, "vgrpo trainer: %s\n", core_last_error());
            status = prc == 0 ? 0 : 1;
            clean_fail = prc == 1; /* parity past its tolerance, or a run stopped by a signal: every rank finished */
        }
        if (ctl) ctl_shutdown(ctl, 5.0);
        ctl_close(ctl);
    }
    if (status && !clean_fail && use_mpi && world->size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    core_recipe_release(&r);
    sp_comm_destroy(world);
    if (use_mpi) sp_comm_mpi_finalize();
    free(sets.v);
    return status;
}
