/* core/trajectory.h — one rollout sample as rollout, reward and trainer exchange it: the sigma table, every latent
 * of the denoising chain, per-step log-probs and experts, the sampling settings and the rewards.
 *
 * docs/design.md section 4: `sigmas[0..N]` and `latents[0..N]` with latents[i] at sigmas[i]; latents[0] is the initial
 * noise, latents[N] the final sample; step i goes latents[i] -> latents[i+1]. The trainer reads this table and never
 * rebuilds the schedule.
 *
 * Stored form (a safetensors file, or the same named tensors + string map in a wire message):
 *   tensors   sigmas        F32 [N+1]           strictly decreasing, sigmas[0] <= 1, sigmas[N] == 0, N >= 1
 *             timesteps     F32 [N]             finite (1000 * sigma for vgrpo's schedule; not re-derived)
 *             latents       F32 [N+1,C,F,H,W]   finite, every dim >= 1
 *             log_probs     F32 [N]             finite where has_log_prob is 1, exactly 0 where it is 0
 *             has_log_prob  U8  [N]             0 or 1 (0: a step with std 0, e.g. eta 0; never trained)
 *             expert        U8  [N]             0 `transformer` (high noise), 1 `transformer_2` (low noise)
 *             rewards       F32 [R]             per-scorer rewards, finite, R = 0..CORE_TRAJ_MAX_REWARDS
 *   metadata  format "vgrpo.trajectory", format_version "1",
 *             uid (decimal u64), prompt_index (decimal, >= 0), policy_version (decimal i64),
 *             eta, guidance_scale, guidance_scale_2, reward_total: fp32 values printed "%.9g" (they read back to the
 *             same bits; eta >= 0; all finite),
 *             reward_names: a JSON list of R distinct non-empty strings, in the order of `rewards`.
 * Stored range (format_version "2"; SDE windows, GRPO-Guard): a trajectory may keep only the latents training reads.
 *   latent_first  metadata, decimal k (absent: 0): the latents tensor is F32 [M, C, F, H, W] holding latents[k ..
 *                 k + M - 1], 0 <= k, M >= 1, k + M <= N + 1 (version 1 and a full table: k = 0, M = N + 1)
 *   means         optional tensor F32 [M - 1, C, F, H, W] (M >= 2), stored after `rewards`: the rollout's step mean
 *                 of steps k .. k + M - 2 (the mean the sampler added the noise to; GRPO-Guard's mean_old)
 *   rule          a step i with has_log_prob 1 has both its latents stored (k <= i and i + 1 <= k + M - 1), and its
 *                 mean when means is present. The final latent (N) is stored only when k + M == N + 1: decode first.
 * Image conditioning (format_version "2"; Wan 2.2 TI2V, model/flow/first_frame.h):
 *   condition     optional tensor F32 [C, 1, H, W], stored last (after `means` when both are there): the normalised
 *                 VAE latent of the input image that latent frame 0 is held to. Present: F >= 2, frame 0 of every
 *                 stored latent (and of every stored mean) equals it bit for bit, and the steps' log-probs are over
 *                 frames 1 .. F-1 only (model/flow/first_frame.h states the definition).
 * Concatenated image conditioning (format_version "2"; Wan 2.2 I2V-A14B, model/vae/wan_vae_i2v.h):
 *   concat        optional tensor F32 [K, F, H, W] (K >= 1), stored after `condition`: the mask and condition video
 *                 latents every step's model input concatenated after the latent (in_channels = C + K); every step
 *                 is sampled over the whole latent.
 * A full trajectory without means, condition or concat is written as format_version "1" without latent_first, byte for byte
 * as before; anything else as "2" with latent_first (the last metadata key). Readers accept both; a "1" that carries
 * latent_first, means or condition, or whose latents are not the full [N+1, ...] table, is refused (a reader from
 * before version 2 would take it for a full table).
 * Readers reject a tensor they do not know (naming it) and ignore metadata keys they do not know.
 * Every error names the source (file path or the label the caller passes) and the field. */
#ifndef CORE_TRAJECTORY_H
#define CORE_TRAJECTORY_H

#include <stdint.h>

#include "core/tensor.h"

#define CORE_TRAJ_MAX_REWARDS 32
#define CORE_TRAJ_NAME_MAX 64 /* bytes of a reward name, NUL included */
#define CORE_TRAJ_MAX_EXPERTS 2
#define CORE_TRAJ_N_TENSORS 10 /* the 7 of version 1, then the optional means, condition and concat */
#define CORE_TRAJ_N_REQUIRED 7
#define CORE_TRAJ_N_META 11

typedef struct {
    uint64_t uid;           /* rollout uid (docs/design.md section 4: round x B x G + prompt_slot x G + replica) */
    int64_t prompt_index;   /* index into the prompt list */
    int64_t policy_version; /* weights version that produced the rollout */
    int n_steps;            /* N denoising steps */
    int64_t shape[4];       /* latent [C, F, H, W] */
    float eta, guidance_scale, guidance_scale_2;
    float *sigmas;          /* [N+1] */
    float *timesteps;       /* [N] */
    int latent_first;       /* k: first stored latent (0 for a full trajectory) */
    int n_latents;          /* M: stored latents (N + 1 for a full trajectory) */
    float *latents;         /* [M, C, F, H, W]: latents[k .. k + M - 1] */
    float *means;           /* NULL, or [M - 1, C, F, H, W]: the rollout's step means of steps k .. k + M - 2 */
    float *condition;       /* NULL, or [C, 1, H, W]: the first-frame image condition (TI2V) */
    float *concat;          /* NULL, or [concat_channels, F, H, W]: Wan 2.2 I2V-A14B's condition (mask and condition
                               video latents, model/vae/wan_vae_i2v.h) concatenated after every latent as the model
                               input */
    int64_t concat_channels;
    float *log_probs;       /* [N], 0 where has_log_prob[i] == 0 */
    uint8_t *has_log_prob;  /* [N] */
    uint8_t *expert;        /* [N] */
    int n_rewards;          /* R */
    char reward_names[CORE_TRAJ_MAX_REWARDS][CORE_TRAJ_NAME_MAX];
    float rewards[CORE_TRAJ_MAX_REWARDS];
    float reward_total;
} core_traj;

/* Allocates the arrays of a trajectory with n_steps >= 1 and latent shape [C, F, H, W] (each >= 1), all zeroed;
 * scalars zeroed, no rewards; the full latent table (latent_first 0, n_latents N + 1), no means. Returns 0, or -1 (bad argument, size overflow, out of memory; nothing left allocated). */
int core_traj_alloc(core_traj *t, int n_steps, const int64_t shape[4]);
/* Frees the arrays and zeroes the struct (safe on a zeroed struct). */
void core_traj_free(core_traj *t);

/* C*F*H*W, and a pointer to latents[i] (latent_first <= i < latent_first + n_latents; no check). */
int64_t core_traj_latent_numel(const core_traj *t);
float *core_traj_latent(const core_traj *t, int i);
/* 1 when latents[i] is stored, else 0. */
int core_traj_has_latent(const core_traj *t, int i);
/* The rollout's mean of step i (latent_first <= i <= latent_first + n_latents - 2), or NULL when means are not
 * stored or i is outside. */
float *core_traj_mean(const core_traj *t, int i);
/* Allocates the means table [n_latents - 1, C, F, H, W] (zeroed) of an allocated trajectory with n_latents >= 2 (the
 * engine fills it). -1 on out of memory or n_latents < 2; a second call is a no-op. */
int core_traj_alloc_means(core_traj *t);
/* Allocates the condition [C, 1, H, W] (zeroed) of an allocated trajectory with F >= 2 (the engine fills it, and
 * frame 0 of every latent with it). -1 on out of memory or F < 2; a second call is a no-op. */
int core_traj_alloc_condition(core_traj *t);
/* Keeps latents[first .. last] (and the means of steps first .. last - 1 when present), freeing the rest: the
 * stored range after decoding. Requires the current range to hold [first, last] and every step with a log-prob to
 * lie in first .. last - 1 (else -1 naming the step; nothing changed). -1 on out of memory (nothing changed). */
int core_traj_trim(core_traj *t, int first, int last);

/* Sets the rewards: n (0..CORE_TRAJ_MAX_REWARDS) scorer names (distinct, non-empty, shorter than
 * CORE_TRAJ_NAME_MAX) with their values (finite), and the total (finite). Returns 0 or -1 naming the bad entry. */
int core_traj_set_rewards(core_traj *t, int n, const char *const *names, const float *values, float total);

/* The denoising steps every trajectory of a batch of n (>= 1) shares, into *n_steps. Returns 0, or -1 with
 * "<who>: empty batch" or "<who>: trajectory S (uid U) has A steps, trajectory 0 has B". */
int core_traj_batch_steps(const core_traj *t, int n, const char *who, int *n_steps);

/* Checks every rule of the stored form above on an in-memory trajectory. label starts error messages.
 * Returns 0 or -1 naming the field (and step / element index) at fault. */
int core_traj_validate(const core_traj *t, const char *label);

/* The stored form as named tensors + string metadata. Tensor views borrow t's arrays (t must outlive the fields and
 * not change); metadata values are allocated. Tensors in the order of the table above, then `means` and `condition`
 * when stored (n_tensors 7 to 9); metadata as listed, then latent_first for format_version "2" (n_meta 10 or 11). */
typedef struct {
    int n_tensors;
    const char *tensor_names[CORE_TRAJ_N_TENSORS];
    core_tensor tensors[CORE_TRAJ_N_TENSORS];
    int n_meta;
    const char *meta_keys[CORE_TRAJ_N_META];
    char *meta_values[CORE_TRAJ_N_META];
} core_traj_fields;

/* Fills *f from t (validated first). Returns 0, or -1 (invalid trajectory, out of memory; nothing to free). */
int core_traj_to_fields(const core_traj *t, core_traj_fields *f);
/* Frees the metadata strings and zeroes *f. */
void core_traj_fields_free(core_traj_fields *f);

/* Builds *t (allocated here, data copied) from n_tensors named tensors (contiguous CPU, any order) and n_meta
 * metadata key/value strings, as a reader gets them from a file or a wire message. Validates everything; errors
 * start with `label` and name the field: a missing or unknown tensor, wrong dtype or rank or shape (with the
 * expected shape), a missing metadata key or unparsable value, a rule broken by the values. On error *t is zeroed
 * and nothing is left allocated. */
int core_traj_from_fields(core_traj *t, int n_tensors, const char *const *names, const core_tensor *tensors,
                          int n_meta, const char *const *keys, const char *const *values, const char *label);

/* Writes t to a safetensors file (validated first; st_writer_write: temporary file + rename). Returns 0 or -1. */
int core_traj_save(const core_traj *t, const char *path);
/* Reads a file written by core_traj_save (or any writer of the same tensors and metadata) into *t, validating as
 * core_traj_from_fields with the path as label. Returns 0 or -1. */
int core_traj_load(core_traj *t, const char *path);

#endif
