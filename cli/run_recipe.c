/* cli/run_recipe.c — the recipe of `vgrpo run --resume DIR` given without RECIPE (see cli/run_recipe.h). */
#include "cli/run_recipe.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"

static int is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

int run_recorded_recipe(const char *resume, char *out, size_t cap) {
    char dir[4096], parent[4096];
    size_t n = strlen(resume);
    while (n > 1 && resume[n - 1] == '/') n--; /* "runs/x/" and "runs/x" name the same folder */
    if (n >= sizeof dir - 32) return core_error("--resume %s: path too long", resume);
    memcpy(dir, resume, n), dir[n] = 0;
    snprintf(out, cap, "%s/config.resolved.yaml", dir);
    if (is_file(out)) return 0;
    const char *slash = strrchr(dir, '/');
    if (slash == dir) snprintf(parent, sizeof parent, "/config.resolved.yaml");
    else if (slash) snprintf(parent, sizeof parent, "%.*s/config.resolved.yaml", (int)(slash - dir), dir);
    else snprintf(parent, sizeof parent, "config.resolved.yaml"); /* a checkpoint-N in the current folder */
    if (is_file(parent)) {
        snprintf(out, cap, "%s", parent);
        return 0;
    }
    return core_error("--resume %s without RECIPE: no recorded recipe at %s/config.resolved.yaml or %s; give the "
                      "run's recipe (with its --set values), or its RUN_DIR/config.resolved.yaml, as RECIPE",
                      resume, dir, parent);
}
