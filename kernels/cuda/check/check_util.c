/* kernels/cuda/check/check_util.c — see check_util.h. */
#include "kernels/cuda/check/check_util.h"

#ifndef CK_EMULATE
#include <cuda_runtime_api.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

const kb_in CK_NO_IN = {NULL, KB_F32};
const kb_out CK_NO_OUT = {NULL, KB_F32};

static int n_rows, n_fail, n_skip;

/* ---- the rows as JSON lines (ck_json_open) ---- */

static FILE *json;
static int json_stage;
static char json_group[32];

int ck_json_open(const char *path, int stage, const char *group) {
    if (!(json = fopen(path, "a"))) return core_error("cannot open %s for the JSON rows", path);
    json_stage = stage;
    snprintf(json_group, sizeof json_group, "%s", group ? group : "all");
    return 0;
}

void ck_json_close(void) {
    if (json) fclose(json);
    json = NULL;
}

/* s as a JSON string (quotes, backslashes and control characters escaped); "null" for NULL. */
static void jstr(const char *s) {
    if (!s) {
        fputs("null", json);
        return;
    }
    fputc('"', json);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(json, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(json, "\\u%04x", *c);
        else
            fputc(*c, json);
    }
    fputc('"', json);
}

static void jnum(double v) {
    if (v == v && v - v == 0)
        fprintf(json, "%.6g", v);
    else
        fputs("null", json);
}

/* One row: status "ok", "FAIL", "skip" or "info"; figures (rel-L2, band, worst, repeat) when has_fig; error: the
 * first reason it failed or why it was skipped; note, vs: as printed in the table. Flushed at once, so a crash later in
 * the process keeps the rows before it. */
static void json_row(const char *name, const char *shape, const char *dtype, const char *status, int has_fig,
                     double rel, double band, double worst, int repeat, const char *vs, const char *note,
                     const char *error) {
    if (!json) return;
    fprintf(json, "{\"type\":\"row\",\"stage\":%d,\"group\":", json_stage);
    jstr(json_group);
    fputs(",\"name\":", json), jstr(name);
    fputs(",\"status\":", json), jstr(status);
    fputs(",\"shape\":", json), jstr(shape);
    fputs(",\"dtype\":", json), jstr(dtype);
    fputs(",\"figures\":", json);
    if (has_fig) {
        fputs("{\"rel_l2\":", json), jnum(rel);
        fputs(",\"band\":", json), jnum(band);
        fputs(",\"worst\":", json), jnum(worst);
        fprintf(json, ",\"repeat\":\"%s\"}", repeat < 0 ? "-" : repeat ? "same" : "DIFFER");
    } else {
        fputs("null", json);
    }
    fputs(",\"vs\":", json), jstr(vs);
    fputs(",\"note\":", json), jstr(note);
    fputs(",\"error\":", json), jstr(error);
    fputs("}\n", json);
    fflush(json);
}

void ck_json_env(const k_cuda_info *in, int omp_threads) {
    if (!json) return;
    fprintf(json, "{\"type\":\"env\",\"stage\":%d,\"group\":", json_stage);
    jstr(json_group);
    fputs(",\"gpu\":", json), jstr(in->gpu);
    fprintf(json, ",\"cc\":\"%d.%d\",\"sm_count\":%d,\"mem_gib\":%.1f,\"driver\":%d,\"runtime\":%d", in->cc_major,
            in->cc_minor, in->sm_count, in->mem_bytes / 1073741824.0, in->driver_version, in->runtime_version);
    fprintf(json, ",\"cublaslt_version\":%zu,\"cublaslt_path\":", in->cublaslt_version);
    jstr(in->cublaslt_path);
    fprintf(json, ",\"cudnn_version\":%zu,\"cudnn_path\":", in->cudnn_version);
    jstr(in->cudnn_path);
    fprintf(json, ",\"cpu_threads\":%d}\n", omp_threads);
    fflush(json);
}

void ck_speed(const char *key, const char *label, double tflops, double ms, const char *note) {
    if (!json) return;
    fprintf(json, "{\"type\":\"speed\",\"source\":\"vgrpo\",\"stage\":%d,\"key\":", json_stage);
    jstr(key);
    fputs(",\"label\":", json), jstr(label);
    fputs(",\"tflops\":", json), jnum(tflops);
    fputs(",\"ms\":", json), jnum(ms);
    fputs(",\"note\":", json), jstr(note);
    fputs("}\n", json);
    fflush(json);
}

float *ck_floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "gpu_check: out of host memory (%zu floats)\n", n);
        exit(3);
    }
    return p;
}

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ck_fill(float *x, size_t n, uint64_t seed, float lo, float hi, int round_bf16) {
    const uint64_t s = mix64(seed * 0x9e3779b97f4a7c15ull + 1);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        double u = (double)(mix64(s + i) >> 11) * (1.0 / 9007199254740992.0);
        float v = (float)(lo + (hi - lo) * u);
        x[i] = round_bf16 ? kb_round_bf16(v) : v;
    }
}

int ct_alloc(ct_t *t, size_t n, int bf16) {
    memset(t, 0, sizeof *t);
    t->n = n, t->bf16 = bf16;
    t->h = calloc(n ? n : 1, sizeof(float));
    if (!t->h) return core_error("host allocation of %zu floats", n);
    size_t bytes = n * (bf16 ? sizeof(kb_bf16) : sizeof(float));
    if (!(t->d = k_dev_alloc(bytes)) || k_dev_zero(t->d, bytes) || k_dev_sync()) {
        free(t->h), t->h = NULL;
        return -1;
    }
    return 0;
}

void ct_free(ct_t *t) {
    free(t->h);
    k_dev_free(t->d);
    memset(t, 0, sizeof *t);
}

int ct_push(const ct_t *t) {
    return t->bf16 ? k_dev_upload_bf16((kb_bf16 *)t->d, t->h, t->n) : k_dev_upload(t->d, t->h, t->n * sizeof(float));
}

int ct_pull(const ct_t *t, float *dst) {
    return t->bf16 ? k_dev_download_bf16(dst, (const kb_bf16 *)t->d, t->n)
                   : k_dev_download(dst, t->d, t->n * sizeof(float));
}

int ct_rand(ct_t *t, uint64_t seed, float lo, float hi) {
    ck_fill(t->h, t->n, seed, lo, hi, t->bf16);
    return ct_push(t);
}

kb_in ct_in(const ct_t *t) {
    kb_in v = {t->d, t->bf16 ? KB_BF16 : KB_F32};
    return v;
}

kb_out ct_out(ct_t *t) {
    kb_out v = {t->d, t->bf16 ? KB_BF16 : KB_F32};
    return v;
}

int ck_run_twice(const char *op, ck_gpu_fn fn, void *ctx, ct_t *const *outs, float *const *got, int nout) {
    int same = 1;
    for (int run = 0; run < 2; run++) {
        if (fn(ctx) || k_dev_sync()) {
            ck_row_error(op, "", core_last_error());
            return -1;
        }
        for (int i = 0; i < nout; i++) {
            if (run == 0) {
                if (ct_pull(outs[i], got[i])) {
                    ck_row_error(op, "", core_last_error());
                    return -1;
                }
            } else {
                float *tmp = ck_floats(outs[i]->n);
                int rc = ct_pull(outs[i], tmp);
                if (!rc && memcmp(tmp, got[i], outs[i]->n * sizeof(float)) != 0) same = 0;
                free(tmp);
                if (rc) {
                    ck_row_error(op, "", core_last_error());
                    return -1;
                }
            }
        }
    }
    return same;
}

void ck_table_header(void) {
    printf("%-34s %-22s %-5s %-9s %-10s %-9s %-7s %-22s %s\n", "op", "shape", "dtype", "rel-L2", "band", "worst",
           "repeat", "vs CPU", "result");
    printf("%.*s\n", 134, "--------------------------------------------------------------------------------------------"
                          "------------------------------------------------------------");
}

void ck_row(const char *op, const char *shape, int bf16, const float *got, const float *ref, size_t n,
            ck_expect expect, double band, int repeat, const char *note) {
    double num = 0, den = 0, md = 0, mr = 0;
    size_t differ = 0, nan = 0;
#pragma omp parallel for schedule(static) reduction(+ : num, den, differ, nan) reduction(max : md, mr)
    for (size_t i = 0; i < n; i++) {
        double g = got[i], r = ref[i], d = g - r;
        if (g != g || r != r) {
            if (!(g != g && r != r)) nan++;
            continue;
        }
        num += d * d, den += r * r;
        if (fabs(d) > md) md = fabs(d);
        if (fabs(r) > mr) mr = fabs(r);
        float want = bf16 ? kb_round_bf16(ref[i]) : ref[i];
        if (memcmp(&got[i], &want, sizeof want) != 0) differ++;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num), worst = mr > 0 ? md / mr : md;
    int fail = nan > 0 || !(rel <= band) || repeat == 0 || (expect == CK_EXACT && differ > 0);
    char why[160] = "";
    if (nan)
        snprintf(why, sizeof why, "%zu NaN/inf values where the CPU has none (or the reverse)", nan);
    else if (!(rel <= band))
        snprintf(why, sizeof why, "rel-L2 %.3e above its band %.1e (worst %.3e)", rel, band, worst);
    else if (expect == CK_EXACT && differ)
        snprintf(why, sizeof why, "%zu of %zu values differ from the %s CPU result (exact expected)", differ, n,
                 bf16 ? "rounded" : "fp32");
    else if (repeat == 0)
        snprintf(why, sizeof why, "the op run twice gave different bits (repeat DIFFER)");
    char vs[64];
    if (nan)
        snprintf(vs, sizeof vs, "%zu NaN/inf mismatches", nan);
    else if (!differ)
        snprintf(vs, sizeof vs, bf16 ? "= rounded CPU" : "= CPU bits");
    else
        snprintf(vs, sizeof vs, "%zu/%zu differ", differ, n);
    char bandtxt[16];
    snprintf(bandtxt, sizeof bandtxt, "<=%.1e", band);
    printf("%-34s %-22s %-5s %-9.2e %-10s %-9.2e %-7s %-22s %s%s%s\n", op, shape, bf16 ? "bf16" : "fp32", rel, bandtxt,
           worst, repeat < 0 ? "-" : repeat ? "same" : "DIFFER", vs, fail ? "FAIL" : "ok", note ? "  " : "",
           note ? note : "");
    if (fail) printf("%-34s   ^ FAIL: %s\n", "", why);
    fflush(stdout);
    json_row(op, shape, bf16 ? "bf16" : "fp32", fail ? "FAIL" : "ok", 1, rel, band, worst, repeat, vs, note,
             fail ? why : NULL);
    n_rows++;
    n_fail += fail;
}

void ck_row_figures(const char *op, const char *shape, const char *dtype, double rel, double band, double worst,
                    int repeat, const char *vs, int extra_ok, const char *note) {
    const int fail = !(rel <= band) || repeat == 0 || !extra_ok;
    char why[300] = "";
    if (!(rel <= band))
        snprintf(why, sizeof why, "%.3e above its band %.1e (worst %.3e)%s%s", rel, band, worst, note ? "; " : "",
                 note ? note : "");
    else if (repeat == 0)
        snprintf(why, sizeof why, "the repeat run gave different bits (repeat DIFFER)");
    else if (!extra_ok)
        snprintf(why, sizeof why, "its second condition failed: %s", note ? note : "(no note)");
    char bandtxt[16];
    snprintf(bandtxt, sizeof bandtxt, "<=%.1e", band);
    printf("%-34s %-22s %-5s %-9.2e %-10s %-9.2e %-7s %-22s %s%s%s\n", op, shape, dtype, rel, bandtxt, worst,
           repeat < 0 ? "-" : repeat ? "same" : "DIFFER", vs ? vs : "-", fail ? "FAIL" : "ok", note ? "  " : "",
           note ? note : "");
    if (fail) printf("%-34s   ^ FAIL: %s\n", "", why);
    fflush(stdout);
    json_row(op, shape, dtype, fail ? "FAIL" : "ok", 1, rel, band, worst, repeat, vs, note, fail ? why : NULL);
    n_rows++;
    n_fail += fail;
}

void ck_row_error(const char *op, const char *shape, const char *msg) {
    printf("%-34s %-22s FAIL: %s\n", op, shape, msg && *msg ? msg : "(no message)");
    fflush(stdout);
    json_row(op, shape, NULL, "FAIL", 0, 0, 0, 0, -1, NULL, NULL, msg && *msg ? msg : "(no message)");
    n_rows++;
    n_fail++;
}

void ck_row_skip(const char *op, const char *shape, const char *why) {
    printf("%-34s %-22s skip: %s\n", op, shape, why);
    fflush(stdout);
    json_row(op, shape, NULL, "skip", 0, 0, 0, 0, -1, NULL, NULL, why);
    n_skip++;
}

void ck_row_info(const char *op, const char *shape, const char *text) {
    printf("%-34s %-22s %s\n", op, shape, text);
    fflush(stdout);
    json_row(op, shape, NULL, "info", 0, 0, 0, 0, -1, NULL, text, NULL);
}

int ck_rows(void) { return n_rows; }
int ck_skips(void) { return n_skip; }
int ck_failures(void) { return n_fail; }

double ck_time(ck_gpu_fn fn, void *ctx, int warm, int iters) {
#ifdef CK_EMULATE
    (void)fn, (void)ctx, (void)warm, (void)iters;
    return core_error("timing: the emulated device has no speed worth reporting");
#else
    cudaStream_t st = (cudaStream_t)k_cuda_stream();
    for (int i = 0; i < warm; i++)
        if (fn(ctx)) return -1;
    cudaEvent_t a, b;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess)
        return core_error("cudaEventCreate failed");
    cudaEventRecord(a, st);
    for (int i = 0; i < iters; i++)
        if (fn(ctx)) return -1;
    cudaEventRecord(b, st);
    if (cudaEventSynchronize(b) != cudaSuccess) return core_error("cudaEventSynchronize failed");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms / 1000.0 / iters;
#endif
}
