"""Load on diffuse serve: 8 clients on loopback for a bounded time, sending A1111 txt2img and
img2img and OpenAI requests to the demo model, with jobs cancelled and clients that hang up
mixed in (live previews on, every step).

    python3 load.py DIFFUSE_BIN MODEL_DIR [SECONDS] [--no-rss]

Checks: every request that waited for its answer got one (200, or 409 for a job cancelled
under it; a cancel may find its job already ended and no longer listed: 404), every image
decodes as a PNG of the asked size, the queue drains afterwards, and
the server's RSS at the end is within 10% of its RSS after the first request (--no-rss
under the sanitizers, whose quarantine holds freed memory). The first request is made once
per image size and kind the clients ask for (img2img loads the VAE encoder on first use).
Prints requests per minute.
"""
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, check, decode_b64_png  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--")]
diffuse, model = args[0], args[1]
seconds = float(args[2]) if len(args) > 2 else 20
rss_check = "--no-rss" not in sys.argv
CLIENTS = 8
PROMPTS = ["a large yellow circle in the top left corner on a blue background",
           "two small red squares on a white background",
           "a green triangle in the bottom right corner on a black background"]

s = Server(diffuse, "-m", model, "--queue", "64", "--threads", "1", "--preview-every", "1")
s.wait_ready()
# The first request of each image size the clients use: a new size builds per-size state
# once (about 1.4 MiB for the demo's 32x32 after 64x64), which is not growth under load.
pictures = {}
for size in (64, 32):
    st, r, _ = s.request("POST", "/sdapi/v1/txt2img", {"prompt": PROMPTS[0], "steps": 2,
                                                       "width": size, "height": size})
    check(st == 200, f"the first {size}x{size} request")
    pictures[size] = r["images"][0]
    st, r, _ = s.request("POST", "/sdapi/v1/img2img", {"prompt": PROMPTS[1], "steps": 2,
                                                       "init_images": [pictures[size]]})
    check(st == 200, f"the first {size}x{size} img2img request")
rss_first = s.rss_kib()

lock = threading.Lock()
counts = {"txt2img": 0, "img2img": 0, "openai": 0, "cancelled": 0, "ended_first": 0, "hung_up": 0,
          "images": 0}
failures = []
stop_at = time.time() + seconds


def note(kind, n_images=0):
    with lock:
        counts[kind] += 1
        counts["images"] += n_images


def fail(what):
    with lock:
        failures.append(what)


def client(seed):
    rnd = random.Random(seed)
    while time.time() < stop_at:
        kind = rnd.choices(["txt2img", "img2img", "openai", "cancel", "hangup"],
                           [3, 2, 3, 1, 1])[0]
        prompt = rnd.choice(PROMPTS)
        size = rnd.choice([32, 64])
        try:
            if kind == "txt2img":
                n = rnd.choice([1, 2])
                st, r, _ = s.request("POST", "/sdapi/v1/txt2img", {
                    "prompt": prompt, "steps": 2, "width": size, "height": size,
                    "batch_size": n, "seed": rnd.randrange(1 << 31)})
                if st != 200 or len(r["images"]) != n:
                    fail(f"txt2img: {st} {str(r)[:200]}")
                    continue
                for im in r["images"]:
                    if decode_b64_png(im)[:2] != (size, size):
                        fail("txt2img: wrong image size")
                note("txt2img", n)
            elif kind == "img2img":
                st, r, _ = s.request("POST", "/sdapi/v1/img2img", {
                    "prompt": prompt, "steps": 4, "denoising_strength": 0.5,
                    "init_images": [pictures[size]], "seed": rnd.randrange(1 << 31)})
                if st != 200 or decode_b64_png(r["images"][0])[:2] != (size, size):
                    fail(f"img2img: {st} {str(r)[:200]}")
                    continue
                note("img2img", 1)
            elif kind == "openai":
                st, r, _ = s.request("POST", "/v1/images/generations", {
                    "prompt": prompt, "size": f"{size}x{size}", "steps": 2})
                if st != 200:
                    fail(f"openai: {st} {str(r)[:200]}")
                    continue
                if decode_b64_png(r["data"][0]["b64_json"])[:2] != (size, size):
                    fail("openai: wrong image size")
                note("openai", 1)
            elif kind == "cancel":
                st, job, _ = s.request("POST", "/v1/jobs", {"prompt": prompt, "steps": 50,
                                                            "size": "64x64"})
                if st != 202:
                    fail(f"jobs: {st} {job}")
                    continue
                time.sleep(rnd.uniform(0, 1))
                st, _, _ = s.request("DELETE", f"/v1/jobs/{job['id']}")
                if st == 404:
                    # the job ended before the cancel came, and so many jobs ended since
                    # that it is no longer listed (the server keeps the newest 32)
                    note("ended_first")
                    continue
                if st != 200:
                    fail(f"DELETE: {st}")
                note("cancelled")
            else:
                c = socket.create_connection((s.host, s.port))
                body = json.dumps({"prompt": prompt, "steps": 50, "size": "64x64"}).encode()
                c.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body)
                time.sleep(rnd.uniform(0, 1))
                c.close()
                note("hung_up")
        except Exception as e:  # noqa: BLE001 (any failure of a request is a finding)
            fail(f"{kind}: {type(e).__name__}: {e}")


threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
t0 = time.time()
for t in threads:
    t.start()
for t in threads:
    t.join()
elapsed = time.time() - t0
for f in failures[:10]:
    print("failure:", f)
check(not failures, f"every request answered and every image decodes ({len(failures)} failures)")
end = time.time() + 120
while time.time() < end:
    st, p, _ = s.request("GET", "/sdapi/v1/progress")
    if p["state"]["job_count"] == 0:
        break
    time.sleep(0.2)
check(p["state"]["job_count"] == 0, "the queue drains")
st, r, _ = s.request("POST", "/sdapi/v1/txt2img", {"prompt": PROMPTS[0], "steps": 2,
                                                   "width": 64, "height": 64})
check(st == 200, "the server still answers")
rss_end = s.rss_kib()
answered = counts["txt2img"] + counts["img2img"] + counts["openai"]
print(f"{CLIENTS} clients, {elapsed:.0f} s: {counts}; "
      f"{answered / elapsed * 60:.1f} image requests/min, {counts['images'] / elapsed * 60:.1f} "
      f"images/min; RSS after the first request {rss_first / 1024:.1f} MiB, at the end "
      f"{rss_end / 1024:.1f} MiB")
check(answered > 0 and counts["cancelled"] + counts["hung_up"] > 0 or seconds < 5,
      "requests of every kind ran")
if rss_check:
    check(rss_end <= rss_first * 1.10, f"RSS at the end within 10% of after the first request "
          f"({rss_end} KiB vs {rss_first} KiB)")
s.stop()
print("load test passed")
