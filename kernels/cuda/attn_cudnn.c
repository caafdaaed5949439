/* kernels/cuda/attn_cudnn.c — scaled dot-product attention on the GPU through cuDNN's backend API: the fused
 * attention operations CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR (cuDNN >= 9.13) and SDPA_BWD (>= 9.17), no mask,
 * no dropout, bf16 Q/K/V/O, fp32 softmax statistics.
 *
 * Layout: our heads are [B, S, H, Dh] (kernels.h); cuDNN's logical SDPA tensor is [B, H, S, Dh], so each tensor is
 * described with dims {B, H, S, Dh} and strides {S*H*Dh, Dh, H*Dh, 1} (no copy). The statistics output is the
 * natural-log log-sum-exp of the scaled scores per query row, dims {B, H, S, 1} fp32, which is exactly our LSE
 * [B, H, S] (docs/design.md section 5: one interface for the CPU kernel, cuDNN SDPA and the ring merge). The scale is a
 * by-value fp32 tensor, so one plan serves every scale.
 *
 * Plans: one per (direction, B, Sq, Skv, H, Dh), built on first use and cached: operation graph, engine heuristics
 * (mode A, then FALLBACK when A offers nothing), and the first engine configuration that finalises whose engine
 * does NOT carry CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC (so a repeated call gives the same bits; the backward's dQ
 * accumulation is where nondeterministic engines live). k_attention_allow_nondeterministic(1) lifts that filter for
 * measurements only. The backward writes cuDNN's dQ/dK/dV into scratch buffers and adds them to the caller's
 * (kernels.h: backwards accumulate).
 * Not yet run on a GPU: whether SDPA_BWD finalises with this cuDNN, which engines it offers and whether one is
 * deterministic are exactly what scripts/gpu_check.sh reports.
 * Sources: cuDNN backend API reference (descriptor types, attributes, cudnnBackendExecute); cudnn-frontend's SDPA
 * samples read for the tensor roles and the stats layout. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/dynload.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/precond/kc_precond.h"

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_DO, UID_DQ, UID_DK, UID_DV };

#define MAX_DESCS 128

typedef struct {
    int bwd, B, Sq, Skv, H, Dh;
    cudnnBackendDescriptor_t plan;
    cudnnBackendDescriptor_t keep[MAX_DESCS]; /* every descriptor the plan was built from, destroyed at shutdown */
    int nkeep;
    int64_t engine, workspace;
    int nondeterministic; /* the chosen engine carries the NONDETERMINISTIC note (only when allowed) */
} attn_plan;

static cudnnHandle_t dnn;
static attn_plan *plans;
static int nplans, cap_plans;
static int allow_nondet;

static int dnn_check(cudnnStatus_t st, const char *what) {
    if (st == CUDNN_STATUS_SUCCESS) return 0;
    char detail[512] = "";
    kc_dnn.cudnnGetLastErrorString(detail, sizeof detail);
    return core_error("cuDNN: %s: %s%s%s", what, kc_dnn.cudnnGetErrorString(st), detail[0] ? ": " : "", detail);
}

int kc_attn_init(void) {
    if (dnn) return 0;
    if (dnn_check(kc_dnn.cudnnCreate(&dnn), "cudnnCreate")) return -1;
    return dnn_check(kc_dnn.cudnnSetStream(dnn, kc_stream), "cudnnSetStream");
}

static void plan_free(attn_plan *p) {
    if (p->plan) kc_dnn.cudnnBackendDestroyDescriptor(p->plan);
    for (int i = p->nkeep - 1; i >= 0; i--)
        if (p->keep[i]) kc_dnn.cudnnBackendDestroyDescriptor(p->keep[i]);
    memset(p, 0, sizeof *p);
}

void kc_attn_shutdown(void) {
    for (int i = 0; i < nplans; i++) plan_free(&plans[i]);
    free(plans);
    plans = NULL, nplans = cap_plans = 0;
    if (dnn) kc_dnn.cudnnDestroy(dnn);
    dnn = NULL;
}

void k_attention_allow_nondeterministic(int allow) { allow_nondet = allow; }

/* A new descriptor recorded in p->keep. */
static cudnnBackendDescriptor_t new_desc(attn_plan *p, cudnnBackendDescriptorType_t t, const char *what) {
    if (p->nkeep == MAX_DESCS) {
        core_error("cuDNN: too many descriptors for one attention plan");
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    if (dnn_check(kc_dnn.cudnnBackendCreateDescriptor(t, &d), what)) return NULL;
    p->keep[p->nkeep++] = d;
    return d;
}

static int set_attr(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                    int64_t n, const void *v, const char *what) {
    return dnn_check(kc_dnn.cudnnBackendSetAttribute(d, a, t, n, v), what);
}

static int set_desc_attr(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendDescriptor_t v,
                         const char *what) {
    return set_attr(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

/* A finalised tensor descriptor: 4-D dims and strides, dtype, uid; by_value for the host scalar. */
static cudnnBackendDescriptor_t tensor(attn_plan *p, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                                       const int64_t strides[4], bool by_value) {
    cudnnBackendDescriptor_t d = new_desc(p, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
    int64_t align = 16;
    if (!d || set_attr(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor dtype") ||
        set_attr(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dims") ||
        set_attr(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides") ||
        set_attr(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid") ||
        set_attr(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment") ||
        (by_value && set_attr(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "by value")) ||
        dnn_check(kc_dnn.cudnnBackendFinalize(d), "tensor finalize"))
        return NULL;
    return d;
}

static int engine_is_nondeterministic(cudnnBackendDescriptor_t eng) {
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t n = 0;
    if (kc_dnn.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                        CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS)
        return 1; /* notes unknown: treat as nondeterministic */
    for (int64_t i = 0; i < n; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return 1;
    return 0;
}

/* Builds the plan of p's problem: tensors, the SDPA operation, the graph, heuristics, the first deterministic
 * engine configuration that finalises. */
static int build_plan(attn_plan *p) {
    const int64_t B = p->B, H = p->H, Sq = p->Sq, Skv = p->Skv, D = p->Dh;
    const int64_t dq[4] = {B, H, Sq, D}, sq_[4] = {Sq * H * D, D, H * D, 1};
    const int64_t dk[4] = {B, H, Skv, D}, sk[4] = {Skv * H * D, D, H * D, 1};
    const int64_t ds[4] = {B, H, Sq, 1}, ss[4] = {H * Sq, Sq, 1, 1};
    const int64_t one[4] = {1, 1, 1, 1};
    const cudnnDataType_t bf = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t q = tensor(p, UID_Q, bf, dq, sq_, false), k = tensor(p, UID_K, bf, dk, sk, false),
                             v = tensor(p, UID_V, bf, dk, sk, false), o = tensor(p, UID_O, bf, dq, sq_, false),
                             st = tensor(p, UID_STATS, f32, ds, ss, false), sc = tensor(p, UID_SCALE, f32, one, one, true);
    if (!q || !k || !v || !o || !st || !sc) return -1;
    cudnnBackendDescriptor_t op;
    if (!p->bwd) {
        op = new_desc(p, CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, "SDPA forward descriptor");
        if (!op || set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q, "SDPA fwd Q") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k, "SDPA fwd K") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v, "SDPA fwd V") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o, "SDPA fwd O") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, st, "SDPA fwd stats") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, sc, "SDPA fwd scale") ||
            dnn_check(kc_dnn.cudnnBackendFinalize(op), "SDPA forward finalize"))
            return -1;
    } else {
        cudnnBackendDescriptor_t dO = tensor(p, UID_DO, bf, dq, sq_, false), dQ = tensor(p, UID_DQ, bf, dq, sq_, false),
                                 dK = tensor(p, UID_DK, bf, dk, sk, false), dV = tensor(p, UID_DV, bf, dk, sk, false);
        if (!dO || !dQ || !dK || !dV) return -1;
        op = new_desc(p, CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR, "SDPA backward descriptor");
        if (!op || set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC, q, "SDPA bwd Q") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC, k, "SDPA bwd K") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC, v, "SDPA bwd V") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC, o, "SDPA bwd O") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC, dO, "SDPA bwd dO") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC, st, "SDPA bwd stats") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC, sc, "SDPA bwd scale") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC, dQ, "SDPA bwd dQ") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC, dK, "SDPA bwd dK") ||
            set_desc_attr(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC, dV, "SDPA bwd dV") ||
            dnn_check(kc_dnn.cudnnBackendFinalize(op), "SDPA backward finalize"))
            return -1;
    }
    cudnnBackendDescriptor_t graph = new_desc(p, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    if (!graph || set_attr(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op, "graph ops") ||
        set_attr(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &dnn, "graph handle") ||
        dnn_check(kc_dnn.cudnnBackendFinalize(graph), "operation graph finalize"))
        return -1;
    int tried = 0, skipped_nondet = 0;
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int mi = 0; mi < 2 && !p->plan; mi++) {
        cudnnBackendDescriptor_t heur = new_desc(p, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
        if (!heur || set_desc_attr(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph") ||
            set_attr(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi], "heuristics mode") ||
            dnn_check(kc_dnn.cudnnBackendFinalize(heur), "heuristics finalize"))
            return -1;
        int64_t count = 0;
        if (dnn_check(kc_dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL),
                      "heuristics count"))
            return -1;
        if (count > 16) count = 16;
        if (count < 1) continue;
        cudnnBackendDescriptor_t cfgs[16];
        for (int64_t i = 0; i < count; i++)
            if (!(cfgs[i] = new_desc(p, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"))) return -1;
        int64_t got = 0;
        if (dnn_check(kc_dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs),
                      "heuristics results"))
            return -1;
        for (int64_t i = 0; i < got && !p->plan; i++) {
            cudnnBackendDescriptor_t eng = new_desc(p, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
            int64_t one_ = 0;
            if (!eng || kc_dnn.cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE,
                                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &one_, &eng) !=
                            CUDNN_STATUS_SUCCESS)
                continue;
            tried++;
            int nondet = engine_is_nondeterministic(eng);
            if (nondet && !allow_nondet) {
                skipped_nondet++;
                continue;
            }
            cudnnBackendDescriptor_t plan = NULL;
            if (kc_dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
                CUDNN_STATUS_SUCCESS)
                continue;
            if (kc_dnn.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &dnn) !=
                    CUDNN_STATUS_SUCCESS ||
                kc_dnn.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]) != CUDNN_STATUS_SUCCESS ||
                kc_dnn.cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS) {
                kc_dnn.cudnnBackendDestroyDescriptor(plan);
                continue;
            }
            int64_t ws = 0, cnt = 0, idx = -1;
            kc_dnn.cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt,
                                            &ws);
            kc_dnn.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, &idx);
            p->plan = plan, p->workspace = ws, p->engine = idx, p->nondeterministic = nondet;
        }
    }
    if (!p->plan)
        return core_error("cuDNN: no %sengine for attention %s B %d Sq %d Skv %d H %d Dh %d (%d engine configurations "
                          "tried, %d skipped as NONDETERMINISTIC)",
                          allow_nondet ? "" : "deterministic ", p->bwd ? "backward" : "forward", p->B, p->Sq, p->Skv,
                          p->H, p->Dh, tried, skipped_nondet);
    return 0;
}

static attn_plan *find_plan(int bwd, int B, int Sq, int Skv, int H, int Dh) {
    for (int i = 0; i < nplans; i++) {
        attn_plan *p = &plans[i];
        if (p->bwd == bwd && p->B == B && p->Sq == Sq && p->Skv == Skv && p->H == H && p->Dh == Dh) return p;
    }
    return NULL;
}

static attn_plan *get_plan(int bwd, int B, int Sq, int Skv, int H, int Dh) {
    attn_plan *p = find_plan(bwd, B, Sq, Skv, H, Dh);
    if (p) return p;
    if (nplans == cap_plans) {
        int cap = cap_plans ? 2 * cap_plans : 16;
        attn_plan *np = realloc(plans, (size_t)cap * sizeof *np);
        if (!np) {
            core_error("cuDNN: out of memory for the attention plan cache");
            return NULL;
        }
        plans = np, cap_plans = cap;
    }
    p = &plans[nplans];
    memset(p, 0, sizeof *p);
    p->bwd = bwd, p->B = B, p->Sq = Sq, p->Skv = Skv, p->H = H, p->Dh = Dh;
    if (build_plan(p)) {
        plan_free(p);
        return NULL;
    }
    nplans++;
    return p;
}

static int execute(attn_plan *p, const int64_t *uids, void **ptrs, int n, const char *what) {
    void *ws = NULL;
    if (p->workspace > 0 && !(ws = kc_scratch(KC_SLOT_ATTN_WS, (size_t)p->workspace))) return -1;
    cudnnBackendDescriptor_t vp = NULL;
    int rc = dnn_check(kc_dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp), what);
    if (!rc)
        rc = set_attr(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids, what) ||
             set_attr(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs, what) ||
             set_attr(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, what) ||
             dnn_check(kc_dnn.cudnnBackendFinalize(vp), what) ||
             dnn_check(kc_dnn.cudnnBackendExecute(dnn, p->plan, vp), what);
    if (vp) kc_dnn.cudnnBackendDestroyDescriptor(vp);
    return rc ? -1 : 0;
}

int kc_attention_forward(kb_bf16 *o, float *lse, const kb_bf16 *q, const kb_bf16 *k, const kb_bf16 *v, int B, int Sq,
                         int Skv, int H, int Dh, float scale) {
    if (kc_precond_attention_forward(o, lse, q, k, v, B, Sq, Skv, H, Dh)) return -1;
    attn_plan *p = get_plan(0, B, Sq, Skv, H, Dh);
    if (!p) return -1;
    const int64_t uids[6] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE};
    void *ptrs[6] = {(void *)q, (void *)k, (void *)v, o, lse, &scale};
    return execute(p, uids, ptrs, 6, "SDPA forward execute");
}

int kc_attention_backward(kb_bf16 *dq, kb_bf16 *dk, kb_bf16 *dv, const kb_bf16 *dout, const kb_bf16 *q,
                          const kb_bf16 *k, const kb_bf16 *v, const kb_bf16 *o, const float *lse, int B, int Sq,
                          int Skv, int H, int Dh, float scale) {
    if (kc_precond_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, B, Sq, Skv, H, Dh)) return -1;
    const size_t nq = (size_t)B * Sq * H * Dh, nk = (size_t)B * Skv * H * Dh;
    attn_plan *p = get_plan(1, B, Sq, Skv, H, Dh);
    if (!p) return -1;
    kb_bf16 *sq = kc_scratch(KC_SLOT_ATTN_DQ, nq * sizeof(kb_bf16)), *sk = kc_scratch(KC_SLOT_ATTN_DK, nk * sizeof(kb_bf16)),
            *sv = kc_scratch(KC_SLOT_ATTN_DV, nk * sizeof(kb_bf16));
    if (!sq || !sk || !sv) return -1;
    const int64_t uids[10] = {UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_SCALE, UID_DQ, UID_DK, UID_DV};
    void *ptrs[10] = {(void *)q, (void *)k, (void *)v, (void *)o, (void *)dout, (void *)lse, &scale, sq, sk, sv};
    if (execute(p, uids, ptrs, 10, "SDPA backward execute")) return -1;
    if (dq && kc_add(kb_out_bf16(dq), kb_in_bf16(sq), (int64_t)nq)) return -1;
    if (dk && kc_add(kb_out_bf16(dk), kb_in_bf16(sk), (int64_t)nk)) return -1;
    if (dv && kc_add(kb_out_bf16(dv), kb_in_bf16(sv), (int64_t)nk)) return -1;
    return 0;
}

int k_attention_engine_of(int backward, int B, int Sq, int Skv, int H, int Dh, int64_t *engine_id, size_t *workspace) {
    attn_plan *p = find_plan(!!backward, B, Sq, Skv, H, Dh);
    if (!p) return -1;
    if (engine_id) *engine_id = p->engine;
    if (workspace) *workspace = (size_t)p->workspace;
    return p->nondeterministic;
}
