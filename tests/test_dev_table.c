/* tests/test_dev_table.c — the fp32 CPU backend behind the device table (kernels/cpu/dev_table.h): its entries make
 * the k_cpu_ops calls the CPU model made before the table, bit for bit (the linear's backward: the GEMM, then the
 * fixed-order column sum of dY; y += x; the modulation table's backward), and refuse what the CPU table does not
 * hold (a bf16 view, a GELU epilogue, bf16 transfers), naming the entry and the argument. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dev_table.h"
#include "tests/test.h"

static void fill(float *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u + seed * 40503u) % 2000) * 1e-3f - 1.0f;
}

/* dW[N, K] += dY^T X with dbias[N] += column sums of dY (dY [M, N]): the weight-gradient GEMM of nn.Linear. */
TEST(dev_table_cpu_bgrad_is_gemm_then_colsum) {
    enum { M = 37, N = 24, K = 16 };
    float dy[M * N], x[M * K], dw[N * K], db[N], dw_ref[N * K], db_ref[N];
    fill(dy, M * N, 1), fill(x, M * K, 2), fill(dw, N * K, 3), fill(db, N, 4);
    memcpy(dw_ref, dw, sizeof dw), memcpy(db_ref, db, sizeof db);
    k_gemm_args g = {0};
    g.transA = 1, g.transB = 0, g.M = N, g.N = K, g.K = M, g.alpha = 1.0f, g.beta = 1.0f;
    g.A = kb_in_f32(dy), g.lda = N, g.B = kb_in_f32(x), g.ldb = K, g.C = kb_out_f32(dw), g.ldc = K;
    g.epi = K_EPI_BGRAD_A, g.dbias = db;
    REQUIRE(k_cpu_dev_ops.gemm(&g) == 0);
    k_cpu_ops.gemm(1, 0, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw_ref, K, NULL);
    k_cpu_colsum_acc(db_ref, dy, M, N, N);
    CHECK(memcmp(dw, dw_ref, sizeof dw) == 0);
    CHECK(memcmp(db, db_ref, sizeof db) == 0);
    /* the bias sum in row order: db[n] gained sum_m dy[m, n] accumulated in fp32 from 0 */
    float acc = 0.0f, start[N];
    for (int m = 0; m < M; m++) acc += dy[m * N + 5];
    fill(start, N, 4);
    CHECK(db[5] == start[5] + acc);
}

/* Forward with the bias epilogue = k_cpu_gemm with its bias; add = y += x; the table's add and its backward. */
TEST(dev_table_cpu_entries_match_cpu_ops) {
    enum { M = 9, N = 16, K = 8, R = 3, NJ = 6, D = 8 };
    float x[M * K], w[N * K], b[N], y[M * N], y_ref[M * N];
    fill(x, M * K, 5), fill(w, N * K, 6), fill(b, N, 7);
    k_gemm_args g = {0};
    g.transA = 0, g.transB = 1, g.M = M, g.N = N, g.K = K, g.alpha = 1.0f, g.beta = 0.0f;
    g.A = kb_in_f32(x), g.lda = K, g.B = kb_in_f32(w), g.ldb = K, g.C = kb_out_f32(y), g.ldc = N;
    g.epi = K_EPI_BIAS, g.bias = b;
    REQUIRE(k_cpu_dev_ops.gemm(&g) == 0);
    k_cpu_ops.gemm(0, 1, M, N, K, 1.0f, x, K, w, K, 0.0f, y_ref, N, b);
    CHECK(memcmp(y, y_ref, sizeof y) == 0);
    float s[M * N];
    fill(s, M * N, 8);
    REQUIRE(k_cpu_dev_ops.add(kb_out_f32(y), kb_in_f32(s), M * N) == 0);
    for (int i = 0; i < M * N; i++) CHECK(y[i] == y_ref[i] + s[i]);
    float table[NJ * D], src[R * NJ * D], out[R * NJ * D], dt[NJ * D], ds[R * D], dt_ref[NJ * D], ds_ref[R * D];
    fill(table, NJ * D, 9), fill(src, R * NJ * D, 10), fill(dt, NJ * D, 11), fill(ds, R * D, 12);
    memcpy(dt_ref, dt, sizeof dt), memcpy(ds_ref, ds, sizeof ds);
    REQUIRE(k_cpu_dev_ops.add_table_forward(kb_out_f32(out), kb_in_f32(table), kb_in_f32(src), R, NJ, D, NJ) == 0);
    CHECK(out[(1 * NJ + 4) * D + 3] == table[4 * D + 3] + src[(1 * NJ + 4) * D + 3]);
    REQUIRE(k_cpu_dev_ops.add_table_backward(kb_out_f32(dt), kb_out_f32(ds), kb_in_f32(src), R, NJ, D, 1) == 0);
    k_cpu_add_table_bwd(dt_ref, ds_ref, src, R, NJ, D, 1);
    CHECK(memcmp(dt, dt_ref, sizeof dt) == 0);
    CHECK(memcmp(ds, ds_ref, sizeof ds) == 0);
}

TEST(dev_table_cpu_refuses_what_it_does_not_hold) {
    float a[64] = {0}, c[64] = {0};
    k_gemm_args g = {0};
    g.M = 4, g.N = 4, g.K = 4, g.alpha = 1.0f, g.lda = 4, g.ldb = 4, g.ldc = 4;
    g.A = kb_in_bf16((const kb_bf16 *)a), g.B = kb_in_f32(a), g.C = kb_out_f32(c);
    core_error_clear();
    CHECK(k_cpu_dev_ops.gemm(&g) == -1);
    CHECK_MSG(strstr(core_last_error(), "cpu-f32 gemm: A is bf16: the CPU table takes fp32 views"), "%s",
              core_last_error());
    g.A = kb_in_f32(a), g.epi = K_EPI_GELU_AUX;
    CHECK(k_cpu_dev_ops.gemm(&g) == -1);
    CHECK(strstr(core_last_error(), "epilogue 2 is not on the CPU table"));
    CHECK(k_cpu_dev_ops.gelu_forward(kb_out_bf16((kb_bf16 *)c), kb_in_f32(a), 4) == -1);
    CHECK(strstr(core_last_error(), "cpu-f32 gelu_forward: out is bf16"));
    CHECK(k_cpu_dev_ops.mem_upload_bf16((kb_bf16 *)c, a, 4) == -1);
    CHECK(strstr(core_last_error(), "holds no bf16 tensors"));
    CHECK(k_cpu_dev_ops.sde_step(kb_in_f32(a), kb_in_f32(a), kb_in_f32(a), kb_in_f32(a), kb_out_f32(c), kb_out_f32(c),
                                 1, 1, 1, 0, 4, NULL) == -1);
    CHECK(strstr(core_last_error(), "cpu-f32 sde_step: not on the CPU table"));
    core_error_clear();
}
