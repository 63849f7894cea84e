"""Draws a caption with diffusers' FluxPipeline from a pipeline folder and compares it with
the PNG `diffuse generate` wrote for the same arguments.

    python parity.py MODEL_DIR "a red circle on a blue background" diffuse.png [--seed 42]

Prints the largest and mean absolute pixel difference (0-255) and writes diffusers.png
beside diffuse.png.
"""
import argparse
import os

import numpy as np
import torch
from diffusers import FluxPipeline
from PIL import Image


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("prompt")
    ap.add_argument("png", help="diffuse's image")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-sequence-length", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(2)
    pipe = FluxPipeline.from_pretrained(args.model, torch_dtype=torch.float32)
    img = pipe(args.prompt, height=args.size, width=args.size,
               num_inference_steps=args.steps, guidance_scale=0.0,
               max_sequence_length=args.max_sequence_length,
               generator=torch.Generator().manual_seed(args.seed), output_type="np").images[0]
    ours = np.round(img * 255).astype(np.uint8)
    out = os.path.join(os.path.dirname(os.path.abspath(args.png)), "diffusers.png")
    Image.fromarray(ours).save(out)
    theirs = np.asarray(Image.open(args.png).convert("RGB"))
    d = np.abs(ours.astype(int) - theirs.astype(int))
    print(f"{out}: max |diffusers - diffuse| {d.max()}, mean {d.mean():.4f} (0-255)")


if __name__ == "__main__":
    main()
