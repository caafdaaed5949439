#!/usr/bin/env python3
"""scripts/fixtures_dpo.py — reference values for online Flow-DPO's loss (trainer/step/dpo.c, dpo_loss_terms), for
tests/test_dpo.c.

A float64 torch transcription of yifan123/flow_grpo scripts/train_sd3_dpo.py (lines 924-937: the velocity errors
against the target noise - x0 of the preferred and the rejected sample, the reference's, inside_term and
-logsigmoid), which is SalesforceAIResearch/DiffusionDPO train.py lines 1125-1145 with the flow-matching target;
from float32 inputs, independent of the C code. The gradients w.r.t. the policy's velocities of both samples are
torch autograd's. Float64 results are stored bit for bit as I64 tensors whose names end in ".f64".
Writes tests/fixtures/dpo_loss.safetensors:
  Inputs (T terms, each a pair at one timestep, of M = 96 elements):
    dpo.eps                      F32 [T, M]  the pair's shared noise
    dpo.x0_w, dpo.x0_l           F32 [T, M]  the clean latents of the preferred and the rejected sample
    dpo.v_w, dpo.v_l             F32 [T, M]  the policy's velocities
    dpo.vr_w, dpo.vr_l           F32 [T, M]  the reference's velocities
    dpo.beta                     F32 [1]     beta (config.train.beta; 100 in config/dpo.py)
    __metadata__ "dpo_denom": the loss denominator (the reference averages -logsigmoid over the terms of the
    optimizer step: the micro-batch mean, divided by the accumulated backward passes).
  References:
    dpo.contrib.f64   [T]     -logsigmoid(inside_term) / denom, per term
    dpo.parts.f64     [T, 5]  model_w_err, model_l_err, ref_w_err, ref_l_err, inside_term (the implicit margin z)
    dpo.dv_w.f64      [T, M]  d contrib / d v_w (torch autograd, float64)
    dpo.dv_l.f64      [T, M]  d contrib / d v_l
The cases cover the first update (policy == reference: z = 0, loss log 2), margins of both signs, small and large
|z| (beta 5000: sigmoid saturates on both sides, the loss is then |z| up to 1e-300), a pair with equal x0 (the same
sample twice: z = 0 whatever the velocities when v_w == v_l), |z| < 3.

Run: .venv/bin/python scripts/gen_fixtures.py dpo   (needs torch, numpy, safetensors; CI never runs it)
"""
import os

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "dpo_loss.safetensors")

M = 96


def f64_bits(a):
    return np.ascontiguousarray(np.asarray(a, dtype=np.float64)).view(np.int64)


def dpo_loss(eps, x0_w, x0_l, v_w, v_l, vr_w, vr_l, beta):
    """One micro-batch of the reference (train_sd3_dpo.py l.924-937), pairs along dim 0, per-term losses, float64.
    The reference stacks the preferred then the rejected samples along the batch (l.886, l.899); here they are kept
    apart, which is the same arithmetic."""
    model_input = torch.cat([x0_w, x0_l], 0)
    noise = torch.cat([eps, eps], 0)                                                       # l.886: shared noise
    model_pred = torch.cat([v_w, v_l], 0)
    model_pred_ref = torch.cat([vr_w, vr_l], 0).detach()
    bsz = x0_w.shape[0]
    target = noise - model_input                                                          # l.924
    theta_mse = ((model_pred - target) ** 2).reshape(target.shape[0], -1).mean(dim=1)    # l.926
    ref_mse = ((model_pred_ref - target) ** 2).reshape(target.shape[0], -1).mean(dim=1)  # l.927
    model_w_err, model_l_err = theta_mse[:bsz], theta_mse[bsz:]                           # l.929-932
    ref_w_err, ref_l_err = ref_mse[:bsz], ref_mse[bsz:]
    w_diff = model_w_err - ref_w_err                                                      # l.933-935
    l_diff = model_l_err - ref_l_err
    w_l_diff = w_diff - l_diff
    inside_term = -0.5 * beta * w_l_diff                                                  # l.936
    loss = -F.logsigmoid(inside_term)                                                     # l.937 (before the mean)
    return loss, torch.stack([model_w_err, model_l_err, ref_w_err, ref_l_err, inside_term], 1)


def main():
    rng = np.random.default_rng(31)
    T = 8
    eps = rng.standard_normal((T, M)).astype(np.float32)
    x0_w = rng.standard_normal((T, M)).astype(np.float32)
    x0_l = rng.standard_normal((T, M)).astype(np.float32)
    tgt_w, tgt_l = eps - x0_w, eps - x0_l
    # reference velocities near the targets; the policy's near the reference's
    vr_w = (tgt_w + 0.4 * rng.standard_normal((T, M))).astype(np.float32)
    vr_l = (tgt_l + 0.4 * rng.standard_normal((T, M))).astype(np.float32)
    v_w = (vr_w + 0.05 * rng.standard_normal((T, M))).astype(np.float32)
    v_l = (vr_l + 0.05 * rng.standard_normal((T, M))).astype(np.float32)
    v_w[0], v_l[0] = vr_w[0], vr_l[0]                                    # the first update: z = 0, loss log 2
    v_w[1] = (vr_w[1] + 0.2 * (tgt_w[1] - vr_w[1])).astype(np.float32)   # closer to the preferred target: z > 0
    v_l[2] = (vr_l[2] + 0.2 * (tgt_l[2] - vr_l[2])).astype(np.float32)   # closer to the rejected target: z < 0
    v_w[3] = (vr_w[3] + 0.5 * (tgt_w[3] - vr_w[3])).astype(np.float32)   # large z with beta 5000: saturated
    v_l[4] = (vr_l[4] + 0.5 * (tgt_l[4] - vr_l[4])).astype(np.float32)   # large negative z: loss ~ |z|
    x0_l[5] = x0_w[5]                                                    # the same sample twice
    v_l[5], vr_l[5] = v_w[5], vr_w[5]
    v_w[6] = (vr_w[6] + 1e-3 * rng.standard_normal(M)).astype(np.float32)   # |z| < 3: sigmoid far from 0 and 1
    v_l[6] = (vr_l[6] + 1e-3 * rng.standard_normal(M)).astype(np.float32)
    beta = np.float32(5000.0)
    denom = 10

    f = lambda a: torch.tensor(np.asarray(a, dtype=np.float32), dtype=torch.float64)
    vw = f(v_w).requires_grad_(True)
    vl = f(v_l).requires_grad_(True)
    loss, parts = dpo_loss(f(eps), f(x0_w), f(x0_l), vw, vl, f(vr_w), f(vr_l), float(beta))
    contrib = loss / denom
    contrib.sum().backward()
    z = parts[:, 4].detach().numpy()
    assert z[0] == 0.0 and z[1] > 0 and z[2] < 0 and z[3] > 30 and z[4] < -30 and z[5] == 0.0 and 0 < abs(z[6]) < 3, z
    tensors = {
        "dpo.eps": eps, "dpo.x0_w": x0_w, "dpo.x0_l": x0_l, "dpo.v_w": v_w, "dpo.v_l": v_l,
        "dpo.vr_w": vr_w, "dpo.vr_l": vr_l, "dpo.beta": np.array([beta], dtype=np.float32),
        "dpo.contrib.f64": f64_bits(contrib.detach().numpy()),
        "dpo.parts.f64": f64_bits(parts.detach().numpy()),
        "dpo.dv_w.f64": f64_bits(vw.grad.numpy()),
        "dpo.dv_l.f64": f64_bits(vl.grad.numpy()),
    }
    save_file(tensors, OUT, metadata={"dpo_denom": str(denom), "dpo_cases": str(T)})
    print(f"wrote {OUT}: {T} terms, loss {contrib.sum().item():.6g}, z {np.array2string(z, precision=3)}")


if __name__ == "__main__":
    main()
