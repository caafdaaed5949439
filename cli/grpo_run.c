/* cli/grpo_run.c — the GRPO loop. Local mode: one process rolls out with the SDE sampler on the Wan DiT, decodes
 * the final latents (model.decoder: the pipeline's VAE, or the tiny preset's latent-to-RGB map), scores them,
 * computes group advantages and trains (DESIGN.md sections 4 and 7). Colocated (grpo_run with a controller, on
 * trainer rank 0): the same loop with rollout and reward done by the workers, the batch broadcast to the other
 * trainer ranks (grpo_follow) and the weights pushed to the workers after every step; grpo_parity is the parity
 * job. Per GRPO step k (rollout round k):
 *   prompts : B distinct prompts (local_sampler: epoch order from Philox stream 2, uid = epoch)
 *   rollout : G samples each, uid = k*B*G + prompt_slot*G + replica, noise stream 0, policy version = optimizer
 *             steps so far; conditioning (model.text_encoder) = umT5 embeddings of every prompt, encoded once at
 *             start-up (WanPipeline handling, max length rollout.text_len; negative = the empty prompt), or the
 *             tiny preset's word embeddings (model/text/word_embed.h; negative = zeros)
 *   reward  : total = sum of weight x scorer reward; advantages per group (or batch std)
 *   train   : optimizer_steps_per_rollout updates, each over the whole batch (micro-batches of micro_batch_size
 *             transitions, gradients accumulated; global denominator), AdamW with the lr schedule
 *   log     : one metrics.jsonl row and one terminal line
 * rewards.jsonl gets one row per step: every sample's uid, prompt index and total reward.
 * Eval (fixed set: every eval prompt x data.eval_samples_per_prompt, noise stream 3, uid = prompt index x samples
 * per prompt + sample) runs before step 0, before every step that is a multiple of logging.eval_every, and after
 * the last step (a final row holding only step, policy_version and eval fields). Timing fields are all under "time/"
 * so runs can be compared bit for bit without them. Checkpoints (checkpoint.every) and --resume: trainer/checkpoint.h,
 * cli/local_ckpt.c; a checkpoint holds everything the loop carries from one step to the next (weights, Adam state,
 * the step, the sampler's epoch and position), so a resumed run repeats a straight run bit for bit. */
#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/grpo_run.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/metrics.h"
#include "core/philox.h"
#include "model/text/text_cond.h"
#include "model/text/word_embed.h"
#include "rollout/engine.h"
#include "rollout/png.h"
#include "rollout/video.h"
#include "trainer/checkpoint.h"
#include "trainer/controller.h"
#include "trainer/dp.h"
#include "sp/topology.h"
#include "sp/usp_attention.h"
#include "trainer/grpo.h"
#include "trainer/optim.h"
#include "trainer/train_step.h"

typedef struct {
    const core_recipe *r;
    wan_model pol[2], ref[2];  /* expert 0 (transformer/), expert 1 (transformer_2/, two-expert pipelines) */
    int n_experts, have_ref;
    uint8_t trained[2];        /* algorithm.train_experts */
    wan_model ema[2];          /* algorithm.ema_decay > 0 (rank 0): moving average of the weights, used for eval */
    int ema_on;
    int first;                 /* the first trained expert: its optimizer's step is the policy version */
    rollout_decoder dec;   /* model.decoder (local mode: this process decodes) */
    local_prompts train, eval;
    float *emb_train, *emb_eval, *emb_neg; /* [P, L, td], [E, L, td], [L, td] (umt5 only; NULL: zeros) */
    local_scoring scoring;
    rollout_config rc;
    trainer_config tc;
    optim_config oc;
    optim_adamw opt[2];
    core_metrics *metrics;
    uint8_t *video;
    int64_t nl, ne;
    /* colocated (vgrpo trainer): rollouts, rewards and weight syncs go through the workers; dp over trainer ranks */
    ctl_server *ctl;    /* NULL: local mode, rollout and scoring in this process */
    sp_comm *dp;        /* all trainer ranks (the world; NULL: one rank): batches are broadcast over it */
    /* parallel layout (sp/topology.h): dp groups of sp ranks; SP peers share samples (DESIGN.md section 6) */
    sp_topology topo;
    sp_rank_info me;
    sp_comm *dpg;       /* this rank's dp group (same sp_rank): loss statistics are summed over it */
    sp_usp usp;         /* SP > 1: the Ulysses x Ring self-attention context (its groups) */
    wan_exec exec;      /* SP > 1: the DiT's execution with USP attention and the SP group */
    const wan_exec *ex; /* &exec with SP > 1, else NULL (the default single-rank path) */
    dp_reduce_ctx red;  /* gradients over dp, statistics over dpg */
    double ctl_timeout; /* seconds one rollout chunk or weight sync may take */
    FILE *rewards_f;    /* rewards.jsonl: per step, every sample's uid, prompt index and total reward */
} run_state;

/* The policy version: optimizer steps taken (every trained expert steps together). */
#define VERSION(S) ((S)->opt[(S)->first].step)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int parse_optim(const core_recipe *r, optim_config *oc) {
    memset(oc, 0, sizeof *oc);
    oc->lr = r->lr, oc->beta1 = r->beta1, oc->beta2 = r->beta2, oc->eps = r->eps, oc->weight_decay = r->weight_decay;
    oc->max_grad_norm = r->max_grad_norm;
    oc->schedule = !strcmp(r->schedule, "linear") ? OPTIM_SCHED_LINEAR
                   : !strcmp(r->schedule, "cosine") ? OPTIM_SCHED_COSINE
                                                    : OPTIM_SCHED_CONSTANT;
    oc->warmup_steps = r->warmup_steps;
    oc->total_steps = r->total_steps * r->optimizer_steps_per_rollout;
    return optim_config_validate(oc);
}

/* Reads a prompt file and checks every prompt against the text length and the colour scorer. */
static int read_checked_prompts(const core_recipe *r, const char *path, local_prompts *p) {
    if (local_prompts_read(p, path)) return -1;
    int need_color = 0;
    for (int i = 0; i < r->scorers.n; i++) need_color |= !strcmp(r->scorers.v[i], "color_match");
    const int words = !strcmp(r->text_encoder, "word_embed");
    for (int i = 0; i < p->n; i++) {
        int n = wan_word_count(p->text[i]), c;
        if (words && n > r->text_len)
            return core_error("%s: prompt %d \"%s\" has %d words, more than rollout.text_len %d", path, i + 1,
                              p->text[i], n, r->text_len);
        if (need_color && reward_target_color(p->text[i], NULL, &c))
            return core_error_push("%s: prompt %d (color_match): ", path, i + 1);
    }
    return 0;
}

int local_check_recipe(const core_recipe *r) {
    grpo_selection sel;
    if (grpo_selection_parse(r->timestep_selection, &sel) || grpo_selection_validate(&sel, r->num_steps)) return -1;
    local_scoring s;
    if (local_scoring_init(&s, r)) return -1;
    optim_config oc;
    if (parse_optim(r, &oc)) return -1;
    local_prompts p;
    if (read_checked_prompts(r, r->prompt_file, &p)) return local_prompts_free(&p), -1;
    int n = p.n;
    local_prompts_free(&p);
    if (r->prompts_per_step > n)
        return core_error("rollout.prompts_per_step: %d distinct prompts per step, but %s has %d", r->prompts_per_step,
                          r->prompt_file, n);
    if (read_checked_prompts(r, r->eval_prompt_file, &p)) return local_prompts_free(&p), -1;
    local_prompts_free(&p);
    if (strcmp(r->mode, "local")) return 0; /* the rest is local mode's */
    if (r->rollout_workers != 1)
        return core_error("parallel.rollout_workers: local mode rolls out in its own process (1), got %d", r->rollout_workers);
    if (r->reward_endpoint)
        return core_error("reward.endpoint: local mode scores in its own process; use mode: colocated to score on an "
                          "external reward server");
    if (r->vae_scale_factor_spatial != WAN_LATENT_RGB_FACTOR)
        return core_error("model.vae_scale_factor_spatial: local mode decodes with a Wan 2.1-style VAE or latent_rgb "
                          "(factor %d), got %d", WAN_LATENT_RGB_FACTOR, r->vae_scale_factor_spatial);
    return 0;
}

/* Every prompt's conditioning [n, L, td] (model/text/text_cond.h: umT5 or word embeddings, the same bytes a rollout worker
 * computes), contiguous so a sample's embedding is base + prompt index x L x td. */
static float *embed_prompts(text_cond *tc, const local_prompts *p, int64_t ne) {
    float *e = malloc(sizeof(float) * (size_t)p->n * (size_t)ne);
    if (!e) return core_error("out of memory"), NULL;
    for (int i = 0; i < p->n; i++) {
        const float *x;
        if (text_cond_embed(tc, p->text[i], &x)) return free(e), NULL;
        memcpy(e + (int64_t)i * ne, x, sizeof(float) * (size_t)ne);
    }
    return e;
}

/* mean, standard error of the mean (sample std, ddof 1, / sqrt(n)) and population std of x[0..n), in double. */
static void mean_se(const double *x, int n, double *mean, double *se, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += x[i];
    const double m = s / n;
    for (int i = 0; i < n; i++) q += (x[i] - m) * (x[i] - m);
    *mean = m;
    *sd = sqrt(q / n);
    *se = n > 1 ? sqrt(q / (n - 1)) / sqrt((double)n) : 0;
}

/* Colocated: n samples (uids, prompt indices into prompts) rolled out and scored by the workers at the current
 * policy version; tr[n] receives the trajectories (with_traj) or just uid, prompt index and rewards. */
static int remote_rollout_v(run_state *S, int n, const uint64_t *uids, const int64_t *pidx, const char *const *prompts,
                            uint32_t stream, float eta, int with_traj, core_traj *tr, float **vel, int64_t version) {
    core_rollout_sample *smp = calloc((size_t)n, sizeof *smp);
    core_rollout_result *res = calloc((size_t)n, sizeof *res);
    if (!smp || !res) return free(smp), free(res), core_error("out of memory");
    for (int j = 0; j < n; j++) smp[j] = (core_rollout_sample){.uid = uids[j], .prompt_index = pidx[j], .prompt = prompts[pidx[j]]};
    const core_rollout_request tmpl = {.policy_version = version, .stream = stream, .eta = eta,
                                       .return_trajectories = with_traj, .return_velocities = vel != NULL};
    int rc = ctl_rollout(S->ctl, &tmpl, smp, n, S->r->batch_size, S->ctl_timeout, res, NULL, NULL);
    if (!rc)
        for (int j = 0; j < n; j++) {
            tr[j] = res[j].traj; /* ownership moves */
            if (vel) vel[j] = res[j].velocity;
        }
    free(smp), free(res);
    return rc;
}

static int remote_rollout(run_state *S, int n, const uint64_t *uids, const int64_t *pidx, const char *const *prompts,
                          uint32_t stream, float eta, int with_traj, core_traj *tr, int64_t version) {
    return remote_rollout_v(S, n, uids, pidx, prompts, stream, eta, with_traj, tr, NULL, version);
}

/* ---- EMA (algorithm.ema_decay): eval and sample videos use the moving average of the weights ---- */

/* Colocated eval of EMA weights: they are pushed to the workers as this policy version + 2^40 (so a rollout request
 * can never mix them up with the policy's), and the policy is pushed back after the eval. */
#define EMA_VERSION_OFFSET ((int64_t)1 << 40)

/* ema = d * ema + (1 - d) * weights for every trained expert (fp32, element by element), after an optimizer step. */
static void ema_update(run_state *S) {
    const float d = (float)S->r->ema_decay, w = 1.0f - d;
    for (int e = 0; e < S->n_experts; e++) {
        if (!S->trained[e]) continue;
        float *a = S->ema[e].params;
        const float *p = S->pol[e].params;
        const int64_t n = S->pol[e].layout.numel;
        for (int64_t k = 0; k < n; k++) a[k] = d * a[k] + w * p[k];
    }
}

/* The experts and policy version eval and sample videos run with; colocated with EMA, the EMA weights are pushed to
 * the workers first (eval_weights_end pushes the policy back). */
static int eval_weights_begin(run_state *S, rollout_experts *ex, int64_t *version) {
    wan_model *m = S->ema_on ? S->ema : S->pol;
    *ex = (rollout_experts){S->n_experts, {&m[0], &m[1]}};
    *version = VERSION(S) + (S->ema_on && S->ctl ? EMA_VERSION_OFFSET : 0);
    if (!S->ema_on || !S->ctl) return 0;
    const wan_model *mm[2] = {&m[0], &m[1]};
    int match;
    return ctl_sync_weights(S->ctl, mm, S->n_experts, S->trained, *version, S->ctl_timeout, &match);
}

static int eval_weights_end(run_state *S) {
    if (!S->ema_on || !S->ctl) return 0;
    const wan_model *mm[2] = {&S->pol[0], &S->pol[1]};
    int match;
    return ctl_sync_weights(S->ctl, mm, S->n_experts, S->trained, VERSION(S), S->ctl_timeout, &match);
}

/* ctl_rollout's chunk callback for write_step_videos: keeps a copy of the (single chunk's) videos. */
static int keep_videos(void *ctx, const core_rollout_sample *samples, const core_rollout_result *res, int n,
                       const uint8_t *videos, const int64_t vshape[4]) {
    struct { uint8_t **v; int64_t *shape; } *cap = ctx;
    const size_t bytes = (size_t)n * (size_t)(vshape[0] * vshape[1] * vshape[2] * vshape[3]);
    if (!(*cap->v = malloc(bytes))) return core_error("out of memory");
    memcpy(*cap->v, videos, bytes);
    memcpy(cap->shape, vshape, sizeof(int64_t) * 4);
    return 0;
}

/* logging.video_every: sample 0 of the first (up to) 4 eval prompts at the current weights, with the eval's noise
 * (stream 3, uid = prompt x eval_samples_per_prompt) and eta, decoded into run_dir/videos/step-<step>/pNNNN.mp4 and
 * sheet.png (rows = prompts, labelled with the prompt index and reward), and index.json (prompt, reward, xxh64 of
 * the raw frames). Colocated: the workers decode. */
static int write_step_videos(run_state *S, int64_t step) {
    const core_recipe *r = S->r;
    const int n = S->eval.n < 4 ? S->eval.n : 4, K = r->eval_samples_per_prompt;
    core_traj tr[4];
    uint64_t uids[4];
    int64_t pidx[4];
    const float *cond[4];
    uint8_t *videos = NULL;
    int64_t vshape[4] = {0};
    int rc = -1, have = 0;
    memset(tr, 0, sizeof tr);
    for (int j = 0; j < n; j++) uids[j] = (uint64_t)j * K, pidx[j] = j, cond[j] = S->emb_eval + (int64_t)j * S->ne;
    rollout_experts em;
    int64_t ev;
    if (eval_weights_begin(S, &em, &ev)) return -1;
    if (S->ctl) {
        core_rollout_sample smp[4] = {{0}};
        core_rollout_result res[4];
        for (int j = 0; j < n; j++) smp[j] = (core_rollout_sample){.uid = uids[j], .prompt_index = j, .prompt = S->eval.text[j]};
        const core_rollout_request tmpl = {.policy_version = ev, .stream = CORE_STREAM_EVAL_NOISE,
                                           .eta = r->eval_eta, .return_videos = 1};
        struct { uint8_t **v; int64_t *shape; } cap = {&videos, vshape};
        if (ctl_rollout(S->ctl, &tmpl, smp, n, n, S->ctl_timeout, res, keep_videos, &cap)) goto done;
        for (int j = 0; j < n; j++) tr[j] = res[j].traj;
        have = 1;
        if (eval_weights_end(S)) goto done;
    } else {
        rollout_config rc_e = S->rc;
        rc_e.stream = CORE_STREAM_EVAL_NOISE;
        rc_e.eta = r->eval_eta;
        rc_e.policy_version = VERSION(S);
        if (rollout_generate(&rc_e, &em, NULL, n, cond, uids, pidx, tr)) goto done;
        have = 1;
        vshape[0] = S->dec.frames, vshape[1] = S->dec.height, vshape[2] = S->dec.width, vshape[3] = 3;
        const int64_t vb = vshape[0] * vshape[1] * vshape[2] * 3;
        if (!(videos = malloc((size_t)(vb * n)))) {
            core_error("out of memory");
            goto done;
        }
        for (int j = 0; j < n; j++) {
            if (local_score(&S->scoring, &S->dec, &tr[j], S->eval.text[j], S->video)) goto done;
            memcpy(videos + vb * j, S->video, (size_t)vb);
        }
    }
    char dir[4200], path[4300], labels[4][48];
    const char *lp[4];
    snprintf(dir, sizeof dir, "%s/videos/step-%" PRId64, r->run_dir, step);
    if (core_mkdir_p(dir)) goto done;
    const int64_t vb = vshape[0] * vshape[1] * vshape[2] * 3;
    for (int j = 0; j < n; j++) {
        snprintf(path, sizeof path, "%s/p%04d.mp4", dir, j);
        if (rollout_video_write_mp4(path, videos + vb * j, (int)vshape[0], (int)vshape[1], (int)vshape[2], 16.0, NULL, NULL))
            goto done;
        snprintf(labels[j], sizeof labels[j], "P%d %.3f", j, (double)tr[j].reward_total);
        lp[j] = labels[j];
    }
    snprintf(path, sizeof path, "%s/sheet.png", dir);
    if (rollout_png_write_sheet(path, videos, n, (int)vshape[0], (int)vshape[1], (int)vshape[2], 8, lp)) goto done;
    /* index.json: per video its prompt, reward and the xxh64 of its raw frames (the encoder's bytes may vary) */
    json_t *idx = json_array();
    for (int j = 0; j < n; j++) {
        char hx[17], file[32];
        core_hash_hex(core_xxh64(videos + vb * j, (size_t)vb, 0), hx);
        snprintf(file, sizeof file, "p%04d.mp4", j);
        json_array_append_new(idx, json_pack("{s:s, s:i, s:s, s:f, s:s}", "file", file, "prompt_index", j, "prompt",
                                             S->eval.text[j], "reward", (double)tr[j].reward_total, "video_xxh64", hx));
    }
    snprintf(path, sizeof path, "%s/index.json", dir);
    const int bad = json_dump_file(idx, path, JSON_INDENT(1) | JSON_REAL_PRECISION(9));
    json_decref(idx);
    if (bad) {
        core_error("%s: cannot write", path);
        goto done;
    }
    rc = 0;
done:
    if (have)
        for (int j = 0; j < n; j++) core_traj_free(&tr[j]);
    free(videos);
    return rc;
}

/* The rewards a sample came back with must be the recipe's scorers, in its order (an external reward.endpoint
 * serves its own list): else the metrics would label one scorer's values with another's name. */
static int check_scorers(const run_state *S, const core_traj *t) {
    int same = t->n_rewards == S->scoring.n;
    for (int j = 0; same && j < S->scoring.n; j++) same = !strcmp(t->reward_names[j], S->scoring.names[j]);
    if (same) return 0;
    char got[512] = "", want[512] = "";
    for (int j = 0; j < t->n_rewards; j++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", j ? ", " : "", t->reward_names[j]);
    for (int j = 0; j < S->scoring.n; j++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", j ? ", " : "", S->scoring.names[j]);
    return core_error("reward.scorers: the reward server%s%s scores [%s], the recipe lists [%s] (they must match, in "
                      "order)", S->r->reward_endpoint ? " at " : "", S->r->reward_endpoint ? S->r->reward_endpoint : "",
                      got, want);
}

/* The fixed eval set; adds eval/... fields to the metrics row and prints one line. */
static int run_eval(run_state *S, int64_t step) {
    const core_recipe *r = S->r;
    const int E = S->eval.n, K = r->eval_samples_per_prompt, n = E * K;
    double t0 = now_s();
    core_traj *tr = calloc((size_t)n, sizeof *tr);
    const float **cond = malloc(sizeof(float *) * (size_t)n);
    uint64_t *uids = malloc(sizeof(uint64_t) * (size_t)n);
    int64_t *pidx = malloc(sizeof(int64_t) * (size_t)n);
    double *vals = malloc(sizeof(double) * (size_t)n * (size_t)(S->scoring.n + 1));
    int rc = -1, have = 0;
    if (!tr || !cond || !uids || !pidx || !vals) {
        core_error("out of memory");
        goto done;
    }
    for (int i = 0; i < E; i++)
        for (int k = 0; k < K; k++) {
            const int s = i * K + k;
            uids[s] = (uint64_t)s, pidx[s] = i, cond[s] = S->emb_eval + (int64_t)i * S->ne;
        }
    rollout_experts em;
    int64_t ev;
    if (eval_weights_begin(S, &em, &ev)) goto done;
    if (S->ctl) {
        if (remote_rollout(S, n, uids, pidx, (const char *const *)S->eval.text, CORE_STREAM_EVAL_NOISE,
                           S->r->eval_eta, 0, tr, ev))
            goto done;
    } else {
        rollout_config rc_e = S->rc;
        rc_e.stream = CORE_STREAM_EVAL_NOISE;
        rc_e.eta = S->r->eval_eta;
        rc_e.policy_version = VERSION(S);
        if (rollout_generate(&rc_e, &em, NULL, n, cond, uids, pidx, tr)) goto done;
    }
    have = 1;
    if (eval_weights_end(S)) goto done;
    for (int s = 0; s < n; s++) {
        if (!S->ctl && local_score(&S->scoring, &S->dec, &tr[s], S->eval.text[pidx[s]], S->video)) goto done;
        if (check_scorers(S, &tr[s])) goto done;
        for (int j = 0; j < S->scoring.n; j++) vals[(int64_t)j * n + s] = tr[s].rewards[j];
        vals[(int64_t)S->scoring.n * n + s] = tr[s].reward_total;
    }
    char key[160], line[1024];
    int off = snprintf(line, sizeof line, "eval @ step %" PRId64 " (policy version %" PRId64 ", n=%d):", step, VERSION(S), n);
    for (int j = 0; j <= S->scoring.n; j++) {
        double m, se, sd;
        mean_se(vals + (int64_t)j * n, n, &m, &se, &sd);
        const char *name = j < S->scoring.n ? S->scoring.names[j] : "reward";
        snprintf(key, sizeof key, "eval/%s/mean", name);
        if (core_metrics_f64(S->metrics, key, m)) goto done;
        snprintf(key, sizeof key, "eval/%s/se", name);
        if (core_metrics_f64(S->metrics, key, se)) goto done;
        if (off < (int)sizeof line) off += snprintf(line + off, sizeof line - off, " %s %.4f +- %.4f", name, m, se);
    }
    if (core_metrics_i64(S->metrics, "eval/n", n) || core_metrics_i64(S->metrics, "eval/ema", S->ema_on) || core_metrics_f64(S->metrics, "time/eval_s", now_s() - t0)) goto done;
    printf("%s\n", line);
    fflush(stdout);
    rc = 0;
done:
    if (have)
        for (int s = 0; s < n; s++) core_traj_free(&tr[s]);
    free(tr), free(cond), free(uids), free(pidx), free(vals);
    return rc;
}

/* One optimizer update over the batch. Alone: trainer_update. Over dp trainer ranks (every rank holds the whole
 * batch): this rank's contiguous share with the whole batch's transition count as the denominator, the gradients
 * summed over the ranks (dp_grad_reduce) before the one optimizer step every rank takes. */
static int train_update(run_state *S, const trainer_batch *tb, grpo_loss_stats *st, optim_step_info *info) {
    wan_model *pol[2] = {&S->pol[0], &S->pol[1]};
    const wan_model *ref[2] = {&S->ref[0], &S->ref[1]};
    optim_adamw *opt[2] = {&S->opt[0], &S->opt[1]};
    trainer_batch sub = *tb;
    trainer_config tc = S->tc;
    if (S->dp && S->dp->size > 1) {
        int lo, hi;
        dp_share(tb->n, S->me.dp_rank, S->topo.dp, &lo, &hi);
        if (trainer_count_transitions(&S->tc, tb, S->n_experts, S->trained, &sub.denom)) return -1;
        sub.n = hi - lo, sub.traj += lo, sub.cond += lo, sub.adv += lo, sub.mask += lo;
        tc.grad_reduce = dp_grad_reduce;
        tc.grad_reduce_ctx = &S->red;
    }
    return trainer_update_experts(pol, S->have_ref ? ref : NULL, S->n_experts, S->trained, S->ex, &tc, &sub, opt, &S->oc,
                                  st, info);
}

static int put_stats(core_metrics *m, const char *prefix, const grpo_loss_stats *st) {
    char k[96];
    const double nt = st->n_transitions > 0 ? (double)st->n_transitions : 1;
#define PUT(name, val) (snprintf(k, sizeof k, "%s%s", prefix, name), core_metrics_f64(m, k, val))
    return PUT("loss", st->loss) || PUT("policy_loss", st->policy) || PUT("kl", st->kl) ||
           PUT("clip_fraction", st->n_clipped / nt) || PUT("ratio_dev_mean", st->abs_ratio_dev_sum / nt) ||
           PUT("log_prob_mean_abs_diff", st->abs_logp_diff_sum / nt);
#undef PUT
}

/* One GRPO step (rollout round `round`). */
static int run_step(run_state *S, local_sampler *smp, int64_t round, int64_t total) {
    const core_recipe *r = S->r;
    const int B = r->prompts_per_step, G = r->samples_per_prompt, n = B * G, U = r->optimizer_steps_per_rollout;
    const int64_t version0 = VERSION(S);
    double t0 = now_s(), t1 = t0, t2 = t0, t3 = t0;
    core_traj *tr = calloc((size_t)n, sizeof *tr);
    const float **cond = malloc(sizeof(float *) * (size_t)n);
    uint64_t *uids = malloc(sizeof(uint64_t) * (size_t)n);
    int64_t *pidx = malloc(sizeof(int64_t) * (size_t)n);
    int *slot = malloc(sizeof(int) * (size_t)B);
    float *rew = malloc(sizeof(float) * (size_t)n), *adv = malloc(sizeof(float) * (size_t)n);
    uint8_t *mask = malloc((size_t)n);
    double *per = malloc(sizeof(double) * (size_t)n);
    int rc = -1, have = 0;
    if (!tr || !cond || !uids || !pidx || !slot || !rew || !adv || !mask || !per) {
        core_error("out of memory");
        goto done;
    }
    local_sampler_next(smp, slot);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            const int s = b * G + g;
            uids[s] = (uint64_t)round * (uint64_t)n + (uint64_t)s;
            pidx[s] = slot[b];
            cond[s] = S->emb_train + (int64_t)slot[b] * S->ne;
        }
    if (uids[n - 1] > 0xffffffffull) {
        core_error("rollout uid %llu exceeds 32 bits", (unsigned long long)uids[n - 1]);
        goto done;
    }
    S->rc.policy_version = version0;
    if (S->ctl) {
        if (remote_rollout(S, n, uids, pidx, (const char *const *)S->train.text, CORE_STREAM_ROLLOUT_NOISE, r->eta, 1, tr,
                           VERSION(S)))
            goto done;
    } else if (rollout_generate(&S->rc, &(rollout_experts){S->n_experts, {&S->pol[0], &S->pol[1]}}, NULL, n, cond, uids, pidx, tr)) {
        goto done;
    }
    have = 1;
    t1 = now_s();
    for (int s = 0; s < n; s++) {
        if (!S->ctl && local_score(&S->scoring, &S->dec, &tr[s], S->train.text[pidx[s]], S->video)) goto done;
        if (check_scorers(S, &tr[s])) goto done;
        rew[s] = tr[s].reward_total;
    }
    if (S->rewards_f) { /* {"step", "uid": [...], "prompt_index": [...], "reward": [...]} with %.9g: exact floats */
        fprintf(S->rewards_f, "{\"step\": %" PRId64 ", \"uid\": [", round);
        for (int s2 = 0; s2 < n; s2++) fprintf(S->rewards_f, "%s%llu", s2 ? ", " : "", (unsigned long long)tr[s2].uid);
        fprintf(S->rewards_f, "], \"prompt_index\": [");
        for (int s2 = 0; s2 < n; s2++) fprintf(S->rewards_f, "%s%lld", s2 ? ", " : "", (long long)tr[s2].prompt_index);
        fprintf(S->rewards_f, "], \"reward\": [");
        for (int s2 = 0; s2 < n; s2++) fprintf(S->rewards_f, "%s%.9g", s2 ? ", " : "", (double)rew[s2]);
        fprintf(S->rewards_f, "]}\n");
        fflush(S->rewards_f);
    }
    grpo_adv_stats as;
    if (grpo_advantages(rew, B, G, !strcmp(r->std_mode, "batch") ? GRPO_STD_BATCH : GRPO_STD_GROUP, r->adv_clip_max,
                        adv, mask, &as))
        goto done;
    t2 = now_s();
    trainer_batch tb = {.n = n, .traj = tr, .cond = cond, .neg = S->emb_neg, .text_len = r->text_len, .adv = adv,
                        .mask = mask};
    grpo_loss_stats first = {0}, last = {0};
    optim_step_info info0 = {0}, info = {0};
    if (S->dp && S->dp->size > 1) {
        dp_batch db = {.n = n, .traj = tr, .adv = adv, .mask = mask};
        int64_t cmd = DP_CMD_TRAIN;
        if (sp_comm_broadcast(S->dp, &cmd, 1, SP_I64, 0) || dp_batch_broadcast(S->dp, &db)) goto done;
    }
    for (int u = 0; u < U; u++) {
        grpo_loss_stats st = {0};
        if (train_update(S, &tb, &st, &info)) goto done;
        if (S->ema_on) ema_update(S);
        if (u == 0) first = st, info0 = info;
        last = st;
    }
    t3 = now_s();
    double sync_s = 0;
    if (S->ctl) {
        const wan_model *ex[2] = {&S->pol[0], &S->pol[1]};
        int match = 0;
        if (ctl_sync_weights(S->ctl, ex, S->n_experts, S->trained, VERSION(S), S->ctl_timeout, &match)) goto done;
        sync_s = now_s() - t3;
        if (core_metrics_f64(S->metrics, "weight_sync/seconds", sync_s) ||
            core_metrics_i64(S->metrics, "weight_sync/hash_match", match))
            goto done;
    }
    /* metrics row */
    core_metrics *m = S->metrics;
    double gstd = 0;
    for (int b = 0; b < B; b++) {
        double mu = 0, q = 0;
        for (int g = 0; g < G; g++) mu += rew[b * G + g];
        mu /= G;
        for (int g = 0; g < G; g++) q += (rew[b * G + g] - mu) * (rew[b * G + g] - mu);
        gstd += sqrt(q / G);
    }
    gstd /= B;
    int e = core_metrics_f64(m, "lr", info0.lr) || core_metrics_f64(m, "reward/mean", as.reward_mean) ||
            core_metrics_f64(m, "reward/std", as.reward_std) || core_metrics_f64(m, "reward/min", as.reward_min) ||
            core_metrics_f64(m, "reward/max", as.reward_max) || core_metrics_f64(m, "reward/group_std_mean", gstd);
    char key[160];
    for (int j = 0; j < S->scoring.n && !e; j++) {
        for (int s = 0; s < n; s++) per[s] = tr[s].rewards[j];
        double mu, se, sd, lo = per[0], hi = per[0];
        mean_se(per, n, &mu, &se, &sd);
        for (int s = 1; s < n; s++) lo = per[s] < lo ? per[s] : lo, hi = per[s] > hi ? per[s] : hi;
        const char *nm = S->scoring.names[j];
        e = (snprintf(key, sizeof key, "reward/%s/mean", nm), core_metrics_f64(m, key, mu)) ||
            (snprintf(key, sizeof key, "reward/%s/std", nm), core_metrics_f64(m, key, sd)) ||
            (snprintf(key, sizeof key, "reward/%s/min", nm), core_metrics_f64(m, key, lo)) ||
            (snprintf(key, sizeof key, "reward/%s/max", nm), core_metrics_f64(m, key, hi));
    }
    e = e || put_stats(m, "", &first) || core_metrics_f64(m, "grad_norm", info0.grad_norm) ||
        core_metrics_f64(m, "grad_clip_coef", info0.clip_coef) || core_metrics_f64(m, "masked_fraction", as.masked_fraction) ||
        core_metrics_i64(m, "adv_clamped", as.n_clamped) || core_metrics_i64(m, "transitions", first.n_transitions) ||
        core_metrics_i64(m, "optimizer_steps", U);
    if (U > 1 && !e) e = put_stats(m, "offpolicy_last/", &last) || core_metrics_f64(m, "offpolicy_last/grad_norm", info.grad_norm);
    const double step_s = t3 - t0;
    e = e || core_metrics_f64(m, "time/rollout_s", t1 - t0) || core_metrics_f64(m, "time/reward_s", t2 - t1) ||
        core_metrics_f64(m, "time/train_s", t3 - t2) || core_metrics_f64(m, "time/sync_s", sync_s) ||
        core_metrics_f64(m, "time/step_s", step_s) || core_metrics_f64(m, "time/samples_per_s", n / step_s);
    if (e) goto done;
    /* step numbered as in metrics.jsonl (from 0); loss in %e: the GRPO loss is ~0 on average by construction */
    printf("step %" PRId64 " of %" PRId64 " | v%" PRId64 " | reward %.4f +- %.4f [%.3f, %.3f] | loss %+.3e kl %.3g | "
           "clip %.3f |dlogp| %.3g | gnorm %.3g lr %.3g | masked %.2f | %.2fs (rollout %.2f, train %.2f) %.1f samples/s\n",
           round, total, version0, as.reward_mean, as.reward_std, as.reward_min, as.reward_max, first.loss, first.kl,
           first.n_transitions ? (double)first.n_clipped / first.n_transitions : 0.0,
           first.n_transitions ? first.abs_logp_diff_sum / first.n_transitions : 0.0, info0.grad_norm, info0.lr,
           as.masked_fraction, step_s, t1 - t0, t3 - t2, n / step_s);
    fflush(stdout);
    rc = 0;
done:
    if (have)
        for (int s = 0; s < n; s++) core_traj_free(&tr[s]);
    free(tr), free(cond), free(uids), free(pidx), free(slot), free(rew), free(adv), free(mask), free(per);
    return rc;
}

/* The trainer ranks' layout (parallel.trainer_ranks = dp x sp, parallel.ulysses_degree), validated against the
 * transformer's config before any weights are read (sp_validate: heads % Ulysses degree, video tokens % sp), then
 * the groups: the dp group of this rank and, with sp > 1, the SP/Ulysses/ring groups of USP attention. */
static int setup_parallel(run_state *S, const core_recipe *r, const char *transformer_dir) {
    const int world = S->dp ? S->dp->size : 1, rank = S->dp ? S->dp->rank : 0;
    if (sp_topology_init(&S->topo, world, r->sp, r->ulysses_degree)) return -1;
    S->me = sp_topology_rank(&S->topo, rank);
    char cfgp[4300];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", transformer_dir);
    wan_config c;
    if (wan_config_load(&c, cfgp)) return -1;
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    const int pt = c.patch_size[0], ph = c.patch_size[1], pw = c.patch_size[2];
    sp_attn_request req = {.num_heads = c.num_attention_heads,
                           .tokens = (int64_t)(F / pt) * (H / ph) * (W / pw)};
    if (sp_validate(world, r->sp, r->ulysses_degree, &req)) return -1;
    S->red.grads = S->dp;
    S->red.stats = S->dp;
    if (world == 1) return 0;
    int colour, key;
    if (sp_topology_colour(&S->topo, rank, SP_GROUP_DP, &colour, &key) ||
        sp_comm_split(S->dp, colour, key, "dp", &S->dpg))
        return core_error_push("trainer rank %d: dp group: ", rank);
    S->red.stats = S->dpg;
    if (r->sp > 1) {
        if (sp_usp_init(&S->usp, S->dp, &S->topo, NULL)) return -1;
        S->exec = (wan_exec){NULL, sp_usp_forward, sp_usp_backward, &S->usp, S->usp.sp};
        S->ex = &S->exec;
    }
    return 0;
}

static int setup(run_state *S, const core_recipe *r, int in_process_rollout) {
    char path[4200];
    if (local_check_recipe(r)) return -1;
    struct stat sb;
    snprintf(path, sizeof path, "%s/transformer", r->model_path);
    if (stat(path, &sb)) return core_error("model.path: %s does not exist (make demo creates runs/demo/model, or run "
                                           "`vgrpo init-model --preset tiny --out DIR`)", path);
    if (setup_parallel(S, r, path)) return -1;
    if (wan_model_load(&S->pol[0], path)) return -1;
    S->n_experts = 1;
    snprintf(path, sizeof path, "%s/transformer_2", r->model_path);
    if (!stat(path, &sb)) {
        if (wan_model_load(&S->pol[1], path)) return -1;
        if (!wan_config_equal(&S->pol[0].cfg, &S->pol[1].cfg))
            return core_error("model.path: %s/transformer and transformer_2 have different configs", r->model_path);
        S->n_experts = 2;
    }
    const char *te = r->train_experts;
    S->trained[0] = !strcmp(te, "all") || !strcmp(te, "transformer");
    S->trained[1] = S->n_experts == 2 && (!strcmp(te, "all") || !strcmp(te, "transformer_2"));
    if (!strcmp(te, "transformer_2") && S->n_experts == 1)
        return core_error("algorithm.train_experts: transformer_2, but %s has one expert (no transformer_2/)", r->model_path);
    S->first = S->trained[0] ? 0 : 1;
    for (int e = 0; e < S->n_experts; e++) {
        if (wan_model_alloc_grads(&S->pol[e]) || optim_adamw_init(&S->opt[e], S->pol[e].layout.numel)) return -1;
        if (r->beta > 0) {
            if (wan_model_init(&S->ref[e], &S->pol[e].cfg)) return -1;
            memcpy(S->ref[e].params, S->pol[e].params, sizeof(float) * (size_t)S->pol[e].layout.numel);
        }
    }
    S->have_ref = r->beta > 0;
    if (in_process_rollout && rollout_decoder_load(&S->dec, r, &S->pol[0].cfg)) return -1;
    if (parse_optim(r, &S->oc)) return -1;
    if (local_prompts_read(&S->train, r->prompt_file) || local_prompts_read(&S->eval, r->eval_prompt_file)) return -1;
    const int td = S->pol[0].cfg.text_dim;
    const int64_t ne_ = (int64_t)r->text_len * td;
    text_cond *tc = text_cond_load(r->text_encoder, r->model_path, r->text_len, td);
    if (!tc) return -1;
    const float *neg = text_cond_negative(tc);
    int bad = !(S->emb_train = embed_prompts(tc, &S->train, ne_)) || !(S->emb_eval = embed_prompts(tc, &S->eval, ne_));
    if (!bad && neg && !(S->emb_neg = malloc(sizeof(float) * (size_t)ne_))) bad = core_error("out of memory");
    if (!bad && neg) memcpy(S->emb_neg, neg, sizeof(float) * (size_t)ne_);
    text_cond_free(tc);
    if (bad) return -1;
    if (local_scoring_init(&S->scoring, r)) return -1;
    int F, H, W;
    core_recipe_latent_size(r, &F, &H, &W);
    const int64_t shape[4] = {S->pol[0].cfg.in_channels, F, H, W};
    if (rollout_config_init(&S->rc, r->num_steps, r->shift, r->eta, r->guidance_scale, shape, r->text_len,
                            (uint64_t)r->seed, r->batch_size))
        return -1;
    S->rc.neg = S->emb_neg;
    S->rc.guidance_scale_2 = r->guidance_scale_2;
    S->rc.boundary_ratio = r->boundary_ratio;
    S->nl = shape[0] * F * H * W;
    S->ne = (int64_t)r->text_len * td;
    memset(&S->tc, 0, sizeof S->tc);
    if (grpo_selection_parse(r->timestep_selection, &S->tc.sel)) return -1;
    S->tc.seed = (uint64_t)r->seed;
    S->tc.clip_eps = r->clip_range;
    S->tc.beta = r->beta;
    S->tc.micro_batch_size = r->micro_batch_size;
    S->tc.acts_mode = !strcmp(r->activations, "recompute") ? WAN_ACTS_RECOMPUTE : WAN_ACTS_STORE;
    if (in_process_rollout && !(S->video = malloc((size_t)rollout_decoder_video_bytes(&S->dec))))
        return core_error("out of memory");
    return 0; /* the run directory's files: open_run_files, after a resume was checked */
}

/* Creates the run directory, writes config.resolved.yaml and opens metrics.jsonl: truncated, or after a resume
 * from step `start` cut back to the rows before it and appended to. */
static int open_run_files(run_state *S, const core_recipe *r, int resumed, int64_t start) {
    char path[4200];
    if (core_mkdir_p(r->run_dir)) return -1;
    snprintf(path, sizeof path, "%s/config.resolved.yaml", r->run_dir);
    FILE *f = fopen(path, "w");
    if (!f) return core_error("%s: cannot write: %s", path, strerror(errno));
    int bad = core_recipe_dump(r, f);
    if (fclose(f) || bad) return core_error("%s: write failed", path);
    snprintf(path, sizeof path, "%s/rewards.jsonl", r->run_dir);
    if (resumed && local_metrics_truncate(path, start)) return -1;
    if (!(S->rewards_f = fopen(path, resumed ? "a" : "w"))) return core_error("%s: cannot write: %s", path, strerror(errno));
    snprintf(path, sizeof path, "%s/metrics.jsonl", r->run_dir);
    if (resumed && local_metrics_truncate(path, start)) return -1;
    return core_metrics_open(&S->metrics, path, resumed);
}

static void teardown(run_state *S) {
    for (int e = 0; e < 2; e++) {
        wan_model_free(&S->pol[e]);
        wan_model_free(&S->ema[e]);
        wan_model_free(&S->ref[e]);
        optim_adamw_free(&S->opt[e]);
    }
    if (S->ex) sp_usp_release(&S->usp);
    sp_comm_destroy(S->dpg);
    local_prompts_free(&S->train);
    local_prompts_free(&S->eval);
    free(S->emb_train), free(S->emb_eval), free(S->emb_neg), free(S->video);
    rollout_decoder_free(&S->dec);
    core_metrics_close(S->metrics);
    if (S->rewards_f) fclose(S->rewards_f);
}

/* Saves checkpoint-<step> into checkpoint.dir (default: the run directory) and prints one line. */
static int save_checkpoint(run_state *S, const local_sampler *smp, int64_t step, const char *config_text) {
    const core_recipe *r = S->r;
    trainer_ckpt_state st = {.step = step, .policy_version = VERSION(S), .rollout_round = step,
                             .data_epoch = smp->epoch, .data_position = smp->pos, .data_size = smp->n,
                             .seed = r->seed, .config = (char *)config_text};
    trainer_ckpt_expert ex[2] = {{"transformer", &S->pol[0], &S->opt[0], S->ema_on ? &S->ema[0] : NULL},
                                 {"transformer_2", &S->pol[1], &S->opt[1], S->ema_on ? &S->ema[1] : NULL}};
    char path[TRAINER_CKPT_PATH_MAX];
    const double t0 = now_s();
    if (trainer_ckpt_save(r->ckpt_dir ? r->ckpt_dir : r->run_dir, &st, ex, S->n_experts, r->ckpt_total_limit, path,
                          sizeof path))
        return -1;
    printf("checkpoint %s (%.2fs)\n", path, now_s() - t0);
    fflush(stdout);
    return 0;
}

/* --resume: loads the checkpoint at (or latest in) dir into S and smp; *step = its step (GRPO steps done). */
static int resume_from(run_state *S, local_sampler *smp, const char *dir, const char *config_text, int64_t total,
                       int64_t *step) {
    char ck[TRAINER_CKPT_PATH_MAX];
    trainer_ckpt_state st;
    trainer_ckpt_expert ex[2] = {{"transformer", &S->pol[0], &S->opt[0], S->ema_on ? &S->ema[0] : NULL},
                                 {"transformer_2", &S->pol[1], &S->opt[1], S->ema_on ? &S->ema[1] : NULL}};
    if (trainer_ckpt_resolve(dir, ck, sizeof ck)) return core_error_push("--resume: ");
    /* The run continues in the checkpoint's own folder: resuming into another run's folder would truncate its
     * metrics and prune its checkpoints. */
    {
        const char *home = S->r->ckpt_dir ? S->r->ckpt_dir : S->r->run_dir;
        char parent[TRAINER_CKPT_PATH_MAX], a[PATH_MAX], b[PATH_MAX];
        snprintf(parent, sizeof parent, "%s", ck);
        char *slash = strrchr(parent, '/');
        if (slash) *slash = 0;
        else snprintf(parent, sizeof parent, ".");
        if (!realpath(parent, a) || !realpath(home, b) || strcmp(a, b))
            return core_error("--resume: %s is not in this run's checkpoint folder %s (%s): set it to the checkpoint's "
                              "folder, e.g. --set %s=%s", ck, home, S->r->ckpt_dir ? "checkpoint.dir" : "logging.run_dir",
                              S->r->ckpt_dir ? "checkpoint.dir" : "logging.run_dir", parent);
    }
    if (trainer_ckpt_load(ck, config_text, ex, S->n_experts, &st)) return core_error_push("--resume: ");
    int rc = -1;
    if (st.data_size != smp->n)
        core_error("--resume: %s: the checkpoint drew from %" PRId64 " prompts, data.prompt_file %s has %d", ck,
                   st.data_size, S->r->prompt_file, smp->n);
    else if (st.data_position > smp->n || st.data_epoch > 0xffffffffll)
        core_error("--resume: %s/trainer_state.json: data_epoch %" PRId64 " / data_position %" PRId64
                   " out of range", ck, st.data_epoch, st.data_position);
    else if (st.rollout_round != st.step || st.policy_version != VERSION(S) ||
             st.policy_version != st.step * S->r->optimizer_steps_per_rollout)
        core_error("--resume: %s: step %" PRId64 ", rollout_round %" PRId64 ", policy_version %" PRId64
                   " and the optimizer's step %" PRId64 " disagree for a local run", ck, st.step, st.rollout_round,
                   st.policy_version, VERSION(S));
    else if (st.step > total)
        core_error("--resume: %s is at step %" PRId64 ", past this run's %" PRId64 " steps (optim.total_steps or "
                   "--steps)", ck, st.step, total);
    else
        rc = 0;
    if (!rc) {
        smp->epoch = (uint32_t)st.data_epoch;
        smp->pos = (int)st.data_position;
        local_epoch_order(smp->seed, smp->epoch, smp->n, smp->perm);
        *step = st.step;
        printf("resumed from %s: step %" PRId64 ", policy version %" PRId64 "\n", ck, st.step, st.policy_version);
        fflush(stdout);
    }
    trainer_ckpt_state_free(&st);
    return rc;
}

/* ---- parity (vgrpo parity): the trainer's recomputation of every trainable transition vs the rollout's ---- */

/* Per step index i: acc[4i..4i+3] = transitions, sum |dlogp|, max |dlogp|, max |dv|. */
typedef struct {
    const core_traj *traj;  /* this rank's share */
    const float *vel;       /* the share's rollout velocities, [n, N, nl] */
    int N;
    double *acc;
} parity_acc;

static void parity_probe(void *ctx, int s, int i, const float *v, int64_t nl, float logp) {
    parity_acc *P = ctx;
    double *a = P->acc + 4 * i;
    const double d = fabs((double)logp - (double)P->traj[s].log_probs[i]);
    a[0] += 1, a[1] += d;
    if (d > a[2]) a[2] = d;
    const float *vr = P->vel + ((int64_t)s * P->N + i) * nl;
    double m = 0;
    for (int64_t k = 0; k < nl; k++) {
        const double e = fabs((double)v[k] - (double)vr[k]);
        if (e > m) m = e;
    }
    if (m > a[3]) a[3] = m;
}

/* This rank's share of the batch recomputed through the trainer's own path (trainer_accumulate, no backward, the
 * recipe's micro-batch size), then the per-step sums and maxima combined over the dp ranks. */
static int parity_share(run_state *S, const trainer_batch *tb, const float *vel, int N, double *acc) {
    int lo = 0, hi = tb->n;
    if (S->dp) dp_share(tb->n, S->me.dp_rank, S->topo.dp, &lo, &hi);
    trainer_batch sub = *tb;
    if (trainer_count_transitions(&S->tc, tb, S->n_experts, S->trained, &sub.denom)) return -1;
    sub.n = hi - lo, sub.traj += lo, sub.cond += lo, sub.adv += lo, sub.mask += lo;
    parity_acc P = {sub.traj, vel + (int64_t)lo * N * S->nl, N, acc};
    trainer_config tc = S->tc;
    tc.probe = parity_probe;
    tc.probe_ctx = &P;
    grpo_loss_stats st = {0};
    memset(acc, 0, sizeof(double) * 4 * (size_t)N);
    wan_model *pol[2] = {&S->pol[0], &S->pol[1]};
    const wan_model *ref[2] = {&S->ref[0], &S->ref[1]};
    if (trainer_accumulate_experts(pol, S->have_ref ? ref : NULL, S->n_experts, S->trained, S->ex, &tc, &sub, 0, &st))
        return -1;
    if (!S->dpg || S->dpg->size == 1) return 0;
    double *mx = malloc(sizeof(double) * 2 * (size_t)N), *sm = malloc(sizeof(double) * 2 * (size_t)N);
    if (!mx || !sm) return free(mx), free(sm), core_error("out of memory");
    for (int i = 0; i < N; i++) sm[2 * i] = acc[4 * i], sm[2 * i + 1] = acc[4 * i + 1], mx[2 * i] = acc[4 * i + 2], mx[2 * i + 1] = acc[4 * i + 3];
    int rc = dp_sum_doubles(S->dpg, sm, 2 * N) || dp_max_doubles(S->dpg, mx, 2 * N) ? -1 : 0;
    for (int i = 0; i < N; i++) acc[4 * i] = sm[2 * i], acc[4 * i + 1] = sm[2 * i + 1], acc[4 * i + 2] = mx[2 * i], acc[4 * i + 3] = mx[2 * i + 1];
    free(mx), free(sm);
    return rc;
}

/* Colocated start-up: the workers hold the initial weights of model.path (policy version 0). A fresh run checks
 * that each worker's model hash equals this trainer's; a resumed run pushes its weights first. */
static int start_workers(run_state *S, int resumed) {
    const wan_model *ex[2] = {&S->pol[0], &S->pol[1]};
    if (resumed) {
        int match;
        return ctl_sync_weights(S->ctl, ex, S->n_experts, S->trained, VERSION(S), S->ctl_timeout, &match);
    }
    uint64_t h;
    if (wan_models_hash(ex, S->n_experts, &h)) return -1;
    for (int w = 0; w < ctl_n_workers(S->ctl); w++)
        if (ctl_worker_hello_hash(S->ctl, w) != h)
            return core_error("%s holds weights with model hash %016llx, the trainer's initial weights hash to %016llx "
                              "(both must load model.path %s)", ctl_worker_id(S->ctl, w),
                              (unsigned long long)ctl_worker_hello_hash(S->ctl, w), (unsigned long long)h,
                              S->r->model_path);
    return 0;
}

int grpo_run(const core_recipe *r, int64_t steps_override, const char *resume, ctl_server *ctl, sp_comm *dp,
             double ctl_timeout) {
    run_state S;
    memset(&S, 0, sizeof S);
    S.r = r;
    S.ctl = ctl;
    S.dp = dp;
    S.ctl_timeout = ctl_timeout;
    local_sampler smp = {0};
    int rc = -1, signals = 0, stopped = 0;
    int64_t start = 0;
    char *config_text = NULL;
    if (setup(&S, r, ctl == NULL) || local_sampler_init(&smp, S.train.n, r->prompts_per_step, (uint64_t)r->seed)) goto done;
    if (r->ema_decay > 0) { /* the moving average starts at the initial weights */
        for (int e = 0; e < S.n_experts; e++) {
            if (wan_model_init(&S.ema[e], &S.pol[e].cfg)) goto done;
            memcpy(S.ema[e].params, S.pol[e].params, sizeof(float) * (size_t)S.pol[e].layout.numel);
        }
        S.ema_on = 1;
    }
    const int64_t total = steps_override > 0 ? steps_override : r->total_steps;
    if (!(config_text = local_config_text(r))) goto done;
    if (resume && resume_from(&S, &smp, resume, config_text, total, &start)) goto done;
    if (ctl && start_workers(&S, resume != NULL)) goto done;
    if (open_run_files(&S, r, resume != NULL, start)) goto done;
    printf("vgrpo run (%s): %s (%s, %s), latent %d x %d x %d x %d, %d denoising steps, B=%d G=%d, %" PRId64
           " GRPO steps -> %s\n",
           ctl ? "colocated" : "local", r->model_path, r->text_encoder, r->decoder, (int)S.rc.shape[0],
           (int)S.rc.shape[1], (int)S.rc.shape[2], (int)S.rc.shape[3], r->num_steps, r->prompts_per_step,
           r->samples_per_prompt, total, r->run_dir);
    if (ctl)
        printf("  %d rollout worker(s), %d trainer rank(s)\n", ctl_n_workers(ctl), dp ? dp->size : 1);
    fflush(stdout);
    local_signals_install();
    signals = 1;
    for (int64_t k = start; k < total; k++) {
        if (core_metrics_i64(S.metrics, "step", k) || core_metrics_i64(S.metrics, "policy_version", VERSION(&S))) goto done;
        if (k == 0 || (r->eval_every > 0 && k % r->eval_every == 0))
            if (run_eval(&S, k)) goto done;
        if (r->video_every > 0 && k % r->video_every == 0 && write_step_videos(&S, k)) goto done;
        if (run_step(&S, &smp, k, total) || core_metrics_write_row(S.metrics)) goto done;
        const int sig = local_signal_pending();
        if (r->ckpt_every > 0 && ((k + 1) % r->ckpt_every == 0 || k + 1 == total || sig)) {
            if (save_checkpoint(&S, &smp, k + 1, config_text)) goto done;
        }
        if (sig) {
            core_error("stopped by signal %d after step %" PRId64 " (%" PRId64 " of %" PRId64 " steps done); %s", sig,
                       k, k + 1, total, r->ckpt_every > 0 ? "checkpoint saved: continue with --resume"
                                                          : "no checkpoint (checkpoint.every is 0)");
            stopped = 1; /* a clean stop between steps: the other trainer ranks are told to stop */
            goto done;
        }
    }
    if (core_metrics_i64(S.metrics, "step", total) || core_metrics_i64(S.metrics, "policy_version", VERSION(&S)) ||
        run_eval(&S, total) || core_metrics_write_row(S.metrics))
        goto done;
    if (r->video_every > 0 && write_step_videos(&S, total)) goto done;
    rc = 0;
done:
    if (signals) local_signals_restore();
    if ((!rc || stopped) && dp && dp->size > 1) {
        int64_t cmd = DP_CMD_STOP;
        if (sp_comm_broadcast(dp, &cmd, 1, SP_I64, 0)) rc = -1, stopped = 0;
    }
    if (stopped && rc) rc = 1;
    free(config_text);
    local_sampler_free(&smp);
    teardown(&S);
    return rc;
}

int local_run(const core_recipe *r, int64_t steps_override, const char *resume) {
    return grpo_run(r, steps_override, resume, NULL, NULL, 0);
}

int grpo_parity(const core_recipe *r, ctl_server *ctl, sp_comm *dp, double tolerance, double ctl_timeout) {
    run_state S;
    memset(&S, 0, sizeof S);
    S.r = r, S.ctl = ctl, S.dp = dp, S.ctl_timeout = ctl_timeout;
    local_sampler smp = {0};
    const int B = r->prompts_per_step, G = r->samples_per_prompt, n = B * G, N = r->num_steps;
    core_traj *tr = calloc((size_t)n, sizeof *tr);
    float **vel = calloc((size_t)n, sizeof(float *));
    const float **cond = malloc(sizeof(float *) * (size_t)n);
    uint64_t *uids = malloc(sizeof(uint64_t) * (size_t)n);
    int64_t *pidx = malloc(sizeof(int64_t) * (size_t)n);
    int *slot = malloc(sizeof(int) * (size_t)B);
    float *adv = calloc((size_t)n, sizeof(float)), *vflat = NULL;
    uint8_t *mask = calloc((size_t)n, 1);
    double *acc = calloc(4 * (size_t)N, sizeof(double));
    int rc = -1, have = 0, computed = 0;
    if (!tr || !vel || !cond || !uids || !pidx || !slot || !adv || !mask || !acc) {
        core_error("out of memory");
        goto done;
    }
    if (setup(&S, r, 0) || local_sampler_init(&smp, S.train.n, B, (uint64_t)r->seed) || start_workers(&S, 0)) goto done;
    local_sampler_next(&smp, slot); /* the prompts of step 0 */
    for (int b = 0; b < B; b++)
        for (int g = 0; g < G; g++) {
            const int k = b * G + g;
            uids[k] = (uint64_t)k, pidx[k] = slot[b], cond[k] = S.emb_train + (int64_t)slot[b] * S.ne;
        }
    const double t0 = now_s();
    if (remote_rollout_v(&S, n, uids, pidx, (const char *const *)S.train.text, CORE_STREAM_ROLLOUT_NOISE, r->eta, 1, tr, vel,
                         VERSION(&S)))
        goto done;
    have = 1;
    const double t1 = now_s();
    const int64_t per = (int64_t)N * S.nl;
    if (!(vflat = malloc(sizeof(float) * (size_t)(per * n)))) {
        core_error("out of memory");
        goto done;
    }
    for (int k = 0; k < n; k++) memcpy(vflat + per * k, vel[k], sizeof(float) * (size_t)per);
    if (dp && dp->size > 1) {
        dp_batch db = {.n = n, .traj = tr, .adv = adv, .mask = mask};
        int64_t cmd = DP_CMD_PARITY;
        if (sp_comm_broadcast(dp, &cmd, 1, SP_I64, 0) || dp_batch_broadcast(dp, &db) ||
            sp_comm_broadcast(dp, vflat, (size_t)(per * n), SP_F32, 0))
            goto done;
    }
    trainer_batch tb = {.n = n, .traj = tr, .cond = cond, .neg = S.emb_neg, .text_len = r->text_len, .adv = adv,
                        .mask = mask};
    if (parity_share(&S, &tb, vflat, N, acc)) goto done;
    computed = 1;
    const double t2 = now_s();
    double worst_lp = 0, worst_v = 0, tol_lp = tolerance, tol_v = tolerance;
    if (tolerance < 0) { /* auto */
        tol_lp = tol_v = 0;
        if (S.topo.sp / S.topo.ulysses > 1) {
            double vmax = 0, lmax = 1;
            for (int64_t k = 0; k < per * n; k++) vmax = fabs(vflat[k]) > vmax ? fabs(vflat[k]) : vmax;
            for (int k = 0; k < n; k++)
                for (int i = 0; i < N; i++) lmax = fabs(tr[k].log_probs[i]) > lmax ? fabs(tr[k].log_probs[i]) : lmax;
            tol_v = 32.0 * FLT_EPSILON * vmax, tol_lp = 32.0 * FLT_EPSILON * lmax;
        }
    }
    printf("parity: %d samples (%d prompts x %d) x %d steps at policy version 0; rollout: %d worker(s), %d samples per "
           "forward; trainer: %d rank(s), %d transitions per forward (algorithm.micro_batch_size)\n",
           n, B, G, N, ctl_n_workers(ctl), r->batch_size, dp ? dp->size : 1, r->micro_batch_size);
    printf("%5s %9s %11s %14s %14s %14s\n", "step", "timestep", "transitions", "mean|dlogp|", "max|dlogp|", "max|dv|");
    for (int i = 0; i < N; i++) {
        const double *a = acc + 4 * i;
        if (a[0] == 0) continue;
        printf("%5d %9.3f %11.0f %14.6g %14.6g %14.6g\n", i, (double)tr[0].timesteps[i], a[0], a[1] / a[0], a[2], a[3]);
        worst_lp = a[2] > worst_lp ? a[2] : worst_lp;
        worst_v = a[3] > worst_v ? a[3] : worst_v;
    }
    const int pass = worst_lp <= tol_lp && worst_v <= tol_v;
    printf("parity: trainer layout dp %d x sp %d (ulysses %d, ring %d)\n", S.topo.dp, S.topo.sp, S.topo.ulysses,
           S.topo.sp / S.topo.ulysses);
    printf("parity: max |logp_trainer - logp_rollout| = %.6g (tolerance %.6g), max |v_trainer - v_rollout| = %.6g "
           "(tolerance %.6g): %s (rollout %.2fs, recompute %.2fs)\n", worst_lp, tol_lp, worst_v, tol_v,
           pass ? "PASS" : "FAIL", t1 - t0, t2 - t1);
    fflush(stdout);
    /* parity.json in the run directory */
    if (core_mkdir_p(r->run_dir)) goto done;
    json_t *steps = json_array();
    for (int i = 0; i < N; i++) {
        const double *a = acc + 4 * i;
        if (a[0] == 0) continue;
        json_array_append_new(steps, json_pack("{s:i, s:f, s:i, s:f, s:f, s:f}", "step", i, "timestep",
                                               (double)tr[0].timesteps[i], "transitions", (int)a[0], "mean_abs_dlogp",
                                               a[1] / a[0], "max_abs_dlogp", a[2], "max_abs_dv", a[3]));
    }
    json_t *root = json_pack("{s:o, s:f, s:f, s:f, s:f, s:b, s:i, s:i, s:i, s:i, s:i, s:i}", "steps", steps,
                             "max_abs_dlogp", worst_lp, "max_abs_dv", worst_v, "tolerance_dlogp", tol_lp,
                             "tolerance_dv", tol_v, "pass", pass, "samples", n, "workers", ctl_n_workers(ctl),
                             "trainer_ranks", dp ? dp->size : 1, "sp", S.topo.sp, "ulysses_degree", S.topo.ulysses,
                             "micro_batch_size", r->micro_batch_size);
    char path[4200];
    snprintf(path, sizeof path, "%s/parity.json", r->run_dir);
    if (json_dump_file(root, path, JSON_INDENT(1) | JSON_REAL_PRECISION(9))) core_log_warn("%s: cannot write", path);
    json_decref(root);
    rc = 0;
    if (!pass) {
        core_error("parity: the trainer's log-probs or velocities differ from the rollout's by more than the tolerance "
                   "(dlogp %g > %g or dv %g > %g)", worst_lp, tol_lp, worst_v, tol_v);
        rc = 1;
    }
done:
    if (dp && dp->size > 1 && computed) { /* otherwise the caller aborts the MPI job */
        int64_t cmd = DP_CMD_STOP;
        if (sp_comm_broadcast(dp, &cmd, 1, SP_I64, 0)) rc = -1;
    }
    if (have)
        for (int k = 0; k < n; k++) core_traj_free(&tr[k]), free(vel[k]);
    free(tr), free(vel), free(cond), free(uids), free(pidx), free(slot), free(adv), free(mask), free(acc), free(vflat);
    local_sampler_free(&smp);
    teardown(&S);
    return rc;
}

int grpo_follow(const core_recipe *r, int64_t steps_override, const char *resume, sp_comm *dp) {
    run_state S;
    memset(&S, 0, sizeof S);
    S.r = r;
    S.dp = dp;
    local_sampler smp = {0};
    dp_batch db = {0};
    const float **cond = NULL;
    int rc = -1;
    int64_t start = 0;
    char *config_text = NULL;
    if (setup(&S, r, 0) || local_sampler_init(&smp, S.train.n, r->prompts_per_step, (uint64_t)r->seed)) goto done;
    const int64_t total = steps_override > 0 ? steps_override : r->total_steps;
    if (!(config_text = local_config_text(r))) goto done;
    if (resume && resume_from(&S, &smp, resume, config_text, total, &start)) goto done;
    for (;;) {
        int64_t cmd = -1;
        if (sp_comm_broadcast(dp, &cmd, 1, SP_I64, 0)) goto done;
        if (cmd == DP_CMD_STOP) break;
        if (cmd != DP_CMD_TRAIN && cmd != DP_CMD_PARITY) {
            core_error("trainer rank %d: unknown command %lld from rank 0", dp->rank, (long long)cmd);
            goto done;
        }
        if (dp_batch_broadcast(dp, &db)) goto done;
        free(cond);
        if (!(cond = malloc(sizeof(float *) * (size_t)db.n))) {
            core_error("out of memory");
            goto done;
        }
        for (int s = 0; s < db.n; s++) {
            if (db.traj[s].prompt_index < 0 || db.traj[s].prompt_index >= S.train.n) {
                core_error("trainer rank %d: prompt index %lld out of range", dp->rank, (long long)db.traj[s].prompt_index);
                goto done;
            }
            cond[s] = S.emb_train + db.traj[s].prompt_index * S.ne;
        }
        trainer_batch tb = {.n = db.n, .traj = db.traj, .cond = cond, .neg = S.emb_neg, .text_len = r->text_len,
                            .adv = db.adv, .mask = db.mask};
        if (cmd == DP_CMD_PARITY) {
            const int N = db.traj[0].n_steps;
            const int64_t cnt = (int64_t)db.n * N * S.nl;
            float *vflat = malloc(sizeof(float) * (size_t)cnt);
            double *acc = malloc(sizeof(double) * 4 * (size_t)N);
            int bad = !vflat || !acc ? core_error("out of memory") : 0;
            if (!bad) bad = sp_comm_broadcast(dp, vflat, (size_t)cnt, SP_F32, 0) || parity_share(&S, &tb, vflat, N, acc);
            free(vflat), free(acc);
            if (bad) goto done;
            dp_batch_free(&db);
            continue;
        }
        for (int u = 0; u < r->optimizer_steps_per_rollout; u++) {
            grpo_loss_stats st = {0};
            optim_step_info info;
            if (train_update(&S, &tb, &st, &info)) goto done;
        }
        dp_batch_free(&db);
    }
    rc = 0;
done:
    dp_batch_free(&db);
    free(cond);
    free(config_text);
    local_sampler_free(&smp);
    teardown(&S);
    return rc;
}
