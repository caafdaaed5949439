/* tests/test_wan_fixture.c — the Wan transformer against diffusers 0.42.1 (fixtures from scripts/gen_fixtures.py):
 * the output (max|a-b|/max|b| <= 1e-5) and every gradient of sum(output * grad_output) (relative L2 <= 1e-4):
 * w.r.t. hidden_states, encoder_hidden_states and each parameter. Also a BF16 checkpoint and a sharded one. */
#include <stdio.h>

#include "tests/test.h"
#include "tests/wan_test_util.h"

#define OUT_TOL 1e-5
#define GRAD_TOL 1e-4

typedef struct {
    double out_err, grad_err;
    char worst[128];
} fixture_result;

/* Runs fixture `name` with the model in model_dir; compares the output with tensor `out_name` and, when grads,
 * every gradient. */
static void run_fixture(const char *name, const char *model_dir, const char *out_name, int grads, wan_acts_mode mode,
                        fixture_result *res) {
    char path[512];
    memset(res, 0, sizeof *res);
    wan_model m;
    REQUIRE_OK(wan_model_load(&m, model_dir));
    snprintf(path, sizeof path, "tests/fixtures/wan_%s_io.safetensors", name);
    st_file *io = st_open(path);
    REQUIRE(io != NULL);
    int nd_x = 0, nd_t = 0, nd_e = 0;
    int64_t sx[8] = {0}, st_[8] = {0}, se[8] = {0}, nx = 0, nt = 0, ne = 0, no = 0;
    float *x = wt_read(io, "hidden_states", &nd_x, sx, &nx);
    float *t = wt_read(io, "timestep", &nd_t, st_, &nt);
    float *e = wt_read(io, "encoder_hidden_states", &nd_e, se, &ne);
    float *go = wt_read(io, "grad_output", NULL, NULL, &no);
    float *ref = wt_read(io, out_name, NULL, NULL, NULL);
    REQUIRE(x && t && e && go && ref && nd_x == 5 && nd_e == 3);
    wan_shape sh = {(int)sx[0], (int)sx[2], (int)sx[3], (int)sx[4], (int)se[1], nd_t == 2};
    wan_acts *A = wan_acts_new(&m.cfg, &sh, mode);
    REQUIRE(A != NULL);
    CHECK(nt == (nd_t == 2 ? sh.B * wan_tokens(&m.cfg, &sh) : sh.B));
    float *out = calloc((size_t)no, sizeof(float));
    float *dx = calloc((size_t)nx, sizeof(float));
    float *de = calloc((size_t)ne, sizeof(float));
    REQUIRE(out && dx && de);
    REQUIRE_OK(wan_forward(&m, A, NULL, out, x, t, e));
    res->out_err = wt_max_rel(out, ref, no);
    CHECK_MSG(res->out_err <= OUT_TOL, "%s: output max|a-b|/max|b| = %.3g > %.0e", name, res->out_err, OUT_TOL);
    if (grads) {
        REQUIRE_OK(wan_model_alloc_grads(&m));
        REQUIRE_OK(wan_backward(&m, A, NULL, dx, de, go));
        struct {
            const char *name;
            const float *got;
            int64_t n;
        } in[2] = {{"grad_hidden_states", dx, nx}, {"grad_encoder_hidden_states", de, ne}};
        for (int k = 0; k < 2; k++) {
            float *r = wt_read(io, in[k].name, NULL, NULL, NULL);
            REQUIRE(r != NULL);
            double err = wt_l2_rel(in[k].got, r, in[k].n);
            CHECK_MSG(err <= GRAD_TOL, "%s: %s relative L2 error %.3g", name, in[k].name, err);
            if (err > res->grad_err) res->grad_err = err, snprintf(res->worst, sizeof res->worst, "%s", in[k].name);
            free(r);
        }
        for (int i = 0; i < m.layout.count; i++) {
            const wan_tensor *w = &m.layout.tensors[i];
            char gname[160];
            snprintf(gname, sizeof gname, "grad.%s", w->name);
            int64_t n;
            float *r = wt_read(io, gname, NULL, NULL, &n);
            REQUIRE(r != NULL && n == w->numel);
            double err = wt_l2_rel(m.grads + w->offset, r, n);
            CHECK_MSG(err <= GRAD_TOL, "%s: %s relative L2 error %.3g", name, gname, err);
            if (err > res->grad_err) res->grad_err = err, snprintf(res->worst, sizeof res->worst, "%s", gname);
            free(r);
        }
    }
    fprintf(stderr, "  %s (%s): output %.2e, worst gradient %.2e (%s)\n", name, model_dir, res->out_err,
            res->grad_err, res->worst[0] ? res->worst : "-");
    free(out), free(dx), free(de), free(x), free(t), free(e), free(go), free(ref);
    wan_acts_free(A);
    st_close(io);
    wan_model_free(&m);
}

/* diffusers' own unit-test config: 2 heads x 12, 2 layers, I64 timestep. */
TEST(wan_fixture_difftest) {
    fixture_result r;
    run_fixture("difftest", "tests/fixtures/wan_difftest", "output", 1, WAN_ACTS_STORE, &r);
}

/* 3 heads, F=3, H != W, batch 2 with different timesteps, out_channels != in_channels, no cross-attn norm. */
TEST(wan_fixture_multihead) {
    fixture_result r;
    run_fixture("multihead", "tests/fixtures/wan_multihead", "output", 1, WAN_ACTS_STORE, &r);
}

/* 48 channels, per-token timesteps (Wan 2.2 TI2V). */
TEST(wan_fixture_ti2v48) {
    fixture_result r;
    run_fixture("ti2v48", "tests/fixtures/wan_ti2v48", "output", 1, WAN_ACTS_RECOMPUTE, &r);
}

/* BF16 checkpoint: loads to the bf16-rounded weights, so the forward matches diffusers' fp32 forward of the
 * rounded weights (output_bf16_weights) to the fp32 tolerance. */
TEST(wan_fixture_bf16_checkpoint) {
    fixture_result r;
    run_fixture("difftest", "tests/fixtures/wan_difftest_bf16", "output_bf16_weights", 0, WAN_ACTS_INFER, &r);
}

/* Sharded checkpoint (index + 2 shards): same output and gradients. */
TEST(wan_fixture_sharded_checkpoint) {
    fixture_result r;
    run_fixture("multihead", "tests/fixtures/wan_multihead_sharded", "output", 1, WAN_ACTS_RECOMPUTE, &r);
}
