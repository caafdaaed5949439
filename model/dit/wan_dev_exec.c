/* model/dit/wan_dev_exec.c — the DiT executor on a device (wan_dev_exec.h): the process's shared executor per
 * device, the device copies of host models keyed by (address, weights version), and forward/backward with host
 * fp32 tensors through one growing staging buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/dit/wan_dev_exec.h"
#include "model/dit/wan_dev.h"
#include "model/dit/wan_internal.h"

typedef struct {
    const wan_model *host;
    wan_dev_model d;
    int64_t version;
    int known; /* version is set */
    int in_window; /* one of the two experts of wan_dev_exec_window */
} slot;

struct wan_dev_exec {
    const k_dev_ops *dev;
    int emulated, refs, shared; /* shared: the process's executor of its device (g_exec) */
    slot **s;                   /* each slot its own allocation: wan_dev_exec_model's pointers stay valid */
    int n, cap;
    float *io; /* device staging: x | enc | out, or dout */
    size_t io_floats;
    const slot *resident; /* wan_dev_exec_window: the expert whose weights the window holds (NULL: none) */
};

/* The process's executors: [0] the GPU, [1] the emulated device. */
static wan_dev_exec *g_exec[2];

int wan_dev_exec_emulating(void) {
    const char *e = getenv(WAN_DEV_EMULATE_ENV);
    return e && !strcmp(e, "1");
}

/* VGRPO_EMULATE_DEVICE_REPORT=1 (tests): at exit, the emulated device's peak allocation on stderr, the figure the
 * trainer's start-up estimate is tested against (tests/test_dev_budget.c). */
static void report_peak(void) {
    size_t held, peak;
    k_emu_mem_stats(&held, &peak);
    fprintf(stderr, "emulated device: peak %zu bytes allocated (%zu held at exit)\n", peak, held);
}

int wan_dev_exec_open(const char *device, wan_dev_exec **out) {
    *out = NULL;
    if (!device || !strcmp(device, "cpu")) return 0;
    if (strcmp(device, "cuda")) return core_error("model.device: must be cpu or cuda, got \"%s\"", device);
    const int emu = wan_dev_exec_emulating();
    wan_dev_exec *x = g_exec[emu];
    if (!x) {
        const k_dev_ops *dev = &k_emu_ops;
        if (!emu) {
            char why[K_WHY_MAX];
            if (!(dev = k_cuda_device(why))) return core_error("model.device: cuda: %s", why);
        }
        if (!(x = wan_dev_exec_new(dev))) return -1;
        x->emulated = emu, x->shared = 1, x->refs = 0;
        g_exec[emu] = x;
        const char *rep = getenv("VGRPO_EMULATE_DEVICE_REPORT");
        if (emu && rep && !strcmp(rep, "1")) atexit(report_peak);
        if (emu)
            core_log_warn("model.device cuda: the EMULATED device (%s=1: host memory, the kernel bodies and k_cpu_ops "
                          "on the CPU, bf16 storage as on the GPU): a test of the device code path, not a GPU",
                          WAN_DEV_EMULATE_ENV);
    }
    x->refs++;
    *out = x;
    return 0;
}

wan_dev_exec *wan_dev_exec_new(const k_dev_ops *dev) {
    wan_dev_exec *x = calloc(1, sizeof *x);
    if (!x) return core_error("out of memory"), NULL;
    x->dev = dev, x->refs = 1;
    return x;
}

void wan_dev_exec_close(wan_dev_exec *x) {
    if (!x || --x->refs > 0) return;
    for (int i = 0; i < x->n; i++) wan_dev_model_free(&x->s[i]->d), free(x->s[i]);
    x->dev->mem_free(x->io);
    free(x->s);
    if (x->shared) g_exec[x->emulated] = NULL;
    free(x);
}

const k_dev_ops *wan_dev_exec_ops(const wan_dev_exec *x) { return x->dev; }
const char *wan_dev_exec_name(const wan_dev_exec *x) { return x->dev->name; }

static slot *find(wan_dev_exec *x, const wan_model *m) {
    for (int i = 0; i < x->n; i++)
        if (x->s[i]->host == m) return x->s[i];
    return NULL;
}

/* A slot whose device copy owns the bf16 base of m's fp32 weights (the same params buffer): an adapter-carrying m
 * borrows it (wan_dev_model_init_view) instead of a second copy of a frozen base. */
static const slot *lender(const wan_dev_exec *x, const wan_model *m) {
    if (!m->lora) return NULL;
    for (int i = 0; i < x->n; i++)
        if (!x->s[i]->d.base_borrowed && x->s[i]->host->params == m->params &&
            wan_config_equal(&x->s[i]->host->cfg, &m->cfg))
            return x->s[i];
    return NULL;
}

/* m's slot, made (and its weights uploaded, or its adapter alone on a lender's base) when missing. */
/* Room for one more slot in x->s, and a zeroed slot (the caller fills it and appends it); NULL when out of memory. */
static slot *new_slot(wan_dev_exec *x) {
    if (x->n == x->cap) {
        const int cap = x->cap ? 2 * x->cap : 4;
        slot **ns = realloc(x->s, sizeof *ns * (size_t)cap);
        if (!ns) return core_error("out of memory"), NULL;
        x->s = ns, x->cap = cap;
    }
    slot *s = calloc(1, sizeof *s);
    if (!s) core_error("out of memory");
    return s;
}

static slot *get(wan_dev_exec *x, const wan_model *m) {
    slot *s = find(x, m);
    if (s) return s;
    if (!(s = new_slot(x))) return NULL;
    const slot *l = lender(x, m);
    if (l ? wan_dev_model_init_view(&s->d, &l->d, m) : wan_dev_model_init(&s->d, x->dev, m)) return free(s), NULL;
    s->host = m;
    x->s[x->n++] = s;
    return s;
}

wan_dev_model *wan_dev_exec_model(wan_dev_exec *x, const wan_model *m) {
    slot *s = get(x, m);
    return s ? &s->d : NULL;
}

int wan_dev_exec_sync(wan_dev_exec *x, const wan_model *m, int64_t version) {
    slot *s = find(x, m);
    if (s && s->known && s->version == version && s->d.lora == m->lora) return 0;
    if (!s) { /* new: get() uploads */
        if (!(s = get(x, m))) return -1;
    } else if (m->lora && s->d.lora == m->lora ? wan_dev_model_upload_lora(&s->d) /* LoRA: the base is frozen */
                                               : wan_dev_model_upload(&s->d)) {
        return -1;
    }
    if (s->in_window) x->resident = s;
    s->version = version, s->known = 1;
    return 0;
}

int wan_dev_exec_window(wan_dev_exec *x, const wan_model *a, const wan_model *b) {
    if (a == b || a->lora || b->lora || !wan_config_equal(&a->cfg, &b->cfg) || a->layout.numel != b->layout.numel)
        return core_error("wan_dev_exec_window: two distinct models of one config without adapters");
    if (find(x, b)) return core_error("wan_dev_exec_window: the second model has a device copy already");
    slot *sa = get(x, a);
    if (!sa || wan_dev_alloc_grads(&sa->d)) return core_error_push("wan_dev_exec_window: ");
    if (sa->d.window || sa->d.base_borrowed) return core_error("wan_dev_exec_window: the first model is a view");
    slot *sb = new_slot(x);
    if (!sb) return -1;
    const wan_config *c = &b->cfg;
    const size_t pb = (size_t)(c->out_channels * c->patch_size[0] * c->patch_size[1] * c->patch_size[2]) * sizeof(float);
    /* b's own proj_out.bias; the window keeps a's weights, which a's copy just uploaded (or held) */
    sb->d = (wan_dev_model){.dev = x->dev, .host = b, .w = sa->d.w, .grads = sa->d.grads, .window = 1};
    if (!(sb->d.proj_out_b = x->dev->mem_alloc(pb)) || x->dev->mem_upload(sb->d.proj_out_b, b->w.proj_out_b, pb)) {
        core_error_push("wan_dev_exec_window: ");
        wan_dev_model_free(&sb->d);
        free(sb);
        return -1;
    }
    sb->host = b, sb->in_window = 1, sa->in_window = 1;
    x->s[x->n++] = sb;
    x->resident = sa;
    return 0;
}

int wan_dev_exec_set_resident(wan_dev_exec *x, const wan_model *m) {
    slot *s = m ? find(x, m) : NULL;
    if (m && (!s || !s->in_window)) return core_error("wan_dev_exec_set_resident: the model has no window");
    x->resident = s;
    return 0;
}

int wan_dev_exec_resident(const wan_dev_exec *x, const wan_model *m) {
    for (int i = 0; i < x->n; i++)
        if (x->s[i]->host == m) return !x->s[i]->in_window || x->resident == x->s[i];
    return 1;
}

/* A windowed expert's forward or backward only while its weights are in the window. */
static int check_resident(const wan_dev_exec *x, const slot *s) {
    if (!s->in_window || x->resident == s) return 0;
    return core_error("wan_dev_exec: this expert's weights are not on the device: the two experts share one window "
                      "(ZeRO stage 3 with both trained: trainer/dp/dp_dev.h), which holds %s",
                      x->resident ? "the other expert's" : "neither's (the optimizer step changed both)");
}

int wan_dev_exec_set_version(wan_dev_exec *x, const wan_model *m, int64_t version) {
    slot *s = get(x, m);
    if (!s) return -1;
    s->version = version, s->known = 1;
    return 0;
}

void wan_dev_exec_forget(wan_dev_exec *x, const wan_model *m) {
    if (!x) return;
    slot *s = find(x, m);
    if (!s) return;
    const kb_bf16 *w = s->d.base_borrowed || s->d.window ? NULL : s->d.w;
    if (s->in_window) x->resident = NULL;
    for (int i = 0; i < x->n;) /* m's slot, and the views borrowing its base or sharing its window */
        if (x->s[i] == s || (w && (x->s[i]->d.base_borrowed || x->s[i]->d.window) && x->s[i]->d.w == w)) {
            wan_dev_model_free(&x->s[i]->d);
            free(x->s[i]);
            x->s[i] = x->s[--x->n];
        } else {
            i++;
        }
}

wan_dev_acts *wan_dev_exec_acts(wan_dev_exec *x, const wan_config *cfg, const wan_shape *shape, wan_acts_mode mode,
                                int sp, int sp_rank) {
    return wan_dev_acts_new_sp(x->dev, cfg, shape, mode, sp, sp_rank);
}

/* At least n floats of device staging. */
static float *staging(wan_dev_exec *x, size_t n) {
    if (n <= x->io_floats) return x->io;
    x->dev->mem_free(x->io);
    x->io_floats = 0;
    if (!(x->io = x->dev->mem_alloc(n * sizeof(float))))
        return core_error_push("wan_dev_exec: %.1f MiB of staging: ", n * 4.0 / 1048576.0), NULL;
    x->io_floats = n;
    return x->io;
}

int wan_dev_exec_forward(wan_dev_exec *x, const wan_model *m, wan_dev_acts *a, float *out, const float *xin,
                         const float *timestep, const float *enc) {
    return wan_dev_exec_forward_lora(x, m, a, NULL, out, xin, timestep, enc, 1);
}

int wan_dev_exec_forward_lora(wan_dev_exec *x, const wan_model *m, wan_dev_acts *a, const wan_exec *ex, float *out,
                              const float *xin, const float *timestep, const float *enc, int use_lora) {
    const k_dev_ops *dev = x->dev;
    const wan_config *c = &m->cfg;
    const wan_shape *sh = &a->shape;
    const size_t vox = (size_t)sh->F * sh->H * sh->W;
    const size_t nx = (size_t)sh->B * c->in_channels * vox, no = (size_t)sh->B * c->out_channels * vox;
    const size_t ne = (size_t)sh->B * sh->L * c->text_dim;
    slot *s = get(x, m);
    if (s && check_resident(x, s)) return -1;
    float *io = s ? staging(x, nx + ne + no) : NULL;
    if (!io) return core_error_push("wan_dev_exec_forward: ");
    float *x_d = io, *e_d = io + nx, *o_d = io + nx + ne;
    if (dev->mem_upload(x_d, xin, nx * 4) || dev->mem_upload(e_d, enc, ne * 4) ||
        wan_dev_forward_sp(&s->d, a, ex, kb_out_f32(o_d), kb_in_f32(x_d), timestep, kb_in_f32(e_d), use_lora) ||
        dev->mem_download(out, o_d, no * 4) || dev->mem_sync())
        return core_error_push("wan_dev_exec_forward (%s): ", wan_dev_exec_name(x));
    return 0;
}

int wan_dev_exec_zero_grads(wan_dev_exec *x, const wan_model *m) {
    slot *s = get(x, m);
    if (!s || wan_dev_alloc_grads(&s->d) || wan_dev_zero_grads(&s->d)) return core_error_push("wan_dev_exec: ");
    return 0;
}

int wan_dev_exec_backward(wan_dev_exec *x, const wan_model *m, wan_dev_acts *a, const wan_exec *ex,
                          const float *dout) {
    const k_dev_ops *dev = x->dev;
    const wan_shape *sh = &a->shape;
    const size_t no = (size_t)sh->B * m->cfg.out_channels * sh->F * sh->H * sh->W;
    slot *s = get(x, m);
    if (s && check_resident(x, s)) return -1;
    float *g_d = s ? staging(x, no) : NULL;
    if (!g_d || wan_dev_alloc_grads(&s->d)) return core_error_push("wan_dev_exec_backward: ");
    if (dev->mem_upload(g_d, dout, no * 4) || wan_dev_backward_sp(&s->d, a, ex, WAN_NO_OUT, WAN_NO_OUT, kb_in_f32(g_d)) ||
        dev->mem_sync())
        return core_error_push("wan_dev_exec_backward (%s): ", wan_dev_exec_name(x));
    return 0;
}
