/* tests/test_kernel_bodies.c — the kernel bodies of kernels/body/ (the arithmetic the CUDA backend launches), run on
 * the CPU through kernels/body/kb_host.h against the fp32 CPU op table k_cpu_ops, at small shapes with row lengths
 * that leave lane and chunk tails. Each op runs twice, with fp32 and with bf16 storage; both runs feed the CPU op
 * and the body the same values (bf16-representable in the bf16 run), so the comparison isolates what storage does:
 *
 *   storage  what is asserted
 *   fp32     every output bit-identical to k_cpu_ops: the bodies keep the CPU ops' order of operations (for the
 *            norms the 16-lane double sums and their pairwise tree, for the modulation gradients the in-order
 *            double column sums, for the LSE merge the same libm calls). Ops: layernorm fwd/bwd (dx, dw, db),
 *            rmsnorm fwd/bwd (dx, dw), rope fwd/bwd, gelu fwd/bwd, silu fwd/bwd, modulate fwd/bwd, gate residual
 *            fwd/bwd, patchify fwd/bwd, unpatchify fwd/bwd, lse_merge fwd/bwd.
 *   bf16     fp32 outputs (norm statistics, LSE, parameter gradients) bit-identical as above; every bf16 output
 *            element equal to the round-to-nearest-even of k_cpu_ops's fp32 result (one rounding, nothing else),
 *            and its relative L2 error against that fp32 result inside the band [TB_BAND_LO, TB_BAND_HI] =
 *            [2e-4, 2^-8]: 2^-8 is bf16's unit roundoff, a bound no single rounding can exceed; the lower end shows
 *            that the rounding happened (typical value ~1.5e-3). Pure copies (patchify and unpatchify forward)
 *            move bf16 values unchanged: band [0, 0].
 * The flow, guidance and optimizer bodies are checked against model/flow and trainer/optim in
 * tests/test_kernel_bodies_flow.c. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/body/kb_host.h"
#include "kernels/cpu/cpu.h"
#include "tests/test.h"

#define TB_BAND_LO 2e-4
#define TB_BAND_HI 0.00390625 /* 2^-8 */

/* A test tensor: ref holds the fp32 values the CPU op reads and writes; st the same values in the storage under
 * test (a copy for fp32, bf16 for bf16). */
typedef struct {
    size_t n;
    float *ref;
    void *st;
    kb_dtype t;
} tb_t;

static void *tb_alloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) abort();
    return p;
}

/* Uniform values in [lo, hi) (bf16-rounded for bf16 storage), in ref and st. */
static tb_t tb_make(size_t n, kb_dtype t, unsigned long long seed, float lo, float hi) {
    tb_t x = {n, tb_alloc(n * sizeof(float)), NULL, t};
    test_fill_uniform(x.ref, n, seed, lo, hi);
    if (t == KB_BF16) {
        kb_bf16 *h = tb_alloc(n * sizeof(kb_bf16));
        for (size_t i = 0; i < n; i++) h[i] = kb_bf16_from_f32(x.ref[i]), x.ref[i] = kb_f32_from_bf16(h[i]);
        x.st = h;
    } else {
        x.st = tb_alloc(n * sizeof(float));
        memcpy(x.st, x.ref, n * sizeof(float));
    }
    return x;
}

static void tb_free(tb_t *x) {
    free(x->ref), free(x->st);
    x->ref = x->st = NULL;
}

static kb_in tb_in(const tb_t *x) {
    kb_in v = {x->st, x->t};
    return v;
}
static kb_out tb_out(tb_t *x) {
    kb_out v = {x->st, x->t};
    return v;
}
static float tb_get(const tb_t *x, size_t i) { return kb_get(tb_in(x), i); }

/* The body's output st against the CPU op's fp32 result ref: fp32 bitwise; bf16 element-wise equal to the rounded
 * ref and rel-L2 in the band (exact: a pure copy of bf16 values, rel-L2 0). Then ref takes the stored values, so
 * that an op accumulating into x next starts from the same values on both sides. */
static void tb_check_impl(const char *file, int line, const char *what, tb_t *x, int exact) {
    size_t bad = 0, first = 0;
    double num = 0, den = 0;
    for (size_t i = 0; i < x->n; i++) {
        float got = tb_get(x, i), want = x->t == KB_BF16 ? kb_round_bf16(x->ref[i]) : x->ref[i];
        if (memcmp(&got, &want, sizeof got) != 0 && !(got != got && want != want)) {
            if (!bad) first = i;
            bad++;
        }
        double d = (double)got - (double)x->ref[i];
        num += d * d;
        den += (double)x->ref[i] * (double)x->ref[i];
    }
    if (bad)
        test_fail(file, line, "%s (%s): %zu of %zu elements differ from %s k_cpu_ops (first [%zu]: %.9g vs %.9g)",
                  what, x->t == KB_BF16 ? "bf16" : "fp32", bad, x->n, x->t == KB_BF16 ? "the rounded" : "",
                  first, (double)tb_get(x, first), (double)x->ref[first]);
    if (x->t == KB_BF16) {
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        double lo = exact ? 0.0 : TB_BAND_LO, hi = exact ? 0.0 : TB_BAND_HI;
        if (!(rel >= lo && rel <= hi))
            test_fail(file, line, "%s (bf16): relative L2 %.3g outside the band [%g, %g]", what, rel, lo, hi);
    }
    for (size_t i = 0; i < x->n; i++) x->ref[i] = tb_get(x, i);
}
#define TB_CHECK(what, x) tb_check_impl(__FILE__, __LINE__, what, x, 0)
#define TB_CHECK_EXACT(what, x) tb_check_impl(__FILE__, __LINE__, what, x, 1)

/* fp32 arrays that must be bit-identical whatever the storage (statistics, LSE, parameter gradients). */
static void f32_same_impl(const char *file, int line, const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(a[i] != a[i] && b[i] != b[i])) {
            test_fail(file, line, "%s: element %zu of %zu differs: %.9g vs %.9g", what, i, n, (double)a[i],
                      (double)b[i]);
            return;
        }
}
#define F32_SAME(what, a, b, n) f32_same_impl(__FILE__, __LINE__, what, a, b, n)

static float *f32_rand(size_t n, unsigned long long seed, float lo, float hi) {
    float *x = tb_alloc(n * sizeof(float));
    test_fill_uniform(x, n, seed, lo, hi);
    return x;
}
static float *f32_copy(const float *x, size_t n) {
    float *y = tb_alloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static const kb_dtype DTYPES[2] = {KB_F32, KB_BF16};

/* ---- bf16 conversion ---- */

/* The nearest bf16 by exhaustive comparison of the two candidates in double; ties to the even mantissa. */
static uint16_t bf16_ref(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    if ((u & 0x7fffffffu) == 0x7f800000u) return (uint16_t)(u >> 16);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4), memcpy(&fhi, &hi, 4);
    double dlo = fabs((double)f - (double)flo);
    double dhi = (hi & 0x7fffffffu) >= 0x7f800000u ? /* rounding up reaches inf: its "value" is 2^128 */
                     fabs(fabs((double)f) - ldexp(1.0, 128))
                                                   : fabs((double)f - (double)fhi);
    if (dlo < dhi) return (uint16_t)(lo >> 16);
    if (dhi < dlo) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

TEST(kbody_bf16_round_to_nearest_even) {
    struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 */
        {0x3f808000u, 0x3f80}, /* tie, even below */
        {0x3f818000u, 0x3f82}, /* tie, odd below: up */
        {0x3f808001u, 0x3f81}, /* just above the tie */
        {0x3f807fffu, 0x3f80}, /* just below the tie */
        {0x80000000u, 0x8000}, /* -0 */
        {0x00000001u, 0x0000}, /* smallest subnormal rounds to +0 */
        {0x00008000u, 0x0000}, /* subnormal tie, even */
        {0x00018000u, 0x0002}, /* subnormal tie, odd: up */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to +inf */
        {0xff7fffffu, 0xff80}, /* -FLT_MAX to -inf */
        {0x7f7f7fffu, 0x7f7f}, /* stays finite */
        {0x7f800000u, 0x7f80}, /* +inf */
        {0xff800000u, 0xff80}, /* -inf */
        {0x7fc00000u, 0x7fc0}, /* quiet NaN */
        {0x7f800001u, 0x7fc0}, /* signalling NaN with a low payload: quiet, never inf */
        {0xffffffffu, 0xffff}, /* negative NaN */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kb_bf16 h = kb_bf16_from_f32(bits_f(cases[i].in));
        CHECK_MSG(h.bits == cases[i].out, "bf16(0x%08x) = 0x%04x, want 0x%04x", cases[i].in, h.bits, cases[i].out);
    }
    /* Every bf16 value converts back and forth exactly; ties and near-ties around every bf16 value; random bits. */
    for (uint32_t b = 0; b < 0x10000u; b++) {
        uint32_t u = b << 16;
        if ((u & 0x7fffffffu) > 0x7f800000u) continue;
        kb_bf16 h = kb_bf16_from_f32(bits_f(u));
        REQUIRE(h.bits == b);
        uint32_t probes[4] = {u | 0x8000u, u | 0x7fffu, u | 0x8001u, u | 0xffffu};
        for (int k = 0; k < 4; k++) {
            float f = bits_f(probes[k]);
            if (f != f) continue;
            uint16_t want = bf16_ref(f), got = kb_bf16_from_f32(f).bits;
            if (got != want) {
                CHECK_MSG(0, "bf16(0x%08x) = 0x%04x, want 0x%04x", probes[k], got, want);
                return;
            }
        }
    }
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 1000000; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(s >> 32);
        float f = bits_f(u);
        uint16_t want = bf16_ref(f), got = kb_bf16_from_f32(f).bits;
        if (got != want) {
            CHECK_MSG(0, "bf16(0x%08x) = 0x%04x, want 0x%04x", u, got, want);
            return;
        }
    }
}

/* ---- LayerNorm, RMSNorm ---- */

/* affine: 0 none, 1 w and b. */
static void run_layernorm(kb_dtype t, int N, int C, int affine, unsigned long long seed) {
    tb_t x = tb_make((size_t)N * C, t, seed, -2.0f, 3.0f), w = tb_make((size_t)C, t, seed + 1, 0.5f, 1.5f),
         b = tb_make((size_t)C, t, seed + 2, -0.5f, 0.5f), out = tb_make((size_t)N * C, t, seed + 3, 0, 1),
         dout = tb_make((size_t)N * C, t, seed + 4, -1, 1), dx = tb_make((size_t)N * C, t, seed + 5, -1, 1);
    float *mean = tb_alloc(N * sizeof(float)), *rstd = tb_alloc(N * sizeof(float));
    float *bmean = tb_alloc(N * sizeof(float)), *brstd = tb_alloc(N * sizeof(float));
    float *dw = f32_rand(C, seed + 6, -1, 1), *db = f32_rand(C, seed + 7, -1, 1);
    float *bdw = f32_copy(dw, C), *bdb = f32_copy(db, C);
    kb_in nil = {NULL, t};

    k_cpu_ops.layernorm_forward(out.ref, mean, rstd, x.ref, affine ? w.ref : NULL, affine ? b.ref : NULL, N, C,
                                1e-6f);
    kbh_layernorm_forward(tb_out(&out), bmean, brstd, tb_in(&x), affine ? tb_in(&w) : nil, affine ? tb_in(&b) : nil,
                          N, C, 1e-6f);
    TB_CHECK("layernorm_forward out", &out);
    F32_SAME("layernorm_forward mean", bmean, mean, N);
    F32_SAME("layernorm_forward rstd", brstd, rstd, N);

    k_cpu_ops.layernorm_backward(dx.ref, affine ? dw : NULL, affine ? db : NULL, dout.ref, x.ref,
                                 affine ? w.ref : NULL, mean, rstd, N, C);
    kbh_norm_backward(0, tb_out(&dx), kb_out_f32(affine ? bdw : NULL), kb_out_f32(affine ? bdb : NULL), tb_in(&dout),
                      tb_in(&x), affine ? tb_in(&w) : nil, bmean, brstd, N, C);
    TB_CHECK("layernorm_backward dx", &dx);
    F32_SAME("layernorm_backward dw", bdw, dw, C);
    F32_SAME("layernorm_backward db", bdb, db, C);

    tb_free(&x), tb_free(&w), tb_free(&b), tb_free(&out), tb_free(&dout), tb_free(&dx);
    free(mean), free(rstd), free(bmean), free(brstd), free(dw), free(db), free(bdw), free(bdb);
}

static void run_rmsnorm(kb_dtype t, int N, int C, int has_w, unsigned long long seed) {
    tb_t x = tb_make((size_t)N * C, t, seed, -2.0f, 3.0f), w = tb_make((size_t)C, t, seed + 1, 0.5f, 1.5f),
         out = tb_make((size_t)N * C, t, seed + 3, 0, 1), dout = tb_make((size_t)N * C, t, seed + 4, -1, 1),
         dx = tb_make((size_t)N * C, t, seed + 5, -1, 1);
    float *rstd = tb_alloc(N * sizeof(float)), *brstd = tb_alloc(N * sizeof(float));
    float *dw = f32_rand(C, seed + 6, -1, 1), *bdw = f32_copy(dw, C);
    kb_in nil = {NULL, t};

    k_cpu_ops.rmsnorm_forward(out.ref, rstd, x.ref, has_w ? w.ref : NULL, N, C, 1e-6f);
    kbh_rmsnorm_forward(tb_out(&out), brstd, tb_in(&x), has_w ? tb_in(&w) : nil, N, C, 1e-6f);
    TB_CHECK("rmsnorm_forward out", &out);
    F32_SAME("rmsnorm_forward rstd", brstd, rstd, N);

    k_cpu_ops.rmsnorm_backward(dx.ref, has_w ? dw : NULL, dout.ref, x.ref, has_w ? w.ref : NULL, rstd, N, C);
    kbh_norm_backward(1, tb_out(&dx), kb_out_f32(has_w ? bdw : NULL), kb_out_f32(NULL), tb_in(&dout), tb_in(&x),
                      has_w ? tb_in(&w) : nil, NULL, brstd, N, C);
    TB_CHECK("rmsnorm_backward dx", &dx);
    F32_SAME("rmsnorm_backward dw", bdw, dw, C);

    tb_free(&x), tb_free(&w), tb_free(&out), tb_free(&dout), tb_free(&dx);
    free(rstd), free(brstd), free(dw), free(bdw);
}

TEST(kbody_norms_match_cpu_ops) {
    for (int k = 0; k < 2; k++) {
        /* C = 70: 4 full lane passes and a 6-element tail; C = 5: fewer elements than lanes; C = 384: RMSNorm over
         * the heads of a small model (H*Dh = 12*32). */
        run_layernorm(DTYPES[k], 29, 70, 1, 11);
        run_layernorm(DTYPES[k], 17, 384, 0, 12);
        run_layernorm(DTYPES[k], 9, 5, 1, 13);
        run_rmsnorm(DTYPES[k], 29, 70, 1, 14);
        run_rmsnorm(DTYPES[k], 17, 384, 1, 15);
        run_rmsnorm(DTYPES[k], 9, 5, 0, 16);
    }
}

/* The norm weight/bias gradients' fixed-order parallel reduction (kb_norm.h): 128-row ranges, each summed in order
 * in double, then the ranges in order. Against a plain restatement of that order, bit for bit, at N = 300 (ranges
 * of 128, 128, 44) with fp32 and bf16 storage; against k_cpu_ops (rows in order) within 1e-6. Then data on which the
 * two orders differ: RMSNorm dw with rstd 1, x = 2^60 at row 0, -2^60 at row 128, 1 elsewhere, dout 1: rows in
 * order give N - 129 (the ones of range 0 vanish next to 2^60, those after row 128 count), ranges give 44 (range 1's
 * ones vanish next to -2^60 too). */
static void norm_param_ref(const float *dout, const float *x, const float *mean, const float *rstd, int N, int C,
                           float *dw, float *db) {
    for (int c = 0; c < C; c++) {
        double tw = 0.0, tb = 0.0;
        for (int r0 = 0; r0 < N; r0 += 128) {
            double sw = 0.0, sb = 0.0;
            for (int n = r0; n < N && n < r0 + 128; n++) {
                float xh = (x[(size_t)n * C + c] - (mean ? mean[n] : 0.0f)) * rstd[n], g = dout[(size_t)n * C + c];
                sw += (double)g * (double)xh;
                sb += (double)g;
            }
            tw += sw, tb += sb;
        }
        dw[c] += (float)tw;
        if (db) db[c] += (float)tb;
    }
}

TEST(kbody_norm_param_ranges) {
    const int N = 300, C = 70;
    for (int k = 0; k < 2; k++) {
        kb_dtype t = DTYPES[k];
        tb_t x = tb_make((size_t)N * C, t, 71, -2.0f, 3.0f), dout = tb_make((size_t)N * C, t, 72, -1, 1);
        float *mean = f32_rand(N, 73, -0.5f, 0.5f), *rstd = f32_rand(N, 74, 0.5f, 2.0f);
        float *dw = f32_rand(C, 75, -1, 1), *db = f32_rand(C, 76, -1, 1);
        float *bdw = f32_copy(dw, C), *bdb = f32_copy(db, C), *rdw = f32_copy(dw, C), *rdb = f32_copy(db, C);
        kb_out none = {NULL, t};
        kbh_norm_backward(0, none, kb_out_f32(bdw), kb_out_f32(bdb), tb_in(&dout), tb_in(&x), (kb_in){NULL, t}, mean,
                          rstd, N, C);
        norm_param_ref(dout.ref, x.ref, mean, rstd, N, C, rdw, rdb);
        F32_SAME("norm param ranges dw", bdw, rdw, C);
        F32_SAME("norm param ranges db", bdb, rdb, C);
        k_cpu_ops.layernorm_backward(NULL, dw, db, dout.ref, x.ref, NULL, mean, rstd, N, C);
        double worst = 0;
        for (int c = 0; c < C; c++) {
            double e1 = fabs((double)bdw[c] - dw[c]) / (fabs(dw[c]) + 1e-30), e2 = fabs((double)bdb[c] - db[c]) / (fabs(db[c]) + 1e-30);
            worst = fmax(worst, fmax(e1, e2));
        }
        CHECK_MSG(worst <= 1e-6, "ranges vs rows in order: worst rel %.3e", worst);
        tb_free(&x), tb_free(&dout);
        free(mean), free(rstd), free(dw), free(db), free(bdw), free(bdb), free(rdw), free(rdb);
    }
    /* the order is observable */
    float *x = tb_alloc((size_t)N * sizeof(float)), *g = tb_alloc((size_t)N * sizeof(float));
    float *rstd = tb_alloc((size_t)N * sizeof(float));
    for (int n = 0; n < N; n++) x[n] = 1.0f, g[n] = 1.0f, rstd[n] = 1.0f;
    x[0] = 0x1p60f, x[128] = -0x1p60f;
    float dw_body = 0.0f, dw_cpu = 0.0f;
    kb_out none = {NULL, KB_F32};
    kbh_norm_backward(1, none, kb_out_f32(&dw_body), none, kb_in_f32(g), kb_in_f32(x), (kb_in){NULL, KB_F32}, NULL,
                      rstd, N, 1);
    k_cpu_ops.rmsnorm_backward(NULL, &dw_cpu, g, x, NULL, rstd, N, 1);
    printf("  dw at a cancelling column: ranges %.0f, rows in order %.0f\n", dw_body, dw_cpu);
    CHECK(dw_body == 44.0f);
    CHECK(dw_cpu == (float)(N - 129));
    free(x), free(g), free(rstd);
}

/* The broadcast modulation gradients' range reduction (kb_modulate.h), as kbody_norm_param_ranges: S = 300 tokens
 * (ranges 128, 128, 44), B = 2, against k_cpu_ops (tokens in order) within 1e-6, fp32 and bf16 storage; then a
 * column where the orders differ: gate residual dgate with y = 2^60 at token 0, -2^60 at token 128, 1 elsewhere,
 * dout 1: tokens in order give S - 129, ranges 44. */
TEST(kbody_mod_col_ranges) {
    const int B = 2, S = 300, D = 24, stride = 6 * D;
    const size_t nx = (size_t)B * S * D, nmod = (size_t)B * stride;
    for (int k = 0; k < 2; k++) {
        kb_dtype t = DTYPES[k];
        tb_t x = tb_make(nx, t, 81, -2, 2), dout = tb_make(nx, t, 82, -1, 1), sc = tb_make(nmod, t, 83, -0.5f, 0.5f);
        float *dsh = f32_rand(nmod, 84, -1, 1), *dsc = f32_rand(nmod, 85, -1, 1);
        float *bdsh = f32_copy(dsh, nmod), *bdsc = f32_copy(dsc, nmod);
        kb_out none = {NULL, t};
        kbh_modulate_backward(none, kb_out_f32(bdsh), kb_out_f32(bdsc), tb_in(&dout), tb_in(&x), tb_in(&sc), B, S, D, 0,
                              stride);
        k_cpu_ops.modulate_backward(NULL, dsh, dsc, dout.ref, x.ref, sc.ref, B, S, D, 0, stride);
        double worst = 0;
        for (size_t i = 0; i < nmod; i++) {
            worst = fmax(worst, fabs((double)bdsh[i] - dsh[i]) / (fabs(dsh[i]) + 1e-30));
            worst = fmax(worst, fabs((double)bdsc[i] - dsc[i]) / (fabs(dsc[i]) + 1e-30));
        }
        CHECK_MSG(worst <= 1e-6, "ranges vs tokens in order: worst rel %.3e", worst);
        tb_free(&x), tb_free(&dout), tb_free(&sc);
        free(dsh), free(dsc), free(bdsh), free(bdsc);
    }
    float *y = tb_alloc((size_t)S * sizeof(float)), *g = tb_alloc((size_t)S * sizeof(float));
    float gate = 0.5f, dg_body = 0.0f, dg_cpu = 0.0f;
    for (int s = 0; s < S; s++) y[s] = 1.0f, g[s] = 1.0f;
    y[0] = 0x1p60f, y[128] = -0x1p60f;
    kb_out none = {NULL, KB_F32};
    kbh_gate_residual_backward(none, none, kb_out_f32(&dg_body), kb_in_f32(g), kb_in_f32(y), kb_in_f32(&gate), 1, S, 1,
                               0, 1);
    k_cpu_ops.gate_residual_backward(NULL, NULL, &dg_cpu, g, y, &gate, 1, S, 1, 0, 1);
    printf("  dgate at a cancelling column: ranges %.0f, tokens in order %.0f\n", dg_body, dg_cpu);
    CHECK(dg_body == 44.0f);
    CHECK(dg_cpu == (float)(S - 129));
    free(y), free(g);
}

/* kb_index.h's division by an invariant divisor against '/', on edge and random values below 2^31; and the rope
 * table map in 32 bits (what the kernel and the emulated device run) against its 64-bit reference. */
TEST(kbody_fdiv_exact) {
    const uint32_t ds[] = {1, 2, 3, 5, 6, 7, 12, 64, 96, 127, 128, 129, 1536, 5120, 32760, 65535, 65536, 65537,
                           1000003, 0x7fffu * 0x10001u, (1u << 30) - 1, 1u << 30, (1u << 30) + 1, 0x7ffffffeu, 0x7fffffffu};
    uint64_t st = 12345;
    long bad = 0;
    for (size_t k = 0; k < sizeof ds / sizeof ds[0]; k++) {
        const uint32_t d = ds[k];
        const kb_fdiv f = kb_fdiv_make(d);
        uint32_t as[12] = {0, 1, d - 1, d, d + 1 > d ? d + 1 : d, 2 * (uint64_t)d - 1 < 0x80000000u ? 2 * d - 1 : d,
                           0x7fffffffu, 0x7ffffffeu, 0x7fffffffu - 0x7fffffffu % d, 0x7fffffffu / 2, 1u << 30, 77};
        for (int i = 0; i < 12; i++) {
            const uint32_t a = as[i] & 0x7fffffffu;
            uint32_t r, q = kb_fdiv_qr(a, f, &r);
            if (q != a / d || r != a % d) bad++;
        }
        for (int i = 0; i < 200000; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            const uint32_t a = (uint32_t)(st >> 33); /* < 2^31 */
            if (kb_fdiv_q(a, f) != a / d) bad++;
        }
    }
    CHECK_MSG(bad == 0, "%ld quotients differ", bad);
    const int shapes[][4] = {{2, 30, 3, 12}, {1, 7, 12, 64}, {3, 5, 40, 64}, {1, 1, 1, 1}};
    for (int k = 0; k < 4; k++) {
        const int B = shapes[k][0], S = shapes[k][1], H = shapes[k][2], half = shapes[k][3];
        const kb_rope_div v = kb_rope_div_make(S, H, half);
        for (size_t p = 0; p < (size_t)B * S * H * half; p++)
            if (kb_rope_table_index32((uint32_t)p, &v) != kb_rope_table_index(p, S, H, half)) bad++;
    }
    CHECK_MSG(bad == 0, "%ld rope table indices differ", bad);
}

/* ---- RoPE ---- */

TEST(kbody_rope_matches_cpu_ops) {
    const int B = 2, F = 3, Hp = 2, Wp = 5, S = F * Hp * Wp, H = 3, Dh = 24, half = Dh / 2;
    float *cs = tb_alloc((size_t)S * half * sizeof(float)), *sn = tb_alloc((size_t)S * half * sizeof(float));
    REQUIRE_OK(k_wan_rope_table(cs, sn, F, Hp, Wp, Dh, 10000.0, 1024));
    size_t n = (size_t)B * S * H * Dh;
    for (int k = 0; k < 2; k++) {
        kb_dtype t = DTYPES[k];
        tb_t x = tb_make(n, t, 21, -2, 2), out = tb_make(n, t, 22, 0, 1), dout = tb_make(n, t, 23, -1, 1),
             dx = tb_make(n, t, 24, -1, 1);
        k_cpu_ops.rope_forward(out.ref, x.ref, cs, sn, B, S, H, Dh);
        kbh_rope(0, tb_out(&out), tb_in(&x), cs, sn, B, S, H, Dh);
        TB_CHECK("rope_forward", &out);
        k_cpu_ops.rope_forward(x.ref, x.ref, cs, sn, B, S, H, Dh); /* in place */
        kbh_rope(0, tb_out(&x), tb_in(&x), cs, sn, B, S, H, Dh);
        TB_CHECK("rope_forward in place", &x);
        k_cpu_ops.rope_backward(dx.ref, dout.ref, cs, sn, B, S, H, Dh);
        kbh_rope(1, tb_out(&dx), tb_in(&dout), cs, sn, B, S, H, Dh);
        TB_CHECK("rope_backward", &dx);
        tb_free(&x), tb_free(&out), tb_free(&dout), tb_free(&dx);
    }
    free(cs), free(sn);
}

/* ---- GELU, SiLU ---- */

TEST(kbody_activations_match_cpu_ops) {
    const int64_t n = 5003;
    for (int k = 0; k < 2; k++) {
        kb_dtype t = DTYPES[k];
        tb_t x = tb_make(n, t, 31, -9, 9), out = tb_make(n, t, 32, 0, 1), dout = tb_make(n, t, 33, -1, 1),
             dx = tb_make(n, t, 34, -1, 1);
        /* the clamps of exp: far outside [-87, 88] */
        x.ref[0] = -100.0f, x.ref[1] = 100.0f, x.ref[2] = 0.0f, x.ref[3] = -0.0f;
        for (int i = 0; i < 4; i++) kb_set(tb_out(&x), (size_t)i, x.ref[i]);
        for (int gelu = 0; gelu < 2; gelu++) {
            const char *fw = gelu ? "gelu_forward" : "silu_forward", *bw = gelu ? "gelu_backward" : "silu_backward";
            (gelu ? k_cpu_ops.gelu_forward : k_cpu_ops.silu_forward)(out.ref, x.ref, n);
            kbh_act_forward(gelu, tb_out(&out), tb_in(&x), n);
            TB_CHECK(fw, &out);
            (gelu ? k_cpu_ops.gelu_backward : k_cpu_ops.silu_backward)(dx.ref, dout.ref, x.ref, n);
            kbh_act_backward(gelu, tb_out(&dx), tb_in(&dout), tb_in(&x), n);
            TB_CHECK(bw, &dx);
        }
        tb_free(&x), tb_free(&out), tb_free(&dout), tb_free(&dx);
    }
}

/* ---- AdaLN modulation, gated residual ---- */

TEST(kbody_modulation_matches_cpu_ops) {
    const int B = 2, S = 37, D = 48;
    for (int k = 0; k < 2; k++)
        for (int per_token = 0; per_token < 2; per_token++) {
            kb_dtype t = DTYPES[k];
            /* rows inside a [.., 6, D] table (stride 6D), starting at block 1 */
            int stride = 6 * D;
            size_t nmod = (size_t)B * (per_token ? S : 1) * stride, nx = (size_t)B * S * D;
            tb_t table = tb_make(nmod, t, 41, -0.5f, 0.5f), x = tb_make(nx, t, 42, -2, 2),
                 y = tb_make(nx, t, 43, -2, 2), out = tb_make(nx, t, 44, 0, 1), dout = tb_make(nx, t, 45, -1, 1),
                 dx = tb_make(nx, t, 46, -1, 1), dy = tb_make(nx, t, 47, -1, 1);
            /* modulation gradients: fp32 (on the GPU the [B, 6, D] table's gradient is fp32) */
            float *dtab = f32_rand(nmod, 48, -1, 1), *bdtab = f32_copy(dtab, nmod);
            const size_t sh = D, sc = 2 * (size_t)D, gt = 3 * (size_t)D; /* shift, scale, gate rows */
            kb_in tin = tb_in(&table);
            kb_in shv = {(const char *)tin.p + sh * (t == KB_BF16 ? 2 : 4), t};
            kb_in scv = {(const char *)tin.p + sc * (t == KB_BF16 ? 2 : 4), t};
            kb_in gtv = {(const char *)tin.p + gt * (t == KB_BF16 ? 2 : 4), t};

            k_cpu_ops.modulate_forward(out.ref, x.ref, table.ref + sh, table.ref + sc, B, S, D, per_token, stride);
            kbh_modulate_forward(tb_out(&out), tb_in(&x), shv, scv, B, S, D, per_token, stride);
            TB_CHECK(per_token ? "modulate_forward per token" : "modulate_forward", &out);

            k_cpu_ops.modulate_backward(dx.ref, dtab + sh, dtab + sc, dout.ref, x.ref, table.ref + sc, B, S, D,
                                        per_token, stride);
            kbh_modulate_backward(tb_out(&dx), kb_out_f32(bdtab + sh), kb_out_f32(bdtab + sc), tb_in(&dout),
                                  tb_in(&x), scv, B, S, D, per_token, stride);
            TB_CHECK("modulate_backward dx", &dx);
            F32_SAME("modulate_backward dshift, dscale", bdtab, dtab, nmod);

            k_cpu_ops.gate_residual_forward(out.ref, x.ref, y.ref, table.ref + gt, B, S, D, per_token, stride);
            kbh_gate_residual_forward(tb_out(&out), tb_in(&x), tb_in(&y), gtv, B, S, D, per_token, stride);
            TB_CHECK("gate_residual_forward", &out);

            k_cpu_ops.gate_residual_backward(dx.ref, dy.ref, dtab + gt, dout.ref, y.ref, table.ref + gt, B, S, D,
                                             per_token, stride);
            kbh_gate_residual_backward(tb_out(&dx), tb_out(&dy), kb_out_f32(bdtab + gt), tb_in(&dout), tb_in(&y),
                                       gtv, B, S, D, per_token, stride);
            TB_CHECK("gate_residual_backward dx", &dx);
            TB_CHECK("gate_residual_backward dy", &dy);
            F32_SAME("gate_residual_backward dgate", bdtab, dtab, nmod);

            tb_free(&table), tb_free(&x), tb_free(&y), tb_free(&out), tb_free(&dout), tb_free(&dx), tb_free(&dy);
            free(dtab), free(bdtab);
        }
}

/* ---- patchify, unpatchify ---- */

TEST(kbody_patch_layouts_match_cpu_ops) {
    /* Wan's (1, 2, 2) patch, and (2, 3, 2) on sizes with remainders */
    const int shapes[2][8] = {{2, 4, 3, 6, 8, 1, 2, 2}, {1, 3, 5, 7, 5, 2, 3, 2}};
    for (int k = 0; k < 2; k++)
        for (int sh = 0; sh < 2; sh++) {
            kb_dtype t = DTYPES[k];
            const int *q = shapes[sh];
            kb_patch_dims d = kb_patch_dims_make(q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]);
            size_t nv = kb_patch_video_n(&d), ntok = kb_patch_tokens_n(&d);
            tb_t video = tb_make(nv, t, 51, -2, 2), tok = tb_make(ntok, t, 52, -2, 2), otok = tb_make(ntok, t, 53, 0, 1),
                 ovid = tb_make(nv, t, 54, 0, 1), dvid = tb_make(nv, t, 55, -1, 1), dtok = tb_make(ntok, t, 56, -1, 1);
            k_cpu_ops.patchify_forward(otok.ref, video.ref, d.B, d.C, d.F, d.H, d.W, d.pt, d.ph, d.pw);
            kbh_patchify_forward(tb_out(&otok), tb_in(&video), &d);
            TB_CHECK_EXACT("patchify_forward", &otok);
            k_cpu_ops.patchify_backward(dvid.ref, tok.ref, d.B, d.C, d.F, d.H, d.W, d.pt, d.ph, d.pw);
            kbh_patchify_backward(tb_out(&dvid), tb_in(&tok), &d);
            TB_CHECK("patchify_backward", &dvid);
            k_cpu_ops.unpatchify_forward(ovid.ref, tok.ref, d.B, d.C, d.F, d.H, d.W, d.pt, d.ph, d.pw);
            kbh_unpatchify_forward(tb_out(&ovid), tb_in(&tok), &d);
            TB_CHECK_EXACT("unpatchify_forward", &ovid);
            k_cpu_ops.unpatchify_backward(dtok.ref, video.ref, d.B, d.C, d.F, d.H, d.W, d.pt, d.ph, d.pw);
            kbh_unpatchify_backward(tb_out(&dtok), tb_in(&video), &d);
            TB_CHECK("unpatchify_backward", &dtok);
            tb_free(&video), tb_free(&tok), tb_free(&otok), tb_free(&ovid), tb_free(&dvid), tb_free(&dtok);
        }
}

/* ---- LSE merge ---- */

TEST(kbody_lse_merge_matches_cpu_ops) {
    const int B = 2, S = 11, H = 3, Dh = 16;
    size_t no = (size_t)B * S * H * Dh, nl = (size_t)B * H * S;
    for (int k = 0; k < 2; k++) {
        kb_dtype t = DTYPES[k];
        tb_t o1 = tb_make(no, t, 61, -1, 1), o2 = tb_make(no, t, 62, -1, 1), o = tb_make(no, t, 63, 0, 1),
             dout = tb_make(no, t, 64, -1, 1), do1 = tb_make(no, t, 65, -1, 1), do2 = tb_make(no, t, 66, -1, 1);
        float *l1 = f32_rand(nl, 67, -3, 5), *l2 = f32_rand(nl, 68, -3, 5), *dlse = f32_rand(nl, 69, -1, 1);
        l1[0] = -INFINITY, l2[1] = -INFINITY, l1[2] = l2[2] = -INFINITY; /* empty partials */
        float *lse = tb_alloc(nl * sizeof(float)), *blse = tb_alloc(nl * sizeof(float));
        float *dl1 = f32_rand(nl, 70, -1, 1), *dl2 = f32_rand(nl, 71, -1, 1), *bdl1 = f32_copy(dl1, nl),
              *bdl2 = f32_copy(dl2, nl);
        k_cpu_ops.lse_merge_forward(o.ref, lse, o1.ref, l1, o2.ref, l2, B, S, H, Dh);
        kbh_lse_merge_forward(tb_out(&o), blse, tb_in(&o1), l1, tb_in(&o2), l2, B, S, H, Dh);
        TB_CHECK("lse_merge_forward o", &o);
        F32_SAME("lse_merge_forward lse", blse, lse, nl);
        k_cpu_ops.lse_merge_backward(do1.ref, dl1, do2.ref, dl2, dout.ref, dlse, o1.ref, l1, o2.ref, l2, B, S, H, Dh);
        kbh_lse_merge_backward(tb_out(&do1), bdl1, tb_out(&do2), bdl2, tb_in(&dout), dlse, tb_in(&o1), l1, tb_in(&o2),
                               l2, B, S, H, Dh);
        TB_CHECK("lse_merge_backward do1", &do1);
        TB_CHECK("lse_merge_backward do2", &do2);
        F32_SAME("lse_merge_backward dlse1", bdl1, dl1, nl);
        F32_SAME("lse_merge_backward dlse2", bdl2, dl2, nl);
        tb_free(&o1), tb_free(&o2), tb_free(&o), tb_free(&dout), tb_free(&do1), tb_free(&do2);
        free(l1), free(l2), free(dlse), free(lse), free(blse), free(dl1), free(dl2), free(bdl1), free(bdl2);
    }
}

/* ---- the CUDA backend's availability answer ----
 * A plain build says it was built without the backend; a `make cuda` build on a machine without a GPU says what is
 * missing; either way one line, and the caller goes on with the CPU. With a usable GPU the answer is 1. */
TEST(kbody_cuda_available_answers_one_line) {
    char why[K_WHY_MAX];
    memset(why, 'x', sizeof why);
    int ok = k_cuda_available(why);
    CHECK(ok == 0 || ok == 1);
    if (ok) {
        CHECK(why[0] == 0);
        return;
    }
    size_t len = strnlen(why, sizeof why);
    CHECK_MSG(len > 0 && len < sizeof why, "why is empty or unterminated");
    CHECK_MSG(strchr(why, '\n') == NULL, "why spans lines: %s", why);
#ifndef VGRPO_CUDA
    CHECK_MSG(strstr(why, "built without the CUDA backend") != NULL, "why: %s", why);
#endif
    CHECK(k_cuda_available(NULL) == 0); /* asking again, without a buffer, is fine */
}
