/* rollout/source_local.c — the in-process rollout source of local mode (core/rollout_source.h): the rollout-batch
 * path (rollout/batch.h: the engine on the trainer's own experts, the decoder from final latents to video,
 * model.decoder) with the recipe's scorers (reward/scorers.h) as its callback, all in the trainer's process. The GRPO loop calls it
 * through the interface (trainer -> rollout, nothing in between); cli/ only opens it and hands it to the loop.
 *
 * Samples are those a rollout worker makes (the same batch path, the conditioning bytes the trainer passes, the same
 * decoder and scorers, the total summed by reward_score_weighted as a reward server's): a local run equals a
 * colocated one bit for bit. Weights are never copied: push_weights
 * and start point the engine at the trainer's experts (the policy, or the EMA for an eval). With LoRA those experts
 * carry their adapters (model/dit/wan_lora.h), which the engine's forward applies: nothing to sync.
 * model.device cuda: the engine's DiT runs on the process's device executor (model/dit/wan_dev_exec.h), the one the
 * trainer trains on, so push_weights only brings a device copy to the pushed version (wan_dev_exec_sync): a no-op
 * for the policy the trainer's device optimizer step just wrote, an upload for the EMA of an eval. */
#include "rollout/source_local.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/stop.h"
#include "model/dit/wan_dev_exec.h"
#include "reward/learned.h"
#include "reward/scorers.h"
#include "rollout/batch.h"
#include "rollout/engine.h"
#include "rollout/pipeline.h"

typedef struct {
    core_rollout_source src;
    const core_recipe *r;
    rollout_config rc;
    rollout_decoder dec;
    int n_scorers;
    reward_weighted sc[CORE_TRAJ_MAX_REWARDS]; /* reward.scorers with reward.weights */
    const char *names[CORE_TRAJ_MAX_REWARDS];
    const wan_model *experts[2];
    int n_experts;
    wan_dev_exec *dx; /* model.device cuda: the device executor (NULL: the CPU) */
    wan_exec exec;    /* .dev = dx */
} local_src;

int rollout_source_local_check(const core_recipe *r) {
    if (r->rollout_workers != 1)
        return core_error("parallel.rollout_workers: local mode rolls out in its own process (1), got %d", r->rollout_workers);
    if (r->reward_endpoint)
        return core_error("reward.endpoint: local mode scores in its own process; use mode: colocated to score on an "
                          "external reward server");
    /* the VAE's own factor is checked against the recipe's where its config is read (trainer/budget/budget.c at start-up,
     * rollout_decoder_load when the source opens) */
    return rollout_decoder_check(r);
}

/* The batch's scorer (rollout/batch.h), one sample at a time: sample j0's video scored with its prompt and metadata
 * (an object of strings or NULL: the scorers get its entries as a reward server gets a score_request's,
 * reward/server_requests.c); rewards per scorer and the total (reward_score_weighted: weight x reward summed in double,
 * scorer order, rounded to float once), stored into the trajectory. */
typedef struct {
    local_src *L;
    const core_rollout_sample *samples;
} local_score_ctx;

static int local_score(void *ctx, int j0, int n, const uint8_t *video, const int64_t vshape[4], core_traj *t) {
    const local_score_ctx *c = ctx;
    const local_src *L = c->L;
    const char *prompt = c->samples[j0].prompt;
    const json_t *meta = c->samples[j0].metadata;
    (void)n; /* per sample: 1 */
    const reward_video v = {.data = video, .frames = vshape[0], .height = vshape[1], .width = vshape[2]};
    const size_t nm = meta ? json_object_size(meta) : 0;
    const char **keys = calloc(nm + 1, sizeof *keys), **vals_s = calloc(nm + 1, sizeof *vals_s);
    if (!keys || !vals_s) return free(keys), free(vals_s), core_error("out of memory");
    int k = 0;
    const char *key;
    json_t *jv;
    json_object_foreach((json_t *)meta, key, jv) {
        if (json_is_string(jv)) keys[k] = key, vals_s[k++] = json_string_value(jv);
    }
    const reward_meta md = {k, keys, vals_s};
    double x[CORE_TRAJ_MAX_REWARDS], total;
    float vals[CORE_TRAJ_MAX_REWARDS];
    int failed;
    int rc = reward_score_weighted(L->sc, L->n_scorers, &v, prompt, &md, x, &total, &failed);
    free(keys), free(vals_s);
    if (rc) return core_error_push("scoring \"%s\": ", prompt);
    for (int i = 0; i < L->n_scorers; i++) vals[i] = (float)x[i];
    return core_traj_set_rewards(t, L->n_scorers, L->names, vals, (float)total);
}

static int local_rollout(void *ctx, const core_rollout_request *tmpl, const core_rollout_sample *samples,
                         const float *const *cond, const float *neg, int n, core_rollout_result *res,
                         core_rollout_chunk_fn on_chunk, void *cctx) {
    local_src *L = ctx;
    rollout_config rc = L->rc;
    if (rollout_config_apply_request(&rc, tmpl)) return -1;
    rc.neg = neg;
    const int64_t vb = rollout_decoder_video_bytes(&L->dec), per = (int64_t)rc.n_steps * rc.shape[0] * rc.shape[1] *
                                                                     rc.shape[2] * rc.shape[3];
    core_traj *tr = calloc((size_t)n, sizeof *tr);
    float **vel = tmpl->return_velocities ? calloc((size_t)n, sizeof(float *)) : NULL;
    /* the videos and their hashes only where they are asked for: the training rollouts never read them */
    uint8_t *videos = tmpl->return_videos ? malloc((size_t)(vb * n)) : NULL;
    uint64_t *vh = tmpl->return_videos ? calloc((size_t)n, sizeof *vh) : NULL;
    const float **conds = malloc(sizeof(float *) * (size_t)n); /* image to video: the prompts' conditions */
    int rc_ = -1;
    if (!tr || !conds || (tmpl->return_velocities && !vel) || (tmpl->return_videos && (!videos || !vh))) {
        core_error("out of memory");
        goto done;
    }
    for (int j = 0; vel && j < n; j++)
        if (!(vel[j] = malloc(sizeof(float) * (size_t)per))) {
            core_error("out of memory");
            goto done;
        }
    rc.velocities = vel;
    const int img = core_rollout_conditions(&L->src.images, tmpl, samples, n, conds);
    if (img < 0) goto done;
    const rollout_experts ex = {L->n_experts, {L->experts[0], L->experts[1]}};
    local_score_ctx sctx = {L, samples};
    const rollout_scorer sc = {local_score, &sctx, 1};
    if (rollout_batch_run(&rc, &ex, L->dx ? &L->exec : NULL, &L->dec, n, samples, cond, img ? conds : NULL, &sc,
                          videos, vh, tr))
        goto done;
    for (int j = 0; j < n; j++)
        res[j] = (core_rollout_result){.traj = tr[j], .video_hash = vh ? vh[j] : 0, .velocity = vel ? vel[j] : NULL};
    if (on_chunk) {
        const int64_t vshape[4] = {L->dec.frames, L->dec.height, L->dec.width, 3};
        if (on_chunk(cctx, samples, res, n, videos, vshape)) {
            for (int j = 0; j < n; j++) core_traj_free(&tr[j]);
            goto done;
        }
    }
    rc_ = 0;
done:
    if (rc_) {
        for (int j = 0; vel && j < n; j++) free(vel[j]);
        memset(res, 0, sizeof *res * (size_t)n);
    }
    free(tr), free(vel), free(videos), free(vh), free(conds);
    return rc_;
}

static int local_push(void *ctx, const wan_model *const *experts, int n_experts, const uint8_t *send, int64_t version,
                      int *hash_match, int64_t *bytes) {
    local_src *L = ctx;
    for (int e = 0; e < n_experts && e < 2; e++)
        if (!send || send[e] || !L->experts[e]) {
            L->experts[e] = experts[e];
            if (L->dx && wan_dev_exec_sync(L->dx, experts[e], version)) return -1;
        }
    L->n_experts = n_experts;
    *hash_match = -1; /* nothing crossed a process */
    *bytes = 0;
    return 0;
}

static int local_start(void *ctx, const wan_model *const *experts, int n_experts, const uint8_t *trained,
                       int64_t version, int resumed) {
    int match;
    int64_t bytes;
    (void)trained, (void)resumed;
    return local_push(ctx, experts, n_experts, NULL, version, &match, &bytes);
}

core_rollout_source *rollout_source_local_open(const core_recipe *r) {
    char path[4300];
    wan_config cfg;
    snprintf(path, sizeof path, "%s/transformer", r->model_path);
    if (rollout_source_local_check(r)) return NULL;
    if (!core_is_dir(path))
        return core_error("model.path: %s does not exist (make demo creates runs/demo/model, or run `vgrpo init-model "
                          "--preset tiny --out DIR`)", path), NULL;
    snprintf(path, sizeof path, "%s/transformer/config.json", r->model_path);
    if (wan_config_load(&cfg, path)) return NULL;
    local_src *L = calloc(1, sizeof *L);
    if (!L) return core_error("out of memory"), NULL;
    L->r = r;
    if (r->scorers.n > CORE_TRAJ_MAX_REWARDS) {
        core_error("reward.scorers: at most %d", CORE_TRAJ_MAX_REWARDS);
        goto fail;
    }
    for (int i = 0; i < r->scorers.n; i++) {
        if (!(L->sc[i].scorer = reward_find(r->scorers.v[i]))) {
            core_error_push("reward.scorers.%d: ", i);
            goto fail;
        }
        L->names[i] = L->sc[i].scorer->name;
        L->sc[i].weight = r->weights.v[i];
    }
    L->n_scorers = r->scorers.n;
    if (reward_recipe_models(r, L->sc, L->n_scorers, 1)) goto fail; /* learned scorers' models, loaded once */
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    const int64_t shape[4] = {cfg.out_channels, F, H, W}; /* the latent (I2V-A14B takes a condition besides) */
    if (rollout_config_init(&L->rc, r->num_steps, r->shift, r->eta, r->guidance_scale, shape, r->text_len,
                            (uint64_t)r->seed, r->batch_size) ||
        rollout_decoder_load(&L->dec, r, &cfg))
        goto fail;
    L->rc.guidance_scale_2 = r->guidance_scale_2;
    L->rc.boundary_ratio = r->boundary_ratio;
    L->rc.should_stop = core_stop_interrupt; /* SIGINT/SIGTERM inside a step of trainer_run (core/stop.h) */
    if (wan_dev_exec_open(r->device, &L->dx)) goto fail;
    L->exec = (wan_exec){.dev = L->dx};
    L->src = (core_rollout_source){.mode = "local", .n_workers = 1, .ctx = L, .rollout = local_rollout,
                              .push_weights = local_push, .start = local_start};
    return &L->src;
fail:
    rollout_decoder_free(&L->dec);
    reward_models_detach(L->sc, CORE_TRAJ_MAX_REWARDS);
    free(L);
    return NULL;
}

void rollout_source_local_close(core_rollout_source *s) {
    if (!s) return;
    local_src *L = s->ctx;
    rollout_decoder_free(&L->dec);
    reward_models_detach(L->sc, CORE_TRAJ_MAX_REWARDS);
    wan_dev_exec_close(L->dx);
    free(L);
}
