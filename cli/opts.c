/* cli/opts.c — the subcommands' option parser and usage writer; the contract is in cli/opts.h. */
#include "cli/opts.h"
#include "core/error.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define USAGE_WRAP 100 /* the usage line wraps before this column */

static int n_pos(const opts_cmd *c) {
    int n = 0;
    while (c->pos && c->pos[n].name) n++;
    return n;
}

static const opts_spec *find_opt(const opts_cmd *c, const char *name, size_t len) {
    for (const opts_spec *o = c->opts; o && o->name; o++)
        if (strlen(o->name) == len && !strncmp(o->name, name, len)) return o;
    return NULL;
}

static int takes_value(const opts_spec *o) { return o->type != OPTS_FLAG; }

/* Appends " word" to the usage line, wrapping it under the command's name. */
static void usage_word(FILE *f, int *col, int indent, const char *word) {
    int n = (int)strlen(word);
    if (*col + 1 + n > USAGE_WRAP && *col > indent) {
        fprintf(f, "\n%*s", indent, "");
        *col = indent;
    }
    fprintf(f, " %s", word);
    *col += 1 + n;
}

/* "--name META" (or "--name" for a flag) into buf. */
static void opt_label(const opts_spec *o, char *buf, size_t cap) {
    if (takes_value(o)) snprintf(buf, cap, "--%s %s", o->name, o->meta ? o->meta : "VALUE");
    else snprintf(buf, cap, "--%s", o->name);
}

/* One "  LABEL   help" entry; help lines after the first are indented to the help column. */
static void help_entry(FILE *f, const char *label, const char *help, int width) {
    int n = fprintf(f, "  %s", label);
    if (!help || !*help) {
        fputc('\n', f);
        return;
    }
    if (n < width) fprintf(f, "%*s", width - n, "");
    else fputc(' ', f);
    for (const char *h = help; *h; h++) {
        fputc(*h, f);
        if (*h == '\n' && h[1]) fprintf(f, "%*s", width, "");
    }
    fputc('\n', f);
}

void opts_usage(const opts_cmd *c, FILE *f) {
    char buf[256];
    int col = fprintf(f, "usage: vgrpo %s", c->name), indent = col + 1, any_optional = 0;
    for (int k = 0; k < n_pos(c); k++) {
        snprintf(buf, sizeof buf, c->pos[k].required ? "%s" : "[%s]", c->pos[k].name);
        usage_word(f, &col, indent, buf);
    }
    for (const opts_spec *o = c->opts; o && o->name; o++) {
        if (!o->required) {
            any_optional = 1;
            continue;
        }
        opt_label(o, buf, sizeof buf);
        usage_word(f, &col, indent, buf);
    }
    if (any_optional) usage_word(f, &col, indent, "[options]");
    fputc('\n', f);
    if (c->about) fprintf(f, "\n%s\n", c->about);
    /* one help column for arguments and options: past the longest label, at least 20, at most 30 */
    int width = 20;
    for (int k = 0; k < n_pos(c); k++) {
        int n = 2 + (int)strlen(c->pos[k].name) + 2;
        if (n > width) width = n;
    }
    for (const opts_spec *o = c->opts; o && o->name; o++) {
        opt_label(o, buf, sizeof buf);
        int n = 2 + (int)strlen(buf) + 2;
        if (n > width) width = n;
    }
    if (width > 30) width = 30;
    if (n_pos(c)) {
        fprintf(f, "\narguments:\n");
        for (int k = 0; k < n_pos(c); k++) help_entry(f, c->pos[k].name, c->pos[k].help, width);
    }
    fprintf(f, "\noptions:\n");
    for (const opts_spec *o = c->opts; o && o->name; o++) {
        opt_label(o, buf, sizeof buf);
        help_entry(f, buf, o->help, width);
    }
    help_entry(f, "-h, --help", "this help", width);
    if (c->epilog) fprintf(f, "\n%s\n", c->epilog);
}

static int vfail(const opts_cmd *c, FILE *err, const char *fmt, va_list ap) {
    char msg[1024], safe[1024]; /* the message quotes user arguments: printed with control bytes escaped */
    vsnprintf(msg, sizeof msg, fmt, ap);
    core_text_printable(msg, safe, sizeof safe);
    fprintf(err, "vgrpo %s: %s\n\n", c->name, safe);
    opts_usage(c, err);
    return OPTS_USAGE;
}

int opts_fail(const opts_cmd *c, FILE *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(c, err, fmt, ap);
    va_end(ap);
    return rc;
}

int opts_exit_status(int rc) { return rc == OPTS_USAGE ? 2 : 0; }

static int bounded(const opts_spec *o) { return !(o->min == 0 && o->max == 0); }

/* Stores value v of option o. Returns OPTS_OK or the error (already printed). */
static int store(const opts_cmd *c, const opts_spec *o, const char *v, FILE *err) {
    char *end;
    switch (o->type) {
    case OPTS_FLAG:
        if (!o->flag) break;
        *o->flag = 1;
        return OPTS_OK;
    case OPTS_STRING:
        if (!o->str) break;
        *o->str = v;
        return OPTS_OK;
    case OPTS_INT: {
        if (!o->i) break;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || v[0] == ' ') return opts_fail(c, err, "--%s: expected an integer, got \"%s\"", o->name, v);
        double lo = bounded(o) ? o->min : INT_MIN, hi = bounded(o) ? o->max : INT_MAX;
        if (errno || (double)x < lo || (double)x > hi)
            return opts_fail(c, err, "--%s: expected an integer in %.0f..%.0f, got \"%s\"", o->name, lo, hi, v);
        *o->i = (int)x;
        return OPTS_OK;
    }
    case OPTS_DOUBLE: {
        if (!o->d) break;
        double x = strtod(v, &end);
        if (!*v || *end || v[0] == ' ' || !isfinite(x))
            return opts_fail(c, err, "--%s: expected a number, got \"%s\"", o->name, v);
        if (bounded(o) && (x < o->min || x > o->max))
            return opts_fail(c, err, "--%s: expected a number in %g..%g, got \"%s\"", o->name, o->min, o->max, v);
        *o->d = x;
        return OPTS_OK;
    }
    case OPTS_U64: {
        if (!o->u64) break;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 0);
        if (!*v || *end || errno || v[0] == '-' || v[0] == '+' || v[0] == ' ')
            return opts_fail(c, err, "--%s: expected a non-negative integer, got \"%s\"", o->name, v);
        *o->u64 = (uint64_t)x;
        return OPTS_OK;
    }
    case OPTS_LIST:
        if (!o->list) break;
        if (o->list->n >= o->list->cap)
            return opts_fail(c, err, "--%s: given more than %d times", o->name, o->list->cap);
        o->list->v[o->list->n++] = v;
        return OPTS_OK;
    }
    return opts_fail(c, err, "--%s: the option table has no destination for it (a bug in vgrpo)", o->name);
}

int opts_parse(const opts_cmd *c, int argc, char **argv, FILE *out, FILE *err) {
    int n_opts = 0, npos = n_pos(c), got_pos = 0, rc;
    while (c->opts && c->opts[n_opts].name) n_opts++;
    char given[n_opts > 0 ? n_opts : 1];
    memset(given, 0, sizeof given);
    for (int i = 1; i < argc; i++) /* help first: `--help` works whatever else is on the line */
        if (!strcmp(argv[i], "--")) break;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            opts_usage(c, out);
            return OPTS_HELP;
        }
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && !strcmp(a, "--")) {
            only_pos = 1;
            continue;
        }
        if (only_pos || a[0] != '-' || !a[1]) { /* positional ("-" alone is one, e.g. stdin) */
            if (got_pos >= npos) return opts_fail(c, err, "unexpected argument \"%s\"", a);
            *c->pos[got_pos++].dst = a;
            continue;
        }
        const char *name = a + (a[1] == '-' ? 2 : 1), *eq = a[1] == '-' ? strchr(name, '=') : NULL;
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const opts_spec *o = a[1] == '-' ? find_opt(c, name, len) : NULL;
        if (!o) return opts_fail(c, err, "unknown option \"%.*s\"", (int)(name - a + len), a);
        const char *v = NULL;
        if (!takes_value(o)) {
            if (eq) return opts_fail(c, err, "--%s: takes no value", o->name);
        } else if (eq) {
            v = eq + 1;
        } else {
            if (i + 1 >= argc || (argv[i + 1][0] == '-' && argv[i + 1][1] == '-' && argv[i + 1][2]))
                return opts_fail(c, err, "--%s: missing value", o->name);
            v = argv[++i];
        }
        if ((rc = store(c, o, v, err)) != OPTS_OK) return rc;
        given[o - c->opts] = 1;
        if (o->seen) *o->seen = 1;
    }
    for (int k = 0; k < n_opts; k++)
        if (c->opts[k].required && !given[k]) return opts_fail(c, err, "--%s is required", c->opts[k].name);
    for (int k = got_pos; k < npos; k++)
        if (c->pos[k].required) return opts_fail(c, err, "%s is required", c->pos[k].name);
    return OPTS_OK;
}
