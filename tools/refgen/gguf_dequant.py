#!/usr/bin/env python3
"""Reference case for GGUF reading and block dequantisation (tests/cases/gguf-dequant).

Writes, with the `gguf` package's own writer:
  model.gguf        one [4, 256] tensor per ggml type diffuse dequantises (F32, F16, BF16,
                    Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), named
                    "t.<TYPE>", plus a [2, 3, 64] Q8_0 tensor "t3.Q8_0" and metadata of
                    every value type;
  case.safetensors  out.t.<TYPE> = gguf.quants.dequantize(<the tensor's bytes>) in f32;
  case.json         the golden format, kind "gguf_dequant".

Quantised blocks are random bytes (every bit pattern of the packed integers and scales)
with the f16 scale fields replaced by finite random values, so no block decodes to inf or
NaN. Usage: python tools/refgen/gguf_dequant.py tests/cases/gguf-dequant
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from safetensors.numpy import save_file

ROWS, COLS = 4, 256

# Byte offsets of the f16 fields in one block of each type (ggml-common.h).
F16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
}


def random_blocks(rng, qtype, shape):
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    nblocks = int(np.prod(shape)) // block
    raw = rng.integers(0, 256, size=(nblocks, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        scale = (rng.standard_normal(nblocks) * 0.05).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(*shape[:-1], shape[-1] // block * nbytes)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(29)
    w = gguf.GGUFWriter(os.path.join(out_dir, "model.gguf"), arch="flux")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_uint64("test.u64", 1 << 40)
    w.add_int64("test.i64", -(1 << 40))
    w.add_float32("test.f32", 0.25)
    w.add_float64("test.f64", -1.5)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo")
    w.add_array("test.strs", ["a", "", "ccc"])
    w.add_array("test.ints", [1, -2, 3])

    refs = {}
    tensors = []

    def add(name, data, qtype):
        w.add_tensor(name, data, raw_dtype=qtype)
        ref = dequantize(data, qtype).astype(np.float32)
        refs["out." + name] = np.ascontiguousarray(ref)
        tensors.append(name)

    add("t.F32", rng.standard_normal((ROWS, COLS)).astype(np.float32), Q.F32)
    add("t.F16", rng.standard_normal((ROWS, COLS)).astype(np.float16), Q.F16)
    bf = (rng.standard_normal((ROWS, COLS)).astype(np.float32).view(np.uint32) >> 16)
    add("t.BF16", bf.astype(np.uint16).view(np.uint8).reshape(ROWS, COLS * 2), Q.BF16)
    for qtype in F16_FIELDS:
        add("t." + qtype.name, random_blocks(rng, qtype, (ROWS, COLS)), qtype)
    add("t3.Q8_0", random_blocks(rng, Q.Q8_0, (2, 3, 64)), Q.Q8_0)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file(refs, os.path.join(out_dir, "case.safetensors"))

    case = {
        "format": 2,
        "case": os.path.basename(os.path.normpath(out_dir)),
        "kind": "gguf_dequant",
        "covers": "GGUF v3 as the gguf package writes it; dequantisation of every supported "
                  "ggml type against gguf.quants.dequantize",
        "class": "gguf.quants.dequantize",
        "dir": ".",
        "call": "gguf.quants.dequantize(GGUFReader('model.gguf').tensors[i].data, type)",
        "args": {"file": "model.gguf"},
        "outputs": {t: "out." + t for t in tensors},
        "tolerance": {t: {"max_abs": 0.0, "rel_l2": 0.0} for t in tensors},
        "exact": [],
        "notes": [
            "out.<tensor> is the f32 result of the gguf package's numpy dequantisation; "
            "ggml's reference C code computes the same values, so the match is exact",
            "quantised blocks are random bytes with finite random f16 scales",
        ],
        "provenance": {"gguf": getattr(gguf, "__version__", "unknown"),
                       "numpy": np.__version__},
        "tensors": {k: {"dtype": "float32", "shape": list(v.shape)} for k, v in refs.items()},
    }
    with open(os.path.join(out_dir, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/cases/gguf-dequant")
