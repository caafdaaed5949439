/* tests/test.h — the test harness: TEST(name) registers a test; CHECK* record failures and continue;
 * REQUIRE* record a failure and end the test. Run with no arguments for all tests, or with substrings to run
 * the tests whose names contain one of them. The runner ends with one line `N passed, N failed`.
 *
 *   TEST(safetensors_roundtrip) { ... CHECK(x == 1); CHECK_NEAR(a, b, 1e-6); ... }
 *
 * Slow tests call TEST_SLOW() first: they are skipped unless VGRPO_SLOW=1 (make test-slow). */
#ifndef TESTS_TEST_H
#define TESTS_TEST_H

#include <math.h>
#include <setjmp.h>
#include <stdio.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn, const char *file);
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void test_skip(const char *why);
extern jmp_buf test_abort_jmp;

/* Path of the vgrpo binary under test (env VGRPO_BIN, default build/vgrpo). */
const char *test_vgrpo_bin(void);
/* A fresh empty directory for this test under $VGRPO_TEST_TMP/<test name>/ (the Makefile sets $(BUILD)/test-tmp;
 * default build/test-tmp); returned path is static per call. */
const char *test_tmpdir(void);
/* Runs a shell command, returns its exit status (or -1), capturing stdout+stderr into out (may be NULL). */
int test_run(char *out, size_t outcap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Deterministic test data: n floats uniform in [lo, hi) from a seeded LCG (for inputs, not model noise). */
void test_fill_uniform(float *x, size_t n, unsigned long long seed, float lo, float hi);
/* Reads a whole small file into buf (at most cap - 1 bytes, NUL-terminated); returns its length, or -1. */
long test_slurp(const char *path, char *buf, size_t cap);
/* Writes text to dir/rel (rel alone when dir is NULL; its folder must exist); a failure ends the test. */
void test_write_text(const char *dir, const char *rel, const char *text);

#define TEST(name)                                                                                          \
    static void name(void);                                                                                 \
    __attribute__((constructor)) static void test_reg_##name(void) { test_register(#name, name, __FILE__); } \
    static void name(void)

#define TEST_SLOW()                                           \
    do {                                                      \
        const char *s_ = getenv("VGRPO_SLOW");                \
        if (!s_ || s_[0] != '1') {                            \
            test_skip("slow test (VGRPO_SLOW=1 to run)");     \
            return;                                           \
        }                                                     \
    } while (0)

#define CHECK(c)                                                          \
    do {                                                                  \
        if (!(c)) test_fail(__FILE__, __LINE__, "CHECK failed: %s", #c);  \
    } while (0)
#define CHECK_MSG(c, ...)                                \
    do {                                                 \
        if (!(c)) test_fail(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define CHECK_NEAR(a, b, tol)                                                                              \
    do {                                                                                                   \
        double a_ = (double)(a), b_ = (double)(b);                                                         \
        if (!(fabs(a_ - b_) <= (tol)))                                                                     \
            test_fail(__FILE__, __LINE__, "CHECK_NEAR failed: %s = %.9g, %s = %.9g, |diff| %.3g > %.3g", #a, a_, #b, \
                      b_, fabs(a_ - b_), (double)(tol));                                                   \
    } while (0)
#define REQUIRE(c)                                                          \
    do {                                                                    \
        if (!(c)) {                                                         \
            test_fail(__FILE__, __LINE__, "REQUIRE failed: %s", #c);        \
            longjmp(test_abort_jmp, 1);                                     \
        }                                                                   \
    } while (0)
/* REQUIRE_OK(expr): expr returns 0 on success, else the core error message is reported and the test ends. */
#define REQUIRE_OK(e)                                                                                     \
    do {                                                                                                  \
        if ((e) != 0) {                                                                                   \
            test_fail(__FILE__, __LINE__, "REQUIRE_OK failed: %s: %s", #e, core_last_error());            \
            longjmp(test_abort_jmp, 1);                                                                   \
        }                                                                                                 \
    } while (0)

#include <stdlib.h>
#include "core/error.h"

#endif
