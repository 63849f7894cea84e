"""diffuse serve with the clients people use: the `openai` package, the `webuiapi` package
(an AUTOMATIC1111 client) and the page in headless Chromium driven by selenium. The images
must draw their captions: held-out demo captions (tools/train-demo/scenes.py) are compared
with their rendered scenes, against the same scenes with the colours swapped.

    python clients.py DIFFUSE_BIN MODEL_DIR OUT_DIR     (run by clients.sh, in its venv)

Exit 77 (skipped) when Chromium is missing, unless CI is set: then it fails.
"""
import base64
import io
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "train-demo"))
import numpy as np  # noqa: E402
import scenes  # noqa: E402
from PIL import Image  # noqa: E402
from serverlib import Server, check  # noqa: E402

diffuse, model, out = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(os.path.join(out, "outputs"), exist_ok=True)
KEY = "client-test-key"


def held_out_scenes(n):
    return [s for s in scenes.scene_list() if scenes.held_out(s) and s["count"] == 1][::97][:n]


def draws(img, s):
    """The image is nearer its scene than the scene with foreground and background swapped."""
    a = np.asarray(img.convert("RGB"), np.float64)
    swapped = dict(s, fg=s["bg"], bg=s["fg"])
    near = np.abs(a - scenes.render(s)).mean()
    far = np.abs(a - scenes.render(swapped)).mean()
    return near < far


def check_drawn(images_and_scenes, who):
    good = sum(draws(img, s) for img, s in images_and_scenes)
    check(good >= 0.75 * len(images_and_scenes),
          f"{who}: {good} of {len(images_and_scenes)} held-out captions drawn")


s = Server(diffuse, "-m", model, "--api-key", KEY, "--outputs", os.path.join(out, "outputs"),
           "--threads", "1")
s.auth = {"Authorization": "Bearer " + KEY}
s.wait_ready()
cases = held_out_scenes(4)

# ---- openai
from openai import OpenAI  # noqa: E402

client = OpenAI(base_url=s.url + "/v1", api_key=KEY)
check([m.id for m in client.models.list().data] == ["demo"], "openai: models.list")
got = []
for i, sc in enumerate(cases):
    r = client.images.generate(model="demo", prompt=scenes.caption(sc), size="64x64", n=1,
                               response_format="b64_json", extra_body={"seed": i, "steps": 4})
    img = Image.open(io.BytesIO(base64.b64decode(r.data[0].b64_json)))
    check(img.size == (64, 64) and img.format == "PNG", f"openai b64_json: {scenes.caption(sc)}")
    got.append((img, sc))
check_drawn(got, "openai b64_json")
r = client.images.generate(model="demo", prompt=scenes.caption(cases[0]), size="64x64",
                           response_format="url", extra_body={"seed": 0, "steps": 4})
st, png, _ = s.request("GET", r.data[0].url[len(s.url):])
img = Image.open(io.BytesIO(png))
check(st == 200 and img.size == (64, 64) and draws(img, cases[0]), "openai url: the PNG behind it")


def png_bytes(img):
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# Pictures in: each run starts from the scene with foreground and background swapped, at a
# strength that keeps a little of it; the image must still draw its own caption.
STRENGTH = 0.9
got = []
for i, sc in enumerate(cases):
    start = Image.fromarray(scenes.render(dict(sc, fg=sc["bg"], bg=sc["fg"])).astype(np.uint8))
    r = client.images.edit(model="demo", image=("start.png", png_bytes(start), "image/png"),
                           prompt=scenes.caption(sc), size="64x64", response_format="b64_json",
                           extra_body={"seed": i, "steps": 4, "strength": STRENGTH})
    img = Image.open(io.BytesIO(base64.b64decode(r.data[0].b64_json)))
    check(img.size == (64, 64) and img.format == "PNG", f"openai images.edit: {scenes.caption(sc)}")
    got.append((img, sc))
check_drawn(got, "openai images.edit")
try:
    client.images.edit(model="demo", image=("x.png", b"not a picture", "image/png"), prompt="x")
    check(False, "openai images.edit with a file that is not a picture fails")
except Exception as e:  # openai.BadRequestError
    check(getattr(e, "status_code", None) == 400 and "'image'" in str(e),
          "openai images.edit, not a picture: 400 naming 'image'")

try:
    OpenAI(base_url=s.url + "/v1", api_key="wrong").images.generate(prompt="x", size="64x64")
    check(False, "openai with a wrong key fails")
except Exception as e:  # openai.AuthenticationError
    check(getattr(e, "status_code", None) == 401, "openai with a wrong key: 401")

# ---- webuiapi
import webuiapi  # noqa: E402

api = webuiapi.WebUIApi(host=s.host, port=s.port, sampler="Euler", steps=4,
                        username="any", password=KEY)
check(api.util_get_model_names() == ["demo"], "webuiapi: util_get_model_names")
check(api.util_get_current_model() == "demo", "webuiapi: util_get_current_model (options)")
api.set_options({"sd_model_checkpoint": "demo", "samples_format": "png"})
check(api.get_options()["sd_model_checkpoint"] == "demo", "webuiapi: set_options")
check("Euler" in api.util_get_sampler_names(), "webuiapi: util_get_sampler_names")
got = []
for i, sc in enumerate(cases):
    r = api.txt2img(prompt=scenes.caption(sc), width=64, height=64, seed=i, cfg_scale=0)
    check(r.image.size == (64, 64) and r.info["seed"] == i and r.info["all_seeds"] == [i],
          f"webuiapi txt2img: {scenes.caption(sc)}")
    got.append((r.image, sc))
check_drawn(got, "webuiapi txt2img")
r = api.txt2img(prompt=scenes.caption(cases[1]), width=64, height=64, seed=5, batch_size=2)
check(len(r.images) == 2 and r.info["all_seeds"] == [5, 6], "webuiapi: batch_size 2")
got = []
for i, sc in enumerate(cases):
    start = Image.fromarray(scenes.render(dict(sc, fg=sc["bg"], bg=sc["fg"])).astype(np.uint8))
    r = api.img2img(images=[start], prompt=scenes.caption(sc), width=64, height=64, seed=i,
                    cfg_scale=0, denoising_strength=STRENGTH)
    check(r.image.size == (64, 64) and r.info["seed"] == i
          and r.info["denoising_strength"] == STRENGTH, f"webuiapi img2img: {scenes.caption(sc)}")
    got.append((r.image, sc))
check_drawn(got, "webuiapi img2img")

# ---- the page in Chromium
chromium = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if os.path.exists(p)), None)
driver_bin = next((p for p in ("/usr/bin/chromedriver",) if os.path.exists(p)), None)
if not chromium or not driver_bin:
    s.stop()
    if os.environ.get("CI") == "true":
        print("FAIL: chromium and chromium-driver are needed (make deps)", file=sys.stderr)
        sys.exit(1)
    print("skipped: chromium or chromedriver is not installed (make deps)")
    sys.exit(77)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

opts = webdriver.ChromeOptions()
opts.binary_location = chromium
for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
          "--window-size=1100,800", f"--user-data-dir={os.path.join(out, 'chromium-profile')}"):
    opts.add_argument(a)
browser = webdriver.Chrome(service=Service(driver_bin), options=opts)
try:
    browser.get(s.url + "/")
    el = browser.find_element
    el(By.ID, "apikey").send_keys(KEY)
    browser.execute_script("document.getElementById('apikey').onchange()")
    WebDriverWait(browser, 30).until(lambda b: b.execute_script(
        "return document.getElementById('model').options.length") == 1)
    sc = cases[2]
    el(By.ID, "prompt").send_keys(scenes.caption(sc))
    for field, value in (("width", "64"), ("height", "64"), ("steps", "4"), ("seed", "3")):
        el(By.ID, field).clear()
        el(By.ID, field).send_keys(value)
    el(By.ID, "generate").click()
    WebDriverWait(browser, 180).until(lambda b: el(By.ID, "status").text in ("done",) or
                                      "failed" in el(By.ID, "status").text)
    check(el(By.ID, "status").text == "done", "page: Generate runs to done")
    check(browser.execute_script("return document.getElementById('progress').value") == 1,
          "page: the progress bar is full")
    src = el(By.ID, "result").get_attribute("src")
    check(src.startswith("data:image/png;base64,"), "page: the image element holds a PNG")
    img = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
    check(img.size == (64, 64) and draws(img, sc), "page: the PNG has the asked size and draws the caption")
    check("Seed: 3" in el(By.ID, "params").text, "page: the parameters are shown")
    check(len(el(By.ID, "history").find_elements(By.TAG_NAME, "img")) == 1, "page: this session's images")
    browser.save_screenshot(os.path.join(out, "serve-page.png"))

    el(By.ID, "steps").clear()
    el(By.ID, "steps").send_keys("400")
    el(By.ID, "generate").click()
    WebDriverWait(browser, 60).until(lambda b: el(By.ID, "status").text.startswith("step "))
    WebDriverWait(browser, 60).until(lambda b: int(el(By.ID, "result").get_attribute(
        "data-previews") or 0) >= 2)
    src = el(By.ID, "result").get_attribute("src")
    img = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
    check(img.size == (64, 64) and "preview after step" in el(By.ID, "params").text,
          "page: the live previews show while it runs")
    el(By.ID, "cancel").click()
    WebDriverWait(browser, 60).until(lambda b: "cancelled" in el(By.ID, "status").text)
    check(el(By.ID, "generate").is_enabled(), "page: Cancel stops a long run, the job is cancelled")
    browser.save_screenshot(os.path.join(out, "serve-page-cancelled.png"))
finally:
    browser.quit()
st, p, _ = s.request("GET", "/sdapi/v1/progress", headers=s.auth)
check(p["state"]["job_count"] == 0, "nothing left running after the cancel")
s.stop()
print("all client checks passed; screenshots in", out)
