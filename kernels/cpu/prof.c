/* kernels/cpu/prof.c — the per-op time table (kernels/cpu/prof.h). Rows live in a fixed array searched by a small
 * open-addressing hash of their key; nothing is allocated. */
#include "kernels/cpu/prof.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

int k_prof_on;

enum { HASH = 2 * K_PROF_MAX_ROWS };

static k_prof_row rows[K_PROF_MAX_ROWS];
static int n_rows;
static short slot[HASH]; /* row index + 1, 0 = empty */
static const char *cur_phase = "";
static __thread int prof_thread, depth;

void k_prof_reset(void) {
    n_rows = 0;
    memset(slot, 0, sizeof slot);
}

void k_prof_enable(int on) {
    k_prof_reset();
    prof_thread = on;
    depth = 0;
    k_prof_on = on;
}

void k_prof_set_phase(const char *phase) { cur_phase = phase ? phase : ""; }

double k_prof_begin(void) {
    if (!prof_thread || depth || omp_in_parallel()) return 0.0;
    depth = 1;
    double t = omp_get_wtime();
    return t > 0.0 ? t : 1e-300;
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
    return h;
}

static uint64_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static int same(const char *a, const char *b) { return a == b || !strcmp(a, b); }

/* The row of this key (created when new; the phase's "(more)" row when the table is full). */
static k_prof_row *row_for(const char *op, int ta, int tb, int M, int N, int K, int64_t elems) {
    uint64_t h = mix(mix(mix(str_hash(cur_phase), str_hash(op)), (uint64_t)(ta * 2 + tb)),
                     mix(mix((uint64_t)M, (uint64_t)N), mix((uint64_t)K, (uint64_t)elems)));
    for (uint64_t i = 0; i < HASH; i++) {
        short *s = &slot[(h + i) % HASH];
        if (*s) {
            k_prof_row *r = &rows[*s - 1];
            if (same(r->phase, cur_phase) && same(r->op, op) && r->ta == ta && r->tb == tb && r->M == M && r->N == N &&
                r->K == K && r->elems == elems)
                return r;
            continue;
        }
        if (n_rows >= K_PROF_MAX_ROWS - 1) break;
        *s = (short)(n_rows + 1);
        k_prof_row *r = &rows[n_rows++];
        *r = (k_prof_row){.phase = cur_phase, .op = op, .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .elems = elems};
        return r;
    }
    static const char more[] = "(more)";
    for (int i = 0; i < n_rows; i++)
        if (same(rows[i].phase, cur_phase) && rows[i].op == more) return &rows[i];
    if (n_rows >= K_PROF_MAX_ROWS) return &rows[K_PROF_MAX_ROWS - 1];
    k_prof_row *r = &rows[n_rows++];
    *r = (k_prof_row){.phase = cur_phase, .op = more, .ta = -1, .tb = -1};
    return r;
}

void k_prof_end(double t0, const char *op, int64_t elems, double flops) {
    double dt = omp_get_wtime() - t0;
    depth = 0;
    k_prof_row *r = row_for(op, -1, -1, 0, 0, 0, elems);
    r->calls++, r->seconds += dt, r->flops += flops;
}

void k_prof_end_gemm(double t0, int ta, int tb, int M, int N, int K) {
    double dt = omp_get_wtime() - t0;
    depth = 0;
    k_prof_row *r = row_for("gemm", ta, tb, M, N, K, 0);
    r->calls++, r->seconds += dt, r->flops += 2.0 * M * N * K;
}

static int by_seconds(const void *a, const void *b) {
    const k_prof_row *x = a, *y = b;
    return x->seconds < y->seconds ? 1 : x->seconds > y->seconds ? -1 : 0;
}

int k_prof_rows(k_prof_row *out, int cap) {
    int n = n_rows < cap ? n_rows : cap;
    if (n_rows <= cap) {
        memcpy(out, rows, sizeof *out * (size_t)n_rows);
        qsort(out, (size_t)n, sizeof *out, by_seconds);
        return n_rows;
    }
    k_prof_row *all = malloc(sizeof *all * (size_t)n_rows);
    if (!all) {
        memcpy(out, rows, sizeof *out * (size_t)n);
        return n_rows;
    }
    memcpy(all, rows, sizeof *all * (size_t)n_rows);
    qsort(all, (size_t)n_rows, sizeof *all, by_seconds);
    memcpy(out, all, sizeof *out * (size_t)n);
    free(all);
    return n_rows;
}
