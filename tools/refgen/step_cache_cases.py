#!/usr/bin/env python3
"""Reference cases for diffuse's step caches (docs/step-cache.md), in the golden format.

Runs diffusers' FluxPipeline and Flux2KleinPipeline on the tiny pipelines of
tests/golden/pipe-flux-schnell and pipe-flux2-klein (their prompt embeddings and latents) with
`pipe.transformer.enable_cache(config)`, in float64, and writes tests/cases/<case>/ with
case.json and case.safetensors:

  in.*                                                    the golden case's inputs
  out.latents_final, out.image, out.image_uint8           the cached run (float64)
  out.cache_trace                                         one ASCII code per transformer call:
                                                          C computed, S skipped, P predicted

The pipeline folder is not copied: "dir" points at the golden one. details.uncached_psnr_db
is the cached image against the same call without a cache; for the first-block cache,
details.diffs are the measured changes per call and details.margin the smallest distance
from the threshold (the decisions are not on a knife edge when it is far above float32
noise, about 1e-6 here).

Usage: /work/venv/bin/python tools/refgen/step_cache_cases.py [REPO_ROOT]
(diffusers 0.42, torch 2.x; about a minute on two cores)
"""
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import diffusers
from diffusers import (FirstBlockCacheConfig, Flux2KleinPipeline, Flux2Pipeline, FluxPipeline,
                       MagCacheConfig, TaylorSeerCacheConfig)
from diffusers.hooks import mag_cache as mgc
from diffusers.hooks import first_block_cache as fbc
from diffusers.hooks import taylorseer_cache as tsc

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
STEPS = 12

# ---- what the hooks decided, call by call ---------------------------------------------------

events = []  # (kind, value): ("fbc", diff or None, computed) / ("ts", hook id, computed)

_fbc_decide = fbc.FBCHeadBlockHook._should_compute_remaining_blocks


def fbc_decide(self, residual):
    state = self.state_manager.get_state()
    prev = state.head_block_residual
    diff = None
    if prev is not None:
        diff = ((residual - prev).abs().mean() / prev.abs().mean()).item()
    run = _fbc_decide(self, residual)
    events.append(("fbc", diff, run))
    return run


fbc.FBCHeadBlockHook._should_compute_remaining_blocks = fbc_decide

_ts_decide = tsc.TaylorSeerCacheHook._measure_should_compute


def ts_decide(self):
    run, state = _ts_decide(self)
    events.append(("ts", id(self), run))
    return run, state


tsc.TaylorSeerCacheHook._measure_should_compute = ts_decide


_mag_forward = mgc.MagCacheHeadHook.new_forward


def mag_forward(self, module, *args, **kwargs):
    out = _mag_forward(self, module, *args, **kwargs)
    events.append(("mag", None, self.state_manager.get_state().should_compute))
    return out


mgc.MagCacheHeadHook.new_forward = mag_forward


def mag_errors(config):
    """The accumulated errors MagCacheHeadHook compares with the threshold, replayed in its
    float32 arithmetic (None where it compares nothing), given the trace's decisions."""
    errs, ratio, steps, err = [], 1.0, 0, 0.0
    retention = int(config.retention_ratio * config.num_inference_steps + 0.5)
    for s in range(config.num_inference_steps):
        if s < retention:
            errs.append(None)
            continue
        ratio = ratio * config.mag_ratios[s]
        steps += 1
        err = err + abs(1.0 - ratio)
        errs.append(float(err))
        if not (err <= config.threshold and steps <= config.max_skip_steps and s > 0):
            ratio, steps, err = 1.0, 0, 0.0
    return errs


def trace_of(kind):
    if kind == "mag":
        return "".join("C" if run else "S" for k, _, run in events if k == "mag")
    if kind == "fbc":
        return "".join("C" if run else "S" for k, _, run in events if k == "fbc")
    first = next(h for k, h, _ in events if k == "ts")  # transformer_blocks.0.attn
    return "".join("C" if run else "P" for k, h, run in events if k == "ts" and h == first)


# ---- the pipeline -----------------------------------------------------------------------------

class Target:
    """A golden pipeline case's folder and inputs, and the call that runs it."""

    def __init__(self, golden, cls, guidance, drop):
        self.golden = os.path.join(ROOT, "tests", "golden", golden)
        self.name, self.cls, self.guidance = golden, cls, guidance
        inputs = load_file(os.path.join(self.golden, "case.safetensors"))
        self.ins = {k: v for k, v in inputs.items() if k.startswith("in.")}
        self.pipe = cls.from_pretrained(os.path.join(self.golden, "pipeline"),
                                        torch_dtype=torch.float64, **{k: None for k in drop})
        self.pipe.set_progress_bar_config(disable=True)
        self.uncached = None


flux = Target("pipe-flux-schnell", FluxPipeline, 0.0,
              ["text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2"])
klein = Target("pipe-flux2-klein", Flux2KleinPipeline, 1.0, ["text_encoder", "tokenizer"])
flux2 = Target("pipe-flux2", Flux2Pipeline, 4.0, ["text_encoder", "tokenizer"])


def run(target, config, output_type):
    """One call with a fresh cache (None: uncached); returns the output and the trace."""
    pipe = target.pipe
    if config is not None:
        pipe.transformer.enable_cache(config)
    events.clear()
    out = pipe(**{k[3:]: v.double() for k, v in target.ins.items()}, height=64, width=64,
               num_inference_steps=STEPS, guidance_scale=target.guidance,
               output_type=output_type, return_dict=False)[0]
    fbc_diffs = [d for k, d, _ in events if k == "fbc"]
    kind = ("fbc" if isinstance(config, FirstBlockCacheConfig)
            else "mag" if isinstance(config, MagCacheConfig) else "ts")
    trace = trace_of(kind) if config else ""
    if config is not None:
        pipe.transformer.disable_cache()
    return out, trace, fbc_diffs


def psnr(a, b):
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * math.log10(1.0 / mse)


def write_case(target, name, config, args_cache, covers, extra_notes, details, widen=1.0):
    if target.uncached is None:
        target.uncached = run(target, None, "np")[0]
    image, trace, diffs = run(target, config, "np")
    latents, trace2, _ = run(target, config, "latent")
    assert trace == trace2, (trace, trace2)
    image_u8 = np.stack([np.array(p) for p in target.pipe.numpy_to_pil(image)])
    out = {
        **{k: v.contiguous() for k, v in target.ins.items()},
        "out.latents_final": torch.as_tensor(latents, dtype=torch.float64).contiguous(),
        "out.image": torch.as_tensor(image, dtype=torch.float64).contiguous(),
        "out.image_uint8": torch.as_tensor(image_u8, dtype=torch.uint8).contiguous(),
        "out.cache_trace": torch.tensor([ord(ch) for ch in trace], dtype=torch.int64),
    }
    details = dict(details, trace=trace, uncached_psnr_db=psnr(image, target.uncached))
    if isinstance(config, MagCacheConfig):
        errs = mag_errors(config)
        details["accumulated_errors"] = errs
        details["margin"] = min(abs(e - float(torch.tensor(config.threshold, dtype=torch.float32)))
                                for e in errs if e is not None)
    if diffs and diffs[0] is None:
        measured = [d for d in diffs if d is not None]
        details["diffs"] = diffs
        details["margin"] = min(abs(d - args_cache["threshold"]) for d in measured)
    case = {
        "format": 2,
        "case": name,
        "kind": "pipeline",
        "covers": covers,
        "class": target.cls.__name__,
        "dir": f"../../golden/{target.name}/pipeline",
        "call": f"pipe = {target.cls.__name__}.from_pretrained(dir, torch_dtype=torch.float64, "
                "text encoders and tokenizers None); pipe.transformer.enable_cache(<args.cache>); "
                f"image = pipe({', '.join(k[3:] for k in sorted(target.ins))}, height=64, "
                f"width=64, num_inference_steps={STEPS}, guidance_scale={target.guidance}, "
                "output_type='np'); the cache is disabled and enabled again before the "
                "output_type='latent' call",
        "args": {
            **{k[3:]: k for k in sorted(target.ins)},
            "height": 64, "width": 64, "num_inference_steps": STEPS,
            "guidance_scale": target.guidance, "output_type": "np",
            "cache": args_cache,
        },
        "outputs": {"latents_final": "out.latents_final", "image": "out.image",
                    "image_uint8": "out.image_uint8", "cache_trace": "out.cache_trace"},
        "tolerance": {"latents_final": {"max_abs": 1e-4 * widen, "rel_l2": 1e-5 * widen},
                      "image": {"max_abs": 1e-4 * widen, "rel_l2": 1e-5 * widen},
                      "image_uint8": {"max_abs": 1, "rel_l2": 1.0}},
        "exact": ["cache_trace"],
        "notes": [
            f"inputs and pipeline folder: tests/golden/{target.name}",
            "args.cache: the config given to pipe.transformer.enable_cache, as {config: class "
            "name, field: value}; diffuse-check passes it as --cache",
            "out.cache_trace: ASCII codes, one per transformer call: C computed every block, "
            "S skipped the blocks after the first (FirstBlockCache), P predicted every attention "
            "module (TaylorSeer)",
            "out.* = float64 run; the scheduler rounds latents to float32 once per step",
        ] + extra_notes,
        "provenance": {"diffusers": diffusers.__version__, "torch": torch.__version__,
                       "script": "tools/refgen/step_cache_cases.py"},
        "tensors": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                    for k, v in sorted(out.items())},
        "details": details,
    }
    folder = os.path.join(ROOT, "tests", "cases", name)
    os.makedirs(folder, exist_ok=True)
    save_file(out, os.path.join(folder, "case.safetensors"))
    with open(os.path.join(folder, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")
    print(name, trace, {k: v for k, v in details.items() if k != "diffs"})


def pick_threshold():
    """A threshold that skips some calls and computes others, far from every measured change."""
    best = None
    for t in (0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85):
        _, trace, diffs = run(flux, FirstBlockCacheConfig(threshold=t), "latent")
        margin = min(abs(d - t) for d in diffs if d is not None)
        if trace.count("S") >= 3 and trace.count("C") >= 4 and (best is None or margin > best[1]):
            best = (t, margin)
    return best[0]


threshold = pick_threshold()
write_case(flux, "cache-fbc-flux", FirstBlockCacheConfig(threshold=threshold),
           {"config": "FirstBlockCacheConfig", "threshold": threshold},
           f"FluxPipeline (pipe-flux-schnell) 12 steps with FirstBlockCacheConfig(threshold="
           f"{threshold}): which calls skip the blocks after the first, and the image",
           ["the threshold was chosen among 0.55..0.85 for the largest margin (details.margin) "
            "with at least 3 skipped and 4 computed calls"],
           {"threshold": threshold})

ts = dict(cache_interval=3, disable_cache_before_step=2, max_order=2)
write_case(flux, "cache-taylorseer-flux", TaylorSeerCacheConfig(**ts, taylor_factors_dtype=torch.float32),
           {"config": "TaylorSeerCacheConfig", **ts, "taylor_factors_dtype": "float32"},
           "FluxPipeline (pipe-flux-schnell) 12 steps with TaylorSeerCacheConfig(cache_interval=3, "
           "disable_cache_before_step=2, max_order=2, taylor_factors_dtype=float32): the attention "
           "modules' predicted calls and the image",
           ["taylor_factors_dtype float32 (diffusers' default is bfloat16, whose rounding of "
            "float32 against float64 features would move single elements by a bf16 ulp)"],
           dict(ts, taylor_factors_dtype="float32"))

write_case(flux, "cache-taylorseer-flux-bf16", TaylorSeerCacheConfig(**ts),
           {"config": "TaylorSeerCacheConfig", **ts},
           "FluxPipeline (pipe-flux-schnell) 12 steps with TaylorSeerCacheConfig(cache_interval=3, "
           "disable_cache_before_step=2, max_order=2) and diffusers' default bfloat16 factors",
           ["taylor_factors_dtype bfloat16 (the default): the reference rounds float64 features to "
            "bfloat16, diffuse float32 ones, so single elements can land one bf16 ulp apart; the "
            "tolerances are 5x the pipelines' (diffuse measured 1.8e-5 max abs, 2.6e-6 rel L2 on "
            "latents_final)"],
           dict(ts, taylor_factors_dtype="bfloat16"), widen=5.0)

ts1 = dict(cache_interval=5, disable_cache_before_step=3, max_order=1, disable_cache_after_step=10)
write_case(flux, "cache-taylorseer-flux-order1",
           TaylorSeerCacheConfig(**ts1, taylor_factors_dtype=torch.float32),
           {"config": "TaylorSeerCacheConfig", **ts1, "taylor_factors_dtype": "float32"},
           "FluxPipeline (pipe-flux-schnell) 12 steps with TaylorSeerCacheConfig(cache_interval=5, "
           "disable_cache_before_step=3, disable_cache_after_step=10, max_order=1, "
           "taylor_factors_dtype=float32): the defaults' schedule with a cooldown",
           ["taylor_factors_dtype float32, as in cache-taylorseer-flux"],
           dict(ts1, taylor_factors_dtype="float32"))

tk = dict(cache_interval=4, disable_cache_before_step=2, max_order=1)
write_case(klein, "cache-taylorseer-flux2-klein",
           TaylorSeerCacheConfig(**tk, taylor_factors_dtype=torch.float32),
           {"config": "TaylorSeerCacheConfig", **tk, "taylor_factors_dtype": "float32"},
           "Flux2KleinPipeline (pipe-flux2-klein, distilled) 12 steps with TaylorSeerCacheConfig("
           "cache_interval=4, disable_cache_before_step=2, max_order=1, taylor_factors_dtype="
           "float32): the double blocks' Flux2Attention and the single blocks' "
           "Flux2ParallelSelfAttention (attention and MLP) predicted",
           ["taylor_factors_dtype float32, as in cache-taylorseer-flux"],
           dict(tk, taylor_factors_dtype="float32"))

ratios = [float(r) for r in mgc.FLUX_MAG_RATIOS]  # float32 values, as JSON doubles
for target, name, covers in (
        (flux, "cache-mag-flux", "FluxPipeline (pipe-flux-schnell)"),
        (flux2, "cache-mag-flux2", "Flux2Pipeline (pipe-flux2, guidance-embedded)")):
    mk = dict(threshold=0.1, num_inference_steps=STEPS)
    write_case(target, name, MagCacheConfig(**mk, mag_ratios=ratios),
               {"config": "MagCacheConfig", **mk, "mag_ratios": ratios},
               f"{covers} 12 steps with MagCacheConfig(threshold=0.1, num_inference_steps=12, "
               "mag_ratios=FLUX_MAG_RATIOS): the 28 ratios resampled to 12, which calls skip "
               "every block, and the image",
               ["the decisions depend on the ratios only (and on a stored residual): "
                "details.accumulated_errors are the float32 values compared with the threshold"],
               dict(mk, mag_ratios="FLUX_MAG_RATIOS"))
