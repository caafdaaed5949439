/* kernels/cuda/precond/kc_precond.c — the GPU path's preconditions on GEMM and attention (kc_precond.h), shared by
 * the CUDA backend and the emulated device. Each check names the argument and the value it refuses. */
#include "kernels/cuda/precond/kc_precond.h"

#include <stdint.h>

#include "core/error.h"

static const char *dtype_name(kb_dtype t) {
    return t == KB_F32 ? "fp32" : t == KB_BF16 ? "bf16" : "of an unknown dtype";
}

/* An attention operand (not NULL): bf16, cuDNN SDPA's operand type. */
static int bf16_ok(const char *op, const char *name, const void *p, kb_dtype t) {
    if (p && t != KB_BF16)
        return core_error("%s: %s is %s: the device attention takes bf16 operands (cuDNN SDPA)", op, name,
                          dtype_name(t));
    return 0;
}

static int misaligned(const void *p) { return ((uintptr_t)p) % 16 != 0; }

/* A required (or, with optional, NULL-able) operand pointer: non-NULL and 16-byte aligned. */
static int ptr_ok(const char *op, const char *name, const void *p, int optional) {
    if (!p && !optional) return core_error("%s: %s is NULL", op, name);
    if (misaligned(p))
        return core_error("%s: %s %p is not 16-byte aligned (address mod 16 = %u)", op, name, p,
                          (unsigned)((uintptr_t)p % 16));
    return 0;
}

int kc_precond_gemm(const k_gemm_args *g) {
    if (g->M < 1 || g->N < 1 || g->K < 1) return core_error("GEMM: M %d N %d K %d must be >= 1", g->M, g->N, g->K);
    if (g->C.t != KB_F32 && g->C.t != KB_BF16) return core_error("GEMM: C dtype %d is neither fp32 nor bf16", (int)g->C.t);
    if ((int)g->epi < K_EPI_NONE || g->epi > K_EPI_BGRAD_A) return core_error("GEMM: unknown epilogue %d", (int)g->epi);
    /* row lengths of the row-major operands as stored */
    const int a_cols = g->transA ? g->M : g->K, b_cols = g->transB ? g->K : g->N;
    if (g->lda < a_cols) return core_error("GEMM: lda %d is below A's row length %d (transA %d)", g->lda, a_cols, g->transA);
    if (g->ldb < b_cols) return core_error("GEMM: ldb %d is below B's row length %d (transB %d)", g->ldb, b_cols, g->transB);
    if (g->ldc < g->N) return core_error("GEMM: ldc %d is below C's row length N = %d", g->ldc, g->N);
    /* MIN_ALIGNMENT_*_BYTES 16 (gemm_lt.c): every row of A, B (bf16) and C must start 16-byte aligned */
    if (g->lda % 8) return core_error("GEMM: lda %d is not a multiple of 8 (bf16 rows must start 16-byte aligned)", g->lda);
    if (g->ldb % 8) return core_error("GEMM: ldb %d is not a multiple of 8 (bf16 rows must start 16-byte aligned)", g->ldb);
    const int cmul = g->C.t == KB_F32 ? 4 : 8;
    if (g->ldc % cmul)
        return core_error("GEMM: ldc %d is not a multiple of %d (%s rows must start 16-byte aligned)", g->ldc, cmul,
                          g->C.t == KB_F32 ? "fp32" : "bf16");
    const int needs_bias = g->epi == K_EPI_BIAS || g->epi == K_EPI_GELU_AUX_BIAS;
    const int needs_aux = g->epi >= K_EPI_GELU_AUX && g->epi <= K_EPI_DGELU_BGRAD;
    const int needs_dbias = g->epi == K_EPI_DGELU_BGRAD || g->epi == K_EPI_BGRAD_A;
    if (ptr_ok("GEMM", "A", g->A.p, 0) || ptr_ok("GEMM", "B", g->B.p, 0) || ptr_ok("GEMM", "C", g->C.p, 0)) return -1;
    /* cuBLASLt's operands A and B are bf16 on the GPU path (gemm_lt.c's layouts) */
    if (g->A.t != KB_BF16)
        return core_error("GEMM: A is %s: the device GEMM takes bf16 operands A and B", dtype_name(g->A.t));
    if (g->B.t != KB_BF16)
        return core_error("GEMM: B is %s: the device GEMM takes bf16 operands A and B", dtype_name(g->B.t));
    if (needs_bias && ptr_ok("GEMM", "bias", g->bias, 0)) return core_error_push("epilogue %d: ", (int)g->epi);
    if (needs_aux && ptr_ok("GEMM", "aux", g->aux, 0)) return core_error_push("epilogue %d: ", (int)g->epi);
    /* dbias is ours (fp32, added from a scratch vector by our kernel): only required */
    if (needs_dbias && !g->dbias) return core_error("GEMM: epilogue %d needs its dbias vector (dbias is NULL)", (int)g->epi);
    /* cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: divisible by 8, >= the rows of its column-major D (our N) */
    if (needs_aux && g->ldaux < g->N)
        return core_error("GEMM: ldaux %d is below N = %d (epilogue %d)", g->ldaux, g->N, (int)g->epi);
    if (needs_aux && g->ldaux % 8)
        return core_error("GEMM: ldaux %d is not a multiple of 8 (epilogue %d)", g->ldaux, (int)g->epi);
    /* k_cuda.h: aux = alpha op(A) op(B) (+ bias); with beta != 0 cuBLASLt would add beta C before the GELU */
    if (needs_aux && g->beta != 0.0f)
        return core_error("GEMM: beta %g with GELU epilogue %d (the GELU epilogues need beta = 0)", (double)g->beta,
                          (int)g->epi);
    return 0;
}

int kc_precond_index32(const char *op, size_t n) {
    if (n > (size_t)INT32_MAX)
        return core_error("%s: %zu elements, above the 2^31 - 1 of the kernels' 32-bit index math", op, n);
    return 0;
}

static int shape_ok(const char *op, int B, int Sq, int Skv, int H, int Dh, int dh_max) {
    if (B < 1) return core_error("%s: B %d must be >= 1", op, B);
    if (Sq < 1) return core_error("%s: Sq %d must be >= 1", op, Sq);
    if (Skv < 1) return core_error("%s: Skv %d must be >= 1", op, Skv);
    if (H < 1) return core_error("%s: H %d must be >= 1", op, H);
    if (Dh < 8 || Dh % 8) return core_error("%s: Dh %d is not a positive multiple of 8 (cuDNN SDPA)", op, Dh);
    if (Dh > dh_max) return core_error("%s: Dh %d is above %d (cuDNN SDPA on Hopper)", op, Dh, dh_max);
    const int64_t nq = (int64_t)B * Sq * H * Dh, nk = (int64_t)B * Skv * H * Dh;
    if (nq > INT32_MAX)
        return core_error("%s: q/o hold B*Sq*H*Dh = %lld elements, at most %d (32-bit element indices)", op,
                          (long long)nq, INT32_MAX);
    if (nk > INT32_MAX)
        return core_error("%s: k/v hold B*Skv*H*Dh = %lld elements, at most %d (32-bit element indices)", op,
                          (long long)nk, INT32_MAX);
    return 0;
}

int kc_precond_attention_forward(kb_out o, const float *lse, kb_in q, kb_in k, kb_in v, int B, int Sq, int Skv,
                                 int H, int Dh) {
    const char *op = "attention_forward";
    if (shape_ok(op, B, Sq, Skv, H, Dh, KC_ATTN_DH_MAX_FWD)) return -1;
    /* attn_cudnn.c's tensors declare CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT 16 */
    if (ptr_ok(op, "q", q.p, 0) || ptr_ok(op, "k", k.p, 0) || ptr_ok(op, "v", v.p, 0) || ptr_ok(op, "o", o.p, 0) ||
        ptr_ok(op, "lse", lse, 0))
        return -1;
    if (bf16_ok(op, "q", q.p, q.t) || bf16_ok(op, "k", k.p, k.t) || bf16_ok(op, "v", v.p, v.t) ||
        bf16_ok(op, "o", o.p, o.t))
        return -1;
    return 0;
}

int kc_precond_attention_backward(kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k, kb_in v, kb_in o,
                                  const float *lse, int B, int Sq, int Skv, int H, int Dh) {
    const char *op = "attention_backward";
    if (shape_ok(op, B, Sq, Skv, H, Dh, KC_ATTN_DH_MAX_BWD)) return -1;
    if (ptr_ok(op, "dout", dout.p, 0) || ptr_ok(op, "q", q.p, 0) || ptr_ok(op, "k", k.p, 0) ||
        ptr_ok(op, "v", v.p, 0) || ptr_ok(op, "o", o.p, 0) || ptr_ok(op, "lse", lse, 0) ||
        ptr_ok(op, "dq", dq.p, 1) || ptr_ok(op, "dk", dk.p, 1) || ptr_ok(op, "dv", dv.p, 1))
        return -1;
    if (bf16_ok(op, "dout", dout.p, dout.t) || bf16_ok(op, "q", q.p, q.t) || bf16_ok(op, "k", k.p, k.t) ||
        bf16_ok(op, "v", v.p, v.t) || bf16_ok(op, "o", o.p, o.t) || bf16_ok(op, "dq", dq.p, dq.t) ||
        bf16_ok(op, "dk", dk.p, dk.t) || bf16_ok(op, "dv", dv.p, dv.t))
        return -1;
    return 0;
}

int kc_precond_t5_attention(kb_out o, kb_in q, kb_in k, kb_in v, const float *rel_bias, const int *bucket_of, int B,
                            int S, int H, int Dk) {
    const char *op = "t5_attention";
    if (B < 1 || S < 1 || H < 1 || Dk < 1)
        return core_error("%s: B %d, S %d, H %d, Dk %d must all be >= 1", op, B, S, H, Dk);
    if (S > KC_T5_S_MAX)
        return core_error("%s: S %d is above the %d tokens one block's shared memory holds (kernels/cuda/kern_t5.cu)",
                          op, S, KC_T5_S_MAX);
    if (!o.p || !q.p || !k.p || !v.p || !rel_bias || !bucket_of)
        return core_error("%s: o, q, k, v, rel_bias and bucket_of are all required (one is NULL)", op);
    return kc_precond_index32(op, (size_t)B * S * H * Dk);
}
