/* core/metrics.h — metrics.jsonl: one JSON object per line, one line per step (DESIGN.md section 7).
 *
 *   core_metrics *m;  core_metrics_open(&m, "run/metrics.jsonl", 0);
 *   core_metrics_i64(m, "step", 3);  core_metrics_f64(m, "reward/mean", 0.41);  core_metrics_write_row(m);
 *
 * Keys keep the order they were added in. Values are JSON numbers and strings (jansson does the escaping); a real
 * is printed with the fewest digits that read back as the same double (0.1, not 0.10000000000000001), and always
 * with a '.' or exponent so readers keep it a float. NaN and +-Inf have no JSON form: they are
 * written as null, so a reader sees a missing value rather than an unparsable line. Each row is written with one
 * fwrite and flushed, so a crash loses at most the row being built. Not thread-safe: one writer per file. */
#ifndef CORE_METRICS_H
#define CORE_METRICS_H

#include <stdint.h>

typedef struct core_metrics core_metrics;

/* Opens path for writing: append != 0 keeps existing lines (resume), 0 truncates. Returns 0, or -1 with an
 * error naming the path and the OS reason. */
int core_metrics_open(core_metrics **out, const char *path, int append);

/* Add one field to the row being built. Return 0, or -1 if key is already in this row (named in the error), or
 * on out of memory. A NULL string value is written as null. Key and string are copied; they must be UTF-8. */
int core_metrics_f64(core_metrics *m, const char *key, double value);
int core_metrics_i64(core_metrics *m, const char *key, int64_t value);
int core_metrics_str(core_metrics *m, const char *key, const char *value);

/* Writes the row as one line ("{...}\n"), flushes, and starts an empty row. An empty row writes "{}". Returns 0,
 * or -1 if encoding or writing fails (error names the path). */
int core_metrics_write_row(core_metrics *m);

/* Drops the fields added since the last write. */
void core_metrics_clear_row(core_metrics *m);

/* Closes the file (a row not written is discarded). Returns 0, or -1 if the final close fails. NULL is allowed. */
int core_metrics_close(core_metrics *m);

#endif
