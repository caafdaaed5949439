/* core/gpu_assign.c — which GPU each process of a job uses (see core/gpu_assign.h). */
#include "core/gpu_assign.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

int core_gpu_visible(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES"), *emu = getenv("VGRPO_EMULATE_DEVICE");
    if (!v || (emu && !strcmp(emu, "1"))) return -1; /* the emulated device (tests) stands for any GPU */
    int n = 0;
    for (const char *p = v; *p;) { /* entries between commas; empty ones do not count */
        const char *c = strchr(p, ',');
        const size_t len = c ? (size_t)(c - p) : strlen(p);
        n += len > 0;
        p += len + (c != NULL);
    }
    return n;
}

int core_gpu_plan_make(const core_recipe *r, int visible, core_gpu_plan *p) {
    memset(p, 0, sizeof *p);
    const int local = r->choice.mode == CORE_MODE_LOCAL;
    p->n_trainer = local ? 1 : r->trainer_ranks;
    p->n_workers = local ? 0 : r->rollout_workers;
    p->shared = r->share_gpus;
    p->visible = visible;
    p->listed = r->gpus.n > 0;
    const int need = p->shared ? p->n_trainer : p->n_trainer + p->n_workers;
    if (p->listed) {
        p->n = r->gpus.n, p->gpus = r->gpus.v;
        for (int i = 0; i < p->n; i++) {
            if (p->gpus[i] < 0 || (visible >= 0 && p->gpus[i] >= visible))
                return core_error("parallel.gpus.%d: GPU %lld is out of range: %d visible device(s)%s", i,
                                  (long long)p->gpus[i], visible < 0 ? 0 : visible,
                                  visible < 0 ? "" : " (CUDA_VISIBLE_DEVICES)");
            for (int j = 0; j < i; j++)
                if (p->gpus[j] == p->gpus[i])
                    return core_error("parallel.gpus.%d: GPU %lld is listed twice (also parallel.gpus.%d): list each "
                                      "device once (parallel.share_gpus true puts rollout workers on the trainer "
                                      "ranks' GPUs)", i, (long long)p->gpus[i], j);
        }
    } else {
        p->n = visible >= 0 ? visible : need; /* unknown: as many as needed, checked when each process opens its own */
    }
    const char *from = p->listed ? "parallel.gpus lists" : visible >= 0 ? "CUDA_VISIBLE_DEVICES names" : "there are";
    if (p->n < p->n_trainer)
        return core_error("parallel.gpus: %s %d GPU(s) for %d trainer rank(s): a trainer rank needs a GPU of its own "
                          "(parallel.trainer_ranks)", from, p->n, p->n_trainer);
    if (p->n < need)
        return core_error("parallel.gpus: %s %d GPU(s) for %d trainer rank(s) and %d rollout worker(s) on separate GPUs "
                          "(%d needed): list more (parallel.gpus), run fewer (parallel.rollout_workers), or set "
                          "parallel.share_gpus true to put the workers on the trainer ranks' GPUs in turns",
                          from, p->n, p->n_trainer, p->n_workers, need);
    return 0;
}

int core_gpu_of(const core_gpu_plan *p, core_gpu_role role, int index) {
    const int slot = role == CORE_GPU_TRAINER ? index : p->shared ? index % p->n : p->n_trainer + index;
    return p->gpus ? (int)p->gpus[slot] : slot;
}

void core_gpu_plan_print(FILE *f, const core_gpu_plan *p) {
    fprintf(f, "GPU assignment (%s; %s):\n",
            p->listed ? "parallel.gpus" : p->visible >= 0 ? "the devices CUDA_VISIBLE_DEVICES names"
                                                          : "the visible devices, numbered from 0; checked at start-up",
            p->shared ? "parallel.share_gpus true: a rollout worker on a trainer rank's GPU takes turns with it"
                      : "a GPU per process");
    if (!p->n_workers) /* mode local */
        fprintf(f, "  the local process (trainer and rollouts) -> GPU %d\n", core_gpu_of(p, CORE_GPU_TRAINER, 0));
    for (int t = 0; p->n_workers && t < p->n_trainer; t++)
        fprintf(f, "  trainer rank %d -> GPU %d\n", t, core_gpu_of(p, CORE_GPU_TRAINER, t));
    for (int w = 0; w < p->n_workers; w++)
        fprintf(f, "  rollout worker %d -> GPU %d\n", w, core_gpu_of(p, CORE_GPU_WORKER, w));
}

int core_gpu_worker_index(const char *id) {
    int w, end = 0;
    if (!id || sscanf(id, "worker-%d%n", &w, &end) != 1 || id[end] || w < 0) return -1;
    return w;
}

int core_gpu_select(const core_recipe *r, core_gpu_role role, int index) {
    if (r->choice.device != CORE_CUDA) return 0;
    core_gpu_plan p;
    if (core_gpu_plan_make(r, core_gpu_visible(), &p)) return -1;
    const int trainer = role == CORE_GPU_TRAINER, nproc = trainer ? p.n_trainer : p.n_workers;
    const char *who = trainer ? "trainer rank" : "rollout worker";
    if (index < 0 || (trainer && index >= nproc))
        return core_error("parallel.gpus: %s %d is not in this job's %d", who, index, nproc);
    /* a worker past the recipe's (the workers of `vgrpo eval --workers N`, a job without trainer ranks): the GPUs in
     * turn */
    const int extra = !trainer && index >= nproc;
    const int gpu = !extra ? core_gpu_of(&p, role, index)
                    : p.gpus ? (int)p.gpus[index % p.n] : p.visible > 0 ? index % p.visible : index;
    char v[16];
    snprintf(v, sizeof v, "%d", gpu);
    if (setenv(CORE_GPU_ENV, v, 1)) return core_error("setenv %s: out of memory", CORE_GPU_ENV);
    const char *how = extra                  ? ", a job of workers only: the GPUs in turn"
                      : p.shared && !trainer ? ", shared with a trainer rank in turns"
                                             : "";
    core_log_info("%s %d: model.device cuda on GPU %d (%s%s)", who, index, gpu,
                  p.listed ? "parallel.gpus" : "the visible devices", how);
    return 0;
}
