#!/usr/bin/env python3
"""An all-in-one FLUX.1 checkpoint case (ComfyUI's flux1-*-fp8.safetensors layout): the
golden t2i-flux-schnell pipeline's transformer under "model.diffusion_model." in Black
Forest Labs' names and its VAE under "vae." in the LDM names, in one file, float8 e4m3 for
the 2-D and 4-D weights and float16 for the rest. The text encoders and tokenizers come from
the folder ("dir"), as `diffuse generate -m FILE --config DIR` reads them.

  pipe-flux-all-in-one   FluxPipeline, 32x32, 2 steps, explicit latents

The reference: FluxPipeline.from_single_file(<the file upcast to float32>, config=<golden
pipeline>, text_encoder=..., text_encoder_2=..., tokenizer=..., tokenizer_2=... from the
folder) in float64 (diffusers' own single-file conversion of the transformer and the VAE;
its FLUX.1 conversion re-created with the tiny width, flux_single_file.use_inner_dim), and
the same in float32 for the tolerances. The upcast copy is what diffusers would compute from
the fp8 values; it is not kept.

Usage: python tools/refgen/all_in_one.py
"""
import json
import os
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file

import refcase
from component_files import to_ldm_vae
from flux_single_file import to_bfl, use_inner_dim

refcase.patch_randn_float32()
from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel  # noqa: E402
from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5TokenizerFast  # noqa

PIPE = os.path.join(refcase.ROOT, "tests", "golden", "t2i-flux-schnell", "pipeline")
NAME = "pipe-flux-all-in-one"
FILE = "flux1-tiny-aio-fp8.safetensors"


def squeeze(t):
    return t.to(torch.float8_e4m3fn) if t.ndim >= 2 else t.to(torch.float16)


def main():
    conf = json.load(open(os.path.join(PIPE, "transformer", "config.json")))
    use_inner_dim(conf["num_attention_heads"] * conf["attention_head_dim"])
    tr = FluxTransformer2DModel.from_pretrained(os.path.join(PIPE, "transformer"))
    vae = AutoencoderKL.from_pretrained(os.path.join(PIPE, "vae"))
    bfl = to_bfl(tr.state_dict(), conf["num_layers"], conf["num_single_layers"])
    ldm = to_ldm_vae(vae.state_dict(), len(vae.config.block_out_channels))
    aio = {}
    for k, v in bfl.items():
        aio["model.diffusion_model." + k] = squeeze(v).contiguous()
    for k, v in ldm.items():
        aio["vae." + k] = squeeze(v).contiguous()
    out = os.path.join(refcase.CASES, NAME)
    os.makedirs(out, exist_ok=True)
    save_file(aio, os.path.join(out, FILE))
    upcast = os.path.join(tempfile.mkdtemp(), "aio-f32.safetensors")
    save_file({k: v.float() for k, v in aio.items()}, upcast)

    g = torch.Generator().manual_seed(7)
    latents = torch.randn(1, 4, 64, generator=g)  # 32x32: (32/16)^2 tokens of 16*4
    args = dict(prompt="a red fox in the snow", height=32, width=32, num_inference_steps=2,
                guidance_scale=0.0, max_sequence_length=32)
    res = {}
    for dt in (torch.float64, torch.float32):
        pipe = FluxPipeline.from_single_file(
            upcast, config=PIPE, torch_dtype=dt,
            text_encoder=CLIPTextModel.from_pretrained(os.path.join(PIPE, "text_encoder"),
                                                       torch_dtype=dt),
            text_encoder_2=T5EncoderModel.from_pretrained(os.path.join(PIPE, "text_encoder_2"),
                                                          torch_dtype=dt),
            tokenizer=CLIPTokenizer.from_pretrained(os.path.join(PIPE, "tokenizer")),
            tokenizer_2=T5TokenizerFast.from_pretrained(os.path.join(PIPE, "tokenizer_2")))
        with torch.no_grad():
            img = pipe(latents=latents.to(dt), output_type="np", **args).images
            lat = pipe(latents=latents.to(dt), output_type="latent", **args).images
        res[dt] = (np.asarray(img, np.float64), lat.double().numpy())
    img64, lat64 = res[torch.float64]
    img32, lat32 = res[torch.float32]
    u8 = (img64 * 255).round().astype(np.uint8)
    refcase.write_case(NAME, {
        "kind": "pipeline",
        "covers": "FluxPipeline from an all-in-one file (ComfyUI: model.diffusion_model. + BFL "
                  "names, vae. + LDM names; fp8 e4m3 / f16) with the folder's text encoders "
                  "and tokenizers (-m FILE --config DIR), 32x32, 2 steps",
        "class": "FluxPipeline",
        "dir": "../../golden/t2i-flux-schnell/pipeline",
        "single_file": FILE,
        "call": "FluxPipeline.from_single_file(<file upcast>, config=dir, text_encoder*, "
                "tokenizer* from dir)(latents=in.latents, **args)",
        "args": dict(args, latents="in.latents", output_type="np"),
        "outputs": {"latents_final": "out.latents_final", "image": "out.image",
                    "image_uint8": "out.image_uint8"},
        "tolerance": {
            "latents_final": refcase.tolerance(lat64, lat32, 1e-4, 1e-5),
            "image": refcase.tolerance(img64, img32, 1e-4, 1e-5),
            "image_uint8": {"max_abs": 1, "rel_l2": 1.0}},
        "exact": [],
        "notes": ["out.* = every model in float64 from the file's values upcast; tolerances "
                  "20x the float32 run's difference, floors 1e-4 / 1e-5"],
        "provenance": refcase.provenance(),
    }, {"in.latents": latents.numpy(), "out.latents_final": lat64,
        "out.image": img64.astype(np.float32), "out.image_uint8": u8})
    print(NAME, "done", os.path.getsize(os.path.join(out, FILE)), "bytes")


if __name__ == "__main__":
    main()
