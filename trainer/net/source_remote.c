/* trainer/net/source_remote.c — the rollout source of colocated runs and `vgrpo parity` (trainer/net/source_remote.h):
 * rollouts, rewards and weight syncs through the controller and the rollout workers behind it (trainer/net/controller.h).
 * A worker lost mid-run has its chunk re-issued by the controller, and one back from a restart is synced to the
 * weights the others hold (the last push, or start's) before it gets work. */
#include "trainer/net/source_remote.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "trainer/net/controller.h"
#include "trainer/optim/lora.h"

typedef struct {
    core_rollout_source src;
    ctl_server *ctl;
    int chunk;
    double timeout_s;
    const char *model_path;
} remote;

static int remote_rollout(void *ctx, const core_rollout_request *tmpl, const core_rollout_sample *samples,
                          const float *const *cond, const float *neg, int n, core_rollout_result *res,
                          core_rollout_chunk_fn on_chunk, void *cctx) {
    (void)cond, (void)neg; /* the workers condition the prompt text themselves (the same bytes) */
    remote *R = ctx;
    const float **cc = malloc(sizeof(float *) * (size_t)n);
    if (!cc) return core_error("out of memory");
    const int img = core_rollout_conditions(&R->src.images, tmpl, samples, n, cc);
    if (img <= 0) {
        free(cc);
        return img < 0 ? -1 : ctl_rollout(R->ctl, tmpl, samples, n, R->chunk, R->timeout_s, res, on_chunk, cctx);
    }
    /* image to video: the conditions travel with the request (the workers have no images), and come back in the
     * trajectories, checked bit for bit against what was sent */
    core_rollout_request t2 = *tmpl;
    memcpy(t2.cond_shape, R->src.images.shape, sizeof t2.cond_shape);
    core_rollout_sample *s2 = malloc(sizeof *s2 * (size_t)n);
    int rc = -1;
    if (!s2) {
        core_error("out of memory");
        goto done;
    }
    for (int j = 0; j < n; j++) s2[j] = samples[j], s2[j].condition = cc[j];
    if (ctl_rollout(R->ctl, &t2, s2, n, R->chunk, R->timeout_s, res, on_chunk, cctx)) goto done;
    for (int j = 0; j < n && tmpl->return_trajectories; j++) {
        const core_traj *t = &res[j].traj;
        /* the trajectory keeps the request's condition as I2V-A14B's concat [K, F, h, w] or TI2V's condition
         * [C, 1, h, w] (which one, the trainer's batch check holds against the model); F may be 1 for I2V-A14B */
        const float *back = t->concat ? t->concat : t->condition;
        const int64_t nback = t->concat ? (int64_t)t->concat_channels * t->shape[1] * t->shape[2] * t->shape[3]
                                        : (int64_t)t->shape[0] * t->shape[2] * t->shape[3]; /* [C, 1, h, w] */
        if (!back || (t->concat && t->condition) || nback != R->src.images.numel ||
            memcmp(back, cc[j], sizeof(float) * (size_t)R->src.images.numel)) {
            core_error("rollout: sample uid %llu came back %s", (unsigned long long)samples[j].uid,
                       !back ? "without its image condition"
                       : t->concat && t->condition ? "with two image conditions (a first frame and a concatenated one)"
                       : nback != R->src.images.numel ? "with an image condition of another size than the request's"
                                                      : "with another image condition than the request's");
            for (int k = 0; k < n; k++) core_rollout_result_free(&res[k]);
            goto done;
        }
    }
    rc = 0;
done:
    free(cc), free(s2);
    return rc;
}

static int remote_push(void *ctx, const wan_model *const *experts, int n_experts, const uint8_t *send, int64_t version,
                       int *hash_match, int64_t *bytes) {
    remote *R = ctx;
    return ctl_sync_weights(R->ctl, experts, n_experts, send, version, R->timeout_s, hash_match, bytes);
}

/* Every worker loaded model.path, so its hello hash must equal the trainer's base weights'. With LoRA the base never
 * travels, so this is checked fresh or resumed; the adapters' hash of a fresh run must equal the workers' (both made
 * them from model.lora: same init), and neither side may hold adapters the other lacks. A resumed run then pushes its
 * weights (with LoRA: the adapters). */
static int remote_start(void *ctx, const wan_model *const *experts, int n_experts, const uint8_t *trained,
                        int64_t version, int resumed) {
    remote *R = ctx;
    uint64_t h, ah;
    const int n_ad = wan_models_adapters_hash(experts, n_experts, &ah);
    if (n_ad < 0) return -1;
    if (!resumed || n_ad > 0) {
        if (wan_models_hash(experts, n_experts, &h)) return -1;
        for (int w = 0; w < ctl_n_workers(R->ctl); w++)
            if (ctl_worker_hello_hash(R->ctl, w) != h)
                return core_error("%s holds weights with model hash %016llx, the trainer's %s weights hash to %016llx "
                                  "(both must load model.path %s)", ctl_worker_id(R->ctl, w),
                                  (unsigned long long)ctl_worker_hello_hash(R->ctl, w), n_ad ? "base" : "initial",
                                  (unsigned long long)h, R->model_path);
    }
    for (int w = 0; w < ctl_n_workers(R->ctl); w++) {
        uint64_t wh;
        const int has = ctl_worker_hello_adapter(R->ctl, w, &wh);
        if (has != (n_ad > 0))
            return core_error("%s %s LoRA adapters and the trainer %s (both must read the same model.lora.rank)",
                              ctl_worker_id(R->ctl, w), has ? "holds" : "holds no", n_ad ? "does" : "none");
        if (n_ad && !resumed && wh != ah)
            return core_error("%s holds LoRA adapters with hash %016llx, the trainer's initial adapters hash to %016llx "
                              "(both must make them from the same model.lora: rank, alpha, targets, init_seed)",
                              ctl_worker_id(R->ctl, w), (unsigned long long)wh, (unsigned long long)ah);
    }
    if (resumed) {
        int match;
        return ctl_sync_weights(R->ctl, experts, n_experts, trained, version, R->timeout_s, &match, NULL);
    }
    /* what a worker that comes back after a restart is synced to until the first push (trainer/net/controller.h) */
    return ctl_set_weights(R->ctl, experts, n_experts, trained, version);
}

static void remote_device_weights(void *ctx, const struct k_dev_ops *dev, const wan_model *const *experts,
                                  const void *const *bufs, const int64_t *elements, int n_experts) {
    remote *R = ctx;
    ctl_set_device_weights(R->ctl, dev, experts, bufs, elements, n_experts);
}

static void remote_sync_staging(void *ctx, const struct k_dev_ops *dev, void *staging, int64_t bytes) {
    remote *R = ctx;
    ctl_set_sync_staging(R->ctl, dev, staging, bytes);
}

core_rollout_source *trainer_source_remote(struct ctl_server *ctl, int chunk, double timeout_s,
                                           const char *model_path) {
    remote *R = calloc(1, sizeof *R);
    if (!R) return core_error("out of memory"), NULL;
    R->ctl = ctl, R->chunk = chunk, R->timeout_s = timeout_s, R->model_path = model_path;
    R->src = (core_rollout_source){.mode = "colocated", .n_workers = ctl_n_workers(ctl), .ctx = R,
                              .rollout = remote_rollout, .push_weights = remote_push, .start = remote_start,
                                   .device_weights = remote_device_weights, .sync_staging = remote_sync_staging};
    return &R->src;
}

void trainer_source_remote_free(core_rollout_source *s) {
    if (!s) return;
    remote *R = s->ctx;
    ctl_set_weights(R->ctl, NULL, 0, NULL, 0); /* the experts it pointed at belong to the loop that is ending */
    ctl_set_device_weights(R->ctl, NULL, NULL, NULL, NULL, 0); /* and so do the device buffers */
    ctl_set_sync_staging(R->ctl, NULL, NULL, 0);
    free(R);
}
