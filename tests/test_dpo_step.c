/* tests/test_dpo_step.c — online Flow-DPO's training pass on the real tiny Wan DiT (trainer/step/dpo_step.*), fed by
 * ODE rollouts (eta 0, guidance 1: no log-prob anywhere): B = 2 prompts x G = 3 samples, latent 16 x 2 x 8 x 8,
 * 5 steps, pairs by dpo_select_pairs. Checks: (1) the parameter gradient is the DiT backward of dpo_loss_terms' dv of
 * both samples: central finite differences of sum_t (dv_w . v_w + dv_l . v_l)(params) along the gradient; (2) the loss
 * is the same for every micro-batch size and the gradient within summation order, the pass is deterministic, the
 * update index changes the noise, the global denominator scales the loss; (3) on the first update (policy == a frozen
 * copy) z = 0 for every term, the loss is log 2, the gradient is not 0; (4) under LoRA the reference is the policy's
 * base with its adapter off, the same numbers as a separate frozen copy; (5) errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"
#include "model/text/word_embed.h"
#include "rollout/engine.h"
#include "tests/test.h"
#include "trainer/step/dpo_step.h"

#define DL_ 4
#define DB 2
#define DG 3
#define DS (DB * DG)
#define DSTEPS 5

typedef struct {
    wan_model ref, pol;
    float *emb;
    const float *cond[DS];
    core_traj traj[DS];
    dpo_pair pairs[DB * DG * (DG - 1) / 2];
    int n_pairs;
} dfix;

/* ref: random tiny weights; pol = ref + N(0, delta^2). ODE rollouts by the reference; pairs by rule. */
static void dfix_build(dfix *f, float delta, dpo_pair_rule rule) {
    memset(f, 0, sizeof *f);
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    REQUIRE_OK(wan_model_init(&f->ref, &c));
    REQUIRE_OK(wan_model_init(&f->pol, &c));
    wan_params_init_random(&f->ref, 12);
    const int64_t n = f->ref.layout.numel;
    memcpy(f->pol.params, f->ref.params, sizeof(float) * n);
    if (delta > 0) {
        float *z = malloc(sizeof(float) * n);
        core_philox_normal(z, n, 98, 0, 0, 7);
        for (int64_t k = 0; k < n; k++) f->pol.params[k] += delta * z[k];
        free(z);
    }
    REQUIRE_OK(wan_model_alloc_grads(&f->pol));
    const int td = c.text_dim;
    f->emb = malloc(sizeof(float) * DB * DL_ * td);
    REQUIRE_OK(wan_word_embed("a red ball", DL_, td, f->emb));
    REQUIRE_OK(wan_word_embed("green grass", DL_, td, f->emb + DL_ * td));
    uint64_t uids[DS];
    int64_t pidx[DS];
    for (int s = 0; s < DS; s++) f->cond[s] = f->emb + (s / DG) * DL_ * td, uids[s] = 300 + s, pidx[s] = s / DG;
    rollout_config rc;
    const int64_t shape[4] = {16, 2, 8, 8};
    REQUIRE_OK(rollout_config_init(&rc, DSTEPS, 3.0, 0.0f, 1.0f, shape, DL_, 2025, 3));
    REQUIRE_OK(rollout_generate(&rc, &(rollout_experts){1, {&f->ref, NULL}}, NULL, DS, f->cond, uids, pidx, f->traj));
    const float rewards[DS] = {0.1f, 0.7f, 0.4f, 0.5f, 0.2f, 0.9f};
    REQUIRE_OK(dpo_select_pairs(rewards, DB, DG, rule, 0.0f, f->pairs, &f->n_pairs));
}

static void dfix_free(dfix *f) {
    for (int s = 0; s < DS; s++) core_traj_free(&f->traj[s]);
    wan_model_free(&f->ref), wan_model_free(&f->pol);
    free(f->emb);
}

static dpo_batch dfix_batch(dfix *f) {
    return (dpo_batch){.n = DS, .traj = f->traj, .cond = f->cond, .text_len = DL_, .n_pairs = f->n_pairs,
                       .pairs = f->pairs};
}

static dpo_step_config dconfig(const char *sel, int mb) {
    dpo_step_config c = {.seed = 9, .dpo_beta = 500.0f, .micro_batch_size = mb, .acts_mode = WAN_ACTS_STORE};
    if (grpo_selection_parse(sel, &c.sel)) test_fail(__FILE__, __LINE__, "%s", core_last_error());
    return c;
}

static double l2(const float *a, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s);
}

/* Probe state: records dv of both samples of every term in call order (mode 0), or accumulates
 * sum dv_w . v_w + dv_l . v_l (mode 1). */
typedef struct {
    int mode, k, cap;
    float *dv; /* [cap, 2, nl] */
    double dot;
} probe_st;

static void probe(void *ctx, int pair, int step, const float *vw, const float *vl, const float *dvw,
                  const float *dvl, int64_t nl) {
    (void)pair, (void)step;
    probe_st *p = ctx;
    if (p->k >= p->cap) return;
    float *r = p->dv + (int64_t)p->k * 2 * nl;
    if (p->mode == 0) {
        memcpy(r, dvw, sizeof(float) * (size_t)nl);
        memcpy(r + nl, dvl, sizeof(float) * (size_t)nl);
    } else
        for (int64_t i = 0; i < nl; i++) p->dot += (double)r[i] * vw[i] + (double)r[nl + i] * vl[i];
    p->k++;
}

TEST(dpo_step_gradient_is_dit_backward_of_dv) {
    dfix f;
    dfix_build(&f, 0.02f, DPO_PAIRS_ALL);
    REQUIRE(f.n_pairs == 6);
    dpo_batch b = dfix_batch(&f);
    dpo_step_config c = dconfig("random_k 2", 4);
    const int64_t n = f.pol.layout.numel, nl = core_traj_latent_numel(&f.traj[0]);
    probe_st ps = {.mode = 0, .cap = 6 * 2};
    ps.dv = malloc(sizeof(float) * (size_t)(ps.cap * 2 * nl));
    c.probe = probe, c.probe_ctx = &ps;
    dpo_loss_stats st = {0};
    wan_model_zero_grads(&f.pol);
    REQUIRE_OK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b, 1, &st));
    CHECK(st.n_terms == 12 && ps.k == 12);
    CHECK(st.loss > 0 && st.margin_sum != 0 && st.err_w_sum > 0 && st.ref_l_sum > 0);
    float *g = malloc(sizeof(float) * n), *p0 = malloc(sizeof(float) * n);
    memcpy(g, f.pol.grads, sizeof(float) * n);
    memcpy(p0, f.pol.params, sizeof(float) * n);
    const double gn = l2(g, n);
    REQUIRE(gn > 0);
    /* S(p) = sum_t dv_t . v_t(p) with dv frozen: dS/dp is what the backward computes. Central difference along g. */
    const double h = 0.01;
    double s[2], pred = 0;
    for (int side = 0; side < 2; side++) {
        const double sg = side ? -1.0 : 1.0;
        for (int64_t i = 0; i < n; i++) f.pol.params[i] = p0[i] + (float)(sg * h * g[i] / gn);
        for (int64_t i = 0; i < n; i++) pred += sg * (double)g[i] * (double)f.pol.params[i];
        ps.mode = 1, ps.k = 0, ps.dot = 0;
        dpo_loss_stats tmp = {0};
        REQUIRE_OK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b, 0, &tmp));
        s[side] = ps.dot;
    }
    memcpy(f.pol.params, p0, sizeof(float) * n);
    const double fd = s[0] - s[1], rel = fabs(fd - pred) / fabs(pred);
    if (getenv("VGRPO_VERBOSE")) fprintf(stderr, "  dpo chain: fd %.9g pred %.9g rel %.3g\n", fd, pred, rel);
    CHECK_MSG(rel < 2e-3, "finite difference %.9g vs gradient %.9g (rel %.3g)", fd, pred, rel);
    free(g), free(p0), free(ps.dv);
    dfix_free(&f);
}

TEST(dpo_step_split_invariance_and_determinism) {
    dfix f;
    dfix_build(&f, 0.02f, DPO_PAIRS_ALL);
    dpo_batch b = dfix_batch(&f);
    const int64_t n = f.pol.layout.numel;
    const int mbs[3] = {12, 5, 1};
    float *g[3];
    dpo_loss_stats st[3];
    for (int k = 0; k < 3; k++) {
        dpo_step_config c = dconfig("random_k 2", mbs[k]);
        memset(&st[k], 0, sizeof st[k]);
        wan_model_zero_grads(&f.pol);
        REQUIRE_OK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b, 1, &st[k]));
        g[k] = malloc(sizeof(float) * n);
        memcpy(g[k], f.pol.grads, sizeof(float) * n);
    }
    const double gn = l2(g[0], n);
    CHECK(gn > 0);
    for (int k = 1; k < 3; k++) {
        CHECK_MSG(st[k].loss == st[0].loss, "micro-batch %d: loss %.17g vs %.17g", mbs[k], st[k].loss, st[0].loss);
        CHECK(st[k].margin_sum == st[0].margin_sum && st[k].n_positive == st[0].n_positive);
        float *d = malloc(sizeof(float) * n);
        for (int64_t i = 0; i < n; i++) d[i] = g[k][i] - g[0][i];
        CHECK_MSG(l2(d, n) / gn <= 1e-5, "micro-batch %d: relative L2 %.3g", mbs[k], l2(d, n) / gn);
        free(d);
    }
    /* the same call again: the same bits; another update index: other noise, another loss */
    dpo_step_config c = dconfig("random_k 2", 12);
    dpo_loss_stats again = {0}, other = {0};
    wan_model_zero_grads(&f.pol);
    REQUIRE_OK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b, 1, &again));
    CHECK(again.loss == st[0].loss && memcmp(f.pol.grads, g[0], sizeof(float) * n) == 0);
    c.update = 1;
    REQUIRE_OK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b, 0, &other));
    CHECK(other.loss != st[0].loss);
    /* the global denominator: twice the count halves the loss */
    int64_t cnt = 0;
    c.update = 0;
    REQUIRE_OK(dpo_count_terms(&c, &b, &cnt));
    CHECK(cnt == 6 * 2);
    dpo_batch b2 = b;
    b2.denom = 2 * cnt;
    dpo_loss_stats half = {0};
    REQUIRE_OK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b2, 0, &half));
    CHECK_NEAR(half.loss, 0.5 * st[0].loss, 1e-12 * st[0].loss);
    /* a batch without pairs trains nothing */
    dpo_batch b0 = b;
    b0.n_pairs = 0;
    dpo_loss_stats none = {0};
    wan_model_zero_grads(&f.pol);
    REQUIRE_OK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b0, 1, &none));
    CHECK(none.n_terms == 0 && none.loss == 0.0 && l2(f.pol.grads, n) == 0.0);
    for (int k = 0; k < 3; k++) free(g[k]);
    dfix_free(&f);
}

/* policy == reference (a separate frozen copy, equal weights): every term has z = 0 exactly, the loss is log 2 per
 * term, no pair is "positive", and the gradient is not 0 (sigmoid(0) = 1/2 of beta (v - target) / M). */
TEST(dpo_step_first_update) {
    dfix f;
    dfix_build(&f, 0.0f, DPO_PAIRS_BEST_WORST);
    REQUIRE(f.n_pairs == 2);
    dpo_batch b = dfix_batch(&f);
    dpo_step_config c = dconfig("all", 3);
    dpo_loss_stats st = {0};
    wan_model_zero_grads(&f.pol);
    REQUIRE_OK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b, 1, &st));
    CHECK(st.n_terms == 2 * DSTEPS && st.margin_sum == 0.0 && st.n_positive == 0);
    CHECK_NEAR(st.loss, log(2.0), 1e-15);
    CHECK(st.err_w_sum == st.ref_w_sum && st.err_l_sum == st.ref_l_sum);
    CHECK(l2(f.pol.grads, f.pol.layout.numel) > 0);
    dfix_free(&f);
}

/* Under LoRA the reference may be the policy itself: its base with the adapter switched off. The loss and margins
 * are those of a pass against a separate copy of the base; the gradient goes to the adapter. */
TEST(dpo_step_lora_reference_is_base) {
    dfix f;
    dfix_build(&f, 0.0f, DPO_PAIRS_ALL);
    dpo_batch b = dfix_batch(&f);
    dpo_step_config c = dconfig("random_k 2", 4);
    wan_model pol;
    REQUIRE_OK(wan_model_init(&pol, &f.ref.cfg));
    memcpy(pol.params, f.ref.params, sizeof(float) * f.ref.layout.numel);
    const wan_lora_config lc = {.rank = 2, .alpha = 2, .targets = WAN_LORA_ALL_BLOCK, .init_seed = 1};
    wan_lora l;
    REQUIRE_OK(wan_lora_init(&l, &pol.cfg, &lc, 0));
    float *z = malloc(sizeof(float) * l.layout.numel);
    core_philox_normal(z, l.layout.numel, 5, 0, 0, 7);
    for (int64_t k = 0; k < l.layout.numel; k++) l.params[k] += 0.05f * z[k]; /* B != 0: the adapter acts */
    free(z);
    REQUIRE_OK(wan_lora_alloc_grads(&l));
    REQUIRE_OK(wan_model_attach_lora(&pol, &l));
    dpo_loss_stats self = {0}, sep = {0};
    wan_lora_zero_grads(&l);
    REQUIRE_OK(dpo_accumulate(&pol, &pol, NULL, &c, &b, 1, &self));
    REQUIRE_OK(dpo_accumulate(&pol, &f.ref, NULL, &c, &b, 0, &sep));
    CHECK(self.n_terms == 12 && self.loss == sep.loss && self.margin_sum == sep.margin_sum);
    CHECK(self.margin_sum != 0.0 && self.ref_w_sum == sep.ref_w_sum);
    CHECK(l2(l.grads, l.layout.numel) > 0);
    /* without an adapter the policy cannot be its own reference */
    dpo_loss_stats st = {0};
    CHECK(dpo_accumulate(&f.pol, &f.pol, NULL, &c, &b, 0, &st) == -1 && strstr(core_last_error(), "LoRA"));
    wan_model_attach_lora(&pol, NULL);
    wan_lora_free(&l);
    wan_model_free(&pol);
    dfix_free(&f);
}

TEST(dpo_step_errors) {
    dfix f;
    dfix_build(&f, 0.0f, DPO_PAIRS_BEST_WORST);
    dpo_batch b = dfix_batch(&f);
    dpo_step_config c = dconfig("all", 2);
    dpo_loss_stats st = {0};
    CHECK(dpo_accumulate(&f.pol, NULL, NULL, &c, &b, 0, &st) == -1 && strstr(core_last_error(), "reference"));
    c.dpo_beta = 0.0f;
    CHECK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b, 0, &st) == -1 && strstr(core_last_error(), "algorithm.dpo_beta"));
    c.dpo_beta = 100.0f;
    c.micro_batch_size = 0;
    CHECK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b, 0, &st) == -1 &&
          strstr(core_last_error(), "algorithm.micro_batch_size"));
    c.micro_batch_size = 2;
    dpo_pair bad[2] = {{0, 0, 1.0f}, {1, 2, 1.0f}};
    dpo_batch bb = b;
    bb.pairs = bad;
    CHECK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &bb, 0, &st) == -1 && strstr(core_last_error(), "pair 0"));
    bad[0] = (dpo_pair){0, DS, 1.0f};
    CHECK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &bb, 0, &st) == -1 && strstr(core_last_error(), "pair 0"));
    int64_t cnt;
    CHECK(dpo_count_terms(&c, &bb, &cnt) == -1 && strstr(core_last_error(), "pair 0"));
    /* two samples of a pair on other schedules */
    bad[0] = (dpo_pair){0, 1, 1.0f};
    const float keep = f.traj[1].sigmas[2];
    f.traj[1].sigmas[2] = keep * 0.5f;
    CHECK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &bb, 0, &st) == -1 && strstr(core_last_error(), "schedules"));
    f.traj[1].sigmas[2] = keep;
    c = dconfig("random_k 9", 2); /* more steps than the trajectories have */
    CHECK(dpo_accumulate(&f.pol, &f.ref, NULL, &c, &b, 0, &st) == -1);
    dfix_free(&f);
}
