#!/usr/bin/env python3
"""scripts/fixtures_clip.py — reference values for model/clip (the CLIP towers and the aesthetic MLP):
tests/test_clip_model.c and tests/test_clip_load.c.

Writes, under tests/fixtures/ (small random models, weights drawn wide so that no term hides behind a zero:
matrices normal / sqrt(fan_in), LayerNorm gains 1 + 0.3 z, biases, class embeddings 0.3 z, logit_scale 2.3):
  clip_<name>/{config.json, model.safetensors}      transformers CLIPModel (save_pretrained, F32), for
      tf_qg    quick_gelu, 3 heads in both towers, image 30 / patch 6 (5 x 5 grid), projection 20 != widths,
               text_config.eos_token_id 2 (the argmax pooling rule), 12 of 20 positions used
      tf_gelu  gelu (erf), 5 heads of 6, image 28 / patch 8 (3 x 3 grid, 4 pixels cut off by the convolution),
               eos_token_id 97 (the first-eos rule), layer_norm_eps 1e-6, all 16 positions used, 3 vision layers
      tf_tanh  gelu_pytorch_tanh (vision) and gelu_new (text), 1 head, one layer, 7 of 9 positions
  clip_<name>/{open_clip_config.json, open_clip_model.safetensors}   open_clip CLIP (state_dict), for
      oc_gelu  nn.GELU, image_size [24, 40] with patch 8 (a 3 x 5 grid), head_width 12 (3 heads), mlp_ratio 2.5,
               text 5 heads, mlp_ratio 2, pool argmax
      oc_qg    quick_gelu, no_ln_pre, norm_kwargs eps 1e-6, text pool_type "eos" (eos_id 97), proj_bias (the
               text projection an nn.Linear), 3 text heads, one text layer
  clip_<name>_io.safetensors   pixel_values F32 [B, C, H, W] (normal), input_ids I64 [Bt, S], pool_index I64 [Bt]
      (the position pooled), image_embeds F32 [B, E] and text_embeds F32 [Bt, E] (unnormalised:
      get_image_features / get_text_features, open_clip encode_image / encode_text), logits_per_image F32 [B, Bt]
      (CLIPModel.forward / open_clip get_logits), logit_scale F32 [].
  clip_aesthetic_small.safetensors, clip_aesthetic_small_io.safetensors   the aesthetic predictor's layer stack
      (Linear, Dropout, Linear, Dropout, Linear, Dropout, Linear, Linear: state_dict names layers.0/2/4/6/7) at
      widths 48 -> 64 -> 32 -> 16 -> 8 -> 1 (the real one is 768 -> 1024 -> 128 -> 64 -> 16 -> 1: 3 MB), eval mode;
      io: embeds F32 [3, 48] (unnormalised), scores F32 [3] = MLP(embeds / |embeds|) as simple_inference.py.

`fixtures_clip.py full [DIR]` (default /tmp/vgrpo-clip-full; never committed: GBs) writes the full shapes:
  DIR/b32   transformers CLIPModel(CLIPConfig()) = openai/clip-vit-base-patch32's shapes (quick_gelu)
  DIR/h14   open_clip CLIP with open_clip's ViT-H-14.json config (nn.GELU; HPSv2's architecture)
  DIR/aesthetic.safetensors   the 768-wide aesthetic MLP
  DIR/l14   transformers CLIPModel with openai/clip-vit-large-patch14's config (quick_gelu; clip_score's and the
            aesthetic predictor's tower): `full [DIR] l14` writes it alone
  DIR/pickscore   transformers CLIPModel with laion/CLIP-ViT-H-14-laion2B-s32B-b79K's config (PickScore_v1's
            architecture), its preprocessor_config.json and tests/fixtures/clip_tok/tokenizer.json: a folder
            `vgrpo reward-server --models pickscore=DIR` loads (`vgrpo bench reward --models`); `full [DIR] pickscore`
            writes it alone
each of b32 and h14 with its _io.safetensors (2 images, 3 prompts of 77 tokens) beside it, and prints PyTorch's images/s at
batch 8 with torch.set_num_threads(2) for the benchmark. tests/test_clip_model.c (clip_model_full_shapes) runs the
C model on them when DIR exists (VGRPO_CLIP_FULL to point elsewhere).

Run: .venv/bin/python scripts/gen_fixtures.py clip (needs torch, transformers, open_clip_torch, safetensors).
"""
import json
import math
import os
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures")

TF_CONFIGS = {
    "tf_qg": dict(
        text=dict(vocab_size=99, hidden_size=36, intermediate_size=50, num_hidden_layers=2, num_attention_heads=3,
                  max_position_embeddings=20, hidden_act="quick_gelu", bos_token_id=97, eos_token_id=2,
                  pad_token_id=1),
        vision=dict(hidden_size=30, intermediate_size=37, num_hidden_layers=2, num_attention_heads=3, image_size=30,
                    patch_size=6, hidden_act="quick_gelu"),
        projection_dim=20, B=3, Bt=4, S=12, seed=1),
    "tf_gelu": dict(
        text=dict(vocab_size=99, hidden_size=30, intermediate_size=48, num_hidden_layers=2, num_attention_heads=5,
                  max_position_embeddings=16, hidden_act="gelu", layer_norm_eps=1e-6, bos_token_id=96,
                  eos_token_id=97, pad_token_id=97),
        vision=dict(hidden_size=30, intermediate_size=44, num_hidden_layers=3, num_attention_heads=5, image_size=28,
                    patch_size=8, hidden_act="gelu", layer_norm_eps=1e-6),
        projection_dim=24, B=2, Bt=4, S=16, seed=2),
    "tf_tanh": dict(
        text=dict(vocab_size=99, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=1,
                  max_position_embeddings=9, hidden_act="gelu_new", bos_token_id=96, eos_token_id=98,
                  pad_token_id=0),
        vision=dict(hidden_size=12, intermediate_size=20, num_hidden_layers=1, num_attention_heads=1, image_size=16,
                    patch_size=4, hidden_act="gelu_pytorch_tanh"),
        projection_dim=16, B=1, Bt=2, S=7, seed=3),
}

OC_CONFIGS = {
    "oc_gelu": dict(
        cfg=dict(embed_dim=20,
                 vision_cfg=dict(image_size=[24, 40], layers=2, width=36, head_width=12, patch_size=8, mlp_ratio=2.5),
                 text_cfg=dict(context_length=10, vocab_size=99, width=30, heads=5, layers=2, mlp_ratio=2)),
        B=2, Bt=4, seed=4),
    "oc_qg": dict(
        cfg=dict(embed_dim=16, quick_gelu=True,
                 vision_cfg=dict(image_size=20, layers=2, width=36, head_width=12, patch_size=5, no_ln_pre=True,
                                 norm_kwargs=dict(eps=1e-6)),
                 text_cfg=dict(context_length=8, vocab_size=99, width=24, heads=3, layers=1, pool_type="eos",
                               eos_id=97, proj_bias=True, norm_kwargs=dict(eps=1e-6))),
        B=3, Bt=3, seed=5),
}


def widen(model, seed):
    """Wide random weights (see the top of this file)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("logit_scale"):
                p.fill_(2.3)
            elif p.ndim >= 2:
                fan_in = p[0].numel() if p.ndim > 2 else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            elif name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def make_ids(Bt, S, vocab, rule, eos, g):
    """Token rows exercising the pooling rule: eos mid-row then padding, eos repeated as padding (the first one
    counts), no eos at all, eos at the last position."""
    ids = torch.randint(0, vocab - 4, (Bt, S), generator=g)
    ids[:, 0] = vocab - 3  # a "bos"
    rows = []
    for r in range(Bt):
        row = ids[r].clone()
        kind = r % 4
        if kind == 0:
            e = S // 2
            row[e] = eos
            row[e + 1:] = 0
        elif kind == 1:
            e = max(1, S // 3)
            row[e:] = eos
        elif kind == 2:
            pass  # no eos: argmax of whatever is largest / index 0 for the eos rule
        else:
            row[S - 1] = eos
        rows.append(row)
    return torch.stack(rows)


def pool_index(ids, rule, eos):
    if rule == "argmax":
        return ids.to(torch.int).argmax(dim=-1)
    if rule == "eos":
        return (ids.to(torch.int) == eos).int().argmax(dim=-1)
    raise ValueError(rule)


def save(path, tensors, meta=None):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)


def gen_tf(name, spec, out_dir, io_path):
    from transformers import CLIPConfig, CLIPModel
    torch.manual_seed(spec["seed"])
    cfg = CLIPConfig(text_config=spec["text"], vision_config=spec["vision"], projection_dim=spec["projection_dim"])
    model = CLIPModel(cfg).eval()
    widen(model, spec["seed"])
    model.save_pretrained(out_dir, safe_serialization=True)
    g = torch.Generator().manual_seed(100 + spec["seed"])
    tc, vc = cfg.text_config, cfg.vision_config
    px = torch.randn(spec["B"], vc.num_channels, vc.image_size, vc.image_size, generator=g)
    rule = "argmax" if tc.eos_token_id == 2 else "eos"
    eos = tc.vocab_size - 1 if rule == "argmax" else tc.eos_token_id
    ids = make_ids(spec["Bt"], spec["S"], tc.vocab_size, rule, eos, g)
    with torch.no_grad():
        img = model.get_image_features(pixel_values=px)
        txt = model.get_text_features(input_ids=ids)
        img = img.pooler_output if hasattr(img, "pooler_output") else img
        txt = txt.pooler_output if hasattr(txt, "pooler_output") else txt
        out = model(input_ids=ids, pixel_values=px)
    save(io_path, dict(pixel_values=px, input_ids=ids, pool_index=pool_index(ids, rule, eos).long(),
                       image_embeds=img, text_embeds=txt, logits_per_image=out.logits_per_image,
                       logit_scale=model.logit_scale.detach().clone()))
    print(f"clip {name}: image_embeds {tuple(img.shape)}, text_embeds {tuple(txt.shape)}, rule {rule}")


def gen_oc(name, spec, out_dir, io_path):
    import open_clip
    torch.manual_seed(spec["seed"])
    cfg = spec["cfg"]
    model = open_clip.model.CLIP(**cfg).eval()
    widen(model, spec["seed"])
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "open_clip_config.json"), "w") as f:
        json.dump(dict(model_cfg=cfg, preprocess_cfg=dict(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])), f, indent=2)
    save(os.path.join(out_dir, "open_clip_model.safetensors"), model.state_dict())
    g = torch.Generator().manual_seed(100 + spec["seed"])
    vc, tc = cfg["vision_cfg"], cfg["text_cfg"]
    size = vc["image_size"]
    h, w = (size, size) if isinstance(size, int) else size
    px = torch.randn(spec["B"], 3, h, w, generator=g)
    rule = tc.get("pool_type", "argmax")
    eos = tc["vocab_size"] - 1 if rule == "argmax" else tc["eos_id"]
    ids = make_ids(spec["Bt"], tc["context_length"], tc["vocab_size"], rule, eos, g)
    with torch.no_grad():
        img = model.encode_image(px)
        txt = model.encode_text(ids)
        logits, _ = model.get_logits(px, ids)
    save(io_path, dict(pixel_values=px, input_ids=ids, pool_index=pool_index(ids, rule, eos).long(),
                       image_embeds=img, text_embeds=txt, logits_per_image=logits,
                       logit_scale=model.logit_scale.detach().clone()))
    print(f"clip {name}: image_embeds {tuple(img.shape)}, text_embeds {tuple(txt.shape)}, rule {rule}")


def aesthetic_mlp(widths, seed):
    """improved-aesthetic-predictor's MLP layer stack (simple_inference.py), at the given widths."""
    import torch.nn as nn
    d = widths
    layers = nn.Sequential(nn.Linear(d[0], d[1]), nn.Dropout(0.2), nn.Linear(d[1], d[2]), nn.Dropout(0.2),
                           nn.Linear(d[2], d[3]), nn.Dropout(0.1), nn.Linear(d[3], d[4]), nn.Linear(d[4], d[5]))
    m = nn.Module()
    m.layers = layers
    m.eval()
    widen(m, seed)
    return m


def gen_aesthetic(widths, path, io_path, seed):
    m = aesthetic_mlp(widths, seed)
    save(path, m.state_dict())
    g = torch.Generator().manual_seed(seed + 1)
    emb = 3 * torch.randn(3, widths[0], generator=g)
    # simple_inference.py: normalized() in numpy float32, then the MLP
    import numpy as np
    a = emb.numpy()
    l2 = np.atleast_1d(np.linalg.norm(a, 2, -1))
    l2[l2 == 0] = 1
    x = torch.from_numpy(a / np.expand_dims(l2, -1)).float()
    with torch.no_grad():
        scores = m.layers(x)[:, 0]
    save(io_path, dict(embeds=emb, scores=scores))
    print(f"aesthetic {widths}: scores {scores.tolist()}")


def gen_small():
    for name, spec in TF_CONFIGS.items():
        gen_tf(name, spec, os.path.join(FIX, f"clip_{name}"), os.path.join(FIX, f"clip_{name}_io.safetensors"))
    for name, spec in OC_CONFIGS.items():
        gen_oc(name, spec, os.path.join(FIX, f"clip_{name}"), os.path.join(FIX, f"clip_{name}_io.safetensors"))
    gen_aesthetic([48, 64, 32, 16, 8, 1], os.path.join(FIX, "clip_aesthetic_small.safetensors"),
                  os.path.join(FIX, "clip_aesthetic_small_io.safetensors"), 7)


def torch_images_per_s(encode, px, reps=3):
    torch.set_num_threads(2)
    with torch.no_grad():
        encode(px)  # warm-up
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            encode(px)
            best = min(best, time.perf_counter() - t0)
    return px.shape[0] / best


def gen_full(out):
    """Full ViT-B/32 (transformers) and ViT-H/14 (open_clip) shapes under `out` (not committed)."""
    import open_clip
    from transformers import CLIPConfig, CLIPModel
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(11)
    # ViT-B/32, transformers layout
    cfg = CLIPConfig()
    model = CLIPModel(cfg).eval()
    widen(model, 11)
    model.save_pretrained(os.path.join(out, "b32"), safe_serialization=True)
    px = torch.randn(2, 3, 224, 224, generator=g)
    ids = make_ids(3, 77, cfg.text_config.vocab_size, "eos", cfg.text_config.eos_token_id, g)
    with torch.no_grad():
        img = model.get_image_features(pixel_values=px)
        txt = model.get_text_features(input_ids=ids)
        img = img.pooler_output if hasattr(img, "pooler_output") else img
        txt = txt.pooler_output if hasattr(txt, "pooler_output") else txt
        out_ = model(input_ids=ids, pixel_values=px)
    save(os.path.join(out, "b32_io.safetensors"),
         dict(pixel_values=px, input_ids=ids, image_embeds=img, text_embeds=txt,
              logits_per_image=out_.logits_per_image, logit_scale=model.logit_scale.detach().clone()))
    px8 = torch.randn(8, 3, 224, 224, generator=g)
    print(f"b32 written; PyTorch {torch.__version__} eager, 2 threads, batch 8: "
          f"{torch_images_per_s(lambda x: model.get_image_features(pixel_values=x), px8):.2f} images/s")
    del model
    # ViT-H/14, open_clip layout (HPSv2's architecture)
    cfgp = os.path.join(os.path.dirname(open_clip.__file__), "model_configs", "ViT-H-14.json")
    mcfg = json.load(open(cfgp))
    model = open_clip.model.CLIP(**mcfg).eval()
    widen(model, 12)
    d = os.path.join(out, "h14")
    os.makedirs(d, exist_ok=True)
    json.dump(dict(model_cfg=mcfg), open(os.path.join(d, "open_clip_config.json"), "w"), indent=2)
    save(os.path.join(d, "open_clip_model.safetensors"), model.state_dict())
    px = torch.randn(2, 3, 224, 224, generator=g)
    ids = make_ids(3, 77, 49408, "argmax", 49407, g)
    with torch.no_grad():
        img = model.encode_image(px)
        txt = model.encode_text(ids)
        logits, _ = model.get_logits(px, ids)
    save(os.path.join(out, "h14_io.safetensors"),
         dict(pixel_values=px, input_ids=ids, image_embeds=img, text_embeds=txt, logits_per_image=logits,
              logit_scale=model.logit_scale.detach().clone()))
    print(f"h14 written; PyTorch eager, 2 threads, batch 8: "
          f"{torch_images_per_s(model.encode_image, px8, reps=1):.3f} images/s")
    del model
    gen_aesthetic([768, 1024, 128, 64, 16, 1], os.path.join(out, "aesthetic.safetensors"),
                  os.path.join(out, "aesthetic_io.safetensors"), 13)


# openai/clip-vit-large-patch14's and laion/CLIP-ViT-H-14-laion2B-s32B-b79K's config.json (their text_config keeps
# eos_token_id 2: the argmax pooling rule) and the latter's preprocessor_config.json (PickScore's processor).
L14_CONFIG = dict(
    text=dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12,
              max_position_embeddings=77, hidden_act="quick_gelu", bos_token_id=0, eos_token_id=2, pad_token_id=1),
    vision=dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_hidden_layers=24,
                image_size=224, patch_size=14, hidden_act="quick_gelu"),
    projection_dim=768)
H14_HF_CONFIG = dict(
    text=dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_hidden_layers=24,
              max_position_embeddings=77, hidden_act="gelu", bos_token_id=0, eos_token_id=2, pad_token_id=1),
    vision=dict(hidden_size=1280, intermediate_size=5120, num_attention_heads=16, num_hidden_layers=32,
                image_size=224, patch_size=14, hidden_act="gelu"),
    projection_dim=1024)
H14_PROCESSOR = dict(crop_size=224, do_center_crop=True, do_normalize=True, do_resize=True,
                     feature_extractor_type="CLIPFeatureExtractor",
                     image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711],
                     resample=3, size=224)


def gen_full_tf(out, part):
    """DIR/l14 or DIR/pickscore (above): random weights at the real shapes, written as save_pretrained does."""
    import shutil
    from transformers import CLIPConfig, CLIPModel
    spec = L14_CONFIG if part == "l14" else H14_HF_CONFIG
    torch.manual_seed(14)
    model = CLIPModel(CLIPConfig(text_config=spec["text"], vision_config=spec["vision"],
                                 projection_dim=spec["projection_dim"])).eval()
    widen(model, 14)
    d = os.path.join(out, part)
    model.save_pretrained(d, safe_serialization=True)
    if part == "pickscore":
        with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
            json.dump(H14_PROCESSOR, f, indent=2)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(FIX, "clip_tok", name), os.path.join(d, name))
    n = sum(p.numel() for p in model.parameters())
    print(f"{part} written: {n * 1e-6:.1f} M parameters")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "full":
        out = sys.argv[2] if len(sys.argv) > 2 else "/tmp/vgrpo-clip-full"
        parts = sys.argv[3:] or ["b32", "h14", "l14", "pickscore"]
        if "b32" in parts or "h14" in parts:
            gen_full(out)
        for part in ("l14", "pickscore"):
            if part in parts:
                gen_full_tf(out, part)
    else:
        gen_small()
