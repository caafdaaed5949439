/* kernels/cuda/attn_graph.h — cuDNN operation graphs of scaled dot-product attention and their execution plans,
 * built for the GPU at hand (a cuDNN handle) or for a described one (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, no GPU
 * needed): the composite graphs cudnn-frontend's sdpa / sdpa_backward emit (matmul, pointwise, reduction and
 * reshape operations that the runtime-fusion flash-attention engines recognise), and the fused SDPA_FWD / SDPA_BWD
 * operations for comparison. Used by attn_cudnn.c (execution) and attn_plans.c (the plan report of
 * `vgrpo gpu-plans`). Not for use outside kernels/cuda/. */
#ifndef KERNELS_CUDA_ATTN_GRAPH_H
#define KERNELS_CUDA_ATTN_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kernels/cuda/attn_sched.h"
#include "kernels/cuda/dynload.h"

/* The oldest cuDNN the attention graphs were verified with (make test: gpu_plans_*): 9.19.0. */
#define KC_ATTN_CUDNN_MIN 91900
/* NVRTC's soname major when cuDNN does not say which CUDA it was built for: this build's (libnvrtc.so.13). */
#define KC_NVRTC_MAJOR (CUDART_VERSION / 1000)

/* Tensor unique ids of the variant pack (the graph's non-virtual tensors). */
enum { KC_ATTN_Q = 1, KC_ATTN_K, KC_ATTN_V, KC_ATTN_O, KC_ATTN_STATS, KC_ATTN_SCALE, KC_ATTN_DO, KC_ATTN_DQ,
       KC_ATTN_DK, KC_ATTN_DV, KC_ATTN_SOFTMAX_SUM, KC_ATTN_DQ_ACCUM, KC_ATTN_ONE };

/* How the graph is built. */
enum { KC_ATTN_COMPOSITE = 0, /* the frontend's composite graph (the default) */
       KC_ATTN_FUSED = 1 /* one SDPA_FWD / SDPA_BWD operation */ };

/* Everything that changes a plan: the plan cache key. One problem is ONE batch element (B = 1) and a group of H of
 * its Hs heads: the batch and the head groups are loops with the same plan (attn_cudnn.c), so the arithmetic of a
 * sample never depends on the batch size. The LSE / statistics rows [Hs, Sq] fp32 are 16-byte aligned at every
 * (element, head) start when Sq % 4 == 0; otherwise the statistics tensor is declared 4-byte aligned. */
typedef struct kc_attn_key {
    int bwd;           /* 0 forward, 1 backward */
    int Sq, Skv, H, Dh; /* sequence lengths, heads in one call, head dimension */
    int Hs;            /* heads of the rows in memory ([S, Hs, Dh]; H <= Hs: the call covers heads h0 .. h0+H-1) */
    int dtype;         /* cudnnDataType_t of Q, K, V, O, dO, dQ, dK, dV: CUDNN_DATA_BFLOAT16 only for now */
    int deterministic; /* backward: 1 = dQ written by the dP-workspace variant (no atomic fp32 dQ accumulation) */
    int build;         /* KC_ATTN_COMPOSITE or KC_ATTN_FUSED */
} kc_attn_key;

/* One configuration offered by the heuristics (for reports). */
typedef struct kc_attn_cfg_info {
    int mode;                /* 0 heuristics mode A, 1 FALLBACK */
    int64_t engine;          /* global engine index */
    int64_t cfg_workspace;   /* CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE (-1 unknown) */
    int64_t plan_workspace;  /* the finalised plan's workspace (-1 when it did not finalise) */
    char notes[160], knobs[256];
    int status;              /* cudnnStatus_t of the execution plan's finalisation */
    char message[512];       /* cuDNN's last error text when status != 0 */
    double seconds;          /* wall time of the finalisation (the NVRTC compile of runtime-compiled engines) */
    int chosen;              /* this configuration became p->plan */
} kc_attn_cfg_info;

#define KC_ATTN_MAX_DESCS 160

/* A built plan and every descriptor it was built from (freed together). */
typedef struct kc_attn_plan {
    kc_attn_key key;
    cudnnBackendDescriptor_t plan;
    cudnnBackendDescriptor_t keep[KC_ATTN_MAX_DESCS];
    int nkeep;
    int64_t engine;          /* global engine index */
    int64_t workspace;       /* cuDNN's workspace bytes */
    int64_t extra_bytes;     /* our own device buffers the graph reads/writes (backward: softmax_sum fp32 [H, Sq];
                              * non-deterministic: dQ_accum fp32 [H, Sq, Dh]) */
    char notes[160];         /* the engine's numerical and behaviour notes, comma-separated */
    char knobs[256];         /* the engine configuration's knob choices "TYPE=value ..." */
    int n_heur;              /* configurations offered by the heuristics (modes A then FALLBACK) */
    int n_fail;              /* configurations whose plan did not finalise */
    int n_ws;                /* configurations skipped: workspace above the limit */
    double build_s;          /* wall seconds: graph, heuristics, finalisation (NVRTC compiles included) */
    /* Planning without a GPU driver (the toolkit's stub libcuda): a configuration whose finalisation compiled and
     * stopped only at loading the module (EXECUTION_FAILED_CUDA_DRIVER from cuLibraryLoadData) is taken as the
     * answer: engine, knobs, notes and the configuration's workspace recorded, p->plan NULL, load_blocked 1. */
    int stop_at_load;
    int load_blocked;
    /* Optional: called for every configuration the heuristics offer, in order, with what became of it. */
    void (*on_cfg)(void *ctx, const kc_attn_cfg_info *info);
    void *on_cfg_ctx;
} kc_attn_plan;


/* Builds p->key's graph and the first heuristics configuration (mode A, then FALLBACK) whose plan finalises and
 * whose workspace is at most ws_limit bytes (< 0: no limit). Exactly one of handle / devprop is set: handle for the
 * GPU in use, devprop for a described device (kc_attn_devprop). On failure returns -1 with core_error naming the
 * call and cuDNN's status and message (graph finalisation, no configuration, every plan refused, workspace). */
int kc_attn_plan_build(kc_attn_plan *p, cudnnHandle_t handle, cudnnBackendDescriptor_t devprop, int64_t ws_limit);
void kc_attn_plan_free(kc_attn_plan *p);

/* A finalised CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR describing an H100 SXM5 80 GB (gpu = "h100") or an H200 SXM 141
 * GB ("h200"): compute capability 9.0, 132 SMs, 227 KiB opt-in shared memory per block, 50 MiB L2 (NVIDIA's
 * Hopper tuning guide / CUDA device query of those cards). *out is the caller's to destroy. -1 with core_error. */
int kc_attn_devprop(const char *gpu, cudnnBackendDescriptor_t *out);

/* One-line description of a key ("bwd S 32760x32760 H 12 D 128 bf16 deterministic composite"). */
void kc_attn_key_str(const kc_attn_key *k, char *out, size_t cap);

/* ---- the plan choice of attn_cudnn.c (pure functions: the same answers on every machine and process) ---- */

/* The workspace budget of one attention call: kc_attn_workspace_budget (kernels/cuda/attn_sched.h). */
/* Heads per call: kc_attn_heads_per_call (attn_sched.h). */
/* The plan key of an attention call: no batch size in it (the batch is a loop over one plan). */
kc_attn_key kc_attn_key_for(int bwd, int Sq, int Skv, int H, int Dh, int deterministic, int64_t budget);

/* ---- the libraries around cuDNN (attn_libs.c) ---- */

/* Opens libnvrtc.so.<major of cudnnGetCudartVersion> (RTLD_GLOBAL) before cuDNN needs it: $VGRPO_NVRTC_LIB, else
 * the soname through the loader, else
 * beside cuDNN (cudnn_path: the file cuDNN was loaded from), the pip-wheel layout ../../cuda_nvrtc/lib,
 * $CUDA_HOME/lib64, /usr/local/cuda/lib64. 0, or -1 with a message listing what was searched. */
int kc_attn_nvrtc_preload(const char *cudnn_path);
/* The NVRTC file loaded ("" if none). */
const char *kc_attn_nvrtc_path(void);
/* 0 when cuDNN's version (cudnnGetVersion) is at least KC_ATTN_CUDNN_MIN and below 10.0, else -1 with a message.
 * attn_cudnn.c refuses attention (only attention) on an unverified cuDNN unless VGRPO_CUDNN_UNVERIFIED=1. */
int kc_attn_cudnn_version_ok(size_t version);
/* For planning on a machine that may have no GPU driver (`vgrpo gpu-plans`): opens libcuda.so.1, else the toolkit's
 * stub lib64/stubs/libcuda.so ($CUDA_HOME, /usr/local/cuda). Returns 1 (a driver: plans can finalise), 0 (the stub:
 * plans compile but their finalisation stops at loading the module), -1 (neither: runtime-compiled engines are not
 * offered); what describes it. Never call it in a process that runs on a GPU. */
int kc_attn_driver_for_planning(char *what, size_t cap);

#endif
