/* tests/test_attn_sched.c — how the CUDA backend cuts an attention call into executions of one cuDNN plan
 * (kernels/cuda/attn_sched.h): the same plan and the same per-sample executions for batch 1, 2 and 8 (batch
 * invariance), every (element, head) covered once, 16-byte aligned operands, and the head groups that keep the
 * deterministic backward's workspace within the budget at the Wan shapes. Plain build: no CUDA needed. */
#include <string.h>

#include "kernels/cuda/attn_sched.h"
#include "tests/test.h"

TEST(attn_sched_batch_invariant) {
    /* Wan 1.3B self-attention backward at 32,760 tokens, one head per execution, and the tiny shape's 4 */
    const int shapes[2][4] = {{32760, 32760, 12, 128}, {64, 16, 4, 32}};
    const int64_t budget = 4LL << 30;
    for (int s = 0; s < 2; s++) {
        const int Sq = shapes[s][0], Skv = shapes[s][1], H = shapes[s][2], Dh = shapes[s][3];
        const int hc = kc_attn_heads_per_call(1, 1, Sq, Skv, H, budget);
        const int Bs[3] = {1, 2, 8};
        for (int bi = 0; bi < 3; bi++) {
            const int B = Bs[bi], n = kc_attn_executions(B, H, hc);
            CHECK(n == B * H / hc);
            static unsigned char seen[8 * 64];
            memset(seen, 0, sizeof seen);
            for (int i = 0; i < n; i++) {
                const kc_attn_exec e = kc_attn_execution(i, Sq, Skv, H, hc, Dh);
                /* relative to its sample, an execution is the batch-1 execution of the same head group */
                const kc_attn_exec one = kc_attn_execution(i % (H / hc), Sq, Skv, H, hc, Dh);
                CHECK(e.q - (size_t)e.b * Sq * H * Dh == one.q && e.kv - (size_t)e.b * Skv * H * Dh == one.kv &&
                      e.lse - (size_t)e.b * H * Sq == one.lse && e.h0 == one.h0);
                CHECK(e.q * 2 % 16 == 0 && e.kv * 2 % 16 == 0 && (Sq % 4 || e.lse * 4 % 16 == 0));
                for (int h = e.h0; h < e.h0 + hc; h++) seen[e.b * H + h]++;
            }
            for (int j = 0; j < B * H; j++) CHECK_MSG(seen[j] == 1, "B %d: (element, head) %d covered %d times", B, j,
                                                      seen[j]);
        }
    }
}

TEST(attn_sched_heads_per_call) {
    const int64_t gib = 1LL << 30;
    /* 32,760 tokens: 2 GiB + cuDNN's 256 bytes per head: one head in 4 GiB (two would be 4 GiB + 512 bytes) */
    CHECK(kc_attn_heads_per_call(1, 1, 32760, 32760, 12, 4 * gib) == 1);
    CHECK(kc_attn_heads_per_call(1, 1, 32760, 32760, 40, 4 * gib) == 1);
    CHECK(kc_attn_heads_per_call(1, 1, 32760, 32760, 12, 16 * gib) == 6);
    /* the recipes' 14,040 tokens: 378 MiB per head, 6 of 12 heads in 4 GiB */
    CHECK(kc_attn_heads_per_call(1, 1, 14040, 14040, 12, 4 * gib) == 6);
    /* cross-attention (512 text tokens) and the tiny shape: every head at once */
    CHECK(kc_attn_heads_per_call(1, 1, 32760, 512, 40, 4 * gib) == 40);
    CHECK(kc_attn_heads_per_call(1, 1, 64, 64, 4, 4 * gib) == 4);
    /* the forward and the atomic-dQ backward have no dP workspace: all heads */
    CHECK(kc_attn_heads_per_call(0, 1, 32760, 32760, 12, 4 * gib) == 12);
    CHECK(kc_attn_heads_per_call(1, 0, 32760, 32760, 12, 4 * gib) == 12);
    /* a budget below one head still runs one head (the allocation then names the size) */
    CHECK(kc_attn_heads_per_call(1, 1, 32760, 32760, 12, gib) == 1);
}
