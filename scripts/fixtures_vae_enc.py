#!/usr/bin/env python3
"""scripts/fixtures_vae_enc.py — reference values for the Wan VAE encoder (model/vae/wan_vae_encode.*,
tests/test_vae_encode.c).

Reference: diffusers 0.42.1 AutoencoderKLWan.encode(video).latent_dist.mode() (patchify, WanEncoder3d on the first
frame alone then on chunks of 4 frames with its feature cache, quant_conv, the mean half of the diagonal Gaussian),
WanImageToVideoPipeline.prepare_latents' normalisation (z - latents_mean) * (1 / latents_std), and
VideoProcessor.preprocess_video for uint8 frames (PIL images: x / 255 in float32, then 2 x - 1).

Models:
  vae_wan21/, vae_wan22/   the decoder fixtures' folders (scripts/fixtures_vae.py; run "vae" first): their encoders
                           (base_dim 2, dim_mult [1, 1, 2, 2], one res block; Wan 2.1 style, and Wan 2.2 style with
                           residual down-blocks and patch_size 2) are loaded with from_pretrained, not rewritten.
  vae_enc21/, vae_enc22/   encoder-only folders (config.json + encoder.* and quant_conv.* tensors, no decoder):
                           enc21: Wan 2.1 style, 3 levels (dim_mult [1, 2, 2]), two res blocks per level,
                           temperal_downsample [True, True] (temporal down-sampling at full resolution), z_dim 4;
                           enc22: Wan 2.2 style (residual, patch_size 2), two res blocks, temperal_downsample
                           [True, True, False], z_dim 8.
Writes vae_<name>_enc_io.safetensors, for each frame count F of the config (1 + 4 k):
  video_f<F>   F16 [B, 3, F, H, W]  uniform in [-1, 1] (stored as F16, the values the model sees; H != W)
  mode_f<F>    F32 [B, z, T, h, w]  AutoencoderKLWan.encode(video).latent_dist.mode(), T = 1 + (F - 1) / 4
  latents_f<F> F32 [B, z, T, h, w]  (mode - latents_mean) * (1 / latents_std)
and once per file:
  u8_video     U8  [1, 5, H, W, 3]  random RGB frames
  u8_mode      F32 [1, z, 2, h, w]  encode(VideoProcessor().preprocess_video(PIL frames)).latent_dist.mode()
B is 2 for F = 5, else 1. Weights of the new folders are drawn as in fixtures_vae.py (fan-in scaled normals, biases
0.3 N(0, 1), RMS-norm gammas 1 + 0.3 N(0, 1)); latents_mean / latents_std random.

Run: .venv/bin/python scripts/fixtures_vae_enc.py   (or gen_fixtures.py vae_enc; needs torch, diffusers, safetensors,
PIL; CI never runs it)

Timing and full-size parity (nothing committed):
  .venv/bin/python scripts/fixtures_vae_enc.py --bench DIR [H W]
writes DIR/wan21/ and DIR/wan22/ (encoder-only folders with the released Wan 2.1 / Wan 2.2 VAE architectures:
base_dim 96 / 160, dim_mult [1, 2, 4, 4], two res blocks; PyTorch's default initialisation, seed 0), DIR/video_f1 and
DIR/video_f5.safetensors (`video` [1, 3, F, H, W], default 128 x 128) and DIR/<name>_ref_f<F>.safetensors (`latents`:
diffusers' mode), printing PyTorch's encode time on 2 threads. Then, for instance:
  OMP_NUM_THREADS=2 build/vgrpo vae-encode --vae DIR/wan21 --video DIR/video_f5.safetensors --out DIR/out.safetensors
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "tests", "fixtures")
sys.path.insert(0, HERE)
from fixtures_vae import random_state  # noqa: E402  (same weight distribution as the decoder fixtures)

# name: folder (existing or new), new-model config (None: load the folder), video size, frame counts, seed
CASES = {
    "wan21": dict(cfg=None, H=24, W=40, frames=(1, 5, 9), seed=21),
    "wan22": dict(cfg=None, H=32, W=48, frames=(1, 5, 9), seed=22),
    "enc21": dict(cfg=dict(base_dim=3, decoder_base_dim=2, z_dim=4, dim_mult=[1, 2, 2], num_res_blocks=2,
                           temperal_downsample=[True, True], scale_factor_spatial=4),
                  H=12, W=20, frames=(1, 5, 13), seed=23),
    "enc22": dict(cfg=dict(base_dim=4, decoder_base_dim=2, z_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=2,
                           temperal_downsample=[True, True, False], is_residual=True, in_channels=12,
                           out_channels=12, patch_size=2, scale_factor_spatial=16),
                  H=16, W=48, frames=(1, 5, 9), seed=24),
}


def make_model(name, spec, gen):
    from diffusers import AutoencoderKLWan
    from safetensors.torch import save_file

    folder = os.path.join(FIX, f"vae_{name}")
    if spec["cfg"] is None:
        return AutoencoderKLWan.from_pretrained(folder).float().eval()
    cfg = dict(spec["cfg"])
    z = cfg["z_dim"]
    cfg["latents_mean"] = [round(float(x), 4) for x in (0.5 * torch.randn(z, generator=gen))]
    cfg["latents_std"] = [round(float(x), 4) for x in (0.5 + torch.rand(z, generator=gen) * 2.0)]
    model = AutoencoderKLWan(**cfg)
    model.load_state_dict(random_state(model, gen), strict=True)
    model = model.float().eval()
    # encoder-only folder: the config diffusers writes, and only the tensors the encoder path needs
    os.makedirs(folder, exist_ok=True)
    model.save_config(folder)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()
          if k.startswith("encoder.") or k.startswith("quant_conv.")}
    save_file(sd, os.path.join(folder, "diffusion_pytorch_model.safetensors"))
    return model


def u8_case(model, vp, gen, H, W):
    from PIL import Image

    u8 = torch.randint(0, 256, (1, 5, H, W, 3), generator=gen, dtype=torch.uint8)
    frames = [Image.fromarray(f.numpy()) for f in u8[0]]
    video = vp.preprocess_video([frames], height=H, width=W)
    manual = 2.0 * torch.from_numpy(u8.numpy().astype(np.float32) / 255.0) - 1.0
    assert torch.equal(video, manual.permute(0, 4, 1, 2, 3)), "preprocess_video is not 2 (u8 / 255) - 1"
    with torch.no_grad():
        mode = model.encode(video).latent_dist.mode()
    return u8.contiguous(), mode.contiguous()


def fixture(name, spec):
    from diffusers.video_processor import VideoProcessor
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(spec["seed"])
    model = make_model(name, spec, gen)
    cfg = model.config
    z = cfg.z_dim
    mean = torch.tensor(cfg.latents_mean).view(1, z, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, z, 1, 1, 1)
    H, W = spec["H"], spec["W"]
    io = {}
    for F in spec["frames"]:
        B = 2 if F == 5 else 1
        video = (torch.rand((B, 3, F, H, W), generator=gen) * 2 - 1).half()
        with torch.no_grad():
            mode = model.encode(video.float()).latent_dist.mode()
        io[f"video_f{F}"] = video.contiguous()
        io[f"mode_f{F}"] = mode.contiguous()
        io[f"latents_f{F}"] = ((mode - mean) * inv_std).contiguous()
        print(f"vae_{name} F={F}: latents {tuple(mode.shape)}, std {mode.std().item():.3f}, "
              f"max|.| {mode.abs().max().item():.3f}")
    io["u8_video"], io["u8_mode"] = u8_case(model, VideoProcessor(vae_scale_factor=1), gen, H, W)
    save_file(io, os.path.join(FIX, f"vae_{name}_enc_io.safetensors"))


BENCH = {"wan21": dict(),
         "wan22": dict(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, in_channels=12,
                       out_channels=12, patch_size=2, scale_factor_spatial=16, latents_mean=[0.0] * 48,
                       latents_std=[1.0] * 48)}


def bench(out, H=128, W=128):
    import time

    from diffusers import AutoencoderKLWan
    from safetensors.torch import save_file

    torch.manual_seed(0)
    torch.set_num_threads(2)
    os.makedirs(out, exist_ok=True)
    videos = {F: torch.rand(1, 3, F, H, W) * 2 - 1 for F in (1, 5)}
    for F, x in videos.items():
        save_file({"video": x.contiguous()}, os.path.join(out, f"video_f{F}.safetensors"))
    for name, cfg in BENCH.items():
        model = AutoencoderKLWan(**cfg).float().eval()
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        model.save_config(folder)
        sd = {k: v.contiguous() for k, v in model.state_dict().items()
              if k.startswith("encoder.") or k.startswith("quant_conv.")}
        save_file(sd, os.path.join(folder, "diffusion_pytorch_model.safetensors"))
        for F, x in videos.items():
            with torch.no_grad():
                t = time.time()
                mode = model.encode(x).latent_dist.mode()
                dt = time.time() - t
            save_file({"latents": mode.contiguous()}, os.path.join(out, f"{name}_ref_f{F}.safetensors"))
            print(f"{name} F={F} {H}x{W}: PyTorch encode {dt:.2f} s on 2 threads, latents {tuple(mode.shape)}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--bench":
        bench(sys.argv[2], *[int(a) for a in sys.argv[3:5]])
        sys.exit(0)
    torch.use_deterministic_algorithms(True)
    for n, s in CASES.items():
        fixture(n, s)
