/* trainer/run/sampler.h — which prompts each GRPO step draws (docs/design.md section 4): B distinct prompts per step from an
 * epoch order that is reshuffled every epoch, drop-last. The sampler's position (epoch, pos) is part of a
 * checkpoint, so a resumed run draws what a straight run draws. */
#ifndef TRAINER_SAMPLER_H
#define TRAINER_SAMPLER_H

#include <stdint.h>

/* The order of epoch `epoch` over n prompts: a Fisher-Yates shuffle, j = 0..n-2: r = j + floor(u_j * (n - j)),
 * swap(perm[j], perm[r]), with u_j = Philox uniform element j of (seed, slot 0, uid = epoch, stream 2). */
void trainer_epoch_order(uint64_t seed, uint32_t epoch, int n, int *perm);

/* B distinct prompts per step: the current epoch's order, B at a time; when fewer than B remain, they are skipped
 * and the next epoch (reshuffled) starts (drop-last), so a step never repeats a prompt. */
typedef struct {
    int n, B;
    uint64_t seed;
    uint32_t epoch;
    int pos;
    int *perm;
} trainer_sampler;

/* -1 when B > n (names rollout.prompts_per_step) or out of memory. */
int trainer_sampler_init(trainer_sampler *s, int n, int B, uint64_t seed);
/* out[B] receives the next step's prompt indices. */
void trainer_sampler_next(trainer_sampler *s, int *out);
/* Restores a checkpoint's position (epoch, pos): the epoch's order is recomputed. */
void trainer_sampler_seek(trainer_sampler *s, uint32_t epoch, int pos);
void trainer_sampler_free(trainer_sampler *s);

#endif
