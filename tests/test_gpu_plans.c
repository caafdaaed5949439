/* tests/test_gpu_plans.c — the real cuDNN on this CPU: every attention graph the Wan DiT runs is built and planned
 * for a described H100 / H200 by `vgrpo gpu-plans` (kernels/cuda/attn_plans.c). Runs against the `make cuda`
 * binary (CUDA_SMOKE in the Makefile); skipped, saying so, with the plain build. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/test.h"

/* The plan line of `what` (e.g. "wan2.1-1.3b self backward"), or NULL. */
static const char *plan_line(const char *out, const char *gpu, const char *what, char *line, size_t cap) {
    char head[160];
    snprintf(head, sizeof head, "plan %s %s ", gpu, what);
    const char *p = strstr(out, head);
    if (!p) return NULL;
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n >= cap) n = cap - 1;
    memcpy(line, p, n);
    line[n] = 0;
    return line;
}

static long long field(const char *line, const char *name) {
    const char *p = strstr(line, name);
    return p ? atoll(p + strlen(name)) : -1;
}

/* Runs gpu-plans for one GPU; 0 = ran (out filled), 1 = skipped. */
static int run_plans(char *out, size_t cap, const char *gpu, const char *extra) {
    int rc = test_run(out, cap, "env -u LD_LIBRARY_PATH %s gpu-plans --gpu %s %s", test_vgrpo_bin(), gpu, extra);
    if (rc == 1 && strstr(out, "built without the CUDA backend")) {
        test_skip("plain build: make test runs this against the make cuda binary (CUDA_SMOKE)");
        return 1;
    }
    if (rc == 1 && strstr(out, "cuDNN: cannot load")) {
        test_skip("no cuDNN on this machine");
        return 1;
    }
    printf("%s", out);
    CHECK_MSG(rc == 0, "gpu-plans --gpu %s exited %d: %s", gpu, rc, out);
    return 0;
}

/* Every DiT graph (self and cross attention, forward and deterministic backward, tiny / 1.3B / A14B) built and
 * compiled (no driver here) or finalised (a driver) with an engine; the deterministic backward is the dP-workspace
 * variant: its workspace holds a bf16 H*Sq*Skv (padded) score matrix per call, the atomic variant's does not; the
 * self-attention backward at 32,760 tokens runs one head per call within the 4 GiB budget. */
static int check_dit_plans(const char *gpu, const char *extra, char *out, size_t cap) {
    if (run_plans(out, cap, gpu, extra)) return 1;
    CHECK_MSG(strstr(out, "every DiT plan built"), "%s", out);
    const char *shapes[3] = {"tiny", "wan2.1-1.3b", "wan2.2-a14b"};
    const char *kinds[4] = {"self forward", "self backward", "cross forward", "cross backward"};
    char what[96], line[1024];
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 4; k++) {
            snprintf(what, sizeof what, "%s %s", shapes[s], kinds[k]);
            CHECK_MSG(plan_line(out, gpu, what, line, sizeof line), "no plan line for %s %s", gpu, what);
            if (!plan_line(out, gpu, what, line, sizeof line)) continue;
            CHECK_MSG(strstr(line, ": compiled engine ") || strstr(line, ": finalised engine "), "%s", line);
            CHECK_MSG(field(line, " engine ") >= 0, "%s", line);
            CHECK_MSG(strstr(line, " composite"), "%s", line);
            if (k % 2) CHECK_MSG(strstr(line, " deterministic composite"), "%s", line);
        }
    /* the dP workspace: self backward at 32,760 tokens, one head: 32768 * 32768 * 2 bytes plus cuDNN's few hundred */
    for (int s = 1; s < 3; s++) {
        snprintf(what, sizeof what, "%s self backward", shapes[s]);
        REQUIRE(plan_line(out, gpu, what, line, sizeof line));
        CHECK_MSG(strstr(line, s == 1 ? " H 1 of 12 " : " H 1 of 40 "), "%s", line);
        long long ws = field(line, " workspace ");
        CHECK_MSG(ws >= 2147483648LL && ws <= 2147483648LL + 4096, "workspace %lld: %s", ws, line);
        CHECK_MSG(field(line, " extra ") == 32760LL * 4, "softmax_sum of one head: %s", line);
    }
    return 0;
}

TEST(gpu_plans_h100) {
    static char out[65536];
    if (check_dit_plans("h100", "--fused", out, sizeof out)) return;
    char line[1024];
    /* tiny self backward: deterministic dP workspace >= H*Sq*Skv*2 = 32768 bytes; the atomic dQ variant's is small */
    REQUIRE(plan_line(out, "h100", "tiny self backward", line, sizeof line));
    CHECK_MSG(field(line, " workspace ") >= 4 * 64 * 64 * 2, "%s", line);
    REQUIRE(plan_line(out, "h100", "tiny self (atomic dQ) backward", line, sizeof line));
    CHECK_MSG(field(line, " workspace ") < 4 * 64 * 64 * 2 && strstr(line, "nondeterministic"), "%s", line);
    CHECK_MSG(field(line, " extra ") == 4 * 64 * 4 * (1 + 32), "softmax_sum + fp32 dQ_accum: %s", line);
    /* cuDNN 9.19's fused SDPA_BWD operation does not build (why the composite graph is the path) */
    REQUIRE(plan_line(out, "h100", "tiny self SDPA_BWD", line, sizeof line));
    if (strstr(out, "cuDNN 9.19."))
        CHECK_MSG(strstr(line, "FAILED") && strstr(line, "operation graph finalize") && strstr(line, "BAD_PARAM"),
                  "%s", line);
}

TEST(gpu_plans_h200) {
    static char out[65536];
    check_dit_plans("h200", "", out, sizeof out);
}

TEST(gpu_plans_usage) {
    char out[4096];
    int rc = test_run(out, sizeof out, "%s gpu-plans --gpu a100", test_vgrpo_bin());
    CHECK_MSG(rc == 2 && strstr(out, "--gpu: expected h100, h200 or all, got \"a100\""), "rc %d: %s", rc, out);
    /* an NVRTC that cannot be loaded is named, before any plan is tried (the CUDA build only) */
    rc = test_run(out, sizeof out, "VGRPO_NVRTC_LIB=/nonexistent/libnvrtc.so.13 %s gpu-plans --gpu h100",
                  test_vgrpo_bin());
    if (strstr(out, "built without the CUDA backend") || strstr(out, "cuDNN: cannot load")) return;
    CHECK_MSG(rc == 1 && strstr(out, "NVRTC: cannot load $VGRPO_NVRTC_LIB=/nonexistent/libnvrtc.so.13") &&
                  !strstr(out, "plan h100"),
              "rc %d: %s", rc, out);
}
