/* rollout/eval_report.c — the eval job's outputs: videos, per-prompt contact sheets, eval.json and the table (see
 * rollout/eval_report.h). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "core/reduce.h"
#include "rollout/eval_report.h"
#include "media/image.h"
#include "media/png.h"
#include "media/video.h"

#define EVAL_FPS 16.0
#define EVAL_SHEET_COLS 8
#define EVAL_SHEET_ROWS_MAX 64

struct eval_report {
    const core_prompts *prompts;
    int K, total;                /* samples per prompt, all samples */
    char out[4096];
    float *reward_total;         /* [total], by uid */
    float *rewards;              /* [total, CORE_TRAJ_MAX_REWARDS] */
    uint64_t *video_hash;        /* [total] */
    uint8_t *got;                /* [total] */
    uint8_t **pvideo;            /* [n prompts] -> [K, vshape] until the prompt's sheet is written */
    int *pcount;
    int64_t vshape[4];
    int n_scorers, n_done;
    char scorer_names[CORE_TRAJ_MAX_REWARDS][CORE_TRAJ_NAME_MAX];
};

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* Removes an earlier eval's outputs from dir (files named p<digits>...<suffix>). */
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

void eval_report_free(eval_report *E) {
    if (!E) return;
    for (int i = 0; E->pvideo && i < E->prompts->n; i++) free(E->pvideo[i]);
    free(E->pvideo), free(E->pcount), free(E->reward_total), free(E->rewards), free(E->video_hash), free(E->got);
    free(E);
}

eval_report *eval_report_open(const char *out, const core_prompts *p, int K) {
    if ((int64_t)p->n * K > 0x7fffffffll / 2)
        return core_error("data.eval_samples_per_prompt: %d prompts x %d samples is too many", p->n, K), NULL;
    char sub[4300];
    snprintf(sub, sizeof sub, "%s/videos", out);
    if (core_mkdir_p(sub) || clear_outputs(sub, ".mp4")) return NULL;
    snprintf(sub, sizeof sub, "%s/sheets", out);
    if (core_mkdir_p(sub) || clear_outputs(sub, ".png")) return NULL;
    eval_report *E = calloc(1, sizeof *E);
    if (!E) return core_error("out of memory"), NULL;
    E->prompts = p, E->K = K, E->total = p->n * K;
    snprintf(E->out, sizeof E->out, "%s", out);
    E->reward_total = calloc((size_t)E->total, sizeof(float));
    E->rewards = calloc((size_t)E->total * CORE_TRAJ_MAX_REWARDS, sizeof(float));
    E->video_hash = calloc((size_t)E->total, sizeof(uint64_t));
    E->got = calloc((size_t)E->total, 1);
    E->pvideo = calloc((size_t)p->n, sizeof(uint8_t *));
    E->pcount = calloc((size_t)p->n, sizeof(int));
    if (!E->reward_total || !E->rewards || !E->video_hash || !E->got || !E->pvideo || !E->pcount) {
        eval_report_free(E);
        return core_error("out of memory"), NULL;
    }
    return E;
}

int eval_report_done(const eval_report *E) { return E->n_done; }

/* The prompt's contact sheet once its K samples are in: the prompt as its title, rows = samples (at most 64),
 * labelled S<k> <reward>. Image to video: every row starts with the prompt's input image (stretched to the video's
 * size, as the rollout conditioned on it), then the frames. */
static int write_sheet(eval_report *E, int pi) {
    char labels[EVAL_SHEET_ROWS_MAX][32], path[4200];
    const char *lp[EVAL_SHEET_ROWS_MAX], *img[EVAL_SHEET_ROWS_MAX];
    const int rows = E->K < EVAL_SHEET_ROWS_MAX ? E->K : EVAL_SHEET_ROWS_MAX;
    for (int j = 0; j < rows; j++) {
        snprintf(labels[j], sizeof labels[j], "S%d %.3f", j, (double)E->reward_total[pi * E->K + j]);
        lp[j] = labels[j];
        img[j] = E->prompts->image ? E->prompts->image[pi] : NULL;
    }
    snprintf(path, sizeof path, "%s/sheets/p%04d.png", E->out, pi);
    const int rc = media_image_write_sheet(path, E->pvideo[pi], rows, (int)E->vshape[0], (int)E->vshape[1],
                                           (int)E->vshape[2], EVAL_SHEET_COLS, E->prompts->text[pi], lp,
                                           img[0] ? img : NULL);
    if (rc < 0) return core_error_push("eval sheet of prompt %d: ", pi);
    if (rc > 0) core_log_warn("eval: %s", core_last_error()); /* an input image gone: the eval goes on */
    free(E->pvideo[pi]);
    E->pvideo[pi] = NULL;
    return 0;
}

static int add_one(eval_report *E, const core_rollout_result *res, const uint8_t *video, const int64_t vshape[4]) {
    const uint64_t uid64 = res->traj.uid;
    if (uid64 >= (uint64_t)E->total) return core_error("uid %llu is outside the eval set", (unsigned long long)uid64);
    const int uid = (int)uid64, pi = uid / E->K, k = uid % E->K;
    if (E->got[uid]) return core_error("uid %d was answered twice", uid);
    if (!E->n_done && !E->n_scorers) {
        E->n_scorers = res->traj.n_rewards;
        for (int s = 0; s < E->n_scorers; s++) memcpy(E->scorer_names[s], res->traj.reward_names[s], CORE_TRAJ_NAME_MAX);
        memcpy(E->vshape, vshape, sizeof E->vshape);
    }
    if (res->traj.n_rewards != E->n_scorers)
        return core_error("uid %d: %d rewards, earlier samples had %d", uid, res->traj.n_rewards, E->n_scorers);
    for (int s = 0; s < E->n_scorers; s++) {
        if (strcmp(res->traj.reward_names[s], E->scorer_names[s]))
            return core_error("uid %d: scorer %d is \"%s\", earlier samples had \"%s\"", uid, s, res->traj.reward_names[s],
                              E->scorer_names[s]);
        E->rewards[(int64_t)uid * CORE_TRAJ_MAX_REWARDS + s] = res->traj.rewards[s];
    }
    if (memcmp(vshape, E->vshape, sizeof E->vshape)) return core_error("uid %d: video shape differs from earlier samples", uid);
    E->reward_total[uid] = res->traj.reward_total;
    E->video_hash[uid] = res->video_hash;
    E->got[uid] = 1;
    E->n_done++;
    const int64_t vb = vshape[0] * vshape[1] * vshape[2] * vshape[3];
    char path[4200];
    snprintf(path, sizeof path, "%s/videos/p%04d_s%d.mp4", E->out, pi, k);
    if (media_video_write_mp4(path, video, (int)vshape[0], (int)vshape[1], (int)vshape[2], EVAL_FPS, NULL, NULL)) return -1;
    if (!E->pvideo[pi] && !(E->pvideo[pi] = malloc((size_t)(vb * E->K)))) return core_error("out of memory");
    memcpy(E->pvideo[pi] + vb * k, video, (size_t)vb);
    return ++E->pcount[pi] == E->K ? write_sheet(E, pi) : 0;
}

int eval_report_add(eval_report *E, const core_rollout_result *res, int n, const uint8_t *videos, const int64_t vshape[4]) {
    if (!videos) return core_error("eval: the rollout returned no videos");
    const int64_t vb = vshape[0] * vshape[1] * vshape[2] * vshape[3];
    for (int j = 0; j < n; j++)
        if (add_one(E, &res[j], videos + vb * j, vshape)) return -1;
    return 0;
}

/* n, mean, population std, min, max and the standard error of the mean (core_mean_sd_se) of xs[0..n). */
static json_t *stats_json(const double *xs, int n, double *mean_out, double *sd_out, double *se_out, double *lo,
                          double *hi) {
    *lo = xs[0], *hi = xs[0];
    for (int i = 1; i < n; i++) *lo = xs[i] < *lo ? xs[i] : *lo, *hi = xs[i] > *hi ? xs[i] : *hi;
    core_mean_sd_se(xs, n, mean_out, sd_out, se_out);
    return json_pack("{s:i, s:f, s:f, s:f, s:f, s:f}", "n", n, "mean", *mean_out, "std", *sd_out, "min", *lo, "max",
                     *hi, "se", *se_out);
}

static json_t *prompts_json(const eval_report *E) {
    json_t *plist = json_array();
    for (int i = 0; i < E->prompts->n; i++) {
        json_t *samples = json_array();
        for (int k = 0; k < E->K; k++) {
            const int u = i * E->K + k;
            json_t *rw = json_object();
            for (int s = 0; s < E->n_scorers; s++)
                json_object_set_new(rw, E->scorer_names[s], json_real(E->rewards[(int64_t)u * CORE_TRAJ_MAX_REWARDS + s]));
            char hx[17], vid[64];
            core_hash_hex(E->video_hash[u], hx);
            snprintf(vid, sizeof vid, "videos/p%04d_s%d.mp4", i, k);
            json_array_append_new(samples, json_pack("{s:i, s:i, s:f, s:o, s:s, s:s}", "uid", u, "sample", k, "total",
                                                     (double)E->reward_total[u], "rewards", rw, "video", vid,
                                                     "video_xxh64", hx));
        }
        json_array_append_new(plist, json_pack("{s:i, s:s, s:O, s:o}", "index", i, "prompt", E->prompts->text[i],
                                               "metadata", E->prompts->meta[i], "samples", samples));
    }
    return plist;
}

int eval_report_write(eval_report *E, const core_recipe *r, const char *recipe_path, const char *checkpoint,
                      int workers, double secs, FILE *table) {
    if (E->n_done != E->total) return core_error("eval: %d of %d samples came back", E->n_done, E->total);
    double *xs = malloc(sizeof(double) * (size_t)E->total);
    if (!xs) return core_error("out of memory");
    json_t *root = json_object(), *stats = json_object();
    json_object_set_new(root, "recipe", json_string(recipe_path));
    json_object_set_new(root, "model", json_string(r->model_path));
    json_object_set_new(root, "checkpoint", checkpoint ? json_string(checkpoint) : json_null());
    json_object_set_new(root, "seed", json_integer(r->seed));
    json_object_set_new(root, "eta", json_real(r->eval_eta));
    json_object_set_new(root, "num_steps", json_integer(r->num_steps));
    json_object_set_new(root, "samples_per_prompt", json_integer(E->K));
    json_t *plist = prompts_json(E);
    int nw = 16; /* the name column: as wide as the longest scorer name */
    for (int s = 0; s < E->n_scorers; s++) nw = (int)strlen(E->scorer_names[s]) > nw ? (int)strlen(E->scorer_names[s]) : nw;
    fprintf(table, "\n%-*s %6s %10s %10s %10s %10s %10s\n", nw, "scorer", "n", "mean", "std", "min", "max", "se");
    for (int s = -1; s < E->n_scorers; s++) {
        for (int u = 0; u < E->total; u++)
            xs[u] = s < 0 ? E->reward_total[u] : E->rewards[(int64_t)u * CORE_TRAJ_MAX_REWARDS + s];
        double mean, sd, se, lo, hi;
        json_t *j = stats_json(xs, E->total, &mean, &sd, &se, &lo, &hi);
        const char *name = s < 0 ? "total" : E->scorer_names[s];
        fprintf(table, "%-*s %6d %10.4f %10.4f %10.4f %10.4f %10.4f\n", nw, name, E->total, mean, sd, lo, hi, se);
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
    int rc = core_json_write_file(root, tmp, JSON_INDENT(1) | JSON_REAL_PRECISION(9), "wx");
    json_decref(root);
    if (rc) return core_error_push("%s: ", path);
    if (rename(tmp, path)) return core_error("%s: cannot write: %s", path, strerror(errno));
    fprintf(table, "\n%d samples (%d prompts x %d) in %.1f s with %d worker(s): %.2f samples/s, %.1f denoising steps/s\n"
                   "wrote %s, %s/videos/, %s/sheets/\n",
            E->total, E->prompts->n, E->K, secs, workers, E->total / secs, (double)E->total * r->num_steps / secs, path,
            E->out, E->out);
    return 0;
}
