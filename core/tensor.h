/* core/tensor.h — a typed, shaped view of memory.
 *
 * A tensor is a dtype, up to CORE_MAX_DIMS dims with strides (in elements, row-major when contiguous), a device
 * tag and a data pointer that it either owns (freed by core_tensor_free) or borrows (e.g. from an mmap'd
 * safetensors file). Dtype names are those of safetensors (F32, BF16, F16, I64, U8). */
#ifndef CORE_TENSOR_H
#define CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define CORE_MAX_DIMS 8

typedef enum { CORE_F32 = 0, CORE_BF16, CORE_F16, CORE_I64, CORE_U8, CORE_DTYPE_COUNT } core_dtype;
typedef enum { CORE_CPU = 0, CORE_CUDA = 1 } core_device;

typedef struct {
    core_dtype dtype;
    int ndim;
    int64_t shape[CORE_MAX_DIMS];
    int64_t strides[CORE_MAX_DIMS]; /* in elements */
    core_device device;
    void *data;
    int owned; /* 1: core_tensor_free releases data */
} core_tensor;

/* Bytes per element of a dtype (F32 4, BF16 2, F16 2, I64 8, U8 1). */
size_t core_dtype_size(core_dtype dt);
/* "F32", "BF16", ... */
const char *core_dtype_name(core_dtype dt);
/* Parses a safetensors dtype name; returns 0 and sets *out, or -1 with an error naming the string. */
int core_dtype_from_name(const char *name, core_dtype *out);

/* Element count (1 for ndim 0) and byte size of a tensor's shape. */
int64_t core_tensor_numel(const core_tensor *t);
size_t core_tensor_nbytes(const core_tensor *t);
/* 1 if strides are the row-major strides of the shape. */
int core_tensor_is_contiguous(const core_tensor *t);

/* Allocates an owned, zeroed, contiguous CPU tensor. Returns 0, or -1 (bad shape, out of memory). */
int core_tensor_alloc(core_tensor *t, core_dtype dt, int ndim, const int64_t *shape);
/* Describes borrowed contiguous memory; nothing is copied or freed. */
void core_tensor_wrap(core_tensor *t, void *data, core_dtype dt, int ndim, const int64_t *shape);
/* Frees owned data and zeroes the struct (safe on a zeroed or borrowed tensor). */
void core_tensor_free(core_tensor *t);

/* Scalar conversions (round-to-nearest-even for f32 -> bf16/f16; NaN stays NaN). */
float core_bf16_to_f32(uint16_t h);
uint16_t core_f32_to_bf16(float f);
float core_f16_to_f32(uint16_t h);
uint16_t core_f32_to_f16(float f);

/* Converts n elements of src (dtype dt: F32, BF16 or F16) to F32 in dst. Returns 0, or -1 for another dtype. */
int core_convert_to_f32(float *dst, const void *src, core_dtype dt, size_t n);

/* The index of the first NaN or infinite value of x[0, n), or -1 when every value is finite. */
int64_t core_f32_first_nonfinite(const float *x, size_t n);

/* Weights and states that enter or leave the program must be finite: 0 when x[0, n) is, else -1 with
 * core_error "<label>: tensor \"<tensor>\" holds a non-finite value (nan|inf|-inf at element i of n): refused"
 * (label: the file or message; the first non-finite element, core_f32_first_nonfinite). One read of the values:
 * about 0.15 s per GB from memory on one core here, much less on values still in cache (st_read_f32 checks each
 * chunk it converts). */
int core_f32_check_finite(const float *x, size_t n, const char *label, const char *tensor);

#endif
