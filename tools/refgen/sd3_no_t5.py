"""Reference case for StableDiffusion3Pipeline without T5 (text_encoder_3=None, tokenizer_3=None).

diffusers lets SD3 / SD3.5 run without the T5-XXL encoder: _get_t5_prompt_embeds then gives
zeros of (rows, max_sequence_length, joint_attention_dim), for the negative prompt too (0.42;
releases before used the CLIP tokenizer's 77 tokens), so the case asks for 64 tokens, neither
77 nor the default 256. It loads the tiny SD3 folder of tests/golden (t2i-sd3) with
from_pretrained(dir, text_encoder_3=None, tokenizer_3=None) and runs it from prompt strings
with CFG, two images per prompt and one seeded generator. case.json's "from_pretrained" says
which components were left out.

The folder diffusers writes for such a pipeline (save_pretrained) names the two components
null in its model_index.json; that file is kept in the case folder as
model_index-no-t5.json, for tests/cli/sd3_no_t5.sh, which puts it beside the golden folder's
other components and checks that the folder gives this case's result without the option.

out.* are float64 runs with the noise drawn in float32, as a float32 pipeline draws it;
torch's float32 run sets the tolerances (20x its difference, floors 1e-4 / 1e-5) but is not
stored.

    /work/venv/bin/python tools/refgen/sd3_no_t5.py
"""
import json
import os
import shutil
import tempfile

import numpy as np
import torch

import refcase

refcase.patch_randn_float32()
from diffusers import StableDiffusion3Pipeline  # noqa: E402

NAME = "t2i-sd3-no-t5"
GOLDEN = "t2i-sd3"
SEED = 31
ARGS = dict(prompt="an oil painting of a lighthouse at night, stars",
            negative_prompt="blurry, low quality", height=64, width=64, guidance_scale=5.0,
            num_inference_steps=4, num_images_per_prompt=2, max_sequence_length=64)
LEFT_OUT = dict(text_encoder_3=None, tokenizer_3=None)


def call(pipe, output_type):
    with torch.no_grad():
        out = pipe(generator=torch.Generator("cpu").manual_seed(SEED), output_type=output_type,
                   **ARGS)
    return out.images if output_type == "np" else out.images.float().numpy()


def saved_model_index(pipe):
    """model_index.json as diffusers' save_pretrained writes it for the pipeline, but the
    folder it was loaded from (_name_or_path, a path of this machine)."""
    with tempfile.TemporaryDirectory() as tmp:
        pipe.save_pretrained(tmp)
        with open(os.path.join(tmp, "model_index.json")) as f:
            index = json.load(f)
    assert index["text_encoder_3"] == [None, None] and index["tokenizer_3"] == [None, None], index
    index.pop("_name_or_path", None)
    return json.dumps(index, indent=2, sort_keys=True) + "\n"


def main():
    pipe_dir = os.path.join(refcase.ROOT, "tests", "golden", GOLDEN, "pipeline")
    out_dir = os.path.join(refcase.CASES, NAME)
    shutil.rmtree(out_dir, ignore_errors=True)
    res = {}
    for dtype in (torch.float64, torch.float32):
        pipe = StableDiffusion3Pipeline.from_pretrained(pipe_dir, torch_dtype=dtype, **LEFT_OUT)
        assert pipe.text_encoder_3 is None and pipe.tokenizer_3 is None
        res[dtype] = (call(pipe, "np"), call(pipe, "latent"))
        if dtype == torch.float32:
            index = saved_model_index(pipe)
    img64, lat64 = res[torch.float64]
    img32, lat32 = res[torch.float32]
    u8 = (np.asarray(img64, np.float64) * 255).round().astype(np.uint8)
    tensors = {"out.image": np.asarray(img64, np.float32),  # float32 storage: 6e-8 error
               "out.latents_final": np.asarray(lat64, np.float64),
               "out.image_uint8": u8}
    args = dict(ARGS, output_type="np", generator={"device": "cpu", "seed": SEED})
    refcase.write_case(NAME, {
        "kind": "pipeline",
        "covers": "StableDiffusion3Pipeline without T5 (text_encoder_3=None, tokenizer_3=None) "
                  "from prompt strings, CFG, 4 steps, B = 2, one generator",
        "class": "StableDiffusion3Pipeline",
        "dir": f"../../golden/{GOLDEN}/pipeline",
        "from_pretrained": LEFT_OUT,
        "call": "pipe = StableDiffusion3Pipeline.from_pretrained(dir, text_encoder_3=None, "
                "tokenizer_3=None, torch_dtype=...); pipe(generator=torch.Generator('cpu')"
                ".manual_seed(seed), **args); latents_final: the same call with "
                "output_type='latent'",
        "args": args,
        "outputs": {"latents_final": "out.latents_final", "image": "out.image",
                    "image_uint8": "out.image_uint8"},
        "tolerance": {
            "latents_final": refcase.tolerance(lat64, lat32, 1e-4, 1e-5),
            "image": refcase.tolerance(img64, img32, 1e-4, 1e-5),
            "image_uint8": {"max_abs": 1, "rel_l2": 1.0}},
        "exact": [],
        "notes": ["out.* = every model in float64; the noise drawn in float32 and upcast; "
                  "out.image stored as float32",
                  "from_pretrained: the components diffusers was given as None; the T5 part of "
                  "the prompt embeddings (and the negative prompt's) is then zeros of "
                  "(rows, max_sequence_length, joint_attention_dim)",
                  "model_index-no-t5.json: the model_index.json diffusers' save_pretrained "
                  "writes for this pipeline (text_encoder_3 and tokenizer_3 [null, null])",
                  "tolerances: 20x the float32 run's difference (not stored), floors "
                  "1e-4 / 1e-5"],
        "provenance": refcase.provenance(),
    }, tensors)
    with open(os.path.join(out_dir, "model_index-no-t5.json"), "w") as f:
        f.write(index)
    print(NAME, "done")


if __name__ == "__main__":
    main()
