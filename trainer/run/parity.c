/* trainer/run/parity.c — the parity job (`vgrpo parity`, trainer/run/run.h: trainer_parity): the trainer's recomputation of
 * every trainable transition of one rollout batch against the rollout's own log-probs and velocities, per denoising
 * step, printed and written to logging.run_dir/parity.json. The rollout comes from the rollout source with velocities
 * returned; the recomputation runs through trainer_accumulate_experts (the training path, no backward) on every
 * trainer rank's share. A forward-process objective (algorithm.loss nft: core_recipe_forward_process) has no
 * log-prob: its parity is the velocity alone, the policy's forward through the trainer's executor at the recorded
 * states of the steps it trains (with the rollout's guidance, so the same velocity the sampler used), and the report
 * says there is no log-prob. */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/philox.h"
#include "model/flow/denoise.h"
#include "trainer/run/run_internal.h"

typedef struct {
    const core_traj *traj; /* this rank's share */
    const float *vel;      /* the share's rollout velocities, [n, N, nl] */
    int N;
    double *acc;
} parity_acc;

/* Sample s's step i: a transition, and the largest |v - v_rollout| of the step. */
static void velocity_probe(parity_acc *P, int s, int i, const float *v, int64_t nl) {
    double *a = P->acc + 4 * i;
    a[0] += 1;
    const float *vr = P->vel + ((int64_t)s * P->N + i) * nl;
    double m = 0;
    for (int64_t k = 0; k < nl; k++) {
        const double e = fabs((double)v[k] - (double)vr[k]);
        if (e > m) m = e;
    }
    if (m > a[3]) a[3] = m;
}

static void parity_probe(void *ctx, int s, int i, const float *v, int64_t nl, float logp) {
    parity_acc *P = ctx;
    double *a = P->acc + 4 * i;
    const double d = fabs((double)logp - (double)P->traj[s].log_probs[i]);
    a[1] += d;
    if (d > a[2]) a[2] = d;
    velocity_probe(P, s, i, v, nl);
}

/* The forward-process objectives' recomputation of this rank's share: the velocity of every selected (sample, step)
 * at the recorded latent x_i, in micro-batches of algorithm.micro_batch_size, into acc as parity_probe does (no
 * log-prob: its columns stay 0). */
static int velocity_share(trainer_state *S, const trainer_batch *sub, parity_acc *P) {
    const core_traj *T = sub->traj;
    const int N = P->N;
    const int64_t nl = S->nl;
    int *steps = malloc(sizeof(int) * (size_t)N), *ts = malloc(sizeof(int) * 2 * (size_t)N * (size_t)sub->n);
    flow_denoise d = {0};
    int rc = -1, total = 0;
    if (!steps || !ts) {
        core_error("out of memory");
        goto done;
    }
    for (int s = 0; s < sub->n; s++) {
        int k;
        if (grpo_select_steps(&S->tc.sel, N, NULL, S->tc.seed, (uint32_t)T[s].uid, steps, &k)) goto done;
        for (int j = 0; j < k; j++) ts[2 * total] = s, ts[2 * total + 1] = steps[j], total++;
    }
    const int cap = S->tc.micro_batch_size < total ? S->tc.micro_batch_size : total;
    if (total == 0) {
        rc = 0;
        goto done;
    }
    if (flow_denoise_init(&d, &S->pol[0].cfg, T[0].shape, sub->text_len, 0, cap, 0)) goto done;
    for (int t0 = 0; t0 < total; t0 += cap) {
        const int cnt = total - t0 < cap ? total - t0 : cap;
        for (int t = 0; t < cnt; t++) {
            const core_traj *x = &T[ts[2 * (t0 + t)]];
            const int i = ts[2 * (t0 + t) + 1];
            d.in[t] = (flow_denoise_sample){core_traj_latent(x, i), NULL, sub->cond[ts[2 * (t0 + t)]], x->timesteps[i],
                                            x->guidance_scale};
        }
        const int rows = flow_denoise_build(&d, cnt, sub->neg);
        wan_exec_acts *a = rows < 0 ? NULL : flow_denoise_acts_new(&d, S->ex, rows, WAN_ACTS_INFER);
        const int bad = !a || flow_denoise_forward(&d, &S->pol[0], a, S->ex);
        wan_exec_acts_free(a);
        if (bad) goto done;
        for (int t = 0; t < cnt; t++)
            velocity_probe(P, ts[2 * (t0 + t)], ts[2 * (t0 + t) + 1], flow_denoise_velocity(&d, t), nl);
    }
    rc = 0;
done:
    flow_denoise_free(&d);
    free(steps), free(ts);
    return rc;
}

int trainer_parity_share(trainer_state *S, const trainer_batch *tb, const float *vel, int N, double *acc) {
    int lo = 0, hi = tb->n;
    if (S->dp) dp_share(tb->n, S->me.dp_rank, S->topo.dp, &lo, &hi);
    const int fp = core_recipe_forward_process(S->r);
    trainer_batch sub = *tb;
    if (!fp && trainer_count_transitions(&S->tc, tb, S->n_experts, S->trained, &sub.denom)) return -1;
    sub.n = hi - lo, sub.traj += lo, sub.cond += lo, sub.adv += lo, sub.mask += lo;
    parity_acc P = {sub.traj, vel + (int64_t)lo * N * S->nl, N, acc};
    trainer_config tc = S->tc;
    tc.probe = parity_probe;
    tc.probe_ctx = &P;
    grpo_loss_stats st = {0};
    memset(acc, 0, sizeof(double) * 4 * (size_t)N);
    wan_model *pol[2] = {&S->pol[0], &S->pol[1]};
    const wan_model *ref[2];
    if (fp ? velocity_share(S, &sub, &P)
           : trainer_accumulate_experts(pol, trainer_refs(S, ref), S->n_experts, S->trained, S->ex, &tc, &sub, 0, &st))
        return -1;
    if (!S->dpg || S->dpg->size == 1) return 0;
    double *mx = malloc(sizeof(double) * 2 * (size_t)N), *sm = malloc(sizeof(double) * 2 * (size_t)N);
    if (!mx || !sm) return free(mx), free(sm), core_error("out of memory");
    for (int i = 0; i < N; i++)
        sm[2 * i] = acc[4 * i], sm[2 * i + 1] = acc[4 * i + 1], mx[2 * i] = acc[4 * i + 2], mx[2 * i + 1] = acc[4 * i + 3];
    int rc = dp_sum_doubles(S->dpg, sm, 2 * N) || dp_max_doubles(S->dpg, mx, 2 * N) ? -1 : 0;
    for (int i = 0; i < N; i++)
        acc[4 * i] = sm[2 * i], acc[4 * i + 1] = sm[2 * i + 1], acc[4 * i + 2] = mx[2 * i], acc[4 * i + 3] = mx[2 * i + 1];
    free(mx), free(sm);
    return rc;
}

/* parity.json in the run folder. */
static void write_json(const trainer_state *S, const double *acc, const core_traj *tr0, int N, int n, double worst_lp,
                       double worst_v, double tol_lp, double tol_v, int pass) {
    const core_recipe *r = S->r;
    const int fp = core_recipe_forward_process(r); /* no log-prob: its fields are left out, "log_prob": false */
    json_t *steps = json_array();
    for (int i = 0; i < N; i++) {
        const double *a = acc + 4 * i;
        if (a[0] == 0) continue;
        json_array_append_new(steps, fp ? json_pack("{s:i, s:f, s:i, s:f}", "step", i, "timestep",
                                                    (double)tr0->timesteps[i], "transitions", (int)a[0], "max_abs_dv",
                                                    a[3])
                                        : json_pack("{s:i, s:f, s:i, s:f, s:f, s:f}", "step", i, "timestep",
                                                    (double)tr0->timesteps[i], "transitions", (int)a[0],
                                                    "mean_abs_dlogp", a[1] / a[0], "max_abs_dlogp", a[2], "max_abs_dv",
                                                    a[3]));
    }
    json_t *root = json_pack("{s:o, s:f, s:f, s:f, s:f, s:b, s:i, s:i, s:i, s:i, s:i, s:i, s:s}", "steps", steps,
                             "max_abs_dlogp", worst_lp, "max_abs_dv", worst_v, "tolerance_dlogp", tol_lp,
                             "tolerance_dv", tol_v, "pass", pass, "samples", n, "workers", S->src->n_workers,
                             "trainer_ranks", S->dp ? S->dp->size : 1, "sp", S->topo.sp, "ulysses_degree",
                             S->topo.ulysses, "micro_batch_size", r->micro_batch_size, "device",
                             trainer_device_label(S));
    if (fp) {
        json_object_del(root, "max_abs_dlogp"), json_object_del(root, "tolerance_dlogp");
        json_object_set_new(root, "log_prob", json_false());
        json_object_set_new(root, "loss", json_string(r->loss));
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/parity.json", r->run_dir);
    if (core_json_write_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(9), "w")) core_log_warn("%s", core_last_error());
    json_decref(root);
}

/* Prints the table, writes parity.json; 0 pass, 1 fail (error set), -1 failure. */
static int report(trainer_state *S, const core_rollout_result *res, const float *vflat, const double *acc, int n,
                  double tolerance, double t_rollout, double t_recompute) {
    const core_recipe *r = S->r;
    const int B = r->prompts_per_step, G = r->samples_per_prompt, N = r->num_steps;
    const int64_t per = (int64_t)N * S->nl;
    double worst_lp = 0, worst_v = 0, tol_lp = tolerance, tol_v = tolerance;
    if (tolerance < 0) { /* auto */
        tol_lp = tol_v = 0;
        if (S->topo.sp / S->topo.ulysses > 1) {
            double vmax = 0, lmax = 1;
            for (int64_t k = 0; k < per * n; k++) vmax = fabs(vflat[k]) > vmax ? fabs(vflat[k]) : vmax;
            for (int k = 0; k < n; k++)
                for (int i = 0; i < N; i++)
                    lmax = fabs(res[k].traj.log_probs[i]) > lmax ? fabs(res[k].traj.log_probs[i]) : lmax;
            /* the fp32 bound; on the device (bf16 activations: the ring's merged outputs rounded to bf16 at every
             * merge) 8 bf16 epsilons (2^-8) instead: measured on the emulated device, tiny preset, ring 2: max|dv|
             * 2.8 and max|dlogp| 0.16 bf16 epsilons of the maxima */
            const double eps = S->dx ? 8.0 / 256.0 : 32.0 * FLT_EPSILON;
            tol_v = eps * vmax, tol_lp = eps * lmax;
        }
    }
    printf("parity: %d samples (%d prompts x %d) x %d steps at policy version %lld%s; rollout: %d worker(s), %d samples "
           "per forward; trainer: %d rank(s), %d transitions per forward (algorithm.micro_batch_size)\n",
           n, B, G, N, (long long)TRAINER_VERSION(S), S->lora_on ? " (LoRA adapters)" : "", S->src->n_workers,
           r->batch_size, S->dp ? S->dp->size : 1, r->micro_batch_size);
    const int fp = core_recipe_forward_process(r); /* no log-prob: the velocity alone */
    if (fp)
        printf("%5s %9s %11s %14s\n", "step", "timestep", "transitions", "max|dv|");
    else
        printf("%5s %9s %11s %14s %14s %14s\n", "step", "timestep", "transitions", "mean|dlogp|", "max|dlogp|", "max|dv|");
    for (int i = 0; i < N; i++) {
        const double *a = acc + 4 * i;
        if (a[0] == 0) continue;
        if (fp)
            printf("%5d %9.3f %11.0f %14.6g\n", i, (double)res[0].traj.timesteps[i], a[0], a[3]);
        else
            printf("%5d %9.3f %11.0f %14.6g %14.6g %14.6g\n", i, (double)res[0].traj.timesteps[i], a[0], a[1] / a[0],
                   a[2], a[3]);
        worst_lp = a[2] > worst_lp ? a[2] : worst_lp;
        worst_v = a[3] > worst_v ? a[3] : worst_v;
    }
    const int pass = worst_lp <= tol_lp && worst_v <= tol_v;
    printf("parity: trainer layout dp %d x sp %d (ulysses %d, ring %d), model.device %s\n", S->topo.dp, S->topo.sp,
           S->topo.ulysses, S->topo.sp / S->topo.ulysses, trainer_device_label(S));
    if (fp)
        printf("parity: no log-prob (algorithm.loss %s trains on the forward process: the velocity at the recorded "
               "states is what the rollout and the trainer share); max |v_trainer - v_rollout| = %.6g (tolerance "
               "%.6g): %s (rollout %.2fs, recompute %.2fs)\n", r->loss, worst_v, tol_v, pass ? "PASS" : "FAIL",
               t_rollout, t_recompute);
    else
        printf("parity: max |logp_trainer - logp_rollout| = %.6g (tolerance %.6g), max |v_trainer - v_rollout| = %.6g "
               "(tolerance %.6g): %s (rollout %.2fs, recompute %.2fs)\n", worst_lp, tol_lp, worst_v, tol_v,
               pass ? "PASS" : "FAIL", t_rollout, t_recompute);
    fflush(stdout);
    if (core_mkdir_p(r->run_dir)) return -1;
    write_json(S, acc, &res[0].traj, N, n, worst_lp, worst_v, tol_lp, tol_v, pass);
    if (pass) return 0;
    if (fp)
        core_error("parity: the trainer's velocities differ from the rollout's by more than the tolerance (dv %g > %g)",
                   worst_v, tol_v);
    else
        core_error("parity: the trainer's log-probs or velocities differ from the rollout's by more than the tolerance "
                   "(dlogp %g > %g or dv %g > %g)", worst_lp, tol_lp, worst_v, tol_v);
    return 1;
}

int trainer_parity(const core_recipe *r, core_rollout_source *src, sp_comm *dp, double tolerance) {
    return trainer_parity_opts(r, NULL, src, dp, tolerance);
}

int trainer_parity_opts(const core_recipe *r, const trainer_run_opts *o, core_rollout_source *src, sp_comm *dp,
                        double tolerance) {
    trainer_state S;
    memset(&S, 0, sizeof S);
    S.src = src;
    char *config_text = NULL;
    int64_t start = 0;
    const int B = r->prompts_per_step, G = r->samples_per_prompt, n = B * G, N = r->num_steps;
    core_rollout_sample *smp = calloc((size_t)n, sizeof *smp);
    core_rollout_result *res = calloc((size_t)n, sizeof *res);
    core_traj *tr = malloc(sizeof(core_traj) * (size_t)n);
    const float **cond = malloc(sizeof(float *) * (size_t)n);
    int *slot = malloc(sizeof(int) * (size_t)B);
    float *adv = calloc((size_t)n, sizeof(float)), *vflat = NULL;
    uint8_t *mask = calloc((size_t)n, 1);
    double *acc = calloc(4 * (size_t)N, sizeof(double));
    int rc = -1, have = 0, computed = 0;
    if (!smp || !res || !tr || !cond || !slot || !adv || !mask || !acc) {
        core_error("out of memory");
        goto done;
    }
    const wan_model *ex[2] = {&S.pol[0], &S.pol[1]};
    const int resumed = o && o->resume;
    if (trainer_setup(&S, r, dp)) goto done;
    if (resumed) { /* a checkpoint's weights (LoRA: its adapters), exactly as a resumed run loads them */
        const int64_t total = o->steps > 0 ? o->steps : r->total_steps;
        if (!(config_text = trainer_config_text(r)) || trainer_resume(&S, o->resume, config_text, total, &start)) goto done;
    }
    if (src->start(src->ctx, ex, S.n_experts, S.trained, TRAINER_VERSION(&S), resumed)) goto done;
    trainer_sampler_next(&S.smp, slot); /* the prompts of step 0 (resumed: of the checkpoint's next step) */
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            const int k = b * G + g;
            smp[k] = (core_rollout_sample){.uid = (uint64_t)k, .prompt_index = slot[b], .prompt = S.train.text[slot[b]],
                                           .metadata = core_prompts_meta(&S.train, slot[b])};
            cond[k] = S.emb_train + (int64_t)slot[b] * S.ne;
        }
    const double t0 = trainer_now_s();
    core_rollout_request tmpl = {.policy_version = TRAINER_VERSION(&S), .stream = CORE_STREAM_ROLLOUT_NOISE,
                                 .eta = r->eta, .return_trajectories = 1, .return_velocities = 1};
    trainer_rollout_settings(&S, start, &tmpl); /* the window of the round it checks (step 0, or the checkpoint's next) */
    if (src->rollout(src->ctx, &tmpl, smp, cond, S.emb_neg, n, res, NULL, NULL)) goto done;
    have = 1;
    const double t1 = trainer_now_s();
    const int64_t per = (int64_t)N * S.nl;
    if (!(vflat = malloc(sizeof(float) * (size_t)(per * n)))) {
        core_error("out of memory");
        goto done;
    }
    for (int k = 0; k < n; k++) {
        if (!res[k].velocity) {
            core_error("parity: sample %d came back without velocities", k);
            goto done;
        }
        memcpy(vflat + per * k, res[k].velocity, sizeof(float) * (size_t)per);
        tr[k] = res[k].traj;
    }
    if (dp && dp->size > 1) {
        dp_batch db = {.n = n, .traj = tr, .adv = adv, .mask = mask};
        int64_t cmd = DP_CMD_PARITY;
        if (sp_comm_broadcast(dp, &cmd, 1, SP_I64, 0) || dp_batch_broadcast(dp, &db) ||
            sp_comm_broadcast(dp, vflat, (size_t)(per * n), SP_F32, 0))
            goto done;
    }
    trainer_batch tb = {.n = n, .traj = tr, .cond = cond, .neg = S.emb_neg, .text_len = r->text_len, .adv = adv,
                        .mask = mask};
    if (trainer_parity_share(&S, &tb, vflat, N, acc)) goto done;
    computed = 1;
    rc = report(&S, res, vflat, acc, n, tolerance, t1 - t0, trainer_now_s() - t1);
done:
    if (dp && dp->size > 1 && computed) { /* otherwise the caller aborts the MPI job */
        int64_t cmd = DP_CMD_STOP;
        if (sp_comm_broadcast(dp, &cmd, 1, SP_I64, 0)) rc = -1;
    }
    if (have)
        for (int k = 0; k < n; k++) core_rollout_result_free(&res[k]);
    free(smp), free(res), free(tr), free(cond), free(slot), free(adv), free(mask), free(acc), free(vflat);
    free(config_text);
    trainer_teardown(&S);
    return rc;
}
