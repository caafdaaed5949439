/* bench/bench_peak.c — `vgrpo bench peak`: this machine's fp32 fused multiply-add ceiling, the figure every other
 * benchmark's "% of peak" is measured against.
 *
 * Each thread runs a register-only loop: NACC independent accumulators, each updated acc = fma(acc, m, c) once per
 * iteration (m = 1 - 2^-20, c = 2^-20, so values stay near 1 and never become denormal or infinite). The chains are
 * independent and every result is folded into a volatile sink at the end, so the compiler can neither merge nor drop
 * them; NACC is at least the FMA latency (4 cycles) times the FMA ports (2), so the loop is throughput-bound. One
 * row per vector width the binary was compiled for and the CPU runs (512-bit AVX-512F, 256-bit AVX2+FMA, 128-bit
 * FMA, scalar fmaf): GFLOP/s = 2 flops x lanes x NACC x iterations / seconds, per thread (over the thread's own
 * CPU time, so a machine shared with other processes still shows its ceiling) and for the team (the sum over its
 * threads), and the team's wall-time figure of this window beside it. The peak is the best team figure. A last row
 * runs k_cpu_gemm's micro-kernel on packed panels that stay in L1 (its loads and broadcasts beside the fused
 * multiply-adds, nothing else): the ceiling of every GEMM figure, as a share of the peak (not itself a peak).
 *
 * bench_peak_gflops: the same measurement, quiet and short (about 0.1 s), for the other benchmarks' % of peak. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <time.h>

#include "bench/bench.h"
#include "kernels/cpu/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

enum { NACC = 16 };
#define PEAK_M (1.0f - 0x1p-20f)
#define PEAK_C 0x1p-20f

static volatile float peak_sink;

/* One thread's loop of `iters` iterations at one width; returns the flops done. */
#if defined(__AVX512F__)
static double loop512(long iters) {
    __m512 a[NACC];
    const __m512 m = _mm512_set1_ps(PEAK_M), c = _mm512_set1_ps(PEAK_C);
    for (int j = 0; j < NACC; j++) a[j] = _mm512_set1_ps(1.0f + 0x1p-10f * (float)j);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < NACC; j++) a[j] = _mm512_fmadd_ps(a[j], m, c);
    }
    __m512 s = a[0];
    for (int j = 1; j < NACC; j++) s = _mm512_add_ps(s, a[j]);
    peak_sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16 * NACC * (double)iters;
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
static double loop256(long iters) {
    /* 12 accumulators + 2 constants: 16 ymm registers without AVX-512 */
    enum { N = 12 };
    __m256 a[N];
    const __m256 m = _mm256_set1_ps(PEAK_M), c = _mm256_set1_ps(PEAK_C);
    for (int j = 0; j < N; j++) a[j] = _mm256_set1_ps(1.0f + 0x1p-10f * (float)j);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < N; j++) a[j] = _mm256_fmadd_ps(a[j], m, c);
    }
    __m256 s = a[0];
    for (int j = 1; j < N; j++) s = _mm256_add_ps(s, a[j]);
    float t[8];
    _mm256_storeu_ps(t, s);
    peak_sink = t[0] + t[7];
    return 2.0 * 8 * N * (double)iters;
}
#endif

#if defined(__FMA__)
static double loop128(long iters) {
    enum { N = 12 };
    __m128 a[N];
    const __m128 m = _mm_set1_ps(PEAK_M), c = _mm_set1_ps(PEAK_C);
    for (int j = 0; j < N; j++) a[j] = _mm_set1_ps(1.0f + 0x1p-10f * (float)j);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < N; j++) a[j] = _mm_fmadd_ps(a[j], m, c);
    }
    __m128 s = a[0];
    for (int j = 1; j < N; j++) s = _mm_add_ps(s, a[j]);
    float t[4];
    _mm_storeu_ps(t, s);
    peak_sink = t[0] + t[3];
    return 2.0 * 4 * N * (double)iters;
}
#endif

/* scalar: fmaf (one instruction with FMA hardware, a library call without) */
static double loop1(long iters) {
    float a[NACC];
    for (int j = 0; j < NACC; j++) a[j] = 1.0f + 0x1p-10f * (float)j;
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < NACC; j++) {
            a[j] = fmaf(a[j], PEAK_M, PEAK_C);
            __asm__("" : "+x"(a[j])); /* keeps the chains scalar: no vectorising them into one */
        }
    }
    float s = 0;
    for (int j = 0; j < NACC; j++) s += a[j];
    peak_sink = s;
    return 2.0 * NACC * (double)iters;
}

typedef struct {
    const char *name;
    int bits;
    double (*loop)(long iters);
    int (*runs)(void);
} peak_width;

static int always(void) { return 1; }
#if defined(__AVX512F__)
static int has512(void) { return __builtin_cpu_supports("avx512f"); }
#endif
#if defined(__AVX2__) && defined(__FMA__)
static int has256(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif
#if defined(__FMA__)
static int has128(void) { return __builtin_cpu_supports("fma"); }
#endif

/* k_cpu_gemm's micro-kernel on L1-resident panels (kernels/cpu/cpu.h). */
static double loop_gemm_uk(long iters) {
    int mr, nr;
    return k_cpu_gemm_ukernel_loop(iters, &mr, &nr);
}

static const peak_width widths[] = {
#if defined(__AVX512F__)
    {"AVX-512F vfmadd ps zmm", 512, loop512, has512},
#endif
#if defined(__AVX2__) && defined(__FMA__)
    {"AVX2+FMA vfmadd ps ymm", 256, loop256, has256},
#endif
#if defined(__FMA__)
    {"FMA vfmadd ps xmm", 128, loop128, has128},
#endif
    {"scalar fmaf", 32, loop1, always},
};
#define N_WIDTHS ((int)(sizeof widths / sizeof widths[0]))

static double thread_cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Runs width w on nt threads for about `seconds`. *team: the ceiling of the team, the sum over threads of each one's
 * flops over its own CPU time (so other processes sharing the cores do not lower it); *per_thread: that sum / nt;
 * *wall: total flops / the slowest thread's wall time (what the team delivered in this window). Iterations are sized
 * from a short calibration run on one thread. */
static void measure(const peak_width *w, int nt, double seconds, double *team, double *per_thread, double *wall) {
    long iters = 1 << 14;
    for (;;) { /* calibrate: at least 10 ms */
        double t0 = omp_get_wtime();
        w->loop(iters);
        double dt = omp_get_wtime() - t0;
        if (dt > 0.01 || iters > (1L << 40)) {
            iters = (long)((double)iters * seconds / (dt > 1e-9 ? dt : 1e-9)) + 1;
            break;
        }
        iters *= 4;
    }
    double tmax = 0, rate = 0, flops = 0;
    int team_size = 1;
#pragma omp parallel num_threads(nt) reduction(max : tmax) reduction(+ : rate, flops)
    {
        double t0 = omp_get_wtime(), c0 = thread_cpu_seconds();
        double f = w->loop(iters);
        double c1 = thread_cpu_seconds(), dt = omp_get_wtime() - t0;
        flops += f, tmax = dt, rate = f / (c1 - c0 > 1e-9 ? c1 - c0 : dt);
#pragma omp master
        team_size = omp_get_num_threads();
    }
    *team = rate * 1e-9;
    *per_thread = rate * 1e-9 / team_size;
    *wall = flops / tmax * 1e-9;
}

double bench_peak_gflops(void) {
    static double cached = 0;
    if (cached > 0) return cached;
    const int nt = omp_get_max_threads();
    for (int i = 0; i < N_WIDTHS; i++) {
        if (!widths[i].runs()) continue;
        double team, pt, wall;
        measure(&widths[i], nt, 0.05, &team, &pt, &wall);
        if (team > cached) cached = team;
        if (widths[i].bits <= 128) break; /* narrower widths cannot be faster */
    }
    return cached;
}

double bench_pct_peak(double gflops) {
    double p = bench_peak_gflops();
    return p > 0 ? 100.0 * gflops / p : 0.0;
}

int bench_peak(int threads, int quick) {
    if (threads > 0) omp_set_num_threads(threads);
    const int nt = omp_get_max_threads();
    const double secs = quick ? 0.1 : 0.5;
    printf("vgrpo bench peak: fp32 FMA ceiling, %d thread%s; per thread a register-only loop of independent "
           "accumulators (acc = fma(acc, m, c)), %.1f s per width\n\n", nt, nt == 1 ? "" : "s", secs);
    printf("%-24s %6s %6s | %14s %14s | %14s\n", "instruction", "bits", "lanes", "GFLOP/s/thread", "GFLOP/s team",
           "team, wall");
    double best = 0;
    const char *best_name = "none";
    for (int i = 0; i < N_WIDTHS; i++) {
        const peak_width *w = &widths[i];
        if (!w->runs()) {
            printf("%-24s %6d %6d | %14s %14s |\n", w->name, w->bits, w->bits / 32, "-", "(not on this CPU)");
            continue;
        }
        double team, pt, wall;
        measure(w, nt, secs, &team, &pt, &wall);
        printf("%-24s %6d %6d | %14.1f %14.1f | %14.1f\n", w->name, w->bits, w->bits / 32, pt, team, wall);
        if (team > best) best = team, best_name = w->name;
    }
    /* The GEMM's own ceiling: its micro-kernel with both packed panels in L1 (loads and broadcasts beside the fused
     * multiply-adds, nothing else): what no GEMM figure of vgrpo can exceed. */
    int mr = 0, nr = 0;
    k_cpu_gemm_ukernel_loop(1, &mr, &nr);
    char name[64];
    snprintf(name, sizeof name, "gemm tile %dx%d in L1", mr, nr);
    const peak_width uk = {name, 0, loop_gemm_uk, always};
    double team, pt, wall;
    measure(&uk, nt, secs, &team, &pt, &wall);
    printf("%-24s %6s %6s | %14.1f %14.1f | %14.1f   %.0f%% of the peak below (path %s)\n", name, "-", "-", pt, team,
           wall, best > 0 ? 100.0 * team / best : 0.0, k_cpu_path_name(k_cpu_get_path()));
    printf("\npeak: %.1f GFLOP/s (%s, %d thread%s): the 100%% of every \"%% of peak\" in vgrpo bench\n"
           "(GFLOP/s per thread from its own CPU time, so processes sharing the cores do not lower it; \"team, wall\": "
           "what the team delivered in this window of wall time)\n", best, best_name, nt, nt == 1 ? "" : "s");
    return 0;
}
