/* kernels/body/kb_t5.h — the umT5 encoder's device arithmetic (model/text/umt5.c on a device table): T5 self-
 * attention (no 1/sqrt(d) scale, a relative position bias per head, padded keys left out) and the gated-GELU product
 * of T5's feed-forward, per work item, with the host drivers the emulated device runs.
 *
 * Attention, one query row (b, h, i) per work item (the CUDA kernel: one block per row, kernels/cuda/kern_t5.cu):
 *   s_j = kb_t5_score: the fp32 sum over d in order of the rounded products q_i[d] k_j[d], then + bias(j - i)
 *         (the CPU's score chain, kernels/cpu/t5_attention.c, bit for bit on fp32 operands);
 *   mx  = max of s_j over the kept keys (order-free);
 *   p_j = kb_expf(s_j - mx) in fp32 (kb_act.h's exp: the same bits on the CPU and the GPU), 0 for a padded key;
 *   sum = the fp32 sum of p_j in key order (one thread on the GPU: S adds, cheap next to S x Dk products);
 *   o_i[d] = kb_t5_column / sum: the fp32 sum over the kept keys in order of p_j v_j[d]; a row with no kept key
 *         gets zeros.
 * So the emulated device and the CUDA kernel compute the same bits (no atomics, no tree whose shape depends on the
 * launch). The CPU's fp32 path keeps its double softmax (exp from libm, double sums): the device's fp32 softmax
 * differs from it by rounding only, well inside bf16's (tests/test_umt5_dev.c).
 * Reference: transformers models/umt5/modeling_umt5.py, UMT5Attention (encoder) and UMT5DenseGatedActDense. */
#ifndef KERNELS_BODY_KB_T5_H
#define KERNELS_BODY_KB_T5_H

#include "kernels/body/kb_act.h"
#include "kernels/body/kb_base.h"

/* Score of query row qo and key row ko (element offsets of their head's first column): fp32 products and sums in
 * order of d, starting from 0, then + bias. */
KB_FN float kb_t5_score(kb_in q, size_t qo, kb_in k, size_t ko, int Dk, float bias) {
    float s = 0.0f;
    for (int d = 0; d < Dk; d++) s += kb_get(q, qo + d) * kb_get(k, ko + d);
    return s + bias;
}

/* sum over the kept keys j < S (m NULL: all) in order of p[j] * v[vo + j * vstride], fp32. */
KB_FN float kb_t5_column(const float *p, const int32_t *m, kb_in v, size_t vo, size_t vstride, int S) {
    float a = 0.0f;
    for (int j = 0; j < S; j++)
        if (!m || m[j]) a += p[j] * kb_get(v, vo + (size_t)j * vstride);
    return a;
}

/* T5's gated GELU, one element: gelu_tanh(a0) rounded to fp32, times a1 (the CPU's gelu_forward then *=). */
KB_FN float kb_t5_gated_gelu(float a0, float a1) { return kb_gelu_fwd(a0) * a1; }

/* One query row's softmax weights: sc[j] = s_j, then p[j] in place; returns the sum (0: no kept key). The host
 * driver and the CUDA kernel's first thread run it. */
KB_FN float kb_t5_row_probs(float *sc, const int32_t *m, int S) {
    float mx = -INFINITY;
    for (int j = 0; j < S; j++)
        if ((!m || m[j]) && sc[j] > mx) mx = sc[j];
    float sum = 0.0f;
    for (int j = 0; j < S; j++) {
        sc[j] = (!m || m[j]) ? kb_expf(sc[j] - mx) : 0.0f;
        sum += sc[j];
    }
    return sum;
}

/* ---- host drivers (the emulated device): the decomposition of the CUDA kernels, one work item after another ---- */
#ifndef __CUDACC__
/* o [B, S, H*Dk] = T5 attention of q, k, v [B, S, H*Dk] (typed views); rel_bias [buckets, H] fp32; bucket_of[2S-1]
 * (bucket of relative position j - i at index j - i + S - 1); mask [B, S] (NULL: none); sc: S floats of scratch. */
static inline void kbh_t5_attention(kb_out o, kb_in q, kb_in k, kb_in v, const float *rel_bias, const int *bucket_of,
                                    const int32_t *mask, int B, int S, int H, int Dk, float *sc) {
    const size_t I = (size_t)H * Dk;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const int32_t *m = mask ? mask + (size_t)b * S : NULL;
                const size_t qo = ((size_t)b * S + i) * I + (size_t)h * Dk;
                for (int j = 0; j < S; j++)
                    sc[j] = kb_t5_score(q, qo, k, ((size_t)b * S + j) * I + (size_t)h * Dk, Dk,
                                        rel_bias[(size_t)bucket_of[j - i + S - 1] * H + h]);
                const float sum = kb_t5_row_probs(sc, m, S);
                for (int d = 0; d < Dk; d++) {
                    const float a = kb_t5_column(sc, m, v, (size_t)b * S * I + (size_t)h * Dk + d, I, S);
                    kb_set(o, qo + d, sum > 0.0f ? a / sum : 0.0f);
                }
            }
}

/* g[i] = kb_t5_gated_gelu(a0[i], a1[i]), i < n (g may be a0). */
static inline void kbh_t5_gated_gelu(kb_out g, kb_in a0, kb_in a1, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        kb_set(g, (size_t)i, kb_t5_gated_gelu(kb_get(a0, (size_t)i), kb_get(a1, (size_t)i)));
}
#endif

#endif
