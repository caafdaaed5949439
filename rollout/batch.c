/* rollout/batch.c — a rollout request's samples: generate, decode, trim, hash, score (see rollout/batch.h). */
#include "rollout/batch.h"

#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/error.h"

int rollout_batch_run(const rollout_config *rc, const rollout_experts *E, const wan_exec *ex, rollout_decoder *dec,
                      int n, const core_rollout_sample *samples, const float *const *cond, const float *const *images,
                      const rollout_scorer *sc, uint8_t *videos, uint64_t *hash, core_traj *tr) {
    if (!videos && !sc->per_sample) return core_error("rollout: a batch scorer needs the batch's videos kept");
    rollout_config r = *rc;
    if (images) { /* Wan 2.2 I2V-A14B: concatenated to every input; else TI2V's first frame */
        if (wan_cond_kind(&E->expert[0]->cfg) == WAN_COND_CONCAT) r.concat_conditions = images;
        else r.conditions = images;
    }
    const int64_t vb = rollout_decoder_video_bytes(dec);
    const int64_t vshape[4] = {dec->frames, dec->height, dec->width, 3};
    uint64_t *uids = malloc(sizeof(uint64_t) * (size_t)n);
    int64_t *pidx = malloc(sizeof(int64_t) * (size_t)n);
    uint8_t *one = videos ? NULL : malloc((size_t)vb);
    int have = 0, rc_ = -1;
    if (!uids || !pidx || (!videos && !one)) {
        core_error("out of memory for %d samples", n);
        goto done;
    }
    for (int j = 0; j < n; j++) uids[j] = samples[j].uid, pidx[j] = samples[j].prompt_index;
    if (rollout_generate(&r, E, ex, n, cond, uids, pidx, tr)) goto done;
    have = 1;
    for (int j = 0; j < n; j++) {
        uint8_t *v = videos ? videos + vb * j : one;
        if (rollout_decoder_decode_traj(dec, &tr[j], v) ||
            (sc->per_sample && sc->fn(sc->ctx, j, 1, v, vshape, &tr[j])) || rollout_trim_to_window(&r, &tr[j]))
            goto done;
        if (hash) hash[j] = core_xxh64(v, (size_t)vb, 0);
    }
    if (!sc->per_sample && sc->fn(sc->ctx, 0, n, videos, vshape, tr)) goto done;
    rc_ = 0;
done:
    if (rc_ && have)
        for (int j = 0; j < n; j++) core_traj_free(&tr[j]);
    if (rc_) memset(tr, 0, sizeof *tr * (size_t)n);
    free(uids), free(pidx), free(one);
    return rc_;
}
