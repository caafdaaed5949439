#!/usr/bin/env python3
"""scripts/fixtures_vae.py — reference values for the Wan VAE decoder (model/wan_vae*.c, tests/test_vae.c).

Reference: diffusers 0.42.1 AutoencoderKLWan (decode: post_quant_conv, the chunked WanDecoder3d loop with its feature
cache, unpatchify, clamp to [-1, 1]) and WanPipeline's un-normalisation (latents / (1 / latents_std) + latents_mean)
and VideoProcessor's mapping to uint8 ((x / 2 + 0.5).clamp(0, 1) * 255, rounded half to even as numpy does).

Writes, under tests/fixtures/:
  vae_wan21/        tiny random Wan 2.1-style VAE (z_dim 16, WanUpBlock, upsample3d / upsample2d), save_pretrained
  vae_wan22/        tiny random Wan 2.2-style VAE (z_dim 48, is_residual up-blocks with DupUp3D, patch_size 2)
  vae_<name>_io.safetensors, for T in {1, 2, 3} latent frames:
      latents_t<T>  F32 [B, z_dim, T, h, w]  (h != w; B = 2 for T = 2, else 1)
      video_t<T>    F32 [B, 3, 1 + 4 (T - 1), H, W]  = AutoencoderKLWan.decode(latents_t<T>).sample
      u8_t<T>       U8  [B, F, H, W, 3]  decode(latents * std + mean as WanPipeline writes it), mapped to uint8
The base dims differ between encoder (2) and decoder (6) so that decoder_base_dim is exercised; weights are drawn
wide (fan-in scaled normals, biases 0.3 N(0,1), RMS-norm gammas 1 + 0.3 N(0,1)) and latents_mean/std are random,
so a term left out cannot hide behind a zero or a one.

Run: .venv/bin/python scripts/fixtures_vae.py   (needs torch, diffusers, safetensors; CI never runs it)
"""
import math
import os

import torch

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")

CONFIGS = {
    "wan21": dict(cfg=dict(base_dim=2, decoder_base_dim=6, z_dim=16, dim_mult=[1, 1, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True, True]),
                  h=3, w=5, seed=11),
    "wan22": dict(cfg=dict(base_dim=2, decoder_base_dim=6, z_dim=48, dim_mult=[1, 1, 2, 2], num_res_blocks=1,
                           temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                           out_channels=12, patch_size=2, scale_factor_spatial=16),
                  h=2, w=3, seed=12),
}


def random_state(model, gen):
    sd = {}
    for name, p in model.state_dict().items():
        shape = tuple(p.shape)
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith(".gamma"):
            v = 1.0 + 0.3 * z
        elif name.endswith(".weight"):
            v = z / math.sqrt(math.prod(shape[1:]))
            if name.endswith("conv_out.weight"):
                v = 0.5 * v  # keep most of the decoded video inside the clamp range
        else:
            v = 0.3 * z
        sd[name] = v.contiguous()
    return sd


def fixture(name, spec):
    from diffusers import AutoencoderKLWan
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(spec["seed"])
    cfg = dict(spec["cfg"])
    z = cfg["z_dim"]
    cfg["latents_mean"] = [round(float(x), 4) for x in (0.5 * torch.randn(z, generator=gen))]
    cfg["latents_std"] = [round(float(x), 4) for x in (0.5 + torch.rand(z, generator=gen) * 2.0)]
    model = AutoencoderKLWan(**cfg)
    model.load_state_dict(random_state(model, gen), strict=True)
    model = model.float().eval()
    model.save_pretrained(os.path.join(FIX, f"vae_{name}"), safe_serialization=True)
    mean = torch.tensor(cfg["latents_mean"]).view(1, z, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(cfg["latents_std"]).view(1, z, 1, 1, 1)
    io = {}
    for T in (1, 2, 3):
        B = 2 if T == 2 else 1
        lat = torch.randn((B, z, T, spec["h"], spec["w"]), generator=gen)
        with torch.no_grad():
            video = model.decode(lat).sample
            v2 = model.decode(lat / inv_std + mean).sample
        u8 = ((v2 / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1)
        io[f"latents_t{T}"] = lat.contiguous()
        io[f"video_t{T}"] = video.contiguous()
        io[f"u8_t{T}"] = u8.contiguous()
        clamped = (video.abs() >= 1).float().mean().item()
        print(f"vae_{name} T={T}: video {tuple(video.shape)}, std {video.std().item():.3f}, clamped {clamped:.2%}")
    save_file(io, os.path.join(FIX, f"vae_{name}_io.safetensors"))


if __name__ == "__main__":
    os.makedirs(FIX, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    for n, s in CONFIGS.items():
        fixture(n, s)
