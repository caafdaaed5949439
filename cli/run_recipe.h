/* cli/run_recipe.h — the recipe of `vgrpo run --resume DIR` given without RECIPE: the run's recorded one. */
#ifndef CLI_RUN_RECIPE_H
#define CLI_RUN_RECIPE_H

#include <stddef.h>

/* The recipe a run recorded for `vgrpo run --resume DIR` with no RECIPE: DIR/config.resolved.yaml (DIR a run folder),
 * else the one in DIR's parent folder (DIR a checkpoint-N of logging.run_dir). That file is the resolved recipe of
 * the run's last start (every key, defaults and --set values included; trainer/run/run_files.c writes it), so resuming
 * from it needs no --set again; the resume still checks it against the checkpoint's recorded recipe. Writes the
 * path into out (cap bytes): 0, or -1 with core_error naming both places looked at (a run whose checkpoint.dir is
 * elsewhere: give its RUN_DIR/config.resolved.yaml as RECIPE). */
int run_recorded_recipe(const char *resume, char *out, size_t cap);

#endif
