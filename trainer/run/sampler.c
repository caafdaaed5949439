/* trainer/run/sampler.c — the prompt sampler: epoch order from Philox stream 2, B distinct prompts per step (see
 * trainer/run/sampler.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "trainer/run/sampler.h"

void trainer_epoch_order(uint64_t seed, uint32_t epoch, int n, int *perm) {
    for (int i = 0; i < n; i++) perm[i] = i;
    if (n < 2) return;
    double *u = malloc(sizeof(double) * (size_t)n);
    if (!u) return; /* identity order; n is a prompt count, this does not happen in practice */
    core_philox_uniform(u, n, seed, 0, epoch, CORE_STREAM_PROMPT_SHUFFLE);
    for (int j = 0; j < n - 1; j++) {
        int r = j + (int)floor(u[j] * (double)(n - j));
        if (r > n - 1) r = n - 1;
        int t = perm[j];
        perm[j] = perm[r];
        perm[r] = t;
    }
    free(u);
}

int trainer_sampler_init(trainer_sampler *s, int n, int B, uint64_t seed) {
    memset(s, 0, sizeof *s);
    if (B > n) return core_error("rollout.prompts_per_step: %d distinct prompts per step, but the prompt file has %d", B, n);
    if (!(s->perm = malloc(sizeof(int) * (size_t)n))) return core_error("out of memory");
    s->n = n, s->B = B, s->seed = seed;
    trainer_epoch_order(seed, 0, n, s->perm);
    return 0;
}

void trainer_sampler_next(trainer_sampler *s, int *out) {
    if (s->pos + s->B > s->n) {
        s->epoch++;
        s->pos = 0;
        trainer_epoch_order(s->seed, s->epoch, s->n, s->perm);
    }
    for (int i = 0; i < s->B; i++) out[i] = s->perm[s->pos + i];
    s->pos += s->B;
}

void trainer_sampler_seek(trainer_sampler *s, uint32_t epoch, int pos) {
    s->epoch = epoch;
    s->pos = pos;
    trainer_epoch_order(s->seed, s->epoch, s->n, s->perm);
}

void trainer_sampler_free(trainer_sampler *s) {
    free(s->perm);
    memset(s, 0, sizeof *s);
}
