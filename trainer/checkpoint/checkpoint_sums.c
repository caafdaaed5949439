/* trainer/checkpoint/checkpoint_sums.c — a checkpoint's integrity record: per-file and per-tensor xxh64, the state file's own
 * hash, and the check on load with non-finite values refused (see checkpoint_sums.h). Files are hashed through a
 * read-only mapping: verifying reads the checkpoint once more than the load itself (xxh64 runs at memory speed; the
 * read is what costs). */
#include "trainer/checkpoint/checkpoint_sums.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/safetensors.h"

#define SUMS_PATH_MAX 4096

/* xxh64 (seed 0) of the whole file at path. */
static int hash_file(const char *path, uint64_t *h) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return core_error("%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb)) {
        close(fd);
        return core_error("%s: cannot stat: %s", path, strerror(errno));
    }
    if (sb.st_size == 0) {
        close(fd);
        *h = core_xxh64(NULL, 0, 0);
        return 0;
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return core_error("%s: cannot map: %s", path, strerror(errno));
    madvise(p, (size_t)sb.st_size, MADV_SEQUENTIAL);
    *h = core_xxh64(p, (size_t)sb.st_size, 0);
    munmap(p, (size_t)sb.st_size);
    return 0;
}

static json_t *hex(uint64_t h) {
    char s[17];
    snprintf(s, sizeof s, "%016" PRIx64, h);
    return json_string(s);
}

/* 16 hex digits into *h; -1 when s is not that. */
static int parse_hex(const char *s, uint64_t *h) {
    if (!s || strlen(s) != 16) return -1;
    char *end = NULL;
    *h = strtoull(s, &end, 16);
    return *end ? -1 : 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t l = strlen(s), k = strlen(suffix);
    return l >= k && !strcmp(s + l - k, suffix);
}

/* ---- record ---- */

typedef struct {
    char **v;
    int n, cap;
} names;

static int names_add(names *a, const char *s) {
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 16;
        char **t = realloc(a->v, sizeof(char *) * (size_t)cap);
        if (!t) return core_error("out of memory");
        a->v = t, a->cap = cap;
    }
    if (!(a->v[a->n] = strdup(s))) return core_error("out of memory");
    a->n++;
    return 0;
}

static void names_free(names *a) {
    for (int i = 0; i < a->n; i++) free(a->v[i]);
    free(a->v);
}

/* The regular files under root/rel (rel "" for root itself), as paths relative to root. */
static int walk(const char *root, const char *rel, names *out) {
    char dir[SUMS_PATH_MAX], p[SUMS_PATH_MAX], r[SUMS_PATH_MAX];
    snprintf(dir, sizeof dir, "%s%s%s", root, *rel ? "/" : "", rel);
    DIR *d = opendir(dir);
    if (!d) return core_error("%s: cannot list: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(r, sizeof r, "%s%s%s", rel, *rel ? "/" : "", e->d_name) >= (int)sizeof r ||
            snprintf(p, sizeof p, "%s/%s", root, r) >= (int)sizeof p) {
            rc = core_error("%s/%s: path too long", dir, e->d_name);
            break;
        }
        struct stat sb;
        if (lstat(p, &sb)) rc = core_error("%s: cannot stat: %s", p, strerror(errno));
        else if (S_ISDIR(sb.st_mode)) rc = walk(root, r, out);
        else if (S_ISREG(sb.st_mode)) rc = names_add(out, r);
    }
    closedir(d);
    return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* {"<tensor>": "<xxh64>"} of one safetensors file, in header order. */
static json_t *tensor_sums(const char *path) {
    st_file *f = st_open(path);
    if (!f) return NULL;
    json_t *o = json_object();
    for (int i = 0; o && i < st_count(f); i++) {
        const st_info *t = st_info_at(f, i);
        core_tensor v;
        uint64_t h;
        if (st_get(f, t->name, &v)) {
            json_decref(o), o = NULL;
            break;
        }
        int bad = core_tensor_xxh64(&v, &h);
        core_tensor_free(&v);
        if (bad || json_object_set_new(o, t->name, hex(h))) {
            core_error_push("%s: tensor \"%s\": ", path, t->name);
            json_decref(o), o = NULL;
        }
    }
    st_close(f);
    return o;
}

int trainer_ckpt_sums_record(const char *dir, json_t **files, json_t **tensors) {
    names all = {0};
    char p[SUMS_PATH_MAX];
    *files = json_object(), *tensors = json_object();
    int rc = !*files || !*tensors ? core_error("out of memory") : walk(dir, "", &all);
    if (!rc && all.n) qsort(all.v, (size_t)all.n, sizeof(char *), cmp_str);
    for (int i = 0; i < all.n && !rc; i++) {
        uint64_t h;
        snprintf(p, sizeof p, "%s/%s", dir, all.v[i]);
        if ((rc = hash_file(p, &h))) break;
        if (json_object_set_new(*files, all.v[i], hex(h))) rc = core_error("out of memory");
        if (!rc && ends_with(all.v[i], ".safetensors")) {
            json_t *t = tensor_sums(p);
            rc = !t || json_object_set_new(*tensors, all.v[i], t) ? -1 : 0;
        }
    }
    names_free(&all);
    if (rc) json_decref(*files), json_decref(*tensors), *files = *tensors = NULL;
    return rc;
}

int trainer_ckpt_sums_state_hash(const json_t *o, uint64_t *h) {
    json_t *c = json_copy((json_t *)o);
    if (!c) return core_error("out of memory");
    json_object_del(c, "state_xxh64");
    char *s = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(c);
    if (!s) return core_error("out of memory");
    *h = core_xxh64(s, strlen(s), 0);
    free(s);
    return 0;
}

/* ---- verify ---- */

/* A recorded path: relative, no empty, "." or ".." component. */
static int safe_rel(const char *r) {
    if (!*r || *r == '/') return 0;
    for (const char *c = r; *c;) {
        const char *slash = strchr(c, '/');
        size_t l = slash ? (size_t)(slash - c) : strlen(c);
        if (l == 0 || (l == 1 && c[0] == '.') || (l == 2 && c[0] == '.' && c[1] == '.')) return 0;
        c += l + (slash != NULL);
        if (slash && !*c) return 0;
    }
    return 1;
}

/* Appends ", " + s to buf when fewer than 3 entries are listed yet, else counts it in *more. */
static void list_add(char *buf, size_t cap, int *listed, int *more, const char *s) {
    if (*listed >= 3) {
        (*more)++;
        return;
    }
    size_t l = strlen(buf);
    snprintf(buf + l, cap - l, "%s%s", *listed ? ", " : "", s);
    (*listed)++;
}

/* Which tensors of the .safetensors file at path differ from rec ({"<tensor>": "<xxh64>"}), into what. */
static void describe_tensors(const char *path, const json_t *rec, char *what, size_t cap) {
    core_error_clear();
    st_file *f = st_open(path);
    if (!f) {
        snprintf(what, cap, "its header does not parse: %s", core_last_error());
        return;
    }
    char item[512];
    int listed = 0, more = 0;
    what[0] = 0;
    for (int i = 0; i < st_count(f); i++) {
        const st_info *t = st_info_at(f, i);
        const json_t *r = json_is_object(rec) ? json_object_get(rec, t->name) : NULL;
        uint64_t want, got;
        core_tensor v;
        if (!r) {
            snprintf(item, sizeof item, "unexpected tensor \"%s\"", t->name);
            list_add(what, cap, &listed, &more, item);
            continue;
        }
        if (st_get(f, t->name, &v)) continue;
        const int bad = core_tensor_xxh64(&v, &got) || parse_hex(json_string_value(r), &want) || got != want;
        core_tensor_free(&v);
        if (bad) {
            snprintf(item, sizeof item, "tensor \"%s\" differs", t->name);
            list_add(what, cap, &listed, &more, item);
        }
    }
    const char *k;
    const json_t *v;
    if (json_is_object(rec))
        json_object_foreach((json_t *)rec, k, v) {
            if (st_find(f, k) >= 0) continue;
            snprintf(item, sizeof item, "missing tensor \"%s\"", k);
            list_add(what, cap, &listed, &more, item);
        }
    st_close(f);
    size_t l = strlen(what);
    if (more) snprintf(what + l, cap - l, " and %d more", more);
    if (!listed) snprintf(what, cap, "every tensor matches its record: the header differs");
    core_error_clear();
}

/* The first non-finite element of every F32 tensor of the .safetensors file at path. */
static int check_finite(const char *path) {
    st_file *f = st_open(path);
    if (!f) return -1;
    int rc = 0;
    for (int i = 0; i < st_count(f) && !rc; i++) {
        const st_info *t = st_info_at(f, i);
        if (t->dtype != CORE_F32) continue;
        core_tensor v;
        if ((rc = st_get(f, t->name, &v))) break;
        rc = core_f32_check_finite(v.data, (size_t)((t->end - t->begin) / sizeof(float)), path, t->name);
        core_tensor_free(&v);
    }
    st_close(f);
    return rc;
}

int trainer_ckpt_sums_verify(const char *ckpt, const json_t *files, const json_t *tensors, const char *label) {
    if (!json_is_object(files) || !json_object_size(files))
        return core_error("%s: field \"files\": expected the checksums of the checkpoint's files", label);
    if (!json_is_object(tensors)) return core_error("%s: field \"tensors\": expected an object", label);
    char p[SUMS_PATH_MAX + 256];
    const char *rel;
    const json_t *v;
    json_object_foreach((json_t *)files, rel, v) {
        uint64_t want, got;
        if (!safe_rel(rel) || parse_hex(json_string_value(v), &want))
            return core_error("%s: field \"files\": entry \"%s\" is not a relative path with 16 hex digits", label, rel);
        if (snprintf(p, sizeof p, "%s/%s", ckpt, rel) >= (int)sizeof p) return core_error("%s/%s: path too long", ckpt, rel);
        struct stat sb;
        if (stat(p, &sb) || !S_ISREG(sb.st_mode))
            return core_error("%s: missing file %s (incomplete checkpoint)", ckpt, rel);
        if (hash_file(p, &got)) return -1;
        if (got == want) continue;
        char what[1600] = "";
        if (ends_with(rel, ".safetensors")) describe_tensors(p, json_object_get(tensors, rel), what, sizeof what);
        return core_error("%s: damaged file: xxh64 %016" PRIx64 ", %s records %016" PRIx64 "%s%s", p, got, label, want,
                          what[0] ? ": " : "", what);
    }
    json_object_foreach((json_t *)files, rel, v) {
        if (!ends_with(rel, ".safetensors")) continue;
        snprintf(p, sizeof p, "%s/%s", ckpt, rel);
        if (check_finite(p)) return -1;
    }
    return 0;
}
