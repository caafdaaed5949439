/* tests/mpi/mpi_sync_nccl.c — the weight sync by NCCL broadcast (trainer/net/sync_nccl.h, rollout/worker_ipc.h) over
 * the fake NCCL (VGRPO_NCCL_LIB) on the emulated device, without sockets: rank 0 is the controller's side (a tiny
 * model's fp32 master in device memory, broadcast bucket by bucket), ranks 1..K-1 are rollout workers with device
 * weights, each handling weights_begin ("nccl_buckets": the xxh64 of each bucket over the master) and weights_end
 * through rollout_worker_handle, as from the controller's socket:
 *   sync_nccl [BUCKET_BYTES]  a good sync: every worker acknowledges with the master's whole-model hash, and its bf16
 *                             device weights and fp32 proj_out.bias equal an upload of the master bit for bit, its
 *                             host copy untouched; then a sync whose broadcast buffer has one element changed after
 *                             the hashes were taken: every worker refuses it naming bucket 2, its element range and
 *                             tensors (the buckets after it still received: the broadcast is collective); then
 *                             ZeRO stage 3's form, each bucket uploaded from the host copy into one bucket of device
 *                             staging and broadcast from there: as good as the first (and a staging smaller than a
 *                             bucket refused before any broadcast). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/log.h"
#include "core/wire_rollout.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/dit/wan_dev_exec.h"
#include "rollout/worker_msg.h"
#include "tests/mpi/mpi_cases.h"
#include "trainer/net/sync_bucket.h"
#include "trainer/net/sync_nccl.h"

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

static int handle(rollout_worker_state *st, const rollout_worker_io *io, core_wire_type t, const char *id, json_t *f) {
    core_wire_built b;
    core_wire_msg m;
    int rc = core_wire_build(t, id, f, NULL, 0, &b) || core_wire_parse(b.frames, b.n_frames, NULL, &m) ? -1 : 0;
    if (!rc) rc = rollout_worker_handle(st, &m, io), core_wire_msg_free(&m);
    core_wire_built_free(&b);
    json_decref(f);
    return rc;
}

static const wan_config tiny = {.patch_size = {1, 2, 2}, .num_attention_heads = 2, .attention_head_dim = 8,
                                .in_channels = 4, .out_channels = 4, .text_dim = 8, .freq_dim = 8, .ffn_dim = 32,
                                .num_layers = 2, .cross_attn_norm = 1, .eps = 1e-6, .rope_max_seq_len = 16};

int mpi_case_sync_nccl(sp_comm *world, int argc, char **argv) {
    const int64_t bucket = argc > 0 ? atoll(argv[0]) : 1000;
    const k_dev_ops *dev = &k_emu_ops;
    wan_model t, w, before;
    if (wan_model_init(&t, &tiny) || wan_model_init(&w, &tiny) || wan_model_init(&before, &tiny)) return 1;
    wan_params_init_random(&t, 31); /* the master: the same on every rank */
    wan_params_init_random(&w, 32 + world->rank);
    wan_params_init_random(&before, 32 + world->rank);
    const int64_t n = t.layout.numel, per = bucket / 4;
    const size_t bytes = sizeof(float) * (size_t)n;
    if (per < 1 || 3 * per > n) { /* bucket 2 must exist whole */
        MCHECK(0, "BUCKET_BYTES %lld: 4 to %lld for this model", (long long)bucket, (long long)(4 * (n / 3)));
        return 1;
    }
    const wan_model *ms[1] = {&t};
    uint64_t h;
    char hx[17];
    MCHECK(!wan_models_hash(ms, 1, &h), "hash");
    core_hash_hex(h, hx);
    const wan_layout *L[1] = {&t.layout};
    const float *P[1] = {t.params};
    const uint8_t send[1] = {1};
    core_log_set_level(CORE_LOG_OFF);
    if (world->rank == 0) { /* the controller's side */
        float *master = dev->mem_alloc(bytes), *bad = dev->mem_alloc(bytes);
        MCHECK(master && bad && !dev->mem_upload(master, t.params, bytes) && !dev->mem_upload(bad, t.params, bytes),
               "the master");
        if (bad) bad[2 * per + (per > 7 ? 7 : 0)] += 1.0f; /* in bucket 2 (emulated device memory: host memory) */
        sp_comm *nccl = NULL;
        const void *B1[1] = {master}, *B2[1] = {bad};
        MCHECK(!sync_nccl_broadcast(&nccl, world, dev, L, B1, send, 1, bucket, NULL, NULL, 0), "broadcast: %s", core_last_error());
        MCHECK(!sync_nccl_broadcast(&nccl, world, dev, L, B2, send, 1, bucket, NULL, NULL, 0), "broadcast 2: %s", core_last_error());
        /* ZeRO stage 3's form: no device master; each bucket uploaded from the host copy into one bucket of staging */
        void *stg = dev->mem_alloc((size_t)bucket);
        MCHECK(stg && !sync_nccl_broadcast(&nccl, world, dev, L, NULL, send, 1, bucket, P, stg, bucket),
               "staged broadcast: %s", core_last_error());
        MCHECK(sync_nccl_broadcast(&nccl, world, dev, L, NULL, send, 1, bucket, P, stg, 4) != 0 &&
                   strstr(core_last_error(), "has no host source or staging of its size"),
               "a staging smaller than a bucket: %s", core_last_error());
        dev->mem_free(stg);
        sp_comm_destroy(nccl);
        dev->mem_free(master), dev->mem_free(bad);
    } else { /* a worker */
        wan_dev_exec *wx = wan_dev_exec_new(dev), *rx = wan_dev_exec_new(dev);
        const wan_dev_model *ref = rx ? wan_dev_exec_model(rx, &t) : NULL;
        rollout_worker_state st = {.model = {&w, NULL}, .n_experts = 1, .id = "w", .dev = dev, .dx = wx,
                                   .sync_host = world};
        sink k = {0};
        const rollout_worker_io io = {.ctx = &k, .send_error = io_error, .send_fields = io_fields};
        for (int round = 0; round < 3; round++) { /* the master's, a corrupted one, the host copy staged */
            json_t *nb = sync_bucket_hashes_json(L, P, send, 1, bucket);
            MCHECK(nb != NULL, "hashes");
            handle(&st, &io, CORE_WIRE_WEIGHTS_BEGIN, "b",
                   json_pack("{s:i, s:i, s:o}", "policy_version", 5 + round, "tensors_count", t.layout.count,
                             "nccl_buckets", nb));
            handle(&st, &io, CORE_WIRE_WEIGHTS_END, "e", json_pack("{s:i, s:s}", "policy_version", 5 + round,
                                                                   "model_xxh64", hx));
            if (round != 1) {
                MCHECK(k.acks == (round ? 2 : 1) && k.errors == (round ? 1 : 0) && k.ack_hash == h &&
                           st.version == 5 + round, "rank %d round %d: acks %d %s: %s", world->rank, round, k.acks,
                       k.code, k.reason);
                const wan_dev_model *d = wan_dev_exec_model(wx, &w);
                MCHECK(d && ref && !memcmp(d->w, ref->w, sizeof(kb_bf16) * (size_t)n) &&
                           !memcmp(d->proj_out_b, ref->proj_out_b, sizeof(float) * 16),
                       "rank %d: the device weights differ from an upload of the master", world->rank);
                MCHECK(!memcmp(w.params, before.params, bytes), "rank %d: the host copy was written", world->rank);
            } else {
                char want[96];
                snprintf(want, sizeof want, "weights (NCCL broadcast) bucket 2 (transformer elements [%lld, %lld): ",
                         (long long)(2 * per), (long long)(3 * per));
                MCHECK(k.errors == 1 && !strcmp(k.code, "weights_mismatch") && strstr(k.reason, want),
                       "rank %d: %s: %s", world->rank, k.code, k.reason);
            }
        }
        rollout_worker_state_free(&st);
        wan_dev_exec_close(wx), wan_dev_exec_close(rx);
    }
    wan_model_free(&t), wan_model_free(&w), wan_model_free(&before);
    return 0;
}
