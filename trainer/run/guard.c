/* trainer/run/guard.c — the reward-hacking guard (trainer/run/guard.h): video statistics and their drift, the gold eval's
 * verdicts (best eval, early stop) and the state a checkpoint carries. The run's wiring (which rollout returns
 * videos, when the gold eval runs, the best/ symlink and the saves) is in trainer/run/loop.c, trainer/run/eval.c and
 * trainer/run/run_files.c. */
#include "trainer/run/guard.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "core/reduce.h"

static void state_init(guard_state *s) {
    memset(s, 0, sizeof *s);
    s->best_step = -1;
    for (int i = 0; i < GUARD_NSTATS; i++) s->warn_from[i] = -1, s->warn_sign[i] = 0;
}

int trainer_guard_init(trainer_guard *G, const core_recipe *r, const core_prompts *eval) {
    memset(G, 0, sizeof *G);
    G->stats_on = r->video_stats ? 1 : 0;
    G->warn_sd = r->drift_warn_sd;
    G->patience = r->guard_patience;
    G->patience_se = r->guard_patience_se;
    if (r->gold_scorers.n > GUARD_MAX_GOLD)
        return core_error("guard.gold_scorers: %d scorers, at most %d", r->gold_scorers.n, GUARD_MAX_GOLD);
    if (r->gold_weights.n != r->gold_scorers.n)
        return core_error("guard.gold_weights: %d weights for %d gold scorers", r->gold_weights.n, r->gold_scorers.n);
    int need_color = 0;
    for (int i = 0; i < r->gold_scorers.n; i++) {
        if (!(G->gold[i] = reward_find(r->gold_scorers.v[i]))) return core_error_push("guard.gold_scorers.%d: ", i);
        if (!G->gold[i]->fn) return core_error("guard.gold_scorers.%d: %s is a learned scorer (not a gold scorer)", i, G->gold[i]->name);
        G->gold_w[i] = r->gold_weights.v[i];
        need_color |= !strcmp(G->gold[i]->name, "color_match");
    }
    G->n_gold = r->gold_scorers.n;
    if (G->patience > 0 && G->n_gold == 0)
        return core_error("guard.patience: %d needs guard.gold_scorers (the early stop watches the gold eval)",
                          G->patience);
    for (int i = 0; need_color && eval && i < eval->n; i++) {
        const char *col = json_string_value(json_object_get(eval->meta[i], "color"));
        const char *keys[1] = {"color"}, *vals[1] = {col};
        const reward_meta md = {col ? 1 : 0, keys, vals};
        int c;
        char at[4200];
        if (reward_target_color(eval->text[i], &md, &c))
            return core_error_push("%s (guard.gold_scorers color_match): ", core_prompts_where(eval, i, at, sizeof at));
    }
    state_init(&G->st);
    G->st0 = G->st;
    return 0;
}

void trainer_guard_free(trainer_guard *G) {
    if (!G) return;
    free(G->vstats);
    G->vstats = NULL;
    G->vcap = G->vn = 0;
}

int trainer_guard_active(const trainer_guard *G) { return G->stats_on || G->n_gold > 0; }

/* ---- video statistics ---- */

int trainer_guard_begin_step(trainer_guard *G, int n, uint64_t uid0) {
    if (n > G->vcap) {
        double *v = realloc(G->vstats, sizeof(double) * GUARD_NSTATS * (size_t)n);
        if (!v) return core_error("out of memory");
        G->vstats = v, G->vcap = n;
    }
    for (int i = 0; i < n * GUARD_NSTATS; i++) G->vstats[i] = NAN;
    G->vn = n, G->uid0 = uid0;
    return 0;
}

int trainer_guard_on_chunk(void *ctx, const core_rollout_sample *samples, const core_rollout_result *res, int n,
                           const uint8_t *videos, const int64_t vshape[4]) {
    trainer_guard *G = ctx;
    (void)res;
    if (!videos) return core_error("guard.video_stats: the rollout source returned no videos");
    if (vshape[3] != 3)
        return core_error("guard.video_stats: videos of shape [%lld, %lld, %lld, %lld], expected RGB (3 channels)",
                          (long long)vshape[0], (long long)vshape[1], (long long)vshape[2], (long long)vshape[3]);
    const int64_t vb = vshape[0] * vshape[1] * vshape[2] * 3;
    for (int j = 0; j < n; j++) {
        const uint64_t at = samples[j].uid - G->uid0;
        if (samples[j].uid < G->uid0 || at >= (uint64_t)G->vn)
            return core_error("guard.video_stats: a video of uid %llu outside this rollout's uids %llu..%llu",
                              (unsigned long long)samples[j].uid, (unsigned long long)G->uid0,
                              (unsigned long long)(G->uid0 + (uint64_t)G->vn - 1));
        if (media_video_stats(videos + vb * j, vshape[0], vshape[1], vshape[2], G->vstats + at * GUARD_NSTATS))
            return core_error_push("guard.video_stats: uid %llu: ", (unsigned long long)samples[j].uid);
    }
    return 0;
}

void trainer_guard_reward(trainer_guard *G, double reward_mean) {
    guard_state *s = &G->st;
    if (s->best_reward_pending) s->best_reward = reward_mean, s->best_reward_pending = 0;
    s->reward_sum += reward_mean;
    s->reward_n++;
}

int trainer_guard_step(trainer_guard *G, int64_t step, const double *vstats, int n, double reward_mean, core_metrics *m,
                       FILE *out) {
    trainer_guard_reward(G, reward_mean);
    if (!G->stats_on) return 0;
    if (n < 1) return core_error("guard.video_stats: no videos at step %" PRId64, step);
    guard_state *s = &G->st;
    double *x = malloc(sizeof(double) * (size_t)n);
    if (!x) return core_error("out of memory");
    const int base = !s->have_base;
    char key[96];
    int rc = 0;
    for (int i = 0; i < GUARD_NSTATS && !rc; i++) {
        for (int j = 0; j < n; j++) x[j] = vstats[(int64_t)j * GUARD_NSTATS + i];
        double mean, sd, se;
        core_mean_sd_se(x, n, &mean, &sd, &se);
        if (!isfinite(mean)) {
            rc = core_error("guard.video_stats: step %" PRId64 ": no %s for every video (a video missing from the "
                            "rollout's chunks)", step, media_vstat_names[i]);
            break;
        }
        if (base) s->base_mean[i] = mean, s->base_sd[i] = sd;
        const double drift = (mean - s->base_mean[i]) / (s->base_sd[i] > GUARD_SD_FLOOR ? s->base_sd[i] : GUARD_SD_FLOOR);
        G->mean[i] = mean, G->drift[i] = drift;
        if (m) {
            snprintf(key, sizeof key, "stats/%s/mean", media_vstat_names[i]);
            rc = core_metrics_f64(m, key, mean);
            snprintf(key, sizeof key, "stats/%s/drift_sd", media_vstat_names[i]);
            if (!rc) rc = core_metrics_f64(m, key, drift);
        }
    }
    free(x);
    if (rc) return -1;
    s->have_base = 1;
    for (int i = 0; i < GUARD_NSTATS; i++) {
        const double d = G->drift[i];
        const int sign = d > 0 ? 1 : -1;
        if (!(fabs(d) > G->warn_sd)) {
            s->warn_from[i] = -1, s->warn_sign[i] = 0;
            continue;
        }
        int say = 0;
        if (s->warn_from[i] < 0 || s->warn_sign[i] != sign) s->warn_from[i] = step, s->warn_sign[i] = sign, say = 1;
        else say = (step - s->warn_from[i]) % GUARD_WARN_EVERY == 0;
        if (say && out) {
            fprintf(out, "guard: stats/%s drifted %+.1f sd from step 0 at step %" PRId64 " (mean %.4f; step 0: %.4f +- "
                    "%.4f)", media_vstat_names[i], d, step, G->mean[i], s->base_mean[i], s->base_sd[i]);
            if (s->warn_from[i] != step)
                fprintf(out, "; past %g sd since step %" PRId64, G->warn_sd, s->warn_from[i]);
            fprintf(out, "\n");
        }
    }
    if (out) fflush(out);
    return 0;
}

/* ---- gold eval and early stop ---- */

int trainer_guard_score(const trainer_guard *G, const uint8_t *video, const int64_t vshape[4], const char *prompt,
                        const json_t *meta, double *vals, double *score) {
    const reward_video v = {.data = video, .frames = vshape[0], .height = vshape[1], .width = vshape[2]};
    /* the prompt's metadata as the reward server gets it: every string entry */
    const char *keys[16], *values[16];
    int nm = 0;
    const char *k;
    json_t *jv;
    json_object_foreach((json_t *)meta, k, jv) {
        if (nm < 16 && json_is_string(jv)) keys[nm] = k, values[nm] = json_string_value(jv), nm++;
    }
    const reward_meta md = {nm, keys, values};
    double total = 0;
    for (int i = 0; i < G->n_gold; i++) {
        if (G->gold[i]->fn(&v, prompt, &md, &vals[i])) return core_error_push("guard gold scorer %s: ", G->gold[i]->name);
        total += G->gold_w[i] * vals[i];
    }
    *score = total;
    return 0;
}

void trainer_guard_judge(const trainer_guard *G, double mean, double se, guard_verdict *v) {
    const guard_state *s = &G->st;
    memset(v, 0, sizeof *v);
    v->mean = mean, v->se = se, v->lcb = mean - GUARD_LCB_Z * se;
    v->new_best = s->best_step < 0 || v->lcb > s->best_lcb;
    v->r_now = s->reward_n > 0 ? s->reward_sum / (double)s->reward_n : NAN;
    v->r_best = s->best_step >= 0 && !s->best_reward_pending ? s->best_reward : NAN;
    if (!v->new_best) {
        v->fell = s->best_mean - mean > G->patience_se * sqrt(se * se + s->best_se * s->best_se);
        v->rose = isfinite(v->r_now) && isfinite(v->r_best) && v->r_now > v->r_best;
    }
    v->bad_evals = v->fell && v->rose ? s->bad_evals + 1 : 0;
    v->stop = G->patience > 0 && v->bad_evals >= G->patience;
}

void trainer_guard_commit(trainer_guard *G, int64_t step, const guard_verdict *v) {
    guard_state *s = &G->st;
    s->evals++;
    if (v->new_best) {
        s->best_step = step, s->best_lcb = v->lcb, s->best_mean = v->mean, s->best_se = v->se;
        s->best_reward_pending = 1, s->best_reward = 0;
    }
    s->bad_evals = v->bad_evals;
    s->reward_sum = 0, s->reward_n = 0;
    if (v->stop) s->stopped = 1;
}

void trainer_guard_boundary(trainer_guard *G) { G->st0 = G->st; }
void trainer_guard_rewind(trainer_guard *G) { G->st = G->st0; }

/* ---- checkpoint ---- */

static json_t *stat_obj_f(const double *x, int *bad) {
    json_t *o = json_object();
    for (int i = 0; o && i < GUARD_NSTATS; i++) {
        if (!isfinite(x[i])) *bad = 1;
        json_object_set_new(o, media_vstat_names[i], json_real(isfinite(x[i]) ? x[i] : 0.0));
    }
    return o;
}

static json_t *stat_obj_i(const int64_t *x) {
    json_t *o = json_object();
    for (int i = 0; o && i < GUARD_NSTATS; i++) json_object_set_new(o, media_vstat_names[i], json_integer(x[i]));
    return o;
}

char *trainer_guard_state_json(const guard_state *s) {
    int bad = 0;
    int64_t sign[GUARD_NSTATS];
    for (int i = 0; i < GUARD_NSTATS; i++) sign[i] = s->warn_sign[i];
    const double reals[] = {s->best_lcb, s->best_mean, s->best_se, s->best_reward, s->reward_sum};
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++) bad |= !isfinite(reals[i]);
    json_t *o = json_pack("{s:b, s:o, s:o, s:o, s:o, s:I, s:I, s:f, s:f, s:f, s:b, s:f, s:I, s:f, s:I, s:b}", "have_base",
                          s->have_base, "base_mean", stat_obj_f(s->base_mean, &bad), "base_sd",
                          stat_obj_f(s->base_sd, &bad), "warn_from", stat_obj_i(s->warn_from), "warn_sign",
                          stat_obj_i(sign), "evals", (json_int_t)s->evals, "best_step", (json_int_t)s->best_step,
                          "best_lcb", isfinite(s->best_lcb) ? s->best_lcb : 0.0, "best_mean",
                          isfinite(s->best_mean) ? s->best_mean : 0.0, "best_se", isfinite(s->best_se) ? s->best_se : 0.0,
                          "best_reward_pending", s->best_reward_pending, "best_reward",
                          isfinite(s->best_reward) ? s->best_reward : 0.0, "bad_evals", (json_int_t)s->bad_evals,
                          "reward_sum", isfinite(s->reward_sum) ? s->reward_sum : 0.0, "reward_n",
                          (json_int_t)s->reward_n, "stopped", s->stopped);
    if (!o) return core_error("guard state: out of memory"), NULL;
    if (bad) return json_decref(o), core_error("guard state: a non-finite value (cannot be saved)"), NULL;
    char *t = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (!t) core_error("guard state: out of memory");
    return t;
}

static int get_num(json_t *o, const char *key, double *out, const char *label) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return core_error("%s: guard field \"%s\": expected a number", label, key);
    *out = json_number_value(v);
    return 0;
}

static int get_int(json_t *o, const char *key, int64_t *out, int64_t lo, const char *label) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v) || json_integer_value(v) < lo)
        return core_error("%s: guard field \"%s\": expected an integer >= %lld", label, key, (long long)lo);
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int get_bool(json_t *o, const char *key, int *out, const char *label) {
    json_t *v = json_object_get(o, key);
    if (!json_is_boolean(v)) return core_error("%s: guard field \"%s\": expected true or false", label, key);
    *out = json_is_true(v);
    return 0;
}

/* One object keyed by the statistics' names. */
static int get_stats(json_t *o, const char *key, double *f, int64_t *n, const char *label) {
    json_t *v = json_object_get(o, key);
    if (!json_is_object(v)) return core_error("%s: guard field \"%s\": expected an object", label, key);
    for (int i = 0; i < GUARD_NSTATS; i++) {
        char k[96];
        snprintf(k, sizeof k, "%s.%s", key, media_vstat_names[i]);
        json_t *x = json_object_get(v, media_vstat_names[i]);
        if (f ? !json_is_number(x) : !json_is_integer(x))
            return core_error("%s: guard field \"%s\": expected %s", label, k, f ? "a number" : "an integer");
        if (f) f[i] = json_number_value(x);
        else n[i] = (int64_t)json_integer_value(x);
    }
    return 0;
}

int trainer_guard_state_load(guard_state *s, const char *text, const char *label) {
    json_t *o = core_json_parse_object(text, label);
    if (!o) return -1;
    guard_state t;
    state_init(&t);
    int64_t sign[GUARD_NSTATS];
    int rc = get_bool(o, "have_base", &t.have_base, label) || get_stats(o, "base_mean", t.base_mean, NULL, label) ||
             get_stats(o, "base_sd", t.base_sd, NULL, label) || get_stats(o, "warn_from", NULL, t.warn_from, label) ||
             get_stats(o, "warn_sign", NULL, sign, label) || get_int(o, "evals", &t.evals, 0, label) ||
             get_int(o, "best_step", &t.best_step, -1, label) || get_num(o, "best_lcb", &t.best_lcb, label) ||
             get_num(o, "best_mean", &t.best_mean, label) || get_num(o, "best_se", &t.best_se, label) ||
             get_bool(o, "best_reward_pending", &t.best_reward_pending, label) ||
             get_num(o, "best_reward", &t.best_reward, label) || get_int(o, "bad_evals", &t.bad_evals, 0, label) ||
             get_num(o, "reward_sum", &t.reward_sum, label) || get_int(o, "reward_n", &t.reward_n, 0, label) ||
             get_bool(o, "stopped", &t.stopped, label);
    json_decref(o);
    if (rc) return -1;
    for (int i = 0; i < GUARD_NSTATS; i++) {
        if (sign[i] < -1 || sign[i] > 1) return core_error("%s: guard field \"warn_sign\": expected -1, 0 or 1", label);
        t.warn_sign[i] = (int)sign[i];
    }
    *s = t;
    return 0;
}
