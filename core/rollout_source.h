/* core/rollout_source.h — the rollout source: where the GRPO loop (trainer/run/loop.c) gets its scored trajectories from
 * and where it sends its weights. The loop is written against this interface only; it never includes rollout/. The
 * interface stands in core/, below both trainer/ and rollout/ (next to the rollout messages, core/wire_rollout.h), so
 * that each side implements it where its parts live and cli/ only opens one and hands it to the loop:
 *   - in process (local mode): the rollout engine, the decoder and the scorers in the trainer's own process
 *     (rollout/source_local.c, over the rollout-batch path rollout/batch.h that the rollout worker runs too);
 *   - remote (colocated mode, `vgrpo parity`): the controller and the rollout workers behind it
 *     (trainer/net/source_remote.h over trainer/net/controller.h).
 * The experts are the model's (model/dit/wan_dit.h), named here by their struct only: core/ includes nothing above it.
 *
 * The contract (both implementations keep it; docs/design.md sections 3 and 4):
 *   rollout      n samples, sample j = (uid, prompt index, prompt text); tmpl gives the policy version the weights
 *                must have, the noise stream, eta and what to return. Sample j's trajectory depends only on (seed, uid,
 *                stream, eta, the weights of that version, the prompt's conditioning): not on how the samples are
 *                chunked or which worker ran them. res[j] receives the trajectory (latents, log-probs: with
 *                return_trajectories; always uid, prompt index, policy version and the rewards, total = sum of weight x
 *                reward in the recipe's scorer order), the guided velocities (return_velocities), and on_chunk (may be
 *                NULL) sees each finished chunk with its videos [n, frames, h, w, 3] U8 (return_videos).
 *                cond[j] is this process's conditioning of sample j's prompt ([text_len, text_dim] fp32) and neg the
 *                negative prompt's (NULL: zeros): the in-process engine uses them as they are, remote workers compute
 *                the same bytes from the text themselves (model/text/text_cond.h).
 *   push_weights the weights later rollouts use are `experts` (send[e]: expert e changed) as policy `version`.
 *                Remote: sent to every worker and checked by xxh64 (*hash_match = 1 when every worker's hash equals
 *                ours; *bytes = the tensor bytes sent to each worker); in process: the experts are used where they are
 *                (*hash_match = -1, *bytes = 0: nothing crossed a process). A version >= CORE_EVAL_VERSION_OFFSET
 *                marks eval-only weights (the EMA). Experts carrying a LoRA adapter (model/dit/wan_lora.h) send the
 *                adapter only: the base never changes and was checked once by start.
 *   start        once, before the first rollout: a fresh run checks that the source holds the trainer's initial
 *                weights (remote: every worker's hello hash; with LoRA also its adapters' hash), a resumed run pushes
 *                its own (version = steps done; with LoRA the adapters, after the base's hello hash is checked).
 * Errors are -1 with core_error set (naming the worker, the reward server or the sample). */
#ifndef CORE_ROLLOUT_SOURCE_H
#define CORE_ROLLOUT_SOURCE_H

#include <stdint.h>

#include "core/wire_rollout.h"

struct wan_model; /* model/dit/wan_dit.h */
struct k_dev_ops; /* kernels/dev_ops.h */

/* Eval-only weights (the EMA) are pushed as the policy version + 2^40, so a rollout request can never mix them up with
 * the policy's. */
#define CORE_EVAL_VERSION_OFFSET ((int64_t)1 << 40)

/* A chunk of finished samples (results in sample order; videos [n, vshape] U8 borrowed for the call, NULL unless the
 * request asked for videos). Non-zero aborts the rollout. */
typedef int (*core_rollout_chunk_fn)(void *ctx, const core_rollout_sample *samples, const core_rollout_result *res,
                                     int n, const uint8_t *videos, const int64_t vshape[4]);

/* Image conditions of the run's prompts (Wan 2.2 TI2V, model/flow/first_frame.h; Wan 2.2 I2V-A14B,
 * model/vae/wan_vae_i2v.h): set on the source by trainer_setup
 * when the prompt files give images (zeroed otherwise). A request's sample without its own condition refers to them
 * by its prompt index: the training prompts on the rollout noise stream, the eval prompts on the eval stream (what
 * every request of the loop, parity, the eval and the sample videos asks). Each table is [n, C, 1, h, w] fp32
 * (TI2V's first frame) or [n, K, F, h, w] (I2V-A14B's mask and condition video latents, concatenated to the input). */
typedef struct {
    const float *train, *eval; /* [n_train | n_eval, numel] */
    int n_train, n_eval;
    int64_t shape[4];          /* [C, 1, h, w], or I2V-A14B's [K, F, h, w] */
    int64_t numel;             /* their product (0: no table) */
} core_rollout_images;

typedef struct {
    const char *mode; /* "local" or "colocated": printed and written nowhere else */
    int n_workers;    /* rollout processes behind the source (1 in process) */
    void *ctx;
    int (*rollout)(void *ctx, const core_rollout_request *tmpl, const core_rollout_sample *samples,
                   const float *const *cond, const float *neg, int n, core_rollout_result *res,
                   core_rollout_chunk_fn on_chunk, void *cctx);
    int (*push_weights)(void *ctx, const struct wan_model *const *experts, int n_experts, const uint8_t *send,
                        int64_t version, int *hash_match, int64_t *bytes);
    int (*start)(void *ctx, const struct wan_model *const *experts, int n_experts, const uint8_t *trained,
                 int64_t version, int resumed);
    /* Optional (NULL: the source has no use for it): the trainer's weights of experts[e] live on the device dev
     * (model.device cuda) in bufs[e] (elements[e] F32: the fp32 master a sync sends; NULL for a frozen expert), for
     * the same-host IPC path of the weight sync (trainer/net/controller.h ctl_set_device_weights). */
    void (*device_weights)(void *ctx, const struct k_dev_ops *dev, const struct wan_model *const *experts,
                           const void *const *bufs, const int64_t *elements, int n_experts);
    /* Optional: a device buffer of `bytes` free between the trainer's optimizer step and its next accumulation
     * through which NCCL syncs may send the host copy (ZeRO stage 3: trainer/net/controller.h ctl_set_sync_staging);
     * NULL forgets it. */
    void (*sync_staging)(void *ctx, const struct k_dev_ops *dev, void *staging, int64_t bytes);
    core_rollout_images images; /* the prompts' image conditions (TI2V, I2V-A14B), or zeroed */
} core_rollout_source;

/* The image conditions of a request's samples, for the source implementations: out[j] = samples[j].condition when
 * set, else the entry of images for (tmpl->stream, prompt_index). Returns 1 when every sample has one, 0 when none
 * has (text to video; out all NULL), -1 (a prompt index outside its table, some samples with and some without). */
int core_rollout_conditions(const core_rollout_images *images, const core_rollout_request *tmpl,
                            const core_rollout_sample *samples, int n, const float **out);

#endif
