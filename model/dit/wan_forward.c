/* model/dit/wan_forward.c — forward of WanTransformer3DModel (diffusers 0.42.1 transformer_wan.py), fp32, through
 * the kernel table. The order of operations follows the reference line by line (WanTransformer3DModel.forward,
 * WanTransformerBlock.forward, WanAttnProcessor.__call__); shapes are in wan_internal.h. The elementwise steps of
 * a block are separate functions so that wan_backward.c recomputes them with exactly the same calls. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_internal.h"
#include "model/dit/wan_lora.h"
#include "sp/shard.h"

/* ---- the default self-attention: the kernel's blocked attention over the whole sequence ---- */

float wan_attn_scale(int Dh) { return (float)(1.0 / sqrt((double)Dh)); }

static int default_attn_fwd(void *ctx, float *o, float *lse, const float *q, const float *k, const float *v, int B,
                            int S, int H, int Dh) {
    const k_ops *ops = ctx;
    ops->attention_forward(o, lse, q, k, v, B, S, S, H, Dh, wan_attn_scale(Dh));
    return 0;
}

static int default_attn_bwd(void *ctx, float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *o, const float *lse, int B, int S, int H,
                            int Dh) {
    const k_ops *ops = ctx;
    ops->attention_backward(dq, dk, dv, dout, q, k, v, o, lse, B, S, S, H, Dh, wan_attn_scale(Dh));
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

/* ---- elementwise steps of a block (shared with the backward's recompute) ---- */

#define MOD(A, j) ((A)->mod + (int64_t)(j) * (A)->D) /* shift, scale, gate, c_shift, c_scale, c_gate */

void wan_block_modulation(const wan_acts *A, const wan_block_weights *w) {
    wan_add_table(A->mod, w->scale_shift_table, A->tproj, A->R, 6, A->D, 6);
}

/* xn1 = LN(x); xm1 = xn1 * (1 + scale_msa) + shift_msa. */
void wan_ew_norm1(const k_ops *ops, const wan_acts *A, wan_block_acts *b) {
    const int B = A->shape.B, S = A->S, D = A->D, pt = A->shape.per_token_timestep;
    ops->layernorm_forward(b->xn1, b->mean1, b->rstd1, b->x, NULL, NULL, B * S, D, (float)A->cfg.eps);
    ops->modulate_forward(b->xm1, b->xn1, MOD(A, 0), MOD(A, 1), B, S, D, pt, 6 * D);
}

/* q = rope(norm_q(q_pre)), k = rope(norm_k(k_pre)). */
void wan_ew_qk(const k_ops *ops, const wan_acts *A, const wan_attn_weights *w, wan_block_acts *b) {
    const int B = A->shape.B, S = A->S, D = A->D;
    ops->rmsnorm_forward(b->q, b->rstd_q, b->q_pre, w->norm_q, B * S, D, (float)A->cfg.eps);
    ops->rmsnorm_forward(b->k, b->rstd_k, b->k_pre, w->norm_k, B * S, D, (float)A->cfg.eps);
    ops->rope_forward(b->q, b->q, A->rope_cos, A->rope_sin, B, S, A->H, A->Dh);
    ops->rope_forward(b->k, b->k, A->rope_cos, A->rope_sin, B, S, A->H, A->Dh);
}

/* x1 = x + y1 * gate_msa; xn2 = norm2(x1) (affine LayerNorm) when cross_attn_norm. */
void wan_ew_x1(const k_ops *ops, const wan_acts *A, const wan_block_weights *w, wan_block_acts *b) {
    const int B = A->shape.B, S = A->S, D = A->D, pt = A->shape.per_token_timestep;
    ops->gate_residual_forward(b->x1, b->x, b->y1, MOD(A, 2), B, S, D, pt, 6 * D);
    if (A->cfg.cross_attn_norm)
        ops->layernorm_forward(b->xn2, b->mean2, b->rstd2, b->x1, w->norm2_w, w->norm2_b, B * S, D,
                               (float)A->cfg.eps);
}

/* q2 = norm_q(q2_pre), k2 = norm_k(k2_pre) (no RoPE in the cross-attention). */
void wan_ew_qk2(const k_ops *ops, const wan_acts *A, const wan_attn_weights *w, wan_block_acts *b) {
    const int B = A->shape.B, S = A->S, D = A->D;
    ops->rmsnorm_forward(b->q2, b->rstd_q2, b->q2_pre, w->norm_q, B * S, D, (float)A->cfg.eps);
    ops->rmsnorm_forward(b->k2, b->rstd_k2, b->k2_pre, w->norm_k, B * A->L, D, (float)A->cfg.eps);
}

/* xn3 = LN(x2); xm3 = xn3 * (1 + c_scale_msa) + c_shift_msa. */
void wan_ew_norm3(const k_ops *ops, const wan_acts *A, wan_block_acts *b) {
    const int B = A->shape.B, S = A->S, D = A->D, pt = A->shape.per_token_timestep;
    ops->layernorm_forward(b->xn3, b->mean3, b->rstd3, b->x2, NULL, NULL, B * S, D, (float)A->cfg.eps);
    ops->modulate_forward(b->xm3, b->xn3, MOD(A, 3), MOD(A, 4), B, S, D, pt, 6 * D);
}

/* ha = gelu_tanh(h). */
void wan_ew_gelu(const k_ops *ops, const wan_acts *A, wan_block_acts *b) {
    ops->gelu_forward(b->ha, b->h, (int64_t)A->shape.B * A->S * A->Fd);
}

/* ---- one block: WanTransformerBlock.forward ---- */

int wan_block_forward(const wan_exec *ex, const wan_acts *A, const wan_block_weights *w, wan_block_acts *b,
                      float *out) {
    const k_ops *ops = ex->ops;
    const int B = A->shape.B, S = A->S, D = A->D, L = A->L, BS = B * S, pt = A->shape.per_token_timestep;
    const int l = b->layer;
    wan_block_modulation(A, w);
    /* 1. self-attention */
    wan_ew_norm1(ops, A, b);
    wan_linear_fwd(ops, b->q_pre, b->xm1, w->attn1.to_q_w, w->attn1.to_q_b, BS, D, D);
    wan_lora_fwd(ops, A, l, WAN_LORA_ATTN1_TO_Q, b->q_pre, b->xm1, BS);
    wan_linear_fwd(ops, b->k_pre, b->xm1, w->attn1.to_k_w, w->attn1.to_k_b, BS, D, D);
    wan_lora_fwd(ops, A, l, WAN_LORA_ATTN1_TO_K, b->k_pre, b->xm1, BS);
    wan_linear_fwd(ops, b->v, b->xm1, w->attn1.to_v_w, w->attn1.to_v_b, BS, D, D);
    wan_lora_fwd(ops, A, l, WAN_LORA_ATTN1_TO_V, b->v, b->xm1, BS);
    wan_ew_qk(ops, A, &w->attn1, b);
    if (ex->attn_fwd(ex->attn_ctx, b->o, b->lse, b->q, b->k, b->v, B, S, A->H, A->Dh))
        return core_error_push("self-attention: ");
    wan_linear_fwd(ops, b->y1, b->o, w->attn1.to_out_w, w->attn1.to_out_b, BS, D, D);
    wan_lora_fwd(ops, A, l, WAN_LORA_ATTN1_TO_OUT, b->y1, b->o, BS);
    wan_ew_x1(ops, A, w, b);
    /* 2. cross-attention (text K/V; no RoPE, no gate) */
    wan_linear_fwd(ops, b->q2_pre, b->xn2, w->attn2.to_q_w, w->attn2.to_q_b, BS, D, D);
    wan_lora_fwd(ops, A, l, WAN_LORA_ATTN2_TO_Q, b->q2_pre, b->xn2, BS);
    wan_linear_fwd(ops, b->k2_pre, A->ctx, w->attn2.to_k_w, w->attn2.to_k_b, B * L, D, D);
    wan_lora_fwd(ops, A, l, WAN_LORA_ATTN2_TO_K, b->k2_pre, A->ctx, B * L);
    wan_linear_fwd(ops, b->v2, A->ctx, w->attn2.to_v_w, w->attn2.to_v_b, B * L, D, D);
    wan_lora_fwd(ops, A, l, WAN_LORA_ATTN2_TO_V, b->v2, A->ctx, B * L);
    wan_ew_qk2(ops, A, &w->attn2, b);
    ops->attention_forward(b->o2, b->lse2, b->q2, b->k2, b->v2, B, S, L, A->H, A->Dh, wan_attn_scale(A->Dh));
    wan_linear_fwd(ops, b->x2, b->o2, w->attn2.to_out_w, w->attn2.to_out_b, BS, D, D); /* y2 ... */
    wan_lora_fwd(ops, A, l, WAN_LORA_ATTN2_TO_OUT, b->x2, b->o2, BS);
    wan_axpy1(b->x2, b->x1, (int64_t)BS * D);                                             /* ... + x1 */
    /* 3. feed-forward */
    wan_ew_norm3(ops, A, b);
    wan_linear_fwd(ops, b->h, b->xm3, w->ffn1_w, w->ffn1_b, BS, A->Fd, D);
    wan_lora_fwd(ops, A, l, WAN_LORA_FFN_IN, b->h, b->xm3, BS);
    wan_ew_gelu(ops, A, b);
    wan_linear_fwd(ops, b->y3, b->ha, w->ffn2_w, w->ffn2_b, BS, D, A->Fd);
    wan_lora_fwd(ops, A, l, WAN_LORA_FFN_OUT, b->y3, b->ha, BS);
    ops->gate_residual_forward(out, b->x2, b->y3, MOD(A, 5), B, S, D, pt, 6 * D);
    return 0;
}

/* ---- the model: WanTransformer3DModel.forward ---- */

int wan_forward(const wan_model *m, wan_acts *A, const wan_exec *exec, float *out, const float *x,
                const float *timestep, const float *enc) {
    wan_exec ex;
    wan_exec_resolve(&ex, exec);
    const k_ops *ops = ex.ops;
    const wan_config *c = &m->cfg;
    const wan_weights *w = &m->w;
    const wan_shape *sh = &A->shape;
    const int B = sh->B, S = A->S, D = A->D, L = A->L, R = A->R, BS = B * S;
    const int *p = c->patch_size;
    if (!wan_config_equal(&A->cfg, c)) return core_error("wan_forward: activations were made for another config");
    if (wan_exec_check_sp(exec, A, "wan_forward")) return -1;
    /* the adapter, unless switched off for this call (the KL reference); the backward follows this choice */
    A->have_forward = 0;
    if (wan_lora_acts_prepare(A, m->lora && !ex.lora_off ? m->lora : NULL)) return core_error_push("wan_forward: ");

    /* patch embedding: Conv3d(kernel = stride = patch) = patchify + GEMM; tokens in (f, h, w) order. Under SP the
     * full sample is patchified and this rank's rows [s0, s0+S) embedded. */
    if (A->sp > 1) {
        ops->patchify_forward(A->full, x, B, c->in_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]);
        sp_shard_rows(A->xp, A->full, B, S, A->Pin, A->sp, A->sp_rank);
    } else {
        ops->patchify_forward(A->xp, x, B, c->in_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]);
    }
    wan_linear_fwd(ops, A->res[0], A->xp, w->patch_w, w->patch_b, BS, D, A->Pin);

    /* condition embedder: timestep -> temb [R, D], tproj [R, 6D]; text -> ctx [B, L, D] (whole on every rank) */
    if (sh->per_token_timestep && A->sp > 1) /* this rank's tokens of each sample's [S_full] timesteps */
        for (int b = 0; b < B; b++)
            wan_timestep_features(A->tsin + (int64_t)b * S * c->freq_dim, timestep + (int64_t)b * A->S_full + A->s0,
                                  S, c->freq_dim);
    else
        wan_timestep_features(A->tsin, timestep, R, c->freq_dim);
    wan_linear_fwd(ops, A->t1, A->tsin, w->time1_w, w->time1_b, R, D, c->freq_dim);
    wan_lora_fwd(ops, A, -1, WAN_LORA_TIME_1, A->t1, A->tsin, R);
    ops->silu_forward(A->t1a, A->t1, (int64_t)R * D);
    wan_linear_fwd(ops, A->temb, A->t1a, w->time2_w, w->time2_b, R, D, D);
    wan_lora_fwd(ops, A, -1, WAN_LORA_TIME_2, A->temb, A->t1a, R);
    ops->silu_forward(A->temb_act, A->temb, (int64_t)R * D);
    wan_linear_fwd(ops, A->tproj, A->temb_act, w->tproj_w, w->tproj_b, R, 6 * D, D);
    wan_lora_fwd(ops, A, -1, WAN_LORA_TIME_PROJ, A->tproj, A->temb_act, R);
    memcpy(A->enc, enc, (size_t)B * L * c->text_dim * sizeof(float));
    wan_linear_fwd(ops, A->e1, A->enc, w->text1_w, w->text1_b, B * L, D, c->text_dim);
    wan_lora_fwd(ops, A, -1, WAN_LORA_TEXT_1, A->e1, A->enc, B * L);
    ops->gelu_forward(A->e1a, A->e1, (int64_t)B * L * D);
    wan_linear_fwd(ops, A->ctx, A->e1a, w->text2_w, w->text2_b, B * L, D, D);
    wan_lora_fwd(ops, A, -1, WAN_LORA_TEXT_2, A->ctx, A->e1a, B * L);

    for (int l = 0; l < c->num_layers; l++)
        if (wan_block_forward(&ex, A, &w->blocks[l], &A->blk[l], A->res[l + 1]))
            return core_error_push("block %d: ", l);

    /* output norm, modulation by (scale_shift_table + temb), projection, unpatchify */
    wan_add_table(A->modo, w->scale_shift_table, A->temb, R, 2, D, 1);
    ops->layernorm_forward(A->xno, A->meano, A->rstdo, A->res[c->num_layers], NULL, NULL, BS, D, (float)c->eps);
    ops->modulate_forward(A->xmo, A->xno, A->modo, A->modo + D, B, S, D, sh->per_token_timestep, 2 * D);
    wan_linear_fwd(ops, A->po, A->xmo, w->proj_out_w, w->proj_out_b, BS, A->Pout, D);
    wan_lora_fwd(ops, A, -1, WAN_LORA_PROJ_OUT, A->po, A->xmo, BS);
    if (A->sp > 1) { /* every rank gets every slice: the same full velocity everywhere */
        if (sp_gather_rows(ex.sp, A->full, A->po, B, S, A->Pout)) return core_error_push("wan_forward: ");
        ops->unpatchify_forward(out, A->full, B, c->out_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]);
    } else {
        ops->unpatchify_forward(out, A->po, B, c->out_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]);
    }
    A->have_forward = 1;
    return 0;
}
