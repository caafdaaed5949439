/* kernels/cuda/device.c — the CUDA backend's stream, error helpers, device memory helpers and the scratch buffers
 * the ops share (start-up and shut-down are in init.c). Memory helpers use the one stream and wait for their copies;
 * they stage through two pinned host buffers (below), static: call them from one thread. */
#include <stdio.h>
#include <stdlib.h>
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

static void stage_free(void);

void kc_scratch_free_all(void) {
    for (int i = 0; i < KC_SCRATCH_SLOTS; i++) {
        if (scratch[i]) cudaFree(scratch[i]);
        scratch[i] = NULL, scratch_size[i] = 0;
    }
    stage_free(); /* and the host staging buffers */
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

/* ---- host <-> device copies through pinned staging ----
 * Copies from pageable host memory go through the driver's own small pinned bounce buffers, synchronously. We stage
 * through two page-locked buffers of STAGE_BYTES (cudaMallocHost, made on first use) used in turn: filling one (a
 * memcpy, or the bf16 conversion) overlaps the DMA of the other, and the DMA runs at the pinned rate. When
 * cudaMallocHost fails the copies fall back to the pageable path (fp32 straight from the caller's memory, bf16
 * through an ordinary buffer). Static state: one host thread. */
#define STAGE_BYTES ((size_t)16 << 20)

static void *stage[2];
static cudaEvent_t stage_done[2]; /* the copy that last used stage[b] */
static int stage_pinned;           /* 1: stage[] page-locked */
static int stage_state;            /* 0 not made, 1 made */

static void stage_free(void) {
    for (int b = 0; b < 2; b++) {
        if (stage[b]) stage_pinned ? (void)cudaFreeHost(stage[b]) : free(stage[b]);
        if (stage_done[b]) cudaEventDestroy(stage_done[b]);
        stage[b] = NULL, stage_done[b] = NULL;
    }
    stage_state = stage_pinned = 0;
}

static int stage_ready(void) {
    if (stage_state) return 0;
    stage_pinned = 1;
    for (int b = 0; b < 2 && stage_pinned; b++)
        if (cudaMallocHost(&stage[b], STAGE_BYTES) != cudaSuccess) stage[b] = NULL, stage_pinned = 0;
    if (!stage_pinned) { /* pageable fallback */
        (void)cudaGetLastError();
        for (int b = 0; b < 2; b++)
            if (stage[b]) cudaFreeHost(stage[b]), stage[b] = NULL;
        for (int b = 0; b < 2; b++)
            if (!(stage[b] = malloc(STAGE_BYTES))) return stage_free(), core_error("out of host memory for staging");
    }
    for (int b = 0; b < 2; b++)
        if (kc_check(cudaEventCreateWithFlags(&stage_done[b], cudaEventDisableTiming), "staging event"))
            return stage_free(), -1;
    stage_state = 1;
    return 0;
}

/* fill: len bytes of the host source, from byte off of the device destination's image, into the staging buffer;
 * drain: the reverse. */
typedef void (*stage_fill_fn)(void *stg, const void *src, size_t off, size_t len);
typedef void (*stage_drain_fn)(void *dst, const void *stg, size_t off, size_t len);

static int staged_upload(void *dst, const void *src, size_t bytes, stage_fill_fn fill) {
    if (stage_ready()) return -1;
    for (size_t off = 0, k = 0; off < bytes; off += STAGE_BYTES, k++) {
        const int b = (int)(k & 1);
        const size_t len = bytes - off < STAGE_BYTES ? bytes - off : STAGE_BYTES;
        if (kc_check(cudaEventSynchronize(stage_done[b]), "upload")) return -1; /* stage[b] free again */
        fill(stage[b], src, off, len);
        if (kc_check(cudaMemcpyAsync((char *)dst + off, stage[b], len, cudaMemcpyHostToDevice, kc_stream), "upload") ||
            kc_check(cudaEventRecord(stage_done[b], kc_stream), "upload"))
            return -1;
    }
    return kc_check(cudaStreamSynchronize(kc_stream), "upload");
}

static int stage_issue(const void *src, size_t bytes, size_t k) {
    const size_t off = k * STAGE_BYTES, len = bytes - off < STAGE_BYTES ? bytes - off : STAGE_BYTES;
    const int b = (int)(k & 1);
    return kc_check(cudaMemcpyAsync(stage[b], (const char *)src + off, len, cudaMemcpyDeviceToHost, kc_stream),
                    "download") ||
           kc_check(cudaEventRecord(stage_done[b], kc_stream), "download");
}

static int staged_download(void *dst, const void *src, size_t bytes, stage_drain_fn drain) {
    if (stage_ready()) return -1;
    const size_t pieces = (bytes + STAGE_BYTES - 1) / STAGE_BYTES;
    if (pieces && stage_issue(src, bytes, 0)) return -1;
    for (size_t k = 0; k < pieces; k++) {
        /* piece k + 1 into the other buffer (its piece k - 1 was drained) while piece k is drained */
        if (k + 1 < pieces && stage_issue(src, bytes, k + 1)) return -1;
        const int b = (int)(k & 1);
        if (kc_check(cudaEventSynchronize(stage_done[b]), "download")) return -1;
        const size_t off = k * STAGE_BYTES, len = bytes - off < STAGE_BYTES ? bytes - off : STAGE_BYTES;
        drain(dst, stage[b], off, len);
    }
    return kc_check(cudaStreamSynchronize(kc_stream), "download");
}

/* memcpy in 1 MiB slices on the OpenMP threads (one thread's memcpy would be slower than the pinned DMA) */
static void par_copy(char *d, const char *s, size_t len) {
    const long slices = (long)((len + (1 << 20) - 1) >> 20);
#pragma omp parallel for schedule(static) if (slices > 1)
    for (long i = 0; i < slices; i++) {
        const size_t o = (size_t)i << 20, m = len - o < ((size_t)1 << 20) ? len - o : ((size_t)1 << 20);
        memcpy(d + o, s + o, m);
    }
}
static void fill_copy(void *stg, const void *src, size_t off, size_t len) { par_copy(stg, (const char *)src + off, len); }
static void drain_copy(void *dst, const void *stg, size_t off, size_t len) { par_copy((char *)dst + off, stg, len); }
/* bf16: byte offsets of the device image; the conversions run on the OpenMP threads (exact, elementwise) */
static void fill_bf16(void *stg, const void *src, size_t off, size_t len) {
    const float *s = (const float *)src + off / sizeof(kb_bf16);
    kb_bf16 *d = stg;
    const size_t m = len / sizeof(kb_bf16);
#pragma omp parallel for schedule(static) if (m >= (1 << 16))
    for (size_t j = 0; j < m; j++) d[j] = kb_bf16_from_f32(s[j]);
}
static void drain_bf16(void *dst, const void *stg, size_t off, size_t len) {
    float *d = (float *)dst + off / sizeof(kb_bf16);
    const kb_bf16 *s = stg;
    const size_t m = len / sizeof(kb_bf16);
#pragma omp parallel for schedule(static) if (m >= (1 << 16))
    for (size_t j = 0; j < m; j++) d[j] = kb_f32_from_bf16(s[j]);
}

int k_dev_upload(void *dst, const void *src, size_t bytes) {
    if (!bytes) return 0;
    if (stage_ready()) return -1;
    if (stage_pinned) return staged_upload(dst, src, bytes, fill_copy);
    if (kc_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, kc_stream), "upload")) return -1;
    return kc_check(cudaStreamSynchronize(kc_stream), "upload");
}

int k_dev_download(void *dst, const void *src, size_t bytes) {
    if (!bytes) return 0;
    if (stage_ready()) return -1;
    if (stage_pinned) return staged_download(dst, src, bytes, drain_copy);
    if (kc_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, kc_stream), "download")) return -1;
    return kc_check(cudaStreamSynchronize(kc_stream), "download");
}

int k_dev_upload_bf16(kb_bf16 *dst, const float *src, size_t n) {
    return n ? staged_upload(dst, src, n * sizeof(kb_bf16), fill_bf16) : 0;
}

int k_dev_download_bf16(float *dst, const kb_bf16 *src, size_t n) {
    return n ? staged_download(dst, src, n * sizeof(kb_bf16), drain_bf16) : 0;
}

int k_dev_zero(void *p, size_t bytes) {
    if (!bytes) return 0;
    return kc_check(cudaMemsetAsync(p, 0, bytes, kc_stream), "memset");
}

int k_dev_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height) {
    if (!width || !height) return 0;
    return kc_check(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice, kc_stream),
                    "device copy (2D)");
}

int k_dev_sync(void) { return kc_check(cudaStreamSynchronize(kc_stream), "stream sync"); }

int k_dev_mem_info(size_t *free_bytes, size_t *total_bytes) {
    return kc_check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

/* ---- CUDA IPC (kernels/dev_ops.h ipc_*): the weight sync's same-host path (trainer/net/sync_ipc.h) ---- */

int k_dev_ipc_export(const void *dev, size_t bytes, uint8_t *handle) {
    (void)bytes; /* the handle covers the whole allocation dev starts */
    cudaIpcMemHandle_t h;
    if (kc_check(cudaIpcGetMemHandle(&h, (void *)dev), "cudaIpcGetMemHandle")) return -1;
    _Static_assert(sizeof h == K_IPC_HANDLE_BYTES, "cudaIpcMemHandle_t is 64 bytes");
    memcpy(handle, &h, sizeof h);
    return 0;
}

int k_dev_ipc_unexport(const uint8_t *handle) {
    (void)handle; /* a CUDA handle lives as long as its allocation: nothing to release */
    return 0;
}

int k_dev_ipc_open(const uint8_t *handle, size_t bytes, const void **dev) {
    (void)bytes; /* cudaIpcOpenMemHandle does not say the allocation's size: the handshake carries it */
    cudaIpcMemHandle_t h;
    void *p = NULL;
    memcpy(&h, handle, sizeof h);
    *dev = NULL;
    /* refused for a handle of this very process, another device's without peer access, or a freed allocation */
    if (kc_check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle")) return -1;
    *dev = p;
    return 0;
}

int k_dev_ipc_close(const void *dev) {
    return kc_check(cudaIpcCloseMemHandle((void *)dev), "cudaIpcCloseMemHandle");
}
