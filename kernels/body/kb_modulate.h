/* kernels/body/kb_modulate.h — AdaLN modulation x * (1 + scale) + shift and the gated residual x + y * gate, per
 * element, and the column sums behind the gradients of broadcast modulation rows.
 *
 * kernels/cpu/modulate.c's loops call the element bodies (each product and sum rounded as written, fp32); the gradients of a row
 * broadcast over S tokens (per_token 0) are sums over s = 0..S-1 in order, in double, rounded once and added. So fp32
 * results are bit-identical to k_cpu_ops. Modulation rows sit at row b (per_token 0) or b*S + s (per_token 1) with
 * a row stride of mod_stride floats (kernels.h). Reference: diffusers WanTransformerBlock. */
#ifndef KERNELS_BODY_KB_MODULATE_H
#define KERNELS_BODY_KB_MODULATE_H

#include "kernels/body/kb_base.h"

/* Offset of the modulation row for token s of sample b. */
KB_FN size_t kb_mod_row(int b, int s, int S, int per_token, int mod_stride) {
    return (per_token ? (size_t)b * S + (size_t)s : (size_t)b) * (size_t)mod_stride;
}

/* x * (1 + scale) + shift. */
KB_FN float kb_modulate_elem(float x, float shift, float scale) {
    float one_sc = 1.0f + scale;
    float y = x * one_sc;
    return y + shift;
}

/* dout * (1 + scale): the dx term of the modulation. */
KB_FN float kb_modulate_dx_elem(float g, float scale) {
    float one_sc = 1.0f + scale;
    return g * one_sc;
}

/* x + y * gate. */
KB_FN float kb_gate_residual_elem(float x, float y, float gate) {
    float t = y * gate;
    return x + t;
}

/* The broadcast modulation gradients (dscale, dshift, dgate when one row serves all S tokens of a sample: column sums
 * over the tokens, sum g x and sum g, in double), as a fixed-order parallel reduction (as the norm weight gradients,
 * kb_norm.h): the tokens cut into ranges of KB_MOD_COL_ROWS = 128; the partial of (range r, column d) adds its tokens in order in double, then each
 * column adds its range partials in range order from 0 (the CPU's order exactly for S <= 128). What the GPU (one
 * thread per (sample, range, column), then one per (sample, column)) and the emulated device run. */
#define KB_MOD_COL_ROWS 128

KB_FN int kb_mod_col_ranges(int S) { return (S + KB_MOD_COL_ROWS - 1) / KB_MOD_COL_ROWS; }

/* Range r of column d of one sample (rows from base = b*S*D): *sgx = sum g x, *sg = sum g over its tokens in order
 * (either may be NULL). */
KB_FN void kb_mod_col_range(kb_in g, kb_in x, size_t base, int S, int D, int d, int r, double *sgx, double *sg) {
    double a = 0.0, c = 0.0;
    const int s1 = (r + 1) * KB_MOD_COL_ROWS < S ? (r + 1) * KB_MOD_COL_ROWS : S;
    for (int s = r * KB_MOD_COL_ROWS; s < s1; s++) {
        size_t i = base + (size_t)s * D + (size_t)d;
        float gv = kb_get(g, i);
        if (sgx) a += (double)gv * (double)kb_get(x, i);
        if (sg) c += (double)gv;
    }
    if (sgx) *sgx = a;
    if (sg) *sg = c;
}

/* Column d of one sample from its range partials pa, pc [nr, D] (range-major; either may be NULL with its output):
 * added in range order in double from 0. */
KB_FN void kb_mod_col_combine(const double *pa, const double *pc, int nr, int D, int d, double *sgx, double *sg) {
    double a = 0.0, c = 0.0;
    for (int r = 0; r < nr; r++) {
        if (sgx) a += pa[(size_t)r * D + (size_t)d];
        if (sg) c += pc[(size_t)r * D + (size_t)d];
    }
    if (sgx) *sgx = a;
    if (sg) *sg = c;
}

/* ---- the modulation table plus the embedding rows (kernels/cpu/glue.c: k_cpu_add_table, k_cpu_add_table_bwd) ----
 * out[r, j, :] = table[j, :] + src[r, j, :] (src_nj == nj) or src[r, 0, :] (src_nj == 1: the output norm's temb
 * broadcast over shift and scale); out [R, nj, D], table [nj, D], src [R, src_nj, D]. The CPU's order: the table
 * gradient sums rows r = 0..R-1 in order into an fp32 accumulator that is then added (k_cpu_colsum_acc); the broadcast
 * source gradient adds j = 0..nj-1 in order straight into the accumulator. So fp32 results are bit-identical. */

/* Index into src of element i of out. */
KB_FN size_t kb_add_table_src(size_t i_, int nj, int D, int src_nj) {
    const uint32_t i = (uint32_t)i_; /* out < 2^31 elements: the callers check (32-bit index math) */
    const uint32_t d = i % (uint32_t)D, rj = i / (uint32_t)D, j = rj % (uint32_t)nj, r = rj / (uint32_t)nj;
    return (r * (uint32_t)src_nj + (src_nj == 1 ? 0 : j)) * (uint32_t)D + d;
}

/* table[j, d] + src[...] for element i of out. */
KB_FN float kb_add_table_elem(kb_in table, kb_in src, size_t i, int nj, int D, int src_nj) {
    return kb_get(table, (uint32_t)i % ((uint32_t)nj * D)) + kb_get(src, kb_add_table_src(i, nj, D, src_nj));
}

/* Column c of x [R, ncol] summed over rows 0..R-1 in order, fp32 accumulator (k_cpu_colsum_acc's arithmetic). */
KB_FN float kb_col_sum_f32(kb_in x, int64_t R, int ncol, int c) {
    float acc = 0.0f;
    for (int64_t r = 0; r < R; r++) acc += kb_get(x, (size_t)r * (size_t)ncol + (size_t)c);
    return acc;
}

/* dsrc[r, 0, d] += dmod[r, j, d] for j = 0..nj-1 in order (element e = r * D + d of dsrc; src_nj == 1). */
KB_FN void kb_add_table_bcast_grad(kb_out dsrc, kb_in dmod, size_t e, int nj, int D) {
    const uint32_t d = (uint32_t)e % (uint32_t)D, r = (uint32_t)e / (uint32_t)D; /* < 2^31: callers check */
    for (int j = 0; j < nj; j++) kb_acc(dsrc, e, kb_get(dmod, (size_t)(r * (uint32_t)nj + (uint32_t)j) * D + d));
}

#endif
