#!/usr/bin/env python3
"""The PyTorch side of `diffuse-bench peer`: one FLUX.1 double + single block pair.

Builds diffusers' own FluxTransformerBlock and FluxSingleTransformerBlock at FLUX.1 width
(dim 3072 = 24 heads of 128, MLP ratio 4) with seeded random weights, and times one double
block followed by one single block on 1024 image + 512 text tokens (a 512x512 image), with
the inputs FluxTransformer2DModel gives its blocks: image and text hidden states [1, S, D],
temb [1, D], and the RoPE (cos, sin) that FluxPosEmbed makes from the text ids (zeros) and
the image ids (row, column of a square grid), text first.

Each configuration (f32 / bf16, eager / torch.compile) runs under torch.inference_mode on
--threads threads: warm-up calls (which compile, for torch.compile), then --repeats timed
calls. One JSON object per line on stdout, one per configuration:
    {"config": "bf16-compile", "dtype": "bf16", "compile": true, "ms": 1270.1,
     "median_ms": ..., "max_ms": ..., "repeats": 5, "threads": 2, "tokens": [1024, 512],
     "dim": 3072, "heads": 24, "torch": "2.15.0", "diffusers": "0.42.1"}
"ms" is the fastest of the timed calls, as diffuse-bench reports its own side: on a shared
machine the fastest call is the one least disturbed by other processes. A configuration that fails prints
{"config": ..., "error": "..."} instead, and the others still run (torch.compile needs a
C++ compiler on the machine; its failure is reported, not fatal).

The environment (kept outside the repository; the build and the tests never use it):
    python3 -m venv ~/venv-peer
    ~/venv-peer/bin/pip install torch diffusers
    diffuse-bench --threads 2 peer --python ~/venv-peer/bin/python
or run this file alone:
    ~/venv-peer/bin/python tools/peer/flux_block_pair.py --threads 2
"""
import argparse
import json
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--img", type=int, default=1024, help="image tokens (a square grid)")
    p.add_argument("--txt", type=int, default=512, help="text tokens")
    p.add_argument("--dim", type=int, default=3072, help="hidden size")
    p.add_argument("--heads", type=int, default=24, help="attention heads")
    p.add_argument("--axes", default="16,56,56", help="RoPE axes (they sum to the head size)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--configs", default="f32-eager,bf16-eager,f32-compile,bf16-compile",
                   help="comma-separated DTYPE-eager|DTYPE-compile, DTYPE f32 or bf16")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def emit(obj):
    print(json.dumps(obj), flush=True)


def make_inputs(torch, FluxPosEmbed, args, dtype):
    """Hidden states, text states, temb and RoPE as FluxTransformer2DModel passes them."""
    g = torch.Generator().manual_seed(args.seed + 1)
    d = args.dim
    x = torch.randn(1, args.img, d, generator=g).to(dtype)
    ctx = torch.randn(1, args.txt, d, generator=g).to(dtype)
    temb = torch.randn(1, d, generator=g).to(dtype)
    side = int(round(args.img ** 0.5))
    img_ids = torch.zeros(args.img, 3)
    img_ids[:, 1] = torch.arange(args.img) // side
    img_ids[:, 2] = torch.arange(args.img) % side
    txt_ids = torch.zeros(args.txt, 3)
    axes = [int(a) for a in args.axes.split(",")]
    rope = FluxPosEmbed(theta=10000, axes_dim=axes)(torch.cat([txt_ids, img_ids], dim=0))
    return x, ctx, temb, rope


def make_pair(torch, diffusers_flux, args, dtype):
    torch.manual_seed(args.seed)
    heads, head = args.heads, args.dim // args.heads
    double = diffusers_flux.FluxTransformerBlock(dim=args.dim, num_attention_heads=heads,
                                                 attention_head_dim=head)
    single = diffusers_flux.FluxSingleTransformerBlock(dim=args.dim, num_attention_heads=heads,
                                                       attention_head_dim=head, mlp_ratio=4.0)
    return double.to(dtype).eval(), single.to(dtype).eval()


def run_pair(double, single, x, ctx, temb, rope):
    """One double block then one single block, as the model's two loops chain them."""
    ctx, x = double(hidden_states=x, encoder_hidden_states=ctx, temb=temb,
                    image_rotary_emb=rope)
    ctx, x = single(hidden_states=x, encoder_hidden_states=ctx, temb=temb,
                    image_rotary_emb=rope)
    return x


def measure(torch, diffusers, diffusers_flux, args, config):
    name, mode = config.split("-")
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[name]
    x, ctx, temb, rope = make_inputs(torch, diffusers_flux.FluxPosEmbed, args, dtype)
    double, single = make_pair(torch, diffusers_flux, args, dtype)
    if mode == "compile":
        double, single = torch.compile(double), torch.compile(single)
    elif mode != "eager":
        raise ValueError(f"unknown mode '{mode}' (eager or compile)")
    with torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            run_pair(double, single, x, ctx, temb, rope)
        first_s = time.perf_counter() - t0
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            run_pair(double, single, x, ctx, temb, rope)
            times.append(time.perf_counter() - t0)
    return {"config": config, "dtype": name, "compile": mode == "compile",
            "ms": 1e3 * min(times), "median_ms": 1e3 * statistics.median(times),
            "max_ms": 1e3 * max(times), "warmup_s": first_s, "repeats": args.repeats,
            "threads": torch.get_num_threads(), "tokens": [args.img, args.txt],
            "dim": args.dim, "heads": args.heads, "torch": torch.__version__.split("+")[0],
            "diffusers": diffusers.__version__}


def main():
    args = parse_args()
    try:
        import torch
        import diffusers
        from diffusers.models.transformers import transformer_flux as diffusers_flux
    except ImportError as e:
        emit({"config": "import", "error": f"{e} (pip install torch diffusers)"})
        return 1
    torch.set_num_threads(args.threads)
    failures = 0
    for config in args.configs.split(","):
        try:
            emit(measure(torch, diffusers, diffusers_flux, args, config))
        except Exception as e:  # one failing configuration must not hide the others
            msg = " ".join(f"{type(e).__name__}: {e}".split())
            emit({"config": config, "error": msg[:400]})
            failures += 1
    return 1 if failures == len(args.configs.split(",")) else 0


if __name__ == "__main__":
    sys.exit(main())
