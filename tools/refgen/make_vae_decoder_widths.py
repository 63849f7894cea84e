#!/usr/bin/env python3
"""
Writes tests/cases/vae-decode-flux2-decoder-widths: the FLUX.2 decode tail through an
AutoencoderKLFlux2 whose decoder is built from `decoder_block_out_channels`, widths that
differ from the encoder's `block_out_channels` (a key diffusers 0.42 has and 0.37 had not).

The VAE is tiny and seeded; `save_pretrained` writes the folder (so its config.json is what
diffusers 0.42 writes: no `force_upcast`), and the reference is computed from the folder as
a user loads it, in float64 (`out.*`) and float32 (`out_f32.*`), in the golden format
(tests/golden/README.md). The tokens come in a shuffled order, so the scatter by ids is a
real permutation.

    /work/venv/bin/python tools/refgen/make_vae_decoder_widths.py [OUT_DIR]
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
import diffusers
from diffusers import AutoencoderKLFlux2, Flux2Pipeline
from safetensors.numpy import save_file

CASE = "vae-decode-flux2-decoder-widths"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=["DownEncoderBlock2D"] * 3,
    up_block_types=["UpDecoderBlock2D"] * 3,
    block_out_channels=[4, 4, 4],           # encoder
    decoder_block_out_channels=[4, 8, 12],  # decoder: narrower at full resolution, wider below
    layers_per_block=1,
    latent_channels=32,
    norm_num_groups=4,
    sample_size=32,
)


def build_vae(path):
    torch.manual_seed(20260)
    vae = AutoencoderKLFlux2(**CONFIG)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if "norm" in name:  # GroupNorm affine: away from 1 / 0 so it matters
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
        vae.bn.running_mean.copy_(0.5 * torch.randn_like(vae.bn.running_mean))
        vae.bn.running_var.copy_(0.5 + torch.rand_like(vae.bn.running_var))
    vae.save_pretrained(path)


def run(vae_dir, latents, ids, dtype):
    vae = AutoencoderKLFlux2.from_pretrained(vae_dir, torch_dtype=dtype).eval()
    with torch.no_grad():
        x = latents.to(dtype)
        unpacked = Flux2Pipeline._unpack_latents_with_ids(x, ids)
        if isinstance(unpacked, (list, tuple)):
            unpacked = torch.stack(unpacked)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(dtype)
        denormalized = unpacked * std + mean
        unpatchified = Flux2Pipeline._unpatchify_latents(denormalized)
        decoded = vae.decode(unpatchified, return_dict=False)[0]
        image = (decoded / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float().to(dtype)
    image_u8 = np.ascontiguousarray((image.float().numpy() * 255).round().astype(np.uint8))
    outs = dict(unpacked=unpacked, denormalized=denormalized, unpatchified=unpatchified,
                decoded=decoded, image=image)
    return {k: np.ascontiguousarray(v.numpy()) for k, v in outs.items()}, image_u8


def tolerance(ref, f32):
    diff = np.abs(ref - f32.astype(np.float64))
    max_abs = max(20 * float(diff.max()), 1e-5)
    rel = float(np.linalg.norm(ref - f32) / max(np.linalg.norm(ref), 1e-30))
    return {"max_abs": float(f"{max_abs:.3g}"), "rel_l2": float(f"{max(20 * rel, 1e-6):.3g}")}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "cases", CASE)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    vae_dir = os.path.join(out_dir, "vae")
    build_vae(vae_dir)

    h, w = 2, 3  # patch grid -> latents (32, 4, 6) -> 3 blocks (x4) -> 16 x 24 pixels
    g = torch.Generator("cpu").manual_seed(7)
    latents = torch.randn(1, h * w, 128, generator=g, dtype=torch.float32)
    raster = torch.tensor([[0, y, x, 0] for y in range(h) for x in range(w)], dtype=torch.int64)
    order = torch.randperm(h * w, generator=g)
    ids = raster[order].unsqueeze(0)

    ref, ref_u8 = run(vae_dir, latents, ids, torch.float64)
    f32, f32_u8 = run(vae_dir, latents, ids, torch.float32)

    tensors = {"in.latents": latents.numpy(), "in.latent_ids": ids.numpy()}
    for k in ref:
        tensors[f"out.{k}"] = ref[k].astype(np.float64)
        tensors[f"out_f32.{k}"] = f32[k].astype(np.float32)
    tensors["out.image_uint8"] = ref_u8
    tensors["out_f32.image_uint8"] = f32_u8
    save_file(tensors, os.path.join(out_dir, "case.safetensors"))

    tol = {k: tolerance(ref[k], f32[k]) for k in ref}
    tol["image_uint8"] = {"max_abs": 1, "rel_l2": 1.0}
    case = {
        "format": 2,
        "case": CASE,
        "kind": "vae_decode",
        "covers": "FLUX.2 tail through an AutoencoderKLFlux2 whose decoder_block_out_channels "
                  "[4, 8, 12] differ from block_out_channels [4, 4, 4]: packed (1,6,128) + "
                  "shuffled ids -> unpack -> BN de-normalisation -> unpatchify (1,32,4,6) -> "
                  "decode -> 16x24",
        "class": "AutoencoderKLFlux2",
        "dir": "vae",
        "call": "unpacked = Flux2Pipeline._unpack_latents_with_ids(latents, latent_ids); "
                "denormalized = unpacked * sqrt(vae.bn.running_var + vae.config.batch_norm_eps)"
                ".view(1,-1,1,1) + vae.bn.running_mean.view(1,-1,1,1); unpatchified = "
                "Flux2Pipeline._unpatchify_latents(denormalized); decoded = "
                "vae.decode(unpatchified).sample; image = clamp(decoded/2+0.5, 0, 1) NHWC; "
                "image_uint8 = (image*255).round()",
        "args": {"latents": "in.latents", "latent_ids": "in.latent_ids", "output_type": "np"},
        "outputs": {k: f"out.{k}" for k in list(ref) + ["image_uint8"]},
        "tolerance": tol,
        "exact": [],
        "notes": [
            "diffusers 0.42 builds the decoder from decoder_block_out_channels (null or empty: "
            "block_out_channels); the encoder keeps block_out_channels",
            "config.json is what diffusers 0.42 save_pretrained writes: it has no force_upcast",
            "the tokens are in a shuffled order (in.latent_ids), so unpacking scatters them",
            "vae_scale_factor = 4 (three blocks); image = 8 x patch grid",
            "out.* = float64 run of the saved folder; out_f32.* = float32; image_uint8 may "
            "differ by 1",
        ],
        "provenance": {
            "diffusers": {"version": diffusers.__version__},
            "torch": torch.__version__,
            "tool": "tools/refgen/make_vae_decoder_widths.py",
        },
        "tensors": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in
                    sorted(tensors.items())},
        "details": {"config": CONFIG},
    }
    with open(os.path.join(out_dir, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")
    print(out_dir, {k: tol[k] for k in tol})


if __name__ == "__main__":
    main()
