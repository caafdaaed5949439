/* cli/cmd_eval.c — `vgrpo eval RECIPE [--checkpoint DIR] [--prompts FILE] [--out DIR] [--workers N] [--set k=v ...]`:
 * the rollout-only eval job (docs/design.md sections 1 and 3).
 *
 * It starts the reward server (`vgrpo reward-server`, unless reward.endpoint names an external one) and N rollout
 * workers (`vgrpo rollout-worker`, N = --workers or parallel.rollout_workers; the cores are shared: each gets
 * OMP_NUM_THREADS = cores / N), binds a ROUTER for the workers, and sends them the fixed eval set in chunks of
 * rollout.batch_size samples: prompt i, sample k has uid i * K + k (K = data.eval_samples_per_prompt), noise stream 3
 * (eval), noise level data.eval_eta (0: the ODE sampler), policy version 0. A LoRA checkpoint (--checkpoint whose
 * transformer/ holds an adapter, trainer/checkpoint/checkpoint.h) is evaluated as its adapters on model.path's base: the workers
 * get `--adapter` (rollout/pipeline.h). The samples, and so the rewards, do not
 * depend on N or on which worker ran which chunk (docs/design.md section 4). What it writes: rollout/eval_report.h
 * (default folder logging.run_dir/eval) and logs/ (one per process); it prints a table. Progress goes to stderr
 * (cli/progress.h: a bar on a terminal, plain lines otherwise). Any process that exits early stops the eval with an
 * error naming it, its exit status or signal and its log; that first failure is the error reported. --prompts takes a text file (one prompt per line) or a
 * VBench-style JSON list, or JSON lines with an image per prompt (core/prompts.h), read under data.max_prompt_file_mb
 * / data.max_prompt_bytes. With images (image to video, trainer/run/images.h) each prompt's condition is encoded here once
 * and sent with the requests. Before
 * anything starts it prints the estimate of memory and work (trainer/budget/budget.h: the workers, the reward server) and
 * refuses a job that does not fit this machine's memory (--force: runs anyway).
 * Exit status 0, 1 on failure, 2 on a usage error. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/job.h"
#include "cli/model_init.h"
#include "cli/opts.h"
#include "cli/progress.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/philox.h"
#include "core/prompts.h"
#include "core/recipe.h"
#include "reward/learned.h"
#include "reward/scorers.h"
#include "rollout/eval_report.h"
#include "rollout/text_to_video.h"
#include "trainer/budget/budget.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/net/controller.h"
#include "trainer/run/images.h"
#include "trainer/run/run.h"

#define EVAL_START_TIMEOUT_S 600.0
#define EVAL_CHUNK_TIMEOUT_S 3600.0

typedef struct {
    const char *recipe, *checkpoint, *prompts, *out;
    int workers, force;
    const char *const *sets;
    int n_sets;
} eval_args;

typedef struct {
    eval_report *rep;
    int total, tty;
    double t0;
} eval_progress;

static volatile sig_atomic_t stop_flag = 0;
static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static int on_chunk(void *ctx, const core_rollout_sample *samples, const core_rollout_result *res, int n,
                    const uint8_t *videos, const int64_t vshape[4]) {
    (void)samples;
    eval_progress *P = ctx;
    if (eval_report_add(P->rep, res, n, videos, vshape)) return -1;
    cli_progress(stderr, P->tty, "eval: samples", eval_report_done(P->rep), P->total, P->t0);
    return 0;
}

/* The weights of --checkpoint: DIR/transformer (a checkpoint-N folder) or DIR itself, a transformer folder; or a
 * LoRA checkpoint (*adapter = 1, out = its adapter path: rollout_checkpoint_weights), whose adapters the workers put
 * on the base of model.path. */
static int checkpoint_transformer(const char *ckpt, char *out, size_t cap, int *adapter) {
    *adapter = 0;
    snprintf(out, cap, "%s/transformer", ckpt);
    if (!core_is_dir(out)) snprintf(out, cap, "%s", ckpt);
    char cfgp[4400];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", out);
    if (!access(cfgp, R_OK)) return 0;
    if (rollout_checkpoint_weights(ckpt, out, cap, adapter)) return core_error_push("--checkpoint: ");
    return 0;
}

/* A failed eval: when one of the job's processes has exited, it is the cause (a worker's "reward server
 * unreachable" is its symptom), so the error names it, its status and its log, before the symptom. */
static void name_dead_process(job *J) {
    char first[2048], why[4600];
    snprintf(first, sizeof first, "%s", core_last_error());
    sup_poll(&J->procs);
    for (int i = 0; i < J->procs.n; i++)
        if (!J->procs.p[i].pid && !(WIFEXITED(J->procs.p[i].status) && WEXITSTATUS(J->procs.p[i].status) == 0) &&
            !strstr(first, J->procs.p[i].name)) {
            sup_describe(&J->procs, i, why, sizeof why);
            core_error("%s; %s", why, first);
            return;
        }
}

static int run_eval_job(const eval_args *A, const core_recipe *r) {
    job J;
    memset(&J, 0, sizeof J);
    J.reward_proc = -1;
    core_prompts prompts = {0};
    eval_report *rep = NULL;
    ctl_server *ctl = NULL;
    core_rollout_sample *samp = NULL;
    core_rollout_result *res = NULL;
    char transformer[4200] = "", out[4200], logs[4300], tp[4200];
    int rc = -1, started = 0;
    const char *prompt_path = A->prompts ? A->prompts : r->eval_prompt_file;
    const int N = A->workers > 0 ? A->workers : r->rollout_workers, K = r->eval_samples_per_prompt;
    const core_prompts_limits lim = core_recipe_prompt_limits(r);
    const core_prompts *lists[1] = {&prompts};
    float *img = NULL; /* image to video: each prompt's condition [n, C, 1, h, w] */
    int64_t cshape[4] = {0, 1, 0, 0};
    /* the prompts first: an image recipe refused on model.init_preset's pipeline is refused before it is written */
    if (core_prompts_read_limited(&prompts, prompt_path, &lim) || trainer_check_prompts(r, &prompts) ||
        trainer_images_check(r, lists, 1, A->prompts ? "--prompts" : "data.eval_prompt_file") || ensure_model(r))
        goto done;
    /* The scorers of a server we start must exist; an external server (reward.endpoint) serves its own. */
    for (int i = 0; !r->reward_endpoint && i < r->scorers.n; i++)
        if (!reward_find(r->scorers.v[i])) {
            core_error_push("reward.scorers.%d: ", i);
            goto done;
        }
    /* learned scorers: their folders and reward.frames (the server loads the weights) */
    if (reward_recipe_check(r, 1)) goto done;
    snprintf(tp, sizeof tp, "%s/transformer", r->model_path);
    if (!A->checkpoint && !core_is_dir(tp)) {
        core_error("model.path: %s does not exist (make demo creates runs/demo/model, or run `vgrpo init-model "
                   "--preset tiny --out DIR`)", tp);
        goto done;
    }
    int lora = 0;
    if (A->checkpoint && checkpoint_transformer(A->checkpoint, transformer, sizeof transformer, &lora)) goto done;
    if (A->checkpoint) trainer_ckpt_print_run(A->checkpoint, stdout); /* the run it belongs to, one line */
    if (lora && !core_is_dir(tp)) {
        core_error("--checkpoint %s holds LoRA adapters; their base, model.path %s, does not exist", A->checkpoint, tp);
        goto done;
    }
    if (A->checkpoint && !lora && rollout_checkpoint_fits(transformer, r->model_path, "--checkpoint")) goto done;
    if (prompts.n_images) {
        char cp[4300];
        wan_config wc;
        int F, h, w;
        snprintf(cp, sizeof cp, "%s/config.json", transformer[0] && !lora ? transformer : tp);
        core_recipe_latent_size(r, &F, &h, &w);
        if (wan_config_load(&wc, cp)) goto done;
        const int64_t K = wan_cond_channels(&wc); /* Wan 2.2 I2V-A14B: [K, F, h, w] concatenated */
        if (trainer_images_encode(r, wc.out_channels, K, lists, 1, &img)) goto done;
        cshape[0] = K ? K : wc.out_channels, cshape[1] = K ? F : 1, cshape[2] = h, cshape[3] = w;
    }
    if (A->out) snprintf(out, sizeof out, "%s", A->out);
    else snprintf(out, sizeof out, "%s/eval", r->run_dir);
    snprintf(logs, sizeof logs, "%s/logs", out);
    if (!(rep = eval_report_open(out, &prompts, K)) || core_mkdir_p(logs)) goto done;
    const int total = prompts.n * K;
    if (!(samp = calloc((size_t)total, sizeof *samp)) || !(res = calloc((size_t)total, sizeof *res))) {
        core_error("out of memory");
        goto done;
    }
    for (int u = 0; u < total; u++) {
        const int i = u / K;
        samp[u] = (core_rollout_sample){.uid = (uint64_t)u, .prompt_index = i, .prompt = prompts.text[i],
                                        .metadata = core_prompts_meta(&prompts, i),
                                        .condition = img ? img + (int64_t)i * cshape[0] * cshape[1] * cshape[2] * cshape[3] : NULL};
    }
    if (job_init(&J, r, &stop_flag) || job_start_reward(&J, r, logs)) goto done;
    started = 1;
    size_t max_frame = 0;
    if (ctl_max_frame_bytes(r, &max_frame) ||
        !(ctl = ctl_open(J.ctl_ep, job_keys(&J, CORE_CURVE_CONTROLLER), max_frame, job_abort_check, &J)) ||
        job_start_workers_lora(&J, A->recipe, A->sets, A->n_sets, transformer[0] && !lora ? transformer : NULL,
                               lora ? transformer : NULL, N, job_threads_per_process(N), logs))
        goto done;
    char shown[8500];
    if (lora) snprintf(shown, sizeof shown, "%s + LoRA %s", r->model_path, transformer);
    else snprintf(shown, sizeof shown, "%s", transformer[0] ? transformer : r->model_path);
    printf("vgrpo eval: %s, %d prompts x %d samples (eta %g, %d steps), %d worker(s), reward server %s -> %s\n",
           shown, prompts.n, K, (double)r->eval_eta, r->num_steps, N,
           r->reward_endpoint ? r->reward_endpoint : "started here", out);
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    eval_progress P = {.rep = rep, .total = total, .tty = isatty(2)};
    core_rollout_request tmpl = {.policy_version = 0, .stream = CORE_STREAM_EVAL_NOISE, .eta = r->eval_eta,
                                 .return_trajectories = 0, .return_videos = 1};
    if (img) memcpy(tmpl.cond_shape, cshape, sizeof cshape);
    int failed = ctl_wait_workers(ctl, N, EVAL_START_TIMEOUT_S);
    P.t0 = cli_progress_now();
    if (!failed) failed = ctl_rollout(ctl, &tmpl, samp, total, r->batch_size, EVAL_CHUNK_TIMEOUT_S, res, on_chunk, &P);
    const double secs = cli_progress_now() - P.t0;
    if (!failed)
        for (int u = 0; u < total; u++) core_rollout_result_free(&res[u]);
    ctl_shutdown(ctl, 5.0); /* keeps the error of a failed rollout */
    if (failed) goto done;
    if (eval_report_write(rep, r, A->recipe, A->checkpoint, N, secs, stdout)) goto done;
    rc = 0;
done:
    if (rc && started) name_dead_process(&J);
    ctl_close(ctl);
    if (started) job_stop(&J, 5.0);
    free(samp), free(res), free(img);
    eval_report_free(rep);
    core_prompts_free(&prompts);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    eval_args A = {0};
    opts_list sets = {.v = calloc((size_t)argc, sizeof(char *)), .cap = argc};
    if (!sets.v) return 1;
    const opts_spec opts[] = {
        {.name = "checkpoint", .type = OPTS_STRING, .str = &A.checkpoint, .meta = "DIR",
         .help = "weights: a checkpoint folder (its transformer/) or a transformer folder\n"
                 "(default: model.path/transformer); a LoRA checkpoint: its adapters on model.path"},
        {.name = "prompts", .type = OPTS_STRING, .str = &A.prompts, .meta = "FILE",
         .help = "prompts: text (one per line), VBench-style JSON [{\"prompt_en\", ...}] or\n"
                 "JSON lines {\"prompt\", \"image\": PNG} (image to video)\n"
                 "(default: data.eval_prompt_file)"},
        {.name = "out", .type = OPTS_STRING, .str = &A.out, .meta = "DIR",
         .help = "output folder (default: logging.run_dir/eval)"},
        {.name = "workers", .type = OPTS_INT, .i = &A.workers, .min = 1, .max = 32, .meta = "N",
         .help = "rollout worker processes (default: parallel.rollout_workers)"},
        {.name = "set", .type = OPTS_LIST, .list = &sets, .meta = "key.path=value",
         .help = "override a recipe key (repeatable)"},
        {.name = "force", .type = OPTS_FLAG, .flag = &A.force,
         .help = "run even when the estimate (trainer/budget/budget.h) exceeds the memory available\n"
                 "(a warning instead of the refusal)"},
        {0}};
    const opts_pos pos[] = {{.name = "RECIPE", .dst = &A.recipe, .required = 1, .help = "the recipe YAML"}, {0}};
    const opts_cmd cmd = {.name = "eval", .opts = opts, .pos = pos,
                          .epilog = "Samples: data.eval_samples_per_prompt per prompt, noise level data.eval_eta (0: "
                                    "ODE), seed data.seed."};
    int status = opts_parse(&cmd, argc, argv, stdout, stderr);
    if (status != OPTS_OK) {
        free(sets.v);
        return opts_exit_status(status);
    }
    A.sets = sets.v, A.n_sets = sets.n;
    core_recipe r;
    const budget_request q = {.job = BUDGET_JOB_EVAL, .workers = A.workers, .eval_prompts = A.prompts};
    status = 1;
    if (core_recipe_load(&r, A.recipe, sets.v, sets.n) || budget_preflight(&r, &q, A.force, stdout) ||
        run_eval_job(&A, &r))
        fprintf(stderr, "vgrpo eval: %s\n", core_last_error());
    else
        status = 0;
    core_recipe_release(&r);
    free(sets.v);
    return status;
}
