/* tests/test_log_metrics.c — log line format, levels and rank prefix; metrics.jsonl rows read back with jansson. */
#include <jansson.h>
#include <omp.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/metrics.h"
#include "tests/test.h"


TEST(log_format_levels_rank) {
    char path[600], buf[8192];
    snprintf(path, sizeof path, "%s/log.txt", test_tmpdir());
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    core_log_level saved = core_log_get_level();
    core_log_set_stream(f);
    core_log_set_level(CORE_LOG_INFO);
    core_log_debug("hidden %d", 1);
    core_log_info("step %d reward %.2f", 3, 0.5);
    core_log_set_rank(2);
    core_log_warn("slow rank\n");
    core_log_set_level(CORE_LOG_ERROR);
    core_log_warn("hidden too");
    core_log_error("failed: %s", "x");
    core_log_set_rank(-1);
    core_log_set_level(CORE_LOG_OFF);
    core_log_error("nothing at off");
    core_log_set_stream(NULL);
    core_log_set_level(saved);
    fclose(f);
    REQUIRE(test_slurp(path, buf, sizeof buf) > 0);
    CHECK(strstr(buf, "hidden") == NULL && strstr(buf, "nothing") == NULL);
    /* Exactly three lines, each "[    s.sss] [rank R] LEVEL message". */
    char *lines[4] = {0};
    int nl = 0;
    for (char *s = strtok(buf, "\n"); s && nl < 4; s = strtok(NULL, "\n")) lines[nl++] = s;
    REQUIRE(nl == 3);
    double t;
    char rest[256];
    CHECK(sscanf(lines[0], "[%lf] %255[^\n]", &t, rest) == 2 && t >= 0 && t < 3600);
    CHECK(!strcmp(rest, "INFO  step 3 reward 0.50"));
    CHECK(lines[0][0] == '[' && lines[0][11] == ']');
    CHECK(sscanf(lines[1], "[%lf] %255[^\n]", &t, rest) == 2);
    CHECK(!strcmp(rest, "[rank 2] WARN  slow rank"));
    CHECK(sscanf(lines[2], "[%lf] %255[^\n]", &t, rest) == 2);
    CHECK(!strcmp(rest, "[rank 2] ERROR failed: x"));
}

TEST(log_level_names) {
    core_log_level lv;
    REQUIRE_OK(core_log_level_from_name("DEBUG", &lv));
    CHECK(lv == CORE_LOG_DEBUG);
    REQUIRE_OK(core_log_level_from_name("warning", &lv));
    CHECK(lv == CORE_LOG_WARN);
    REQUIRE_OK(core_log_level_from_name("off", &lv));
    CHECK(lv == CORE_LOG_OFF);
    CHECK(core_log_level_from_name("verbose", &lv) == -1);
    CHECK(strstr(core_last_error(), "\"verbose\"") != NULL);
}

/* Lines from many threads (and one longer than the 1 KiB stack buffer) arrive whole. */
TEST(log_threads_whole_lines) {
    char path[600];
    snprintf(path, sizeof path, "%s/log.txt", test_tmpdir());
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    core_log_level saved = core_log_get_level();
    core_log_set_stream(f);
    core_log_set_level(CORE_LOG_INFO);
    char longmsg[3000];
    memset(longmsg, 'x', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = '\0';
#pragma omp parallel for num_threads(2)
    for (int i = 0; i < 400; i++) core_log_info("thread line %d %s", i, i == 7 ? longmsg : "end");
    core_log_set_stream(NULL);
    core_log_set_level(saved);
    fclose(f);
    static char buf[1 << 16];
    REQUIRE(test_slurp(path, buf, sizeof buf) > 0);
    int count = 0, bad = 0;
    for (char *s = strtok(buf, "\n"); s; s = strtok(NULL, "\n")) {
        count++;
        int i;
        char tail[3001];
        if (sscanf(strstr(s, "thread line") ? strstr(s, "thread line") : "", "thread line %d %3000s", &i, tail) != 2)
            bad++;
        else if (i == 7 ? strcmp(tail, longmsg) != 0 : strcmp(tail, "end") != 0)
            bad++;
    }
    CHECK(count == 400);
    CHECK(bad == 0);
}

TEST(metrics_rows_read_back) {
    char path[600], buf[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", test_tmpdir());
    core_metrics *m;
    REQUIRE_OK(core_metrics_open(&m, path, 0));
    REQUIRE_OK(core_metrics_i64(m, "step", 1));
    REQUIRE_OK(core_metrics_f64(m, "reward/mean", 0.1));
    REQUIRE_OK(core_metrics_f64(m, "loss", NAN));
    REQUIRE_OK(core_metrics_f64(m, "kl", -INFINITY));
    REQUIRE_OK(core_metrics_f64(m, "lr", 3e-05));
    REQUIRE_OK(core_metrics_f64(m, "one", 1.0));
    REQUIRE_OK(core_metrics_str(m, "note", "quote \" backslash \\ newline \n tab \t caf\xc3\xa9"));
    REQUIRE_OK(core_metrics_i64(m, "big", INT64_MAX));
    CHECK(core_metrics_f64(m, "step", 2.0) == -1);
    CHECK(strstr(core_last_error(), "\"step\" added twice") != NULL);
    REQUIRE_OK(core_metrics_write_row(m));
    REQUIRE_OK(core_metrics_write_row(m)); /* empty row */
    REQUIRE_OK(core_metrics_i64(m, "step", 2));
    REQUIRE_OK(core_metrics_f64(m, "x", 1.0 / 3.0));
    REQUIRE_OK(core_metrics_write_row(m));
    /* Flushed per row: readable before close. */
    REQUIRE(test_slurp(path, buf, sizeof buf) > 0);
    REQUIRE_OK(core_metrics_close(m));

    char *line0 = strtok(buf, "\n"), *line1 = strtok(NULL, "\n"), *line2 = strtok(NULL, "\n");
    REQUIRE(line0 && line1 && line2 && !strtok(NULL, "\n"));
    const char *want0 = "{\"step\":1,\"reward/mean\":0.1,\"loss\":null,\"kl\":null,\"lr\":3e-5,\"one\":1.0,";
    CHECK_MSG(!strncmp(line0, want0, strlen(want0)), "line 0: %s", line0);
    CHECK(!strcmp(line1, "{}"));
    json_error_t err;
    json_t *o = json_loads(line0, JSON_REJECT_DUPLICATES, &err);
    REQUIRE(o);
    CHECK(json_integer_value(json_object_get(o, "step")) == 1);
    CHECK(json_real_value(json_object_get(o, "reward/mean")) == 0.1);
    CHECK(json_is_null(json_object_get(o, "loss")) && json_is_null(json_object_get(o, "kl")));
    CHECK(json_real_value(json_object_get(o, "lr")) == 3e-05);
    CHECK(json_is_real(json_object_get(o, "one")));
    CHECK(
        !strcmp(json_string_value(json_object_get(o, "note")), "quote \" backslash \\ newline \n tab \t caf\xc3\xa9"));
    CHECK(json_integer_value(json_object_get(o, "big")) == INT64_MAX);
    json_decref(o);
    o = json_loads(line2, 0, &err);
    REQUIRE(o);
    CHECK(json_real_value(json_object_get(o, "x")) == 1.0 / 3.0); /* shortest form still round-trips */
    json_decref(o);

    /* Append keeps the old lines; truncate drops them. */
    REQUIRE_OK(core_metrics_open(&m, path, 1));
    REQUIRE_OK(core_metrics_i64(m, "step", 3));
    REQUIRE_OK(core_metrics_write_row(m));
    REQUIRE_OK(core_metrics_close(m));
    REQUIRE(test_slurp(path, buf, sizeof buf) > 0);
    int nl = 0;
    for (char *s = buf; *s; s++) nl += *s == '\n';
    CHECK(nl == 4);
    CHECK(strstr(buf, "{\"step\":3}\n") != NULL);
    REQUIRE_OK(core_metrics_open(&m, path, 0));
    REQUIRE_OK(core_metrics_close(m));
    CHECK(test_slurp(path, buf, sizeof buf) == 0);
}

TEST(metrics_errors) {
    core_metrics *m;
    char path[600];
    CHECK(core_metrics_open(&m, "/nonexistent-dir/metrics.jsonl", 0) == -1);
    CHECK(strstr(core_last_error(), "/nonexistent-dir/metrics.jsonl") != NULL);
    CHECK(strstr(core_last_error(), "No such file") != NULL);
    snprintf(path, sizeof path, "%s/m.jsonl", test_tmpdir());
    REQUIRE_OK(core_metrics_open(&m, path, 0));
    CHECK(core_metrics_str(m, "bad", "\xff\xfe") == -1);
    CHECK(strstr(core_last_error(), "\"bad\"") != NULL);
    REQUIRE_OK(core_metrics_str(m, "null", NULL));
    core_metrics_clear_row(m);
    REQUIRE_OK(core_metrics_str(m, "ok", "v"));
    REQUIRE_OK(core_metrics_write_row(m));
    REQUIRE_OK(core_metrics_close(m));
    char buf[256];
    REQUIRE(test_slurp(path, buf, sizeof buf) > 0);
    CHECK(!strcmp(buf, "{\"ok\":\"v\"}\n"));
    CHECK(core_metrics_close(NULL) == 0);
}

/* VGRPO_LOG_LEVEL is read at start-up: run this test binary again with it set. In the child (VGRPO_LOG_CHILD=1)
 * the test only logs; the parent checks what came out. */
TEST(log_env_level) {
    if (getenv("VGRPO_LOG_CHILD")) {
        core_log_warn("child warn");
        core_log_error("child error");
        return;
    }
    char out[4096];
    int rc =
        test_run(out, sizeof out, "VGRPO_LOG_CHILD=1 VGRPO_LOG_LEVEL=error /proc/%d/exe log_env_level", (int)getpid());
    CHECK(rc == 0);
    CHECK(strstr(out, "ERROR child error") != NULL);
    CHECK(strstr(out, "child warn") == NULL);
    rc = test_run(out, sizeof out, "VGRPO_LOG_CHILD=1 VGRPO_LOG_LEVEL=loud /proc/%d/exe log_env_level", (int)getpid());
    CHECK(rc == 0);
    CHECK(strstr(out, "WARN  VGRPO_LOG_LEVEL=\"loud\" is not debug|info|warn|error|off; using info") != NULL);
    CHECK(strstr(out, "WARN  child warn") != NULL);
}
