/* tests/test_zero.c — ZeRO stages 1 and 2 (parallel.zero_stage, trainer/dp/zero.h): sharded AdamW state and gradients
 * over the trainer ranks, bit-identical to stage 0.
 *   - one process: the shard layout (whole OPTIM_CHUNK chunks, every value owned once, ranks without values), the
 *     gradient norm from chunk sums (optim_sumsq_chunks + optim_sumsq_combine == optim_sumsq, bit for bit, from any
 *     split into ranges), AdamW on shards == AdamW on the whole state, a sharded state refused by optim_adamw_step
 *     and by the checkpoint writer, and a whole checkpoint read back into the shards of 2 and 3 ranks (each rank gets
 *     its slice of m and v, nothing else);
 *   - under mpirun (tests/mpi/mpi_zero.c, 2 and 3 ranks): the rank-order collectives and 3 optimizer steps of stages
 *     1 and 2 against stage 0 on two tiny experts, bit for bit;
 *   - whole runs (mode colocated, the tiny preset, 3 GRPO steps, KL term and clipping active): stages 1 and 2 at 2
 *     and at 3 trainer ranks equal stage 0 at the same count bit for bit: metrics rows (time/ and
 *     weight_sync/seconds aside), rewards.jsonl, and every file of checkpoint-1..3 (weights, optimizer.safetensors,
 *     trainer_state.json: the checkpoints are written gathered); a stage-2 run of 2 steps resumed for the third at
 *     the same count equals the straight stage-0 run; a 3-rank stage-2 checkpoint resumed at 2 ranks with stage 1
 *     equals the same checkpoint resumed at 2 ranks with stage 0; LoRA (model.lora.rank 8: the adapters' flat
 *     buffers sharded) likewise at 3 ranks, with a resume;
 *   - the recipe key (0..2, named when out of range) and the budget's per-rank AdamW shard. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "tests/metrics_rows.h"
#include "tests/test.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/optim/optim.h"
#include "trainer/dp/zero.h"

/* ---- one process ---- */

TEST(zero_shards_cover_whole_chunks) {
    const int64_t ns[] = {1, 8191, 8192, 8193, 3 * 8192 + 5, 589248, 45056};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int size = 1; size <= 5; size++) {
            const int64_t n = ns[k];
            int64_t *offs = dp_zero_offsets(n, size);
            REQUIRE(offs);
            CHECK(offs[0] == 0 && offs[size] == n);
            for (int r = 0; r < size; r++) {
                int64_t lo, len;
                dp_zero_shard(n, r, size, &lo, &len);
                CHECK(lo == offs[r] && len == offs[r + 1] - offs[r] && len >= 0);
                CHECK(lo % OPTIM_CHUNK == 0 || lo == n); /* whole chunks: the norm's partial sums */
            }
            free(offs);
        }
    int64_t lo, len; /* one chunk over three ranks: two own nothing */
    dp_zero_shard(100, 0, 3, &lo, &len);
    CHECK(len == 0);
    dp_zero_shard(100, 2, 3, &lo, &len);
    CHECK(lo == 0 && len == 100);
}

TEST(zero_norm_from_chunk_sums_is_sumsq) {
    const int64_t n = 5 * OPTIM_CHUNK + 1234;
    float *g = malloc(sizeof(float) * (size_t)n);
    double *part = malloc(sizeof(double) * 6);
    REQUIRE(g && part);
    test_fill_uniform(g, (size_t)n, 5, -3, 3);
    const double whole = optim_sumsq(g, n);
    for (int size = 1; size <= 4; size++) { /* the chunk sums of every rank's range, then combined */
        int64_t *offs = dp_zero_offsets(n, size);
        for (int r = 0; r < size; r++)
            optim_sumsq_chunks(g, n, offs[r] / OPTIM_CHUNK, (offs[r + 1] + OPTIM_CHUNK - 1) / OPTIM_CHUNK,
                               part + offs[r] / OPTIM_CHUNK);
        const double s = optim_sumsq_combine(part, 6);
        CHECK_MSG(!memcmp(&s, &whole, sizeof s), "%d ranges: %.17g vs %.17g", size, s, whole);
        free(offs);
    }
    free(g), free(part);
}

TEST(zero_adamw_on_shards_equals_whole) {
    const int64_t n = 3 * OPTIM_CHUNK + 77;
    float *p0 = malloc(sizeof(float) * (size_t)n), *p1 = malloc(sizeof(float) * (size_t)n);
    float *g0 = malloc(sizeof(float) * (size_t)n), *g1 = malloc(sizeof(float) * (size_t)n);
    REQUIRE(p0 && p1 && g0 && g1);
    test_fill_uniform(p0, (size_t)n, 1, -1, 1);
    memcpy(p1, p0, sizeof(float) * (size_t)n);
    const optim_config oc = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1,
                             .max_grad_norm = 1.0, .schedule = OPTIM_SCHED_COSINE, .warmup_steps = 1, .total_steps = 5};
    optim_adamw whole, sh[3];
    REQUIRE_OK(optim_adamw_init(&whole, n));
    for (int r = 0; r < 3; r++) {
        int64_t lo, len;
        dp_zero_shard(n, r, 3, &lo, &len);
        REQUIRE_OK(optim_adamw_init_shard(&sh[r], n, lo, len));
    }
    for (int t = 0; t < 4; t++) {
        test_fill_uniform(g0, (size_t)n, 10 + t, -1, 1);
        memcpy(g1, g0, sizeof(float) * (size_t)n);
        const double norm = optim_grad_norm(g0, n), coef = optim_clip_coef(norm, oc.max_grad_norm);
        REQUIRE_OK(optim_adamw_step_coef(&whole, &oc, p0, g0, NULL, norm, coef, NULL));
        for (int r = 0; r < 3; r++) REQUIRE_OK(optim_adamw_step_coef(&sh[r], &oc, p1, g1, NULL, norm, coef, NULL));
    }
    CHECK(!memcmp(p0, p1, sizeof(float) * (size_t)n));
    for (int r = 0; r < 3; r++)
        CHECK(!memcmp(whole.m + sh[r].lo, sh[r].m, sizeof(float) * (size_t)sh[r].len) &&
              !memcmp(whole.v + sh[r].lo, sh[r].v, sizeof(float) * (size_t)sh[r].len) && sh[r].step == 4);
    /* a shard cannot take the step that computes its own norm */
    CHECK(optim_adamw_step(&sh[1], &oc, p1, g1, NULL, NULL) == -1 && strstr(core_last_error(), "sharded"));
    optim_adamw bad;
    CHECK(optim_adamw_init_shard(&bad, n, n - 5, 6) == -1 && !bad.m);
    optim_adamw_free(&whole);
    for (int r = 0; r < 3; r++) optim_adamw_free(&sh[r]);
    free(p0), free(p1), free(g0), free(g1);
}

/* A whole checkpoint read into the shards of 2 and 3 ranks: each gets its slice; a shard is never written. */
TEST(zero_checkpoint_read_into_shards) {
    const char *dir = test_tmpdir();
    wan_config c;
    REQUIRE_OK(wan_config_preset(&c, "tiny"));
    wan_model m;
    optim_adamw o;
    REQUIRE_OK(wan_model_init(&m, &c));
    wan_params_init_random(&m, 3);
    const int64_t n = m.layout.numel;
    REQUIRE_OK(optim_adamw_init(&o, n));
    test_fill_uniform(o.m, (size_t)n, 4, -1e-3f, 1e-3f);
    test_fill_uniform(o.v, (size_t)n, 5, 0, 1e-6f);
    o.step = 2;
    const char *cfg = "{optim: {lr: 0.001}}";
    trainer_ckpt_state st = {.step = 2, .policy_version = 2, .rollout_round = 2, .data_size = 3, .config = (char *)cfg};
    trainer_ckpt_expert ex = {"transformer", &m, &o, NULL, NULL};
    char path[TRAINER_CKPT_PATH_MAX];
    REQUIRE_OK(trainer_ckpt_save(dir, &st, &ex, 1, 0, path, sizeof path));
    for (int size = 2; size <= 3; size++)
        for (int r = 0; r < size; r++) {
            wan_model m2;
            optim_adamw s;
            int64_t lo, len;
            dp_zero_shard(n, r, size, &lo, &len);
            REQUIRE_OK(wan_model_init(&m2, &c));
            REQUIRE_OK(optim_adamw_init_shard(&s, n, lo, len));
            trainer_ckpt_expert e2 = {"transformer", &m2, &s, NULL, NULL};
            trainer_ckpt_state got;
            REQUIRE_OK(trainer_ckpt_load(path, cfg, &e2, 1, &got));
            CHECK_MSG(s.step == 2 && !memcmp(s.m, o.m + lo, sizeof(float) * (size_t)len) &&
                          !memcmp(s.v, o.v + lo, sizeof(float) * (size_t)len),
                      "rank %d of %d: the shard's moments differ from the checkpoint's", r, size);
            CHECK(!memcmp(m2.params, m.params, sizeof(float) * (size_t)n));
            if (size == 3 && r == 1) { /* a shard is not a checkpoint's optimizer state */
                st.step = 9;
                CHECK(trainer_ckpt_save(dir, &st, &e2, 1, 0, path, sizeof path) == -1 &&
                      strstr(core_last_error(), "gather the shards first"));
                st.step = 2;
                snprintf(path, sizeof path, "%s/checkpoint-2", dir);
            }
            trainer_ckpt_state_free(&got);
            optim_adamw_free(&s);
            wan_model_free(&m2);
        }
    optim_adamw_free(&o);
    wan_model_free(&m);
}

/* ---- multi-rank programs: tests/mpi/mpi_zero.c ---- */

static const char *mpi_bin(void) {
    static char path[1024];
    const char *e = getenv("VGRPO_MPI_TESTS");
    if (e && *e) return e;
    const char *bin = test_vgrpo_bin(), *slash = strrchr(bin, '/');
    snprintf(path, sizeof path, "%.*s/vgrpo_mpi_tests", slash ? (int)(slash - bin) : 1, slash ? bin : ".");
    return path;
}

TEST(zero_mpi_rank_order_and_steps) {
    static char out[16384];
    for (int P = 2; P <= 3; P++) {
        const int rc = test_run(out, sizeof out,
                                "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 %s"
                                "OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 mpirun -n %d --oversubscribe "
                                "--bind-to none -x OMP_NUM_THREADS %s%s zero",
                                getenv("VGRPO_ASAN") ? "ASAN_OPTIONS=detect_leaks=0 " : "", P,
                                getenv("VGRPO_ASAN") ? "-x ASAN_OPTIONS " : "", mpi_bin());
        CHECK_MSG(rc == 0 && strstr(out, "zero: PASS"), "mpirun -n %d zero: exit %d:\n%s", P, rc, out);
        printf("%s", out);
    }
}

/* ---- whole runs ---- */

/* This test's folder, with the pid (several build folders share build/test-tmp), and a tiny model in it. */
static const char *run_dir(void) {
    static char path[600];
    char out[4096];
    snprintf(path, sizeof path, "%s.%d", test_tmpdir(), (int)getpid());
    REQUIRE(test_run(out, sizeof out, "rm -rf %s && mkdir -p %s && %s init-model --preset tiny --out %s/model --seed 2",
                     path, path, test_vgrpo_bin(), path) == 0);
    return path;
}

/* `vgrpo run` colocated into dir/name: ranks trainer ranks at ZeRO stage `stage`, `steps` GRPO steps (of 3: the lr
 * schedule's length), resuming dir/name when resume; extra: more --set. Fails the test when it fails. */
static void zrun(const char *dir, const char *name, int ranks, int stage, int steps, int resume, const char *extra) {
    static char out[32768];
    char res[700] = "";
    if (resume) snprintf(res, sizeof res, "--resume %s/%s", dir, name);
    const int rc = test_run(
        out, sizeof out,
        "env OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml --set mode=colocated --set model.path=%s/model "
        "--set logging.run_dir=%s/%s --set rollout.num_steps=4 --set rollout.prompts_per_step=2 "
        "--set rollout.samples_per_prompt=4 --set data.eval_samples_per_prompt=1 --set logging.eval_every=2 "
        "--set algorithm.beta=0.05 --set optim.max_grad_norm=0.05 --set optim.weight_decay=0.01 "
        "--set optim.schedule=linear --set optim.total_steps=3 --set checkpoint.every=1 --set checkpoint.total_limit=0 "
        "--set parallel.trainer_ranks=%d --set parallel.zero_stage=%d --steps %d %s %s",
        test_vgrpo_bin(), dir, dir, name, ranks, stage, steps, res, extra);
    if (rc) {
        test_run(NULL, 0, "pkill -KILL -f '[v]grpo .*%s/'; true", dir);
        test_fail(__FILE__, __LINE__, "run %s (%d ranks, stage %d): exit %d:\n%s", name, ranks, stage, rc, out);
        longjmp(test_abort_jmp, 1);
    }
}

/* Runs a and b are the same bit for bit: metrics rows (time/ and weight_sync/seconds aside), rewards.jsonl, and every
 * file of checkpoint-1..3. */
static void check_same(const char *dir, const char *a, const char *b) {
    char pa[1024], pb[1024], out[8192];
    json_t *ra[16], *rb[16];
    snprintf(pa, sizeof pa, "%s/%s/metrics.jsonl", dir, a);
    snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", dir, b);
    const int na = read_rows(pa, ra, 16, 0), nb = read_rows(pb, rb, 16, 0);
    CHECK_MSG(na == 4 && nb == 4, "rows: %s %d, %s %d (3 steps and the final eval)", a, na, b, nb);
    for (int i = 0; i < na && i < nb; i++)
        if (!json_equal(ra[i], rb[i])) {
            char *sa = json_dumps(ra[i], JSON_SORT_KEYS | JSON_COMPACT), *sb = json_dumps(rb[i], JSON_SORT_KEYS | JSON_COMPACT);
            test_fail(__FILE__, __LINE__, "metrics row %d differs between %s and %s:\n  %s\n  %s", i, a, b, sa, sb);
            free(sa), free(sb);
        }
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/%s/rewards.jsonl %s/%s/rewards.jsonl", dir, a, dir, b) == 0,
              "rewards.jsonl: %s", out);
    for (int k = 1; k <= 3; k++) /* trainer_state.json's run id is each run's own (and its hash covers it) */
        CHECK_MSG(test_run(out, sizeof out, "diff -r -I '^  \"run_id\": ' -I '^  \"state_xxh64\": ' "
                                            "%s/%s/checkpoint-%d %s/%s/checkpoint-%d", dir, a, k, dir, b, k) == 0,
                  "checkpoint-%d differs between %s and %s: %s", k, a, b, out);
}

/* The three stages at `ranks` ranks (names s0.., s1.., s2..), and a stage-2 run resumed after 2 steps. */
static void stages_and_resume(const char *dir, int ranks, const char *extra) {
    char s0[16], s1[16], s2[16], rs[16];
    snprintf(s0, sizeof s0, "s0r%d", ranks), snprintf(s1, sizeof s1, "s1r%d", ranks);
    snprintf(s2, sizeof s2, "s2r%d", ranks), snprintf(rs, sizeof rs, "res%d", ranks);
    zrun(dir, s0, ranks, 0, 3, 0, extra);
    zrun(dir, s1, ranks, 1, 3, 0, extra);
    zrun(dir, s2, ranks, 2, 3, 0, extra);
    check_same(dir, s0, s1);
    check_same(dir, s0, s2);
    zrun(dir, rs, ranks, 2, 2, 0, extra); /* 2 steps, then the third after a resume */
    zrun(dir, rs, ranks, 2, 3, 1, extra);
    check_same(dir, s0, rs);
}

TEST(zero_run_2_ranks_equals_stage_0) {
    const char *dir = run_dir();
    stages_and_resume(dir, 2, "");
    test_run(NULL, 0, "rm -rf %s", dir);
}

TEST(zero_run_3_ranks_equals_stage_0_and_resumes_at_2) {
    const char *dir = run_dir();
    stages_and_resume(dir, 3, "");
    /* another rank count: a 3-rank stage-2 checkpoint-2 continued at 2 ranks, with stage 1 and with stage 0 */
    char out[4096];
    zrun(dir, "x", 3, 2, 2, 0, "");
    REQUIRE(test_run(out, sizeof out, "cp -r %s/x %s/y && cp -r %s/x %s/z", dir, dir, dir, dir) == 0);
    zrun(dir, "y", 2, 1, 3, 1, "");
    zrun(dir, "z", 2, 0, 3, 1, "");
    check_same(dir, "z", "y");
    test_run(NULL, 0, "rm -rf %s", dir);
}

TEST(zero_lora_3_ranks_equals_stage_0) { /* the adapters' flat buffers (45,056 values: 6 chunks) sharded */
    const char *dir = run_dir();
    stages_and_resume(dir, 3, "--set model.lora.rank=8");
    test_run(NULL, 0, "rm -rf %s", dir);
}

TEST(zero_recipe_key_and_budget) {
    const char *bin = test_vgrpo_bin();
    static char out[65536];
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set parallel.zero_stage=4 2>&1", bin) != 0 &&
          strstr(out, "parallel.zero_stage"));
    /* stage 3 (the fp32 master sharded) is the device path's (tests/test_dev_dp.c) */
    CHECK_MSG(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set parallel.zero_stage=3 2>&1", bin) != 0 &&
                  strstr(out, "parallel.zero_stage: 3 (the fp32 master weights sharded over the trainer ranks) is the "
                              "device path's (model.device cuda); the CPU path has stages 0, 1 and 2"),
              "got: %s", out);
    /* 589,248 parameters = 72 chunks: 24 a rank at 3 ranks, m and v of 196,608 values (1.5 MiB; whole 4.5 MiB) */
    CHECK_MSG(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set mode=colocated "
                                        "--set parallel.trainer_ranks=3 --set parallel.zero_stage=2 2>&1", bin) == 0 &&
                  strstr(out, "AdamW m, v (this rank's shard)") && strstr(out, "1.5 MiB  always") &&
                  strstr(out, "parallel.zero_stage 2: AdamW m, v 1.5 MiB per trainer rank (whole: 4.5 MiB) over 3 ranks"),
              "got: %s", out);
    /* one trainer rank (local mode): the shard is everything, the estimate as stage 0's */
    CHECK_MSG(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set parallel.zero_stage=1 2>&1", bin) == 0 &&
                  strstr(out, "gradients + AdamW m, v") && !strstr(out, "this rank's shard"),
              "got: %s", out);
}
