/* tests/test_jsonl.c — JSON-lines files (core/metrics.h): rows land whole or not at all (a file-size limit hit
 * mid-row, without root: RLIMIT_FSIZE in a forked child), and the resume cut drops later steps and a torn line. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/metrics.h"
#include "tests/test.h"


static void spit(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

/* Every line of path parses as a JSON object and the file ends with '\n'; returns the number of lines, -1 if not. */
static int whole_rows(const char *path, char *buf, size_t cap) {
    long n = test_slurp(path, buf, cap);
    if (n < 0 || (n > 0 && buf[n - 1] != '\n')) return -1;
    int rows = 0;
    for (char *s = buf, *nl; *s; s = nl + 1, rows++) {
        nl = strchr(s, '\n');
        json_error_t je;
        json_t *o = json_loadb(s, (size_t)(nl - s), 0, &je);
        int ok = json_is_object(o);
        json_decref(o);
        if (!ok) return -1;
    }
    return rows;
}

static int write_metrics_row(core_metrics *m, int64_t step) {
    if (core_metrics_i64(m, "step", step) || core_metrics_f64(m, "reward/mean", 0.25 * (double)step) ||
        core_metrics_str(m, "note", "a row long enough to be cut by the limit"))
        return -1;
    return core_metrics_write_row(m);
}

TEST(jsonl_rows_whole_under_file_size_limit) {
    const char *d = test_tmpdir();
    char mpath[600], rpath[600], epath[600], buf[8192], msg[2048];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", d);
    snprintf(rpath, sizeof rpath, "%s/rewards.jsonl", d);
    snprintf(epath, sizeof epath, "%s/errors.txt", d);
    core_metrics *m;
    REQUIRE_OK(core_metrics_open(&m, mpath, 0));
    for (int s = 0; s < 3; s++) REQUIRE_OK(write_metrics_row(m, s));
    REQUIRE_OK(core_metrics_close(m));
    struct stat sb;
    REQUIRE(stat(mpath, &sb) == 0);
    const long before = (long)sb.st_size, row = before / 3, limit = before + row + row / 2;

    /* The child may grow files only to `limit`: one more metrics row fits, the next is cut mid-row by the kernel
     * (a short write, then EFBIG). A 600-byte rewards row is cut on its first write. */
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        struct rlimit rl;
        getrlimit(RLIMIT_FSIZE, &rl);
        rl.rlim_cur = (rlim_t)limit;
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(10);
        FILE *ef = fopen(epath, "w");
        if (!ef) _exit(11);
        int wrote = 0, failed = 0;
        if (core_metrics_open(&m, mpath, 1)) _exit(12);
        for (int s = 3; s < 50 && !failed; s++) {
            if (write_metrics_row(m, s) == 0) wrote++;
            else failed = 1;
        }
        fprintf(ef, "%d %s\n", wrote, core_last_error());
        core_metrics_close(m);
        int fd;
        if (core_jsonl_open(&fd, rpath, 0)) _exit(13);
        char big[700];
        int n = snprintf(big, sizeof big, "{\"step\": 3, \"uid\": \"%0580d\"}", 7);
        int rc = core_jsonl_append(fd, big, (size_t)n, rpath);
        fprintf(ef, "%d %s\n", rc, core_last_error());
        close(fd);
        fclose(ef);
        _exit(failed && rc == -1 ? 0 : 14);
    }
    int st;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
    REQUIRE(WIFEXITED(st));
    REQUIRE(test_slurp(epath, msg, sizeof msg) > 0);
    int wrote = -1;
    CHECK(sscanf(msg, "%d", &wrote) == 1 && wrote == 1);
    char *line2 = strchr(msg, '\n');
    REQUIRE(line2);
    *line2++ = '\0';
    CHECK_MSG(strstr(msg, mpath) && strstr(msg, "File too large") && strstr(msg, "as it was before the row"),
              "metrics error: %s", msg);
    CHECK_MSG(strstr(line2, rpath) && strstr(line2, "File too large"), "rewards error: %s", line2);

    CHECK(whole_rows(mpath, buf, sizeof buf) == 4); /* the 3 rows before, the one that fit, none torn */
    REQUIRE(stat(mpath, &sb) == 0);
    CHECK(sb.st_size < limit);
    REQUIRE(stat(rpath, &sb) == 0);
    CHECK(sb.st_size == 0);
    /* The writer carries on after the limit is gone. */
    REQUIRE_OK(core_metrics_open(&m, mpath, 1));
    REQUIRE_OK(write_metrics_row(m, 4));
    REQUIRE_OK(core_metrics_close(m));
    CHECK(whole_rows(mpath, buf, sizeof buf) == 5);
}

TEST(jsonl_append_rules) {
    char path[600], buf[1024];
    snprintf(path, sizeof path, "%s/r.jsonl", test_tmpdir());
    int fd;
    REQUIRE_OK(core_jsonl_open(&fd, path, 0));
    REQUIRE_OK(core_jsonl_append(fd, "{\"step\":0}", 10, path)); /* the newline is added */
    REQUIRE_OK(core_jsonl_append(fd, "{\"step\":1}\n", 11, path));
    CHECK(core_jsonl_append(fd, "{\"a\":\n1}", 8, path) == -1);
    CHECK(strstr(core_last_error(), path) && strstr(core_last_error(), "newline inside"));
    close(fd);
    REQUIRE(test_slurp(path, buf, sizeof buf) > 0);
    CHECK(!strcmp(buf, "{\"step\":0}\n{\"step\":1}\n"));
    REQUIRE_OK(core_jsonl_open(&fd, path, 1)); /* append keeps, 0 empties */
    close(fd);
    CHECK(test_slurp(path, buf, sizeof buf) == 22);
    REQUIRE_OK(core_jsonl_open(&fd, path, 0));
    close(fd);
    CHECK(test_slurp(path, buf, sizeof buf) == 0);
    CHECK(core_jsonl_open(&fd, "/nonexistent-dir/r.jsonl", 1) == -1);
    CHECK(strstr(core_last_error(), "/nonexistent-dir/r.jsonl: cannot open: No such file") != NULL);
}

TEST(jsonl_truncate_resume_and_torn_line) {
    const char *d = test_tmpdir();
    char path[600], buf[4096], tmp[700];
    snprintf(path, sizeof path, "%s/metrics.jsonl", d);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const char *rows = "{\"step\":0,\"x\":1}\n{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n{\"step\":4}\n";
    char text[1024];
    int torn = -1;

    /* A crash mid-row: the cut last line is dropped and reported, whether or not the step rule reaches it. */
    snprintf(text, sizeof text, "%s{\"step\":5,\"x\":0.2", rows);
    spit(path, text);
    chmod(path, 0640);
    REQUIRE_OK(core_jsonl_truncate(path, 3, &torn));
    CHECK(torn == 1);
    REQUIRE(test_slurp(path, buf, sizeof buf) >= 0);
    CHECK_MSG(!strcmp(buf, "{\"step\":0,\"x\":1}\n{\"step\":1}\n{\"step\":2}\n"), "got: %s", buf);
    struct stat sb;
    REQUIRE(stat(path, &sb) == 0);
    CHECK((sb.st_mode & 0777) == 0640);
    CHECK(access(tmp, F_OK) != 0);

    spit(path, text);
    REQUIRE_OK(core_jsonl_truncate(path, 100, &torn));
    CHECK(torn == 1);
    REQUIRE(test_slurp(path, buf, sizeof buf) >= 0);
    CHECK(!strcmp(buf, rows));

    /* A last line with its newline but not JSON is torn too. */
    snprintf(text, sizeof text, "%s{\"step\":5,\"x\":}\n", rows);
    spit(path, text);
    REQUIRE_OK(core_jsonl_truncate(path, 100, &torn));
    CHECK(torn == 1);
    REQUIRE(test_slurp(path, buf, sizeof buf) >= 0);
    CHECK(!strcmp(buf, rows));

    /* A clean file with nothing to drop is left alone (same inode: not rewritten). */
    REQUIRE(stat(path, &sb) == 0);
    ino_t ino = sb.st_ino;
    REQUIRE_OK(core_jsonl_truncate(path, 5, &torn));
    CHECK(torn == 0);
    REQUIRE(stat(path, &sb) == 0);
    CHECK(sb.st_ino == ino);

    /* Stops at the first row that is not below the step, even if a lower one follows; a row without "step" stops
     * it too. */
    spit(path, "{\"step\":0}\n{\"step\":7}\n{\"step\":1}\n");
    REQUIRE_OK(core_jsonl_truncate(path, 3, &torn));
    CHECK(torn == 0);
    REQUIRE(test_slurp(path, buf, sizeof buf) >= 0);
    CHECK(!strcmp(buf, "{\"step\":0}\n"));
    spit(path, "{\"step\":0}\n{}\n{\"step\":1}\n");
    REQUIRE_OK(core_jsonl_truncate(path, 3, NULL));
    REQUIRE(test_slurp(path, buf, sizeof buf) >= 0);
    CHECK(!strcmp(buf, "{\"step\":0}\n"));

    /* Only a torn line: the file ends empty. A missing file is nothing to do. */
    spit(path, "{\"st");
    REQUIRE_OK(core_jsonl_truncate(path, 3, &torn));
    CHECK(torn == 1);
    CHECK(test_slurp(path, buf, sizeof buf) == 0);
    unlink(path);
    REQUIRE_OK(core_jsonl_truncate(path, 3, &torn));
    CHECK(torn == 0);
    CHECK(access(path, F_OK) != 0);

    /* An unreadable "file" (a folder) is named. */
    CHECK(core_jsonl_truncate(d, 3, &torn) == -1);
    CHECK_MSG(strstr(core_last_error(), d) != NULL, "got: %s", core_last_error());
}
