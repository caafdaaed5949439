/* core/gpu_assign.c — which GPU each process of a job uses (see core/gpu_assign.h). */
#include "core/gpu_assign.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

/* The job's nodes (core_gpu_set_nodes); n_nodes 0: one node, the whole job. */
static core_gpu_node *g_nodes;
static int g_n_nodes, g_self = -1, g_local;

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

int core_gpu_set_nodes(const core_gpu_node *nodes, int n, int self, int local) {
    free(g_nodes), g_nodes = NULL, g_n_nodes = 0, g_self = -1, g_local = 0;
    if (n <= 0) return 0;
    if (self < -1 || self >= n || local < 0) return core_error("the GPU plan: node %d of %d is not one", self, n);
    if (!(g_nodes = malloc(sizeof *g_nodes * (size_t)n))) return core_error("out of memory");
    memcpy(g_nodes, nodes, sizeof *g_nodes * (size_t)n);
    for (int k = 0; k < n; k++) g_nodes[k].name[CORE_GPU_NODE_NAME_MAX - 1] = 0;
    g_n_nodes = n, g_self = self, g_local = local;
    return 0;
}

/* "node NAME (T trainer rank(s), W rollout worker(s) on it): " into buf when the plan is one node's of several. */
static const char *node_prefix(const core_gpu_plan *p, char *buf, size_t cap) {
    if (!p->node) return "";
    snprintf(buf, cap, "node %s (%d trainer rank(s), %d rollout worker(s) on it): ", p->node, p->n_trainer, p->n_workers);
    return buf;
}

int core_gpu_plan_node(const core_recipe *r, int visible, const char *node, int n_trainer, int n_workers,
                       core_gpu_plan *p) {
    memset(p, 0, sizeof *p);
    const int local = r->choice.mode == CORE_MODE_LOCAL;
    p->node = node;
    p->n_trainer = local ? 1 : n_trainer;
    p->n_workers = local ? 0 : n_workers;
    p->shared = r->share_gpus;
    p->visible = visible;
    p->listed = r->gpus.n > 0;
    /* shared: the trainer ranks' GPUs, at least one where a node runs workers only */
    const int need = p->shared ? (p->n_trainer > 0 ? p->n_trainer : p->n_workers > 0) : p->n_trainer + p->n_workers;
    char np[CORE_GPU_NODE_NAME_MAX + 96];
    const char *at = node_prefix(p, np, sizeof np);
    if (p->listed) {
        p->n = r->gpus.n, p->gpus = r->gpus.v;
        for (int i = 0; i < p->n; i++) {
            if (p->gpus[i] < 0 || p->gpus[i] > INT_MAX) /* core_gpu_of returns an int: no wrap into another GPU */
                return core_error("%sparallel.gpus.%d: GPU %lld is not a device index (0 .. %d)", at, i,
                                  (long long)p->gpus[i], INT_MAX);
            if (visible >= 0 && p->gpus[i] >= visible)
                return core_error("%sparallel.gpus.%d: GPU %lld is out of range: %d visible device(s) "
                                  "(CUDA_VISIBLE_DEVICES)", at, i,
                                  (long long)p->gpus[i], visible);
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
        return core_error("%sparallel.gpus: %s %d GPU(s) for %d trainer rank(s): a trainer rank needs a GPU of its own "
                          "(parallel.trainer_ranks)", at, from, p->n, p->n_trainer);
    if (p->n < need)
        return core_error("%sparallel.gpus: %s %d GPU(s) for %d trainer rank(s) and %d rollout worker(s) on separate GPUs "
                          "(%d needed): list more (parallel.gpus), run fewer (parallel.rollout_workers), or set "
                          "parallel.share_gpus true to put the workers on the trainer ranks' GPUs in turns",
                          at, from, p->n, p->n_trainer, p->n_workers, need);
    return 0;
}

int core_gpu_plan_make(const core_recipe *r, int visible, core_gpu_plan *p) {
    if (!g_n_nodes) return core_gpu_plan_node(r, visible, NULL, r->trainer_ranks, r->rollout_workers, p);
    if (g_self >= 0) {
        const core_gpu_node *d = &g_nodes[g_self];
        return core_gpu_plan_node(r, visible, g_n_nodes > 1 ? d->name : NULL, d->n_trainer, d->n_workers, p);
    }
    int best = 0; /* a launcher: every node checked, the busiest one's plan kept */
    for (int k = 0; k < g_n_nodes; k++) {
        const core_gpu_node *d = &g_nodes[k];
        if (core_gpu_plan_node(r, visible, g_n_nodes > 1 ? d->name : NULL, d->n_trainer, d->n_workers, p)) return -1;
        if (d->n_trainer + d->n_workers > g_nodes[best].n_trainer + g_nodes[best].n_workers) best = k;
    }
    const core_gpu_node *d = &g_nodes[best];
    return core_gpu_plan_node(r, visible, g_n_nodes > 1 ? d->name : NULL, d->n_trainer, d->n_workers, p);
}

int core_gpu_of(const core_gpu_plan *p, core_gpu_role role, int index) {
    const int slot = role == CORE_GPU_TRAINER ? index : p->shared ? index % p->n : p->n_trainer + index;
    return p->gpus ? (int)p->gpus[slot] : slot;
}

/* One node's lines; t0, w0: the job-wide index of its first trainer rank and worker. */
static void print_node(FILE *f, const core_gpu_plan *p, const char *indent, int t0, int w0) {
    if (!p->n_workers && !p->node) /* mode local */
        fprintf(f, "%sthe local process (trainer and rollouts) -> GPU %d\n", indent, core_gpu_of(p, CORE_GPU_TRAINER, 0));
    for (int t = 0; (p->n_workers || p->node) && t < p->n_trainer; t++)
        fprintf(f, "%strainer rank %d -> GPU %d\n", indent, t0 + t, core_gpu_of(p, CORE_GPU_TRAINER, t));
    for (int w = 0; w < p->n_workers; w++)
        fprintf(f, "%srollout worker %d -> GPU %d\n", indent, w0 + w, core_gpu_of(p, CORE_GPU_WORKER, w));
}

int core_gpu_plan_print(FILE *f, const core_recipe *r, int visible) {
    core_gpu_plan p;
    if (core_gpu_plan_make(r, visible, &p)) return -1; /* every node checked before anything is printed */
    const char *how = p.shared ? "parallel.share_gpus true: a rollout worker on a trainer rank's GPU takes turns with it"
                               : "a GPU per process";
    const char *src = p.listed ? "parallel.gpus" : p.visible >= 0 ? "the devices CUDA_VISIBLE_DEVICES names"
                                                                  : "the visible devices, numbered from 0; checked at start-up";
    if (g_n_nodes <= 1) {
        fprintf(f, "GPU assignment (%s; %s):\n", src, how);
        print_node(f, &p, "  ", 0, 0);
        return 0;
    }
    fprintf(f, "GPU assignment per node (%s, each node's own; %s):\n", src, how);
    for (int k = 0, t0 = 0, w0 = 0; k < g_n_nodes; k++) {
        const core_gpu_node *d = &g_nodes[k];
        core_gpu_plan_node(r, visible, d->name, d->n_trainer, d->n_workers, &p); /* checked above */
        fprintf(f, "  node %s: %d trainer rank(s), %d rollout worker(s)%s\n", d->name, p.n_trainer, p.n_workers,
                p.n_trainer + p.n_workers ? "" : " (no GPU used)");
        print_node(f, &p, "    ", t0, w0);
        t0 += p.n_trainer, w0 += p.n_workers;
    }
    return 0;
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
    const int trainer = role == CORE_GPU_TRAINER, nodes = g_n_nodes > 0 && g_self >= 0;
    const int nproc = trainer ? (nodes ? r->trainer_ranks : p.n_trainer) : (nodes ? r->rollout_workers : p.n_workers);
    const char *who = trainer ? "trainer rank" : "rollout worker";
    if (index < 0 || (trainer && index >= nproc))
        return core_error("parallel.gpus: %s %d is not in this job's %d", who, index, nproc);
    /* a worker past the recipe's (the workers of `vgrpo eval --workers N`, a job without trainer ranks): the GPUs in
     * turn */
    const int extra = !trainer && index >= nproc;
    const int at = nodes ? g_local : index; /* the index on the node */
    const int gpu = !extra ? core_gpu_of(&p, role, at)
                    : p.gpus ? (int)p.gpus[index % p.n] : p.visible > 0 ? index % p.visible : index;
    char v[16];
    snprintf(v, sizeof v, "%d", gpu);
    if (setenv(CORE_GPU_ENV, v, 1)) return core_error("setenv %s: out of memory", CORE_GPU_ENV);
    const char *how = extra                  ? ", a job of workers only: the GPUs in turn"
                      : p.shared && !trainer ? ", shared with a trainer rank in turns"
                                             : "";
    char where[CORE_GPU_NODE_NAME_MAX + 64] = "";
    if (p.node) snprintf(where, sizeof where, " of node %s, its %s %d there", p.node, who, at);
    core_log_info("%s %d: model.device cuda on GPU %d%s (%s%s)", who, index, gpu, where,
                  p.listed ? "parallel.gpus" : "the visible devices", how);
    return 0;
}
