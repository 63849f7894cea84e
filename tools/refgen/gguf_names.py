#!/usr/bin/env python3
"""GGUF files in stable-diffusion.cpp's and llama.cpp's names, with transformers' /
diffusers' own loading of the exact dequantised weights as the reference.

  flux-gguf-sdcpp       one GGUF as stable-diffusion.cpp's `convert --diffusion-model
                        --vae --type q8_0 --convert-name` writes it: the golden
                        flux-transformer under "model.diffusion_model." (BFL names) and
                        t2i-flux-schnell's VAE under "first_stage_model." (LDM names). Tensor
                        types follow sd.cpp's tensor_should_be_converted: Q8_0 where the
                        inner size is a multiple of 32, except biases, ".scale", img_in,
                        txt_in, time_in, vector_in, guidance_in and final_layer, which keep
                        the source's type (bf16 for the transformer, f16 for the VAE).
                        The case runs the transformer (model_forward).
  vae-gguf-sdcpp        the VAE of the same file (vae_decode).
  sd3-gguf-sdcpp        the golden sd3-transformer (SD3.5-medium shaped) as sd.cpp's
                        `convert --type q8_0` writes an SD3 checkpoint: model.diffusion_model.
                        + the original MMDiT names, pos_embed / x_embedder / t_embedder /
                        y_embedder / context_embedder, biases and 1-D tensors kept in the
                        source's f16 (model_forward).
  pipe-flux-gguf-sdcpp  one GGUF as sd.cpp's `convert --diffusion-model --vae --clip_l
                        --t5xxl --type q8_0` writes it without --convert-name: the golden
                        t2i-flux-schnell pipeline's transformer under "model.diffusion_model."
                        (BFL names), VAE under "vae." (LDM names), CLIP-L under
                        "text_encoders.clip_l.transformer." (transformers' names) and T5 under
                        "text_encoders.t5xxl.transformer." in llama.cpp's names (a city96 T5
                        GGUF given as --t5xxl keeps them); the same type rules. FluxPipeline,
                        `-m FILE --config DIR` with every model from the file.
  pipe-flux-gguf-sdcpp/flux1-tiny-sdcpp-diffusers-f32.gguf
                        (no case of its own: tests/cli/gguf_names.sh) the t2i-flux-schnell
                        pipeline's transformer and VAE as `convert --diffusion-model --vae
                        --type f32` writes a diffusers folder's files without --convert-name:
                        diffusers' names under "model.diffusion_model." and "vae.", the
                        folder's float32 values, so the image must equal the folder's.
  flux2-gguf-sdcpp      the golden flux2-transformer as sd.cpp's `convert --type q8_0` writes a
                        FLUX.2 checkpoint: model.diffusion_model. + BFL's FLUX.2 names, the
                        kept layers in the source's bf16 (model_forward).
  te-gguf-clip-sdcpp    t2i-sd3's CLIP-G as sd.cpp's `convert --convert-name --type q8_0`
                        writes it: "text_encoders.clip_g.transformer.text_model.*", the
                        projection renamed "text_model.text_projection" (no ".weight", same
                        tensor), 1-D norms and 2-D weights Q8_0 where the width allows.
  te-gguf-t5-llamacpp   t2i-flux-schnell's T5 encoder in llama.cpp's names (architecture
                        t5encoder: token_embd, enc.blk.N.attn_q ..., enc.output_norm), as
                        city96's t5-v1_1-xxl-encoder GGUFs hold it: Q8_0 where the inner size
                        is a multiple of 32, F16 for other 2-D weights, F32 for 1-D.

References: the file is dequantised by gguf.quants.dequantize (ggml's rule, exact in f32);
the transformer and the VAE are then loaded by diffusers' from_single_file (the
transformer's conversion re-created with the tiny width, as flux_single_file.py does), the
T5 encoder by transformers' own GGUF loader, T5EncoderModel.from_pretrained(dir,
gguf_file=...), checked to hold the same dequantised weights; the pipeline case's CLIP-L
and T5 are transformers' classes holding the file's dequantised tensors (prefix stripped,
llama.cpp's T5 names mapped back as transformers' GGUF loader maps them). All run in float64 (out.*);
tolerances follow the golden rule against the float32 run.

Usage: python tools/refgen/gguf_names.py
"""
import json
import os
import shutil
import tempfile

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as Q
from safetensors.torch import load_file, save_file

import diffusers
from diffusers import AutoencoderKL, FluxTransformer2DModel
from diffusers.image_processor import VaeImageProcessor
import transformers
from transformers import T5EncoderModel, T5TokenizerFast

import flux_single_file as fsf
from component_files import to_ldm_vae
from refcase import ROOT, tolerance, write_case

GOLDEN = os.path.join(ROOT, "tests", "golden")
CASES = os.path.join(ROOT, "tests", "cases")
PIPE = os.path.join(GOLDEN, "t2i-flux-schnell", "pipeline")

SDCPP_KEEP = ("img_in.", "txt_in.", "time_in.", "vector_in.", "guidance_in.", "final_layer.",
              "embedding")


def sdcpp_type(name, v):
    """stable-diffusion.cpp's tensor_should_be_converted for --type q8_0."""
    if v.shape[-1] % 32 != 0 or name.endswith(".bias") or name.endswith(".scale"):
        return None
    if any(k in name for k in SDCPP_KEEP):
        return None
    return Q.Q8_0


def add(w, name, v, qt):
    """v: float32 numpy; qt: a ggml type."""
    if qt == Q.F32:
        w.add_tensor(name, v)
    elif qt == Q.F16:
        w.add_tensor(name, v.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(v, qt), raw_dtype=qt)


def dequantised(path):
    """name -> the tensor as ggml dequantises it (f32, torch shape)."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        v = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        out[t.name] = torch.from_numpy(v.reshape([int(d) for d in reversed(t.shape)]).copy())
    return out


def sdcpp_file(out_dir):
    cfg = os.path.join(GOLDEN, "flux-transformer", "model")
    conf = json.load(open(os.path.join(cfg, "config.json")))
    fsf.use_inner_dim(conf["num_attention_heads"] * conf["attention_head_dim"])
    sd = load_file(os.path.join(cfg, "diffusion_pytorch_model.safetensors"))
    bfl = fsf.to_bfl(sd, conf["num_layers"], conf["num_single_layers"])
    vae = AutoencoderKL.from_pretrained(os.path.join(PIPE, "vae"))
    ldm = to_ldm_vae({k: v.float() for k, v in vae.state_dict().items()},
                     len(vae.config.block_out_channels))
    single = "flux1-tiny-sdcpp-q8_0.gguf"
    path = os.path.join(out_dir, single)
    w = gguf.GGUFWriter(path, arch="flux")
    counts = {}
    tensors = [("model.diffusion_model." + k, v, Q.BF16) for k, v in bfl.items()]
    tensors += [("first_stage_model." + k, v, Q.F16) for k, v in ldm.items()]
    for name, v, source in sorted(tensors, key=lambda t: t[0]):
        v = v.to(torch.float32).contiguous().numpy()
        qt = sdcpp_type(name, v) or source
        counts[qt.name] = counts.get(qt.name, 0) + 1
        add(w, name, v, qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, single, counts, cfg


def flux_case(path, single, counts, cfg):
    name = "flux-gguf-sdcpp"
    out_dir = os.path.join(CASES, name)
    exact = dequantised(path)
    pre = "model.diffusion_model."
    tmp = os.path.join(tempfile.mkdtemp(), "exact.safetensors")
    save_file({k: v for k, v in exact.items() if k.startswith(pre)}, tmp)

    def load(dtype):
        return FluxTransformer2DModel.from_single_file(tmp, config=cfg, torch_dtype=dtype)

    ins, golden_case = fsf.golden_inputs()
    fsf.write_case(out_dir, name,
                   "stable-diffusion.cpp GGUF (convert --convert-name, q8_0): transformer "
                   f"under model.diffusion_model. + VAE under first_stage_model.: {counts}",
                   "FluxTransformer2DModel.from_single_file(<the file's model.diffusion_model. "
                   "tensors dequantised by gguf.quants.dequantize>, config=dir, "
                   "torch_dtype=...)(**args)[0]",
                   single, load, ins, golden_case)


def vae_case(path, single):
    name = "vae-gguf-sdcpp"
    vae_dir = os.path.join(PIPE, "vae")
    exact = dequantised(path)
    pre = "first_stage_model."
    tmp = os.path.join(tempfile.mkdtemp(), "exact.safetensors")
    save_file({k: v for k, v in exact.items() if k.startswith(pre)}, tmp)
    ref = AutoencoderKL.from_pretrained(vae_dir)
    g = torch.Generator().manual_seed(3)
    latents = torch.randn(1, ref.config.latent_channels, 4, 4, generator=g)
    proc = VaeImageProcessor(vae_scale_factor=8)
    res = {}
    for tag, dt in (("out", torch.float64), ("out_f32", torch.float32)):
        m = AutoencoderKL.from_single_file(tmp, config=vae_dir, torch_dtype=dt)
        with torch.no_grad():
            scaled = latents.to(dt) / m.config.scaling_factor + m.config.shift_factor
            decoded = m.decode(scaled).sample
        image = proc.postprocess(decoded, output_type="pt").permute(0, 2, 3, 1)
        res[tag] = {"scaled": scaled.numpy(), "decoded": decoded.numpy(), "image": image.numpy()}
    tensors = {"in.latents": latents.numpy()}
    for k in ("scaled", "decoded"):
        tensors[f"out.{k}"] = res["out"][k]
    tensors["out.image_uint8"] = (res["out"]["image"] * 255).round().astype(np.uint8)
    tol = {k: tolerance(res["out"][k], res["out_f32"][k], 1e-5, 1e-6)
           for k in ("scaled", "decoded")}
    tol["image_uint8"] = {"max_abs": 1, "rel_l2": 0.01}
    write_case(name, {
        "kind": "vae_decode",
        "covers": "FLUX.1 AutoencoderKL from a stable-diffusion.cpp GGUF "
                  "(first_stage_model. + LDM names, f16 / q8_0 as sd.cpp writes them), "
                  "decode 4x4 latents -> 32x32",
        "class": "AutoencoderKL",
        "dir": "../../golden/t2i-flux-schnell/pipeline/vae",
        "single_file": "../flux-gguf-sdcpp/" + single,
        "call": "m = AutoencoderKL.from_single_file(<the file's first_stage_model. tensors "
                "dequantised by gguf.quants.dequantize>, config=dir); scaled = latents / "
                "scaling_factor + shift_factor; decoded = m.decode(scaled).sample; image = "
                "VaeImageProcessor.postprocess(decoded) as (B, H, W, 3)",
        "args": {"latents": "in.latents", "height": 32, "width": 32,
                 "unpack_latents": False, "output_type": "np"},
        "outputs": {k: f"out.{k}" for k in ("scaled", "decoded", "image_uint8")},
        "tolerance": tol,
        "exact": [],
        "notes": ["dir gives the config only; the file is flux-gguf-sdcpp's"],
        "provenance": {"diffusers": diffusers.__version__, "torch": torch.__version__,
                       "gguf": getattr(gguf, "__version__", "unknown")},
    }, tensors)


# transformers' T5 encoder names -> llama.cpp's (gguf.constants, MODEL_ARCH.T5ENCODER)
T5_BLOCK = {
    "layer.0.SelfAttention.q": "attn_q", "layer.0.SelfAttention.k": "attn_k",
    "layer.0.SelfAttention.v": "attn_v", "layer.0.SelfAttention.o": "attn_o",
    "layer.0.SelfAttention.relative_attention_bias": "attn_rel_b",
    "layer.0.layer_norm": "attn_norm", "layer.1.DenseReluDense.wi_0": "ffn_gate",
    "layer.1.DenseReluDense.wi_1": "ffn_up", "layer.1.DenseReluDense.wo": "ffn_down",
    "layer.1.layer_norm": "ffn_norm",
}


def to_llamacpp_t5(name):
    if name == "shared.weight":
        return "token_embd.weight"
    if name == "encoder.final_layer_norm.weight":
        return "enc.output_norm.weight"
    parts = name.split(".")
    assert parts[:2] == ["encoder", "block"], name
    inner = ".".join(parts[3:-1])
    return f"enc.blk.{parts[2]}.{T5_BLOCK[inner]}.{parts[-1]}"


def llamacpp_t5_vocab(w, tok_dir, vocab_size):
    """llama.cpp's convert_hf_to_gguf.py T5EncoderModel.set_vocab: the sentencepiece
    pieces with their scores and types, added_tokens.json's tokens as USER_DEFINED (score
    -1000), [PAD1]... UNUSED rows up to the embedding's vocab_size, the normalizer_spec's
    flags and charsmap, and gguf.SpecialVocab's special ids."""
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2 as spm_pb2
    T = gguf.TokenType
    path = os.path.join(tok_dir, "spiece.model")
    proto = spm_pb2.ModelProto()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    assert proto.trainer_spec.model_type == 1
    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromFile(path)
    tokens = [f"[PAD{i}]".encode() for i in range(vocab_size)]
    scores = [-10000.0] * vocab_size
    types = [T.UNUSED] * vocab_size
    for i in range(sp.vocab_size()):
        t = T.NORMAL
        if sp.IsUnknown(i):
            t = T.UNKNOWN
        elif sp.IsControl(i):
            t = T.CONTROL
        elif sp.IsUnused(i):
            t = T.UNUSED
        elif sp.IsByte(i):
            t = T.BYTE
        tokens[i], scores[i], types[i] = sp.IdToPiece(i).encode(), sp.GetScore(i), t
    added = os.path.join(tok_dir, "added_tokens.json")
    if os.path.isfile(added):
        with open(added, encoding="utf-8") as f:
            for key, i in json.load(f).items():
                if i < vocab_size:
                    tokens[i], scores[i], types[i] = key.encode(), -1000.0, T.USER_DEFINED
    norm = proto.normalizer_spec
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(norm.add_dummy_prefix)
    w.add_remove_extra_whitespaces(norm.remove_extra_whitespaces)
    if norm.precompiled_charsmap:
        w.add_precompiled_charsmap(norm.precompiled_charsmap)
    gguf.SpecialVocab(tok_dir, n_vocab=len(tokens)).add_to_gguf(w)


def gguf_tokenizer_check(out_dir, single):
    """transformers' own GGUF tokenizer conversion (AutoTokenizer with gguf_file) against
    the folder's T5Tokenizer on the golden tokenizer prompts: the file's vocabulary must
    give the folder's ids."""
    from transformers import AutoTokenizer, T5Tokenizer
    with open(os.path.join(GOLDEN, "tok-t5-512", "case.json"), encoding="utf-8") as f:
        prompts = json.load(f)["args"]["prompts"]
    prompts = prompts + ["a <extra_id_0> b <extra_id_99>c", "<pad></s><unk> x"]
    folder = T5Tokenizer.from_pretrained(os.path.join(PIPE, "tokenizer_2"))
    from_file = AutoTokenizer.from_pretrained(out_dir, gguf_file=single)
    same = [folder(p).input_ids == from_file(p).input_ids for p in prompts]
    return (f"the file's tokenizer.ggml.* vocabulary is the folder's tokenizer_2 as llama.cpp "
            f"writes it; transformers {transformers.__version__}'s GGUF tokenizer "
            f"({type(from_file).__name__}) gives the folder T5Tokenizer's ids on "
            f"{sum(same)} of {len(prompts)} prompts (tok-t5-512's and two with special tokens)"
            + ("" if all(same) else f"; differing: {[i for i, x in enumerate(same) if not x]}"))


def t5_case():
    name = "te-gguf-t5-llamacpp"
    te_dir = os.path.join(PIPE, "text_encoder_2")
    out_dir = os.path.join(CASES, name)
    os.makedirs(out_dir, exist_ok=True)
    src = T5EncoderModel.from_pretrained(te_dir)
    c = src.config
    single = "t5-tiny-encoder-Q8_0.gguf"
    path = os.path.join(out_dir, single)
    w = gguf.GGUFWriter(path, arch="t5encoder")
    w.add_name("t5-tiny-encoder")
    w.add_context_length(512)
    w.add_embedding_length(c.d_model)
    w.add_feed_forward_length(c.d_ff)
    w.add_block_count(c.num_layers)
    w.add_head_count(c.num_heads)
    w.add_key_length(c.d_kv)
    w.add_value_length(c.d_kv)
    w.add_layer_norm_rms_eps(c.layer_norm_epsilon)
    w.add_layer_norm_eps(c.layer_norm_epsilon)
    w.add_relative_attn_buckets_count(c.relative_attention_num_buckets)
    w.add_decoder_start_token_id(c.decoder_start_token_id)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    # city96's files carry llama.cpp's tokenizer metadata, written as llama.cpp's
    # convert_hf_to_gguf.py T5EncoderModel.set_vocab writes it from the folder's
    # tokenizer_2 (spiece.model, added_tokens.json, special tokens).
    llamacpp_t5_vocab(w, os.path.join(PIPE, "tokenizer_2"), c.vocab_size)
    counts = {}
    for k, v in sorted(src.state_dict().items()):
        if k == "encoder.embed_tokens.weight":  # tied to shared.weight
            continue
        v = v.float().contiguous().numpy()
        qt = Q.F32 if v.ndim == 1 else Q.Q8_0 if v.shape[-1] % 32 == 0 else Q.F16
        counts[qt.name] = counts.get(qt.name, 0) + 1
        add(w, to_llamacpp_t5(k), v, qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # transformers' own GGUF loader is the reference; it must hold the exact dequantised
    # weights and the golden config's shape.
    exact = dequantised(path)
    tok = T5TokenizerFast.from_pretrained(os.path.join(PIPE, "tokenizer_2"))
    ids = tok(["a photo of a cat"], padding="max_length", max_length=16, truncation=True,
              return_tensors="pt").input_ids
    # transformers' loader keeps GGUF weights packed and computes in float32, so it gives
    # the weights (its name map and dequantisation); the runs are plain modules in float64
    # and float32 holding them.
    g = T5EncoderModel.from_pretrained(out_dir, gguf_file=single, config=c,
                                       torch_dtype=torch.float32)
    got = {k: v.float() for k, v in g.state_dict().items()}
    for k in src.state_dict():
        want = exact["token_embd.weight" if k == "encoder.embed_tokens.weight"
                     else to_llamacpp_t5(k)]
        assert torch.equal(got[k], want), k
    tok_note = gguf_tokenizer_check(out_dir, single)
    res = {}
    for tag, dt in (("out", torch.float64), ("out_f32", torch.float32)):
        m = T5EncoderModel(c).to(dt).eval()
        m.load_state_dict({k: v.to(dt) for k, v in got.items()})
        with torch.no_grad():
            o = m(input_ids=ids)
        res[tag] = {"last_hidden_state": o.last_hidden_state.numpy()}
    tensors = {"in.input_ids": ids.numpy().astype(np.int64),
               "out.last_hidden_state": res["out"]["last_hidden_state"]}
    write_case(name, {
        "kind": "text_encoder",
        "covers": "T5EncoderModel from a GGUF in llama.cpp's names (t5encoder: token_embd, "
                  f"enc.blk.N.attn_q ..., enc.output_norm), as city96's hold it: {counts}",
        "class": "T5EncoderModel",
        "dir": "../../golden/t2i-flux-schnell/pipeline/text_encoder_2",
        "single_file": single,
        "call": "w = T5EncoderModel.from_pretrained(case_dir, gguf_file=single_file, "
                "config=<dir's config>).state_dict(); m = T5EncoderModel(config) in float64 "
                "holding w; o = m(input_ids)",
        "args": {"input_ids": "in.input_ids"},
        "outputs": {"last_hidden_state": "out.last_hidden_state"},
        "tolerance": {"last_hidden_state": tolerance(res["out"]["last_hidden_state"],
                                                     res["out_f32"]["last_hidden_state"],
                                                     1e-5, 1e-6)},
        "exact": [],
        "notes": ["dir gives the config only; transformers' GGUF loader maps the names and "
                  "dequantises (checked equal to gguf.quants.dequantize), but the config it "
                  "builds from t5encoder.* metadata says dense_act_fn 'relu' where T5 v1.1 "
                  "has 'gelu_new', so dir's config is passed to it", tok_note],
        "provenance": {"transformers": transformers.__version__, "torch": torch.__version__,
                       "gguf": getattr(gguf, "__version__", "unknown")},
    }, tensors)


def pipe_case():
    import refcase
    refcase.patch_randn_float32()
    from diffusers import FluxPipeline
    from transformers import CLIPTextModel, CLIPTokenizer
    name = "pipe-flux-gguf-sdcpp"
    out_dir = os.path.join(CASES, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    conf = json.load(open(os.path.join(PIPE, "transformer", "config.json")))
    fsf.use_inner_dim(conf["num_attention_heads"] * conf["attention_head_dim"])
    tr = FluxTransformer2DModel.from_pretrained(os.path.join(PIPE, "transformer"))
    vae = AutoencoderKL.from_pretrained(os.path.join(PIPE, "vae"))
    clip = CLIPTextModel.from_pretrained(os.path.join(PIPE, "text_encoder"))
    t5 = T5EncoderModel.from_pretrained(os.path.join(PIPE, "text_encoder_2"))
    tensors = []  # (name, float32 numpy, the source file's type)
    for k, v in fsf.to_bfl(tr.state_dict(), conf["num_layers"],
                           conf["num_single_layers"]).items():
        tensors.append(("model.diffusion_model." + k, v, Q.BF16))
    for k, v in to_ldm_vae(vae.state_dict(), len(vae.config.block_out_channels)).items():
        tensors.append(("vae." + k, v, Q.F16))
    for k, v in clip.state_dict().items():  # clip_l.safetensors' names: "text_model." + ...
        if not k.endswith("position_ids"):
            k = k if k.startswith("text_model.") else "text_model." + k
            tensors.append(("text_encoders.clip_l.transformer." + k, v, Q.F16))
    for k, v in t5.state_dict().items():
        if k != "encoder.embed_tokens.weight":  # city96's types: F32 1-D, Q8_0 / F16 2-D
            src = Q.F32 if v.ndim == 1 else Q.Q8_0 if v.shape[-1] % 32 == 0 else Q.F16
            tensors.append(("text_encoders.t5xxl.transformer." + to_llamacpp_t5(k), v, src))
    single = "flux1-tiny-sdcpp-all-q8_0.gguf"
    path = os.path.join(out_dir, single)
    w = gguf.GGUFWriter(path, arch="flux")
    counts = {}
    for k, v, source in sorted(tensors, key=lambda t: t[0]):
        v = v.to(torch.float32).contiguous().numpy()
        qt = sdcpp_type(k, v) or source
        counts[qt.name] = counts.get(qt.name, 0) + 1
        add(w, k, v, qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    exact = dequantised(path)
    upcast = os.path.join(tempfile.mkdtemp(), "tr-vae-f32.safetensors")
    save_file({k: v for k, v in exact.items()
               if k.startswith("model.diffusion_model.") or k.startswith("vae.")}, upcast)
    cp, tp = "text_encoders.clip_l.transformer.", "text_encoders.t5xxl.transformer."
    level = "" if any(k.startswith("text_model.") for k in clip.state_dict()) else "text_model."
    clip_sd = {k[len(cp + level):]: v for k, v in exact.items() if k.startswith(cp)}
    t5_sd = {k: exact[tp + ("token_embd.weight" if k == "encoder.embed_tokens.weight"
                            else to_llamacpp_t5(k))] for k in t5.state_dict()}

    g = torch.Generator().manual_seed(7)
    latents = torch.randn(1, 4, 64, generator=g)  # 32x32: (32/16)^2 tokens of 16*4
    args = dict(prompt="a red fox in the snow", height=32, width=32, num_inference_steps=2,
                guidance_scale=0.0, max_sequence_length=32)
    res = {}
    for dt in (torch.float64, torch.float32):
        te = CLIPTextModel.from_pretrained(os.path.join(PIPE, "text_encoder"), torch_dtype=dt)
        missing, unexpected = te.load_state_dict({k: v.to(dt) for k, v in clip_sd.items()},
                                                 strict=False)
        assert not unexpected and all("position_ids" in k for k in missing), (missing,
                                                                              unexpected)
        te2 = T5EncoderModel.from_pretrained(os.path.join(PIPE, "text_encoder_2"),
                                             torch_dtype=dt)
        te2.load_state_dict({k: v.to(dt) for k, v in t5_sd.items()})
        pipe = FluxPipeline.from_single_file(
            upcast, config=PIPE, torch_dtype=dt, text_encoder=te, text_encoder_2=te2,
            tokenizer=CLIPTokenizer.from_pretrained(os.path.join(PIPE, "tokenizer")),
            tokenizer_2=T5TokenizerFast.from_pretrained(os.path.join(PIPE, "tokenizer_2")))
        with torch.no_grad():
            img = pipe(latents=latents.to(dt), output_type="np", **args).images
            lat = pipe(latents=latents.to(dt), output_type="latent", **args).images
        res[dt] = (np.asarray(img, np.float64), lat.double().numpy())
    img64, lat64 = res[torch.float64]
    img32, lat32 = res[torch.float32]
    u8 = (img64 * 255).round().astype(np.uint8)
    write_case(name, {
        "kind": "pipeline",
        "covers": "FluxPipeline from stable-diffusion.cpp's one-file GGUF (transformer, VAE, "
                  "CLIP-L and a llama.cpp-named T5 under sd.cpp's prefixes, q8_0 rules: "
                  f"{counts}), the folder's configs and tokenizers (-m FILE --config DIR), "
                  "32x32, 2 steps",
        "class": "FluxPipeline",
        "dir": "../../golden/t2i-flux-schnell/pipeline",
        "single_file": single,
        "call": "FluxPipeline.from_single_file(<the transformer and VAE dequantised>, "
                "config=dir, text_encoder*=<dir's classes holding the file's dequantised "
                "CLIP-L and T5>, tokenizer* from dir)(latents=in.latents, **args)",
        "args": dict(args, latents="in.latents", output_type="np"),
        "outputs": {"latents_final": "out.latents_final", "image": "out.image",
                    "image_uint8": "out.image_uint8"},
        "tolerance": {
            "latents_final": tolerance(lat64, lat32, 1e-4, 1e-5),
            "image": tolerance(img64, img32, 1e-4, 1e-5),
            "image_uint8": {"max_abs": 1, "rel_l2": 1.0}},
        "exact": [],
        "notes": ["out.* = every model in float64 from the file's values dequantised by "
                  "gguf.quants.dequantize; tolerances 20x the float32 run's difference, "
                  "floors 1e-4 / 1e-5"],
        "provenance": {"diffusers": diffusers.__version__,
                       "transformers": transformers.__version__, "torch": torch.__version__,
                       "gguf": getattr(gguf, "__version__", "unknown")},
    }, {"in.latents": latents.numpy(), "out.latents_final": lat64,
        "out.image": img64.astype(np.float32), "out.image_uint8": u8})


def sd3_case():
    from diffusers import SD3Transformer2DModel
    from sd3_single_file import to_mmdit
    name = "sd3-gguf-sdcpp"
    golden = os.path.join(GOLDEN, "sd3-transformer")
    cfg = os.path.join(golden, "model")
    conf = json.load(open(os.path.join(cfg, "config.json")))
    sd = load_file(os.path.join(cfg, "diffusion_pytorch_model.safetensors"))
    mm = to_mmdit(sd, conf["num_layers"])
    out_dir = os.path.join(CASES, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    single = "sd3-tiny-sdcpp-q8_0.gguf"
    path = os.path.join(out_dir, single)
    w = gguf.GGUFWriter(path, arch="sd3")
    counts = {}
    for k in sorted(mm):
        v = mm[k].to(torch.float32).contiguous().numpy()
        qt = sdcpp_type("model.diffusion_model." + k, v) or Q.F16
        counts[qt.name] = counts.get(qt.name, 0) + 1
        add(w, "model.diffusion_model." + k, v, qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp = os.path.join(tempfile.mkdtemp(), "exact.safetensors")
    save_file(dequantised(path), tmp)
    st = load_file(os.path.join(golden, "case.safetensors"))
    gcase = json.load(open(os.path.join(golden, "case.json")))
    ins = {k: v for k, v in st.items() if k.startswith("in.")}
    res = {}
    for dt in (torch.float64, torch.float32):
        m = SD3Transformer2DModel.from_single_file(tmp, config=cfg, torch_dtype=dt)
        args = {k: (ins[v].to(dt) if isinstance(v, str) and v.startswith("in.") else v)
                for k, v in gcase["args"].items()}
        with torch.no_grad():
            res[dt] = m(**args)[0].double().numpy()
    write_case(name, {
        "kind": "model_forward",
        "covers": "SD3Transformer2DModel from a stable-diffusion.cpp GGUF (model.diffusion_model. "
                  f"+ MMDiT names, sd.cpp's q8_0 rules: {counts})",
        "class": "SD3Transformer2DModel",
        "dir": "../../golden/sd3-transformer/model",
        "single_file": single,
        "call": "SD3Transformer2DModel.from_single_file(<the file dequantised by "
                "gguf.quants.dequantize>, config=dir)(**args)[0]",
        "args": gcase["args"],
        "outputs": {"sample": "out.sample"},
        "tolerance": {"sample": tolerance(res[torch.float64], res[torch.float32], 1e-5, 1e-6)},
        "exact": [],
        "notes": ["inputs are the golden sd3-transformer case's; 'dir' gives the config only"],
        "provenance": {"diffusers": diffusers.__version__, "torch": torch.__version__,
                       "gguf": getattr(gguf, "__version__", "unknown")},
    }, dict({k: v.numpy() for k, v in ins.items()}, **{"out.sample": res[torch.float64]}))


def clip_case():
    from transformers import CLIPTextModelWithProjection, CLIPTokenizer
    name = "te-gguf-clip-sdcpp"
    sd3 = os.path.join(GOLDEN, "t2i-sd3", "pipeline")
    te_dir = os.path.join(sd3, "text_encoder_2")
    out_dir = os.path.join(CASES, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    src = CLIPTextModelWithProjection.from_pretrained(te_dir)
    pre = "text_encoders.clip_g.transformer."
    single = "clip_g-sdcpp-q8_0.gguf"
    path = os.path.join(out_dir, single)
    w = gguf.GGUFWriter(path, arch="clip")
    counts, names = {}, {}
    for k, v in src.state_dict().items():
        if k.endswith("position_ids"):
            continue
        n = "text_model.text_projection" if k == "text_projection.weight" else (
            k if k.startswith("text_model.") else "text_model." + k)
        names[pre + n] = k
    for n in sorted(names):
        v = src.state_dict()[names[n]].float().contiguous().numpy()
        qt = sdcpp_type(n, v) or Q.F16
        counts[qt.name] = counts.get(qt.name, 0) + 1
        add(w, n, v, qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    exact = dequantised(path)
    sd = {names[n]: v for n, v in exact.items()}
    tok = CLIPTokenizer.from_pretrained(os.path.join(sd3, "tokenizer_2"))
    ids = tok(["a photo of a cat"], padding="max_length", max_length=77, truncation=True,
              return_tensors="pt").input_ids
    res = {}
    for tag, dt in (("out", torch.float64), ("out_f32", torch.float32)):
        m = CLIPTextModelWithProjection.from_pretrained(te_dir, torch_dtype=dt)
        missing, unexpected = m.load_state_dict({k: v.to(dt) for k, v in sd.items()},
                                                strict=False)
        assert not unexpected and all("position_ids" in k for k in missing), (missing,
                                                                              unexpected)
        with torch.no_grad():
            o = m(input_ids=ids)
        res[tag] = {"last_hidden_state": o.last_hidden_state.numpy(),
                    "text_embeds": o.text_embeds.numpy()}
    tensors = {"in.input_ids": ids.numpy().astype(np.int64)}
    for k in res["out"]:
        tensors[f"out.{k}"] = res["out"][k]
    write_case(name, {
        "kind": "text_encoder",
        "covers": "CLIPTextModelWithProjection (SD3's CLIP-G) from a stable-diffusion.cpp GGUF "
                  "(text_encoders.clip_g.transformer. + text_model.*, the projection as "
                  f"text_model.text_projection), sd.cpp's q8_0 rules: {counts}",
        "class": "CLIPTextModelWithProjection",
        "dir": "../../golden/t2i-sd3/pipeline/text_encoder_2",
        "single_file": single,
        "call": "m = CLIPTextModelWithProjection(config of dir) holding the file's tensors "
                "dequantised, prefix stripped, text_model.text_projection as "
                "text_projection.weight; o = m(input_ids)",
        "args": {"input_ids": "in.input_ids"},
        "outputs": {k: f"out.{k}" for k in res["out"]},
        "tolerance": {k: tolerance(res["out"][k], res["out_f32"][k], 1e-5, 1e-6)
                      for k in res["out"]},
        "exact": [],
        "notes": ["dir gives the config only"],
        "provenance": {"transformers": transformers.__version__, "torch": torch.__version__,
                       "gguf": getattr(gguf, "__version__", "unknown")},
    }, tensors)


def sdcpp_diffusers_file():
    tr = load_file(os.path.join(PIPE, "transformer", "diffusion_pytorch_model.safetensors"))
    vae = load_file(os.path.join(PIPE, "vae", "diffusion_pytorch_model.safetensors"))
    tensors = {"model.diffusion_model." + k: v for k, v in tr.items()}
    tensors.update({"vae." + k: v for k, v in vae.items()})
    path = os.path.join(CASES, "pipe-flux-gguf-sdcpp", "flux1-tiny-sdcpp-diffusers-f32.gguf")
    w = gguf.GGUFWriter(path, arch="flux")
    for k in sorted(tensors):
        assert tensors[k].dtype == torch.float32, k
        add(w, k, tensors[k].contiguous().numpy(), Q.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def flux2_case():
    from diffusers import Flux2Transformer2DModel
    from flux2_single_file import to_bfl2
    name = "flux2-gguf-sdcpp"
    golden = os.path.join(GOLDEN, "flux2-transformer")
    cfg = os.path.join(golden, "model")
    conf = json.load(open(os.path.join(cfg, "config.json")))
    sd = load_file(os.path.join(cfg, "diffusion_pytorch_model.safetensors"))
    bfl = to_bfl2(sd, conf["num_layers"], conf["num_single_layers"])
    out_dir = os.path.join(CASES, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    single = "flux2-tiny-sdcpp-q8_0.gguf"
    path = os.path.join(out_dir, single)
    w = gguf.GGUFWriter(path, arch="flux2")
    counts = {}
    for k in sorted(bfl):
        v = bfl[k].to(torch.float32).contiguous().numpy()
        qt = sdcpp_type("model.diffusion_model." + k, v) or Q.BF16
        counts[qt.name] = counts.get(qt.name, 0) + 1
        add(w, "model.diffusion_model." + k, v, qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # diffusers 0.42's FLUX.2 conversion does not strip the prefix: its reference reads the
    # same dequantised values under BFL's own names (as flux2_single_file.py does)
    pre = "model.diffusion_model."
    tmp = os.path.join(tempfile.mkdtemp(), "exact.safetensors")
    save_file({k[len(pre):]: v for k, v in dequantised(path).items()}, tmp)
    st = load_file(os.path.join(golden, "case.safetensors"))
    gcase = json.load(open(os.path.join(golden, "case.json")))
    ins = {k: v for k, v in st.items() if k.startswith("in.")}
    res = {}
    for dt in (torch.float64, torch.float32):
        m = Flux2Transformer2DModel.from_single_file(tmp, config=cfg, torch_dtype=dt)
        assert set(m.state_dict()) == set(sd), set(m.state_dict()) ^ set(sd)
        args = {k: (ins[v].to(dt) if isinstance(v, str) and v.startswith("in.") else v)
                for k, v in gcase["args"].items()}
        with torch.no_grad():
            res[dt] = m(**args)[0].double().numpy()
    write_case(name, {
        "kind": "model_forward",
        "covers": "Flux2Transformer2DModel from a stable-diffusion.cpp GGUF "
                  f"(model.diffusion_model. + BFL FLUX.2 names, sd.cpp's q8_0 rules: {counts})",
        "class": "Flux2Transformer2DModel",
        "dir": "../../golden/flux2-transformer/model",
        "single_file": single,
        "call": "Flux2Transformer2DModel.from_single_file(<the file dequantised by "
                "gguf.quants.dequantize, prefix stripped>, config=dir)(**args)[0]",
        "args": gcase["args"],
        "outputs": {"sample": "out.sample"},
        "tolerance": {"sample": tolerance(res[torch.float64], res[torch.float32], 1e-5, 1e-6)},
        "exact": [],
        "notes": ["inputs are the golden flux2-transformer case's; 'dir' gives the config only"],
        "provenance": {"diffusers": diffusers.__version__, "torch": torch.__version__,
                       "gguf": getattr(gguf, "__version__", "unknown")},
    }, dict({k: v.numpy() for k, v in ins.items()}, **{"out.sample": res[torch.float64]}))


def main():
    out_dir = os.path.join(CASES, "flux-gguf-sdcpp")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    path, single, counts, cfg = sdcpp_file(out_dir)
    flux_case(path, single, counts, cfg)
    vae_case(path, single)
    t5_case()
    pipe_case()
    sdcpp_diffusers_file()
    sd3_case()
    flux2_case()
    clip_case()


if __name__ == "__main__":
    main()
