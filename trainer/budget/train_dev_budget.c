/* trainer/budget/train_dev_budget.c — the device-memory estimate of trainer/optim/train_dev.h: one function for the trainer's
 * start-up check and for `vgrpo run --dry-run`. The activation sizes are wan_dev_acts_estimate's (the layout
 * model/dit/wan_acts.c allocates, counted by its own planning pass) and the LoRA scratch wan_lora_scratch_floats'
 * rows in bf16; everything else replays the allocations of model/dit/wan_dev.c (weights, gradients),
 * wan_dev_exec.c (staging) and trainer/optim/train_dev.c (master, moments),
 * so a change there needs the same change here (tests/test_dev_budget.c holds the emulated device's peak equal). */
#include "trainer/optim/train_dev.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/attn_sched.h"
#include "model/dit/wan_dev_exec.h"
#include "model/dit/wan_lora.h"
#include "model/flow/guidance.h"
#include "model/vae/wan_vae.h"
#include "sp/comm_nccl.h"
#include "trainer/budget/budget.h"
#include "trainer/dp/dp_bucket.h"
#include "trainer/dp/zero.h"
#include "trainer/optim/lora.h"

#define MIB 1048576.0
#define GIB (1024.0 * MIB)

/* The device's LoRA scratch (wan_dev_lora_prepare): the CPU model's two [maxM, rank] buffers
 * (wan_lora_scratch_floats for S / sp tokens), in bf16. */
static double lora_scratch(const wan_config *c, const wan_shape *sh, int rank, int sp) {
    const wan_lora_config lc = {.rank = rank};
    return 2.0 * (double)wan_lora_scratch_floats(c, &lc, sh, sp);
}

/* Sequence parallelism's device buffers beside the activations (bytes; 0 at sp 1). The USP attention's workspace
 * (sp_usp_ws), made at the first call, grown to the backward's and then held (sp/usp_attention.c: 12 tensors of the
 * local q's size and an LSE in hand, the all-to-all's send and receive buffers of 5 tensors and an LSE each: 22 bf16
 * tensors of n = B x S/sp x dim elements and 3 fp32 LSEs of nl = B x heads x S/sp; its forward needs less). The
 * velocity's all-gather (sp_gather: sp/shard.c, the full [B, S, C_out*pt*ph*pw] fp32), transient after proj_out,
 * counted beside both and LoRA's scratch: exact under full fine-tuning (the gather comes at the activations' peak),
 * at most the gather's bytes over under LoRA (tests/test_dev_sp.c). */
static double sp_usp_ws(const wan_config *c, const wan_shape *sh, int sp, double S) {
    if (sp <= 1) return 0;
    const double Sl = S / sp, n = (double)sh->B * Sl * wan_dim(c), nl = (double)sh->B * c->num_attention_heads * Sl;
    return 22.0 * 2.0 * n + 3.0 * 4.0 * nl;
}
static double sp_gather(const wan_config *c, const wan_shape *sh, int sp, double S) {
    if (sp <= 1) return 0;
    return 4.0 * sh->B * S * c->out_channels * c->patch_size[0] * c->patch_size[1] * c->patch_size[2];
}

/* The longest range one of R ranks sums when [lo, hi) of a buffer of n values is reduced: ZeRO stage 2's shards
 * (dp_zero_offsets) cut to it, else its even split (sp_comm_all_reduce_ordered). */
static int64_t longest_range(int64_t n, int64_t lo, int64_t hi, int R, int stage2) {
    int64_t best = 0, *offs = stage2 ? dp_zero_offsets(n, R) : NULL;
    for (int r = 0; r < R; r++) {
        int64_t a = lo + (hi - lo) * r / R, b = lo + (hi - lo) * (r + 1) / R;
        if (offs) {
            a = offs[r] < lo ? lo : offs[r] > hi ? hi : offs[r];
            b = offs[r + 1] < lo ? lo : offs[r + 1] > hi ? hi : offs[r + 1];
        }
        best = b - a > best ? b - a : best;
    }
    free(offs);
    return best;
}

/* NCCL's exact-reduction scratch in bytes (the request's `reduction` part; 0 without NCCL): the largest over the trained
 * experts and their reductions. t: what trains (the adapter or the model), lay: the model's layout. */
static double reduce_scratch(const trainer_dev_request *q, const wan_layout *lay, int64_t t) {
    const int R = q->nccl_ranks, s2 = q->zero_stage >= 2;
    if (R <= 1 || !q->train) return 0;
    int64_t longest = longest_range(t, 0, t, R, s2); /* the whole buffer (a LoRA adapter's bound with buckets) */
    if (q->grad_bucket_mib > 0 && !q->lora_numel) {
        dp_bucket *b = NULL;
        int n = 0;
        if (dp_bucket_plan(lay, (int64_t)(q->grad_bucket_mib * 1048576.0), &b, &n)) return -1;
        longest = 0;
        for (int k = 0; k < n; k++) {
            const int64_t l = longest_range(t, b[k].lo, b[k].hi, R, s2);
            longest = l > longest ? l : longest;
        }
        free(b);
    }
    return 4.0 * R * (double)(longest < SP_NCCL_PIECE ? longest : SP_NCCL_PIECE);
}

static double tokens(const wan_config *c, const wan_shape *sh) {
    return (double)(sh->F / c->patch_size[0]) * (sh->H / c->patch_size[1]) * (sh->W / c->patch_size[2]);
}

/* margin, need and total from alloc and the workspaces. */
static void totals(trainer_dev_budget *b) {
    const double sum = b->alloc + b->lt_ws + b->attn_ws + b->scratch;
    b->margin = fmax(sum * TRAINER_DEV_MARGIN_PCT / 100.0, TRAINER_DEV_MARGIN_MIN_MIB * MIB);
    b->need = sum + b->margin;
    b->context = TRAINER_DEV_CONTEXT_MIB * MIB;
    b->total = b->need + b->context;
}

int trainer_dev_estimate(const trainer_dev_request *q, trainer_dev_budget *b) {
    memset(b, 0, sizeof *b);
    b->window = q->window;
    const wan_config *c = q->c;
    wan_layout lay; /* the parameter count, without allocating weights */
    if (wan_layout_init(&lay, c)) return -1;
    const double numel = (double)lay.numel;
    b->reduce = reduce_scratch(q, &lay, q->lora_numel > 0 ? q->lora_numel : lay.numel);
    wan_layout_free(&lay);
    if (b->reduce < 0) return -1;
    const double pout = 4.0 * c->out_channels * c->patch_size[0] * c->patch_size[1] * c->patch_size[2];
    const int lora = q->lora_numel > 0;
    for (int e = 0; e < q->n_experts; e++) {
        const int tr = !q->trained || q->trained[e];
        const double t = lora ? (double)q->lora_numel : numel; /* what trains: the adapter, or the model */
        const int second = q->window && e == 1; /* an expert window: expert 1 shares expert 0's bf16 copy and grads */
        b->weights += (second ? 0.0 : 2.0 * numel) + pout;     /* the policy's copy (or the frozen base, LoRA) */
        if (!tr) continue;
        if (lora) b->weights += 2.0 * t + q->copies * 2.0 * t; /* the adapter; nft's old adapter on the same base */
        else b->weights += q->copies * (2.0 * numel + pout);   /* reference, EMA copies */
        /* the master whole (ZeRO stage 3: the largest shard's); m, v of the largest ZeRO shard (whole chunks:
         * trainer/dp/zero.h) over zero_ranks */
        const double chunks = ceil(t / OPTIM_CHUNK), R = q->zero_ranks > 1 ? q->zero_ranks : 1;
        const double shard = fmin(t, ceil(chunks / R) * OPTIM_CHUNK);
        if (q->train)
            b->grads += second ? 0.0 : 4.0 * t,
                b->optim += 4.0 * (q->zero_stage == 3 && R > 1 ? shard : t) + 8.0 * shard;
    }
    const int rank = lora ? q->lora_rank : 0;
    double big = 0; /* the largest forward's staging */
    if (q->train) {
        const wan_shape *ts = &q->train_shape;
        const int sp = q->sp > 1 ? q->sp : 1, U = q->ulysses > 1 ? q->ulysses : 1;
        /* the device's count of the DiT's one planning pass (model/dit/wan_acts.c: bf16 activations; one rank's under
         * sequence parallelism, the reference forward's too: it runs through the same executor) */
        const size_t ta = wan_dev_acts_estimate_sp(c, ts, q->mode, sp);
        const size_t ra = q->ref_forward ? wan_dev_acts_estimate_sp(c, ts, WAN_ACTS_INFER, sp) : 0;
        if (!ta || (q->ref_forward && !ra)) return -1;
        const double Sf = tokens(c, ts);
        b->train_acts = (double)ta + (double)ra + (rank ? lora_scratch(c, ts, rank, sp) : 0) +
                        (rank && q->old_forward ? lora_scratch(c, ts, rank, sp) : 0) + sp_usp_ws(c, ts, sp, Sf) +
                        sp_gather(c, ts, sp, Sf);
        /* S: the queries of a call (this rank's tokens), Sr: the self-attention's keys (the ring block), Hs: its
         * heads (after the Ulysses all-to-all) */
        const double S = Sf / sp, D = wan_dim(c), Sk = S > ts->L ? S : ts->L;
        const int Sr = (int)(S * U), Hs = c->num_attention_heads / U;
        /* cuDNN's deterministic attention backward (kernels/cuda/attn_cudnn.c): per call a head group's dP
         * workspace (hc x pad128(Sq) x pad128(Skv) bf16, hc the heads that fit the call's budget,
         * kernels/cuda/attn_sched.h) and 1 MiB of cuDNN's own, then the group's fp32 row sums; the larger of the
         * self- and cross-attention calls (one workspace slot serves both); then attn_cudnn.c's bf16 dQ, dK, dV
         * scratch for the whole batch */
        const int H = c->num_attention_heads, iS = (int)S, iL = (int)ts->L;
        const int64_t budget = kc_attn_workspace_budget();
        double ws = 0;
        for (int x = 0; x < 2; x++) {
            const int Sq = x ? iS : Sr, Skv = x ? iL : Sr, Hc = x ? H : Hs;
            if (Skv < 1) continue;
            const int hc = kc_attn_heads_per_call(1, 1, Sq, Skv, Hc, budget);
            const double w = (double)hc * (double)((Sq + 127) / 128 * 128) * (double)((Skv + 127) / 128 * 128) *
                                 2.0 + (double)(1 << 20) + 4.0 * hc * Sq;
            if (w > ws) ws = w;
        }
        b->attn_ws = ws + 2.0 * ts->B * S * D + 2.0 * 2.0 * ts->B * Sk * D;
    }
    for (int i = 0; i < q->n_rollout; i++) {
        const size_t ro = wan_dev_acts_estimate(c, &q->rollout[i], WAN_ACTS_INFER);
        if (!ro) return -1;
        b->roll_acts += (double)ro + (rank ? lora_scratch(c, &q->rollout[i], rank, 1) : 0);
    }
    const wan_shape *sh[3] = {q->train ? &q->train_shape : NULL, q->n_rollout > 0 ? &q->rollout[0] : NULL,
                              q->n_rollout > 1 ? &q->rollout[1] : NULL};
    for (int i = 0; i < 3; i++) {
        if (!sh[i]) continue;
        const double vox = (double)sh[i]->F * sh[i]->H * sh[i]->W;
        const double st = 4.0 * sh[i]->B * ((c->in_channels + c->out_channels) * vox + (double)sh[i]->L * c->text_dim);
        big = st > big ? st : big;
    }
    b->staging = big;
    b->vae = q->vae_weights, b->vae_state = q->vae_state;
    b->sync_land = q->sync_land_numel > 0 ? 4.0 * (double)q->sync_land_numel : 0;
    b->alloc = b->weights + b->grads + b->optim + b->reduce + b->staging + b->vae + b->sync_land +
               fmax(b->train_acts, fmax(b->roll_acts, b->vae_state));
    b->lt_ws = TRAINER_DEV_LT_WS_MIB * MIB;
    b->scratch = TRAINER_DEV_SCRATCH_MIB * MIB;
    totals(b);
    return 0;
}

void trainer_dev_budget_text(trainer_dev_budget *b, const core_recipe *r, const t5_config *t5, int worker) {
    if (!t5 || !core_recipe_text_on_device(r)) return;
    b->text_weights = (double)t5_device_bytes(t5, 0, 0);
    b->text_acts = (double)t5_device_bytes(t5, 1, r->text_len) - b->text_weights;
    if (worker)
        b->alloc = b->weights + b->grads + b->optim + b->reduce + b->staging + b->vae + b->sync_land + b->text_weights +
                   fmax(fmax(b->train_acts, b->roll_acts), fmax(b->vae_state, b->text_acts));
    else
        b->alloc = fmax(b->alloc, b->text_weights + b->text_acts);
    totals(b);
}

int trainer_dev_estimate_recipe(const core_recipe *r, const wan_config *c, int n_experts, int i2v, int worker,
                                trainer_dev_budget *b) {
    const uint8_t trained[2] = {core_recipe_trains_expert(r, 0), n_experts == 2 && core_recipe_trains_expert(r, 1)};
    wan_lora_config lc;
    const int lora = trainer_lora_config(r, c, &lc);
    if (lora < 0) return -1;
    const int local = r->choice.mode == CORE_MODE_LOCAL;
    const int cfg1 = flow_cfg_active(r->guidance_scale), cfg2 = n_experts == 2 && flow_cfg_active(r->guidance_scale_2);
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    /* per-token timesteps for TI2V's first-frame conditioning only; I2V-A14B keeps one per row (model/flow/denoise.h) */
    const wan_shape base = {.B = 1, .F = F, .H = H, .W = W, .L = r->text_len,
                            .per_token_timestep = i2v && wan_cond_kind(c) == WAN_COND_LATENT};
    trainer_dev_request q = {.c = c, .n_experts = n_experts, .trained = trained,
                             .lora_numel = lora ? wan_lora_numel(c, &lc) : 0, .lora_rank = lora ? lc.rank : 0,
                             /* nft's old policy: a bf16 model on the device, under LoRA its adapter alone (a view
                              * of the policy's device copy: model/dit/wan_dev.h wan_dev_model_init_view); dpo's reference:
                              * the initial weights' copy, none under LoRA (the policy's base, its adapter off) */
                             .copies = (!lora && !worker ? (r->beta > 0) + (local && r->ema_decay > 0) : 0) +
                                       (!worker && (r->choice.loss == CORE_LOSS_NFT ||
                                                    (r->choice.loss == CORE_LOSS_DPO && !lora))),
                             .ref_forward = !worker && (r->beta > 0 || core_recipe_forward_process(r)),
                             .old_forward = !worker && r->choice.loss == CORE_LOSS_NFT, /* dpo's: adapter off */
                             .train = !worker, .train_shape = base,
                             .zero_ranks = !worker && !local && r->zero_stage > 0 ? r->trainer_ranks : 1,
                             /* NCCL moves the trainer ranks' gradients on a GPU, on the emulated device where a
                              * library is named (trainer/run/run_setup.c's choice) */
                             .nccl_ranks = !worker && !local && r->trainer_ranks > 1 &&
                                                   (!wan_dev_exec_emulating() || getenv("VGRPO_NCCL_LIB"))
                                               ? r->trainer_ranks
                                               : 0,
                             .zero_stage = r->zero_stage, .grad_bucket_mib = r->grad_bucket_mib,
                             .window = !worker && trainer_dev_expert_window(r, n_experts),
                             .sp = worker ? 1 : r->sp, .ulysses = worker ? 1 : r->ulysses_degree};
    /* a transition's CFG rows in its forward (nft trains CFG-free: one row; a dpo term two, its pair's samples) */
    q.train_shape.B = r->micro_batch_size *
                      (((cfg1 || cfg2) && !core_recipe_forward_process(r)) || r->choice.loss == CORE_LOSS_DPO ? 2 : 1);
    q.mode = r->choice.activations == CORE_ACTS_RECOMPUTE    ? WAN_ACTS_RECOMPUTE
             : r->choice.activations == CORE_ACTS_CHECKPOINT ? WAN_ACTS_CHECKPOINT
                                                             : WAN_ACTS_STORE;
    if (worker || local) { /* the engine's activations per CFG setting in use (rollout/engine.c) */
        const int used[2] = {!cfg1 || (n_experts == 2 && !cfg2), cfg1 || cfg2};
        for (int k = 0; k < 2; k++)
            if (used[k]) q.rollout[q.n_rollout] = base, q.rollout[q.n_rollout++].B = r->batch_size * (k ? 2 : 1);
    }
    /* the VAE decode on the device (rollout/pipeline.c rollout_decoder_load): where the process decodes */
    if ((worker || local) && r->choice.decoder == CORE_DECODER_VAE && r->choice.vae_device == CORE_VAE_DEVICE_AUTO) {
        vae_config v;
        const int got = budget_vae_config(r, c->out_channels, &v);
        if (got < 0) return -1;
        double wb = 0, sb = 0;
        if (got && vae_decoder_estimate_device(&v, H, W, &wb, &sb))
            return core_error_push("model.decoder (vae) on the device: ");
        q.vae_weights = wb, q.vae_state = sb;
    }
    /* a rollout worker's landing buffer of one bucket (rollout/worker_ipc.c): a sync by IPC or NCCL broadcast (every
     * parallel.sync but buckets; auto may still choose ZeroMQ buckets, which land on the host: then counted in
     * excess) of what trains, the model's or the adapter's flat fp32 buffer, cut at parallel.sync_bucket_mib */
    if (worker && r->choice.sync != CORE_SYNC_BUCKETS) {
        wan_layout lay;
        if (wan_layout_init(&lay, c)) return -1;
        const int64_t sent = q.lora_numel > 0 ? q.lora_numel : lay.numel;
        const int64_t per = (int64_t)r->sync_bucket_mib * 1048576 / (int64_t)sizeof(float); /* >= 1 MiB (recipe) */
        wan_layout_free(&lay);
        q.sync_land_numel = per > 0 && per < sent ? per : sent;
    }
    if (trainer_dev_estimate(&q, b)) return core_error_push("model.device cuda: the device estimate: ");
    return 0;
}

/* bytes as "812.4 MiB" or "23.81 GiB" into one of eight rotating buffers (for one printf). */
static const char *size_str(double bytes) {
    static char buf[8][32];
    static int k;
    char *s = buf[k++ & 7];
    if (bytes < GIB) snprintf(s, 32, "%.1f MiB", bytes / MIB);
    else snprintf(s, 32, "%.2f GiB", bytes / GIB);
    return s;
}

void trainer_dev_budget_print(FILE *f, const char *who, const trainer_dev_budget *b, const char *acts) {
    fprintf(f, "  %s, on its GPU:\n", who);
    fprintf(f, "    %-48s %11s\n",
            b->window ? "weights (bf16: one expert's window, other copies)" : "weights (bf16 copies, fp32 proj_out.bias)",
            size_str(b->weights));
    if (b->grads > 0) {
        fprintf(f, "    %-48s %11s\n", b->window ? "gradients (fp32: one expert's at a time)" : "gradients (fp32)",
                size_str(b->grads));
        fprintf(f, "    %-48s %11s\n", "master weights + AdamW m, v (fp32)", size_str(b->optim));
    }
    if (b->reduce > 0) fprintf(f, "    %-48s %11s\n", "NCCL exact gradient reduction's scratch", size_str(b->reduce));
    fprintf(f, "    %-48s %11s\n", "staging (the largest forward's inputs, output)", size_str(b->staging));
    if (b->train_acts > 0) {
        char what[96];
        snprintf(what, sizeof what, "training activations (%s) + reference", acts);
        fprintf(f, "    %-48s %11s  training phase\n", what, size_str(b->train_acts));
    }
    if (b->vae > 0) fprintf(f, "    %-48s %11s\n", "VAE decoder weights (bf16)", size_str(b->vae));
    if (b->sync_land > 0)
        fprintf(f, "    %-48s %11s\n", "weight sync landing buffer (one bucket, fp32)", size_str(b->sync_land));
    if (b->roll_acts > 0) fprintf(f, "    %-48s %11s  rollout phase\n", "rollout activations (infer)", size_str(b->roll_acts));
    if (b->text_weights > 0) { /* model.text_device auto */
        fprintf(f, "    %-48s %11s  %s\n", "umT5 text encoder weights (bf16, fp32 norms)", size_str(b->text_weights),
                b->train_acts > 0 ? "start-up, freed before the DiT's" : "the whole job");
        fprintf(f, "    %-48s %11s  %s\n", "umT5 forward of one prompt (rollout.text_len)", size_str(b->text_acts),
                b->train_acts > 0 ? "start-up" : "between rollouts");
    }
    if (b->vae_state > 0) fprintf(f, "    %-48s %11s  decode phase\n", "VAE decode state", size_str(b->vae_state));
    fprintf(f, "    %-48s %11s  (%.0f bytes: always + the larger phase)\n",
            "allocated on the device by DiT, VAE, umT5, sync", size_str(b->alloc),
            b->alloc);
    fprintf(f, "    %-48s %11s\n", "cuBLASLt workspace", size_str(b->lt_ws));
    if (b->attn_ws > 0) fprintf(f, "    %-48s %11s\n", "cuDNN attention backward workspace + dQ/dK/dV", size_str(b->attn_ws));
    fprintf(f, "    %-48s %11s\n", "backend scratch (reductions, bias gradient)", size_str(b->scratch));
    char what[64];
    snprintf(what, sizeof what, "margin (%d%%, at least %d MiB)", TRAINER_DEV_MARGIN_PCT, TRAINER_DEV_MARGIN_MIN_MIB);
    fprintf(f, "    %-48s %11s\n", what, size_str(b->margin));
    fprintf(f, "    %-48s %11s  (must be free at start-up)\n", "need", size_str(b->need));
    fprintf(f, "    %-48s %11s\n", "CUDA context + libraries' kernels (stated)", size_str(b->context));
    fprintf(f, "    %-48s %11s: %s on an 80 GB H100 (%s), %s on a 141 GB H200 (%s)\n", "total", size_str(b->total),
            b->total <= TRAINER_DEV_H100_MIB * MIB ? "fits" : "does NOT fit", size_str(TRAINER_DEV_H100_MIB * MIB),
            b->total <= TRAINER_DEV_H200_MIB * MIB ? "fits" : "does NOT fit", size_str(TRAINER_DEV_H200_MIB * MIB));
}

int trainer_dev_check_memory(wan_dev_exec *x, const trainer_dev_budget *b, const char *acts) {
    size_t fr = 0, tot = 0;
    const int known = wan_dev_exec_ops(x)->mem_info(&fr, &tot) == 0;
    printf("model.device cuda: device memory estimate %s to be free (weights %s, gradients and optimizer state %s, "
           "training activations %s with algorithm.activations %s, rollout activations %s, workspaces and margin %s; "
           "%s with the CUDA context)", size_str(b->need), size_str(b->weights), size_str(b->grads + b->optim),
           size_str(b->train_acts), acts, size_str(b->roll_acts),
           size_str(b->need - b->alloc), size_str(b->total));
    if (known) printf("; the device has %s free of %s\n", size_str((double)fr), size_str((double)tot));
    else printf("; the device states no bound\n");
    fflush(stdout);
    if (!known || b->need <= (double)fr) return 0;
    return core_error("model.device cuda: the estimate of %s of device memory (weights and optimizer state %s, "
                      "training activations %s, rollout activations %s, workspaces and margin %s) exceeds the %s free "
                      "on the device: lower algorithm.micro_batch_size or rollout.batch_size, set "
                      "algorithm.activations checkpoint (now %s), or train a smaller rollout.height / width / frames",
                      size_str(b->need), size_str(b->weights + b->grads + b->optim), size_str(b->train_acts),
                      size_str(b->roll_acts), size_str(b->need - b->alloc), size_str((double)fr), acts);
}
