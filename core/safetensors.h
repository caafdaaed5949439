/* core/safetensors.h — reading and writing safetensors files, single and sharded.
 *
 * Format (reference: huggingface/safetensors, the Rust crate's format description and its checks):
 *   u64 little-endian N | N bytes of UTF-8 JSON header | data region.
 * The header maps tensor name -> {"dtype", "shape", "data_offsets": [begin, end]}, offsets in bytes relative to
 * the data region, plus an optional "__metadata__" string -> string map. The reader insists on what the reference
 * insists on: N <= 100,000,000; offsets, sorted by begin, tile the data region exactly (first at 0, each begins
 * where the previous ended, the last ends at the end of the file); end - begin = prod(shape) * dtype size; no
 * duplicate names. Dtypes: F32, BF16, F16, I64, U8 (core_dtype); any other dtype is rejected by name. Fields of a
 * tensor entry other than the three above are ignored (as the reference does). Shape [] is a scalar (one element);
 * a zero in the shape is a legal empty tensor.
 *
 * Every failure returns NULL / -1 with core_error() naming the file, the tensor (where there is one) and the fault.
 *
 * Sharded checkpoints (transformers / diffusers layout): `<base>.safetensors.index.json` holds
 * {"metadata": {...}, "weight_map": {tensor name: shard file name}}; the shards sit beside it. st_set opens a
 * folder holding either one `*.safetensors` file or an index and its shards. */
#ifndef CORE_SAFETENSORS_H
#define CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

/* The largest header the reader accepts, in bytes (the reference's limit). */
#define ST_MAX_HEADER ((uint64_t)100000000)

/* ---------------------------------------------------------------------------------------------------------------
 * Reading one file */

typedef struct st_file st_file;

/* What the header says about one tensor. begin/end are byte offsets into the data region. */
typedef struct {
    const char *name;
    core_dtype dtype;
    int ndim;
    int64_t shape[CORE_MAX_DIMS];
    uint64_t begin, end;
} st_info;

/* Maps `path` read-only and validates its header. Returns the file, or NULL with core_error naming the path and
 * the fault (truncated file, header length past end of file, header over ST_MAX_HEADER, bad JSON, wrong field
 * types, unknown dtype, rank over CORE_MAX_DIMS, negative or non-integer shape, byte size mismatch, overlap, hole,
 * data past end of file, trailing bytes, duplicate name, non-string metadata). */
st_file *st_open(const char *path);

/* Validates the safetensors bytes buf[0..len) exactly as st_open does; `label` (e.g. a file name) starts every
 * error message. The buffer is borrowed: it must outlive the returned st_file and not change. NULL on error. */
st_file *st_parse_buffer(const void *buf, size_t len, const char *label);

/* Unmaps/frees. Views returned by st_get that borrow the mapping become invalid. NULL is allowed. */
void st_close(st_file *f);

/* The label (path) the file was opened with. */
const char *st_label(const st_file *f);

/* Number of tensors; tensors are indexed 0..count-1 in bytewise-ascending name order. */
int st_count(const st_file *f);
/* Name of tensor i (0 <= i < st_count), or NULL when out of range. */
const char *st_name(const st_file *f, int i);
/* Header entry of tensor i, or NULL when out of range. */
const st_info *st_info_at(const st_file *f, int i);
/* Index of the tensor called `name`, or -1 (no error is recorded). Binary search: O(log count). */
int st_find(const st_file *f, const char *name);

/* Fills `view` with tensor `name` (contiguous, CPU). Normally the view borrows the read-only mapping
 * (view->owned == 0; never write through it; valid until st_close). When the tensor's bytes are not aligned to
 * its dtype size in memory (a file laid out by another writer), they are copied to an owned aligned buffer
 * (view->owned == 1), so every consumer may dereference typed pointers. Release with core_tensor_free either way.
 * Returns 0, or -1 when the tensor is missing (error names file and tensor) or memory runs out. */
int st_get(const st_file *f, const char *name, core_tensor *view);

/* Converts tensor `name` (F32, BF16 or F16) to F32 into dst[0..expected_numel). Returns 0, or -1 naming file and
 * tensor when it is missing, has another dtype, or its element count differs from expected_numel, or when a value
 * is NaN or infinite (core_f32_check_finite: the element's index and value; dst then holds the values read). Every
 * weight the program reads (transformer, LoRA adapter, checkpoint, VAE, text encoder) comes through here, so none
 * enters non-finite; the check is one pass over dst, cheap beside the conversion and the file read. */
int st_read_f32(const st_file *f, const char *name, float *dst, int64_t expected_numel);

/* Drops the resident pages of tensor `name`'s bytes in the mapping (madvise MADV_DONTNEED on the pages it spans,
 * page-aligned outwards): for a loader that converts tensor by tensor, so the file's pages and the converted copy
 * are not all resident at once. Nothing is invalidated: the mapping is private and read-only, and a later read
 * (st_get's views included) faults the same bytes back in from the file. No effect on a file from st_parse_buffer or
 * an unknown name. */
void st_drop_pages(const st_file *f, const char *name);
/* Value of "__metadata__" key `key`, or NULL when absent. */
const char *st_metadata(const st_file *f, const char *key);
/* Number of metadata entries and the key of entry i (header order), NULL when out of range. */
int st_metadata_count(const st_file *f);
const char *st_metadata_key(const st_file *f, int i);

/* ---------------------------------------------------------------------------------------------------------------
 * Writing */

typedef struct st_writer st_writer;

/* An empty writer. NULL only when out of memory (error recorded). */
st_writer *st_writer_new(void);
void st_writer_free(st_writer *w);

/* Adds a tensor: name (unique, not "__metadata__", valid UTF-8), dtype, shape (ndim 0..CORE_MAX_DIMS, dims >= 0)
 * and prod(shape) * dtype size bytes at `data`, little-endian, row-major. The data is borrowed: it must stay
 * valid and unchanged until the last write call. Returns 0, or -1 naming the tensor (duplicate, bad shape, ...). */
int st_writer_add(st_writer *w, const char *name, core_dtype dt, int ndim, const int64_t *shape, const void *data);
/* Same for a contiguous CPU core_tensor (borrowed). */
int st_writer_add_tensor(st_writer *w, const char *name, const core_tensor *t);
/* Sets "__metadata__" key -> value (UTF-8 strings; setting a key again replaces its value in place).
 * Returns 0, or -1 on invalid UTF-8. */
int st_writer_set_metadata(st_writer *w, const char *key, const char *value);

/* Writes every tensor to `path`. Layout, chosen to match the Python package byte for byte: header keys are
 * "__metadata__" (when set, keys in insertion order) then the tensors; tensors are laid out by dtype size
 * class descending (I64, F32, BF16, F16, U8 — the reference's dtype order) and then bytewise by name, so every
 * tensor is aligned to its dtype size; the compact JSON header is padded with spaces to a multiple of 8 bytes.
 * The file is written to `<path>.tmp`, flushed to disk and renamed, so `path` is never left half-written; on
 * failure the temporary is removed. Returns 0, or -1 naming the path and the OS error. */
int st_writer_write(const st_writer *w, const char *path);

/* Writes the tensors as a sharded checkpoint in folder `dir` (which must exist). Tensors are assigned to shards
 * in the order added, starting a new shard when the next tensor would take the current one past max_shard_bytes
 * of tensor data (a tensor larger than the limit gets a shard of its own). One shard: `<base>.safetensors` and no
 * index (as transformers/diffusers do). Several: `<base>-00001-of-0000K.safetensors` ... and
 * `<base>.safetensors.index.json` = {"metadata": {"total_size": <sum of tensor bytes>}, "weight_map": {...}},
 * written last. Every shard carries the writer's metadata. Each file is written as st_writer_write does; a failure
 * midway can leave complete shards without an index (callers write checkpoints under a temporary folder name).
 * Returns 0, or -1 naming the file that failed. */
int st_writer_write_sharded(const st_writer *w, const char *dir, const char *base, uint64_t max_shard_bytes);

/* ---------------------------------------------------------------------------------------------------------------
 * A folder of shards (or a single file) */

typedef struct st_set st_set;

/* Opens the checkpoint in folder `dir`: when it holds exactly one `*.safetensors.index.json`, that index and every
 * shard it names (each opened once); else the one `*.safetensors` file there. Errors (naming the folder/index,
 * shard and tensor): no checkpoint or several candidates, bad index JSON, weight_map not a name -> file-name map,
 * a shard name with a '/' or "..", a missing or bad shard, a weight_map tensor its shard lacks, a shard tensor
 * the index does not list, a tensor found in two shards. */
st_set *st_open_dir(const char *dir);
/* Opens an index file directly (shards are looked up beside it). Errors as st_open_dir. */
st_set *st_open_index(const char *index_path);
void st_set_close(st_set *s);

/* Number of tensors over all shards; indexed 0..count-1 in bytewise-ascending name order. */
int st_set_count(const st_set *s);
const char *st_set_name(const st_set *s, int i);
/* Header entry of tensor i, or NULL when out of range. */
const st_info *st_set_info_at(const st_set *s, int i);
/* Index of `name` or -1 (no error recorded). */
int st_set_find(const st_set *s, const char *name);
/* The shard holding tensor `name`, or NULL (no error recorded). */
const st_file *st_set_file_of(const st_set *s, const char *name);
/* As st_get / st_read_f32, across shards. Errors name the folder (the shard, for a non-finite value) and tensor. */
int st_set_get(const st_set *s, const char *name, core_tensor *view);
int st_set_read_f32(const st_set *s, const char *name, float *dst, int64_t expected_numel);
/* Number of shard files (1 for a single file). */
int st_set_shard_count(const st_set *s);
/* Index "metadata" value for key (strings as is; numbers and booleans in decimal/JSON form; nested values are
 * skipped), or, for a single file, its "__metadata__" value. NULL when absent. */
const char *st_set_metadata(const st_set *s, const char *key);

#endif
