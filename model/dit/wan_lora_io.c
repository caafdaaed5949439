/* model/dit/wan_lora_io.c — LoRA adapter files: diffusers' pytorch_lora_weights.safetensors (pipeline form with
 * "transformer." keys, and the unprefixed form of WanTransformer3DModel.save_lora_adapter) and peft's
 * adapter_model.safetensors + adapter_config.json. Formats, references and refusals: wan_lora.h ("Files").
 *
 * The LoraConfig JSON we write holds only the fields whose values matter to a loader (r, lora_alpha,
 * target_modules, and the defaults a reader could otherwise take differently: bias, init_lora_weights, use_dora,
 * use_rslora, fan_in_fan_out, lora_dropout, empty rank/alpha patterns, peft_type). Not the ~40 fields peft 0.21
 * writes: LoraConfig(**fields) in an older peft refuses fields it does not know, and the ones left out default
 * to the values vgrpo computes with. */
#include "model/dit/wan_lora.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/safetensors.h"

#define DIFFUSERS_PREFIX "transformer."
#define PEFT_PREFIX "base_model.model."
#define METADATA_KEY "lora_adapter_metadata"

const char *wan_lora_format_name(wan_lora_format f) {
    switch (f) {
    case WAN_LORA_FMT_DIFFUSERS: return "diffusers";
    case WAN_LORA_FMT_DIFFUSERS_MODEL: return "diffusers-model";
    case WAN_LORA_FMT_PEFT: return "peft";
    default: return "none";
    }
}

static const char *fmt_prefix(wan_lora_format f) {
    return f == WAN_LORA_FMT_DIFFUSERS ? DIFFUSERS_PREFIX : f == WAN_LORA_FMT_PEFT ? PEFT_PREFIX : "";
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* ---- writing ---- */

/* The LoraConfig fields of l as a JSON object, every key prefixed with `prefix` ("" or "transformer."). */
static json_t *lora_config_json(const wan_lora *l, const char *prefix, int peft_folder) {
    json_t *o = json_object(), *targets = json_array();
    if (!o || !targets) {
        json_decref(o), json_decref(targets);
        return NULL;
    }
    for (int t = 0; t < WAN_LORA_NUM_TARGETS; t++)
        if (l->cfg.targets & WAN_LORA_MASK(t)) json_array_append_new(targets, json_string(wan_lora_target_name(t)));
    const double a = l->cfg.alpha;
    json_t *alpha = (a == floor(a) && fabs(a) < 9007199254740992.0) ? json_integer((json_int_t)a) : json_real(a);
    struct {
        const char *k;
        json_t *v;
    } f[] = {{"alpha_pattern", json_object()},     {"bias", json_string("none")},
             {"fan_in_fan_out", json_false()},     {"init_lora_weights", json_true()},
             {"lora_alpha", alpha},                {"lora_dropout", json_real(0.0)},
             {"peft_type", json_string("LORA")},   {"r", json_integer(l->cfg.rank)},
             {"rank_pattern", json_object()},      {"target_modules", targets},
             {"use_dora", json_false()},           {"use_rslora", json_false()}};
    char key[128];
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        snprintf(key, sizeof key, "%s%s", prefix, f[i].k);
        json_object_set_new(o, key, f[i].v);
    }
    if (peft_folder) { /* what PeftModel.save_pretrained adds for a diffusers model */
        json_t *am = json_object();
        json_object_set_new(am, "base_model_class", json_string("WanTransformer3DModel"));
        json_object_set_new(am, "parent_library", json_string("diffusers.models.transformers.transformer_wan"));
        json_object_set_new(o, "auto_mapping", am);
        json_object_set_new(o, "base_model_name_or_path", json_null());
        json_object_set_new(o, "inference_mode", json_true());
        json_object_set_new(o, "modules_to_save", json_null());
        json_object_set_new(o, "task_type", json_null());
    }
    return o;
}

static int add_tensors(st_writer *w, const wan_lora *l, const char *prefix, char (*names)[WAN_NAME_MAX + 32]) {
    for (int i = 0; i < l->layout.count; i++) {
        const wan_tensor *t = &l->layout.tensors[i];
        snprintf(names[i], WAN_NAME_MAX + 32, "%s%s", prefix, t->name);
        if (st_writer_add(w, names[i], CORE_F32, t->ndim, t->shape, l->params + t->offset)) return -1;
    }
    return 0;
}

static int write_st(const wan_lora *l, const char *path, const char *prefix, const char *metadata_json) {
    if (wan_layout_check_finite(&l->layout, l->params, path, prefix)) return core_error_push("not saved: ");
    char(*names)[WAN_NAME_MAX + 32] = calloc((size_t)l->layout.count + 1, sizeof *names);
    st_writer *w = names ? st_writer_new() : NULL;
    int rc = -1;
    if (!w) {
        if (!names) core_error("%s: out of memory", path);
        goto done;
    }
    rc = st_writer_set_metadata(w, "format", "pt");
    if (!rc && metadata_json) rc = st_writer_set_metadata(w, METADATA_KEY, metadata_json);
    if (!rc) rc = add_tensors(w, l, prefix, names);
    if (!rc) rc = st_writer_write(w, path);
done:
    st_writer_free(w);
    free(names);
    return rc;
}

int wan_lora_save_diffusers(const wan_lora *l, const char *path) {
    json_t *meta = lora_config_json(l, DIFFUSERS_PREFIX, 0);
    char *text = meta ? json_dumps(meta, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(meta);
    if (!text) return core_error("%s: out of memory", path);
    int rc = write_st(l, path, DIFFUSERS_PREFIX, text);
    free(text);
    return rc;
}

/* Writes text to path through path.tmp (flushed, fsync'd, renamed). */
static int write_text_atomic(const char *path, const char *text) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return core_error("%s: cannot write: %s", tmp, strerror(errno));
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        unlink(tmp);
        return core_error("%s: cannot write: %s", path, strerror(err));
    }
    if (rename(tmp, path)) {
        err = errno;
        unlink(tmp);
        return core_error("%s: cannot rename %s into place: %s", path, tmp, strerror(err));
    }
    return 0;
}

int wan_lora_save_peft(const wan_lora *l, const char *dir) {
    if (core_mkdir_p(dir)) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, WAN_LORA_PEFT_FILE);
    if (write_st(l, path, PEFT_PREFIX, NULL)) return -1;
    json_t *cfg = lora_config_json(l, "", 1);
    char *text = cfg ? json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/%s", dir, WAN_LORA_PEFT_CONFIG);
    if (!text) return core_error("%s: out of memory", path);
    int rc = write_text_atomic(path, text);
    free(text);
    return rc;
}

int wan_lora_save(const wan_lora *l, const char *dir) {
    if (wan_layout_check_finite(&l->layout, l->params, dir, "")) return core_error_push("not saved: ");
    if (core_mkdir_p(dir)) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, WAN_LORA_DIFFUSERS_FILE);
    if (wan_lora_save_diffusers(l, path)) return -1;
    return wan_lora_save_peft(l, dir);
}

/* ---- reading ---- */

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* key (prefix stripped) -> layer (-1 model level), target, which (0 lora_A, 1 lora_B). -1 with an error naming
 * the key when it is not the lora_A/lora_B weight of one of the 16 linears. */
static int parse_key(const char *file, const char *full, const char *key, int *layer, int *target, int *which) {
    const char *sfx[2] = {".lora_A.weight", ".lora_B.weight"};
    size_t n = strlen(key);
    *which = -1;
    for (int i = 0; i < 2; i++) {
        size_t k = strlen(sfx[i]);
        if (n > k && !strcmp(key + n - k, sfx[i])) *which = i, n -= k;
    }
    if (*which < 0) {
        const char *why = strstr(key, "lora_B.bias")            ? " (LoRA biases, peft's lora_bias=True, are not supported)"
                          : strstr(key, "lora_magnitude_vector") ? " (DoRA is not supported)"
                                                                 : " (expected <module>.lora_A.weight or .lora_B.weight)";
        return core_error("%s: key \"%s\" is not a LoRA weight vgrpo reads%s", file, full, why);
    }
    char module[256];
    if (n >= sizeof module) return core_error("%s: key \"%s\" is too long", file, full);
    memcpy(module, key, n);
    module[n] = 0;
    *layer = -1;
    const char *rest = module;
    if (!strncmp(module, "blocks.", 7)) {
        char *end;
        long v = strtol(module + 7, &end, 10);
        if (end == module + 7 || *end != '.' || v < 0 || v > 100000)
            return core_error("%s: key \"%s\": bad block index", file, full);
        *layer = (int)v;
        rest = end + 1;
    }
    for (int t = 0; t < WAN_LORA_NUM_TARGETS; t++)
        if (!strcmp(rest, wan_lora_target_name(t)) && wan_lora_target_is_block(t) == (*layer >= 0)) {
            *target = t;
            return 0;
        }
    char all[1024];
    return core_error("%s: key \"%s\": module \"%s\" is not one of the linears vgrpo adapts (%s)", file, full, module,
                      wan_lora_targets_format(WAN_LORA_ALL, all, sizeof all));
}

/* The LoraConfig fields vgrpo reads (from a prefix-filtered JSON object): r, lora_alpha, and the refusals. */
static int read_lora_fields(json_t *o, const char *prefix, const char *label, int rank, double *alpha,
                            int *have_alpha) {
    char key[128];
    json_t *v;
#define FIELD(name) (snprintf(key, sizeof key, "%s%s", prefix, name), json_object_get(o, key))
    if ((v = FIELD("peft_type")) && json_is_string(v) && strcmp(json_string_value(v), "LORA"))
        return core_error("%s: %s is \"%s\": only LORA adapters are read", label, key, json_string_value(v));
    if ((v = FIELD("r"))) {
        if (!json_is_integer(v)) return core_error("%s: %s: expected an integer", label, key);
        if (json_integer_value(v) != rank)
            return core_error("%s: %s is %lld but the lora_A weights have rank %d", label, key,
                              (long long)json_integer_value(v), rank);
    }
    *have_alpha = 0;
    if ((v = FIELD("lora_alpha"))) {
        if (!json_is_number(v)) return core_error("%s: %s: expected a number", label, key);
        *alpha = json_number_value(v);
        *have_alpha = 1;
    }
    const char *refused[] = {"use_rslora", "use_dora", "lora_bias", "fan_in_fan_out"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if ((v = FIELD(refused[i])) && json_is_true(v))
            return core_error("%s: %s is true: not supported (vgrpo's LoRA is y += alpha/r * x A^T B^T)", label, key);
    const char *patterns[] = {"rank_pattern", "alpha_pattern"};
    for (int i = 0; i < 2; i++) {
        v = FIELD(patterns[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_object(v)) return core_error("%s: %s: expected an object", label, key);
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            double want = i == 0 ? (double)rank : *alpha;
            if (!json_is_number(x) || json_number_value(x) != want)
                return core_error("%s: %s[\"%s\"]: per-module %s are not supported (all modules must have %s %g)",
                                  label, key, k, i == 0 ? "ranks" : "alphas", i == 0 ? "rank" : "alpha", want);
        }
    }
#undef FIELD
    return 0;
}

/* Finds the adapter file at path (file or folder) and its format. */
static int locate(const char *path, char *file, size_t cap, wan_lora_format *fmt, st_file **out) {
    *out = NULL;
    if (core_is_dir(path)) {
        snprintf(file, cap, "%s/%s", path, WAN_LORA_DIFFUSERS_FILE);
        if (!file_exists(file)) {
            snprintf(file, cap, "%s/%s", path, WAN_LORA_PEFT_FILE);
            if (!file_exists(file))
                return core_error("%s: no LoRA adapter here (looked for %s, and for %s with %s)", path,
                                  WAN_LORA_DIFFUSERS_FILE, WAN_LORA_PEFT_FILE, WAN_LORA_PEFT_CONFIG);
        }
    } else {
        snprintf(file, cap, "%s", path);
    }
    st_file *f = st_open(file);
    if (!f) return -1;
    const int n = st_count(f);
    if (n == 0) {
        st_close(f);
        return core_error("%s: holds no tensors (an adapter that loads as nothing)", file);
    }
    /* the form: any "transformer." key makes it diffusers' pipeline file, else any "base_model.model." key peft's */
    const char *k0 = NULL;
    *fmt = WAN_LORA_FMT_DIFFUSERS_MODEL;
    for (int i = 0; i < n && *fmt != WAN_LORA_FMT_DIFFUSERS; i++) {
        const char *k = st_name(f, i);
        if (!strncmp(k, DIFFUSERS_PREFIX, strlen(DIFFUSERS_PREFIX))) *fmt = WAN_LORA_FMT_DIFFUSERS, k0 = k;
        else if (!strncmp(k, PEFT_PREFIX, strlen(PEFT_PREFIX)) && !k0) *fmt = WAN_LORA_FMT_PEFT, k0 = k;
    }
    if (!k0) k0 = st_name(f, 0);
    const char *p = fmt_prefix(*fmt);
    for (int i = 0; i < n; i++)
        if (strncmp(st_name(f, i), p, strlen(p))) {
            const char *what = *fmt == WAN_LORA_FMT_DIFFUSERS_MODEL ? "no prefix" : p;
            core_error("%s: key \"%s\" does not share the file's key form (%s, from \"%s\"): not a "
                              "WanTransformer3DModel LoRA of one transformer",
                       file, st_name(f, i), what, k0);
            st_close(f);
            return -1;
        }
    *out = f;
    return 0;
}

/* Reads format fields (rank, alpha, targets) of the open file f. */
static int inspect_open(st_file *f, const char *file, wan_lora_format fmt, wan_lora_config *c) {
    memset(c, 0, sizeof *c);
    const char *prefix = fmt_prefix(fmt);
    const size_t pl = strlen(prefix);
    int rank = -1;
    for (int i = 0; i < st_count(f); i++) {
        const st_info *t = st_info_at(f, i);
        int layer, target, which;
        if (parse_key(file, t->name, t->name + pl, &layer, &target, &which)) return -1;
        char s[64];
        shape_str(s, sizeof s, t->ndim, t->shape);
        if (t->ndim != 2) return core_error("%s: key \"%s\" has shape %s, expected 2 dimensions", file, t->name, s);
        const int r = (int)(which == 0 ? t->shape[0] : t->shape[1]);
        if (rank < 0) rank = r;
        if (r != rank)
            return core_error("%s: key \"%s\" has shape %s: rank %d, but \"%s\" has rank %d (per-module ranks are "
                              "not supported)", file, t->name, s, r, st_name(f, 0), rank);
        if (t->dtype != CORE_F32 && t->dtype != CORE_BF16 && t->dtype != CORE_F16)
            return core_error("%s: key \"%s\" has dtype %s (F32, BF16 or F16 expected)", file, t->name,
                              core_dtype_name(t->dtype));
        c->targets |= WAN_LORA_MASK(target);
    }
    c->rank = rank;
    c->alpha = rank; /* diffusers' rule without metadata */
    double alpha = rank;
    int have = 0;
    if (fmt == WAN_LORA_FMT_PEFT) {
        char cfgpath[4200];
        snprintf(cfgpath, sizeof cfgpath, "%s", file);
        char *slash = strrchr(cfgpath, '/');
        snprintf(slash ? slash + 1 : cfgpath, sizeof cfgpath - (size_t)(slash ? slash + 1 - cfgpath : 0), "%s",
                 WAN_LORA_PEFT_CONFIG);
        json_t *o = core_json_load_object(cfgpath);
        if (!o) return core_error_push("peft adapter %s needs its %s: ", file, WAN_LORA_PEFT_CONFIG);
        int rc = read_lora_fields(o, "", cfgpath, rank, &alpha, &have);
        json_decref(o);
        if (rc) return -1;
        if (!have) return core_error("%s: lora_alpha is missing", cfgpath);
    } else {
        const char *meta = st_metadata(f, METADATA_KEY);
        if (meta) {
            char label[4300];
            snprintf(label, sizeof label, "%s: metadata %s", file, METADATA_KEY);
            json_t *o = core_json_parse_object(meta, label);
            if (!o) return -1;
            int rc = read_lora_fields(o, fmt == WAN_LORA_FMT_DIFFUSERS ? DIFFUSERS_PREFIX : "", label, rank, &alpha,
                                      &have);
            json_decref(o);
            if (rc) return -1;
        }
    }
    if (have) c->alpha = alpha;
    if (!(c->alpha > 0) || !isfinite(c->alpha))
        return core_error("%s: lora_alpha must be > 0, got %g", file, c->alpha);
    return 0;
}

int wan_lora_inspect(const char *path, wan_lora_config *c, wan_lora_format *fmt, char *file_out, size_t file_cap) {
    char file[4200];
    st_file *f;
    wan_lora_format fm = WAN_LORA_FMT_NONE;
    if (locate(path, file, sizeof file, &fm, &f)) return -1;
    int rc = inspect_open(f, file, fm, c);
    st_close(f);
    if (rc) return -1;
    if (fmt) *fmt = fm;
    if (file_out && file_cap) snprintf(file_out, file_cap, "%s", file);
    return 0;
}

/* Every key of f against the model: block index in range, shape = [r, in] or [out, r]. */
static int check_shapes(st_file *f, const char *file, wan_lora_format fmt, const wan_config *model, int rank) {
    const size_t pl = strlen(fmt_prefix(fmt));
    for (int i = 0; i < st_count(f); i++) {
        const st_info *t = st_info_at(f, i);
        int layer, target, which, in, out;
        if (parse_key(file, t->name, t->name + pl, &layer, &target, &which)) return -1;
        if (layer >= model->num_layers)
            return core_error("%s: unexpected key \"%s\": the transformer has %d blocks", file, t->name,
                              model->num_layers);
        wan_lora_target_dims(model, target, &in, &out);
        const int64_t want[2] = {which == 0 ? rank : out, which == 0 ? in : rank};
        if (t->shape[0] != want[0] || t->shape[1] != want[1]) {
            char a[64], b[64];
            shape_str(a, sizeof a, t->ndim, t->shape);
            shape_str(b, sizeof b, 2, want);
            return core_error("%s: key \"%s\" has shape %s, the model expects %s (%s: in %d, out %d; rank %d)", file,
                              t->name, a, b, wan_lora_target_name(target), in, out, rank);
        }
    }
    return 0;
}

/* Reads every tensor of l from f: each must be there; f must have no other key (checked by the caller's count). */
static int read_all(wan_lora *l, st_file *f, const char *file, wan_lora_format fmt) {
    const char *prefix = fmt_prefix(fmt);
    char key[WAN_NAME_MAX + 32];
    for (int i = 0; i < l->layout.count; i++) {
        const wan_tensor *t = &l->layout.tensors[i];
        snprintf(key, sizeof key, "%s%s", prefix, t->name);
        if (st_find(f, key) < 0)
            return core_error("%s: missing key \"%s\" (every block must have the same targets)", file, key);
    }
    if (st_count(f) != l->layout.count) /* every file key parsed into our layout, so a surplus is a duplicate form */
        return core_error("%s: %d tensors, the adapter has %d", file, st_count(f), l->layout.count);
    for (int i = 0; i < l->layout.count; i++) {
        const wan_tensor *t = &l->layout.tensors[i];
        snprintf(key, sizeof key, "%s%s", prefix, t->name);
        if (st_read_f32(f, key, l->params + t->offset, t->numel)) return -1;
    }
    return 0;
}

int wan_lora_load(wan_lora *l, const wan_config *model, const char *path, int expert) {
    memset(l, 0, sizeof *l);
    char file[4200];
    st_file *f;
    wan_lora_format fmt;
    wan_lora_config c;
    if (locate(path, file, sizeof file, &fmt, &f)) return -1;
    int rc = inspect_open(f, file, fmt, &c);
    if (!rc) rc = check_shapes(f, file, fmt, model, c.rank);
    if (!rc && wan_lora_init(l, model, &c, expert)) rc = core_error_push("%s: ", file);
    if (!rc) rc = read_all(l, f, file, fmt);
    st_close(f);
    if (rc) wan_lora_free(l);
    return rc;
}

int wan_lora_load_weights(wan_lora *l, const char *path) {
    char file[4200], a[1024], b[1024];
    st_file *f;
    wan_lora_format fmt;
    wan_lora_config c;
    if (locate(path, file, sizeof file, &fmt, &f)) return -1;
    int rc = inspect_open(f, file, fmt, &c);
    if (!rc && c.rank != l->cfg.rank) {
        const wan_tensor *t = &l->layout.tensors[0];
        rc = core_error("%s: rank %d, the adapter being loaded into has rank %d (its key \"%s%s\" is [%lld, %lld])",
                        file, c.rank, l->cfg.rank, fmt_prefix(fmt), t->name, (long long)t->shape[0],
                        (long long)t->shape[1]);
    }
    if (!rc && c.alpha != l->cfg.alpha)
        rc = core_error("%s: lora_alpha %g, the adapter being loaded into has alpha %g", file, c.alpha, l->cfg.alpha);
    for (int t = 0; t < WAN_LORA_NUM_TARGETS && !rc; t++) {
        const uint32_t bit = WAN_LORA_MASK(t);
        if ((c.targets & bit) == (l->cfg.targets & bit)) continue;
        char key[WAN_NAME_MAX + 32];
        snprintf(key, sizeof key, "%s%s%s.lora_A.weight", fmt_prefix(fmt), wan_lora_target_is_block(t) ? "blocks.0." : "",
                 wan_lora_target_name(t));
        rc = core_error("%s: %s key \"%s\": the file's targets are %s; the adapter being loaded into has %s", file,
                        (l->cfg.targets & bit) ? "missing" : "unexpected", key,
                        wan_lora_targets_format(c.targets, a, sizeof a),
                        wan_lora_targets_format(l->cfg.targets, b, sizeof b));
    }
    if (!rc) rc = check_shapes(f, file, fmt, &l->model, c.rank);
    if (!rc) rc = read_all(l, f, file, fmt);
    st_close(f);
    return rc;
}
