/* trainer/net/sync_bucket.c — the buckets of a weight sync (see trainer/net/sync_bucket.h). */
#include "trainer/net/sync_bucket.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/wire_rollout.h"
#include "core/wire_sync.h"

int sync_bucket_plan(const wan_layout *const *layouts, const uint8_t *send, int n_experts, int64_t bucket_bytes,
                     sync_bucket *out, int cap) {
    if (bucket_bytes < (int64_t)sizeof(float))
        return core_error("weight sync: a bucket of %lld bytes holds no F32 element (parallel.sync_bucket_mib)",
                          (long long)bucket_bytes);
    const int64_t per = bucket_bytes / (int64_t)sizeof(float);
    int n = 0;
    for (int e = 0; e < n_experts; e++) {
        if (!send[e] || !layouts[e]) continue;
        for (int64_t off = 0; off < layouts[e]->numel; off += per, n++) {
            if (!out) continue;
            if (n >= cap) return core_error("weight sync: more than %d buckets", cap);
            const int64_t left = layouts[e]->numel - off;
            out[n] = (sync_bucket){.index = n, .expert = e, .offset = off, .count = left < per ? left : per};
        }
    }
    return n;
}

json_t *sync_bucket_hashes_json(const wan_layout *const *layouts, const float *const *params, const uint8_t *send,
                                int n_experts, int64_t bucket_bytes) {
    const int nb = sync_bucket_plan(layouts, send, n_experts, bucket_bytes, NULL, 0);
    if (nb < 0) return NULL;
    sync_bucket *bk = malloc(sizeof *bk * (size_t)(nb ? nb : 1));
    core_sync_bucket *h = malloc(sizeof *h * (size_t)(nb ? nb : 1));
    json_t *a = NULL;
    if (!bk || !h) core_error("out of memory");
    else if (sync_bucket_plan(layouts, send, n_experts, bucket_bytes, bk, nb) == nb) {
        for (int k = 0; k < nb; k++) /* the controller's side of the bucket hash: its host copy's bytes */
            h[k] = (core_sync_bucket){.index = k, .expert = bk[k].expert, .offset = bk[k].offset, .count = bk[k].count,
                                      .xxh64 = core_xxh64(params[bk[k].expert] + bk[k].offset,
                                                          sizeof(float) * (size_t)bk[k].count, 0)};
        if (!(a = core_sync_buckets_json(h, nb))) core_error("out of memory");
    }
    free(bk), free(h);
    return a;
}

/* The tensor of L holding element `pos` (tensors are back to back in layout order), or -1. */
static int tensor_at(const wan_layout *L, int64_t pos, int from) {
    for (int i = from < 0 ? 0 : from; i < L->count; i++)
        if (pos >= L->tensors[i].offset && pos < L->tensors[i].offset + L->tensors[i].numel) return i;
    return -1;
}

int sync_bucket_build(const char *id, const sync_bucket *b, const wan_layout *L, const float *params,
                      core_wire_built *out) {
    const int64_t end = b->offset + b->count;
    if (b->offset < 0 || b->count < 1 || end > L->numel)
        return core_error("weight sync: bucket %d [%lld, %lld) lies outside the %lld elements of %s", b->index,
                          (long long)b->offset, (long long)end, (long long)L->numel, wan_expert_folder(b->expert));
    const int first = tensor_at(L, b->offset, 0), last = tensor_at(L, end - 1, first);
    if (first < 0 || last < 0) return core_error("weight sync: bucket %d: the layout has a gap", b->index);
    const int np = last - first + 1;
    core_wire_tensor *t = calloc((size_t)np, sizeof *t);
    if (!t) return core_error("out of memory");
    for (int k = 0; k < np; k++) {
        const wan_tensor *x = &L->tensors[first + k];
        const int64_t lo = x->offset > b->offset ? x->offset : b->offset;
        const int64_t hi = x->offset + x->numel < end ? x->offset + x->numel : end;
        t[k] = (core_wire_tensor){.name = x->name, .dtype = CORE_F32, .ndim = 1, .shape = {hi - lo},
                                  .data = params + lo, .nbytes = sizeof(float) * (size_t)(hi - lo)};
    }
    char hx[17];
    /* the controller's side of the bucket hash: the bytes the frames point at, as they are sent */
    core_hash_hex(core_xxh64(params + b->offset, sizeof(float) * (size_t)b->count, 0), hx);
    json_t *f = json_pack("{s:s, s:i, s:I, s:s}", "expert", wan_expert_folder(b->expert), "index", b->index, "offset",
                          (json_int_t)b->offset, "xxh64", hx);
    const int rc = f ? core_wire_build(CORE_WIRE_WEIGHTS_BUCKET, id, f, t, np, out) : core_error("out of memory");
    json_decref(f);
    free(t);
    return rc;
}
