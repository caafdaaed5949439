#!/usr/bin/env python3
"""scripts/fixtures_clip_score.py — reference rewards for the learned scorers (reward/learned.h):
tests/test_reward_learned.c.

Writes, under tests/fixtures/:
  clip_score_tf/   `vgrpo init-clip --preset tiny --seed 3 --image-size 24` (VGRPO_BIN, default build/vgrpo): the
                   tiny random CLIP in transformers' layout (config.json, model.safetensors, tokenizer.json,
                   tokenizer_config.json, preprocessor_config.json), loaded here with CLIPModel.from_pretrained,
                   AutoTokenizer and AutoImageProcessor (transformers 5: CLIPImageProcessor, the torchvision backend)
  clip_score_oc/   an open_clip CLIP at the same widths (embed_dim 16, vision image_size 24, patch 8, width 32, 2
                   heads, 1 layer; text 77 positions, vocab 514, width 32, 2 heads, 1 layer; nn.GELU), random
                   (torch.manual_seed 4, open_clip's init), open_clip_config.json {"model_cfg": ...} and
                   open_clip_model.safetensors, with clip_score_tf's tokenizer files beside it
  clip_score_aesthetic_mlp.safetensors   the aesthetic MLP's layer stack (Linear 16 -> 24, Dropout, 24 -> 12,
                   Dropout, 12 -> 8, Dropout, 8 -> 4, 4 -> 1: names layers.0/2/4/6/7), random (seed 5)
  clip_score_io.safetensors   video U8 [5, 40, 56, 3] (noise rows on top, gradients below: frames of another size
                   than 24 and not square, so the resize and the crop or padding are exercised), and expected F32
                   [7]: the reward of each case below, the mean in float64 of the references' float32 per-frame
                   scores (in frame order), rounded to float32 (the safetensors reader has no F64).
The rewards are reward/examples/clip_server.py's (LearnedScorer), checked here against the formulas written out.
Cases (prompt P = "a red car driving along a wet road at night", L = a prompt of 130 words, truncated to 77 ids):
  0 clip_score all         CLIPModel(pixel_values, input_ids).logits_per_image[:, 0] / 30 (flow_grpo clip_scorer.py)
  1 pickscore  first       logit_scale.exp() * (text_embs @ image_embs.T)[0] / 26 on normalised embeddings
                           (PickScore's README; flow_grpo pickscore_scorer.py)
  2 pickscore  3 (0, 2, 4) the same, prompt L (transformers truncation=True: 76 text ids + end-of-text)
  3 hpsv2      all         open_clip model(image, text): image_features @ text_features.T (normalised; HPSv2
                           img_score.py), images by HPSv2's preprocess_val (ResizeMaxSize to 24 with PIL's bicubic,
                           zero padding to 24 x 24), ids from the tokenizer.json (clip_score_tf's)
  4 aesthetic  2 (0, 4)    MLP(image_embeds / |image_embeds|) (improved-aesthetic-predictor simple_inference.py)
  5 clip_score 4 (0, 1, 2, 4)  prompt "" (only the special tokens)
  6 hpsv2      first       prompt L
Tokens: tokenizer(P, padding="max_length", truncation=True, max_length=77).input_ids (the scorers' call).
Run: VGRPO_BIN=build/vgrpo .venv/bin/python scripts/gen_fixtures.py clip_score
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixtures_clip_image import frame_pixels  # noqa: E402  the frames of tests/test_clip_image.c

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
PROMPT = "a red car driving along a wet road at night"
LONG = " ".join(f"word{i % 10} blue" if i % 3 else "green" for i in range(130))
CASES = [("clip_score", "all", PROMPT), ("pickscore", "first", PROMPT), ("pickscore", 3, LONG),
         ("hpsv2", "all", PROMPT), ("aesthetic", 2, PROMPT), ("clip_score", 4, ""), ("hpsv2", "first", LONG)]


def frames_of(spec, F):
    """reward/learned.h: first, all, or K at floor(j (F - 1) / (K - 1))."""
    if spec == "first":
        return [0]
    if spec == "all":
        return list(range(F))
    return [0] if spec == 1 else [j * (F - 1) // (spec - 1) for j in range(spec)]


def hps_pixels(frames, side):
    """HPSv2's preprocess_val: ResizeMaxSize(side) (torchvision F.resize of the PIL image to round(s * side /
    longer), bicubic), zero padding to side x side (left / top pad // 2), ToTensor, Normalize."""
    from PIL import Image
    import torchvision.transforms as T
    import torchvision.transforms.functional as F1
    out = []
    for a in frames:
        p = Image.fromarray(a)
        w0, h0 = p.size
        scale = side / float(max(h0, w0))
        if scale != 1.0:
            p = F1.resize(p, [round(h0 * scale), round(w0 * scale)], T.InterpolationMode.BICUBIC)
        w1, h1 = p.size
        ph, pw = side - h1, side - w1
        p = F1.pad(p, [pw // 2, ph // 2, pw - pw // 2, ph - ph // 2], fill=0)
        out.append(T.Normalize(MEAN, STD)(T.ToTensor()(p)))
    return torch.stack(out)


def feats(x):
    return x.pooler_output if hasattr(x, "pooler_output") else x


def main():
    from safetensors.torch import save_file
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel
    import open_clip
    import torch.nn as nn

    vgrpo = os.environ.get("VGRPO_BIN", os.path.join(ROOT, "build", "vgrpo"))
    tf_dir, oc_dir = os.path.join(FIX, "clip_score_tf"), os.path.join(FIX, "clip_score_oc")
    subprocess.run([vgrpo, "init-clip", "--preset", "tiny", "--out", tf_dir, "--seed", "3", "--image-size", "24",
                    "--force"], check=True)
    model = CLIPModel.from_pretrained(tf_dir).eval()
    tok = AutoTokenizer.from_pretrained(tf_dir)
    proc = AutoImageProcessor.from_pretrained(tf_dir)
    assert type(proc).__name__ == "CLIPImageProcessor", type(proc).__name__

    torch.manual_seed(4)
    cfg = dict(embed_dim=16, vision_cfg=dict(image_size=24, layers=1, width=32, head_width=16, patch_size=8),
               text_cfg=dict(context_length=77, vocab_size=514, width=32, heads=2, layers=1))
    oc = open_clip.model.CLIP(**cfg).eval()
    with torch.no_grad():  # open_clip zero-initialises some tensors: spread them so every term counts
        for name, p in oc.named_parameters():
            if p.ndim == 1 and "ln" not in name:
                p.add_(0.02 * torch.randn_like(p))
    os.makedirs(oc_dir, exist_ok=True)
    with open(os.path.join(oc_dir, "open_clip_config.json"), "w") as f:
        json.dump(dict(model_cfg=cfg), f, indent=2)
    save_file({k: v.contiguous() for k, v in oc.state_dict().items()}, os.path.join(oc_dir, "open_clip_model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tf_dir, name), os.path.join(oc_dir, name))

    torch.manual_seed(5)
    d = [16, 24, 12, 8, 4, 1]
    mlp = nn.Module()
    mlp.layers = nn.Sequential(nn.Linear(d[0], d[1]), nn.Dropout(0.2), nn.Linear(d[1], d[2]), nn.Dropout(0.2),
                               nn.Linear(d[2], d[3]), nn.Dropout(0.1), nn.Linear(d[3], d[4]), nn.Linear(d[4], d[5]))
    mlp.eval()
    save_file({k: v.contiguous() for k, v in mlp.state_dict().items()},
              os.path.join(FIX, "clip_score_aesthetic_mlp.safetensors"))

    # the references: reward/examples/clip_server.py's scorers (the Python twin of reward/learned.h)
    sys.path.insert(0, os.path.join(ROOT, "reward", "examples"))
    from clip_server import LearnedScorer, frames_of as server_frames_of
    import tempfile
    aes_dir = tempfile.mkdtemp(prefix="vgrpo-aesthetic-")
    for name in ("config.json", "model.safetensors", "preprocessor_config.json"):
        shutil.copy(os.path.join(tf_dir, name), os.path.join(aes_dir, name))
    shutil.copy(os.path.join(FIX, "clip_score_aesthetic_mlp.safetensors"), os.path.join(aes_dir, "aesthetic_mlp.safetensors"))
    folders = dict(clip_score=tf_dir, pickscore=tf_dir, hpsv2=oc_dir, aesthetic=aes_dir)
    video = frame_pixels(5, 40, 56, 7)
    expected = []
    with torch.no_grad():
        for scorer, spec, prompt in CASES:
            idx = frames_of(spec, video.shape[0])
            assert idx == server_frames_of(str(spec), video.shape[0])
            sc = LearnedScorer(scorer, folders[scorer], str(spec))
            expected.append(sc(video[None], [dict(prompt=prompt)])[0])
            # the same without the server's code: the formulas written out (a check of clip_server.py itself)
            frames = [video[i] for i in idx]
            ids = torch.tensor([tok(prompt, padding="max_length", truncation=True, max_length=77).input_ids])
            if scorer == "hpsv2":
                img, txt = oc.encode_image(hps_pixels(frames, 24), normalize=True), oc.encode_text(ids, normalize=True)
                s = (img @ txt.T)[:, 0]
            else:
                px = proc(images=frames, return_tensors="pt").pixel_values
                if scorer == "clip_score":
                    s = model(pixel_values=px, input_ids=ids).logits_per_image[:, 0] / 30
                else:
                    img = feats(model.get_image_features(pixel_values=px))
                    if scorer == "aesthetic":
                        s = mlp.layers(img / torch.linalg.vector_norm(img, dim=-1, keepdim=True))[:, 0]
                    else:
                        txt = feats(model.get_text_features(input_ids=ids))
                        img = img / img.norm(p=2, dim=-1, keepdim=True)
                        txt = txt / txt.norm(p=2, dim=-1, keepdim=True)
                        s = (model.logit_scale.exp() * (txt @ img.T))[0] / 26
            direct = float(np.mean(s.numpy().astype(np.float64)))
            assert direct == expected[-1], (scorer, spec, direct, expected[-1])
            print(f"clip_score case {len(expected) - 1}: {scorer} frames {spec} ({idx}), {ids.shape[1]} ids, "
                  f"reward {expected[-1]:.8g}")
    shutil.rmtree(aes_dir)
    save_file(dict(video=torch.from_numpy(video), expected=torch.tensor(expected, dtype=torch.float32)),
              os.path.join(FIX, "clip_score_io.safetensors"))


if __name__ == "__main__":
    main()
