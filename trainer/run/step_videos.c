/* trainer/run/step_videos.c — logging.video_every: what the model makes now, as videos. Sample 0 of the first (up to) 4
 * eval prompts at the eval weights, with the eval's noise (stream 3, uid = prompt x eval_samples_per_prompt) and
 * eta, through the rollout source with videos returned, written to run_dir/videos/step-<step>/: pNNNN.mp4,
 * sheet.png (titled with the step; rows = prompts, labelled with the prompt index, reward and text, cut to the sheet's
 * width; image to video: each row led by the prompt's input image, media_image_write_sheet) and index.json (prompt, reward, xxh64 of the
 * raw frames, which do not depend on the encoder). Identical in local and colocated runs. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/philox.h"
#include "media/image.h"
#include "media/png.h"
#include "media/video.h"
#include "trainer/run/run_internal.h"

#define STEP_VIDEOS_MAX 4
#define STEP_VIDEOS_FPS 16.0

typedef struct {
    int n, K;
    uint8_t *videos; /* [n, vshape] once the first chunk arrived */
    int64_t vshape[4], vb;
} collect;

/* The source's chunk callback: copies each sample's video to its place (sample j has uid j x K). */
static int keep_videos(void *ctx, const core_rollout_sample *samples, const core_rollout_result *res, int n,
                       const uint8_t *videos, const int64_t vshape[4]) {
    collect *C = ctx;
    if (!videos) return core_error("step videos: the rollout source returned no videos");
    if (!C->videos) {
        memcpy(C->vshape, vshape, sizeof C->vshape);
        C->vb = vshape[0] * vshape[1] * vshape[2] * vshape[3];
        if (!(C->videos = malloc((size_t)(C->vb * C->n)))) return core_error("out of memory");
    } else if (memcmp(C->vshape, vshape, sizeof C->vshape)) {
        return core_error("step videos: chunks returned videos of different shapes");
    }
    for (int j = 0; j < n; j++) {
        const uint64_t at = samples[j].uid / (uint64_t)C->K;
        if (at >= (uint64_t)C->n) return core_error("step videos: unexpected uid %llu", (unsigned long long)samples[j].uid);
        memcpy(C->videos + C->vb * (int64_t)at, videos + C->vb * j, (size_t)C->vb);
    }
    return 0;
}

static int write_index(const trainer_state *S, const char *dir, const collect *C, const core_rollout_result *res) {
    char path[4300];
    json_t *idx = json_array();
    for (int j = 0; j < C->n; j++) {
        char hx[17], file[32];
        core_hash_hex(core_xxh64(C->videos + C->vb * j, (size_t)C->vb, 0), hx);
        snprintf(file, sizeof file, "p%04d.mp4", j);
        json_array_append_new(idx, json_pack("{s:s, s:i, s:s, s:f, s:s}", "file", file, "prompt_index", j, "prompt",
                                             S->eval.text[j], "reward", (double)res[j].traj.reward_total,
                                             "video_xxh64", hx));
    }
    snprintf(path, sizeof path, "%s/index.json", dir);
    const int bad = core_json_write_file(idx, path, JSON_INDENT(1) | JSON_REAL_PRECISION(9), "w");
    json_decref(idx);
    return bad ? -1 : 0;
}

int trainer_step_videos(trainer_state *S, int64_t step) {
    const core_recipe *r = S->r;
    const int n = S->eval.n < STEP_VIDEOS_MAX ? S->eval.n : STEP_VIDEOS_MAX, K = r->eval_samples_per_prompt;
    core_rollout_sample smp[STEP_VIDEOS_MAX];
    core_rollout_result res[STEP_VIDEOS_MAX];
    const float *cond[STEP_VIDEOS_MAX];
    collect C = {.n = n, .K = K};
    int rc = -1, have = 0;
    memset(smp, 0, sizeof smp);
    memset(res, 0, sizeof res);
    for (int j = 0; j < n; j++) {
        smp[j] = (core_rollout_sample){.uid = (uint64_t)j * K, .prompt_index = j, .prompt = S->eval.text[j],
                                           .metadata = core_prompts_meta(&S->eval, j)};
        cond[j] = S->emb_eval + (int64_t)j * S->ne;
    }
    int64_t ev;
    if (trainer_eval_weights_begin(S, &ev)) return -1;
    const core_rollout_request tmpl = {.policy_version = ev, .stream = CORE_STREAM_EVAL_NOISE, .eta = r->eval_eta,
                                       .return_videos = 1};
    if (S->src->rollout(S->src->ctx, &tmpl, smp, cond, S->emb_neg, n, res, keep_videos, &C)) goto done;
    have = 1;
    if (trainer_eval_weights_end(S)) goto done;
    if (!C.videos) {
        core_error("step videos: the rollout source returned no videos");
        goto done;
    }
    char dir[4200], path[4300], labels[STEP_VIDEOS_MAX][160], title[64];
    const char *lp[STEP_VIDEOS_MAX];
    snprintf(dir, sizeof dir, "%s/videos/step-%" PRId64, r->run_dir, step);
    if (core_mkdir_p(dir)) goto done;
    const int F = (int)C.vshape[0], H = (int)C.vshape[1], W = (int)C.vshape[2];
    for (int j = 0; j < n; j++) {
        snprintf(path, sizeof path, "%s/p%04d.mp4", dir, j);
        if (media_video_write_mp4(path, C.videos + C.vb * j, F, H, W, STEP_VIDEOS_FPS, NULL, NULL)) goto done;
        snprintf(labels[j], sizeof labels[j], "P%d %.3f %s", j, (double)res[j].traj.reward_total, S->eval.text[j]);
        lp[j] = labels[j];
    }
    snprintf(path, sizeof path, "%s/sheet.png", dir);
    snprintf(title, sizeof title, "step %" PRId64, step);
    /* image to video: each row starts with its prompt's input image, as vgrpo eval's sheets do */
    const char *const *img = S->eval.n_images ? (const char *const *)S->eval.image : NULL;
    const int sheet = media_image_write_sheet(path, C.videos, n, F, H, W, 8, title, lp, img);
    if (sheet > 0) core_log_warn("step videos: %s", core_last_error()); /* an input image gone: the run goes on */
    if (sheet < 0 || write_index(S, dir, &C, res)) goto done;
    rc = 0;
done:
    if (have)
        for (int j = 0; j < n; j++) core_rollout_result_free(&res[j]);
    free(C.videos);
    return rc;
}
