/* bench/bench_kernels.c — `vgrpo bench kernels`: sgemm and CPU attention GFLOP/s, printed beside this machine's own
 * ceiling.
 *
 * sgemm GFLOP/s (k_cpu_gemm, vgrpo's fixed-order GEMM, and cblas_sgemm, OpenBLAS: the machine's ceiling) at 512^3,
 * 1024^3, 2048^3 and a Wan-1.3B FFN shape (M 1560 tokens, N 8960, K 1536); CPU attention forward and
 * forward+backward GFLOP/s at B=1, H=4, S in {1024, 4096}, Dh in {64, 128}, counting 4*B*H*S^2*Dh for the forward
 * and 2.5x that for the backward (fwd+bwd = 3.5x); and the ratio attention forward (S 4096, Dh 128) over the best
 * sgemm figure (target: >= 0.5). Each figure is the median of several timed runs after one warm-up run (--quick:
 * one run, two sgemm shapes, no S=4096 forward+backward). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "kernels/cpu/cpu.h"

/* Median of the run times of fn(arg), after one warm-up run. */
static double time_median(void (*fn)(void *), void *arg, int reps) {
    double t[16];
    fn(arg);
    if (reps > 16) reps = 16;
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
        fn(arg);
        t[r] = omp_get_wtime() - t0;
    }
    for (int i = 1; i < reps; i++) /* insertion sort */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    return reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
}

static float *rand_buf(size_t n, unsigned seed, float lo, float hi) {
    float *x = malloc(n * sizeof *x);
    if (!x) return NULL;
    unsigned long long s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = lo + (hi - lo) * (float)((s >> 40) * (1.0 / 16777216.0));
    }
    return x;
}

typedef struct {
    int M, N, K, use_blas;
    float *A, *B, *C;
} gemm_case;

static void run_gemm(void *p) {
    gemm_case *g = p;
    if (g->use_blas)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->M, g->N, g->K, 1.0f, g->A, g->K, g->B, g->N, 0.0f,
                    g->C, g->N);
    else
        k_cpu_gemm(0, 0, g->M, g->N, g->K, 1.0f, g->A, g->K, g->B, g->N, 0.0f, g->C, g->N, NULL);
}

typedef struct {
    int B, S, H, D, backward;
    float *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
} attn_case;

static void run_attn(void *p) {
    attn_case *a = p;
    float scale = 1.0f / sqrtf((float)a->D);
    k_cpu_attention_forward(a->o, a->lse, a->q, a->k, a->v, a->B, a->S, a->S, a->H, a->D, scale);
    if (a->backward)
        k_cpu_attention_backward(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->o, a->lse, a->B, a->S, a->S,
                                 a->H, a->D, scale);
}

static int reps_for(double gflop, int quick) { return quick ? 1 : gflop > 20.0 ? 3 : 5; }

void bench_cpu_name(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                snprintf(out, cap, "%s", c + 2);
                out[strcspn(out, "\n")] = '\0';
            }
            break;
        }
    fclose(f);
}

static double time_once(void (*fn)(void *), void *arg) {
    double t0 = omp_get_wtime();
    fn(arg);
    return omp_get_wtime() - t0;
}

static double median3(double *t, int n) { /* n <= 3 */
    if (n == 1) return t[0];
    if (n == 2) return 0.5 * (t[0] + t[1]);
    double a = t[0], b = t[1], c = t[2];
    return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

static const int gemm_shapes[][3] = {{512, 512, 512}, {1024, 1024, 1024}, {2048, 2048, 2048}, {1560, 8960, 1536}};

static int gemm_alloc(gemm_case *g, int shape, int use_blas) {
    *g = (gemm_case){.M = gemm_shapes[shape][0], .N = gemm_shapes[shape][1], .K = gemm_shapes[shape][2]};
    g->use_blas = use_blas;
    g->A = rand_buf((size_t)g->M * g->K, 1, -1, 1), g->B = rand_buf((size_t)g->K * g->N, 2, -1, 1);
    g->C = rand_buf((size_t)g->M * g->N, 3, 0, 0);
    if (g->A && g->B && g->C) return 0;
    fprintf(stderr, "vgrpo bench kernels: out of memory for sgemm M %d N %d K %d\n", g->M, g->N, g->K);
    return -1;
}

static void gemm_free(gemm_case *g) { free(g->A), free(g->B), free(g->C); }

static int attn_alloc(attn_case *a, int S, int D) {
    *a = (attn_case){.B = 1, .S = S, .H = 4, .D = D};
    size_t n = (size_t)a->B * a->S * a->H * a->D;
    a->q = rand_buf(n, 4, -1, 1), a->k = rand_buf(n, 5, -1, 1), a->v = rand_buf(n, 6, -1, 1);
    a->dout = rand_buf(n, 7, -1, 1), a->o = rand_buf(n, 8, 0, 0), a->lse = rand_buf((size_t)a->H * a->S, 9, 0, 0);
    a->dq = rand_buf(n, 10, 0, 0), a->dk = rand_buf(n, 11, 0, 0), a->dv = rand_buf(n, 12, 0, 0);
    if (a->q && a->k && a->v && a->dout && a->o && a->lse && a->dq && a->dk && a->dv) return 0;
    fprintf(stderr, "vgrpo bench kernels: out of memory for attention S %d Dh %d\n", S, D);
    return -1;
}

static void attn_free(attn_case *a) {
    free(a->q), free(a->k), free(a->v), free(a->dout), free(a->o), free(a->lse), free(a->dq), free(a->dk);
    free(a->dv);
}

static double attn_gflop(const attn_case *a) { return 4.0 * a->B * a->H * (double)a->S * a->S * a->D * 1e-9; }

int bench_kernels(int threads, int quick) {
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads); /* the OpenMP build also follows omp_set_num_threads */
    }
    char cpu[256];
    bench_cpu_name(cpu, sizeof cpu);
    const int nt = omp_get_max_threads();
    printf("vgrpo bench kernels: %d thread%s, %s (%d logical CPUs online), %s\n", nt, nt == 1 ? "" : "s", cpu,
           omp_get_num_procs(), openblas_get_config());
    const double peak = bench_peak_gflops();
    printf("each figure: median of %s after one warm-up run; GFLOP/s = counted FLOPs / seconds; %% of peak against "
           "%.1f GFLOP/s (vgrpo bench peak, %d thread%s)\n\n", quick ? "1 run" : "3-5 runs", peak, nt,
           nt == 1 ? "" : "s");

    /* sgemm: the machine's ceiling. */
    const int ng = quick ? 2 : 4;
    double best = 0.0;
    int best_shape = 0, best_blas = 1;
    printf("sgemm C[M,N] = A[M,K] B[K,N], fp32    k_cpu_gemm  %%peak   cblas_sgemm  %%peak (GFLOP/s)\n");
    for (int i = 0; i < ng; i++) {
        gemm_case g;
        double r[2];
        for (int blas = 0; blas < 2; blas++) {
            if (gemm_alloc(&g, i, blas)) {
                gemm_free(&g);
                return 1;
            }
            double gflop = 2.0 * g.M * g.N * g.K * 1e-9;
            r[blas] = gflop / time_median(run_gemm, &g, reps_for(gflop, quick));
            if (r[blas] > best) best = r[blas], best_shape = i, best_blas = blas;
            gemm_free(&g);
        }
        char label[64];
        snprintf(label, sizeof label, "M %d N %d K %d%s", g.M, g.N, g.K, i == 3 ? " (Wan-1.3B FFN)" : "");
        printf("  %-36s %10.1f %5.0f%% %13.1f %5.0f%%\n", label, r[0], bench_pct_peak(r[0]), r[1],
               bench_pct_peak(r[1]));
    }

    /* Attention. */
    printf("\nattention fp32, B 1, H 4 (FLOPs: fwd 4*B*H*S^2*Dh, bwd 2.5x fwd)   fwd  %%peak  fwd+bwd  %%peak  "
           "f+b/fwd (GFLOP/s)\n");
    const int Ss[] = {1024, 4096}, Ds[] = {64, 128};
    for (int si = 0; si < 2; si++)
        for (int di = 0; di < 2; di++) {
            attn_case a;
            if (attn_alloc(&a, Ss[si], Ds[di])) {
                attn_free(&a);
                return 1;
            }
            double fb = -1.0, gflop = attn_gflop(&a);
            double fwd = gflop / time_median(run_attn, &a, reps_for(gflop, quick));
            if (!(quick && a.S > 1024)) {
                a.backward = 1;
                fb = 3.5 * gflop / time_median(run_attn, &a, reps_for(3.5 * gflop, quick));
            }
            attn_free(&a);
            char label[64], fbs[64];
            snprintf(label, sizeof label, "S %d Dh %d", a.S, a.D);
            if (fb < 0)
                snprintf(fbs, sizeof fbs, "%8s %6s %8s", "-", "", "-");
            else
                snprintf(fbs, sizeof fbs, "%8.1f %5.0f%% %8.2f", fb, bench_pct_peak(fb), fb / fwd);
            printf("  %-61s %6.1f %5.0f%% %s\n", label, fwd, bench_pct_peak(fwd), fbs);
        }

    /* The headline ratio, timed interleaved (sgemm, attention, sgemm, attention, ...) so that both figures see
     * the same machine load: on a shared machine, separate tables can be minutes and several loads apart. */
    gemm_case g = {0};
    attn_case a = {0};
    int fail = gemm_alloc(&g, best_shape, best_blas) || attn_alloc(&a, 4096, 128);
    if (!fail) {
        const int rounds = quick ? 1 : 3;
        double tg[3], ta[3];
        run_gemm(&g), run_attn(&a); /* warm-up */
        for (int r = 0; r < rounds; r++) tg[r] = time_once(run_gemm, &g), ta[r] = time_once(run_attn, &a);
        double gs = 2.0 * g.M * g.N * g.K * 1e-9 / median3(tg, rounds), as = attn_gflop(&a) / median3(ta, rounds);
        printf("\nattention forward (S %d, Dh %d) / best sgemm (%s, M %d N %d K %d), timed interleaved over %d "
               "round%s:\n  %.1f / %.1f GFLOP/s = %.2f  (target >= 0.5: %s)\n",
               a.S, a.D, best_blas ? "cblas_sgemm" : "k_cpu_gemm", g.M, g.N, g.K, rounds, rounds == 1 ? "" : "s", as,
               gs, as / gs, as / gs >= 0.5 ? "met" : "NOT met");
    }
    gemm_free(&g);
    attn_free(&a);
    return fail ? 1 : 0;
}
