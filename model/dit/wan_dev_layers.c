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

/* ---- LoRA (wan_lora.h's adapter on the device) ---- */

int wan_dev_lora_prepare(wan_dev_acts *A, const wan_dev_model *d, int use_lora) {
    A->lora = use_lora && d->lora ? d : NULL;
    if (!A->lora) return 0;
    const int64_t S = A->S, rows = (int64_t)A->shape.B * (S > A->L ? S : A->L);
    const int64_t need = (rows > A->R ? rows : A->R) * d->lora->cfg.rank;
    if (A->lora_cap >= need) return 0;
    A->dev->mem_free(A->lora_h);
    A->lora_h = A->lora_t = NULL;
    A->lora_cap = 0;
    kb_bf16 *p = A->dev->mem_alloc((size_t)(2 * need) * sizeof(kb_bf16));
    if (!p) return core_error_push("lora: %lld bf16 values of the adapter's scratch: ", (long long)(2 * need));
    A->lora_h = p, A->lora_t = p + need, A->lora_cap = need;
    return 0;
}

/* The device copy of one adapter tensor (host pointer p into lora->params): bf16 weights, fp32 gradients. */
static const kb_bf16 *lw(const wan_dev_model *d, const float *p) { return d->lora_w + (p - d->lora->params); }
static float *lg(const wan_dev_model *d, const float *p) {
    return d->lora_grads ? d->lora_grads + (p - d->lora->params) : NULL;
}

/* C[M, N] = alpha op(A) op(B) + beta C, bf16 operands. */
static int gemm(const k_dev_ops *dev, int ta, int tb, int M, int N, int K, float alpha, const kb_bf16 *a, int lda,
                const kb_bf16 *b, int ldb, float beta, kb_out c, int ldc) {
    k_gemm_args g = {0};
    g.transA = ta, g.transB = tb, g.M = M, g.N = N, g.K = K, g.alpha = alpha, g.beta = beta;
    g.A = a, g.lda = lda, g.B = b, g.ldb = ldb, g.C = c, g.ldc = ldc;
    return dev->gemm(&g);
}

int wan_dev_lora_fwd(const wan_dev_acts *A, int layer, int t, kb_out y, const kb_bf16 *x, int M) {
    const wan_dev_model *d = A->lora;
    if (!d) return 0;
    const wan_lora_linear *a = wan_lora_get(&d->lora->w, layer, t);
    if (!a->A) return 0;
    const k_dev_ops *dev = A->dev;
    const int r = d->lora->cfg.rank, K = a->in, N = a->out;
    WD_TRY(gemm(dev, 0, 1, M, r, K, 1.0f, x, K, lw(d, a->A), K, 0.0f, wd_out(A->lora_h), r)); /* h = x A^T */
    return gemm(dev, 0, 1, M, N, r, d->lora->scale, A->lora_h, r, lw(d, a->B), r, 1.0f, y, N); /* y += s h B^T */
}

int wan_dev_lora_bwd(const wan_dev_acts *A, int layer, int t, kb_out dx, const kb_bf16 *dy, const kb_bf16 *x, int M) {
    const wan_dev_model *d = A->lora;
    if (!d) return 0;
    const wan_lora_linear *a = wan_lora_get(&d->lora->w, layer, t);
    if (!a->A) return 0;
    const k_dev_ops *dev = A->dev;
    const int r = d->lora->cfg.rank, K = a->in, N = a->out;
    const float s = d->lora->scale;
    float *gA = lg(d, a->A), *gB = lg(d, a->B);
    if (gA) {
        WD_TRY(gemm(dev, 0, 1, M, r, K, 1.0f, x, K, lw(d, a->A), K, 0.0f, wd_out(A->lora_h), r)); /* h = x A^T */
        WD_TRY(gemm(dev, 1, 0, N, r, M, s, dy, N, A->lora_h, r, 1.0f, wd_out32(gB), r));           /* dB += s dy^T h */
    }
    WD_TRY(gemm(dev, 0, 0, M, r, N, 1.0f, dy, N, lw(d, a->B), r, 0.0f, wd_out(A->lora_t), r)); /* t = dy B */
    if (gA) WD_TRY(gemm(dev, 1, 0, r, K, M, s, A->lora_t, r, x, K, 1.0f, wd_out32(gA), K));     /* dA += s t^T x */
    if (dx.p) WD_TRY(gemm(dev, 0, 0, M, K, r, s, A->lora_t, r, lw(d, a->A), K, 1.0f, dx, K));  /* dx += s t A */
    return 0;
}
