/* core/wire_sync.c — the weight sync's same-host handshake (see core/wire_sync.h). */
#include "core/wire_sync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/wire_rollout.h"

void core_sync_host_id(char *buf, size_t cap) {
    char host[64] = "", boot[64] = "";
    if (gethostname(host, sizeof host - 1)) host[0] = 0;
    host[sizeof host - 1] = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\r\n")] = 0;
    }
    snprintf(buf, cap, "%s%s%s", host, boot[0] ? "/" : "", boot);
}

static const char *folder(int e) { return e ? "transformer_2" : "transformer"; }

json_t *core_sync_ipc_json(const core_sync_ipc *x, int n) {
    json_t *a = json_array();
    for (int k = 0; a && k < n; k++) {
        char hex[2 * CORE_SYNC_HANDLE_BYTES + 1];
        for (int i = 0; i < CORE_SYNC_HANDLE_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", x[k].handle[i]);
        if (json_array_append_new(a, json_pack("{s:s, s:s, s:I}", "expert", folder(x[k].expert), "handle", hex,
                                               "elements", (json_int_t)x[k].elements))) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int core_sync_ipc_parse(const json_t *arr, int n_experts, core_sync_ipc *out, int cap, int *n) {
    *n = 0;
    if (!json_is_array(arr) || json_array_size(arr) < 1 || (int)json_array_size(arr) > cap ||
        (int)json_array_size(arr) > n_experts)
        return core_error("weights_begin: \"ipc\" must be an array of 1 to %d entries", n_experts < cap ? n_experts : cap);
    for (size_t k = 0; k < json_array_size(arr); k++) {
        const json_t *o = json_array_get(arr, k);
        const char *ex = json_string_value(json_object_get(o, "expert"));
        const char *h = json_string_value(json_object_get(o, "handle"));
        const json_t *el = json_object_get(o, "elements");
        core_sync_ipc *x = &out[k];
        x->expert = ex && !strcmp(ex, "transformer") ? 0 : ex && !strcmp(ex, "transformer_2") ? 1 : -1;
        if (x->expert < 0 || x->expert >= n_experts)
            return core_error("weights_begin: \"ipc\"[%zu].expert must name an expert of this worker", k);
        for (size_t j = 0; j < k; j++)
            if (out[j].expert == x->expert) return core_error("weights_begin: \"ipc\"[%zu] names %s twice", k, ex);
        if (!json_is_integer(el) || json_integer_value(el) < 1)
            return core_error("weights_begin: \"ipc\"[%zu].elements must be an integer >= 1", k);
        x->elements = json_integer_value(el);
        if (!h || strlen(h) != 2 * CORE_SYNC_HANDLE_BYTES)
            return core_error("weights_begin: \"ipc\"[%zu].handle must be %d hex digits", k, 2 * CORE_SYNC_HANDLE_BYTES);
        for (int i = 0; i < CORE_SYNC_HANDLE_BYTES; i++) {
            const int hi = hexval(h[2 * i]), lo = hexval(h[2 * i + 1]);
            if (hi < 0 || lo < 0)
                return core_error("weights_begin: \"ipc\"[%zu].handle must be lower-case hex digits", k);
            x->handle[i] = (uint8_t)(hi << 4 | lo);
        }
        (*n)++;
    }
    return 0;
}

json_t *core_sync_buckets_json(const core_sync_bucket *b, int n) {
    json_t *a = json_array();
    for (int k = 0; a && k < n; k++) {
        char hx[17];
        core_hash_hex(b[k].xxh64, hx);
        if (json_array_append_new(a, json_pack("{s:s, s:i, s:I, s:I, s:s}", "expert", folder(b[k].expert), "index",
                                               b[k].index, "offset", (json_int_t)b[k].offset, "count",
                                               (json_int_t)b[k].count, "xxh64", hx))) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

int core_sync_buckets_parse(const json_t *arr, int n_experts, core_sync_bucket **out, int *n) {
    *out = NULL, *n = 0;
    if (!json_is_array(arr) || json_array_size(arr) < 1 || json_array_size(arr) > (1u << 24))
        return core_error("weights_begin: \"ipc_buckets\" must be an array of at least 1 bucket");
    const int nb = (int)json_array_size(arr);
    core_sync_bucket *b = calloc((size_t)nb, sizeof *b);
    if (!b) return core_error("out of memory");
    for (int k = 0; k < nb; k++) {
        const json_t *o = json_array_get(arr, (size_t)k);
        const char *ex = json_string_value(json_object_get(o, "expert"));
        const json_t *ji = json_object_get(o, "index"), *jo = json_object_get(o, "offset"), *jc = json_object_get(o, "count");
        b[k].expert = ex && !strcmp(ex, "transformer") ? 0 : ex && !strcmp(ex, "transformer_2") ? 1 : -1;
        int bad = b[k].expert < 0 || b[k].expert >= n_experts || !json_is_integer(ji) || json_integer_value(ji) != k ||
                  !json_is_integer(jo) || json_integer_value(jo) < 0 || !json_is_integer(jc) ||
                  json_integer_value(jc) < 1 || core_hash_parse(json_string_value(json_object_get(o, "xxh64")),
                                                                &b[k].xxh64);
        if (bad) {
            free(b);
            return core_error("weights_begin: \"ipc_buckets\"[%d] must be {\"expert\": an expert of this worker, "
                              "\"index\": %d, \"offset\" >= 0, \"count\" >= 1, \"xxh64\": 16 hex digits}", k, k);
        }
        b[k].index = k, b[k].offset = json_integer_value(jo), b[k].count = json_integer_value(jc);
    }
    *out = b, *n = nb;
    return 0;
}

int core_sync_ipc_choose(const core_sync_side *ctl, const core_sync_side *worker, char *why, size_t cap) {
    if (!ctl->ipc) return snprintf(why, cap, "the trainer's weights are not on a device that exports them"), 0;
    if (!worker->ipc) return snprintf(why, cap, "the worker has no device that opens IPC handles"), 0;
    if (worker->refused) return snprintf(why, cap, "the worker refused IPC before: %s", worker->refused), 0;
    if (!ctl->host_id || !ctl->host_id[0] || !worker->host_id || !worker->host_id[0])
        return snprintf(why, cap, "a host identity is unknown"), 0;
    if (strcmp(ctl->host_id, worker->host_id))
        return snprintf(why, cap, "the worker is on another host (%s vs %s)", worker->host_id, ctl->host_id), 0;
    snprintf(why, cap, "same host %s", ctl->host_id);
    return 1;
}
