/* kernels/cuda/check/gpu_check.c — the GPU check: every op of the CUDA backend (k_cuda_ops) against the fp32 CPU
 * reference in this same binary, on fresh random inputs at Wan shapes, then the parts registered from above kernels/
 * (check.h: the Wan DiT forward+backward against the fp32 CPU model, model/dit/check/check_dit.c; GRPO on the device,
 * cli/check/check_grpo.c), then the speed of cuBLASLt's bf16 GEMM and cuDNN's fused attention. One table, one closing
 * line `gpu_check: N rows, N failed, N skipped`; exit 0 when nothing failed, 1 when a row failed, 2 when the CUDA
 * backend cannot run here (one line saying why).
 * Built by `make cuda` as $(BUILD)/gpu_check, linked with the static CUDA runtime and a static libgomp so that it
 * needs only libc/libm on the GPU machine; cuBLASLt and cuDNN are dlopen'ed (scripts/gpu_check.sh finds them, runs
 * each group below as its own process with its own time-out, and gathers the JSON rows and a summary).
 *
 *   gpu_check [--group G] [--shapes wan|quick|small|tiny] [--json FILE] [--stage N] [--only SUBSTR] [--no-perf]
 *             [--perf-only] [--gemm-n N] [--attn-s S] [--rows R] [--seed N] [--quick] [--tiny] [--list-groups]
 *
 * --group: one group of rows (--list-groups prints them): env (the GPU, driver and libraries, a device memory round
 * trip), layers, flow, gemm, attention, invariance, block (one DiT block), dit, grpo, nccl, perf; default: all of them in
 * that order. --shapes (check.h): wan (default), quick (= --quick), small, tiny (= --tiny).
 * --json FILE: every row also appended to FILE as a JSON line (check_util.h), labelled with --stage N and the group.
 * --only: rows whose name contains SUBSTR. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "kernels/cuda/check/check.h"
#include "kernels/cuda/check/check_util.h"

int ck_selected(const char *name, const char *only) { return !only || strstr(name, only) != NULL; }

static struct {
    const char *group;
    ck_part_fn fn;
} parts[CK_MAX_PARTS];
static int n_parts;
void ck_register_part(const char *group, ck_part_fn fn) {
    if (n_parts < CK_MAX_PARTS) parts[n_parts].group = group, parts[n_parts++].fn = fn;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static const char *const GROUPS[][2] = {
    {"env", "the GPU, driver and libraries (versions, paths); a device memory round trip, fp32 and bf16"},
    {"layers", "LayerNorm, RMSNorm, RoPE, GELU, SiLU, modulation, gated residual, patch maps, LSE merge"},
    {"flow", "SDE step, KL, velocity backward, CFG, AdamW, sum of squares"},
    {"gemm", "cuBLASLt: linear fwd (bias), linear bwd dx, FFN up (GELU aux + bias), FFN bwd (dGELU + bias grad), "
             "weight grad (fp32 +=, bias grad)"},
    {"attention", "cuDNN SDPA forward (O, LSE) and backward (dQ, dK, dV), self and cross"},
    {"invariance", "GEMM rows at M = 1, 2, 8, S/2 vs M = S; attention sample alone vs in batches of 2 and 8"},
    {"block", "one Wan DiT block forward+backward on the device vs the fp32 CPU model (registered part)"},
    {"dit", "2-block Wan DiT (Wan 2.1, TI2V), its glue ops, LoRA rank 16 (registered part)"},
    {"grpo", "10 GRPO steps on the device vs the CPU, rollout/trainer parity, LoRA parity (registered part)"},
    {"nccl", "the NCCL comm with one rank: every operation, exact and NCCL reductions; the rank-order block sum "
             "(registered part)"},
    {"perf", "speed: bf16 GEMM 8192^3 NN/NT, attention fwd and fwd+bwd at B1 H40 S32768 D128"},
};
enum { N_GROUPS = sizeof GROUPS / sizeof GROUPS[0] };

static void usage(void) {
    fprintf(stderr, "usage: gpu_check [--group G] [--shapes wan|quick|small|tiny] [--json FILE] [--stage N] "
                    "[--only SUBSTR] [--no-perf] [--perf-only] [--gemm-n N] [--attn-s S] [--rows R] [--seed N] "
                    "[--quick] [--tiny] [--list-groups]\n");
    exit(2);
}

static int run_group(const char *group, const char *want) { return !want || !strcmp(group, want); }

/* The env group's rows: the GPU and both libraries loaded (cc 9.x, versions), and one allocation's round trip. */
static void check_env(const k_cuda_info *in) {
    char txt[300];
    snprintf(txt, sizeof txt, "%s, cc %d.%d, %d SMs, %.1f GiB, driver %d", in->gpu, in->cc_major, in->cc_minor,
             in->sm_count, in->mem_bytes / 1073741824.0, in->driver_version);
    if (in->cc_major != 9)
        ck_row_error("env gpu", "", "not compute capability 9.x (the kernels are built for sm_90a only)");
    else
        ck_row_info("env gpu", "", txt);
    snprintf(txt, sizeof txt, "cuBLASLt %zu from %s", in->cublaslt_version, in->cublaslt_path);
    ck_row_info("env cublaslt", "", txt);
    snprintf(txt, sizeof txt, "cuDNN %zu from %s", in->cudnn_version, in->cudnn_path);
    if (in->cudnn_version < 91900) {
        snprintf(txt, sizeof txt, "cuDNN %zu (< 9.19, the version the attention graphs are verified with: attention rows will fail unless VGRPO_CUDNN_UNVERIFIED=1) from %s",
                 in->cudnn_version, in->cudnn_path);
        ck_row_error("env cudnn", "", txt);
    } else {
        ck_row_info("env cudnn", "", txt);
    }
    /* one allocation up and down, fp32 and bf16: the device's memory path alone */
    enum { N = 1 << 20 };
    ct_t f, b;
    memset(&f, 0, sizeof f), memset(&b, 0, sizeof b);
    float *back = ck_floats(N);
    if (ct_alloc(&f, N, 0) || ct_alloc(&b, N, 1) || ct_rand(&f, 11, -3, 3) || ct_rand(&b, 12, -3, 3) ||
        ct_pull(&f, back)) {
        ck_row_error("env memory round trip", "1 Mi values", core_last_error());
    } else {
        ck_row("env memory round trip fp32", "1 Mi values", 0, back, f.h, N, CK_EXACT, 0.0, -1, NULL);
        if (ct_pull(&b, back))
            ck_row_error("env memory round trip bf16", "1 Mi values", core_last_error());
        else
            ck_row("env memory round trip bf16", "1 Mi values", 1, back, b.h, N, CK_EXACT, 0.0, -1, NULL);
    }
    free(back);
    ct_free(&f), ct_free(&b);
}

int main(int argc, char **argv) {
    int perf = 1, checks = 1, gemm_n = 8192, attn_s = 32768, rows = 64, stage = 0;
    unsigned long long seed = 1;
    const char *only = NULL, *group = NULL, *shapes = "wan", *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--quick"))
            shapes = "quick";
        else if (!strcmp(a, "--tiny"))
            shapes = "tiny";
        else if (!strcmp(a, "--shapes") && i + 1 < argc)
            shapes = argv[++i];
        else if (!strcmp(a, "--group") && i + 1 < argc)
            group = argv[++i];
        else if (!strcmp(a, "--json") && i + 1 < argc)
            json_path = argv[++i];
        else if (!strcmp(a, "--stage") && i + 1 < argc)
            stage = atoi(argv[++i]);
        else if (!strcmp(a, "--no-perf"))
            perf = 0;
        else if (!strcmp(a, "--perf-only"))
            checks = 0;
        else if (!strcmp(a, "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(a, "--gemm-n") && i + 1 < argc)
            gemm_n = atoi(argv[++i]);
        else if (!strcmp(a, "--attn-s") && i + 1 < argc)
            attn_s = atoi(argv[++i]);
        else if (!strcmp(a, "--rows") && i + 1 < argc)
            rows = atoi(argv[++i]);
        else if (!strcmp(a, "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--list-groups")) {
            for (int g = 0; g < N_GROUPS; g++) printf("%-11s %s\n", GROUPS[g][0], GROUPS[g][1]);
            return 0;
        } else
            usage();
    }
    int known = !group;
    for (int g = 0; g < N_GROUPS && !known; g++) known = !strcmp(group, GROUPS[g][0]);
    if (!known) {
        fprintf(stderr, "gpu_check: --group %s: no such group (--list-groups)\n", group);
        return 2;
    }
    if (gemm_n < 64 || gemm_n % 8 || attn_s < 128 || rows < 1) usage();
    ck_shapes s;
    memset(&s, 0, sizeof s);
    s.D = 5120, s.H = 40, s.Dh = 128, s.FFN = 13824, s.L = 512, s.adamw_n = 64ll << 20;
    s.C = 16, s.F = 21, s.Hl = 60, s.Wl = 104, s.pt = 1, s.ph = 2, s.pw = 2;
    if (!strcmp(shapes, "quick"))
        s.F = 5;
    else if (!strcmp(shapes, "small"))
        s.D = 1024, s.H = 8, s.FFN = 2816, s.L = 128, s.F = 5, s.Hl = 24, s.Wl = 32, s.adamw_n = 1 << 20;
    else if (!strcmp(shapes, "tiny"))
        s.D = 256, s.H = 4, s.Dh = 64, s.FFN = 512, s.L = 64, s.F = 5, s.Hl = 16, s.Wl = 24, s.adamw_n = 1 << 20;
    else if (strcmp(shapes, "wan"))
        usage();
    s.Fp = s.F / s.pt, s.Hp = s.Hl / s.ph, s.Wp = s.Wl / s.pw, s.S = s.Fp * s.Hp * s.Wp;
    s.rows = rows, s.seed = seed;
    if (json_path && ck_json_open(json_path, stage, group)) {
        fprintf(stderr, "gpu_check: %s\n", core_last_error());
        return 2;
    }
    char why[K_WHY_MAX];
    if (!k_cuda_available(why)) {
        printf("gpu_check: the CUDA backend cannot run here: %s\n", why);
        ck_row_skip("env gpu", "", why);
        ck_json_close();
        return 2;
    }
    k_cuda_info in;
    k_cuda_get_info(&in);
    printf("gpu_check: %s, compute capability %d.%d, %d SMs, %.1f GiB; driver %d, CUDA runtime %d (static); %d CPU "
           "threads for the reference\n",
           in.gpu, in.cc_major, in.cc_minor, in.sm_count, in.mem_bytes / 1073741824.0, in.driver_version,
           in.runtime_version, omp_get_max_threads());
    printf("gpu_check: cuBLASLt %zu from %s\n", in.cublaslt_version, in.cublaslt_path);
    printf("gpu_check: cuDNN %zu from %s%s\n", in.cudnn_version, in.cudnn_path,
           in.cudnn_version < 91900 ? " (< 9.19: attention refused unless VGRPO_CUDNN_UNVERIFIED=1)" : "");
    fflush(stdout);
    ck_json_env(&in, omp_get_max_threads());
    double t0 = now();
    if (checks) {
        printf("\nCorrectness%s%s: CUDA op vs CPU fp32 reference on the same (bf16-representable) inputs; %s shapes "
               "(%d tokens = %dx%dx%d, dim %d = %d x %d, FFN %d, text %d); GEMM and attention on %d sampled rows. "
               "repeat: the op run twice gives the same bits.\n\n",
               group ? ", group " : "", group ? group : "", shapes, s.S, s.Fp, s.Hp, s.Wp, s.D, s.H, s.Dh, s.FFN,
               s.L, s.rows);
        ck_table_header();
        if (run_group("env", group)) check_env(&in);
        if (run_group("layers", group)) check_layers(&s, only);
        if (run_group("flow", group)) check_flow(&s, only);
        if (run_group("gemm", group)) check_gemm(&s, only);
        if (run_group("attention", group)) check_attention(&s, only);
        if (run_group("invariance", group)) check_invariance(&s, only);
        for (int i = 0; i < n_parts; i++)
            if (run_group(parts[i].group, group)) parts[i].fn(&s, only);
        printf("\n(correctness: %.0f s)\n", now() - t0);
    }
    if (perf && run_group("perf", group)) {
        printf("\nSpeed (CUDA events, after warm-up):\n");
        check_perf(gemm_n, attn_s, only);
    }
    printf("\ngpu_check: %d rows, %d failed, %d skipped (%.0f s)\n", ck_rows(), ck_failures(), ck_skips(),
           now() - t0);
    fflush(stdout);
    ck_json_close();
    k_cuda_shutdown();
    return ck_failures() ? 1 : 0;
}
