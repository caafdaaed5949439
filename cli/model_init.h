/* cli/model_init.h — model.init_preset: write a preset's pipeline on first use; the model.device refusal
 * (cli/model_init.c). */
#ifndef CLI_MODEL_INIT_H
#define CLI_MODEL_INIT_H

#include "core/recipe.h"

/* Refuses model.device cuda with one line where it cannot run (no CUDA backend or no GPU: k_cuda_available's reason;
 * not under the tests' emulated device, model/dit/wan_dev_exec.h). Then, when model.path has no model_index.json and
 * the recipe names a preset, writes the preset's pipeline there (vgrpo init-model --seed 0). 0, or -1 with an
 * error. */
int ensure_model(const core_recipe *r);

#endif
