/* tests/test_optim.c — trainer/optim/optim.h: AdamW trajectories against torch.optim.AdamW (fixture from
 * scripts/fixtures_optim.py: without and with weight decay, with clip_grad_norm_, with a transformers cosine
 * schedule), the schedules against hand values of transformers' formulas, fixed-order grad norm and thread
 * invariance, the weight-decay mask, gradient accumulation and the error cases. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core/safetensors.h"
#include "tests/test.h"
#include "trainer/optim/optim.h"

#define FIXTURE "tests/fixtures/optim_adamw.safetensors"
#define FN 37 /* parameters per case */
#define FT 6  /* steps per case */

/* The cases of scripts/fixtures_optim.py (keep in step with CASES there). */
static const struct {
    const char *name;
    optim_config cfg;
} cases[] = {
    {"nowd", {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0, .max_grad_norm = 0}},
    {"wd", {.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1, .max_grad_norm = 0}},
    {"clip", {.lr = 5e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-4, .max_grad_norm = 1.0}},
    {"cos",
     {.lr = 2e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2, .max_grad_norm = 0.5,
      .schedule = OPTIM_SCHED_COSINE, .warmup_steps = 2, .total_steps = 6}},
};

/* Each step's parameters against torch's: max |a - b| <= 2.5e-7 max |b| (two fp32 ulps of the largest value). The
 * same fp32 operations in the same order give bit-identical results here (observed: difference 0 in every case,
 * with gcc + glibc); the margin allows a libm whose pow() for the bias corrections differs in the last bit. */
TEST(optim_adamw_matches_torch) {
    st_file *f = st_open(FIXTURE);
    REQUIRE(f != NULL);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const optim_config *cfg = &cases[c].cfg;
        char key[64];
        float p[FN], grads[FT * FN], want[FT * FN], norms[FT] = {0}, lrs[FT] = {0}, g[FN];
        snprintf(key, sizeof key, "%s.p0", cases[c].name);
        REQUIRE_OK(st_read_f32(f, key, p, FN));
        snprintf(key, sizeof key, "%s.grads", cases[c].name);
        REQUIRE_OK(st_read_f32(f, key, grads, FT * FN));
        snprintf(key, sizeof key, "%s.p", cases[c].name);
        REQUIRE_OK(st_read_f32(f, key, want, FT * FN));
        const int has_norm = cfg->max_grad_norm > 0, has_lr = cfg->schedule != OPTIM_SCHED_CONSTANT;
        if (has_norm) {
            snprintf(key, sizeof key, "%s.norm", cases[c].name);
            REQUIRE_OK(st_read_f32(f, key, norms, FT));
        }
        if (has_lr) {
            snprintf(key, sizeof key, "%s.lr", cases[c].name);
            REQUIRE_OK(st_read_f32(f, key, lrs, FT));
        }
        optim_adamw o;
        REQUIRE_OK(optim_adamw_init(&o, FN));
        int clipped = 0;
        for (int t = 0; t < FT; t++) {
            memcpy(g, grads + t * FN, sizeof g);
            optim_step_info info;
            REQUIRE_OK(optim_adamw_step(&o, cfg, p, g, NULL, &info));
            double err = 0, scale = 0;
            for (int i = 0; i < FN; i++) {
                err = fmax(err, fabs(p[i] - want[t * FN + i]));
                scale = fmax(scale, fabs(want[t * FN + i]));
            }
            CHECK_MSG(err <= 2.5e-7 * scale, "%s step %d: max|diff| %.3g (scale %.3g)", cases[c].name, t, err, scale);
            if (has_norm) CHECK_NEAR(info.grad_norm, norms[t], 2e-6 * norms[t]);
            if (has_lr) CHECK_NEAR(info.lr, lrs[t], 1e-9);
            clipped += info.clip_coef < 1.0;
        }
        if (has_norm) CHECK(clipped > 0 && clipped < FT); /* the fixture clips some steps, not all */
        CHECK(o.step == FT);
        optim_adamw_free(&o);
    }
    st_close(f);
}

/* transformers' formulas evaluated by hand (lr 1e-3, warm-up 10, total 110). */
TEST(optim_schedules_hand_values) {
    optim_config c = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .warmup_steps = 10, .total_steps = 110};
    c.schedule = OPTIM_SCHED_LINEAR;
    REQUIRE_OK(optim_config_validate(&c));
    CHECK(optim_lr_at(&c, 0) == 0.0);       /* warm-up starts at 0: the first update has lr 0 */
    CHECK_NEAR(optim_lr_at(&c, 5), 5e-4, 1e-15);
    CHECK_NEAR(optim_lr_at(&c, 10), 1e-3, 1e-15);
    CHECK_NEAR(optim_lr_at(&c, 60), 5e-4, 1e-15);  /* (110-60)/100 */
    CHECK_NEAR(optim_lr_at(&c, 109), 1e-5, 1e-15);
    CHECK(optim_lr_at(&c, 110) == 0.0 && optim_lr_at(&c, 500) == 0.0);
    c.schedule = OPTIM_SCHED_COSINE;
    CHECK_NEAR(optim_lr_at(&c, 3), 3e-4, 1e-15);
    CHECK_NEAR(optim_lr_at(&c, 10), 1e-3, 1e-15);
    CHECK_NEAR(optim_lr_at(&c, 35), 1e-3 * 0.8535533905932737, 1e-15); /* 0.5 (1 + cos(pi/4)) */
    CHECK_NEAR(optim_lr_at(&c, 60), 5e-4, 1e-15);
    CHECK_NEAR(optim_lr_at(&c, 85), 1e-3 * 0.14644660940672624, 1e-15);
    CHECK_NEAR(optim_lr_at(&c, 110), 0.0, 1e-18);
    CHECK(optim_lr_at(&c, 160) == optim_lr_at(&c, 110)); /* held at the end (transformers would rise again) */
    c.schedule = OPTIM_SCHED_CONSTANT;
    c.warmup_steps = 4;
    CHECK_NEAR(optim_lr_at(&c, 1), 2.5e-4, 1e-15);
    CHECK(optim_lr_at(&c, 4) == 1e-3 && optim_lr_at(&c, 1000000) == 1e-3);
    c.warmup_steps = 0;
    CHECK(optim_lr_at(&c, 0) == 1e-3);
    c.schedule = OPTIM_SCHED_LINEAR, c.warmup_steps = 0, c.total_steps = 4;
    CHECK(optim_lr_at(&c, 0) == 1e-3);
    CHECK_NEAR(optim_lr_at(&c, 3), 2.5e-4, 1e-15);
}

TEST(optim_config_errors) {
    const optim_config ok = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-4,
                             .schedule = OPTIM_SCHED_COSINE, .warmup_steps = 5, .total_steps = 100};
    REQUIRE_OK(optim_config_validate(&ok));
    struct {
        optim_config c;
        const char *key;
    } bad[] = {{ok, "optim.lr"}, {ok, "optim.beta2"}, {ok, "optim.eps"}, {ok, "optim.weight_decay"},
               {ok, "optim.total_steps"}, {ok, "optim.warmup_steps"}, {ok, "optim.max_grad_norm"}};
    bad[0].c.lr = 0;
    bad[1].c.beta2 = 1.0;
    bad[2].c.eps = 0;
    bad[3].c.weight_decay = -1;
    bad[4].c.total_steps = 5;
    bad[5].c.warmup_steps = -1;
    bad[6].c.max_grad_norm = NAN;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(optim_config_validate(&bad[i].c) == -1, "%s accepted", bad[i].key);
        CHECK_MSG(strstr(core_last_error(), bad[i].key) != NULL, "%s: message %s", bad[i].key, core_last_error());
    }
    /* a non-finite gradient: error, nothing changed */
    optim_adamw o;
    REQUIRE_OK(optim_adamw_init(&o, 3));
    float p[3] = {1, 2, 3}, g[3] = {0.1f, INFINITY, 0.2f};
    CHECK(optim_adamw_step(&o, &ok, p, g, NULL, NULL) == -1);
    CHECK(strstr(core_last_error(), "gradient norm") != NULL);
    CHECK(p[0] == 1 && p[2] == 3 && o.step == 0 && o.m[0] == 0 && o.v[2] == 0);
    optim_adamw_free(&o);
    CHECK(optim_adamw_init(&o, 0) == -1);
}

/* The norm: fixed chunks, so 1 and 2 threads give the same bits; value against a long double reference.
 * Clip factor as torch: max_norm / (norm + 1e-6), capped at 1. */
TEST(optim_grad_norm_fixed_order) {
    const int64_t n = 3 * OPTIM_CHUNK * 1024 + 12345; /* crosses a batch of chunk sums */
    float *g = malloc(sizeof(float) * (size_t)n);
    REQUIRE(g != NULL);
    test_fill_uniform(g, (size_t)n, 5, -1.0f, 1.0f);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    double n1 = optim_grad_norm(g, n);
    omp_set_num_threads(2);
    double n2 = optim_grad_norm(g, n);
    omp_set_num_threads(saved);
    CHECK(n1 == n2);
    long double ref = 0;
    for (int64_t i = 0; i < n; i++) ref += (long double)g[i] * g[i];
    CHECK_NEAR(n1, sqrtl(ref), 1e-12 * n1);
    free(g);
    float small[3] = {3, 4, 0};
    CHECK(optim_grad_norm(small, 3) == 5.0);
    CHECK(optim_sumsq(small, 0) == 0.0);
    CHECK(optim_clip_coef(5.0, 1.0) == 1.0 / (5.0 + 1e-6));
    CHECK(optim_clip_coef(0.5, 1.0) == 1.0);
    CHECK(optim_clip_coef(5.0, 0.0) == 1.0);
}

/* AdamW over a large buffer: 1 and 2 threads bitwise equal (elementwise). The weight-decay mask: masked elements
 * move exactly as with weight_decay 0. */
TEST(optim_adamw_threads_and_wd_mask) {
    const int64_t n = 200003;
    float *p1 = malloc(sizeof(float) * n), *p2 = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n);
    REQUIRE(p1 && p2 && g);
    test_fill_uniform(p1, n, 1, -1, 1);
    memcpy(p2, p1, sizeof(float) * n);
    test_fill_uniform(g, n, 2, -0.1f, 0.1f);
    optim_config c = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.05};
    optim_adamw a, b;
    REQUIRE_OK(optim_adamw_init(&a, n));
    REQUIRE_OK(optim_adamw_init(&b, n));
    int saved = omp_get_max_threads();
    for (int t = 0; t < 3; t++) {
        omp_set_num_threads(1);
        REQUIRE_OK(optim_adamw_step(&a, &c, p1, g, NULL, NULL));
        omp_set_num_threads(2);
        REQUIRE_OK(optim_adamw_step(&b, &c, p2, g, NULL, NULL));
    }
    omp_set_num_threads(saved);
    CHECK(memcmp(p1, p2, sizeof(float) * n) == 0 && memcmp(a.v, b.v, sizeof(float) * n) == 0);
    optim_adamw_free(&a);
    optim_adamw_free(&b);
    free(p1), free(p2), free(g);

    /* mask: element 0 decays, element 1 does not; compare with separate runs */
    float q[2] = {0.5f, 0.5f}, q0[2] = {0.5f, 0.5f}, gg[2] = {0.01f, 0.01f}, m[2] = {0}, v[2] = {0}, m0[2] = {0},
          v0[2] = {0};
    const uint8_t mask[2] = {1, 0};
    optim_adamw_update(q, gg, m, v, 2, mask, 0.1, 0.9, 0.999, 1e-8, 0.5, 1);
    optim_adamw_update(q0, gg, m0, v0, 2, NULL, 0.1, 0.9, 0.999, 1e-8, 0.0, 1);
    CHECK(q[1] == q0[1]);
    /* step 1: m_hat/sqrt(v_hat) = sign(g): p = 0.5*(1 - 0.1*0.5) - 0.1 = 0.375 */
    CHECK_NEAR(q[0], 0.375, 1e-6);
    CHECK_NEAR(q0[0], 0.4, 1e-6);
}

/* Accumulation: zero, add micro-batch gradients, scale. */
TEST(optim_accumulate_zero_scale) {
    float acc[5] = {9, 9, 9, 9, 9}, a[5] = {1, 2, 3, 4, 5}, b[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    optim_zero(acc, 5);
    CHECK(acc[0] == 0 && acc[4] == 0);
    optim_accumulate(acc, a, 5);
    optim_accumulate(acc, b, 5);
    CHECK(acc[0] == 1.5f && acc[4] == 5.5f);
    optim_scale(acc, 5, 2.0);
    CHECK(acc[1] == 5.0f);
}
