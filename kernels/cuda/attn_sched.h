/* kernels/cuda/attn_sched.h — how an attention call is cut into cuDNN plan executions (attn_cudnn.c): pure
 * arithmetic, no CUDA, so `make test` checks it on the plain build (tests/test_attn_sched.c).
 *
 * A plan covers ONE batch element and a group of hc of its H heads; a call of batch B is B * H / hc executions of
 * that one plan, element-major. Execution i reads element b = i / (H / hc), heads h0 = (i % (H / hc)) * hc ..
 * h0 + hc - 1: q/o/dq at element offset (b * Sq * H + h0) * Dh of the [B, Sq, H, Dh] tensors, k/v/dk/dv at
 * (b * Skv * H + h0) * Dh, the LSE [B, H, Sq] at (b * H + h0) * Sq. A sample's executions are the same whatever
 * B is (the batch invariance parity 0 needs). */
#ifndef KERNELS_CUDA_ATTN_SCHED_H
#define KERNELS_CUDA_ATTN_SCHED_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* The workspace budget of one attention call in bytes: $VGRPO_ATTN_WORKSPACE_GIB GiB, default 4 (a value <= 0 or
 * not a number: 4). Here, not in attn_cudnn.c, so the device-memory estimate (trainer/budget/train_dev_budget.c) reads the
 * same figure without the CUDA build. Every process of a run must see the same value (its head groups follow). */
static inline int64_t kc_attn_workspace_budget(void) {
    const char *e = getenv("VGRPO_ATTN_WORKSPACE_GIB");
    double gib = e && *e ? atof(e) : 4.0;
    if (!(gib > 0)) gib = 4.0;
    return (int64_t)(gib * 1073741824.0);
}

/* Heads per execution: H for the forward and the non-deterministic backward; for the deterministic backward the
 * largest divisor of H whose dP workspace (hc * pad128(Sq) * pad128(Skv) * 2 bytes, measured from cuDNN 9.19's
 * configurations, plus 1 MiB of slack for cuDNN's own few hundred bytes) fits budget bytes; at least 1. */
static inline int kc_attn_heads_per_call(int bwd, int deterministic, int Sq, int Skv, int H, int64_t budget) {
    if (!bwd || !deterministic) return H;
    const int64_t per_head = ((int64_t)Sq + 127) / 128 * 128 * (((int64_t)Skv + 127) / 128 * 128) * 2;
    for (int hc = H; hc > 1; hc--)
        if (H % hc == 0 && hc * per_head + (1 << 20) <= budget) return hc;
    return 1;
}

/* Element offsets of one execution (see above). */
typedef struct kc_attn_exec {
    int b, h0;
    size_t q, kv, lse;
} kc_attn_exec;

static inline int kc_attn_executions(int B, int H, int hc) { return B * (H / hc); }

static inline kc_attn_exec kc_attn_execution(int i, int Sq, int Skv, int H, int hc, int Dh) {
    const int per = H / hc, b = i / per, h0 = i % per * hc;
    kc_attn_exec e = {b, h0, ((size_t)b * Sq * H + h0) * Dh, ((size_t)b * Skv * H + h0) * Dh,
                      ((size_t)b * H + h0) * Sq};
    return e;
}

#endif
