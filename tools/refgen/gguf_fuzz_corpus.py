#!/usr/bin/env python3
"""Seed inputs for tests/fuzz/fuzz_gguf.c, written by the gguf package's own writer:
small files with metadata of every value type, one tensor of each ggml type that diffuse
dequantises (random blocks with finite scales, as tools/refgen/gguf_dequant.py), and a 1-D
Q8_0 tensor.
Usage: python tools/refgen/gguf_fuzz_corpus.py tests/fuzz/corpus/gguf
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, os.path.dirname(__file__))
from gguf_dequant import F16_FIELDS, random_blocks  # noqa: E402


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(os.path.join(out_dir, "metadata.gguf"), arch="flux")
    w.add_uint32("general.alignment", 64)
    w.add_int16("a.i16", -3)
    w.add_float64("a.f64", 2.5)
    w.add_bool("a.bool", False)
    w.add_array("a.strs", ["x", "yy"])
    w.add_array("a.floats", [0.5, 1.5])
    w.add_tensor("f32", rng.standard_normal((2, 8)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((3,)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for qtype in F16_FIELDS:
        w = gguf.GGUFWriter(os.path.join(out_dir, qtype.name.lower() + ".gguf"), arch="flux")
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        w.add_tensor("w", random_blocks(rng, qtype, (2, max(block, 64))), raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    # a 1-D block tensor (stable-diffusion.cpp's Q8_0 norm weights): its rows are single
    # values, so a row range must fall on blocks
    w = gguf.GGUFWriter(os.path.join(out_dir, "q8_0_1d.gguf"), arch="flux")
    w.add_tensor("model.diffusion_model.norm.weight", random_blocks(rng, Q.Q8_0, (96,)),
                 raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/gguf")
