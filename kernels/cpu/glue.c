/* kernels/cpu/glue.c — the small fp32 loops the Wan DiT needs beside the kernel table (cpu.h: k_cpu_colsum_acc,
 * k_cpu_add_table, k_cpu_add_table_bwd, k_cpu_axpy1): the fixed-order column sum of the bias gradients, the
 * modulation table plus the embedding rows and its backward, y += x. The CPU device table (dev_table.c) is their
 * caller; the element-wise arithmetic is kernels/body/kb_modulate.h's on the device (same order of operations). */
#include "kernels/cpu/cpu.h"

void k_cpu_colsum_acc(float *db, const float *dy, int64_t M, int N, int64_t ld) {
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

void k_cpu_add_table(float *out, const float *table, const float *src, int R, int nj, int D, int src_nj) {
#pragma omp parallel for schedule(static) if ((size_t)R * nj * D >= K_PAR_MIN_ELEMS)
    for (int r = 0; r < R; r++)
        for (int j = 0; j < nj; j++) {
            float *o = out + ((int64_t)r * nj + j) * D;
            const float *s = src + ((int64_t)r * src_nj + (src_nj == 1 ? 0 : j)) * D;
            const float *tb = table + (int64_t)j * D;
            for (int d = 0; d < D; d++) o[d] = tb[d] + s[d];
        }
}

void k_cpu_add_table_bwd(float *dtable, float *dsrc, const float *dmod, int R, int nj, int D, int src_nj) {
    if (dtable) k_cpu_colsum_acc(dtable, dmod, R, nj * D, (int64_t)nj * D);
    if (!dsrc) return;
    if (src_nj == nj) {
        k_cpu_axpy1(dsrc, dmod, (int64_t)R * nj * D);
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

void k_cpu_axpy1(float *y, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if ((size_t)n >= K_PAR_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}
