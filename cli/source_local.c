/* cli/source_local.c — the in-process rollout source of local mode (trainer/source.h): the rollout engine
 * (rollout/engine.h) on the trainer's own experts, the decoder from final latents to video (rollout/pipeline.h:
 * model.decoder) and the recipe's scorers (reward/scorers.h), all in the trainer's process. This file is wiring:
 * cli/ is the one folder that composes rollout/ and trainer/.
 *
 * Samples are those a rollout worker would make (the same engine, the conditioning bytes the trainer passes, the
 * same decoder and scorers): a local run equals a colocated one bit for bit. Weights are never copied: push_weights
 * and start point the engine at the trainer's experts (the policy, or the EMA for an eval). With LoRA those experts
 * carry their adapters (model/dit/wan_lora.h), which the engine's forward applies: nothing to sync.
 * model.device cuda: the engine's DiT runs on the process's device executor (model/dit/wan_dev_exec.h), the one the
 * trainer trains on, so push_weights only brings a device copy to the pushed version (wan_dev_exec_sync): a no-op
 * for the policy the trainer's device optimizer step just wrote, an upload for the EMA of an eval. */
#include <stdlib.h>
#include <string.h>

#include "cli/source_local.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/stop.h"
#include "model/dit/wan_dev_exec.h"
#include "reward/scorers.h"
#include "rollout/engine.h"
#include "rollout/pipeline.h"

typedef struct {
    trainer_source src;
    const core_recipe *r;
    rollout_config rc;
    rollout_decoder dec;
    int n_scorers;
    const reward_scorer *sc[CORE_TRAJ_MAX_REWARDS];
    const char *names[CORE_TRAJ_MAX_REWARDS];
    double weight[CORE_TRAJ_MAX_REWARDS];
    const wan_model *experts[2];
    int n_experts;
    wan_dev_exec *dx; /* model.device cuda: the device executor (NULL: the CPU) */
    wan_exec exec;    /* .dev = dx */
} local_src;

int source_local_check(const core_recipe *r) {
    if (r->rollout_workers != 1)
        return core_error("parallel.rollout_workers: local mode rolls out in its own process (1), got %d", r->rollout_workers);
    if (r->reward_endpoint)
        return core_error("reward.endpoint: local mode scores in its own process; use mode: colocated to score on an "
                          "external reward server");
    /* the VAE's own factor is checked against the recipe's where its config is read (trainer/budget.c at start-up,
     * rollout_decoder_load when the source opens) */
    return rollout_decoder_check(r);
}

/* Decodes sample t's final latent into video and scores it with the sample's prompt and metadata (an object of
 * strings or NULL: the scorers get its entries as a reward server gets a score_request's, reward/server_requests.c):
 * rewards per scorer and the total (sum of weight x reward in double, scorer order, rounded to float once), stored
 * into the trajectory. */
static int score(local_src *L, core_traj *t, const char *prompt, const json_t *meta, uint8_t *video) {
    if (rollout_decoder_decode(&L->dec, core_traj_latent(t, t->n_steps), video)) return -1;
    reward_video v = {.data = video, .frames = L->dec.frames, .height = L->dec.height, .width = L->dec.width};
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
    float vals[CORE_TRAJ_MAX_REWARDS];
    double total = 0;
    int rc = 0;
    for (int i = 0; i < L->n_scorers; i++) {
        double x;
        if (L->sc[i]->fn(&v, prompt, &md, &x)) {
            rc = core_error_push("scoring \"%s\": ", prompt);
            break;
        }
        vals[i] = (float)x;
        total += L->weight[i] * x;
    }
    free(keys), free(vals_s);
    return rc ? rc : core_traj_set_rewards(t, L->n_scorers, L->names, vals, (float)total);
}

static int local_rollout(void *ctx, const core_rollout_request *tmpl, const core_rollout_sample *samples,
                         const float *const *cond, const float *neg, int n, core_rollout_result *res,
                         trainer_chunk_fn on_chunk, void *cctx) {
    local_src *L = ctx;
    rollout_config rc = L->rc;
    if (rollout_config_apply_request(&rc, tmpl)) return -1;
    rc.neg = neg;
    const int64_t vb = rollout_decoder_video_bytes(&L->dec), per = (int64_t)rc.n_steps * rc.shape[0] * rc.shape[1] *
                                                                     rc.shape[2] * rc.shape[3];
    uint64_t *uids = malloc(sizeof(uint64_t) * (size_t)n);
    int64_t *pidx = malloc(sizeof(int64_t) * (size_t)n);
    core_traj *tr = calloc((size_t)n, sizeof *tr);
    float **vel = tmpl->return_velocities ? calloc((size_t)n, sizeof(float *)) : NULL;
    uint8_t *videos = malloc((size_t)(vb * (tmpl->return_videos ? n : 1)));
    int rc_ = -1, have = 0;
    if (!uids || !pidx || !tr || !videos || (tmpl->return_velocities && !vel)) {
        core_error("out of memory");
        goto done;
    }
    for (int j = 0; j < n; j++) {
        uids[j] = samples[j].uid, pidx[j] = samples[j].prompt_index;
        if (vel && !(vel[j] = malloc(sizeof(float) * (size_t)per))) {
            core_error("out of memory");
            goto done;
        }
    }
    rc.velocities = vel;
    const float **conds = malloc(sizeof(float *) * (size_t)n); /* image to video: the prompts' conditions */
    const int img = conds ? trainer_source_conditions(&L->src.images, tmpl, samples, n, conds) : -1;
    if (img < 0) {
        if (!conds) core_error("out of memory");
        free(conds);
        goto done;
    }
    /* Wan 2.2 I2V-A14B (more input than output channels): the conditions are concatenated to every input */
    const int cat = L->experts[0]->cfg.in_channels != L->experts[0]->cfg.out_channels;
    if (img && cat) rc.concat_conditions = conds;
    else rc.conditions = img ? conds : (free(conds), NULL);
    const rollout_experts ex = {L->n_experts, {L->experts[0], L->experts[1]}};
    if (rollout_generate(&rc, &ex, L->dx ? &L->exec : NULL, n, cond, uids, pidx, tr)) goto done;
    have = 1;
    for (int j = 0; j < n; j++) {
        uint8_t *v = videos + (tmpl->return_videos ? vb * j : 0);
        if (score(L, &tr[j], samples[j].prompt, samples[j].metadata, v) || rollout_trim_to_window(&rc, &tr[j])) goto done;
        /* the video's hash only where videos are asked for: the training rollouts never read it */
        res[j] = (core_rollout_result){.traj = tr[j],
                                       .video_hash = tmpl->return_videos ? core_xxh64(v, (size_t)vb, 0) : 0,
                                       .velocity = vel ? vel[j] : NULL};
    }
    if (on_chunk) {
        const int64_t vshape[4] = {L->dec.frames, L->dec.height, L->dec.width, 3};
        if (on_chunk(cctx, samples, res, n, tmpl->return_videos ? videos : NULL, vshape)) goto done;
    }
    rc_ = 0;
done:
    if (rc_) {
        if (have)
            for (int j = 0; j < n; j++) core_traj_free(&tr[j]);
        for (int j = 0; vel && j < n; j++) free(vel[j]);
        memset(res, 0, sizeof *res * (size_t)n);
    }
    free(uids), free(pidx), free(tr), free(vel), free(videos), free((void *)rc.conditions), free((void *)rc.concat_conditions);
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

trainer_source *source_local_open(const core_recipe *r) {
    char path[4300];
    wan_config cfg;
    snprintf(path, sizeof path, "%s/transformer", r->model_path);
    if (source_local_check(r)) return NULL;
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
        if (!(L->sc[i] = reward_find(r->scorers.v[i]))) {
            core_error_push("reward.scorers.%d: ", i);
            goto fail;
        }
        L->names[i] = L->sc[i]->name;
        L->weight[i] = r->weights.v[i];
    }
    L->n_scorers = r->scorers.n;
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
    L->src = (trainer_source){.mode = "local", .n_workers = 1, .ctx = L, .rollout = local_rollout,
                              .push_weights = local_push, .start = local_start};
    return &L->src;
fail:
    rollout_decoder_free(&L->dec);
    free(L);
    return NULL;
}

void source_local_close(trainer_source *s) {
    if (!s) return;
    local_src *L = s->ctx;
    rollout_decoder_free(&L->dec);
    wan_dev_exec_close(L->dx);
    free(L);
}
