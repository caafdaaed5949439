/* core/rollout_source.c — which image condition each sample of a rollout request carries (core/rollout_source.h). */
#include <stdlib.h>

#include "core/error.h"
#include "core/philox.h"
#include "core/rollout_source.h"

int core_rollout_conditions(const core_rollout_images *images, const core_rollout_request *tmpl,
                              const core_rollout_sample *samples, int n, const float **out) {
    const int eval = tmpl->stream == CORE_STREAM_EVAL_NOISE;
    const float *tab = images->numel ? (eval ? images->eval : images->train) : NULL;
    const int rows = eval ? images->n_eval : images->n_train;
    int with = 0;
    for (int j = 0; j < n; j++) {
        out[j] = samples[j].condition;
        if (!out[j] && tab) {
            if (samples[j].prompt_index < 0 || samples[j].prompt_index >= rows)
                return core_error("rollout: sample uid %llu: prompt index %lld has no image condition (the %s prompts "
                                  "have %d)", (unsigned long long)samples[j].uid, (long long)samples[j].prompt_index,
                                  eval ? "eval" : "training", rows);
            out[j] = tab + samples[j].prompt_index * images->numel;
        }
        with += out[j] != NULL;
    }
    if (with && with < n)
        return core_error("rollout: %d of %d samples have an image condition (a request is image to video throughout)",
                          with, n);
    return with ? 1 : 0;
}
