/* trainer/step/sde_window.h — SDE windows (rollout.sde_window): the denoising steps of a rollout round that are noisy and
 * trained. Inside the window the sampler steps with rollout.eta, outside with eta 0 (the deterministic ODE step, no
 * log-prob), so only window steps have a log-prob and only they are candidates of the timestep selection; the
 * trajectories keep latents[start .. start + size] only (core/trajectory.h, stored range).
 *
 * A window is `size` consecutive steps start .. start + size - 1 inside rollout.sde_window.range [lo, hi) (default
 * [0, num_steps - 1]: the last step, closest to the clean video, is left out as both references do without windows):
 *   random       (Flow-GRPO-Fast, flow_grpo sd3_pipeline_with_logprob_fast.py: start = randint(lo, hi - size) per
 *                rollout batch): start = lo + floor(u (hi - size - lo + 1)), u = Philox uniform element 0 of (data.seed,
 *                slot 0, uid = rollout round, stream 7). Every rank and worker computes the same start from the round
 *                alone; the reference draws it with Python's `random` in each process, unsynchronised.
 *   progressive  (MixGRPO, fastvideo/utils/grpo_states.py, sample_strategy "progressive"): the window starts at lo and
 *                moves by `shift` steps (0: by its size, MixGRPO's default without prog_overlap) every
 *                iters_per_window optimizer steps; positions lo, lo + shift, ... while start + size <= hi; past the last
 *                one the window stays there (at_end clamp, MixGRPO's default) or starts again at lo (restart,
 *                MixGRPO's roll_back). With U = algorithm.optimizer_steps_per_rollout, round k has had k U optimizer
 *                steps, so its window is a function of k: the run's step counter is the whole state, which every
 *                checkpoint already holds (a resume continues the schedule exactly).
 * With timestep_selection: "all" trains every window step with a log-prob, "random_k K" (K <= size) K of them per
 * sample; first_fraction and from_range pick steps by index regardless of the window and are refused at start-up. */
#ifndef TRAINER_SDE_WINDOW_H
#define TRAINER_SDE_WINDOW_H

#include <stdint.h>

#include "core/recipe.h"

typedef enum { SDE_WINDOW_RANDOM = 0, SDE_WINDOW_PROGRESSIVE = 1 } sde_window_schedule;

typedef struct {
    int size;       /* 0: no window (every step noisy) */
    int lo, hi;     /* steps lo .. hi-1 */
    sde_window_schedule schedule;
    int shift;      /* progressive: >= 1 */
    int iters;      /* progressive: optimizer steps per position, >= 1 */
    int restart;    /* progressive: 1 restart at lo, 0 clamp at the last position */
    int updates_per_round; /* algorithm.optimizer_steps_per_rollout */
    uint64_t seed;  /* data.seed */
} sde_window;

/* The window settings of a checked recipe (core_recipe_check filled the range). Errors (-1, naming the key): a
 * timestep selection other than all / random_k with a window, random_k K > size. */
int sde_window_from_recipe(const core_recipe *r, sde_window *w);

/* The window of rollout round `round` (>= 0): steps [*lo, *hi). Without a window: [0, num_steps). */
void sde_window_of_round(const sde_window *w, int num_steps, int64_t round, int *lo, int *hi);

#endif
