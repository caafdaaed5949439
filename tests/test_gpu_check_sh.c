/* tests/test_gpu_check_sh.c — the contract of scripts/gpu_check.sh, on a fake gpu_check: a shell
 * script that answers --group/--json/--stage as the real binary does and fails on purpose. Proves: a row that fails
 * shows in the summary with its first error and the exit status is 1; a group that crashes (SIGSEGV) or hangs costs
 * only itself (a "group G" row says crashed / timeout, after which row) and the groups after it still run; the
 * summary is the last lines printed and at most 40; DIR/gpu_check.json parses, with per row name, stage, status and
 * error; --groups runs only those and the speed figures reach the summary's table; no usable GPU, or no binary, exits
 * 2 with the reason in the summary. Each case runs in a few seconds. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/test.h"

/* The fake: FAKE_MODE=rowfail fails a row of stage 1's gemm, crashes in attention, hangs in invariance;
 * FAKE_MODE=nogpu answers "cannot run here" (exit 2) in env. Every other group writes one ok row. */
static const char *FAKE =
    "#!/bin/sh\n"
    "g=''; j=''; st=0\n"
    "while [ $# -gt 0 ]; do case \"$1\" in --group) g=$2; shift;; --json) j=$2; shift;; --stage) st=$2; shift;; esac;"
    " shift; done\n"
    "row() { printf '{\"type\":\"row\",\"stage\":%s,\"group\":\"%s\",\"name\":\"%s\",\"status\":\"%s\",\"shape\":\"\","
    "\"dtype\":null,\"figures\":null,\"vs\":null,\"note\":null,\"error\":%s}\\n' \"$st\" \"$g\" \"$1\" \"$2\" \"$3\" >>\"$j\"; }\n"
    "if [ \"$FAKE_MODE:$g\" = nogpu:env ]; then\n"
    "  echo 'gpu_check: the CUDA backend cannot run here: CUDA: no NVIDIA driver on this machine (libcuda.so.1 not "
    "found), so no GPU'; exit 2; fi\n"
    "[ \"$g\" = env ] && printf '{\"type\":\"env\",\"stage\":%s,\"group\":\"env\",\"gpu\":\"FAKE H100\",\"cc\":\"9.0\","
    "\"sm_count\":132,\"mem_gib\":79.1,\"driver\":13000,\"runtime\":13000,\"cublaslt_version\":130100,"
    "\"cublaslt_path\":\"/x/libcublasLt.so.13\",\"cudnn_version\":91900,\"cudnn_path\":\"/x/libcudnn.so.9\","
    "\"cpu_threads\":16}\\n' \"$st\" >>\"$j\"\n"
    "case \"$FAKE_MODE:$st:$g\" in\n"
    "rowfail:1:gemm) row 'gemm linear fwd (bias)' FAIL '\"rel-L2 5.000e-02 above its band 1.0e-02\"';"
    " row 'gemm ffn up' ok null; exit 1;;\n"
    "rowfail:1:attention) row 'attention self fwd O' ok null; echo 'about to crash'; kill -SEGV $$;;\n"
    "rowfail:1:invariance) row 'gemm M-invariance linear fwd' ok null; sleep 60;;\n"
    "esac\n"
    "[ \"$g\" = perf ] && printf '{\"type\":\"speed\",\"source\":\"vgrpo\",\"stage\":%s,\"key\":\"gemm_nt\","
    "\"label\":\"x\",\"tflops\":612.5,\"ms\":1.795,\"note\":null}\\n' \"$st\" >>\"$j\"\n"
    "row \"$g fake row\" ok null\n"
    "exit 0\n";

static const char *write_fake(const char *dir) {
    static char path[1024];
    test_write_text(dir, "fake_gpu_check", FAKE);
    snprintf(path, sizeof path, "%s/fake_gpu_check", dir);
    chmod(path, 0755);
    return path;
}

/* The text from the line holding the summary's first line to the end; NULL when absent. Sets *lines to its count. */
static const char *summary_of(const char *out, int *lines) {
    const char *s = strstr(out, "==================== gpu_check summary");
    *lines = 0;
    if (!s) return NULL;
    for (const char *c = s; *c; c++) *lines += *c == '\n';
    return s;
}

static json_t *row_named(json_t *rows, const char *name) {
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) if (!strcmp(json_string_value(json_object_get(r, "name")), name)) return r;
    return NULL;
}

TEST(gpu_check_sh_row_failure_crash_and_hang) {
    const char *dir = test_tmpdir();
    const char *fake = write_fake(dir);
    static char out[1 << 17];
    /* stage 1 only, with a stage budget of 8 s: the hanging group is stopped after a few seconds */
    int rc = test_run(out, sizeof out,
                      "FAKE_MODE=rowfail GPU_CHECK_STAGE1_S=8 scripts/gpu_check.sh --stage 1 --emulated --bin %s "
                      "--out %s/gc",
                      fake, dir);
    CHECK_MSG(rc == 1, "exit status %d, want 1 (a row failed); output:\n%s", rc, out);
    int lines = 0;
    const char *sum = summary_of(out, &lines);
    REQUIRE(sum != NULL);
    CHECK_MSG(lines <= 40, "the summary has %d lines, more than 40", lines);
    CHECK(strstr(sum, "FAIL [1 gemm] gemm linear fwd (bias): rel-L2 5.000e-02 above its band 1.0e-02") != NULL);
    CHECK(strstr(sum, "FAIL [1 attention] group attention: crashed (signal SEGV) after row 'attention self fwd O'; "
                      "last output: about to crash") != NULL);
    CHECK(strstr(sum, "TIMEOUT [1 invariance] group invariance: ran past its time-out of") != NULL);
    CHECK(strstr(sum, "after row 'gemm M-invariance linear fwd'") != NULL);
    CHECK(strstr(sum, "GPU      FAKE H100, cc 9.0, 132 SMs") != NULL);
    CHECK(strstr(sum, "cuDNN    91900 from /x/libcudnn.so.9") != NULL);
    CHECK(strstr(sum, "exit 1 (a row failed)") != NULL);
    CHECK(strstr(sum, "block ok") != NULL); /* the group after the crash and the hang ran */

    char path[1024];
    snprintf(path, sizeof path, "%s/gc/gpu_check.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    REQUIRE(j != NULL);
    CHECK(json_integer_value(json_object_get(j, "exit")) == 1);
    json_t *rows = json_object_get(j, "rows");
    REQUIRE(json_is_array(rows));
    json_t *r = row_named(rows, "gemm linear fwd (bias)");
    REQUIRE(r != NULL);
    CHECK(!strcmp(json_string_value(json_object_get(r, "status")), "FAIL"));
    CHECK(json_integer_value(json_object_get(r, "stage")) == 1);
    CHECK(!strcmp(json_string_value(json_object_get(r, "error")), "rel-L2 5.000e-02 above its band 1.0e-02"));
    r = row_named(rows, "group invariance");
    REQUIRE(r != NULL);
    CHECK(!strcmp(json_string_value(json_object_get(r, "status")), "timeout"));
    CHECK(row_named(rows, "block fake row") != NULL);
    CHECK(row_named(rows, "gemm ffn up") != NULL);
    CHECK(json_array_size(json_object_get(j, "groups")) == 8); /* stage 1: 8 groups, nccl the last added */
    json_decref(j);
    /* the log and the summary files */
    static char logtxt[1 << 17];
    snprintf(path, sizeof path, "%s/gc/gpu_check.log", dir);
    REQUIRE(test_slurp(path, logtxt, sizeof logtxt) > 0);
    CHECK(strstr(logtxt, "---- stage 1, group gemm") != NULL);
    CHECK(strstr(logtxt, "gpu_check.sh: exit 1 (a row failed)") != NULL);
    snprintf(path, sizeof path, "%s/gc/gpu_check.summary", dir);
    REQUIRE(test_slurp(path, logtxt, sizeof logtxt) > 0);
    CHECK(strstr(logtxt, "FAIL [1 gemm] gemm linear fwd (bias)") != NULL);
}

TEST(gpu_check_sh_no_gpu_and_no_binary) {
    const char *dir = test_tmpdir();
    const char *fake = write_fake(dir);
    static char out[1 << 16];
    int rc = test_run(out, sizeof out, "FAKE_MODE=nogpu scripts/gpu_check.sh --emulated --bin %s --out %s/gc", fake,
                      dir);
    CHECK_MSG(rc == 2, "exit status %d, want 2 (could not run); output:\n%s", rc, out);
    int lines = 0;
    const char *sum = summary_of(out, &lines);
    REQUIRE(sum != NULL);
    CHECK(lines <= 40);
    CHECK(strstr(sum, "exit 2 (could not run: the CUDA backend cannot run here: CUDA: no NVIDIA driver") != NULL);
    CHECK(strstr(sum, "stage 1  env FAIL") != NULL);
    CHECK(strstr(out, "---- stage 1, group layers") == NULL); /* nothing after env ran */
    char path[1024];
    snprintf(path, sizeof path, "%s/gc/gpu_check.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    REQUIRE(j != NULL);
    CHECK(json_integer_value(json_object_get(j, "exit")) == 2);
    json_t *r = row_named(json_object_get(j, "rows"), "group grpo");
    REQUIRE(r != NULL);
    CHECK(!strcmp(json_string_value(json_object_get(r, "status")), "skip"));
    r = row_named(json_object_get(j, "rows"), "group coloc"); /* the script's own groups too */
    REQUIRE(r != NULL);
    CHECK(!strcmp(json_string_value(json_object_get(r, "status")), "skip"));
    CHECK(row_named(json_object_get(j, "rows"), "group steptime") == NULL); /* stage 3 only with --stage 3 */
    CHECK(json_array_size(json_object_get(j, "groups")) == 1); /* env only: the rest not run */
    json_decref(j);

    rc = test_run(out, sizeof out, "scripts/gpu_check.sh --stage 1 --bin %s/no_such_binary", dir);
    CHECK_MSG(rc == 2, "exit status %d, want 2; output:\n%s", rc, out);
    CHECK(strstr(out, "is not an executable file") != NULL);
    CHECK(strstr(out, "gpu_check.sh: exit 2 (could not run") != NULL);
}

/* --groups runs only those groups; the speed figures reach the summary's table; all ok gives exit 0. */
TEST(gpu_check_sh_groups_and_speed_table) {
    const char *dir = test_tmpdir();
    const char *fake = write_fake(dir);
    static char out[1 << 16];
    int rc = test_run(out, sizeof out, "scripts/gpu_check.sh --stage 2 --groups perf,dit --emulated --bin %s", fake);
    CHECK_MSG(rc == 0, "exit status %d, want 0; output:\n%s", rc, out);
    int lines = 0;
    const char *sum = summary_of(out, &lines);
    REQUIRE(sum != NULL);
    CHECK(strstr(sum, "stage 2  dit ok") != NULL);
    CHECK(strstr(out, "group grpo") == NULL && strstr(out, "group layers") == NULL);
    CHECK(strstr(sum, "GEMM 8192^3 C = A B^T (NT, linear)       612.5") != NULL);
    CHECK(strstr(sum, "gpu_check.sh: exit 0 (every row ok)") != NULL);
    CHECK(test_run(out, sizeof out, "scripts/gpu_check.sh --groups nosuch --emulated --bin %s", fake) == 2);
    CHECK(strstr(out, "no such group") != NULL);
}

/* The CUDA build's gpu_check (beside $VGRPO_BIN: make test's cuda-smoke part runs this with build-cuda/vgrpo):
 * `ldd` lists only libc, libm and the loader, so it runs on a GPU machine without the build's Debian libraries; and
 * on this machine without a GPU the script ends with exit 2 and the driver's absence in its summary. Skipped, saying
 * so, beside a plain build. */
TEST(gpu_check_sh_cuda_binary) {
    char bin[1024];
    snprintf(bin, sizeof bin, "%s", test_vgrpo_bin());
    char *slash = strrchr(bin, '/');
    snprintf(slash ? slash + 1 : bin, sizeof bin - (slash ? (size_t)(slash + 1 - bin) : 0), "gpu_check");
    if (access(bin, X_OK) != 0) {
        test_skip("no gpu_check beside $VGRPO_BIN (the CUDA build's: make test runs this in its cuda-smoke part)");
        return;
    }
    static char out[1 << 16];
    REQUIRE(test_run(out, sizeof out, "ldd %s", bin) == 0);
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        while (*line == ' ' || *line == '\t') line++;
        const int ok = !strncmp(line, "linux-vdso", 10) || !strncmp(line, "libc.so", 7) ||
                       !strncmp(line, "libm.so", 7) || strstr(line, "ld-linux") || !strncmp(line, "libdl.so", 8) ||
                       !strncmp(line, "libpthread.so", 13) || !strncmp(line, "librt.so", 8);
        CHECK_MSG(ok, "%s needs a library beyond libc/libm: %s", bin, line);
    }
    if (access("/dev/nvidiactl", F_OK) == 0) {
        test_skip("this machine has an NVIDIA device node: the no-GPU exit is not what runs here");
        return;
    }
    const char *dir = test_tmpdir();
    int rc = test_run(out, sizeof out, "scripts/gpu_check.sh --stage 1 --bin %s --out %s/gc", bin, dir);
    CHECK_MSG(rc == 2, "exit status %d, want 2 (no GPU here); output:\n%s", rc, out);
    const char *sum = strstr(out, "==================== gpu_check summary");
    REQUIRE(sum != NULL);
    CHECK(strstr(sum, "FAIL [1 env] group env: could not run: the CUDA backend cannot run here: CUDA:") != NULL);
    CHECK(strstr(sum, "not run  7 groups:") != NULL);
    CHECK(strstr(sum, "gpu_check.sh: exit 2 (could not run") != NULL);
}

/* Stage 2's rows that run the vgrpo CLI ($VGRPO_BIN on the emulated device): the tiny recipe colocated on one GPU
 * (metrics equal to the local run's, every sync by IPC with the hashes matched, parity 0), then with a device that
 * refuses IPC handles (VGRPO_EMULATE_IPC=refuse: the syncs go in buckets), which the IPC row must fail; the VAE row
 * (the Wan 2.1 and 2.2 fixtures decoded on the device vs the CPU, within its tolerance) and the umT5 row (vgrpo bench
 * umt5 --device cuda on the emulated device), both ok. */
TEST(gpu_check_sh_coloc_rows) {
    const char *dir = test_tmpdir();
    const char *fake = write_fake(dir);
    static char out[1 << 17];
    int rc = test_run(out, sizeof out,
                      "VGRPO_BIN=%s scripts/gpu_check.sh --stage 2 --groups coloc,vae_umt5 --emulated --bin %s "
                      "--out %s/gc",
                      test_vgrpo_bin(), fake, dir);
    CHECK_MSG(rc == 0, "exit status %d, want 0; output:\n%s", rc, out);
    int lines = 0;
    const char *sum = summary_of(out, &lines);
    REQUIRE(sum != NULL);
    CHECK(lines <= 40);
    CHECK(strstr(sum, "stage 2  coloc ok") != NULL);
    CHECK(strstr(sum, "vae_umt5 ok") != NULL);
    CHECK(strstr(sum, "not built vae decode") == NULL);
    CHECK(strstr(sum, "umt5 gpu vs cpu (") == NULL); /* umT5's row runs (checked with the JSON below) */
    char path[1024];
    snprintf(path, sizeof path, "%s/gc/gpu_check.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    REQUIRE(j != NULL);
    json_t *rows = json_object_get(j, "rows");
    const char *ok[] = {"coloc 1 GPU metrics = local", "coloc 1 GPU weight sync by IPC", "coloc 1 GPU parity",
                        "umt5 gpu vs cpu"};
    for (int i = 0; i < 4; i++) {
        json_t *r = row_named(rows, ok[i]);
        REQUIRE(r != NULL);
        CHECK_MSG(!strcmp(json_string_value(json_object_get(r, "status")), "ok"), "%s: %s", ok[i],
                  json_string_value(json_object_get(r, "error")));
        CHECK(json_integer_value(json_object_get(r, "stage")) == 2);
    }
    json_t *r = row_named(rows, ok[1]);
    REQUIRE(r != NULL);
    CHECK(strstr(json_string_value(json_object_get(r, "note")), "3 syncs applied by IPC (worker log), 3 hash checks") !=
          NULL);
    r = row_named(rows, "vae decode gpu vs cpu");
    REQUIRE(r != NULL);
    CHECK_MSG(!strcmp(json_string_value(json_object_get(r, "status")), "ok"), "%s",
              json_string_value(json_object_get(r, "error")));
    const char *vn = json_string_value(json_object_get(r, "note"));
    CHECK_MSG(vn && strstr(vn, "wan21: emulated vs cpu: max |device - cpu|") && strstr(vn, "wan22: emulated vs cpu") &&
              strstr(vn, "tolerance: relative 0.08, mean 0.01"), "note: %s", vn ? vn : "(none)");
    r = row_named(rows, "umt5 gpu vs cpu");
    REQUIRE(r != NULL);
    CHECK(strstr(json_string_value(json_object_get(r, "note")), "max|a-b|/max|b|") != NULL);
    json_decref(j);

    /* the worker's device refuses the IPC handles: the same metrics and parity, but the syncs went in buckets */
    rc = test_run(out, sizeof out,
                  "VGRPO_EMULATE_IPC=refuse VGRPO_BIN=%s scripts/gpu_check.sh --stage 2 --groups coloc --emulated "
                  "--bin %s",
                  test_vgrpo_bin(), fake);
    CHECK_MSG(rc == 1, "exit status %d, want 1 (the IPC row fails); output:\n%s", rc, out);
    sum = summary_of(out, &lines);
    REQUIRE(sum != NULL);
    CHECK(strstr(sum, "FAIL [2 coloc] coloc 1 GPU weight sync by IPC: want 3 syncs by IPC, all hashes matched: 3 went "
                      "in buckets or per tensor, 0 hash mismatches") != NULL);
    CHECK(strstr(sum, "coloc 1 GPU metrics = local") == NULL && strstr(sum, "coloc 1 GPU parity") == NULL);
    CHECK(strstr(sum, "rows     3: 2 ok, 1 FAIL") != NULL);
}

/* Stage 3 runs only when asked for (--stage 3), and at --s3-size tiny (the emulated device's default) prints the
 * step-time table for 5 and 33 frames: the token counts of 32x32 (2 x 2 patches per latent frame), every phase timed,
 * the MFU against the peak measured in the same run. */
TEST(gpu_check_sh_stage3_table) {
    const char *dir = test_tmpdir();
    const char *fake = write_fake(dir);
    static char out[1 << 17];
    CHECK(test_run(out, sizeof out, "scripts/gpu_check.sh --help") == 0); /* the header: stage 3 and its option */
    CHECK(strstr(out, "Stage 3 (optional, only with --stage 3") != NULL && strstr(out, "--s3-size tiny") != NULL);
    CHECK(test_run(out, sizeof out, "scripts/gpu_check.sh --groups steptime --emulated --bin %s", fake) == 2);
    CHECK(strstr(out, "no such group in stage 1, 2 (stage 3's: --stage 3)") != NULL);
    int rc = test_run(out, sizeof out, "VGRPO_BIN=%s scripts/gpu_check.sh --stage 3 --emulated --bin %s --out %s/gc",
                      test_vgrpo_bin(), fake, dir);
    CHECK_MSG(rc == 0, "exit status %d, want 0; output:\n%s", rc, out);
    int lines = 0;
    const char *sum = summary_of(out, &lines);
    REQUIRE(sum != NULL);
    CHECK(lines <= 40);
    CHECK(strstr(sum, "stage 3  peak ok") != NULL && strstr(sum, "steptime ok") != NULL);
    CHECK(strstr(sum, "step time (s), G 4     tokens  rollout  decode  reward    train    sync     step samples/s "
                      "peak GiB  TFLOP/s  MFU %") != NULL);
    CHECK(strstr(sum, "F5 32x32 tiny               8 ") != NULL);
    CHECK(strstr(sum, "F33 32x32 tiny             36 ") != NULL);
    CHECK(strstr(out, "---- stage 1") == NULL && strstr(out, "---- stage 2") == NULL);
    char path[1024];
    snprintf(path, sizeof path, "%s/gc/gpu_check.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    REQUIRE(j != NULL);
    json_t *st = json_object_get(j, "steptime");
    REQUIRE(json_is_array(st) && json_array_size(st) == 2);
    const double peak = json_real_value(json_object_get(json_array_get(st, 0), "peak_tflops"));
    CHECK(peak > 0);
    for (size_t i = 0; i < 2; i++) {
        json_t *e = json_array_get(st, i);
        CHECK(json_integer_value(json_object_get(e, "frames")) == (i ? 33 : 5));
        CHECK(json_integer_value(json_object_get(e, "tokens")) == (i ? 36 : 8));
        CHECK(json_integer_value(json_object_get(e, "G")) == 4);
        const char *keys[] = {"rollout_s", "train_s", "sync_s", "step_s", "samples_per_s", "train_tflops"};
        for (int k = 0; k < 6; k++) CHECK_MSG(json_number_value(json_object_get(e, keys[k])) > 0, "%s", keys[k]);
        /* MFU = the train part's TFLOP/s over the peak, in percent (rounded to 0.1) */
        const double mfu = json_number_value(json_object_get(e, "mfu_pct")),
                     want = 100 * json_number_value(json_object_get(e, "train_tflops")) / peak;
        CHECK_MSG(mfu > 0 && mfu > want - 0.1 && mfu < want + 0.1, "mfu %g, want %g", mfu, want);
        CHECK(json_is_null(json_object_get(e, "decode_s"))); /* the CPU VAE's decode: real size only */
    }
    json_decref(j);
}
