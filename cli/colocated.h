/* cli/colocated.h — the supervisor of a multi-process run (cli/colocated.c). */
#ifndef CLI_COLOCATED_H
#define CLI_COLOCATED_H

#include <stdint.h>

#include "core/recipe.h"

/* The refusals of a colocated job that need no process: a full-size Wan transformer or video (the CUDA backend's),
 * more trainer ranks than samples per step, a missing model.path, model.decoder latent_rgb with a factor other than 8
 * (rollout_decoder_check; a VAE's factor is the start-up estimate's check). -1 naming the key. */
int colocated_check(const core_recipe *r);

/* Restarts of each rollout worker and of the reward server a colocated job makes by default (`--max-restarts`). */
#define COLOCATED_MAX_RESTARTS 3

/* `vgrpo run` with mode: colocated: starts the reward server, parallel.rollout_workers workers and
 * parallel.trainer_ranks trainer ranks (`vgrpo trainer`, through mpirun when more than one), waits for the trainer,
 * restarts a rollout worker or the reward server that dies (at most max_restarts times each; the run goes on: see
 * cli/colocated.c), and stops everything when the trainer fails, when no worker is left or the reward server is past
 * its restarts (the error names them and their logs). recipe_path and the --set assignments are passed on to the
 * children. A full-size Wan transformer is refused (needs the CUDA backend).
 * parity (NULL: the run): `vgrpo parity` instead, with this tolerance ("auto" or a number; see trainer_parity). */
int colocated_run(const char *recipe_path, const char *const *sets, int n_sets, const core_recipe *r, int64_t steps,
                  const char *resume, const char *parity, int max_restarts);

#endif
