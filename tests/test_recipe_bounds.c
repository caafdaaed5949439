/* tests/test_recipe_bounds.c — recipe keys whose extreme values only overflow are bounded where the recipe is read
 * (core/recipe.c), with an error naming the key: rollout.shift below 1e-3 (1e-30 gave "flow step: sigma inf" at the
 * first step, naming no option), optim.eps below 1e-30 (0 in the fp32 update: 0/0 where a gradient is 0) and
 * optim.lr x optim.weight_decay over 1 (the decay factor 1 - lr x wd flips the weights' sign; 1e39 gave inf). Each
 * bound's edge is accepted, and `vgrpo run --dry-run` refuses the values that failed. */
#include <stdio.h>
#include <string.h>

#include "core/recipe.h"
#include "tests/test.h"

/* core_recipe_load of recipes/tiny-cpu.yaml with one or two --set values: 0, or -1 with the error. */
static int load2(const char *a, const char *b) {
    const char *sets[2] = {a, b};
    core_recipe r;
    const int rc = core_recipe_load(&r, "recipes/tiny-cpu.yaml", sets, b ? 2 : 1);
    core_recipe_release(&r);
    return rc;
}

#define CHECK_REFUSED(a, b, want)                                                                                  \
    do {                                                                                                           \
        CHECK_MSG(load2(a, b) == -1, "%s %s accepted", a, b ? b : "");                                             \
        CHECK_MSG(strstr(core_last_error(), want), "%s: error \"%s\" lacks \"%s\"", a, core_last_error(), want); \
    } while (0)

#define CHECK_ACCEPTED(a, b) CHECK_MSG(load2(a, b) == 0, "%s %s: %s", a, b ? b : "", core_last_error())

TEST(recipe_bounds_overflowing_keys) {
    CHECK_REFUSED("rollout.shift=1e-30", NULL, "rollout.shift: must be >= 0.001, got 1e-30");
    CHECK_REFUSED("rollout.shift=0.000999", NULL, "rollout.shift: must be >= 0.001");
    CHECK_REFUSED("rollout.shift=1001", NULL, "rollout.shift: must be <= 1000");
    CHECK_ACCEPTED("rollout.shift=1e-3", NULL);
    CHECK_ACCEPTED("rollout.shift=1000", NULL);
    CHECK_REFUSED("optim.eps=1e-40", NULL, "optim.eps: must be >= 1e-30, got 1e-40");
    CHECK_REFUSED("optim.eps=0", NULL, "optim.eps: must be >=");
    CHECK_ACCEPTED("optim.eps=1e-30", NULL);
    CHECK_REFUSED("optim.weight_decay=1e39", NULL, "optim.weight_decay: 1e+39 x optim.lr 0.0005 = 5e+35, over 1");
    CHECK_REFUSED("optim.weight_decay=.inf", NULL, "optim.weight_decay: inf x optim.lr");
    CHECK_REFUSED("optim.weight_decay=-0.1", NULL, "optim.weight_decay: must be >= 0");
    CHECK_REFUSED("optim.weight_decay=2.5", "optim.lr=1", "over 1");
    CHECK_ACCEPTED("optim.weight_decay=2", "optim.lr=0.5"); /* factor 0: finite */
    CHECK_ACCEPTED("optim.weight_decay=0.01", NULL);
    CHECK_ACCEPTED("optim.weight_decay=1000", "optim.lr=1e-4");
    /* the command line: refused at --dry-run naming the key (was "sigma inf" at step 0) */
    char out[8192];
    int rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set rollout.shift=1e-30 2>&1",
                      test_vgrpo_bin());
    CHECK_MSG(rc == 1 && strstr(out, "rollout.shift: must be >= 0.001"), "exit %d: %s", rc, out);
    rc = test_run(out, sizeof out, "%s run recipes/tiny-cpu.yaml --dry-run --set optim.weight_decay=1e39 2>&1",
                  test_vgrpo_bin());
    CHECK_MSG(rc == 1 && strstr(out, "optim.weight_decay: 1e+39 x optim.lr"), "exit %d: %s", rc, out);
}
