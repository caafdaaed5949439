/* cli/job.c — processes of a multi-process job (see cli/job.h). */
#include "cli/job.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"
#include "reward/learned.h"

/* The reward server the job starts gets the reward pair (`vgrpo reward-server --keys-fd`), and the workers' reward
 * clients the reward public key (reward_client_open_keys). */
#define JOB_REWARD_KEYS 1

static void close_key_fds(job *j) {
    for (int role = 0; role < CORE_CURVE_N_ROLES; role++) {
        if (j->keys_fd[role] >= 0) close(j->keys_fd[role]);
        j->keys_fd[role] = -1;
    }
}

/* The run's keys, each role's subset, and a memfd per role. */
static int make_keys(job *j) {
    core_curve_keys all;
    if (core_curve_generate(&all)) return core_error_push("the run's keys: ");
    if (!j->reward_keyed) all.pub[CORE_CURVE_REWARD][0] = all.sec[CORE_CURVE_REWARD][0] = 0;
    for (int role = 0; role < CORE_CURVE_N_ROLES; role++) {
        core_curve_subset(&all, role, &j->keys[role]);
        if (role == CORE_CURVE_REWARD && !j->reward_keyed) continue;
        if ((j->keys_fd[role] = core_curve_memfd(&j->keys[role])) < 0) {
            memset(&all, 0, sizeof all);
            close_key_fds(j);
            return -1;
        }
    }
    memset(&all, 0, sizeof all);
    return 0;
}

const core_curve_keys *job_keys(const job *j, core_curve_role role) { return &j->keys[role]; }
int job_keys_fd(const job *j, core_curve_role role) { return j->keys_fd[role]; }

int job_init(job *j, const core_recipe *r, volatile sig_atomic_t *stop) {
    memset(j, 0, sizeof *j);
    j->reward_proc = -1;
    j->stop = stop;
    for (int role = 0; role < CORE_CURVE_N_ROLES; role++) j->keys_fd[role] = -1;
    j->reward_keyed = JOB_REWARD_KEYS && !r->reward_endpoint;
    if (make_keys(j)) return -1;
    /* /tmp/vgrpo-XXXXXX (mode 0700: no other user can reach a socket inside), after removing the ones of our
     * supervisors that died by SIGKILL */
    if (core_sockdir_make("/tmp", j->sockdir, sizeof j->sockdir)) {
        close_key_fds(j);
        return -1;
    }
    snprintf(j->ctl_ep, sizeof j->ctl_ep, "ipc://%s/ctl", j->sockdir);
    if (r->reward_endpoint) snprintf(j->rew_ep, sizeof j->rew_ep, "%s", r->reward_endpoint);
    else snprintf(j->rew_ep, sizeof j->rew_ep, "ipc://%s/reward", j->sockdir);
    return 0;
}

int job_start_reward(job *j, const core_recipe *r, const char *log_dir) {
    if (r->reward_endpoint) return 0;
    const char *exe = sup_self_exe();
    if (!exe) return -1;
    char spec[2048] = "", thr[16], logp[4200];
    for (int i = 0; i < r->scorers.n; i++) {
        size_t k = strlen(spec);
        snprintf(spec + k, sizeof spec - k, "%s%s:%.17g", i ? "," : "", r->scorers.v[i], r->weights.v[i]);
    }
    snprintf(thr, sizeof thr, "%d", r->reward_threads);
    snprintf(logp, sizeof logp, "%s/reward-server.log", log_dir);
    char fdb[16];
    snprintf(fdb, sizeof fdb, "%d", j->keys_fd[CORE_CURVE_REWARD]);
    /* the largest request a worker sends: rollout.batch_size videos (reward/PROTOCOL.md section 3: the frame limit) */
    char fmb[24];
    const unsigned long long vbytes = (unsigned long long)r->batch_size * r->frames * r->height * r->width * 3;
    snprintf(fmb, sizeof fmb, "%llu", (vbytes + (1ull << 20) - 1) >> 20);
    /* learned scorers: their folders, the frames scored and the videos' frame count (reward/learned.h) */
    char models[8192], vf[24];
    if (reward_recipe_models_spec(r, models, sizeof models)) return -1;
    snprintf(vf, sizeof vf, "%lld", (long long)reward_recipe_video_frames(r));
    char *argv[] = {(char *)exe, "reward-server", "--bind", j->rew_ep, "--scorers", spec, "--threads", thr,
                    "--max-frame-mb", fmb, "--frames", r->reward_frames ? r->reward_frames : "all", "--video-frames",
                    vf, "--models", models, j->reward_keyed ? "--keys-fd" : NULL, fdb, NULL};
    j->reward_proc = sup_spawn_fd(&j->procs, "reward server", argv, 1, logp, j->reward_keyed ? j->keys_fd[CORE_CURVE_REWARD] : -1, 0);
    return j->reward_proc < 0 ? -1 : 0;
}

int job_start_workers(job *j, const char *recipe_path, const char *const *sets, int n_sets, const char *transformer,
                      int n, int threads, const char *log_dir) {
    return job_start_workers_lora(j, recipe_path, sets, n_sets, transformer, NULL, n, threads, log_dir);
}

int job_start_workers_lora(job *j, const char *recipe_path, const char *const *sets, int n_sets,
                           const char *transformer, const char *adapter, int n, int threads, const char *log_dir) {
    const char *exe = sup_self_exe();
    if (!exe) return -1;
    char **argv = calloc((size_t)(16 + 2 * n_sets), sizeof(char *));
    if (!argv) return core_error("out of memory");
    j->worker_first = j->procs.n, j->n_workers = 0;
    for (int w = 0; w < n; w++) {
        char id[32], name[64], logp[4200];
        snprintf(id, sizeof id, "worker-%d", w);
        snprintf(name, sizeof name, "rollout worker %d", w);
        int a = 0;
        argv[a++] = (char *)exe, argv[a++] = "rollout-worker", argv[a++] = (char *)recipe_path;
        argv[a++] = "--controller", argv[a++] = j->ctl_ep, argv[a++] = "--reward", argv[a++] = j->rew_ep;
        argv[a++] = "--id", argv[a++] = id;
        char fdb[16];
        snprintf(fdb, sizeof fdb, "%d", j->keys_fd[CORE_CURVE_CLIENT]);
        argv[a++] = "--keys-fd", argv[a++] = fdb;
        if (transformer) argv[a++] = "--transformer", argv[a++] = (char *)transformer;
        if (adapter) argv[a++] = "--adapter", argv[a++] = (char *)adapter;
        for (int s = 0; s < n_sets; s++) argv[a++] = "--set", argv[a++] = (char *)sets[s];
        argv[a] = NULL;
        snprintf(logp, sizeof logp, "%s/worker-%d.log", log_dir, w);
        if (sup_spawn_fd(&j->procs, name, argv, threads, logp, j->keys_fd[CORE_CURVE_CLIENT], 0) < 0) {
            free(argv);
            return -1;
        }
        j->n_workers++;
    }
    free(argv);
    return 0;
}

int job_abort_check(void *ctx) {
    job *j = ctx;
    if (j->stop && *j->stop) return core_error("interrupted by a signal");
    int dead = sup_poll(&j->procs);
    if (dead < 0) return 0;
    char why[4600];
    sup_describe(&j->procs, dead, why, sizeof why);
    return core_error("%s", why);
}

void job_stop(job *j, double timeout_s) {
    if (j->reward_proc >= 0 && j->procs.p[j->reward_proc].pid) kill(j->procs.p[j->reward_proc].pid, SIGTERM);
    if (j->procs.n) sup_stop_all(&j->procs, timeout_s);
    sup_free(&j->procs);
    if (j->sockdir[0]) {
        char p[128];
        snprintf(p, sizeof p, "%s/ctl", j->sockdir);
        unlink(p);
        snprintf(p, sizeof p, "%s/reward", j->sockdir);
        unlink(p);
        snprintf(p, sizeof p, "%s/pid", j->sockdir);
        unlink(p);
        rmdir(j->sockdir);
        j->sockdir[0] = 0;
    }
    close_key_fds(j);
}

int job_threads_per_process(int procs) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    int t = (int)(cores / (procs > 0 ? procs : 1));
    return t > 0 ? t : 1;
}
