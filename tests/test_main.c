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

int main(int argc, char **argv) {
    core_omp_env_defaults(argv);
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: %s [SUBSTRING ...]\nRuns every test, or those whose name contains one of the substrings.\n"
               "VGRPO_SLOW=1 also runs the slow tests; VGRPO_BIN names the vgrpo binary under test.\n", argv[0]);
        return 0;
    }
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
        return 2;
    }
    if (skipped) fprintf(stderr, "%d skipped\n", skipped);
    fflush(stderr);
    for (int k = 0; k < n_fail_lines; k++) printf("FAILED %s\n", fail_lines[k]);
    if (failed > n_fail_lines) printf("(%d more failed tests not listed)\n", failed - n_fail_lines);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
