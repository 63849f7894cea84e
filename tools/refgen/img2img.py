"""Reference cases for FluxImg2ImgPipeline and StableDiffusion3Img2ImgPipeline.

From prompt strings on the tiny text-to-image folders of tests/golden (t2i-flux-schnell,
t2i-sd3), with a 64x64 input picture drawn here and stored in the case folder as PNG,
strength 0.3 / 0.8 / 1.0, one seeded generator (which draws the posterior's noise first,
then the latent noise), B = 1 or 2 (num_images_per_prompt). out.* are float64 runs with
the noise drawn in float32, as a float32 pipeline draws it; torch's float32 run sets the
tolerances (20x its difference, floors 1e-4 / 1e-5) but is not stored.

    /work/venv/bin/python tools/refgen/img2img.py
"""
import os

import numpy as np
import torch
from PIL import Image

import refcase

refcase.patch_randn_float32()
from diffusers import FluxImg2ImgPipeline, StableDiffusion3Img2ImgPipeline  # noqa: E402

FLUX = dict(cls=FluxImg2ImgPipeline, golden="t2i-flux-schnell",
            args=dict(prompt="A photo of a red fox in the snow, 35mm, golden hour", height=64,
                      width=64, guidance_scale=0.0, max_sequence_length=256))
SD3 = dict(cls=StableDiffusion3Img2ImgPipeline, golden="t2i-sd3",
           args=dict(prompt="an oil painting of a lighthouse at night, stars",
                     negative_prompt="blurry, low quality", height=64, width=64,
                     guidance_scale=5.0))

CASES = [
    # name, pipeline, strength, steps, images per prompt, seed, picture seed
    ("img2img-flux-s03", FLUX, 0.3, 4, 1, 11, 1),
    ("img2img-flux-s08-b2", FLUX, 0.8, 5, 2, 12, 2),
    ("img2img-flux-s10", FLUX, 1.0, 4, 1, 13, 3),
    ("img2img-sd3-s03", SD3, 0.3, 4, 1, 21, 4),
    ("img2img-sd3-s08-b2", SD3, 0.8, 5, 2, 22, 5),
    ("img2img-sd3-s10", SD3, 1.0, 4, 1, 23, 6),
]


def call(pipe, args, output_type):
    args = dict(args)
    args["generator"] = torch.Generator("cpu").manual_seed(args.pop("seed"))
    args["image"] = Image.open(args.pop("image_path")).convert("RGB")
    with torch.no_grad():
        out = pipe(output_type=output_type, **args)
    return out.images if output_type == "np" else out.images.float().numpy()


def main():
    pipes = {}
    for name, spec, strength, steps, per, seed, pic in CASES:
        pipe_dir = os.path.join(refcase.ROOT, "tests", "golden", spec["golden"], "pipeline")
        out_dir = os.path.join(refcase.CASES, name)
        os.makedirs(out_dir, exist_ok=True)
        Image.fromarray(refcase.picture(64, 64, 200 + pic), "RGB").save(
            os.path.join(out_dir, "image.png"))
        args = dict(spec["args"], strength=strength, num_inference_steps=steps,
                    num_images_per_prompt=per, seed=seed,
                    image_path=os.path.join(out_dir, "image.png"))
        res = {}
        for dtype in (torch.float64, torch.float32):
            key = (spec["golden"], dtype)
            if key not in pipes:
                pipes[key] = spec["cls"].from_pretrained(pipe_dir, torch_dtype=dtype)
            p = pipes[key]
            res[dtype] = (call(p, args, "np"), call(p, args, "latent"))
        img64, lat64 = res[torch.float64]
        img32, lat32 = res[torch.float32]
        u8 = (np.asarray(img64, np.float64) * 255).round().astype(np.uint8)
        tensors = {"out.image": np.asarray(img64, np.float32),  # float32 storage: 6e-8 error
                   "out.latents_final": np.asarray(lat64, np.float64),
                   "out.image_uint8": u8}
        case_args = {k: v for k, v in args.items() if k not in ("seed", "image_path")}
        case_args.update(image="image.png", output_type="np",
                         generator={"device": "cpu", "seed": seed})
        refcase.write_case(name, {
            "kind": "pipeline",
            "covers": f"{spec['cls'].__name__} from prompt strings, a 64x64 input picture, "
                      f"strength {strength}, {steps} steps, B = {per}, one generator",
            "class": spec["cls"].__name__,
            "dir": f"../../golden/{spec['golden']}/pipeline",
            "call": "pipe(image=Image.open('image.png').convert('RGB'), generator=torch."
                    "Generator('cpu').manual_seed(seed), **args); latents_final: the same call "
                    "with output_type='latent'",
            "args": case_args,
            "outputs": {"latents_final": "out.latents_final", "image": "out.image",
                        "image_uint8": "out.image_uint8"},
            "tolerance": {
                "latents_final": refcase.tolerance(lat64, lat32, 1e-4, 1e-5),
                "image": refcase.tolerance(img64, img32, 1e-4, 1e-5),
                "image_uint8": {"max_abs": 1, "rel_l2": 1.0}},
            "exact": [],
            "notes": ["out.* = every model in float64; the noise (the posterior's sample() "
                      "first, then the latent noise, from one generator) drawn in float32 and "
                      "upcast; out.image stored as float32",
                      "the folder's model_index.json says the text-to-image class: diffuse "
                      "runs image to image when given an image",
                      "tolerances: 20x the float32 run's difference (not stored), floors "
                      "1e-4 / 1e-5"],
            "provenance": refcase.provenance(),
        }, tensors)
        print(name, "done")


if __name__ == "__main__":
    main()
