#!/usr/bin/env python3
"""Single-file VAE and text encoder cases: the golden pipelines' tiny components rewritten
in the layouts people download, with diffusers' / transformers' own single-file loading as
the reference.

  vae-single-flux       FLUX.1's AutoencoderKL (t2i-flux-schnell) as Black Forest Labs'
                        ae.safetensors: the original LDM names, no prefix, attention as 1x1
                        convolutions, float16
  vae-single-sd3-comfy  SD3's AutoencoderKL (t2i-sd3) under ComfyUI's / SAI's
                        "first_stage_model." prefix, float16
  te-single-clip-comfy  t2i-flux-schnell's CLIP-L under "text_encoders.clip_l.transformer."
                        in float8 e4m3 (2-D weights) and float16 (the rest), as ComfyUI's
                        all-in-one files and clip_l.safetensors hold it

The VAE reference: AutoencoderKL.from_single_file(file, config=<golden vae folder>) (its
convert_ldm_vae_checkpoint), checked here to give exactly the folder's weights rounded to
float16, then decoding small latents in float64 (out.*) and float32 (out_f32.*). The CLIP
reference: diffusers' single-file CLIP loading strips the prefix and loads transformers'
state dict; the script does the same with the file's tensors upcast (w.float()) into
CLIPTextModel, run in float64. Tolerances follow the golden rule.

Usage: python tools/refgen/component_files.py
"""
import json
import os
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import diffusers
from diffusers import AutoencoderKL
from diffusers.image_processor import VaeImageProcessor
import transformers
from transformers import CLIPTextModel, CLIPTokenizer

from refcase import ROOT, tolerance, write_case

GOLDEN = os.path.join(ROOT, "tests", "golden")


def to_ldm_vae(sd, n_up):
    """diffusers AutoencoderKL names -> the original LDM names (inverse of diffusers'
    convert_ldm_vae_checkpoint)."""
    out = {}
    attn = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    for name, w in sd.items():
        n = name
        for half in ("encoder", "decoder"):
            n = n.replace(f"{half}.conv_norm_out.", f"{half}.norm_out.")
            n = n.replace(f"{half}.mid_block.resnets.0.", f"{half}.mid.block_1.")
            n = n.replace(f"{half}.mid_block.resnets.1.", f"{half}.mid.block_2.")
            for a, b in attn.items():
                if n.startswith(f"{half}.mid_block.attentions.0.{a}."):
                    n = n.replace(f"{half}.mid_block.attentions.0.{a}.", f"{half}.mid.attn_1.{b}.")
                    if w.ndim == 2:
                        w = w[:, :, None, None]  # 1x1 convolutions there
        parts = n.split(".")
        if parts[0] == "encoder" and parts[1] == "down_blocks":
            i = parts[2]
            if parts[3] == "resnets":
                n = ".".join(["encoder", "down", i, "block", parts[4]] + parts[5:])
            else:  # downsamplers.0.conv
                n = ".".join(["encoder", "down", i, "downsample"] + parts[5:])
        if parts[0] == "decoder" and parts[1] == "up_blocks":
            i = str(n_up - 1 - int(parts[2]))
            if parts[3] == "resnets":
                n = ".".join(["decoder", "up", i, "block", parts[4]] + parts[5:])
            else:  # upsamplers.0.conv
                n = ".".join(["decoder", "up", i, "upsample"] + parts[5:])
        n = n.replace(".conv_shortcut.", ".nin_shortcut.")
        out[n] = w
    return out


def vae_case(name, pipe, prefix, covers):
    vae_dir = os.path.join(GOLDEN, pipe, "pipeline", "vae")
    ref = AutoencoderKL.from_pretrained(vae_dir)
    sd = {k: v.to(torch.float16).contiguous() for k, v in ref.state_dict().items()}
    n_up = len(ref.config.block_out_channels)
    ldm = {prefix + k: v.contiguous() for k, v in to_ldm_vae(sd, n_up).items()}
    out = os.path.join(ROOT, "tests", "cases", name)
    os.makedirs(out, exist_ok=True)
    file = "ae.safetensors" if not prefix else "sd3-vae-comfy.safetensors"
    save_file(ldm, os.path.join(out, file))

    # diffusers' own single-file loading is the reference
    m64 = AutoencoderKL.from_single_file(os.path.join(out, file), config=vae_dir,
                                         torch_dtype=torch.float64)
    got = m64.state_dict()
    assert set(got) == set(sd), (set(got) ^ set(sd))
    for k in sd:
        assert torch.equal(got[k].to(torch.float16), sd[k]), k
    m32 = AutoencoderKL.from_single_file(os.path.join(out, file), config=vae_dir,
                                         torch_dtype=torch.float32)

    g = torch.Generator().manual_seed(3)
    c = ref.config.latent_channels
    latents = torch.randn(1, c, 4, 4, generator=g)  # a 32x32 picture
    proc = VaeImageProcessor(vae_scale_factor=8)
    res = {}
    for tag, m, dt in (("out", m64, torch.float64), ("out_f32", m32, torch.float32)):
        with torch.no_grad():
            scaled = latents.to(dt) / m.config.scaling_factor + m.config.shift_factor
            decoded = m.decode(scaled).sample
        image = proc.postprocess(decoded, output_type="pt").permute(0, 2, 3, 1)
        res[tag] = {"scaled": scaled.numpy(), "decoded": decoded.numpy(),
                    "image": image.numpy()}
    u8 = (res["out"]["image"] * 255).round().astype(np.uint8)
    tensors = {"in.latents": latents.numpy()}
    for k in ("scaled", "decoded"):  # (no float32 copies: the folder stays small)
        tensors[f"out.{k}"] = res["out"][k]
    tensors["out.image_uint8"] = u8
    tol = {k: tolerance(res["out"][k], res["out_f32"][k], 1e-5, 1e-6)
           for k in ("scaled", "decoded")}
    tol["image_uint8"] = {"max_abs": 1, "rel_l2": 0.01}
    write_case(name, {
        "kind": "vae_decode",
        "covers": covers,
        "class": "AutoencoderKL",
        "dir": f"../../golden/{pipe}/pipeline/vae",
        "single_file": file,
        "call": "m = AutoencoderKL.from_single_file(single_file, config=dir); scaled = latents "
                "/ scaling_factor + shift_factor; decoded = m.decode(scaled).sample; image = "
                "VaeImageProcessor.postprocess(decoded) as (B, H, W, 3)",
        "args": {"latents": "in.latents", "height": 32, "width": 32,
                 "unpack_latents": False, "output_type": "np"},
        "outputs": {k: f"out.{k}" for k in ("scaled", "decoded", "image_uint8")},
        "tolerance": tol,
        "exact": [],
        "notes": ["dir gives the config only; the weights are the golden folder's rounded to "
                  "float16, checked equal to what from_single_file reads"],
        "provenance": {"diffusers": diffusers.__version__, "torch": torch.__version__},
    }, tensors)


def clip_case(name):
    pipe = os.path.join(GOLDEN, "t2i-flux-schnell", "pipeline")
    te_dir = os.path.join(pipe, "text_encoder")
    ref = CLIPTextModel.from_pretrained(te_dir)
    prefix = "text_encoders.clip_l.transformer."
    file = {}
    for k, v in ref.state_dict().items():
        if k.endswith("position_ids"):
            continue
        v = v.to(torch.float8_e4m3fn) if v.ndim == 2 else v.to(torch.float16)
        file[prefix + k] = v.contiguous()
    out = os.path.join(ROOT, "tests", "cases", name)
    os.makedirs(out, exist_ok=True)
    save_file(file, os.path.join(out, "clip_l-comfy-fp8.safetensors"))

    # what diffusers' single-file CLIP loading does: strip the prefix, load the state dict
    sd = {k[len(prefix):]: v.float() for k, v in load_file(
        os.path.join(out, "clip_l-comfy-fp8.safetensors")).items()}
    tok = CLIPTokenizer.from_pretrained(os.path.join(pipe, "tokenizer"))
    ids = tok(["a photo of a cat"], padding="max_length", max_length=77,
              truncation=True, return_tensors="pt").input_ids
    res = {}
    for tag, dt in (("out", torch.float64), ("out_f32", torch.float32)):
        m = CLIPTextModel.from_pretrained(te_dir, torch_dtype=dt)
        missing, unexpected = m.load_state_dict({k: v.to(dt) for k, v in sd.items()},
                                                strict=False)
        assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
        with torch.no_grad():
            o = m(input_ids=ids, output_hidden_states=True)
        res[tag] = {"last_hidden_state": o.last_hidden_state.numpy(),
                    "pooler_output": o.pooler_output.numpy()}
    tensors = {"in.input_ids": ids.numpy().astype(np.int64)}
    for k in res["out"]:  # (no float32 copies: the folder stays small)
        tensors[f"out.{k}"] = res["out"][k]
    write_case(name, {
        "kind": "text_encoder",
        "covers": "CLIPTextModel from a ComfyUI-prefixed single file "
                  "(text_encoders.clip_l.transformer.), fp8 e4m3 2-D weights, f16 the rest",
        "class": "CLIPTextModel",
        "dir": "../../golden/t2i-flux-schnell/pipeline/text_encoder",
        "single_file": "clip_l-comfy-fp8.safetensors",
        "call": "m = CLIPTextModel(config of dir) with the file's tensors, prefix stripped, "
                "upcast; o = m(input_ids, output_hidden_states=True)",
        "args": {"input_ids": "in.input_ids", "output_hidden_states": True},
        "outputs": {k: f"out.{k}" for k in res["out"]},
        "tolerance": {k: tolerance(res["out"][k], res["out_f32"][k], 1e-5, 1e-6)
                      for k in res["out"]},
        "exact": [],
        "notes": ["dir gives the config only"],
        "provenance": {"diffusers": diffusers.__version__,
                       "transformers": transformers.__version__, "torch": torch.__version__},
    }, tensors)


if __name__ == "__main__":
    vae_case("vae-single-flux", "t2i-flux-schnell", "",
             "FLUX.1 AutoencoderKL as BFL's ae.safetensors (LDM names, 1x1-conv attention, "
             "f16) -> decode 4x4 latents -> 32x32")
    vae_case("vae-single-sd3-comfy", "t2i-sd3", "first_stage_model.",
             "SD3 AutoencoderKL under first_stage_model. (LDM names, f16) -> decode 4x4 "
             "latents -> 32x32")
    clip_case("te-single-clip-comfy")
