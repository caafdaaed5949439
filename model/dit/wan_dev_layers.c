/* model/dit/wan_dev_layers.c — wan_layers.c's nn.Linear on the device table: the forward is one GEMM with the bias
 * epilogue; the backward is dX (accumulating, beta 1) then dW (fp32, accumulating) with the bias gradient fused as
 * cuBLASLt's BGRADA epilogue, in wan_linear_bwd's order. Plus small helpers: conversion to bf16, zeroing. */
#include "core/error.h"
#include "model/dit/wan_dev_internal.h"

int wan_dev_linear_fwd(const k_dev_ops *dev, kb_out y, const kb_bf16 *x, const kb_bf16 *w, const void *b, int M,
                       int N, int K) {
    k_gemm_args g = {0};
    g.transA = 0, g.transB = 1, g.M = M, g.N = N, g.K = K, g.alpha = 1.0f, g.beta = 0.0f;
    g.A = x, g.lda = K, g.B = w, g.ldb = K, g.C = y, g.ldc = N;
    g.epi = b ? K_EPI_BIAS : K_EPI_NONE;
    g.bias = b;
    return dev->gemm(&g);
}

int wan_dev_linear_bwd(const k_dev_ops *dev, kb_out dx, float *dw, float *db, const kb_bf16 *dy, const kb_bf16 *x,
                       const kb_bf16 *w, int M, int N, int K) {
    if (db && !dw) return core_error("wan_dev_linear_bwd: a bias gradient without its weight gradient");
    if (dx.p) { /* dx[M,K] += dy[M,N] @ w[N,K] */
        k_gemm_args g = {0};
        g.transA = 0, g.transB = 0, g.M = M, g.N = K, g.K = N, g.alpha = 1.0f, g.beta = 1.0f;
        g.A = dy, g.lda = N, g.B = w, g.ldb = K, g.C = dx, g.ldc = K;
        WD_TRY(dev->gemm(&g));
    }
    if (dw) { /* dw[N,K] += dy^T @ x; db[N] += column sums of dy (rows of op(A) = dy^T) */
        k_gemm_args g = {0};
        g.transA = 1, g.transB = 0, g.M = N, g.N = K, g.K = M, g.alpha = 1.0f, g.beta = 1.0f;
        g.A = dy, g.lda = N, g.B = x, g.ldb = K, g.C = kb_out_f32(dw), g.ldc = K;
        g.epi = db ? K_EPI_BGRAD_A : K_EPI_NONE;
        g.dbias = db;
        WD_TRY(dev->gemm(&g));
    }
    return 0;
}

int wan_dev_zero16(const k_dev_ops *dev, kb_bf16 *p, int64_t n) { return dev->mem_zero(p, (size_t)n * sizeof *p); }
int wan_dev_zero32(const k_dev_ops *dev, float *p, int64_t n) { return dev->mem_zero(p, (size_t)n * sizeof *p); }

int wan_dev_to_bf16(const k_dev_ops *dev, kb_bf16 *y, kb_in x, int64_t n) {
    WD_TRY(wan_dev_zero16(dev, y, n));
    return dev->add(kb_out_bf16(y), x, n);
}
