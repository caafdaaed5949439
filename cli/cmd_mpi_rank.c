/* cli/cmd_mpi_rank.c — `vgrpo mpi-rank`: one rank of a run launched as one MPI job (cli/launch_mpi.c says what the
 * job is and lists the steps): the options, then steps 1-8 in order, each start-up step's outcome known to every rank
 * (cli/launch_mpi_startup.c), and the role this rank runs (cli/launch_mpi_roles.c). */
#include <mpi.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/colocated.h"
#include "cli/commands.h"
#include "cli/job.h"
#include "cli/launch_mpi.h"
#include "cli/launch_mpi_rank.h"
#include "cli/model_init.h"
#include "cli/opts.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/gpu_assign.h"
#include "core/host_addr.h"
#include "core/log.h"
#include "core/run_lock.h"
#include "trainer/budget/budget.h"

int cmd_mpi_rank(int argc, char **argv) {
    signal(SIGUSR1, SIG_IGN); /* mpirun forwards both to every rank; trainer rank 0 takes them below */
    signal(SIGUSR2, SIG_IGN);
    const char *path = NULL, *role_opt = NULL, *bind_host = NULL;
    int steps = 0, launched = 0, force = 0, overwrite = 0;
    trainer_run_opts o = {0};
    opts_list sets = {.v = calloc((size_t)argc, sizeof(char *)), .cap = argc};
    if (!sets.v) return 1;
    const opts_spec opts[] = {
        {.name = "role", .type = OPTS_STRING, .str = &role_opt, .meta = "ROLE",
         .help = "trainer | rollout-worker | reward-server: what this rank's place in the job must make it\n"
                 "(default: found from MPI_APPNUM, or from rank ranges when every rank runs one command)"},
        {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "key.path=value",
         .help = "override a recipe key (repeatable; the same on every rank)"},
        {.name = "steps", .type = OPTS_INT, .i = &steps, .min = 1, .max = 2000000000, .meta = "N",
         .help = "GRPO steps instead of optim.total_steps"},
        {.name = "resume", .type = OPTS_STRING, .str = &o.resume, .meta = "DIR", .help = "continue from a checkpoint"},
        {.name = "bind-host", .type = OPTS_STRING, .str = &bind_host, .meta = "ADDR|IFACE",
         .help = "the address (or interface) the controller and the reward server bind on (default: "
                 CORE_HOST_ADDR_ENV ",\nelse 127.0.0.1 on one host, else the address that routes to the other hosts)"},
        {.name = "launched", .type = OPTS_FLAG, .flag = &launched,
         .help = "started by `vgrpo run --launcher mpirun`, which checked the recipe and holds the run folder's lock"},
        {.name = "force", .type = OPTS_FLAG, .flag = &force,
         .help = "run even when the estimate exceeds the memory available (without --launched)"},
        {.name = "overwrite", .type = OPTS_FLAG, .flag = &overwrite,
         .help = "without --launched: start afresh in a folder holding an earlier run's checkpoints (deletes them)"},
        {0}};
    const opts_pos pos[] = {{.name = "RECIPE", .dst = &path, .required = 1, .help = "the recipe YAML"}, {0}};
    const opts_cmd cmd = {
        .name = "mpi-rank", .opts = opts, .pos = pos,
        .about = "One rank of a run launched as one MPI job (`vgrpo run RECIPE --launcher mpirun`, or every rank of\n"
                 "`srun -n T+W+1 vgrpo mpi-rank RECIPE`): a trainer rank, a rollout worker or the reward server."};
    const int prc = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (prc != OPTS_OK) {
        free(sets.v);
        return opts_exit_status(prc);
    }
    o.steps = steps;
    launch L;
    memset(&L, 0, sizeof L);
    L.bind_host = bind_host;
    if (sp_comm_mpi_world(&argc, &argv, &L.world)) {
        fprintf(stderr, "vgrpo mpi-rank: %s\n", core_last_error());
        free(sets.v);
        return 1;
    }
    L.rank = L.world->rank, L.size = L.world->size;
    core_recipe r;
    memset(&r, 0, sizeof r);
    core_run_locks lk = CORE_RUN_LOCKS_INIT;
    ctl_server *ctl = NULL;
    int status = 1, loaded = 0, clean_fail = 0;
    /* 1, 2: the recipe, the roles */
    loaded = !core_recipe_load(&r, path, sets.v, sets.n);
    int failed = !loaded || launch_mpi_check(&r) || core_file_mode_apply(r.file_mode); /* every host's ranks */
    L.r = &r;
    if (launch_all_ok(&L, failed, "the recipe") || launch_all_ok(&L, launch_find_roles(&L, role_opt), "the roles"))
        goto startup_failed;
    /* 3: the role's communicator; the trainer's checks (as `vgrpo trainer`) */
    if (sp_comm_split(L.world, (int)L.role, L.rank, launch_role_names[L.role], &L.group))
        launch_fatal(&L, "the role split");
    /* model.device cuda: the weight sync's group of trainer rank 0 (its rank 0) and the workers, for NCCL syncs
     * (trainer/net/sync_nccl.h) */
    const int in_sync = L.rank == 0 || L.role == ROLE_WORKER;
    if (r.choice.device == CORE_CUDA && sp_comm_split(L.world, in_sync ? 0 : 1, L.rank, "sync", &L.sync))
        launch_fatal(&L, "the weight sync's split");
    if (L.sync && !in_sync) sp_comm_destroy(L.sync), L.sync = NULL;
    failed = L.role == ROLE_TRAINER && trainer_check_recipe(&r);
    core_gpu_plan gp; /* a worker's node's GPU plan (core/gpu_assign.h; a trainer rank's is in its checks) */
    if (!failed && L.role == ROLE_WORKER && r.choice.device == CORE_CUDA)
        failed = core_gpu_plan_make(&r, core_gpu_visible(), &gp);
    if (!failed && L.role == ROLE_TRAINER && r.prompts_per_step * r.samples_per_prompt < L.group->size)
        failed = core_error("parallel.trainer_ranks %d exceeds the %d samples of a step (B x G)", L.group->size,
                            r.prompts_per_step * r.samples_per_prompt);
    /* 4: under srun, what `vgrpo run` does before it execs mpirun */
    if (!failed && !launched && L.rank == 0) {
        const budget_request q = {.job = BUDGET_JOB_RUN};
        failed = budget_preflight(&r, &q, force, stdout) || ensure_model(&r) || colocated_check(&r) ||
                 trainer_claim_folders(&r, o.resume, overwrite, &lk);
    }
    if (launch_all_ok(&L, failed, "the checks")) goto startup_failed;
    /* 5: the keys */
    if (launch_all_ok(&L, launch_share_keys(&L), "the keys")) goto startup_failed;
    if (L.role == ROLE_TRAINER) core_log_set_rank(L.group->rank);
    /* 6, 7: endpoints, then the role */
    const int threads = job_threads_per_process(L.local_same_role);
    if (L.role == ROLE_REWARD) {
        omp_set_num_threads(1);
        if (launch_redirect_output(r.run_dir, "reward-server")) {
            launch_exchange(&L, NULL);
            goto startup_failed;
        }
        const int rc = launch_run_reward(&L, &r);
        if (rc && L.world == NULL && L.ctl_ep[0]) { /* it served, then failed: the run cannot go on */
            fprintf(stderr, "reward-server: %s\n", core_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        status = rc ? 1 : 0;
    } else if (L.role == ROLE_WORKER) {
        omp_set_num_threads(threads);
        if (launch_exchange(&L, "")) goto startup_failed;
        char name[32];
        snprintf(name, sizeof name, "worker-%d", L.role_rank);
        const int rc = launch_redirect_output(r.run_dir, name) ? -2 : launch_run_worker(&L, &r);
        if (rc == -2) { /* before its hello: the controller would wait for it; end the job */
            fprintf(stderr, "rollout-worker %s: %s\n", name, core_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        /* a worker that left (-1) exits 0: the controller went on without it, and the job's status is the trainer's */
        if (rc == -1) fprintf(stderr, "rollout-worker %s: left the run; the controller gives its work to the others\n", name);
        status = 0;
    } else {
        omp_set_num_threads(threads);
        char ep[REC] = "";
        int ok = 1;
        if (L.role_rank == 0) {
            signal(SIGUSR1, launch_on_usr1);
            signal(SIGUSR2, launch_on_usr2);
            size_t max_frame = 0;
            ok = !ctl_max_frame_bytes(L.r, &max_frame) && !launch_bind_endpoint(&L, ep, sizeof ep) &&
                 (ctl = ctl_open(ep, &L.keys, max_frame, launch_abort_check, NULL)) &&
                 !ctl_set_sync_bucket(ctl, (int64_t)L.r->sync_bucket_mib << 20) && !ctl_endpoint(ctl, ep, sizeof ep);
            if (ok) ctl_set_sync(ctl, (int)L.r->choice.sync, L.sync);
        }
        if (launch_exchange(&L, ok ? ep : NULL)) goto startup_failed;
        if (L.role_rank == 0) {
            char rw[REC + 64] = "reward.endpoint: not a process of the job, plain ZeroMQ";
            if (L.reward_rank >= 0) snprintf(rw, sizeof rw, "CURVE; rank %d on %s", L.reward_rank, L.hosts[L.reward_rank]);
            fprintf(stderr, "vgrpo: one MPI job: %d trainer rank(s), %d rollout worker(s)%s; the run's keys went from "
                            "rank 0 to each rank over MPI\n"
                            "vgrpo: controller on %s (CURVE; address: %s)\n"
                            "vgrpo: reward server on %s (%s)\n",
                    L.n_role[ROLE_TRAINER], L.n_role[ROLE_WORKER], L.reward_rank >= 0 ? ", the reward server" : "",
                    L.ctl_ep, L.addr_how, L.rew_ep, rw);
        }
        const int rc = launch_run_trainer(&L, &o, ctl, &clean_fail);
        if (rc) fprintf(stderr, "vgrpo trainer: %s\n", core_last_error());
        status = rc ? 1 : 0;
        if (rc && !clean_fail) MPI_Abort(MPI_COMM_WORLD, 1); /* as `vgrpo trainer`: every rank stops */
        if (L.role_rank == 0) {
            ctl_shutdown(ctl, 5.0);
            if (L.reward_rank >= 0 && launch_stop_reward_server(&L)) { /* it would keep the job alive */
                fprintf(stderr, "vgrpo: the reward server at %s: %s; ending the job\n", L.rew_ep, core_last_error());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
    }
    goto done;
startup_failed:
    if (L.rank == 0) fprintf(stderr, "vgrpo mpi-rank: %s\n", core_last_error());
    status = 1;
done: /* every rank arrives here together after a start-up failure (each step's outcome is known to all) */
    ctl_close(ctl);
    memset(&L.keys, 0, sizeof L.keys);
    core_run_locks_release(&lk);
    if (loaded) core_recipe_release(&r);
    sp_comm_destroy(L.group);
    sp_comm_destroy(L.sync);
    sp_comm_destroy(L.world);
    sp_comm_mpi_finalize();
    free(L.roles);
    free(L.hosts);
    free(sets.v);
    return status;
}
