/* tests/test_grpo_synth.c — the GRPO loss on a tiny differentiable "model", end to end through the shared flow
 * functions: the velocity is a linear map v = W x of the latent (W: 16 x 16), the rollout samples trajectories with
 * W_old (flow_sde_step with Philox noise, as docs/design.md section 4 says), the trainer recomputes log-probs and KL
 * with W and W_ref and backpropagates grpo_loss_terms' gradients through flow_sde_backward_v into dW.
 * Checks: (1) the accumulated gradient is the same (to fp32 rounding) whether the 8 samples run as 1x8, 2x4, 8x1 or
 * 3+5 micro-batches, because every micro-batch divides by the one global transition count; dividing by the
 * micro-batch's own count instead is caught; (2) the gradient equals central finite differences of a double-
 * precision reference of the loss, with the KL term alone and with the full loss. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/philox.h"
#include "model/flow/flow.h"
#include "tests/test.h"
#include "trainer/step/grpo.h"
#include "trainer/optim/optim.h"

#define SD 16        /* latent elements of one sample */
#define SN 6         /* denoising steps */
#define SB 2         /* groups (prompts) */
#define SG 4         /* samples per group */
#define SS (SB * SG) /* samples */
#define SEED 20240611ull

typedef struct {
    float sigmas[SN + 1], eta[SN];
    uint8_t has_logp[SN];
    float W[SD * SD], Wold[SD * SD], Wref[SD * SD];
    float lat[SS][SN + 1][SD]; /* the rollout trajectory (under W_old) */
    float logp_old[SS][SN];
    float adv[SS];
    uint8_t mask[SS];
    int steps[SS][SN], nsteps[SS];
    int64_t denom;
    float eps, beta;
} synth;

static void matvec_f(const float *W, const float *x, float *y) {
    for (int d = 0; d < SD; d++) {
        float s = 0;
        for (int e = 0; e < SD; e++) s += W[d * SD + e] * x[e];
        y[d] = s;
    }
}

/* Builds the data: schedule, rollout under W_old, advantages (group 1 has equal rewards: masked), selection. */
static void synth_build(synth *z, const char *selection, float delta) {
    memset(z, 0, sizeof *z);
    REQUIRE_OK(flow_schedule(SN, 3.0, z->sigmas, NULL));
    for (int i = 0; i < SN; i++) {
        z->eta[i] = i == SN - 1 ? 0.0f : 0.8f; /* the last step is an ODE step: no log-prob, never trained */
        z->has_logp[i] = z->eta[i] > 0;
    }
    test_fill_uniform(z->Wold, SD * SD, 11, -0.3f, 0.3f);
    float dw[SD * SD], dr[SD * SD];
    test_fill_uniform(dw, SD * SD, 12, -delta, delta);
    test_fill_uniform(dr, SD * SD, 13, -delta, delta);
    for (int i = 0; i < SD * SD; i++) z->W[i] = z->Wold[i] + dw[i], z->Wref[i] = z->Wold[i] + dr[i];
    for (int s = 0; s < SS; s++) {
        core_philox_normal(z->lat[s][0], SD, SEED, 0, (uint32_t)s, CORE_STREAM_ROLLOUT_NOISE);
        for (int i = 0; i < SN; i++) {
            float v[SD], noise[SD];
            flow_step st;
            matvec_f(z->Wold, z->lat[s][i], v);
            core_philox_normal(noise, SD, SEED, (uint32_t)i + 1, (uint32_t)s, CORE_STREAM_ROLLOUT_NOISE);
            REQUIRE_OK(flow_sde_step(z->lat[s][i], v, z->eta[i] > 0 ? noise : NULL, NULL, SD, z->sigmas[i],
                                     z->sigmas[i + 1], z->sigmas[1], z->eta[i], NULL, z->lat[s][i + 1], &st));
            REQUIRE((st.has_logp != 0) == (z->has_logp[i] != 0));
            z->logp_old[s][i] = st.logp;
        }
    }
    const float rewards[SS] = {0.1f, 0.7f, 0.4f, 0.9f, 0.5f, 0.5f, 0.5f, 0.5f};
    REQUIRE_OK(grpo_advantages(rewards, SB, SG, GRPO_STD_GROUP, 5.0f, z->adv, z->mask, NULL));
    grpo_selection sel;
    REQUIRE_OK(grpo_selection_parse(selection, &sel));
    for (int s = 0; s < SS; s++)
        REQUIRE_OK(grpo_select_steps(&sel, SN, z->has_logp, SEED, (uint32_t)s, z->steps[s], &z->nsteps[s]));
    REQUIRE_OK(grpo_count_transitions(&sel, SN, z->has_logp, 0, SS, &z->denom));
    z->eps = 0.01f;
    z->beta = 0.5f;
}

/* The trainer's work for samples [s0, s1): forward (fp32, flow functions), grpo_loss_terms with denominator denom,
 * backward into grad[SD*SD] (accumulated). */
static void synth_microbatch(const synth *z, int s0, int s1, int64_t denom, float *grad, grpo_loss_stats *stats) {
    enum { MAXT = SS * SN };
    static float mean[MAXT][SD], mref[MAXT][SD];
    float lnew[MAXT] = {0}, lold[MAXT] = {0}, adv[MAXT] = {0}, kl[MAXT] = {0}, dl[MAXT], dk[MAXT];
    uint8_t mask[MAXT] = {0};
    flow_step fs[MAXT];
    int ts[MAXT], ti[MAXT], n = 0;
    for (int s = s0; s < s1; s++)
        for (int j = 0; j < z->nsteps[s]; j++, n++) {
            const int i = z->steps[s][j];
            float v[SD], vr[SD];
            flow_step fr;
            matvec_f(z->W, z->lat[s][i], v);
            matvec_f(z->Wref, z->lat[s][i], vr);
            const float sg = z->sigmas[i], sn = z->sigmas[i + 1];
            REQUIRE_OK(flow_sde_step(z->lat[s][i], v, NULL, z->lat[s][i + 1], SD, sg, sn, z->sigmas[1], z->eta[i],
                                     mean[n], NULL, &fs[n]));
            REQUIRE_OK(flow_sde_step(z->lat[s][i], vr, NULL, NULL, SD, sg, sn, z->sigmas[1], z->eta[i], mref[n],
                                     NULL, &fr));
            REQUIRE_OK(flow_kl(mean[n], mref[n], SD, fs[n].step_std, &kl[n]));
            lnew[n] = fs[n].logp, lold[n] = z->logp_old[s][i], adv[n] = z->adv[s], mask[n] = z->mask[s];
            ts[n] = s, ti[n] = i;
        }
    REQUIRE_OK(grpo_loss_terms(n, lnew, lold, adv, mask, kl, z->eps, z->beta, denom, dl, dk, stats));
    for (int t = 0; t < n; t++) {
        float dv[SD];
        REQUIRE_OK(flow_sde_backward_v(&fs[t], mean[t], z->lat[ts[t]][ti[t] + 1], mref[t], SD, dl[t], dk[t], dv));
        const float *x = z->lat[ts[t]][ti[t]];
        for (int d = 0; d < SD; d++)
            for (int e = 0; e < SD; e++) grad[d * SD + e] += dv[d] * x[e];
    }
}

/* Runs the batch as consecutive micro-batches of the given sizes: each micro-batch's gradient is formed in its own
 * buffer (as a backward pass would) and accumulated into grad. own_denom: divide each micro-batch by its own
 * transition count and average over micro-batches (the mistake the global denominator avoids). */
static void synth_run(const synth *z, const int *sizes, int nmb, int own_denom, float *grad, grpo_loss_stats *st) {
    float mb[SD * SD];
    optim_zero(grad, SD * SD);
    int s0 = 0;
    for (int b = 0; b < nmb; b++) {
        int64_t den = z->denom;
        if (own_denom) {
            den = 0;
            for (int s = s0; s < s0 + sizes[b]; s++) den += z->nsteps[s];
            den *= nmb;
        }
        optim_zero(mb, SD * SD);
        synth_microbatch(z, s0, s0 + sizes[b], den, mb, st);
        optim_accumulate(grad, mb, SD * SD);
        s0 += sizes[b];
    }
    REQUIRE(s0 == SS);
}

/* Double-precision reference of the loss (and, if grad != NULL, its analytic gradient), written from docs/design.md
 * section 4 independently of grpo.c / flow.c arithmetic (only the step's scalars come from flow_step_init).
 * *margin = the smallest |ratio - (1 +- eps)| seen (finite differences need it well above the step's effect). */
static double synth_ref(const synth *z, const double *W, double *grad, double *margin) {
    double L = 0, mg = 1e30;
    const double lo = 1.0f - z->eps, hi = 1.0f + z->eps;
    if (grad) memset(grad, 0, sizeof(double) * SD * SD);
    for (int s = 0; s < SS; s++)
        for (int j = 0; j < z->nsteps[s]; j++) {
            const int i = z->steps[s][j];
            const float *x = z->lat[s][i], *xn = z->lat[s][i + 1];
            flow_step fs;
            REQUIRE_OK(flow_step_init(&fs, z->sigmas[i], z->sigmas[i + 1], z->sigmas[1], z->eta[i]));
            const double cx = fs.coef_x, cv = fs.coef_v, ss = fs.step_std, s2 = ss * ss;
            double mean[SD], mr[SD], S = 0, K = 0;
            for (int d = 0; d < SD; d++) {
                double v = 0, vr = 0;
                for (int e = 0; e < SD; e++) v += W[d * SD + e] * x[e], vr += (double)z->Wref[d * SD + e] * x[e];
                mean[d] = cx * x[d] + cv * v;
                mr[d] = cx * x[d] + cv * vr;
                S += (xn[d] - mean[d]) * (xn[d] - mean[d]);
                K += (mean[d] - mr[d]) * (mean[d] - mr[d]);
            }
            const double logp = -S / SD / (2 * s2) - log(ss) - 0.5 * log(2 * M_PI);
            const double kl = K / SD / (2 * s2);
            const double r = exp(logp - z->logp_old[s][i]), A = z->adv[s], m = z->mask[s];
            const double policy = fmax(-A * r, -A * fmin(fmax(r, lo), hi));
            L += (m * policy + z->beta * kl) / (double)z->denom;
            mg = fmin(mg, fmin(fabs(r - lo), fabs(r - hi)));
            if (!grad) continue;
            const int clipped = (A > 0 && r > hi) || (A < 0 && r < lo);
            const double gl = m * (clipped ? 0.0 : -A * r) / (double)z->denom, gk = z->beta / (double)z->denom;
            for (int d = 0; d < SD; d++) {
                const double dmean = gl * (xn[d] - mean[d]) / (s2 * SD) + gk * (mean[d] - mr[d]) / (s2 * SD);
                for (int e = 0; e < SD; e++) grad[d * SD + e] += cv * dmean * x[e];
            }
        }
    if (margin) *margin = mg;
    return L;
}

static double rel_l2(const float *a, const double *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / den);
}

/* The same gradient, to fp32 rounding, for every micro-batch split. Bound: relative L2 2e-6 between splits and to
 * the double reference (each element sums at most 40 transitions' fp32 products, epsilon 6e-8; observed ~1.5e-7). */
TEST(grpo_microbatch_split_invariance) {
    static synth z;
    const char *sels[] = {"random_k 3", "all", "from_range [1, 4] 2", "first_fraction 0.7"};
    const int split[4][8] = {{8}, {4, 4}, {1, 1, 1, 1, 1, 1, 1, 1}, {3, 5}};
    const int nsplit[4] = {1, 2, 8, 2};
    for (int k = 0; k < 4; k++) {
        synth_build(&z, sels[k], 0.03f);
        float g[4][SD * SD], gbad[SD * SD];
        double gref[SD * SD], margin;
        grpo_loss_stats st[4];
        for (int p = 0; p < 4; p++) {
            memset(&st[p], 0, sizeof st[p]);
            synth_run(&z, split[p], nsplit[p], 0, g[p], &st[p]);
        }
        double Wd[SD * SD];
        for (int i = 0; i < SD * SD; i++) Wd[i] = z.W[i];
        const double Lref = synth_ref(&z, Wd, gref, &margin);
        /* the data exercise clipping, masked samples and the KL term */
        CHECK(st[0].n_clipped > 0 && st[0].n_clipped < st[0].n_transitions);
        REQUIRE(st[0].n_transitions == z.denom && st[0].kl > 0);
        for (int p = 0; p < 4; p++) {
            double d = 0, n0 = 0;
            for (int i = 0; i < SD * SD; i++) d += (g[p][i] - g[0][i]) * (g[p][i] - g[0][i]), n0 += g[0][i] * g[0][i];
            CHECK_MSG(sqrt(d / n0) <= 2e-6, "%s split %d: relative L2 %.3g to 1x8", sels[k], p, sqrt(d / n0));
            CHECK_MSG(rel_l2(g[p], gref, SD * SD) <= 2e-6, "%s split %d: relative L2 %.3g to double reference",
                      sels[k], p, rel_l2(g[p], gref, SD * SD));
            CHECK(st[p].n_transitions == z.denom && st[p].n_clipped == st[0].n_clipped);
            CHECK_NEAR(st[p].loss, Lref, 1e-6 * fabs(Lref) + 1e-7);
        }
        /* per-micro-batch denominators would change the 3+5 gradient far beyond rounding */
        grpo_loss_stats sb = {0};
        synth_run(&z, split[3], nsplit[3], 1, gbad, &sb);
        CHECK_MSG(rel_l2(gbad, gref, SD * SD) > 1e-2, "%s: own-denominator gradient differs only %.3g", sels[k],
                  rel_l2(gbad, gref, SD * SD));
    }
}

/* Central differences of the double reference loss (h = 1e-5 on each of the 256 weights) against the fp32
 * gradient: KL alone (every mask 0, so no policy term) and the full loss (policy with clipping + beta KL).
 * Bound: relative L2 1e-5 (observed ~1e-6 for KL alone, whose smaller gradient makes FD rounding relatively larger). */
TEST(grpo_kl_gradient_finite_difference) {
    static synth z;
    for (int full = 0; full < 2; full++) {
        synth_build(&z, "random_k 4", 0.03f);
        if (!full) memset(z.mask, 0, sizeof z.mask), z.beta = 1.0f;
        float g[SD * SD];
        const int one[1] = {SS};
        grpo_loss_stats st = {0};
        synth_run(&z, one, 1, 0, g, &st);
        if (!full) CHECK(st.policy == 0.0 && st.kl > 0);
        double W[SD * SD], fd[SD * SD], margin;
        for (int i = 0; i < SD * SD; i++) W[i] = z.W[i];
        synth_ref(&z, W, NULL, &margin);
        REQUIRE(margin > 1e-4); /* the FD step moves ratios by ~1e-6: no transition crosses a clip bound */
        const double h = 1e-5;
        for (int i = 0; i < SD * SD; i++) {
            const double w = W[i];
            W[i] = w + h;
            double lp = synth_ref(&z, W, NULL, NULL);
            W[i] = w - h;
            double lm = synth_ref(&z, W, NULL, NULL);
            W[i] = w;
            fd[i] = (lp - lm) / (2 * h);
        }
        double e = rel_l2(g, fd, SD * SD);
        CHECK_MSG(e <= 1e-5, "%s: fp32 gradient vs finite differences: relative L2 %.3g", full ? "full loss" : "KL",
                  e);
    }
}
