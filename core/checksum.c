/* core/checksum.c — tensor and whole-model xxh64 hashes; see checksum.h. */
#include "core/checksum.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/error.h"

uint64_t core_xxh64(const void *buf, size_t n, uint64_t seed) {
    static const char empty[1] = {0};
    return (uint64_t)XXH64(n ? buf : empty, n, (XXH64_hash_t)seed);
}

int core_tensor_xxh64(const core_tensor *t, uint64_t *out) {
    if (t->device != CORE_CPU) return core_error("tensor hash: tensor is not in CPU memory");
    if (!core_tensor_is_contiguous(t)) return core_error("tensor hash: tensor is not contiguous");
    *out = core_xxh64(t->data, core_tensor_nbytes(t), 0);
    return 0;
}

typedef struct {
    const char *name;
    uint64_t hash;
} named_hash;

/* strcmp compares as unsigned char, which is the bytewise order the contract names. */
static int by_name(const void *a, const void *b) {
    return strcmp(((const named_hash *)a)->name, ((const named_hash *)b)->name);
}

int core_model_hash(const char *const *names, const uint64_t *hashes, size_t n, uint64_t *out) {
    named_hash *v = malloc((n ? n : 1) * sizeof *v);
    unsigned char *bytes = malloc((n ? n : 1) * 8);
    if (!v || !bytes) {
        free(v);
        free(bytes);
        return core_error("model hash: out of memory for %zu tensors", n);
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (!names[i]) {
            rc = core_error("model hash: tensor %zu has no name", i);
            goto done;
        }
        v[i] = (named_hash){names[i], hashes[i]};
    }
    qsort(v, n, sizeof *v, by_name);
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && !strcmp(v[i].name, v[i - 1].name)) {
            rc = core_error("model hash: tensor \"%s\" is listed twice", v[i].name);
            goto done;
        }
        for (int b = 0; b < 8; b++) bytes[8 * i + b] = (unsigned char)(v[i].hash >> (8 * b));
    }
    *out = core_xxh64(bytes, 8 * n, 0);
done:
    free(v);
    free(bytes);
    return rc;
}
