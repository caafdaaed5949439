/* trainer/run/loop.c — the GRPO loop (trainer/run/run.h has the step's data flow): trainer_run on rank 0, written against the
 * rollout source (core/rollout_source.h), and trainer_follow on the other trainer ranks, which train on their share of
 * every batch rank 0 broadcasts. The update itself is the recipe's objective (algorithm.loss: GRPO's, or a
 * forward-process one such as DiffusionNFT's; trainer/run/objective.c), the rest of the step is shared. Timing fields
 * are all under "time/" so runs can be compared bit for bit without them. A checkpoint holds everything the loop
 * carries from one step to the next (weights, Adam state, EMA, nft's old policy, the step, the sampler's epoch and
 * position, the reward-hacking guard's state: trainer/run/guard.h), so a resumed run repeats a straight run bit for
 * bit. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/philox.h"
#include "core/reduce.h"
#include "core/stop.h"
#include "trainer/step/grpo.h"
#include "trainer/optim/lora.h"
#include "trainer/run/run_internal.h"
#include "trainer/dp/zero.h"

/* After update u of GRPO step k: the trained weights are finite, else the run stops here, before they are synced to
 * the workers or written to a checkpoint (whose load would refuse them): the error names the step, the tensor and the
 * update that made it. The loss and the gradient norm were finite (trainer_update_experts refuses a non-finite one
 * before updating), so the cause is the AdamW update itself (optim.lr, optim.weight_decay, optim.eps). One read of
 * the trained parameters' host copies (under model.device cuda with trainer_dev's lazy_host the host copy is made
 * only when the master's sum of squares on the device is not finite: trainer_dev_opt_step). */
static int check_updated(trainer_state *S, int64_t k, int u, const optim_step_info *info) {
    char label[600];
    for (int e = 0; e < S->n_experts; e++) {
        if (!S->trained[e]) continue;
        const trainer_trained_buf tb = trainer_trained_buffer(&S->pol[e]);
        snprintf(label, sizeof label, "step %" PRId64 ": the AdamW update %d of %d (optimizer step %" PRId64 ", lr %g, "
                 "optim.weight_decay %g, optim.eps %g; gradient norm %g, clip factor %g: the loss and gradients were "
                 "finite) made the %s of %s non-finite (the run stops here: they are neither synced nor checkpointed, "
                 "the last checkpoint is kept)", k, u + 1, S->r->optimizer_steps_per_rollout, S->opt[e].step, info->lr,
                 S->oc.weight_decay, S->oc.eps, info->grad_norm, info->clip_coef,
                 S->lora_on ? "LoRA adapter" : "weights", wan_expert_folder(e));
        if (wan_layout_check_finite(tb.layout, tb.params, label, "")) return -1;
    }
    return 0;
}

/* rewards.jsonl: {"step", "uid": [...], "prompt_index": [...], "reward": [...]} with %.9g (exact floats), one row
 * written whole or not at all. */
static int write_rewards(trainer_state *S, int64_t round, const core_rollout_result *res, const float *rew, int n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return core_error("out of memory");
    fprintf(f, "{\"step\": %" PRId64 ", \"uid\": [", round);
    for (int s = 0; s < n; s++) fprintf(f, "%s%llu", s ? ", " : "", (unsigned long long)res[s].traj.uid);
    fprintf(f, "], \"prompt_index\": [");
    for (int s = 0; s < n; s++) fprintf(f, "%s%lld", s ? ", " : "", (long long)res[s].traj.prompt_index);
    fprintf(f, "], \"reward\": [");
    for (int s = 0; s < n; s++) fprintf(f, "%s%.9g", s ? ", " : "", (double)rew[s]);
    fprintf(f, "]}\n");
    if (fclose(f)) return free(buf), core_error("out of memory");
    char path[4200];
    snprintf(path, sizeof path, "%s/rewards.jsonl", S->r->run_dir);
    const int rc = core_jsonl_append(S->rewards_fd, buf, len, path);
    free(buf);
    return rc;
}

/* The step's metrics row (rewards per scorer, loss statistics of the first and last update, timing). */
static int put_step_metrics(trainer_state *S, const core_rollout_result *res, const float *rew, double *per,
                            const grpo_adv_stats *as, const trainer_obj_stats *first, const trainer_obj_stats *last,
                            const optim_step_info *info0, const optim_step_info *info) {
    const core_recipe *r = S->r;
    const int B = r->prompts_per_step, G = r->samples_per_prompt, n = B * G, U = r->optimizer_steps_per_rollout;
    core_metrics *m = S->metrics;
    double gstd = 0;
    for (int b = 0; b < B; b++) {
        double mu = 0, q = 0;
        for (int g = 0; g < G; g++) mu += rew[b * G + g];
        mu /= G;
        for (int g = 0; g < G; g++) q += (rew[b * G + g] - mu) * (rew[b * G + g] - mu);
        gstd += sqrt(q / G);
    }
    gstd /= B;
    int e = core_metrics_f64(m, "lr", info0->lr) || core_metrics_f64(m, "reward/mean", as->reward_mean) ||
            core_metrics_f64(m, "reward/std", as->reward_std) || core_metrics_f64(m, "reward/min", as->reward_min) ||
            core_metrics_f64(m, "reward/max", as->reward_max) || core_metrics_f64(m, "reward/group_std_mean", gstd);
    char key[160];
    for (int j = 0; j < S->n_scorers && !e; j++) {
        for (int s = 0; s < n; s++) per[s] = res[s].traj.rewards[j];
        double mu, se, sd, lo = per[0], hi = per[0];
        core_mean_sd_se(per, n, &mu, &sd, &se);
        for (int s = 1; s < n; s++) lo = per[s] < lo ? per[s] : lo, hi = per[s] > hi ? per[s] : hi;
        const char *nm = S->scorer_names[j];
        e = (snprintf(key, sizeof key, "reward/%s/mean", nm), core_metrics_f64(m, key, mu)) ||
            (snprintf(key, sizeof key, "reward/%s/std", nm), core_metrics_f64(m, key, sd)) ||
            (snprintf(key, sizeof key, "reward/%s/min", nm), core_metrics_f64(m, key, lo)) ||
            (snprintf(key, sizeof key, "reward/%s/max", nm), core_metrics_f64(m, key, hi));
    }
    e = e || trainer_obj_put_metrics(S, m, "", first) || core_metrics_f64(m, "grad_norm", info0->grad_norm) ||
        core_metrics_f64(m, "grad_clip_coef", info0->clip_coef) ||
        core_metrics_f64(m, "masked_fraction", as->masked_fraction) || core_metrics_i64(m, "adv_clamped", as->n_clamped) ||
        core_metrics_i64(m, "transitions", trainer_obj_transitions(S, first)) ||
        core_metrics_i64(m, "optimizer_steps", U);
    if (U > 1 && !e)
        e = trainer_obj_put_metrics(S, m, "offpolicy_last/", last) ||
            core_metrics_f64(m, "offpolicy_last/grad_norm", info->grad_norm);
    return e ? -1 : 0;
}

/* One GRPO step (rollout round `round`). *phase names what it is doing while a stop may still discard the step
 * ("rollout", "training"), and becomes NULL once the first optimizer update has begun to change the weights (with dp,
 * once the batch goes to the other ranks): from there the step runs to its end with interruptions held off
 * (core_stop_hold; the caller releases the hold). Nothing of the step is written to the run folder before that
 * point (rewards.jsonl is written after the training), so a discarded step leaves no trace but the sampler's
 * position, which the caller restores. */
static int run_step(trainer_state *S, int64_t round, int64_t total, const char **phase) {
    const core_recipe *r = S->r;
    const int B = r->prompts_per_step, G = r->samples_per_prompt, n = B * G, U = r->optimizer_steps_per_rollout;
    const int64_t version0 = TRAINER_VERSION(S);
    double t0 = trainer_now_s(), t1 = t0, t2 = t0, t3 = t0;
    core_rollout_sample *smp = calloc((size_t)n, sizeof *smp);
    core_rollout_result *res = calloc((size_t)n, sizeof *res);
    core_traj *tr = malloc(sizeof(core_traj) * (size_t)n);
    const float **cond = malloc(sizeof(float *) * (size_t)n);
    int *slot = malloc(sizeof(int) * (size_t)B);
    float *rew = malloc(sizeof(float) * (size_t)n), *adv = malloc(sizeof(float) * (size_t)n);
    uint8_t *mask = malloc((size_t)n);
    double *per = malloc(sizeof(double) * (size_t)n);
    int rc = -1, have = 0;
    if (!smp || !res || !tr || !cond || !slot || !rew || !adv || !mask || !per) {
        core_error("out of memory");
        goto done;
    }
    *phase = "rollout";
    trainer_sampler_next(&S->smp, slot);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            const int s = b * G + g;
            smp[s] = (core_rollout_sample){.uid = (uint64_t)round * (uint64_t)n + (uint64_t)s, .prompt_index = slot[b],
                                           .prompt = S->train.text[slot[b]],
                                           .metadata = core_prompts_meta(&S->train, slot[b])};
            cond[s] = S->emb_train + (int64_t)slot[b] * S->ne;
        }
    if (smp[n - 1].uid > 0xffffffffull) {
        core_error("rollout uid %llu exceeds 32 bits", (unsigned long long)smp[n - 1].uid);
        goto done;
    }
    core_rollout_request tmpl = {.policy_version = version0, .stream = CORE_STREAM_ROLLOUT_NOISE, .eta = r->eta,
                                 .return_trajectories = 1};
    trainer_rollout_settings(S, round, &tmpl);
    trainer_guard *gd = &S->guard; /* guard.video_stats: the videos come back for their statistics (trainer/run/guard.h) */
    if (gd->stats_on && trainer_guard_begin_step(gd, n, smp[0].uid)) goto done;
    tmpl.return_videos = gd->stats_on;
    if (S->src->rollout(S->src->ctx, &tmpl, smp, cond, S->emb_neg, n, res, gd->stats_on ? trainer_guard_on_chunk : NULL,
                        gd))
        goto done;
    have = 1;
    t1 = trainer_now_s();
    double traj_bytes = 0; /* the latents (and step means) the trainer holds for this step */
    for (int s = 0; s < n; s++) {
        if (trainer_check_scorers(S, &res[s].traj)) goto done;
        rew[s] = res[s].traj.reward_total;
        tr[s] = res[s].traj; /* shallow: res keeps ownership */
        traj_bytes += 4.0 * (double)S->nl * (tr[s].n_latents + (tr[s].means ? tr[s].n_latents - 1 : 0));
    }
    if (core_metrics_f64(S->metrics, "trajectory_mib", traj_bytes / 1048576.0)) goto done;
    grpo_adv_stats as;
    const int std_mode = r->choice.std_mode == CORE_STD_BATCH ? GRPO_STD_BATCH : GRPO_STD_GROUP;
    if (grpo_advantages(rew, B, G, std_mode, r->adv_clip_max, adv, mask, &as))
        goto done;
    t2 = trainer_now_s();
    trainer_batch tb = {.n = n, .traj = tr, .cond = cond, .neg = S->emb_neg, .text_len = r->text_len, .adv = adv,
                        .mask = mask};
    trainer_obj_stats first = {0}, last = {0};
    optim_step_info info0 = {0}, info = {0};
    *phase = "training";
    if (S->dp && S->dp->size > 1) {
        dp_batch db = {.n = n, .traj = tr, .adv = adv, .mask = mask};
        int64_t cmd = DP_CMD_TRAIN;
        core_stop_hold(1), *phase = NULL; /* the other ranks train this batch: no way back */
        if (sp_comm_broadcast(S->dp, &cmd, 1, SP_I64, 0) || dp_batch_broadcast(S->dp, &db)) goto done;
    }
    for (int u = 0; u < U; u++) {
        trainer_obj_stats st = {0};
        if (trainer_obj_update(S, &tb, u, &st, &info, u == 0)) { /* e.g. a non-finite loss or gradient norm, named */
            core_error_push("step %" PRId64 ", update %d of %d: ", round, u + 1, U);
            goto done;
        }
        core_stop_hold(1), *phase = NULL; /* the weights changed: the step completes (EMA, sync, rows) */
        if (check_updated(S, round, u, &info)) goto done;
        if (S->ema_on) trainer_ema_update(S);
        if (u == 0) first = st, info0 = info;
        last = st;
    }
    if (S->old_on) { /* the old policy follows the policy once per step, after its updates (trainer/step/nft.h) */
        double d;
        if (trainer_old_update(S, &d) || core_metrics_f64(S->metrics, "old_decay", d)) goto done;
    }
    t3 = trainer_now_s();
    if (write_rewards(S, round, res, rew, n)) goto done;
    const wan_model *ex[2] = {&S->pol[0], &S->pol[1]};
    int match = -1;
    int64_t sync_bytes = 0;
    if (S->src->push_weights(S->src->ctx, ex, S->n_experts, S->trained, TRAINER_VERSION(S), &match, &sync_bytes))
        goto done;
    double sync_s = 0, sync_gbps = 0;
    if (match >= 0) { /* weights crossed to other processes: with LoRA the adapters only */
        sync_s = trainer_now_s() - t3;
        /* GB/s: what crossed to all workers over the sync's wall time (a timing field, like weight_sync/seconds) */
        sync_gbps = sync_s > 0 ? (double)sync_bytes * S->src->n_workers / sync_s / 1e9 : 0.0;
        if (core_metrics_f64(S->metrics, "weight_sync/seconds", sync_s) ||
            core_metrics_i64(S->metrics, "weight_sync/hash_match", match) ||
            core_metrics_i64(S->metrics, "weight_sync/bytes", sync_bytes) ||
            core_metrics_f64(S->metrics, "weight_sync/gb_per_s", sync_gbps))
            goto done;
    }
    if (put_step_metrics(S, res, rew, per, &as, &first, &last, &info0, &info)) goto done;
    const double step_s = t3 - t0;
    core_metrics *m = S->metrics;
    if (core_metrics_f64(m, "time/rollout_s", t1 - t0) || core_metrics_f64(m, "time/reward_s", t2 - t1) ||
        core_metrics_f64(m, "time/train_s", t3 - t2) || core_metrics_f64(m, "time/sync_s", sync_s) ||
        core_metrics_f64(m, "time/step_s", step_s) || core_metrics_f64(m, "time/samples_per_s", n / step_s))
        goto done;
    /* step numbered as in metrics.jsonl (from 0); loss in %e: the GRPO loss is ~0 on average by construction */
    char obj[256];
    trainer_obj_summary(S, &first, obj, sizeof obj);
    printf("step %" PRId64 " of %" PRId64 " | v%" PRId64 " | reward %.4f +- %.4f [%.3f, %.3f] | %s | gnorm %.3g lr "
           "%.3g | masked %.2f | %.2fs (rollout %.2f, train %.2f) %.1f samples/s\n",
           round, total, version0, as.reward_mean, as.reward_std, as.reward_min, as.reward_max, obj, info0.grad_norm,
           info0.lr, as.masked_fraction, step_s, t1 - t0, t3 - t2, n / step_s);
    if (match >= 0) /* on the step's line: what the weight sync sent each worker */
        printf("  weight sync: %.1f KiB to each worker (%s) in %.3fs, %.3f GB/s to %d worker(s)\n", sync_bytes / 1024.0,
               S->lora_on ? "LoRA adapters" : "full weights", sync_s, sync_gbps, S->src->n_workers);
    fflush(stdout);
    /* the guard: stats/... fields, drift warnings, the early stop's training-reward sums (the step is complete) */
    if (trainer_guard_step(gd, round, gd->vstats, gd->vn, as.reward_mean, S->metrics, stdout)) goto done;
    rc = 0;
done:
    if (have)
        for (int s = 0; s < n; s++) core_rollout_result_free(&res[s]);
    free(smp), free(res), free(tr), free(cond), free(slot), free(rew), free(adv), free(mask), free(per);
    return rc;
}

/* A stop inside step k (phase: what it was doing): S is as before the step (weights, Adam state and EMA are only
 * changed by the optimizer step, which a stop never interrupts; the caller restored the sampler), so checkpoint-k
 * is saved (checkpoint.every >= 0) and the error says what was discarded. Returns 0 with the error set, -1 when the
 * save failed. */
static int stop_in_step(trainer_state *S, int64_t k, const char *phase, const char *config_text) {
    const int sig = core_stop_pending();
    const int save = S->r->ckpt_every >= 0;
    if (save && trainer_save_checkpoint(S, k, config_text))
        return core_error_push("stopped by signal %d during step %" PRId64 " (%s): step %" PRId64
                               " discarded; saving checkpoint-%" PRId64 " failed: ", sig, k, phase, k, k);
    char what[128];
    if (save) snprintf(what, sizeof what, "checkpoint-%" PRId64 " saved: continue with --resume", k);
    else snprintf(what, sizeof what, "no checkpoint (checkpoint.every is -1)");
    core_error("stopped by signal %d during step %" PRId64 " (%s): step %" PRId64 " discarded; %s", sig, k, phase, k,
               what);
    return 0;
}

/* The guard stopped the run at the eval of step k (before step k's rollout): checkpoint-k (the weights that eval
 * judged) is saved unless it exists (checkpoint.every >= 0: the run ends here). */
static int guard_save(trainer_state *S, int64_t k, const char *config_text) {
    const core_recipe *r = S->r;
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/checkpoint-%" PRId64, r->ckpt_dir ? r->ckpt_dir : r->run_dir, k);
    if (r->ckpt_every < 0) {
        printf("guard: no checkpoint (checkpoint.every is -1)\n");
    } else if (core_is_dir(ck)) {
        printf("guard: %s holds the stopped run's weights\n", ck);
    } else if (trainer_save_checkpoint(S, k, config_text)) {
        return -1;
    }
    fflush(stdout);
    return 0;
}

int trainer_run(const core_recipe *r, const trainer_run_opts *o, core_rollout_source *src, sp_comm *dp) {
    trainer_state S;
    memset(&S, 0, sizeof S);
    S.src = src;
    int rc = -1, signals = 0, stopped = 0, guard_stop = 0;
    int64_t start = 0;
    char *config_text = NULL;
    const int64_t total = o->steps > 0 ? o->steps : r->total_steps;
    if (trainer_setup(&S, r, dp) || trainer_scorers_init(&S) || trainer_ema_init(&S) || trainer_old_init(&S) ||
        trainer_guard_init(&S.guard, r, &S.eval) ||
        !(config_text = trainer_config_text(r)))
        goto done;
    if (o->resume && trainer_resume(&S, o->resume, config_text, total, &start)) goto done;
    const wan_model *ex[2] = {&S.pol[0], &S.pol[1]};
    if (src->start(src->ctx, ex, S.n_experts, S.trained, TRAINER_VERSION(&S), o->resume != NULL) ||
        trainer_open_run_files(&S, o->resume != NULL, start))
        goto done;
    printf("vgrpo run (%s): %s (%s, %s), latent %d x %d x %d x %d, %d denoising steps, B=%d G=%d, %" PRId64
           " %s steps -> %s\n",
           src->mode, r->model_path, r->text_encoder, r->decoder, (int)S.shape[0], (int)S.shape[1], (int)S.shape[2],
           (int)S.shape[3], r->num_steps, r->prompts_per_step, r->samples_per_prompt, total,
           r->choice.loss == CORE_LOSS_NFT ? "DiffusionNFT" : r->choice.loss == CORE_LOSS_DPO ? "Flow-DPO" : "GRPO",
           r->run_dir);
    if (strcmp(src->mode, "local"))
        printf("  %d rollout worker(s), %d trainer rank(s)\n", src->n_workers, dp ? dp->size : 1);
    if (S.dx) /* model.device cuda: the DiT and AdamW on the device; the flow arithmetic stays fp32 on the host */
        printf("  model.device %s: the transformer in bf16 on the device (fp32 master weights, AdamW state and "
               "gradients there; schedule, SDE step, log-probs and loss in fp32 on the host)\n",
               trainer_device_label(&S));
    fflush(stdout);
    core_stop_install();
    signals = 1;
    for (int64_t k = start; k < total; k++) {
        if (core_metrics_i64(S.metrics, "step", k) || core_metrics_i64(S.metrics, "policy_version", TRAINER_VERSION(&S)))
            goto done;
        /* A signal inside step k (eval, sample videos, rollout, training before the optimizer step) ends it at once:
         * the step is discarded and the state before it, which is checkpoint-k of a straight run, is saved. */
        const uint32_t epoch0 = S.smp.epoch;
        const int pos0 = S.smp.pos;
        const char *phase = "eval";
        int bad = (k == 0 || (r->eval_every > 0 && k % r->eval_every == 0)) && trainer_eval(&S, k);
        if (!bad && S.guard.st.stopped) { /* guard.patience: this eval stopped the run (its line says why) */
            guard_stop = 1;
            if (core_metrics_write_row(S.metrics) || guard_save(&S, k, config_text)) goto done;
            break;
        }
        if (!bad && r->video_every > 0 && k % r->video_every == 0) phase = "sample videos", bad = trainer_step_videos(&S, k);
        if (!bad) bad = run_step(&S, k, total, &phase);
        core_stop_hold(0);
        if (bad) {
            if (phase && core_stop_pending()) {
                trainer_sampler_seek(&S.smp, epoch0, pos0);
                trainer_guard_rewind(&S.guard);
                core_metrics_clear_row(S.metrics);
                if (stop_in_step(&S, k, phase, config_text) == 0) stopped = 1;
            }
            goto done;
        }
        if (core_metrics_write_row(S.metrics)) goto done;
        trainer_guard_boundary(&S.guard);
        const int sig = core_stop_pending();
        /* every N steps (N > 0), and at the end and on a signal (N >= 0; -1: never) */
        if (r->ckpt_every >= 0 && ((r->ckpt_every > 0 && (k + 1) % r->ckpt_every == 0) || k + 1 == total || sig) &&
            trainer_save_checkpoint(&S, k + 1, config_text))
            goto done;
        if (sig) { /* it came after the step's last chance to stop (its optimizer step): the step completed */
            if (r->ckpt_every >= 0)
                core_error("stopped by signal %d after step %" PRId64 " (%" PRId64 " of %" PRId64 " steps done); "
                           "checkpoint-%" PRId64 " saved: continue with --resume", sig, k, k + 1, total, k + 1);
            else
                core_error("stopped by signal %d after step %" PRId64 " (%" PRId64 " of %" PRId64 " steps done); no "
                           "checkpoint (checkpoint.every is -1)", sig, k, k + 1, total);
            stopped = 1; /* a clean stop between steps: the other trainer ranks are told to stop */
            goto done;
        }
    }
    const char *last = "final eval";
    int bad = 0;
    if (!guard_stop) { /* a run the guard stopped had its last eval */
        if (core_metrics_i64(S.metrics, "step", total) ||
            core_metrics_i64(S.metrics, "policy_version", TRAINER_VERSION(&S)))
            goto done;
        bad = trainer_eval(&S, total);
        if (!bad) bad = core_metrics_write_row(S.metrics);
        if (!bad && r->video_every > 0) last = "final sample videos", bad = trainer_step_videos(&S, total);
    }
    if (!bad && S.lora_on) { /* the base is frozen: bit for bit what model.path holds (the workers' hello hash) */
        uint64_t h;
        const wan_model *mm[2] = {&S.pol[0], &S.pol[1]};
        if (wan_models_hash(mm, S.n_experts, &h)) goto done;
        if (h != S.base_hash) {
            core_error("LoRA: the base weights changed during the run (model xxh64 %016llx, at start-up %016llx)",
                       (unsigned long long)h, (unsigned long long)S.base_hash);
            goto done;
        }
        printf("LoRA: base weights unchanged after %" PRId64 " steps (model xxh64 %016llx)\n", total - start,
               (unsigned long long)h);
        fflush(stdout);
    }
    if (bad) {
        const int sig = core_stop_pending();
        if (sig) { /* every step is done, and checkpointed at the last one (checkpoint.every >= 0) */
            core_error("stopped by signal %d during the %s after step %" PRId64 "; all %" PRId64 " steps done%s", sig,
                       last, total - 1, total, r->ckpt_every >= 0 ? " and checkpointed" : "");
            stopped = 1;
        }
        goto done;
    }
    rc = 0;
done:
    core_stop_hold(0);
    if (signals) core_stop_restore();
    if ((!rc || stopped) && dp && dp->size > 1) {
        int64_t cmd = DP_CMD_STOP;
        if (sp_comm_broadcast(dp, &cmd, 1, SP_I64, 0)) rc = -1, stopped = 0;
    }
    if (stopped && rc) rc = 1;
    free(config_text);
    trainer_guard_free(&S.guard);
    trainer_teardown(&S);
    return rc;
}

/* A broadcast batch's conditioning pointers (prompt indices checked against the training prompts). */
static int follow_cond(const trainer_state *S, const dp_batch *db, const float ***cond) {
    free(*cond);
    if (!(*cond = malloc(sizeof(float *) * (size_t)db->n))) return core_error("out of memory");
    for (int s = 0; s < db->n; s++) {
        if (db->traj[s].prompt_index < 0 || db->traj[s].prompt_index >= S->train.n)
            return core_error("trainer rank %d: prompt index %lld out of range", S->dp->rank,
                              (long long)db->traj[s].prompt_index);
        (*cond)[s] = S->emb_train + db->traj[s].prompt_index * S->ne;
    }
    return 0;
}

int trainer_follow(const core_recipe *r, const trainer_run_opts *o, sp_comm *dp) {
    trainer_state S;
    memset(&S, 0, sizeof S);
    dp_batch db = {0};
    const float **cond = NULL;
    int rc = -1;
    int64_t start = 0;
    char *config_text = NULL;
    const int64_t total = o->steps > 0 ? o->steps : r->total_steps;
    if (trainer_setup(&S, r, dp) || trainer_old_init(&S) || !(config_text = trainer_config_text(r))) goto done;
    if (o->resume && trainer_resume(&S, o->resume, config_text, total, &start)) goto done;
    for (;;) {
        int64_t cmd = -1;
        if (sp_comm_broadcast(dp, &cmd, 1, SP_I64, 0)) goto done;
        if (cmd == DP_CMD_STOP) break;
        if (cmd == DP_CMD_ZERO_GATHER) { /* rank 0 writes a checkpoint: its Adam state from every shard */
            optim_adamw none[2], *opts[2] = {&S.opt[0], &S.opt[1]};
            if ((S.dx && trainer_dev_sync_moments(&S.dev, opts)) || dp_zero_gather(S.red.grads, S.opt, 2, none))
                goto done;
            continue;
        }
        if (cmd != DP_CMD_TRAIN && cmd != DP_CMD_PARITY) {
            core_error("trainer rank %d: unknown command %lld from rank 0", dp->rank, (long long)cmd);
            goto done;
        }
        if (dp_batch_broadcast(dp, &db) || follow_cond(&S, &db, &cond)) goto done;
        trainer_batch tb = {.n = db.n, .traj = db.traj, .cond = cond, .neg = S.emb_neg, .text_len = r->text_len,
                            .adv = db.adv, .mask = db.mask};
        if (cmd == DP_CMD_PARITY) {
            const int N = db.traj[0].n_steps;
            const int64_t cnt = (int64_t)db.n * N * S.nl;
            float *vflat = malloc(sizeof(float) * (size_t)cnt);
            double *acc = malloc(sizeof(double) * 4 * (size_t)N);
            int bad = !vflat || !acc ? core_error("out of memory") : 0;
            if (!bad) bad = sp_comm_broadcast(dp, vflat, (size_t)cnt, SP_F32, 0) || trainer_parity_share(&S, &tb, vflat, N, acc);
            free(vflat), free(acc);
            if (bad) goto done;
        } else {
            for (int u = 0; u < r->optimizer_steps_per_rollout; u++) {
                trainer_obj_stats st = {0};
                optim_step_info info;
                if (trainer_obj_update(&S, &tb, u, &st, &info, 0)) goto done;
            }
            double d; /* as rank 0 does after the step's updates: the copies stay equal */
            if (trainer_old_update(&S, &d)) goto done;
        }
        dp_batch_free(&db);
    }
    rc = 0;
done:
    dp_batch_free(&db);
    free(cond);
    free(config_text);
    trainer_teardown(&S);
    return rc;
}
