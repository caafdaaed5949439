/* kernels/cuda/attn_libs.c — the libraries cuDNN's attention engines need besides cuDNN itself, and the version
 * gate.
 *
 * Every SDPA engine cuDNN 9.19 offers on Hopper is runtime-compiled (behaviour note RUNTIME_COMPILATION): finalising
 * a plan compiles its kernel with NVRTC, which cuDNN opens itself with dlopen("libnvrtc.so.<cuda major>") then
 * "libnvrtc.so" (strings of libcudnn_graph.so.9). A library already loaded under that soname satisfies such a
 * dlopen, so we open libnvrtc first, RTLD_GLOBAL, from wherever it is: $VGRPO_NVRTC_LIB, the loader's search path,
 * beside cuDNN, the pip-wheel layout (site-packages/nvidia/cudnn/lib -> ../../cuda_nvrtc/lib, the run path of
 * libcudnn_engines_runtime_compiled.so.9), $CUDA_HOME/lib64, /usr/local/cuda/lib64. Without it no SDPA plan
 * finalises (cuDNN: NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING), so plan errors then name what was searched.
 *
 * The runtime-compiled engines also need the CUDA driver library at plan time, even for a described device: with no
 * libcuda the heuristics offer no SDPA configuration at all (RUNTIME_PREREQUISITE_MISSING: libcuda == nullptr);
 * with the toolkit's stub (lib64/stubs/libcuda.so) they offer them, NVRTC compiles the kernel, and the execution
 * plan's finalisation then stops at cuLibraryLoadData (CUDA_ERROR_STUB_LIBRARY, 34): cuDNN status
 * EXECUTION_FAILED_CUDA_DRIVER (5001). kc_attn_driver_for_planning opens the stub for `vgrpo gpu-plans` on a
 * machine without a driver, and never in a process that uses a GPU. */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/attn_graph.h"

static void *nvrtc_lib;
static char nvrtc_path[512], nvrtc_searched[1536];
static int nvrtc_major = KC_NVRTC_MAJOR;

static int try_open(const char *file) {
    void *h = dlopen(file, RTLD_NOW | RTLD_GLOBAL);
    if (!h) return 0;
    nvrtc_lib = h;
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name)
        snprintf(nvrtc_path, sizeof nvrtc_path, "%s", lm->l_name);
    else
        snprintf(nvrtc_path, sizeof nvrtc_path, "%s", file);
    return 1;
}

static int try_dir(const char *dir, const char *rel) {
    char file[1024];
    snprintf(file, sizeof file, "%s%s%s/libnvrtc.so.%d", dir, rel[0] ? "/" : "", rel, nvrtc_major);
    size_t n = strlen(nvrtc_searched);
    if (n + 2 < sizeof nvrtc_searched)
        snprintf(nvrtc_searched + n, sizeof nvrtc_searched - n, "%s%s", n ? ", " : "", file);
    return try_open(file);
}

int kc_attn_nvrtc_preload(const char *cudnn_path) {
    if (nvrtc_lib) return 0;
    nvrtc_searched[0] = 0;
    /* cuDNN asks for the NVRTC of the CUDA it was built for (cudnnGetCudartVersion: 12080 -> libnvrtc.so.12) */
    void *dnn = cudnn_path && *cudnn_path ? dlopen(cudnn_path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    size_t (*cudart_version)(void) = dnn ? (size_t(*)(void))dlsym(dnn, "cudnnGetCudartVersion") : NULL;
    if (cudart_version && cudart_version() >= 1000) nvrtc_major = (int)(cudart_version() / 1000);
    if (dnn) dlclose(dnn); /* drops the reference NOLOAD took; cuDNN stays loaded */
    const char *env = getenv("VGRPO_NVRTC_LIB");
    if (env && *env) {
        if (try_open(env)) return 0;
        const char *e = dlerror();
        return core_error("NVRTC: cannot load $VGRPO_NVRTC_LIB=%s (%s)", env, e ? e : "unknown reason");
    }
    char soname[32];
    snprintf(soname, sizeof soname, "libnvrtc.so.%d", nvrtc_major);
    snprintf(nvrtc_searched, sizeof nvrtc_searched, "%s (loader search path)", soname);
    if (try_open(soname)) return 0;
    char dir[512] = "";
    if (cudnn_path && strchr(cudnn_path, '/')) {
        snprintf(dir, sizeof dir, "%s", cudnn_path);
        *strrchr(dir, '/') = 0;
        if (try_dir(dir, "") || try_dir(dir, "../../cuda_nvrtc/lib")) return 0;
    }
    const char *home = getenv("CUDA_HOME");
    if (home && *home && try_dir(home, "lib64")) return 0;
    if (try_dir("/usr/local/cuda", "lib64")) return 0;
    return core_error("NVRTC: libnvrtc.so.%d not found (searched %s); cuDNN's attention engines compile their kernels "
                      "with it: install the CUDA toolkit's NVRTC or the nvidia-cuda-nvrtc wheel, or set "
                      "VGRPO_NVRTC_LIB to the file",
                      nvrtc_major, nvrtc_searched);
}

const char *kc_attn_nvrtc_path(void) { return nvrtc_path; }

int kc_attn_cudnn_version_ok(size_t version) {
    if (version >= KC_ATTN_CUDNN_MIN && version < 100000) return 0;
    return core_error("cuDNN %zu.%zu.%zu is not supported: the attention graphs were verified with cuDNN %d.%d.%d "
                      "(make test: gpu_plans_*) and need the 9.x ABI; use cuDNN >= %d.%d (set VGRPO_CUDNN_LIB), or "
                      "VGRPO_CUDNN_UNVERIFIED=1 to try this one",
                      version / 10000, version / 100 % 100, version % 100, KC_ATTN_CUDNN_MIN / 10000,
                      KC_ATTN_CUDNN_MIN / 100 % 100, KC_ATTN_CUDNN_MIN % 100, KC_ATTN_CUDNN_MIN / 10000,
                      KC_ATTN_CUDNN_MIN / 100 % 100);
}

int kc_attn_driver_for_planning(char *what, size_t cap) {
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
        snprintf(what, cap, "the CUDA driver (libcuda.so.1)");
        return 1;
    }
    const char *home = getenv("CUDA_HOME");
    char file[600];
    for (int i = 0; i < 2; i++) {
        const char *base = i == 0 ? (home && *home ? home : NULL) : "/usr/local/cuda";
        if (!base) continue;
        snprintf(file, sizeof file, "%s/lib64/stubs/libcuda.so", base);
        if (dlopen(file, RTLD_NOW | RTLD_GLOBAL)) {
            snprintf(what, cap, "the toolkit's driver stub %s (no GPU driver here: plans compile but cannot load)",
                     file);
            return 0;
        }
    }
    snprintf(what, cap, "no CUDA driver library (neither libcuda.so.1 nor the toolkit's lib64/stubs/libcuda.so)");
    return -1;
}
