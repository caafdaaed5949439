/* bench/bench_step.c — `vgrpo bench step`: where one GRPO step of a recipe (default recipes/tiny-cpu.yaml, the
 * demo's) spends its time, by phase and by op class, from the per-op table of kernels/cpu/prof.h.
 *
 * The step is composed here from the same library calls local mode makes (rollout/source_local.c and trainer/run/loop.c):
 *   rollout  rollout_generate: B x G samples, the recipe's sampler, CFG, batch_size samples per DiT forward;
 *   decode   rollout_pipeline_decode of every final latent (model.decoder: the VAE or latent_rgb);
 *   reward   the recipe's scorers on every video (in process, weighted sum);
 *   train    grpo_advantages, then trainer_update (every selected transition's forward and backward in
 *            micro-batches of algorithm.micro_batch_size, then AdamW).
 * The prompts of step k are prompts (k*B .. k*B+B-1) mod P of data.prompt_file, uids as a training round's; the
 * per-step work (shapes, op calls) is that of `vgrpo run`, which adds only bookkeeping (metrics rows, the guard's
 * video statistics, checkpoints, evals) outside these phases. One warm-up step, then the timed steps; the table gives
 * the median step's phases (ms per step) split into GEMM (with the small VAE's direct convolutions), attention, norms, other elementwise ops (the op table and the
 * DiT layers' own passes), and "other": the rest of the phase (sampler and loss arithmetic, the optimizer, the
 * VAE's im2col and norms, copies, allocation). Then the largest op rows of the timed steps.
 * Refused (one line): LoRA recipes, two experts and algorithm.beta > 0 (a frozen reference copy): the demo recipe
 * has none of them. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/error.h"
#include "core/prompts.h"
#include "kernels/cpu/prof.h"
#include "reward/scorers.h"
#include "rollout/engine.h"
#include "rollout/pipeline.h"
#include "trainer/step/grpo.h"
#include "trainer/optim/optim.h"
#include "trainer/step/train_step.h"

static const char *const PHASES[] = {"rollout", "decode", "reward", "train"};
enum { N_PHASES = 4, N_CLASSES = 5, MAX_STEPS = 64 };
static const char *const CLASSES[N_CLASSES] = {"gemm/conv", "attention", "norm", "elementwise", "other"};

static int op_class(const char *op) {
    if (!strcmp(op, "gemm") || !strcmp(op, "conv_small")) return 0;
    if (!strncmp(op, "attention", 9) || !strncmp(op, "lse_merge", 9)) return 1;
    if (strstr(op, "norm_")) return 2;
    return 3;
}

static int phase_index(const char *p) {
    for (int i = 0; i < N_PHASES; i++)
        if (!strcmp(p, PHASES[i])) return i;
    return -1;
}

/* phase wall times of one step and its op-table rows split into classes: ms[phase][class], class 4 = other */
typedef struct {
    double wall[N_PHASES];
    double cls[N_PHASES][N_CLASSES];
    double gemm_flops[N_PHASES];
} step_times;

static void collect(step_times *st, k_prof_row *rows, int cap) {
    int n = k_prof_rows(rows, cap);
    if (n > cap) n = cap;
    memset(st->cls, 0, sizeof st->cls);
    memset(st->gemm_flops, 0, sizeof st->gemm_flops);
    for (int i = 0; i < n; i++) {
        int p = phase_index(rows[i].phase);
        if (p < 0) continue;
        int c = op_class(rows[i].op);
        st->cls[p][c] += rows[i].seconds;
        if (c == 0) st->gemm_flops[p] += rows[i].flops;
    }
    for (int p = 0; p < N_PHASES; p++) {
        double ops = 0;
        for (int c = 0; c < N_CLASSES - 1; c++) ops += st->cls[p][c];
        st->cls[p][N_CLASSES - 1] = st->wall[p] - ops > 0 ? st->wall[p] - ops : 0;
    }
}

typedef struct {
    const core_recipe *r;
    rollout_pipeline p;
    core_prompts prompts;
    const reward_scorer *sc[CORE_TRAJ_MAX_REWARDS];
    int B, G, n;
    optim_adamw opt;
    optim_config oc;
    trainer_config tc;
    /* per step */
    const float **cond;
    uint64_t *uids;
    int64_t *pidx;
    core_traj *traj;
    uint8_t *video;
    float *reward, *adv;
    uint8_t *mask;
} step_ctx;

static int one_step(step_ctx *S, int k, step_times *st) {
    const core_recipe *r = S->r;
    double t0 = omp_get_wtime();
    int rc = -1, have = 0;
    for (int j = 0; j < S->n; j++) {
        int slot = j / S->G, pi = (k * S->B + slot) % S->prompts.n;
        S->pidx[j] = pi;
        S->uids[j] = (uint64_t)k * (uint64_t)S->n + (uint64_t)j; /* round * B * G + slot * G + replica */
        if (rollout_pipeline_embed(&S->p, S->prompts.text[pi], &S->cond[j])) return -1;
    }
    k_prof_set_phase("rollout");
    rollout_config rc_ = S->p.rc;
    rc_.policy_version = k;
    if (rollout_generate(&rc_, &S->p.experts, NULL, S->n, S->cond, S->uids, S->pidx, S->traj)) return -1;
    have = 1;
    double t1 = omp_get_wtime();
    k_prof_set_phase("decode");
    const int64_t vb = rollout_pipeline_video_bytes(&S->p);
    for (int j = 0; j < S->n; j++)
        if (rollout_pipeline_decode(&S->p, &S->traj[j], S->video + vb * j)) goto done;
    double t2 = omp_get_wtime();
    k_prof_set_phase("reward");
    for (int j = 0; j < S->n; j++) {
        reward_video v = {.data = S->video + vb * j, .frames = S->p.dec.frames, .height = S->p.dec.height,
                          .width = S->p.dec.width};
        double total = 0;
        for (int i = 0; i < r->scorers.n; i++) {
            double x;
            if (S->sc[i]->fn(&v, S->prompts.text[S->pidx[j]], NULL, &x)) goto done;
            total += r->weights.v[i] * x;
        }
        S->reward[j] = (float)total;
    }
    double t3 = omp_get_wtime();
    k_prof_set_phase("train");
    if (grpo_advantages(S->reward, S->B, S->G, r->choice.std_mode == CORE_STD_BATCH ? GRPO_STD_BATCH : GRPO_STD_GROUP,
                        r->adv_clip_max, S->adv, S->mask, NULL))
        goto done;
    trainer_batch b = {.n = S->n, .traj = S->traj, .cond = S->cond, .neg = S->p.rc.neg, .text_len = r->text_len,
                       .adv = S->adv, .mask = S->mask, .denom = 0};
    grpo_loss_stats ls;
    memset(&ls, 0, sizeof ls);
    for (int u = 0; u < r->optimizer_steps_per_rollout; u++)
        if (trainer_update(&S->p.model[0], NULL, NULL, &S->tc, &b, &S->opt, &S->oc, &ls, NULL)) goto done;
    double t4 = omp_get_wtime();
    k_prof_set_phase(NULL);
    st->wall[0] = t1 - t0, st->wall[1] = t2 - t1, st->wall[2] = t3 - t2, st->wall[3] = t4 - t3;
    rc = 0;
done:
    if (have)
        for (int j = 0; j < S->n; j++) core_traj_free(&S->traj[j]);
    return rc;
}

static int setup(step_ctx *S, const core_recipe *r) {
    S->r = r;
    if (r->lora_rank > 0) return core_error("bench step: model.lora.rank %d: LoRA recipes are not profiled here", r->lora_rank);
    if (r->beta > 0) return core_error("bench step: algorithm.beta %g: a KL reference is not profiled here", r->beta);
    if (rollout_pipeline_load(&S->p, r, NULL)) return -1;
    if (S->p.experts.n != 1) return core_error("bench step: two experts are not profiled here");
    if (core_prompts_read(&S->prompts, r->prompt_file)) return -1;
    for (int i = 0; i < r->scorers.n && i < CORE_TRAJ_MAX_REWARDS; i++) {
        if (!(S->sc[i] = reward_find(r->scorers.v[i]))) return -1;
        if (S->sc[i]->learned)
            return core_error("reward.scorers.%d: %s is a learned scorer; bench step times the built-in pure ones", i,
                              S->sc[i]->name);
    }
    S->B = r->prompts_per_step, S->G = r->samples_per_prompt, S->n = S->B * S->G;
    if (grpo_selection_parse(r->timestep_selection, &S->tc.sel)) return -1;
    S->tc.seed = (uint64_t)r->seed;
    S->tc.clip_eps = r->clip_range;
    S->tc.beta = r->beta;
    S->tc.micro_batch_size = r->micro_batch_size;
    S->tc.acts_mode = r->choice.activations == CORE_ACTS_RECOMPUTE ? WAN_ACTS_RECOMPUTE : WAN_ACTS_STORE;
    S->tc.kind.type = r->choice.sde_type == CORE_SDE_TYPE_CPS ? FLOW_CPS : FLOW_SDE;
    S->tc.kind.logp = r->choice.cps_logprob == CORE_CPS_LOGP_FLOW_GRPO ? FLOW_LOGP_FLOW_GRPO : FLOW_LOGP_EXACT;
    S->p.rc.kind = S->tc.kind;
    S->oc = (optim_config){.lr = r->lr, .beta1 = r->beta1, .beta2 = r->beta2, .eps = r->eps,
                           .weight_decay = r->weight_decay, .max_grad_norm = r->max_grad_norm,
                           .schedule = OPTIM_SCHED_CONSTANT, .warmup_steps = r->warmup_steps,
                           .total_steps = r->total_steps * r->optimizer_steps_per_rollout};
    if (optim_config_validate(&S->oc) || wan_model_alloc_grads(&S->p.model[0]) ||
        optim_adamw_init(&S->opt, S->p.model[0].layout.numel))
        return -1;
    const int64_t vb = rollout_pipeline_video_bytes(&S->p);
    S->cond = calloc((size_t)S->n, sizeof *S->cond);
    S->uids = calloc((size_t)S->n, sizeof *S->uids);
    S->pidx = calloc((size_t)S->n, sizeof *S->pidx);
    S->traj = calloc((size_t)S->n, sizeof *S->traj);
    S->video = malloc((size_t)(vb * S->n));
    S->reward = calloc((size_t)S->n, sizeof *S->reward);
    S->adv = calloc((size_t)S->n, sizeof *S->adv);
    S->mask = calloc((size_t)S->n, 1);
    if (!S->cond || !S->uids || !S->pidx || !S->traj || !S->video || !S->reward || !S->adv || !S->mask)
        return core_error("bench step: out of memory");
    return 0;
}

static void teardown(step_ctx *S) {
    free(S->cond), free(S->uids), free(S->pidx), free(S->traj), free(S->video), free(S->reward), free(S->adv);
    free(S->mask);
    optim_adamw_free(&S->opt);
    core_prompts_free(&S->prompts);
    rollout_pipeline_free(&S->p);
}

static int by_step_total(const void *a, const void *b) {
    const step_times *x = a, *y = b;
    double sx = 0, sy = 0;
    for (int p = 0; p < N_PHASES; p++) sx += x->wall[p], sy += y->wall[p];
    return sx < sy ? -1 : sx > sy;
}

static void op_label(const k_prof_row *r, char *out, size_t cap) {
    if (!strcmp(r->op, "gemm"))
        snprintf(out, cap, "gemm %c%c M %d N %d K %d", r->ta ? 'T' : 'N', r->tb ? 'T' : 'N', r->M, r->N, r->K);
    else
        snprintf(out, cap, "%s n %lld", r->op, (long long)r->elems);
}

int bench_step(const char *recipe_path, const core_recipe *r, int steps, int top) {
    if (steps > MAX_STEPS) steps = MAX_STEPS;
    step_ctx S;
    memset(&S, 0, sizeof S);
    step_times st[MAX_STEPS];
    k_prof_row *rows = malloc(sizeof *rows * K_PROF_MAX_ROWS);
    int rc = 1;
    if (!rows) {
        fprintf(stderr, "vgrpo bench step: out of memory\n");
        return 1;
    }
    if (setup(&S, r)) goto fail;
    const int nt = omp_get_max_threads();
    const double peak = bench_peak_gflops();
    printf("vgrpo bench step: %s (model %s), B %d x G %d = %d samples, %d denoising steps, latent %lld x %lld x %lld "
           "x %lld, batch_size %d, micro_batch_size %d, %d thread%s; 1 warm-up step + %d timed\n",
           recipe_path, r->model_path, S.B, S.G, S.n, r->num_steps, (long long)S.p.rc.shape[0],
           (long long)S.p.rc.shape[1], (long long)S.p.rc.shape[2], (long long)S.p.rc.shape[3], r->batch_size,
           r->micro_batch_size, nt, nt == 1 ? "" : "s", steps);
    step_times warm;
    if (one_step(&S, 0, &warm)) goto fail;
    /* the op rows of all timed steps together (for the op table) and of each step alone (for the phase table) */
    k_prof_row *all = malloc(sizeof *all * K_PROF_MAX_ROWS);
    int n_all = 0;
    if (!all) goto fail;
    for (int k = 0; k < steps; k++) {
        k_prof_enable(1);
        if (one_step(&S, k + 1, &st[k])) {
            k_prof_enable(0);
            free(all);
            goto fail;
        }
        collect(&st[k], rows, K_PROF_MAX_ROWS);
        /* fold this step's rows into `all` */
        int n = k_prof_rows(rows, K_PROF_MAX_ROWS);
        for (int i = 0; i < n && i < K_PROF_MAX_ROWS; i++) {
            int f = -1;
            for (int j = 0; j < n_all && f < 0; j++)
                if (!strcmp(all[j].phase, rows[i].phase) && !strcmp(all[j].op, rows[i].op) && all[j].ta == rows[i].ta &&
                    all[j].tb == rows[i].tb && all[j].M == rows[i].M && all[j].N == rows[i].N && all[j].K == rows[i].K &&
                    all[j].elems == rows[i].elems)
                    f = j;
            if (f < 0 && n_all < K_PROF_MAX_ROWS) all[f = n_all++] = (k_prof_row){.phase = rows[i].phase, .op = rows[i].op,
                                                                             .ta = rows[i].ta, .tb = rows[i].tb, .M = rows[i].M,
                                                                             .N = rows[i].N, .K = rows[i].K,
                                                                             .elems = rows[i].elems};
            if (f >= 0) all[f].calls += rows[i].calls, all[f].seconds += rows[i].seconds, all[f].flops += rows[i].flops;
        }
        k_prof_enable(0);
    }
    qsort(st, (size_t)steps, sizeof st[0], by_step_total);
    const step_times *m = &st[steps / 2];
    double total = 0;
    for (int p = 0; p < N_PHASES; p++) total += m->wall[p];
    printf("\nthe median step, ms (%% of the step); op classes from the op table (kernels/cpu/prof.h), other = the "
           "rest of the phase\n");
    printf("%-8s %9s %6s |", "phase", "ms", "%step");
    for (int c = 0; c < N_CLASSES; c++) printf(" %11s", CLASSES[c]);
    printf(" | %8s %6s\n", "GEMM GF/s", "%peak");
    double csum[N_CLASSES] = {0}, gf_total = 0, gs_total = 0;
    for (int p = 0; p < N_PHASES; p++) {
        printf("%-8s %9.1f %5.1f%% |", PHASES[p], 1e3 * m->wall[p], 100.0 * m->wall[p] / total);
        for (int c = 0; c < N_CLASSES; c++) {
            printf(" %11.1f", 1e3 * m->cls[p][c]);
            csum[c] += m->cls[p][c];
        }
        double gfs = m->cls[p][0] > 0 ? m->gemm_flops[p] / m->cls[p][0] * 1e-9 : 0;
        gf_total += m->gemm_flops[p], gs_total += m->cls[p][0];
        if (gfs > 0) printf(" | %9.1f %5.1f%%\n", gfs, 100.0 * gfs / peak);
        else printf(" | %9s %6s\n", "-", "-");
    }
    printf("%-8s %9.1f %5.1f%% |", "step", 1e3 * total, 100.0);
    for (int c = 0; c < N_CLASSES; c++) printf(" %11.1f", 1e3 * csum[c]);
    double gft = gs_total > 0 ? gf_total / gs_total * 1e-9 : 0;
    printf(" | %9.1f %5.1f%%\n", gft, 100.0 * gft / peak);
    printf("%-8s %9s %6s |", "", "", "");
    for (int c = 0; c < N_CLASSES; c++) printf(" %10.1f%%", 100.0 * csum[c] / total);
    printf("\n\nthe %d largest op rows, summed over the %d timed steps and shown per step (peak %.1f GFLOP/s, "
           "bench peak)\n", top, steps, peak);
    printf("%-8s %-40s %9s %9s %7s %9s %6s\n", "phase", "op", "calls", "ms", "%step", "GFLOP/s", "%peak");
    for (int i = 1; i < n_all; i++) /* by seconds, largest first */
        for (int j = i; j > 0 && all[j].seconds > all[j - 1].seconds; j--) {
            k_prof_row x = all[j];
            all[j] = all[j - 1], all[j - 1] = x;
        }
    for (int i = 0; i < n_all && i < top; i++) {
        char lab[96];
        op_label(&all[i], lab, sizeof lab);
        double ms = 1e3 * all[i].seconds / steps, gfs = all[i].flops > 0 ? all[i].flops / all[i].seconds * 1e-9 : 0;
        printf("%-8s %-40s %9.0f %9.2f %6.1f%%", all[i].phase, lab, (double)all[i].calls / steps, ms,
               100.0 * ms / (1e3 * total));
        if (gfs > 0) printf(" %9.1f %5.1f%%\n", gfs, 100.0 * gfs / peak);
        else printf(" %9s %6s\n", "-", "-");
    }
    free(all);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "vgrpo bench step: %s\n", core_last_error());
    teardown(&S);
    free(rows);
    return rc;
}
