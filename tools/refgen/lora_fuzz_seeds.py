"""Seed inputs for tests/fuzz/fuzz_lora.c: one small adapter file per layout diffuse reads,
rank 1 in f16, on the widths of the fuzz target's model description (inner 32).

    /work/venv/bin/python tools/refgen/lora_fuzz_seeds.py
"""
import json
import os

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fuzz", "corpus", "lora")


def pairs(modules, down, up, alpha=None):
    sd = {}
    for i, (m, (o, k)) in enumerate(modules.items()):
        sd[m + down] = torch.full((1, k), 0.01 * (i + 1), dtype=torch.float16)
        sd[m + up] = torch.full((o, 1), 0.02, dtype=torch.float16)
        if alpha is not None:
            sd[m + ".alpha"] = torch.tensor(alpha, dtype=torch.float16)
    return sd


KOHYA = (".lora_down.weight", ".lora_up.weight")
PEFT = (".lora_A.weight", ".lora_B.weight")
SEEDS = {
    "peft_flux1": (pairs({"transformer.transformer_blocks.0.attn.to_q": (32, 32),
                          "text_encoder.text_model.encoder.layers.0.mlp.fc1": (64, 32)},
                         *PEFT, 2.0),
                   {"lora_adapter_metadata": json.dumps(
                       {"transformer.r": 1, "transformer.lora_alpha": 2,
                        "transformer.rank_pattern": {"to_q": 1},
                        "transformer.alpha_pattern": {"^transformer_blocks.0.attn.to_q": 3},
                        "transformer.use_rslora": True})}),
    "kohya_flux1": (pairs({"lora_unet_double_blocks_0_img_attn_qkv": (96, 32),
                           "lora_unet_single_blocks_0_linear1": (224, 32),
                           "lora_unet_final_layer_adaLN_modulation_1": (64, 32),
                           "lora_te1_text_model_encoder_layers_0_mlp_fc1": (64, 32),
                           "lora_te2_encoder_block_0_layer_0_SelfAttention_q": (48, 48),
                           "lora_unet_img_in": (32, 64)}, *KOHYA, 4.0), None),
    "comfy_flux1": (pairs({"diffusion_model.double_blocks.0.img_attn.proj": (32, 32),
                           "text_encoders.clip_l.transformer.text_model.encoder.layers.1.mlp.fc2":
                               (32, 64),
                           "text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q":
                               (48, 48)}, *KOHYA), None),
    "mixture_flux1": (pairs({"lora_transformer_single_transformer_blocks_0_attn_to_k": (32, 32),
                             "lora_transformer_context_embedder": (32, 48)}, *KOHYA, 1.0), None),
    "xlabs_flux1": (pairs({"double_blocks.0.processor.qkv_lora1": (96, 32),
                           "single_blocks.0.processor.proj_lora": (32, 160)},
                          ".down.weight", ".up.weight"), None),
    "bfl_flux2": (pairs({"diffusion_model.double_blocks.0.txt_attn.qkv": (96, 32),
                         "diffusion_model.single_blocks.0.linear1": (288, 32),
                         "diffusion_model.sformer_blocks.0.attn.to_add_out": (32, 32),
                         "diffusion_model.final_layer.adaLN_modulation.1": (64, 32),
                         "diffusion_model.single_stream_modulation.lin": (96, 32)}, *PEFT), None),
    "kohya_flux2": (pairs({"lora_unet_double_blocks_0_img_attn_qkv": (96, 32),
                           "lora_unet_single_blocks_1_linear2": (32, 128),
                           "lora_unet_time_in_in_layer": (32, 256),
                           "lora_unet_double_stream_modulation_img_lin": (192, 32)}, *KOHYA, 2.0),
                    None),
}

os.makedirs(OUT, exist_ok=True)
for name, (sd, meta) in SEEDS.items():
    save_file(sd, os.path.join(OUT, name + ".safetensors"), metadata=meta)
    print(name)
