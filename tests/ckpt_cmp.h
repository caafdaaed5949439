/* tests/ckpt_cmp.h — compares one file of two runs' checkpoints byte for byte. trainer_state.json is compared without
 * its "run_id" (each run has its own: a resumed run and a straight one are two runs) and "state_xxh64" (its hash,
 * which covers the run id); every other line must be identical. And the relative L2 distance of two checkpoints'
 * F32 tensors, for runs that agree within a bound. */
#ifndef TESTS_CKPT_CMP_H
#define TESTS_CKPT_CMP_H

#include <string.h>

#include "core/safetensors.h"
#include "core/tensor.h"
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

/* Sum over the F32 tensors of two safetensors files of the squared differences (*d2) and of the first's squares
 * (*a2): the relative L2 distance of two checkpoints is sqrt(*d2 / *a2). The files must hold the same tensors. */
static inline void ckpt_l2_diff(const char *pa, const char *pb, double *d2, double *a2) {
    st_file *fa = st_open(pa), *fb = st_open(pb);
    *d2 = *a2 = 0;
    REQUIRE(fa && fb);
    REQUIRE(st_count(fa) == st_count(fb));
    for (int i = 0; i < st_count(fa); i++) {
        const st_info *t = st_info_at(fa, i);
        if (t->dtype != CORE_F32) continue;
        core_tensor va, vb;
        REQUIRE_OK(st_get(fa, t->name, &va));
        REQUIRE_OK(st_get(fb, t->name, &vb));
        const int64_t n = core_tensor_numel(&va);
        REQUIRE(n == core_tensor_numel(&vb));
        const float *a = va.data, *b = vb.data;
        for (int64_t k = 0; k < n; k++) {
            const double d = (double)a[k] - (double)b[k];
            *d2 += d * d, *a2 += (double)a[k] * a[k];
        }
        core_tensor_free(&va), core_tensor_free(&vb);
    }
    st_close(fa), st_close(fb);
}

#endif
