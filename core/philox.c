/* core/philox.c — Philox4x32-10 and the uniform / normal fills of docs/design.md section 4; see philox.h.
 *
 * The block function follows Salmon et al. (SC 2011) as written in Random123's philox.h: each round multiplies
 * c0 and c2 by fixed 32-bit constants, keeps the 64-bit products' halves, and mixes in the other two words and
 * the key; the key is bumped by the Weyl constants between rounds. */
#include "core/philox.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Fills at least this many elements before OpenMP threads are worth starting. */
#define PARALLEL_MIN_ELEMENTS 16384

static inline void philox_round(uint32_t c[4], uint32_t k0, uint32_t k1) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
}

void core_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        philox_round(c, k0, k1);
    }
    out[0] = c[0];
    out[1] = c[1];
    out[2] = c[2];
    out[3] = c[3];
}

void core_philox_block(uint64_t seed, uint32_t c0, uint32_t slot, uint32_t uid, uint32_t stream, uint32_t out[4]) {
    const uint32_t ctr[4] = {c0, slot, uid, stream};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    core_philox4x32(ctr, key, out);
}

/* Box-Muller on one pair: r = sqrt(-2 ln u_a), (r cos(2 pi u_b), r sin(2 pi u_b)). Every step is a single
 * correctly-rounded operation or a libm call, so there is nothing for the compiler to contract into an FMA. */
static inline void box_muller(uint32_t xa, uint32_t xb, double *za, double *zb) {
    const double two_pi = 6.283185307179586476925286766559;
    double r = sqrt(-2.0 * log(core_philox_u01(xa)));
    double theta = two_pi * core_philox_u01(xb);
    *za = r * cos(theta);
    *zb = r * sin(theta);
}

void core_philox_normal4(uint64_t seed, uint32_t c0, uint32_t slot, uint32_t uid, uint32_t stream, double z[4]) {
    uint32_t x[4];
    core_philox_block(seed, c0, slot, uid, stream, x);
    box_muller(x[0], x[1], &z[0], &z[1]);
    box_muller(x[2], x[3], &z[2], &z[3]);
}

typedef enum { FILL_NORMAL_F32, FILL_UNIFORM_F64, FILL_U32 } fill_kind;

/* Writes the values of elements [start, start + n) of one (seed, slot, uid, stream) sequence into out. Each
 * counter k covers elements 4k..4k+3; a counter at either end of the range writes only its elements inside it. */
static void fill(fill_kind kind, void *out, int64_t start, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid,
                 uint32_t stream) {
    if (n <= 0) return;
    const int64_t end = start + n;
    const int64_t k_first = start / 4, k_last = (end - 1) / 4;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN_ELEMENTS)
    for (int64_t k = k_first; k <= k_last; k++) {
        uint32_t x[4];
        core_philox_block(seed, (uint32_t)k, slot, uid, stream, x);
        double v[4] = {0, 0, 0, 0};
        if (kind == FILL_NORMAL_F32) {
            box_muller(x[0], x[1], &v[0], &v[1]);
            box_muller(x[2], x[3], &v[2], &v[3]);
        }
        for (int j = 0; j < 4; j++) {
            int64_t e = 4 * k + j;
            if (e < start || e >= end) continue;
            switch (kind) {
            case FILL_NORMAL_F32: ((float *)out)[e - start] = (float)v[j]; break;
            case FILL_UNIFORM_F64: ((double *)out)[e - start] = core_philox_u01(x[j]); break;
            case FILL_U32: ((uint32_t *)out)[e - start] = x[j]; break;
            }
        }
    }
}

void core_philox_normal_range(float *out, int64_t start, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid,
                              uint32_t stream) {
    fill(FILL_NORMAL_F32, out, start, n, seed, slot, uid, stream);
}

void core_philox_normal(float *out, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid, uint32_t stream) {
    fill(FILL_NORMAL_F32, out, 0, n, seed, slot, uid, stream);
}

void core_philox_uniform_range(double *out, int64_t start, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid,
                               uint32_t stream) {
    fill(FILL_UNIFORM_F64, out, start, n, seed, slot, uid, stream);
}

void core_philox_uniform(double *out, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid, uint32_t stream) {
    fill(FILL_UNIFORM_F64, out, 0, n, seed, slot, uid, stream);
}

void core_philox_u32_range(uint32_t *out, int64_t start, int64_t n, uint64_t seed, uint32_t slot, uint32_t uid,
                           uint32_t stream) {
    fill(FILL_U32, out, start, n, seed, slot, uid, stream);
}
