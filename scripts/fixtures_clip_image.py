#!/usr/bin/env python3
"""scripts/fixtures_clip_image.py — reference pixels for CLIP image preprocessing (model/clip/clip_image.c,
tests/test_clip_image.c), from the three references clip_image.h names:
  hf         transformers' CLIPImageProcessor as AutoImageProcessor loads it by default (torchvision backend)
  hf_pil     transformers' CLIPImageProcessorPil (backend="pil")
  open_clip  open_clip's eval transform: torchvision Resize(BICUBIC) + CenterCrop on a PIL image, ToTensor,
             Normalize (built by hand for the small non-square crop; checked equal to open_clip's own
             image_transform at 224 here).
  hpsv2      HPSv2's preprocess_val: the open_clip 2.x image_transform it vendors, with resize_longest_max=True
             (ResizeMaxSize: torchvision F.resize of the PIL image to round(side * size / longer), F.pad with zeros to
             a square, pad // 2 first), ToTensor, Normalize; written out here with the same torchvision calls, as
             that open_clip version is not installed (open_clip 3's resize_mode="longest" is compared with it and
             the difference printed).
Input frames are not stored: they are a formula both sides compute (frame_pixels: splitmix64 noise in the top half,
gradients in the bottom half).

Writes, under tests/fixtures/:
  clip_image_small/preprocessor_config.json   shortest_edge 16, crop 12 x 16 (h x w), CLIP's mean/std (new-style
                                              keys: {"shortest_edge": ...}, {"height": ..., "width": ...})
  clip_image_224/preprocessor_config.json     openai/clip-vit-*'s file (old-style integer size / crop_size)
  clip_image_io.safetensors                   for small case i (__metadata__ "small": [[n, h, w, seed], ...]) and
                                              variant v: small.<i>.out.<v> F32 [n, 3, 12, 16] (pixel_values);
                                              (hpsv2: [n, 3, 16, 16], the square of side 16);
                                              small.<i>.resized.<r> U8 [n, oh, ow, 3] (the full resize) for r = hf
                                              (torch), pil (Pillow: hf_pil and open_clip) and hpsv2;
                                              for 224 case i (__metadata__ "real"): real.<i>.hash.<v> I64 [2]: FNV-1a
                                              64 of the resized u8 image's bytes and of pixel_values' float32 bytes
                                              (little-endian), as the C test computes them (bit-exact check at 224).
                                              __metadata__ "diffs": the references against each other (printed too).

Run: .venv/bin/python scripts/fixtures_clip_image.py   (needs transformers, torchvision, pillow, open_clip)
"""
import json
import os
import tempfile

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
VARIANTS = ["hf", "hf_pil", "open_clip", "hpsv2"]

# (n frames, h, w, seed): odd sizes, landscape, portrait, upscaling (smaller than the crop), square, large downscale
# (211, 37) and (40, 18): Pillow runs the height pass first (the height shrinks more than twice the width)
SMALL = [(2, 97, 131, 1), (2, 150, 113, 2), (1, 12, 19, 3), (2, 16, 16, 4), (1, 9, 61, 5), (1, 211, 37, 6),
         (2, 31, 29, 7), (1, 40, 18, 8)]
# at 224: Wan's 480p and 720p frames, odd sizes, upscaling, width - 224 = 3 mod 4 (open_clip's crop offset differs)
REAL = [(1, 480, 832, 11), (1, 720, 1280, 12), (2, 97, 131, 13), (1, 300, 305, 14), (1, 224, 224, 15),
        (1, 333, 199, 16), (1, 256, 256, 17), (1, 900, 300, 18)]


def splitmix64(z):
    z = (z + np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def frame_pixels(n, h, w, seed):
    """u8 [n, h, w, 3]: noise rows y < h / 2, gradients below (tests/test_clip_image.c frame_pixels)."""
    f, y, x, c = np.meshgrid(np.arange(n), np.arange(h), np.arange(w), np.arange(3), indexing="ij")
    idx = (((f * h + y) * w + x) * 3 + c).astype(np.uint64)
    with np.errstate(over="ignore"):
        noise = (splitmix64(np.uint64(seed) << np.uint64(32) | idx) >> np.uint64(24)) & np.uint64(255)
    grad = (x * 255 // max(w - 1, 1) + y * 97 // h + c * 60 + f * 17) & 255
    return np.where(y < h // 2, noise.astype(np.int64), grad).astype(np.uint8)


def fnv64(b):
    h = 1469598103934665603
    for byte in b:
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h - (1 << 64) if h >= 1 << 63 else h


def write_config(folder, cfg):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


diffs_oc3 = []  # max |open_clip 3 resize_mode="longest" - hpsv2| per case


def references(folder, se, ch, cw):
    from PIL import Image
    import torchvision.transforms as T
    import torchvision.transforms.v2.functional as tvF
    from transformers import AutoImageProcessor

    hf = AutoImageProcessor.from_pretrained(folder)
    hf_pil = AutoImageProcessor.from_pretrained(folder, backend="pil")
    assert type(hf).__name__ == "CLIPImageProcessor" and type(hf_pil).__name__ == "CLIPImageProcessorPil", (
        type(hf).__name__, type(hf_pil).__name__)
    oc = T.Compose([T.Resize(se, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop((ch, cw)), T.ToTensor(),
                    T.Normalize(MEAN, STD)])
    hs = max(ch, cw)  # HPSv2: the square side (crop 12 x 16 -> 16 for the small config)
    to_pixels = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])

    def hps_resized(p):
        import torchvision.transforms.functional as F1
        w0, h0 = p.size
        scale = hs / float(max(h0, w0))
        if scale == 1.0:
            return p
        return F1.resize(p, [round(h0 * scale), round(w0 * scale)], T.InterpolationMode.BICUBIC)

    def hps_padded(r):
        import torchvision.transforms.functional as F1
        w1, h1 = r.size
        if (w1, h1) == (hs, hs):
            return r
        ph, pw = hs - h1, hs - w1
        return F1.pad(r, [pw // 2, ph // 2, pw - pw // 2, ph - ph // 2], fill=0)

    import open_clip
    oc3 = open_clip.transform.image_transform((hs, hs), is_train=False, resize_mode="longest")

    def resized_size(h, w):
        return (int(se * h / w), se) if w <= h else (se, int(se * w / h))

    def run(frames):
        out = {}
        oh, ow = resized_size(*frames.shape[1:3])
        pil = [Image.fromarray(a) for a in frames]
        out["hf"] = (np.stack([tvF.resize(torch.from_numpy(a).permute(2, 0, 1).contiguous(), [oh, ow],
                                          interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)
                               .permute(1, 2, 0).numpy() for a in frames]),
                     hf(images=list(frames), return_tensors="pt").pixel_values.numpy())
        pil_resized = np.stack([np.asarray(p.resize((ow, oh), Image.BICUBIC)) for p in pil])
        out["hf_pil"] = (pil_resized, hf_pil(images=list(frames), return_tensors="np").pixel_values)
        out["open_clip"] = (pil_resized, torch.stack([oc(p) for p in pil]).numpy())
        hr = [hps_resized(p) for p in pil]
        out["hpsv2"] = (np.stack([np.asarray(r) for r in hr]), torch.stack([to_pixels(hps_padded(r)) for r in hr]).numpy())
        oc3_out = torch.stack([oc3(p) for p in pil]).numpy()
        diffs_oc3.append(float(np.abs(oc3_out - out["hpsv2"][1]).max()))
        for v in VARIANTS:
            shape = (len(frames), 3, hs, hs) if v == "hpsv2" else (len(frames), 3, ch, cw)
            assert out[v][1].dtype == np.float32 and out[v][1].shape == shape, (v, out[v][1].shape)
        # the transformers pipeline as understood: crop int((H - c) / 2) of the resized u8, (x - m*255) / (s*255)
        r = out["hf"][0]
        top, left = (oh - ch) // 2, (ow - cw) // 2
        m = torch.tensor(MEAN) * (1.0 / (1 / 255)), torch.tensor(STD) * (1.0 / (1 / 255))
        mine = ((torch.from_numpy(r[:, top:top + ch, left:left + cw]).permute(0, 3, 1, 2).float()
                 - m[0].view(3, 1, 1)) / m[1].view(3, 1, 1)).numpy()
        assert np.array_equal(mine, out["hf"][1]), "transformers' CLIPImageProcessor is not what clip_image.h says"
        return out

    return run


def main():
    from safetensors.numpy import save_file
    import open_clip

    small_dir = os.path.join(FIX, "clip_image_small")
    real_dir = os.path.join(FIX, "clip_image_224")
    write_config(small_dir, {"image_processor_type": "CLIPImageProcessor", "do_resize": True,
                             "size": {"shortest_edge": 16}, "resample": 3, "do_center_crop": True,
                             "crop_size": {"height": 12, "width": 16}, "do_rescale": True,
                             "rescale_factor": 0.00392156862745098, "do_normalize": True, "image_mean": MEAN,
                             "image_std": STD, "do_convert_rgb": True})
    write_config(real_dir, {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
                            "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": MEAN,
                            "image_std": STD, "resample": 3, "size": 224})
    tensors, diffs = {}, {"u8_pixels_torch_vs_pil": [0, 0], "max_abs": {}}

    def note(out):
        a, b = out["hf"][0], out["hf_pil"][0]
        diffs["u8_pixels_torch_vs_pil"][0] += int((a != b).sum())
        diffs["u8_pixels_torch_vs_pil"][1] += int(a.size)
        for v in ("hf_pil", "open_clip"):
            d = float(np.abs(out["hf"][1] - out[v][1]).max())
            diffs["max_abs"][f"hf_vs_{v}"] = max(diffs["max_abs"].get(f"hf_vs_{v}", 0.0), d)
        d = float(np.abs(out["hf_pil"][1] - out["open_clip"][1]).max())
        diffs["max_abs"]["hf_pil_vs_open_clip"] = max(diffs["max_abs"].get("hf_pil_vs_open_clip", 0.0), d)

    run = references(small_dir, 16, 12, 16)
    for i, (n, h, w, seed) in enumerate(SMALL):
        out = run(frame_pixels(n, h, w, seed))
        note(out)
        assert np.array_equal(out["hf_pil"][0], out["open_clip"][0])
        tensors[f"small.{i}.resized.hf"] = np.ascontiguousarray(out["hf"][0])
        tensors[f"small.{i}.resized.pil"] = np.ascontiguousarray(out["hf_pil"][0])
        tensors[f"small.{i}.resized.hpsv2"] = np.ascontiguousarray(out["hpsv2"][0])
        for v in VARIANTS:
            tensors[f"small.{i}.out.{v}"] = np.ascontiguousarray(out[v][1])

    run = references(real_dir, 224, 224, 224)
    ref_oc = open_clip.transform.image_transform(224, is_train=False)
    for i, (n, h, w, seed) in enumerate(REAL):
        frames = frame_pixels(n, h, w, seed)
        out = run(frames)
        note(out)
        from PIL import Image
        assert np.array_equal(torch.stack([ref_oc(Image.fromarray(a)) for a in frames]).numpy(), out["open_clip"][1])
        for v in VARIANTS:
            r, p = out[v]
            tensors[f"real.{i}.hash.{v}"] = np.array([fnv64(np.ascontiguousarray(r).tobytes()),
                                                       fnv64(np.ascontiguousarray(p).astype("<f4").tobytes())],
                                                      dtype=np.int64)
        print(f"real case {i}: {n} x {h}x{w} done")
    diffs["max_abs"]["open_clip3_longest_vs_hpsv2"] = max(diffs_oc3)
    meta = {"small": json.dumps([list(c) for c in SMALL]), "real": json.dumps([list(c) for c in REAL]),
            "diffs": json.dumps(diffs)}
    save_file(tensors, os.path.join(FIX, "clip_image_io.safetensors"), metadata=meta)
    print("references against each other:", json.dumps(diffs))


if __name__ == "__main__":
    main()
