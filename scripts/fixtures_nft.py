#!/usr/bin/env python3
"""scripts/fixtures_nft.py — reference values for DiffusionNFT's loss (trainer/step/nft.c, nft_loss_terms and
nft_optimality), for tests/test_nft.c.

A float64 torch transcription of NVlabs/DiffusionNFT scripts/train_nft_sd3.py (lines 910-970), from float32
inputs, independent of the C code; the gradient w.r.t. the current velocity is torch autograd's (the weight factors
under no_grad, as there). Float64 results are stored bit for bit as I64 tensors whose names end in ".f64".
Writes tests/fixtures/nft_loss.safetensors:
  Inputs (T transitions of M = 96 elements, each its own sample):
    nft.x0, nft.eps, nft.v, nft.v_old, nft.v_ref   F32 [T, M]
    nft.xt      F32 [T, M]   float32((1 - t) x0 + t eps) computed in float32 as the C code does
    nft.t       F32 [T]      the timestep as sigma (timesteps / 1000 in the reference)
    nft.adv     F32 [T]      advantages (some beyond +-adv_clip_max, one 0)
    nft.hyper   F32 [3]      beta (config.beta), adv_clip_max (train.adv_clip_max), kl_beta (train.beta)
    __metadata__ "nft_denom": the loss denominator (the reference divides its per-micro-batch mean by the number
    of accumulated backward passes: with full micro-batches, the number of transitions of the optimizer step).
  References:
    nft.r.f64        [T]     clamp(clamp(A, -c, c) / c / 2 + 0.5, 0, 1)
    nft.contrib.f64  [T]     (c (r L+ + (1 - r) L-) / beta + kl_beta KL) / denom, per transition
    nft.parts.f64    [T, 4]  L+, L-, KL, policy (c (r L+ + (1 - r) L-) / beta)
    nft.dv.f64       [T, M]  d contrib / d v (torch autograd, float64)
The cases cover r = 0, 1 (clipped advantages), 1/2 (A = 0), intermediate values, small and large t, v == v_old
(the first update) and a tiny error that hits the 1e-5 floor of the adaptive weight.

Run: .venv/bin/python scripts/gen_fixtures.py nft   (needs torch, numpy, safetensors; CI never runs it)
"""
import os

import numpy as np
import torch
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "nft_loss.safetensors")

M = 96


def f64_bits(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float64)).view(np.int64)


def nft_loss(x0, xt, t, v, v_old, v_ref, adv, beta, clip, kl_beta):
    """One micro-batch of the reference (train_nft_sd3.py l.910-970), batch dim 0, per-sample losses, float64."""
    t_expanded = t.view(-1, *([1] * (len(x0.shape) - 1)))
    advantages_clip = torch.clamp(adv, -clip, clip)                                    # l.910-914
    normalized_advantages_clip = (advantages_clip / clip) / 2.0 + 0.5                 # l.928
    r = torch.clamp(normalized_advantages_clip, 0, 1)                                 # l.929
    positive_prediction = beta * v + (1 - beta) * v_old.detach()                      # l.934
    implicit_negative_prediction = (1.0 + beta) * v_old.detach() - beta * v           # l.935-937
    x0_prediction = xt - t_expanded * positive_prediction                             # l.940
    with torch.no_grad():                                                             # l.941-946
        weight_factor = torch.abs(x0_prediction.double() - x0.double()).mean(
            dim=tuple(range(1, x0.ndim)), keepdim=True).clip(min=0.00001)
    positive_loss = ((x0_prediction - x0) ** 2 / weight_factor).mean(dim=tuple(range(1, x0.ndim)))   # l.947
    negative_x0_prediction = xt - t_expanded * implicit_negative_prediction          # l.948
    with torch.no_grad():                                                             # l.949-954
        negative_weight_factor = torch.abs(negative_x0_prediction.double() - x0.double()).mean(
            dim=tuple(range(1, x0.ndim)), keepdim=True).clip(min=0.00001)
    negative_loss = ((negative_x0_prediction - x0) ** 2 / negative_weight_factor).mean(
        dim=tuple(range(1, x0.ndim)))                                                 # l.955-957
    ori_policy_loss = r * positive_loss / beta + (1.0 - r) * negative_loss / beta     # l.959
    policy = ori_policy_loss * clip                                                   # l.960 (before .mean())
    kl = ((v - v_ref) ** 2).mean(dim=tuple(range(1, x0.ndim)))                        # l.966-968
    return r, positive_loss, negative_loss, kl, policy, policy + kl_beta * kl         # l.970 (per sample)


def main():
    rng = np.random.default_rng(29)
    ts = [0.95, 0.8, 0.6, 0.45, 0.3, 0.12, 0.05, 0.7]
    advs = [7.5, -6.0, 0.0, 1.3, -2.2, 4.9, -0.4, 0.9]
    T = len(ts)
    x0 = rng.standard_normal((T, M)).astype(np.float32)
    eps = rng.standard_normal((T, M)).astype(np.float32)
    v_old = (eps - x0 + 0.3 * rng.standard_normal((T, M))).astype(np.float32)
    v = (v_old + 0.05 * rng.standard_normal((T, M))).astype(np.float32)
    v[6] = v_old[6]                     # the first update: v == v_old
    v_ref = (v_old + 0.1 * rng.standard_normal((T, M))).astype(np.float32)
    t32 = np.array(ts, dtype=np.float32)
    xt = ((np.float32(1) - t32[:, None]) * x0 + t32[:, None] * eps).astype(np.float32)
    # a transition whose positive x0 error is tiny: its adaptive weight is floored at 1e-5
    v[7] = ((xt[7] - x0[7]) / t32[7]).astype(np.float32)
    v_old[7] = v[7]
    beta, clip, kl_beta = np.float32(0.1), np.float32(5.0), np.float32(1e-4)
    denom = 12

    f = lambda a: torch.tensor(np.asarray(a, dtype=np.float32), dtype=torch.float64)
    vt = f(v).requires_grad_(True)
    r, lp, ln, kl, policy, per = nft_loss(f(x0), f(xt), f(t32), vt, f(v_old), f(v_ref), f(advs),
                                          float(beta), float(clip), float(kl_beta))
    contrib = per / denom
    contrib.sum().backward()
    tensors = {
        "nft.x0": x0, "nft.eps": eps, "nft.v": v, "nft.v_old": v_old, "nft.v_ref": v_ref, "nft.xt": xt,
        "nft.t": t32, "nft.adv": np.array(advs, dtype=np.float32),
        "nft.hyper": np.array([beta, clip, kl_beta], dtype=np.float32),
        "nft.r.f64": f64_bits(r.detach().numpy()),
        "nft.contrib.f64": f64_bits(contrib.detach().numpy()),
        "nft.parts.f64": f64_bits(torch.stack([lp, ln, kl, policy], 1).detach().numpy()),
        "nft.dv.f64": f64_bits(vt.grad.numpy()),
    }
    save_file(tensors, OUT, metadata={"nft_denom": str(denom), "nft_cases": str(T)})
    print(f"wrote {OUT}: {T} transitions, loss {contrib.sum().item():.6g}")


if __name__ == "__main__":
    main()
