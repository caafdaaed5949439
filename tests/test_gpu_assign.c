/* tests/test_gpu_assign.c — which GPU each process of a job uses (core/gpu_assign.h): the plans (a GPU per process,
 * shared in turns, the local process, parallel.gpus and the visible devices), every refusal with the key it names,
 * `vgrpo run --dry-run`'s table, and the processes of an emulated-device job logging their GPU at start-up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    REQUIRE_OK(load(&r, "mode=colocated", "parallel.gpus=[-1]", NULL, NULL));
    CHECK(core_gpu_plan_make(&r, -1, &p) == -1 && strstr(core_last_error(), "parallel.gpus.0: GPU -1 is out of range"));
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
