/* model/dit/wan_dev_backward.c — backward of WanTransformer3DModel on the device table (wan_dev.h): wan_backward.c
 * with every k_ops call replaced by its k_dev_ops entry, in the same order. Parameter gradients accumulate (+=)
 * into d->grads (fp32). The residual stream's gradient lives in A->dres (fp32; on entry to a block d(block output),
 * on exit d(block input)); where a GEMM reads it (dY of attn2.to_out and of the patch embedding) it is first
 * rounded into A->dres16. Likewise the text context's and the time embedding's gradients accumulate in fp32 and are
 * rounded once for their GEMMs. Under WAN_ACTS_RECOMPUTE the block's elementwise results are first recomputed with
 * the forward's own functions (the same bits); under WAN_ACTS_CHECKPOINT the whole block's forward is rerun from its
 * kept input (wan_dev_block_forward: the same bits), then its backward reads the shared set as STORE's would. */
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_dev_internal.h"

#define MOD(A, j) ((A)->mod + (int64_t)(j) * (A)->D)
#define DMOD(A, j) wd_out32((A)->dmod + (int64_t)(j) * (A)->D)

static int recompute_block(const wan_dev_model *d, const wan_dev_acts *A, const wan_block_weights *w,
                           wan_dev_block_acts *b) {
    WD_TRY(wan_dev_ew_norm1(A, b));
    WD_TRY(wan_dev_ew_qk(d, A, &w->attn1, b));
    WD_TRY(wan_dev_ew_x1(d, A, w, b));
    WD_TRY(wan_dev_ew_qk2(d, A, &w->attn2, b));
    WD_TRY(wan_dev_ew_norm3(A, b));
    return wan_dev_ew_gelu(A, b);
}

/* The gradients of the attention linears of one block: dW/db pointers of a target. */
#define G(f) wd_g(d, w->f)
#define W(f) wd_w(d, w->f)

static int block_backward(const wan_dev_model *d, wan_dev_acts *A, const wan_block_weights *w,
                          wan_dev_block_acts *b, kb_bf16 *out) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D, L = A->L, Fd = A->Fd, BS = B * S, BL = B * L, H = A->H;
    const int pt = A->shape.per_token_timestep, st = 6 * D, Dh = A->Dh;
    const int64_t X = (int64_t)BS * D, T = (int64_t)BL * D;
    const float scale = wan_attn_scale(Dh);
    const int l = b->layer;
    /* whole-block checkpointing: the block's forward again from its kept input into the shared set (its output, the
     * next block's input, is written again with the same bits) */
    if (A->mode == WAN_ACTS_CHECKPOINT) WD_TRY(wan_dev_block_forward(d, A, w, b, out));
    WD_TRY(wan_dev_block_modulation(d, A, w));
    if (A->mode == WAN_ACTS_RECOMPUTE) WD_TRY(recompute_block(d, A, w, b));
    WD_TRY(wan_dev_zero32(dev, A->dmod, (int64_t)A->R * 6 * D));

    /* 3. feed-forward: out = x2 + y3 * c_gate; y3 = net.2(gelu(net.0.proj(xm3))) */
    WD_TRY(wan_dev_zero16(dev, A->da, X));
    WD_TRY(dev->gate_residual_backward(WD_NO_OUT, wd_out(A->da), DMOD(A, 5), wd_in32(A->dres), wd_in(b->y3),
                                       wd_in32(MOD(A, 5)), B, S, D, pt, st));
    WD_TRY(wan_dev_zero16(dev, A->dha, (int64_t)BS * Fd));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->dha), G(ffn2_w), G(ffn2_b), A->da, b->ha, W(ffn2_w), BS, D, Fd));
    WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_FFN_OUT, wd_out(A->dha), A->da, b->ha, BS));
    WD_TRY(wan_dev_zero16(dev, A->dh, (int64_t)BS * Fd));
    WD_TRY(dev->gelu_backward(wd_out(A->dh), wd_in(A->dha), wd_in(b->h), (int64_t)BS * Fd));
    WD_TRY(wan_dev_zero16(dev, A->db, X));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->db), G(ffn1_w), G(ffn1_b), A->dh, b->xm3, W(ffn1_w), BS, Fd, D));
    WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_FFN_IN, wd_out(A->db), A->dh, b->xm3, BS));
    WD_TRY(wan_dev_zero16(dev, A->da, X));
    WD_TRY(dev->modulate_backward(wd_out(A->da), DMOD(A, 3), DMOD(A, 4), wd_in(A->db), wd_in(b->xn3),
                                  wd_in32(MOD(A, 4)), B, S, D, pt, st));
    WD_TRY(dev->layernorm_backward(wd_out32(A->dres), WD_NO_OUT, WD_NO_OUT, wd_in(A->da), wd_in(b->x2), WD_NO_IN,
                                   b->mean3, b->rstd3, BS, D));

    /* 2. cross-attention: x2 = x1 + to_out(attn(norm_q(to_q(xn2)), norm_k(to_k(ctx)), to_v(ctx))) */
    WD_TRY(wan_dev_to_bf16(dev, A->dres16, wd_in32(A->dres), X));
    WD_TRY(wan_dev_zero16(dev, A->dob, X));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->dob), G(attn2.to_out_w), G(attn2.to_out_b), A->dres16, b->o2,
                              W(attn2.to_out_w), BS, D, D));
    WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_ATTN2_TO_OUT, wd_out(A->dob), A->dres16, b->o2, BS));
    WD_TRY(wan_dev_zero16(dev, A->dq, X));
    WD_TRY(wan_dev_zero16(dev, A->dk2, T));
    WD_TRY(wan_dev_zero16(dev, A->dv2, T));
    if (dev->attention_backward(A->dq, A->dk2, A->dv2, A->dob, b->q2, b->k2, b->v2, b->o2, b->lse2, B, S, L, H, Dh,
                                scale))
        return core_error_push("cross-attention backward: ");
    WD_TRY(wan_dev_zero16(dev, A->dk2p, T));
    WD_TRY(dev->rmsnorm_backward(wd_out(A->dk2p), wd_out32(G(attn2.norm_k)), wd_in(A->dk2), wd_in(b->k2_pre),
                                 wd_in(W(attn2.norm_k)), b->rstd_k2, BL, D));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out32(A->dctx), G(attn2.to_k_w), G(attn2.to_k_b), A->dk2p, A->ctx,
                              W(attn2.to_k_w), BL, D, D));
    WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_ATTN2_TO_K, wd_out32(A->dctx), A->dk2p, A->ctx, BL));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out32(A->dctx), G(attn2.to_v_w), G(attn2.to_v_b), A->dv2, A->ctx,
                              W(attn2.to_v_w), BL, D, D));
    WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_ATTN2_TO_V, wd_out32(A->dctx), A->dv2, A->ctx, BL));
    WD_TRY(wan_dev_zero16(dev, A->dk, X));
    WD_TRY(dev->rmsnorm_backward(wd_out(A->dk), wd_out32(G(attn2.norm_q)), wd_in(A->dq), wd_in(b->q2_pre),
                                 wd_in(W(attn2.norm_q)), b->rstd_q2, BS, D));
    if (A->cfg.cross_attn_norm) {
        WD_TRY(wan_dev_zero16(dev, A->da, X));
        WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->da), G(attn2.to_q_w), G(attn2.to_q_b), A->dk, b->xn2,
                                  W(attn2.to_q_w), BS, D, D));
        WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_ATTN2_TO_Q, wd_out(A->da), A->dk, b->xn2, BS));
        WD_TRY(dev->layernorm_backward(wd_out32(A->dres), wd_out32(G(norm2_w)), wd_out32(G(norm2_b)), wd_in(A->da),
                                       wd_in(b->x1), wd_in(W(norm2_w)), b->mean2, b->rstd2, BS, D));
    } else {
        WD_TRY(wan_dev_linear_bwd(dev, wd_out32(A->dres), G(attn2.to_q_w), G(attn2.to_q_b), A->dk, b->xn2,
                                  W(attn2.to_q_w), BS, D, D));
        WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_ATTN2_TO_Q, wd_out32(A->dres), A->dk, b->xn2, BS));
    }

    /* 1. self-attention: x1 = x + to_out(attn(rope(norm_q(q)), rope(norm_k(k)), v)) * gate, q/k/v from xm1 */
    WD_TRY(wan_dev_zero16(dev, A->da, X));
    WD_TRY(dev->gate_residual_backward(WD_NO_OUT, wd_out(A->da), DMOD(A, 2), wd_in32(A->dres), wd_in(b->y1),
                                       wd_in32(MOD(A, 2)), B, S, D, pt, st));
    WD_TRY(wan_dev_zero16(dev, A->dob, X));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->dob), G(attn1.to_out_w), G(attn1.to_out_b), A->da, b->o,
                              W(attn1.to_out_w), BS, D, D));
    WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_ATTN1_TO_OUT, wd_out(A->dob), A->da, b->o, BS));
    WD_TRY(wan_dev_zero16(dev, A->dq, X));
    WD_TRY(wan_dev_zero16(dev, A->dk, X));
    WD_TRY(wan_dev_zero16(dev, A->dv, X));
    if (dev->attention_backward(A->dq, A->dk, A->dv, A->dob, b->q, b->k, b->v, b->o, b->lse, B, S, S, H, Dh, scale))
        return core_error_push("self-attention backward: ");
    WD_TRY(wan_dev_zero16(dev, A->da, X));
    WD_TRY(dev->rope_backward(wd_out(A->da), wd_in(A->dq), A->rope_cos, A->rope_sin, B, S, H, Dh));
    WD_TRY(wan_dev_zero16(dev, A->db, X)); /* db = d q_pre */
    WD_TRY(dev->rmsnorm_backward(wd_out(A->db), wd_out32(G(attn1.norm_q)), wd_in(A->da), wd_in(b->q_pre),
                                 wd_in(W(attn1.norm_q)), b->rstd_q, BS, D));
    WD_TRY(wan_dev_zero16(dev, A->da, X));
    WD_TRY(dev->rope_backward(wd_out(A->da), wd_in(A->dk), A->rope_cos, A->rope_sin, B, S, H, Dh));
    WD_TRY(wan_dev_zero16(dev, A->dq, X)); /* dq = d k_pre */
    WD_TRY(dev->rmsnorm_backward(wd_out(A->dq), wd_out32(G(attn1.norm_k)), wd_in(A->da), wd_in(b->k_pre),
                                 wd_in(W(attn1.norm_k)), b->rstd_k, BS, D));
    WD_TRY(wan_dev_zero16(dev, A->da, X)); /* da = d xm1 */
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->da), G(attn1.to_q_w), G(attn1.to_q_b), A->db, b->xm1, W(attn1.to_q_w),
                              BS, D, D));
    WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_ATTN1_TO_Q, wd_out(A->da), A->db, b->xm1, BS));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->da), G(attn1.to_k_w), G(attn1.to_k_b), A->dq, b->xm1, W(attn1.to_k_w),
                              BS, D, D));
    WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_ATTN1_TO_K, wd_out(A->da), A->dq, b->xm1, BS));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->da), G(attn1.to_v_w), G(attn1.to_v_b), A->dv, b->xm1, W(attn1.to_v_w),
                              BS, D, D));
    WD_TRY(wan_dev_lora_bwd(A, l, WAN_LORA_ATTN1_TO_V, wd_out(A->da), A->dv, b->xm1, BS));
    WD_TRY(wan_dev_zero16(dev, A->db, X));
    WD_TRY(dev->modulate_backward(wd_out(A->db), DMOD(A, 0), DMOD(A, 1), wd_in(A->da), wd_in(b->xn1),
                                  wd_in32(MOD(A, 1)), B, S, D, pt, st));
    WD_TRY(dev->layernorm_backward(wd_out32(A->dres), WD_NO_OUT, WD_NO_OUT, wd_in(A->db), wd_in(b->x), WD_NO_IN,
                                   b->mean1, b->rstd1, BS, D));

    /* modulation = scale_shift_table + tproj */
    return dev->add_table_backward(wd_out32(G(scale_shift_table)), wd_out32(A->dtproj), wd_in32(A->dmod), A->R, 6,
                                   D, 6);
}

int wan_dev_backward(wan_dev_model *d, wan_dev_acts *A, kb_out dx, kb_out denc, kb_in dout) {
    if (!d->grads && !(A->lora && d->lora_grads)) /* LoRA: the adapter's, the base frozen */
        return core_error("wan_dev_backward: gradients are not allocated (wan_dev_alloc_grads)");
    if (A->mode == WAN_ACTS_INFER) return core_error("wan_dev_backward: activations were allocated for inference only");
    if (!A->have_forward) return core_error("wan_dev_backward: no forward has run on these activations");
    if (wan_dev_check_pair(d, A, "wan_dev_backward")) return -1;
    const k_dev_ops *dev = A->dev;
    const wan_config *c = &d->host->cfg;
    const wan_weights *w = &d->host->w;
    const wan_shape *sh = &A->shape;
    const int B = sh->B, S = A->S, D = A->D, L = A->L, R = A->R, BS = B * S, BL = B * L;
    const int *p = c->patch_size;
    const int64_t X = (int64_t)BS * D;

    WD_TRY(wan_dev_zero32(dev, A->dtemb, (int64_t)R * D));
    WD_TRY(wan_dev_zero32(dev, A->dtproj, (int64_t)R * 6 * D));
    WD_TRY(wan_dev_zero32(dev, A->dctx, (int64_t)BL * D));

    /* output: out = unpatchify(proj_out(LN(x) * (1 + scale) + shift)) */
    WD_TRY(wan_dev_zero16(dev, A->dpo, (int64_t)BS * A->Pout));
    WD_TRY(dev->unpatchify_backward(wd_out(A->dpo), dout, B, c->out_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]));
    WD_TRY(wan_dev_zero16(dev, A->da, X));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->da), G(proj_out_w), G(proj_out_b), A->dpo, A->xmo, W(proj_out_w), BS,
                              A->Pout, D));
    WD_TRY(wan_dev_lora_bwd(A, -1, WAN_LORA_PROJ_OUT, wd_out(A->da), A->dpo, A->xmo, BS));
    WD_TRY(wan_dev_zero16(dev, A->db, X));
    WD_TRY(wan_dev_zero32(dev, A->dmodo, (int64_t)R * 2 * D));
    WD_TRY(dev->modulate_backward(wd_out(A->db), wd_out32(A->dmodo), wd_out32(A->dmodo + D), wd_in(A->da),
                                  wd_in(A->xno), wd_in32(A->modo + D), B, S, D, sh->per_token_timestep, 2 * D));
    WD_TRY(wan_dev_zero32(dev, A->dres, X));
    WD_TRY(dev->layernorm_backward(wd_out32(A->dres), WD_NO_OUT, WD_NO_OUT, wd_in(A->db),
                                   wd_in(A->res[c->num_layers]), WD_NO_IN, A->meano, A->rstdo, BS, D));
    WD_TRY(dev->add_table_backward(wd_out32(G(scale_shift_table)), wd_out32(A->dtemb), wd_in32(A->dmodo), R, 2, D,
                                   1));

    for (int l = c->num_layers - 1; l >= 0; l--)
        if (block_backward(d, A, &w->blocks[l], &A->blk[l], A->res[l + 1])) return core_error_push("block %d: ", l);

    /* patch embedding */
    WD_TRY(wan_dev_to_bf16(dev, A->dres16, wd_in32(A->dres), X));
    WD_TRY(wan_dev_zero32(dev, A->dxp, (int64_t)BS * A->Pin));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out32(A->dxp), G(patch_w), G(patch_b), A->dres16, A->xp, W(patch_w), BS, D,
                              A->Pin));
    if (dx.p)
        WD_TRY(dev->patchify_backward(dx, wd_in32(A->dxp), B, c->in_channels, sh->F, sh->H, sh->W, p[0], p[1],
                                      p[2]));

    /* text embedder: ctx = linear_2(gelu_tanh(linear_1(enc))) */
    WD_TRY(wan_dev_to_bf16(dev, A->dctx16, wd_in32(A->dctx), (int64_t)BL * D));
    WD_TRY(wan_dev_zero16(dev, A->de1a, (int64_t)BL * D));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->de1a), G(text2_w), G(text2_b), A->dctx16, A->e1a, W(text2_w), BL, D, D));
    WD_TRY(wan_dev_lora_bwd(A, -1, WAN_LORA_TEXT_2, wd_out(A->de1a), A->dctx16, A->e1a, BL));
    WD_TRY(wan_dev_zero16(dev, A->de1, (int64_t)BL * D));
    WD_TRY(dev->gelu_backward(wd_out(A->de1), wd_in(A->de1a), wd_in(A->e1), (int64_t)BL * D));
    WD_TRY(wan_dev_linear_bwd(dev, denc, G(text1_w), G(text1_b), A->de1, A->enc, W(text1_w), BL, D, c->text_dim));
    WD_TRY(wan_dev_lora_bwd(A, -1, WAN_LORA_TEXT_1, denc, A->de1, A->enc, BL));

    /* time: tproj = time_proj(silu(temb)), temb = linear_2(silu(linear_1(sinusoid(t)))); no timestep gradient */
    WD_TRY(wan_dev_to_bf16(dev, A->dtproj16, wd_in32(A->dtproj), (int64_t)R * 6 * D));
    WD_TRY(wan_dev_zero16(dev, A->dtemb_act, (int64_t)R * D));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->dtemb_act), G(tproj_w), G(tproj_b), A->dtproj16, A->temb_act, W(tproj_w),
                              R, 6 * D, D));
    WD_TRY(wan_dev_lora_bwd(A, -1, WAN_LORA_TIME_PROJ, wd_out(A->dtemb_act), A->dtproj16, A->temb_act, R));
    WD_TRY(dev->silu_backward(wd_out32(A->dtemb), wd_in(A->dtemb_act), wd_in(A->temb), (int64_t)R * D));
    WD_TRY(wan_dev_to_bf16(dev, A->dtemb16, wd_in32(A->dtemb), (int64_t)R * D));
    WD_TRY(wan_dev_zero16(dev, A->dt1a, (int64_t)R * D));
    WD_TRY(wan_dev_linear_bwd(dev, wd_out(A->dt1a), G(time2_w), G(time2_b), A->dtemb16, A->t1a, W(time2_w), R, D, D));
    WD_TRY(wan_dev_lora_bwd(A, -1, WAN_LORA_TIME_2, wd_out(A->dt1a), A->dtemb16, A->t1a, R));
    WD_TRY(wan_dev_zero16(dev, A->dt1, (int64_t)R * D));
    WD_TRY(dev->silu_backward(wd_out(A->dt1), wd_in(A->dt1a), wd_in(A->t1), (int64_t)R * D));
    WD_TRY(wan_dev_linear_bwd(dev, WD_NO_OUT, G(time1_w), G(time1_b), A->dt1, A->tsin, W(time1_w), R, D,
                              c->freq_dim));
    return wan_dev_lora_bwd(A, -1, WAN_LORA_TIME_1, WD_NO_OUT, A->dt1, A->tsin, R);
}
