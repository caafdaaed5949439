/* tests/fuzz/fuzz_safetensors.c — libFuzzer target for the safetensors reader (`make fuzz`).
 *
 * Parses the input as a whole safetensors file with st_parse_buffer (the same parser st_open runs on its mapping)
 * and, when it is accepted, touches every tensor: st_get (view or aligned copy), every byte of it, st_read_f32 for
 * float dtypes (it refuses a non-finite value and returns finite ones), the metadata. Any crash, sanitizer report or leak is a finding. Seeds: seeds-fuzz_safetensors/. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file *f = st_parse_buffer(data, size, "fuzz");
    if (!f) return 0;
    volatile uint64_t sink = 0;
    for (int i = 0; i < st_count(f); i++) {
        const char *name = st_name(f, i);
        const st_info *in = st_info_at(f, i);
        if (st_find(f, name) != i) abort(); /* names are unique and sorted */
        core_tensor t;
        if (st_get(f, name, &t) != 0) abort();
        size_t nb = core_tensor_nbytes(&t);
        if (nb != in->end - in->begin) abort();
        if (nb && (uintptr_t)t.data % core_dtype_size(t.dtype)) abort(); /* views are always aligned */
        for (size_t k = 0; k < nb; k++) sink += ((const uint8_t *)t.data)[k];
        if (t.dtype == CORE_F32 || t.dtype == CORE_BF16 || t.dtype == CORE_F16) {
            int64_t n = core_tensor_numel(&t);
            if (n <= (1 << 20)) {
                /* st_read_f32 refuses a tensor holding a NaN or inf (naming it) and nothing else here; what it
                 * returns is finite */
                float *dst = malloc((size_t)(n ? n : 1) * sizeof(float));
                if (dst && st_read_f32(f, name, dst, n) != 0) {
                    if (!strstr(core_last_error(), "non-finite")) abort();
                } else
                    for (int64_t k = 0; dst && k < n; k++)
                        if (!isfinite(dst[k])) abort();
                free(dst);
            }
        }
        core_tensor_free(&t);
    }
    for (int i = 0; i < st_metadata_count(f); i++) {
        const char *k = st_metadata_key(f, i), *v = st_metadata(f, k);
        sink += strlen(k) + (v ? strlen(v) : 0);
    }
    (void)sink;
    st_close(f);
    return 0;
}
