/* kernels/body/kb_blocksum.h — the rank-order sum of a gradient reduction: out[i] = ((b_0[i] + b_1[i]) + b_2[i])
 * + ... + b_{nb-1}[i] in fp32, b_r being block r of `blocks` (rank r's values of this rank's range, as an
 * all-to-all delivers them). It is the arithmetic of sp_comm_reduce_scatter_ranges (sp/comm_ranges.c) element by
 * element: the sum starts from b_0 itself (not 0 + b_0, which would turn -0 into +0) and adds the blocks in
 * increasing r, so a reduction done as all-to-all + this body gives the same bits as the host path, whatever the
 * rank count's grouping inside a collective library would have been. One thread per element on the GPU
 * (kernels/cuda/kern_blocksum.cu), a loop on the emulated device (kernels/cuda/emu/emu_ops.c) and on the CPU table
 * (kernels/cpu/dev_table.c). */
#ifndef KERNELS_BODY_KB_BLOCKSUM_H
#define KERNELS_BODY_KB_BLOCKSUM_H

#include <stdint.h>

#include "kernels/body/kb_base.h"

/* Element i of the rank-order sum: blocks holds nb blocks, block r starting at blocks + r * stride (nb >= 1). */
KB_FN float kb_blocksum_at(const float *blocks, int nb, int64_t stride, int64_t i) {
    float s = blocks[i];
    for (int r = 1; r < nb; r++) s = s + blocks[(int64_t)r * stride + i];
    return s;
}

#endif
