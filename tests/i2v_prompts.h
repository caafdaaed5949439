/* tests/i2v_prompts.h — what the image-to-video run tests share: the prompt file (i2v_write_square_prompts), the
 * recipe overrides of their jobs (I2V_SET), a parity job that must give exactly 0 (i2v_parity_zero) and the check
 * that a local run equals a colocated one and resumes exactly (i2v_check_local_colocated_resume). */
#ifndef TESTS_I2V_PROMPTS_H
#define TESTS_I2V_PROMPTS_H

#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include <jansson.h>

#include "media/png.h"
#include "tests/metrics_rows.h"
#include "tests/parity_json.h"
#include "tests/test.h"

/* recipes/tiny-cpu.yaml on dir/model (model.path, and prompt files dir/p.jsonl for training and eval: three %s, each
 * the test's folder), 4 steps, 2 prompts x 4 samples, every step trained. */
#define I2V_SET                                                                                                     \
    "--set model.path=%s/model --set model.init_preset= --set data.prompt_file=%s/p.jsonl "                        \
    "--set data.eval_prompt_file=%s/p.jsonl --set rollout.num_steps=4 --set rollout.prompts_per_step=2 "           \
    "--set rollout.samples_per_prompt=4 --set algorithm.timestep_selection=all"

/* dir/img/<name>.png for red, green, blue and yellow (32 x 32: the colour with a 16 x 16 square of its complement in
 * the middle) and dir/p.jsonl naming them, one JSON line each {"prompt": "a <name> square", "image":
 * "img/<name>.png"} (with color_field also "color": "<name>"). */
static inline void i2v_write_square_prompts(const char *dir, int color_field) {
    static const struct {
        const char *name;
        uint8_t c[3];
    } cols[4] = {{"red", {220, 30, 30}}, {"green", {30, 200, 40}}, {"blue", {30, 40, 220}}, {"yellow", {230, 220, 30}}};
    char path[4300];
    snprintf(path, sizeof path, "%s/img", dir);
    mkdir(path, 0777);
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    uint8_t img[32 * 32 * 3];
    for (int k = 0; k < 4; k++) {
        for (int y = 0; y < 32; y++)
            for (int x = 0; x < 32; x++)
                for (int c = 0; c < 3; c++) {
                    const int in = x >= 8 && x < 24 && y >= 8 && y < 24;
                    img[(y * 32 + x) * 3 + c] = in ? (uint8_t)(255 - cols[k].c[c]) : cols[k].c[c];
                }
        snprintf(path, sizeof path, "%s/img/%s.png", dir, cols[k].name);
        REQUIRE_OK(media_png_write(path, img, 32, 32));
        if (color_field)
            fprintf(f, "{\"prompt\": \"a %s square\", \"image\": \"img/%s.png\", \"color\": \"%s\"}\n", cols[k].name,
                    cols[k].name, cols[k].name);
        else
            fprintf(f, "{\"prompt\": \"a %s square\", \"image\": \"img/%s.png\"}\n", cols[k].name, cols[k].name);
    }
    fclose(f);
}

/* `vgrpo parity` of recipes/tiny-cpu.yaml, colocated, with I2V_SET and `more` (recipe overrides) into dir/<name>, env
 * the variables set before the command ("" for none): its output (stderr too) into out, a failed job a test failure
 * quoting it, and its report exactly 0 over 4 steps (check_parity_zero). */
static inline void i2v_parity_zero(const char *env, const char *dir, const char *name, const char *more, char *out,
                                  size_t cap) {
    char p[4400];
    const int st = test_run(out, cap, "%s%s parity recipes/tiny-cpu.yaml --set mode=colocated " I2V_SET
                                      " --set logging.run_dir=%s/%s %s 2>&1", env, test_vgrpo_bin(), dir, dir, dir, dir,
                            name, more);
    if (st) test_fail(__FILE__, __LINE__, "parity into %s/%s (%s) failed: %s", dir, name, more, out);
    snprintf(p, sizeof p, "%s/%s/parity.json", dir, name);
    check_parity_zero(p, 4);
}

/* 3 steps of I2V_SET plus `more` (recipe overrides with optim.total_steps=3, checkpoint.every=2 and an eval every 2
 * steps) locally (dir/loc) and colocated (dir/col): the metrics rows equal bit for bit, log-probs recomputed exactly,
 * 32 transitions a step; 2 steps then --resume from checkpoint-2 (dir/res) give the straight run's rows. */
static inline void i2v_check_local_colocated_resume(const char *dir, const char *more) {
    const char *bin = test_vgrpo_bin();
    char out[16384], p[4300];
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml " I2V_SET " %s --set logging.run_dir=%s/loc", bin,
                      dir, dir, dir, more, dir);
    if (st) test_fail(__FILE__, __LINE__, "local run failed: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set mode=colocated " I2V_SET
                                   " %s --set logging.run_dir=%s/col", bin, dir, dir, dir, more, dir);
    if (st) test_fail(__FILE__, __LINE__, "colocated run failed: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml " I2V_SET " %s --set logging.run_dir=%s/res --steps 2",
                  bin, dir, dir, dir, more, dir);
    if (st) test_fail(__FILE__, __LINE__, "2-step run failed: %s", out);
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml " I2V_SET " %s --set logging.run_dir=%s/res "
                                   "--resume %s/res/checkpoint-2", bin, dir, dir, dir, more, dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "resumed run failed: %s", out);
    json_t *a[8], *b[8], *c[8];
    snprintf(p, sizeof p, "%s/loc/metrics.jsonl", dir);
    const int na = read_rows(p, a, 8, 1);
    snprintf(p, sizeof p, "%s/col/metrics.jsonl", dir);
    const int nb = read_rows(p, b, 8, 1);
    snprintf(p, sizeof p, "%s/res/metrics.jsonl", dir);
    const int nc = read_rows(p, c, 8, 1);
    REQUIRE(na == 4 && nb == 4);
    for (int i = 0; i < na; i++) {
        CHECK_MSG(json_equal(a[i], b[i]), "row %d: local and colocated differ", i);
        if (i < 3) {
            CHECK(json_number_value(json_object_get(a[i], "log_prob_mean_abs_diff")) == 0.0);
            CHECK(json_number_value(json_object_get(a[i], "transitions")) == 32);
        }
    }
    CHECK_MSG(nc == na, "%d rows after the resume, %d in the straight run", nc, na);
    for (int i = 0; i < nc && i < na; i++) CHECK_MSG(json_equal(c[i], a[i]), "resumed run: row %d differs", i);
    for (int i = 0; i < na; i++) json_decref(a[i]);
    for (int i = 0; i < nb; i++) json_decref(b[i]);
    for (int i = 0; i < nc; i++) json_decref(c[i]);
}

#endif
