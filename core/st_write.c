/* core/st_write.c — the safetensors writer: single files and sharded checkpoints (see safetensors.h).
 *
 * Layout follows the reference writer (huggingface/safetensors, Rust `prepare`/`serialize`): tensors sorted by
 * dtype descending in the reference's dtype order (I64 > F32 > BF16 > F16 > U8; widest alignment first) and then
 * by name, "__metadata__" first in the header, compact JSON padded with spaces to a multiple of 8 bytes. For the
 * same tensors and metadata the output is byte-identical to the Python package's (tests check this). Files are
 * written under `<path>.tmp`, fsync'd and renamed into place. */
#include "core/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

typedef struct {
    char *name;
    core_dtype dtype;
    int ndim;
    int64_t shape[CORE_MAX_DIMS];
    const void *data;
    uint64_t nbytes;
} wentry;

struct st_writer {
    wentry *e;
    int n, cap;
    char **meta_key, **meta_val;
    int n_meta, cap_meta;
};

st_writer *st_writer_new(void) {
    st_writer *w = calloc(1, sizeof *w);
    if (!w) core_error("st_writer: out of memory");
    return w;
}

void st_writer_free(st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->e[i].name);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_key[i]);
        free(w->meta_val[i]);
    }
    free(w->e);
    free(w->meta_key);
    free(w->meta_val);
    free(w);
}

/* 1 when s is valid UTF-8 (jansson's own check, via a throw-away string). */
static int utf8_ok(const char *s) {
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

int st_writer_add(st_writer *w, const char *name, core_dtype dt, int ndim, const int64_t *shape, const void *data) {
    if ((unsigned)dt >= CORE_DTYPE_COUNT) return core_error("st_writer: tensor \"%s\": invalid dtype %d", name, dt);
    if (strcmp(name, "__metadata__") == 0) return core_error("st_writer: \"__metadata__\" is not a tensor name");
    if (!utf8_ok(name)) return core_error("st_writer: tensor name \"%s\" is not valid UTF-8", name);
    if (ndim < 0 || ndim > CORE_MAX_DIMS)
        return core_error("st_writer: tensor \"%s\": rank %d outside 0..%d", name, ndim, CORE_MAX_DIMS);
    int64_t nb = (int64_t)core_dtype_size(dt);
    int empty = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return core_error("st_writer: tensor \"%s\": shape[%d] is negative", name, i);
        if (shape[i] == 0) empty = 1;
        else if (__builtin_mul_overflow(nb, shape[i], &nb))
            return core_error("st_writer: tensor \"%s\": shape too large", name);
    }
    if (empty) nb = 0;
    if (nb > 0 && !data) return core_error("st_writer: tensor \"%s\": data is NULL", name);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0) return core_error("st_writer: duplicate tensor name \"%s\"", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        wentry *ne = realloc(w->e, sizeof(wentry) * (size_t)cap);
        if (!ne) return core_error("st_writer: out of memory");
        w->e = ne;
        w->cap = cap;
    }
    wentry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return core_error("st_writer: out of memory");
    e->dtype = dt;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->data = data;
    e->nbytes = (uint64_t)nb;
    w->n++;
    return 0;
}

int st_writer_add_tensor(st_writer *w, const char *name, const core_tensor *t) {
    if (t->device != CORE_CPU) return core_error("st_writer: tensor \"%s\" is not in CPU memory", name);
    if (!core_tensor_is_contiguous(t)) return core_error("st_writer: tensor \"%s\" is not contiguous", name);
    return st_writer_add(w, name, t->dtype, t->ndim, t->shape, t->data);
}

int st_writer_set_metadata(st_writer *w, const char *key, const char *value) {
    if (!utf8_ok(key) || !utf8_ok(value))
        return core_error("st_writer: metadata \"%s\" is not valid UTF-8", key);
    char *v = strdup(value);
    if (!v) return core_error("st_writer: out of memory");
    for (int i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta_key[i], key) == 0) {
            free(w->meta_val[i]);
            w->meta_val[i] = v;
            return 0;
        }
    if (w->n_meta == w->cap_meta) {
        int cap = w->cap_meta ? 2 * w->cap_meta : 8;
        char **nk = realloc(w->meta_key, sizeof(char *) * (size_t)cap);
        if (nk) w->meta_key = nk;
        char **nv = nk ? realloc(w->meta_val, sizeof(char *) * (size_t)cap) : NULL;
        if (nv) w->meta_val = nv;
        if (!nk || !nv) {
            free(v);
            return core_error("st_writer: out of memory");
        }
        w->cap_meta = cap;
    }
    if (!(w->meta_key[w->n_meta] = strdup(key))) {
        free(v);
        return core_error("st_writer: out of memory");
    }
    w->meta_val[w->n_meta++] = v;
    return 0;
}

/* Position of a dtype in the reference's dtype order (the sort puts higher ranks first). */
static int dtype_rank(core_dtype dt) {
    switch (dt) {
    case CORE_I64: return 4;
    case CORE_F32: return 3;
    case CORE_BF16: return 2;
    case CORE_F16: return 1;
    default: return 0; /* U8 */
    }
}

static int cmp_layout(const void *a, const void *b) {
    const wentry *x = *(const wentry *const *)a, *y = *(const wentry *const *)b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry) return ry - rx;
    return strcmp(x->name, y->name);
}

/* Writes chunks[0..nchunks) (sizes[i] bytes each) to `<path>.tmp`, fsyncs it and renames it to path; on any
 * failure the temporary is removed and path is untouched. */
static int write_atomic(const char *path, const void *const *chunks, const uint64_t *sizes, int nchunks) {
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp) return core_error("%s: out of memory", path);
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    unlink(tmp); /* a leftover of a write cut short: the temporary is always new (O_EXCL, never through a link) */
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    FILE *fp = fd < 0 ? NULL : fdopen(fd, "wb");
    if (!fp) {
        if (fd >= 0) close(fd);
        core_error("%s: cannot create %s: %s", path, tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < nchunks && !rc; i++)
        if (sizes[i] && fwrite(chunks[i], 1, (size_t)sizes[i], fp) != (size_t)sizes[i])
            rc = core_error("%s: write failed: %s", tmp, strerror(errno));
    if (!rc && fflush(fp) != 0) rc = core_error("%s: write failed: %s", tmp, strerror(errno));
    if (!rc && fsync(fileno(fp)) != 0) rc = core_error("%s: fsync failed: %s", tmp, strerror(errno));
    if (fclose(fp) != 0 && !rc) rc = core_error("%s: close failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0) rc = core_error("%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    if (rc) unlink(tmp);
    free(tmp);
    return rc;
}

/* Writes entries ents[0..k) (any order; laid out here) with the writer's metadata to path. */
static int write_entries(const st_writer *w, wentry **ents, int k, const char *path) {
    qsort(ents, (size_t)k, sizeof(wentry *), cmp_layout);
    json_t *root = json_object();
    char *hdr = NULL;
    const void **chunks = NULL;
    uint64_t *sizes = NULL;
    int rc = -1;
    if (!root) goto oom;
    if (w->n_meta) {
        json_t *m = json_object();
        if (!m || json_object_set_new(root, "__metadata__", m)) goto oom;
        for (int i = 0; i < w->n_meta; i++)
            if (json_object_set_new(m, w->meta_key[i], json_string(w->meta_val[i]))) goto oom;
    }
    uint64_t off = 0;
    for (int i = 0; i < k; i++) {
        json_t *e = json_object(), *sh = json_array(), *of = json_array();
        if (!e || !sh || !of) {
            json_decref(e);
            json_decref(sh);
            json_decref(of);
            goto oom;
        }
        if (json_object_set_new(root, ents[i]->name, e)) {
            json_decref(sh);
            json_decref(of);
            goto oom;
        }
        json_object_set_new(e, "dtype", json_string(core_dtype_name(ents[i]->dtype)));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", of);
        for (int d = 0; d < ents[i]->ndim; d++) json_array_append_new(sh, json_integer(ents[i]->shape[d]));
        json_array_append_new(of, json_integer((json_int_t)off));
        json_array_append_new(of, json_integer((json_int_t)(off + ents[i]->nbytes)));
        off += ents[i]->nbytes;
    }
    hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!hdr) goto oom;
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    char *h2 = realloc(hdr, padded + 8);
    if (!h2) goto oom;
    hdr = h2;
    memmove(hdr + 8, hdr, hl);
    memset(hdr + 8 + hl, ' ', padded - hl);
    for (int b = 0; b < 8; b++) hdr[b] = (char)(((uint64_t)padded >> (8 * b)) & 0xff);
    chunks = malloc(sizeof(void *) * (size_t)(k + 1));
    sizes = malloc(sizeof(uint64_t) * (size_t)(k + 1));
    if (!chunks || !sizes) goto oom;
    chunks[0] = hdr;
    sizes[0] = padded + 8;
    for (int i = 0; i < k; i++) {
        chunks[i + 1] = ents[i]->data;
        sizes[i + 1] = ents[i]->nbytes;
    }
    rc = write_atomic(path, chunks, sizes, k + 1);
    goto done;
oom:
    core_error("%s: out of memory building the header", path);
done:
    json_decref(root);
    free(hdr);
    free(chunks);
    free(sizes);
    return rc;
}

int st_writer_write(const st_writer *w, const char *path) {
    wentry **ents = malloc(sizeof(wentry *) * (size_t)(w->n ? w->n : 1));
    if (!ents) return core_error("%s: out of memory", path);
    for (int i = 0; i < w->n; i++) ents[i] = &w->e[i];
    int rc = write_entries(w, ents, w->n, path);
    free(ents);
    return rc;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp((*(const wentry *const *)a)->name, (*(const wentry *const *)b)->name);
}

int st_writer_write_sharded(const st_writer *w, const char *dir, const char *base, uint64_t max_shard_bytes) {
    int n = w->n, nshards = 0, rc = -1;
    int *shard_of = calloc((size_t)(n ? n : 1), sizeof(int));
    wentry **ents = malloc(sizeof(wentry *) * (size_t)(n ? n : 1));
    char path[4096], **files = NULL;
    json_t *idx = NULL;
    char *txt = NULL;
    if (!shard_of || !ents) {
        core_error("%s: out of memory", dir);
        goto done;
    }
    uint64_t cur = 0, total = 0;
    for (int i = 0; i < n; i++) { /* greedy, in the order added */
        if (nshards == 0 || (cur > 0 && cur + w->e[i].nbytes > max_shard_bytes)) {
            nshards++;
            cur = 0;
        }
        shard_of[i] = nshards - 1;
        cur += w->e[i].nbytes;
        total += w->e[i].nbytes;
    }
    if (strlen(dir) + strlen(base) + 64 > sizeof path) {
        core_error("%s: folder name too long", dir);
        goto done;
    }
    if (nshards <= 1) {
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, base);
        rc = st_writer_write(w, path);
        goto done;
    }
    files = calloc((size_t)nshards, sizeof(char *));
    if (!files) {
        core_error("%s: out of memory", dir);
        goto done;
    }
    for (int s = 0; s < nshards; s++) {
        char fname[4096];
        snprintf(fname, sizeof fname, "%s-%05d-of-%05d.safetensors", base, s + 1, nshards);
        if (!(files[s] = strdup(fname))) {
            core_error("%s: out of memory", dir);
            goto done;
        }
        int k = 0;
        for (int i = 0; i < n; i++)
            if (shard_of[i] == s) ents[k++] = &w->e[i];
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        if (write_entries(w, ents, k, path)) goto done;
    }
    /* The index: weight_map sorted by name, as transformers writes it. */
    idx = json_object();
    json_t *meta = json_object(), *wm = json_object();
    if (!idx || !meta || !wm) {
        json_decref(meta);
        json_decref(wm);
        core_error("%s: out of memory", dir);
        goto done;
    }
    json_object_set_new(idx, "metadata", meta);
    json_object_set_new(idx, "weight_map", wm);
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    for (int i = 0; i < n; i++) ents[i] = &w->e[i];
    qsort(ents, (size_t)n, sizeof(wentry *), cmp_str_ptr);
    for (int i = 0; i < n; i++)
        json_object_set_new(wm, ents[i]->name, json_string(files[shard_of[ents[i] - w->e]]));
    txt = json_dumps(idx, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!txt) {
        core_error("%s: out of memory", dir);
        goto done;
    }
    size_t tl = strlen(txt);
    txt[tl] = '\n'; /* json_dumps leaves room for the NUL; replace it with a final newline */
    snprintf(path, sizeof path, "%s/%s.safetensors.index.json", dir, base);
    const void *chunk = txt;
    uint64_t size = tl + 1;
    rc = write_atomic(path, &chunk, &size, 1);
done:
    if (files)
        for (int s = 0; s < nshards; s++) free(files[s]);
    free(files);
    free(shard_of);
    free(ents);
    json_decref(idx);
    free(txt);
    return rc;
}
