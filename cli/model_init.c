/* cli/model_init.c — model.init_preset: a recipe that names a preset gets its pipeline written on first use, so
 * `vgrpo run/eval/parity recipes/tiny-cpu.yaml` works on a fresh clone; and model.device: the first step of every
 * job that runs the model, so where cuda cannot run (no CUDA backend in this build, no GPU), that is said before
 * anything is written. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/model_init.h"
#include "core/error.h"
#include "core/fs.h"
#include "kernels/kernels.h"
#include "model/dit/wan_dev_exec.h"

int ensure_model(const core_recipe *r) {
    if (r->choice.device == CORE_CUDA) { /* the emulated device (tests only: wan_dev_exec.h) needs none */
        char why[K_WHY_MAX];
        if (!wan_dev_exec_emulating() && !k_cuda_available(why)) return core_error("model.device: cuda: %s", why);
    }
    char idx[4200], parent[4200];
    snprintf(idx, sizeof idx, "%s/model_index.json", r->model_path);
    if (!r->init_preset || !access(idx, R_OK)) return 0;
    snprintf(parent, sizeof parent, "%s", r->model_path);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        if (core_mkdir_p(parent)) return -1;
    }
    printf("model.path %s has no pipeline: writing the %s preset there (model.init_preset; vgrpo init-model)\n",
           r->model_path, r->init_preset);
    fflush(stdout);
    char *argv[] = {"init-model", "--preset", r->init_preset, "--out", r->model_path, "--seed", "0", NULL};
    if (cmd_init_model(7, argv)) return core_error("model.init_preset: vgrpo init-model --preset %s --out %s failed",
                                                   r->init_preset, r->model_path);
    return 0;
}
