/* tests/test_train_experts.c — two-expert GRPO training (Wan 2.2 A14B routing; trainer_accumulate_experts,
 * trainer_update_experts, grpo_*_experts, optim_grad_norm_multi / optim_adamw_step_coef) on two tiny Wan DiTs with
 * different weights, fed by the two-expert rollout engine: B = 2 prompts x G = 4 samples, latent 16 x 2 x 8 x 8,
 * 6 steps, boundary 0.875 (steps 0..1 run expert 0 with CFG 4.5, steps 2..5 expert 1 with CFG 2.5).
 * Checks: (a) on the first update logp_new == the rollout's log-prob bit for bit for every transition at micro-batch
 * sizes 1, 3, 64 (STORE and RECOMPUTE), while swapping the experts breaks it; (b) each expert's gradient is bitwise
 * the gradient of the one-expert trainer on that expert's transitions alone with the same global denominator, and
 * the gradient does not depend on micro_batch_size (1, 3, 64) beyond fp32 summation order; (c) with expert 1 frozen
 * its params, grads and optimizer state are untouched, the selection and the denominator hold only expert 0's
 * transitions (random_k draws among them), the grad norm is expert 0's alone; (d) clipping by the global norm over
 * both experts against a hand computation; errors, trainer_count_transitions, the grad_reduce hook (runs before the
 * norm; a failing hook changes no weights); `vgrpo init-model --preset tiny --experts 2`. */
#include <stdio.h>
#include <string.h>

#include "core/philox.h"
#include "model/dit/wan_dit.h"
#include "model/text/word_embed.h"
#include "rollout/engine.h"
#include "tests/test.h"
#include "trainer/step/train_step.h"

#define XL 4
#define XB 2
#define XG 4
#define XN (XB * XG)
#define XSTEPS 6
#define G_HI 4.5f
#define G_LO 2.5f

typedef struct {
    wan_model ref[2], pol[2];
    float *emb;
    const float *cond[XN];
    core_traj traj[XN];
    float adv[XN];
    uint8_t mask[XN];
    int n_hi; /* steps of expert 0 per sample (the same for every sample: one schedule) */
} xfixture;

/* ref[e] = random tiny weights (seed 31 + e); pol[e] = ref[e] + N(0, delta^2) (delta 0: the same). The rollout runs
 * the references (roll_by_ref) or the policies with two experts. */
static void xfixture_build(xfixture *f, float delta, int roll_by_ref) {
    memset(f, 0, sizeof *f);
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    for (int e = 0; e < 2; e++) {
        REQUIRE_OK(wan_model_init(&f->ref[e], &c));
        REQUIRE_OK(wan_model_init(&f->pol[e], &c));
        wan_params_init_random(&f->ref[e], 31 + (uint64_t)e);
        const int64_t np = f->ref[e].layout.numel;
        memcpy(f->pol[e].params, f->ref[e].params, sizeof(float) * np);
        if (delta > 0) {
            float *z = malloc(sizeof(float) * np);
            REQUIRE(z);
            core_philox_normal(z, np, 77, 0, (uint32_t)e, 7);
            for (int64_t k = 0; k < np; k++) f->pol[e].params[k] += delta * z[k];
            free(z);
        }
        REQUIRE_OK(wan_model_alloc_grads(&f->pol[e]));
    }
    const int td = c.text_dim;
    f->emb = malloc(sizeof(float) * XB * XL * td);
    REQUIRE(f->emb);
    REQUIRE_OK(wan_word_embed("a red ball", XL, td, f->emb));
    REQUIRE_OK(wan_word_embed("green grass", XL, td, f->emb + XL * td));
    uint64_t uids[XN];
    int64_t pidx[XN];
    for (int s = 0; s < XN; s++) f->cond[s] = f->emb + (s / XG) * XL * td, uids[s] = 200 + s, pidx[s] = s / XG;
    rollout_config rc;
    const int64_t shape[4] = {16, 2, 8, 8};
    REQUIRE_OK(rollout_config_init(&rc, XSTEPS, 3.0, 0.9f, G_HI, shape, XL, 2025, 3));
    rc.guidance_scale_2 = G_LO;
    rc.boundary_ratio = 0.875;
    const wan_model *m = roll_by_ref ? f->ref : f->pol;
    rollout_experts E = {2, {&m[0], &m[1]}};
    REQUIRE_OK(rollout_generate(&rc, &E, NULL, XN, f->cond, uids, pidx, f->traj));
    for (int i = 0; i < XSTEPS; i++) f->n_hi += f->traj[0].expert[i] == 0;
    REQUIRE(f->n_hi >= 1 && f->n_hi < XSTEPS); /* both experts run */
    const float rewards[XN] = {0.1f, 0.7f, 0.4f, 0.2f, 0.9f, 0.3f, 0.3f, 0.6f};
    REQUIRE_OK(grpo_advantages(rewards, XB, XG, GRPO_STD_GROUP, 5.0f, f->adv, f->mask, NULL));
}

static void xfixture_free(xfixture *f) {
    for (int s = 0; s < XN; s++) core_traj_free(&f->traj[s]);
    for (int e = 0; e < 2; e++) wan_model_free(&f->ref[e]), wan_model_free(&f->pol[e]);
    free(f->emb);
}

static trainer_batch xbatch(xfixture *f) {
    return (trainer_batch){.n = XN, .traj = f->traj, .cond = f->cond, .text_len = XL, .adv = f->adv, .mask = f->mask};
}

static trainer_config xconfig(const char *sel, float beta, int mb, wan_acts_mode mode) {
    trainer_config tc = {.seed = 9, .clip_eps = 0.2f, .beta = beta, .micro_batch_size = mb, .acts_mode = mode};
    if (grpo_selection_parse(sel, &tc.sel)) test_fail(__FILE__, __LINE__, "%s", core_last_error());
    return tc;
}

static double l2(const float *a, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s);
}

static double rel_l2(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(d) / l2(b, n);
}

static float *dup(const float *x, int64_t n) {
    float *y = malloc(sizeof(float) * n);
    if (!y) test_fail(__FILE__, __LINE__, "out of memory");
    memcpy(y, x, sizeof(float) * n);
    return y;
}

/* Views of the trajectories holding only expert e's steps as a one-expert rollout would record them: has_log_prob
 * kept only on e's steps, every expert id 0, guidance_scale = e's guidance. Shares the latents (free with
 * views_free, never core_traj_free). */
static void views_of_expert(const xfixture *f, int e, core_traj *v) {
    for (int s = 0; s < XN; s++) {
        v[s] = f->traj[s];
        v[s].has_log_prob = malloc(XSTEPS);
        v[s].expert = calloc(XSTEPS, 1);
        REQUIRE(v[s].has_log_prob && v[s].expert);
        for (int i = 0; i < XSTEPS; i++) v[s].has_log_prob[i] = f->traj[s].has_log_prob[i] && f->traj[s].expert[i] == e;
        v[s].guidance_scale = e ? f->traj[s].guidance_scale_2 : f->traj[s].guidance_scale;
    }
}

static void views_free(core_traj *v) {
    for (int s = 0; s < XN; s++) free(v[s].has_log_prob), free(v[s].expert);
}

static void zero2(xfixture *f) {
    wan_model_zero_grads(&f->pol[0]);
    wan_model_zero_grads(&f->pol[1]);
}

TEST(train_experts_parity_first_update) {
    xfixture f;
    xfixture_build(&f, 0.0f, 0);
    trainer_batch b = xbatch(&f);
    for (int s = 0; s < XN; s++) CHECK(f.traj[s].guidance_scale == G_HI && f.traj[s].guidance_scale_2 == G_LO);
    wan_model *pol[2] = {&f.pol[0], &f.pol[1]};
    const wan_model *ref[2] = {&f.ref[0], &f.ref[1]};
    const int mbs[3] = {1, 3, 64};
    for (int k = 0; k < 3; k++)
        for (int mode = WAN_ACTS_STORE; mode <= WAN_ACTS_RECOMPUTE; mode++) {
            if (mode == WAN_ACTS_RECOMPUTE && mbs[k] != 3) continue;
            trainer_config tc = xconfig("all", 0.04f, mbs[k], (wan_acts_mode)mode);
            grpo_loss_stats st = {0};
            zero2(&f);
            REQUIRE_OK(trainer_accumulate_experts(pol, ref, 2, NULL, NULL, &tc, &b, 1, &st));
            CHECK(st.n_transitions == XN * XSTEPS);
            CHECK_MSG(st.abs_logp_diff_sum == 0.0, "micro %d mode %d: sum |logp_new - logp_old| = %g", mbs[k], mode,
                      st.abs_logp_diff_sum);
            CHECK(st.abs_ratio_dev_sum == 0.0 && st.n_clipped == 0 && st.kl == 0.0);
            CHECK(l2(f.pol[0].grads, f.pol[0].layout.numel) > 0 && l2(f.pol[1].grads, f.pol[1].layout.numel) > 0);
        }
    /* The check can fail: the experts swapped, or one expert's guidance used for all steps, change the log-probs. */
    {
        trainer_config tc = xconfig("all", 0.0f, 64, WAN_ACTS_STORE);
        wan_model *sw[2] = {&f.pol[1], &f.pol[0]};
        grpo_loss_stats st = {0};
        REQUIRE_OK(trainer_accumulate_experts(sw, NULL, 2, NULL, NULL, &tc, &b, 0, &st));
        CHECK(st.abs_logp_diff_sum > 0);
        for (int s = 0; s < XN; s++) f.traj[s].guidance_scale_2 = G_HI;
        memset(&st, 0, sizeof st);
        REQUIRE_OK(trainer_accumulate_experts(pol, NULL, 2, NULL, NULL, &tc, &b, 0, &st));
        CHECK(st.abs_logp_diff_sum > 0);
    }
    xfixture_free(&f);
}

TEST(train_experts_gradient_routing_and_split) {
    xfixture f;
    xfixture_build(&f, 0.01f, 1);
    trainer_batch b = xbatch(&f);
    wan_model *pol[2] = {&f.pol[0], &f.pol[1]};
    const wan_model *ref[2] = {&f.ref[0], &f.ref[1]};
    const int64_t n = f.pol[0].layout.numel;
    const int mbs[3] = {64, 3, 1};
    float *g[3][2];
    grpo_loss_stats st[3];
    for (int k = 0; k < 3; k++) {
        trainer_config tc = xconfig("all", 0.5f, mbs[k], WAN_ACTS_STORE);
        tc.clip_eps = 0.05f; /* some ratios clipped */
        memset(&st[k], 0, sizeof st[k]);
        zero2(&f);
        REQUIRE_OK(trainer_accumulate_experts(pol, ref, 2, NULL, NULL, &tc, &b, 1, &st[k]));
        for (int e = 0; e < 2; e++) g[k][e] = dup(f.pol[e].grads, n);
    }
    CHECK(st[0].n_transitions == XN * XSTEPS);
    if (getenv("VGRPO_VERBOSE"))
        fprintf(stderr, "  kl %g ratio dev %g clipped %lld\n", st[0].kl, st[0].abs_ratio_dev_sum,
                (long long)st[0].n_clipped);
    CHECK(st[0].kl > 0 && st[0].abs_ratio_dev_sum > 0 && st[0].n_clipped > 0); /* off the reference, off-policy */
    CHECK(l2(g[0][0], n) > 0 && l2(g[0][1], n) > 0 && rel_l2(g[0][0], g[0][1], n) > 0.1);
    /* Routing: expert e's gradient is the one-expert trainer's on e's transitions alone, global denominator. */
    for (int k = 0; k < 2; k++) {
        double loss = 0;
        int64_t nt = 0;
        for (int e = 0; e < 2; e++) {
            core_traj v[XN];
            views_of_expert(&f, e, v);
            trainer_batch be = b;
            be.traj = v;
            be.denom = XN * XSTEPS;
            trainer_config tc = xconfig("all", 0.5f, mbs[k], WAN_ACTS_STORE);
            tc.clip_eps = 0.05f;
        tc.clip_eps = 0.05f; /* some ratios clipped */
            grpo_loss_stats s1 = {0};
            wan_model_zero_grads(&f.pol[e]);
            REQUIRE_OK(trainer_accumulate(&f.pol[e], &f.ref[e], NULL, &tc, &be, 1, &s1));
            CHECK(s1.n_transitions == XN * (e ? XSTEPS - f.n_hi : f.n_hi));
            CHECK_MSG(memcmp(f.pol[e].grads, g[k][e], sizeof(float) * n) == 0,
                      "micro %d expert %d: gradient differs from the one-expert run (rel L2 %.3g)", mbs[k], e,
                      rel_l2(f.pol[e].grads, g[k][e], n));
            loss += s1.loss, nt += s1.n_transitions;
            views_free(v);
        }
        CHECK(nt == st[k].n_transitions);
        CHECK_NEAR(loss, st[k].loss, 1e-6 * fabs(st[k].loss));
    }
    /* Micro-batch size: only fp32 summation order differs (same bound as tests/test_train.c). */
    for (int k = 1; k < 3; k++)
        for (int e = 0; e < 2; e++) {
            const double rel = rel_l2(g[k][e], g[0][e], n);
            if (getenv("VGRPO_VERBOSE")) fprintf(stderr, "  micro %d expert %d: rel L2 %.3g\n", mbs[k], e, rel);
            CHECK_MSG(rel <= 1e-5, "micro %d vs %d, expert %d: relative L2 %.3g", mbs[k], mbs[0], e, rel);
            CHECK(st[k].n_clipped == st[0].n_clipped);
            CHECK_NEAR(st[k].loss, st[0].loss, 1e-6 * fabs(st[0].loss));
        }
    for (int k = 0; k < 3; k++) free(g[k][0]), free(g[k][1]);
    xfixture_free(&f);
}

TEST(train_experts_freeze_one) {
    xfixture f;
    xfixture_build(&f, 0.01f, 1);
    trainer_batch b = xbatch(&f);
    wan_model *pol[2] = {&f.pol[0], &f.pol[1]};
    const wan_model *ref[2] = {&f.ref[0], &f.ref[1]};
    const int64_t n = f.pol[0].layout.numel;
    const uint8_t trained[2] = {1, 0};
    /* Denominator and selection: only expert 0's steps. */
    int64_t cnt = -1, cnt_all = -1;
    grpo_selection sel;
    REQUIRE_OK(grpo_selection_parse("all", &sel));
    REQUIRE_OK(grpo_count_transitions_experts(&sel, XSTEPS, f.traj[0].has_log_prob, f.traj[0].expert, 0, XN, trained, 2,
                                              &cnt));
    REQUIRE_OK(grpo_count_transitions_experts(&sel, XSTEPS, f.traj[0].has_log_prob, f.traj[0].expert, 0, XN, NULL, 2,
                                              &cnt_all));
    CHECK(cnt == XN * f.n_hi && cnt_all == XN * XSTEPS);
    /* Sentinels: expert 1's grads and params must come back untouched. */
    for (int64_t i = 0; i < n; i++) f.pol[1].grads[i] = 7.0f + (float)(i % 13);
    float *p1 = dup(f.pol[1].params, n), *gs1 = dup(f.pol[1].grads, n), *p0 = dup(f.pol[0].params, n);
    optim_adamw o0, o1;
    REQUIRE_OK(optim_adamw_init(&o0, n));
    REQUIRE_OK(optim_adamw_init(&o1, n));
    optim_adamw *opt[2] = {&o0, &o1};
    optim_config oc = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                       .max_grad_norm = 0, .schedule = OPTIM_SCHED_CONSTANT};
    trainer_config tc = xconfig("all", 0.5f, 5, WAN_ACTS_STORE);
    grpo_loss_stats st = {0};
    optim_step_info info;
    REQUIRE_OK(trainer_update_experts(pol, ref, 2, trained, NULL, &tc, &b, opt, &oc, &st, &info));
    CHECK(st.n_transitions == cnt);
    CHECK(memcmp(f.pol[1].params, p1, sizeof(float) * n) == 0);
    CHECK(memcmp(f.pol[1].grads, gs1, sizeof(float) * n) == 0);
    CHECK(o1.step == 0 && l2(o1.m, n) == 0 && l2(o1.v, n) == 0);
    CHECK(o0.step == 1 && memcmp(f.pol[0].params, p0, sizeof(float) * n) != 0);
    /* The grad norm is expert 0's alone (not the sentinels'), and expert 0's gradient is the one-expert trainer's
     * with the denominator of expert 0's transitions (no clipping: the grads are as accumulated). */
    CHECK_NEAR(info.grad_norm, l2(f.pol[0].grads, n), 1e-9 * info.grad_norm);
    CHECK(info.clip_coef == 1.0 && info.lr == 1e-3);
    float *g0 = dup(f.pol[0].grads, n);
    memcpy(f.pol[0].params, p0, sizeof(float) * n);
    {
        core_traj v[XN];
        views_of_expert(&f, 0, v);
        trainer_batch be = b;
        be.traj = v;
        grpo_loss_stats s1 = {0};
        wan_model_zero_grads(&f.pol[0]);
        REQUIRE_OK(trainer_accumulate(&f.pol[0], &f.ref[0], NULL, &tc, &be, 1, &s1)); /* denom: counted = cnt */
        CHECK(s1.n_transitions == cnt);
        CHECK(memcmp(f.pol[0].grads, g0, sizeof(float) * n) == 0);
        CHECK_NEAR(s1.loss, st.loss, 1e-6 * fabs(st.loss));
        /* with the all-expert denominator the gradient is smaller by cnt / cnt_all: the denominator matters */
        be.denom = cnt_all;
        wan_model_zero_grads(&f.pol[0]);
        REQUIRE_OK(trainer_accumulate(&f.pol[0], &f.ref[0], NULL, &tc, &be, 1, &s1));
        CHECK_NEAR(l2(f.pol[0].grads, n) / l2(g0, n), (double)cnt / (double)cnt_all, 1e-5);
        views_free(v);
    }
    /* random_k 1 with expert 1 frozen: one step per sample, drawn among expert 0's steps. */
    {
        trainer_config tk = xconfig("random_k 1", 0.0f, 4, WAN_ACTS_STORE);
        grpo_loss_stats sk = {0};
        wan_model_zero_grads(&f.pol[0]);
        REQUIRE_OK(trainer_accumulate_experts(pol, NULL, 2, trained, NULL, &tk, &b, 1, &sk));
        CHECK(sk.n_transitions == XN);
        CHECK(memcmp(f.pol[1].grads, gs1, sizeof(float) * n) == 0);
        int steps[XSTEPS], k = 0;
        for (int s = 0; s < XN; s++) {
            REQUIRE_OK(grpo_select_steps_experts(&tk.sel, XSTEPS, f.traj[s].has_log_prob, f.traj[s].expert, trained, 2,
                                                 tk.seed, (uint32_t)f.traj[s].uid, steps, &k));
            CHECK(k == 1 && f.traj[s].expert[steps[0]] == 0);
        }
    }
    /* Freezing expert 0 with first_fraction covering only its steps leaves nothing to train: refused, named. */
    {
        char buf[48];
        snprintf(buf, sizeof buf, "first_fraction %g", (double)f.n_hi / XSTEPS);
        trainer_config tf = xconfig(buf, 0.0f, 4, WAN_ACTS_STORE);
        const uint8_t only1[2] = {0, 1};
        grpo_loss_stats sf = {0};
        CHECK(trainer_accumulate_experts(pol, NULL, 2, only1, NULL, &tf, &b, 1, &sf) == -1);
        CHECK(strstr(core_last_error(), "algorithm.train_experts") && strstr(core_last_error(), "expert 0"));
    }
    optim_adamw_free(&o0), optim_adamw_free(&o1);
    free(p1), free(gs1), free(p0), free(g0);
    xfixture_free(&f);
}

TEST(train_experts_global_clip) {
    xfixture f;
    xfixture_build(&f, 0.01f, 1);
    trainer_batch b = xbatch(&f);
    wan_model *pol[2] = {&f.pol[0], &f.pol[1]};
    const wan_model *ref[2] = {&f.ref[0], &f.ref[1]};
    const int64_t n = f.pol[0].layout.numel;
    trainer_config tc = xconfig("random_k 3", 0.5f, 8, WAN_ACTS_STORE);
    zero2(&f);
    grpo_loss_stats st = {0};
    REQUIRE_OK(trainer_accumulate_experts(pol, ref, 2, NULL, NULL, &tc, &b, 1, &st));
    CHECK(st.n_transitions == XN * 3);
    float *g[2] = {dup(f.pol[0].grads, n), dup(f.pol[1].grads, n)};
    float *p[2] = {dup(f.pol[0].params, n), dup(f.pol[1].params, n)};
    /* Hand: one norm over both experts, sequential double sums. */
    double ss[2] = {0, 0};
    for (int e = 0; e < 2; e++)
        for (int64_t i = 0; i < n; i++) ss[e] += (double)g[e][i] * g[e][i];
    const double norm = sqrt(ss[0] + ss[1]), max_norm = 0.25 * sqrt(ss[0] < ss[1] ? ss[0] : ss[1]);
    const double coef = max_norm / (norm + 1e-6);
    REQUIRE(ss[0] > 0 && ss[1] > 0 && coef < 0.25);
    optim_adamw o0, o1;
    REQUIRE_OK(optim_adamw_init(&o0, n));
    REQUIRE_OK(optim_adamw_init(&o1, n));
    optim_adamw *opt[2] = {&o0, &o1};
    const double lr = 2e-3, eps = 1e-3, b1 = 0.9, b2 = 0.999;
    optim_config oc = {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .max_grad_norm = max_norm,
                       .schedule = OPTIM_SCHED_CONSTANT};
    optim_step_info info;
    REQUIRE_OK(trainer_update_experts(pol, ref, 2, NULL, NULL, &tc, &b, opt, &oc, NULL, &info));
    CHECK_NEAR(info.grad_norm, norm, 1e-12 * norm);
    CHECK_NEAR(info.clip_coef, coef, 1e-12 * coef);
    CHECK(info.lr == lr && o0.step == 1 && o1.step == 1);
    /* Both experts' grads scaled by the ONE global factor (in place, as torch), and the first AdamW step by hand:
     * m = (1-b1) gc, v = (1-b2) gc^2, p -= lr/(1-b1) * m / (sqrt(v)/sqrt(1-b2) + eps) = lr * gc / (|gc| + eps);
     * eps is large enough for the step to depend on the clipped gradient's size. */
    double max_g = 0, max_p = 0, max_step = 0; /* max_p: param error over its tolerance */
    for (int e = 0; e < 2; e++)
        for (int64_t i = 0; i < n; i++) {
            const double gc = (double)g[e][i] * coef;
            const double dg = fabs(f.pol[e].grads[i] - gc) / (fabs(gc) + 1e-30);
            const double want = (double)p[e][i] - lr * gc / (fabs(gc) + eps);
            /* fp32 result: half an ulp of p, plus the update's own fp32 rounding */
            const double dp = fabs(f.pol[e].params[i] - want) /
                              (1.2e-7 * fabs(want) + 1e-6 * fabs(want - p[e][i]) + 1e-12);
            if (dg > max_g) max_g = dg;
            if (dp > max_p) max_p = dp;
            if (fabs(want - p[e][i]) > max_step) max_step = fabs(want - p[e][i]);
        }
    if (getenv("VGRPO_VERBOSE"))
        fprintf(stderr, "  norm %.9g coef %.6g: max rel grad err %.3g, max param err/tol %.3g (largest step %.3g)\n",
                norm, coef, max_g, max_p, max_step);
    CHECK_MSG(max_g <= 1e-6, "clipped gradient: max relative error %.3g", max_g);
    CHECK_MSG(max_p <= 1.0, "AdamW step: max param error / tolerance %.3g", max_p);
    CHECK(max_step > 0.1 * lr && max_step < lr);
    /* Per-expert clipping (each by its own norm) would give a different factor: the global one is really used. */
    CHECK(fabs(max_norm / (sqrt(ss[0]) + 1e-6) - coef) > 0.05 * coef);
    optim_adamw_free(&o0), optim_adamw_free(&o1);
    for (int e = 0; e < 2; e++) free(g[e]), free(p[e]);
    xfixture_free(&f);
}

/* A gradient hook standing in for data parallelism over two identical ranks: doubles the trained experts' grads and
 * the statistics; ctx receives the norm it saw (expert 0). A negative *ctx makes it fail. */
static int hook_calls;
static int twice_hook(void *ctx, wan_model *const *policy, int n_experts, const uint8_t *trained, grpo_loss_stats *st) {
    hook_calls++;
    double *seen = ctx;
    if (*seen < 0) return core_error("hook: refused");
    *seen = l2(policy[0]->grads, policy[0]->layout.numel);
    for (int e = 0; e < n_experts; e++)
        if (!trained || trained[e])
            for (int64_t i = 0; i < policy[e]->layout.numel; i++) policy[e]->grads[i] *= 2.0f;
    st->n_transitions *= 2, st->loss *= 2;
    return 0;
}

TEST(train_experts_errors_and_helpers) {
    xfixture f;
    xfixture_build(&f, 0.0f, 0);
    trainer_batch b = xbatch(&f);
    wan_model *pol[2] = {&f.pol[0], &f.pol[1]};
    trainer_config tc = xconfig("all", 0.0f, 4, WAN_ACTS_STORE);
    grpo_loss_stats st = {0};
    /* the one-expert API refuses a two-expert rollout, naming the expert */
    CHECK(trainer_accumulate(&f.pol[0], NULL, NULL, &tc, &b, 1, &st) == -1);
    CHECK(strstr(core_last_error(), "expert 1") != NULL);
    const uint8_t none[2] = {0, 0}, bad[2] = {1, 2};
    CHECK(trainer_accumulate_experts(pol, NULL, 2, none, NULL, &tc, &b, 1, &st) == -1);
    CHECK(strstr(core_last_error(), "algorithm.train_experts") != NULL);
    CHECK(trainer_accumulate_experts(pol, NULL, 2, bad, NULL, &tc, &b, 1, &st) == -1);
    CHECK(trainer_accumulate_experts(pol, NULL, 3, NULL, NULL, &tc, &b, 1, &st) == -1);
    trainer_config tb = xconfig("all", 0.1f, 4, WAN_ACTS_STORE);
    const wan_model *half[2] = {&f.ref[0], NULL};
    CHECK(trainer_accumulate_experts(pol, half, 2, NULL, NULL, &tb, &b, 1, &st) == -1);
    CHECK(strstr(core_last_error(), "reference") && strstr(core_last_error(), "transformer_2"));
    const uint8_t only0[2] = {1, 0};
    CHECK(trainer_accumulate_experts(pol, half, 2, only0, NULL, &tb, &b, 0, &st) == 0); /* frozen: no ref needed */
    /* optimizers at different steps are refused before anything changes */
    const int64_t n = f.pol[0].layout.numel;
    optim_adamw o0, o1;
    REQUIRE_OK(optim_adamw_init(&o0, n));
    REQUIRE_OK(optim_adamw_init(&o1, n));
    o1.step = 3;
    optim_adamw *opt[2] = {&o0, &o1};
    optim_config oc = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .schedule = OPTIM_SCHED_CONSTANT};
    float *p0 = dup(f.pol[0].params, n);
    CHECK(trainer_update_experts(pol, NULL, 2, NULL, NULL, &tc, &b, opt, &oc, NULL, NULL) == -1);
    CHECK(strstr(core_last_error(), "different steps") != NULL);
    CHECK(memcmp(p0, f.pol[0].params, sizeof(float) * n) == 0 && o0.step == 0);
    optim_adamw *opt1[2] = {&o0, NULL}; /* a frozen expert needs no optimizer state */
    CHECK(trainer_update_experts(pol, NULL, 2, only0, NULL, &tc, &b, opt1, &oc, NULL, NULL) == 0 && o0.step == 1);
    /* the denominator of a whole batch, and the gradient hook (frozen expert 1: only expert 0's grads) */
    int64_t cnt = 0;
    REQUIRE_OK(trainer_count_transitions(&tc, &b, 2, only0, &cnt));
    CHECK(cnt == XN * f.n_hi);
    REQUIRE_OK(trainer_count_transitions(&tc, &b, 2, NULL, &cnt));
    CHECK(cnt == XN * XSTEPS);
    CHECK(trainer_count_transitions(&tc, &b, 1, NULL, &cnt) == -1 && strstr(core_last_error(), "expert 1"));
    {
        double seen = 0;
        trainer_config th = tc;
        th.grad_reduce = twice_hook, th.grad_reduce_ctx = &seen;
        optim_step_info info;
        grpo_loss_stats sh = {0};
        hook_calls = 0;
        REQUIRE_OK(trainer_update_experts(pol, NULL, 2, only0, NULL, &th, &b, opt1, &oc, &sh, &info));
        CHECK(hook_calls == 1 && seen > 0);
        CHECK_NEAR(info.grad_norm, 2 * seen, 1e-12 * seen); /* the norm is taken after the hook */
        CHECK(sh.n_transitions == 2 * XN * f.n_hi && o0.step == 2);
        seen = -1;
        memcpy(p0, f.pol[0].params, sizeof(float) * n);
        CHECK(trainer_update_experts(pol, NULL, 2, only0, NULL, &th, &b, opt1, &oc, &sh, &info) == -1);
        CHECK(strstr(core_last_error(), "hook: refused") && o0.step == 2);
        CHECK(memcmp(p0, f.pol[0].params, sizeof(float) * n) == 0);
    }
    /* helpers */
    uint8_t m[4];
    const uint8_t hl[4] = {1, 1, 0, 1}, ex[4] = {0, 1, 1, 1}, ex_bad[4] = {0, 2, 0, 0};
    REQUIRE_OK(grpo_trainable_steps(4, hl, ex, (const uint8_t[]){0, 1}, 2, m));
    CHECK(m[0] == 0 && m[1] == 1 && m[2] == 0 && m[3] == 1);
    REQUIRE_OK(grpo_trainable_steps(4, NULL, ex, NULL, 2, m));
    CHECK(m[0] && m[1] && m[2] && m[3]);
    CHECK(grpo_trainable_steps(4, hl, ex_bad, NULL, 2, m) == -1 && strstr(core_last_error(), "step 1"));
    CHECK(grpo_trainable_steps(4, hl, ex, NULL, 1, m) == -1); /* expert 1 in a one-expert model */
    const float ga[2] = {3.0f, 0.0f}, gb[1] = {4.0f};
    const float *gg[2] = {ga, gb};
    const int64_t gn[2] = {2, 1};
    CHECK(optim_grad_norm_multi(gg, gn, 2) == 5.0);
    CHECK(optim_grad_norm_multi(gg, gn, 1) == optim_grad_norm(ga, 2));
    free(p0);
    optim_adamw_free(&o0), optim_adamw_free(&o1);
    xfixture_free(&f);
}

/* `vgrpo init-model --preset tiny --experts 2`: transformer_2/ with seed + 1, listed as diffusers lists it. */
TEST(train_experts_init_model_cli) {
    const char *tmp = test_tmpdir();
    char out[8192], dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/tiny2", tmp);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --experts 2 --seed 5 --out %s", test_vgrpo_bin(),
                     dir) == 0);
    CHECK(strstr(out, "two experts") != NULL);
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    FILE *fp = fopen(path, "rb");
    REQUIRE(fp);
    static char mi[1 << 14];
    mi[fread(mi, 1, sizeof mi - 1, fp)] = 0;
    fclose(fp);
    CHECK(strstr(mi, "\"boundary_ratio\": 0.875") && strstr(mi, "\"transformer_2\": [\n    \"diffusers\",\n    "
                                                                 "\"WanTransformer3DModel\""));
    wan_config tiny;
    REQUIRE_OK(wan_config_preset(&tiny, "tiny"));
    for (int e = 0; e < 2; e++) {
        wan_model m, want;
        snprintf(path, sizeof path, "%s/%s", dir, e ? "transformer_2" : "transformer");
        REQUIRE_OK(wan_model_load(&m, path));
        REQUIRE_OK(wan_model_init(&want, &tiny));
        wan_params_init_random(&want, 5 + (uint64_t)e);
        CHECK(wan_config_equal(&m.cfg, &tiny));
        CHECK_MSG(memcmp(m.params, want.params, sizeof(float) * m.layout.numel) == 0, "expert %d: not seed %d", e, 5 + e);
        wan_model_free(&m), wan_model_free(&want);
    }
    /* one expert: no transformer_2; a real one-expert preset refuses --experts 2, the A14B preset --experts 1 */
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --experts 1 --out %s --force", test_vgrpo_bin(),
                     dir) == 0);
    snprintf(path, sizeof path, "%s/transformer_2", dir);
    FILE *t2 = fopen(path, "rb");
    CHECK(t2 == NULL);
    if (t2) fclose(t2);
    CHECK(test_run(out, sizeof out, "%s init-model --preset wan2.1-t2v-1.3b --experts 2 --out %s/x", test_vgrpo_bin(),
                   tmp) == 2 && strstr(out, "--experts 2"));
    CHECK(test_run(out, sizeof out, "%s init-model --preset wan2.2-t2v-a14b --experts 1 --out %s/y", test_vgrpo_bin(),
                   tmp) == 2);
    CHECK(test_run(out, sizeof out, "%s init-model --preset tiny --experts 3 --out %s/z", test_vgrpo_bin(), tmp) == 2);
}
