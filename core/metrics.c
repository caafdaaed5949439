/* core/metrics.c — JSON-lines metrics writer on jansson; see metrics.h. */
#include "core/metrics.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct core_metrics {
    FILE *f;
    char *path;
    json_t *row;
};

int core_metrics_open(core_metrics **out, const char *path, int append) {
    *out = NULL;
    core_metrics *m = calloc(1, sizeof *m);
    if (!m) return core_error("metrics %s: out of memory", path);
    m->f = fopen(path, append ? "a" : "w");
    if (!m->f) {
        int e = errno;
        free(m);
        return core_error("metrics %s: cannot open: %s", path, strerror(e));
    }
    m->path = strdup(path);
    m->row = json_object();
    if (!m->path || !m->row) {
        core_metrics_close(m);
        return core_error("metrics %s: out of memory", path);
    }
    *out = m;
    return 0;
}

/* Adds value (a new reference, or NULL if jansson could not make it) under key; refuses a repeated key. */
static int add(core_metrics *m, const char *key, json_t *value) {
    if (!value) return core_error("metrics %s: cannot encode the value of \"%s\"", m->path, key);
    if (json_object_get(m->row, key)) {
        json_decref(value);
        return core_error("metrics %s: key \"%s\" added twice to one row", m->path, key);
    }
    if (json_object_set_new(m->row, key, value) != 0)
        return core_error("metrics %s: cannot add key \"%s\" (not UTF-8?)", m->path, key);
    return 0;
}

int core_metrics_f64(core_metrics *m, const char *key, double value) {
    return add(m, key, isfinite(value) ? json_real(value) : json_null());
}

int core_metrics_i64(core_metrics *m, const char *key, int64_t value) {
    return add(m, key, json_integer((json_int_t)value));
}

int core_metrics_str(core_metrics *m, const char *key, const char *value) {
    if (!value) return add(m, key, json_null());
    json_t *s = json_string(value);
    if (!s) return core_error("metrics %s: value of \"%s\" is not valid UTF-8", m->path, key);
    return add(m, key, s);
}

void core_metrics_clear_row(core_metrics *m) { json_object_clear(m->row); }

/* Fewest significant digits (1..17) whose %g form reads back as v, so 0.1 prints as 0.1, not
 * 0.10000000000000001, and every double still round-trips. */
static int shortest_precision(double v) {
    char buf[40];
    for (int p = 1; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return p;
    }
    return 17;
}

/* Appends the JSON text of one value (or key, as a JSON string) to the growing line. */
static int append_json(char **line, size_t *len, json_t *v, size_t flags) {
    char *t = json_dumps(v, flags | JSON_ENCODE_ANY | JSON_COMPACT);
    if (!t) return -1;
    size_t n = strlen(t);
    char *grown = realloc(*line, *len + n + 3);
    if (!grown) {
        free(t);
        return -1;
    }
    memcpy(grown + *len, t, n);
    *len += n;
    *line = grown;
    free(t);
    return 0;
}

int core_metrics_write_row(core_metrics *m) {
    /* Built field by field (not json_dumps of the object) so each real gets its own shortest precision; jansson
     * still writes every token, so escaping is its. Objects iterate in insertion order (jansson >= 2.8). */
    size_t len = 1;
    char *line = malloc(3);
    int rc = 0, first = 1;
    const char *key;
    json_t *value;
    if (!line) {
        json_object_clear(m->row);
        return core_error("metrics %s: out of memory", m->path);
    }
    line[0] = '{';
    json_object_foreach(m->row, key, value) {
        if (!first) line[len++] = ',';
        first = 0;
        json_t *k = json_string(key);
        size_t prec = json_is_real(value) ? JSON_REAL_PRECISION(shortest_precision(json_real_value(value))) : 0;
        if (!k || append_json(&line, &len, k, 0) != 0) rc = -1;
        json_decref(k);
        if (rc == 0) line[len++] = ':';
        if (rc == 0 && append_json(&line, &len, value, prec) != 0) rc = -1;
        if (rc) break;
    }
    json_object_clear(m->row);
    if (rc) {
        free(line);
        return core_error("metrics %s: cannot encode the row", m->path);
    }
    line[len++] = '}';
    line[len++] = '\n';
    if (fwrite(line, 1, len, m->f) != len || fflush(m->f) != 0)
        rc = core_error("metrics %s: write failed: %s", m->path, strerror(errno));
    free(line);
    return rc;
}

int core_metrics_close(core_metrics *m) {
    if (!m) return 0;
    int rc = 0;
    if (m->f && fclose(m->f) != 0) rc = core_error("metrics %s: close failed: %s", m->path, strerror(errno));
    json_decref(m->row);
    free(m->path);
    free(m);
    return rc;
}
