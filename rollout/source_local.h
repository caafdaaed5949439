/* rollout/source_local.h — the in-process rollout source of local mode (rollout/source_local.c; the interface is
 * core/rollout_source.h). */
#ifndef ROLLOUT_SOURCE_LOCAL_H
#define ROLLOUT_SOURCE_LOCAL_H

#include "core/recipe.h"
#include "core/rollout_source.h"

/* The recipe checks of local mode that need no weights (also at --dry-run): parallel.rollout_workers 1, no
 * reward.endpoint, model.vae_scale_factor_spatial 8 with model.decoder latent_rgb (a VAE's factor is checked against
 * the key by the start-up estimate and the decoder's loading). -1 naming the key. */
int rollout_source_local_check(const core_recipe *r);

/* Loads the decoder (model.decoder) and looks up the scorers for recipe r (kept by reference). The experts come
 * later, through the source's start/push_weights. NULL with an error naming the key or path. */
core_rollout_source *rollout_source_local_open(const core_recipe *r);
void rollout_source_local_close(core_rollout_source *s);

#endif
