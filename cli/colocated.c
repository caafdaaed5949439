/* cli/colocated.c — `vgrpo run RECIPE` with mode: colocated: the supervisor of docs/design.md section 3. It is not an
 * MPI process. It starts the reward server (unless reward.endpoint names an external one), parallel.rollout_workers
 * rollout workers and the trainer (one rank: `vgrpo trainer ...`; N ranks: `mpirun -n N --bind-to none vgrpo trainer
 * ...`, with --oversubscribe when ranks exceed the cores and the OpenMPI root variables when run as root), shares
 * the cores (OMP_NUM_THREADS = cores / workers for each worker, cores / ranks for each trainer rank: rollout and
 * training alternate in on-policy GRPO), and then waits:
 *   - the trainer exits 0: the run is done; the workers were told to shut down by the trainer, the reward server is
 *     stopped; exit 0;
 *   - a rollout worker or the reward server dies: it is restarted (same command line, keys and endpoint; its log
 *     appended to), at most max_restarts times each. Meanwhile the controller re-issues a lost worker's chunk to the
 *     others and syncs a restarted worker's weights before it gets work again (trainer/net/controller.h); the workers'
 *     reward clients re-send an unanswered request to the restarted reward server after reward.timeout_s (the
 *     server's replies are pure functions of the videos, reward/PROTOCOL.md section 4), so the run's numbers are
 *     those of an undisturbed run. A worker past its restarts is left dead while others remain; when no worker is
 *     left, or the reward server is past its restarts, the run stops as below, the error naming them;
 *   - the trainer fails (with mpirun: any rank; mpirun then ends every rank), or the run stops as above: the others
 *     are stopped (the trainer with SIGUSR1: stop waiting at once), and the error names the process and its log;
 *     checkpoints already written stay as they are (each is complete or absent), and --resume continues from the
 *     last;
 *   - SIGINT/SIGTERM: forwarded to the trainer, which stops within its step (discarding it, or finishing it once its
 *     optimizer update began), saves a checkpoint and exits; then all stop.
 * The trainer's output (one line per step) goes to this terminal; every other process logs to
 * logging.run_dir/logs/. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/job.h"
#include "cli/colocated.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "model/dit/wan_dit.h"
#include "rollout/pipeline.h"

static volatile sig_atomic_t stop_signal = 0;
static void on_signal(int sig) { stop_signal = sig; }

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The CPU backend runs the tiny and test-size models; the full-size Wan transformers need the CUDA backend. */
int colocated_check(const core_recipe *r) {
    char path[4200];
    if ((int64_t)r->height * r->width > 256 * 256)
        return core_error("a %dx%d, %d-frame run is the size of the full Wan models' recipes: it needs the CUDA backend "
                          "(model.device: cuda), and this build trains on the CPU (this machine has no GPU). `vgrpo run "
                          "--dry-run` checks the recipe; recipes/tiny-cpu.yaml runs here", r->height, r->width, r->frames);
    if (rollout_decoder_check(r)) return -1; /* else each worker would refuse it as it starts */
    snprintf(path, sizeof path, "%s/transformer/config.json", r->model_path);
    if (access(path, R_OK))
        return core_error("model.path: %s does not exist (make demo creates runs/demo/model, or run `vgrpo init-model "
                          "--preset tiny --out DIR`)", path);
    wan_config c;
    if (wan_config_load(&c, path)) return -1;
    const int dim = c.num_attention_heads * c.attention_head_dim;
    if (dim >= 1536)
        return core_error("model.path: %s is a full-size Wan transformer (%d layers, dim %d): training it needs the CUDA "
                          "backend (model.device: cuda) and this build runs on the CPU; `vgrpo run --dry-run` checks the "
                          "recipe", r->model_path, c.num_layers, dim);
    /* vgrpo trainer refuses this too, but only after every process has started */
    if ((int64_t)r->prompts_per_step * r->samples_per_prompt < r->trainer_ranks)
        return core_error("parallel.trainer_ranks: %d ranks exceed the %d samples of a step (rollout.prompts_per_step "
                          "%d x rollout.samples_per_prompt %d): every rank needs at least one", r->trainer_ranks,
                          r->prompts_per_step * r->samples_per_prompt, r->prompts_per_step, r->samples_per_prompt);
    return 0;
}

/* "rollout worker 0 was killed by signal 9 (...); rollout worker 1 ..." for the workers that are dead, into buf. */
static void dead_workers(const job *J, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int w = 0; w < J->n_workers && k + 1 < cap; w++) {
        if (J->procs.p[J->worker_first + w].pid) continue;
        char why[4600];
        sup_describe(&J->procs, J->worker_first + w, why, sizeof why);
        k += (size_t)snprintf(buf + k, cap - k, "%s%s (restarted %d time(s))", k ? "; " : "", why,
                              J->procs.p[J->worker_first + w].restarts);
    }
}

int colocated_run(const char *recipe_path, const char *const *sets, int n_sets, const core_recipe *r, int64_t steps,
                  const char *resume, const char *parity, int max_restarts) {
    if (colocated_check(r)) return -1;
    char logs[4200];
    snprintf(logs, sizeof logs, "%s/logs", r->run_dir);
    if (core_mkdir_p(logs)) return -1;
    job J;
    int rc = -1;
    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    stop_signal = 0;
    const int M = r->rollout_workers, N = r->trainer_ranks;
    /* On-policy GRPO alternates: the workers roll out while the trainer waits, then the trainer trains while the
     * workers wait (idle OpenMP threads sleep: OMP_WAIT_POLICY=passive). So the workers share the cores among
     * themselves, and so do the trainer ranks. */
    const int threads = job_threads_per_process(N), worker_threads = job_threads_per_process(M);
    if (job_init(&J, r, NULL) || job_start_reward(&J, r, logs) ||
        job_start_workers(&J, recipe_path, sets, n_sets, NULL, M, worker_threads, logs))
        goto done;
    /* The trainer: argv = [mpirun -n N --bind-to none [--oversubscribe]] vgrpo trainer RECIPE ... */
    const char *exe = sup_self_exe();
    if (!exe) goto done;
    char **argv = calloc((size_t)(40 + 2 * n_sets), sizeof(char *));
    if (!argv) {
        core_error("out of memory");
        goto done;
    }
    char nbuf[16], wbuf[16], sbuf[32];
    snprintf(nbuf, sizeof nbuf, "%d", N);
    snprintf(wbuf, sizeof wbuf, "%d", M);
    snprintf(sbuf, sizeof sbuf, "%lld", (long long)steps);
    int a = 0;
    if (N > 1) {
        argv[a++] = "/usr/bin/mpirun", argv[a++] = "-n", argv[a++] = nbuf, argv[a++] = "--bind-to", argv[a++] = "none";
        if (N > sysconf(_SC_NPROCESSORS_ONLN)) argv[a++] = "--oversubscribe";
        /* One machine: the ranks talk over shared memory (the TCP BTL would listen on 0.0.0.0 in every rank) and
         * OpenMPI's out-of-band channel advertises loopback only; mpirun's own out-of-band listener still binds
         * 0.0.0.0 and [::] (OpenMPI 4.1 has no option to bind it to one address; see README) */
        argv[a++] = "--mca", argv[a++] = "btl", argv[a++] = "self,vader";
        argv[a++] = "--mca", argv[a++] = "pml", argv[a++] = "ob1";
        argv[a++] = "--mca", argv[a++] = "oob_tcp_if_include", argv[a++] = "lo";
        if (geteuid() == 0) setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1), setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1); /* containers without CMA */
        /* A sanitizer build: OpenMPI's start-up allocations (many in plugins it unloads, so no suppression can name
         * them) read as leaks; the ranks run without leak checking (single-rank paths keep it). */
        const char *ao = getenv("ASAN_OPTIONS");
        if (ao) {
            char buf[1024];
            snprintf(buf, sizeof buf, "%s%sdetect_leaks=0", ao, *ao ? ":" : "");
            setenv("ASAN_OPTIONS", buf, 1);
            argv[a++] = "-x", argv[a++] = "ASAN_OPTIONS";
        }
    }
    argv[a++] = (char *)exe, argv[a++] = "trainer", argv[a++] = (char *)recipe_path;
    argv[a++] = "--controller", argv[a++] = J.ctl_ep, argv[a++] = "--workers", argv[a++] = wbuf;
    /* the controller's keys: an inherited memfd; through mpirun as rank 0's standard input (mpirun closes every other
     * descriptor and hands its stdin to rank 0 only) */
    char kbuf[16];
    snprintf(kbuf, sizeof kbuf, "%d", N > 1 ? 0 : job_keys_fd(&J, CORE_CURVE_CONTROLLER));
    argv[a++] = "--keys-fd", argv[a++] = kbuf;
    if (steps > 0) argv[a++] = "--steps", argv[a++] = sbuf;
    if (resume) argv[a++] = "--resume", argv[a++] = (char *)resume;
    if (parity) argv[a++] = "--parity", argv[a++] = (char *)parity;
    for (int s = 0; s < n_sets; s++) argv[a++] = "--set", argv[a++] = (char *)sets[s];
    argv[a] = NULL;
    const int trainer = sup_spawn_fd(&J.procs, N > 1 ? "trainer (mpirun)" : "trainer", argv, threads, NULL,
                                     job_keys_fd(&J, CORE_CURVE_CONTROLLER), N > 1);
    free(argv);
    if (trainer < 0) goto done;
    int forwarded = 0;
    uint8_t gone[SUP_MAX_PROCS] = {0}; /* per rollout worker: dead and not restarted */
    for (;;) {
        if (stop_signal && !forwarded && J.procs.p[trainer].pid) {
            /* graceful: the trainer stops within its step and saves. mpirun would kill the job on SIGTERM (SIGTERM to
             * every rank, SIGKILL soon after); it forwards SIGUSR2, which rank 0 takes as SIGTERM (cmd_trainer.c) */
            kill(J.procs.p[trainer].pid, N > 1 ? SIGUSR2 : SIGTERM);
            forwarded = 1;
        }
        const int dead = sup_poll(&J.procs);
        char why[4600];
        if (!J.procs.p[trainer].pid) { /* reaped, now or together with another process */
            const int st = J.procs.p[trainer].status;
            sup_describe(&J.procs, trainer, why, sizeof why);
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) rc = 0;
            else if (forwarded && ((WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) ||
                                   (N > 1 && WIFEXITED(st) && WEXITSTATUS(st) > 1)))
                /* our own stop reached it before it took the signal (it was starting up: no step had begun) */
                core_error("stopped by signal %d (%s) while the trainer was starting: no step had begun, so none was "
                           "lost and no checkpoint was written", (int)stop_signal, strsignal((int)stop_signal));
            else if (WIFSIGNALED(st) || (N > 1 && WIFEXITED(st) && WEXITSTATUS(st) > 1)) /* died, not an error it named */
                core_error("%s: %s; `vgrpo run` with --resume %s continues from its last checkpoint", why,
                           N > 1 ? "a lost trainer rank ends the whole MPI job (mpirun stops every rank)"
                                 : "the trainer died", r->ckpt_dir ? r->ckpt_dir : r->run_dir);
            else core_error("%s", why);
            break;
        }
        if (dead < 0) {
            sleep_ms(50);
            continue;
        }
        sup_describe(&J.procs, dead, why, sizeof why);
        /* A worker that exits 0 was told to shut down by the trainer, which is about to exit too. */
        const int st = J.procs.p[dead].status;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
        /* A worker or the reward server failed: restart it while it has restarts left (not while stopping) */
        const int wk = dead - J.worker_first, is_worker = wk >= 0 && wk < J.n_workers;
        const int done_restarts = J.procs.p[dead].restarts;
        if ((is_worker || dead == J.reward_proc) && !stop_signal && done_restarts < max_restarts) {
            core_log_warn("vgrpo run: %s: restarting it (restart %d of %d)", why, done_restarts + 1, max_restarts);
            if (!sup_restart(&J.procs, dead)) continue;
            snprintf(why + strlen(why), sizeof why - strlen(why), "; its restart failed: %s", core_last_error());
        }
        if (is_worker) {
            gone[wk] = 1;
            int left = 0; /* running, or dead (not yet seen here) with a restart left */
            for (int w = 0; w < J.n_workers; w++)
                left += !gone[w] && (J.procs.p[J.worker_first + w].pid || J.procs.p[J.worker_first + w].restarts < max_restarts);
            if (left > 0 && !stop_signal) {
                core_log_warn("vgrpo run: %s; not restarted (%d restart(s) done, --max-restarts %d): the run goes on "
                              "with %d rollout worker(s)", why, done_restarts, max_restarts, left);
                continue;
            }
            if (left == 0) {
                char all[4000];
                dead_workers(&J, all, sizeof all);
                snprintf(why, sizeof why, "no rollout worker is left (--max-restarts %d): %s", max_restarts, all);
            }
        } else if (dead == J.reward_proc && done_restarts > 0) {
            snprintf(why + strlen(why), sizeof why - strlen(why), " (restarted %d time(s), --max-restarts %d)",
                     done_restarts, max_restarts);
        }
        /* The run stops: the trainer stops waiting (SIGUSR1), then everything stops. */
        core_error("%s", why);
        if (J.procs.p[trainer].pid) kill(J.procs.p[trainer].pid, SIGUSR1);
        for (int k = 0; k < 600 && J.procs.p[trainer].pid; k++) {
            sleep_ms(50);
            sup_poll(&J.procs);
        }
        core_error("%s", why); /* the first failure is the message */
        break;
    }
done:
    /* After a failure the workers may never hear the trainer's shutdown: do not wait 10 s for them */
    job_stop(&J, rc ? 1.0 : 10.0);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return rc;
}
