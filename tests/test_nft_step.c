/* tests/test_nft_step.c — DiffusionNFT's training pass on the real tiny Wan DiT (trainer/step/nft_step.*), fed by ODE
 * rollouts (eta 0, guidance 1: no log-prob anywhere): B = 2 prompts x G = 3 samples, latent 16 x 2 x 8 x 8, 5 steps.
 * Checks: (1) the parameter gradient is the DiT backward of nft_loss_terms' dv: central finite differences of
 * sum_t dv_t . v_t(params) along the gradient; (2) the loss is the same for every micro-batch size and the gradient
 * within summation order; (3) on the first update (old == policy) the gradient is exactly 0 when every r is 1/2 and
 * not otherwise; the forward noise is deterministic and changes with the update index; (4) errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "model/dit/wan_dit.h"
#include "model/text/word_embed.h"
#include "rollout/engine.h"
#include "tests/test.h"
#include "trainer/step/nft_step.h"

#define NL_ 4
#define NB 2
#define NG 3
#define NS (NB * NG)
#define NSTEPS 5

typedef struct {
    wan_model ref, pol, old;
    float *emb;
    const float *cond[NS];
    core_traj traj[NS];
    float r[NS];
} nfix;

/* ref: random tiny weights; old = ref; pol = ref + N(0, delta^2). ODE rollouts by the reference. */
static void nfix_build(nfix *f, float delta) {
    memset(f, 0, sizeof *f);
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    REQUIRE_OK(wan_model_init(&f->ref, &c));
    REQUIRE_OK(wan_model_init(&f->pol, &c));
    REQUIRE_OK(wan_model_init(&f->old, &c));
    wan_params_init_random(&f->ref, 12);
    const int64_t n = f->ref.layout.numel;
    memcpy(f->pol.params, f->ref.params, sizeof(float) * n);
    memcpy(f->old.params, f->ref.params, sizeof(float) * n);
    if (delta > 0) {
        float *z = malloc(sizeof(float) * n);
        core_philox_normal(z, n, 98, 0, 0, 7);
        for (int64_t k = 0; k < n; k++) f->pol.params[k] += delta * z[k];
        free(z);
    }
    REQUIRE_OK(wan_model_alloc_grads(&f->pol));
    const int td = c.text_dim;
    f->emb = malloc(sizeof(float) * NB * NL_ * td);
    REQUIRE_OK(wan_word_embed("a red ball", NL_, td, f->emb));
    REQUIRE_OK(wan_word_embed("green grass", NL_, td, f->emb + NL_ * td));
    uint64_t uids[NS];
    int64_t pidx[NS];
    for (int s = 0; s < NS; s++) f->cond[s] = f->emb + (s / NG) * NL_ * td, uids[s] = 200 + s, pidx[s] = s / NG;
    rollout_config rc;
    const int64_t shape[4] = {16, 2, 8, 8};
    REQUIRE_OK(rollout_config_init(&rc, NSTEPS, 3.0, 0.0f, 1.0f, shape, NL_, 2025, 3));
    REQUIRE_OK(rollout_generate(&rc, &(rollout_experts){1, {&f->ref, NULL}}, NULL, NS, f->cond, uids, pidx, f->traj));
    const float rewards[NS] = {0.1f, 0.7f, 0.4f, 0.5f, 0.2f, 0.9f};
    float adv[NS];
    uint8_t mask[NS];
    REQUIRE_OK(grpo_advantages(rewards, NB, NG, GRPO_STD_BATCH, 5.0f, adv, mask, NULL));
    REQUIRE_OK(nft_optimality(adv, NS, 5.0f, f->r));
}

static void nfix_free(nfix *f) {
    for (int s = 0; s < NS; s++) core_traj_free(&f->traj[s]);
    wan_model_free(&f->ref), wan_model_free(&f->pol), wan_model_free(&f->old);
    free(f->emb);
}

static nft_batch nfix_batch(nfix *f) {
    return (nft_batch){.n = NS, .traj = f->traj, .cond = f->cond, .text_len = NL_, .r = f->r};
}

static nft_step_config nconfig(const char *sel, float kl_beta, int mb) {
    nft_step_config c = {.seed = 9, .nft_beta = 0.1f, .adv_clip_max = 5.0f, .kl_beta = kl_beta,
                         .micro_batch_size = mb, .acts_mode = WAN_ACTS_STORE};
    if (grpo_selection_parse(sel, &c.sel)) test_fail(__FILE__, __LINE__, "%s", core_last_error());
    return c;
}

static double l2(const float *a, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s);
}

/* Probe state: records dv of every transition in call order (mode 0), or accumulates sum dv_t . v (mode 1). */
typedef struct {
    int mode, k, cap;
    int64_t nl;
    float *dv;
    double dot;
} probe_st;

static void probe(void *ctx, int sample, int step, const float *v, const float *dv, int64_t nl) {
    (void)sample, (void)step;
    probe_st *p = ctx;
    if (p->k >= p->cap) return;
    if (p->mode == 0) {
        p->nl = nl;
        memcpy(p->dv + (int64_t)p->k * nl, dv, sizeof(float) * (size_t)nl);
    } else
        for (int64_t i = 0; i < nl; i++) p->dot += (double)p->dv[(int64_t)p->k * nl + i] * v[i];
    p->k++;
}

TEST(nft_step_gradient_is_dit_backward_of_dv) {
    nfix f;
    nfix_build(&f, 0.02f);
    nft_batch b = nfix_batch(&f);
    nft_step_config c = nconfig("random_k 2", 0.01f, 4);
    const int64_t n = f.pol.layout.numel, nl = core_traj_latent_numel(&f.traj[0]);
    probe_st ps = {.mode = 0, .cap = NS * 2};
    ps.dv = malloc(sizeof(float) * (size_t)(ps.cap * nl));
    c.probe = probe, c.probe_ctx = &ps;
    nft_loss_stats st = {0};
    wan_model_zero_grads(&f.pol);
    REQUIRE_OK(nft_accumulate(&f.pol, &f.old, &f.ref, NULL, &c, &b, 1, &st));
    CHECK(st.n_transitions == NS * 2 && ps.k == NS * 2);
    CHECK(st.loss > 0 && st.kl > 0 && st.old_deviate_sum > 0);
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
        nft_loss_stats tmp = {0};
        REQUIRE_OK(nft_accumulate(&f.pol, &f.old, &f.ref, NULL, &c, &b, 0, &tmp));
        s[side] = ps.dot;
    }
    memcpy(f.pol.params, p0, sizeof(float) * n);
    const double fd = s[0] - s[1], rel = fabs(fd - pred) / fabs(pred);
    if (getenv("VGRPO_VERBOSE")) fprintf(stderr, "  nft chain: fd %.9g pred %.9g rel %.3g\n", fd, pred, rel);
    CHECK_MSG(rel < 2e-3, "finite difference %.9g vs gradient %.9g (rel %.3g)", fd, pred, rel);
    free(g), free(p0), free(ps.dv);
    nfix_free(&f);
}

TEST(nft_step_split_invariance_and_determinism) {
    nfix f;
    nfix_build(&f, 0.02f);
    nft_batch b = nfix_batch(&f);
    const int64_t n = f.pol.layout.numel;
    const int mbs[3] = {12, 5, 1};
    float *g[3];
    nft_loss_stats st[3];
    for (int k = 0; k < 3; k++) {
        nft_step_config c = nconfig("random_k 2", 0.0f, mbs[k]);
        memset(&st[k], 0, sizeof st[k]);
        wan_model_zero_grads(&f.pol);
        REQUIRE_OK(nft_accumulate(&f.pol, &f.old, NULL, NULL, &c, &b, 1, &st[k]));
        g[k] = malloc(sizeof(float) * n);
        memcpy(g[k], f.pol.grads, sizeof(float) * n);
    }
    const double gn = l2(g[0], n);
    CHECK(gn > 0);
    for (int k = 1; k < 3; k++) {
        CHECK_MSG(st[k].loss == st[0].loss, "micro-batch %d: loss %.17g vs %.17g", mbs[k], st[k].loss, st[0].loss);
        float *d = malloc(sizeof(float) * n);
        for (int64_t i = 0; i < n; i++) d[i] = g[k][i] - g[0][i];
        CHECK_MSG(l2(d, n) / gn <= 1e-5, "micro-batch %d: relative L2 %.3g", mbs[k], l2(d, n) / gn);
        free(d);
    }
    /* the same call again: the same bits; another update index: other noise, another loss */
    nft_step_config c = nconfig("random_k 2", 0.0f, 12);
    nft_loss_stats again = {0}, other = {0};
    wan_model_zero_grads(&f.pol);
    REQUIRE_OK(nft_accumulate(&f.pol, &f.old, NULL, NULL, &c, &b, 1, &again));
    CHECK(again.loss == st[0].loss && memcmp(f.pol.grads, g[0], sizeof(float) * n) == 0);
    c.update = 1;
    REQUIRE_OK(nft_accumulate(&f.pol, &f.old, NULL, NULL, &c, &b, 0, &other));
    CHECK(other.loss != st[0].loss);
    /* the global denominator: twice the count halves the loss */
    nft_batch b2 = b;
    int64_t cnt = 0;
    c.update = 0;
    REQUIRE_OK(nft_count_transitions(&c, &b, &cnt));
    CHECK(cnt == NS * 2);
    b2.denom = 2 * cnt;
    nft_loss_stats half = {0};
    REQUIRE_OK(nft_accumulate(&f.pol, &f.old, NULL, NULL, &c, &b2, 0, &half));
    CHECK_NEAR(half.loss, 0.5 * st[0].loss, 1e-12 * st[0].loss);
    for (int k = 0; k < 3; k++) free(g[k]);
    nfix_free(&f);
}

TEST(nft_step_first_update) {
    nfix f;
    nfix_build(&f, 0.0f); /* pol == old == ref */
    nft_batch b = nfix_batch(&f);
    nft_step_config c = nconfig("all", 0.0f, 6);
    const int64_t n = f.pol.layout.numel;
    float half[NS];
    for (int s = 0; s < NS; s++) half[s] = 0.5f;
    b.r = half;
    nft_loss_stats st = {0};
    wan_model_zero_grads(&f.pol);
    REQUIRE_OK(nft_accumulate(&f.pol, &f.old, NULL, NULL, &c, &b, 1, &st));
    CHECK(st.n_transitions == NS * NSTEPS && st.loss > 0 && st.old_deviate_sum == 0.0);
    CHECK(st.positive_sum == st.negative_sum);
    CHECK(l2(f.pol.grads, n) == 0.0);
    b.r = f.r; /* rewards that differ: a gradient */
    wan_model_zero_grads(&f.pol);
    REQUIRE_OK(nft_accumulate(&f.pol, &f.old, NULL, NULL, &c, &b, 1, &st));
    CHECK(l2(f.pol.grads, n) > 0);
    nfix_free(&f);
}

TEST(nft_step_errors) {
    nfix f;
    nfix_build(&f, 0.0f);
    nft_batch b = nfix_batch(&f);
    nft_step_config c = nconfig("all", 0.1f, 2);
    nft_loss_stats st = {0};
    CHECK(nft_accumulate(&f.pol, &f.old, NULL, NULL, &c, &b, 0, &st) == -1 &&
          strstr(core_last_error(), "reference"));
    c.kl_beta = 0.0f;
    c.nft_beta = 0.0f;
    CHECK(nft_accumulate(&f.pol, &f.old, NULL, NULL, &c, &b, 0, &st) == -1 &&
          strstr(core_last_error(), "algorithm.nft_beta"));
    c.nft_beta = 0.1f;
    c.micro_batch_size = 0;
    CHECK(nft_accumulate(&f.pol, &f.old, NULL, NULL, &c, &b, 0, &st) == -1 &&
          strstr(core_last_error(), "algorithm.micro_batch_size"));
    c.micro_batch_size = 2;
    float bad[NS];
    memcpy(bad, f.r, sizeof bad);
    bad[4] = 1.5f;
    b.r = bad;
    CHECK(nft_accumulate(&f.pol, &f.old, NULL, NULL, &c, &b, 0, &st) == -1 &&
          strstr(core_last_error(), "sample 4"));
    b.r = f.r;
    CHECK(nft_accumulate(&f.pol, NULL, NULL, NULL, &c, &b, 0, &st) == -1 && strstr(core_last_error(), "old policy"));
    nfix_free(&f);
}
