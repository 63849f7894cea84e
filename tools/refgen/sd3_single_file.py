#!/usr/bin/env python3
"""Single-file SD3 / SD3.5 transformer case: the golden sd3-transformer model (SD3.5-medium
shaped: dual attention in block 0, qk rms_norm, 3 blocks) rewritten in Stability AI's
original MMDiT names under ComfyUI's "model.diffusion_model." prefix, float8 e4m3 for the
2-D and 4-D weights and float16 for the rest.

  sd3-single-comfy   model_forward on the golden case's inputs

The reference: SD3Transformer2DModel.from_single_file(<the file upcast to float32>,
config=<golden model>) (diffusers' convert_sd3_transformer_checkpoint_to_diffusers, checked
here to give back the file's values under diffusers' names) run in float64, with float32
for the tolerance.

Usage: python tools/refgen/sd3_single_file.py
"""
import json
import os
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import refcase
from diffusers import SD3Transformer2DModel

GOLDEN = os.path.join(refcase.ROOT, "tests", "golden", "sd3-transformer")
NAME = "sd3-single-comfy"
FILE = "sd3-tiny-comfy-fp8.safetensors"


def to_mmdit(sd, num_layers):
    """diffusers SD3Transformer2DModel names -> the original MMDiT names."""
    out = {}
    simple = {"pos_embed.pos_embed": "pos_embed", "pos_embed.proj.": "x_embedder.proj.",
              "time_text_embed.timestep_embedder.linear_1.": "t_embedder.mlp.0.",
              "time_text_embed.timestep_embedder.linear_2.": "t_embedder.mlp.2.",
              "time_text_embed.text_embedder.linear_1.": "y_embedder.mlp.0.",
              "time_text_embed.text_embedder.linear_2.": "y_embedder.mlp.2.",
              "context_embedder.": "context_embedder.", "proj_out.": "final_layer.linear."}
    for k, v in sd.items():
        for a, b in simple.items():
            if k.startswith(a):
                out[b + k[len(a):]] = v
    for w in ("weight", "bias"):
        scale, shift = sd[f"norm_out.linear.{w}"].chunk(2)
        out[f"final_layer.adaLN_modulation.1.{w}"] = torch.cat([shift, scale])
    for i in range(num_layers):
        d, o = f"transformer_blocks.{i}", f"joint_blocks.{i}"
        last = i == num_layers - 1
        for w in ("weight", "bias"):
            out[f"{o}.x_block.attn.qkv.{w}"] = torch.cat(
                [sd[f"{d}.attn.to_{x}.{w}"] for x in "qkv"])
            out[f"{o}.context_block.attn.qkv.{w}"] = torch.cat(
                [sd[f"{d}.attn.add_{x}_proj.{w}"] for x in "qkv"])
            out[f"{o}.x_block.attn.proj.{w}"] = sd[f"{d}.attn.to_out.0.{w}"]
            out[f"{o}.x_block.adaLN_modulation.1.{w}"] = sd[f"{d}.norm1.linear.{w}"]
            ctx = sd[f"{d}.norm1_context.linear.{w}"]
            if last:  # diffusers swaps the last block's two chunks
                scale, shift = ctx.chunk(2)
                ctx = torch.cat([shift, scale])
            out[f"{o}.context_block.adaLN_modulation.1.{w}"] = ctx
            out[f"{o}.x_block.mlp.fc1.{w}"] = sd[f"{d}.ff.net.0.proj.{w}"]
            out[f"{o}.x_block.mlp.fc2.{w}"] = sd[f"{d}.ff.net.2.{w}"]
            if not last:
                out[f"{o}.context_block.attn.proj.{w}"] = sd[f"{d}.attn.to_add_out.{w}"]
                out[f"{o}.context_block.mlp.fc1.{w}"] = sd[f"{d}.ff_context.net.0.proj.{w}"]
                out[f"{o}.context_block.mlp.fc2.{w}"] = sd[f"{d}.ff_context.net.2.{w}"]
            if f"{d}.attn2.to_q.{w}" in sd:
                out[f"{o}.x_block.attn2.qkv.{w}"] = torch.cat(
                    [sd[f"{d}.attn2.to_{x}.{w}"] for x in "qkv"])
                out[f"{o}.x_block.attn2.proj.{w}"] = sd[f"{d}.attn2.to_out.0.{w}"]
        for a, b in (("attn.norm_q", "x_block.attn.ln_q"), ("attn.norm_k", "x_block.attn.ln_k"),
                     ("attn.norm_added_q", "context_block.attn.ln_q"),
                     ("attn.norm_added_k", "context_block.attn.ln_k"),
                     ("attn2.norm_q", "x_block.attn2.ln_q"),
                     ("attn2.norm_k", "x_block.attn2.ln_k")):
            if f"{d}.{a}.weight" in sd:
                out[f"{o}.{b}.weight"] = sd[f"{d}.{a}.weight"]
    assert len(out) <= len(sd), (len(out), len(sd))
    return out


def main():
    cfg = os.path.join(GOLDEN, "model")
    conf = json.load(open(os.path.join(cfg, "config.json")))
    sd = load_file(os.path.join(cfg, "diffusion_pytorch_model.safetensors"))
    mm = to_mmdit(sd, conf["num_layers"])
    file = {"model.diffusion_model." + k: (v.to(torch.float8_e4m3fn) if v.ndim >= 2 and
                                           k != "pos_embed" else v.to(torch.float16)).contiguous()
            for k, v in mm.items()}
    out_dir = os.path.join(refcase.CASES, NAME)
    os.makedirs(out_dir, exist_ok=True)
    save_file(file, os.path.join(out_dir, FILE))
    upcast = os.path.join(tempfile.mkdtemp(), "sd3-f32.safetensors")
    save_file({k: v.float() for k, v in file.items()}, upcast)

    st = load_file(os.path.join(GOLDEN, "case.safetensors"))
    golden = json.load(open(os.path.join(GOLDEN, "case.json")))
    ins = {k: v for k, v in st.items() if k.startswith("in.")}
    res = {}
    for dt in (torch.float64, torch.float32):
        m = SD3Transformer2DModel.from_single_file(upcast, config=cfg, torch_dtype=dt)
        if dt == torch.float32:  # the conversion gives back the file's values
            got = m.state_dict()
            assert set(got) == set(sd), set(got) ^ set(sd)
        args = {k: (ins[v].to(dt) if isinstance(v, str) and v.startswith("in.") else v)
                for k, v in golden["args"].items()}
        with torch.no_grad():
            res[dt] = m(**args)[0].double().numpy()
    refcase.write_case(NAME, {
        "kind": "model_forward",
        "covers": "SD3Transformer2DModel from a ComfyUI single file (model.diffusion_model. + "
                  "MMDiT names: fused qkv, attn2, ln_q/ln_k, the last block's context "
                  "modulation and the final layer swapped), fp8 e4m3 / f16",
        "class": "SD3Transformer2DModel",
        "dir": "../../golden/sd3-transformer/model",
        "single_file": FILE,
        "call": "SD3Transformer2DModel.from_single_file(<file upcast>, config=dir)(**args)[0]",
        "args": golden["args"],
        "outputs": {"sample": "out.sample"},
        "tolerance": {"sample": refcase.tolerance(res[torch.float64], res[torch.float32],
                                                  1e-5, 1e-6)},
        "exact": [],
        "notes": ["inputs are the golden sd3-transformer case's; 'dir' gives the config only"],
        "provenance": refcase.provenance(),
    }, dict({k: v.numpy() for k, v in ins.items()}, **{"out.sample": res[torch.float64]}))
    print(NAME, "done", os.path.getsize(os.path.join(out_dir, FILE)), "bytes")


if __name__ == "__main__":
    main()
