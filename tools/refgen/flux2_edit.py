"""Reference cases for FLUX.2 reference-image editing (Flux2Pipeline(image=...)).

On the tiny Flux2Pipeline folder of tests/golden/t2i-flux2, from a prompt string, with one
64x64 reference picture drawn here (stored as image.png in the case folder; its sides are
multiples of 16 and its area under 1024x1024, so Flux2ImageProcessor neither resizes nor
crops it), or two of them (image0.png, image1.png: ids t = 10 and 20); edit-flux2-crop's
90x75 picture is cropped at the centre to 80x64 (the output's default size), and
edit-flux2-resize's 1032x1024 one is shrunk to 1027x1020 (over 1024 * 1024 pixels) and
cropped to 1024x1008, beside a 70x100 one cropped to 64x96, with an explicit 64x48 output. out.* are the float64 run (noise drawn in float32); torch's float32 run sets
the tolerances (20x its difference, floors 1e-4 / 1e-5) but is not stored.

    /work/venv/bin/python tools/refgen/flux2_edit.py [CASE ...]
"""
import os
import sys

import numpy as np
import torch
from PIL import Image

import refcase

refcase.patch_randn_float32()
from diffusers import Flux2KleinPipeline, Flux2Pipeline  # noqa: E402

DEV = dict(cls=Flux2Pipeline, golden="t2i-flux2",
           args=dict(prompt="a small wooden cabin by a frozen lake at night, aurora overhead",
                     num_inference_steps=2, guidance_scale=4.0, max_sequence_length=512))
KLEIN = dict(cls=Flux2KleinPipeline, golden="t2i-flux2-klein",
             args=dict(prompt="a red bicycle leaning on a yellow wall", num_inference_steps=4,
                       guidance_scale=1.0, max_sequence_length=512))
CASES = [
    # name, pipeline, images per prompt, seed, reference pictures (w, h, picture seed)
    ("edit-flux2", DEV, 1, 0, [(64, 64, 7)]),
    ("edit-flux2-b2", DEV, 2, 5, [(64, 64, 8)]),
    ("edit-flux2-two", DEV, 1, 9, [(64, 64, 9), (80, 64, 10)]),  # ids t = 10 and 20
    ("edit-flux2-klein", KLEIN, 1, 1, [(64, 64, 11)]),
    ("edit-flux2-crop", DEV, 1, 3, [(90, 75, 12)]),
    ("edit-flux2-resize", DEV, 1, 4, [(1032, 1024, 13), (70, 100, 14)],
     dict(height=48, width=64, num_inference_steps=1)),
]


def main():
    only = set(sys.argv[1:])  # case names to (re)make; none: all
    for name, spec, per, seed, pics, *extra in CASES:
        if only and name not in only:
            continue
        pipe_dir = os.path.join(refcase.ROOT, "tests", "golden", spec["golden"], "pipeline")
        pipes = {d: spec["cls"].from_pretrained(pipe_dir, torch_dtype=d)
                 for d in (torch.float64, torch.float32)}
        ARGS = dict(spec["args"], **(extra[0] if extra else {}))
        out_dir = os.path.join(refcase.CASES, name)
        os.makedirs(out_dir, exist_ok=True)
        names = ["image.png"] if len(pics) == 1 else [f"image{i}.png" for i in range(len(pics))]
        for fname, (w, h, pic) in zip(names, pics):
            noise = 6.0 if w * h <= 256 * 256 else 0.0  # a large one stays small as PNG
            Image.fromarray(refcase.picture(w, h, 300 + pic, noise), "RGB").save(
                os.path.join(out_dir, fname))

        def images():
            ims = [Image.open(os.path.join(out_dir, f)).convert("RGB") for f in names]
            return ims[0] if len(ims) == 1 else ims
        res = {}
        for dtype, pipe in pipes.items():
            outs = []
            for output_type in ("np", "latent"):
                with torch.no_grad():
                    o = pipe(image=images(), num_images_per_prompt=per,
                             generator=torch.Generator("cpu").manual_seed(seed),
                             output_type=output_type, **ARGS).images
                outs.append(o if output_type == "np" else o.double().numpy())
            res[dtype] = outs
        img64, lat64 = res[torch.float64]
        img32, lat32 = res[torch.float32]
        tensors = {"out.image": np.asarray(img64, np.float32),
                   "out.latents_final": np.asarray(lat64, np.float64),
                   "out.image_uint8": (np.asarray(img64, np.float64) * 255).round().astype(np.uint8)}
        args = dict(ARGS, image=names[0] if len(names) == 1 else names,
                    num_images_per_prompt=per, output_type="np",
                    generator={"device": "cpu", "seed": seed})
        refcase.write_case(name, {
            "kind": "pipeline",
            "covers": f"{spec['cls'].__name__} with {len(pics)} reference image(s) "
                      f"({', '.join(f'{w}x{h}' for w, h, _ in pics)}), B = {per}",
            "class": spec["cls"].__name__,
            "dir": f"../../golden/{spec['golden']}/pipeline",
            "call": "pipe(image=Image.open('image.png').convert('RGB'), generator=torch."
                    "Generator('cpu').manual_seed(seed), **args); latents_final: the same call "
                    "with output_type='latent'",
            "args": args,
            "outputs": {"latents_final": "out.latents_final", "image": "out.image",
                        "image_uint8": "out.image_uint8"},
            "tolerance": {
                "latents_final": refcase.tolerance(lat64, lat32, 1e-4, 1e-5),
                "image": refcase.tolerance(img64, img32, 1e-4, 1e-5),
                "image_uint8": {"max_abs": 1, "rel_l2": 1.0}},
            "exact": [],
            "notes": ["out.* = every model in float64, the noise drawn in float32; out.image "
                      "stored as float32",
                      "the reference picture: VAE mode, _patchify_latents, batch-norm "
                      "normalisation, tokens with ids (10, h, w, 0) joined after the latents on "
                      "the transformer input; the output cut to the latents' tokens"],
            "provenance": refcase.provenance(),
        }, tensors)
        print(name, "done")


if __name__ == "__main__":
    main()
