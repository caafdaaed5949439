/* model/dit/wan_layers.c — small layers the Wan transformer needs beyond the op table (wan_internal.h): nn.Linear
 * forward (one GEMM with the bias epilogue) and backward (dX, then dW with the bias-gradient epilogue: on the CPU
 * table the GEMM then kernels/cpu/glue.c's fixed-order column sum), zeroing, the copies in the activations' dtype,
 * and diffusers' sinusoidal timestep features (host). */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_internal.h"

int wan_linear_fwd(const k_dev_ops *dev, kb_out y, kb_in x, kb_in w, kb_in b, int M, int N, int K) {
    k_gemm_args g = {0};
    g.transA = 0, g.transB = 1, g.M = M, g.N = N, g.K = K, g.alpha = 1.0f, g.beta = 0.0f;
    g.A = x, g.lda = K, g.B = w, g.ldb = K, g.C = y, g.ldc = N;
    g.epi = b.p ? K_EPI_BIAS : K_EPI_NONE;
    g.bias = b.p;
    return dev->gemm(&g);
}

int wan_linear_bwd(const k_dev_ops *dev, kb_out dx, float *dw, float *db, kb_in dy, kb_in x, kb_in w, int M, int N,
                   int K) {
    if (db && !dw) return core_error("wan_linear_bwd: a bias gradient without its weight gradient");
    if (dx.p) { /* dx[M,K] += dy[M,N] @ w[N,K] */
        k_gemm_args g = {0};
        g.transA = 0, g.transB = 0, g.M = M, g.N = K, g.K = N, g.alpha = 1.0f, g.beta = 1.0f;
        g.A = dy, g.lda = N, g.B = w, g.ldb = K, g.C = dx, g.ldc = K;
        WAN_TRY(dev->gemm(&g));
    }
    if (dw) { /* dw[N,K] += dy^T @ x; db[N] += column sums of dy (rows of op(A) = dy^T) */
        k_gemm_args g = {0};
        g.transA = 1, g.transB = 0, g.M = N, g.N = K, g.K = M, g.alpha = 1.0f, g.beta = 1.0f;
        g.A = dy, g.lda = N, g.B = x, g.ldb = K, g.C = kb_out_f32(dw), g.ldc = K;
        g.epi = db ? K_EPI_BGRAD_A : K_EPI_NONE;
        g.dbias = db;
        WAN_TRY(dev->gemm(&g));
    }
    return 0;
}

int wan_zero_act(const wan_acts *A, void *p, int64_t n) {
    return A->dev->mem_zero(p, (size_t)n * (A->at == KB_BF16 ? 2 : 4));
}
int wan_zero32(const wan_acts *A, float *p, int64_t n) { return A->dev->mem_zero(p, (size_t)n * sizeof *p); }

int wan_to_act(const wan_acts *A, void *y, const float *x, int64_t n) {
    if (A->at == KB_F32) return 0; /* y is x */
    WAN_TRY(wan_zero_act(A, y, n));
    return A->dev->add(wan_ao(A, y), kb_in_f32(x), n);
}

void wan_timestep_features(float *out, const float *t, int R, int dim) {
    const int half = dim / 2;
    /* exponent = (-ln(10000) as fp32) * i, then / half, each rounded to fp32; exp rounded once from double. */
    const float neg_log = (float)(-log(10000.0));
    float freq[half > 0 ? half : 1];
    for (int i = 0; i < half; i++) {
        float e = neg_log * (float)i;
        e = e / (float)half;
        freq[i] = (float)exp((double)e);
    }
    for (int r = 0; r < R; r++) {
        float *o = out + (int64_t)r * dim;
        for (int i = 0; i < half; i++) {
            const float a = t[r] * freq[i];
            o[i] = (float)cos((double)a);
            o[half + i] = (float)sin((double)a);
        }
        if (dim % 2) o[dim - 1] = 0.0f;
    }
}
