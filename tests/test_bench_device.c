/* tests/test_bench_device.c — `vgrpo bench gemm|attention|dit --device cuda` (bench/bench_device.c) where there is
 * no GPU: the one-line refusal (exit status 1, as dit-forward --device cuda's), the option errors (exit status 2),
 * and the code path run on the EMULATED device (VGRPO_EMULATE_DEVICE=1, kernels/cuda/emu/k_emu.h) at its tiny
 * shapes: every table row printed and labelled emulated, never as a GPU figure. The figures themselves are not
 * checked (benchmarks are commands, not timed tests); the GPU's are printed by the same commands on a GPU.
 * `make test` also runs these against the `make cuda` binary (CUDA_SMOKE). */
#include <stdio.h>
#include <string.h>

#include "tests/test.h"

static const char *const names[3] = {"gemm", "attention", "dit"};

TEST(bench_device_refusal) {
    const char *bin = test_vgrpo_bin();
    char out[4096], want[128];
    for (int i = 0; i < 3; i++) {
        CHECK(test_run(out, sizeof out, "env -u VGRPO_EMULATE_DEVICE %s bench %s --device cuda --quick", bin,
                       names[i]) == 1);
        snprintf(want, sizeof want, "vgrpo bench %s: --device cuda: ", names[i]);
        /* one line, on stderr alone: nothing was printed before it */
        CHECK_MSG(!strncmp(out, want, strlen(want)) && strchr(out, '\n') == out + strlen(out) - 1 &&
                      (strstr(out, "built without the CUDA backend") || strstr(out, "GPU")),
                  "%s: got: %s", names[i], out);
    }
}

TEST(bench_device_usage) {
    const char *bin = test_vgrpo_bin();
    char out[8192];
    CHECK(test_run(out, sizeof out, "%s bench gemm --device tpu", bin) == 2);
    CHECK_MSG(strstr(out, "--device: expected cpu or cuda, got \"tpu\""), "got: %s", out);
    CHECK(test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s bench dit --device cuda --profile", bin) == 2);
    CHECK_MSG(strstr(out, "--profile is for the CPU's figures only"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s bench peak --device cuda", bin) == 2); /* peak has no device figures */
    CHECK(test_run(out, sizeof out, "%s bench gemm --help", bin) == 0);
    CHECK_MSG(strstr(out, "--device cpu|cuda"), "got: %s", out);
}

/* Rows of the emulated run: a line holding `col` starts the table; every line after it up to the summary ends with
 * "(emulated)". Returns the number of rows. */
static int emulated_rows(const char *out, const char *col) {
    const char *p = strstr(out, col);
    if (!p || !(p = strchr(p, '\n'))) return -1;
    int rows = 0;
    for (p++; *p; ) {
        const char *e = strchr(p, '\n');
        if (!e) e = p + strlen(p);
        const int len = (int)(e - p);
        if (len && strncmp(p, "measured", 8)) {
            if (len < 10 || strncmp(e - 10, "(emulated)", 10)) return -1;
            rows++;
        }
        p = *e ? e + 1 : e;
    }
    return rows;
}

TEST(bench_device_emulated) {
    const char *bin = test_vgrpo_bin();
    char out[8192];
    const char *cols[3] = {"TFLOP/s\n", "f+b ms", "MFU"};
    const int want_rows[3] = {3, 1, 1};
    for (int i = 0; i < 3; i++) {
        REQUIRE(test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s bench %s --device cuda --quick 2>&1", bin,
                         names[i]) == 0);
        printf("  bench %s --device cuda (emulated):\n%s", names[i], out);
        CHECK_MSG(!strncmp(out, "device: EMULATED (VGRPO_EMULATE_DEVICE=1", 40), "%s: got: %s", names[i], out);
        CHECK_MSG(strstr(out, "not a GPU figure"), "%s: got: %s", names[i], out);
        CHECK_MSG(emulated_rows(out, cols[i]) == want_rows[i], "%s: rows %d, got: %s", names[i],
                  emulated_rows(out, cols[i]), out);
    }
    CHECK(test_run(out, sizeof out, "VGRPO_EMULATE_DEVICE=1 %s bench gemm --device cuda --quick", bin) == 0);
    CHECK_MSG(strstr(out, "measured bf16 GEMM peak (the square 128^3 row): ") && strstr(out, "(EMULATED: not a GPU figure)"),
              "got: %s", out);
}
