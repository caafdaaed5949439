/* kernels/cuda/dynload.c — dlopen of cuBLASLt and cuDNN; see dynload.h. */
#include "kernels/cuda/dynload.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

kc_lt_api kc_lt;
kc_dnn_api kc_dnn;

static void *lt_lib, *dnn_lib;
static char lt_path[512], dnn_path[512];

/* Opens env's file or the soname; records the file actually loaded. */
static void *open_lib(const char *env, const char *soname, const char *what, char *path, size_t cap) {
    const char *name = getenv(env);
    if (!name || !*name) name = soname;
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        core_error("%s: cannot load %s (%s); set LD_LIBRARY_PATH or %s to the library (scripts/gpu_check.sh finds "
                   "the CUDA toolkit's or PyTorch's copies)",
                   what, name, e ? e : "unknown reason", env);
        return NULL;
    }
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name)
        snprintf(path, cap, "%s", lm->l_name);
    else
        snprintf(path, cap, "%s", name);
    return h;
}

/* Resolves every member of an api struct, given as an array of function-pointer slots and their names. */
static int resolve(void *lib, const char *what, void **slots, const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        slots[i] = dlsym(lib, names[i]);
        if (!slots[i]) return core_error("%s: symbol %s not found (library too old?)", what, names[i]);
    }
    return 0;
}

#define SLOT(api, f) ((void **)&(api).f)

int kc_dynload(void) {
    if (lt_lib && dnn_lib) return 0;
    if (!lt_lib) {
        lt_lib = open_lib("VGRPO_CUBLASLT_LIB", "libcublasLt.so.13", "cuBLASLt", lt_path, sizeof lt_path);
        if (!lt_lib) return -1;
        static const char *const names[] = {
            "cublasLtCreate", "cublasLtDestroy", "cublasLtGetVersion", "cublasLtGetStatusString",
            "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute",
            "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", "cublasLtMatmulPreferenceCreate",
            "cublasLtMatmulPreferenceDestroy", "cublasLtMatmulPreferenceSetAttribute",
            "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmulAlgoConfigGetAttribute", "cublasLtMatmul",
            "cublasLtMatmulAlgoCheck", "cublasLtMatmulDescGetAttribute", "cublasLtMatrixLayoutGetAttribute",
            "cublasLtMatmulPreferenceGetAttribute"};
        void **slots[] = {
            SLOT(kc_lt, cublasLtCreate), SLOT(kc_lt, cublasLtDestroy), SLOT(kc_lt, cublasLtGetVersion),
            SLOT(kc_lt, cublasLtGetStatusString), SLOT(kc_lt, cublasLtMatmulDescCreate),
            SLOT(kc_lt, cublasLtMatmulDescDestroy), SLOT(kc_lt, cublasLtMatmulDescSetAttribute),
            SLOT(kc_lt, cublasLtMatrixLayoutCreate), SLOT(kc_lt, cublasLtMatrixLayoutDestroy),
            SLOT(kc_lt, cublasLtMatmulPreferenceCreate), SLOT(kc_lt, cublasLtMatmulPreferenceDestroy),
            SLOT(kc_lt, cublasLtMatmulPreferenceSetAttribute), SLOT(kc_lt, cublasLtMatmulAlgoGetHeuristic),
            SLOT(kc_lt, cublasLtMatmulAlgoConfigGetAttribute), SLOT(kc_lt, cublasLtMatmul),
            SLOT(kc_lt, cublasLtMatmulAlgoCheck), SLOT(kc_lt, cublasLtMatmulDescGetAttribute),
            SLOT(kc_lt, cublasLtMatrixLayoutGetAttribute), SLOT(kc_lt, cublasLtMatmulPreferenceGetAttribute)};
        int n = (int)(sizeof names / sizeof names[0]);
        void *tmp[sizeof names / sizeof names[0]];
        if (resolve(lt_lib, "cuBLASLt", tmp, names, n)) {
            dlclose(lt_lib), lt_lib = NULL;
            return -1;
        }
        for (int i = 0; i < n; i++) memcpy(slots[i], &tmp[i], sizeof(void *));
    }
    if (!dnn_lib) {
        dnn_lib = open_lib("VGRPO_CUDNN_LIB", "libcudnn.so.9", "cuDNN", dnn_path, sizeof dnn_path);
        if (!dnn_lib) return -1;
        static const char *const names[] = {
            "cudnnGetVersion", "cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnGetErrorString",
            "cudnnGetLastErrorString", "cudnnBackendCreateDescriptor", "cudnnBackendDestroyDescriptor",
            "cudnnBackendSetAttribute", "cudnnBackendGetAttribute", "cudnnBackendFinalize", "cudnnBackendExecute"};
        void **slots[] = {SLOT(kc_dnn, cudnnGetVersion), SLOT(kc_dnn, cudnnCreate), SLOT(kc_dnn, cudnnDestroy),
                          SLOT(kc_dnn, cudnnSetStream), SLOT(kc_dnn, cudnnGetErrorString),
                          SLOT(kc_dnn, cudnnGetLastErrorString), SLOT(kc_dnn, cudnnBackendCreateDescriptor),
                          SLOT(kc_dnn, cudnnBackendDestroyDescriptor), SLOT(kc_dnn, cudnnBackendSetAttribute),
                          SLOT(kc_dnn, cudnnBackendGetAttribute), SLOT(kc_dnn, cudnnBackendFinalize),
                          SLOT(kc_dnn, cudnnBackendExecute)};
        int n = (int)(sizeof names / sizeof names[0]);
        void *tmp[sizeof names / sizeof names[0]];
        if (resolve(dnn_lib, "cuDNN", tmp, names, n)) {
            dlclose(dnn_lib), dnn_lib = NULL;
            return -1;
        }
        for (int i = 0; i < n; i++) memcpy(slots[i], &tmp[i], sizeof(void *));
    }
    return 0;
}

const char *kc_dynload_path(int cudnn) { return cudnn ? dnn_path : lt_path; }

void kc_dynload_close(void) {
    if (lt_lib) dlclose(lt_lib);
    if (dnn_lib) dlclose(dnn_lib);
    lt_lib = dnn_lib = NULL;
    memset(&kc_lt, 0, sizeof kc_lt);
    memset(&kc_dnn, 0, sizeof kc_dnn);
    lt_path[0] = dnn_path[0] = 0;
}
