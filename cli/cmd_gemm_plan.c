/* cli/cmd_gemm_plan.c — `vgrpo gemm-plan`: runs k_gemm_plan_selftest (kernels/cuda/gemm_lt_selftest.c) against the
 * cuBLASLt this machine loads: every GEMM class of the Wan DiT built with the real library and read back, and on a
 * GPU the algorithm each class is pinned to at M = 1, 2 and 8 samples; --bgrad (GPU): k_gemm_bgrad_compare. Exit
 * status 0 (all matched), 1 (a mismatch, no library, no GPU for --bgrad, or the plain build), 2 (usage). */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "core/error.h"
#include "kernels/cuda/k_cuda.h"

int cmd_gemm_plan(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: vgrpo gemm-plan\n\nBuilds the cuBLASLt descriptors of every GEMM the Wan DiT runs (no GPU "
               "needed) and reads them back\nagainst the column-major view gemm_lt.c means; with a GPU, also plans "
               "each at its canonical M\nand checks the algorithm at M = 1, 2 and 8 samples of tokens. `make cuda` "
               "binaries only.\n\n"
               "  --bgrad  on a GPU: the weight-gradient GEMM's bias gradient, cuBLASLt's fused BGRADB vs the plain\n"
               "           GEMM plus the fixed-order column sum (ms per call, error vs a double sum): which to keep\n");
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "--bgrad")) {
        if (k_gemm_bgrad_compare(stdout, 20)) {
            fflush(stdout);
            fprintf(stderr, "vgrpo gemm-plan --bgrad: %s\n", core_last_error());
            return 1;
        }
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "vgrpo gemm-plan: unexpected argument \"%s\" (only --bgrad)\n", argv[1]);
        return 2;
    }
    if (k_gemm_plan_selftest(stdout)) {
        fflush(stdout);
        fprintf(stderr, "vgrpo gemm-plan: %s\n", core_last_error());
        return 1;
    }
    return 0;
}
