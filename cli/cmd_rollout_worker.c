/* cli/cmd_rollout_worker.c — `vgrpo rollout-worker RECIPE --controller EP --reward EP --id NAME [--transformer DIR]
 * [--adapter PATH] [--keys-fd N | --keys-file PATH] [--set key=value ...]`: loads the recipe's rollout pipeline
 * (rollout/pipeline.h; with model.lora or --adapter, LoRA adapters on its experts) and serves the controller
 * (rollout/worker.h) until `shutdown` (exit 0) or SIGTERM/SIGINT (exit 1: a worker stops cleanly only when asked). Jobs (`vgrpo eval`, `vgrpo run`) start workers
 * themselves; running one by hand is for debugging. Exit status 0, 1 on failure, 2 on a usage error. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/opts.h"
#include "core/curve.h"
#include "core/error.h"
#include "core/gpu_assign.h"
#include "core/log.h"
#include "core/recipe.h"
#include "rollout/worker.h"

static volatile sig_atomic_t stop_flag = 0;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

int cmd_rollout_worker(int argc, char **argv) {
    const char *path = NULL, *transformer = NULL, *adapter = NULL;
    rollout_worker_config cfg = {.fps = 16.0};
    int keys_fd = -1;
    const char *keys_file = NULL;
    opts_list sets = {.v = calloc((size_t)argc, sizeof(char *)), .cap = argc};
    if (!sets.v) return 1;
    const opts_spec opts[] = {
        {.name = "controller", .type = OPTS_STRING, .str = &cfg.controller, .required = 1, .meta = "ENDPOINT",
         .help = "the controller's ROUTER endpoint (ipc://PATH or tcp://HOST:PORT)"},
        {.name = "reward", .type = OPTS_STRING, .str = &cfg.reward, .required = 1, .meta = "ENDPOINT",
         .help = "the reward server's endpoint"},
        {.name = "id", .type = OPTS_STRING, .str = &cfg.id, .required = 1, .meta = "NAME",
         .help = "this worker's client id (e.g. worker-0)"},
        {.name = "transformer", .type = OPTS_STRING, .str = &transformer, .meta = "DIR",
         .help = "weights folder instead of model.path/transformer (a checkpoint's transformer/)"},
        {.name = "adapter", .type = OPTS_STRING, .str = &adapter, .meta = "PATH",
         .help = "LoRA adapter of transformer/ (a folder or file in diffusers' or peft's format, e.g. a LoRA\n"
                 "checkpoint's transformer/; PATH_2, when present, is transformer_2's) on the base weights;\n"
                 "replaces the adapters model.lora would make"},
        {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "key.path=value",
         .help = "override a recipe key (repeatable)"},
        {.name = "idle-exit", .type = OPTS_DOUBLE, .d = &cfg.idle_exit_s, .min = 0, .max = 1e9, .meta = "S",
         .help = "exit after S seconds without a controller message (default 0: never)"},
        {.name = "keys-fd", .type = OPTS_INT, .i = &keys_fd, .min = 0, .max = 1 << 20, .meta = "N",
         .help = "read the run's keys (core/curve.h) from inherited descriptor N"},
        {.name = "keys-file", .type = OPTS_STRING, .str = &keys_file, .meta = "PATH",
         .help = "read the run's keys from a file of mode 0600\n(neither: plain ZeroMQ, for debugging)"},
        {0}};
    const opts_pos pos[] = {{.name = "RECIPE", .dst = &path, .required = 1, .help = "the recipe YAML"}, {0}};
    const opts_cmd cmd = {.name = "rollout-worker", .opts = opts, .pos = pos};
    int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) {
        free(sets.v);
        return opts_exit_status(prc);
    }
    core_recipe r;
    memset(&r, 0, sizeof r);
    rollout_pipeline p;
    memset(&p, 0, sizeof p);
    int status = 1, keyed = 0;
    core_curve_keys keys; /* read first: the descriptor is closed at once */
    if (core_curve_options(keys_fd, keys_file, &keys, &keyed)) {
        fprintf(stderr, "rollout-worker %s: %s\n", cfg.id, core_last_error());
        free(sets.v);
        return 1;
    }
    cfg.keys = keyed ? &keys : NULL;
    const int wi = core_gpu_worker_index(cfg.id); /* model.device cuda: its GPU of the job (core/gpu_assign.h) */
    if (core_recipe_load(&r, path, sets.v, sets.n) || (wi >= 0 && core_gpu_select(&r, CORE_GPU_WORKER, wi)) ||
        rollout_pipeline_load_lora(&p, &r, transformer, adapter)) {
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
    free(sets.v);
    return status;
}
