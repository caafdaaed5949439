/* tests/ckpt_cmp.h — compares one file of two runs' checkpoints byte for byte. trainer_state.json is compared without
 * its "run_id" (each run has its own: a resumed run and a straight one are two runs) and "state_xxh64" (its hash,
 * which covers the run id); every other line must be identical. */
#ifndef TESTS_CKPT_CMP_H
#define TESTS_CKPT_CMP_H

#include <string.h>

#include "tests/test.h"

/* 0 when fa and fb are the same (as above), else cmp's status; out gets cmp's words. */
static inline int ckpt_file_cmp(char *out, size_t cap, const char *fa, const char *fb) {
    const size_t l = strlen(fa), k = strlen("trainer_state.json");
    if (l < k || strcmp(fa + l - k, "trainer_state.json")) return test_run(out, cap, "cmp %s %s", fa, fb);
    return test_run(out, cap,
                    "t=$(mktemp) && grep -v -e '^  \"run_id\": ' -e '^  \"state_xxh64\": ' %s > $t; "
                    "grep -v -e '^  \"run_id\": ' -e '^  \"state_xxh64\": ' %s | cmp $t - ; r=$?; rm -f $t; exit $r",
                    fa, fb);
}

#endif
