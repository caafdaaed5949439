/* tests/test_budget.c — resources estimated before anything is allocated (trainer/budget/budget.h) and the prompt-file
 * limits (core/prompts.h):
 *   - the sizes the estimate takes equal what the code allocates: DiT activations (wan_acts_plan_bytes, the model's
 *     count, against wan_acts_bytes) in every mode, with and without cross_attn_norm and sequence parallelism, and a
 *     refused shape giving 0; the VAE decoder's parameters and decode state (vae_decoder_estimate against
 *     vae_state_bytes and the file's tensors) of the Wan 2.1 and 2.2 fixtures and the tiny VAE;
 *   - the estimate of a whole tiny run against its measured peak RSS (wait4 of a child `vgrpo run`), within
 *     BUDGET_TOLERANCE;
 *   - refusals at --dry-run: 8192 x 8192 (memory, naming rollout.height / rollout.width and the figures), 2048 x 2048
 *     in a 6 GiB limit, frames 4097 (rope_max_seq_len), a step past limits.max_step_minutes; --force lets a refused
 *     recipe through with a warning; eval and parity refuse before starting a process;
 *   - the available memory from cgroup v2 / v1 files and /proc/meminfo (a fake tree);
 *   - prompt files over the size limit (a sparse 1 GiB file refused before reading), a long line named file:line with
 *     its length, a 1 GiB single line counted not kept, a long JSON prompt, lines at the limit accepted. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "core/prompts.h"
#include "core/safetensors.h"
#include "core/recipe.h"
#include "model/dit/wan_dit.h"
#include "model/vae/tiny_vae.h"
#include "model/vae/wan_vae.h"
#include "tests/test.h"
#include "trainer/budget/budget.h"

/* ---- the sizes the estimate takes ---- */

TEST(budget_acts_match_wan_acts) {
    wan_config cfgs[3];
    REQUIRE_OK(wan_config_preset(&cfgs[0], "tiny"));
    cfgs[1] = cfgs[0];
    cfgs[1].cross_attn_norm = 0, cfgs[1].ffn_dim = 200, cfgs[1].num_layers = 3;
    REQUIRE_OK(wan_config_preset(&cfgs[2], "wan2.1-t2v-1.3b"));
    cfgs[2].num_layers = 2; /* the layout per layer is the same; keeps the test small */
    const wan_acts_mode modes[3] = {WAN_ACTS_INFER, WAN_ACTS_STORE, WAN_ACTS_RECOMPUTE};
    const int shapes[3][5] = {{1, 2, 4, 4, 8}, {3, 3, 8, 6, 5}, {2, 1, 4, 8, 16}}; /* B, F, H, W, L */
    int compared = 0;
    for (int c = 0; c < 3; c++)
        for (int m = 0; m < 3; m++)
            for (int s = 0; s < 3; s++)
                for (int sp = 1; sp <= 2; sp++) {
                    const int *x = shapes[s];
                    const wan_shape sh = {.B = x[0], .F = x[1], .H = x[2], .W = x[3], .L = x[4]};
                    if (wan_tokens(&cfgs[c], &sh) % sp) continue;
                    wan_acts *a = wan_acts_new_sp(&cfgs[c], &sh, modes[m], sp, 0);
                    REQUIRE_OK(a ? 0 : -1);
                    const double got = (double)wan_acts_bytes(a);
                    const double est = (double)wan_acts_plan_bytes(&cfgs[c], &sh, modes[m], sp);
                    wan_acts_free(a);
                    compared++;
                    CHECK_MSG(est == got, "config %d mode %d shape %d sp %d: wan_acts_plan_bytes %.0f, "
                              "wan_acts_bytes %.0f", c, m, s, sp, est, got);
                }
    CHECK(compared >= 45); /* every (config, mode, shape) with sp 1, and with sp 2 where the tokens split */
    const wan_shape odd = {.B = 1, .F = 3, .H = 4, .W = 4, .L = 8}; /* 3 x 2 x 2 tokens: not split by sp 5 */
    CHECK(wan_acts_plan_bytes(&cfgs[0], &odd, WAN_ACTS_INFER, 5) == 0);
    CHECK(wan_acts_plan_bytes(&cfgs[0], &odd, WAN_ACTS_CHECKPOINT, 1) == 0); /* the device model's mode */
    core_error_clear();
}

static void check_vae(const char *dir, int h, int w) {
    vae_model *m = vae_load(dir);
    REQUIRE_OK(m ? 0 : -1);
    const vae_config *c = vae_get_config(m);
    const int z = c->z_dim, T = 2, F = vae_frames_out(m, T), f = vae_spatial_factor(m);
    float *lat = calloc((size_t)z * T * h * w, sizeof(float));
    float *vid = malloc(sizeof(float) * 3 * (size_t)F * h * f * w * f);
    REQUIRE(lat && vid);
    test_fill_uniform(lat, (size_t)z * T * h * w, 7, -1, 1);
    REQUIRE_OK(vae_decode(m, lat, 1, z, T, h, w, vid));
    double params, state;
    REQUIRE_OK(vae_decoder_estimate(c, h, w, &params, &state));
    CHECK_MSG(state == (double)vae_state_bytes(m), "%s %d x %d: estimated state %.0f, vae_state_bytes %zu", dir, h, w,
              state, vae_state_bytes(m));
    /* the parameters: every tensor the decoder loads (the fixtures also hold the encoder, which it skips) */
    char p[600];
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    st_file *sf = st_open(p);
    REQUIRE_OK(sf ? 0 : -1);
    double n = 0;
    for (int i = 0; i < st_count(sf); i++) {
        const st_info *t = st_info_at(sf, i);
        if (!strncmp(t->name, "encoder.", 8) || !strncmp(t->name, "quant_conv.", 11)) continue;
        double k = 1;
        for (int d = 0; d < t->ndim; d++) k *= (double)t->shape[d];
        n += k;
    }
    st_close(sf);
    CHECK_MSG(params == n, "%s: estimated %.0f parameters, the file's decoder has %.0f", dir, params, n);
    free(lat), free(vid);
    vae_free(m);
}

TEST(budget_vae_state_matches) {
    check_vae("tests/fixtures/vae_wan21", 3, 5);
    check_vae("tests/fixtures/vae_wan22", 2, 4);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/vae", test_tmpdir());
    REQUIRE_OK(vae_tiny_write(dir, 16, 0));
    check_vae(dir, 4, 4);
    check_vae(dir, 8, 6);
}

/* ---- the estimate against a real run ---- */

/* Runs argv (stdout and stderr to log) and returns its peak RSS in bytes (wait4), or -1 when it fails. */
static double peak_rss(char *const *argv, const char *log) {
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    if (pid < 0) return -1;
    int st;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
    return (double)ru.ru_maxrss * 1024.0;
}

/* One step of `vgrpo run recipes/tiny-cpu.yaml` with --set sets[0..ns) (at most 16), its output to log: peak_rss. */
static double tiny_step_rss(const char *const *sets, int ns, const char *log) {
    char *argv[2 * 16 + 8];
    int a = 0;
    argv[a++] = (char *)test_vgrpo_bin(), argv[a++] = "run", argv[a++] = "recipes/tiny-cpu.yaml", argv[a++] = "--steps";
    argv[a++] = "1";
    for (int i = 0; i < ns && i < 16; i++) argv[a++] = "--set", argv[a++] = (char *)sets[i];
    argv[a] = NULL;
    return peak_rss(argv, log);
}

/* A short tiny run big enough that activations, not the runtime, make its peak: 64 x 64 (32 tokens), recompute,
 * beta > 0 (reference weights and activations), one step, one eval sample per prompt. */
TEST(budget_estimate_matches_peak_rss) {
    const char *dir = test_tmpdir();
    char model[600], run[600], log[600], out[4096];
    snprintf(model, sizeof model, "model.path=%s/model", dir);
    snprintf(run, sizeof run, "logging.run_dir=%s/run", dir);
    snprintf(log, sizeof log, "%s/run.log", dir);
    const char *sets[] = {model, "model.init_preset=tiny", run, "rollout.height=64", "rollout.width=64",
                          "algorithm.activations=recompute", "algorithm.beta=0.01", "data.eval_samples_per_prompt=1",
                          "checkpoint.every=-1"};
    const int ns = sizeof sets / sizeof sets[0];
    const double rss = tiny_step_rss(sets, ns, log);
    test_slurp(log, out, sizeof out);
    CHECK_MSG(rss > 0, "the run failed: %s", out);
    REQUIRE(rss > 0);
    core_recipe r;
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", sets, ns));
    budget_estimate *e = malloc(sizeof *e);
    REQUIRE(e);
    const int rc = budget_estimate_job(e, &r, &(budget_request){.job = BUDGET_JOB_RUN});
    const double est = e->total;
    free(e);
    core_recipe_release(&r);
    REQUIRE(rc == 0);
    /* AddressSanitizer (make asan: VGRPO_ASAN=1) adds shadow memory, redzones and a quarantine: no RSS to compare */
    if (!getenv("VGRPO_ASAN"))
        CHECK_MSG(est <= BUDGET_TOLERANCE * rss && rss <= BUDGET_TOLERANCE * est,
                  "estimate %.1f MiB, measured peak RSS %.1f MiB: outside x%.2f", est / 1048576, rss / 1048576,
                  BUDGET_TOLERANCE);
    /* the run printed the same estimate before its first step */
    CHECK_MSG(strstr(out, "estimate (trainer/budget/budget.h") && strstr(out, "local process x1") &&
                  strstr(out, "estimate") < strstr(out, "step 0 of 1"), "got: %s", out);
}

/* model.device cuda on the EMULATED device (its memory is host memory, so the process's peak RSS holds both): the
 * host estimate (the host's parts alone: no DiT activations or gradients, which are the device's) plus the emulated
 * device's peak allocation is within BUDGET_TOLERANCE of the peak RSS of a local run (64 x 64, checkpoint
 * activations, a KL reference). The CPU path's parts would count the activations twice (2.3 x the RSS here). */
TEST(budget_device_host_estimate_matches_peak_rss) {
    const char *dir = test_tmpdir();
    char model[600], run[600], log[600], out[8192];
    snprintf(model, sizeof model, "model.path=%s/model", dir);
    snprintf(run, sizeof run, "logging.run_dir=%s/drun", dir);
    snprintf(log, sizeof log, "%s/drun.log", dir);
    const char *sets[] = {model, "model.init_preset=tiny", run, "model.device=cuda", "rollout.height=64",
                          "rollout.width=64", "algorithm.activations=checkpoint", "algorithm.beta=0.01",
                          "data.eval_samples_per_prompt=1", "checkpoint.every=-1"};
    const int ns = sizeof sets / sizeof sets[0];
    const char *omp = getenv("OMP_NUM_THREADS");
    char omp_was[32] = "";
    if (omp) snprintf(omp_was, sizeof omp_was, "%s", omp);
    setenv("VGRPO_EMULATE_DEVICE", "1", 1), setenv("VGRPO_EMULATE_DEVICE_REPORT", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1); /* the emulated kernels' thread buffers out of the comparison */
    const double rss = tiny_step_rss(sets, ns, log);
    unsetenv("VGRPO_EMULATE_DEVICE"), unsetenv("VGRPO_EMULATE_DEVICE_REPORT");
    if (omp) setenv("OMP_NUM_THREADS", omp_was, 1);
    else unsetenv("OMP_NUM_THREADS");
    test_slurp(log, out, sizeof out);
    REQUIRE(rss > 0);
    const char *pk = strstr(out, "emulated device: peak ");
    REQUIRE(pk);
    const double dev = atof(pk + strlen("emulated device: peak "));
    core_recipe r;
    REQUIRE_OK(core_recipe_load(&r, "recipes/tiny-cpu.yaml", sets, ns));
    budget_estimate *e = malloc(sizeof *e);
    REQUIRE(e);
    const int rc = budget_estimate_job(e, &r, &(budget_request){.job = BUDGET_JOB_RUN});
    const double host = e->total;
    int acts = 0; /* no DiT activations among the host's parts */
    for (int i = 0; i < e->proc[0].n_parts; i++) acts |= strstr(e->proc[0].part[i].name, "activations") != NULL;
    free(e);
    core_recipe_release(&r);
    REQUIRE(rc == 0);
    printf("  emulated device run: host estimate %.1f MiB + device peak %.1f MiB = %.1f MiB; peak RSS %.1f MiB\n",
           host / 1048576, dev / 1048576, (host + dev) / 1048576, rss / 1048576);
    CHECK(!acts && dev > 0);
    if (!getenv("VGRPO_ASAN"))
        CHECK_MSG(host + dev <= BUDGET_TOLERANCE * rss && rss <= BUDGET_TOLERANCE * (host + dev),
                  "host %.1f + device %.1f MiB against a peak RSS of %.1f MiB: outside x%.2f", host / 1048576,
                  dev / 1048576, rss / 1048576, BUDGET_TOLERANCE);
}

/* ---- refusals ---- */

TEST(budget_dry_run_refusals) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384];
    /* 8192 x 8192: terabytes; refused at --dry-run naming the keys and the figures */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/m --set "
                   "rollout.height=8192 --set rollout.width=8192", bin, dir) == 1);
    CHECK_MSG(strstr(out, "vgrpo run: memory: the job needs about") && strstr(out, "GiB is available") &&
                  strstr(out, "rollout.height") && strstr(out, "rollout.width") && strstr(out, "--force"),
              "got: %s", out);
    CHECK_MSG(!strstr(out, "resolved (dry run; valid)"), "got: %s", out);
    /* 2048 x 2048 within a 6 GiB limit */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/m --set "
                   "rollout.height=2048 --set rollout.width=2048 --set limits.memory_mb=6144", bin, dir) == 1);
    CHECK_MSG(strstr(out, "memory: the job needs about") && strstr(out, "limits.memory_mb 6144") &&
                  strstr(out, "rollout.height"), "got: %s", out);
    /* --force: the same recipe passes with a warning, and the resolved recipe is printed */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --force --set model.path=%s/m --set "
                   "rollout.height=8192 --set rollout.width=8192", bin, dir) == 0);
    CHECK_MSG(strstr(out, "warning: --force: memory") && strstr(out, "resolved (dry run; valid)") &&
                  strstr(out, "height: 8192"), "got: %s", out);
    /* frames 4097: 1025 latent frames, past the tiny transformer's rope_max_seq_len 1024; --force does not help */
    for (int force = 0; force < 2; force++) {
        CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run %s --set model.path=%s/m --set "
                       "rollout.frames=4097", bin, force ? "--force" : "", dir) == 1);
        CHECK_MSG(strstr(out, "rollout.frames") && strstr(out, "rope_max_seq_len 1024") && strstr(out, "at most 4093"),
                  "got: %s", out);
    }
    /* the step-time bound: 4093 frames (4096 tokens a sample) is tens of TFLOP a step */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/m --set "
                   "rollout.frames=4093 --set algorithm.micro_batch_size=4 --set limits.max_step_minutes=0.5", bin,
                   dir) == 1);
    CHECK_MSG(strstr(out, "limits.max_step_minutes") && strstr(out, "TFLOP") && strstr(out, "rollout.frames"),
              "got: %s", out);
    /* nothing was written for the refused recipes (no model, no run folder) */
    char p[700];
    struct stat st;
    snprintf(p, sizeof p, "%s/m", dir);
    CHECK(stat(p, &st) != 0);
    /* the shipped tiny recipe fits comfortably and prints its table on stderr, the resolved recipe on stdout (grep
     * finds no "estimate" there: exit 1) */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/m 2>/dev/null | "
                   "grep -c 'estimate'", bin, dir) == 1);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/m", bin, dir) == 0);
    CHECK_MSG(strstr(out, "peak (always + largest phase)") && strstr(out, "one GRPO step"), "got: %s", out);
}

TEST(budget_eval_parity_refuse_before_starting) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], p[700];
    CHECK(test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml --set model.path=%s/m --out %s/e --set "
                   "rollout.height=8192 --set rollout.width=8192", bin, dir, dir) == 1);
    CHECK_MSG(strstr(out, "vgrpo eval: memory:") && strstr(out, "rollout worker x1"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s parity recipes/tiny-cpu.yaml --set model.path=%s/m --set logging.run_dir=%s/r "
                   "--set rollout.height=4096 --set rollout.width=4096", bin, dir, dir) == 1);
    CHECK_MSG(strstr(out, "vgrpo parity: memory:") && strstr(out, "trainer rank x1"), "got: %s", out);
    struct stat st;
    snprintf(p, sizeof p, "%s/m", dir);
    CHECK(stat(p, &st) != 0); /* refused before model.init_preset wrote anything */
    snprintf(p, sizeof p, "%s/e", dir);
    CHECK(stat(p, &st) != 0);
    CHECK(test_run(out, sizeof out, "%s eval --help; %s parity --help", bin, bin) == 0);
    CHECK_MSG(strstr(out, "--force") && strstr(strstr(out, "--force") + 1, "--force"), "got: %s", out);
}

/* ---- available memory ---- */

static void put(const char *root, const char *rel, const char *text) {
    char p[1200], out[2048];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    REQUIRE(test_run(out, sizeof out, "mkdir -p $(dirname %s)", p) == 0);
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

TEST(budget_available_memory) {
    const char *dir = test_tmpdir();
    char v2[700], v1[700], none[700];
    snprintf(v2, sizeof v2, "%s/v2", dir), snprintf(v1, sizeof v1, "%s/v1", dir), snprintf(none, sizeof none, "%s/no", dir);
    const double G = 1073741824.0;
    /* cgroup v2: the job's cgroup is unlimited, its parent allows 6 GiB with 1 GiB of anonymous memory in use */
    put(v2, "proc/meminfo", "MemTotal:       33554432 kB\nMemAvailable:   25165824 kB\n");
    put(v2, "proc/self/cgroup", "0::/user.slice/job\n");
    put(v2, "sys/fs/cgroup/user.slice/job/memory.max", "max\n");
    put(v2, "sys/fs/cgroup/user.slice/memory.max", "6442450944\n");
    put(v2, "sys/fs/cgroup/user.slice/memory.stat", "anon 1073741824\nfile 999999999\n");
    budget_memory m;
    budget_memory_available(&m, 0, v2);
    CHECK_NEAR(m.detected, 5 * G, 1);
    CHECK_NEAR(m.bytes, 4.5 * G, 1); /* less 10% */
    CHECK_MSG(strstr(m.source, "cgroup v2") && strstr(m.source, "user.slice/memory.max"), "source: %s", m.source);
    budget_memory_available(&m, 1024, v2); /* limits.memory_mb */
    CHECK_NEAR(m.bytes, G, 1);
    CHECK_MSG(strstr(m.source, "limits.memory_mb 1024"), "source: %s", m.source);
    /* cgroup v1, limited below MemAvailable */
    put(v1, "proc/meminfo", "MemAvailable:   25165824 kB\n");
    put(v1, "proc/self/cgroup", "12:pids:/x\n4:cpu,memory:/docker/abc\n0::/\n");
    put(v1, "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "2147483648\n");
    put(v1, "sys/fs/cgroup/memory/docker/abc/memory.stat", "rss 0\ntotal_rss 536870912\n");
    put(v1, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    budget_memory_available(&m, 0, v1);
    CHECK_NEAR(m.detected, 1.5 * G, 1);
    CHECK_MSG(strstr(m.source, "cgroup v1"), "source: %s", m.source);
    /* no cgroup limit: MemAvailable; a small machine keeps at least 64 MiB */
    put(none, "proc/meminfo", "MemAvailable:   262144 kB\n");
    budget_memory_available(&m, 0, none);
    CHECK_NEAR(m.detected, 256 * 1048576.0, 1);
    CHECK_NEAR(m.bytes, 192 * 1048576.0, 1);
    CHECK_MSG(strstr(m.source, "MemAvailable"), "source: %s", m.source);
}

/* ---- prompt files ---- */

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fputs(text, f);
    fclose(f);
}

TEST(prompts_limits) {
    const char *dir = test_tmpdir();
    char path[700], out[4096];
    core_prompts p;
    const core_prompts_limits small = {1 << 20, 64};
    /* a sparse 1 GiB file: refused from its size, before reading */
    snprintf(path, sizeof path, "%s/huge.txt", dir);
    REQUIRE(test_run(out, sizeof out, "truncate -s 1G %s", path) == 0);
    CHECK(core_prompts_read(&p, path) == -1);
    CHECK_MSG(strstr(core_last_error(), path) && strstr(core_last_error(), "1024.0 MiB") &&
                  strstr(core_last_error(), "data.max_prompt_file_mb 64"), "got: %s", core_last_error());
    /* the same 1 GiB as one line under a 2 GiB file limit: counted to its end, never held */
    const core_prompts_limits big = {(int64_t)2 << 30, 0};
    CHECK(core_prompts_read_limited(&p, path, &big) == -1);
    CHECK_MSG(strstr(core_last_error(), ":1: a line of 1073741824 bytes, over data.max_prompt_bytes 4096"), "got: %s",
              core_last_error());
    /* a long line in the middle names file:line and its length */
    snprintf(path, sizeof path, "%s/long.txt", dir);
    char *text = malloc(200);
    REQUIRE(text);
    snprintf(text, 200, "a red car\n# note\n%0100d\nblue\n", 0);
    write_file(path, text);
    CHECK(core_prompts_read_limited(&p, path, &small) == -1);
    char want[800];
    snprintf(want, sizeof want, "%s:3: a line of 100 bytes, over data.max_prompt_bytes 64", path);
    CHECK_MSG(strstr(core_last_error(), want), "got: %s", core_last_error());
    /* the last line, without a newline */
    snprintf(text, 200, "a red car\n%070d", 0);
    write_file(path, text);
    CHECK(core_prompts_read_limited(&p, path, &small) == -1);
    snprintf(want, sizeof want, "%s:2: a line of 70 bytes", path);
    CHECK_MSG(strstr(core_last_error(), want), "got: %s", core_last_error());
    /* a line of exactly the limit (with CRLF trimmed afterwards) is a prompt */
    snprintf(text, 200, "%064d\r\n  a red car  \n", 0);
    write_file(path, text);
    REQUIRE_OK(core_prompts_read_limited(&p, path, &(core_prompts_limits){0, 65}));
    CHECK(p.n == 2 && strlen(p.text[0]) == 64 && !strcmp(p.text[1], "a red car") && p.line[1] == 2);
    core_prompts_free(&p);
    /* over the file limit while reading (a file the limit is below) */
    snprintf(path, sizeof path, "%s/mid.txt", dir);
    REQUIRE(test_run(out, sizeof out, "yes 'a red car' | head -c 3000000 > %s", path) == 0);
    CHECK(core_prompts_read_limited(&p, path, &small) == -1);
    CHECK_MSG(strstr(core_last_error(), "2.9 MiB, over data.max_prompt_file_mb 1"), "got: %s", core_last_error());
    /* a pipe: cut off at the limit */
    CHECK(test_run(out, sizeof out, "rm -f %s/fifo && mkfifo %s/fifo && (yes 'a red car' | head -c 3000000 > %s/fifo &) "
                   ">/dev/null 2>&1", dir, dir, dir) == 0);
    snprintf(path, sizeof path, "%s/fifo", dir);
    CHECK(core_prompts_read_limited(&p, path, &small) == -1);
    CHECK_MSG(strstr(core_last_error(), "more than 1.0 MiB (data.max_prompt_file_mb 1)"), "got: %s",
              core_last_error());
    /* JSON: a prompt over the line limit names the entry */
    snprintf(path, sizeof path, "%s/p.json", dir);
    snprintf(text, 200, "[{\"prompt_en\": \"a red car\"}, {\"prompt_en\": \"%070d\"}]", 0);
    write_file(path, text);
    CHECK(core_prompts_read_limited(&p, path, &small) == -1);
    CHECK_MSG(strstr(core_last_error(), "prompt 2: \"prompt_en\" is 70 bytes, over data.max_prompt_bytes 64"), "got: %s",
              core_last_error());
    REQUIRE_OK(core_prompts_read(&p, path));
    CHECK(p.n == 2);
    core_prompts_free(&p);
    free(text);
}

/* Through the recipe: the keys reach every reader of a job (the estimate's count and eval's --prompts). */
TEST(prompts_limits_recipe_keys) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char path[700], out[16384];
    snprintf(path, sizeof path, "%s/eval.txt", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    fprintf(f, "a red car\na blue %0300d boat\n", 0);
    fclose(f);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set model.path=%s/m --set "
                   "data.eval_prompt_file=%s --set data.max_prompt_bytes=256", bin, dir, path) == 1);
    char want[800];
    snprintf(want, sizeof want, "%s:2: a line of 312 bytes, over data.max_prompt_bytes 256", path);
    CHECK_MSG(strstr(out, want), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s eval recipes/tiny-cpu.yaml --set model.path=%s/m --prompts %s --out %s/e "
                   "--set data.max_prompt_bytes=256", bin, dir, path, dir) == 1);
    CHECK_MSG(strstr(out, want), "got: %s", out);
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --help-config", bin) == 0);
    CHECK_MSG(strstr(out, "data.max_prompt_file_mb") && strstr(out, "data.max_prompt_bytes") &&
                  strstr(out, "limits.memory_mb") && strstr(out, "limits.max_step_minutes"), "got: %s", out);
}

/* vgrpo generate: its estimate (budget_generate_bytes) against the peak RSS of a tiny 512 x 512 x 9 video (3,072
 * tokens: activations and the VAE's decode state make the peak), and the refusal of a video that cannot fit, before
 * any weights are read and with nothing written. */
TEST(budget_generate_matches_peak_rss_and_refuses) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char pipe[600], mp4[600], log[600], out[4096];
    snprintf(pipe, sizeof pipe, "%s/model", dir);
    snprintf(mp4, sizeof mp4, "%s/a.mp4", dir);
    snprintf(log, sizeof log, "%s/gen.log", dir);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s --seed 0", bin, pipe) == 0);
    char *argv[] = {(char *)bin, "generate", "--pipeline", pipe, "--prompt", "a red square", "--out", mp4, "--height",
                    "512", "--width", "512", "--frames", "9", "--steps", "1", NULL};
    const double rss = peak_rss(argv, log);
    test_slurp(log, out, sizeof out);
    CHECK_MSG(rss > 0, "generate failed: %s", out);
    budget_generate g;
    REQUIRE_OK(budget_generate_bytes(&g, pipe, 9, 512, 512, 2, 512, 0));
    CHECK(g.experts == 1 && g.tokens == 3072 && g.acts > 0 && g.vae > 0 && g.text > 0);
    wan_config wc;
    snprintf(log, sizeof log, "%s/transformer/config.json", pipe);
    REQUIRE_OK(wan_config_load(&wc, log));
    CHECK(g.flop_step == 2 * budget_dit_flop(&wc, 3072, 512) && g.flop_step > 0); /* 2 rows: guidance */
    if (!getenv("VGRPO_ASAN"))
        CHECK_MSG(g.total <= BUDGET_TOLERANCE * rss && rss <= BUDGET_TOLERANCE * g.total,
                  "estimate %.1f MiB, measured peak RSS %.1f MiB: outside x%.2f", g.total / 1048576, rss / 1048576,
                  BUDGET_TOLERANCE);
    /* 81 frames at 8192 x 8192: about 264 GiB; refused in one line naming the options, no video written */
    snprintf(mp4, sizeof mp4, "%s/b.mp4", dir);
    CHECK(test_run(out, sizeof out, "%s generate --pipeline %s --prompt x --out %s --height 8192 --width 8192 --frames "
                   "81", bin, pipe, mp4) == 1);
    CHECK_MSG(strstr(out, "vgrpo generate: memory: --frames 81 --height 8192 --width 8192 (5505024 video tokens) need "
                          "about") && strstr(out, "or --force"), "got: %s", out);
    struct stat sb;
    CHECK(stat(mp4, &sb) != 0);
    /* a pipeline without configs: nothing to estimate (generate's own loading names what is missing) */
    CHECK(budget_generate_bytes(&g, dir, 9, 64, 64, 2, 512, 0) == 1);
}
