/* kernels/cuda/check/gpu_check.c — the GPU check: every op of the CUDA backend (k_cuda_ops) against the fp32 CPU
 * reference in this same binary, on fresh random inputs at Wan shapes, then the parts registered from above kernels/
 * (check.h: the 2-block Wan DiT forward+backward against the fp32 CPU model, model/dit/check/check_dit.c), then the
 * speed of cuBLASLt's bf16 GEMM and cuDNN's fused attention. One table, one closing line `gpu_check: N rows, N
 * failed`; exit 0 when nothing failed, 1 when a row failed, 2 when the CUDA backend cannot run here (one line saying
 * why).
 * Built by `make cuda` as $(BUILD)/gpu_check, linked with the static CUDA runtime and a static libgomp so that it
 * needs only libc/libm on the GPU machine; cuBLASLt and cuDNN are dlopen'ed (scripts/gpu_check.sh finds them).
 *
 *   gpu_check [--quick | --tiny] [--only SUBSTR] [--no-perf] [--perf-only] [--gemm-n N] [--attn-s S] [--rows R]
 *             [--seed N]
 *
 * --quick: 5 latent frames (7800 tokens) instead of 21 (32760); --tiny: a small model (dim 256, 4 heads of 64, FFN
 * 512, 480 tokens), for the emulated device (kernels/cuda/check/emu/); --only: checks whose name contains SUBSTR. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "kernels/cuda/check/check.h"
#include "kernels/cuda/check/check_util.h"

int ck_selected(const char *name, const char *only) { return !only || strstr(name, only) != NULL; }

static ck_part_fn parts[CK_MAX_PARTS];
static int n_parts;
void ck_register_part(ck_part_fn fn) {
    if (n_parts < CK_MAX_PARTS) parts[n_parts++] = fn;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void usage(void) {
    fprintf(stderr, "usage: gpu_check [--quick | --tiny] [--only SUBSTR] [--no-perf] [--perf-only] [--gemm-n N] "
                    "[--attn-s S] [--rows R] [--seed N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    int quick = 0, tiny = 0, perf = 1, checks = 1, gemm_n = 8192, attn_s = 32768, rows = 64;
    unsigned long long seed = 1;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--quick"))
            quick = 1;
        else if (!strcmp(a, "--tiny"))
            tiny = 1;
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
        else
            usage();
    }
    if (gemm_n < 64 || gemm_n % 8 || attn_s < 128 || rows < 1) usage();
    char why[K_WHY_MAX];
    if (!k_cuda_available(why)) {
        printf("gpu_check: the CUDA backend cannot run here: %s\n", why);
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
           in.cudnn_version < 91700 ? " (< 9.17: no SDPA backward descriptor; attention backward rows will fail)" : "");
    fflush(stdout);
    ck_shapes s;
    memset(&s, 0, sizeof s);
    s.D = 5120, s.H = 40, s.Dh = 128, s.FFN = 13824, s.L = 512;
    s.C = 16, s.F = quick ? 5 : 21, s.Hl = 60, s.Wl = 104, s.pt = 1, s.ph = 2, s.pw = 2;
    if (tiny) s.D = 256, s.H = 4, s.Dh = 64, s.FFN = 512, s.L = 64, s.F = 5, s.Hl = 16, s.Wl = 24;
    s.Fp = s.F / s.pt, s.Hp = s.Hl / s.ph, s.Wp = s.Wl / s.pw, s.S = s.Fp * s.Hp * s.Wp;
    s.rows = rows, s.seed = seed;
    double t0 = now();
    if (checks) {
        printf("\nCorrectness: CUDA op vs CPU fp32 reference on the same (bf16-representable) inputs; %s "
               "shapes (%d tokens = %dx%dx%d, dim %d = %d x %d, FFN %d, text %d); GEMM and attention on %d sampled "
               "rows. repeat: the op run twice gives the same bits.\n\n",
               tiny ? "tiny" : "Wan 2.1 14B", s.S, s.Fp, s.Hp, s.Wp, s.D, s.H, s.Dh, s.FFN, s.L, s.rows);
        ck_table_header();
        check_layers(&s, only);
        check_flow(&s, only);
        check_gemm(&s, only);
        check_attention(&s, only);
        for (int i = 0; i < n_parts; i++) parts[i](&s, only);
        printf("\n(correctness: %.0f s)\n", now() - t0);
    }
    if (perf) {
        printf("\nSpeed (CUDA events, after warm-up):\n");
        check_perf(gemm_n, attn_s, only);
    }
    printf("\ngpu_check: %d rows, %d failed (%.0f s)\n", ck_rows(), ck_failures(), now() - t0);
    k_cuda_shutdown();
    return ck_failures() ? 1 : 0;
}
