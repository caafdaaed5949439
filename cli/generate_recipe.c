/* cli/generate_recipe.c — `vgrpo generate --recipe`: one video as the recipe's eval samples it (the contract is in
 * cli/generate_recipe.h). The steps are those of rollout/worker.c's rollout for one sample: rollout_pipeline_load_lora,
 * the prompt's embedding, the eval's request applied (rollout_config_apply_request), rollout_generate, the decoder. */
#include "cli/generate_recipe.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/philox.h"
#include "core/prompts.h"
#include "core/wire_rollout.h"
#include "rollout/pipeline.h"
#include "trainer/run/images.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* rollout_generate polls rollout_config.should_stop before every denoising step: generate's progress line hangs on
 * that hook (one sample, one chunk: poll i is step i + 1's start). One generate per process, so file scope. */
static const gen_recipe_args *progress_args;
static int progress_polls, progress_steps;
static int progress_hook(void) {
    const gen_recipe_args *a = progress_args;
    if (a && a->progress && progress_polls > 0) a->progress(a->progress_ctx, progress_polls, progress_steps);
    progress_polls++;
    return 0;
}

/* The image's condition for the pipeline's experts, as the eval encodes a prompt file's (trainer_images_encode):
 * [C, 1, h, w] (TI2V first frame) or [K, F, h, w] (I2V-A14B, K = in - out channels). */
static int image_condition(const core_recipe *r, const rollout_pipeline *p, const char *prompt, const char *image,
                           float **cond) {
    const wan_config *wc = &p->experts.expert[0]->cfg;
    char *text = (char *)prompt, *img = (char *)image;
    int line = 1;
    json_t *meta = json_object();
    core_prompts one = {.n = 1, .text = &text, .line = &line, .meta = &meta, .image = &img, .n_images = 1,
                        .path = "--image"};
    const core_prompts *lists[1] = {&one};
    const int rc = meta ? trainer_images_encode(r, wc->out_channels, wan_cond_channels(wc), lists, 1, cond)
                        : core_error("out of memory");
    json_decref(meta);
    return rc;
}

int gen_recipe_generate(const gen_recipe_args *a, gen_recipe_video *out) {
    const core_recipe *r = a->r;
    memset(out, 0, sizeof *out);
    if (a->uid > 0xffffffffull)
        return core_error("--uid %llu: over 2^32 - 1 (an eval uid is prompt index x samples per prompt + sample)",
                          (unsigned long long)a->uid);
    rollout_pipeline p;
    float *cond_img = NULL;
    core_traj t;
    int have = 0, rc = -1;
    if (rollout_pipeline_load_lora(&p, r, a->transformer, a->adapter)) return -1;
    double t0 = now_s();
    const float *cond, *neg = NULL;
    if (rollout_pipeline_embed(&p, a->prompt, &cond)) goto done;
    if (a->negative && a->negative[0] && rollout_pipeline_embed(&p, a->negative, &neg)) {
        core_error_push("--negative-prompt: ");
        goto done;
    }
    if (a->image && image_condition(r, &p, a->prompt, a->image, &cond_img)) goto done;
    out->encode_s = now_s() - t0;
    rollout_config rc_ = p.rc;
    const core_rollout_request req = {.policy_version = 0, .stream = CORE_STREAM_EVAL_NOISE, .eta = r->eval_eta};
    if (rollout_config_apply_request(&rc_, &req)) goto done; /* the eval's request (cli/cmd_eval.c) */
    if (neg) rc_.neg = neg;
    const float *const conds[1] = {cond_img};
    const wan_config *wc = &p.experts.expert[0]->cfg;
    if (cond_img && wan_cond_kind(wc) == WAN_COND_CONCAT) rc_.concat_conditions = conds;
    else if (cond_img) rc_.conditions = conds;
    progress_args = a, progress_polls = 0, progress_steps = rc_.n_steps;
    rc_.should_stop = progress_hook;
    for (int e = 0; p.dx && e < p.experts.n; e++)
        if (wan_dev_exec_sync(p.dx, p.experts.expert[e], 0)) goto done;
    const uint64_t uid = a->uid;
    const int64_t pidx = 0;
    if (a->progress) a->progress(a->progress_ctx, 0, rc_.n_steps);
    t0 = now_s();
    if (rollout_generate(&rc_, &p.experts, rollout_pipeline_exec(&p), 1, &cond, &uid, &pidx, &t)) goto done;
    have = 1;
    if (a->progress) a->progress(a->progress_ctx, rc_.n_steps, rc_.n_steps);
    out->sample_s = now_s() - t0;
    t0 = now_s();
    const int64_t vb = rollout_pipeline_video_bytes(&p);
    if (!(out->video = malloc((size_t)vb))) {
        core_error("out of memory for the video (%lld bytes)", (long long)vb);
        goto done;
    }
    if (rollout_pipeline_decode(&p, &t, out->video)) goto done;
    out->decode_s = now_s() - t0;
    out->frames = p.dec.frames, out->height = p.dec.height, out->width = p.dec.width, out->experts = p.experts.n;
    rc = 0;
done:
    progress_args = NULL;
    if (have) core_traj_free(&t);
    if (rc) free(out->video), out->video = NULL;
    free(cond_img);
    rollout_pipeline_free(&p);
    return rc;
}

int gen_recipe_apply(core_recipe *r, const gen_recipe_given *given, rollout_t2v_args *g) {
    if (given->pipeline) {
        char *m = strdup(g->pipeline);
        if (!m) return core_error("out of memory");
        free(r->model_path), r->model_path = m;
    }
    if (given->steps) r->num_steps = g->steps;
    if (given->frames) r->frames = g->frames;
    if (given->height) r->height = g->height;
    if (given->width) r->width = g->width;
    if (given->guidance) r->guidance_scale = (float)g->guidance;
    if (given->guidance2 || given->guidance) r->guidance_scale_2 = (float)g->guidance2;
    if (given->shift) r->shift = g->shift;
    if (given->eta) r->eval_eta = (float)g->eta;
    if (given->seed) r->seed = (int64_t)g->seed;
    if (core_recipe_check(r)) return -1;
    g->pipeline = r->model_path, g->steps = r->num_steps, g->frames = r->frames, g->height = r->height;
    g->width = r->width, g->guidance = r->guidance_scale, g->guidance2 = r->guidance_scale_2, g->shift = r->shift;
    g->eta = r->eval_eta, g->seed = (uint64_t)r->seed;
    return 0;
}

int gen_recipe_eval_uid(const core_recipe *r, const char *prompt, uint64_t *uid, int *found, char *image,
                        size_t cap) {
    *uid = 0, *found = 0;
    if (cap) image[0] = 0;
    if (!r->eval_prompt_file) return 0;
    core_prompts ps;
    const core_prompts_limits lim = core_recipe_prompt_limits(r);
    if (core_prompts_read_limited(&ps, r->eval_prompt_file, &lim)) return core_error_push("data.eval_prompt_file: ");
    for (int i = 0; i < ps.n && !*found; i++)
        if (!strcmp(ps.text[i], prompt)) {
            *uid = (uint64_t)i * (uint64_t)r->eval_samples_per_prompt, *found = 1;
            if (ps.image && ps.image[i] && cap) snprintf(image, cap, "%s", ps.image[i]);
        }
    core_prompts_free(&ps);
    return 0;
}
