/* sp/check/check_nccl.c — the GPU check's "nccl" group (kernels/cuda/check/check.h): the NCCL comm with one rank
 * (sp/comm_nccl.h) on device buffers, on the kernels' stream, and the exact reduction's rank-order block sum
 * (kernels/cuda/kern_blocksum.cu) against its body run on the host. Registered from a constructor (check.h: kernels/
 * may not call into sp/); linked into gpu_check and gpu_check_emu.
 *
 * Rows:
 *   nccl library       which libnccl.so.2 was loaded and its version (info); a skip, saying why, where NCCL is not
 *                      found ($VGRPO_NCCL_LIB; scripts/gpu_check.sh looks in PyTorch's nvidia-nccl wheel, the CUDA
 *                      toolkit and the ldconfig cache)
 *   nccl block_sum     k_dev_ops.block_sum over 4 blocks of 1 Mi floats (and one of 1) vs kb_blocksum_at on the host:
 *                      exact (needs no NCCL)
 *   nccl exact ...     every operation of the table over one rank with the exact reduction (all-to-all, sendrecv,
 *                      all-gather, broadcast, reduce-scatter, all-reduce out of place and in place in 3 rounds, the
 *                      ranges collectives, a split, the barrier); nccl native ...: with NCCL's own reduction
 *                      (parallel.reduce nccl: all-reduce, reduce-scatter);
 *                      with one rank each is a copy or the identity, so the result must equal the input exactly.
 * With one rank NCCL copies within the GPU; what several GPUs add (the transport, the rank-order sums across ranks) is
 * checked on the CPU over the fake NCCL (tests/test_nccl.c) and needs a multi-GPU machine to run for real. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/body/kb_blocksum.h"
#include "kernels/cuda/check/check.h"
#include "kernels/cuda/check/check_util.h"
#include "kernels/cuda/k_cuda.h"
#include "sp/comm_nccl.h"

static void block_sum_row(const ck_shapes *s) {
    enum { NB = 4 };
    const int64_t n = 1 << 20, stride = n + 37;
    float *h = ck_floats((size_t)(NB * stride)), *ref = ck_floats((size_t)n), *got = ck_floats((size_t)n);
    ck_fill(h, (size_t)(NB * stride), s->seed + 901, -2e3f, 2e3f, 0);
    for (int64_t i = 0; i < n; i++) ref[i] = kb_blocksum_at(h, NB, stride, i);
    float *db = k_cuda_ops.mem_alloc(sizeof(float) * (size_t)(NB * stride)), *dout = k_cuda_ops.mem_alloc(sizeof(float) * (size_t)n);
    if (!db || !dout || k_cuda_ops.mem_upload(db, h, sizeof(float) * (size_t)(NB * stride)) ||
        k_cuda_ops.block_sum(dout, db, NB, stride, n) || k_cuda_ops.mem_download(got, dout, sizeof(float) * (size_t)n)) {
        ck_row_error("nccl block_sum", "4 x 1 Mi", core_last_error());
    } else {
        ck_row("nccl block_sum", "4 x 1 Mi", 0, got, ref, (size_t)n, CK_EXACT, 0.0, -1, "rank order, vs the body");
        for (int64_t i = 0; i < n; i++) ref[i] = h[i];
        if (k_cuda_ops.block_sum(dout, db, 1, stride, n) || k_cuda_ops.mem_download(got, dout, sizeof(float) * (size_t)n))
            ck_row_error("nccl block_sum one block", "1 Mi", core_last_error());
        else
            ck_row("nccl block_sum one block", "1 Mi", 0, got, ref, (size_t)n, CK_EXACT, 0.0, -1, "a copy");
    }
    if (db) k_cuda_ops.mem_free(db);
    if (dout) k_cuda_ops.mem_free(dout);
    free(h), free(ref), free(got);
}

/* One operation of the one-rank group: run (0 or -1), then the device output compared with the expected host values. */
static void op_row(const char *name, const char *shape, int rc, const float *dev_out, const float *want, size_t n) {
    float *got = ck_floats(n);
    if (rc || k_cuda_ops.mem_sync() || k_cuda_ops.mem_download(got, dev_out, sizeof(float) * n))
        ck_row_error(name, shape, core_last_error());
    else
        ck_row(name, shape, 0, got, want, n, CK_EXACT, 0.0, -1, NULL);
    free(got);
}

static void one_rank_rows(sp_reduce_mode mode) {
    const size_t n = 3u << 20; /* 3 Mi floats: with piece 1 Mi, the exact reduction's 3 rounds */
    const char *tag = mode == SP_REDUCE_EXACT ? "exact" : "native";
    char name[96];
    sp_comm *host = sp_comm_self("host"), *g = NULL;
    sp_nccl_opts o = {.stream = k_cuda_stream(), .dev = &k_cuda_ops, .reduce = mode, .piece = 1 << 20};
    if (!host || sp_comm_nccl_world(host, &o, &g)) {
        snprintf(name, sizeof name, "nccl %s world", tag);
        ck_row_error(name, "", core_last_error());
        sp_comm_destroy(host);
        return;
    }
    float *x = ck_floats(n);
    ck_fill(x, n, 77, -3.0f, 3.0f, 0);
    float *a = k_cuda_ops.mem_alloc(sizeof(float) * n), *b = k_cuda_ops.mem_alloc(sizeof(float) * n);
    if (!a || !b || k_cuda_ops.mem_upload(a, x, sizeof(float) * n)) {
        ck_row_error("nccl buffers", "3 Mi", core_last_error());
        goto done;
    }
#define ROW(label, call, out)                                                                                       \
    do {                                                                                                            \
        k_cuda_ops.mem_zero(b, sizeof(float) * n);                                                                  \
        snprintf(name, sizeof name, "nccl %s %s", tag, label);                                             \
        op_row(name, "3 Mi fp32", (call), (out), x, n);                                                             \
    } while (0)
    ROW("all_reduce", sp_comm_all_reduce(g, a, b, n, SP_F32), b);
    ROW("reduce_scatter", sp_comm_reduce_scatter(g, a, b, n, SP_F32), b);
    if (mode == SP_REDUCE_EXACT) {
        ROW("all_to_all", sp_comm_all_to_all(g, a, b, n, SP_F32), b);
        ROW("sendrecv", sp_comm_sendrecv(g, a, n, 0, b, n, 0, SP_F32), b);
        ROW("all_gather", sp_comm_all_gather(g, a, b, n, SP_F32), b);
        ROW("all_reduce in place", sp_comm_all_reduce(g, a, a, n, SP_F32), a);
        ROW("broadcast", sp_comm_broadcast(g, a, n, SP_F32, 0), a);
        int64_t offs[2] = {0, (int64_t)n};
        ROW("gather_ranges", sp_comm_gather_ranges(g, a, b, offs, SP_F32, 0), b);
        ROW("all_reduce_ordered", sp_comm_all_reduce_ordered(g, a, (int64_t)n), a);
        sp_comm *s = NULL;
        const int rc = sp_comm_split(g, 0, 0, "split", &s);
        ROW("split all_gather", rc ? rc : sp_comm_all_gather(s, a, b, n, SP_F32), b);
        sp_comm_destroy(s);
        snprintf(name, sizeof name, "nccl %s barrier", tag);
        if (sp_comm_barrier(g))
            ck_row_error(name, "", core_last_error());
        else
            ck_row_info(name, "", "returned");
    }
#undef ROW
done:
    if (a) k_cuda_ops.mem_free(a);
    if (b) k_cuda_ops.mem_free(b);
    free(x);
    sp_comm_destroy(g);
    sp_comm_destroy(host);
}

static void check_nccl(const ck_shapes *s, const char *only) {
    if (ck_selected("nccl block_sum", only)) block_sum_row(s);
    const int exact = ck_selected("nccl exact", only), native = ck_selected("nccl native", only);
    if (!exact && !native && !ck_selected("nccl library", only)) return;
    if (sp_nccl_load()) {
        ck_row_skip("nccl library", "", core_last_error());
        return;
    }
    char txt[700];
    snprintf(txt, sizeof txt, "NCCL %d from %s", sp_nccl_version(), sp_nccl_lib_path());
    ck_row_info("nccl library", "", txt);
    if (exact) one_rank_rows(SP_REDUCE_EXACT);
    if (native) one_rank_rows(SP_REDUCE_NCCL);
}

__attribute__((constructor)) static void register_check_nccl(void) { ck_register_part("nccl", check_nccl); }
