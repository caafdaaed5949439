/* cli/cmd_run.c — `vgrpo run RECIPE [--set key.path=value ...] [--dry-run] [--steps N] [--resume DIR] [--max-restarts N]
 * [--help-config]`.
 * Loads and checks the recipe (core/recipe.h; unknown keys and bad values name the key and line; then every check
 * that needs no weights: trainer_check_recipe, and local mode's own), then:
 *   --dry-run      prints the resolved recipe (every key, defaults included) and exits, without touching weights;
 *                  the estimate of trainer/budget.h goes to stderr (stdout stays a valid recipe);
 *   mode: local    the GRPO loop (trainer/run.h) in this process with the in-process rollout source
 *                  (cli/source_local.h: rollout engine, decoder and scorers here);
 *   mode: colocated: reward server, rollout workers and trainer rank(s) as separate processes (cli/colocated.c);
 *                  a full-size Wan transformer is refused on this CPU build (--dry-run checks its recipe).
 * Every run first prints the estimate of memory and work (trainer/budget.h) and refuses, before writing or
 * allocating anything, a recipe past the model's limits or (unless --force) past this machine's memory or
 * limits.max_step_minutes. One run per run folder: the folder is locked (core/run_lock.h) for the whole run; a second run into it is refused
 * naming the holder's pid.
 * Exit status 0, 1 on failure, 2 on a usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/colocated.h"
#include "cli/commands.h"
#include "cli/model_init.h"
#include "cli/opts.h"
#include "cli/source_local.h"
#include "core/error.h"
#include "core/log.h"
#include "core/recipe.h"
#include "core/run_lock.h"
#include "trainer/budget.h"
#include "trainer/run.h"

/* Local mode: the in-process source and the loop. */
static int run_local(const core_recipe *r, const trainer_run_opts *o) {
    trainer_source *src = source_local_open(r);
    if (!src) return -1;
    const int rc = trainer_run(r, o, src, NULL);
    source_local_close(src);
    return rc;
}

int cmd_run(int argc, char **argv) {
    const char *path = NULL;
    int dry = 0, help_config = 0, force = 0, max_restarts = COLOCATED_MAX_RESTARTS;
    trainer_run_opts o = {0};
    int steps = 0;
    opts_list sets = {.v = calloc((size_t)argc, sizeof(char *)), .cap = argc};
    if (!sets.v) return 1;
    const opts_spec opts[] = {
        {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "key.path=value",
         .help = "override a recipe key (repeatable)"},
        {.name = "dry-run", .type = OPTS_FLAG, .flag = &dry,
         .help = "check the recipe (values, sizes, divisibility, prompt files) without weights and print it resolved"},
        {.name = "steps", .type = OPTS_INT, .i = &steps, .min = 1, .max = 2000000000, .meta = "N",
         .help = "GRPO steps to run instead of optim.total_steps (the lr schedule keeps optim.total_steps)"},
        {.name = "resume", .type = OPTS_STRING, .str = &o.resume, .meta = "DIR",
         .help = "continue from DIR: a checkpoint-N folder, or a folder (its latest checkpoint that verifies); the\n"
                 "recipe must match the checkpoint's (optim.total_steps, checkpoint.*, logging.* and eval keys may\n"
                 "change)"},
        {.name = "force", .type = OPTS_FLAG, .flag = &force,
         .help = "run even when the estimate (trainer/budget.h) exceeds the memory available or\n"
                 "limits.max_step_minutes (a warning instead of the refusal)"},
        {.name = "max-restarts", .type = OPTS_INT, .i = &max_restarts, .min = 0, .max = 1000000, .meta = "N",
         .help = "mode: colocated: restart a rollout worker or the reward server that dies, at most N times each\n"
                 "(default 3; 0: never); a lost worker's chunk goes to the others, and the run stops only when no\n"
                 "worker is left"},
        {.name = "help-config", .type = OPTS_FLAG, .flag = &help_config,
         .help = "list every recipe key with its type, default and range"},
        {0}};
    const opts_pos pos[] = {{.name = "RECIPE", .dst = &path, .help = "the recipe YAML (required unless --help-config)"},
                            {0}};
    const opts_cmd cmd = {
        .name = "run", .opts = opts, .pos = pos,
        .about = "Runs a GRPO recipe. mode: local rolls out, scores and trains in one process; mode: colocated starts\n"
                 "the reward server, parallel.rollout_workers rollout workers and parallel.trainer_ranks trainer ranks\n"
                 "(mpirun) and logs each under logging.run_dir/logs/. Both write logging.run_dir/{config.resolved.yaml,\n"
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
    if (!path) {
        status = opts_fail(&cmd, stderr, "RECIPE is required");
        free(sets.v);
        return opts_exit_status(status);
    }
    o.steps = steps;
    core_recipe r;
    core_run_lock lk = {.fd = -1};
    char note[512] = "";
    const budget_request q = {.job = BUDGET_JOB_RUN};
    status = 1;
    if (core_recipe_load(&r, path, sets.v, sets.n) || trainer_check_recipe(&r) ||
        (!strcmp(r.mode, "local") && source_local_check(&r))) {
        fprintf(stderr, "vgrpo run: %s\n", core_last_error());
    } else if (dry) {
        /* the estimate to stderr: stdout stays the resolved recipe */
        if (budget_preflight(&r, &q, force, stderr)) {
            fprintf(stderr, "vgrpo run: %s\n", core_last_error());
        } else {
            printf("# %s: resolved (dry run; valid)\n", path);
            status = core_recipe_dump(&r, stdout) ? 1 : 0;
        }
    } else if (budget_preflight(&r, &q, force, stdout) || ensure_model(&r) || (!strcmp(r.mode, "colocated") && colocated_check(&r)) ||
               core_run_lock_acquire(&lk, r.run_dir, "logging.run_dir", note, sizeof note)) {
        fprintf(stderr, "vgrpo run: %s\n", core_last_error());
    } else {
        if (note[0]) core_log_warn("%s", note);
        /* colocated: the run's processes hold the folder's lock too, so it stays locked while any of them lives */
        const int rc = !strcmp(r.mode, "colocated")
                           ? (core_run_lock_share(&lk) || colocated_run(path, sets.v, sets.n, &r, o.steps, o.resume, NULL, max_restarts))
                           : run_local(&r, &o);
        if (rc) fprintf(stderr, "vgrpo run: %s\n", core_last_error());
        else status = 0;
    }
    core_run_lock_release(&lk);
    core_recipe_release(&r);
    free(sets.v);
    return status;
}
