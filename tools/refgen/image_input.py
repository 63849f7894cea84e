"""Reference data for image input: decoding and PIL's resize as VaeImageProcessor uses it.

Writes tests/cases/image-input/: small pictures in every accepted form (PNG grey, grey +
alpha, RGB, RGBA, palette; JPEG grey, 4:2:0, 4:4:4), the files that must be refused
(16-bit PNG, CMYK JPEG), PIL's own RGB decode of each accepted file (dec-<name>.png),
and PIL's Image.resize of one picture with each filter to several sizes
(resize-<filter>-<W>x<H>.png). tests/unit/test_image_input.c reads them.

    /work/venv/bin/python tools/refgen/image_input.py [OUT_DIR]
"""
import json
import os
import sys

import numpy as np
import PIL
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "cases", "image-input")


def picture(w, h, seed):
    """Smooth shapes plus some noise: edges and flat areas, so rounding and clamping show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    img[..., 0] = 255 * (x / max(w - 1, 1))
    img[..., 1] = 255 * (y / max(h - 1, 1))
    img[..., 2] = 128 + 127 * np.sin(x / 3.0 + y / 5.0)
    circle = (x - w / 3) ** 2 + (y - h / 2) ** 2 < (min(w, h) / 4) ** 2
    img[circle] = [250, 20, 30]
    img[h // 5 : h // 2, w // 2 : w - 2] = [5, 5, 240]
    img += rng.normal(0, 12, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def main():
    os.makedirs(OUT, exist_ok=True)
    base = picture(37, 29, 0)
    rgb = Image.fromarray(base, "RGB")
    accepted = {}
    rgb.save(os.path.join(OUT, "rgb.png"))
    accepted["rgb.png"] = rgb
    grey = rgb.convert("L")
    grey.save(os.path.join(OUT, "grey.png"))
    accepted["grey.png"] = grey
    la = Image.merge("LA", (grey, Image.fromarray(base[..., 0])))
    la.save(os.path.join(OUT, "grey-alpha.png"))
    accepted["grey-alpha.png"] = la
    rgba = rgb.copy()
    rgba.putalpha(Image.fromarray(base[..., 1]))
    rgba.save(os.path.join(OUT, "rgba.png"))
    accepted["rgba.png"] = rgba
    pal = rgb.quantize(colors=16)
    pal.save(os.path.join(OUT, "palette.png"))
    accepted["palette.png"] = pal
    for name, kw in (("yuv420.jpg", {"subsampling": 2}), ("yuv444.jpg", {"subsampling": 0})):
        rgb.save(os.path.join(OUT, name), quality=90, **kw)
        accepted[name] = None
    grey.save(os.path.join(OUT, "grey.jpg"), quality=90)
    accepted["grey.jpg"] = None
    # refused
    Image.fromarray(base[..., 0].astype(np.uint16) * 257).save(
        os.path.join(OUT, "sixteen-bit.png"))
    rgb.convert("CMYK").save(os.path.join(OUT, "cmyk.jpg"), quality=90)

    # PIL's decode of each accepted file, as diffusers reads it: Image.open(...).convert("RGB")
    for name in accepted:
        im = Image.open(os.path.join(OUT, name)).convert("RGB")
        im.save(os.path.join(OUT, "dec-" + name.replace(".", "-") + ".png"))

    sizes = [(64, 64), (16, 16), (48, 24), (29, 37), (37, 13), (8, 29)]
    filters = {"lanczos": Image.Resampling.LANCZOS, "bicubic": Image.Resampling.BICUBIC,
               "bilinear": Image.Resampling.BILINEAR, "nearest": Image.Resampling.NEAREST}
    for fname, f in filters.items():
        for w, h in sizes:
            rgb.resize((w, h), resample=f).save(os.path.join(OUT, f"resize-{fname}-{w}x{h}.png"))

    json.dump({
        "format": 2, "case": "image-input", "kind": "image_input",
        "covers": "PNG / JPEG input decoding to RGB and PIL's Image.resize filters",
        "class": "PIL.Image.open(...).convert('RGB'), PIL.Image.Image.resize",
        "dir": None,
        "notes": ["read by tests/unit/test_image_input.c, not by diffuse-check",
                  "dec-*.png: PIL's RGB decode of each accepted input",
                  "resize-<filter>-<W>x<H>.png: rgb.png resized by PIL"],
        "provenance": {"pillow": PIL.__version__, "numpy": np.__version__},
    }, open(os.path.join(OUT, "case.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
