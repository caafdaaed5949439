/* kernels/cuda/kern_sync.cu — the weight sync's device-to-device path (k_dev_ops.mem_round_bf16): a rollout worker's
 * bf16 weights from the fp32 bytes it copied out of the trainer's exported buffer (rollout/worker_ipc.c), rounded to
 * nearest even by kb_bf16_from_f32 (kernels/body/kb_base.h), the function mem_upload_bf16 rounds with on the host, so
 * the two paths give the same bits. One thread per element; 64-bit indices. Runs on kc_stream. */
#include "kernels/cuda/kern_common.cuh"

__global__ void round_bf16_kernel(kb_bf16 *dst, const float *src, int64_t n) {
    KC_FOR(i, n) dst[i] = kb_bf16_from_f32(src[i]);
}

extern "C" int kc_round_bf16(kb_bf16 *dst, const float *src, int64_t n) {
    if (n < 0) return core_error("mem_round_bf16: n %lld", (long long)n);
    if (!n) return 0;
    round_bf16_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(dst, src, n);
    return kc_launched("mem_round_bf16");
}
