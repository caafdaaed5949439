/* kernels/cuda/attn_plans.c — `vgrpo gpu-plans`: every cuDNN attention graph the Wan DiT runs, built and planned
 * for a described H100 / H200 (CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR), on any machine with cuDNN and NVRTC, no GPU
 * needed; see k_cuda.h (k_cuda_attention_plans) for the output.
 *
 * The graphs are exactly those attn_cudnn.c executes (kc_attn_key_for: one batch element, the head group under the
 * workspace budget): self-attention Sq = Skv = S and cross-attention Skv = the text length, forward and
 * deterministic backward, at the tiny preset's shape and the Wan 1.3B (H 12) and A14B (H 40) ones at 32,760 video
 * tokens (81 frames at 480x832) and 512 text tokens. Without a GPU driver the runtime-compiled engines are
 * compiled by NVRTC but their module cannot be loaded (attn_libs.c), so a plan line then says "compiled"; with a
 * driver (the GPU machine) it says "finalised". */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cuda/attn_graph.h"
#include "kernels/cuda/dynload.h"
#include "kernels/cuda/k_cuda.h"

typedef struct {
    const char *name;
    int S, L, H, Dh;
} dit_shape;

static const dit_shape shapes[] = {
    {"tiny", 64, 16, 4, 32},
    {"wan2.1-1.3b", 32760, 512, 12, 128},
    {"wan2.2-a14b", 32760, 512, 40, 128},
};

static void print_cfg(void *ctx, const kc_attn_cfg_info *i) {
    FILE *out = ctx;
    fprintf(out, "    config: heuristics %s engine %lld knobs %s notes %s workspace %lld: %s%s%s\n",
            i->mode ? "FALLBACK" : "A", (long long)i->engine, i->knobs, i->notes, (long long)i->cfg_workspace,
            i->status == 0 ? "finalised" : i->chosen ? "compiled, not loadable without a driver" : "refused",
            i->status != 0 && !i->chosen && i->message[0] ? ": " : "", i->status != 0 && !i->chosen ? i->message : "");
}

/* Builds one key's plan for devprop and prints its line; returns 0 when the plan finalised or compiled. */
static int one_plan(FILE *out, cudnnBackendDescriptor_t devprop, const char *gpu, const char *what, kc_attn_key key,
                    int verbose, double *seconds) {
    kc_attn_plan p = {0};
    p.key = key;
    p.stop_at_load = 1;
    if (verbose) p.on_cfg = print_cfg, p.on_cfg_ctx = out;
    char ks[200];
    kc_attn_key_str(&key, ks, sizeof ks);
    int rc = kc_attn_plan_build(&p, NULL, devprop, kc_attn_workspace_budget());
    *seconds += p.build_s;
    if (rc) {
        fprintf(out, "plan %s %s %s: FAILED: %s\n", gpu, what, ks, core_last_error());
    } else {
        fprintf(out,
                "plan %s %s %s: %s engine %lld knobs %s notes %s workspace %lld extra %lld configs %d build %.2f s\n",
                gpu, what, ks, p.plan ? "finalised" : "compiled", (long long)p.engine, p.knobs, p.notes,
                (long long)p.workspace, (long long)p.extra_bytes, p.n_heur, p.build_s);
    }
    kc_attn_plan_free(&p);
    return rc;
}

int k_cuda_attention_plans(FILE *out, const char *gpu, int fused, int verbose) {
    if (kc_dynload()) return -1;
    size_t ver = kc_dnn.cudnnGetVersion();
    fprintf(out, "cuDNN %zu.%zu.%zu from %s\n", ver / 10000, ver / 100 % 100, ver % 100, kc_dynload_path(1));
    if (kc_attn_cudnn_version_ok(ver)) return -1;
    if (kc_attn_nvrtc_preload(kc_dynload_path(1))) return -1;
    fprintf(out, "NVRTC from %s\n", kc_attn_nvrtc_path());
    char drv[600];
    int have = kc_attn_driver_for_planning(drv, sizeof drv);
    fprintf(out, "driver: %s\n", drv);
    if (have < 0) return core_error("gpu-plans: %s: cuDNN offers no runtime-compiled attention engine without it", drv);
    const int64_t budget = kc_attn_workspace_budget();
    fprintf(out, "attention workspace budget %lld bytes (VGRPO_ATTN_WORKSPACE_GIB)\n", (long long)budget);
    cudnnBackendDescriptor_t devprop = NULL;
    if (kc_attn_devprop(gpu, &devprop)) return -1;
    int failed = 0;
    double seconds = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const dit_shape *s = &shapes[si];
        for (int cross = 0; cross < 2; cross++)
            for (int bwd = 0; bwd < 2; bwd++) {
                const int Skv = cross ? s->L : s->S;
                kc_attn_key k = kc_attn_key_for(bwd, s->S, Skv, s->H, s->Dh, 1, budget);
                /* batch invariance: the key of B = 1, 2 and 8 is this one (no batch size in it) */
                char what[96];
                snprintf(what, sizeof what, "%s %s", s->name, cross ? "cross" : "self");
                failed |= one_plan(out, devprop, gpu, what, k, verbose, &seconds) != 0;
            }
    }
    if (fused) { /* the fused operations and the atomic backward, at the tiny shape, for comparison */
        const dit_shape *s = &shapes[0];
        kc_attn_key k = kc_attn_key_for(1, s->S, s->S, s->H, s->Dh, 0, budget);
        one_plan(out, devprop, gpu, "tiny self (atomic dQ)", k, verbose, &seconds);
        for (int bwd = 0; bwd < 2; bwd++) {
            k = kc_attn_key_for(bwd, s->S, s->S, s->H, s->Dh, 1, budget);
            k.build = KC_ATTN_FUSED;
            one_plan(out, devprop, gpu, bwd ? "tiny self SDPA_BWD" : "tiny self SDPA_FWD", k, verbose, &seconds);
        }
    }
    fprintf(out, "%s: %s, %.1f s of plan building\n", gpu, failed ? "some DiT plans FAILED" : "every DiT plan built",
            seconds);
    kc_dnn.cudnnBackendDestroyDescriptor(devprop);
    return failed ? core_error("gpu-plans: a DiT attention plan failed for %s (see the lines above)", gpu) : 0;
}
