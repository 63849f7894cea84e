"""Helpers shared by the reference-case scripts of tools/refgen/.

A case folder is written in the golden format (tests/golden/README.md): case.json and
case.safetensors with in.* (inputs), out.* (the float64 reference), out_f32.* (torch's own
float32 run, for context). Tolerances follow the golden rule: 20x the float32-vs-float64
difference, with floors.

float64 references draw their noise in float32, as a float32 pipeline does: randn_tensor is
replaced by one that draws float32 values from the generator and casts them.
"""
import json
import os

import numpy as np
import torch
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = os.path.join(ROOT, "tests", "cases")


def patch_randn_float32():
    """Every randn_tensor diffusers calls draws float32, then casts to the asked dtype."""
    import diffusers.utils.torch_utils as tu
    original = tu.randn_tensor

    def randn_f32(shape, generator=None, device=None, dtype=None, layout=None):
        out = original(shape, generator=generator, device=device, dtype=torch.float32,
                       layout=layout)
        return out.to(dtype) if dtype is not None else out

    import importlib
    import sys
    tu.randn_tensor = randn_f32
    for name, mod in list(sys.modules.items()):
        if name.startswith("diffusers") and getattr(mod, "randn_tensor", None) is original:
            mod.randn_tensor = randn_f32
    return importlib


def tolerance(ref, f32, floor_abs, floor_rel):
    ref = np.asarray(ref, np.float64)
    d = np.abs(np.asarray(f32, np.float64) - ref)
    rel = float(np.linalg.norm(d) / max(np.linalg.norm(ref), 1e-30))
    return {"max_abs": float(f"{max(20 * float(d.max()), floor_abs):.3g}"),
            "rel_l2": float(f"{max(20 * rel, floor_rel):.3g}")}


def write_case(name, meta, tensors):
    """meta: case.json without format/case/tensors; tensors: name -> numpy array."""
    out = os.path.join(CASES, name)
    os.makedirs(out, exist_ok=True)
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    save_file(arrays, os.path.join(out, "case.safetensors"))
    doc = {"format": 2, "case": name}
    doc.update(meta)
    doc["tensors"] = {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in arrays.items()}
    with open(os.path.join(out, "case.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return out


def provenance():
    import diffusers
    import PIL
    return {"diffusers": diffusers.__version__, "torch": torch.__version__,
            "pillow": PIL.__version__}


def picture(w, h, seed, noise=6.0):
    """A small scene: a gradient background, a disc and a box, with a little noise (none
    for noise=0: large pictures then compress to a few kilobytes)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    img[..., 0] = 40 + 180 * (x / max(w - 1, 1))
    img[..., 1] = 60 + 150 * (y / max(h - 1, 1))
    img[..., 2] = 200 - 120 * (x / max(w - 1, 1))
    r = min(w, h) / 4
    img[(x - w / 3) ** 2 + (y - h / 2) ** 2 < r * r] = [240, 220, 30]
    img[h // 6: h // 3, w // 2: w - 3] = [20, 20, 200]
    img += rng.normal(0, noise, img.shape) if noise else 0
    return np.clip(np.round(img), 0, 255).astype(np.uint8)
