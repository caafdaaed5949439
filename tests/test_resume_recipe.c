/* tests/test_resume_recipe.c — `vgrpo run --resume DIR` without RECIPE (cli/run_recipe.h): the run's recorded
 * recipe (config.resolved.yaml of the run folder, or of a checkpoint-N's parent) with every --set of the first start,
 * so a run started with a dozen --set values resumes with none; it continues bit for bit as a straight run; --set
 * and --steps still apply on top; without a recorded recipe the error names where it looked. */
#include <string.h>

#include "tests/test.h"

/* The first start of a run into dir/<name>: many --set values, none of which the resume repeats. */
static int start(const char *dir, const char *name, const char *extra, char *out, size_t cap) {
    return test_run(out, cap,
                    "OMP_NUM_THREADS=2 %s run recipes/tiny-cpu.yaml --set model.path=%s/model --set "
                    "data.prompt_file=%s/prompts.txt --set data.eval_prompt_file=%s/prompts.txt --set "
                    "logging.run_dir=%s/%s --set model.text_encoder=word_embed --set model.decoder=latent_rgb --set "
                    "rollout.num_steps=4 --set rollout.prompts_per_step=2 --set rollout.samples_per_prompt=4 --set "
                    "data.eval_samples_per_prompt=1 --set logging.eval_every=2 --set optim.total_steps=4 --set "
                    "algorithm.beta=0.05 --set optim.lr=0.0007 --set checkpoint.every=2 %s",
                    test_vgrpo_bin(), dir, dir, dir, dir, name, extra);
}

TEST(resume_without_recipe_takes_the_recorded_one) {
    const char *dir = test_tmpdir();
    char out[16384];
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 2 >/dev/null && "
                                      "printf 'a red kite\\na green frog\\na blue boat\\n' > %s/prompts.txt",
                     test_vgrpo_bin(), dir, dir) == 0);
    int rc = start(dir, "a", "--steps 2", out, sizeof out);
    CHECK_MSG(rc == 0, "first start: status %d: %s", rc, out);
    rc = start(dir, "b", "", out, sizeof out);
    CHECK_MSG(rc == 0, "straight run: status %d: %s", rc, out);
    /* the recipe alone, without the first start's --set values, is another run: refused */
    rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --resume %s/a", test_vgrpo_bin(), dir);
    CHECK_MSG(rc == 1, "the recipe without its --set values: status %d: %s", rc, out);
    /* a checkpoint-N: its parent's recorded recipe; --steps on top */
    rc = test_run(out, sizeof out, "OMP_NUM_THREADS=2 %s run --resume %s/a/checkpoint-2 --steps 3", test_vgrpo_bin(),
                  dir);
    CHECK_MSG(rc == 0 && strstr(out, "the run's recorded recipe") && strstr(out, "/a/config.resolved.yaml") &&
                  strstr(out, "resumed from") && strstr(out, "checkpoint-2: step 2"),
              "--resume checkpoint-2: status %d: %s", rc, out);
    /* the run folder (its latest checkpoint, 3), --set on top of the recorded recipe (a key resume lets change) */
    rc = test_run(out, sizeof out, "OMP_NUM_THREADS=2 %s run --resume %s/a/ --set checkpoint.total_limit=5",
                  test_vgrpo_bin(), dir);
    CHECK_MSG(rc == 0 && strstr(out, "resumed from") && strstr(out, "checkpoint-3: step 3"),
              "--resume a/: status %d: %s", rc, out);
    /* ... and it ends where the straight run ended, byte for byte */
    const char *files[] = {"transformer/diffusion_pytorch_model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++)
        CHECK_MSG(test_run(out, sizeof out, "cmp %s/a/checkpoint-4/%s %s/b/checkpoint-4/%s", dir, files[i], dir,
                           files[i]) == 0,
                  "%s differs from the straight run's: %s", files[i], out);
    CHECK_MSG(test_run(out, sizeof out, "grep -q 'lr: 0.0007' %s/a/config.resolved.yaml", dir) == 0,
              "the recorded recipe lost optim.lr");
    /* no recorded recipe: the error names both places */
    rc = test_run(out, sizeof out, "%s run --resume %s/model", test_vgrpo_bin(), dir);
    CHECK_MSG(rc == 1 && strstr(out, "without RECIPE") && strstr(out, "/model/config.resolved.yaml") &&
                  strstr(out, "as RECIPE"),
              "status %d: %s", rc, out);
}

/* `--dry-run --resume DIR` checks what the resume would check before any weight is read: the recipe against the
 * checkpoint's (an nft run resumed as dpo or grpo is refused naming algorithm.loss), and that DIR holds a checkpoint;
 * a matching recipe says which checkpoint the run would continue from. */
TEST(resume_dry_run_checks_the_checkpoint_recipe) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[16384], sets[1024];
    snprintf(sets, sizeof sets,
             "--set model.path=%s/model --set model.text_encoder=word_embed --set model.decoder=latent_rgb --set "
             "rollout.num_steps=4 --set algorithm.timestep_selection=\"random_k 3\" --set "
             "rollout.samples_per_prompt=4 --set logging.eval_every=0 --set data.eval_samples_per_prompt=1 --set "
             "checkpoint.every=1 --set logging.run_dir=%s/nft",
             dir, dir);
    REQUIRE(test_run(out, sizeof out, "%s init-model --preset tiny --out %s/model --seed 2 >/dev/null", bin, dir) == 0);
    int rc = test_run(out, sizeof out, "OMP_NUM_THREADS=2 %s run recipes/tiny-cpu-nft.yaml %s --steps 2 2>&1", bin, sets);
    CHECK_MSG(rc == 0, "nft run: status %d: %s", rc, out);
    REQUIRE(rc == 0);
    rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-dpo.yaml %s --resume %s/nft --dry-run 2>&1", bin, sets, dir);
    CHECK_MSG(rc == 1 && strstr(out, "the recipe differs from the checkpoint's") &&
                  strstr(out, "algorithm.loss (checkpoint nft, now dpo)") && strstr(out, "nft/checkpoint-2"),
              "dpo over nft: status %d: %s", rc, out);
    rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --set algorithm.loss=grpo --set rollout.eta=1 "
                  "--resume %s/nft/checkpoint-1 --dry-run 2>&1", bin, sets, dir);
    CHECK_MSG(rc == 1 && strstr(out, "algorithm.loss (checkpoint nft, now grpo)") && strstr(out, "nft/checkpoint-1"),
              "grpo over nft: status %d: %s", rc, out);
    rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --set optim.total_steps=9 --resume %s/nft "
                  "--dry-run 2>&1", bin, sets, dir);
    CHECK_MSG(rc == 0 && strstr(out, "--resume: would continue from") && strstr(out, "nft/checkpoint-2: step 2"),
              "same recipe: status %d: %s", rc, out);
    rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --resume %s/model --dry-run 2>&1", bin, sets, dir);
    CHECK_MSG(rc == 1 && strstr(out, "no complete checkpoint"), "not a run folder: status %d: %s", rc, out);
    /* a colocated resume with another recipe is refused by `vgrpo run` itself, naming the key, before it starts the
     * job's processes (not in a trainer's log under MPI_ABORT, the run saying only that mpirun exited) */
    rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu-nft.yaml %s --set mode=colocated --set algorithm.loss=dpo "
                  "--resume %s/nft 2>&1", bin, sets, dir);
    CHECK_MSG(rc == 1 && strstr(out, "vgrpo run: --resume: ") && strstr(out, "algorithm.loss (checkpoint nft, now dpo)") &&
                  !strstr(out, "MPI_ABORT") && !strstr(out, "exited with status"),
              "colocated: status %d: %s", rc, out);
}
