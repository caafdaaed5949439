/* core/metrics.c — JSON-lines metrics writer on jansson, and whole-row appends and resume cuts for any JSON-lines
 * file; see metrics.h. */
#include "core/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

struct core_metrics {
    int fd;
    char *path;
    json_t *row;
};

int core_metrics_open(core_metrics **out, const char *path, int append) {
    *out = NULL;
    core_metrics *m = calloc(1, sizeof *m);
    if (!m) return core_error("metrics %s: out of memory", path);
    if (core_jsonl_open(&m->fd, path, append)) {
        free(m);
        return core_error_push("metrics ");
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
    rc = core_jsonl_append(m->fd, line, len, m->path);
    free(line);
    return rc;
}

int core_metrics_close(core_metrics *m) {
    if (!m) return 0;
    int rc = 0;
    if (m->fd >= 0 && close(m->fd) != 0) rc = core_error("metrics %s: close failed: %s", m->path, strerror(errno));
    json_decref(m->row);
    free(m->path);
    free(m);
    return rc;
}

/* ---- JSON lines ---- */

int core_jsonl_open(int *fd, const char *path, int append) {
    *fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | (append ? 0 : O_TRUNC), 0666);
    if (*fd < 0) return core_error("%s: cannot open: %s", path, strerror(errno));
    return 0;
}

/* write(2) all n bytes, continuing after a short write or EINTR. 0, or -1 with errno set. */
static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (w == 0) {
            errno = ENOSPC; /* a regular file that takes nothing: treat as full */
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int core_jsonl_append(int fd, const char *line, size_t n, const char *path) {
    const int has_nl = n > 0 && line[n - 1] == '\n';
    if (memchr(line, '\n', has_nl ? n - 1 : n))
        return core_error("%s: cannot append a row: it has a newline inside (one JSON value per line)", path);
    char *copy = NULL;
    if (!has_nl) { /* one write for row and newline, so they land (or not) together */
        if (!(copy = malloc(n + 1))) return core_error("%s: cannot append a row: out of memory", path);
        memcpy(copy, line, n);
        copy[n++] = '\n';
        line = copy;
    }
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) != 0) {
        rc = core_error("%s: cannot append a row: %s", path, strerror(errno));
    } else if (write_all(fd, line, n) != 0) {
        /* O_APPEND and one writer: the row went (partly) to offset st_size, so cutting back there removes it. */
        int e = errno;
        while (ftruncate(fd, sb.st_size) != 0) {
            if (errno == EINTR) continue;
            rc = core_error("%s: cannot append a row: %s; cutting the file back to %lld bytes failed too (%s): its "
                            "last line may be torn (a resume drops it)",
                            path, strerror(e), (long long)sb.st_size, strerror(errno));
            break;
        }
        if (!rc) rc = core_error("%s: cannot append a row: %s; the file is as it was before the row", path, strerror(e));
    }
    free(copy);
    return rc;
}

/* Reads the whole file into a NUL-terminated buffer. 0 (with *buf, *len, *sb), 1 if it does not exist, or -1. */
static int read_whole(const char *path, char **buf, size_t *len, struct stat *sb) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 1 : core_error("%s: cannot read: %s", path, strerror(errno));
    if (fstat(fd, sb) != 0) {
        int e = errno;
        close(fd);
        return core_error("%s: cannot read: %s", path, strerror(e));
    }
    size_t cap = (size_t)sb->st_size + 1, n = 0;
    char *b = malloc(cap);
    if (!b) {
        close(fd);
        return core_error("%s: cannot read: out of memory (%lld bytes)", path, (long long)sb->st_size);
    }
    for (;;) {
        if (n + 1 == cap) { /* grew since fstat */
            char *g = realloc(b, cap * 2);
            if (!g) {
                free(b);
                close(fd);
                return core_error("%s: cannot read: out of memory", path);
            }
            b = g;
            cap *= 2;
        }
        ssize_t r = read(fd, b + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(b);
            close(fd);
            return core_error("%s: cannot read: %s", path, strerror(e));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

/* 1 if text[0..n) (no newline) is one valid JSON value. */
static int is_json(const char *text, size_t n, json_t **out) {
    json_error_t je;
    json_t *v = json_loadb(text, n, JSON_DECODE_ANY, &je);
    if (out) *out = v;
    else json_decref(v);
    return v != NULL;
}

int core_jsonl_truncate(const char *path, int64_t step, int *dropped_torn) {
    if (dropped_torn) *dropped_torn = 0;
    char *buf = NULL;
    size_t len = 0;
    struct stat sb;
    int r = read_whole(path, &buf, &len, &sb);
    if (r) return r > 0 ? 0 : -1;
    const size_t total = len;

    /* Where the last line starts, and whether it is torn. */
    size_t last = len;
    if (len > 0) {
        const char *nl = len >= 2 ? memrchr(buf, '\n', len - 1) : NULL;
        last = nl ? (size_t)(nl - buf) + 1 : 0;
        const int cut = buf[len - 1] != '\n';
        const size_t body = len - last - (cut ? 0 : 1);
        if (cut || !is_json(buf + last, body, NULL)) {
            if (dropped_torn) *dropped_torn = 1;
            len = last; /* the torn line is gone whatever the step rule says */
        }
    }
    /* Keep rows while their "step" is an integer below `step`. */
    size_t keep = 0;
    while (keep < len) {
        const char *nl = memchr(buf + keep, '\n', len - keep);
        size_t end = (size_t)(nl - buf); /* len ends on a '\n' here */
        json_t *row = NULL;
        is_json(buf + keep, end - keep, &row);
        json_t *s = json_object_get(row, "step");
        const int ok = json_is_integer(s) && json_integer_value(s) < step;
        json_decref(row);
        if (!ok) break;
        keep = end + 1;
    }
    if (keep == total) { /* nothing to drop */
        free(buf);
        return 0;
    }

    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        free(buf);
        return core_error("%.200s...: path too long", path);
    }
    unlink(tmp); /* a leftover of a cut made before: the temporary is always new (O_EXCL, never a planted link) */
    int rc = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = core_error("%s: cannot create: %s", tmp, strerror(errno));
    } else {
        if (write_all(fd, buf, keep) != 0 || fchmod(fd, sb.st_mode & 07777) != 0 || fsync(fd) != 0)
            rc = core_error("%s: write failed: %s", tmp, strerror(errno));
        if (close(fd) != 0 && !rc) rc = core_error("%s: close failed: %s", tmp, strerror(errno));
        if (!rc && rename(tmp, path) != 0)
            rc = core_error("%s: cannot replace it with %s: %s", path, tmp, strerror(errno));
        if (rc) unlink(tmp);
    }
    free(buf);
    if (!rc) { /* make the rename itself durable; a failure here loses nothing that is not already on disk */
        char dir[4200];
        snprintf(dir, sizeof dir, "%s", path);
        int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            if (fsync(dfd) != 0) {
                /* some file systems refuse fsync on a folder: the data itself is already synced */
            }
            close(dfd);
        }
    }
    return rc;
}
