/* cli/local_run.h — `vgrpo run` in local mode (rollout, reward and training in one process) and its pieces:
 * prompt lists, the epoch shuffle, decoding + scoring. Only cli/ composes rollout/ and trainer/ (DESIGN.md 2). */
#ifndef CLI_LOCAL_RUN_H
#define CLI_LOCAL_RUN_H

#include <stdint.h>

#include "core/recipe.h"
#include "core/trajectory.h"
#include "model/latent_rgb.h"
#include "model/wan_vae.h"
#include "reward/scorers.h"

/* ---- prompts (cli/local_data.c) ---- */

typedef struct {
    int n;
    char **text; /* [n] */
} local_prompts;

/* Reads a prompt file: one prompt per line, surrounding spaces trimmed, blank lines and lines starting with '#'
 * skipped. -1 naming the path (missing, no prompts). */
int local_prompts_read(local_prompts *p, const char *path);
void local_prompts_free(local_prompts *p);

/* The order of epoch `epoch` over n prompts: a Fisher-Yates shuffle, j = 0..n-2: r = j + floor(u_j * (n - j)),
 * swap(perm[j], perm[r]), with u_j = Philox uniform element j of (seed, slot 0, uid = epoch, stream 2). */
void local_epoch_order(uint64_t seed, uint32_t epoch, int n, int *perm);

/* Draws B distinct prompts per step: the current epoch's order, B at a time; when fewer than B remain, they are
 * skipped and the next epoch (reshuffled) starts (drop-last), so a step never repeats a prompt. */
typedef struct {
    int n, B;
    uint64_t seed;
    uint32_t epoch;
    int pos;
    int *perm;
} local_sampler;

/* -1 when B > n (names rollout.prompts_per_step) or out of memory. */
int local_sampler_init(local_sampler *s, int n, int B, uint64_t seed);
void local_sampler_next(local_sampler *s, int *out);
void local_sampler_free(local_sampler *s);

/* ---- scoring (cli/local_data.c) ---- */

typedef struct {
    int n;                              /* scorers */
    const reward_scorer *sc[CORE_TRAJ_MAX_REWARDS];
    const char *names[CORE_TRAJ_MAX_REWARDS];
    double weight[CORE_TRAJ_MAX_REWARDS];
} local_scoring;

/* Looks up the recipe's scorers (unknown name: error naming reward.scorers). */
int local_scoring_init(local_scoring *s, const core_recipe *r);

/* The path from final latents to pixels (model.decoder): exactly one of map / vae is set. */
typedef struct {
    const wan_latent_rgb *map; /* latent_rgb: one frame per latent frame, each latent pixel 8 x 8 */
    vae_model *vae;            /* vae: vae_latents_to_u8, 1 + 4(T - 1) frames, spatial factor 8 */
} local_decoder;

/* Video frames the decoder gives for T latent frames. */
int local_decoder_frames(const local_decoder *d, int T);

/* Decodes traj's final latent [C, T, h, w] through d into video (caller's buffer [local_decoder_frames(T), 8h, 8w,
 * 3] U8) and scores it: rewards[i] per scorer, the total sum of weight x reward (in double, scorer order, rounded to
 * float once), stored into the trajectory too (core_traj_set_rewards). -1 naming the decoder, scorer or prompt. */
int local_score(const local_scoring *s, const local_decoder *d, core_traj *t, const char *prompt, uint8_t *video);

/* ---- the run (cli/local_run.c) ---- */

/* Runs the recipe in local mode: steps_override > 0 replaces optim.total_steps as the number of GRPO steps (the lr
 * schedule keeps optim.total_steps). Writes the run directory and prints one line per step. -1 with an error. */
int local_run(const core_recipe *r, int64_t steps_override);

/* The checks of a recipe that need trainer/reward modules but no weights: timestep selection vs num_steps, scorer
 * names, optimizer values. -1 naming the key. */
int local_check_recipe(const core_recipe *r);

#endif
