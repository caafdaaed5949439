/* tests/test_cli_gen_export.c — `vgrpo generate --recipe` against `vgrpo eval` (cli/generate_recipe.h: the same video
 * byte for byte, by xxh64), generate's bounded flags, `init-model --out` with missing parents, and `vgrpo export
 * --base / --adapter checkpoint-N / --pipeline-out` (cli/cmd_export.c) on the tiny pipeline. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "tests/test.h"

/* A tiny pipeline and a prompt file in dir; the --set arguments the jobs here share. */
static void setup(const char *dir, char *sets, size_t cap) {
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", test_vgrpo_bin(), dir) == 0);
    test_write_text(dir, "prompts.txt", "a red ball\na green tree\n");
    snprintf(sets, cap,
             "--set model.path=%s/model --set data.prompt_file=%s/prompts.txt --set data.eval_prompt_file=%s/prompts.txt "
             "--set data.eval_samples_per_prompt=2 --set rollout.num_steps=4 --set logging.run_dir=%s/run",
             dir, dir, dir, dir);
}

/* The hex after "video xxh64 " in generate's output, into hx[17]; 0 when found. */
static int video_hash(const char *out, char hx[17]) {
    const char *p = strstr(out, "video xxh64 ");
    if (!p || strlen(p + 12) < 16) return -1;
    memcpy(hx, p + 12, 16);
    hx[16] = 0;
    return 0;
}

static const char *eval_hash(const json_t *ev, int uid, int K) {
    const json_t *pr = json_array_get(json_object_get(ev, "prompts"), (size_t)(uid / K));
    const json_t *s = json_array_get(json_object_get(pr, "samples"), (size_t)(uid % K));
    return json_string_value(json_object_get(s, "video_xxh64"));
}

/* generate --recipe draws the eval's sample: "a green tree" is prompt 1 of 2 samples each, so its first sample is uid
 * 2 (found in data.eval_prompt_file) and --uid 3 its second; both equal eval.json's hashes. The recipe's size, steps
 * and eta are taken (32 x 32, 5 frames, 4 steps, eta 1 of tiny-cpu.yaml), and a flag overrides: --eta 0 draws another
 * video. With a run's LoRA checkpoint the video is `eval --checkpoint`'s. Before: generate had no --recipe (64 x 64,
 * 9 frames, 20 steps, the ODE). */
TEST(gen_recipe_same_video_as_eval) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char sets[2048], out[16384], hx[17], hx0[17];
    setup(dir, sets, sizeof sets);
    int st = test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml %s --out %s/ev 2>&1", bin, sets, dir);
    if (st) test_fail(__FILE__, __LINE__, "eval failed: %s", out);
    char p[4300];
    snprintf(p, sizeof p, "%s/ev/eval.json", dir);
    json_error_t je;
    json_t *ev = json_load_file(p, 0, &je);
    REQUIRE(ev);
    st = test_run(out, sizeof out, "%s generate --recipe recipes/tiny-cpu.yaml %s --prompt 'a green tree' --out %s/g.mp4 "
                  "2>&1", bin, sets, dir);
    CHECK_MSG(st == 0 && !video_hash(out, hx), "generate: %d: %s", st, out);
    CHECK_MSG(strstr(out, "uid 2 (the first eval sample") && strstr(out, "(5 frames, 32 x 32,") &&
                  strstr(out, "4 steps, guidance 4.5, eta 1;"), "summary: %s", out);
    CHECK_MSG(!strcmp(hx, eval_hash(ev, 2, 2)), "uid 2: generate %s, eval %s", hx, eval_hash(ev, 2, 2));
    st = test_run(out, sizeof out, "%s generate --recipe recipes/tiny-cpu.yaml %s --prompt 'a green tree' --uid 3 "
                  "--out %s/g3.mp4 2>&1", bin, sets, dir);
    CHECK_MSG(st == 0 && !video_hash(out, hx), "generate --uid 3: %d: %s", st, out);
    CHECK_MSG(!strcmp(hx, eval_hash(ev, 3, 2)), "uid 3: generate %s, eval %s", hx, eval_hash(ev, 3, 2));
    st = test_run(out, sizeof out, "%s generate --recipe recipes/tiny-cpu.yaml %s --prompt 'a green tree' --eta 0 "
                  "--out %s/g0.mp4 2>&1", bin, sets, dir);
    CHECK_MSG(st == 0 && !video_hash(out, hx0) && strcmp(hx0, eval_hash(ev, 2, 2)), "--eta 0: %d: %s", st, out);
    CHECK_MSG(strstr(out, "eta 0 (data.eval_eta)"), "--eta 0 not taken: %s", out);
    /* a run's LoRA checkpoint: generate --recipe --checkpoint gives `eval --checkpoint`'s video of "a red ball" (uid
     * 0), not the base's */
    st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --set mode=local --set model.lora.rank=4 --set "
                  "model.lora.alpha=8 --set checkpoint.every=1 --set optim.lr=2e-2 --steps 1 2>&1", bin, sets);
    if (st) test_fail(__FILE__, __LINE__, "run failed: %s", out);
    st = test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml %s --checkpoint %s/run/checkpoint-1 --out %s/evc 2>&1",
                  bin, sets, dir, dir);
    if (st) test_fail(__FILE__, __LINE__, "eval --checkpoint failed: %s", out);
    snprintf(p, sizeof p, "%s/evc/eval.json", dir);
    json_t *evc = json_load_file(p, 0, &je);
    REQUIRE(evc);
    st = test_run(out, sizeof out, "%s generate --recipe recipes/tiny-cpu.yaml %s --checkpoint %s/run/checkpoint-1 "
                  "--prompt 'a red ball' --out %s/gc.mp4 2>&1", bin, sets, dir, dir);
    CHECK_MSG(st == 0 && !video_hash(out, hx) && strstr(out, "LoRA adapter(s) from"), "generate --checkpoint: %d: %s",
              st, out);
    CHECK_MSG(!strcmp(hx, eval_hash(evc, 0, 2)) && strcmp(hx, eval_hash(ev, 0, 2)), "checkpoint uid 0: generate %s, "
              "eval --checkpoint %s, base eval %s", hx, eval_hash(evc, 0, 2), eval_hash(ev, 0, 2));
    json_decref(evc);
    json_decref(ev);
}

/* Image to video: a prompt of an image prompt file (recipes/tiny-cpu-i2v.yaml) is generated with its image from
 * data.eval_prompt_file, as the eval samples it: the same video as eval.json's (prompt 1, uid 1). */
TEST(gen_recipe_image_prompt_same_as_eval) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char sets[2048], out[16384], p[4300], hx[17];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny-ti2v --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    snprintf(sets, sizeof sets, "--set model.path=%s/model --set data.eval_samples_per_prompt=1 --set "
             "rollout.num_steps=4 --set logging.run_dir=%s/run", dir, dir);
    int st = test_run(out, sizeof out, "%s eval recipes/tiny-cpu-i2v.yaml %s --out %s/ev 2>&1", bin, sets, dir);
    if (st) test_fail(__FILE__, __LINE__, "eval failed: %s", out);
    snprintf(p, sizeof p, "%s/ev/eval.json", dir);
    json_error_t je;
    json_t *ev = json_load_file(p, 0, &je);
    REQUIRE(ev);
    st = test_run(out, sizeof out, "%s generate --recipe recipes/tiny-cpu-i2v.yaml %s --prompt 'a black square on a "
                  "green background' --out %s/g.mp4 2>&1", bin, sets, dir);
    CHECK_MSG(st == 0 && !video_hash(out, hx) && strstr(out, "uid 1 (") &&
                  strstr(out, "images/black_on_green.png (the prompt's in data.eval_prompt_file)"), "%d: %s", st, out);
    CHECK_MSG(!strcmp(hx, eval_hash(ev, 1, 1)), "uid 1: generate %s, eval %s", hx, eval_hash(ev, 1, 1));
    json_decref(ev);
}

/* Without --recipe, --eta 0 is today's default bit for bit, and --eta > 0 samples with noise (another video, the same
 * one twice). */
TEST(gen_eta_flag) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[8192], a[17], b[17], c[17], d[17];
    REQUIRE(test_run(NULL, 0, "%s init-model --preset tiny --out %s/model --seed 0 >/dev/null", bin, dir) == 0);
    const char *args[4] = {"", "--eta 0", "--eta 1", "--eta 1"};
    char *h[4] = {a, b, c, d};
    for (int k = 0; k < 4; k++) {
        const int st = test_run(out, sizeof out, "%s generate --pipeline %s/model --prompt 'a red ball' --steps 4 %s "
                                "--out %s/v%d.mp4 2>&1", bin, dir, args[k], dir, k);
        CHECK_MSG(st == 0 && !video_hash(out, h[k]), "generate %s: %d: %s", args[k], st, out);
    }
    CHECK(!strcmp(a, b) && strcmp(a, c) && !strcmp(c, d));
}

/* --shift 1e-300 failed deep in the sampler ("sigma inf", no option named); --guidance -5 was accepted. */
TEST(gen_flags_bounded) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[8192];
    int st = test_run(out, sizeof out, "%s generate --pipeline %s/none --prompt x --out %s/x.mp4 --shift 1e-300 2>&1",
                      bin, dir, dir);
    CHECK_MSG(st == 2 && strstr(out, "--shift: expected a number in 0.01..1000, got \"1e-300\""), "%d: %s", st, out);
    st = test_run(out, sizeof out, "%s generate --pipeline %s/none --prompt x --out %s/x.mp4 --guidance -5 2>&1", bin,
                  dir, dir);
    CHECK_MSG(st == 2 && strstr(out, "--guidance: expected a number in 0..1000, got \"-5\""), "%d: %s", st, out);
    st = test_run(out, sizeof out, "%s generate --pipeline %s/none --prompt x --out %s/x.mp4 --guidance-2 -1 2>&1", bin,
                  dir, dir);
    CHECK_MSG(st == 2 && strstr(out, "--guidance-2: expected a number in 0..1000"), "%d: %s", st, out);
    st = test_run(out, sizeof out, "%s generate --prompt x --out %s/x.mp4 2>&1", bin, dir);
    CHECK_MSG(st == 2 && strstr(out, "--pipeline is required (or --recipe FILE"), "%d: %s", st, out);
}

/* init-model --out a/b/c made no parents ("cannot create folder"). */
TEST(init_model_out_creates_parents) {
    const char *dir = test_tmpdir();
    char out[8192], p[4300];
    const int st = test_run(out, sizeof out, "%s init-model --preset tiny --out %s/a/b/c 2>&1", test_vgrpo_bin(), dir);
    CHECK_MSG(st == 0, "%d: %s", st, out);
    snprintf(p, sizeof p, "%s/a/b/c/transformer/config.json", dir);
    struct stat sb;
    CHECK(stat(p, &sb) == 0 && S_ISREG(sb.st_mode));
}

/* export --checkpoint named the base (a run's checkpoint-N there: "no transformer here"). Now: --checkpoint says it is
 * deprecated and, given a LoRA checkpoint, names --adapter; --base model --adapter checkpoint-N --merge --pipeline-out
 * writes a pipeline generate loads, whose video differs from the base's. */
TEST(export_base_adapter_checkpoint_pipeline_out) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char sets[2048], out[16384], p[4300], hb[17], hm[17];
    setup(dir, sets, sizeof sets);
    int st = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml %s --set mode=local --set model.lora.rank=4 --set "
                      "model.lora.alpha=8 --set checkpoint.every=1 --set optim.lr=2e-2 --steps 1 2>&1", bin, sets);
    if (st) test_fail(__FILE__, __LINE__, "run failed: %s", out);
    st = test_run(out, sizeof out, "%s export --checkpoint %s/run/checkpoint-1 --adapter %s/run/checkpoint-1 --out %s/x "
                  "2>&1", bin, dir, dir, dir);
    CHECK_MSG(st == 1 && strstr(out, "--checkpoint is deprecated (it names the base model): use --base") &&
                  strstr(out, "holds a LoRA adapter, not base weights: give it as --adapter"), "%d: %s", st, out);
    st = test_run(out, sizeof out, "%s export --checkpoint %s/model --adapter %s/run/checkpoint-1 --out %s/x 2>&1", bin,
                  dir, dir, dir);
    CHECK_MSG(st == 0 && strstr(out, "use --base") && strstr(out, "adapter "), "alias: %d: %s", st, out);
    st = test_run(out, sizeof out, "%s export --base %s/model --adapter %s/run/checkpoint-1 --pipeline-out %s/po 2>&1",
                  bin, dir, dir, dir);
    CHECK_MSG(st == 2 && strstr(out, "add --merge"), "%d: %s", st, out);
    st = test_run(out, sizeof out, "%s export --base %s/model --adapter %s/run/checkpoint-1 --merge --pipeline-out "
                  "%s/po 2>&1", bin, dir, dir, dir);
    CHECK_MSG(st == 0 && strstr(out, "merged ->") && strstr(out, "vgrpo generate --pipeline"), "%d: %s", st, out);
    const char *files[4] = {"model_index.json", "transformer/config.json", "vae/config.json", "tokenizer/tokenizer.json"};
    for (int k = 0; k < 4; k++) {
        struct stat sb;
        snprintf(p, sizeof p, "%s/po/%s", dir, files[k]);
        CHECK_MSG(stat(p, &sb) == 0 && S_ISREG(sb.st_mode), "%s missing", p);
    }
    snprintf(p, sizeof p, "%s/po.partial", dir);
    struct stat sb;
    CHECK(stat(p, &sb) != 0);
    st = test_run(out, sizeof out, "%s generate --pipeline %s/model --prompt 'a red ball' --steps 4 --out %s/b.mp4 2>&1",
                  bin, dir, dir);
    CHECK_MSG(st == 0 && !video_hash(out, hb), "%d: %s", st, out);
    st = test_run(out, sizeof out, "%s generate --pipeline %s/po --prompt 'a red ball' --steps 4 --out %s/m.mp4 2>&1",
                  bin, dir, dir);
    CHECK_MSG(st == 0 && !video_hash(out, hm) && strcmp(hb, hm), "merged pipeline: %d: %s", st, out);
    st = test_run(out, sizeof out, "%s export --base %s/model --adapter %s/run/checkpoint-1 --merge --pipeline-out "
                  "%s/po 2>&1", bin, dir, dir, dir);
    CHECK_MSG(st == 1 && strstr(out, "already exists"), "%d: %s", st, out);
}
