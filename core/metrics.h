/* core/metrics.h — metrics.jsonl: one JSON object per line, one line per step (docs/design.md section 7).
 *
 *   core_metrics *m;  core_metrics_open(&m, "run/metrics.jsonl", 0);
 *   core_metrics_i64(m, "step", 3);  core_metrics_f64(m, "reward/mean", 0.41);  core_metrics_write_row(m);
 *
 * Keys keep the order they were added in. Values are JSON numbers and strings (jansson does the escaping); a real
 * is printed with the fewest digits that read back as the same double (0.1, not 0.10000000000000001), and always
 * with a '.' or exponent so readers keep it a float. NaN and +-Inf have no JSON form: they are
 * written as null, so a reader sees a missing value rather than an unparsable line. Each row is built in memory and
 * written whole or not at all (core_jsonl_append below): a full disk or a file-size limit leaves the file as it was
 * before the row, and a crash mid-write leaves at most one torn last line, which core_jsonl_truncate drops on
 * resume. Not thread-safe: one writer per file.
 *
 * The core_jsonl_* functions below do the same for any other JSON-lines file written once per step (rewards.jsonl):
 *
 *   int fd;  if (core_jsonl_open(&fd, path, resumed)) return -1;
 *   ...build one row "{...}\n" in memory (snprintf, open_memstream, json_dumps)...
 *   if (core_jsonl_append(fd, row, row_len, path)) return -1;
 *   close(fd);
 *
 * and, on resume from step S, before opening:  int torn;  core_jsonl_truncate(path, S, &torn). */
#ifndef CORE_METRICS_H
#define CORE_METRICS_H

#include <stddef.h>
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

/* Writes the row as one line ("{...}\n") with core_jsonl_append, and starts an empty row. An empty row writes
 * "{}". Returns 0, or -1 if encoding or writing fails (error names the path and the OS reason; the file is as it
 * was before the row). */
int core_metrics_write_row(core_metrics *m);

/* Drops the fields added since the last write. */
void core_metrics_clear_row(core_metrics *m);

/* Closes the file (a row not written is discarded). Returns 0, or -1 if the final close fails. NULL is allowed. */
int core_metrics_close(core_metrics *m);

/* ---- JSON lines: one JSON value per line, one line per step ---- */

/* Opens path for appending rows (O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, mode 0666 before the umask); append
 * == 0 empties it first. *fd gets the descriptor (close(2) it). Returns 0, or -1 with an error naming the path and
 * the OS reason. */
int core_jsonl_open(int *fd, const char *path, int append);

/* Appends one row, whole or not at all: line[0..n) is one JSON value without a newline inside; a '\n' is added if
 * it does not end with one. It goes to the end of the file in one write(2) (continued after a short write); if the
 * row cannot be written whole (EFBIG past RLIMIT_FSIZE, ENOSPC, EIO) the file is cut back (ftruncate) to its size
 * before the row. fd must be the only writer of the file (core_jsonl_open, or any O_APPEND descriptor; for a
 * FILE*, fflush it first and pass fileno). path is only for the message. Returns 0, or -1 with an error naming the
 * path and the OS reason ("runs/x/metrics.jsonl: cannot append a row: File too large; the file is as it was
 * before the row"), or a newline inside the row. */
int core_jsonl_append(int fd, const char *line, size_t n, const char *path);

/* For a resume from step `step`: keeps the leading rows whose integer "step" is < step and drops the rest from the
 * first row that is not (a later step, no "step", not JSON). A torn last line (cut without its '\n', or not valid
 * JSON: the previous run stopped mid-write) is always dropped, and *dropped_torn (may be NULL) set to 1 so the
 * caller can say so; else 0. The file is replaced atomically (written to path.tmp, fsync'd, renamed over path;
 * its mode kept); left untouched when nothing is dropped. A missing file is fine (nothing to do). Returns 0, or -1
 * with an error naming the file and the OS reason (path itself unchanged). */
int core_jsonl_truncate(const char *path, int64_t step, int *dropped_torn);

#endif
