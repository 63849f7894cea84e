#!/usr/bin/env python3
"""
Re-runs the golden cases (tests/golden, format in its README) with the Python stack installed
in this interpreter (diffusers, transformers, torch), to see which references today's stack
still reproduces.

For each case it loads the folder case.json names, calls the same class the way `call` says
with the case's `args`, and compares each output with `out.<name>` within the case's
tolerance (exact outputs must match exactly; image_uint8 may differ by 1). Models run in
float32, the dtype a user gets by default: the tolerances are about 20x the float32-float64
difference, so a float32 run of the same function passes. Where the case has `out_f32.*`
(torch's own float32 run with the stack that made the case), the rel-L2 to it is printed
too: near 1e-7 means the same arithmetic, larger means the function changed.

    /work/venv/bin/python tools/refgen/rerun_golden.py [--json FILE] [CASE_DIR ...]
"""
import argparse
import json
import os
import sys
import traceback

import numpy as np
import torch
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "golden")


def arg_value(v, t):
    if isinstance(v, str) and v.startswith("in."):
        return torch.from_numpy(np.ascontiguousarray(t[v]))
    if isinstance(v, dict) and set(v) == {"device", "seed"}:
        return torch.Generator(v["device"]).manual_seed(v["seed"])
    return v


def ragged_strings(utf8, offsets):
    b = bytes(utf8.astype(np.uint8))
    return [b[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(len(offsets) - 1)]


def np64(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().to(torch.float64 if x.is_floating_point() else x.dtype).cpu().numpy()
    return np.asarray(x)


# --- one function per kind: returns {output name: array} -----------------------------------

def run_rng(case, t, d):
    from diffusers.utils.torch_utils import randn_tensor
    a = case["args"]
    g = torch.Generator(a["generator"]["device"]).manual_seed(a["generator"]["seed"])
    dtype = getattr(torch, a["dtype"])
    out = {}
    for i, size in enumerate(a["sizes"]):
        if a.get("via") == "randn_tensor":
            out[f"sample_{i}"] = randn_tensor(tuple(size), generator=g, dtype=dtype)
        else:
            out[f"sample_{i}"] = torch.randn(tuple(size), generator=g, dtype=dtype)
    return out


def run_scheduler(case, t, d):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux.pipeline_flux import retrieve_timesteps
    a = case["args"]
    s = FlowMatchEulerDiscreteScheduler.from_pretrained(d)
    kw = {}
    if a.get("sigmas") is not None:
        kw["sigmas"] = t[a["sigmas"]]
    if a.get("mu") is not None:
        kw["mu"] = a["mu"]
    timesteps, n = retrieve_timesteps(s, None if kw.get("sigmas") is not None else
                                      a["num_inference_steps"], "cpu", **kw)
    s.set_begin_index(0)
    x = torch.from_numpy(t[a["sample"]]).float()
    mo = torch.from_numpy(t[a["model_output"]]).float()
    steps = []
    for i, ts in enumerate(timesteps):
        x = s.step(mo[i], ts, x, return_dict=False)[0]
        steps.append(x)
    return {"timesteps": timesteps, "sigmas": s.sigmas, "prev_sample": torch.stack(steps)}


def run_tokenizer(case, t, d):
    import transformers
    a = case["args"]
    # The slow-class cases name their class; the tokenizer.json cases are loaded the way the
    # FLUX.2 pipelines load them (AutoTokenizer), with the padding side that gives, since
    # the padding side a class implies is one of the things that changed (see the notes of
    # tok-mistral-tekken).
    cls = getattr(transformers, case["class"], None) if case["class"] in (
        "CLIPTokenizer", "T5Tokenizer") else None
    tok = (cls or transformers.AutoTokenizer).from_pretrained(d)
    kw = dict(padding="max_length", max_length=a["max_length"], truncation=True)
    if "add_special_tokens" in a:
        kw["add_special_tokens"] = a["add_special_tokens"]
    enc = tok(a["prompts"], **kw)
    out = {"input_ids": np.array(enc["input_ids"]), "attention_mask": np.array(enc["attention_mask"])}
    ids, offs = [], [0]
    for p in a["prompts"]:
        one = tok(p, add_special_tokens=a.get("add_special_tokens", True))["input_ids"]
        ids += one
        offs.append(len(ids))
    out["ids_nopad"] = np.array(ids)
    out["ids_nopad_offsets"] = np.array(offs)
    if "templated_input_ids" in case["outputs"]:
        texts = ragged_strings(t["in.templated_utf8"], t["in.templated_offsets"])
        kw = dict(padding="max_length", max_length=a["max_sequence_length"], truncation=True,
                  add_special_tokens=a.get("templated_add_special_tokens", False))
        enc = tok(texts, **kw)
        out["templated_input_ids"] = np.array(enc["input_ids"])
        out["templated_attention_mask"] = np.array(enc["attention_mask"])
    return out


def run_text_encoder(case, t, d):
    import transformers
    a = dict(case["args"])
    layers = a.pop("layers", None)
    m = getattr(transformers, case["class"]).from_pretrained(d, dtype=torch.float32).eval()
    kw = {k: arg_value(v, t) for k, v in a.items()}
    with torch.no_grad():
        o = m(**kw)
        out = {"last_hidden_state": o.last_hidden_state}
        if getattr(o, "hidden_states", None) is not None:
            out["hidden_states_m2"] = o.hidden_states[-2]
        for k in ("pooler_output", "text_embeds"):
            if getattr(o, k, None) is not None:
                out[k] = getattr(o, k)
        if "last_hidden_state_masked" in case["outputs"]:
            out["last_hidden_state"] = m(input_ids=kw["input_ids"]).last_hidden_state
            out["last_hidden_state_masked"] = o.last_hidden_state
        if layers:
            hs = torch.stack([o.hidden_states[i] for i in layers], dim=1)  # [B, n, L, D]
            B, n, L, D = hs.shape
            out["prompt_embeds"] = hs.permute(0, 2, 1, 3).reshape(B, L, n * D)
    return out


def run_model_forward(case, t, d):
    import diffusers
    m = getattr(diffusers, case["class"]).from_pretrained(d, torch_dtype=torch.float32).eval()
    kw = {k: arg_value(v, t) for k, v in case["args"].items()}
    kw = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
          for k, v in kw.items()}
    with torch.no_grad():
        return {"sample": m(**kw)[0]}


def run_vae_decode(case, t, d):
    import diffusers
    from diffusers import Flux2Pipeline, FluxPipeline
    a = case["args"]
    vae = getattr(diffusers, case["class"]).from_pretrained(d, torch_dtype=torch.float32).eval()
    x = torch.from_numpy(t[a["latents"]]).float()
    out = {}
    with torch.no_grad():
        if case["class"] == "AutoencoderKLFlux2":
            ids = torch.from_numpy(t[a["latent_ids"]])
            x = Flux2Pipeline._unpack_latents_with_ids(x, ids)
            if isinstance(x, (list, tuple)):
                x = torch.stack(x)
            out["unpacked"] = x
            mean = vae.bn.running_mean.view(1, -1, 1, 1)
            std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
            x = x * std + mean
            out["denormalized"] = x
            x = Flux2Pipeline._unpatchify_latents(x)
            out["unpatchified"] = x
        else:
            if a.get("unpack_latents"):
                sf = 2 ** (len(vae.config.block_out_channels) - 1)
                x = FluxPipeline._unpack_latents(x, a["height"], a["width"], sf)
                out["unpacked"] = x
            x = x / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
            out["scaled"] = x
        dec = vae.decode(x, return_dict=False)[0]
    out["decoded"] = dec
    img = (dec / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float()
    out["image"] = img
    out["image_uint8"] = (img.numpy() * 255).round().astype(np.uint8)
    return out


def run_pipeline(case, t, d):
    from diffusers import DiffusionPipeline
    index = json.load(open(os.path.join(d, "model_index.json")))
    absent = {k: None for k, v in index.items()
              if isinstance(v, list) and len(v) == 2 and v[0] is None}
    try:  # what a user gets: no torch_dtype
        pipe = DiffusionPipeline.from_pretrained(d, **absent)
        default_dtypes = {k: str(v.dtype) for k, v in pipe.components.items()
                          if hasattr(v, "dtype")}
    except Exception as e:
        default_dtypes = {"error": f"{type(e).__name__}: {e}"[:300]}
    # float32 throughout, the comparison this script makes everywhere
    pipe = DiffusionPipeline.from_pretrained(d, torch_dtype=torch.float32, **absent)
    pipe.set_progress_bar_config(disable=True)
    out = {}
    for output_type in ("np", "latent"):
        kw = {k: arg_value(v, t) for k, v in case["args"].items()}  # fresh generator each call
        kw = {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
              for k, v in kw.items()}
        kw["output_type"] = output_type
        with torch.no_grad():
            r = pipe(**kw).images
        if output_type == "np":
            out["image"] = np.asarray(r, dtype=np.float64)
            out["image_uint8"] = (np.asarray(r) * 255).round().astype(np.uint8)
        else:
            out["latents_final"] = r
    out["_component_dtypes"] = default_dtypes
    return out


RUN = {"rng": run_rng, "scheduler": run_scheduler, "tokenizer": run_tokenizer,
       "text_encoder": run_text_encoder, "model_forward": run_model_forward,
       "vae_decode": run_vae_decode, "pipeline": run_pipeline}


def compare(case, t, got):
    rows, ok = [], True
    for name, ref_name in case["outputs"].items():
        if name not in got:
            rows.append({"output": name, "status": "not computed"})
            ok = False
            continue
        ref = t[ref_name]
        mine = np64(got[name])
        row = {"output": name}
        if mine.shape != ref.shape:
            row.update(status="SHAPE", got=list(mine.shape), want=list(ref.shape))
            ok = False
            rows.append(row)
            continue
        if name in case.get("exact", []) or ref.dtype.kind in "iu" and name != "image_uint8":
            n = int(np.sum(mine != ref))
            row.update(mismatches=n, status="PASS" if n == 0 else "FAIL")
        else:
            diff = np.abs(mine.astype(np.float64) - ref.astype(np.float64))
            max_abs = float(diff.max()) if diff.size else 0.0
            den = float(np.linalg.norm(ref.astype(np.float64)))
            rel = float(np.linalg.norm(mine.astype(np.float64) - ref)) / den if den else max_abs
            tol = case["tolerance"].get(name, {"max_abs": 0, "rel_l2": 0})
            passed = max_abs <= tol["max_abs"] and (rel <= tol["rel_l2"] or name == "image_uint8")
            row.update(max_abs=max_abs, rel_l2=rel, tol=tol, status="PASS" if passed else "FAIL")
            f32 = t.get("out_f32." + name)
            if f32 is not None and f32.shape == mine.shape and name != "image_uint8":
                fd = float(np.linalg.norm(f32.astype(np.float64)))
                row["rel_l2_vs_old_f32"] = (float(np.linalg.norm(mine - f32.astype(np.float64))) /
                                            fd if fd else 0.0)
        ok = ok and row["status"] == "PASS"
        rows.append(row)
    return ok, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("cases", nargs="*")
    opts = ap.parse_args()
    torch.manual_seed(0)
    dirs = opts.cases or sorted(os.path.join(GOLDEN, c) for c in os.listdir(GOLDEN)
                                if os.path.isfile(os.path.join(GOLDEN, c, "case.json")))
    report = {"versions": {}, "cases": {}}
    import diffusers, transformers
    report["versions"] = {"diffusers": diffusers.__version__,
                          "transformers": transformers.__version__, "torch": torch.__version__}
    print(report["versions"])
    for cdir in dirs:
        case = json.load(open(os.path.join(cdir, "case.json")))
        t = load_file(os.path.join(cdir, "case.safetensors"))
        d = os.path.normpath(os.path.join(cdir, case["dir"])) if case.get("dir") else None
        try:
            got = RUN[case["kind"]](case, t, d)
            extra = got.pop("_component_dtypes", None)
            ok, rows = compare(case, t, got)
            entry = {"ok": ok, "outputs": rows, "provenance": case.get("provenance")}
            if extra:
                entry["component_dtypes"] = extra
        except Exception as e:  # a case this stack cannot run is a finding too
            entry = {"ok": False, "error": f"{type(e).__name__}: {e}",
                     "trace": traceback.format_exc(limit=3)}
        report["cases"][case["case"]] = entry
        print(("PASS " if entry["ok"] else "DIFF ") + case["case"])
        for r in entry.get("outputs", []):
            if r.get("status") != "PASS" or "rel_l2_vs_old_f32" in r:
                print("    ", json.dumps(r))
        if "error" in entry:
            print("    ", entry["error"])
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
