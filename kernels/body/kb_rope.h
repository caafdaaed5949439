/* kernels/body/kb_rope.h — rotary embedding on interleaved pairs, one pair (x[2j], x[2j+1]) per body call.
 * Each product rounded before the add, as torch's fp32 kernel; kernels/cpu/rope.c's loops call these bodies, so
 * fp32 results are bit-identical to k_cpu_ops. cos, sin [S, Dh/2] fp32 from k_wan_rope_table (always fp32, also on
 * the GPU). Reference: diffusers WanAttnProcessor apply_rotary_emb. */
#ifndef KERNELS_BODY_KB_ROPE_H
#define KERNELS_BODY_KB_ROPE_H

#include "kernels/body/kb_base.h"
#include "kernels/body/kb_index.h"

/* y1 = x1 cos - x2 sin; y2 = x1 sin + x2 cos. */
KB_FN void kb_rope_fwd_pair(float x1, float x2, float c, float s, float *y1, float *y2) {
    float a = x1 * c, bb = x2 * s, cc = x1 * s, d = x2 * c;
    *y1 = a - bb;
    *y2 = cc + d;
}

/* The transpose (rotation by -theta): d1 = g1 cos + g2 sin; d2 = g2 cos - g1 sin (to be added to dx). */
KB_FN void kb_rope_bwd_pair(float g1, float g2, float c, float s, float *d1, float *d2) {
    float a = g1 * c, bb = g2 * s, cc = g2 * c, d = g1 * s;
    *d1 = a + bb;
    *d2 = cc - d;
}

/* For pair p of a [B, S, H, Dh] tensor (elements 2p, 2p+1; half = Dh/2 pairs per head), the index of its angle in
 * the [S, half] cos/sin tables: token s = (p / (H * half)) % S, pair j = p % half. */
KB_FN size_t kb_rope_table_index(size_t p, int S, int H, int half) {
    size_t s = (p / ((size_t)H * (size_t)half)) % (size_t)S;
    return s * (size_t)half + p % (size_t)half;
}

/* The same map in 32 bits with the divisors prepared once per launch (kb_index.h), for p < 2^31: what the kernel and
 * the emulated device run; kb_rope_table_index is its reference (tests/test_kernel_bodies.c). */
typedef struct kb_rope_div {
    kb_fdiv hh, s, half; /* H * half, S, half */
} kb_rope_div;

KB_FN kb_rope_div kb_rope_div_make(int S, int H, int half) {
    kb_rope_div v;
    v.hh = kb_fdiv_make((uint32_t)H * (uint32_t)half), v.s = kb_fdiv_make((uint32_t)S), v.half = kb_fdiv_make((uint32_t)half);
    return v;
}

KB_FN uint32_t kb_rope_table_index32(uint32_t p, const kb_rope_div *v) {
    uint32_t s, j;
    kb_fdiv_qr(kb_fdiv_q(p, v->hh), v->s, &s);
    kb_fdiv_qr(p, v->half, &j);
    return s * v->half.d + j;
}

#endif
