/* core/config.c — YAML trees: loading with libyaml's event parser, --set overrides, accessors and typed scalar
 * reads; see config.h. Writing strings and flow text is in config_write.c, the schema half (apply, dump, help) in
 * config_schema.c.
 *
 * libyaml parses YAML 1.1; we take its events (not its document API) so that every node keeps its line, and we
 * type plain scalars ourselves with YAML 1.2 core rules (config.h). Maps check duplicate keys by a linear scan,
 * which is quadratic in a map's size; fine for configs and index files of a few thousand keys. */
#include "core/config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "core/config_internal.h"
#include "core/error.h"

#define MAX_DEPTH 64
#define MAX_FILE_BYTES ((size_t)64 << 20)

/* ---- nodes ---- */

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...) {
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

static char *child_path(const char *parent, const char *key) {
    return *parent ? xasprintf("%s.%s", parent, key) : strdup(key);
}

static core_cfg_node *node_new(core_node_kind kind, const char *where, const char *path, int line, int col) {
    core_cfg_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = line;
    n->col = col;
    n->where = strdup(where);
    n->path = strdup(path);
    if (!n->where || !n->path) {
        core_config_free(n);
        return NULL;
    }
    return n;
}

void core_config_free(core_cfg_node *n) {
    if (!n) return;
    for (int i = 0; i < n->n; i++) {
        if (n->keys) free(n->keys[i]);
        core_config_free(n->items[i]);
    }
    free(n->keys);
    free(n->items);
    free(n->text);
    free(n->where);
    free(n->path);
    free(n);
}

/* Appends child (and its key, copied, for a map). On failure the child is NOT freed. */
static int node_append(core_cfg_node *parent, const char *key, core_cfg_node *child) {
    char *k = NULL;
    if (parent->kind == CORE_NODE_MAP && !(k = strdup(key))) return -1;
    core_cfg_node **items = realloc(parent->items, (size_t)(parent->n + 1) * sizeof *items);
    if (!items) {
        free(k);
        return -1;
    }
    parent->items = items;
    if (parent->kind == CORE_NODE_MAP) {
        char **keys = realloc(parent->keys, (size_t)(parent->n + 1) * sizeof *keys);
        if (!keys) {
            free(k);
            return -1;
        }
        parent->keys = keys;
        keys[parent->n] = k;
    }
    items[parent->n++] = child;
    return 0;
}

core_cfg_node *core_config_copy(const core_cfg_node *src) {
    core_cfg_node *n = node_new(src->kind, src->where, src->path, src->line, src->col);
    if (!n) goto oom;
    n->quoted = src->quoted;
    if (src->text && !(n->text = strdup(src->text))) goto oom;
    for (int i = 0; i < src->n; i++) {
        core_cfg_node *c = core_config_copy(src->items[i]);
        if (!c) {
            core_config_free(n);
            return NULL;
        }
        if (node_append(n, src->keys ? src->keys[i] : NULL, c) != 0) {
            core_config_free(c);
            goto oom;
        }
    }
    return n;
oom:
    core_config_free(n);
    core_error("config: out of memory copying \"%s\"", src->path);
    return NULL;
}

/* Gives n and its subtree a new path and source (used for --set values and schema defaults). */
int core_cfgi_retarget(core_cfg_node *n, const char *path, const char *where) {
    char *p = strdup(path), *w = strdup(where);
    if (!p || !w) {
        free(p);
        free(w);
        return -1;
    }
    free(n->path);
    free(n->where);
    n->path = p;
    n->where = w;
    n->line = n->col = 0;
    for (int i = 0; i < n->n; i++) {
        char idx[24];
        snprintf(idx, sizeof idx, "%d", i);
        char *cp = child_path(path, n->kind == CORE_NODE_MAP ? n->keys[i] : idx);
        int rc = cp ? core_cfgi_retarget(n->items[i], cp, where) : -1;
        free(cp);
        if (rc) return -1;
    }
    return 0;
}

/* ---- loading ---- */

typedef struct {
    yaml_parser_t p;
    const char *name;
    int nopos;     /* text is a --set value: messages name the assignment, not a line and column in it */
    char loc[700]; /* scratch for at() */
} parse_ctx;

/* "name:line:col" (col 0: "name:line"), or just "name" for a --set value. Valid until the next call. */
static const char *at(parse_ctx *c, size_t line, size_t col) {
    if (c->nopos)
        snprintf(c->loc, sizeof c->loc, "%s", c->name);
    else if (col)
        snprintf(c->loc, sizeof c->loc, "%s:%zu:%zu", c->name, line, col);
    else
        snprintf(c->loc, sizeof c->loc, "%s:%zu", c->name, line);
    return c->loc;
}

static int yaml_fail(parse_ctx *c) {
    const yaml_parser_t *p = &c->p;
    if (p->error == YAML_MEMORY_ERROR) return core_error("%s: out of memory while parsing", c->name);
    if (p->error == YAML_READER_ERROR)
        return core_error("%s: byte %zu: cannot read the text: %s", c->name, p->problem_offset,
                          p->problem ? p->problem : "unknown problem");
    const char *where = at(c, p->problem_mark.line + 1, p->problem_mark.column + 1);
    const char *problem = p->problem ? p->problem : "unknown problem";
    if (p->context && !c->nopos)
        return core_error("%s: YAML syntax error: %s (%s at line %zu)", where, problem, p->context,
                          p->context_mark.line + 1);
    if (p->context) return core_error("%s: YAML syntax error: %s (%s)", where, problem, p->context);
    return core_error("%s: YAML syntax error: %s", where, problem);
}

static int next_event(parse_ctx *c, yaml_event_t *ev) {
    if (!yaml_parser_parse(&c->p, ev)) return yaml_fail(c);
    return 0;
}

/* Refuses anchors and tags other than the plain core ones; sets *is_str for !!str. */
static int check_props(parse_ctx *c, const yaml_event_t *ev, const char *allowed_tag, int *is_str) {
    const yaml_char_t *anchor = NULL, *tag = NULL;
    if (ev->type == YAML_SCALAR_EVENT) {
        anchor = ev->data.scalar.anchor;
        tag = ev->data.scalar.tag;
    } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
        anchor = ev->data.sequence_start.anchor;
        tag = ev->data.sequence_start.tag;
    } else if (ev->type == YAML_MAPPING_START_EVENT) {
        anchor = ev->data.mapping_start.anchor;
        tag = ev->data.mapping_start.tag;
    }
    size_t line = ev->start_mark.line + 1, col = ev->start_mark.column + 1;
    if (anchor)
        return core_error("%s: YAML anchors and aliases are not supported (found &%s); write the values out",
                          at(c, line, col), (const char *)anchor);
    if (tag) {
        if (is_str && !strcmp((const char *)tag, "tag:yaml.org,2002:str"))
            *is_str = 1;
        else if (strcmp((const char *)tag, allowed_tag) != 0)
            return core_error("%s: YAML tag \"%s\" is not supported", at(c, line, col), (const char *)tag);
    }
    return 0;
}

static int parse_node(parse_ctx *c, yaml_event_t *ev, const char *path, int line, int col, int depth,
                      core_cfg_node **out);

/* Reads the children of a sequence or map whose start event was just consumed, until its end event. */
static int parse_children(parse_ctx *c, core_cfg_node *n, int depth) {
    for (;;) {
        yaml_event_t ev;
        if (next_event(c, &ev)) return -1;
        if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return 0;
        }
        int rc = 0, line = (int)ev.start_mark.line + 1, col = (int)ev.start_mark.column + 1;
        char *key = NULL, *cpath = NULL;
        core_cfg_node *child = NULL;
        if (n->kind == CORE_NODE_MAP) {
            /* ev is the key: a scalar. Its line is the line the entry is reported at. */
            int dummy = 0;
            if (ev.type != YAML_SCALAR_EVENT)
                rc = core_error("%s: map keys must be plain text (found a %s)", at(c, (size_t)line, (size_t)col),
                                ev.type == YAML_ALIAS_EVENT ? "YAML alias" : "list or map");
            else if (check_props(c, &ev, "tag:yaml.org,2002:str", &dummy) == 0) {
                key = strndup((const char *)ev.data.scalar.value, ev.data.scalar.length);
                if (!key) rc = core_error("%s: out of memory", c->name);
            } else
                rc = -1;
            yaml_event_delete(&ev);
            if (rc) return -1;
            for (int i = 0; i < n->n; i++)
                if (!strcmp(n->keys[i], key)) {
                    char *dup = child_path(n->path, key);
                    core_error("%s: duplicate key \"%s\" (first at line %d)", at(c, (size_t)line, 0), dup ? dup : key,
                               n->items[i]->line);
                    free(dup);
                    free(key);
                    return -1;
                }
            if (next_event(c, &ev)) {
                free(key);
                return -1;
            }
        } else {
            char idx[24];
            snprintf(idx, sizeof idx, "%d", n->n);
            key = strdup(idx);
        }
        cpath = key ? child_path(n->path, key) : NULL;
        if (!cpath)
            rc = core_error("%s: out of memory", c->name);
        else
            rc = parse_node(c, &ev, cpath, line, col, depth + 1, &child);
        yaml_event_delete(&ev);
        if (rc == 0 && node_append(n, key, child) != 0) {
            core_config_free(child);
            rc = core_error("%s: out of memory", c->name);
        }
        free(key);
        free(cpath);
        if (rc) return -1;
    }
}

/* Builds the node whose first event is ev (not consumed here: the caller deletes it). line/col: where to report
 * it (its key's position for a map value). */
static int parse_node(parse_ctx *c, yaml_event_t *ev, const char *path, int line, int col, int depth,
                      core_cfg_node **out) {
    *out = NULL;
    if (depth > MAX_DEPTH) return core_error("%s: nesting deeper than %d levels", at(c, (size_t)line, 0), MAX_DEPTH);
    if (ev->type == YAML_ALIAS_EVENT)
        return core_error("%s: YAML anchors and aliases are not supported (found *%s); write the values out",
                          at(c, ev->start_mark.line + 1, ev->start_mark.column + 1),
                          (const char *)ev->data.alias.anchor);
    core_node_kind kind;
    const char *tag;
    if (ev->type == YAML_SCALAR_EVENT) {
        kind = CORE_NODE_SCALAR;
        tag = "tag:yaml.org,2002:str";
    } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
        kind = CORE_NODE_SEQ;
        tag = "tag:yaml.org,2002:seq";
    } else if (ev->type == YAML_MAPPING_START_EVENT) {
        kind = CORE_NODE_MAP;
        tag = "tag:yaml.org,2002:map";
    } else
        return core_error("%s: unexpected YAML event", at(c, (size_t)line, 0));
    int is_str = 0;
    if (check_props(c, ev, tag, kind == CORE_NODE_SCALAR ? &is_str : NULL)) return -1;
    char *where = depth == 0 ? strdup(c->name) : xasprintf("%s:%d", c->name, line);
    core_cfg_node *n = where ? node_new(kind, where, path, line, col) : NULL;
    free(where);
    if (!n) return core_error("%s: out of memory", c->name);
    if (kind == CORE_NODE_SCALAR) {
        const char *v = (const char *)ev->data.scalar.value;
        size_t len = ev->data.scalar.length;
        if (memchr(v, '\0', len)) {
            core_config_free(n);
            return core_error("%s: %s: text contains a NUL character", at(c, (size_t)line, 0), *path ? path : "value");
        }
        n->quoted = is_str || ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
        if (!(n->text = strndup(v, len))) {
            core_config_free(n);
            return core_error("%s: out of memory", c->name);
        }
    } else if (parse_children(c, n, depth)) {
        core_config_free(n);
        return -1;
    }
    *out = n;
    return 0;
}

/* Parses one document; *out = NULL when the stream holds none. */
static int load_any(const char *text, size_t len, const char *name, int nopos, core_cfg_node **out) {
    *out = NULL;
    parse_ctx c = {.name = name, .nopos = nopos};
    if (!yaml_parser_initialize(&c.p)) return core_error("%s: cannot start the YAML parser", name);
    yaml_parser_set_input_string(&c.p, (const unsigned char *)text, len);
    yaml_event_t ev;
    core_cfg_node *root = NULL;
    int rc = -1;
    if (next_event(&c, &ev)) goto done; /* stream start */
    yaml_event_delete(&ev);
    if (next_event(&c, &ev)) goto done;
    if (ev.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&ev);
        rc = 0;
        goto done;
    }
    yaml_event_delete(&ev); /* document start */
    if (next_event(&c, &ev)) goto done;
    rc = parse_node(&c, &ev, "", (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1, 0, &root);
    yaml_event_delete(&ev);
    if (rc) goto done;
    rc = -1;
    if (next_event(&c, &ev)) goto done; /* document end */
    yaml_event_delete(&ev);
    if (next_event(&c, &ev)) goto done;
    if (ev.type == YAML_DOCUMENT_START_EVENT) {
        core_error("%s: more than one YAML document (only one is read)", at(&c, ev.start_mark.line + 1, 0));
        yaml_event_delete(&ev);
        goto done;
    }
    yaml_event_delete(&ev);
    rc = 0;
done:
    yaml_parser_delete(&c.p);
    if (rc == 0)
        *out = root;
    else
        core_config_free(root);
    return rc;
}

int core_config_load_string(const char *text, size_t len, const char *name, core_cfg_node **out) {
    if (load_any(text, len, name, 0, out)) return -1;
    if (!*out && !(*out = node_new(CORE_NODE_MAP, name, "", 0, 0))) return core_error("%s: out of memory", name);
    return 0;
}

int core_config_load_file(const char *path, core_cfg_node **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return core_error("%s: cannot open: %s", path, strerror(errno));
    size_t len = 0, cap = 0;
    char *buf = NULL;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? 2 * cap : 65536;
            char *nb = ncap <= 2 * MAX_FILE_BYTES ? realloc(buf, ncap) : NULL;
            if (!nb) {
                rc = core_error("%s: out of memory", path);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (len > MAX_FILE_BYTES) {
            rc = core_error("%s: larger than %zu MiB; not a config file?", path, MAX_FILE_BYTES >> 20);
            break;
        }
        if (got == 0) {
            if (ferror(f)) rc = core_error("%s: read failed", path);
            break;
        }
    }
    fclose(f);
    if (rc == 0) rc = core_config_load_string(buf ? buf : "", len, path, out);
    free(buf);
    return rc;
}

/* ---- lookup ---- */

const core_cfg_node *core_config_child(const core_cfg_node *map, const char *key) {
    if (!map || map->kind != CORE_NODE_MAP) return NULL;
    for (int i = 0; i < map->n; i++)
        if (!strcmp(map->keys[i], key)) return map->items[i];
    return NULL;
}

/* A list index: decimal digits only, no sign, in range. -1 if seg is not one. */
static int seg_index(const char *seg, int n) {
    if (!*seg) return -1;
    long v = 0;
    for (const char *s = seg; *s; s++) {
        if (*s < '0' || *s > '9' || v > 100000000) return -1;
        v = v * 10 + (*s - '0');
    }
    return v < n ? (int)v : -1;
}

const core_cfg_node *core_config_get(const core_cfg_node *node, const char *path) {
    if (!path || !*path) return node;
    char *copy = strdup(path);
    if (!copy) return NULL;
    const core_cfg_node *cur = node;
    char *seg = copy;
    while (cur && seg) {
        char *dot = strchr(seg, '.');
        if (dot) *dot = '\0';
        if (cur->kind == CORE_NODE_MAP)
            cur = core_config_child(cur, seg);
        else if (cur->kind == CORE_NODE_SEQ) {
            int i = seg_index(seg, cur->n);
            cur = i >= 0 ? cur->items[i] : NULL;
        } else
            cur = NULL;
        seg = dot ? dot + 1 : NULL;
    }
    free(copy);
    return cur;
}

/* ---- --set ---- */

/* 1 if s is UTF-8 of characters YAML allows in a document (tab, LF, CR, printable ASCII, NEL, U+00A0..U+D7FF,
 * U+E000..U+FFFD, U+10000..U+10FFFF; the set libyaml's reader accepts), so the key can be written to a file and
 * read back. */
static int yaml_printable(const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        uint32_t c;
        int len;
        if (*s < 0x80) {
            c = *s;
            len = 1;
        } else if ((*s & 0xe0) == 0xc0) {
            c = *s & 0x1f;
            len = 2;
        } else if ((*s & 0xf0) == 0xe0) {
            c = *s & 0x0f;
            len = 3;
        } else if ((*s & 0xf8) == 0xf0) {
            c = *s & 0x07;
            len = 4;
        } else
            return 0;
        for (int k = 1; k < len; k++) {
            if ((s[k] & 0xc0) != 0x80) return 0;
            c = (c << 6) | (s[k] & 0x3f);
        }
        static const uint32_t min_for_len[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (c < min_for_len[len]) return 0; /* overlong */
        int ok = c == 0x09 || c == 0x0a || c == 0x0d || (c >= 0x20 && c <= 0x7e) || c == 0x85 ||
                 (c >= 0xa0 && c <= 0xd7ff) || (c >= 0xe000 && c <= 0xfffd && c != 0xfeff) ||
                 (c >= 0x10000 && c <= 0x10ffff);
        if (!ok) return 0;
        s += len;
    }
    return 1;
}

/* The first character of s that YAML reads as a line break (LF, CR, NEL U+0085, LS U+2028, PS U+2029), or NULL. */
static const char *line_break(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p == '\n' || *p == '\r' || (p[0] == 0xc2 && p[1] == 0x85) ||
            (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)))
            return (const char *)p;
    return NULL;
}

static const char *break_name(const char *p) {
    const unsigned char *u = (const unsigned char *)p;
    return *u == '\n' ? "LF" : *u == '\r' ? "CR" : *u == 0xc2 ? "U+0085 NEL" : u[2] == 0xa8 ? "U+2028 LS" : "U+2029 PS";
}

int core_config_set(core_cfg_node *root, const char *a) {
    const char *eq = strchr(a, '=');
    if (!eq) return core_error("--set %s: expected key.path=value", a);
    char *keypath = strndup(a, (size_t)(eq - a)), *where = xasprintf("--set %s", a);
    core_cfg_node *value = NULL;
    int rc = -1;
    if (!keypath || !where) {
        core_error("--set %s: out of memory", a);
        goto done;
    }
    if (!*keypath || keypath[0] == '.' || keypath[strlen(keypath) - 1] == '.' || strstr(keypath, "..")) {
        core_error("%s: empty key in path \"%s\"", where, keypath);
        goto done;
    }
    if (!yaml_printable(keypath) || strpbrk(keypath, "\t\n\r")) {
        core_error("%s: the key path is not printable UTF-8 text", where);
        goto done;
    }
    const char *brk = line_break(eq + 1);
    if (brk) { /* YAML would fold it into a space, or end the value there: refused, not changed silently */
        core_error("--set %s: the value holds a line break (%s at byte %zu); an assignment is one line: write it as "
                   "an escape in a double-quoted string (\\n, \\r, \\N, \\L, \\P)", keypath, break_name(brk),
                   (size_t)(brk - (eq + 1)) + 1);
        goto done;
    }
    if (root->kind != CORE_NODE_MAP) {
        core_error("%s: the config is not a map", where);
        goto done;
    }
    if (load_any(eq + 1, strlen(eq + 1), where, 1, &value)) goto done;
    if (!value && !(value = node_new(CORE_NODE_SCALAR, where, "", 0, 0))) goto oom;
    if (!value->text && value->kind == CORE_NODE_SCALAR && !(value->text = strdup(""))) goto oom;
    if (core_cfgi_retarget(value, keypath, where)) goto oom;

    core_cfg_node *cur = root;
    char *seg = keypath;
    for (;;) {
        char *dot = strchr(seg, '.');
        if (dot) *dot = '\0';
        /* Find the slot for seg in cur. */
        int slot = -1;
        if (cur->kind == CORE_NODE_MAP) {
            for (int i = 0; i < cur->n; i++)
                if (!strcmp(cur->keys[i], seg)) slot = i;
        } else if (cur->kind == CORE_NODE_SEQ) {
            slot = seg_index(seg, cur->n);
            if (slot < 0) {
                core_error("%s: \"%s\" is a list of %d items (%s); \"%s\" is not an index into it", where, cur->path,
                           cur->n, cur->where, seg);
                goto done;
            }
        } else {
            core_error("%s: \"%s\" is a single value (%s), not a map; cannot set a key inside it", where, cur->path,
                       cur->where);
            goto done;
        }
        if (!dot) { /* last segment: replace or add */
            if (slot >= 0) {
                core_config_free(cur->items[slot]);
                cur->items[slot] = value;
            } else if (node_append(cur, seg, value) != 0)
                goto oom;
            value = NULL;
            break;
        }
        if (slot >= 0 && core_config_is_null(cur->items[slot])) { /* `section:` left empty becomes a map */
            core_config_free(cur->items[slot]);
            cur->items[slot] = NULL;
        }
        if (slot < 0 || !cur->items[slot]) {
            *dot = '\0';
            core_cfg_node *m = node_new(CORE_NODE_MAP, where, keypath, 0, 0);
            if (!m) goto oom;
            if (slot >= 0)
                cur->items[slot] = m;
            else if (node_append(cur, seg, m) != 0) {
                core_config_free(m);
                goto oom;
            } else
                slot = cur->n - 1;
        }
        *dot = '.';
        cur = cur->items[slot];
        seg = dot + 1;
    }
    rc = 0;
    goto done;
oom:
    core_error("%s: out of memory", where ? where : a);
done:
    core_config_free(value);
    free(keypath);
    free(where);
    return rc;
}

/* ---- typed scalars ---- */

int core_config_is_null(const core_cfg_node *n) {
    if (!n || n->kind != CORE_NODE_SCALAR || n->quoted) return 0;
    const char *s = n->text;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

/* 1: s is an integer (set *v); 0: it is not; -1: it is one but out of int64 range. */
int core_cfgi_text_int(const char *s, int64_t *v) {
    const char *p = s;
    int base = 10;
    if (p[0] == '0' && p[1] == 'x') {
        base = 16;
        p += 2;
    } else if (p[0] == '0' && p[1] == 'o') {
        base = 8;
        p += 2;
    } else if (*p == '-' || *p == '+')
        p++;
    if (!*p) return 0;
    for (const char *q = p; *q; q++) {
        int ok = base == 16 ? (*q >= '0' && *q <= '9') || ((*q | 32) >= 'a' && (*q | 32) <= 'f')
                            : *q >= '0' && *q <= (base == 8 ? '7' : '9');
        if (!ok) return 0;
    }
    errno = 0;
    if (base == 10) {
        long long x = strtoll(s, NULL, 10);
        if (errno == ERANGE) return -1;
        *v = x;
    } else {
        unsigned long long x = strtoull(p, NULL, base);
        if (errno == ERANGE || x > (unsigned long long)INT64_MAX) return -1;
        *v = (int64_t)x;
    }
    return 1;
}

/* 1: s is a number (integer or float forms of config.h; set *v); 0: it is not; -1: a float out of range. */
int core_cfgi_text_double(const char *s, double *v) {
    int64_t i;
    const char *p = s + (*s == '-' || *s == '+');
    double sign = *s == '-' ? -1.0 : 1.0;
    if (!strcmp(p, ".inf") || !strcmp(p, ".Inf") || !strcmp(p, ".INF")) {
        *v = sign * INFINITY;
        return 1;
    }
    if (p == s && (!strcmp(s, ".nan") || !strcmp(s, ".NaN") || !strcmp(s, ".NAN"))) {
        *v = NAN;
        return 1;
    }
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) { /* hex and octal integers (no sign, as in YAML 1.2) */
        if (core_cfgi_text_int(s, &i) != 1) return 0;
        *v = (double)i;
        return 1;
    }
    /* [-+]? ( . digits | digits ( . digits? )? ) ( [eE] [-+]? digits )? */
    const char *q = p;
    int mant = 0;
    while (*q >= '0' && *q <= '9') q++, mant++;
    if (*q == '.') {
        q++;
        while (*q >= '0' && *q <= '9') q++, mant++;
    }
    if (!mant) return 0;
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '-' || *q == '+') q++;
        if (!(*q >= '0' && *q <= '9')) return 0;
        while (*q >= '0' && *q <= '9') q++;
    }
    if (*q) return 0;
    errno = 0;
    double x = strtod(s, NULL);
    if (errno == ERANGE && isinf(x)) return -1;
    *v = x;
    return 1;
}

int core_cfgi_text_bool(const char *s, bool *v) {
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")) {
        *v = true;
        return 1;
    }
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")) {
        *v = false;
        return 1;
    }
    return 0;
}

/* "where: path: expected <what>, got <what it is>". */
int core_cfgi_type_error(const core_cfg_node *n, const char *expected) {
    const char *path = *n->path ? n->path : "(top level)";
    if (n->kind == CORE_NODE_MAP) return core_error("%s: %s: expected %s, got a map", n->where, path, expected);
    if (n->kind == CORE_NODE_SEQ) return core_error("%s: %s: expected %s, got a list", n->where, path, expected);
    if (core_config_is_null(n)) return core_error("%s: %s: expected %s, got null", n->where, path, expected);
    size_t len = strlen(n->text);
    return core_error("%s: %s: expected %s, got %s\"%.60s%s\"", n->where, path, expected,
                      n->quoted ? "the quoted string " : "", n->text, len > 60 ? "..." : "");
}

int core_config_as_int(const core_cfg_node *n, int64_t *out) {
    if (n->kind != CORE_NODE_SCALAR || n->quoted) return core_cfgi_type_error(n, "an integer");
    int r = core_cfgi_text_int(n->text, out);
    if (r < 0) return core_error("%s: %s: %s is out of range for a 64-bit integer", n->where, n->path, n->text);
    return r ? 0 : core_cfgi_type_error(n, "an integer");
}

int core_config_as_double(const core_cfg_node *n, double *out) {
    if (n->kind != CORE_NODE_SCALAR || n->quoted) return core_cfgi_type_error(n, "a number");
    int r = core_cfgi_text_double(n->text, out);
    if (r < 0) return core_error("%s: %s: %s is out of range for a double", n->where, n->path, n->text);
    return r ? 0 : core_cfgi_type_error(n, "a number");
}

int core_config_as_bool(const core_cfg_node *n, bool *out) {
    if (n->kind != CORE_NODE_SCALAR || n->quoted || !core_cfgi_text_bool(n->text, out))
        return core_cfgi_type_error(n, "true or false");
    return 0;
}

int core_config_as_string(const core_cfg_node *n, const char **out) {
    if (n->kind != CORE_NODE_SCALAR) return core_cfgi_type_error(n, "a string");
    *out = core_config_is_null(n) ? NULL : n->text;
    return 0;
}

static const core_cfg_node *get_or_fail(const core_cfg_node *root, const char *path) {
    const core_cfg_node *n = core_config_get(root, path);
    if (!n) core_error("%s: missing key \"%s\"", root->where, path);
    return n;
}

int core_config_get_int(const core_cfg_node *root, const char *path, int64_t *out) {
    const core_cfg_node *n = get_or_fail(root, path);
    return n ? core_config_as_int(n, out) : -1;
}
int core_config_get_double(const core_cfg_node *root, const char *path, double *out) {
    const core_cfg_node *n = get_or_fail(root, path);
    return n ? core_config_as_double(n, out) : -1;
}
int core_config_get_bool(const core_cfg_node *root, const char *path, bool *out) {
    const core_cfg_node *n = get_or_fail(root, path);
    return n ? core_config_as_bool(n, out) : -1;
}
int core_config_get_string(const core_cfg_node *root, const char *path, const char **out) {
    const core_cfg_node *n = get_or_fail(root, path);
    return n ? core_config_as_string(n, out) : -1;
}
