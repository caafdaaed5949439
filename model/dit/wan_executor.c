/* model/dit/wan_executor.c — the DiT on the backend its wan_exec names (wan_executor.h): the CPU model or the device
 * executor, the choice made here once instead of at every call site. */
#include <stdlib.h>

#include "core/error.h"
#include "model/dit/wan_dev_exec.h"
#include "model/dit/wan_executor.h"
#include "model/dit/wan_lora.h"
#include "sp/comm.h"

struct wan_exec_acts {
    wan_acts *cpu;     /* the fp32 CPU model's, or NULL */
    wan_dev_acts *dev; /* the device executor's, or NULL */
};

wan_exec_acts *wan_exec_acts_new(const wan_exec *ex, const wan_config *cfg, const wan_shape *shape,
                                 wan_acts_mode mode) {
    wan_exec_acts *a = calloc(1, sizeof *a);
    if (!a) return core_error("wan_exec_acts_new: out of memory"), NULL;
    const int sp = ex && ex->sp ? ex->sp->size : 1, sp_rank = ex && ex->sp ? ex->sp->rank : 0;
    if (ex && ex->dev) a->dev = wan_dev_exec_acts(ex->dev, cfg, shape, mode, sp, sp_rank);
    else a->cpu = wan_acts_new_sp(cfg, shape, mode, sp, sp_rank);
    if (!a->cpu && !a->dev) {
        free(a);
        return NULL;
    }
    return a;
}

void wan_exec_acts_free(wan_exec_acts *a) {
    if (!a) return;
    wan_acts_free(a->cpu);
    wan_dev_acts_free(a->dev);
    free(a);
}

/* 0 when a was made for the backend ex runs on, else -1 naming who. */
static int check_where(const wan_exec *ex, const wan_exec_acts *a, const char *who) {
    const int on_dev = ex && ex->dev;
    if (on_dev == (a->dev != NULL)) return 0;
    return core_error("%s: the activations were made for %s but wan_exec runs on %s (wan_exec_acts_new with this "
                      "wan_exec)", who, a->dev ? "a device" : "the CPU", on_dev ? "a device" : "the CPU");
}

int wan_exec_forward(const wan_model *m, wan_exec_acts *a, const wan_exec *ex, float *out, const float *x,
                     const float *timestep, const float *enc) {
    if (check_where(ex, a, "wan_exec_forward")) return -1;
    if (a->dev) return wan_dev_exec_forward_lora(ex->dev, m, a->dev, ex, out, x, timestep, enc, !ex->lora_off);
    return wan_forward(m, a->cpu, ex, out, x, timestep, enc);
}

int wan_exec_backward(wan_model *m, wan_exec_acts *a, const wan_exec *ex, const float *dout) {
    if (check_where(ex, a, "wan_exec_backward")) return -1;
    if (a->dev) return wan_dev_exec_backward(ex->dev, m, a->dev, ex, dout);
    return wan_backward(m, a->cpu, ex, NULL, NULL, dout);
}

int wan_exec_zero_grads(const wan_exec *ex, wan_model *m) {
    if (ex && ex->dev) return wan_dev_exec_zero_grads(ex->dev, m);
    if (m->lora && !m->grads) wan_lora_zero_grads(m->lora);
    else wan_model_zero_grads(m);
    return 0;
}
