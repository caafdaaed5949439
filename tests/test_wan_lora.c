/* tests/test_wan_lora.c — LoRA adapters of the Wan transformer (model/dit/wan_lora.h): a fresh adapter equals the
 * base bit for bit (the tiny preset too), lora_off, finite-difference checks of every target's adapter gradients,
 * the frozen base (no base gradients: same dx, denc and adapter gradients), merge, targets and config errors,
 * file round trips in both formats and their refusals. The fixtures against diffusers and peft are in
 * tests/test_wan_lora_fixture.c. */
#include <omp.h>
#include <stdio.h>

#include "core/safetensors.h"
#include "model/dit/wan_lora.h"
#include "tests/test.h"
#include "tests/wan_test_util.h"

typedef struct {
    wan_shape sh;
    int64_t nx, nt, ne, no;
    float *x, *t, *e, *go;
} lin;

static void make_inputs(lin *in, const wan_config *c, int B, int per_token, unsigned long long seed) {
    in->sh = (wan_shape){B, 2, 4, 8, 5, per_token};
    int64_t S = wan_tokens(c, &in->sh);
    in->nx = (int64_t)B * c->in_channels * 2 * 4 * 8;
    in->no = (int64_t)B * c->out_channels * 2 * 4 * 8;
    in->nt = per_token ? B * S : B;
    in->ne = (int64_t)B * 5 * c->text_dim;
    in->x = malloc(in->nx * sizeof(float)), in->t = malloc(in->nt * sizeof(float));
    in->e = malloc(in->ne * sizeof(float)), in->go = malloc(in->no * sizeof(float));
    test_fill_uniform(in->x, in->nx, seed, -2, 2);
    test_fill_uniform(in->t, in->nt, seed + 1, 0, 1000);
    test_fill_uniform(in->e, in->ne, seed + 2, -2, 2);
    test_fill_uniform(in->go, in->no, seed + 3, -1, 1);
}

static void free_inputs(lin *in) { free(in->x), free(in->t), free(in->e), free(in->go); }

/* Every B of l random (so the adapter changes the output and A gets gradients). */
static void random_b(wan_lora *l, unsigned long long seed, float amp) {
    for (int i = 1; i < l->layout.count; i += 2) {
        const wan_tensor *t = &l->layout.tensors[i];
        test_fill_uniform(l->params + t->offset, (size_t)t->numel, seed + (unsigned long long)i, -amp, amp);
    }
}

/* Forward (+ backward unless INFER): out, dx, de freshly allocated (dx/de NULL when INFER). */
static void fwd_bwd(wan_model *m, const lin *in, wan_acts_mode mode, const wan_exec *ex, float **out, float **dx,
                    float **de) {
    wan_acts *A = wan_acts_new(&m->cfg, &in->sh, mode);
    REQUIRE(A != NULL);
    *out = calloc(in->no, sizeof(float));
    REQUIRE_OK(wan_forward(m, A, ex, *out, in->x, in->t, in->e));
    if (mode != WAN_ACTS_INFER) {
        *dx = calloc(in->nx, sizeof(float)), *de = calloc(in->ne, sizeof(float));
        REQUIRE_OK(wan_backward(m, A, ex, *dx, *de, in->go));
    }
    wan_acts_free(A);
}

static double loss(wan_model *m, wan_acts *A, const lin *in, float *out) {
    if (wan_forward(m, A, NULL, out, in->x, in->t, in->e)) return NAN;
    double s = 0;
    for (int64_t i = 0; i < in->no; i++) s += (double)out[i] * in->go[i];
    return s;
}

static wan_lora_config all_targets(int rank, double alpha) {
    return (wan_lora_config){rank, alpha, WAN_LORA_ALL, 1234};
}

/* ---- a fresh adapter is the base model, bit for bit ---- */

static void fresh_equals_base(const wan_config *c, int per_token, wan_acts_mode mode, int rank) {
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, c));
    if (c->num_layers == 2 && wan_dim(c) == 128) wan_params_init_random(&m, 3); /* tiny preset */
    else wt_random_params(&m, 41);
    REQUIRE_OK(wan_model_alloc_grads(&m));
    lin in;
    make_inputs(&in, c, 2, per_token, 500);
    float *o0, *dx0, *de0, *o1, *dx1, *de1;
    fwd_bwd(&m, &in, mode, NULL, &o0, &dx0, &de0);
    float *g0 = malloc(m.layout.numel * sizeof(float));
    memcpy(g0, m.grads, m.layout.numel * sizeof(float));
    wan_model_zero_grads(&m);
    wan_lora l;
    wan_lora_config lc = all_targets(rank, 3.0 * rank);
    REQUIRE_OK(wan_lora_init(&l, c, &lc, 0));
    REQUIRE_OK(wan_lora_alloc_grads(&l));
    REQUIRE_OK(wan_model_attach_lora(&m, &l));
    fwd_bwd(&m, &in, mode, NULL, &o1, &dx1, &de1);
    CHECK(memcmp(o0, o1, in.no * sizeof(float)) == 0);
    CHECK(memcmp(dx0, dx1, in.nx * sizeof(float)) == 0);
    CHECK(memcmp(de0, de1, in.ne * sizeof(float)) == 0);
    CHECK(memcmp(g0, m.grads, m.layout.numel * sizeof(float)) == 0);
    /* the A of a fresh adapter gets no gradient (B = 0), B does */
    double ga = 0, gb = 0;
    for (int i = 0; i < l.layout.count; i++) {
        const wan_tensor *t = &l.layout.tensors[i];
        for (int64_t k = 0; k < t->numel; k++) *(i % 2 ? &gb : &ga) += fabs(l.grads[t->offset + k]);
    }
    CHECK(ga == 0 && gb > 0);
    free(g0), free(o0), free(dx0), free(de0), free(o1), free(dx1), free(de1);
    free_inputs(&in);
    wan_lora_free(&l);
    wan_model_free(&m);
}

TEST(lora_fresh_adapter_equals_base_bitwise) {
    wan_config c = wt_small_config(4, 1);
    fresh_equals_base(&c, 0, WAN_ACTS_STORE, 4);
    fresh_equals_base(&c, 1, WAN_ACTS_RECOMPUTE, 3);
    c = wt_small_config(4, 0);
    fresh_equals_base(&c, 0, WAN_ACTS_RECOMPUTE, 8);
}

TEST(lora_fresh_adapter_equals_base_tiny_preset) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    fresh_equals_base(&c, 0, WAN_ACTS_RECOMPUTE, 8);
}

/* ---- lora_off is the base model; the adapter really changes the output; batch and thread invariance ---- */

TEST(lora_off_is_base_and_adapter_changes_output) {
    wan_config c = wt_small_config(4, 1);
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wt_random_params(&m, 42);
    lin in;
    make_inputs(&in, &c, 3, 0, 600);
    float *base, *on, *off, *one, *dummy = NULL;
    fwd_bwd(&m, &in, WAN_ACTS_INFER, NULL, &base, &dummy, &dummy);
    wan_lora l;
    wan_lora_config lc = all_targets(4, 6.0);
    REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
    random_b(&l, 7, 0.2f);
    REQUIRE_OK(wan_model_attach_lora(&m, &l));
    fwd_bwd(&m, &in, WAN_ACTS_INFER, NULL, &on, &dummy, &dummy);
    wan_exec ex = {0};
    ex.lora_off = 1;
    fwd_bwd(&m, &in, WAN_ACTS_INFER, &ex, &off, &dummy, &dummy);
    CHECK(memcmp(base, off, in.no * sizeof(float)) == 0);
    CHECK(wt_max_rel(on, base, in.no) > 1e-2);
    /* one thread, and sample 1 alone: the same rows bit for bit */
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    fwd_bwd(&m, &in, WAN_ACTS_INFER, NULL, &one, &dummy, &dummy);
    omp_set_num_threads(nt);
    CHECK(memcmp(on, one, in.no * sizeof(float)) == 0);
    lin s1;
    make_inputs(&s1, &c, 1, 0, 601);
    memcpy(s1.x, in.x + s1.nx, s1.nx * sizeof(float));
    memcpy(s1.t, in.t + s1.nt, s1.nt * sizeof(float));
    memcpy(s1.e, in.e + s1.ne, s1.ne * sizeof(float));
    float *alone;
    fwd_bwd(&m, &s1, WAN_ACTS_INFER, NULL, &alone, &dummy, &dummy);
    CHECK(memcmp(on + s1.no, alone, s1.no * sizeof(float)) == 0);
    free(base), free(on), free(off), free(one), free(alone);
    free_inputs(&in), free_inputs(&s1);
    wan_lora_free(&l);
    wan_model_free(&m);
}

/* ---- finite differences of every target's adapter gradients ---- */

/* For target t: the directional derivative of L = sum(out * go) along a random direction over all of t's A
 * (which = 0) or B (which = 1) tensors, central differences vs the backward's gradient. Returns the relative error. */
static double fd_check(wan_model *m, wan_lora *l, const lin *in, int t, int which, double *fd_out, double *an_out) {
    wan_acts *A = wan_acts_new(&m->cfg, &in->sh, WAN_ACTS_STORE);
    float *out = calloc(in->no, sizeof(float));
    float *dir = calloc(l->layout.numel, sizeof(float));
    const float *save = NULL;
    float *p0 = malloc(l->layout.numel * sizeof(float));
    memcpy(p0, l->params, l->layout.numel * sizeof(float));
    (void)save;
    char want[64];
    snprintf(want, sizeof want, ".%s.lora_%c.weight", wan_lora_target_name(t), which ? 'B' : 'A');
    for (int i = which; i < l->layout.count; i += 2) {
        const wan_tensor *tt = &l->layout.tensors[i];
        const char *nm = tt->name;
        size_t n = strlen(nm), k = strlen(want);
        int match = (n > k && !strcmp(nm + n - k, want)) || !strcmp(nm, want + 1);
        if (match) test_fill_uniform(dir + tt->offset, (size_t)tt->numel, 77 + (unsigned long long)i, -1, 1);
    }
    wan_lora_zero_grads(l);
    loss(m, A, in, out);
    float *dx = calloc(in->nx, sizeof(float));
    wan_backward(m, A, NULL, dx, NULL, in->go);
    double an = 0;
    for (int64_t k = 0; k < l->layout.numel; k++) an += (double)dir[k] * l->grads[k];
    const double eps = 2e-3;
    for (int64_t k = 0; k < l->layout.numel; k++) l->params[k] = p0[k] + (float)(eps * dir[k]);
    double lp = loss(m, A, in, out);
    for (int64_t k = 0; k < l->layout.numel; k++) l->params[k] = p0[k] - (float)(eps * dir[k]);
    double lm = loss(m, A, in, out);
    memcpy(l->params, p0, l->layout.numel * sizeof(float));
    double fd = (lp - lm) / (2 * eps);
    *fd_out = fd, *an_out = an;
    free(out), free(dir), free(p0), free(dx);
    wan_acts_free(A);
    return fabs(fd - an) / fmax(fabs(an), 1e-6);
}

TEST(lora_gradients_finite_differences) {
    wan_config c = wt_small_config(4, 1);
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wt_random_params(&m, 43);
    lin in;
    make_inputs(&in, &c, 2, 1, 700);
    wan_lora l;
    wan_lora_config lc = all_targets(3, 5.0);
    REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
    random_b(&l, 9, 0.3f);
    REQUIRE_OK(wan_lora_alloc_grads(&l));
    REQUIRE_OK(wan_model_attach_lora(&m, &l)); /* frozen base: no m.grads */
    double worst = 0;
    for (int t = 0; t < WAN_LORA_NUM_TARGETS; t++)
        for (int which = 0; which < 2; which++) {
            double fd, an;
            double err = fd_check(&m, &l, &in, t, which, &fd, &an);
            CHECK_MSG(err < 5e-3 && fabs(an) > 1e-4, "%s lora_%c: finite difference %.6g, backward %.6g, rel %.3g",
                      wan_lora_target_name(t), which ? 'B' : 'A', fd, an, err);
            if (err > worst) worst = err;
        }
    fprintf(stderr, "  adapter gradients vs central differences, 16 targets x {A, B}: worst relative error %.2e\n",
            worst);
    free_inputs(&in);
    wan_lora_free(&l);
    wan_model_free(&m);
}

/* ---- frozen base: no base gradients, same dx, denc and adapter gradients ---- */

TEST(lora_frozen_base_backward) {
    for (int k = 0; k < 2; k++) {
        wan_config c = wt_small_config(4, k);
        wan_model m;
        REQUIRE_OK(wan_model_init(&m, &c));
        wt_random_params(&m, 44 + k);
        lin in;
        make_inputs(&in, &c, 2, k, 800);
        wan_lora l;
        /* k = 0: every target; k = 1: block targets only (the time path is then skipped when frozen) */
        wan_lora_config lc = {4, 2.5, k ? WAN_LORA_ALL_BLOCK : WAN_LORA_ALL, 99};
        REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
        random_b(&l, 11, 0.2f);
        REQUIRE_OK(wan_lora_alloc_grads(&l));
        REQUIRE_OK(wan_model_attach_lora(&m, &l));
        wan_acts_mode mode = k ? WAN_ACTS_RECOMPUTE : WAN_ACTS_STORE;
        float *o0, *dx0, *de0, *o1, *dx1, *de1;
        fwd_bwd(&m, &in, mode, NULL, &o0, &dx0, &de0); /* frozen */
        float *lg = malloc(l.layout.numel * sizeof(float));
        memcpy(lg, l.grads, l.layout.numel * sizeof(float));
        wan_lora_zero_grads(&l);
        REQUIRE_OK(wan_model_alloc_grads(&m));
        fwd_bwd(&m, &in, mode, NULL, &o1, &dx1, &de1); /* with base gradients */
        CHECK(memcmp(o0, o1, in.no * sizeof(float)) == 0);
        CHECK(memcmp(dx0, dx1, in.nx * sizeof(float)) == 0);
        CHECK(memcmp(de0, de1, in.ne * sizeof(float)) == 0);
        CHECK(memcmp(lg, l.grads, l.layout.numel * sizeof(float)) == 0);
        double gsum = 0;
        for (int64_t i = 0; i < m.layout.numel; i++) gsum += fabs(m.grads[i]);
        CHECK(gsum > 0);
        /* without dx/denc: the adapter gradients stay the same */
        wan_model_free(&m);
        REQUIRE_OK(wan_model_init(&m, &c));
        wt_random_params(&m, 44 + k);
        REQUIRE_OK(wan_model_attach_lora(&m, &l));
        wan_lora_zero_grads(&l);
        wan_acts *A = wan_acts_new(&c, &in.sh, mode);
        REQUIRE_OK(wan_forward(&m, A, NULL, o1, in.x, in.t, in.e));
        REQUIRE_OK(wan_backward(&m, A, NULL, NULL, NULL, in.go));
        CHECK(memcmp(lg, l.grads, l.layout.numel * sizeof(float)) == 0);
        /* neither gradient buffer: an error */
        wan_lora l2;
        REQUIRE_OK(wan_lora_init(&l2, &c, &lc, 0));
        REQUIRE_OK(wan_model_attach_lora(&m, &l2));
        REQUIRE_OK(wan_forward(&m, A, NULL, o1, in.x, in.t, in.e));
        CHECK(wan_backward(&m, A, NULL, NULL, NULL, in.go) == -1 && strstr(core_last_error(), "wan_lora_alloc_grads"));
        /* lora_off with a frozen base: nothing to receive the gradients */
        wan_exec off = {0};
        off.lora_off = 1;
        REQUIRE_OK(wan_forward(&m, A, &off, o1, in.x, in.t, in.e));
        CHECK(wan_backward(&m, A, &off, NULL, NULL, in.go) == -1 && strstr(core_last_error(), "lora_off"));
        wan_acts_free(A);
        wan_lora_free(&l2);
        free(lg), free(o0), free(dx0), free(de0), free(o1), free(dx1), free(de1);
        free_inputs(&in);
        wan_lora_free(&l);
        wan_model_free(&m);
    }
}

/* ---- init as peft: the distribution and the Philox addressing ---- */

TEST(lora_init_kaiming_uniform_philox) {
    wan_config c = wt_small_config(4, 1);
    wan_lora a, b, d;
    wan_lora_config lc = all_targets(4, 4.0);
    REQUIRE_OK(wan_lora_init(&a, &c, &lc, 0));
    /* A in (-1/sqrt(in), 1/sqrt(in)), spread over the interval; B = 0 */
    for (int i = 0; i < a.layout.count; i++) {
        const wan_tensor *t = &a.layout.tensors[i];
        const float *p = a.params + t->offset;
        double bound = 1.0 / sqrt((double)t->shape[1]), lo = 1, hi = -1;
        for (int64_t k = 0; k < t->numel; k++) {
            if (i % 2) CHECK(p[k] == 0.0f);
            lo = fmin(lo, p[k] / bound), hi = fmax(hi, p[k] / bound);
        }
        if (i % 2 == 0) CHECK_MSG(lo > -1 && hi < 1 && lo < -0.5 && hi > 0.5, "%s: range %g..%g", t->name, lo, hi);
    }
    /* a module's A does not depend on the other targets; another expert gets another A */
    wan_lora_config only = {4, 4.0, WAN_LORA_MASK(WAN_LORA_ATTN2_TO_V), 1234};
    REQUIRE_OK(wan_lora_init(&b, &c, &only, 0));
    REQUIRE_OK(wan_lora_init(&d, &c, &only, 1));
    int ia = wan_layout_find(&a.layout, "blocks.1.attn2.to_v.lora_A.weight");
    int ib = wan_layout_find(&b.layout, "blocks.1.attn2.to_v.lora_A.weight");
    REQUIRE(ia >= 0 && ib >= 0);
    const wan_tensor *ta = &a.layout.tensors[ia], *tb = &b.layout.tensors[ib];
    CHECK(memcmp(a.params + ta->offset, b.params + tb->offset, ta->numel * sizeof(float)) == 0);
    CHECK(memcmp(d.params + tb->offset, b.params + tb->offset, ta->numel * sizeof(float)) != 0);
    /* by hand: (2u - 1) / sqrt(in), u from stream 6, slot (layer + 1) * 16 + target, uid = expert */
    double *u = malloc(tb->numel * sizeof(double));
    core_philox_uniform(u, tb->numel, 1234, WAN_LORA_SLOT(1, WAN_LORA_ATTN2_TO_V), 0, CORE_STREAM_LORA_INIT);
    int same = 1;
    for (int64_t k = 0; k < tb->numel; k++)
        same &= b.params[tb->offset + k] == (float)((2 * u[k] - 1) / sqrt((double)tb->shape[1]));
    CHECK(same);
    free(u);
    wan_lora_free(&a), wan_lora_free(&b), wan_lora_free(&d);
}

/* ---- merge: the merged model's forward is the adapted forward ---- */

TEST(lora_merge_equals_adapter_forward) {
    wan_config c = wt_small_config(4, 1);
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wt_random_params(&m, 45);
    lin in;
    make_inputs(&in, &c, 1, 0, 900);
    wan_lora l;
    wan_lora_config lc = all_targets(2, 7.0);
    REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
    random_b(&l, 13, 0.2f);
    REQUIRE_OK(wan_model_attach_lora(&m, &l));
    float *on, *merged, *base, *dummy = NULL;
    fwd_bwd(&m, &in, WAN_ACTS_INFER, NULL, &on, &dummy, &dummy);
    REQUIRE_OK(wan_model_attach_lora(&m, NULL));
    fwd_bwd(&m, &in, WAN_ACTS_INFER, NULL, &base, &dummy, &dummy);
    REQUIRE_OK(wan_lora_merge(&m, &l));
    fwd_bwd(&m, &in, WAN_ACTS_INFER, NULL, &merged, &dummy, &dummy);
    double err = wt_max_rel(merged, on, in.no);
    CHECK_MSG(err < 1e-5, "merged vs adapter forward: %.3g", err);
    CHECK(wt_max_rel(base, on, in.no) > 1e-2);
    free(on), free(merged), free(base);
    free_inputs(&in);
    wan_lora_free(&l);
    wan_model_free(&m);
}

/* ---- targets, config ---- */

TEST(lora_targets_and_config_errors) {
    uint32_t mk;
    const char *peers[] = {"to_q", "to_k", "to_v", "to_out.0"};
    REQUIRE_OK(wan_lora_targets_parse(&mk, peers, 4, "model.lora.targets"));
    CHECK(mk == (WAN_LORA_ALL_BLOCK & ~(WAN_LORA_MASK(WAN_LORA_FFN_IN) | WAN_LORA_MASK(WAN_LORA_FFN_OUT))));
    const char *all[] = {"all-linear"};
    REQUIRE_OK(wan_lora_targets_parse(&mk, all, 1, "t"));
    CHECK(mk == WAN_LORA_ALL);
    const char *some[] = {"attn1.to_q", "ffn.net.2", "attn1.to_q", "proj_out", "linear_1"};
    REQUIRE_OK(wan_lora_targets_parse(&mk, some, 5, "t"));
    CHECK(mk == (WAN_LORA_MASK(WAN_LORA_ATTN1_TO_Q) | WAN_LORA_MASK(WAN_LORA_FFN_OUT) |
                 WAN_LORA_MASK(WAN_LORA_PROJ_OUT) | WAN_LORA_MASK(WAN_LORA_TIME_1) | WAN_LORA_MASK(WAN_LORA_TEXT_1)));
    char buf[1024];
    CHECK(!strcmp(wan_lora_targets_format(WAN_LORA_MASK(0) | WAN_LORA_MASK(15), buf, sizeof buf),
                  "attn1.to_q, proj_out"));
    const char *bad[] = {"attn1.to_q", "add_k_proj"};
    CHECK(wan_lora_targets_parse(&mk, bad, 2, "model.lora.targets") == -1);
    CHECK(strstr(core_last_error(), "model.lora.targets: unknown target \"add_k_proj\"") &&
          strstr(core_last_error(), "attn1.to_q, attn1.to_k") && strstr(core_last_error(), "proj_out"));
    const char *partial[] = {"o_q"};
    CHECK(wan_lora_targets_parse(&mk, partial, 1, "t") == -1); /* a suffix must start at a dot */
    CHECK(wan_lora_targets_parse(&mk, NULL, 0, "t") == -1 && strstr(core_last_error(), "no targets"));

    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_lora l;
    wan_lora_config lc = {0, 8, WAN_LORA_ALL_BLOCK, 0};
    CHECK(wan_lora_init(&l, &c, &lc, 0) == -1 && strstr(core_last_error(), "rank must be >= 1, got 0"));
    lc.rank = 129;
    CHECK(wan_lora_init(&l, &c, &lc, 0) == -1 &&
          strstr(core_last_error(), "rank 129 is larger than attn1.to_q's smaller dimension (in 128, out 128)"));
    lc.rank = 70, lc.targets = WAN_LORA_MASK(WAN_LORA_PROJ_OUT) | WAN_LORA_MASK(WAN_LORA_FFN_IN);
    CHECK(wan_lora_init(&l, &c, &lc, 0) == -1 &&
          strstr(core_last_error(), "proj_out's smaller dimension (in 128, out 64)"));
    lc.rank = 8, lc.alpha = 0;
    CHECK(wan_lora_init(&l, &c, &lc, 0) == -1 && strstr(core_last_error(), "alpha must be > 0, got 0"));
    lc.alpha = -2;
    CHECK(wan_lora_init(&l, &c, &lc, 0) == -1 && strstr(core_last_error(), "alpha must be > 0, got -2"));
    lc.alpha = NAN;
    CHECK(wan_lora_init(&l, &c, &lc, 0) == -1 && strstr(core_last_error(), "alpha must be > 0"));
    lc.alpha = 16, lc.targets = 0;
    CHECK(wan_lora_init(&l, &c, &lc, 0) == -1 && strstr(core_last_error(), "no targets"));
    /* attach to another config */
    lc.targets = WAN_LORA_ALL;
    REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
    CHECK(fabsf(l.scale - 2.0f) == 0);
    wan_config small = wt_small_config(4, 1);
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &small));
    CHECK(wan_model_attach_lora(&m, &l) == -1 && strstr(core_last_error(), "another transformer config"));
    wan_model_free(&m);
    wan_lora_free(&l);
}

/* ---- sizes (the adapter's memory) ---- */

TEST(lora_sizes_at_real_shapes) {
    const char *presets[] = {"wan2.1-t2v-1.3b", "wan2.2-t2v-a14b"};
    for (int p = 0; p < 2; p++) {
        wan_config c;
        REQUIRE_OK(wan_config_preset(&c, presets[p]));
        wan_layout L;
        REQUIRE_OK(wan_layout_init(&L, &c));
        const int64_t D = wan_dim(&c), F = c.ffn_dim;
        for (int r = 32; r <= 64; r *= 2) {
            wan_lora_config blk = {r, r, WAN_LORA_ALL_BLOCK, 0}, all = {r, r, WAN_LORA_ALL, 0};
            int64_t nb = wan_lora_numel(&c, &blk), na = wan_lora_numel(&c, &all);
            CHECK(nb == (int64_t)r * c.num_layers * (16 * D + 2 * (D + F)));
            fprintf(stderr, "  %s rank %d: block linears %lld params (%.1f MB fp32), all linears %lld (%.1f MB); "
                            "base %lld (%.2f GB fp32, %.2f GB bf16)\n",
                    presets[p], r, (long long)nb, nb * 4e-6, (long long)na, na * 4e-6, (long long)L.numel,
                    L.numel * 4e-9, L.numel * 2e-9);
        }
        wan_layout_free(&L);
    }
}

/* ---- files ---- */

static void save_load_same(const wan_lora *l, const char *path, wan_lora_format want_fmt) {
    wan_lora r;
    wan_lora_config c;
    wan_lora_format f;
    REQUIRE_OK(wan_lora_inspect(path, &c, &f, NULL, 0));
    CHECK_MSG(f == want_fmt, "%s: format %s", path, wan_lora_format_name(f));
    CHECK(wan_lora_config_equal(&c, &l->cfg));
    REQUIRE_OK(wan_lora_load(&r, &l->model, path, 0));
    CHECK(wan_lora_config_equal(&r.cfg, &l->cfg) && r.layout.numel == l->layout.numel);
    CHECK(memcmp(r.params, l->params, l->layout.numel * sizeof(float)) == 0);
    wan_lora_free(&r);
}

TEST(lora_save_load_round_trip) {
    wan_config c = wt_small_config(4, 1);
    const char *dir = test_tmpdir();
    char p[600];
    uint32_t masks[2] = {WAN_LORA_ALL, WAN_LORA_MASK(WAN_LORA_ATTN2_TO_K) | WAN_LORA_MASK(WAN_LORA_TEXT_2)};
    double alphas[2] = {6.0, 1.25};
    for (int k = 0; k < 2; k++) {
        wan_lora l;
        wan_lora_config lc = {3, alphas[k], masks[k], 5};
        REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
        random_b(&l, 21, 0.5f);
        snprintf(p, sizeof p, "%s/d%d.safetensors", dir, k);
        REQUIRE_OK(wan_lora_save_diffusers(&l, p));
        save_load_same(&l, p, WAN_LORA_FMT_DIFFUSERS);
        snprintf(p, sizeof p, "%s/peft%d", dir, k);
        REQUIRE_OK(wan_lora_save_peft(&l, p));
        save_load_same(&l, p, WAN_LORA_FMT_PEFT);
        snprintf(p, sizeof p, "%s/peft%d/adapter_model.safetensors", dir, k);
        save_load_same(&l, p, WAN_LORA_FMT_PEFT);
        snprintf(p, sizeof p, "%s/both%d", dir, k);
        REQUIRE_OK(wan_lora_save(&l, p));
        save_load_same(&l, p, WAN_LORA_FMT_DIFFUSERS); /* the diffusers file first, as diffusers does */
        /* into an existing adapter (resume) */
        wan_lora r;
        REQUIRE_OK(wan_lora_init(&r, &c, &lc, 0));
        REQUIRE_OK(wan_lora_load_weights(&r, p));
        CHECK(memcmp(r.params, l.params, l.layout.numel * sizeof(float)) == 0);
        wan_lora_free(&r);
        wan_lora_free(&l);
    }
    /* the metadata diffusers reads */
    snprintf(p, sizeof p, "%s/d0.safetensors", dir);
    st_file *f = st_open(p);
    REQUIRE(f != NULL);
    const char *meta = st_metadata(f, "lora_adapter_metadata");
    CHECK(meta && strstr(meta, "\"transformer.lora_alpha\": 6") && strstr(meta, "\"transformer.r\": 3") &&
          strstr(meta, "\"transformer.target_modules\"") && strstr(meta, "\"condition_embedder.time_proj\""));
    CHECK(st_metadata(f, "format") && !strcmp(st_metadata(f, "format"), "pt"));
    CHECK(st_find(f, "transformer.blocks.1.ffn.net.0.proj.lora_B.weight") >= 0);
    st_close(f);
    snprintf(p, sizeof p, "%s/peft1/adapter_config.json", dir);
    char txt[4096];
    REQUIRE(test_slurp(p, txt, sizeof txt) > 0);
    CHECK(strstr(txt, "\"lora_alpha\": 1.25") && strstr(txt, "\"peft_type\": \"LORA\"") && strstr(txt, "\"r\": 3") &&
          strstr(txt, "\"attn2.to_k\"") && strstr(txt, "WanTransformer3DModel"));
}

/* A safetensors file with the given F32 tensors (zeros) and metadata. */
static void write_file(const char *path, const char *const *names, const int64_t (*shapes)[2], int n,
                       const char *meta) {
    st_writer *w = st_writer_new();
    static float zeros[4096];
    for (int i = 0; i < n; i++) REQUIRE_OK(st_writer_add(w, names[i], CORE_F32, 2, shapes[i], zeros));
    if (meta) REQUIRE_OK(st_writer_set_metadata(w, "lora_adapter_metadata", meta));
    REQUIRE_OK(st_writer_write(w, path));
    st_writer_free(w);
}

TEST(lora_file_errors) {
    wan_config c = wt_small_config(4, 1), big = c;
    big.attention_head_dim = 10; /* D 40 instead of 32 */
    const char *dir = test_tmpdir();
    char p[600], q[600];
    wan_lora l, r;
    wan_lora_config lc = {2, 3.0, WAN_LORA_MASK(WAN_LORA_ATTN1_TO_Q), 1};
    /* an adapter made for another model: the key and both shapes */
    REQUIRE_OK(wan_lora_init(&l, &big, &lc, 0));
    snprintf(p, sizeof p, "%s/big", dir);
    REQUIRE_OK(wan_lora_save(&l, p));
    wan_lora_free(&l);
    CHECK(wan_lora_load(&r, &c, p, 0) == -1);
    CHECK_MSG(strstr(core_last_error(), "key \"transformer.blocks.0.attn1.to_q.lora_A.weight\" has shape [2, 40], "
                                        "the model expects [2, 32]"), "%s", core_last_error());
    snprintf(q, sizeof q, "%s/big/adapter_model.safetensors", dir);
    CHECK(wan_lora_load(&r, &c, q, 0) == -1 &&
          strstr(core_last_error(), "key \"base_model.model.blocks.0.attn1.to_q.lora_A.weight\" has shape [2, 40]"));
    /* more blocks than the model */
    wan_config deep = c;
    deep.num_layers = 3;
    REQUIRE_OK(wan_lora_init(&l, &deep, &lc, 0));
    snprintf(p, sizeof p, "%s/deep.safetensors", dir);
    REQUIRE_OK(wan_lora_save_diffusers(&l, p));
    wan_lora_free(&l);
    CHECK(wan_lora_load(&r, &c, p, 0) == -1 &&
          strstr(core_last_error(), "unexpected key \"transformer.blocks.2.attn1.to_q.lora_A.weight\""));
    /* resume into an adapter of another rank / other targets: named */
    REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
    snprintf(p, sizeof p, "%s/r2", dir);
    REQUIRE_OK(wan_lora_save(&l, p));
    wan_lora_free(&l);
    wan_lora_config other = lc;
    other.rank = 4;
    REQUIRE_OK(wan_lora_init(&r, &c, &other, 0));
    CHECK(wan_lora_load_weights(&r, p) == -1 && strstr(core_last_error(), "rank 2, the adapter being loaded into has "
                                                                           "rank 4"));
    wan_lora_free(&r);
    other = lc;
    other.targets |= WAN_LORA_MASK(WAN_LORA_FFN_OUT);
    REQUIRE_OK(wan_lora_init(&r, &c, &other, 0));
    CHECK(wan_lora_load_weights(&r, p) == -1 &&
          strstr(core_last_error(), "missing key \"transformer.blocks.0.ffn.net.2.lora_A.weight\""));
    wan_lora_free(&r);
    other = lc;
    other.alpha = 4;
    REQUIRE_OK(wan_lora_init(&r, &c, &other, 0));
    CHECK(wan_lora_load_weights(&r, p) == -1 && strstr(core_last_error(), "lora_alpha 3"));
    wan_lora_free(&r);
    /* a target in one block but not the other */
    const char *names1[] = {"transformer.blocks.0.attn1.to_q.lora_A.weight",
                            "transformer.blocks.0.attn1.to_q.lora_B.weight"};
    const int64_t sh1[2][2] = {{2, 32}, {32, 2}};
    snprintf(p, sizeof p, "%s/half.safetensors", dir);
    write_file(p, names1, sh1, 2, NULL);
    CHECK(wan_lora_load(&r, &c, p, 0) == -1 &&
          strstr(core_last_error(), "missing key \"transformer.blocks.1.attn1.to_q.lora_A.weight\""));
    /* not a module we adapt; a bias; DoRA; mixed prefixes; nothing */
    const char *names2[] = {"transformer.patch_embedding.lora_A.weight"};
    snprintf(p, sizeof p, "%s/patch.safetensors", dir);
    write_file(p, names2, sh1, 1, NULL);
    CHECK(wan_lora_inspect(p, &lc, NULL, NULL, 0) == -1 &&
          strstr(core_last_error(), "module \"patch_embedding\" is not one of the linears vgrpo adapts"));
    const char *names3[] = {"transformer.blocks.0.attn1.to_q.lora_B.bias"};
    snprintf(p, sizeof p, "%s/bias.safetensors", dir);
    write_file(p, names3, sh1, 1, NULL);
    CHECK(wan_lora_inspect(p, &lc, NULL, NULL, 0) == -1 && strstr(core_last_error(), "lora_bias=True"));
    const char *names4[] = {"text_encoder.x.lora_A.weight", "transformer.blocks.0.attn1.to_q.lora_A.weight"};
    snprintf(p, sizeof p, "%s/mixed.safetensors", dir);
    write_file(p, names4, sh1, 2, NULL);
    CHECK_MSG(wan_lora_inspect(p, &lc, NULL, NULL, 0) == -1 &&
                  strstr(core_last_error(), "key \"text_encoder.x.lora_A.weight\" does not share"),
              "%s", core_last_error());
    snprintf(p, sizeof p, "%s/empty.safetensors", dir);
    write_file(p, NULL, NULL, 0, NULL);
    CHECK(wan_lora_inspect(p, &lc, NULL, NULL, 0) == -1 && strstr(core_last_error(), "loads as nothing"));
    /* metadata refusals and rules: rslora, rank pattern, r disagreeing, no metadata = alpha r */
    snprintf(p, sizeof p, "%s/rs.safetensors", dir);
    write_file(p, names1, sh1, 2, "{\"transformer.r\": 2, \"transformer.use_rslora\": true}");
    CHECK(wan_lora_inspect(p, &lc, NULL, NULL, 0) == -1 && strstr(core_last_error(), "transformer.use_rslora"));
    write_file(p, names1, sh1, 2, "{\"transformer.rank_pattern\": {\"blocks.0.attn1.to_q\": 8}}");
    CHECK(wan_lora_inspect(p, &lc, NULL, NULL, 0) == -1 && strstr(core_last_error(), "per-module ranks"));
    write_file(p, names1, sh1, 2, "{\"transformer.r\": 4, \"transformer.lora_alpha\": 8}");
    CHECK(wan_lora_inspect(p, &lc, NULL, NULL, 0) == -1 &&
          strstr(core_last_error(), "transformer.r is 4 but the lora_A weights have rank 2"));
    write_file(p, names1, sh1, 2, NULL);
    REQUIRE_OK(wan_lora_inspect(p, &lc, NULL, NULL, 0));
    CHECK(lc.rank == 2 && lc.alpha == 2 && lc.targets == WAN_LORA_MASK(WAN_LORA_ATTN1_TO_Q));
    /* a folder without an adapter; a peft file without its config */
    CHECK(wan_lora_inspect(dir, &lc, NULL, NULL, 0) == -1 && strstr(core_last_error(), "no LoRA adapter here"));
    const char *names5[] = {"base_model.model.blocks.0.attn1.to_q.lora_A.weight"};
    snprintf(p, sizeof p, "%s/lonely.safetensors", dir);
    write_file(p, names5, sh1, 1, NULL);
    CHECK(wan_lora_inspect(p, &lc, NULL, NULL, 0) == -1 && strstr(core_last_error(), "adapter_config.json"));
}
