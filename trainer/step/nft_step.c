/* trainer/step/nft_step.c — DiffusionNFT's training pass on the Wan DiT (see nft_step.h). */
#include "trainer/step/nft_step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/flow/denoise.h"
#include "trainer/optim/lora.h"

typedef struct {
    int s, i; /* sample, step */
} nft_tr;

static int check_config(const nft_step_config *c) {
    if (!(c->nft_beta > 0) || !isfinite(c->nft_beta))
        return core_error("algorithm.nft_beta: must be finite and > 0, got %g", (double)c->nft_beta);
    if (!(c->adv_clip_max > 0) || !isfinite(c->adv_clip_max))
        return core_error("algorithm.adv_clip_max: must be finite and > 0, got %g", (double)c->adv_clip_max);
    if (!(c->kl_beta >= 0) || !isfinite(c->kl_beta))
        return core_error("algorithm.beta: must be finite and >= 0, got %g", (double)c->kl_beta);
    if (c->micro_batch_size < 1)
        return core_error("algorithm.micro_batch_size: must be >= 1, got %d", c->micro_batch_size);
    return 0;
}

int nft_count_transitions(const nft_step_config *c, const nft_batch *b, int64_t *count) {
    int N;
    if (core_traj_batch_steps(b->traj, b->n, "nft", &N)) return -1;
    return grpo_count_transitions(&c->sel, N, NULL, 0, b->n, count);
}

int nft_count_transitions_experts(const nft_step_config *c, const nft_batch *b, int n_experts, const uint8_t *trained,
                                  int64_t *count) {
    if (n_experts == 1 && !trained) return nft_count_transitions(c, b, count);
    if (n_experts < 1 || n_experts > CORE_TRAJ_MAX_EXPERTS)
        return core_error("nft: %d experts; must be 1 or %d", n_experts, CORE_TRAJ_MAX_EXPERTS);
    int N;
    if (core_traj_batch_steps(b->traj, b->n, "nft", &N)) return -1;
    int64_t total = 0;
    for (int s = 0; s < b->n; s++) {
        int64_t k;
        if (grpo_count_transitions_experts(&c->sel, N, NULL, b->traj[s].expert, 0, 1, trained, n_experts, &k))
            return core_error_push("nft: sample %d (uid %llu): ", s, (unsigned long long)b->traj[s].uid);
        total += k;
    }
    *count = total;
    return 0;
}

/* Expert e's model of an array (NULL array: none). */
static const wan_model *of(const wan_model *const *m, int e) { return m ? m[e] : NULL; }

static int check_batch(wan_model *const *policy, const wan_model *const *old, const wan_model *const *ref,
                       int n_experts, const uint8_t *trained, const wan_exec *ex, const nft_step_config *c,
                       const nft_batch *b, int backward) {
    if (check_config(c)) return -1;
    if (n_experts < 1 || n_experts > CORE_TRAJ_MAX_EXPERTS)
        return core_error("nft: %d experts; must be 1 or %d", n_experts, CORE_TRAJ_MAX_EXPERTS);
    int n_trained = 0;
    for (int e = 0; e < n_experts; e++) {
        const char *sfx = n_experts > 1 ? (e ? " (expert 1, transformer_2)" : " (expert 0, transformer)") : "";
        if (trained && trained[e] > 1)
            return core_error("algorithm.train_experts: trained flag of expert %d is %d; must be 0 or 1", e, trained[e]);
        if (!policy || !policy[e]) return core_error("nft: the policy is needed%s", sfx);
        if (e > 0 && !wan_config_equal(&policy[e]->cfg, &policy[0]->cfg))
            return core_error("nft: the experts' configs differ (expert %d vs expert 0)", e);
        if (trained && !trained[e]) continue;
        n_trained++;
        const wan_model *o = of(old, e), *r = of(ref, e);
        if (!o) return core_error("nft: the policy and the old policy are needed%s", sfx);
        if (!wan_config_equal(&o->cfg, &policy[e]->cfg))
            return core_error("nft: the old policy's config differs from the policy's%s", sfx);
        if (c->kl_beta > 0 && !r) return core_error("nft: algorithm.beta > 0 needs the reference model%s", sfx);
        if (r && !wan_config_equal(&r->cfg, &policy[e]->cfg)) return core_error("nft: the reference model's config differs%s", sfx);
        if (c->kl_beta > 0 && r == policy[e] && !policy[e]->lora)
            return core_error("nft: the reference is the policy itself, which needs a LoRA adapter to switch off%s", sfx);
        if (backward && !(ex && ex->dev) && !trainer_trained_buffer(policy[e]).grads)
            return core_error("nft: gradients not allocated%s", sfx);
    }
    if (n_trained == 0) return core_error("algorithm.train_experts: no expert is trained");
    if (backward && c->acts_mode != WAN_ACTS_STORE && c->acts_mode != WAN_ACTS_RECOMPUTE &&
        !(c->acts_mode == WAN_ACTS_CHECKPOINT && ex && ex->dev))
        return core_error("nft: activation mode must be STORE or RECOMPUTE (or, on a device, CHECKPOINT)");
    if (b->n < 1) return core_error("nft: empty batch");
    if (!b->r) return core_error("nft: no optimality probabilities");
    const core_traj *T = b->traj;
    if (T[0].shape[0] != policy[0]->cfg.in_channels || T[0].shape[0] != policy[0]->cfg.out_channels)
        return core_error("nft: trajectories have %lld channels, the model takes %d and gives %d",
                          (long long)T[0].shape[0], policy[0]->cfg.in_channels, policy[0]->cfg.out_channels);
    for (int s = 0; s < b->n; s++) {
        if (T[s].n_steps != T[0].n_steps || memcmp(T[s].shape, T[0].shape, sizeof T[0].shape))
            return core_error("nft: trajectory %d (uid %llu) differs in steps or shape from trajectory 0", s,
                              (unsigned long long)T[s].uid);
        if (T[s].uid > 0xffffffffull) return core_error("nft: uid %llu over 32 bits", (unsigned long long)T[s].uid);
        if (T[s].condition || T[s].concat)
            return core_error("nft: trajectory %d (uid %llu) is image-conditioned; algorithm.loss nft trains text to "
                              "video only", s, (unsigned long long)T[s].uid);
        for (int i = 0; i < T[s].n_steps; i++)
            if (T[s].expert[i] >= n_experts)
                return core_error("nft: uid %llu step %d uses expert %d but %d expert%s given",
                                  (unsigned long long)T[s].uid, i, T[s].expert[i], n_experts, n_experts > 1 ? "s" : "");
        if (!(b->r[s] >= 0.0f && b->r[s] <= 1.0f))
            return core_error("nft: optimality probability of sample %d is %g; must be in [0, 1]", s, (double)b->r[s]);
    }
    return grpo_selection_validate(&c->sel, T[0].n_steps);
}

/* Scratch of a micro-batch of up to cap transitions. */
typedef struct {
    flow_denoise step;
    float *xt, *vold, *vref, *dv; /* [cap, nl] x 3, [nl] */
} nft_scratch;

static void scratch_free(nft_scratch *w) {
    flow_denoise_free(&w->step);
    free(w->xt), free(w->vold), free(w->vref), free(w->dv);
    memset(w, 0, sizeof *w);
}

static int micro_batch(wan_model *policy, const wan_model *old, const wan_model *ref, const wan_exec *ex,
                       const nft_step_config *c, const nft_batch *b, const nft_tr *tr, int cnt, int64_t denom,
                       int backward, nft_scratch *w, nft_loss_stats *stats) {
    const core_traj *T = b->traj;
    const int N = T[0].n_steps;
    const int64_t nl = core_traj_latent_numel(&T[0]);
    flow_denoise *d = &w->step;
    for (int t = 0; t < cnt; t++) {
        const core_traj *s = &T[tr[t].s];
        const int i = tr[t].i;
        float *xt = w->xt + (int64_t)t * nl;
        if (nft_forward_sample(core_traj_latent(s, N), nl, s->sigmas[i], c->seed, c->update * (uint32_t)N + (uint32_t)i,
                               (uint32_t)s->uid, xt, NULL))
            return core_error_push("nft: sample uid %llu step %d: ", (unsigned long long)s->uid, i);
        d->in[t] = (flow_denoise_sample){xt, NULL, b->cond[tr[t].s], s->timesteps[i], 1.0f}; /* CFG-free */
    }
    const int rows = flow_denoise_build(d, cnt, NULL);
    if (rows < 0) return -1;
    int rc = -1;
    wan_exec_acts *acts = NULL, *iacts = flow_denoise_acts_new(d, ex, rows, WAN_ACTS_INFER);
    if (!iacts) return -1;
    /* the old policy, then the reference (its base when it is the policy under LoRA), without gradient */
    if (flow_denoise_forward(d, old, iacts, ex)) goto done;
    memcpy(w->vold, d->out, sizeof(float) * (size_t)(cnt * nl));
    if (c->kl_beta > 0) {
        wan_exec rex = ex ? *ex : (wan_exec){0};
        rex.lora_off = ref == policy;
        if (flow_denoise_forward(d, ref, iacts, ref == policy ? &rex : ex)) goto done;
        memcpy(w->vref, d->out, sizeof(float) * (size_t)(cnt * nl));
    }
    acts = flow_denoise_acts_new(d, ex, rows, backward ? c->acts_mode : WAN_ACTS_INFER);
    if (!acts || flow_denoise_forward(d, policy, acts, ex)) goto done;
    for (int t = 0; t < cnt; t++) {
        const core_traj *s = &T[tr[t].s];
        const int i = tr[t].i;
        const int64_t o = (int64_t)t * nl;
        const float *v = flow_denoise_velocity(d, t);
        if (nft_loss_terms(nl, s->sigmas[i], core_traj_latent(s, N), w->xt + o, v, w->vold + o,
                           c->kl_beta > 0 ? w->vref + o : NULL, b->r[tr[t].s], c->nft_beta, c->adv_clip_max,
                           c->kl_beta, denom, w->dv, stats)) {
            core_error_push("nft: sample uid %llu step %d: ", (unsigned long long)s->uid, i);
            goto done;
        }
        if (c->probe) c->probe(c->probe_ctx, tr[t].s, i, v, backward ? w->dv : NULL, nl);
        if (backward && flow_denoise_grad(d, t, w->dv)) goto done;
    }
    if (backward && flow_denoise_backward(d, policy, acts, ex)) goto done;
    rc = 0;
done:
    wan_exec_acts_free(iacts);
    wan_exec_acts_free(acts);
    return rc;
}

int nft_accumulate_experts(wan_model *const *policy, const wan_model *const *old, const wan_model *const *ref,
                           int n_experts, const uint8_t *trained, const wan_exec *ex, const nft_step_config *c,
                           const nft_batch *b, int backward, nft_loss_stats *stats) {
    if (check_batch(policy, old, ref, n_experts, trained, ex, c, b, backward)) return -1;
    const int N = b->traj[0].n_steps;
    const int64_t nl = core_traj_latent_numel(&b->traj[0]);
    nft_tr *all = malloc(sizeof(nft_tr) * (size_t)b->n * (size_t)N), *tr = malloc(sizeof(nft_tr) * (size_t)b->n * (size_t)N);
    int *steps = malloc(sizeof(int) * (size_t)N);
    nft_scratch w = {0};
    int rc = -1, total = 0, per[CORE_TRAJ_MAX_EXPERTS] = {0};
    if (!all || !tr || !steps) {
        core_error("nft: out of memory");
        goto done;
    }
    for (int s = 0; s < b->n; s++) {
        const core_traj *T = &b->traj[s];
        int k;
        if (grpo_select_steps_experts(&c->sel, N, NULL, T->expert, trained, n_experts, c->seed, (uint32_t)T->uid, steps,
                                      &k)) {
            core_error_push("nft: sample %d (uid %llu): ", s, (unsigned long long)T->uid);
            goto done;
        }
        for (int j = 0; j < k; j++) all[total++] = (nft_tr){s, steps[j]}, per[T->expert[steps[j]]]++;
    }
    /* grouped by expert (stable: sample by sample, steps ascending within each), so a forward runs one expert */
    int pos = 0;
    for (int e = 0; e < n_experts; e++)
        for (int t = 0; t < total; t++)
            if (b->traj[all[t].s].expert[all[t].i] == e) tr[pos++] = all[t];
    if (total == 0) {
        rc = 0;
        goto done;
    }
    const int64_t denom = b->denom > 0 ? b->denom : total;
    const int cap = c->micro_batch_size < total ? c->micro_batch_size : total;
    const size_t f = sizeof(float);
    if (flow_denoise_init(&w.step, &policy[0]->cfg, b->traj[0].shape, b->text_len, 0, cap, backward)) {
        core_error_push("nft: a micro-batch of %d transitions: ", cap);
        goto done;
    }
    w.xt = malloc(f * (size_t)(cap * nl)), w.vold = malloc(f * (size_t)(cap * nl)), w.dv = malloc(f * (size_t)nl);
    w.vref = c->kl_beta > 0 ? malloc(f * (size_t)(cap * nl)) : NULL;
    if (!w.xt || !w.vold || !w.dv || (c->kl_beta > 0 && !w.vref)) {
        core_error("nft: out of memory for a micro-batch of %d transitions", cap);
        goto done;
    }
    for (int e = 0, g0 = 0; e < n_experts; g0 += per[e], e++)
        for (int t0 = g0; t0 < g0 + per[e]; t0 += cap) {
            const int cnt = g0 + per[e] - t0 < cap ? g0 + per[e] - t0 : cap;
            if (micro_batch(policy[e], of(old, e), of(ref, e), ex, c, b, tr + t0, cnt, denom, backward, &w, stats))
                goto done;
        }
    rc = 0;
done:
    scratch_free(&w);
    free(all), free(tr), free(steps);
    return rc;
}

int nft_accumulate(wan_model *policy, const wan_model *old, const wan_model *ref, const wan_exec *ex,
                   const nft_step_config *c, const nft_batch *b, int backward, nft_loss_stats *stats) {
    wan_model *p[1] = {policy};
    const wan_model *o[1] = {old}, *r[1] = {ref};
    return nft_accumulate_experts(p, o, r, 1, NULL, ex, c, b, backward, stats);
}
