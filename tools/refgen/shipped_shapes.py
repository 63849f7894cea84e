"""Writes tests/shipped/<set>.shapes: every weight's name, dtype-free shape, per component,
of the full-size model each shipped config set (src/models/configs/<set>/) describes, as
diffusers' and transformers' own classes build it from those very configs (on the meta
device: no memory, no download).

test_shipped_configs writes these names and shapes as sparse safetensors files next to the
shipped configs and loads every component through diffuse's own loaders: the configs parse,
and diffuse reads them to the same sizes diffusers and transformers do.

Format, one tensor a line: "<component> <name> <d0>x<d1>x...".
"""
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "src", "models", "configs")
OUT = os.path.join(ROOT, "tests", "shipped")


def build(folder, library, cls):
    path = os.path.join(folder, "config.json")
    with torch.device("meta"):
        if library == "diffusers":
            import diffusers
            klass = getattr(diffusers, cls)
            return klass.from_config(klass.load_config(folder))
        import transformers
        config = transformers.AutoConfig.from_pretrained(folder)
        return getattr(transformers, cls)(config)


def file_name(cls, key):
    """The name a saved file gives the state_dict entry `key` (None: not saved). transformers
    5 builds CLIP text models without the "text_model." level its files keep, and T5's
    encoder.embed_tokens is tied to "shared" and saved once."""
    if cls in ("CLIPTextModel", "CLIPTextModelWithProjection") and not key.startswith(
            ("text_model.", "text_projection.")):
        return "text_model." + key
    if cls == "T5EncoderModel" and key == "encoder.embed_tokens.weight":
        return None
    return key


def main(name):
    root = os.path.join(CONFIGS, name)
    with open(os.path.join(root, "model_index.json")) as f:
        index = json.load(f)
    lines = []
    for comp, value in sorted(index.items()):
        if not isinstance(value, list) or comp.startswith("_") or comp.startswith("tokenizer"):
            continue
        if comp == "scheduler":
            continue
        model = build(os.path.join(root, comp), value[0], value[1])
        for key, t in model.state_dict().items():
            key = file_name(value[1], key)
            if key:
                lines.append(f"{comp} {key} {'x'.join(str(d) for d in t.shape)}")
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"{name}.shapes"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{name}: {len(lines)} tensors")


if __name__ == "__main__":
    for n in sys.argv[1:] or sorted(os.listdir(CONFIGS)):
        if os.path.isdir(os.path.join(CONFIGS, n)):
            main(n)
