#!/usr/bin/env python3
"""scripts/fixtures_algo.py — reference values for the cps step (model/flow/flow.c, FLOW_CPS) and the GRPO-Guard loss
(trainer/step/grpo.c, grpo_guard_loss_terms), for tests/test_flow_cps.c and tests/test_grpo_guard.c.

Everything is float64 numpy from float32 inputs, written from the formulas below (no torch needed), independently of
the C code. Float64 results are stored bit for bit as I64 tensors whose names end in ".f64" (the C reader has no F64
dtype; the test reinterprets the 8 bytes). Writes tests/fixtures/algo_cps_guard.safetensors:

(a) cps steps (Flow-GRPO sde_type="cps", as in verl-omni verl_omni/pipelines/schedulers/flow_match_sde.py):
      s = sigma_next sin(eta pi / 2),  x0 = x - sigma v,  x1 = x + (1 - sigma) v,
      mean = (1 - sigma_next) x0 + sqrt(sigma_next^2 - s^2) x1,  x_next = mean + s eps
    Inputs (n = 64 elements, shared by the cases):
      cps.x, cps.v, cps.eps        F32 [64]  latent, velocity, noise of the rollout step
      cps.v_old, cps.eps_old       F32 [64]  the old policy's velocity and noise that recorded x_given
      cps.v_ref                    F32 [64]  the reference model's velocity
      cps.case<k>.params           F32 [5]   sigma, sigma_next, eta, g_logp, g_kl
      cps.case<k>.x_given          F32 [64]  float32(mean(v_old) + s eps_old): the recorded next latent
      cps.case<k>.mean_ref         F32 [64]  float32(mean(v_ref)): the reference model's mean
    References:
      cps.case<k>.mean.f64         [64]  mean of (x, v)
      cps.case<k>.x_next.f64       [64]  mean + s eps
      cps.case<k>.ref.f64          [8]   s, coef_x = d mean / d x, coef_v = d mean / d v,
                                         logp_exact(x_next), logp_flow_grpo(x_next),
                                         logp_exact(x_given), logp_flow_grpo(x_given), KL(mean, mean_ref)
          logp_exact     = mean over elements of the Gaussian log-density with std s
          logp_flow_grpo = -mean over elements of (x' - mean)^2 (Flow-GRPO's cps "log-prob")
          KL             = mean over elements of (mean - mean_ref)^2 / (2 s^2)
      cps.case<k>.dv_exact.f64     [64]  d/dv of g_logp logp_exact(x_given) + g_kl KL (x, x_given, mean_ref data)
      cps.case<k>.dv_flow_grpo.f64 [64]  the same with logp_flow_grpo
    The last step (sigma_next 0) has s = 0: mean = x - sigma v, no log-prob; its ref.f64 holds s, coef_x, coef_v
    and zeros, its dv_* zeros, x_next = mean.
    __metadata__ "cps_cases": the number of cases.

(b) GRPO-Guard loss (verl-omni verl_omni/trainer/diffusion/diffusion_algos.py, GRPOGuardLoss; arXiv 2510.22319),
    T transitions of the Flow-GRPO "sde" step, per transition t:
      scale = sqrt(-dt) std_t;  bias = mean over elements of (mean_new - mean_old)^2 / (2 scale^2)
      ratio = exp((logp_new - logp_old + bias) scale)
      policy = max(-A ratio, -A clamp(ratio, 1 - eps, 1 + eps)) / sqrt(-dt)^2
      contribution = (mask policy + beta kl) / denom          (vgrpo's loss denominator, as grpo_loss_terms)
      d contribution / d logp_new = mask dpolicy/dratio ratio scale / (-dt) / denom
      d contribution / d mean_new_i = d contribution / d bias (mean_new_i - mean_old_i) / (n scale^2)
    (logp_new is an input here: its own dependence on mean_new is the flow backward's, not the loss's.)
    Inputs:
      guard.params   F32 [T, 4]  sigma, sigma_next, sigma1, eta of the sde step (N = 10, shift 3 schedule)
      guard.std_t    F32 [T]     float32(eta sqrt(sigma / (1 - sigma)))  (1 - sigma1 at sigma == 1)
      guard.dt       F32 [T]     float32(sigma_next - sigma)
      guard.logp_new, guard.logp_old, guard.adv, guard.kl  F32 [T];  guard.mask U8 [T]
      guard.mean_new, guard.mean_old  F32 [T, 64]
      guard.hyper    F32 [2]     eps (clip range), beta;  __metadata__ "guard_denom": the loss denominator
    References: guard.bias.f64, guard.ratio.f64, guard.contrib.f64, guard.dlogp.f64 [T];
      guard.dmean_new.f64 [T, 64];  guard.totals.f64 [4]: loss, policy (sum of mask policy / denom),
      kl (sum of kl / denom), clipped (count of ratio strictly outside [1 - eps, 1 + eps]).
    The transitions cover: the first update (logp_new == logp_old, mean_new == mean_old: ratio 1), ratio inside the
    clip range, above it with A > 0 (clipped: gradient 0) and with A < 0, below it with A < 0 (clipped) and A > 0,
    and a masked one. Every ratio keeps >= 1e-3 from a clip bound, so fp32 cannot fall on the other side.

Run: .venv/bin/python scripts/gen_fixtures.py algo   (needs numpy, safetensors; CI never runs it)
"""
import math
import os
import sys

import numpy as np

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
N_ELEM = 64


def f64_bits(a):
    """A float64 array stored bit for bit as I64 (read back in C by reinterpreting the bytes)."""
    return np.ascontiguousarray(np.asarray(a, dtype=np.float64)).view(np.int64)


def schedule(n_steps, shift):
    """The shifted sigma schedule of flow.h (float64, then float32), sigmas[N] = 0."""
    u = 1.0 / 1000.0
    smin = shift * u / (1.0 + (shift - 1.0) * u)
    t = np.linspace(1.0, smin, n_steps)
    s = shift * t / (1.0 + (shift - 1.0) * t)
    return np.concatenate([s, [0.0]]).astype(np.float32)


# ---- (a) cps ----

def cps_scalars(sigma, sigma_next, eta):
    s = sigma_next * math.sin(eta * math.pi / 2.0)
    c = math.sqrt(max(sigma_next**2 - s**2, 0.0))
    return s, c


def cps_mean(x, v, sigma, sigma_next, eta):
    s, c = cps_scalars(sigma, sigma_next, eta)
    x0 = x - sigma * v
    x1 = x + (1.0 - sigma) * v
    return (1.0 - sigma_next) * x0 + c * x1


def logp_exact(xn, mean, s):
    lp = -((xn - mean) ** 2) / (2.0 * s**2) - math.log(s) - math.log(math.sqrt(2.0 * math.pi))
    return float(lp.mean())


def logp_flow_grpo(xn, mean):
    return float(-(((xn - mean) ** 2).mean()))


def cps_fixture(tensors, meta, rng):
    n = N_ELEM
    f32 = lambda a: np.asarray(a, dtype=np.float32)
    x = f32(rng.standard_normal(n))
    v = f32(rng.standard_normal(n) * 1.2 + 0.1)
    v_old = f32(v + 0.05 * rng.standard_normal(n))
    v_ref = f32(v + 0.1 * rng.standard_normal(n))
    eps = f32(rng.standard_normal(n))
    eps_old = f32(rng.standard_normal(n))
    for name, a in (("x", x), ("v", v), ("v_old", v_old), ("v_ref", v_ref), ("eps", eps), ("eps_old", eps_old)):
        tensors["cps." + name] = a
    xd, vd, vod, vrd = (a.astype(np.float64) for a in (x, v, v_old, v_ref))
    sig = schedule(10, 3.0)
    # (step index, eta, g_logp, g_kl): the first step (sigma 1), interior steps, the last step (sigma_next 0)
    cases = [(0, 0.7, 0.83, 0.0), (3, 0.3, -1.7, 0.25), (5, 0.7, 2.1, -0.6), (7, 1.0, 0.45, 1.3), (9, 0.7, 1.0, 1.0)]
    for k, (i, eta32, gl, gk) in enumerate(cases):
        sigma, sigma_next, eta = float(sig[i]), float(sig[i + 1]), float(np.float32(eta32))
        gl, gk = float(np.float32(gl)), float(np.float32(gk))
        s, c = cps_scalars(sigma, sigma_next, eta)
        coef_x = (1.0 - sigma_next) + c
        coef_v = -sigma * (1.0 - sigma_next) + c * (1.0 - sigma)
        mean = cps_mean(xd, vd, sigma, sigma_next, eta)
        mean_old = cps_mean(xd, vod, sigma, sigma_next, eta)
        mean_ref = f32(cps_mean(xd, vrd, sigma, sigma_next, eta))
        x_next = mean + s * eps.astype(np.float64)
        x_given = f32(mean_old + s * eps_old.astype(np.float64))
        p = f"cps.case{k}."
        tensors[p + "params"] = f32([sigma, sigma_next, eta, gl, gk])
        tensors[p + "x_given"] = x_given
        tensors[p + "mean_ref"] = mean_ref
        tensors[p + "mean.f64"] = f64_bits(mean)
        tensors[p + "x_next.f64"] = f64_bits(x_next)
        if s > 0:
            xg, mr = x_given.astype(np.float64), mean_ref.astype(np.float64)
            kl = float((((mean - mr) ** 2) / (2.0 * s**2)).mean())
            ref = [s, coef_x, coef_v, logp_exact(x_next, mean, s), logp_flow_grpo(x_next, mean),
                   logp_exact(xg, mean, s), logp_flow_grpo(xg, mean), kl]
            dkl_dmean = (mean - mr) / (s**2 * n)
            dv_exact = coef_v * (gl * (xg - mean) / (s**2 * n) + gk * dkl_dmean)
            dv_fg = coef_v * (gl * 2.0 * (xg - mean) / n + gk * dkl_dmean)
        else:
            ref = [s, coef_x, coef_v, 0.0, 0.0, 0.0, 0.0, 0.0]
            dv_exact = dv_fg = np.zeros(n)
        tensors[p + "ref.f64"] = f64_bits(ref)
        tensors[p + "dv_exact.f64"] = f64_bits(dv_exact)
        tensors[p + "dv_flow_grpo.f64"] = f64_bits(dv_fg)
    meta["cps_cases"] = str(len(cases))


# ---- (b) GRPO-Guard ----

def ppo(ratio, adv, eps):
    """max(-A r, -A clamp(r)) and its derivative in r (no exact ties here: every ratio is off the bounds)."""
    lo, hi = 1.0 - eps, 1.0 + eps
    rc = min(max(ratio, lo), hi)
    u, c = -adv * ratio, -adv * rc
    if u > c:
        return u, -adv, ratio < lo or ratio > hi
    return c, (-adv if lo <= ratio <= hi else 0.0), ratio < lo or ratio > hi


def guard_fixture(tensors, meta, rng):
    n = N_ELEM
    sig = schedule(10, 3.0)
    eps, beta, denom = float(np.float32(0.05)), float(np.float32(0.04)), 9
    # (step index, eta, target ratio, advantage, mask, mean drift): the ratio is reached by choosing logp_new
    rows = [(0, 0.7, 1.0, 0.9, 1, 0.0),       # first update: logp_new == logp_old, mean_new == mean_old
            (2, 0.7, 1.02, 1.3, 1, 0.01),     # inside the clip range
            (4, 0.7, 1.2, 0.7, 1, 0.03),      # above, A > 0: clipped, gradient 0
            (5, 1.0, 1.2, -0.8, 1, 0.02),     # above, A < 0: the unclipped branch, gradient -A
            (6, 0.7, 0.8, -1.1, 1, 0.05),     # below, A < 0: clipped
            (8, 0.5, 0.9, 0.6, 1, 0.004),     # below, A > 0: unclipped
            (9, 0.7, 0.97, 1.5, 0, 0.001)]    # masked: no policy term, KL only
    T = len(rows)
    params = np.zeros((T, 4), np.float32)
    std_t, dt = np.zeros(T, np.float32), np.zeros(T, np.float32)
    lnew, lold, adv, kl = (np.zeros(T, np.float32) for _ in range(4))
    mask = np.zeros(T, np.uint8)
    mnew, mold = np.zeros((T, n), np.float32), np.zeros((T, n), np.float32)
    for t, (i, eta, r, a, m, drift) in enumerate(rows):
        sigma, sigma_next, sigma1 = float(sig[i]), float(sig[i + 1]), float(sig[1])
        eta = float(np.float32(eta))
        params[t] = [sigma, sigma_next, sigma1, eta]
        den = 1.0 - (sigma1 if sigma == 1.0 else sigma)
        std_t[t] = eta * math.sqrt(sigma / den)
        dt[t] = sigma_next - sigma
        scale = math.sqrt(-float(dt[t])) * float(std_t[t])
        mold[t] = rng.standard_normal(n)
        mnew[t] = mold[t] + (drift * rng.standard_normal(n) if drift else 0.0)
        bias = float((((mnew[t].astype(np.float64) - mold[t]) ** 2).mean()) / (2.0 * scale**2))
        lold[t] = -1.0 - rng.random()  # an exact log-prob of a video step is of this order
        lnew[t] = lold[t] if r == 1.0 else np.float32(float(lold[t]) + math.log(r) / scale - bias)
        adv[t], mask[t] = a, m
        kl[t] = 0.002 * (t + 1)
    tensors.update({"guard.params": params, "guard.std_t": std_t, "guard.dt": dt, "guard.logp_new": lnew,
                    "guard.logp_old": lold, "guard.adv": adv, "guard.kl": kl, "guard.mask": mask,
                    "guard.mean_new": mnew, "guard.mean_old": mold, "guard.hyper": np.array([eps, beta], np.float32)})
    meta["guard_denom"] = str(denom)

    bias_r, ratio_r, contrib_r, dlogp_r = (np.zeros(T) for _ in range(4))
    dmean_r = np.zeros((T, n))
    loss = policy_sum = kl_sum = 0.0
    clipped = 0
    for t in range(T):
        sqrt_dt = math.sqrt(-float(dt[t]))
        scale = sqrt_dt * float(std_t[t])
        d = mnew[t].astype(np.float64) - mold[t].astype(np.float64)
        bias = float((d**2).mean()) / (2.0 * scale**2)
        ratio = math.exp((float(lnew[t]) - float(lold[t]) + bias) * scale)
        lo_gap = min(abs(ratio - (1.0 - eps)), abs(ratio - (1.0 + eps)))
        assert lo_gap >= 1e-3, f"transition {t}: ratio {ratio} too close to a clip bound"
        pol, dpr, clip = ppo(ratio, float(adv[t]), eps)
        pol /= sqrt_dt**2
        dpr /= sqrt_dt**2
        msk = float(mask[t])
        contrib = (msk * pol + beta * float(kl[t])) / denom
        g = msk * dpr * ratio * scale / denom
        bias_r[t], ratio_r[t], contrib_r[t], dlogp_r[t] = bias, ratio, contrib, g
        dmean_r[t] = g * d / (n * scale**2)
        loss += contrib
        policy_sum += msk * pol / denom
        kl_sum += float(kl[t]) / denom
        clipped += int(clip)
    assert abs(ratio_r[0] - 1.0) == 0.0
    tensors.update({"guard.bias.f64": f64_bits(bias_r), "guard.ratio.f64": f64_bits(ratio_r),
                    "guard.contrib.f64": f64_bits(contrib_r), "guard.dlogp.f64": f64_bits(dlogp_r),
                    "guard.dmean_new.f64": f64_bits(dmean_r),
                    "guard.totals.f64": f64_bits([loss, policy_sum, kl_sum, float(clipped)])})


if __name__ == "__main__":
    from safetensors.numpy import save_file

    os.makedirs(OUT_DIR, exist_ok=True)
    tensors, meta = {}, {}
    rng = np.random.default_rng(20260516)
    cps_fixture(tensors, meta, rng)
    guard_fixture(tensors, meta, rng)
    path = os.path.join(OUT_DIR, "algo_cps_guard.safetensors")
    save_file(tensors, path, metadata=meta)
    print(f"wrote algo_cps_guard.safetensors ({os.path.getsize(path)} bytes)", file=sys.stderr)
