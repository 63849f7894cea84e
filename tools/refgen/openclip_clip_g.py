"""Reference case for a CLIP-G text encoder in OpenCLIP's layout (open_clip's state dict, as
SD 2.x / SDXL checkpoints and some SD3 CLIP-G files hold it).

The golden t2i-sd3 CLIP-G (CLIPTextModelWithProjection, hidden 80, projection 48, 3 layers)
is written in open_clip's names by the inverse of diffusers' convert_open_clip_checkpoint:
transformer.resblocks.N.{ln_1, ln_2, attn.in_proj_weight / in_proj_bias (q, k, v stacked),
attn.out_proj, mlp.c_fc, mlp.c_proj}, token_embedding.weight, positional_embedding,
ln_final, text_projection [width, projection] (transformers' text_projection.weight
transposed), plus open_clip's logit_scale, which nothing reads. 2-D weights in float16, the
rest float32, no prefix.

The reference is diffusers' own conversion: convert_open_clip_checkpoint(model, file,
prefix="") loaded strictly into CLIPTextModelWithProjection (config of the golden folder),
run in float64 (out.*) and float32 (tolerances, golden rule).

    /work/venv/bin/python tools/refgen/openclip_clip_g.py
"""
import os

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import diffusers
from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint
import transformers
from transformers import CLIPTextModelWithProjection, CLIPTokenizer

from refcase import ROOT, tolerance, write_case

NAME = "te-single-clip-g-openclip"
FILE = "clip_g-openclip-f16.safetensors"
PIPE = os.path.join(ROOT, "tests", "golden", "t2i-sd3", "pipeline")


def to_openclip(sd):
    """transformers' CLIPTextModelWithProjection names -> open_clip's."""
    out = {}
    n_layers = 1 + max(int(k.split(".")[3]) for k in sd if k.startswith("text_model.encoder."))
    for i in range(n_layers):
        src, dst = f"text_model.encoder.layers.{i}.", f"transformer.resblocks.{i}."
        for kind in ("weight", "bias"):
            out[dst + f"attn.in_proj_{kind}"] = torch.cat(
                [sd[src + f"self_attn.{p}_proj.{kind}"] for p in "qkv"])
            for a, b in (("self_attn.out_proj", "attn.out_proj"), ("layer_norm1", "ln_1"),
                         ("layer_norm2", "ln_2"), ("mlp.fc1", "mlp.c_fc"),
                         ("mlp.fc2", "mlp.c_proj")):
                out[dst + f"{b}.{kind}"] = sd[src + f"{a}.{kind}"]
    out["token_embedding.weight"] = sd["text_model.embeddings.token_embedding.weight"]
    out["positional_embedding"] = sd["text_model.embeddings.position_embedding.weight"]
    out["ln_final.weight"] = sd["text_model.final_layer_norm.weight"]
    out["ln_final.bias"] = sd["text_model.final_layer_norm.bias"]
    out["text_projection"] = sd["text_projection.weight"].T
    out["logit_scale"] = torch.tensor(4.6052)
    return {k: (v.half() if v.ndim == 2 else v.float()).contiguous() for k, v in out.items()}


def main():
    te_dir = os.path.join(PIPE, "text_encoder_2")
    ref = CLIPTextModelWithProjection.from_pretrained(te_dir)
    sd = {k: v for k, v in ref.state_dict().items() if not k.endswith("position_ids")}
    out = os.path.join(ROOT, "tests", "cases", NAME)
    os.makedirs(out, exist_ok=True)
    save_file(to_openclip(sd), os.path.join(out, FILE))
    os.chmod(os.path.join(out, FILE), 0o644)

    file_sd = {k: v.float() for k, v in load_file(os.path.join(out, FILE)).items()}
    tok = CLIPTokenizer.from_pretrained(os.path.join(PIPE, "tokenizer_2"))
    ids = tok(["a photo of a cat", "an oil painting of a lighthouse at night"],
              padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
    res = {}
    for tag, dt in (("out", torch.float64), ("out_f32", torch.float32)):
        m = CLIPTextModelWithProjection.from_pretrained(te_dir, torch_dtype=dt)
        conv = convert_open_clip_checkpoint(m, file_sd, prefix="")
        missing, unexpected = m.load_state_dict({k: v.to(dt) for k, v in conv.items()},
                                                strict=False)
        assert not unexpected and all("position_ids" in k for k in missing), (missing, unexpected)
        with torch.no_grad():
            o = m(input_ids=ids, output_hidden_states=True)
        res[tag] = {"last_hidden_state": o.last_hidden_state.numpy(),
                    "text_embeds": o.text_embeds.numpy(),
                    "hidden_states_m2": o.hidden_states[-2].numpy()}
    # The file is not the folder: the conversion must differ from a plain load of the
    # folder's float32 weights only by the float16 rounding.
    with torch.no_grad():
        plain = ref(input_ids=ids).text_embeds.numpy()
    assert np.abs(plain - res["out"]["text_embeds"]).max() < 1e-2
    tensors = {"in.input_ids": ids.numpy().astype(np.int64)}
    for k in res["out"]:
        tensors[f"out.{k}"] = res["out"][k]
    write_case(NAME, {
        "kind": "text_encoder",
        "covers": "CLIPTextModelWithProjection (SD3's CLIP-G) from a single file in OpenCLIP's "
                  "layout (transformer.resblocks.N, fused in_proj, ln_final, text_projection "
                  "[width, projection]), f16 2-D weights, f32 the rest",
        "class": "CLIPTextModelWithProjection",
        "dir": "../../golden/t2i-sd3/pipeline/text_encoder_2",
        "single_file": FILE,
        "call": "m = CLIPTextModelWithProjection(config of dir) loaded with diffusers' "
                "convert_open_clip_checkpoint(m, file upcast, prefix=''); "
                "o = m(input_ids, output_hidden_states=True)",
        "args": {"input_ids": "in.input_ids", "output_hidden_states": True},
        "outputs": {k: f"out.{k}" for k in res["out"]},
        "tolerance": {k: tolerance(res["out"][k], res["out_f32"][k], 1e-5, 1e-6)
                      for k in res["out"]},
        "exact": [],
        "notes": ["dir gives the config only"],
        "provenance": {"diffusers": diffusers.__version__,
                       "transformers": transformers.__version__, "torch": torch.__version__},
    }, tensors)
    os.chmod(os.path.join(out, "case.safetensors"), 0o644)
    print(NAME, "done")


if __name__ == "__main__":
    main()
