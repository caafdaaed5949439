/* trainer/step/sde_window.c — SDE windows (see trainer/step/sde_window.h). */
#include "trainer/step/sde_window.h"

#include <math.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "trainer/step/grpo.h"

int sde_window_from_recipe(const core_recipe *r, sde_window *w) {
    memset(w, 0, sizeof *w);
    w->size = r->sde_window_size;
    w->lo = r->sde_window_range.n == 2 ? (int)r->sde_window_range.v[0] : 0;
    w->hi = r->sde_window_range.n == 2 ? (int)r->sde_window_range.v[1] : r->num_steps - 1;
    w->schedule = r->choice.sde_window_schedule == CORE_WINDOW_PROGRESSIVE ? SDE_WINDOW_PROGRESSIVE : SDE_WINDOW_RANDOM;
    w->shift = r->sde_window_shift > 0 ? r->sde_window_shift : (w->size > 0 ? w->size : 1);
    w->iters = r->sde_window_iters;
    w->restart = r->choice.sde_window_at_end == CORE_WINDOW_RESTART;
    w->updates_per_round = r->optimizer_steps_per_rollout;
    w->seed = (uint64_t)r->seed;
    if (w->size == 0) return 0;
    grpo_selection sel;
    if (grpo_selection_parse(r->timestep_selection, &sel)) return -1;
    if (sel.mode == GRPO_SEL_FIRST_FRACTION || sel.mode == GRPO_SEL_FROM_RANGE)
        return core_error("algorithm.timestep_selection: \"%s\" picks steps by index, but with rollout.sde_window only "
                          "the window's steps have a log-prob: use all or random_k K (K <= %d)",
                          r->timestep_selection, w->size);
    if (sel.mode == GRPO_SEL_RANDOM_K && sel.k > w->size)
        return core_error("algorithm.timestep_selection: random_k %d, but rollout.sde_window.size is %d (the window's "
                          "steps are the only candidates)", sel.k, w->size);
    return 0;
}

void sde_window_of_round(const sde_window *w, int num_steps, int64_t round, int *lo, int *hi) {
    if (w->size <= 0) {
        *lo = 0, *hi = num_steps;
        return;
    }
    const int64_t positions = (int64_t)(w->hi - w->size - w->lo) / w->shift + 1; /* >= 1: size <= hi - lo */
    int64_t p;
    if (w->schedule == SDE_WINDOW_RANDOM) {
        double u;
        core_philox_uniform(&u, 1, w->seed, 0, (uint32_t)round, CORE_STREAM_SDE_WINDOW);
        const int64_t span = (int64_t)(w->hi - w->size - w->lo) + 1;
        int64_t off = (int64_t)floor(u * (double)span);
        if (off >= span) off = span - 1; /* u < 1, kept for safety */
        *lo = w->lo + (int)off;
        *hi = *lo + w->size;
        return;
    }
    const int64_t moves = round * w->updates_per_round / w->iters;
    p = w->restart ? moves % positions : (moves < positions ? moves : positions - 1);
    *lo = w->lo + (int)(p * w->shift);
    *hi = *lo + w->size;
}
