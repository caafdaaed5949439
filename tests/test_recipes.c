/* tests/test_recipes.c — the shipped recipes (every .yaml in recipes/) and the recipe checks of `vgrpo run --dry-run`
 * (docs/design.md section 7). Checks: every recipe in recipes/ passes --dry-run without weights on disk, and its resolved
 * render equals the committed tests/fixtures/recipes/NAME.resolved.yaml (and every fixture has its recipe); a
 * colocated recipe's `run` is refused with a plain "not implemented yet"; each bad value (group size, clip range,
 * boundary ratio, step count, frames, H/W vs the VAE factor x patch, timestep selection, scorer name, parallel
 * degrees, local-mode limits) is refused with its key named in the error. No model runs: each case is one process
 * that reads the recipe and its prompt files.
 *
 * After an intended change of a recipe or of the recipe schema, regenerate the fixtures from the repository root:
 *   for f in recipes/?*.yaml; do n=$(basename "$f" .yaml);
 *     build/vgrpo run "$f" --dry-run > "tests/fixtures/recipes/$n.resolved.yaml"; done
 * and review the diff. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/test.h"

#define MAX_RECIPES 64

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Names (without .yaml) of the files in dir ending in suffix, sorted; returns the count. */
static int list_names(const char *dir, const char *suffix, char **names, int cap) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    const size_t ls = strlen(suffix);
    for (struct dirent *e; (e = readdir(d)) && n < cap;) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] == '.' || l <= ls || strcmp(e->d_name + l - ls, suffix)) continue;
        names[n] = strndup(e->d_name, l - ls);
        if (names[n]) n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_names);
    return n;
}

TEST(recipes_dry_run_match_fixtures) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char *names[MAX_RECIPES], out[16384];
    int n = list_names("recipes", ".yaml", names, MAX_RECIPES);
    CHECK_MSG(n >= 4, "recipes/: %d recipes found (tiny-cpu and the three Wan recipes expected)", n);
    REQUIRE(n >= 1);
    const char *want[] = {"tiny-cpu", "wan2.1-t2v-1.3b", "wan2.2-t2v-a14b", "wan2.2-ti2v-5b"};
    for (int w = 0; w < 4; w++) {
        int found = 0;
        for (int i = 0; i < n; i++) found |= !strcmp(names[i], want[w]);
        CHECK_MSG(found, "recipes/%s.yaml is missing", want[w]);
    }
    for (int i = 0; i < n; i++) {
        /* no weights on disk: a model path that does not exist still passes the dry run */
        int rc = test_run(out, sizeof out, "%s run recipes/%s.yaml --dry-run --set model.path=%s/no-model > %s/%s.nomodel",
                          bin, names[i], dir, dir, names[i]);
        CHECK_MSG(rc == 0, "recipes/%s.yaml --dry-run without weights: exit %d: %s", names[i], rc, out);
        rc = test_run(out, sizeof out, "%s run recipes/%s.yaml --dry-run > %s/%s.out", bin, names[i], dir, names[i]);
        CHECK_MSG(rc == 0, "recipes/%s.yaml --dry-run: exit %d: %s", names[i], rc, out);
        if (rc) continue;
        rc = test_run(out, sizeof out, "diff -u tests/fixtures/recipes/%s.resolved.yaml %s/%s.out", names[i], dir, names[i]);
        CHECK_MSG(rc == 0, "recipes/%s.yaml resolves differently from tests/fixtures/recipes/%s.resolved.yaml "
                           "(regenerate as the comment at the top of tests/test_recipes.c says if intended):\n%s",
                  names[i], names[i], out);
    }
    /* every fixture belongs to a recipe (a renamed or removed recipe leaves none behind) */
    char *fix[MAX_RECIPES];
    int nf = list_names("tests/fixtures/recipes", ".resolved.yaml", fix, MAX_RECIPES);
    CHECK_MSG(nf == n, "%d fixtures in tests/fixtures/recipes for %d recipes", nf, n);
    for (int i = 0; i < nf; i++) {
        char path[512];
        struct stat sb;
        snprintf(path, sizeof path, "recipes/%s.yaml", fix[i]);
        CHECK_MSG(stat(path, &sb) == 0, "tests/fixtures/recipes/%s.resolved.yaml has no recipe %s", fix[i], path);
        free(fix[i]);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    /* resolved values that come from other keys or from the model family */
    REQUIRE(test_run(out, sizeof out, "%s run recipes/wan2.1-t2v-1.3b.yaml --dry-run", bin) == 0);
    CHECK_MSG(strstr(out, "guidance_scale: 5.0\n  guidance_scale_2: 5.0\n") && strstr(out, "eval_eta: 0.0\n") &&
                  strstr(out, "vae_scale_factor_spatial: 8\n") && strstr(out, "mode: colocated\n"),
              "got: %s", out);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/wan2.2-t2v-a14b.yaml --dry-run", bin) == 0);
    CHECK_MSG(strstr(out, "boundary_ratio: 0.875\n") && strstr(out, "guidance_scale: 4.0\n  guidance_scale_2: 3.0\n") &&
                  strstr(out, "timestep_selection: from_range 0 8 4\n"),
              "got: %s", out);
    REQUIRE(test_run(out, sizeof out, "%s run recipes/wan2.2-ti2v-5b.yaml --dry-run", bin) == 0);
    CHECK_MSG(strstr(out, "vae_scale_factor_spatial: 16\n") && strstr(out, "height: 480\n  width: 832\n"), "got: %s", out);
}

TEST(recipes_colocated_run_refused) {
    const char *dir = test_tmpdir(), *bin = test_vgrpo_bin();
    char out[8192];
    const char *rs[] = {"wan2.1-t2v-1.3b", "wan2.2-ti2v-5b", "wan2.2-t2v-a14b"};
    for (int i = 0; i < 3; i++) {
        CHECK(test_run(out, sizeof out, "%s run recipes/%s.yaml --set logging.run_dir=%s/r%d", bin, rs[i], dir, i) == 1);
        /* a model.device cuda recipe (wan2.1-t2v-1.3b) is refused by this CPU build; a CPU one at full size too */
        CHECK_MSG(strstr(out, "CUDA backend") &&
                      ((strstr(out, "no GPU") && strstr(out, "--dry-run")) || strstr(out, "built without the CUDA backend")),
                  "%s: got: %s", rs[i], out);
    }
    /* nothing was written for a refused run */
    struct stat sb;
    char path[700];
    snprintf(path, sizeof path, "%s/r0", dir);
    CHECK(stat(path, &sb) != 0);
    /* a local run refuses a missing model folder, naming model.path (after the checks that need no weights) */
    CHECK(test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --set model.path=%s/none --set model.init_preset= --set logging.run_dir=%s/l",
                   bin, dir, dir) == 1);
    CHECK_MSG(strstr(out, "model.path") && strstr(out, "does not exist"), "got: %s", out);
}

/* One bad value: the recipe, the --set arguments, and the text the error must contain (the key). */
typedef struct {
    const char *recipe, *sets, *want;
} bad_case;

#define W13 "recipes/wan2.1-t2v-1.3b.yaml"
#define W5 "recipes/wan2.2-ti2v-5b.yaml"
#define A14 "recipes/wan2.2-t2v-a14b.yaml"
#define TINY "recipes/tiny-cpu.yaml"

static const bad_case bad_cases[] = {
    /* group size: a group of one has advantage 0 and never trains, so G >= 2 */
    {W13, "--set rollout.samples_per_prompt=1", "rollout.samples_per_prompt"},
    {W13, "--set rollout.samples_per_prompt=0", "rollout.samples_per_prompt"},
    /* PPO clip range must be > 0 */
    {W13, "--set algorithm.clip_range=0", "algorithm.clip_range"},
    {W13, "--set algorithm.clip_range=-1e-4", "algorithm.clip_range"},
    /* expert boundary in (0, 1) */
    {A14, "--set model.boundary_ratio=0", "model.boundary_ratio"},
    {A14, "--set model.boundary_ratio=1", "model.boundary_ratio"},
    {A14, "--set model.boundary_ratio=1.5", "model.boundary_ratio"},
    /* at least 2 denoising steps */
    {W13, "--set rollout.num_steps=1", "rollout.num_steps"},
    {W13, "--set rollout.num_steps=0", "rollout.num_steps"},
    /* frames 4k+1 */
    {W13, "--set rollout.frames=32", "rollout.frames"},
    {W5, "--set rollout.frames=35", "rollout.frames"},
    /* H, W multiples of VAE factor x patch: 16 for the Wan 2.1 VAE, 32 for the Wan 2.2 VAE of the 5B */
    {W13, "--set rollout.height=472", "rollout.height"},
    {W13, "--set rollout.width=840", "rollout.width"},
    {A14, "--set rollout.width=824", "rollout.width"},
    {W5, "--set rollout.height=496", "rollout.height: must be a multiple of 32"},
    {W5, "--set rollout.width=848", "rollout.width: must be a multiple of 32"},
    {W13, "--set model.vae_scale_factor_spatial=12", "model.vae_scale_factor_spatial"},
    {W13, "--set model.vae_scale_factor_spatial=4", "model.vae_scale_factor_spatial"},
    /* timestep selection that selects nothing or is out of range for 10 steps */
    {W13, "--set \"algorithm.timestep_selection=first_fraction 0.05\"", "algorithm.timestep_selection"},
    {W13, "--set \"algorithm.timestep_selection=first_fraction 1.5\"", "algorithm.timestep_selection"},
    {W13, "--set \"algorithm.timestep_selection=random_k 0\"", "algorithm.timestep_selection"},
    {W13, "--set \"algorithm.timestep_selection=random_k 11\"", "algorithm.timestep_selection"},
    {A14, "--set \"algorithm.timestep_selection=from_range 3 10 2\"", "algorithm.timestep_selection"},
    {A14, "--set \"algorithm.timestep_selection=from_range 5 3 1\"", "algorithm.timestep_selection"},
    {W13, "--set \"algorithm.timestep_selection=sometimes\"", "algorithm.timestep_selection"},
    /* scorer names */
    {W13, "--set \"reward.scorers=[color_match, aesthetics]\"", "reward.scorers"},
    /* parallel degrees: sp divides trainer_ranks, ulysses divides sp, sp divides the token count */
    {W13, "--set parallel.sp=3", "parallel.sp: 3 does not divide parallel.trainer_ranks 8"},
    {A14, "--set parallel.ulysses_degree=3", "parallel.ulysses_degree: 3 does not divide parallel.sp 8"},
    {W13, "--set parallel.sp=8 --set rollout.height=496", "parallel.sp: 8 does not divide the video's 14508 tokens"},
    /* local mode: every degree 1, the factor-8 decoders */
    {TINY, "--set parallel.trainer_ranks=2", "parallel.trainer_ranks"},
    {TINY, "--set parallel.sp=2", "parallel.sp"},
    {TINY, "--set parallel.ulysses_degree=2", "parallel.ulysses_degree"},
    {TINY, "--set parallel.rollout_workers=2", "parallel.rollout_workers"},
    {TINY, "--set model.vae_scale_factor_spatial=16", "model.vae_scale_factor_spatial"},
    /* more prompts per step than the prompt file holds */
    {W13, "--set rollout.prompts_per_step=49", "rollout.prompts_per_step"},
};

TEST(recipes_bad_values_named) {
    const char *bin = test_vgrpo_bin();
    char out[8192];
    for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; i++) {
        const bad_case *c = &bad_cases[i];
        int rc = test_run(out, sizeof out, "%s run %s --dry-run %s", bin, c->recipe, c->sets);
        CHECK_MSG(rc == 1, "%s %s: exit %d (want 1): %s", c->recipe, c->sets, rc, out);
        CHECK_MSG(strstr(out, c->want) != NULL, "%s %s: error lacks \"%s\": %s", c->recipe, c->sets, c->want, out);
    }
    /* the same values one step inside the limits pass (the table's refusals are the limits, not the recipes) */
    const char *ok[][2] = {
        {W13, "--set rollout.samples_per_prompt=2 --set rollout.num_steps=2 --set \"algorithm.timestep_selection=all\""},
        {A14, "--set model.boundary_ratio=0.5 --set rollout.frames=5 --set rollout.width=816 --set parallel.sp=4 "
              "--set parallel.ulysses_degree=4"},
        {W5, "--set rollout.height=512 --set rollout.width=864"},
        {W13, "--set \"algorithm.timestep_selection=first_fraction 0.1\" --set parallel.sp=8 --set rollout.prompts_per_step=48"},
        {A14, "--set \"algorithm.timestep_selection=from_range 9 9 1\" --set parallel.sp=2 --set parallel.ulysses_degree=1"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        int rc = test_run(out, sizeof out, "%s run %s --dry-run %s", bin, ok[i][0], ok[i][1]);
        CHECK_MSG(rc == 0, "%s %s: exit %d (want 0): %s", ok[i][0], ok[i][1], rc, out);
    }
}

/* The many-GPU recipes (model.device cuda, several trainer ranks): valid without weights, and each fitting the card its
 * header names (an 80 GB H100; the TI2V-5B's full fine-tuning a 141 GB H200 only) by the device estimate the trainer checks at start-up: the dry run's "per GPU" line (a trainer rank and
 * a rollout worker together where they share a GPU, else the larger), and the trainer rank's and the worker's own
 * totals. The figures are the ones quoted in the headers and in recipes/README.md "Many GPUs". */
TEST(recipes_many_gpu_fit) {
    static const struct {
        const char *name;
        int ranks, sp, ulysses, workers, share, zero;
        double per_gpu; /* GiB, as printed */
        int h200;       /* the card the header names: 0 an 80 GB H100, 1 a 141 GB H200 (and not an H100) */
    } rs[] = {
        {"wan2.1-t2v-1.3b", 8, 1, 1, 8, 1, 1, 67.04, 0},
        {"wan2.1-t2v-1.3b-lora", 8, 1, 1, 8, 1, 1, 51.89, 0},
        {"wan2.2-t2v-a14b-lora", 4, 4, 4, 4, 0, 1, 75.75, 0},
        {"wan2.2-t2v-a14b-lora-16gpu", 8, 4, 4, 8, 0, 1, 75.21, 0},
        {"wan2.2-t2v-a14b-lora-81f", 8, 8, 4, 8, 0, 1, 76.72, 0},
        {"wan2.2-ti2v-5b", 8, 1, 1, 8, 1, 1, 117.65, 1},
        {"wan2.2-t2v-a14b", 8, 8, 8, 8, 0, 3, 132.81, 1}, /* full: the expert window (trainer/dp/dp_dev.h) */
        {"wan2.2-i2v-a14b", 8, 8, 8, 8, 0, 3, 132.84, 1},
    };
    static char out[1 << 16];
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        const int st = test_run(out, sizeof out, "%s run recipes/%s.yaml --dry-run 2>&1", test_vgrpo_bin(), rs[i].name);
        CHECK_MSG(st == 0, "%s: --dry-run failed: %.2000s", rs[i].name, out);
        char want[256];
        snprintf(want, sizeof want, "device: cuda\n");
        CHECK_MSG(strstr(out, want) && strstr(out, "mode: colocated\n"), "%s: not a colocated device recipe", rs[i].name);
        snprintf(want, sizeof want, "  trainer_ranks: %d\n  sp: %d\n  ulysses_degree: %d\n  rollout_workers: %d\n", rs[i].ranks,
                 rs[i].sp, rs[i].ulysses, rs[i].workers);
        CHECK_MSG(strstr(out, want) != NULL, "%s: want %s", rs[i].name, want);
        CHECK_MSG(strstr(out, rs[i].share ? "  share_gpus: true\n" : "  share_gpus: false\n"), "%s: share_gpus", rs[i].name);
        snprintf(want, sizeof want, "  zero_stage: %d\n", rs[i].zero);
        CHECK_MSG(strstr(out, want) && strstr(out, "  activations: checkpoint\n"), "%s", rs[i].name);
        /* the trainer rank's and the rollout worker's own totals each fit */
        const char *tr = strstr(out, "  trainer rank, on its GPU:\n"), *wk = strstr(out, "  rollout worker, on its GPU:\n");
        REQUIRE(tr && wk);
        const char *tt = strstr(tr, "    total "), *wt = strstr(wk, "    total ");
        REQUIRE(tt && wt);
        const double gt = atof(tt + strspn(tt, " total")), gw = atof(wt + strspn(wt, " total"));
        const double cap = rs[i].h200 ? 140.40 : 79.65;
        CHECK_MSG(gt > 10.0 && gt < cap && gw > 10.0 && gw < cap, "%s: trainer %.2f, worker %.2f GiB", rs[i].name, gt, gw);
        /* the per-GPU line: the figure quoted, and it fits an 80 GB H100 */
        const char *pg = strstr(out, "  per GPU (");
        REQUIRE(pg);
        const char *eol = strchr(pg, '\n');
        const char *colon = strstr(pg, "): ");
        REQUIRE(eol && colon && colon < eol);
        const double gib = atof(colon + 3);
        printf("  %s: per GPU %.2f GiB (trainer rank %.2f, rollout worker %.2f)\n", rs[i].name, gib, gt, gw);
        CHECK_MSG(gib > rs[i].per_gpu - 0.005 && gib < rs[i].per_gpu + 0.005, "%s: per GPU %.2f GiB, quoted %.2f", rs[i].name,
                  gib, rs[i].per_gpu);
        const char *fit = strstr(pg, rs[i].h200 ? ": does NOT fit on an 80 GB H100, fits on a 141 GB H200"
                                                : ": fits on an 80 GB H100");
        CHECK_MSG(fit && fit < eol, "%s: does not fit its card: %.*s", rs[i].name, (int)(eol - pg), pg);
        CHECK(gib < cap);
    }
    /* full fine-tuning of the A14B: without the expert window (ZeRO stage 2, or stage 3 with one expert trained under
     * nft, whose accumulation has no expert phases) no card holds a trainer rank; with it, 16 ranks need the figure the
     * recipe's header quotes, an H200's */
    const struct {
        const char *sets, *fit;
        double gib;
    } fa[3] = {{"--set parallel.zero_stage=2", "does NOT fit on a 141 GB H200 (", 314.46},
               {"--set algorithm.loss=nft", "does NOT fit on a 141 GB H200 (", 0},
               {"--set parallel.trainer_ranks=16", ", fits on a 141 GB H200 (", 111.98}};
    for (int i = 0; i < 3; i++) {
        const int st = test_run(out, sizeof out, "%s run recipes/wan2.2-t2v-a14b.yaml --dry-run %s 2>&1",
                                test_vgrpo_bin(), fa[i].sets);
        CHECK_MSG(st == 0, "%.2000s", out);
        const char *tr = strstr(out, "  trainer rank, on its GPU:\n");
        const char *tt = tr ? strstr(tr, "    total ") : NULL;
        REQUIRE(tt);
        const double g = atof(tt + strspn(tt, " total"));
        const char *eol = strchr(tt, '\n'), *f1 = strstr(tt, fa[i].fit), *f0 = strstr(tt, "does NOT fit on an 80 GB H100 (");
        CHECK_MSG(eol && f1 && f1 < eol && f0 && f0 < eol, "%s: %.200s", fa[i].sets, tt);
        CHECK_MSG(fa[i].gib == 0 || (g > fa[i].gib - 0.005 && g < fa[i].gib + 0.005), "%s: %.2f GiB, quoted %.2f",
                  fa[i].sets, g, fa[i].gib);
        CHECK(!strstr(out, "one expert's window") == (i < 2));
    }
}

/* algorithm.train_experts at --dry-run without weights: the experts are the preset's (models/Wan2.2-T2V-A14B-Diffusers
 * names the two-expert A14B), as the estimate takes them, not "no transformer_2/ on disk". Freezing the high-noise
 * expert leaves steps 6-8 of the recipe's from_range 0 8 4: too few, named; from_range 6 8 3 is valid; a one-expert
 * preset still refuses transformer_2. */
TEST(recipes_train_experts_dry_run_preset) {
    const char *bin = test_vgrpo_bin();
    char out[1 << 16];
    CHECK(test_run(out, sizeof out, "%s run recipes/wan2.2-t2v-a14b.yaml --dry-run --set algorithm.train_experts=transformer 2>&1",
                   bin) == 0);
    CHECK(test_run(out, sizeof out, "%s run recipes/wan2.2-t2v-a14b.yaml --dry-run --set algorithm.train_experts=transformer_2 2>&1",
                   bin) == 1);
    CHECK_MSG(strstr(out, "freezes expert 0") && strstr(out, "only 3 of the candidates"), "got: %.2000s", out);
    CHECK(test_run(out, sizeof out,
                   "%s run recipes/wan2.2-t2v-a14b.yaml --dry-run --set algorithm.train_experts=transformer_2 "
                   "--set 'algorithm.timestep_selection=from_range 6 8 3' 2>&1",
                   bin) == 0);
    CHECK(test_run(out, sizeof out, "%s run recipes/wan2.1-t2v-1.3b.yaml --dry-run --set algorithm.train_experts=transformer_2 2>&1",
                   bin) == 1);
    CHECK_MSG(strstr(out, "algorithm.train_experts: transformer_2") && strstr(out, "has one expert"), "got: %.2000s", out);
}

/* The nft and dpo Wan recipes (and the GRPO one-GPU recipe they are compared with): the device estimate their headers
 * and recipes/README.md quote is the one `--dry-run` prints (a figure that drifts when the estimate changes fails
 * here, as recipes_many_gpu_fit does for the GRPO recipes). */
TEST(recipes_nft_dpo_quoted_estimates) {
    static const struct {
        const char *name, *printed, *header; /* the dry run's line; the header's quote (NULL: none) */
    } rs[] = {
        {"wan2.1-t2v-1.3b-1gpu", "    total                                              39.89 GiB", "(39.89 GiB of an 80 GB"},
        {"wan2.1-t2v-1.3b-nft-1gpu", "    total                                              34.57 GiB",
         "(34.57 GiB of an 80 GB"},
        {"wan2.1-t2v-1.3b-dpo-1gpu", "    total                                              34.57 GiB", NULL},
        {"wan2.2-ti2v-5b-nft", "share_gpus true): 102.12 GiB", "rollout worker 102.12 GiB"},
        {"wan2.2-ti2v-5b-nft", "    total                                              75.27 GiB", "trainer rank 75.27 GiB"},
        {"wan2.2-ti2v-5b-dpo", "share_gpus true): 102.12 GiB", NULL},
    };
    static char out[1 << 16];
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        const int st = test_run(out, sizeof out, "%s run recipes/%s.yaml --dry-run 2>&1", test_vgrpo_bin(), rs[i].name);
        CHECK_MSG(st == 0 && strstr(out, rs[i].printed), "%s: want \"%s\": %.3000s", rs[i].name, rs[i].printed, out);
        if (rs[i].header)
            CHECK_MSG(test_run(NULL, 0, "head -12 recipes/%s.yaml | tr -s '\\n#' '  ' | grep -qF '%s'", rs[i].name,
                               rs[i].header) == 0, "%s: the header does not quote \"%s\"", rs[i].name, rs[i].header);
    }
    /* recipes/README.md quotes them rounded */
    CHECK(test_run(NULL, 0, "grep -q '34.6 GiB, GRPO.s 39.9' recipes/README.md") == 0);
    CHECK(test_run(NULL, 0, "grep -q '75.3 GiB per trainer rank, 102.1 GiB per GPU' recipes/README.md") == 0);
    CHECK(test_run(NULL, 0, "grep -q '34.6 GiB on one H100 for the 1.3B, 75.3 GiB per trainer rank' recipes/README.md") ==
          0);
}
