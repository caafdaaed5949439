/* core/config_schema.c — typed extraction of a config tree into a caller's struct against a declared schema, and
 * the resolved-config dump and help listing; see config.h. Trees themselves are in config.c. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/config_internal.h"
#include "core/error.h"

#define FIELD(obj, e, T) ((T *)((char *)(obj) + (e)->offset))
#define CFIELD(obj, e, T) ((const T *)((const char *)(obj) + (e)->offset))

static const char *type_name(core_cfg_type t) {
    switch (t) {
    case CORE_CFG_INT: return "int";
    case CORE_CFG_INT64: return "int64";
    case CORE_CFG_FLOAT: return "float";
    case CORE_CFG_DOUBLE: return "double";
    case CORE_CFG_BOOL: return "bool";
    case CORE_CFG_STRING: return "string";
    case CORE_CFG_STRINGS: return "list of strings";
    case CORE_CFG_INTS: return "list of ints";
    case CORE_CFG_DOUBLES: return "list of numbers";
    case CORE_CFG_TREE: return "map or list";
    }
    return "?";
}

/* Sets a field to its empty value without freeing (the struct may hold garbage before the first apply). */
static void clear_field(const core_cfg_entry *e, void *obj) {
    switch (e->type) {
    case CORE_CFG_INT: *FIELD(obj, e, int) = 0; break;
    case CORE_CFG_INT64: *FIELD(obj, e, int64_t) = 0; break;
    case CORE_CFG_FLOAT: *FIELD(obj, e, float) = 0.0f; break;
    case CORE_CFG_DOUBLE: *FIELD(obj, e, double) = 0.0; break;
    case CORE_CFG_BOOL: *FIELD(obj, e, bool) = false; break;
    case CORE_CFG_STRING: *FIELD(obj, e, char *) = NULL; break;
    case CORE_CFG_STRINGS: *FIELD(obj, e, core_cfg_strings) = (core_cfg_strings){0, NULL}; break;
    case CORE_CFG_INTS: *FIELD(obj, e, core_cfg_ints) = (core_cfg_ints){0, NULL}; break;
    case CORE_CFG_DOUBLES: *FIELD(obj, e, core_cfg_doubles) = (core_cfg_doubles){0, NULL}; break;
    case CORE_CFG_TREE: *FIELD(obj, e, core_cfg_node *) = NULL; break;
    }
}

static void free_field(const core_cfg_entry *e, void *obj) {
    switch (e->type) {
    case CORE_CFG_STRING: free(*FIELD(obj, e, char *)); break;
    case CORE_CFG_STRINGS: {
        core_cfg_strings *l = FIELD(obj, e, core_cfg_strings);
        for (int i = 0; i < l->n; i++) free(l->v[i]);
        free(l->v);
        break;
    }
    case CORE_CFG_INTS: free(FIELD(obj, e, core_cfg_ints)->v); break;
    case CORE_CFG_DOUBLES: free(FIELD(obj, e, core_cfg_doubles)->v); break;
    case CORE_CFG_TREE: core_config_free(*FIELD(obj, e, core_cfg_node *)); break;
    default: break;
    }
    clear_field(e, obj);
}

void core_config_release(const core_cfg_entry *schema, void *obj) {
    for (const core_cfg_entry *e = schema; e->key; e++) free_field(e, obj);
}

/* ---- schema sanity ---- */

static int bad_path(const char *k) { return !*k || k[0] == '.' || k[strlen(k) - 1] == '.' || strstr(k, "..") != NULL; }

/* 1 if key lies inside section s ("rollout" contains "rollout.num_steps"); sl = strlen(s). */
static int in_section(const char *key, const char *s, size_t sl) {
    return sl == 0 || (!strncmp(key, s, sl) && key[sl] == '.');
}

static int check_schema(const core_cfg_entry *schema) {
    for (const core_cfg_entry *e = schema; e->key; e++) {
        if (bad_path(e->key)) return core_error("schema: bad key \"%s\"", e->key);
        if ((unsigned)e->type > CORE_CFG_TREE) return core_error("schema: %s: bad type %d", e->key, (int)e->type);
        for (const core_cfg_entry *o = schema; o != e; o++) {
            if (!strcmp(o->key, e->key)) return core_error("schema: key \"%s\" declared twice", e->key);
            if (in_section(o->key, e->key, strlen(e->key)) || in_section(e->key, o->key, strlen(o->key)))
                return core_error("schema: \"%s\" and \"%s\": one is a setting inside the other", o->key, e->key);
        }
    }
    return 0;
}

/* ---- did you mean ---- */

static size_t edit_distance(const char *a, size_t la, const char *b, size_t lb) {
    enum { MAXL = 128 };
    if (la > MAXL || lb > MAXL) return (size_t)-1;
    size_t row[MAXL + 1];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static const char *last_seg(const char *s, size_t len, size_t *seglen) {
    size_t i = len;
    while (i > 0 && s[i - 1] != '.') i--;
    *seglen = len - i;
    return s + i;
}

/* Writes into buf the schema key or section closest to the unknown path p, or "" when none is close. Candidates
 * are every key and every section prefix; a candidate with the same last name in another section counts as one
 * edit ("rollout.seed" -> "data.seed"). */
static void suggest(const core_cfg_entry *schema, const char *p, char *buf, size_t cap) {
    size_t best = (size_t)-1, lp = strlen(p), pl;
    const char *pseg = last_seg(p, lp, &pl);
    buf[0] = '\0';
    for (const core_cfg_entry *e = schema; e->key; e++) {
        size_t kl = strlen(e->key);
        for (size_t end = 1; end <= kl; end++) {
            if (end < kl && e->key[end] != '.') continue;
            size_t cl;
            const char *cseg = last_seg(e->key, end, &cl);
            size_t d = edit_distance(p, lp, e->key, end);
            size_t d2 = edit_distance(pseg, pl, cseg, cl);
            if (d2 != (size_t)-1 && d2 + 1 < d) d = d2 + 1;
            if (d < best) {
                best = d;
                snprintf(buf, cap, "%.*s", (int)end, e->key);
            }
        }
    }
    if (best > 2 && best > pl / 3) buf[0] = '\0';
}

/* ---- unknown keys ---- */

static const core_cfg_entry *find_entry(const core_cfg_entry *schema, const char *key) {
    for (const core_cfg_entry *e = schema; e->key; e++)
        if (!strcmp(e->key, key)) return e;
    return NULL;
}

static int is_section(const core_cfg_entry *schema, const char *p) {
    size_t l = strlen(p);
    for (const core_cfg_entry *e = schema; e->key; e++)
        if (in_section(e->key, p, l)) return 1;
    return 0;
}

/* Every key of map (at schema-relative path prefix) must be a setting or a section leading to one. */
static int check_keys(const core_cfg_node *map, const char *prefix, const core_cfg_entry *schema) {
    for (int i = 0; i < map->n; i++) {
        const char *k = map->keys[i];
        const core_cfg_node *c = map->items[i];
        if (strchr(k, '.') || !*k)
            return core_error("%s: key \"%s\" is not a plain name; write nested maps instead of dotted keys", c->where,
                              k);
        char p[512];
        if (snprintf(p, sizeof p, "%s%s%s", prefix, *prefix ? "." : "", k) >= (int)sizeof p)
            return core_error("%s: key path \"%s\" too long", c->where, c->path);
        if (find_entry(schema, p)) continue;
        if (is_section(schema, p)) {
            if (c->kind == CORE_NODE_MAP) {
                if (check_keys(c, p, schema)) return -1;
            } else if (!core_config_is_null(c))
                return core_cfgi_type_error(c, "a map of settings (it is a section)");
            continue;
        }
        char hint[512];
        suggest(schema, p, hint, sizeof hint);
        if (hint[0]) return core_error("%s: unknown key \"%s\" (did you mean \"%s\"?)", c->where, c->path, hint);
        return core_error("%s: unknown key \"%s\"", c->where, c->path);
    }
    return 0;
}

/* ---- conversion ---- */

static const char *shown(const core_cfg_node *n) { return n->kind == CORE_NODE_SCALAR ? n->text : "?"; }

static int check_bounds(const core_cfg_entry *e, const core_cfg_node *n, double v) {
    const char *msg = NULL;
    double lim = 0;
    /* Written so that NaN fails every bound; the first bound that fails is reported. */
    if ((e->flags & CORE_CFG_MIN) && !(v >= e->min)) {
        msg = ">=";
        lim = e->min;
    } else if ((e->flags & CORE_CFG_MIN_OPEN) && !(v > e->min)) {
        msg = ">";
        lim = e->min;
    } else if ((e->flags & CORE_CFG_MAX) && !(v <= e->max)) {
        msg = "<=";
        lim = e->max;
    } else if ((e->flags & CORE_CFG_MAX_OPEN) && !(v < e->max)) {
        msg = "<";
        lim = e->max;
    }
    if (!msg) return 0;
    /* the bound's shortest text that reads back as it: 1e-30 (not 1.0000000000000001e-30), 1000 (not 1e+03) */
    char lb[40] = "", t[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*g", p, lim);
        if (strtod(t, NULL) == lim && (!*lb || strlen(t) < strlen(lb))) memcpy(lb, t, sizeof t);
    }
    return core_error("%s: %s: must be %s %s, got %s", n->where, n->path, msg, lb, shown(n));
}

static int check_choice(const core_cfg_entry *e, const core_cfg_node *n, const char *s) {
    if (!e->choices) return 0;
    size_t l = strlen(s);
    for (const char *c = e->choices; *c;) {
        size_t cl = strcspn(c, "|");
        if (cl == l && !strncmp(c, s, l)) return 0;
        c += cl + (c[cl] == '|');
    }
    return core_error("%s: %s: must be one of %s, got \"%s\"", n->where, n->path, e->choices, s);
}

/* One number of an INT, INT64, FLOAT or DOUBLE entry (or list element), bounds checked; *out as a double. */
static int number(const core_cfg_entry *e, const core_cfg_node *n, core_cfg_type t, int64_t *iv, double *dv) {
    if (t == CORE_CFG_INT || t == CORE_CFG_INT64 || t == CORE_CFG_INTS) {
        if (core_config_as_int(n, iv)) return -1;
        if (t == CORE_CFG_INT && (*iv < INT_MIN || *iv > INT_MAX))
            return core_error("%s: %s: %s is out of range for a 32-bit integer", n->where, n->path, n->text);
        return check_bounds(e, n, (double)*iv);
    }
    if (core_config_as_double(n, dv)) return -1;
    if (t == CORE_CFG_FLOAT) {
        if (isfinite(*dv) && fabs(*dv) > FLT_MAX)
            return core_error("%s: %s: %s is out of range for a float", n->where, n->path, n->text);
        *dv = (float)*dv; /* bounds apply to the value stored */
    }
    return check_bounds(e, n, *dv);
}

static int convert(const core_cfg_entry *e, const core_cfg_node *n, void *obj) {
    int64_t iv = 0;
    double dv = 0;
    switch (e->type) {
    case CORE_CFG_INT:
    case CORE_CFG_INT64:
    case CORE_CFG_FLOAT:
    case CORE_CFG_DOUBLE:
        if (number(e, n, e->type, &iv, &dv)) return -1;
        if (e->type == CORE_CFG_INT) *FIELD(obj, e, int) = (int)iv;
        if (e->type == CORE_CFG_INT64) *FIELD(obj, e, int64_t) = iv;
        if (e->type == CORE_CFG_FLOAT) *FIELD(obj, e, float) = (float)dv;
        if (e->type == CORE_CFG_DOUBLE) *FIELD(obj, e, double) = dv;
        return 0;
    case CORE_CFG_BOOL: return core_config_as_bool(n, FIELD(obj, e, bool));
    case CORE_CFG_STRING: {
        const char *s;
        if (core_config_as_string(n, &s)) return -1;
        if (!s) {
            /* null (or an empty --set) is "no value": allowed only where the key has no default and no choices */
            if ((e->flags & CORE_CFG_REQUIRED) || (e->def && *e->def) || e->choices)
                return core_error("%s: %s: a value is required, got null%s%s%s", n->where, n->path,
                                  e->choices ? " (one of " : "", e->choices ? e->choices : "", e->choices ? ")" : "");
            return 0;
        }
        if (check_choice(e, n, s)) return -1;
        if (!(*FIELD(obj, e, char *) = strdup(s))) return core_error("%s: out of memory", n->path);
        return 0;
    }
    case CORE_CFG_TREE:
        if (core_config_is_null(n)) return 0;
        return (*FIELD(obj, e, core_cfg_node *) = core_config_copy(n)) ? 0 : -1;
    case CORE_CFG_STRINGS:
    case CORE_CFG_INTS:
    case CORE_CFG_DOUBLES: break;
    }
    /* Lists. */
    const char *what = e->type == CORE_CFG_STRINGS ? "a list of strings"
                       : e->type == CORE_CFG_INTS  ? "a list of integers"
                                                   : "a list of numbers";
    if (n->kind != CORE_NODE_SEQ) return core_cfgi_type_error(n, what);
    size_t esize = e->type == CORE_CFG_STRINGS ? sizeof(char *)
                   : e->type == CORE_CFG_INTS  ? sizeof(int64_t)
                                               : sizeof(double);
    void *v = calloc(n->n ? (size_t)n->n : 1, esize);
    if (!v) return core_error("%s: out of memory", n->path);
    /* Hand the array to the field first so free_field cleans up after a bad element. */
    if (e->type == CORE_CFG_STRINGS) *FIELD(obj, e, core_cfg_strings) = (core_cfg_strings){0, v};
    if (e->type == CORE_CFG_INTS) *FIELD(obj, e, core_cfg_ints) = (core_cfg_ints){0, v};
    if (e->type == CORE_CFG_DOUBLES) *FIELD(obj, e, core_cfg_doubles) = (core_cfg_doubles){0, v};
    for (int i = 0; i < n->n; i++) {
        const core_cfg_node *it = n->items[i];
        if (e->type == CORE_CFG_STRINGS) {
            const char *s;
            if (core_config_as_string(it, &s)) return -1;
            if (!s) return core_cfgi_type_error(it, "a string");
            if (check_choice(e, it, s)) return -1;
            if (!(((char **)v)[i] = strdup(s))) return core_error("%s: out of memory", it->path);
            FIELD(obj, e, core_cfg_strings)->n = i + 1;
        } else if (e->type == CORE_CFG_INTS) {
            if (number(e, it, CORE_CFG_INTS, &iv, &dv)) return -1;
            ((int64_t *)v)[i] = iv;
            FIELD(obj, e, core_cfg_ints)->n = i + 1;
        } else {
            if (number(e, it, CORE_CFG_DOUBLES, &iv, &dv)) return -1;
            ((double *)v)[i] = dv;
            FIELD(obj, e, core_cfg_doubles)->n = i + 1;
        }
    }
    return 0;
}

/* Converts the entry's default text; errors say "schema default" and the key. */
static int apply_default(const core_cfg_entry *e, void *obj) {
    core_cfg_node *t;
    const char *text = *e->def ? e->def : "null";
    if (core_config_load_string(text, strlen(text), "schema default", &t))
        return core_error_push("schema: %s: ", e->key);
    int rc = core_cfgi_retarget(t, e->key, "schema default");
    if (rc == 0)
        rc = convert(e, t, obj);
    else
        core_error("schema: out of memory");
    core_config_free(t);
    if (rc) free_field(e, obj);
    return rc;
}

int core_config_apply(const core_cfg_node *root, const core_cfg_entry *schema, void *obj) {
    for (const core_cfg_entry *e = schema; e->key; e++) clear_field(e, obj);
    if (check_schema(schema)) return -1;
    if (root->kind != CORE_NODE_MAP && !core_config_is_null(root))
        return core_cfgi_type_error(root, "a map of settings");
    if (root->kind == CORE_NODE_MAP && check_keys(root, "", schema)) return -1;
    for (const core_cfg_entry *e = schema; e->key; e++) {
        const core_cfg_node *n = root->kind == CORE_NODE_MAP ? core_config_get(root, e->key) : NULL;
        if (n) {
            if (convert(e, n, obj)) {
                free_field(e, obj);
                return -1;
            }
        } else if (e->flags & CORE_CFG_REQUIRED) {
            if (*root->path) return core_error("%s: missing required key \"%s.%s\"", root->where, root->path, e->key);
            return core_error("%s: missing required key \"%s\"", root->where, e->key);
        } else if (e->def && apply_default(e, obj))
            return -1;
    }
    return 0;
}

/* ---- dump ---- */

/* Shortest decimal that reads back (through strtod, then a cast for floats) as v; always marked as a float. */
static void write_real(double v, int is_float, FILE *f) {
    if (isnan(v)) {
        fputs(".nan", f);
        return;
    }
    if (isinf(v)) {
        fputs(v < 0 ? "-.inf" : ".inf", f);
        return;
    }
    char buf[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        double back = strtod(buf, NULL);
        if (is_float ? (float)back == (float)v : back == v) break;
    }
    fputs(buf, f);
    if (!strpbrk(buf, ".e")) fputs(".0", f);
}

static void write_value(const core_cfg_entry *e, const void *obj, FILE *f) {
    switch (e->type) {
    case CORE_CFG_INT: fprintf(f, "%d", *CFIELD(obj, e, int)); return;
    case CORE_CFG_INT64: fprintf(f, "%lld", (long long)*CFIELD(obj, e, int64_t)); return;
    case CORE_CFG_FLOAT: write_real(*CFIELD(obj, e, float), 1, f); return;
    case CORE_CFG_DOUBLE: write_real(*CFIELD(obj, e, double), 0, f); return;
    case CORE_CFG_BOOL: fputs(*CFIELD(obj, e, bool) ? "true" : "false", f); return;
    case CORE_CFG_STRING: {
        const char *s = *CFIELD(obj, e, char *);
        if (s)
            core_config_write_string(s, f);
        else
            fputs("null", f);
        return;
    }
    case CORE_CFG_TREE: {
        const core_cfg_node *t = *CFIELD(obj, e, core_cfg_node *);
        if (t)
            core_config_write_flow(t, f);
        else
            fputs("null", f);
        return;
    }
    case CORE_CFG_STRINGS:
    case CORE_CFG_INTS:
    case CORE_CFG_DOUBLES: break;
    }
    fputc('[', f);
    if (e->type == CORE_CFG_STRINGS) {
        const core_cfg_strings *l = CFIELD(obj, e, core_cfg_strings);
        for (int i = 0; i < l->n; i++) {
            if (i) fputs(", ", f);
            core_config_write_string(l->v[i], f);
        }
    } else if (e->type == CORE_CFG_INTS) {
        const core_cfg_ints *l = CFIELD(obj, e, core_cfg_ints);
        for (int i = 0; i < l->n; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)l->v[i]);
    } else {
        const core_cfg_doubles *l = CFIELD(obj, e, core_cfg_doubles);
        for (int i = 0; i < l->n; i++) {
            if (i) fputs(", ", f);
            write_real(l->v[i], 0, f);
        }
    }
    fputc(']', f);
}

/* Writes the settings inside section prefix (length plen; 0 for the top) at the given indent, each section once,
 * in the order its first setting appears in the schema. */
static void dump_section(const core_cfg_entry *schema, const void *obj, const char *prefix, size_t plen, int indent,
                         FILE *f) {
    for (const core_cfg_entry *e = schema; e->key; e++) {
        if (plen && (strncmp(e->key, prefix, plen) || e->key[plen] != '.')) continue;
        const char *rest = e->key + (plen ? plen + 1 : 0);
        size_t sl = strcspn(rest, ".");
        int seen = 0;
        for (const core_cfg_entry *o = schema; o != e && !seen; o++) {
            if (plen && (strncmp(o->key, prefix, plen) || o->key[plen] != '.')) continue;
            const char *orest = o->key + (plen ? plen + 1 : 0);
            seen = strcspn(orest, ".") == sl && !strncmp(orest, rest, sl);
        }
        if (seen) continue;
        fprintf(f, "%*s%.*s:", indent, "", (int)sl, rest);
        if (!rest[sl]) {
            fputc(' ', f);
            write_value(e, obj, f);
            fputc('\n', f);
        } else {
            fputc('\n', f);
            dump_section(schema, obj, e->key, (size_t)(rest - e->key) + sl, indent + 2, f);
        }
    }
}

int core_config_dump(const core_cfg_entry *schema, const void *obj, FILE *f) {
    dump_section(schema, obj, "", 0, 0, f);
    return ferror(f) ? core_error("config dump: write failed") : 0;
}

void core_config_help(const core_cfg_entry *schema, FILE *f) {
    for (const core_cfg_entry *e = schema; e->key; e++) {
        fprintf(f, "  %-34s %-16s", e->key, type_name(e->type));
        if (e->flags & CORE_CFG_REQUIRED)
            fputs(" required", f);
        else if (e->def)
            fprintf(f, " default %s", *e->def ? e->def : "null");
        if (e->flags & (CORE_CFG_MIN | CORE_CFG_MIN_OPEN))
            fprintf(f, ", %s %g", e->flags & CORE_CFG_MIN ? ">=" : ">", e->min);
        if (e->flags & (CORE_CFG_MAX | CORE_CFG_MAX_OPEN))
            fprintf(f, ", %s %g", e->flags & CORE_CFG_MAX ? "<=" : "<", e->max);
        if (e->choices) fprintf(f, ", one of %s", e->choices);
        if (e->help) fprintf(f, "  (%s)", e->help);
        fputc('\n', f);
    }
}
