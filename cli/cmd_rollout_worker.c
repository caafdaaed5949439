/* cli/cmd_rollout_worker.c — `vgrpo rollout-worker RECIPE --controller EP --reward EP --id NAME [--transformer DIR]
 * [--set key=value ...]`: loads the recipe's rollout pipeline (rollout/pipeline.h) and serves the controller
 * (rollout/worker.h) until `shutdown` (exit 0) or SIGTERM/SIGINT (exit 1: a worker stops cleanly only when asked). Jobs (`vgrpo eval`, `vgrpo run`) start workers
 * themselves; running one by hand is for debugging. Exit status 0, 1 on failure, 2 on a usage error. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/recipe.h"
#include "rollout/worker.h"

static volatile sig_atomic_t stop_flag = 0;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: vgrpo rollout-worker RECIPE --controller ENDPOINT --reward ENDPOINT --id NAME\n"
               "                            [--transformer DIR] [--set key.path=value ...] [--idle-exit S]\n"
               "  --controller   the controller's ROUTER endpoint (ipc://PATH or tcp://HOST:PORT)\n"
               "  --reward       the reward server's endpoint\n"
               "  --id           this worker's client id (e.g. worker-0)\n"
               "  --transformer  weights folder instead of model.path/transformer (a checkpoint's transformer/)\n"
               "  --idle-exit    exit after S seconds without a controller message (default 0: never)\n");
}

int cmd_rollout_worker(int argc, char **argv) {
    const char *path = NULL, *transformer = NULL;
    rollout_worker_config cfg = {.fps = 16.0};
    const char **sets = calloc((size_t)argc, sizeof(char *));
    int n_sets = 0;
    if (!sets) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            free(sets);
            return 0;
        } else if (a[0] != '-' && !path) {
            path = a;
        } else if (i + 1 < argc && !strcmp(a, "--controller")) {
            cfg.controller = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--reward")) {
            cfg.reward = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--id")) {
            cfg.id = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--transformer")) {
            transformer = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--set")) {
            sets[n_sets++] = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--idle-exit")) {
            cfg.idle_exit_s = atof(argv[++i]);
        } else {
            fprintf(stderr, "rollout-worker: unknown or incomplete option \"%s\"\n\n", a);
            usage(stderr);
            free(sets);
            return 2;
        }
    }
    if (!path || !cfg.controller || !cfg.reward || !cfg.id) {
        fprintf(stderr, "rollout-worker: RECIPE, --controller, --reward and --id are required\n\n");
        usage(stderr);
        free(sets);
        return 2;
    }
    core_recipe r;
    rollout_pipeline p;
    memset(&p, 0, sizeof p);
    int status = 1;
    if (core_recipe_load(&r, path, sets, n_sets) || rollout_pipeline_load(&p, &r, transformer)) {
        fprintf(stderr, "rollout-worker %s: %s\n", cfg.id, core_last_error());
    } else {
        cfg.reward_timeout_s = r.reward_timeout_s;
        cfg.reward_max_attempts = r.reward_max_attempts;
        signal(SIGTERM, on_signal);
        signal(SIGINT, on_signal);
        if (rollout_worker_run(&p, &cfg, &stop_flag)) fprintf(stderr, "rollout-worker %s: %s\n", cfg.id, core_last_error());
        else if (stop_flag) fprintf(stderr, "rollout-worker %s: stopped by a signal\n", cfg.id); /* exit 1: not asked to */
        else status = 0;
    }
    rollout_pipeline_free(&p);
    core_recipe_release(&r);
    free(sets);
    return status;
}
