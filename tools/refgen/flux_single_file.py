#!/usr/bin/env python3
"""Single-file FLUX.1 transformer cases: the golden flux-transformer model rewritten in the
layouts people download, with diffusers' own single-file loading as the reference.

  flux-single-comfy   ComfyUI's "model.diffusion_model." prefix over Black Forest Labs'
                      original names; double blocks in fp8 e4m3 with ComfyUI's per-tensor
                      scale_weight, the rest bf16 (so fused qkv / linear1 are split both
                      from upcast and from wrapped bytes)
  flux-gguf-q8_0      city96's layout: original names, 2-D weights whose inner size is a
                      multiple of 32 in Q8_0, other 2-D weights F16, 1-D tensors F32
  flux-gguf-q4_k      the same with Q4_K where the inner size is a multiple of 256 and Q4_1
                      where it is a multiple of 32

Each case folder holds the single file, case.safetensors (the golden case's inputs and
out.sample) and case.json; "dir" points at the golden model folder for the config.

The reference: FluxTransformer2DModel.from_single_file(file, config=<golden model>) (its
conversion function re-created with the tiny width, see use_inner_dim) run in
float64, with out_f32.sample from the same load in float32. For GGUF the file loaded is
its exact dequantisation by the gguf package (ggml's rule); diffusers' GGUF path itself
(GGUFQuantizationConfig) dequantises in float16, so its output is kept beside it
(out_diffusers_gguf.sample) with its distance, for context. The fp8 file's reference loads its
exact upcast (w.float() * scale_weight) from an equivalent file, since diffusers does not
read scale_weight. Tolerances follow the golden rule: 20x the float32-float64 difference,
at least 1e-5 max_abs / 1e-6 rel_l2.

Usage: python tools/refgen/flux_single_file.py [tests/cases]
"""
import json
import os
import sys
import tempfile

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as Q
from safetensors.torch import load_file, save_file

import diffusers
from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GOLDEN = os.path.join(REPO, "tests", "golden", "flux-transformer")
MODEL_REL = "../../golden/flux-transformer/model"


def to_bfl(sd, num_layers, num_single):
    """diffusers FluxTransformer2DModel names -> BFL's original checkpoint names."""
    out = {}

    def put(dst, src):
        out[dst] = sd[src]

    for w in ("weight", "bias"):
        put(f"img_in.{w}", f"x_embedder.{w}")
        put(f"txt_in.{w}", f"context_embedder.{w}")
        put(f"time_in.in_layer.{w}", f"time_text_embed.timestep_embedder.linear_1.{w}")
        put(f"time_in.out_layer.{w}", f"time_text_embed.timestep_embedder.linear_2.{w}")
        put(f"vector_in.in_layer.{w}", f"time_text_embed.text_embedder.linear_1.{w}")
        put(f"vector_in.out_layer.{w}", f"time_text_embed.text_embedder.linear_2.{w}")
        if f"time_text_embed.guidance_embedder.linear_1.{w}" in sd:  # dev
            put(f"guidance_in.in_layer.{w}", f"time_text_embed.guidance_embedder.linear_1.{w}")
            put(f"guidance_in.out_layer.{w}", f"time_text_embed.guidance_embedder.linear_2.{w}")
        put(f"final_layer.linear.{w}", f"proj_out.{w}")
        scale, shift = sd[f"norm_out.linear.{w}"].chunk(2, dim=0)
        out[f"final_layer.adaLN_modulation.1.{w}"] = torch.cat([shift, scale], dim=0)
        for i in range(num_layers):
            d, b = f"transformer_blocks.{i}", f"double_blocks.{i}"
            put(f"{b}.img_mod.lin.{w}", f"{d}.norm1.linear.{w}")
            put(f"{b}.txt_mod.lin.{w}", f"{d}.norm1_context.linear.{w}")
            out[f"{b}.img_attn.qkv.{w}"] = torch.cat(
                [sd[f"{d}.attn.to_{x}.{w}"] for x in "qkv"], dim=0)
            out[f"{b}.txt_attn.qkv.{w}"] = torch.cat(
                [sd[f"{d}.attn.add_{x}_proj.{w}"] for x in "qkv"], dim=0)
            put(f"{b}.img_attn.proj.{w}", f"{d}.attn.to_out.0.{w}")
            put(f"{b}.txt_attn.proj.{w}", f"{d}.attn.to_add_out.{w}")
            put(f"{b}.img_mlp.0.{w}", f"{d}.ff.net.0.proj.{w}")
            put(f"{b}.img_mlp.2.{w}", f"{d}.ff.net.2.{w}")
            put(f"{b}.txt_mlp.0.{w}", f"{d}.ff_context.net.0.proj.{w}")
            put(f"{b}.txt_mlp.2.{w}", f"{d}.ff_context.net.2.{w}")
        for i in range(num_single):
            d, b = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
            put(f"{b}.modulation.lin.{w}", f"{d}.norm.linear.{w}")
            out[f"{b}.linear1.{w}"] = torch.cat(
                [sd[f"{d}.attn.to_{x}.{w}"] for x in "qkv"] + [sd[f"{d}.proj_mlp.{w}"]], dim=0)
            put(f"{b}.linear2.{w}", f"{d}.proj_out.{w}")
    for i in range(num_layers):
        d, b = f"transformer_blocks.{i}", f"double_blocks.{i}"
        put(f"{b}.img_attn.norm.query_norm.scale", f"{d}.attn.norm_q.weight")
        put(f"{b}.img_attn.norm.key_norm.scale", f"{d}.attn.norm_k.weight")
        put(f"{b}.txt_attn.norm.query_norm.scale", f"{d}.attn.norm_added_q.weight")
        put(f"{b}.txt_attn.norm.key_norm.scale", f"{d}.attn.norm_added_k.weight")
    for i in range(num_single):
        d, b = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        put(f"{b}.norm.query_norm.scale", f"{d}.attn.norm_q.weight")
        put(f"{b}.norm.key_norm.scale", f"{d}.attn.norm_k.weight")
    # fused: 4 fewer per double block (q, k, v twice), 6 per single block (q, k, v, mlp)
    assert len(out) == len(sd) - 8 * num_layers - 6 * num_single, (len(out), len(sd))
    return out


def golden_inputs():
    st = load_file(os.path.join(GOLDEN, "case.safetensors"))
    case = json.load(open(os.path.join(GOLDEN, "case.json")))
    return {k: v for k, v in st.items() if k.startswith("in.")}, case


def run(model, ins, case, dtype):
    args = {}
    for k, v in case["args"].items():
        if isinstance(v, str) and v.startswith("in."):
            args[k] = ins[v].to(dtype)
        else:
            args[k] = v
    with torch.no_grad():
        return model(**args)[0]


def write_case(out_dir, name, covers, call, single, load, ins, golden_case):
    os.makedirs(out_dir, exist_ok=True)
    cfg_dir = os.path.join(GOLDEN, "model")
    m64 = load(torch.float64)
    ref = run(m64, ins, golden_case, torch.float64)
    m32 = load(torch.float32)
    ref32 = run(m32, ins, golden_case, torch.float32)
    diff = (ref32.double() - ref).abs()
    max_abs = float(diff.max())
    rel = float(torch.linalg.vector_norm(ref32.double() - ref) / torch.linalg.vector_norm(ref))
    tensors = dict(ins)
    tensors["out.sample"] = ref.contiguous()
    tensors["out_f32.sample"] = ref32.contiguous()
    save_file(tensors, os.path.join(out_dir, "case.safetensors"))
    case = {
        "format": 2,
        "case": name,
        "kind": "model_forward",
        "covers": covers,
        "class": "FluxTransformer2DModel",
        "dir": MODEL_REL,
        "single_file": single,
        "call": call,
        "args": golden_case["args"],
        "outputs": {"sample": "out.sample"},
        "tolerance": {"sample": {"max_abs": max(20 * max_abs, 1e-5),
                                 "rel_l2": max(20 * rel, 1e-6)}},
        "exact": [],
        "notes": [
            "inputs are the golden flux-transformer case's; 'dir' gives the config only",
            "out.* = diffusers' single-file load run in float64; out_f32.* the same in float32",
        ],
        "provenance": {"diffusers": diffusers.__version__, "torch": torch.__version__,
                       "gguf": getattr(gguf, "__version__", "unknown")},
        "tensors": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                    for k, v in tensors.items()},
        "details": {"f32_vs_f64_max_abs": max_abs, "f32_vs_f64_rel_l2": rel,
                    "config_dir": cfg_dir and MODEL_REL},
    }
    with open(os.path.join(out_dir, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")


def comfy_case(root, bfl, ins, golden_case, cfg):
    name = "flux-single-comfy"
    out_dir = os.path.join(root, name)
    os.makedirs(out_dir, exist_ok=True)
    prefix = "model.diffusion_model."
    sd, exact = {}, {}
    for k, v in bfl.items():
        if k.startswith("double_blocks.") and k.endswith(".weight") and v.ndim == 2:
            scale = v.abs().max() / 448.0
            q = (v / scale).to(torch.float8_e4m3fn)
            sd[prefix + k] = q
            sd[prefix + k[:-len("weight")] + "scale_weight"] = scale.to(torch.float32).reshape(())
            exact[prefix + k] = q.to(torch.float32) * scale.to(torch.float32)
        else:
            sd[prefix + k] = v.to(torch.bfloat16)
            exact[prefix + k] = sd[prefix + k].to(torch.float32)
    single = "flux1-tiny-comfy-fp8.safetensors"
    save_file(sd, os.path.join(out_dir, single))
    tmp = tempfile.mkdtemp()
    exact_path = os.path.join(tmp, "exact.safetensors")
    save_file(exact, exact_path)

    def load(dtype):
        return FluxTransformer2DModel.from_single_file(exact_path, config=cfg,
                                                       torch_dtype=dtype)

    write_case(out_dir, name,
               "ComfyUI single file (model.diffusion_model. + BFL names): fp8 e4m3 double "
               "blocks with scale_weight, bf16 elsewhere; qkv / linear1 split, final-layer "
               "shift/scale swapped",
               "FluxTransformer2DModel.from_single_file(<the file upcast: w.float() * "
               "scale_weight>, config=dir, torch_dtype=...)(**args)[0]",
               single, load, ins, golden_case)


def qtype_for(t, scheme):
    if t.ndim != 2:
        return Q.F32
    k = t.shape[1]
    if scheme == "q4_k" and k % 256 == 0:
        return Q.Q4_K
    if k % 32 == 0:
        return Q.Q8_0 if scheme == "q8_0" else Q.Q4_1
    return Q.F16


def gguf_case(root, bfl, ins, golden_case, cfg, scheme):
    name = "flux-gguf-" + scheme
    out_dir = os.path.join(root, name)
    os.makedirs(out_dir, exist_ok=True)
    single = f"flux1-tiny-{scheme}.gguf"
    path = os.path.join(out_dir, single)
    w = gguf.GGUFWriter(path, arch="flux")
    counts = {}
    for k in sorted(bfl):
        v = bfl[k].to(torch.float32).numpy()
        qt = qtype_for(v, scheme)
        counts[qt.name] = counts.get(qt.name, 0) + 1
        if qt == Q.F32:
            w.add_tensor(k, v)
        elif qt == Q.F16:
            w.add_tensor(k, v.astype(np.float16))
        elif qt == Q.Q4_K:
            # gguf-py has no Q4_K quantiser: write blocks of valid structure from the
            # weights (per 32-value sub-block 6-bit scale/min, 4-bit codes) by hand.
            w.add_tensor(k, quantize_q4_k(v), raw_dtype=qt)
        else:
            w.add_tensor(k, gguf.quants.quantize(v, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # The reference: ggml's dequantisation (gguf.quants.dequantize, exact in f32) through
    # diffusers' single-file conversion. diffusers' own GGUF path dequantises in float16
    # (its dequantize_blocks_* keep the f16 scale's dtype), which rounds every weight to
    # f16; its output is kept as out_diffusers_gguf.sample, with the distance in details.
    reader = gguf.GGUFReader(path)
    exact = {}
    for t in reader.tensors:
        v = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        exact[t.name] = torch.from_numpy(v.reshape([int(d) for d in reversed(t.shape)]))
    tmp = os.path.join(tempfile.mkdtemp(), "exact.safetensors")
    save_file(exact, tmp)

    def load(dtype):
        return FluxTransformer2DModel.from_single_file(tmp, config=cfg, torch_dtype=dtype)

    write_case(out_dir, name,
               f"city96-style GGUF of the tiny FLUX.1 transformer: {counts}",
               "FluxTransformer2DModel.from_single_file(<the file dequantised by "
               "gguf.quants.dequantize>, config=dir, torch_dtype=...)(**args)[0]",
               single, load, ins, golden_case)
    m = FluxTransformer2DModel.from_single_file(
        path, config=cfg, quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32),
        torch_dtype=torch.float32)
    theirs = run(m, ins, golden_case, torch.float32)
    st = load_file(os.path.join(out_dir, "case.safetensors"))
    ref = st["out.sample"]
    rel = float(torch.linalg.vector_norm(theirs.double() - ref) / torch.linalg.vector_norm(ref))
    assert rel < 5e-3, f"diffusers' GGUF run is {rel} away from ggml's dequantisation"
    st["out_diffusers_gguf.sample"] = theirs.contiguous()
    save_file(st, os.path.join(out_dir, "case.safetensors"))
    case_path = os.path.join(out_dir, "case.json")
    case = json.load(open(case_path))
    case["notes"].append(
        "out.* use ggml's exact dequantisation (gguf.quants.dequantize); "
        "out_diffusers_gguf.sample is FluxTransformer2DModel.from_single_file(file, "
        "quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32)), whose "
        "dequantisers round each weight to float16 (rel_l2 %.3g from out.sample)" % rel)
    case["details"]["diffusers_gguf_vs_ref_rel_l2"] = rel
    case["tensors"]["out_diffusers_gguf.sample"] = {"dtype": "float32",
                                                    "shape": list(theirs.shape)}
    with open(case_path, "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")


def quantize_q4_k(x):
    """A simple Q4_K quantiser (not llama.cpp's search; any valid blocks serve a test)."""
    rows = x.reshape(-1, 256).astype(np.float32)
    out = np.zeros((rows.shape[0], 144), dtype=np.uint8)
    for b, row in enumerate(rows):
        sub = row.reshape(8, 32)
        lo = np.minimum(sub.min(axis=1), 0)
        hi = sub.max(axis=1)
        sc = (hi - lo) / 15
        mn = -lo
        d = max(sc.max() / 63, 1e-12)
        dmin = max(mn.max() / 63, 1e-12)
        d16, dmin16 = np.float16(d), np.float16(dmin)
        qs = np.clip(np.round(sc / np.float32(d16)), 0, 63).astype(np.uint8)
        qm = np.clip(np.round(mn / np.float32(dmin16)), 0, 63).astype(np.uint8)
        scales = np.zeros(12, dtype=np.uint8)
        for j in range(8):
            if j < 4:
                scales[j] = qs[j]
                scales[j + 4] = qm[j]
            else:
                scales[j + 4] = (qs[j] & 0xF) | ((qm[j] & 0xF) << 4)
                scales[j - 4] |= (qs[j] >> 4) << 6
                scales[j] |= (qm[j] >> 4) << 6
        codes = np.zeros((8, 32), dtype=np.uint8)
        for j in range(8):
            dj = np.float32(d16) * qs[j]
            mj = np.float32(dmin16) * qm[j]
            if dj > 0:
                codes[j] = np.clip(np.round((sub[j] + mj) / dj), 0, 15)
        q = np.zeros(128, dtype=np.uint8)
        for c in range(4):
            q[c * 32:(c + 1) * 32] = codes[2 * c] | (codes[2 * c + 1] << 4)
        out[b, 0:2] = np.frombuffer(d16.tobytes(), dtype=np.uint8)
        out[b, 2:4] = np.frombuffer(dmin16.tobytes(), dtype=np.uint8)
        out[b, 4:16] = scales
        out[b, 16:] = q
    return out.reshape(x.shape[0], -1)


def use_inner_dim(inner):
    """diffusers' FLUX.1 single-file conversion hard-codes FLUX.1's width (inner_dim =
    3072) to split the fused tensors. Re-create that same function with the tiny model's
    width, and nothing else changed, so its conversion stays the reference."""
    import inspect
    import diffusers.loaders.single_file_model as sfm
    import diffusers.loaders.single_file_utils as sfu
    src = inspect.getsource(sfu.convert_flux_transformer_checkpoint_to_diffusers)
    assert src.count("inner_dim = 3072") == 1, "diffusers changed its FLUX.1 conversion"
    ns = {}
    exec(src.replace("inner_dim = 3072", f"inner_dim = {inner}"), sfu.__dict__, ns)
    sfm.SINGLE_FILE_LOADABLE_CLASSES["FluxTransformer2DModel"]["checkpoint_mapping_fn"] = \
        ns["convert_flux_transformer_checkpoint_to_diffusers"]


def main(root):
    cfg = os.path.join(GOLDEN, "model")
    conf = json.load(open(os.path.join(cfg, "config.json")))
    use_inner_dim(conf["num_attention_heads"] * conf["attention_head_dim"])
    sd = load_file(os.path.join(cfg, "diffusion_pytorch_model.safetensors"))
    bfl = to_bfl(sd, conf["num_layers"], conf["num_single_layers"])
    ins, golden_case = golden_inputs()
    # Sanity: diffusers' conversion of our BFL file gives back the golden model.
    tmp = os.path.join(tempfile.mkdtemp(), "bfl.safetensors")
    save_file(bfl, tmp)
    back = FluxTransformer2DModel.from_single_file(tmp, config=cfg, torch_dtype=torch.float32)
    for k, v in back.state_dict().items():
        assert torch.equal(v, sd[k]), k
    comfy_case(root, bfl, ins, golden_case, cfg)
    gguf_case(root, bfl, ins, golden_case, cfg, "q8_0")
    gguf_case(root, bfl, ins, golden_case, cfg, "q4_k")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "tests", "cases"))
