/* trainer/checkpoint/checkpoint.c — training checkpoints (see checkpoint.h): folders written under a temporary name, fsync'd
 * and renamed; weights through model/dit/wan_io.c, Adam moments through the safetensors writer, the trainer state as
 * JSON (jansson). The recipe text a checkpoint records and its diff are trainer/checkpoint/checkpoint_config.c; the run's
 * checkpoint folders (list, clean, prune, best) trainer/checkpoint/checkpoint_dir.c. */
#include "trainer/checkpoint/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/safetensors.h"
#include "model/dit/wan_lora.h"
#include "trainer/checkpoint/checkpoint_files.h"
#include "trainer/checkpoint/checkpoint_sums.h"

#define OPTIM_FILE "optimizer.safetensors"
#define STATE_FORMAT "vgrpo-trainer-state"
#define STATE_VERSION 2 /* 2: with the integrity record (files, tensors, state_xxh64) */
#define OPTIM_FORMAT "vgrpo-adamw"

/* An expert as the functions below see it: trainer_ckpt_expert's fields and, under LoRA, trainer_ckpt_lora's. */
typedef struct {
    const char *name;
    wan_model *model;
    optim_adamw *opt;
    wan_model *ema, *old;
    wan_lora *lora, *ema_lora, *old_lora;
} ckpt_ex;

static int to_ckpt_ex(const trainer_ckpt_expert *ex, const trainer_ckpt_lora *lx, int n_ex, ckpt_ex *out) {
    if (n_ex < 1 || n_ex > TRAINER_CKPT_MAX_EXPERTS) return core_error("checkpoint: %d experts (1 or 2)", n_ex);
    for (int e = 0; e < n_ex; e++)
        out[e] = (ckpt_ex){ex[e].name, ex[e].model, ex[e].opt, ex[e].ema, ex[e].old, lx ? lx[e].lora : NULL,
                           lx ? lx[e].ema : NULL, lx ? lx[e].old : NULL};
    return 0;
}

void trainer_ckpt_state_free(trainer_ckpt_state *s) {
    if (!s) return;
    free(s->config);
    free(s->guard);
    s->config = NULL;
    s->guard = NULL;
}

/* ------------------------------------------------------------------------------------------------------------
 * Resolving a path to a checkpoint */

int trainer_ckpt_resolve(const char *path, char *out, size_t cap) {
    char p[TRAINER_CKPT_PATH_MAX];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return core_error("%s: path too long", path);
    size_t l = strlen(p);
    while (l > 1 && p[l - 1] == '/') p[--l] = 0;
    if (!core_is_dir(p)) return core_error("%s: no such checkpoint folder", path);
    const char *base = strrchr(p, '/');
    base = base ? base + 1 : p;
    int64_t s;
    char f[TRAINER_CKPT_PATH_MAX + 32];
    snprintf(f, sizeof f, "%s/" STATE_FILE, p);
    if (ckpt_name_step(base, &s) || ckpt_is_file(f)) {
        if (snprintf(out, cap, "%s", p) >= (int)cap) return core_error("%s: path too long", p);
        return 0;
    }
    int64_t *steps;
    int n = trainer_ckpt_list(p, &steps);
    if (n < 0) return -1;
    if (n == 0)
        return core_error("%s: no complete checkpoint (no checkpoint-N folder; .checkpoint-N.tmp folders are "
                          "incomplete saves)", path);
    char why[2048] = "";
    int rc = -1;
    for (int i = n - 1; i >= 0 && rc; i--) {
        if (snprintf(out, cap, "%s/checkpoint-%" PRId64, p, steps[i]) >= (int)cap) {
            rc = core_error("%s: path too long", p);
            break;
        }
        if (!trainer_ckpt_verify(out, NULL)) {
            rc = 0;
            break;
        }
        core_log_warn("skipping checkpoint-%" PRId64 ": %s", steps[i], core_last_error());
        size_t l = strlen(why);
        snprintf(why + l, sizeof why - l, "%scheckpoint-%" PRId64 ": %s", l ? "; " : "", steps[i], core_last_error());
    }
    free(steps);
    if (rc && why[0]) core_error("%s: no checkpoint verifies (%s)", path, why);
    return rc;
}

int trainer_ckpt_transformer_dirs(const char *path, char dirs[TRAINER_CKPT_MAX_EXPERTS][TRAINER_CKPT_PATH_MAX]) {
    char ck[TRAINER_CKPT_PATH_MAX], f[TRAINER_CKPT_PATH_MAX + 64];
    if (trainer_ckpt_resolve(path, ck, sizeof ck)) return -1;
    static const char *names[TRAINER_CKPT_MAX_EXPERTS] = {"transformer", "transformer_2"};
    int n = 0;
    for (int e = 0; e < TRAINER_CKPT_MAX_EXPERTS; e++) {
        snprintf(f, sizeof f, "%s/%s", ck, names[e]);
        if (e > 0 && !core_is_dir(f)) break;
        snprintf(f, sizeof f, "%s/%s/config.json", ck, names[e]);
        if (!ckpt_is_file(f)) return core_error("%s: missing file %s/config.json", ck, names[e]);
        snprintf(dirs[e], TRAINER_CKPT_PATH_MAX, "%s/%s", ck, names[e]);
        n++;
    }
    return n;
}

/* ------------------------------------------------------------------------------------------------------------
 * Save */

static int write_file_sync(const char *path, const char *text) {
    FILE *f = core_fopen_nofollow(path, "wx"); /* new, in the checkpoint's fresh temporary folder */
    if (!f) return -1;
    size_t l = strlen(text);
    int rc = fwrite(text, 1, l, f) != l || fflush(f) ? core_error("%s: write failed: %s", path, strerror(errno)) : 0;
    if (!rc && fsync(fileno(f))) rc = core_error("%s: fsync failed: %s", path, strerror(errno));
    if (fclose(f) && !rc) rc = core_error("%s: close failed: %s", path, strerror(errno));
    return rc;
}

/* The tensors an expert's optimizer state covers: its LoRA adapter's, or its model's. */
static const wan_layout *ex_layout(const ckpt_ex *e) {
    return e->lora ? &e->lora->layout : &e->model->layout;
}

static int check_expert(const ckpt_ex *e) {
    if (!e->name || !*e->name || strlen(e->name) >= 32 || strchr(e->name, '/'))
        return core_error("checkpoint: bad expert folder name \"%s\"", e->name ? e->name : "(null)");
    if (!e->model || !e->opt || !e->model->params || !e->opt->m || !e->opt->v || (e->lora && !e->lora->params))
        return core_error("checkpoint: expert %s has no weights or optimizer state", e->name);
    if (e->opt->n != ex_layout(e)->numel)
        return core_error("checkpoint: expert %s: optimizer over %" PRId64 " values, %s has %" PRId64, e->name,
                          e->opt->n, e->lora ? "its LoRA adapter" : "model", ex_layout(e)->numel);
    if (e->ema_lora && !e->lora) return core_error("checkpoint: expert %s: an EMA adapter without an adapter", e->name);
    if (e->old_lora && !e->lora)
        return core_error("checkpoint: expert %s: an old policy's adapter without an adapter", e->name);
    return 0;
}

static int check_experts(const ckpt_ex *ex, int n_ex) {
    if (n_ex < 1 || n_ex > TRAINER_CKPT_MAX_EXPERTS) return core_error("checkpoint: %d experts (1 or 2)", n_ex);
    for (int e = 0; e < n_ex; e++)
        if (check_expert(&ex[e])) return -1;
    if (n_ex == 2 && !strcmp(ex[0].name, ex[1].name))
        return core_error("checkpoint: two experts named \"%s\"", ex[0].name);
    return 0;
}

/* Reads moment tensor `name` of parameter t into dst, the m or v of state o: all of it, or (a ZeRO shard,
 * trainer/dp/zero.h) the part of t inside o's parameters [lo, lo + len) only, so a rank never holds the whole file's
 * moments. The tensor's dtype and shape were checked (check_optimizer). */
static int read_moment(const st_file *f, const char *name, const optim_adamw *o, float *dst, const wan_tensor *t) {
    if (o->lo == 0 && o->len == o->n) return st_read_f32(f, name, dst + t->offset, t->numel);
    const int64_t a = t->offset > o->lo ? t->offset : o->lo;
    const int64_t b = t->offset + t->numel < o->lo + o->len ? t->offset + t->numel : o->lo + o->len;
    if (a >= b) return 0;
    core_tensor v;
    if (st_get(f, name, &v)) return -1;
    memcpy(dst + (a - o->lo), (const float *)v.data + (a - t->offset), sizeof(float) * (size_t)(b - a));
    core_tensor_free(&v);
    return 0;
}

static int write_optimizer(const char *path, const ckpt_ex *ex, int n_ex, const int64_t *steps) {
    for (int e = 0; e < n_ex; e++) /* ZeRO shards are gathered by the caller first (trainer/dp/zero.h) */
        if (ex[e].opt->lo != 0 || ex[e].opt->len != ex[e].opt->n)
            return core_error("checkpoint: expert %s: the AdamW state holds parameters %" PRId64 "..%" PRId64 " of %"
                              PRId64 " only (gather the shards first)", ex[e].name, ex[e].opt->lo,
                              ex[e].opt->lo + ex[e].opt->len, ex[e].opt->n);
    st_writer *w = st_writer_new();
    if (!w) return -1;
    int rc = st_writer_set_metadata(w, "format", OPTIM_FORMAT);
    char name[WAN_NAME_MAX + 64];
    for (int e = 0; e < n_ex && !rc; e++) {
        const wan_layout *L = ex_layout(&ex[e]);
        for (int j = 0; j < L->count && !rc; j++) {
            const wan_tensor *t = &L->tensors[j];
            snprintf(name, sizeof name, "%s/exp_avg/%s", ex[e].name, t->name);
            rc = st_writer_add(w, name, CORE_F32, t->ndim, t->shape, ex[e].opt->m + t->offset);
            snprintf(name, sizeof name, "%s/exp_avg_sq/%s", ex[e].name, t->name);
            if (!rc) rc = st_writer_add(w, name, CORE_F32, t->ndim, t->shape, ex[e].opt->v + t->offset);
        }
        snprintf(name, sizeof name, "%s/step", ex[e].name);
        if (!rc) rc = st_writer_add(w, name, CORE_I64, 0, NULL, &steps[e]);
    }
    if (!rc) rc = st_writer_write(w, path);
    st_writer_free(w);
    return rc;
}

/* trainer_state.json of the folder dir, whose other files are written: the state, then the integrity record of
 * those files (trainer/checkpoint/checkpoint_sums.h) and the state's own hash. */
static char *state_json(const trainer_ckpt_state *st, const ckpt_ex *ex, int n_ex, const char *dir) {
    char hash[17];
    snprintf(hash, sizeof hash, "%016" PRIx64, trainer_ckpt_config_hash(st->config));
    json_t *files, *tensors;
    if (trainer_ckpt_sums_record(dir, &files, &tensors)) return NULL;
    json_t *names = json_array();
    for (int e = 0; e < n_ex && names; e++) json_array_append_new(names, json_string(ex[e].name));
    char data_hash[17];
    snprintf(data_hash, sizeof data_hash, "%016" PRIx64, st->data_xxh64);
    /* "data_xxh64" only when the caller has it (a state without one reads back as written before it was kept) */
    json_t *o = json_pack("{s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:s*, s:I, s:o, s:s, s:s, s:o, s:o}", "format",
                          STATE_FORMAT, "version", STATE_VERSION, "step", (json_int_t)st->step, "policy_version",
                          (json_int_t)st->policy_version, "rollout_round", (json_int_t)st->rollout_round, "data_epoch",
                          (json_int_t)st->data_epoch, "data_position", (json_int_t)st->data_position, "data_size",
                          (json_int_t)st->data_size, "data_xxh64", st->has_data_xxh64 ? data_hash : NULL, "seed",
                          (json_int_t)st->seed, "experts", names, "config_hash", hash, "config", st->config, "files",
                          files, "tensors", tensors);
    if (o && st->run_id[0]) json_object_set_new(o, "run_id", json_string(st->run_id)); /* the run it belongs to */
    if (o && st->has_base_xxh64) { /* the reference's / LoRA base's weights as the run started */
        char base_hash[17];
        snprintf(base_hash, sizeof base_hash, "%016" PRIx64, st->base_xxh64);
        json_object_set_new(o, "base_xxh64", json_string(base_hash));
    }
    if (o && st->guard) { /* before the state's own hash */
        json_t *g = core_json_parse_object(st->guard, "the guard's state");
        if (!g) return json_decref(o), NULL;
        json_object_set_new(o, "guard", g);
    }
    uint64_t self;
    if (!o || trainer_ckpt_sums_state_hash(o, &self)) return json_decref(o), core_error("trainer state: out of memory"), NULL;
    snprintf(hash, sizeof hash, "%016" PRIx64, self);
    json_object_set_new(o, "state_xxh64", json_string(hash));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!s) return core_error("trainer state: out of memory"), NULL;
    size_t l = strlen(s);
    char *t = realloc(s, l + 2);
    if (!t) return free(s), core_error("trainer state: out of memory"), NULL;
    t[l] = '\n', t[l + 1] = 0;
    return t;
}

static int ckpt_save(const char *dir, const trainer_ckpt_state *st, const ckpt_ex *ex, int n_ex, int total_limit,
                     char *path, size_t path_cap);

/* Every value the checkpoint would hold is finite (a load refuses a non-finite one: trainer_ckpt_verify), checked
 * before anything is written: the weights (or adapter), the EMA, the Adam moments, named as in the files. */
static int check_finite_state(const ckpt_ex *ex, int n_ex, const char *fin) {
    for (int e = 0; e < n_ex; e++) {
        const int whole = ex[e].opt->lo == 0 && ex[e].opt->len == ex[e].opt->n; /* a shard: write_optimizer refuses */
        const struct {
            const float *x;
            const char *prefix;
        } b[5] = {{ex[e].lora ? ex[e].lora->params : ex[e].model->params, "%s/"},
                  {ex[e].ema_lora ? ex[e].ema_lora->params : ex[e].ema ? ex[e].ema->params : NULL, "ema/%s/"},
                  {ex[e].old_lora ? ex[e].old_lora->params : ex[e].old ? ex[e].old->params : NULL, "old/%s/"},
                  {whole ? ex[e].opt->m : NULL, "%s/exp_avg/"},
                  {whole ? ex[e].opt->v : NULL, "%s/exp_avg_sq/"}};
        for (int k = 0; k < 5; k++) {
            char pre[64];
            if (!b[k].x) continue;
            snprintf(pre, sizeof pre, b[k].prefix, ex[e].name);
            if (wan_layout_check_finite(ex_layout(&ex[e]), b[k].x, fin, pre))
                return core_error_push("nothing written: ");
        }
    }
    return 0;
}

int trainer_ckpt_save(const char *dir, const trainer_ckpt_state *st, const trainer_ckpt_expert *ex, int n_ex,
                      int total_limit, char *path, size_t path_cap) {
    return trainer_ckpt_save_lora(dir, st, ex, NULL, n_ex, total_limit, path, path_cap);
}

int trainer_ckpt_save_lora(const char *dir, const trainer_ckpt_state *st, const trainer_ckpt_expert *ex,
                           const trainer_ckpt_lora *lx, int n_ex, int total_limit, char *path, size_t path_cap) {
    ckpt_ex X[TRAINER_CKPT_MAX_EXPERTS];
    if (to_ckpt_ex(ex, lx, n_ex, X)) return -1;
    return ckpt_save(dir, st, X, n_ex, total_limit, path, path_cap);
}

static int ckpt_save(const char *dir, const trainer_ckpt_state *st, const ckpt_ex *ex, int n_ex, int total_limit,
                     char *path, size_t path_cap) {
    if (check_experts(ex, n_ex)) return -1;
    if (st->step < 0 || !st->config) return core_error("checkpoint: bad state (step %" PRId64 ")", st->step);
    char tmp[TRAINER_CKPT_PATH_MAX], fin[TRAINER_CKPT_PATH_MAX], old[TRAINER_CKPT_PATH_MAX], p[TRAINER_CKPT_PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s/.checkpoint-%" PRId64 ".tmp", dir, st->step) >= (int)sizeof tmp - 64)
        return core_error("%s: path too long", dir);
    snprintf(fin, sizeof fin, "%s/checkpoint-%" PRId64, dir, st->step);
    snprintf(old, sizeof old, "%s/.checkpoint-%" PRId64 ".old.tmp", dir, st->step);
    if (check_finite_state(ex, n_ex, fin)) return -1;
    if (core_mkdir_p(dir) || trainer_ckpt_clean(dir) < 0) return -1;
    if (mkdir(tmp, 0777)) return core_error("%s: cannot create folder: %s", tmp, strerror(errno));
    int64_t steps[TRAINER_CKPT_MAX_EXPERTS];
    char *js = NULL;
    int rc = -1;
    for (int e = 0; e < n_ex; e++) {
        snprintf(p, sizeof p, "%s/%s", tmp, ex[e].name);
        if (ex[e].lora ? wan_lora_save(ex[e].lora, p) : wan_model_save(ex[e].model, p)) goto fail;
        steps[e] = ex[e].opt->step;
        if (ex[e].ema_lora || ex[e].ema) {
            snprintf(p, sizeof p, "%s/ema/%s", tmp, ex[e].name);
            if (core_mkdir_p(p) || (ex[e].ema_lora ? wan_lora_save(ex[e].ema_lora, p) : wan_model_save(ex[e].ema, p)))
                goto fail;
        }
        if (ex[e].old_lora || ex[e].old) {
            snprintf(p, sizeof p, "%s/old/%s", tmp, ex[e].name);
            if (core_mkdir_p(p) || (ex[e].old_lora ? wan_lora_save(ex[e].old_lora, p) : wan_model_save(ex[e].old, p)))
                goto fail;
        }
    }
    snprintf(p, sizeof p, "%s/" OPTIM_FILE, tmp);
    if (write_optimizer(p, ex, n_ex, steps)) goto fail;
    snprintf(p, sizeof p, "%s/" STATE_FILE, tmp);
    if (!(js = state_json(st, ex, n_ex, tmp)) || write_file_sync(p, js)) goto fail;
    if (ckpt_sync_tree(tmp)) goto fail;
    if (core_is_dir(fin) && rename(fin, old)) {
        core_error("%s: cannot move the previous checkpoint aside: %s", fin, strerror(errno));
        goto fail;
    }
    if (rename(tmp, fin)) {
        core_error("%s: cannot rename %s into place: %s", fin, tmp, strerror(errno));
        if (core_is_dir(old)) rename(old, fin); /* put the previous checkpoint back */
        goto fail;
    }
    if (ckpt_fsync_path(dir) || ckpt_rm_tree(old)) goto done;
    if (total_limit > 0 && trainer_ckpt_prune(dir, total_limit, st->step) < 0) goto done;
    if (path && snprintf(path, path_cap, "%s", fin) >= (int)path_cap) {
        core_error("%s: path too long", fin);
        goto done;
    }
    rc = 0;
    goto done;
fail:
    core_error_push("saving checkpoint %s: ", fin);
    ckpt_rm_tree(tmp);
done:
    free(js);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * Load */

static int get_i64(json_t *o, const char *key, int64_t *out, const char *path) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return core_error("%s: field \"%s\": expected a non-negative integer", path, key);
    *out = (int64_t)json_integer_value(v);
    return 0;
}

/* Field key of o as 16 hex digits into *out: 1 when present, 0 when absent (optional), -1 with the error. */
static int get_hex64(json_t *o, const char *key, uint64_t *out, const char *path) {
    json_t *v = json_object_get(o, key);
    if (!v) return 0;
    char *e = NULL;
    if (!json_is_string(v) || strlen(json_string_value(v)) != 16 || (*out = strtoull(json_string_value(v), &e, 16), *e))
        return core_error("%s: field \"%s\": expected 16 hex digits", path, key);
    return 1;
}

/* trainer_ckpt_read_state, keeping the parsed object in *obj (json_decref it) for the integrity record. */
static int read_state(const char *ckpt, trainer_ckpt_state *st, json_t **obj) {
    memset(st, 0, sizeof *st);
    *obj = NULL;
    char path[TRAINER_CKPT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/" STATE_FILE, ckpt);
    if (!ckpt_is_file(path)) return core_error("%s: missing file " STATE_FILE " (incomplete checkpoint)", ckpt);
    json_t *o = core_json_load_object(path);
    if (!o) return -1;
    int rc = -1;
    json_t *v = json_object_get(o, "format");
    if (!json_is_string(v) || strcmp(json_string_value(v), STATE_FORMAT)) {
        core_error("%s: field \"format\": expected \"" STATE_FORMAT "\"", path);
        goto done;
    }
    v = json_object_get(o, "version");
    if (!json_is_integer(v) || json_integer_value(v) != STATE_VERSION) {
        core_error("%s: field \"version\": expected %d (written by another vgrpo version?%s)", path, STATE_VERSION,
                   json_is_integer(v) && json_integer_value(v) == 1 ? " version 1 has no checksums to verify" : "");
        goto done;
    }
    if (get_i64(o, "step", &st->step, path) || get_i64(o, "policy_version", &st->policy_version, path) ||
        get_i64(o, "rollout_round", &st->rollout_round, path) || get_i64(o, "data_epoch", &st->data_epoch, path) ||
        get_i64(o, "data_position", &st->data_position, path) || get_i64(o, "data_size", &st->data_size, path) ||
        get_i64(o, "seed", &st->seed, path))
        goto done;
    /* optional: checkpoints before the prompt hash have no data_xxh64, runs without a reference or LoRA no base */
    if ((st->has_data_xxh64 = get_hex64(o, "data_xxh64", &st->data_xxh64, path)) < 0 ||
        (st->has_base_xxh64 = get_hex64(o, "base_xxh64", &st->base_xxh64, path)) < 0)
        goto done;
    v = json_object_get(o, "run_id"); /* optional: checkpoints before it record no run */
    if (v && (!json_is_string(v) || strlen(json_string_value(v)) >= sizeof st->run_id)) {
        core_error("%s: field \"run_id\": expected a string of at most %zu bytes", path, sizeof st->run_id - 1);
        goto done;
    }
    if (v) snprintf(st->run_id, sizeof st->run_id, "%s", json_string_value(v));
    v = json_object_get(o, "experts");
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > TRAINER_CKPT_MAX_EXPERTS) {
        core_error("%s: field \"experts\": expected a list of 1 or 2 folder names", path);
        goto done;
    }
    st->n_experts = (int)json_array_size(v);
    for (int e = 0; e < st->n_experts; e++) {
        json_t *s = json_array_get(v, (size_t)e);
        if (!json_is_string(s) || !*json_string_value(s) || strlen(json_string_value(s)) >= 32 ||
            strchr(json_string_value(s), '/')) {
            core_error("%s: field \"experts\": entry %d is not a folder name", path, e);
            goto done;
        }
        snprintf(st->experts[e], sizeof st->experts[e], "%s", json_string_value(s));
    }
    json_t *c = json_object_get(o, "config");
    const int hh = get_hex64(o, "config_hash", &st->config_hash, path);
    if (hh <= 0) {
        if (!hh) core_error("%s: field \"config_hash\": expected 16 hex digits", path);
        goto done;
    }
    if (!json_is_string(c) || !(st->config = strdup(json_string_value(c)))) {
        core_error("%s: field \"config\": expected a string", path);
        goto done;
    }
    v = json_object_get(o, "guard");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v)) {
            core_error("%s: field \"guard\": expected an object", path);
            goto done;
        }
        if (!(st->guard = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)))) {
            core_error("%s: field \"guard\": out of memory", path);
            goto done;
        }
    }
    if (trainer_ckpt_config_hash(st->config) != st->config_hash) {
        core_error("%s: config_hash %016" PRIx64 " is not the hash of its config text (%016" PRIx64 "; edited file?)",
                   path, st->config_hash, trainer_ckpt_config_hash(st->config));
        goto done;
    }
    uint64_t want, got;
    const int hw = get_hex64(o, "state_xxh64", &want, path);
    if (hw <= 0) {
        if (!hw) core_error("%s: field \"state_xxh64\": expected 16 hex digits", path);
        goto done;
    }
    if (trainer_ckpt_sums_state_hash(o, &got)) goto done;
    if (got != want) {
        core_error("%s: damaged file: its fields hash to %016" PRIx64 ", its state_xxh64 says %016" PRIx64, path, got,
                   want);
        goto done;
    }
    rc = 0;
done:
    if (rc) {
        json_decref(o);
        trainer_ckpt_state_free(st);
    } else {
        *obj = o;
    }
    return rc;
}

int trainer_ckpt_read_state(const char *ckpt, trainer_ckpt_state *st) {
    json_t *o;
    if (read_state(ckpt, st, &o)) return -1;
    json_decref(o);
    return 0;
}

/* The checks of a checkpoint that do not depend on the run: its state (read_state), a folder named checkpoint-N
 * holds step N, the integrity record. On success st is the state (its config owned) and *obj the parsed state. */
static int verify(const char *ckpt, trainer_ckpt_state *st, json_t **obj) {
    if (read_state(ckpt, st, obj)) return -1;
    const char *base = strrchr(ckpt, '/');
    int64_t named;
    base = base ? base + 1 : ckpt;
    char label[TRAINER_CKPT_PATH_MAX + 32];
    snprintf(label, sizeof label, "%s/" STATE_FILE, ckpt);
    int rc = 0;
    if (ckpt_name_step(base, &named) && named != st->step)
        rc = core_error("%s: step %" PRId64 " but the folder is named %s", label, st->step, base);
    else
        rc = trainer_ckpt_sums_verify(ckpt, json_object_get(*obj, "files"), json_object_get(*obj, "tensors"), label);
    if (rc) {
        json_decref(*obj), *obj = NULL;
        trainer_ckpt_state_free(st);
    }
    return rc;
}

int trainer_ckpt_verify(const char *ckpt, trainer_ckpt_state *st) {
    trainer_ckpt_state tmp;
    json_t *o;
    if (verify(ckpt, st ? st : &tmp, &o)) return -1;
    json_decref(o);
    if (!st) trainer_ckpt_state_free(&tmp);
    return 0;
}

/* Checks that every file of the checkpoint is present, naming the first missing one. */
static int check_files(const char *ckpt, const ckpt_ex *ex, int n_ex) {
    char p[TRAINER_CKPT_PATH_MAX + 128];
    static const char *top[] = {STATE_FILE, OPTIM_FILE};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", ckpt, top[i]);
        if (!ckpt_is_file(p)) return core_error("%s: missing file %s (incomplete checkpoint)", ckpt, top[i]);
    }
    for (int e = 0; e < n_ex; e++) {
        if (ex[e].lora) { /* the adapter in both formats (wan_lora_save); the diffusers file is the one read back */
            snprintf(p, sizeof p, "%s/%s/" WAN_LORA_DIFFUSERS_FILE, ckpt, ex[e].name);
            if (!ckpt_is_file(p)) {
                snprintf(p, sizeof p, "%s/%s/config.json", ckpt, ex[e].name);
                return core_error("%s: missing file %s/" WAN_LORA_DIFFUSERS_FILE " (%s)", ckpt, ex[e].name,
                                  ckpt_is_file(p) ? "the checkpoint holds full weights, this run trains LoRA adapters "
                                               "(model.lora.rank)" : "incomplete checkpoint");
            }
            continue;
        }
        snprintf(p, sizeof p, "%s/%s/config.json", ckpt, ex[e].name);
        if (!ckpt_is_file(p)) {
            snprintf(p, sizeof p, "%s/%s/" WAN_LORA_DIFFUSERS_FILE, ckpt, ex[e].name);
            if (ckpt_is_file(p))
                return core_error("%s: %s/ holds a LoRA adapter (a checkpoint of a run with model.lora.rank >= 1); this "
                                  "run trains full weights (model.lora.rank 0)", ckpt, ex[e].name);
            return core_error("%s: missing file %s/config.json (incomplete checkpoint)", ckpt, ex[e].name);
        }
        snprintf(p, sizeof p, "%s/%s/diffusion_pytorch_model.safetensors", ckpt, ex[e].name);
        int single = ckpt_is_file(p);
        snprintf(p, sizeof p, "%s/%s/diffusion_pytorch_model.safetensors.index.json", ckpt, ex[e].name);
        if (!single && !ckpt_is_file(p))
            return core_error("%s: missing file %s/diffusion_pytorch_model.safetensors (incomplete checkpoint)", ckpt,
                              ex[e].name);
    }
    return 0;
}

/* Validates optimizer.safetensors against the experts' layouts: names, dtypes, shapes, nothing extra. */
static int check_optimizer(const st_file *f, const ckpt_ex *ex, int n_ex) {
    const char *path = st_label(f);
    for (int i = 0; i < st_count(f); i++) {
        const st_info *t = st_info_at(f, i);
        const char *slash = strchr(t->name, '/');
        int ok = 0;
        for (int e = 0; e < n_ex && slash && !ok; e++) {
            size_t l = strlen(ex[e].name);
            if ((size_t)(slash - t->name) != l || strncmp(t->name, ex[e].name, l)) continue;
            const char *rest = slash + 1, *pname = NULL;
            if (!strcmp(rest, "step")) {
                if (t->dtype != CORE_I64 || t->ndim != 0)
                    return core_error("%s: tensor \"%s\": expected an I64 scalar", path, t->name);
                ok = 1;
                break;
            }
            if (!strncmp(rest, "exp_avg/", 8)) pname = rest + 8;
            else if (!strncmp(rest, "exp_avg_sq/", 11)) pname = rest + 11;
            int j = pname ? wan_layout_find(ex_layout(&ex[e]), pname) : -1;
            if (j < 0) break;
            const wan_tensor *w = &ex_layout(&ex[e])->tensors[j];
            int same = t->ndim == w->ndim && t->dtype == CORE_F32;
            for (int d = 0; same && d < w->ndim; d++) same = t->shape[d] == w->shape[d];
            if (!same) return core_error("%s: tensor \"%s\": expected F32 with the parameter's shape", path, t->name);
            ok = 1;
        }
        if (!ok) return core_error("%s: unexpected tensor \"%s\" (not an optimizer state of this model)", path, t->name);
    }
    char name[WAN_NAME_MAX + 64];
    static const char *kinds[2] = {"exp_avg", "exp_avg_sq"};
    for (int e = 0; e < n_ex; e++) {
        snprintf(name, sizeof name, "%s/step", ex[e].name);
        if (st_find(f, name) < 0) return core_error("%s: missing tensor \"%s\"", path, name);
        const wan_layout *L = ex_layout(&ex[e]);
        for (int j = 0; j < L->count; j++)
            for (int k = 0; k < 2; k++) {
                snprintf(name, sizeof name, "%s/%s/%s", ex[e].name, kinds[k], L->tensors[j].name);
                if (st_find(f, name) < 0) return core_error("%s: missing tensor \"%s\"", path, name);
            }
    }
    return 0;
}

static int ckpt_load(const char *ckpt, const char *config_text, ckpt_ex *ex, int n_ex, trainer_ckpt_state *st);

int trainer_ckpt_load(const char *ckpt, const char *config_text, trainer_ckpt_expert *ex, int n_ex,
                      trainer_ckpt_state *st) {
    return trainer_ckpt_load_lora(ckpt, config_text, ex, NULL, n_ex, st);
}

int trainer_ckpt_load_lora(const char *ckpt, const char *config_text, trainer_ckpt_expert *ex,
                           const trainer_ckpt_lora *lx, int n_ex, trainer_ckpt_state *st) {
    ckpt_ex X[TRAINER_CKPT_MAX_EXPERTS];
    memset(st, 0, sizeof *st);
    if (to_ckpt_ex(ex, lx, n_ex, X)) return -1;
    return ckpt_load(ckpt, config_text, X, n_ex, st);
}

int trainer_ckpt_config_check(const char *ckpt, const trainer_ckpt_state *st, const char *config_text) {
    const uint64_t h = trainer_ckpt_config_hash(config_text);
    if (h == st->config_hash) return 0;
    if (trainer_ckpt_config_predates(st->config, config_text)) {
        core_log_info("%s: written before some of today's recipe keys; they are at values that compute as it did "
                      "(config hash %016" PRIx64 " vs checkpoint %016" PRIx64 ")", ckpt, h, st->config_hash);
        return 0;
    }
    char diff[1024];
    const int n = trainer_ckpt_config_diff(st->config, config_text, diff, sizeof diff);
    return core_error("%s: the recipe differs from the checkpoint's (config hash %016" PRIx64 " vs checkpoint %016" PRIx64
                      ")%s%s", ckpt, h, st->config_hash, n > 0 ? ": " : "", n > 0 ? diff : "");
}

static int ckpt_load(const char *ckpt, const char *config_text, ckpt_ex *ex, int n_ex, trainer_ckpt_state *st) {
    memset(st, 0, sizeof *st);
    if (check_experts(ex, n_ex)) return -1;
    json_t *obj;
    if (verify(ckpt, st, &obj)) return TRAINER_CKPT_DAMAGED;
    json_decref(obj);
    char p[TRAINER_CKPT_PATH_MAX + 128];
    st_file *f = NULL;
    int rc = -1;
    int same = st->n_experts == n_ex;
    for (int e = 0; e < n_ex && same; e++) same = !strcmp(st->experts[e], ex[e].name);
    if (!same) {
        core_error("%s/" STATE_FILE ": the checkpoint has %d expert(s) (%s%s%s), this run %d (%s%s%s)", ckpt,
                   st->n_experts, st->experts[0], st->n_experts > 1 ? ", " : "", st->n_experts > 1 ? st->experts[1] : "",
                   n_ex, ex[0].name, n_ex > 1 ? ", " : "", n_ex > 1 ? ex[1].name : "");
        goto done;
    }
    if (check_files(ckpt, ex, n_ex)) goto done;
    if (config_text && trainer_ckpt_config_check(ckpt, st, config_text)) goto done;
    for (int e = 0; e < n_ex; e++) {
        if (ex[e].lora) continue; /* the base is model.path's; the adapter's rank and targets are checked on reading */
        snprintf(p, sizeof p, "%s/%s/config.json", ckpt, ex[e].name);
        wan_config c;
        if (wan_config_load(&c, p)) goto done;
        if (!wan_config_equal(&c, &ex[e].model->cfg)) {
            core_error("%s: the transformer config differs from the run's model (%s)", p, "model.path");
            goto done;
        }
    }
    snprintf(p, sizeof p, "%s/" OPTIM_FILE, ckpt);
    if (!(f = st_open(p)) || check_optimizer(f, ex, n_ex)) goto done;
    for (int e = 0; e < n_ex; e++) {
        snprintf(p, sizeof p, "%s/%s", ckpt, ex[e].name);
        if (ex[e].lora ? wan_lora_load_weights(ex[e].lora, p) : wan_model_load_weights(ex[e].model, p)) goto done;
        if (ex[e].ema || ex[e].ema_lora) {
            snprintf(p, sizeof p, "%s/ema/%s", ckpt, ex[e].name);
            if (!core_is_dir(p)) {
                core_error("%s: missing (the run keeps an EMA of the weights: algorithm.ema_decay > 0)", p);
                goto done;
            }
            if (ex[e].ema_lora ? wan_lora_load_weights(ex[e].ema_lora, p) : wan_model_load_weights(ex[e].ema, p))
                goto done;
        }
        if (ex[e].old || ex[e].old_lora) {
            snprintf(p, sizeof p, "%s/old/%s", ckpt, ex[e].name);
            if (!core_is_dir(p)) {
                core_error("%s: missing (the run keeps an old policy: algorithm.loss %s)", p, "nft");
                goto done;
            }
            if (ex[e].old_lora ? wan_lora_load_weights(ex[e].old_lora, p) : wan_model_load_weights(ex[e].old, p))
                goto done;
        }
        char name[WAN_NAME_MAX + 64];
        const wan_layout *L = ex_layout(&ex[e]);
        for (int j = 0; j < L->count; j++) {
            const wan_tensor *t = &L->tensors[j];
            snprintf(name, sizeof name, "%s/exp_avg/%s", ex[e].name, t->name);
            if (read_moment(f, name, ex[e].opt, ex[e].opt->m, t)) goto done;
            snprintf(name, sizeof name, "%s/exp_avg_sq/%s", ex[e].name, t->name);
            if (read_moment(f, name, ex[e].opt, ex[e].opt->v, t)) goto done;
        }
        snprintf(name, sizeof name, "%s/step", ex[e].name);
        core_tensor s;
        if (st_get(f, name, &s)) goto done;
        int64_t step;
        memcpy(&step, s.data, sizeof step);
        core_tensor_free(&s);
        if (step < 0) {
            core_error("%s: tensor \"%s\" is negative (%" PRId64 ")", st_label(f), name, step);
            goto done;
        }
        ex[e].opt->step = step;
    }
    rc = 0;
done:
    st_close(f);
    if (rc) trainer_ckpt_state_free(st);
    return rc;
}
