"""Reference cases for the VAE encoder (kind "vae_encode").

What img2img pipelines do to an input picture before denoising, on the tiny VAEs of
tests/golden: VaeImageProcessor.preprocess (PIL resize when the size differs, [0,1], then
[-1,1]), AutoencoderKL.encode (moments = the posterior's mean and log variance),
retrieve_latents with sample(generator) or argmax (mode), then (x - shift_factor) *
scaling_factor; vae-encode-flux-tiled with enable_tiling() and 32-pixel tiles
(AutoencoderKL._tiled_encode: 4 x 4 overlapping tiles, blended). out.* in float64 (noise drawn in float32, as a float32 pipeline draws it); torch's
float32 run sets the tolerances but is not stored.

    /work/venv/bin/python tools/refgen/vae_encode.py [CASE ...]
"""
import os
import sys

import numpy as np
import torch
from PIL import Image

import refcase
from diffusers import AutoencoderKL, AutoencoderKLFlux2
from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline
from diffusers.image_processor import VaeImageProcessor
from diffusers.pipelines.flux.pipeline_flux_img2img import retrieve_latents

refcase.patch_randn_float32()

CASES = [
    # name, golden vae folder, picture sizes (w, h), processor factor, height, width, seed, mode
    ("vae-encode-flux", "vae-decode-flux", [(40, 48)], 16, 64, 64, 7, "sample"),
    ("vae-encode-sd3-b2", "vae-decode-sd3", [(64, 64), (64, 64)], 8, 64, 64, 3, "sample"),
    ("vae-encode-sd3-mode", "vae-decode-sd3", [(72, 70)], 8, None, None, None, "argmax"),
    ("vae-encode-flux2", "vae-decode-flux2", [(64, 64)], 16, 64, 64, None, "argmax"),
    # decoder_block_out_channels [4, 8, 12] beside block_out_channels [4, 4, 4]: the encoder
    # is built from the latter (a folder of tests/cases, not tests/golden)
    ("vae-encode-flux2-widths", "cases/vae-decode-flux2-decoder-widths", [(32, 32)], 16, 32,
     32, None, "argmax"),
    # enable_tiling() with tile_sample_min_size 32 (tile_latent_min_size 4): tiles every 24
    # pixels, the last ones 8 rows / 24 columns, blended over 1 latent row / column
    ("vae-encode-flux-tiled", "vae-decode-flux", [(96, 80)], 16, None, None, 5, "sample", 32),
]


def run(vae_dir, pictures, factor, height, width, seed, mode, dtype, tile=None):
    flux2 = "flux2" in vae_dir
    vae = (AutoencoderKLFlux2 if flux2 else AutoencoderKL).from_pretrained(vae_dir).to(dtype)
    if tile:
        vae.enable_tiling()
        vae.tile_sample_min_size = tile
        vae.tile_latent_min_size = tile // (2 ** (len(vae.config.block_out_channels) - 1))
    proc = VaeImageProcessor(vae_scale_factor=factor)
    pre = proc.preprocess(pictures if len(pictures) > 1 else pictures[0], height=height,
                          width=width)
    with torch.no_grad():
        moments = vae.encode(pre.to(dtype)).latent_dist.parameters
        gen = torch.Generator("cpu").manual_seed(seed) if seed is not None else None
        lat = retrieve_latents(vae.encode(pre.to(dtype)), generator=gen, sample_mode=mode)
    if flux2:  # Flux2Pipeline._encode_vae_image after retrieve_latents
        p = Flux2Pipeline._patchify_latents(lat)
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(dtype)
        scaled = (p - mean) / std
    else:
        scaled = (lat - vae.config.shift_factor) * vae.config.scaling_factor
    return pre, moments, lat, scaled


def main():
    only = set(sys.argv[1:])  # case names to (re)make; none: all
    for name, golden, sizes, factor, height, width, seed, mode, *tile in CASES:
        tile = tile[0] if tile else None
        if only and name not in only:
            continue
        in_cases = golden.startswith("cases/")
        vae_dir = os.path.join(refcase.ROOT, "tests", golden if in_cases else "golden/" + golden,
                               "vae")
        out_dir = os.path.join(refcase.CASES, name)
        os.makedirs(out_dir, exist_ok=True)
        files, pictures = [], []
        for i, (w, h) in enumerate(sizes):
            fname = f"image{i}.png"
            Image.fromarray(refcase.picture(w, h, 100 + i), "RGB").save(os.path.join(out_dir, fname))
            files.append(fname)
            pictures.append(Image.open(os.path.join(out_dir, fname)))
        r64 = run(vae_dir, pictures, factor, height, width, seed, mode, torch.float64, tile)
        r32 = run(vae_dir, pictures, factor, height, width, seed, mode, torch.float32, tile)
        names = ["preprocessed", "moments", "latents", "latents_scaled"]
        tensors, tol = {}, {}
        for n, a, b in zip(names, r64, r32):
            # preprocessed holds float32 values exactly; the rest is float64
            tensors["out." + n] = a.numpy().astype(np.float32 if n == "preprocessed" else np.float64)
            tol[n] = refcase.tolerance(a.numpy(), b.numpy(), 1e-5, 1e-6)
        tol["preprocessed"] = {"max_abs": 1e-7, "rel_l2": 1e-7}
        refcase.write_case(name, {
            "kind": "vae_encode",
            "covers": f"{len(files)} picture(s) -> VaeImageProcessor(vae_scale_factor={factor})"
                      f".preprocess -> AutoencoderKL.encode -> retrieve_latents({mode}) -> "
                      "(x - shift) * scale",
            "class": "AutoencoderKLFlux2" if "flux2" in golden else "AutoencoderKL",
            "dir": f"../{golden[6:]}/vae" if in_cases else f"../../golden/{golden}/vae",
            "call": "pre = VaeImageProcessor(vae_scale_factor).preprocess(images, height, width); "
                    "moments = vae.encode(pre).latent_dist.parameters; latents = retrieve_latents("
                    "vae.encode(pre), generator, sample_mode); latents_scaled = (latents - "
                    "shift_factor) * scaling_factor",
            "args": {"images": files, "vae_scale_factor": factor, "height": height,
                     "width": width,
                     "generator": {"device": "cpu", "seed": seed} if seed is not None else None,
                     "sample_mode": mode, **({"tile_sample_min_size": tile} if tile else {})},
            "outputs": {n: "out." + n for n in names},
            "tolerance": tol,
            "exact": [],
            "notes": ["out.* = VAE in float64 with the posterior noise drawn in float32 "
                      "(randn_tensor patched to draw float32 and upcast); the tolerances are 20x the difference of "
                      "torch's float32 run (not stored, to keep the case small)",
                      "images are PNG files in the case folder, read as PIL RGB images",
                      "preprocessed is exact up to float32 rounding (PIL's resize is integer)",
                      "AutoencoderKLFlux2: latents_scaled = Flux2Pipeline._encode_vae_image: "
                      "_patchify_latents(latents), then (x - bn.running_mean) / sqrt("
                      "bn.running_var + batch_norm_eps)"],
            "provenance": refcase.provenance(),
        }, tensors)
        print(name, {k: v for k, v in tol.items()})


if __name__ == "__main__":
    main()
