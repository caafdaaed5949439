/* kernels/cuda/check/check_util.h — helpers of the GPU check (gpu_check): tensors that live on the host and the
 * device at once, parallel random fills, error measures, running a GPU op twice for the bitwise-repeat column, and
 * the result table.
 *
 * Measures (docs/design.md section 8): rel-L2 = ||gpu - ref||_2 / ||ref||_2; worst = max|gpu - ref| / max|ref|. The CPU
 * reference always sees exactly the values the GPU sees (inputs are drawn bf16-representable for bf16 storage). */
#ifndef KERNELS_CUDA_CHECK_CHECK_UTIL_H
#define KERNELS_CUDA_CHECK_CHECK_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/k_cuda.h"

/* One tensor: n values on the host (h, fp32; bf16-representable when bf16) and on the device (d: bf16 or fp32). */
typedef struct {
    size_t n;
    int bf16;
    float *h;
    void *d;
} ct_t;

/* Host buffer of n floats (aborts when out of memory: the check cannot go on). */
float *ck_floats(size_t n);
/* x[i] uniform in [lo, hi), from a hash of (seed, i) (OpenMP-parallel, the same for any thread count); rounded to
 * bf16 values when round_bf16. */
void ck_fill(float *x, size_t n, uint64_t seed, float lo, float hi, int round_bf16);

/* Allocates host (zeroed) and device (zeroed) storage. Returns 0 or -1 (device allocation failed, message in
 * core_error). */
int ct_alloc(ct_t *t, size_t n, int bf16);
void ct_free(ct_t *t);
/* ck_fill into h (rounded for bf16), then ct_push. */
int ct_rand(ct_t *t, uint64_t seed, float lo, float hi);
/* h -> d; d -> dst (n floats; exact widening for bf16). */
int ct_push(const ct_t *t);
int ct_pull(const ct_t *t, float *dst);
kb_in ct_in(const ct_t *t);
kb_out ct_out(ct_t *t);
extern const kb_in CK_NO_IN;
extern const kb_out CK_NO_OUT;

/* A GPU op to check: resets its accumulators (ct_push of their initial h) and runs; returns 0 or -1. */
typedef int (*ck_gpu_fn)(void *ctx);

/* Runs fn twice. After each run the nout outputs are downloaded: into got[i] (n floats each, the first run's
 * values) and then into a scratch buffer that is compared bit for bit. Returns 1 when both runs gave the same bits,
 * 0 when not, -1 when a run failed (the error row is printed under op). */
int ck_run_twice(const char *op, ck_gpu_fn fn, void *ctx, ct_t *const *outs, float *const *got, int nout);

/* ---- the table ---- */

typedef enum {
    CK_EXACT,     /* must equal the CPU result rounded to the output dtype, element for element */
    CK_BAND,      /* rel-L2 within the band */
} ck_expect;

/* Compares got[n] with ref[n] and prints one row; bf16: got holds bf16 values (for CK_EXACT compared with the RNE
 * rounding of ref). band: the largest rel-L2 accepted. repeat: ck_run_twice's answer. note: printed at the end (may
 * be NULL). A row fails when rel-L2 is above the band, a CK_EXACT element differs, or repeat is 0. */
void ck_row(const char *op, const char *shape, int bf16, const float *got, const float *ref, size_t n,
            ck_expect expect, double band, int repeat, const char *note);
/* A row for an op that could not run (message from core_error). */
void ck_row_error(const char *op, const char *shape, const char *msg);
/* A row that only informs (no pass/fail). */
void ck_row_info(const char *op, const char *shape, const char *text);
/* A row that cannot run here, and why (not a failure: e.g. speed on the emulated device). */
void ck_row_skip(const char *op, const char *shape, const char *why);
/* A row of figures measured elsewhere (the Wan DiT rows): rel (rel-L2, or whatever note says), band, worst,
 * repeat (1 same, 0 DIFFER, -1 not run), vs (the "vs CPU" column), fails when !(rel <= band) or repeat == 0 or
 * !extra_ok. */
void ck_row_figures(const char *op, const char *shape, const char *dtype, double rel, double band, double worst,
                    int repeat, const char *vs, int extra_ok, const char *note);
void ck_table_header(void);
int ck_rows(void);
int ck_failures(void);
int ck_skips(void);

/* ---- the rows as JSON lines (gpu_check --json FILE; scripts/gpu_check.sh gathers them into gpu_check.json) ----
 * After ck_json_open every row above is also appended to path as one JSON object per line and flushed:
 *   {"type":"row","stage":S,"group":G,"name":..,"status":"ok"|"FAIL"|"skip"|"info","shape":..,"dtype":..,
 *    "figures":{"rel_l2":..,"band":..,"worst":..,"repeat":"same"|"DIFFER"|"-"} or null,"vs":..,"note":..,
 *    "error": the first reason the row failed (or why it was skipped), else null}
 * (non-finite figures as null), the environment once ({"type":"env",...}: ck_json_env) and each speed figure
 * ({"type":"speed","key":..,"label":..,"tflops":..,"ms":..,"note":..}: ck_speed). stage and group label every line.
 * Returns 0 or -1 (the file cannot be opened; message in core_error). */
int ck_json_open(const char *path, int stage, const char *group);
void ck_json_close(void);
void ck_json_env(const k_cuda_info *in, int omp_threads);
/* A speed figure (key e.g. "gemm_nn"; tflops and ms of one call; note may be NULL). */
void ck_speed(const char *key, const char *label, double tflops, double ms, const char *note);

/* ---- timing ---- */

/* Seconds per call of fn (after warm calls), timed with CUDA events on the backend's stream; < 0 on error. */
double ck_time(ck_gpu_fn fn, void *ctx, int warm, int iters);

#endif
