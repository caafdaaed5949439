/* cli/colocated.h — the supervisor of a multi-process run (cli/colocated.c). */
#ifndef CLI_COLOCATED_H
#define CLI_COLOCATED_H

#include <stdint.h>

#include "core/recipe.h"

/* The refusals of a colocated job that need no process: a full-size Wan transformer or video (the CUDA backend's),
 * more trainer ranks than samples per step, a missing model.path. -1 naming the key. */
int colocated_check(const core_recipe *r);

/* `vgrpo run` with mode: colocated: starts the reward server, parallel.rollout_workers workers and
 * parallel.trainer_ranks trainer ranks (`vgrpo trainer`, through mpirun when more than one), waits for the trainer
 * and stops everything when any process fails (the error names it and its log). recipe_path and the --set
 * assignments are passed on to the children. A full-size Wan transformer is refused (needs the CUDA backend).
 * parity (NULL: the run): `vgrpo parity` instead, with this tolerance ("auto" or a number; see trainer_parity). */
int colocated_run(const char *recipe_path, const char *const *sets, int n_sets, const core_recipe *r, int64_t steps,
                  const char *resume, const char *parity);

#endif
