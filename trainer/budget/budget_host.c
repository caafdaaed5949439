/* trainer/budget/budget_host.c — this machine's side of trainer/budget/budget.h: the memory available to the process (cgroup v2 /
 * v1 limits, /proc/meminfo), the sgemm rate, the printed table and the refusals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/gpu_assign.h"
#include "kernels/kernels.h"
#include "trainer/budget/budget.h"
#include "trainer/optim/train_dev.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Available memory */

/* A byte count from a one-line file: 0 and *v; 1 for "max" (no limit); -1 unreadable. */
static int read_bytes(const char *path, double *v) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = "";
    const int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    if (!strncmp(buf, "max", 3)) return 1;
    char *end;
    const double x = strtod(buf, &end);
    if (end == buf || !(x >= 0)) return -1;
    *v = x;
    return x >= 1152921504606846976.0 ? 1 : 0; /* cgroup v1 writes "no limit" as ~2^63 */
}

/* The value of `key` in a "key value" file (memory.stat, in bytes) or "key: value kB" (/proc/meminfo); -1 absent. */
static double read_key(const char *path, const char *key, double unit) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    double v = -1;
    const size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && (line[kl] == ' ' || line[kl] == '\t')) {
            v = strtod(line + kl, NULL) * unit;
            break;
        }
    fclose(f);
    return v;
}

static void gib(char *buf, size_t cap, double b) {
    if (b >= 1073741824.0) snprintf(buf, cap, "%.1f GiB", b / 1073741824.0);
    else if (b >= 1048576.0) snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
    else snprintf(buf, cap, "%.1f KiB", b / 1024.0);
}

void budget_format_flop(char *buf, size_t cap, double x) {
    static const char *const unit[] = {"GFLOP", "TFLOP", "PFLOP", "EFLOP"};
    int u = 0;
    x *= 1e-9;
    while (u < 3 && x >= 1000) x *= 1e-3, u++;
    snprintf(buf, cap, "%.3g %s", x, unit[u]);
}

/* Walks the cgroup path from the process's own cgroup up to the root under base, taking the smallest limit less
 * what the cgroup already holds (anonymous memory). */
static void cgroup_walk(budget_memory *m, const char *base, const char *cgpath, int v2) {
    char dir[4096], file[4200];
    snprintf(dir, sizeof dir, "%s%s", base, cgpath);
    for (;;) {
        size_t n = strlen(dir);
        while (n > strlen(base) && dir[n - 1] == '/') dir[--n] = 0;
        double lim;
        snprintf(file, sizeof file, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
        if (!read_bytes(file, &lim)) {
            char stat[4200];
            snprintf(stat, sizeof stat, "%s/memory.stat", dir);
            double used = read_key(stat, v2 ? "anon" : "total_rss", 1.0);
            if (used < 0 && !v2) used = read_key(stat, "rss", 1.0);
            const double avail = lim - (used > 0 ? used : 0);
            if (avail < m->detected) {
                char a[32], u[32];
                gib(a, sizeof a, lim), gib(u, sizeof u, used > 0 ? used : 0);
                m->detected = avail > 0 ? avail : 0;
                snprintf(m->source, sizeof m->source, "cgroup %s %s: %s, %s in use", v2 ? "v2" : "v1", file, a, u);
            }
        }
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < strlen(base)) break;
        *slash = 0;
        if (strlen(dir) < strlen(base)) break;
    }
}

void budget_memory_available(budget_memory *m, int64_t limit_mb, const char *root) {
    char path[4096];
    if (!root) root = "";
    memset(m, 0, sizeof *m);
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    double v = read_key(path, "MemAvailable:", 1024.0);
    if (v > 0) {
        m->detected = v;
        snprintf(m->source, sizeof m->source, "MemAvailable of /proc/meminfo");
    } else if ((v = read_key(path, "MemTotal:", 1024.0)) > 0) {
        m->detected = v;
        snprintf(m->source, sizeof m->source, "MemTotal of /proc/meminfo");
    } else {
        m->detected = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        snprintf(m->source, sizeof m->source, "physical memory");
    }
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = 0, *c2 = 0;
        const char *ctrl = c1 + 1, *cg = c2 + 1;
        char base[4200];
        if (!strcmp(line, "0") && !*ctrl) { /* cgroup v2 (unified; /sys/fs/cgroup/unified on hybrid systems) */
            snprintf(base, sizeof base, "%s/sys/fs/cgroup", root);
            cgroup_walk(m, base, cg, 1);
            snprintf(base, sizeof base, "%s/sys/fs/cgroup/unified", root);
            cgroup_walk(m, base, cg, 1);
        } else {
            char list[4096];
            snprintf(list, sizeof list, ",%s,", ctrl);
            if (!strstr(list, ",memory,")) continue;
            snprintf(base, sizeof base, "%s/sys/fs/cgroup/memory", root);
            cgroup_walk(m, base, cg, 0);
        }
    }
    if (f) fclose(f);
    const double margin = fmax(0.1 * m->detected, 64.0 * 1048576.0);
    m->bytes = fmax(m->detected - margin, 0);
    char s[32];
    gib(s, sizeof s, margin);
    snprintf(m->source + strlen(m->source), sizeof m->source - strlen(m->source), ", less a %s margin", s);
    if (limit_mb > 0 && (double)limit_mb * 1048576.0 < m->bytes) {
        m->bytes = (double)limit_mb * 1048576.0;
        snprintf(m->source, sizeof m->source, "limits.memory_mb %lld", (long long)limit_mb);
    }
}

/* ---------------------------------------------------------------------------------------------------------------
 * The sgemm rate */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double budget_gflops(void) {
    enum { M = 256, N = 512, K = 512 };
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * N * K), *c = malloc(sizeof(float) * M * N);
    double best = 0;
    if (a && b && c) {
        for (int i = 0; i < M * K; i++) a[i] = (float)(i % 97) * 0.01f - 0.5f;
        for (int i = 0; i < N * K; i++) b[i] = (float)(i % 89) * 0.01f - 0.5f;
        for (int rep = 0; rep < 4; rep++) {
            const double t0 = now_s();
            k_cpu_ops.gemm(0, 1, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N, NULL);
            const double dt = now_s() - t0;
            if (rep > 0 && dt > 0 && 2.0 * M * N * K / dt > best) best = 2.0 * M * N * K / dt;
        }
    }
    free(a), free(b), free(c);
    return best * 1e-9;
}

/* ---------------------------------------------------------------------------------------------------------------
 * The table and the checks */

static const char *phase_name(unsigned ph) {
    switch (ph) {
    case 0: return "always";
    case BUDGET_START: return "start-up";
    case BUDGET_ROLLOUT: return "rollout";
    case BUDGET_TRAIN: return "training";
    case BUDGET_EVAL: return "eval";
    case BUDGET_SYNC: return "sync";
    case BUDGET_ROLLOUT | BUDGET_TRAIN: return "rollout, training";
    case BUDGET_ROLLOUT | BUDGET_EVAL: return "rollout, eval";
    }
    return "some";
}

void budget_format_duration(char *buf, size_t cap, double s) {
    if (s < 120) snprintf(buf, cap, "%.2g s", s);
    else if (s < 7200) snprintf(buf, cap, "%.0f min", s / 60);
    else if (s < 172800) snprintf(buf, cap, "%.1f h", s / 3600);
    else snprintf(buf, cap, "%.0f days", s / 86400);
}

void budget_print(FILE *f, const budget_estimate *e, const budget_memory *m, double gflops) {
    char a[32], b[32];
    fprintf(f, "estimate (trainer/budget/budget.h; memory within x%.2f of the measured peak): %s, %d expert%s x %lld "
               "parameters, %lld video tokens per sample\n",
            BUDGET_TOLERANCE, e->source, e->n_experts, e->n_experts > 1 ? "s" : "", (long long)e->params,
            (long long)e->tokens);
    for (int i = 0; i < e->n_procs; i++) {
        const budget_proc *p = &e->proc[i];
        char head[80];
        snprintf(head, sizeof head, "%s x%d", p->name, p->count);
        fprintf(f, "  %-40s %10s  %s\n", head, "memory", "held");
        for (int k = 0; k < p->n_parts; k++) {
            gib(a, sizeof a, p->part[k].bytes);
            fprintf(f, "    %-38s %10s  %s\n", p->part[k].name, a, phase_name(p->part[k].phases));
        }
        gib(a, sizeof a, p->peak);
        fprintf(f, "    %-38s %10s\n", "peak (always + largest phase)", a);
    }
    if (e->zero_stage > 0 && e->zero_ranks > 1) { /* trainer/dp/zero.h */
        gib(a, sizeof a, e->adam_shard), gib(b, sizeof b, e->adam_whole);
        fprintf(f, "  parallel.zero_stage %d: AdamW m, v %s per trainer rank (whole: %s) over %d ranks%s; gradients "
                   "whole during the backward%s; rank 0 gathers m, v whole while it writes a checkpoint (+%s then, not "
                   "in the total)\n",
                e->zero_stage, a, b, e->zero_ranks,
                e->zero_stage == 3 ? "; the fp32 master sharded on the devices (the host copy whole)" : "",
                e->zero_stage >= 2 ? ", reduce-scattered after it" : "", b);
    }
    gib(a, sizeof a, e->total), gib(b, sizeof b, m->bytes);
    fprintf(f, "  job total %s; available %s (%s)%s\n", a, b, m->source,
            e->cuda_only == 2 ? "; not checked: model.device cuda (the transformer's memory is the device's: its estimate "
                                "follows, the one the trainer checks at start-up)"
            : e->cuda_only    ? "; not checked: a full-size transformer runs on the CUDA backend (model.device: cuda)"
                              : "");
    const double step = e->flop_rollout + e->flop_train;
    char t[32] = "?", fs[32], fr[32], ft[32];
    if (gflops > 0) budget_format_duration(t, sizeof t, step / (gflops * 1e9));
    budget_format_flop(fs, sizeof fs, step), budget_format_flop(fr, sizeof fr, e->flop_rollout);
    budget_format_flop(ft, sizeof ft, e->flop_train);
    if (e->job == BUDGET_JOB_EVAL)
        fprintf(f, "  work: the eval %s (DiT forwards); ~%s at %.0f GFLOP/s (sgemm here; the DiT runs slower)\n", fs, t,
                gflops);
    else
        fprintf(f, "  work: %s %s (rollout %s, %s %s); ~%s at %.0f GFLOP/s (sgemm here; the DiT runs slower)\n",
                e->job == BUDGET_JOB_PARITY ? "the parity batch" : "one GRPO step", fs, fr,
                e->job == BUDGET_JOB_PARITY ? "recompute" : "training", ft, t, gflops);
    if (e->flop_eval > 0) {
        if (gflops > 0) budget_format_duration(t, sizeof t, e->flop_eval / (gflops * 1e9));
        budget_format_flop(fs, sizeof fs, e->flop_eval);
        fprintf(f, "  in-run eval %s, ~%s\n", fs, t);
    }
    if (e->flop_images > 0) { /* image to video: once, before the first step */
        if (gflops > 0) budget_format_duration(t, sizeof t, e->flop_images / (gflops * 1e9));
        budget_format_flop(fs, sizeof fs, e->flop_images);
        fprintf(f, "  image encoding at start-up: %d image%s through the VAE encoder, %s, ~%s\n", e->n_images,
                e->n_images > 1 ? "s" : "", fs, t);
    }
}

int budget_check(const budget_estimate *e, const core_recipe *r, const budget_memory *m, double gflops, int force,
                 FILE *warn) {
    if (e->cuda_only) return 0;
    char why[2][1024];
    int n = 0;
    if (e->total > m->bytes) {
        /* the two largest parts over the job (a part counts once per process of its kind) */
        const budget_part *top[2] = {NULL, NULL};
        double tb[2] = {0, 0};
        for (int i = 0; i < e->n_procs; i++)
            for (int k = 0; k < e->proc[i].n_parts; k++) {
                const budget_part *p = &e->proc[i].part[k];
                const double x = p->bytes * e->proc[i].count;
                if (!p->keys[0]) continue;
                if (x > tb[0]) top[1] = top[0], tb[1] = tb[0], top[0] = p, tb[0] = x;
                else if (x > tb[1]) top[1] = p, tb[1] = x;
            }
        char need[32], have[32];
        gib(need, sizeof need, e->total), gib(have, sizeof have, m->bytes);
        size_t o = (size_t)snprintf(why[n], sizeof why[n], "memory: the job needs about %s and %s is available (%s); "
                                    "the largest parts:", need, have, m->source);
        for (int j = 0; j < 2 && top[j] && o < sizeof why[n]; j++) {
            char x[32];
            gib(x, sizeof x, tb[j]);
            o += (size_t)snprintf(why[n] + o, sizeof why[n] - o, "%s %s %s (%s)", j ? "," : "", top[j]->name, x,
                                  top[j]->keys);
        }
        if (o < sizeof why[n]) snprintf(why[n] + o, sizeof why[n] - o, "; lower those keys");
        n++;
    }
    const double step = e->flop_rollout + e->flop_train;
    if (e->job != BUDGET_JOB_EVAL && r->max_step_minutes > 0 && gflops > 0 &&
        step / (gflops * 1e9) > r->max_step_minutes * 60) {
        char t[32];
        budget_format_duration(t, sizeof t, step / (gflops * 1e9));
        char fs[32];
        budget_format_flop(fs, sizeof fs, step);
        snprintf(why[n++], sizeof why[0], "limits.max_step_minutes: %s is about %s here (%s at %.0f GFLOP/s), "
                 "over the %g min bound; the work grows with rollout.frames, rollout.height, rollout.width, "
                 "rollout.num_steps, rollout.prompts_per_step and rollout.samples_per_prompt: lower them, or raise the "
                 "bound (0: none)", e->job == BUDGET_JOB_PARITY ? "the parity batch" : "one GRPO step", t, fs,
                 gflops, r->max_step_minutes);
    }
    if (!n) return 0;
    if (force) {
        for (int i = 0; i < n; i++) fprintf(warn, "warning: --force: %s\n", why[i]);
        fflush(warn);
        return 0;
    }
    return core_error("%s%s%s; --force runs it anyway", why[0], n > 1 ? "; " : "", n > 1 ? why[1] : "");
}

/* model.device cuda: the device estimate per process (trainer/optim/train_dev.h: the function the trainer checks at
 * start-up), and on the busiest GPU of the assignment (core/gpu_assign.h: a process each, or a trainer rank and the
 * rollout workers that share its GPU). 0 or -1 (a config the device
 * refuses). */
static int print_device(FILE *out, const budget_estimate *e, const core_recipe *r) {
    const int i2v = e->n_images > 0, local = e->job == BUDGET_JOB_RUN && r->choice.mode == CORE_MODE_LOCAL;
    trainer_dev_budget t, w;
    fprintf(out, "device memory (model.device cuda), computed from the configs without a GPU; the trainer checks the "
                 "same estimate at start-up (trainer/optim/train_dev.h):\n");
    if (e->job != BUDGET_JOB_EVAL) {
        if (trainer_dev_estimate_recipe(r, &e->dit, e->n_experts, i2v, 0, &t)) return -1;
        trainer_dev_budget_text(&t, r, e->have_t5 ? &e->t5 : NULL, 0);
        trainer_dev_budget_print(out, local ? "local process (trainer and rollout)" : "trainer rank", &t,
                                 r->activations);
        if (t.window) { /* trainer/dp/dp_dev.h: what the window costs in traffic, per optimizer step */
            const double bf16 = 2.0 * (double)e->params / 1073741824.0, shard = e->shard;
            fprintf(out, "  the expert window (parallel.zero_stage 3, both experts trained: trainer/dp/dp_dev.h), per "
                         "optimizer step and trainer rank: each expert's bf16 weights all-gathered into it before its "
                         "micro-batches (%.2f GiB per expert, two all-gathers), transformer's reduced gradient shard to host memory and "
                         "back (%.2f GiB each way)\n", bf16, shard / 1073741824.0);
        }
    }
    if (!local) {
        if (trainer_dev_estimate_recipe(r, &e->dit, e->n_experts, i2v, 1, &w)) return -1;
        trainer_dev_budget_text(&w, r, e->have_t5 ? &e->t5 : NULL, 1);
        trainer_dev_budget_print(out, "rollout worker", &w, r->activations);
        core_gpu_plan gp; /* colocated: the processes on the busiest GPU of the plan (core/gpu_assign.h) */
        if (e->job != BUDGET_JOB_EVAL && !core_gpu_plan_make(r, core_gpu_visible(), &gp)) {
            /* shared: worker k on GPU slot k mod n, so slot 0 (a trainer rank's) holds the most workers */
            const int per = gp.shared ? (gp.n_workers + gp.n - 1) / gp.n : 0;
            const double g = gp.shared ? t.total + per * w.total : fmax(t.total, w.total);
            const double h100 = TRAINER_DEV_H100_MIB * 1048576.0, h200 = TRAINER_DEV_H200_MIB * 1048576.0;
            char who[96];
            if (gp.shared)
                snprintf(who, sizeof who, "a trainer rank and %d rollout worker%s, parallel.share_gpus true", per,
                         per > 1 ? "s" : "");
            else
                snprintf(who, sizeof who, "one process each, parallel.share_gpus false: the larger");
            fprintf(out, "  per GPU (%s): %.2f GiB: %s on an 80 GB H100, %s on a 141 GB H200\n", who, g / 1073741824.0,
                    g <= h100 ? "fits" : "does NOT fit", g <= h200 ? "fits" : "does NOT fit");
        }
    }
    return 0;
}

int budget_preflight(const core_recipe *r, const budget_request *q, int force, FILE *out) {
    budget_estimate *e = malloc(sizeof *e);
    if (!e) return core_error("out of memory");
    int rc = budget_estimate_job(e, r, q);
    if (rc == 1) {
        fprintf(out, "estimate: none (%s)\n", e->source);
        fflush(out);
        rc = 0;
    } else if (rc == 0) {
        budget_memory m;
        budget_memory_available(&m, r->memory_mb, NULL);
        const double g = budget_gflops();
        budget_print(out, e, &m, g);
        rc = e->cuda_only == 2 ? print_device(out, e, r) : 0;
        fflush(out);
        if (!rc) rc = budget_check(e, r, &m, g, force, stderr);
    }
    free(e);
    return rc;
}
