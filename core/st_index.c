/* core/st_index.c — a checkpoint folder as one name space: a single *.safetensors file, or a sharded checkpoint
 * (`<base>.safetensors.index.json` + shards), the layout transformers and diffusers write with save_pretrained
 * (reference: transformers `modeling_utils` sharded loading; the index is {"metadata", "weight_map"}).
 * Every shard is opened (mapped) once; a tensor is found by binary search over all names. The index and the shards
 * must agree exactly: every weight_map tensor is in its shard, every shard tensor is listed, none is in two shards. */
#include "core/safetensors.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct {
    const char *name; /* owned by the shard's st_file */
    int file, idx;
} set_entry;

struct st_set {
    char *label;
    int nfiles;
    st_file **files;
    int n;
    set_entry *tab; /* sorted by name */
    int n_meta;
    char **meta_key, **meta_val;
};

void st_set_close(st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->nfiles; i++) st_close(s->files[i]);
    for (int i = 0; i < s->n_meta; i++) {
        free(s->meta_key[i]);
        free(s->meta_val[i]);
    }
    free(s->meta_key);
    free(s->meta_val);
    free(s->files);
    free(s->tab);
    free(s->label);
    free(s);
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const set_entry *)a)->name, ((const set_entry *)b)->name);
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

static st_set *new_set(const char *label, int nfiles_cap) {
    st_set *s = calloc(1, sizeof *s);
    if (!s || !(s->label = strdup(label)) || !(s->files = calloc((size_t)(nfiles_cap ? nfiles_cap : 1), sizeof(st_file *)))) {
        st_set_close(s);
        core_error("%s: out of memory", label);
        return NULL;
    }
    return s;
}

static int add_meta(st_set *s, const char *k, const char *v) {
    char **nk = realloc(s->meta_key, sizeof(char *) * (size_t)(s->n_meta + 1));
    if (nk) s->meta_key = nk;
    char **nv = nk ? realloc(s->meta_val, sizeof(char *) * (size_t)(s->n_meta + 1)) : NULL;
    if (nv) s->meta_val = nv;
    if (!nk || !nv) return core_error("%s: out of memory", s->label);
    s->meta_key[s->n_meta] = strdup(k);
    s->meta_val[s->n_meta] = strdup(v);
    s->n_meta++;
    if (!s->meta_key[s->n_meta - 1] || !s->meta_val[s->n_meta - 1]) return core_error("%s: out of memory", s->label);
    return 0;
}

/* A set over one file: its tensors (already sorted by name) and its __metadata__. */
static st_set *set_from_file(const char *path) {
    st_set *s = new_set(path, 1);
    if (!s) return NULL;
    if (!(s->files[0] = st_open(path))) goto fail;
    s->nfiles = 1;
    const st_file *f = s->files[0];
    s->n = st_count(f);
    if (!(s->tab = calloc((size_t)(s->n ? s->n : 1), sizeof(set_entry)))) {
        core_error("%s: out of memory", path);
        goto fail;
    }
    for (int i = 0; i < s->n; i++) s->tab[i] = (set_entry){st_name(f, i), 0, i};
    for (int i = 0; i < st_metadata_count(f); i++)
        if (add_meta(s, st_metadata_key(f, i), st_metadata(f, st_metadata_key(f, i)))) goto fail;
    return s;
fail:
    st_set_close(s);
    return NULL;
}

/* Shard file names come from the index: refuse anything that could leave the folder. */
static int shard_name_ok(const char *n) {
    return n[0] && !strchr(n, '/') && strcmp(n, ".") && strcmp(n, "..");
}

static int index_metadata(st_set *s, json_t *meta) {
    if (!meta || json_is_null(meta)) return 0;
    if (!json_is_object(meta)) return core_error("%s: \"metadata\" is not a JSON object", s->label);
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
        char buf[64];
        const char *str = NULL;
        if (json_is_string(v)) str = json_string_value(v);
        else if (json_is_integer(v)) snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v)), str = buf;
        else if (json_is_real(v)) snprintf(buf, sizeof buf, "%.17g", json_real_value(v)), str = buf;
        else if (json_is_boolean(v)) str = json_is_true(v) ? "true" : "false";
        if (str && add_meta(s, k, str)) return -1; /* null, objects and arrays are skipped */
    }
    return 0;
}

st_set *st_open_index(const char *index_path) {
    json_error_t err;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        core_error("%s: bad index JSON: %s (line %d column %d)", index_path, err.text, err.line, err.column);
        return NULL;
    }
    st_set *s = NULL;
    char *dir = strdup(index_path), **shard_names = NULL;
    const char *L = index_path;
    json_t *wm = json_object_get(root, "weight_map");
    if (!dir) {
        core_error("%s: out of memory", L);
        goto fail;
    }
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else strcpy(dir, ".");
    if (!json_is_object(root) || !json_is_object(wm)) {
        core_error("%s: index has no \"weight_map\" object", L);
        goto fail;
    }
    size_t nw = json_object_size(wm);
    if (!(s = new_set(L, (int)nw)) || !(shard_names = calloc(nw ? nw : 1, sizeof(char *)))) {
        core_error("%s: out of memory", L);
        goto fail;
    }
    if (index_metadata(s, json_object_get(root, "metadata"))) goto fail;
    if (!(s->tab = calloc(nw ? nw : 1, sizeof(set_entry)))) {
        core_error("%s: out of memory", L);
        goto fail;
    }
    /* Open every shard named in the weight_map once, and check each listed tensor is in its shard. */
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            core_error("%s: weight_map entry \"%s\" is not a shard file name string", L, name);
            goto fail;
        }
        const char *shard = json_string_value(v);
        if (!shard_name_ok(shard)) {
            core_error("%s: weight_map entry \"%s\": shard \"%s\" is not a file name in the index's folder", L, name,
                       shard);
            goto fail;
        }
        int fi = 0;
        while (fi < s->nfiles && strcmp(shard_names[fi], shard)) fi++;
        if (fi == s->nfiles) {
            char *p = join(dir, shard);
            if (!p || !(shard_names[fi] = strdup(shard))) {
                free(p);
                core_error("%s: out of memory", L);
                goto fail;
            }
            s->files[fi] = st_open(p);
            free(p);
            s->nfiles++; /* counted even on failure so the name is freed; st_close(NULL) is a no-op */
            if (!s->files[fi]) {
                core_error_push("%s: shard for tensor \"%s\": ", L, name);
                goto fail;
            }
        }
        int ti = st_find(s->files[fi], name);
        if (ti < 0) {
            core_error("%s: tensor \"%s\" is mapped to shard %s, which does not contain it", L, name, shard);
            goto fail;
        }
        s->tab[s->n++] = (set_entry){st_name(s->files[fi], ti), fi, ti};
    }
    /* Every shard tensor must be listed, and listed with this shard. */
    for (int fi = 0; fi < s->nfiles; fi++)
        for (int ti = 0; ti < st_count(s->files[fi]); ti++) {
            const char *tn = st_name(s->files[fi], ti);
            json_t *m = json_object_get(wm, tn);
            if (!m) {
                core_error("%s: shard %s has tensor \"%s\", which the index does not list", L, shard_names[fi], tn);
                goto fail;
            }
            if (strcmp(json_string_value(m), shard_names[fi])) {
                core_error("%s: tensor \"%s\" is in two shards: %s and %s", L, tn, json_string_value(m),
                           shard_names[fi]);
                goto fail;
            }
        }
    qsort(s->tab, (size_t)s->n, sizeof(set_entry), cmp_entry);
    for (int i = 0; i < s->nfiles; i++) free(shard_names[i]);
    free(shard_names);
    free(dir);
    json_decref(root);
    return s;
fail:
    if (shard_names && s)
        for (int i = 0; i < s->nfiles; i++) free(shard_names[i]);
    free(shard_names);
    free(dir);
    json_decref(root);
    st_set_close(s);
    return NULL;
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

st_set *st_open_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        core_error("%s: cannot open folder", dir);
        return NULL;
    }
    char **idx = NULL, **st = NULL;
    int ni = 0, ns = 0, cap = 0;
    st_set *out = NULL;
    struct dirent *de;
    while ((de = readdir(d))) {
        int is_idx = ends_with(de->d_name, ".safetensors.index.json"), is_st = ends_with(de->d_name, ".safetensors");
        if (!is_idx && !is_st) continue;
        if (ni + ns + 1 > cap) {
            cap = cap ? 2 * cap : 16;
            char **a = realloc(idx, sizeof(char *) * (size_t)cap), **b = a ? realloc(st, sizeof(char *) * (size_t)cap) : NULL;
            if (a) idx = a;
            if (b) st = b;
            if (!a || !b) {
                core_error("%s: out of memory", dir);
                goto done;
            }
        }
        char *nm = strdup(de->d_name);
        if (!nm) {
            core_error("%s: out of memory", dir);
            goto done;
        }
        if (is_idx) idx[ni++] = nm;
        else st[ns++] = nm;
    }
    if (ni) qsort(idx, (size_t)ni, sizeof(char *), cmp_cstr);
    if (ns) qsort(st, (size_t)ns, sizeof(char *), cmp_cstr);
    if (ni > 1) {
        core_error("%s: %d sharded-checkpoint indexes (%s, %s%s); open one with st_open_index", dir, ni, idx[0], idx[1],
                   ni > 2 ? ", ..." : "");
    } else if (ni == 1) {
        char *p = join(dir, idx[0]);
        if (!p) core_error("%s: out of memory", dir);
        else out = st_open_index(p);
        free(p);
    } else if (ns == 1) {
        char *p = join(dir, st[0]);
        if (!p) core_error("%s: out of memory", dir);
        else out = set_from_file(p);
        free(p);
    } else if (ns == 0) {
        core_error("%s: no *.safetensors file and no *.safetensors.index.json in the folder", dir);
    } else {
        core_error("%s: %d *.safetensors files (%s, %s%s) and no *.safetensors.index.json saying how they combine",
                   dir, ns, st[0], st[1], ns > 2 ? ", ..." : "");
    }
done:
    closedir(d);
    for (int i = 0; i < ni; i++) free(idx[i]);
    for (int i = 0; i < ns; i++) free(st[i]);
    free(idx);
    free(st);
    return out;
}

int st_set_count(const st_set *s) { return s->n; }
const char *st_set_name(const st_set *s, int i) { return i >= 0 && i < s->n ? s->tab[i].name : NULL; }
int st_set_shard_count(const st_set *s) { return s->nfiles; }

const st_info *st_set_info_at(const st_set *s, int i) {
    return i >= 0 && i < s->n ? st_info_at(s->files[s->tab[i].file], s->tab[i].idx) : NULL;
}

int st_set_find(const st_set *s, const char *name) {
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(s->tab[mid].name, name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

const st_file *st_set_file_of(const st_set *s, const char *name) {
    int i = st_set_find(s, name);
    return i < 0 ? NULL : s->files[s->tab[i].file];
}

int st_set_get(const st_set *s, const char *name, core_tensor *view) {
    const st_file *f = st_set_file_of(s, name);
    if (!f) return core_error("%s: no tensor \"%s\"", s->label, name);
    return st_get(f, name, view);
}

int st_set_read_f32(const st_set *s, const char *name, float *dst, int64_t expected_numel) {
    const st_file *f = st_set_file_of(s, name);
    if (!f) return core_error("%s: no tensor \"%s\"", s->label, name);
    return st_read_f32(f, name, dst, expected_numel);
}

const char *st_set_metadata(const st_set *s, const char *key) {
    for (int i = 0; i < s->n_meta; i++)
        if (strcmp(s->meta_key[i], key) == 0) return s->meta_val[i];
    return NULL;
}
