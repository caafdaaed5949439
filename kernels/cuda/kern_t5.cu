/* kernels/cuda/kern_t5.cu — the umT5 encoder's kernels (k_dev_ops.t5_attention, t5_gated_gelu; bodies and order:
 * kernels/body/kb_t5.h). Attention: one block of KC_T5_THREADS threads per query row (b, h, i), grid-stride over the
 * B * H * S rows; the threads compute the row's S scores into shared memory (one key each, kb_t5_score), the first
 * thread turns them into the softmax weights and their sum in key order (kb_t5_row_probs), then the threads compute
 * the Dk output columns (one each, kb_t5_column over the keys in order). Every value is a fixed sequential chain, so
 * the bits do not depend on the launch geometry and equal the emulated device's (kb_host-style driver in kb_t5.h).
 * Gated GELU: one thread per element. Compiled with -fmad=false as the other kernels; nothing here has run on a GPU
 * yet (scripts/gpu_check.sh's umt5 row is its first check). */
#include "kernels/body/kb_t5.h"
#include "kernels/cuda/kern_common.cuh"
#include "kernels/cuda/precond/kc_precond.h"

#define KC_T5_THREADS 128

__global__ void t5_attention_kernel(kb_out o, kb_in q, kb_in k, kb_in v, const float *rel_bias, const int *bucket_of,
                                    const int32_t *mask, int B, int S, int H, int Dk) {
    extern __shared__ float sc[]; /* [S] scores, then weights */
    __shared__ float sum;
    const size_t I = (size_t)H * Dk, rows = (size_t)B * H * S;
    for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int i = (int)(r % (size_t)S), h = (int)((r / (size_t)S) % (size_t)H), b = (int)(r / ((size_t)S * H));
        const int32_t *m = mask ? mask + (size_t)b * S : NULL;
        const size_t qo = ((size_t)b * S + i) * I + (size_t)h * Dk;
        for (int j = threadIdx.x; j < S; j += blockDim.x)
            sc[j] = kb_t5_score(q, qo, k, ((size_t)b * S + j) * I + (size_t)h * Dk, Dk,
                                rel_bias[(size_t)bucket_of[j - i + S - 1] * H + h]);
        __syncthreads();
        if (threadIdx.x == 0) sum = kb_t5_row_probs(sc, m, S);
        __syncthreads();
        for (int d = threadIdx.x; d < Dk; d += blockDim.x) {
            const float a = kb_t5_column(sc, m, v, (size_t)b * S * I + (size_t)h * Dk + d, I, S);
            kb_set(o, qo + d, sum > 0.0f ? a / sum : 0.0f);
        }
        __syncthreads();
    }
}

extern "C" int kc_t5_attention(kb_out o, kb_in q, kb_in k, kb_in v, const float *rel_bias, const int *bucket_of,
                               const int32_t *mask, int B, int S, int H, int Dk) {
    if (kc_precond_t5_attention(o, q, k, v, rel_bias, bucket_of, B, S, H, Dk)) return -1;
    const size_t rows = (size_t)B * H * S, cap = (size_t)(kc_sm_count > 0 ? kc_sm_count : 132) * 32;
    const unsigned blocks = (unsigned)(rows < cap ? rows : cap);
    t5_attention_kernel<<<blocks, KC_T5_THREADS, (size_t)S * sizeof(float), kc_stream>>>(o, q, k, v, rel_bias,
                                                                                         bucket_of, mask, B, S, H, Dk);
    return kc_launched("t5_attention");
}

__global__ void t5_gated_gelu_kernel(kb_out g, kb_in a0, kb_in a1, int64_t n) {
    KC_FOR(i, n) kb_set(g, i, kb_t5_gated_gelu(kb_get(a0, i), kb_get(a1, i)));
}

extern "C" int kc_t5_gated_gelu(kb_out g, kb_in a0, kb_in a1, int64_t n) {
    if (n < 0) return core_error("t5_gated_gelu: n = %lld must be >= 0", (long long)n);
    if (kc_precond_index32("t5_gated_gelu", (size_t)n)) return -1;
    if (!n) return 0;
    t5_gated_gelu_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(g, a0, a1, n);
    return kc_launched("t5_gated_gelu");
}
