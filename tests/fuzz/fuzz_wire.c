/* tests/fuzz/fuzz_wire.c — libFuzzer target for the wire-format parser core/wire.c (`make fuzz`).
 *
 * Input layout: tests/fuzz/fuzz_frames.h with up to 7 tensor frames. The limits are small (header 4096 bytes, frame 1024, total 6000, 6 tensors) so they are hit too. When a
 * message parses: every tensor must point into its frame with the declared size; rebuilding it with
 * core_wire_build from the parsed header must parse back to the same type, id and tensors. Any crash, sanitizer
 * report, leak or broken round trip (abort) is a finding. Seeds: seeds-fuzz_wire/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/wire.h"
#include "tests/fuzz/fuzz_frames.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    core_wire_frame fr[9];
    const int k = fuzz_cut_frames(data, size, 7, fr);
    if (k < 0) return 0;
    core_wire_limits lim = {.max_header_bytes = 4096, .max_frame_bytes = 1024, .max_total_bytes = 6000, .max_tensors = 6};
    core_wire_msg m;
    if (core_wire_parse(fr, k + 1, &lim, &m) != 0) {
        if (m.header || m.tensors) abort();
        return 0;
    }
    if (m.n_tensors != k || !m.id) abort();
    for (int i = 0; i < k; i++)
        if (m.tensors[i].data != fr[i + 1].data || m.tensors[i].nbytes != fr[i + 1].len) abort();
    json_t *fields = json_deep_copy(m.header);
    if (!fields) abort();
    json_object_del(fields, "v");
    json_object_del(fields, "type");
    json_object_del(fields, "id");
    json_object_del(fields, "tensors");
    core_wire_built b;
    if (core_wire_build(m.type, m.id, fields, m.tensors, m.n_tensors, &b) != 0) abort();
    core_wire_msg m2;
    if (core_wire_parse(b.frames, b.n_frames, NULL, &m2) != 0) abort();
    json_t *fields2 = json_deep_copy(m2.header);
    if (!fields2) abort();
    json_object_del(fields2, "v");
    json_object_del(fields2, "type");
    json_object_del(fields2, "id");
    json_object_del(fields2, "tensors");
    if (m2.type != m.type || strcmp(m2.id, m.id) || m2.n_tensors != m.n_tensors || !json_equal(fields, fields2))
        abort();
    json_decref(fields2);
    for (int i = 0; i < k; i++) {
        const core_wire_tensor *a = &m.tensors[i], *c = &m2.tensors[i];
        if (strcmp(a->name, c->name) || a->dtype != c->dtype || a->ndim != c->ndim || a->nbytes != c->nbytes ||
            memcmp(a->shape, c->shape, sizeof a->shape[0] * (size_t)a->ndim))
            abort();
    }
    core_wire_msg_free(&m2);
    core_wire_built_free(&b);
    json_decref(fields);
    core_wire_msg_free(&m);
    return 0;
}
