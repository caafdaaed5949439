/* trainer/step/nft.c — DiffusionNFT's optimality probability, forward-process sample, loss with its gradient and the
 * old policy's soft update. See nft.h for the contracts and the reference lines each formula follows. */
#include "trainer/step/nft.h"

#include <math.h>
#include <stddef.h>

#include "core/error.h"
#include "core/philox.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

int nft_optimality(const float *adv, int n, float adv_clip_max, float *r_out) {
    if (n < 0) return core_error("nft: negative sample count %d", n);
    if (!(adv_clip_max > 0) || !isfinite(adv_clip_max))
        return core_error("algorithm.adv_clip_max: must be finite and > 0 for nft (got %g)", (double)adv_clip_max);
    const double c = adv_clip_max;
    for (int i = 0; i < n; i++) {
        if (!isfinite(adv[i])) return core_error("nft: advantage of sample %d is not finite (%g)", i, (double)adv[i]);
        double a = adv[i];
        if (a > c) a = c;
        if (a < -c) a = -c;
        double r = a / c / 2.0 + 0.5;
        if (r < 0) r = 0;
        if (r > 1) r = 1;
        r_out[i] = (float)r;
    }
    return 0;
}

int nft_forward_sample(const float *x0, int64_t nl, float t, uint64_t seed, uint32_t slot, uint32_t uid,
                       float *xt_out, float *eps_out) {
    if (nl < 1) return core_error("nft: forward sample of %lld elements; must be >= 1", (long long)nl);
    if (!(t >= 0.0f && t <= 1.0f)) return core_error("nft: timestep (sigma) %g out of [0, 1]", (double)t);
    /* the noise goes straight into xt_out, then is mixed in place (x0 may not alias xt_out) */
    core_philox_normal(xt_out, nl, seed, slot, uid, CORE_STREAM_NFT_NOISE);
    const float a = 1.0f - t;
    for (int64_t i = 0; i < nl; i++) {
        const float e = xt_out[i];
        if (eps_out) eps_out[i] = e;
        xt_out[i] = a * x0[i] + t * e;
    }
    return 0;
}

void nft_loss_stats_add(nft_loss_stats *dst, const nft_loss_stats *src) {
    dst->n_transitions += src->n_transitions;
    dst->loss += src->loss;
    dst->policy += src->policy;
    dst->kl += src->kl;
    dst->positive_sum += src->positive_sum;
    dst->negative_sum += src->negative_sum;
    dst->r_sum += src->r_sum;
    dst->old_deviate_sum += src->old_deviate_sum;
}

/* x0-prediction errors of the positive and negative policies at element i, in double. */
static void nft_errors(double t, double beta, double xt, double x0, double v, double vo, double *ep, double *en) {
    const double vp = beta * v + (1.0 - beta) * vo;
    const double vn = (1.0 + beta) * vo - beta * v;
    *ep = xt - t * vp - x0;
    *en = xt - t * vn - x0;
}

int nft_loss_terms(int64_t nl, float t, const float *x0, const float *xt, const float *v, const float *v_old,
                   const float *v_ref, float r, float beta, float adv_clip_max, float kl_beta, int64_t denom,
                   float *dv_out, nft_loss_stats *stats) {
    if (nl < 1) return core_error("nft loss: %lld latent elements; must be >= 1", (long long)nl);
    if (!(t >= 0.0f && t <= 1.0f)) return core_error("nft loss: timestep (sigma) %g out of [0, 1]", (double)t);
    if (!(r >= 0.0f && r <= 1.0f)) return core_error("nft loss: optimality probability %g out of [0, 1]", (double)r);
    if (!(beta > 0) || !isfinite(beta)) return core_error("algorithm.nft_beta: must be finite and > 0 (got %g)", (double)beta);
    if (!(adv_clip_max > 0) || !isfinite(adv_clip_max))
        return core_error("algorithm.adv_clip_max: must be finite and > 0 for nft (got %g)", (double)adv_clip_max);
    if (!(kl_beta >= 0) || !isfinite(kl_beta)) return core_error("algorithm.beta: must be finite and >= 0 (got %g)", (double)kl_beta);
    if (kl_beta > 0 && !v_ref) return core_error("nft loss: algorithm.beta is %g but no reference velocity was given", (double)kl_beta);
    if (denom < 1) return core_error("nft loss: the loss denominator (trained transitions of the global batch) is %lld; must be >= 1", (long long)denom);
    for (int64_t i = 0; i < nl; i++) {
        if (!isfinite(x0[i])) return core_error("nft loss: x0[%lld] is not finite", (long long)i);
        if (!isfinite(xt[i])) return core_error("nft loss: xt[%lld] is not finite", (long long)i);
        if (!isfinite(v[i])) return core_error("nft loss: velocity[%lld] is not finite", (long long)i);
        if (!isfinite(v_old[i])) return core_error("nft loss: old policy velocity[%lld] is not finite", (long long)i);
        if (v_ref && !isfinite(v_ref[i])) return core_error("nft loss: reference velocity[%lld] is not finite", (long long)i);
    }
    const double td = t, bd = beta, M = (double)nl, c = adv_clip_max, rd = r, D = (double)denom;

    /* pass 1: the adaptive weights (mean absolute x0 error, floored at 1e-5) */
    double sp = 0, sn = 0;
    for (int64_t i = 0; i < nl; i++) {
        double ep, en;
        nft_errors(td, bd, xt[i], x0[i], v[i], v_old[i], &ep, &en);
        sp += fabs(ep);
        sn += fabs(en);
    }
    double wp = sp / M, wn = sn / M;
    if (wp < 1e-5) wp = 1e-5;
    if (wn < 1e-5) wn = 1e-5;

    /* pass 2: the losses and the gradient */
    double lp = 0, ln = 0, kl = 0, dev = 0;
    const double gp = -2.0 * c * td * rd / M / wp, gn = 2.0 * c * td * (1.0 - rd) / M / wn, gk = 2.0 * (double)kl_beta / M;
    for (int64_t i = 0; i < nl; i++) {
        double ep, en;
        nft_errors(td, bd, xt[i], x0[i], v[i], v_old[i], &ep, &en);
        lp += ep * ep;
        ln += en * en;
        const double dvo = (double)v[i] - (double)v_old[i];
        dev += dvo * dvo;
        double g = gp * ep + gn * en;
        if (v_ref) {
            const double dk = (double)v[i] - (double)v_ref[i];
            kl += dk * dk;
            g += gk * dk;
        }
        if (dv_out) dv_out[i] = (float)(g / D);
    }
    lp = lp / M / wp;
    ln = ln / M / wn;
    kl /= M;
    const double policy = c * (rd * lp + (1.0 - rd) * ln) / bd;
    if (stats) {
        stats->n_transitions += 1;
        stats->policy += policy / D;
        stats->kl += kl / D;
        stats->loss += (policy + (double)kl_beta * kl) / D;
        stats->positive_sum += lp;
        stats->negative_sum += ln;
        stats->r_sum += rd;
        stats->old_deviate_sum += dev / M;
    }
    return 0;
}

double nft_old_decay(int64_t step, int64_t flat, double rate, double max) {
    if (step < flat) return 0.0;
    const double d = (double)(step - flat) * rate;
    return d < max ? d : max;
}

void nft_soft_update(float *old, const float *cur, int64_t n, float decay) {
    const float keep = 1.0f - decay;
    for (int64_t i = 0; i < n; i++) old[i] = old[i] * decay + cur[i] * keep;
}
