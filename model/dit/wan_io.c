/* model/dit/wan_io.c — loading and saving WanTransformer3DModel checkpoints in diffusers layout: a folder with
 * config.json and diffusion_pytorch_model.safetensors, or diffusion_pytorch_model.safetensors.index.json and its
 * shards (diffusers ModelMixin.save_pretrained / from_pretrained). Weights on disk may be F32, BF16 or F16; vgrpo
 * keeps F32 and writes F32. The match between checkpoint and model is exact, as from_pretrained's strict load:
 * every tensor present, none extra, every shape equal. */
#include "model/dit/wan_dit.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/safetensors.h"

/* diffusers' default max_shard_size ("10GB"): one file below it, shards above. */
#define WAN_SAVE_SHARD_BYTES ((uint64_t)10000000000ull)

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Checks the open checkpoint s against layout L: no tensor extra, none missing, shapes equal, dtype F32/BF16/F16.
 * Returns 0 or -1 naming dir and the tensor. */
static int check_checkpoint(const wan_layout *L, st_set *s, const char *dir) {
    int rc = 0;
    /* Extra tensors and shape/dtype mismatches, in the checkpoint's (sorted) order. */
    for (int i = 0; i < st_set_count(s) && !rc; i++) {
        const st_info *t = st_set_info_at(s, i);
        int j = wan_layout_find(L, t->name);
        if (j < 0) {
            rc = core_error("%s: unexpected tensor \"%s\" (not a parameter of this WanTransformer3DModel config)",
                            dir, t->name);
            break;
        }
        const wan_tensor *w = &L->tensors[j];
        int same = t->ndim == w->ndim;
        for (int d = 0; same && d < w->ndim; d++) same = t->shape[d] == w->shape[d];
        if (!same) {
            char a[128], b[128];
            shape_str(a, sizeof a, t->ndim, t->shape);
            shape_str(b, sizeof b, w->ndim, w->shape);
            rc = core_error("%s: tensor \"%s\" has shape %s, expected %s", dir, t->name, a, b);
            break;
        }
        if (t->dtype != CORE_F32 && t->dtype != CORE_BF16 && t->dtype != CORE_F16) {
            rc = core_error("%s: tensor \"%s\" has dtype %s (F32, BF16 or F16 expected)", dir, t->name,
                            core_dtype_name(t->dtype));
            break;
        }
    }
    /* Missing tensors, in state_dict order. */
    for (int j = 0; j < L->count && !rc; j++)
        if (st_set_find(s, L->tensors[j].name) < 0)
            rc = core_error("%s: missing tensor \"%s\"", dir, L->tensors[j].name);
    return rc;
}

int wan_model_load_weights(wan_model *m, const char *dir) {
    st_set *s = st_open_dir(dir);
    if (!s) return -1;
    const wan_layout *L = &m->layout;
    int rc = check_checkpoint(L, s, dir);
    for (int j = 0; j < L->count && !rc; j++) {
        const wan_tensor *w = &L->tensors[j];
        rc = st_set_read_f32(s, w->name, m->params + w->offset, w->numel);
    }
    st_set_close(s);
    return rc;
}

int wan_model_load(wan_model *m, const char *dir) {
    memset(m, 0, sizeof *m);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    wan_config cfg;
    if (wan_config_load(&cfg, path)) return -1;
    /* Check the checkpoint against the config before allocating the parameters (GBs at real sizes). */
    wan_layout L;
    if (wan_layout_init(&L, &cfg)) return -1;
    st_set *s = st_open_dir(dir);
    int rc = s ? check_checkpoint(&L, s, dir) : -1;
    if (s) st_set_close(s);
    wan_layout_free(&L);
    if (rc) return -1;
    if (wan_model_init(m, &cfg)) return -1;
    if (wan_model_load_weights(m, dir)) {
        wan_model_free(m);
        return -1;
    }
    return 0;
}

int wan_model_save(const wan_model *m, const char *dir) {
    if (wan_layout_check_finite(&m->layout, m->params, dir, "")) return core_error_push("not saved: ");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return core_error("%s: cannot create folder: %s", dir, strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (wan_config_save(&m->cfg, path)) return -1;
    st_writer *w = st_writer_new();
    if (!w) return -1;
    int rc = st_writer_set_metadata(w, "format", "pt");
    for (int j = 0; j < m->layout.count && !rc; j++) {
        const wan_tensor *t = &m->layout.tensors[j];
        rc = st_writer_add(w, t->name, CORE_F32, t->ndim, t->shape, m->params + t->offset);
    }
    if (!rc) rc = st_writer_write_sharded(w, dir, "diffusion_pytorch_model", WAN_SAVE_SHARD_BYTES);
    st_writer_free(w);
    if (rc) return core_error_push("saving %s: ", dir);
    return 0;
}
