/* core/prompts.c — prompt files (text, VBench-style JSON, JSON lines with images) with file:line errors; see
 * core/prompts.h. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/prompts.h"

int core_utf8_check(const char *s, size_t n, size_t *bad) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        const unsigned c = u[i];
        if (c < 0x80) {
            if ((c < 0x20 && c != '\t') || c == 0x7f) goto fail;
            i++;
            continue;
        }
        int k;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf) k = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef) k = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4) k = 3, cp = c & 0x07;
        else goto fail;
        for (int j = 1; j <= k; j++) {
            if (i + (size_t)j >= n || (u[i + j] & 0xc0) != 0x80) goto fail; /* truncated or not a continuation */
            cp = (cp << 6) | (u[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            goto fail;
        i += (size_t)k + 1;
    }
    return 0;
fail:
    if (bad) *bad = i;
    return -1;
}

char *core_quote_bytes(const char *s, size_t n, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        char t[8];
        int k = c >= 0x20 && c < 0x7f ? (t[0] = (char)c, 1) : snprintf(t, sizeof t, "\\x%02x", c);
        if (o + (size_t)k + 4 > cap) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(buf + o, t, (size_t)k);
        o += (size_t)k;
    }
    buf[o] = 0;
    return buf;
}

void core_prompts_free(core_prompts *p) {
    for (int i = 0; i < p->n; i++) {
        free(p->text[i]);
        if (p->meta) json_decref(p->meta[i]);
        if (p->image) free(p->image[i]);
    }
    free(p->text), free(p->line), free(p->meta), free(p->image);
    memset(p, 0, sizeof *p);
}

/* Appends one prompt (copied) with its line, metadata (reference taken) and image path (taken; may be NULL). */
static int add_image(core_prompts *p, int *cap, const char *s, int line, json_t *meta, char *image) {
    if (p->n == *cap) {
        const int c = *cap ? 2 * *cap : 16;
        char **t = realloc(p->text, sizeof(char *) * (size_t)c);
        if (t) p->text = t;
        int *l = realloc(p->line, sizeof(int) * (size_t)c);
        if (l) p->line = l;
        json_t **m = realloc(p->meta, sizeof(json_t *) * (size_t)c);
        if (m) p->meta = m;
        char **im = realloc(p->image, sizeof(char *) * (size_t)c);
        if (im) p->image = im;
        if (!t || !l || !m || !im)
            return json_decref(meta), free(image), core_error("%s: out of memory reading prompts", p->path);
        *cap = c;
    }
    if (!(p->text[p->n] = strdup(s)))
        return json_decref(meta), free(image), core_error("%s: out of memory reading prompts", p->path);
    p->line[p->n] = line;
    p->meta[p->n] = meta;
    p->image[p->n] = image;
    p->n_images += image != NULL;
    p->n++;
    return 0;
}

static int add(core_prompts *p, int *cap, const char *s, int line, json_t *meta) {
    return add_image(p, cap, s, line, meta, NULL);
}

/* The path of an image named in the prompt file: as written when absolute, else relative to the file's folder. */
static char *image_path(const core_prompts *p, const char *name) {
    const char *slash = strrchr(p->path, '/');
    const int dir = name[0] != '/' && slash ? (int)(slash - p->path + 1) : 0;
    char *out = malloc((size_t)dir + strlen(name) + 1);
    if (out) memcpy(out, p->path, (size_t)dir), strcpy(out + dir, name);
    return out;
}

int core_prompts_check_image(const char *path, const char *where) {
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    unsigned char b[8];
    struct stat st;
    FILE *f = fopen(path, "rb");
    if (!f) return core_error("%s: image %s: cannot open: %s", where, path, strerror(errno));
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        fclose(f);
        return core_error("%s: image %s: not a regular file", where, path);
    }
    const size_t got = fread(b, 1, sizeof b, f);
    const int err = ferror(f);
    fclose(f);
    if (err) return core_error("%s: image %s: cannot read", where, path);
    if (got < sizeof b || memcmp(b, sig, sizeof sig))
        return core_error("%s: image %s: not a PNG file (images are read as PNG only)", where, path);
    return 0;
}

/* 1 if s holds only spaces and tabs (the other white space is refused as control characters). */
static int blank(const char *s) {
    return s[strspn(s, " \t")] == '\0';
}

/* "a number", "a list", ...: what a JSON value is, for messages. */
static const char *json_kind(const json_t *v) {
    return json_is_integer(v) || json_is_real(v) ? "a number"
           : json_is_boolean(v)                 ? "true or false"
           : json_is_null(v)                    ? "null"
           : json_is_array(v)                   ? "a list"
                                                : "an object";
}

/* One JSON-lines entry (s: the trimmed line, valid UTF-8): {"prompt": "...", "image": "path.png", other strings ->
 * metadata}. */
static int jsonl_line(core_prompts *p, int *cap, const char *s, int lineno) {
    json_error_t je;
    json_t *o = json_loads(s, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return core_error("%s:%d: not a JSON object (%s)", p->path, lineno, o ? "another JSON value" : je.text);
    }
    const char *pr = json_string_value(json_object_get(o, "prompt"));
    const json_t *im = json_object_get(o, "image");
    int rc = 0;
    size_t bad;
    if (!pr || !pr[0]) rc = core_error("%s:%d: needs a non-empty string \"prompt\"", p->path, lineno);
    else if (blank(pr)) rc = core_error("%s:%d: \"prompt\" is blank (only spaces and tabs)", p->path, lineno);
    else if (core_utf8_check(pr, strlen(pr), &bad)) {
        char q[200];
        rc = core_error("%s:%d: \"prompt\" has a control character (byte %zu): \"%s\"", p->path, lineno, bad + 1,
                        core_quote_bytes(pr, strlen(pr), q, sizeof q));
    } else if (im && (!json_is_string(im) || !json_string_value(im)[0] ||
                      strlen(json_string_value(im)) != json_string_length(im)))
        rc = core_error("%s:%d: \"image\" must be a non-empty string (a PNG file's path)", p->path, lineno);
    else if (im && core_utf8_check(json_string_value(im), json_string_length(im), &bad)) {
        char q[200]; /* a newline in the path would also split the messages that name it */
        rc = core_error("%s:%d: \"image\" has a control character (byte %zu): \"%s\"", p->path, lineno, bad + 1,
                        core_quote_bytes(json_string_value(im), json_string_length(im), q, sizeof q));
    }
    char *path = NULL;
    if (!rc && im && !(path = image_path(p, json_string_value(im)))) rc = core_error("%s: out of memory", p->path);
    char where[4200];
    snprintf(where, sizeof where, "%s:%d", p->path, lineno);
    if (!rc && path && core_prompts_check_image(path, where)) rc = -1;
    if (rc) {
        free(path);
        json_decref(o);
        return -1;
    }
    json_t *md = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (!strcmp(k, "prompt") || !strcmp(k, "image")) continue;
        if (!json_is_string(v)) { /* the scorers take metadata as text (reward/PROTOCOL.md): refused, not dropped */
            rc = core_error("%s:%d: metadata \"%.64s\" is %s, not a string (the scorers get metadata as strings: write "
                            "it in quotes)", p->path, lineno, k, json_kind(v));
            break;
        }
        json_object_set(md, k, v);
    }
    if (rc) {
        free(path);
        json_decref(md);
        json_decref(o);
        return -1;
    }
    rc = add_image(p, cap, pr, lineno, md, path);
    json_decref(o);
    return rc;
}

static int bad_text(const core_prompts *p, int line, const char *s, size_t n, size_t off) {
    char q[200];
    return core_error("%s:%d: the prompt is not valid UTF-8 text (byte %zu: 0x%02x): \"%s\"", p->path, line, off + 1,
                      (unsigned)(unsigned char)s[off], core_quote_bytes(s, n, q, sizeof q));
}

/* The limits in force (defaults filled in). */
static core_prompts_limits limits_of(const core_prompts_limits *lim) {
    core_prompts_limits L = lim ? *lim : (core_prompts_limits){0, 0};
    if (L.max_file_bytes <= 0) L.max_file_bytes = (int64_t)CORE_PROMPTS_MAX_FILE_MB << 20;
    if (L.max_line_bytes <= 0) L.max_line_bytes = CORE_PROMPTS_MAX_BYTES;
    return L;
}

/* size: the file's size from stat, or -1 when reading went past the limit (a pipe, a file that grew). */
static int too_big(const core_prompts *p, const core_prompts_limits *L, int64_t size) {
    const double mb = L->max_file_bytes / 1048576.0;
    if (size < 0)
        return core_error("%s: the prompt file is more than %.1f MiB (data.max_prompt_file_mb %.0f); raise the key if "
                          "it is a prompt list", p->path, mb, mb);
    return core_error("%s: the prompt file is %.1f MiB, over data.max_prompt_file_mb %.0f; raise the key if it is a "
                      "prompt list", p->path, size / 1048576.0, mb);
}

/* Refuses a regular file over the limit before reading it (st: its stat). */
static int check_size(const core_prompts *p, const core_prompts_limits *L, const struct stat *st) {
    if (S_ISREG(st->st_mode) && (int64_t)st->st_size > L->max_file_bytes) return too_big(p, L, st->st_size);
    return 0;
}

/* One line of the file (len bytes in line[], without the newline): trimmed, skipped when blank or a comment, checked
 * as UTF-8 and added. */
static int text_line(core_prompts *p, int *cap, char *line, size_t len, int lineno) {
    char *s = line, *e = line + len;
    *e = 0;
    if (lineno == 1 && len >= 3 && !memcmp(s, "\xef\xbb\xbf", 3)) s += 3; /* a UTF-8 byte-order mark is not text */
    while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\v' || e[-1] == '\f'))
        *--e = 0;
    while (s < e && isspace((unsigned char)*s)) s++;
    if (s == e || *s == '#') return 0;
    size_t bad;
    if (core_utf8_check(s, (size_t)(e - s), &bad)) return bad_text(p, lineno, s, (size_t)(e - s), bad);
    if (p->jsonl) return jsonl_line(p, cap, s, lineno);
    return add(p, cap, s, lineno, json_object());
}

/* Text: read in blocks through one line buffer of the line limit; a longer line is counted to its end (not kept)
 * so the error can say how long it is. */
static int read_text(core_prompts *p, const core_prompts_limits *L) {
    FILE *f = fopen(p->path, "r");
    if (!f) return core_error("%s: cannot open prompt file: %s", p->path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st)) {
        const int e = errno;
        fclose(f);
        return core_error("%s: cannot read prompt file: %s", p->path, strerror(e));
    }
    if (check_size(p, L, &st)) return fclose(f), -1;
    const size_t maxl = (size_t)L->max_line_bytes;
    char *line = malloc(maxl + 1), blk[65536];
    if (!line) return fclose(f), core_error("%s: out of memory reading prompts", p->path);
    int64_t total = 0, over = 0; /* over: length of a line past the limit, counted to its end */
    size_t len = 0, got;
    int cap = 0, lineno = 1, rc = 0;
    while (!rc && (got = fread(blk, 1, sizeof blk, f)) > 0) {
        if ((total += (int64_t)got) > L->max_file_bytes) {
            rc = too_big(p, L, -1);
            break;
        }
        for (size_t i = 0; i < got && !rc;) {
            const char *nl = memchr(blk + i, '\n', got - i);
            const size_t n = (nl ? (size_t)(nl - blk) : got) - i;
            if (over || len + n > maxl) over = (over ? over : (int64_t)len) + (int64_t)n;
            else memcpy(line + len, blk + i, n), len += n;
            i += n;
            if (!nl) break;
            i++; /* the newline */
            if (over)
                rc = core_error("%s:%d: a line of %lld bytes, over data.max_prompt_bytes %lld (a prompt is one line)",
                                p->path, lineno, (long long)over, (long long)maxl);
            else rc = text_line(p, &cap, line, len, lineno);
            len = 0, over = 0, lineno++;
        }
    }
    const int err = !rc && ferror(f) ? errno : 0;
    if (!rc && !err && over)
        rc = core_error("%s:%d: a line of %lld bytes, over data.max_prompt_bytes %lld (a prompt is one line)", p->path,
                        lineno, (long long)over, (long long)maxl);
    else if (!rc && !err && len) rc = text_line(p, &cap, line, len, lineno);
    free(line);
    fclose(f);
    if (err) rc = core_error("%s: cannot read prompt file: %s", p->path, strerror(err));
    return rc;
}

const json_t *core_prompts_meta(const core_prompts *p, int i) {
    return p->meta && json_object_size(p->meta[i]) ? p->meta[i] : NULL;
}

char *core_prompts_where(const core_prompts *p, int i, char *buf, size_t cap) {
    if (p->json) snprintf(buf, cap, "%s: prompt %d", p->path, p->line[i]);
    else snprintf(buf, cap, "%s:%d", p->path, p->line[i]);
    return buf;
}

/* json_load_callback's reader: at most max bytes of f (then an error, flagged in over). */
typedef struct {
    FILE *f;
    int64_t total, max;
    int over;
} bounded_reader;

static size_t bounded_read(void *buf, size_t cap, void *data) {
    bounded_reader *b = data;
    const size_t got = fread(buf, 1, cap, b->f);
    if ((b->total += (int64_t)got) > b->max) {
        b->over = 1;
        return (size_t)-1;
    }
    return got ? got : (ferror(b->f) ? (size_t)-1 : 0);
}

static int read_json(core_prompts *p, const core_prompts_limits *L) {
    p->json = 1;
    FILE *f = fopen(p->path, "rb");
    if (!f) return core_error("%s: cannot open prompt file: %s", p->path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st)) {
        const int e = errno;
        fclose(f);
        return core_error("%s: cannot read prompt file: %s", p->path, strerror(e));
    }
    if (check_size(p, L, &st)) return fclose(f), -1;
    json_error_t je;
    bounded_reader br = {f, 0, L->max_file_bytes, 0};
    json_t *root = json_load_callback(bounded_read, &br, JSON_REJECT_DUPLICATES, &je);
    fclose(f);
    if (br.over) return json_decref(root), too_big(p, L, -1);
    if (!root) return core_error("%s:%d: %s", p->path, je.line, je.text);
    int rc = 0, cap = 0;
    if (!json_is_array(root) || json_array_size(root) == 0)
        rc = core_error("%s: expected a non-empty JSON list of {\"prompt_en\": ...} objects", p->path);
    for (size_t i = 0; !rc && i < json_array_size(root); i++) {
        const json_t *o = json_array_get(root, i);
        const char *pr = json_string_value(json_object_get(o, "prompt_en"));
        size_t bad;
        if (!json_is_object(o) || !pr || !pr[0]) {
            rc = core_error("%s: prompt %zu: needs a non-empty string \"prompt_en\"", p->path, i + 1);
            break;
        }
        if (blank(pr)) {
            rc = core_error("%s: prompt %zu: \"prompt_en\" is blank (only spaces and tabs)", p->path, i + 1);
            break;
        }
        if ((int64_t)strlen(pr) > L->max_line_bytes) {
            rc = core_error("%s: prompt %zu: \"prompt_en\" is %zu bytes, over data.max_prompt_bytes %lld", p->path, i + 1,
                            strlen(pr), (long long)L->max_line_bytes);
            break;
        }
        if (core_utf8_check(pr, strlen(pr), &bad)) {
            char q[200];
            rc = core_error("%s: prompt %zu: \"prompt_en\" has a control character (byte %zu): \"%s\"", p->path, i + 1,
                            bad + 1, core_quote_bytes(pr, strlen(pr), q, sizeof q));
            break;
        }
        json_t *md = json_object();
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)o, k, v) {
            if (!json_is_string(v) || !strcmp(k, "prompt_en")) continue; /* lists (e.g. "dimension") are not metadata */
            json_object_set(md, !strcmp(k, "color_en") ? "color" : k, v);
        }
        rc = add(p, &cap, pr, (int)i + 1, md);
    }
    json_decref(root);
    return rc;
}

int core_prompts_read(core_prompts *p, const char *path) { return core_prompts_read_limited(p, path, NULL); }

int core_prompts_read_limited(core_prompts *p, const char *path, const core_prompts_limits *lim) {
    memset(p, 0, sizeof *p);
    const core_prompts_limits L = limits_of(lim);
    if (strlen(path) >= sizeof p->path) return core_error("%s: prompt file path too long", path);
    snprintf(p->path, sizeof p->path, "%s", path);
    const size_t n = strlen(path);
    p->jsonl = n >= 6 && !strcmp(path + n - 6, ".jsonl");
    int rc = n >= 5 && !strcmp(path + n - 5, ".json") ? read_json(p, &L) : read_text(p, &L);
    if (!rc && p->n_images && p->n_images < p->n) {
        for (int i = 0; i < p->n; i++)
            if (!p->image[i]) {
                rc = core_error("%s:%d: no \"image\", but other prompts of the file have one (an image-to-video "
                                "prompt file gives every prompt its image)", path, p->line[i]);
                break;
            }
    }
    if (!rc && p->n == 0) rc = core_error("%s has no prompts (it is empty, blank or only comments)", path);
    if (rc) core_prompts_free(p);
    return rc;
}

/* xxh64 (seed 0) of the file's bytes, read in 1 MiB pieces. */
static int file_xxh64(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return core_error("%s: %s", path, strerror(errno));
    XXH64_state_t *st = XXH64_createState();
    unsigned char *buf = malloc(1 << 20);
    int rc = st && buf ? 0 : core_error("out of memory");
    if (!rc) XXH64_reset(st, 0);
    for (size_t got; !rc && (got = fread(buf, 1, 1 << 20, f)) > 0;) XXH64_update(st, buf, got);
    if (!rc && ferror(f)) rc = core_error("%s: read error", path);
    if (!rc) *out = XXH64_digest(st);
    fclose(f);
    free(buf);
    XXH64_freeState(st);
    return rc;
}

static void put_le64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

/* qsort_r order of indices into the image paths `paths`: by path, then index. */
static int cmp_by_path(const void *a, const void *b, void *paths) {
    char **v = paths;
    const int i = *(const int *)a, j = *(const int *)b, c = strcmp(v[i], v[j]);
    return c ? c : (i > j) - (i < j);
}

int core_prompts_xxh64(const core_prompts *p, uint64_t *out) {
    XXH64_state_t *all = XXH64_createState(), *one = XXH64_createState();
    uint64_t *img = p->n_images ? malloc(sizeof(uint64_t) * (size_t)p->n) : NULL;
    int *ord = p->n_images ? malloc(sizeof(int) * (size_t)p->n) : NULL;
    int rc = all && one && (!p->n_images || (img && ord)) ? 0 : core_error("out of memory");
    if (!rc && p->n_images) { /* each image file read once, however many prompts share it */
        for (int i = 0; i < p->n; i++) ord[i] = i;
        qsort_r(ord, (size_t)p->n, sizeof *ord, cmp_by_path, p->image);
        for (int k = 0; !rc && k < p->n; k++) {
            const int i = ord[k];
            if (k && !strcmp(p->image[i], p->image[ord[k - 1]])) img[i] = img[ord[k - 1]];
            else if (file_xxh64(p->image[i], &img[i])) rc = core_error_push("%s:%d: image: ", p->path, p->line[i]);
        }
    }
    if (!rc) XXH64_reset(all, 0);
    for (int i = 0; !rc && i < p->n; i++) {
        unsigned char le[8];
        char *meta = json_dumps(p->meta[i], JSON_COMPACT | JSON_SORT_KEYS);
        if (!meta) {
            rc = core_error("out of memory");
            break;
        }
        XXH64_reset(one, 0);
        XXH64_update(one, p->text[i], strlen(p->text[i]) + 1);
        XXH64_update(one, meta, strlen(meta) + 1);
        free(meta);
        if (p->n_images) {
            put_le64(le, img[i]);
            XXH64_update(one, le, 8);
        }
        put_le64(le, XXH64_digest(one));
        XXH64_update(all, le, 8);
    }
    if (!rc) *out = XXH64_digest(all);
    free(img), free(ord);
    XXH64_freeState(all);
    XXH64_freeState(one);
    return rc;
}
