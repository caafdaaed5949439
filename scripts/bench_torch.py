#!/usr/bin/env python3
"""scripts/bench_torch.py — PyTorch CPU eager timing of diffusers' WanTransformerBlock on the shapes of
`vgrpo bench dit`, for comparison (docs/design.md section 9: vgrpo's figure beside PyTorch's on the same machine).

    .venv/bin/python scripts/bench_torch.py [--threads N] [--quick]           # vgrpo bench dit
    .venv/bin/python scripts/bench_torch.py --vae [--threads N] [--quick]     # vgrpo bench vae
    .venv/bin/python scripts/bench_torch.py --umt5 [--threads N] [--quick]    # vgrpo bench umt5
    .venv/bin/python scripts/bench_torch.py --clip DIR [--batch B] [--reps N] [--tower T] [--threads N]
                                                                              # vgrpo bench clip

--json FILE also records the figures in FILE (merged into what it holds), which `vgrpo bench dit|umt5|vae --torch
FILE` prints beside its own (`make bench-compare` runs both in one window).

--vae: diffusers AutoencoderKLWan (its default config = the Wan 2.1 VAE, random init), `decode(latents).sample`
of latents [1, 16, 1, 60, 104] -> [1, 3, 1, 480, 832] under torch.no_grad(); seconds per frame and the process's
peak RSS (with the RSS before building the model, PyTorch's own baseline). The encoder is dropped after
construction (decode never uses it), so the weights held are the decoder's, as in vgrpo.
--umt5: transformers UMT5EncoderModel (vocab 32128, d_model 512, 4 layers, 8 heads, d_kv 64, d_ff 1024,
gated-gelu, random init, eval mode) on one prompt of 512 random ids with an all-ones attention mask; ms.
Median of 3 (VAE) / 5 (umT5) runs after one warm-up run; --quick: one run (the VAE without warm-up), as the C side.
--clip DIR: the CLIP folder `vgrpo bench clip --model DIR` times, loaded as transformers CLIPModel (config.json) or
open_clip CLIP (open_clip_config.json + its one .safetensors), eval mode, fp32, under torch.no_grad():
get_image_features / encode_image of B images [B, 3, H, W] and get_text_features / encode_text of B prompts of
min(77, positions) ids, as bench/bench_clip.c (its inputs and FLOP count); median of --reps calls (default 3) after
one warm-up call; recorded as clip.image / clip.text {ms, batch}.

(venv: python3 -m venv .venv && .venv/bin/pip install -r scripts/requirements-fixtures.txt)
Shapes, FLOP count and the median-of-runs method are those of bench/bench_dit.c: one block, batch 1,
forward = 12*S*D^2 + 4*S^2*D + 4*S*L*D + 4*L*D^2 + 4*S*D*F FLOPs, forward+backward = 3x. Forward runs under
torch.no_grad(); forward+backward computes the gradients of every parameter and of the block input, in fp32.
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch

SHAPES = [  # name, heads, head_dim, ffn, latent F, H, W, text tokens
    ("wan2.1-1.3b block", 12, 128, 8960, 1, 60, 104, 512),
    ("tiny block", 4, 32, 256, 3, 16, 16, 32),
]


JSON_OUT = None  # --json FILE


def record(section, key, **figures):
    """Merges figures into JSON_OUT[section][key] (no-op without --json)."""
    if not JSON_OUT:
        return
    data = {}
    if os.path.exists(JSON_OUT):
        with open(JSON_OUT) as f:
            data = json.load(f)
    data.setdefault(section, {}).setdefault(key, {}).update(figures)
    data["torch"] = torch.__version__
    data["threads"] = torch.get_num_threads()
    with open(JSON_OUT + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(JSON_OUT + ".tmp", JSON_OUT)


def timed(fn, reps):
    fn()  # warm-up
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return statistics.median(t)


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def bench_vae(quick):
    from diffusers import AutoencoderKLWan

    base = rss_mib()
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                           temperal_downsample=[False, True, True]).float().eval()
    vae.encoder = None  # decode never uses it
    nparams = sum(p.numel() for p in vae.parameters())
    z = torch.randn(1, 16, 1, 60, 104)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; diffusers AutoencoderKLWan (Wan 2.1 "
          f"config, random init), decoder + post_quant_conv {nparams * 1e-6:.1f} M parameters")
    out = []

    def run():
        with torch.no_grad():
            out[:] = [vae.decode(z).sample]

    reps = 1 if quick else 3
    t = []
    if not quick:
        run()
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        t.append(time.perf_counter() - t0)
    v = out[0]
    F = v.shape[2]
    print(f"latents {list(z.shape)} -> video {list(v.shape)}; "
          f"{'one timed run (no warm-up)' if quick else 'median of 3 runs after one warm-up run'}\n")
    print(f"{'':34s} {'s / frame':>12s} {'weights MiB':>12s} {'base RSS MiB':>12s} {'peak RSS MiB':>12s}")
    print(f"{'torch AutoencoderKLWan.decode':34s} {statistics.median(t) / F:12.2f} {nparams * 4 / 2**20:12.1f} "
          f"{base:12.1f} {rss_mib():12.1f}")
    record("vae", "decode", s_per_frame=statistics.median(t) / F)


def bench_umt5(quick):
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = UMT5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=1024, num_layers=4, num_heads=8,
                     relative_attention_num_buckets=32, relative_attention_max_distance=128,
                     feed_forward_proj="gated-gelu", dropout_rate=0.0)
    torch.manual_seed(0)
    enc = UMT5EncoderModel(cfg).float().eval()
    ids = torch.randint(0, 32128, (1, 512))
    mask = torch.ones(1, 512, dtype=torch.long)

    def run():
        with torch.no_grad():
            enc(input_ids=ids, attention_mask=mask)

    t = timed(run, 1 if quick else 5)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; transformers UMT5EncoderModel "
          f"(vocab 32128, d_model 512, 4 layers, 8 heads, d_kv 64, d_ff 1024, gated-gelu; attention "
          f"{enc.config._attn_implementation}), random init")
    print(f"one prompt of 512 tokens (batch 1, mask all ones); "
          f"{'one timed run after one warm-up run' if quick else 'median of 5 runs after one warm-up run'}\n")
    print(f"{'':34s} {'ms':>10s} {'peak RSS MiB':>12s}")
    print(f"{'torch UMT5EncoderModel (512 tok)':34s} {t * 1e3:10.1f} {rss_mib():12.1f}")
    record("umt5", "encode", ms=t * 1e3)


def load_clip(d):
    """(encode_image, encode_text, image (h, w), positions, vocab, description) of a CLIP folder."""
    if os.path.exists(os.path.join(d, "config.json")):
        from transformers import CLIPModel
        m = CLIPModel.from_pretrained(d, torch_dtype=torch.float32).eval()
        vc, tc = m.config.vision_config, m.config.text_config

        def feats(o):
            return o.pooler_output if hasattr(o, "pooler_output") else o
        return (lambda x: feats(m.get_image_features(pixel_values=x)), lambda i: feats(m.get_text_features(input_ids=i)),
                (vc.image_size, vc.image_size), tc.max_position_embeddings, tc.vocab_size,
                f"transformers CLIPModel (attention {m.config._attn_implementation})")
    import glob

    import open_clip
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(d, "open_clip_config.json")))
    cfg = cfg.get("model_cfg", cfg)
    m = open_clip.model.CLIP(**cfg).eval()
    st = os.path.join(d, "open_clip_model.safetensors")
    if not os.path.exists(st):
        st = glob.glob(os.path.join(d, "*.safetensors"))[0]
    m.load_state_dict(load_file(st))
    size = cfg["vision_cfg"].get("image_size", 224)
    hw = (size, size) if isinstance(size, int) else tuple(size)
    return (m.encode_image, m.encode_text, hw, cfg["text_cfg"].get("context_length", 77),
            cfg["text_cfg"].get("vocab_size", 49408), f"open_clip {open_clip.__version__} CLIP")


def bench_clip(d, B, reps, tower):
    enc_img, enc_txt, (h, w), positions, vocab, desc = load_clip(d)
    S = min(77, positions)
    # the inputs of bench/bench_clip.c: pixels ((i * 2654435761) mod 4000) * 1e-3 - 2, ids as there
    i = torch.arange(B * 3 * h * w, dtype=torch.int64)
    px = ((i * 2654435761) % 4000).float().mul(1e-3).sub(2.0).view(B, 3, h, w)
    ids = torch.tensor([[(b * 131 + s * 7919) % (vocab - 1) for s in range(S - 1)] + [vocab - 1] for b in range(B)])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {desc} from {d}; batch {B}, median of "
          f"{reps} calls after one warm-up call\n")
    print(f"  {'tower':24s} {'batch':>6s} {'ms/call':>10s} {'items/s':>10s}")
    for name, fn, x in (("image", enc_img, px), ("text", enc_txt, ids)):
        if tower not in (name, "both"):
            continue
        with torch.no_grad():
            t = timed(lambda: fn(x), reps)
        print(f"  {name + ', PyTorch eager':24s} {B:6d} {t * 1e3:10.2f} {B / t:10.3f}   "
              f"({'images' if name == 'image' else 'texts'}/s)")
        record("clip", name, ms=t * 1e3, batch=B)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vae", action="store_true", help="time AutoencoderKLWan.decode (vgrpo bench vae)")
    ap.add_argument("--umt5", action="store_true", help="time UMT5EncoderModel (vgrpo bench umt5)")
    ap.add_argument("--clip", metavar="DIR", help="time a CLIP folder's towers (vgrpo bench clip --model DIR)")
    ap.add_argument("--batch", type=int, default=8, help="--clip: images and prompts per call (default 8)")
    ap.add_argument("--reps", type=int, default=3, help="--clip: timed calls after one warm-up call (default 3)")
    ap.add_argument("--tower", choices=("image", "text", "both"), default="both", help="--clip: the towers timed")
    ap.add_argument("--json", metavar="FILE", help="also record the figures in FILE (vgrpo bench ... --torch FILE)")
    args = ap.parse_args()
    global JSON_OUT
    JSON_OUT = args.json
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.vae:
        return bench_vae(args.quick)
    if args.umt5:
        return bench_umt5(args.quick)
    if args.clip:
        return bench_clip(args.clip, args.batch, args.reps, args.tower)
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
        record("dit", name, fwd_ms=tf * 1e3, fb_ms=tt * 1e3)


if __name__ == "__main__":
    main()
