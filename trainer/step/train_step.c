/* trainer/step/train_step.c — GRPO loss and gradient of a batch of trajectories on the Wan DiT (see train_step.h). */
#include "trainer/step/train_step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/dit/wan_executor.h"
#include "model/flow/denoise.h"
#include "model/flow/first_frame.h"
#include "model/flow/flow.h"
#include "trainer/optim/lora.h"

typedef struct {
    int s, i, e; /* sample, step, expert (the trajectory's record) */
    float g;     /* the step's guidance: guidance_scale (expert 0) or guidance_scale_2 (expert 1) */
} transition;

/* Scratch of one micro-batch of up to cap transitions (the DiT's rows, up to 2 cap, are step's). */
typedef struct {
    flow_denoise step;                        /* the rows, the forward's velocities and their gradient */
    float *mean, *mean_ref;                   /* [cap, nl] */
    float *dv;                                /* [nl] */
    float *gx, *gv, *gn;                      /* [nl]: a conditioned step's generated elements (first_frame.h) */
    float *logp_new, *logp_old, *adv, *kl, *dlogp, *dkl; /* [cap] */
    float *bias, *sstd, *dt, *dbias;          /* [cap]: GRPO-Guard's mean bias, step std, dt and d loss / d bias */
    uint8_t *mask;                            /* [cap] */
    flow_step *st;                            /* [cap] */
} scratch;

static void scratch_free(scratch *w) {
    flow_denoise_free(&w->step);
    free(w->mean), free(w->mean_ref), free(w->dv), free(w->logp_new), free(w->logp_old), free(w->adv), free(w->kl);
    free(w->dlogp), free(w->dkl), free(w->mask), free(w->st);
    free(w->bias), free(w->sstd), free(w->dt), free(w->dbias), free(w->gx), free(w->gv), free(w->gn);
    memset(w, 0, sizeof *w);
}

/* T0: the batch's first trajectory (its latent shape; a first-frame condition: per-token timesteps and the
 * gathering buffers). */
static int scratch_alloc(scratch *w, int cap, const wan_config *cfg, const core_traj *T0, int text_len) {
    memset(w, 0, sizeof *w);
    const size_t f = sizeof(float);
    const int i2v = T0->condition != NULL;
    const int64_t nl = core_traj_latent_numel(T0);
    if (flow_denoise_init(&w->step, cfg, T0->shape, text_len, i2v, cap, 1))
        return core_error_push("trainer: a micro-batch of %d transitions: ", cap);
    if (i2v && (!(w->gx = malloc(f * nl)) || !(w->gv = malloc(f * nl)) || !(w->gn = malloc(f * nl)))) {
        scratch_free(w);
        return core_error("trainer: out of memory for a micro-batch of %d transitions", cap);
    }
    w->mean = malloc(f * cap * nl), w->mean_ref = malloc(f * cap * nl), w->dv = malloc(f * nl);
    w->logp_new = malloc(f * cap), w->logp_old = malloc(f * cap), w->adv = malloc(f * cap), w->kl = malloc(f * cap);
    w->dlogp = malloc(f * cap), w->dkl = malloc(f * cap), w->mask = malloc(cap);
    w->st = malloc(sizeof(flow_step) * cap);
    w->bias = malloc(f * cap), w->sstd = malloc(f * cap), w->dt = malloc(f * cap), w->dbias = malloc(f * cap);
    if (!w->bias || !w->sstd || !w->dt || !w->dbias || !w->mean || !w->mean_ref || !w->dv || !w->logp_new ||
        !w->logp_old || !w->adv || !w->kl || !w->dlogp || !w->dkl || !w->mask || !w->st) {
        scratch_free(w);
        return core_error("trainer: out of memory for a micro-batch of %d transitions", cap);
    }
    return 0;
}

static int micro_batch(wan_model *policy, const wan_model *ref, const wan_exec *ex, const trainer_config *tc,
                       const trainer_batch *b, const transition *tr, int cnt, int64_t denom, int backward, scratch *w,
                       grpo_loss_stats *stats) {
    const core_traj *T = b->traj;
    const int64_t nl = core_traj_latent_numel(&T[0]);
    /* The rows (model/flow/denoise.h) as the rollout built them: TI2V's per-token timesteps (every trajectory carries
     * its first-frame condition: check_batch; the step, KL and bias then run over the generated elements,
     * model/flow/first_frame.h), I2V-A14B's input cat(latent, the trajectory's condition), the unconditional rows. */
    flow_denoise *d = &w->step;
    for (int t = 0; t < cnt; t++) {
        const core_traj *s = &T[tr[t].s];
        d->in[t] = (flow_denoise_sample){core_traj_latent(s, tr[t].i), s->concat, b->cond[tr[t].s],
                                         s->timesteps[tr[t].i], tr[t].g};
    }
    const int rows = flow_denoise_build(d, cnt, b->neg);
    if (rows < 0) return -1;
    /* The activations ex runs on (wan_exec_acts_new): under sequence parallelism (ex->sp of more than one rank) this
     * rank's token slice, the output being the full gathered velocity on every SP rank; on a device (ex->dev,
     * model/dit/wan_dev_exec.h) the forward and backward run there and the velocity comes back in fp32, so
     * everything between them (flow step, log-prob, KL, loss, dv) is the host code below, as on the CPU. */
    const wan_acts_mode mode = backward ? tc->acts_mode : WAN_ACTS_INFER;
    wan_exec_acts *acts = flow_denoise_acts_new(d, ex, rows, mode), *racts = NULL;
    if (!acts) return -1;
    int rc = -1;
    if (flow_denoise_forward(d, policy, acts, ex)) goto done;
    for (int t = 0; t < cnt; t++) {
        const core_traj *s = &T[tr[t].s];
        const int i = tr[t].i;
        const float *v = flow_denoise_velocity(d, t);
        const flow_ff ff = flow_ff_make(s->shape, s->condition);
        const int64_t ng = flow_ff_generated(&ff); /* w->mean[t] holds the generated elements (all without an image) */
        if (flow_sde_step_kind(tc->kind, flow_ff_view(&ff, core_traj_latent(s, i), w->gx), flow_ff_view(&ff, v, w->gv),
                               NULL, flow_ff_view(&ff, core_traj_latent(s, i + 1), w->gn), ng, s->sigmas[i],
                               s->sigmas[i + 1], s->sigmas[1], s->eta, w->mean + (int64_t)t * nl, NULL, &w->st[t]))
            goto done;
        if (!w->st[t].has_logp) {
            core_error("trainer: sample uid %llu step %d has no log-prob (std 0) but was selected", (unsigned long long)s->uid, i);
            goto done;
        }
        w->logp_new[t] = w->st[t].logp;
        if (tc->probe) tc->probe(tc->probe_ctx, tr[t].s, i, v, nl, w->logp_new[t]);
        w->logp_old[t] = s->log_probs[i];
        w->adv[t] = b->adv[tr[t].s];
        w->mask[t] = b->mask[tr[t].s];
        if (tc->guard) { /* GRPO-Guard: the bias of this mean against the rollout's (the trajectory's step mean) */
            const float *mo = core_traj_mean(s, i);
            if (!mo) {
                core_error("algorithm.loss grpo_guard: sample uid %llu has no rollout mean of step %d (the rollout "
                           "did not record step means)", (unsigned long long)s->uid, i);
                goto done;
            }
            if (flow_kl(w->mean + (int64_t)t * nl, flow_ff_view(&ff, mo, w->gx), ng, w->st[t].step_std, &w->bias[t]))
                goto done;
            w->sstd[t] = w->st[t].step_std, w->dt[t] = w->st[t].dt;
        }
    }
    if (tc->beta > 0) {
        /* the reference is the policy itself under LoRA: its base, the adapter switched off for this forward */
        wan_exec rex = ex ? *ex : (wan_exec){0};
        rex.lora_off = ref == policy;
        if (!(racts = flow_denoise_acts_new(d, ex, rows, WAN_ACTS_INFER)) ||
            flow_denoise_forward(d, ref, racts, ref == policy ? &rex : ex)) /* the policy's velocities: used */
            goto done;
        for (int t = 0; t < cnt; t++) {
            const core_traj *s = &T[tr[t].s];
            const int i = tr[t].i;
            const float *v = flow_denoise_velocity(d, t);
            const flow_ff ff = flow_ff_make(s->shape, s->condition);
            const int64_t ng = flow_ff_generated(&ff);
            flow_step sr;
            float *mr = w->mean_ref + (int64_t)t * nl;
            if (flow_sde_step_kind(tc->kind, flow_ff_view(&ff, core_traj_latent(s, i), w->gx),
                                   flow_ff_view(&ff, v, w->gv), NULL, NULL, ng, s->sigmas[i], s->sigmas[i + 1],
                                   s->sigmas[1], s->eta, mr, NULL, &sr) ||
                flow_kl(w->mean + (int64_t)t * nl, mr, ng, w->st[t].step_std, &w->kl[t]))
                goto done;
        }
    }
    if (tc->guard ? grpo_guard_loss_terms(cnt, w->logp_new, w->logp_old, w->bias, w->sstd, w->dt, w->adv, w->mask,
                                          tc->beta > 0 ? w->kl : NULL, tc->clip_eps, tc->beta, denom, w->dlogp,
                                          w->dbias, w->dkl, stats)
                  : grpo_loss_terms(cnt, w->logp_new, w->logp_old, w->adv, w->mask, tc->beta > 0 ? w->kl : NULL,
                                    tc->clip_eps, tc->beta, denom, w->dlogp, w->dkl, stats))
        goto done;
    if (backward) {
        for (int t = 0; t < cnt; t++) {
            const core_traj *s = &T[tr[t].s];
            const float gkl = tc->beta > 0 ? w->dkl[t] : 0.0f;
            const flow_ff ff = flow_ff_make(s->shape, s->condition);
            const float *mo = tc->guard ? core_traj_mean(s, tr[t].i) : NULL;
            /* conditioned: dv of the generated elements into gv, then frame 0's velocity gets no gradient */
            if (flow_sde_backward_v_guard(&w->st[t], w->mean + (int64_t)t * nl,
                                          flow_ff_view(&ff, core_traj_latent(s, tr[t].i + 1), w->gn),
                                          tc->beta > 0 ? w->mean_ref + (int64_t)t * nl : NULL,
                                          mo ? flow_ff_view(&ff, mo, w->gx) : NULL, flow_ff_generated(&ff), w->dlogp[t],
                                          gkl, tc->guard ? w->dbias[t] : 0.0f, ff.cond ? w->gv : w->dv))
                goto done;
            if (ff.cond) flow_ff_scatter_grad(&ff, w->gv, w->dv);
            if (flow_denoise_grad(d, t, w->dv)) goto done;
        }
        if (flow_denoise_backward(d, policy, acts, ex)) goto done;
    }
    rc = 0;
done:
    wan_exec_acts_free(acts);
    wan_exec_acts_free(racts);
    return rc;
}

/* Expert e's reference, or NULL. */
static const wan_model *ref_of(const wan_model *const *ref, int e) { return ref ? ref[e] : NULL; }

static int check_batch(wan_model *const *policy, const wan_model *const *ref, int n_experts, const uint8_t *trained,
                       const wan_exec *ex, const trainer_config *tc, const trainer_batch *b, int backward) {
    if (n_experts < 1 || n_experts > CORE_TRAJ_MAX_EXPERTS)
        return core_error("trainer: %d experts; must be 1 or %d", n_experts, CORE_TRAJ_MAX_EXPERTS);
    if (b->n < 1) return core_error("trainer: empty batch");
    if (!(tc->clip_eps > 0)) return core_error("algorithm.clip_range: must be > 0, got %g", (double)tc->clip_eps);
    if (!(tc->beta >= 0) || !isfinite(tc->beta)) return core_error("algorithm.beta: must be >= 0, got %g", (double)tc->beta);
    if (tc->micro_batch_size < 1) return core_error("algorithm.micro_batch_size: must be >= 1, got %d", tc->micro_batch_size);
    if (backward && tc->acts_mode != WAN_ACTS_STORE && tc->acts_mode != WAN_ACTS_RECOMPUTE &&
        !(tc->acts_mode == WAN_ACTS_CHECKPOINT && ex && ex->dev))
        return core_error("trainer: activation mode must be STORE or RECOMPUTE (or, on a device, CHECKPOINT)");
    int n_trained = 0;
    for (int e = 0; e < n_experts; e++) {
        const char *sfx = n_experts > 1 ? (e ? " (expert 1, transformer_2)" : " (expert 0, transformer)") : "";
        if (trained && trained[e] > 1)
            return core_error("algorithm.train_experts: trained flag of expert %d is %d; must be 0 or 1", e, trained[e]);
        if (!policy[e]) return core_error("trainer: no policy model%s", sfx);
        if (e > 0 && !wan_config_equal(&policy[e]->cfg, &policy[0]->cfg))
            return core_error("trainer: the experts' configs differ (expert %d vs expert 0)", e);
        if (trained && !trained[e]) continue;
        n_trained++;
        const wan_model *r = ref_of(ref, e);
        if (tc->beta > 0 && !r) return core_error("trainer: beta > 0 needs the reference model%s", sfx);
        if (r && !wan_config_equal(&r->cfg, &policy[e]->cfg)) return core_error("trainer: reference model config differs%s", sfx);
        if (tc->beta > 0 && r == policy[e] && !policy[e]->lora)
            return core_error("trainer: the reference is the policy itself, which needs a LoRA adapter to switch off%s", sfx);
        if (backward && !(ex && ex->dev) && !trainer_trained_buffer(policy[e]).grads) /* a device keeps its own */
            return core_error("trainer: gradients not allocated%s", sfx);
    }
    if (n_trained == 0) return core_error("algorithm.train_experts: no expert is trained");
    const core_traj *T = b->traj;
    const int64_t cc0 = T[0].concat ? T[0].concat_channels : 0;
    if (T[0].shape[0] + cc0 != policy[0]->cfg.in_channels || T[0].shape[0] != policy[0]->cfg.out_channels)
        return core_error("trainer: trajectories have %lld channels%s, the model takes %d and gives %d",
                          (long long)T[0].shape[0], cc0 ? " and a concatenated image condition" : "",
                          policy[0]->cfg.in_channels, policy[0]->cfg.out_channels);
    for (int s = 0; s < b->n; s++) {
        if (T[s].n_steps != T[0].n_steps || memcmp(T[s].shape, T[0].shape, sizeof T[0].shape))
            return core_error("trainer: trajectory %d (uid %llu) differs in steps or shape from trajectory 0", s,
                              (unsigned long long)T[s].uid);
        if (T[s].uid > 0xffffffffull) return core_error("trainer: uid %llu over 32 bits", (unsigned long long)T[s].uid);
        if (T[s].condition && policy[0]->cfg.patch_size[0] != 1)
            return core_error("trainer: image conditioning needs a patch one frame deep, the model's is %d",
                              policy[0]->cfg.patch_size[0]);
        if (!T[s].concat != !T[0].concat || (T[s].concat && T[s].concat_channels != cc0))
            return core_error("trainer: trajectory %d (uid %llu) %s a concatenated image condition (I2V-A14B) of "
                              "trajectory 0's channels (a batch is image-to-video or text-to-video throughout)", s,
                              (unsigned long long)T[s].uid, T[s].concat ? "has not" : "lacks");
        if (!T[s].condition != !T[0].condition)
            return core_error("trainer: trajectory %d (uid %llu) %s an image condition and trajectory 0 %s (a batch is "
                              "image-to-video or text-to-video throughout)", s, (unsigned long long)T[s].uid,
                              T[s].condition ? "has" : "has no", T[0].condition ? "has" : "has none");
        for (int i = 0; i < T[s].n_steps; i++)
            if (T[s].expert[i] >= n_experts)
                return core_error("trainer: uid %llu step %d uses expert %d but %d expert%s given (a two-expert "
                                  "rollout trains with trainer_accumulate_experts and both experts)",
                                  (unsigned long long)T[s].uid, i, T[s].expert[i], n_experts, n_experts > 1 ? "s" : "");
    }
    return grpo_selection_validate(&tc->sel, T[0].n_steps);
}

int trainer_accumulate_experts(wan_model *const *policy, const wan_model *const *ref, int n_experts,
                               const uint8_t *trained, const wan_exec *ex, const trainer_config *tc,
                               const trainer_batch *b, int backward, grpo_loss_stats *stats) {
    if (check_batch(policy, ref, n_experts, trained, ex, tc, b, backward)) return -1;
    const int N = b->traj[0].n_steps;
    const size_t cap_tr = (size_t)b->n * (size_t)N;
    transition *all = malloc(sizeof(transition) * cap_tr), *tr = malloc(sizeof(transition) * cap_tr);
    int *steps = malloc(sizeof(int) * (size_t)N);
    scratch w = {0};
    int rc = -1, total = 0, per[CORE_TRAJ_MAX_EXPERTS] = {0};
    if (!all || !tr || !steps) {
        core_error("trainer: out of memory");
        goto done;
    }
    /* Every sample's trained steps (its frozen experts' steps are not candidates), with each step's own expert. */
    for (int s = 0; s < b->n; s++) {
        const core_traj *T = &b->traj[s];
        int k;
        if (grpo_select_steps_experts(&tc->sel, N, T->has_log_prob, T->expert, trained, n_experts, tc->seed,
                                      (uint32_t)T->uid, steps, &k)) {
            core_error_push("trainer: sample %d (uid %llu): ", s, (unsigned long long)T->uid);
            goto done;
        }
        for (int j = 0; j < k; j++) {
            const int i = steps[j], e = T->expert[i];
            all[total++] = (transition){s, i, e, e ? T->guidance_scale_2 : T->guidance_scale};
            per[e]++;
        }
    }
    /* Grouped by expert (stable: sample by sample, steps ascending within each), so a forward runs one expert. */
    int pos = 0;
    for (int e = 0; e < n_experts; e++)
        for (int t = 0; t < total; t++)
            if (all[t].e == e) tr[pos++] = all[t];
    const int64_t denom = b->denom > 0 ? b->denom : total;
    const int cap = tc->micro_batch_size < total ? tc->micro_batch_size : total;
    unsigned armed = 0; /* the experts whose last micro-batch reduces its gradients during its backward */
    wan_exec hx = ex ? *ex : (wan_exec){0};
    if (backward && tc->grad_arm && ex && ex->dev) { /* every rank, a batch share without transitions too */
        int n_micro[CORE_TRAJ_MAX_EXPERTS] = {0};
        for (int e = 0; e < n_experts; e++) n_micro[e] = per[e] > 0 ? (per[e] + cap - 1) / cap : 0;
        if (tc->grad_arm(tc->grad_overlap_ctx, n_experts, n_micro, &armed)) goto done;
        hx.grad_ready = tc->grad_ready, hx.grad_ready_ctx = tc->grad_overlap_ctx;
    }
    if (total == 0 && !tc->expert_phase) {
        rc = 0;
        goto done;
    }
    if (total > 0 && scratch_alloc(&w, cap, &policy[0]->cfg, &b->traj[0], b->text_len))
        goto done;
    int n_mb = 0, mb = 0;
    for (int e = 0; e < n_experts; e++) n_mb += per[e] > 0 ? (per[e] + cap - 1) / cap : 0;
    for (int e = 0, g0 = 0; e < n_experts; g0 += per[e], e++) {
        const int phased = tc->expert_phase && (!trained || trained[e]);
        if (phased && tc->expert_phase(tc->expert_phase_ctx, e, 0, backward)) goto done;
        for (int t0 = g0; t0 < g0 + per[e]; t0 += cap) {
            const int cnt = g0 + per[e] - t0 < cap ? g0 + per[e] - t0 : cap;
            const int sig = tc->should_stop ? tc->should_stop() : 0;
            if (sig) {
                core_error("training stopped by signal %d (before micro-batch %d of %d)", sig, mb + 1, n_mb);
                goto done;
            }
            mb++;
            const int hook = (armed >> e & 1u) && t0 + cnt == g0 + per[e]; /* the expert's last micro-batch */
            if (micro_batch(policy[e], ref_of(ref, e), hook ? &hx : ex, tc, b, tr + t0, cnt, denom, backward, &w,
                            stats))
                goto done;
        }
        if (phased && tc->expert_phase(tc->expert_phase_ctx, e, 1, backward)) goto done;
    }
    rc = 0;
done:
    scratch_free(&w);
    free(all), free(tr), free(steps);
    return rc;
}

int trainer_count_transitions(const trainer_config *tc, const trainer_batch *b, int n_experts, const uint8_t *trained,
                              int64_t *count) {
    if (n_experts < 1 || n_experts > CORE_TRAJ_MAX_EXPERTS)
        return core_error("trainer: %d experts; must be 1 or %d", n_experts, CORE_TRAJ_MAX_EXPERTS);
    int N;
    if (core_traj_batch_steps(b->traj, b->n, "trainer", &N)) return -1;
    /* Rows [n, N] of has_log_prob and expert, so the counter names the sample at fault by its batch index. */
    const size_t rows = (size_t)b->n * (size_t)N;
    uint8_t *h = malloc(rows), *x = malloc(rows);
    if (!h || !x) {
        free(h), free(x);
        return core_error("trainer: out of memory");
    }
    for (int s = 0; s < b->n; s++) {
        memcpy(h + (size_t)s * N, b->traj[s].has_log_prob, (size_t)N);
        memcpy(x + (size_t)s * N, b->traj[s].expert, (size_t)N);
    }
    int rc = grpo_count_transitions_experts(&tc->sel, N, h, x, N, b->n, trained, n_experts, count);
    free(h), free(x);
    return rc;
}

int trainer_accumulate(wan_model *policy, const wan_model *ref, const wan_exec *ex, const trainer_config *tc,
                       const trainer_batch *b, int backward, grpo_loss_stats *stats) {
    wan_model *p[1] = {policy};
    const wan_model *r[1] = {ref};
    return trainer_accumulate_experts(p, r, 1, NULL, ex, tc, b, backward, stats);
}

int trainer_update_check(wan_model *const *policy, int n_experts, const uint8_t *trained, const wan_exec *ex,
                         const trainer_config *tc, optim_adamw *const *opt, const optim_config *ocfg, int *first_out) {
    if (n_experts < 1 || n_experts > CORE_TRAJ_MAX_EXPERTS)
        return core_error("trainer: %d experts; must be 1 or %d", n_experts, CORE_TRAJ_MAX_EXPERTS);
    int first = -1;
    for (int e = 0; e < n_experts; e++) {
        if (trained && trained[e] > 1)
            return core_error("algorithm.train_experts: trained flag of expert %d is %d; must be 0 or 1", e, trained[e]);
        if (trained && !trained[e]) continue;
        const char *sfx = n_experts > 1 ? (e ? " (expert 1, transformer_2)" : " (expert 0, transformer)") : "";
        if (!policy[e]) return core_error("trainer: no policy model%s", sfx);
        const trainer_trained_buf tb = trainer_trained_buffer(policy[e]);
        if (!tb.grads && !(ex && ex->dev)) return core_error("trainer: gradients not allocated%s", sfx);
        if (!opt || !opt[e]) return core_error("trainer: no optimizer state%s", sfx);
        if (opt[e]->n != tb.n)
            return core_error("trainer: optimizer has %lld parameters, the %s %lld%s", (long long)opt[e]->n,
                              tb.params == policy[e]->params ? "model" : "LoRA adapter", (long long)tb.n, sfx);
        if (first >= 0 && opt[e]->step != opt[first]->step)
            return core_error("trainer: the experts' optimizers are at different steps (%lld and %lld); one optimizer "
                              "step updates every trained expert", (long long)opt[first]->step, (long long)opt[e]->step);
        if (first < 0) first = e;
    }
    if (first < 0) return core_error("algorithm.train_experts: no expert is trained");
    if (optim_config_validate(ocfg)) return -1;
    if (ex && ex->dev && !tc->opt_step) /* the gradients are on the device: so must the step be */
        return core_error("trainer: the model is on a device, whose optimizer step is trainer/optim/train_dev.h's "
                          "(trainer_config.opt_step)");
    *first_out = first;
    return 0;
}

int trainer_opt_step_experts(wan_model *const *policy, int n_experts, const uint8_t *trained, const trainer_config *tc,
                             optim_adamw *const *opt, const optim_config *ocfg, int first, optim_step_info *info) {
    if (tc->opt_step) return tc->opt_step(tc->opt_step_ctx, policy, n_experts, trained, opt, ocfg, info);
    /* One step over all trained experts: clip by the norm of all their gradients together. */
    const float *g[CORE_TRAJ_MAX_EXPERTS] = {0};
    int64_t n[CORE_TRAJ_MAX_EXPERTS] = {0};
    int k = 0;
    for (int e = 0; e < n_experts; e++)
        if (!trained || trained[e]) g[k] = trainer_trained_buffer(policy[e]).grads, n[k++] = opt[e]->n;
    const double norm = optim_grad_norm_multi(g, n, k);
    if (!isfinite(norm))
        return core_error("optim: gradient norm is %s at optimizer step %lld; parameters not updated",
                          isnan(norm) ? "nan" : "inf", (long long)opt[first]->step);
    const double coef = optim_clip_coef(norm, ocfg->max_grad_norm);
    for (int e = 0; e < n_experts; e++) {
        if (trained && !trained[e]) continue;
        const trainer_trained_buf tb = trainer_trained_buffer(policy[e]);
        if (optim_adamw_step_coef(opt[e], ocfg, tb.params, tb.grads, NULL, norm, coef, info)) return -1;
    }
    return 0;
}

int trainer_update_experts(wan_model *const *policy, const wan_model *const *ref, int n_experts,
                           const uint8_t *trained, const wan_exec *ex, const trainer_config *tc,
                           const trainer_batch *b, optim_adamw *const *opt, const optim_config *ocfg,
                           grpo_loss_stats *stats, optim_step_info *info) {
    int first;
    if (trainer_update_check(policy, n_experts, trained, ex, tc, opt, ocfg, &first)) return -1;
    for (int e = 0; e < n_experts; e++) /* the adapter's under LoRA (the base has none), else the model's */
        if ((!trained || trained[e]) && wan_exec_zero_grads(ex, policy[e])) return -1;
    grpo_loss_stats local = {0};
    if (trainer_accumulate_experts(policy, ref, n_experts, trained, ex, tc, b, 1, &local)) return -1;
    /* The last chance to stop: from here the update runs to its end (weights and Adam state change together). */
    const int sig = tc->should_stop ? tc->should_stop() : 0;
    if (sig) return core_error("training stopped by signal %d (before the optimizer step)", sig);
    if (tc->grad_reduce && tc->grad_reduce(tc->grad_reduce_ctx, policy, n_experts, trained, &local)) return -1;
    if (stats) grpo_loss_stats_add(stats, &local);
    return trainer_opt_step_experts(policy, n_experts, trained, tc, opt, ocfg, first, info);
}

int trainer_update(wan_model *policy, const wan_model *ref, const wan_exec *ex, const trainer_config *tc,
                   const trainer_batch *b, optim_adamw *opt, const optim_config *ocfg, grpo_loss_stats *stats,
                   optim_step_info *info) {
    wan_model *p[1] = {policy};
    const wan_model *r[1] = {ref};
    optim_adamw *o[1] = {opt};
    return trainer_update_experts(p, r, 1, NULL, ex, tc, b, o, ocfg, stats, info);
}
