/* model/dit/wan_dev_forward.c — forward of WanTransformer3DModel on the device table (wan_dev.h): wan_forward.c with
 * every k_ops call replaced by its k_dev_ops entry, in the same order (diffusers 0.42.1 transformer_wan.py line by
 * line). The elementwise steps of a block are separate functions so that wan_dev_backward.c recomputes them with
 * exactly the same calls. Dtypes: wan_dev.h; shapes: wan_internal.h. */
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_dev_internal.h"

#define MOD(A, j) ((A)->mod + (int64_t)(j) * (A)->D) /* shift, scale, gate, c_shift, c_scale, c_gate (fp32) */

int wan_dev_check_pair(const wan_dev_model *d, const wan_dev_acts *A, const char *who) {
    if (!wan_config_equal(&A->cfg, &d->host->cfg))
        return core_error("%s: activations were made for another config", who);
    if (A->dev != d->dev)
        return core_error("%s: activations live on device %s, the model on %s", who, A->dev->name, d->dev->name);
    return 0;
}

/* ---- elementwise steps of a block (shared with the backward's recompute) ---- */

int wan_dev_block_modulation(const wan_dev_model *d, const wan_dev_acts *A, const wan_block_weights *w) {
    return A->dev->add_table_forward(wd_out32(A->mod), wd_in(wd_w(d, w->scale_shift_table)), wd_in(A->tproj), A->R,
                                     6, A->D, 6);
}

/* xn1 = LN(x); xm1 = xn1 * (1 + scale_msa) + shift_msa. */
int wan_dev_ew_norm1(const wan_dev_acts *A, wan_dev_block_acts *b) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D, pt = A->shape.per_token_timestep;
    WD_TRY(dev->layernorm_forward(wd_out(b->xn1), b->mean1, b->rstd1, wd_in(b->x), WD_NO_IN, WD_NO_IN, B * S, D,
                                  (float)A->cfg.eps));
    return dev->modulate_forward(wd_out(b->xm1), wd_in(b->xn1), wd_in32(MOD(A, 0)), wd_in32(MOD(A, 1)), B, S, D, pt,
                                 6 * D);
}

/* q = rope(norm_q(q_pre)), k = rope(norm_k(k_pre)). */
int wan_dev_ew_qk(const wan_dev_model *d, const wan_dev_acts *A, const wan_attn_weights *w, wan_dev_block_acts *b) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D;
    const float eps = (float)A->cfg.eps;
    WD_TRY(dev->rmsnorm_forward(wd_out(b->q), b->rstd_q, wd_in(b->q_pre), wd_in(wd_w(d, w->norm_q)), B * S, D, eps));
    WD_TRY(dev->rmsnorm_forward(wd_out(b->k), b->rstd_k, wd_in(b->k_pre), wd_in(wd_w(d, w->norm_k)), B * S, D, eps));
    WD_TRY(dev->rope_forward(wd_out(b->q), wd_in(b->q), A->rope_cos, A->rope_sin, B, S, A->H, A->Dh));
    return dev->rope_forward(wd_out(b->k), wd_in(b->k), A->rope_cos, A->rope_sin, B, S, A->H, A->Dh);
}

/* x1 = x + y1 * gate_msa; xn2 = norm2(x1) (affine LayerNorm) when cross_attn_norm. */
int wan_dev_ew_x1(const wan_dev_model *d, const wan_dev_acts *A, const wan_block_weights *w, wan_dev_block_acts *b) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D, pt = A->shape.per_token_timestep;
    WD_TRY(dev->gate_residual_forward(wd_out(b->x1), wd_in(b->x), wd_in(b->y1), wd_in32(MOD(A, 2)), B, S, D, pt,
                                      6 * D));
    if (!A->cfg.cross_attn_norm) return 0;
    return dev->layernorm_forward(wd_out(b->xn2), b->mean2, b->rstd2, wd_in(b->x1), wd_in(wd_w(d, w->norm2_w)),
                                  wd_in(wd_w(d, w->norm2_b)), B * S, D, (float)A->cfg.eps);
}

/* q2 = norm_q(q2_pre), k2 = norm_k(k2_pre) (no RoPE in the cross-attention). */
int wan_dev_ew_qk2(const wan_dev_model *d, const wan_dev_acts *A, const wan_attn_weights *w, wan_dev_block_acts *b) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D;
    const float eps = (float)A->cfg.eps;
    WD_TRY(dev->rmsnorm_forward(wd_out(b->q2), b->rstd_q2, wd_in(b->q2_pre), wd_in(wd_w(d, w->norm_q)), B * S, D,
                                eps));
    return dev->rmsnorm_forward(wd_out(b->k2), b->rstd_k2, wd_in(b->k2_pre), wd_in(wd_w(d, w->norm_k)), B * A->L, D,
                                eps);
}

/* xn3 = LN(x2); xm3 = xn3 * (1 + c_scale_msa) + c_shift_msa. */
int wan_dev_ew_norm3(const wan_dev_acts *A, wan_dev_block_acts *b) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D, pt = A->shape.per_token_timestep;
    WD_TRY(dev->layernorm_forward(wd_out(b->xn3), b->mean3, b->rstd3, wd_in(b->x2), WD_NO_IN, WD_NO_IN, B * S, D,
                                  (float)A->cfg.eps));
    return dev->modulate_forward(wd_out(b->xm3), wd_in(b->xn3), wd_in32(MOD(A, 3)), wd_in32(MOD(A, 4)), B, S, D, pt,
                                 6 * D);
}

/* ha = gelu_tanh(h). */
int wan_dev_ew_gelu(const wan_dev_acts *A, wan_dev_block_acts *b) {
    return A->dev->gelu_forward(wd_out(b->ha), wd_in(b->h), (int64_t)A->shape.B * A->S * A->Fd);
}

/* ---- one block: WanTransformerBlock.forward ---- */

int wan_dev_block_forward(const wan_dev_model *d, const wan_dev_acts *A, const wan_block_weights *w,
                          wan_dev_block_acts *b, kb_bf16 *out) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D, L = A->L, BS = B * S, pt = A->shape.per_token_timestep;
    const int l = b->layer;
    const float scale = wan_attn_scale(A->Dh);
    WD_TRY(wan_dev_block_modulation(d, A, w));
    /* 1. self-attention */
    WD_TRY(wan_dev_ew_norm1(A, b));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(b->q_pre), b->xm1, wd_w(d, w->attn1.to_q_w), wd_w(d, w->attn1.to_q_b), BS,
                              D, D));
    WD_TRY(wan_dev_lora_fwd(A, l, WAN_LORA_ATTN1_TO_Q, wd_out(b->q_pre), b->xm1, BS));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(b->k_pre), b->xm1, wd_w(d, w->attn1.to_k_w), wd_w(d, w->attn1.to_k_b), BS,
                              D, D));
    WD_TRY(wan_dev_lora_fwd(A, l, WAN_LORA_ATTN1_TO_K, wd_out(b->k_pre), b->xm1, BS));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(b->v), b->xm1, wd_w(d, w->attn1.to_v_w), wd_w(d, w->attn1.to_v_b), BS, D,
                              D));
    WD_TRY(wan_dev_lora_fwd(A, l, WAN_LORA_ATTN1_TO_V, wd_out(b->v), b->xm1, BS));
    WD_TRY(wan_dev_ew_qk(d, A, &w->attn1, b));
    if (dev->attention_forward(b->o, b->lse, b->q, b->k, b->v, B, S, S, A->H, A->Dh, scale))
        return core_error_push("self-attention: ");
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(b->y1), b->o, wd_w(d, w->attn1.to_out_w), wd_w(d, w->attn1.to_out_b), BS,
                              D, D));
    WD_TRY(wan_dev_lora_fwd(A, l, WAN_LORA_ATTN1_TO_OUT, wd_out(b->y1), b->o, BS));
    WD_TRY(wan_dev_ew_x1(d, A, w, b));
    /* 2. cross-attention (text K/V; no RoPE, no gate) */
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(b->q2_pre), b->xn2, wd_w(d, w->attn2.to_q_w), wd_w(d, w->attn2.to_q_b), BS,
                              D, D));
    WD_TRY(wan_dev_lora_fwd(A, l, WAN_LORA_ATTN2_TO_Q, wd_out(b->q2_pre), b->xn2, BS));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(b->k2_pre), A->ctx, wd_w(d, w->attn2.to_k_w), wd_w(d, w->attn2.to_k_b),
                              B * L, D, D));
    WD_TRY(wan_dev_lora_fwd(A, l, WAN_LORA_ATTN2_TO_K, wd_out(b->k2_pre), A->ctx, B * L));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(b->v2), A->ctx, wd_w(d, w->attn2.to_v_w), wd_w(d, w->attn2.to_v_b), B * L,
                              D, D));
    WD_TRY(wan_dev_lora_fwd(A, l, WAN_LORA_ATTN2_TO_V, wd_out(b->v2), A->ctx, B * L));
    WD_TRY(wan_dev_ew_qk2(d, A, &w->attn2, b));
    if (dev->attention_forward(b->o2, b->lse2, b->q2, b->k2, b->v2, B, S, L, A->H, A->Dh, scale))
        return core_error_push("cross-attention: ");
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(b->x2), b->o2, wd_w(d, w->attn2.to_out_w), wd_w(d, w->attn2.to_out_b), BS,
                              D, D));                                           /* y2 ... */
    WD_TRY(wan_dev_lora_fwd(A, l, WAN_LORA_ATTN2_TO_OUT, wd_out(b->x2), b->o2, BS));
    WD_TRY(dev->add(wd_out(b->x2), wd_in(b->x1), (int64_t)BS * D));            /* ... + x1 */
    /* 3. feed-forward */
    WD_TRY(wan_dev_ew_norm3(A, b));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(b->h), b->xm3, wd_w(d, w->ffn1_w), wd_w(d, w->ffn1_b), BS, A->Fd, D));
    WD_TRY(wan_dev_lora_fwd(A, l, WAN_LORA_FFN_IN, wd_out(b->h), b->xm3, BS));
    WD_TRY(wan_dev_ew_gelu(A, b));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(b->y3), b->ha, wd_w(d, w->ffn2_w), wd_w(d, w->ffn2_b), BS, D, A->Fd));
    WD_TRY(wan_dev_lora_fwd(A, l, WAN_LORA_FFN_OUT, wd_out(b->y3), b->ha, BS));
    return dev->gate_residual_forward(wd_out(out), wd_in(b->x2), wd_in(b->y3), wd_in32(MOD(A, 5)), B, S, D, pt,
                                      6 * D);
}

/* ---- the model: WanTransformer3DModel.forward ---- */

int wan_dev_forward(const wan_dev_model *d, wan_dev_acts *A, kb_out out, kb_in x, const float *timestep, kb_in enc) {
    return wan_dev_forward_lora(d, A, out, x, timestep, enc, 1);
}

int wan_dev_forward_lora(const wan_dev_model *d, wan_dev_acts *A, kb_out out, kb_in x, const float *timestep,
                         kb_in enc, int use_lora) {
    if (wan_dev_check_pair(d, A, "wan_dev_forward")) return -1;
    const k_dev_ops *dev = A->dev;
    const wan_config *c = &d->host->cfg;
    const wan_weights *w = &d->host->w;
    const wan_shape *sh = &A->shape;
    const int B = sh->B, S = A->S, D = A->D, L = A->L, R = A->R, BS = B * S;
    const int *p = c->patch_size;
    A->have_forward = 0;
    /* the adapter, unless switched off for this call (the KL reference under LoRA); the backward follows it */
    if (wan_dev_lora_prepare(A, d, use_lora)) return core_error_push("wan_dev_forward: ");

    /* patch embedding: Conv3d(kernel = stride = patch) = patchify + GEMM; tokens in (f, h, w) order */
    WD_TRY(dev->patchify_forward(wd_out(A->xp), x, B, c->in_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(A->res[0]), A->xp, wd_w(d, w->patch_w), wd_w(d, w->patch_b), BS, D,
                              A->Pin));

    /* condition embedder: timestep -> temb [R, D], tproj [R, 6D] (the sinusoid on the host); text -> ctx [B, L, D] */
    wan_timestep_features(A->tsin_host, timestep, R, c->freq_dim);
    if (dev->mem_upload_bf16(A->tsin, A->tsin_host, (size_t)R * c->freq_dim))
        return core_error_push("wan_dev_forward: timestep features: ");
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(A->t1), A->tsin, wd_w(d, w->time1_w), wd_w(d, w->time1_b), R, D,
                              c->freq_dim));
    WD_TRY(wan_dev_lora_fwd(A, -1, WAN_LORA_TIME_1, wd_out(A->t1), A->tsin, R));
    WD_TRY(dev->silu_forward(wd_out(A->t1a), wd_in(A->t1), (int64_t)R * D));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(A->temb), A->t1a, wd_w(d, w->time2_w), wd_w(d, w->time2_b), R, D, D));
    WD_TRY(wan_dev_lora_fwd(A, -1, WAN_LORA_TIME_2, wd_out(A->temb), A->t1a, R));
    WD_TRY(dev->silu_forward(wd_out(A->temb_act), wd_in(A->temb), (int64_t)R * D));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(A->tproj), A->temb_act, wd_w(d, w->tproj_w), wd_w(d, w->tproj_b), R, 6 * D,
                              D));
    WD_TRY(wan_dev_lora_fwd(A, -1, WAN_LORA_TIME_PROJ, wd_out(A->tproj), A->temb_act, R));
    WD_TRY(wan_dev_to_bf16(dev, A->enc, enc, (int64_t)B * L * c->text_dim)); /* the CPU's copy of enc */
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(A->e1), A->enc, wd_w(d, w->text1_w), wd_w(d, w->text1_b), B * L, D,
                              c->text_dim));
    WD_TRY(wan_dev_lora_fwd(A, -1, WAN_LORA_TEXT_1, wd_out(A->e1), A->enc, B * L));
    WD_TRY(dev->gelu_forward(wd_out(A->e1a), wd_in(A->e1), (int64_t)B * L * D));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out(A->ctx), A->e1a, wd_w(d, w->text2_w), wd_w(d, w->text2_b), B * L, D, D));
    WD_TRY(wan_dev_lora_fwd(A, -1, WAN_LORA_TEXT_2, wd_out(A->ctx), A->e1a, B * L));

    for (int l = 0; l < c->num_layers; l++)
        if (wan_dev_block_forward(d, A, &w->blocks[l], &A->blk[l], A->res[l + 1]))
            return core_error_push("block %d: ", l);

    /* output norm, modulation by (scale_shift_table + temb), projection (fp32: the velocity), unpatchify */
    WD_TRY(dev->add_table_forward(wd_out32(A->modo), wd_in(wd_w(d, w->scale_shift_table)), wd_in(A->temb), R, 2, D,
                                  1));
    WD_TRY(dev->layernorm_forward(wd_out(A->xno), A->meano, A->rstdo, wd_in(A->res[c->num_layers]), WD_NO_IN,
                                  WD_NO_IN, BS, D, (float)c->eps));
    WD_TRY(dev->modulate_forward(wd_out(A->xmo), wd_in(A->xno), wd_in32(A->modo), wd_in32(A->modo + D), B, S, D,
                                 sh->per_token_timestep, 2 * D));
    WD_TRY(wan_dev_linear_fwd(dev, wd_out32(A->po), A->xmo, wd_w(d, w->proj_out_w), d->proj_out_b, BS, A->Pout, D));
    WD_TRY(wan_dev_lora_fwd(A, -1, WAN_LORA_PROJ_OUT, wd_out32(A->po), A->xmo, BS));
    WD_TRY(dev->unpatchify_forward(out, wd_in32(A->po), B, c->out_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]));
    A->have_forward = 1;
    return 0;
}
