/* kernels/cuda/device.c — the CUDA backend's stream, error helpers, device memory helpers and the scratch buffers
 * the ops share (start-up and shut-down are in init.c). Memory helpers use the one stream and wait for their copies;
 * the bf16 staging buffers are static: call them from one thread. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/internal.h"

cudaStream_t kc_stream;
int kc_sm_count;

static void *scratch[KC_SCRATCH_SLOTS];
static size_t scratch_size[KC_SCRATCH_SLOTS];

int kc_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    return core_error("CUDA: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int kc_launched(const char *op) { return kc_check(cudaGetLastError(), op); }

void *kc_scratch(int slot, size_t bytes) {
    if (slot < 0 || slot >= KC_SCRATCH_SLOTS) {
        core_error("CUDA: scratch slot %d out of range", slot);
        return NULL;
    }
    if (bytes <= scratch_size[slot] && scratch[slot]) return scratch[slot];
    if (scratch[slot]) {
        /* earlier work on the stream may still read the old buffer */
        if (kc_check(cudaStreamSynchronize(kc_stream), "scratch resize")) return NULL;
        cudaFree(scratch[slot]);
        scratch[slot] = NULL, scratch_size[slot] = 0;
    }
    size_t want = bytes < 256 ? 256 : bytes;
    void *p = NULL;
    if (kc_check(cudaMalloc(&p, want), "scratch allocation")) {
        core_error_push("scratch buffer of %zu bytes: ", want);
        return NULL;
    }
    scratch[slot] = p, scratch_size[slot] = want;
    return p;
}

void kc_scratch_free_all(void) {
    for (int i = 0; i < KC_SCRATCH_SLOTS; i++) {
        if (scratch[i]) cudaFree(scratch[i]);
        scratch[i] = NULL, scratch_size[i] = 0;
    }
}

void *k_dev_alloc(size_t bytes) {
    void *p = NULL;
    if (kc_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc")) {
        core_error_push("device allocation of %zu bytes: ", bytes);
        return NULL;
    }
    return p;
}

void k_dev_free(void *p) {
    if (p) cudaFree(p);
}

int k_dev_upload(void *dst, const void *src, size_t bytes) {
    if (!bytes) return 0;
    if (kc_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, kc_stream), "upload")) return -1;
    return kc_check(cudaStreamSynchronize(kc_stream), "upload");
}

int k_dev_download(void *dst, const void *src, size_t bytes) {
    if (!bytes) return 0;
    if (kc_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, kc_stream), "download")) return -1;
    return kc_check(cudaStreamSynchronize(kc_stream), "download");
}

/* Host staging in pieces of this many elements (no giant host buffers for multi-GB tensors); the conversions run on
 * the OpenMP threads (exact, elementwise). */
enum { STAGE = 1 << 22 };

int k_dev_upload_bf16(kb_bf16 *dst, const float *src, size_t n) {
    static kb_bf16 buf[STAGE];
    for (size_t i = 0; i < n; i += STAGE) {
        size_t m = n - i < STAGE ? n - i : STAGE;
#pragma omp parallel for schedule(static) if (m >= (1 << 16))
        for (size_t j = 0; j < m; j++) buf[j] = kb_bf16_from_f32(src[i + j]);
        if (k_dev_upload(dst + i, buf, m * sizeof(kb_bf16))) return -1;
    }
    return 0;
}

int k_dev_download_bf16(float *dst, const kb_bf16 *src, size_t n) {
    static kb_bf16 buf[STAGE];
    for (size_t i = 0; i < n; i += STAGE) {
        size_t m = n - i < STAGE ? n - i : STAGE;
        if (k_dev_download(buf, src + i, m * sizeof(kb_bf16))) return -1;
#pragma omp parallel for schedule(static) if (m >= (1 << 16))
        for (size_t j = 0; j < m; j++) dst[i + j] = kb_f32_from_bf16(buf[j]);
    }
    return 0;
}

int k_dev_zero(void *p, size_t bytes) {
    if (!bytes) return 0;
    return kc_check(cudaMemsetAsync(p, 0, bytes, kc_stream), "memset");
}

int k_dev_sync(void) { return kc_check(cudaStreamSynchronize(kc_stream), "stream sync"); }

int k_dev_mem_info(size_t *free_bytes, size_t *total_bytes) {
    return kc_check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}
