/* tests/test_sync_bucket.c — a bucketed weight sync (trainer/net/sync_bucket.h) as a rollout worker takes it
 * (rollout/worker_msg.h), without sockets: every message is built, parsed and handed to rollout_worker_handle.
 *   - buckets of 12 bytes (smaller than any tensor), 1000 bytes (spanning tensors) and 1 GiB (larger than both
 *     experts): the worker's two experts become bit-identical to the trainer's, its ack carries the trainer's
 *     whole-model hash, and the bucket count is ceil(4 numel / size) per expert;
 *   - a bucket whose bytes were corrupted in transit: weights_mismatch naming the bucket, its element range and
 *     the tensors it spans, with the old weights and version kept;
 *   - a bucket out of order, and one announced count not reached: refused, named. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checksum.h"
#include "core/log.h"
#include "core/wire_rollout.h"
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

/* Parses the built message b (frame `flip` > 0: its byte 5 flipped first, in a copy) and hands it to the worker. */
static void deliver(rollout_worker_state *st, const rollout_worker_io *io, core_wire_built *b, int flip) {
    core_wire_frame fr[64];
    REQUIRE(b->n_frames <= 64 || flip <= 0);
    uint8_t *copy = NULL;
    const core_wire_frame *use = b->frames;
    if (flip > 0) {
        memcpy(fr, b->frames, sizeof *fr * (size_t)b->n_frames);
        REQUIRE((copy = malloc(fr[flip].len)) != NULL && fr[flip].len > 5);
        memcpy(copy, fr[flip].data, fr[flip].len);
        copy[5] ^= 0x40;
        fr[flip].data = copy;
        use = fr;
    }
    core_wire_msg m;
    REQUIRE_OK(core_wire_parse(use, b->n_frames, NULL, &m));
    CHECK(rollout_worker_handle(st, &m, io) == 0);
    core_wire_msg_free(&m);
    free(copy);
}

static void send_fields(rollout_worker_state *st, const rollout_worker_io *io, core_wire_type t, const char *id,
                        json_t *f) {
    core_wire_built b;
    REQUIRE_OK(core_wire_build(t, id, f, NULL, 0, &b));
    deliver(st, io, &b, 0);
    core_wire_built_free(&b);
    json_decref(f);
}

static const wan_config tiny = {.patch_size = {1, 2, 2}, .num_attention_heads = 2, .attention_head_dim = 8,
                                .in_channels = 4, .out_channels = 4, .text_dim = 8, .freq_dim = 8, .ffn_dim = 32,
                                .num_layers = 2, .cross_attn_norm = 1, .eps = 1e-6, .rope_max_seq_len = 16};

/* One sync of upd[0..2) into the worker st at version v in buckets of `bytes`: corrupt_bucket >= 0 flips a byte of
 * that bucket's first piece; swap >= 0 sends buckets swap and swap + 1 in each other's place; drop_last leaves
 * the last bucket out. Returns the bucket count. */
static int sync_once(rollout_worker_state *st, const rollout_worker_io *io, wan_model *upd, int64_t v, int64_t bytes,
                     int corrupt_bucket, int swap, int drop_last) {
    const wan_layout *L[2] = {&upd[0].layout, &upd[1].layout};
    const uint8_t send[2] = {1, 1};
    const int nb = sync_bucket_plan(L, send, 2, bytes, NULL, 0);
    REQUIRE(nb > 0);
    sync_bucket *bk = malloc(sizeof *bk * (size_t)nb);
    REQUIRE(bk && sync_bucket_plan(L, send, 2, bytes, bk, nb) == nb);
    send_fields(st, io, CORE_WIRE_WEIGHTS_BEGIN, "w-begin",
                json_pack("{s:I, s:i, s:i}", "policy_version", (json_int_t)v, "tensors_count",
                          L[0]->count + L[1]->count, "buckets_count", nb));
    for (int j = 0; j < nb - (drop_last ? 1 : 0); j++) {
        const int k = swap >= 0 && j == swap ? swap + 1 : swap >= 0 && j == swap + 1 ? swap : j;
        core_wire_built b;
        char id[32];
        snprintf(id, sizeof id, "w-b%d", k);
        REQUIRE_OK(sync_bucket_build(id, &bk[k], L[bk[k].expert], upd[bk[k].expert].params, &b));
        deliver(st, io, &b, k == corrupt_bucket ? 1 : 0);
        core_wire_built_free(&b);
    }
    const wan_model *ms[2] = {&upd[0], &upd[1]};
    uint64_t h;
    REQUIRE_OK(wan_models_hash(ms, 2, &h));
    char hx[17];
    core_hash_hex(h, hx);
    send_fields(st, io, CORE_WIRE_WEIGHTS_END, "w-end",
                json_pack("{s:I, s:s}", "policy_version", (json_int_t)v, "model_xxh64", hx));
    free(bk);
    return nb;
}

static int same(const wan_model *a, const wan_model *b) {
    return a->layout.numel == b->layout.numel &&
           !memcmp(a->params, b->params, sizeof(float) * (size_t)a->layout.numel);
}

TEST(sync_bucket_sizes_give_identical_weights) {
    wan_model w[2], u[2];
    for (int e = 0; e < 2; e++) {
        REQUIRE_OK(wan_model_init(&w[e], &tiny));
        REQUIRE_OK(wan_model_init(&u[e], &tiny));
        wan_params_init_random(&w[e], 100 + e);
    }
    int64_t smallest = INT64_MAX, largest = 0;
    for (int i = 0; i < u[0].layout.count; i++) {
        const int64_t nbytes = 4 * u[0].layout.tensors[i].numel;
        smallest = nbytes < smallest ? nbytes : smallest, largest = nbytes > largest ? nbytes : largest;
    }
    const int64_t sizes[3] = {12, 1000, (int64_t)1 << 30};
    /* 12 bytes: under every tensor; 1000: two of the smallest fit, the expert does not; 1 GiB: over both experts */
    REQUIRE(12 < smallest && 2 * smallest < 1000 && 1000 < 4 * u[0].layout.numel && largest < sizes[2]);
    rollout_worker_state st = {.model = {&w[0], &w[1]}, .n_experts = 2, .id = "w", .version = 0};
    sink k = {0};
    const rollout_worker_io io = {.ctx = &k, .send_error = io_error, .send_fields = io_fields};
    for (int s = 0; s < 3; s++) {
        for (int e = 0; e < 2; e++) wan_params_init_random(&u[e], 200 + 10 * s + e);
        const int nb = sync_once(&st, &io, u, s + 1, sizes[s], -1, -1, 0);
        const int64_t per = 4 * u[0].layout.numel;
        CHECK_MSG(nb == 2 * (int)((per + sizes[s] - 1) / sizes[s]), "%lld-byte buckets: %d", (long long)sizes[s], nb);
        const wan_model *ms[2] = {&u[0], &u[1]};
        uint64_t h;
        REQUIRE_OK(wan_models_hash(ms, 2, &h));
        CHECK_MSG(k.acks == s + 1 && k.errors == 0, "%lld-byte buckets: acks %d errors %d %s", (long long)sizes[s],
                  k.acks, k.errors, k.reason);
        CHECK(k.ack_hash == h && st.version == s + 1);
        CHECK_MSG(same(&w[0], &u[0]) && same(&w[1], &u[1]), "%lld-byte buckets: the weights differ", (long long)sizes[s]);
    }
    rollout_worker_state_free(&st);
    for (int e = 0; e < 2; e++) wan_model_free(&w[e]), wan_model_free(&u[e]);
}

TEST(sync_bucket_corrupt_out_of_order_and_missing_refused) {
    wan_model w[2], u[2], before[2];
    for (int e = 0; e < 2; e++) {
        REQUIRE_OK(wan_model_init(&w[e], &tiny));
        REQUIRE_OK(wan_model_init(&u[e], &tiny));
        REQUIRE_OK(wan_model_init(&before[e], &tiny));
        wan_params_init_random(&w[e], 1 + e);
        wan_params_init_random(&before[e], 1 + e);
        wan_params_init_random(&u[e], 7 + e);
    }
    const core_log_level lvl = core_log_get_level();
    core_log_set_level(CORE_LOG_OFF);
    rollout_worker_state st = {.model = {&w[0], &w[1]}, .n_experts = 2, .id = "w", .version = 4};
    sink k = {0};
    const rollout_worker_io io = {.ctx = &k, .send_error = io_error, .send_fields = io_fields};
    /* 1000-byte buckets: bucket 3 of expert 0 covers elements [750, 1000) */
    const wan_layout *L = &u[0].layout;
    REQUIRE(L->numel > 1000);
    int first = -1, last = -1;
    for (int i = 0; i < L->count; i++) {
        const wan_tensor *t = &L->tensors[i];
        if (t->offset < 1000 && t->offset + t->numel > 750) last = i, first = first < 0 ? i : first;
    }
    sync_once(&st, &io, u, 5, 1000, 3, -1, 0);
    char want[512];
    snprintf(want, sizeof want, "weights_bucket 3 (transformer elements [750, 1000): %s .. %s): xxh64 of the received "
             "bytes is ", L->tensors[first].name, L->tensors[last].name);
    CHECK_MSG(k.acks == 0 && k.errors == 1 && !strcmp(k.code, "weights_mismatch") && strstr(k.reason, want),
              "%d %d %s: %s (want %s)", k.acks, k.errors, k.code, k.reason, want);
    CHECK(st.version == 4 && same(&w[0], &before[0]) && same(&w[1], &before[1]));

    sync_once(&st, &io, u, 5, 1000, -1, 2, 0);
    CHECK_MSG(k.errors == 2 && strstr(k.reason, "weights_bucket 3: bucket 2 was due (buckets come in order)"), "%s",
              k.reason);
    sync_once(&st, &io, u, 5, 1000, -1, -1, 1);
    CHECK_MSG(k.errors == 3 && strstr(k.reason, "buckets received, weights_begin announced"), "%s", k.reason);
    CHECK(k.acks == 0 && st.version == 4 && same(&w[0], &before[0]) && same(&w[1], &before[1]));
    /* and the same worker then takes a good sync */
    sync_once(&st, &io, u, 5, 1000, -1, -1, 0);
    CHECK(k.acks == 1 && st.version == 5 && same(&w[0], &u[0]) && same(&w[1], &u[1]));
    core_log_set_level(lvl);
    rollout_worker_state_free(&st);
    for (int e = 0; e < 2; e++) wan_model_free(&w[e]), wan_model_free(&u[e]), wan_model_free(&before[e]);
}

TEST(sync_bucket_plan_bounds) {
    wan_model u;
    REQUIRE_OK(wan_model_init(&u, &tiny));
    const wan_layout *L[2] = {&u.layout, NULL};
    const uint8_t send[2] = {1, 0};
    CHECK(sync_bucket_plan(L, send, 1, 3, NULL, 0) < 0);
    sync_bucket b[4];
    /* 4 * numel - 1 bytes: one bucket of numel - 1 elements and one of 1 (a size not a multiple of 4 rounds down) */
    CHECK(sync_bucket_plan(L, send, 1, 4 * u.layout.numel - 1, b, 4) == 2);
    CHECK(b[0].offset == 0 && b[0].count == u.layout.numel - 1 && b[1].offset == u.layout.numel - 1 && b[1].count == 1);
    CHECK(sync_bucket_plan(L, send, 1, 5, b, 1) < 0); /* more buckets than the room given */
    wan_model_free(&u);
}
