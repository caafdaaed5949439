/* sp/shard.c — sequence sharding and gathering of [B, S, W] hidden states; see shard.h. */
#include "sp/shard.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void sp_shard_rows(float *local, const float *full, int B, int S_l, int W, int sp, int sp_rank) {
    const size_t rows = (size_t)S_l * W;
    for (int b = 0; b < B; b++)
        memcpy(local + (size_t)b * rows, full + ((size_t)b * sp + sp_rank) * rows, rows * sizeof(float));
}

int sp_gather_rows(sp_comm *sp, float *full, const float *local, int B, int S_l, int W) {
    const size_t block = (size_t)B * S_l * W, rows = (size_t)S_l * W;
    const int P = sp->size;
    if (P == 1) {
        memmove(full, local, block * sizeof(float));
        return 0;
    }
    float *recv = malloc(block * P * sizeof(float));
    if (!recv)
        return core_error("gather of hidden states on group %s: out of memory (%zu floats)", sp->name, block * P);
    if (sp_comm_all_gather(sp, local, recv, block, SP_F32)) {
        free(recv);
        return core_error_push("gather of hidden states: ");
    }
    /* recv is [P, B, S_l, W]; full is [B, P*S_l, W]. */
    for (int p = 0; p < P; p++)
        for (int b = 0; b < B; b++)
            memcpy(full + ((size_t)b * P + p) * rows, recv + (size_t)p * block + (size_t)b * rows,
                   rows * sizeof(float));
    free(recv);
    return 0;
}

void sp_gather_rows_backward(float *dlocal, const float *dfull, int B, int S_l, int W, int sp, int sp_rank) {
    const size_t rows = (size_t)S_l * W;
    for (int b = 0; b < B; b++) {
        float *d = dlocal + (size_t)b * rows;
        const float *s = dfull + ((size_t)b * sp + sp_rank) * rows;
        for (size_t i = 0; i < rows; i++) d[i] += s[i];
    }
}
