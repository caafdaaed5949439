/* rollout/batch.h — one rollout request's samples from noise to scored trajectories, the one path of both rollout
 * sources (core/rollout_source.h): generate (rollout/engine.h; the image conditions as TI2V's first frame or
 * I2V-A14B's concatenated input, by the experts' wan_cond_kind), decode each final latent (rollout_decoder), trim the
 * trajectory to the request's SDE window, hash the video (xxh64) and score it through a callback. Its callers:
 *   - the in-process source (rollout/source_local.c): the recipe's scorers in this process, one sample at a time
 *     (one video buffer when the request returns no videos);
 *   - the rollout worker (rollout/worker.c): the whole batch in one request to the reward server.
 * Sample j's trajectory, video and rewards depend only on its own inputs (rollout/engine.h), and the weighted total is
 * summed in one place (reward/scorers.h reward_score_weighted), so a local run equals a colocated one bit for bit. */
#ifndef ROLLOUT_BATCH_H
#define ROLLOUT_BATCH_H

#include <stdint.h>

#include "core/trajectory.h"
#include "core/wire_rollout.h"
#include "rollout/engine.h"
#include "rollout/pipeline.h"

/* Scores samples j0 .. j0 + n - 1 of the batch: videos [n, vshape[0..3]] U8 (their decoded videos, contiguous;
 * vshape = [frames, height, width, 3]) into tr[0 .. n) (tr points at sample j0's trajectory): each trajectory's rewards
 * and total (core_traj_set_rewards). 0, or -1 with core_error naming the sample or the reward server. */
typedef int (*rollout_score_fn)(void *ctx, int j0, int n, const uint8_t *videos, const int64_t vshape[4],
                                core_traj *tr);

typedef struct {
    rollout_score_fn fn;
    void *ctx;
    int per_sample; /* 1: fn sees each sample right after its decode (n = 1); 0: the whole batch once, after the
                       last decode (needs the batch's videos kept: videos != NULL below) */
} rollout_scorer;

/* Rolls out samples[0 .. n) and scores them.
 *   rc      the sampling settings with the request applied (rollout_config_apply_request), rc->neg and, when asked,
 *           rc->velocities set; its conditions fields are left NULL (images gives them)
 *   E, ex   the experts and their executor (NULL: the CPU; rollout_generate)
 *   dec     the decoder from final latents to video (its latent shape is rc's)
 *   cond    [n] the prompts' embeddings [text_len, text_dim] fp32
 *   images  NULL (text to video), or [n] each sample's image condition: TI2V's first frame [C, 1, h, w] when the
 *           experts' wan_cond_kind is WAN_COND_LATENT, I2V-A14B's [K, F, h, w] when WAN_COND_CONCAT
 *   videos  NULL (the videos are not kept: one internal buffer, needs sc->per_sample), or [n, video bytes] U8 that
 *           receives every sample's video
 *   hash    NULL, or [n] receiving each video's xxh64 (core_xxh64, seed 0)
 *   tr      [n] receives the trajectories (rewards set, trimmed to the window; core_traj_free each)
 * Returns 0, or -1 with core_error (rollout_generate's, the decoder's, the scorer's); on error no trajectory is left
 * allocated (tr zeroed). */
int rollout_batch_run(const rollout_config *rc, const rollout_experts *E, const wan_exec *ex, rollout_decoder *dec,
                      int n, const core_rollout_sample *samples, const float *const *cond, const float *const *images,
                      const rollout_scorer *sc, uint8_t *videos, uint64_t *hash, core_traj *tr);

#endif
