/* bench/bench_sync.c — `vgrpo bench sync`: the weight sync from the controller to rollout workers (trainer/net/
 * controller.h), bytes, seconds and GB/s per sync, through the real code on both sides: ctl_sync_weights on an ipc://
 * ROUTER in this process, and K forked worker processes that answer with rollout_worker_handle (rollout/worker_msg.h,
 * what `vgrpo rollout-worker` runs for every message; no pipeline behind it). A sync's seconds are ctl_sync_weights's:
 * the trainer's whole-model hash, the buckets with their xxh64 on both sides, each worker's staged copy, finite check
 * and whole-model hash, and the acks. The model is random (wan_params_init_random) at a preset's shape; the workers
 * (forked first, before any OpenMP ran) start from zeroed weights, and each sync sends the same weights as a new
 * policy version.
 *
 * --ipc: the same-host path (core/wire_sync.h) on the EMULATED device (the trainer's buffer in emulated device memory,
 * exported as POSIX shared memory): each worker holds device weights (an emulated device copy, 2 bytes per parameter)
 * and copies bucket by bucket device to device, hashing each bucket on the host and rounding it into its bf16
 * weights (rollout/worker_ipc.h); --ipc-host: workers without device weights copy the buffer into a host staging
 * copy (4 bytes per parameter). A test of the paths' cost here, not a figure of CUDA IPC. Memory: the model (4
 * bytes per parameter) in this process, and per worker its copy. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bench/bench.h"
#include "core/error.h"
#include "core/log.h"
#include "core/wire_rollout.h"
#include "core/wire_sync.h"
#include "core/wire_zmq.h"
#include "kernels/cuda/emu/k_emu.h"
#include "model/dit/wan_dev_exec.h"
#include "rollout/worker_msg.h"
#include "trainer/net/controller.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int w_error(void *ctx, const char *id, const char *code, const char *reason) {
    return core_zmq_send_error(ctx, NULL, 0, id, code, reason);
}
static int w_fields(void *ctx, core_wire_type type, const char *id, const json_t *fields) {
    return core_zmq_send_fields(ctx, NULL, 0, type, id, fields);
}

/* A worker process: hello, then every message through rollout_worker_handle until shutdown. Exit status 0 or 1. */
static int worker_main(const char *ep, int k, wan_model *m, uint64_t hash, int ipc, int ipc_host) {
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
    const int linger = 0, hwm = 1;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm); /* as rollout/worker.c */
    if (zmq_connect(s, ep)) return 1;
    char id[32], hx[17], host[CORE_SYNC_HOST_ID_MAX];
    snprintf(id, sizeof id, "bench-%d", k);
    core_hash_hex(hash, hx);
    core_sync_host_id(host, sizeof host);
    json_t *f = json_pack("{s:s, s:i, s:s, s:[s], s:s, s:b}", "client", id, "policy_version", 0, "model_xxh64", hx,
                          "experts", "transformer", "host_id", host, "ipc", ipc);
    if (core_zmq_send_fields(s, NULL, 0, CORE_WIRE_HELLO, "hello", f)) return 1;
    json_decref(f);
    rollout_worker_state st = {.model = {m, NULL}, .n_experts = 1, .id = id, .dev = ipc ? &k_emu_ops : NULL};
    /* device weights (an emulated device copy of the model): IPC goes device to device (rollout/worker_ipc.h) */
    wan_dev_exec *dx = ipc && !ipc_host ? wan_dev_exec_new(&k_emu_ops) : NULL;
    if (ipc && !ipc_host && (!dx || !wan_dev_exec_model(dx, m))) return 1;
    st.dx = dx;
    const rollout_worker_io io = {.ctx = s, .send_error = w_error, .send_fields = w_fields};
    for (;;) {
        core_zmq_msg zm;
        core_wire_msg msg;
        if (core_zmq_recv(s, 0, &zm)) return 1;
        if (core_zmq_parse(&zm, 0, NULL, &msg)) return 1;
        const int rc = rollout_worker_handle(&st, &msg, &io);
        core_wire_msg_free(&msg);
        core_zmq_msg_close(&zm);
        if (rc) {
            zmq_close(s), zmq_ctx_term(ctx);
            return rc == 1 ? 0 : 1;
        }
    }
}

int bench_sync(const bench_sync_opts *o) {
    wan_config cfg;
    if (wan_config_preset(&cfg, o->preset)) {
        fprintf(stderr, "vgrpo bench sync: %s\n", core_last_error());
        return 1;
    }
    char dir[] = "/tmp/vgrpo-bench-sync-XXXXXX", ep[128];
    if (!mkdtemp(dir)) return 1;
    snprintf(ep, sizeof ep, "ipc://%s/ctl", dir);
    /* the workers first: a process forked after OpenMP ran may hang in its first parallel region (libgomp) */
    core_log_set_level(CORE_LOG_WARN); /* the workers' "applied" lines too */
    fflush(NULL);
    pid_t pids[64];
    for (int k = 0; k < o->workers; k++) {
        pids[k] = fork();
        if (pids[k] == 0) { /* zeroed weights (untouched pages cost nothing) until the first sync replaces them */
            wan_model wm;
            if (wan_model_init(&wm, &cfg)) _exit(1);
            const wan_model *wms[1] = {&wm};
            uint64_t h;
            _exit(wan_models_hash(wms, 1, &h) ? 1 : worker_main(ep, k, &wm, h, o->ipc, o->ipc_host));
        }
    }
    wan_model m = {0};
    int rc = 1;
    void *dev_buf = NULL;
    ctl_server *c = NULL;
    double t = now_s();
    if (wan_model_init(&m, &cfg)) goto done;
    wan_params_init_random(&m, 1);
    const wan_model *ms[1] = {&m};
    const int64_t bytes = 4 * m.layout.numel;
    printf("vgrpo bench sync: %s, %" PRId64 " parameters (%.1f MiB F32, %d tensors), random in %.1f s; %d worker "
           "process(es), %s\n", o->preset, m.layout.numel, bytes / 1048576.0, m.layout.count, now_s() - t, o->workers,
           !o->ipc ? "buckets over ZeroMQ ipc://"
           : o->ipc_host ? "same-host IPC on the EMULATED device (POSIX shared memory) into each worker's host staging copy"
                         : "same-host IPC on the EMULATED device (POSIX shared memory), device to device into each "
                           "worker's device weights");
    fflush(stdout);
    c = ctl_open(ep, NULL, (size_t)1 << 20, NULL, NULL);
    if (!c || ctl_set_sync_bucket(c, (int64_t)o->bucket_mib << 20) || ctl_wait_workers(c, o->workers, 60)) goto done;
    if (o->ipc) {
        if (!(dev_buf = k_emu_ops.mem_alloc((size_t)bytes)) || k_emu_ops.mem_upload(dev_buf, m.params, (size_t)bytes))
            goto done;
        const void *bufs[1] = {dev_buf};
        const int64_t el[1] = {m.layout.numel};
        ctl_set_device_weights(c, &k_emu_ops, ms, bufs, el, 1);
    }
    const uint8_t send[1] = {1};
    if (o->ipc && o->ipc_host) printf("  each worker copies the whole exported buffer into its host staging copy\n");
    else if (o->ipc)
        printf("  each worker copies bucket by bucket (%d MiB) device to device, hashes each on the host (one "
               "bucket's buffer), rounds it into its bf16 device weights\n", o->bucket_mib);
    else
        printf("  bucket %d MiB (%" PRId64 " bucket(s) per worker)\n", o->bucket_mib,
               (bytes + ((int64_t)o->bucket_mib << 20) - 1) / ((int64_t)o->bucket_mib << 20));
    printf("  %-6s %14s %10s %10s\n", "sync", "bytes/worker", "seconds", "GB/s");
    double best = 0;
    for (int s = 0; s < o->syncs; s++) {
        int match = 0;
        int64_t sent = 0;
        t = now_s();
        if (ctl_sync_weights(c, ms, 1, send, s + 1, 600, &match, &sent) || !match) goto done;
        const double dt = now_s() - t, gbps = (double)sent * o->workers / dt / 1e9;
        best = gbps > best ? gbps : best;
        printf("  %-6d %14" PRId64 " %10.4f %10.3f\n", s + 1, sent, dt, gbps);
        fflush(stdout);
    }
    printf("  best %.3f GB/s (bytes x workers / seconds; hashes and copies on both sides included)\n", best);
    rc = 0;
done:
    if (rc) fprintf(stderr, "vgrpo bench sync: %s\n", core_last_error());
    if (c) ctl_shutdown(c, 10), ctl_close(c);
    for (int k = 0; k < o->workers; k++) {
        int st = 0;
        if (rc || !c) kill(pids[k], SIGTERM);
        waitpid(pids[k], &st, 0);
        if (!rc && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) rc = 1, fprintf(stderr, "vgrpo bench sync: worker %d failed\n", k);
    }
    if (dev_buf) k_emu_ops.mem_free(dev_buf);
    char sock[160];
    snprintf(sock, sizeof sock, "%s/ctl", dir);
    unlink(sock), rmdir(dir);
    wan_model_free(&m);
    return rc;
}
