/* kernels/cuda/dynload.h — cuBLASLt and cuDNN, loaded at run time (dlopen) instead of linked: a CUDA build then
 * starts, and runs every CPU path, on a machine without these libraries, and the GPU check can use whichever copies
 * the GPU machine has (the CUDA toolkit's, or PyTorch's nvidia-* wheels). The headers give the types and enums;
 * calls go through the function pointers below (same names as the libraries' functions). */
#ifndef KERNELS_CUDA_DYNLOAD_H
#define KERNELS_CUDA_DYNLOAD_H

#include <cublasLt.h>
#include <cudnn.h>

typedef struct kc_lt_api {
    __typeof__(&cublasLtCreate) cublasLtCreate;
    __typeof__(&cublasLtDestroy) cublasLtDestroy;
    __typeof__(&cublasLtGetVersion) cublasLtGetVersion;
    __typeof__(&cublasLtGetStatusString) cublasLtGetStatusString;
    __typeof__(&cublasLtMatmulDescCreate) cublasLtMatmulDescCreate;
    __typeof__(&cublasLtMatmulDescDestroy) cublasLtMatmulDescDestroy;
    __typeof__(&cublasLtMatmulDescSetAttribute) cublasLtMatmulDescSetAttribute;
    __typeof__(&cublasLtMatrixLayoutCreate) cublasLtMatrixLayoutCreate;
    __typeof__(&cublasLtMatrixLayoutDestroy) cublasLtMatrixLayoutDestroy;
    __typeof__(&cublasLtMatmulPreferenceCreate) cublasLtMatmulPreferenceCreate;
    __typeof__(&cublasLtMatmulPreferenceDestroy) cublasLtMatmulPreferenceDestroy;
    __typeof__(&cublasLtMatmulPreferenceSetAttribute) cublasLtMatmulPreferenceSetAttribute;
    __typeof__(&cublasLtMatmulAlgoGetHeuristic) cublasLtMatmulAlgoGetHeuristic;
    __typeof__(&cublasLtMatmulAlgoConfigGetAttribute) cublasLtMatmulAlgoConfigGetAttribute;
    __typeof__(&cublasLtMatmul) cublasLtMatmul;
    __typeof__(&cublasLtMatmulAlgoCheck) cublasLtMatmulAlgoCheck;
    __typeof__(&cublasLtMatmulDescGetAttribute) cublasLtMatmulDescGetAttribute;
    __typeof__(&cublasLtMatrixLayoutGetAttribute) cublasLtMatrixLayoutGetAttribute;
    __typeof__(&cublasLtMatmulPreferenceGetAttribute) cublasLtMatmulPreferenceGetAttribute;
} kc_lt_api;

typedef struct kc_dnn_api {
    __typeof__(&cudnnGetVersion) cudnnGetVersion;
    __typeof__(&cudnnCreate) cudnnCreate;
    __typeof__(&cudnnDestroy) cudnnDestroy;
    __typeof__(&cudnnSetStream) cudnnSetStream;
    __typeof__(&cudnnGetErrorString) cudnnGetErrorString;
    __typeof__(&cudnnGetLastErrorString) cudnnGetLastErrorString;
    __typeof__(&cudnnBackendCreateDescriptor) cudnnBackendCreateDescriptor;
    __typeof__(&cudnnBackendDestroyDescriptor) cudnnBackendDestroyDescriptor;
    __typeof__(&cudnnBackendSetAttribute) cudnnBackendSetAttribute;
    __typeof__(&cudnnBackendGetAttribute) cudnnBackendGetAttribute;
    __typeof__(&cudnnBackendFinalize) cudnnBackendFinalize;
    __typeof__(&cudnnBackendExecute) cudnnBackendExecute;
} kc_dnn_api;

/* Filled by kc_dynload (NULL members until then). */
extern kc_lt_api kc_lt;
extern kc_dnn_api kc_dnn;

/* Loads both libraries once: the file named by $VGRPO_CUBLASLT_LIB / $VGRPO_CUDNN_LIB when set, else the sonames
 * (libcublasLt.so.13, libcudnn.so.9) through the dynamic linker's search (LD_LIBRARY_PATH, this binary's run path,
 * the ldconfig cache). Returns 0, or -1 with a message naming the library and dlerror's reason. */
int kc_dynload(void);
/* The file each library was loaded from ("" before kc_dynload). */
const char *kc_dynload_path(int cudnn);
/* Closes both (after the handles are destroyed). */
void kc_dynload_close(void);

#endif
