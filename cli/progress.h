/* cli/progress.h — a progress line for long loops (sampling steps, eval videos), drawn on stderr.
 *
 * On a terminal one line is rewritten in place with '\r' (a 30-character bar), and ends with a newline at the end.
 * Elsewhere (a log file, a pipe, a test) '\r' would leave a mess, so plain lines are printed instead: one each time
 * the count passes a tenth of the total (at most 10 lines, the last one at done == total), none for done = 0:
 *
 *   terminal:  "\rgenerate: sampling steps [#########.....................] 6/20  1.3 s"
 *   otherwise: "generate: sampling steps 6/20  1.3 s\n" (at 2/20, 4/20, ..., 20/20) */
#ifndef CLI_PROGRESS_H
#define CLI_PROGRESS_H

#include <stdio.h>

/* Seconds on the monotonic clock: the t0 to pass to cli_progress. */
double cli_progress_now(void);

/* Reports `done` of `total` (0 <= done <= total) to f: label, the count and the seconds since t0
 * (cli_progress_now() when the loop began). is_tty: isatty(fileno(f)), chosen by the caller so that tests can
 * ask for either form. Call it with done = 0 before the loop and after each item; f is flushed. */
void cli_progress(FILE *f, int is_tty, const char *label, int done, int total, double t0);

#endif
