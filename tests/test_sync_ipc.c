/* tests/test_sync_ipc.c — the same-host (IPC) path of the weight sync (core/wire_sync.h), without sockets:
 *   - weights_begin's "ipc" array: build and parse give back the handles; malformed entries refused, named;
 *   - the choice: IPC only with both sides able, one host id, and no earlier refusal; the reason otherwise;
 *   - a worker in ANOTHER PROCESS (fork) on the emulated device opens the trainer's exported device buffer (POSIX
 *     shared memory), copies it, and acknowledges with the trainer's whole-model hash: its weights are the
 *     trainer's, bit for bit; once the export is withdrawn, and for a worker without an IPC device, weights_end
 *     answers ipc_refused naming why, with the old weights kept;
 *   - the controller's rules: a hello's host_id and ipc are recorded; an ipc_refused answering a sync that went by
 *     IPC is an event (the controller resends in buckets), not the end of the sync; the same error for a sync in
 *     buckets ends it. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/checksum.h"
#include "core/log.h"
#include "core/wire_rollout.h"
#include "core/wire_sync.h"
#include "kernels/cuda/emu/k_emu.h"
#include "rollout/worker_msg.h"
#include "tests/test.h"
#include "trainer/net/ctl_msg.h"

TEST(sync_ipc_json_round_trip_and_refusals) {
    core_sync_ipc x[2] = {{.expert = 0, .elements = 12345}, {.expert = 1, .elements = 7}}, y[2];
    for (int i = 0; i < CORE_SYNC_HANDLE_BYTES; i++) x[0].handle[i] = (uint8_t)(i * 37 + 1), x[1].handle[i] = (uint8_t)(255 - i);
    json_t *a = core_sync_ipc_json(x, 2);
    int n = 0;
    REQUIRE(a);
    REQUIRE_OK(core_sync_ipc_parse(a, 2, y, 2, &n));
    CHECK(n == 2 && y[0].expert == 0 && y[1].expert == 1 && y[0].elements == 12345 && y[1].elements == 7);
    CHECK(!memcmp(x[0].handle, y[0].handle, CORE_SYNC_HANDLE_BYTES) && !memcmp(x[1].handle, y[1].handle, CORE_SYNC_HANDLE_BYTES));
    CHECK(core_sync_ipc_parse(a, 1, y, 2, &n) < 0); /* a worker with one expert */
    json_decref(a);
    const char *bad[] = {
        "[]",
        "[{\"expert\": \"transformer_3\", \"handle\": \"00\", \"elements\": 1}]",
        "[{\"expert\": \"transformer\", \"handle\": \"00\", \"elements\": 1}]",
        "[{\"expert\": \"transformer\", \"handle\": \"%s\", \"elements\": 0}]",
        "[{\"expert\": \"transformer\", \"handle\": \"%s\", \"elements\": 4}, "
        "{\"expert\": \"transformer\", \"handle\": \"%s\", \"elements\": 4}]",
        "[{\"expert\": \"transformer\", \"handle\": \"%sX\", \"elements\": 4}]",
    };
    const char *want[] = {"1 to 2 entries", "\"ipc\"[0].expert", "\"ipc\"[0].handle must be 128", "\"ipc\"[0].elements",
                          "\"ipc\"[1] names transformer twice", "\"ipc\"[0].handle must be"};
    char hex[129], text[1024];
    memset(hex, 'a', 128), hex[128] = 0;
    for (int k = 0; k < 6; k++) {
        char h127[129];
        snprintf(h127, sizeof h127, "%.127s", hex);
        snprintf(text, sizeof text, bad[k], k == 5 ? h127 : hex, hex);
        json_t *j = json_loads(text, 0, NULL);
        REQUIRE(j);
        CHECK_MSG(core_sync_ipc_parse(j, 2, y, 2, &n) < 0 && strstr(core_last_error(), want[k]), "%d: %s", k,
                  core_last_error());
        core_error_clear();
        json_decref(j);
    }
}

TEST(sync_ipc_choice) {
    char why[512];
    const core_sync_side ctl = {.host_id = "h/1", .ipc = 1}, no_dev = {.host_id = "h/1", .ipc = 0};
    const core_sync_side same = {.host_id = "h/1", .ipc = 1}, other = {.host_id = "g/2", .ipc = 1},
                         cpu = {.host_id = "h/1", .ipc = 0}, refused = {.host_id = "h/1", .ipc = 1, .refused = "no peer"},
                         unknown = {.host_id = "", .ipc = 1};
    CHECK(core_sync_ipc_choose(&ctl, &same, why, sizeof why) == 1 && strstr(why, "same host h/1"));
    CHECK(core_sync_ipc_choose(&ctl, &other, why, sizeof why) == 0 && strstr(why, "another host (g/2 vs h/1)"));
    CHECK(core_sync_ipc_choose(&ctl, &cpu, why, sizeof why) == 0 && strstr(why, "no device that opens IPC"));
    CHECK(core_sync_ipc_choose(&ctl, &refused, why, sizeof why) == 0 && strstr(why, "refused IPC before: no peer"));
    CHECK(core_sync_ipc_choose(&ctl, &unknown, why, sizeof why) == 0 && strstr(why, "host identity is unknown"));
    CHECK(core_sync_ipc_choose(&no_dev, &same, why, sizeof why) == 0 && strstr(why, "not on a device"));
    char id[CORE_SYNC_HOST_ID_MAX], id2[CORE_SYNC_HOST_ID_MAX];
    core_sync_host_id(id, sizeof id);
    core_sync_host_id(id2, sizeof id2);
    CHECK(id[0] && !strcmp(id, id2));
}

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

/* One IPC sync of the exported handle x (whole-model hash h) into the worker st at version v. */
static void ipc_sync(rollout_worker_state *st, const rollout_worker_io *io, const core_sync_ipc *x, int count,
                     uint64_t h, int64_t v) {
    char hx[17];
    core_hash_hex(h, hx);
    send(st, io, CORE_WIRE_WEIGHTS_BEGIN, "w-begin",
         json_pack("{s:I, s:i, s:o}", "policy_version", (json_int_t)v, "tensors_count", count, "ipc",
                   core_sync_ipc_json(x, 1)));
    send(st, io, CORE_WIRE_WEIGHTS_END, "w-end", json_pack("{s:I, s:s}", "policy_version", (json_int_t)v, "model_xxh64", hx));
}

static const wan_config tiny = {.patch_size = {1, 2, 2}, .num_attention_heads = 2, .attention_head_dim = 8,
                                .in_channels = 4, .out_channels = 4, .text_dim = 8, .freq_dim = 8, .ffn_dim = 32,
                                .num_layers = 2, .cross_attn_norm = 1, .eps = 1e-6, .rope_max_seq_len = 16};

TEST(sync_ipc_worker_in_another_process) {
    const k_dev_ops *dev = &k_emu_ops;
    wan_model t, w, before;
    REQUIRE_OK(wan_model_init(&t, &tiny));
    REQUIRE_OK(wan_model_init(&w, &tiny));
    REQUIRE_OK(wan_model_init(&before, &tiny));
    wan_params_init_random(&t, 31);
    wan_params_init_random(&w, 32);
    wan_params_init_random(&before, 32);
    const size_t bytes = sizeof(float) * (size_t)t.layout.numel;
    /* the trainer's device master: its host params uploaded, then exported */
    float *master = dev->mem_alloc(bytes);
    REQUIRE(master && dev->mem_upload(master, t.params, bytes) == 0);
    core_sync_ipc x = {.expert = 0, .elements = t.layout.numel};
    REQUIRE_OK(dev->ipc_export(master, bytes, x.handle));
    const wan_model *ms[1] = {&t};
    uint64_t h;
    REQUIRE_OK(wan_models_hash(ms, 1, &h));
    const core_log_level lvl = core_log_get_level();
    core_log_set_level(CORE_LOG_OFF);
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) { /* the worker: another process of this host */
        rollout_worker_state st = {.model = {&w, NULL}, .n_experts = 1, .id = "w", .version = 0, .dev = dev};
        sink k = {0};
        const rollout_worker_io io = {.ctx = &k, .send_error = io_error, .send_fields = io_fields};
        ipc_sync(&st, &io, &x, t.layout.count, h, 3);
        const int ok = k.acks == 1 && k.errors == 0 && k.ack_hash == h && st.version == 3 &&
                       !memcmp(w.params, t.params, bytes);
        if (!ok) fprintf(stderr, "worker: acks %d errors %d %s: %s\n", k.acks, k.errors, k.code, k.reason);
        _exit(ok ? 0 : 1);
    }
    REQUIRE(pid > 0);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the worker process: status %d", status);
    /* the export withdrawn (the sync acknowledged): a late open is refused, as is a worker without an IPC device */
    REQUIRE_OK(dev->ipc_unexport(x.handle));
    rollout_worker_state st = {.model = {&w, NULL}, .n_experts = 1, .id = "w", .version = 0, .dev = dev};
    sink k = {0};
    const rollout_worker_io io = {.ctx = &k, .send_error = io_error, .send_fields = io_fields};
    ipc_sync(&st, &io, &x, t.layout.count, h, 3);
    CHECK_MSG(k.acks == 0 && k.errors == 1 && !strcmp(k.code, CORE_SYNC_IPC_REFUSED) &&
                  strstr(k.reason, "the IPC handle of transformer: emulated device: ipc_open /vgrpo-ipc-"),
              "%s: %s", k.code, k.reason);
    st.dev = NULL;
    ipc_sync(&st, &io, &x, t.layout.count, h, 3);
    CHECK_MSG(k.errors == 2 && !strcmp(k.code, CORE_SYNC_IPC_REFUSED) && strstr(k.reason, "no device that opens IPC"),
              "%s: %s", k.code, k.reason);
    /* a handle of another backend (a CUDA handle is 64 other bytes) */
    st.dev = dev;
    core_sync_ipc cuda = x;
    memset(cuda.handle, 0x5a, sizeof cuda.handle);
    ipc_sync(&st, &io, &cuda, t.layout.count, h, 3);
    CHECK_MSG(k.errors == 3 && strstr(k.reason, "not one of the emulated device's"), "%s", k.reason);
    CHECK(st.version == 0 && !memcmp(w.params, before.params, bytes));
    core_log_set_level(lvl);
    rollout_worker_state_free(&st);
    dev->mem_free(master);
    wan_model_free(&t), wan_model_free(&w), wan_model_free(&before);
}

/* ctl_msg_handle of message type t (fields f, consumed) from routing id rid. */
static int handle(ctl_state *s, const char *rid, core_wire_type t, const char *id, json_t *f, ctl_event *ev,
                  ctl_reply *r) {
    core_wire_built b;
    core_wire_msg m;
    REQUIRE(f && core_wire_build(t, id, f, NULL, 0, &b) == 0);
    json_decref(f);
    REQUIRE(core_wire_parse(b.frames, b.n_frames, NULL, &m) == 0);
    const int rc = ctl_msg_handle(s, rid, strlen(rid), &m, ev, r);
    core_wire_msg_free(&m);
    core_wire_built_free(&b);
    return rc;
}

TEST(sync_ipc_controller_rules) {
    const core_log_level level = core_log_get_level();
    core_log_set_level(CORE_LOG_OFF);
    static ctl_state s;
    memset(&s, 0, sizeof s);
    s.phase = CTL_HELLO, s.want = 2;
    ctl_event ev;
    ctl_reply r;
    const char *hx = "00000000000000aa";
    REQUIRE_OK(handle(&s, "A", CORE_WIRE_HELLO, "hello",
                      json_pack("{s:s, s:i, s:s, s:[s], s:s, s:b}", "client", "worker-0", "policy_version", 0,
                                "model_xxh64", hx, "experts", "transformer", "host_id", "h/1", "ipc", 1),
                      &ev, &r));
    REQUIRE_OK(handle(&s, "B", CORE_WIRE_HELLO, "hello",
                      json_pack("{s:s, s:i, s:s, s:[s]}", "client", "worker-1", "policy_version", 0, "model_xxh64",
                                hx, "experts", "transformer"),
                      &ev, &r));
    CHECK(s.n == 2 && !strcmp(s.w[0].host_id, "h/1") && s.w[0].ipc == 1 && s.w[1].host_id[0] == 0 && s.w[1].ipc == 0);
    /* a sync in flight: worker-0 got it by IPC, worker-1 in buckets */
    s.phase = CTL_SYNC, s.version = 4;
    snprintf(s.end_id, sizeof s.end_id, "w4-end");
    s.w[0].done = s.w[1].done = 0;
    s.w[0].ipc_used = 1;
    const char *why = "weights_begin: the IPC handle of transformer: no peer access";
    CHECK(handle(&s, "A", CORE_WIRE_ERROR, "w4-end",
                 json_pack("{s:s, s:s, s:b}", "code", CORE_SYNC_IPC_REFUSED, "reason", why, "retryable", 0), &ev,
                 &r) == 0);
    CHECK(ev.ipc_refused && ev.worker == 0 && !ev.progress && !r.send && !strcmp(s.w[0].ipc_refused, why) &&
          !s.w[0].done);
    CHECK(handle(&s, "B", CORE_WIRE_ERROR, "w4-end",
                 json_pack("{s:s, s:s, s:b}", "code", CORE_SYNC_IPC_REFUSED, "reason", why, "retryable", 0), &ev,
                 &r) < 0);
    CHECK_MSG(strstr(core_last_error(), "worker-1 refused the weights of version 4: ipc_refused"), "%s", core_last_error());
    core_error_clear();
    core_log_set_level(level);
}
