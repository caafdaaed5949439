/* tests/test_stop.c — stopping is prompt: SIGINT/SIGTERM inside a GRPO step ends it at once.
 *   - the rollout engine polls rollout_config.should_stop before every denoising step: a stop ends rollout_generate
 *     with "rollout stopped by signal N" and nothing allocated; a hook that never stops changes no number;
 *   - the training step polls trainer_config.should_stop before every micro-batch and before the optimizer step: a
 *     stop ends the update with "training stopped by signal N", weights and Adam state untouched; after the last
 *     poll the update completes;
 *   - end to end, local mode (a training-heavy step of ~3 s) and colocated mode (a rollout-heavy step of ~3 s: the
 *     trainer is waiting for the worker's rollout): SIGTERM ~0.5 s into step 1 stops within 2 s (the code before
 *     finished the step first; local: the process exits within 2 s, colocated see below), says "stopped by signal 15 during step 1 (...): step 1 discarded; checkpoint-1
 *     saved: continue with --resume", leaves checkpoint-1 complete (it verifies, no leftovers) and byte-identical to
 *     a straight run's checkpoint-1, metrics.jsonl with row 0 only, and --resume from it reproduces the straight
 *     run's metrics rows bit for bit (time/ and weight_sync/ fields aside). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/dit/wan_dit.h"
#include "model/text/word_embed.h"
#include "rollout/engine.h"
#include "tests/metrics_rows.h"
#include "tests/ckpt_cmp.h"
#include "tests/test.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/step/grpo.h"
#include "trainer/step/train_step.h"

#define TL 4

/* A stop hook that answers 15 from its stop_at-th poll on (0: never). */
static int polls, stop_at;
static int stop_hook(void) { return ++polls >= stop_at && stop_at > 0 ? 15 : 0; }

static void tiny(wan_model *m, uint64_t seed) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    REQUIRE_OK(wan_model_init(m, &c));
    wan_params_init_random(m, seed);
}

TEST(stop_engine_between_denoising_steps) {
    wan_model m;
    tiny(&m, 3);
    const int td = m.cfg.text_dim, n = 3, N = 5;
    float *emb = malloc(sizeof(float) * TL * td);
    REQUIRE(emb);
    REQUIRE_OK(wan_word_embed("a red ball", TL, td, emb));
    const float *cond[3] = {emb, emb, emb};
    const uint64_t uids[3] = {7, 8, 9};
    const int64_t shape[4] = {16, 2, 4, 4};
    rollout_config rc;
    REQUIRE_OK(rollout_config_init(&rc, N, 3.0, 1.0f, 4.5f, shape, TL, 42, 2)); /* chunks of 2 and 1 samples */
    CHECK(rc.should_stop == NULL);
    const rollout_experts E = rollout_one_expert(&m);
    core_traj ref[3], got[3];
    REQUIRE_OK(rollout_generate(&rc, &E, NULL, n, cond, uids, NULL, ref));
    /* a hook that never stops: polled before every denoising step of every chunk, the same trajectories */
    rc.should_stop = stop_hook, polls = 0, stop_at = 0;
    REQUIRE_OK(rollout_generate(&rc, &E, NULL, n, cond, uids, NULL, got));
    CHECK_MSG(polls == 2 * N, "polls %d, expected %d (2 chunks x %d steps)", polls, 2 * N, N);
    for (int j = 0; j < n; j++) {
        CHECK(!memcmp(core_traj_latent(&ref[j], N), core_traj_latent(&got[j], N), sizeof(float) * 16 * 2 * 4 * 4));
        CHECK(!memcmp(ref[j].log_probs, got[j].log_probs, sizeof(float) * N));
        core_traj_free(&got[j]);
    }
    /* a stop at the first poll, in the middle of the first chunk, and in the second chunk */
    const int at[3] = {1, 3, N + 2};
    for (int k = 0; k < 3; k++) {
        polls = 0, stop_at = at[k];
        CHECK(rollout_generate(&rc, &E, NULL, n, cond, uids, NULL, got) == -1);
        CHECK_MSG(strstr(core_last_error(), "rollout stopped by signal 15"), "got: %s", core_last_error());
        CHECK(polls == at[k]);
        for (int j = 0; j < n; j++) CHECK(got[j].latents == NULL && got[j].log_probs == NULL); /* freed (ASan) */
    }
    for (int j = 0; j < n; j++) core_traj_free(&ref[j]);
    wan_model_free(&m);
    free(emb);
}

TEST(stop_training_before_the_optimizer_step) {
    wan_model pol, snap;
    tiny(&pol, 11);
    tiny(&snap, 11);
    REQUIRE_OK(wan_model_alloc_grads(&pol));
    const int td = pol.cfg.text_dim, n = 4, N = 4;
    float *emb = malloc(sizeof(float) * TL * td);
    REQUIRE(emb);
    REQUIRE_OK(wan_word_embed("green grass", TL, td, emb));
    const float *cond[4] = {emb, emb, emb, emb};
    const uint64_t uids[4] = {1, 2, 3, 4};
    const int64_t shape[4] = {16, 2, 4, 4};
    rollout_config rc;
    REQUIRE_OK(rollout_config_init(&rc, N, 3.0, 1.0f, 4.5f, shape, TL, 5, 4));
    core_traj tr[4];
    REQUIRE_OK(rollout_generate(&rc, &(rollout_experts){1, {&pol, NULL}}, NULL, n, cond, uids, NULL, tr));
    const float rewards[4] = {0.1f, 0.7f, 0.4f, 0.2f};
    float adv[4];
    uint8_t mask[4];
    REQUIRE_OK(grpo_advantages(rewards, 1, 4, GRPO_STD_GROUP, 5.0f, adv, mask, NULL));
    trainer_batch b = {.n = n, .traj = tr, .cond = cond, .text_len = TL, .adv = adv, .mask = mask};
    trainer_config tc = {.seed = 5, .clip_eps = 0.2f, .micro_batch_size = 5, .acts_mode = WAN_ACTS_STORE};
    REQUIRE_OK(grpo_selection_parse("all", &tc.sel));
    optim_config oc = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .max_grad_norm = 1.0,
                       .schedule = OPTIM_SCHED_CONSTANT, .total_steps = 10};
    optim_adamw opt;
    REQUIRE_OK(optim_adamw_init(&opt, pol.layout.numel));
    const int n_mb = (n * N + 4) / 5; /* 16 transitions in micro-batches of 5: 4, then the optimizer poll */
    tc.should_stop = stop_hook;
    const int at[3] = {1, 3, n_mb + 1};
    for (int k = 0; k < 3; k++) {
        polls = 0, stop_at = at[k];
        CHECK(trainer_update(&pol, NULL, NULL, &tc, &b, &opt, &oc, NULL, NULL) == -1);
        CHECK_MSG(strstr(core_last_error(), "training stopped by signal 15"), "got: %s", core_last_error());
        CHECK(k < 2 || strstr(core_last_error(), "before the optimizer step"));
        CHECK(polls == at[k]);
        CHECK(opt.step == 0);
        CHECK(!memcmp(pol.params, snap.params, sizeof(float) * (size_t)pol.layout.numel));
        for (int64_t j = 0; j < opt.n; j++) CHECK(opt.m[j] == 0 && opt.v[j] == 0);
    }
    /* after the last poll the update runs: the same weights as without a hook */
    polls = 0, stop_at = 0;
    REQUIRE_OK(trainer_update(&pol, NULL, NULL, &tc, &b, &opt, &oc, NULL, NULL));
    CHECK(polls == n_mb + 1 && opt.step == 1);
    wan_model alone;
    tiny(&alone, 11);
    REQUIRE_OK(wan_model_alloc_grads(&alone));
    optim_adamw o2;
    REQUIRE_OK(optim_adamw_init(&o2, alone.layout.numel));
    tc.should_stop = NULL;
    REQUIRE_OK(trainer_update(&alone, NULL, NULL, &tc, &b, &o2, &oc, NULL, NULL));
    CHECK(!memcmp(pol.params, alone.params, sizeof(float) * (size_t)pol.layout.numel));
    CHECK(memcmp(pol.params, snap.params, sizeof(float) * (size_t)pol.layout.numel));
    for (int j = 0; j < n; j++) core_traj_free(&tr[j]);
    optim_adamw_free(&opt), optim_adamw_free(&o2);
    wan_model_free(&pol), wan_model_free(&snap), wan_model_free(&alone);
    free(emb);
}

/* ---- end to end ---- */

/* This test's folder, with the pid (several build folders share build/test-tmp, and the process patterns must not
 * match another suite's runs). */
static const char *tmpdir(void) {
    static char path[600];
    char out[1024];
    snprintf(path, sizeof path, "%s.%d", test_tmpdir(), (int)getpid());
    if (test_run(out, sizeof out, "rm -rf %s && mkdir -p %s", path, path)) test_fail(__FILE__, __LINE__, "cannot create %s", path);
    return path;
}

/* Kills (SIGKILL) every process whose command line names dir; returns how many there were. */
static int reap(const char *dir) {
    char out[4096];
    test_run(out, sizeof out, "pgrep -f '[v]grpo .*%s/' | wc -l; pkill -KILL -f '[v]grpo .*%s/'; true", dir, dir);
    return atoi(out);
}

static void make_inputs(const char *dir) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 2 >/dev/null && "
                                      "printf 'a red kite\\na green frog\\na blue boat\\n' > %s/prompts.txt && "
                                      "printf 'a red kite\\n' > %s/eval.txt",
                     test_vgrpo_bin(), dir, dir, dir) == 0);
}

/* The run's command line into dir/name: the tiny model with word embeddings and latent_rgb, one eval sample. */
static void cmdline(char *buf, size_t cap, const char *dir, const char *name, const char *mode, const char *recipe,
                    const char *extra) {
    snprintf(buf, cap,
             "env OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml --set mode=%s --set model.path=%s/model "
             "--set data.prompt_file=%s/prompts.txt --set data.eval_prompt_file=%s/eval.txt --set logging.run_dir=%s/%s "
             "--set model.text_encoder=word_embed --set model.decoder=latent_rgb --set data.eval_samples_per_prompt=1 "
             "--set logging.eval_every=0 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=16 %s %s",
             test_vgrpo_bin(), mode, dir, dir, dir, dir, name, recipe, extra);
}

static void check_rows_equal(const char *a, const char *b, int drop_sync, int n_expect) {
    json_t *ra[8], *rb[8];
    int na = read_rows(a, ra, 8, drop_sync), nb = read_rows(b, rb, 8, drop_sync);
    CHECK_MSG(na == n_expect && nb == n_expect, "rows: %s %d, %s %d, expected %d", a, na, b, nb, n_expect);
    for (int i = 0; i < na && i < nb; i++)
        if (!json_equal(ra[i], rb[i])) {
            char *sa = json_dumps(ra[i], JSON_SORT_KEYS | JSON_COMPACT), *sb = json_dumps(rb[i], JSON_SORT_KEYS | JSON_COMPACT);
            test_fail(__FILE__, __LINE__, "metrics row %d differs:\n  %s\n  %s", i, sa, sb);
            free(sa), free(sb);
        }
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
}

/* A straight 2-step run "a" (checkpoint every step, local), then run "s" in `mode` stopped by SIGTERM `delay` s
 * after its step 0 row (the stop's message within 2 s, the exit within max_exit_s), then "s" resumed in `mode` from
 * its checkpoint-1 to the end; checks as in the file's top comment. */
static void stop_and_resume(const char *mode, const char *recipe, double delay, double max_exit_s) {
    const char *dir = tmpdir();
    char out[32768], cmd[4096], x[2048];
    make_inputs(dir);
    cmdline(cmd, sizeof cmd, dir, "a", "local", recipe, "--steps 2 --set checkpoint.every=1");
    REQUIRE_OK(test_run(out, sizeof out, "%s", cmd) ? (test_fail(__FILE__, __LINE__, "%s", out), -1) : 0);
    cmdline(cmd, sizeof cmd, dir, "s", mode, recipe, "--steps 2 --set checkpoint.every=1000");
    /* times from the signal: to the stop's message (`said`), to the exit of `vgrpo run` (`elapsed`) */
    test_run(out, sizeof out,
             "%s > %s/s.log 2>&1 & pid=$!; i=0; while [ ! -s %s/s/metrics.jsonl ] && [ $i -lt 1500 ]; do sleep 0.02; "
             "i=$((i+1)); done; sleep %.2f; t0=$(date +%%s.%%N); kill -TERM $pid; i=0; while ! grep -q 'stopped by' "
             "%s/s.log && [ $i -lt 1500 ]; do sleep 0.01; i=$((i+1)); done; t1=$(date +%%s.%%N); wait $pid; st=$?; "
             "t2=$(date +%%s.%%N); echo status=$st; awk \"BEGIN { print \\\"said=\\\" ($t1 - $t0) \\\" elapsed=\\\" ($t2 - $t0) }\"; "
             "cat %s/s.log",
             cmd, dir, dir, delay, dir, dir);
    const int left = reap(dir);
    const char *e = strstr(out, "elapsed="), *w = strstr(out, "said=");
    const double elapsed = e ? atof(e + 8) : 99, said = w ? atof(w + 5) : 99;
    fprintf(stderr, "    %s: stopped %.2f s, exited %.2f s after SIGTERM\n", mode, said, elapsed);
    CHECK_MSG(strstr(out, "status=1") && said < 2.0 && elapsed < max_exit_s,
              "%s: the stop said %.2f s (< 2 s expected) and the run exited %.2f s (< %.0f s expected) after the "
              "signal: %s", mode, said, elapsed, max_exit_s, out);
    CHECK_MSG(strstr(out, "stopped by signal 15 during step 1 (") &&
                  strstr(out, "step 1 discarded; checkpoint-1 saved: continue with --resume"),
              "%s: got: %s", mode, out);
    CHECK_MSG(left == 0, "%d process(es) of the run left", left);
    /* checkpoint-1 is complete, the straight run's byte for byte, and the only one; row 0 only */
    snprintf(x, sizeof x, "%s/s/checkpoint-1", dir);
    CHECK_MSG(trainer_ckpt_verify(x, NULL) == 0, "%s", core_last_error());
    /* (trainer_state.json holds the recipe, whose mode differs between a local and a colocated run) */
    const char *files[] = {"transformer/diffusion_pytorch_model.safetensors", "optimizer.safetensors", "trainer_state.json"};
    for (int f = 0; f < (strcmp(mode, "local") ? 2 : 3); f++) {
        char fa[1024], fb[1024];
        snprintf(fa, sizeof fa, "%s/a/checkpoint-1/%s", dir, files[f]);
        snprintf(fb, sizeof fb, "%s/s/checkpoint-1/%s", dir, files[f]);
        CHECK_MSG(ckpt_file_cmp(out, sizeof out, fa, fb) == 0, "checkpoint-1/%s differs from the straight run's: %s",
                  files[f], out);
    }
    CHECK_MSG(test_run(out, sizeof out, "ls -A %s/s | grep -e '^\\.checkpoint-' -e '^\\.trash-' -e '^checkpoint-[02-9]'",
                       dir) != 0, "leftovers or other checkpoints: %s", out);
    json_t *rows[4];
    snprintf(x, sizeof x, "%s/s/metrics.jsonl", dir);
    const int nr = read_rows(x, rows, 4, 0);
    CHECK_MSG(nr == 1, "%d metrics rows after the stop in step 1", nr);
    for (int i = 0; i < nr; i++) json_decref(rows[i]);
    /* resumed: the straight run's rows (colocated: weight_sync/ fields aside) and rewards */
    snprintf(x, sizeof x, "--steps 2 --set checkpoint.every=1 --resume %s/s/checkpoint-1", dir);
    cmdline(cmd, sizeof cmd, dir, "s", mode, recipe, x);
    const int rc = test_run(out, sizeof out, "%s", cmd);
    reap(dir);
    CHECK_MSG(rc == 0 && strstr(out, "resumed from"), "resume: status %d: %s", rc, out);
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/a/metrics.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/s/metrics.jsonl", dir);
    check_rows_equal(pa, pb, strcmp(mode, "local") != 0, 3);
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/a/rewards.jsonl %s/s/rewards.jsonl", dir, dir) == 0, "rewards: %s", out);
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/a/checkpoint-2/%s %s/s/checkpoint-2/%s", dir, files[0], dir, files[0]) == 0,
              "checkpoint-2 weights differ: %s", out);
    test_run(out, sizeof out, "rm -rf %s", dir);
}

/* Local: 64 denoising steps, every transition trained (~2.2 s of training, ~0.3 s of rollout per step): the signal
 * lands in the rollout or the training of step 1. */
TEST(stop_local_mid_step_exits_and_resumes_exactly) {
    /* make asan (VGRPO_ASAN=1) runs everything ~5x slower: a quarter of the steps keeps the test's time */
    stop_and_resume("local", getenv("VGRPO_ASAN") ? "--set rollout.num_steps=16 --set algorithm.micro_batch_size=32"
                                                  : "--set rollout.num_steps=64 --set algorithm.micro_batch_size=32",
                    0.3, 2.0);
}

/* Colocated (1 worker): 350 denoising steps, 2 trained per sample (~3 s of rollout in the worker, chunks of 4
 * samples): the trainer is waiting for the rollout when the signal comes. It stops within 2 s; `vgrpo run` exits
 * within 8 s: the trainer then waits up to 5 s (ctl_shutdown) for the worker's shutdown reply, which the worker
 * sometimes loses by closing its socket with ZMQ_LINGER 0 right after sending it (rollout/worker.c). */
TEST(stop_colocated_mid_step_exits_and_resumes_exactly) {
    stop_and_resume("colocated", getenv("VGRPO_ASAN") ? "--set rollout.num_steps=80 --set rollout.batch_size=4 "
                                                        "--set 'algorithm.timestep_selection=random_k 2'"
                                                      : "--set rollout.num_steps=350 --set rollout.batch_size=4 "
                                                        "--set 'algorithm.timestep_selection=random_k 2'",
                    0.5, 8.0);
}


/* The same with algorithm.loss nft (trainer/run/objective.c: its update polls the stop before the optimizer step; the
 * old policy is checkpointed and resumed with the rest). */
TEST(stop_local_nft_mid_step_exits_and_resumes_exactly) {
    stop_and_resume("local", getenv("VGRPO_ASAN") ? "--set algorithm.loss=nft --set rollout.num_steps=16 "
                                                    "--set algorithm.micro_batch_size=32"
                                                  : "--set algorithm.loss=nft --set rollout.num_steps=64 "
                                                    "--set algorithm.micro_batch_size=32",
                    0.3, 2.0);
}
