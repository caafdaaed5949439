/* tests/test_prompt_meta.c — a prompt's metadata reaches the scorers on every path (core/prompts.h
 * core_prompts_meta): a JSON-lines file whose colour is only in metadata ({"prompt": "a kite", "color": "red"})
 * trains, evaluates in the run and checks parity in local and colocated mode, and the reward is scored against the
 * metadata's colour (a metadata colour other than the prompt's changes the rewards of the same videos; the same
 * colour leaves them bit for bit as a text file's). Reading: a blank prompt and a non-string metadata value are
 * refused at file:line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/prompts.h"
#include "tests/test.h"

/* Reads dir/name after writing text there: 0 (p filled) or -1 (the error in core_last_error). */
static int read_prompts(const char *dir, const char *name, const char *text, core_prompts *p) {
    char path[700];
    test_write_text(dir, name, text);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return core_prompts_read(p, path);
}

TEST(prompts_jsonl_blank_and_non_string_metadata) {
    const char *d = test_tmpdir();
    core_prompts p;
    CHECK(read_prompts(d, "blank.jsonl", "{\"prompt\": \"a red kite\"}\n{\"prompt\": \" \\t \"}\n", &p) == -1);
    CHECK_MSG(strstr(core_last_error(), "blank.jsonl:2: \"prompt\" is blank"), "%s", core_last_error());
    CHECK(read_prompts(d, "blank.json", "[{\"prompt_en\": \"a red kite\"}, {\"prompt_en\": \"   \"}]", &p) == -1);
    CHECK_MSG(strstr(core_last_error(), "blank.json: prompt 2: \"prompt_en\" is blank"), "%s", core_last_error());
    static const struct {
        const char *value, *kind;
    } bad[] = {{"3", "a number"}, {"2.5", "a number"}, {"[\"red\"]", "a list"}, {"{\"a\": \"b\"}", "an object"},
               {"true", "true or false"}, {"null", "null"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "# comment\n{\"prompt\": \"a kite\", \"color\": \"red\"}\n\n"
                                    "{\"prompt\": \"a boat\", \"count\": %s}\n", bad[i].value);
        CHECK(read_prompts(d, "meta.jsonl", text, &p) == -1);
        CHECK_MSG(strstr(core_last_error(), "meta.jsonl:4: metadata \"count\" is") &&
                      strstr(core_last_error(), bad[i].kind) && strstr(core_last_error(), "not a string"),
                  "%s: %s", bad[i].value, core_last_error());
    }
    /* string metadata is kept, and handed on as the samples' metadata; none: NULL (nothing sent) */
    REQUIRE_OK(read_prompts(d, "ok.jsonl", "{\"prompt\": \"a kite\", \"color\": \"red\", \"n\": \"3\"}\n"
                                           "{\"prompt\": \" a boat \"}\n", &p));
    CHECK(p.n == 2 && !strcmp(p.text[1], " a boat ")); /* not blank: kept as written (the prompt hash stays) */
    const json_t *m = core_prompts_meta(&p, 0);
    CHECK(m && json_object_size(m) == 2 && !strcmp(json_string_value(json_object_get(m, "color")), "red") &&
          !strcmp(json_string_value(json_object_get(m, "n")), "3"));
    CHECK(core_prompts_meta(&p, 1) == NULL);
    core_prompts_free(&p);
    /* VBench lists: their own non-string attributes ("dimension") are not metadata, as before */
    REQUIRE_OK(read_prompts(d, "vb.json", "[{\"prompt_en\": \"a kite\", \"color_en\": \"red\", \"dimension\": "
                                          "[\"color\"]}]", &p));
    m = core_prompts_meta(&p, 0);
    CHECK(m && json_object_size(m) == 1 && !strcmp(json_string_value(json_object_get(m, "color")), "red"));
    core_prompts_free(&p);
}

/* This test's folder (test_tmpdir() + ".meta.<pid>"), created empty. */
static const char *tmpdir(void) {
    static char path[600];
    snprintf(path, sizeof path, "%s.meta.%d", test_tmpdir(), (int)getpid());
    if (test_run(NULL, 0, "rm -rf %s && mkdir -p %s", path, path)) test_fail(__FILE__, __LINE__, "cannot create %s", path);
    return path;
}

/* One GRPO step (2 prompts x 2 samples, 4 denoising steps) with the in-run eval and step videos at its start and
 * end, on prompt file dir/pf, into dir/name; the exit status, the output in out. */
static int run1(const char *dir, const char *name, const char *mode, const char *pf, char *out, size_t cap) {
    return test_run(out, cap,
                    "env OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml --set mode=%s --set model.path=%s/model "
                    "--set data.prompt_file=%s/%s --set data.eval_prompt_file=%s/%s --set logging.run_dir=%s/%s "
                    "--set rollout.num_steps=4 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=2 "
                    "--set data.eval_samples_per_prompt=1 --set logging.eval_every=1 --set logging.video_every=1 "
                    "--set checkpoint.every=0 --steps 1 2>&1",
                    test_vgrpo_bin(), mode, dir, dir, pf, dir, pf, dir, name);
}

/* The "reward" list of rewards.jsonl's first row of run dir/name, as text. */
static void rewards(const char *dir, const char *name, char *buf, size_t cap) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s/rewards.jsonl", dir, name);
    buf[0] = 0;
    if (test_slurp(path, buf, cap) < 0) return;
    char *r = strstr(buf, "\"reward\"");
    if (r) memmove(buf, r, strlen(r) + 1);
}

TEST(prompt_meta_color_trains_local_colocated) {
    const char *dir = tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], a[4096], b[4096];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 2 >/dev/null", bin, dir) == 0);
    test_write_text(dir, "only_meta.jsonl", "{\"prompt\": \"a kite\", \"color\": \"red\"}\n"
                                            "{\"prompt\": \"a boat\", \"color\": \"blue\"}\n");
    test_write_text(dir, "text.txt", "a red kite\na blue boat\n");
    test_write_text(dir, "same.jsonl", "{\"prompt\": \"a red kite\", \"color\": \"red\"}\n"
                                       "{\"prompt\": \"a blue boat\", \"color\": \"blue\"}\n");
    test_write_text(dir, "other.jsonl", "{\"prompt\": \"a red kite\", \"color\": \"green\"}\n"
                                        "{\"prompt\": \"a blue boat\", \"color\": \"yellow\"}\n");
    /* the colour only in metadata: passes --dry-run and now trains (it failed at step 0: "no colour word") */
    int rc = run1(dir, "meta_local", "local", "only_meta.jsonl", out, sizeof out);
    CHECK_MSG(rc == 0 && strstr(out, "step 0 of 1") && strstr(out, "eval @ step 1"), "local: %s", out);
    rc = run1(dir, "meta_col", "colocated", "only_meta.jsonl", out, sizeof out);
    test_run(NULL, 0, "pkill -KILL -f '[v]grpo .*%s/'; true", dir);
    CHECK_MSG(rc == 0 && strstr(out, "step 0 of 1") && strstr(out, "eval @ step 1"), "colocated: %s", out);
    rewards(dir, "meta_local", a, sizeof a), rewards(dir, "meta_col", b, sizeof b);
    CHECK_MSG(a[0] && !strcmp(a, b), "local %s\ncolocated %s", a, b);
    CHECK(test_run(out, sizeof out, "ls %s/meta_local/videos/step-*/index.json %s/meta_col/videos/step-*/index.json",
                   dir, dir) == 0);
    /* the same videos (same prompt text) scored against the metadata's colour: the same colour as the prompt's
     * gives the text file's rewards bit for bit; another colour gives other rewards */
    rc = run1(dir, "text", "local", "text.txt", out, sizeof out);
    CHECK_MSG(rc == 0, "text: %s", out);
    rc = run1(dir, "same", "local", "same.jsonl", out, sizeof out);
    CHECK_MSG(rc == 0, "same: %s", out);
    rewards(dir, "text", a, sizeof a), rewards(dir, "same", b, sizeof b);
    CHECK_MSG(a[0] && !strcmp(a, b), "text %s\nsame colour in metadata %s", a, b);
    rc = run1(dir, "other", "colocated", "other.jsonl", out, sizeof out);
    test_run(NULL, 0, "pkill -KILL -f '[v]grpo .*%s/'; true", dir);
    CHECK_MSG(rc == 0, "other: %s", out);
    rewards(dir, "other", b, sizeof b);
    CHECK_MSG(b[0] && strcmp(a, b), "text %s\nother colour in metadata %s", a, b);
    /* parity (colocated workers score the rollouts) */
    rc = test_run(out, sizeof out,
                  "env OMP_NUM_THREADS=2 %s parity recipes/tiny-cpu.yaml --set mode=colocated --set model.path=%s/model "
                  "--set data.prompt_file=%s/only_meta.jsonl --set rollout.num_steps=4 --set rollout.prompts_per_step=2 "
                  "--set rollout.samples_per_prompt=2 --set logging.run_dir=%s/parity 2>&1",
                  bin, dir, dir, dir);
    test_run(NULL, 0, "pkill -KILL -f '[v]grpo .*%s/'; true", dir);
    CHECK_MSG(rc == 0, "parity: %s", out);
    test_run(NULL, 0, "rm -rf %s", dir);
}
