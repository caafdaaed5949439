/* tests/test_kc_precond.c — the GPU path's preconditions (kernels/cuda/precond/kc_precond.h) enforced by the emulated
 * device (kernels/cuda/emu/): one test per check, each a call that cuBLASLt or cuDNN on the GPU would refuse, made on
 * k_emu_ops, which must refuse it with the message naming the argument and its value (and accept the valid call
 * beside it). Removing a check from kc_precond.c makes its test fail: the emulator then computes (returns 0) or
 * reads out of bounds. The CUDA backend calls the same functions at the entries of gemm_lt.c and attn_cudnn.c. */
#include <string.h>

#include "kernels/cuda/emu/k_emu.h"
#include "kernels/cuda/precond/kc_precond.h"
#include "tests/test.h"

#define BUF_BYTES ((size_t)1 << 16)

/* rc must be -1 and the message must contain want. */
#define EXPECT_REFUSED(call, want)                                                                           \
    do {                                                                                                     \
        core_error_clear();                                                                                  \
        int rc_ = (call);                                                                                    \
        CHECK_MSG(rc_ == -1, "%s: accepted (rc %d), the GPU refuses it (%s)", #call, rc_, want);              \
        CHECK_MSG(strstr(core_last_error(), want), "%s: message '%s' lacks '%s'", #call, core_last_error(), want); \
    } while (0)
#define EXPECT_OK(call) CHECK_MSG((call) == 0, "%s: refused: %s", #call, core_last_error())

typedef struct {
    void *a, *b, *c, *bias, *aux, *dbias;
} gemm_bufs;

static gemm_bufs bufs_new(void) {
    gemm_bufs u;
    void **p[6] = {&u.a, &u.b, &u.c, &u.bias, &u.aux, &u.dbias};
    for (int i = 0; i < 6; i++) {
        *p[i] = k_emu_ops.mem_alloc(BUF_BYTES);
        memset(*p[i], 0, BUF_BYTES);
    }
    return u;
}
static void bufs_free(gemm_bufs *u) {
    void *p[6] = {u->a, u->b, u->c, u->bias, u->aux, u->dbias};
    for (int i = 0; i < 6; i++) k_emu_ops.mem_free(p[i]);
}

/* A valid GEMM: C[8, 16] fp32 = A[8, 8] B[8, 16], no epilogue. */
static k_gemm_args base_gemm(gemm_bufs *u) {
    k_gemm_args g;
    memset(&g, 0, sizeof g);
    g.M = 8, g.N = 16, g.K = 8, g.alpha = 1.0f, g.beta = 0.0f;
    g.A = kb_in_bf16(u->a), g.lda = 8, g.B = kb_in_bf16(u->b), g.ldb = 16, g.C = kb_out_f32(u->c), g.ldc = 16;
    g.bias = u->bias, g.aux = u->aux, g.ldaux = 16, g.dbias = u->dbias;
    return g;
}

static int gemm(const k_gemm_args *g) { return k_emu_ops.gemm(g); }

TEST(emu_precond_gemm_sizes) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    EXPECT_OK(gemm(&g));
    g.K = 0;
    EXPECT_REFUSED(gemm(&g), "M 8 N 16 K 0 must be >= 1");
    bufs_free(&u);
}

TEST(emu_precond_gemm_c_dtype) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.C.t = (kb_dtype)7;
    EXPECT_REFUSED(gemm(&g), "C dtype 7 is neither fp32 nor bf16");
    bufs_free(&u);
}

TEST(emu_precond_gemm_epilogue) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.epi = (k_epilogue)42;
    EXPECT_REFUSED(gemm(&g), "unknown epilogue 42");
    bufs_free(&u);
}

TEST(emu_precond_gemm_ld_below_row) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.transA = 1; /* A stored [K, M] = [8, 8]: lda 8 still fits; M 16 needs lda 16 */
    g.M = 16;
    EXPECT_REFUSED(gemm(&g), "lda 8 is below A's row length 16 (transA 1)");
    g = base_gemm(&u), g.ldb = 8;
    EXPECT_REFUSED(gemm(&g), "ldb 8 is below B's row length 16");
    g = base_gemm(&u), g.ldc = 8;
    EXPECT_REFUSED(gemm(&g), "ldc 8 is below C's row length N = 16");
    bufs_free(&u);
}

TEST(emu_precond_gemm_lda_multiple_of_8) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.lda = 12;
    EXPECT_REFUSED(gemm(&g), "lda 12 is not a multiple of 8");
    g.lda = 16;
    EXPECT_OK(gemm(&g));
    bufs_free(&u);
}

TEST(emu_precond_gemm_ldb_multiple_of_8) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.ldb = 20;
    EXPECT_REFUSED(gemm(&g), "ldb 20 is not a multiple of 8");
    bufs_free(&u);
}

/* fp32 C: rows of 4 floats are 16 bytes, so ldc 20 is fine; bf16 C needs a multiple of 8. */
TEST(emu_precond_gemm_ldc_multiple) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.ldc = 20;
    EXPECT_OK(gemm(&g));
    g.C = kb_out_bf16(u.c);
    EXPECT_REFUSED(gemm(&g), "ldc 20 is not a multiple of 8 (bf16 rows");
    g.ldc = 18, g.C = kb_out_f32(u.c);
    EXPECT_REFUSED(gemm(&g), "ldc 18 is not a multiple of 4 (fp32 rows");
    bufs_free(&u);
}

TEST(emu_precond_gemm_pointer_alignment) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.A = kb_in_bf16((const kb_bf16 *)u.a + 1);
    EXPECT_REFUSED(gemm(&g), "GEMM: A 0x");
    CHECK(strstr(core_last_error(), "is not 16-byte aligned (address mod 16 = 2)"));
    g = base_gemm(&u), g.B = kb_in_bf16((const kb_bf16 *)u.b + 4);
    EXPECT_REFUSED(gemm(&g), "(address mod 16 = 8)");
    CHECK(strstr(core_last_error(), "GEMM: B "));
    g = base_gemm(&u), g.C = kb_out_f32((float *)u.c + 1);
    EXPECT_REFUSED(gemm(&g), "GEMM: C ");
    g = base_gemm(&u), g.B = kb_in_bf16(NULL);
    EXPECT_REFUSED(gemm(&g), "GEMM: B is NULL");
    bufs_free(&u);
}

/* cuBLASLt's operands are bf16: an fp32 A or B (the CPU table's operands) is refused, naming it. */
TEST(emu_precond_gemm_operands_bf16) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.A = kb_in_f32((const float *)u.a);
    EXPECT_REFUSED(gemm(&g), "GEMM: A is fp32: the device GEMM takes bf16 operands A and B");
    g = base_gemm(&u), g.B = kb_in_f32((const float *)u.b);
    EXPECT_REFUSED(gemm(&g), "GEMM: B is fp32");
    bufs_free(&u);
}

TEST(emu_precond_gemm_bias) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.epi = K_EPI_BIAS;
    EXPECT_OK(gemm(&g));
    g.bias = (const float *)u.bias + 2;
    EXPECT_REFUSED(gemm(&g), "GEMM: bias ");
    g.bias = NULL;
    EXPECT_REFUSED(gemm(&g), "GEMM: bias is NULL");
    bufs_free(&u);
}

TEST(emu_precond_gemm_aux_pointer) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.epi = K_EPI_GELU_AUX;
    EXPECT_OK(gemm(&g));
    g.aux = (kb_bf16 *)u.aux + 3;
    EXPECT_REFUSED(gemm(&g), "(address mod 16 = 6)");
    g.aux = NULL;
    EXPECT_REFUSED(gemm(&g), "GEMM: aux is NULL");
    bufs_free(&u);
}

TEST(emu_precond_gemm_dbias) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.epi = K_EPI_BGRAD_A, g.transA = 1; /* dW = dY^T X shape: A stored [K, M] */
    EXPECT_OK(gemm(&g));
    g.dbias = NULL;
    EXPECT_REFUSED(gemm(&g), "epilogue 6 needs its dbias vector (dbias is NULL)");
    bufs_free(&u);
}

TEST(emu_precond_gemm_ldaux) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.epi = K_EPI_DGELU;
    EXPECT_OK(gemm(&g));
    g.ldaux = 8;
    EXPECT_REFUSED(gemm(&g), "ldaux 8 is below N = 16 (epilogue 4)");
    g.ldaux = 20;
    EXPECT_REFUSED(gemm(&g), "ldaux 20 is not a multiple of 8 (epilogue 4)");
    bufs_free(&u);
}

/* k_cuda.h: GELU epilogues are defined with beta 0 (cuBLASLt would add beta C before the GELU). */
TEST(emu_precond_gemm_gelu_beta) {
    gemm_bufs u = bufs_new();
    k_gemm_args g = base_gemm(&u);
    g.beta = 1.0f;
    EXPECT_OK(gemm(&g)); /* beta 1 is fine without an epilogue */
    const k_epilogue gelu[4] = {K_EPI_GELU_AUX, K_EPI_GELU_AUX_BIAS, K_EPI_DGELU, K_EPI_DGELU_BGRAD};
    char want[96];
    for (int i = 0; i < 4; i++) {
        g.epi = gelu[i];
        snprintf(want, sizeof want, "beta 1 with GELU epilogue %d", (int)gelu[i]);
        EXPECT_REFUSED(gemm(&g), want);
    }
    bufs_free(&u);
}

/* ---- attention ---- */

typedef struct {
    kb_bf16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse;
} attn_bufs;

#define ATTN_ELEMS 16384
static attn_bufs attn_new(void) {
    attn_bufs a;
    kb_bf16 **p[8] = {&a.q, &a.k, &a.v, &a.o, &a.dout, &a.dq, &a.dk, &a.dv};
    for (int i = 0; i < 8; i++) {
        *p[i] = k_emu_ops.mem_alloc(ATTN_ELEMS * sizeof(kb_bf16));
        memset(*p[i], 0, ATTN_ELEMS * sizeof(kb_bf16));
    }
    a.lse = k_emu_ops.mem_alloc(ATTN_ELEMS * sizeof(float));
    memset(a.lse, 0, ATTN_ELEMS * sizeof(float));
    return a;
}
static void attn_free(attn_bufs *a) {
    kb_bf16 *p[8] = {a->q, a->k, a->v, a->o, a->dout, a->dq, a->dk, a->dv};
    for (int i = 0; i < 8; i++) k_emu_ops.mem_free(p[i]);
    k_emu_ops.mem_free(a->lse);
}
static int fwd(attn_bufs *a, int B, int Sq, int Skv, int H, int Dh) {
    return k_emu_ops.attention_forward(kb_out_bf16(a->o), a->lse, kb_in_bf16(a->q), kb_in_bf16(a->k), kb_in_bf16(a->v),
                                       B, Sq, Skv, H, Dh, 0.25f);
}
static int bwd(attn_bufs *a, int B, int Sq, int Skv, int H, int Dh) {
    return k_emu_ops.attention_backward(kb_out_bf16(a->dq), kb_out_bf16(a->dk), kb_out_bf16(a->dv),
                                        kb_in_bf16(a->dout), kb_in_bf16(a->q), kb_in_bf16(a->k), kb_in_bf16(a->v),
                                        kb_in_bf16(a->o), a->lse, B, Sq, Skv, H, Dh, 0.25f);
}

/* cuDNN's operands are bf16: an fp32 view is refused, naming it. */
TEST(emu_precond_attn_operands_bf16) {
    attn_bufs a = attn_new();
    EXPECT_REFUSED(k_emu_ops.attention_forward(kb_out_bf16(a.o), a.lse, kb_in_bf16(a.q), kb_in_f32((float *)a.k),
                                               kb_in_bf16(a.v), 1, 8, 8, 2, 16, 0.25f),
                   "attention_forward: k is fp32: the device attention takes bf16 operands");
    EXPECT_REFUSED(k_emu_ops.attention_backward(kb_out_bf16(a.dq), kb_out_bf16(a.dk), kb_out_f32((float *)a.dv),
                                                kb_in_bf16(a.dout), kb_in_bf16(a.q), kb_in_bf16(a.k),
                                                kb_in_bf16(a.v), kb_in_bf16(a.o), a.lse, 1, 8, 8, 2, 16, 0.25f),
                   "attention_backward: dv is fp32");
    attn_free(&a);
}

TEST(emu_precond_attn_sizes) {
    attn_bufs a = attn_new();
    EXPECT_OK(fwd(&a, 1, 8, 8, 2, 16));
    EXPECT_REFUSED(fwd(&a, 0, 8, 8, 2, 16), "attention_forward: B 0 must be >= 1");
    EXPECT_REFUSED(fwd(&a, 1, 0, 8, 2, 16), "attention_forward: Sq 0 must be >= 1");
    EXPECT_REFUSED(bwd(&a, 1, 8, 0, 2, 16), "attention_backward: Skv 0 must be >= 1");
    EXPECT_REFUSED(bwd(&a, 1, 8, 8, 0, 16), "attention_backward: H 0 must be >= 1");
    attn_free(&a);
}

TEST(emu_precond_attn_dh_multiple_of_8) {
    attn_bufs a = attn_new();
    EXPECT_REFUSED(fwd(&a, 1, 8, 8, 2, 12), "attention_forward: Dh 12 is not a positive multiple of 8");
    EXPECT_REFUSED(bwd(&a, 1, 8, 8, 2, 4), "attention_backward: Dh 4 is not a positive multiple of 8");
    attn_free(&a);
}

/* Forward up to 256, backward up to 128 (cuDNN SDPA on Hopper). */
TEST(emu_precond_attn_dh_max) {
    attn_bufs a = attn_new();
    EXPECT_OK(fwd(&a, 1, 8, 8, 2, 256));
    EXPECT_REFUSED(fwd(&a, 1, 8, 8, 2, 264), "attention_forward: Dh 264 is above 256");
    EXPECT_OK(fwd(&a, 1, 8, 8, 2, 136));
    EXPECT_REFUSED(bwd(&a, 1, 8, 8, 2, 136), "attention_backward: Dh 136 is above 128");
    EXPECT_OK(bwd(&a, 1, 8, 8, 2, 128));
    attn_free(&a);
}

TEST(emu_precond_attn_elements) {
    attn_bufs a = attn_new(); /* refused before any pointer is read */
    EXPECT_REFUSED(fwd(&a, 1, 1 << 20, 8, 32, 64), "q/o hold B*Sq*H*Dh = 2147483648 elements");
    EXPECT_REFUSED(bwd(&a, 2, 8, 1 << 20, 16, 64), "k/v hold B*Skv*H*Dh = 2147483648 elements");
    attn_free(&a);
}

TEST(emu_precond_attn_pointers) {
    attn_bufs a = attn_new();
    kb_bf16 *q = a.q;
    a.q = q + 4;
    EXPECT_REFUSED(fwd(&a, 1, 8, 8, 2, 16), "attention_forward: q ");
    CHECK(strstr(core_last_error(), "not 16-byte aligned (address mod 16 = 8)"));
    a.q = q;
    float *lse = a.lse;
    a.lse = lse + 1;
    EXPECT_REFUSED(fwd(&a, 1, 8, 8, 2, 16), "attention_forward: lse ");
    EXPECT_REFUSED(bwd(&a, 1, 8, 8, 2, 16), "attention_backward: lse ");
    a.lse = lse;
    kb_bf16 *dout = a.dout;
    a.dout = NULL;
    EXPECT_REFUSED(bwd(&a, 1, 8, 8, 2, 16), "attention_backward: dout is NULL");
    a.dout = dout;
    kb_bf16 *dk = a.dk;
    a.dk = dk + 1;
    EXPECT_REFUSED(bwd(&a, 1, 8, 8, 2, 16), "attention_backward: dk ");
    a.dk = NULL; /* a gradient not wanted: allowed (the GPU path skips its add) */
    EXPECT_OK(bwd(&a, 1, 8, 8, 2, 16));
    a.dk = dk;
    attn_free(&a);
}

/* Our own kernels index elements in 32 bits (kernels/body/kb_index.h): an op over 2^31 or more elements is refused,
 * by the kernels' launchers and by the emulated device (sizes only: nothing is read). */
TEST(emu_precond_index32) {
    kb_out none = {NULL, KB_BF16};
    kb_in nil = {NULL, KB_BF16};
    EXPECT_REFUSED(k_emu_ops.modulate_forward(none, nil, nil, nil, 1, 1 << 20, 2048, 0, 2048),
                   "modulate_forward: 2147483648 elements, above the 2^31 - 1");
    EXPECT_REFUSED(k_emu_ops.gate_residual_backward(none, none, none, nil, nil, nil, 2, 1 << 20, 1024, 1, 1024),
                   "gate_residual_backward: 2147483648 elements");
    EXPECT_REFUSED(k_emu_ops.rope_forward(none, nil, NULL, NULL, 1, 1 << 20, 16, 128), "rope_forward: 2147483648");
    EXPECT_REFUSED(k_emu_ops.add_table_forward(none, nil, nil, 1 << 20, 6, 512, 6), "add_table_forward: 3221225472");
    EXPECT_REFUSED(k_emu_ops.patchify_forward(none, nil, 1, 16, 1024, 512, 512, 1, 2, 2), "patchify_forward: 4294967296");
    EXPECT_REFUSED(k_emu_ops.lse_merge_forward(none, NULL, nil, NULL, nil, NULL, 1, 1 << 20, 16, 128),
                   "lse_merge_forward: 2147483648");
    EXPECT_OK(kc_precond_index32("x", (size_t)INT32_MAX));
}
