/* tests/test_sync_ipc_dev.c — the weight sync by IPC into a worker's DEVICE weights (rollout/worker_ipc.h) on the
 * emulated device, without sockets: the controller's "ipc_buckets" (trainer/net/sync_bucket.h) over the trainer's
 * host copy; the worker copies each bucket device to device, hashes it, and rounds it into its bf16 device weights:
 *   - the device weights equal an upload of the trainer's fp32 weights bit for bit (bf16 weights, fp32
 *     proj_out.bias), at several bucket sizes (buckets within a tensor, across tensors, one for the model), the ack
 *     carries the trainer's whole-model hash, and the worker's host copy is untouched (no host staging);
 *   - a corrupted bucket (one element of the exported buffer changed after the hashes were taken) is refused naming
 *     the bucket, its element range and tensors; the device copy is dropped and, with the host copy current, the old
 *     version is kept (the next use uploads it); after a device update (host copy older) the worker serves none. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/log.h"
#include "core/wire_rollout.h"
#include "core/wire_sync.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/dit/wan_dev_exec.h"
#include "rollout/worker_msg.h"
#include "tests/test.h"
#include "trainer/net/sync_bucket.h"

typedef struct {
    int acks, errors;
    uint64_t ack_hash;
    char code[64], reason[1024];
} sink;

static int io_error(void *ctx, const char *id, const char *code, const char *reason) {
    (void)id;
    sink *k = ctx;
    k->errors++;
    snprintf(k->code, sizeof k->code, "%s", code);
    snprintf(k->reason, sizeof k->reason, "%s", reason);
    return 0;
}

static int io_fields(void *ctx, core_wire_type type, const char *id, const json_t *fields) {
    (void)id;
    sink *k = ctx;
    if (type == CORE_WIRE_WEIGHTS_ACK) {
        k->acks++;
        if (core_hash_parse(json_string_value(json_object_get(fields, "model_xxh64")), &k->ack_hash)) k->ack_hash = 0;
    }
    return 0;
}

static void send(rollout_worker_state *st, const rollout_worker_io *io, core_wire_type t, const char *id, json_t *f) {
    core_wire_built b;
    core_wire_msg m;
    REQUIRE_OK(core_wire_build(t, id, f, NULL, 0, &b));
    REQUIRE_OK(core_wire_parse(b.frames, b.n_frames, NULL, &m));
    CHECK(rollout_worker_handle(st, &m, io) == 0);
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    json_decref(f);
}

static const wan_config tiny = {.patch_size = {1, 2, 2}, .num_attention_heads = 2, .attention_head_dim = 8,
                                .in_channels = 4, .out_channels = 4, .text_dim = 8, .freq_dim = 8, .ffn_dim = 32,
                                .num_layers = 2, .cross_attn_norm = 1, .eps = 1e-6, .rope_max_seq_len = 16};

/* One IPC sync at version v: buf (n floats, the trainer's device buffer as exported) with the buckets' hashes taken
 * over host (the controller's host copy) at bucket_bytes, the whole-model hash h. */
static void sync_once(rollout_worker_state *st, sink *k, const wan_model *t, const float *host, const float *buf,
                      int64_t bucket_bytes, uint64_t h, int64_t v) {
    const k_dev_ops *dev = &k_emu_ops;
    const size_t bytes = sizeof(float) * (size_t)t->layout.numel;
    float *exp = dev->mem_alloc(bytes);
    REQUIRE(exp && dev->mem_upload(exp, buf, bytes) == 0);
    core_sync_ipc x = {.expert = 0, .elements = t->layout.numel};
    REQUIRE_OK(dev->ipc_export(exp, bytes, x.handle));
    const wan_layout *L[1] = {&t->layout};
    const float *P[1] = {host};
    const uint8_t send1[1] = {1};
    json_t *bk = sync_bucket_hashes_json(L, P, send1, 1, bucket_bytes);
    REQUIRE(bk != NULL);
    char hx[17];
    core_hash_hex(h, hx);
    const rollout_worker_io io = {.ctx = k, .send_error = io_error, .send_fields = io_fields};
    send(st, &io, CORE_WIRE_WEIGHTS_BEGIN, "w-begin",
         json_pack("{s:I, s:i, s:o, s:o}", "policy_version", (json_int_t)v, "tensors_count", t->layout.count, "ipc",
                   core_sync_ipc_json(&x, 1), "ipc_buckets", bk));
    send(st, &io, CORE_WIRE_WEIGHTS_END, "w-end", json_pack("{s:I, s:s}", "policy_version", (json_int_t)v, "model_xxh64", hx));
    REQUIRE_OK(dev->ipc_unexport(x.handle));
    dev->mem_free(exp);
}

TEST(sync_ipc_dev_device_to_device_bit_for_bit) {
    const k_dev_ops *dev = &k_emu_ops;
    wan_model t, w, before;
    REQUIRE_OK(wan_model_init(&t, &tiny));
    REQUIRE_OK(wan_model_init(&w, &tiny));
    REQUIRE_OK(wan_model_init(&before, &tiny));
    wan_params_init_random(&t, 31);
    wan_params_init_random(&w, 32);
    wan_params_init_random(&before, 32);
    const int64_t n = t.layout.numel;
    const wan_model *ms[1] = {&t};
    uint64_t h;
    REQUIRE_OK(wan_models_hash(ms, 1, &h));
    /* the reference: the trainer's weights uploaded to a device copy of their own */
    wan_dev_exec *rx = wan_dev_exec_new(dev), *wx = wan_dev_exec_new(dev);
    REQUIRE(rx && wx);
    const wan_dev_model *ref = wan_dev_exec_model(rx, &t);
    REQUIRE(ref != NULL);
    const int pout = 4 * 1 * 2 * 2;
    const core_log_level lvl = core_log_get_level();
    core_log_set_level(CORE_LOG_OFF);
    const int64_t sizes[3] = {1000, 4 * n / 3 + 4, (int64_t)1 << 30}; /* within and across tensors; one bucket */
    for (int s = 0; s < 3; s++) {
        rollout_worker_state st = {.model = {&w, NULL}, .n_experts = 1, .id = "w", .version = 0, .dev = dev, .dx = wx};
        sink k = {0};
        sync_once(&st, &k, &t, t.params, t.params, sizes[s], h, 3 + s);
        CHECK_MSG(k.acks == 1 && k.errors == 0 && k.ack_hash == h && st.version == 3 + s, "bucket %lld: %s: %s",
                  (long long)sizes[s], k.code, k.reason);
        const wan_dev_model *d = wan_dev_exec_model(wx, &w);
        REQUIRE(d != NULL);
        CHECK_MSG(!memcmp(d->w, ref->w, sizeof(kb_bf16) * (size_t)n), "bucket %lld: the bf16 device weights differ "
                  "from an upload of the trainer's", (long long)sizes[s]);
        CHECK(!memcmp(d->proj_out_b, ref->proj_out_b, sizeof(float) * pout));
        CHECK_MSG(!memcmp(w.params, before.params, sizeof(float) * (size_t)n), "the host copy was written");
        CHECK(st.stale[0] == 1);
        rollout_worker_state_free(&st);
        wan_dev_exec_forget(wx, &w);
    }
    /* corrupted: one element of bucket 2 changed in the exported buffer after the hashes were taken */
    float *bad = malloc(sizeof(float) * (size_t)n);
    REQUIRE(bad != NULL);
    memcpy(bad, t.params, sizeof(float) * (size_t)n);
    bad[2 * 250 + 7] += 1.0f;
    rollout_worker_state st = {.model = {&w, NULL}, .n_experts = 1, .id = "w", .version = 2, .dev = dev, .dx = wx};
    sink k = {0};
    sync_once(&st, &k, &t, t.params, bad, 1000, h, 9);
    CHECK_MSG(k.acks == 0 && k.errors == 1 && !strcmp(k.code, "weights_mismatch") &&
                  strstr(k.reason, "weights (IPC) bucket 2 (transformer elements [500, 750): ") &&
                  strstr(k.reason, "xxh64 of the bytes received is"), "%s: %s", k.code, k.reason);
    CHECK(st.version == 2); /* the host copy is current: version 2 stays, uploaded on the next use */
    /* a good update (the host copy is then older than the device), then a corrupted one: no version left */
    sync_once(&st, &k, &t, t.params, t.params, 1000, h, 10);
    CHECK(k.acks == 1 && st.version == 10);
    sync_once(&st, &k, &t, t.params, bad, 1000, h, 11);
    CHECK_MSG(k.errors == 2 && strstr(k.reason, "bucket 2") && st.version == -1, "version %lld: %s",
              (long long)st.version, k.reason);
    core_log_set_level(lvl);
    rollout_worker_state_free(&st);
    free(bad);
    wan_dev_exec_close(rx), wan_dev_exec_close(wx);
    wan_model_free(&t), wan_model_free(&w), wan_model_free(&before);
}
