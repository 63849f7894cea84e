"""diffuse serve on the demo model: live previews (the events stream's `preview` events and
/sdapi/v1/progress's `current_image`), the int8 settings as server options, and 503 with
Retry-After while a model loads (at start and on a model switch), made deterministic by
DIFFUSE_SERVE_TEST_LOAD_DELAY.

    python3 preview_loading.py DIFFUSE_BIN MODEL_DIR TMP_DIR
"""
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, check, decode_b64_png, read_events  # noqa: E402

diffuse, model, tmp = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
tmp = os.path.join(tmp, "serve-preview-loading")
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
os.symlink(model, os.path.join(tmp, "demo2"))

PROMPT = "a large yellow circle in the top left corner on a blue background"
LONG = 400


def wait_progress(s, cond, what, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        st, p, _ = s.request("GET", "/sdapi/v1/progress")
        if st == 200 and cond(p):
            return p
        time.sleep(0.05)
    raise SystemExit(f"progress never showed {what}")


# ---- previews
s = Server(diffuse, "-m", model, "--threads", "1", "--preview-every", "1")
s.wait_ready()
st, job, _ = s.request("POST", "/v1/jobs", {"prompt": PROMPT, "steps": 6, "size": "64x64", "seed": 3})
events = read_events(s, job["id"])
previews = [d for name, d in events if name == "preview"]
check(events[-1][0] == "done" and len(previews) >= 1,
      f"the events stream sends preview events ({len(previews)}) before done")
check(all(decode_b64_png(p["b64_json"])[:2] == (64, 64) and 1 <= p["step"] < 6 for p in previews),
      "each preview is a 64x64 PNG of a step before the last")
steps = [p["step"] for p in previews]
check(steps == sorted(set(steps)), f"previews come in step order, once each ({steps})")
final = decode_b64_png(events[-1][1]["data"][0]["b64_json"])[2]
last = decode_b64_png(previews[-1]["b64_json"])[2]
diff = sum(abs(a - b) for a, b in zip(last, final)) / len(final)
check(diff < 40, f"the last preview is close to the image (mean difference {diff:.1f} of 255)")

st, job, _ = s.request("POST", "/v1/jobs", {"prompt": PROMPT, "steps": LONG, "size": "64x64"})
p = wait_progress(s, lambda p: p["state"]["sampling_step"] > 1 and p["current_image"],
                  "a current_image while running")
check(decode_b64_png(p["current_image"])[:2] == (64, 64),
      "progress: current_image is a base64 PNG of the running image")
st, p, _ = s.request("GET", "/sdapi/v1/progress?skip_current_image=true")
check(st == 200 and p["current_image"] is None and p["state"]["sampling_step"] > 0,
      "progress?skip_current_image=true leaves the image out")
s.request("DELETE", f"/v1/jobs/{job['id']}")
st, page, _ = s.request("GET", "/")
check(b"addEventListener('preview'" in page, "the page listens for preview events")
s.stop()

s = Server(diffuse, "-m", model, "--threads", "1", "--preview-every", "0")
s.wait_ready()
st, job, _ = s.request("POST", "/v1/jobs", {"prompt": PROMPT, "steps": 4, "size": "64x64"})
events = read_events(s, job["id"])
check(events[-1][0] == "done" and not [e for e in events if e[0] == "preview"],
      "--preview-every 0: no preview events")
s.stop()

# ---- int8 settings per server (df_gen_params.int8_attention, df_load_opts.int8_keep,
# int8_group, int8_path)
images = {}
for opts in ((), ("--int8-attention", "off"), ("--int8-keep", "none"), ("--int8-group", "32"),
             ("--int8-path", "portable")):
    s = Server(diffuse, "-m", model, "--threads", "1", "--preview-every", "0", "--dtype", "int8",
               *opts)
    s.wait_ready()
    st, r, _ = s.request("POST", "/v1/images/generations", {"prompt": PROMPT, "size": "64x64",
                                                            "seed": 1, "steps": 4})
    check(st == 200, f"int8 with {opts or 'defaults'}")
    images[opts] = r["data"][0]["b64_json"]
    s.stop()
check(len(set(images.values())) == 4,
      "--int8-attention off, --int8-keep none and --int8-group 32 change the image")
check(images[("--int8-path", "portable")] == images[()],
      "--int8-path portable: the same integers as the kernel this CPU picks")
for bad_opt in (("--int8-attention", "maybe"), ("--int8-keep", "all"), ("--int8-group", "16"),
                ("--int8-group", "x")):
    p = subprocess.run([diffuse, "serve", "-m", model, *bad_opt], capture_output=True, text=True)
    check(p.returncode == 2 and bad_opt[0] in p.stderr, f"{bad_opt[0]} {bad_opt[1]}: refused")
s = Server(diffuse, "-m", model, "--threads", "1", "--dtype", "int8", "--int8-path", "fast")
s.wait_ready()
st, body, _ = s.request("POST", "/v1/images/generations", {"prompt": PROMPT, "size": "64x64"})
check(st == 500 and "int8 path 'fast'" in body["error"]["message"],
      "--int8-path fast: the model's load fails with the library's message")
s.stop()

# ---- 503 while a model loads
env = dict(os.environ, DIFFUSE_SERVE_TEST_LOAD_DELAY="3")
s = Server(diffuse, "-m", model, "-m", os.path.join(tmp, "demo2"), "--threads", "1", env=env)
st, body, hdr = s.request("POST", "/sdapi/v1/txt2img", {"prompt": PROMPT, "steps": 1})
check(st == 503 and hdr.get("Retry-After") and "loading" in body["error"]["message"]
      and body["detail"] == body["error"]["message"],
      "txt2img during the start-up load: 503, Retry-After, a JSON message")
st, body, hdr = s.request("POST", "/v1/images/generations", {"prompt": PROMPT, "size": "64x64"})
check(st == 503 and hdr.get("Retry-After"), "images/generations during the load: 503")
st, body, _ = s.request("POST", "/v1/jobs", {"prompt": PROMPT, "size": "64x64"})
check(st == 503 and "loading" in body["error"]["message"], "POST /v1/jobs during the load: 503")
st, p, _ = s.request("GET", "/sdapi/v1/progress")
check(st == 200 and p["textinfo"] == "loading a model", "progress answers 200 during the load")
st, _, _ = s.request("GET", "/v1/models")
check(st == 200, "listings answer during the load")
s.wait_ready()
st, r, _ = s.request("POST", "/sdapi/v1/txt2img", {"prompt": PROMPT, "steps": 1, "width": 64,
                                                   "height": 64})
check(st == 200 and len(r["images"]) == 1, "after the load, txt2img answers 200")

st, _, _ = s.request("POST", "/sdapi/v1/options", {"sd_model_checkpoint": "demo2"})
check(st == 200, "options: switch to demo2 (not loaded yet)")
first = {}
t = threading.Thread(target=lambda: first.update(zip(("st", "body", "h"), s.request(
    "POST", "/sdapi/v1/txt2img", {"prompt": PROMPT, "steps": 1, "width": 64, "height": 64}))))
t.start()
wait_progress(s, lambda p: p["textinfo"] == "loading a model", "the switch's load")
st, body, hdr = s.request("POST", "/sdapi/v1/txt2img", {"prompt": PROMPT, "steps": 1})
check(st == 503 and hdr.get("Retry-After") and "loading" in body["error"]["message"],
      "a request while the switched-to model loads: 503 with Retry-After")
t.join(120)
check(first.get("st") == 200 and '"sd_model_name": "demo2"' in first["body"]["info"],
      "the request that started the load gets its image from demo2")
s.stop()
print("all preview and loading checks passed")
