/* model/dit/wan_backward.c — backward of WanTransformer3DModel: the forward of wan_forward.c walked in reverse,
 * written once over the device op table (wan_internal.h). Every parameter gradient accumulates (+=) into the model
 * view's gradients (A->mv: the CPU model's m->grads, a device's fp32 copy; the adapter's under LoRA); the gradient of
 * the residual stream lives in A->dres (fp32; on entry to a block: d(block output); on exit: d(block input)), and
 * where a GEMM reads it, or the text context's and the time embedding's fp32 gradients, it reads their copies in the
 * activations' dtype (on a bf16 device rounded once; on the CPU the same memory). Under WAN_ACTS_RECOMPUTE the block's
 * elementwise results are first recomputed with the forward's own functions (bitwise the same values); under
 * WAN_ACTS_CHECKPOINT (a device) the whole block's forward is rerun from its kept input first.
 * Sequence parallel (the CPU, A->sp > 1): the blocks run on this rank's tokens; the input and output ends are
 * described at wan_backward in wan_dit.h (dout rows sliced, dx gathered, d enc summed over the SP group, parameter
 * gradients left partial for the caller's all-reduce). */
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_internal.h"
#include "model/dit/wan_lora.h"
#include "sp/shard.h"

#define MOD(A, j) kb_in_f32((A)->mod + (int64_t)(j) * (A)->D)
#define DMOD(A, j) kb_out_f32((A)->dmod + (int64_t)(j) * (A)->D)
#define AI(p) wan_ai(A, p)
#define AO(p) wan_ao(A, p)
#define W(p) wan_w(&A->mv, p)
#define G(p) wan_g(&A->mv, p)

static int recompute_block(const wan_acts *A, const wan_block_weights *w, wan_block_acts *b) {
    WAN_TRY(wan_ew_norm1(A, b));
    WAN_TRY(wan_ew_qk(A, &w->attn1, b));
    WAN_TRY(wan_ew_x1(A, w, b));
    WAN_TRY(wan_ew_qk2(A, &w->attn2, b));
    WAN_TRY(wan_ew_norm3(A, b));
    return wan_ew_gelu(A, b);
}

/* d x += linear's backward and its adapter's (weight wt, bias bs: host pointers; target t of layer l). */
#define LINB(dx, dy, x, wt, bs, M, N, K, t)                                                                    \
    do {                                                                                                       \
        WAN_TRY(wan_linear_bwd(dev, dx, G(wt), G(bs), dy, x, W(wt), M, N, K));                                  \
        WAN_TRY(wan_lora_bwd(A, l, t, dx, dy, x, M));                                                           \
    } while (0)

int wan_block_backward(const wan_exec *ex, wan_acts *A, const wan_block_weights *w, wan_block_acts *b, void *out) {
    const k_dev_ops *dev = A->dev;
    const int B = A->shape.B, S = A->S, D = A->D, L = A->L, Fd = A->Fd, BS = B * S, BL = B * L, H = A->H;
    const int pt = A->shape.per_token_timestep, st = 6 * D, Dh = A->Dh, l = b->layer;
    const int64_t X = (int64_t)BS * D, T = (int64_t)BL * D;
    const float scale = wan_attn_scale(Dh);
    /* whole-block checkpointing: the block's forward again from its kept input into the shared set (its output, the
     * next block's input, is written again with the same bits) */
    if (A->mode == WAN_ACTS_CHECKPOINT) WAN_TRY(wan_block_forward(ex, A, w, b, out));
    WAN_TRY(wan_block_modulation(A, w));
    if (A->mode == WAN_ACTS_RECOMPUTE) WAN_TRY(recompute_block(A, w, b));
    WAN_TRY(wan_zero32(A, A->dmod, (int64_t)A->R * 6 * D));

    /* 3. feed-forward: out = x2 + y3 * c_gate; y3 = net.2(gelu(net.0.proj(xm3))) */
    WAN_TRY(wan_zero_act(A, A->da, X));
    WAN_TRY(dev->gate_residual_backward(WAN_NO_OUT, AO(A->da), DMOD(A, 5), kb_in_f32(A->dres), AI(b->y3), MOD(A, 5),
                                        B, S, D, pt, st));
    WAN_TRY(wan_zero_act(A, A->dha, (int64_t)BS * Fd));
    LINB(AO(A->dha), AI(A->da), AI(b->ha), w->ffn2_w, w->ffn2_b, BS, D, Fd, WAN_LORA_FFN_OUT);
    WAN_TRY(wan_zero_act(A, A->dh, (int64_t)BS * Fd));
    WAN_TRY(dev->gelu_backward(AO(A->dh), AI(A->dha), AI(b->h), (int64_t)BS * Fd));
    WAN_TRY(wan_zero_act(A, A->db, X));
    LINB(AO(A->db), AI(A->dh), AI(b->xm3), w->ffn1_w, w->ffn1_b, BS, Fd, D, WAN_LORA_FFN_IN);
    WAN_TRY(wan_zero_act(A, A->da, X));
    WAN_TRY(dev->modulate_backward(AO(A->da), DMOD(A, 3), DMOD(A, 4), AI(A->db), AI(b->xn3), MOD(A, 4), B, S, D, pt,
                                   st));
    WAN_TRY(dev->layernorm_backward(kb_out_f32(A->dres), WAN_NO_OUT, WAN_NO_OUT, AI(A->da), AI(b->x2), WAN_NO_IN,
                                    b->mean3, b->rstd3, BS, D));

    /* 2. cross-attention: x2 = x1 + to_out(attn(norm_q(to_q(xn2)), norm_k(to_k(ctx)), to_v(ctx))) */
    WAN_TRY(wan_to_act(A, A->dres16, A->dres, X));
    WAN_TRY(wan_zero_act(A, A->dob, X));
    LINB(AO(A->dob), AI(A->dres16), AI(b->o2), w->attn2.to_out_w, w->attn2.to_out_b, BS, D, D, WAN_LORA_ATTN2_TO_OUT);
    WAN_TRY(wan_zero_act(A, A->dq, X));
    WAN_TRY(wan_zero_act(A, A->dk2, T));
    WAN_TRY(wan_zero_act(A, A->dv2, T));
    if (dev->attention_backward(AO(A->dq), AO(A->dk2), AO(A->dv2), AI(A->dob), AI(b->q2), AI(b->k2), AI(b->v2),
                                AI(b->o2), b->lse2, B, S, L, H, Dh, scale))
        return core_error_push("cross-attention backward: ");
    WAN_TRY(wan_zero_act(A, A->dk2p, T));
    WAN_TRY(dev->rmsnorm_backward(AO(A->dk2p), kb_out_f32(G(w->attn2.norm_k)), AI(A->dk2), AI(b->k2_pre),
                                  W(w->attn2.norm_k), b->rstd_k2, BL, D));
    LINB(kb_out_f32(A->dctx), AI(A->dk2p), AI(A->ctx), w->attn2.to_k_w, w->attn2.to_k_b, BL, D, D,
         WAN_LORA_ATTN2_TO_K);
    LINB(kb_out_f32(A->dctx), AI(A->dv2), AI(A->ctx), w->attn2.to_v_w, w->attn2.to_v_b, BL, D, D, WAN_LORA_ATTN2_TO_V);
    WAN_TRY(wan_zero_act(A, A->dk, X));
    WAN_TRY(dev->rmsnorm_backward(AO(A->dk), kb_out_f32(G(w->attn2.norm_q)), AI(A->dq), AI(b->q2_pre),
                                  W(w->attn2.norm_q), b->rstd_q2, BS, D));
    if (A->cfg.cross_attn_norm) {
        WAN_TRY(wan_zero_act(A, A->da, X));
        LINB(AO(A->da), AI(A->dk), AI(b->xn2), w->attn2.to_q_w, w->attn2.to_q_b, BS, D, D, WAN_LORA_ATTN2_TO_Q);
        WAN_TRY(dev->layernorm_backward(kb_out_f32(A->dres), kb_out_f32(G(w->norm2_w)), kb_out_f32(G(w->norm2_b)),
                                        AI(A->da), AI(b->x1), W(w->norm2_w), b->mean2, b->rstd2, BS, D));
    } else {
        LINB(kb_out_f32(A->dres), AI(A->dk), AI(b->xn2), w->attn2.to_q_w, w->attn2.to_q_b, BS, D, D,
             WAN_LORA_ATTN2_TO_Q);
    }

    /* 1. self-attention: x1 = x + to_out(attn(rope(norm_q(q)), rope(norm_k(k)), v)) * gate, q/k/v from xm1 */
    WAN_TRY(wan_zero_act(A, A->da, X));
    WAN_TRY(dev->gate_residual_backward(WAN_NO_OUT, AO(A->da), DMOD(A, 2), kb_in_f32(A->dres), AI(b->y1), MOD(A, 2),
                                        B, S, D, pt, st));
    WAN_TRY(wan_zero_act(A, A->dob, X));
    LINB(AO(A->dob), AI(A->da), AI(b->o), w->attn1.to_out_w, w->attn1.to_out_b, BS, D, D, WAN_LORA_ATTN1_TO_OUT);
    WAN_TRY(wan_zero_act(A, A->dq, X));
    WAN_TRY(wan_zero_act(A, A->dk, X));
    WAN_TRY(wan_zero_act(A, A->dv, X));
    /* the hook (the CPU's, or a device's sequence-parallel one), else the table's attention */
    if (ex ? ex->attn_bwd(ex->attn_ctx, AO(A->dq), AO(A->dk), AO(A->dv), AI(A->dob), AI(b->q), AI(b->k), AI(b->v),
                          AI(b->o), b->lse, B, S, H, Dh)
           : dev->attention_backward(AO(A->dq), AO(A->dk), AO(A->dv), AI(A->dob), AI(b->q), AI(b->k), AI(b->v),
                                     AI(b->o), b->lse, B, S, S, H, Dh, scale))
        return core_error_push("self-attention backward: ");
    WAN_TRY(wan_zero_act(A, A->da, X));
    WAN_TRY(dev->rope_backward(AO(A->da), AI(A->dq), A->rope_cos, A->rope_sin, B, S, H, Dh));
    WAN_TRY(wan_zero_act(A, A->db, X)); /* db = d q_pre */
    WAN_TRY(dev->rmsnorm_backward(AO(A->db), kb_out_f32(G(w->attn1.norm_q)), AI(A->da), AI(b->q_pre),
                                  W(w->attn1.norm_q), b->rstd_q, BS, D));
    WAN_TRY(wan_zero_act(A, A->da, X));
    WAN_TRY(dev->rope_backward(AO(A->da), AI(A->dk), A->rope_cos, A->rope_sin, B, S, H, Dh));
    WAN_TRY(wan_zero_act(A, A->dq, X)); /* dq = d k_pre */
    WAN_TRY(dev->rmsnorm_backward(AO(A->dq), kb_out_f32(G(w->attn1.norm_k)), AI(A->da), AI(b->k_pre),
                                  W(w->attn1.norm_k), b->rstd_k, BS, D));
    WAN_TRY(wan_zero_act(A, A->da, X)); /* da = d xm1 */
    LINB(AO(A->da), AI(A->db), AI(b->xm1), w->attn1.to_q_w, w->attn1.to_q_b, BS, D, D, WAN_LORA_ATTN1_TO_Q);
    LINB(AO(A->da), AI(A->dq), AI(b->xm1), w->attn1.to_k_w, w->attn1.to_k_b, BS, D, D, WAN_LORA_ATTN1_TO_K);
    LINB(AO(A->da), AI(A->dv), AI(b->xm1), w->attn1.to_v_w, w->attn1.to_v_b, BS, D, D, WAN_LORA_ATTN1_TO_V);
    WAN_TRY(wan_zero_act(A, A->db, X));
    WAN_TRY(dev->modulate_backward(AO(A->db), DMOD(A, 0), DMOD(A, 1), AI(A->da), AI(b->xn1), MOD(A, 1), B, S, D, pt,
                                   st));
    WAN_TRY(dev->layernorm_backward(kb_out_f32(A->dres), WAN_NO_OUT, WAN_NO_OUT, AI(A->db), AI(b->x), WAN_NO_IN,
                                    b->mean1, b->rstd1, BS, D));

    /* modulation = scale_shift_table + tproj */
    return dev->add_table_backward(kb_out_f32(G(w->scale_shift_table)), kb_out_f32(A->dtproj), kb_in_f32(A->dmod),
                                   A->R, 6, D, 6);
}

/* The hook of wan_exec.grad_ready after block `block` (-1: the end), if any. */
static int ready(const wan_acts *A, int block) {
    if (!A->mv.grad_ready || !A->mv.grad_ready(A->mv.grad_ready_ctx, A->mv.host, block)) return 0;
    return block < 0 ? core_error_push("gradient hook at the end: ") : core_error_push("gradient hook: ");
}

static int model_backward(const wan_exec *ex, wan_acts *A, kb_out dx, kb_out denc, kb_in dout);

int wan_model_backward(const wan_exec *ex, wan_acts *A, kb_out dx, kb_out denc, kb_in dout) {
    return model_backward(ex, A, dx, denc, dout) || ready(A, -1) ? -1 : 0;
}

static int model_backward(const wan_exec *ex, wan_acts *A, kb_out dx, kb_out denc, kb_in dout) {
    const k_dev_ops *dev = A->dev;
    const wan_config *c = &A->cfg;
    const wan_weights *w = &A->mv.host->w;
    const int base = A->mv.g != NULL; /* a frozen base (no gradients): its G() are NULL, which the layers skip */
    const wan_shape *sh = &A->shape;
    const int B = sh->B, S = A->S, D = A->D, L = A->L, R = A->R, BS = B * S, BL = B * L, l = -1;
    const int *p = c->patch_size;
    const int64_t X = (int64_t)BS * D;

    WAN_TRY(wan_zero32(A, A->dtemb, (int64_t)R * D));
    WAN_TRY(wan_zero32(A, A->dtproj, (int64_t)R * 6 * D));
    WAN_TRY(wan_zero32(A, A->dctx, (int64_t)BL * D));

    /* output: out = unpatchify(proj_out(LN(x) * (1 + scale) + shift)) */
    WAN_TRY(wan_zero_act(A, A->dpo, (int64_t)BS * A->Pout));
    if (A->sp > 1) { /* the gather's backward: this rank's rows of the full gradient (every rank holds all of it) */
        WAN_TRY(wan_zero_act(A, A->full, (int64_t)B * A->S_full * A->Pout));
        WAN_TRY(dev->unpatchify_backward(AO(A->full), dout, B, c->out_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]));
        WAN_TRY(sp_gather_rows_backward_dev(dev, AO(A->dpo), AI(A->full), B, S, A->Pout, A->sp, A->sp_rank));
    } else {
        WAN_TRY(dev->unpatchify_backward(AO(A->dpo), dout, B, c->out_channels, sh->F, sh->H, sh->W, p[0], p[1], p[2]));
    }
    WAN_TRY(wan_zero_act(A, A->da, X));
    LINB(AO(A->da), AI(A->dpo), AI(A->xmo), w->proj_out_w, w->proj_out_b, BS, A->Pout, D, WAN_LORA_PROJ_OUT);
    WAN_TRY(wan_zero_act(A, A->db, X));
    WAN_TRY(wan_zero32(A, A->dmodo, (int64_t)R * 2 * D));
    WAN_TRY(dev->modulate_backward(AO(A->db), kb_out_f32(A->dmodo), kb_out_f32(A->dmodo + D), AI(A->da), AI(A->xno),
                                   kb_in_f32(A->modo + D), B, S, D, sh->per_token_timestep, 2 * D));
    WAN_TRY(wan_zero32(A, A->dres, X));
    WAN_TRY(dev->layernorm_backward(kb_out_f32(A->dres), WAN_NO_OUT, WAN_NO_OUT, AI(A->db), AI(A->res[c->num_layers]),
                                    WAN_NO_IN, A->meano, A->rstdo, BS, D));
    WAN_TRY(dev->add_table_backward(kb_out_f32(G(w->scale_shift_table)), kb_out_f32(A->dtemb), kb_in_f32(A->dmodo), R,
                                    2, D, 1));

    for (int i = c->num_layers - 1; i >= 0; i--)
        if (wan_block_backward(ex, A, &w->blocks[i], &A->blk[i], A->res[i + 1]) || ready(A, i))
            return core_error_push("block %d: ", i);

    /* patch embedding (nothing to do for a frozen base when dx is not asked for) */
    if (dx.p || base) {
        WAN_TRY(wan_to_act(A, A->dres16, A->dres, X));
        WAN_TRY(wan_zero32(A, A->dxp, (int64_t)BS * A->Pin));
        WAN_TRY(wan_linear_bwd(dev, kb_out_f32(A->dxp), G(w->patch_w), G(w->patch_b), AI(A->dres16), AI(A->xp),
                               W(w->patch_w), BS, D, A->Pin));
    }
    if (dx.p && A->sp > 1) { /* every rank's rows, in sequence order: the full input gradient on every rank */
        if (sp_gather_rows_dev(dev, ex->sp, kb_out_f32(A->full), kb_in_f32(A->dxp), B, S, A->Pin))
            return core_error_push("d x: ");
        WAN_TRY(dev->patchify_backward(dx, kb_in_f32(A->full), B, c->in_channels, sh->F, sh->H, sh->W, p[0], p[1],
                                       p[2]));
    } else if (dx.p) {
        WAN_TRY(dev->patchify_backward(dx, kb_in_f32(A->dxp), B, c->in_channels, sh->F, sh->H, sh->W, p[0], p[1],
                                       p[2]));
    }

    /* text embedder: ctx = linear_2(gelu_tanh(linear_1(enc))); skipped when nothing there wants a gradient */
    if (base || denc.p || wan_lora_active(A, WAN_LORA_TEXT_1) || wan_lora_active(A, WAN_LORA_TEXT_2)) {
        WAN_TRY(wan_to_act(A, A->dctx16, A->dctx, (int64_t)BL * D));
        WAN_TRY(wan_zero_act(A, A->de1a, (int64_t)BL * D));
        LINB(AO(A->de1a), AI(A->dctx16), AI(A->e1a), w->text2_w, w->text2_b, BL, D, D, WAN_LORA_TEXT_2);
        WAN_TRY(wan_zero_act(A, A->de1, (int64_t)BL * D));
        WAN_TRY(dev->gelu_backward(AO(A->de1), AI(A->de1a), AI(A->e1), (int64_t)BL * D));
        if (denc.p && A->sp > 1) { /* this rank's part (its queries' share of the text K/V gradients), summed over SP */
            const int64_t ne = (int64_t)BL * c->text_dim;
            WAN_TRY(wan_zero32(A, A->denc_part, ne));
            LINB(kb_out_f32(A->denc_part), AI(A->de1), AI(A->enc), w->text1_w, w->text1_b, BL, D, c->text_dim,
                 WAN_LORA_TEXT_1);
            if (sp_comm_all_reduce(ex->sp, A->denc_part, A->denc_part, (size_t)ne, SP_F32))
                return core_error_push("d encoder_hidden_states: ");
            WAN_TRY(dev->add(denc, kb_in_f32(A->denc_part), ne));
        } else {
            LINB(denc, AI(A->de1), AI(A->enc), w->text1_w, w->text1_b, BL, D, c->text_dim, WAN_LORA_TEXT_1);
        }
    }

    /* time: tproj = time_proj(silu(temb)), temb = linear_2(silu(linear_1(sinusoid(t)))); the timestep gets no
     * gradient, so a frozen base without time adapters stops here */
    if (!base && !wan_lora_active(A, WAN_LORA_TIME_1) && !wan_lora_active(A, WAN_LORA_TIME_2) &&
        !wan_lora_active(A, WAN_LORA_TIME_PROJ))
        return 0;
    WAN_TRY(wan_to_act(A, A->dtproj16, A->dtproj, (int64_t)R * 6 * D));
    WAN_TRY(wan_zero_act(A, A->dtemb_act, (int64_t)R * D));
    LINB(AO(A->dtemb_act), AI(A->dtproj16), AI(A->temb_act), w->tproj_w, w->tproj_b, R, 6 * D, D, WAN_LORA_TIME_PROJ);
    WAN_TRY(dev->silu_backward(kb_out_f32(A->dtemb), AI(A->dtemb_act), AI(A->temb), (int64_t)R * D));
    WAN_TRY(wan_to_act(A, A->dtemb16, A->dtemb, (int64_t)R * D));
    WAN_TRY(wan_zero_act(A, A->dt1a, (int64_t)R * D));
    LINB(AO(A->dt1a), AI(A->dtemb16), AI(A->t1a), w->time2_w, w->time2_b, R, D, D, WAN_LORA_TIME_2);
    WAN_TRY(wan_zero_act(A, A->dt1, (int64_t)R * D));
    WAN_TRY(dev->silu_backward(AO(A->dt1), AI(A->dt1a), AI(A->t1), (int64_t)R * D));
    LINB(WAN_NO_OUT, AI(A->dt1), AI(A->tsin), w->time1_w, w->time1_b, R, D, c->freq_dim, WAN_LORA_TIME_1);
    return 0;
}

int wan_backward(wan_model *m, wan_acts *A, const wan_exec *exec, float *dx, float *denc, const float *dout) {
    if (A->dev != &k_cpu_dev_ops)
        return core_error("wan_backward: the activations live on %s (wan_dev_acts_new)", A->dev->name);
    if (!m->grads && !m->lora) return core_error("wan_backward: gradients are not allocated (wan_model_alloc_grads)");
    if (A->mode == WAN_ACTS_INFER) return core_error("wan_backward: activations were allocated for inference only");
    if (!A->have_forward) return core_error("wan_backward: no forward has run on these activations");
    if (!wan_config_equal(&A->cfg, &m->cfg))
        return core_error("wan_backward: activations were made for another config");
    const wan_lora *lo = A->mv.lora; /* what the forward applied */
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
    if (ex.ops != &k_cpu_ops) return core_error("wan_backward: wan_exec.ops must be NULL or &k_cpu_ops");
    wan_mview_cpu(&A->mv, m, lo); /* the gradients as they are now (allocated since the forward, perhaps) */
    A->mv.grad_ready = ex.grad_ready, A->mv.grad_ready_ctx = ex.grad_ready_ctx;
    if (wan_model_backward(&ex, A, kb_out_f32(dx), kb_out_f32(denc), kb_in_f32(dout)))
        return core_error_push("wan_backward: ");
    return 0;
}
