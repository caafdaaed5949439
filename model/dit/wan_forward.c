/* model/dit/wan_forward.c — forward of WanTransformer3DModel (diffusers 0.42.1 transformer_wan.py), written once over
 * the device op table (wan_internal.h): on the CPU through k_cpu_dev_ops (fp32, the same k_cpu_ops calls in the same
 * order as before the table), on a device through its table (bf16 activations, wan_dev.h). The order of operations
 * follows the reference line by line (WanTransformer3DModel.forward, WanTransformerBlock.forward,
 * WanAttnProcessor.__call__); shapes are in wan_internal.h. Where the two differ is a branch on the activations'
 * dtype: the CPU's sequence parallelism (fp32 host tensors) and self-attention hook, the device's bf16 uploads. The
 * elementwise steps of a block are separate functions so that wan_backward.c recomputes them with exactly the same
 * calls. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_internal.h"
#include "model/dit/wan_lora.h"
#include "sp/shard.h"

/* ---- the default self-attention: the kernel's blocked attention over the whole sequence ---- */

float wan_attn_scale(int Dh) { return (float)(1.0 / sqrt((double)Dh)); }

static int default_attn_fwd(void *ctx, kb_out o, float *lse, kb_in q, kb_in k, kb_in v, int B, int S, int H,
                            int Dh) {
    const k_ops *ops = ctx;
    ops->attention_forward(o.p, lse, q.p, k.p, v.p, B, S, S, H, Dh, wan_attn_scale(Dh));
    return 0;
}

static int default_attn_bwd(void *ctx, kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k, kb_in v,
                            kb_in o, const float *lse, int B, int S, int H, int Dh) {
    const k_ops *ops = ctx;
    ops->attention_backward(dq.p, dk.p, dv.p, dout.p, q.p, k.p, v.p, o.p, lse, B, S, S, H, Dh, wan_attn_scale(Dh));
    return 0;
}

void wan_exec_resolve(wan_exec *out, const wan_exec *in) {
    memset(out, 0, sizeof *out);
    if (in) *out = *in;
    if (!out->ops) out->ops = &k_cpu_ops;
    if (!out->attn_fwd || !out->attn_bwd) {
        out->attn_fwd = default_attn_fwd;
        out->attn_bwd = default_attn_bwd;
        out->attn_ctx = (void *)out->ops;
    }
}

int wan_exec_check_sp(const wan_exec *ex, const wan_acts *A, const char *who) {
    const sp_comm *g = ex ? ex->sp : NULL;
    if (A->sp <= 1) {
        if (g && g->size > 1)
            return core_error("%s: wan_exec.sp has %d ranks but the activations were made for the whole sequence "
                              "(wan_acts_new)", who, g->size);
        return 0;
    }
    if (!g || g->size != A->sp || g->rank != A->sp_rank)
        return core_error("%s: the activations were made for sequence-parallel rank %d of %d, but wan_exec.sp is %s "
                          "(rank %d of %d)", who, A->sp_rank, A->sp, g ? g->name : "NULL", g ? g->rank : 0,
                          g ? g->size : 0);
    if (!ex->attn_fwd || !ex->attn_bwd)
        return core_error("%s: sequence parallelism (sp %d) needs a sequence-parallel self-attention in wan_exec "
                          "(sp_usp_forward/backward): the default attention would see only this rank's keys", who,
                          A->sp);
    return 0;
}

/* ---- the model as the CPU table sees it ---- */

void wan_mview_cpu(wan_mview *mv, const wan_model *m, const wan_lora *l) {
    memset(mv, 0, sizeof *mv);
    mv->dev = &k_cpu_dev_ops;
    mv->host = m;
    mv->w = m->params, mv->wt = KB_F32;
    mv->g = m->grads;
    mv->proj_out_b = m->w.proj_out_b;
    mv->lora = l;
    if (l) mv->lw = l->params, mv->lg = l->grads;
}

int wan_acts_bind_cpu(wan_acts *A, const wan_model *m, const wan_lora *l, int frozen) {
    if (A->dev != &k_cpu_dev_ops) return core_error("wan_acts_bind_cpu: the activations live on %s", A->dev->name);
    wan_mview_cpu(&A->mv, m, l);
    if (frozen) A->mv.g = NULL;
    return wan_lora_acts_prepare(A);
}

/* ---- elementwise steps of a block (shared with the backward's recompute) ---- */

#define MOD(A, j) kb_in_f32((A)->mod + (int64_t)(j) * (A)->D) /* shift, scale, gate, c_shift, c_scale, c_gate */
#define AI(p) wan_ai(A, p)
#define AO(p) wan_ao(A, p)
#define W(p) wan_w(&A->mv, p)

int wan_block_modulation(const wan_acts *A, const wan_block_weights *w) {
    return A->dev->add_table_forward(kb_out_f32(A->mod), W(w->scale_shift_table), AI(A->tproj), A->R, 6, A->D, 6);
}

/* xn1 = LN(x); xm1 = xn1 * (1 + scale_msa) + shift_msa. */
int wan_ew_norm1(const wan_acts *A, wan_block_acts *b) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D, pt = A->shape.per_token_timestep;
    WAN_TRY(dev->layernorm_forward(AO(b->xn1), b->mean1, b->rstd1, AI(b->x), WAN_NO_IN, WAN_NO_IN, B * S, D,
                                   (float)A->cfg.eps));
    return dev->modulate_forward(AO(b->xm1), AI(b->xn1), MOD(A, 0), MOD(A, 1), B, S, D, pt, 6 * D);
}

/* q = rope(norm_q(q_pre)), k = rope(norm_k(k_pre)). */
int wan_ew_qk(const wan_acts *A, const wan_attn_weights *w, wan_block_acts *b) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D;
    const float eps = (float)A->cfg.eps;
    WAN_TRY(dev->rmsnorm_forward(AO(b->q), b->rstd_q, AI(b->q_pre), W(w->norm_q), B * S, D, eps));
    WAN_TRY(dev->rmsnorm_forward(AO(b->k), b->rstd_k, AI(b->k_pre), W(w->norm_k), B * S, D, eps));
    WAN_TRY(dev->rope_forward(AO(b->q), AI(b->q), A->rope_cos, A->rope_sin, B, S, A->H, A->Dh));
    return dev->rope_forward(AO(b->k), AI(b->k), A->rope_cos, A->rope_sin, B, S, A->H, A->Dh);
}

/* x1 = x + y1 * gate_msa; xn2 = norm2(x1) (affine LayerNorm) when cross_attn_norm. */
int wan_ew_x1(const wan_acts *A, const wan_block_weights *w, wan_block_acts *b) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D, pt = A->shape.per_token_timestep;
    WAN_TRY(dev->gate_residual_forward(AO(b->x1), AI(b->x), AI(b->y1), MOD(A, 2), B, S, D, pt, 6 * D));
    if (!A->cfg.cross_attn_norm) return 0;
    return dev->layernorm_forward(AO(b->xn2), b->mean2, b->rstd2, AI(b->x1), W(w->norm2_w), W(w->norm2_b), B * S, D,
                                  (float)A->cfg.eps);
}

/* q2 = norm_q(q2_pre), k2 = norm_k(k2_pre) (no RoPE in the cross-attention). */
int wan_ew_qk2(const wan_acts *A, const wan_attn_weights *w, wan_block_acts *b) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D;
    const float eps = (float)A->cfg.eps;
    WAN_TRY(dev->rmsnorm_forward(AO(b->q2), b->rstd_q2, AI(b->q2_pre), W(w->norm_q), B * S, D, eps));
    return dev->rmsnorm_forward(AO(b->k2), b->rstd_k2, AI(b->k2_pre), W(w->norm_k), B * A->L, D, eps);
}

/* xn3 = LN(x2); xm3 = xn3 * (1 + c_scale_msa) + c_shift_msa. */
int wan_ew_norm3(const wan_acts *A, wan_block_acts *b) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D, pt = A->shape.per_token_timestep;
    WAN_TRY(dev->layernorm_forward(AO(b->xn3), b->mean3, b->rstd3, AI(b->x2), WAN_NO_IN, WAN_NO_IN, B * S, D,
                                   (float)A->cfg.eps));
    return dev->modulate_forward(AO(b->xm3), AI(b->xn3), MOD(A, 3), MOD(A, 4), B, S, D, pt, 6 * D);
}

/* ha = gelu_tanh(h). */
int wan_ew_gelu(const wan_acts *A, wan_block_acts *b) {
    return A->dev->gelu_forward(AO(b->ha), AI(b->h), (int64_t)A->shape.B * A->S * A->Fd);
}

/* ---- one block: WanTransformerBlock.forward ---- */

/* y = linear(x) then its adapter: nn.Linear of weight wt, bias bs (host pointers) on M rows. */
#define LIN(y, x, wt, bs, M, N, K, t)                                                                          \
    do {                                                                                                       \
        WAN_TRY(wan_linear_fwd(dev, AO(y), AI(x), W(wt), W(bs), M, N, K));                                      \
        WAN_TRY(wan_lora_fwd(A, l, t, AO(y), AI(x), M));                                                        \
    } while (0)

int wan_block_forward(const wan_exec *ex, const wan_acts *A, const wan_block_weights *w, wan_block_acts *b,
                      void *out) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D, L = A->L, BS = B * S, pt = A->shape.per_token_timestep;
    const int l = b->layer;
    const float scale = wan_attn_scale(A->Dh);
    WAN_TRY(wan_block_modulation(A, w));
    /* 1. self-attention */
    WAN_TRY(wan_ew_norm1(A, b));
    LIN(b->q_pre, b->xm1, w->attn1.to_q_w, w->attn1.to_q_b, BS, D, D, WAN_LORA_ATTN1_TO_Q);
    LIN(b->k_pre, b->xm1, w->attn1.to_k_w, w->attn1.to_k_b, BS, D, D, WAN_LORA_ATTN1_TO_K);
    LIN(b->v, b->xm1, w->attn1.to_v_w, w->attn1.to_v_b, BS, D, D, WAN_LORA_ATTN1_TO_V);
    WAN_TRY(wan_ew_qk(A, &w->attn1, b));
    /* the hook (the CPU's: the whole sequence or sequence-parallel; a device's: sequence-parallel), else the table's */
    if (ex ? ex->attn_fwd(ex->attn_ctx, AO(b->o), b->lse, AI(b->q), AI(b->k), AI(b->v), B, S, A->H, A->Dh)
           : dev->attention_forward(AO(b->o), b->lse, AI(b->q), AI(b->k), AI(b->v), B, S, S, A->H, A->Dh, scale))
        return core_error_push("self-attention: ");
    LIN(b->y1, b->o, w->attn1.to_out_w, w->attn1.to_out_b, BS, D, D, WAN_LORA_ATTN1_TO_OUT);
    WAN_TRY(wan_ew_x1(A, w, b));
    /* 2. cross-attention (text K/V; no RoPE, no gate) */
    LIN(b->q2_pre, b->xn2, w->attn2.to_q_w, w->attn2.to_q_b, BS, D, D, WAN_LORA_ATTN2_TO_Q);
    LIN(b->k2_pre, A->ctx, w->attn2.to_k_w, w->attn2.to_k_b, B * L, D, D, WAN_LORA_ATTN2_TO_K);
    LIN(b->v2, A->ctx, w->attn2.to_v_w, w->attn2.to_v_b, B * L, D, D, WAN_LORA_ATTN2_TO_V);
    WAN_TRY(wan_ew_qk2(A, &w->attn2, b));
    if (dev->attention_forward(AO(b->o2), b->lse2, AI(b->q2), AI(b->k2), AI(b->v2), B, S, L, A->H, A->Dh, scale))
        return core_error_push("cross-attention: ");
    LIN(b->x2, b->o2, w->attn2.to_out_w, w->attn2.to_out_b, BS, D, D, WAN_LORA_ATTN2_TO_OUT); /* y2 ... */
    WAN_TRY(dev->add(AO(b->x2), AI(b->x1), (int64_t)BS * D));                                   /* ... + x1 */
    /* 3. feed-forward */
    WAN_TRY(wan_ew_norm3(A, b));
    LIN(b->h, b->xm3, w->ffn1_w, w->ffn1_b, BS, A->Fd, D, WAN_LORA_FFN_IN);
    WAN_TRY(wan_ew_gelu(A, b));
    LIN(b->y3, b->ha, w->ffn2_w, w->ffn2_b, BS, D, A->Fd, WAN_LORA_FFN_OUT);
    return dev->gate_residual_forward(AO(out), AI(b->x2), AI(b->y3), MOD(A, 5), B, S, D, pt, 6 * D);
}

/* ---- the model: WanTransformer3DModel.forward ---- */

int wan_model_forward(const wan_exec *ex, wan_acts *A, kb_out out, kb_in x, const float *timestep, kb_in enc) {
    const k_dev_ops *dev = A->dev;
    const wan_config *c = &A->cfg;
    const wan_weights *w = &A->mv.host->w;
    const wan_shape *sh = &A->shape;
    const int B = sh->B, S = A->S, D = A->D, L = A->L, R = A->R, BS = B * S, l = -1;
    const int *p = c->patch_size;
    const int host = A->at == KB_F32; /* the CPU table: fp32 host tensors */
    /* the adapter, unless switched off for this call (the KL reference); the backward follows this choice */
    A->have_forward = 0;
    if (wan_lora_acts_prepare(A)) return -1;

    /* patch embedding: Conv3d(kernel = stride = patch) = patchify + GEMM; tokens in (f, h, w) order. Under SP the
     * full sample is patchified (in the activations' dtype) and this rank's rows [s0, s0+S) embedded. */
    if (A->sp > 1) {
        WAN_TRY(dev->patchify_forward(AO(A->full), x, B, c->in_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]));
        WAN_TRY(sp_shard_rows_dev(dev, AO(A->xp), AI(A->full), B, S, A->Pin, A->sp, A->sp_rank));
    } else {
        WAN_TRY(dev->patchify_forward(AO(A->xp), x, B, c->in_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]));
    }
    WAN_TRY(wan_linear_fwd(dev, AO(A->res[0]), AI(A->xp), W(w->patch_w), W(w->patch_b), BS, D, A->Pin));

    /* condition embedder: timestep -> temb [R, D], tproj [R, 6D] (the sinusoid on the host; a device gets it
     * rounded to bf16); text -> ctx [B, L, D] (whole on every rank) */
    if (sh->per_token_timestep && A->sp > 1) /* this rank's tokens of each sample's [S_full] timesteps */
        for (int b = 0; b < B; b++)
            wan_timestep_features(A->tsin_host + (int64_t)b * S * c->freq_dim,
                                  timestep + (int64_t)b * A->S_full + A->s0, S, c->freq_dim);
    else
        wan_timestep_features(A->tsin_host, timestep, R, c->freq_dim);
    if (!host && dev->mem_upload_bf16(A->tsin, A->tsin_host, (size_t)R * c->freq_dim))
        return core_error_push("timestep features: ");
    LIN(A->t1, A->tsin, w->time1_w, w->time1_b, R, D, c->freq_dim, WAN_LORA_TIME_1);
    WAN_TRY(dev->silu_forward(AO(A->t1a), AI(A->t1), (int64_t)R * D));
    LIN(A->temb, A->t1a, w->time2_w, w->time2_b, R, D, D, WAN_LORA_TIME_2);
    WAN_TRY(dev->silu_forward(AO(A->temb_act), AI(A->temb), (int64_t)R * D));
    LIN(A->tproj, A->temb_act, w->tproj_w, w->tproj_b, R, 6 * D, D, WAN_LORA_TIME_PROJ);
    const int64_t ne = (int64_t)B * L * c->text_dim;
    if (host) { /* a copy of encoder_hidden_states (host to host) */
        if (enc.t != KB_F32) return core_error("encoder_hidden_states: the CPU model takes fp32");
        memcpy(A->enc, enc.p, (size_t)ne * sizeof(float));
    } else { /* rounded to the activations' dtype: zero, then the table's add */
        WAN_TRY(wan_zero_act(A, A->enc, ne));
        WAN_TRY(dev->add(AO(A->enc), enc, ne));
    }
    LIN(A->e1, A->enc, w->text1_w, w->text1_b, B * L, D, c->text_dim, WAN_LORA_TEXT_1);
    WAN_TRY(dev->gelu_forward(AO(A->e1a), AI(A->e1), (int64_t)B * L * D));
    LIN(A->ctx, A->e1a, w->text2_w, w->text2_b, B * L, D, D, WAN_LORA_TEXT_2);

    for (int i = 0; i < c->num_layers; i++)
        if (wan_block_forward(ex, A, &w->blocks[i], &A->blk[i], A->res[i + 1])) return core_error_push("block %d: ", i);

    /* output norm, modulation by (scale_shift_table + temb), projection (fp32: the velocity), unpatchify */
    WAN_TRY(dev->add_table_forward(kb_out_f32(A->modo), W(w->scale_shift_table), AI(A->temb), R, 2, D, 1));
    WAN_TRY(dev->layernorm_forward(AO(A->xno), A->meano, A->rstdo, AI(A->res[c->num_layers]), WAN_NO_IN, WAN_NO_IN,
                                   BS, D, (float)c->eps));
    WAN_TRY(dev->modulate_forward(AO(A->xmo), AI(A->xno), kb_in_f32(A->modo), kb_in_f32(A->modo + D), B, S, D,
                                  sh->per_token_timestep, 2 * D));
    WAN_TRY(wan_linear_fwd(dev, kb_out_f32(A->po), AI(A->xmo), W(w->proj_out_w), kb_in_f32(A->mv.proj_out_b), BS,
                           A->Pout, D));
    WAN_TRY(wan_lora_fwd(A, -1, WAN_LORA_PROJ_OUT, kb_out_f32(A->po), AI(A->xmo), BS));
    if (A->sp > 1) { /* every rank gets every slice: the same full velocity everywhere */
        if (sp_gather_rows_dev(dev, ex->sp, kb_out_f32(A->full), kb_in_f32(A->po), B, S, A->Pout)) return -1;
        WAN_TRY(dev->unpatchify_forward(out, kb_in_f32(A->full), B, c->out_channels, sh->F, sh->H, sh->W, p[0], p[1],
                                        p[2]));
    } else {
        WAN_TRY(dev->unpatchify_forward(out, kb_in_f32(A->po), B, c->out_channels, sh->F, sh->H, sh->W, p[0], p[1],
                                        p[2]));
    }
    A->have_forward = 1;
    return 0;
}

int wan_forward(const wan_model *m, wan_acts *A, const wan_exec *exec, float *out, const float *x,
                const float *timestep, const float *enc) {
    wan_exec ex;
    wan_exec_resolve(&ex, exec);
    if (A->dev != &k_cpu_dev_ops)
        return core_error("wan_forward: the activations live on %s (wan_dev_acts_new): the CPU model needs "
                          "wan_acts_new's", A->dev->name);
    if (ex.ops != &k_cpu_ops) return core_error("wan_forward: wan_exec.ops must be NULL or &k_cpu_ops");
    if (!wan_config_equal(&A->cfg, &m->cfg)) return core_error("wan_forward: activations were made for another config");
    if (wan_exec_check_sp(exec, A, "wan_forward")) return -1;
    wan_mview_cpu(&A->mv, m, m->lora && !ex.lora_off ? m->lora : NULL);
    if (wan_model_forward(&ex, A, kb_out_f32(out), kb_in_f32(x), timestep, kb_in_f32(enc)))
        return core_error_push("wan_forward: ");
    return 0;
}
