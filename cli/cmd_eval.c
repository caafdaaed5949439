/* cli/cmd_eval.c — `vgrpo eval RECIPE [--checkpoint DIR] [--prompts FILE] [--out DIR] [--workers N] [--set k=v ...]`:
 * the rollout-only eval job (DESIGN.md sections 1 and 3).
 *
 * It starts the reward server (`vgrpo reward-server`, unless reward.endpoint names an external one) and N rollout
 * workers (`vgrpo rollout-worker`, N = --workers or parallel.rollout_workers; the cores are shared: each gets
 * OMP_NUM_THREADS = cores / N), binds a ROUTER for the workers, and sends them the fixed eval set in chunks of
 * rollout.batch_size samples: prompt i, sample k has uid i * K + k (K = data.eval_samples_per_prompt), noise stream 3
 * (eval), noise level data.eval_eta (0: the ODE sampler), policy version 0. The samples, and so the rewards, do not
 * depend on N or on which worker ran which chunk (DESIGN.md section 4).
 *
 * Writes into the output folder (default logging.run_dir/eval; an earlier eval's videos and sheets there are removed):
 *   eval.json         per prompt and sample: uid, rewards per scorer, total, video file, xxh64 of the raw video;
 *                     per scorer (and the total): n, mean, std (population), min, max, standard error of the mean
 *                     (sample std / sqrt(n)); timing in "throughput" (samples/s, denoising steps/s).
 *   videos/pNNNN_sK.mp4, sheets/pNNNN.png (one contact sheet per prompt: rows = samples), logs/ (one per process)
 * and prints a table. A progress bar runs on stderr. Any child that exits early stops the eval with an error naming
 * it and its log. --prompts takes a text file (one prompt per line) or a VBench-style JSON list of objects with
 * "prompt_en" and string attributes, passed to the scorers as metadata ("color_en" becomes "color").
 * Exit status 0, 1 on failure, 2 on a usage error. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/grpo_run.h"
#include "cli/job.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/philox.h"
#include "core/recipe.h"
#include "core/wire_rollout.h"
#include "model/text/word_embed.h"
#include "reward/scorers.h"
#include "rollout/png.h"
#include "rollout/video.h"
#include "trainer/controller.h"

#define EVAL_FPS 16.0
#define EVAL_SHEET_COLS 8
#define EVAL_START_TIMEOUT_S 600.0
#define EVAL_CHUNK_TIMEOUT_S 3600.0

/* ---- the prompt set ---- */

typedef struct {
    int n;
    char **text;
    json_t **meta; /* [n] objects of strings (possibly empty) */
} eval_prompts;

static void eval_prompts_free(eval_prompts *p) {
    for (int i = 0; i < p->n; i++) free(p->text[i]), json_decref(p->meta[i]);
    free(p->text), free(p->meta);
    memset(p, 0, sizeof *p);
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* A VBench-style JSON list: [{"prompt_en": "...", "color_en": "red", ...}, ...]. */
static int read_json_prompts(eval_prompts *p, const char *path) {
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return core_error("%s:%d: %s", path, je.line, je.text);
    int rc = -1;
    if (!json_is_array(root) || json_array_size(root) == 0) {
        core_error("%s: expected a non-empty JSON list of {\"prompt_en\": ...} objects", path);
        goto done;
    }
    p->n = 0;
    const size_t n = json_array_size(root);
    p->text = calloc(n, sizeof *p->text);
    p->meta = calloc(n, sizeof *p->meta);
    if (!p->text || !p->meta) {
        core_error("out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(root, i);
        const char *pr = json_string_value(json_object_get(o, "prompt_en"));
        if (!json_is_object(o) || !pr || !pr[0]) {
            core_error("%s: entry %zu: needs a non-empty string \"prompt_en\"", path, i);
            goto done;
        }
        json_t *md = json_object();
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)o, k, v) {
            if (!json_is_string(v) || !strcmp(k, "prompt_en")) continue; /* lists (e.g. "dimension") are not metadata */
            json_object_set(md, !strcmp(k, "color_en") ? "color" : k, v);
        }
        p->text[p->n] = strdup(pr);
        p->meta[p->n] = md;
        p->n++;
        if (!p->text[p->n - 1]) {
            core_error("out of memory");
            goto done;
        }
    }
    rc = 0;
done:
    json_decref(root);
    if (rc) eval_prompts_free(p);
    return rc;
}

static int read_prompts(eval_prompts *p, const char *path) {
    memset(p, 0, sizeof *p);
    if (ends_with(path, ".json")) return read_json_prompts(p, path);
    local_prompts lp;
    if (local_prompts_read(&lp, path)) return -1;
    p->n = lp.n;
    p->text = lp.text; /* ownership moves */
    if (!(p->meta = calloc((size_t)p->n, sizeof *p->meta))) return core_error("out of memory");
    for (int i = 0; i < p->n; i++) p->meta[i] = json_object();
    return 0;
}

/* Start-up checks of the prompts against the recipe: color_match needs a colour for every prompt; word_embed
 * needs at most rollout.text_len words. */
static int check_prompts(const eval_prompts *p, const core_recipe *r, const char *path) {
    int need_color = 0;
    for (int i = 0; i < r->scorers.n; i++) need_color |= !strcmp(r->scorers.v[i], "color_match");
    for (int i = 0; i < p->n; i++) {
        if (!strcmp(r->text_encoder, "word_embed") && wan_word_count(p->text[i]) > r->text_len)
            return core_error("%s: prompt %d \"%s\" has %d words, more than rollout.text_len %d", path, i + 1,
                              p->text[i], wan_word_count(p->text[i]), r->text_len);
        if (need_color) {
            const char *c = json_string_value(json_object_get(p->meta[i], "color"));
            const char *keys[1] = {"color"}, *vals[1] = {c};
            reward_meta md = {c ? 1 : 0, keys, vals};
            int col;
            if (reward_target_color(p->text[i], &md, &col))
                return core_error_push("%s: prompt %d (color_match): ", path, i + 1);
        }
    }
    return 0;
}

/* ---- helpers ---- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Removes an earlier eval's outputs from dir (files named p<digits>...<suffix>), so the folder holds this eval's
 * files only. */
static int clear_outputs(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return core_error("%s: cannot read: %s", dir, strerror(errno));
    struct dirent *e;
    char p[4400];
    while ((e = readdir(d)))
        if (e->d_name[0] == 'p' && e->d_name[1] >= '0' && e->d_name[1] <= '9' && ends_with(e->d_name, suffix)) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    return 0;
}

static void progress(int done, int total, double t0, int tty) {
    const int width = 30, fill = total ? done * width / total : width;
    const double dt = now_s() - t0;
    if (!tty && done != total) return;
    fprintf(stderr, "\reval [");
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %d/%d samples, %.2f samples/s%s", done, total, dt > 0 ? done / dt : 0.0, done == total ? "\n" : "");
    fflush(stderr);
}

typedef struct {
    int n;
    double sum, sumsq, min, max;
} stat_acc;

static void acc_add(stat_acc *a, double x) {
    if (!a->n || x < a->min) a->min = x;
    if (!a->n || x > a->max) a->max = x;
    a->n++;
    a->sum += x;
}

/* mean, population std, sample-std standard error; computed in a second pass for accuracy. */
static json_t *acc_json(const stat_acc *a, const double *xs, double *mean_out, double *se_out) {
    const double mean = a->sum / a->n;
    double q = 0;
    for (int i = 0; i < a->n; i++) q += (xs[i] - mean) * (xs[i] - mean);
    const double sd = sqrt(q / a->n), se = a->n > 1 ? sqrt(q / (a->n - 1)) / sqrt((double)a->n) : 0.0;
    *mean_out = mean, *se_out = se;
    return json_pack("{s:i, s:f, s:f, s:f, s:f, s:f}", "n", a->n, "mean", mean, "std", sd, "min", a->min, "max",
                     a->max, "se", se);
}

/* ---- the job ---- */

typedef struct {
    const core_recipe *r;
    eval_prompts prompts;
    int K, total;                /* samples per prompt, all samples */
    const char *out;
    /* results by uid */
    float *reward_total;         /* [total] */
    float *rewards;              /* [total, n_scorers] */
    uint64_t *video_hash;        /* [total] */
    uint8_t *got;                /* [total] */
    /* videos of prompts not yet complete (sheet written when all K arrived) */
    uint8_t **pvideo;            /* [n prompts] -> [K, frames, h, w, 3] */
    int *pcount;
    int64_t vshape[4];
    int n_scorers;
    char scorer_names[CORE_TRAJ_MAX_REWARDS][CORE_TRAJ_NAME_MAX];
    int n_done, tty;
    double t0;
} eval_state;

static int store_result(eval_state *E, const core_rollout_result *res, const uint8_t *video, const int64_t vshape[4]) {
    const int uid = (int)res->traj.uid, pi = (int)res->traj.prompt_index, k = uid % E->K;
    if (E->got[uid]) return core_error("uid %d was answered twice", uid);
    if (!E->n_scorers && !E->got[uid]) {
        int seen = 0;
        for (int u = 0; u < E->total; u++) seen |= E->got[u];
        if (!seen) {
            E->n_scorers = res->traj.n_rewards;
            for (int s = 0; s < E->n_scorers; s++) memcpy(E->scorer_names[s], res->traj.reward_names[s], CORE_TRAJ_NAME_MAX);
            memcpy(E->vshape, vshape, sizeof E->vshape);
        }
    }
    if (res->traj.n_rewards != E->n_scorers)
        return core_error("uid %d: %d rewards, earlier samples had %d", uid, res->traj.n_rewards, E->n_scorers);
    for (int s = 0; s < E->n_scorers; s++) {
        if (strcmp(res->traj.reward_names[s], E->scorer_names[s]))
            return core_error("uid %d: scorer %d is \"%s\", earlier samples had \"%s\"", uid, s, res->traj.reward_names[s],
                              E->scorer_names[s]);
        E->rewards[(int64_t)uid * E->n_scorers + s] = res->traj.rewards[s];
    }
    if (memcmp(vshape, E->vshape, sizeof E->vshape)) return core_error("uid %d: video shape differs from earlier samples", uid);
    E->reward_total[uid] = res->traj.reward_total;
    E->video_hash[uid] = res->video_hash;
    E->got[uid] = 1;
    const int64_t vb = vshape[0] * vshape[1] * vshape[2] * vshape[3];
    char path[4200];
    snprintf(path, sizeof path, "%s/videos/p%04d_s%d.mp4", E->out, pi, k);
    if (rollout_video_write_mp4(path, video, (int)vshape[0], (int)vshape[1], (int)vshape[2], EVAL_FPS, NULL, NULL)) return -1;
    if (!E->pvideo[pi] && !(E->pvideo[pi] = malloc((size_t)(vb * E->K)))) return core_error("out of memory");
    memcpy(E->pvideo[pi] + vb * k, video, (size_t)vb);
    if (++E->pcount[pi] == E->K) {
        char labels[64][32];
        const char *lp[64];
        const int rows = E->K < 64 ? E->K : 64;
        for (int j = 0; j < rows; j++) {
            snprintf(labels[j], sizeof labels[j], "S%d %.3f", j, (double)E->reward_total[pi * E->K + j]);
            lp[j] = labels[j];
        }
        snprintf(path, sizeof path, "%s/sheets/p%04d.png", E->out, pi);
        if (rollout_png_write_sheet(path, E->pvideo[pi], rows, (int)vshape[0], (int)vshape[1], (int)vshape[2],
                                    EVAL_SHEET_COLS, lp))
            return -1;
        free(E->pvideo[pi]);
        E->pvideo[pi] = NULL;
    }
    return 0;
}

static int write_eval_json(eval_state *E, const char *recipe_path, const char *checkpoint, int workers, double secs,
                           FILE *table) {
    const core_recipe *r = E->r;
    json_t *root = json_object(), *plist = json_array(), *stats = json_object();
    json_object_set_new(root, "recipe", json_string(recipe_path));
    json_object_set_new(root, "model", json_string(r->model_path));
    json_object_set_new(root, "checkpoint", checkpoint ? json_string(checkpoint) : json_null());
    json_object_set_new(root, "seed", json_integer(r->seed));
    json_object_set_new(root, "eta", json_real(r->eval_eta));
    json_object_set_new(root, "num_steps", json_integer(r->num_steps));
    json_object_set_new(root, "samples_per_prompt", json_integer(E->K));
    for (int i = 0; i < E->prompts.n; i++) {
        json_t *samples = json_array();
        for (int k = 0; k < E->K; k++) {
            const int u = i * E->K + k;
            json_t *rw = json_object();
            for (int s = 0; s < E->n_scorers; s++)
                json_object_set_new(rw, E->scorer_names[s], json_real(E->rewards[(int64_t)u * E->n_scorers + s]));
            char hx[17], vid[64];
            core_hash_hex(E->video_hash[u], hx);
            snprintf(vid, sizeof vid, "videos/p%04d_s%d.mp4", i, k);
            json_array_append_new(samples, json_pack("{s:i, s:i, s:f, s:o, s:s, s:s}", "uid", u, "sample", k, "total",
                                                     (double)E->reward_total[u], "rewards", rw, "video", vid,
                                                     "video_xxh64", hx));
        }
        json_array_append_new(plist, json_pack("{s:i, s:s, s:O, s:o}", "index", i, "prompt", E->prompts.text[i],
                                               "metadata", E->prompts.meta[i], "samples", samples));
    }
    double *xs = malloc(sizeof(double) * (size_t)E->total);
    if (!xs) return json_decref(root), json_decref(plist), json_decref(stats), core_error("out of memory");
    fprintf(table, "\n%-16s %6s %10s %10s %10s %10s %10s\n", "scorer", "n", "mean", "std", "min", "max", "se");
    for (int s = -1; s < E->n_scorers; s++) {
        stat_acc a = {0};
        for (int u = 0; u < E->total; u++) {
            xs[u] = s < 0 ? E->reward_total[u] : E->rewards[(int64_t)u * E->n_scorers + s];
            acc_add(&a, xs[u]);
        }
        double mean, se;
        json_t *j = acc_json(&a, xs, &mean, &se);
        const char *name = s < 0 ? "total" : E->scorer_names[s];
        fprintf(table, "%-16s %6d %10.4f %10.4f %10.4f %10.4f %10.4f\n", name, a.n, mean,
                json_real_value(json_object_get(j, "std")), a.min, a.max, se);
        json_object_set_new(stats, name, j);
    }
    free(xs);
    json_object_set_new(root, "stats", stats);
    json_object_set_new(root, "prompts", plist);
    json_object_set_new(root, "throughput",
                        json_pack("{s:i, s:f, s:f, s:f}", "workers", workers, "seconds", secs, "samples_per_s",
                                  E->total / secs, "denoising_steps_per_s", (double)E->total * r->num_steps / secs));
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/eval.json", E->out);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = json_dump_file(root, tmp, JSON_INDENT(1) | JSON_REAL_PRECISION(9));
    json_decref(root);
    if (rc || rename(tmp, path)) return core_error("%s: cannot write", path);
    fprintf(table, "\n%d samples (%d prompts x %d) in %.1f s with %d worker(s): %.2f samples/s, %.1f denoising steps/s\n"
                   "wrote %s, %s/videos/, %s/sheets/\n",
            E->total, E->prompts.n, E->K, secs, workers, E->total / secs, (double)E->total * r->num_steps / secs, path,
            E->out, E->out);
    return 0;
}

static volatile sig_atomic_t stop_flag = 0;
static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: vgrpo eval RECIPE [--checkpoint DIR] [--prompts FILE] [--out DIR] [--workers N]\n"
               "                  [--set key.path=value ...]\n"
               "  --checkpoint DIR  weights: a checkpoint folder (its transformer/) or a transformer folder\n"
               "                    (default: model.path/transformer)\n"
               "  --prompts FILE    prompts: text (one per line) or VBench-style JSON [{\"prompt_en\", ...}]\n"
               "                    (default: data.eval_prompt_file)\n"
               "  --out DIR         output folder (default: logging.run_dir/eval)\n"
               "  --workers N       rollout worker processes (default: parallel.rollout_workers)\n"
               "Samples: data.eval_samples_per_prompt per prompt, noise level data.eval_eta (0: ODE), seed data.seed.\n");
}

static int on_chunk(void *ctx, const core_rollout_sample *samples, const core_rollout_result *res, int n,
                    const uint8_t *videos, const int64_t vshape[4]) {
    eval_state *E = ctx;
    const int64_t vb = vshape[0] * vshape[1] * vshape[2] * vshape[3];
    for (int j = 0; j < n; j++)
        if (store_result(E, &res[j], videos + vb * j, vshape)) return -1;
    E->n_done += n;
    progress(E->n_done, E->total, E->t0, E->tty);
    return 0;
}

typedef struct {
    const char *recipe, *checkpoint, *prompts, *out;
    int workers;
    const char **sets;
    int n_sets;
} eval_args;

static int run_eval_job(const eval_args *A, const core_recipe *r) {
    eval_state E;
    memset(&E, 0, sizeof E);
    E.r = r;
    job J;
    memset(&J, 0, sizeof J);
    J.reward_proc = -1;
    ctl_server *ctl = NULL;
    char transformer[4200] = "", out[4200], logs[4300];
    int rc = -1;
    const char *prompt_path = A->prompts ? A->prompts : r->eval_prompt_file;
    const int N = A->workers > 0 ? A->workers : r->rollout_workers;
    if (read_prompts(&E.prompts, prompt_path) || check_prompts(&E.prompts, r, prompt_path)) goto done;
    /* The scorers of a server we start must exist; an external server (reward.endpoint) serves its own. */
    for (int i = 0; !r->reward_endpoint && i < r->scorers.n; i++)
        if (!reward_find(r->scorers.v[i])) {
            core_error_push("reward.scorers.%d: ", i);
            goto done;
        }
    {
        char tp[4200];
        snprintf(tp, sizeof tp, "%s/transformer", r->model_path);
        if (!A->checkpoint && !core_is_dir(tp)) {
            core_error("model.path: %s does not exist (make demo creates runs/demo/model, or run `vgrpo init-model "
                       "--preset tiny --out DIR`)", tp);
            goto done;
        }
    }
    if (A->checkpoint) {
        snprintf(transformer, sizeof transformer, "%s/transformer", A->checkpoint);
        if (!core_is_dir(transformer)) snprintf(transformer, sizeof transformer, "%s", A->checkpoint);
        char cfgp[4300];
        snprintf(cfgp, sizeof cfgp, "%s/config.json", transformer);
        if (access(cfgp, R_OK)) {
            core_error("--checkpoint: %s has neither transformer/config.json nor config.json", A->checkpoint);
            goto done;
        }
    }
    snprintf(out, sizeof out, "%s", A->out ? A->out : "");
    if (!A->out) snprintf(out, sizeof out, "%s/eval", r->run_dir);
    E.out = out;
    char sub[4300];
    snprintf(sub, sizeof sub, "%s/videos", out);
    if (core_mkdir_p(sub) || clear_outputs(sub, ".mp4")) goto done;
    snprintf(sub, sizeof sub, "%s/sheets", out);
    if (core_mkdir_p(sub) || clear_outputs(sub, ".png")) goto done;
    snprintf(logs, sizeof logs, "%s/logs", out);
    if (core_mkdir_p(logs)) goto done;
    E.K = r->eval_samples_per_prompt;
    E.total = E.prompts.n * E.K;
    if ((int64_t)E.prompts.n * E.K > 0xffffffffll / 2) {
        core_error("data.eval_samples_per_prompt: %d prompts x %d samples is too many", E.prompts.n, E.K);
        goto done;
    }
    E.reward_total = calloc((size_t)E.total, sizeof(float));
    E.rewards = calloc((size_t)E.total * CORE_TRAJ_MAX_REWARDS, sizeof(float));
    E.video_hash = calloc((size_t)E.total, sizeof(uint64_t));
    E.got = calloc((size_t)E.total, 1);
    E.pvideo = calloc((size_t)E.prompts.n, sizeof(uint8_t *));
    E.pcount = calloc((size_t)E.prompts.n, sizeof(int));
    if (!E.reward_total || !E.rewards || !E.video_hash || !E.got || !E.pvideo || !E.pcount) {
        core_error("out of memory");
        goto done;
    }

    if (job_init(&J, r, &stop_flag) || job_start_reward(&J, r, logs)) goto done;
    if (!(ctl = ctl_open(J.ctl_ep, job_abort_check, &J))) goto done;
    if (job_start_workers(&J, A->recipe, A->sets, A->n_sets, transformer[0] ? transformer : NULL, N,
                          job_threads_per_process(N), logs))
        goto done;

    /* Wait for every worker's hello, then hand out the samples in chunks of rollout.batch_size. */
    core_rollout_sample *samp = calloc((size_t)E.total, sizeof *samp);
    core_rollout_result *res = calloc((size_t)E.total, sizeof *res);
    if (!samp || !res) {
        free(samp), free(res);
        core_error("out of memory");
        goto done;
    }
    for (int u = 0; u < E.total; u++) {
        const int i = u / E.K;
        samp[u] = (core_rollout_sample){.uid = (uint64_t)u, .prompt_index = i, .prompt = E.prompts.text[i],
                                        .metadata = json_object_size(E.prompts.meta[i]) ? E.prompts.meta[i] : NULL};
    }
    printf("vgrpo eval: %s, %d prompts x %d samples (eta %g, %d steps), %d worker(s), reward server %s -> %s\n",
           transformer[0] ? transformer : r->model_path, E.prompts.n, E.K, (double)r->eval_eta, r->num_steps, N,
           r->reward_endpoint ? r->reward_endpoint : "started here", out);
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    E.tty = isatty(2);
    const core_rollout_request tmpl = {.policy_version = 0, .stream = CORE_STREAM_EVAL_NOISE, .eta = r->eval_eta,
                                       .return_trajectories = 0, .return_videos = 1};
    int failed = ctl_wait_workers(ctl, N, EVAL_START_TIMEOUT_S);
    E.t0 = now_s();
    if (!failed) failed = ctl_rollout(ctl, &tmpl, samp, E.total, r->batch_size, EVAL_CHUNK_TIMEOUT_S, res, on_chunk, &E);
    const double secs = now_s() - E.t0;
    if (!failed)
        for (int u = 0; u < E.total; u++) core_rollout_result_free(&res[u]);
    ctl_shutdown(ctl, 5.0);
    free(samp), free(res);
    if (failed) goto done;
    if (write_eval_json(&E, A->recipe, A->checkpoint, N, secs, stdout)) goto done;
    rc = 0;
done:
    ctl_close(ctl);
    job_stop(&J, 5.0);
    for (int i = 0; E.pvideo && i < E.prompts.n; i++) free(E.pvideo[i]);
    free(E.pvideo), free(E.pcount), free(E.reward_total), free(E.rewards), free(E.video_hash), free(E.got);
    eval_prompts_free(&E.prompts);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    eval_args A = {0};
    A.sets = calloc((size_t)argc, sizeof(char *));
    if (!A.sets) return 1;
    int status = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            status = 0;
            goto out;
        } else if (a[0] != '-' && !A.recipe) {
            A.recipe = a;
        } else if (i + 1 < argc && !strcmp(a, "--checkpoint")) {
            A.checkpoint = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--prompts")) {
            A.prompts = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--out")) {
            A.out = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--set")) {
            A.sets[A.n_sets++] = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--workers")) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 32) {
                fprintf(stderr, "vgrpo eval: --workers: expected an integer in 1..32, got \"%s\"\n", argv[i]);
                goto out;
            }
            A.workers = (int)n;
        } else {
            fprintf(stderr, "vgrpo eval: unknown or incomplete option \"%s\"\n\n", a);
            usage(stderr);
            goto out;
        }
    }
    if (!A.recipe) {
        fprintf(stderr, "vgrpo eval: a recipe file is required\n\n");
        usage(stderr);
        goto out;
    }
    core_recipe r;
    status = 1;
    if (core_recipe_load(&r, A.recipe, A.sets, A.n_sets) || ensure_model(&r)) {
        fprintf(stderr, "vgrpo eval: %s\n", core_last_error());
    } else if (run_eval_job(&A, &r)) {
        fprintf(stderr, "vgrpo eval: %s\n", core_last_error());
    } else {
        status = 0;
    }
    core_recipe_release(&r);
out:
    free(A.sets);
    return status;
}
