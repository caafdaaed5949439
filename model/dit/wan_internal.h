/* model/dit/wan_internal.h — what wan_acts.c, wan_forward.c and wan_backward.c share: the activation layout and
 * the small layer helpers of wan_layers.c. Not for use outside model/wan_*.c. */
#ifndef MODEL_WAN_INTERNAL_H
#define MODEL_WAN_INTERNAL_H

#include "model/dit/wan_dit.h"

/* One block's activations (see the "Activation memory" comment in wan_dit.h). Pointers marked (e) are the
 * elementwise results: per block under WAN_ACTS_STORE, one shared scratch set under RECOMPUTE/INFER (rewritten by
 * the backward's recompute step before use). Shapes: [B,S,D] unless noted; Lt = text tokens. */
typedef struct {
    float *x;                    /* block input (the residual stream) */
    float *mean1, *rstd1;        /* [B*S] LN1 statistics */
    float *xn1, *xm1;            /* (e) LN1 output; modulated: xn1 * (1 + scale) + shift */
    float *q_pre, *k_pre, *v;    /* to_q / to_k / to_v outputs ([B,S,H,Dh]) */
    float *rstd_q, *rstd_k;      /* [B*S] RMSNorm statistics */
    float *q, *k;                /* (e) after RMSNorm and RoPE: the self-attention inputs */
    float *o, *lse;              /* self-attention output; LSE [B,H,S] */
    float *y1;                   /* attn1.to_out output */
    float *x1;                   /* (e) x + y1 * gate */
    float *mean2, *rstd2;        /* [B*S] norm2 statistics (cross_attn_norm) */
    float *xn2;                  /* (e) norm2(x1), or x1 itself without cross_attn_norm */
    float *q2_pre, *rstd_q2, *q2; /* attn2 q before norm, [B*S], (e) after norm */
    float *k2_pre, *rstd_k2, *k2, *v2; /* [B,Lt,D], [B*Lt], (e) [B,Lt,D], [B,Lt,D] */
    float *o2, *lse2;            /* cross-attention output; LSE [B,H,S] */
    float *x2;                   /* x1 + to_out(o2) */
    float *mean3, *rstd3;        /* [B*S] */
    float *xn3, *xm3;            /* (e) LN3 output, modulated */
    float *h, *ha;               /* [B,S,Fd] ffn.net.0.proj output; (e) its gelu */
    float *y3;                   /* ffn output */
    int layer;                   /* this block's index (finds its LoRA adapter) */
} wan_block_acts;

struct wan_acts {
    wan_config cfg;
    wan_shape shape;
    wan_acts_mode mode;
    int S, Fp, Hp, Wp;           /* tokens this rank runs (S_full / sp); patch grid of the full sample */
    int S_full, s0, sp, sp_rank; /* sequence parallelism: all tokens, first local token, degree (>= 1), rank */
    int D, Dh, H, Fd, L;         /* dims; L = text tokens */
    int R;                       /* modulation rows: B, or B*S with per-token timesteps */
    int Pin, Pout;               /* C*pt*ph*pw, C_out*pt*ph*pw */
    float *rope_cos, *rope_sin;  /* [S, Dh/2]: rows [s0, s0+S) of the full grid's table */
    float *xp;                   /* [B,S,Pin] patchified input (this rank's tokens) */
    float *full;                 /* sp > 1: [B,S_full,max(Pin,Pout)] scratch: patchified full input; gathered
                                    proj_out output; full dout rows; gathered input gradient. NULL when sp == 1 */
    float *denc_part;            /* sp > 1, training: [B,L,text_dim] this rank's part of d enc. NULL otherwise */
    float *tsin;                 /* [R, freq_dim] sinusoidal timestep features */
    float *t1, *t1a;             /* [R,D] time_embedder.linear_1 output, its silu */
    float *temb, *temb_act;      /* [R,D] time embedding, its silu */
    float *tproj;                /* [R,6D] */
    float *enc;                  /* [B,L,text_dim] copy of encoder_hidden_states */
    float *e1, *e1a, *ctx;       /* [B,L,D] text_embedder linear_1 output, gelu, linear_2 output (= ctx) */
    float **res;                 /* [num_layers + 1] residual stream; res[l] = input of block l */
    wan_block_acts *blk;         /* [num_layers] */
    float *meano, *rstdo;        /* [B*S] output norm statistics */
    float *xno, *xmo;            /* [B,S,D] output LN, modulated (proj_out input) */
    float *po;                   /* [B,S,Pout] proj_out output */
    float *mod;                  /* [R,6,D] block modulation = scale_shift_table + tproj (rebuilt per block) */
    float *modo;                 /* [R,2,D] output modulation = scale_shift_table + temb */
    /* backward scratch (training modes) */
    float *dres;                 /* [B,S,D] gradient of the residual stream */
    float *da, *db, *dq, *dk, *dv, *dob; /* [B,S,D] */
    float *dh, *dha;             /* [B,S,Fd] */
    float *dctx, *dk2, *dv2, *dk2p, *de1, *de1a; /* [B,L,D] */
    float *dmod;                 /* [R,6,D] */
    float *dmodo;                /* [R,2,D] */
    float *dtemb, *dtemb_act, *dt1, *dt1a; /* [R,D] */
    float *dtproj;               /* [R,6D] */
    float *dpo;                  /* [B,S,Pout] */
    float *dxp;                  /* [B,S,Pin] */
    int have_forward;            /* a forward ran since allocation */
    const wan_lora *lora;        /* the adapter the last forward applied (NULL: none); the backward follows it */
    float *lora_h, *lora_t;      /* LoRA scratch [maxM, r] each: h = x A^T, t = dy B (one allocation at lora_h) */
    int64_t lora_cap;            /* floats in each of lora_h, lora_t */
    void *mem;
    size_t bytes;
    size_t mem_cap;              /* bytes of the block at mem (>= bytes: a reused block may be larger) */
};

/* ---- wan_layers.c ---- */

/* y[M,N] = x[M,K] @ w[N,K]^T + b (b may be NULL): nn.Linear. */
void wan_linear_fwd(const k_ops *ops, float *y, const float *x, const float *w, const float *b, int M, int N, int K);
/* nn.Linear backward, ACCUMULATING: dx[M,K] += dy @ w (skipped if dx NULL), dw[N,K] += dy^T @ x,
 * db[N] += column sums of dy (skipped if db NULL). */
void wan_linear_bwd(const k_ops *ops, float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                    int M, int N, int K);
/* db[N] += sum over rows m of dy[m, n] (row stride ld), rows in order 0..M-1 for every n (thread invariant). */
void wan_colsum_acc(float *db, const float *dy, int64_t M, int N, int64_t ld);
/* Sinusoidal timestep features, diffusers get_timestep_embedding(t, dim, flip_sin_to_cos=True,
 * downscale_freq_shift=0): out[r] = [cos(t f_0..f_{h-1}), sin(t f_0..f_{h-1})] (+ a zero for odd dim),
 * h = dim/2, f_i = exp(-ln(10000) * i / h), each step rounded to fp32 as torch does. out [R, dim]. */
void wan_timestep_features(float *out, const float *t, int R, int dim);
/* out[r, j, :] = table[j, :] + src[r, j, :] for j < nj; out, src [R, nj, D] (src row stride src_ld), table [nj, D].
 * With src_nj == 1, src[r, 0, :] is added to every j (temb broadcast over the output norm's shift and scale). */
void wan_add_table(float *out, const float *table, const float *src, int R, int nj, int D, int src_nj);
/* dtable[j,:] += sum_r dmod[r,j,:] (fixed order); dsrc[r,j,:] += dmod[r,j,:] (src_nj == nj) or
 * dsrc[r,0,:] += sum_j dmod[r,j,:] (src_nj == 1). */
void wan_add_table_bwd(float *dtable, float *dsrc, const float *dmod, int R, int nj, int D, int src_nj);
/* y[n] += x[n] (n floats). */
void wan_axpy1(float *y, const float *x, int64_t n);

/* ---- wan_lora.c: the adapter inside forward and backward ---- */

/* A->lora = l; when l is not NULL, checks its config and (re)allocates A's LoRA scratch for its rank. 0 or -1. */
int wan_lora_acts_prepare(wan_acts *A, const wan_lora *l);
/* y[M, N] += scale * (x A^T) B^T with the adapter of target t (wan_lora_target) in block `layer` (ignored for a
 * model-level target) of A->lora; nothing when A->lora is NULL or t is not targeted. x [M, in]. */
void wan_lora_fwd(const k_ops *ops, const wan_acts *A, int layer, int t, float *y, const float *x, int M);
/* Its backward, accumulating: h = x A^T recomputed, dB += scale dy^T h, t = dy B, dA += scale t^T x (into
 * A->lora->grads when allocated), dx += scale t A (dx may be NULL). Nothing when not adapted. */
void wan_lora_bwd(const k_ops *ops, const wan_acts *A, int layer, int t, float *dx, const float *dy, const float *x,
                  int M);
/* 1 if A->lora adapts target t. */
int wan_lora_active(const wan_acts *A, int t);

/* ---- one block (wan_forward.c, wan_backward.c); also used by `vgrpo bench dit` (bench/bench_dit.c) ---- */

/* WanTransformerBlock.forward: b->x [B,S,D] -> out [B,S,D], reading A->tproj (modulation) and A->ctx (text);
 * keeps what A's mode keeps. ex must be resolved (wan_exec_resolve). 0, or -1 when the attention fails. */
int wan_block_forward(const wan_exec *ex, const wan_acts *A, const wan_block_weights *w, wan_block_acts *b,
                      float *out);
/* Its backward: A->dres holds d(out) on entry and d(b->x) on exit; parameter gradients += into g, d tproj += into
 * A->dtproj, d ctx += into A->dctx. 0 or -1. */
int wan_block_backward(const wan_exec *ex, wan_acts *A, const wan_block_weights *w, const wan_block_weights *g,
                       wan_block_acts *b);

/* ---- wan_forward.c: shared with the backward ---- */

/* Fills out from in (NULL allowed): ops default &k_cpu_ops, attention default ops->attention_* (scale 1/sqrt(Dh)). */
void wan_exec_resolve(wan_exec *out, const wan_exec *in);
/* The sequence-parallel consistency of ex (unresolved, NULL allowed) with A: A->sp > 1 needs ex->sp of that size
 * and rank and a self-attention hook; A->sp == 1 refuses an SP group of more than one rank. 0, or -1 naming who. */
int wan_exec_check_sp(const wan_exec *ex, const wan_acts *A, const char *who);
/* 1/sqrt(Dh) rounded to fp32 from double, torch scaled_dot_product_attention's default scale. */
float wan_attn_scale(int Dh);
/* A->mod = block's scale_shift_table + A->tproj ([R, 6, D]). */
void wan_block_modulation(const wan_acts *A, const wan_block_weights *w);
/* The elementwise steps of a block, in forward order; each rewrites its (e) outputs and statistics in b. */
void wan_ew_norm1(const k_ops *ops, const wan_acts *A, wan_block_acts *b);
void wan_ew_qk(const k_ops *ops, const wan_acts *A, const wan_attn_weights *w, wan_block_acts *b);
void wan_ew_x1(const k_ops *ops, const wan_acts *A, const wan_block_weights *w, wan_block_acts *b);
void wan_ew_qk2(const k_ops *ops, const wan_acts *A, const wan_attn_weights *w, wan_block_acts *b);
void wan_ew_norm3(const k_ops *ops, const wan_acts *A, wan_block_acts *b);
void wan_ew_gelu(const k_ops *ops, const wan_acts *A, wan_block_acts *b);

#endif
