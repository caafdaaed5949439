/* core/reduce.h — fixed-order fp32 sums whose result does not depend on the thread count.
 *
 * docs/design.md section 4: every reduction that feeds a log-prob, a loss or a reward uses one fixed order. Ours:
 *   1. the n elements are cut into chunks of CORE_REDUCE_CHUNK (4096) consecutive elements (the last may be
 *      shorter); each chunk is summed sequentially in fp32, element 0 first (acc = 0.0f; acc += x[i]);
 *   2. the chunk sums c_0 .. c_{m-1} are combined by a fixed pairwise tree: level by level, neighbours are added
 *      left + right ((c_0 + c_1), (c_2 + c_3), ...), an odd last one moves up unchanged, until one value is left.
 * Chunks are summed in parallel (OpenMP) only when there are several; the association of every addition is fixed by
 * the rules above, so 1 or 16 threads, a CPU or a GPU kernel that follows the rules, give the same bits (given no
 * fused multiply-add inside the per-element terms: this file and its users compile without contraction).
 * An empty input sums to 0. Sums of NaN/inf propagate as IEEE arithmetic does.
 * Reference: pairwise summation (Higham, "The accuracy of floating point summation", SIAM J. Sci. Comput. 1993). */
#ifndef CORE_REDUCE_H
#define CORE_REDUCE_H

#include <stdint.h>

#define CORE_REDUCE_CHUNK 4096

/* The per-chunk term: returns the fp32 sum, in index order, of the chunk's terms for elements [begin, end)
 * (end - begin <= CORE_REDUCE_CHUNK). It may also write per-element outputs of its range (used by fused kernels);
 * it is called exactly once per chunk, possibly from several threads at once for different chunks. */
typedef float (*core_chunk_fn)(void *ctx, int64_t begin, int64_t end);

/* Fixed-order sum over n elements (n >= 0) of the terms `chunk` computes, combined as described above. */
float core_reduce_fixed(int64_t n, core_chunk_fn chunk, void *ctx);

/* Combines m >= 0 chunk sums c[0..m) by the fixed pairwise tree (0 for m == 0). c is not modified. */
float core_reduce_combine(const float *c, int64_t m);

/* sum_i x[i], i in [0, n), in the fixed order. */
float core_sum_fixed(const float *x, int64_t n);

/* sum_i (a[i] - b[i])^2 in the fixed order (each term: d = a - b, then d * d, both rounded to fp32). */
float core_sum_sq_diff_fixed(const float *a, const float *b, int64_t n);

/* Summary statistics of x[0..n) (n >= 1) in double, in one fixed order: mean = sum / n; sd the population standard
 * deviation sqrt(sum (x - mean)^2 / n); se the standard error of the mean, sample std (ddof 1) / sqrt(n) (0 when n is
 * 1). The one definition the in-run eval, the step metrics and `vgrpo eval`'s eval.json use. */
void core_mean_sd_se(const double *x, int n, double *mean, double *sd, double *se);

#endif
