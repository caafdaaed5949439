#!/usr/bin/env python3
"""scripts/fixtures_optim.py — writes tests/fixtures/optim_adamw.safetensors: parameter trajectories of
torch.optim.AdamW (CPU, float32, single-tensor path) on a small vector, for tests/test_optim.c.

Cases (hyperparameters are repeated in tests/test_optim.c; keep the two in step):
  nowd:  lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0,    no clipping, constant lr
  wd:    lr 1e-2, betas (0.8, 0.99),  eps 1e-6, weight_decay 0.1,  no clipping, constant lr
  clip:  lr 5e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-4, clip_grad_norm_(max_norm=1.0) before each step
  cos:   lr 2e-2, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2, max_norm 0.5, transformers
         get_cosine_schedule_with_warmup(num_warmup_steps=2, num_training_steps=6), scheduler.step() after each step
Tensors per case c: c.p0 [N] initial parameters, c.grads [T, N] raw gradients (before clipping), c.p [T, N]
parameters after each step, c.norm [T] total_norm returned by clip_grad_norm_ (clip, cos), c.lr [T] learning rate
used by each step (cos). Gradient scales vary per step so clipping engages on some steps and not on others.
Run: .venv/bin/python scripts/fixtures_optim.py   (needs torch, transformers, safetensors)
"""
import os

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "optim_adamw.safetensors")
N, T = 37, 6

CASES = {
    "nowd": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd=0.0, max_norm=None, sched=None),
    "wd": dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, wd=0.1, max_norm=None, sched=None),
    "clip": dict(lr=5e-3, betas=(0.9, 0.999), eps=1e-8, wd=1e-4, max_norm=1.0, sched=None),
    "cos": dict(lr=2e-2, betas=(0.9, 0.999), eps=1e-8, wd=1e-2, max_norm=0.5, sched=(2, 6)),
}
# per-step gradient scale: the clip cases see norms both above and below max_norm
SCALES = [3.0, 0.05, 1.5, 0.02, 4.0, 0.3]


def run(name, c, gen):
    p0 = torch.randn(N, generator=gen, dtype=torch.float32)
    grads = torch.stack([torch.randn(N, generator=gen, dtype=torch.float32) * s for s in SCALES])
    grads[2, 5] = 0.0  # an exact zero gradient element
    param = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([param], lr=c["lr"], betas=c["betas"], eps=c["eps"], weight_decay=c["wd"],
                            foreach=False, fused=False)
    sched = None
    if c["sched"]:
        from transformers import get_cosine_schedule_with_warmup
        sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=c["sched"][0], num_training_steps=c["sched"][1])
    ps, norms, lrs = [], [], []
    for t in range(T):
        opt.zero_grad()
        param.grad = grads[t].clone()
        if c["max_norm"] is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_([param], c["max_norm"])))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched:
            sched.step()
        ps.append(param.detach().clone())
    out = {f"{name}.p0": p0, f"{name}.grads": grads, f"{name}.p": torch.stack(ps)}
    if norms:
        out[f"{name}.norm"] = torch.tensor(norms, dtype=torch.float32)
    if sched:
        out[f"{name}.lr"] = torch.tensor(lrs, dtype=torch.float32)
    return out


def main():
    gen = torch.Generator().manual_seed(1234)
    tensors = {}
    for name, c in CASES.items():
        tensors.update(run(name, c, gen))
    save_file({k: v.contiguous() for k, v in tensors.items()}, OUT,
              metadata={"generator": "scripts/fixtures_optim.py", "torch": torch.__version__})
    print("wrote", os.path.normpath(OUT), len(tensors), "tensors")


if __name__ == "__main__":
    main()
