/* tests/test_philox.c — Philox4x32-10 known answers (Random123 tests/kat_vectors), the key/counter mapping of
 * docs/design.md section 4, the Box-Muller formula, statistics, and independence from thread count and range split. */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core/philox.h"
#include "tests/test.h"

/* Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter (4 words), key (2 words), expected. */
static const uint32_t kat[3][10] = {
    {0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c,
     0x9b00dbd8},
    {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
     0x6d5451fd},
    {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
     0x24126ea1},
};

TEST(philox_known_answers) {
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        core_philox4x32(&kat[t][0], &kat[t][4], out);
        for (int j = 0; j < 4; j++)
            CHECK_MSG(out[j] == kat[t][6 + j], "vector %d word %d: got %08x, want %08x", t, j, out[j], kat[t][6 + j]);
    }
}

/* The same vectors through the fill API: key = (seed low, seed high), counter = (element/4, slot, uid, stream). */
TEST(philox_key_counter_mapping) {
    for (int t = 0; t < 3; t++) {
        const uint32_t *v = kat[t];
        uint64_t seed = (uint64_t)v[4] | ((uint64_t)v[5] << 32);
        uint32_t out[4];
        core_philox_u32_range(out, 4 * (int64_t)v[0], 4, seed, v[1], v[2], v[3]);
        for (int j = 0; j < 4; j++) CHECK_MSG(out[j] == v[6 + j], "vector %d word %d: %08x", t, j, out[j]);
        core_philox_block(seed, v[0], v[1], v[2], v[3], out);
        CHECK(out[0] == v[6] && out[3] == v[9]);
    }
}

/* Normals and uniforms of counter 0 with seed 0, slot 0, uid 0, stream 0 are functions of the first KAT's output;
 * recompute them here in double from the published words. */
TEST(philox_normal_formula) {
    const uint32_t *x = &kat[0][6];
    double u[4], z[4];
    for (int j = 0; j < 4; j++) u[j] = ((double)x[j] + 0.5) / 4294967296.0;
    for (int p = 0; p < 2; p++) {
        double r = sqrt(-2.0 * log(u[2 * p]));
        z[2 * p] = r * cos(2.0 * M_PI * u[2 * p + 1]);
        z[2 * p + 1] = r * sin(2.0 * M_PI * u[2 * p + 1]);
    }
    float zf[8];
    core_philox_normal(zf, 8, 0, 0, 0, CORE_STREAM_ROLLOUT_NOISE);
    for (int j = 0; j < 4; j++) CHECK_MSG(zf[j] == (float)z[j], "z_%d: %.9g vs %.9g", j, zf[j], z[j]);
    double z4[4];
    core_philox_normal4(0, 0, 0, 0, 0, z4);
    for (int j = 0; j < 4; j++) CHECK_NEAR(z4[j], z[j], 1e-15);
    /* Values from an independent numpy evaluation of the same formula (float64). */
    CHECK_NEAR(z[0], 0.9911376799, 1e-9);
    CHECK_NEAR(z[1], -0.9246625877, 1e-9);
    double uf[4];
    core_philox_uniform(uf, 4, 0, 0, 0, 0);
    for (int j = 0; j < 4; j++) CHECK(uf[j] == u[j]);
    /* Elements 4..7 come from counter 1, not 0. */
    uint32_t x1[4];
    core_philox_block(0, 1, 0, 0, 0, x1);
    double r1 = sqrt(-2.0 * log(((double)x1[2] + 0.5) / 4294967296.0));
    CHECK(zf[7] == (float)(r1 * sin(2.0 * M_PI * (((double)x1[3] + 0.5) / 4294967296.0))));
}

TEST(philox_normal_statistics) {
    const int64_t n = 1000000;
    float *z = malloc(n * sizeof *z);
    REQUIRE(z);
    core_philox_normal(z, n, 1234567, 3, 42, CORE_STREAM_ROLLOUT_NOISE);
    double s = 0, s2 = 0, s4 = 0;
    int64_t within1 = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = z[i];
        s += v;
        s2 += v * v;
        s4 += v * v * v * v;
        within1 += fabs(v) < 1.0;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    /* Bounds are 5 standard errors: mean 1/sqrt(n), variance sqrt(2/n), 4th moment sqrt(96/n),
     * P(|z| < 1) = 0.682689 with sqrt(p(1-p)/n). */
    CHECK_NEAR(mean, 0.0, 5 * 1e-3);
    CHECK_NEAR(var, 1.0, 5 * 1.415e-3);
    CHECK_NEAR(s4 / n, 3.0, 5 * 9.8e-3);
    CHECK_NEAR((double)within1 / n, 0.682689, 5 * 4.66e-4);
    free(z);

    double *u = malloc(n * sizeof *u);
    REQUIRE(u);
    core_philox_uniform(u, n, 99, 0, 7, CORE_STREAM_SELECTION);
    double su = 0, umin = 1, umax = 0;
    for (int64_t i = 0; i < n; i++) {
        su += u[i];
        umin = fmin(umin, u[i]);
        umax = fmax(umax, u[i]);
    }
    CHECK_NEAR(su / n, 0.5, 5 * 2.89e-4); /* sd of U(0,1) mean: sqrt(1/12/n) */
    CHECK(umin > 0.0 && umax < 1.0);
    free(u);
}

TEST(philox_streams_differ) {
    float a[64], b[64];
    const uint32_t args[4][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {0, 0, 0}};
    core_philox_normal(a, 64, 5, 0, 0, 0);
    for (int c = 0; c < 4; c++) {
        uint64_t seed = c == 3 ? 6 : 5;
        core_philox_normal(b, 64, seed, args[c][0], args[c][1], args[c][2]);
        int same = 0;
        for (int i = 0; i < 64; i++) same += a[i] == b[i];
        CHECK_MSG(same == 0, "case %d: %d equal elements", c, same);
    }
    /* Seed high word matters too. */
    core_philox_normal(b, 64, 5 | (1ull << 32), 0, 0, 0);
    CHECK(memcmp(a, b, sizeof a) != 0);
}

TEST(philox_thread_count_invariance) {
    const int64_t n = 200003; /* large enough to use threads; not a multiple of 4 */
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    REQUIRE(a && b);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    core_philox_normal_range(a, 5, n, 77, 2, 9, CORE_STREAM_EVAL_NOISE);
    omp_set_num_threads(2);
    core_philox_normal_range(b, 5, n, 77, 2, 9, CORE_STREAM_EVAL_NOISE);
    omp_set_num_threads(saved);
    CHECK(memcmp(a, b, n * sizeof *a) == 0);
    free(a);
    free(b);
}

TEST(philox_range_split) {
    enum { N = 1003 };
    float whole[N], part[N];
    double uw[N], up[N];
    core_philox_normal(whole, N, 31337, 4, 11, CORE_STREAM_ROLLOUT_NOISE);
    core_philox_uniform(uw, N, 31337, 4, 11, CORE_STREAM_ROLLOUT_NOISE);
    for (int k = 0; k <= 13; k++) {
        memset(part, 0, sizeof part);
        core_philox_normal_range(part, 0, k, 31337, 4, 11, CORE_STREAM_ROLLOUT_NOISE);
        core_philox_normal_range(part + k, k, N - k, 31337, 4, 11, CORE_STREAM_ROLLOUT_NOISE);
        CHECK_MSG(memcmp(whole, part, sizeof whole) == 0, "normal split at %d differs", k);
        core_philox_uniform_range(up, 0, k, 31337, 4, 11, CORE_STREAM_ROLLOUT_NOISE);
        core_philox_uniform_range(up + k, k, N - k, 31337, 4, 11, CORE_STREAM_ROLLOUT_NOISE);
        CHECK_MSG(memcmp(uw, up, sizeof uw) == 0, "uniform split at %d differs", k);
    }
    /* Three shards of odd sizes, filled in reverse order. */
    const int cut1 = 333, cut2 = 334 + 333;
    memset(part, 0, sizeof part);
    core_philox_normal_range(part + cut2, cut2, N - cut2, 31337, 4, 11, 0);
    core_philox_normal_range(part + cut1, cut1, cut2 - cut1, 31337, 4, 11, 0);
    core_philox_normal_range(part, 0, cut1, 31337, 4, 11, 0);
    CHECK(memcmp(whole, part, sizeof whole) == 0);
    /* Zero-length fills write nothing. */
    part[0] = 123.0f;
    core_philox_normal_range(part, 17, 0, 31337, 4, 11, 0);
    CHECK(part[0] == 123.0f);
}
