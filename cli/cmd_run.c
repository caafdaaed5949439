/* cli/cmd_run.c — `vgrpo run RECIPE [--set key.path=value ...] [--dry-run] [--steps N] [--resume DIR] [--overwrite]
 * [--max-restarts N]
 * [--launcher supervisor|mpirun [--hostfile FILE] [--np-trainer N] [--np-workers M] [--bind-host ADDR]] [--help-config]`;
 * `vgrpo run --resume DIR [--set ...]` without RECIPE takes the run's recorded recipe (cli/run_recipe.h).
 * Loads and checks the recipe (core/recipe.h; unknown keys and bad values name the key and line; then every check
 * that needs no weights: trainer_check_recipe, and local mode's own), then:
 *   --dry-run      prints the resolved recipe (every key, defaults included) and exits, without touching weights;
 *                  the estimate of trainer/budget/budget.h goes to stderr (stdout stays a valid recipe);
 *   mode: local    the GRPO loop (trainer/run/run.h) in this process with the in-process rollout source
 *                  (rollout/source_local.h: rollout engine, decoder and scorers here);
 *   mode: colocated: reward server, rollout workers and trainer rank(s) as separate processes (cli/colocated.c);
 *                  a full-size Wan transformer is refused on this CPU build (--dry-run checks its recipe);
 *   --launcher mpirun: the same processes as ONE MPI job (cli/launch_mpi.c): this process becomes `mpirun`
 *                  (exec) after the checks and the lock; --np-trainer / --np-workers set parallel.trainer_ranks /
 *                  parallel.rollout_workers (as --set would).
 * Every run first prints the estimate of memory and work (trainer/budget/budget.h) and refuses, before writing or
 * allocating anything, a recipe past the model's limits or (unless --force) past this machine's memory or
 * limits.max_step_minutes. One run per run folder: logging.run_dir and checkpoint.dir are locked (core/run_lock.h) for
 * the whole run; a second run into either is refused naming the holder's pid. A fresh run into a folder holding
 * checkpoints is refused unless --overwrite (trainer_claim_folders). Files are created 0600 and folders 0700 unless
 * logging.file_mode widens them, never through a symlink; a folder of another user, or one others can write, is
 * refused.
 * Exit status 0, 1 on failure, 2 on a usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/colocated.h"
#include "cli/commands.h"
#include "cli/launch_mpi.h"
#include "cli/model_init.h"
#include "cli/opts.h"
#include "cli/run_recipe.h"
#include "core/error.h"
#include "core/log.h"
#include "core/recipe.h"
#include "core/run_lock.h"
#include "core/gpu_assign.h"
#include "reward/learned.h"
#include "rollout/source_local.h"
#include "trainer/budget/budget.h"
#include "trainer/run/run.h"

/* Local mode: the in-process source and the loop. */
static int run_local(const core_recipe *r, const trainer_run_opts *o) {
    if (core_gpu_select(r, CORE_GPU_TRAINER, 0)) return -1; /* model.device cuda: the job's one GPU */
    core_rollout_source *src = rollout_source_local_open(r);
    if (!src) return -1;
    const int rc = trainer_run(r, o, src, NULL);
    rollout_source_local_close(src);
    return rc;
}

int cmd_run(int argc, char **argv) {
    const char *path = NULL;
    int dry = 0, help_config = 0, force = 0, overwrite = 0, max_restarts = COLOCATED_MAX_RESTARTS, restarts_seen = 0;
    trainer_run_opts o = {0};
    int steps = 0, np_trainer = 0, np_workers = 0;
    const char *launcher = "supervisor", *hostfile = NULL, *bind_host = NULL;
    opts_list sets = {.v = calloc((size_t)argc + 2, sizeof(char *)), .cap = argc};
    if (!sets.v) return 1;
    const opts_spec opts[] = {
        {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "key.path=value",
         .help = "override a recipe key (repeatable)"},
        {.name = "dry-run", .type = OPTS_FLAG, .flag = &dry,
         .help = "check the recipe (values, sizes, divisibility, prompt files; with --resume, against the "
                 "checkpoint's) without weights and print it resolved"},
        {.name = "steps", .type = OPTS_INT, .i = &steps, .min = 1, .max = 2000000000, .meta = "N",
         .help = "GRPO steps to run instead of optim.total_steps (the lr schedule keeps optim.total_steps)"},
        {.name = "resume", .type = OPTS_STRING, .str = &o.resume, .meta = "DIR",
         .help = "continue from DIR: a checkpoint-N folder, or a folder (its latest checkpoint that verifies); the\n"
                 "recipe must match the checkpoint's (optim.total_steps, checkpoint.*, logging.* and eval keys may\n"
                 "change). Without RECIPE: the run's recorded recipe, DIR/config.resolved.yaml or that of DIR's\n"
                 "parent (every --set of the run included; --set still applies on top)"},
        {.name = "overwrite", .type = OPTS_FLAG, .flag = &overwrite,
         .help = "start afresh in a run folder (checkpoint.dir) that holds an earlier run's checkpoints, deleting them\n"
                 "(without it such a run is refused: continue the earlier one with --resume)"},
        {.name = "force", .type = OPTS_FLAG, .flag = &force,
         .help = "run even when the estimate (trainer/budget/budget.h) exceeds the memory available or\n"
                 "limits.max_step_minutes (a warning instead of the refusal)"},
        {.name = "max-restarts", .type = OPTS_INT, .i = &max_restarts, .min = 0, .max = 1000000, .meta = "N", .seen = &restarts_seen,
         .help = "mode: colocated: restart a rollout worker or the reward server that dies, at most N times each\n"
                 "(default 3; 0: never); a lost worker's chunk goes to the others, and the run stops only when no\n"
                 "worker is left"},
        {.name = "launcher", .type = OPTS_STRING, .str = &launcher, .meta = "supervisor|mpirun",
         .help = "mode: colocated: `supervisor` (default) starts the processes on this machine over ipc:// and watches\n"
                 "them; `mpirun` runs them as one MPI job (vgrpo mpi-rank ranks over authenticated tcp://, keys sent\n"
                 "over MPI; a process that dies ends the job; README: the hostfile and srun forms)"},
        {.name = "hostfile", .type = OPTS_STRING, .str = &hostfile, .meta = "FILE",
         .help = "--launcher mpirun: mpirun's hostfile (default: this machine only)"},
        {.name = "np-trainer", .type = OPTS_INT, .i = &np_trainer, .min = 1, .max = 100000, .meta = "N",
         .help = "--launcher mpirun: trainer ranks (sets parallel.trainer_ranks)"},
        {.name = "np-workers", .type = OPTS_INT, .i = &np_workers, .min = 1, .max = 100000, .meta = "M",
         .help = "--launcher mpirun: rollout workers (sets parallel.rollout_workers)"},
        {.name = "bind-host", .type = OPTS_STRING, .str = &bind_host, .meta = "ADDR|IFACE",
         .help = "--launcher mpirun: the address (or interface name) the controller and the reward server bind\n"
                 "(default: 127.0.0.1 on one host, else the address that routes to the other hosts)"},
        {.name = "help-config", .type = OPTS_FLAG, .flag = &help_config,
         .help = "list every recipe key with its type, default and range"},
        {0}};
    const opts_pos pos[] = {{.name = "RECIPE", .dst = &path,
                             .help = "the recipe YAML (required unless --help-config or --resume)"},
                            {0}};
    const opts_cmd cmd = {
        .name = "run", .opts = opts, .pos = pos,
        .about = "Runs a GRPO recipe. mode: local rolls out, scores and trains in one process; mode: colocated starts\n"
                 "the reward server, parallel.rollout_workers rollout workers and parallel.trainer_ranks trainer ranks\n"
                 "(mpirun) and logs each under logging.run_dir/logs/ (--launcher mpirun: the same processes as one MPI\n"
                 "job, on this machine or a hostfile's hosts). Both write logging.run_dir/{config.resolved.yaml,\n"
                 "metrics.jsonl,rewards.jsonl}, checkpoint-N/ (checkpoint.every) and videos/ (logging.video_every)."};
    int status = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (status != OPTS_OK) {
        free(sets.v);
        return opts_exit_status(status);
    }
    if (help_config) {
        core_config_help(core_recipe_schema, stdout);
        free(sets.v);
        return 0;
    }
    const int mpi = !strcmp(launcher, "mpirun");
    /* --resume DIR alone: the run's recorded recipe (cli/run_recipe.h), so resuming needs no --set again */
    char recorded[4200];
    if (!path && o.resume) {
        if (run_recorded_recipe(o.resume, recorded, sizeof recorded)) {
            fprintf(stderr, "vgrpo run: %s\n", core_last_error());
            free(sets.v);
            return 1;
        }
        path = recorded;
        core_log_info("vgrpo run: no RECIPE given: the run's recorded recipe %s", path);
    }
    if (!path || (!mpi && strcmp(launcher, "supervisor")) || (!mpi && (hostfile || np_trainer || np_workers || bind_host)) ||
        (mpi && restarts_seen)) {
        status = !path ? opts_fail(&cmd, stderr, "RECIPE is required")
                 : !mpi && strcmp(launcher, "supervisor")
                     ? opts_fail(&cmd, stderr, "--launcher: expected supervisor or mpirun, got \"%s\"", launcher)
                 : mpi ? opts_fail(&cmd, stderr, "--max-restarts: restarts are the supervisor's; under --launcher mpirun "
                                                 "a process that dies ends the job (continue with --resume)")
                       : opts_fail(&cmd, stderr, "--hostfile, --np-trainer, --np-workers and --bind-host go with "
                                                 "--launcher mpirun");
        free(sets.v);
        return opts_exit_status(status);
    }
    if (overwrite && o.resume) {
        status = opts_fail(&cmd, stderr, "--overwrite starts afresh and --resume continues: give one of them");
        free(sets.v);
        return opts_exit_status(status);
    }
    char np_sets[2][64];
    if (np_trainer) snprintf(np_sets[0], sizeof np_sets[0], "parallel.trainer_ranks=%d", np_trainer), sets.v[sets.n++] = np_sets[0];
    if (np_workers) snprintf(np_sets[1], sizeof np_sets[1], "parallel.rollout_workers=%d", np_workers), sets.v[sets.n++] = np_sets[1];
    o.steps = steps;
    core_recipe r;
    core_run_locks lk = CORE_RUN_LOCKS_INIT;
    const budget_request q = {.job = BUDGET_JOB_RUN};
    status = 1;
    /* --hostfile: the GPU plan per node (core/gpu_assign.h) as mpirun will place the processes */
    if (core_recipe_load(&r, path, sets.v, sets.n) || (mpi && launch_mpi_check(&r)) ||
        (mpi && hostfile && launch_mpi_nodes(hostfile, &r)) || trainer_check_recipe(&r) ||
        (!mpi && r.choice.sync == CORE_SYNC_NCCL &&
         core_error("parallel.sync: nccl needs the rollout workers in the job's communicator: --launcher mpirun")) ||
        (r.choice.mode == CORE_MODE_LOCAL && rollout_source_local_check(&r))) {
        fprintf(stderr, "vgrpo run: %s\n", core_last_error());
    } else if (dry) {
        /* the estimate to stderr: stdout stays the resolved recipe */
        if ((o.resume && trainer_resume_check(&r, o.resume, 1, stderr)) || budget_preflight(&r, &q, force, stderr)) {
            fprintf(stderr, "vgrpo run: %s\n", core_last_error());
        } else {
            if (r.reward_endpoint) /* not asked here: the server need not be up for a dry run */
                fprintf(stderr, "note: reward.scorers and reward.weights are the reward server's at %s: the run asks "
                                "it at the start (its hello reply) and refuses a recipe list that differs\n",
                        r.reward_endpoint);
            if (r.choice.reduce == CORE_REDUCE_NCCL) /* recipes/README.md, "Gradient sums on GPUs" */
                fprintf(stderr, "note: parallel.reduce nccl: NCCL's own gradient sums (faster; not bit-identical "
                                "across trainer rank counts, nor with the CPU path; exact is)\n");
            /* model.device cuda: who runs on which GPU, per node (core/gpu_assign.h; checked already) */
            if (r.choice.device == CORE_CUDA) core_gpu_plan_print(stderr, &r, core_gpu_visible());
            printf("# %s: resolved (dry run; valid)\n", path);
            status = core_recipe_dump(&r, stdout) ? 1 : 0;
        }
    } else if (/* a colocated job's processes would each refuse another recipe, under mpirun's noise: refused here */
               (r.choice.mode == CORE_MODE_COLOCATED && o.resume && trainer_resume_check(&r, o.resume, 0, NULL)) ||
               reward_recipe_check(&r, 1) || budget_preflight(&r, &q, force, stdout) || ensure_model(&r) ||
               (r.choice.mode == CORE_MODE_COLOCATED && colocated_check(&r)) ||
               trainer_claim_folders(&r, o.resume, overwrite, &lk)) {
        fprintf(stderr, "vgrpo run: %s\n", core_last_error());
    } else {
        /* colocated: the run's processes hold the folder's lock too, so it stays locked while any of them lives */
        const int rc = mpi ? (core_run_locks_share(&lk) ||
                              launch_mpi_exec(path, sets.v, sets.n, &r, o.steps, o.resume, hostfile, bind_host)) /* returns on failure only */
                       : r.choice.mode == CORE_MODE_COLOCATED
                           ? (core_run_locks_share(&lk) || colocated_run(path, sets.v, sets.n, &r, o.steps, o.resume, NULL, max_restarts))
                           : run_local(&r, &o);
        if (rc) fprintf(stderr, "vgrpo run: %s\n", core_last_error());
        else status = 0;
    }
    core_run_locks_release(&lk);
    core_recipe_release(&r);
    free(sets.v);
    return status;
}
