#!/usr/bin/env python3
"""scripts/fixtures_i2v.py — one whole denoising loop of a tiny Wan 2.2 TI2V pipeline (image to video with first-frame
conditioning) for tests/test_i2v.c.

Reference: diffusers 0.42.1 WanImageToVideoPipeline(expand_timesteps=True) (pipelines/wan/pipeline_wan_i2v.py): the
image preprocessed by VideoProcessor (PIL at the target size: x / 255 in float32, then 2 x - 1), encoded alone as one
frame (AutoencoderKLWan.encode(...).latent_dist.mode(), normalised (z - latents_mean) * (1 / latents_std)); every step
the model input (1 - m) * condition + m * latents and per-token timesteps m * t with the first-frame mask m; CFG;
FlowMatchEulerDiscreteScheduler.step (Euler: the ODE, eta 0); at the end frame 0 replaced by the condition.

Models (existing fixture folders, not rewritten; run "wan" and "vae" first):
  wan_ti2v48/   WanTransformer3DModel, 48 channels in and out, text_dim 16, patch (1, 2, 2)
  vae_wan22/    AutoencoderKLWan, Wan 2.2 style (z_dim 48, patch_size 2, spatial factor 16), encoder and decoder
Writes tests/fixtures/i2v_ti2v48_io.safetensors:
  image            U8  [H, W, 3]            the input image, already at the pipeline's size (no resampling: PIL's
                                            Lanczos resize of an image to its own size is a copy)
  prompt_embeds    F32 [1, L, 16]           prompt_embeds given to the pipeline (no text encoder)
  negative_embeds  F32 [1, L, 16]
  noise            F32 [1, 48, T, h, w]     the pipeline's `latents` argument (the initial noise)
  condition        F32 [1, 48, 1, h, w]     the normalised latent of the image (prepare_latents' latent_condition)
  step_latents     F32 [N, 48, T, h, w]     the scheduler's latents after each step (frame 0 drifts in diffusers and
                                            is overwritten at the end: compare frames 1 .. T-1)
  latents          F32 [1, 48, T, h, w]     the pipeline's output with output_type="latent" (frame 0 = condition)
  video_first      F32 [3, H, W]            frame 0 of vae.decode(latents / (1 / latents_std) + latents_mean), the
                                            first decoded frame (in [-1, 1], not clamped)
  cond_first       F32 [3, H, W]            frame 0 of vae.decode of the condition alone (one latent frame)
metadata: steps, shift, guidance_scale, frames, height, width (strings).

Wan 2.2 I2V-A14B (WanImageToVideoPipeline without expand_timesteps, two experts; main_a14b):
  the condition video [image, zeros x (frames - 1)] encoded by the VAE and normalised, the 4-channel mask (frame 0
  repeated 4 times, regrouped by 4: 1 on latent frame 0, 0 elsewhere), every step's model input
  cat(latents 16, mask 4, condition 16) = 36 channels with the scalar timestep, CFG with guidance_scale (high noise,
  t >= boundary_ratio x 1000: transformer) and guidance_scale_2 (low noise: transformer_2), Euler steps over all
  frames. Models written here (small, random: gen_fixtures.wan_random_state):
  i2v_a14b36/transformer, i2v_a14b36/transformer_2   WanTransformer3DModel, 36 in, 16 out, text_dim 16
  and vae_wan21/ (existing: Wan 2.1 style, z_dim 16, spatial factor 8, encoder and decoder).
Writes tests/fixtures/i2v_a14b36_io.safetensors:
  image            U8  [H, W, 3]            the input image at the pipeline's size
  prompt_embeds, negative_embeds  F32 [1, L, 16]
  noise            F32 [1, 16, T, h, w]     the initial latents
  condition        F32 [1, 20, T, h, w]     prepare_latents' condition: cat(mask 4, normalised condition latents 16)
  step_latents     F32 [N, 16, T, h, w]     the scheduler's latents after each step
  latents          F32 [1, 16, T, h, w]     the output (output_type="latent")
metadata: steps, shift, guidance_scale, guidance_scale_2, boundary_ratio, frames, height, width.

Run: .venv/bin/python scripts/fixtures_i2v.py   (or gen_fixtures.py i2v; CI never runs it)
"""
import os

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "tests", "fixtures")

STEPS, SHIFT, GUIDANCE = 4, 3.0, 3.0
FRAMES, HEIGHT, WIDTH, L = 9, 64, 96, 6
SEED = 19


def main():
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline, WanTransformer3DModel
    from PIL import Image
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    tr = WanTransformer3DModel.from_pretrained(os.path.join(FIX, "wan_ti2v48")).eval()
    vae = AutoencoderKLWan.from_pretrained(os.path.join(FIX, "vae_wan22")).eval()
    sched = FlowMatchEulerDiscreteScheduler(shift=SHIFT)
    pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=sched, transformer=tr,
                                   expand_timesteps=True)
    g = torch.Generator().manual_seed(SEED)
    img = torch.randint(0, 256, (HEIGHT, WIDTH, 3), generator=g, dtype=torch.uint8)
    td = tr.config.text_dim
    pe = torch.randn(1, L, td, generator=g)
    ne = torch.randn(1, L, td, generator=g)
    T = (FRAMES - 1) // 4 + 1
    h, w = HEIGHT // 16, WIDTH // 16
    noise = torch.randn(1, vae.config.z_dim, T, h, w, generator=g)

    captured = {}
    orig = pipe.prepare_latents

    def prepare(*a, **k):
        out = orig(*a, **k)
        captured["condition"] = out[1].clone()
        return out

    pipe.prepare_latents = prepare
    steps = []

    def on_step(p, i, t, kw):
        steps.append(kw["latents"].clone())
        return {}

    with torch.no_grad():
        out = pipe(image=Image.fromarray(img.numpy()), prompt_embeds=pe, negative_prompt_embeds=ne, height=HEIGHT,
                   width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=GUIDANCE, latents=noise,
                   output_type="latent", callback_on_step_end=on_step).frames
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        video = vae.decode(out / inv_std + mean, return_dict=False)[0]
        cvideo = vae.decode(captured["condition"] / inv_std + mean, return_dict=False)[0]
    cond = captured["condition"]
    assert torch.equal(out[:, :, :1], cond), "frame 0 of the output is not the condition"
    print(f"i2v_ti2v48: latents {tuple(out.shape)}, first decoded frame vs the condition's decode: max |d| = "
          f"{(video[0, :, 0] - cvideo[0, :, 0]).abs().max().item():.3g}")
    tensors = {
        "image": img.contiguous(), "prompt_embeds": pe.contiguous(), "negative_embeds": ne.contiguous(),
        "noise": noise.contiguous(), "condition": cond.contiguous(),
        "step_latents": torch.cat(steps).contiguous(), "latents": out.contiguous(),
        "video_first": video[0, :, 0].contiguous(), "cond_first": cvideo[0, :, 0].contiguous(),
    }
    meta = {"steps": str(STEPS), "shift": str(SHIFT), "guidance_scale": str(GUIDANCE), "frames": str(FRAMES),
            "height": str(HEIGHT), "width": str(WIDTH)}
    save_file({k: v for k, v in tensors.items()}, os.path.join(FIX, "i2v_ti2v48_io.safetensors"), metadata=meta)
    np.set_printoptions(precision=4)


A14B_STEPS, A14B_SHIFT, A14B_G, A14B_G2, A14B_BOUNDARY = 4, 3.0, 3.0, 2.0, 0.875
A14B_FRAMES, A14B_HEIGHT, A14B_WIDTH = 9, 32, 48
A14B_CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=18, in_channels=36,
                   out_channels=16, text_dim=16, freq_dim=64, ffn_dim=24, num_layers=2, cross_attn_norm=True,
                   qk_norm="rms_norm_across_heads", rope_max_seq_len=1024)


def main_a14b():
    import sys

    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline, WanTransformer3DModel
    from PIL import Image
    from safetensors.torch import save_file

    sys.path.insert(0, HERE)
    from gen_fixtures import wan_random_state

    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED + 1)
    experts = []
    for name in ("transformer", "transformer_2"):
        tr = WanTransformer3DModel(**A14B_CONFIG)
        tr.load_state_dict(wan_random_state(tr, g), strict=True)
        tr = tr.float().eval()
        tr.save_pretrained(os.path.join(FIX, "i2v_a14b36", name), safe_serialization=True)
        experts.append(tr)
    vae = AutoencoderKLWan.from_pretrained(os.path.join(FIX, "vae_wan21")).eval()
    sched = FlowMatchEulerDiscreteScheduler(shift=A14B_SHIFT)
    pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=sched,
                                   transformer=experts[0], transformer_2=experts[1], boundary_ratio=A14B_BOUNDARY,
                                   expand_timesteps=False)
    img = torch.randint(0, 256, (A14B_HEIGHT, A14B_WIDTH, 3), generator=g, dtype=torch.uint8)
    td = A14B_CONFIG["text_dim"]
    pe = torch.randn(1, L, td, generator=g)
    ne = torch.randn(1, L, td, generator=g)
    T = (A14B_FRAMES - 1) // 4 + 1
    h, w = A14B_HEIGHT // 8, A14B_WIDTH // 8
    noise = torch.randn(1, vae.config.z_dim, T, h, w, generator=g)
    captured = {}
    orig = pipe.prepare_latents

    def prepare(*a, **k):
        out = orig(*a, **k)
        captured["condition"] = out[1].clone()
        return out

    pipe.prepare_latents = prepare
    steps = []

    def on_step(p, i, t, kw):
        steps.append(kw["latents"].clone())
        return {}

    with torch.no_grad():
        out = pipe(image=Image.fromarray(img.numpy()), prompt_embeds=pe, negative_prompt_embeds=ne,
                   height=A14B_HEIGHT, width=A14B_WIDTH, num_frames=A14B_FRAMES, num_inference_steps=A14B_STEPS,
                   guidance_scale=A14B_G, guidance_scale_2=A14B_G2, latents=noise, output_type="latent",
                   callback_on_step_end=on_step).frames
    cond = captured["condition"]
    assert cond.shape == (1, 20, T, h, w), cond.shape
    assert torch.equal(cond[:, :4, 0], torch.ones_like(cond[:, :4, 0])) and not cond[:, :4, 1:].any()
    print(f"i2v_a14b36: latents {tuple(out.shape)}, condition {tuple(cond.shape)}")
    tensors = {"image": img.contiguous(), "prompt_embeds": pe.contiguous(), "negative_embeds": ne.contiguous(),
               "noise": noise.contiguous(), "condition": cond.contiguous(),
               "step_latents": torch.cat(steps).contiguous(), "latents": out.contiguous()}
    meta = {"steps": str(A14B_STEPS), "shift": str(A14B_SHIFT), "guidance_scale": str(A14B_G),
            "guidance_scale_2": str(A14B_G2), "boundary_ratio": str(A14B_BOUNDARY), "frames": str(A14B_FRAMES),
            "height": str(A14B_HEIGHT), "width": str(A14B_WIDTH)}
    save_file(tensors, os.path.join(FIX, "i2v_a14b36_io.safetensors"), metadata=meta)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["a14b"]:
        main()
    main_a14b()
