/* tests/test_sync_nccl.c — the weight sync by NCCL broadcast inside one MPI job (trainer/net/sync_nccl.h,
 * rollout/worker_ipc.h), on the emulated device through the fake NCCL (tests/fake_nccl: NCCL's calls over MPI,
 * checked against NCCL's contract): `vgrpo run --launcher mpirun` with 2 trainer ranks and 2 rollout workers,
 * parallel.sync nccl: every sync goes to both workers by broadcast into their device weights (the controller's
 * per-sync line and the workers' logs say so), and the run's metrics, rewards and checkpoint equal the same job's
 * with parallel.sync buckets bit for bit (the workers sample with the weights they received); auto on one host goes
 * by IPC; parallel.sync nccl outside an MPI launch is refused; a worker that cannot reserve its landing buffer takes no NCCL
 * sync (the job goes by buckets, same bits); at ZeRO stage 3 the NCCL syncs send the host copy through a device
 * staging, the same bits as stage 3 in buckets (also in one bucket larger than the model's size, and under auto on
 * one host, where no device buffer exists for IPC). And without sockets (tests/mpi/mpi_sync_nccl.c, 2 and 4
 * ranks): the workers' device weights equal an upload of the master bit for bit; a corrupted bucket is refused by
 * name. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/metrics_rows.h"
#include "tests/test.h"

/* One MPI job into dir/name with parallel.sync `sync`; env: more VAR=value for every process ("" none); extra: more
 * --set ("" none). */
static int job_env(char *out, size_t cap, const char *dir, const char *name, const char *sync, const char *env,
                   const char *extra) {
    const char *bin = test_vgrpo_bin(), *slash = strrchr(bin, '/');
    return test_run(out, cap,
                    "env %s OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                    "OMPI_MCA_btl_vader_single_copy_mechanism=none VGRPO_EMULATE_DEVICE=1 OMP_NUM_THREADS=1 "
                    "VGRPO_NCCL_LIB=%.*s/libfake_nccl.so timeout 300 %s run recipes/tiny-cpu.yaml --launcher mpirun "
                    "--set mode=colocated --set model.device=cuda --set model.path=%s/model --set rollout.num_steps=4 "
                    "--set parallel.trainer_ranks=2 --set parallel.rollout_workers=2 --set checkpoint.every=0 "
                    "--set logging.eval_every=0 --set parallel.sync_bucket_mib=1 --set parallel.sync=%s "
                    "--set logging.run_dir=%s/%s %s --steps 2 2>&1",
                    env, slash ? (int)(slash - bin) : 1, slash ? bin : ".", bin, dir, sync, dir, name, extra);
}

static int job(char *out, size_t cap, const char *dir, const char *name, const char *sync) {
    return job_env(out, cap, dir, name, sync, "", "");
}

/* tests/mpi/mpi_sync_nccl.c under mpirun: a controller's side and 1 or 3 workers. */
static void run_ranks(int ranks) {
    const char *bin = test_vgrpo_bin(), *slash = strrchr(bin, '/'), *e = getenv("VGRPO_MPI_TESTS");
    static char out[16384];
    const int rc = test_run(out, sizeof out,
                            "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 "
                            "OMPI_MCA_btl_vader_single_copy_mechanism=none VGRPO_NCCL_LIB=%.*s/libfake_nccl.so "
                            "timeout 120 mpirun -n %d --oversubscribe --bind-to none -x OMP_NUM_THREADS -x "
                            "VGRPO_NCCL_LIB %s sync_nccl 1000 2>&1",
                            slash ? (int)(slash - bin) : 1, slash ? bin : ".", ranks,
                            e && *e ? e : "build/vgrpo_mpi_tests");
    char want[64];
    snprintf(want, sizeof want, "sync_nccl: PASS (0 of %d ranks failed)", ranks);
    CHECK_MSG(rc == 0 && strstr(out, want), "mpirun -n %d sync_nccl: exit %d:\n%s", ranks, rc, out);
}

TEST(sync_nccl_broadcast_bit_for_bit_and_corrupt_bucket) {
    if (access("/usr/bin/mpirun", X_OK)) {
        test_skip("no /usr/bin/mpirun");
        return;
    }
    run_ranks(2);
    run_ranks(4);
}

TEST(sync_nccl_mpi_job_equals_buckets) {
    if (access("/usr/bin/mpirun", X_OK)) {
        test_skip("no /usr/bin/mpirun");
        return;
    }
    const char *dir = test_tmpdir();
    static char out[1 << 16];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 4 >/dev/null",
                     test_vgrpo_bin(), dir) == 0);
    int rc = job(out, sizeof out, dir, "nccl", "nccl");
    CHECK_MSG(rc == 0, "the NCCL job: %s", out);
    CHECK_MSG(strstr(out, "(0 by IPC, 2 by NCCL broadcast, 0 in buckets)"), "no NCCL sync line: %s", out);
    char grep[64];
    for (int w = 0; w < 2; w++)
        CHECK_MSG(test_run(grep, sizeof grep, "grep -c 'applied (by NCCL broadcast, into the device' %s/nccl/logs/"
                           "worker-%d.log", dir, w) == 0 && atoi(grep) >= 2,
                  "worker-%d: %s", w, grep);
    /* (parallel.sync buckets never broadcasts, so its workers reserve no landing buffer: an allocation of one bucket
     * that would fail goes unnoticed) */
    rc = job_env(out, sizeof out, dir, "buckets", "buckets", "VGRPO_EMULATE_DEVICE_FAIL_BYTES=1048576", "");
    CHECK_MSG(rc == 0 && strstr(out, "(0 by IPC, 0 by NCCL broadcast, 2 in buckets)"), "the bucket job: %s", out);
    CHECK_MSG(test_run(grep, sizeof grep, "cat %s/buckets/logs/worker-0.log %s/buckets/logs/worker-1.log | grep -c "
                       "'no NCCL weight sync'", dir, dir) == 1 && atoi(grep) == 0,
              "the bucket job's workers reserved a landing buffer: %s", grep);
    char pa[700], pb[700];
    json_t *ra[8], *rb[8];
    snprintf(pa, sizeof pa, "%s/nccl/metrics.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/buckets/metrics.jsonl", dir);
    const int na = read_rows(pa, ra, 8, 1), nb = read_rows(pb, rb, 8, 1);
    CHECK_MSG(na == 3 && nb == na, "metrics rows: %d, %d", na, nb);
    for (int i = 0; i < na && i < nb; i++) CHECK_MSG(json_equal(ra[i], rb[i]), "row %d: NCCL differs from buckets", i);
    for (int i = 0; i < na; i++) json_decref(ra[i]);
    for (int i = 0; i < nb; i++) json_decref(rb[i]);
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/nccl/rewards.jsonl %s/buckets/rewards.jsonl && cmp "
                       "%s/nccl/checkpoint-2/transformer/diffusion_pytorch_model.safetensors "
                       "%s/buckets/checkpoint-2/transformer/diffusion_pytorch_model.safetensors",
                       dir, dir, dir, dir) == 0, "%s", out);
    /* a worker that cannot reserve its landing buffer (one bucket: 1 MiB here; the emulated device fails that
     * allocation) says so and takes no NCCL sync: the job goes by buckets, the same bits, instead of waiting for ever */
    rc = job_env(out, sizeof out, dir, "noland", "nccl", "VGRPO_EMULATE_DEVICE_FAIL_BYTES=1048576", "");
    CHECK_MSG(rc == 0 && strstr(out, "(0 by IPC, 0 by NCCL broadcast, 2 in buckets)"), "the job without a landing "
              "buffer: %s", out);
    CHECK_MSG(test_run(grep, sizeof grep, "grep -c 'no NCCL weight sync for this worker (host buckets instead): 1.0 MiB "
                       "of device memory for the weight sync' %s/noland/logs/worker-0.log %s/noland/logs/worker-1.log "
                       "| grep -c ':1$'", dir, dir) == 0 && atoi(grep) == 2, "the workers' warning: %s", grep);
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/noland/rewards.jsonl %s/buckets/rewards.jsonl", dir, dir) == 0, "%s", out);
    /* ZeRO stage 3 (no device holds a whole master): NCCL syncs send the host copy through a device staging (the
     * trainer's idle gradients), bucket by bucket; the same bits as stage 3 in buckets */
    rc = job_env(out, sizeof out, dir, "nccl3", "nccl", "", "--set parallel.zero_stage=3");
    CHECK_MSG(rc == 0 && strstr(out, "(0 by IPC, 2 by NCCL broadcast, 0 in buckets)"), "the stage-3 NCCL job: %s", out);
    rc = job_env(out, sizeof out, dir, "buckets3", "buckets", "", "--set parallel.zero_stage=3");
    CHECK_MSG(rc == 0 && strstr(out, "(0 by IPC, 0 by NCCL broadcast, 2 in buckets)"), "the stage-3 bucket job: %s", out);
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/nccl3/rewards.jsonl %s/buckets3/rewards.jsonl && cmp "
                       "%s/nccl3/checkpoint-2/transformer/diffusion_pytorch_model.safetensors "
                       "%s/buckets3/checkpoint-2/transformer/diffusion_pytorch_model.safetensors",
                       dir, dir, dir, dir) == 0, "stage 3, NCCL vs buckets: %s", out);
    /* parallel.sync_bucket_mib above the model's size: one bucket of the model's size, which the staging (as large as
     * the model) holds: still by NCCL, the same bits */
    rc = job_env(out, sizeof out, dir, "one3", "nccl", "", "--set parallel.zero_stage=3 --set parallel.sync_bucket_mib=64");
    CHECK_MSG(rc == 0 && strstr(out, "(0 by IPC, 2 by NCCL broadcast, 0 in buckets)") && !strstr(out, "goes in buckets"),
              "the stage-3 NCCL job in one bucket: %s", out);
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/one3/rewards.jsonl %s/buckets3/rewards.jsonl && cmp "
                       "%s/one3/checkpoint-2/transformer/diffusion_pytorch_model.safetensors "
                       "%s/buckets3/checkpoint-2/transformer/diffusion_pytorch_model.safetensors",
                       dir, dir, dir, dir) == 0, "stage 3 in one bucket, NCCL vs buckets: %s", out);
    /* auto inside one MPI job on one host: CUDA IPC (here the emulated device's) to every worker */
    rc = job(out, sizeof out, dir, "auto", "auto");
    CHECK_MSG(rc == 0 && strstr(out, "(2 by IPC, 0 by NCCL broadcast, 0 in buckets)"), "the auto job: %s", out);
    /* auto at ZeRO stage 3 on one host: no device buffer IPC could export, so the staged broadcast (not buckets) */
    rc = job_env(out, sizeof out, dir, "auto3", "auto", "", "--set parallel.zero_stage=3");
    CHECK_MSG(rc == 0 && strstr(out, "(0 by IPC, 2 by NCCL broadcast, 0 in buckets)"), "the stage-3 auto job: %s", out);
    CHECK_MSG(test_run(out, sizeof out, "cmp %s/auto3/rewards.jsonl %s/buckets3/rewards.jsonl", dir, dir) == 0,
              "stage 3, auto vs buckets: %s", out);
    /* outside one MPI job */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set mode=colocated --set model.device=cuda "
                   "--set parallel.sync=nccl 2>&1", test_vgrpo_bin()) == 1 &&
          strstr(out, "parallel.sync: nccl needs the rollout workers in the job's communicator: --launcher mpirun"));
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set parallel.sync=nccl 2>&1",
                   test_vgrpo_bin()) == 1 && strstr(out, "parallel.sync: nccl broadcasts"));
}
