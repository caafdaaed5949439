/* kernels/cuda/check/check_invariance.c — batch invariance of cuBLASLt GEMM and cuDNN attention on the device: the
 * rows of one sample must come out with the same bits whatever else shares the call, since the rollout and the
 * trainer batch samples differently and `vgrpo parity` on the GPU needs exactly 0 (one algorithm per
 * GEMM problem class, one attention plan per (S, H, D, dtype)).
 *
 * Rows (each FAILs when a bit differs, or when the pinned algorithm / engine differs between the sizes):
 *   gemm M-invariance <kind>   rows 0..M-1 of C computed with M = 1, 2, 8 and S/2 against the same rows of the M = S
 *                              call, for the GEMMs whose M is tokens x batch in the Wan DiT: the linear forward (NT,
 *                              bias), the linear backward to the input (NN, bf16 +=), a LoRA down-projection (NT,
 *                              N = 16); note: the algorithm id per M (k_gemm_algo_of)
 *   attention B-invariance     sample 1's O, LSE (forward) and dQ, dK, dV (backward) alone (B 1) against the same
 *                              sample inside a batch of 2 and of 8; note: the cuDNN engine per B
 *                              (k_attention_engine_of)
 * Inputs: uniform random, bf16-representable; shapes: the check's (ck_shapes: S tokens, model dim, heads x 128). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/check/check.h"
#include "kernels/cuda/check/check_util.h"

/* Number of values of a[n] and b[n] whose bits differ. */
static size_t n_differ(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

static int run_gemm(const k_gemm_args *g, ct_t *c, float *out) {
    if (k_dev_zero(c->d, c->n * sizeof(kb_bf16)) || k_cuda_ops.gemm(g) || k_dev_sync()) return -1;
    return ct_pull(c, out);
}

static int algo_id(const k_gemm_args *g) {
    k_gemm_algo_info ai;
    return k_gemm_algo_of(g, &ai) == 0 ? ai.algo_id : -1;
}

/* kind 0: linear forward (NT, bias, N = K = D); 1: linear backward dx (NN, beta 1, N = K = D); 2: LoRA down (NT,
 * N = 16, K = D). */
static void gemm_kind(const ck_shapes *s, int kind) {
    static const char *names[3] = {"gemm M-invariance linear fwd", "gemm M-invariance linear bwd dx",
                                   "gemm M-invariance lora down"};
    const int S = s->S, D = s->D, N = kind == 2 ? 16 : D, K = D;
    char shape[48], note[200];
    snprintf(shape, sizeof shape, "M<=%d N%d K%d %s", S, N, K, kind == 1 ? "NN" : "NT");
    ct_t a, b, bias, c;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b), memset(&bias, 0, sizeof bias), memset(&c, 0, sizeof c);
    float *ref = NULL, *got = NULL;
    const uint64_t sd = s->seed + 1500 + 10 * (uint64_t)kind;
    if (ct_alloc(&a, (size_t)S * K, 1) || ct_alloc(&b, (size_t)N * K, 1) || ct_alloc(&bias, N, 1) ||
        ct_alloc(&c, (size_t)S * N, 1) || ct_rand(&a, sd, -1, 1) || ct_rand(&b, sd + 1, -0.05f, 0.05f) ||
        ct_rand(&bias, sd + 2, -0.5f, 0.5f)) {
        ck_row_error(names[kind], shape, core_last_error());
        goto out;
    }
    k_gemm_args g = {.transA = 0, .transB = kind == 1 ? 0 : 1, .M = S, .N = N, .K = K, .alpha = 1,
                     .beta = kind == 1 ? 1.0f : 0.0f, .A = ct_in(&a), .lda = K, .B = ct_in(&b), .ldb = K,
                     .C = ct_out(&c),
                     .ldc = N, .epi = kind == 0 ? K_EPI_BIAS : K_EPI_NONE, .bias = kind == 0 ? bias.d : NULL};
    ref = ck_floats((size_t)S * N), got = ck_floats((size_t)S * N);
    if (run_gemm(&g, &c, ref)) {
        ck_row_error(names[kind], shape, core_last_error());
        goto out;
    }
    const int ms[4] = {1, 2, 8, S / 2};
    int ids[5], same_algo = 1;
    size_t differ = 0, total = 0;
    ids[4] = algo_id(&g);
    for (int i = 0; i < 4; i++) {
        k_gemm_args h = g;
        h.M = ms[i] < 1 ? 1 : ms[i];
        if (run_gemm(&h, &c, got)) {
            ck_row_error(names[kind], shape, core_last_error());
            goto out;
        }
        differ += n_differ(got, ref, (size_t)h.M * N), total += (size_t)h.M * N;
        ids[i] = algo_id(&h);
        same_algo &= ids[i] == ids[4];
    }
    snprintf(note, sizeof note, "algo M=1 %d, 2 %d, 8 %d, %d %d, %d %d; %zu/%zu values differ", ids[0], ids[1],
             ids[2], S / 2, ids[3], S, ids[4], differ, total);
    ck_row_figures(names[kind], shape, "bf16", total ? (double)differ / total : 0, 0.0, (double)differ, -1,
                   "the M=S call's rows", same_algo, note);
out:
    free(ref), free(got);
    ct_free(&a), ct_free(&b), ct_free(&bias), ct_free(&c);
}

/* Inputs and outputs of up to 8 samples, [B, S, H, Dh] (lse [B, H, S]). */
typedef struct {
    ct_t q, k, v, dout, o, lse, dq, dk, dv;
} attn_bufs;

static void attention_batches(const ck_shapes *s) {
    const char *name = "attention B-invariance";
    const int S = s->S, H = s->H, Dh = s->Dh, BMAX = 8, SMP = 1;
    const size_t row = (size_t)S * H * Dh, lrow = (size_t)H * S;
    const float scale = 1.0f / sqrtf((float)Dh);
    char shape[48], note[200];
    snprintf(shape, sizeof shape, "B1/2/8 S%d H%d D%d", S, H, Dh);
    attn_bufs t;
    memset(&t, 0, sizeof t);
    ct_t *bf[7] = {&t.q, &t.k, &t.v, &t.dout, &t.o, &t.dq, &t.dk};
    float *alone[5] = {NULL}, *got = NULL;
    int ok = 1;
    for (int i = 0; i < 7 && ok; i++) ok = ct_alloc(bf[i], BMAX * row, 1) == 0;
    ok = ok && ct_alloc(&t.dv, BMAX * row, 1) == 0 && ct_alloc(&t.lse, BMAX * lrow, 0) == 0;
    for (int i = 0; i < 4 && ok; i++) ok = ct_rand(bf[i], s->seed + 1600 + (uint64_t)i, -2, 2) == 0;
    if (!ok) {
        ck_row_error(name, shape, core_last_error());
        goto out;
    }
    const int Bs[3] = {1, 2, 8};
    int64_t eng[2][3];
    size_t differ = 0, total = 0;
    got = ck_floats(BMAX * row);
    for (int bi = 0; bi < 3; bi++) {
        const int B = Bs[bi];
        /* B 1 runs sample SMP alone (pointers offset to it); B 2 and 8 hold it at index SMP */
        const size_t off = B == 1 ? SMP * row : 0, loff = B == 1 ? SMP * lrow : 0;
        kb_bf16 *q = (kb_bf16 *)t.q.d + off, *k = (kb_bf16 *)t.k.d + off, *v = (kb_bf16 *)t.v.d + off;
        kb_bf16 *o = (kb_bf16 *)t.o.d + off, *dout = (kb_bf16 *)t.dout.d + off;
        kb_bf16 *dq = (kb_bf16 *)t.dq.d + off, *dk = (kb_bf16 *)t.dk.d + off, *dv = (kb_bf16 *)t.dv.d + off;
        float *lse = (float *)t.lse.d + loff;
        if (k_dev_zero(t.dq.d, t.dq.n * 2) || k_dev_zero(t.dk.d, t.dk.n * 2) || k_dev_zero(t.dv.d, t.dv.n * 2) ||
            k_cuda_ops.attention_forward(kb_out_bf16(o), lse, kb_in_bf16(q), kb_in_bf16(k), kb_in_bf16(v), B, S, S,
                                         H, Dh, scale) ||
            k_cuda_ops.attention_backward(kb_out_bf16(dq), kb_out_bf16(dk), kb_out_bf16(dv), kb_in_bf16(dout),
                                          kb_in_bf16(q), kb_in_bf16(k), kb_in_bf16(v), kb_in_bf16(o), lse, B, S, S, H,
                                          Dh, scale) ||
            k_dev_sync()) {
            ck_row_error(name, shape, core_last_error());
            goto out;
        }
        ct_t *outs[5] = {&t.o, &t.lse, &t.dq, &t.dk, &t.dv};
        for (int j = 0; j < 5; j++) {
            const size_t n = j == 1 ? lrow : row;
            if (ct_pull(outs[j], got)) {
                ck_row_error(name, shape, core_last_error());
                goto out;
            }
            const float *mine = got + SMP * n; /* sample SMP sits at index SMP in every layout above */
            if (bi == 0) {
                alone[j] = ck_floats(n);
                memcpy(alone[j], mine, n * sizeof(float));
            } else {
                differ += n_differ(mine, alone[j], n), total += n;
            }
        }
        for (int bw = 0; bw < 2; bw++) {
            size_t ws = 0;
            eng[bw][bi] = -1;
            k_attention_engine_of(bw, B, S, S, H, Dh, &eng[bw][bi], &ws);
        }
    }
    const int same_eng = eng[0][0] == eng[0][1] && eng[0][0] == eng[0][2] && eng[1][0] == eng[1][1] &&
                         eng[1][0] == eng[1][2];
    snprintf(note, sizeof note, "engine fwd B1 %lld, B2 %lld, B8 %lld; bwd %lld, %lld, %lld; %zu/%zu values differ",
             (long long)eng[0][0], (long long)eng[0][1], (long long)eng[0][2], (long long)eng[1][0],
             (long long)eng[1][1], (long long)eng[1][2], differ, total);
    ck_row_figures(name, shape, "bf16", total ? (double)differ / total : 0, 0.0, (double)differ, -1,
                   "sample 1 alone (B 1)", same_eng, note);
out:
    for (int j = 0; j < 5; j++) free(alone[j]);
    free(got);
    for (int i = 0; i < 7; i++) ct_free(bf[i]);
    ct_free(&t.dv), ct_free(&t.lse);
}

void check_invariance(const ck_shapes *s, const char *only) {
    for (int kind = 0; kind < 3; kind++)
        if (ck_selected("gemm M-invariance", only)) gemm_kind(s, kind);
    if (ck_selected("attention B-invariance", only)) attention_batches(s);
}
