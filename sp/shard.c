/* sp/shard.c — sequence sharding and gathering of [B, S, W] hidden states; see shard.h. */
#include "sp/shard.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/dev_table.h"

/* Element bytes of a view's dtype. */
static size_t esize(kb_dtype t) { return t == KB_BF16 ? 2 : 4; }

int sp_shard_rows_dev(const k_dev_ops *dev, kb_out local, kb_in full, int B, int S_l, int W, int sp, int sp_rank) {
    if (local.t != full.t) return core_error("shard of hidden states: local and full have different dtypes");
    const size_t rows = (size_t)S_l * W * esize(local.t);
    return dev->mem_copy2d(local.p, rows, (const char *)full.p + (size_t)sp_rank * rows, (size_t)sp * rows, rows,
                           (size_t)B);
}

int sp_gather_rows_dev(const k_dev_ops *dev, sp_comm *sp, kb_out full, kb_in local, int B, int S_l, int W) {
    if (local.t != full.t) return core_error("gather of hidden states: local and full have different dtypes");
    const size_t es = esize(local.t), block = (size_t)B * S_l * W * es, rows = (size_t)S_l * W * es;
    const int P = sp->size;
    if (P == 1) return dev->mem_copy2d(full.p, block, local.p, block, block, 1);
    char *recv = dev->mem_alloc(block * P);
    if (!recv)
        return core_error_push("gather of hidden states on group %s: %zu bytes of %s memory: ", sp->name, block * P,
                               dev->name);
    int rc = block % 4 ? sp_comm_all_gather(sp, local.p, recv, block, SP_U8)
                       : sp_comm_all_gather(sp, local.p, recv, block / 4, SP_F32);
    if (rc) {
        dev->mem_free(recv);
        return core_error_push("gather of hidden states: ");
    }
    /* recv is [P, B, S_l, W]; full is [B, P*S_l, W]. */
    for (int p = 0; p < P && !rc; p++)
        rc = dev->mem_copy2d((char *)full.p + (size_t)p * rows, (size_t)P * rows, recv + (size_t)p * block, rows, rows,
                             (size_t)B);
    dev->mem_free(recv);
    return rc;
}

int sp_gather_rows_backward_dev(const k_dev_ops *dev, kb_out dlocal, kb_in dfull, int B, int S_l, int W, int sp,
                                int sp_rank) {
    const size_t rows = (size_t)S_l * W;
    for (int b = 0; b < B; b++) {
        kb_out d = {(char *)dlocal.p + (size_t)b * rows * esize(dlocal.t), dlocal.t};
        kb_in s = {(const char *)dfull.p + ((size_t)b * sp + sp_rank) * rows * esize(dfull.t), dfull.t};
        if (dev->add(d, s, (int64_t)rows)) return -1;
    }
    return 0;
}

void sp_shard_rows(float *local, const float *full, int B, int S_l, int W, int sp, int sp_rank) {
    sp_shard_rows_dev(&k_cpu_dev_ops, kb_out_f32(local), kb_in_f32(full), B, S_l, W, sp, sp_rank);
}

int sp_gather_rows(sp_comm *sp, float *full, const float *local, int B, int S_l, int W) {
    return sp_gather_rows_dev(&k_cpu_dev_ops, sp, kb_out_f32(full), kb_in_f32(local), B, S_l, W);
}

void sp_gather_rows_backward(float *dlocal, const float *dfull, int B, int S_l, int W, int sp, int sp_rank) {
    sp_gather_rows_backward_dev(&k_cpu_dev_ops, kb_out_f32(dlocal), kb_in_f32(dfull), B, S_l, W, sp, sp_rank);
}
