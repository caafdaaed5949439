/* tests/test_wan_model.c — properties of the Wan transformer that need no reference: batch invariance (a sample
 * alone vs in a batch of 3, bitwise, output and input gradients), thread-count invariance, recompute == store
 * (bitwise, every gradient), inference == training forward, the self-attention function pointer, misuse errors. */
#include <omp.h>
#include <stdio.h>

#include "tests/test.h"
#include "tests/wan_test_util.h"

typedef struct {
    wan_shape sh;
    int64_t nx, nt, ne, no;
    float *x, *t, *e, *go;
} inputs;

static void make_inputs(inputs *in, const wan_config *c, int B, int per_token, unsigned long long seed) {
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

static void free_inputs(inputs *in) { free(in->x), free(in->t), free(in->e), free(in->go); }

/* Forward (+ backward when mode != INFER) into freshly allocated out, dx, de; grads of m zeroed first. */
static void run(wan_model *m, const inputs *in, wan_acts_mode mode, const wan_exec *ex, float **out, float **dx,
                float **de) {
    wan_acts *A = wan_acts_new(&m->cfg, &in->sh, mode);
    REQUIRE(A != NULL);
    *out = calloc(in->no, sizeof(float));
    REQUIRE_OK(wan_forward(m, A, ex, *out, in->x, in->t, in->e));
    if (mode != WAN_ACTS_INFER) {
        REQUIRE_OK(wan_model_alloc_grads(m));
        wan_model_zero_grads(m);
        *dx = calloc(in->nx, sizeof(float)), *de = calloc(in->ne, sizeof(float));
        REQUIRE_OK(wan_backward(m, A, ex, *dx, *de, in->go));
    }
    wan_acts_free(A);
}

static void batch_mates(int per_token) {
    wan_config c = wt_small_config(4, 1);
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wt_random_params(&m, 11);
    inputs big, one;
    make_inputs(&big, &c, 3, per_token, 100);
    make_inputs(&one, &c, 1, per_token, 200);
    /* sample 1 of the batch, alone */
    memcpy(one.x, big.x + one.nx, one.nx * sizeof(float));
    memcpy(one.t, big.t + one.nt, one.nt * sizeof(float));
    memcpy(one.e, big.e + one.ne, one.ne * sizeof(float));
    memcpy(one.go, big.go + one.no, one.no * sizeof(float));
    float *o3, *dx3, *de3, *o1, *dx1, *de1;
    run(&m, &big, WAN_ACTS_STORE, NULL, &o3, &dx3, &de3);
    run(&m, &one, WAN_ACTS_STORE, NULL, &o1, &dx1, &de1);
    CHECK(memcmp(o3 + one.no, o1, one.no * sizeof(float)) == 0);
    CHECK(memcmp(dx3 + one.nx, dx1, one.nx * sizeof(float)) == 0);
    CHECK(memcmp(de3 + one.ne, de1, one.ne * sizeof(float)) == 0);
    CHECK(wt_max_rel(o3, o1, one.no) > 1e-3); /* the batch mates really differ */
    free(o3), free(dx3), free(de3), free(o1), free(dx1), free(de1);
    free_inputs(&big), free_inputs(&one);
    wan_model_free(&m);
}

TEST(wan_batch_mates_bitwise) { batch_mates(0); }
TEST(wan_batch_mates_bitwise_per_token) { batch_mates(1); }

/* Recompute == store (every gradient bitwise); inference forward == training forward; 1 thread == default. */
TEST(wan_recompute_store_infer_threads_identical) {
    for (int cross_norm = 0; cross_norm <= 1; cross_norm++) {
        wan_config c = wt_small_config(4, cross_norm);
        wan_model m;
        REQUIRE_OK(wan_model_init(&m, &c));
        wt_random_params(&m, 21 + cross_norm);
        inputs in;
        make_inputs(&in, &c, 2, cross_norm, 300);
        float *os, *dxs, *des, *orc, *dxr, *der, *oi, *o1, *dx1, *de1;
        run(&m, &in, WAN_ACTS_STORE, NULL, &os, &dxs, &des);
        float *gs = malloc(m.layout.numel * sizeof(float));
        memcpy(gs, m.grads, m.layout.numel * sizeof(float));
        run(&m, &in, WAN_ACTS_RECOMPUTE, NULL, &orc, &dxr, &der);
        CHECK(memcmp(os, orc, in.no * sizeof(float)) == 0);
        CHECK(memcmp(dxs, dxr, in.nx * sizeof(float)) == 0);
        CHECK(memcmp(des, der, in.ne * sizeof(float)) == 0);
        CHECK(memcmp(gs, m.grads, m.layout.numel * sizeof(float)) == 0);
        run(&m, &in, WAN_ACTS_INFER, NULL, &oi, NULL, NULL);
        CHECK(memcmp(os, oi, in.no * sizeof(float)) == 0);
        int nt = omp_get_max_threads();
        omp_set_num_threads(1);
        run(&m, &in, WAN_ACTS_STORE, NULL, &o1, &dx1, &de1);
        omp_set_num_threads(nt);
        CHECK(memcmp(os, o1, in.no * sizeof(float)) == 0);
        CHECK(memcmp(dxs, dx1, in.nx * sizeof(float)) == 0);
        CHECK(memcmp(gs, m.grads, m.layout.numel * sizeof(float)) == 0);
        /* memory: recompute keeps less than store, inference least */
        wan_acts *s = wan_acts_new(&c, &in.sh, WAN_ACTS_STORE), *r = wan_acts_new(&c, &in.sh, WAN_ACTS_RECOMPUTE);
        wan_acts *i = wan_acts_new(&c, &in.sh, WAN_ACTS_INFER);
        CHECK(wan_acts_bytes(i) < wan_acts_bytes(r) && wan_acts_bytes(r) < wan_acts_bytes(s));
        wan_acts_free(s), wan_acts_free(r), wan_acts_free(i);
        free(gs), free(os), free(dxs), free(des), free(orc), free(dxr), free(der), free(oi), free(o1), free(dx1);
        free(de1);
        free_inputs(&in);
        wan_model_free(&m);
    }
}

/* A self-attention through the function pointer: called once per block in forward and in backward, and (as it
 * delegates to the kernels) gives the default's results. */
typedef struct {
    int fwd, bwd;
} attn_count;

static int counting_fwd(void *ctx, kb_out o, float *lse, kb_in q, kb_in k, kb_in v, int B, int S, int H, int Dh) {
    ((attn_count *)ctx)->fwd++;
    k_cpu_ops.attention_forward(o.p, lse, q.p, k.p, v.p, B, S, S, H, Dh, (float)(1.0 / sqrt((double)Dh)));
    return 0;
}

static int counting_bwd(void *ctx, kb_out dq, kb_out dk, kb_out dv, kb_in dout, kb_in q, kb_in k, kb_in v, kb_in o,
                        const float *lse, int B, int S, int H, int Dh) {
    ((attn_count *)ctx)->bwd++;
    k_cpu_ops.attention_backward(dq.p, dk.p, dv.p, dout.p, q.p, k.p, v.p, o.p, lse, B, S, S, H, Dh,
                                 (float)(1.0 / sqrt((double)Dh)));
    return 0;
}

static int failing_fwd(void *ctx, kb_out o, float *lse, kb_in q, kb_in k, kb_in v, int B, int S, int H, int Dh) {
    return core_error("ring peer 3 went away");
}

TEST(wan_self_attention_pointer) {
    wan_config c = wt_small_config(4, 1);
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wt_random_params(&m, 31);
    inputs in;
    make_inputs(&in, &c, 1, 0, 400);
    attn_count cnt = {0, 0};
    wan_exec ex = {&k_cpu_ops, counting_fwd, counting_bwd, &cnt, NULL, 0, NULL, NULL, NULL};
    float *o0, *dx0, *de0, *o1, *dx1, *de1;
    run(&m, &in, WAN_ACTS_STORE, NULL, &o0, &dx0, &de0);
    run(&m, &in, WAN_ACTS_STORE, &ex, &o1, &dx1, &de1);
    CHECK(cnt.fwd == c.num_layers && cnt.bwd == c.num_layers);
    CHECK(memcmp(o0, o1, in.no * sizeof(float)) == 0 && memcmp(dx0, dx1, in.nx * sizeof(float)) == 0);
    wan_exec bad = {NULL, failing_fwd, counting_bwd, &cnt, NULL, 0, NULL, NULL, NULL};
    wan_acts *A = wan_acts_new(&c, &in.sh, WAN_ACTS_INFER);
    CHECK(wan_forward(&m, A, &bad, o1, in.x, in.t, in.e) == -1);
    CHECK(strstr(core_last_error(), "block 0") && strstr(core_last_error(), "ring peer 3"));
    /* misuse: backward on inference activations, backward without gradients */
    CHECK(wan_backward(&m, A, NULL, NULL, NULL, in.go) == -1 && strstr(core_last_error(), "inference"));
    wan_acts_free(A);
    wan_model m2;
    REQUIRE_OK(wan_model_init(&m2, &c));
    A = wan_acts_new(&c, &in.sh, WAN_ACTS_STORE);
    CHECK(wan_backward(&m2, A, NULL, NULL, NULL, in.go) == -1 && strstr(core_last_error(), "gradients"));
    wan_acts_free(A);
    /* shapes the patch grid or the RoPE table cannot take */
    wan_shape odd = {1, 2, 5, 8, 5, 0};
    CHECK(wan_acts_new(&c, &odd, WAN_ACTS_INFER) == NULL && strstr(core_last_error(), "patch size"));
    wan_shape big = {1, 2, 4, 2 * 65, 5, 0};
    CHECK(wan_acts_new(&c, &big, WAN_ACTS_INFER) == NULL && strstr(core_last_error(), "rope_max_seq_len"));
    free(o0), free(dx0), free(de0), free(o1), free(dx1), free(de1);
    free_inputs(&in);
    wan_model_free(&m), wan_model_free(&m2);
}
