/* kernels/cuda/attn_graph.c — the cuDNN graphs of attention and their plans; see attn_graph.h.
 *
 * The composite graphs follow cudnn-frontend's CompositeSDPANode / CompositeSDPABackwardNode
 * (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h, softmax.h), no mask, no dropout, one batch
 * element, our [S, H, Dh] rows described as the logical [1, H, S, Dh] tensors (strides {S*H*Dh, Dh, H*Dh, 1}):
 *
 *   forward:  S = Q @ K^T;  S *= scale;  M = max_row(S);  E = exp(S - M);  Z = sum_row(E);
 *             Stats = M + log(Z) (fp32 [1, H, Sq, 1], our LSE);  P = E / Z (bf16);  O = P @ V
 *   backward: softmax_sum = sum_row(dO * O) * 1 (fp32, a buffer of ours);  P = exp(scale * Q @ K^T - Stats);
 *             dV = P^T @ dO;  dS = (dO @ V^T - softmax_sum) * P * scale;  dK = dS^T @ Q;  dQ = dS @ K
 *
 * K and V enter the matmuls transposed (dims {1, H, Dh, Skv}, the same memory), P^T and dS^T are reshapes (strides
 * swapped). Every intermediate is virtual fp32 except the bf16 reshapes feeding matmuls, exactly as the frontend
 * builds them. The backward's dQ is written straight by its matmul when deterministic: that is the frontend's
 * "dP workspace" variant which set_deterministic_algorithm(true) forces on Hopper (no fp32 dQ accumulation with
 * atomics across key blocks); otherwise the matmul writes an fp32 dQ_accum buffer and an identity pointwise casts
 * it to dQ (the frontend's default, with atomics). Scalars (scale, 1.0) are by-value tensors, so one plan serves
 * every scale.
 *
 * Plans are built for the GPU in use (handle) or for a described device (CUDNN_ATTR_ENGINEHEUR_DEVICEPROP and
 * CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, cuDNN >= 9.8): then the operation graph gets no handle, as in the
 * frontend's deviceless ahead-of-time path (samples/cpp/misc/deviceless_aot_compilation.cpp). The JSON keys of the
 * device property descriptor are those cuDNN 9.19 requires when finalising it.
 * Checked by hand against cudnn-frontend 1.23 (C++, deviceless, the same described H100, cuDNN 9.19): its
 * sdpa_backward(set_deterministic_algorithm(true)) gets engine 6 then 7 with knob 24 (KERNEL_CFG) = 26, its sdpa
 * engine 2 knob 24 = 7 first: the configurations these graphs get (`vgrpo gpu-plans --verbose`). */
#include "kernels/cuda/attn_graph.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/error.h"

static int dnn_check(cudnnStatus_t st, const char *what) {
    if (st == CUDNN_STATUS_SUCCESS) return 0;
    char detail[512] = "";
    kc_dnn.cudnnGetLastErrorString(detail, sizeof detail);
    return core_error("cuDNN: %s: %s (%d)%s%s", what, kc_dnn.cudnnGetErrorString(st), (int)st, detail[0] ? ": " : "",
                      detail);
}

void kc_attn_plan_free(kc_attn_plan *p) {
    if (p->plan) kc_dnn.cudnnBackendDestroyDescriptor(p->plan);
    for (int i = p->nkeep - 1; i >= 0; i--)
        if (p->keep[i]) kc_dnn.cudnnBackendDestroyDescriptor(p->keep[i]);
    kc_attn_key key = p->key;
    memset(p, 0, sizeof *p);
    p->key = key;
}

static cudnnBackendDescriptor_t new_desc(kc_attn_plan *p, cudnnBackendDescriptorType_t t, const char *what) {
    if (p->nkeep == KC_ATTN_MAX_DESCS) {
        core_error("cuDNN: more than %d descriptors for one attention plan (%s)", KC_ATTN_MAX_DESCS, what);
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

static int set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendDescriptor_t v,
                    const char *what) {
    return set_attr(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
}

/* ---- graph building ---- */

typedef struct {
    kc_attn_plan *p;
    cudnnBackendDescriptor_t ops[40];
    int nops;
    int64_t next_virtual_uid;
    int err;
} gb;

enum { T_IO = 0, T_VIRTUAL = 1, T_BY_VALUE = 2, T_IO_ALIGN4 = 3 };

/* A 4-D tensor; uid 0 = a new virtual tensor's id. */
static cudnnBackendDescriptor_t tensor(gb *g, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                                       const int64_t strides[4], int kind) {
    if (g->err) return NULL;
    cudnnBackendDescriptor_t d = new_desc(g->p, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
    if (!uid) uid = g->next_virtual_uid++;
    int64_t align = kind == T_IO_ALIGN4 ? 4 : 16;
    bool virt = kind == T_VIRTUAL, by_value = kind == T_BY_VALUE;
    if (!d || set_attr(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor dtype") ||
        set_attr(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dims") ||
        set_attr(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides") ||
        set_attr(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid") ||
        set_attr(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment") ||
        (virt && set_attr(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor virtual")) ||
        (by_value && set_attr(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "by value")) ||
        dnn_check(kc_dnn.cudnnBackendFinalize(d), "tensor finalize")) {
        g->err = 1;
        return NULL;
    }
    return d;
}

static void add_op(gb *g, cudnnBackendDescriptor_t op, const char *what) {
    if (g->err) return;
    if (!op || dnn_check(kc_dnn.cudnnBackendFinalize(op), what)) {
        g->err = 1;
        return;
    }
    if (g->nops == (int)(sizeof g->ops / sizeof g->ops[0])) {
        core_error("cuDNN: too many operations in one attention graph");
        g->err = 1;
        return;
    }
    g->ops[g->nops++] = op;
}

/* y = mode(x[, b]) elementwise with broadcasting, fp32 math. */
static void pointwise(gb *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t y, const char *name) {
    if (g->err) return;
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t pw = new_desc(g->p, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name);
    if (!pw || set_attr(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, name) ||
        set_attr(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32, name) ||
        dnn_check(kc_dnn.cudnnBackendFinalize(pw), name)) {
        g->err = 1;
        return;
    }
    cudnnBackendDescriptor_t op = new_desc(g->p, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    if (!op || set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, name) ||
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, name) ||
        (b && set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, name)) ||
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, name)) {
        g->err = 1;
        return;
    }
    add_op(g, op, name);
}

/* c = a @ b over the last two dimensions, fp32 accumulation. */
static void matmul(gb *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
                   const char *name) {
    if (g->err) return;
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = new_desc(g->p, CUDNN_BACKEND_MATMUL_DESCRIPTOR, name);
    if (!mm || set_attr(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, name) ||
        dnn_check(kc_dnn.cudnnBackendFinalize(mm), name)) {
        g->err = 1;
        return;
    }
    cudnnBackendDescriptor_t op = new_desc(g->p, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    if (!op || set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, name) ||
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, name) ||
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, name) ||
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, name)) {
        g->err = 1;
        return;
    }
    add_op(g, op, name);
}

/* y = reduce(x) over the dimensions where y has extent 1, fp32. */
static void reduction(gb *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                      const char *name) {
    if (g->err) return;
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = new_desc(g->p, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name);
    if (!rd || set_attr(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, name) ||
        set_attr(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, name) ||
        dnn_check(kc_dnn.cudnnBackendFinalize(rd), name)) {
        g->err = 1;
        return;
    }
    cudnnBackendDescriptor_t op = new_desc(g->p, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    if (!op || set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, name) ||
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, name) ||
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, name)) {
        g->err = 1;
        return;
    }
    add_op(g, op, name);
}

/* y = x viewed with other dims/strides (the transposes of P, dS and K). */
static void reshape(gb *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, const char *name) {
    if (g->err) return;
    cudnnBackendDescriptor_t op = new_desc(g->p, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    if (!op || set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, name) ||
        set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, name)) {
        g->err = 1;
        return;
    }
    add_op(g, op, name);
}

#define D4(a, b, c, d) ((const int64_t[4]){(a), (b), (c), (d)})

static void graph_forward(gb *g, const kc_attn_key *k) {
    const int64_t H = k->H, Sq = k->Sq, Skv = k->Skv, D = k->Dh, Hs = k->Hs;
    const int st_kind = Sq % 4 ? T_IO_ALIGN4 : T_IO;
    const cudnnDataType_t io = (cudnnDataType_t)k->dtype, f32 = CUDNN_DATA_FLOAT;
    const int64_t *one = D4(1, 1, 1, 1), *row = D4(H * Sq, Sq, 1, 1), *sc = D4(H * Sq * Skv, Sq * Skv, Skv, 1);
    cudnnBackendDescriptor_t q = tensor(g, KC_ATTN_Q, io, D4(1, H, Sq, D), D4(Sq * Hs * D, D, Hs * D, 1), T_IO),
                             kt = tensor(g, KC_ATTN_K, io, D4(1, H, D, Skv), D4(Skv * Hs * D, D, 1, Hs * D), T_IO),
                             v = tensor(g, KC_ATTN_V, io, D4(1, H, Skv, D), D4(Skv * Hs * D, D, Hs * D, 1), T_IO),
                             o = tensor(g, KC_ATTN_O, io, D4(1, H, Sq, D), D4(Sq * Hs * D, D, Hs * D, 1), T_IO),
                             stats = tensor(g, KC_ATTN_STATS, f32, D4(1, H, Sq, 1), D4(Hs * Sq, Sq, 1, 1), st_kind),
                             scale = tensor(g, KC_ATTN_SCALE, f32, one, one, T_BY_VALUE);
    const int64_t *ds = D4(1, H, Sq, Skv), *dr = D4(1, H, Sq, 1);
    cudnnBackendDescriptor_t s = tensor(g, 0, f32, ds, sc, T_VIRTUAL), s2 = tensor(g, 0, f32, ds, sc, T_VIRTUAL),
                             m = tensor(g, 0, f32, dr, row, T_VIRTUAL), sub = tensor(g, 0, f32, ds, sc, T_VIRTUAL),
                             e = tensor(g, 0, f32, ds, sc, T_VIRTUAL), z = tensor(g, 0, f32, dr, row, T_VIRTUAL),
                             logz = tensor(g, 0, f32, dr, row, T_VIRTUAL), p = tensor(g, 0, io, ds, sc, T_VIRTUAL);
    matmul(g, q, kt, s, "fwd matmul Q K^T");
    pointwise(g, CUDNN_POINTWISE_MUL, s, scale, s2, "fwd scale");
    reduction(g, CUDNN_REDUCE_TENSOR_MAX, s2, m, "fwd row max");
    pointwise(g, CUDNN_POINTWISE_SUB, s2, m, sub, "fwd sub max");
    pointwise(g, CUDNN_POINTWISE_EXP, sub, NULL, e, "fwd exp");
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z, "fwd row sum");
    pointwise(g, CUDNN_POINTWISE_LOG, z, NULL, logz, "fwd log");
    pointwise(g, CUDNN_POINTWISE_ADD, m, logz, stats, "fwd stats");
    pointwise(g, CUDNN_POINTWISE_DIV, e, z, p, "fwd softmax");
    matmul(g, p, v, o, "fwd matmul P V");
}

static void graph_backward(gb *g, const kc_attn_key *k) {
    const int64_t H = k->H, Sq = k->Sq, Skv = k->Skv, D = k->Dh, Hs = k->Hs;
    const cudnnDataType_t io = (cudnnDataType_t)k->dtype, f32 = CUDNN_DATA_FLOAT;
    const int st_kind = Sq % 4 ? T_IO_ALIGN4 : T_IO;
    const int64_t *one = D4(1, 1, 1, 1), *row = D4(H * Sq, Sq, 1, 1), *srow = D4(Hs * Sq, Sq, 1, 1);
    const int64_t *dq_ = D4(1, H, Sq, D), *sq_ = D4(Sq * Hs * D, D, Hs * D, 1);
    const int64_t *dkv = D4(1, H, Skv, D), *skv = D4(Skv * Hs * D, D, Hs * D, 1);
    const int64_t *dkt = D4(1, H, D, Skv), *skt = D4(Skv * Hs * D, D, 1, Hs * D);
    const int64_t *ds = D4(1, H, Sq, Skv), *ss = D4(H * Sq * Skv, Sq * Skv, Skv, 1);
    const int64_t *dst = D4(1, H, Skv, Sq), *sst = D4(H * Sq * Skv, Sq * Skv, 1, Skv);
    const int64_t *dr = D4(1, H, Sq, 1);
    cudnnBackendDescriptor_t q = tensor(g, KC_ATTN_Q, io, dq_, sq_, T_IO),
                             kt = tensor(g, KC_ATTN_K, io, dkt, skt, T_IO),
                             vt = tensor(g, KC_ATTN_V, io, dkt, skt, T_IO),
                             o = tensor(g, KC_ATTN_O, io, dq_, sq_, T_IO),
                             dO = tensor(g, KC_ATTN_DO, io, dq_, sq_, T_IO),
                             stats = tensor(g, KC_ATTN_STATS, f32, dr, srow, st_kind),
                             scale = tensor(g, KC_ATTN_SCALE, f32, one, one, T_BY_VALUE),
                             unit = tensor(g, KC_ATTN_ONE, f32, one, one, T_BY_VALUE),
                             dQ = tensor(g, KC_ATTN_DQ, io, dq_, sq_, T_IO),
                             dK = tensor(g, KC_ATTN_DK, io, dkv, skv, T_IO),
                             dV = tensor(g, KC_ATTN_DV, io, dkv, skv, T_IO),
                             ssum = tensor(g, KC_ATTN_SOFTMAX_SUM, f32, dr, row, T_IO);
    /* softmax_sum = rowsum(dO * O) * 1 */
    cudnnBackendDescriptor_t doo = tensor(g, 0, f32, dq_, D4(H * Sq * D, Sq * D, H * D, 1), T_VIRTUAL),
                             r = tensor(g, 0, f32, dr, row, T_VIRTUAL);
    pointwise(g, CUDNN_POINTWISE_MUL, dO, o, doo, "bwd dO*O");
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, doo, r, "bwd row sum dO*O");
    pointwise(g, CUDNN_POINTWISE_MUL, r, unit, ssum, "bwd softmax_sum");
    /* P = exp(scale * Q K^T - Stats); dV = P^T dO */
    cudnnBackendDescriptor_t s = tensor(g, 0, f32, ds, ss, T_VIRTUAL), s2 = tensor(g, 0, f32, ds, ss, T_VIRTUAL),
                             s3 = tensor(g, 0, f32, ds, ss, T_VIRTUAL), e = tensor(g, 0, f32, ds, ss, T_VIRTUAL),
                             pt = tensor(g, 0, io, dst, sst, T_VIRTUAL);
    matmul(g, q, kt, s, "bwd matmul Q K^T");
    pointwise(g, CUDNN_POINTWISE_MUL, s, scale, s2, "bwd scale");
    pointwise(g, CUDNN_POINTWISE_SUB, s2, stats, s3, "bwd sub stats");
    pointwise(g, CUDNN_POINTWISE_EXP, s3, NULL, e, "bwd exp");
    reshape(g, e, pt, "bwd reshape P^T");
    matmul(g, pt, dO, dV, "bwd matmul P^T dO");
    /* dS = (dO V^T - softmax_sum) * P * scale; dK = dS^T Q */
    cudnnBackendDescriptor_t dp = tensor(g, 0, f32, ds, ss, T_VIRTUAL), dp2 = tensor(g, 0, f32, ds, ss, T_VIRTUAL),
                             dsm = tensor(g, 0, f32, ds, ss, T_VIRTUAL), dS = tensor(g, 0, f32, ds, ss, T_VIRTUAL),
                             dst_ = tensor(g, 0, io, dst, sst, T_VIRTUAL);
    matmul(g, dO, vt, dp, "bwd matmul dO V^T");
    pointwise(g, CUDNN_POINTWISE_SUB, dp, ssum, dp2, "bwd sub softmax_sum");
    pointwise(g, CUDNN_POINTWISE_MUL, dp2, e, dsm, "bwd mul P");
    pointwise(g, CUDNN_POINTWISE_MUL, dsm, scale, dS, "bwd dS scale");
    reshape(g, dS, dst_, "bwd reshape dS^T");
    matmul(g, dst_, q, dK, "bwd matmul dS^T Q");
    /* dQ = dS K (K back from K^T by a reshape) */
    cudnnBackendDescriptor_t kr = tensor(g, 0, io, dkv, skv, T_VIRTUAL);
    reshape(g, kt, kr, "bwd reshape K");
    if (k->deterministic) {
        matmul(g, dS, kr, dQ, "bwd matmul dS K");
    } else {
        cudnnBackendDescriptor_t acc =
            tensor(g, KC_ATTN_DQ_ACCUM, f32, dq_, D4(H * Sq * D, Sq * D, D, 1), T_IO);
        matmul(g, dS, kr, acc, "bwd matmul dS K (fp32 dQ_accum)");
        pointwise(g, CUDNN_POINTWISE_IDENTITY, acc, NULL, dQ, "bwd dQ cast");
    }
}

/* The fused SDPA_FWD / SDPA_BWD operation (cuDNN >= 9.13 / 9.17). */
static void graph_fused(gb *g, const kc_attn_key *k) {
    const int64_t H = k->H, Sq = k->Sq, Skv = k->Skv, D = k->Dh, Hs = k->Hs;
    const cudnnDataType_t io = (cudnnDataType_t)k->dtype, f32 = CUDNN_DATA_FLOAT;
    const int64_t *dq_ = D4(1, H, Sq, D), *sq_ = D4(Sq * Hs * D, D, Hs * D, 1);
    const int64_t *dkv = D4(1, H, Skv, D), *skv = D4(Skv * Hs * D, D, Hs * D, 1), *one = D4(1, 1, 1, 1);
    cudnnBackendDescriptor_t q = tensor(g, KC_ATTN_Q, io, dq_, sq_, T_IO),
                             kk = tensor(g, KC_ATTN_K, io, dkv, skv, T_IO),
                             v = tensor(g, KC_ATTN_V, io, dkv, skv, T_IO), o = tensor(g, KC_ATTN_O, io, dq_, sq_, T_IO),
                             st = tensor(g, KC_ATTN_STATS, f32, D4(1, H, Sq, 1), D4(Hs * Sq, Sq, 1, 1),
                                         Sq % 4 ? T_IO_ALIGN4 : T_IO),
                             sc = tensor(g, KC_ATTN_SCALE, f32, one, one, T_BY_VALUE);
    if (g->err) return;
    cudnnBackendDescriptor_t op;
    if (!k->bwd) {
        op = new_desc(g->p, CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, "SDPA_FWD descriptor");
        if (!op || set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q, "SDPA_FWD Q") ||
            set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, kk, "SDPA_FWD K") ||
            set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v, "SDPA_FWD V") ||
            set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o, "SDPA_FWD O") ||
            set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, st, "SDPA_FWD stats") ||
            set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, sc, "SDPA_FWD scale")) {
            g->err = 1;
            return;
        }
        add_op(g, op, "SDPA_FWD finalize");
        return;
    }
    cudnnBackendDescriptor_t dO = tensor(g, KC_ATTN_DO, io, dq_, sq_, T_IO),
                             dQ = tensor(g, KC_ATTN_DQ, io, dq_, sq_, T_IO),
                             dK = tensor(g, KC_ATTN_DK, io, dkv, skv, T_IO),
                             dV = tensor(g, KC_ATTN_DV, io, dkv, skv, T_IO);
    if (g->err) return;
    op = new_desc(g->p, CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR, "SDPA_BWD descriptor");
    if (!op || set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC, q, "SDPA_BWD Q") ||
        set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC, kk, "SDPA_BWD K") ||
        set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC, v, "SDPA_BWD V") ||
        set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC, o, "SDPA_BWD O") ||
        set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC, dO, "SDPA_BWD dO") ||
        set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC, st, "SDPA_BWD stats") ||
        set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC, sc, "SDPA_BWD scale") ||
        set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC, dQ, "SDPA_BWD dQ") ||
        set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC, dK, "SDPA_BWD dK") ||
        set_desc(op, CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC, dV, "SDPA_BWD dV")) {
        g->err = 1;
        return;
    }
    add_op(g, op, "SDPA_BWD finalize");
}

/* ---- engine notes and knobs, for the report ---- */

static void engine_notes(cudnnBackendDescriptor_t eng, char *out, size_t cap) {
    static const char *const num[] = {"TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION",
                                      "FFT", "NONDETERMINISTIC", "WINOGRAD", "WINOGRAD_TILE_4x4",
                                      "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13", "STRICT_NAN_PROP"};
    static const char *const beh[] = {"RUNTIME_COMPILATION", "REQUIRES_FILTER_INT8x32_REORDER",
                                      "REQUIRES_BIAS_INT8x32_REORDER", "SUPPORTS_CUDA_GRAPH_NATIVE_API"};
    size_t n = 0;
    out[0] = 0;
    cudnnBackendNumericalNote_t nn[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t cnt = 0;
    if (kc_dnn.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                        CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &cnt, nn) == CUDNN_STATUS_SUCCESS)
        for (int64_t i = 0; i < cnt && n < cap; i++) {
            int v = (int)nn[i];
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? "," : "",
                                  v >= 0 && v < (int)(sizeof num / sizeof num[0]) ? num[v] : "?");
        }
    cudnnBackendBehaviorNote_t bn[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    cnt = 0;
    if (n < cap && kc_dnn.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                                   CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &cnt, bn) == CUDNN_STATUS_SUCCESS)
        for (int64_t i = 0; i < cnt && n < cap; i++) {
            int v = (int)bn[i];
            n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? "," : "",
                                  v >= 0 && v < (int)(sizeof beh / sizeof beh[0]) ? beh[v] : "?");
        }
    if (!out[0]) snprintf(out, cap, "none");
}

static void cfg_knobs(kc_attn_plan *p, cudnnBackendDescriptor_t cfg, char *out, size_t cap) {
    out[0] = 0;
    cudnnBackendDescriptor_t ch[CUDNN_KNOB_TYPE_COUNTS];
    int n = 0;
    for (; n < CUDNN_KNOB_TYPE_COUNTS; n++)
        if (kc_dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &ch[n]) != CUDNN_STATUS_SUCCESS)
            break;
    int64_t cnt = 0;
    size_t w = 0;
    if (kc_dnn.cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, n,
                                        &cnt, ch) == CUDNN_STATUS_SUCCESS)
        for (int64_t i = 0; i < cnt && w < cap; i++) {
            cudnnBackendKnobType_t t;
            int64_t v = 0, one = 0;
            if (kc_dnn.cudnnBackendGetAttribute(ch[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &one,
                                                &t) != CUDNN_STATUS_SUCCESS ||
                kc_dnn.cudnnBackendGetAttribute(ch[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &one,
                                                &v) != CUDNN_STATUS_SUCCESS)
                continue;
            w += (size_t)snprintf(out + w, cap - w, "%sk%d=%lld", w ? " " : "", (int)t, (long long)v);
        }
    for (int i = 0; i < n; i++) kc_dnn.cudnnBackendDestroyDescriptor(ch[i]);
    if (!out[0]) snprintf(out, cap, "none");
    (void)p;
}

/* ---- plan ---- */

int kc_attn_plan_build(kc_attn_plan *p, cudnnHandle_t handle, cudnnBackendDescriptor_t devprop, int64_t ws_limit) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const kc_attn_key *k = &p->key;
    char ks[160];
    kc_attn_key_str(k, ks, sizeof ks);
    if (!!handle == !!devprop) return core_error("attention plan %s: give a cuDNN handle or a device description", ks);
    if (k->dtype != CUDNN_DATA_BFLOAT16)
        return core_error("attention plan %s: only bf16 operands are supported", ks);
    if (k->H < 1 || k->Hs < k->H || k->Sq < 1 || k->Skv < 1 || k->Dh < 8 || k->Dh % 8 || k->Dh > 256)
        return core_error("attention plan %s: bad shape (1 <= H <= Hs, Dh a multiple of 8 up to 256)", ks);
    gb g = {.p = p, .next_virtual_uid = 100};
    if (k->build == KC_ATTN_FUSED)
        graph_fused(&g, k);
    else if (k->bwd)
        graph_backward(&g, k);
    else
        graph_forward(&g, k);
    if (g.err) return core_error_push("attention plan %s: ", ks);
    p->extra_bytes = !k->bwd || k->build == KC_ATTN_FUSED ? 0
                     : (int64_t)k->H * k->Sq * 4 * (k->deterministic ? 1 : 1 + (int64_t)k->Dh);
    cudnnBackendDescriptor_t graph = new_desc(p, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    if (!graph ||
        set_attr(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.nops, g.ops, "graph ops") ||
        (handle && set_attr(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle")) ||
        dnn_check(kc_dnn.cudnnBackendFinalize(graph), "operation graph finalize"))
        return core_error_push("attention plan %s: ", ks);
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int mi = 0; mi < 2 && !p->plan && !p->load_blocked; mi++) {
        cudnnBackendDescriptor_t heur = new_desc(p, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
        if (!heur || set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph") ||
            set_attr(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mi], "heuristics mode") ||
            (devprop && set_desc(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, devprop, "heuristics device")) ||
            dnn_check(kc_dnn.cudnnBackendFinalize(heur), mi ? "heuristics FALLBACK finalize" : "heuristics A finalize"))
            return core_error_push("attention plan %s: ", ks);
        int64_t count = 0;
        if (dnn_check(kc_dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL),
                      "heuristics count"))
            return core_error_push("attention plan %s: ", ks);
        if (count > 16) count = 16;
        if (count < 1) continue;
        cudnnBackendDescriptor_t cfgs[16];
        for (int64_t i = 0; i < count; i++)
            if (!(cfgs[i] = new_desc(p, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"))) return -1;
        int64_t got = 0;
        if (dnn_check(kc_dnn.cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs),
                      "heuristics results"))
            return core_error_push("attention plan %s: ", ks);
        p->n_heur += (int)got;
        for (int64_t i = 0; i < got && (!p->plan || p->on_cfg); i++) {
            kc_attn_cfg_info info = {.mode = mi, .engine = -1, .cfg_workspace = -1, .plan_workspace = -1};
            cudnnBackendDescriptor_t eng = new_desc(p, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
            int64_t cnt = 0;
            if (eng && kc_dnn.cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE,
                                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt, &eng) ==
                           CUDNN_STATUS_SUCCESS) {
                kc_dnn.cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt,
                                                &info.engine);
                engine_notes(eng, info.notes, sizeof info.notes);
            }
            kc_dnn.cudnnBackendGetAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt,
                                            &info.cfg_workspace);
            cfg_knobs(p, cfgs[i], info.knobs, sizeof info.knobs);
            if (p->plan) { /* reporting the rest of the list only */
                info.status = -1;
                snprintf(info.message, sizeof info.message, "not tried (an earlier configuration was chosen)");
                p->on_cfg(p->on_cfg_ctx, &info);
                continue;
            }
            if (ws_limit >= 0 && info.cfg_workspace > ws_limit) {
                info.status = -1;
                snprintf(info.message, sizeof info.message, "skipped: workspace %lld bytes over the limit %lld",
                         (long long)info.cfg_workspace, (long long)ws_limit);
                p->n_ws++;
                if (p->on_cfg) p->on_cfg(p->on_cfg_ctx, &info);
                continue;
            }
            struct timespec c0, c1;
            clock_gettime(CLOCK_MONOTONIC, &c0);
            cudnnBackendDescriptor_t plan = NULL;
            cudnnStatus_t st = kc_dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
            if (st == CUDNN_STATUS_SUCCESS)
                st = handle ? kc_dnn.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                                              CUDNN_TYPE_HANDLE, 1, &handle)
                            : kc_dnn.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
                                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
            if (st == CUDNN_STATUS_SUCCESS)
                st = kc_dnn.cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
            if (st == CUDNN_STATUS_SUCCESS) st = kc_dnn.cudnnBackendFinalize(plan);
            clock_gettime(CLOCK_MONOTONIC, &c1);
            info.seconds = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
            info.status = (int)st;
            if (st != CUDNN_STATUS_SUCCESS) {
                kc_dnn.cudnnGetLastErrorString(info.message, sizeof info.message);
                if (p->stop_at_load && st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER &&
                    strstr(info.message, "cuLibraryLoadData")) {
                    if (plan) kc_dnn.cudnnBackendDestroyDescriptor(plan);
                    info.chosen = 1;
                    p->load_blocked = 1, p->engine = info.engine, p->workspace = info.cfg_workspace;
                    snprintf(p->notes, sizeof p->notes, "%s", info.notes);
                    snprintf(p->knobs, sizeof p->knobs, "%s", info.knobs);
                    if (p->on_cfg) p->on_cfg(p->on_cfg_ctx, &info);
                    break;
                }
                dnn_check(st, "execution plan finalize"); /* kept as the message if no configuration finalises */
                if (plan) kc_dnn.cudnnBackendDestroyDescriptor(plan);
                p->n_fail++;
                if (p->on_cfg) p->on_cfg(p->on_cfg_ctx, &info);
                continue;
            }
            kc_dnn.cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt,
                                            &info.plan_workspace);
            if (ws_limit >= 0 && info.plan_workspace > ws_limit) {
                snprintf(info.message, sizeof info.message, "skipped: plan workspace %lld bytes over the limit %lld",
                         (long long)info.plan_workspace, (long long)ws_limit);
                kc_dnn.cudnnBackendDestroyDescriptor(plan);
                p->n_ws++;
                if (p->on_cfg) p->on_cfg(p->on_cfg_ctx, &info);
                continue;
            }
            info.chosen = 1;
            p->plan = plan, p->workspace = info.plan_workspace, p->engine = info.engine;
            snprintf(p->notes, sizeof p->notes, "%s", info.notes);
            snprintf(p->knobs, sizeof p->knobs, "%s", info.knobs);
            if (p->on_cfg) p->on_cfg(p->on_cfg_ctx, &info);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    p->build_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!p->plan && !p->load_blocked) {
        char last[CORE_ERROR_MAX];
        snprintf(last, sizeof last, "%s", core_last_error());
        return core_error("cuDNN: no engine configuration for attention %s: %d offered by heuristics (A, FALLBACK), "
                          "%d did not finalise, %d over the workspace limit of %lld bytes%s%s",
                          ks, p->n_heur, p->n_fail, p->n_ws, (long long)ws_limit, p->n_fail ? "; last: " : "",
                          p->n_fail ? last : "");
    }
    return 0;
}

/* ---- described devices ---- */

int kc_attn_devprop(const char *gpu, cudnnBackendDescriptor_t *out) {
    *out = NULL;
    const char *name;
    long long mem, mem_khz;
    if (!strcmp(gpu, "h100"))
        name = "NVIDIA H100 80GB HBM3", mem = 85520809984LL, mem_khz = 2619000;
    else if (!strcmp(gpu, "h200"))
        name = "NVIDIA H200", mem = 150754820096LL, mem_khz = 3201000;
    else
        return core_error("cuDNN device description: unknown GPU \"%s\" (h100 or h200)", gpu);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"deviceVer\":900,\"driverVer\":13000,\"cudaDeviceId\":0,\"deviceName\":\"%s\","
             "\"totalGlobalMem\":%lld,\"multiProcessorCount\":132,\"warpSize\":32,\"maxGridSize\":[2147483647,65535,"
             "65535],\"maxBlockSize\":[1024,1024,64],\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,"
             "\"maxCtasPerSM\":32,\"regsPerBlock\":65536,\"maxRegistersPerSM\":65536,\"maxSharedMemoryPerBlock\":49152,"
             "\"maxSharedMemoryPerBlockOptin\":232448,\"reservedSharedMemoryPerBlock\":1024,\"l2CacheSize\":52428800,"
             "\"smClockRateKHz\":1980000,\"memClockRateKHz\":%lld,\"pciDeviceId\":0,\"isTccDriver\":0,"
             "\"supportCoopLaunch\":1}",
             name, mem, mem_khz);
    cudnnBackendDescriptor_t d = NULL;
    if (dnn_check(kc_dnn.cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &d),
                  "device property descriptor (cuDNN >= 9.8)"))
        return -1;
    if (set_attr(d, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, (int64_t)strlen(json) + 1, json,
                 "device property JSON") ||
        dnn_check(kc_dnn.cudnnBackendFinalize(d), "device property finalize")) {
        kc_dnn.cudnnBackendDestroyDescriptor(d);
        return core_error_push("describing %s: ", name);
    }
    *out = d;
    return 0;
}

void kc_attn_key_str(const kc_attn_key *k, char *out, size_t cap) {
    snprintf(out, cap, "%s Sq %d Skv %d H %d of %d Dh %d %s%s %s", k->bwd ? "backward" : "forward", k->Sq, k->Skv,
             k->H, k->Hs, k->Dh, k->dtype == CUDNN_DATA_BFLOAT16 ? "bf16" : "dtype?",
             k->bwd ? (k->deterministic ? " deterministic" : " nondeterministic") : "",
             k->build == KC_ATTN_FUSED ? "fused" : "composite");
}
