/* core/wire_rollout.h — the controller <-> rollout worker messages on top of core/wire.h (reward/PROTOCOL.md
 * section 8): rollout_request, trajectory, weights_begin / weights_tensor / weights_end, weights_ack. Both sides
 * (cli/ and trainer/ controllers, rollout/ workers) build and check messages only through these functions.
 *
 * rollout_request  {"policy_version": int, "stream": "rollout" | "eval", "eta": number >= 0,
 *                   "return_trajectories": bool, "return_videos": bool,
 *                   "return_velocities": bool (optional, default false),
 *                   "sde_type": "sde" | "cps" (optional, default "sde"), "logp": "exact" | "flow_grpo" (optional,
 *                   default "exact"), "sde_window": [lo, hi] (optional: steps lo..hi-1 noisy, the trajectory keeps
 *                   latents lo..hi), "return_means": bool (optional, default false; needs return_trajectories),
 *                   "samples": [{"uid": int < 2^32, "prompt_index": int >= 0, "prompt": string,
 *                                "metadata": {string: string}?}, ...]}            (1..CORE_WIRE_MAX_SAMPLES samples)
 *                  + image conditions (Wan 2.2 TI2V; model/flow/first_frame.h), optional: no tensors, or one
 *                  tensor "<j>/condition" F32 [C, 1, h, w] per sample in sample order (all of one shape, finite):
 *                  the normalised VAE latent of sample j's image; for Wan 2.2 I2V-A14B (model/vae/wan_vae_i2v.h)
 *                  F32 [K, F, h, w]: the mask and condition video latents concatenated to every step's input
 * trajectory       reply (same id): {"policy_version": int, "samples": [{"uid", "prompt_index", "reward_total",
 *                   "rewards": {scorer: number}, "video_xxh64": "16 hex digits", "trajectory": {metadata}?}, ...]}
 *                   in request order; tensors "<j>/<field>" of sample j's stored trajectory (core/trajectory.h: 7,
 *                   then the optional "<j>/means" and "<j>/condition") when return_trajectories, then "<j>/velocity" when
 *                   return_velocities, and "videos" U8 [n, F, H, W, 3] when return_videos.
 * weights_begin    {"policy_version": int, "tensors_count": tensors that follow, "buckets_count": buckets that follow
 *                   (optional: with it the tensors come in weights_bucket messages; trainer/net/sync_bucket.h)}
 * weights_bucket   {"expert": "transformer" | "transformer_2", "index": int, "offset": elements into the expert's
 *                   flat buffer, "xxh64": of the bucket's bytes} + its pieces in order, each one F32 [n] tensor
 *                   named after the model tensor it lies in (trainer/net/sync_bucket.h)
 * weights_tensor   {"name": full name "transformer/blocks.0...", "xxh64": "16 hex digits"} + one F32 tensor "value"
 * weights_end      {"policy_version": int, "model_xxh64": whole-model hash of the receiver's complete model after
 *                   the update (every expert, sent or not)}
 * weights_ack      {"policy_version": int, "model_xxh64": the hash the worker computed} (or an error reply)
 * Hashes are strings of 16 lower-case hex digits (a JSON number cannot hold every u64). */
#ifndef CORE_WIRE_ROLLOUT_H
#define CORE_WIRE_ROLLOUT_H

#include <jansson.h>
#include <stdint.h>

#include "core/trajectory.h"
#include "core/wire.h"

#define CORE_WIRE_MAX_SAMPLES 4096

typedef struct {
    uint64_t uid;
    int64_t prompt_index;
    const char *prompt;     /* borrowed from the message header */
    const json_t *metadata; /* object of strings, or NULL; borrowed */
    const float *condition; /* image condition [C, 1, h, w] (the request's cond_shape), or NULL; borrowed */
} core_rollout_sample;

typedef struct {
    int64_t policy_version;
    uint32_t stream; /* CORE_STREAM_ROLLOUT_NOISE or CORE_STREAM_EVAL_NOISE */
    float eta;
    int return_trajectories, return_videos;
    int return_velocities;   /* with return_trajectories: each step's guided velocity too (parity check) */
    int sde_type;            /* 0 "sde", 1 "cps" (model/flow/flow.h flow_sde_type; rollout.sde_type) */
    int logp_mode;           /* 0 "exact", 1 "flow_grpo" (flow_logp_mode; algorithm.cps_logprob) */
    int window_lo, window_hi; /* SDE window: steps [lo, hi) step with eta, the others with eta 0, and returned
                                trajectories keep latents[lo .. hi] only; window_hi 0: no window (every step) */
    int return_means;        /* with return_trajectories: the trajectories carry the step means (GRPO-Guard) */
    int64_t cond_shape[4];   /* [C, 1, h, w] when the samples carry image conditions, else zeros */
    int n;
    core_rollout_sample *samples; /* [n], owned (free with core_rollout_request_free) */
    float *cond_buf;         /* parsed requests: the samples' conditions (aligned copies), owned; else NULL */
} core_rollout_request;

/* Builds a rollout_request with id (the request's fields as above). -1 naming the field on a bad value. */
int core_rollout_request_build(const char *id, const core_rollout_request *req, core_wire_built *out);
/* Checks a parsed rollout_request's fields and fills *req (borrowing strings from m). -1 naming the field. */
int core_rollout_request_parse(const core_wire_msg *m, core_rollout_request *req);
void core_rollout_request_free(core_rollout_request *req);

/* One sample of a trajectory reply. */
typedef struct {
    core_traj traj;      /* arrays present only when the reply carries trajectories (traj.latents != NULL);
                            uid, prompt_index, policy_version and rewards always filled */
    uint64_t video_hash; /* xxh64 of the sample's decoded U8 video */
    float *velocity;     /* [N, C, F, H, W] when return_velocities (owned: free()), else NULL */
} core_rollout_result;

/* Builds the trajectory reply for n samples: tr[j] must have rewards set; video_hash[j] per sample; with_traj adds
 * the trajectory tensors; videos (NULL: none) is [n, vshape[0..3]] U8. The message borrows tr's arrays and videos
 * until freed. -1 on an invalid trajectory (named by index). */
int core_trajectory_reply_build(const char *id, int64_t policy_version, int n, const core_traj *tr,
                                const uint64_t *video_hash, int with_traj, const uint8_t *videos,
                                const int64_t vshape[4], core_wire_built *out);
/* The same with velocities: vel[j] = [N, C, F, H, W] of sample j (NULL: none), sent as tensor "j/velocity" after
 * the sample's trajectory tensors (with_traj must be set). */
int core_trajectory_reply_build_v(const char *id, int64_t policy_version, int n, const core_traj *tr,
                                  const uint64_t *video_hash, int with_traj, const float *const *vel,
                                  const uint8_t *videos, const int64_t vshape[4], core_wire_built *out);
/* Frees what a parsed result owns (trajectory arrays, velocity). */
void core_rollout_result_free(core_rollout_result *r);
/* Checks a parsed trajectory reply against the request it answers (same uids in order, same policy version,
 * trajectories when asked, videos when asked) and fills out[req->n] (core_traj_free each .traj); *videos points
 * into m's frame (NULL when not asked) with vshape [F, H, W, 3]. -1 naming the sample and field. */
int core_trajectory_reply_parse(const core_wire_msg *m, const core_rollout_request *req, core_rollout_result *out,
                                const uint8_t **videos, int64_t vshape[4]);

/* 16 lower-case hex digits of h into buf[17]; and back (-1 unless exactly 16 hex digits). */
void core_hash_hex(uint64_t h, char buf[17]);
int core_hash_parse(const char *s, uint64_t *h);

/* Receive bounds of the rollout channel from its protocol, in bytes: the largest single frame a peer may send, for
 * ZMQ_MAXMSGSIZE (which libzmq applies to every frame from the first byte of a connection, the security handshake
 * included, so a peer without keys cannot make the process buffer a larger one). Both are at least the header limit
 * of core_wire_limits_default (1 MiB).
 * core_rollout_reply_max_frame: what a worker sends the controller (a trajectory reply for `batch` samples): per
 * sample latents F32 [N + 1, c_out, F, H, W] (N = num_steps), velocities F32 [N, c_out, F, H, W], the image
 * condition F32 [c_out, 1, H, W] or concat F32 [c_in - c_out, F, H, W] (latent F, H, W), and the batch's videos U8
 * [batch, video_bytes / sample]. Overflow saturates at SIZE_MAX.
 * core_rollout_worker_max_frame: what the controller sends a worker: a rollout request's image condition per
 * sample (at most F32 [c_in, F, H, W]) and a weight sync's one tensor per message (F32, max_tensor_numel elements:
 * the largest tensor of the model, or of its LoRA adapter when adapters are synced). */
size_t core_rollout_reply_max_frame(int num_steps, int c_in, int c_out, int F, int H, int W, int batch,
                                    size_t video_bytes);
size_t core_rollout_worker_max_frame(int64_t max_tensor_numel, int c_in, int F, int H, int W);

#endif
