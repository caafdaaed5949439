/* cli/cmd_run.c — `vgrpo run RECIPE [--set key.path=value ...] [--dry-run] [--steps N] [--help-config]`.
 * Loads and checks the recipe (core/recipe.h; unknown keys and bad values name the key and line), then:
 *   --dry-run      prints the resolved recipe (every key, defaults included) and exits, without touching weights
 *                  (prompt files are read and checked);
 *   mode: local    runs rollout, reward and training in this process (cli/grpo_run.c);
 *   mode: colocated: reward server, rollout workers and trainer rank(s) as separate processes (cli/colocated.c);
 *                  a full-size Wan transformer is refused on this CPU build (--dry-run checks its recipe).
 * --steps N replaces optim.total_steps as the number of GRPO steps to run (the lr schedule is unchanged).
 * --resume DIR continues from a checkpoint (DIR: checkpoint-N, or a folder meaning its latest complete one).
 * Exit status 0, 1 on failure, 2 on a usage error. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/grpo_run.h"
#include "core/error.h"
#include "core/recipe.h"

static void usage(FILE *f) {
    fprintf(f, "usage: vgrpo run RECIPE [--set key.path=value ...] [--dry-run] [--steps N] [--resume DIR]\n"
               "       vgrpo run --help-config     (every recipe key with its type, default and range)\n\n"
               "Runs a GRPO recipe. mode: local rolls out, scores and trains in one process; mode: colocated starts\n"
               "the reward server, parallel.rollout_workers rollout workers and parallel.trainer_ranks trainer ranks\n"
               "(mpirun) and logs each under logging.run_dir/logs/. Both write logging.run_dir/{config.resolved.yaml,\n"
               "metrics.jsonl,rewards.jsonl}, checkpoint-N/ (checkpoint.every) and videos/ (logging.video_every).\n"
               "--dry-run checks the recipe (values, sizes, divisibility) without weights and prints it resolved.\n"
               "--resume DIR continues a run from DIR: a checkpoint-N folder, or a folder (its latest complete\n"
               "checkpoint); the recipe must match the checkpoint's (optim.total_steps, checkpoint.*, logging.* and\n"
               "eval keys may change).\n");
}

int cmd_run(int argc, char **argv) {
    const char *path = NULL, *resume = NULL;
    const char **sets = calloc((size_t)argc, sizeof(char *));
    int n_sets = 0, dry = 0, status = 2;
    int64_t steps = 0;
    if (!sets) return 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            status = 0;
            goto out;
        } else if (!strcmp(argv[i], "--help-config")) {
            core_config_help(core_recipe_schema, stdout);
            status = 0;
            goto out;
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            sets[n_sets++] = argv[++i];
        } else if (!strncmp(argv[i], "--set=", 6)) {
            sets[n_sets++] = argv[i] + 6;
        } else if (!strcmp(argv[i], "--dry-run")) {
            dry = 1;
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            char *end;
            errno = 0;
            steps = strtoll(argv[++i], &end, 10);
            if (*end || errno || steps < 1) {
                fprintf(stderr, "vgrpo run: --steps: expected a positive integer, got \"%s\"\n", argv[i]);
                goto out;
            }
        } else if (!strcmp(argv[i], "--resume") && i + 1 < argc) {
            resume = argv[++i];
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else {
            fprintf(stderr, "vgrpo run: unknown or incomplete option \"%s\"\n\n", argv[i]);
            usage(stderr);
            goto out;
        }
    }
    if (!path) {
        fprintf(stderr, "vgrpo run: a recipe file is required\n\n");
        usage(stderr);
        goto out;
    }
    core_recipe r;
    status = 1;
    if (core_recipe_load(&r, path, sets, n_sets) || local_check_recipe(&r)) {
        fprintf(stderr, "vgrpo run: %s\n", core_last_error());
    } else if (dry) {
        printf("# %s: resolved (dry run; valid)\n", path);
        status = core_recipe_dump(&r, stdout) ? 1 : 0;
    } else if (ensure_model(&r)) {
        fprintf(stderr, "vgrpo run: %s\n", core_last_error());
    } else if (!strcmp(r.mode, "colocated")) {
        if (colocated_run(path, sets, n_sets, &r, steps, resume, NULL)) fprintf(stderr, "vgrpo run: %s\n", core_last_error());
        else status = 0;
    } else if (local_run(&r, steps, resume)) {
        fprintf(stderr, "vgrpo run: %s\n", core_last_error());
    } else {
        status = 0;
    }
    core_recipe_release(&r);
out:
    free(sets);
    return status;
}
