#!/usr/bin/env python3
"""scripts/bench_torch.py — PyTorch CPU eager timing of diffusers' WanTransformerBlock on the shapes of
`vgrpo bench dit`, for comparison (DESIGN.md section 9: vgrpo's figure beside PyTorch's on the same machine).

    .venv/bin/python scripts/bench_torch.py [--threads N] [--quick]

(venv: python3 -m venv .venv && .venv/bin/pip install -r scripts/requirements-fixtures.txt)
Shapes, FLOP count and the median-of-runs method are those of cli/bench_dit.c: one block, batch 1,
forward = 12*S*D^2 + 4*S^2*D + 4*S*L*D + 4*L*D^2 + 4*S*D*F FLOPs, forward+backward = 3x. Forward runs under
torch.no_grad(); forward+backward computes the gradients of every parameter and of the block input, in fp32.
"""
import argparse
import statistics
import time

import torch

SHAPES = [  # name, heads, head_dim, ffn, latent F, H, W, text tokens
    ("wan2.1-1.3b block", 12, 128, 8960, 1, 60, 104, 512),
    ("tiny block", 4, 32, 256, 3, 16, 16, 32),
]


def timed(fn, reps):
    fn()  # warm-up
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return statistics.median(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed, WanTransformerBlock

    reps = 1 if args.quick else 3
    torch.manual_seed(0)
    a, b = torch.randn(1560, 1536), torch.randn(1536, 1536)
    mm = timed(lambda: torch.mm(a, b.t()), reps)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"torch.mm 1560x1536x1536: {2 * 1560 * 1536 * 1536 / mm * 1e-9:.1f} GFLOP/s\n")
    print(f"{'shape':18s} {'S':>6s} {'L':>5s} {'D':>5s} {'FFN':>6s} | {'fwd ms':>9s} {'GFLOP/s':>8s} | "
          f"{'f+b ms':>9s} {'GFLOP/s':>8s}")
    for name, heads, hd, ffn, F, H, W, L in SHAPES:
        if args.quick and name.startswith("wan2.1"):
            continue
        D = heads * hd
        S = F * (H // 2) * (W // 2)
        block = WanTransformerBlock(D, ffn, heads, "rms_norm_across_heads", True, 1e-6).float()
        rope = WanRotaryPosEmbed(hd, (1, 2, 2), 1024)
        rot = rope(torch.zeros(1, 16, F, H, W))
        x = torch.randn(1, S, D)
        ctx = torch.randn(1, L, D)
        temb = torch.randn(1, 6, D)
        g = torch.randn(1, S, D)

        def fwd():
            with torch.no_grad():
                block(x, ctx, temb, rot)

        def train():
            block.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_(True)
            (block(xi, ctx, temb, rot) * g).sum().backward()

        flop = 12 * S * D * D + 4 * S * S * D + 4 * S * L * D + 4 * L * D * D + 4 * S * D * ffn
        tf, tt = timed(fwd, reps), timed(train, reps)
        print(f"{name:18s} {S:6d} {L:5d} {D:5d} {ffn:6d} | {tf * 1e3:9.2f} {flop / tf * 1e-9:8.1f} | "
              f"{tt * 1e3:9.2f} {3 * flop / tt * 1e-9:8.1f}")


if __name__ == "__main__":
    main()
