/* tests/test_train.c — the GRPO training pass on the real tiny Wan DiT (trainer/step/train_step.*), fed by the rollout
 * engine: B = 2 prompts x G = 4 samples, latent 16 x 2 x 8 x 8 (32 tokens), 6 steps, CFG 4.5.
 * Checks: (1) parity: on the first update logp_new == logp_old bit for bit for micro-batch sizes 1, 3, 5 (rollout
 * batch 4) and for STORE and RECOMPUTE activations; (2) with beta > 0, the policy moved from the reference and the
 * rollout made by the reference (ratios != 1, some clipped), the accumulated gradient is the same whether the 8
 * samples are trained as 1 x 8, 2 x 4 or 8 x 1 samples (and 1 transition) per micro-batch, within a stated bound;
 * (3) with zero advantages the gradient is the KL's and matches central finite differences of the loss along the
 * gradient and along the weight with the largest gradient; (4) errors. */
#include <string.h>

#include "core/philox.h"
#include "model/dit/wan_dit.h"
#include "model/text/word_embed.h"
#include "rollout/engine.h"
#include "tests/test.h"
#include "trainer/step/train_step.h"

#define TL 4
#define TB 2
#define TG 4
#define TN (TB * TG)
#define TSTEPS 6

typedef struct {
    wan_model ref, pol;
    float *emb;                 /* [TB, TL, text_dim] */
    const float *cond[TN];
    core_traj traj[TN];
    float adv[TN];
    uint8_t mask[TN];
} fixture;

/* ref = random tiny weights; pol = ref + N(0, delta^2) per weight (delta 0: same). Rollout by `roll_by_ref` ?
 * the reference : the policy. Advantages from fixed made-up rewards (group 1 has equal rewards: masked). */
static void fixture_build(fixture *f, float delta, int roll_by_ref) {
    memset(f, 0, sizeof *f);
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    REQUIRE_OK(wan_model_init(&f->ref, &c));
    REQUIRE_OK(wan_model_init(&f->pol, &c));
    wan_params_init_random(&f->ref, 11);
    memcpy(f->pol.params, f->ref.params, sizeof(float) * f->ref.layout.numel);
    if (delta > 0) {
        const int64_t n = f->ref.layout.numel;
        float *z = malloc(sizeof(float) * n);
        core_philox_normal(z, n, 99, 0, 0, 7);
        for (int64_t k = 0; k < n; k++) f->pol.params[k] += delta * z[k];
        free(z);
    }
    REQUIRE_OK(wan_model_alloc_grads(&f->pol));
    const int td = c.text_dim;
    f->emb = malloc(sizeof(float) * TB * TL * td);
    REQUIRE_OK(wan_word_embed("a red ball", TL, td, f->emb));
    REQUIRE_OK(wan_word_embed("green grass", TL, td, f->emb + TL * td));
    uint64_t uids[TN];
    int64_t pidx[TN];
    for (int s = 0; s < TN; s++) f->cond[s] = f->emb + (s / TG) * TL * td, uids[s] = 100 + s, pidx[s] = s / TG;
    rollout_config rc;
    const int64_t shape[4] = {16, 2, 8, 8};
    REQUIRE_OK(rollout_config_init(&rc, TSTEPS, 3.0, 0.9f, 4.5f, shape, TL, 2024, 4));
    REQUIRE_OK(rollout_generate(&rc, &(rollout_experts){1, {roll_by_ref ? &f->ref : &f->pol, NULL}}, NULL, TN, f->cond, uids, pidx, f->traj));
    const float rewards[TN] = {0.1f, 0.7f, 0.4f, 0.2f, 0.5f, 0.5f, 0.5f, 0.5f};
    REQUIRE_OK(grpo_advantages(rewards, TB, TG, GRPO_STD_GROUP, 5.0f, f->adv, f->mask, NULL));
}

static void fixture_free(fixture *f) {
    for (int s = 0; s < TN; s++) core_traj_free(&f->traj[s]);
    wan_model_free(&f->ref);
    wan_model_free(&f->pol);
    free(f->emb);
}

static trainer_batch fixture_batch(fixture *f) {
    return (trainer_batch){.n = TN, .traj = f->traj, .cond = f->cond, .text_len = TL, .adv = f->adv, .mask = f->mask};
}

static trainer_config tconfig(const char *sel, float beta, int mb, wan_acts_mode mode) {
    trainer_config tc = {.seed = 5, .clip_eps = 0.2f, .beta = beta, .micro_batch_size = mb, .acts_mode = mode};
    if (grpo_selection_parse(sel, &tc.sel)) test_fail(__FILE__, __LINE__, "%s", core_last_error());
    return tc;
}

TEST(train_parity_first_update) {
    fixture f;
    fixture_build(&f, 0.0f, 0);
    trainer_batch b = fixture_batch(&f);
    const int mbs[3] = {1, 3, 5};
    for (int k = 0; k < 3; k++)
        for (int mode = WAN_ACTS_STORE; mode <= WAN_ACTS_RECOMPUTE; mode++) {
            trainer_config tc = tconfig("all", 0.04f, mbs[k], (wan_acts_mode)mode);
            grpo_loss_stats st = {0};
            wan_model_zero_grads(&f.pol);
            REQUIRE_OK(trainer_accumulate(&f.pol, &f.ref, NULL, &tc, &b, 1, &st));
            CHECK(st.n_transitions == TN * TSTEPS);
            CHECK_MSG(st.abs_logp_diff_sum == 0.0, "micro %d mode %d: sum |logp_new - logp_old| = %g", mbs[k], mode,
                      st.abs_logp_diff_sum);
            CHECK(st.abs_ratio_dev_sum == 0.0 && st.n_clipped == 0 && st.kl == 0.0);
        }
    fixture_free(&f);
}

static double l2(const float *a, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s);
}

TEST(train_accumulation_split_invariance) {
    fixture f;
    fixture_build(&f, 0.01f, 1);
    trainer_batch b = fixture_batch(&f);
    const int64_t n = f.pol.layout.numel;
    /* random_k 2: 16 transitions; 1 x 8 samples = 16 per micro-batch, 2 x 4 = 8, 8 x 1 = 2; and 1 transition. */
    const int mbs[4] = {16, 8, 2, 1};
    float *g[4];
    grpo_loss_stats st[4];
    for (int k = 0; k < 4; k++) {
        trainer_config tc = tconfig("random_k 2", 0.5f, mbs[k], WAN_ACTS_STORE);
        memset(&st[k], 0, sizeof st[k]);
        wan_model_zero_grads(&f.pol);
        REQUIRE_OK(trainer_accumulate(&f.pol, &f.ref, NULL, &tc, &b, 1, &st[k]));
        g[k] = malloc(sizeof(float) * n);
        memcpy(g[k], f.pol.grads, sizeof(float) * n);
    }
    CHECK(st[0].n_transitions == 16);
    CHECK(st[0].kl > 0 && st[0].abs_ratio_dev_sum > 0); /* really off the reference and off-policy */
    const double gn = l2(g[0], n);
    CHECK(gn > 0);
    /* Bound: the splits differ only in summation order (GEMM weight-gradient reductions over rows, accumulation over
     * micro-batches): relative L2 <= 1e-5 (a few hundred fp32 ulps of accumulated rounding; observed ~1e-7). */
    for (int k = 1; k < 4; k++) {
        float *d = malloc(sizeof(float) * n);
        for (int64_t i = 0; i < n; i++) d[i] = g[k][i] - g[0][i];
        double rel = l2(d, n) / gn;
        CHECK_MSG(rel <= 1e-5, "micro-batch %d vs %d transitions: relative L2 %.3g", mbs[k], mbs[0], rel);
        CHECK_NEAR(st[k].loss, st[0].loss, 1e-6 * fabs(st[0].loss) + 1e-12);
        CHECK(st[k].n_clipped == st[0].n_clipped);
        free(d);
    }
    /* The bound can fail: dividing each micro-batch by its own count instead of the global one changes the gradient. */
    {
        trainer_config tc = tconfig("random_k 2", 0.5f, 8, WAN_ACTS_STORE);
        trainer_batch b2 = b;
        b2.denom = 8;
        grpo_loss_stats s2 = {0};
        wan_model_zero_grads(&f.pol);
        REQUIRE_OK(trainer_accumulate(&f.pol, &f.ref, NULL, &tc, &b2, 1, &s2));
        float *d = malloc(sizeof(float) * n);
        for (int64_t i = 0; i < n; i++) d[i] = f.pol.grads[i] - g[0][i];
        CHECK(l2(d, n) / gn > 0.5);
        free(d);
    }
    for (int k = 0; k < 4; k++) free(g[k]);
    fixture_free(&f);
}

/* Loss at params p (forward only). */
static double loss_at(fixture *f, const trainer_config *tc, trainer_batch *b) {
    grpo_loss_stats st = {0};
    if (trainer_accumulate(&f->pol, &f->ref, NULL, tc, b, 0, &st)) test_fail(__FILE__, __LINE__, "%s", core_last_error());
    return st.loss;
}

TEST(train_kl_gradient_finite_difference) {
    fixture f;
    fixture_build(&f, 0.02f, 1);
    for (int s = 0; s < TN; s++) f.adv[s] = 0.0f, f.mask[s] = 1;
    trainer_batch b = fixture_batch(&f);
    trainer_config tc = tconfig("first_fraction 0.5", 1.0f, 6, WAN_ACTS_STORE);
    const int64_t n = f.pol.layout.numel;
    wan_model_zero_grads(&f.pol);
    grpo_loss_stats st = {0};
    REQUIRE_OK(trainer_accumulate(&f.pol, &f.ref, NULL, &tc, &b, 1, &st));
    CHECK(st.policy == 0.0 && st.kl > 0);
    CHECK_NEAR(st.loss, st.kl, 1e-6 * st.kl); /* beta = 1: loss is the KL term alone */
    float *g = malloc(sizeof(float) * n), *p0 = malloc(sizeof(float) * n), *dir = malloc(sizeof(float) * n);
    memcpy(g, f.pol.grads, sizeof(float) * n);
    memcpy(p0, f.pol.params, sizeof(float) * n);
    const double gn = l2(g, n);
    REQUIRE(gn > 0);
    for (int which = 0; which < 2; which++) {
        if (which == 0)
            for (int64_t i = 0; i < n; i++) dir[i] = (float)(g[i] / gn);
        else { /* one coordinate: the weight with the largest |gradient| */
            int64_t best = 0;
            for (int64_t i = 0; i < n; i++)
                if (fabsf(g[i]) > fabsf(g[best])) best = i;
            memset(dir, 0, sizeof(float) * n);
            dir[best] = 1.0f;
        }
        const double h = 0.01;
        /* central difference; the prediction uses the perturbation actually applied in fp32 */
        double pred = 0;
        for (int64_t i = 0; i < n; i++) f.pol.params[i] = p0[i] + (float)(h * dir[i]);
        double lp = loss_at(&f, &tc, &b);
        for (int64_t i = 0; i < n; i++) pred += (double)g[i] * (double)f.pol.params[i];
        for (int64_t i = 0; i < n; i++) f.pol.params[i] = p0[i] - (float)(h * dir[i]);
        double lm = loss_at(&f, &tc, &b);
        for (int64_t i = 0; i < n; i++) pred -= (double)g[i] * (double)f.pol.params[i];
        memcpy(f.pol.params, p0, sizeof(float) * n);
        double fd = lp - lm, rel = fabs(fd - pred) / fabs(pred);
        if (getenv("VGRPO_VERBOSE")) fprintf(stderr, "  dir %d: loss %.9g fd %.9g pred %.9g rel %.3g\n", which, st.loss, fd, pred, rel);
        CHECK_MSG(rel < 2e-3, "direction %d: finite difference %.9g vs gradient %.9g (rel %.3g)", which, fd, pred, rel);
    }
    free(g), free(p0), free(dir);
    fixture_free(&f);
}

TEST(train_errors) {
    fixture f;
    fixture_build(&f, 0.0f, 0);
    trainer_batch b = fixture_batch(&f);
    grpo_loss_stats st = {0};
    trainer_config tc = tconfig("all", 0.1f, 4, WAN_ACTS_STORE);
    CHECK(trainer_accumulate(&f.pol, NULL, NULL, &tc, &b, 1, &st) == -1);
    CHECK(strstr(core_last_error(), "reference") != NULL);
    tc = tconfig("all", 0.0f, 0, WAN_ACTS_STORE);
    CHECK(trainer_accumulate(&f.pol, NULL, NULL, &tc, &b, 1, &st) == -1);
    CHECK(strstr(core_last_error(), "algorithm.micro_batch_size") != NULL);
    tc = tconfig("random_k 7", 0.0f, 4, WAN_ACTS_STORE);
    CHECK(trainer_accumulate(&f.pol, NULL, NULL, &tc, &b, 1, &st) == -1);
    CHECK(strstr(core_last_error(), "algorithm.timestep_selection") != NULL);
    tc = tconfig("all", 0.0f, 4, WAN_ACTS_STORE);
    f.traj[3].expert[2] = 1;
    CHECK(trainer_accumulate(&f.pol, NULL, NULL, &tc, &b, 1, &st) == -1);
    CHECK(strstr(core_last_error(), "expert 1") != NULL);
    fixture_free(&f);
}
