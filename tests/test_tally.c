/* tests/test_tally.c — the closing line of `make test` (tests/test_main.c's tally, the Makefile's test target):
 *   - the runner appends "start LABEL" and "done LABEL P F S" to VGRPO_TEST_TALLY;
 *   - `vgrpo_tests --tally FILE` prints one line with the totals of every part and exits 1 when a test failed, a
 *     part started and never finished (a failed build, a crash) or ran no test, 0 when all passed;
 *   - `make test`'s last command is that tally (its last line was the CUDA smoke subset's own count). */
#include <libgen.h>
#include <string.h>
#include <unistd.h>

#include "tests/test.h"

/* Runs `<this runner> --tally dir/name` over the lines `text`; its stdout into out; returns its exit status. */
static int tally(const char *dir, const char *name, const char *text, char *out, size_t cap) {
    test_write_text(dir, name, text);
    return test_run(out, cap, "/proc/%d/exe --tally %s/%s", (int)getpid(), dir, name);
}

TEST(tally_totals_every_part) {
    const char *d = test_tmpdir();
    char out[4096];
    int rc = tally(d, "ok", "start suite\ndone suite 482 0 3\nstart cuda-smoke\ndone cuda-smoke 24 0 0\n", out, sizeof out);
    CHECK_MSG(rc == 0, "status %d: %s", rc, out);
    CHECK_MSG(strstr(out, "make test: 506 passed, 0 failed (suite 482 passed, 0 failed; cuda-smoke 24 passed, 0 "
                          "failed)\n"),
              "got: %s", out);
    /* a failure in the second part makes the whole fail, and the totals say so */
    rc = tally(d, "f", "start suite\ndone suite 482 0 0\nstart cuda-smoke\ndone cuda-smoke 23 1 0\n", out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "make test: 505 passed, 1 failed (suite 482 passed, 0 failed; cuda-smoke 23 "
                                     "passed, 1 failed)"),
              "status %d: %s", rc, out);
    /* the suite crashed (no "done"), the smoke subset passed: still a failure, naming the part */
    rc = tally(d, "c", "start suite\nstart cuda-smoke\ndone cuda-smoke 24 0 0\n", out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "make test: 24 passed, 0 failed, and a part did not run to its end (suite did "
                                     "not finish"),
              "status %d: %s", rc, out);
    /* a part skipped (no nvcc) is named, and does not fail the run */
    rc = tally(d, "s", "start suite\ndone suite 10 0 0\nskipped cuda-smoke /usr/local/cuda/bin/nvcc not found\n", out,
               sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "make test: 10 passed, 0 failed (suite 10 passed, 0 failed; cuda-smoke skipped: "
                                     "/usr/local/cuda/bin/nvcc not found)"),
              "status %d: %s", rc, out);
    /* nothing ran, or the file is missing or garbled: never a pass */
    rc = tally(d, "e", "", out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "no part ran"), "status %d: %s", rc, out);
    rc = tally(d, "z", "start suite\ndone suite 0 0 0\n", out, sizeof out);
    CHECK_MSG(rc == 1 && strstr(out, "suite ran no test"), "status %d: %s", rc, out);
    rc = test_run(out, sizeof out, "/proc/%d/exe --tally %s/missing", (int)getpid(), d);
    CHECK_MSG(rc == 2 && strstr(out, "nothing ran"), "status %d: %s", rc, out);
    rc = tally(d, "g", "start suite\ndone suite x y z\n", out, sizeof out);
    CHECK_MSG(rc == 2 && strstr(out, "/g:2: a line that is not"), "status %d: %s", rc, out);
}

TEST(tally_runner_appends_its_counts) {
    const char *d = test_tmpdir();
    char out[8192], buf[1024];
    /* two parts into one file, as make test does; a selection that matches nothing is recorded as a part that ran
     * no test */
    int rc = test_run(out, sizeof out,
                      "VGRPO_TEST_TALLY=%s/t VGRPO_TEST_PART=first /proc/%d/exe philox_known checksum_xxh64 && "
                      "VGRPO_TEST_TALLY=%s/t VGRPO_TEST_PART=second /proc/%d/exe philox_streams_differ && "
                      "VGRPO_TEST_TALLY=%s/t VGRPO_TEST_PART=third /proc/%d/exe no_such_test_name_anywhere",
                      d, (int)getpid(), d, (int)getpid(), d, (int)getpid());
    CHECK_MSG(rc == 2, "status %d: %s", rc, out);
    char path[1024];
    snprintf(path, sizeof path, "%s/t", d);
    REQUIRE(test_slurp(path, buf, sizeof buf) > 0);
    CHECK_MSG(!strcmp(buf, "start first\ndone first 2 0 0\nstart second\ndone second 1 0 0\nstart third\n"
                           "done third 0 0 0\n"),
              "tally file: %s", buf);
    rc = test_run(out, sizeof out, "/proc/%d/exe --tally %s", (int)getpid(), path);
    CHECK_MSG(rc == 1 && strstr(out, "make test: 3 passed, 0 failed, and a part did not run to its end (first 2 "
                                     "passed, 0 failed; second 1 passed, 0 failed; third ran no test)"),
              "status %d: %s", rc, out);
}

TEST(tally_is_make_tests_last_line) {
    /* make -n prints what `make test` would run, in order (recursive makes dry too); the build under test's folder */
    char bin[1024], out[65536];
    snprintf(bin, sizeof bin, "%s", test_vgrpo_bin());
    const char *build = dirname(bin);
    if (test_run(out, sizeof out, "command -v make") != 0) {
        test_skip("make not found");
        return;
    }
    /* the lines with $(MAKE) run even under -n (test-cuda-build's appends to the tally): a tally file of our own */
    const char *d = test_tmpdir();
    int rc = test_run(out, sizeof out, "make -n --no-print-directory test BUILD=%s NVCC=/nonexistent/nvcc "
                                       "TEST_TALLY=%s/tally 2>&1 | grep -v '^make' | tail -n 1", build, d);
    CHECK_MSG(rc == 0, "make -n test: status %d: %s", rc, out);
    char want[1200];
    snprintf(want, sizeof want, "%s/vgrpo_tests --tally %s/tally", build, d);
    CHECK_MSG(strstr(out, want) != NULL, "make test's last command is not \"%s\": %s", want, out);
}
