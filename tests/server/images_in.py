"""diffuse serve with pictures in, on the demo model, with the standard library only:
A1111's /sdapi/v1/img2img (JSON, base64 init_images) and OpenAI's /v1/images/edits
(multipart/form-data), the strength doing what it says, and every bad input a 400 naming
its field. The real clients (webuiapi's img2img, openai's images.edit) are in clients.py.

    python3 images_in.py DIFFUSE_BIN MODEL_DIR
"""
import base64
import json
import os
import struct
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, check, decode_b64_png  # noqa: E402

diffuse, model = sys.argv[1], os.path.abspath(sys.argv[2])
PROMPT = "a large yellow circle in the top left corner on a blue background"


def png(w, h, rgb):
    """An 8-bit RGB PNG of one colour."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + bytes(rgb) * w for _ in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def b64(data):
    return base64.b64encode(data).decode()


def multipart(fields, files):
    """(body, content type) for text fields {name: value} and files [(name, bytes)]."""
    bnd = "diffuse-test-boundary"
    out = b""
    for k, v in fields.items():
        out += f"--{bnd}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n".encode()
    for k, data in files:
        out += (f"--{bnd}\r\nContent-Disposition: form-data; name=\"{k}\"; filename=\"{k}.png\"\r\n"
                f"Content-Type: image/png\r\n\r\n").encode() + data + b"\r\n"
    return out + f"--{bnd}--\r\n".encode(), f"multipart/form-data; boundary={bnd}"


def edit(s, fields, files, ctype=None):
    body, ct = multipart(fields, files)
    return s.request("POST", "/v1/images/edits", raw=body, headers={"Content-Type": ctype or ct})


def mean_diff(a, b):
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def bad(st, body, field, what):
    check(st == 400 and body["error"]["param"] == field and f"'{field}'" in body["error"]["message"],
          f"{what}: 400 naming '{field}' ({body['error']['message'] if st == 400 else st})")


s = Server(diffuse, "-m", model, "--threads", "1", "--preview-every", "0")
s.wait_ready()
red = png(64, 64, (220, 30, 30))
red_px = decode_b64_png(b64(red))[2]

# ---- A1111 img2img: the strength decides how much of the picture stays
outs = {}
for strength in (0.25, 1.0):
    st, r, _ = s.request("POST", "/sdapi/v1/img2img", {
        "prompt": PROMPT, "init_images": ["data:image/png;base64," + b64(red)], "steps": 4,
        "seed": 5, "denoising_strength": strength, "cfg_scale": 0, "mask": None,
        "resize_mode": 0, "inpaint_full_res": True})
    check(st == 200 and len(r["images"]) == 1, f"img2img at strength {strength}: one image")
    info = json.loads(r["info"])
    check(info["denoising_strength"] == strength and info["width"] == 64,
          "info: denoising_strength, the picture's size")
    outs[strength] = decode_b64_png(r["images"][0])
check(outs[0.25][:2] == (64, 64), "the output takes the picture's size when none is given")
near, far = mean_diff(outs[0.25][2], red_px), mean_diff(outs[1.0][2], red_px)
check(near < far, f"strength 0.25 keeps more of the picture than 1.0 ({near:.1f} < {far:.1f})")
st, t2i, _ = s.request("POST", "/sdapi/v1/txt2img", {"prompt": PROMPT, "steps": 4, "seed": 5,
                                                     "width": 64, "height": 64, "cfg_scale": 0})
check(t2i["images"][0] != b64(red) and outs[0.25][2] != decode_b64_png(t2i["images"][0])[2],
      "img2img is not txt2img")
st, r, _ = s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT, "init_images": [b64(red)],
                                                   "width": 32, "height": 32, "steps": 2})
check(st == 200 and decode_b64_png(r["images"][0])[:2] == (32, 32),
      "width and height resize the picture (bare base64 accepted)")

# ---- OpenAI edits: the same run through multipart/form-data
st, r, _ = edit(s, {"prompt": PROMPT, "seed": "5", "steps": "4", "strength": "0.25",
                    "response_format": "b64_json", "n": "1"}, [("image", red)])
check(st == 200 and decode_b64_png(r["data"][0]["b64_json"])[2] == outs[0.25][2],
      "images/edits gives img2img's image for the same fields")
st, r, _ = edit(s, {"prompt": PROMPT, "steps": "2", "size": "32x32", "n": "2"}, [("image[]", red)])
check(st == 200 and len(r["data"]) == 2 and decode_b64_png(r["data"][1]["b64_json"])[:2] == (32, 32),
      "images/edits: image[], n 2, size")

# ---- bad input: a 400 naming the field
bad(*s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT})[:2], "init_images", "no init_images")
bad(*s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT, "init_images": []})[:2],
    "init_images", "an empty init_images")
bad(*s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT, "init_images": ["@@@"]})[:2],
    "init_images", "init_images not base64")
bad(*s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT, "init_images": [b64(b"GIF89a....")]})[:2],
    "init_images", "init_images not a picture")
bad(*s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT, "init_images": [b64(red[:60])]})[:2],
    "init_images", "a truncated PNG")
bad(*s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT, "init_images": [7]})[:2],
    "init_images", "init_images holding a number")
bad(*s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT,
                                             "init_images": [b64(png(50, 40, (1, 2, 3)))]})[:2],
    "init_images", "a 50x40 picture without a size")
bad(*s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT, "init_images": [b64(red)],
                                             "denoising_strength": 1.5})[:2],
    "denoising_strength", "denoising_strength 1.5")
bad(*s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT, "init_images": [b64(red)],
                                             "mask": b64(png(32, 32, (255, 255, 255)))})[:2],
    "mask", "a mask of another size")
bad(*s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT, "init_images": [b64(red)],
                                             "mask": "!!"})[:2], "mask", "a mask that is not base64")

# ---- inpainting: the mask's black half keeps the picture, its white half is redrawn
def half_mask(w, h):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\0" + b"\xff" * (w // 2) + b"\0" * (w - w // 2) for _ in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def right_half(px, w=64):
    return [v for i, v in enumerate(px) if (i // 3) % w >= w // 2]


st, r, _ = s.request("POST", "/sdapi/v1/img2img", {
    "prompt": PROMPT, "init_images": [b64(red)], "mask": b64(half_mask(64, 64)), "steps": 4,
    "seed": 5, "denoising_strength": 1.0, "cfg_scale": 0})
check(st == 200 and len(r["images"]) == 1, f"img2img with a mask: one image ({st})")
inp = decode_b64_png(r["images"][0])
check(inp[2] != outs[1.0][2], "the mask changes the image")
kept, free = mean_diff(right_half(inp[2]), right_half(red_px)), mean_diff(right_half(outs[1.0][2]),
                                                                          right_half(red_px))
check(kept < free, f"the mask's black half keeps the picture ({kept:.1f} < {free:.1f} without it)")
st, r, _ = edit(s, {"prompt": PROMPT, "seed": "5", "steps": "4", "strength": "1"},
                [("image", red), ("mask", half_mask(64, 64))])
check(st == 200 and decode_b64_png(r["data"][0]["b64_json"])[2] == inp[2],
      "images/edits with a mask gives img2img's inpainted image")
st, body, _ = s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPT, "init_images": [b64(red)] * 2,
                                                      "steps": 1})
check(st == 400 and "image" in body["error"]["message"],
      f"two init_images on a FLUX.1 model: 400 from the pipeline ({body['error']['message']})")

bad(*edit(s, {"prompt": PROMPT}, [])[:2], "image", "edits without image")
bad(*edit(s, {"prompt": PROMPT}, [("image", b"not a picture")])[:2], "image", "edits, not a picture")
bad(*edit(s, {"prompt": PROMPT}, [("image", red), ("mask", png(16, 16, (0, 0, 0)))])[:2],
    "mask", "edits, a mask of another size")
bad(*edit(s, {"prompt": PROMPT, "n": "two"}, [("image", red)])[:2], "n", "edits, n not a number")
bad(*edit(s, {"prompt": PROMPT, "size": "65x64"}, [("image", red)])[:2], "size", "edits, size 65x64")
bad(*edit(s, {"prompt": PROMPT, "strength": "0"}, [("image", red)])[:2], "strength", "edits, strength 0")
bad(*edit(s, {"prompt": PROMPT, "prompt ": "x", "steps": "2", "seed": "1"}, [("image", red)] * 9)[:2],
    "image", "edits, nine pictures")
bad(*edit(s, {}, [("image", red)])[:2], "prompt", "edits without a prompt")
st, body, _ = edit(s, {"prompt": PROMPT}, [("image", red)], ctype="application/json")
check(st == 400 and "multipart/form-data" in body["error"]["message"], "edits as JSON: 400")
st, body, _ = edit(s, {"prompt": PROMPT}, [("image", red)], ctype="multipart/form-data")
check(st == 400 and "boundary" in body["error"]["message"], "edits without a boundary: 400")
st, body, _ = edit(s, {f"f{i}": "1" for i in range(40)}, [("image", red)])
check(st == 400, "edits with 41 parts: 400")
st, _, _ = s.request("POST", "/v1/images/edits", raw=b"x" * (65 << 20),
                     headers={"Content-Type": "multipart/form-data; boundary=x"})
check(st == 413, "an upload over 64 MiB: 413")
st, _, _ = s.request("POST", "/sdapi/v1/txt2img", raw=b" " * (2 << 20))
check(st == 413, "txt2img keeps its 1 MiB limit")
s.stop()
print("all picture-input checks passed")
