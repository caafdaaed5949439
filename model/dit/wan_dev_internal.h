/* model/dit/wan_dev_internal.h — what the files of the device model share (wan_dev.h): the device activation layout
 * (wan_internal.h's, typed: bf16 activations, fp32 statistics) and the layer helpers of wan_dev_layers.c. Not for
 * use outside model/dit/wan_dev*.c. */
#ifndef MODEL_WAN_DEV_INTERNAL_H
#define MODEL_WAN_DEV_INTERNAL_H

#include "model/dit/wan_dev.h"
#include "model/dit/wan_internal.h"
#include "model/dit/wan_lora.h"

/* One block's device activations: wan_block_acts field for field ((e): the elementwise results, per block under
 * WAN_ACTS_STORE, one shared set otherwise). bf16 unless the type says fp32. */
typedef struct {
    kb_bf16 *x;                       /* block input (the residual stream) */
    float *mean1, *rstd1;             /* [B*S] */
    kb_bf16 *xn1, *xm1;               /* (e) */
    kb_bf16 *q_pre, *k_pre, *v;
    float *rstd_q, *rstd_k;
    kb_bf16 *q, *k;                   /* (e) */
    kb_bf16 *o;
    float *lse;                       /* [B,H,S] */
    kb_bf16 *y1;
    kb_bf16 *x1;                      /* (e) */
    float *mean2, *rstd2;
    kb_bf16 *xn2;                     /* (e) norm2(x1), or x1 */
    kb_bf16 *q2_pre, *q2;             /* q2: (e) */
    float *rstd_q2;
    kb_bf16 *k2_pre, *k2, *v2;        /* k2: (e) */
    float *rstd_k2;                   /* [B*Lt] */
    kb_bf16 *o2;
    float *lse2;
    kb_bf16 *x2;
    float *mean3, *rstd3;
    kb_bf16 *xn3, *xm3;               /* (e) */
    kb_bf16 *h, *ha;                  /* [B,S,Fd]; ha: (e) */
    kb_bf16 *y3;
    int layer;
} wan_dev_block_acts;

struct wan_dev_acts {
    const k_dev_ops *dev;
    wan_config cfg;
    wan_shape shape;
    wan_acts_mode mode;
    int S, Fp, Hp, Wp;
    int D, Dh, H, Fd, L, R, Pin, Pout;
    float *rope_cos, *rope_sin;       /* [S, Dh/2] fp32 */
    kb_bf16 *xp;                      /* [B,S,Pin] */
    float *tsin_host;                 /* HOST [R, freq_dim]: the features before upload */
    kb_bf16 *tsin;                    /* [R, freq_dim] */
    kb_bf16 *t1, *t1a, *temb, *temb_act; /* [R,D] */
    kb_bf16 *tproj;                   /* [R,6D] */
    kb_bf16 *enc;                     /* [B,L,text_dim] */
    kb_bf16 *e1, *e1a, *ctx;          /* [B,L,D] */
    kb_bf16 **res;                    /* HOST array [num_layers + 1] of device pointers */
    wan_dev_block_acts *blk;          /* HOST array [num_layers] */
    float *meano, *rstdo;
    kb_bf16 *xno, *xmo;
    float *po;                        /* [B,S,Pout] fp32: the velocity before unpatchify */
    float *mod, *modo;                /* [R,6,D], [R,2,D] fp32 */
    /* backward (training modes) */
    float *dres;                      /* [B,S,D] fp32 gradient of the residual stream */
    kb_bf16 *dres16;                  /* its bf16 copy where a GEMM reads it */
    kb_bf16 *da, *db, *dq, *dk, *dv, *dob; /* [B,S,D] */
    kb_bf16 *dh, *dha;                /* [B,S,Fd] */
    float *dctx;                      /* [B,L,D] fp32 */
    kb_bf16 *dctx16, *dk2, *dv2, *dk2p, *de1, *de1a; /* [B,L,D] */
    float *dmod, *dmodo;              /* [R,6,D], [R,2,D] fp32 */
    float *dtemb, *dtproj;            /* [R,D], [R,6D] fp32 */
    kb_bf16 *dtemb16, *dtproj16, *dtemb_act, *dt1, *dt1a;
    kb_bf16 *dpo;                     /* [B,S,Pout] */
    float *dxp;                       /* [B,S,Pin] fp32 */
    int have_forward;
    void *mem;                        /* the device allocation */
    size_t bytes;
    /* LoRA: the adapter the last forward applied (NULL: none, or switched off) and its [M, r] bf16 scratch h and t
     * (made on the first forward with an adapter; not in the estimate: 2 maxM r bf16, small) */
    const wan_dev_model *lora;
    kb_bf16 *lora_h, *lora_t;
    int64_t lora_cap;
};

/* Early return on a failed device op (its message names the op). */
#define WD_TRY(call)                                                                                           \
    do {                                                                                                       \
        if ((call) != 0) return -1;                                                                            \
    } while (0)

/* Typed views. */
static inline kb_in wd_in(const kb_bf16 *p) { return kb_in_bf16(p); }
static inline kb_out wd_out(kb_bf16 *p) { return kb_out_bf16(p); }
static inline kb_in wd_in32(const float *p) { return kb_in_f32(p); }
static inline kb_out wd_out32(float *p) { return kb_out_f32(p); }
static const kb_in WD_NO_IN = {NULL, KB_F32};
static const kb_out WD_NO_OUT = {NULL, KB_F32};

/* The device copy of a host weight: host_p is a named pointer of d->host->w (NULL allowed: NULL). */
static inline const kb_bf16 *wd_w(const wan_dev_model *d, const float *host_p) {
    return host_p ? d->w + (host_p - d->host->params) : NULL;
}
/* Its device gradient (NULL when host_p is NULL or gradients are not allocated). */
static inline float *wd_g(const wan_dev_model *d, const float *host_p) {
    return host_p && d->grads ? d->grads + (host_p - d->host->params) : NULL;
}

/* ---- wan_dev_layers.c ---- */

/* nn.Linear: y[M,N] = x[M,K] @ w[N,K]^T + b (b may be NULL; in y's dtype), one GEMM with the bias epilogue. */
int wan_dev_linear_fwd(const k_dev_ops *dev, kb_out y, const kb_bf16 *x, const kb_bf16 *w, const void *b, int M,
                       int N, int K);
/* Its backward, ACCUMULATING as wan_linear_bwd: dx[M,K] += dy @ w (skipped if dx.p is NULL; bf16 or fp32),
 * dw[N,K] += dy^T @ x (fp32; skipped if NULL) with db[N] += column sums of dy (fp32; the bias-gradient epilogue,
 * so db needs dw). */
int wan_dev_linear_bwd(const k_dev_ops *dev, kb_out dx, float *dw, float *db, const kb_bf16 *dy, const kb_bf16 *x,
                       const kb_bf16 *w, int M, int N, int K);
/* LoRA after the base linear of target t (block `layer`, -1: model level) when the forward applies an adapter that
 * targets it (wan_lora.h; no-op otherwise): y[M, out] += scale (x A^T) B^T. y: bf16, or fp32 (proj_out). */
int wan_dev_lora_fwd(const wan_dev_acts *A, int layer, int t, kb_out y, const kb_bf16 *x, int M);
/* Its backward, after the base linear's (wan_lora_bwd's order): dB, dA += (fp32, d->lora_grads), dx += scale t A
 * (skipped when dx.p is NULL). dy, x: bf16. */
int wan_dev_lora_bwd(const wan_dev_acts *A, int layer, int t, kb_out dx, const kb_bf16 *dy, const kb_bf16 *x, int M);
/* The forward's adapter choice and its scratch (max rows x rank); 0 or -1. */
int wan_dev_lora_prepare(wan_dev_acts *A, const wan_dev_model *d, int use_lora);

/* y = x rounded to bf16 (n elements): zero, then the table's add. */
int wan_dev_to_bf16(const k_dev_ops *dev, kb_bf16 *y, kb_in x, int64_t n);
/* Zeroes n elements of 2 (bf16) or 4 (fp32) bytes. */
int wan_dev_zero16(const k_dev_ops *dev, kb_bf16 *p, int64_t n);
int wan_dev_zero32(const k_dev_ops *dev, float *p, int64_t n);

/* ---- wan_dev_forward.c: shared with the backward ---- */

/* A->mod = block's scale_shift_table + A->tproj. */
int wan_dev_block_modulation(const wan_dev_model *d, const wan_dev_acts *A, const wan_block_weights *w);
/* The elementwise steps of a block (wan_forward.c's wan_ew_*), in forward order. */
int wan_dev_ew_norm1(const wan_dev_acts *A, wan_dev_block_acts *b);
int wan_dev_ew_qk(const wan_dev_model *d, const wan_dev_acts *A, const wan_attn_weights *w, wan_dev_block_acts *b);
int wan_dev_ew_x1(const wan_dev_model *d, const wan_dev_acts *A, const wan_block_weights *w, wan_dev_block_acts *b);
int wan_dev_ew_qk2(const wan_dev_model *d, const wan_dev_acts *A, const wan_attn_weights *w, wan_dev_block_acts *b);
int wan_dev_ew_norm3(const wan_dev_acts *A, wan_dev_block_acts *b);
int wan_dev_ew_gelu(const wan_dev_acts *A, wan_dev_block_acts *b);
/* One block (WanTransformerBlock.forward) from b->x into out, keeping what b holds; WAN_ACTS_CHECKPOINT's backward
 * reruns it into the shared set (the same calls on the same inputs: the same bits). */
int wan_dev_block_forward(const wan_dev_model *d, const wan_dev_acts *A, const wan_block_weights *w,
                          wan_dev_block_acts *b, kb_bf16 *out);
/* 0 when d and A belong together (config, device), else -1 naming who. */
int wan_dev_check_pair(const wan_dev_model *d, const wan_dev_acts *A, const char *who);

#endif
