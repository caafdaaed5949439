/* trainer/step/dpo.c — online Flow-DPO's preference pairs, the shared-noise forward sample of a pair, and the
 * Diffusion-DPO loss with its gradient. See dpo.h for the contracts and the reference lines each formula follows. */
#include "trainer/step/dpo.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "core/error.h"
#include "core/philox.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

int dpo_pair_rule_parse(const char *text, dpo_pair_rule *out) {
    if (text && strcmp(text, "best_worst") == 0) {
        *out = DPO_PAIRS_BEST_WORST;
        return 0;
    }
    if (text && strcmp(text, "all") == 0) {
        *out = DPO_PAIRS_ALL;
        return 0;
    }
    return core_error("algorithm.dpo_pairs: '%s' is not a pair rule (best_worst, all)", text ? text : "(null)");
}

const char *dpo_pair_rule_name(dpo_pair_rule rule) { return rule == DPO_PAIRS_ALL ? "all" : "best_worst"; }

int dpo_max_pairs(int B, int G, dpo_pair_rule rule) {
    if (B < 1 || G < 2) return -1;
    const int64_t per = rule == DPO_PAIRS_ALL ? (int64_t)G * (G - 1) / 2 : 1;
    const int64_t n = per * B;
    return n > INT_MAX ? -1 : (int)n;
}

int dpo_select_pairs(const float *rewards, int B, int G, dpo_pair_rule rule, float margin, dpo_pair *out, int *n_out) {
    *n_out = 0;
    if (B < 1) return core_error("dpo: %d groups; must be >= 1", B);
    if (G < 2)
        return core_error("rollout.samples_per_prompt: %d; algorithm.loss dpo needs groups of at least 2 samples (a "
                          "group of one has no preference pair)", G);
    if (!(margin >= 0) || !isfinite(margin))
        return core_error("algorithm.dpo_margin: must be finite and >= 0 (got %g)", (double)margin);
    if (rule != DPO_PAIRS_BEST_WORST && rule != DPO_PAIRS_ALL) return core_error("dpo: unknown pair rule %d", (int)rule);
    if (dpo_max_pairs(B, G, rule) < 0) return core_error("dpo: %d groups of %d give too many pairs", B, G);
    for (int k = 0; k < B * G; k++)
        if (!isfinite(rewards[k])) return core_error("dpo: reward of sample %d is not finite (%g)", k, (double)rewards[k]);
    int n = 0;
    for (int b = 0; b < B; b++) {
        const float *r = rewards + (int64_t)b * G;
        const int o = b * G;
        if (rule == DPO_PAIRS_BEST_WORST) {
            int hi = 0, lo = 0;
            for (int g = 1; g < G; g++) {
                if (r[g] > r[hi]) hi = g; /* strict: the first index of a tie, as torch.argmax */
                if (r[g] < r[lo]) lo = g;
            }
            const double gap = (double)r[hi] - (double)r[lo];
            if (gap > (double)margin) out[n++] = (dpo_pair){o + hi, o + lo, (float)gap};
            continue;
        }
        for (int g = 0; g < G; g++)
            for (int h = g + 1; h < G; h++) {
                const double gap = (double)r[g] - (double)r[h];
                if (fabs(gap) <= (double)margin) continue;
                out[n++] = gap > 0 ? (dpo_pair){o + g, o + h, (float)gap} : (dpo_pair){o + h, o + g, (float)-gap};
            }
    }
    *n_out = n;
    return 0;
}

int dpo_forward_pair(const float *x0_w, const float *x0_l, int64_t nl, float t, uint64_t seed, uint32_t slot,
                     uint32_t uid_w, uint32_t uid_l, float *xt_w, float *xt_l, float *eps_out) {
    if (nl < 1) return core_error("dpo: forward sample of %lld elements; must be >= 1", (long long)nl);
    if (!(t >= 0.0f && t <= 1.0f)) return core_error("dpo: timestep (sigma) %g out of [0, 1]", (double)t);
    /* the noise goes into xt_l first, then both are mixed element by element (x0 may not alias the outputs) */
    core_philox_normal(xt_l, nl, seed ^ ((uint64_t)uid_l << 32), slot, uid_w, CORE_STREAM_DPO_NOISE);
    const float a = 1.0f - t;
    for (int64_t i = 0; i < nl; i++) {
        const float e = xt_l[i];
        if (eps_out) eps_out[i] = e;
        xt_w[i] = a * x0_w[i] + t * e;
        xt_l[i] = a * x0_l[i] + t * e;
    }
    return 0;
}

void dpo_loss_stats_add(dpo_loss_stats *dst, const dpo_loss_stats *src) {
    dst->n_terms += src->n_terms;
    dst->loss += src->loss;
    dst->margin_sum += src->margin_sum;
    dst->n_positive += src->n_positive;
    dst->err_w_sum += src->err_w_sum;
    dst->err_l_sum += src->err_l_sum;
    dst->ref_w_sum += src->ref_w_sum;
    dst->ref_l_sum += src->ref_l_sum;
}

/* softplus(x) = log(1 + e^x) and sigmoid(x) = 1 / (1 + e^-x), without overflow for any finite x. */
static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double sigmoid(double x) {
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

static int check_finite(const float *x, int64_t n, const char *name) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return core_error("dpo loss: %s[%lld] is not finite", name, (long long)i);
    return 0;
}

int dpo_loss_terms(int64_t nl, const float *eps, const float *x0_w, const float *x0_l, const float *v_w,
                   const float *v_l, const float *vr_w, const float *vr_l, float beta, int64_t denom, float *dvw_out,
                   float *dvl_out, dpo_loss_stats *stats) {
    if (nl < 1) return core_error("dpo loss: %lld latent elements; must be >= 1", (long long)nl);
    if (!(beta > 0) || !isfinite(beta)) return core_error("algorithm.dpo_beta: must be finite and > 0 (got %g)", (double)beta);
    if (denom < 1)
        return core_error("dpo loss: the loss denominator (trained terms of the global batch) is %lld; must be >= 1",
                          (long long)denom);
    if (check_finite(eps, nl, "noise") || check_finite(x0_w, nl, "preferred x0") ||
        check_finite(x0_l, nl, "rejected x0") || check_finite(v_w, nl, "preferred velocity") ||
        check_finite(v_l, nl, "rejected velocity") || check_finite(vr_w, nl, "preferred reference velocity") ||
        check_finite(vr_l, nl, "rejected reference velocity"))
        return -1;
    const double M = (double)nl, bd = beta, D = (double)denom;
    double ew = 0, el = 0, rw = 0, rl = 0;
    for (int64_t i = 0; i < nl; i++) {
        const double tw = (double)eps[i] - (double)x0_w[i], tl = (double)eps[i] - (double)x0_l[i];
        const double dw = (double)v_w[i] - tw, dl = (double)v_l[i] - tl;
        const double qw = (double)vr_w[i] - tw, ql = (double)vr_l[i] - tl;
        ew += dw * dw, el += dl * dl, rw += qw * qw, rl += ql * ql;
    }
    ew /= M, el /= M, rw /= M, rl /= M;
    const double z = -0.5 * bd * ((ew - rw) - (el - rl));
    if (dvw_out || dvl_out) {
        const double g = sigmoid(-z) * bd / M / D;
        for (int64_t i = 0; i < nl; i++) {
            const double tw = (double)eps[i] - (double)x0_w[i], tl = (double)eps[i] - (double)x0_l[i];
            if (dvw_out) dvw_out[i] = (float)(g * ((double)v_w[i] - tw));
            if (dvl_out) dvl_out[i] = (float)(-g * ((double)v_l[i] - tl));
        }
    }
    if (stats) {
        stats->n_terms += 1;
        stats->loss += softplus(-z) / D;
        stats->margin_sum += z;
        stats->n_positive += z > 0;
        stats->err_w_sum += ew, stats->err_l_sum += el, stats->ref_w_sum += rw, stats->ref_l_sum += rl;
    }
    return 0;
}
