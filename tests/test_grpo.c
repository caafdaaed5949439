/* tests/test_grpo.c — GRPO arithmetic of trainer/step/grpo.h: advantages (hand-computed group and batch std, masked
 * groups, clamping), the clipped policy term at and around 1 +- eps, per-transition loss and gradients, timestep
 * selection and the loss denominator. The micro-batch invariance and finite-difference tests on a synthetic model
 * are in tests/test_grpo_synth.c. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/philox.h"
#include "tests/test.h"
#include "trainer/step/grpo.h"

/* ---- Advantages ---- */

/* Rewards {1,2,3,4 | 2,2,2,6}. Group 0: mean 2.5, std sqrt(1.25); group 1: mean 3, std sqrt(3). Batch: mean 2.75,
 * std sqrt(17.5/8) = 1.479019945774904. Expected values evaluated in Python from these closed forms. */
TEST(grpo_advantages_group_vs_batch_std) {
    const float r[8] = {1, 2, 3, 4, 2, 2, 2, 6};
    float a[8];
    uint8_t m[8];
    grpo_adv_stats st;
    REQUIRE_OK(grpo_advantages(r, 2, 4, GRPO_STD_GROUP, 5.0f, a, m, &st));
    const double eg[8] = {-1.3415207972320402, -0.4471735990773467, 0.4471735990773467, 1.3415207972320402,
                          -0.5773169377806823, -0.5773169377806823, -0.5773169377806823, 1.7319508133420467};
    for (int i = 0; i < 8; i++) {
        CHECK_NEAR(a[i], eg[i], 1e-6);
        CHECK(m[i] == 1);
    }
    CHECK(a[0] == (float)eg[0]); /* computed in double, rounded once */
    CHECK_NEAR(st.reward_mean, 2.75, 1e-15);
    CHECK_NEAR(st.reward_std, 1.479019945774904, 1e-15);
    CHECK(st.reward_min == 1 && st.reward_max == 6);
    CHECK(st.n_masked_groups == 0 && st.masked_fraction == 0 && st.n_clamped == 0);

    REQUIRE_OK(grpo_advantages(r, 2, 4, GRPO_STD_BATCH, 5.0f, a, m, &st));
    const double eb[8] = {-1.0141165388816098, -0.33803884629386993, 0.33803884629386993, 1.0141165388816098,
                          -0.6760776925877399, -0.6760776925877399, -0.6760776925877399, 2.0282330777632196};
    for (int i = 0; i < 8; i++) CHECK_NEAR(a[i], eb[i], 1e-6);
}

/* A group of equal rewards and groups of one: A = 0, mask 0, counted in masked_fraction; other groups unaffected
 * (with batch std the equal group still gets 0, although the batch std is not 0). */
TEST(grpo_advantages_masked_groups) {
    const float r[9] = {0.5f, 0.5f, 0.5f, 0.0f, 1.0f, 0.5f, -2.0f, -2.0f, -2.0f};
    float a[9];
    uint8_t m[9];
    grpo_adv_stats st;
    for (int mode = 0; mode < 2; mode++) {
        REQUIRE_OK(grpo_advantages(r, 3, 3, mode, 5.0f, a, m, &st));
        for (int i = 0; i < 3; i++) CHECK(a[i] == 0.0f && m[i] == 0);
        for (int i = 6; i < 9; i++) CHECK(a[i] == 0.0f && m[i] == 0);
        CHECK(m[3] == 1 && m[4] == 1 && m[5] == 1);
        CHECK(a[5] == 0.0f); /* the group's mean: exactly 0 but still trained (mask 1) */
        CHECK(a[3] < 0 && a[4] > 0);
        CHECK(st.n_masked_groups == 2 && st.n_masked_samples == 6);
        CHECK_NEAR(st.masked_fraction, 6.0 / 9.0, 1e-15);
    }
    /* group std: group 1 = {0, 1, 0.5}: std sqrt(1/6); A = -/+0.5 / (sqrt(1/6) + 1e-4) */
    REQUIRE_OK(grpo_advantages(r, 3, 3, GRPO_STD_GROUP, 5.0f, a, m, NULL));
    CHECK_NEAR(a[4], 0.5 / (sqrt(1.0 / 6.0) + 1e-4), 1e-6);

    /* groups of one: every sample masked, A = 0, never NaN */
    const float one[4] = {0.3f, 0.9f, -1.0f, 0.3f};
    float a1[4];
    uint8_t m1[4];
    for (int mode = 0; mode < 2; mode++) {
        REQUIRE_OK(grpo_advantages(one, 4, 1, mode, 5.0f, a1, m1, &st));
        for (int i = 0; i < 4; i++) CHECK(a1[i] == 0.0f && m1[i] == 0);
        CHECK(st.masked_fraction == 1.0 && st.n_masked_groups == 4);
    }
}

/* Clamp at +-adv_clip_max. {0 x7, 1}: mean 0.125, std sqrt(7)/8; the 1 gets 0.875/(0.3307189+1e-4) = 2.645 -> 2. */
TEST(grpo_advantages_clamp_and_errors) {
    float r[8] = {0, 0, 0, 0, 0, 0, 0, 1};
    float a[8];
    uint8_t m[8];
    grpo_adv_stats st;
    REQUIRE_OK(grpo_advantages(r, 1, 8, GRPO_STD_GROUP, 2.0f, a, m, &st));
    CHECK(a[7] == 2.0f);
    CHECK_NEAR(a[0], -0.125 / (sqrt(7.0) / 8 + 1e-4), 1e-6);
    CHECK(st.n_clamped == 1);
    REQUIRE_OK(grpo_advantages(r, 1, 8, GRPO_STD_GROUP, INFINITY, a, m, &st));
    CHECK_NEAR(a[7], 0.875 / (sqrt(7.0) / 8 + 1e-4), 1e-5);
    CHECK(st.n_clamped == 0);

    CHECK(grpo_advantages(r, 1, 8, GRPO_STD_GROUP, 0.0f, a, m, NULL) == -1);
    CHECK(strstr(core_last_error(), "algorithm.adv_clip_max") != NULL);
    CHECK(grpo_advantages(r, 0, 8, GRPO_STD_GROUP, 1.0f, a, m, NULL) == -1);
    CHECK(grpo_advantages(r, 1, 8, 7, 1.0f, a, m, NULL) == -1);
    r[3] = NAN;
    CHECK(grpo_advantages(r, 1, 8, GRPO_STD_GROUP, 1.0f, a, m, NULL) == -1);
    CHECK(strstr(core_last_error(), "sample 3") != NULL);
}

/* ---- Clipped policy term ---- */

/* eps = 0.25: lo = 0.75, hi = 1.25 exactly. At the bounds the gradient is the unclipped -adv (torch: clamp passes
 * the gradient at its bounds, and the tie of max splits 0.5/0.5 between two equal gradients); one ulp outside, the
 * clipped branch wins for adv > 0 above hi / adv < 0 below lo (gradient 0), the unclipped for the other sign. */
TEST(grpo_clipping_engages_exactly_at_bounds) {
    const float eps = 0.25f, hi = 1.25f, lo = 0.75f;
    float pol, g;
    /* inside and at the bound: not clipped, full gradient */
    CHECK(grpo_ppo_term(nextafterf(hi, 0), 1.0f, eps, &pol, &g) == 0 && g == -1.0f);
    CHECK(grpo_ppo_term(hi, 1.0f, eps, &pol, &g) == 0 && g == -1.0f && pol == -1.25f);
    CHECK(grpo_ppo_term(hi, -2.0f, eps, &pol, &g) == 0 && g == 2.0f);
    CHECK(grpo_ppo_term(lo, -1.0f, eps, &pol, &g) == 0 && g == 1.0f && pol == 0.75f);
    CHECK(grpo_ppo_term(nextafterf(lo, 2), -1.0f, eps, &pol, &g) == 0 && g == 1.0f);
    /* one ulp outside: clipped */
    float above = nextafterf(hi, 2), below = nextafterf(lo, 0);
    CHECK(grpo_ppo_term(above, 1.0f, eps, &pol, &g) == 1 && g == 0.0f && pol == -1.25f);
    CHECK(grpo_ppo_term(below, -1.0f, eps, &pol, &g) == 1 && g == 0.0f && pol == 0.75f);
    /* outside on the side where the unclipped branch is larger: gradient flows (pessimistic bound) */
    CHECK(grpo_ppo_term(above, -1.0f, eps, &pol, &g) == 1 && g == 1.0f && pol == above);
    CHECK(grpo_ppo_term(below, 1.0f, eps, &pol, &g) == 1 && g == -1.0f && pol == -below);
    CHECK(grpo_ppo_term(2.0f, 0.0f, eps, &pol, &g) == 1 && g == 0.0f);

    /* The same through log-probs: find logp differences whose fp32 exp is exactly hi and one ulp above. */
    float d = logf(hi);
    for (int it = 0; it < 64 && expf(d) != hi; it++) d = expf(d) < hi ? nextafterf(d, 1) : nextafterf(d, 0);
    REQUIRE(expf(d) == hi);
    float d_out = d;
    while (expf(d_out) <= hi) d_out = nextafterf(d_out, 1);
    /* logp_old = -d: logp_new - logp_old = 0 - (-d) = d exactly */
    const float lnew[2] = {0.0f, 0.0f}, lold[2] = {-d, -d_out};
    const float adv[2] = {0.5f, 0.5f};
    const uint8_t mask[2] = {1, 1};
    float dl[2];
    grpo_loss_stats st = {0};
    REQUIRE_OK(grpo_loss_terms(2, lnew, lold, adv, mask, NULL, eps, 0.0f, 4, dl, NULL, &st));
    CHECK(dl[0] == -0.5f * 1.25f / 4.0f); /* -adv * ratio / denom */
    CHECK(dl[1] == 0.0f);
    CHECK(st.n_clipped == 1 && st.n_transitions == 2);
}

/* Values, masks, KL terms and metrics of grpo_loss_terms against double hand formulas. */
TEST(grpo_loss_terms_values) {
    const float lnew[4] = {-1.0f, -2.0f, -0.5f, -1.5f}, lold[4] = {-1.05f, -1.9f, -0.5f, -1.6f};
    const float adv[4] = {1.5f, -0.7f, 2.0f, 0.0f};
    const uint8_t mask[4] = {1, 1, 0, 0}; /* 2, 3: a masked group (A = 0): KL only */
    const float kl[4] = {0.01f, 0.02f, 0.03f, 0.04f};
    const float eps = 0.08f, beta = 0.5f;
    const int64_t denom = 10; /* the global count: more transitions live in other micro-batches */
    float dl[4], dk[4];
    grpo_loss_stats st = {0};
    REQUIRE_OK(grpo_loss_terms(4, lnew, lold, adv, mask, kl, eps, beta, denom, dl, dk, &st));
    double loss = 0, pol = 0, kls = 0, dev = 0;
    for (int i = 0; i < 4; i++) {
        double r = exp((double)lnew[i] - (double)lold[i]);
        double rc = fmin(fmax(r, 1 - 0.08), 1 + 0.08);
        double p = fmax(-adv[i] * r, -adv[i] * rc);
        /* derivative of the branch max picks; 0 where clipping is active */
        double gp = (adv[i] > 0 && r > 1 + 0.08) || (adv[i] < 0 && r < 1 - 0.08) ? 0.0 : -adv[i] * r;
        CHECK_NEAR(dl[i], mask[i] * gp / 10, 2e-8);
        CHECK(dk[i] == 0.05f);
        loss += (mask[i] * p + 0.5 * kl[i]) / 10;
        pol += mask[i] * p / 10;
        kls += kl[i] / 10.0;
        dev += fabs(r - 1);
    }
    CHECK(dl[2] == 0.0f && dl[3] == 0.0f);
    /* transition 0: ratio e^0.05 = 1.051 inside; 1: e^-0.1 = 0.905 < 0.92 with adv < 0 -> clipped, gradient 0 */
    CHECK(dl[1] == 0.0f && dl[0] != 0.0f);
    CHECK(st.n_clipped == 2); /* transitions 1 (0.905) and 3 (1.105) are outside [0.92, 1.08] */
    CHECK_NEAR(st.loss, loss, 1e-7);
    CHECK_NEAR(st.policy, pol, 1e-7);
    CHECK_NEAR(st.kl, kls, 1e-9);
    CHECK_NEAR(st.abs_ratio_dev_sum, dev, 1e-6);
    CHECK_NEAR(st.abs_logp_diff_sum, 0.05 + 0.1 + 0 + 0.1, 1e-6);
    /* the masked samples keep exactly their KL term: loss of {2,3} alone = beta*(0.03+0.04)/10 */
    grpo_loss_stats s2 = {0};
    REQUIRE_OK(grpo_loss_terms(2, lnew + 2, lold + 2, adv + 2, mask + 2, kl + 2, eps, beta, denom, dl, dk, &s2));
    CHECK_NEAR(s2.loss, 0.5 * (0.03 + 0.04) / 10, 1e-9);
    CHECK(s2.policy == 0.0);

    CHECK(grpo_loss_terms(4, lnew, lold, adv, mask, NULL, eps, beta, denom, dl, dk, NULL) == -1);
    CHECK(grpo_loss_terms(4, lnew, lold, adv, mask, kl, eps, beta, 0, dl, dk, NULL) == -1);
    CHECK(grpo_loss_terms(4, lnew, lold, adv, mask, kl, 0.0f, beta, 4, dl, dk, NULL) == -1);
    CHECK(strstr(core_last_error(), "algorithm.clip_range") != NULL);
}

/* ---- Timestep selection ---- */

#define SEL_KEY "algorithm.timestep_selection"

TEST(grpo_selection_parse_and_validate) {
    grpo_selection s;
    char buf[64];
    REQUIRE_OK(grpo_selection_parse("from_range [2, 7] 3", &s));
    CHECK(s.mode == GRPO_SEL_FROM_RANGE && s.range_a == 2 && s.range_b == 7 && s.k == 3);
    grpo_selection_format(&s, buf, sizeof buf);
    grpo_selection s2;
    REQUIRE_OK(grpo_selection_parse(buf, &s2));
    CHECK(s2.range_a == 2 && s2.range_b == 7 && s2.k == 3);
    REQUIRE_OK(grpo_selection_parse("first_fraction 0.6", &s));
    CHECK(s.mode == GRPO_SEL_FIRST_FRACTION && s.fraction == 0.6);
    REQUIRE_OK(grpo_selection_parse("  random_k 4 ", &s));
    CHECK(s.mode == GRPO_SEL_RANDOM_K && s.k == 4);
    REQUIRE_OK(grpo_selection_parse("all", &s));
    CHECK(s.mode == GRPO_SEL_ALL);
    CHECK(grpo_selection_parse("random_k", &s) == -1);
    CHECK(grpo_selection_parse("random_k 3 x", &s) == -1);
    CHECK(grpo_selection_parse("first_half", &s) == -1);
    CHECK(strstr(core_last_error(), SEL_KEY) != NULL);

    const char *bad[] = {"first_fraction 0.05", "first_fraction 1.5", "first_fraction 0", "first_fraction -0.5",
                         "random_k 0", "random_k 11", "from_range [3, 2] 1", "from_range [0, 10] 2",
                         "from_range [-1, 4] 2", "from_range [2, 4] 4", "from_range [2, 4] 0"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        REQUIRE_OK(grpo_selection_parse(bad[i], &s));
        CHECK_MSG(grpo_selection_validate(&s, 10) == -1, "%s accepted for N = 10", bad[i]);
        CHECK_MSG(strstr(core_last_error(), SEL_KEY) != NULL, "%s: message %s", bad[i], core_last_error());
    }
    const char *good[] = {"all", "first_fraction 0.1", "first_fraction 1", "random_k 10", "random_k 1",
                          "from_range [0, 9] 10", "from_range [4, 4] 1"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        REQUIRE_OK(grpo_selection_parse(good[i], &s));
        CHECK_MSG(grpo_selection_validate(&s, 10) == 0, "%s refused: %s", good[i], core_last_error());
    }
}

TEST(grpo_select_first_fraction_and_all) {
    grpo_selection s = {.mode = GRPO_SEL_FIRST_FRACTION, .fraction = 0.6};
    int st[10], n;
    REQUIRE_OK(grpo_select_steps(&s, 10, NULL, 1, 0, st, &n));
    CHECK(n == 6);
    for (int i = 0; i < n; i++) CHECK(st[i] == i);
    /* int(0.29 * 100) = 28 in double, as Python's int(100 * 0.29) */
    s.fraction = 0.29;
    int st100[100];
    REQUIRE_OK(grpo_select_steps(&s, 100, NULL, 1, 0, st100, &n));
    CHECK(n == 28);
    /* steps without a log-prob are skipped */
    const uint8_t has[10] = {1, 0, 1, 1, 1, 1, 1, 1, 1, 0};
    s.fraction = 0.6;
    REQUIRE_OK(grpo_select_steps(&s, 10, has, 1, 0, st, &n));
    CHECK(n == 5 && st[0] == 0 && st[1] == 2 && st[4] == 5);
    grpo_selection all = {.mode = GRPO_SEL_ALL};
    REQUIRE_OK(grpo_select_steps(&all, 10, has, 1, 0, st, &n));
    CHECK(n == 8 && st[7] == 8);
    const uint8_t none[10] = {0};
    CHECK(grpo_select_steps(&all, 10, none, 1, 0, st, &n) == -1);
    CHECK(strstr(core_last_error(), SEL_KEY) != NULL);
}

/* random_k: the documented partial Fisher-Yates on Philox stream 1 (slot 0, uid), recomputed here from the raw
 * 32-bit outputs; distinct, sorted, deterministic in (seed, uid), and uniform over steps. */
TEST(grpo_select_random_k) {
    const int N = 10, k = 3;
    grpo_selection s = {.mode = GRPO_SEL_RANDOM_K, .k = k};
    int st[10], st2[10], n, n2;
    const uint64_t seed = 0x0123456789abcdefull;
    for (uint32_t uid = 0; uid < 20; uid++) {
        REQUIRE_OK(grpo_select_steps(&s, N, NULL, seed, uid, st, &n));
        REQUIRE(n == k);
        uint32_t x[4];
        core_philox_u32_range(x, 0, 4, seed, 0, uid, 1);
        int e[10];
        for (int i = 0; i < N; i++) e[i] = i;
        for (int j = 0; j < k; j++) {
            double u = ((double)x[j] + 0.5) / 4294967296.0;
            int r = j + (int)(u * (N - j));
            int t = e[j];
            e[j] = e[r];
            e[r] = t;
        }
        int chosen[10] = {0};
        for (int j = 0; j < k; j++) chosen[e[j]] = 1;
        for (int j = 0; j < k; j++) CHECK(chosen[st[j]]);
        for (int j = 1; j < k; j++) CHECK(st[j - 1] < st[j]);
        REQUIRE_OK(grpo_select_steps(&s, N, NULL, seed, uid, st2, &n2));
        CHECK(n2 == n && memcmp(st, st2, sizeof(int) * k) == 0);
    }
    /* frequency of each step over 3000 uids: k/N = 0.3 each, binomial sd ~ 0.0084 */
    int count[10] = {0};
    for (uint32_t uid = 0; uid < 3000; uid++) {
        REQUIRE_OK(grpo_select_steps(&s, N, NULL, 7, uid, st, &n));
        for (int j = 0; j < n; j++) count[st[j]]++;
    }
    for (int i = 0; i < N; i++) CHECK_NEAR(count[i] / 3000.0, 0.3, 0.04);
    /* different seeds give different selections for most uids */
    int differ = 0;
    for (uint32_t uid = 0; uid < 50; uid++) {
        grpo_select_steps(&s, N, NULL, 1, uid, st, &n);
        grpo_select_steps(&s, N, NULL, 2, uid, st2, &n2);
        differ += memcmp(st, st2, sizeof(int) * k) != 0;
    }
    CHECK(differ > 30);
    /* steps without a log-prob are never drawn; too few candidates is an error */
    const uint8_t has[10] = {1, 1, 0, 1, 0, 1, 1, 1, 1, 0};
    for (uint32_t uid = 0; uid < 200; uid++) {
        REQUIRE_OK(grpo_select_steps(&s, N, has, 3, uid, st, &n));
        for (int j = 0; j < n; j++) CHECK(has[st[j]]);
    }
    s.k = 8;
    CHECK(grpo_select_steps(&s, N, has, 3, 0, st, &n) == -1);
    CHECK(strstr(core_last_error(), SEL_KEY) != NULL);
    s.k = 7; /* exactly the 7 candidates */
    REQUIRE_OK(grpo_select_steps(&s, N, has, 3, 0, st, &n));
    CHECK(n == 7 && st[0] == 0 && st[2] == 3 && st[6] == 8);
}

TEST(grpo_select_from_range) {
    grpo_selection s = {.mode = GRPO_SEL_FROM_RANGE, .range_a = 2, .range_b = 7, .k = 3};
    const uint8_t has[10] = {1, 1, 1, 1, 0, 1, 1, 1, 1, 1};
    int st[10], n, hit[10] = {0};
    for (uint32_t uid = 0; uid < 500; uid++) {
        REQUIRE_OK(grpo_select_steps(&s, 10, has, 11, uid, st, &n));
        REQUIRE(n == 3);
        for (int j = 0; j < n; j++) {
            CHECK(st[j] >= 2 && st[j] <= 7 && st[j] != 4);
            if (j) CHECK(st[j - 1] < st[j]);
            hit[st[j]]++;
        }
    }
    for (int i = 2; i <= 7; i++)
        if (i != 4) CHECK(hit[i] > 0);
    s.k = 5; /* range 2..7 minus step 4: exactly five */
    REQUIRE_OK(grpo_select_steps(&s, 10, has, 11, 0, st, &n));
    CHECK(n == 5 && st[0] == 2 && st[1] == 3 && st[2] == 5 && st[4] == 7);
    s.k = 6;
    CHECK(grpo_select_steps(&s, 10, has, 11, 0, st, &n) == -1);
}

/* The denominator equals the number of steps grpo_select_steps selects, summed over samples, for every mode. */
TEST(grpo_count_transitions_matches_selection) {
    const int N = 8, S = 5;
    uint8_t has[5 * 8];
    for (int i = 0; i < S * N; i++) has[i] = (i * 7 + 3) % 5 != 0; /* a few holes per sample */
    const char *modes[] = {"all", "first_fraction 0.75", "random_k 2", "from_range [1, 6] 2"};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        grpo_selection s;
        REQUIRE_OK(grpo_selection_parse(modes[m], &s));
        for (int stride = 0; stride <= N; stride += N) {
            int64_t cnt = -1, want = 0;
            REQUIRE_OK(grpo_count_transitions(&s, N, has, stride, S, &cnt));
            for (int i = 0; i < S; i++) {
                int st[8], n;
                REQUIRE_OK(grpo_select_steps(&s, N, has + (size_t)i * stride, 42, (uint32_t)i, st, &n));
                want += n;
            }
            CHECK_MSG(cnt == want, "%s stride %d: count %lld, selected %lld", modes[m], stride, (long long)cnt,
                      (long long)want);
        }
    }
    grpo_selection all = {.mode = GRPO_SEL_ALL};
    int64_t c;
    REQUIRE_OK(grpo_count_transitions(&all, 10, NULL, 0, 16, &c));
    CHECK(c == 160);
    CHECK(grpo_count_transitions(&all, 10, NULL, 3, 16, &c) == -1);
}
