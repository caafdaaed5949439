/* tests/wan_test_util.h — helpers shared by the Wan transformer tests: reading fixture tensors, the error
 * measures of docs/design.md section 8 (outputs: max|a-b| / max|b|; gradients: relative L2), and a small random model. */
#ifndef TESTS_WAN_TEST_UTIL_H
#define TESTS_WAN_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/safetensors.h"
#include "tests/test.h"
#include "model/dit/wan_dit.h"

/* Tensor `name` of f as malloc'd float (F32, BF16, F16 or I64 converted); shape into shape[]/ndim when not NULL.
 * NULL when missing. */
static inline float *wt_read(const st_file *f, const char *name, int *ndim, int64_t *shape, int64_t *numel) {
    int i = st_find(f, name);
    if (i < 0) return NULL;
    const st_info *t = st_info_at(f, i);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    if (ndim) *ndim = t->ndim;
    if (shape) memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    if (numel) *numel = n;
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!out) return NULL;
    if (t->dtype == CORE_I64) {
        core_tensor v;
        if (st_get(f, name, &v)) {
            free(out);
            return NULL;
        }
        for (int64_t k = 0; k < n; k++) out[k] = (float)((const int64_t *)v.data)[k];
        core_tensor_free(&v);
        return out;
    }
    if (st_read_f32(f, name, out, n)) {
        free(out);
        return NULL;
    }
    return out;
}

/* max|a-b| / max|b| in double. */
static inline double wt_max_rel(const float *a, const float *b, int64_t n) {
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md || d != d) md = d != d ? INFINITY : d;
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return mb > 0 ? md / mb : md;
}

/* ||a-b||_2 / ||b||_2 in double. */
static inline double wt_l2_rel(const float *a, const float *b, int64_t n) {
    double nd = 0, nb = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        nd += d * d;
        nb += (double)b[i] * b[i];
    }
    return nb > 0 ? sqrt(nd / nb) : sqrt(nd);
}

/* A small config for the model-level tests that need no fixture (2 layers, 4 heads x 8, ffn 48). */
static inline wan_config wt_small_config(int in_ch, int cross_attn_norm) {
    wan_config c = {{1, 2, 2}, 4, 8, in_ch, in_ch, 12, 32, 48, 2, cross_attn_norm, 1e-6, 64};
    return c;
}

/* Randomises every parameter of m (uniform [-a, a) scaled per tensor, norm weights around 1, non-zero tables), so
 * that no term of the model is hidden by a zero. */
static inline void wt_random_params(wan_model *m, unsigned long long seed) {
    for (int i = 0; i < m->layout.count; i++) {
        const wan_tensor *t = &m->layout.tensors[i];
        float *p = m->params + t->offset;
        if (t->ndim >= 2 && !strstr(t->name, "scale_shift_table")) {
            float a = (float)(1.7 / sqrt((double)(t->numel / t->shape[0])));
            test_fill_uniform(p, (size_t)t->numel, seed + (unsigned long long)i, -a, a);
        } else if (strstr(t->name, ".norm") && strstr(t->name, ".weight")) {
            test_fill_uniform(p, (size_t)t->numel, seed + (unsigned long long)i, 0.6f, 1.4f);
        } else {
            test_fill_uniform(p, (size_t)t->numel, seed + (unsigned long long)i, -0.5f, 0.5f);
        }
    }
}

#endif
