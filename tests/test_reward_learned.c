/* tests/test_reward_learned.c — the learned scorers (reward/learned.h): their rewards against transformers and
 * open_clip on tiny random models (fixtures of scripts/fixtures_clip_score.py: clip_score_tf, clip_score_oc,
 * clip_score_aesthetic_mlp.safetensors, clip_score_io.safetensors; its cases are repeated in CASES below), prompts
 * longer than 77 tokens truncated as the reference, the frames scored, the reward server's replies equal to the
 * in-process scorer bit for bit, the folder and recipe checks (each bad input named), and vgrpo init-clip. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/clip/clip_tokenizer.h"
#include "reward/client.h"
#include "reward/learned.h"
#include "tests/reward_thread_util.h"
#include "tests/test.h"

#define FIX "tests/fixtures/"
#define PROMPT "a red car driving along a wet road at night"

/* scripts/fixtures_clip_score.py's LONG: 130 words, far more than 77 byte-level tokens */
static const char *long_prompt(void) {
    static char buf[4096];
    if (buf[0]) return buf;
    size_t o = 0;
    for (int i = 0; i < 130; i++) {
        if (i % 3) o += (size_t)snprintf(buf + o, sizeof buf - o, "%sword%d blue", i ? " " : "", i % 10);
        else o += (size_t)snprintf(buf + o, sizeof buf - o, "%sgreen", i ? " " : "");
    }
    return buf;
}

static const struct {
    const char *scorer, *frames;
    int prompt; /* 0: PROMPT, 1: long_prompt(), 2: "" */
} CASES[] = {{"clip_score", "all", 0}, {"pickscore", "first", 0}, {"pickscore", "3", 1}, {"hpsv2", "all", 0},
             {"aesthetic", "2", 0},    {"clip_score", "4", 2},    {"hpsv2", "first", 1}};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

static const char *case_prompt(int i) { return CASES[i].prompt == 0 ? PROMPT : CASES[i].prompt == 1 ? long_prompt() : ""; }

/* The folder of a scorer: hpsv2 the open_clip one; aesthetic a folder made in tmp of clip_score_tf's files (links)
 * and the MLP; the others clip_score_tf. */
static const char *folder_of(const char *scorer) {
    static char aes[1024];
    if (!strcmp(scorer, "hpsv2")) return FIX "clip_score_oc";
    if (strcmp(scorer, "aesthetic")) return FIX "clip_score_tf";
    if (aes[0]) return aes;
    char cwd[2048], out[4096];
    REQUIRE(getcwd(cwd, sizeof cwd));
    snprintf(aes, sizeof aes, "%s/aesthetic", test_tmpdir());
    REQUIRE(test_run(out, sizeof out,
                     "mkdir -p %s && for f in config.json model.safetensors preprocessor_config.json; do "
                     "ln -sf %s/" FIX "clip_score_tf/$f %s/$f; done && ln -sf %s/" FIX
                     "clip_score_aesthetic_mlp.safetensors %s/" REWARD_AESTHETIC_MLP_FILE,
                     aes, cwd, aes, cwd, aes) == 0);
    return aes;
}

typedef struct {
    st_file *f;
    reward_video v;
    const float *expected;
} io;

static void io_open(io *x) {
    REQUIRE((x->f = st_open(FIX "clip_score_io.safetensors")));
    core_tensor v, e;
    REQUIRE_OK(st_get(x->f, "video", &v));
    REQUIRE_OK(st_get(x->f, "expected", &e));
    REQUIRE(v.ndim == 4 && v.shape[3] == 3 && e.ndim == 1 && e.shape[0] == N_CASES);
    x->v = (reward_video){v.data, v.shape[0], v.shape[1], v.shape[2]};
    x->expected = e.data;
}

/* Each case's reward against the reference: relative error at most 1e-5 of max(|reference|, 0.05) (a few scores
 * are near 0, where a relative error says nothing; 0.05 is below every case's magnitude but one). */
TEST(learned_scores_match_references) {
    io x;
    io_open(&x);
    double worst = 0;
    for (int i = 0; i < N_CASES; i++) {
        reward_frames fr;
        REQUIRE_OK(reward_frames_parse(CASES[i].frames, &fr));
        reward_model *m = reward_model_load(CASES[i].scorer, folder_of(CASES[i].scorer), &fr, "test");
        REQUIRE_OK(m ? 0 : (test_fail(__FILE__, __LINE__, "%s", core_last_error()), -1));
        double r = NAN;
        REQUIRE_OK(reward_model_score(m, &x.v, case_prompt(i), &r));
        const double ref = (double)x.expected[i], err = fabs(r - ref) / fmax(fabs(ref), 0.05);
        worst = fmax(worst, err);
        CHECK_MSG(err <= 1e-5, "case %d (%s, frames %s): %.9g vs reference %.9g (relative %.2e)", i, CASES[i].scorer,
                  CASES[i].frames, r, ref, err);
        reward_model_free(m);
    }
    fprintf(stderr, "  %d cases, largest relative error %.2e\n", N_CASES, worst);
    st_close(x.f);
}

/* The long prompt is cut to 77 ids ending in end-of-text (truncation=True), and its score is the reference's (cases 2
 * and 6 above); words appended past the cut change nothing. */
TEST(learned_long_prompt_truncated) {
    clip_tokenizer *t = clip_tok_load(FIX "clip_score_tf");
    REQUIRE(t);
    int32_t ids[CLIP_TOK_CONTEXT];
    int n_real = 0;
    const char *p = long_prompt();
    REQUIRE_OK(clip_tok_encode_padded(t, p, strlen(p), CLIP_TOK_CONTEXT, ids, &n_real));
    CHECK(n_real == 77 && ids[0] == clip_tok_bos_id(t) && ids[76] == clip_tok_eos_id(t) && ids[75] != clip_tok_eos_id(t));
    clip_tok_free(t);
    io x;
    io_open(&x);
    reward_frames fr;
    REQUIRE_OK(reward_frames_parse("first", &fr));
    reward_model *m = reward_model_load("pickscore", FIX "clip_score_tf", &fr, "test");
    REQUIRE(m);
    char longer[8192];
    snprintf(longer, sizeof longer, "%s and many more words at the very end", p);
    double a, b, c;
    REQUIRE_OK(reward_model_score(m, &x.v, p, &a));
    REQUIRE_OK(reward_model_score(m, &x.v, longer, &b));
    REQUIRE_OK(reward_model_score(m, &x.v, PROMPT, &c));
    CHECK(a == b && a != c);
    reward_model_free(m);
    st_close(x.f);
}

TEST(learned_frames_rule) {
    reward_frames f;
    int64_t idx[16];
    REQUIRE_OK(reward_frames_parse("first", &f));
    CHECK(reward_frames_count(&f, 81) == 1);
    REQUIRE_OK(reward_frames_parse(NULL, &f));
    CHECK(f.mode == REWARD_FRAMES_ALL && reward_frames_count(&f, 5) == 5);
    REQUIRE_OK(reward_frames_parse("4", &f));
    CHECK(reward_frames_count(&f, 81) == 4);
    reward_frames_pick(&f, 81, idx);
    CHECK(idx[0] == 0 && idx[1] == 26 && idx[2] == 53 && idx[3] == 80);
    reward_frames_pick(&f, 5, idx);
    CHECK(idx[0] == 0 && idx[1] == 1 && idx[2] == 2 && idx[3] == 4);
    REQUIRE_OK(reward_frames_parse("1", &f));
    reward_frames_pick(&f, 81, idx);
    CHECK(reward_frames_count(&f, 81) == 1 && idx[0] == 0);
    REQUIRE_OK(reward_frames_parse("6", &f));
    CHECK(reward_frames_count(&f, 5) == -1 && strstr(core_last_error(), "reward.frames: 6 frames asked, the video has 5"));
    CHECK(reward_frames_parse("0", &f) == -1 && strstr(core_last_error(), "K must be >= 1"));
    CHECK(reward_frames_parse("-2", &f) == -1 && strstr(core_last_error(), "K must be >= 1"));
    CHECK(reward_frames_parse("last", &f) == -1 && strstr(core_last_error(), "\"last\" is not first, all or a number"));
    CHECK(reward_frames_parse("3x", &f) == -1 && strstr(core_last_error(), "\"3x\""));
}

/* The reward server (a thread running reward_server_run, the models attached as --models does) answers what the
 * in-process scorer computes, bit for bit, for 12 videos in one request (the learned scorers batch them: blocks of
 * 10 videos x 3 frames, REWARD_MODEL_BATCH_FRAMES); its memory budget counts the models. */
TEST(learned_server_equals_in_process) {
    enum { NV = 12 };
    io x;
    io_open(&x);
    rsrv s;
    memset(&s, 0, sizeof s);
    reward_server_config_default(&s.cfg);
    snprintf(s.endpoint, sizeof s.endpoint, "ipc://%s/rs.sock", test_tmpdir());
    s.cfg.endpoint = s.endpoint;
    s.cfg.threads = 2;
    REQUIRE_OK(reward_server_parse_scorers(&s.cfg, "pickscore:2,brightness:0.5,clip_score:-1"));
    const size_t budget0 = reward_server_memory_budget(&s.cfg);
    char models[512];
    snprintf(models, sizeof models, "pickscore=%s,clip_score=%s", FIX "clip_score_tf", FIX "clip_score_tf");
    REQUIRE_OK(reward_server_attach_models(&s.cfg, models, "3", x.v.frames));
    CHECK(s.cfg.model_act_bytes > 0 && reward_server_memory_budget(&s.cfg) == budget0 + s.cfg.model_act_bytes);
    REQUIRE(pthread_create(&s.th, NULL, rsrv_main, &s) == 0);
    /* NV videos: the fixture's frames rotated by i, the odd ones with the long prompt */
    const int64_t fb = x.v.height * x.v.width * 3, F = x.v.frames;
    uint8_t *all = malloc((size_t)(NV * F * fb));
    REQUIRE(all);
    const char *prompts[NV];
    reward_video vids[NV];
    for (int i = 0; i < NV; i++) {
        for (int64_t f = 0; f < F; f++) memcpy(all + (i * F + f) * fb, x.v.data + ((f + i) % F) * fb, (size_t)fb);
        prompts[i] = i % 2 ? long_prompt() : PROMPT;
        vids[i] = (reward_video){all + i * F * fb, F, x.v.height, x.v.width};
    }
    reward_client *c = reward_client_open(s.endpoint, "w0", 30.0, 3);
    REQUIRE(c);
    reward_result out[NV];
    const int rc = reward_client_score(c, all, NV, (int)F, (int)x.v.height, (int)x.v.width, 16, prompts, NULL, out);
    CHECK_MSG(rc == 0, "%s", core_last_error());
    double batch[NV];
    REQUIRE_OK(reward_model_score_batch(s.cfg.scorers[0].model, vids, prompts, NV, batch));
    for (int i = 0; rc == 0 && i < NV; i++) {
        double vals[3], total;
        int failed;
        REQUIRE_OK(reward_score_weighted(s.cfg.scorers, 3, &vids[i], prompts[i], NULL, vals, &total, &failed));
        CHECK(out[i].n_scores == 3 && !strcmp(out[i].scores[0].name, "pickscore") && batch[i] == vals[0]);
        for (int k = 0; k < 3; k++)
            CHECK_MSG(out[i].scores[k].value == vals[k], "video %d scorer %d: %.17g vs %.17g", i, k,
                      out[i].scores[k].value, vals[k]);
        CHECK(out[i].total == total);
    }
    CHECK(rc != 0 || (out[0].scores[0].value != out[1].scores[0].value &&
                      out[0].scores[0].value != out[2].scores[0].value));
    /* a video shorter than reward.frames' 3: the batch fails, the per-video path names the item */
    const char *two[2] = {PROMPT, PROMPT};
    CHECK(reward_client_score(c, all, 2, 2, (int)x.v.height, (int)x.v.width, 16, two, NULL, out) == -1 &&
          strstr(core_last_error(), "items[0], scorer pickscore: pickscore: reward.frames: 3 frames asked, the video "
                                    "has 2"));
    reward_client_close(c);
    rsrv_stop(&s);
    reward_server_detach_models(&s.cfg);
    free(all);
    st_close(x.f);
}

/* Bad folders and lists: each error names the key and what is wrong. */
TEST(learned_bad_inputs) {
    const char *dir = test_tmpdir();
    char out[8192], d[1024];
    reward_frames fr;
    REQUIRE_OK(reward_frames_parse("all", &fr));
    /* a folder missing one file at a time (copies of clip_score_tf) */
    const char *files[] = {"tokenizer.json", "preprocessor_config.json", "model.safetensors", "config.json"};
    const char *want[] = {"has no tokenizer.json", "has no preprocessor_config.json", "no model.safetensors",
                          "neither config.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(d, sizeof d, "%s/m%d", dir, i);
        REQUIRE(test_run(out, sizeof out, "cp -r " FIX "clip_score_tf %s && rm %s/%s", d, d, files[i]) == 0);
        CHECK_MSG(reward_model_check("pickscore", d, "reward.models.pickscore", NULL) == -1 &&
                      strstr(core_last_error(), "reward.models.pickscore: ") && strstr(core_last_error(), want[i]),
                  "%s", core_last_error());
    }
    CHECK(reward_model_check("pickscore", "/nonexistent/x", "reward.models.pickscore", NULL) == -1 &&
          strstr(core_last_error(), "is not a folder"));
    CHECK(reward_model_check("aesthetic", FIX "clip_score_tf", "k", NULL) == -1 &&
          strstr(core_last_error(), "no " REWARD_AESTHETIC_MLP_FILE));
    CHECK(reward_model_check("color_match", FIX "clip_score_tf", "k", NULL) == -1 &&
          strstr(core_last_error(), "not a learned scorer"));
    /* a processor whose crop is not the model's image size */
    snprintf(d, sizeof d, "%s/crop", dir);
    REQUIRE(test_run(out, sizeof out, "cp -r " FIX "clip_score_tf %s && sed -i 's/\"height\": 24/\"height\": 20/' "
                     "%s/preprocessor_config.json", d, d) == 0);
    CHECK_MSG(reward_model_check("clip_score", d, "k", NULL) == -1 &&
                  strstr(core_last_error(), "crop_size 20 x 24 is not the model's image size 24 x 24"),
              "%s", core_last_error());
    /* weights that do not match the config: the loader names the tensor and both shapes */
    snprintf(d, sizeof d, "%s/shape", dir);
    REQUIRE(test_run(out, sizeof out, "cp -r " FIX "clip_score_tf %s && sed -i 's/\"projection_dim\": 16/"
                     "\"projection_dim\": 12/' %s/config.json", d, d) == 0);
    REQUIRE_OK(reward_model_check("clip_score", d, "k", NULL)); /* configs alone agree */
    CHECK_MSG(!reward_model_load("clip_score", d, &fr, "reward.models.clip_score") &&
                  strstr(core_last_error(), "reward.models.clip_score: ") && strstr(core_last_error(), "projection"),
              "%s", core_last_error());
    /* the scorer list against the folders */
    reward_weighted sc[2] = {{.scorer = reward_find("pickscore"), .weight = 1},
                             {.scorer = reward_find("brightness"), .weight = 1}};
    const char *names[2] = {"pickscore", "hpsv2"}, *dirs[2] = {FIX "clip_score_tf", FIX "clip_score_oc"};
    CHECK(reward_models_check(sc, 2, 0, NULL, NULL, &fr, 5, "reward.models", 0) == -1 &&
          strstr(core_last_error(), "reward.models.pickscore: scorer pickscore needs a model folder"));
    CHECK(reward_models_check(sc, 2, 2, names, dirs, &fr, 5, "reward.models", 0) == -1 &&
          strstr(core_last_error(), "reward.models.hpsv2: scorer \"hpsv2\" is not in the scorer list"));
    reward_frames k9;
    REQUIRE_OK(reward_frames_parse("9", &k9));
    CHECK(reward_models_check(sc, 2, 1, names, dirs, &k9, 5, "reward.models", 0) == -1 &&
          strstr(core_last_error(), "9 frames asked, the video has 5"));
    REQUIRE_OK(reward_models_check(sc, 2, 1, names, dirs, &fr, 5, "reward.models", 0));
    /* an unattached learned scorer is refused when scored; a video with fewer frames than K too */
    double r;
    uint8_t px[2 * 8 * 8 * 3] = {0};
    const reward_video v = {px, 2, 8, 8};
    CHECK(reward_score_one(&sc[0], &v, "x", NULL, &r) == -1 && strstr(core_last_error(), "no model loaded"));
    REQUIRE_OK(reward_models_attach(sc, 2, 1, names, dirs, &k9, 0, "reward.models"));
    CHECK(reward_score_one(&sc[0], &v, "x", NULL, &r) == -1 &&
          strstr(core_last_error(), "pickscore: reward.frames: 9 frames asked, the video has 2"));
    reward_models_detach(sc, 2);
    CHECK(sc[0].model == NULL);
    int n;
    char **mn, **md;
    CHECK(reward_models_parse("pickscore", &n, &mn, &md) == -1 && strstr(core_last_error(), "not SCORER=FOLDER"));
    REQUIRE_OK(reward_models_parse("a=/x,b=y", &n, &mn, &md));
    CHECK(n == 2 && !strcmp(mn[1], "b") && !strcmp(md[0], "/x"));
    free(mn);
}

/* The recipe: --dry-run refuses each bad reward.models / reward.frames naming the key; a good one counts the model
 * in the memory estimate. The reward server's CLI refuses a bad folder at start. */
TEST(learned_recipe_checks) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[1 << 15];
    REQUIRE(test_run(out, sizeof out, "%s init-clip --preset tiny --out %s/clip --seed 1", bin, dir) == 0);
    CHECK(test_run(out, sizeof out, "%s init-clip --preset tiny --out %s/clip", bin, dir) == 1 &&
          strstr(out, "exists (--force"));
    CHECK(test_run(out, sizeof out, "%s init-clip --preset big --out %s/c2", bin, dir) == 2 && strstr(out, "tiny"));
#define DRY "%s run recipes/tiny-cpu-clip.yaml --dry-run --set model.path=runs/none --set model.init_preset= "
    static const struct {
        const char *sets, *want;
    } bad[] = {
        {"--set reward.models.clip_score=%s/clip/config.json", "reward.models.clip_score: %s/clip/config.json is not a folder"},
        {"--set reward.models=null --set logging.run_dir=%s/r", "reward.models.clip_score: scorer clip_score needs a model folder"},
        {"--set reward.models.pickscore=%s/clip", "reward.models.pickscore: scorer pickscore is not in reward.scorers"},
        {"--set reward.frames=9 --set reward.models.clip_score=%s/clip", "9 frames asked, the video has 5"},
        {"--set reward.frames=3 --set model.decoder=latent_rgb --set model.text_encoder=word_embed "
         "--set reward.models.clip_score=%s/clip", "3 frames asked, the video has 2"},
        {"--set reward.frames=0 --set reward.models.clip_score=%s/clip", "reward.frames: K = 0 frames; K must be >= 1"},
        {"--set reward.frames=middle --set reward.models.clip_score=%s/clip", "\"middle\" is not first, all"},
        {"--set reward.scorers=[clip_scor] --set reward.models=null --set logging.run_dir=%s/r", "unknown reward scorer 'clip_scor'"},
        {"--set guard.gold_scorers=[pickscore] --set reward.models.clip_score=%s/clip", "pickscore is a learned scorer"},
    };
    char cmd[2048], sets[1024], want[1024];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(sets, sizeof sets, bad[i].sets, dir);
        snprintf(want, sizeof want, bad[i].want, dir);
        snprintf(cmd, sizeof cmd, DRY "%s", bin, sets);
        const int rc = test_run(out, sizeof out, "%s", cmd);
        CHECK_MSG(rc != 0 && strstr(out, want), "case %zu (rc %d): want \"%s\" in: %.600s", i, rc, want, out);
    }
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 0", bin, dir) == 0);
    snprintf(cmd, sizeof cmd, "%s run recipes/tiny-cpu-clip.yaml --dry-run --set model.path=%s/model "
             "--set reward.models.clip_score=%s/clip", bin, dir, dir);
    CHECK_MSG(test_run(out, sizeof out, "%s", cmd) == 0 && strstr(out, "learned reward models (F32)"), "%.3000s", out);
    /* a folder not there yet: --dry-run warns and passes (a recipe's placeholder), the run refuses it at the start */
    snprintf(cmd, sizeof cmd, "%s run recipes/tiny-cpu-clip.yaml --set model.path=%s/model --set reward.models.clip_score=%s/none "
             "--set logging.run_dir=%s/r", bin, dir, dir, dir);
    CHECK_MSG(test_run(out, sizeof out, "%s --dry-run", cmd) == 0 &&
                  strstr(out, "reward.models.clip_score: ") && strstr(out, "none does not exist yet"), "%.3000s", out);
    CHECK_MSG(test_run(out, sizeof out, "%s", cmd) == 1 && strstr(out, "reward.models.clip_score: ") &&
                  strstr(out, "none is not a folder"), "%.3000s", out);
    CHECK(test_run(out, sizeof out, "%s --set mode=colocated", cmd) == 1 && strstr(out, "none is not a folder"));
    CHECK(test_run(out, sizeof out, "%s eval recipes/tiny-cpu-clip.yaml --set model.path=%s/model "
                   "--set reward.models.clip_score=%s/none --out %s/ev", bin, dir, dir, dir) != 0 &&
          strstr(out, "none is not a folder"));
    CHECK(test_run(out, sizeof out, "%s reward-server --bind ipc://%s/r.sock --scorers hpsv2:1 --models hpsv2=%s/none",
                   bin, dir, dir) == 1 &&
          strstr(out, "--models.hpsv2: ") && strstr(out, "none is not a folder"));
    CHECK(test_run(out, sizeof out, "%s reward-server --bind ipc://%s/r.sock --scorers pickscore:1", bin, dir) == 1 &&
          strstr(out, "--models.pickscore: scorer pickscore needs a model folder"));
#undef DRY
}

/* Local mode scores in-process, colocated mode on the reward server the job starts (--models, --frames): the same
 * rewards bit for bit, two steps of the tiny clip recipe. */
TEST(learned_local_equals_colocated) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[1 << 16], a[1 << 16], b[1 << 16], path[1200];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 0", bin, dir) == 0);
    REQUIRE(test_run(out, sizeof out, "%s init-clip --preset tiny --out %s/clip --seed 0", bin, dir) == 0);
    const char *common = "--set rollout.num_steps=4 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 "
                         "--set rollout.batch_size=4 --set optim.total_steps=2 --set logging.eval_every=0 "
                         "--set checkpoint.every=-1 --set reward.frames=3";
    for (int k = 0; k < 2; k++) {
        const int rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-clip.yaml --set model.path=%s/model "
                                "--set reward.models.clip_score=%s/clip --set logging.run_dir=%s/%s --set mode=%s %s",
                                bin, dir, dir, dir, k ? "colo" : "local", k ? "colocated" : "local", common);
        REQUIRE_OK(rc ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
        snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, k ? "colo" : "local");
        REQUIRE(test_slurp(path, k ? b : a, sizeof a) > 0);
    }
    /* the reward fields of each row: "reward/..." up to the next comma */
    for (const char *p = a; (p = strstr(p, "\"reward/mean\"")); p++) {
        char key[64];
        snprintf(key, sizeof key, "%.40s", p);
        char *comma = strchr(key, ',');
        if (comma) *comma = 0;
        CHECK_MSG(strstr(b, key) != NULL, "local %s not in the colocated run's metrics", key);
    }
    CHECK(strstr(a, "\"reward/mean\"") != NULL);
}

/* Learning (make test-slow): recipes/tiny-cpu-clip.yaml as written (150 steps, the tiny CLIP of seed 0 as `make
 * demo-clip` makes it): eval clip_score at the end exceeds the start by more than 3 standard errors of the
 * difference, sqrt(se_start^2 + se_end^2). */
TEST(learned_run_learns_clip_score_slow) {
    TEST_SLOW();
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    static char out[1 << 20];
    char path[1200];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 0", bin, dir) == 0);
    REQUIRE(test_run(out, sizeof out, "%s init-clip --preset tiny --out %s/clip --seed 0", bin, dir) == 0);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu-clip.yaml --set model.path=%s/model "
                     "--set reward.models.clip_score=%s/clip --set logging.run_dir=%s/run", bin, dir, dir, dir) == 0);
    snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    REQUIRE(f);
    double m[2] = {NAN, NAN}, se[2] = {NAN, NAN};
    int seen = 0;
    static char line[1 << 16];
    while (fgets(line, sizeof line, f)) {
        const char *a = strstr(line, "\"eval/clip_score/mean\":"), *b = strstr(line, "\"eval/clip_score/se\":");
        if (!a || !b) continue;
        const int k = seen++ ? 1 : 0;
        m[k] = strtod(a + strlen("\"eval/clip_score/mean\":"), NULL);
        se[k] = strtod(b + strlen("\"eval/clip_score/se\":"), NULL);
    }
    fclose(f);
    REQUIRE(seen >= 2);
    const double z = (m[1] - m[0]) / sqrt(se[0] * se[0] + se[1] * se[1]);
    fprintf(stderr, "  eval clip_score %.4f +- %.4f -> %.4f +- %.4f (%.1f standard errors)\n", m[0], se[0], m[1], se[1], z);
    CHECK(z > 3);
}
