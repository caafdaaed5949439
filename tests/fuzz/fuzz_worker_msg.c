/* tests/fuzz/fuzz_worker_msg.c — libFuzzer target for the rollout worker's message handling (rollout/worker_msg.c,
 * `make fuzz`), in process, no sockets, with a micro Wan transformer (1 layer, dim 8: 30 tensors, the largest 128
 * floats) as one or two experts.
 *
 * Input: byte 0: bit 0 = two experts, bits 1-2 = the policy version held at start; then records [length: u16 little
 * endian, message: length bytes cut into frames by tests/fuzz/fuzz_frames.h], each parsed by core_wire_parse and,
 * when it parses, handed to rollout_worker_handle (replies are checked and dropped; a rollout request reaching the
 * rollout callback must carry the worker's version).
 * Checks (abort = finding): the weights change only with a weights_ack, whose policy_version and model_xxh64 are the
 * worker's version and its whole-model hash afterwards; every error reply has a code and a reason; shutdown returns
 * 1. Any crash, sanitizer report or leak is a finding. Seeds: seeds-fuzz_worker_msg/ (a complete update of the one-
 * expert model, a bad tensor hash, a rollout request, shutdown; update_buckets: a complete update in 32-byte buckets,
 * written by tests/fuzz/gen_seed_worker_buckets.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/wire.h"
#include "core/wire_rollout.h"
#include "model/dit/wan_dit.h"
#include "rollout/worker_msg.h"
#include "tests/fuzz/fuzz_frames.h"

static wan_model models[2];
static float *pristine[2];

typedef struct {
    int acks, errors, rollouts;
    uint64_t ack_hash;
    int64_t ack_version, version;
} sink;

static int io_error(void *ctx, const char *id, const char *code, const char *reason) {
    sink *k = ctx;
    if (!id || !code || !code[0] || !reason) abort();
    k->errors++;
    return 0;
}

static int io_fields(void *ctx, core_wire_type type, const char *id, const json_t *fields) {
    sink *k = ctx;
    if (!id) abort();
    if (type == CORE_WIRE_WEIGHTS_ACK) {
        k->acks++;
        k->ack_version = json_integer_value(json_object_get(fields, "policy_version"));
        if (core_hash_parse(json_string_value(json_object_get(fields, "model_xxh64")), &k->ack_hash)) abort();
    }
    return 0;
}

static int io_rollout(void *ctx, const core_wire_msg *m, const core_rollout_request *req) {
    sink *k = ctx;
    if (!m || req->policy_version != k->version || req->n < 1) abort();
    k->rollouts++;
    return 0;
}

static void setup(void) {
    const wan_config c = {.patch_size = {1, 2, 2}, .num_attention_heads = 1, .attention_head_dim = 8, .in_channels = 4,
                          .out_channels = 4, .text_dim = 8, .freq_dim = 8, .ffn_dim = 16, .num_layers = 1,
                          .cross_attn_norm = 1, .eps = 1e-6, .rope_max_seq_len = 16};
    for (int e = 0; e < 2; e++) {
        if (wan_model_init(&models[e], &c)) abort();
        wan_params_init_random(&models[e], 11 + (uint64_t)e);
        pristine[e] = malloc(sizeof(float) * (size_t)models[e].layout.numel);
        memcpy(pristine[e], models[e].params, sizeof(float) * (size_t)models[e].layout.numel);
    }
    core_log_set_level(CORE_LOG_OFF);
}

static uint64_t hash_of(int n) {
    const wan_model *ms[2] = {&models[0], &models[1]};
    uint64_t h;
    if (wan_models_hash(ms, n, &h)) abort();
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready = 0;
    if (!ready) setup(), ready = 1;
    if (size < 1) return 0;
    const int n_experts = 1 + (data[0] & 1);
    for (int e = 0; e < 2; e++) memcpy(models[e].params, pristine[e], sizeof(float) * (size_t)models[e].layout.numel);
    rollout_worker_state st = {.model = {&models[0], &models[1]}, .n_experts = n_experts, .id = "fuzz",
                               .version = (data[0] >> 1) & 3};
    sink k = {0};
    const rollout_worker_io io = {.ctx = &k, .send_error = io_error, .send_fields = io_fields, .rollout = io_rollout};
    size_t pos = 1;
    while (pos + 2 <= size) {
        size_t len = (size_t)data[pos] | ((size_t)data[pos + 1] << 8);
        pos += 2;
        if (len > size - pos) len = size - pos;
        core_wire_frame fr[5];
        const int nk = fuzz_cut_frames(data + pos, len, 3, fr);
        pos += len;
        if (nk < 0) continue;
        core_wire_limits lim = {.max_header_bytes = 8192, .max_frame_bytes = 4096, .max_total_bytes = 20000, .max_tensors = 4};
        core_wire_msg m;
        if (core_wire_parse(fr, nk + 1, &lim, &m)) continue;
        const uint64_t h0 = hash_of(n_experts);
        const int acks0 = k.acks;
        k.version = st.version;
        const int rc = rollout_worker_handle(&st, &m, &io);
        const int is_shutdown = m.type == CORE_WIRE_SHUTDOWN;
        core_wire_msg_free(&m);
        if (rc < 0 || (rc == 1) != is_shutdown) abort();
        const uint64_t h1 = hash_of(n_experts);
        if (k.acks != acks0) {
            if (k.ack_hash != h1 || k.ack_version != st.version) abort();
        } else if (h1 != h0) {
            abort(); /* weights changed without an ack */
        }
        if (rc == 1) break;
    }
    rollout_worker_state_free(&st);
    return 0;
}
