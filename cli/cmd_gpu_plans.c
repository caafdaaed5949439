/* cli/cmd_gpu_plans.c — `vgrpo gpu-plans [--gpu h100|h200|all] [--fused] [--verbose]`: the cuDNN attention plans of
 * the Wan DiT built for a described GPU on this machine, no GPU needed (kernels/cuda/attn_plans.c). The plain build
 * answers with one line and exit status 1. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "core/error.h"
#if defined(VGRPO_CUDA) && VGRPO_CUDA
#include "kernels/cuda/k_cuda.h"
#endif

static void usage(FILE *f) {
    fprintf(f, "usage: vgrpo gpu-plans [--gpu h100|h200|all] [--fused] [--verbose]\n\n"
               "Builds every cuDNN attention graph the Wan DiT runs (self and cross attention, forward and the\n"
               "deterministic backward; tiny, Wan 1.3B and A14B shapes) for a described H100 / H200 and prints the\n"
               "engine, knobs, notes and workspace of each plan. Needs the CUDA build (make cuda), cuDNN >= 9.19 and\n"
               "NVRTC; no GPU: without a driver a plan is \"compiled\" (NVRTC built its kernel; loading it needs a\n"
               "driver), on a GPU machine \"finalised\".\n"
               "  --gpu G     h100, h200 or all (default all)\n"
               "  --fused     also the fused SDPA_FWD / SDPA_BWD operations and the atomic-dQ backward (tiny shape)\n"
               "  --verbose   every configuration the heuristics offered, with what became of it\n");
}

int cmd_gpu_plans(int argc, char **argv) {
    const char *gpu = "all";
    int fused = 0, verbose = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--gpu") && i + 1 < argc) {
            gpu = argv[++i];
        } else if (!strcmp(argv[i], "--fused")) {
            fused = 1;
        } else if (!strcmp(argv[i], "--verbose")) {
            verbose = 1;
        } else {
            fprintf(stderr, "vgrpo gpu-plans: unknown option \"%s\"\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (strcmp(gpu, "h100") && strcmp(gpu, "h200") && strcmp(gpu, "all")) {
        fprintf(stderr, "vgrpo gpu-plans: --gpu: expected h100, h200 or all, got \"%s\"\n", gpu);
        return 2;
    }
#if defined(VGRPO_CUDA) && VGRPO_CUDA
    const char *gpus[2] = {"h100", "h200"};
    for (int i = 0; i < 2; i++) {
        if (strcmp(gpu, "all") && strcmp(gpu, gpus[i])) continue;
        if (k_cuda_attention_plans(stdout, gpus[i], fused, verbose)) {
            fflush(stdout);
            fprintf(stderr, "vgrpo gpu-plans: %s\n", core_last_error());
            return 1;
        }
    }
    return 0;
#else
    (void)fused, (void)verbose;
    fprintf(stderr, "vgrpo gpu-plans: built without the CUDA backend (make cuda)\n");
    return 1;
#endif
}
