/* cli/cmd_parity.c — `vgrpo parity RECIPE [--tolerance T] [--checkpoint DIR] [--set key=value ...]`: the
 * train/rollout log-prob parity check (docs/design.md section 1, job 3). The processes of a colocated run
 * (cli/colocated.c: reward server, rollout workers, trainer ranks) run one rollout batch at policy version 0 (with
 * --checkpoint: the checkpoint's weights and version, loaded as `vgrpo run --resume` loads them, so the recipe must
 * be the run's; a LoRA checkpoint's adapters are synced to the workers), and the trainer ranks recompute the velocity
 * and log-prob of every trainable transition through the training code path (trainer/run/parity.c: trainer_parity). Per
 * step index it prints the transitions, mean and max |logp_trainer - logp_rollout| and max |v_trainer -
 * v_rollout|, writes logging.run_dir/parity.json, and exits 1 when a maximum exceeds the tolerance.
 * Default tolerance: 0 where trainer and rollout compute identically (CPU, fp32, sp = 1 or pure Ulysses: per-sample
 * results do not depend on batch size, batch mates, micro-batch size or thread count), so across processes the
 * differences are exactly 0; with ring attention in the trainer, the fp32 bound documented at trainer_parity (trainer/run/run.h). The recipe's mode is ignored (parity always runs the separate processes).
 * It first prints the estimate of memory and work (trainer/budget/budget.h) and refuses what does not fit (--force: runs
 * anyway). Exit status 0, 1 on failure or a difference past the tolerance, 2 on a usage error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/colocated.h"
#include "cli/model_init.h"
#include "cli/opts.h"
#include "core/error.h"
#include "core/recipe.h"
#include "core/fs.h"
#include "core/run_lock.h"
#include "trainer/budget/budget.h"
#include "trainer/run/run.h"

int cmd_parity(int argc, char **argv) {
    const char *path = NULL, *checkpoint = NULL;
    double tol = -1;
    int tol_given = 0, force = 0;
    opts_list sets = {.v = calloc((size_t)argc, sizeof(char *)), .cap = argc};
    if (!sets.v) return 1;
    const opts_spec opts[] = {
        {.name = "tolerance", .type = OPTS_DOUBLE, .d = &tol, .min = 0, .max = 1e300, .seen = &tol_given, .meta = "T",
         .help = "largest |logp_trainer - logp_rollout| and |v_trainer - v_rollout| accepted (default: 0, or with\n"
                 "ring attention in the trainer (parallel.sp / ulysses_degree > 1) the fp32 bound 32 eps x max|v| and\n"
                 "32 eps x max(1, max|logp|)); on model.device cuda 8 bf16 eps (2^-8) instead of 32 fp32 eps)"},
        {.name = "checkpoint", .type = OPTS_STRING, .str = &checkpoint, .meta = "DIR",
         .help = "the weights of a checkpoint of this recipe's run (a checkpoint-N folder, or a folder: its\n"
                 "latest), loaded as --resume loads them; a LoRA checkpoint's adapters go to the workers\n"
                 "(default: model.path's initial weights, policy version 0)"},
        {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "key.path=value",
         .help = "override a recipe key (repeatable)"},
        {.name = "force", .type = OPTS_FLAG, .flag = &force,
         .help = "run even when the estimate (trainer/budget/budget.h) exceeds the memory available or\n"
                 "limits.max_step_minutes (a warning instead of the refusal)"},
        {0}};
    const opts_pos pos[] = {{.name = "RECIPE", .dst = &path, .required = 1, .help = "the recipe YAML"}, {0}};
    const opts_cmd cmd = {.name = "parity", .opts = opts, .pos = pos,
                          .epilog = "Writes logging.run_dir/parity.json; exit status 1 past the tolerance."};
    int status = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (status != OPTS_OK) {
        free(sets.v);
        return opts_exit_status(status);
    }
    char tol_arg[64] = "auto";
    if (tol_given) snprintf(tol_arg, sizeof tol_arg, "%.17g", tol);
    core_recipe r;
    core_run_lock lk = {.fd = -1};
    const budget_request q = {.job = BUDGET_JOB_PARITY};
    status = 1;
    if (core_recipe_load(&r, path, sets.v, sets.n) || trainer_check_recipe(&r) ||
        budget_preflight(&r, &q, force, stdout) || ensure_model(&r) || colocated_check(&r) || core_file_mode_apply(r.file_mode) ||
        core_run_lock_acquire(&lk, r.run_dir, "logging.run_dir", NULL, 0))
        fprintf(stderr, "vgrpo parity: %s\n", core_last_error());
    else if (colocated_run(path, sets.v, sets.n, &r, 0, checkpoint, tol_arg, COLOCATED_MAX_RESTARTS))
        fprintf(stderr, "vgrpo parity: %s\n", core_last_error());
    else status = 0;
    core_run_lock_release(&lk);
    core_recipe_release(&r);
    free(sets.v);
    return status;
}
