/* kernels/cpu/prof.h — an opt-in per-op time table of the fp32 CPU kernels, for `vgrpo bench dit --profile` and
 * `vgrpo bench step` (bench/).
 *
 * Off by default: an op then pays one load and one branch. When on (k_prof_enable), every k_cpu_* entry called on
 * the thread that enabled it, outside any parallel region, adds its wall time to a row keyed by (phase, op name,
 * and for a GEMM its transpositions and M, N, K; for the other ops the element count), with its call count and
 * counted FLOPs; an op called from inside another op (the beta path of the GEMM) is part of the outer one. Callers
 * may time their own passes (the layers' elementwise loops) with the same calls. Rows are kept in a fixed table of
 * K_PROF_MAX_ROWS; past it, further keys go to one "(more)" row per phase. Not thread-safe across enabling threads:
 * one profiling thread per process. Timing never changes a computed value. */
#ifndef KERNELS_CPU_PROF_H
#define KERNELS_CPU_PROF_H

#include <stdint.h>

#define K_PROF_MAX_ROWS 1024

typedef struct {
    const char *phase;   /* k_prof_set_phase's name at the call ("" when none was set) */
    const char *op;      /* "gemm", "attention_forward", "layernorm_forward", ... (static strings) */
    int ta, tb, M, N, K; /* GEMM: transposition flags and shape; other ops: -1, -1, 0, 0, 0 */
    int64_t elems;       /* other ops: the element count (multiply-adds for attention) of one call; GEMM: 0 */
    long long calls;
    double seconds;      /* wall time summed over calls */
    double flops;        /* counted FLOPs summed over calls (GEMM 2MNK; attention 4 B H Sq Skv Dh forward, 2.5x that
                            backward; elementwise 0) */
} k_prof_row;

extern int k_prof_on; /* read by the K_PROF_* macros; set only through k_prof_enable */

/* Turns the table on (1) or off (0) for the calling thread; on also clears it. */
void k_prof_enable(int on);
void k_prof_reset(void);
/* The phase later rows are filed under (a static string; NULL = ""). */
void k_prof_set_phase(const char *phase);
/* Copies up to cap rows, sorted by seconds (largest first); returns the number of rows in the table. */
int k_prof_rows(k_prof_row *out, int cap);

/* Instrumentation. k_prof_begin returns a start time > 0 when this call is to be recorded (on, the profiling
 * thread, not nested, not in a parallel region), else 0; k_prof_end / k_prof_end_gemm record it. Every begin that
 * returned > 0 must be ended (the nesting count). */
double k_prof_begin(void);
void k_prof_end(double t0, const char *op, int64_t elems, double flops);
void k_prof_end_gemm(double t0, int ta, int tb, int M, int N, int K);

#define K_PROF_BEGIN() double k_prof_t0_ = k_prof_on ? k_prof_begin() : 0.0
#define K_PROF_END(op, elems, flops)                                                                              \
    do {                                                                                                          \
        if (k_prof_t0_ > 0.0) k_prof_end(k_prof_t0_, (op), (int64_t)(elems), (double)(flops));                    \
    } while (0)

#endif
