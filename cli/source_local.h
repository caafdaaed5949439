/* cli/source_local.h — the in-process rollout source of local mode (see cli/source_local.c and trainer/source.h). */
#ifndef CLI_SOURCE_LOCAL_H
#define CLI_SOURCE_LOCAL_H

#include "core/recipe.h"
#include "trainer/source.h"

/* The recipe checks of local mode that need no weights (also at --dry-run): parallel.rollout_workers 1, no
 * reward.endpoint, model.vae_scale_factor_spatial 8 with model.decoder latent_rgb (a VAE's factor is checked against
 * the key by the start-up estimate and the decoder's loading). -1 naming the key. */
int source_local_check(const core_recipe *r);

/* Loads the decoder (model.decoder) and looks up the scorers for recipe r (kept by reference). The experts come
 * later, through the source's start/push_weights. NULL with an error naming the key or path. */
trainer_source *source_local_open(const core_recipe *r);
void source_local_close(trainer_source *s);

#endif
