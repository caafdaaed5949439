/* tests/test_dev_window.c — two experts in one device window (model/dit/wan_dev_exec.h wan_dev_exec_window: the
 * trainer's ZeRO stage 3 with both experts trained, trainer/dp/dp_dev.h), on the EMULATED device:
 *   - the pair holds one bf16 copy and one gradient buffer (6 bytes per parameter less than two copies with
 *     gradients, counted by the emulated allocator), and forgetting the first model frees both;
 *   - the resident expert's forward equals its own copy's on another executor bit for bit, after either was made
 *     resident (wan_dev_exec_sync uploads and makes it resident);
 *   - the other expert's forward and backward are refused, naming the window, and so is every forward after the
 *     window is emptied (wan_dev_exec_set_resident NULL: what the optimizer step does);
 *   - a window is refused for a model copied already, and for two configs.
 * The trainer's use of it (the expert phases: the same checkpoints as ZeRO stage 0, parity 0) is in
 * tests/test_dev_dp.c. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/dit/wan_dev_exec.h"
#include "tests/test.h"
#include "tests/wan_test_util.h"

/* One forward of m on x at a small shape: out [B, C_out, F, H, W]. */
static int forward(wan_dev_exec *x, const wan_model *m, float *out) {
    const wan_config *c = &m->cfg;
    const wan_shape sh = {.B = 2, .F = 2, .H = 4, .W = 4, .L = 4};
    const size_t nx = (size_t)sh.B * c->in_channels * sh.F * sh.H * sh.W, ne = (size_t)sh.B * sh.L * c->text_dim;
    float *xin = malloc(sizeof(float) * nx), *enc = malloc(sizeof(float) * ne), ts[2] = {900.0f, 250.0f};
    wan_dev_acts *a = wan_dev_exec_acts(x, c, &sh, WAN_ACTS_INFER, 1, 0);
    int rc = -1;
    if (xin && enc && a) {
        core_philox_normal(xin, (int64_t)nx, 3, 0, 0, 4);
        core_philox_normal(enc, (int64_t)ne, 4, 0, 0, 4);
        rc = wan_dev_exec_forward(x, m, a, out, xin, ts, enc);
    }
    wan_dev_acts_free(a);
    free(xin), free(enc);
    return rc;
}

TEST(dev_window_two_experts_one_copy) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model m0, m1;
    REQUIRE_OK(wan_model_init(&m0, &c));
    REQUIRE_OK(wan_model_init(&m1, &c));
    wt_random_params(&m0, 31);
    wt_random_params(&m1, 32);
    const int64_t n = m0.layout.numel;
    const size_t no = (size_t)2 * c.out_channels * 2 * 4 * 4;
    float *o_ref0 = malloc(sizeof(float) * no), *o_ref1 = malloc(sizeof(float) * no), *o = malloc(sizeof(float) * no);
    REQUIRE(o_ref0 && o_ref1 && o);

    /* two copies with gradients (another executor): the reference outputs and the memory without a window */
    size_t held0, held1, held2, peak;
    k_emu_mem_stats(&held0, &peak);
    wan_dev_exec *y = wan_dev_exec_new(&k_emu_ops);
    REQUIRE(y);
    REQUIRE_OK(wan_dev_exec_zero_grads(y, &m0));
    REQUIRE_OK(wan_dev_exec_zero_grads(y, &m1));
    k_emu_mem_stats(&held1, &peak);
    REQUIRE_OK(forward(y, &m0, o_ref0));
    REQUIRE_OK(forward(y, &m1, o_ref1));
    const size_t two = held1 - held0;
    wan_dev_exec_close(y); /* frees the copies */

    wan_dev_exec *x = wan_dev_exec_new(&k_emu_ops);
    REQUIRE(x);
    k_emu_mem_stats(&held0, &peak);
    REQUIRE_OK(wan_dev_exec_window(x, &m0, &m1));
    k_emu_mem_stats(&held1, &peak);
    const size_t one = held1 - held0;
    printf("  device bytes: two copies with gradients %zu, one window %zu (%lld parameters each)\n", two, one,
           (long long)n);
    CHECK_MSG(two - one == (size_t)n * 6, "a window saves one bf16 copy and one fp32 gradient buffer: %zu", two - one);

    /* the window holds m0's weights (its copy was made first): resident; m1 refused */
    CHECK(wan_dev_exec_resident(x, &m0) && !wan_dev_exec_resident(x, &m1));
    REQUIRE_OK(forward(x, &m0, o));
    CHECK_MSG(memcmp(o, o_ref0, sizeof(float) * no) == 0, "transformer in the window differs from its own copy");
    CHECK(forward(x, &m1, o) != 0 && strstr(core_last_error(), "not on the device") &&
          strstr(core_last_error(), "share one window"));
    /* m1 made resident by a sync (an upload; its own proj_out.bias was uploaded with the window), then m0 again */
    REQUIRE_OK(wan_dev_exec_sync(x, &m1, 5));
    CHECK(wan_dev_exec_resident(x, &m1) && !wan_dev_exec_resident(x, &m0));
    REQUIRE_OK(forward(x, &m1, o));
    CHECK_MSG(memcmp(o, o_ref1, sizeof(float) * no) == 0, "transformer_2 in the window differs from its own copy");
    CHECK(forward(x, &m0, o) != 0);
    REQUIRE_OK(wan_dev_exec_sync(x, &m0, 5));
    REQUIRE_OK(forward(x, &m0, o));
    CHECK(memcmp(o, o_ref0, sizeof(float) * no) == 0);
    /* emptied (the optimizer step): neither runs */
    REQUIRE_OK(wan_dev_exec_set_resident(x, NULL));
    CHECK(forward(x, &m0, o) != 0 && forward(x, &m1, o) != 0 && strstr(core_last_error(), "neither"));
    /* refusals: a model copied already; two configs */
    wan_model m2;
    wan_config c2 = c;
    c2.num_layers = c.num_layers + 1;
    REQUIRE_OK(wan_model_init(&m2, &c2));
    CHECK(wan_dev_exec_window(x, &m0, &m1) != 0 && strstr(core_last_error(), "has a device copy already"));
    CHECK(wan_dev_exec_window(x, &m2, &m0) != 0 && strstr(core_last_error(), "one config"));
    /* forgetting the first frees both (the executor's staging stays) */
    size_t held3;
    k_emu_mem_stats(&held3, &peak);
    wan_dev_exec_forget(x, &m0);
    k_emu_mem_stats(&held2, &peak);
    CHECK_MSG(held3 - held2 == one, "forgetting the window's first model freed %zu of its %zu bytes", held3 - held2, one);
    CHECK(wan_dev_exec_resident(x, &m1)); /* no copy of m1 left: in no window */
    wan_dev_exec_close(x);
    wan_model_free(&m2), wan_model_free(&m0), wan_model_free(&m1);
    free(o_ref0), free(o_ref1), free(o);
}
