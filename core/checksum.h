/* core/checksum.h — xxh64 checksums of tensors and of whole models (docs/design.md section 3).
 *
 * A tensor's hash is xxh64 (seed 0) of its bytes in the dtype sent or stored. The whole-model hash is xxh64
 * (seed 0) of the concatenated per-tensor hashes, each written as 8 little-endian bytes, in bytewise-ascending
 * order of the tensors' full names (prefixed with the model folder: "transformer/blocks.0.attn1.to_q.weight").
 * It does not depend on the order in which tensors are listed, only on names, bytes and dtypes. */
#ifndef CORE_CHECKSUM_H
#define CORE_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

/* XXH64 of n bytes at buf with the given seed (libxxhash; Collet's XXH64 specification). buf may be NULL if n 0. */
uint64_t core_xxh64(const void *buf, size_t n, uint64_t seed);

/* xxh64 (seed 0) of a contiguous CPU tensor's bytes. Returns 0 and sets *out, or -1 (non-contiguous or not on the
 * CPU) with an error naming the problem. */
int core_tensor_xxh64(const core_tensor *t, uint64_t *out);

/* The whole-model hash of n tensors given by their full names and per-tensor hashes (hashes[i] belongs to
 * names[i]; any order). Returns 0 and sets *out, or -1 for a NULL or duplicate name (named in the error) or out
 * of memory. n = 0 gives xxh64 of zero bytes. */
int core_model_hash(const char *const *names, const uint64_t *hashes, size_t n, uint64_t *out);

#endif
