/* core/safetensors.c — the safetensors reader: header validation, mmap, tensor views and F32 reads.
 *
 * The checks follow the reference implementation (huggingface/safetensors, Rust crate, `SafeTensors::read_metadata`
 * and `Metadata::validate`): header length limit, header within the file, JSON object of entries, known dtypes,
 * byte sizes equal to prod(shape) * dtype size, and offsets that tile the data region with no hole, no overlap and
 * nothing after the last tensor. The parser works on a memory buffer (st_parse_buffer) so the fuzzer can drive it;
 * st_open maps the file and hands the mapping to the same parser. The writer is in st_write.c, sharded folders in
 * st_index.c. */
#include "core/safetensors.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <errno.h>

#include "core/error.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

struct st_file {
    char *label;
    const uint8_t *buf; /* whole file */
    size_t len;
    void *map; /* non-NULL when st_open mapped the file */
    const uint8_t *data; /* data region = buf + 8 + header length */
    uint64_t data_len;
    int n;
    st_info *t; /* sorted bytewise by name */
    int n_meta;
    char **meta_key, **meta_val; /* header order */
};

static int cmp_info_name(const void *a, const void *b) {
    return strcmp(((const st_info *)a)->name, ((const st_info *)b)->name);
}

/* Sort key for the tiling check: by begin, then end (so empty tensors come before a tensor at the same begin). */
typedef struct {
    uint64_t begin, end;
    int i;
} span;
static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* "[2, 3]" into buf (for messages). */
static const char *shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

static void free_file(st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free((char *)f->t[i].name);
    free(f->t);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_key[i]);
        free(f->meta_val[i]);
    }
    free(f->meta_key);
    free(f->meta_val);
    if (f->map) munmap(f->map, f->len);
    free(f->label);
    free(f);
}

static int parse_metadata(st_file *f, json_t *m) {
    if (json_is_null(m)) return 0;
    if (!json_is_object(m)) return core_error("%s: \"__metadata__\" is not a JSON object", f->label);
    size_t n = json_object_size(m);
    f->meta_key = calloc(n ? n : 1, sizeof(char *));
    f->meta_val = calloc(n ? n : 1, sizeof(char *));
    if (!f->meta_key || !f->meta_val) return core_error("%s: out of memory", f->label);
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return core_error("%s: \"__metadata__\" value of \"%s\" is not a string (metadata is a string map)",
                              f->label, k);
        f->meta_key[f->n_meta] = strdup(k);
        f->meta_val[f->n_meta] = strdup(json_string_value(v));
        f->n_meta++;
        if (!f->meta_key[f->n_meta - 1] || !f->meta_val[f->n_meta - 1])
            return core_error("%s: out of memory", f->label);
    }
    return 0;
}

/* A JSON integer >= 0 (reals such as 2.0 are refused). Returns 0, -1 not an integer, -2 negative. */
static int json_nonneg(json_t *v, int64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -2;
    *out = (int64_t)x;
    return 0;
}

/* Fills t from one header entry; t->name is already set. */
static int parse_entry(st_file *f, st_info *t, json_t *e) {
    const char *L = f->label, *N = t->name;
    if (!json_is_object(e)) return core_error("%s: tensor \"%s\": header entry is not a JSON object", L, N);
    json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"),
           *off = json_object_get(e, "data_offsets");
    if (!dt) return core_error("%s: tensor \"%s\": missing \"dtype\"", L, N);
    if (!json_is_string(dt)) return core_error("%s: tensor \"%s\": \"dtype\" is not a string", L, N);
    if (core_dtype_from_name(json_string_value(dt), &t->dtype))
        return core_error_push("%s: tensor \"%s\": ", L, N);
    if (!sh) return core_error("%s: tensor \"%s\": missing \"shape\"", L, N);
    if (!json_is_array(sh)) return core_error("%s: tensor \"%s\": \"shape\" is not an array", L, N);
    size_t nd = json_array_size(sh);
    if (nd > CORE_MAX_DIMS)
        return core_error("%s: tensor \"%s\": rank %zu is over the supported %d", L, N, nd, CORE_MAX_DIMS);
    t->ndim = (int)nd;
    /* The product of the non-zero dims times the dtype size must fit in int64, so that numel/nbytes computed
     * by any consumer, in any order, cannot overflow even when a zero dim makes the tensor empty. */
    int64_t nbytes = (int64_t)core_dtype_size(t->dtype);
    int overflow = 0, empty = 0;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(sh, i);
        int r = json_nonneg(d, &t->shape[i]);
        if (r == -1) return core_error("%s: tensor \"%s\": shape[%zu] is not an integer", L, N, i);
        if (r == -2)
            return core_error("%s: tensor \"%s\": shape[%zu] is negative (%lld)", L, N, i,
                              (long long)json_integer_value(d));
        if (t->shape[i] == 0) empty = 1;
        else if (__builtin_mul_overflow(nbytes, t->shape[i], &nbytes)) overflow = 1;
    }
    if (overflow) {
        char s[256];
        return core_error("%s: tensor \"%s\": shape %s is too large (byte size overflows 64 bits)", L, N,
                          shape_str(s, sizeof s, t->ndim, t->shape));
    }
    if (empty) nbytes = 0;
    if (!off) return core_error("%s: tensor \"%s\": missing \"data_offsets\"", L, N);
    int64_t b, en;
    if (!json_is_array(off) || json_array_size(off) != 2 || json_nonneg(json_array_get(off, 0), &b) ||
        json_nonneg(json_array_get(off, 1), &en))
        return core_error("%s: tensor \"%s\": \"data_offsets\" is not an array of two non-negative integers", L, N);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)en;
    if (t->end < t->begin)
        return core_error("%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin", L, N,
                          (unsigned long long)t->begin, (unsigned long long)t->end);
    char s[256];
    if ((uint64_t)nbytes != t->end - t->begin)
        return core_error("%s: tensor \"%s\": byte size mismatch: data_offsets [%llu, %llu] hold %llu bytes but %s "
                          "shape %s needs %lld",
                          L, N, (unsigned long long)t->begin, (unsigned long long)t->end,
                          (unsigned long long)(t->end - t->begin), core_dtype_name(t->dtype),
                          shape_str(s, sizeof s, t->ndim, t->shape), (long long)nbytes);
    if (t->end > f->data_len)
        return core_error("%s: tensor \"%s\": data past end of file: data_offsets [%llu, %llu] but the data region "
                          "has %llu bytes",
                          L, N, (unsigned long long)t->begin, (unsigned long long)t->end,
                          (unsigned long long)f->data_len);
    return 0;
}

/* Offsets sorted by begin must tile [0, data_len) exactly. */
static int check_tiling(st_file *f) {
    span *ix = malloc(sizeof(span) * (size_t)(f->n ? f->n : 1));
    if (!ix) return core_error("%s: out of memory", f->label);
    for (int i = 0; i < f->n; i++) ix[i] = (span){f->t[i].begin, f->t[i].end, i};
    qsort(ix, (size_t)f->n, sizeof(span), cmp_span);
    uint64_t expect = 0;
    const st_info *prev = NULL;
    int rc = 0;
    for (int k = 0; k < f->n && !rc; k++) {
        const st_info *t = &f->t[ix[k].i];
        if (t->begin < expect)
            rc = core_error("%s: overlapping offsets: tensor \"%s\" [%llu, %llu] overlaps tensor \"%s\" [%llu, %llu]",
                            f->label, t->name, (unsigned long long)t->begin, (unsigned long long)t->end, prev->name,
                            (unsigned long long)prev->begin, (unsigned long long)prev->end);
        else if (t->begin > expect)
            rc = core_error("%s: hole in offsets: data bytes [%llu, %llu) before tensor \"%s\" belong to no tensor",
                            f->label, (unsigned long long)expect, (unsigned long long)t->begin, t->name);
        expect = t->end;
        prev = t;
    }
    free(ix);
    if (rc) return rc;
    if (expect != f->data_len)
        return core_error("%s: trailing bytes: the tensors end at data offset %llu but the data region has %llu bytes",
                          f->label, (unsigned long long)expect, (unsigned long long)f->data_len);
    return 0;
}

static st_file *parse(const uint8_t *buf, size_t len, const char *label, void *map) {
    if (!label) label = "(buffer)";
    st_file *f = calloc(1, sizeof *f);
    json_t *root = NULL;
    if (!f) {
        if (map) munmap(map, len);
        core_error("%s: out of memory", label);
        return NULL;
    }
    f->buf = buf;
    f->len = len;
    f->map = map;
    if (!(f->label = strdup(label))) {
        core_error("%s: out of memory", label);
        goto fail;
    }
    if (len < 8) {
        core_error("%s: truncated file: %zu bytes, shorter than the 8-byte header length", f->label, len);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > ST_MAX_HEADER) {
        core_error("%s: header length %llu bytes is over the %llu-byte limit", f->label, (unsigned long long)hlen,
                   (unsigned long long)ST_MAX_HEADER);
        goto fail;
    }
    if (hlen > len - 8) {
        core_error("%s: header length %llu runs past the end of the file (%zu bytes after the 8-byte length)",
                   f->label, (unsigned long long)hlen, len - 8);
        goto fail;
    }
    f->data = buf + 8 + hlen;
    f->data_len = len - 8 - hlen;
    json_error_t err;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        if (json_error_code(&err) == json_error_duplicate_key)
            core_error("%s: duplicate name in header (%s, line %d column %d)", f->label, err.text, err.line,
                       err.column);
        else
            core_error("%s: bad JSON in header: %s (line %d column %d)", f->label, err.text, err.line, err.column);
        goto fail;
    }
    if (!json_is_object(root)) {
        core_error("%s: header is not a JSON object", f->label);
        goto fail;
    }
    size_t cap = json_object_size(root);
    f->t = calloc(cap ? cap : 1, sizeof(st_info));
    if (!f->t) {
        core_error("%s: out of memory", f->label);
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (parse_metadata(f, val)) goto fail;
            continue;
        }
        st_info *t = &f->t[f->n];
        if (!(t->name = strdup(key))) {
            core_error("%s: out of memory", f->label);
            goto fail;
        }
        f->n++;
        if (parse_entry(f, t, val)) goto fail;
    }
    if (check_tiling(f)) goto fail;
    qsort(f->t, (size_t)f->n, sizeof(st_info), cmp_info_name);
    json_decref(root);
    return f;
fail:
    json_decref(root);
    free_file(f);
    return NULL;
}

st_file *st_parse_buffer(const void *buf, size_t len, const char *label) { return parse(buf, len, label, NULL); }

st_file *st_open(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        core_error("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        core_error("%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        core_error("%s: truncated file: %zu bytes, shorter than the 8-byte header length", path, len);
        return NULL;
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) {
        core_error("%s: cannot mmap %zu bytes: %s", path, len, strerror(e));
        return NULL;
    }
    return parse(map, len, path, map);
}

void st_close(st_file *f) { free_file(f); }

const char *st_label(const st_file *f) { return f->label; }
int st_count(const st_file *f) { return f->n; }
const char *st_name(const st_file *f, int i) { return i >= 0 && i < f->n ? f->t[i].name : NULL; }
const st_info *st_info_at(const st_file *f, int i) { return i >= 0 && i < f->n ? &f->t[i] : NULL; }

int st_find(const st_file *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->t[mid].name, name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

int st_get(const st_file *f, const char *name, core_tensor *view) {
    int i = st_find(f, name);
    if (i < 0) return core_error("%s: no tensor \"%s\"", f->label, name);
    const st_info *t = &f->t[i];
    const uint8_t *p = f->data + t->begin;
    size_t es = core_dtype_size(t->dtype), nb = (size_t)(t->end - t->begin);
    if ((uintptr_t)p % es == 0) {
        core_tensor_wrap(view, (void *)p, t->dtype, t->ndim, t->shape);
        return 0;
    }
    /* Misaligned for its dtype: hand out an aligned copy rather than a pointer that is UB to dereference. */
    if (core_tensor_alloc(view, t->dtype, t->ndim, t->shape))
        return core_error_push("%s: tensor \"%s\": copying out misaligned data: ", f->label, name);
    memcpy(view->data, p, nb);
    return 0;
}

void st_drop_pages(const st_file *f, const char *name) {
    const int i = f && f->map ? st_find(f, name) : -1;
    const long pg = sysconf(_SC_PAGESIZE);
    if (i < 0 || pg <= 0) return;
    const uintptr_t mask = (uintptr_t)pg - 1, m0 = (uintptr_t)f->map, m1 = m0 + ((f->len + mask) & ~mask);
    uintptr_t lo = (uintptr_t)(f->data + f->t[i].begin) & ~mask;
    uintptr_t hi = ((uintptr_t)(f->data + f->t[i].end) + mask) & ~mask;
    if (lo < m0) lo = m0;
    if (hi > m1) hi = m1;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice only: a failure leaves the pages resident */
}

int st_read_f32(const st_file *f, const char *name, float *dst, int64_t expected_numel) {
    int i = st_find(f, name);
    if (i < 0) return core_error("%s: no tensor \"%s\"", f->label, name);
    const st_info *t = &f->t[i];
    char s[256];
    if (t->dtype != CORE_F32 && t->dtype != CORE_BF16 && t->dtype != CORE_F16)
        return core_error("%s: tensor \"%s\": dtype %s cannot be read as F32 (F32, BF16 or F16 expected)", f->label,
                          name, core_dtype_name(t->dtype));
    size_t es = core_dtype_size(t->dtype), n = (size_t)(t->end - t->begin) / es;
    if ((int64_t)n != expected_numel)
        return core_error("%s: tensor \"%s\": has %zu elements (shape %s), expected %lld", f->label, name, n,
                          shape_str(s, sizeof s, t->ndim, t->shape), (long long)expected_numel);
    const uint8_t *p = f->data + t->begin;
    const int aligned = t->dtype == CORE_F32 || (uintptr_t)p % es == 0;
    /* Weights enter here: a NaN or inf is refused, named. Converted and checked a chunk at a time, so the check reads
     * values still in cache (it costs a few percent of the conversion instead of another pass over memory). */
    enum { CHUNK = 1 << 15 };
    for (size_t k = 0; k < n; k += CHUNK) {
        const size_t len = n - k < CHUNK ? n - k : CHUNK;
        if (aligned) {
            if (core_convert_to_f32(dst + k, p + k * es, t->dtype, len)) return -1;
        } else {
            for (size_t i = k; i < k + len; i++) { /* misaligned half-precision source: read each element bytewise */
                uint16_t h;
                memcpy(&h, p + 2 * i, 2);
                dst[i] = t->dtype == CORE_BF16 ? core_bf16_to_f32(h) : core_f16_to_f32(h);
            }
        }
        if (core_f32_first_nonfinite(dst + k, len) >= 0) /* the earlier chunks are finite: this finds the same one */
            return core_f32_check_finite(dst, n, f->label, name);
    }
    return 0;
}

const char *st_metadata(const st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_key[i], key) == 0) return f->meta_val[i];
    return NULL;
}

int st_metadata_count(const st_file *f) { return f->n_meta; }
const char *st_metadata_key(const st_file *f, int i) { return i >= 0 && i < f->n_meta ? f->meta_key[i] : NULL; }
