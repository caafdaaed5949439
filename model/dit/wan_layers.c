/* model/dit/wan_layers.c — small layers the Wan transformer needs beyond the kernel table: nn.Linear forward and
 * backward on top of ops->gemm, fixed-order column sums (bias gradients), diffusers' sinusoidal timestep
 * features and the scale_shift_table + embedding additions. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "model/dit/wan_internal.h"

void wan_linear_fwd(const k_ops *ops, float *y, const float *x, const float *w, const float *b, int M, int N, int K) {
    ops->gemm(0, 1, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N, b);
}

void wan_linear_bwd(const k_ops *ops, float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                    int M, int N, int K) {
    if (dx) ops->gemm(0, 0, M, K, N, 1.0f, dy, N, w, K, 1.0f, dx, K, NULL);
    if (dw) ops->gemm(1, 0, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw, K, NULL);
    if (db) wan_colsum_acc(db, dy, M, N, N);
}

void wan_colsum_acc(float *db, const float *dy, int64_t M, int N, int64_t ld) {
    enum { CHUNK = 64 };
    const int nchunks = (N + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if ((size_t)M * (size_t)N >= K_PAR_MIN_ELEMS)
    for (int c = 0; c < nchunks; c++) {
        const int n0 = c * CHUNK, n1 = n0 + CHUNK < N ? n0 + CHUNK : N;
        float acc[CHUNK];
        for (int n = n0; n < n1; n++) acc[n - n0] = 0.0f;
        for (int64_t m = 0; m < M; m++) {
            const float *row = dy + m * ld;
            for (int n = n0; n < n1; n++) acc[n - n0] += row[n];
        }
        for (int n = n0; n < n1; n++) db[n] += acc[n - n0];
    }
}

void wan_timestep_features(float *out, const float *t, int R, int dim) {
    const int half = dim / 2;
    /* exponent = (-ln(10000) as fp32) * i, then / half, each rounded to fp32; exp rounded once from double. */
    const float neg_log = (float)(-log(10000.0));
    float freq[half > 0 ? half : 1];
    for (int i = 0; i < half; i++) {
        float e = neg_log * (float)i;
        e = e / (float)half;
        freq[i] = (float)exp((double)e);
    }
    for (int r = 0; r < R; r++) {
        float *o = out + (int64_t)r * dim;
        for (int i = 0; i < half; i++) {
            const float a = t[r] * freq[i];
            o[i] = (float)cos((double)a);
            o[half + i] = (float)sin((double)a);
        }
        if (dim % 2) o[dim - 1] = 0.0f;
    }
}

void wan_add_table(float *out, const float *table, const float *src, int R, int nj, int D, int src_nj) {
#pragma omp parallel for schedule(static) if ((size_t)R * nj * D >= K_PAR_MIN_ELEMS)
    for (int r = 0; r < R; r++)
        for (int j = 0; j < nj; j++) {
            float *o = out + ((int64_t)r * nj + j) * D;
            const float *s = src + ((int64_t)r * src_nj + (src_nj == 1 ? 0 : j)) * D;
            const float *tb = table + (int64_t)j * D;
            for (int d = 0; d < D; d++) o[d] = tb[d] + s[d];
        }
}

void wan_add_table_bwd(float *dtable, float *dsrc, const float *dmod, int R, int nj, int D, int src_nj) {
    if (dtable) wan_colsum_acc(dtable, dmod, R, nj * D, (int64_t)nj * D);
    if (!dsrc) return;
    if (src_nj == nj) {
        wan_axpy1(dsrc, dmod, (int64_t)R * nj * D);
        return;
    }
#pragma omp parallel for schedule(static) if ((size_t)R * nj * D >= K_PAR_MIN_ELEMS)
    for (int r = 0; r < R; r++)
        for (int j = 0; j < nj; j++) {
            const float *g = dmod + ((int64_t)r * nj + j) * D;
            float *d = dsrc + (int64_t)r * D;
            for (int k = 0; k < D; k++) d[k] += g[k];
        }
}

void wan_axpy1(float *y, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if ((size_t)n >= K_PAR_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}
