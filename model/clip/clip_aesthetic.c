/* model/clip/clip_aesthetic.c — the LAION aesthetic predictor's MLP (see clip_aesthetic.h). */
#include "model/clip/clip_aesthetic.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "kernels/kernels.h"

#define AE_MAX_LAYERS 16
#define AE_MAX_INDEX 64 /* layers.<i> indices searched: 0 .. AE_MAX_INDEX - 1 */

struct clip_aesthetic {
    int n;                    /* Linear layers */
    int in[AE_MAX_LAYERS], out[AE_MAX_LAYERS];
    float *w[AE_MAX_LAYERS];  /* [out, in] */
    float *b[AE_MAX_LAYERS];  /* [out] */
    int widest;               /* the largest width, for the activations */
};

void clip_aesthetic_free(clip_aesthetic *a) {
    if (!a) return;
    for (int i = 0; i < a->n; i++) free(a->w[i]), free(a->b[i]);
    free(a);
}

int clip_aesthetic_dim(const clip_aesthetic *a) { return a->in[0]; }

clip_aesthetic *clip_aesthetic_load(const char *path) {
    clip_aesthetic *a = calloc(1, sizeof *a);
    st_file *f = st_open(path);
    if (!a || !f) goto fail;
    char wn[64], bn[64];
    for (int i = 0; i < AE_MAX_INDEX; i++) {
        snprintf(wn, sizeof wn, "layers.%d.weight", i);
        snprintf(bn, sizeof bn, "layers.%d.bias", i);
        int wi = st_find(f, wn);
        if (wi < 0) continue;
        const st_info *w = st_info_at(f, wi);
        if (a->n == AE_MAX_LAYERS) {
            core_error("%s: more than %d Linear layers", path, AE_MAX_LAYERS);
            goto fail;
        }
        if (w->ndim != 2 || w->shape[0] < 1 || w->shape[1] < 1 || w->shape[0] > 1 << 20 || w->shape[1] > 1 << 20) {
            core_error("%s: tensor \"%s\" is not a [out, in] matrix", path, wn);
            goto fail;
        }
        const int out = (int)w->shape[0], in = (int)w->shape[1];
        if (a->n > 0 && in != a->out[a->n - 1]) {
            core_error("%s: tensor \"%s\" has shape [%d, %d]; the previous layer gives %d inputs ([%d, %d] expected)",
                       path, wn, out, in, a->out[a->n - 1], out, a->out[a->n - 1]);
            goto fail;
        }
        int k = a->n;
        a->in[k] = in, a->out[k] = out;
        a->w[k] = malloc((size_t)out * in * sizeof(float));
        a->b[k] = malloc((size_t)out * sizeof(float));
        a->n++;
        if (!a->w[k] || !a->b[k]) {
            core_error("clip_aesthetic: out of memory");
            goto fail;
        }
        if (st_read_f32(f, wn, a->w[k], (int64_t)out * in) || st_read_f32(f, bn, a->b[k], out)) goto fail;
        if (in > a->widest) a->widest = in;
        if (out > a->widest) a->widest = out;
    }
    if (a->n == 0) {
        core_error("%s: no tensor layers.<i>.weight (an aesthetic predictor MLP state_dict)", path);
        goto fail;
    }
    if (a->out[a->n - 1] != 1) {
        core_error("%s: the last layer has %d outputs; 1 expected (a score)", path, a->out[a->n - 1]);
        goto fail;
    }
    st_close(f);
    return a;
fail:
    core_error_push("loading the aesthetic predictor: ");
    st_close(f);
    clip_aesthetic_free(a);
    return NULL;
}

int clip_aesthetic_score(const clip_aesthetic *a, const float *embeds, int B, float *scores) {
    if (B < 1) return core_error("clip_aesthetic_score: batch %d < 1", B);
    float *x = malloc((size_t)B * a->widest * 2 * sizeof(float));
    if (!x) return core_error("clip_aesthetic_score: out of memory");
    float *y = x + (size_t)B * a->widest;
    const int D = a->in[0];
    for (int b = 0; b < B; b++) {
        double n2 = 0;
        for (int d = 0; d < D; d++) n2 += (double)embeds[(size_t)b * D + d] * embeds[(size_t)b * D + d];
        const double n = n2 > 0 ? sqrt(n2) : 1;
        for (int d = 0; d < D; d++) x[(size_t)b * D + d] = (float)(embeds[(size_t)b * D + d] / n);
    }
    for (int l = 0; l < a->n; l++) {
        k_cpu_ops.gemm(0, 1, B, a->out[l], a->in[l], 1.0f, x, a->in[l], a->w[l], a->in[l], 0.0f, y, a->out[l],
                       a->b[l]);
        float *t = x;
        x = y, y = t;
    }
    for (int b = 0; b < B; b++) scores[b] = x[b];
    free(x < y ? x : y);
    return 0;
}
