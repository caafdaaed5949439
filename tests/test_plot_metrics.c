/* tests/test_plot_metrics.c — scripts/plot_metrics.py --compare (Python 3 standard library only) on two synthetic
 * runs: the cumulative seconds (time/step_s), the samples (prompts_per_step x samples_per_prompt of
 * config.resolved.yaml, else time/samples_per_s x time/step_s), the evals counted, a PNG written; and its usage
 * errors (no run, labels that do not match the runs). */
#include <stdio.h>
#include <string.h>

#include "tests/test.h"

/* run `name` in dir: 3 step rows (2 s, 3 s, 5 s) with an eval in rows 0 and 3; config.resolved.yaml when B > 0. */
static void write_run(const char *dir, const char *name, int B, int G) {
    REQUIRE(test_run(NULL, 0, "mkdir -p %s/%s", dir, name) == 0);
    REQUIRE(test_run(NULL, 0,
                     "printf '%%s\\n' "
                     "'{\"step\": 0, \"eval/reward/mean\": 0.1, \"eval/reward/se\": 0.01, \"reward/mean\": 0.1, "
                     "\"time/step_s\": 2.0, \"time/samples_per_s\": 4.0}' "
                     "'{\"step\": 1, \"reward/mean\": 0.2, \"time/step_s\": 3.0, \"time/samples_per_s\": 2.0}' "
                     "'{\"step\": 2, \"reward/mean\": 0.3, \"time/step_s\": 5.0, \"time/samples_per_s\": 2.0}' "
                     "'{\"step\": 3, \"eval/reward/mean\": 0.4, \"eval/reward/se\": 0.02}' > %s/%s/metrics.jsonl",
                     dir, name) == 0);
    if (B > 0)
        REQUIRE(test_run(NULL, 0, "printf 'mode: local\\nrollout:\\n  height: 32\\n  prompts_per_step: %d\\n  "
                         "samples_per_prompt: %d\\nreward:\\n  threads: 2\\n' > %s/%s/config.resolved.yaml", B, G, dir,
                         name) == 0);
}

TEST(plot_metrics_compare_runs) {
    const char *dir = test_tmpdir();
    char out[8192];
    write_run(dir, "a", 2, 16);
    write_run(dir, "b", 0, 0);
    int rc = test_run(out, sizeof out, "python3 scripts/plot_metrics.py --compare %s/c.png %s/a %s/b/metrics.jsonl "
                      "--labels grpo,nft --smooth 2 2>&1", dir, dir, dir);
    /* a: 32 samples a step from its config; b: 8, 6, 10 from samples_per_s x step_s */
    CHECK_MSG(rc == 0 && strstr(out, "grpo: 3 steps, 10.0 s, 96 samples, 2 evals") &&
                  strstr(out, "nft: 3 steps, 10.0 s, 24 samples, 2 evals"), "exit %d: %s", rc, out);
    char png[16];
    snprintf(out, sizeof out, "%s/c.png", dir);
    FILE *f = fopen(out, "rb");
    CHECK(f && fread(png, 1, 8, f) == 8 && !memcmp(png, "\x89PNG\r\n\x1a\n", 8));
    if (f) fclose(f);
    rc = test_run(out, sizeof out, "python3 scripts/plot_metrics.py --compare %s/d.png 2>&1", dir);
    CHECK_MSG(rc == 2 && strstr(out, "usage"), "no run: exit %d: %s", rc, out);
    rc = test_run(out, sizeof out, "python3 scripts/plot_metrics.py --compare %s/d.png %s/a %s/b --labels x 2>&1", dir,
                  dir, dir);
    CHECK_MSG(rc == 2 && strstr(out, "--labels names 1 runs, 2 given"), "labels: exit %d: %s", rc, out);
}

/* Garbled input: a value past 1e100 (whose running sums and axis spans overflow) is skipped like any non-number,
 * so the page is drawn from the rows that remain; a --smooth or --width that is not a number and an OUT.png that
 * cannot be written are usage errors (exit 2) naming them, not a Python traceback, and no half-written PNG. */
TEST(plot_metrics_garbled_values_and_bad_args) {
    const char *dir = test_tmpdir();
    char out[8192];
    write_run(dir, "a", 2, 16);
    REQUIRE(test_run(NULL, 0, "mkdir -p %s/g && printf '%%s\\n' "
                     "'{\"step\": 0, \"reward/mean\": 1e308, \"time/step_s\": 1e308, \"time/samples_per_s\": 1e300}' "
                     "'{\"step\": 1, \"reward/mean\": -1e308, \"time/step_s\": 1.0}' "
                     "'{\"step\": 2, \"reward/mean\": 0.5, \"time/step_s\": 1e308}' "
                     "'{\"step\": 3, \"reward/mean\": 0.25, \"time/step_s\": 2.0, \"time/samples_per_s\": 4.0}' "
                     "> %s/g/metrics.jsonl", dir, dir) == 0);
    int rc = test_run(out, sizeof out, "python3 scripts/plot_metrics.py --compare %s/g.png %s/a %s/g --labels a,g 2>&1",
                      dir, dir, dir);
    CHECK_MSG(rc == 0 && strstr(out, "g: 1 steps, 2.0 s, 8 samples, 0 evals"), "exit %d: %s", rc, out);
    rc = test_run(out, sizeof out, "python3 scripts/plot_metrics.py %s/g/metrics.jsonl %s/g1.png 2>&1", dir, dir);
    CHECK_MSG(rc == 0 && strstr(out, "wrote"), "single: exit %d: %s", rc, out);
    rc = test_run(out, sizeof out, "python3 scripts/plot_metrics.py --compare %s/d.png %s/a %s/a --smooth abc 2>&1", dir,
                  dir, dir);
    CHECK_MSG(rc == 2 && strstr(out, "--smooth abc: expected an integer") && !strstr(out, "Traceback"), "smooth: exit "
              "%d: %s", rc, out);
    rc = test_run(out, sizeof out, "python3 scripts/plot_metrics.py %s/a/metrics.jsonl %s/d.png --width 1.5x 2>&1", dir,
                  dir);
    CHECK_MSG(rc == 2 && strstr(out, "--width 1.5x: expected an integer"), "width: exit %d: %s", rc, out);
    rc = test_run(out, sizeof out, "python3 scripts/plot_metrics.py --compare %s/no/such/d.png %s/a %s/a 2>&1", dir, dir,
                  dir);
    CHECK_MSG(rc == 2 && strstr(out, "no/such/d.png: No such file or directory") && !strstr(out, "Traceback"),
              "out: exit %d: %s", rc, out);
    CHECK(test_run(NULL, 0, "ls %s/*.tmp* 2>/dev/null | grep -q .", dir) != 0); /* no temporary left behind */
}

/* Tick labels of a short run: the step axis of 3 steps is ticked at 0, 1, 2 (it had ticks at 0.5 and 1.5 labelled
 * "0" and "2"), and --compare's seconds axis of a 0.7 s run at tenths (they were all labelled "0" or "1"). */
TEST(plot_metrics_short_run_ticks) {
    char out[4096];
    const int rc = test_run(out, sizeof out,
                            "python3 -c 'import sys; sys.path.insert(0, \"scripts\"); import plot_metrics as pm\n"
                            "for xl, xlim, ix in ((\"step\", (0, 2), True), (\"seconds\", (0, 0.7), False)):\n"
                            "    c = pm.Canvas(1000, 400); seen = []\n"
                            "    c.text = lambda x, y, s, *a, **k: seen.append(s)\n"
                            "    pm.Panel(c, (100, 20, 800, 300), xlim, (0, 1), \"t\").axes(xl, ix)\n"
                            "    print(\"|\".join(seen[6:-2]))' 2>&1");
    CHECK_MSG(rc == 0 && !strcmp(out, "0|1|2\n0|0.1|0.2|0.3|0.4|0.5|0.6|0.7\n"), "exit %d: %s", rc, out);
}
