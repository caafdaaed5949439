/* core/wire.c — parse and build wire-format messages (see core/wire.h and reward/PROTOCOL.md).
 *
 * The parser is the first code that sees a peer's bytes, so it trusts nothing: sizes are checked before the JSON
 * is parsed, the JSON before any field is read, and every field before a tensor frame is looked at. */
#include "core/wire.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const char *type_names[CORE_WIRE_TYPE_COUNT] = {
    "hello",          "rollout_request", "trajectory", "score_request", "score_reply", "weights_begin",
    "weights_tensor", "weights_end",     "weights_ack", "error",        "shutdown",
    "weights_bucket",
};

core_wire_limits core_wire_limits_default(void) {
    core_wire_limits l = {
        .max_header_bytes = (size_t)1 << 20,
        .max_frame_bytes = (size_t)4 << 30,
        .max_total_bytes = (size_t)8 << 30,
        .max_tensors = 65536,
    };
    return l;
}

const char *core_wire_type_name(core_wire_type t) {
    return (t >= 0 && t < CORE_WIRE_TYPE_COUNT) ? type_names[t] : NULL;
}

int core_wire_type_from_name(const char *name) {
    for (int i = 0; name && i < CORE_WIRE_TYPE_COUNT; i++)
        if (!strcmp(name, type_names[i])) return i;
    return -1;
}

int core_wire_nbytes(core_dtype dt, int ndim, const int64_t *shape, size_t *nbytes) {
    size_t n = core_dtype_size(dt);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return core_error("dimension %d is negative (%lld)", d, (long long)shape[d]);
        if ((uint64_t)shape[d] > SIZE_MAX || __builtin_mul_overflow(n, (size_t)shape[d], &n))
            return core_error("size overflows at dimension %d", d);
    }
    *nbytes = n;
    return 0;
}

void core_wire_msg_free(core_wire_msg *m) {
    if (!m) return;
    json_decref(m->header);
    free(m->tensors);
    memset(m, 0, sizeof *m);
}

const core_wire_tensor *core_wire_find(const core_wire_msg *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const core_wire_tensor *const *)a)->name, (*(const core_wire_tensor *const *)b)->name);
}

/* Error naming the first repeated name among ts[0..n), or 0 when all differ. */
static int check_unique(const core_wire_tensor *ts, int n, const char *what) {
    if (n < 2) return 0;
    const core_wire_tensor **p = malloc((size_t)n * sizeof *p);
    if (!p) return core_error("%s: out of memory", what);
    for (int i = 0; i < n; i++) p[i] = &ts[i];
    qsort(p, (size_t)n, sizeof *p, cmp_name);
    int rc = 0;
    for (int i = 1; i < n && !rc; i++)
        if (!strcmp(p[i - 1]->name, p[i]->name))
            rc = core_error("%s: tensor name \"%s\" appears twice in \"tensors\"", what, p[i]->name);
    free(p);
    return rc;
}

/* Fills t from the descriptor at tensors[i]; errors name the field. */
static int parse_desc(json_t *d, int i, core_wire_tensor *t) {
    if (!json_is_object(d)) return core_error("wire: header field \"tensors\"[%d] is not an object", i);
    json_t *name = json_object_get(d, "name"), *dtype = json_object_get(d, "dtype"), *shape = json_object_get(d, "shape");
    if (!json_is_string(name)) return core_error("wire: header field \"tensors\"[%d].name is missing or not a string", i);
    size_t nl = json_string_length(name);
    t->name = json_string_value(name);
    if (nl == 0 || nl > CORE_WIRE_MAX_NAME || strlen(t->name) != nl)
        return core_error("wire: header field \"tensors\"[%d].name has length %zu (must be 1..%d bytes, no NUL)", i, nl,
                          CORE_WIRE_MAX_NAME);
    if (!json_is_string(dtype))
        return core_error("wire: header field \"tensors\"[%d].dtype (tensor \"%s\") is missing or not a string", i, t->name);
    if (core_dtype_from_name(json_string_value(dtype), &t->dtype) != 0)
        return core_error_push("wire: header field \"tensors\"[%d].dtype (tensor \"%s\"): ", i, t->name);
    if (!json_is_array(shape))
        return core_error("wire: header field \"tensors\"[%d].shape (tensor \"%s\") is missing or not an array", i, t->name);
    size_t nd = json_array_size(shape);
    if (nd > CORE_MAX_DIMS)
        return core_error("wire: header field \"tensors\"[%d].shape (tensor \"%s\") has %zu dims (at most %d)", i, t->name,
                          nd, CORE_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t k = 0; k < nd; k++) {
        json_t *v = json_array_get(shape, k);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return core_error("wire: header field \"tensors\"[%d].shape[%zu] (tensor \"%s\") is not a non-negative integer",
                              i, k, t->name);
        t->shape[k] = (int64_t)json_integer_value(v);
    }
    if (core_wire_nbytes(t->dtype, t->ndim, t->shape, &t->nbytes) != 0)
        return core_error_push("wire: header field \"tensors\"[%d].shape (tensor \"%s\"): ", i, t->name);
    return 0;
}

int core_wire_parse(const core_wire_frame *frames, int n_frames, const core_wire_limits *lim, core_wire_msg *out) {
    memset(out, 0, sizeof *out);
    core_wire_limits dl = core_wire_limits_default();
    if (!lim) lim = &dl;
    if (n_frames < 1 || !frames) return core_error("wire: message has no frames (need a header frame)");
    if (n_frames - 1 > lim->max_tensors)
        return core_error("wire: message has %d tensor frames (limit %d)", n_frames - 1, lim->max_tensors);
    if (frames[0].len > lim->max_header_bytes)
        return core_error("wire: header frame is %zu bytes (limit %zu)", frames[0].len, lim->max_header_bytes);
    size_t total = frames[0].len;
    for (int i = 1; i < n_frames; i++) {
        if (frames[i].len > lim->max_frame_bytes)
            return core_error("wire: frame %d is %zu bytes (limit %zu per frame)", i, frames[i].len, lim->max_frame_bytes);
        if (__builtin_add_overflow(total, frames[i].len, &total) || total > lim->max_total_bytes)
            return core_error("wire: message is over the limit of %zu bytes", lim->max_total_bytes);
    }
    if (frames[0].len == 0 || !frames[0].data) return core_error("wire: header frame is empty");

    json_error_t je;
    json_t *h = json_loadb(frames[0].data, frames[0].len, JSON_REJECT_DUPLICATES, &je);
    if (!h) return core_error("wire: header is not valid JSON (byte %d): %s", je.position, je.text);
    out->header = h;
    if (!json_is_object(h)) {
        core_wire_msg_free(out);
        return core_error("wire: header is not a JSON object");
    }
    json_t *v = json_object_get(h, "v"), *ty = json_object_get(h, "type"), *id = json_object_get(h, "id");
    json_t *ts = json_object_get(h, "tensors");
    if (!v || !json_is_integer(v)) {
        core_wire_msg_free(out);
        return core_error("wire: header field \"v\" is missing or not an integer");
    }
    if (json_integer_value(v) != CORE_WIRE_VERSION) {
        long long got = json_integer_value(v);
        core_wire_msg_free(out);
        return core_error("wire: header field \"v\": unsupported protocol version %lld (this peer speaks %d)", got,
                          CORE_WIRE_VERSION);
    }
    if (!json_is_string(ty)) {
        core_wire_msg_free(out);
        return core_error("wire: header field \"type\" is missing or not a string");
    }
    int t = core_wire_type_from_name(json_string_value(ty));
    if (t < 0 || strlen(json_string_value(ty)) != json_string_length(ty)) {
        core_error("wire: header field \"type\": unknown message type \"%.64s\"", json_string_value(ty));
        core_wire_msg_free(out);
        return -1;
    }
    out->type = (core_wire_type)t;
    if (!json_is_string(id)) {
        core_wire_msg_free(out);
        return core_error("wire: header field \"id\" is missing or not a string");
    }
    size_t idl = json_string_length(id);
    if (idl > CORE_WIRE_MAX_ID || strlen(json_string_value(id)) != idl || (idl == 0 && t != CORE_WIRE_ERROR)) {
        core_wire_msg_free(out);
        return core_error("wire: header field \"id\" has length %zu (must be 1..%d bytes, no NUL)", idl, CORE_WIRE_MAX_ID);
    }
    out->id = json_string_value(id);
    if (ts && !json_is_array(ts)) {
        core_wire_msg_free(out);
        return core_error("wire: header field \"tensors\" is not an array");
    }
    size_t nt = ts ? json_array_size(ts) : 0;
    if (nt != (size_t)(n_frames - 1)) {
        core_wire_msg_free(out);
        return core_error("wire: header field \"tensors\" lists %zu tensors but the message has %d tensor frames", nt,
                          n_frames - 1);
    }
    if (nt) {
        out->tensors = calloc(nt, sizeof *out->tensors);
        if (!out->tensors) {
            core_wire_msg_free(out);
            return core_error("wire: out of memory for %zu tensors", nt);
        }
    }
    out->n_tensors = (int)nt;
    for (size_t i = 0; i < nt; i++) {
        core_wire_tensor *tt = &out->tensors[i];
        if (parse_desc(json_array_get(ts, i), (int)i, tt) != 0) {
            core_wire_msg_free(out);
            return -1;
        }
        const core_wire_frame *f = &frames[i + 1];
        if (f->len != tt->nbytes) {
            core_error("wire: frame %zu (tensor \"%s\", %s %d-d) is %zu bytes but its \"shape\" needs %zu", i + 1, tt->name,
                       core_dtype_name(tt->dtype), tt->ndim, f->len, tt->nbytes);
            core_wire_msg_free(out);
            return -1;
        }
        if (f->len && !f->data) {
            core_wire_msg_free(out);
            return core_error("wire: frame %zu has no data", i + 1);
        }
        tt->data = f->data;
    }
    if (check_unique(out->tensors, out->n_tensors, "wire: header field \"tensors\"") != 0) {
        core_wire_msg_free(out);
        return -1;
    }
    return 0;
}

void core_wire_built_free(core_wire_built *b) {
    if (!b) return;
    free(b->frames);
    free(b->header_text);
    memset(b, 0, sizeof *b);
}

int core_wire_build(core_wire_type type, const char *id, const json_t *fields, const core_wire_tensor *tensors,
                    int n_tensors, core_wire_built *out) {
    memset(out, 0, sizeof *out);
    const char *tn = core_wire_type_name(type);
    if (!tn) return core_error("wire build: unknown message type %d", (int)type);
    if (!id || strlen(id) > CORE_WIRE_MAX_ID || (!id[0] && type != CORE_WIRE_ERROR))
        return core_error("wire build: field \"id\" must be 1..%d bytes", CORE_WIRE_MAX_ID);
    if (n_tensors < 0 || (n_tensors > 0 && !tensors)) return core_error("wire build: bad tensor list");
    if (fields && !json_is_object(fields)) return core_error("wire build: type-specific fields are not a JSON object");
    static const char *reserved[] = {"v", "type", "id", "tensors"};
    for (int k = 0; fields && k < 4; k++)
        if (json_object_get(fields, reserved[k]))
            return core_error("wire build: field \"%s\" is reserved and may not be among the type-specific fields",
                              reserved[k]);
    for (int i = 0; i < n_tensors; i++) {
        const core_wire_tensor *t = &tensors[i];
        size_t nb = 0;
        if (!t->name || !t->name[0] || strlen(t->name) > CORE_WIRE_MAX_NAME)
            return core_error("wire build: tensor %d has an empty or over-long name", i);
        if ((int)t->dtype < 0 || t->dtype >= CORE_DTYPE_COUNT || t->ndim < 0 || t->ndim > CORE_MAX_DIMS)
            return core_error("wire build: tensor \"%s\" has a bad dtype or rank", t->name);
        if (core_wire_nbytes(t->dtype, t->ndim, t->shape, &nb) != 0)
            return core_error_push("wire build: tensor \"%s\": ", t->name);
        if (nb != t->nbytes || (nb && !t->data))
            return core_error("wire build: tensor \"%s\" has %zu bytes but its shape needs %zu", t->name, t->nbytes, nb);
    }
    if (check_unique(tensors, n_tensors, "wire build") != 0) return -1;

    json_t *h = json_object(), *arr = json_array();
    int bad = !h || !arr;
    bad |= json_object_set_new(h, "v", json_integer(CORE_WIRE_VERSION));
    bad |= json_object_set_new(h, "type", json_string(tn));
    bad |= json_object_set_new(h, "id", json_string(id));
    if (fields) bad |= json_object_update(h, (json_t *)fields);
    for (int i = 0; i < n_tensors && !bad; i++) {
        json_t *d = json_object(), *sh = json_array();
        bad |= !d || !sh;
        for (int k = 0; k < tensors[i].ndim && !bad; k++) bad |= json_array_append_new(sh, json_integer(tensors[i].shape[k]));
        bad |= json_object_set_new(d, "name", json_string(tensors[i].name));
        bad |= json_object_set_new(d, "dtype", json_string(core_dtype_name(tensors[i].dtype)));
        bad |= json_object_set_new(d, "shape", sh);
        bad |= json_array_append_new(arr, d);
    }
    bad |= json_object_set_new(h, "tensors", arr);
    if (bad) {
        json_decref(h);
        return core_error("wire build: could not build the header (bad UTF-8 in a string, or out of memory)");
    }
    out->header_text = json_dumps(h, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(h);
    out->frames = calloc((size_t)n_tensors + 1, sizeof *out->frames);
    if (!out->header_text || !out->frames) {
        core_wire_built_free(out);
        return core_error("wire build: out of memory");
    }
    out->n_frames = n_tensors + 1;
    out->frames[0].data = out->header_text;
    out->frames[0].len = strlen(out->header_text);
    for (int i = 0; i < n_tensors; i++) {
        out->frames[i + 1].data = tensors[i].data;
        out->frames[i + 1].len = tensors[i].nbytes;
    }
    return 0;
}
