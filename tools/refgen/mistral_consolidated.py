"""Reference case for FLUX.2's Mistral text encoder in Mistral's own names
(consolidated.safetensors, as mistralai publishes Mistral Small 3.x): tok_embeddings,
layers.N.attention.wq/wk/wv/wo, feed_forward.w1/w2/w3, attention_norm, ffn_norm, norm, and
the vision encoder beside (vision_encoder.transformer.layers.N.attention.wq..., which ends
in the same names as the language model's).

transformers' convert_mistral_weights_to_hf.py maps those names to MistralForCausalLM's and
permutes wq / wk for its rotary layout (permute_for_rope: per head, view (head_dim / 2, 2)
and transpose, so the file's interleaved pairs become halves). This script writes the golden
t2i-flux2 Mistral3's language model the other way (each head's rows (t, i) -> (i, t)) in bf16,
adds a stand-in vision tensor and an output.weight, then reads the file back with the
conversion's rule (written out here: the names and the permutation), and the reference is
the language model with those values in float64 (tools/refgen/flux2_component_files.py's
lm_case). The script checks that the round trip gives back the folder's values rounded to
bf16, so the permutation and its inverse agree.

    /work/venv/bin/python tools/refgen/mistral_consolidated.py
"""
import json
import os

import torch
from safetensors.torch import load_file, save_file

import refcase
from flux2_component_files import GOLDEN, lm_case
from transformers import Mistral3ForConditionalGeneration

NAME = "te-single-mistral-consolidated"
FILE = "consolidated-tiny-bf16.safetensors"
TE_DIR = os.path.join(GOLDEN, "t2i-flux2", "pipeline", "text_encoder")

# transformers' names (after the class prefix) -> Mistral's, as the conversion maps them.
NAMES = [("embed_tokens.weight", "tok_embeddings.weight"), ("norm.weight", "norm.weight")]
LAYER = [("input_layernorm.weight", "attention_norm.weight"),
         ("post_attention_layernorm.weight", "ffn_norm.weight"),
         ("self_attn.q_proj.weight", "attention.wq.weight"),
         ("self_attn.k_proj.weight", "attention.wk.weight"),
         ("self_attn.v_proj.weight", "attention.wv.weight"),
         ("self_attn.o_proj.weight", "attention.wo.weight"),
         ("mlp.gate_proj.weight", "feed_forward.w1.weight"),
         ("mlp.down_proj.weight", "feed_forward.w2.weight"),
         ("mlp.up_proj.weight", "feed_forward.w3.weight")]


def rope_to_hf(w, head_dim):
    """The conversion's permute_for_rope: rows (i, t) of each head become (t, i)."""
    rows, cols = w.shape
    return w.view(rows // head_dim, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def rope_to_mistral(w, head_dim):
    rows, cols = w.shape
    return w.view(rows // head_dim, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


def main():
    with open(os.path.join(TE_DIR, "config.json")) as f:
        tc = json.load(f)["text_config"]
    head_dim = tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"]
    n_layers = tc["num_hidden_layers"]
    full = load_file(os.path.join(TE_DIR, "model.safetensors"))
    lm_prefix = next(p for p in ("model.language_model.", "language_model.model.")
                     if p + "embed_tokens.weight" in full)
    hf = {k[len(lm_prefix):]: v for k, v in full.items() if k.startswith(lm_prefix)}

    pairs = NAMES + [(f"layers.{i}.{a}", f"layers.{i}.{b}") for i in range(n_layers)
                     for a, b in LAYER]
    file_sd = {}
    for a, b in pairs:
        w = hf[a]
        if b.endswith((".wq.weight", ".wk.weight")):
            w = rope_to_mistral(w, head_dim)
        file_sd[b] = w.to(torch.bfloat16).contiguous()
    torch.manual_seed(3)
    file_sd["vision_encoder.transformer.layers.0.attention.wq.weight"] = \
        torch.randn(16, 16).to(torch.bfloat16)
    file_sd["output.weight"] = torch.randn(8, tc["hidden_size"]).to(torch.bfloat16)
    out = os.path.join(refcase.CASES, NAME)
    os.makedirs(out, exist_ok=True)
    save_file(file_sd, os.path.join(out, FILE))
    os.chmod(os.path.join(out, FILE), 0o644)

    # The file read back with the conversion's rule, under Mistral3's language-model names.
    st = load_file(os.path.join(out, FILE))
    lm_sd = {}
    for a, b in pairs:
        w = st[b].float()
        if b.endswith((".wq.weight", ".wk.weight")):
            w = rope_to_hf(w, head_dim)
        assert torch.equal(w, hf[a].to(torch.bfloat16).float()), a
        lm_sd[a] = w

    def lm_of(dt):
        return Mistral3ForConditionalGeneration.from_pretrained(TE_DIR, torch_dtype=dt) \
            .model.language_model

    g = torch.Generator().manual_seed(6)
    ids = torch.randint(12, 4256, (2, 16), generator=g)
    ids[:, 0] = 1
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    ids[1, :5] = 11
    lm_case(NAME, "Mistral3ForConditionalGeneration", "../../golden/t2i-flux2/pipeline/"
            "text_encoder", FILE, lm_sd, lm_of, ids, mask, [10, 20, 30],
            "Mistral (Mistral3's language model) from Mistral's consolidated.safetensors names "
            "(tok_embeddings, layers.N.attention.wq/wk/wv/wo with wq / wk in Mistral's rotary "
            "row order, feed_forward.w1/w2/w3, attention_norm, ffn_norm, norm), a vision "
            "encoder tensor and output.weight beside, bf16",
            ["dir gives the config only; the weights are the golden t2i-flux2 encoder's in bf16",
             "the reference reads wq / wk back with transformers' permute_for_rope",
             "input_ids are synthetic (bos 1, pad 11, left padding on row 1)"])
    os.chmod(os.path.join(out, "case.safetensors"), 0o644)
    print(NAME, "done")


if __name__ == "__main__":
    main()
