/* model/dit/wan_backward.c — backward of WanTransformer3DModel: the forward of wan_forward.c walked in reverse.
 * Every parameter gradient accumulates (+=) into model->grads; the gradient of the residual stream lives in
 * A->dres (on entry to a block: d(block output); on exit: d(block input)). Under WAN_ACTS_RECOMPUTE the block's
 * elementwise results are first recomputed with the forward's own functions (bitwise the same values).
 * Sequence parallel (A->sp > 1): the blocks run on this rank's tokens; the input and output ends are described at
 * wan_backward in wan_dit.h (dout rows sliced, dx gathered, d enc summed over the SP group, parameter gradients
 * left partial for the caller's all-reduce). */
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_internal.h"
#include "model/dit/wan_lora.h"
#include "sp/shard.h"

#define MOD(A, j) ((A)->mod + (int64_t)(j) * (A)->D)
#define DMOD(A, j) ((A)->dmod + (int64_t)(j) * (A)->D)

static void zero(float *p, int64_t n) { memset(p, 0, (size_t)n * sizeof(float)); }

static void recompute_block(const k_ops *ops, const wan_acts *A, const wan_block_weights *w, wan_block_acts *b) {
    wan_ew_norm1(ops, A, b);
    wan_ew_qk(ops, A, &w->attn1, b);
    wan_ew_x1(ops, A, w, b);
    wan_ew_qk2(ops, A, &w->attn2, b);
    wan_ew_norm3(ops, A, b);
    wan_ew_gelu(ops, A, b);
}

int wan_block_backward(const wan_exec *ex, wan_acts *A, const wan_block_weights *w, const wan_block_weights *g,
                       wan_block_acts *b) {
    const k_ops *ops = ex->ops;
    const int B = A->shape.B, S = A->S, D = A->D, L = A->L, Fd = A->Fd, BS = B * S, BL = B * L;
    const int pt = A->shape.per_token_timestep, st = 6 * D, l = b->layer;
    const int64_t X = (int64_t)BS * D, T = (int64_t)BL * D;
    wan_block_modulation(A, w);
    if (A->mode == WAN_ACTS_RECOMPUTE) recompute_block(ops, A, w, b);
    zero(A->dmod, (int64_t)A->R * 6 * D);

    /* 3. feed-forward: out = x2 + y3 * c_gate; y3 = net.2(gelu(net.0.proj(xm3))) */
    zero(A->da, X);
    ops->gate_residual_backward(NULL, A->da, DMOD(A, 5), A->dres, b->y3, MOD(A, 5), B, S, D, pt, st);
    zero(A->dha, (int64_t)BS * Fd);
    wan_linear_bwd(ops, A->dha, g->ffn2_w, g->ffn2_b, A->da, b->ha, w->ffn2_w, BS, D, Fd);
    wan_lora_bwd(ops, A, l, WAN_LORA_FFN_OUT, A->dha, A->da, b->ha, BS);
    zero(A->dh, (int64_t)BS * Fd);
    ops->gelu_backward(A->dh, A->dha, b->h, (int64_t)BS * Fd);
    zero(A->db, X);
    wan_linear_bwd(ops, A->db, g->ffn1_w, g->ffn1_b, A->dh, b->xm3, w->ffn1_w, BS, Fd, D);
    wan_lora_bwd(ops, A, l, WAN_LORA_FFN_IN, A->db, A->dh, b->xm3, BS);
    zero(A->da, X);
    ops->modulate_backward(A->da, DMOD(A, 3), DMOD(A, 4), A->db, b->xn3, MOD(A, 4), B, S, D, pt, st);
    ops->layernorm_backward(A->dres, NULL, NULL, A->da, b->x2, NULL, b->mean3, b->rstd3, BS, D);

    /* 2. cross-attention: x2 = x1 + to_out(attn(norm_q(to_q(xn2)), norm_k(to_k(ctx)), to_v(ctx))) */
    zero(A->dob, X);
    wan_linear_bwd(ops, A->dob, g->attn2.to_out_w, g->attn2.to_out_b, A->dres, b->o2, w->attn2.to_out_w, BS, D, D);
    wan_lora_bwd(ops, A, l, WAN_LORA_ATTN2_TO_OUT, A->dob, A->dres, b->o2, BS);
    zero(A->dq, X);
    zero(A->dk2, T);
    zero(A->dv2, T);
    ops->attention_backward(A->dq, A->dk2, A->dv2, A->dob, b->q2, b->k2, b->v2, b->o2, b->lse2, B, S, L, A->H, A->Dh,
                            wan_attn_scale(A->Dh));
    zero(A->dk2p, T);
    ops->rmsnorm_backward(A->dk2p, g->attn2.norm_k, A->dk2, b->k2_pre, w->attn2.norm_k, b->rstd_k2, BL, D);
    wan_linear_bwd(ops, A->dctx, g->attn2.to_k_w, g->attn2.to_k_b, A->dk2p, A->ctx, w->attn2.to_k_w, BL, D, D);
    wan_lora_bwd(ops, A, l, WAN_LORA_ATTN2_TO_K, A->dctx, A->dk2p, A->ctx, BL);
    wan_linear_bwd(ops, A->dctx, g->attn2.to_v_w, g->attn2.to_v_b, A->dv2, A->ctx, w->attn2.to_v_w, BL, D, D);
    wan_lora_bwd(ops, A, l, WAN_LORA_ATTN2_TO_V, A->dctx, A->dv2, A->ctx, BL);
    zero(A->dk, X);
    ops->rmsnorm_backward(A->dk, g->attn2.norm_q, A->dq, b->q2_pre, w->attn2.norm_q, b->rstd_q2, BS, D);
    if (A->cfg.cross_attn_norm) {
        zero(A->da, X);
        wan_linear_bwd(ops, A->da, g->attn2.to_q_w, g->attn2.to_q_b, A->dk, b->xn2, w->attn2.to_q_w, BS, D, D);
        wan_lora_bwd(ops, A, l, WAN_LORA_ATTN2_TO_Q, A->da, A->dk, b->xn2, BS);
        ops->layernorm_backward(A->dres, g->norm2_w, g->norm2_b, A->da, b->x1, w->norm2_w, b->mean2, b->rstd2, BS, D);
    } else {
        wan_linear_bwd(ops, A->dres, g->attn2.to_q_w, g->attn2.to_q_b, A->dk, b->xn2, w->attn2.to_q_w, BS, D, D);
        wan_lora_bwd(ops, A, l, WAN_LORA_ATTN2_TO_Q, A->dres, A->dk, b->xn2, BS);
    }

    /* 1. self-attention: x1 = x + to_out(attn(rope(norm_q(q)), rope(norm_k(k)), v)) * gate, q/k/v from xm1 */
    zero(A->da, X);
    ops->gate_residual_backward(NULL, A->da, DMOD(A, 2), A->dres, b->y1, MOD(A, 2), B, S, D, pt, st);
    zero(A->dob, X);
    wan_linear_bwd(ops, A->dob, g->attn1.to_out_w, g->attn1.to_out_b, A->da, b->o, w->attn1.to_out_w, BS, D, D);
    wan_lora_bwd(ops, A, l, WAN_LORA_ATTN1_TO_OUT, A->dob, A->da, b->o, BS);
    zero(A->dq, X);
    zero(A->dk, X);
    zero(A->dv, X);
    if (ex->attn_bwd(ex->attn_ctx, A->dq, A->dk, A->dv, A->dob, b->q, b->k, b->v, b->o, b->lse, B, S, A->H, A->Dh))
        return core_error_push("self-attention backward: ");
    zero(A->da, X);
    ops->rope_backward(A->da, A->dq, A->rope_cos, A->rope_sin, B, S, A->H, A->Dh);
    zero(A->db, X); /* db = d q_pre */
    ops->rmsnorm_backward(A->db, g->attn1.norm_q, A->da, b->q_pre, w->attn1.norm_q, b->rstd_q, BS, D);
    zero(A->da, X);
    ops->rope_backward(A->da, A->dk, A->rope_cos, A->rope_sin, B, S, A->H, A->Dh);
    zero(A->dq, X); /* dq = d k_pre */
    ops->rmsnorm_backward(A->dq, g->attn1.norm_k, A->da, b->k_pre, w->attn1.norm_k, b->rstd_k, BS, D);
    zero(A->da, X); /* da = d xm1 */
    wan_linear_bwd(ops, A->da, g->attn1.to_q_w, g->attn1.to_q_b, A->db, b->xm1, w->attn1.to_q_w, BS, D, D);
    wan_lora_bwd(ops, A, l, WAN_LORA_ATTN1_TO_Q, A->da, A->db, b->xm1, BS);
    wan_linear_bwd(ops, A->da, g->attn1.to_k_w, g->attn1.to_k_b, A->dq, b->xm1, w->attn1.to_k_w, BS, D, D);
    wan_lora_bwd(ops, A, l, WAN_LORA_ATTN1_TO_K, A->da, A->dq, b->xm1, BS);
    wan_linear_bwd(ops, A->da, g->attn1.to_v_w, g->attn1.to_v_b, A->dv, b->xm1, w->attn1.to_v_w, BS, D, D);
    wan_lora_bwd(ops, A, l, WAN_LORA_ATTN1_TO_V, A->da, A->dv, b->xm1, BS);
    zero(A->db, X);
    ops->modulate_backward(A->db, DMOD(A, 0), DMOD(A, 1), A->da, b->xn1, MOD(A, 1), B, S, D, pt, st);
    ops->layernorm_backward(A->dres, NULL, NULL, A->db, b->x, NULL, b->mean1, b->rstd1, BS, D);

    /* modulation = scale_shift_table + tproj */
    wan_add_table_bwd(g->scale_shift_table, A->dtproj, A->dmod, A->R, 6, D, 6);
    return 0;
}

int wan_backward(wan_model *m, wan_acts *A, const wan_exec *exec, float *dx, float *denc, const float *dout) {
    if (!m->grads && !m->lora) return core_error("wan_backward: gradients are not allocated (wan_model_alloc_grads)");
    if (A->mode == WAN_ACTS_INFER) return core_error("wan_backward: activations were allocated for inference only");
    if (!A->have_forward) return core_error("wan_backward: no forward has run on these activations");
    if (!wan_config_equal(&A->cfg, &m->cfg))
        return core_error("wan_backward: activations were made for another config");
    const wan_lora *lo = A->lora; /* what the forward applied */
    if (lo && lo != m->lora)
        return core_error("wan_backward: the forward ran with a LoRA adapter that is no longer the model's");
    if (!m->grads && lo && !lo->grads)
        return core_error("wan_backward: neither the model's nor the LoRA adapter's gradients are allocated "
                          "(wan_model_alloc_grads, wan_lora_alloc_grads)");
    if (!m->grads && !lo)
        return core_error("wan_backward: gradients are not allocated (wan_model_alloc_grads)%s",
                          m->lora ? "; the forward ran with the LoRA adapter switched off (wan_exec.lora_off)" : "");
    if (wan_exec_check_sp(exec, A, "wan_backward")) return -1;
    wan_exec ex;
    wan_exec_resolve(&ex, exec);
    const k_ops *ops = ex.ops;
    const wan_config *c = &m->cfg;
    /* Frozen base (no m->grads): every base-gradient pointer is NULL, which the layers skip; inputs' gradients and
     * the adapter's are computed exactly as with base gradients (same calls, same order). */
    static const wan_weights no_grads;
    static const wan_block_weights no_block_grads;
    const int base = m->grads != NULL;
    const wan_weights *w = &m->w, *g = base ? &m->g : &no_grads;
    const wan_shape *sh = &A->shape;
    const int B = sh->B, S = A->S, D = A->D, L = A->L, R = A->R, BS = B * S, BL = B * L;
    const int *p = c->patch_size;
    const int64_t X = (int64_t)BS * D;

    zero(A->dtemb, (int64_t)R * D);
    zero(A->dtproj, (int64_t)R * 6 * D);
    zero(A->dctx, (int64_t)BL * D);

    /* output: out = unpatchify(proj_out(LN(x) * (1 + scale) + shift)) */
    zero(A->dpo, (int64_t)BS * A->Pout);
    if (A->sp > 1) { /* the gather's backward: this rank's rows of the full gradient (every rank holds all of it) */
        zero(A->full, (int64_t)B * A->S_full * A->Pout);
        ops->unpatchify_backward(A->full, dout, B, c->out_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]);
        sp_gather_rows_backward(A->dpo, A->full, B, S, A->Pout, A->sp, A->sp_rank);
    } else {
        ops->unpatchify_backward(A->dpo, dout, B, c->out_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]);
    }
    zero(A->da, X);
    wan_linear_bwd(ops, A->da, g->proj_out_w, g->proj_out_b, A->dpo, A->xmo, w->proj_out_w, BS, A->Pout, D);
    wan_lora_bwd(ops, A, -1, WAN_LORA_PROJ_OUT, A->da, A->dpo, A->xmo, BS);
    zero(A->db, X);
    zero(A->dmodo, (int64_t)R * 2 * D);
    ops->modulate_backward(A->db, A->dmodo, A->dmodo + D, A->da, A->xno, A->modo + D, B, S, D,
                           sh->per_token_timestep, 2 * D);
    zero(A->dres, X);
    ops->layernorm_backward(A->dres, NULL, NULL, A->db, A->res[c->num_layers], NULL, A->meano, A->rstdo, BS, D);
    wan_add_table_bwd(g->scale_shift_table, A->dtemb, A->dmodo, R, 2, D, 1);

    for (int l = c->num_layers - 1; l >= 0; l--)
        if (wan_block_backward(&ex, A, &w->blocks[l], base ? &g->blocks[l] : &no_block_grads, &A->blk[l]))
            return core_error_push("block %d: ", l);

    /* patch embedding (nothing to do for a frozen base when dx is not asked for) */
    if (dx || base) {
        zero(A->dxp, (int64_t)BS * A->Pin);
        wan_linear_bwd(ops, A->dxp, g->patch_w, g->patch_b, A->dres, A->xp, w->patch_w, BS, D, A->Pin);
    }
    if (dx && A->sp > 1) { /* every rank's rows, in sequence order: the full input gradient on every rank */
        if (sp_gather_rows(ex.sp, A->full, A->dxp, B, S, A->Pin)) return core_error_push("wan_backward: d x: ");
        ops->patchify_backward(dx, A->full, B, c->in_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]);
    } else if (dx) {
        ops->patchify_backward(dx, A->dxp, B, c->in_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]);
    }

    /* text embedder: ctx = linear_2(gelu_tanh(linear_1(enc))); skipped when nothing there wants a gradient */
    if (base || denc || wan_lora_active(A, WAN_LORA_TEXT_1) || wan_lora_active(A, WAN_LORA_TEXT_2)) {
        zero(A->de1a, (int64_t)BL * D);
        wan_linear_bwd(ops, A->de1a, g->text2_w, g->text2_b, A->dctx, A->e1a, w->text2_w, BL, D, D);
        wan_lora_bwd(ops, A, -1, WAN_LORA_TEXT_2, A->de1a, A->dctx, A->e1a, BL);
        zero(A->de1, (int64_t)BL * D);
        ops->gelu_backward(A->de1, A->de1a, A->e1, (int64_t)BL * D);
        if (denc && A->sp > 1) { /* this rank's part (its queries' share of the text K/V gradients), summed over SP */
            const int64_t ne = (int64_t)BL * c->text_dim;
            zero(A->denc_part, ne);
            wan_linear_bwd(ops, A->denc_part, g->text1_w, g->text1_b, A->de1, A->enc, w->text1_w, BL, D,
                           c->text_dim);
            wan_lora_bwd(ops, A, -1, WAN_LORA_TEXT_1, A->denc_part, A->de1, A->enc, BL);
            if (sp_comm_all_reduce(ex.sp, A->denc_part, A->denc_part, (size_t)ne, SP_F32))
                return core_error_push("wan_backward: d encoder_hidden_states: ");
            wan_axpy1(denc, A->denc_part, ne);
        } else {
            wan_linear_bwd(ops, denc, g->text1_w, g->text1_b, A->de1, A->enc, w->text1_w, BL, D, c->text_dim);
            wan_lora_bwd(ops, A, -1, WAN_LORA_TEXT_1, denc, A->de1, A->enc, BL);
        }
    }

    /* time: tproj = time_proj(silu(temb)), temb = linear_2(silu(linear_1(sinusoid(t)))); the timestep gets no
     * gradient, so a frozen base without time adapters stops here */
    if (!base && !wan_lora_active(A, WAN_LORA_TIME_1) && !wan_lora_active(A, WAN_LORA_TIME_2) &&
        !wan_lora_active(A, WAN_LORA_TIME_PROJ))
        return 0;
    zero(A->dtemb_act, (int64_t)R * D);
    wan_linear_bwd(ops, A->dtemb_act, g->tproj_w, g->tproj_b, A->dtproj, A->temb_act, w->tproj_w, R, 6 * D, D);
    wan_lora_bwd(ops, A, -1, WAN_LORA_TIME_PROJ, A->dtemb_act, A->dtproj, A->temb_act, R);
    ops->silu_backward(A->dtemb, A->dtemb_act, A->temb, (int64_t)R * D);
    zero(A->dt1a, (int64_t)R * D);
    wan_linear_bwd(ops, A->dt1a, g->time2_w, g->time2_b, A->dtemb, A->t1a, w->time2_w, R, D, D);
    wan_lora_bwd(ops, A, -1, WAN_LORA_TIME_2, A->dt1a, A->dtemb, A->t1a, R);
    zero(A->dt1, (int64_t)R * D);
    ops->silu_backward(A->dt1, A->dt1a, A->t1, (int64_t)R * D);
    wan_linear_bwd(ops, NULL, g->time1_w, g->time1_b, A->dt1, A->tsin, w->time1_w, R, D, c->freq_dim);
    wan_lora_bwd(ops, A, -1, WAN_LORA_TIME_1, NULL, A->dt1, A->tsin, R);
    return 0;
}
