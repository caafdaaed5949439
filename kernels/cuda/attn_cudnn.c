/* kernels/cuda/attn_cudnn.c — scaled dot-product attention on the GPU through cuDNN's backend API: the composite
 * graphs of cudnn-frontend's sdpa / sdpa_backward (attn_graph.c), no mask, no dropout, bf16 Q/K/V/O, fp32 softmax
 * statistics (our LSE [B, H, Sq], natural log of the scaled scores' row sums, docs/design.md section 5).
 *
 * Why composite: the fused CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR does not build with cuDNN 9.19 (operation
 * graph finalisation: CUDNN_STATUS_BAD_PARAM in buildDAG; `vgrpo gpu-plans` shows it), and NVIDIA's frontend never
 * emits it: it builds the matmul / pointwise / reduction / reshape graph that the runtime-fusion flash-attention
 * engines recognise. The forward is built the same way (SDPA_FWD builds too; the composite is what the frontend
 * emits and what the backward's statistics are defined against).
 *
 * Determinism: every SDPA engine carries only the TENSOR_CORE and RUNTIME_COMPILATION notes, so the engine notes
 * cannot tell. What decides is the backward graph: by default dQ is written directly by its matmul — the frontend's
 * set_deterministic_algorithm(true) variant on Hopper, which computes dP into a workspace of H*Sq*Skv bf16 per call
 * (pad 128) instead of accumulating dQ in fp32 with atomics across key blocks. k_attention_allow_nondeterministic(1)
 * builds the atomic variant (fp32 dQ_accum, small workspace) for measurements only. A GPU proves it: gpu_check's
 * repeat column (the same backward twice, bit for bit).
 *
 * Batch invariance: a plan is built for ONE batch element and a group of heads; the batch and the head groups are
 * loops of the same plan with offset pointers (each element and head is independent in flash attention), so a
 * sample's arithmetic is the same whatever batch it is in (rollout and training batch differently; parity 0 needs
 * this). The head group is the largest divisor of H whose deterministic dP workspace fits the workspace budget
 * (VGRPO_ATTN_WORKSPACE_GIB, default 4; every process of a run must use the same value): at 32,760 tokens, H 12
 * the whole-call workspace would be 24 GiB (A14B, H 40: 80 GiB), so both run one head per call (2 GiB + 256
 * bytes, measured from cuDNN's configuration); at 14,040 tokens the 1.3B runs 6 heads per call (2.3 GiB). The
 * forward's workspace is tiny: all heads in one call.
 *
 * Plans: one per kc_attn_key (direction, Sq, Skv, heads per call, heads, Dh, dtype, determinism, build), built on
 * first use (NVRTC compiles the kernel: about 1-2 s per plan on a CPU core) and cached until shutdown; the first
 * configuration the heuristics (mode A, then FALLBACK) offer whose plan finalises and whose workspace is within the
 * budget. The backward writes dQ/dK/dV into scratch buffers and adds them to the caller's (kernels.h: backwards
 * accumulate).
 * Not yet run on a GPU: `vgrpo gpu-plans` builds these graphs for a described H100/H200 on a CPU (make test). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/attn_graph.h"
#include "kernels/cuda/attn_sched.h"
#include "kernels/cuda/dynload.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/precond/kc_precond.h"

static cudnnHandle_t dnn;
static kc_attn_plan **plans;
static int nplans, cap_plans;
static int allow_nondet;
/* Why attention cannot run here (cuDNN too old, no NVRTC), "" when it can: recorded at start-up and returned by every
 * attention call, so that the rest of the backend (GEMMs, our kernels) still starts and can be checked. */
static char unavailable[CORE_ERROR_MAX];

static int dnn_check(cudnnStatus_t st, const char *what) {
    if (st == CUDNN_STATUS_SUCCESS) return 0;
    char detail[512] = "";
    kc_dnn.cudnnGetLastErrorString(detail, sizeof detail);
    return core_error("cuDNN: %s: %s%s%s", what, kc_dnn.cudnnGetErrorString(st), detail[0] ? ": " : "", detail);
}

int kc_attn_init(void) {
    if (dnn) return 0;
    unavailable[0] = 0;
    const char *unverified = getenv("VGRPO_CUDNN_UNVERIFIED");
    if ((kc_attn_cudnn_version_ok(kc_dnn.cudnnGetVersion()) && !(unverified && !strcmp(unverified, "1"))) ||
        kc_attn_nvrtc_preload(kc_dynload_path(1)))
        snprintf(unavailable, sizeof unavailable, "%s", core_last_error());
    if (dnn_check(kc_dnn.cudnnCreate(&dnn), "cudnnCreate")) return -1;
    return dnn_check(kc_dnn.cudnnSetStream(dnn, kc_stream), "cudnnSetStream");
}

void kc_attn_shutdown(void) {
    for (int i = 0; i < nplans; i++) {
        kc_attn_plan_free(plans[i]);
        free(plans[i]);
    }
    free(plans);
    plans = NULL, nplans = cap_plans = 0;
    if (dnn) kc_dnn.cudnnDestroy(dnn);
    dnn = NULL;
}

void k_attention_allow_nondeterministic(int allow) { allow_nondet = allow; }

static int same_key(const kc_attn_key *a, const kc_attn_key *b) {
    return a->bwd == b->bwd && a->Sq == b->Sq && a->Skv == b->Skv && a->H == b->H && a->Hs == b->Hs &&
           a->Dh == b->Dh && a->dtype == b->dtype && a->deterministic == b->deterministic && a->build == b->build;
}

kc_attn_key kc_attn_key_for(int bwd, int Sq, int Skv, int H, int Dh, int deterministic, int64_t budget) {
    kc_attn_key k = {.bwd = bwd, .Sq = Sq, .Skv = Skv, .Hs = H, .Dh = Dh, .dtype = CUDNN_DATA_BFLOAT16,
                     .deterministic = bwd ? deterministic : 1, .build = KC_ATTN_COMPOSITE};
    k.H = kc_attn_heads_per_call(bwd, k.deterministic, Sq, Skv, H, budget);
    return k;
}

static kc_attn_plan *find_plan(const kc_attn_key *k) {
    for (int i = 0; i < nplans; i++)
        if (same_key(&plans[i]->key, k)) return plans[i];
    return NULL;
}

/* The cached plan of (direction, Sq, Skv, H, Dh) under the current determinism setting: built on first use. When
 * the chosen head group's configurations all need more workspace than the budget, smaller groups are tried. */
static kc_attn_plan *get_plan(int bwd, int Sq, int Skv, int H, int Dh) {
    if (unavailable[0]) {
        core_error("attention on cuDNN is unavailable: %s", unavailable);
        return NULL;
    }
    const int64_t budget = kc_attn_workspace_budget();
    kc_attn_key k = kc_attn_key_for(bwd, Sq, Skv, H, Dh, !allow_nondet, budget);
    kc_attn_plan *p = find_plan(&k);
    if (p) return p;
    if (nplans == cap_plans) {
        int cap = cap_plans ? 2 * cap_plans : 16;
        kc_attn_plan **np = realloc(plans, (size_t)cap * sizeof *np);
        if (!np) {
            core_error("cuDNN: out of memory for the attention plan cache");
            return NULL;
        }
        plans = np, cap_plans = cap;
    }
    if (!(p = calloc(1, sizeof *p))) {
        core_error("cuDNN: out of memory for an attention plan");
        return NULL;
    }
    for (;;) {
        p->key = k;
        if (!kc_attn_plan_build(p, dnn, NULL, budget)) break;
        int over_budget_only = p->n_ws > 0 && p->n_fail == 0;
        kc_attn_plan_free(p);
        int hc = k.H - 1;
        while (hc > 1 && H % hc) hc--;
        if (!over_budget_only || k.H == 1) {
            free(p);
            return NULL;
        }
        k.H = hc; /* the same for every process with the same budget: still one plan per shape */
    }
    plans[nplans++] = p;
    return p;
}

/* Runs p once; uids/ptrs name the variant pack. The workspace slot holds cuDNN's workspace and then, 256-byte
 * aligned, our extra buffers (softmax_sum, dQ_accum); *extra receives their start. */
static int execute(kc_attn_plan *p, const int64_t *uids, void **ptrs, int n, const char *what) {
    void *ws = NULL;
    if (p->workspace > 0 && !(ws = kc_scratch(KC_SLOT_ATTN_WS, (size_t)p->workspace))) return -1;
    cudnnBackendDescriptor_t vp = NULL;
    int rc = dnn_check(kc_dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp), what);
    if (!rc)
        rc = dnn_check(kc_dnn.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                                       uids),
                       what) ||
             dnn_check(kc_dnn.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                                       n, ptrs),
                       what) ||
             dnn_check(kc_dnn.cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                                       &ws),
                       what) ||
             dnn_check(kc_dnn.cudnnBackendFinalize(vp), what) ||
             dnn_check(kc_dnn.cudnnBackendExecute(dnn, p->plan, vp), what);
    if (vp) kc_dnn.cudnnBackendDestroyDescriptor(vp);
    return rc ? -1 : 0;
}

int kc_attention_forward(kb_out ov, float *lse, kb_in qv, kb_in kv, kb_in vv, int B, int Sq, int Skv, int H, int Dh,
                         float scale) {
    if (kc_precond_attention_forward(ov, lse, qv, kv, vv, B, Sq, Skv, H, Dh)) return -1; /* bf16 views */
    kb_bf16 *o = ov.p;
    const kb_bf16 *q = qv.p, *k = kv.p, *v = vv.p;
    kc_attn_plan *p = get_plan(0, Sq, Skv, H, Dh);
    if (!p) return -1;
    const int hc = p->key.H;
    const int64_t uids[6] = {KC_ATTN_Q, KC_ATTN_K, KC_ATTN_V, KC_ATTN_O, KC_ATTN_STATS, KC_ATTN_SCALE};
    for (int i = 0; i < kc_attn_executions(B, H, hc); i++) {
        const kc_attn_exec e = kc_attn_execution(i, Sq, Skv, H, hc, Dh);
        void *ptrs[6] = {(void *)(q + e.q), (void *)(k + e.kv), (void *)(v + e.kv), o + e.q, lse + e.lse, &scale};
        if (execute(p, uids, ptrs, 6, "attention forward execute")) return -1;
    }
    return 0;
}

int kc_attention_backward(kb_out dqv, kb_out dkv, kb_out dvv, kb_in doutv, kb_in qv, kb_in kv, kb_in vv, kb_in ov,
                          const float *lse, int B, int Sq, int Skv, int H, int Dh, float scale) {
    if (kc_precond_attention_backward(dqv, dkv, dvv, doutv, qv, kv, vv, ov, lse, B, Sq, Skv, H, Dh)) return -1;
    kb_bf16 *dq = dqv.p, *dk = dkv.p, *dv = dvv.p; /* bf16 views (NULL: not wanted) */
    const kb_bf16 *dout = doutv.p, *q = qv.p, *k = kv.p, *v = vv.p, *o = ov.p;
    const size_t nq = (size_t)B * Sq * H * Dh, nk = (size_t)B * Skv * H * Dh;
    kc_attn_plan *p = get_plan(1, Sq, Skv, H, Dh);
    if (!p) return -1;
    const int hc = p->key.H, det = p->key.deterministic;
    kb_bf16 *sq = kc_scratch(KC_SLOT_ATTN_DQ, nq * sizeof(kb_bf16)),
            *sk = kc_scratch(KC_SLOT_ATTN_DK, nk * sizeof(kb_bf16)),
            *sv = kc_scratch(KC_SLOT_ATTN_DV, nk * sizeof(kb_bf16));
    /* softmax_sum (and dQ_accum) after cuDNN's workspace in the workspace slot */
    const size_t ws_off = ((size_t)p->workspace + 255) / 256 * 256;
    char *ws = kc_scratch(KC_SLOT_ATTN_WS, ws_off + (size_t)p->extra_bytes);
    if (!sq || !sk || !sv || !ws) return -1;
    float *ssum = (float *)(ws + ws_off), *acc = ssum + (size_t)hc * Sq;
    float one = 1.0f;
    const int64_t uids[13] = {KC_ATTN_Q,  KC_ATTN_K,     KC_ATTN_V,   KC_ATTN_O,  KC_ATTN_DO,
                              KC_ATTN_STATS, KC_ATTN_SCALE, KC_ATTN_ONE, KC_ATTN_DQ, KC_ATTN_DK,
                              KC_ATTN_DV, KC_ATTN_SOFTMAX_SUM, KC_ATTN_DQ_ACCUM};
    for (int i = 0; i < kc_attn_executions(B, H, hc); i++) {
        const kc_attn_exec e = kc_attn_execution(i, Sq, Skv, H, hc, Dh);
        void *ptrs[13] = {(void *)(q + e.q), (void *)(k + e.kv), (void *)(v + e.kv), (void *)(o + e.q),
                          (void *)(dout + e.q), (void *)(lse + e.lse), &scale, &one, sq + e.q, sk + e.kv, sv + e.kv,
                          ssum, acc};
        if (execute(p, uids, ptrs, det ? 12 : 13, "attention backward execute")) return -1;
    }
    if (dq && kc_add(kb_out_bf16(dq), kb_in_bf16(sq), (int64_t)nq)) return -1;
    if (dk && kc_add(kb_out_bf16(dk), kb_in_bf16(sk), (int64_t)nk)) return -1;
    if (dv && kc_add(kb_out_bf16(dv), kb_in_bf16(sv), (int64_t)nk)) return -1;
    return 0;
}

int k_attention_engine_of(int backward, int B, int Sq, int Skv, int H, int Dh, int64_t *engine_id, size_t *workspace) {
    (void)B; /* one plan for every batch size */
    kc_attn_key k = kc_attn_key_for(!!backward, Sq, Skv, H, Dh, !allow_nondet, kc_attn_workspace_budget());
    kc_attn_plan *p = find_plan(&k);
    for (int i = 0; !p && i < nplans; i++) /* a smaller head group chosen when the first exceeded the budget */
        if (plans[i]->key.bwd == k.bwd && plans[i]->key.Sq == Sq && plans[i]->key.Skv == Skv && plans[i]->key.Hs == H &&
            plans[i]->key.Dh == Dh && plans[i]->key.deterministic == k.deterministic)
            p = plans[i];
    if (!p) return -1;
    if (engine_id) *engine_id = p->engine;
    if (workspace) *workspace = (size_t)p->workspace;
    return !p->key.deterministic;
}
