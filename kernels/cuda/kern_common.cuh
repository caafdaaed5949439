/* kernels/cuda/kern_common.cuh — what the kernel files (kern_*.cu) share: launch geometry and the check after a
 * launch. Every kernel is a grid-stride loop over its work items (elements, pairs, rows, columns, chunks), each item
 * handled by one thread (or, for norm rows, one group of 16 lanes) calling a body of kernels/body/. */
#ifndef KERNELS_CUDA_KERN_COMMON_CUH
#define KERNELS_CUDA_KERN_COMMON_CUH

#include <cuda_runtime.h>

#include "kernels/cuda/internal.h"

extern "C" {
#include "core/error.h"
}

#define KC_THREADS 256

/* Blocks for n work items of one thread each: enough to fill the device a few times over, at least 1. */
static inline unsigned kc_blocks(size_t n) {
    size_t b = (n + KC_THREADS - 1) / KC_THREADS;
    size_t cap = (size_t)(kc_sm_count > 0 ? kc_sm_count : 132) * 16;
    if (b > cap) b = cap;
    return b < 1 ? 1u : (unsigned)b;
}

/* The grid-stride loop over i in [0, n). */
#define KC_FOR(i, n)                                                                                           \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)(n); i += (size_t)gridDim.x * blockDim.x)

#endif
