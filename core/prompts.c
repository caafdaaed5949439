/* core/prompts.c — prompt files (text or VBench-style JSON) with file:line errors; see core/prompts.h. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    }
    free(p->text), free(p->line), free(p->meta);
    memset(p, 0, sizeof *p);
}

/* Appends one prompt (copied) with its line and metadata (reference taken). */
static int add(core_prompts *p, int *cap, const char *s, int line, json_t *meta) {
    if (p->n == *cap) {
        const int c = *cap ? 2 * *cap : 16;
        char **t = realloc(p->text, sizeof(char *) * (size_t)c);
        if (t) p->text = t;
        int *l = realloc(p->line, sizeof(int) * (size_t)c);
        if (l) p->line = l;
        json_t **m = realloc(p->meta, sizeof(json_t *) * (size_t)c);
        if (m) p->meta = m;
        if (!t || !l || !m) return json_decref(meta), core_error("%s: out of memory reading prompts", p->path);
        *cap = c;
    }
    if (!(p->text[p->n] = strdup(s))) return json_decref(meta), core_error("%s: out of memory reading prompts", p->path);
    p->line[p->n] = line;
    p->meta[p->n] = meta;
    p->n++;
    return 0;
}

static int bad_text(const core_prompts *p, int line, const char *s, size_t n, size_t off) {
    char q[200];
    return core_error("%s:%d: the prompt is not valid UTF-8 text (byte %zu: 0x%02x): \"%s\"", p->path, line, off + 1,
                      (unsigned)(unsigned char)s[off], core_quote_bytes(s, n, q, sizeof q));
}

static int read_text(core_prompts *p) {
    FILE *f = fopen(p->path, "r");
    if (!f) return core_error("%s: cannot open prompt file: %s", p->path, strerror(errno));
    char *line = NULL; /* getline: prompts of any length, never split */
    size_t linecap = 0;
    ssize_t len;
    int cap = 0, lineno = 0, rc = 0;
    while (!rc && (len = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        char *s = line, *e = line + len;
        while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\v' ||
                         e[-1] == '\f'))
            *--e = 0;
        while (s < e && isspace((unsigned char)*s)) s++;
        if (s == e || *s == '#') continue;
        size_t bad;
        if (core_utf8_check(s, (size_t)(e - s), &bad)) rc = bad_text(p, lineno, s, (size_t)(e - s), bad);
        else rc = add(p, &cap, s, lineno, json_object());
    }
    const int err = !rc && ferror(f) ? errno : 0;
    free(line);
    fclose(f);
    if (err) rc = core_error("%s: cannot read prompt file: %s", p->path, strerror(err));
    return rc;
}

char *core_prompts_where(const core_prompts *p, int i, char *buf, size_t cap) {
    if (p->json) snprintf(buf, cap, "%s: prompt %d", p->path, p->line[i]);
    else snprintf(buf, cap, "%s:%d", p->path, p->line[i]);
    return buf;
}

static int read_json(core_prompts *p) {
    p->json = 1;
    json_error_t je;
    json_t *root = json_load_file(p->path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return core_error("%s:%d: %s", p->path, je.line, je.text);
    int rc = 0, cap = 0;
    if (!json_is_array(root) || json_array_size(root) == 0)
        rc = core_error("%s: expected a non-empty JSON list of {\"prompt_en\": ...} objects", p->path);
    for (size_t i = 0; !rc && i < json_array_size(root); i++) {
        const json_t *o = json_array_get(root, i);
        const char *pr = json_string_value(json_object_get(o, "prompt_en"));
        size_t bad;
        if (!json_is_object(o) || !pr || !pr[0]) {
            rc = core_error("%s: entry %zu: needs a non-empty string \"prompt_en\"", p->path, i);
            break;
        }
        if (core_utf8_check(pr, strlen(pr), &bad)) {
            char q[200];
            rc = core_error("%s: entry %zu: \"prompt_en\" has a control character (byte %zu): \"%s\"", p->path, i,
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

int core_prompts_read(core_prompts *p, const char *path) {
    memset(p, 0, sizeof *p);
    if (strlen(path) >= sizeof p->path) return core_error("%s: prompt file path too long", path);
    snprintf(p->path, sizeof p->path, "%s", path);
    const size_t n = strlen(path);
    int rc = n >= 5 && !strcmp(path + n - 5, ".json") ? read_json(p) : read_text(p);
    if (!rc && p->n == 0) rc = core_error("%s: no prompts", path);
    if (rc) core_prompts_free(p);
    return rc;
}
