/* tests/test_lora_run.c — LoRA in the trainer, the weight sync, checkpoints and the jobs (the adapter itself is
 * tests/test_wan_lora.c and test_wan_lora_fixture.c). Tiny preset (umT5 + VAE), 3 prompts, B = 2, G = 4, 4 denoising
 * steps, beta > 0 (the KL reference is the base: the adapters switched off), 1 eval sample per prompt, rank 4 on
 * attn1/attn2's four linears and the FFN (alpha 8). Checks:
 *   - the optimizer step over an adapter (trainer_update_experts on a model with an adapter and no base gradients):
 *     the base bit for bit unchanged after 3 updates, the adapter moved, its Adam state sized to it;
 *   - step 0 with LoRA equals the base: the first rollout's rewards and the first eval equal a run without LoRA bit for
 *     bit (B = 0); local parity: log_prob_mean_abs_diff exactly 0 at every step with the adapters trained; the base is
 *     frozen: the run's closing line names the hash of model.path's transformer after 3 steps; the checkpoint holds
 *     the adapter in both formats (no base weights) with B != 0;
 *   - exact resume: 2 steps + --resume + 2 steps == 4 straight steps (metrics rows; adapter, its EMA and Adam files
 *     byte for byte); a resume with another rank, or by a run without LoRA, is refused naming model.lora.rank;
 *   - colocated: 1 worker and 1 trainer rank equal the local LoRA run bit for bit; the bytes synced each step
 *     (weight_sync/bytes) are the adapter's 4 x numel, against the full model's without LoRA; 2 workers and 2 trainer
 *     ranks: on-policy log_prob_mean_abs_diff 0, and `vgrpo parity --checkpoint` on the trained adapters is exactly 0;
 *   - SP u2r2 (4 ranks): parity on trained adapters within the ring bound;
 *   - `vgrpo eval --checkpoint` of a LoRA checkpoint equals the run's own final eval, and differs from the base's;
 *     `vgrpo generate --checkpoint` draws another video than the base and the same one twice;
 *   - bad input at --dry-run naming the key: an unknown target (listing the valid ones), a rank past a target's
 *     dimensions, alpha <= 0; the LoRA estimate (adapters, no reference copy) in the budget table.
 * Each runs in a few seconds on 2 cores. make test-slow adds the learning run: recipes/tiny-cpu.yaml with
 * --set model.lora.rank=8 raises the eval color_match by more than 3 standard errors. */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "core/checksum.h"
#include "model/dit/wan_dit.h"
#include "model/dit/wan_lora.h"
#include "tests/metrics_rows.h"
#include "tests/parity_json.h"
#include "tests/test.h"
#include "trainer/optim/optim.h"
#include "trainer/step/train_step.h"

#define LORA "--set model.lora.rank=4 --set model.lora.alpha=8 --set model.lora.targets='[to_q, to_k, to_v, to_out.0, ffn.net.0.proj, ffn.net.2]'"

#define SMALL                                                                                                     \
    "--set rollout.num_steps=4 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 "              \
    "--set data.eval_samples_per_prompt=1 --set logging.eval_every=0 --set algorithm.beta=0.05 "                  \
    "--set checkpoint.every=1 --set checkpoint.total_limit=0 --set optim.lr=2e-3"

static double num(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static void free_rows(json_t **rows, int n) {
    for (int i = 0; i < n; i++) json_decref(rows[i]);
}

/* This test's folder (pid-suffixed, as tests/test_colocated.c: suites of several builds may run at once). */
static const char *tmpdir(void) {
    static char path[600];
    char out[1024];
    snprintf(path, sizeof path, "%s.%d", test_tmpdir(), (int)getpid());
    if (test_run(out, sizeof out, "rm -rf %s && mkdir -p %s", path, path)) test_fail(__FILE__, __LINE__, "cannot create %s", path);
    return path;
}

/* Kills what is left of a colocated run under dir (its command lines name dir), then removes dir. */
static void cleanup(const char *dir) {
    char out[1024];
    test_run(out, sizeof out, "pkill -KILL -f '[v]grpo .*%s/'; rm -rf %s", dir, dir);
}

/* A tiny model in dir/model and a 3-prompt file dir/prompts.txt. */
static void make_inputs(const char *dir) {
    char out[4096];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 2 && "
                                      "printf 'a red kite\\na green frog\\na blue boat\\n' > %s/prompts.txt",
                     test_vgrpo_bin(), dir, dir) == 0);
}

/* `vgrpo CMD recipes/tiny-cpu.yaml` with the test's model, prompts and SMALL, run folder dir/name. */
static int job(char *out, size_t cap, const char *cmd, const char *dir, const char *name, const char *extra) {
    return test_run(out, cap,
                    "env OMP_NUM_THREADS=2 %s %s recipes/tiny-cpu.yaml --set model.path=%s/model "
                    "--set data.prompt_file=%s/prompts.txt --set data.eval_prompt_file=%s/prompts.txt "
                    "--set logging.run_dir=%s/%s " SMALL " %s",
                    test_vgrpo_bin(), cmd, dir, dir, dir, dir, name, extra);
}

static int read_metrics(const char *dir, const char *name, json_t **rows, int cap, int drop_sync) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", dir, name);
    return read_rows(p, rows, cap, drop_sync);
}

/* The rewards.jsonl row of step `step` as compact JSON (malloc'd), or NULL. */
static char *rewards_row(const char *dir, const char *name, int step) {
    char p[1024], line[1 << 14];
    snprintf(p, sizeof p, "%s/%s/rewards.jsonl", dir, name);
    FILE *f = fopen(p, "r");
    char *got = NULL;
    while (f && !got && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (j && json_integer_value(json_object_get(j, "step")) == step) got = json_dumps(j, JSON_COMPACT);
        json_decref(j);
    }
    if (f) fclose(f);
    return got;
}

static void check_rows_equal(const char *dir, const char *a, const char *b, int drop_sync, int n_expect) {
    json_t *ra[16], *rb[16];
    int na = read_metrics(dir, a, ra, 16, drop_sync), nb = read_metrics(dir, b, rb, 16, drop_sync);
    CHECK_MSG(na == n_expect && nb == n_expect, "rows: %s %d, %s %d, expected %d", a, na, b, nb, n_expect);
    for (int i = 0; i < na && i < nb; i++) {
        if (json_equal(ra[i], rb[i])) continue;
        char *sa = json_dumps(ra[i], JSON_SORT_KEYS | JSON_COMPACT), *sb = json_dumps(rb[i], JSON_SORT_KEYS | JSON_COMPACT);
        test_fail(__FILE__, __LINE__, "metrics row %d differs between %s and %s:\n  %s\n  %s", i, a, b, sa, sb);
        free(sa), free(sb);
    }
    free_rows(ra, na > 0 ? na : 0), free_rows(rb, nb > 0 ? nb : 0);
}

static int same_file(const char *dir, const char *a, const char *b) {
    char out[256];
    return test_run(out, sizeof out, "cmp -s %s/%s %s/%s", dir, a, dir, b) == 0;
}

/* ---- the optimizer step over an adapter, in process ---- */

TEST(lora_update_freezes_base_trains_adapter) {
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model m;
    REQUIRE_OK(wan_model_init(&m, &c));
    wan_params_init_random(&m, 3);
    const wan_lora_config lc = {.rank = 4, .alpha = 8, .targets = WAN_LORA_ALL_BLOCK, .init_seed = 1};
    wan_lora l;
    REQUIRE_OK(wan_lora_init(&l, &c, &lc, 0));
    REQUIRE_OK(wan_lora_alloc_grads(&l));
    REQUIRE_OK(wan_model_attach_lora(&m, &l));
    float *base0 = malloc(sizeof(float) * (size_t)m.layout.numel), *ad0 = malloc(sizeof(float) * (size_t)l.layout.numel);
    REQUIRE(base0 && ad0);
    memcpy(base0, m.params, sizeof(float) * (size_t)m.layout.numel);
    memcpy(ad0, l.params, sizeof(float) * (size_t)l.layout.numel);
    /* a batch of 2 samples x 3 steps of random latents (shape 16 x 2 x 4 x 4), CFG 2, KL to the base */
    enum { N = 3, S = 2 };
    core_traj tr[S];
    const int64_t shape[4] = {16, 2, 4, 4};
    float *cond[S], adv[S] = {1.0f, -1.0f};
    uint8_t mask[S] = {1, 1};
    const int L = 4;
    for (int s = 0; s < S; s++) {
        REQUIRE_OK(core_traj_alloc(&tr[s], N, shape));
        tr[s].uid = (uint64_t)s, tr[s].eta = 1.0f, tr[s].guidance_scale = tr[s].guidance_scale_2 = 2.0f;
        const float sig[N + 1] = {1.0f, 0.8f, 0.5f, 0.0f};
        for (int i = 0; i <= N; i++) tr[s].sigmas[i] = sig[i];
        for (int i = 0; i < N; i++) tr[s].timesteps[i] = 1000 * sig[i], tr[s].has_log_prob[i] = i < N - 1, tr[s].log_probs[i] = 0;
        test_fill_uniform(tr[s].latents, (size_t)(N + 1) * 16 * 2 * 4 * 4, 10 + s, -1, 1);
        cond[s] = malloc(sizeof(float) * (size_t)L * c.text_dim);
        test_fill_uniform(cond[s], (size_t)L * c.text_dim, 20 + s, -1, 1);
    }
    trainer_batch b = {.n = S, .traj = tr, .cond = (const float *const *)cond, .text_len = L, .adv = adv, .mask = mask};
    trainer_config tc = {.clip_eps = 0.2f, .beta = 0.05f, .micro_batch_size = 3, .acts_mode = WAN_ACTS_STORE};
    REQUIRE_OK(grpo_selection_parse("all", &tc.sel));
    optim_adamw opt;
    const optim_config oc = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .max_grad_norm = 1.0};
    REQUIRE_OK(optim_adamw_init(&opt, l.layout.numel));
    /* the model's own optimizer size is refused: the update steps the adapter */
    optim_adamw wrong;
    REQUIRE_OK(optim_adamw_init(&wrong, m.layout.numel));
    CHECK(trainer_update(&m, &m, NULL, &tc, &b, &wrong, &oc, NULL, NULL) == -1);
    CHECK_MSG(strstr(core_last_error(), "LoRA adapter"), "got: %s", core_last_error());
    optim_adamw_free(&wrong);
    double kl0 = -1;
    for (int u = 0; u < 3; u++) {
        grpo_loss_stats st = {0};
        REQUIRE_OK(trainer_update(&m, &m, NULL, &tc, &b, &opt, &oc, &st, NULL));
        if (u == 0) kl0 = st.kl;
    }
    CHECK_MSG(kl0 == 0.0, "KL at the first update (B = 0: the policy is the base) is %g", kl0);
    CHECK(m.grads == NULL && opt.step == 3);
    CHECK_MSG(!memcmp(base0, m.params, sizeof(float) * (size_t)m.layout.numel), "a base weight changed");
    int64_t moved = 0;
    for (int64_t i = 0; i < l.layout.numel; i++) moved += l.params[i] != ad0[i];
    CHECK_MSG(moved > l.layout.numel / 2, "only %lld of %lld adapter values moved", (long long)moved,
              (long long)l.layout.numel);
    /* the KL reference is the base: after training, the adapter's forward differs from lora_off's */
    grpo_loss_stats st = {0};
    REQUIRE_OK(trainer_accumulate(&m, &m, NULL, &tc, &b, 0, &st));
    CHECK_MSG(st.kl > 0, "KL to the base after 3 updates: %g", st.kl);
    optim_adamw_free(&opt);
    for (int s = 0; s < S; s++) core_traj_free(&tr[s]), free(cond[s]);
    free(base0), free(ad0);
    wan_model_free(&m);
    wan_lora_free(&l);
}

/* ---- local runs ---- */

TEST(lora_run_step0_equals_base_local_parity_frozen_base) {
    const char *dir = tmpdir();
    char out[1 << 15];
    make_inputs(dir);
    int st = job(out, sizeof out, "run", dir, "base", "--steps 1 --set checkpoint.every=-1");
    if (st) test_fail(__FILE__, __LINE__, "base run: %s", out);
    st = job(out, sizeof out, "run", dir, "lora", "--steps 3 " LORA);
    if (st) test_fail(__FILE__, __LINE__, "LoRA run: %s", out);
    REQUIRE(st == 0);
    /* step 0: the same rollout, rewards and eval as the base model (B = 0 adds exactly 0) */
    char *ra = rewards_row(dir, "base", 0), *rb = rewards_row(dir, "lora", 0);
    CHECK_MSG(ra && rb && !strcmp(ra, rb), "step-0 rewards differ:\n  %s\n  %s", ra ? ra : "-", rb ? rb : "-");
    free(ra), free(rb);
    json_t *a[8], *b[8];
    const int na = read_metrics(dir, "base", a, 8, 0), nb = read_metrics(dir, "lora", b, 8, 0);
    REQUIRE(na == 2 && nb == 4);
    const char *same[] = {"eval/color_match/mean", "reward/mean", "reward/std", "kl", "log_prob_mean_abs_diff"};
    for (int k = 0; k < 5; k++)
        CHECK_MSG(num(a[0], same[k]) == num(b[0], same[k]), "step 0 %s: base %.9g, LoRA %.9g", same[k],
                  num(a[0], same[k]), num(b[0], same[k]));
    CHECK(num(b[0], "kl") == 0.0);
    /* local parity with trained adapters: the trainer's recomputed log-probs equal the rollout's */
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(num(b[i], "log_prob_mean_abs_diff") == 0.0, "step %d: log_prob_mean_abs_diff %g", i,
                  num(b[i], "log_prob_mean_abs_diff"));
        CHECK(num(b[i], "policy_version") == i);
    }
    CHECK_MSG(num(b[2], "kl") > 0, "step 2 KL to the base: %g", num(b[2], "kl"));
    CHECK(isfinite(num(b[3], "eval/color_match/mean")) && num(b[3], "eval/color_match/mean") != num(b[0], "eval/color_match/mean"));
    free_rows(a, na), free_rows(b, nb);
    /* the frozen base: the closing line's hash is model.path's transformer's */
    wan_model m;
    char p[1024], want[128];
    snprintf(p, sizeof p, "%s/model/transformer", dir);
    REQUIRE_OK(wan_model_load(&m, p));
    const wan_model *mm[1] = {&m};
    uint64_t h;
    REQUIRE_OK(wan_models_hash(mm, 1, &h));
    snprintf(want, sizeof want, "LoRA: base weights unchanged after 3 steps (model xxh64 %016llx)", (unsigned long long)h);
    CHECK_MSG(strstr(out, want), "wanted \"%s\" in: %s", want, out);
    /* the checkpoint: the adapter in diffusers' and peft's formats, no base weights; B trained away from 0 */
    const char *files[] = {"pytorch_lora_weights.safetensors", "adapter_model.safetensors", "adapter_config.json"};
    for (int k = 0; k < 3; k++) {
        snprintf(p, sizeof p, "%s/lora/checkpoint-3/transformer/%s", dir, files[k]);
        CHECK_MSG(access(p, R_OK) == 0, "missing %s", p);
    }
    snprintf(p, sizeof p, "%s/lora/checkpoint-3/transformer/diffusion_pytorch_model.safetensors", dir);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/lora/checkpoint-3/transformer", dir);
    wan_lora l;
    REQUIRE_OK(wan_lora_load(&l, &m.cfg, p, 0));
    CHECK(l.cfg.rank == 4 && l.cfg.alpha == 8 && l.cfg.targets == (WAN_LORA_ALL_BLOCK & ~0u));
    double bsum = 0;
    for (int i = 0; i < l.layout.count; i++)
        if (strstr(l.layout.tensors[i].name, "lora_B"))
            for (int64_t k = 0; k < l.layout.tensors[i].numel; k++) bsum += fabs(l.params[l.layout.tensors[i].offset + k]);
    CHECK_MSG(bsum > 0, "every lora_B is still 0 after 3 steps");
    wan_lora_free(&l);
    wan_model_free(&m);
    cleanup(dir);
}

TEST(lora_run_resume_exact_and_refusals) {
    const char *dir = tmpdir();
    char out[1 << 15];
    make_inputs(dir);
    const char *ema = LORA " --set algorithm.ema_decay=0.9 --set optim.total_steps=4";
    int st = job(out, sizeof out, "run", dir, "straight", ema);
    if (st) test_fail(__FILE__, __LINE__, "straight run: %s", out);
    char extra[2048];
    snprintf(extra, sizeof extra, "%s --steps 2", ema);
    st = job(out, sizeof out, "run", dir, "resumed", extra);
    if (st) test_fail(__FILE__, __LINE__, "2 steps: %s", out);
    snprintf(extra, sizeof extra, "%s --resume %s/resumed/checkpoint-2", ema, dir);
    st = job(out, sizeof out, "run", dir, "resumed", extra);
    if (st) test_fail(__FILE__, __LINE__, "resume: %s", out);
    REQUIRE(st == 0);
    check_rows_equal(dir, "straight", "resumed", 0, 5);
    const char *files[] = {"optimizer.safetensors", "transformer/pytorch_lora_weights.safetensors",
                           "transformer/adapter_model.safetensors", "ema/transformer/pytorch_lora_weights.safetensors"};
    for (int k = 0; k < 4; k++) {
        char a[256], b[256];
        snprintf(a, sizeof a, "straight/checkpoint-4/%s", files[k]);
        snprintf(b, sizeof b, "resumed/checkpoint-4/%s", files[k]);
        CHECK_MSG(same_file(dir, a, b), "checkpoint-4/%s differs", files[k]);
    }
    /* another rank, or no LoRA at all: refused naming the key, nothing written */
    snprintf(extra, sizeof extra, "%s --resume %s/resumed/checkpoint-2 --set model.lora.rank=8", ema, dir);
    st = job(out, sizeof out, "run", dir, "resumed", extra);
    CHECK_MSG(st == 1 && strstr(out, "model.lora.rank (checkpoint 4, now 8)"), "rc %d: %s", st, out);
    snprintf(extra, sizeof extra, "--set algorithm.ema_decay=0.9 --set optim.total_steps=4 --resume %s/resumed/checkpoint-2",
             dir);
    st = job(out, sizeof out, "run", dir, "resumed", extra);
    CHECK_MSG(st == 1 && strstr(out, "holds a LoRA adapter") && strstr(out, "model.lora.rank"), "rc %d: %s", st, out);
    check_rows_equal(dir, "straight", "resumed", 0, 5);
    cleanup(dir);
}

/* ---- colocated: the adapter sync, its size, parity across processes ---- */

static int64_t adapter_bytes(const char *dir) {
    wan_config c;
    char p[1024];
    snprintf(p, sizeof p, "%s/model/transformer/config.json", dir);
    if (wan_config_load(&c, p)) return -1;
    uint32_t mask;
    const char *names[] = {"to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"};
    if (wan_lora_targets_parse(&mask, names, 6, "test")) return -1;
    const wan_lora_config lc = {.rank = 4, .alpha = 8, .targets = mask};
    return 4 * wan_lora_numel(&c, &lc);
}

/* dir/name/parity.json: exactly 0 over every one of the 4 denoising steps (all are trained) */
static void check_parity_at(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/parity.json", dir, name);
    check_parity_zero(p, 4);
}

TEST(lora_colocated_sync_bytes_and_parity) {
    const char *dir = tmpdir();
    char out[1 << 15];
    make_inputs(dir);
    const char *col = "--set mode=colocated";
    int st = job(out, sizeof out, "run", dir, "local", "--steps 2 " LORA);
    if (st) test_fail(__FILE__, __LINE__, "local: %s", out);
    char extra[2048];
    snprintf(extra, sizeof extra, "%s --steps 2 %s", col, LORA);
    st = job(out, sizeof out, "run", dir, "col", extra);
    if (st) test_fail(__FILE__, __LINE__, "colocated: %s", out);
    CHECK_MSG(strstr(out, "weight sync: ") && strstr(out, "(LoRA adapters)") && strstr(out, " GB/s to 1 worker(s)"), "%s",
              out);
    snprintf(extra, sizeof extra, "%s --steps 1 --set checkpoint.every=-1", col);
    st = job(out, sizeof out, "run", dir, "full", extra);
    if (st) test_fail(__FILE__, __LINE__, "colocated without LoRA: %s", out);
    REQUIRE(st == 0);
    check_rows_equal(dir, "local", "col", 1, 3); /* bit for bit, weight_sync/ fields aside */
    json_t *c[8], *f[8];
    const int nc = read_metrics(dir, "col", c, 8, 0), nf = read_metrics(dir, "full", f, 8, 0);
    REQUIRE(nc == 3 && nf == 2);
    const int64_t want = adapter_bytes(dir);
    wan_config cfg;
    char p[1024];
    snprintf(p, sizeof p, "%s/model/transformer/config.json", dir);
    REQUIRE_OK(wan_config_load(&cfg, p));
    wan_layout lay;
    REQUIRE_OK(wan_layout_init(&lay, &cfg));
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(num(c[i], "weight_sync/bytes") == (double)want, "step %d: weight_sync/bytes %.0f, the adapter has %lld "
                  "bytes", i, num(c[i], "weight_sync/bytes"), (long long)want);
        CHECK(num(c[i], "weight_sync/hash_match") == 1);
    }
    /* the sync's rate: bytes x workers (1 here) over its seconds, the two timing fields of each row (read raw: the
     * comparisons drop them) */
    snprintf(p, sizeof p, "%s/col/metrics.jsonl", dir);
    FILE *mf = fopen(p, "r");
    char line[1 << 14];
    int rows = 0;
    while (mf && fgets(line, sizeof line, mf) && rows < 2) {
        json_t *o = json_loads(line, 0, NULL);
        const double gbps = num(o, "weight_sync/gb_per_s"), secs = num(o, "weight_sync/seconds");
        CHECK_MSG(gbps > 0 && secs > 0 && fabs(gbps * secs * 1e9 / (double)want - 1) < 1e-9,
                  "row %d: weight_sync/gb_per_s %g, seconds %g, bytes %lld", rows, gbps, secs, (long long)want);
        json_decref(o);
        rows++;
    }
    if (mf) fclose(mf);
    CHECK(rows == 2);
    CHECK_MSG(num(f[0], "weight_sync/bytes") == 4.0 * (double)lay.numel, "full sync: %.0f bytes, the model %lld",
              num(f[0], "weight_sync/bytes"), (long long)(4 * lay.numel));
    fprintf(stderr, "  weight sync per step and worker: LoRA rank 4 %lld bytes, full %lld bytes (%.1f%%)\n", (long long)want,
            (long long)(4 * lay.numel), 100.0 * (double)want / (4.0 * (double)lay.numel));
    wan_layout_free(&lay);
    free_rows(c, nc), free_rows(f, nf);
    /* 2 workers (chunks of 3 samples) and 2 trainer ranks (5 transitions per forward): on-policy log-probs exact at
     * every step, then `vgrpo parity` on the trained adapters of checkpoint-2 exactly 0 */
    const char *two = "--set parallel.rollout_workers=2 --set rollout.batch_size=3 --set parallel.trainer_ranks=2 "
                      "--set algorithm.micro_batch_size=5";
    snprintf(extra, sizeof extra, "%s %s --set optim.total_steps=2 %s", col, two, LORA);
    st = job(out, sizeof out, "run", dir, "two", extra);
    if (st) test_fail(__FILE__, __LINE__, "2 workers, 2 ranks: %s", out);
    REQUIRE(st == 0);
    json_t *t[8];
    const int nt = read_metrics(dir, "two", t, 8, 0);
    REQUIRE(nt == 3);
    for (int i = 0; i < 2; i++)
        CHECK_MSG(num(t[i], "log_prob_mean_abs_diff") == 0.0 && num(t[i], "weight_sync/hash_match") == 1,
                  "step %d: log_prob_mean_abs_diff %g", i, num(t[i], "log_prob_mean_abs_diff"));
    free_rows(t, nt);
    snprintf(extra, sizeof extra, "%s %s --set optim.total_steps=2 %s --checkpoint %s/two/checkpoint-2", col, two, LORA, dir);
    st = job(out, sizeof out, "parity", dir, "two", extra);
    if (st) test_fail(__FILE__, __LINE__, "parity: %s", out);
    CHECK_MSG(strstr(out, "at policy version 2 (LoRA adapters)") && strstr(out, "PASS"), "%s", out);
    check_parity_at(dir, "two");
    cleanup(dir);
}

TEST(lora_sp_u2r2_parity_within_ring_bound) {
    const char *dir = tmpdir();
    char out[1 << 15], extra[2048];
    make_inputs(dir);
    const char *sp = "--set mode=colocated --set parallel.trainer_ranks=4 --set parallel.sp=4 "
                     "--set parallel.ulysses_degree=2 --set optim.total_steps=2";
    snprintf(extra, sizeof extra, "%s %s", sp, LORA);
    int st = job(out, sizeof out, "run", dir, "sp", extra);
    if (st) test_fail(__FILE__, __LINE__, "u2r2 run: %s", out);
    REQUIRE(st == 0);
    snprintf(extra, sizeof extra, "%s %s --checkpoint %s/sp/checkpoint-2", sp, LORA, dir);
    st = job(out, sizeof out, "parity", dir, "sp", extra);
    CHECK_MSG(st == 0 && strstr(out, "PASS") && strstr(out, "ulysses 2, ring 2"), "rc %d: %s", st, out);
    char p[1024];
    snprintf(p, sizeof p, "%s/sp/parity.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    REQUIRE(j);
    const double dv = json_number_value(json_object_get(j, "max_abs_dv")),
                 tv = json_number_value(json_object_get(j, "tolerance_dv"));
    CHECK_MSG(dv <= tv && tv > 0 && tv < 1e-3, "max |dv| %g, ring bound %g", dv, tv);
    fprintf(stderr, "  u2r2 LoRA parity: max |dv| %.3g (bound %.3g), max |dlogp| %.3g (bound %.3g)\n", dv, tv,
            json_number_value(json_object_get(j, "max_abs_dlogp")), json_number_value(json_object_get(j, "tolerance_dlogp")));
    json_decref(j);
    cleanup(dir);
}

/* ---- eval and generate on a LoRA checkpoint ---- */

static double eval_mean(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/eval.json", dir, name);
    json_t *j = json_load_file(p, 0, NULL);
    const double m = j ? json_number_value(json_object_get(json_object_get(json_object_get(j, "stats"), "color_match"), "mean")) : NAN;
    json_decref(j);
    return m;
}

TEST(lora_eval_and_generate_checkpoint) {
    const char *dir = tmpdir();
    char out[1 << 15], extra[2048];
    make_inputs(dir);
    int st = job(out, sizeof out, "run", dir, "run", "--steps 2 --set optim.lr=2e-2 " LORA);
    if (st) test_fail(__FILE__, __LINE__, "run: %s", out);
    REQUIRE(st == 0);
    json_t *r[4];
    const int n = read_metrics(dir, "run", r, 4, 0);
    REQUIRE(n == 3);
    const double in_run = num(r[2], "eval/color_match/mean"), initial = num(r[0], "eval/color_match/mean");
    free_rows(r, n);
    snprintf(extra, sizeof extra, "--checkpoint %s/run/checkpoint-2 --out %s/ev", dir, dir);
    st = job(out, sizeof out, "eval", dir, "run", extra);
    if (st) test_fail(__FILE__, __LINE__, "eval: %s", out);
    CHECK_MSG(strstr(out, "+ LoRA "), "%s", out);
    snprintf(extra, sizeof extra, "--out %s/ev0", dir);
    st = job(out, sizeof out, "eval", dir, "run", extra);
    if (st) test_fail(__FILE__, __LINE__, "base eval: %s", out);
    const double lora = eval_mean(dir, "ev"), base = eval_mean(dir, "ev0");
    CHECK_MSG(fabs(lora - in_run) <= 1e-8 && fabs(base - initial) <= 1e-8,
              "eval --checkpoint %.9g vs the run's final eval %.9g; base %.9g vs initial %.9g", lora, in_run, base, initial);
    CHECK_MSG(lora != base, "the adapters changed nothing: %.9g", lora);
    /* generate: another video than the base pipeline's, the same one twice */
    const char *g = "--prompt 'a red kite' --frames 5 --height 32 --width 32 --steps 6 --seed 1";
    st = test_run(out, sizeof out, "%s generate --pipeline %s/model %s --out %s/base.mp4", test_vgrpo_bin(), dir, g, dir);
    if (st) test_fail(__FILE__, __LINE__, "generate: %s", out);
    for (int k = 0; k < 2; k++) {
        st = test_run(out, sizeof out, "%s generate --pipeline %s/model %s --checkpoint %s/run/checkpoint-2 --out %s/l%d.mp4",
                      test_vgrpo_bin(), dir, g, dir, dir, k);
        if (st) test_fail(__FILE__, __LINE__, "generate --checkpoint: %s", out);
    }
    CHECK_MSG(strstr(out, "LoRA adapter(s) from"), "%s", out);
    CHECK(!same_file(dir, "base.png", "l0.png") && same_file(dir, "l0.png", "l1.png"));
    cleanup(dir);
}

/* ---- bad input ---- */

TEST(lora_bad_input_and_budget) {
    char out[1 << 15];
    const char *bin = test_vgrpo_bin();
    const char *run = "run recipes/tiny-cpu.yaml --dry-run --set model.path=/nonexistent/tiny --set model.init_preset=tiny "
                      "--set model.lora.rank=8 --set model.lora.alpha=16";
    CHECK(test_run(out, sizeof out, "%s %s --set 'model.lora.targets=[to_q, attn3.to_k]'", bin, run) == 1);
    CHECK_MSG(strstr(out, "model.lora.targets: unknown target \"attn3.to_k\"") && strstr(out, "attn1.to_q, attn1.to_k") &&
                  strstr(out, "proj_out"), "%s", out);
    CHECK(test_run(out, sizeof out, "%s %s --set model.lora.rank=129", bin, run) == 1);
    CHECK_MSG(strstr(out, "model.lora.rank: rank 129 is larger than attn1.to_q's smaller dimension (in 128, out 128)"),
              "%s", out);
    CHECK(test_run(out, sizeof out, "%s %s --set model.lora.alpha=0", bin, run) == 1);
    CHECK_MSG(strstr(out, "model.lora.alpha: must be > 0"), "%s", out);
    CHECK(test_run(out, sizeof out, "%s %s --set model.lora.rank=-2", bin, run) == 1);
    CHECK_MSG(strstr(out, "model.lora.rank: must be >= 0"), "%s", out);
    CHECK(test_run(out, sizeof out, "%s %s --set 'model.lora.targets=[]'", bin, run) == 1);
    CHECK_MSG(strstr(out, "model.lora.targets"), "%s", out);
    /* the estimate: adapters with gradients and moments, no KL reference copy (the base with the adapters off) */
    CHECK(test_run(out, sizeof out, "%s %s --set algorithm.beta=0.01", bin, run) == 0);
    CHECK_MSG(strstr(out, "LoRA adapters") && strstr(out, "adapter gradients + AdamW m, v") &&
                  !strstr(out, "KL reference weights") && !strstr(out, "    gradients + AdamW"), "%s", out);
    /* the 1.3B recipe's LoRA variant at --dry-run */
    CHECK(test_run(out, sizeof out, "%s run recipes/wan2.1-t2v-1.3b-lora.yaml --dry-run", bin) == 0);
    CHECK_MSG(strstr(out, "LoRA adapters") && strstr(out, "rank: 32"), "%s", out);
}

/* Learning with LoRA (make test-slow): recipes/tiny-cpu.yaml with --set model.lora.rank=8 (the recipe's alpha 128 and
 * six block linears, its lr), 150 steps: the final eval's color_match exceeds the first by more than 3 standard errors
 * of the difference (recipes/README.md quotes 0.076 -> 0.310, 9.1 standard errors). About 3 minutes on 2 cores. */
TEST(lora_tiny_learns_slow) {
    TEST_SLOW();
    const char *dir = tmpdir();
    char out[1 << 16], path[700];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 0", test_vgrpo_bin(), dir) == 0);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.path=%s/model --set logging.run_dir=%s/run "
                                      "--set model.lora.rank=8", test_vgrpo_bin(), dir, dir) == 0);
    json_t *rows[256];
    snprintf(path, sizeof path, "%s/run/metrics.jsonl", dir);
    int n = read_rows(path, rows, 256, 0);
    REQUIRE(n >= 2);
    const double m0 = num(rows[0], "eval/color_match/mean"), s0 = num(rows[0], "eval/color_match/se");
    const double m1 = num(rows[n - 1], "eval/color_match/mean"), s1 = num(rows[n - 1], "eval/color_match/se");
    const double z = (m1 - m0) / sqrt(s0 * s0 + s1 * s1);
    fprintf(stderr, "  LoRA rank 8: eval color_match %.4f +- %.4f -> %.4f +- %.4f (%.1f standard errors)\n", m0, s0, m1,
            s1, z);
    CHECK(z > 3);
    CHECK_MSG(strstr(out, "LoRA: base weights unchanged after 150 steps"), "%s", out);
    free_rows(rows, n);
    cleanup(dir);
}
