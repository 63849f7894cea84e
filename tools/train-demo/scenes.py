"""The demo's scenes: a small caption grammar and a deterministic renderer.

A caption names one shape (or two equal ones side by side) on a plain background:

    a [small |large ]<colour> <shape>[ in the <corner> corner] on a <colour> background
    two [small ]<colour> <shape>s on a <colour> background

Each caption draws exactly one image (no randomness): the flow model then only has to learn
caption -> image, and a few Euler steps from noise land on it. Some colour/shape pairs never
appear in training (HELD_OUT); the C test (tests/unit/test_demo.c) draws captions with them
and checks the images with the same tables, which it keeps in step with this file.
"""
import numpy as np

SIZE = 64
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 40),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
    "purple": (140, 40, 180),
    "cyan": (40, 210, 220),
}
SHAPES = ("circle", "square", "triangle")
SIZES = {"small": 7, "": 11, "large": 16}  # half the shape's extent, in pixels
CORNERS = {"": (32, 32), "top left": (18, 18), "top right": (46, 18),
           "bottom left": (18, 46), "bottom right": (46, 46)}
TWO_X = (18, 46)  # the centres of two shapes, on the middle row
HELD_OUT = {("red", "triangle"), ("blue", "circle"), ("green", "square"), ("white", "triangle")}


def scene_list():
    """Every scene as a dict; the order is fixed."""
    out = []
    for fg in COLOURS:
        for shape in SHAPES:
            for bg in COLOURS:
                if bg == fg:
                    continue
                for size in SIZES:
                    for corner in CORNERS:
                        out.append(dict(count=1, size=size, fg=fg, shape=shape, corner=corner,
                                        bg=bg))
                for size in ("small", ""):
                    out.append(dict(count=2, size=size, fg=fg, shape=shape, corner="", bg=bg))
    return out


def caption(s):
    size = s["size"] + " " if s["size"] else ""
    if s["count"] == 2:
        return f"two {size}{s['fg']} {s['shape']}s on a {s['bg']} background"
    where = f" in the {s['corner']} corner" if s["corner"] else ""
    return f"a {size}{s['fg']} {s['shape']}{where} on a {s['bg']} background"


def held_out(s):
    return (s["fg"], s["shape"]) in HELD_OUT


def _mask(shape, cx, cy, r):
    """Coverage of one shape, 4x4 supersampled, [SIZE, SIZE] in [0, 1]."""
    k = 4
    c = (np.arange(SIZE * k) + 0.5) / k
    x, y = np.meshgrid(c, c)
    if shape == "circle":
        m = (x - cx) ** 2 + (y - cy) ** 2 <= r * r
    elif shape == "square":
        m = (np.abs(x - cx) <= r) & (np.abs(y - cy) <= r)
    else:  # an upright triangle in the box [cx - r, cx + r] x [cy - r, cy + r]
        t = (y - (cy - r)) / (2 * r)
        m = (t >= 0) & (t <= 1) & (np.abs(x - cx) <= r * t)
    return m.reshape(SIZE, k, SIZE, k).mean(axis=(1, 3))


def render(s):
    """The scene as uint8 [SIZE, SIZE, 3]."""
    r = SIZES[s["size"]]
    if s["count"] == 2:
        m = sum(_mask(s["shape"], cx, 32, r) for cx in TWO_X)
    else:
        cx, cy = CORNERS[s["corner"]]
        m = _mask(s["shape"], cx, cy, r)
    m = np.clip(m, 0, 1)[..., None]
    fg = np.array(COLOURS[s["fg"]], np.float64)
    bg = np.array(COLOURS[s["bg"]], np.float64)
    return np.round(m * fg + (1 - m) * bg).astype(np.uint8)
