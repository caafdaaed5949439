/* tests/test_progress.c — the progress line (cli/progress.h): a '\r' bar on a terminal, plain lines elsewhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/progress.h"
#include "tests/test.h"

/* The whole output of a loop of `total` items reported as a terminal (tty 1) or not, into buf. */
static void run_loop(int tty, int total, char *buf, size_t cap) {
    char *m = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&m, &n);
    double t0 = cli_progress_now();
    for (int i = 0; i <= total; i++) cli_progress(f, tty, "generate: sampling steps", i, total, t0);
    fclose(f);
    snprintf(buf, cap, "%s", m);
    free(m);
}

static int count(const char *s, char c) {
    int n = 0;
    for (; *s; s++) n += *s == c;
    return n;
}

TEST(progress_plain_lines_off_a_terminal) {
    char buf[8192];
    run_loop(0, 20, buf, sizeof buf);
    CHECK_MSG(strchr(buf, '\r') == NULL, "a '\\r' in: %s", buf);
    CHECK_MSG(count(buf, '\n') == 10, "%d lines: %s", count(buf, '\n'), buf); /* 2/20, 4/20, ..., 20/20 */
    CHECK(!strncmp(buf, "generate: sampling steps 2/20  0.0 s\n", 37));
    CHECK(strstr(buf, "generate: sampling steps 20/20  ") != NULL && strstr(buf, "1/20") == NULL);
    run_loop(0, 3, buf, sizeof buf); /* fewer items than tenths: a line each */
    CHECK(count(buf, '\n') == 3 && strstr(buf, " 1/3 ") && strstr(buf, " 3/3 ") && !strchr(buf, '\r'));
    run_loop(0, 1000, buf, sizeof buf);
    CHECK(count(buf, '\n') == 10 && strstr(buf, " 100/1000 ") && strstr(buf, " 1000/1000 "));
}

TEST(progress_bar_on_a_terminal) {
    char buf[8192];
    run_loop(1, 4, buf, sizeof buf);
    CHECK(count(buf, '\r') == 5 && count(buf, '\n') == 1 && buf[strlen(buf) - 1] == '\n');
    CHECK(!strncmp(buf, "\rgenerate: sampling steps [..............................] 0/4  ", 63));
    CHECK(strstr(buf, "\rgenerate: sampling steps [##############################] 4/4  ") != NULL);
}
