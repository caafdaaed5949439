#!/usr/bin/env python3
"""scripts/gen_fixtures.py — parity fixtures for vgrpo's C tests, made with the reference implementations.

Set-up (once; CI never runs this script, the fixtures it writes are committed):
    python3 -m venv .venv && .venv/bin/pip install -r scripts/requirements-fixtures.txt
Run from the repository root:
    .venv/bin/python scripts/gen_fixtures.py            # every generator
    .venv/bin/python scripts/gen_fixtures.py wan        # only the Wan transformer fixtures
    .venv/bin/python scripts/gen_fixtures.py flow optim safetensors   # the others (scripts/fixtures_<name>.py)
    .venv/bin/python scripts/gen_fixtures.py algo       # cps step and GRPO-Guard loss (numpy only)
    .venv/bin/python scripts/gen_fixtures.py nft        # DiffusionNFT's loss and its gradient (torch, float64)
    .venv/bin/python scripts/gen_fixtures.py dpo        # Flow-DPO's loss and its gradients (torch, float64)
    .venv/bin/python scripts/gen_fixtures.py i2v        # a TI2V denoising loop (after wan and vae: their folders)
    .venv/bin/python scripts/gen_fixtures.py clip_text clip_image   # CLIP tokenizer ids and image preprocessing
    .venv/bin/python scripts/gen_fixtures.py clip       # CLIP towers (transformers, open_clip) and the aesthetic MLP
    VGRPO_BIN=build/vgrpo .venv/bin/python scripts/gen_fixtures.py clip_score   # the learned scorers' rewards
    VGRPO_BIN=build/vgrpo .venv/bin/python scripts/gen_fixtures.py lora   # LoRA (runs vgrpo init-model/export)
    .venv/bin/python scripts/gen_fixtures.py check-wan-load DIR [IN.safetensors [OUT.safetensors]]
        loads DIR (a transformer folder vgrpo wrote) with diffusers' WanTransformer3DModel.from_pretrained, and with
        IN (inputs as `vgrpo dit-forward` takes them) compares diffusers' forward with `output` from OUT (default:
        from IN, as in a fixture's _io file); exits non-zero when max|a-b|/max|b| > 1e-5.

Wan transformer (diffusers 0.42.1 WanTransformer3DModel), written under tests/fixtures/:
  wan_<name>/                      the random model in diffusers layout (save_pretrained: config.json + F32 weights)
  wan_<name>_io.safetensors        inputs (hidden_states, timestep, encoder_hidden_states, grad_output), the output,
                                   and the gradients of sum(output * grad_output) w.r.t. the inputs
                                   (grad_hidden_states, grad_encoder_hidden_states) and every parameter
                                   (grad.<parameter name>), all float32 autograd on CPU.
  wan_difftest_bf16/               wan_difftest's weights saved as BF16; wan_difftest_io.safetensors also holds
                                   output_bf16_weights: the fp32 forward with the bf16-rounded weights.
  wan_multihead_sharded/           wan_multihead saved as two shards + diffusion_pytorch_model.safetensors.index.json
  wan_names_<preset>.txt           every tensor name and shape of a preset's transformer, in state_dict order,
                                   from the model built on the meta device (no weights).
The random weights are wide on purpose (fan-in scaled normals, non-zero biases, norm weights away from 1 and
non-zero scale_shift_tables) so that a term left out in the C model cannot hide behind a zero.
"""
import json
import math
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures")

# ------------------------------------------------------------------------------------------------------------------
# Wan transformer

# Small configs for parity. difftest is diffusers' own unit-test config (tests/models/transformers/
# test_models_transformer_wan.py); multihead: 3 heads, F=3, H != W, batch 2, out != in channels, no cross-attn norm,
# eps 1e-5; ti2v48: 48 channels and per-token timesteps (Wan 2.2 TI2V's expand_timesteps).
WAN_CONFIGS = {
    "difftest": dict(
        config=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                    text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", rope_max_seq_len=32),
        B=1, F=2, H=16, W=16, L=12, timestep="int", seed=1),
    "multihead": dict(
        config=dict(patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=12, in_channels=4, out_channels=6,
                    text_dim=20, freq_dim=32, ffn_dim=40, num_layers=2, cross_attn_norm=False,
                    qk_norm="rms_norm_across_heads", eps=1e-5, rope_max_seq_len=16),
        B=2, F=3, H=8, W=12, L=7, timestep="float", seed=2),
    "ti2v48": dict(
        config=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=18, in_channels=48,
                    out_channels=48, text_dim=16, freq_dim=64, ffn_dim=24, num_layers=2, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", rope_max_seq_len=1024),
        B=2, F=2, H=4, W=6, L=5, timestep="per_token", seed=3),
}

# The presets of `vgrpo init-model` (model/dit/wan_config.c holds the same values; the name lists check them).
# Real ones follow the official Wan-AI/*-Diffusers transformer/config.json files.
WAN_PRESETS = {
    "tiny": dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=16, out_channels=16,
                 text_dim=64, freq_dim=256, ffn_dim=256, num_layers=2, cross_attn_norm=True,
                 qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
    "tiny-ti2v": dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=16,
                      out_channels=16, text_dim=64, freq_dim=256, ffn_dim=256, num_layers=2, cross_attn_norm=True,
                      qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
    "tiny-i2v": dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=36,
                     out_channels=16, text_dim=64, freq_dim=256, ffn_dim=256, num_layers=2, cross_attn_norm=True,
                     qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
    "wan2.1-t2v-1.3b": dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                            out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30,
                            cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
    "wan2.2-ti2v-5b": dict(patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128, in_channels=48,
                           out_channels=48, text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=30,
                           cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
    "wan2.2-t2v-a14b": dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                            out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                            cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
    # Wan-AI/Wan2.2-I2V-A14B-Diffusers: latents 16 + mask 4 + condition latents 16 in, 16 out; image_dim None
    "wan2.2-i2v-a14b": dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=36,
                            out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                            cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
}


def wan_random_state(model, gen):
    """Wide random weights in the model's own names and shapes (see the module comment)."""
    sd = {}
    for name, p in model.state_dict().items():
        shape = tuple(p.shape)
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("scale_shift_table"):
            v = 0.5 * z
        elif name.endswith(".weight") and len(shape) >= 2:  # Linear [out, in] or Conv3d [out, in, kt, kh, kw]
            fan_in = math.prod(shape[1:])
            v = z / math.sqrt(fan_in)
        elif ".norm" in name and name.endswith(".weight"):  # RMSNorm / LayerNorm gains
            v = 1.0 + 0.3 * z
        else:  # biases
            v = 0.3 * z
        sd[name] = v.contiguous()
    return sd


def wan_build(cfg, gen):
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(**cfg)
    model.load_state_dict(wan_random_state(model, gen), strict=True)
    return model.float().eval()


def wan_inputs(spec, cfg, gen):
    B, F, H, W, L = spec["B"], spec["F"], spec["H"], spec["W"], spec["L"]
    pt, ph, pw = cfg["patch_size"]
    S = (F // pt) * (H // ph) * (W // pw)
    x = torch.randn((B, cfg["in_channels"], F, H, W), generator=gen)
    e = torch.randn((B, L, cfg["text_dim"]), generator=gen)
    if spec["timestep"] == "int":
        t = torch.randint(0, 1000, (B,), generator=gen, dtype=torch.int64)
    elif spec["timestep"] == "float":
        t = torch.tensor([437.5, 901.25][:B], dtype=torch.float32)
    else:  # per token: sample 0 like TI2V (first latent frame at 0, the rest at t), sample 1 arbitrary per token
        t = torch.empty((B, S), dtype=torch.float32)
        per_frame = (H // ph) * (W // pw)
        t[0] = 750.0
        t[0, :per_frame] = 0.0
        for b in range(1, B):
            t[b] = torch.rand((S,), generator=gen) * 1000.0
    out_c = cfg["out_channels"] or cfg["in_channels"]
    go = torch.randn((B, out_c, F, H, W), generator=gen)
    return x, t, e, go


def wan_run(model, x, t, e, go):
    """Forward and the gradients of sum(output * go); returns a dict of float32 tensors."""
    model.zero_grad(set_to_none=True)
    xg = x.clone().requires_grad_(True)
    eg = e.clone().requires_grad_(True)
    out = model(hidden_states=xg, timestep=t, encoder_hidden_states=eg, return_dict=False)[0]
    (out * go).sum().backward()
    res = {"output": out.detach().contiguous(), "grad_hidden_states": xg.grad.contiguous(),
           "grad_encoder_hidden_states": eg.grad.contiguous()}
    for name, p in model.named_parameters():
        res["grad." + name] = p.grad.detach().contiguous()
    return res


def wan_fixture(name, spec):
    from safetensors.torch import save_file

    torch.manual_seed(spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"])
    cfg = spec["config"]
    model = wan_build(cfg, gen)
    x, t, e, go = wan_inputs(spec, cfg, gen)
    res = wan_run(model, x, t, e, go)
    io = {"hidden_states": x, "timestep": t, "encoder_hidden_states": e, "grad_output": go}
    io.update(res)
    mdir = os.path.join(FIX, f"wan_{name}")
    model.save_pretrained(mdir, safe_serialization=True)

    if name == "difftest":  # BF16 checkpoint and the fp32 forward of its rounded weights
        from diffusers import WanTransformer3DModel

        bdir = os.path.join(FIX, f"wan_{name}_bf16")
        rounded = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
        bmodel = WanTransformer3DModel(**cfg)  # a fresh model: .to(bfloat16) would also round the RoPE buffers
        bmodel.load_state_dict({k: v.float() for k, v in rounded.items()})
        with torch.no_grad():
            io["output_bf16_weights"] = bmodel(hidden_states=x, timestep=t, encoder_hidden_states=e,
                                               return_dict=False)[0].contiguous()
        bmodel.to(torch.bfloat16).save_pretrained(bdir, safe_serialization=True)
    if name == "multihead":  # the same weights as two shards with an index
        sdir = os.path.join(FIX, f"wan_{name}_sharded")
        total = sum(p.numel() * 4 for p in model.state_dict().values())
        model.save_pretrained(sdir, safe_serialization=True, max_shard_size=int(total * 0.6))
        shards = [f for f in os.listdir(sdir) if f.endswith(".safetensors")]
        assert len(shards) == 2, shards
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(FIX, f"wan_{name}_io.safetensors"))
    print(f"wan_{name}: {sum(p.numel() for p in model.parameters())} parameters, output {tuple(res['output'].shape)}")


def wan_names(preset, cfg):
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        model = WanTransformer3DModel(**cfg)
    lines = [f"# {preset}: diffusers WanTransformer3DModel state_dict names and shapes (meta device, generated by "
             f"scripts/gen_fixtures.py)"]
    total = 0
    for k, v in model.state_dict().items():
        lines.append(k + " " + " ".join(str(d) for d in v.shape))
        total += v.numel()
    lines.insert(1, f"# {total} parameters")
    with open(os.path.join(FIX, f"wan_names_{preset}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wan_names_{preset}.txt: {len(lines) - 2} tensors, {total} parameters")


def gen_wan():
    os.makedirs(FIX, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    for name, spec in WAN_CONFIGS.items():
        wan_fixture(name, spec)
    for preset, cfg in WAN_PRESETS.items():
        wan_names(preset, cfg)


def check_wan_load(mdir, io_path=None, out_path=None):
    """One-off check that a checkpoint vgrpo wrote loads in diffusers and, with IO (inputs, and `output` unless
    OUT, e.g. what `vgrpo dit-forward` wrote, is given), that diffusers' forward gives the same output."""
    from diffusers import WanTransformer3DModel
    from safetensors.torch import load_file

    model = WanTransformer3DModel.from_pretrained(mdir, torch_dtype=torch.float32).eval()
    print(f"{mdir}: loaded, {sum(p.numel() for p in model.parameters())} parameters")
    if io_path is None:
        return 0
    io = load_file(io_path)
    with torch.no_grad():
        out = model(hidden_states=io["hidden_states"], timestep=io["timestep"],
                    encoder_hidden_states=io["encoder_hidden_states"], return_dict=False)[0]
    ref = load_file(out_path)["output"] if out_path else io["output"]
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    print(f"forward vs {io_path}: max|a-b|/max|b| = {err:.3g}")
    return 0 if err <= 1e-5 else 1


def gen_script(name):
    """A generator kept in its own file, scripts/fixtures_<name>.py, run as a script."""
    def gen():
        import runpy
        runpy.run_path(os.path.join(ROOT, "scripts", f"fixtures_{name}.py"), run_name="__main__")
    return gen


# Each generator writes its own fixtures; the ones in scripts/fixtures_<name>.py document their files there.
GENERATORS = {"wan": gen_wan, "safetensors": gen_script("safetensors"), "flow": gen_script("flow"),
              "optim": gen_script("optim"), "vae": gen_script("vae"), "vae_enc": gen_script("vae_enc"),
              "text": gen_script("text"), "lora": gen_script("lora"), "algo": gen_script("algo"),
              "i2v": gen_script("i2v"), "clip_text": gen_script("clip_text"), "clip_image": gen_script("clip_image"),
              "clip": gen_script("clip"), "clip_score": gen_script("clip_score"),
              "nft": gen_script("nft"), "dpo": gen_script("dpo")}

if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "check-wan-load":
        sys.exit(check_wan_load(*args[1:4]))
    for which in args or list(GENERATORS):
        if which not in GENERATORS:
            sys.exit(f"unknown generator {which!r} (have: {', '.join(GENERATORS)}, check-wan-load)")
        GENERATORS[which]()
