/* tests/test_main.c — the runner for every TEST() linked into build/vgrpo_tests; see test.h. */
#include "tests/test.h"

#include "core/omp_env.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define MAX_TESTS 4096

typedef struct {
    const char *name, *file;
    test_fn fn;
} test_entry;

static test_entry tests[MAX_TESTS];
static int n_tests;
static int cur_failures, cur_skipped;
static const char *cur_name;
jmp_buf test_abort_jmp;

void test_register(const char *name, test_fn fn, const char *file) {
    if (n_tests == MAX_TESTS) {
        fprintf(stderr, "too many tests (raise MAX_TESTS)\n");
        exit(2);
    }
    tests[n_tests++] = (test_entry){name, file, fn};
}

/* The first failure message of each failed test, repeated under the summary: CI keeps only the output's tail. */
#define MAX_FAIL_LINES 32
static char fail_lines[MAX_FAIL_LINES][400];
static int n_fail_lines;

void test_fail(const char *file, int line, const char *fmt, ...) {
    if (cur_failures < 20) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "  %s:%d: ", file, line);
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
    }
    if (cur_failures == 0 && n_fail_lines < MAX_FAIL_LINES) {
        char msg[300];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(fail_lines[n_fail_lines++], sizeof fail_lines[0], "%s: %s:%d: %s", cur_name, file, line, msg);
    }
    cur_failures++;
}

void test_skip(const char *why) {
    cur_skipped = 1;
    fprintf(stderr, "  skipped: %s\n", why);
}

const char *test_vgrpo_bin(void) {
    const char *b = getenv("VGRPO_BIN");
    return b && *b ? b : "build/vgrpo";
}

const char *test_tmpdir(void) {
    static char path[512];
    char cmd[700];
    const char *root = getenv("VGRPO_TEST_TMP"); /* the Makefile's $(BUILD)/test-tmp */
    snprintf(path, sizeof path, "%s/%s", root && *root ? root : "build/test-tmp", cur_name);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", path, path);
    if (system(cmd) != 0) test_fail(__FILE__, __LINE__, "cannot create %s", path);
    return path;
}

int test_run(char *out, size_t outcap, const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[8300];
    snprintf(full, sizeof full, "(%s) 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t n = 0;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, p)) > 0) {
        if (out && n + 1 < outcap) {
            size_t take = got < outcap - 1 - n ? got : outcap - 1 - n;
            memcpy(out + n, buf, take);
            n += take;
        }
    }
    if (out && outcap) out[n] = '\0';
    int st = pclose(p);
    if (st == -1) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

long test_slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return (long)n;
}

void test_write_text(const char *dir, const char *rel, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s%s%s", dir ? dir : "", dir ? "/" : "", rel);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    const int bad = fputs(text, f) < 0;
    REQUIRE(fclose(f) == 0 && !bad);
}

void test_fill_uniform(float *x, size_t n, unsigned long long seed, float lo, float hi) {
    unsigned long long s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        double u = (double)(s >> 11) * (1.0 / 9007199254740992.0);
        x[i] = (float)(lo + (hi - lo) * u);
    }
}

static int selected(const char *name, int argc, char **argv) {
    if (argc < 2) return 1;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i])) return 1;
    return 0;
}

/* ---- the tally of `make test`: one closing line over every part it ran ----
 * With VGRPO_TEST_TALLY=FILE (and VGRPO_TEST_PART=LABEL, default "suite"), the runner appends "start LABEL" before
 * its first test and "done LABEL P F S" (passed, failed, skipped) after its summary; the Makefile appends
 * "start LABEL" itself before building a part and "skipped LABEL WHY" for a part it does not run. A part whose
 * "start" has no "done" ended early (its build failed, or a test crashed the runner): it counts as failed. */
static void tally_append(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void tally_append(const char *fmt, ...) {
    const char *path = getenv("VGRPO_TEST_TALLY");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "cannot append to VGRPO_TEST_TALLY %s\n", path);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

static const char *tally_part(void) {
    const char *p = getenv("VGRPO_TEST_PART");
    return p && *p ? p : "suite";
}

/* `vgrpo_tests --tally FILE`: prints "make test: P passed, F failed (LABEL P passed, F failed; ...)" over the parts
 * FILE records, and returns 0 only when every started part finished and no test failed (1 otherwise; 2 without a
 * readable FILE or with a malformed line). */
static int tally_report(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("make test: no tally in %s: nothing ran\n", path);
        return 2;
    }
    enum { MAX_PARTS = 16 };
    struct { char label[64], why[160]; int started, done, skipped, p, f, s; } part[MAX_PARTS];
    int np = 0, malformed = 0, lineno = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char kind[16], label[64];
        int off = 0;
        if (sscanf(line, "%15s %63s %n", kind, label, &off) < 2) {
            if (strspn(line, " \t\r\n") != strlen(line)) malformed = lineno;
            continue;
        }
        int k = 0;
        while (k < np && strcmp(part[k].label, label)) k++;
        if (k == np) {
            if (np == MAX_PARTS) { malformed = lineno; continue; }
            memset(&part[np], 0, sizeof part[np]);
            snprintf(part[np++].label, sizeof part[0].label, "%s", label);
        }
        if (!strcmp(kind, "start")) {
            part[k].started = 1;
        } else if (!strcmp(kind, "done")) {
            if (sscanf(line + off, "%d %d %d", &part[k].p, &part[k].f, &part[k].s) != 3) malformed = lineno;
            else part[k].done = 1;
        } else if (!strcmp(kind, "skipped")) {
            part[k].skipped = 1;
            snprintf(part[k].why, sizeof part[k].why, "%s", line + off);
            part[k].why[strcspn(part[k].why, "\r\n")] = 0;
        } else {
            malformed = lineno;
        }
    }
    fclose(f);
    int P = 0, F = 0, broken = 0;
    char detail[2048] = "";
    size_t n = 0;
    for (int k = 0; k < np && n < sizeof detail; k++) {
        const char *sep = n ? "; " : "";
        if (part[k].done && part[k].p + part[k].f == 0) {
            broken++;
            n += (size_t)snprintf(detail + n, sizeof detail - n, "%s%s ran no test", sep, part[k].label);
        } else if (part[k].done) {
            P += part[k].p, F += part[k].f;
            n += (size_t)snprintf(detail + n, sizeof detail - n, "%s%s %d passed, %d failed", sep, part[k].label,
                                  part[k].p, part[k].f);
        } else if (part[k].started) {
            broken++;
            n += (size_t)snprintf(detail + n, sizeof detail - n, "%s%s did not finish (its build failed or a test "
                                  "crashed the runner)", sep, part[k].label);
        } else if (part[k].skipped) {
            n += (size_t)snprintf(detail + n, sizeof detail - n, "%s%s skipped: %s", sep, part[k].label, part[k].why);
        }
    }
    if (malformed) printf("make test: %s:%d: a line that is not \"start|done|skipped LABEL ...\"\n", path, malformed);
    printf("make test: %d passed, %d failed%s (%s)\n", P, F, broken ? ", and a part did not run to its end" : "",
           np ? detail : "no part ran");
    return malformed ? 2 : (F || broken || np == 0) ? 1 : 0;
}

int main(int argc, char **argv) {
    core_omp_env_defaults(argv);
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: %s [SUBSTRING ...]\n       %s --tally FILE\n"
               "Runs every test, or those whose name contains one of the substrings.\n"
               "VGRPO_SLOW=1 also runs the slow tests; VGRPO_BIN names the vgrpo binary under test.\n"
               "VGRPO_TEST_TALLY=FILE appends this run's counts to FILE under the label VGRPO_TEST_PART (default "
               "suite);\n--tally FILE prints one line with the totals of every part FILE records (exit 1 if any "
               "failed or did not finish).\n", argv[0], argv[0]);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--tally")) {
        if (argc != 3) {
            fprintf(stderr, "usage: %s --tally FILE\n", argv[0]);
            return 2;
        }
        return tally_report(argv[2]);
    }
    tally_append("start %s\n", tally_part());
    static int passed, failed, skipped;
    static int i;
    for (i = 0; i < n_tests; i++) {
        if (!selected(tests[i].name, argc, argv)) continue;
        cur_name = tests[i].name;
        cur_failures = 0;
        cur_skipped = 0;
        core_error_clear();
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fprintf(stderr, "[ RUN  ] %s\n", tests[i].name);
        if (setjmp(test_abort_jmp) == 0) tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (cur_failures) {
            failed++;
            fprintf(stderr, "[ FAIL ] %s (%d failures, %.0f ms)\n", tests[i].name, cur_failures, ms);
        } else if (cur_skipped) {
            skipped++;
            fprintf(stderr, "[ SKIP ] %s\n", tests[i].name);
        } else {
            passed++;
            fprintf(stderr, "[  OK  ] %s (%.0f ms)\n", tests[i].name, ms);
        }
    }
    if (passed + failed + skipped == 0) {
        fprintf(stderr, "no test name contains any of the given substrings\n");
        printf("0 passed, 0 failed\n");
        tally_append("done %s 0 0 0\n", tally_part()); /* --tally counts a part that ran no test as broken */
        return 2;
    }
    if (skipped) fprintf(stderr, "%d skipped\n", skipped);
    fflush(stderr);
    for (int k = 0; k < n_fail_lines; k++) printf("FAILED %s\n", fail_lines[k]);
    if (failed > n_fail_lines) printf("(%d more failed tests not listed)\n", failed - n_fail_lines);
    printf("%d passed, %d failed\n", passed, failed);
    fflush(stdout);
    tally_append("done %s %d %d %d\n", tally_part(), passed, failed, skipped);
    return failed ? 1 : 0;
}
