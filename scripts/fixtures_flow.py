#!/usr/bin/env python3
"""scripts/fixtures_flow.py — reference values for model/flow/flow.c (tests/test_flow.c).

Writes, under tests/fixtures/:
  flow_schedule.safetensors  for N in {1, 10, 20, 50} and shift in {1, 3, 5, 12, 3.1, 2.5}:
      sched.N<N>.s<shift>.sigmas     F32 [N+1]   diffusers FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000,
      sched.N<N>.s<shift>.timesteps  F32 [N]     shift=shift).set_timesteps(N): .sigmas and .timesteps
      (__metadata__ "cases": the list of "N,shift" pairs, shift printed with repr())
  flow_sde.safetensors       the SDE step with log-prob of docs/design.md section 4 (Flow-GRPO "sde"), computed here in
      float64 numpy from float32 inputs, independently of the C code:
      x, v, v_old, eps, eps_old   F32 [4,5,10,25]  (n = 5000 elements: one full 4096-element chunk and a partial one)
      case<k>.params              F32 [4]  sigma, sigma_next, sigma1 (sigmas[1]), eta
      case<k>.mean_head           F32 [512] first 512 elements of mean = x*(1 + std^2/(2 sigma) dt)
                                            + v*(1 + std^2 (1-sigma)/(2 sigma)) dt
      case<k>.x_next_head         F32 [512] first 512 elements of x_next = mean + std_t sqrt(-dt) eps
      case<k>.x_given             F32 [n]   a recorded transition: mean under v_old + step std * eps_old, rounded to
                                            float32; the trainer evaluates its log-prob under the mean of v
      __metadata__ case<k>.{std_t, step_std, logp, logp_given, kl}: float64 values as repr() strings
          logp       = log-prob of x_next (the double x_next of this script) under mean
          logp_given = log-prob of x_given under mean
          kl         = mean over elements of (mean - mean_old)^2 / (2 step_std^2), mean_old from v_old
  The cases take sigma, sigma_next from diffusers' schedule N=10, shift=3 (rounded to float32 as the scheduler
  stores them): step 0 (sigma == 1, the 1 - sigmas[1] denominator), a middle step, the last step (sigma_next == 0).

Run: .venv/bin/python scripts/fixtures_flow.py   (needs numpy, torch, diffusers, safetensors; CI never runs it)
"""
import os
import sys

import numpy as np

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")

SCHED_N = [1, 10, 20, 50]
SCHED_SHIFTS = [1.0, 3.0, 5.0, 12.0, 3.1, 2.5]


def schedule_fixture():
    from diffusers import FlowMatchEulerDiscreteScheduler
    from safetensors.numpy import save_file

    tensors, cases = {}, []
    for n in SCHED_N:
        for shift in SCHED_SHIFTS:
            sch = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
            sch.set_timesteps(n)
            sig = sch.sigmas.numpy().astype(np.float32)
            ts = sch.timesteps.numpy().astype(np.float32)
            assert sig.shape == (n + 1,) and ts.shape == (n,)
            key = f"sched.N{n}.s{shift!r}"
            tensors[key + ".sigmas"] = sig
            tensors[key + ".timesteps"] = ts
            cases.append(f"{n},{shift!r}")
    save_file(tensors, os.path.join(OUT_DIR, "flow_schedule.safetensors"), metadata={"cases": ";".join(cases)})


def sde_ref(x, v, sigma, sigma_next, sigma1, eta):
    """float64 mean, std_t, step std of one step (docs/design.md section 4)."""
    sigma, sigma_next, sigma1, eta = (float(np.float32(a)) for a in (sigma, sigma_next, sigma1, eta))
    dt = sigma_next - sigma
    den = 1.0 - (sigma1 if sigma == 1.0 else sigma)
    std_t = eta * np.sqrt(sigma / den)
    mean = x * (1.0 + std_t**2 / (2.0 * sigma) * dt) + v * (1.0 + std_t**2 * (1.0 - sigma) / (2.0 * sigma)) * dt
    return mean, std_t, std_t * np.sqrt(-dt)


def logp_ref(x_next, mean, step_std):
    lp = -((x_next - mean) ** 2) / (2.0 * step_std**2) - np.log(step_std) - np.log(np.sqrt(2.0 * np.pi))
    return float(lp.mean())


def sde_fixture():
    from diffusers import FlowMatchEulerDiscreteScheduler
    from safetensors.numpy import save_file

    sch = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    sch.set_timesteps(10)
    sig = sch.sigmas.numpy().astype(np.float32)

    rng = np.random.default_rng(20240611)
    shape = (4, 5, 10, 25)
    x = rng.standard_normal(shape).astype(np.float32)
    v = (rng.standard_normal(shape) * 1.3 + 0.2).astype(np.float32)
    v_old = (v + 0.05 * rng.standard_normal(shape)).astype(np.float32)
    eps = rng.standard_normal(shape).astype(np.float32)
    eps_old = rng.standard_normal(shape).astype(np.float32)
    tensors = {"x": x, "v": v, "v_old": v_old, "eps": eps, "eps_old": eps_old}
    meta = {}
    xd, vd, vod = x.astype(np.float64), v.astype(np.float64), v_old.astype(np.float64)
    cases = [(0, 0.7), (4, 1.0), (9, 0.7), (5, 0.3)]  # (step index, eta)
    for k, (i, eta) in enumerate(cases):
        s, sn, s1 = sig[i], sig[i + 1], sig[1]
        mean, std_t, step_std = sde_ref(xd, vd, s, sn, s1, eta)
        mean_old, _, _ = sde_ref(xd, vod, s, sn, s1, eta)
        x_next = mean + step_std * eps.astype(np.float64)
        x_given = (mean_old + step_std * eps_old.astype(np.float64)).astype(np.float32)
        p = f"case{k}."
        tensors[p + "params"] = np.array([s, sn, s1, eta], dtype=np.float32)
        tensors[p + "mean_head"] = mean.reshape(-1)[:512].astype(np.float32)
        tensors[p + "x_next_head"] = x_next.reshape(-1)[:512].astype(np.float32)
        tensors[p + "x_given"] = x_given
        meta[p + "std_t"] = repr(float(std_t))
        meta[p + "step_std"] = repr(float(step_std))
        meta[p + "logp"] = repr(logp_ref(x_next, mean, step_std))
        meta[p + "logp_given"] = repr(logp_ref(x_given.astype(np.float64), mean, step_std))
        meta[p + "kl"] = repr(float((((mean - mean_old) ** 2) / (2.0 * step_std**2)).mean()))
    meta["cases"] = str(len(cases))
    save_file(tensors, os.path.join(OUT_DIR, "flow_sde.safetensors"), metadata=meta)


if __name__ == "__main__":
    os.makedirs(OUT_DIR, exist_ok=True)
    schedule_fixture()
    sde_fixture()
    print("wrote flow_schedule.safetensors, flow_sde.safetensors", file=sys.stderr)
