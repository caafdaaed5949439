/* cli/launch_mpi_roles.c — what a rank of an MPI launch runs once the start-up is done (step 7 at the top of
 * cli/launch_mpi.c; cli/launch_mpi_rank.h): trainer rank 0 the controller and the GRPO loop, the other trainer ranks
 * trainer_follow, the rollout workers and the reward server with their output in logging.run_dir/logs/, and the
 * signal handlers and end-of-run shutdown they use. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "cli/launch_mpi_rank.h"
#include "core/gpu_assign.h"
#include "cli/supervisor.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/stop.h"
#include "core/wire_zmq.h"
#include "reward/learned.h"
#include "reward/server.h"
#include "rollout/pipeline.h"
#include "rollout/worker.h"
#include "trainer/net/source_remote.h"

#define HELLO_TIMEOUT_S 600.0 /* as `vgrpo trainer` */
#define CTL_TIMEOUT_S 3600.0
#define REWARD_STOP_MS 15000  /* the reward server finishes its requests in flight (<= 10 s) before it answers */

/* Output of a worker or the reward server into logging.run_dir/logs/NAME.log (as the supervisor's children). */
int launch_redirect_output(const char *run_dir, const char *name) {
    char logs[4200], path[4400];
    snprintf(logs, sizeof logs, "%s/logs", run_dir);
    if (core_mkdir_p(logs)) return -1;
    snprintf(path, sizeof path, "%s/%s.log", logs, name);
    const int fd = core_open_nofollow(path, O_WRONLY | O_CREAT | O_APPEND); /* as the supervisor's children */
    if (fd < 0) return -1;
    fflush(stdout);
    fflush(stderr);
    dup2(fd, 1), dup2(fd, 2), close(fd);
    char note[120];
    const int k = sup_log_header(note, sizeof note);
    if (write(2, note, (size_t)k) < 0) { /* the log line is a courtesy */ }
    return 0;
}

static volatile sig_atomic_t stop_flag = 0, abort_flag = 0;
static void on_stop(int sig) { (void)sig, stop_flag = 1; }
void launch_on_usr1(int sig) { (void)sig, abort_flag = 1; }
void launch_on_usr2(int sig) { (void)sig, kill(getpid(), SIGTERM); } /* trainer rank 0: as SIGTERM (core/stop.h) */

/* The controller's abort check (as `vgrpo trainer`'s). */
int launch_abort_check(void *ctx) {
    (void)ctx;
    if (abort_flag) return core_error("stopped (SIGUSR1)");
    const int sig = core_stop_interrupt();
    return sig ? core_error("stopped by signal %d while waiting for the rollout workers", sig) : 0;
}

/* Trainer rank 0 at the end: `shutdown` to the reward server, with the client keys; waits for its answer. */
int launch_stop_reward_server(const launch *L) {
    void *ctx = zmq_ctx_new(), *d = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
    int rc = -1, linger = 0;
    if (!d) core_error("cannot make a socket: %s", zmq_strerror(errno));
    else if (zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger) || core_curve_client(d, &L->keys, CORE_CURVE_REWARD) ||
             zmq_connect(d, L->rew_ep) || core_zmq_send_fields(d, NULL, 0, CORE_WIRE_SHUTDOWN, "launch-shutdown", NULL))
        core_error_push("its shutdown: ");
    else {
        zmq_pollitem_t it = {d, 0, ZMQ_POLLIN, 0};
        rc = zmq_poll(&it, 1, REWARD_STOP_MS) == 1 ? 0
             : core_error("no answer to its shutdown within %d s", REWARD_STOP_MS / 1000);
    }
    if (d) zmq_close(d);
    if (ctx) zmq_ctx_term(ctx);
    return rc;
}

/* The trainer role after the exchange; *clean_fail = 1 when every trainer rank finished (parity past its tolerance,
 * a run stopped by a signal). Returns trainer_run's value (0, 1) or -1. */
int launch_run_trainer(launch *L, const trainer_run_opts *o, ctl_server *ctl, int *clean_fail) {
    const core_recipe *r = L->r;
    if (L->role_rank > 0) return trainer_follow(r, o, L->group);
    core_stop_install();
    if (ctl_wait_workers(ctl, L->n_role[ROLE_WORKER], HELLO_TIMEOUT_S)) {
        core_stop_restore();
        return -1;
    }
    core_stop_restore();
    if (core_stop_pending()) /* a stop as the last hello arrived: trainer_run's own handlers would forget it */
        return core_error("stopped by signal %d while waiting for the rollout workers", core_stop_pending());
    core_rollout_source *src = trainer_source_remote(ctl, r->batch_size, CTL_TIMEOUT_S, r->model_path);
    const int rc = !src ? -1 : trainer_run(r, o, src, L->group);
    trainer_source_remote_free(src);
    *clean_fail = rc == 1;
    return rc;
}

/* The reward server's on_bound: step 6 as soon as it listens. */
static int reward_bound(void *ctx, const char *ep) {
    launch *L = ctx;
    fprintf(stderr, "reward-server: serving on %s (CURVE; address: %s) with %d scorer thread(s)\n", ep, L->addr_how,
            L->r->reward_threads);
    return launch_exchange(L, ep);
}

/* The reward-server role: binds, exchanges (reward_bound), serves until trainer rank 0's shutdown. */
int launch_run_reward(launch *L, const core_recipe *r) {
    reward_server_config cfg;
    reward_server_config_default(&cfg);
    char spec[2048] = "", ep[REC];
    for (int i = 0; i < r->scorers.n; i++) {
        size_t k = strlen(spec);
        snprintf(spec + k, sizeof spec - k, "%s%s:%.17g", i ? "," : "", r->scorers.v[i], r->weights.v[i]);
    }
    cfg.threads = r->reward_threads;
    /* the largest request a worker sends (as cli/job.c): rollout.batch_size videos */
    const unsigned long long vbytes = (unsigned long long)r->batch_size * r->frames * r->height * r->width * 3;
    cfg.max_frame_bytes = (size_t)((vbytes + (1ull << 20) - 1) >> 20) << 20;
    cfg.keys = &L->keys;
    cfg.on_bound = reward_bound, cfg.on_bound_ctx = L;
    if (reward_server_parse_scorers(&cfg, spec) || reward_recipe_models(r, cfg.scorers, cfg.n_scorers, 1))
        return launch_exchange(L, NULL), -1;
    for (int i = 0; i < cfg.n_scorers; i++) /* learned scorers: their scratch in the memory budget */
        if (cfg.scorers[i].model)
            cfg.model_act_bytes += reward_model_act_bytes(cfg.scorers[i].model, reward_recipe_video_frames(r), 1);
    if (launch_bind_endpoint(L, ep, sizeof ep)) return reward_server_detach_models(&cfg), launch_exchange(L, NULL), -1;
    cfg.endpoint = ep;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop; /* no SA_RESTART: the poll loop wakes and sees the flag */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    reward_server_stats st;
    memset(&st, 0, sizeof st);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int rc = reward_server_run(&cfg, &stop_flag, &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    reward_server_detach_models(&cfg);
    if (!L->exchanged) return launch_exchange(L, NULL), -1; /* it failed before it was bound */
    fprintf(stderr, "reward-server: stats: received %lld, replies %lld, errors %lld, repeats %lld, videos %lld, "
                    "undeliverable %lld, refused %lld, dropped %lld, %.1f s\n",
            st.received, st.replies, st.errors, st.repeats, st.videos, st.undeliverable, st.refused, st.dropped,
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return rc;
}

/* The worker role after the exchange. -2: it failed before its hello (the job must end), -1: later. */
int launch_run_worker(launch *L, const core_recipe *r) {
    char id[32];
    snprintf(id, sizeof id, "worker-%d", L->role_rank);
    rollout_pipeline p;
    memset(&p, 0, sizeof p);
    rollout_worker_config cfg = {.controller = L->ctl_ep, .reward = L->rew_ep, .id = id, .fps = 16.0,
                                 .reward_timeout_s = r->reward_timeout_s, .reward_max_attempts = r->reward_max_attempts,
                                 .keys = &L->keys, .sync_bucket_mib = r->sync_bucket_mib,
                                 /* NCCL syncs (and the landing buffer reserved for them) only where the recipe may
                                  * choose them: parallel.sync buckets or ipc never broadcasts */
                                 .sync_group = r->choice.sync == CORE_SYNC_AUTO || r->choice.sync == CORE_SYNC_NCCL
                                                   ? L->sync : NULL};
    int rc = -2;
    if (!core_gpu_select(r, CORE_GPU_WORKER, L->role_rank) && !rollout_pipeline_load_lora(&p, r, NULL, NULL)) {
        signal(SIGTERM, on_stop);
        signal(SIGINT, on_stop);
        rc = rollout_worker_run(&p, &cfg, &stop_flag) ? -1 : stop_flag ? core_error("stopped by a signal") : 0;
    }
    if (rc == -1) fprintf(stderr, "rollout-worker %s: %s\n", id, core_last_error());
    rollout_pipeline_free(&p);
    return rc;
}
