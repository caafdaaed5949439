/* model/flow/flow.c — flow-matching schedule, SDE step with log-prob, KL and their backward (see model/flow/flow.h). */
#include "kernels/kernels.h"
#include "model/flow/flow.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "core/reduce.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- Schedule ---- */

int flow_schedule(int N, double shift, float *sigmas, float *timesteps)
{
    if (N < 1) return core_error("flow_schedule: number of steps %d must be >= 1", N);
    if (!isfinite(shift) || !(shift > 0.0)) return core_error("flow_schedule: shift %g must be finite and > 0", shift);
    if (!sigmas) return core_error("flow_schedule: sigmas is NULL");

    /* __init__: fp32 torch arithmetic on timesteps/1000 (the Python scalars become fp32 operands). The lowest
     * training timestep is 1, so sigma_min = f(1/1000) in fp32. (shift - 1) is computed in double first, as the
     * Python expression does, then used as an fp32 operand. */
    const float u = 1.0f / 1000.0f;
    const float num = (float)shift * u;
    const float den = 1.0f + (float)(shift - 1.0) * u;
    const float sigma_min = num / den;

    /* set_timesteps: numpy float64. linspace(start, stop, N): step = (stop - start) / (N - 1), y_j = j * step + start,
     * y_{N-1} = stop; N == 1 gives [start]. */
    const double start = 1.0 * 1000.0; /* sigma_max (= 1, exactly) * num_train_timesteps */
    const double stop = (double)sigma_min * 1000.0;
    const double step = N > 1 ? (stop - start) / (double)(N - 1) : 0.0;
    for (int j = 0; j < N; j++) {
        double t = (N > 1 && j == N - 1) ? stop : (double)j * step + start;
        double s = t / 1000.0;
        s = shift * s / (1.0 + (shift - 1.0) * s);
        sigmas[j] = (float)s;
        if (timesteps) timesteps[j] = sigmas[j] * 1000.0f;
    }
    sigmas[N] = 0.0f;
    return 0;
}

int flow_expert(float timestep, double boundary_ratio)
{
    const float boundary = (float)(boundary_ratio * 1000.0);
    return timestep >= boundary ? 0 : 1;
}

/* ---- One SDE step ---- */

int flow_step_init(flow_step *st, float sigma, float sigma_next, float sigma1, float eta)
{
    if (!(sigma > 0.0f && sigma <= 1.0f)) return core_error("flow step: sigma %g must be in (0, 1]", (double)sigma);
    if (!(sigma_next >= 0.0f && sigma_next < sigma))
        return core_error("flow step: sigma_next %g must be in [0, sigma = %g)", (double)sigma_next, (double)sigma);
    if (!(eta >= 0.0f) || !isfinite(eta)) return core_error("flow step: eta %g must be finite and >= 0", (double)eta);
    if (sigma == 1.0f && !(sigma1 >= 0.0f && sigma1 < 1.0f))
        return core_error("flow step: at sigma == 1, sigmas[1] = %g must be in [0, 1)", (double)sigma1);

    flow_step s;
    memset(&s, 0, sizeof s);
    s.sigma = sigma;
    s.sigma_next = sigma_next;
    s.dt = sigma_next - sigma;
    const float den = 1.0f - (sigma == 1.0f ? sigma1 : sigma);
    s.std_t = eta * sqrtf(sigma / den);
    s.step_std = s.std_t * sqrtf(-s.dt);
    const float w = s.std_t * s.std_t;
    const float two_sigma = 2.0f * sigma;
    s.coef_x = 1.0f + (w / two_sigma) * s.dt;
    s.coef_v = (1.0f + w * (1.0f - sigma) / two_sigma) * s.dt;
    const float var = s.step_std * s.step_std;
    s.has_std = s.step_std > 0.0f && isfinite(var) && var >= FLT_MIN;
    *st = s;
    return 0;
}

typedef struct {
    const float *x, *v, *eps, *given;
    float *mean_out, *x_next_out;
    float cx, cv, step_std;
    int want_sum; /* accumulate (x_next - mean)^2 */
} step_ctx;

/* Elementwise mean / x_next of [begin, end) and, when asked, the fp32 sum of (x_next - mean)^2 in index order. */
static float step_chunk(void *ctx, int64_t begin, int64_t end)
{
    const step_ctx *c = ctx;
    float acc = 0.0f;
    for (int64_t i = begin; i < end; i++) {
        const float xi = c->x[i], vi = c->v[i];
        const float px = c->cx * xi;
        const float pv = c->cv * vi;
        const float m = px + pv;
        float xn;
        if (c->eps) {
            const float noise = c->step_std * c->eps[i];
            xn = m + noise;
        } else if (c->given) {
            xn = c->given[i];
        } else {
            xn = m;
        }
        if (c->mean_out) c->mean_out[i] = m;
        if (c->x_next_out && !c->given) c->x_next_out[i] = xn;
        if (c->want_sum) {
            const float d = xn - m;
            acc += d * d;
        }
    }
    return acc;
}

int flow_sde_step(const float *x, const float *v, const float *eps, const float *x_next_given, int64_t n, float sigma,
                  float sigma_next, float sigma1, float eta, float *mean_out, float *x_next_out, flow_step *st)
{
    flow_step s;
    if (flow_step_init(&s, sigma, sigma_next, sigma1, eta)) return -1;
    if (n < 1) return core_error("flow_sde_step: element count %lld must be >= 1", (long long)n);
    if (!x || !v || !st) return core_error("flow_sde_step: x, v and st must not be NULL");
    if (eps && x_next_given) return core_error("flow_sde_step: pass eps (rollout) or x_next_given (trainer), not both");
    if (eps && !x_next_out) return core_error("flow_sde_step: eps given but x_next_out is NULL");

    step_ctx c = {.x = x,
                  .v = v,
                  .eps = s.has_std ? eps : NULL, /* eta 0: x_next = mean exactly, eps unused */
                  .given = x_next_given,
                  .mean_out = mean_out,
                  .x_next_out = x_next_out,
                  .cx = s.coef_x,
                  .cv = s.coef_v,
                  .step_std = s.step_std};
    c.want_sum = s.has_std && (eps || x_next_given);
    const float sum = core_reduce_fixed(n, step_chunk, &c);
    if (c.want_sum) {
        const float var = s.step_std * s.step_std;
        const float msq = sum / (float)n;
        s.logp = -msq / (2.0f * var) - logf(s.step_std) - FLOW_LOG_SQRT_2PI;
        s.has_logp = 1;
    }
    *st = s;
    return 0;
}

int flow_kl(const float *mean_new, const float *mean_ref, int64_t n, float step_std, float *kl_out)
{
    if (n < 1) return core_error("flow_kl: element count %lld must be >= 1", (long long)n);
    if (!mean_new || !mean_ref || !kl_out) return core_error("flow_kl: NULL argument");
    const float var = step_std * step_std;
    if (!(step_std > 0.0f) || !isfinite(var) || var < FLT_MIN)
        return core_error("flow_kl: step std %g has no KL (an ODE step, eta 0, is never trained)", (double)step_std);
    const float sum = core_sum_sq_diff_fixed(mean_new, mean_ref, n);
    const float msq = sum / (float)n;
    *kl_out = msq / (2.0f * var);
    return 0;
}

int flow_sde_backward_v(const flow_step *st, const float *mean, const float *x_next, const float *mean_ref, int64_t n,
                        float g_logp, float g_kl, float *dv)
{
    if (!st || !mean || !dv) return core_error("flow_sde_backward_v: st, mean and dv must not be NULL");
    if (n < 1) return core_error("flow_sde_backward_v: element count %lld must be >= 1", (long long)n);
    if (!st->has_std)
        return core_error("flow_sde_backward_v: step sigma %g -> %g has std 0 (never trained)", (double)st->sigma,
                          (double)st->sigma_next);
    if (!isfinite(g_logp) || !isfinite(g_kl))
        return core_error("flow_sde_backward_v: gradients dL/dlogp %g, dL/dKL %g must be finite", (double)g_logp,
                          (double)g_kl);
    const int use_logp = g_logp != 0.0f, use_kl = g_kl != 0.0f;
    if (use_logp && !x_next) return core_error("flow_sde_backward_v: dL/dlogp != 0 but x_next is NULL");
    if (use_kl && !mean_ref) return core_error("flow_sde_backward_v: dL/dKL != 0 but mean_ref is NULL");

    const float var = st->step_std * st->step_std;
    const float k = st->coef_v / (var * (float)n);
#pragma omp parallel for schedule(static) if ((size_t)n >= K_PAR_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++) {
        const float m = mean[i];
        float g = 0.0f;
        if (use_logp) {
            const float a = g_logp * (x_next[i] - m);
            g = g + a;
        }
        if (use_kl) {
            const float b = g_kl * (m - mean_ref[i]);
            g = g + b;
        }
        dv[i] = k * g;
    }
    return 0;
}
