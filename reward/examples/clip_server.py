#!/usr/bin/env python3
"""reward/examples/clip_server.py - vgrpo's learned scorers (reward/learned.h: clip_score, pickscore, hpsv2,
aesthetic) in Python with transformers and open_clip, served over reward/PROTOCOL.md by score_server.py's protocol
code: for users who want these rewards on a GPU beside the rollout instead of vgrpo's C scorers on the CPU.

    python reward/examples/clip_server.py --bind ipc:///tmp/r.sock --scorers pickscore:1 \\
        --models pickscore=/data/PickScore_v1 --frames 4 [--device cuda] [--keys-file PATH]

then point a recipe at it with `reward.endpoint: ipc:///tmp/r.sock` (and no reward.models: the server loads them).
The model folders are those of reward/learned.h (recipes/README.md "Learned rewards"). Per video: the scored frames
(--frames first | all | K: floor(j (F - 1) / (K - 1))), one score per frame in float32 as the references compute it,
the reward their mean in float64:
  clip_score  CLIPModel(pixel_values, input_ids).logits_per_image / 30        (flow_grpo clip_scorer.py)
  pickscore   logit_scale.exp() * cos(image_embeds, text_embeds) / 26        (PickScore README; flow_grpo)
  hpsv2       cos(encode_image, encode_text) of an open_clip CLIP            (HPSv2 img_score.py)
  aesthetic   MLP(image_embeds / |image_embeds|)                             (improved-aesthetic-predictor)
Images: AutoImageProcessor (transformers' CLIPImageProcessor), hpsv2 HPSv2's preprocess_val (longer side to the
image size with PIL's bicubic, zero padding to a square). Text: AutoTokenizer from the folder's tokenizer.json,
padding="max_length", truncation=True, max_length=77 (or the model's positions when fewer).
scripts/fixtures_clip_score.py computes the C scorers' reference values with these functions (float32 on the CPU);
tests/test_reward_learned.c holds the C scorers to them within 1e-5 relative. On a GPU in bf16 they differ more.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

OPENAI_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_STD = [0.26862954, 0.26130258, 0.27577711]
KINDS = ("clip_score", "pickscore", "hpsv2", "aesthetic")


def frames_of(spec, F):
    """reward/learned.h reward_frames_pick: first, all, or K frames at floor(j (F - 1) / (K - 1))."""
    if spec in (None, "", "all"):
        return list(range(F))
    if spec == "first":
        return [0]
    k = int(spec)
    if k < 1 or k > F:
        raise ValueError("reward.frames: %d frames asked, the video has %d" % (k, F))
    return [0] if k == 1 else [j * (F - 1) // (k - 1) for j in range(k)]


def _feats(x):
    return x.pooler_output if hasattr(x, "pooler_output") else x


def hps_pixels(frames, side, mean, std):
    """HPSv2's preprocess_val: ResizeMaxSize(side) on the PIL image (torchvision resize, bicubic, each side
    round(s * side / longer)), zero padding to side x side (left / top pad // 2), ToTensor, Normalize."""
    from PIL import Image
    import torchvision.transforms as T
    import torchvision.transforms.functional as F1
    out = []
    for a in frames:
        p = Image.fromarray(np.ascontiguousarray(a))
        w0, h0 = p.size
        scale = side / float(max(h0, w0))
        if scale != 1.0:
            p = F1.resize(p, [round(h0 * scale), round(w0 * scale)], T.InterpolationMode.BICUBIC)
        w1, h1 = p.size
        ph, pw = side - h1, side - w1
        p = F1.pad(p, [pw // 2, ph // 2, pw - pw // 2, ph - ph // 2], fill=0)
        out.append(T.Normalize(mean, std)(T.ToTensor()(p)))
    return torch.stack(out)


class LearnedScorer:
    """One learned scorer with its model folder, as reward/learned.h describes it."""

    def __init__(self, kind, folder, frames="all", device="cpu"):
        from transformers import AutoImageProcessor, AutoTokenizer
        if kind not in KINDS:
            raise ValueError("%r is not a learned scorer (%s)" % (kind, ", ".join(KINDS)))
        self.kind, self.frames, self.device = kind, frames, device
        self.tok = None if kind == "aesthetic" else AutoTokenizer.from_pretrained(folder)
        if os.path.exists(os.path.join(folder, "config.json")):
            from transformers import CLIPModel
            self.model = CLIPModel.from_pretrained(folder).eval().to(device)
            self.oc = None
            self.proc = None if kind == "hpsv2" else AutoImageProcessor.from_pretrained(folder)
            self.side = self.model.config.vision_config.image_size
            self.positions = self.model.config.text_config.max_position_embeddings
            self.mean, self.std = OPENAI_MEAN, OPENAI_STD
        else:
            import open_clip
            from safetensors.torch import load_file
            with open(os.path.join(folder, "open_clip_config.json")) as f:
                cfg = json.load(f)
            pre = cfg.get("preprocess_cfg", {})
            cfg = cfg.get("model_cfg", cfg)
            self.oc = open_clip.model.CLIP(**cfg).eval()
            weights = [n for n in sorted(os.listdir(folder)) if n.endswith(".safetensors")]
            name = "open_clip_model.safetensors" if "open_clip_model.safetensors" in weights else weights[0]
            sd = {k[7:] if k.startswith("module.") else k: v for k, v in load_file(os.path.join(folder, name)).items()}
            self.oc.load_state_dict(sd)
            self.oc.to(device)
            self.model, self.proc = None, None
            size = cfg["vision_cfg"]["image_size"]
            self.side = size if isinstance(size, int) else size[0]
            self.positions = cfg["text_cfg"].get("context_length", 77)
            self.mean, self.std = pre.get("mean", OPENAI_MEAN), pre.get("std", OPENAI_STD)
            if kind != "hpsv2":
                raise ValueError("%s: an open_clip folder serves hpsv2 only here" % kind)
        self.mlp = None
        if kind == "aesthetic":
            from safetensors.torch import load_file
            sd = load_file(os.path.join(folder, "aesthetic_mlp.safetensors"))
            idx = sorted({int(k.split(".")[1]) for k in sd if k.startswith("layers.")})
            layers = []
            for i in idx:
                w, b = sd["layers.%d.weight" % i], sd["layers.%d.bias" % i]
                lin = torch.nn.Linear(w.shape[1], w.shape[0])
                lin.weight.data.copy_(w)
                lin.bias.data.copy_(b)
                layers.append(lin)
            self.mlp = torch.nn.Sequential(*layers).eval().to(device)

    @torch.no_grad()
    def frame_scores(self, frames, prompt):
        """float32 scores of frames (list of u8 [H, W, 3]) against prompt."""
        ids = None
        if self.tok is not None:
            n = min(77, self.positions)
            ids = torch.tensor([self.tok(prompt, padding="max_length", truncation=True, max_length=n).input_ids],
                               device=self.device)
        if self.kind == "hpsv2":
            px = hps_pixels(frames, self.side, self.mean, self.std).to(self.device)
            if self.oc is not None:  # HPSv2: model(image, text) -> normalised features
                img, txt = self.oc.encode_image(px, normalize=True), self.oc.encode_text(ids, normalize=True)
            else:
                img = _feats(self.model.get_image_features(pixel_values=px))
                txt = _feats(self.model.get_text_features(input_ids=ids))
                img, txt = img / img.norm(p=2, dim=-1, keepdim=True), txt / txt.norm(p=2, dim=-1, keepdim=True)
            return (img @ txt.T)[:, 0]
        px = self.proc(images=list(frames), return_tensors="pt").pixel_values.to(self.device)
        if self.kind == "clip_score":
            return self.model(pixel_values=px, input_ids=ids).logits_per_image[:, 0] / 30
        img = _feats(self.model.get_image_features(pixel_values=px))
        if self.kind == "aesthetic":
            return self.mlp(img / torch.linalg.vector_norm(img, dim=-1, keepdim=True))[:, 0]
        txt = _feats(self.model.get_text_features(input_ids=ids))
        img, txt = img / img.norm(p=2, dim=-1, keepdim=True), txt / txt.norm(p=2, dim=-1, keepdim=True)
        return (self.model.logit_scale.exp() * (txt @ img.T))[0] / 26

    def __call__(self, videos, items):
        """score_server.py's scorer signature: videos u8 [N, F, H, W, 3], items -> N rewards."""
        out = []
        for v, it in zip(videos, items):
            idx = frames_of(self.frames, v.shape[0])
            s = self.frame_scores([v[i] for i in idx], it.get("prompt", ""))
            out.append(float(np.mean(s.float().cpu().numpy().astype(np.float64))))
        return out


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import score_server  # the protocol (framing, checks, ids, keys); pyzmq needed only to serve
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--models", default="", help="NAME=DIR,... model folders of the learned scorers")
    ap.add_argument("--frames", default="all", help="first | all | K (reward/learned.h)")
    ap.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    args, rest = ap.parse_known_args()
    for entry in filter(None, args.models.split(",")):
        name, eq, folder = entry.partition("=")
        if not eq or not folder:
            print("clip_server: --models: entry %r is not NAME=DIR" % entry, file=sys.stderr)
            return 2
        score_server.SCORERS[name] = LearnedScorer(name, folder, args.frames, args.device)
    sys.argv = [sys.argv[0]] + rest
    return score_server.main()


if __name__ == "__main__":
    sys.exit(main())
