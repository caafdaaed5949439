/* kernels/cuda/kern_flow.cu — the flow and optimizer kernels of the CUDA backend: the SDE step with its fixed-order
 * sum, the KL's sum, the velocity backward, classifier-free guidance, AdamW, the gradient norm's sum of squares,
 * the clip scaling, and the y += x used behind library outputs. Bodies from kernels/body/kb_flow.h and kb_optim.h.
 *
 * Fixed-order sums on the GPU, exactly the CPU's order (so the log-prob and the gradient norm equal the CPU's bit
 * for bit): one thread per chunk (4096 fp32 elements for the flow sums, 8192 double for the sum of squares) sums
 * its chunk sequentially into a partials array; then ONE thread combines the partials (the pairwise tree as
 * core/reduce.c's counter, or the plain in-order sum of optim_sumsq). Any other grouping would change the CPU
 * path's log-probs and gradient norm, which are fixed. The sum of squares' chunk threads load their chunks through
 * shared-memory tiles (coalesced) and its combining thread reads partials staged by its block; the combine walks
 * n / 8192 values: 160 k for Wan 1.3B, 1.7 M for a 14B expert (to time on the GPU). The flow sums' chunk threads
 * still read with a stride between threads (a Wan latent is ~500 chunks: small). */
#include "kernels/body/kb_flow.h"
#include "kernels/body/kb_optim.h"
#include "kernels/cuda/kern_common.cuh"

/* ---- fixed-order sums ---- */

/* kind 0: SDE step chunk; kind 1: (a - b)^2 chunk. part[c] = the chunk's fp32 sum. */
__global__ void flow_chunks_kernel(int kind, float *part, kb_in x, kb_in v, kb_in eps, kb_in given, kb_out mean_out,
                                   kb_out x_next_out, float cx, float cv, float step_std, int want_sum, int64_t n,
                                   int64_t nchunks) {
    KC_FOR(c, nchunks) {
        const int64_t b = (int64_t)c * KB_REDUCE_CHUNK, e = b + KB_REDUCE_CHUNK < n ? b + KB_REDUCE_CHUNK : n;
        part[c] = kind == 0 ? kb_sde_chunk(x, v, eps, given, mean_out, x_next_out, cx, cv, step_std, want_sum, b, e)
                            : kb_sq_diff_chunk(x, v, b, e);
    }
}

__global__ void counter_kernel(const float *part, int64_t nchunks, float *out) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        kb_counter k;
        kb_counter_init(&k);
        for (int64_t c = 0; c < nchunks; c++) kb_counter_push(&k, part[c]);
        *out = kb_counter_finish(&k);
    }
}

/* Runs the chunk kernel and the counter, then copies the sum to the host (waits). */
static int flow_sum(int kind, const char *op, kb_in x, kb_in v, kb_in eps, kb_in given, kb_out mean_out,
                    kb_out x_next_out, float cx, float cv, float step_std, int want_sum, int64_t n, float *sum_out) {
    if (n < 1) return core_error("%s: element count %lld must be >= 1", op, (long long)n);
    const int64_t nchunks = (n + KB_REDUCE_CHUNK - 1) / KB_REDUCE_CHUNK;
    float *part = (float *)kc_scratch(KC_SLOT_REDUCE, (size_t)(nchunks + 1) * sizeof(float));
    if (!part) return -1;
    flow_chunks_kernel<<<kc_blocks((size_t)nchunks), KC_THREADS, 0, kc_stream>>>(
        kind, part, x, v, eps, given, mean_out, x_next_out, cx, cv, step_std, want_sum, n, nchunks);
    if (kc_launched(op)) return -1;
    counter_kernel<<<1, 32, 0, kc_stream>>>(part, nchunks, part + nchunks);
    if (kc_launched(op)) return -1;
    float s = 0.0f;
    if (kc_check(cudaMemcpyAsync(&s, part + nchunks, sizeof s, cudaMemcpyDeviceToHost, kc_stream), op) ||
        kc_check(cudaStreamSynchronize(kc_stream), op))
        return -1;
    if (sum_out) *sum_out = s;
    return 0;
}

extern "C" int kc_sde_step(kb_in x, kb_in v, kb_in eps, kb_in given, kb_out mean_out, kb_out x_next_out, float coef_x,
                           float coef_v, float step_std, int want_sum, int64_t n, float *sum_out) {
    if (eps.p && given.p) return core_error("sde_step: pass eps (rollout) or the recorded x_next, not both");
    return flow_sum(0, "sde_step", x, v, eps, given, mean_out, x_next_out, coef_x, coef_v, step_std, want_sum, n,
                    sum_out);
}

extern "C" int kc_sq_diff_sum(kb_in a, kb_in b, int64_t n, float *sum_out) {
    kb_in nil = {NULL, KB_F32};
    kb_out none = {NULL, KB_F32};
    return flow_sum(1, "sq_diff_sum", a, b, nil, nil, none, none, 0.0f, 0.0f, 0.0f, 1, n, sum_out);
}

/* ---- elementwise ---- */

__global__ void sde_dv_kernel(kb_out dv, kb_in mean, kb_in x_next, kb_in mean_ref, float g_logp, float g_kl, float k,
                              int64_t n) {
    const int use_logp = g_logp != 0.0f, use_kl = g_kl != 0.0f;
    KC_FOR(i, n) {
        const float m = kb_get(mean, i);
        const float xn = use_logp ? kb_get(x_next, i) : 0.0f, mr = use_kl ? kb_get(mean_ref, i) : 0.0f;
        kb_set(dv, i, kb_sde_dv_elem(m, xn, mr, g_logp, g_kl, use_logp, use_kl, k));
    }
}

extern "C" int kc_sde_backward_v(kb_out dv, kb_in mean, kb_in x_next, kb_in mean_ref, float g_logp, float g_kl,
                                 float k, int64_t n) {
    if (n < 1) return core_error("sde_backward_v: element count %lld must be >= 1", (long long)n);
    if ((g_logp != 0.0f && !x_next.p) || (g_kl != 0.0f && !mean_ref.p))
        return core_error("sde_backward_v: a needed x_next or mean_ref is NULL");
    sde_dv_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(dv, mean, x_next, mean_ref, g_logp, g_kl, k, n);
    return kc_launched("sde_backward_v");
}

__global__ void cfg_kernel(int backward, kb_out a, kb_out b, kb_in x, kb_in y, float g, int64_t n) {
    const float gu = 1.0f - g;
    KC_FOR(i, n) {
        if (backward) {
            const float d = kb_get(x, i);
            kb_set(a, i, g * d);
            kb_set(b, i, gu * d);
        } else {
            kb_set(a, i, kb_cfg_elem(kb_get(x, i), kb_get(y, i), g));
        }
    }
}

extern "C" int kc_cfg_combine(kb_out v, kb_in vc, kb_in vu, float g, int64_t n) {
    if (n < 0) return core_error("cfg_combine: n = %lld", (long long)n);
    if (!n) return 0;
    kb_out none = {NULL, KB_F32};
    cfg_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(0, v, none, vc, vu, g, n);
    return kc_launched("cfg_combine");
}

extern "C" int kc_cfg_backward(kb_out dvc, kb_out dvu, kb_in dv, float g, int64_t n) {
    if (n < 0) return core_error("cfg_backward: n = %lld", (long long)n);
    if (!n) return 0;
    cfg_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(1, dvc, dvu, dv, dv, g, n);
    return kc_launched("cfg_backward");
}

__global__ void adamw_kernel(float *p, float *m, float *v, kb_in g, const uint8_t *wd_mask, kb_adamw_scalars s,
                             kb_bf16 *p_bf16, int64_t n) {
    KC_FOR(i, n) {
        kb_adamw_elem(&p[i], &m[i], &v[i], kb_get(g, i), &s, !wd_mask || wd_mask[i]);
        if (p_bf16) p_bf16[i] = kb_bf16_from_f32(p[i]);
    }
}

extern "C" int kc_adamw_update(float *p, float *m, float *v, kb_in g, const uint8_t *wd_mask, kb_adamw_scalars s,
                               kb_bf16 *p_bf16, int64_t n) {
    if (n < 0) return core_error("adamw_update: n = %lld", (long long)n);
    if (!n) return 0;
    adamw_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(p, m, v, g, wd_mask, s, p_bf16, n);
    return kc_launched("adamw_update");
}

/* The chunk sums of the sum of squares, in optim_sumsq's order (each chunk from its first element, sequentially),
 * with coalesced loads: a warp owns 32 consecutive chunks (lane l: chunk c0 + l) and walks them in tiles of 32
 * elements; for each of its chunks the warp loads the tile's 32 consecutive elements (one 128-byte line for fp32)
 * into shared memory, then every lane adds its own chunk's tile in element order (kb_sumsq_add). 64-bit index
 * products only, no division. */
#define SQ_TILE 32
#define SQ_WARPS (KC_THREADS / 32)
__global__ void sumsq_chunks_kernel(double *part, kb_in x, int64_t n, int64_t nchunks) {
    __shared__ float tile[SQ_WARPS][32][SQ_TILE + 1]; /* +1: lanes read rows without bank conflicts */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t step = (int64_t)gridDim.x * SQ_WARPS * 32;
    for (int64_t c0 = ((int64_t)blockIdx.x * SQ_WARPS + w) * 32; c0 < nchunks; c0 += step) { /* warp-uniform */
        const int64_t c = c0 + lane, b = c * KB_SUMSQ_CHUNK;
        double s = 0.0;
        for (int k0 = 0; k0 < KB_SUMSQ_CHUNK && c0 * KB_SUMSQ_CHUNK + k0 < n; k0 += SQ_TILE) {
            for (int j = 0; j < 32; j++) {
                const int64_t i = (c0 + j) * KB_SUMSQ_CHUNK + k0 + lane;
                tile[w][j][lane] = i < n ? kb_get(x, (size_t)i) : 0.0f;
            }
            __syncwarp();
            for (int k = 0; k < SQ_TILE && b + k0 + k < n && c < nchunks; k++) s = kb_sumsq_add(s, tile[w][lane][k]);
            __syncwarp();
        }
        if (c < nchunks) part[c] = s;
    }
}

/* The chunk sums added in chunk order by one thread (kb_sumsq_combine's order: a regrouped sum would change the
 * gradient norm's bits against trainer/optim/optim.c, which the CPU path fixes), fed by the block: 1024 partials at a time
 * loaded coalesced into shared memory, so the adding thread waits on shared memory, not on global loads. */
#define SQ_STAGE 1024
__global__ void sumsq_combine_kernel(const double *part, int64_t nchunks, double *out) {
    __shared__ double buf[SQ_STAGE];
    double total = 0.0;
    for (int64_t c0 = 0; c0 < nchunks; c0 += SQ_STAGE) {
        const int m = nchunks - c0 < SQ_STAGE ? (int)(nchunks - c0) : SQ_STAGE;
        for (int k = threadIdx.x; k < m; k += blockDim.x) buf[k] = part[c0 + k];
        __syncthreads();
        if (threadIdx.x == 0) total = kb_sumsq_combine_from(total, buf, m);
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = total;
}

extern "C" int kc_sumsq(kb_in x, int64_t n, double *out) {
    if (n < 0) return core_error("sumsq: n = %lld", (long long)n);
    double s = 0.0;
    if (n > 0) {
        const int64_t nchunks = (n + KB_SUMSQ_CHUNK - 1) / KB_SUMSQ_CHUNK;
        double *part = (double *)kc_scratch(KC_SLOT_REDUCE, (size_t)(nchunks + 1) * sizeof(double));
        if (!part) return -1;
        sumsq_chunks_kernel<<<kc_blocks((size_t)(nchunks + 31) / 32 * 32), KC_THREADS, 0, kc_stream>>>(part, x, n,
                                                                                                    nchunks);
        if (kc_launched("sumsq")) return -1;
        sumsq_combine_kernel<<<1, KC_THREADS, 0, kc_stream>>>(part, nchunks, part + nchunks);
        if (kc_launched("sumsq")) return -1;
        if (kc_check(cudaMemcpyAsync(&s, part + nchunks, sizeof s, cudaMemcpyDeviceToHost, kc_stream), "sumsq") ||
            kc_check(cudaStreamSynchronize(kc_stream), "sumsq"))
            return -1;
    }
    if (out) *out = s;
    return 0;
}

__global__ void scale_kernel(kb_out x, float f, int64_t n) {
    KC_FOR(i, n) kb_set(x, i, kb_get(kb_as_in(x), i) * f);
}

extern "C" int kc_scale(kb_out x, float f, int64_t n) {
    if (n < 0) return core_error("scale: n = %lld", (long long)n);
    if (!n) return 0;
    scale_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(x, f, n);
    return kc_launched("scale");
}

__global__ void add_kernel(kb_out y, kb_in x, int64_t n) {
    KC_FOR(i, n) kb_acc(y, i, kb_get(x, i));
}

extern "C" int kc_add(kb_out y, kb_in x, int64_t n) {
    if (n <= 0) return 0;
    add_kernel<<<kc_blocks((size_t)n), KC_THREADS, 0, kc_stream>>>(y, x, n);
    return kc_launched("add");
}
