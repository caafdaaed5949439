/* cli/cmd_parity.c — `vgrpo parity RECIPE [--tolerance T] [--set key=value ...]`: the train/rollout log-prob parity
 * check (DESIGN.md section 1, job 3). The processes of a colocated run (cli/colocated.c: reward server, rollout
 * workers, trainer ranks) run one rollout batch at policy version 0, and the trainer ranks recompute the velocity
 * and log-prob of every trainable transition through the training code path (cli/grpo_run.c: grpo_parity). Per
 * step index it prints the transitions, mean and max |logp_trainer - logp_rollout| and max |v_trainer -
 * v_rollout|, writes logging.run_dir/parity.json, and exits 1 when a maximum exceeds the tolerance.
 * Default tolerance: 0 where trainer and rollout compute identically (CPU, fp32, sp = 1 or pure Ulysses: per-sample
 * results do not depend on batch size, batch mates, micro-batch size or thread count), so across processes the
 * differences are exactly 0; with ring attention in the trainer, the fp32 bound documented at grpo_parity. The recipe's mode is ignored (parity always runs the separate processes).
 * Exit status 0, 1 on failure or a difference past the tolerance, 2 on a usage error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/grpo_run.h"
#include "core/error.h"
#include "core/recipe.h"

static void usage(FILE *f) {
    fprintf(f, "usage: vgrpo parity RECIPE [--tolerance T] [--set key.path=value ...]\n"
               "  --tolerance T  largest |logp_trainer - logp_rollout| and |v_trainer - v_rollout| accepted (default:\n"
               "                 0, or with ring attention in the trainer (parallel.sp / ulysses_degree > 1) the fp32\n"
               "                 bound 32 eps x max|v| and 32 eps x max(1, max|logp|))\n"
               "Writes logging.run_dir/parity.json; exit status 1 past the tolerance.\n");
}

int cmd_parity(int argc, char **argv) {
    const char *path = NULL;
    const char *tol_arg = "auto";
    const char **sets = calloc((size_t)argc, sizeof(char *));
    int n_sets = 0, status = 2;
    if (!sets) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            status = 0;
            goto out;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else if (i + 1 < argc && !strcmp(a, "--set")) {
            sets[n_sets++] = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--tolerance")) {
            char *end;
            tol_arg = argv[++i];
            const double tol = strtod(tol_arg, &end);
            if (*end || !(tol >= 0) || !isfinite(tol)) {
                fprintf(stderr, "vgrpo parity: --tolerance: expected a number >= 0, got \"%s\"\n", argv[i]);
                goto out;
            }
        } else {
            fprintf(stderr, "vgrpo parity: unknown or incomplete option \"%s\"\n\n", a);
            usage(stderr);
            goto out;
        }
    }
    if (!path) {
        fprintf(stderr, "vgrpo parity: a recipe file is required\n\n");
        usage(stderr);
        goto out;
    }
    core_recipe r;
    status = 1;
    if (core_recipe_load(&r, path, sets, n_sets) || local_check_recipe(&r) || ensure_model(&r))
        fprintf(stderr, "vgrpo parity: %s\n", core_last_error());
    else if (colocated_run(path, sets, n_sets, &r, 0, NULL, tol_arg)) fprintf(stderr, "vgrpo parity: %s\n", core_last_error());
    else status = 0;
    core_recipe_release(&r);
out:
    free(sets);
    return status;
}
