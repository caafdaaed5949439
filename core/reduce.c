/* core/reduce.c — fixed-order fp32 sums (see core/reduce.h for the order).
 *
 * The pairwise tree over chunk sums is evaluated as a binary counter: chunk sums arrive in index order, two
 * partial sums covering equal numbers of chunks are merged (left + right) as soon as both exist, and at the end the
 * remaining partials (sizes = the binary digits of m, largest first) are merged from the right. This gives exactly
 * the level-by-level tree of the header (T(m) = T(2^p) + T(m - 2^p), 2^p the largest power of two below m) while
 * holding O(log m) values, so arbitrarily long inputs need no allocation and the functions cannot fail. */
#include "core/reduce.h"

#include <math.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Chunks computed per parallel batch before they are fed to the counter. */
#define BATCH_CHUNKS 256
/* Fewer chunks than this are summed on the calling thread (a parallel region costs more than ~64k additions). */
#define PARALLEL_MIN_CHUNKS 16

typedef struct {
    float val[64];
    int64_t size[64];
    int top; /* number of entries */
} counter;

static void counter_push(counter *c, float v)
{
    int64_t size = 1;
    while (c->top > 0 && c->size[c->top - 1] == size) {
        c->top--;
        v = c->val[c->top] + v;
        size *= 2;
    }
    c->val[c->top] = v;
    c->size[c->top] = size;
    c->top++;
}

static float counter_finish(const counter *c)
{
    if (c->top == 0) return 0.0f;
    float v = c->val[c->top - 1];
    for (int j = c->top - 2; j >= 0; j--) v = c->val[j] + v;
    return v;
}

float core_reduce_combine(const float *c, int64_t m)
{
    counter k = {.top = 0};
    for (int64_t i = 0; i < m; i++) counter_push(&k, c[i]);
    return counter_finish(&k);
}

float core_reduce_fixed(int64_t n, core_chunk_fn chunk, void *ctx)
{
    if (n <= 0) return 0.0f;
    const int64_t m = (n + CORE_REDUCE_CHUNK - 1) / CORE_REDUCE_CHUNK;
    counter k = {.top = 0};
    float part[BATCH_CHUNKS];
    for (int64_t c0 = 0; c0 < m; c0 += BATCH_CHUNKS) {
        const int nb = (int)(m - c0 < BATCH_CHUNKS ? m - c0 : BATCH_CHUNKS);
#pragma omp parallel for schedule(static) if (nb >= PARALLEL_MIN_CHUNKS)
        for (int j = 0; j < nb; j++) {
            const int64_t b = (c0 + j) * CORE_REDUCE_CHUNK;
            const int64_t e = b + CORE_REDUCE_CHUNK < n ? b + CORE_REDUCE_CHUNK : n;
            part[j] = chunk(ctx, b, e);
        }
        for (int j = 0; j < nb; j++) counter_push(&k, part[j]);
    }
    return counter_finish(&k);
}

typedef struct {
    const float *a, *b;
} pair_ctx;

static float sum_chunk(void *ctx, int64_t begin, int64_t end)
{
    const float *x = ((const pair_ctx *)ctx)->a;
    float acc = 0.0f;
    for (int64_t i = begin; i < end; i++) acc += x[i];
    return acc;
}

static float sq_diff_chunk(void *ctx, int64_t begin, int64_t end)
{
    const pair_ctx *p = ctx;
    float acc = 0.0f;
    for (int64_t i = begin; i < end; i++) {
        const float d = p->a[i] - p->b[i];
        acc += d * d;
    }
    return acc;
}

float core_sum_fixed(const float *x, int64_t n)
{
    pair_ctx p = {x, 0};
    return core_reduce_fixed(n, sum_chunk, &p);
}

float core_sum_sq_diff_fixed(const float *a, const float *b, int64_t n)
{
    pair_ctx p = {a, b};
    return core_reduce_fixed(n, sq_diff_chunk, &p);
}

void core_mean_sd_se(const double *x, int n, double *mean, double *sd, double *se) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += x[i];
    const double m = s / n;
    for (int i = 0; i < n; i++) q += (x[i] - m) * (x[i] - m);
    *mean = m;
    *sd = sqrt(q / n);
    *se = n > 1 ? sqrt(q / (n - 1)) / sqrt((double)n) : 0;
}
