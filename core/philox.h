/* core/philox.h — the Philox4x32-10 counter-based generator and the noise fills built on it.
 *
 * Reference: Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), and its
 * Random123 library (whose tests/kat_vectors our tests check). docs/design.md section 4 fixes how vgrpo uses it:
 *   key     = (seed & 0xffffffff, seed >> 32)
 *   counter = (element_index / 4, slot, uid, stream)
 *   u_j     = (x_j + 0.5) / 2^32                                   (x_0..x_3: the four outputs of one counter)
 *   z_0 = r cos(2 pi u_1), z_1 = r sin(2 pi u_1), r = sqrt(-2 ln u_0); z_2, z_3 likewise from (u_2, u_3)
 *   element 4k + j takes z_j of counter k.
 * Element values depend only on (seed, slot, uid, stream, element index): never on thread count, on which range
 * of a tensor a call fills, or on the process. Normals are computed in double and rounded once to float: with the
 * same libm (glibc on every CPU host) results are bit-identical; a libm whose double log/sin/cos differ in the last
 * double bit (CUDA's, later) can change the rounded float only when the double lies within that bit of a float
 * rounding boundary, about one element in 2^29. Do not build this file with -ffast-math (it would allow vector
 * libm variants and reassociation). Element indices must stay below 2^34 (c0 is 32 bits); the fills do not check. */
#ifndef CORE_PHILOX_H
#define CORE_PHILOX_H

#include <stdint.h>

/* The streams of docs/design.md section 4 (the counter's c3). */
enum {
    CORE_STREAM_ROLLOUT_NOISE = 0, /* initial and per-step SDE noise of rollouts */
    CORE_STREAM_SELECTION = 1,     /* timestep selection (random_k, from_range) */
    CORE_STREAM_PROMPT_SHUFFLE = 2,
    CORE_STREAM_EVAL_NOISE = 3,
    CORE_STREAM_WORD_EMBED = 4, /* tiny preset's word embeddings (uid = FNV-1a hash of the word) */
    CORE_STREAM_MODEL_INIT = 5, /* random initial weights (init-model, tests) */
    CORE_STREAM_LORA_INIT = 6,  /* LoRA A matrices (model/dit/wan_lora.h); docs/design.md section 4 */
    CORE_STREAM_SDE_WINDOW = 7, /* SDE window start of a rollout round (trainer/step/sde_window.h; uid = the round) */
    CORE_STREAM_NFT_NOISE = 8,  /* DiffusionNFT's forward-process noise (trainer/step/nft.h; uid = the sample's uid) */
    CORE_STREAM_DPO_NOISE = 9   /* Flow-DPO's shared noise of a pair (trainer/step/dpo.h; uid = the preferred sample's) */
};

/* One Philox4x32-10 block: out = bijection of ctr under key (10 rounds, multipliers 0xD2511F53, 0xCD9E8D57,
 * Weyl key increments 0x9E3779B9, 0xBB67AE85). out may not alias ctr. Follows Random123's philox4x32_R(10,...). */
void core_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The uniform in (0, 1) of one 32-bit output: (x + 0.5) / 2^32, exact in double. Never 0 or 1 in double; note that
 * rounding it to float gives 1.0f for x >= 2^32 - 128, so callers that need float keep the open interval themselves. */
static inline double core_philox_u01(uint32_t x) { return ((double)x + 0.5) * (1.0 / 4294967296.0); }

/* The four raw outputs of counter (c0, slot, uid, stream) under key (seed low, seed high). */
void core_philox_block(uint64_t seed, uint32_t c0, uint32_t slot, uint32_t uid, uint32_t stream, uint32_t out[4]);

/* The four standard normals z_0..z_3 of counter (c0, slot, uid, stream), in double (Box-Muller as above). */
void core_philox_normal4(uint64_t seed, uint32_t c0, uint32_t slot, uint32_t uid, uint32_t stream, double z[4]);

/* out[i] = the normal of element start + i, i in [0, n): float, rounded once from the double value. start and n
 * need not be multiples of 4, so shards of one tensor can be filled separately and agree with a whole fill.
 * Uses OpenMP threads for large n; the values do not depend on the thread count. */
void core_philox_normal_range(float *out, int64_t start, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid,
                              uint32_t stream);
/* core_philox_normal_range with start = 0. */
void core_philox_normal(float *out, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid, uint32_t stream);

/* out[i] = u of element start + i, i in [0, n), element 4k + j taking u_j of counter k: double in (0, 1), exact
 * (see core_philox_u01). Used for selection and shuffles, where float rounding would bias the ends. */
void core_philox_uniform_range(double *out, int64_t start, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid,
                               uint32_t stream);
/* core_philox_uniform_range with start = 0. */
void core_philox_uniform(double *out, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid, uint32_t stream);

/* out[i] = raw 32-bit output of element start + i (element 4k + j is x_j of counter k). */
void core_philox_u32_range(uint32_t *out, int64_t start, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid,
                           uint32_t stream);

#endif
