/* model/flow/flow.h — flow-matching arithmetic shared by rollout and trainer: the sigma schedule, the SDE step with its
 * log-prob (Flow-GRPO's "sde" form, or its coefficients-preserving "cps" form), the KL to a reference mean, and the
 * backward of both with respect to the velocity (with GRPO-Guard's mean-bias term). docs/design.md section 4 is the
 * contract; this file is its one implementation.
 *
 * Conventions: sigma is the noise level in [0, 1] (x_sigma = (1 - sigma) x0 + sigma noise), timestep = 1000 sigma.
 * The model predicts the velocity v ~ noise - x0. A step goes from sigma = sigmas[i] to sigma_next = sigmas[i+1],
 * dt = sigma_next - sigma < 0. Latents are fp32, flattened to n elements (one sample's [C, F, H, W]).
 *
 * Arithmetic: everything fp32, in the order written in each comment, without fused multiply-add (GCC's ISO C mode
 * does not contract; clang is told so by pragma). The mean over elements of the log-prob and of the KL is a fixed-
 * order sum (core/reduce.h), so results are bitwise the same for any thread count, in rollout and trainer alike.
 * The only transcendental calls are sqrtf (exact), logf (glibc; a GPU port must match or widen tolerance) and, once
 * per cps step, the double sin of its scalars.
 *
 * Sources: diffusers 0.42.1 schedulers/scheduling_flow_match_euler_discrete.py (FlowMatchEulerDiscreteScheduler);
 * Flow-GRPO flow_grpo/diffusers_patch/sd3_sde_with_logprob.py (sde_step_with_logprob); the cps step as in verl-omni
 * verl_omni/pipelines/schedulers/flow_match_sde.py (sde_type "cps"). */
#ifndef MODEL_FLOW_H
#define MODEL_FLOW_H

#include <stdint.h>

/* log(sqrt(2 pi)), rounded to fp32. */
#define FLOW_LOG_SQRT_2PI 0.918938533204672742f

/* ---- Schedule ---- */

/* The sigma schedule of diffusers' FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift,
 * use_dynamic_shifting=False).set_timesteps(N), reproduced operation by operation in the precision diffusers uses:
 *   init (torch, fp32):    u = 1.0f / 1000.0f;  sigma_min = (float)shift * u / (1.0f + (float)(shift - 1) * u)
 *   set_timesteps (numpy, float64): t_j = linspace(1000, 1000 * (double)sigma_min, N)  (j * step + 1000, the last
 *                          exactly 1000 * sigma_min);  s_j = t_j / 1000;  s_j = shift * s_j / (1 + (shift - 1) * s_j)
 *   then rounded to fp32:  sigmas[j] = (float)s_j, j < N;  sigmas[N] = 0;  timesteps[j] = sigmas[j] * 1000.0f (fp32).
 * So the low end is shifted twice, as docs/design.md section 4 says: sigmas = f(linspace(1, f(1/1000), N)).
 * Bitwise equal to diffusers for every (N, shift) of tests/fixtures/flow_schedule.safetensors.
 * (Wan's own default scheduler, UniPC with flow sigmas, has a different schedule; vgrpo uses this one.)
 *   N >= 1 steps; shift > 0 and finite; sigmas [N+1] fp32 (sigmas[0] == 1, strictly decreasing to 0);
 *   timesteps [N] fp32 (may be NULL). Errors (-1): N < 1, shift not finite or <= 0. */
int flow_schedule(int N, double shift, float *sigmas, float *timesteps);

/* The expert of a step for Wan 2.2 A14B: 0 (`transformer`, high noise) when timestep >= boundary_ratio * 1000,
 * else 1 (`transformer_2`). The boundary is (float)(boundary_ratio * 1000.0) and the comparison fp32, as diffusers'
 * WanPipeline compares its fp32 timestep tensor with the Python float. A single-expert model uses expert 0. */
int flow_expert(float timestep, double boundary_ratio);

/* ---- Step kinds (rollout.sde_type, algorithm.cps_logprob) ----
 *
 * FLOW_SDE: Flow-GRPO's "sde" step (flow_step_init, flow_sde_step below; the default: every function without _kind
 * is this kind with the exact log-prob, bit for bit as before).
 * FLOW_CPS: Flow-GRPO's coefficients-preserving step (sd3_sde_with_logprob.py, sde_type="cps"; Wang & Yu 2025,
 * arXiv 2509.05952): with s = sigma_next * (float)sin((double)eta * (pi / 2)) (the sine in double, as the reference's
 * math.sin of a Python float; the product in fp32),
 *   x0 = x - sigma v,  x1 = x + (1 - sigma) v,  c = sqrtf(sigma_next^2 - s^2),  mean = (1 - sigma_next) x0 + c x1,
 *   x_next = mean + s eps.
 * The mean is linear in x and v, so it is formed as mean = coef_x x + coef_v v with (fp32, in this order)
 *   coef_x = (1 - sigma_next) + c,  coef_v = c * (1 - sigma) - sigma * (1 - sigma_next)
 * (the same value as the reference's per-element x0/x1 form up to fp32 rounding; d mean / d v = coef_v exactly).
 * std_t = step_std = s (the KL of a cps step uses std s, as Flow-GRPO's). At sigma_next == 0 (the last step) s = 0:
 * an ODE step (x - sigma v) without log-prob, never trained.
 * Log-prob of a step (flow_logp_mode):
 *   FLOW_LOGP_EXACT     the Gaussian log-density averaged over elements (flow_sde_step's formula; default);
 *   FLOW_LOGP_FLOW_GRPO Flow-GRPO's cps "log-prob": logp = -(S / n), S = sum_fixed (x_next - mean)^2: the exact one
 *                       without its constants and without the 1/(2 s^2) factor, so ratios exp(logp_new - logp_old)
 *                       differ from the exact ones (clip ranges tuned on Flow-GRPO cps carry over only with it).
 *                       Allowed with FLOW_CPS only (flow_step_init_kind refuses it with FLOW_SDE). */
typedef enum { FLOW_SDE = 0, FLOW_CPS = 1 } flow_sde_type;
typedef enum { FLOW_LOGP_EXACT = 0, FLOW_LOGP_FLOW_GRPO = 1 } flow_logp_mode;

typedef struct {
    flow_sde_type type;
    flow_logp_mode logp;
} flow_kind;

/* The default kind: {FLOW_SDE, FLOW_LOGP_EXACT}. */
static inline flow_kind flow_kind_default(void) {
    flow_kind k = {FLOW_SDE, FLOW_LOGP_EXACT};
    return k;
}

/* ---- One SDE step ---- */

/* The scalars of one step and the log-prob flow_sde_step evaluated. */
typedef struct {
    float sigma, sigma_next;
    float dt;       /* sigma_next - sigma (negative) */
    float std_t;    /* eta * sqrtf(sigma / (1 - sigma)); at sigma == 1 the denominator is 1 - sigma1 (cps: s) */
    float step_std; /* std_t * sqrtf(-dt): the std of x_next given the mean (cps: s) */
    float coef_x;   /* 1 + std_t^2 / (2 sigma) * dt            : mean = coef_x * x + coef_v * v (cps: see above) */
    float coef_v;   /* (1 + std_t^2 (1 - sigma) / (2 sigma)) * dt : also d mean / d v */
    int has_std;    /* 1 when step_std > 0 and step_std^2 is a normal fp32 number; 0: an ODE step (eta 0), which
                       has no log-prob and is never trained */
    int has_logp;   /* 1 when flow_sde_step evaluated a log-prob (has_std and an x_next to evaluate) */
    float logp;     /* the log-prob when has_logp, else exactly 0 (never NaN or -inf) */
    flow_kind kind; /* the step's kind (flow_step_init: {FLOW_SDE, FLOW_LOGP_EXACT}) */
} flow_step;

/* Fills the scalars of a step (has_logp = 0, logp = 0), in fp32 in this order:
 *   dt = sigma_next - sigma;  den = 1 - (sigma == 1 ? sigma1 : sigma);  std_t = eta * sqrtf(sigma / den);
 *   step_std = std_t * sqrtf(-dt);  w = std_t * std_t;
 *   coef_x = 1 + (w / (2 sigma)) * dt;  coef_v = (1 + w * (1 - sigma) / (2 sigma)) * dt.
 * (Flow-GRPO multiplies v by the bracket and then by dt per element; we fold dt into coef_v first: same value up
 * to one fp32 rounding, and d mean / d v is then exactly coef_v.)
 * sigma1 is sigmas[1] of the schedule, used only when sigma == 1. eta 0 gives step_std 0, coef_x 1, coef_v dt:
 * the Euler (ODE) step x + v dt.
 * Errors (-1, message names the bad value): sigma not in (0, 1]; sigma_next not in [0, sigma); eta NaN, inf or
 * negative; at sigma == 1, sigma1 not in [0, 1). */
int flow_step_init(flow_step *st, float sigma, float sigma_next, float sigma1, float eta);

/* flow_step_init of a step of kind k (FLOW_SDE: exactly flow_step_init; FLOW_CPS: the scalars of the cps step above,
 * sigma1 unused). st->kind records k. Errors: flow_step_init's, an unknown type or logp mode, FLOW_LOGP_FLOW_GRPO with
 * FLOW_SDE ("algorithm.cps_logprob: flow_grpo is defined for rollout.sde_type cps only"), eta > 1 with FLOW_CPS
 * (sin(eta pi / 2) would fall again: "rollout.eta: cps needs eta in [0, 1]"). */
int flow_step_init_kind(flow_step *st, flow_kind k, float sigma, float sigma_next, float sigma1, float eta);

/* One SDE step with its log-prob: the one function rollout and trainer both call (docs/design.md section 4).
 *   x, v [n] fp32: latent at sigma and the (guided) velocity; n >= 1.
 *   Exactly one way of getting x_next:
 *     eps != NULL (rollout): eps [n] standard normals; x_next_out [n] (required) = mean + step_std * eps, and the
 *         log-prob of that x_next. With step_std 0 (eta 0) x_next_out = mean and there is no log-prob.
 *     x_next_given != NULL (trainer): x_next_given [n], the recorded next latent; its log-prob under this mean.
 *         x_next_out is not written.
 *     both NULL: the deterministic step; x_next_out (may be NULL) = mean; no log-prob.
 *   mean_out [n] (may be NULL) = coef_x * x + coef_v * v (two fp32 products and one sum per element).
 *   Outputs may alias inputs exactly (elementwise: each element is read before it is written), not partially.
 *   st: filled by flow_step_init, then st->has_logp and st->logp:
 *     logp = -(S / n) / (2 step_std^2) - logf(step_std) - log(sqrt(2 pi)),  S = sum_fixed over elements of
 *     (x_next - mean)^2 (fp32, core/reduce.h order). This is the mean over elements of Flow-GRPO's per-element
 *     log-density with the element-independent terms taken out of the sum (same value; one rounding per term
 *     fewer). The sum runs chunk-parallel over OpenMP threads; results do not depend on the thread count.
 * Errors (-1): flow_step_init's, n < 1, a NULL x or v, eps and x_next_given both given, eps given without
 * x_next_out. Nothing is written on error. */
int flow_sde_step(const float *x, const float *v, const float *eps, const float *x_next_given, int64_t n, float sigma,
                  float sigma_next, float sigma1, float eta, float *mean_out, float *x_next_out, flow_step *st);

/* flow_sde_step for a step of kind k: the same contract, the scalars of flow_step_init_kind, and with
 * FLOW_LOGP_FLOW_GRPO logp = -(S / n) (fp32, S the same fixed-order sum). flow_sde_step(...) is
 * flow_sde_step_kind(flow_kind_default(), ...) bit for bit. */
int flow_sde_step_kind(flow_kind k, const float *x, const float *v, const float *eps, const float *x_next_given,
                       int64_t n, float sigma, float sigma_next, float sigma1, float eta, float *mean_out,
                       float *x_next_out, flow_step *st);

/* The KL of the step's Gaussian policy to the reference's (both with std step_std, means mean_new and mean_ref):
 *   *kl_out = (S / n) / (2 step_std^2),  S = sum_fixed (mean_new - mean_ref)^2  (fp32; core/reduce.h order),
 * i.e. the mean over elements of (mean_new - mean_ref)^2 / (2 (std_t sqrt(-dt))^2) (docs/design.md section 4: exact
 * KL of two Gaussians with equal std, per element, averaged). mean_* [n] fp32, n >= 1.
 * Errors (-1): n < 1, NULL pointers, step_std not > 0 or step_std^2 not a normal fp32 (an ODE step has no KL). */
int flow_kl(const float *mean_new, const float *mean_ref, int64_t n, float step_std, float *kl_out);

/* Backward of L = g_logp * logp + g_kl * KL with respect to the velocity v of the step (x and x_next are data;
 * the gradient flows through mean = coef_x x + coef_v v only, as in Flow-GRPO where x_next is detached):
 *   d logp / d mean_i = (x_next_i - mean_i) / (step_std^2 n);   d KL / d mean_i = (mean_i - mean_ref_i) / (step_std^2 n)
 *   dv_i = k * (g_logp * (x_next_i - mean_i) + g_kl * (mean_i - mean_ref_i)),  k = coef_v / (step_std^2 * n) (fp32)
 * (the g_kl term is left out when g_kl == 0, the g_logp term when g_logp == 0).
 *   st: the step (flow_sde_step or flow_step_init); mean [n]: this step's mean (flow_sde_step's mean_out);
 *   x_next [n]: the recorded next latent (needed when g_logp != 0); mean_ref [n]: the reference model's mean for
 *   the same x (needed when g_kl != 0); g_logp, g_kl: dL/dlogp, dL/dKL (from grpo_loss_terms); dv [n]: written.
 *   With classifier-free guidance v = v_u + g (v_c - v_u) the caller applies dv_c = g dv, dv_u = (1 - g) dv.
 * Errors (-1): n < 1, !st->has_std, NULL mean or dv, a needed x_next / mean_ref NULL, g_* not finite. */
int flow_sde_backward_v(const flow_step *st, const float *mean, const float *x_next, const float *mean_ref, int64_t n,
                        float g_logp, float g_kl, float *dv);

/* flow_sde_backward_v for any kind, with GRPO-Guard's mean-bias term: L = g_logp logp + g_kl KL + g_bias b, where
 * b = flow_kl(mean, mean_old) (the guard's bias: mean over elements of (mean - mean_old)^2 / (2 step_std^2)):
 *   dv_i = coef_v * (g_logp * dlogp_i + (g_kl * (mean_i - mean_ref_i) + g_bias * (mean_i - mean_old_i)) / (var n)),
 * var = step_std^2, dlogp_i = d logp / d mean_i = (x_next_i - mean_i) / (var n) (FLOW_LOGP_EXACT) or
 * 2 (x_next_i - mean_i) / n (FLOW_LOGP_FLOW_GRPO). In fp32, in this order:
 *   k = coef_v / (var * n);  gl = g_logp (exact) or g_logp * (2 * var) (flow_grpo);
 *   g = 0;  g = g + gl * (x_next_i - mean_i);  g = g + g_kl * (mean_i - mean_ref_i);
 *   g = g + g_bias * (mean_i - mean_old_i);  dv_i = k * g,
 * a term whose g_* is 0 left out (so with g_bias 0 and the exact log-prob this is flow_sde_backward_v bit for bit;
 * the flow_grpo factor 2 var / (var n) is exact up to two roundings). mean_old [n] is needed when g_bias != 0 (the
 * rollout's mean of the step). Errors: flow_sde_backward_v's, and g_bias not finite or != 0 without mean_old. */
int flow_sde_backward_v_guard(const flow_step *st, const float *mean, const float *x_next, const float *mean_ref,
                              const float *mean_old, int64_t n, float g_logp, float g_kl, float g_bias, float *dv);

#endif
