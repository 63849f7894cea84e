#!/usr/bin/env python3
"""Single-file FLUX.2 transformer case: the golden flux2-transformer model rewritten in
Black Forest Labs' FLUX.2 names under ComfyUI's "model.diffusion_model." prefix, float8
e4m3 for the 2-D weights and float16 for the rest.

  flux2-single-comfy   model_forward on the golden case's inputs

The reference: Flux2Transformer2DModel.from_single_file(<the file upcast to float32, without
the prefix, which diffusers 0.42's FLUX.2 conversion does not strip>,
config=<golden model>) (diffusers' convert_flux2_transformer_checkpoint_to_diffusers,
checked here to give back every diffusers tensor) run in float64, float32 for the tolerance.

Usage: python tools/refgen/flux2_single_file.py
"""
import json
import os
import tempfile

import torch
from safetensors.torch import load_file, save_file

import refcase
from diffusers import Flux2Transformer2DModel

GOLDEN = os.path.join(refcase.ROOT, "tests", "golden", "flux2-transformer")
NAME = "flux2-single-comfy"
FILE = "flux2-tiny-comfy-fp8.safetensors"


def to_bfl2(sd, num_layers, num_single):
    """diffusers Flux2Transformer2DModel names -> BFL's FLUX.2 names."""
    out = {}
    simple = {"x_embedder.": "img_in.", "context_embedder.": "txt_in.",
              "time_guidance_embed.timestep_embedder.linear_1.": "time_in.in_layer.",
              "time_guidance_embed.timestep_embedder.linear_2.": "time_in.out_layer.",
              "time_guidance_embed.guidance_embedder.linear_1.": "guidance_in.in_layer.",
              "time_guidance_embed.guidance_embedder.linear_2.": "guidance_in.out_layer.",
              "double_stream_modulation_img.linear.": "double_stream_modulation_img.lin.",
              "double_stream_modulation_txt.linear.": "double_stream_modulation_txt.lin.",
              "single_stream_modulation.linear.": "single_stream_modulation.lin.",
              "proj_out.": "final_layer.linear."}
    for k, v in sd.items():
        for a, b in simple.items():
            if k.startswith(a):
                out[b + k[len(a):]] = v
    scale, shift = sd["norm_out.linear.weight"].chunk(2)
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat([shift, scale])
    for i in range(num_layers):
        d, o = f"transformer_blocks.{i}", f"double_blocks.{i}"
        out[f"{o}.img_attn.qkv.weight"] = torch.cat([sd[f"{d}.attn.to_{x}.weight"] for x in "qkv"])
        out[f"{o}.txt_attn.qkv.weight"] = torch.cat(
            [sd[f"{d}.attn.add_{x}_proj.weight"] for x in "qkv"])
        for a, b in (("attn.norm_q.weight", "img_attn.norm.query_norm.scale"),
                     ("attn.norm_k.weight", "img_attn.norm.key_norm.scale"),
                     ("attn.norm_added_q.weight", "txt_attn.norm.query_norm.scale"),
                     ("attn.norm_added_k.weight", "txt_attn.norm.key_norm.scale"),
                     ("attn.to_out.0.weight", "img_attn.proj.weight"),
                     ("attn.to_add_out.weight", "txt_attn.proj.weight"),
                     ("ff.linear_in.weight", "img_mlp.0.weight"),
                     ("ff.linear_out.weight", "img_mlp.2.weight"),
                     ("ff_context.linear_in.weight", "txt_mlp.0.weight"),
                     ("ff_context.linear_out.weight", "txt_mlp.2.weight")):
            out[f"{o}.{b}"] = sd[f"{d}.{a}"]
    for i in range(num_single):
        d, o = f"single_transformer_blocks.{i}.attn", f"single_blocks.{i}"
        out[f"{o}.linear1.weight"] = sd[f"{d}.to_qkv_mlp_proj.weight"]
        out[f"{o}.linear2.weight"] = sd[f"{d}.to_out.weight"]
        out[f"{o}.norm.query_norm.scale"] = sd[f"{d}.norm_q.weight"]
        out[f"{o}.norm.key_norm.scale"] = sd[f"{d}.norm_k.weight"]
    return out


def main():
    cfg = os.path.join(GOLDEN, "model")
    conf = json.load(open(os.path.join(cfg, "config.json")))
    sd = load_file(os.path.join(cfg, "diffusion_pytorch_model.safetensors"))
    bfl = to_bfl2(sd, conf["num_layers"], conf["num_single_layers"])
    file = {"model.diffusion_model." + k: (v.to(torch.float8_e4m3fn) if v.ndim >= 2
                                           else v.to(torch.float16)).contiguous()
            for k, v in bfl.items()}
    out_dir = os.path.join(refcase.CASES, NAME)
    os.makedirs(out_dir, exist_ok=True)
    save_file(file, os.path.join(out_dir, FILE))
    upcast = os.path.join(tempfile.mkdtemp(), "flux2-f32.safetensors")
    # diffusers' FLUX.2 conversion does not strip ComfyUI's prefix (0.42): its reference reads
    # the same values under BFL's own names
    save_file({k[len("model.diffusion_model."):]: v.float() for k, v in file.items()}, upcast)

    st = load_file(os.path.join(GOLDEN, "case.safetensors"))
    golden = json.load(open(os.path.join(GOLDEN, "case.json")))
    ins = {k: v for k, v in st.items() if k.startswith("in.")}
    res = {}
    for dt in (torch.float64, torch.float32):
        m = Flux2Transformer2DModel.from_single_file(upcast, config=cfg, torch_dtype=dt)
        got = m.state_dict()
        assert set(got) == set(sd), set(got) ^ set(sd)
        args = {k: (ins[v].to(dt) if isinstance(v, str) and v.startswith("in.") else v)
                for k, v in golden["args"].items()}
        with torch.no_grad():
            res[dt] = m(**args)[0].double().numpy()
    refcase.write_case(NAME, {
        "kind": "model_forward",
        "covers": "Flux2Transformer2DModel from a ComfyUI single file (model.diffusion_model. + "
                  "BFL FLUX.2 names: fused qkv, shared modulations .lin, single blocks' "
                  "linear1 as to_qkv_mlp_proj, the final layer swapped), fp8 e4m3 / f16",
        "class": "Flux2Transformer2DModel",
        "dir": "../../golden/flux2-transformer/model",
        "single_file": FILE,
        "call": "Flux2Transformer2DModel.from_single_file(<file upcast>, config=dir)(**args)[0]",
        "args": golden["args"],
        "outputs": {"sample": "out.sample"},
        "tolerance": {"sample": refcase.tolerance(res[torch.float64], res[torch.float32],
                                                  1e-5, 1e-6)},
        "exact": [],
        "notes": ["inputs are the golden flux2-transformer case's; 'dir' gives the config only"],
        "provenance": refcase.provenance(),
    }, dict({k: v.numpy() for k, v in ins.items()}, **{"out.sample": res[torch.float64]}))
    print(NAME, "done", os.path.getsize(os.path.join(out_dir, FILE)), "bytes")


if __name__ == "__main__":
    main()
