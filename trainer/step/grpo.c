/* trainer/step/grpo.c — GRPO advantages, clipped policy loss with its gradient, timestep selection and the loss
 * denominator. See grpo.h for the contracts; docs/design.md section 4 for the formulas. Everything here is single-threaded
 * and runs in a fixed order, so results never depend on thread count. */
#include "trainer/step/grpo.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"

/* No fused multiply-add: results must equal torch's fp32 kernels and the other ports (GCC does not contract in
 * ISO C mode; clang needs telling). */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define SEL_KEY "algorithm.timestep_selection"

/* ---- Advantages ---- */

int grpo_advantages(const float *rewards, int B, int G, int std_mode, float adv_clip_max, float *adv_out,
                    uint8_t *mask_out, grpo_adv_stats *stats) {
    if (B < 1 || G < 1) return core_error("algorithm: advantages need B >= 1 groups of G >= 1 samples (got B=%d, G=%d)", B, G);
    if (std_mode != GRPO_STD_GROUP && std_mode != GRPO_STD_BATCH)
        return core_error("algorithm: unknown advantage std mode %d (per-group or whole-batch)", std_mode);
    if (!(adv_clip_max > 0)) return core_error("algorithm.adv_clip_max: must be > 0 (got %g)", (double)adv_clip_max);
    const int n = B * G;
    for (int i = 0; i < n; i++)
        if (!isfinite(rewards[i]))
            return core_error("algorithm: reward of sample %d (group %d, replica %d) is not finite (%g)", i, i / G, i % G,
                              (double)rewards[i]);

    /* Batch statistics: sums in double in index order. */
    double sum = 0, lo = rewards[0], hi = rewards[0];
    for (int i = 0; i < n; i++) {
        sum += rewards[i];
        if (rewards[i] < lo) lo = rewards[i];
        if (rewards[i] > hi) hi = rewards[i];
    }
    const double bmean = sum / n;
    double ss = 0;
    for (int i = 0; i < n; i++) ss += ((double)rewards[i] - bmean) * ((double)rewards[i] - bmean);
    const double bstd = sqrt(ss / n);

    int n_mgroups = 0, n_msamples = 0, n_clamped = 0;
    const double clip = adv_clip_max;
    for (int b = 0; b < B; b++) {
        const float *r = rewards + (size_t)b * G;
        double gsum = 0;
        float gmin = r[0], gmax = r[0];
        for (int g = 0; g < G; g++) {
            gsum += r[g];
            if (r[g] < gmin) gmin = r[g];
            if (r[g] > gmax) gmax = r[g];
        }
        const double gmean = gsum / G;
        if (gmax == gmin) { /* no signal in this group (a group of one always): A = 0, mask 0 */
            for (int g = 0; g < G; g++) {
                adv_out[(size_t)b * G + g] = 0.0f;
                mask_out[(size_t)b * G + g] = 0;
            }
            n_mgroups++;
            n_msamples += G;
            continue;
        }
        double std = bstd;
        if (std_mode == GRPO_STD_GROUP) {
            double gss = 0;
            for (int g = 0; g < G; g++) gss += ((double)r[g] - gmean) * ((double)r[g] - gmean);
            std = sqrt(gss / G);
        }
        for (int g = 0; g < G; g++) {
            double a = ((double)r[g] - gmean) / (std + 1e-4);
            if (a > clip || a < -clip) {
                a = a > clip ? clip : -clip;
                n_clamped++;
            }
            adv_out[(size_t)b * G + g] = (float)a;
            mask_out[(size_t)b * G + g] = 1;
        }
    }
    if (stats) {
        stats->reward_mean = bmean;
        stats->reward_std = bstd;
        stats->reward_min = lo;
        stats->reward_max = hi;
        stats->n_masked_groups = n_mgroups;
        stats->n_masked_samples = n_msamples;
        stats->masked_fraction = (double)n_msamples / n;
        stats->n_clamped = n_clamped;
    }
    return 0;
}

/* ---- Clipped policy loss ---- */

int grpo_ppo_term(float ratio, float adv, float eps, float *policy, float *dpolicy_dratio) {
    const float lo = 1.0f - eps, hi = 1.0f + eps;
    const float rc = ratio < lo ? lo : (ratio > hi ? hi : ratio);
    const float unclipped = -adv * ratio, clipped = -adv * rc;
    /* torch autograd: d unclipped/d ratio = -adv; d clipped/d ratio = -adv where lo <= ratio <= hi, else 0 */
    const float g_u = -adv, g_c = (ratio >= lo && ratio <= hi) ? -adv : 0.0f;
    float g;
    if (unclipped > clipped) g = g_u;
    else if (unclipped < clipped) g = g_c;
    else g = 0.5f * g_u + 0.5f * g_c; /* torch.maximum splits exact ties */
    *policy = unclipped > clipped ? unclipped : clipped;
    *dpolicy_dratio = g;
    return ratio < lo || ratio > hi;
}

int grpo_loss_terms(int n, const float *logp_new, const float *logp_old, const float *adv, const uint8_t *mask,
                    const float *kl, float eps, float beta, int64_t denom, float *dlogp_out, float *dkl_out,
                    grpo_loss_stats *stats) {
    if (n < 0) return core_error("grpo loss: negative transition count %d", n);
    if (!(eps > 0)) return core_error("algorithm.clip_range: must be > 0 (got %g)", (double)eps);
    if (!(beta >= 0) || isinf(beta)) return core_error("algorithm.beta: must be finite and >= 0 (got %g)", (double)beta);
    if (denom < 1) return core_error("grpo loss: the loss denominator (trained transitions of the global batch) is %lld; must be >= 1", (long long)denom);
    if (beta > 0 && !kl) return core_error("grpo loss: algorithm.beta is %g but no KL values were given", (double)beta);
    for (int i = 0; i < n; i++) {
        if (!isfinite(logp_new[i]) || !isfinite(logp_old[i]))
            return core_error("grpo loss: transition %d has a non-finite log-prob (new %g, old %g)", i,
                              (double)logp_new[i], (double)logp_old[i]);
        if (!isfinite(adv[i])) return core_error("grpo loss: transition %d has a non-finite advantage", i);
        if (kl && !isfinite(kl[i])) return core_error("grpo loss: transition %d has a non-finite KL (%g)", i, (double)kl[i]);
    }
    const float fden = (float)denom; /* exact below 2^24 transitions */
    const float dkl = beta / fden;
    grpo_loss_stats acc = {0};
    for (int i = 0; i < n; i++) {
        const float ratio = expf(logp_new[i] - logp_old[i]);
        float policy, dpr;
        int clipped = grpo_ppo_term(ratio, adv[i], eps, &policy, &dpr);
        const float m = mask[i] ? 1.0f : 0.0f;
        const float k = kl ? kl[i] : 0.0f;
        const float contrib = (m * policy + beta * k) / fden;
        dlogp_out[i] = m * dpr * ratio / fden;
        if (dkl_out) dkl_out[i] = dkl;
        acc.n_transitions++;
        acc.n_clipped += clipped;
        acc.loss += contrib;
        acc.policy += (double)(m * policy) / (double)denom;
        acc.kl += (double)k / (double)denom;
        acc.abs_ratio_dev_sum += fabs((double)ratio - 1.0);
        acc.abs_logp_diff_sum += fabs((double)logp_new[i] - (double)logp_old[i]);
    }
    if (stats) grpo_loss_stats_add(stats, &acc);
    return 0;
}

/* ---- GRPO-Guard ---- */

int grpo_guard_loss_terms(int n, const float *logp_new, const float *logp_old, const float *bias,
                          const float *step_std, const float *dt, const float *adv, const uint8_t *mask,
                          const float *kl, float eps, float beta, int64_t denom, float *dlogp_out, float *dbias_out,
                          float *dkl_out, grpo_loss_stats *stats) {
    if (n < 0) return core_error("grpo_guard loss: negative transition count %d", n);
    if (!(eps > 0)) return core_error("algorithm.clip_range: must be > 0 (got %g)", (double)eps);
    if (!(beta >= 0) || isinf(beta)) return core_error("algorithm.beta: must be finite and >= 0 (got %g)", (double)beta);
    if (denom < 1) return core_error("grpo_guard loss: the loss denominator (trained transitions of the global batch) is %lld; must be >= 1", (long long)denom);
    if (beta > 0 && !kl) return core_error("grpo_guard loss: algorithm.beta is %g but no KL values were given", (double)beta);
    if (n > 0 && (!bias || !step_std || !dt))
        return core_error("grpo_guard loss: the mean bias, step std and dt of every transition are needed (got NULL)");
    for (int i = 0; i < n; i++) {
        if (!isfinite(logp_new[i]) || !isfinite(logp_old[i]))
            return core_error("grpo_guard loss: transition %d has a non-finite log-prob (new %g, old %g)", i,
                              (double)logp_new[i], (double)logp_old[i]);
        if (!isfinite(adv[i])) return core_error("grpo_guard loss: transition %d has a non-finite advantage", i);
        if (kl && !isfinite(kl[i])) return core_error("grpo_guard loss: transition %d has a non-finite KL (%g)", i, (double)kl[i]);
        if (!isfinite(bias[i]))
            return core_error("grpo_guard loss: transition %d has a non-finite mean bias (%g)", i, (double)bias[i]);
        if (!(step_std[i] > 0) || isinf(step_std[i]))
            return core_error("grpo_guard loss: transition %d has step std %g; must be finite and > 0 (an ODE step is "
                              "never trained)", i, (double)step_std[i]);
        if (!(dt[i] < 0) || isinf(dt[i]))
            return core_error("grpo_guard loss: transition %d has dt %g; must be finite and < 0", i, (double)dt[i]);
    }
    const float fden = (float)denom; /* exact below 2^24 transitions */
    const float dkl = beta / fden;
    grpo_loss_stats acc = {0};
    for (int i = 0; i < n; i++) {
        const float scale = step_std[i];
        const float lr = logp_new[i] - logp_old[i];
        const float biased = lr + bias[i];
        const float ratio = expf(biased * scale);
        const float sqrt_dt = sqrtf(-dt[i]);
        const float w = sqrt_dt * sqrt_dt;
        float policy, dpr;
        int clipped = grpo_ppo_term(ratio, adv[i], eps, &policy, &dpr);
        const float pw = policy / w;
        const float m = mask[i] ? 1.0f : 0.0f;
        const float k = kl ? kl[i] : 0.0f;
        const float contrib = (m * pw + beta * k) / fden;
        /* d ratio / d logp_new = d ratio / d bias = ratio * scale */
        const float g = m * dpr * ratio * scale / w / fden;
        dlogp_out[i] = g;
        if (dbias_out) dbias_out[i] = g;
        if (dkl_out) dkl_out[i] = dkl;
        acc.n_transitions++;
        acc.n_clipped += clipped;
        acc.loss += contrib;
        acc.policy += (double)(m * pw) / (double)denom;
        acc.kl += (double)k / (double)denom;
        acc.abs_ratio_dev_sum += fabs((double)ratio - 1.0);
        acc.abs_logp_diff_sum += fabs((double)logp_new[i] - (double)logp_old[i]);
    }
    if (stats) grpo_loss_stats_add(stats, &acc);
    return 0;
}

/* ---- Timestep selection ---- */

static const char *mode_name(grpo_sel_mode m) {
    switch (m) {
    case GRPO_SEL_ALL: return "all";
    case GRPO_SEL_FIRST_FRACTION: return "first_fraction";
    case GRPO_SEL_RANDOM_K: return "random_k";
    case GRPO_SEL_FROM_RANGE: return "from_range";
    }
    return "?";
}

/* Reads one integer token at *p (after skipping blanks, '[', ']' and ','); 0 on success. */
static int read_int(const char **p, int *out) {
    const char *s = *p;
    while (*s && (isspace((unsigned char)*s) || *s == '[' || *s == ']' || *s == ',')) s++;
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < -1000000000L || v > 1000000000L) return -1;
    *out = (int)v;
    *p = end;
    return 0;
}

static int only_trailing(const char *s) {
    while (*s && (isspace((unsigned char)*s) || *s == ']')) s++;
    return *s == 0;
}

int grpo_selection_parse(const char *text, grpo_selection *out) {
    grpo_selection sel = {0};
    const char *s = text ? text : "";
    while (isspace((unsigned char)*s)) s++;
    size_t wl = 0;
    while (s[wl] && !isspace((unsigned char)s[wl])) wl++;
    const char *p = s + wl;
    int ok = 0;
    if (wl == 3 && !strncmp(s, "all", 3)) {
        sel.mode = GRPO_SEL_ALL;
        ok = only_trailing(p);
    } else if (wl == 14 && !strncmp(s, "first_fraction", 14)) {
        sel.mode = GRPO_SEL_FIRST_FRACTION;
        char *end;
        sel.fraction = strtod(p, &end);
        ok = end != p && only_trailing(end);
    } else if (wl == 8 && !strncmp(s, "random_k", 8)) {
        sel.mode = GRPO_SEL_RANDOM_K;
        ok = read_int(&p, &sel.k) == 0 && only_trailing(p);
    } else if (wl == 10 && !strncmp(s, "from_range", 10)) {
        sel.mode = GRPO_SEL_FROM_RANGE;
        ok = read_int(&p, &sel.range_a) == 0 && read_int(&p, &sel.range_b) == 0 && read_int(&p, &sel.k) == 0 &&
             only_trailing(p);
    }
    if (!ok)
        return core_error(SEL_KEY ": cannot parse \"%s\" (expected \"all\", \"first_fraction F\", \"random_k K\" or "
                          "\"from_range [A, B] K\")", text ? text : "");
    *out = sel;
    return 0;
}

void grpo_selection_format(const grpo_selection *sel, char *buf, int cap) {
    if (cap <= 0) return;
    switch (sel->mode) {
    case GRPO_SEL_FIRST_FRACTION: snprintf(buf, cap, "first_fraction %.17g", sel->fraction); break;
    case GRPO_SEL_RANDOM_K: snprintf(buf, cap, "random_k %d", sel->k); break;
    case GRPO_SEL_FROM_RANGE: snprintf(buf, cap, "from_range [%d, %d] %d", sel->range_a, sel->range_b, sel->k); break;
    default: snprintf(buf, cap, "%s", mode_name(sel->mode)); break;
    }
}

/* int(fraction*N) in double, as Flow-GRPO computes int(num_steps * timestep_fraction) in Python. */
static int first_count(double fraction, int N) { return (int)floor(fraction * (double)N); }

int grpo_selection_validate(const grpo_selection *sel, int N) {
    if (N < 1) return core_error(SEL_KEY ": the trajectory has %d denoising steps; need >= 1", N);
    switch (sel->mode) {
    case GRPO_SEL_ALL: return 0;
    case GRPO_SEL_FIRST_FRACTION:
        if (!(sel->fraction > 0) || !(sel->fraction <= 1))
            return core_error(SEL_KEY ": first_fraction %g must be in (0, 1]", sel->fraction);
        if (first_count(sel->fraction, N) < 1)
            return core_error(SEL_KEY ": first_fraction %g of %d steps selects no step (int(%g * %d) = 0)",
                              sel->fraction, N, sel->fraction, N);
        return 0;
    case GRPO_SEL_RANDOM_K:
        if (sel->k < 1 || sel->k > N) return core_error(SEL_KEY ": random_k %d must be in [1, %d] (the number of steps)", sel->k, N);
        return 0;
    case GRPO_SEL_FROM_RANGE:
        if (sel->range_a < 0 || sel->range_b > N - 1 || sel->range_a > sel->range_b)
            return core_error(SEL_KEY ": from_range [%d, %d] must satisfy 0 <= a <= b <= %d (steps are 0..%d)",
                              sel->range_a, sel->range_b, N - 1, N - 1);
        if (sel->k < 1 || sel->k > sel->range_b - sel->range_a + 1)
            return core_error(SEL_KEY ": from_range [%d, %d] %d: k must be in [1, %d] (the size of the range)",
                              sel->range_a, sel->range_b, sel->k, sel->range_b - sel->range_a + 1);
        return 0;
    }
    return core_error(SEL_KEY ": unknown mode %d", (int)sel->mode);
}

/* Candidate steps [lo, hi) that have a log-prob, ascending, into cand; returns their number. */
static int candidates(int lo, int hi, const uint8_t *has_logp, int *cand) {
    int m = 0;
    for (int i = lo; i < hi; i++)
        if (!has_logp || has_logp[i]) cand[m++] = i;
    return m;
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/* Candidate range and k of sel (k = -1: take all candidates). */
static void sel_range(const grpo_selection *sel, int N, int *lo, int *hi, int *k) {
    *lo = 0, *hi = N, *k = -1;
    if (sel->mode == GRPO_SEL_FIRST_FRACTION) *hi = first_count(sel->fraction, N);
    else if (sel->mode == GRPO_SEL_RANDOM_K) *k = sel->k;
    else if (sel->mode == GRPO_SEL_FROM_RANGE) *lo = sel->range_a, *hi = sel->range_b + 1, *k = sel->k;
}

static int too_few(const grpo_selection *sel, int m, int k, int N) {
    char buf[96];
    grpo_selection_format(sel, buf, sizeof buf);
    if (k < 0)
        return core_error(SEL_KEY ": %s selects no step with a log-prob (of %d steps; steps with std 0, e.g. eta 0, "
                          "are never trained)", buf, N);
    return core_error(SEL_KEY ": %s needs %d steps with a log-prob but only %d of the candidates have one (steps "
                      "with std 0, e.g. eta 0, are never trained)", buf, k, m);
}

int grpo_select_steps(const grpo_selection *sel, int N, const uint8_t *has_logp, uint64_t seed, uint32_t uid,
                      int *steps_out, int *n_out) {
    if (grpo_selection_validate(sel, N)) return -1;
    int lo, hi, k;
    sel_range(sel, N, &lo, &hi, &k);
    int m = candidates(lo, hi, has_logp, steps_out);
    if (m == 0 || m < k) return too_few(sel, m, k, N);
    if (k < 0) {
        *n_out = m;
        return 0;
    }
    double *u = malloc(sizeof(double) * (size_t)k);
    if (!u) return core_error(SEL_KEY ": out of memory");
    core_philox_uniform(u, k, seed, 0, uid, CORE_STREAM_SELECTION);
    for (int j = 0; j < k; j++) { /* partial Fisher-Yates over the candidates, in place */
        int r = j + (int)floor(u[j] * (double)(m - j));
        if (r > m - 1) r = m - 1; /* u < 1 makes this unreachable; kept as a guard */
        int t = steps_out[j];
        steps_out[j] = steps_out[r];
        steps_out[r] = t;
    }
    free(u);
    qsort(steps_out, (size_t)k, sizeof(int), cmp_int);
    *n_out = k;
    return 0;
}

/* ---- Loss denominator ---- */

/* Trained transitions of one sample whose has_logp row is h (NULL: all), sel validated; error as grpo_select_steps. */
static int count_one(const grpo_selection *sel, int N, const uint8_t *h, int *c) {
    int lo, hi, k;
    sel_range(sel, N, &lo, &hi, &k);
    int m = 0;
    for (int i = lo; i < hi; i++) m += (!h || h[i]) ? 1 : 0;
    if (m == 0 || m < k) return too_few(sel, m, k, N);
    *c = k < 0 ? m : k;
    return 0;
}

int grpo_count_transitions(const grpo_selection *sel, int N, const uint8_t *has_logp, int has_logp_stride,
                           int n_samples, int64_t *count) {
    if (n_samples < 0) return core_error("grpo: negative sample count %d", n_samples);
    if (has_logp_stride != 0 && has_logp_stride != N)
        return core_error("grpo: has_logp stride must be 0 (shared row) or N = %d (got %d)", N, has_logp_stride);
    if (grpo_selection_validate(sel, N)) return -1;
    int64_t total = 0;
    for (int s = 0; s < n_samples; s++) {
        int c;
        if (count_one(sel, N, has_logp ? has_logp + (size_t)s * has_logp_stride : NULL, &c))
            return core_error_push("sample %d: ", s);
        total += c;
        if (has_logp_stride == 0 && s == 0 && n_samples > 1) { /* every sample has the same row */
            total *= n_samples;
            break;
        }
    }
    *count = total;
    return 0;
}

/* ---- Two experts ---- */

int grpo_trainable_steps(int N, const uint8_t *has_logp, const uint8_t *expert, const uint8_t *trained, int n_experts,
                         uint8_t *out) {
    if (N < 1) return core_error(SEL_KEY ": the trajectory has %d denoising steps; need >= 1", N);
    if (n_experts < 1 || n_experts > 2) return core_error("grpo: %d experts; must be 1 or 2", n_experts);
    for (int i = 0; i < N; i++) {
        const int e = expert ? expert[i] : 0;
        if (e >= n_experts)
            return core_error("grpo: step %d uses expert %d but the model has %d expert%s", i, e, n_experts,
                              n_experts > 1 ? "s" : "");
        out[i] = (!has_logp || has_logp[i]) && (!trained || trained[e]);
    }
    return 0;
}

/* Adds what a frozen expert means to a selection error. */
static int frozen_context(const uint8_t *trained, int n_experts) {
    if (trained)
        for (int e = 0; e < n_experts; e++)
            if (!trained[e])
                return core_error_push("algorithm.train_experts freezes expert %d, whose steps are never trained: ", e);
    return -1;
}

int grpo_select_steps_experts(const grpo_selection *sel, int N, const uint8_t *has_logp, const uint8_t *expert,
                              const uint8_t *trained, int n_experts, uint64_t seed, uint32_t uid, int *steps_out,
                              int *n_out) {
    if (grpo_selection_validate(sel, N)) return -1;
    uint8_t *mask = malloc((size_t)N);
    if (!mask) return core_error(SEL_KEY ": out of memory");
    int rc = grpo_trainable_steps(N, has_logp, expert, trained, n_experts, mask);
    if (!rc && (rc = grpo_select_steps(sel, N, mask, seed, uid, steps_out, n_out))) frozen_context(trained, n_experts);
    free(mask);
    return rc;
}

int grpo_count_transitions_experts(const grpo_selection *sel, int N, const uint8_t *has_logp, const uint8_t *expert,
                                   int stride, int n_samples, const uint8_t *trained, int n_experts, int64_t *count) {
    if (n_samples < 0) return core_error("grpo: negative sample count %d", n_samples);
    if (stride != 0 && stride != N)
        return core_error("grpo: has_logp/expert stride must be 0 (shared row) or N = %d (got %d)", N, stride);
    if (grpo_selection_validate(sel, N)) return -1;
    uint8_t *mask = malloc((size_t)N);
    if (!mask) return core_error(SEL_KEY ": out of memory");
    int64_t total = 0;
    int rc = 0;
    for (int s = 0; s < n_samples && !rc; s++) {
        const size_t off = (size_t)s * (size_t)stride;
        int c = 0;
        rc = grpo_trainable_steps(N, has_logp ? has_logp + off : NULL, expert ? expert + off : NULL, trained,
                                  n_experts, mask);
        if (!rc && (rc = count_one(sel, N, mask, &c))) frozen_context(trained, n_experts);
        if (rc) core_error_push("sample %d: ", s);
        total += c;
        if (!rc && stride == 0 && n_samples > 1) { /* every sample has the same rows */
            total *= n_samples;
            break;
        }
    }
    free(mask);
    if (!rc) *count = total;
    return rc;
}

void grpo_loss_stats_add(grpo_loss_stats *dst, const grpo_loss_stats *src) {
    dst->n_transitions += src->n_transitions;
    dst->n_clipped += src->n_clipped;
    dst->loss += src->loss;
    dst->policy += src->policy;
    dst->kl += src->kl;
    dst->abs_ratio_dev_sum += src->abs_ratio_dev_sum;
    dst->abs_logp_diff_sum += src->abs_logp_diff_sum;
}
