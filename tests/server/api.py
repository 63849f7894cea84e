"""diffuse serve against the demo model, with the standard library only: every endpoint,
every error status, the jobs API and its events stream, cancellation (DELETE, interrupt, a
client that goes away), a full queue, a model that fails, the API key, and a clean stop.

    python3 api.py DIFFUSE_BIN MODEL_DIR TMP_DIR
"""
import base64
import json
import os
import shutil
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import Server, check, decode_b64_png, read_events  # noqa: E402

diffuse, model, tmp = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
tmp = os.path.join(tmp, "serve-api")
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(os.path.join(tmp, "outputs"))
os.symlink(model, os.path.join(tmp, "demo2"))
os.makedirs(os.path.join(tmp, "broken"))
shutil.copy(os.path.join(model, "model_index.json"), os.path.join(tmp, "broken"))

PROMPT = "a large yellow circle in the top left corner on a blue background"
LONG = 400  # steps: a run long enough to be stopped


def wait_state(s, job, states, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        st, body, _ = s.request("GET", f"/v1/jobs/{job}")
        if st == 200 and body["state"] in states and (body["state"] != "running" or body["step"] > 0):
            return body
        time.sleep(0.1)
    raise SystemExit(f"job {job} never reached {states}")


s = Server(diffuse, "-m", model, "-m", os.path.join(tmp, "demo2"), "-m", os.path.join(tmp, "broken"),
           "--outputs", os.path.join(tmp, "outputs"), "--queue", "2", "--threads", "1")
s.wait_ready()

# ---- the page and the listings
st, page, hdr = s.request("GET", "/")
check(st == 200 and b'id="generate"' in page and hdr["Content-Type"].startswith("text/html"),
      "GET / serves the page")
st, models, _ = s.request("GET", "/sdapi/v1/sd-models")
check(st == 200 and [m["title"] for m in models] == ["demo", "demo2", "broken"],
      "sd-models lists the -m folders by name")
st, lst, _ = s.request("GET", "/v1/models")
check(st == 200 and [m["id"] for m in lst["data"]] == ["demo", "demo2", "broken"], "/v1/models")
st, samplers, _ = s.request("GET", "/sdapi/v1/samplers")
check(st == 200 and samplers[0]["name"] == "Euler", "samplers: Euler")
st, sch, _ = s.request("GET", "/sdapi/v1/schedulers")
check(st == 200 and sch[0]["name"] == "automatic", "schedulers")
st, opts, _ = s.request("GET", "/sdapi/v1/options")
check(st == 200 and opts["sd_model_checkpoint"] == "demo", "options: the first model is the default")
st, _, _ = s.request("POST", "/sdapi/v1/options", {"sd_model_checkpoint": "demo2"})
st2, opts, _ = s.request("GET", "/sdapi/v1/options")
check(st == 200 and opts["sd_model_checkpoint"] == "demo2", "options: sd_model_checkpoint switches")
s.request("POST", "/sdapi/v1/options", {"sd_model_checkpoint": "demo"})

# ---- A1111 txt2img
st, r, _ = s.request("POST", "/sdapi/v1/txt2img", {
    "prompt": PROMPT, "steps": 2, "width": 64, "height": 64, "seed": 7, "batch_size": 2,
    "cfg_scale": 0, "sampler_name": "Euler", "scheduler": "automatic",
    "restore_faces": False, "styles": []})
check(st == 200 and len(r["images"]) == 2, "txt2img batch_size 2 answers two images")
check(all(decode_b64_png(i)[:2] == (64, 64) for i in r["images"]), "both decode as 64x64 PNGs")
info = json.loads(r["info"])
check(info["all_seeds"] == [7, 8] and info["seed"] == 7 and info["sd_model_name"] == "demo"
      and info["steps"] == 2 and info["width"] == 64 and info["sampler_name"] == "Euler",
      "info: seed, all_seeds, steps, size, sampler, model")
check(r["images"][0] != r["images"][1], "the two seeds give two images")
st, r2, _ = s.request("POST", "/sdapi/v1/txt2img", {"prompt": PROMPT, "steps": 2, "seed": 7,
                                                    "width": 64, "height": 64})
check(st == 200 and r2["images"][0] == r["images"][0], "the same seed gives the same PNG")
st, r3, _ = s.request("POST", "/sdapi/v1/txt2img", {"prompt": PROMPT, "steps": 1, "seed": -1,
                                                    "override_settings": {"sd_model_checkpoint": "demo2"}})
i3 = json.loads(r3["info"])
check(st == 200 and i3["seed"] >= 0 and i3["sd_model_name"] == "demo2",
      "seed -1 draws a seed and reports it; override_settings picks the model")

# ---- OpenAI
st, o, _ = s.request("POST", "/v1/images/generations",
                     {"prompt": PROMPT, "size": "64x64", "n": 1, "seed": 7, "steps": 2})
check(st == 200 and isinstance(o["created"], int) and o["data"][0]["revised_prompt"] == PROMPT,
      "images/generations answers created and data")
check(o["data"][0]["b64_json"] == r["images"][0], "the OpenAI API and A1111 give the same image")
st, o, _ = s.request("POST", "/v1/images/generations", {"prompt": PROMPT, "size": "64x64",
                                                        "steps": 1, "response_format": "url"})
url = o["data"][0]["url"]
check(st == 200 and url.startswith(f"http://{s.host}:{s.port}/outputs/"), "response_format url")
st, png, hdr = s.request("GET", url[len(s.url):])
check(st == 200 and hdr["Content-Type"] == "image/png" and png[:4] == b"\x89PNG",
      "the url serves the PNG")
for bad in ("/outputs/../api.py", "/outputs/x.png", "/outputs/" + "0" * 32 + ".png"):
    st, _, _ = s.request("GET", bad)
    check(st == 404, f"{bad} is 404")

# ---- bad input
cases = [
    ("POST", "/v1/images/generations", "{not json", 400, None),
    ("POST", "/v1/images/generations", '{"prompt": 3}', 400, "prompt"),
    ("POST", "/v1/images/generations", '{"prompt": "x", "size": "65x64"}', 400, "size"),
    ("POST", "/v1/images/generations", '{"prompt": "x", "size": "big"}', 400, "size"),
    ("POST", "/v1/images/generations", '{"prompt": "x", "n": 0}', 400, "n"),
    ("POST", "/v1/images/generations", '{"prompt": "x", "model": "nope"}', 400, "model"),
    ("POST", "/v1/images/generations", '{"prompt": "x", "response_format": "gif"}', 400,
     "response_format"),
    ("POST", "/v1/images/generations", '[1, 2]', 400, None),
    ("POST", "/sdapi/v1/txt2img", '{"prompt": "x", "sampler_name": "DPM++ 2M"}', 400,
     "sampler_name"),
    ("POST", "/sdapi/v1/txt2img", '{"prompt": "x", "scheduler": "karras"}', 400, "scheduler"),
    ("POST", "/sdapi/v1/txt2img", '{"prompt": "x", "width": 4096, "height": 4096}', 400, "width"),
    ("POST", "/sdapi/v1/txt2img", '{"prompt": "x", "steps": "many"}', 400, "steps"),
    ("POST", "/sdapi/v1/txt2img", '{"prompt": "x", "enable_hr": true}', 400, "enable_hr"),
    ("POST", "/sdapi/v1/options", '{"sd_model_checkpoint": "nope"}', 400, "sd_model_checkpoint"),
    ("GET", "/sdapi/v1/nothing", None, 404, None),
    ("GET", "/v1/jobs/" + "0" * 32, None, 404, None),
    ("PUT", "/v1/jobs", "{}", 405, None),
]
for method, path, raw, want, param in cases:
    st, body, _ = s.request(method, path, raw=raw)
    ok = st == want and isinstance(body["error"]["message"], str) and body["detail"]
    if param:
        ok = ok and body["error"]["param"] == param and param in body["error"]["message"] + param
    check(ok, f"{method} {path} {raw!r:.50} -> {want} naming {param}")
st, body, hdr = s.request("GET", "/sdapi/v1/txt2img")
check(st == 405 and hdr.get("Allow") == "POST", "405 says what is allowed")
st, body, _ = s.request("POST", "/v1/images/generations", raw="x" * (2 << 20))
check(st == 413, "a body over 1 MiB is 413")
st, body, _ = s.request("POST", "/sdapi/v1/txt2img", {"prompt": PROMPT, "steps": 1,
                        "override_settings": {"sd_model_checkpoint": "broken"}})
check(st == 500 and "broken" in body["error"]["message"], "a model that cannot load fails its job, "
      "naming it: " + body["error"]["message"][:120])
st, body, _ = s.request("POST", "/v1/images/generations", {"prompt": PROMPT, "steps": 1, "size": "64x64"})
check(st == 200, "the server goes on serving after a failed job")

# ---- jobs and events
st, job, _ = s.request("POST", "/v1/jobs", {"prompt": PROMPT, "steps": 3, "size": "64x64", "seed": 7})
check(st == 202 and len(job["id"]) == 32 and job["state"] in ("queued", "running"), "POST /v1/jobs: 202 and an id")
events = read_events(s, job["id"])
names = [e[0] for e in events]
check(names[0] == "state" and names[-1] == "done", f"events: state first, done last ({names})")
steps = [e[1]["step"] for e in events if e[0] == "step"]
check(steps and steps[-1] == 3 and steps == sorted(steps), f"step events count up to 3 ({steps})")
check(decode_b64_png(events[-1][1]["data"][0]["b64_json"])[:2] == (64, 64), "done carries the PNG")
st, got, _ = s.request("GET", f"/v1/jobs/{job['id']}")
check(st == 200 and got["state"] == "done" and got["data"][0]["seed"] == 7, "GET /v1/jobs/{id}: done, with data")

# cancel a running job
st, job, _ = s.request("POST", "/v1/jobs", {"prompt": PROMPT, "steps": LONG, "size": "64x64"})
wait_state(s, job["id"], ("running",))
st, d, _ = s.request("DELETE", f"/v1/jobs/{job['id']}")
check(st == 200, "DELETE /v1/jobs/{id}")
events = read_events(s, job["id"])
check(events[-1][0] == "error" and events[-1][1]["state"] == "cancelled", "the stream ends with the cancel")
got = wait_state(s, job["id"], ("cancelled",))
check(0 < got["step"] < LONG, f"cancelled at step {got['step']} of {LONG}")

# interrupt a txt2img: it answers with what it has
result = {}
t = threading.Thread(target=lambda: result.update(zip(("st", "body", "h"), s.request(
    "POST", "/sdapi/v1/txt2img", {"prompt": PROMPT, "steps": LONG, "width": 64, "height": 64}))))
t.start()
end = time.time() + 60
while time.time() < end:
    st, p, _ = s.request("GET", "/sdapi/v1/progress")
    if p["state"]["sampling_step"] > 0:
        break
    time.sleep(0.1)
check(p["state"]["sampling_steps"] == LONG and 0 < p["progress"] < 1 and p["state"]["job_count"] >= 1,
      "progress: sampling_step, sampling_steps, progress, job_count while running")
s.request("POST", "/sdapi/v1/interrupt")
t.join(120)
check(result.get("st") == 200 and json.loads(result["body"]["info"])["interrupted"],
      "an interrupted txt2img answers 200, interrupted")

# a client that goes away cancels its job
c = socket.create_connection((s.host, s.port))
body = json.dumps({"prompt": PROMPT, "steps": LONG, "size": "64x64"}).encode()
c.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n" % len(body) + body)
end = time.time() + 60
while time.time() < end:
    st, p, _ = s.request("GET", "/sdapi/v1/progress")
    if p["state"]["sampling_step"] > 0:
        break
    time.sleep(0.1)
c.close()
end = time.time() + 30
while time.time() < end:
    st, p, _ = s.request("GET", "/sdapi/v1/progress")
    if p["state"]["job_count"] == 0:
        break
    time.sleep(0.1)
check(p["state"]["job_count"] == 0, "a client that disconnects cancels its running job")

# a full queue: one running, two waiting (--queue 2), the next is 429
ids = []
for i in range(3):
    st, job, _ = s.request("POST", "/v1/jobs", {"prompt": PROMPT, "steps": LONG, "size": "64x64"})
    check(st == 202, f"job {i} accepted")
    ids.append(job["id"])
    if i == 0:
        wait_state(s, job["id"], ("running",))
st, body, hdr = s.request("POST", "/v1/jobs", {"prompt": PROMPT, "steps": 1})
check(st == 429 and hdr.get("Retry-After") and "queue" in body["error"]["message"],
      "a full queue is 429 with Retry-After")
st, got, _ = s.request("GET", f"/v1/jobs/{ids[2]}")
check(got["state"] == "queued" and got["queue_position"] == 2, "queue_position of the last")
for j in reversed(ids):
    s.request("DELETE", f"/v1/jobs/{j}")
for j in ids:
    wait_state(s, j, ("cancelled",))
check(True, "cancelled while waiting and while running")
s.stop()

# ---- the API key
s = Server(diffuse, "-m", model, "--api-key", "sekrit", "--threads", "1")
s.auth = {"Authorization": "Bearer sekrit"}
s.wait_ready()
st, _, hdr = s.request("GET", "/v1/models")
check(st == 401 and "WWW-Authenticate" in hdr, "without the key: 401")
st, _, _ = s.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
check(st == 401, "a wrong key: 401")
st, _, _ = s.request("GET", "/v1/models", headers=s.auth)
check(st == 200, "Bearer key: 200")
basic = base64.b64encode(b"user:sekrit").decode()
st, _, _ = s.request("GET", "/sdapi/v1/sd-models", headers={"Authorization": "Basic " + basic})
check(st == 200, "basic auth with the key as password: 200")
st, _, _ = s.request("GET", "/v1/models?api_key=sekrit")
check(st == 200, "?api_key= (the page's event stream): 200")
st, _, _ = s.request("GET", "/")
check(st == 200, "the page itself needs no key")
st, _, _ = s.request("POST", "/sdapi/v1/txt2img", {"prompt": "x"})
check(st == 401, "txt2img without the key: 401")
s.stop()
print("all server API checks passed")
