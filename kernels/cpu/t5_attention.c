/* kernels/cpu/t5_attention.c — T5 self-attention on the CPU (the umT5 encoder's, model/text/umt5.c through the
 * device table's t5_attention entry of the CPU table): fp32 scores, a double softmax, exact chains (see cpu.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu.h"

/* The vector helpers below are static and inlined: the ABI of their 64-byte vector returns, which GCC warns about
 * under a -march without AVX-512 (the GPU check's x86-64-v3 build links this file), never crosses a call. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* k_cpu_t5_attention (cpu.h). Each score is the sequential fp32 sum over d of q[d] * k[d] (a product, then a sum, each
 * rounded; no fma); each output column is the sequential double sum over the kept keys, in key order, of
 * p_j * v_j[d] (likewise). The loops below keep exactly those chains and only choose how many run side by side: R query rows at once, each with
 * the scores of 64 keys (one key per vector lane, the head's keys transposed first) and then 32 output columns, so
 * that every key's loads serve R rows and the chains' add latency hides behind independent lanes instead of one
 * dependent add per key (measured on `vgrpo bench umt5`, 512 tokens, 2 threads: 144 -> 99 ms, the attention had been
 * most of the encoder's time). GCC vector extensions: AVX-512 registers under -march=native on such a machine,
 * narrower ones or scalars elsewhere, the same values (tests/test_umt5.c: t5_attention_chains_bitwise). */
typedef float t5_v16f __attribute__((vector_size(64)));
typedef double t5_v8d __attribute__((vector_size(64)));
/* SKV keys per score vector, SDV columns per output vector; R query rows at a time share each key's loads (the rows
 * of a head keep the same keys: the mask is per key). */
enum { SKV = 16, SDV = 8, R = 4 };

static inline t5_v16f ld16f(const float *p) {
    t5_v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline t5_v8d ld8d(const double *p) {
    t5_v8d v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* sc[r][j0 .. j0 + NV*SKV) for the NR rows q[r] (row stride qs; sc row stride Sp) = the score chains against the
 * transposed keys kt (row stride Sp). */
#define T5_SCORES(NR, NV)                                                                                         \
    static inline void scores_##NR##x##NV(float *sc, const float *q, ptrdiff_t qs, const float *kt, int Sp,      \
                                          int Dk, int j0) {                                                       \
        t5_v16f s[NR][NV];                                                                                        \
        for (int r = 0; r < NR; r++)                                                                              \
            for (int u = 0; u < NV; u++) s[r][u] = (t5_v16f){0};                                                  \
        for (int d = 0; d < Dk; d++) {                                                                            \
            const float *kd = kt + (size_t)d * Sp + j0;                                                           \
            t5_v16f kv[NV];                                                                                       \
            for (int u = 0; u < NV; u++) kv[u] = ld16f(kd + u * SKV);                                             \
            for (int r = 0; r < NR; r++) {                                                                        \
                const t5_v16f qd = (t5_v16f){0} + q[r * qs + d];                                                  \
                for (int u = 0; u < NV; u++) s[r][u] += qd * kv[u];                                               \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < NR; r++) memcpy(sc + (size_t)r * Sp + j0, s[r], sizeof s[r]);                         \
    }
T5_SCORES(4, 4)
T5_SCORES(1, 4)
T5_SCORES(4, 1)
T5_SCORES(1, 1)
#undef T5_SCORES

/* acc[r][d0 .. d0 + NV*SDV) (row stride Dk) = sum over t < nj in order of pj[r][t] * vd[jl[t]][d] for the NR rows
 * (pj row stride S; vd rows of Dk doubles). */
#define T5_COLUMNS(NR, NV)                                                                                        \
    static inline void columns_##NR##x##NV(double *acc, const double *pj, int S, const int *jl, int nj,           \
                                           const double *vd, int Dk, int d0) {                                    \
        t5_v8d a[NR][NV];                                                                                         \
        for (int r = 0; r < NR; r++)                                                                              \
            for (int u = 0; u < NV; u++) a[r][u] = (t5_v8d){0};                                                   \
        for (int t = 0; t < nj; t++) {                                                                            \
            const double *vj = vd + (size_t)jl[t] * Dk + d0;                                                      \
            t5_v8d vv[NV];                                                                                        \
            for (int u = 0; u < NV; u++) vv[u] = ld8d(vj + u * SDV);                                              \
            for (int r = 0; r < NR; r++) {                                                                        \
                const t5_v8d p = (t5_v8d){0} + pj[(size_t)r * S + t];                                             \
                for (int u = 0; u < NV; u++) a[r][u] += p * vv[u];                                                \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < NR; r++) memcpy(acc + (size_t)r * Dk + d0, a[r], sizeof a[r]);                        \
    }
T5_COLUMNS(4, 4)
T5_COLUMNS(1, 4)
T5_COLUMNS(4, 1)
T5_COLUMNS(1, 1)
#undef T5_COLUMNS

/* Rows i0 .. i0 + nr - 1 (nr = R or 1) of one head: scores, softmax, outputs (the chains of the comment above);
 * bias_rel[j - i + S - 1]: the head's bias for key j of query i. */
static void attention_rows(float *o, const float *q, const float *kt, const double *vd, float *sc, double *pj,
                           double *acc, int *jl, const float *bias_rel, const int32_t *m, int b, int h, int S, int Sp,
                           int H, int Dk, int i0, int nr) {
    const int I = H * Dk;
    const float *q0 = q + ((size_t)b * S + i0) * I + (size_t)h * Dk;
    int j0 = 0;
    for (; j0 + 4 * SKV <= Sp; j0 += 4 * SKV)
        (nr == R ? scores_4x4 : scores_1x4)(sc, q0, I, kt, Sp, Dk, j0);
    for (; j0 < Sp; j0 += SKV) (nr == R ? scores_4x1 : scores_1x1)(sc, q0, I, kt, Sp, Dk, j0);
    double sum[R];
    int nj = 0;
    for (int r = 0; r < nr; r++) {
        /* the scores plus the head's bias by relative position; their maximum over the kept keys in 16 running
         * maxima (the same value whatever the order, but for the sign of a zero, which exp(s - max) does not see) */
        const float *br = bias_rel + (S - 1 - (i0 + r));
        float *sr = sc + (size_t)r * Sp, mxl[16];
        for (int l = 0; l < 16; l++) mxl[l] = -INFINITY;
        int j = 0;
        for (; j + 16 <= S; j += 16) /* (masked keys' sums are written too, never read) */
            for (int l = 0; l < 16; l++) {
                const float s = sr[j + l] + br[j + l], c = m && !m[j + l] ? -INFINITY : s;
                sr[j + l] = s;
                mxl[l] = c > mxl[l] ? c : mxl[l];
            }
        for (; j < S; j++) {
            const float s = sr[j] + br[j], c = m && !m[j] ? -INFINITY : s;
            sr[j] = s;
            mxl[j & 15] = c > mxl[j & 15] ? c : mxl[j & 15];
        }
        float mx = -INFINITY;
        for (int l = 0; l < 16; l++)
            if (mxl[l] > mx) mx = mxl[l];
        /* the probabilities and their sum in key order */
        double sm = 0, *pr = pj + (size_t)r * S;
        nj = 0;
        for (int j = 0; j < S; j++) {
            if (m && !m[j]) continue;
            double p = exp((double)sr[j] - mx);
            sm += p;
            pr[nj] = p, jl[nj++] = j;
        }
        sum[r] = sm;
    }
    int d0 = 0;
    for (; d0 + 4 * SDV <= Dk; d0 += 4 * SDV) (nr == R ? columns_4x4 : columns_1x4)(acc, pj, S, jl, nj, vd, Dk, d0);
    for (; d0 + SDV <= Dk; d0 += SDV) (nr == R ? columns_4x1 : columns_1x1)(acc, pj, S, jl, nj, vd, Dk, d0);
    for (int r = 0; r < nr; r++) {
        double *ar = acc + (size_t)r * Dk;
        const double *pr = pj + (size_t)r * S;
        for (int d = d0; d < Dk; d++) {
            double a = 0;
            for (int t = 0; t < nj; t++) a += pr[t] * vd[(size_t)jl[t] * Dk + d];
            ar[d] = a;
        }
        float *oi = o + ((size_t)b * S + i0 + r) * I + (size_t)h * Dk;
        for (int d = 0; d < Dk; d++) oi[d] = sum[r] > 0 ? (float)(ar[d] / sum[r]) : 0.0f;
    }
}

int k_cpu_t5_attention(float *o, const float *q, const float *k, const float *v, const float *rel_bias, const int *bucket_of,
                 const int32_t *mask, int B, int S, int H, int Dk) {
    int I = H * Dk, oom = 0;
    const int Sp = (S + SKV - 1) / SKV * SKV;
#pragma omp parallel reduction(| : oom)
    {
        float *sc = malloc((size_t)R * Sp * sizeof(float)), *kt = malloc((size_t)Dk * Sp * sizeof(float));
        double *acc = malloc((size_t)R * Dk * sizeof(double)), *pj = malloc((size_t)R * S * sizeof(double));
        double *vd = malloc((size_t)S * Dk * sizeof(double));
        int *jl = malloc((size_t)S * sizeof(int));
        float *bias_rel = malloc((size_t)(2 * S - 1) * sizeof(float));
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                if (!sc || !acc || !kt || !pj || !jl || !vd || !bias_rel) {
                    oom = 1;
                    continue;
                }
                const int32_t *m = mask ? mask + (size_t)b * S : NULL;
                for (int r = 0; r < 2 * S - 1; r++) bias_rel[r] = rel_bias[(size_t)bucket_of[r] * H + h];
                for (int j = 0; j < Sp; j++) /* kt[d][j] = k_j[d]; keys past S zero (their scores are not used) */
                    for (int d = 0; d < Dk; d++)
                        kt[(size_t)d * Sp + j] = j < S ? k[((size_t)b * S + j) * I + (size_t)h * Dk + d] : 0.0f;
                for (int j = 0; j < S; j++) /* vd[j][d] = v_j[d] as double (exact), as the sums use it */
                    for (int d = 0; d < Dk; d++) vd[(size_t)j * Dk + d] = (double)v[((size_t)b * S + j) * I + (size_t)h * Dk + d];
                int i = 0;
                for (; i + R <= S; i += R)
                    attention_rows(o, q, kt, vd, sc, pj, acc, jl, bias_rel, m, b, h, S, Sp, H, Dk, i, R);
                for (; i < S; i++)
                    attention_rows(o, q, kt, vd, sc, pj, acc, jl, bias_rel, m, b, h, S, Sp, H, Dk, i, 1);
            }
        free(sc);
        free(kt);
        free(acc);
        free(pj);
        free(jl);
        free(vd);
        free(bias_rel);
    }
    return oom ? core_error("t5_attention: out of memory") : 0;
}
