"""Reference cases for FluxKontextPipeline (FLUX.1 Kontext, image editing).

Writes a tiny Kontext pipeline folder, tests/cases/kontext-pipeline (model_index.json
naming FluxKontextPipeline; FLUX.1-dev-like components made here with seeded weights: a
transformer with guidance embedding, 1 double + 1 single block, joint_attention_dim 48 and
pooled_projection_dim 32 as the golden t2i-flux-schnell text encoders give them; a small
AutoencoderKL; both stored in bfloat16, which both sides upcast exactly; FLUX.1-dev's
scheduler config; no text encoders: the cases start from prompt embeddings), and the cases
that run on it:

  kontext-gen      a generator, a 40x56 picture (32x48 once rounded down to 16) that
                   _auto_resize takes to 832x1248 (PREFERRED_KONTEXT_RESOLUTIONS: 4056
                   picture tokens, so one step only), the output 64x64 (max_area 64*64)
  kontext-latents  given latents, _auto_resize=False, a 48x40 picture (rounded down to 48x32)
  kontext-b2       B = 2 (num_images_per_prompt 2, a list of two generators), max_area
                   70*70 with a 96x64 request: the aspect ratio rounding gives 80x48
  kontext-noimage  no picture: the max_area sizing alone, one generator
  kontext-truecfg  true CFG: true_cfg_scale 2.5 with negative prompt embeddings (a second
                   forward per step, noise_pred = neg + scale * (pos - neg)), a 48x40
                   picture, a generator

Case names as arguments write only those cases, on the pipeline folder already there.

out.* are float64 runs with the noise drawn in float32, as a float32 pipeline draws it;
torch's float32 run sets the tolerances (20x its difference, floors 1e-4 / 1e-5).

    /work/venv/bin/python tools/refgen/kontext.py [CASE ...]
"""
import os
import sys

import numpy as np
import torch
from PIL import Image

import refcase

refcase.patch_randn_float32()
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler,  # noqa: E402
                       FluxKontextPipeline, FluxTransformer2DModel)

PIPE = os.path.join(refcase.CASES, "kontext-pipeline")
L = 8  # text tokens of the prompt embeddings

CASES = [
    # name, picture (w, h) or None, args beyond the embeddings, generator(s), batch of embeds
    ("kontext-gen", (40, 56), dict(height=64, width=64, max_area=64 * 64,
                                   num_inference_steps=1, guidance_scale=2.5), 5, 1),
    ("kontext-latents", (48, 40), dict(height=64, width=64, max_area=64 * 64,
                                       num_inference_steps=3, guidance_scale=3.5,
                                       _auto_resize=False), None, 1),
    ("kontext-b2", (64, 48), dict(height=64, width=96, max_area=70 * 70,
                                  num_inference_steps=2, guidance_scale=4.0,
                                  num_images_per_prompt=2, _auto_resize=False), [7, 8], 1),
    ("kontext-noimage", None, dict(height=48, width=64, max_area=48 * 64,
                                   num_inference_steps=2, guidance_scale=3.5), 9, 1),
    ("kontext-truecfg", (48, 40), dict(height=64, width=64, max_area=64 * 64,
                                       num_inference_steps=2, guidance_scale=3.5,
                                       true_cfg_scale=2.5, _auto_resize=False), 11, 1),
]


def make_pipeline():
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=48, pooled_projection_dim=32,
        guidance_embeds=True, axes_dims_rope=(4, 6, 6))
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(4, 8, 8, 8),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1, norm_num_groups=4, sample_size=64, scaling_factor=0.3611,
        shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
        mid_block_add_attention=False)  # no 16k-token attention at 1 Mpixel: tests stay short
    with torch.no_grad():  # the default init leaves the latents tiny; make them speak up
        for p in vae.parameters():
            p.mul_(1.5)
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
        shift=3.0, use_dynamic_shifting=True)
    pipe = FluxKontextPipeline(scheduler=scheduler, vae=vae, text_encoder=None, tokenizer=None,
                               text_encoder_2=None, tokenizer_2=None, transformer=transformer)
    transformer.to(torch.bfloat16)  # bf16 on disk keeps the folder small; both sides upcast
    vae.to(torch.bfloat16)
    pipe.save_pretrained(PIPE)
    return PIPE


def call(pipe, args, image, gen, embeds, pooled, latents, output_type, negative=None):
    kw = dict(args)
    if negative is not None:
        kw["negative_prompt_embeds"] = torch.from_numpy(negative[0]).to(pipe.transformer.dtype)
        kw["negative_pooled_prompt_embeds"] = torch.from_numpy(negative[1]).to(
            pipe.transformer.dtype)
    if gen is not None:
        kw["generator"] = ([torch.Generator("cpu").manual_seed(s) for s in gen]
                           if isinstance(gen, list) else torch.Generator("cpu").manual_seed(gen))
    if latents is not None:
        kw["latents"] = torch.from_numpy(latents).to(pipe.transformer.dtype)
    with torch.no_grad():
        out = pipe(image=image, prompt_embeds=torch.from_numpy(embeds).to(pipe.transformer.dtype),
                   pooled_prompt_embeds=torch.from_numpy(pooled).to(pipe.transformer.dtype),
                   output_type=output_type, **kw)
    return out.images if output_type == "np" else out.images.float().numpy()


def main():
    only = sys.argv[1:]
    if not only:
        make_pipeline()
    none = dict(text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)
    pipes = {dt: FluxKontextPipeline.from_pretrained(PIPE, torch_dtype=dt, **none)
             for dt in (torch.float64, torch.float32)}
    for i, (name, pic, args, gen, nb) in enumerate(CASES):
        if only and name not in only:
            continue
        out_dir = os.path.join(refcase.CASES, name)
        os.makedirs(out_dir, exist_ok=True)
        image = None
        if pic:
            Image.fromarray(refcase.picture(pic[0], pic[1], 300 + i), "RGB").save(
                os.path.join(out_dir, "image.png"))
            image = Image.open(os.path.join(out_dir, "image.png")).convert("RGB")
        rng = np.random.default_rng(40 + i)
        embeds = rng.standard_normal((nb, L, 48)).astype(np.float32)
        pooled = rng.standard_normal((nb, 32)).astype(np.float32)
        latents = None
        tensors = {"in.prompt_embeds": embeds, "in.pooled_prompt_embeds": pooled}
        negative = None
        if args.get("true_cfg_scale", 1.0) > 1:
            negative = (rng.standard_normal((nb, L, 48)).astype(np.float32),
                        rng.standard_normal((nb, 32)).astype(np.float32))
            tensors["in.negative_prompt_embeds"] = negative[0]
            tensors["in.negative_pooled_prompt_embeds"] = negative[1]
        if gen is None:  # the packed latents of the output size (64x64: 16 tokens)
            latents = rng.standard_normal((nb, 16, 64)).astype(np.float32)
            tensors["in.latents"] = latents
        res = {}
        for dt, p in pipes.items():
            res[dt] = (call(p, args, image, gen, embeds, pooled, latents, "np", negative),
                       call(p, args, image, gen, embeds, pooled, latents, "latent", negative))
        img64, lat64 = res[torch.float64]
        img32, lat32 = res[torch.float32]
        tensors.update({"out.image": np.asarray(img64, np.float32),
                        "out.latents_final": np.asarray(lat64, np.float64),
                        "out.image_uint8": (np.asarray(img64, np.float64) * 255).round()
                        .astype(np.uint8)})
        case_args = dict(args, prompt_embeds="in.prompt_embeds",
                         pooled_prompt_embeds="in.pooled_prompt_embeds", output_type="np")
        if pic:
            case_args["image"] = "image.png"
        if negative is not None:
            case_args["negative_prompt_embeds"] = "in.negative_prompt_embeds"
            case_args["negative_pooled_prompt_embeds"] = "in.negative_pooled_prompt_embeds"
        if latents is not None:
            case_args["latents"] = "in.latents"
        if gen is not None:
            case_args["generator"] = ([{"device": "cpu", "seed": s} for s in gen]
                                      if isinstance(gen, list) else {"device": "cpu", "seed": gen})
        B = img64.shape[0]
        refcase.write_case(name, {
            "kind": "pipeline",
            "covers": f"FluxKontextPipeline from prompt embeddings, "
                      + (f"a {pic[0]}x{pic[1]} picture" if pic else "no picture")
                      + f", output {img64.shape[2]}x{img64.shape[1]}, B = {B}, "
                      + ("given latents" if gen is None else "generator")
                      + (f", true_cfg_scale {args['true_cfg_scale']} with negative embeddings"
                         if negative is not None else ""),
            "class": "FluxKontextPipeline",
            "dir": os.path.relpath(PIPE, os.path.join(refcase.CASES, name)),
            "call": "pipe(image=Image.open('image.png').convert('RGB'), generator=..., **args); "
                    "latents_final: the same call with output_type='latent'",
            "args": case_args,
            "outputs": {"latents_final": "out.latents_final", "image": "out.image",
                        "image_uint8": "out.image_uint8"},
            "tolerance": {
                "latents_final": refcase.tolerance(lat64, lat32, 1e-4, 1e-5),
                "image": refcase.tolerance(img64, img32, 1e-4, 1e-5),
                "image_uint8": {"max_abs": 1, "rel_l2": 1.0}},
            "exact": [],
            "notes": ["out.* = every model in float64, the noise drawn in float32 and upcast; "
                      "out.image stored as float32",
                      "the picture is encoded with the posterior's mode (no random numbers)",
                      "tolerances: 20x the float32 run's difference (not stored), floors "
                      "1e-4 / 1e-5"],
            "provenance": refcase.provenance(),
        }, tensors)
        print(name, "done", img64.shape)


if __name__ == "__main__":
    main()
