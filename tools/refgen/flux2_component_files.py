#!/usr/bin/env python3
"""FLUX.2's VAE and text encoders from single files: the golden tiny components rewritten in
the layouts people download, with diffusers' / transformers' own models on the file's
(upcast) values as the reference.

  vae-single-flux2          AutoencoderKLFlux2 (golden vae-decode-flux2) as Black Forest
                            Labs' FLUX.2 ae.safetensors: LDM names, attention as 1x1
                            convolutions, quant convs nested (encoder.quant_conv,
                            decoder.post_quant_conv), bn.running_mean / running_var /
                            num_batches_tracked; bf16 weights, f32 batch-norm statistics.
                            Decode of the golden case's packed latents.
  vae-encode-single-flux2   the same file's encoder half on vae-encode-flux2's picture.
  te-single-qwen3-comfy     a tiny Qwen3 (its config in the case folder: a 512-token
                            vocabulary keeps the file small) as ComfyUI's qwen_3_4b.safetensors
                            holds it: "model." + transformers' names, lm_head.weight beside;
                            fp8 e4m3 linear weights, bf16 the rest.
  te-single-qwen3-aio       the same under ComfyUI's all-in-one prefix
                            (text_encoders.qwen3_4b.transformer.model.) beside a transformer
                            tensor.
  te-single-qwen3-gguf      a 32-wide Qwen3 (its config in the case) as a GGUF file in
                            transformers' names, Q8_0 2-D weights.
  te-single-mistral-comfy   the golden t2i-flux2 Mistral3 text encoder as ComfyUI's
                            mistral_3_small_flux2_bf16.safetensors holds it: the language
                            model under "model.", vision_tower.* / multi_modal_projector.* at
                            the top, a uint8 tekken_model (the tokenizer) beside; bf16.
  te-single-mistral-pruned-comfy  the same encoder pruned as ComfyUI's pruned FLUX.2 Mistral
                            files are: layers 0-29 (of 31) and no final norm, fp8 linears;
                            hidden states 10, 20, 30 only.
  pipe-flux2-all-in-one     Flux2Pipeline (golden t2i-flux2) from one file holding the
                            transformer (model.diffusion_model. + BFL FLUX.2 names), the VAE
                            (vae. + BFL FLUX.2 names) and the Mistral text encoder
                            (text_encoders.mistral3_24b.transformer.model.), fp8 e4m3 2-D /
                            4-D weights and bf16 the rest; the folder gives configs and the
                            tokenizer (-m FILE --config DIR).
  pipe-flux2-klein-all-in-one  Flux2KleinPipeline (golden t2i-flux2-klein) from a file
                            holding its transformer (no guidance_in) and VAE, the folder's
                            Qwen3 (its 151669-token embedding would not keep the case small).

diffusers 0.42 reads none of these files itself (no single-file loader for
AutoencoderKLFlux2, and the text encoders are transformers models), so each reference is the
diffusers / transformers class of the folder loaded with the file's tensors upcast and
renamed back (the inverse of the map written here, checked to give every tensor, strict),
run in float64; the float32 run sets the tolerances (refcase.tolerance).

Usage: python tools/refgen/flux2_component_files.py
"""
import json
import os

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import refcase
from component_files import to_ldm_vae
from flux2_single_file import to_bfl2

refcase.patch_randn_float32()
import diffusers  # noqa: E402
import transformers  # noqa: E402
from diffusers import (AutoencoderKLFlux2, Flux2KleinPipeline, Flux2Pipeline,  # noqa: E402
                       Flux2Transformer2DModel)
from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor  # noqa: E402
from transformers import (AutoTokenizer, Mistral3ForConditionalGeneration,  # noqa: E402
                          Qwen3Config, Qwen3ForCausalLM)

GOLDEN = os.path.join(refcase.ROOT, "tests", "golden")


def to_bfl2_vae(sd, n_up):
    """AutoencoderKLFlux2 names -> BFL's FLUX.2 ae.safetensors names."""
    out = {}
    for k, v in to_ldm_vae(sd, n_up).items():
        if k.startswith("quant_conv."):
            k = "encoder." + k
        elif k.startswith("post_quant_conv."):
            k = "decoder." + k
        out[k] = v
    return out


def from_bfl2_vae(tensors, inv):
    """The file's VAE tensors back under diffusers' names (inv: file name -> diffusers name),
    the attention's 1x1 convolutions as the linears diffusers has (its conv_attn_to_linear)."""
    out = {}
    for k, v in tensors.items():
        d = inv[k]
        out[d] = v[:, :, 0, 0] if ".attentions." in d and v.ndim == 4 else v
    return out


def vae_file_dtype(k, v):
    if k.startswith("bn."):
        return v if v.dtype == torch.int64 else v.float()
    return v.to(torch.bfloat16)


def vae_case():
    name, file = "vae-single-flux2", "flux2-ae.safetensors"
    case = os.path.join(GOLDEN, "vae-decode-flux2")
    vae_dir = os.path.join(case, "vae")
    ref = AutoencoderKLFlux2.from_pretrained(vae_dir)
    n_up = len(ref.config.block_out_channels)
    sd = ref.state_dict()
    assert "bn.num_batches_tracked" in sd
    bfl = {k: vae_file_dtype(k, v).contiguous() for k, v in to_bfl2_vae(sd, n_up).items()}
    out = os.path.join(refcase.CASES, name)
    os.makedirs(out, exist_ok=True)
    save_file(bfl, os.path.join(out, file))

    # back to diffusers' names, upcast: the file's values in the folder's model
    inv = {v: k for k, v in zip(sd.keys(),
                                to_bfl2_vae({k: torch.zeros(1) for k in sd}, n_up).keys())}
    back = from_bfl2_vae(load_file(os.path.join(out, file)), inv)
    st_in = load_file(os.path.join(case, "case.safetensors"))
    latents, ids = st_in["in.latents"], st_in["in.latent_ids"]
    proc = Flux2ImageProcessor(vae_scale_factor=16)
    res = {}
    for tag, dt in (("out", torch.float64), ("out_f32", torch.float32)):
        m = AutoencoderKLFlux2.from_pretrained(vae_dir, torch_dtype=dt)
        m.load_state_dict({k: (v.to(dt) if v.is_floating_point() else v)
                           for k, v in back.items()}, strict=True)
        with torch.no_grad():
            unpacked = Flux2Pipeline._unpack_latents_with_ids(latents.to(dt), ids)
            mean = m.bn.running_mean.view(1, -1, 1, 1)
            std = torch.sqrt(m.bn.running_var.view(1, -1, 1, 1) + m.config.batch_norm_eps)
            denorm = unpacked * std + mean
            unpatched = Flux2Pipeline._unpatchify_latents(denorm)
            decoded = m.decode(unpatched).sample
        image = proc.postprocess(decoded, output_type="np")
        res[tag] = {"denormalized": denorm.numpy(), "decoded": decoded.numpy(),
                    "image": np.asarray(image, np.float64)}
    u8 = (res["out"]["image"] * 255).round().astype(np.uint8)
    tensors = {"in.latents": latents.numpy(), "in.latent_ids": ids.numpy()}
    for k in res["out"]:
        tensors[f"out.{k}"] = res["out"][k]
    tensors["out.image_uint8"] = u8
    tol = {k: refcase.tolerance(res["out"][k], res["out_f32"][k], 1e-5, 1e-6)
           for k in res["out"]}
    tol["image_uint8"] = {"max_abs": 1, "rel_l2": 1.0}
    refcase.write_case(name, {
        "kind": "vae_decode",
        "covers": "AutoencoderKLFlux2 as BFL's FLUX.2 ae.safetensors (LDM names, 1x1-conv "
                  "attention, encoder.quant_conv / decoder.post_quant_conv, bn.*; bf16, f32 "
                  "batch norm) -> unpack, de-normalise, unpatchify, decode",
        "class": "AutoencoderKLFlux2",
        "dir": "../../golden/vae-decode-flux2/vae",
        "single_file": file,
        "call": "m = AutoencoderKLFlux2(config of dir) with the file's tensors renamed back and "
                "upcast (strict); unpacked = Flux2Pipeline._unpack_latents_with_ids(latents, "
                "latent_ids); denormalized = unpacked * sqrt(bn.running_var + eps) + "
                "bn.running_mean; decoded = m.decode(Flux2Pipeline._unpatchify_latents("
                "denormalized)).sample; image = Flux2ImageProcessor.postprocess(decoded, 'np')",
        "args": {"latents": "in.latents", "latent_ids": "in.latent_ids", "output_type": "np"},
        "outputs": {k: f"out.{k}" for k in ("denormalized", "decoded", "image",
                                            "image_uint8")},
        "tolerance": tol,
        "exact": [],
        "notes": ["dir gives the config only; inputs are the golden vae-decode-flux2 case's",
                  "diffusers 0.42 has no single-file loader for AutoencoderKLFlux2: the file's "
                  "names are mapped back by the inverse of the map that wrote them"],
        "provenance": refcase.provenance(),
    }, tensors)
    print(name, "done", os.path.getsize(os.path.join(out, file)), "bytes")


def vae_encode_case():
    """The encoder half of vae-single-flux2's file: vae-encode-flux2's picture and call on
    the folder's model with the file's values (a temporary diffusers folder of them)."""
    import shutil
    import tempfile
    from vae_encode import run
    name = "vae-encode-single-flux2"
    golden_case = os.path.join(refcase.CASES, "vae-encode-flux2")
    meta = json.load(open(os.path.join(golden_case, "case.json")))
    vae_dir = os.path.join(GOLDEN, "vae-decode-flux2", "vae")
    ref = AutoencoderKLFlux2.from_pretrained(vae_dir)
    sd = ref.state_dict()
    inv = {v: k for k, v in zip(sd.keys(), to_bfl2_vae({k: torch.zeros(1) for k in sd},
                                                       len(ref.config.block_out_channels)))}
    file = os.path.join(refcase.CASES, "vae-single-flux2", "flux2-ae.safetensors")
    back = from_bfl2_vae(load_file(file), inv)
    tmp = os.path.join(tempfile.mkdtemp(), "flux2-vae")
    ref.load_state_dict({k: (v.float() if v.is_floating_point() else v) for k, v in back.items()},
                        strict=True)
    ref.save_pretrained(tmp)
    out = os.path.join(refcase.CASES, name)
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(golden_case, "image0.png"), out)
    args = meta["args"]
    from PIL import Image
    pictures = [Image.open(os.path.join(out, f)) for f in args["images"]]
    r = {dt: run(tmp, pictures, args["vae_scale_factor"], args["height"], args["width"], None,
                 args["sample_mode"], dt) for dt in (torch.float64, torch.float32)}
    shutil.rmtree(os.path.dirname(tmp))
    names = ["preprocessed", "moments", "latents", "latents_scaled"]
    tensors, tol = {}, {}
    for n, a, b in zip(names, r[torch.float64], r[torch.float32]):
        tensors["out." + n] = a.numpy().astype(np.float32 if n == "preprocessed" else np.float64)
        tol[n] = refcase.tolerance(a.numpy(), b.numpy(), 1e-5, 1e-6)
    tol["preprocessed"] = {"max_abs": 1e-7, "rel_l2": 1e-7}
    meta.pop("case", None)
    meta.pop("format", None)
    meta.pop("tensors", None)
    meta.update({
        "covers": "AutoencoderKLFlux2's encoder from BFL's FLUX.2 ae.safetensors (vae-single-"
                  "flux2's file: encoder.quant_conv nested, bn.*) -> preprocess, encode, "
                  "argmax, patchify, batch-norm normalise",
        "single_file": "../vae-single-flux2/flux2-ae.safetensors",
        "tolerance": tol,
        "notes": meta["notes"] + ["dir gives the config only; the weights are the file's, "
                                  "upcast into the folder's model (strict) for the reference"],
        "provenance": refcase.provenance(),
    })
    refcase.write_case(name, meta, tensors)
    print(name, "done")


def stacked(hidden, layers):
    """Flux2Pipeline's prompt embeddings: hidden_states[k] for k in layers, [B, L, n * D]."""
    h = torch.stack([hidden[k] for k in layers], dim=1)
    b, n, length, d = h.shape
    return h.permute(0, 2, 1, 3).reshape(b, length, n * d)


def lm_case(name, cls, te_dir, file, tensors_file, lm_of, ids, mask, layers, covers, notes,
            outputs=("last_hidden_state", "prompt_embeds")):
    """A text-encoder case: the language model `lm_of(model)` with the file's values."""
    sd = {}
    for k, v in tensors_file.items():
        if v.is_floating_point():
            sd[k] = v
    res = {}
    for tag, dt in (("out", torch.float64), ("out_f32", torch.float32)):
        lm = lm_of(dt)
        want = set(lm.state_dict())
        got = {k: v.to(dt) for k, v in sd.items() if k in want}
        assert set(got) == want, want ^ set(got)
        lm.load_state_dict(got, strict=True)
        with torch.no_grad():
            o = lm(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                   use_cache=False)
        res[tag] = {"last_hidden_state": o.last_hidden_state.numpy(),
                    "prompt_embeds": stacked(o.hidden_states, layers).numpy()}
        res[tag] = {k: res[tag][k] for k in outputs}
    tensors = {"in.input_ids": ids.numpy().astype(np.int64),
               "in.attention_mask": mask.numpy().astype(np.int64)}
    for k in res["out"]:
        tensors[f"out.{k}"] = res["out"][k]
    refcase.write_case(name, {
        "kind": "text_encoder",
        "covers": covers,
        "class": cls,
        "dir": te_dir,
        "single_file": file,
        "call": "o = the language model (config of dir) with the file's tensors, prefix "
                "stripped, upcast (strict)(input_ids, attention_mask, output_hidden_states="
                "True, use_cache=False); prompt_embeds = stack(hidden_states[k] for k in "
                "layers, 1).permute(0, 2, 1, 3).reshape(B, L, -1) as Flux2Pipeline takes them",
        "args": {"input_ids": "in.input_ids", "attention_mask": "in.attention_mask",
                 "output_hidden_states": True, "use_cache": False, "layers": layers},
        "outputs": {k: f"out.{k}" for k in res["out"]},
        "tolerance": {k: refcase.tolerance(res["out"][k], res["out_f32"][k], 1e-5, 1e-6)
                      for k in res["out"]},
        "exact": [],
        "notes": notes,
        "provenance": {"diffusers": diffusers.__version__,
                       "transformers": transformers.__version__, "torch": torch.__version__},
    }, tensors)


def qwen3_case():
    name, file = "te-single-qwen3-comfy", "qwen_3-tiny-comfy-fp8.safetensors"
    out = os.path.join(refcase.CASES, name)
    te = os.path.join(out, "text_encoder")
    os.makedirs(te, exist_ok=True)
    cfg = Qwen3Config(vocab_size=512, hidden_size=16, intermediate_size=48, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                      max_position_embeddings=512)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(11)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():  # norms away from 1 too, so that they count
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 2 else 0.2) + (1.0 if p.ndim == 1
                                                                            else 0.0))
    cfg.save_pretrained(te)
    file_sd = {}
    for k, v in model.state_dict().items():
        linear = v.ndim == 2 and ("proj" in k)
        file_sd[k] = (v.to(torch.float8_e4m3fn) if linear else v.to(torch.bfloat16)).contiguous()
    assert "lm_head.weight" in file_sd and "model.embed_tokens.weight" in file_sd
    save_file(file_sd, os.path.join(out, file))
    st = load_file(os.path.join(out, file))
    lm_sd = {k[len("model."):]: v.float() for k, v in st.items() if k.startswith("model.")}

    def lm_of(dt):
        return Qwen3ForCausalLM(cfg).to(dt).model

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 512, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # right padding, as the tokenizer pads
    ids[1, 8:] = 0
    lm_case(name, "Qwen3ForCausalLM", "text_encoder", file, lm_sd, lm_of, ids, mask, [1, 2, 3],
            "Qwen3 from a ComfyUI-style single file (model. + transformers' names, lm_head "
            "beside; fp8 e4m3 linears, bf16 the rest), hidden states as Flux2KleinPipeline "
            "stacks them (layers 1, 2, 3 of this 4-layer model)",
            ["dir gives the config only (a 4-layer, 512-token Qwen3 made for this case, "
             "seeded random weights)", "input_ids are synthetic, right padding"])
    print(name, "done", os.path.getsize(os.path.join(out, file)), "bytes")

    # The same model as ComfyUI's klein all-in-one files hold it, beside another component
    name2, file2 = "te-single-qwen3-aio", "klein-tiny-aio-te.safetensors"
    out2 = os.path.join(refcase.CASES, name2)
    os.makedirs(out2, exist_ok=True)
    aio = {"text_encoders.qwen3_4b.transformer." + k: v for k, v in file_sd.items()
           if k.startswith("model.")}
    aio["model.diffusion_model.single_stream_modulation.lin.weight"] = torch.zeros(
        6, 2, dtype=torch.bfloat16)
    save_file(aio, os.path.join(out2, file2))
    lm_case(name2, "Qwen3ForCausalLM", "../te-single-qwen3-comfy/text_encoder", file2, lm_sd,
            lm_of, ids, mask, [1, 2, 3],
            "Qwen3 under ComfyUI's all-in-one prefix text_encoders.qwen3_4b.transformer.model. "
            "beside a transformer tensor (the te-single-qwen3-comfy model and values)",
            ["dir gives the config only", "input_ids are synthetic, right padding"])
    print(name2, "done", os.path.getsize(os.path.join(out2, file2)), "bytes")


def qwen3_gguf_case():
    """A Qwen3 text encoder as a GGUF file in transformers' names ("model." prefix, as
    ComfyUI's GGUF loader reads such files): Q8_0 for the 2-D weights (a 32-wide model so
    every row splits into Q8_0 blocks), F32 norms. Reference: ggml's exact dequantisation
    (gguf.quants.dequantize) in the folder's class, float64."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    name, file = "te-single-qwen3-gguf", "qwen3-tiny-q8_0.gguf"
    out = os.path.join(refcase.CASES, name)
    te = os.path.join(out, "text_encoder")
    os.makedirs(te, exist_ok=True)
    cfg = Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                      max_position_embeddings=256)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(12)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 2 else 0.2) + (1.0 if p.ndim == 1
                                                                            else 0.0))
    cfg.save_pretrained(te)
    path = os.path.join(out, file)
    w = gguf.GGUFWriter(path, arch="qwen3")
    for k, v in sorted(model.model.state_dict().items()):
        a = v.float().numpy()
        k = "model." + k
        if a.ndim == 2:
            w.add_tensor(k, gguf.quants.quantize(a, Q.Q8_0), raw_dtype=Q.Q8_0)
        else:
            w.add_tensor(k, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    lm_sd = {}
    for t in gguf.GGUFReader(path).tensors:
        v = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        lm_sd[t.name[len("model."):]] = torch.from_numpy(
            v.reshape([int(d) for d in reversed(t.shape)]))

    def lm_of(dt):
        return Qwen3ForCausalLM(cfg).to(dt).model

    g = torch.Generator().manual_seed(13)
    ids = torch.randint(1, 256, (1, 10), generator=g)
    mask = torch.ones_like(ids)
    lm_case(name, "Qwen3ForCausalLM", "text_encoder", file, lm_sd, lm_of, ids, mask, [1, 2, 3],
            "Qwen3 from a GGUF file in transformers' names (model. prefix), Q8_0 2-D weights, "
            "F32 norms; hidden states as Flux2KleinPipeline stacks them (layers 1, 2, 3)",
            ["dir gives the config only (a 3-layer, 32-wide Qwen3 made for this case, seeded "
             "random weights)", "the reference uses ggml's exact Q8_0 dequantisation "
             "(gguf.quants.dequantize)"])
    print(name, "done", os.path.getsize(path), "bytes")


def mistral_comfy_tensors(model_dir):
    """The golden Mistral3 checkpoint in ComfyUI's layout (bf16)."""
    sd = load_file(os.path.join(model_dir, "model.safetensors"))
    out = {}
    for k, v in sd.items():
        for lm in ("model.language_model.", "language_model.model."):  # transformers 5 / 4
            if k.startswith(lm):
                out["model." + k[len(lm):]] = v
                break
        else:
            if k.startswith("model.vision_tower.") or k.startswith("model.multi_modal_projector."):
                out[k[len("model."):]] = v
            elif k.startswith("vision_tower.") or k.startswith("multi_modal_projector."):
                out[k] = v
            elif k not in ("lm_head.weight", "language_model.lm_head.weight"):
                raise SystemExit(f"unexpected tensor {k}")
    return out


def mistral_case():
    name, file = "te-single-mistral-comfy", "mistral_3_small_flux2-tiny-comfy-bf16.safetensors"
    te_dir = os.path.join(GOLDEN, "t2i-flux2", "pipeline", "text_encoder")
    out = os.path.join(refcase.CASES, name)
    os.makedirs(out, exist_ok=True)
    file_sd = {k: v.to(torch.bfloat16).contiguous()
               for k, v in mistral_comfy_tensors(te_dir).items()}
    file_sd["tekken_model"] = torch.frombuffer(bytearray(b"{\"tokenizer\": \"stand-in\"}"),
                                               dtype=torch.uint8).clone()
    save_file(file_sd, os.path.join(out, file))
    st = load_file(os.path.join(out, file))
    lm_sd = {k[len("model."):]: v.float() for k, v in st.items() if k.startswith("model.")}

    def lm_of(dt):
        return Mistral3ForConditionalGeneration.from_pretrained(te_dir, torch_dtype=dt) \
            .model.language_model

    g = torch.Generator().manual_seed(6)
    ids = torch.randint(12, 4256, (2, 16), generator=g)
    ids[:, 0] = 1
    mask = torch.ones_like(ids)
    mask[0, 11:] = 0
    ids[0, 11:] = 11
    lm_case(name, "Mistral3ForConditionalGeneration", "../../golden/t2i-flux2/pipeline/"
            "text_encoder", file, lm_sd, lm_of, ids, mask, [10, 20, 30],
            "Mistral (Mistral3's language model) from a ComfyUI-style single file: model. + "
            "transformers' names, vision_tower / multi_modal_projector / a uint8 tekken_model "
            "beside, bf16; hidden states 10, 20, 30 stacked as Flux2Pipeline takes them",
            ["dir gives the config only; the weights are the golden t2i-flux2 encoder's in bf16",
             "input_ids are synthetic (bos 1, pad 11, right padding)"])
    print(name, "done", os.path.getsize(os.path.join(out, file)), "bytes")


def mistral_pruned_case():
    """ComfyUI's pruned FLUX.2 Mistral: only the layers up to the deepest hidden state the
    pipeline reads (here 30 of the golden encoder's 31), no final norm, fp8 linears. The
    reference is the full model with the file's values; the layer and norm the file lacks
    keep the folder's weights, which no requested hidden state reads."""
    name, file = "te-single-mistral-pruned-comfy", "mistral_3_small_flux2-tiny-pruned-fp8.safetensors"
    te_dir = os.path.join(GOLDEN, "t2i-flux2", "pipeline", "text_encoder")
    out = os.path.join(refcase.CASES, name)
    os.makedirs(out, exist_ok=True)
    full = mistral_comfy_tensors(te_dir)
    keep = 30
    file_sd = {}
    for k, v in full.items():
        if not k.startswith("model."):
            continue  # the vision tower stays in the unpruned case
        parts = k.split(".")
        if k == "model.norm.weight" or (parts[1] == "layers" and int(parts[2]) >= keep):
            continue
        linear = v.ndim == 2 and "proj" in k
        file_sd[k] = (v.to(torch.float8_e4m3fn) if linear else v.to(torch.bfloat16)).contiguous()
    save_file(file_sd, os.path.join(out, file))
    st = load_file(os.path.join(out, file))
    lm_sd = {k[len("model."):]: v.float() for k, v in full.items() if k.startswith("model.")}
    lm_sd.update({k[len("model."):]: v.float() for k, v in st.items()})

    def lm_of(dt):
        return Mistral3ForConditionalGeneration.from_pretrained(te_dir, torch_dtype=dt) \
            .model.language_model

    g = torch.Generator().manual_seed(8)
    ids = torch.randint(12, 4256, (1, 14), generator=g)
    ids[:, 0] = 1
    mask = torch.ones_like(ids)
    lm_case(name, "Mistral3ForConditionalGeneration", "../../golden/t2i-flux2/pipeline/"
            "text_encoder", file, lm_sd, lm_of, ids, mask, [10, 20, 30],
            "Mistral from a pruned ComfyUI-style file (model. + transformers' names, layers "
            "0-29 of 31, no final norm; fp8 e4m3 linears, bf16 the rest): hidden states 10, "
            "20, 30 as Flux2Pipeline stacks them",
            ["dir gives the config only; hidden_states[30] is layer 29's output, before the "
             "final norm, so the pruned file gives what the full model gives",
             "input_ids are synthetic (bos 1)"], outputs=("prompt_embeds",))
    print(name, "done", os.path.getsize(os.path.join(out, file)), "bytes")


def squeeze(t):
    if not t.is_floating_point():
        return t
    return t.to(torch.float8_e4m3fn) if t.ndim >= 2 else t.to(torch.bfloat16)


def all_in_one_case(klein=False):
    """klein: Flux2KleinPipeline (t2i-flux2-klein), the file without its text encoder (the
    golden Qwen3's 151669-token embedding would not keep the case small)."""
    if klein:
        name, file = "pipe-flux2-klein-all-in-one", "flux2-klein-tiny-aio-fp8.safetensors"
        golden = "t2i-flux2-klein"
    else:
        name, file = "pipe-flux2-all-in-one", "flux2-tiny-aio-fp8.safetensors"
        golden = "t2i-flux2"
    pipe_dir = os.path.join(GOLDEN, golden, "pipeline")
    cls = Flux2KleinPipeline if klein else Flux2Pipeline
    conf = json.load(open(os.path.join(pipe_dir, "transformer", "config.json")))
    tr_sd = load_file(os.path.join(pipe_dir, "transformer", "diffusion_pytorch_model.safetensors"))
    vae = AutoencoderKLFlux2.from_pretrained(os.path.join(pipe_dir, "vae"))
    vae_sd = vae.state_dict()
    n_up = len(vae.config.block_out_channels)
    bfl = to_bfl2(tr_sd, conf["num_layers"], conf["num_single_layers"])
    assert len(bfl) == len(tr_sd) - 2 * 3 * conf["num_layers"] + 2 * conf["num_layers"], \
        "transformer map"
    aio = {}
    for k, v in bfl.items():
        aio["model.diffusion_model." + k] = squeeze(v).contiguous()
    for k, v in to_bfl2_vae(vae_sd, n_up).items():
        aio["vae." + k] = (v.float() if k.startswith("bn.") and v.is_floating_point()
                           else squeeze(v)).contiguous()
    te_prefix = "text_encoders.mistral3_24b.transformer."
    for k, v in ({} if klein else mistral_comfy_tensors(os.path.join(pipe_dir,
                                                                      "text_encoder"))).items():
        if k.startswith("model."):
            aio[te_prefix + k] = squeeze(v).contiguous()
    out = os.path.join(refcase.CASES, name)
    os.makedirs(out, exist_ok=True)
    save_file(aio, os.path.join(out, file))
    st = {k: (v.float() if v.is_floating_point() else v)
          for k, v in load_file(os.path.join(out, file)).items()}

    # the folder's models with the file's values
    tr_back = {k[len("model.diffusion_model."):]: v for k, v in st.items()
               if k.startswith("model.diffusion_model.")}
    inv_vae = {v: k for k, v in zip(vae_sd.keys(),
                                    to_bfl2_vae({k: torch.zeros(1) for k in vae_sd}, n_up).keys())}
    vae_back = from_bfl2_vae({k[len("vae."):]: v for k, v in st.items() if k.startswith("vae.")},
                             inv_vae)
    te_back = {k[len(te_prefix + "model."):]: v for k, v in st.items()
               if k.startswith(te_prefix)}
    upcast_dir = os.path.join(out, ".tmp-upcast")
    os.makedirs(upcast_dir, exist_ok=True)
    upcast = os.path.join(upcast_dir, "transformer-f32.safetensors")
    save_file(tr_back, upcast)

    g = torch.Generator().manual_seed(9)
    latents = torch.randn(1, 128, 2, 2, generator=g)  # 32x32: a 2x2 grid of patchified latents
    args = dict(prompt="a small wooden cabin by a frozen lake", height=32, width=32,
                num_inference_steps=2, guidance_scale=1.0 if klein else 4.0,
                max_sequence_length=32)
    res = {}
    for dt in (torch.float64, torch.float32):
        pipe = cls.from_pretrained(pipe_dir, torch_dtype=dt)
        tr = Flux2Transformer2DModel.from_single_file(upcast, config=os.path.join(
            pipe_dir, "transformer"), torch_dtype=dt)
        assert set(tr.state_dict()) == set(tr_sd)
        pipe.transformer = tr
        pipe.vae.load_state_dict({k: (v.to(dt) if v.is_floating_point() else v)
                                  for k, v in vae_back.items()}, strict=True)
        if not klein:
            lm = pipe.text_encoder.model.language_model
            want = set(lm.state_dict())
            assert set(te_back) == want, want ^ set(te_back)
            lm.load_state_dict({k: v.to(dt) for k, v in te_back.items()}, strict=True)
        with torch.no_grad():
            img = pipe(latents=latents.to(dt), output_type="np", **args).images
            lat = pipe(latents=latents.to(dt), output_type="latent", **args).images
        res[dt] = (np.asarray(img, np.float64), lat.double().numpy())
    os.remove(upcast)
    os.rmdir(upcast_dir)
    img64, lat64 = res[torch.float64]
    img32, lat32 = res[torch.float32]
    u8 = (img64 * 255).round().astype(np.uint8)
    covers = ("Flux2KleinPipeline from an all-in-one file (model.diffusion_model. + BFL FLUX.2 "
              "names, no guidance_in; vae. + BFL's FLUX.2 VAE names; fp8 e4m3 / bf16) with the "
              "folder's Qwen3, configs and tokenizer (-m FILE --config DIR), 32x32, 2 steps"
              if klein else
              "Flux2Pipeline from an all-in-one file (model.diffusion_model. + BFL FLUX.2 "
              "names, vae. + BFL's FLUX.2 VAE names, text_encoders.mistral3_24b."
              "transformer.model. + transformers' names; fp8 e4m3 / bf16) with the "
              "folder's configs and tokenizer (-m FILE --config DIR), 32x32, 2 steps")
    refcase.write_case(name, {
        "kind": "pipeline",
        "covers": covers,
        "class": cls.__name__,
        "dir": f"../../golden/{golden}/pipeline",
        "single_file": file,
        "call": f"pipe = {cls.__name__}.from_pretrained(dir); transformer = "
                "Flux2Transformer2DModel.from_single_file(<its part upcast>, config=dir/"
                "transformer); vae (and Flux2Pipeline's text_encoder.model.language_model) "
                "load the file's values renamed back (strict); pipe(latents=in.latents, "
                "**args)",
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
    print(name, "done", os.path.getsize(os.path.join(out, file)), "bytes")


if __name__ == "__main__":
    vae_case()
    vae_encode_case()
    qwen3_case()
    qwen3_gguf_case()
    mistral_case()
    mistral_pruned_case()
    all_in_one_case()
    all_in_one_case(klein=True)
