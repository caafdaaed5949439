#!/usr/bin/env python3
"""scripts/fixtures_lora.py — LoRA adapters between vgrpo, diffusers and peft (model/dit/wan_lora*.c,
tests/test_wan_lora_fixture.c).

Reference: diffusers 0.42.1 (WanPipeline.load_lora_weights / save_lora_weights, load_into_transformer_2,
WanTransformer3DModel) and peft 0.21.2 (LoraConfig, get_peft_model, PeftModel.save_pretrained / from_pretrained).

The base is the tiny preset with two experts as `vgrpo init-model --preset tiny --seed 7 --experts 2` writes it
(transformer: Philox seed 7, transformer_2: seed 8; the C test rebuilds the same weights with
wan_params_init_random, so no base weights are committed). This script runs that command, so it needs a built vgrpo
(VGRPO_BIN, default build/vgrpo). Every adapter has B != 0 and lora_alpha != r.

Writes, under tests/fixtures/:
  lora_diffusers/pytorch_lora_weights.safetensors
      saved BY DIFFUSERS (WanPipeline.save_lora_weights with transformer_lora_adapter_metadata): rank 2, alpha 5,
      every linear (the 16 nn.Linear of the model, full module names)
  lora_peft/adapter_model.safetensors + adapter_config.json
      saved BY PEFT (PeftModel.save_pretrained): rank 3, alpha 1.5, target_modules given the way peers write them
      (short names: to_q, to_v, ffn.net.0.proj, proj_out, time_proj)
  lora_vgrpo/{pytorch_lora_weights.safetensors, adapter_model.safetensors, adapter_config.json}
      written BY VGRPO (`vgrpo export` converting a peft adapter made here: rank 4, alpha 10, attn1.to_k,
      attn2.to_out.0, ffn.net.2, condition_embedder.text_embedder.linear_2), then loaded by diffusers and by peft
  lora_io.safetensors (F32; B = 1, 16 latent channels x 2 frames x 4 x 8, 6 text tokens):
      hidden_states, timestep, encoder_hidden_states
      output_base, output_base_2           transformer / transformer_2 without adapters
      vgrpo_diffusers                      pipe.load_lora_weights(lora_vgrpo) -> transformer
      vgrpo_diffusers_transformer_2        pipe.load_lora_weights(lora_vgrpo, load_into_transformer_2=True) ->
                                           transformer_2 (transformer checked unchanged here)
      vgrpo_peft                           PeftModel.from_pretrained(transformer, lora_vgrpo)
      vgrpo_merged                         WanTransformer3DModel.from_pretrained of `vgrpo export --merge` output
      diffusers_saved                      the transformer with lora_diffusers loaded (diffusers)
      peft_saved                           the transformer with lora_peft (peft)

Run: .venv/bin/python scripts/gen_fixtures.py lora   (VGRPO_BIN=build/vgrpo by default; CI never runs it)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
VGRPO = os.environ.get("VGRPO_BIN", os.path.join(ROOT, "build", "vgrpo"))
SEED = 7
LINEARS = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v",
           "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2", "condition_embedder.time_embedder.linear_1",
           "condition_embedder.time_embedder.linear_2", "condition_embedder.time_proj",
           "condition_embedder.text_embedder.linear_1", "condition_embedder.text_embedder.linear_2", "proj_out"]


def vgrpo(*args):
    cmd = [VGRPO, *args]
    print("+", " ".join(cmd))
    subprocess.run(cmd, check=True)


def randomise_lora(model, gen, b_std=0.1):
    """Every lora_A from U(-1/sqrt(in), 1/sqrt(in)), every lora_B from N(0, b_std): B != 0."""
    n = 0
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "lora_A" in name:
                bound = 1.0 / p.shape[1] ** 0.5
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * bound)
                n += 1
            elif "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * b_std)
    assert n > 0
    return n


def forward(model, io):
    with torch.no_grad():
        return model(hidden_states=io["hidden_states"], timestep=io["timestep"],
                     encoder_hidden_states=io["encoder_hidden_states"], return_dict=False)[0].contiguous()


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def main():
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from peft import LoraConfig, PeftModel, get_peft_model
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    torch.use_deterministic_algorithms(True)
    tmp = tempfile.mkdtemp(prefix="vgrpo-lora-")
    pipe_dir = os.path.join(tmp, "pipe")
    vgrpo("init-model", "--preset", "tiny", "--seed", str(SEED), "--experts", "2", "--out", pipe_dir)

    def load(expert=0):
        sub = "transformer_2" if expert else "transformer"
        return WanTransformer3DModel.from_pretrained(os.path.join(pipe_dir, sub), torch_dtype=torch.float32).eval()

    gen = torch.Generator().manual_seed(2024)
    cfg = load().config
    io = {"hidden_states": torch.randn((1, cfg.in_channels, 2, 4, 8), generator=gen),
          "timestep": torch.tensor([731.5], dtype=torch.float32),
          "encoder_hidden_states": torch.randn((1, 6, cfg.text_dim), generator=gen)}
    io["output_base"] = forward(load(0), io)
    io["output_base_2"] = forward(load(1), io)

    # (b1) an adapter saved by diffusers: rank 2, alpha 5, every linear
    t = load()
    t.add_adapter(LoraConfig(r=2, lora_alpha=5, target_modules=LINEARS, init_lora_weights=True))
    randomise_lora(t, gen)
    io["diffusers_saved"] = forward(t, io)
    out = os.path.join(FIX, "lora_diffusers")
    shutil.rmtree(out, ignore_errors=True)
    meta = t.peft_config["default"].to_dict()
    WanPipeline.save_lora_weights(out, transformer_lora_layers=get_peft_model_state_dict(t),
                                  transformer_lora_adapter_metadata=meta)
    targets = sorted(meta["target_modules"])
    assert sorted(targets) == sorted(LINEARS), targets

    # (b2) an adapter saved by peft: rank 3, alpha 1.5, peers' short target names
    pm = get_peft_model(load(), LoraConfig(r=3, lora_alpha=1.5, target_modules=["to_q", "to_v", "ffn.net.0.proj",
                                                                                 "proj_out", "time_proj"]))
    randomise_lora(pm, gen)
    io["peft_saved"] = forward(pm, io)
    out = os.path.join(FIX, "lora_peft")
    shutil.rmtree(out, ignore_errors=True)
    pm.save_pretrained(out)
    os.remove(os.path.join(out, "README.md"))  # peft's model card: not needed

    # (a) an adapter written by vgrpo (`vgrpo export` of a peft adapter made here), loaded by diffusers and peft
    src = os.path.join(tmp, "src")
    pm = get_peft_model(load(), LoraConfig(r=4, lora_alpha=10, target_modules=[
        "attn1.to_k", "attn2.to_out.0", "ffn.net.2", "condition_embedder.text_embedder.linear_2"]))
    randomise_lora(pm, gen)
    src_out = forward(pm, io)
    pm.save_pretrained(src)
    vg = os.path.join(tmp, "vg")
    vgrpo("export", "--checkpoint", pipe_dir, "--adapter", src, "--out", vg)
    out = os.path.join(FIX, "lora_vgrpo")
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(os.path.join(vg, "transformer"), out)

    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=load(0), transformer_2=load(1), boundary_ratio=0.875)
    pipe.load_lora_weights(out)
    io["vgrpo_diffusers"] = forward(pipe.transformer, io)
    assert rel(forward(pipe.transformer_2, io), io["output_base_2"]) == 0, "load_lora_weights touched transformer_2"
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=FlowMatchEulerDiscreteScheduler(),
                       transformer=load(0), transformer_2=load(1), boundary_ratio=0.875)
    pipe.load_lora_weights(out, load_into_transformer_2=True)
    io["vgrpo_diffusers_transformer_2"] = forward(pipe.transformer_2, io)
    assert rel(forward(pipe.transformer, io), io["output_base"]) == 0, "load_into_transformer_2 touched transformer"
    io["vgrpo_peft"] = forward(PeftModel.from_pretrained(load(), out).eval(), io)
    merged = os.path.join(tmp, "merged")
    vgrpo("export", "--checkpoint", pipe_dir, "--adapter", out, "--merge", "--out", merged)
    io["vgrpo_merged"] = forward(WanTransformer3DModel.from_pretrained(os.path.join(merged, "transformer"),
                                                                       torch_dtype=torch.float32).eval(), io)
    # transformer_2 has no adapter: written unchanged
    assert rel(forward(WanTransformer3DModel.from_pretrained(os.path.join(merged, "transformer_2"),
                                                             torch_dtype=torch.float32).eval(), io),
               io["output_base_2"]) == 0

    errs = {"vgrpo file via diffusers vs the source adapter": rel(io["vgrpo_diffusers"], src_out),
            "vgrpo file via peft vs the source adapter": rel(io["vgrpo_peft"], src_out),
            "vgrpo merged transformer vs adapter forward": rel(io["vgrpo_merged"], io["vgrpo_diffusers"])}
    for k, v in errs.items():
        print(f"  {k}: max|a-b|/max|b| = {v:.3g}")
        assert v < 1e-5, k
    for k in ["vgrpo_diffusers", "vgrpo_diffusers_transformer_2", "vgrpo_peft", "diffusers_saved", "peft_saved"]:
        base = io["output_base_2"] if k.endswith("_2") else io["output_base"]
        d = rel(io[k], base)
        print(f"  {k}: differs from the base by max|a-b|/max|b| = {d:.3g}")
        assert d > 1e-2, k
    save_file({k: v.contiguous() for k, v in io.items()}, os.path.join(FIX, "lora_io.safetensors"),
              metadata={"base": f"vgrpo init-model --preset tiny --seed {SEED} --experts 2",
                        "errors": json.dumps(errs)})
    shutil.rmtree(tmp)
    total = 0
    for d in ["lora_diffusers", "lora_peft", "lora_vgrpo"]:
        for f in os.listdir(os.path.join(FIX, d)):
            total += os.path.getsize(os.path.join(FIX, d, f))
    total += os.path.getsize(os.path.join(FIX, "lora_io.safetensors"))
    print(f"lora fixtures: {total / 1024:.0f} KiB")


if __name__ == "__main__":
    sys.exit(main())
