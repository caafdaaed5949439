/* core/log.h — process log lines on stderr: "[   12.345] [rank 1] INFO  message".
 *
 * The time is seconds since the process started (the log module's load), so lines of one run line up. Each line
 * is written with a single fwrite on a locked stream, so lines from threads never interleave. The level starts
 * at info, or at the env var VGRPO_LOG_LEVEL (debug|info|warn|error|off) when set; core_log_set_level overrides
 * it. Messages are for people; programs read metrics.jsonl (core/metrics.h). Unlike the rest of the library this
 * module prints: that is its job. */
#ifndef CORE_LOG_H
#define CORE_LOG_H

#include <stdio.h>

typedef enum { CORE_LOG_DEBUG = 0, CORE_LOG_INFO, CORE_LOG_WARN, CORE_LOG_ERROR, CORE_LOG_OFF } core_log_level;

/* Lines below this level are dropped. */
void core_log_set_level(core_log_level level);
core_log_level core_log_get_level(void);
/* Parses "debug", "info", "warn" (or "warning"), "error", "off", any case. Returns 0, or -1 with an error naming
 * the string. */
int core_log_level_from_name(const char *name, core_log_level *out);

/* Prefixes every line with "[rank R] " (R >= 0); a negative rank removes the prefix (the default). */
void core_log_set_rank(int rank);
/* Sends lines to f instead of stderr (NULL: back to stderr). For tests and for per-process log files. */
void core_log_set_stream(FILE *f);

/* Seconds since the process started, as printed in the prefix. */
double core_log_elapsed(void);

/* Writes one line at the given level (a trailing newline in fmt is not doubled). */
void core_log(core_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define core_log_debug(...) core_log(CORE_LOG_DEBUG, __VA_ARGS__)
#define core_log_info(...) core_log(CORE_LOG_INFO, __VA_ARGS__)
#define core_log_warn(...) core_log(CORE_LOG_WARN, __VA_ARGS__)
#define core_log_error(...) core_log(CORE_LOG_ERROR, __VA_ARGS__)

#endif
