/* tests/test_fuzz_build.c — the libFuzzer build (`make fuzz`) cannot break unnoticed: `make fuzz-build` compiles
 * every tests/fuzz/fuzz_*.c and links one target against the fuzzed sources (Makefile FUZZ_LIB_SRC), which every
 * target shares, so a parser that comes to need code outside that list fails here, not first in a fuzzing session.
 * Skipped, saying so, without clang. */
#include <stdio.h>
#include <string.h>

#include "tests/test.h"

TEST(fuzz_targets_build) {
    if (test_run(NULL, 0, "command -v clang >/dev/null 2>&1") != 0) {
        test_skip("clang not found (scripts/install-deps.sh installs it for make fuzz)");
        return;
    }
    static char out[1 << 16];
    const int st = test_run(out, sizeof out, "make -s --no-print-directory fuzz-build 2>&1");
    CHECK_MSG(st == 0 && strstr(out, "targets compiled, fuzz_worker_msg linked"), "make fuzz-build: %s", out);
}
