"""Reference cases for FluxInpaintPipeline and StableDiffusion3InpaintPipeline.

From prompt strings on the tiny text-to-image folders of tests/golden (t2i-flux-schnell,
t2i-sd3), with an input picture and a mask drawn here and stored in the case folder as PNG
(the mask grey, or RGB in one case, with soft edges so that the binarisation matters; one
pair 80x72 so that both are resized to the 64x64 output), strength 0.3 / 0.8 / 1.0, one
seeded generator (the posterior's sample() first, then the latent noise), B = 1 or 2, and
one case per pipeline with given latents (FLUX: stored packed, as diffuse takes them;
diffusers gets them unpacked [B, 16, h, w]). out.* are float64 runs with the noise drawn in
float32; torch's float32 run sets the tolerances (20x its difference, floors 1e-4 / 1e-5).

padding_mask_crop cases (CROP_CASES): diffusers returns PIL images only, at the picture's
size (apply_overlay); out.image_uint8 is those, out.image the same bytes / 255, and
out.latents_final the latents after the last step, caught by callback_on_step_end.

    /work/venv/bin/python tools/refgen/inpaint.py [CASE...]
"""
import os
import sys

import numpy as np
import torch
from PIL import Image

import refcase

refcase.patch_randn_float32()
from diffusers import FluxInpaintPipeline, StableDiffusion3InpaintPipeline  # noqa: E402

FLUX = dict(cls=FluxInpaintPipeline, golden="t2i-flux-schnell",
            args=dict(prompt="A photo of a red fox in the snow, 35mm, golden hour", height=64,
                      width=64, guidance_scale=0.0, max_sequence_length=256))
SD3 = dict(cls=StableDiffusion3InpaintPipeline, golden="t2i-sd3",
           args=dict(prompt="an oil painting of a lighthouse at night, stars",
                     negative_prompt="blurry, low quality", height=64, width=64,
                     guidance_scale=5.0))

CASES = [
    # name, pipeline, strength, steps, images per prompt, seed, picture seed, picture size,
    # mask mode, given latents
    ("inpaint-flux-s03", FLUX, 0.3, 4, 1, 31, 1, (64, 64), "L", False),
    ("inpaint-flux-s08-b2", FLUX, 0.8, 5, 2, 32, 2, (80, 72), "L", False),
    ("inpaint-flux-s10", FLUX, 1.0, 4, 1, 33, 3, (64, 64), "L", False),
    ("inpaint-flux-latents", FLUX, 0.6, 4, 1, 34, 4, (64, 64), "L", True),
    ("inpaint-sd3-s03", SD3, 0.3, 4, 1, 41, 5, (64, 64), "RGB", False),
    ("inpaint-sd3-s08-b2", SD3, 0.8, 5, 2, 42, 6, (80, 72), "L", False),
    ("inpaint-sd3-s10", SD3, 1.0, 4, 1, 43, 7, (64, 64), "L", False),
    ("inpaint-sd3-latents", SD3, 0.6, 4, 1, 44, 8, (64, 64), "L", True),
]


# name, pipeline, strength, steps, images per prompt, seed, picture seed, picture size,
# output (width, height), padding_mask_crop
CROP_CASES = [
    ("inpaint-flux-crop", FLUX, 0.8, 4, 1, 35, 9, (96, 80), (64, 48), 6),
    ("inpaint-sd3-crop", SD3, 0.6, 4, 2, 45, 10, (72, 88), (64, 64), 3),
]


def mask_picture(w, h, seed, mode, small=False):
    """A soft-edged ellipse (grey ramps across 128) and a small square, white = repaint;
    small: one smaller ellipse off centre (for padding_mask_crop)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    cx, cy = w * rng.uniform(0.4, 0.6), h * rng.uniform(0.4, 0.6)
    size = (0.3, 0.25) if not small else (0.12, 0.18)
    if small:
        cx, cy = w * 0.62, h * 0.35
    d = np.sqrt(((x - cx) / (size[0] * w)) ** 2 + ((y - cy) / (size[1] * h)) ** 2)
    grey = np.clip((1.3 - d) * 400, 0, 255)
    if not small:
        grey[2:8, 2:8] = 255
    grey = np.round(grey).astype(np.uint8)
    if mode == "L":
        return Image.fromarray(grey, "L")
    rgb = np.stack([grey, np.clip(grey.astype(int) + 40, 0, 255), grey // 2], -1)
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def call(pipe, args, output_type):
    args = dict(args)
    args["generator"] = torch.Generator("cpu").manual_seed(args.pop("seed"))
    args["image"] = Image.open(args.pop("image_path")).convert("RGB")
    args["mask_image"] = Image.open(args.pop("mask_path"))
    if "latents" in args:
        args["latents"] = args["latents"].to(pipe.transformer.dtype)
    with torch.no_grad():
        out = pipe(output_type=output_type, **args)
    return out.images if output_type == "np" else out.images.float().numpy()


def load(pipes, spec, dtype):
    key = (spec["golden"], dtype)
    if key not in pipes:
        pipe_dir = os.path.join(refcase.ROOT, "tests", "golden", spec["golden"], "pipeline")
        pipes[key] = spec["cls"].from_pretrained(pipe_dir, torch_dtype=dtype)
    return pipes[key]


def crop_case(pipes, name, spec, strength, steps, per, seed, pic, size, out_size, pad):
    out_dir = os.path.join(refcase.CASES, name)
    os.makedirs(out_dir, exist_ok=True)
    w, h = size
    Image.fromarray(refcase.picture(w, h, 300 + pic), "RGB").save(
        os.path.join(out_dir, "image.png"))
    mask_picture(w, h, 400 + pic, "L", small=True).save(os.path.join(out_dir, "mask.png"))
    args = dict(spec["args"], width=out_size[0], height=out_size[1], strength=strength,
                num_inference_steps=steps, num_images_per_prompt=per, padding_mask_crop=pad)
    res = {}
    for dtype in (torch.float64, torch.float32):
        p = load(pipes, spec, dtype)
        caught = {}

        def last(pipe, i, t, kw):
            caught["latents"] = kw["latents"]
            return {}
        with torch.no_grad():
            out = p(image=Image.open(os.path.join(out_dir, "image.png")).convert("RGB"),
                    mask_image=Image.open(os.path.join(out_dir, "mask.png")),
                    generator=torch.Generator("cpu").manual_seed(seed), output_type="pil",
                    callback_on_step_end=last, callback_on_step_end_tensor_inputs=["latents"],
                    **args)
        u8 = np.stack([np.asarray(im, np.uint8) for im in out.images])
        res[dtype] = (u8, caught["latents"].double().numpy())
    u8, lat64 = res[torch.float64]
    u8_32, lat32 = res[torch.float32]
    print(name, "float32 run's bytes differ by at most",
          int(np.abs(u8.astype(int) - u8_32.astype(int)).max()))
    case_args = dict(args, image="image.png", mask_image="mask.png", output_type="np",
                     generator={"device": "cpu", "seed": seed})
    refcase.write_case(name, {
        "kind": "pipeline",
        "covers": f"{spec['cls'].__name__} with padding_mask_crop {pad}: a {w}x{h} picture and "
                  f"mask, output {out_size[0]}x{out_size[1]} pasted back at {w}x{h}, strength "
                  f"{strength}, {steps} steps, B = {per}, one generator",
        "class": spec["cls"].__name__,
        "dir": f"../../golden/{spec['golden']}/pipeline",
        "call": "pipe(image=..., mask_image=Image.open('mask.png'), padding_mask_crop=pad, "
                "output_type='pil', generator=..., **args); latents_final: the latents "
                "callback_on_step_end saw at the last step",
        "args": case_args,
        "outputs": {"latents_final": "out.latents_final", "image": "out.image",
                    "image_uint8": "out.image_uint8"},
        "tolerance": {
            "latents_final": refcase.tolerance(lat64, lat32, 1e-4, 1e-5),
            "image": {"max_abs": 0.0040, "rel_l2": 0.01},
            "image_uint8": {"max_abs": 1, "rel_l2": 1.0}},
        "exact": [],
        "notes": ["diffusers returns PIL images with padding_mask_crop (args.output_type says "
                  "np only for the latents' sake): out.image_uint8 are they, out.image = "
                  "out.image_uint8 / 255 as diffuse reports them, so its bound is one byte",
                  "out.* = every model in float64, the noise drawn in float32"],
        "provenance": refcase.provenance(),
    }, {"out.image": (u8 / 255.0).astype(np.float32), "out.latents_final": lat64,
        "out.image_uint8": u8})
    print(name, "done")


def main():
    pipes = {}
    only = set(sys.argv[1:])
    for case in CROP_CASES:
        if not only or case[0] in only:
            crop_case(pipes, *case)
    for name, spec, strength, steps, per, seed, pic, size, mode, given in CASES:
        if only and name not in only:
            continue
        pipe_dir = os.path.join(refcase.ROOT, "tests", "golden", spec["golden"], "pipeline")
        out_dir = os.path.join(refcase.CASES, name)
        os.makedirs(out_dir, exist_ok=True)
        w, h = size
        Image.fromarray(refcase.picture(w, h, 300 + pic), "RGB").save(
            os.path.join(out_dir, "image.png"))
        mask_picture(w, h, 400 + pic, mode).save(os.path.join(out_dir, "mask.png"))
        args = dict(spec["args"], strength=strength, num_inference_steps=steps,
                    num_images_per_prompt=per, seed=seed,
                    image_path=os.path.join(out_dir, "image.png"),
                    mask_path=os.path.join(out_dir, "mask.png"))
        tensors = {}
        if given:
            g = torch.Generator("cpu").manual_seed(1000 + seed)
            lat = torch.randn((per, 16, 8, 8), generator=g, dtype=torch.float32)
            args["latents"] = lat
            stored = lat
            if spec is FLUX:
                stored = FluxInpaintPipeline._pack_latents(lat, per, 16, 8, 8)
            tensors["in.latents"] = stored.numpy()
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
        tensors.update({"out.image": np.asarray(img64, np.float32),
                        "out.latents_final": np.asarray(lat64, np.float64),
                        "out.image_uint8": u8})
        case_args = {k: v for k, v in args.items()
                     if k not in ("seed", "image_path", "mask_path", "latents")}
        case_args.update(image="image.png", mask_image="mask.png", output_type="np",
                         generator={"device": "cpu", "seed": seed})
        if given:
            case_args["latents"] = "in.latents"
        refcase.write_case(name, {
            "kind": "pipeline",
            "covers": f"{spec['cls'].__name__} from prompt strings, a {w}x{h} picture and "
                      f"{mode} mask, strength {strength}, {steps} steps, B = {per}, one "
                      f"generator" + (", given latents" if given else ""),
            "class": spec["cls"].__name__,
            "dir": f"../../golden/{spec['golden']}/pipeline",
            "call": "pipe(image=Image.open('image.png').convert('RGB'), "
                    "mask_image=Image.open('mask.png'), generator=torch.Generator('cpu')"
                    ".manual_seed(seed), **args); latents_final: the same call with "
                    "output_type='latent'",
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
                      "in.latents (given-latents cases): FLUX packed [B, 16, 64] as diffuse "
                      "takes them (diffusers got them unpacked [B, 16, 8, 8]); SD3 [B, 16, 8, 8]",
                      "tolerances: 20x the float32 run's difference (not stored), floors "
                      "1e-4 / 1e-5"],
            "provenance": refcase.provenance(),
        }, tensors)
        print(name, "done")


if __name__ == "__main__":
    main()
