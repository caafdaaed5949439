/* model/dit/wan_internal.h — what the files of the Wan DiT share (wan_acts.c, wan_forward.c, wan_backward.c,
 * wan_layers.c, wan_lora.c and the device executor): the activation layout, the model as the op table sees it, and the
 * layer helpers. The model is written once over kernels/dev_ops.h's k_dev_ops: on the CPU the table is
 * k_cpu_dev_ops (kernels/cpu/dev_table.h: fp32 host memory), on a device the CUDA table or the emulated one (bf16
 * activations). Not for use outside model/dit/. */
#ifndef MODEL_WAN_INTERNAL_H
#define MODEL_WAN_INTERNAL_H

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dev_table.h"
#include "model/dit/wan_dit.h"

/* The model as the table sees it: weights and gradients at the offsets of the host model's flat table
 * (host->params), in the table's memory. On the CPU: the host model itself (fp32); on a device: wan_dev_model's
 * copies (bf16 weights, fp32 gradients). */
typedef struct {
    const k_dev_ops *dev;
    const wan_model *host;      /* config and the offset map (named pointers into host->params) */
    const void *w;              /* weights at host->params' offsets */
    kb_dtype wt;                /* their dtype */
    float *g;                   /* gradients at the same offsets; NULL: none (a frozen base) */
    const float *proj_out_b;    /* fp32 proj_out.bias (the fp32 velocity GEMM's epilogue) */
    const wan_lora *lora;       /* the adapter the forward applies (NULL: none) */
    const void *lw;             /* its weights at lora->params' offsets (dtype wt) */
    float *lg;                  /* its gradients (NULL: none) */
    int (*grad_ready)(void *ctx, const wan_model *m, int block); /* wan_exec.grad_ready of the backward (NULL: none) */
    void *grad_ready_ctx;
} wan_mview;

/* The view of host weight p (a named pointer into host->params; NULL: an absent view). */
static inline kb_in wan_w(const wan_mview *mv, const float *p) {
    kb_in v = {NULL, mv->wt};
    if (p) v.p = (const char *)mv->w + (size_t)(p - mv->host->params) * (mv->wt == KB_BF16 ? 2 : 4);
    return v;
}
/* Its gradient (NULL when p is NULL or there are no gradients). */
static inline float *wan_g(const wan_mview *mv, const float *p) {
    return p && mv->g ? mv->g + (p - mv->host->params) : NULL;
}

/* One block's activations (see the "Activation memory" comment in wan_dit.h). void *: activations in the
 * activations' dtype (wan_acts.at); float *: fp32 always (statistics, LSE). Pointers marked (e) are the elementwise
 * results: per block under WAN_ACTS_STORE, one shared scratch set otherwise (rewritten by the backward's recompute
 * step before use). Shapes: [B,S,D] unless noted; Lt = text tokens. */
typedef struct {
    void *x;                     /* block input (the residual stream) */
    float *mean1, *rstd1;        /* [B*S] LN1 statistics */
    void *xn1, *xm1;             /* (e) LN1 output; modulated: xn1 * (1 + scale) + shift */
    void *q_pre, *k_pre, *v;     /* to_q / to_k / to_v outputs ([B,S,H,Dh]) */
    float *rstd_q, *rstd_k;      /* [B*S] RMSNorm statistics */
    void *q, *k;                 /* (e) after RMSNorm and RoPE: the self-attention inputs */
    void *o;                     /* self-attention output */
    float *lse;                  /* LSE [B,H,S] */
    void *y1;                    /* attn1.to_out output */
    void *x1;                    /* (e) x + y1 * gate */
    float *mean2, *rstd2;        /* [B*S] norm2 statistics (cross_attn_norm) */
    void *xn2;                   /* (e) norm2(x1), or x1 itself without cross_attn_norm */
    void *q2_pre, *q2;           /* attn2 q before norm, (e) after norm */
    float *rstd_q2;              /* [B*S] */
    void *k2_pre, *k2, *v2;      /* [B,Lt,D], (e) [B,Lt,D], [B,Lt,D] */
    float *rstd_k2;              /* [B*Lt] */
    void *o2;                    /* cross-attention output */
    float *lse2;                 /* LSE [B,H,S] */
    void *x2;                    /* x1 + to_out(o2) */
    float *mean3, *rstd3;        /* [B*S] */
    void *xn3, *xm3;             /* (e) LN3 output, modulated */
    void *h, *ha;                /* [B,S,Fd] ffn.net.0.proj output; (e) its gelu */
    void *y3;                    /* ffn output */
    int layer;                   /* this block's index (finds its LoRA adapter) */
} wan_block_acts;

/* The activations of one (config, shape, mode) on one table: the CPU's (wan_acts_new_sp: fp32, sequence-parallel
 * slices, a reused host block) or a device's (wan_dev_acts_new: bf16 activations, WAN_ACTS_CHECKPOINT). */
struct wan_acts {
    const k_dev_ops *dev;        /* the table whose memory holds them */
    kb_dtype at;                 /* the activations' dtype: KB_F32 on the CPU table, KB_BF16 on a device */
    wan_config cfg;
    wan_shape shape;
    wan_acts_mode mode;
    int S, Fp, Hp, Wp;           /* tokens this rank runs (S_full / sp); patch grid of the full sample */
    int S_full, s0, sp, sp_rank; /* sequence parallelism: all tokens, first local token, degree, rank */
    int D, Dh, H, Fd, L;         /* dims; L = text tokens */
    int R;                       /* modulation rows: B, or B*S with per-token timesteps */
    int Pin, Pout;               /* C*pt*ph*pw, C_out*pt*ph*pw */
    float *rope_cos, *rope_sin;  /* [S, Dh/2] fp32: rows [s0, s0+S) of the full grid's table */
    void *xp;                    /* [B,S,Pin] patchified input (this rank's tokens) */
    float *full;                 /* sp > 1: [B,S_full,max(Pin,Pout)] fp32-sized scratch: patchified full input and
                                    full dout rows (the activations' dtype); gathered proj_out output and input
                                    gradient (fp32). NULL when sp == 1 */
    float *denc_part;            /* sp > 1, training: [B,L,text_dim] this rank's part of d enc. NULL otherwise */
    float *tsin_host;            /* HOST [R, freq_dim] sinusoidal timestep features (the CPU's: tsin itself) */
    void *tsin;                  /* [R, freq_dim] the same in the activations' dtype */
    void *t1, *t1a;              /* [R,D] time_embedder.linear_1 output, its silu */
    void *temb, *temb_act;       /* [R,D] time embedding, its silu */
    void *tproj;                 /* [R,6D] */
    void *enc;                   /* [B,L,text_dim] copy of encoder_hidden_states */
    void *e1, *e1a, *ctx;        /* [B,L,D] text_embedder linear_1 output, gelu, linear_2 output (= ctx) */
    void **res;                  /* HOST array [num_layers + 1]: residual stream; res[l] = input of block l */
    wan_block_acts *blk;         /* HOST array [num_layers] */
    float *meano, *rstdo;        /* [B*S] output norm statistics */
    void *xno, *xmo;             /* [B,S,D] output LN, modulated (proj_out input) */
    float *po;                   /* [B,S,Pout] fp32 proj_out output (the velocity) */
    float *mod;                  /* [R,6,D] fp32 block modulation = scale_shift_table + tproj (rebuilt per block) */
    float *modo;                 /* [R,2,D] fp32 output modulation = scale_shift_table + temb */
    /* backward scratch (training modes). The long sums are fp32: dres, dctx, dtemb, dtproj; a GEMM reads their
     * copies in the activations' dtype (dres16, dctx16, dtemb16, dtproj16: the same memory on the CPU) */
    float *dres;                 /* [B,S,D] gradient of the residual stream */
    void *dres16;
    void *da, *db, *dq, *dk, *dv, *dob; /* [B,S,D] */
    void *dh, *dha;              /* [B,S,Fd] */
    float *dctx;                 /* [B,L,D] */
    void *dctx16, *dk2, *dv2, *dk2p, *de1, *de1a; /* [B,L,D] */
    float *dmod;                 /* [R,6,D] */
    float *dmodo;                /* [R,2,D] */
    float *dtemb, *dtproj;       /* [R,D], [R,6D] */
    void *dtemb16, *dtproj16, *dtemb_act, *dt1, *dt1a; /* [R,D] ([R,6D] dtproj16) */
    void *dpo;                   /* [B,S,Pout] */
    float *dxp;                  /* [B,S,Pin] */
    int have_forward;            /* a forward ran since allocation */
    wan_mview mv;                /* the model the last forward ran (its adapter, NULL: none; the backward follows) */
    void *lora_h, *lora_t;       /* LoRA scratch [maxM, r] each: h = x A^T, t = dy B (one allocation at lora_h) */
    int64_t lora_cap;            /* elements in each of lora_h, lora_t */
    void *mem;
    size_t bytes;
    size_t mem_cap;              /* CPU: bytes of the (reused) host block at mem (>= bytes) */
};

/* Early return on a failed table op (its message names the op). */
#define WAN_TRY(call)                                                                                          \
    do {                                                                                                       \
        if ((call) != 0) return -1;                                                                            \
    } while (0)

/* Views of activations (the activations' dtype) and of fp32 tensors. */
static inline kb_in wan_ai(const wan_acts *A, const void *p) {
    kb_in v = {p, A->at};
    return v;
}
static inline kb_out wan_ao(const wan_acts *A, void *p) {
    kb_out v = {p, A->at};
    return v;
}
static const kb_in WAN_NO_IN = {NULL, KB_F32};
static const kb_out WAN_NO_OUT = {NULL, KB_F32};

/* The CPU's model view of m (fp32 host weights; gradients m->grads or none; the adapter l or none). */
void wan_mview_cpu(wan_mview *mv, const wan_model *m, const wan_lora *l);

/* ---- wan_layers.c ---- */

/* nn.Linear: y[M,N] = x[M,K] @ w[N,K]^T + b (b.p may be NULL; b in y's dtype): one GEMM with the bias epilogue. */
int wan_linear_fwd(const k_dev_ops *dev, kb_out y, kb_in x, kb_in w, kb_in b, int M, int N, int K);
/* nn.Linear backward, ACCUMULATING: dx[M,K] += dy @ w (skipped if dx.p NULL), dw[N,K] += dy^T @ x (fp32; skipped if
 * NULL) with db[N] += column sums of dy (fp32; the weight GEMM's bias-gradient epilogue, so db needs dw). */
int wan_linear_bwd(const k_dev_ops *dev, kb_out dx, float *dw, float *db, kb_in dy, kb_in x, kb_in w, int M, int N,
                   int K);
/* Sinusoidal timestep features, diffusers get_timestep_embedding(t, dim, flip_sin_to_cos=True,
 * downscale_freq_shift=0): out[r] = [cos(t f_0..f_{h-1}), sin(t f_0..f_{h-1})] (+ a zero for odd dim),
 * h = dim/2, f_i = exp(-ln(10000) * i / h), each step rounded to fp32 as torch does. out [R, dim] (host). */
void wan_timestep_features(float *out, const float *t, int R, int dim);
/* Zeroes n activations (A->at) / n floats in the table's memory. */
int wan_zero_act(const wan_acts *A, void *p, int64_t n);
int wan_zero32(const wan_acts *A, float *p, int64_t n);
/* The copy in the activations' dtype of an fp32 tensor (dres16 of dres, ...): on a bf16 device y = x rounded (zero,
 * then the table's add); on the CPU nothing (y is x: a zero-then-add would turn -0.0 into +0.0). */
int wan_to_act(const wan_acts *A, void *y, const float *x, int64_t n);

/* ---- wan_lora.c: the adapter inside forward and backward ---- */

/* Readies the adapter the caller put in A->mv (mv.lora, lw, lg; NULL: none): checks its config and (re)allocates A's
 * LoRA scratch for its rank through A->dev. 0 or -1. */
int wan_lora_acts_prepare(wan_acts *A);
/* y[M, N] += scale * (x A^T) B^T with the adapter of target t (wan_lora_target) in block `layer` (ignored for a
 * model-level target) of A->mv.lora; nothing when there is none or t is not targeted. x [M, in]. */
int wan_lora_fwd(const wan_acts *A, int layer, int t, kb_out y, kb_in x, int M);
/* Its backward, accumulating: h = x A^T recomputed, dB += scale dy^T h, t = dy B, dA += scale t^T x (into the
 * adapter's gradients when there are any), dx += scale t A (dx.p may be NULL). Nothing when not adapted. */
int wan_lora_bwd(const wan_acts *A, int layer, int t, kb_out dx, kb_in dy, kb_in x, int M);
/* 1 if the adapter the forward applied adapts target t. */
int wan_lora_active(const wan_acts *A, int t);

/* ---- one block (wan_forward.c, wan_backward.c); also used by `vgrpo bench dit` (bench/bench_dit.c) ---- */

/* WanTransformerBlock.forward: b->x [B,S,D] -> out [B,S,D], reading A->tproj (modulation) and A->ctx (text) and the
 * weights of A->mv; keeps what A's mode keeps. ex: the CPU's (resolved, wan_exec_resolve: its self-attention hook),
 * NULL on a device (the table's attention). 0, or -1 when an op fails. */
int wan_block_forward(const wan_exec *ex, const wan_acts *A, const wan_block_weights *w, wan_block_acts *b, void *out);
/* Its backward: A->dres holds d(out) on entry and d(b->x) on exit; parameter gradients += into A->mv's, d tproj +=
 * into A->dtproj, d ctx += into A->dctx. out: the block's output (WAN_ACTS_CHECKPOINT reruns the forward into it).
 * 0 or -1. */
int wan_block_backward(const wan_exec *ex, wan_acts *A, const wan_block_weights *w, wan_block_acts *b, void *out);
/* Binds A to the CPU model m for calls of the block functions alone (bench): A->mv = m's view with adapter l (NULL:
 * none), gradients m->grads unless frozen. 0 or -1. */
int wan_acts_bind_cpu(wan_acts *A, const wan_model *m, const wan_lora *l, int frozen);

/* ---- wan_forward.c: shared with the backward ---- */

/* Fills out from in (NULL allowed): ops default &k_cpu_ops, attention default ops->attention_* (scale 1/sqrt(Dh)). */
void wan_exec_resolve(wan_exec *out, const wan_exec *in);
/* The sequence-parallel consistency of ex (unresolved, NULL allowed) with A: A->sp > 1 needs ex->sp of that size
 * and rank and a self-attention hook; A->sp == 1 refuses an SP group of more than one rank. 0, or -1 naming who. */
int wan_exec_check_sp(const wan_exec *ex, const wan_acts *A, const char *who);
/* 1/sqrt(Dh) rounded to fp32 from double, torch scaled_dot_product_attention's default scale. */
float wan_attn_scale(int Dh);
/* A->mod = block's scale_shift_table + A->tproj ([R, 6, D]). */
int wan_block_modulation(const wan_acts *A, const wan_block_weights *w);
/* The elementwise steps of a block, in forward order; each rewrites its (e) outputs and statistics in b. */
int wan_ew_norm1(const wan_acts *A, wan_block_acts *b);
int wan_ew_qk(const wan_acts *A, const wan_attn_weights *w, wan_block_acts *b);
int wan_ew_x1(const wan_acts *A, const wan_block_weights *w, wan_block_acts *b);
int wan_ew_qk2(const wan_acts *A, const wan_attn_weights *w, wan_block_acts *b);
int wan_ew_norm3(const wan_acts *A, wan_block_acts *b);
int wan_ew_gelu(const wan_acts *A, wan_block_acts *b);
/* The forward of the whole model on A with A->mv set (wan_forward, wan_dev_forward_lora): x [B,C,F,H,W] (the
 * caller's view: host fp32 on the CPU), timestep HOST [B] or [B,S_full], enc [B,L,text_dim] view -> out. ex as
 * wan_block_forward. 0 or -1. */
int wan_model_forward(const wan_exec *ex, wan_acts *A, kb_out out, kb_in x, const float *timestep, kb_in enc);
/* Its backward (wan_backward, wan_dev_backward) with A->mv set to the model receiving the gradients. 0 or -1. */
int wan_model_backward(const wan_exec *ex, wan_acts *A, kb_out dx, kb_out denc, kb_in dout);

#endif
