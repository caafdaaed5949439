/* kernels/cuda/kern_blocksum.cu — the exact gradient reduction's rank-order sum (k_dev_ops.block_sum; body and order:
 * kernels/body/kb_blocksum.h): one thread per element adds the nb blocks in rank order, so the bits do not depend on
 * the launch geometry. 64-bit indices (a gradient bucket may exceed 2^31 elements). Runs on kc_stream, after the
 * NCCL exchange that sp/comm_nccl.c enqueued on the same stream. */
#include "kernels/body/kb_blocksum.h"
#include "kernels/cuda/kern_common.cuh"

__global__ void block_sum_kernel(float *out, const float *blocks, int nb, int64_t stride, int64_t n) {
    KC_FOR(i, n) out[i] = kb_blocksum_at(blocks, nb, stride, (int64_t)i);
}

extern "C" int kc_block_sum(float *out, const float *blocks, int nb, int64_t stride, int64_t n) {
    if (nb < 1 || n < 0 || stride < n)
        return core_error("block_sum: nb %d, stride %lld, n %lld", nb, (long long)stride, (long long)n);
    if (!n) return 0;
    block_sum_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(out, blocks, nb, stride, n);
    return kc_launched("block_sum");
}
