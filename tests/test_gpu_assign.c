/* tests/test_gpu_assign.c — which GPU each process of a job uses (core/gpu_assign.h): the plans (a GPU per process,
 * shared in turns, the local process, parallel.gpus and the visible devices), every refusal with the key it names,
 * `vgrpo run --dry-run`'s table, and the processes of an emulated-device job logging their GPU at start-up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/gpu_assign.h"
#include "core/recipe.h"
#include "tests/test.h"

/* recipes/tiny-cpu.yaml with model.device cuda and the given --set values (NULL-terminated). */
static int load(core_recipe *r, const char *s0, const char *s1, const char *s2, const char *s3) {
    const char *sets[6] = {"model.device=cuda"};
    int n = 1;
    const char *more[4] = {s0, s1, s2, s3};
    for (int i = 0; i < 4 && more[i]; i++) sets[n++] = more[i];
    return core_recipe_load(r, "recipes/tiny-cpu.yaml", sets, n);
}

TEST(gpu_assign_plans_and_refusals) {
    core_recipe r;
    core_gpu_plan p;
    /* local: one process on the first GPU of the list */
    REQUIRE_OK(load(&r, "parallel.gpus=[5,2]", NULL, NULL, NULL));
    REQUIRE_OK(core_gpu_plan_make(&r, -1, &p));
    CHECK(p.n_trainer == 1 && p.n_workers == 0 && core_gpu_of(&p, CORE_GPU_TRAINER, 0) == 5);
    core_recipe_release(&r);
    /* colocated, a GPU each: ranks first, then workers */
    REQUIRE_OK(load(&r, "mode=colocated", "parallel.rollout_workers=3", NULL, NULL));
    REQUIRE_OK(core_gpu_plan_make(&r, 4, &p));
    CHECK(core_gpu_of(&p, CORE_GPU_TRAINER, 0) == 0 && core_gpu_of(&p, CORE_GPU_WORKER, 0) == 1 &&
          core_gpu_of(&p, CORE_GPU_WORKER, 2) == 3);
    CHECK(core_gpu_plan_make(&r, 3, &p) == -1); /* 4 processes, 3 visible */
    CHECK_MSG(strstr(core_last_error(), "CUDA_VISIBLE_DEVICES names 3 GPU(s) for 1 trainer rank(s) and 3 rollout "
                                        "worker(s) on separate GPUs (4 needed)") &&
                  strstr(core_last_error(), "parallel.share_gpus true"),
              "got: %s", core_last_error());
    REQUIRE_OK(core_gpu_plan_make(&r, -1, &p)); /* unknown: checked when each process opens its GPU */
    CHECK(p.n == 4);
    core_recipe_release(&r);
    /* shared: 2 workers on 2 GPUs whose first is the trainer's */
    REQUIRE_OK(load(&r, "mode=colocated", "parallel.rollout_workers=3", "parallel.gpus=[6,7]", "parallel.share_gpus=true"));
    REQUIRE_OK(core_gpu_plan_make(&r, 8, &p));
    CHECK(core_gpu_of(&p, CORE_GPU_TRAINER, 0) == 6 && core_gpu_of(&p, CORE_GPU_WORKER, 0) == 6 &&
          core_gpu_of(&p, CORE_GPU_WORKER, 1) == 7 && core_gpu_of(&p, CORE_GPU_WORKER, 2) == 6);
    CHECK(core_gpu_plan_make(&r, 7, &p) == -1 && strstr(core_last_error(), "parallel.gpus.1: GPU 7 is out of range: 7"));
    core_recipe_release(&r);
    /* repeated, negative, too few for the trainer ranks even shared */
    REQUIRE_OK(load(&r, "mode=colocated", "parallel.gpus=[1,0,1]", NULL, NULL));
    CHECK(core_gpu_plan_make(&r, -1, &p) == -1 &&
          strstr(core_last_error(), "parallel.gpus.2: GPU 1 is listed twice (also parallel.gpus.0)"));
    core_recipe_release(&r);
    /* an index past int (no device has it) is refused, not wrapped into another GPU's number; a negative one is
     * named as such where the visible count is unknown (not "0 visible device(s)") */
    REQUIRE_OK(load(&r, "mode=colocated", "parallel.gpus=[0,4294967297]", NULL, NULL));
    CHECK_MSG(core_gpu_plan_make(&r, -1, &p) == -1 &&
                  strstr(core_last_error(), "parallel.gpus.1: GPU 4294967297 is not a device index (0 .. 2147483647)"),
              "got: %s", core_last_error());
    core_recipe_release(&r);
    REQUIRE_OK(load(&r, "mode=colocated", "parallel.gpus=[-1]", NULL, NULL));
    CHECK_MSG(core_gpu_plan_make(&r, -1, &p) == -1 &&
                  strstr(core_last_error(), "parallel.gpus.0: GPU -1 is not a device index (0 .. 2147483647)"),
              "got: %s", core_last_error());
    core_recipe_release(&r);
    REQUIRE_OK(load(&r, "mode=colocated", "parallel.trainer_ranks=2", "parallel.gpus=[0]", "parallel.share_gpus=true"));
    CHECK(core_gpu_plan_make(&r, -1, &p) == -1 &&
          strstr(core_last_error(), "parallel.gpus lists 1 GPU(s) for 2 trainer rank(s): a trainer rank needs a GPU of "
                                    "its own"));
    core_recipe_release(&r);
    /* the visible count and the workers' ids */
    setenv("CUDA_VISIBLE_DEVICES", "3,5,,7", 1);
    CHECK(core_gpu_visible() == 3);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    CHECK(core_gpu_visible() == 0);
    unsetenv("CUDA_VISIBLE_DEVICES");
    CHECK(core_gpu_visible() == -1);
    CHECK(core_gpu_worker_index("worker-12") == 12 && core_gpu_worker_index("worker-1x") == -1 &&
          core_gpu_worker_index("mine") == -1);
}

TEST(gpu_assign_dry_run_and_process_logs) {
    const char *bin = test_vgrpo_bin(), *dir = test_tmpdir();
    static char out[65536];
    const char *base = "recipes/tiny-cpu.yaml --dry-run --set model.device=cuda --set mode=colocated";
    CHECK(test_run(out, sizeof out, "CUDA_VISIBLE_DEVICES=0,1,2,3 %s run %s --set parallel.rollout_workers=2 "
                                    "--set parallel.gpus=[3,1,0] 2>&1 >/dev/null", bin, base) == 0);
    CHECK_MSG(strstr(out, "GPU assignment (parallel.gpus; a GPU per process):\n  trainer rank 0 -> GPU 3\n"
                          "  rollout worker 0 -> GPU 1\n  rollout worker 1 -> GPU 0\n"), "got: %s", out);
    struct {
        const char *sets, *expect;
    } bad[] = {
        {"--set parallel.rollout_workers=2 --set parallel.gpus=[0,1]", "(3 needed)"},
        {"--set parallel.gpus=[0,4]", "parallel.gpus.1: GPU 4 is out of range: 4 visible device(s)"},
        {"--set parallel.gpus=[2,2]", "parallel.gpus.1: GPU 2 is listed twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(test_run(out, sizeof out, "CUDA_VISIBLE_DEVICES=0,1,2,3 %s run %s %s 2>&1", bin, base, bad[i].sets) == 1);
        CHECK_MSG(strstr(out, bad[i].expect), "%s: got %s", bad[i].sets, out);
    }
    /* a job on the emulated device: each process says which GPU it was given */
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 1 >/dev/null", bin, dir) == 0);
    const int rc = test_run(out, sizeof out,
                            "VGRPO_EMULATE_DEVICE=1 OMP_NUM_THREADS=1 %s run recipes/tiny-cpu.yaml --set mode=colocated "
                            "--set model.device=cuda --set model.path=%s/model --set logging.run_dir=%s/run "
                            "--set rollout.num_steps=4 --set parallel.trainer_ranks=2 --set parallel.rollout_workers=2 "
                            "--set parallel.gpus=[3,2,1,0] --steps 1 2>&1",
                            bin, dir, dir);
    CHECK_MSG(rc == 0, "run: %s", out);
    CHECK_MSG(strstr(out, "trainer rank 0: model.device cuda on GPU 3 (parallel.gpus)") &&
                  strstr(out, "trainer rank 1: model.device cuda on GPU 2 (parallel.gpus)"), "got: %s", out);
    CHECK(test_run(out, sizeof out, "grep -h 'rollout worker [01]: model.device cuda on GPU' %s/run/logs/worker-*.log",
                   dir) == 0);
    CHECK_MSG(strstr(out, "rollout worker 0: model.device cuda on GPU 1") &&
                  strstr(out, "rollout worker 1: model.device cuda on GPU 0"), "got: %s", out);
}

/* GPUs numbered per node (core_gpu_set_nodes): each node's plan over its own processes, the launcher checking every
 * node and naming the one refused, and the busiest node's plan for the per-GPU estimate. */
TEST(gpu_assign_per_node) {
    core_recipe r;
    core_gpu_plan p;
    REQUIRE_OK(load(&r, "mode=colocated", "parallel.trainer_ranks=4", "parallel.rollout_workers=4", NULL));
    const core_gpu_node two[2] = {{"n1", 4, 0}, {"n2", 0, 4}};
    /* worker 2 of the job is the third worker of node n2: GPU 2 there, not 4 + 2 */
    REQUIRE_OK(core_gpu_set_nodes(two, 2, 1, 2));
    REQUIRE_OK(core_gpu_plan_make(&r, 4, &p));
    CHECK(p.n_trainer == 0 && p.n_workers == 4 && p.node && !strcmp(p.node, "n2"));
    CHECK(core_gpu_of(&p, CORE_GPU_WORKER, 2) == 2);
    REQUIRE_OK(core_gpu_select(&r, CORE_GPU_WORKER, 2));
    CHECK(!strcmp(getenv(CORE_GPU_ENV), "2"));
    CHECK(core_gpu_plan_make(&r, 3, &p) == -1); /* 4 workers, 3 GPUs on n2 */
    CHECK_MSG(strstr(core_last_error(), "node n2 (0 trainer rank(s), 4 rollout worker(s) on it): parallel.gpus: "
                                        "CUDA_VISIBLE_DEVICES names 3 GPU(s)") &&
                  strstr(core_last_error(), "(4 needed)"), "got: %s", core_last_error());
    /* trainer rank 1 of the job on node n1: its own index */
    REQUIRE_OK(core_gpu_set_nodes(two, 2, 0, 1));
    REQUIRE_OK(core_gpu_select(&r, CORE_GPU_TRAINER, 1));
    CHECK(!strcmp(getenv(CORE_GPU_ENV), "1"));
    /* the launcher: every node checked; a node of 4 trainer ranks and 2 workers on 4 GPUs refused by name */
    const core_gpu_node bad[2] = {{"n1", 4, 2}, {"n2", 0, 2}};
    REQUIRE_OK(core_gpu_set_nodes(bad, 2, -1, 0));
    CHECK(core_gpu_plan_make(&r, 4, &p) == -1);
    CHECK_MSG(strstr(core_last_error(), "node n1 (4 trainer rank(s), 2 rollout worker(s) on it)") &&
                  strstr(core_last_error(), "(6 needed)"), "got: %s", core_last_error());
    REQUIRE_OK(core_gpu_plan_make(&r, 6, &p)); /* the busiest node's plan */
    CHECK(p.node && !strcmp(p.node, "n1") && core_gpu_of(&p, CORE_GPU_WORKER, 1) == 5);
    core_recipe_release(&r);
    /* shared: a node of workers only uses its first GPU(s) in turns */
    REQUIRE_OK(load(&r, "mode=colocated", "parallel.trainer_ranks=2", "parallel.rollout_workers=3",
                    "parallel.share_gpus=true"));
    const core_gpu_node sh[2] = {{"a", 2, 0}, {"b", 0, 3}};
    REQUIRE_OK(core_gpu_set_nodes(sh, 2, 1, 0));
    REQUIRE_OK(core_gpu_plan_make(&r, 2, &p));
    CHECK(core_gpu_of(&p, CORE_GPU_WORKER, 0) == 0 && core_gpu_of(&p, CORE_GPU_WORKER, 1) == 1 &&
          core_gpu_of(&p, CORE_GPU_WORKER, 2) == 0);
    REQUIRE_OK(core_gpu_set_nodes(NULL, 0, -1, 0)); /* one node again */
    REQUIRE_OK(core_gpu_plan_make(&r, 2, &p));
    CHECK(p.node == NULL && p.n_trainer == 2 && p.n_workers == 3);
    core_recipe_release(&r);
    unsetenv(CORE_GPU_ENV);
}

/* `vgrpo run --launcher mpirun --hostfile F --dry-run`: the plan per node as mpirun fills the hostfile's slots, and
 * the refusals naming the node or the hostfile. */
TEST(gpu_assign_dry_run_per_node) {
    const char *bin = test_vgrpo_bin(), *dir = test_tmpdir();
    static char out[65536];
    char hf[600];
    snprintf(hf, sizeof hf, "%s/hosts.txt", dir);
    const char *base = "recipes/tiny-cpu.yaml --dry-run --set model.device=cuda --set mode=colocated --launcher mpirun "
                       "--set parallel.trainer_ranks=2 --set parallel.rollout_workers=3";
    REQUIRE(test_run(out, sizeof out, "printf '# two nodes\\nnodeA slots=2\\nnodeB slots=2 max_slots=4\\nnodeB "
                                      "slots=2\\n' > %s", hf) == 0);
    CHECK(test_run(out, sizeof out, "CUDA_VISIBLE_DEVICES=0,1,2 %s run %s --hostfile %s 2>&1 >/dev/null", bin, base,
                   hf) == 0);
    CHECK_MSG(strstr(out, "GPU assignment per node (the devices CUDA_VISIBLE_DEVICES names, each node's own; a GPU per "
                          "process):\n  node nodeA: 2 trainer rank(s), 0 rollout worker(s)\n    trainer rank 0 -> GPU 0\n"
                          "    trainer rank 1 -> GPU 1\n  node nodeB: 0 trainer rank(s), 3 rollout worker(s)\n"
                          "    rollout worker 0 -> GPU 0\n    rollout worker 1 -> GPU 1\n    rollout worker 2 -> GPU 2\n"),
              "got: %s", out);
    /* 2 GPUs a node: node B's 3 workers do not fit; one node of 6 slots: 5 processes on 3 GPUs */
    CHECK(test_run(out, sizeof out, "CUDA_VISIBLE_DEVICES=0,1 %s run %s --hostfile %s 2>&1", bin, base, hf) == 1);
    CHECK_MSG(strstr(out, "node nodeB (0 trainer rank(s), 3 rollout worker(s) on it): parallel.gpus: "
                          "CUDA_VISIBLE_DEVICES names 2 GPU(s)"), "got: %s", out);
    REQUIRE(test_run(out, sizeof out, "printf 'one slots=6\\n' > %s", hf) == 0);
    CHECK(test_run(out, sizeof out, "CUDA_VISIBLE_DEVICES=0,1,2 %s run %s --hostfile %s 2>&1", bin, base, hf) == 1);
    CHECK_MSG(strstr(out, "(5 needed)") && !strstr(out, "node one"), "got: %s", out);
    REQUIRE(test_run(out, sizeof out, "printf 'one slots=x\\n' > %s", hf) == 0);
    CHECK(test_run(out, sizeof out, "%s run %s --hostfile %s 2>&1", bin, base, hf) == 1);
    CHECK_MSG(strstr(out, "hosts.txt:1: slots=x is not a count >= 1"), "got: %s", out);
    REQUIRE(test_run(out, sizeof out, "printf 'one slots=3\\n' > %s", hf) == 0);
    CHECK(test_run(out, sizeof out, "%s run %s --hostfile %s 2>&1", bin, base, hf) == 1);
    CHECK_MSG(strstr(out, "3 slot(s) for the job's 6 process(es)"), "got: %s", out);
    /* slots= after max_slots= on the line, and CRLF line ends, count as mpirun reads them: 6 slots, no refusal */
    REQUIRE(test_run(out, sizeof out, "printf 'one max_slots=8 slots=6\\r\\n' > %s", hf) == 0);
    CHECK(test_run(out, sizeof out, "CUDA_VISIBLE_DEVICES=0,1,2,3,4 %s run %s --hostfile %s 2>&1 >/dev/null", bin, base,
                   hf) == 0);
    CHECK_MSG(strstr(out, "GPU assignment (the devices CUDA_VISIBLE_DEVICES names; a GPU per process)"), "got: %s",
              out);
    /* a folder is not read as an empty hostfile */
    CHECK(test_run(out, sizeof out, "%s run %s --hostfile %s 2>&1", bin, base, dir) == 1);
    CHECK_MSG(strstr(out, "--hostfile") && strstr(out, "Is a directory") && !strstr(out, "no host in it"), "got: %s",
              out);
}

/* An MPI launch of two simulated nodes on this host (VGRPO_NODE by world rank, in the srun form: roles from rank
 * ranges) on the emulated device: the trainer ranks on node a take GPUs 0 and 1, the workers on node b GPUs 0 and 1
 * of theirs (not 2 and 3), each logging its node; a node with more processes than parallel.gpus lists ends the job
 * at start-up naming it. */
static int mpi_two_nodes(char *out, size_t cap, const char *dir, const char *name, int on_a, const char *extra) {
    return test_run(out, cap,
                    "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                    "OMPI_MCA_btl_vader_single_copy_mechanism=none VGRPO_EMULATE_DEVICE=1 OMP_NUM_THREADS=1 timeout 300 "
                    "mpirun --oversubscribe --bind-to none --mca btl self,vader --mca pml ob1 --mca oob_tcp_if_include "
                    "lo -np 5 sh -c 'if [ $OMPI_COMM_WORLD_RANK -lt %d ]; then export VGRPO_NODE=a; else export "
                    "VGRPO_NODE=b; fi; exec %s mpi-rank recipes/tiny-cpu.yaml --set mode=colocated "
                    "--set model.device=cuda --set model.path=%s/model --set rollout.num_steps=4 "
                    "--set parallel.trainer_ranks=2 --set parallel.rollout_workers=2 --steps 1 "
                    "--set logging.run_dir=%s/%s %s' 2>&1",
                    on_a, test_vgrpo_bin(), dir, dir, name, extra);
}

TEST(gpu_assign_mpi_two_nodes) {
    if (access("/usr/bin/mpirun", X_OK)) {
        test_skip("no /usr/bin/mpirun");
        return;
    }
    const char *dir = test_tmpdir();
    static char out[65536];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 1 >/dev/null",
                     test_vgrpo_bin(), dir) == 0);
    int rc = mpi_two_nodes(out, sizeof out, dir, "ok", 2, "");
    CHECK_MSG(rc == 0, "two-node run: %s", out);
    CHECK_MSG(strstr(out, "trainer rank 0: model.device cuda on GPU 0 of node a, its trainer rank 0 there") &&
                  strstr(out, "trainer rank 1: model.device cuda on GPU 1 of node a, its trainer rank 1 there"),
              "got: %s", out);
    CHECK(test_run(out, sizeof out, "cat %s/ok/logs/worker-*.log", dir) == 0);
    CHECK_MSG(strstr(out, "rollout worker 0: model.device cuda on GPU 0 of node b, its rollout worker 0 there") &&
                  strstr(out, "rollout worker 1: model.device cuda on GPU 1 of node b, its rollout worker 1 there"),
              "got: %s", out);
    /* node a: 2 trainer ranks and worker 0 on the 2 GPUs parallel.gpus lists */
    rc = mpi_two_nodes(out, sizeof out, dir, "bad", 3, "--set parallel.gpus=[0,1]");
    CHECK_MSG(rc != 0 && strstr(out, "node a (2 trainer rank(s), 1 rollout worker(s) on it): parallel.gpus: "
                                     "parallel.gpus lists 2 GPU(s) for 2 trainer rank(s) and 1 rollout worker(s) on "
                                     "separate GPUs (3 needed)"), "got: %s", out);
}
