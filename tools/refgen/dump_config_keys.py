#!/usr/bin/env python3
"""
Writes tests/cases/config-keys/keys.json: every config key that the classes of the supported
pipelines take in the installed diffusers / transformers, with its default, read from the
installed source (inspect.signature of each class's __init__; for the transformers configs
also the keys their to_dict() writes, which is what config.json holds). The saved files'
bookkeeping keys (_class_name, _diffusers_version, _name_or_path) are added for diffusers.
tests/unit/test_config_keys.c checks that diffuse's key table (src/models/config_keys.c)
has a row for every one of them.

    /work/venv/bin/python tools/refgen/dump_config_keys.py
"""
import inspect
import json
import os

import diffusers
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "cases", "config-keys",
                   "keys.json")

DIFFUSERS = ["FluxTransformer2DModel", "SD3Transformer2DModel", "Flux2Transformer2DModel",
             "AutoencoderKL", "AutoencoderKLFlux2", "FlowMatchEulerDiscreteScheduler"]
TRANSFORMERS = ["CLIPTextConfig", "T5Config", "MistralConfig", "Mistral3Config", "Qwen3Config"]


def default_text(v):
    if v is inspect.Parameter.empty:
        return None
    try:
        return json.loads(json.dumps(v))
    except TypeError:
        return repr(v)


def signature_keys(cls):
    return {k: default_text(p.default) for k, p in inspect.signature(cls.__init__).parameters.items()
            if k != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def main():
    out = {"versions": {"diffusers": diffusers.__version__,
                        "transformers": transformers.__version__},
           "classes": {}}
    for name in DIFFUSERS:
        keys = signature_keys(getattr(diffusers, name))
        for k in ("_class_name", "_diffusers_version", "_name_or_path"):
            keys.setdefault(k, None)
        out["classes"][name] = dict(sorted(keys.items()))
    for name in TRANSFORMERS:
        cls = getattr(transformers, name)
        keys = signature_keys(cls)
        for k, v in cls().to_dict().items():
            keys.setdefault(k, default_text(v) if k not in ("text_config", "vision_config") else None)
        out["classes"][name] = dict(sorted(keys.items()))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1, sort_keys=False)
        f.write("\n")
    print(OUT, {k: len(v) for k, v in out["classes"].items()})


if __name__ == "__main__":
    main()
