/* trainer/step/dpo_step.c — online Flow-DPO's training pass on the Wan DiT (see dpo_step.h). */
#include "trainer/step/dpo_step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/flow/denoise.h"
#include "trainer/optim/lora.h"

typedef struct {
    int p, i; /* pair, step */
} dpo_term;

static int check_config(const dpo_step_config *c) {
    if (!(c->dpo_beta > 0) || !isfinite(c->dpo_beta))
        return core_error("algorithm.dpo_beta: must be finite and > 0, got %g", (double)c->dpo_beta);
    if (c->micro_batch_size < 1)
        return core_error("algorithm.micro_batch_size: must be >= 1, got %d", c->micro_batch_size);
    return 0;
}

/* Pair indices in range and distinct, both trajectories on one schedule. */
static int check_pairs(const dpo_batch *b) {
    if (b->n_pairs < 0 || (b->n_pairs > 0 && !b->pairs)) return core_error("dpo: no pairs given");
    for (int p = 0; p < b->n_pairs; p++) {
        const int w = b->pairs[p].w, l = b->pairs[p].l;
        if (w < 0 || w >= b->n || l < 0 || l >= b->n || w == l)
            return core_error("dpo: pair %d is (%d, %d); its indices must be distinct trajectories of 0 .. %d", p, w,
                              l, b->n - 1);
        const core_traj *tw = &b->traj[w], *tl = &b->traj[l];
        if (memcmp(tw->sigmas, tl->sigmas, sizeof(float) * (size_t)(tw->n_steps + 1)) != 0 ||
            memcmp(tw->timesteps, tl->timesteps, sizeof(float) * (size_t)tw->n_steps) != 0)
            return core_error("dpo: pair %d: uid %llu and uid %llu were sampled on different schedules", p,
                              (unsigned long long)tw->uid, (unsigned long long)tl->uid);
    }
    return 0;
}

int dpo_count_terms(const dpo_step_config *c, const dpo_batch *b, int64_t *count) {
    *count = 0;
    int N;
    if (core_traj_batch_steps(b->traj, b->n, "dpo", &N)) return -1;
    if (b->n_pairs < 0 || (b->n_pairs > 0 && !b->pairs)) return core_error("dpo: no pairs given");
    for (int p = 0; p < b->n_pairs; p++)
        if (b->pairs[p].w < 0 || b->pairs[p].w >= b->n || b->pairs[p].l < 0 || b->pairs[p].l >= b->n)
            return core_error("dpo: pair %d is (%d, %d), out of 0 .. %d", p, b->pairs[p].w, b->pairs[p].l, b->n - 1);
    /* every step a candidate: the count of grpo_select_steps is the same for every pair */
    int64_t per = 0;
    if (grpo_count_transitions(&c->sel, N, NULL, 0, 1, &per)) return -1;
    *count = per * b->n_pairs;
    return 0;
}

static int check_batch(const wan_model *policy, const wan_model *ref, const wan_exec *ex, const dpo_step_config *c,
                       const dpo_batch *b, int backward) {
    if (check_config(c)) return -1;
    if (!policy || !ref) return core_error("dpo: the policy and the reference model are needed");
    if (!wan_config_equal(&ref->cfg, &policy->cfg)) return core_error("dpo: the reference model's config differs");
    if (ref == policy && !policy->lora)
        return core_error("dpo: the reference is the policy itself, which needs a LoRA adapter to switch off");
    if (backward && !(ex && ex->dev) && !trainer_trained_buffer((wan_model *)policy).grads)
        return core_error("dpo: gradients not allocated");
    if (backward && c->acts_mode != WAN_ACTS_STORE && c->acts_mode != WAN_ACTS_RECOMPUTE &&
        !(c->acts_mode == WAN_ACTS_CHECKPOINT && ex && ex->dev))
        return core_error("dpo: activation mode must be STORE or RECOMPUTE (or, on a device, CHECKPOINT)");
    if (b->n < 1) return core_error("dpo: empty batch");
    const core_traj *T = b->traj;
    if (T[0].shape[0] != policy->cfg.in_channels || T[0].shape[0] != policy->cfg.out_channels)
        return core_error("dpo: trajectories have %lld channels, the model takes %d and gives %d",
                          (long long)T[0].shape[0], policy->cfg.in_channels, policy->cfg.out_channels);
    for (int s = 0; s < b->n; s++) {
        if (T[s].n_steps != T[0].n_steps || memcmp(T[s].shape, T[0].shape, sizeof T[0].shape))
            return core_error("dpo: trajectory %d (uid %llu) differs in steps or shape from trajectory 0", s,
                              (unsigned long long)T[s].uid);
        if (T[s].uid > 0xffffffffull) return core_error("dpo: uid %llu over 32 bits", (unsigned long long)T[s].uid);
        if (T[s].condition || T[s].concat)
            return core_error("dpo: trajectory %d (uid %llu) is image-conditioned; algorithm.loss dpo trains text to "
                              "video only", s, (unsigned long long)T[s].uid);
        for (int i = 0; i < T[s].n_steps; i++)
            if (T[s].expert[i] != 0)
                return core_error("dpo: uid %llu step %d uses expert %d; algorithm.loss dpo trains one expert",
                                  (unsigned long long)T[s].uid, i, T[s].expert[i]);
    }
    if (check_pairs(b)) return -1;
    return grpo_selection_validate(&c->sel, T[0].n_steps);
}

/* Scratch of a micro-batch of up to cap terms (2 cap rows). */
typedef struct {
    flow_denoise step;
    float *xt, *eps, *vref, *dvw, *dvl; /* [2 cap, nl], [cap, nl], [2 cap, nl], [nl], [nl] */
} dpo_scratch;

static void scratch_free(dpo_scratch *w) {
    flow_denoise_free(&w->step);
    free(w->xt), free(w->eps), free(w->vref), free(w->dvw), free(w->dvl);
    memset(w, 0, sizeof *w);
}

static int micro_batch(wan_model *policy, const wan_model *ref, const wan_exec *ex, const dpo_step_config *c,
                       const dpo_batch *b, const dpo_term *tr, int cnt, int64_t denom, int backward, dpo_scratch *w,
                       dpo_loss_stats *stats) {
    const core_traj *T = b->traj;
    const int N = T[0].n_steps;
    const int64_t nl = core_traj_latent_numel(&T[0]);
    flow_denoise *d = &w->step;
    for (int t = 0; t < cnt; t++) {
        const dpo_pair *pr = &b->pairs[tr[t].p];
        const core_traj *sw = &T[pr->w], *sl = &T[pr->l];
        const int i = tr[t].i;
        float *xw = w->xt + (int64_t)(2 * t) * nl, *xl = xw + nl;
        if (dpo_forward_pair(core_traj_latent(sw, N), core_traj_latent(sl, N), nl, sw->sigmas[i], c->seed,
                             c->update * (uint32_t)N + (uint32_t)i, (uint32_t)sw->uid, (uint32_t)sl->uid, xw, xl,
                             w->eps + (int64_t)t * nl))
            return core_error_push("dpo: pair uid %llu over uid %llu step %d: ", (unsigned long long)sw->uid,
                                   (unsigned long long)sl->uid, i);
        /* CFG-free: guidance 1, no unconditional row */
        d->in[2 * t] = (flow_denoise_sample){xw, NULL, b->cond[pr->w], sw->timesteps[i], 1.0f};
        d->in[2 * t + 1] = (flow_denoise_sample){xl, NULL, b->cond[pr->l], sl->timesteps[i], 1.0f};
    }
    const int rows = flow_denoise_build(d, 2 * cnt, NULL);
    if (rows < 0) return -1;
    int rc = -1;
    wan_exec_acts *acts = NULL, *iacts = flow_denoise_acts_new(d, ex, rows, WAN_ACTS_INFER);
    if (!iacts) return -1;
    /* the reference (its base when it is the policy under LoRA), without gradient */
    wan_exec rex = ex ? *ex : (wan_exec){0};
    rex.lora_off = ref == policy;
    if (flow_denoise_forward(d, ref, iacts, ref == policy ? &rex : ex)) goto done;
    memcpy(w->vref, d->out, sizeof(float) * (size_t)(2 * cnt * nl));
    acts = flow_denoise_acts_new(d, ex, rows, backward ? c->acts_mode : WAN_ACTS_INFER);
    if (!acts || flow_denoise_forward(d, policy, acts, ex)) goto done;
    for (int t = 0; t < cnt; t++) {
        const dpo_pair *pr = &b->pairs[tr[t].p];
        const core_traj *sw = &T[pr->w], *sl = &T[pr->l];
        const int i = tr[t].i;
        const int64_t o = (int64_t)(2 * t) * nl;
        const float *vw = flow_denoise_velocity(d, 2 * t), *vl = flow_denoise_velocity(d, 2 * t + 1);
        if (dpo_loss_terms(nl, w->eps + (int64_t)t * nl, core_traj_latent(sw, N), core_traj_latent(sl, N), vw, vl,
                           w->vref + o, w->vref + o + nl, c->dpo_beta, denom, w->dvw, w->dvl, stats)) {
            core_error_push("dpo: pair uid %llu over uid %llu step %d: ", (unsigned long long)sw->uid,
                            (unsigned long long)sl->uid, i);
            goto done;
        }
        if (c->probe) c->probe(c->probe_ctx, tr[t].p, i, vw, vl, backward ? w->dvw : NULL, backward ? w->dvl : NULL, nl);
        if (backward && (flow_denoise_grad(d, 2 * t, w->dvw) || flow_denoise_grad(d, 2 * t + 1, w->dvl))) goto done;
    }
    if (backward && flow_denoise_backward(d, policy, acts, ex)) goto done;
    rc = 0;
done:
    wan_exec_acts_free(iacts);
    wan_exec_acts_free(acts);
    return rc;
}

int dpo_accumulate(wan_model *policy, const wan_model *ref, const wan_exec *ex, const dpo_step_config *c,
                   const dpo_batch *b, int backward, dpo_loss_stats *stats) {
    if (check_batch(policy, ref, ex, c, b, backward)) return -1;
    const int N = b->traj[0].n_steps;
    const int64_t nl = core_traj_latent_numel(&b->traj[0]);
    dpo_term *tr = malloc(sizeof(dpo_term) * ((size_t)b->n_pairs * (size_t)N + 1));
    int *steps = malloc(sizeof(int) * (size_t)N);
    dpo_scratch w = {0};
    int rc = -1, total = 0;
    if (!tr || !steps) {
        core_error("dpo: out of memory");
        goto done;
    }
    for (int p = 0; p < b->n_pairs; p++) {
        const core_traj *sw = &b->traj[b->pairs[p].w];
        int k;
        if (grpo_select_steps(&c->sel, N, NULL, c->seed, (uint32_t)sw->uid, steps, &k)) {
            core_error_push("dpo: pair %d (preferred uid %llu): ", p, (unsigned long long)sw->uid);
            goto done;
        }
        for (int j = 0; j < k; j++) tr[total++] = (dpo_term){p, steps[j]};
    }
    if (total == 0) {
        rc = 0;
        goto done;
    }
    const int64_t denom = b->denom > 0 ? b->denom : total;
    const int cap = c->micro_batch_size < total ? c->micro_batch_size : total;
    const size_t f = sizeof(float);
    if (flow_denoise_init(&w.step, &policy->cfg, b->traj[0].shape, b->text_len, 0, 2 * cap, backward)) {
        core_error_push("dpo: a micro-batch of %d terms: ", cap);
        goto done;
    }
    w.xt = malloc(f * (size_t)(2 * cap * nl)), w.vref = malloc(f * (size_t)(2 * cap * nl));
    w.eps = malloc(f * (size_t)(cap * nl)), w.dvw = malloc(f * (size_t)nl), w.dvl = malloc(f * (size_t)nl);
    if (!w.xt || !w.vref || !w.eps || !w.dvw || !w.dvl) {
        core_error("dpo: out of memory for a micro-batch of %d terms", cap);
        goto done;
    }
    for (int t0 = 0; t0 < total; t0 += cap) {
        const int cnt = total - t0 < cap ? total - t0 : cap;
        if (micro_batch(policy, ref, ex, c, b, tr + t0, cnt, denom, backward, &w, stats)) goto done;
    }
    rc = 0;
done:
    scratch_free(&w);
    free(tr), free(steps);
    return rc;
}
