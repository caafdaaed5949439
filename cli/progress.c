/* cli/progress.c — the progress line of long loops; the contract is in cli/progress.h. */
#include "cli/progress.h"

#include <time.h>

double cli_progress_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void cli_progress(FILE *f, int is_tty, const char *label, int done, int total, double t0) {
    const double secs = cli_progress_now() - t0;
    if (is_tty) {
        char bar[31];
        int k = total > 0 ? done * 30 / total : 30;
        for (int i = 0; i < 30; i++) bar[i] = i < k ? '#' : '.';
        bar[30] = 0;
        fprintf(f, "\r%s [%s] %d/%d  %.1f s", label, bar, done, total, secs);
        if (done >= total) fputc('\n', f);
    } else {
        /* a line when done passes a tenth of total, and always at the end */
        int tenth_passed = total > 0 && done > 0 && (long)done * 10 / total > (long)(done - 1) * 10 / total;
        if (done >= total || tenth_passed) fprintf(f, "%s %d/%d  %.1f s\n", label, done, total, secs);
    }
    fflush(f);
}
