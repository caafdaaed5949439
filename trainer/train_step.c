/* trainer/train_step.c — GRPO loss and gradient of a batch of trajectories on the Wan DiT (see train_step.h). */
#include "trainer/train_step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/flow.h"
#include "model/guidance.h"

typedef struct {
    int s, i; /* sample, step */
} transition;

/* Scratch of one micro-batch of up to cap transitions (rows <= 2 cap). */
typedef struct {
    float *x, *ts, *enc, *vout, *vref, *dout; /* [rows, nl], [rows], [rows, ne], [rows, nl] x3 */
    float *mean, *mean_ref;                   /* [cap, nl] */
    float *v, *dv;                            /* [nl] */
    float *logp_new, *logp_old, *adv, *kl, *dlogp, *dkl; /* [cap] */
    uint8_t *mask;                            /* [cap] */
    int *urow;                                /* [cap]: row of the unconditional forward, or -1 */
    flow_step *st;                            /* [cap] */
} scratch;

static void scratch_free(scratch *w) {
    free(w->x), free(w->ts), free(w->enc), free(w->vout), free(w->vref), free(w->dout), free(w->mean);
    free(w->mean_ref), free(w->v), free(w->dv), free(w->logp_new), free(w->logp_old), free(w->adv), free(w->kl);
    free(w->dlogp), free(w->dkl), free(w->mask), free(w->urow), free(w->st);
    memset(w, 0, sizeof *w);
}

static int scratch_alloc(scratch *w, int cap, int64_t nl, int64_t ne) {
    memset(w, 0, sizeof *w);
    const size_t rows = 2 * (size_t)cap, f = sizeof(float);
    w->x = malloc(f * rows * nl), w->ts = malloc(f * rows), w->enc = calloc(rows * ne, f);
    w->vout = malloc(f * rows * nl), w->vref = malloc(f * rows * nl), w->dout = malloc(f * rows * nl);
    w->mean = malloc(f * cap * nl), w->mean_ref = malloc(f * cap * nl), w->v = malloc(f * nl), w->dv = malloc(f * nl);
    w->logp_new = malloc(f * cap), w->logp_old = malloc(f * cap), w->adv = malloc(f * cap), w->kl = malloc(f * cap);
    w->dlogp = malloc(f * cap), w->dkl = malloc(f * cap), w->mask = malloc(cap), w->urow = malloc(sizeof(int) * cap);
    w->st = malloc(sizeof(flow_step) * cap);
    if (!w->x || !w->ts || !w->enc || !w->vout || !w->vref || !w->dout || !w->mean || !w->mean_ref || !w->v ||
        !w->dv || !w->logp_new || !w->logp_old || !w->adv || !w->kl || !w->dlogp || !w->dkl || !w->mask || !w->urow ||
        !w->st) {
        scratch_free(w);
        return core_error("trainer: out of memory for a micro-batch of %d transitions", cap);
    }
    return 0;
}

/* Velocity of transition t from a forward's output rows (guided when its sample's g != 1). */
static const float *guided(const scratch *w, const float *out, int t, float g, int64_t nl) {
    if (w->urow[t] < 0) return out + (int64_t)t * nl;
    flow_cfg_combine(w->v, out + (int64_t)t * nl, out + (int64_t)w->urow[t] * nl, g, nl);
    return w->v;
}

static int micro_batch(wan_model *policy, const wan_model *ref, const wan_exec *ex, const trainer_config *tc,
                       const trainer_batch *b, const transition *tr, int cnt, int64_t denom, int backward, scratch *w,
                       grpo_loss_stats *stats) {
    const core_traj *T = b->traj;
    const int64_t nl = core_traj_latent_numel(&T[0]), ne = (int64_t)b->text_len * policy->cfg.text_dim;
    int rows = cnt;
    for (int t = 0; t < cnt; t++) w->urow[t] = flow_cfg_active(T[tr[t].s].guidance_scale) ? rows++ : -1;
    for (int t = 0; t < cnt; t++) {
        const core_traj *s = &T[tr[t].s];
        const int i = tr[t].i;
        memcpy(w->x + (int64_t)t * nl, core_traj_latent(s, i), sizeof(float) * nl);
        memcpy(w->enc + (int64_t)t * ne, b->cond[tr[t].s], sizeof(float) * ne);
        w->ts[t] = s->timesteps[i];
        if (w->urow[t] >= 0) {
            const int u = w->urow[t];
            memcpy(w->x + (int64_t)u * nl, core_traj_latent(s, i), sizeof(float) * nl);
            if (b->neg) memcpy(w->enc + (int64_t)u * ne, b->neg, sizeof(float) * ne);
            else memset(w->enc + (int64_t)u * ne, 0, sizeof(float) * ne);
            w->ts[u] = s->timesteps[i];
        }
    }
    wan_shape sh = {.B = rows, .F = (int)T[0].shape[1], .H = (int)T[0].shape[2], .W = (int)T[0].shape[3], .L = b->text_len};
    wan_acts *acts = wan_acts_new(&policy->cfg, &sh, backward ? tc->acts_mode : WAN_ACTS_INFER), *racts = NULL;
    if (!acts) return -1;
    int rc = -1;
    if (wan_forward(policy, acts, ex, w->vout, w->x, w->ts, w->enc)) goto done;
    for (int t = 0; t < cnt; t++) {
        const core_traj *s = &T[tr[t].s];
        const int i = tr[t].i;
        const float *v = guided(w, w->vout, t, s->guidance_scale, nl);
        if (flow_sde_step(core_traj_latent(s, i), v, NULL, core_traj_latent(s, i + 1), nl, s->sigmas[i], s->sigmas[i + 1],
                          s->sigmas[1], s->eta, w->mean + (int64_t)t * nl, NULL, &w->st[t]))
            goto done;
        if (!w->st[t].has_logp) {
            core_error("trainer: sample uid %llu step %d has no log-prob (std 0) but was selected", (unsigned long long)s->uid, i);
            goto done;
        }
        w->logp_new[t] = w->st[t].logp;
        w->logp_old[t] = s->log_probs[i];
        w->adv[t] = b->adv[tr[t].s];
        w->mask[t] = b->mask[tr[t].s];
    }
    if (tc->beta > 0) {
        if (!(racts = wan_acts_new(&ref->cfg, &sh, WAN_ACTS_INFER))) goto done;
        if (wan_forward(ref, racts, ex, w->vref, w->x, w->ts, w->enc)) goto done;
        for (int t = 0; t < cnt; t++) {
            const core_traj *s = &T[tr[t].s];
            const int i = tr[t].i;
            const float *v = guided(w, w->vref, t, s->guidance_scale, nl);
            flow_step sr;
            float *mr = w->mean_ref + (int64_t)t * nl;
            if (flow_sde_step(core_traj_latent(s, i), v, NULL, NULL, nl, s->sigmas[i], s->sigmas[i + 1], s->sigmas[1],
                              s->eta, mr, NULL, &sr) ||
                flow_kl(w->mean + (int64_t)t * nl, mr, nl, w->st[t].step_std, &w->kl[t]))
                goto done;
        }
    }
    if (grpo_loss_terms(cnt, w->logp_new, w->logp_old, w->adv, w->mask, tc->beta > 0 ? w->kl : NULL, tc->clip_eps,
                        tc->beta, denom, w->dlogp, w->dkl, stats))
        goto done;
    if (backward) {
        for (int t = 0; t < cnt; t++) {
            const core_traj *s = &T[tr[t].s];
            const float gkl = tc->beta > 0 ? w->dkl[t] : 0.0f;
            if (flow_sde_backward_v(&w->st[t], w->mean + (int64_t)t * nl, core_traj_latent(s, tr[t].i + 1),
                                    tc->beta > 0 ? w->mean_ref + (int64_t)t * nl : NULL, nl, w->dlogp[t], gkl, w->dv))
                goto done;
            if (w->urow[t] >= 0)
                flow_cfg_backward(w->dout + (int64_t)t * nl, w->dout + (int64_t)w->urow[t] * nl, w->dv, s->guidance_scale, nl);
            else
                memcpy(w->dout + (int64_t)t * nl, w->dv, sizeof(float) * nl);
        }
        if (wan_backward(policy, acts, ex, NULL, NULL, w->dout)) goto done;
    }
    rc = 0;
done:
    wan_acts_free(acts);
    wan_acts_free(racts);
    return rc;
}

static int check_batch(const wan_model *policy, const wan_model *ref, const trainer_config *tc, const trainer_batch *b,
                       int backward) {
    if (b->n < 1) return core_error("trainer: empty batch");
    if (!(tc->clip_eps > 0)) return core_error("algorithm.clip_range: must be > 0, got %g", (double)tc->clip_eps);
    if (!(tc->beta >= 0) || !isfinite(tc->beta)) return core_error("algorithm.beta: must be >= 0, got %g", (double)tc->beta);
    if (tc->micro_batch_size < 1) return core_error("algorithm.micro_batch_size: must be >= 1, got %d", tc->micro_batch_size);
    if (tc->beta > 0 && !ref) return core_error("trainer: beta > 0 needs the reference model");
    if (ref && !wan_config_equal(&ref->cfg, &policy->cfg)) return core_error("trainer: reference model config differs");
    if (backward && !policy->grads) return core_error("trainer: gradients not allocated");
    if (backward && tc->acts_mode != WAN_ACTS_STORE && tc->acts_mode != WAN_ACTS_RECOMPUTE)
        return core_error("trainer: activation mode must be STORE or RECOMPUTE");
    const core_traj *T = b->traj;
    if (T[0].shape[0] != policy->cfg.in_channels)
        return core_error("trainer: trajectories have %lld channels, the model %d", (long long)T[0].shape[0],
                          policy->cfg.in_channels);
    for (int s = 0; s < b->n; s++) {
        if (T[s].n_steps != T[0].n_steps || memcmp(T[s].shape, T[0].shape, sizeof T[0].shape))
            return core_error("trainer: trajectory %d (uid %llu) differs in steps or shape from trajectory 0", s,
                              (unsigned long long)T[s].uid);
        if (T[s].uid > 0xffffffffull) return core_error("trainer: uid %llu over 32 bits", (unsigned long long)T[s].uid);
        for (int i = 0; i < T[s].n_steps; i++)
            if (T[s].expert[i] != 0)
                return core_error("trainer: uid %llu step %d uses expert %d; two-expert training is not supported yet",
                                  (unsigned long long)T[s].uid, i, T[s].expert[i]);
    }
    return grpo_selection_validate(&tc->sel, T[0].n_steps);
}

int trainer_accumulate(wan_model *policy, const wan_model *ref, const wan_exec *ex, const trainer_config *tc,
                       const trainer_batch *b, int backward, grpo_loss_stats *stats) {
    if (check_batch(policy, ref, tc, b, backward)) return -1;
    const int N = b->traj[0].n_steps;
    transition *tr = malloc(sizeof(transition) * (size_t)b->n * (size_t)N);
    int *steps = malloc(sizeof(int) * (size_t)N);
    scratch w = {0};
    int rc = -1, total = 0;
    if (!tr || !steps) {
        core_error("trainer: out of memory");
        goto done;
    }
    for (int s = 0; s < b->n; s++) {
        int k;
        if (grpo_select_steps(&tc->sel, N, b->traj[s].has_log_prob, tc->seed, (uint32_t)b->traj[s].uid, steps, &k))
            goto done;
        for (int j = 0; j < k; j++) tr[total++] = (transition){s, steps[j]};
    }
    const int64_t denom = b->denom > 0 ? b->denom : total;
    const int cap = tc->micro_batch_size < total ? tc->micro_batch_size : total;
    if (total == 0) {
        rc = 0;
        goto done;
    }
    if (scratch_alloc(&w, cap, core_traj_latent_numel(&b->traj[0]), (int64_t)b->text_len * policy->cfg.text_dim)) goto done;
    for (int t0 = 0; t0 < total; t0 += cap) {
        int cnt = total - t0 < cap ? total - t0 : cap;
        if (micro_batch(policy, ref, ex, tc, b, tr + t0, cnt, denom, backward, &w, stats)) goto done;
    }
    rc = 0;
done:
    scratch_free(&w);
    free(tr), free(steps);
    return rc;
}

int trainer_update(wan_model *policy, const wan_model *ref, const wan_exec *ex, const trainer_config *tc,
                   const trainer_batch *b, optim_adamw *opt, const optim_config *ocfg, grpo_loss_stats *stats,
                   optim_step_info *info) {
    if (!policy->grads) return core_error("trainer: gradients not allocated");
    if (opt->n != policy->layout.numel) return core_error("trainer: optimizer has %lld parameters, the model %lld",
                                                          (long long)opt->n, (long long)policy->layout.numel);
    wan_model_zero_grads(policy);
    grpo_loss_stats local = {0};
    if (trainer_accumulate(policy, ref, ex, tc, b, 1, stats ? stats : &local)) return -1;
    return optim_adamw_step(opt, ocfg, policy->params, policy->grads, NULL, info);
}
