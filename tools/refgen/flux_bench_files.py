#!/usr/bin/env python3
"""Large files for measuring single-file loading (docs/io.md, `diffuse-bench single-file`):
a FLUX.1-dev-width transformer (hidden 3072, 24 heads, joint 4096, pooled 768, guidance)
with reduced depth (--double / --single blocks), random weights, written as
  folder/transformer/  config.json + diffusion_pytorch_model.safetensors (diffusers, bf16)
  bfl-bf16.safetensors        BFL names, bf16
  comfy-fp8.safetensors       ComfyUI prefix, 2-D weights fp8 e4m3 + scale_weight
  q8_0.gguf / q4_k.gguf       city96 layout (2-D Q8_0 / Q4_K where the width allows, 1-D F32)
Not reference data: nothing is compared; only load time, memory and step time are read.
Usage: python tools/refgen/flux_bench_files.py OUT_DIR [--double 1] [--single 2]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as Q
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flux_single_file import to_bfl  # noqa: E402


def quantize_q4_k(x):
    """Vectorised simple Q4_K (per 32-value sub-block 6-bit scale and min, 4-bit codes)."""
    b = x.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(b.min(axis=2), 0)
    sc = (b.max(axis=2) - lo) / 15
    mn = -lo
    d = np.maximum(sc.max(axis=1) / 63, 1e-12).astype(np.float16)
    dmin = np.maximum(mn.max(axis=1) / 63, 1e-12).astype(np.float16)
    qs = np.clip(np.round(sc / d.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    qm = np.clip(np.round(mn / dmin.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    n = b.shape[0]
    scales = np.zeros((n, 12), dtype=np.uint8)
    scales[:, 0:4] = qs[:, 0:4] | ((qs[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = qm[:, 0:4] | ((qm[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (qs[:, 4:8] & 0xF) | ((qm[:, 4:8] & 0xF) << 4)
    dj = d.astype(np.float32)[:, None] * qs
    mj = dmin.astype(np.float32)[:, None] * qm
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(dj[:, :, None] > 0,
                         np.round((b + mj[:, :, None]) / dj[:, :, None]), 0)
    codes = np.clip(codes, 0, 15).astype(np.uint8)
    q = (codes[:, 0::2, :] | (codes[:, 1::2, :] << 4)).reshape(n, 128)
    out = np.concatenate([d.view(np.uint8).reshape(n, 2), dmin.view(np.uint8).reshape(n, 2),
                          scales, q], axis=1)
    return out.reshape(x.shape[0], -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--double", type=int, default=1)
    ap.add_argument("--single", type=int, default=2)
    a = ap.parse_args()
    cfg = {"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 64,
           "num_layers": a.double, "num_single_layers": a.single, "attention_head_dim": 128,
           "num_attention_heads": 24, "joint_attention_dim": 4096,
           "pooled_projection_dim": 768, "guidance_embeds": True,
           "axes_dims_rope": [16, 56, 56]}
    from diffusers import FluxTransformer2DModel
    torch.manual_seed(0)
    with torch.device("meta"):
        model = FluxTransformer2DModel(**{k: v for k, v in cfg.items() if k[0] != "_"})
    sd = {}
    g = torch.Generator().manual_seed(1)
    for k, v in model.state_dict().items():
        sd[k] = (torch.randn(v.shape, generator=g) * 0.02).to(torch.bfloat16)
    tdir = os.path.join(a.out, "folder", "transformer")
    os.makedirs(tdir, exist_ok=True)
    json.dump(cfg, open(os.path.join(tdir, "config.json"), "w"), indent=1)
    save_file(sd, os.path.join(tdir, "diffusion_pytorch_model.safetensors"))
    bfl = to_bfl(sd, a.double, a.single)
    save_file(bfl, os.path.join(a.out, "bfl-bf16.safetensors"))
    comfy = {}
    for k, v in bfl.items():
        p = "model.diffusion_model." + k
        if v.ndim == 2:
            s = v.float().abs().max() / 448
            comfy[p] = (v.float() / s).to(torch.float8_e4m3fn)
            comfy[p[:-len("weight")] + "scale_weight"] = s.reshape(())
        else:
            comfy[p] = v
    save_file(comfy, os.path.join(a.out, "comfy-fp8.safetensors"))
    del comfy
    for scheme in ("q8_0", "q4_k"):
        w = gguf.GGUFWriter(os.path.join(a.out, scheme + ".gguf"), arch="flux")
        for k in sorted(bfl):
            v = bfl[k].float().numpy()
            if v.ndim == 2 and scheme == "q4_k" and v.shape[1] % 256 == 0:
                w.add_tensor(k, quantize_q4_k(v), raw_dtype=Q.Q4_K)
            elif v.ndim == 2 and v.shape[1] % 32 == 0:
                w.add_tensor(k, gguf.quants.quantize(v, Q.Q8_0), raw_dtype=Q.Q8_0)
            else:
                w.add_tensor(k, v.astype(np.float32 if v.ndim == 1 else np.float16))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


if __name__ == "__main__":
    main()
