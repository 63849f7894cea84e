#!/usr/bin/env python3
"""Reference case for fp8 safetensors (tests/cases/fp8-safetensors).

model.safetensors holds, as torch writes them:
  all.e4m3 / all.e5m2        [16, 16] every bit pattern of float8_e4m3fn / float8_e5m2;
  plain.weight               [4, 8] e4m3, no scale;
  comfy.weight + comfy.scale_weight   [4, 8] e4m3 with ComfyUI's per-tensor f32 scale;
  fp8.weight + fp8.weight_scale       [4, 8] e5m2 with a per-tensor f32 scale (shape []);
  row.weight + row.weight_scale       [4, 8] e4m3 with a per-output-row f32 scale [4, 1].
case.safetensors holds out.<name> = weight.to(float32) * scale.to(float32) (torch's own
upcast; the scale broadcast as torch broadcasts it), in f32.
Usage: python tools/refgen/fp8_safetensors.py tests/cases/fp8-safetensors
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(8)
    pattern = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    w = {
        "all.e4m3": pattern.view(torch.float8_e4m3fn),
        "all.e5m2": pattern.clone().view(torch.float8_e5m2),
        "plain.weight": (torch.randn(4, 8, generator=g) * 3).to(torch.float8_e4m3fn),
        "comfy.weight": (torch.randn(4, 8, generator=g) * 100).to(torch.float8_e4m3fn),
        "comfy.scale_weight": torch.tensor(0.0123, dtype=torch.float32),
        "fp8.weight": (torch.randn(4, 8, generator=g) * 100).to(torch.float8_e5m2),
        "fp8.weight_scale": torch.tensor(0.37, dtype=torch.float32),
        "row.weight": (torch.randn(4, 8, generator=g) * 100).to(torch.float8_e4m3fn),
        "row.weight_scale": torch.rand(4, 1, generator=g) + 0.01,
    }
    save_file(w, os.path.join(out_dir, "model.safetensors"))
    scales = {"comfy.weight": "comfy.scale_weight", "fp8.weight": "fp8.weight_scale",
              "row.weight": "row.weight_scale"}
    out = {}
    for name in ["all.e4m3", "all.e5m2", "plain.weight", "comfy.weight", "fp8.weight",
                 "row.weight"]:
        v = w[name].to(torch.float32)
        if name in scales:
            v = v * w[scales[name]].to(torch.float32)
        out["out." + name] = v.contiguous()
    save_file(out, os.path.join(out_dir, "case.safetensors"))
    case = {
        "format": 2,
        "case": os.path.basename(os.path.normpath(out_dir)),
        "kind": "fp8_read",
        "covers": "safetensors F8_E4M3 / F8_E5M2 upcast exactly, every bit pattern, with "
                  "ComfyUI's scale_weight and per-tensor / per-row weight_scale applied",
        "class": "torch.Tensor.to(torch.float32)",
        "dir": ".",
        "call": "w.to(torch.float32) * scale.to(torch.float32)",
        "args": {"file": "model.safetensors"},
        "outputs": {k[4:]: k for k in out},
        "tolerance": {k[4:]: {"max_abs": 0.0, "rel_l2": 0.0} for k in out},
        "exact": [],
        "notes": ["NaN patterns (e4m3fn 0x7f/0xff; e5m2 exponent 31 with a mantissa) must "
                  "read as NaN, e5m2 0x7c/0xfc as +-inf"],
        "provenance": {"torch": torch.__version__},
        "tensors": {k: {"dtype": "float32", "shape": list(v.shape)} for k, v in out.items()},
    }
    with open(os.path.join(out_dir, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/cases/fp8-safetensors")
