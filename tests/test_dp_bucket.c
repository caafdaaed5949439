/* tests/test_dp_bucket.c — the gradient buckets reduced during the backward (trainer/dp/dp_bucket.h), in process:
 *   - dp_bucket_plan on the tiny model's layout and on a LoRA adapter's: whole blocks from the last down, closed at
 *     the cap, the rest at the end; a layout whose blocks are out of order is refused naming the tensor;
 *   - the backward's hook (wan_exec.grad_ready, model/dit/wan_backward.c) on the CPU and on the emulated device: once
 *     per block, last to first, then -1; when it fires for block 1, block 1's gradients are already their final
 *     values bit for bit and block 0's are still untouched (zero);
 *   - the emulated device's streams (kernels/cuda/emu/emu_stream.h): block_sum on a second stream is refused until
 *     that stream waited for the device's own stream's work, and the optimizer's entries refuse to run until the
 *     device's own stream waited for the second stream's.
 * The multi-rank runs (buckets on and off: the same bits) are in tests/test_dev_dp.c. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/dit/wan_dev_exec.h"
#include "model/dit/wan_executor.h"
#include "model/dit/wan_lora.h"
#include "tests/test.h"
#include "trainer/dp/dp_bucket.h"

/* [lo, hi) of block i in L. */
static void block_range(const wan_layout *L, int i, int64_t *lo, int64_t *hi) {
    char p[32];
    snprintf(p, sizeof p, "blocks.%d.", i);
    *lo = -1, *hi = -1;
    for (int t = 0; t < L->count; t++)
        if (!strncmp(L->tensors[t].name, p, strlen(p))) {
            if (*lo < 0) *lo = L->tensors[t].offset;
            *hi = L->tensors[t].offset + L->tensors[t].numel;
        }
}

static void check_bucket(const dp_bucket *b, int64_t lo, int64_t hi, int after, const char *what) {
    CHECK_MSG(b->lo == lo && b->hi == hi && b->after == after, "%s: [%lld, %lld) after %d, expected [%lld, %lld) after %d",
              what, (long long)b->lo, (long long)b->hi, b->after, (long long)lo, (long long)hi, after);
}

TEST(dp_bucket_plan_tiny_and_lora) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_layout L;
    REQUIRE_OK(wan_layout_init(&L, &c));
    int64_t lo0, hi0, lo1, hi1;
    block_range(&L, 0, &lo0, &hi0);
    block_range(&L, 1, &lo1, &hi1);
    REQUIRE(c.num_layers == 2 && hi0 == lo1 && lo0 > 0 && hi1 < L.numel);
    const int64_t blk = (hi1 - lo1) * 4; /* bytes of one block's fp32 gradients */
    printf("  tiny: %lld values, blocks [%lld, %lld) [%lld, %lld), %lld bytes a block\n", (long long)L.numel,
           (long long)lo0, (long long)hi0, (long long)lo1, (long long)hi1, (long long)blk);
    dp_bucket *b = NULL;
    int n = 0;
    /* a bucket a block, then below the blocks, then proj_out */
    REQUIRE_OK(dp_bucket_plan(&L, blk, &b, &n));
    REQUIRE(n == 4);
    check_bucket(&b[0], lo1, hi1, 1, "cap 1 block, bucket 0");
    check_bucket(&b[1], lo0, lo1, 0, "cap 1 block, bucket 1");
    check_bucket(&b[2], 0, lo0, -1, "cap 1 block, bucket 2");
    check_bucket(&b[3], hi1, L.numel, -1, "cap 1 block, bucket 3");
    free(b);
    /* a cap of 1.5 blocks: both blocks in one bucket, closed after block 0 */
    REQUIRE_OK(dp_bucket_plan(&L, blk + blk / 2, &b, &n));
    REQUIRE(n == 3);
    check_bucket(&b[0], lo0, hi1, 0, "cap 1.5 blocks, bucket 0");
    check_bucket(&b[1], 0, lo0, -1, "cap 1.5 blocks, bucket 1");
    free(b);
    /* 25 MiB: nothing closes before the end */
    REQUIRE_OK(dp_bucket_plan(&L, 25 << 20, &b, &n));
    REQUIRE(n == 2);
    check_bucket(&b[0], 0, hi1, -1, "25 MiB, bucket 0");
    check_bucket(&b[1], hi1, L.numel, -1, "25 MiB, bucket 1");
    free(b);
    /* a LoRA adapter's layout: the same structure */
    wan_lora l;
    const wan_lora_config lc = {8, 16.0, WAN_LORA_ALL, 7};
    REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
    block_range(&l.layout, 0, &lo0, &hi0);
    block_range(&l.layout, 1, &lo1, &hi1);
    REQUIRE_OK(dp_bucket_plan(&l.layout, 4, &b, &n));
    REQUIRE(n == 4);
    check_bucket(&b[0], lo1, hi1, 1, "LoRA, bucket 0");
    check_bucket(&b[1], lo0, lo1, 0, "LoRA, bucket 1");
    check_bucket(&b[2], 0, lo0, -1, "LoRA, bucket 2");
    check_bucket(&b[3], hi1, l.layout.numel, -1, "LoRA, bucket 3");
    free(b);
    wan_lora_free(&l);
    /* blocks out of order: refused, naming the tensor */
    wan_tensor t = L.tensors[1];
    int k = 0;
    while (strncmp(L.tensors[k].name, "blocks.1.", 9)) k++;
    snprintf(L.tensors[1].name, sizeof L.tensors[1].name, "%s", L.tensors[k].name); /* a block-1 name before block 0 */
    CHECK(dp_bucket_plan(&L, blk, &b, &n) == -1 && strstr(core_last_error(), "out of block order") &&
          strstr(core_last_error(), L.tensors[k].name));
    L.tensors[1] = t;
    wan_layout_free(&L);
}

/* What the hook saw: the blocks in call order, and the gradients when block 1 was announced. */
typedef struct {
    const wan_model *m;
    wan_dev_exec *x; /* NULL: the CPU model's gradients */
    int calls[8], n;
    float *snap;
} seen;

static int grads_now(seen *s, float *out) {
    if (!s->x) return memcpy(out, s->m->grads, sizeof(float) * (size_t)s->m->layout.numel), 0;
    return wan_dev_grads_download(wan_dev_exec_model(s->x, s->m), out);
}

static int on_ready(void *ctx, const wan_model *m, int block) {
    seen *s = ctx;
    if (m != s->m) return core_error("hook: another model");
    if (s->n < 8) s->calls[s->n] = block;
    s->n++;
    return block == 1 ? grads_now(s, s->snap) : 0;
}

/* One forward and backward of the tiny model with the hook, on the CPU (x NULL) or the emulated device. */
static void hook_order(wan_dev_exec *x) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wan_params_init_random(&m, 11);
    const int64_t np = m.layout.numel;
    seen s = {.m = &m, .x = x, .snap = calloc((size_t)np, sizeof(float))};
    float *fin = calloc((size_t)np, sizeof(float));
    const wan_shape sh = {.B = 1, .F = 2, .H = 4, .W = 4, .L = 4};
    const int64_t nx = 16 * 2 * 4 * 4, ne = 4 * c.text_dim;
    float *xin = malloc(sizeof(float) * nx), *out = malloc(sizeof(float) * nx), *enc = malloc(sizeof(float) * ne);
    for (int64_t i = 0; i < nx; i++) xin[i] = (float)((i * 37) % 19) / 19.0f - 0.5f;
    for (int64_t i = 0; i < ne; i++) enc[i] = (float)((i * 11) % 13) / 13.0f - 0.5f;
    const float t = 500.0f;
    const wan_exec ex = {.dev = x, .grad_ready = on_ready, .grad_ready_ctx = &s};
    REQUIRE(s.snap && fin);
    wan_exec_acts *a = wan_exec_acts_new(&ex, &c, &sh, WAN_ACTS_STORE);
    REQUIRE(a);
    if (!x) REQUIRE_OK(wan_model_alloc_grads(&m));
    REQUIRE_OK(wan_exec_zero_grads(&ex, &m));
    REQUIRE_OK(wan_exec_forward(&m, a, &ex, out, xin, &t, enc));
    REQUIRE_OK(wan_exec_backward(&m, a, &ex, out)); /* dout = the output: any nonzero gradient */
    CHECK_MSG(s.n == 3 && s.calls[0] == 1 && s.calls[1] == 0 && s.calls[2] == -1, "%s: %d calls: %d %d %d",
              x ? "device" : "CPU", s.n, s.calls[0], s.calls[1], s.calls[2]);
    REQUIRE_OK(grads_now(&s, fin));
    int64_t lo0, hi0, lo1, hi1;
    block_range(&m.layout, 0, &lo0, &hi0);
    block_range(&m.layout, 1, &lo1, &hi1);
    CHECK_MSG(memcmp(s.snap + lo1, fin + lo1, sizeof(float) * (size_t)(hi1 - lo1)) == 0,
              "%s: block 1's gradients changed after its hook", x ? "device" : "CPU");
    int zero0 = 1, nonzero0 = 0;
    for (int64_t i = lo0; i < hi0; i++) zero0 &= s.snap[i] == 0.0f, nonzero0 |= fin[i] != 0.0f;
    CHECK_MSG(zero0 && nonzero0, "%s: block 0 at block 1's hook: all zero %d; afterwards some nonzero %d",
              x ? "device" : "CPU", zero0, nonzero0);
    /* a failing hook stops the backward with its error */
    s.m = NULL;
    CHECK(wan_exec_backward(&m, a, &ex, out) == -1 && strstr(core_last_error(), "gradient hook: hook: another model"));
    wan_exec_acts_free(a);
    free(s.snap), free(fin), free(xin), free(out), free(enc);
    if (x) wan_dev_exec_forget(x, &m);
    wan_model_free(&m);
}

TEST(dp_bucket_hook_order_cpu_and_device) {
    hook_order(NULL);
    wan_dev_exec *x = wan_dev_exec_new(&k_emu_ops);
    REQUIRE(x);
    hook_order(x);
    wan_dev_exec_close(x);
}

TEST(dp_bucket_emulated_stream_contract) {
    const k_dev_ops *d = &k_emu_ops;
    void *s = d->stream_new(), *e1 = d->event_new(), *e2 = d->event_new();
    REQUIRE(s && e1 && e2);
    float blocks[4] = {1, 2, 3, 4}, out[2], g[2] = {1, 2}, p[2] = {0}, m[2] = {0}, v[2] = {0};
    double ss = 0;
    CHECK(d->stream_wait(s, e1) == -1); /* never recorded */
    /* the device's stream ran a GEMM (a backward's): a stream that has not waited for it may not reduce */
    static _Alignas(16) kb_bf16 a16[64], b16[64];
    static _Alignas(16) float c32[64];
    k_gemm_args gm = {.M = 8, .N = 8, .K = 8, .alpha = 1, .A = {a16, KB_BF16}, .lda = 8, .B = {b16, KB_BF16}, .ldb = 8,
                      .C = {c32, KB_F32}, .ldc = 8};
    REQUIRE_OK(d->gemm(&gm));
    void *prev = d->stream_use(s);
    CHECK(prev == NULL);
    CHECK(d->block_sum(out, blocks, 2, 2, 2) == -1 && strstr(core_last_error(), "has not waited"));
    REQUIRE_OK(d->event_record(e1, NULL));
    REQUIRE_OK(d->stream_wait(s, e1));
    CHECK(d->block_sum(out, blocks, 2, 2, 2) == 0); /* now ordered after the GEMM */
    CHECK(out[0] == 4 && out[1] == 6);
    CHECK(d->stream_use(NULL) == s);
    /* the optimizer before the device's stream waited for the second stream: refused */
    kb_adamw_scalars sc = {0};
    CHECK(d->sumsq(kb_in_f32(g), 2, &ss) == -1 && strstr(core_last_error(), "not waited for"));
    CHECK(d->adamw_update(p, m, v, kb_in_f32(g), NULL, sc, NULL, 2) == -1);
    REQUIRE_OK(d->event_record(e2, s));
    REQUIRE_OK(d->stream_wait(NULL, e2));
    CHECK(d->sumsq(kb_in_f32(g), 2, &ss) == 0);
    CHECK(ss == 5.0);
    d->event_free(e1), d->event_free(e2), d->stream_free(s);
}
