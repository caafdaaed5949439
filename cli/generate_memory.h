/* cli/generate_memory.h — `vgrpo generate`'s memory and time estimate. */
#ifndef CLI_GENERATE_MEMORY_H
#define CLI_GENERATE_MEMORY_H

#include "rollout/text_to_video.h"

/* Before any weights are read: what the video needs (trainer/budget/budget.h budget_generate_bytes: everything
 * rollout/text_to_video.c holds at once) against the memory available (budget_memory_available, as run's start-up
 * estimate). Prints the estimate (memory, a step's FLOPs and time) to stdout. Over the memory available: -1 naming the
 * figures and the options, or with force a warning on stderr. 0 also when the
 * pipeline's configs are missing (the loading says so). */
int gen_memory_check(const rollout_t2v_args *g, int force);

#endif
