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
    s.kind = flow_kind_default();
    *st = s;
    return 0;
}

/* The cps step's scalars (flow.h, FLOW_CPS): s = sigma_next sin(eta pi / 2), c = sqrt(sigma_next^2 - s^2). */
static int cps_step_init(flow_step *st, float sigma, float sigma_next, float eta)
{
    if (!(sigma > 0.0f && sigma <= 1.0f)) return core_error("flow step: sigma %g must be in (0, 1]", (double)sigma);
    if (!(sigma_next >= 0.0f && sigma_next < sigma))
        return core_error("flow step: sigma_next %g must be in [0, sigma = %g)", (double)sigma_next, (double)sigma);
    if (!(eta >= 0.0f) || !isfinite(eta)) return core_error("flow step: eta %g must be finite and >= 0", (double)eta);
    if (eta > 1.0f) return core_error("rollout.eta: cps needs eta in [0, 1] (got %g)", (double)eta);

    flow_step s;
    memset(&s, 0, sizeof s);
    s.sigma = sigma;
    s.sigma_next = sigma_next;
    s.dt = sigma_next - sigma;
    /* The reference's math.sin(noise_level * math.pi / 2) in double; (eta pi) / 2 == eta (pi / 2) exactly. */
    const float sin_eta = (float)sin((double)eta * (M_PI / 2.0));
    const float sd = sigma_next * sin_eta;
    const float sn2 = sigma_next * sigma_next;
    const float sd2 = sd * sd;
    const float c2 = sn2 - sd2; /* >= 0: sd <= sigma_next since sin_eta <= 1 */
    const float c = sqrtf(c2 > 0.0f ? c2 : 0.0f);
    s.std_t = sd;
    s.step_std = sd;
    const float one_m_next = 1.0f - sigma_next;
    s.coef_x = one_m_next + c;
    const float cv1 = c * (1.0f - sigma);
    const float cv2 = sigma * one_m_next;
    s.coef_v = cv1 - cv2;
    const float var = sd * sd;
    s.has_std = sd > 0.0f && isfinite(var) && var >= FLT_MIN;
    *st = s;
    return 0;
}

int flow_step_init_kind(flow_step *st, flow_kind k, float sigma, float sigma_next, float sigma1, float eta)
{
    if (k.type != FLOW_SDE && k.type != FLOW_CPS)
        return core_error("rollout.sde_type: unknown step type %d (sde or cps)", (int)k.type);
    if (k.logp != FLOW_LOGP_EXACT && k.logp != FLOW_LOGP_FLOW_GRPO)
        return core_error("algorithm.cps_logprob: unknown log-prob mode %d (exact or flow_grpo)", (int)k.logp);
    if (k.logp == FLOW_LOGP_FLOW_GRPO && k.type != FLOW_CPS)
        return core_error("algorithm.cps_logprob: flow_grpo is defined for rollout.sde_type cps only");
    flow_step s;
    if (k.type == FLOW_SDE) {
        if (flow_step_init(&s, sigma, sigma_next, sigma1, eta)) return -1;
    } else {
        if (cps_step_init(&s, sigma, sigma_next, eta)) return -1;
    }
    s.kind = k;
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

int flow_sde_step_kind(flow_kind k, const float *x, const float *v, const float *eps, const float *x_next_given,
                       int64_t n, float sigma, float sigma_next, float sigma1, float eta, float *mean_out,
                       float *x_next_out, flow_step *st)
{
    flow_step s;
    if (flow_step_init_kind(&s, k, sigma, sigma_next, sigma1, eta)) return -1;
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
        const float msq = sum / (float)n;
        if (s.kind.logp == FLOW_LOGP_FLOW_GRPO) {
            s.logp = -msq;
        } else {
            const float var = s.step_std * s.step_std;
            s.logp = -msq / (2.0f * var) - logf(s.step_std) - FLOW_LOG_SQRT_2PI;
        }
        s.has_logp = 1;
    }
    *st = s;
    return 0;
}

int flow_sde_step(const float *x, const float *v, const float *eps, const float *x_next_given, int64_t n, float sigma,
                  float sigma_next, float sigma1, float eta, float *mean_out, float *x_next_out, flow_step *st)
{
    return flow_sde_step_kind(flow_kind_default(), x, v, eps, x_next_given, n, sigma, sigma_next, sigma1, eta,
                              mean_out, x_next_out, st);
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

/* The backward of flow_sde_backward_v and flow_sde_backward_v_guard; `name` heads the error messages. */
static int backward_v(const char *name, const flow_step *st, const float *mean, const float *x_next,
                      const float *mean_ref, const float *mean_old, int64_t n, float g_logp, float g_kl, float g_bias,
                      float *dv)
{
    if (!st || !mean || !dv) return core_error("%s: st, mean and dv must not be NULL", name);
    if (n < 1) return core_error("%s: element count %lld must be >= 1", name, (long long)n);
    if (!st->has_std)
        return core_error("%s: step sigma %g -> %g has std 0 (never trained)", name, (double)st->sigma,
                          (double)st->sigma_next);
    if (!isfinite(g_logp) || !isfinite(g_kl) || !isfinite(g_bias))
        return core_error("%s: gradients dL/dlogp %g, dL/dKL %g, dL/dbias %g must be finite", name, (double)g_logp,
                          (double)g_kl, (double)g_bias);
    const int use_logp = g_logp != 0.0f, use_kl = g_kl != 0.0f, use_bias = g_bias != 0.0f;
    if (use_logp && !x_next) return core_error("%s: dL/dlogp != 0 but x_next is NULL", name);
    if (use_kl && !mean_ref) return core_error("%s: dL/dKL != 0 but mean_ref is NULL", name);
    if (use_bias && !mean_old) return core_error("%s: dL/dbias != 0 but mean_old is NULL", name);

    const float var = st->step_std * st->step_std;
    const float k = st->coef_v / (var * (float)n);
    /* Flow-GRPO's cps log-prob -(S / n) has d / d mean_i = 2 (x_next_i - mean_i) / n = k' (2 var) (x_next_i - mean_i)
     * with k' = 1 / (var n): folded into the logp weight so that one factor k serves every term. */
    const float gl = st->kind.logp == FLOW_LOGP_FLOW_GRPO ? g_logp * (2.0f * var) : g_logp;
#pragma omp parallel for schedule(static) if ((size_t)n >= K_PAR_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++) {
        const float m = mean[i];
        float g = 0.0f;
        if (use_logp) {
            const float a = gl * (x_next[i] - m);
            g = g + a;
        }
        if (use_kl) {
            const float b = g_kl * (m - mean_ref[i]);
            g = g + b;
        }
        if (use_bias) {
            const float c = g_bias * (m - mean_old[i]);
            g = g + c;
        }
        dv[i] = k * g;
    }
    return 0;
}

int flow_sde_backward_v(const flow_step *st, const float *mean, const float *x_next, const float *mean_ref, int64_t n,
                        float g_logp, float g_kl, float *dv)
{
    return backward_v("flow_sde_backward_v", st, mean, x_next, mean_ref, NULL, n, g_logp, g_kl, 0.0f, dv);
}

int flow_sde_backward_v_guard(const flow_step *st, const float *mean, const float *x_next, const float *mean_ref,
                              const float *mean_old, int64_t n, float g_logp, float g_kl, float g_bias, float *dv)
{
    return backward_v("flow_sde_backward_v_guard", st, mean, x_next, mean_ref, mean_old, n, g_logp, g_kl, g_bias, dv);
}
