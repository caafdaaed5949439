/* kernels/cuda/init.c — start-up and shut-down of the CUDA backend: k_cuda_init, k_cuda_available (kernels.h),
 * k_cuda_shutdown, k_cuda_get_info. The CUDA runtime is linked statically (libcudart_static), so the binary needs no
 * libcudart.so; the driver (libcuda.so.1) is opened by the runtime itself, and its absence is an ordinary error that
 * k_cuda_available turns into one line, after which every CPU path of the binary still works. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/gpu_assign.h"
#include "kernels/cuda/dynload.h"
#include "kernels/cuda/internal.h"

static int ready;          /* k_cuda_init succeeded */
static char fail_why[K_WHY_MAX]; /* the reason of a failed init, repeated to later callers */
static k_cuda_info info;

/* Records a failed init: the message goes to why, core_error and fail_why; returns -1. */
static int init_fail(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int init_fail(char *why, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fail_why, sizeof fail_why, fmt, ap);
    va_end(ap);
    if (why) snprintf(why, K_WHY_MAX, "%s", fail_why);
    return core_error("%s", fail_why);
}

int k_cuda_init(char *why) {
    if (ready) return 0;
    if (fail_why[0]) {
        if (why) snprintf(why, K_WHY_MAX, "%s", fail_why);
        return core_error("%s", fail_why);
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* Without libcuda.so.1 the runtime reports an "insufficient driver"; say plainly that there is none. */
        void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!drv) return init_fail(why, "CUDA: no NVIDIA driver on this machine (libcuda.so.1 not found), so no GPU");
        dlclose(drv);
        return init_fail(why, "CUDA: no usable GPU here (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
    }
    if (n < 1) return init_fail(why, "CUDA: no GPU found");
    /* the process's GPU: the one its launcher's plan gave it (core/gpu_assign.h sets the variable), else 0 */
    int dev = 0;
    const char *sel = getenv(CORE_GPU_ENV);
    if (sel && *sel) {
        char *end;
        const long v = strtol(sel, &end, 10);
        if (*end || v < 0 || v >= n)
            return init_fail(why, "CUDA: %s=%s is not a GPU index here: %d visible device(s) (parallel.gpus, "
                                  "CUDA_VISIBLE_DEVICES)", CORE_GPU_ENV, sel, n);
        dev = (int)v;
    }
    struct cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, dev)) != cudaSuccess)
        return init_fail(why, "CUDA: cudaGetDeviceProperties: %s", cudaGetErrorString(e));
    if (p.major != 9)
        return init_fail(why, "CUDA: GPU %d is %s (compute capability %d.%d); this build carries sm_90a code only "
                              "(Hopper: H100, H200)", dev, p.name, p.major, p.minor);
    if ((e = cudaSetDevice(dev)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&kc_stream, cudaStreamNonBlocking)) != cudaSuccess)
        return init_fail(why, "CUDA: cannot create a stream on GPU %d: %s", dev, cudaGetErrorString(e));
    if (kc_dynload()) {
        char msg[CORE_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", core_last_error());
        return init_fail(why, "%s", msg);
    }
    memset(&info, 0, sizeof info);
    snprintf(info.gpu, sizeof info.gpu, "%s", p.name);
    info.cc_major = p.major, info.cc_minor = p.minor, info.sm_count = p.multiProcessorCount;
    info.mem_bytes = p.totalGlobalMem;
    cudaDriverGetVersion(&info.driver_version);
    cudaRuntimeGetVersion(&info.runtime_version);
    info.cublaslt_version = kc_lt.cublasLtGetVersion();
    info.cudnn_version = kc_dnn.cudnnGetVersion();
    snprintf(info.cublaslt_path, sizeof info.cublaslt_path, "%s", kc_dynload_path(0));
    snprintf(info.cudnn_path, sizeof info.cudnn_path, "%s", kc_dynload_path(1));
    kc_sm_count = p.multiProcessorCount;
    if (info.cudnn_version < 91300)
        return init_fail(why, "cuDNN %zu at %s is too old: fused attention (SDPA) descriptors need 9.13 or later",
                         info.cudnn_version, info.cudnn_path);
    if (kc_gemm_init() || kc_attn_init()) {
        char msg[CORE_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", core_last_error());
        return init_fail(why, "%s", msg);
    }
    ready = 1;
    /* every process that opens the GPU says which (stderr: the GPU check links no logger) */
    fprintf(stderr, "CUDA: GPU %d of %d: %s (%.1f GiB, %d SMs, compute capability %d.%d)\n", dev, n, p.name,
            (double)p.totalGlobalMem / 1073741824.0, p.multiProcessorCount, p.major, p.minor);
    return 0;
}

int k_cuda_available(char *why) {
    if (k_cuda_init(why)) return 0;
    if (why) why[0] = 0;
    return 1;
}

void k_cuda_shutdown(void) {
    if (!ready) return;
    cudaStreamSynchronize(kc_stream);
    kc_attn_shutdown();
    kc_gemm_shutdown();
    kc_scratch_free_all();
    cudaStreamDestroy(kc_stream);
    kc_dynload_close();
    ready = 0;
}

int k_cuda_get_info(k_cuda_info *out) {
    if (!ready) return core_error("CUDA backend not initialised (k_cuda_init)");
    *out = info;
    return 0;
}

void *k_cuda_stream(void) { return (void *)kc_stream; }

