"""Reference cases for LoRA adapters on the tiny FLUX.1 [schnell] pipeline of tests/golden.

Random adapters (lora_B is drawn too, so the adapters change the image) are written into
the case folder as the files people pass around, and the reference is what diffusers makes
of them: FluxPipeline.load_lora_weights(file, adapter_name=...) for each, set_adapters(names,
weights), then the pipeline call from prompt strings with given latents. out.* are float64
runs (the adapters cast to float64 after loading); torch's float32 run sets the tolerances.

Layouts:
  lora-flux-peft     two adapters saved by diffusers (save_lora_weights): "a" with its peft
                     config in the safetensors metadata (rank and alpha patterns, a CLIP-L
                     part), "b" without metadata, its alphas as ".alpha" tensors
  lora-flux-kohya    sd-scripts names (lora_unet_double_blocks_0_img_attn_qkv.lora_down
                     .weight, .alpha; lora_te1_* for CLIP-L) on Black Forest Labs' fused modules
  lora-flux-xlabs    XLabs names (double_blocks.0.processor.qkv_lora1.down.weight ...)
  lora-flux-kohya-te2  a kohya file with lora_unet_, lora_te1_ and lora_te2_ (T5) modules,
                     and a ComfyUI-named one (diffusion_model.*, text_encoders.clip_l / t5xxl)
  lora-flux2-klein-bfl    BFL / ai-toolkit names for FLUX.2 (diffusion_model.double_blocks
                     .0.img_attn.qkv.lora_A.weight ...) on the tiny FLUX.2 [klein]
  lora-flux2-klein-kohya  sd-scripts names for FLUX.2 (lora_unet_single_blocks_0_linear1 ...)

    /work/venv/bin/python tools/refgen/lora.py [case ...]
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

import refcase

refcase.patch_randn_float32()
from diffusers import Flux2KleinPipeline, FluxPipeline, StableDiffusion3Pipeline  # noqa: E402
from peft import LoraConfig  # noqa: E402
from peft.utils import get_peft_model_state_dict  # noqa: E402

GOLDEN = "t2i-flux-schnell"
PIPE_DIR = os.path.join(refcase.ROOT, "tests", "golden", GOLDEN, "pipeline")
ARGS = dict(prompt="A photo of a red fox in the snow, 35mm, golden hour", height=64, width=64,
            num_inference_steps=4, guidance_scale=0.0, max_sequence_length=256)


def randomize(module_params, seed, std_a=0.3, std_b=0.2):
    g = torch.Generator().manual_seed(seed)
    for name, p in module_params:
        if "lora_A" in name:
            p.data = torch.randn(p.shape, generator=g) * std_a / p.shape[1] ** 0.5
        elif "lora_B" in name:
            p.data = torch.randn(p.shape, generator=g) * std_b / p.shape[1] ** 0.5


def peft_adapter_a(out_dir):
    """Saved by diffusers with its config in the metadata: rank and alpha patterns, and
    a part for CLIP-L (the text encoder)."""
    pipe = FluxPipeline.from_pretrained(PIPE_DIR, torch_dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                     target_modules=["to_q", "to_k", "to_v", "to_out.0", "add_q_proj",
                                     "add_k_proj", "add_v_proj", "to_add_out", "ff.net.0.proj",
                                     "ff.net.2", "proj_mlp", "proj_out", "norm1.linear",
                                     "x_embedder"],
                     rank_pattern={"single_transformer_blocks.1.proj_mlp": 2},
                     alpha_pattern={"transformer_blocks.1.attn.to_k": 2})
    pipe.transformer.add_adapter(cfg, adapter_name="a")
    randomize([(n, p) for n, p in pipe.transformer.named_parameters() if "lora" in n], 101)
    te_cfg = LoraConfig(r=2, lora_alpha=3, target_modules=["q_proj", "v_proj", "fc1"])
    te_layers = {}
    g = torch.Generator().manual_seed(102)
    for n, m in pipe.text_encoder.named_modules():
        if n.split(".")[-1] in ("q_proj", "v_proj", "fc1"):
            k = m.weight.shape[1]
            te_layers[f"{n}.lora_A.weight"] = torch.randn(2, k, generator=g) * 0.3 / k ** 0.5
            te_layers[f"{n}.lora_B.weight"] = torch.randn(m.weight.shape[0], 2, generator=g) * 0.3
    FluxPipeline.save_lora_weights(
        out_dir, weight_name="a.safetensors",
        transformer_lora_layers=get_peft_model_state_dict(pipe.transformer, adapter_name="a"),
        text_encoder_lora_layers=te_layers,
        transformer_lora_adapter_metadata=cfg.to_dict(),
        text_encoder_lora_adapter_metadata=te_cfg.to_dict())
    return "a.safetensors"


def peft_adapter_b(out_dir):
    """diffusers' names, no metadata, alphas as tensors; one module of another rank."""
    tr = FluxPipeline.from_pretrained(PIPE_DIR, torch_dtype=torch.float32).transformer
    g = torch.Generator().manual_seed(201)
    sd = {}
    mods = dict(tr.named_modules())
    targets = ["transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.to_v",
               "transformer_blocks.0.ff_context.net.0.proj", "single_transformer_blocks.0.norm.linear",
               "single_transformer_blocks.1.attn.to_k", "context_embedder"]
    for i, t in enumerate(targets):
        w = mods[t].weight
        r = 3 if i != 2 else 5
        sd[f"transformer.{t}.lora_A.weight"] = torch.randn(r, w.shape[1], generator=g) * 0.3 / w.shape[1] ** 0.5
        sd[f"transformer.{t}.lora_B.weight"] = torch.randn(w.shape[0], r, generator=g) * 0.4 / r ** 0.5
        sd[f"transformer.{t}.alpha"] = torch.tensor(1.5)
    save_file(sd, os.path.join(out_dir, "b.safetensors"))
    return "b.safetensors"


FLUX1 = dict(cls=FluxPipeline, golden=GOLDEN, args=ARGS, seed=7)


def run(files, names, weights, spec):
    res = {}
    pipe_dir = os.path.join(refcase.ROOT, "tests", "golden", spec["golden"], "pipeline")
    for dtype in (torch.float64, torch.float32):
        pipe = spec["cls"].from_pretrained(pipe_dir, torch_dtype=dtype)
        for f, n in zip(files, names):
            pipe.load_lora_weights(f, adapter_name=n)
        pipe.set_adapters(names, adapter_weights=weights)
        pipe.transformer.to(dtype)
        pipe.text_encoder.to(dtype)
        outs = []
        for ot in ("np", "latent"):
            g = torch.Generator("cpu").manual_seed(spec["seed"])
            with torch.no_grad():
                o = pipe(output_type=ot, generator=g, **spec["args"]).images
            outs.append(o if ot == "np" else o.float().numpy() if dtype == torch.float32 else o.numpy())
        res[dtype] = outs
    return res


def base_image(spec):
    pipe_dir = os.path.join(refcase.ROOT, "tests", "golden", spec["golden"], "pipeline")
    pipe = spec["cls"].from_pretrained(pipe_dir, torch_dtype=torch.float64)
    g = torch.Generator("cpu").manual_seed(spec["seed"])
    with torch.no_grad():
        return pipe(output_type="np", generator=g, **spec["args"]).images


def write(name, covers, files, names, weights, notes, spec=FLUX1):
    out_dir = os.path.join(refcase.CASES, name)
    paths = [os.path.join(out_dir, f) for f in files]
    res = run(paths, names, weights, spec)
    img64, lat64 = res[torch.float64]
    img32, lat32 = res[torch.float32]
    base = base_image(spec)
    effect = float(np.abs(np.asarray(img64) - base).mean())
    u8 = (np.asarray(img64, np.float64) * 255).round().astype(np.uint8)
    args = dict(spec["args"], output_type="np",
                generator={"device": "cpu", "seed": spec["seed"]},
                loras=[{"file": f, "adapter_name": n, "weight": w}
                       for f, n, w in zip(files, names, weights)])
    refcase.write_case(name, {
        "kind": "pipeline",
        "covers": covers,
        "class": spec["cls"].__name__,
        "dir": f"../../golden/{spec['golden']}/pipeline",
        "call": "pipe.load_lora_weights(file, adapter_name=n) for each of args.loras; "
                "pipe.set_adapters(names, adapter_weights=weights); pipe(generator=torch."
                "Generator('cpu').manual_seed(seed), **args); latents_final: output_type='latent'",
        "args": args,
        "outputs": {"latents_final": "out.latents_final", "image": "out.image",
                    "image_uint8": "out.image_uint8"},
        "tolerance": {
            "latents_final": refcase.tolerance(lat64, lat32, 1e-4, 1e-5),
            "image": refcase.tolerance(img64, img32, 1e-4, 1e-5),
            "image_uint8": {"max_abs": 1, "rel_l2": 1.0}},
        "exact": [],
        "notes": notes + [
            "args.loras: the adapter files (in this folder), their adapter names and "
            "set_adapters weights; diffuse takes them as df_load_opts.loras",
            "out.* = every model in float64 (adapters cast to float64 after loading); the "
            "noise drawn in float32",
            f"mean |image - image without the adapters| = {effect:.4f}",
            "tolerances: 20x the float32 run's difference (not stored), floors 1e-4 / 1e-5"],
        "provenance": refcase.provenance(),
    }, {"out.image": np.asarray(img64, np.float32),
        "out.latents_final": np.asarray(lat64, np.float64), "out.image_uint8": u8})
    print(name, "done; effect", effect)


def case_peft():
    name = "lora-flux-peft"
    out_dir = os.path.join(refcase.CASES, name)
    os.makedirs(out_dir, exist_ok=True)
    fa = peft_adapter_a(out_dir)
    fb = peft_adapter_b(out_dir)
    write(name, "FluxPipeline with two peft-layout LoRA adapters (metadata config with rank "
          "and alpha patterns and a CLIP-L part; alphas as tensors), set_adapters weights "
          "0.8 and -0.6", [fa, fb], ["a", "b"], [0.8, -0.6],
          ["a.safetensors: save_lora_weights with transformer_lora_adapter_metadata and "
           "text_encoder_lora_adapter_metadata (LoraConfig r 4, alpha 8, a rank and an alpha "
           "pattern; CLIP-L r 2 alpha 3)",
           "b.safetensors: transformer.<module>.lora_A/lora_B.weight and .alpha tensors (1.5), "
           "ranks 3 and 5, no metadata"])


# the tiny FLUX.1's widths: inner 32, MLP 128, CLIP-L hidden 32 (its fc1 64)
D, MLP = 32, 128


def kohya_adapter(out_dir):
    """sd-scripts names on BFL's modules, alphas as tensors (one module without). Not
    linear1: diffusers' converter splits it with FLUX.1-dev's widths (3072, ...) only."""
    shapes = {}
    for i in range(2):
        b = f"lora_unet_double_blocks_{i}_"
        for s_ in ("img", "txt"):
            shapes[b + s_ + "_attn_qkv"] = (3 * D, D)
            shapes[b + s_ + "_attn_proj"] = (D, D)
            shapes[b + s_ + "_mlp_0"] = (MLP, D)
            shapes[b + s_ + "_mlp_2"] = (D, MLP)
            shapes[b + s_ + "_mod_lin"] = (6 * D, D)
        b = f"lora_unet_single_blocks_{i}_"
        shapes[b + "linear2"] = (D, D + MLP)
        shapes[b + "modulation_lin"] = (3 * D, D)
    shapes["lora_te1_text_model_encoder_layers_1_mlp_fc1"] = (64, 32)
    g = torch.Generator().manual_seed(301)
    sd = {}
    for j, (m, (o, k)) in enumerate(shapes.items()):
        r = 4
        sd[m + ".lora_down.weight"] = torch.randn(r, k, generator=g) * 0.3 / k ** 0.5
        sd[m + ".lora_up.weight"] = torch.randn(o, r, generator=g) * 0.3 / r ** 0.5
        if j != 3:
            sd[m + ".alpha"] = torch.tensor(2.0 + (j % 3))
    save_file(sd, os.path.join(out_dir, "kohya.safetensors"))
    return "kohya.safetensors"


def xlabs_adapter(out_dir):
    """XLabs' processor names (no alphas)."""
    shapes = {}
    for i in range(2):
        b = f"double_blocks.{i}.processor."
        shapes[b + "qkv_lora1"] = (3 * D, D)
        shapes[b + "qkv_lora2"] = (3 * D, D)
        shapes[b + "proj_lora1"] = (D, D)
        shapes[b + "proj_lora2"] = (D, D)
        b = f"single_blocks.{i}.processor."
        shapes[b + "qkv_lora"] = (3 * D, D)
        shapes[b + "proj_lora"] = (D, D + MLP)
    g = torch.Generator().manual_seed(401)
    sd = {}
    for m, (o, k) in shapes.items():
        r = 3
        sd[m + ".down.weight"] = torch.randn(r, k, generator=g) * 0.3 / k ** 0.5
        sd[m + ".up.weight"] = torch.randn(o, r, generator=g) * 0.3 / r ** 0.5
    save_file(sd, os.path.join(out_dir, "xlabs.safetensors"))
    return "xlabs.safetensors"


def kohya_outside_adapter(out_dir):
    """kohya modules outside the blocks (img_in, txt_in, time_in, vector_in, final_layer),
    which diffusers 0.42 reads but does not apply, beside two block modules it applies."""
    shapes = {"lora_unet_img_in": (D, 64), "lora_unet_txt_in": (D, 48),
              "lora_unet_time_in_in_layer": (D, 256), "lora_unet_vector_in_in_layer": (D, 32),
              "lora_unet_final_layer_linear": (64, D),
              "lora_unet_final_layer_adaLN_modulation_1": (2 * D, D),
              "lora_unet_double_blocks_1_txt_attn_proj": (D, D),
              "lora_unet_single_blocks_0_linear2": (D, D + MLP)}
    g = torch.Generator().manual_seed(351)
    sd = {}
    for m, (o, k) in shapes.items():
        sd[m + ".lora_down.weight"] = torch.randn(4, k, generator=g) * 0.5 / k ** 0.5
        sd[m + ".lora_up.weight"] = torch.randn(o, 4, generator=g) * 0.5
        sd[m + ".alpha"] = torch.tensor(4.0)
    save_file(sd, os.path.join(out_dir, "kohya_outside.safetensors"))
    return "kohya_outside.safetensors"


def case_kohya_outside():
    name = "lora-flux-kohya-outside"
    out_dir = os.path.join(refcase.CASES, name)
    os.makedirs(out_dir, exist_ok=True)
    f = kohya_outside_adapter(out_dir)
    write(name, "FluxPipeline with a kohya LoRA whose modules outside the blocks (img_in, "
          "txt_in, time_in, vector_in, final_layer) diffusers reads but does not apply",
          [f], ["o"], [1.0],
          ["diffusers 0.42's kohya converter names those modules without the "
           "'transformer.' prefix, so load_lora_weights drops them: only the two block "
           "modules change the image"])


def case_kohya():
    name = "lora-flux-kohya"
    out_dir = os.path.join(refcase.CASES, name)
    os.makedirs(out_dir, exist_ok=True)
    f = kohya_adapter(out_dir)
    write(name, "FluxPipeline with a kohya / sd-scripts LoRA (lora_unet_* on BFL's fused qkv "
          "and modulation, .alpha tensors, lora_te1_* for CLIP-L), weight 0.9", [f], ["k"],
          [0.9], ["kohya.safetensors: rank 4, alphas 2, 3, 4 (one module without: alpha = "
                  "rank); no linear1 (diffusers splits it with FLUX.1-dev's widths only)",
                  "CLIP-L: an MLP module only; diffusers 0.42 with transformers 5 drops the "
                  "kohya text encoder's attention modules (to_q_lora keys left unexpected)"])


def case_xlabs():
    name = "lora-flux-xlabs"
    out_dir = os.path.join(refcase.CASES, name)
    os.makedirs(out_dir, exist_ok=True)
    f = xlabs_adapter(out_dir)
    write(name, "FluxPipeline with an XLabs LoRA (double_blocks.N.processor.qkv_lora1/2, "
          "proj_lora1/2; single_blocks.N.processor.qkv_lora, proj_lora), weight 1.2", [f],
          ["x"], [1.2], ["xlabs.safetensors: rank 3, no alphas (scale = weight)"])


def random_pairs(shapes, seed, names, rank=4, alphas=None):
    """A state dict of random down/up pairs (names: the two key suffixes) for module ->
    (out, in) `shapes`, with alphas[j] (None: no alpha) for module j when given."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for j, (m, (o, k)) in enumerate(shapes.items()):
        sd[m + names[0]] = torch.randn(rank, k, generator=g) * 0.4 / k ** 0.5
        sd[m + names[1]] = torch.randn(o, rank, generator=g) * 0.4 / rank ** 0.5
        if alphas is not None and alphas[j % len(alphas)] is not None:
            sd[m + ".alpha"] = torch.tensor(float(alphas[j % len(alphas)]))
    return sd


KOHYA = (".lora_down.weight", ".lora_up.weight")


def te2_adapters(out_dir):
    """A kohya file on the transformer, CLIP-L (lora_te1_) and T5 (lora_te2_), and one in
    ComfyUI's names (diffusion_model.*, text_encoders.clip_l.transformer.*,
    text_encoders.t5xxl.transformer.*). diffusers' kohya converter drops the T5 modules."""
    t5 = dict(FluxPipeline.from_pretrained(PIPE_DIR).text_encoder_2.named_modules())

    def t5_shape(name):
        w = t5[name].weight
        return (w.shape[0], w.shape[1])
    shapes = {"lora_unet_double_blocks_0_img_attn_proj": (D, D),
              "lora_unet_single_blocks_1_linear2": (D, D + MLP),
              "lora_unet_double_blocks_1_img_mod_lin": (6 * D, D),
              "lora_te1_text_model_encoder_layers_0_mlp_fc2": (32, 64),
              "lora_te2_encoder_block_0_layer_0_SelfAttention_q":
                  t5_shape("encoder.block.0.layer.0.SelfAttention.q"),
              "lora_te2_encoder_block_1_layer_1_DenseReluDense_wi_0":
                  t5_shape("encoder.block.1.layer.1.DenseReluDense.wi_0")}
    save_file(random_pairs(shapes, 451, KOHYA, alphas=[2.0, 3.0, None]),
              os.path.join(out_dir, "kohya_te2.safetensors"))
    shapes = {"diffusion_model.double_blocks.1.txt_mlp.0": (MLP, D),
              "diffusion_model.single_blocks.0.modulation.lin": (3 * D, D),
              "text_encoders.clip_l.transformer.text_model.encoder.layers.1.mlp.fc1": (64, 32),
              "text_encoders.t5xxl.transformer.encoder.block.0.layer.1.DenseReluDense.wo":
                  t5_shape("encoder.block.0.layer.1.DenseReluDense.wo")}
    save_file(random_pairs(shapes, 452, KOHYA, alphas=[8.0]),
              os.path.join(out_dir, "comfy.safetensors"))
    return ["kohya_te2.safetensors", "comfy.safetensors"]


def case_kohya_te2():
    name = "lora-flux-kohya-te2"
    out_dir = os.path.join(refcase.CASES, name)
    os.makedirs(out_dir, exist_ok=True)
    files = te2_adapters(out_dir)
    write(name, "FluxPipeline with a kohya LoRA with lora_unet_, lora_te1_ and lora_te2_ (T5) "
          "modules, weight 1.0, and one in ComfyUI's names (diffusion_model.*, text_encoders."
          "clip_l / t5xxl.transformer.*), weight 0.7", files, ["k", "c"], [1.0, 0.7],
          ["kohya_te2.safetensors: rank 4, alphas 2, 3 and none; two lora_te2_ modules",
           "comfy.safetensors: rank 4, alpha 8; one text_encoders.t5xxl module",
           "diffusers 0.42's FLUX.1 kohya converter keeps lora_unet_ / lora_te_ / lora_te1_ "
           "keys only: the T5 modules are dropped and do not change the image"])


def klein_shapes(prefix_of, names):
    """(out, in) of the tiny FLUX.2 [klein] transformer's module for each file module, from
    prefix_of: file module -> diffusers module."""
    pipe_dir = os.path.join(refcase.ROOT, "tests", "golden", KLEIN["golden"], "pipeline")
    mods = dict(Flux2KleinPipeline.from_pretrained(pipe_dir).transformer.named_modules())
    shapes = {}
    for m in names:
        target = prefix_of[m]
        if isinstance(target, tuple):  # a fused qkv: three modules' rows
            w = mods[target[0]].weight
            shapes[m] = (3 * w.shape[0], w.shape[1])
        else:
            w = mods[target].weight
            shapes[m] = (w.shape[0], w.shape[1])
    return shapes


def qkv(block, kind):
    a = "transformer_blocks.%d.attn." % block
    return tuple(a + p for p in (("to_q", "to_k", "to_v") if kind == "img"
                                 else ("add_q_proj", "add_k_proj", "add_v_proj")))


def bfl2_adapter(out_dir):
    """BFL / ai-toolkit names under diffusion_model., lora_A / lora_B, no alphas (diffusers'
    FLUX.2 converter refuses them); two modules in expanded diffusers block names and one in
    the "sformer_blocks." alias."""
    m = {"double_blocks.0.img_attn.qkv": qkv(0, "img"),
         "double_blocks.0.txt_attn.qkv": qkv(0, "txt"),
         "double_blocks.0.img_attn.proj": "transformer_blocks.0.attn.to_out.0",
         "double_blocks.0.img_mlp.0": "transformer_blocks.0.ff.linear_in",
         "double_blocks.0.txt_mlp.2": "transformer_blocks.0.ff_context.linear_out",
         "sformer_blocks.0.attn.to_add_out": "transformer_blocks.0.attn.to_add_out",
         "transformer_blocks.0.ff.linear_out": "transformer_blocks.0.ff.linear_out",
         "single_blocks.0.linear1": "single_transformer_blocks.0.attn.to_qkv_mlp_proj",
         "single_blocks.0.linear2": "single_transformer_blocks.0.attn.to_out",
         "single_transformer_blocks.1.attn.to_qkv_mlp_proj":
             "single_transformer_blocks.1.attn.to_qkv_mlp_proj",
         "img_in": "x_embedder", "txt_in": "context_embedder",
         "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
         "final_layer.linear": "proj_out",
         "final_layer.adaLN_modulation.1": "norm_out.linear",
         "single_stream_modulation.lin": "single_stream_modulation.linear",
         "double_stream_modulation_img.lin": "double_stream_modulation_img.linear"}
    shapes = klein_shapes(m, list(m))
    shapes = {"diffusion_model." + k: v for k, v in shapes.items()}
    save_file(random_pairs(shapes, 651, (".lora_A.weight", ".lora_B.weight")),
              os.path.join(out_dir, "bfl.safetensors"))
    return "bfl.safetensors"


def kohya2_adapter(out_dir):
    """sd-scripts names on FLUX.2's BFL modules, alphas 2, 3, 8 and none; three modules the
    converter does not map (a shared modulation, final_layer's adaLN, a text encoder's)."""
    m = {"double_blocks_0_img_attn_qkv": qkv(0, "img"),
         "double_blocks_0_txt_attn_qkv": qkv(0, "txt"),
         "double_blocks_0_img_attn_proj": "transformer_blocks.0.attn.to_out.0",
         "double_blocks_0_txt_attn_proj": "transformer_blocks.0.attn.to_add_out",
         "double_blocks_0_img_mlp_0": "transformer_blocks.0.ff.linear_in",
         "double_blocks_0_img_mlp_2": "transformer_blocks.0.ff.linear_out",
         "double_blocks_0_txt_mlp_0": "transformer_blocks.0.ff_context.linear_in",
         "double_blocks_0_txt_mlp_2": "transformer_blocks.0.ff_context.linear_out",
         "single_blocks_0_linear1": "single_transformer_blocks.0.attn.to_qkv_mlp_proj",
         "single_blocks_1_linear2": "single_transformer_blocks.1.attn.to_out",
         "img_in": "x_embedder", "txt_in": "context_embedder",
         "time_in_in_layer": "time_guidance_embed.timestep_embedder.linear_1",
         "time_in_out_layer": "time_guidance_embed.timestep_embedder.linear_2",
         "final_layer_linear": "proj_out",
         "double_stream_modulation_img_lin": "double_stream_modulation_img.linear",
         "final_layer_adaLN_modulation_1": "norm_out.linear"}
    shapes = klein_shapes(m, list(m))
    shapes = {"lora_unet_" + k: v for k, v in shapes.items()}
    shapes["lora_te1_model_layers_0_mlp_up_proj"] = (64, 32)
    save_file(random_pairs(shapes, 661, KOHYA, alphas=[2.0, 3.0, None, 8.0]),
              os.path.join(out_dir, "kohya.safetensors"))
    return "kohya.safetensors"


def case_klein(name, make, weight, covers, notes):
    out_dir = os.path.join(refcase.CASES, name)
    os.makedirs(out_dir, exist_ok=True)
    f = make(out_dir)
    write(name, covers, [f], ["l"], [weight], notes, KLEIN)


SD3 = dict(cls=StableDiffusion3Pipeline, golden="t2i-sd3", seed=5,
           args=dict(prompt="an oil painting of a lighthouse at night, stars",
                     negative_prompt="blurry, low quality", height=64, width=64,
                     num_inference_steps=4, guidance_scale=5.0))
KLEIN = dict(cls=Flux2KleinPipeline, golden="t2i-flux2-klein", seed=1,
             args=dict(prompt="a red bicycle leaning on a yellow wall", height=64, width=64,
                       num_inference_steps=4, guidance_scale=1.0, max_sequence_length=512))


def peft_on(spec, out_dir, seed):
    """A peft adapter on every other linear layer of the transformer's first two blocks of
    each kind, saved by the pipeline's save_lora_weights with its metadata."""
    pipe_dir = os.path.join(refcase.ROOT, "tests", "golden", spec["golden"], "pipeline")
    pipe = spec["cls"].from_pretrained(pipe_dir, torch_dtype=torch.float32)
    tr = pipe.transformer
    linears = [n for n, m in tr.named_modules() if isinstance(m, torch.nn.Linear) and
               ("blocks.0." in n or "blocks.1." in n)]
    targets = linears[::2]
    cfg = LoraConfig(r=4, lora_alpha=6, init_lora_weights=False, target_modules=targets)
    tr.add_adapter(cfg, adapter_name="p")
    randomize([(n, p) for n, p in tr.named_parameters() if "lora" in n], seed)
    spec["cls"].save_lora_weights(
        out_dir, weight_name="peft.safetensors",
        transformer_lora_layers=get_peft_model_state_dict(tr, adapter_name="p"),
        transformer_lora_adapter_metadata=cfg.to_dict())
    return "peft.safetensors", len(targets)


def case_on(name, spec, seed):
    out_dir = os.path.join(refcase.CASES, name)
    os.makedirs(out_dir, exist_ok=True)
    f, n = peft_on(spec, out_dir, seed)
    write(name, f"{spec['cls'].__name__} with a peft-layout LoRA on {n} linear layers of the "
          "transformer's first blocks (metadata r 4, alpha 6), weight 0.9", [f], ["p"], [0.9],
          ["peft.safetensors: save_lora_weights with transformer_lora_adapter_metadata"],
          spec)


CASES = {"lora-flux-peft": case_peft, "lora-flux-kohya-outside": case_kohya_outside,
         "lora-sd3-peft": lambda: case_on("lora-sd3-peft", SD3, 501),
         "lora-flux2-klein-peft": lambda: case_on("lora-flux2-klein-peft", KLEIN, 601), "lora-flux-kohya": case_kohya,
         "lora-flux-xlabs": case_xlabs, "lora-flux-kohya-te2": case_kohya_te2,
         "lora-flux2-klein-bfl": lambda: case_klein(
             "lora-flux2-klein-bfl", bfl2_adapter, 0.9,
             "Flux2KleinPipeline with a BFL / ai-toolkit LoRA (diffusion_model.double_blocks.0"
             ".img_attn.qkv.lora_A.weight ...; single blocks' linear1 onto the fused "
             "to_qkv_mlp_proj; shared modulations; final_layer), weight 0.9",
             ["bfl.safetensors: rank 4, no alphas; two modules in expanded diffusers block "
              "names and one in the sformer_blocks. alias, as diffusers reads them",
              "final_layer.adaLN_modulation.1 goes to norm_out.linear without the shift / "
              "scale swap, as diffusers' FLUX.2 converter maps it"]),
         "lora-flux2-klein-kohya": lambda: case_klein(
             "lora-flux2-klein-kohya", kohya2_adapter, 0.8,
             "Flux2KleinPipeline with a kohya / sd-scripts LoRA (lora_unet_double_blocks_0_"
             "img_attn_qkv, lora_unet_single_blocks_0_linear1 ..., .alpha tensors), weight 0.8",
             ["kohya.safetensors: rank 4, alphas 2, 3, 8 and none",
              "diffusers' FLUX.2 kohya converter drops (with a warning) the modules it does not "
              "map: double_stream_modulation_img_lin, final_layer_adaLN_modulation_1 and the "
              "lora_te1_ module do not change the image"])}


def main():
    names = sys.argv[1:] or list(CASES)  # each case regenerates its adapter files too
    for n in names:
        CASES[n]()


if __name__ == "__main__":
    main()
