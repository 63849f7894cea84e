"""The numbers in docs/server.md (run by hand, not by ctest):

    python3 measure.py DIFFUSE_BIN MODEL_DIR [N] [SERVER OPTION ...]   (e.g. --preview-every 0)

- time to first step: a resident model (POST /v1/jobs until the first "step" event) against
  the CLI, which loads the model every time (process start until it prints step 1);
- requests per minute, one client after another and 8 at once (default 4-step 64x64 images),
  and image to image (/sdapi/v1/img2img from a 64x64 picture, strength 0.75: 3 of 4 steps).
"""
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server  # noqa: E402

diffuse, model = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 10
server_opts = sys.argv[4:]
PROMPT = "a large yellow circle in the top left corner on a blue background"


def first_step_server(s):
    t0 = time.time()
    st, job, _ = s.request("POST", "/v1/jobs", {"prompt": PROMPT, "size": "64x64"})
    c = socket.create_connection((s.host, s.port))
    c.sendall(f"GET /v1/jobs/{job['id']}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data, first = b"", None
    while True:
        part = c.recv(65536)
        if not part:
            break
        data += part
        if first is None and b"event: step" in data:
            first = time.time() - t0
        if b"event: done" in data and data.endswith(b"\r\n0\r\n\r\n"):  # the last chunk
            break
    c.close()
    return first


def first_step_cli():
    t0 = time.time()
    p = subprocess.Popen([diffuse, "generate", "-m", model, "-p", PROMPT, "--threads", "1",
                          "-o", "/tmp/measure-cli.png"], stderr=subprocess.PIPE, text=True)
    first = None
    for line in p.stderr:
        if first is None and "step 1/" in line:
            first = time.time() - t0
    p.wait()
    return first


s = Server(diffuse, "-m", model, "--threads", "1", "--queue", "64", *server_opts)
s.wait_ready()
first_step_server(s)  # the first run of a size builds per-size state
srv = [first_step_server(s) for _ in range(n)]
cli = [first_step_cli() for _ in range(n)]
print(f"time to first step, median of {n}: resident {statistics.median(srv) * 1000:.0f} ms, "
      f"CLI (loads the model) {statistics.median(cli) * 1000:.0f} ms")

st, r, _ = s.request("POST", "/sdapi/v1/txt2img", {"prompt": PROMPT, "width": 64, "height": 64})
picture = r["images"][0]
runs = (("generations", 1), ("generations", 8), ("img2img", 1))
for route, clients in runs:
    done = [0]
    lock = threading.Lock()
    stop_at = time.time() + 30

    def client():
        while time.time() < stop_at:
            if route == "img2img":
                st, r, _ = s.request("POST", "/sdapi/v1/img2img",
                                     {"prompt": PROMPT, "init_images": [picture]})
            else:
                st, r, _ = s.request("POST", "/v1/images/generations",
                                     {"prompt": PROMPT, "size": "64x64"})
            if st == 200:
                with lock:
                    done[0] += 1

    t0 = time.time()
    ts = [threading.Thread(target=client) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(f"{route}, {clients} client(s), 30 s: {done[0] / (time.time() - t0) * 60:.0f} "
          f"requests/min (64x64, default model settings)")
s.stop()
